"""Per-job iteration times of a group, predicted by replaying its queues (pure).

Eq 4.1 gives a group one iteration time, max(Σ Tcpu, Σ Tnet, max T_j),
which holds when the group's jobs iterate in lockstep, one iteration each
per cycle. The runtime does not enforce that: each machine's queues grant in
FIFO order (:mod:`harmony.subtasks.queues`), a job whose subtasks are short
laps a job whose COMP is long, and while one job is at its epoch's end
(evaluation, the epoch barrier, its report) its partners run without it.
With few iterations per epoch that is a large share of the time: on the
scheduler's end-to-end bench (2 iterations per epoch) a job paired with
another measured anywhere between its time alone and the pair's sum.

This module predicts what the queues do instead: it replays one machine of
the group (every machine of a group runs the same subtasks in the same
order) through the runtime's own queue state machine, :class:`ResourceQueues`,
on simulated time, and measures each job's training-phase seconds per
iteration the way the executor does (from its epoch's first PULL to its
last PUSH, over its iterations). Each job's program, per iteration:
PULL (``t_net``/2), COMP (``t_cpu``), PUSH (``t_net``/2), each asked for
after ``overhead``/3 of synchronizer round trip; after ``iters`` iterations
its epoch end: ``end_net`` of network, ``end_cpu`` on the CPU queue (the
evaluation's subtasks) and ``end_other`` seconds holding no queue (the
barrier and report). The CPU serves one COMP at a time (with the queue's
preemption); of two running transfers the primary moves at full rate and
the secondary waits for it (Eq 4.1's Σ Tnet: the secondary only gets what
the primary leaves idle, nothing when the primary saturates the link).
A transfer's own CPU work (``net_cpu`` seconds per iteration: framing,
encryption, the I/O threads) shares the core with the COMP running beside
it: while transfers run, the COMP moves at 1 - their CPU share (at most
half the core, the kernel's fair share between two busy threads).

Cost: a few hundred events per call (about 1 ms for a pair), so callers use
it where groups are few (the master's predictions, the bench); the
planners' search keeps Eq 4.1.
"""
from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from harmony.sched.model import Profile, comm_cpu_at, job_iter_time, t_cpu_at, t_net_at
from harmony.subtasks.queues import Demote, Grant, Promote, ResourceQueues, Resume, Stop, Sub


@dataclass(frozen=True)
class Shape:
    """One job's subtask seconds on the group's machines (see the module
    docstring). ``iters`` = 0: no epoch ends (every iteration is measured)."""
    id: str
    t_cpu: float
    t_net: float
    overhead: float = 0.0
    iters: int = 0
    end_cpu: float = 0.0
    end_net: float = 0.0
    end_other: float = 0.0
    net_cpu: float = 0.0    # CPU seconds of its COMM per iteration (beside the COMPs)

    def __post_init__(self) -> None:
        if min(self.t_cpu, self.t_net, self.overhead, self.end_cpu, self.end_net,
               self.end_other, self.net_cpu) < 0 or self.iters < 0:
            raise ValueError(f"bad shape {self!r}: times and iters must be >= 0")


class _Job:
    __slots__ = ("shape", "program", "pc", "seq", "epoch_start", "samples", "epochs",
                 "cycles")

    def __init__(self, shape: Shape) -> None:
        s = shape
        gap = s.overhead / 3      # the synchronizer's round trip before each subtask
        n = max(1, s.iters)
        prog = []
        for i in range(n):
            prog += [("net", s.t_net / 2, gap, "first" if i == 0 else ""),
                     ("cpu", s.t_cpu, gap, ""),
                     ("net", s.t_net / 2, gap, "last" if i == n - 1 else "")]
        if s.iters:
            prog += [(k, w, 0.0, "") for k, w in (("net", s.end_net), ("cpu", s.end_cpu))
                     if w > 0]
            if s.end_other > 0:
                prog.append(("wait", 0.0, s.end_other, ""))
        self.shape, self.program, self.pc, self.seq = shape, prog, 0, 0
        self.epoch_start: float | None = None
        self.samples: list[float] = []
        self.cycles: list[float] = []     # whole epochs (start to next start) / iters
        self.epochs = 0


def iteration_times(shapes: Sequence[Shape], epochs: int = 4, warmup: int = 1,
                    max_events: int = 5_000) -> dict[str, float]:
    """Each job's predicted seconds per training iteration in the group (the
    first of :func:`replay`'s pair)."""
    return {j: t for j, (t, _) in replay(shapes, epochs, warmup, max_events).items()}


def replay(shapes: Sequence[Shape], epochs: int = 4, warmup: int = 1,
           max_events: int = 5_000) -> dict[str, tuple[float, float]]:
    """Each job's predicted (training, epoch) seconds per iteration in the
    group. Training: the mean over ``epochs`` epochs after ``warmup`` of
    (train phase) / iters, as the executor measures it. Epoch: the mean of
    (one epoch's start to the next's) / iters, its end included: what the
    job's progress (and its JCT) follows. Where waits fall, in the training
    phase or at the epoch's end, depends on how the jobs' epochs line up; a
    job's epoch does not. Replayed until every job has that many or ``max_events`` passed (a job
    whose subtasks are far shorter than its partners' laps them thousands
    of times: the bound keeps a replay within ~20 ms, where 50,000 events
    took 0.2 s of the master's loop). A job with no measured epoch by then
    gets Eq 4.1's bound for the group, max(Σ COMP, Σ COMM, its own)."""
    jobs = {s.id: _Job(s) for s in shapes}
    if len(jobs) != len(shapes):
        raise ValueError("job ids in a group must be unique")
    q = ResourceQueues()
    run: dict[tuple[str, int], list] = {}     # running sub -> [remaining, rate, role]
    timers: list[tuple[float, int, str]] = []  # (time, tie, job): enqueue its next subtask
    now, tie, events = 0.0, 0, 0
    want = warmup + epochs
    short = len(jobs) if want > 0 else 0     # jobs with fewer than ``want`` epochs

    # a COMM's CPU share of the core while it moves (0: none measured)
    share = {s.id: min(1.0, s.net_cpu / s.t_net) if s.t_net > 0 else 0.0 for s in shapes}
    slowed = any(share.values())

    def act(actions: list) -> None:
        for a in actions:
            key = (a.sub.job, a.sub.seq)
            kind = type(a)          # (the queue's actions are final classes)
            if kind is Grant:
                j = jobs[a.sub.job]
                step = j.program[j.pc]
                run[key] = [step[1], 0.0 if a.role == "secondary" else 1.0, step[0] == "cpu"]
            elif kind is Promote or kind is Resume:
                run[key][1] = 1.0
            elif kind is Demote or kind is Stop:
                run[key][1] = 0.0

    def start(jid: str) -> None:
        j = jobs[jid]
        kind = j.program[j.pc][0]
        if kind == "wait":
            return finish(jid)
        j.seq += 1
        s = j.shape
        prio = s.t_cpu if kind == "cpu" else s.t_net / 2
        act(q.enqueue(Sub(jid, j.seq, kind, prio)))

    def finish(jid: str) -> None:
        nonlocal short
        j = jobs[jid]
        kind, _, _, mark = j.program[j.pc]
        if kind != "wait":
            run.pop((jid, j.seq))
            act(q.done(jid, j.seq))
        if mark == "last":
            if j.epochs >= warmup and j.epoch_start is not None:
                j.samples.append((now - j.epoch_start) / (j.shape.iters or 1))
            j.epochs += 1
            if j.epochs == want:
                short -= 1
        j.pc = (j.pc + 1) % len(j.program)
        due(jid)

    def due(jid: str) -> None:
        """The job's next subtask is asked for after its round trip."""
        nonlocal tie
        j = jobs[jid]
        _, _, gap, mark = j.program[j.pc]
        if mark == "first":
            if j.epoch_start is not None and j.epochs - 1 >= warmup:
                j.cycles.append((now - j.epoch_start) / (j.shape.iters or 1))
            j.epoch_start = now
        tie += 1
        heapq.heappush(timers, (now + gap, tie, jid))

    for jid in jobs:
        due(jid)
    while events < max_events and short:
        events += 1
        # the COMP's pace beside the transfers moving now (1: none slow it)
        pace = 1.0 - min(0.5, sum(share[k[0]] for k, r in run.items() if r[1] > 0 and not r[2])) \
            if slowed else 1.0
        # the next event: a running subtask ends, or a job's next subtask is due
        t_next, who = float("inf"), None
        for key, (left, rate, cpu) in run.items():
            if cpu:
                rate *= pace
            if rate > 0 and now + left / rate < t_next:
                t_next, who = now + left / rate, key
        if timers and timers[0][0] <= t_next:
            t, _, jid = heapq.heappop(timers)
            _advance(run, t - now, pace)
            now = t
            start(jid)
            continue
        if who is None:
            break                                  # nothing can move: a bad shape
        _advance(run, t_next - now, pace)
        now = t_next
        finish(who[0])
    out = {}
    cpu = sum(s.t_cpu + s.net_cpu for s in shapes)
    net = sum(s.t_net for s in shapes)
    for jid, j in jobs.items():
        s = j.shape
        train = sum(j.samples) / len(j.samples) if j.samples else \
            max(cpu, net, s.t_cpu + s.t_net + s.overhead)
        epoch = sum(j.cycles) / len(j.cycles) if j.cycles else \
            train + _end(s) / (s.iters or 1)
        out[jid] = (train, epoch)
    return out


def _end(s: Shape) -> float:
    """A job's epoch end alone (no queue waits)."""
    return (s.end_net + s.end_cpu + s.end_other) if s.iters else 0.0


def _advance(run: dict, dt: float, pace: float = 1.0) -> None:
    if dt <= 0:
        return
    for rec in run.values():
        if rec[1] > 0:
            rec[0] = max(0.0, rec[0] - dt * (rec[1] * pace if rec[2] else rec[1]))


# -- predictions from profiles --------------------------------------------------------
#: epochs of more iterations are replayed as epochs of this many, with their
#: end scaled down alike (the same share of the job's time at its epoch
#: end): a replay's cost grows with the iterations it plays, and past a few
#: iterations per epoch the order within an epoch repeats
ITERS_CAP = 8


def shape_at(p: Profile, m: int) -> Shape:
    """A profiled job's shape on ``m`` machines (COMP and the evaluation
    scale as 1/m, Eq 4.2; COMM as ``t_net_at``), epochs capped at
    ``ITERS_CAP`` iterations: the one way a :class:`Profile` becomes a
    :class:`Shape` (the master's and the simulator's predictions alike)."""
    iters = int(round(p.iters))
    f = ITERS_CAP / iters if iters > ITERS_CAP else 1.0
    return Shape(p.id, t_cpu_at(p, m), t_net_at(p, m), p.overhead, min(iters, ITERS_CAP),
                 f * p.end_cpu * p.dop / m, 0.0, f * p.end_other, comm_cpu_at(p, m))


def _key(s: Shape) -> tuple:
    r = lambda x: float(f"{x:.3g}")       # noqa: E731  (3 significant digits)
    return (s.id, r(s.t_cpu), r(s.t_net), r(s.overhead), s.iters, r(s.end_cpu),
            r(s.end_net), r(s.end_other), r(s.net_cpu))


@lru_cache(maxsize=4096)
def _cached(keys: tuple) -> tuple:
    shapes = [Shape(*k) for k in keys]
    res = replay(shapes)
    return tuple(res[s.id] for s in shapes)


def predict(profiles: Sequence[Profile], m: int) -> dict[str, float]:
    """Each job's predicted seconds per iteration in a group on ``m``
    machines: its own iteration time when alone (``job_iter_time``), else
    the queue replay (cached on shapes rounded to 3 significant digits)."""
    return {j: t for j, (t, _) in predict_both(profiles, m).items()}


def predict_both(profiles: Sequence[Profile], m: int) -> dict[str, tuple[float, float]]:
    """Each job's predicted (training, epoch) seconds per iteration in a
    group on ``m`` machines (see :func:`replay`); alone, the epoch adds the
    job's own epoch end spread over its iterations."""
    if len(profiles) == 1:
        p = profiles[0]
        t = job_iter_time(p, m)
        s = shape_at(p, m)
        return {p.id: (t, t + _end(s) / (s.iters or 1))}
    keys = tuple(_key(shape_at(p, m)) for p in profiles)
    return dict(zip((p.id for p in profiles), _cached(keys)))
