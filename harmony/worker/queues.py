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
the long transfer loses only the time the short one needed. The grant
order stays FIFO: which subtask runs *next* must not depend on when an
enqueue happens to arrive on each machine, but which of two running
transfers leads may (it changes shares of the link, not the order).

Every call returns the actions for the I/O shell to carry out:
``("grant", Sub, role)`` with role "cpu", "primary" or "secondary", and
``("promote", Sub)`` when a running secondary becomes primary, and
``("demote", Sub)`` when a shorter newcomer takes the primary role from it.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class Sub:
    job: str
    seq: int
    kind: str          # "cpu" or "net"
    prio: float = 0.0  # expected seconds (0: unknown); the shorter leads the link


class QueueError(ValueError):
    pass


class ResourceQueues:
    def __init__(self, net_slots: int = 2) -> None:
        self.cpu_wait: deque[Sub] = deque()
        self.net_wait: deque[Sub] = deque()
        self.cpu_run: Sub | None = None
        self.net_run: list[Sub] = []        # [primary, secondary]
        self.net_slots = net_slots

    def enqueue(self, sub: Sub) -> list[tuple]:
        if sub.kind not in ("cpu", "net"):
            raise QueueError(f"unknown subtask kind {sub.kind!r}")
        if self._find(sub.job) is not None:
            raise QueueError(f"job {sub.job} already has subtask {self._find(sub.job)} queued")
        (self.cpu_wait if sub.kind == "cpu" else self.net_wait).append(sub)
        return self._grant()

    def done(self, job: str, seq: int) -> list[tuple]:
        if self.cpu_run is not None and (self.cpu_run.job, self.cpu_run.seq) == (job, seq):
            self.cpu_run = None
            return self._grant()
        for i, s in enumerate(self.net_run):
            if (s.job, s.seq) == (job, seq):
                del self.net_run[i]
                acts: list[tuple] = []
                if i == 0 and self.net_run:
                    acts.append(("promote", self.net_run[0]))
                return acts + self._grant()
        raise QueueError(f"job {job} subtask {seq} is not running here")

    def drop_job(self, job: str) -> list[tuple]:
        """Forget a job (failed, cancelled, killed): free its slots."""
        self.cpu_wait = deque(s for s in self.cpu_wait if s.job != job)
        self.net_wait = deque(s for s in self.net_wait if s.job != job)
        acts: list[tuple] = []
        if self.cpu_run is not None and self.cpu_run.job == job:
            self.cpu_run = None
        was_primary = bool(self.net_run) and self.net_run[0].job == job
        self.net_run = [s for s in self.net_run if s.job != job]
        if was_primary and self.net_run:
            acts.append(("promote", self.net_run[0]))
        return acts + self._grant()

    def current(self, job: str) -> Sub | None:
        """The job's subtask that is queued or running here, if any."""
        return self._find(job)

    def _find(self, job: str) -> Sub | None:
        for s in (self.cpu_run, *self.net_run, *self.cpu_wait, *self.net_wait):
            if s is not None and s.job == job:
                return s
        return None

    def _grant(self) -> list[tuple]:
        acts: list[tuple] = []
        if self.cpu_run is None and self.cpu_wait:
            self.cpu_run = self.cpu_wait.popleft()
            acts.append(("grant", self.cpu_run, "cpu"))
        while len(self.net_run) < self.net_slots and self.net_wait:
            s = self.net_wait.popleft()
            if self.net_run and 0 < s.prio < self.net_run[0].prio:
                # shorter than the running primary: it leads the link
                acts.append(("demote", self.net_run[0]))
                self.net_run.insert(0, s)
                acts.append(("grant", s, "primary"))
            else:
                self.net_run.append(s)
                acts.append(("grant", s, "primary" if len(self.net_run) == 1 else "secondary"))
        return acts

    def primary(self) -> Sub | None:
        return self.net_run[0] if self.net_run else None
