"""End-to-end scheduler benchmark: a stream of jobs with Poisson arrivals.

The same 8 NMF jobs (4 CPU-heavy, 4 network-heavy, alternating; the two
kinds of ``bench/colocation.py``) arrive at the same seeded Poisson times in
each mode, on a fresh local cluster of emulated machines (1 core each and a
per-machine bandwidth cap):

  isolated : FIFO, every job alone on ``--dop`` machines
  naive    : every job on the ``--dop`` least-loaded machines, no coordination
  harmony  : the Harmony scheduler (profiling, grouping, DoP, regrouping with
             pause/resume/migration) over the subtask queues

Reports makespan and mean JCT with ratios to isolated, the scheduler's
decisions, and the prediction error of iteration times: for every running
job and epoch, the iteration time the last decision predicted for it (its
own, by the queue replay, where the policy makes one; else its group's, Eq
4.1) vs the job's measured iteration time in that epoch; the same for the
prediction the master records at each epoch report for the next epoch
(training time and whole epoch per iteration), beside the noise floor of
predicting an epoch by the one before it; and the ceiling no schedule can
beat on these machines (each job's arrival plus its best time alone in the
isolated modes run).

    python bench/scheduler_e2e.py [--jobs 8] [--mean-gap 6] [--epochs 12]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from harmony.client import Client  # noqa: E402
from harmony.cluster import LocalCluster, stop_clusters_on_sigterm  # noqa: E402
from harmony.datagen.nmf import gen_nmf  # noqa: E402
from harmony.cli.common import parse_size  # noqa: E402


def make_jobs(tmp: str, a: argparse.Namespace) -> list[tuple[str, list[str]]]:
    cpu_data, net_data = os.path.join(tmp, "cpu.txt"), os.path.join(tmp, "net.txt")
    gen_nmf(cpu_data, users=a.cpu_users, items=500, rank=8, per_user=60, seed=1)
    gen_nmf(net_data, users=20000, items=a.net_items, rank=8, per_user=10, seed=2)
    common = ["--max-epochs", str(a.epochs), "--holdout", "0", "--iters-per-epoch", "2",
              "--solver", "sgd"]       # SGD: the jobs' CPU/network kinds and the README's figures
    cpu = ["--input", cpu_data, "--rank", "64", *common]
    net = ["--input", net_data, "--rank", "32", "--batch-size", "4096", *common]
    out = []
    for i in range(a.jobs):
        kind = "cpu" if i % 2 == 0 else "net"
        out.append((f"{kind}-heavy-{i // 2 + 1}", cpu if kind == "cpu" else net))
    return out


def arrivals(n: int, mean_gap: float, seed: int) -> list[float]:
    """Poisson arrival times (undilated seconds); a mean gap of 0: all at once."""
    if mean_gap < 0:
        raise SystemExit(f"--mean-gap must be >= 0, not {mean_gap}")
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(1.0 / mean_gap) if mean_gap > 0 else 0.0
    return out


def run_mode(spec: str, jobs, times, tmp: str, a, setup: dict | None = None,
             watch=None) -> dict:
    """``spec`` is MODE or MODE:DOP (the machines each job asks for).

    ``jobs``: (name, args) NMF jobs, or (name, args, app, machines) for
    another app of ``apps/`` and the machines that job asks for.
    ``setup`` (other benches): ``mode`` and ``policy`` in place of the
    spec's, ``cluster`` (more ``LocalCluster`` keywords). ``watch(cl)``, if
    given, is called once the cluster is up and returns a function called
    when every job is done; what that returns is ``res["watch"]``."""
    mode, _, dop = spec.partition(":")
    dop = int(dop or a.dop)
    sd = os.path.join(tmp, spec.replace(":", "-"))
    policy = None
    if mode == "harmony-util":        # the Harmony scheduler with the paper's U objective
        mode, policy = "harmony", "harmony-util"
    setup = setup or {}
    mode, policy = setup.get("mode", mode), setup.get("policy", policy)
    srcs: dict[str, str] = {}
    with LocalCluster(a.machines, sd, port=0, mode=mode, cpus_per_machine=1, policy=policy,
                      net_bandwidth=a.bandwidth, dilation=a.dilation,
                      memory_per_machine=getattr(a, "memory_per_machine", None),
                      data_plane=getattr(a, "data_plane", "sealed"),
                      **setup.get("cluster", {})) as cl, \
            Client(cl.endpoint, keys=cl.keys) as c:
        done = watch(cl) if watch else None
        ids: dict[str, str] = {}
        t0 = time.time()
        pending = list(zip(times, jobs))
        while True:
            now = (time.time() - t0) / a.dilation      # undilated, as the master's clock
            while pending and pending[0][0] <= now:
                _, (name, args, *more) = pending.pop(0)
                app = more[0] if more else "nmf"
                if app not in srcs:
                    srcs[app] = (ROOT / "apps" / f"{app}.py").read_text()
                ids[c.submit(f"{app}.py", srcs[app], args,
                             machines=more[1] if len(more) > 1 else dop, name=name)] = name
            sts = {j: c.status(j) for j in ids}
            if not pending and all(s["state"] in ("finished", "failed", "cancelled")
                                   for s in sts.values()):
                break
            if now > a.timeout:
                raise SystemExit(f"{mode}: not done after {a.timeout}s: "
                                 f"{ {ids[j]: s['state'] for j, s in sts.items()} }")
            time.sleep(0.2)
        watched = done() if done else None
    bad = [f"{ids[j]}: {s['error']}" for j, s in sts.items() if s["state"] != "finished"]
    if bad:
        raise SystemExit(f"{mode}: jobs failed: {bad}")
    start = min(s["submitted"] for s in sts.values())
    res = {"mode": spec, "makespan": max(s["ended"] for s in sts.values()) - start,
           "mean_jct": statistics.mean(s["ended"] - s["submitted"] for s in sts.values()),
           "moves": sum(sum(1 for e in s["events"] if "moves to" in e[2]) for s in sts.values()),
           "pauses": sum(sum(1 for e in s["events"] if e[1] in ("paused", "profiled"))
                         for s in sts.values())}
    res.update(prediction_error(os.path.join(sd, "master", "metrics")))
    res["samples"] = prediction_samples(os.path.join(sd, "master", "metrics"))
    res["noise"] = noise_samples(os.path.join(sd, "master", "metrics"))
    res["fresh"] = fresh_samples(os.path.join(sd, "master", "metrics"))
    res["statuses"] = list(sts.values())         # for bench/sim_fidelity.py
    res["metrics_dir"] = os.path.join(sd, "master", "metrics")
    if watched is not None:
        res["watch"] = watched
    return res


def job_ends(metrics: str) -> dict[str, float]:
    """Each job's last epoch report (its end, for a job that finished)."""
    ends: dict[str, float] = {}
    for ep in map(json.loads, open(os.path.join(metrics, "jobs.jsonl"))):
        ends[ep["job"]] = max(ends.get(ep["job"], 0.0), ep["t"])
    return ends


def mates_at(decisions: list[dict], t: float, job: str) -> frozenset:
    """The jobs sharing ``job``'s group by the last decision at or before ``t``."""
    assign: dict = {}
    for d in decisions:
        if d["t"] > t:
            break
        assign = d["assign"]
    g = assign.get(job)
    return frozenset(j for j, x in assign.items() if x == g) if g else frozenset()


def changed_during(decisions: list[dict], ends: dict[str, float], mates: Iterable[str],
                   job: str, start: float | None, end: float) -> bool:
    """Whether the jobs beside ``job`` changed while its epoch (``start`` to
    ``end``) ran: a partner ended before the epoch's report, or a decision in
    the epoch moved a job into or out of its group. Such an epoch ran partly
    beside other jobs than the prediction's, which no model of the group
    can predict (the partner's end or the newcomer is not known then)."""
    if any(ends.get(j, end) < end for j in mates if j != job):
        return True
    return start is not None and mates_at(decisions, start, job) != mates_at(decisions, end, job)


def prediction_samples(metrics: str) -> list[tuple[int, float, bool, float]]:
    """Per job epoch: (group size, |predicted iteration time (the job's own
    where the decision has one, else its group's) - measured| / measured,
    steady, the same for the group's prediction), with the prediction and
    the group of the last decision before that epoch. Steady leaves out
    epochs during which another job was being profiled on the group's
    machines (the prediction cannot include a job without a profile).
    Epochs during which the jobs beside it changed (``changed_during``) are
    left out."""
    path = os.path.join(metrics, "decisions.jsonl")
    if not os.path.exists(path):
        return []
    decisions = [json.loads(line) for line in open(path)]
    epochs = [json.loads(line) for line in open(os.path.join(metrics, "jobs.jsonl"))]
    ends = job_ends(metrics)
    last: dict[str, float] = {}
    out = []
    for ep in epochs:
        group = pred = gpred = None
        size = 0
        mates: list[str] = []
        profiling: dict[str, str] = {}      # profiling job -> its group
        for d in decisions:
            if d["t"] > ep["t"]:
                break
            for j in d["profile"]:
                profiling[j] = d["assign"].get(j, "")
            for j in list(d["promote"]) + list(d["pause"]):
                profiling.pop(j, None)
            group = d["assign"].get(ep["job"], group)
            if group is not None and group in d["predicted"]:
                # the job's own prediction where the policy makes one
                gpred = d["predicted"][group]
                pred = d.get("predicted_jobs", {}).get(ep["job"], gpred)
                mates = [j for j, g in d["assign"].items() if g == group]
                size = len(mates)
        start, last[ep["job"]] = last.get(ep["job"]), ep["t"]
        tm = ep["timings"]
        if pred is None or not tm.get("iters") or ep["epoch"] == 0 or ep["job"] in profiling \
                or changed_during(decisions, ends, mates, ep["job"], start, ep["t"]):
            continue
        measured = tm["train"] / tm["iters"]
        out.append((size, abs(pred - measured) / measured, group not in profiling.values(),
                    abs(gpred - measured) / measured))
    return out


def epoch_wall(prev: dict | None, ep: dict) -> float | None:
    """An epoch's whole time per iteration, from the job's previous report to
    this one, if that report was the epoch before on the same machines."""
    if prev is None or prev["epoch"] != ep["epoch"] - 1 or prev["workers"] != ep["workers"]:
        return None
    return (ep["t"] - prev["t"]) / ep["timings"]["iters"]


def fresh_samples(metrics: str) -> list[tuple[int, float, float | None]]:
    """Per job epoch (after its first): (group size, |predicted - measured| /
    measured of the training time per iteration, the same of the whole epoch
    per iteration or None) for the prediction the master recorded at the
    job's previous epoch report (``predictions.jsonl``: the policy's model on
    the profiles as they were then, beside the jobs then sharing its
    machines). The whole epoch is measured from the previous report to this
    one, on the same machines."""
    path = os.path.join(metrics, "predictions.jsonl")
    if not os.path.exists(path):
        return []
    preds = {(r["job"], r["epoch"]): r for r in map(json.loads, open(path))}
    dpath = os.path.join(metrics, "decisions.jsonl")
    decisions = [json.loads(line) for line in open(dpath)] if os.path.exists(dpath) else []
    ends = job_ends(metrics)
    out = []
    last: dict[str, dict] = {}
    for ep in map(json.loads, open(os.path.join(metrics, "jobs.jsonl"))):
        r = preds.get((ep["job"], ep["epoch"]))
        prev, last[ep["job"]] = last.get(ep["job"]), ep
        tm = ep["timings"]
        if r is None or r["t"] > ep["t"] or not tm.get("iters") or ep["epoch"] == 0 \
                or changed_during(decisions, ends, r["jobs"], ep["job"],
                                  prev["t"] if prev else None, ep["t"]):
            continue
        measured = tm["train"] / tm["iters"]
        wall = epoch_wall(prev, ep) if "predicted_epoch" in r else None
        e_err = abs(r["predicted_epoch"] - wall) / wall if wall is not None else None
        out.append((len(r["jobs"]), abs(r["predicted"] - measured) / measured, e_err))
    return out


def noise_samples(metrics: str) -> list[tuple[float, float | None]]:
    """The testbed's noise floor: per job epoch, |previous epoch's iteration
    time - this epoch's| / this epoch's, over consecutive epochs of one job
    (after its first) on the same machines beside the same jobs (by the
    last decision before each). No model predicts an epoch from the past
    better than the epoch before it does on a steady run, so this bounds
    what the scheduler's model can reach on this machine. Per epoch: (of
    the training time per iteration, of the whole epoch per iteration or
    None)."""
    path = os.path.join(metrics, "jobs.jsonl")
    if not os.path.exists(path):
        return []
    dpath = os.path.join(metrics, "decisions.jsonl")
    decisions = [json.loads(line) for line in open(dpath)] if os.path.exists(dpath) else []
    last: dict[str, tuple] = {}
    out = []
    report: dict[str, dict] = {}       # job -> its last report
    for ep in (json.loads(line) for line in open(path)):
        assign: dict = {}
        for d in decisions:
            if d["t"] > ep["t"]:
                break
            assign = d["assign"]
        g = assign.get(ep["job"])
        mates = frozenset(j for j, x in assign.items() if x == g) if g else frozenset()
        tm = ep["timings"]
        rep, report[ep["job"]] = report.get(ep["job"]), ep
        if not tm.get("iters") or ep["epoch"] == 0:
            last.pop(ep["job"], None)
            continue
        t = tm["train"] / tm["iters"]
        wall = epoch_wall(rep, ep)
        where = (tuple(ep["workers"]), mates)
        prev = last.get(ep["job"])
        if prev is not None and prev[0] == where and prev[2] == ep["epoch"] - 1:
            out.append((abs(prev[1] - t) / t, abs(prev[3] - wall) / wall
                        if wall is not None and prev[3] is not None else None))
        last[ep["job"]] = (where, t, ep["epoch"], wall)
    return out


def prediction_error(metrics: str) -> dict:
    """Summary of :func:`prediction_samples` (all and steady epochs)."""
    samples = prediction_samples(metrics)
    errs = [x[1] for x in samples]
    steady = [x[1] for x in samples if x[2]]
    if not errs:
        return {}
    out = {"pred_samples": len(errs), "pred_err_median": statistics.median(errs),
           "pred_err_mean": statistics.mean(errs)}
    if steady:
        out.update({"steady_samples": len(steady),
                    "steady_err_median": statistics.median(steady),
                    "steady_err_mean": statistics.mean(steady)})
    return out


def ceiling(runs: dict[str, list[dict]], jobs, times: list[float]) -> dict | None:
    """What no schedule on these machines can beat, from the isolated runs.

    A job runs no faster than alone on idle machines (sharing only takes
    resources from it), so with ``alone[j]`` its best median run time
    (start to end, start-up included) over the isolated modes run, at the
    DoPs they ran: makespan >= max_j(arrival_j + alone[j]) and mean JCT >=
    mean_j(alone[j]). Loose (it lets every job run alone at once), so the
    ratios it gives are upper bounds on any scheduler's gain; a DoP no
    isolated mode ran is not in them.
    """
    alone: dict[str, float] = {}
    for m, rs in runs.items():
        if not m.startswith("isolated"):
            continue
        per: dict[str, list[float]] = {}
        for r in rs:
            for s in r.get("statuses", []):
                per.setdefault(s["name"], []).append(s["ended"] - s["started"])
        for name, xs in per.items():
            alone[name] = min(alone.get(name, float("inf")), statistics.median(xs))
    if not alone or any(name not in alone for name, _ in jobs):
        return None
    return {"makespan": max(t + alone[name] for t, (name, _) in zip(times, jobs)),
            "mean_jct": statistics.mean(alone[name] for name, _ in jobs),
            "alone": alone}


def p90(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(0.9 * (len(xs) - 1))))]


def cells(errs: list[float]) -> str:
    """'epochs median p90' columns of a list of relative errors, or '-'."""
    if not errs:
        return "     -"
    return f"{len(errs):6d} {100 * statistics.median(errs):6.1f}% {100 * p90(errs):6.1f}%"


def print_prediction_tables(runs: dict[str, list[dict]], modes: list[str]) -> None:
    """The prediction error tables per group size (1, 2, 3, 4+) and the
    noise floor, from the runs' ``samples``, ``fresh`` and ``noise``."""
    print("\nprediction error of the iteration time, per group size (all rounds; "
          "steady epochs: no job being profiled on the group's machines)")
    print(f"{'mode':13} {'group size':>10} {'epochs':>6} {'median':>7} {'p90':>7}   "
          f"Eq 4.1 alone: {'median':>7} {'p90':>7}")
    for m in modes:
        samples = [x for r in runs[m] for x in r.get("samples", [])]
        sizes = sorted({min(4, x[0]) for x in samples if x[2]})
        for size in sizes:
            sel = [x for x in samples if x[2] and min(4, x[0]) == size]
            errs, geq = [x[1] for x in sel], [x[3] for x in sel]
            label = f"{size}" if size < 4 else "4+"
            print(f"{m:13} {label:>10} {len(errs):6d} {100 * statistics.median(errs):6.1f}% "
                  f"{100 * p90(errs):6.1f}%   {'':13} {100 * statistics.median(geq):6.1f}% "
                  f"{100 * p90(geq):6.1f}%")
    print("\nthe same, predicted at each epoch report for the next epoch from the profiles "
          "then (the master's predictions.jsonl), beside the jobs then on the machines: of the "
          "training time per iteration, and of the whole epoch per iteration (its end included)")
    print(f"{'mode':13} {'group size':>10} {'epochs':>6} {'median':>7} {'p90':>7}   "
          f"whole epoch: {'epochs':>6} {'median':>7} {'p90':>7}")
    for m in modes:
        fresh = [x for r in runs[m] for x in r.get("fresh", [])]
        for size in sorted({min(4, x[0]) for x in fresh}):
            sel = [x for x in fresh if min(4, x[0]) == size]
            errs, whole = [x[1] for x in sel], [x[2] for x in sel if x[2] is not None]
            label = f"{size}" if size < 4 else "4+"
            print(f"{m:13} {label:>10} {cells(errs)}   {'':12} {cells(whole)}")
    print("\nnoise floor: |previous epoch - epoch| / epoch, one job on unchanged machines "
          "beside unchanged jobs (the error of predicting an epoch by the one before)")
    print(f"{'mode':13} {'epochs':>6} {'median':>7} {'p90':>7}   "
          f"whole epoch: {'epochs':>6} {'median':>7} {'p90':>7}")
    for m in modes:
        noise = [x for r in runs[m] for x in r.get("noise", [])]
        if noise:
            tr, wh = [x[0] for x in noise], [x[1] for x in noise if x[1] is not None]
            print(f"{m:13} {cells(tr)}   {'':12} {cells(wh)}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--machines", type=int, default=2)
    ap.add_argument("--dop", type=int, default=1, help="machines per job (isolated, naive)")
    ap.add_argument("--mean-gap", type=float, default=6.0, help="mean seconds between arrivals")
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--bandwidth", default="12MB/s")
    ap.add_argument("--cpu-users", type=int, default=8000)
    ap.add_argument("--net-items", type=int, default=100000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--modes", default="isolated:1,naive:1,isolated:2,naive:2,harmony",
                    help="MODE[:DOP],... (DOP: machines per job; the harmony "
                         "scheduler chooses its own; harmony-util: its U objective)")
    ap.add_argument("--memory-per-machine", type=parse_size, default=None,
                    help="emulated memory budget per machine (e.g. 200M): with inputs "
                         "larger than that, DoP 1 spills to disk (the 'large' workload)")
    ap.add_argument("--data-plane", default="sealed", choices=("sealed", "signed"),
                    help="the PS traffic's protection (harmony-worker --data-plane)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds of every mode, in a rotated order each round; medians")
    ap.add_argument("--timeout", type=float, default=1200, help="undilated seconds per run")
    ap.add_argument("--dilation", type=float, default=1.0,
                    help="time dilation D of the local clusters (every figure is in "
                         "undilated seconds; --bandwidth is the undilated link)")
    ap.add_argument("--keep", default=None, help="keep the clusters' state dirs here")
    ap.add_argument("--out", default=None, help="write every run's figures here (JSON)")
    a = ap.parse_args()
    stop_clusters_on_sigterm()
    times = arrivals(a.jobs, a.mean_gap, a.seed)
    print(f"{a.jobs} jobs, arrivals at {[round(t, 1) for t in times]} s, {a.machines} machines "
          f"x 1 core, {a.bandwidth}, {a.rounds} round(s)")
    modes = a.modes.split(",")
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory(prefix="harmony-sched-") as tmp:
        if a.keep:
            os.makedirs(a.keep, exist_ok=True)
            tmp = a.keep
        jobs = make_jobs(tmp, a)
        for rnd in range(a.rounds):
            order = modes[rnd % len(modes):] + modes[:rnd % len(modes)]
            if rnd % 2:
                order.reverse()
            for mode in order:
                r = run_mode(mode, jobs, times, os.path.join(tmp, f"r{rnd}"), a)
                runs[mode].append(r)
                print(json.dumps({k: v for k, v in r.items()
                                  if k not in ("statuses", "metrics_dir", "samples", "noise", "fresh")}), flush=True)
    if a.out:
        with open(a.out, "w") as fh:
            json.dump({m: [{k: v for k, v in r.items() if k != "statuses"} for r in rs]
                       for m, rs in runs.items()}, fh)
    med = {m: {k: statistics.median(r[k] for r in rs) for k in ("makespan", "mean_jct")}
           for m, rs in runs.items()}
    base = next((m for m in modes if m.startswith("isolated")), modes[0])
    best = min((m for m in modes if not m.startswith("harmony")),
               key=lambda m: med[m]["mean_jct"], default=base)
    print(f"\nmedians of {a.rounds} round(s); ratios: the first isolated mode ({base}) over "
          f"the mode, and the best baseline by mean JCT ({best}) over the mode")
    print(f"\n{'mode':13} {'makespan':>9} {'x iso':>6} {'x best':>6} {'mean JCT':>9} "
          f"{'x iso':>6} {'x best':>6} {'moves':>5} {'pauses':>6}")
    for m in modes:
        rs = runs[m]
        print(f"{m:13} {med[m]['makespan']:8.1f}s {med[base]['makespan'] / med[m]['makespan']:6.2f} "
              f"{med[best]['makespan'] / med[m]['makespan']:6.2f} {med[m]['mean_jct']:8.1f}s "
              f"{med[base]['mean_jct'] / med[m]['mean_jct']:6.2f} "
              f"{med[best]['mean_jct'] / med[m]['mean_jct']:6.2f} "
              f"{statistics.median(r['moves'] for r in rs):5.0f} "
              f"{statistics.median(r['pauses'] for r in rs):6.0f}")
    bound = ceiling(runs, jobs, times)
    if bound:
        dops = sorted({m.partition(":")[2] or str(a.dop) for m in modes if m.startswith("isolated")})
        print(f"\nceiling: no schedule beats makespan {bound['makespan']:.1f}s (a job's arrival + "
              f"its time alone) or mean JCT {bound['mean_jct']:.1f}s (every job alone, no wait), "
              f"each job at its best measured time alone at DoP {'/'.join(dops)}: at most "
              f"{med[base]['makespan'] / bound['makespan']:.2f}x / "
              f"{med[base]['mean_jct'] / bound['mean_jct']:.2f}x of {base}")
        print("  alone: " + ", ".join(f"{n} {t:.1f}s" for n, t in sorted(bound["alone"].items())))
    print_prediction_tables(runs, modes)


if __name__ == "__main__":
    main()
