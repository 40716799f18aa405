"""The Harmony policy: profiling, grouping, DoP sizing and regrouping.

A pure function from a :class:`ClusterView` to a :class:`Decision`, like the
other policies; the master applies the decision (launch, pause, migrate) and
calls the policy again whenever something changed. The arithmetic (the
performance model, Algorithms 1 and 2, the regrouping rules and the mapping
onto machine names) lives in :mod:`harmony.sched`; this module turns job
states into the scheduler's events and its answer into actions:

* A new job has no profile: it is *profiled* on idle machines if there are
  some, else co-located with a group's jobs under the subtask queues
  (§4.3.2), in a group with room for it (see ``_room``), else it waits.
* Jobs that ended since the last call are completions
  (``regroup.on_completion``: a similar waiting job replaces the finished
  one, else incremental regrouping under the 5% rules).
* A job with ``PROFILE_SAMPLES`` epochs of profile is an arrival
  (``regroup.on_arrival``: it joins the group where it raises U most, or a
  new group on idle machines, or waits, paused, when it does not raise U or
  when other profiled/paused jobs already wait).
* Idle machines with work to give them: ``regroup.regroup``.

The resulting grouping is compared with what runs: a job on a different
machine set is paused at its next epoch end and resumed there (migration);
a running job left out is paused; a waiting job placed is started (from its
checkpoint if it has one); a profiling job that stays put keeps running.
"""
from __future__ import annotations

import bisect

from harmony.policies.base import MIN_GAIN
from harmony.policies.view import PROFILE_SAMPLES, ClusterView, Decision, JobView
from harmony.sched.model import Profile, group_iter_time, group_util, job_iter_time, score
from harmony.sched.regroup import (Bound, Current, RunningGroup, on_arrival, on_completion,
                                   regroup, utilization)
from harmony.sched import throughput as TP
from harmony.sched.replay import predict, predict_both

__all__ = ["harmony", "harmony_util", "PROFILE_SAMPLES", "MIN_GAIN"]

#: epochs a running job must have done (this attempt) before it is widened:
#: a job with little done is taken to have little left to repay a move
WIDEN_AFTER = 2
#: epochs a job must have run on its current machine count before it is
#: moved again (widened, narrowed, split off): its profile there, and the
#: fixed part of its COMP (model.t_cpu_at), settle first. Without it one run
#: of bench/cluster_e2e.py made 14 moves of 2-6.5 s each in 63 s, MLR going
#: 2 -> 3 -> 1 machines on the first epoch measured at each width.
SETTLE = 3
#: seconds a live move stalls a job until the master has measured one
#: (Cruise's MOVE_OVERHEAD: the epoch boundary and the acknowledgements)
DEFAULT_MOVE_COST = 1.0

# Decision: running jobs keep their priority over waiting ones when the
# scheduler regroups (Algorithm 1 takes jobs in this order). Letting waiting
# jobs go first paused a half-done job to start new ones; in a run of
# bench/scheduler_e2e.py it then ran alone at the end (makespan 148 s against
# 67 s in the run before that change of order came into play).
ORDERS = ("running first",)

# Decision: each job's own iteration time is predicted by replaying its
# group's queues (harmony.sched.replay: FIFO grants, preemption, epoch ends)
# where at most REPLAY_GROUPS groups share machines (a replay costs about
# 1-3 ms, profiles drift every epoch so the cache rarely hits, and with 16
# the paper-scale simulation spent 15 of its 17 CPU seconds replaying);
# beyond that, and for the search itself, Eq 4.1's group time stands.
REPLAY_GROUPS = 4

# Decision (an extension for large clusters): with more than LARGE jobs
# running or waiting, regrouping searches a bounded set of candidates
# (``regroup.Bound``: the seed group and at most 4 more, the first 32
# waiting jobs). Below it (the paper's 80 jobs on 100 machines among them)
# nothing changes. At 1,000 jobs on 1,000 machines the unbounded search
# took seconds per completion and one decision with 58 completions queued
# behind a pause took 18 s of CPU; the simulator did not finish in 14 min.
LARGE = 160
BOUND = Bound(groups=4, waiting=32)


def _gid(j: JobView) -> str:
    return j.sched_group or f"g:{j.id}"


def _without(cur: Current, job: str) -> Current:
    groups = []
    for g in cur.groups:
        if job in g.jobs:
            rest = tuple(x for x in g.jobs if x != job)
            if rest:
                groups.append(RunningGroup(g.id, rest, g.machines))
        else:
            groups.append(g)
    return Current(tuple(groups), cur.machines)


def _fresh(cur: Current, want: str) -> str:
    taken = {g.id for g in cur.groups}
    gid, i = want, 1
    while gid in taken:
        i += 1
        gid = f"{want}.{i}"
    return gid


def _room(g: RunningGroup, profiles: dict[str, Profile], profiling: dict) -> float:
    """What a new job profiled in group ``g`` could use that the group leaves
    idle. None (0) in a group with a job not yet profiled or profiled now
    (its use is not known), or with ``TP.MAX_GROUP`` jobs. On one machine
    only idle CPU, since a job alone on its machine sends nothing over the
    network (its whole model is local): two such jobs only time-slice a core,
    each twice as slow, and the newcomer is then paused to wait for a machine
    (bench/scheduler_e2e.py: 2 CPU-heavy jobs shared one core while
    profiling, 3 epochs each). On several machines, where the newcomer uses
    both, what the group leaves of the resource it uses least (a CPU-bound
    group leaves the network to a newcomer).

    Decision: room on several machines was 1.0 for any group, with profiles
    or not. With 8 jobs submitted at once on 8 machines
    (bench/cluster_e2e.py) all 8 were profiled at once, three to a group,
    each about 3x slower for its 3 profiling epochs: 15-22 s, longer than
    most of these jobs take alone. Now the first come take the idle
    machines, as FIFO would, and the next are profiled beside profiled
    groups that leave room."""
    if len(g.jobs) >= TP.MAX_GROUP or any(x not in profiles or x in profiling
                                           for x in g.jobs):
        return 0.0
    cpu, net = group_util([profiles[x] for x in g.jobs], len(g.machines))
    if len(g.machines) == 1:
        return max(0.0, 1.0 - cpu)
    return max(0.0, 1.0 - min(cpu, net))


#: jobs submitted less than this many seconds apart are a batch: each is
#: profiled on one machine (``_in_batch``)
BATCH_GAP = 0.1


def _in_batch(t: float, times: list[float]) -> bool:
    """Whether a job submitted at ``t`` came in a batch: another job of the
    view (``times``: their submission times, sorted, its own among them)
    was submitted within ``BATCH_GAP`` of it. Such jobs are profiled on one
    machine each, not on as many as they ask for: the paper's rule for the
    jobs a cluster starts with ("allocating the smallest number of machines
    for each job, to minimize the communication overhead and get
    information from as many jobs as possible", dissertation §4.3.2), so
    that a batch as large as the cluster is measured at once, without the
    network; the throughput rules then widen a job where that pays. A new
    job that would take more than one machine waits ``BATCH_GAP`` after its
    submission (``Decision.again_at``) for others, so that the first of a
    batch is placed with the rest.

    Decision: with 8 jobs submitted at once on 8 machines
    (bench/cluster_e2e.py, D = 8), the first three took all 8 machines to
    be profiled at the DoPs they asked for (2-4) and the last, the longest,
    waited 8 s; every one of these jobs ran fastest alone on one machine
    (``isolated-1``). Profiling a batch on one machine each brought the
    simulator's replay of that run from 17.7 s makespan and 10.3 s mean
    JCT to 14.4 s and 6.2 s (isolated-1: 12.2 s and 5.9 s). Profiling every
    job on one machine, batch or not, cost the paper-scale runs half their
    gain (mean JCT 1.84x -> 0.98x over isolated): their jobs' COMP
    dominates, and one machine makes each profiling epoch 16x longer."""
    k = bisect.bisect_left(times, t)      # times[k] is its own
    return (k > 0 and t - times[k - 1] < BATCH_GAP) or \
        (k + 1 < len(times) and times[k + 1] - t < BATCH_GAP)


#: a new job waits for machines expected to free within this many of the
#: group's epochs rather than be profiled beside the group (_frees_first)
FREES_EPOCHS = 1.0


def _epoch_s(p: Profile, m: int) -> float:
    """A job's epoch on ``m`` machines alone, by its profile: its iterations
    at the model's iteration time, then its evaluation and epoch end."""
    return max(1.0, p.iters) * job_iter_time(p, m) + p.end_cpu + p.end_other


def _frees_in(active, profiles: dict[str, Profile]) -> list[tuple[float, int]]:
    """(seconds until it ends, machines it frees) of every running job whose
    epochs left are known (its --max-epochs), from its profile on the
    machines it has (alone: the model's iteration time; sharing makes it
    later, so this is a lower bound), soonest first."""
    out = []
    for j in active:
        p = profiles.get(j.id)
        if p is None or j.epochs_left is None or not j.workers or j.state != "running":
            continue
        out.append((j.epochs_left * _epoch_s(p, len(j.workers)), len(j.workers)))
    return sorted(out)


def _frees_first(g: RunningGroup, frees: list[tuple[float, int]],
                 profiles: dict[str, Profile], need: int, restart: float = 0.0) -> bool:
    """Whether ``need`` machines are expected to be free within
    ``FREES_EPOCHS`` of group ``g``'s epochs (a job profiled there needs
    PROFILE_SAMPLES of its own, at least as many of the group's): then it
    waits for them instead. (Within 3 of the group's epochs cost the
    simulator's paper runs 4% of makespan; within 1, mean JCT 2.31x /
    makespan 1.59x over isolated against 2.33x / 1.65x without the rule,
    within the seeds' spread.)

    Decision: on the 2-machine trace at a light load (bench/scheduler_e2e.py,
    mean gap 6 s) new jobs were profiled beside a running job, found not to
    interleave, paused (a checkpoint) and relaunched alone 3 s later, when a
    machine came free anyway: harmony at 0.83x of isolated's mean JCT.

    Decision (session 28): the horizon also holds ``restart``, what leaving
    a poor pair costs the newcomer (a move's measured cost: pause,
    checkpoint, relaunch). With the compiled kernels the 2-machine trace's
    jobs take 3-12 s, and at its all-at-once load two jobs a round were
    profiled beside a job that ended 1-2 s later, paused and relaunched:
    harmony at 0.88x / 0.85x and 0.92x / 0.87x of isolated (makespan / mean
    JCT, 2 rounds each); with the restart in the horizon 0.97x / 0.96x.
    Paper scale (bench/sim_paper.py, seeds 1-3): mean JCT 1.81x against
    1.84x over isolated, makespan 1.48x against 1.44x."""
    ps = [profiles[x] for x in g.jobs if x in profiles]
    if not ps:
        return False
    m = len(g.machines)
    epoch = max(_epoch_s(p, m) for p in ps)
    horizon, got = FREES_EPOCHS * epoch + restart, 0
    for t, n in frees:
        if t > horizon:
            return False
        got += n
        if got >= max(1, need):
            return True
    return False


def predict_jobs(profiles: dict[str, Profile], machines: int) -> dict[str, tuple[float, float]]:
    """Each job's predicted (training, epoch) seconds per iteration in a
    group of these jobs (their profiles, by job) on ``machines`` machines:
    the model the decisions use (alone: Tcpu + Tnet + overhead; shared: the
    queue replay), and the same with the epoch's end included."""
    return predict_both(list(profiles.values()), machines)


def _U(groups, profiles, total: int) -> float:
    return score(*utilization(groups, profiles, total))


def _stay(cur: Current, home: RunningGroup | None, job: str) -> tuple | None:
    """The grouping with ``job`` back where it was profiled, if it can stay."""
    if home is None:
        return None
    if len(home.jobs) == 1:     # it was alone: its machines must still be idle
        if not set(home.machines) <= set(cur.idle):
            return None
        return cur.groups + (RunningGroup(home.id, (job,), home.machines),)
    return tuple(RunningGroup(g.id, g.jobs + (job,), g.machines) if g.id == home.id else g
                 for g in cur.groups)


def harmony_util(view: ClusterView) -> Decision:
    """The paper's objective: cluster utilization U (Eq 4.4, ``model.score``)."""
    return harmony(view, objective="util")


def harmony(view: ClusterView, objective: str = "throughput") -> Decision:
    """The Harmony scheduler. ``objective``: "throughput" (the default:
    normalized throughput, :mod:`harmony.sched.throughput`) or "util" (the
    paper's U, Algorithms 1 and 2 with the regrouping rules)."""
    if objective not in ("throughput", "util"):
        raise ValueError(f"unknown objective {objective!r}")
    util = objective == "util"
    dec = Decision()
    live = tuple(w.name for w in view.workers)
    if not live:
        return dec
    alive = set(live)
    profiles = {j.id: j.profile for j in view.active + view.waiting + view.finished
                if j.profile is not None}

    # what runs now (finished jobs still in their groups, for on_completion)
    members: dict[str, list[str]] = {}
    machines: dict[str, list[str]] = {}
    owner: dict[str, str] = {}      # machine -> its group: groups never share a machine
    for j in view.active + view.finished:
        gid = _gid(j)
        members.setdefault(gid, []).append(j.id)
        ms = machines.setdefault(gid, [])
        for m in j.workers:
            # a finished job's machines may already serve another group (and
            # a job caught between two groups counts in its first): U and the
            # plans count each machine once
            if m in alive and owner.setdefault(m, gid) == gid and m not in ms:
                ms.append(m)
    cur = Current(tuple(RunningGroup(g, tuple(members[g]), tuple(machines[g]))
                        for g in members if machines[g]), live)
    before = {j.id: frozenset(j.workers) for j in view.active}
    state = {j.id: j.state for j in view.active + view.waiting}
    waiting = [j.id for j in view.waiting if j.profile is not None]
    notes = []
    bound = BOUND if len(view.active) + len(view.waiting) > LARGE else None

    def take(change) -> None:
        nonlocal cur, waiting
        cur = Current(change.groups, live)
        placed = {x for g in cur.groups for x in g.jobs}
        waiting = [w for w in waiting if w not in placed] + \
            [p for p in change.pause if p not in waiting and p in state]
        if not change.noop:
            notes.append(change.reason)

    # 1. completions
    for f in (view.finished if util else ()):
        if cur.group_of(f.id) is None:
            continue
        if f.id in profiles:
            take(on_completion(cur, f.id, waiting, profiles, tol=MIN_GAIN, orders=ORDERS,
                               bound=bound))
        else:
            cur = _without(cur, f.id)
    # 2. arrivals: jobs whose profiling is done
    for j in (view.active if util else ()):
        if j.state == "profiling" and j.profile is not None and cur.group_of(j.id):
            home = cur.group_of(j.id)
            cur = _without(cur, j.id)
            change = on_arrival(cur, j.id, waiting, profiles, tol=MIN_GAIN)
            stay = _stay(cur, home, j.id)
            total = len(live)
            u_base = _U(cur.groups, profiles, total)
            placed = change.groups
            if stay is not None and change.groups != cur.groups \
                    and _U(stay, profiles, total) >= _U(change.groups, profiles, total) - 1e-9:
                # as good where it was profiled: no move (a move costs a pause and restart)
                placed, change = stay, None
            mates = next((g.jobs for g in placed if j.id in g.jobs), ())
            if len(mates) > 1 and _U(placed, profiles, total) < (1 + MIN_GAIN) * u_base:
                # Decision: sharing a group must raise U by MIN_GAIN. The paper
                # adds a job where U improves at all, and prefers fewer jobs
                # per group; a job that adds < 5% mostly slows its group
                # mates down (time-slicing), so it waits for a completion.
                notes.append(f"arrival of {j.id}: waits (U +{_U(placed, profiles, total) / max(u_base, 1e-12) - 1:.1%} < {MIN_GAIN:.0%} in a shared group)")
            elif change is None:
                cur = Current(placed, live)
                notes.append(f"arrival of {j.id}: stays")
            else:
                take(change)
            if cur.group_of(j.id) is None and j.id not in waiting:
                waiting.append(j.id)
    # 3. idle machines and work for them
    if util and cur.idle and (waiting or any(all(x in profiles for x in g.jobs)
                                             for g in cur.groups)):
        take(regroup(cur, waiting, profiles, tol=MIN_GAIN, orders=ORDERS, bound=bound))
    if not util:
        # 1-3 by normalized throughput: finished jobs leave their groups,
        # arrivals stay or are placed, waiting jobs are placed, lone jobs widen
        for f in view.finished:
            if cur.group_of(f.id) is not None:
                cur = _without(cur, f.id)
        arrivals = [j.id for j in view.active if j.state == "profiling"
                    and j.profile is not None and cur.group_of(j.id)]
        caps = {j.id: max(1, j.machines) for j in view.active + view.waiting}
        movable = [j.id for j in view.active if j.epochs >= WIDEN_AFTER
                   and (j.steady is None or j.steady >= SETTLE)]
        pending = sum(max(1, j.machines) for j in view.waiting if j.profile is None)
        # iterations left: its --max-epochs less what it ran, else as many as
        # it ran this attempt (Cruise's assumption)
        iters_left = {j.id: (j.epochs if j.epochs_left is None else j.epochs_left)
                      * max(1.0, profiles[j.id].iters) for j in view.active
                      if j.id in profiles}
        cur, waiting, tp_notes = TP.plan(cur, waiting, arrivals, profiles, caps,
                                         tol=MIN_GAIN, movable=movable, pending=pending,
                                         iters_left=iters_left,
                                         move_cost=view.move_cost or DEFAULT_MOVE_COST,
                                         arrival_gap=view.arrival_gap,
                                         measured={j.id: j.iter_s for j in view.active
                                                   if j.iter_s is not None})
        notes += tp_notes
        for a in arrivals:
            if cur.group_of(a) is None and a not in waiting:
                waiting.append(a)
    # 4. new jobs: profile them on idle machines (as many as they ask for,
    # so the profile is measured near the DoP they will run at), else in the
    # group that profiles fewest jobs and has fewest jobs per machine, among
    # the groups with room for it (_room), else it waits.
    # (Profiling every new job in the smallest group piled 15 jobs onto one
    # machine at 80 jobs / 100 machines in the simulator: their profiling
    # epochs took 50 hours and the scheduler waited on their pauses.)
    frees = _frees_in(view.active, profiles)
    # submission times, for _in_batch: only where a new job waits to be profiled
    times = sorted(k.submitted for k in view.waiting + view.active) \
        if any(j.profile is None for j in view.waiting) else []
    for i, j in enumerate(view.waiting):
        if j.profile is not None:
            continue
        idle = cur.idle
        batch = _in_batch(j.submitted, times)
        if idle and j.machines > 1 and view.now < j.submitted + BATCH_GAP and not batch:
            # it may be the first of a batch: the rest come within the gap
            # (later submissions are later in the queue: it is the only new one)
            dec.wait[j.id] = (f"waits up to {BATCH_GAP:g} s for jobs submitted with it "
                              f"(a batch is profiled on one machine each)")
            dec.again_at = j.submitted + BATCH_GAP
            break
        roomy = [] if idle else [g for g in cur.groups
                                 if _room(g, profiles, dec.profile) >= MIN_GAIN
                                 and not _frees_first(g, frees, profiles, j.machines,
                                                      view.move_cost or DEFAULT_MOVE_COST)]
        if idle:
            gid = _fresh(cur, f"g:{j.id}")
            n = 1 if batch else max(1, j.machines)
            cur = Current(cur.groups + (RunningGroup(gid, (j.id,), tuple(idle[:n])),), live)
        elif roomy:
            def load(g: RunningGroup) -> tuple:
                # the machine count nearest to what the job asks for (it is
                # measured there, and stays there if it interleaves well:
                # MLR asking for 2 and profiled on 4 stayed on 4, at half
                # its speed on 2), then the most room (in tenths)
                return (abs(len(g.machines) - max(1, j.machines)),
                        -round(_room(g, profiles, dec.profile), 1),
                        len(g.jobs) / len(g.machines), g.id)
            g = min(roomy, key=load)
            cur = Current(tuple(RunningGroup(x.id, x.jobs + (j.id,), x.machines) if x is g
                                else x for x in cur.groups), live)
        else:
            if cur.groups:
                soon = next((t for t, _ in frees), None)
                why = ("no machine is idle, and no room to profile it beside a group's jobs "
                       f"(they must all be profiled, fewer than {TP.MAX_GROUP}, and leave "
                       f"{MIN_GAIN:.0%} of a resource idle"
                       + (f"; or machines free in about {soon:.0f} s, before its profile "
                          f"there would be" if soon is not None else "") + ")")
                notes.append(f"{j.id} waits: {why}")
                dec.wait[j.id] = f"{PROFILE_SAMPLES} epochs of profile to run; {why}"
                # the new jobs queued after it (those before it are profiled
                # in this decision, whatever their submission times)
                for k in view.waiting[i + 1:]:
                    if k.profile is None:
                        dec.wait.setdefault(k.id, f"waits behind {j.id} (first come, "
                                                  f"first served) to be profiled")
            break
        g = cur.group_of(j.id)
        dec.profile[j.id] = list(g.machines)

    # the grouping -> actions
    shared = sum(1 for g in cur.groups if len(g.jobs) > 1)
    for g in cur.groups:
        profs = [profiles[x] for x in g.jobs if x in profiles and x in state]
        if profs:
            dec.predicted[g.id] = group_iter_time(profs, len(g.machines))
            if shared <= REPLAY_GROUPS:
                dec.predicted_jobs.update(predict(profs, len(g.machines)))
        for x in g.jobs:
            dec.assign[x] = g.id
            if x in dec.profile:
                continue
            ms = list(g.machines)
            if x in before:
                if before[x] != frozenset(ms):
                    dec.pause[x] = ms
                elif state[x] == "profiling" and x in profiles:
                    dec.promote.append(x)
            elif x in state:
                dec.start[x] = ms
    placed = {x for g in cur.groups for x in g.jobs}
    for x in before:
        if x not in placed:
            dec.pause[x] = None
    dec.util = utilization(cur.groups, profiles, len(live))
    dec.note = "; ".join(notes)
    return dec
