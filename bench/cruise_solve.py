"""Cruise optimizer: solve time at 4, 16 and 64 machines.

Paper (§3.4.6, 32 machines): the homogeneous cost calculation takes 30 ms,
the heterogeneous one 37.4 s (Gurobi). Here: Eq 3.5's closed form
(``harmony.cruise.optimizer.homogeneous``) and the exact optimizer
(``heterogeneous``: class enumeration and MILPs by HiGHS through
scipy.optimize.milp) on

  homog   N equal machines (it should find the closed form's cost);
  het     the paper's heterogeneous mix scaled: 1 in 8 machines computes 2x
          faster and has 2x the bandwidth to the other fast ones (N=4: one
          fast machine), disjoint roles as in the paper;
  het+both  the same, a machine may be worker and server (Harmony's
          executors; its link to itself is free).

Job: 128 data blocks of 1000 items, 64 model blocks, mini-batch 1000 items.
--method picks ``heterogeneous``'s method (default "auto": the class
enumeration for disjoint roles, one MILP per number of workers below the
best layout a local search finds otherwise; "plain" is the MILP alone).
Each solve stops at --time-limit seconds; "time_limit" rows give the best
layout found and the relative gap to the best lower bound. Rows say where
the layout comes from (classes, closed_form, search, milp). Timings are
wall time on whatever machine runs this (HiGHS uses one thread here).

    python bench/cruise_solve.py [--sizes 4,16,64] [--time-limit 120] [--method auto]
"""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harmony.cruise.costmodel import Machines, Workload, block_cost  # noqa: E402
from harmony.cruise.optimizer import METHODS, heterogeneous, homogeneous  # noqa: E402

JOB = Workload(data_blocks=128, model_blocks=64, items_per_block=1000, block_units=1.0,
               batch=1000)
WPROC, BW = 2e-3, 40.0           # s per item; model blocks per second


@contextlib.contextmanager
def quiet_stdout():
    """HiGHS prints debug lines straight to fd 1 now and then."""
    sys.stdout.flush()
    saved = os.dup(1)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 1)
        try:
            yield
        finally:
            os.dup2(saved, 1)
            os.close(saved)


def het_machines(n: int) -> Machines:
    fast = set(range(max(1, n // 8)))
    wp = tuple(WPROC / 2 if i in fast else WPROC for i in range(n))
    bw = tuple(tuple(math.inf if i == j else (2 * BW if i in fast and j in fast else BW)
                     for j in range(n)) for i in range(n))
    return Machines(wp, bw)


def fmt(sol, ref: float | None = None) -> str:
    s = f"{sol.seconds:8.2f} s {sol.status:10s}"
    s += f" gap {sol.gap:5.1%}" if sol.status == "time_limit" else " " * 10
    s += f" W:{sol.workers:<2d} S:{sol.servers:<2d} C={sol.cost:8.2f} {sol.source:11s}"
    if ref is not None:
        s += f" ({sol.cost / ref - 1:+.1%} vs even)"
    return s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4,16,64")
    ap.add_argument("--time-limit", type=float, default=120.0)
    ap.add_argument("--method", default="auto", choices=METHODS)
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    print(f"job: D={JOB.data_blocks} data blocks x {JOB.items_per_block:g} items, "
          f"M={JOB.model_blocks} model blocks, B={JOB.batch:g}; "
          f"method {args.method}, time limit {args.time_limit:g} s")
    rows = []
    for n in sizes:
        reps = []
        for _ in range(20):
            cf = homogeneous(n, JOB, wproc=WPROC, bw=BW)
            reps.append(cf.seconds)
        homog = Machines.homogeneous(n, WPROC, BW)
        het = het_machines(n)
        # the closed form's layout (blind to the fast machines) on the mixed cluster
        even = block_cost(het, JOB, cf.d, cf.m).cost
        kw = {"time_limit": args.time_limit, "method": args.method}
        both = {**kw, "method": "auto"} if args.method == "classes" else kw   # disjoint only
        with quiet_stdout():
            mh = heterogeneous(homog, JOB, **kw)
            md = heterogeneous(het, JOB, **kw)
            mb = heterogeneous(het, JOB, allow_both=True, **both)
        rows.append((n, statistics.median(reps), cf, mh, md, mb, even))
        print(f"\nN={n}")
        print(f"  closed form (Eq 3.5) {statistics.median(reps) * 1e3:8.3f} ms"
              f"  W:{cf.workers} S:{cf.servers} C={cf.cost:.2f}")
        print(f"  homog                {fmt(mh)}")
        print(f"  het                  {fmt(md, even)}")
        print(f"  het+both             {fmt(mb, even)}", flush=True)
    print("\n| machines | Eq 3.5 | homog | het | het+both |")
    print("|---:|---:|---:|---:|---:|")
    for n, t, cf, mh, md, mb, even in rows:
        def cell(s):
            t = f"{s.seconds * 1e3:.1f} ms" if s.seconds < 0.1 else f"{s.seconds:.2f} s"
            return t + (f" (limit, gap {s.gap:.0%})" if s.status == "time_limit" else "")
        print(f"| {n} | {t * 1e3:.2f} ms | {cell(mh)} | {cell(md)} | {cell(mb)} |")


if __name__ == "__main__":
    main()
