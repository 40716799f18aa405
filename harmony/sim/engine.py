"""A discrete-event simulator that drives the real master core.

Nothing here decides anything: :class:`harmony.master.core.MasterCore` (the
same class the master process runs) receives the messages simulated daemons
and executors would send, in simulated time, and its commands are carried
out by simulated machines. Each machine runs the same pure subtask queues
as a worker daemon (:class:`harmony.worker.daemon_core.DaemonCore`) in the
harmony mode; in the isolated and naive modes executors run their subtasks
freely and share the machine's CPU and link (the contention model,
:class:`Contention`).

What a simulated executor does follows ``harmony/worker/executor.py``:
``exec_ready`` after a start-up delay; per iteration a PULL (net), a COMP
(cpu) and a PUSH (net), each reported to the master's synchronizer
(``sync``) and granted by the machine's queues in queued mode, or separated
by barriers (``barrier``/``release``) in free mode; an evaluation (net + cpu)
at each epoch end, ``epoch_done`` with the epoch's timings, ``epoch_report``
from executor 0, and the checkpoints, pauses and live resizes the master
asks for (``epoch_sums``), with their transfer times.

Durations come from each job's profile (:class:`SimJob`): per-iteration
seconds of COMP and of PULL+PUSH on one machine at DoP ``m``. Machines may
differ (``cpu_speed``, ``net_speed``: factors of the nominal CPU and link).

**Blocks** (``block_work``, on with ``cruise``): an executor's work follows
the blocks it holds, as Cruise's cost model assumes, so that layouts that
are not even (Cruise's, ``harmony resize --workers/--servers``) change what
each machine does. COMP is the DoP-``m`` profile's times ``d_i m / D`` (its
input blocks over an even share); a transfer's remote part is split into a
download on the worker's link (the model blocks other machines own, over
the even share of them) and an upload on each such server's link (its
blocks' share), which run at once, the upload side shared by every worker
pulling from that server (the ``m_j w / b_ij`` term of Eq 3.2). Every
worker moves the bytes of the model rows it touches whatever its share of
the data (the adapter's assumption); an executor without input blocks (a
server only) does no COMP and no transfers. Without ``block_work`` every
executor does the profile's 1/m of the job, whatever its blocks (the
default, which the paper-scale figures use: at 16 input blocks a DoP above
16 would leave executors without data).
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
from harmony.worker.daemon_core import DaemonCore, Deliver
from harmony.subtasks.queues import Demote, Grant, Promote, Resume, Stop, Sub

log = logging.getLogger("harmony.sim")

INF = float("inf")


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
    interference factor calibrated from measured runs). ``secondary_share``:
    the part of the link a secondary transfer gets while a primary runs in
    Harmony's NET queue (the bandwidth the primary leaves idle).
    ``startup``: seconds from launch to a ready executor, plus its input
    part read at ``disk`` bytes/s; checkpoints write at ``disk`` and copy
    their replica, and moved blocks cross links, at ``bandwidth``.
    """
    model: ContentionModel = field(default_factory=lambda: CALIBRATED)
    secondary_share: float = 0.0
    startup: float = 1.0            # s from launch to exec_ready
    startup_cpu: float = 0.0        # s of it that are CPU work on the machine (imports,
                                    # reading the input): it shares the machine's CPU
                                    # with the COMPs running there, outside the queues
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


class _Res:
    """One resource of one machine (its CPU or its link): the subtasks
    using it progress at rates that depend on who else runs (processor
    sharing), recomputed on every change."""
    __slots__ = ("sim", "kind", "machine", "running", "last", "version", "busy_since", "due")

    def __init__(self, sim: "Simulator", kind: str, machine: "_Machine") -> None:
        self.sim, self.kind, self.machine = sim, kind, machine
        self.running: dict[Any, list] = {}     # key -> [remaining, rate, callback]
        self.last = 0.0
        self.version = 0
        self.due = INF          # when the one valid pending event fires (INF: none)
        self.busy_since: float | None = None

    def _advance(self, now: float) -> None:
        dt = now - self.last
        if dt > 0:
            busy = False
            for r in self.running.values():
                rate = r[1]
                r[0] -= dt * rate
                if rate > 0:
                    busy = True
            if busy:
                self.sim._busy(self.kind, self.last, now)
        self.last = now

    def start(self, key: Any, work: float, done: Callable[[], None], now: float) -> None:
        if now != self.last:
            self._advance(now)
        self.running[key] = [max(0.0, work), 0.0, done]
        self._reschedule(now)

    def drop(self, key: Any, now: float) -> None:
        if now != self.last:
            self._advance(now)
        if self.running.pop(key, None) is not None:
            self._reschedule(now)

    def set_rates(self, now: float) -> None:
        if now != self.last:
            self._advance(now)
        self._reschedule(now)

    def _reschedule(self, now: float) -> None:
        """Recompute the rates and the next completion. The pending event
        stays valid when the next completion did not move (a subtask that
        joins at rate 0, a rate change elsewhere): half of the events at
        1,000 machines were such stale wake-ups."""
        nxt = INF
        if self.running:
            self.machine.rates(self)
            for r in self.running.values():
                rate = r[1]
                if rate > 0:
                    t = now + r[0] / rate
                    if t < nxt:
                        nxt = t
        if nxt == self.due:
            return
        self.version += 1
        self.due = nxt
        if nxt < INF:
            sim = self.sim
            heapq.heappush(sim._q, (nxt, next(sim._n), self._fire, (self.version,)))

    def _fire(self, version: int) -> None:
        if version != self.version:
            return
        self.due = INF
        now = self.sim.now
        self._advance(now)
        running = self.running
        # done: no work left to speak of, or so little that the clock cannot
        # tell its end from now (past 2**24 s, 1e-9 s is below a double's
        # resolution: the same event fired at the same instant forever)
        done = [k for k, r in running.items()
                if r[1] > 0 and (r[0] <= 1e-9 or now + r[0] / r[1] <= now)]
        cbs = [running.pop(k)[2] for k in done]
        self._reschedule(now)
        for cb in cbs:
            cb()


class _Machine:
    def __init__(self, sim: "Simulator", name: str, queued: bool) -> None:
        self.sim, self.name = sim, name
        self.ident = f"d:{name}".encode()
        self.cpu = _Res(sim, "cpu", self)
        self.net = _Res(sim, "net", self)
        self.up = _Res(sim, "up", self)       # serving model blocks (block_work)
        self.cpu_speed = self.net_speed = 1.0
        self.q = DaemonCore() if queued else None      # the daemon's own protocol core
        self.execs: dict[str, "_Exec"] = {}       # job -> its executor here
        self.roles: dict[tuple[str, int], str] = {}   # queued: running net subtask roles
        self.stopped: set[tuple[str, int]] = set()

    def rates(self, res: _Res) -> None:
        c = self.sim.contention
        run = res.running
        n = len(run)
        if not n:
            return
        if res.kind == "up":                # a server's link: shared evenly by its readers
            for r in run.values():
                r[1] = 1.0 / n
            return
        if res.kind == "cpu":
            # COMPs use every core of the machine, the local part of a
            # transfer (serialization, copies to the machine's own shard)
            # one: all progress at cores / demand when the demand exceeds
            # the cores; the queues decide which COMPs run (a stopped one
            # does not), not the transfers' local parts
            cores = self.sim.cpus
            stopped = self.stopped
            comps = whole = 0
            for key in run:
                if len(key) == 2:
                    whole += 1
                    if key not in stopped:
                        comps += 1
            locals_ = n - whole
            demand = cores * comps + locals_
            rate = 1.0 if demand <= cores else cores / demand
            if self.q is None and comps + locals_ > 1:      # no queues: interference
                m = comps + locals_
                rate *= m * c.model.rate("cpu", m)
            if stopped:
                for key, r in run.items():
                    r[1] = 0.0 if key in stopped else rate
            else:
                for r in run.values():
                    r[1] = rate
            return
        if self.q is not None:            # Harmony's NET queue: the primary leads
            if n == 1:       # alone on the link: the full rate, primary or not
                for r in run.values():
                    r[1] = 1.0
                return
            prim = self.q.primary()
            pkey = (prim.job, prim.seq) if prim is not None else None
            has_primary = pkey in run
            share = c.secondary_share
            for key, r in run.items():
                r[1] = 1.0 if key == pkey or not has_primary else share
            return
        rate = c.model.rate(res.kind, n)
        for r in run.values():
            r[1] = rate

    # queue actions (harmony mode), as the daemon carries them out
    def act(self, actions: list) -> None:
        now = self.sim.now
        for a in actions:
            kind = type(a)
            if kind is Grant or kind is Deliver:
                if kind is Grant and a.held:
                    continue            # delivered once its executor is ready
                ex = self.execs.get(a.sub.job)
                if ex is not None:
                    ex.granted(a.sub.seq)
            elif kind is Stop:
                self.stopped.add((a.sub.job, a.sub.seq))
                self.cpu.set_rates(now)
            elif kind is Resume:
                self.stopped.discard((a.sub.job, a.sub.seq))
                self.cpu.set_rates(now)
                ex = self.execs.get(a.sub.job)
                if ex is not None and a.tell:
                    ex.stood += a.stood
            elif kind is Promote or kind is Demote:
                self.net.set_rates(now)


class _Exec:
    """One simulated job executor (see harmony/worker/executor.py)."""

    def __init__(self, sim: "Simulator", job: SimJob, jid: str, machine: _Machine, index: int,
                 count: int, attempt: int, resume_epoch: int, join: bool) -> None:
        self.sim, self.job, self.jid, self.machine = sim, job, jid, machine
        self.index, self.count, self.attempt = index, count, attempt
        self.ident = f"x:{jid}:{index}:{attempt}:{next(sim._ids)}".encode()
        self.epoch = resume_epoch
        self.it = 0
        self.seq = 0
        self.queued = False
        self.step = 0              # 0 pull, 1 comp, 2 push; 3 eval pull, 4 eval comp
        self.waiting: int | None = None     # the seq it waits a grant for
        self.alive = True
        self.stood = 0.0
        self.tm: dict[str, float] = {}
        self.t_epoch = self.t_train = 0.0
        self.inputs: list[list] = []
        self.join = join
        self.pending_sums: dict | None = None
        self._t0 = 0.0              # the running subtask's start
        self._remote = 0.0          # and the part of its transfer that crosses the link
        # work per unit of the profile's: COMP (this machine's speed; with
        # block_work also its share of the input), the download of a
        # transfer, and the uploads of the servers it reads from (block_work)
        self.comp_f = 1.0 / machine.cpu_speed
        self.down_f = 1.0 / machine.net_speed
        self.ups: list[tuple[_Machine, float]] = []
        self.no_data = False        # block_work: no input blocks (a server only)
        self._parts = 0
        self.new: tuple[int, int, list, list] | None = None
        self._moving: dict = {}     # a paced resize in progress
        sim.execs[self.ident] = self

    # -- messages from the master --------------------------------------------------
    def on(self, mtype: str, f: dict) -> None:
        if not self.alive:
            return
        if mtype == "job_start":
            self.count = len(f["machines"])
            self.queued = f["mode"] == "queued"
            nb = self.sim.input_blocks
            self.inputs = [[b, int(self.job.input_bytes / nb)] for b in range(nb)
                           if b % self.count == self.index]
            self._shape(f["owner"], f["machines"])
            self._begin_epoch()
        elif mtype == "epoch_sums":
            self._after_epoch(f)
        elif mtype == "release":
            self._next_step()
        elif mtype == "migrate":
            self._migrate(f)
        elif mtype == "move":
            self._move(f)
        elif mtype == "reconfigured":
            self.index, self.count, owner, names = self.new
            nb = self.sim.input_blocks
            if self.sim.block_work:     # what it kept and what the plan sent it
                self.inputs = sorted(self.inputs + self.sim.incoming.pop(
                    (self.jid, self.epoch, self.index), []))
            else:
                self.inputs = [[b, int(self.job.input_bytes / nb)] for b in range(nb)
                               if b % self.count == self.index]
            self._shape(owner, names)
            self._begin_epoch()
        elif mtype in ("abort", "leave"):
            self.kill()

    def kill(self) -> None:
        if not self.alive:
            return
        self.alive = False
        m, now = self.machine, self.sim.now
        m.cpu.drop((self.jid, self.seq), now)
        m.cpu.drop((self.jid, self.seq, "local"), now)
        m.cpu.drop((self.jid, "setup", self.ident), now)
        m.net.drop((self.jid, self.seq), now)
        for mj, _ in self.ups:
            mj.up.drop((self.jid, self.seq, self.index), now)
        if m.execs.get(self.jid) is self:
            del m.execs[self.jid]
            if m.q is not None:
                m.act(m.q.left(self.jid, now))
        self.sim.execs.pop(self.ident, None)

    def _shape(self, owner: list[int], names: list[str]) -> None:
        """This executor's work factors under the model ``owner`` map and the
        job's machines ``names`` (by index): see the module docstring."""
        sim = self.sim
        self.comp_f = 1.0 / self.machine.cpu_speed
        self.down_f = 1.0 / self.machine.net_speed
        self.ups = []
        self.no_data = False
        if not sim.block_work:
            return
        n, d = self.count, len(self.inputs)
        self.comp_f *= d * n / sim.input_blocks
        if d == 0:                  # a server only: no COMP, no transfers
            self.no_data = True
            return
        if n < 2 or not owner:
            return
        per = [0] * n
        for o in owner:
            per[o] += 1
        total, even = len(owner), (n - 1) / n
        self.down_f *= (total - per[self.index]) / total / even
        for j in range(n):
            mj = sim.machines.get(names[j]) if j < len(names) else None
            if j != self.index and per[j] and mj is not None:
                self.ups.append((mj, per[j] / total / even / mj.net_speed))

    # -- the epoch loop --------------------------------------------------------------
    def _begin_epoch(self) -> None:
        if not self.alive:
            return
        self.tm = {"pull": 0.0, "comp": 0.0, "push": 0.0, "eval": 0.0}
        self.t_epoch = self.t_train = self.sim.now
        self.stood0 = self.stood
        self.it, self.step = 0, 0
        self._sub()

    def _sub(self) -> None:
        """Start the current step's subtask (after the synchronizer's grant)."""
        kind = "cpu" if self.step in (1, 4) else "net"
        if not self.queued:
            return self._run(kind)
        seq = self.seq
        self.seq = self.waiting = seq + 1     # its grant may come back at once
        self.sim._deliver(self.ident, "sync", {"seq": seq, "next": kind, "job": self.jid,
                                               "index": self.index})

    def granted(self, seq: int) -> None:
        if self.waiting != seq or not self.alive:
            return
        self.waiting = None
        self._run("cpu" if self.step in (1, 4) else "net")

    def _run(self, kind: str) -> None:
        t_cpu, t_net = self.job.profile(self.count)
        k = self.job.plan[self.epoch][1]
        local = 0.0
        if self.step == 0 or self.step == 2:
            work, local = k * t_net / 2, k * self.job.net_local / 2
        elif self.step == 1:
            work = k * t_cpu
        elif self.step == 3:            # the evaluation pulls the model once
            work, local = t_net / 2, self.job.net_local / 2
        else:
            work = self.job.eval_cpu / self.count
        # one subtask at a time: its start and remote part live on the
        # executor, and the callbacks are bound once (no closure per subtask)
        t0 = self._t0 = self.sim.now
        key = (self.jid, self.seq)
        if kind == "cpu":
            return self.machine.cpu.start(key, work * self.comp_f, self._ran, t0)
        local = min(local, work)
        self._remote = work - local
        if self.no_data:                # a server only (block_work): nothing to move
            local = self._remote = 0.0
        if local <= 0:
            return self._start_remote()
        # a transfer's local part first: CPU work beside the running COMP
        self.machine.cpu.start((self.jid, self.seq, "local"), local / self.machine.cpu_speed,
                               self._then_remote, t0)

    def _then_remote(self) -> None:
        """A transfer's local part is done: then what crosses the link."""
        if self.alive:
            self._start_remote()

    def _start_remote(self) -> None:
        """The part that crosses links: the download on this machine's, and
        with block_work the uploads of the servers it reads from, at once."""
        now, key, rem = self.sim.now, (self.jid, self.seq), self._remote
        if not self.ups:
            return self.machine.net.start(key, rem * self.down_f, self._ran, now)
        self._parts = 1 + len(self.ups)
        self.machine.net.start(key, rem * self.down_f, self._part_done, now)
        ukey = (self.jid, self.seq, self.index)
        for mj, f in self.ups:
            mj.up.start(ukey, rem * f, self._part_done, now)

    def _part_done(self) -> None:
        self._parts -= 1
        if self._parts == 0:
            self._ran()

    def _ran(self) -> None:
        if not self.alive:
            return
        took = self.sim.now - self._t0
        name = ("pull", "comp", "push", "eval", "eval")[self.step]
        self.tm[name] += took
        if self.queued:
            m = self.machine
            if m.q is not None:
                m.act(m.q.done(self.jid, self.seq, self.sim.now))
            self._next_step()
        elif self.step in (0, 2):      # strict BSP: a barrier after PULL and after PUSH
            self.sim._send_master(self, "barrier", epoch=self.epoch,
                                  iter=2 * self.it + (self.step == 2))
        else:
            self._next_step()

    def _next_step(self) -> None:
        if not self.alive:
            return
        if self.step == 2:
            self.it += 1
            if self.it >= self.job.plan[self.epoch][0]:
                self.t_train = self.sim.now      # the training part ends (as the executor's)
            self.step = 0 if self.it < self.job.plan[self.epoch][0] else \
                3 if self.job.eval_cpu > 0 else None
            if self.step is None:
                return self._epoch_done()
        elif self.step == 4:
            return self._epoch_done()
        else:
            self.step += 1
        self._sub()

    def _epoch_done(self) -> None:
        n, k = self.job.plan[self.epoch]
        tm, iters = self.tm, float(n * k)
        stood = self.stood - self.stood0
        e = 1.0 + self.job.error
        timings = {"pull": tm["pull"] * e, "push": tm["push"] * e,
                   "comp": max(0.0, tm["comp"] - stood) * e, "stood": stood,
                   "train": (self.t_train - self.t_epoch) * e, "iters": iters,
                   "eval": tm["eval"], "bytes": self.job.bytes * iters * e,
                   "link": self.job.link * self.machine.net_speed, "sync": 0.0}
        if self.sim.block_work:         # what Cruise's estimates read (d_i, block size)
            timings["blocks"] = float(len(self.inputs))
            timings["input_bytes"] = float(sum(s for _, s in self.inputs))
        self.sim._send_master(self, "epoch_done", epoch=self.epoch,
                              sums={"objective": 0.0}, timings=timings)

    def _after_epoch(self, f: dict) -> None:
        stop = self.epoch + 1 >= self.job.epochs or bool(f.get("stop"))
        if self.index == 0:
            self.sim._send_master(self, "epoch_report", epoch=self.epoch,
                                  metrics={"objective": self._objective()},
                                  stop=stop)
        ep = self.epoch
        self.epoch += 1
        if stop:
            self.sim._later(self._ckpt_seconds(final=True), self._finish, ep)
            return
        if f.get("checkpoint") or f.get("pause"):
            # as the runtime's executor: the part is written (and copied to its
            # replica) at the boundary, before the next epoch or the reconfig
            secs = self._ckpt_seconds()
            if f.get("pause"):
                return self.sim._later(secs, self._paused, ep)
            return self.sim._later(secs, self._checkpointed, ep, f)
        self._next(ep, f)

    def _checkpointed(self, ep: int, f: dict) -> None:
        if self.alive:
            self._ckpt_part(ep)
            self._next(ep, f)

    def _next(self, ep: int, f: dict) -> None:
        if f.get("reconfig"):
            return self.sim._send_master(self, "at_boundary", epoch=ep, seq=self.seq,
                                         inputs=self.inputs)
        over = self.sim.contention.epoch_overhead
        if over > 0:
            self.sim._later(over, self._begin_epoch)
        else:
            self._begin_epoch()

    def _objective(self) -> float:
        """What the app prints after this epoch: its loss after the real
        iterations done so far, or (no curve) the epochs left."""
        if self.job.loss is None:
            return float(self.job.epochs - self.epoch)
        done = sum(n * k for n, k in self.job.plan[:self.epoch + 1])
        return float(self.job.loss(done))

    def _ckpt_total(self) -> float:
        """What a periodic checkpoint or a pause writes, all parts."""
        j = self.job
        return j.model_bytes + j.input_bytes if j.ckpt_bytes is None else j.ckpt_bytes

    def _ckpt_seconds(self, final: bool = False) -> float:
        """A checkpoint part's write and its copy to the replica: its share
        of ``_ckpt_total`` (the final one: of ``final_bytes``)."""
        c = self.sim.contention
        part = (self.job.final_bytes if final else self._ckpt_total()) / self.count
        return part / c.disk + part / c.bandwidth

    def _finish(self, ep: int) -> None:
        part = int(self.job.final_bytes / self.count)
        self.sim._send_master(self, "ckpt_final", epoch=ep, version=1, bytes=part)
        self.sim._send_master(self, "exec_finished")
        self.kill()

    def _paused(self, ep: int) -> None:
        part = int(self._ckpt_total() / self.count)
        self.sim._send_master(self, "exec_paused", attempt=self.attempt, epoch=ep, version=1,
                              bytes=part)
        self.kill()

    def _ckpt_part(self, ep: int) -> None:
        if self.alive:
            part = int(self._ckpt_total() / self.count)
            self.sim._send_master(self, "ckpt_part", epoch=ep, version=1, bytes=part)

    def _migrate(self, f: dict) -> None:
        """Send the blocks the plan moves away, receive the ones it moves
        here; the link is the bottleneck (bytes out or in, the larger)."""
        nb, mb = self.sim.input_blocks, self.sim.model_blocks
        size = {"input": self.job.input_bytes / nb, "model": self.job.model_bytes / mb}
        out = sum(size[k] for k, _, _ in f["sends"])
        inn = size["model"] * f["expect"]      # an estimate: expect counts blocks
        # in force once reconfigured
        self.new = (f["index"], f["count"], list(f["owner"]), list(f["machines"]))
        self.seq = f["seq"]
        self.queued = f["mode"] == "queued"
        moved = {b for k, b, _ in f["sends"] if k == "input"}
        if moved and self.sim.block_work:
            byid = dict((b, s) for b, s in self.inputs)
            for k, b, n in f["sends"]:
                if k == "input":
                    self.sim.incoming.setdefault((self.jid, f["epoch"] + 1, n), []).append(
                        [b, byid.get(b, int(size["input"]))])
        self.inputs = [x for x in self.inputs if x[0] not in moved]
        self.epoch = f["epoch"] + 1
        bw = self.sim.contention.bandwidth
        if f.get("paced"):      # the sends come as the master's move commands
            self._moving = {"t0": self.sim.now, "free": self.sim.now, "out": 0.0,
                            "in_s": inn / bw, "inn": inn, "size": size}
            return
        secs = max(out, inn) / bw
        self.sim._later(secs, lambda: self.sim._send_master(
            self, "migrated", bytes_out=int(out), bytes_in=int(inn), seconds=secs))

    def _move(self, f: dict) -> None:
        """One move of a paced resize: the link sends one move after the
        other; op -1: every move sent, migrated once the arrivals are in."""
        mv, now = self._moving, self.sim.now
        if f["op"] < 0:
            end = max(now, mv["t0"] + mv["in_s"])
            self.sim._at(end, lambda: self.sim._send_master(
                self, "migrated", bytes_out=int(mv["out"]), bytes_in=int(mv["inn"]),
                seconds=end - mv["t0"]))
            return
        nbytes = sum(mv["size"][k] for k, _, _ in f["sends"])
        mv["out"] += nbytes
        mv["free"] = max(now, mv["free"]) + nbytes / self.sim.contention.bandwidth
        op = f["op"]
        self.sim._at(mv["free"], lambda: self.sim._send_master(
            self, "moved", op=op, bytes_out=int(nbytes)))


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
                 validate: bool = False) -> None:
        # check the core's invariants after every instant (MasterCore.validate)
        self.validate = validate
        self.jobs = sorted(jobs, key=lambda j: (j.arrival, j.id))
        self.contention = contention or Contention()
        self.core = C.MasterCore(policy=policy, mode=mode, heartbeat_timeout=INF,
                                 launch_timeout=INF, max_jobs_per_machine=max_jobs_per_machine,
                                 liveness_every=INF, cruise=cruise, max_moves=max_moves)
        self.block_work = block_work or cruise
        self.incoming: dict[tuple[str, int, int], list] = {}   # blocks a move sends
        self.mode, self.policy = mode, self.core.policy_name
        queued = self.core.queued
        self.machines = {f"m{i}": _Machine(self, f"m{i}", queued) for i in range(machines)}
        for attr, speeds in (("cpu_speed", cpu_speed), ("net_speed", net_speed)):
            for m, v in zip(self.machines.values(), per_machine(speeds, machines, attr)):
                setattr(m, attr, v)
        self.by_ident = {m.ident: m for m in self.machines.values()}
        self.cpus, self.memory = cpus, memory
        self.input_blocks, self.model_blocks = input_blocks, model_blocks
        self.execs: dict[bytes, _Exec] = {}
        self.util = Util(bucket)
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

    # -- the event queue ---------------------------------------------------------------
    def _at(self, t: float, fn: Callable, *args: Any) -> None:
        heapq.heappush(self._q, (t, next(self._n), fn, args))

    def _later(self, dt: float, fn: Callable, *args: Any) -> None:
        self._at(self.now + dt, fn, *args)

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
        Send, route = C.Send, self._route
        for cmd in commands:
            kind = type(cmd)
            if kind is Send:
                if cmd.type != "ckpt_gc":     # (daemons only; simulated disks hold nothing)
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
            q = m.q
            if q is not None and f["job"] in m.execs:
                m.act(q.enqueue(Sub(f["job"], f["seq"], f["kind"], f["prio"]), self.now))
            return
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

    def _startup(self, job: SimJob, count: int) -> float:
        c = self.contention
        return c.startup + job.input_bytes / count / c.disk

    def _start_up(self, ex: _Exec, join: bool) -> None:
        """Launch to ready: ``startup_cpu`` seconds of CPU work on its
        machine (sharing the CPU with what runs there: on a busy machine the
        start-up takes longer and slows the COMPs), then the rest."""
        total = self._startup(ex.job, ex.count)
        cpu = min(self.contention.startup_cpu, total)
        if cpu <= 0:
            return self._later(total, self._ready, ex, join)

        def computed() -> None:
            if ex.alive:
                self._later(total - cpu, self._ready, ex, join)
        ex.machine.cpu.start((ex.jid, "setup", ex.ident), cpu, computed, self.now)

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
