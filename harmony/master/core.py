"""The master's state machine, without I/O: ``handle(event, now) -> commands``.

:class:`MasterCore` owns everything the master decides: the job table and
each job's lifecycle and attempts, the worker table with liveness and
reconcile, the scheduler adapter (the cluster view built from state, the
policy's decisions applied, the pause-in-flight rule), the subtask
synchronizer with its ordering and priorities, epoch barriers and sums,
checkpoints, live resizes and the staged-data catalog.

It never touches a socket, a file or the wall clock. Every call gets the
time as ``now`` and returns the commands its shell carries out, in order:

- :class:`Send`: a message to one peer (``to``: its ZeroMQ identity). The
  shell encodes it (``harmony.comm.messages.encode`` checks the schema). If
  it cannot be delivered and ``fail`` is set, the shell hands ``fail`` (an
  event) back to :meth:`MasterCore.handle`.
- :class:`Persist`: a job-table write, ``getattr(JobDB, op)(*args)``.
- :class:`Admit`: a submitted job that needs a number and a strict write
  before it exists; the shell answers with :class:`Admitted` or
  :class:`AdmitFailed`.
- :class:`Record`: one line of the run record (``machines``, ``jobs``,
  ``decisions``).

Events: :class:`Received` (a decoded message and its sender's role),
:class:`Malformed` (a message that failed to decode), :class:`Tick` (the
shell's timer: liveness checks and the scheduler run on it),
:class:`Admitted` / :class:`AdmitFailed` and :class:`Unreachable` (a send
that failed). The real master (:mod:`harmony.master.server`) and the
simulator (:mod:`harmony.sim.engine`) drive this same class.
"""
from __future__ import annotations

import logging
import math
import secrets
import signal
import statistics
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from harmony import dilation as dil
from harmony.comm import messages as M
from harmony.cruise.plan import MAX_MOVES   # a resize's concurrent block moves
from harmony.master.jobs import MAX_ATTEMPTS, SETUPS_KEPT, Job, JobState
from harmony.policies import registry as R
from harmony.policies import view as P
from harmony.policies.curves import Utility
from harmony.sched.model import fixed_part
from harmony.store import staging

log = logging.getLogger("harmony.master")

_ACTIVE = frozenset(s for s in JobState if s.active)   # a set lookup on hot paths

HEARTBEAT_INTERVAL = 1.0
LAUNCH_GRACE = 3.0          # s: a launched executor shows up in heartbeats by then
LIVENESS_EVERY = 0.25       # s between liveness checks (on ticks)
MAX_STATUS_EPOCHS = 1000    # epochs returned by a status request
# finished jobs whose final checkpoint (their model, for harmony model get) is
# kept, the most recently finished first; older ones are dropped
KEEP_MODELS = 20
MAX_APP_SOURCE = M.MAX_APP_SOURCE
MAX_EXECUTORS = 1024        # job executors a daemon may report in one heartbeat
#: an epoch's timings are those of its slowest (largest) machine, but for
#: these: summed over the job's machines (the job's PS bytes pulled, pushed)
SUMMED_TIMINGS = frozenset({"bytes_pull", "bytes_push"})


# -- commands (core -> shell) ---------------------------------------------------------
@dataclass(slots=True)
class Send:
    to: bytes
    type: str
    fields: dict[str, Any]
    fail: Any = None          # the event to hand back if it cannot be delivered


@dataclass(slots=True)
class Persist:
    op: str                   # a JobDB method: save, save_epoch, trim_epochs, ...
    args: tuple


@dataclass(slots=True)
class Admit:
    ident: bytes              # who submitted it (the reply goes there)
    job: Job                  # without its id yet


@dataclass(slots=True)
class Record:
    stream: str               # machines | jobs | decisions | predictions
    obj: dict[str, Any]


@dataclass(slots=True)
class Solve:
    """Pure work too slow for the event loop (Cruise's MILP, up to seconds):
    the shell runs ``fn()`` wherever it likes and hands back
    :class:`Solved` with the same ``key``."""
    key: tuple
    fn: Any


# -- events (shell -> core) -------------------------------------------------------------
@dataclass(slots=True)
class Received:
    ident: bytes
    msg: M.Message
    role: str = ""            # with keys: client | reader | worker ("" unknown)
    name: str = ""            # the key's name (a worker's machine name)


@dataclass(slots=True)
class Malformed:
    ident: bytes
    error: str


@dataclass(slots=True)
class Tick:
    pass


@dataclass(slots=True)
class Admitted:
    ident: bytes
    job: Job                  # numbered and on disk


@dataclass(slots=True)
class AdmitFailed:
    ident: bytes
    error: str


@dataclass(slots=True)
class Solved:
    key: tuple
    result: Any = None
    error: str | None = None  # fn raised: why


@dataclass(slots=True)
class Unreachable:
    worker: str
    job: str
    attempt: int
    why: str


def _msg(mtype: str, **fields: Any) -> tuple[str, dict[str, Any]]:
    return (mtype, fields)


def _err(code: str, message: str) -> tuple[str, dict[str, Any]]:
    return ("error", {"code": code, "message": message})

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


def _note_setup(job: Job, msg: M.Message) -> None:
    """Keep an executor's start-up (seconds, CPU seconds) on its job."""
    wall, cpu = msg.get("setup_s"), msg.get("setup_cpu")
    if isinstance(wall, (int, float)) and isinstance(cpu, (int, float)) \
            and math.isfinite(wall) and math.isfinite(cpu):
        job.setups = (job.setups + [[round(float(wall), 4), round(float(cpu), 4)]])[-SETUPS_KEPT:]


class MasterCore:
    """See the module docstring. ``jobs`` and ``datasets``: the job table and
    the data catalog as loaded (the shell owns their storage)."""

    # message type -> the roles that may send it (with keys)
    CLIENT_ONLY = {"submit", "cancel", "pause", "resume", "resize", "data_plan",
                   "data_commit", "data_rm", "model_parts"}
    READ_ONLY = {"list_jobs", "job_status", "cluster_info", "data_list"}
    DAEMON = {"register", "heartbeat", "exec_exited", "data_copied"}

    def __init__(self, jobs: dict[str, Job] | None = None,
                 datasets: dict[str, dict] | None = None, *,
                 heartbeat_timeout: float = 5.0, launch_timeout: float = 300.0,
                 policy: str | None = None, mode: str = "naive",
                 max_jobs_per_machine: int = 0, secure: bool = False,
                 keep_models: int = KEEP_MODELS, endpoint: str = "", pid: int = 0,
                 revision: str | None = None, state_dir: str = "",
                 now: float = 0.0, liveness_every: float = LIVENESS_EVERY,
                 cruise: bool = False, max_moves: int = MAX_MOVES,
                 predict_epochs: bool = False, dilation: float = 1.0) -> None:
        # time dilation (harmony.dilation): ``now`` is in undilated seconds
        # already (the shell's clock); D is what daemons must run at
        self.dilation = dil.check(dilation)
        # record the policy's prediction of every job's next epoch at each
        # epoch report (the runtime's run record; the simulator skips the cost)
        self.predict_epochs = predict_epochs
        # Cruise inside running jobs: roles and partitions from measurements
        self.cruise = cruise
        if max_moves < 0:
            raise ValueError("--max-moves must be >= 0 (0: no limit)")
        # a resize's block moves in flight at once, over the whole job (0: all)
        self.max_moves = max_moves
        if mode not in R.MODES:
            raise ValueError(f"unknown mode {mode!r}; choose from {sorted(R.MODES)}")
        if max_jobs_per_machine < 0:
            raise ValueError("--max-jobs-per-machine must be >= 0 (0: no limit)")
        if keep_models < 0:
            raise ValueError("--keep-models must be >= 0")
        policy = policy or R.MODES[mode][0]
        if policy not in R.POLICIES:
            raise ValueError(f"unknown policy {policy!r}; choose from {sorted(R.POLICIES)}")
        self.mode = mode
        self.max_jobs = max_jobs_per_machine
        self.keep_models = keep_models
        self.queued = R.MODES[mode][1]
        self.policy_name = policy
        self.policy = R.make(policy)
        self.secure = secure            # peers are authenticated: check roles
        self.heartbeat_timeout = heartbeat_timeout
        self.launch_timeout = launch_timeout
        self.endpoint, self.pid, self.revision = endpoint, pid, revision
        self.state_dir = state_dir      # named in errors only
        self.now = now
        self.jobs: dict[str, Job] = dict(jobs or {})
        self.datasets: dict[str, dict] = dict(datasets or {})
        self.snapshots: set[str] = set()   # jobs a fresh model export waits for
        # job -> machines that may hold parts of its checkpoints (since this
        # master started; a job not in it: any machine may)
        self._ckpt_at: dict[str, set[str]] = {}
        # seconds the last live moves took, from the decision to their end:
        # the job stalls for part of it, and the machines are in transit
        # (decisions, and so new jobs' launches, wait for a move in flight)
        self._move_took: deque[float] = deque(maxlen=20)
        self._arrivals: deque[float] = deque(maxlen=10)     # the last submission times
        self.workers: dict[str, Worker] = {}
        self.by_ident: dict[bytes, str] = {}            # daemon ident -> worker name
        self.exec_ident: dict[bytes, tuple[str, int, int]] = {}
        self.runs: dict[str, Run] = {}
        self._ended: list[P.JobView] = []   # completions the scheduler has not seen yet
        self._last_predicted: dict[str, float] = {}
        self.ends = 0                       # jobs that left their machines (ended or requeued)
        # job -> ``ends`` when it was paused because a machine ran out of memory:
        # it waits until some job leaves its machines (memory frees), not volatile
        # across restarts (a restarted master retries it at once)
        self.mem_wait: dict[str, int] = {}
        self._dirty = True
        self._last_check = float("-inf")
        self.liveness_every = liveness_every
        self.bad_messages = 0
        self.decisions = 0
        self._said: dict[str, list] = {}    # rate-limited log lines: key -> [t0, n]
        self._peer: tuple[str, str] = ("", "")
        self._out: list = []
        self._handlers: dict[str, Any] = {}     # message type -> its bound _on_ handler
        # job -> [epochs list, epochs summed, iterations done, progress points] (_job_view)
        self._progress: dict[str, list] = {}
        self._worker_views: dict[str, P.WorkerView] = {}     # _view's last one per machine

    # -- the one entry point -----------------------------------------------------------------
    def handle(self, event: Any, now: float) -> list:
        """Apply one event at time ``now``; returns the commands to carry out."""
        self.now = now
        kind = type(event)
        if kind is Received:
            self._dispatch(event)
        elif kind is Tick:
            if now - self._last_check >= self.liveness_every:
                self._last_check = now
                try:
                    self._check_liveness(now)
                except Exception:   # a bug here must not stop the master either
                    log.exception("the liveness check failed")
            if self._dirty:
                self._dirty = False
                try:
                    self._schedule()
                except Exception:   # a policy bug must not stop the master
                    log.exception("the scheduler failed; its decision is skipped")
        elif kind is Malformed:
            self.bad_messages += 1
            self._say("malformed", "malformed message from %r: %s", event.ident[:64], event.error)
            self._send(event.ident, _err("bad_message", event.error))
        elif kind is Admitted:
            self._admitted(event.ident, event.job)
        elif kind is AdmitFailed:
            self._say("table_full", "submission refused: %s", event.error)
            self._send(event.ident, _err("table_full", f"{event.error}; the job was not submitted "
                                                       f"(free space in {self.state_dir} and "
                                                       f"submit again)"))
        elif kind is Unreachable:
            self._unreachable(event)
        elif kind is Solved:
            self._solved(event)
        else:
            raise TypeError(f"unknown event {event!r}")
        out, self._out = self._out, []
        return out

    def recover(self, now: float) -> list:
        """Jobs that were active when the last master stopped go back to the
        queue: they restart from their last pause checkpoint if they have
        one, else from epoch 0; nothing is silently dropped. Paused jobs stay
        paused (their checkpoints are on disk)."""
        self.now = now
        for job in self.jobs.values():
            if job.state.active:
                where = (f"epoch {job.resume['epoch']} (its last checkpoint)" if job.resume
                         else "epoch 0")
                # its run was stopped: that counts as a failed attempt, but a
                # master restart alone never makes a job give up
                job.failures = min(job.failures + 1, MAX_ATTEMPTS - 1)
                job.transition(JobState.WAITING, f"master restarted; requeued (restarts from "
                                                 f"{where})", now=now)
                job.workers = []
                self._persist("save", job)
        out, self._out = self._out, []
        return out

    # -- outputs -----------------------------------------------------------------------------
    def _send(self, ident: bytes, payload: tuple[str, dict], fail: Any = None) -> None:
        self._out.append(Send(ident, payload[0], payload[1], fail))

    def _persist(self, op: str, *args: Any) -> None:
        self._out.append(Persist(op, args))

    def _record(self, stream: str, obj: dict[str, Any]) -> None:
        self._out.append(Record(stream, obj))

    def _dispatch(self, ev: Received) -> None:
        ident, msg = ev.ident, ev.msg
        try:
            handler = self._handlers[msg.type]
        except KeyError:
            handler = self._handlers[msg.type] = getattr(self, "_on_" + msg.type, None)
        if handler is None:
            self.bad_messages += 1
            self._send(ident, _err("unexpected", f"the master does not accept {msg.type!r}"))
            return
        self._peer = ("", "")
        if self.secure:
            self._peer = role, name = ev.role, ev.name
            allowed = (role == "client" if msg.type in self.CLIENT_ONLY else
                       role in ("client", "reader") if msg.type in self.READ_ONLY else
                       role == "worker")     # daemons and their executors
            if msg.type == "register" and name != msg["name"]:
                allowed = False
            if not allowed:
                self.bad_messages += 1
                log.warning("%s refused from %s %r", msg.type, role or "an unknown key", name)
                self._send(ident, _err("forbidden", f"{msg.type!r} is not allowed for "
                                                    f"this key"))
                return
        try:
            handler(ident, msg)
        except Exception as exc:  # a handler bug must not kill the master
            log.exception("error handling %s", msg.type)
            self._send(ident, _err("internal", f"{exc.__class__.__name__}: {exc}"))

    def _say(self, key: str, fmt: str, *args: Any, every: float = 10.0, burst: int = 20) -> None:
        """A warning that a flood could repeat: at most ``burst`` lines per
        ``every`` seconds for ``key``, then one line with the count left out."""
        now = self.now
        t0, n = self._said.get(key, (now, 0))
        if now - t0 >= every:
            if n > burst:
                log.warning("(%d more %s warning(s) in %.0fs not logged)", n - burst, key,
                            now - t0)
            t0, n = now, 0
        self._said[key] = [t0, n + 1]
        if n < burst:
            log.warning(fmt, *args)

    # -- clients -----------------------------------------------------------------
    def _on_submit(self, ident: bytes, msg: M.Message) -> None:
        # The master never compiles or runs an app's source: the client checks
        # it before sending and the executors load it. Only its size is bounded.
        src = msg["app_source"]
        if len(src) > MAX_APP_SOURCE or len(src.encode("utf-8", "surrogatepass")) > MAX_APP_SOURCE:
            return self._send(ident, _err("bad_app", "app file larger than 4 MiB"))
        if not 1 <= msg["machines"] <= 100_000:
            return self._send(ident, _err("bad_request", "--machines must be in 1..100000"))
        if not all(isinstance(a, str) for a in msg["args"]):
            return self._send(ident, _err("bad_request", "app args must be strings"))
        missing = [n for n in staging.refs(msg["args"]) if n not in self.datasets]
        if missing:
            return self._send(ident, _err("unknown_data", f"no staged data set "
                                                             f"{missing[0]!r} ('harmony data "
                                                             f"ls' lists them)"))
        every, secs = msg.get("checkpoint_every"), msg.get("checkpoint_seconds")
        if (every is not None and every < 0) or (secs is not None and secs < 0):
            return self._send(ident, _err("bad_request", "checkpoint intervals must be >= 0"))
        # a job is accepted only once its record is on disk (the shell numbers
        # it and writes it strictly, then answers Admitted or AdmitFailed);
        # while the table cannot be written new jobs are refused, never half kept
        deadline, utility = msg.get("deadline"), msg.get("utility") or ""
        if deadline is not None and not (math.isfinite(deadline) and deadline > 0):
            return self._send(ident, _err("bad_request", "a deadline must be > 0 seconds"))
        if utility:
            try:
                utility = Utility.parse(utility).spec()
            except ValueError as exc:
                return self._send(ident, _err("bad_request", str(exc)))
        job = Job(id="", app_name=msg["app_name"], app_source=src, args=list(msg["args"]),
                  machines=msg["machines"], name=msg.get("name") or "",
                  group=msg.get("group") or "", submitted=self.now, entered=self.now,
                  deadline=None if deadline is None else self.now + float(deadline),
                  utility=utility)
        if every is not None:
            job.ckpt_every = int(every)
        if secs is not None:
            job.ckpt_seconds = float(secs)
        job.events.append([job.submitted, "waiting", "submitted"])
        self._out.append(Admit(ident, job))

    def _admitted(self, ident: bytes, job: Job) -> None:
        self.jobs[job.id] = job
        self._ckpt_at[job.id] = set()        # new: no machine holds its parts yet
        self._arrivals.append(self.now)
        self._dirty = True
        log.info("submitted %s (%s, %d machine(s))", job.id, job.app_name, job.machines)
        self._send(ident, _msg("submitted", job=job.id))

    def _on_list_jobs(self, ident: bytes, msg: M.Message) -> None:
        jobs = [j.summary(now=self.now) for j in sorted(self.jobs.values(), key=lambda j: j.id)]
        self._send(ident, _msg("jobs", jobs=jobs))

    def _on_job_status(self, ident: bytes, msg: M.Message) -> None:
        job = self.jobs.get(msg["job"])
        if job is None:
            return self._send(ident, _err("unknown_job", f"no job {msg['job']!r}"))
        d = job.detail(now=self.now, max_epochs=MAX_STATUS_EPOCHS)
        d.update(self._group_prediction(job))
        d["why"] = self._why(job)
        d["dilation"] = self.dilation       # its times are undilated seconds
        self._send(ident, _msg("status", job=d))

    def _why(self, job: Job) -> str:
        """Why a job runs where it runs, in words (``harmony status``)."""
        if not job.state.active:
            return job.reason
        on = ", ".join(job.workers)
        if job.state == JobState.PROFILING:
            p = job.profile
            done = p.get("samples", 0) if p.get("machines") == len(job.workers) else 0
            return (f"profiling on {on}, {min(done, P.PROFILE_SAMPLES)} of "
                    f"{P.PROFILE_SAMPLES} epochs")
        mates = sorted(j.id for j in self.jobs.values() if j is not job and j.state.active
                       and set(j.workers) & set(job.workers))
        if job.sched_group and job.predicted:
            group = [j for j in self.jobs.values() if j.state.active
                     and j.sched_group == job.sched_group]
            others = sorted(j.id for j in group if j is not job)
            alone = [j.profile.get("t_cpu", 0.0) + j.profile.get("t_net", 0.0) for j in group]
            if not others:
                return (f"{self.policy_name}: alone in {job.sched_group} on {on}; predicted "
                        f"iteration {job.predicted:.3f}s")
            gain = (f": predicted {sum(alone) / job.predicted - 1:+.0%} throughput over "
                    f"running them one after another" if all(alone) else "")
            return (f"{self.policy_name}: grouped with {', '.join(others)} in "
                    f"{job.sched_group} on {on}{gain}")
        share = f", sharing with {', '.join(mates)}" if mates else ""
        return f"placed by {self.policy_name or 'the policy'} on {on}{share}"

    def _group_prediction(self, job: Job) -> dict[str, Any]:
        """The scheduler's predicted iteration time of the job in its group
        and the measured one (its moving average)."""
        if not job.sched_group or job.predicted is None or not job.state.active:
            return {}
        measured = job.profile.get("t_iter")
        if not measured:
            return {}
        return {"measured_iter": measured,
                "prediction_error": abs(job.predicted - measured) / measured}

    def _on_cancel(self, ident: bytes, msg: M.Message) -> None:
        job = self.jobs.get(msg["job"])
        if job is None:
            return self._send(ident, _err("unknown_job", f"no job {msg['job']!r}"))
        if job.state.terminal:
            return self._send(ident, _err("not_active", f"{job.id} is already {job.state.value}"))
        self._end(job, JobState.CANCELLED, "cancelled by user")
        self._send(ident, _msg("ok", info={"job": job.id, "state": job.state.value}))

    def _on_pause(self, ident: bytes, msg: M.Message) -> None:
        job = self.jobs.get(msg["job"])
        if job is None:
            return self._send(ident, _err("unknown_job", f"no job {msg['job']!r}"))
        if not job.state.active or job.id not in self.runs:
            return self._send(ident, _err("not_active", f"{job.id} is {job.state.value}, "
                                                           f"not running"))
        if self.runs[job.id].reconfig is not None:
            return self._send(ident, _err("busy", f"{job.id} is being resized; pause it "
                                                     f"when the move is done"))
        self.pause_job(job, None, "paused by user", held=True)
        self._send(ident, _msg("ok", info={"job": job.id, "state": "pausing"}))

    def _on_resume(self, ident: bytes, msg: M.Message) -> None:
        job = self.jobs.get(msg["job"])
        if job is None:
            return self._send(ident, _err("unknown_job", f"no job {msg['job']!r}"))
        if job.state not in (JobState.PAUSED, JobState.PROFILED):
            return self._send(ident, _err("not_paused", f"{job.id} is {job.state.value}, "
                                                           f"not paused"))
        machines = msg.get("machines")
        if machines is not None:
            if not 1 <= machines <= 100_000:
                return self._send(ident, _err("bad_request", "--machines must be in 1..100000"))
            job.machines = machines
        job.transition(JobState.WAITING, "resume requested by user", now=self.now)
        job.held = False
        self._persist("save", job)
        self._dirty = True
        self._send(ident, _msg("ok", info={"job": job.id, "state": job.state.value}))

    def pause_job(self, job: Job, to: list[str] | None, note: str, held: bool = False) -> None:
        """Pause ``job`` at its next epoch end: every executor checkpoints
        its model shard and input state and exits; with ``to``, the job then
        resumes on those machines (a migration). A ``held`` job stays paused
        until the user resumes it."""
        run = self.runs.get(job.id)
        if run is None or run.stopping or run.ending or not job.state.active \
                or run.reconfig is not None:
            return
        run.pausing, run.pause_to, run.pause_note = True, to, note
        job.held = held
        log.info("pausing %s at its next epoch end%s", job.id,
                 f", then resuming on {to}" if to else "")

    def end_early(self, job: Job, note: str) -> bool:
        """Ask a running job to stop at its next epoch end (a scheduler's
        early stop, e.g. MLF-C): its executors take the same path as the
        app's own stop (final checkpoint, exit) and the job ends FINISHED
        with the objective it has reached. False when it is not running (or
        already stopping, pausing or resizing)."""
        run = self.runs.get(job.id)
        if run is None or job.state != JobState.RUNNING or run.stopping or run.pausing \
                or run.ending or run.reconfig is not None:
            return False
        run.ending = note
        job.events.append([self.now, job.state.value, f"stops at its next epoch end: {note}"])
        log.info("%s stops early at its next epoch end: %s", job.id, note)
        return True

    def _on_exec_paused(self, ident: bytes, msg: M.Message) -> None:
        jr = self._exec_run(ident, msg)
        if jr is None:
            return
        job, run = jr
        if not run.pausing or msg["attempt"] != run.attempt:
            return self._end(job, JobState.FAILED, "an executor paused without being asked")
        run.paused[msg["index"]] = (msg["epoch"], msg["version"], msg.get("bytes") or 0)
        run.replicas[msg["index"]] = msg.get("replica")
        if len(run.paused) < len(job.workers):
            return
        epochs = {e for e, _, _ in run.paused.values()}
        if len(epochs) != 1:
            return self._end(job, JobState.FAILED, f"executors paused at different epochs "
                                                   f"{sorted(epochs)}")
        epoch = epochs.pop()
        self.runs.pop(job.id, None)
        for i in run.idents.values():
            self.exec_ident.pop(i, None)
        old = list(job.workers)
        self._checkpointed(job, epoch, {i: (old[i], run.replicas.get(i), run.paused[i][2])
                                        for i in range(len(old))})
        job.workers = []
        target = JobState.PROFILED if job.state == JobState.PROFILING and run.pause_to is None \
            and not job.held else JobState.PAUSED
        job.transition(target, f"{run.pause_note}; checkpointed after epoch {epoch} on "
                               f"{', '.join(old)}", now=self.now)
        self._persist("save", job)
        self._dirty = True
        log.info("%s %s after epoch %d", job.id, target.value, epoch)
        if run.pause_to:
            live = [n for n in run.pause_to if n in self.workers and self.workers[n].alive]
            if len(live) == len(run.pause_to):
                self._launch(job, live)

    def _on_cluster_info(self, ident: bytes, msg: M.Message) -> None:
        ws = [{"name": w.name, "host": w.host, "cpus": w.cpus, "memory": w.memory,
               "alive": w.alive, "last_seen": w.last_seen, "revision": w.revision or None,
               "jobs": [j.id for j in self._jobs_on(w.name)],
               "utilization": w.stats[-1] if w.stats else {}}
              for w in sorted(self.workers.values(), key=lambda w: w.name)]
        self._send(ident, _msg("cluster", workers=ws, master={
            "endpoint": self.endpoint, "pid": self.pid, "bad_messages": self.bad_messages,
            "mode": self.mode, "revision": self.revision or None, "dilation": self.dilation}))

    # -- worker daemons --------------------------------------------------------------
    def _on_register(self, ident: bytes, msg: M.Message) -> None:
        name = msg["name"]
        if float(msg.get("dilation") or 1.0) != self.dilation:
            return self._send(ident, _err("bad_dilation", f"this master runs at dilation "
                                          f"{self.dilation:g}, worker {name} at "
                                          f"{msg.get('dilation') or 1:g}: start it with "
                                          f"--dilation {self.dilation:g}"))
        old = self.workers.get(name)
        if old is not None and old.ident != ident:
            self.by_ident.pop(old.ident, None)
        w = Worker(name, ident, msg["host"], msg["cpus"], msg["memory"], msg["pid"], self.now,
                   data_endpoint=msg.get("data_endpoint") or "", revision=msg.get("revision") or "")
        self.workers[name] = w
        self.by_ident[ident] = name
        log.info("worker %s registered (%s, %d cpus, %.1f GiB)", name, w.host, w.cpus,
                 w.memory / 2**30)
        self._send(ident, _msg("registered", heartbeat_interval=HEARTBEAT_INTERVAL))
        self._reconcile(w, msg["executors"])
        self._dirty = True

    def _on_heartbeat(self, ident: bytes, msg: M.Message) -> None:
        name = self.by_ident.get(ident)
        w = self.workers.get(name) if name else None
        if w is None or not w.alive:
            return self._send(ident, _err("unknown_worker", "register first"))
        w.last_seen = self.now
        self._send(ident, _msg("hb_ack"))
        st = msg.get("stats")
        if st is not None:
            # known keys with finite numbers only (M.clean_stats): what is kept
            # per worker and logged is bounded whatever a daemon sends
            clean = M.clean_stats(st)
            if clean is None:
                self._say("stats", "worker %s: heartbeat stats refused (not a map of at most "
                          "%d known numbers)", w.name, M.MAX_STATS_ENTRIES)
            elif "dt" in clean:
                if self.dilation != 1.0:    # on the master's (undilated) clock
                    clean["t"] = self.now
                w.stats.append(clean)
                self._record("machines", {"machine": w.name, **clean})
        executors = msg["executors"]
        if len(executors) > MAX_EXECUTORS:
            self._say("executors", "worker %s reports %d executors; only the first %d are "
                      "reconciled", w.name, len(executors), MAX_EXECUTORS)
            executors = executors[:MAX_EXECUTORS]
        self._reconcile(w, executors)

    def _reconcile(self, w: Worker, executors: list) -> None:
        """Kill executors a daemon runs for jobs that are not running there,
        and requeue jobs that should run there but whose executor is gone
        (e.g. the daemon restarted), after a grace period for launches."""
        reported = {j for j in executors if isinstance(j, str)}
        for jid in reported:
            job = self.jobs.get(jid)
            run = self.runs.get(jid)
            joining = run.reconfig.join if run is not None and run.reconfig else []
            if job is None or not job.state.active or (w.name not in job.workers
                                                       and w.name not in joining):
                self._send(w.ident, _msg("kill", job=jid))
        now = self.now
        for job in self._jobs_on(w.name):
            run = self.runs.get(job.id)
            if job.id not in reported and run is not None and not run.stopping \
                    and not run.pausing and now - run.launched > LAUNCH_GRACE:
                self._retry_or_fail(job, f"its executor on worker {w.name} is gone")

    def _on_exec_exited(self, ident: bytes, msg: M.Message) -> None:
        if ident not in self.by_ident:
            return      # only a registered daemon reports its executors
        name = self.by_ident.get(ident, "?")
        job = self.jobs.get(msg["job"])
        run = self.runs.get(msg["job"]) if job is not None else None
        if run is not None and run.reconfig and name in run.reconfig.join \
                and msg["attempt"] == run.attempt and job.state.active:
            tail = msg["log_tail"].strip()
            return self._retry_or_fail(job, f"the executor joining on {name} exited with code "
                                            f"{msg['code']} during a resize"
                                            + (f"; its log ends with:\n{tail}" if tail else ""))
        if job is None or not job.state.active or name not in job.workers:
            return
        if run is not None and msg["attempt"] != run.attempt:
            return  # a late report about an earlier attempt
        code = msg["code"]
        if run is not None and msg["index"] in run.finished:
            return
        if code == 0 and run is not None and run.pausing:
            return  # its exec_paused is on the way (another path)
        if code == 0 and run is not None and run.stopping:
            # a clean exit after the stop decision: as good as exec_finished
            return self._finish_index(job, run, msg["index"])
        how = f"signal {-code}" if code < 0 else f"code {code}"
        tail = msg["log_tail"].strip()
        what = f"executor {msg['index']} on worker {name} exited with {how}"
        if code in (-signal.SIGKILL, -signal.SIGTERM) and "out of memory" not in tail:
            # killed from outside (not by the app, not by the OOM guard): a
            # fault of the machine, not of the job; it resumes from its last
            # checkpoint, and this counts as a failed attempt
            return self._retry_or_fail(job, what)
        self._end(job, JobState.FAILED, what + (f"; its log ends with:\n{tail}" if tail else ""))

    def _check_liveness(self, now: float) -> None:
        for w in self.workers.values():
            if w.alive and now - w.last_seen > self.heartbeat_timeout:
                w.alive = False
                log.warning("worker %s stopped sending heartbeats", w.name)
                self._rereplicate(w.name)
                for job in self._jobs_on(w.name):
                    self._retry_or_fail(job, f"worker {w.name} lost (no heartbeat for "
                                             f"{now - w.last_seen:.1f}s)")
                self._dirty = True
        for jid, run in list(self.runs.items()):
            job = self.jobs[jid]
            if not run.started and now - run.launched > self.launch_timeout:
                self._retry_or_fail(job, f"executors not ready after {self.launch_timeout:.0f}s")
            elif run.reconfig and now - run.reconfig.t0 > self.launch_timeout:
                self._retry_or_fail(job, f"resize not done after {self.launch_timeout:.0f}s")
            elif run.reconfig and any(not self.workers[m].alive for m in run.reconfig.join
                                      if m in self.workers):
                self._retry_or_fail(job, "a machine joining the job was lost during a resize")

    def _active(self) -> Iterator[Job]:
        """The active jobs, in launch order. Every active job has a run
        (launched, executors not yet ended; the core tests assert it), so
        the runs are scanned, not every job ever submitted (at 1,000 jobs
        that scan, per epoch report, was the simulator's largest cost)."""
        jobs, active = self.jobs, _ACTIVE
        return (j for j in map(jobs.get, self.runs) if j is not None and j.state in active)

    def _placed(self) -> dict[str, list[Job]]:
        """Machine name -> the active jobs placed on it (one pass; order
        within a machine: launch order)."""
        out: dict[str, list[Job]] = {}
        for j in self._active():
            for n in j.workers:
                out.setdefault(n, []).append(j)
        return out

    def _jobs_on(self, name: str) -> list[Job]:
        return [j for j in self.jobs.values() if j.state.active and name in j.workers]

    # -- scheduling ------------------------------------------------------------------------
    def _schedule(self) -> None:
        live = [w for w in self.workers.values() if w.alive]
        self._memory_pressure(live)
        for jid, at in list(self.mem_wait.items()):
            j = self.jobs.get(jid)
            pausing = j is not None and j.id in self.runs and self.runs[j.id].pausing
            if j is None or j.held or self.ends > at or not (j.state == JobState.PAUSED
                                                              or pausing):
                del self.mem_wait[jid]
            elif j.state == JobState.PAUSED:
                j.reason = "paused: a machine ran out of memory; waits for a job to end"
        if self.policy.preempts and (
                not live or any(r.pausing or r.reconfig for r in self.runs.values())):
            return      # _schedule_full's rule, before the queue is sorted for nothing
        waiting = sorted((j for j in self.jobs.values()
                          if j.id not in self.mem_wait and (j.state == JobState.WAITING or (
                              j.state in (JobState.PAUSED, JobState.PROFILED) and not j.held))),
                         key=lambda j: (j.submitted, j.id))
        if self.policy.preempts:
            return self._schedule_full(live, waiting)
        # a start-only policy (least-loaded, isolated): it only starts waiting jobs
        self._ended = []
        for job in waiting:
            job.reason = "no live workers" if not live else ""
        if not waiting or not live:
            return
        # a job larger than the live cluster waits without blocking the others
        waiting = [j for j in waiting if j.machines <= len(live)] + \
            [j for j in waiting if j.machines > len(live)]
        view = self._view(live, waiting)
        dec = self.policy.decide(view)
        start = dec.start
        load = {w.name: w.jobs for w in view.workers}
        for machines in start.values():
            for n in machines:
                load[n] += 1
        room = sum(1 for n in load.values() if not self.max_jobs or n < self.max_jobs)
        for job in waiting:
            job.reason = (f"needs {job.machines} machines; {len(live)} alive"
                          if job.machines > len(live) else
                          f"machines full ({self.max_jobs} jobs each, --max-jobs-per-machine)"
                          if job.id not in start and job.machines > room else "")
        for jid, machines in start.items():
            self._launch(self.jobs[jid], machines)
        if start:               # the run record holds every policy's decisions
            self._log_decision(dec)

    def _memory_pressure(self, live: list[Worker]) -> None:
        """Act on the block store's "pause me": a machine over its pause
        threshold with everything spilled (``pause_wanted`` in an executor's
        store stats of the latest epoch). The youngest job there leaves it:
        moved live to an idle machine if there is one, else paused until a
        job ends. A job alone on its machine is left to the OOM guard."""
        asks: dict[str, list[Job]] = {}
        for job in self._active():
            if not job.store:
                continue
            last = len(job.epochs) - 1
            for m, st in job.store.items():
                if st.get("pause_wanted") and st.get("epoch", -1) >= last and m in job.workers:
                    asks.setdefault(m, []).append(job)
        # the asker named: the first submitted there
        want = {m: min(js, key=lambda j: (j.submitted, j.id)).id for m, js in asks.items()}
        if not want:
            return
        placed = self._placed()
        busy = {n for n, js in placed.items() if js}
        idle = sorted(w.name for w in live if w.name not in busy)
        for m, asker in sorted(want.items()):
            here = [j for j in placed.get(m, ()) if j.state.active]
            if len(here) < 2:
                continue
            victim = max(here, key=lambda j: (j.started or 0.0, j.id))
            run = self.runs.get(victim.id)
            if run is None or run.pausing or run.reconfig is not None or run.stopping:
                continue
            why = (f"memory: machine {m} is over its pause threshold with everything "
                   f"spilled ({asker} asked)")
            if idle:
                to = [idle.pop(0) if n == m else n for n in victim.workers]
                if self.resize_job(victim, to, f"{why}; moves to {', '.join(to)}"):
                    continue
            self.pause_job(victim, None, f"{why}; waits for a job there to end")
            self.mem_wait[victim.id] = self.ends

    def _view_profile(self, job: Job, need: int) -> tuple[float, ...] | None:
        p = job.profile
        if not p or p.get("samples", 0) < need:
            return None
        link = p.get("link", 0.0)
        remote = p.get("bytes", 0.0) / link if link > 0 else 0.0
        prev = p.get("cpu_prev")
        fixed = (fixed_part(int(prev[0]), float(prev[1]), int(p["machines"]), p["t_cpu"])
                 if prev else 0.0)
        return (p["t_cpu"], p["t_net"], int(p["machines"]), remote, p.get("overhead", 0.0),
                p.get("iters", 0.0), p.get("end_cpu", 0.0), p.get("end_other", 0.0), fixed)

    def _job_view(self, j: Job, **kw: Any) -> P.JobView:
        """What every policy sees of a job: its request, state, profile, where
        it runs, its progress (iterations done, objective) after its last
        ``P.PROGRESS_POINTS`` epochs, and its deadline and utility if any."""
        # the points are summed up incrementally: a view is built on every
        # scheduling pass, and a job's epochs list only grows (a launch
        # replaces it); the cache holds the list it summed, so a new list
        # starts over
        epochs = j.epochs
        c = self._progress.get(j.id)
        if c is None or c[0] is not epochs or c[1] > len(epochs):
            c = [epochs, 0, 0.0, []]
            self._progress[j.id] = c
        _, seen, done, progress = c
        for e in epochs[seen:] if seen else epochs:
            done += float((e.get("timings") or {}).get("iters") or 1.0)
            obj = (e.get("metrics") or {}).get("objective")
            if isinstance(obj, (int, float)) and math.isfinite(obj):
                progress.append((done, float(obj)))
        if len(progress) > 2 * P.PROGRESS_POINTS:
            del progress[:-P.PROGRESS_POINTS]
        c[1], c[2] = len(epochs), done
        return P.JobView(j.id, j.machines, j.submitted, j.group, state=j.state.value,
                         workers=tuple(j.workers), sched_group=j.sched_group,
                         epochs=len(epochs), epochs_left=j.epochs_left(),
                         steady=int((j.profile or {}).get("samples", 0)),
                         progress=tuple(progress[-P.PROGRESS_POINTS:]),
                         deadline=j.deadline, utility=j.utility, **kw)

    def _view(self, live: list[Worker], waiting: list[Job]) -> P.ClusterView:
        placed = self._placed()
        active = sorted(self._active(), key=lambda j: (j.submitted, j.id))
        # a machine's view is rebuilt only when it changed (views are frozen,
        # so the last one is reused: on a large cluster most machines keep theirs)
        cache = self._worker_views
        workers = []
        for w in sorted(live, key=lambda w: w.name):
            here = placed.get(w.name)
            n, groups = (len(here), tuple(sorted({j.group for j in here if j.group}))) \
                if here else (0, ())
            v = cache.get(w.name)
            if v is None or v.jobs != n or v.groups != groups or v.cpus != w.cpus \
                    or v.memory != w.memory:
                v = cache[w.name] = P.WorkerView(w.name, w.cpus, w.memory, n, groups)
            workers.append(v)
        return P.ClusterView(
            workers=tuple(workers),
            waiting=tuple(self._job_view(j, profile=self._view_profile(j, 1)) for j in waiting),
            active=tuple(self._job_view(
                j, profile=self._view_profile(j, P.PROFILE_SAMPLES if j.state ==
                                              JobState.PROFILING else 1)) for j in active),
            finished=tuple(self._ended), max_jobs=self.max_jobs, now=self.now,
            move_cost=statistics.median(self._move_took) if self._move_took else 0.0,
            arrival_gap=self._arrival_gap())

    def _arrival_gap(self) -> float:
        """Seconds until the next job is expected: the mean gap between the
        recent submissions, or the time since the last one if that is longer
        (0: fewer than two submissions seen)."""
        a = self._arrivals
        if len(a) < 2:
            return 0.0
        return max((a[-1] - a[0]) / (len(a) - 1), self.now - a[-1])

    def _note_ended(self, job: Job) -> None:
        """An active job leaves its group: the Harmony policy's completion event."""
        self.ends += 1
        if job.state.active and job.workers:
            self._ended.append(P.JobView(job.id, job.machines, job.submitted, state="finished",
                                         profile=self._view_profile(job, 1),
                                         workers=tuple(job.workers),
                                         sched_group=job.sched_group))

    def _schedule_full(self, live: list[Worker], waiting: list[Job]) -> None:
        """A policy that may start, profile, pause, move and promote jobs
        (harmony, muri, slaq): its decisions wait while a pause or a resize
        is still in flight, then the whole decision is applied."""
        if not live or any(r.pausing or r.reconfig for r in self.runs.values()):
            return
        dec = self.policy.decide(self._view(live, waiting))
        self._ended = []
        for job in waiting:
            if job.state == JobState.WAITING:
                job.reason = dec.wait.get(job.id, "")
        if not (dec.profile or dec.start or dec.pause or dec.promote or dec.stop):
            self._set_predictions(dec)
            if dec.predicted and dec.predicted != self._last_predicted:
                # e.g. a group lost a finished job: the run record must hold
                # the prediction the groups now run under
                self._log_decision(dec)
            return
        for jid, ms in dec.profile.items():
            self._launch(self.jobs[jid], ms, JobState.PROFILING)
        for jid in dec.promote:
            job = self.jobs[jid]
            job.transition(JobState.RUNNING, f"profiled; stays in {dec.assign.get(jid, '?')} on "
                                             f"{', '.join(job.workers)}", now=self.now)
            self._persist("save", job)
        for jid, to in dec.pause.items():
            job = self.jobs[jid]
            who = "regrouped" if self.policy_name == "harmony" else self.policy_name
            why = (f"{who}: moves to {', '.join(to)}" if to else
                   "profiled; waits for a group" if job.state == JobState.PROFILING else
                   f"{who}: waits")
            # a move of a running job is a live resize (its blocks move over
            # the network); a pause and a resume elsewhere only if not possible
            if not (to and self.resize_job(job, list(to), why)):
                self.pause_job(job, to, why)
        for jid, why in dec.stop.items():
            if jid not in dec.pause:
                self.end_early(self.jobs[jid], f"{self.policy_name}: {why}")
        for jid, ms in dec.start.items():
            self._launch(self.jobs[jid], ms)
        self._set_predictions(dec)
        self._log_decision(dec)
        log.info("scheduler: %s (profile %s, start %s, pause/move %s, promote %s, stop %s)",
                 dec.note, sorted(dec.profile), sorted(dec.start), sorted(dec.pause),
                 dec.promote, sorted(dec.stop))

    def _predict_next(self, job: Job) -> None:
        """Record the policy's prediction of ``job``'s next epoch (seconds per
        iteration: training, and the whole epoch over its iterations) from the
        profiles as they are now, beside the jobs that share its machines;
        none while one of them has no profile yet."""
        predict = self.policy.predict
        if predict is None:
            return
        mine = set(job.workers)
        mates = [j for j in self._active() if j is job or not mine.isdisjoint(j.workers)]
        views = {j.id: self._view_profile(j, 1) for j in mates}
        if any(v is None for v in views.values()):
            return
        try:
            pred = predict(views, len(job.workers)).get(job.id)
        except Exception:       # a model bug must not stop the master
            log.exception("predicting %s's next epoch failed", job.id)
            return
        if pred:
            self._record("predictions", {"t": self.now, "job": job.id,
                                         "epoch": job.epochs[-1]["epoch"] + 1,
                                         "jobs": sorted(views), "predicted": pred[0],
                                         "predicted_epoch": pred[1]})

    def _log_decision(self, dec: P.Decision) -> None:
        self._last_predicted = dict(dec.predicted)
        self.decisions += 1
        self._record("decisions", {
            "t": self.now, "note": dec.note, "util": dec.util, "profile": dec.profile,
            "start": dec.start, "pause": dec.pause, "promote": dec.promote,
            "assign": dec.assign, "predicted": dec.predicted,
            **({"predicted_jobs": dec.predicted_jobs} if dec.predicted_jobs else {}),
            **({"stop": dec.stop} if dec.stop else {})})

    def _set_predictions(self, dec: P.Decision) -> None:
        for jid, g in dec.assign.items():
            self.jobs[jid].sched_group = g
        if dec.predicted:
            for job in self.jobs.values():
                if not job.state.terminal and job.sched_group in dec.predicted:
                    job.predicted = dec.predicted_jobs.get(job.id,
                                                           dec.predicted[job.sched_group])

    def _launch(self, job: Job, machines: list[str], state: JobState = JobState.RUNNING) -> None:
        # every launch gets a new number (it tags the executors, their
        # messages and PS requests); only failures start a new attempt
        job.launches += 1
        job.attempt = job.failures + 1
        job.workers = list(machines)
        self._may_hold_parts(job.id, machines)    # its executors write parts there
        if job.resume:
            # resume: keep the epochs up to the checkpoint, drop any later
            # ones (an attempt that failed after it), in one transaction
            keep = job.resume["epoch"]
            if len(job.epochs) > keep:
                job.epochs = job.epochs[:keep]
                self._persist("trim_epochs", job.id, keep)
        else:
            job.epochs = []
            self._persist("clear_epochs", job.id)
        job.store = {}
        job.error = None
        how = f" (resumes at epoch {job.resume['epoch']})" if job.resume else ""
        job.transition(state, f"attempt {job.attempt} on {', '.join(machines)}{how}"
                       + (f" (launch {job.launches})" if job.launches != job.attempt else ""), now=self.now)
        self.runs[job.id] = Run(job.launches, self.now)
        self._persist("save", job)
        log.info("launching %s attempt %d (launch %d) on %s", job.id, job.attempt,
                 job.launches, machines)
        resume = self._resume_sources(job)
        datasets = self._datasets_for(job)
        for idx, name in enumerate(machines):
            self._send(self.workers[name].ident, _msg(
                "launch", job=job.id, index=idx, count=len(machines), app_name=job.app_name,
                app_source=job.app_source, args=job.args, attempt=job.launches,
                resume=resume, datasets=datasets, secret=self.runs[job.id].secret),
                fail=Unreachable(name, job.id, job.launches, "at launch"))

    def _unreachable(self, ev: Unreachable) -> None:
        """A launch could not be sent: the machine is taken as lost (at
        launch) and the job tries again elsewhere."""
        w = self.workers.get(ev.worker)
        if w is not None and ev.why == "at launch":
            w.alive = False
            self._dirty = True
        job, run = self.jobs.get(ev.job), self.runs.get(ev.job)
        if job is not None and run is not None and run.attempt == ev.attempt \
                and job.state.active:
            self._retry_or_fail(job, f"worker {ev.worker} unreachable {ev.why}")

    def _datasets_for(self, job: Job) -> dict | None:
        """The catalog entries of the data sets a job reads (harmony://NAME),
        with the data services of the live machines holding each chunk."""
        out = {}
        for name in staging.refs(job.args):
            rec = self.datasets.get(name)
            if rec is None:
                continue     # removed since: the executor fails naming it
            out[name] = {"name": name, "filename": rec["filename"], "chunks": [
                {"i": c["i"], "sha": c["sha"], "sources": [
                    [h, self.workers[h].data_endpoint] for h in c["holders"]
                    if h in self.workers and self.workers[h].alive]}
                for c in rec["chunks"]]}
        return out or None

    # -- staged input ---------------------------------------------------------------
    def _on_data_plan(self, ident: bytes, msg: M.Message) -> None:
        try:
            name = staging.check_name(msg["name"])
        except staging.StagingError as exc:
            return self._send(ident, _err("bad_request", str(exc)))
        if name in self.datasets:
            return self._send(ident, _err("exists", f"data set {name!r} exists; 'harmony "
                                                       f"data rm {name}' first"))
        live = sorted((w for w in self.workers.values() if w.alive and w.data_endpoint),
                      key=lambda w: w.name)
        if not live:
            return self._send(ident, _err("no_workers", "no live worker to hold the data"))
        n = msg["chunks"]
        if not 0 <= n <= M.MAX_DATA_CHUNKS:     # its catalog record must reach the master
            return self._send(ident, _err("bad_request", f"a data set has at most "
                                                            f"{M.MAX_DATA_CHUNKS} chunks"))
        holders = []
        for i in range(n):
            hs = [live[i % len(live)]] + ([live[(i + 1) % len(live)]] if len(live) > 1 else [])
            holders.append([[w.name, w.data_endpoint] for w in hs])
        self._send(ident, _msg("data_placement", holders=holders))

    def _on_data_commit(self, ident: bytes, msg: M.Message) -> None:
        try:
            name = staging.check_name(msg["name"])
            chunks = [{"i": int(c["i"]), "sha": bytes(c["sha"]), "size": int(c["size"]),
                       "first_line": int(c["first_line"]),
                       "holders": [str(h) for h in c["holders"]]} for c in msg["chunks"]]
        except (staging.StagingError, KeyError, TypeError, ValueError) as exc:
            return self._send(ident, _err("bad_request", f"bad data set record: {exc}"))
        if name in self.datasets:      # as data_plan: never a silent replacement
            return self._send(ident, _err("exists", f"data set {name!r} exists; 'harmony "
                                                       f"data rm {name}' first"))
        unknown = sorted({h for c in chunks for h in c["holders"]} - set(self.workers))
        why = (f"unknown holder(s) {unknown[:5]}" if unknown else
               "chunks are not numbered 0..n-1" if [c["i"] for c in chunks] !=
               list(range(len(chunks))) else
               "a chunk without a holder, a SHA-256 or a size" if any(
                   not c["holders"] or len(c["sha"]) != 32 or c["size"] < 0 for c in chunks)
               else "")
        if why:
            return self._send(ident, _err("bad_request", f"bad data set record: {why}"))
        rec = {"name": name, "filename": msg["filename"].replace("\\", "/").rsplit("/", 1)[-1],
               "size": msg["size"], "chunks": chunks, "created": self.now}
        self.datasets[name] = rec
        self._persist("save_dataset", rec)
        log.info("data set %s staged: %d chunk(s), %d bytes", name, len(chunks), msg["size"])
        self._send(ident, _msg("ok", info={"name": name, "chunks": len(chunks)}))

    def _on_data_list(self, ident: bytes, msg: M.Message) -> None:
        out = []
        for rec in sorted(self.datasets.values(), key=lambda r: r["name"]):
            holders = sorted({h for c in rec["chunks"] for h in c["holders"]})
            alive = {h for h in holders if h in self.workers and self.workers[h].alive}
            lost = sum(1 for c in rec["chunks"] if not alive & set(c["holders"]))
            copies = min((len(alive & set(c["holders"])) for c in rec["chunks"]), default=0)
            out.append({"name": rec["name"], "filename": rec["filename"], "size": rec["size"],
                        "chunks": len(rec["chunks"]), "holders": holders,
                        "unavailable_chunks": lost, "min_copies": copies,
                        "created": rec["created"]})
        self._send(ident, _msg("datasets", datasets=out))

    def _rereplicate(self, lost: str) -> None:
        """A worker holding staged chunks was lost: copy each of its chunks
        from a live holder to another live worker, so two copies remain."""
        live = sorted(w.name for w in self.workers.values() if w.alive and w.data_endpoint)
        for rec in self.datasets.values():
            plan: dict[tuple[str, str], list[int]] = {}
            for c in rec["chunks"]:
                if lost not in c["holders"]:
                    continue
                have = [h for h in c["holders"] if h in live]
                spare = [n for n in live if n not in c["holders"]]
                if not have or not spare:
                    continue
                to = spare[c["i"] % len(spare)]
                plan.setdefault((have[0], to), []).append(c["i"])
            for (src, to), chunks in plan.items():
                self._send(self.workers[src].ident, _msg(
                    "data_copy", name=rec["name"], chunks=chunks, to=to,
                    endpoint=self.workers[to].data_endpoint))
                log.info("data set %s: copying %d chunk(s) %s -> %s (%s lost)", rec["name"],
                         len(chunks), src, to, lost)

    def _on_data_copied(self, ident: bytes, msg: M.Message) -> None:
        if ident not in self.by_ident:
            return
        rec = self.datasets.get(msg["name"])
        if rec is None:
            return
        if not msg["ok"]:
            log.warning("data set %s: re-replication to %s failed: %s", msg["name"], msg["to"],
                        msg.get("error"))
            return
        want = {int(i) for i in msg["chunks"]}
        for c in rec["chunks"]:
            if c["i"] in want and msg["to"] not in c["holders"]:
                c["holders"] = [h for h in c["holders"] if h in self.workers
                                and self.workers[h].alive] + [msg["to"]]
        self._persist("save_dataset", rec)

    def _on_data_rm(self, ident: bytes, msg: M.Message) -> None:
        if msg["name"] not in self.datasets:
            return self._send(ident, _err("unknown_data", f"no data set {msg['name']!r}"))
        readers = sorted(j.id for j in self.jobs.values() if not j.state.terminal
                         and msg["name"] in staging.refs(j.args))
        if readers:
            # a paused or requeued job reads its input again when it resumes
            return self._send(ident, _err("in_use", (
                f"data set {msg['name']!r} is read by job(s) {', '.join(readers[:10])}"
                f"{' and more' if len(readers) > 10 else ''}: cancel them or wait until "
                f"they end, then remove it")))
        rec = self.datasets.pop(msg["name"])
        self._persist("drop_dataset", rec["name"])
        gc = _msg("data_gc", name=rec["name"])
        for w in self.workers.values():
            if w.alive:
                self._send(w.ident, gc)
        self._send(ident, _msg("ok", info={"name": rec["name"]}))

    def _resume_sources(self, job: Job) -> dict | None:
        """The job's checkpoint as a launch sees it: every part with the data
        services of the live machines that hold it (the part's own machine
        and its replica)."""
        if not job.resume:
            return None
        parts = []
        for part in job.resume["parts"]:
            srcs = [[h, self.workers[h].data_endpoint] for h in part["holders"]
                    if h in self.workers and self.workers[h].alive
                    and self.workers[h].data_endpoint]
            parts.append({"index": part["index"], "epoch": part["epoch"], "sources": srcs})
        return {"epoch": job.resume["epoch"], "parts": parts}

    def _replica_alts(self, machines: list[str], replicas: list) -> list:
        """Per executor, up to 2 more live machines to replicate its part on
        when its replica machine cannot take it (fewest parts placed first)."""
        placed = self._placed()
        live = sorted((len(placed.get(w.name, ())), w.name) for w in self.workers.values()
                      if w.alive and w.data_endpoint)
        out = []
        for name, rep in zip(machines, replicas):
            skip = {name, rep[0] if rep else None}
            out.append([[m, self.workers[m].data_endpoint] for _, m in live
                        if m not in skip][:2])
        return out

    def _replicas(self, machines: list[str]) -> list:
        """Where each executor's checkpoint part is replicated: the next
        machine of the job, or, for a job on one machine, another live one
        (none: the part is kept on its own machine only)."""
        out = []
        for i, name in enumerate(machines):
            if len(machines) > 1:
                other = machines[(i + 1) % len(machines)]
            else:
                placed = self._placed()
                others = sorted((len(placed.get(w.name, ())), w.name)
                                for w in self.workers.values()
                                if w.alive and w.name != name and w.data_endpoint)
                other = others[0][1] if others else None
            w = self.workers.get(other) if other else None
            out.append([other, w.data_endpoint] if w is not None else None)
        return out

    def _checkpointed(self, job: Job, epoch: int, parts: dict[int, tuple]) -> None:
        """Every part of the checkpoint after ``epoch`` (and its replica) is
        acknowledged: it is the job's resume point now, and older parts on
        the machines can go. ``parts``: index -> (machine, replica, bytes)."""
        job.resume = {"epoch": epoch + 1, "parts": [
            {"index": i, "epoch": epoch, "holders": [m] + ([r] if r else [])}
            for i, (m, r, _) in sorted(parts.items())]}
        job.checkpoint = {"epoch": epoch, "time": self.now,
                          "parts": len(parts),
                          "replicas": sum(1 for _, r, _ in parts.values() if r),
                          "bytes": int(sum(b for _, _, b in parts.values())),
                          "holders": sorted({h for m, r, _ in parts.values()
                                             for h in (m, r) if h})}
        self._persist("save", job)
        self._gc_checkpoints(job.id, epoch, job.checkpoint["holders"])
        self.snapshots.discard(job.id)      # a fresh model export has its checkpoint

    def _gc_checkpoints(self, job_id: str, keep: int | None,
                        holders: list[str] | None = None) -> None:
        """Tell machines to drop the job's checkpoint parts older than
        ``keep``, or all of them (None: the job ended or its final model is
        dropped). Only the machines that may hold parts are told: those the
        job ran on, those named as its replica targets (so a part whose
        write never finished goes too) and those that acknowledged a part,
        since this master started; every live machine when it does not know
        (after a restart). A periodic checkpoint (``keep``, with the
        machines that hold it: ``holders``) leaves the kept holders and any
        machine not reached as possible holders. At 1,000 machines, telling
        every machine at every checkpoint was the simulator's largest single
        cost."""
        fields = {"job": job_id, "keep": keep}
        out = self._out.append
        known = self._ckpt_at.get(job_id)
        told = set()
        for name in self.workers if known is None else sorted(known):
            w = self.workers.get(name)
            if w is not None and w.alive:
                out(Send(w.ident, "ckpt_gc", fields))
                told.add(name)
        if keep is None:
            self._ckpt_at.pop(job_id, None)
        else:     # what may hold parts now: the kept ones, and machines not told
            self._ckpt_at[job_id] = set(holders or ()) | ((known or set()) - told)

    def _may_hold_parts(self, job_id: str, machines) -> None:
        known = self._ckpt_at.get(job_id)
        if known is not None:
            known.update(m for m in machines if m)

    def _kill_executors(self, job: Job) -> None:
        run = self.runs.pop(job.id, None)
        joining = run.reconfig.join if run is not None and run.reconfig else []
        for name in list(job.workers) + joining:
            w = self.workers.get(name)
            if w is not None and w.alive:
                self._send(w.ident, _msg("kill", job=job.id))
        if run is not None:
            for ident in list(run.idents.values()) + (
                    list(run.reconfig.idents.values()) if run.reconfig else []):
                self.exec_ident.pop(ident, None)
            job.move = None

    def _end(self, job: Job, state: JobState, note: str) -> None:
        if job.state.terminal:
            return
        self._kill_executors(job)
        if state == JobState.FAILED:
            job.error = note
        self._note_ended(job)
        job.transition(state, note, now=self.now)
        job.resume = None
        self._gc_checkpoints(job.id, None)
        self.snapshots.discard(job.id)
        self._persist("save", job)
        self._dirty = True
        log.info("%s %s: %s", job.id, state.value, note.splitlines()[0] if note else "")

    def _retry_or_fail(self, job: Job, reason: str) -> None:
        if job.state.terminal:
            return
        # a failure: the next launch is a new attempt (pauses, moves and
        # resumes are launches, not attempts: they never count here)
        if job.failures + 1 >= MAX_ATTEMPTS:
            return self._end(job, JobState.FAILED,
                             f"{reason}; gave up after {job.failures + 1} attempts")
        job.failures += 1
        self._kill_executors(job)
        self._note_ended(job)
        job.transition(JobState.WAITING, f"{reason}; requeued", now=self.now)
        job.workers = []
        self._persist("save", job)
        self._dirty = True
        log.warning("%s requeued: %s", job.id, reason)

    # -- job executors ----------------------------------------------------------------------
    def _machine_ok(self, job: Job, run: Run | None, index: int) -> bool:
        """With keys: the sender is the worker the executor ``index`` runs
        on (or joins, during a resize)."""
        if not self.secure:
            return True
        role, name = self._peer
        if role != "worker":
            return False
        machines = list(job.workers)
        if run is not None and run.reconfig:
            machines += run.reconfig.join
            if 0 <= index < len(run.reconfig.to) and run.reconfig.to[index] == name:
                return True
        return 0 <= index < len(job.workers) and job.workers[index] == name

    def _exec_run(self, ident: bytes, msg: M.Message) -> tuple[Job, Run] | None:
        f = msg.fields
        jid = f["job"]
        key = self.exec_ident.get(ident)
        job = self.jobs.get(jid)
        run = self.runs.get(jid)
        if key is None or job is None or run is None or key[0] != jid or key[1] != f["index"] \
                or key[2] != run.attempt or job.state not in _ACTIVE \
                or (self.secure and self._peer[0] != "worker"):
            self._send(ident, _msg("abort", reason=f"job {jid} is not running here"))
            return None
        return job, run

    def _all_idents(self, run: Run) -> list[bytes]:
        return [run.idents[i] for i in sorted(run.idents)]

    def _on_exec_ready(self, ident: bytes, msg: M.Message) -> None:
        job = self.jobs.get(msg["job"])
        run = self.runs.get(msg["job"])
        if job is not None and not self._machine_ok(job, run, msg["index"]):
            return self._send(ident, _msg("abort", reason="not an executor of that job"))
        if msg.get("join"):
            rc = run.reconfig if run is not None else None
            name = self.by_ident.get(ident)
            idx = msg["index"]
            if job is None or rc is None or msg["attempt"] != run.attempt \
                    or not (0 <= idx < len(rc.to)) or rc.to[idx] not in rc.join:
                return self._send(ident, _msg("abort", reason=f"job {msg['job']} is not "
                                                                  f"being resized onto here"))
            name = rc.to[idx]
            rc.ready[name] = dict(msg.fields)
            rc.idents[name] = ident
            _note_setup(job, msg)
            self.exec_ident[ident] = (job.id, idx, run.attempt)
            log.info("%s: %s ready to join (%d of %d)", job.id, name, len(rc.ready),
                     len(rc.join))
            return
        if job is None or run is None or not job.state.active \
                or msg["attempt"] != run.attempt or not (0 <= msg["index"] < len(job.workers)):
            return self._send(ident, _msg("abort", reason=f"job {msg['job']} attempt "
                                                          f"{msg['attempt']} is not running"))
        idx = msg["index"]
        run.ready[idx] = dict(msg.fields)
        run.idents[idx] = ident
        _note_setup(job, msg)
        self.exec_ident[ident] = (job.id, idx, run.attempt)
        if len(run.ready) < len(job.workers):
            return
        shapes = {(r["num_keys"], r["dim"], r["model_blocks"]) for r in run.ready.values()}
        if len(shapes) != 1:
            return self._end(job, JobState.FAILED,
                             f"executors disagree on the model (num_keys, dim, blocks): {sorted(shapes)}")
        (_, _, nblocks), = shapes
        peers = [run.ready[i]["endpoint"] for i in range(len(job.workers))]
        owner = [b % len(peers) for b in range(nblocks)]
        run.owner = owner
        job.layout = None        # every (re)start is even: roles are set by a live resize
        run.started = True
        run.last_ckpt = (job.resume["epoch"] if job.resume else 0, self.now)
        replicas = self._replicas(job.workers)
        alts = self._replica_alts(job.workers, replicas)
        self._may_hold_parts(job.id, [r[0] for r in replicas if r])
        for i in sorted(run.idents):
            self._send(run.idents[i], _msg(
                "job_start", peers=peers, owner=owner, model_blocks=nblocks,
                mode="queued" if self.queued else "free", machines=list(job.workers),
                replicas=replicas, replica_alts=alts))

    def _on_barrier(self, ident: bytes, msg: M.Message) -> None:
        jr = self._exec_run(ident, msg)
        if jr is None:
            return
        job, run = jr
        f = msg.fields
        key = (f["epoch"], f["iter"])
        arrived = run.barriers.get(key)
        if arrived is None:
            arrived = run.barriers[key] = set()
        arrived.add(f["index"])
        if len(arrived) == len(job.workers):
            del run.barriers[key]
            rel = {"epoch": key[0], "iter": key[1]}
            out = self._out.append
            for i in self._all_idents(run):
                out(Send(i, "release", rel))

    def _on_sync(self, ident: bytes, msg: M.Message) -> None:
        """The subtask synchronizer: once every machine of the job finished
        subtask ``seq``, enqueue subtask ``seq + 1`` on all of them. The
        master handles one message at a time and sends to the daemons in
        the same order, so co-located jobs' subtasks are enqueued in the
        same order on every machine of a group."""
        jr = self._exec_run(ident, msg)
        if jr is None:
            return
        job, run = jr
        f = msg.fields
        nxt, seq = f["next"], f["seq"]
        if nxt != "cpu" and nxt != "net":
            return self._end(job, JobState.FAILED, f"bad subtask kind {nxt!r}")
        got = run.syncs.get(seq)
        if got is None:
            got = run.syncs[seq] = {}
        got[f["index"]] = nxt
        if len(got) < len(job.workers):
            return
        del run.syncs[seq]
        kinds = set(got.values())
        if len(kinds) != 1:
            return self._end(job, JobState.FAILED,
                             f"executors disagree on the next subtask after {msg['seq']}: {got}")
        kind = kinds.pop()
        # the subtask's expected seconds from the job's profile: of two
        # network subtasks on a machine, the shorter leads the link
        p = job.profile
        prio = (p.get("t_cpu") if kind == "cpu" else p.get("t_net", 0.0) / 2) or 0.0
        out = _msg("enqueue", job=job.id, seq=seq + 1, kind=kind, prio=float(prio))
        workers, send = self.workers, self._out.append
        for name in job.workers:
            send(Send(workers[name].ident, "enqueue", out[1]))

    def _on_epoch_done(self, ident: bytes, msg: M.Message) -> None:
        jr = self._exec_run(ident, msg)
        if jr is None:
            return
        job, run = jr
        f = msg.fields
        ep = f["epoch"]
        if f.get("store") is not None:   # the block store's latest, per machine
            if f["store"].get("pause_wanted"):
                self._dirty = True          # _memory_pressure acts on it
            job.store[job.workers[f["index"]]] = {"epoch": ep, **{
                str(k): v for k, v in f["store"].items()
                if isinstance(v, (int, float, bool)) or (isinstance(v, str) and len(v) < 200)}}
        got = run.sums.get(ep)
        if got is None:
            got = run.sums[ep] = {}
        got[f["index"]] = (f["sums"], f["timings"])
        if len(got) < len(job.workers):
            return
        total: dict[str, float] = {}
        timings: dict[str, float] = {}
        num = (int, float)
        for i in sorted(got):
            sums, tim = got[i]
            for k, v in sums.items():
                if isinstance(v, num):
                    total[k] = total.get(k, 0.0) + v
            for k, v in tim.items():
                if isinstance(v, num):
                    v = float(v)
                    if k in SUMMED_TIMINGS:
                        timings[k] = timings.get(k, 0.0) + v
                    else:
                        w = timings.get(k)
                        # max(0.0, v) as before: the first value counts against 0.0
                        timings[k] = max(0.0 if w is None else w, v)
        if self.cruise and not run.pausing and not run.ending:
            self._cruise(job, run, {i: got[i][1] for i in got})
        del run.sums[ep]
        run.timings[ep] = timings
        rc = run.reconfig
        reconfig = bool(rc and not rc.planned and rc.all_ready() and not run.pausing)
        if reconfig:
            rc.stood_since = self.now
        end = bool(run.ending) and not run.pausing and not reconfig
        ckpt = (not run.pausing and not reconfig and not end and run.ckpt_epoch is None
                and (self._checkpoint_due(job, run, ep) or job.id in self.snapshots))
        if ckpt:
            run.ckpt_epoch, run.ckpt_parts = ep, {}
        out = {"epoch": ep, "sums": total, "pause": run.pausing or None,
               "reconfig": reconfig or None, "checkpoint": ckpt or None, "stop": end or None}
        send = self._out.append
        for i in self._all_idents(run):
            send(Send(i, "epoch_sums", out))

    def _cruise(self, job: Job, run: Run, per_index: dict[int, dict]) -> None:
        """Cruise (``--cruise``): feed the epoch's per-executor timings to the
        job's estimates and, when a better role and partition layout on its
        machines is worth its move, start it as a live reconfiguration."""
        from harmony.cruise.adapter import JobCruise
        n = len(job.workers)
        if run.reconfig is not None or job.state != JobState.RUNNING or n < 2:
            return
        if run.cruise is None or run.cruise.n != n:
            run.cruise = JobCruise(n, len(run.owner))
        run.cruise.observe(per_index)
        d_now = [int(per_index[i].get("blocks") or 0) for i in range(n)]
        m_now = [run.owner.count(i) for i in range(n)]
        if sum(d_now) == 0 or run.solving is not None:
            return
        left = max(1, len(job.epochs))
        solve = run.cruise.prepare(d_now, m_now)
        if solve is not None:      # the MILP: off the event loop, then decide
            run.solving = (solve, d_now, m_now, left)
            self._out.append(Solve((job.id, run.attempt, id(run.cruise)), solve))
            return
        self._cruise_decide(job, run, d_now, m_now, left)

    def _solved(self, ev: Solved) -> None:
        """A Cruise solve came back: decide with it, on the layout it was
        asked for, if the job still runs there."""
        jid, attempt, cruise = ev.key
        job, run = self.jobs.get(jid), self.runs.get(jid)
        if run is None or job is None or run.attempt != attempt or run.solving is None:
            return
        solve, d_now, m_now, left = run.solving
        run.solving = None
        if run.cruise is None or id(run.cruise) != cruise:
            return                 # its estimates were dropped meanwhile (a resize)
        if ev.error is not None:   # a solver failure must not stop the master
            log.error("%s: the Cruise optimizer failed: %s", jid, ev.error)
            run.cruise = None
            return
        run.cruise.accept(solve, ev.result)
        if run.reconfig is None and job.state == JobState.RUNNING:
            self._cruise_decide(job, run, d_now, m_now, left)

    def _cruise_decide(self, job: Job, run: Run, d_now: list[int], m_now: list[int],
                       left: int) -> None:
        """Cruise's decision with its last solution (never a solve here)."""
        try:
            prop = run.cruise.propose(d_now, m_now, epochs_left=left, solve_here=False)
        except Exception:          # a solver failure must not stop the master
            log.exception("%s: the Cruise optimizer failed", job.id)
            run.cruise = None
            return
        if run.cruise.view is not None:
            job.cruise = dict(run.cruise.view, at_epoch=len(job.epochs))
        if prop is None:
            return
        layout = {"input": [float(x) for x in prop.d], "model": [float(x) for x in prop.m]}
        note = f"cruise: {prop.reason}"
        if self.resize_job(job, list(job.workers), note, layout):
            run.reconfig.predicted = {"before": prop.now, "after": prop.target,
                                      "move_s": prop.move_s}
            log.info("%s: %s", job.id, note)

    def _checkpoint_due(self, job: Job, run: Run, epoch: int) -> bool:
        first, at = run.last_ckpt
        return bool((job.ckpt_every and epoch + 1 - first >= job.ckpt_every)
                    or (job.ckpt_seconds and self.now - at >= job.ckpt_seconds))

    def _on_ckpt_part(self, ident: bytes, msg: M.Message) -> None:
        jr = self._exec_run(ident, msg)
        if jr is None:
            return
        job, run = jr
        if run.ckpt_epoch != msg["epoch"]:
            return
        i = msg["index"]
        if not 0 <= i < len(job.workers):
            return
        run.ckpt_parts[i] = (job.workers[i], msg.get("replica"), msg["bytes"], msg.get("error"))
        self._may_hold_parts(job.id, run.ckpt_parts[i][:2])
        if len(run.ckpt_parts) < len(job.workers):
            return
        ep, parts = run.ckpt_epoch, run.ckpt_parts
        run.ckpt_epoch, run.ckpt_parts = None, {}
        run.last_ckpt = (ep + 1, self.now)
        errors = [f"part {k} on {p[0]}: {p[3]}" for k, p in sorted(parts.items()) if p[3]]
        if errors:
            # degrade, not fail: the job goes on and resumes, if it must,
            # from its last complete checkpoint; the next one is tried as due
            why = "; ".join(errors)
            last = job.checkpoint.get("epoch") if job.checkpoint else None
            note = (f"checkpoint after epoch {ep + 1} skipped ({why}); "
                    + (f"the last complete one is after epoch {last + 1}"
                       if last is not None else "no complete checkpoint yet"))
            job.ckpt_skipped = note
            job.events.append([self.now, job.state.value, note[:2000]])
            self._persist("save", job)
            self._dirty = True
            return self._say(f"ckpt:{job.id}", "%s: %s", job.id, note)
        job.ckpt_skipped = None
        self._checkpointed(job, ep, {k: p[:3] for k, p in parts.items()})
        log.info("%s: checkpoint after epoch %d complete (%d part(s), %d replica(s))", job.id,
                 ep, len(parts), job.checkpoint["replicas"])

    # -- live resize (block migration) ---------------------------------------------------
    def resize_job(self, job: Job, to: list[str], note: str,
                   layout: dict | None = None) -> bool:
        """Move or resize a running job onto machines ``to`` while it runs:
        executors on machines that stay keep running; machines that join get
        a new executor, which reads the input's metadata meanwhile; at the
        next epoch boundary every executor hands its leaving blocks over
        (ownership first, then data, over ZeroMQ) and the job goes on.
        ``layout`` gives the roles on ``to`` (:class:`Reconfig`); with the
        same machines and a new layout, only blocks move (a role switch)."""
        run = self.runs.get(job.id)
        to = list(dict.fromkeys(to))
        if run is None or not run.started or run.stopping or run.pausing or run.ending \
                or run.reconfig is not None or not job.state.active \
                or (to == job.workers and layout == run.layout) \
                or not to or any(n not in self.workers or not self.workers[n].alive for n in to):
            return False
        if layout is not None:
            for k in ("input", "model"):
                shares(1, len(to), layout[k])        # raises ValueError on bad weights
        join = [n for n in to if n not in job.workers]
        run.reconfig = Reconfig(to=to, join=join, note=note, t0=self.now, layout=layout)
        job.move = {"from": list(job.workers), "to": to, "state": "starting executors",
                    "blocks": 0, "blocks_moved": 0, "bytes_moved": 0}
        for n in join:
            self._send(self.workers[n].ident, _msg(
                "launch", job=job.id, index=to.index(n), count=len(to), app_name=job.app_name,
                app_source=job.app_source, args=job.args, attempt=run.attempt, join=True,
                datasets=self._datasets_for(job), secret=run.secret),
                fail=Unreachable(n, job.id, run.attempt, "when resizing"))
        job.events.append([self.now, job.state.value,
                           f"{note}: resizing {', '.join(job.workers)} -> {', '.join(to)}"])
        log.info("%s: resizing %s -> %s (%s)", job.id, job.workers, to, note)
        return True

    def _on_resize(self, ident: bytes, msg: M.Message) -> None:
        job = self.jobs.get(msg["job"])
        if job is None:
            return self._send(ident, _err("unknown_job", f"no job {msg['job']!r}"))
        n = msg["machines"]
        nw, ns = msg.get("workers"), msg.get("servers")
        layout = None
        if nw is not None or ns is not None:
            nw, ns = (n if nw is None else nw), (n if ns is None else ns)
            if not (1 <= nw <= n and 1 <= ns <= n and nw + ns >= n):
                return self._send(ident, _err(
                    "bad_request", f"--workers and --servers must be in 1..{n} and cover "
                                   f"the {n} machines (workers + servers >= {n}): the first "
                                   f"W machines hold input, the last S the model"))
            if nw < n or ns < n:
                layout = {"input": [1.0] * nw + [0.0] * (n - nw),
                          "model": [0.0] * (n - ns) + [1.0] * ns}
        placed = self._placed()
        live = sorted((w for w in self.workers.values() if w.alive),
                      key=lambda w: (len(placed.get(w.name, ())), w.name))
        if not 1 <= n <= len(live):
            return self._send(ident, _err("bad_request", f"--machines must be in "
                                                            f"1..{len(live)} (live machines)"))
        if not job.state.active or job.id not in self.runs:
            return self._send(ident, _err("not_active", f"{job.id} is {job.state.value}, "
                                                           f"not running"))
        keep = [m for m in job.workers if m in self.workers and self.workers[m].alive][:n]
        to = keep + [w.name for w in live if w.name not in keep][:n - len(keep)]
        run = self.runs[job.id]
        if to == job.workers and layout == run.layout:
            return self._send(ident, _msg("ok", info={"job": job.id, "machines": to,
                                                          "state": "unchanged"}))
        job.machines = n
        if not self.resize_job(job, to, "resized by user" if layout is None else
                               f"resized by user ({nw} worker(s), {ns} server(s))", layout):
            return self._send(ident, _err("busy", f"{job.id} cannot be resized now (it is "
                                                     f"starting, pausing, stopping or already "
                                                     f"being resized); try again"))
        self._persist("save", job)
        self._send(ident, _msg("ok", info={"job": job.id, "machines": to,
                                               "state": "resizing"}))

    def _on_at_boundary(self, ident: bytes, msg: M.Message) -> None:
        jr = self._exec_run(ident, msg)
        if jr is None:
            return
        job, run = jr
        rc = run.reconfig
        if rc is None or rc.planned:
            return self._end(job, JobState.FAILED, "an executor stopped for a resize that "
                                                   "was not asked for")
        rc.boundary[msg["index"]] = dict(msg.fields)
        if len(rc.boundary) < len(job.workers):
            return
        seqs = {b["seq"] for b in rc.boundary.values()}
        epochs = {b["epoch"] for b in rc.boundary.values()}
        if len(seqs) != 1 or len(epochs) != 1:
            return self._end(job, JobState.FAILED, f"executors reached the resize at different "
                                                   f"points (epochs {sorted(epochs)}, subtasks "
                                                   f"{sorted(seqs)})")
        self._send_migration(job, run, epochs.pop(), seqs.pop())

    def _send_migration(self, job: Job, run: Run, epoch: int, seq: int) -> None:
        """The plan of a resize: the new owner of every model and input
        block (blocks stay where they are unless their machine leaves or
        holds more than its share), sent to every executor, old and new."""
        rc = run.reconfig
        old, to = list(job.workers), rc.to
        remap = [to.index(m) if m in to else -1 for m in old]
        lay = rc.layout or {}
        model_owner = balance([remap[o] for o in run.owner], len(to), lay.get("model"))
        in_ids, in_old, holder = [], [], {}      # holder: input block -> old index
        for i in sorted(rc.boundary):
            for bid, _ in rc.boundary[i]["inputs"]:
                in_ids.append(int(bid))
                in_old.append(remap[i])
                holder[int(bid)] = i
        in_new = balance(in_old, len(to), lay.get("input"))
        rc.input_counts = [in_new.count(i) for i in range(len(to))]
        workers = len(to) if rc.layout is None else sum(1 for w in lay["input"] if w > 0)
        sends = self._plan_moves(rc, run, old, model_owner, holder, in_ids, in_new)
        expect = [0] * len(to)
        for batch in sends.values():
            for _, _, n in batch:
                expect[n] += 1
        peers = []
        for m in to:
            if m in rc.ready:
                peers.append(rc.ready[m]["endpoint"])
            else:
                peers.append(run.ready[old.index(m)]["endpoint"])
        rc.planned, rc.owner = True, model_owner
        rc.blocks = sum(len(v) for v in sends.values())
        job.move.update({"state": "moving blocks", "blocks": rc.blocks, "epoch": epoch})
        replicas = self._replicas(to)
        self._may_hold_parts(job.id, [r[0] for r in replicas if r])
        common = dict(count=len(to), peers=peers, owner=model_owner, machines=list(to),
                      seq=seq, epoch=epoch, replicas=replicas, workers=workers,
                      replica_alts=self._replica_alts(to, replicas),
                      mode="queued" if self.queued else "free")
        for i in range(len(old)):
            rc.sends[run.idents[i]] = sends[i]
            self._send(run.idents[i], _msg("migrate", index=remap[i], sends=sends[i],
                                               expect=expect[remap[i]] if remap[i] >= 0 else 0,
                                               paced=bool(sends[i]), **common))
        for m in rc.join:
            n = to.index(m)
            self._send(rc.idents[m], _msg("migrate", index=n, sends=[], expect=expect[n],
                                              **common))
        log.info("%s: moving %d block(s) after epoch %d: %s -> %s (plan: %s)", job.id,
                 rc.blocks, epoch, old, to, rc.execution.plan.counts())
        self._release_moves(job, rc)

    def _plan_moves(self, rc: Reconfig, run: Run, old: list[str], model_owner: list[int],
                    holder: dict[int, int], in_ids: list[int], in_new: list[int]
                    ) -> dict[int, list]:
        """The resize as Cruise's plan (``harmony.cruise.plan.make_plan``): add,
        switch, move and delete operations with their dependencies, executed
        by :class:`~harmony.cruise.plan.Execution` at most ``max_moves`` moves
        at once over the whole job, the most blocks first. Joiners are ready
        and ownership is handed over before the first move (add and switch
        are done when the plan starts); a machine that leaves gets ``leave``
        once every executor migrated (after its moves: delete). Returns each
        old executor's sends ([store, block, new index]), its moves' blocks."""
        from harmony.cruise.plan import DATA, Execution, Layout, make_plan
        to = rc.to
        cur = Layout(tuple(old), tuple(old[holder[b]] for b in in_ids),
                     tuple(old[o] for o in run.owner))
        tgt = Layout(tuple(to), tuple(to[n] for n in in_new),
                     tuple(to[n] for n in model_owner))
        plan = make_plan(cur, tgt)
        rc.execution = Execution(plan, self.max_moves or max(1, len(plan.moves)))
        sends: dict[int, list] = {i: [] for i in range(len(old))}
        for i, op in enumerate(plan.ops):
            if op.kind != "move":
                continue
            src, dest = old.index(op.machine), to.index(op.dest)
            batch = ([["input", in_ids[p], dest] for p in op.blocks] if op.store == DATA
                     else [["model", b, dest] for b in op.blocks])
            sends[src] += batch
            rc.moves[i] = (run.idents[src], batch)
            rc.left[run.idents[src]] = rc.left.get(run.idents[src], 0) + 1
        return sends

    def _release_moves(self, job: Job, rc: Reconfig) -> None:
        """Start every operation of the plan that may start now."""
        ex = rc.execution
        while True:
            started = ex.start()
            instant = [i for i in started if i not in rc.moves]
            for i in started:
                if i in rc.moves:
                    to, batch = rc.moves[i]
                    self._send(to, _msg("move", op=i, sends=batch))
            for i in instant:           # add, switch (done), delete (at commit)
                ex.done(i)
            if not instant:
                break
        running = sorted(i for i in ex.running if i in rc.moves)
        if job.move is not None:
            job.move.update({"ops": len(ex.plan.ops), "ops_done": len(ex.finished_ops),
                             "moves_running": [str(ex.plan.ops[i]) for i in running]})

    def _on_moved(self, ident: bytes, msg: M.Message) -> None:
        jr = self._exec_run(ident, msg)
        if jr is None:
            return
        job, run = jr
        rc = run.reconfig
        op = msg["op"]
        if rc is None or rc.execution is None or op not in rc.moves \
                or rc.moves[op][0] != ident or op not in rc.execution.running:
            return self._end(job, JobState.FAILED, f"an executor reported move {op}, which "
                                                   f"it was not sent")
        rc.execution.done(op)
        rc.left[ident] -= 1
        if not rc.left[ident]:
            self._send(ident, _msg("move", op=-1, sends=[]))
        self._release_moves(job, rc)

    def _on_migrating(self, ident: bytes, msg: M.Message) -> None:
        jr = self._exec_run(ident, msg)
        if jr is None or jr[1].reconfig is None or jr[0].move is None:
            return
        rc = jr[1].reconfig
        rc.progress[ident] = (msg["bytes_out"], msg["blocks_out"])
        jr[0].move["bytes_moved"] = int(sum(b for b, _ in rc.progress.values()))
        jr[0].move["blocks_moved"] = int(sum(n for _, n in rc.progress.values()))

    def _on_migrated(self, ident: bytes, msg: M.Message) -> None:
        jr = self._exec_run(ident, msg)
        if jr is None:
            return
        job, run = jr
        rc = run.reconfig
        if rc is None or not rc.planned:
            return self._end(job, JobState.FAILED, "an executor reported a move that was "
                                                   "not planned")
        if rc.left.get(ident):
            return self._end(job, JobState.FAILED, "an executor reported its move done "
                                                   "before the moves it was sent")
        rc.migrated[ident] = dict(msg.fields)
        rc.progress[ident] = (msg["bytes_out"], len(rc.sends.get(ident, ())))
        job.move["bytes_moved"] = int(sum(b for b, _ in rc.progress.values()))
        job.move["blocks_moved"] = int(sum(n for _, n in rc.progress.values()))
        if len(rc.migrated) < len(job.workers) + len(rc.join):
            return
        self._commit_resize(job, run)

    def _commit_resize(self, job: Job, run: Run) -> None:
        """Every block arrived: the new layout is the job's layout."""
        rc = run.reconfig
        old = list(job.workers)
        idents, ready = {}, {}
        for i, m in enumerate(rc.to):
            if m in rc.idents:
                idents[i], ready[i] = rc.idents[m], rc.ready[m]
            else:
                j = old.index(m)
                idents[i], ready[i] = run.idents[j], run.ready[j]
        for j, m in enumerate(old):
            if m not in rc.to:
                ident = run.idents[j]
                self.exec_ident.pop(ident, None)
                self._send(ident, _msg("leave"))
        for i, ident in idents.items():
            self.exec_ident[ident] = (job.id, i, run.attempt)
        run.idents, run.ready, run.owner = idents, ready, rc.owner
        run.layout = rc.layout
        run.cruise = None                 # estimates start again on the new layout
        job.layout = _layout_summary(rc.to, rc.owner, rc.input_counts, rc.layout)
        if job.layout is not None and rc.predicted:
            job.layout["cruise"] = dict(rc.predicted, at_epoch=len(job.epochs))
        run.reconfig = None
        moved = int(sum(m["bytes_out"] for m in rc.migrated.values()))
        stood = self.now - (rc.stood_since or rc.t0)
        self._move_took.append(self.now - rc.t0)
        job.workers = list(rc.to)
        # the block store's stats of machines that left would be summed with
        # the new ones (status, the trace importer's model bytes)
        job.store = {m: st for m, st in job.store.items() if m in rc.to}
        self._may_hold_parts(job.id, rc.to)
        job.move = None
        note = (f"{rc.note}: now on {', '.join(job.workers)} ({rc.blocks} block(s), "
                f"{moved / 2**20:.1f} MiB moved; took {self.now - rc.t0:.2f}s, iterations "
                f"stood {stood:.2f}s)")
        if job.state == JobState.PROFILING:
            job.transition(JobState.RUNNING, note, now=self.now)
        else:
            job.events.append([self.now, job.state.value, note])
        self._persist("save", job)
        self._dirty = True
        for i in sorted(run.idents):
            self._send(run.idents[i], _msg("reconfigured"))
        log.info("%s: %s", job.id, note)

    def _on_epoch_report(self, ident: bytes, msg: M.Message) -> None:
        jr = self._exec_run(ident, msg)
        if jr is None:
            return
        job, run = jr
        timings = run.timings.pop(msg["epoch"], {})
        job.epochs.append({"epoch": msg["epoch"], "metrics": msg["metrics"],
                           "timings": timings, "time": self.now})
        mine = set(job.workers)
        alone = not any(j is not job and not mine.isdisjoint(j.workers) for j in self._active())
        prev = job.epochs[-2] if len(job.epochs) > 1 else None
        wall = self.now - prev["time"] if prev is not None and \
            prev.get("epoch") == msg["epoch"] - 1 and "time" in prev else None
        job.update_profile(timings, len(job.workers), alone=alone, wall=wall)
        if job.profile.get("samples") in (1, P.PROFILE_SAMPLES):
            self._dirty = True   # a profile became usable: the scheduler may act
        self._persist("save_epoch", job.id, job.epochs[-1])
        self._record("jobs", {"t": self.now, "job": job.id, "epoch": msg["epoch"],
                              "workers": job.workers, "profile": job.profile,
                              "timings": timings})
        if self.predict_epochs and not msg["stop"]:
            self._predict_next(job)
        if msg["stop"]:
            run.stopping = True
            self._persist("save", job)

    def _on_ping(self, ident: bytes, msg: M.Message) -> None:
        """An executor waiting for a long time checks that its job still runs."""
        if self._exec_run(ident, msg) is not None:
            self._send(ident, _msg("pong"))

    def _on_exec_failed(self, ident: bytes, msg: M.Message) -> None:
        job, run = self.jobs.get(msg["job"]), self.runs.get(msg["job"])
        if job is not None and not self._machine_ok(job, run, msg["index"]):
            return
        if ident not in self.exec_ident and job is not None and run is not None \
                and job.state.active and msg.get("attempt") == run.attempt \
                and 0 <= msg["index"] < len(job.workers):
            # failed before it was ready (bad app options, bad input): the
            # error itself, not just a log tail, is what the user should see
            name = job.workers[msg["index"]]
            return self._end(job, JobState.FAILED,
                             f"{msg['error']} (executor {msg['index']} on {name})")
        jr = self._exec_run(ident, msg)
        if jr is None:
            return
        job, _ = jr
        name = job.workers[msg["index"]]
        self._end(job, JobState.FAILED, f"{msg['error']} (executor {msg['index']} on {name})")

    def _on_exec_finished(self, ident: bytes, msg: M.Message) -> None:
        jr = self._exec_run(ident, msg)
        if jr is None:
            return
        job, run = jr
        self._finish_index(job, run, msg["index"])

    def _finish_index(self, job: Job, run: Run, index: int) -> None:
        run.finished.add(index)
        if len(run.finished) == len(job.workers):
            if not run.stopping:
                return self._end(job, JobState.FAILED, "executors finished without a stop decision")
            self.runs.pop(job.id, None)
            for i in run.idents.values():
                self.exec_ident.pop(i, None)
            self._note_ended(job)
            job.transition(JobState.FINISHED, f"{len(job.epochs)} epoch(s)" + (
                f"; stopped early: {run.ending}" if run.ending else ""), now=self.now)
            job.resume = None
            self.snapshots.discard(job.id)
            why = self._keep_final(job, run)
            if why is not None:
                self._gc_checkpoints(job.id, None)
                job.events.append([self.now, job.state.value, f"no model kept: {why}"])
                log.warning("%s: no model kept: %s", job.id, why)
            self._persist("save", job)
            self._retain_models()
            self._dirty = True
            log.info("%s finished after %d epochs", job.id, len(job.epochs))

    # -- model export (harmony model get) ---------------------------------------------
    def _on_ckpt_final(self, ident: bytes, msg: M.Message) -> None:
        jr = self._exec_run(ident, msg)
        if jr is None:
            return
        job, run = jr
        i = msg["index"]
        run.final[i] = (job.workers[i], msg.get("replica"), msg.get("bytes") or 0,
                        msg["epoch"], msg.get("error"))
        self._may_hold_parts(job.id, run.final[i][:2])
        if msg.get("error"):
            log.warning("%s: final checkpoint part %d failed: %s", job.id, i, msg["error"])

    def _keep_final(self, job: Job, run: Run) -> str | None:
        """A finished job keeps its final checkpoint (every part written at
        its stop epoch) as ``job.checkpoint`` with ``final`` and ``model``
        (the parts and their holders); its older checkpoints go. Returns why
        not, when it cannot."""
        parts = run.final
        errors = [f"part {i}: {p[4]}" for i, p in sorted(parts.items()) if p[4]]
        epochs = {p[3] for p in parts.values()}
        if errors or len(parts) < len(job.workers) or len(epochs) != 1:
            job.checkpoint = None
            return "; ".join(errors) or (f"final checkpoint incomplete: {len(parts)} of "
                                         f"{len(job.workers)} part(s) at epochs {sorted(epochs)}")
        ep = epochs.pop()
        job.checkpoint = {
            "epoch": ep, "time": self.now, "parts": len(parts),
            "replicas": sum(1 for p in parts.values() if p[1]),
            "bytes": int(sum(p[2] for p in parts.values())),
            "holders": sorted({h for p in parts.values() for h in p[:2] if h}),
            "final": True,
            "model": [{"index": i, "epoch": ep, "holders": [m] + ([r] if r else [])}
                      for i, (m, r, _, _, _) in sorted(parts.items())]}
        self._gc_checkpoints(job.id, ep, job.checkpoint["holders"])
        return None

    def _retain_models(self) -> None:
        """Only the ``keep_models`` most recently finished jobs keep their
        final checkpoint; older ones are dropped from the machines."""
        kept = sorted((j for j in self.jobs.values() if j.state == JobState.FINISHED
                       and (j.checkpoint or {}).get("final")),
                      key=lambda j: j.ended or 0.0, reverse=True)
        for job in kept[self.keep_models:]:
            job.checkpoint = None
            self._gc_checkpoints(job.id, None)
            job.events.append([self.now, job.state.value,
                               f"model dropped: only the {self.keep_models} most recently "
                               f"finished job(s) keep their final checkpoint"])
            self._persist("save", job)
            log.info("%s: final checkpoint dropped (retention)", job.id)

    def _on_model_parts(self, ident: bytes, msg: M.Message) -> None:
        """Where a job's model is: its final checkpoint once finished, else
        its latest complete checkpoint. ``fresh`` on a running job: it also
        writes a new checkpoint at its next epoch end (the client waits for
        an epoch newer than the one answered now)."""
        job = self.jobs.get(msg["job"])
        if job is None:
            return self._send(ident, _err("unknown_job", f"no job {msg['job']!r}"))
        if job.state in (JobState.FAILED, JobState.CANCELLED):
            return self._send(ident, _err("no_model", f"{job.id} {job.state.value}: its "
                                                         f"checkpoints were dropped, there is "
                                                         f"no model to export"))
        ck = job.checkpoint or {}
        if job.state == JobState.FINISHED:
            if not ck.get("final"):
                why = next((e[2] for e in reversed(job.events) if str(e[2]).startswith(
                    ("no model kept", "model dropped"))), "it keeps no final checkpoint")
                return self._send(ident, _err("no_model", f"{job.id} finished, but its model "
                                                             f"is not kept ({why})"))
            epoch, parts = ck["epoch"], ck["model"]
        elif job.resume:
            epoch, parts = job.resume["epoch"] - 1, job.resume["parts"]
        else:
            epoch, parts = -1, []
        run = self.runs.get(job.id)
        if msg.get("fresh") and job.state.active and job.id not in self.snapshots \
                and (run is None or (run.ckpt_epoch is None and not run.pausing)):
            self.snapshots.add(job.id)
            log.info("%s: checkpoint at its next epoch end (model export)", job.id)
        pending = job.id in self.snapshots or bool(
            run is not None and job.state.active and (run.ckpt_epoch is not None or run.pausing))
        srcs = [{"index": p["index"], "epoch": p["epoch"],
                 "sources": [[h, self.workers[h].data_endpoint] for h in p["holders"]
                             if h in self.workers and self.workers[h].alive
                             and self.workers[h].data_endpoint]} for p in parts]
        self._send(ident, _msg(
            "model_source", job=job.id, state=job.state.value, epoch=int(epoch), parts=srcs,
            final=bool(ck.get("final")) and job.state == JobState.FINISHED, pending=pending,
            app_name=job.app_name, app_source=job.app_source, args=list(job.args)))

def _layout_summary(machines: list[str], owner: list[int], input_counts: list[int],
                    layout: dict | None) -> dict | None:
    """What ``harmony status`` shows of a job's roles: its workers (machines
    holding input), servers (holding model blocks) and the blocks of each."""
    if layout is None:
        return None
    model = [owner.count(i) for i in range(len(machines))]
    return {"workers": [m for m, c in zip(machines, input_counts) if c > 0],
            "servers": [m for m, c in zip(machines, model) if c > 0],
            "input_blocks": dict(zip(machines, input_counts)),
            "model_blocks": dict(zip(machines, model))}


def shares(total: int, n: int, weights: list[float] | None = None) -> list[int]:
    """``total`` blocks apportioned over ``n`` owners: evenly (shares differ
    by at most one, the extra ones to the lowest indexes), or in proportion
    to ``weights`` by largest remainder (ties to the lower index); an owner
    of weight 0 gets none."""
    if weights is None:
        return [total // n + (1 if i < total % n else 0) for i in range(n)]
    if len(weights) != n or any(w < 0 for w in weights) or not any(w > 0 for w in weights):
        raise ValueError(f"weights must be {n} non-negative numbers, one positive: {weights}")
    s = float(sum(weights))
    exact = [total * w / s for w in weights]
    out = [int(x) for x in exact]
    for i in sorted(range(n), key=lambda i: (-(exact[i] - out[i]), i))[:total - sum(out)]:
        out[i] += 1
    return out


def balance(owner: list[int], n: int, weights: list[float] | None = None) -> list[int]:
    """New owners of blocks over ``n`` owners: a block stays with its owner
    (-1: its owner leaves) unless that owner holds more than its share; the
    others go, in order, to the owners furthest below their share. Shares
    are :func:`shares` (even, or by ``weights``); the result is deterministic."""
    total = len(owner)
    share = shares(total, n, weights)
    held = [0] * n
    out = [-1] * total
    for b, o in enumerate(owner):
        if 0 <= o < n and held[o] < share[o]:
            out[b] = o
            held[o] += 1
    for b in range(total):
        if out[b] < 0:
            o = max(range(n), key=lambda i: (share[i] - held[i], -i))
            out[b] = o
            held[o] += 1
    return out
