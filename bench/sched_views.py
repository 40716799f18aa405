"""Replay recorded Harmony policy calls: time per call, and check that every
decision is the one recorded.

The corpus is a pickled list of (view, decision, seconds): the
``harmony.policies.view.ClusterView`` the simulator gave
``harmony.policies.harmony.harmony``, the ``Decision`` it returned and
how long the call took. It is generated data, not kept in the repository;
``--record`` regenerates it by simulating the paper workload
(``harmony.sim.workload.generate("paper", seed=s)``, 100 machines, the
harmony setup, ``PAPER_BANDWIDTH``) for seeds 1 and 2 with the policy
wrapped to log each call (about 290 calls; minutes of wall clock at the
speed the policy had when the corpus was first made).

    python bench/sched_views.py [CORPUS]          # replay (default /work/sched_views.pkl)
    python bench/sched_views.py --record CORPUS   # regenerate, then replay
    python bench/sched_views.py --profile 30      # cProfile of the replay, top 30

Decisions must match exactly, floats (``predicted``, ``util``) to a relative
1e-9: any speed-up of the policy has to keep every decision it makes.
"""
from __future__ import annotations

import argparse
import cProfile
import math
import pickle
import pstats
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import harmony.policies.harmony as HP  # noqa: E402
from harmony.policies import registry as R  # noqa: E402
from harmony.policies.view import Decision  # noqa: E402

DEFAULT = "/work/sched_views.pkl"
SEEDS = (1, 2)


def record(path: str, seeds=SEEDS, machines: int = 100) -> None:
    """Simulate the paper workload per seed with the harmony policy logged."""
    from harmony.sim import run, workload
    calls = []
    inner = HP.harmony

    def logged(view):
        t = time.perf_counter()
        dec = inner(view)
        calls.append((view, dec, time.perf_counter() - t))
        return dec
    # every master core makes its policy from the registry's factory, so
    # replacing the factory reaches the simulator
    saved = R.POLICIES["harmony"]
    R.POLICIES["harmony"] = R.fn("harmony", logged, preempts=True, queued=True,
                                 predict=HP.predict_jobs)
    try:
        for s in seeds:
            t = time.perf_counter()
            n = len(calls)
            run.simulate(workload.generate("paper", seed=s), machines, "harmony",
                         bandwidth=workload.PAPER_BANDWIDTH, seed=s)
            print(f"seed {s}: {len(calls) - n} calls, {time.perf_counter() - t:.1f} s",
                  file=sys.stderr)
    finally:
        R.POLICIES["harmony"] = saved
    with open(path, "wb") as f:
        pickle.dump(calls, f)
    print(f"recorded {len(calls)} calls to {path}", file=sys.stderr)


def _close(a: float, b: float) -> bool:
    return a == b or math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0) or \
        (math.isnan(a) and math.isnan(b))


def differences(got: Decision, want: Decision) -> list[str]:
    """What differs between two decisions (empty: the same)."""
    out = []
    for f in ("start", "profile", "pause", "promote", "assign", "note"):
        if getattr(got, f) != getattr(want, f):
            out.append(f"{f}: {getattr(got, f)!r} != {getattr(want, f)!r}")
    if got.predicted.keys() != want.predicted.keys() or \
            not all(_close(got.predicted[k], want.predicted[k]) for k in got.predicted):
        out.append(f"predicted: {got.predicted!r} != {want.predicted!r}")
    if (got.util is None) != (want.util is None) or (
            got.util is not None and (len(got.util) != len(want.util) or
                                      not all(map(_close, got.util, want.util)))):
        out.append(f"util: {got.util!r} != {want.util!r}")
    return out


def replay(calls, repeat: int = 1, clock=time.perf_counter) -> tuple[list[float], int]:
    """Seconds per call (the best of ``repeat`` runs) and how many differ."""
    times, bad = [], 0
    for i, (view, want, _) in enumerate(calls):
        best = math.inf
        for _ in range(repeat):
            t = clock()
            got = HP.harmony(view)
            best = min(best, clock() - t)
        times.append(best)
        diff = differences(got, want)
        if diff:
            bad += 1
            if bad <= 5:
                print(f"call {i}: decision differs:\n  " + "\n  ".join(diff), file=sys.stderr)
    return times, bad


def _row(name: str, ts: list[float]) -> str:
    q = statistics.quantiles(ts, n=20, method="inclusive") if len(ts) > 1 else ts * 19
    return (f"{name:>10} {len(ts):>6} {statistics.mean(ts) * 1e3:>9.2f} "
            f"{statistics.median(ts) * 1e3:>9.2f} {q[18] * 1e3:>9.2f} {max(ts) * 1e3:>9.2f} "
            f"{sum(ts):>8.2f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("corpus", nargs="?", default=DEFAULT)
    ap.add_argument("--record", action="store_true",
                    help="regenerate CORPUS from simulations (seeds 1, 2) first")
    ap.add_argument("--repeat", type=int, default=1, help="time each call this many times "
                    "and keep the best")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="cProfile the replay and print the top N functions by own time")
    ap.add_argument("--limit", type=int, default=0, help="replay only the first N calls")
    ap.add_argument("--only", default="", help="replay only these calls (comma-separated "
                    "indices), e.g. the slowest while profiling")
    ap.add_argument("--cpu", action="store_true",
                    help="time with the process CPU clock (steadier on a shared machine)")
    args = ap.parse_args()
    if args.record:
        record(args.corpus)
    with open(args.corpus, "rb") as f:
        calls = pickle.load(f)
    if args.limit:
        calls = calls[:args.limit]
    if args.only:
        calls = [calls[int(i)] for i in args.only.split(",")]
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
    times, bad = replay(calls, args.repeat,
                        time.process_time if args.cpu else time.perf_counter)
    if args.profile:
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(args.profile)
        pstats.Stats(prof).sort_stats("cumulative").print_stats(args.profile)
    print(f"{'':>10} {'calls':>6} {'mean ms':>9} {'p50 ms':>9} {'p95 ms':>9} {'max ms':>9} "
          f"{'total s':>8}")
    print(_row("recorded", [s for _, _, s in calls]))
    print(_row("now (cpu)" if args.cpu else "now", times))
    print(f"decisions identical: {len(calls) - bad}/{len(calls)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
