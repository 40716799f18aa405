"""Grouping by normalized throughput (issue #17's objective), pure.

The paper's U counts a machine's busy network time as useful, so widening a
job (more remote traffic) or piling jobs into a group raises U while jobs run
slower. This planner decides by what jobs get instead:

    x_j = T_j* / T_g(m)

job j's iteration rate in its group g on m machines over its rate alone at
its best DoP (``T_j* = job_iter_time(p_j, best_dop(j))``). A job alone at its
best DoP has x = 1; sharing machines is worth it when the group's summed x
beats running its jobs one after another (interleaving efficiency
``E = Σ_j T_j(m) / T_g(m)`` ≥ 1 + ``tol``), and it frees machines for jobs
that would otherwise wait (a waiting job has x = 0).

Rules (incremental: running jobs are not moved for a small gain, since a
move costs a pause or a block migration and a restart):

* **DoP.** ``best_dop`` is the smallest machine count within ``tol`` of the
  job's (or group's) fastest iteration time, at most what it asked for: a
  job alone is never made wider than its own speed-up curve pays for.
* **Waiting jobs, first come first served, with backfilling.** Each goes
  alone onto idle machines if enough are idle for x ≥ ``ALONE_OK``; else
  into the running group (of fewer than ``MAX_GROUP`` jobs) whose E it
  raises most, if by a factor ≥ 1 + tol (a lone job's E is 1, so a pair
  must beat its jobs one after the other by tol, and a third job must make
  the pair's interleaving better by tol); else alone on whatever idle
  machines there are; else waits.
* **Arrivals** (jobs whose profiling just ended) stay where they were
  profiled when that is alone, or in a group whose E they raise by ≥ tol,
  or in a pair beside a job still profiling (judged when that one's
  profile is ready: it is then the one to leave a poor pair); otherwise
  they leave that group and are placed as waiting jobs.
* **Splitting.** With machines idle and nothing waiting, a job leaves
  its group for idle machines (up to its best DoP) when the jobs' summed
  rate grows by ``tol`` and the time it saves over its iterations left
  repays two moves. (Without it a pair of COMP-heavy jobs kept sharing 2
  machines to the end while 6 sat idle: bench/cluster_e2e.py.) The time
  saved is counted from the job's iterations as measured where it runs
  (``measured``), where known, not from the model's group time: its
  lockstep assumption had a Lasso beside an MLR on one machine at the
  MLR's 0.3 s an iteration, so moving it was to save 17 s; it ran at
  0.09 s there, and its move of 68 MiB took 7.6 s and set the makespan.
* **Narrowing.** A group on more machines than its best DoP (within the
  machines it has: e.g. a network-bound job profiled in a wide group, or a
  job whose COMP turned out not to shrink with more machines, see
  ``model.t_cpu_at``) is narrowed by a live resize when its iterations get
  ``WIDEN_GAIN`` faster and the seconds saved over the iterations it has
  left repay the move. One move, not two as for lending: nothing gives the
  machines back. (With two, an MLR profiled on 2 machines stayed there
  alone for 15 s while 6 sat idle, its iterations 0.23 s against 0.11 s on
  one: bench/cluster_e2e.py at the all-at-once load, makespan 27 s.)
* **Widening is lent.** With machines idle, nothing waiting and no new job
  to profile (``pending``), a group whose jobs all have enough work left
  (``movable``) is widened by a live resize, beyond what its jobs asked
  for, up to its best DoP on the whole cluster, when its predicted
  iteration time falls by ≥ ``WIDEN_GAIN`` (a resize moves blocks and
  stalls the job for an epoch boundary, so a small gain does not repay it),
  predicted from the lowest COMP of its last epochs (``Profile.t_cpu_low``).
  (On the EWMA, an MLR whose COMP rose from 0.11 to 0.15-0.17 s for a few
  epochs while the jobs beside it on the host ended was widened from 1 to 2
  machines for a predicted 1.2x; it ran at 1.0x there and ended 3-5 s later
  than unwidened: bench/cluster_e2e.py, 2 of 3 rounds.)
  Lending beyond what the jobs asked for must also repay its cost: the
  seconds its iterations save over the iterations its jobs are expected to
  still run (as many as they ran this attempt: Cruise's assumption), and
  at most until the next job is expected to arrive and take the machines
  back (``arrival_gap``: the recent mean gap between submissions, or the
  time since the last one if longer), must exceed two moves' measured
  cost (the lending and the giving back; ``move_cost``: a move's time
  from decision to end).
  When they are needed (a profiled job waits, or new jobs ask for more
  machines to be profiled on than are idle), a group on more machines than
  its jobs asked for gives the extra back, down to its best DoP within that. (Widening for keeps let one job take 77
  of 100 machines at paper scale; the next arrivals were profiled, and
  then paired, in its group.)
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from harmony.sched.model import Profile, group_iter_time, job_iter_time, steady
from harmony.sched.regroup import Current, RunningGroup

ALONE_OK = 0.8      # alone on fewer machines than its best DoP: fine down to this x
MAX_GROUP = 3       # jobs per group at most (the runtime's queues serve any number)
WIDEN_GAIN = 0.2    # widen a running job for >= 20% faster iterations (a move has a cost)


def best_dop(p: Profile | Sequence[Profile], cap: int, tol: float = 0.05) -> int:
    """The smallest m in 1..cap with T(m) within ``tol`` of the fastest (of a
    job, or of a group: ``group_iter_time``).

    Every term of Eq 4.1 is a + b/m (COMP: b = Tcpu*c_g; COMM: a = base + R,
    b = -R), so T is a maximum of lines in x = 1/m: convex in x, hence
    non-increasing in m up to its minimum and non-decreasing after it. Two
    binary searches (the first m where T stops falling, then the first m
    within ``tol`` of it) take O(log cap) evaluations instead of ``cap``
    (1,000 at the simulator's large scale, once per job per decision)."""
    cap = max(1, cap)
    ps = [p] if isinstance(p, Profile) else list(p)

    def t(m: int) -> float:
        return group_iter_time(ps, m)

    lo, hi = 1, cap                  # the first m with T(m+1) >= T(m): a minimum
    while lo < hi:
        mid = (lo + hi) // 2
        if t(mid + 1) >= t(mid):
            hi = mid
        else:
            lo = mid + 1
    bound = (1 + tol) * t(lo)
    first, hi = 1, lo                # T is non-increasing on 1..lo
    while first < hi:
        mid = (first + hi) // 2
        if t(mid) <= bound:
            hi = mid
        else:
            first = mid + 1
    return first


def alone_time(p: Profile, cap: int, tol: float = 0.05) -> float:
    """T_j*: the job's iteration time alone at its best DoP."""
    return job_iter_time(p, best_dop(p, cap, tol))


def _whole(p: Profile, m: int) -> float:
    """A job's seconds per iteration alone on ``m`` machines with its epoch's
    end shared out over the epoch's iterations (what ``JobView.iter_s``
    measures)."""
    return job_iter_time(p, m) + (p.end_cpu + p.end_other) / max(1.0, p.iters)


def efficiency(profiles: Sequence[Profile], m: int) -> float:
    """Σ_j T_j(m) / T_g(m): how much faster the group runs its jobs' iterations
    than running them one after another on the same m machines."""
    t = group_iter_time(profiles, m)
    return sum(job_iter_time(p, m) for p in profiles) / t if t > 0 else 0.0


def throughput(groups: Sequence[RunningGroup], profiles: Mapping[str, Profile],
               caps: Mapping[str, int], tol: float = 0.05) -> float:
    """Σ_j x_j over the jobs in ``groups`` that have profiles."""
    total = 0.0
    for g in groups:
        ps = [profiles[j] for j in g.jobs if j in profiles]
        t = group_iter_time(ps, len(g.machines))
        if t > 0:
            total += sum(alone_time(p, caps.get(p.id, 1), tol) for p in ps) / t
    return total


def _fresh(groups: Sequence[RunningGroup], want: str) -> str:
    taken = {g.id for g in groups}
    gid, i = want, 1
    while gid in taken:
        i += 1
        gid = f"{want}.{i}"
    return gid


def plan(cur: Current, waiting: Sequence[str], arrivals: Sequence[str],
         profiles: Mapping[str, Profile], caps: Mapping[str, int], tol: float = 0.05,
         movable: Sequence[str] = (), pending: int = 0,
         iters_left: Mapping[str, float] | None = None,
         move_cost: float = 0.0, arrival_gap: float = 0.0,
         measured: Mapping[str, float] | None = None) -> tuple[Current, list[str], list[str]]:
    """The next grouping: (groups, jobs left waiting, notes).

    ``cur`` holds what runs, the ``arrivals`` (profiled just now) still in the
    groups they were profiled in; ``waiting`` the profiled jobs that wait,
    in submission order; ``caps`` the machines each job asked for;
    ``movable`` the running jobs that may be widened (enough work left);
    ``pending`` the machines new jobs (not yet profiled) ask for to be
    profiled on; ``iters_left`` the iterations each running job is expected to
    still run and ``move_cost`` the seconds a live move takes from decision
    to end (measured): a group is lent machines only if the time its iterations
    save repays two moves (the lending and the giving back), counting only
    the iterations it runs before the next job is expected (``arrival_gap``
    seconds, 0: not known), which takes the machines back. ``measured``: the
    seconds per iteration (whole epochs) running jobs measured lately where
    they run (``JobView.iter_s``): a split is judged by what the job would
    save against that rather than against the model's group time."""
    groups = list(cur.groups)
    notes: list[str] = []
    left: list[str] = []
    measured = dict(measured or {})

    def idle() -> list[str]:
        used = {m for g in groups for m in g.machines}
        return [m for m in cur.machines if m not in used]

    def without(job: str) -> None:
        for i, g in enumerate(groups):
            if job in g.jobs:
                rest = tuple(x for x in g.jobs if x != job)
                groups[i] = RunningGroup(g.id, rest, g.machines)
        groups[:] = [g for g in groups if g.jobs]

    # arrivals: stay if alone or in a good pair, else placed like a waiting job
    queue = []
    for j in arrivals:
        g = next((g for g in groups if j in g.jobs), None)
        if g is None or j not in profiles:
            continue
        ps = [profiles[x] for x in g.jobs if x in profiles]
        if len(g.jobs) == 1:
            notes.append(f"{j}: stays alone on {len(g.machines)} machine(s)")
            continue
        if len(ps) < len(g.jobs):
            # a mate still profiling: judged when the last one's profile is
            # ready (then it is the arrival, and the one to leave a poor
            # group). Leaving now paused a long job beside a short new one,
            # and in a group of three it paused the first job profiled only to
            # resume it on the same machines seconds later, when the group's
            # last profile came (bench/cluster_e2e.py: lda-pubmed and
            # lasso-synthetic-a, 2-5 s each of checkpoint and relaunch)
            notes.append(f"{j}: stays in {g.id} until its mates are profiled")
            continue
        rest = [profiles[x] for x in g.jobs if x != j and x in profiles]
        if len(ps) == len(g.jobs) <= MAX_GROUP and efficiency(ps, len(g.machines)) >= \
                (1 + tol) * efficiency(rest, len(g.machines)):
            notes.append(f"{j}: stays in {g.id} (E {efficiency(ps, len(g.machines)):.2f})")
            continue
        without(j)
        queue.append(j)
    # lent machines come back when needed: a group on more machines than its
    # jobs asked for shrinks to its best DoP within that
    if waiting or queue or pending > len(idle()):
        for i, g in enumerate(groups):
            if not all(x in profiles for x in g.jobs):
                continue
            cap = max(caps.get(x, 1) for x in g.jobs)
            if len(g.machines) > cap:
                to = best_dop([profiles[x] for x in g.jobs], cap, tol)
                groups[i] = RunningGroup(g.id, g.jobs, g.machines[:to])
                notes.append(f"{g.id}: gives back {len(g.machines) - to} machine(s)")
    # a group on more machines than its best DoP (e.g. a network-bound job
    # profiled in a wide group and left alone there when its mates ended)
    # is narrowed by a live resize when its iterations get WIDEN_GAIN faster
    # and the seconds saved over the iterations it has left repay the move;
    # the machines it frees serve the waiting jobs below
    for i, g in enumerate(groups):
        m = len(g.machines)
        if m < 2 or not all(x in profiles and x in movable for x in g.jobs):
            continue
        ps = [profiles[x] for x in g.jobs]
        to = best_dop(ps, m, tol)
        t_m, t_to = group_iter_time(ps, m), group_iter_time(ps, to)
        if to >= m or t_to > t_m / (1 + WIDEN_GAIN):
            continue
        left_iters = (min(iters_left.get(x, 0.0) for x in g.jobs)
                      if iters_left is not None else float("inf"))
        if (t_m - t_to) * left_iters <= move_cost:
            continue
        groups[i] = RunningGroup(g.id, g.jobs, g.machines[:to])
        notes.append(f"{g.id}: narrowed to {to} machine(s) (iterations {t_m / t_to:.2f}x "
                     f"faster)")
    # waiting jobs, in order, then the arrivals that left their profiling group
    for j in list(waiting) + queue:
        p = profiles.get(j)
        if p is None:
            left.append(j)
            continue
        cap = caps.get(j, 1)
        want = best_dop(p, cap, tol)
        star = job_iter_time(p, want)
        free = idle()
        alone = None
        if free:
            m = min(want, len(free))
            alone = (star / job_iter_time(p, m), m)
        if alone is not None and alone[0] >= ALONE_OK:
            gid = _fresh(groups, f"g:{j}")
            groups.append(RunningGroup(gid, (j,), tuple(free[:alone[1]])))
            notes.append(f"{j}: alone on {alone[1]} machine(s)")
            continue
        best = None
        for i, g in enumerate(groups):
            if len(g.jobs) >= MAX_GROUP or not all(x in profiles for x in g.jobs):
                continue
            ps = [profiles[x] for x in g.jobs]
            m = len(g.machines)
            e = efficiency(ps, m)
            gain = efficiency(ps + [p], m) / e if e > 0 else 0.0
            if gain >= 1 + tol and (best is None or gain > best[0]):
                best = (gain, i)
        if best is not None:
            g = groups[best[1]]
            groups[best[1]] = RunningGroup(g.id, g.jobs + (j,), g.machines)
            e = efficiency([profiles[x] for x in g.jobs] + [p], len(g.machines))
            notes.append(f"{j}: joins {g.id} (E {e:.2f})")
            continue
        if alone is not None:
            gid = _fresh(groups, f"g:{j}")
            groups.append(RunningGroup(gid, (j,), tuple(free[:alone[1]])))
            notes.append(f"{j}: alone on {alone[1]} machine(s) (x {alone[0]:.2f})")
            continue
        left.append(j)
    # splitting: idle machines, nothing waiting; a job leaves its group for
    # them when the jobs' summed rate (x) grows by tol and the time it saves
    # over its iterations left repays two moves
    if not left and not pending:
        while True:
            free = idle()
            best = None
            for i, g in enumerate(groups):
                if len(g.jobs) < 2 or not free or \
                        not all(x in profiles and x in movable for x in g.jobs):
                    continue
                ps = [profiles[x] for x in g.jobs]
                m = len(g.machines)
                t_g = group_iter_time(ps, m)
                before = sum(alone_time(p, caps.get(p.id, 1), tol) for p in ps) / t_g
                for p in ps:
                    k = min(best_dop(p, caps.get(p.id, 1), tol), len(free))
                    rest = [q for q in ps if q is not p]
                    t_rest, t_k = group_iter_time(rest, m), job_iter_time(p, k)
                    after = sum(alone_time(q, caps.get(q.id, 1), tol) for q in rest) / t_rest \
                        + alone_time(p, caps.get(p.id, 1), tol) / t_k
                    left_iters = iters_left.get(p.id, 0.0) if iters_left is not None \
                        else float("inf")
                    now = measured.get(p.id)
                    saved = (now - _whole(p, k)) if now is not None else (t_g - t_k)
                    if after < (1 + tol) * before or saved * left_iters <= 2 * move_cost:
                        continue
                    if best is None or after / before > best[0]:
                        best = (after / before, i, p.id, k)
            if best is None:
                break
            gain, i, job, k = best
            g = groups[i]
            groups[i] = RunningGroup(g.id, tuple(x for x in g.jobs if x != job), g.machines)
            for x in g.jobs:    # the mates left behind no longer run as measured
                measured.pop(x, None)
            groups.append(RunningGroup(_fresh(groups, f"g:{job}"), (job,), tuple(free[:k])))
            notes.append(f"{job}: leaves {g.id} for {k} idle machine(s) (x {gain:.2f}x)")
    # widening: idle machines, nothing waiting; judged on each job's lowest
    # recent COMP (model.steady): the COMP it measured while others started
    # or ended is not what it will compute on more machines
    if not left and not pending:
        for i, g in enumerate(groups):
            free = idle()
            if not free:
                break
            if not all(x in profiles and x in movable for x in g.jobs):
                continue
            ps = [steady(profiles[x]) for x in g.jobs]
            m = len(g.machines)
            want = best_dop(ps, len(cur.machines), tol)
            if want <= m:
                continue
            to = min(want, m + len(free))
            t_m = group_iter_time(ps, m)
            cap = max(caps.get(x, 1) for x in g.jobs)
            t_to = group_iter_time(ps, to)
            hold = (min(iters_left.get(x, 0.0) for x in g.jobs) * t_to
                    if iters_left is not None else float("inf"))
            if arrival_gap > 0:
                hold = min(hold, arrival_gap)
            if to > cap and t_to > 0 and (t_m - t_to) * hold / t_to < 2 * move_cost:
                # lending beyond what its jobs asked for must repay its moves
                notes.append(f"{g.id}: not lent {to - max(m, cap)} machine(s) (saves less "
                             f"than two moves cost)")
                to = min(to, cap)
                if to <= m:
                    continue
            if group_iter_time(ps, to) <= t_m / (1 + WIDEN_GAIN):
                groups[i] = RunningGroup(g.id, g.jobs, g.machines + tuple(free[:to - m]))
                notes.append(f"{g.id}: widened to {to} machine(s)")
    return Current(tuple(groups), cur.machines), left, notes
