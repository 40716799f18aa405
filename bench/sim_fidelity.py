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
   is harmony.sim.contention.CALIBRATED (fitted on bench/colocation.py).
3. The simulator replays each mode's arrivals with those profiles on the
   same machine count and link rate, through the master's own core.

Prints makespan, mean JCT and the per-job JCT error per mode.

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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import scheduler_e2e as E2E  # noqa: E402

from harmony.sim import contention as CM  # noqa: E402
from harmony.sim.engine import Contention  # noqa: E402
from harmony.sim.importer import jobs_from_status, load_jobs_log  # noqa: E402
from harmony.sim.run import simulate  # noqa: E402


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
    trace, _ = jobs_from_status(iso["statuses"], iso["jobs_log"])
    by_name = {t.dataset: t for t in trace}
    startup, boundary = overheads(iso["statuses"])
    setups = [c for st in iso["statuses"] for _, c in st.get("setups") or ()]
    # the CPU part of a start-up (its executors' CPU seconds at ready)
    startup_cpu = min(startup, statistics.median(setups)) if setups else 0.0
    link = statistics.median(t.link for t in trace if t.link) if any(t.link for t in trace) \
        else 12e6
    cont = Contention(startup=startup, startup_cpu=startup_cpu, epoch_overhead=boundary,
                      bandwidth=link)
    print(f"\ncalibration (isolated run): start-up {startup:.2f}s ({startup_cpu:.2f}s of it "
          f"CPU), epoch boundary "
          f"{boundary:.3f}s, link {link / 1e6:.1f} MB/s, contention "
          f"{cont.model.cpu_k}/{cont.model.net_k} ({cont.model.source})")
    for t in trace:
        print(f"  {t.dataset:14s} COMP {t.cpu_s:.3f}s COMM {t.net_s or 0:.3f}s per iteration "
              f"at DoP {t.ref_dop}, {t.iterations} iterations, eval {t.eval_s:.3f}s/epoch")
    rows = []
    variants = [(r, r["mode"], cont) for r in runs]
    for r in runs:      # naive co-location under the other contention models too
        if r["mode"].startswith("naive"):
            for label, model in (("ideal", CM.IDEAL), ("paper-like", CM.PAPER_LIKE)):
                variants.append((r, f"{r['mode']} ({label})",
                                 dataclasses.replace(cont, model=model)))
    for r, label, cont in variants:
        mode = r["mode"].partition(":")[0]
        sts = r["statuses"]
        t0 = min(s["submitted"] for s in sts)
        mine = [dataclasses.replace(by_name[s["name"]], arrival=s["submitted"] - t0,
                                    machines=s["machines"], id=s["name"]) for s in sts]
        res = simulate(mine, a.machines, mode, contention=cont, bandwidth=link, grain=10**6,
                       cpus=1)
        sim = {j.id: j.jct for j in res.jobs}
        real = {s["name"]: s["ended"] - s["submitted"] for s in sts}
        errs = [abs(sim[n] - real[n]) / real[n] for n in real]
        s_mk = res.get_makespan()
        s_jct = statistics.mean(sim.values())
        rows.append((label, r["makespan"], s_mk, r["mean_jct"], s_jct,
                     statistics.median(errs), max(errs)))
    print(f"\n{'mode':22} {'makespan run':>12} {'sim':>7} {'err':>6} {'mean JCT run':>12} "
          f"{'sim':>7} {'err':>6} {'per-job JCT err median / max':>30}")
    for mode, mk, smk, jct, sjct, med, mx in rows:
        print(f"{mode:22} {mk:11.1f}s {smk:6.1f}s {100 * (smk - mk) / mk:+5.1f}% "
              f"{jct:11.1f}s {sjct:6.1f}s {100 * (sjct - jct) / jct:+5.1f}% "
              f"{100 * med:14.1f}% / {100 * mx:5.1f}%")


if __name__ == "__main__":
    main()
