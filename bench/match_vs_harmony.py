"""Muri-style matching (``match``) against Harmony's Algorithms 1/2
(``harmony``) on the same inputs (issue #15 item 4).

Both policies are the master's own pure functions
(``harmony.policies.registry``), called on the same
:class:`ClusterView`: ``n`` jobs waiting with their profiles already
measured (``harmony.sched.synthetic.random_profiles``: profiled at DoP 16,
COMM growing with DoP, ``Profile.remote`` = f x Tnet with f uniform in
``--remote``), each asking for 16 machines, an idle cluster.

(1) **First decision**, at 80 jobs on 100 machines and 8,000 jobs on 10,000
    machines: the time to decide (wall clock, one thread, on a loaded
    machine: indicative), jobs started, groups, and U of the resulting
    grouping (``harmony.sched.model.cluster_util`` over the whole cluster,
    idle machines at 0, then ``score``). A decision that takes longer than
    ``--limit`` seconds (default 120) is stopped and reported as such.
(2) **Predicted JCT** (80 jobs, 100 machines): a replay of the decisions
    under the scheduler's own performance model. All jobs are submitted at
    time 0 with a run time alone at DoP 16 drawn like the paper workload's
    (lognormal, median 40 min); a running group's jobs each advance one
    iteration per Eq 4.1 group iteration time on their machines; each job
    end calls the policy again (the ended job in ``view.finished``) and its
    decision is applied at once (starts, moves and pauses cost nothing, no
    contention, no profiling): the mean and p95 JCT and the makespan the
    model predicts, the decisions taken and their mean time.

    python bench/match_vs_harmony.py [--seed 1] [--remote 0.5,1] [--limit 120]
        [--scales 80:100,8000:10000] [--replay 80:100]
"""
from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harmony.policies.registry import make  # noqa: E402
from harmony.policies.view import ClusterView, Decision, JobView, WorkerView  # noqa: E402
from harmony.sched.model import Profile, cluster_util, group_iter_time, job_iter_time, \
    score  # noqa: E402
from harmony.sched.synthetic import random_profiles  # noqa: E402
from harmony.sim.workload import PAPER_RUN_MEDIAN_S, PAPER_RUN_SIGMA  # noqa: E402

DOP = 16
NAMES = ("harmony", "harmony-util", "match")


def job_view(p: Profile, state: str = "profiled", workers: tuple[str, ...] = (),
             group: str = "", submitted: float = 0.0) -> JobView:
    """A profiled job as the master shows it to a policy."""
    return JobView(id=p.id, machines=DOP, submitted=submitted, state=state,
                   profile=Profile(p.id, p.t_cpu, p.t_net, p.dop, p.remote), workers=workers,
                   sched_group=group, epochs=3)


def idle_view(profiles: list[Profile], machines: int) -> ClusterView:
    """Every job waiting, profiled, on an idle cluster."""
    ws = tuple(WorkerView(f"m{i}", 8, 64 << 30, 0) for i in range(machines))
    return ClusterView(workers=ws, waiting=tuple(job_view(p, submitted=i * 1e-3)
                                                 for i, p in enumerate(profiles)))


def groups_of(dec: Decision, running: dict[str, tuple[str, tuple[str, ...]]] | None = None
              ) -> dict[str, tuple[list[str], tuple[str, ...]]]:
    """group -> (jobs, machines) after ``dec`` is applied to ``running``
    (job -> (group, machines))."""
    run = dict(running or {})
    for x, ms in dec.pause.items():
        if ms is None:
            run.pop(x, None)
        else:
            run[x] = (dec.assign.get(x, run.get(x, ("", ()))[0]), tuple(ms))
    for x, ms in dec.start.items():
        run[x] = (dec.assign.get(x, f"s:{x}"), tuple(ms))
    for x, (g, ms) in run.items():
        run[x] = (dec.assign.get(x, g), ms)
    # a group is the jobs on one machine set (groups never share machines)
    out: dict[str, tuple[list[str], tuple[str, ...]]] = {}
    by_set: dict[frozenset, str] = {}
    for x, (g, ms) in run.items():
        key = by_set.setdefault(frozenset(ms), g or f"s:{x}")
        jobs, have = out.get(key, ([], ms))
        jobs.append(x)
        out[key] = (jobs, have)
    return out


def u_of(groups: dict[str, tuple[list[str], tuple[str, ...]]], profiles: dict[str, Profile],
         machines: int) -> float:
    """U (``score`` of ``cluster_util`` over all ``machines``)."""
    return score(*cluster_util((([profiles[x] for x in js], len(ms))
                                for js, ms in groups.values()), total_machines=machines))


def _decide(name: str, view: ClusterView, conn: Any) -> None:
    t = time.perf_counter()
    dec = make(name).decide(view)
    conn.send((time.perf_counter() - t, dec))


def timed(name: str, view: ClusterView, limit: float) -> tuple[float, Decision | None]:
    """(seconds, decision) of one call of policy ``name``; in a child
    process stopped after ``limit`` s (then (limit, None))."""
    ctx = mp.get_context("fork")
    a, b = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_decide, args=(name, view, b), daemon=True)
    p.start()
    b.close()
    if a.poll(limit):
        try:
            secs, dec = a.recv()
        except EOFError:
            secs, dec = math.nan, None
        p.join()
        return secs, dec
    p.terminate()
    p.join()
    return limit, None


def first_decision(n: int, machines: int, seed: int, remote: tuple[float, float],
                   limit: float) -> None:
    ps = random_profiles(n, seed, dop=DOP, remote=remote)
    profiles = {p.id: p for p in ps}
    view = idle_view(ps, machines)
    for name in NAMES:
        secs, dec = timed(name, view, limit)
        if dec is None:
            print(f"{n:>6} {machines:>8} {name:>8} {'> ' + format(limit, '.0f'):>9} "
                  f"{'-':>8} {'-':>7} {'-':>7} {'-':>6}   did not decide within {limit:.0f} s")
            continue
        gs = groups_of(dec)
        used = sum(len(ms) for _, ms in gs.values())
        print(f"{n:>6} {machines:>8} {name:>8} {secs:>9.3f} {len(dec.start):>8} {len(gs):>7} "
              f"{used:>7} {u_of(gs, profiles, machines):>6.3f}")


def replay(name: str, ps: list[Profile], iters: dict[str, float], machines: int,
           max_wall: float) -> dict[str, Any]:
    """Replay ``name``'s decisions under the model (module docstring, (2))."""
    policy: Callable[[ClusterView], Decision] = make(name).decide
    profiles = {p.id: p for p in ps}
    left = dict(iters)
    running: dict[str, tuple[str, tuple[str, ...]]] = {}   # job -> (group, machines)
    paused: set[str] = set()
    order = {p.id: i for i, p in enumerate(ps)}
    ended: dict[str, float] = {}
    finished: list[str] = []
    last: dict[str, tuple[str, tuple[str, ...]]] = {}
    now, times, t_wall = 0.0, [], time.perf_counter()
    while len(ended) < len(ps):
        load: dict[str, int] = {}
        for _, ms in running.values():
            for m in ms:
                load[m] = load.get(m, 0) + 1
        ws = tuple(WorkerView(f"m{i}", 8, 64 << 30, load.get(f"m{i}", 0))
                   for i in range(machines))
        waiting = tuple(job_view(profiles[x], "paused" if x in paused else "profiled",
                                 submitted=order[x] * 1e-3)
                        for x in sorted(left, key=order.__getitem__)
                        if x not in running and x not in ended)
        active = tuple(job_view(profiles[x], "running", ms, g, order[x] * 1e-3)
                       for x, (g, ms) in running.items())
        done = tuple(job_view(profiles[x], "running", last[x][1], last[x][0], order[x] * 1e-3)
                     for x in finished)
        view = ClusterView(workers=ws, waiting=waiting, active=active, finished=done, now=now)
        t = time.perf_counter()
        dec = policy(view)
        times.append(time.perf_counter() - t)
        finished = []
        gs = groups_of(dec, running)
        running = {x: (dec.assign.get(x, running.get(x, (g,))[0]), ms)
                   for g, (js, ms) in gs.items() for x in js}
        paused |= {x for x, ms in dec.pause.items() if ms is None}
        paused -= set(running)
        if not running:
            return {"stuck": f"nothing runs at t={now:.0f} s with {len(left) - len(ended)} "
                             f"jobs left", "decisions": len(times)}
        if time.perf_counter() - t_wall > max_wall:
            return {"stuck": f"stopped after {max_wall:.0f} s of wall time",
                    "decisions": len(times)}
        # the next job end under Eq 4.1
        rate = {}
        for g, (js, ms) in gs.items():
            t_it = group_iter_time([profiles[x] for x in js], len(ms))
            for x in js:
                rate[x] = 1.0 / t_it
        dt = min(left[x] / rate[x] for x in running)
        now += dt
        for x in list(running):
            left[x] -= dt * rate[x]
            if left[x] <= 1e-9 * iters[x] + 1e-12:
                ended[x] = now
                finished.append(x)
                last[x] = running.pop(x)
    jcts = sorted(ended.values())
    return {"mean": statistics.fmean(jcts), "p95": jcts[min(len(jcts) - 1,
                                                            math.ceil(0.95 * len(jcts)) - 1)],
            "makespan": max(jcts), "decisions": len(times),
            "decide_mean": statistics.fmean(times), "decide_max": max(times)}


def _fmt(s: float) -> str:
    return f"{s / 60:.1f}m" if s < 36000 else f"{s / 3600:.2f}h"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--remote", default="0.5,1", help="R / Tnet range, or 0 (constant COMM)")
    ap.add_argument("--limit", type=float, default=120.0, help="s per decision at most")
    ap.add_argument("--scales", default="80:100,8000:10000", help="jobs:machines,...")
    ap.add_argument("--replay", default="80:100", help="jobs:machines of the JCT replay "
                    "('' for none)")
    a = ap.parse_args()
    r = [float(x) for x in a.remote.split(",")]
    remote = (r[0], r[-1]) if len(r) > 1 or r[0] else 0.0
    print(f"(1) first decision: n jobs waiting, profiled (random profiles at DoP {DOP}, "
          f"R/Tnet {a.remote}), each asking {DOP} machines, idle cluster; seed {a.seed}")
    print(f"{'jobs':>6} {'machines':>8} {'policy':>8} {'decide s':>9} {'started':>8} "
          f"{'groups':>7} {'used':>7} {'U':>6}")
    for sc in a.scales.split(","):
        n, m = (int(x) for x in sc.split(":"))
        first_decision(n, m, a.seed, remote, a.limit)
    if not a.replay:
        return 0
    n, m = (int(x) for x in a.replay.split(":"))
    ps = random_profiles(n, a.seed, dop=DOP, remote=remote)
    rng = random.Random(a.seed)
    iters = {p.id: max(1.0, rng.lognormvariate(math.log(PAPER_RUN_MEDIAN_S), PAPER_RUN_SIGMA)
                       / job_iter_time(p, DOP)) for p in ps}
    print(f"\n(2) predicted JCT: {n} jobs at time 0 on {m} machines, Eq 4.1 replay "
          f"(run time alone at DoP {DOP}: lognormal, median {PAPER_RUN_MEDIAN_S / 60:.0f} min)")
    print(f"{'policy':>8} {'mean JCT':>9} {'p95 JCT':>9} {'makespan':>9} {'decisions':>9} "
          f"{'mean decide s':>13} {'max s':>7}")
    for name in NAMES:
        res = replay(name, ps, iters, m, max_wall=10 * a.limit)
        if "stuck" in res:
            print(f"{name:>8}   {res['stuck']} ({res['decisions']} decisions)")
            continue
        print(f"{name:>8} {_fmt(res['mean']):>9} {_fmt(res['p95']):>9} "
              f"{_fmt(res['makespan']):>9} {res['decisions']:>9} {res['decide_mean']:>13.3f} "
              f"{res['decide_max']:>7.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
