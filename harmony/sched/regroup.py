"""Dynamic regrouping (§4.3.2, "Dynamic Job Regrouping"), pure.

The master describes what runs now (``Current``: groups with stable ids,
their jobs and machine names, plus all live machines) and the profiles it
knows; the functions here return a ``Change``: the groups after the
decision and, per job, what the master has to do (start a waiting job,
migrate a running one, pause one, or leave it alone).

- ``on_completion``: replace the finished job by a similar waiting job, or
  by a set of waiting jobs with the same sums; else ``regroup`` starting
  with the finished job's group.
- ``on_arrival``: after a new job is profiled, if no other profiled or
  paused job waits, add it to the group where U is highest, or let it wait.
- ``regroup``: Algorithm 1 on incrementally more groups (smallest first)
  plus the waiting jobs, preferring fewer moved jobs unless moving more
  gains >= 5% in U, and no change for a gain < 5% (nor for a move that
  raises only network utilization). On a cluster with no groups it is the
  initial schedule.
- ``place``: planned groups (job sets with machine counts) onto machine
  names, keeping groups on the machines they already have.

U is ``model.score`` of the utilization over all live machines, so idle
machines count as 0%. Every group is evaluated with COMM at its own machine
count (``model.t_net_at``; Decision: COMM grows with DoP when jobs have
``remote`` > 0, see ``model``).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations

import numpy as np

from harmony.sched.grouping import PlannedGroup, schedule
from harmony.sched.model import (Profile, cluster_util, group_iter_time, job_iter_time, score,
                                 t_net_at)

TOLERANCE = 0.05     # "within 5%" for similar jobs, and the 5% gain in U
_SET_CANDIDATES = 24  # waiting jobs considered for a replacement set (pairs, triples)


@dataclass(frozen=True)
class Bound:
    """A bounded regrouping search for large clusters (an extension; the
    paper tries "all possible combinations"): candidates take at most
    ``groups`` groups besides the seed, and only the first ``waiting``
    waiting jobs (in priority order) are rescheduled with them. Each
    candidate is one run of Algorithm 1, whose cost does not shrink with
    the pool, so on hundreds of groups and a long queue the unbounded chain
    (``_chain_sizes``: 16 candidates at 316 groups) made every completion
    cost seconds (``harmony.policies.harmony.LARGE``)."""
    groups: int = 4
    waiting: int = 32


@dataclass(frozen=True)
class RunningGroup:
    """A group as it runs: a stable ``id``, its jobs, its machine names."""
    id: str
    jobs: tuple[str, ...]
    machines: tuple[str, ...]


@dataclass(frozen=True)
class Current:
    """What runs now. ``machines`` lists every live machine in a stable order;
    those in no group are idle."""
    groups: tuple[RunningGroup, ...] = ()
    machines: tuple[str, ...] = ()

    def group_of(self, job: str) -> RunningGroup | None:
        return next((g for g in self.groups if job in g.jobs), None)

    @property
    def idle(self) -> tuple[str, ...]:
        used = {m for g in self.groups for m in g.machines}
        return tuple(m for m in self.machines if m not in used)

    @property
    def running(self) -> tuple[str, ...]:
        return tuple(j for g in self.groups for j in g.jobs)


@dataclass(frozen=True)
class Change:
    """A decision as a diff against ``Current``.

    ``groups`` is the whole state afterwards. Each job that ran before (the
    finished one aside) is in exactly one of ``keep`` (same machines as
    before: untouched, even if its group gained or lost jobs), ``migrate``
    (job -> group id: it runs on a different machine set, in another group
    or in its group resized) or ``pause`` (stops at the end of an iteration,
    checkpoints, waits). ``start`` maps waiting jobs that start to group ids.
    ``predicted`` holds each group's predicted iteration time (Eq 4.1) at its
    machine count; ``util`` and ``util_before`` are (cpu, net) over all live
    machines; ``reason`` says which rule decided.
    """
    groups: tuple[RunningGroup, ...]
    start: dict[str, str] = field(default_factory=dict)
    migrate: dict[str, str] = field(default_factory=dict)
    pause: tuple[str, ...] = ()
    keep: tuple[str, ...] = ()
    predicted: dict[str, float] = field(default_factory=dict)
    util: tuple[float, float] = (0.0, 0.0)
    util_before: tuple[float, float] = (0.0, 0.0)
    reason: str = ""

    @property
    def moved(self) -> int:
        """Running jobs this change disturbs (migrated or paused)."""
        return len(self.migrate) + len(self.pause)

    @property
    def noop(self) -> bool:
        return not (self.start or self.migrate or self.pause)


# ---------------------------------------------------------------- helpers
def utilization(groups: Iterable[RunningGroup], profiles: Mapping[str, Profile],
                total: int) -> tuple[float, float]:
    """U over ``total`` machines; jobs without a profile (still profiling)
    are left out of their group's utilization."""
    return cluster_util((([profiles[j] for j in g.jobs if j in profiles], len(g.machines))
                         for g in groups if g.machines), total_machines=total)


def _diff(before: Current, after: Sequence[RunningGroup], profiles: Mapping[str, Profile],
          reason: str, util_before: tuple[float, float] | None = None) -> Change:
    total = len(before.machines)
    old = {j: frozenset(g.machines) for g in before.groups for j in g.jobs}
    start, migrate, keep = {}, {}, []
    for g in after:
        for j in g.jobs:
            if j not in old:
                start[j] = g.id
            elif old[j] == frozenset(g.machines):
                keep.append(j)
            else:
                migrate[j] = g.id
    placed = {j for g in after for j in g.jobs}
    pause = tuple(j for j in before.running if j not in placed)
    predicted = {g.id: group_iter_time([profiles[j] for j in g.jobs if j in profiles],
                                       len(g.machines)) for g in after}
    ub = utilization(before.groups, profiles, total) if util_before is None else util_before
    return Change(tuple(after), start, migrate, pause, tuple(keep), predicted,
                  utilization(after, profiles, total), ub, reason)


def _fresh_ids(taken: set[str]) -> Iterable[str]:
    i = 0
    while True:
        i += 1
        if f"g{i}" not in taken:
            taken.add(f"g{i}")
            yield f"g{i}"


def place(groups: Sequence[PlannedGroup], current: Current,
          machines: Sequence[str] | None = None) -> tuple[RunningGroup, ...]:
    """Map planned groups onto machine names, disturbing running jobs as
    little as possible.

    ``machines`` are the names the planned groups may use (default: all of
    ``current.machines``); they must number at least the planned machine
    count. Each planned group is matched to at most one existing group that
    lies within those machines, greedily by the most shared jobs, preferring
    pairs of the same size (their shared jobs then keep their exact machine
    set and run on untouched). A matched group inherits the old group's id
    and keeps as many of its machines as it needs; the others get fresh ids
    (g1, g2, ... not used in ``current``) and machines from the pool: idle
    ones first, then those given up, in the order of ``machines``.
    """
    names = list(current.machines if machines is None else machines)
    if sum(g.machines for g in groups) > len(names):
        raise ValueError(f"plan needs {sum(g.machines for g in groups)} machines, "
                         f"{len(names)} given")
    allowed = set(names)
    olds = [o for o in current.groups if o.machines and set(o.machines) <= allowed]
    pairs = []
    for pi, p in enumerate(groups):
        pj = set(p.jobs)
        for oi, o in enumerate(olds):
            shared = len(pj & set(o.jobs))
            if shared:
                same = p.machines == len(o.machines)
                pairs.append((-(shared if same else 0), -shared,
                              abs(p.machines - len(o.machines)), pi, oi))
    pairs.sort()
    match: dict[int, int] = {}
    used_old: set[int] = set()
    for *_, pi, oi in pairs:
        if pi not in match and oi not in used_old:
            match[pi] = oi
            used_old.add(oi)
    order = {m: i for i, m in enumerate(names)}
    held = {m for oi in used_old for m in olds[oi].machines}
    busy = {m for o in current.groups for m in o.machines}
    pool = sorted((m for m in names if m not in busy), key=order.get) + \
        sorted((m for m in names if m in busy and m not in held), key=order.get)
    out: dict[int, tuple[str, ...]] = {}
    for pi, oi in match.items():       # matched groups keep their machines...
        keep = olds[oi].machines[:groups[pi].machines]
        pool.extend(m for m in olds[oi].machines[groups[pi].machines:])
        out[pi] = keep
    for pi, oi in match.items():       # ... and grow from the pool
        need = groups[pi].machines - len(out[pi])
        out[pi], pool = out[pi] + tuple(pool[:need]), pool[need:]
    for pi, p in enumerate(groups):
        if pi not in match:
            out[pi], pool = tuple(pool[:p.machines]), pool[p.machines:]
    short = [pi for pi, p in enumerate(groups) if len(out[pi]) != p.machines]
    if short:       # a bug, never a group without machines (a division by zero later)
        raise ValueError(f"place: planned groups {short} got {[len(out[i]) for i in short]} "
                         f"machine(s), not {[groups[i].machines for i in short]}")
    ids = _fresh_ids({o.id for o in current.groups})
    return tuple(RunningGroup(olds[match[pi]].id if pi in match else next(ids),
                              p.jobs, out[pi]) for pi, p in enumerate(groups))


def _close(a: float, b: float, tol: float) -> bool:
    """a within tol of b, relative to b."""
    if a == b:
        return True
    if not (np.isfinite(a) and np.isfinite(b)):
        return False
    return abs(a - b) <= tol * abs(b)


def _ratio(cpu: float, net: float) -> float:
    return cpu / net if net > 0 else float("inf")


def _replacement(finished: Profile, m: int, waiting: Sequence[Profile],
                 tol: float) -> tuple[str, ...] | None:
    """The first waiting job similar to ``finished`` on m machines (iteration
    time and comp/comm ratio within tol), else the first pair, else the first
    triple of waiting jobs whose summed iteration time and ratio of summed
    COMP to summed COMM are within tol (sets are searched among the first
    _SET_CANDIDATES waiting jobs short enough to be part of one). COMP and
    COMM are all at the group's m (``model.t_net_at``), whatever DoP the
    jobs were profiled at."""
    t_f = job_iter_time(finished, m)
    r_f = _ratio(finished.t_cpu * finished.dop / m, t_net_at(finished, m))
    for w in waiting:
        if _close(job_iter_time(w, m), t_f, tol) and \
                _close(_ratio(w.t_cpu * w.dop / m, t_net_at(w, m)), r_f, tol):
            return (w.id,)
    small = [w for w in waiting if job_iter_time(w, m) < t_f * (1 + tol)][:_SET_CANDIDATES]
    if len(small) < 2:
        return None
    cpu = np.array([w.t_cpu * w.dop / m for w in small])
    net = np.array([t_net_at(w, m) for w in small])
    for size in (2, 3):
        combos = np.array(list(combinations(range(len(small)), size)), dtype=np.int64)
        if not len(combos):
            continue
        c, n = cpu[combos].sum(1), net[combos].sum(1)
        ok = np.abs(c + n - t_f) <= tol * t_f
        if np.isfinite(r_f):
            with np.errstate(divide="ignore"):
                r = np.where(n > 0, c / np.where(n > 0, n, 1), np.inf)
            ok &= np.abs(r - r_f) <= tol * r_f
        else:
            ok &= n == 0
        hit = np.flatnonzero(ok)
        if len(hit):
            return tuple(small[i].id for i in combos[hit[0]])
    return None


def _chain_sizes(n: int) -> list[int]:
    """How many extra groups each regroup candidate takes: 0, 1, 2, 3, 4,
    then doubling (6, 8, 12, 16, ...), and all n."""
    sizes, k = [], 0
    while k < n:
        sizes.append(k)
        k = k + 1 if k < 4 else k + k // 2
    sizes.append(n)
    return sizes


def pick(base: float, candidates: Sequence[tuple[int, float]], tol: float = TOLERANCE
         ) -> int | None:
    """The 5% rules on (moved jobs, U) candidates against ``base`` (U with
    no change, nothing moved): going through candidates by fewer moved jobs
    first, one replaces the current choice if it moves no more jobs and has
    a higher U, or moves more jobs and gains at least ``tol`` over the
    current choice's U. Returns the index of the choice, or None to change
    nothing."""
    choice, (cm, cu) = None, (0, base)
    for i in sorted(range(len(candidates)), key=lambda i: (candidates[i][0], -candidates[i][1])):
        moved, u = candidates[i]
        if (moved <= cm and u > cu) or (moved > cm and u >= cu * (1 + tol)):
            choice, cm, cu = i, moved, u
    return choice


# ------------------------------------------------------------------ rules
ORDERS = ("waiting first", "running first")


def regroup_candidates(current: Current, waiting: Sequence[str],
                       profiles: Mapping[str, Profile], seed: str | None = None,
                       reason: str = "regroup", orders: Sequence[str] = ORDERS,
                       bound: Bound | None = None) -> list[Change]:
    """The candidate decisions ``regroup`` chooses from, fewest groups first.

    Candidate k takes the group ``seed`` (a group id, e.g. the finished
    job's group) plus the k smallest other groups (fewest jobs first), with
    their machines and all idle machines, and reschedules their jobs
    together with the ``waiting`` ones (profiled, then paused, in priority
    order). Algorithm 1 L2 puts waiting jobs before running ones, so its
    prefixes pause running jobs in favour of waiting ones even at equal U;
    Decision: each k is tried in that order and with the running jobs
    first, and ``pick`` (fewer moved jobs unless 5% more U) decides. k runs over
    0, 1, 2, 3, 4, then in steps of half again up to all groups (the paper
    tries "all possible combinations", incrementally; the steps bound the
    cost on large clusters). Groups holding a job without a profile (still
    profiling) never take part. With ``bound`` (a large cluster, see
    ``Bound``) k stops at ``bound.groups`` and only the first
    ``bound.waiting`` waiting jobs take part.
    """
    base_util = utilization(current.groups, profiles, len(current.machines))
    movable = [g for g in current.groups if all(j in profiles for j in g.jobs)]
    first = [g for g in movable if g.id == seed]
    others = sorted((g for g in movable if g.id != seed), key=lambda g: len(g.jobs))
    sizes = _chain_sizes(len(others))
    if bound is not None:
        waiting = waiting[:bound.waiting]
        sizes = [k for k in sizes if k <= bound.groups]
    wait = [profiles[w] for w in waiting]
    idle = current.idle
    changes: list[Change] = []
    seen: set[frozenset] = set()
    for k in sizes:
        part = first + others[:k]
        pool = [m for g in part for m in g.machines] + list(idle)
        run = [profiles[j] for g in part for j in g.jobs]
        if not pool or not (wait or run):
            continue
        keep = [g for g in current.groups if g not in part]
        for label in orders:
            jobs = wait + run if label == "waiting first" else run + wait
            placed = place(schedule(jobs, len(pool)).groups, current, pool)
            ch = _diff(current, keep + list(placed), profiles,
                       f"{reason}: {len(part)} group(s), {label}", base_util)
            key = frozenset((frozenset(g.jobs), frozenset(g.machines)) for g in placed)
            if key not in seen:
                seen.add(key)
                changes.append(ch)
            if not (wait and run) or ch.moved == 0:
                break       # one order only, or the first already moves nobody
    return changes


def regroup(current: Current, waiting: Sequence[str], profiles: Mapping[str, Profile],
            seed: str | None = None, tol: float = TOLERANCE,
            reason: str = "regroup", orders: Sequence[str] = ORDERS,
            bound: Bound | None = None) -> Change:
    """Algorithm 1 on incrementally more groups (``regroup_candidates``),
    choosing with the 5% rules (``pick``): fewer moved jobs unless moving
    more gains >= ``tol`` in U, and no change at all for a gain < ``tol``
    (a candidate that moves no running job, e.g. one that only starts
    waiting jobs, needs only a higher U). On a cluster without groups this
    is the initial schedule: Algorithm 1 over the waiting jobs and all
    machines. ``waiting`` must not hold running jobs.

    Decision: a candidate that moves running jobs must also raise CPU
    utilization. COMM time does not shrink with DoP (Eq 4.2; with remote >
    0 it even grows, ``model.t_net_at``), so spreading a network-bound
    group over idle machines raises U (their network counts as busy) while
    its jobs run no faster; the paper ranks CPU first because it "directly
    contribute[s] to the job progress", and such a move is not worth a
    pause and migration.
    """
    base_util = utilization(current.groups, profiles, len(current.machines))
    changes = [c for c in regroup_candidates(current, waiting, profiles, seed, reason, orders,
                                             bound)
               if c.moved == 0 or c.util[0] > base_util[0] * (1 + 1e-9)]
    i = pick(score(*base_util), [(c.moved, score(*c.util)) for c in changes], tol)
    if i is None:
        return _diff(current, current.groups, profiles,
                     f"{reason}: no candidate gains enough", base_util)
    return changes[i]


def on_completion(current: Current, finished: str, waiting: Sequence[str],
                  profiles: Mapping[str, Profile], tol: float = TOLERANCE,
                  orders: Sequence[str] = ORDERS, bound: Bound | None = None) -> Change:
    """A running job finished: repair its group (see the module docstring).

    The returned Change is against ``current`` without ``finished`` (its
    group shrinks; a group left empty frees its machines). ``waiting`` are
    the profiled and paused jobs in priority order.
    """
    g = current.group_of(finished)
    if g is None:
        return _diff(current, current.groups, profiles, f"{finished} was not running")
    rest = tuple(j for j in g.jobs if j != finished)
    groups = tuple((RunningGroup(g.id, rest, g.machines) if x is g else x)
                   for x in current.groups if x is not g or rest)
    after = Current(groups, current.machines)
    if finished in profiles:
        hit = _replacement(profiles[finished], len(g.machines),
                           [profiles[w] for w in waiting], tol)
        if hit:
            new = tuple((RunningGroup(g.id, rest + hit, g.machines) if x is g else x)
                        for x in current.groups)
            return _diff(after, new, profiles, "replace" if len(hit) == 1 else "replace-set")
    return regroup(after, waiting, profiles, seed=g.id if rest else None, tol=tol,
                   orders=orders, bound=bound,
                   reason=f"completion of {finished}")


def on_arrival(current: Current, new: str, waiting: Sequence[str],
               profiles: Mapping[str, Profile], tol: float = TOLERANCE,
               regroup_if_others_wait: bool = False) -> Change:
    """Job ``new`` finished profiling (it is not in ``current``).

    Paper: "the scheduler handles the job only when there is no other
    profiled/paused jobs, because existence of those jobs means that Harmony
    already satisfies with the currently running jobs. The scheduler handles
    the job by adding it to a proper group that maximizes U or let it wait
    if it does not improve U." So with others in ``waiting`` the new job
    waits (a no-op Change), unless ``regroup_if_others_wait``, which runs
    ``regroup`` with the new job last in line. Otherwise it joins the group
    (or, when there are idle machines, a new group on all of them) where U
    is highest, if that beats U now; no running job moves, so no 5% margin.
    """
    if current.group_of(new) is not None:
        raise ValueError(f"{new} is running; on_arrival takes a job that waits")
    total = len(current.machines)
    base_util = utilization(current.groups, profiles, total)
    if waiting:
        if regroup_if_others_wait:
            return regroup(current, list(waiting) + [new], profiles, tol=tol,
                           reason=f"arrival of {new}")
        return _diff(current, current.groups, profiles,
                     f"{new} waits: other profiled/paused jobs wait", base_util)
    options: list[tuple[RunningGroup, ...]] = []
    for g in current.groups:
        options.append(tuple(RunningGroup(x.id, x.jobs + (new,), x.machines) if x is g else x
                             for x in current.groups))
    if current.idle:
        gid = next(_fresh_ids({g.id for g in current.groups}))
        options.append(current.groups + (RunningGroup(gid, (new,), current.idle),))
    best, best_s = None, score(*base_util)
    for opt in options:
        s = score(*utilization(opt, profiles, total))
        if s > best_s:
            best, best_s = opt, s
    if best is None:
        return _diff(current, current.groups, profiles,
                     f"{new} waits: no group gains U with it", base_util)
    return _diff(current, best, profiles, f"arrival of {new}: joins", base_util)
