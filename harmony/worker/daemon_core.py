"""The worker daemon's protocol core: one machine's subtask queues and the
state around them, as a pure state machine (no I/O, no clock, no threads, no
logging). The daemon (:mod:`harmony.worker.daemon`) is its shell: sockets,
processes, signals, files and the clock. A trace-driven simulator drives the
same class, one instance per simulated machine, in simulated time.

Time
----
Every call that can change state takes ``now``: seconds on a clock of the
caller's choice (the daemon: ``time.monotonic()``; a simulator: simulated
seconds). Only differences of ``now`` are used (busy time, the time a
preempted COMP stood, the age of a memory sample, the freshness of an α
state), so its origin does not matter; it must never decrease from one call
to the next. The core never reads a clock itself.

Subtasks
--------
``Sub(job, seq, kind, prio=0.0)`` (from :mod:`harmony.subtasks.queues`): job
id (str), the job's subtask sequence number (int, increasing per job),
``kind`` "cpu" (a COMP) or "net" (a PULL or PUSH), ``prio`` the seconds the
master expects it to take (0: unknown). A job has at most one subtask on a
machine at a time: its next is enqueued when its previous is done (one that
arrives before that is deferred, see :meth:`DaemonCore.enqueue`).

Queue rules (those of :class:`harmony.subtasks.queues.ResourceQueues`): one
COMP runs at a time, FIFO; at most two network subtasks run, a primary and a
secondary, granted FIFO, of two running ones the shorter expected (``prio``)
leads; with ``preempt``, a COMP expected to take at most 1/4 of the running
one stops it while it runs (one level deep, at most 2 short ones in a row).

Actions
-------
Every state-changing call returns a list of actions (frozen dataclasses, in
the order to carry them out; often empty). All but ``OomKill`` have ``sub``
(a ``Sub``); dispatch on ``type(action)``:

* ``Grant(sub, role, held)``: ``sub`` holds a slot from ``now``, ``role``
  "cpu", "primary" or "secondary". ``held`` False: tell the executor now (it
  starts the subtask). ``held`` True: its executor is not ready yet; the
  grant is delivered by a later ``Deliver`` (from :meth:`~DaemonCore.ready`).
* ``Deliver(sub, role)``: a held grant reaches its executor now.
* ``Promote(sub)``: the running secondary ``sub`` is the primary now.
* ``Demote(sub)``: the running primary ``sub`` is the secondary now.
* ``Stop(sub)``: stop the running COMP ``sub`` (the daemon: SIGSTOP); it holds
  no slot while it stands.
* ``Resume(sub, stood, tell)``: continue the stopped COMP ``sub`` (SIGCONT),
  ``stood`` the seconds it stood stopped. ``tell`` True: it goes on as the
  running COMP and its executor is ready: tell the executor ``stood`` (its
  COMP time excludes it). ``tell`` False and the COMP is not running any
  more: it had ended just before the stop reached it (its ``done`` came
  while it stood); it is only continued.
* ``Done(sub)``: ``sub`` finished and left its slot (first in what
  :meth:`~DaemonCore.done` returns).
* ``OomKill(job, used, total, budget, loaded)``: only from
  :meth:`~DaemonCore.memory` (see there).

The roles of running network subtasks after a call: :meth:`primary`.

API
---
``DaemonCore(preempt=True, net_slots=2, memory_budget=0, oom_kill=False)``
    ``preempt``: CPU preemption on; ``net_slots``: network subtasks running
    at once (primary + secondaries); ``memory_budget`` (bytes) and
    ``oom_kill``: the emulated OOM killer (:meth:`memory`).

Subtask protocol (what a simulator drives):

``enqueue(sub, now) -> list``
    The master enqueued ``sub``. If the job's previous subtask is still
    queued or running here (its ``done`` has not arrived: the master's
    enqueue overtook the executor's release), ``sub`` is deferred and
    enqueued by that ``done``: returns []. Otherwise it joins its queue:
    returns the Grant/Stop/Demote actions that follow (held grants if the
    job's executor is not ready). Raises ``QueueError`` (nothing changed)
    for an unknown kind, or if the job already has this or a later subtask
    here.
``ready(job, now) -> list``
    The job's executor is ready for grants (the daemon: its ``hello``).
    Returns a ``Deliver`` for each grant held for it. Idempotent.
``done(job, seq, now) -> list``
    Subtask ``seq`` of ``job`` finished (the executor released its slot).
    Returns ``[Done(sub), ...]``: then the actions that follow (grants,
    promotions, resumes), then those of the job's deferred next subtask,
    if any. Raises ``QueueError`` (nothing changed) if that subtask is
    neither running (granted) nor stopped here.
``left(job, now) -> list``
    The job left this machine's queues (cancelled, failed, killed,
    relaunched, its executor exited): its queued, running, stopped, held
    and deferred subtasks are forgotten (no Done), it is not ready any
    more, and what it held goes to the others: returns their actions.
    Unknown jobs are fine (returns []).

Queries (no state change): ``current(job) -> Sub | None`` (its subtask
queued or holding a slot here; not a deferred one), ``primary() -> Sub |
None``, ``is_ready(job) -> bool``, ``busy(now) -> (cpu_s, net_s)``: seconds
the CPU slot and the network slots (summed over both) were held since the
core was made, running subtasks counted up to ``now`` (a stopped COMP does
not count while it stands), ``queue_stats() -> {"cpu": QueueStats, "net":
QueueStats}``: per resource, since the core was made, ``granted``
subtasks that reached their executor and their ``wait`` (seconds from
joining the queue to the executor being told: the grant, or the
``Deliver`` of a held grant; a deferred subtask joins the queue at the
``done`` that releases it), ``done`` subtasks and their ``run`` (seconds
from the executor being told to ``done``, less the time a COMP stood
stopped). Sums and counts only: a subtask counts when it is told (wait)
and when it is done (run); one that leaves first adds nothing more.

Executor memory (the real daemon only; a simulator need not call these):

``started(job, now)``
    An executor process of ``job`` started here: its memory counts for the
    OOM killer from now on (before its input is loaded and its model is
    set up), and it is "loaded" after ``ready(job)``. A relaunch: call
    ``left(job)`` first.
``exited(job, now) -> list``
    The job's executor process is gone: ``left(job)`` and forget its memory
    and α state. Returns ``left``'s actions.
``memory_jobs(loaded_only=False) -> list[str]``
    The jobs whose executor memory the shell is to measure for
    :meth:`memory`: started, not exited, not OOM-killed (``loaded_only``:
    and ready since they started).
``memory(now, usage) -> list``
    A sample: ``usage`` maps jobs (of ``memory_jobs()``) to their
    executor's anonymous bytes. Kept for :meth:`memory_view` (loaded
    executors only). With ``oom_kill``, if the sum over all of them (loaded
    or not) exceeds ``memory_budget``, the largest is chosen:
    ``[OomKill(job, used, total, budget, loaded)]`` (the shell kills it;
    it is left out of ``memory_jobs`` from then on). Otherwise [].
``memory_view(job, now) -> MemoryView``
    What ``job``'s α controller sees: ``budget``; ``others_bytes`` and
    ``others_count`` of the *loaded* executors other than ``job``'s in the
    latest sample; ``age`` of that sample (None: none yet);
    ``others_starved``: another job's α state said "starved" within the
    last ``STARVED_FRESH_S`` seconds, and ``others_need`` the bytes those
    states asked for (summed).
``alpha_state(job, alpha, starved, now, need=0)``
    ``job``'s α controller published its state (disk ratio, starved, the
    bytes it needs).

Cost: every call is O(jobs with a subtask on this machine) at worst, and
O(1) in the common case; it allocates only its result list and records.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from harmony.subtasks.queues import (Demote, Grant, Promote, QueueError, ResourceQueues, Resume,
                                   Stop, Sub)

__all__ = ["DaemonCore", "Sub", "QueueError", "Grant", "Deliver", "Promote", "Demote", "Stop",
           "Resume", "Done", "OomKill", "MemoryView", "QueueStats", "STARVED_FRESH_S"]

#: how long a job's "starved" α state counts for the other jobs here (seconds)
STARVED_FRESH_S = 10.0


@dataclass(frozen=True, slots=True)
class Deliver:
    """A held grant reaches ``sub``'s executor now (it became ready)."""
    sub: Sub
    role: str


@dataclass(frozen=True, slots=True)
class Done:
    """``sub`` finished and left its slot."""
    sub: Sub


@dataclass(frozen=True, slots=True)
class OomKill:
    """The emulated OOM killer chose ``job``'s executor: it used ``used``
    bytes, all executors here ``total``, over ``budget``; ``loaded``: it had
    loaded its input (False: still setting up)."""
    job: str
    used: int
    total: int
    budget: int
    loaded: bool


@dataclass(frozen=True, slots=True)
class MemoryView:
    budget: int
    others_bytes: int
    others_count: int
    age: float | None
    others_starved: bool
    others_need: float = 0.0


@dataclass(frozen=True, slots=True)
class QueueStats:
    """One resource's subtask counters (see :meth:`DaemonCore.queue_stats`)."""
    granted: int
    wait: float
    done: int
    run: float


class _Acct:
    """A subtask's times for the queue counters: joined the queue at
    ``enq``; ``told`` its executor; ran ``acc`` seconds up to ``since``
    (None: not running now)."""
    __slots__ = ("kind", "enq", "told", "acc", "since")

    def __init__(self, kind: str, enq: float) -> None:
        self.kind = kind
        self.enq = enq
        self.told = False
        self.acc = 0.0
        self.since: float | None = None


class _Proc:
    __slots__ = ("loaded", "killed")

    def __init__(self) -> None:
        self.loaded = False
        self.killed = False


class DaemonCore:
    def __init__(self, preempt: bool = True, net_slots: int = 2, memory_budget: int = 0,
                 oom_kill: bool = False) -> None:
        self.queues = ResourceQueues(net_slots=net_slots, preempt=preempt)
        self._ready: set[str] = set()
        self._held: dict[str, list[Grant]] = {}          # grants waiting for ready()
        self._deferred: dict[str, Sub] = {}              # enqueues that overtook a done
        self._running: dict[tuple[str, int], tuple[float, Sub]] = {}   # slot held since
        self._stopped: dict[tuple[str, int], tuple[float, Sub]] = {}   # stopped since
        self._busy_cpu = 0.0
        self._busy_net = 0.0
        # queue counters: per resource [granted, wait s, done, run s]
        self._acct: dict[tuple[str, int], _Acct] = {}
        self._qs = {"cpu": [0, 0.0, 0, 0.0], "net": [0, 0.0, 0, 0.0]}
        # executor memory
        self.memory_budget = int(memory_budget)
        self.oom_kill = oom_kill
        self._procs: dict[str, _Proc] = {}
        self._sample: dict[str, int] = {}                # loaded executors' bytes
        self._sample_t: float | None = None
        # job -> (t, alpha, starved, bytes needed)
        self._alpha: dict[str, tuple[float, float, bool, float]] = {}

    # -- subtask protocol ------------------------------------------------------------
    def enqueue(self, sub: Sub, now: float) -> list:
        if sub.kind != "cpu" and sub.kind != "net":
            raise QueueError(f"unknown subtask kind {sub.kind!r}")
        cur = self.queues.current(sub.job)
        if cur is not None and cur.seq < sub.seq:
            self._deferred[sub.job] = sub
            return []
        return self._join(sub, now)

    def _join(self, sub: Sub, now: float) -> list:
        acts = self.queues.enqueue(sub)          # raises QueueError: nothing changed
        self._acct[(sub.job, sub.seq)] = _Acct(sub.kind, now)
        return self._fill(acts, now)

    def _tell(self, key: tuple[str, int], now: float) -> None:
        """The executor of subtask ``key`` is told its grant now: its wait ends."""
        a = self._acct.get(key)
        if a is None or a.told:
            return
        a.told = True
        q = self._qs[a.kind]
        q[0] += 1
        q[1] += now - a.enq
        if key not in self._stopped:
            a.since = now

    def ready(self, job: str, now: float) -> list:
        self._ready.add(job)
        p = self._procs.get(job)
        if p is not None:
            p.loaded = True
        held = self._held.pop(job, None)
        if not held:
            return []
        for g in held:
            self._tell((g.sub.job, g.sub.seq), now)
        return [Deliver(g.sub, g.role) for g in held]

    def done(self, job: str, seq: int, now: float) -> list:
        acts = self.queues.done(job, seq)        # raises QueueError: nothing changed
        key = (job, seq)
        r = self._running.pop(key, None)
        if r is not None:
            sub = r[1]
            if sub.kind == "cpu":
                self._busy_cpu += now - r[0]
            else:
                self._busy_net += now - r[0]
        else:      # a stopped COMP that had ended before its stop: Resume follows
            sub = self._stopped[key][1] if key in self._stopped else Sub(job, seq, "cpu")
        a = self._acct.get(key)
        if a is not None:
            self._tell(key, now)            # no-op unless done before its grant was delivered
            del self._acct[key]
            q = self._qs[a.kind]
            q[2] += 1
            q[3] += a.acc + (now - a.since if a.since is not None else 0.0)
        out = [Done(sub)]
        if acts:
            out += self._fill(acts, now)
        nxt = self._deferred.pop(job, None)
        if nxt is not None:
            out += self._join(nxt, now)
        return out

    def left(self, job: str, now: float) -> list:
        for key in [k for k in self._running if k[0] == job]:
            start, sub = self._running.pop(key)
            if sub.kind == "cpu":
                self._busy_cpu += now - start
            else:
                self._busy_net += now - start
        for key in [k for k in self._stopped if k[0] == job]:
            del self._stopped[key]
        for key in [k for k in self._acct if k[0] == job]:
            del self._acct[key]
        self._ready.discard(job)
        self._held.pop(job, None)
        self._deferred.pop(job, None)
        return self._fill(self.queues.drop_job(job), now)

    def _fill(self, acts: list, now: float) -> list:
        """The queue's actions, with the protocol state applied: slots'
        start times, grants held for executors not ready, stood time."""
        out = []
        for a in acts:
            t = type(a)
            if t is Grant:
                s = a.sub
                self._running[(s.job, s.seq)] = (now, s)
                if s.job not in self._ready:
                    a = Grant(s, a.role, True)
                    self._held.setdefault(s.job, []).append(a)
                else:
                    self._tell((s.job, s.seq), now)
            elif t is Stop:
                s = a.sub
                key = (s.job, s.seq)
                r = self._running.pop(key, None)
                if r is not None:
                    self._busy_cpu += now - r[0]
                self._stopped[key] = (now, s)
                c = self._acct.get(key)
                if c is not None and c.since is not None:
                    c.acc += now - c.since
                    c.since = None
            elif t is Resume:
                s = a.sub
                key = (s.job, s.seq)
                st = self._stopped.pop(key, None)
                stood = now - st[0] if st is not None else 0.0
                run = self.queues.cpu_run
                going = run is not None and run.seq == s.seq and run.job == s.job
                if going:
                    self._running[key] = (now, s)
                    c = self._acct.get(key)
                    if c is not None and c.told:
                        c.since = now
                a = Resume(s, stood, going and s.job in self._ready)
            out.append(a)
        return out

    # -- queries -------------------------------------------------------------------
    def current(self, job: str) -> Sub | None:
        return self.queues.current(job)

    def primary(self) -> Sub | None:
        return self.queues.primary()

    def is_ready(self, job: str) -> bool:
        return job in self._ready

    def busy(self, now: float) -> tuple[float, float]:
        cpu, net = self._busy_cpu, self._busy_net
        for start, sub in self._running.values():
            if sub.kind == "cpu":
                cpu += now - start
            else:
                net += now - start
        return cpu, net

    def queue_stats(self) -> dict[str, QueueStats]:
        return {k: QueueStats(int(q[0]), q[1], int(q[2]), q[3]) for k, q in self._qs.items()}

    # -- executor memory -----------------------------------------------------------
    def started(self, job: str, now: float) -> None:
        self._procs[job] = _Proc()
        self._sample.pop(job, None)

    def exited(self, job: str, now: float) -> list:
        self._procs.pop(job, None)
        self._sample.pop(job, None)
        self._alpha.pop(job, None)
        return self.left(job, now)

    def memory_jobs(self, loaded_only: bool = False) -> list[str]:
        return [j for j, p in self._procs.items()
                if not p.killed and (p.loaded or not loaded_only)]

    def memory(self, now: float, usage: Mapping[str, int]) -> list:
        counted: dict[str, int] = {}
        loaded: dict[str, int] = {}
        for job, nbytes in usage.items():
            p = self._procs.get(job)
            if p is None or p.killed:
                continue
            counted[job] = nbytes
            if p.loaded:
                loaded[job] = nbytes
        self._sample, self._sample_t = loaded, now
        total = sum(counted.values())
        if not self.oom_kill or not counted or total <= self.memory_budget:
            return []
        job = max(counted, key=counted.__getitem__)
        p = self._procs[job]
        p.killed = True
        self._sample.pop(job, None)
        return [OomKill(job, counted[job], total, self.memory_budget, p.loaded)]

    def memory_view(self, job: str, now: float) -> MemoryView:
        others = [b for j, b in self._sample.items() if j != job]
        starved, need = False, 0.0
        for j, (t, _, st, nd) in self._alpha.items():
            if st and j != job and now - t < STARVED_FRESH_S:
                starved, need = True, need + nd
        return MemoryView(self.memory_budget, sum(others), len(others),
                          None if self._sample_t is None else now - self._sample_t, starved,
                          need)

    def alpha_state(self, job: str, alpha: float, starved: bool, now: float,
                    need: float = 0.0) -> None:
        need = float(need)
        self._alpha[job] = (now, float(alpha), bool(starved),
                            need if 0.0 < need < float("inf") else 0.0)   # NaN, inf: none
