"""The bottom of the master core: its state (:class:`CoreState`: the job,
worker, run and executor tables, the catalog, the scheduler's memory), the
outbox every component writes its commands to (``_send``, ``_persist``,
``_record``, ``_say``), the queries every component asks (``_active``,
``_placed``, ``_jobs_on``), the machine -> jobs index behind ``_jobs_on``
(``_set_workers`` is the one way a job's machines change) and the executor check (``_exec_run``, and
:func:`executor_message`, which puts it in front of a handler).

Every component of the core (``harmony.master.core.*``) is a mixin that
derives from this class, and from the components it calls, never from one
above it (``pyproject.toml``'s import contract and ``tests/test_layers.py``
check it)."""
from __future__ import annotations

import functools
import itertools
import logging
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from harmony import dilation as dil
from harmony.comm import messages as M
from harmony.cruise.plan import MAX_MOVES   # a resize's concurrent block moves
from harmony.master.core.protocol import Persist, Record, Send, _msg
from harmony.master.core.records import Run, Worker
from harmony.master.jobs import RETENTION_S, Job, JobState
from harmony.subtasks.sync import SYNC_MODES
from harmony.policies import registry as R
from harmony.policies import view as P

log = logging.getLogger("harmony.master")

_ACTIVE = frozenset(s for s in JobState if s.active)   # a set lookup on hot paths

LIVENESS_EVERY = 0.25       # s between liveness checks (on ticks)
# finished jobs whose final checkpoint (their model, for harmony model get) is
# kept, the most recently finished first; older ones are dropped
KEEP_MODELS = 20




class CoreState:
    """See the module docstring. ``jobs`` and ``datasets``: the job table and
    the data catalog as loaded (the shell owns their storage)."""

    def __init__(self, jobs: dict[str, Job] | None = None,
                 datasets: dict[str, dict] | None = None, *,
                 heartbeat_timeout: float = 5.0, launch_timeout: float = 300.0,
                 policy: str | None = None, mode: str = "naive",
                 max_jobs_per_machine: int = 0, secure: bool = False,
                 keep_models: int = KEEP_MODELS, endpoint: str = "", pid: int = 0,
                 revision: str | None = None, state_dir: str = "",
                 now: float = 0.0, liveness_every: float = LIVENESS_EVERY,
                 cruise: bool = False, max_moves: int = MAX_MOVES,
                 predict_epochs: bool = False, dilation: float = 1.0,
                 sync: str = "leader", retention: float = RETENTION_S) -> None:
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
        if sync not in SYNC_MODES:
            raise ValueError(f"unknown --sync {sync!r}; choose from {sorted(SYNC_MODES)}")
        # who synchronizes queued jobs' subtasks: a leader daemon of each
        # group (harmony.subtasks.sync), or this loop
        self.sync = sync
        if retention < 0:
            raise ValueError("--retention must be >= 0 (0: keep finished jobs in view)")
        # finished jobs leave the live views this long after they end (they
        # stay in `harmony jobs --all`, `status` and the job table)
        self.retention = float(retention)
        # after a restart with jobs to requeue: no scheduling before this
        # (the machines are still registering again)
        self.rejoin_until = 0.0
        self.rejoin_max = 0.0
        # the dashboard's task stream: set by the shell while someone watches
        # it; heartbeats' acks then ask the daemons for their ended subtasks
        self.task_stream = False
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
        # the jobs not ended (_open_jobs): an index of self.jobs, which the
        # core only adds to (the server may replace it whole at start)
        self._open: dict[str, Job] = {}
        self._open_of: dict[str, Job] | None = None
        self._open_seen = 0
        # the finished jobs holding a final checkpoint (_retain_models): the
        # table they were indexed from, and the index
        self._models: tuple[dict[str, Job], dict[str, Job]] | None = None
        self.datasets: dict[str, dict] = dict(datasets or {})
        # data sets planned and not yet committed: name -> when (a put in flight)
        self.puts: dict[str, float] = {}
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
        # the policy asked to decide again at this time (Decision.again_at; 0: not)
        self.wake_at = 0.0
        self._last_check = float("-inf")
        self.liveness_every = liveness_every
        self.bad_messages = 0
        self.decisions = 0
        self._said: dict[str, list] = {}    # rate-limited log lines: key -> [t0, n]
        self._peer: tuple[str, str] = ("", "")
        self._out: list = []
        # job -> [epochs list, epochs summed, iterations done, progress points] (_job_view)
        self._progress: dict[str, list] = {}
        self._worker_views: dict[str, P.WorkerView] = {}     # _view's last one per machine
        # machine -> {job id: job} of every job not over whose ``workers`` name it
        # (``_set_workers`` keeps it; a job that ends leaves it, its workers
        # kept for its status), and job id -> its place in ``jobs`` (the order
        # ``_jobs_on`` answers in): a heartbeat asks about its machine's jobs,
        # not every job ever submitted (issue #32). ``MasterCore.validate``
        # checks it against a full scan; ``_reindex`` rebuilds it when the
        # shell replaces ``jobs`` (a restart, before ``recover``).
        self._on: dict[str, dict[str, Job]] = {}
        self._rank: dict[str, int] = {}
        # job id -> when its machines or the jobs beside it last changed
        # (``_set_workers``): its epochs before that do not measure where it
        # runs now (``views._iter_s``); gone when the job ends
        self._placed_at: dict[str, float] = {}
        self._reindex()

    # -- outputs -----------------------------------------------------------------------------
    def _send(self, ident: bytes, payload: tuple[str, dict], fail: Any = None) -> None:
        self._out.append(Send(ident, payload[0], payload[1], fail))

    def _persist(self, op: str, *args: Any) -> None:
        self._out.append(Persist(op, args))

    def _record(self, stream: str, obj: dict[str, Any]) -> None:
        self._out.append(Record(stream, obj))

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

    # -- queries -----------------------------------------------------------------------------
    def _open_jobs(self) -> list[Job]:
        """The jobs not ended (finished, failed, cancelled are for good), in
        submission order: kept as jobs are added and dropped as they end,
        so the scheduler does not scan every job ever submitted at every
        decision (at 10,000 jobs that scan was a third of a simulation)."""
        jobs = self.jobs
        if self._open_of is not jobs or len(jobs) < self._open_seen:
            self._open, self._open_of, self._open_seen = {}, jobs, 0
        if len(jobs) > self._open_seen:
            for j in itertools.islice(jobs.values(), self._open_seen, None):
                if not j.state.terminal:
                    self._open[j.id] = j
            self._open_seen = len(jobs)
        open_ = self._open
        for jid in [jid for jid, j in open_.items() if j.state.terminal]:
            del open_[jid]
        return list(open_.values())

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
        """The active jobs placed on machine ``name``, in ``jobs``' order (as
        a scan of every job would give them), from the index: O(its jobs)."""
        on = self._on.get(name)
        if not on:
            return []
        active = _ACTIVE
        return self._in_table_order([j for j in on.values() if j.state in active])

    def _in_table_order(self, jobs: list[Job]) -> list[Job]:
        """``jobs`` sorted in the job table's order (in place; returned)."""
        if len(jobs) > 1:
            rank = self._rank
            try:
                jobs.sort(key=lambda j: rank[j.id])
            except KeyError:                # a job added since: rank them again
                rank = self._rank = {jid: i for i, jid in enumerate(self.jobs)}
                jobs.sort(key=lambda j: rank.get(j.id, len(rank)))
        return jobs

    # -- the machine -> jobs index ------------------------------------------------------------
    def _set_workers(self, job: Job, machines: list[str]) -> None:
        """``job`` now runs on ``machines`` (index order; [] when it leaves
        them): every change of a job's ``workers`` goes through here. It
        stamps the job and every job on its old or new machines as placed
        now (their mates changed)."""
        if list(machines) != job.workers:
            stamp, now = self._placed_at, self.now
            for n in (*job.workers, *machines):
                for other in (self._on.get(n) or {}).values():
                    stamp[other.id] = now
            stamp[job.id] = now
        self._unindex(job)
        job.workers = list(machines)
        if not job.state.terminal:
            self._index(job)
        else:
            self._placed_at.pop(job.id, None)

    def _index(self, job: Job) -> None:
        jid, on = job.id, self._on
        for n in job.workers:
            d = on.get(n)
            if d is None:
                d = on[n] = {}
            d[jid] = job

    def _unindex(self, job: Job) -> None:
        """``job`` leaves the index (it ended: its ``workers`` stay, shown in
        its status, but it runs nowhere)."""
        jid, on = job.id, self._on
        for n in job.workers:
            d = on.get(n)
            if d is not None and d.get(jid) is job:
                del d[jid]
                if not d:
                    del on[n]

    def _reindex(self) -> None:
        """Build the index again from ``jobs`` (the shell replaced the table)."""
        self._on = {}
        for job in self.jobs.values():
            if not job.state.terminal:
                self._index(job)
        self._rank = {jid: i for i, jid in enumerate(self.jobs)}

    def _index_errors(self) -> list[str]:
        """How the index differs from a scan of every job (``validate``): one
        pass over the jobs, then each machine's entry and ``_jobs_on``."""
        want: dict[str, set[str]] = {}
        active: dict[str, list[str]] = {}       # the old scan's answer, per machine
        for j in self.jobs.values():
            if j.state.terminal:
                continue
            for n in dict.fromkeys(j.workers):
                want.setdefault(n, set()).add(j.id)
                if j.state in _ACTIVE:
                    active.setdefault(n, []).append(j.id)
        errors = []
        for n in sorted(set(want) | set(self._on)):
            got = self._on.get(n, {})
            if set(got) != want.get(n, set()):
                errors.append(f"machine {n}: indexed {sorted(got)}, "
                              f"placed {sorted(want.get(n, ()))}")
            elif any(self.jobs.get(jid) is not job for jid, job in got.items()):
                errors.append(f"machine {n}: an indexed job is not the one in the job table")
            else:
                on = [j.id for j in self._jobs_on(n)]
                if on != active.get(n, []):
                    errors.append(f"machine {n}: _jobs_on answers {on}, a scan "
                                  f"{active.get(n, [])}")
        return errors

    # -- the executor check ------------------------------------------------------------------
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


def executor_message(handler: Callable[..., Any]) -> Callable[[CoreState, bytes, M.Message], Any]:
    """A handler of an executor's message about its running job:
    ``handler(self, ident, msg, job, run)`` runs only when ``ident`` is the
    executor the core knows for the message's job, index and attempt (with
    keys: a worker's); otherwise the sender is told to abort
    (:meth:`CoreState._exec_run`)."""
    @functools.wraps(handler)
    def checked(self: CoreState, ident: bytes, msg: M.Message) -> Any:
        jr = self._exec_run(ident, msg)
        if jr is None:
            return None
        return handler(self, ident, msg, *jr)
    return checked
