"""Scheduler benchmark: decision time at the paper's scales, and decision
quality against the exhaustive optimum.

(1) Speed: ``schedule`` for 80 jobs on 100 machines and 8,000 jobs on 10,000
    machines, random profiles (``harmony.sched.synthetic``, measured at DoP
    16 as in the paper). Paper: 1.2 s and < 5 s; goal here: < 0.2 s and
    < 1 s. Also one regroup on completion in the 80-job cluster.
(2) Quality: U of the greedy plan over the exhaustive optimum on random
    instances small enough to enumerate (paper: within about 2%), against
    two optima: over prefixes of the job queue (Algorithm 1's search space)
    and over any subset of jobs.

Both for the default ``schedule`` and for ``literal=True`` (the paper's
pseudo-code as written), and each both with the paper's constant COMM time
(remote = 0: the goals above apply) and with COMM growing with DoP
(``Profile.remote`` R = f * Tnet, f uniform in ``--remote``, default
0.5-1; see ``harmony.sched.model``).

    python bench/sched_speed.py [--seeds 5] [--instances 100] [--remote 0.5,1]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harmony.sched.exhaustive import best_plan  # noqa: E402
from harmony.sched.grouping import schedule  # noqa: E402
from harmony.sched.regroup import Current, on_completion, regroup  # noqa: E402
from harmony.sched.synthetic import random_profiles  # noqa: E402

SCALES = [(80, 100, 0.2), (8000, 10000, 1.0)]          # jobs, machines, goal (s)
# (jobs, machines, DoP of the profiles): small enough for the exhaustive search
FAMILIES = [(5, 6, 2), (6, 8, 2), (7, 10, 3), (8, 12, 3)]


def _rname(remote: tuple[float, float] | float) -> str:
    return "0" if remote == 0 else f"{remote[0]:g}-{remote[1]:g}"


def speed(seeds: int, remotes: list) -> None:
    print("Decision time (wall clock, single thread), random profiles at DoP 16; "
          "remote: R / Tnet")
    print(f"{'jobs':>6} {'machines':>8} {'remote':>7} {'mode':>8} {'median s':>9} {'max s':>7} "
          f"{'goal s':>6} {'running':>8} {'groups':>6} {'U cpu':>6} {'U net':>6}")
    for (n, m, goal), remote, literal in [(sc, r, lit) for sc in SCALES for r in remotes
                                          for lit in (False, True)]:
        times, plans = [], []
        for seed in range(seeds):
            ps = random_profiles(n, seed, remote=remote)
            t = time.perf_counter()
            plans.append(schedule(ps, m, literal=literal))
            times.append(time.perf_counter() - t)
        run = statistics.median(sum(len(g.jobs) for g in p.groups) for p in plans)
        grp = statistics.median(len(p.groups) for p in plans)
        uc = statistics.mean(p.util[0] for p in plans)
        un = statistics.mean(p.util[1] for p in plans)
        shown = goal if not literal and remote == 0 else ""
        print(f"{n:>6} {m:>8} {_rname(remote):>7} {'literal' if literal else 'default':>8} "
              f"{statistics.median(times):>9.3f} {max(times):>7.3f} "
              f"{shown:>6} {run:>8.0f} {grp:>6.0f} {uc:>6.3f} {un:>6.3f}")
    # regrouping in an 80-job, 100-machine cluster scheduled from scratch:
    # the completion of its first running job (often a replacement), and a
    # full regroup seeded with its first group (Algorithm 1 on growing sets
    # of groups, the slow path of a completion)
    for remote in remotes:
        _regroup_speed(seeds, remote)


def _regroup_speed(seeds: int, remote) -> None:
    t_done, t_full, moved = [], [], []
    for seed in range(seeds):
        ps = random_profiles(80, seed, remote=remote)
        profiles = {p.id: p for p in ps}
        machines = tuple(f"m{i}" for i in range(100))
        first = regroup(Current((), machines), [p.id for p in ps], profiles)
        cur = Current(first.groups, machines)
        waiting = [p.id for p in ps if p.id not in first.start]
        t = time.perf_counter()
        ch = on_completion(cur, cur.running[0], waiting, profiles)
        t_done.append(time.perf_counter() - t)
        moved.append(ch.moved)
        t = time.perf_counter()
        regroup(cur, waiting, profiles, seed=cur.groups[0].id)
        t_full.append(time.perf_counter() - t)
    print(f"80 jobs / 100 machines, remote {_rname(remote)}: on_completion median "
          f"{statistics.median(t_done):.3f} s, "
          f"max {max(t_done):.3f} s (moved jobs median {statistics.median(moved):.0f}); "
          f"regroup over all groups median {statistics.median(t_full):.3f} s, "
          f"max {max(t_full):.3f} s")


def quality(instances: int, remotes: list) -> None:
    for remote in remotes:
        _quality(instances, remote)


def _quality(instances: int, remote) -> None:
    print()
    print(f"Decision quality: U(greedy) / U(exhaustive optimum), {instances} random "
          f"instances per row, remote (R / Tnet) {_rname(remote)}")
    print(f"{'jobs':>4} {'mach':>4} {'dop':>3} {'mode':>8} | {'vs prefix optimum':^26} | "
          f"{'vs any-subset optimum':^26}")
    print(f"{'':>22} | {'mean':>6} {'worst':>6} {'<=2%':>5} {'<=5%':>5} | "
          f"{'mean':>6} {'worst':>6} {'<=2%':>5} {'<=5%':>5}")
    rows: dict[bool, list[tuple[np.ndarray, np.ndarray]]] = {False: [], True: []}
    for n, m, dop in FAMILIES:
        opt = []
        for seed in range(instances):
            ps = random_profiles(n, seed, dop=dop, remote=remote)
            opt.append((ps, best_plan(ps, m, "prefix").score, best_plan(ps, m).score))
        for literal in (False, True):
            g = np.array([schedule(ps, m, literal=literal).score for ps, _, _ in opt])
            rp = g / np.array([o for _, o, _ in opt])
            ra = g / np.array([o for _, _, o in opt])
            rows[literal].append((rp, ra))
            print(f"{n:>4} {m:>4} {dop:>3} {'literal' if literal else 'default':>8} | "
                  f"{rp.mean():>6.3f} {rp.min():>6.3f} {np.mean(rp >= 0.98):>5.0%} "
                  f"{np.mean(rp >= 0.95):>5.0%} | {ra.mean():>6.3f} {ra.min():>6.3f} "
                  f"{np.mean(ra >= 0.98):>5.0%} {np.mean(ra >= 0.95):>5.0%}")
    for literal in (False, True):
        rp = np.concatenate([r for r, _ in rows[literal]])
        ra = np.concatenate([r for _, r in rows[literal]])
        print(f"{'all':>4} {'':>4} {'':>3} {'literal' if literal else 'default':>8} | "
              f"{rp.mean():>6.3f} {rp.min():>6.3f} {np.mean(rp >= 0.98):>5.0%} "
              f"{np.mean(rp >= 0.95):>5.0%} | {ra.mean():>6.3f} {ra.min():>6.3f} "
              f"{np.mean(ra >= 0.98):>5.0%} {np.mean(ra >= 0.95):>5.0%}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=5, help="instances per speed row")
    ap.add_argument("--instances", type=int, default=100, help="instances per quality row")
    ap.add_argument("--remote", default="0.5,1",
                    help="range lo,hi of R / Tnet for the remote > 0 runs (0: none)")
    args = ap.parse_args()
    lo, _, hi = args.remote.partition(",")
    remotes: list = [0.0]
    if float(lo) > 0 or float(hi or lo) > 0:
        remotes.append((float(lo), float(hi or lo)))
    speed(args.seeds, remotes)
    quality(args.instances, remotes)


if __name__ == "__main__":
    main()
