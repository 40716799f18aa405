"""Simulator fidelity: the job set of bench/scheduler_e2e.py on the emulated
local cluster and in the simulator, side by side, in one command.

1. The runtime: bench/scheduler_e2e.py's 8 NMF jobs (Poisson arrivals) on a
   fresh local cluster per mode (isolated, naive, harmony).
2. Calibration, all from the isolated run (each job alone, nothing shared):
   the jobs' profiles (``harmony sim import``: median per-iteration COMP and
   COMM seconds, bytes, link, evaluation seconds), the start-up time (launch
   to the end of the first epoch, less that epoch's work; the executors'
   CPU seconds at ready are the part of it that shares the machine's CPU)
   and the epoch
   boundary's overhead (time between epoch reports not spent in the
   epoch's iterations and evaluation); naive co-location's contention model
   is harmony.sim.contention.CALIBRATED (fitted on bench/colocation.py), for
   a dilated run (D > 1: a host not oversubscribed) its quiet pair's QUIET.
3. The simulator replays each mode's arrivals with those profiles on the
   same machine count and link rate, through the master's own core.

Prints makespan, mean JCT and the per-job JCT error per mode. ``calibrate``
and ``replay`` serve ``bench/cluster_replay.py`` too (any saved run).

    python bench/sim_fidelity.py [--modes isolated:1,naive:1,harmony] [--keep DIR]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import scheduler_e2e as E2E  # noqa: E402

from harmony.sim import contention as CM  # noqa: E402
from harmony.sim.engine import Contention  # noqa: E402
from harmony.sim.importer import jobs_from_status, load_jobs_log, run_dilation, setup_cpu, \
    stretched_startups, with_dop_table  # noqa: E402
from harmony.sim.report import SimResult  # noqa: E402
from harmony.sim.run import simulate  # noqa: E402
from harmony.sim.trace import TraceJob  # noqa: E402
from harmony.cluster import stop_clusters_on_sigterm  # noqa: E402


def overheads(statuses: list[dict]) -> tuple[float, float]:
    """(start-up s, epoch boundary s): medians over the jobs of a run."""
    starts, bounds = [], []
    for s in statuses:
        eps = s.get("epochs") or []
        if not eps or s.get("started") is None:
            continue
        t0 = eps[0]["timings"]
        starts.append(eps[0]["time"] - s["started"] - t0.get("train", 0) - t0.get("eval", 0))
        for a, b in zip(eps, eps[1:]):
            t = b["timings"]
            bounds.append(b["time"] - a["time"] - t.get("train", 0) - t.get("eval", 0))
    return (statistics.median(starts) if starts else 1.0,
            max(0.0, statistics.median(bounds)) if bounds else 0.0)


@dataclass
class Calibration:
    """What the simulator takes from an isolated run: the jobs' profiles
    (by name), the machines' fixed costs and the link."""
    by_name: dict[str, TraceJob]
    contention: Contention
    link: float


def calibrate(statuses: list[dict], jobs_log: list[dict] | None = None,
              others: list[list[dict]] | None = None, net_at: bool = False) -> Calibration:
    """The calibration from an isolated run's status records (and the
    master's jobs.jsonl rows, where kept): see the module docstring. With
    ``others`` (other runs of the same jobs, each a list of status
    records), each job's COMP is as measured where one of them ran it at
    another DoP (``importer.with_dop_table``), and with ``net_at`` its COMM
    too.

    A dilated run's start-ups (D > 1, stretched: ``importer.
    stretched_startups``) are replayed as waits: the executor sleeps until
    its start-up has lasted D x its CPU seconds, and that CPU ran on the
    host's idle cores, not on its emulated machine's, so it took nothing
    from the COMPs there. On real cores at D = 1 it does (at nice 19 it
    takes what they leave), which the dilated runtime does not emulate."""
    trace, _ = jobs_from_status(statuses, jobs_log)
    if others:
        trace = with_dop_table(trace, others, comm=net_at)
    startup, boundary = overheads(statuses)
    # the CPU part of a start-up (its executors' CPU seconds at ready), in
    # undilated seconds: importer.setup_cpu (/ D for start-ups made before
    # they were stretched)
    d = run_dilation(statuses)
    setups = [setup_cpu(s, d) for st in statuses for s in st.get("setups") or ()]
    startup_cpu = min(startup, statistics.median(setups)) if setups else 0.0
    if stretched_startups(statuses):
        startup_cpu = 0.0
        trace = [dataclasses.replace(t, startup_cpu_s=0.0) for t in trace]
    link = statistics.median(t.link for t in trace if t.link) if any(t.link for t in trace) \
        else 12e6
    # a dilated cluster is sized to its host (N machines on N/D cores): the
    # quiet pair's interference (CM.QUIET), not the 2-vCPU local cluster's
    model = CM.QUIET if d > 1 else CM.CALIBRATED
    cont = Contention(model=model, startup=startup, startup_cpu=startup_cpu,
                      epoch_overhead=boundary, bandwidth=link)
    return Calibration({t.dataset: t for t in trace}, cont, link)


def print_calibration(cal: Calibration, source: str = "isolated run") -> None:
    cont = cal.contention
    print(f"\ncalibration ({source}): start-up {cont.startup:.2f}s ({cont.startup_cpu:.2f}s "
          f"of it CPU), epoch boundary {cont.epoch_overhead:.3f}s, link "
          f"{cal.link / 1e6:.1f} MB/s, contention "
          f"{cont.model.cpu_k}/{cont.model.net_k} ({cont.model.source})")
    for t in cal.by_name.values():
        fixed = f" ({', '.join(f'{c:.3f}s at DoP {m}' for m, c in t.cpu_at)})" \
            if t.cpu_at else ""
        comm = f" ({', '.join(f'{c:.3f}s at DoP {m}' for m, c in t.net_at)})" \
            if t.net_at else ""
        print(f"  {t.dataset:20s} COMP {t.cpu_s:.3f}s{fixed} COMM {t.net_s or 0:.3f}s{comm} per "
              f"iteration at DoP {t.ref_dop}, {t.iterations} iterations, eval "
              f"{t.eval_s:.3f}s/epoch")


@dataclass
class Replay:
    """One runtime run beside its simulation."""
    run_makespan: float
    sim_makespan: float
    run_jct: float              # mean
    sim_jct: float
    errors: dict[str, float]    # job name -> (sim - run) / run of its JCT
    result: SimResult

    @property
    def err_median(self) -> float:
        return statistics.median(abs(e) for e in self.errors.values())

    @property
    def err_max(self) -> float:
        return max(abs(e) for e in self.errors.values())


def replay(statuses: list[dict], cal: Calibration, machines: int, setup: str,
           max_jobs_per_machine: int = 0, cpus: int = 1, grain: int = 10**6) -> Replay:
    """Simulate the jobs of a runtime run (its status records) as they
    arrived, each asking for the machines it asked for, with ``cal``'s
    profiles, under the simulator's ``setup`` (a mode or POLICY@MODE)."""
    t0 = min(s["submitted"] for s in statuses)
    mine = [dataclasses.replace(cal.by_name[s["name"]], arrival=s["submitted"] - t0,
                                machines=s["machines"], id=s["name"]) for s in statuses]
    res = simulate(mine, machines, setup, contention=cal.contention, bandwidth=cal.link,
                   grain=grain, cpus=cpus, max_jobs_per_machine=max_jobs_per_machine,
                   statuses=True)
    sim = {j.id: j.jct for j in res.jobs}
    real = {s["name"]: s["ended"] - s["submitted"] for s in statuses}
    return Replay(max(s["ended"] for s in statuses) - t0, res.get_makespan(),
                  statistics.mean(real.values()), statistics.mean(sim.values()),
                  {n: (sim[n] - real[n]) / real[n] for n in real}, res)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--machines", type=int, default=2)
    ap.add_argument("--dop", type=int, default=1)
    ap.add_argument("--mean-gap", type=float, default=6.0)
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--bandwidth", default="12MB/s")
    ap.add_argument("--cpu-users", type=int, default=8000)
    ap.add_argument("--net-items", type=int, default=100000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--modes", default="isolated:1,naive:1,harmony")
    ap.add_argument("--timeout", type=float, default=1200)
    ap.add_argument("--keep", default=None, help="keep the clusters' state dirs here")
    ap.add_argument("--save", default=None, help="write the runtime's results (JSON) here")
    ap.add_argument("--load", default=None, help="skip the runtime: use a --save file")
    ap.add_argument("--dilation", type=float, default=1.0,
                    help="time dilation of the runtime's clusters (figures undilated)")
    a = ap.parse_args()
    stop_clusters_on_sigterm()
    logging.getLogger("harmony.master").setLevel(logging.WARNING)
    if a.load:
        runs = json.load(open(a.load))
    else:
        times = E2E.arrivals(a.jobs, a.mean_gap, a.seed)
        runs = []
        with tempfile.TemporaryDirectory(prefix="harmony-fidelity-") as tmp:
            if a.keep:
                os.makedirs(a.keep, exist_ok=True)
                tmp = a.keep
            jobs = E2E.make_jobs(tmp, a)
            for spec in a.modes.split(","):
                r = E2E.run_mode(spec, jobs, times, tmp, a)
                r["jobs_log"] = load_jobs_log(os.path.join(r.pop("metrics_dir"), "jobs.jsonl"))
                runs.append(r)
                print(f"runtime {r['mode']}: makespan {r['makespan']:.1f}s, mean JCT "
                      f"{r['mean_jct']:.1f}s", flush=True)
        if a.save:
            json.dump(runs, open(a.save, "w"))
    iso = next(r for r in runs if r["mode"].startswith("isolated"))
    cal = calibrate(iso["statuses"], iso.get("jobs_log"))
    print_calibration(cal)
    rows = []
    variants = [(r, r["mode"], cal.contention) for r in runs]
    for r in runs:      # naive co-location under the other contention models too
        if r["mode"].startswith("naive"):
            for label, model in (("ideal", CM.IDEAL), ("paper-like", CM.PAPER_LIKE)):
                variants.append((r, f"{r['mode']} ({label})",
                                 dataclasses.replace(cal.contention, model=model)))
    for r, label, cont in variants:
        mode = r["mode"].partition(":")[0]
        rep = replay(r["statuses"], dataclasses.replace(cal, contention=cont), a.machines,
                     mode)
        rows.append((label, rep.run_makespan, rep.sim_makespan, rep.run_jct, rep.sim_jct,
                     rep.err_median, rep.err_max))
    print(f"\n{'mode':22} {'makespan run':>12} {'sim':>7} {'err':>6} {'mean JCT run':>12} "
          f"{'sim':>7} {'err':>6} {'per-job JCT err median / max':>30}")
    for mode, mk, smk, jct, sjct, med, mx in rows:
        print(f"{mode:22} {mk:11.1f}s {smk:6.1f}s {100 * (smk - mk) / mk:+5.1f}% "
              f"{jct:11.1f}s {sjct:6.1f}s {100 * (sjct - jct) / jct:+5.1f}% "
              f"{100 * med:14.1f}% / {100 * mx:5.1f}%")


if __name__ == "__main__":
    main()
