"""A machine's two subtask queues, as a pure state machine (no I/O).

CPU queue: exactly one COMP runs at a time (it may use all cores of the
machine). NET queue: at most two network subtasks run at once, a *primary*
and a *secondary*. The secondary only uses bandwidth the primary leaves idle
(enforced by the network emulation's priority track, or by the real network's
sharing). When the primary ends, the secondary is promoted. Both queues
grant in FIFO order, and the master enqueues co-located jobs' subtasks in the
same order on every machine, so every machine runs them in the same order.

Of two running network subtasks, the one expected to be shorter (``prio``:
the seconds the master expects from the job's profile) is the primary:
shortest first on the link. A short PULL of a CPU-heavy job then takes the
link for its few milliseconds and unblocks that job's long COMP, instead of
trickling behind a network-heavy job's long transfer while the CPU idles;
the long transfer loses only the time the short one needed. The grant order
stays FIFO: which subtask runs *next* must not depend on when an enqueue
happens to arrive on each machine, but which of two running transfers leads
may (it changes shares of the link, not the order).

The CPU queue preempts the same way (``preempt``, on by default), one level
deep: when the next waiting COMP is expected to take at most
1/PREEMPT_RATIO of the running one, the running one is stopped (the daemon
sends SIGSTOP to its executor) while the short one runs, then continues. Without it, a
network-heavy job's 30 ms COMP waits up to a whole 250 ms COMP of its
CPU-heavy partner, and its long transfer starts that much later; the
partner loses only the 30 ms. Still only one COMP runs at a time.

Every call returns the actions (typed records, in the order they are to be
carried out): :class:`Grant` ``(sub, role)`` with role "cpu", "primary" or
"secondary"; :class:`Promote` ``(sub)`` when a running secondary becomes
primary; :class:`Demote` ``(sub)`` when a shorter newcomer takes the primary
role from it; :class:`Stop` ``(sub)`` and :class:`Resume` ``(sub)`` for a
preempted COMP. The daemon's protocol core
(:mod:`harmony.worker.daemon_core`) wraps this queue and adds the state
around it (executors not ready yet, enqueues that overtook a release, the
time a preempted COMP stood); it is what the daemon and the simulator drive.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Sub:
    job: str
    seq: int
    kind: str          # "cpu" or "net"
    prio: float = 0.0  # expected seconds (0: unknown: never preempts or leads)


class QueueError(ValueError):
    pass


# -- actions ------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Grant:
    """``sub`` holds a slot from now: role "cpu", "primary" or "secondary".
    ``held`` (set by the daemon core only): its executor is not ready yet;
    the grant reaches it later, as a :class:`Deliver`."""
    sub: Sub
    role: str
    held: bool = False


@dataclass(frozen=True, slots=True)
class Promote:
    """The running secondary ``sub`` is the primary now."""
    sub: Sub


@dataclass(frozen=True, slots=True)
class Demote:
    """The running primary ``sub`` is the secondary now (a shorter one leads)."""
    sub: Sub


@dataclass(frozen=True, slots=True)
class Stop:
    """Stop the running COMP ``sub`` (CPU preemption): a short COMP runs."""
    sub: Sub


@dataclass(frozen=True, slots=True)
class Resume:
    """Continue the stopped COMP ``sub``. Filled in by the daemon core:
    ``stood``, the seconds it stood stopped; ``tell``: it goes on as the
    running COMP and its executor is ready, so the executor is told
    ``stood`` (False when its COMP had ended just before the stop reached
    it: it is only continued, and holds no slot)."""
    sub: Sub
    stood: float = 0.0
    tell: bool = False


Action = Grant | Promote | Demote | Stop | Resume


PREEMPT_RATIO = 4.0   # a COMP preempts one expected to run >= this many times longer
MAX_BYPASS = 2        # short COMPs in a row while a long one stands stopped


class ResourceQueues:
    def __init__(self, net_slots: int = 2, preempt: bool = True) -> None:
        self.cpu_wait: deque[Sub] = deque()
        self.net_wait: deque[Sub] = deque()
        self.cpu_run: Sub | None = None
        self.cpu_stopped: Sub | None = None    # a long COMP preempted by cpu_run
        # the last COMP that was stopped, and the short COMPs that ran while it
        # stood, over all its stops until it ends (so resuming it does not
        # reset the count, and a stream of short COMPs cannot starve it)
        self.long: Sub | None = None
        self.bypassed = 0
        self.preempt = preempt
        self.net_run: list[Sub] = []        # [primary, secondary]
        self.net_slots = net_slots
        self._of: dict[str, Sub] = {}       # job -> its subtask here (queued or running)

    def enqueue(self, sub: Sub) -> list:
        if sub.kind not in ("cpu", "net"):
            raise QueueError(f"unknown subtask kind {sub.kind!r}")
        cur = self._of.get(sub.job)
        if cur is not None:
            raise QueueError(f"job {sub.job} already has subtask {cur} queued")
        self._of[sub.job] = sub
        (self.cpu_wait if sub.kind == "cpu" else self.net_wait).append(sub)
        return self._grant()

    def done(self, job: str, seq: int) -> list:
        run = self.cpu_run
        if run is not None and run.seq == seq and run.job == job:
            self.cpu_run = None
            del self._of[job]
            if run is self.long:
                self.long, self.bypassed = None, 0
            return self._grant()
        stopped = self.cpu_stopped
        if stopped is not None and stopped.seq == seq and stopped.job == job:
            # it had ended just before the stop reached it: let it go on
            self.cpu_stopped = None
            del self._of[job]
            self.long, self.bypassed = None, 0
            return [Resume(stopped)]
        for i, s in enumerate(self.net_run):
            if s.seq == seq and s.job == job:
                del self.net_run[i]
                del self._of[job]
                acts: list = []
                if i == 0 and self.net_run:
                    acts.append(Promote(self.net_run[0]))
                return acts + self._grant()
        raise QueueError(f"job {job} subtask {seq} is not running here")

    def drop_job(self, job: str) -> list:
        """Forget a job (failed, cancelled, killed): free its slots."""
        self._of.pop(job, None)
        self.cpu_wait = deque(s for s in self.cpu_wait if s.job != job)
        self.net_wait = deque(s for s in self.net_wait if s.job != job)
        acts: list = []
        if self.cpu_stopped is not None and self.cpu_stopped.job == job:
            self.cpu_stopped = None
        if self.cpu_run is not None and self.cpu_run.job == job:
            self.cpu_run = None
        if self.long is not None and self.long.job == job:
            self.long, self.bypassed = None, 0
        was_primary = bool(self.net_run) and self.net_run[0].job == job
        self.net_run = [s for s in self.net_run if s.job != job]
        if was_primary and self.net_run:
            acts.append(Promote(self.net_run[0]))
        return acts + self._grant()

    def current(self, job: str) -> Sub | None:
        """The job's subtask that is queued or running here, if any."""
        return self._of.get(job)

    def _grant(self) -> list:
        acts: list = []
        head = self.cpu_wait[0] if self.cpu_wait else None
        if self.cpu_run is None and self.cpu_stopped is not None and not (
                head and self._bypasses(head, self.cpu_stopped)):
            self.cpu_run, self.cpu_stopped = self.cpu_stopped, None    # it goes on
            acts.append(Resume(self.cpu_run))
        elif self.cpu_run is None and head:
            self.cpu_run = self.cpu_wait.popleft()
            if self.cpu_stopped is not None:
                self.bypassed += 1
            acts.append(Grant(self.cpu_run, "cpu"))
        elif head and (run := self.cpu_run) is not None and self.cpu_stopped is None \
                and self._bypasses(head, run):
            # the next COMP is short next to the running one: stop the long
            # one while the short one runs (one level deep, grants stay FIFO)
            if self.long is not run:
                self.long, self.bypassed = run, 0
            self.cpu_stopped, self.cpu_run = run, self.cpu_wait.popleft()
            self.bypassed += 1
            acts += [Stop(run), Grant(self.cpu_run, "cpu")]
        while len(self.net_run) < self.net_slots and self.net_wait:
            s = self.net_wait.popleft()
            if self.net_run and 0 < s.prio < self.net_run[0].prio:
                # shorter than the running primary: it leads the link
                acts.append(Demote(self.net_run[0]))
                self.net_run.insert(0, s)
                acts.append(Grant(s, "primary"))
            else:
                self.net_run.append(s)
                acts.append(Grant(s, "primary" if len(self.net_run) == 1 else "secondary"))
        return acts

    def _bypasses(self, short: Sub, long: Sub) -> bool:
        """May ``short`` run while ``long`` stands stopped? Never more than
        MAX_BYPASS short COMPs over all of a long COMP's stops, so a stream
        of short COMPs cannot starve it."""
        if not self.preempt or short.prio <= 0 or short.prio * PREEMPT_RATIO > long.prio:
            return False
        return (self.bypassed if long is self.long else 0) < MAX_BYPASS

    def primary(self) -> Sub | None:
        return self.net_run[0] if self.net_run else None
