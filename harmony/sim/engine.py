"""A discrete-event simulator that drives the real master core.

Nothing here decides anything: :class:`harmony.master.core.MasterCore` (the
same class the master process runs) receives the messages simulated daemons
and executors would send, in simulated time, and its commands are carried
out by simulated machines. Each machine runs the same pure subtask queues
as a worker daemon (:class:`harmony.worker.daemon_core.DaemonCore`) in the
harmony mode; in the isolated and naive modes executors run their subtasks
freely and share the machine's CPU and link (the contention model,
:class:`Contention`).

The simulated machines are :mod:`harmony.sim.machine`, their executors
:mod:`harmony.sim.executor` (what they do, and how their work follows the
blocks they hold, is described there); this module holds the engine
(:class:`Simulator`: the event queue, the messages to and from the core)
and what it is given and gives back (:class:`SimJob`, :class:`Contention`,
:class:`Outcome`).
"""
from __future__ import annotations

import heapq
import itertools
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from harmony.comm import messages as M
from harmony.master import core as C
from harmony.sim.contention import CALIBRATED, ContentionModel
from harmony.sim.executor import _Exec
from harmony.sim.machine import INF, _Machine
from harmony.subtasks.queues import Sub

log = logging.getLogger("harmony.sim")


@dataclass
class SimJob:
    """What the engine needs of a job: its profile as a function of DoP."""
    id: str                         # the trace's job id
    app: str
    arrival: float                  # s
    epochs: int
    machines: int                   # requested DoP
    iters: int                      # iterations per epoch (if no plan)
    profile: Callable[[int], tuple[float, float]]   # m -> (t_cpu, t_net) per iteration
    eval_cpu: float = 0.0           # s per epoch at DoP 1 (the objective's pass)
    # m -> the evaluation's CPU s per epoch on each machine (measured, where
    # the trace has eval_at); None: eval_cpu / m
    eval_at: Callable[[int], float] | None = None
    net_local: float = 0.0          # s of each iteration's COMM that is CPU work (traffic
                                    # to the machine's own shard), at any DoP
    bytes: float = 0.0              # PULL + PUSH bytes per iteration of one machine
    link: float = 0.0               # bytes/s of its links (what executors report)
    model_bytes: float = 0.0
    input_bytes: float = 0.0
    final_bytes: float = 0.0        # what its final checkpoint writes
    ckpt_bytes: float | None = None  # what a periodic checkpoint or a pause writes (all
                                    # parts; None: the model and the whole input)
    error: float = 0.0              # relative error injected into what it reports
    # per epoch: (simulated iterations, real iterations each); default
    # ``epochs`` x (``iters``, 1). A simulated iteration of k real ones runs
    # k x the COMP and the COMM seconds (the simulation's grain).
    plan: list[tuple[int, int]] = field(default_factory=list)
    # the objective it reports after k real iterations (the trace's loss
    # curve; None: the epochs left, a countdown)
    loss: Callable[[float], float] | None = None
    deadline: float | None = None   # s after arrival, submitted with the job
    utility: str = ""               # a Utility spec, submitted with the job
    # its own start-up on each machine, where measured (None: the machines'
    # Contention.startup and startup_cpu): launch to ready, and its CPU part;
    # a join (an executor added to a running job) costs the machines' figures
    startup: float | None = None
    startup_cpu: float | None = None
    # m -> CPU seconds per iteration its COMM costs each machine, where
    # measured (None: net_local); run before the transfer, beside the COMPs
    comm_cpu: Callable[[int], float] | None = None

    def __post_init__(self) -> None:
        if not self.plan:
            self.plan = [(self.iters, 1)] * self.epochs
        self.epochs = len(self.plan)


@dataclass
class Contention:
    """The simulated machines: how subtasks share them, and what the
    runtime's fixed costs are.

    ``model``: without Harmony's queues, n COMPs (or n transfers) running at
    once on a machine each progress at ``model.rate(kind, n)`` of their speed
    alone (:mod:`harmony.sim.contention`: processor sharing plus an
    interference factor calibrated from measured runs); under the queues
    one COMP runs, and the NET queue's two transfers share the link by the
    same model (its primary does not keep the link on jobs spread over
    machines: :meth:`harmony.sim.machine._Machine.rates`).
    ``startup``: seconds from launch to a ready executor, plus its input
    part read at ``disk`` bytes/s; checkpoints write at ``disk`` and copy
    their replica, and moved blocks cross links, at ``bandwidth``.
    """
    model: ContentionModel = field(default_factory=lambda: CALIBRATED)
    startup: float = 1.0            # s from launch to exec_ready
    startup_cpu: float = 0.0        # s of it that are CPU work on the machine (imports,
                                    # reading the input): it shares the machine's CPU
                                    # with the COMPs running there, outside the queues
    # the CPU weight of a start-up against a COMP's threads: the executor
    # reads its input at nice 19 (harmony.worker.executor.startup), which
    # the kernel weighs 15 against 1024 at nice 0; a machine joining a
    # running job (a live resize) starts at its own priority (weight 1)
    startup_weight: float = 15 / 1024
    epoch_overhead: float = 0.0     # s at each epoch end outside COMP/COMM (the sums'
                                    # round trip, the store's adaptation, logging)
    bandwidth: float = 1.25e9       # bytes/s per machine link (moves, checkpoints)
    disk: float = 5e8               # bytes/s: checkpoint writes, input reads at launch


@dataclass
class Util:
    bucket: float
    cpu: list[float] = field(default_factory=list)    # busy machine-seconds per bucket
    net: list[float] = field(default_factory=list)

    def add(self, which: list[float], t0: float, t1: float) -> None:
        b = self.bucket
        i = int(t0 // b)
        if t0 < t1 <= (i + 1) * b and i < len(which):      # the common case: one bucket
            which[i] += t1 - t0
            return
        while t0 < t1:
            end = min(t1, (i + 1) * b)
            while len(which) <= i:
                which.append(0.0)
            which[i] += end - t0
            t0, i = end, i + 1


class Simulator:
    """Simulate ``jobs`` on ``machines`` machines under ``policy`` and
    ``mode`` (the master's own policy and mode names).

    ``cruise``: the master core runs Cruise inside jobs (``harmony-master
    --cruise``), and executors' work follows their blocks (``block_work``).
    ``cpu_speed``/``net_speed``: one factor per machine (or one for all) of
    the nominal CPU speed and link rate (as ``harmony cluster up
    --cpu-speed``/``--net-bandwidth``). ``max_moves``: a live resize's
    moves at once (``harmony-master --max-moves``)."""

    def __init__(self, jobs: list[SimJob], machines: int, policy: str | None = None,
                 mode: str = "harmony", contention: Contention | None = None,
                 cpus: int = 16, memory: int = 64 << 30, bucket: float = 10.0,
                 max_jobs_per_machine: int = 0, input_blocks: int = 16,
                 model_blocks: int = 16, progress: Callable[[float], None] | None = None,
                 horizon: float = 1e9, wall_limit: float | None = None,
                 cruise: bool = False, block_work: bool = False,
                 cpu_speed: list[float] | None = None,
                 net_speed: list[float] | None = None, max_moves: int = C.MAX_MOVES,
                 validate: bool = False, sync_s: float = 0.0) -> None:
        # the synchronizer's added delay per round (issue #32 item 5: what
        # bench/master_load.py measures, from the last sync of a subtask to
        # its enqueue on every machine), per real iteration lumped into a
        # simulated subtask; 0: none (messages are instant)
        if sync_s < 0:
            raise ValueError("sync_s must be >= 0")
        self.sync_s = float(sync_s)
        # check the core's invariants after every instant (MasterCore.validate)
        self.validate = validate
        self.jobs = sorted(jobs, key=lambda j: (j.arrival, j.id))
        self.contention = contention or Contention()
        self.core = C.MasterCore(policy=policy, mode=mode, heartbeat_timeout=INF,
                                 launch_timeout=INF, max_jobs_per_machine=max_jobs_per_machine,
                                 liveness_every=INF, cruise=cruise, max_moves=max_moves)
        self.block_work = block_work or cruise
        self.incoming: dict[tuple[str, int, int], list] = {}   # blocks a move sends
        # (job, the resize's seq, new index) -> [bytes, blocks] its plan sends to
        # that executor, as its senders learn their parts (SimExecutor._migrate)
        self.move_in: dict[tuple[str, int, int], list] = {}
        self.mode, self.policy = mode, self.core.policy_name
        self.util = Util(bucket)        # (before the machines: their resources add to it)
        queued = self.core.queued
        self.machines = {f"m{i}": _Machine(self, f"m{i}", queued) for i in range(machines)}
        for attr, speeds in (("cpu_speed", cpu_speed), ("net_speed", net_speed)):
            for m, v in zip(self.machines.values(), per_machine(speeds, machines, attr)):
                setattr(m, attr, v)
        self.by_ident = {m.ident: m for m in self.machines.values()}
        self.cpus, self.memory = cpus, memory
        self.input_blocks, self.model_blocks = input_blocks, model_blocks
        self.execs: dict[bytes, _Exec] = {}
        self.now = 0.0
        self._q: list = []
        self._n = itertools.count()
        self._ids = itertools.count()
        self.by_job: dict[str, SimJob] = {}     # master job id -> trace job
        self.trace_of: dict[str, str] = {}
        self.decisions: list[dict] = []
        self.messages = 0
        self.progress = progress
        self.horizon = horizon
        # stop after this many seconds of wall time (a bounded benchmark):
        # the jobs not done by then are reported unfinished
        self.wall_limit = wall_limit
        self._client = b"client"
        self._seq = 0
        self._sub_fields: dict | None = None     # the last enqueue's fields, and its Sub
        self._sub: Sub | None = None

    # -- the event queue ---------------------------------------------------------------
    def _at(self, t: float, fn: Callable, *args: Any) -> None:
        heapq.heappush(self._q, (t, next(self._n), fn, args))

    def _later(self, dt: float, fn: Callable, *args: Any) -> None:
        self._at(self.now + dt, fn, *args)

    def _enqueue_late(self, m, ex, sub: Sub) -> None:
        """An enqueue the synchronizer's delay (``sync_s``) held back: only
        for the executor it was meant for, if it is still there."""
        if m.q is not None and m.execs.get(sub.job) is ex and ex.alive:
            m.act(m.q.enqueue(sub, self.now))

    def _busy(self, kind: str, t0: float, t1: float) -> None:
        if kind == "up":        # the serving side of transfers already counted
            return
        self.util.add(self.util.cpu if kind == "cpu" else self.util.net, t0, t1)

    # -- talking to the core -------------------------------------------------------------
    def _deliver(self, ident: bytes, mtype: str, fields: dict, role: str = "",
                 name: str = "") -> None:
        self.messages += 1
        cmds = self.core.handle(C.Received(ident, M.Message(mtype, fields, [])), self.now)
        if cmds:
            self._carry(cmds)

    def _send_master(self, ex: _Exec, mtype: str, **fields: Any) -> None:
        fields["job"], fields["index"] = ex.jid, ex.index
        self._deliver(ex.ident, mtype, fields)

    def _carry(self, commands: list) -> None:
        Send, route, execs = C.Send, self._route, self.execs
        for cmd in commands:
            kind = type(cmd)
            if kind is Send:
                t = cmd.type
                if t == "enqueue":
                    self._enqueue(cmd.to, cmd.fields)
                elif t == "ckpt_gc":      # (daemons only; simulated disks hold nothing)
                    continue
                else:
                    ex = execs.get(cmd.to)
                    if ex is not None:
                        ex.on(t, cmd.fields)
                    else:
                        route(cmd)
            elif kind is C.Admit:
                self._seq += 1
                cmd.job.id = f"job-{self._seq:04d}"
                self.by_job[cmd.job.id] = self._pending_submit
                self._carry(self.core.handle(C.Admitted(cmd.ident, cmd.job), self.now))
            elif kind is C.Record:
                if cmd.stream == "decisions":
                    self.decisions.append(cmd.obj)
            elif kind is C.Solve:       # at once, in simulated time
                try:
                    done = C.Solved(cmd.key, cmd.fn())
                except Exception as exc:  # noqa: BLE001 (the core logs it)
                    done = C.Solved(cmd.key, error=f"{exc.__class__.__name__}: {exc}")
                self._carry(self.core.handle(done, self.now))

    def _enqueue(self, to: bytes, f: dict) -> None:
        """The synchronizer's enqueue of a subtask on machine ``to``. The
        core sends one fields dict to every machine of the job: its
        :class:`Sub` is made once (a frozen record, shared by the machines'
        queues as the daemons would each parse an equal one)."""
        m = self.by_ident.get(to)
        if m is None:
            return
        q = m.q
        if q is None or f["job"] not in m.execs:
            return
        if f is self._sub_fields:
            sub = self._sub
        else:
            sub = self._sub = Sub(f["job"], f["seq"], f["kind"], f["prio"])
            self._sub_fields = f
        if self.sync_s:         # k real rounds behind one simulated subtask
            ex = m.execs[f["job"]]
            k = ex.job.plan[min(ex.epoch, len(ex.job.plan) - 1)][1]
            return self._later(self.sync_s * k, self._enqueue_late, m, ex, sub)
        m.act(q.enqueue(sub, self.now))

    def _route(self, cmd: C.Send) -> None:
        to, f = cmd.to, cmd.fields
        ex = self.execs.get(to)
        if ex is not None:
            return ex.on(cmd.type, f)
        m = self.by_ident.get(to)
        if m is None:
            return          # a reply to the client, or to an executor that is gone
        t = cmd.type
        if t == "enqueue":
            return self._enqueue(to, f)
        if t == "launch":
            job = self.by_job[f["job"]]
            if f.get("join"):
                ex = _Exec(self, job, f["job"], m, f["index"], f["count"], f["attempt"], 0,
                           True)
                m.execs[f["job"]] = ex
                self._start_up(ex, True)
                return
            old = m.execs.get(f["job"])
            if old is not None:
                old.kill()
            resume = (f.get("resume") or {}).get("epoch", 0)
            ex = _Exec(self, job, f["job"], m, f["index"], f["count"], f["attempt"], resume,
                       False)
            m.execs[f["job"]] = ex
            self._start_up(ex, False)
        elif t == "kill":
            ex = m.execs.get(f["job"])
            if ex is not None:
                ex.kill()

    def _startup(self, job: SimJob, count: int, join: bool = False) -> float:
        c = self.contention
        return (c.startup if job.startup is None or join else job.startup) \
            + job.input_bytes / count / c.disk

    def _start_up(self, ex: _Exec, join: bool) -> None:
        """Launch to ready: ``startup_cpu`` seconds of CPU work on its
        machine (sharing the CPU with what runs there: on a busy machine the
        start-up takes longer and slows the COMPs), then the rest."""
        total = self._startup(ex.job, ex.count, join)
        # a job's own start-up parses its input; a join takes its blocks as
        # they are, so it costs the machines' common part
        cpu = min(self.contention.startup_cpu if ex.job.startup_cpu is None or join
                  else ex.job.startup_cpu, total)
        if cpu <= 0:
            return self._later(total, self._ready, ex, join)

        def computed() -> None:
            if ex.alive:
                self._later(total - cpu, self._ready, ex, join)
        # a join at the executor's own priority, any other start-up low
        ex.machine.cpu.start((ex.jid, "setup" if join else "setup-low", ex.ident), cpu,
                             computed, self.now)

    def _ready(self, ex: _Exec, join: bool) -> None:
        if not ex.alive:
            return
        if ex.machine.q is not None:        # its hello to the daemon
            ex.machine.act(ex.machine.q.ready(ex.jid, self.now))
        self._send_master(ex, "exec_ready", attempt=ex.attempt, endpoint=f"sim://{ex.jid}",
                          num_keys=1024, dim=1, model_blocks=self.model_blocks,
                          local_blocks=len(ex.inputs), join=join or None)

    def _submit(self, job: SimJob) -> None:
        self._pending_submit = job
        self._deliver(self._client, "submit", {"app_name": job.app, "app_source": "",
                                               "args": ["--max-epochs", str(job.epochs)],
                                               "machines": job.machines,
                                               "name": job.id,
                                               **({"deadline": job.deadline}
                                                  if job.deadline else {}),
                                               **({"utility": job.utility}
                                                  if job.utility else {})})

    # -- run -----------------------------------------------------------------------------
    def run(self) -> "Outcome":
        wall = time.perf_counter()
        for m in self.machines.values():
            self._deliver(m.ident, "register", {
                "name": m.name, "host": "sim", "cpus": self.cpus, "memory": self.memory,
                "pid": 0, "executors": [], "data_endpoint": f"sim://{m.name}"})
        for job in self.jobs:
            self._at(job.arrival, self._submit, job)
        tick = C.Tick()
        events = 0
        woken = 0.0
        last_progress = 0.0
        q, pop, handle, carry = self._q, heapq.heappop, self.core.handle, self._carry
        while q:
            t = q[0][0]
            if t > self.horizon:
                break
            self.now = t
            while q and q[0][0] == t:
                _, _, fn, args = pop(q)
                fn(*args)
                events += 1
            cmds = handle(tick, t)
            if cmds:
                carry(cmds)
            wake = self.core.wake_at
            if wake > t and wake != woken:      # the policy asked to decide again then
                woken = wake
                self._at(wake, _nothing)
            if self.validate:
                self.core.validate()
            if events - last_progress >= 5000:
                last_progress = events
                if self.progress is not None:
                    self.progress(self._done_fraction())
                if self.wall_limit is not None and \
                        time.perf_counter() - wall > self.wall_limit:
                    break
        return self._outcome(time.perf_counter() - wall, events)

    def _done_fraction(self) -> float:
        js = self.core.jobs.values()
        return sum(1 for j in js if j.state.terminal) / max(1, len(self.jobs))

    def _outcome(self, wall: float, events: int) -> "Outcome":
        jobs = []
        for jid, job in sorted(self.core.jobs.items()):
            sj = self.by_job[jid]
            jobs.append({"id": sj.id, "job": jid, "app": sj.app, "arrival": sj.arrival,
                         "start": job.started, "end": job.ended, "state": job.state.value,
                         "machines": sj.machines, "epochs": len(job.epochs),
                         "jct": (job.ended - sj.arrival) if job.ended is not None else None})
        ends = [j["end"] for j in jobs if j["end"] is not None]
        return Outcome(jobs=jobs, makespan=max(ends) - min(j.arrival for j in self.jobs)
                       if ends else math.nan, util=self.util, machines=len(self.machines),
                       decisions=self.decisions, wall=wall, events=events,
                       messages=self.messages, policy=self.policy, mode=self.mode,
                       sim_time=self.now)


def _nothing() -> None:
    """An event that only makes the engine tick the master core."""


def per_machine(speeds: list[float] | None, machines: int, what: str) -> list[float]:
    """One factor per machine from none (all 1), one, or one per machine."""
    if not speeds:
        return [1.0] * machines
    vals = [float(x) for x in speeds]
    if len(vals) == 1:
        vals *= machines
    if len(vals) != machines or not all(0 < v < INF for v in vals):
        raise ValueError(f"{what}: one positive factor or one per machine ({machines}), "
                         f"not {speeds}")
    return vals


@dataclass
class Outcome:
    jobs: list[dict]
    makespan: float
    util: Util
    machines: int
    decisions: list[dict]
    wall: float
    events: int
    messages: int
    policy: str
    mode: str
    sim_time: float = 0.0           # the simulated clock when the run stopped

    def utilization(self) -> tuple[float, float]:
        """Mean CPU and network busy fraction over the makespan."""
        span = self.makespan * self.machines
        if not span or math.isnan(span):
            return (0.0, 0.0)
        return (sum(self.util.cpu) / span, sum(self.util.net) / span)
