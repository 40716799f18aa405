"""The master core's volatile records: a worker daemon (:class:`Worker`), one
attempt of a running job (:class:`Run`) and a live resize in flight
(:class:`Reconfig`). The job table itself is :class:`harmony.master.jobs.Job`
(persisted); these are not."""
from __future__ import annotations

import secrets
from collections import deque
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Phase(Enum):
    """Where one attempt of a job stands (``Run.phase``): launched and
    waiting for its executors; running; and the four ways its next epoch
    end can be special. A stop may come while another of them is under way
    (``ALLOWED_TOGETHER``); it is then the run's phase."""
    LAUNCHING = "launching"
    RUNNING = "running"
    PAUSING = "pausing"        # pause (or pause and resume elsewhere) at its next epoch end
    RESIZING = "resizing"      # a live resize in flight (Reconfig)
    STOPPING = "stopping"      # its last epoch reached: final checkpoint, exit
    ENDING = "ending"          # the scheduler ends it early at its next epoch end


#: the phases that may be under way together (any other two at once is a
#: bug): a job's last epoch stops it whatever else was asked at that epoch
#: end (an early end, a live resize, a pause: its executors' own stop comes
#: first)
ALLOWED_TOGETHER = frozenset({frozenset({Phase.STOPPING, Phase.ENDING}),
                              frozenset({Phase.STOPPING, Phase.RESIZING}),
                              frozenset({Phase.STOPPING, Phase.PAUSING}),
                              frozenset({Phase.STOPPING, Phase.RESIZING, Phase.ENDING})})

#: the moves a run's phase makes: from each phase, the phases it may go to
#: next (:meth:`Run.enter` and :meth:`Run.leave` check every move). A run
#: that pauses or stops is dropped once its executors are done: nothing
#: leaves STOPPING, and PAUSING only for a stop (the job's last epoch came
#: first). A live resize goes back to RUNNING when it is committed. A pause
#: or an early end may be asked before the executors are ready: they then
#: become ready under it (``Run.started``), which is no move.
TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.LAUNCHING: frozenset({Phase.RUNNING, Phase.PAUSING, Phase.ENDING}),
    Phase.RUNNING: frozenset({Phase.PAUSING, Phase.RESIZING, Phase.STOPPING, Phase.ENDING}),
    Phase.RESIZING: frozenset({Phase.RUNNING, Phase.STOPPING}),
    Phase.PAUSING: frozenset({Phase.STOPPING}),
    Phase.ENDING: frozenset({Phase.STOPPING}),
    Phase.STOPPING: frozenset(),
}

#: the phases a run may be in beside others (each has its own flag on Run)
_SPECIAL = (Phase.STOPPING, Phase.ENDING, Phase.PAUSING, Phase.RESIZING)   # by precedence


class PhaseError(AssertionError):
    """A run in two phases at once, or a move of its phase that is not in
    ``TRANSITIONS``: a bug in the core (``validate``, ``Run.enter``)."""


def _phase(started: bool, on: frozenset) -> Phase:
    """The phase of a run whose executors are ready (``started``) or not,
    with the phases ``on`` under way: the first of them by precedence."""
    for p in _SPECIAL:
        if p in on:
            return p
    return Phase.RUNNING if started else Phase.LAUNCHING


#: a worker's subtasks kept for the dashboard's task stream
TASKS_KEPT = 1000


@dataclass
class Worker:
    name: str
    ident: bytes
    host: str
    cpus: int
    memory: int
    pid: int
    last_seen: float
    alive: bool = True
    stats: deque = field(default_factory=lambda: deque(maxlen=3600))
    data_endpoint: str = ""      # its data service: checkpoint parts on its disk
    revision: str = ""           # the code it runs (deployed git revision), if it said
    sync_endpoint: str = ""      # where its daemon leads jobs' synchronizers (none: cannot)
    launches_sent: int = 0       # launch messages sent since it registered
    # subtasks that ended here ([start, end, job, kind] on the master's clock),
    # the latest TASKS_KEPT, while the dashboard's task stream is watched
    tasks: deque = field(default_factory=lambda: deque(maxlen=TASKS_KEPT))


@dataclass
class Reconfig:
    """A live resize of a running job (block migration)."""
    to: list[str]                     # the new machines, in new index order
    join: list[str]                   # machines that join (new executors)
    note: str
    t0: float
    ready: dict[str, dict] = field(default_factory=dict)     # joiner -> exec_ready
    idents: dict[str, bytes] = field(default_factory=dict)   # joiner -> identity
    boundary: dict[int, dict] = field(default_factory=dict)  # old index -> at_boundary
    migrated: dict[bytes, dict] = field(default_factory=dict)
    progress: dict[bytes, tuple[int, int]] = field(default_factory=dict)   # bytes, blocks out
    sends: dict[bytes, list] = field(default_factory=dict)                # ident -> its moves
    planned: bool = False
    owner: list[int] = field(default_factory=list)
    blocks: int = 0
    stood_since: float | None = None
    # the target roles: {"input": weights, "model": weights} per new index
    # (None: even); an index of input weight 0 is a server only, of model
    # weight 0 a worker only
    layout: dict | None = None
    input_counts: list[int] = field(default_factory=list)
    predicted: dict | None = None     # Cruise's prediction for the new layout, if it asked
    # the plan of the move, executed operation by operation (harmony.cruise.plan)
    execution: Any = None
    moves: dict[int, tuple[bytes, list]] = field(default_factory=dict)   # op -> (sender, sends)
    left: dict[bytes, int] = field(default_factory=dict)     # sender -> moves not yet done

    def all_ready(self) -> bool:
        return len(self.ready) == len(self.join)


@dataclass
class Run:
    """Volatile state of one attempt of a running job."""
    attempt: int
    launched: float
    ready: dict[int, dict] = field(default_factory=dict)
    idents: dict[int, bytes] = field(default_factory=dict)
    started: bool = False
    barriers: dict[tuple[int, int], set[int]] = field(default_factory=dict)
    sums: dict[int, dict[int, tuple[dict, dict]]] = field(default_factory=dict)
    syncs: dict[int, dict[int, str]] = field(default_factory=dict)
    timings: dict[int, dict] = field(default_factory=dict)
    stopping: bool = False
    finished: set[int] = field(default_factory=set)
    pausing: bool = False                 # pause at the next epoch end
    pause_to: list[str] | None = None     # then resume there (a migration)
    pause_note: str = ""
    ending: str = ""                      # the scheduler ends it at its next epoch end: why
    paused: dict[int, tuple[int, int]] = field(default_factory=dict)  # index -> (epoch, version)
    replicas: dict[int, str | None] = field(default_factory=dict)      # index -> replica machine
    owner: list[int] = field(default_factory=list)                   # model block -> index
    layout: dict | None = None            # the roles (Reconfig.layout) now; None: even
    cruise: Any = None                    # harmony.cruise.adapter.JobCruise, with --cruise
    # its solve running off the event loop: (the solve, d, m, epochs left) then
    solving: tuple | None = None
    reconfig: Reconfig | None = None
    ckpt_parts: dict[int, tuple] = field(default_factory=dict)   # a periodic checkpoint
    ckpt_epoch: int | None = None        # the periodic checkpoint being written
    last_ckpt: tuple[int, float] = (0, 0.0)   # (first epoch after it, time) of the last
    # the attempt's PS secret: shards serve only requests that carry it
    secret: str = field(default_factory=lambda: secrets.token_hex(16))
    # the final checkpoint (at the stop epoch): index -> (machine, replica,
    # bytes, epoch, error)
    final: dict[int, tuple] = field(default_factory=dict)
    # the synchronizer off the master (harmony.subtasks.sync): the leader
    # machine of the current layout and its generation (None: the master
    # synchronizes this attempt)
    sync_leader: str | None = None
    sync_gen: int = 0
    # machine -> the number its launch of this attempt had among the launches
    # sent to it (Worker.launches_sent): a heartbeat that counts at least as
    # many was sent after its daemon saw the launch
    launch_seq: dict[str, int] = field(default_factory=dict)

    # -- the phase ----------------------------------------------------------------------
    # Stored as the flags above (started, pausing, reconfig, stopping,
    # ending), written only by enter and leave: a stop may come while a live
    # resize, an early end or a pause is under way, and the core reads each
    # of them after it (the resize's joiners to kill and its timeout, the
    # early end's note, a clean exit while pausing), and a pause or an early
    # end may be asked before the executors are ready (``started``, which the
    # launch timeout and a resize read). One field would drop what they read.
    @property
    def phase(self) -> Phase:
        """The attempt's phase, from its flags: the first phase under way of
        STOPPING, ENDING, PAUSING, RESIZING; else RUNNING once its executors
        are ready, LAUNCHING before."""
        return _phase(self.started, self._on())

    def _on(self) -> frozenset:
        """The phases under way that have a flag (PAUSING, RESIZING,
        STOPPING, ENDING)."""
        return frozenset(p for p, f in ((Phase.PAUSING, self.pausing),
                                        (Phase.RESIZING, self.reconfig is not None),
                                        (Phase.STOPPING, self.stopping),
                                        (Phase.ENDING, bool(self.ending))) if f)

    def enter(self, phase: Phase, *, note: str = "", to: list[str] | None = None,
              reconfig: Reconfig | None = None) -> None:
        """The one way the core starts a phase of the run: RUNNING (its
        executors are all ready), PAUSING (at its next epoch end, then
        resume on ``to`` if given; ``note``: why), RESIZING (``reconfig``:
        the live resize), STOPPING (its last epoch reached), ENDING (the
        scheduler ends it early; ``note``: why). The phase entered becomes
        the run's phase by a move in ``TRANSITIONS``, except RUNNING under
        a pause or an early end asked before the executors were ready (no
        move). PhaseError otherwise, and nothing changes."""
        old, on = self.phase, self._on()
        if phase is Phase.RUNNING:
            # from LAUNCHING a move; under a phase the run went to while it
            # launched, none
            ok = not self.started and (phase in TRANSITIONS[old] if old is Phase.LAUNCHING
                                       else old in TRANSITIONS[Phase.LAUNCHING])
        else:
            ok = phase in _SPECIAL and phase not in on \
                and _phase(self.started, on | {phase}) is phase and phase in TRANSITIONS[old]
        if not ok:
            raise PhaseError(f"attempt {self.attempt}: {old.value} -> {phase.value} is not a "
                             f"move of a run's phase")
        if phase is Phase.RUNNING:
            self.started = True
        elif phase is Phase.PAUSING:
            self.pausing, self.pause_to, self.pause_note = True, to, note
        elif phase is Phase.RESIZING:
            if reconfig is None:
                raise ValueError("a resize's phase needs its Reconfig")
            self.reconfig = reconfig
        elif phase is Phase.STOPPING:
            self.stopping = True
        else:
            if not note:
                raise ValueError("an early end needs its note (why)")
            self.ending = note

    def leave(self, phase: Phase) -> None:
        """The one way a phase ends before the run does: a live resize
        committed (RESIZING: its Reconfig goes), back to RUNNING by a move
        in ``TRANSITIONS`` (or, under a stop that came meanwhile, no move).
        The others end with the run (it is dropped): PhaseError, and
        nothing changes."""
        old, on = self.phase, self._on()
        new = _phase(self.started, on - {phase})
        if phase is not Phase.RESIZING or phase not in on \
                or not (new is old or new in TRANSITIONS[old]):
            raise PhaseError(f"attempt {self.attempt}: leaving {phase.value} "
                             f"({old.value} -> {new.value}) is not a move of a run's phase")
        self.reconfig = None

    def validate(self, job: str = "") -> None:
        """PhaseError if phases are under way together that may not be:
        ``ALLOWED_TOGETHER`` lists the pairs that may (a job the scheduler
        ends early stops the way its app's own stop does; a job whose last
        epoch comes while a live resize is in flight, or a pause is asked,
        stops)."""
        on = self._on()
        if len(on) > 1 and on not in ALLOWED_TOGETHER:
            raise PhaseError(f"{job}: attempt {self.attempt} in {len(on)} phases at once: "
                             f"{', '.join(sorted(p.value for p in on))}")
