"""The subtask synchronizer off the master: a leader daemon per group (pure).

Every executor of a queued job reports the end of each subtask (``sync``:
its index, the subtask's sequence number and the kind of the next one).
Once every executor of the job has reported subtask ``seq``, subtask
``seq + 1`` is enqueued on every machine of the job. Done by the master, this
is two messages per executor per subtask through one Python loop: at 1,000
machines with 100 ms subtasks, about 100,000 messages a second, which no
central loop keeps up with (``bench/master_load.py``, issue #32).

So the master appoints, for each job attempt and layout, a **leader**: one
machine of the job, the same one for the jobs it is co-located with
(``choose_leader``). Executors report to their own daemon; the daemon
forwards to the leader's daemon (``lsync``); the leader completes the round
and sends ``enqueue`` to each machine of the job. One leader serializes the
rounds of all the jobs it leads, and a ZeroMQ connection keeps the order of
what is sent on it, so co-located jobs' subtasks are enqueued in the same
order on every machine of a group, as the master's single loop did. The
master hears about none of it: it sends a plan (``sync_plan``) when a job
starts or its layout changes.

The leader is always one of the job's own machines, so losing it is losing
a machine of the job, which the master already handles (the job resumes
from its checkpoint elsewhere); a leader needs no failover of its own.

:class:`SyncLeader` is the leader's state: plans in, syncs in, enqueue and
failure commands out. :class:`SyncRouter` is a member's: which leader each
job's syncs go to, holding the syncs that arrive before their plan. Both are
bounded: a key holder's stray or hostile syncs cannot grow them.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

#: rounds of one job the leader keeps open at once (a round opens at the
#: first sync of a subtask and closes when every executor reported it: with
#: the executors in lockstep one is open, two briefly)
MAX_OPEN_ROUNDS = 4
#: syncs held for a plan that has not arrived yet (the plan and the first
#: syncs travel on different connections), per process, and for how long
MAX_HELD = 4096
HELD_S = 30.0
#: of them, from one machine (one member's flood cannot crowd out the others')
MAX_HELD_PER_MACHINE = 64
#: jobs one leader or router keeps plans for
MAX_PLANS = 4096
#: harmony-master --sync: "leader" (a daemon of each group, the default) or
#: "master" (the master's own loop synchronizes every queued job)
SYNC_MODES = ("leader", "master")


@dataclass(frozen=True)
class Plan:
    """Who synchronizes a job attempt's subtasks, on which layout."""
    job: str
    attempt: int
    gen: int                       # layout generation: each new layout counts up
    machines: tuple[str, ...]      # by executor index
    leader: str                    # one of machines
    endpoint: str = ""             # the leader daemon's sync endpoint

    def __post_init__(self) -> None:
        if self.leader not in self.machines:
            raise ValueError(f"leader {self.leader!r} is not a machine of {self.job}")


@dataclass(frozen=True)
class Sync:
    """One executor's report: subtask ``seq`` done, ``next`` comes next."""
    job: str
    attempt: int
    gen: int
    index: int
    seq: int
    next: str                      # "cpu" or "net"
    prio: float = 0.0              # the next subtask's expected seconds


@dataclass(frozen=True)
class Enqueue:
    """Enqueue subtask ``seq`` of ``job`` on ``machine``."""
    machine: str
    job: str
    seq: int
    kind: str
    prio: float


@dataclass(frozen=True)
class Failed:
    """The job's executors broke the protocol: the master fails the attempt."""
    job: str
    attempt: int
    error: str


@dataclass
class _Led:
    plan: Plan
    rounds: dict[int, dict[int, tuple[str, float]]] = field(default_factory=dict)
    done: int = -1                 # the last round completed
    failed: bool = False


class SyncLeader:
    """The synchronizer of the jobs whose plans name this machine."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._jobs: dict[str, _Led] = {}
        self._held: list[tuple[float, str, Sync]] = []
        self.refused = 0           # syncs dropped (stale, stray, over a bound)

    def plan(self, plan: Plan, now: float) -> list:
        """Lead ``plan`` from now (a newer attempt or layout replaces the
        older one; an older one is ignored). Returns what the syncs held for
        it complete."""
        if plan.leader != self.name:
            self.drop(plan.job, plan.attempt)
            return []
        cur = self._jobs.get(plan.job)
        if cur is not None and (cur.plan.attempt, cur.plan.gen) >= (plan.attempt, plan.gen):
            return []
        if cur is None and len(self._jobs) >= MAX_PLANS:
            self._jobs.pop(next(iter(self._jobs)))      # the oldest
        self._jobs[plan.job] = _Led(plan)
        held, self._held = self._held, []
        out: list = []
        for t, machine, s in held:
            out += self.sync(machine, s, t)
        return out

    def drop(self, job: str, attempt: int | None = None) -> None:
        """Forget ``job`` (only its attempts up to ``attempt``, if given: the
        executor of an older attempt exits after the next one started)."""
        led = self._jobs.get(job)
        if led is not None and (attempt is None or led.plan.attempt <= attempt):
            del self._jobs[job]

    def leads(self, job: str) -> Plan | None:
        led = self._jobs.get(job)
        return None if led is None else led.plan

    def sync(self, machine: str, s: Sync, now: float) -> list:
        """``machine``'s daemon forwarded ``s``. Returns :class:`Enqueue`
        commands (every machine of the job, in index order) once the round
        is complete, a :class:`Failed` on a protocol break, else []."""
        self._expire(now)
        led = self._jobs.get(s.job)
        if led is None or (led.plan.attempt, led.plan.gen) < (s.attempt, s.gen):
            # its plan may be on its way: hold it (bounded, for HELD_S)
            if len(self._held) < MAX_HELD and sum(
                    1 for h in self._held if h[1] == machine) < MAX_HELD_PER_MACHINE:
                self._held.append((now, machine, s))
            else:
                self.refused += 1
            return []
        p = led.plan
        if (p.attempt, p.gen) != (s.attempt, s.gen) or led.failed \
                or not 0 <= s.index < len(p.machines) or p.machines[s.index] != machine \
                or s.seq <= led.done:
            self.refused += 1          # stale, stray, a repeat, or not from its machine
            return []
        got = led.rounds.get(s.seq)
        if got is None:
            if len(led.rounds) >= MAX_OPEN_ROUNDS:
                self.refused += 1
                return []
            got = led.rounds[s.seq] = {}
        got[s.index] = (s.next, s.prio)
        if len(got) < len(p.machines):
            return []
        del led.rounds[s.seq]
        kinds = {k for k, _ in got.values()}
        if len(kinds) != 1 or not kinds <= {"cpu", "net"}:
            led.failed = True
            return [Failed(s.job, s.attempt, "executors disagree on the next subtask after "
                                             f"{s.seq}: {dict(sorted((i, k) for i, (k, _) in got.items()))}")]
        led.done = max(led.done, s.seq)
        kind = kinds.pop()
        prio = max(pr for _, pr in got.values())
        return [Enqueue(m, s.job, s.seq + 1, kind, prio) for m in p.machines]

    def _expire(self, now: float) -> None:
        if self._held and now - self._held[0][0] > HELD_S:
            keep = [h for h in self._held if now - h[0] <= HELD_S]
            self.refused += len(self._held) - len(keep)
            self._held = keep


class SyncRouter:
    """A member daemon's side: where each job's syncs go. A sync whose plan
    has not arrived yet is held (bounded) and released by :meth:`plan`."""

    def __init__(self) -> None:
        self._plans: dict[str, Plan] = {}
        self._held: list[tuple[float, Sync]] = []
        self.refused = 0

    def plan(self, plan: Plan, now: float) -> list[tuple[Plan, Sync]]:
        cur = self._plans.get(plan.job)
        if cur is not None and (cur.attempt, cur.gen) >= (plan.attempt, plan.gen):
            return []
        if cur is None and len(self._plans) >= MAX_PLANS:
            self._plans.pop(next(iter(self._plans)))
        self._plans[plan.job] = plan
        ready = [s for _, s in self._held if s.job == plan.job
                 and (s.attempt, s.gen) == (plan.attempt, plan.gen)]
        self._held = [h for h in self._held if h[1].job != plan.job
                      or (h[1].attempt, h[1].gen) > (plan.attempt, plan.gen)]
        return [(plan, s) for s in ready]

    def drop(self, job: str, attempt: int | None = None) -> None:
        p = self._plans.get(job)
        if p is not None and (attempt is None or p.attempt <= attempt):
            del self._plans[job]
        self._held = [h for h in self._held if h[1].job != job
                      or (attempt is not None and h[1].attempt > attempt)]

    def plan_of(self, job: str) -> Plan | None:
        return self._plans.get(job)

    def route(self, s: Sync, now: float) -> Plan | None:
        """The plan ``s`` goes by, or None (held until its plan comes, or
        dropped as stale)."""
        if self._held and now - self._held[0][0] > HELD_S:
            keep = [h for h in self._held if now - h[0] <= HELD_S]
            self.refused += len(self._held) - len(keep)
            self._held = keep
        p = self._plans.get(s.job)
        if p is not None and (p.attempt, p.gen) == (s.attempt, s.gen):
            return p
        if p is not None and (p.attempt, p.gen) > (s.attempt, s.gen):
            self.refused += 1
            return None
        if len(self._held) < MAX_HELD:
            self._held.append((now, s))
        else:
            self.refused += 1
        return None


def choose_leader(machines: list[str], neighbours: list[tuple[list[str], str]]) -> str:
    """The leader of a job on ``machines``: the leader most of the running
    jobs it shares a machine with already have, if that is one of its
    machines (then co-located jobs share one leader and one order), else
    its first machine by name. ``neighbours``: (machines, leader) of the
    other running jobs."""
    mine = set(machines)
    votes = Counter(lead for ms, lead in neighbours
                    if lead in mine and mine.intersection(ms))
    if votes:
        best = max(votes.values())
        return min(lead for lead, n in votes.items() if n == best)
    return min(machines)
