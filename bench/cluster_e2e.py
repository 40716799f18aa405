"""The paper's workload, scaled down, on a dilated local cluster: every
baseline side by side (issue "Co-location's win on the runtime itself").

The trace is ``bench/cluster_e2e_jobs.py``'s: the simulator's paper
generator scaled to ``--machines`` machines (apps, data sets, COMP/COMM
ratios and run lengths of the paper's mix, DoP 16 of 100 -> 2 of 8), each job
mapped to a real app job (apps/nmf.py, lda.py, mlr.py, lasso.py on data
from harmony.datagen). It is written to ``--trace`` so that ``harmony sim
run`` can replay it. Modes, each on a fresh cluster of N machines at
dilation D (``--modes``):

  isolated       FIFO, every job alone at the DoP it asks for (the paper's baseline)
  isolated-best  FIFO, every job alone at its best DoP, derived from its trace
                 profile with the scheduler's own speed-up model
                 (``harmony.sched.throughput.best_dop``: the smallest DoP within 5%
                 of its fastest on N machines), not measured
  isolated-1     FIFO, every job alone on one machine (the narrowest DoP: on
                 slow links, where most of these jobs are network-bound, the
                 DoP sizing that harmony does, without its co-location)
  naive-K        every job at its DoP on the least-loaded machines, at most K
                 jobs per machine (``--naive-cap``; 2 is the best cap in the
                 simulator at paper scale, README "Simulator")
  match          Muri-style matching on the subtask queues
  harmony        the Harmony scheduler

Loads (``--loads``): all at once (0), and Poisson arrivals with a mean gap
of a fraction of a job's mean isolated duration (the trace's, at its DoP,
by the model). Rounds interleave the modes (rotated order); medians of
makespan and mean JCT are printed with ratios to ``isolated`` and to the
best other mode, the ceiling (every job at its best measured time alone
from the isolated modes, no wait), the cluster's CPU and network
utilization (the daemons' heartbeats, ``metrics/machines.jsonl``: mean over
machines and over the makespan, and over time in sixths of it), the real
CPU of the cluster's processes and of the host, moves and pauses. Then per
job: the trace's COMP/COMM per iteration beside what its app job measured
in ``isolated`` (the master's profile at the requested DoP).

``--out FILE`` keeps every run (JSON: per load and mode, the runs with their
job statuses, i.e. ``harmony status --json`` records, and their per-epoch
prediction samples): ``python bench/cluster_replay.py FILE`` replays every
run in the simulator; ``jq '.runs["0"].harmony[0].statuses' FILE > s.json;
harmony sim import s.json --out run.csv`` imports one.

    python bench/cluster_e2e.py --quick                  # ~21 min: 1 round at all-at-once
    python bench/cluster_e2e.py [--machines 8] [--dilation 8] [--jobs 8] [--rounds 3]
        [--loads 0,0.25,1] [--modes isolated,isolated-best,isolated-1,naive-2,match,harmony]
    python bench/cluster_e2e.py --quick --merge a.json b.json [--out all.json]

(``--merge`` joins runs made in separate invocations, e.g. other modes or
more rounds.)
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from cluster_e2e_jobs import app_job, describe, make_data, scaled_trace, \
    with_arrivals  # noqa: E402
from dilation import CpuMeter  # noqa: E402
from scheduler_e2e import ceiling, print_prediction_tables, run_mode  # noqa: E402

from harmony.cli.common import parse_size  # noqa: E402
from harmony.sched.throughput import best_dop  # noqa: E402
from harmony.sim.trace import iteration_profile, save_trace, sched_profile  # noqa: E402
from harmony.worker.executor.startup import startup_nice  # noqa: E402
from harmony.worker.netem import parse_rate  # noqa: E402
from harmony.cluster import stop_clusters_on_sigterm  # noqa: E402

MODES = ("isolated", "isolated-best", "isolated-1", "naive-2", "match", "harmony")


def setup_of(mode: str) -> dict:
    if mode.startswith("isolated"):
        return {"mode": "isolated"}
    if mode.startswith("naive"):
        cap = int(mode.partition("-")[2] or 0)
        return {"mode": "naive", "cluster": {"max_jobs_per_machine": cap}}
    if mode in ("match", "harmony", "harmony-util"):
        return {"mode": "harmony", "policy": mode}
    if mode.endswith("-msync") and mode[:-6] in ("match", "harmony", "harmony-util"):
        # the same, with the master's own synchronizer (--sync master)
        return {"mode": "harmony", "policy": mode[:-6], "cluster": {"sync": "master"}}
    raise SystemExit(f"unknown mode {mode!r}")


def utilization(metrics: str, start: float, end: float, machines: int,
                bins: int = 6) -> dict:
    """Mean CPU and network utilization of the cluster over [start, end]
    (master clock) from the daemons' heartbeats, and per sixth of it; a
    machine with no beat in a bin counts as idle."""
    path = os.path.join(metrics, "machines.jsonl")
    rows = [json.loads(x) for x in open(path)] if os.path.exists(path) else []
    span = max(1e-9, end - start)
    acc = {k: [0.0] * bins for k in ("cpu", "net")}
    for r in rows:
        if "dt" not in r or not start <= r["t"] <= end:
            continue
        b = min(bins - 1, int((r["t"] - start) / span * bins))
        for k in acc:
            acc[k][b] += r.get(k, 0.0) * r["dt"]
    per_bin = span / bins * machines
    out = {k: [x / per_bin for x in v] for k, v in acc.items()}
    out.update({f"{k}_mean": statistics.mean(out[k]) for k in ("cpu", "net")})
    return out


def measured_profile(statuses: list[dict]) -> dict[str, tuple[float, float, int]]:
    """name -> (COMP, COMM, machines) per iteration: the master's profile."""
    out = {}
    for s in statuses:
        p = s.get("profile") or {}
        if p.get("machines"):
            out[s["name"]] = (p.get("t_cpu", 0.0), p.get("t_net", 0.0), int(p["machines"]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--machines", type=int, default=8)
    ap.add_argument("--dilation", type=float, default=8.0,
                    help="D (8: N/D = 1 core for 8 machines on a 2-core VM, leaving one for "
                         "the rest; at 4 the host saturated, see README)")
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--bandwidth", default="48MB/s", help="undilated link per machine")
    ap.add_argument("--modes", default=None,
                    help=f"default {','.join(MODES)}; --quick: isolated,match,harmony")
    ap.add_argument("--loads", default=None,
                    help="mean gaps as fractions of a job's mean isolated duration (0: all at once)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds per load (3; --quick: 1)")
    ap.add_argument("--timeout", type=float, default=300, help="undilated seconds per run")
    ap.add_argument("--quick", action="store_true",
                    help="1 round, all at once (unless --rounds, --loads), runs half as long, modes "
                         "isolated,match,harmony")
    ap.add_argument("--data", default="/tmp/harmony-cluster-e2e",
                    help="where the app inputs are generated (kept and reused)")
    ap.add_argument("--trace", default=None, help="write the trace here (CSV, harmony sim)")
    ap.add_argument("--out", default=None, help="every run's figures and statuses (JSON)")
    ap.add_argument("--memory-per-machine", type=parse_size, default=None)
    ap.add_argument("--merge", nargs="+", default=None, metavar="FILE",
                    help="run nothing: the report of earlier --out files of the same trace "
                         "(the same --jobs, --seed, --quick), their runs together per load "
                         "and mode; with --out, written as one file for bench/cluster_replay.py")
    a = ap.parse_args()
    stop_clusters_on_sigterm()
    a.dop = 2
    if a.quick:
        a.rounds, a.loads = a.rounds or 1, a.loads or "0"
        a.modes = a.modes or "isolated,match,harmony"
    a.rounds, a.loads = a.rounds or 3, a.loads or "0,0.25,1"
    a.modes = a.modes or ",".join(MODES)
    if a.merge:
        return merged_report(a, a.merge)
    bw = parse_rate(a.bandwidth)
    modes = a.modes.split(",")
    os.makedirs(a.data, exist_ok=True)
    t_all = time.time()
    data = make_data(a.data)
    trace = scaled_trace(a.jobs, a.seed, quick=a.quick, bandwidth=bw)
    mapped = {j.id: app_job(j, data) for j in trace}
    best = {j.id: best_dop(sched_profile(j, bw), a.machines) for j in trace}
    mean_alone = mean_isolated(trace, bw)
    print(f"{len(trace)} jobs, {a.machines} machines x 1 core at dilation {a.dilation:g} "
          f"({os.cpu_count()}-core host), link {a.bandwidth}; trace at DoP 2 -> app job; "
          f"best DoP by the model; "
          f"mean isolated duration {mean_alone:.1f}s (model)")
    for j in trace:
        print(f"  {describe(j, mapped[j.id][1])}  best DoP {best[j.id]}")
    loads = [float(x) for x in a.loads.split(",")]
    results: dict[float, dict[str, list[dict]]] = {}
    with tempfile.TemporaryDirectory(prefix="harmony-cluster-e2e-") as tmp:
        for load in loads:
            jobs_t = with_arrivals(trace, load * mean_alone, a.seed)
            if a.trace:
                save_trace(jobs_t, a.trace if len(loads) == 1
                           else a.trace.replace(".csv", "") + f"-load{load:g}.csv")
            times = [j.arrival for j in jobs_t]
            runs: dict[str, list[dict]] = {m: [] for m in modes}
            results[load] = runs
            for rnd in range(a.rounds):
                order = modes[rnd % len(modes):] + modes[:rnd % len(modes)]
                if rnd % 2:
                    order.reverse()
                for mode in order:
                    jobs = [(j.id, mapped[j.id][1], mapped[j.id][0],
                             best[j.id] if mode == "isolated-best"
                             else 1 if mode == "isolated-1" else j.machines)
                            for j in jobs_t]
                    t0 = time.time()

                    def watch(cl):
                        meter = CpuMeter([p.pid for p in cl.procs])
                        meter.reset()

                        def done():
                            cpu, host = meter.read()
                            meter.stop()
                            return {"cluster": cpu, "host": host}
                        return done
                    try:
                        r = run_mode(mode, jobs, times, os.path.join(tmp, f"l{load:g}-r{rnd}"),
                                     a, setup=setup_of(mode), watch=watch)
                    except SystemExit as exc:
                        print(f"load {load:g} round {rnd} {mode}: FAILED: {exc}", flush=True)
                        runs[mode].append({"mode": mode, "failed": str(exc)})
                        continue
                    sts = r["statuses"]
                    start = min(s["submitted"] for s in sts)
                    end = max(s["ended"] for s in sts)
                    r["util"] = utilization(r["metrics_dir"], start, end, a.machines)
                    r["wall"] = time.time() - t0
                    r["profiles"] = measured_profile(sts)
                    runs[mode].append(r)
                    print(f"load {load:g} round {rnd} {mode:13s} makespan {r['makespan']:6.1f}s "
                          f"mean JCT {r['mean_jct']:6.1f}s  CPU {100 * r['util']['cpu_mean']:3.0f}% "
                          f"net {100 * r['util']['net_mean']:3.0f}%  real CPU cluster "
                          f"{100 * r['watch']['cluster']:3.0f}% host {100 * r['watch']['host']:3.0f}%"
                          f"  moves {r['moves']} pauses {r['pauses']}  ({r['wall']:.0f} s wall)",
                          flush=True)
            report(load, runs, modes, jobs_t, times, trace)
            print_prediction_tables({m: [r for r in rs if "failed" not in r]
                                     for m, rs in runs.items()}, modes)
    print(f"\n{time.time() - t_all:.0f} s in all")
    if a.out:
        # the per-epoch prediction samples stay (bench/cluster_replay.py
        # prints their tables); the metrics directory is gone with the run
        with open(a.out, "w") as fh:
            json.dump({"machines": a.machines, "dilation": a.dilation, "bandwidth": bw,
                       # what a replay's start-ups weigh against a COMP
                       # (bench/cluster_replay.py): nice 0 start-ups compete as equals
                       "startup_weight": 1.0 if startup_nice() == 0 else None,
                       "trace": a.trace, "jobs": {j.id: mapped[j.id] for j in trace},
                       "runs": {f"{ld:g}": {m: [{k: v for k, v in r.items()
                                                 if k != "metrics_dir"} for r in rs]
                                            for m, rs in runs.items()}
                                for ld, runs in results.items()}}, fh)


def mean_isolated(trace, bw: float) -> float:
    """A job's mean isolated duration at its DoP, by the model (the unit of
    the loads' mean gaps)."""
    return statistics.mean(j.iterations * sum(iteration_profile(j, j.machines, bw))
                           for j in trace)


def merged_report(a, files: list[str]) -> None:
    """``--merge``: the report of several ``--out`` files of one trace (e.g.
    modes or rounds run in separate invocations), per load and mode in
    MODES' order, and with ``--out`` the runs together in one file."""
    docs = [json.load(open(f)) for f in files]
    head = {k: docs[0].get(k) for k in ("machines", "dilation", "bandwidth", "startup_weight")}
    for f, d in zip(files, docs):
        if {k: d.get(k) for k in head} != head:
            raise SystemExit(f"{f}: another cluster or link than {files[0]} ({head})")
    trace = scaled_trace(a.jobs, a.seed, quick=a.quick, bandwidth=float(head["bandwidth"]))
    ids = {j.id for j in trace}
    for f, d in zip(files, docs):
        if set(d.get("jobs") or ()) != ids:
            raise SystemExit(f"{f}: not the jobs of this trace (pass the --jobs, --seed and "
                             f"--quick it was run with)")
    bw = float(head["bandwidth"])
    mean_alone = mean_isolated(trace, bw)
    merged: dict[str, dict[str, list[dict]]] = {}
    for d in docs:
        for load, runs in d["runs"].items():
            for mode, rs in runs.items():
                merged.setdefault(load, {}).setdefault(mode, []).extend(rs)
    print(f"{len(files)} files, {head['machines']} machines at dilation {head['dilation']:g}")
    for load, runs in sorted(merged.items(), key=lambda x: float(x[0])):
        modes = [m for m in MODES if m in runs] + [m for m in runs if m not in MODES]
        jobs_t = with_arrivals(trace, float(load) * mean_alone, a.seed)
        report(float(load), runs, modes, jobs_t, [j.arrival for j in jobs_t], trace)
        print_prediction_tables({m: [r for r in rs if "failed" not in r]
                                 for m, rs in runs.items()}, modes)
    if a.out:
        with open(a.out, "w") as fh:
            json.dump({**head, "trace": docs[0].get("trace"), "jobs": docs[0]["jobs"],
                       "runs": merged}, fh)


def report(load: float, runs: dict[str, list[dict]], modes: list[str], jobs_t, times,
           trace) -> None:
    ok = {m: [r for r in rs if "failed" not in r] for m, rs in runs.items()}
    med = {m: {k: statistics.median(r[k] for r in rs) for k in ("makespan", "mean_jct")}
           for m, rs in ok.items() if rs}
    print(f"\nload {load:g} (mean gap {load:g} x mean isolated duration): medians of "
          f"{max(len(rs) for rs in runs.values())} round(s); x iso: isolated / mode, "
          f"x other: the best other mode / mode")
    print(f"{'mode':14} {'makespan':>9} {'x iso':>6} {'x other':>7} {'mean JCT':>9} "
          f"{'x iso':>6} {'x other':>7} {'CPU':>5} {'net':>5} {'real CPU':>9} {'moves':>5} "
          f"{'pauses':>6}  CPU/net over time (sixths)")
    for m in modes:
        if m not in med:
            print(f"{m:14} failed: {runs[m][0].get('failed', '')[:200]}")
            continue
        rs, me = ok[m], med[m]
        others = [o for o in med if o != m]
        iso = med.get("isolated")
        cells = []
        for k in ("makespan", "mean_jct"):
            b = min((med[o][k] for o in others), default=None)
            cells.append(f"{me[k]:8.1f}s {iso[k] / me[k] if iso else float('nan'):6.2f} "
                         f"{b / me[k] if b else float('nan'):7.2f}")
        u = {k: statistics.median(r["util"][f"{k}_mean"] for r in rs) for k in ("cpu", "net")}
        real = statistics.median(r["watch"]["cluster"] for r in rs)
        host = statistics.median(r["watch"]["host"] for r in rs)
        over = " ".join(f"{100 * c:.0f}/{100 * n:.0f}" for c, n in
                        zip(rs[0]["util"]["cpu"], rs[0]["util"]["net"]))
        print(f"{m:14} {cells[0]} {cells[1]} {100 * u['cpu']:4.0f}% {100 * u['net']:4.0f}% "
              f"{100 * real:3.0f}/{100 * host:3.0f}% "
              f"{statistics.median(r['moves'] for r in rs):5.0f} "
              f"{statistics.median(r['pauses'] for r in rs):6.0f}  {over}")
    iso_runs = {m: rs for m, rs in ok.items() if m.startswith("isolated") and rs}
    bound = ceiling(iso_runs, [(j.id, None) for j in jobs_t], times) if iso_runs else None
    if bound and "isolated" in med:
        b = med["isolated"]
        print(f"ceiling (each job at its best measured time alone, from "
              f"{'/'.join(iso_runs)}): makespan {bound['makespan']:.1f}s, mean JCT "
              f"{bound['mean_jct']:.1f}s: at most {b['makespan'] / bound['makespan']:.2f}x / "
              f"{b['mean_jct'] / bound['mean_jct']:.2f}x over isolated")
        # how far each mode is from it: no mode can beat another by more
        # than its own distance to the ceiling
        print("each mode's makespan / mean JCT over the ceiling's: " + ", ".join(
            f"{m} {med[m]['makespan'] / bound['makespan']:.2f} / "
            f"{med[m]['mean_jct'] / bound['mean_jct']:.2f}" for m in modes if m in med))
    if ok.get("isolated"):
        prof = ok["isolated"][0]["profiles"]
        print("per job: trace COMP/COMM per iteration (at its DoP, by the model) vs measured "
              "in isolated (master's profile)")
        bw = trace[0].link
        for j in trace:
            c, n = iteration_profile(j, j.machines, bw)
            mc, mn, mm = prof.get(j.id, (float("nan"), float("nan"), 0))
            print(f"  {j.id:24s} DoP {j.machines}: trace {c:.3f}/{n:.3f}s "
                  f"(ratio {c / n if n else float('inf'):5.2f})  measured {mc:.3f}/{mn:.3f}s "
                  f"(ratio {mc / mn if mn else float('inf'):5.2f}) on {mm}")


if __name__ == "__main__":
    main()
