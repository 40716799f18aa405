"""A simulated job executor, driven by the master core's messages.

What a simulated executor does follows ``harmony/worker/executor/``:
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

from typing import TYPE_CHECKING

from harmony.worker import executor_core as core

if TYPE_CHECKING:
    from harmony.sim.engine import SimJob, Simulator
    from harmony.sim.machine import _Machine


class _Exec:
    """One simulated job executor (see harmony/worker/executor/)."""

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
        self.ckpt_done_at = 0.0     # a periodic part written behind the job is done
        self.ckpt_seq = 0           # which part behind the job counts (a dropped one not)
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
        m.cpu.drop((self.jid, "setup-low", self.ident), now)
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
            # free mode: a barrier through the master after each PULL and
            # each PUSH; with the synchronizer's delay (Simulator.sync_s)
            # each costs one round, k real ones per simulated step
            if self.sim.sync_s and self.step in (0, 1):
                k = self.job.plan[min(self.epoch, len(self.job.plan) - 1)][1]
                return self.sim._later(self.sim.sync_s * k, self._run_alive, kind)
            return self._run(kind)
        seq = self.seq
        self.seq = self.waiting = seq + 1     # its grant may come back at once
        self.sim._deliver(self.ident, "sync", {"seq": seq, "next": kind, "job": self.jid,
                                               "index": self.index})

    def _run_alive(self, kind: str) -> None:
        if self.alive:
            self._run(kind)

    def granted(self, seq: int) -> None:
        if self.waiting != seq or not self.alive:
            return
        self.waiting = None
        self._run("cpu" if self.step in (1, 4) else "net")

    def eval_work(self) -> float:
        """The evaluation's CPU seconds on this executor's machine."""
        at = self.job.eval_at
        return at(self.count) if at is not None else self.job.eval_cpu / self.count

    def _run(self, kind: str) -> None:
        t_cpu, t_net = self.job.profile(self.count)
        k = self.job.plan[self.epoch][1]
        local = 0.0
        if self.step == 0 or self.step == 2:
            c = self.job.comm_cpu
            work, local = k * t_net / 2, k * (self.job.net_local if c is None
                                               else c(self.count)) / 2
        elif self.step == 1:
            work = k * t_cpu
        elif self.step == 3:            # the evaluation pulls the model once
            work, local = t_net / 2, self.job.net_local / 2
        else:
            work = self.eval_work()
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
                3 if self.job.eval_cpu > 0 or self.job.eval_at is not None else None
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
                   "eval": tm["eval"], "eval_cpu": self.eval_work(),
                   "bytes": self.job.bytes * iters * e,
                   "link": self.job.link * self.machine.net_speed, "sync": 0.0}
        if self.job.comm_cpu is not None:
            # the CPU its COMM cost, as the runtime's executors report it (the
            # process's CPU while training less its COMP thread's); only for
            # jobs whose trace measured it, so other traces decide as before
            timings["comp_cpu"] = timings["comp"]
            timings["train_cpu"] = timings["comp"] + iters * self.job.comm_cpu(self.count) * e
        if self.sim.block_work:         # what Cruise's estimates read (d_i, block size)
            timings["blocks"] = float(len(self.inputs))
            timings["input_bytes"] = float(sum(s for _, s in self.inputs))
        self.sim._send_master(self, "epoch_done", epoch=self.epoch,
                              sums={"objective": 0.0}, timings=timings)

    def _after_epoch(self, f: dict) -> None:
        stop = self.epoch + 1 >= self.job.epochs
        self._boundary(core.handle(core.EpochSums(self.epoch, self.index, stop, f)))

    def _boundary(self, cmds: list) -> None:
        """Do an epoch boundary's commands (harmony.worker.executor_core), in
        order. As the runtime's executor: a periodic checkpoint's part is
        written (and copied to its replica) behind the job, which goes on at
        once, and reported when done; a pause's part and the final one take
        their simulated seconds at the boundary, a pause's after the part
        behind the job, which a reconfig also waits for, and which the
        final one drops (its link time is then not counted)."""
        for cmd in cmds:
            kind = type(cmd)
            behind = max(0.0, self.ckpt_done_at - self.sim.now)
            if kind is core.Report:
                if cmd.to_master:
                    self.sim._send_master(self, "epoch_report", epoch=self.epoch,
                                          metrics={"objective": self._objective()},
                                          stop=cmd.stop)
                self.epoch += 1
            elif kind is core.FinalCheckpoint:
                self.ckpt_seq += 1
                self.sim._later(self._ckpt_seconds(final=True), self._finish, cmd.epoch)
                return
            elif kind is core.Pause:
                return self.sim._later(behind + self._ckpt_seconds(), self._paused, cmd.epoch)
            elif kind is core.Checkpoint:
                secs = behind + self._ckpt_seconds()
                self.ckpt_done_at = self.sim.now + secs
                self.ckpt_seq += 1
                self.sim._later(secs, self._ckpt_part, cmd.epoch, self.ckpt_seq)
            elif kind is core.Reconfigure:
                if behind > 0:     # at that instant: after the part's report
                    return self.sim._at(self.ckpt_done_at, self._at_boundary, cmd.epoch)
                return self._at_boundary(cmd.epoch)
            elif kind is core.Continue:
                over = self.sim.contention.epoch_overhead
                if over > 0:
                    self.sim._later(over, self._begin_epoch)
                else:
                    self._begin_epoch()
            # SetPrio: the simulated syncs carry no priority

    def _at_boundary(self, epoch: int) -> None:
        if self.alive:
            self.sim._send_master(self, "at_boundary", epoch=epoch, seq=self.seq,
                                  inputs=self.inputs)

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

    def _ckpt_part(self, ep: int, seq: int) -> None:
        if self.alive and seq == self.ckpt_seq:
            part = int(self._ckpt_total() / self.count)
            self.sim._send_master(self, "ckpt_part", epoch=ep, version=1, bytes=part)

    def _migrate(self, f: dict) -> None:
        """Send the blocks the plan moves away, receive the ones it moves
        here; the link is the bottleneck (bytes out or in, the larger)."""
        nb, mb = self.sim.input_blocks, self.sim.model_blocks
        size = {"input": self.job.input_bytes / nb, "model": self.job.model_bytes / mb}
        out = sum(size[k] for k, _, _ in f["sends"])
        for k, _, n in f["sends"]:          # what each receiver gets, by its senders
            tally = self.sim.move_in.setdefault((self.jid, f["seq"], n), [0.0, 0])
            tally[0] += size[k]
            tally[1] += 1
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
        key, expect = (self.jid, f["seq"], f["index"]), f["expect"]
        if f.get("paced"):      # the sends come as the master's move commands
            self._moving = {"t0": self.sim.now, "free": self.sim.now, "out": 0.0,
                            "key": key, "expect": expect, "size": size}
            return

        def start() -> None:
            # after every executor of the plan had its part (they come in one
            # instant, senders and receivers in any order)
            inn = self._incoming(key, expect, size)
            secs = max(out, inn) / bw
            self.sim._later(secs, lambda: self.sim._send_master(
                self, "migrated", bytes_out=int(out), bytes_in=int(inn), seconds=secs))
        self.sim._later(0.0, start)

    def _incoming(self, key: tuple, expect: int, size: dict) -> float:
        """The bytes a resize brings this executor (new index ``key[2]``):
        what its senders' parts of the plan send it, and any of the
        ``expect`` blocks not yet seen (a sender whose part comes later in
        the same instant) at a model block's size. The receiving link
        takes them all: a job narrowed from 4 machines to 1 receives three
        machines' input over one link (before, only ``expect`` model
        blocks were counted, and the simulated narrowing of Lasso took
        1.3 s where the runtime's took 4.1 s)."""
        got, seen = self.sim.move_in.pop(key, (0.0, 0))
        return got + size["model"] * max(0, expect - seen)

    def _move(self, f: dict) -> None:
        """One move of a paced resize: the link sends one move after the
        other; op -1: every move sent, migrated once the arrivals are in."""
        mv, now = self._moving, self.sim.now
        if f["op"] < 0:
            inn = self._incoming(mv["key"], mv["expect"], mv["size"])
            end = max(now, mv["t0"] + inn / self.sim.contention.bandwidth)
            self.sim._at(end, lambda: self.sim._send_master(
                self, "migrated", bytes_out=int(mv["out"]), bytes_in=int(inn),
                seconds=end - mv["t0"]))
            return
        nbytes = sum(mv["size"][k] for k, _, _ in f["sends"])
        mv["out"] += nbytes
        mv["free"] = max(now, mv["free"]) + nbytes / self.sim.contention.bandwidth
        op = f["op"]
        self.sim._at(mv["free"], lambda: self.sim._send_master(
            self, "moved", op=op, bytes_out=int(nbytes)))
