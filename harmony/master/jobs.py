"""Job records and their lifecycle (pure data; no I/O)."""
from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

from harmony.sched.model import Profile, fixed_part

#: harmony-master --retention default: seconds a finished job stays in the
#: live views (Job.retained)
RETENTION_S = 3600.0


class JobState(str, Enum):
    WAITING = "waiting"
    PROFILING = "profiling"    # running on a small group to learn its profile
    PROFILED = "profiled"      # profiled, paused (checkpointed), waiting for a group
    RUNNING = "running"
    PAUSED = "paused"          # checkpointed at an epoch end; resumes from there
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL

    @property
    def active(self) -> bool:
        """Executors run (a profiling job runs like a running one)."""
        return self in _ACTIVE


_TERMINAL = (JobState.FINISHED, JobState.FAILED, JobState.CANCELLED)
_ACTIVE = (JobState.RUNNING, JobState.PROFILING)


_ALLOWED = {
    JobState.WAITING: {JobState.RUNNING, JobState.PROFILING, JobState.CANCELLED, JobState.FAILED},
    JobState.PROFILING: {JobState.PROFILED, JobState.RUNNING, JobState.WAITING, JobState.PAUSED,
                         JobState.FINISHED, JobState.FAILED, JobState.CANCELLED},
    JobState.PROFILED: {JobState.RUNNING, JobState.WAITING, JobState.CANCELLED, JobState.FAILED},
    JobState.RUNNING: {JobState.PAUSED, JobState.WAITING, JobState.FINISHED, JobState.FAILED,
                       JobState.CANCELLED},
    JobState.PAUSED: {JobState.RUNNING, JobState.WAITING, JobState.CANCELLED, JobState.FAILED},
}

#: a job is tried at most this many times: every failure that requeues it
#: (a lost machine, an executor gone, a launch or resize timeout, a master
#: restart that stopped it) starts its next attempt, and the failure after
#: the last attempt fails it. Pauses, moves, resumes and the scheduler's
#: relaunches (profiling, regrouping) are launches, not attempts.
MAX_ATTEMPTS = 3


class TransitionError(ValueError):
    pass


DEFAULT_MAX_EPOCHS = 10     # harmony.app.COMMON_OPTIONS' --max-epochs default


def declared_epochs(args: list[str]) -> int:
    """The ``--max-epochs`` an app's arguments give (the last one, as
    argparse takes it), else the runtime's default."""
    n = DEFAULT_MAX_EPOCHS
    for i, a in enumerate(args):
        v = a[len("--max-epochs="):] if a.startswith("--max-epochs=") else (
            args[i + 1] if a == "--max-epochs" and i + 1 < len(args) else None)
        if v is not None:
            try:
                n = max(1, int(v))
            except ValueError:
                pass            # the app's own parser refuses it at launch
    return n


@dataclass
class Job:
    id: str
    app_name: str
    app_source: str
    args: list[str]
    machines: int
    name: str = ""
    state: JobState = JobState.WAITING
    submitted: float = field(default_factory=time.time)
    started: float | None = None
    ended: float | None = None
    workers: list[str] = field(default_factory=list)   # machine names, index order
    attempt: int = 0         # 1 + failures before this run (shown; at most MAX_ATTEMPTS)
    failures: int = 0        # failures that requeued it (a lost machine, a timeout, ...)
    # every launch (failures, pauses, moves, resumes, the scheduler's): the
    # number that tags its executors, their messages and PS requests
    launches: int = 0
    epochs: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    # the job's story, [time, state, note]: bounded (EVENTS_KEPT: the first,
    # "submitted", and the latest), with how many were dropped between
    events: list[list] = field(default_factory=list)
    events_dropped: int = 0
    state_time: dict[str, float] = field(default_factory=dict)  # seconds per state
    entered: float = field(default_factory=time.time)
    group: str = ""                                     # explicit job group, if any
    reason: str = ""                                    # why it is waiting, if known
    profile: dict[str, float] = field(default_factory=dict)  # moving averages
    # its last complete checkpoint, where it resumes after a pause or a lost
    # machine: {"epoch": first epoch to run, "parts": [{"index", "epoch",
    # "holders": [machines holding that part]}]}
    resume: dict[str, Any] | None = None
    ckpt_every: int = 10               # periodic checkpoint every N epochs (0: never)
    ckpt_seconds: float = 300.0        # ... or once this many seconds passed (0: never)
    checkpoint: dict[str, Any] | None = None   # the last complete one: epoch, time, replicas
    ckpt_skipped: str | None = None    # why the latest checkpoint was skipped (None: it was not)
    move: dict[str, Any] | None = None         # a resize in progress
    # its roles when not even: workers, servers, blocks of each (core.plans._layout_summary)
    layout: dict[str, Any] | None = None
    # Cruise's latest look at its layout (--cruise): predicted epoch now and
    # with the best layout, and whether it moves (harmony.cruise.adapter)
    cruise: dict[str, Any] | None = None
    held: bool = False                 # paused by the user: only the user resumes it
    sched_group: str = ""              # the scheduler's group, if any
    predicted: float | None = None     # its group's predicted iteration time (s)
    store: dict[str, dict] = field(default_factory=dict)     # machine -> latest store stats
    # its executors' start-ups, latest last: [seconds from process start to
    # ready, CPU seconds they took, and 1 where it was stretched at a
    # dilation: harmony.sim.importer.setup_cpu] (at most SETUPS_KEPT)
    setups: list = field(default_factory=list)
    deadline: float | None = None      # absolute (master clock), if submitted with one
    utility: str = ""                  # its utility of the JCT (a Utility spec), if any

    def update_profile(self, timings: dict[str, float], machines: int,
                       weight: float = 0.3, alone: bool = False,
                       wall: float | None = None) -> None:
        """Moving averages per iteration of Tcpu (COMP), Tnet (PULL + PUSH)
        and the iteration time, and the machine count they were measured at.
        A change of machine count restarts the averages. Also the epoch's
        shape, for the queue replay (:mod:`harmony.sched.replay`):
        iterations per epoch, the evaluation's seconds (``end_cpu``) and,
        from ``wall`` (seconds since the previous epoch's report), the rest
        of the epoch's end (``end_other``: barrier, sums, report)."""
        iters = max(1.0, float(timings.get("iters", 1.0)))
        sample = {"t_cpu": timings.get("comp", 0.0) / iters,
                  "t_net": (timings.get("pull", 0.0) + timings.get("push", 0.0)) / iters,
                  "t_iter": timings.get("train", 0.0) / iters,
                  # data bytes pulled + pushed per iteration by one machine
                  "bytes": timings.get("bytes", 0.0) / iters}
        if "train_cpu" in timings and "comp_cpu" in timings:
            # the CPU its COMM costs the machine: the executor's CPU while
            # training (all its threads) less its COMP thread's
            sample["comm_cpu"] = max(0.0, timings["train_cpu"] - timings["comp_cpu"]) / iters
        p = self.profile
        fresh = not p or p.get("machines") != machines
        if fresh and p and p.get("samples", 0) >= 2 and "t_cpu" in p:
            # the COMP measured at the DoP it leaves: with the new one it
            # tells the part that does not shrink with more machines
            # (model.fixed_part)
            p["cpu_prev"] = [int(p["machines"]), float(p["t_cpu"])]
        for k, v in sample.items():
            p[k] = v if fresh or k not in p else (1 - weight) * p[k] + weight * v
        # the last COMP_KEPT samples of COMP at this machine count, for its
        # lowest (Profile.t_cpu_low)
        recent = [] if fresh else list(p.get("cpu_recent", []))
        p["cpu_recent"] = (recent + [sample["t_cpu"]])[-COMP_KEPT:]
        p["machines"] = machines
        p["link"] = float(timings.get("link", 0.0))   # bytes/s of its machines' links
        # per-iteration time outside COMP and COMM (queue grants, the
        # synchronizer's round trips), measured only while it runs alone: in a
        # group that time also holds its waits for the other jobs' subtasks
        if alone:
            o = max(0.0, sample["t_iter"] - sample["t_cpu"] - sample["t_net"])
            p["overhead"] = o if fresh or "overhead" not in p else \
                (1 - weight) * p["overhead"] + weight * o
            end = {"end_cpu": float(timings.get("eval", 0.0))}
            if wall is not None:
                end["end_other"] = max(0.0, wall - timings.get("train", 0.0) - end["end_cpu"])
            for k, v in end.items():
                p[k] = v if fresh or k not in p else (1 - weight) * p[k] + weight * v
        elif "end_cpu" not in p and "eval_cpu" in timings:
            # never measured alone yet: the evaluation's CPU seconds (its wall
            # time in a group holds its waits for the others' subtasks)
            p["end_cpu"] = float(timings["eval_cpu"])
        p["iters"] = iters
        p["samples"] = 1 if fresh else p.get("samples", 0) + 1

    def sched_profile(self, need: int = 1) -> Profile | None:
        """The job's profile as the scheduler sees it, from the moving
        averages ``update_profile`` keeps of its executors' reports: the one
        place the master makes a :class:`~harmony.sched.model.Profile`.
        None until ``need`` epochs are measured at its current machine count.

        ``remote`` is its bytes per iteration over its link rate (0: no link
        measured); ``cpu_fixed`` is fitted from the COMP measured at the
        machine count it left (``model.fixed_part``; 0: none);
        ``t_cpu_low`` the lowest of its last ``COMP_KEPT`` COMP samples there
        (0 until two). The last one
        made is kept (beside the record's fields, so it is not saved) and
        given again while the averages are unchanged: a view is built on
        every scheduling pass."""
        p = self.profile
        if not p or p.get("samples", 0) < need:
            return None
        t_cpu = float(p["t_cpu"])
        link = p.get("link", 0.0)
        prev = p.get("cpu_prev")
        key = (t_cpu, float(p["t_net"]), max(1, int(p["machines"])),
               float(p.get("bytes", 0.0) / link) if link > 0 else 0.0,
               float(p.get("overhead", 0.0)), float(p.get("iters", 0.0)),
               float(p.get("end_cpu", 0.0)), float(p.get("end_other", 0.0)),
               float(fixed_part(int(prev[0]), float(prev[1]), int(p["machines"]), t_cpu))
               if prev else 0.0, float(p.get("comm_cpu", 0.0)),
               min(t_cpu, float(min(recent))) if len(recent := p.get("cpu_recent", ())) >= 2
               else 0.0)
        last = self.__dict__.get("_sched_profile")
        if last is not None and last[0] == key and last[1].id == self.id:
            return last[1]
        prof = Profile(self.id, *key)
        self.__dict__["_sched_profile"] = (key, prof)
        return prof

    def event(self, now: float, state: str, note: str) -> None:
        """Add a line to the job's story (``harmony status JOB --events``),
        keeping its first event and the latest ``EVENTS_KEPT`` - 1: a job
        that is paused and moved for weeks keeps a bounded record."""
        self.events.append([now, state, note[:2000]])
        if len(self.events) > EVENTS_KEPT:
            cut = len(self.events) - EVENTS_KEPT
            del self.events[1:1 + cut]
            self.events_dropped += cut

    def transition(self, new: JobState, note: str = "", now: float | None = None) -> None:
        now = time.time() if now is None else now
        if new not in _ALLOWED.get(self.state, set()):
            raise TransitionError(f"job {self.id}: {self.state.value} -> {new.value} not allowed")
        self.state_time[self.state.value] = self.state_time.get(self.state.value, 0.0) \
            + (now - self.entered)
        self.entered = now
        self.state = new
        self.event(now, new.value, note)
        if new.active and self.started is None:
            self.started = now
        if new.terminal:
            self.ended = now

    def summary(self, now: float | None = None) -> dict[str, Any]:
        now = time.time() if now is None else now
        last = self.epochs[-1] if self.epochs else {}
        return {"id": self.id, "name": self.name or self.app_name, "app": self.app_name,
                "state": self.state.value, "machines": self.machines,
                "workers": self.workers, "epochs": len(self.epochs),
                "objective": last.get("metrics", {}).get("objective"),
                "submitted": self.submitted, "started": self.started, "ended": self.ended,
                "error": self.error, "group": self.group, "profile": self.profile,
                "sched_group": self.sched_group, "predicted_iter": self.predicted,
                "in_state": now - self.entered}   # a finished job: since it ended

    def retained(self, now: float, retention: float) -> bool:
        """Whether the live views (``harmony jobs``, the dashboard, per-job
        metrics) still show it: a job that is not over, or one that ended
        less than ``retention`` seconds ago (0: always)."""
        return (not self.state.terminal or retention <= 0 or self.ended is None
                or now - self.ended <= retention)

    def epoch_budget(self) -> int:
        """The epochs its app runs at most: its ``--max-epochs`` argument, or
        the runtime's default (``harmony.app.COMMON_OPTIONS``)."""
        return declared_epochs(self.args)

    def epochs_left(self) -> int:
        """Epochs it may still run: its budget less the epochs it has done
        (over all attempts). An upper bound: its app may stop sooner (a
        target objective, the scheduler)."""
        done = int(self.epochs[-1].get("epoch", len(self.epochs) - 1)) + 1 if self.epochs else 0
        return max(0, self.epoch_budget() - done)

    def detail(self, now: float | None = None, max_epochs: int | None = None) -> dict[str, Any]:
        now = time.time() if now is None else now
        d = self.summary(now)
        st = dict(self.state_time)
        if not self.state.terminal:
            st[self.state.value] = st.get(self.state.value, 0.0) + (now - self.entered)
        shown = self.epochs if max_epochs is None else self.epochs[-max_epochs:]
        d.update({"args": self.args, "attempt": self.attempt, "launches": self.launches,
                  "failures": self.failures, "epochs": shown,
                  "store": self.store, "setups": self.setups,
                  "epochs_total": len(self.epochs), "reason": self.reason,
                  "checkpoint": dict(self.checkpoint, age=now - self.checkpoint["time"])
                  if self.checkpoint else None, "ckpt_skipped": self.ckpt_skipped,
                  "move": self.move, "layout": self.layout, "cruise": self.cruise,
                  "events": self.events, "events_dropped": self.events_dropped,
                  "state_time": st,
                  "elapsed": ((self.ended or now) - self.started) if self.started else 0.0})
        return d

    def to_record(self) -> dict[str, Any]:
        """The durable record, without the epochs (stored one row each): they
        are left out before the deep copy, not after it (a copy of every
        epoch row took the master 60 ms per save of a 100-epoch job, at
        every checkpoint, while the job's executors waited for its answers)."""
        shallow = copy.copy(self)
        shallow.epochs = []
        d = asdict(shallow)
        d["state"] = self.state.value
        return d

    @classmethod
    def from_record(cls, d: dict[str, Any]) -> "Job":
        """A job from its durable record; raises ValueError/TypeError on a
        damaged one (the job table quarantines it)."""
        if not isinstance(d, dict):
            raise TypeError(f"a job record is a map, not {type(d).__name__}")
        d = dict(d)
        d["state"] = JobState(d["state"])
        for name, typ in _RECORD_TYPES.items():
            if name in d and d[name] is not None and (
                    not isinstance(d[name], typ) or (typ is int and isinstance(d[name], bool))):
                raise TypeError(f"job record field {name!r} is {type(d[name]).__name__}")
        if not all(isinstance(a, str) for a in d.get("args", [])):
            raise TypeError("job record field 'args' holds a non-string")
        if "launches" not in d:      # a record of an older master: every launch was an attempt
            d["launches"] = d.get("attempt", 0)
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in known})


SETUPS_KEPT = 16
#: COMP samples (epochs) a profile keeps at its machine count for the lowest
#: of them (``Profile.t_cpu_low``): on the dilated 8-machine bench a COMP ran
#: 30-55% over its usual for 2-4 epochs at a time while other jobs started
#: and ended; 8 epochs mostly hold a clean one (once, 8 in a row ran high)
COMP_KEPT = 8
EVENTS_KEPT = 200

_RECORD_TYPES: dict[str, Any] = {
    "setups": list,
    "id": str, "app_name": str, "app_source": str, "args": list, "machines": int,
    "name": str, "submitted": (int, float), "started": (int, float), "ended": (int, float),
    "workers": list, "attempt": int, "failures": int, "launches": int, "epochs": list,
    "error": str, "events": list, "events_dropped": int, "state_time": dict, "entered": (int, float), "group": str,
    "reason": str, "profile": dict, "resume": dict, "ckpt_every": int,
    "ckpt_seconds": (int, float), "checkpoint": dict, "ckpt_skipped": str, "move": dict, "layout": dict, "held": bool,
    "cruise": dict,
    "sched_group": str, "predicted": (int, float), "store": dict,
    "deadline": (int, float), "utility": str}
