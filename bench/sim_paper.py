"""Paper-scale simulation: the Harmony paper's workload (80 jobs of NMF, LDA,
MLR and Lasso, Poisson arrivals; harmony.sim.workload) on 100 machines,
through the master's own core and policies (harmony.sim).

Prints, side by side in one run: isolated, naive co-location (its best and
worst placement of the two the master offers: at most 2 jobs per machine,
and no cap) and harmony — mean/median/p95 JCT, makespan, CPU and network
utilization, ratios to isolated — then the model-error experiment (a
relative error injected into every profile the jobs report; the
dissertation shows Harmony's gain collapsing beyond ~7.5%), the effect of
the simulation grain, and the simulator's speed (wall time, events,
decisions per second). With --big, also 1,000 jobs on 1,000 machines.
Each seed starts with the trace's ceiling (``harmony.sim.trace.ceiling``):
the makespan no schedule can beat and the utilization that caps.

    python bench/sim_paper.py [--seeds 1,2,3] [--errors 0,0.025,0.05,0.075,0.1,0.2]
        [--policies muri,slaq] [--plot docs/sim_error.png] [--big]

``--speed`` measures the simulator alone: the paper-scale harmony run (80
jobs, 100 machines, seed 1), then with --big 1,000 jobs on 1,000 machines
(mean gap 24 s) under isolated, muri and harmony, each stopped after
--limit seconds of wall time (its unfinished jobs are counted): wall and
process CPU seconds, simulated events and scheduler decisions per second of
wall time, and the seconds spent inside the policy.

    python bench/sim_paper.py --speed [--big] [--limit 300] [--setups isolated,muri,harmony]
        [--short 2500x64,10000x1000]
"""
from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harmony.sim.engine import Contention  # noqa: E402
from harmony.sim.report import summarize  # noqa: E402
from harmony.sim.run import simulate  # noqa: E402
from harmony.sim.trace import ceiling  # noqa: E402
from harmony.sim.workload import PAPER_BANDWIDTH, generate  # noqa: E402


def run(trace, machines, name, **kw):
    t = time.perf_counter()
    r = simulate(trace, machines, name, bandwidth=PAPER_BANDWIDTH, **kw)
    s = summarize(r)
    s["wall"] = time.perf_counter() - t
    s["events"] = r.meta["events"]
    s["dps"] = r.meta["decisions_per_s"]
    s["unfinished"] = len(r.meta["unfinished"])
    return s


def speed(runs, limit):
    """Time each (label, trace, machines, setup) run: the simulator's own
    speed, with the seconds spent in the policy (every policy wrapped)."""
    from harmony.policies import registry as R
    from harmony.policies.base import FunctionPolicy
    spent = [0.0, 0]
    for name, make in list(R.POLICIES.items()):
        def timed_make(make=make) -> FunctionPolicy:
            p = make()

            def timed(view):
                t = time.perf_counter()
                try:
                    return p.decide(view)
                finally:
                    spent[0] += time.perf_counter() - t
                    spent[1] += 1
            return FunctionPolicy(p.name, timed, p.preempts, p.queued, p.predict)
        R.POLICIES[name] = timed_make
    print(f"{'run':28s} {'wall s':>7} {'CPU s':>7} {'events':>9} {'events/s':>9} "
          f"{'decisions':>9} {'dec/s':>6} {'calls':>6} {'policy s':>8} {'done':>9} {'sim h':>6}")
    for label, trace, machines, name in runs:
        spent[:] = [0.0, 0]
        t, c = time.perf_counter(), time.process_time()
        r = simulate(trace, machines, name, bandwidth=PAPER_BANDWIDTH, wall_limit=limit)
        wall, cpu = time.perf_counter() - t, time.process_time() - c
        ev, dec = r.meta["events"], len(r.decisions)
        done = len(r.jobs) - len(r.meta["unfinished"])     # r.jobs: those submitted
        print(f"{label:28s} {wall:7.1f} {cpu:7.1f} {ev:9d} {ev / wall:9.0f} {dec:9d} "
              f"{dec / wall:6.2f} {spent[1]:6d} {spent[0]:8.1f} {done:4d}/{len(trace):<4d} "
              f"{r.meta['sim_time'] / 3600:6.1f}", flush=True)


def row(name, s, base):
    return (f"{name:22s} {s['mean_jct'] / 3600:7.2f}h {base['mean_jct'] / s['mean_jct']:5.2f}x "
            f"{s['median_jct'] / 3600:7.2f}h {s['p95_jct'] / 3600:7.2f}h "
            f"{s['makespan'] / 3600:7.2f}h {base['makespan'] / s['makespan']:5.2f}x "
            f"{100 * s['cpu_util']:5.1f}% {100 * s['net_util']:5.1f}% "
            f"{s['wall']:6.1f}s {s['decisions']:5d}" + (f"  UNFINISHED {s['unfinished']}"
                                                      if s["unfinished"] else ""))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=80)
    ap.add_argument("--machines", type=int, default=100)
    ap.add_argument("--seeds", default="1")
    ap.add_argument("--errors", default="0,0.025,0.05,0.075,0.1,0.2")
    ap.add_argument("--grains", default="20,60")
    ap.add_argument("--plot", default=None, help="write the model-error plot (PNG) here")
    ap.add_argument("--big", action="store_true", help="also 1,000 jobs on 1,000 machines")
    ap.add_argument("--policies", default="muri,slaq", help="other policies to compare")
    ap.add_argument("--speed", action="store_true",
                    help="only the simulator's speed (paper-scale harmony; with --big, "
                         "1000x1000 runs too)")
    ap.add_argument("--limit", type=float, default=300.0,
                    help="--speed: stop each 1000x1000 run after this many seconds of wall time")
    ap.add_argument("--setups", default="isolated,muri,harmony",
                    help="--speed --big / --short: the setups run")
    ap.add_argument("--short", default=None, metavar="JOBSxMACHINES",
                    help="--speed: many short jobs over weeks (the 'short' workload, the "
                         "shape of public DL cluster traces; issue #32 item 6), e.g. "
                         "2500x64 or 10000x1000")
    a = ap.parse_args()
    logging.getLogger("harmony.master").setLevel(logging.ERROR)
    if a.speed:
        runs = [(f"paper {a.jobs}x{a.machines} harmony", generate("paper", a.jobs, 1),
                 a.machines, "harmony")]
        if a.big:
            big = generate("paper", 1000, 1, mean_gap=24.0)
            runs += [(f"1000x1000 {n}", big, 1000, n) for n in a.setups.split(",") if n]
        for spec in (a.short or "").split(","):
            if spec:
                nj, nm = (int(x) for x in spec.split("x"))
                short = generate("short", nj, 1)
                runs += [(f"short {nj}x{nm} {n}", short, nm, n)
                         for n in a.setups.split(",") if n]
        speed(runs, a.limit)
        return
    cont = Contention()
    print(f"contention model (naive): k_cpu={cont.model.cpu_k} k_net={cont.model.net_k} "
          f"({cont.model.source}); start-up {cont.startup}s + input/disk; links "
          f"{PAPER_BANDWIDTH * 8 / 1e9:.1f} Gbit/s")
    head = (f"{'setup':22s} {'meanJCT':>8} {'x iso':>6} {'median':>8} {'p95':>8} "
            f"{'makespan':>8} {'x iso':>6} {'CPU':>6} {'net':>6} {'wall':>7} {'dec':>5}")
    errs: dict[float, list[tuple[float, float]]] = {}
    for seed in [int(s) for s in a.seeds.split(",")]:
        trace = generate("paper", a.jobs, seed)
        print(f"\n== {len(trace)} jobs (paper mix, seed {seed}) on {a.machines} machines ==")
        c = ceiling(trace, a.machines, PAPER_BANDWIDTH)
        print(f"ceiling (any schedule): makespan >= {c.makespan / 3600:.2f}h (set by {c.job}), "
              f"so CPU utilization <= {100 * c.cpu:.1f}%")
        print(head)
        base = run(trace, a.machines, "isolated", seed=seed)
        print(row("isolated", base, base), flush=True)
        for name, kw in (("naive (<=2 jobs/machine)", {"max_jobs_per_machine": 2}),
                         ("naive (no cap)", {})):
            print(row(name, run(trace, a.machines, "naive", seed=seed, **kw), base), flush=True)
        h = run(trace, a.machines, "harmony", seed=seed)
        print(row("harmony", h, base), flush=True)
        for name in [p for p in a.policies.split(",") if p]:
            print(row(name, run(trace, a.machines, name, seed=seed), base), flush=True)
        print(f"harmony: {h['events']} events in {h['wall']:.1f}s "
              f"({h['events'] / h['wall']:.0f} events/s), {h['decisions']} decisions "
              f"({h['dps']:.1f} decisions/s of wall time)")

        print("\nmodel error (relative error injected into every reported profile)")
        print(f"{'error':>6} {'meanJCT x iso':>14} {'makespan x iso':>15}")
        for e in [float(x) for x in a.errors.split(",") if x]:
            s = h if e == 0 else run(trace, a.machines, "harmony", seed=seed, error=e)
            errs.setdefault(e, []).append((base["mean_jct"] / s["mean_jct"],
                                           base["makespan"] / s["makespan"]))
            print(f"{100 * e:5.1f}% {errs[e][-1][0]:14.2f} {errs[e][-1][1]:15.2f}", flush=True)

        print("\nsimulation grain (at most N simulated iterations per job)")
        for g in [int(x) for x in a.grains.split(",") if x]:
            s = run(trace, a.machines, "harmony", seed=seed, grain=g)
            print(f"grain {g:4d}: mean JCT x iso {base['mean_jct'] / s['mean_jct']:.2f}, "
                  f"makespan x iso {base['makespan'] / s['makespan']:.2f}, wall {s['wall']:.1f}s",
                  flush=True)
    seeds = len(a.seeds.split(","))
    print(f"\nmodel error, mean over {seeds} seed(s)")
    pts = []
    for e, v in sorted(errs.items()):
        pts.append((e, statistics.mean(x for x, _ in v), statistics.mean(y for _, y in v)))
        print(f"{100 * e:5.1f}%  mean JCT x iso {pts[-1][1]:.2f}  makespan x iso {pts[-1][2]:.2f}")
    if a.plot and pts:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(5, 3.2))
        ax.plot([100 * p[0] for p in pts], [p[1] for p in pts], "o-", label="mean JCT")
        ax.plot([100 * p[0] for p in pts], [p[2] for p in pts], "s-", label="makespan")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xlabel("profile error injected (%)")
        ax.set_ylabel("harmony's speedup over isolated")
        ax.set_title(f"{a.jobs} jobs, {a.machines} machines, {seeds} seed(s) (simulated)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(a.plot, dpi=120)
        print(f"plot: {a.plot}")
    if a.big:
        trace = generate("paper", 1000, 1, mean_gap=24.0)
        print("\n== 1000 jobs on 1000 machines (paper mix, mean gap 24 s) ==")
        print(head)
        base = run(trace, 1000, "isolated")
        print(row("isolated", base, base), flush=True)
        h = run(trace, 1000, "harmony")
        print(row("harmony", h, base), flush=True)
        print(f"harmony: {h['events']} events, {h['decisions']} decisions in {h['wall']:.1f}s")


if __name__ == "__main__":
    main()
