"""A test driver of the real master core (``harmony.master.core.MasterCore``):
it plays the peers' side of the protocol with as little logic as it can.

- daemons: ``register``; a ``launch`` makes a :class:`FakeExecutor` that
  answers ``exec_ready`` at once (or when the test says: ``ready=False``,
  :meth:`CoreDriver.ready`); ``kill`` ends it;
- executors: an epoch ends only when the test asks (:meth:`CoreDriver.epoch`:
  ``epoch_done`` from every executor of the job with the timings given);
  the master's ``epoch_sums`` answer is done as the real executors do it
  (``harmony.worker.executor_core.handle``: ``epoch_report`` from executor
  0, the final checkpoint and ``exec_finished`` at the job's last epoch, a
  checkpoint part, ``exec_paused``, ``at_boundary``); a live resize's
  ``migrate``/``move`` are answered with ``moved``/``migrated`` at once;
- a client: ``submit``; the driver numbers admitted jobs ``job-0001``, ...

Time stands still unless a test moves ``CoreDriver.t``. Every event goes
through :meth:`CoreDriver.handle`, which checks ``MasterCore.validate()``
after it and that every message the core sends is valid
(``messages.encode``). Decisions the core records are kept in
``CoreDriver.decisions``, every command it sent in ``CoreDriver.sent``, the
views its policy was asked about in ``CoreDriver.views`` (a decision that
changes nothing is not recorded).
"""
from __future__ import annotations

from typing import Any

from harmony.comm import messages as M
from harmony.master import core as C
from harmony.master.jobs import JobState, declared_epochs
from harmony.worker import executor_core as X

INF = float("inf")
LINK = 1e6          # bytes/s the fake executors report for their links
INPUT_BLOCKS = 8    # input blocks of a job, spread over its executors
MODEL_BLOCKS = 8


def work(t_cpu: float, t_net: float, iters: int = 1, remote: float = 0.0):
    """A job's work per iteration on one machine, as the performance model
    has it (``harmony.sched.model``): ``t_cpu`` seconds of COMP (1/m of it
    on each of m machines), ``t_net`` of COMM that stays local and ``remote``
    seconds to move its PULL + PUSH bytes over the link, (m-1)/m of which
    cross it on m machines. Returns ``m -> one executor's epoch timings``
    (``iters`` iterations, no overhead): what a job of this work reports on
    m machines, and so the profile ``Job.update_profile`` makes of it,
    ``(t_cpu / m, t_net + remote (m-1)/m, m, remote)``."""
    def at(m: int) -> dict:
        comp, net = t_cpu / m, t_net + remote * (m - 1) / m
        return {"comp": comp * iters, "pull": net * iters / 2, "push": net * iters / 2,
                "train": (comp + net) * iters, "iters": float(iters),
                "bytes": remote * LINK * iters, "link": LINK}
    return at


class FakeExecutor:
    """One executor of a job, as its peer sees it (see the module docstring)."""

    def __init__(self, drv: "CoreDriver", jid: str, machine: str, f: dict) -> None:
        self.drv, self.jid, self.machine = drv, jid, machine
        self.index, self.count, self.attempt = f["index"], f["count"], f["attempt"]
        self.max_epochs = declared_epochs(f["args"])
        self.epoch = (f.get("resume") or {}).get("epoch", 0)
        self.join = bool(f.get("join"))
        self.started = False        # job_start (or, joining, reconfigured) heard
        self.alive = True
        self.new: tuple[int, int] | None = None     # (index, count) after a resize
        self.ident = f"x:{jid}:{f['index']}:{f['attempt']}:{machine}".encode()

    def send(self, mtype: str, **fields: Any) -> None:
        self.drv.deliver(self.ident, mtype, job=self.jid, index=self.index, **fields)

    def ready(self) -> None:
        self.send("exec_ready", attempt=self.attempt, endpoint=f"fake://{self.machine}",
                  num_keys=64, dim=1, model_blocks=MODEL_BLOCKS, local_blocks=0,
                  **({"join": True} if self.join else {}))

    def inputs(self) -> list:
        return [[b, 1] for b in range(INPUT_BLOCKS) if b % self.count == self.index]

    def end_epoch(self, tm: dict) -> None:
        self.send("epoch_done", epoch=self.epoch, sums={"objective": 0.0}, timings=dict(tm))

    def on(self, mtype: str, f: dict) -> None:
        if not self.alive:
            return
        if mtype == "job_start":
            self.started, self.count = True, len(f["machines"])
        elif mtype == "epoch_sums":
            stop = self.epoch + 1 >= self.max_epochs
            self.boundary(X.handle(X.EpochSums(self.epoch, self.index, stop, f)))
        elif mtype == "migrate":
            self.new, self.epoch = (f["index"], f["count"]), f["epoch"] + 1
            if not f.get("paced"):      # nothing to send: done once it has its blocks
                self.send("migrated", bytes_out=0, bytes_in=0, seconds=0.0)
        elif mtype == "move":
            if f["op"] >= 0:
                self.send("moved", op=f["op"], bytes_out=len(f["sends"]))
            else:
                self.send("migrated", bytes_out=0, bytes_in=0, seconds=0.0)
        elif mtype == "reconfigured":
            (self.index, self.count), self.started = self.new, True
        elif mtype in ("abort", "leave"):
            self.alive = False

    def boundary(self, cmds: list) -> None:
        for cmd in cmds:
            kind = type(cmd)
            if kind is X.Report:
                if cmd.to_master:
                    self.send("epoch_report", epoch=cmd.epoch, metrics={"objective": 0.0},
                              stop=cmd.stop)
                self.epoch += 1
            elif kind is X.FinalCheckpoint:
                self.send("ckpt_final", epoch=cmd.epoch, version=1, bytes=1)
                self.send("exec_finished")
                self.alive = False
            elif kind is X.Pause:
                self.send("exec_paused", attempt=self.attempt, epoch=cmd.epoch, version=1,
                          bytes=1)
                self.alive = False
            elif kind is X.Checkpoint:
                self.send("ckpt_part", epoch=cmd.epoch, version=1, bytes=1)
            elif kind is X.Reconfigure:
                self.started = False        # until reconfigured
                self.send("at_boundary", epoch=cmd.epoch, seq=0, inputs=self.inputs())
            # Continue: the next epoch ends when the test says; SetPrio: unused


class _Watched:
    """The core's policy, unchanged, with the views it is asked about kept."""

    def __init__(self, policy: Any, views: list) -> None:
        self._policy, self._views = policy, views

    def __getattr__(self, name: str) -> Any:
        return getattr(self._policy, name)

    def decide(self, view: Any) -> Any:
        self._views.append(view)
        return self._policy.decide(view)


class CoreDriver:
    """A :class:`MasterCore` with ``machines`` daemons registered (``m0``,
    ``m1``, ...; 1 CPU each), driven by events only."""

    def __init__(self, machines: int = 2, *, mode: str = "harmony", ready: bool = True,
                 **kw: Any) -> None:
        self.t = 0.0
        self.auto_ready = ready      # launched executors answer at once (else: ready())
        self.core = C.MasterCore(mode=mode, heartbeat_timeout=INF, launch_timeout=INF, **kw)
        self.views: list = []        # every ClusterView the policy was asked about
        self.core.policy = _Watched(self.core.policy, self.views)
        self.sent: list[C.Send] = []
        self.decisions: list[dict] = []
        self.execs: dict[bytes, FakeExecutor] = {}
        self.client = b"client"
        self._seq = 0
        for i in range(machines):
            self.register(f"m{i}")

    # -- events in, commands carried out ----------------------------------------------
    def handle(self, event: Any) -> None:
        cmds = self.core.handle(event, self.t)
        self.core.validate()
        for cmd in cmds:
            kind = type(cmd)
            if kind is C.Send:
                M.encode(cmd.type, **cmd.fields)        # every message it sends is valid
                self.sent.append(cmd)
                self.route(cmd)
            elif kind is C.Admit:
                self._seq += 1
                cmd.job.id = f"job-{self._seq:04d}"
                self.handle(C.Admitted(cmd.ident, cmd.job))
            elif kind is C.Record and cmd.stream == "decisions":
                self.decisions.append(cmd.obj)
            elif kind is C.Solve:
                self.handle(C.Solved(cmd.key, cmd.fn()))

    def deliver(self, ident: bytes, mtype: str, **fields: Any) -> None:
        self.handle(C.Received(ident, M.Message(mtype, fields, [])))

    def route(self, cmd: C.Send) -> None:
        ex = self.execs.get(cmd.to)
        if ex is not None:
            return ex.on(cmd.type, cmd.fields)
        if not cmd.to.startswith(b"d:"):
            return                                  # a reply to the client
        machine = cmd.to[2:].decode()
        f = cmd.fields
        if cmd.type == "launch":
            ex = FakeExecutor(self, f["job"], machine, f)
            self.execs[ex.ident] = ex
            if self.auto_ready:
                ex.ready()
        elif cmd.type == "kill":
            for ex in self.execs.values():
                if ex.jid == f["job"] and ex.machine == machine:
                    ex.alive = False

    # -- the peers' side ----------------------------------------------------------------
    def register(self, name: str) -> None:
        self.deliver(f"d:{name}".encode(), "register", name=name, host="h", cpus=1,
                     memory=1 << 30, pid=1, executors=[], data_endpoint=f"fake://{name}")

    def reconnect(self, name: str) -> None:
        """The daemon on ``name`` registers again, reporting the executors it
        runs (as after a lost connection): the core schedules again at the
        next tick, on the same state."""
        jobs = sorted({x.jid for x in self.execs.values() if x.machine == name and x.alive})
        self.deliver(f"d:{name}".encode(), "register", name=name, host="h", cpus=1,
                     memory=1 << 30, pid=1, executors=jobs, data_endpoint=f"fake://{name}")

    def crash(self, jid: str, index: int = 0, code: int = -9) -> None:
        """Executor ``index`` of ``jid`` dies (killed from outside by default:
        the job is requeued); its daemon reports it."""
        x = next(x for x in self.executors(jid) if x.index == index)
        x.alive = False
        self.deliver(f"d:{x.machine}".encode(), "exec_exited", job=jid, index=index,
                     attempt=x.attempt, code=code, log_tail="")

    def submit(self, machines: int = 1, epochs: int | None = None) -> str:
        """A job asking for ``machines`` machines (and ``--max-epochs``):
        its id (submitted, not scheduled before the next tick)."""
        args = ["--max-epochs", str(epochs)] if epochs else []
        self.deliver(self.client, "submit", app_name="a.py", app_source="", args=args,
                     machines=machines)
        return f"job-{self._seq:04d}"

    def tick(self) -> list[dict]:
        """The shell's timer (the scheduler runs on it): the decisions it made.
        Where the policy asked to decide again later (``Decision.again_at``:
        a lone new job held for the rest of a batch), that time passes with
        nothing else happening, and the timer fires then too."""
        n = len(self.decisions)
        self.handle(C.Tick())
        while self.core.wake_at > self.t:
            self.t = self.core.wake_at
            self.handle(C.Tick())
        return self.decisions[n:]

    def ready(self, jid: str) -> None:
        """The executors of ``jid``'s current launch that have not said so
        report ready (with ``ready=False``)."""
        run = self.core.runs[jid]
        for x in list(self.execs.values()):
            if x.jid == jid and x.attempt == run.attempt and x.alive and not x.started:
                x.ready()

    def executors(self, jid: str) -> list[FakeExecutor]:
        """The running executors of ``jid``'s current launch, by index."""
        run = self.core.runs.get(jid)
        return sorted((x for x in self.execs.values() if x.jid == jid and x.alive
                       and x.started and run is not None and x.attempt == run.attempt),
                      key=lambda x: x.index)

    def epoch(self, jid: str, w) -> None:
        """Every executor of ``jid`` ends its epoch, with the timings of
        work ``w`` (:func:`work`) on the job's machines."""
        xs = self.executors(jid)
        assert xs, f"{jid} has no running executors"
        tm = w(len(self.core.jobs[jid].workers))
        for x in xs:
            x.end_epoch(tm)

    def epochs(self, tms: dict, n: int = 1) -> list[dict]:
        """``n`` rounds: every running job of ``tms`` (job -> :func:`work`)
        ends an epoch, then a tick. Returns the decisions made."""
        n0 = len(self.decisions)
        for _ in range(n):
            for jid, tm in tms.items():
                if self.core.jobs[jid].state.active and self.executors(jid):
                    self.epoch(jid, tm)
            self.tick()
        return self.decisions[n0:]

    def settle(self, tms: dict, rounds: int = 40, quiet: int = 4) -> list[dict]:
        """Rounds of epochs (:meth:`epochs`) until ``quiet`` rounds in a row
        change nothing (no decision that profiles, starts, pauses, moves or
        promotes a job; no move in flight). Returns every decision made."""
        n0, calm = len(self.decisions), 0
        for _ in range(rounds):
            before = len(self.decisions)
            self.epochs(tms)
            acted = any(acts(d) for d in self.decisions[before:]) or any(
                r.pausing or r.reconfig is not None for r in self.core.runs.values())
            calm = 0 if acted else calm + 1
            if calm >= quiet:
                return self.decisions[n0:]
        raise AssertionError(f"the core did not settle: {self.decisions[-3:]}")

    # -- views of the core's state --------------------------------------------------------
    def state(self, jid: str) -> JobState:
        return self.core.jobs[jid].state

    def workers(self, jid: str) -> list[str]:
        return list(self.core.jobs[jid].workers)

    def group(self, jid: str) -> str:
        return self.core.jobs[jid].sched_group


def acts(d: dict) -> bool:
    """Whether a recorded decision changes what runs where."""
    return bool(d["profile"] or d["start"] or d["pause"] or d["promote"] or d.get("stop"))
