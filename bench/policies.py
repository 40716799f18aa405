"""Every comparable policy side by side in the simulator (issue #15).

The paper workload (``harmony.sim.workload``, Poisson arrivals) on a
simulated cluster, each setup through the master's own core and policies
(``harmony.sim.run.simulate``, as ``harmony sim compare`` runs them), one
table from ``harmony.sim.report.compare_table``: mean / median / p95 JCT,
makespan, CPU and network utilization, with ratios to isolated. Then per
setup: wall time, decisions, early stops (mlfs-c) and unfinished jobs.

    python bench/policies.py [--jobs 40] [--machines 50] [--seed 1]
        [--policies isolated,naive,harmony,muri,slaq,slaq-maxmin,oasis,mlfs,mlfs-c]
        [--out DIR]

The defaults (40 jobs on 50 machines) finish in a few minutes on 2 cores;
``--jobs 80 --machines 100`` is the paper's size (bench/sim_paper.py).
"""
from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harmony.sim.engine import Contention  # noqa: E402
from harmony.sim.report import compare_table, write_plots, write_result  # noqa: E402
from harmony.sim.run import setup, simulate  # noqa: E402
from harmony.sim.workload import PAPER_BANDWIDTH, generate  # noqa: E402

ALL = "isolated,naive,harmony,muri,slaq,slaq-maxmin,oasis,mlfs,mlfs-c"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=40)
    ap.add_argument("--machines", type=int, default=50)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--policies", default=ALL)
    ap.add_argument("--out", default=None, help="per-policy JSON and plots here")
    a = ap.parse_args()
    logging.getLogger("harmony.master").setLevel(logging.WARNING)
    names = [n.strip() for n in a.policies.split(",") if n.strip()]
    for n in names:
        setup(n)
    trace = generate("paper", a.jobs, a.seed)
    results, extra = {}, {}
    for n in names:
        t = time.perf_counter()
        r = simulate(trace, a.machines, n, contention=Contention(bandwidth=PAPER_BANDWIDTH),
                     bandwidth=PAPER_BANDWIDTH, seed=a.seed)
        results[n] = r
        extra[n] = (time.perf_counter() - t, len(r.decisions),
                    sum(len(d.data.get("stop") or {}) for d in r.decisions),
                    len(r.meta["unfinished"]), r.meta["policy"], r.meta["mode"])
        print(f"{n}: {extra[n][0]:.1f}s", file=sys.stderr, flush=True)
    from rich.console import Console
    console = None if sys.stdout.isatty() else Console(width=170, force_terminal=False)
    compare_table(results, baseline="isolated" if "isolated" in names else names[0],
                  title=f"paper workload, {a.jobs} jobs (seed {a.seed}) on {a.machines} "
                        f"machines", console=console)
    print(f"{'setup':14s} {'policy@mode':22s} {'wall':>7s} {'decisions':>9s} "
          f"{'early stops':>11s} {'unfinished':>10s}")
    for n, (wall, dec, stops, unf, pol, mode) in extra.items():
        print(f"{n:14s} {pol + '@' + mode:22s} {wall:6.1f}s {dec:9d} {stops:11d} {unf:10d}")
    if a.out:
        for n, r in results.items():
            write_result(r, a.out, n)
        write_plots(results, a.out)
    return 0 if all(e[3] == 0 for e in extra.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
