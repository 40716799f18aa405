"""A load generator against the real master process (issue #32, item 1).

Starts a real ``harmony-master`` (``python -m harmony.master start``, with a
CurveZMQ key set, as deployed) and drives it from emulated worker daemons
and job executors: lightweight clients, many per process, each with its own
DEALER socket and its worker's key (an executor uses its daemon's key, as a
real one does), speaking the real message sequences of
:mod:`harmony.comm.messages`:

* a daemon registers and sends a heartbeat every ``heartbeat_interval``
  (the master's answer, 1 s) with its executors and queue stats;
* a ``launch`` starts an emulated executor (a new socket), which reports
  ``exec_ready`` and waits for ``job_start``;
* queued (harmony) mode: each subtask boundary is a ``sync`` to the
  master; the master's ``enqueue`` goes to every machine's daemon, whose
  subtask queues are the real :class:`harmony.worker.daemon_core.DaemonCore`
  (no CPU preemption); a granted subtask "runs" for its length (a timer);
  free (naive) mode: the executors' ``barrier`` rounds instead;
* per epoch (ITERS iterations of PULL, COMP, PUSH, then the evaluation's
  PULL and COMP): ``epoch_done``, ``epoch_sums`` back, ``epoch_report``
  from executor 0, and a ``ckpt_part`` when the master asks for the
  periodic checkpoint; ``exec_paused`` when it pauses a job;
* readers poll ``list_jobs``, ``job_status`` and ``cluster_info`` a few times
  a second (the real :class:`harmony.client.Client`).

Jobs are real submissions (``Client.submit``); the master's policy places
them. The default policy is ``colocate`` (start-only) in harmony mode: a
policy that moves jobs (live resizes) is not emulated (``migrate`` is
counted as unsupported).

Measured over a window after a warm-up:

* the master's messages per second (in + out, counted at the emulated
  peers), its CPU (cores, psutil on its pid) and RSS;
* the synchronizer's added delay per round: from the last executor's
  ``sync`` of a subtask to the ``enqueue`` arriving at every machine of the
  job (free mode: last ``barrier`` to the last ``release``), p50 / p99;
  every round counted must be complete (all syncs, all enqueues);
* the latency of ``job_status``, ``list_jobs`` and ``cluster_info``;
* heartbeats: their round trip, and any worker the master declared lost.

The emulators share the machine with the master: their own CPU is reported
too (``gen_cpu``); when it is near the cores there are, the delays are the
emulators' as much as the master's.

    python bench/master_load.py --machines 100 --jobs 30 --dop 2-30 --subtask 0.1
    python bench/master_load.py --sweep [--out results.json]
    python bench/master_load.py --machines 4 --jobs 2 --dop 2 --subtask 0.05 \\
        --warmup 1 --duration 4 --json out.json          # what the test runs

Every socket operation has a timeout or is non-blocking, every loop is
bounded in count and time, and the master and emulator processes are
stopped on exit and on SIGTERM.
"""
from __future__ import annotations

import argparse
import heapq
import itertools
import json
import multiprocessing as mp
import os
import random
import re
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from array import array
from pathlib import Path

import numpy as np
import psutil
import zmq
import zmq.auth
from msgpack import packb, unpackb

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harmony.comm import messages as M  # noqa: E402
from harmony.comm import security  # noqa: E402
from harmony.worker.daemon_core import DaemonCore, Deliver, Sub  # noqa: E402
from harmony.subtasks.queues import Grant, QueueError  # noqa: E402
from harmony.subtasks.sync import Failed, Plan, Sync, SyncLeader, SyncRouter  # noqa: E402

_events = zmq.backend.Socket.get          # an int, not the sugar's enum (a hot path)
_ZMQ_EVENTS = int(zmq.EVENTS)
mono = time.monotonic          # CLOCK_MONOTONIC: one clock for every process here
APP_SOURCE = "# emulated by bench/master_load.py: the master never runs an app\n"
SOCK_TIMEOUT_MS = 5000

# the sweep (issue #32): machines, jobs, DoP range, subtask seconds
SWEEP_SHAPES = [(10, 20, (2, 10)), (100, 30, (2, 30)), (500, 100, (2, 50)),
                (1000, 200, (2, 50))]
SWEEP_SUBTASKS = [1.0, 0.1, 0.02]


# ====================================================================== emulator side
def _worker_curve(keydir: str, name: str) -> tuple[bytes, bytes]:
    return zmq.auth.load_certificate(os.path.join(keydir, "workers", f"{name}.key_secret"))


class Exec:
    """One emulated executor: its own socket (its machine's key)."""
    __slots__ = ("m", "job", "jnum", "index", "attempt", "count", "sock", "seq", "epoch",
                 "state", "replica", "queued", "rnd", "t_epoch", "alive", "gen", "secret")

    def __init__(self, m: "Machine", job: str, index: int, attempt: int, count: int,
                 sock: zmq.Socket) -> None:
        self.m, self.job, self.index, self.attempt, self.count = m, job, index, attempt, count
        self.jnum = int(re.sub(r"\D", "", job) or 0)
        self.sock = sock
        self.seq = 0            # queued: the last subtask done (the next sync's seq)
        self.epoch = 0
        self.state = "setup"
        self.replica = None
        self.queued = True
        self.rnd = 0            # free mode: barrier rounds sent
        self.t_epoch = 0.0
        self.alive = True
        self.gen: int | None = None     # leader synchronization: the layout's generation
        self.secret = ""                # the attempt's secret (tags its syncs to a leader)


class Machine:
    """One emulated worker daemon."""
    __slots__ = ("name", "sock", "pub", "sec", "core", "execs", "registered", "hb_sent",
                 "hb_next", "leader", "router", "links", "launches")

    def __init__(self, name: str, sock: zmq.Socket, pub: bytes, sec: bytes) -> None:
        self.name, self.sock, self.pub, self.sec = name, sock, pub, sec
        self.core = DaemonCore(preempt=False)
        self.execs: dict[str, Exec] = {}
        self.registered = False
        self.hb_sent: list[float] = []
        self.hb_next = 0.0
        self.launches = 0           # launch messages since it registered (heartbeats say)
        # the synchronizer off the master (--sync leader): the jobs it leads,
        # where its executors' syncs go, and its connections to leaders
        self.leader = SyncLeader(name)
        self.router = SyncRouter()
        self.links: dict[str, zmq.Socket] = {}


class Link:
    """A daemon's connection to a leader (an emulator process's sync socket)."""
    __slots__ = ("m",)

    def __init__(self, m: Machine) -> None:
        self.m = m


class Emulator:
    """Many machines (daemons and their executors) in one process."""

    def __init__(self, cfg: dict, names: list[str], endpoint: str, out: str, stop) -> None:
        self.cfg, self.names, self.endpoint, self.out, self.stop = cfg, names, endpoint, out, stop
        self.L = float(cfg["subtask"])
        self.check = bool(cfg.get("check"))
        self.iters = int(cfg["iters"])
        # one epoch's subtasks: ITERS x (PULL, COMP, PUSH), then the evaluation's PULL, COMP
        self.plan = ["net", "cpu", "net"] * self.iters + ["net", "cpu"]
        self._free = self._free_ops()
        self.ctx = zmq.Context(io_threads=1)
        self.ctx.set(zmq.MAX_SOCKETS, 60000)     # a context option (default 1023)
        self.server_pub, _ = zmq.auth.load_certificate(
            os.path.join(cfg["keys"], "cluster.key"))
        # epoll on the sockets' zmq.FD: a pass costs what is ready, not the
        # number of sockets (zmq.Poller's does); ``pending``: sockets to look
        # at (zmq.EVENTS) whatever epoll says (new ones, and after a send)
        self.ep = select.epoll()
        self.by_fd: dict[int, zmq.Socket] = {}
        self.pending: set[zmq.Socket] = set()
        self.owner: dict[zmq.Socket, object] = {}
        self.timers: list = []
        self._tie = itertools.count()
        self.rng = random.Random(hash((cfg["seed"], names[0] if names else "")))
        # rounds: (job number, attempt, round, t) of each sync / barrier sent and
        # each enqueue / release received
        self.r_send = array("d")
        self.r_recv = array("d")
        self.hb_rtt = array("d")        # (t, rtt)
        self.counts = {"sent": 0, "recv": 0, "dropped": 0, "aborts": 0, "errors": 0,
                       "unknown_worker": 0, "unsupported": 0, "launches": 0, "ckpts": 0,
                       "pauses": 0, "kills": 0, "epochs": 0, "queue_errors": 0,
                       "peer_sent": 0, "peer_recv": 0}
        self.errors: dict[str, int] = {}
        self.machines: list[Machine] = []
        # --sync leader: one sync socket per emulator process serves as the
        # leader endpoint of its machines (a real daemon has its own); the
        # job -> its leader here; machine -> its link's identity here
        self.sync_sock: zmq.Socket | None = None
        self.sync_ep = ""
        self.leads: dict[str, Machine] = {}
        self.silenced: set[str] = set()
        self.members: dict[str, bytes] = {}
        # (t, sent, recv, CPU seconds) each second
        self.series: list[tuple[float, int, int, float]] = []

    # -- sockets --------------------------------------------------------------------
    def _socket(self, pub: bytes, sec: bytes, owner: object,
                endpoint: str | None = None) -> zmq.Socket:
        s = self.ctx.socket(zmq.DEALER)
        s.curve_serverkey = self.server_pub
        s.curve_publickey = pub
        s.curve_secretkey = sec
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.SNDTIMEO, SOCK_TIMEOUT_MS)
        s.setsockopt(zmq.RCVTIMEO, SOCK_TIMEOUT_MS)
        s.connect(endpoint or self.endpoint)
        self._watch(s, owner)
        return s

    def _watch(self, s: zmq.Socket, owner: object) -> None:
        fd = s.getsockopt(zmq.FD)
        self.ep.register(fd, select.EPOLLIN)
        self.by_fd[fd] = s
        self.owner[s] = owner
        self.pending.add(s)

    def _close(self, s: zmq.Socket) -> None:
        fd = s.getsockopt(zmq.FD)
        try:
            self.ep.unregister(fd)
        except (KeyError, OSError):
            pass
        self.by_fd.pop(fd, None)
        self.owner.pop(s, None)
        self.pending.discard(s)
        s.close(linger=0)

    def send(self, s: zmq.Socket, mtype: str, peer: bool = False, **fields) -> None:
        """Send to the master (``peer``: to another daemon: counted apart)."""
        if self.check:      # validated against the schema (the test); else the same bytes
            raw = M.encode(mtype, **fields)
        else:
            fields["t"] = mtype
            raw = packb({k: v for k, v in fields.items() if v is not None}, use_bin_type=True)
        try:
            s.send(raw, zmq.NOBLOCK)
            self.counts["peer_sent" if peer else "sent"] += 1
            # a send may take the socket's read signal (zmq.FD is edge-like): look again
            self.pending.add(s)
        except zmq.Again:
            self.counts["dropped"] += 1

    def at(self, t: float, fn, *args) -> None:
        heapq.heappush(self.timers, (t, next(self._tie), fn, args))

    # -- the loop -------------------------------------------------------------------
    def run(self) -> None:
        pubsec = {n: _worker_curve(self.cfg["keys"], n) for n in self.names}
        self.machines = []
        if self.cfg.get("sync") == "leader":
            s = self.ctx.socket(zmq.ROUTER)
            _, secret = zmq.auth.load_certificate(
                os.path.join(self.cfg["keys"], "cluster.key_secret"))
            s.curve_server = True
            s.curve_publickey, s.curve_secretkey = self.server_pub, secret
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.SNDTIMEO, SOCK_TIMEOUT_MS)
            port = s.bind_to_random_port("tcp://127.0.0.1")
            self.sync_sock, self.sync_ep = s, f"tcp://127.0.0.1:{port}"
            self._watch(s, self)
        t0 = mono()
        for i, n in enumerate(self.names):
            m = Machine(n, None, *pubsec[n])
            m.sock = self._socket(m.pub, m.sec, m)
            m.hb_next = t0 + self.rng.random()      # staggered, as independent daemons are
            self.at(m.hb_next, self._beat, m)
            self.machines.append(m)
            self._register(m)
        self.at(t0 + 1.0, self._housekeeping)
        if self.cfg.get("silence") is not None and \
                self.cfg["silence"][1] in {m.name for m in self.machines}:
            self.at(t0 + 0.1, self._watch_silence)
        deadline = t0 + float(self.cfg["max_seconds"])
        try:
            while not self.stop.is_set() and mono() < deadline:
                now = mono()
                wait = 0.05
                if self.timers:
                    wait = max(0.0, min(wait, self.timers[0][0] - now))
                if self.pending:
                    wait = 0.0
                look = self.pending
                self.pending = set()
                for fd, _ in self.ep.poll(wait, 4096):
                    s = self.by_fd.get(fd)
                    if s is not None:
                        look.add(s)
                for s in look:
                    obj = self.owner.get(s)
                    if obj is None:
                        continue
                    for _ in range(64):          # bounded per socket per pass
                        if not _events(s, _ZMQ_EVENTS) & 1:      # POLLIN (no Again raised)
                            break
                        try:
                            if obj is self:         # the sync socket: [identity, message]
                                ident, raw = s.recv_multipart(zmq.NOBLOCK)
                            else:
                                raw = s.recv(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        self.counts["peer_recv" if obj is self or isinstance(obj, Link)
                                    else "recv"] += 1
                        try:
                            if self.check:
                                msg = M.decode([raw])
                            else:
                                f = unpackb(raw, raw=False)
                                msg = M.Message(f.pop("t"), f, [])
                        except (M.ProtocolError, ValueError, KeyError, TypeError):
                            self.counts["errors"] += 1
                            continue
                        if isinstance(obj, Machine):
                            self._on_daemon(obj, msg)
                        elif isinstance(obj, Exec):
                            self._on_exec(obj, msg)
                        elif isinstance(obj, Link):
                            self._on_daemon(obj.m, msg)     # an enqueue from a leader
                        else:
                            self._on_lsync(ident, msg)
                        if s not in self.owner:     # closed by its handler
                            break
                    else:
                        self.pending.add(s)         # more to read: next pass
                now = mono()
                for _ in range(10000):
                    if not self.timers or self.timers[0][0] > now:
                        break
                    _, _, fn, args = heapq.heappop(self.timers)
                    fn(*args)
        finally:
            self._dump()
            for s in list(self.owner):
                s.close(linger=0)
            self.ep.close()
            self.ctx.term()

    def _watch_silence(self) -> None:
        """--liveness: when the bench says so, one machine goes silent, as a
        machine that lost its network does: its daemon and its executors
        stop sending and reading."""
        ev, name = self.cfg["silence"]
        if not ev.is_set():
            return self.at(mono() + 0.1, self._watch_silence)
        m = next(x for x in self.machines if x.name == name)
        m.registered = False
        for job in list(m.execs):
            ex = m.execs.pop(job)
            ex.alive = False
            self._close(ex.sock)
        for link in m.links.values():
            self._close(link)
        m.links.clear()
        self._close(m.sock)
        self.silenced.add(m.name)       # its timers and its leader's work stop

    def _housekeeping(self) -> None:
        now = mono()
        self.series.append((now, self.counts["sent"], self.counts["recv"], time.process_time()))
        if os.getppid() == 1:           # the bench died: do not linger
            self.stop.set()
        self.at(now + 1.0, self._housekeeping)

    def _beat(self, m: Machine) -> None:
        """A daemon's timer: a heartbeat each interval (the master's answer
        to its registration: 1 s), or, not registered, a registration."""
        if m.name in self.silenced:
            return
        now = mono()
        m.hb_next += 1.0 if m.registered else 2.0
        if m.hb_next < now:             # fell behind: no burst to catch up
            m.hb_next = now + 1.0
        self.at(m.hb_next, self._beat, m)
        if m.registered:
            self._heartbeat(m, now)
        else:
            self._register(m)

    def _register(self, m: Machine) -> None:
        self.send(m.sock, "register", name=m.name, host="127.0.0.1", cpus=16,
                  memory=64 << 30, pid=os.getpid(), executors=sorted(m.execs),
                  data_endpoint="tcp://127.0.0.1:1", revision=None, dilation=1.0,
                  sync_endpoint=self.sync_ep or None)

    def _heartbeat(self, m: Machine, now: float) -> None:
        q = m.core.queue_stats()
        busy = m.core.busy(now)
        stats = {"t": time.time(), "dt": 1.0, "cpu": 0.5, "mem": 0.25,
                 "q_cpu": min(1.0, busy[0] % 1.0), "q_net": min(1.0, busy[1] % 1.0)}
        for r, s in q.items():
            stats[f"qg_{r}"], stats[f"qw_{r}"] = s.granted, s.wait
            stats[f"qd_{r}"], stats[f"qr_{r}"] = s.done, s.run
        m.hb_sent.append(now)
        self.send(m.sock, "heartbeat", name=m.name, executors=sorted(m.execs), stats=stats,
                  launches=m.launches)

    # -- a daemon's messages ----------------------------------------------------------
    def _on_daemon(self, m: Machine, msg: M.Message) -> None:
        t = msg.type
        if t == "enqueue":
            job = msg["job"]
            ex = m.execs.get(job)
            now = mono()
            self.r_recv.extend((ex.jnum if ex else -1, ex.attempt if ex else -1,
                                msg["seq"] - 1, now, ex.count if ex else 0))
            try:
                acts = m.core.enqueue(Sub(job, msg["seq"], msg["kind"],
                                          float(msg.get("prio") or 0.0)), now)
            except QueueError:
                self.counts["queue_errors"] += 1
                return
            self._apply(m, acts)
        elif t == "hb_ack":
            if m.hb_sent:
                now = mono()
                sent = m.hb_sent.pop(0)
                self.hb_rtt.extend((now, now - sent))
        elif t == "launch":
            m.launches += 1
            self._launch(m, msg)
        elif t == "sync_plan":
            self._plan(m, msg)
        elif t == "registered":
            m.registered = True
            m.launches = 0
            m.hb_sent.clear()
        elif t == "kill":
            self.counts["kills"] += 1
            self._drop(m, msg["job"])
        elif t in ("ckpt_gc", "data_gc"):
            pass
        elif t == "error":
            code = msg["code"]
            self.errors[code] = self.errors.get(code, 0) + 1
            if code == "unknown_worker":
                self.counts["unknown_worker"] += 1
                m.registered = False
                m.hb_sent.clear()
        else:
            self.counts["unsupported"] += 1

    def _apply(self, m: Machine, acts: list) -> None:
        now = mono()
        for a in acts:
            if type(a) is Grant and not a.held or type(a) is Deliver:
                ex = m.execs.get(a.sub.job)
                if ex is not None:
                    d = self.L * (0.9 + 0.2 * self.rng.random())
                    self.at(now + d, self._sub_done, ex, a.sub.seq)

    def _launch(self, m: Machine, msg: M.Message) -> None:
        self.counts["launches"] += 1
        job = msg["job"]
        self._drop(m, job)
        ex = Exec(m, job, msg["index"], msg["attempt"], msg["count"], None)
        ex.secret = msg.get("secret") or ""
        ex.sock = self._socket(m.pub, m.sec, ex)
        m.execs[job] = ex
        m.core.started(job, mono())
        # its start-up (input, shard): a little, not the real seconds
        self.at(mono() + float(self.cfg["setup"]) * (0.5 + self.rng.random()), self._ready, ex)

    def _ready(self, ex: Exec) -> None:
        if not ex.alive:
            return
        self.send(ex.sock, "exec_ready", job=ex.job, index=ex.index, attempt=ex.attempt,
                  endpoint=f"tcp://127.0.0.1:{20000 + ex.index}", num_keys=1000, dim=8,
                  model_blocks=16, local_blocks=4, setup_s=0.5, setup_cpu=0.4)

    def _drop(self, m: Machine, job: str) -> None:
        ex = m.execs.pop(job, None)
        if ex is not None:
            ex.alive = False
            self._close(ex.sock)
            self._apply(m, m.core.exited(job, mono()))

    # -- an executor's messages -------------------------------------------------------
    def _on_exec(self, ex: Exec, msg: M.Message) -> None:
        t = msg.type
        if t == "job_start":
            ex.queued = msg["mode"] == "queued"
            ex.gen = msg.get("sync_gen")
            ex.state = "running"
            ex.t_epoch = mono()
            reps = msg.get("replicas") or []
            r = reps[ex.index] if ex.index < len(reps) else None
            ex.replica = r[0] if isinstance(r, list) and r and isinstance(r[0], str) else None
            if ex.queued:
                self._apply(ex.m, ex.m.core.ready(ex.job, mono()))     # its hello
                self._sync(ex)
            elif ex.count > 1:
                self._barrier(ex, -1, 0)    # every shard initialized before the first pull
            else:
                self._free_next(ex)
        elif t == "epoch_sums":
            self._epoch_sums(ex, msg)
        elif t == "release":
            self.r_recv.extend((ex.jnum, ex.attempt, msg["iter"] + 1000 * (msg["epoch"] + 1),
                                mono(), ex.count))
            if ex.state == "barrier":
                ex.state = "running"
                if msg["epoch"] >= 0:
                    ex.rnd += 1
                self._free_next(ex)
        elif t == "abort":
            self.counts["aborts"] += 1
            self._drop(ex.m, ex.job)
        elif t == "pong":
            pass
        elif t == "error":
            code = msg["code"]
            self.errors[code] = self.errors.get(code, 0) + 1
        else:                       # migrate, move, leave: a live resize (not emulated)
            self.counts["unsupported"] += 1

    def _sync(self, ex: Exec) -> None:
        """Subtask ``ex.seq`` is done (0: none yet): tell the synchronizer
        which kind the next one is."""
        nxt = self.plan[ex.seq % len(self.plan)]
        now = mono()
        self.r_send.extend((ex.jnum, ex.attempt, ex.seq, now, ex.count))
        if ex.gen is None:
            self.send(ex.sock, "sync", job=ex.job, index=ex.index, seq=ex.seq, next=nxt)
            return
        # to its daemon (in-process here, a local socket on a real machine)
        s = Sync(ex.job, ex.attempt, ex.gen, ex.index, ex.seq, nxt, 0.0)
        p = ex.m.router.route(s, now)
        if p is not None:
            self._forward(ex.m, p, s)

    # -- the synchronizer off the master (--sync leader) ----------------------------
    def _plan(self, m: Machine, msg: M.Message) -> None:
        now = mono()
        plan = Plan(msg["job"], msg["attempt"], msg["gen"], tuple(msg["machines"]),
                    msg["leader"], msg["endpoint"])
        if plan.leader == m.name:
            self.leads[plan.job] = m
        self._lead(m, m.leader.plan(plan, now))
        for p, s in m.router.plan(plan, now):
            self._forward(m, p, s)

    def _forward(self, m: Machine, p: Plan, s: Sync) -> None:
        if p.leader == m.name:
            return self._lead(m, m.leader.sync(m.name, s, mono()))
        link = m.links.get(p.endpoint)
        if link is None:
            link = m.links[p.endpoint] = self._socket(m.pub, m.sec, Link(m), p.endpoint)
        ex = m.execs.get(s.job)
        self.send(link, "lsync", peer=True, job=s.job, attempt=s.attempt, gen=s.gen, index=s.index,
                  seq=s.seq, next=s.next, prio=s.prio, machine=m.name,
                  tag=ex.secret if ex is not None else "")

    def _on_lsync(self, ident: bytes, msg: M.Message) -> None:
        if msg.type != "lsync":
            self.counts["unsupported"] += 1
            return
        lead = self.leads.get(msg["job"])
        self.members[msg["machine"]] = ident
        if lead is None or lead.name in self.silenced:
            self.counts["errors"] += 1
            return
        s = Sync(msg["job"], msg["attempt"], msg["gen"], msg["index"], msg["seq"],
                 msg["next"], float(msg.get("prio") or 0.0))
        self._lead(lead, lead.leader.sync(msg["machine"], s, mono()))

    def _lead(self, m: Machine, cmds: list) -> None:
        for c in cmds:
            if isinstance(c, Failed):
                self.send(m.sock, "sync_failed", job=c.job, attempt=c.attempt, error=c.error)
                continue
            if c.machine == m.name:
                self._on_daemon(m, M.Message("enqueue", {"job": c.job, "seq": c.seq,
                                                         "kind": c.kind, "prio": c.prio}, []))
                continue
            ident = self.members.get(c.machine)
            if ident is None:
                self.counts["errors"] += 1
                continue
            raw = packb({"t": "enqueue", "job": c.job, "seq": c.seq, "kind": c.kind,
                         "prio": c.prio}, use_bin_type=True)
            try:
                self.sync_sock.send_multipart([ident, raw], zmq.NOBLOCK)
                self.counts["peer_sent"] += 1
                self.pending.add(self.sync_sock)
            except zmq.ZMQError:
                self.counts["dropped"] += 1

    def _sub_done(self, ex: Exec, seq: int) -> None:
        if not ex.alive:
            return
        m = ex.m
        try:
            acts = m.core.done(ex.job, seq, mono())
        except QueueError:
            self.counts["queue_errors"] += 1
            return
        ex.seq = seq
        if not ex.queued:
            return
        if seq % len(self.plan) == 0:       # the evaluation's COMP: the epoch's end
            self._epoch_done(ex)
        else:
            self._sync(ex)
        self._apply(m, acts)

    # free (naive) mode: no queues; a barrier after each PULL and each PUSH
    def _free_ops(self) -> list:
        ops = []
        for it in range(self.iters):
            ops += [("sub", 0), ("bar", 2 * it), ("sub", 0), ("sub", 0), ("bar", 2 * it + 1)]
        return ops + [("sub", 0), ("sub", 0)]          # the evaluation: PULL, COMP

    def _free_next(self, ex: Exec) -> None:
        """Run the next step of the epoch (``ex.rnd``: its index)."""
        if not ex.alive:
            return
        ops = self._free
        if ex.rnd >= len(ops):
            return self._epoch_done(ex)
        op, it = ops[ex.rnd]
        if op == "sub":
            ex.rnd += 1
            self.at(mono() + self.L * (0.9 + 0.2 * self.rng.random()), self._free_next, ex)
        elif ex.count == 1:
            ex.rnd += 1
            self._free_next(ex)
        else:
            self._barrier(ex, ex.epoch, it)

    def _barrier(self, ex: Exec, epoch: int, it: int) -> None:
        ex.state = "barrier"
        self.r_send.extend((ex.jnum, ex.attempt, it + 1000 * (epoch + 1), mono(), ex.count))
        self.send(ex.sock, "barrier", job=ex.job, index=ex.index, epoch=epoch, iter=it)

    # -- the epoch's end ----------------------------------------------------------------
    def _epoch_done(self, ex: Exec) -> None:
        now = mono()
        L, it = self.L, float(self.iters)
        train = now - ex.t_epoch
        tm = {"pull": it * L, "comp": it * L, "push": it * L, "comp_cpu": it * L * 0.95,
              "stood": 0.0, "sync": max(0.0, train - 3 * it * L - 2 * L),
              "train": max(train - 2 * L, 1e-3), "train_cpu": it * L, "iters": it,
              "blocks": 4.0, "input_bytes": 4e6, "bytes_pull": 1e5 * it, "bytes_push": 1e5 * it,
              "bytes": 2e5 * it, "remote_bytes": 1e5 * it, "link": 0.0, "eval": 2 * L,
              "eval_cpu": L, "net_wait": 0.0, "stall": 0.0, "alpha": 0.0}
        ex.state = "epoch"
        self.send(ex.sock, "epoch_done", job=ex.job, index=ex.index, epoch=ex.epoch,
                  sums={"loss": 100.0 / (ex.epoch + 1), "n": 1000.0}, timings=tm)

    def _epoch_sums(self, ex: Exec, msg: M.Message) -> None:
        ep = msg["epoch"]
        self.counts["epochs"] += 1
        stop = bool(msg.get("stop"))
        if ex.index == 0:
            self.send(ex.sock, "epoch_report", job=ex.job, index=ex.index, epoch=ep,
                      metrics={"loss": 0.1 / (ep + 1)}, stop=stop)
        if stop:
            self.send(ex.sock, "ckpt_final", job=ex.job, index=ex.index, epoch=ep, version=1,
                      replica=ex.replica, bytes=4096)
            self.send(ex.sock, "exec_finished", job=ex.job, index=ex.index)
            return self._drop(ex.m, ex.job)
        if msg.get("pause"):
            self.counts["pauses"] += 1
            self.send(ex.sock, "exec_paused", job=ex.job, index=ex.index, attempt=ex.attempt,
                      epoch=ep, version=1, replica=ex.replica, bytes=4096)
            return self._drop(ex.m, ex.job)
        if msg.get("checkpoint"):
            self.counts["ckpts"] += 1
            self.send(ex.sock, "ckpt_part", job=ex.job, index=ex.index, epoch=ep, version=1,
                      replica=ex.replica, bytes=4096)
        if msg.get("reconfig"):
            self.counts["unsupported"] += 1
        ex.epoch = ep + 1
        ex.state = "running"
        ex.t_epoch = mono()
        if ex.queued:
            self._sync(ex)
        else:
            ex.rnd = 0
            self._free_next(ex)

    def _dump(self) -> None:
        ru = resource.getrusage(resource.RUSAGE_SELF)
        np.savez(self.out, r_send=np.frombuffer(self.r_send, dtype=np.float64).reshape(-1, 5),
                 r_recv=np.frombuffer(self.r_recv, dtype=np.float64).reshape(-1, 5),
                 hb_rtt=np.frombuffer(self.hb_rtt, dtype=np.float64).reshape(-1, 2),
                 series=np.asarray(self.series, dtype=np.float64).reshape(-1, 4))
        with open(self.out + ".json", "w") as fh:
            json.dump({"counts": self.counts, "errors": self.errors,
                       "cpu": ru.ru_utime + ru.ru_stime,
                       "lost_machines": [m.name for m in self.machines
                                         if not m.registered]}, fh)


def _emulate(cfg: dict, names: list[str], endpoint: str, out: str, stop) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    if cfg.get("nice"):
        os.nice(int(cfg["nice"]))
    emu = Emulator(cfg, names, endpoint, out, stop)
    prof = os.environ.get("HARMONY_LOAD_PROFILE_EMU")     # cProfile an emulator process
    if not prof:
        return emu.run()
    import cProfile
    pr = cProfile.Profile(time.thread_time)
    pr.enable()
    try:
        emu.run()
    finally:
        pr.disable()
        pr.dump_stats(f"{prof}.{os.getpid()}")


# ======================================================================= the bench
class Pollers:
    """Readers polling the master (the real Client, a reader key), each in
    its own thread: list_jobs, job_status of a random job, cluster_info, and
    (``dashboard``) the dashboard's snapshot over HTTP with this key's token."""

    def __init__(self, endpoint: str, keys: security.Keys, hz: float, jobs: list[str],
                 dashboard: bool = False) -> None:
        self.endpoint, self.keys, self.hz, self.jobs = endpoint, keys, hz, jobs
        self.lat: dict[str, list[tuple[float, float]]] = {"job_status": [], "list_jobs": [],
                                                          "cluster_info": []}
        if dashboard:
            self.lat["dashboard"] = []
        self.failed: dict[str, int] = {k: 0 for k in self.lat}
        self._stop = threading.Event()
        self.threads = [threading.Thread(target=self._poll, args=(k,), daemon=True)
                        for k in self.lat]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self.threads:
            t.join(timeout=15)

    def _poll(self, kind: str) -> None:
        from harmony.client import Client, ClientError
        rng = random.Random(kind)
        with Client(self.endpoint, timeout_s=10.0, keys=self.keys) as c:
            url = None
            if kind == "dashboard":
                d = c.dashboard()
                url = f"{d['url'].rstrip('/')}/api/snapshot?token={d['token']}"
            while not self._stop.is_set():
                t0 = mono()
                try:
                    if url is not None:
                        with urllib.request.urlopen(url, timeout=10) as r:
                            r.read()
                    elif kind == "job_status":
                        c.status(rng.choice(self.jobs))
                    elif kind == "list_jobs":
                        c.jobs()
                    else:
                        c.cluster()
                    self.lat[kind].append((t0, mono() - t0))
                except (ClientError, OSError):
                    self.failed[kind] += 1
                self._stop.wait(max(0.0, 1.0 / self.hz - (mono() - t0)))


def _threads(p: psutil.Process) -> dict[int, float]:
    try:
        return {t.id: t.user_time + t.system_time for t in p.threads()}
    except psutil.Error:
        return {}


def ensure_keys(keydir: str, machines: int) -> tuple[float, int]:
    """Worker keys w0000.. for ``machines``: (seconds taken, keys made)."""
    names = [f"w{i:04d}" for i in range(machines)]
    have = set(os.listdir(os.path.join(keydir, "workers"))) \
        if os.path.isdir(os.path.join(keydir, "workers")) else set()
    missing = [n for n in names if f"{n}.key_secret" not in have]
    t0 = time.perf_counter()
    security.init_keys(keydir, workers=names)
    return time.perf_counter() - t0, len(missing)


def _pct(xs, q: float) -> float | None:
    return float(np.percentile(xs, q)) if len(xs) else None


def _rounds(send: np.ndarray, recv: np.ndarray, t0: float, t1: float) -> dict:
    """The synchronizer's rounds whose last sync is in [t0, t1): complete
    ones (every executor's sync and every machine's enqueue: as many as the
    job's executors, its launch's count) and their added delay (last
    enqueue - last sync). Rows: (job, attempt, round, t, count)."""
    out = {"rounds": 0, "incomplete": 0, "delays": np.zeros(0)}
    if not len(send):
        return out

    def agg(a: np.ndarray):
        keys = a[:, :3]
        uniq, inv, cnt = np.unique(keys, axis=0, return_inverse=True, return_counts=True)
        tmax = np.full(len(uniq), -np.inf)
        np.maximum.at(tmax, inv.ravel(), a[:, 3])
        want = np.zeros(len(uniq))
        np.maximum.at(want, inv.ravel(), a[:, 4])
        return {tuple(k): (c, t, w) for k, c, t, w in zip(map(tuple, uniq), cnt, tmax, want)}
    s = agg(send)
    r = agg(recv) if len(recv) else {}
    delays = []
    incomplete = 0
    for k, (c, t, want) in s.items():
        if not (t0 <= t < t1):
            continue
        got = r.get(k)
        if c != want or got is None or got[0] != want:
            incomplete += 1
            continue
        delays.append(got[1] - t)
    out.update(rounds=len(delays), incomplete=incomplete, delays=np.asarray(delays))
    return out


def _liveness(endpoint: str, reader, admin, silence, victim: str, machines: int,
              timeout: float, log) -> dict:
    """Item 3: one machine goes silent: how long until the master says it
    is lost (goal: within the heartbeat timeout), and whether any machine
    that kept beating was taken as lost over the next two timeouts."""
    from harmony.client import Client
    out: dict = {}
    with Client(endpoint, timeout_s=30.0, keys=reader) as c:
        silence.set()
        t = mono()
        lost_at = None
        while mono() < t + 4 * timeout + 10:
            ws = {w["name"]: w["alive"] for w in c.cluster()["workers"]}
            if not ws.get(victim, True):
                lost_at = mono() - t
                break
            time.sleep(0.05)
        out["silent_lost_after_s"] = round(lost_at, 2) if lost_at is not None else None
        time.sleep(2 * timeout)
        ws = c.cluster()["workers"]
        out["others_lost"] = sum(1 for w in ws if not w["alive"] and w["name"] != victim)
    log(f"  a silent machine was declared lost after {out['silent_lost_after_s']}s "
        f"(heartbeat timeout {timeout}s); {out['others_lost']} other machine(s) lost")
    return out


def _restart(master, cmd: list, env: dict, mlog, endpoint: str, reader, machines: int,
             ids: list, res: dict, log):
    """Item 3: the master is killed with -9 and started again on the same
    state dir and port: how long until every machine that is alive has
    registered again, and until every job runs again with new epochs."""
    from harmony.client import Client, ClientError
    with Client(endpoint, timeout_s=30.0, keys=reader) as c:
        before = {j["id"]: j["epochs"] for j in c.jobs()}
    master.kill()
    master.wait(timeout=30)
    port = endpoint.rsplit(":", 1)[1]
    cmd = [x for x in cmd]
    cmd[cmd.index("--port") + 1] = port
    t = mono()
    master = subprocess.Popen(cmd, stdout=mlog, stderr=subprocess.STDOUT, env=env)
    want = machines - 1                          # the silenced one stays away
    rejoin = resumed = running_at = None
    kept: dict[str, int] = {}          # epochs each job kept (up to its checkpoint)
    going: list = []
    with Client(endpoint, timeout_s=5.0, keys=reader) as c:
        while mono() < t + 180:
            try:
                alive = sum(1 for w in c.cluster()["workers"] if w["alive"])
                if rejoin is None and alive >= want:
                    rejoin = mono() - t
                js = {j["id"]: j for j in c.jobs()}
            except ClientError:
                time.sleep(0.2)
                continue
            for i in ids:       # the epochs it kept: up to its checkpoint, once relaunched
                if i in js:
                    kept[i] = min(kept.get(i, js[i]["epochs"]), js[i]["epochs"])
            if running_at is None and rejoin is not None and all(
                    js.get(i, {}).get("state") == "running" for i in ids):
                running_at = mono() - t          # every job relaunched and started
            # running again, with an epoch done since the restart
            going = [i for i in ids if js.get(i, {}).get("state") == "running"
                     and js[i]["epochs"] > kept.get(i, 0)]
            if rejoin is not None and len(going) == len(ids):
                resumed = mono() - t
                break
            time.sleep(0.2)
    res.update({"restart_rejoin_s": round(rejoin, 2) if rejoin is not None else None,
                "restart_all_running_s": round(resumed, 2) if resumed is not None else None,
                "restart_all_started_s": round(running_at, 2) if running_at is not None
                else None,
                "restart_jobs_running": len(going),
                "restart_epochs_before": int(sum(before.values())),
                # epochs run again: those since each job's last checkpoint
                "restart_epochs_redone": int(sum(before.get(i, 0) - kept.get(i, 0)
                                                 for i in ids))})
    log(f"  master kill -9 and restart: {want} machines back after {res['restart_rejoin_s']}s, "
        f"all jobs running again after {res['restart_all_started_s']}s, "
        f"{len(going)}/{len(ids)} jobs running with a new epoch after "
        f"{res['restart_all_running_s']}s ({res['restart_epochs_redone']} of "
        f"{res['restart_epochs_before']} epochs redone: those after the last checkpoints)")
    return master


def run_point(a: argparse.Namespace, machines: int, jobs: int, dop: tuple[int, int],
              subtask: float, log=print) -> dict:
    """One sweep point: a fresh master, emulators, jobs; returns the row."""
    tmp = tempfile.mkdtemp(prefix="harmony-load-")
    procs: list = []
    master = None
    stop = mp.get_context("fork").Event()
    silence = mp.get_context("fork").Event()
    res: dict = {"machines": machines, "jobs": jobs, "dop": f"{dop[0]}-{dop[1]}",
                 "subtask": subtask, "mode": a.mode, "sync": a.sync, "policy": a.policy,
                 "pinned": bool(a.pin)}
    try:
        keydir = a.keys or os.path.join(tempfile.gettempdir(), "harmony-master-load-keys")
        ksec, made = ensure_keys(keydir, machines)
        res["keys_s"], res["keys_made"] = round(ksec, 3), made
        if made:
            log(f"  made {made} worker keys in {ksec:.2f}s ({keydir})")
        state = os.path.join(tmp, "master")
        mlog = open(os.path.join(tmp, "master.log"), "w")
        cmd = [sys.executable, "-m", "harmony.master", "start", "--port", "0",
               "--state-dir", state, "--keys", keydir, "--mode", a.mode,
               "--heartbeat-timeout", str(a.heartbeat_timeout), "--log-level", a.log_level]
        if a.policy:
            cmd += ["--policy", a.policy]
        if a.dashboard:
            cmd += ["--dashboard-port", "0"]
        env = dict(os.environ)
        env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent) + (
            os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        if a.profile:
            env["HARMONY_MASTER_PROFILE"] = a.profile
        t_start = mono()
        ncpu = os.cpu_count() or 1
        pin = a.pin and ncpu > 1

        def _pre() -> None:
            if a.nice:
                os.nice(a.nice)
            if pin:                 # the master alone on CPU 0 (its loop and I/O threads)
                os.sched_setaffinity(0, {0})
        master = subprocess.Popen(cmd, stdout=mlog, stderr=subprocess.STDOUT, env=env,
                                  preexec_fn=_pre if (a.nice or pin) else None)
        if pin:                     # the emulators and the readers: the other CPUs
            os.sched_setaffinity(0, set(range(1, ncpu)))
        info = os.path.join(state, "master.json")
        for _ in range(600):
            if os.path.exists(info) or master.poll() is not None:
                break
            time.sleep(0.05)
        if not os.path.exists(info):
            raise RuntimeError(f"the master did not start: {open(mlog.name).read()[-2000:]}")
        endpoint = json.load(open(info))["endpoint"]
        res["master_start_s"] = round(mono() - t_start, 2)
        mproc = psutil.Process(master.pid)
        # emulators: the machines dealt round-robin
        names = [f"w{i:04d}" for i in range(machines)]
        nproc = max(1, min(a.procs, machines))
        cfg = {"keys": keydir, "subtask": subtask, "iters": a.iters, "seed": a.seed,
               "setup": a.setup, "max_seconds": a.warmup + a.duration + 300, "nice": a.nice,
               "check": a.check, "sync": a.sync,
               "silence": (silence, "w0000") if a.liveness else None}
        ctx = mp.get_context("fork")
        outs = []
        for p in range(nproc):
            out = os.path.join(tmp, f"emu{p}")
            outs.append(out)
            pr = ctx.Process(target=_emulate, args=(cfg, names[p::nproc], endpoint, out, stop),
                             daemon=True)
            pr.start()
            procs.append(pr)
        from harmony.client import Client
        admin = security.Keys.load(keydir, "client", "admin")
        reader = security.Keys.load(keydir, "reader", "reader")
        with Client(endpoint, timeout_s=30.0, keys=admin) as c:
            t_reg = mono()
            deadline = t_reg + 60 + machines * 0.1
            alive = 0
            while mono() < deadline:
                alive = sum(1 for w in c.cluster()["workers"] if w["alive"])
                if alive >= machines:
                    break
                time.sleep(0.5)
            res["register_s"] = round(mono() - t_reg, 2)
            if alive < machines:
                raise RuntimeError(f"only {alive} of {machines} machines registered")
            rng = random.Random(a.seed)
            dops = [rng.randint(dop[0], min(dop[1], machines)) for _ in range(jobs)]
            ids = []
            for d in dops:
                ids.append(c.submit("load.py", APP_SOURCE, ["--max-epochs", "1000000"],
                                    machines=d, checkpoint_every=a.ckpt_every))
            res["executors"] = sum(dops)
            t_sub = mono()
            running = 0
            while mono() < t_sub + 60 + jobs * 0.5:
                running = sum(1 for j in c.jobs() if j["state"] == "running")
                if running >= jobs:
                    break
                time.sleep(0.5)
            res["start_s"] = round(mono() - t_sub, 2)
            res["running_at_start"] = running
            log(f"  {machines} machines registered in {res['register_s']}s; {running}/{jobs} "
                f"jobs running ({sum(dops)} executors) after {res['start_s']}s")
        pol = Pollers(endpoint, reader, a.poll_hz, ids, dashboard=a.dashboard)
        pol.start()
        time.sleep(a.warmup)
        t0 = mono()
        c0 = mproc.cpu_times()
        th0 = _threads(mproc)
        rss = []
        while mono() < t0 + a.duration:
            time.sleep(min(1.0, max(0.0, t0 + a.duration - mono())))
            try:
                rss.append(mproc.memory_info().rss)
            except psutil.Error:
                break
        t1 = mono()
        c1 = mproc.cpu_times()
        th1 = _threads(mproc)
        loop_cpu = th1.get(master.pid, 0.0) - th0.get(master.pid, 0.0)
        pol.stop()
        if a.liveness:
            res.update(_liveness(endpoint, reader, admin, silence, "w0000", machines,
                                 a.heartbeat_timeout, log))
            master = _restart(master, cmd, env, mlog, endpoint, reader, machines, ids, res,
                              log)
        with Client(endpoint, timeout_s=30.0, keys=reader) as c:
            workers = c.cluster()
            js = c.jobs()
        stop.set()
        for pr in procs:
            pr.join(timeout=30)
        for o, pr in zip(outs, procs):
            if not os.path.exists(o + ".json"):
                raise RuntimeError(f"emulator {o} left no results (exit code {pr.exitcode})")
        send = [np.load(o + ".npz") for o in outs]
        stats = [json.load(open(o + ".json")) for o in outs]
        r_send = np.concatenate([s["r_send"] for s in send])
        r_recv = np.concatenate([s["r_recv"] for s in send])
        hb = np.concatenate([s["hb_rtt"] for s in send])
        rounds = _rounds(r_send, r_recv, t0, t1 - 1.0)
        d_ms = rounds["delays"] * 1000
        # messages at the master: everything the emulators sent and received in the window
        msgs = gen_cpu = 0.0
        for s in send:
            ser = s["series"]
            if len(ser) >= 2:
                tot = ser[:, 1] + ser[:, 2]
                msgs += np.interp(t1, ser[:, 0], tot) - np.interp(t0, ser[:, 0], tot)
                gen_cpu += np.interp(t1, ser[:, 0], ser[:, 3]) - np.interp(t0, ser[:, 0], ser[:, 3])
        n_polls = sum(1 for k in pol.lat for t, _ in pol.lat[k] if t0 <= t < t1)
        win = t1 - t0
        counts: dict[str, int] = {}
        errors: dict[str, int] = {}
        for st in stats:
            for k, v in st["counts"].items():
                counts[k] = counts.get(k, 0) + v
            for k, v in st["errors"].items():
                errors[k] = errors.get(k, 0) + v
        mlog.flush()
        text = open(mlog.name).read()
        hb_w = hb[(hb[:, 0] >= t0) & (hb[:, 0] < t1), 1] * 1000 if len(hb) else np.zeros(0)
        st_lat = {k: np.asarray([x for t, x in v if t0 <= t < t1]) * 1000
                  for k, v in pol.lat.items()}
        res.update({
            "window_s": round(win, 2),
            "msgs_per_s": round((msgs + 2 * n_polls) / win),
            "master_cores": round(((c1.user + c1.system) - (c0.user + c0.system)) / win, 3),
            # its event loop (the main thread) and the rest (ZeroMQ's I/O
            # thread: CURVE and TCP; the ZAP handler; the dashboard)
            "master_loop_cores": round(loop_cpu / win, 3),
            "master_rss_mb": round(max(rss) / 2**20, 1) if rss else None,
            "sync_rounds": rounds["rounds"], "sync_incomplete": rounds["incomplete"],
            "sync_p50_ms": _pct(d_ms, 50), "sync_p99_ms": _pct(d_ms, 99),
            "sync_max_ms": float(d_ms.max()) if len(d_ms) else None,
            "status_p50_ms": _pct(st_lat["job_status"], 50),
            "status_p99_ms": _pct(st_lat["job_status"], 99),
            "status_max_ms": float(st_lat["job_status"].max()) if len(st_lat["job_status"])
            else None,
            "jobs_p99_ms": _pct(st_lat["list_jobs"], 99),
            "cluster_p99_ms": _pct(st_lat["cluster_info"], 99),
            "dashboard_p99_ms": _pct(st_lat["dashboard"], 99) if "dashboard" in st_lat
            else None,
            "poll_failed": sum(pol.failed.values()),
            "hb_p50_ms": _pct(hb_w, 50), "hb_p99_ms": _pct(hb_w, 99),
            "hb_max_ms": float(hb_w.max()) if len(hb_w) else None,
            "lost_logged": len(re.findall(r"stopped sending heartbeats", text)),
            "unknown_worker": counts.get("unknown_worker", 0),
            "alive_at_end": sum(1 for w in workers["workers"] if w["alive"]),
            "running_at_end": sum(1 for j in js if j["state"] == "running"),
            "requeued": len(re.findall(r"requeued", text)),
            "not_reading": len(re.findall(r"is not reading", text)),
            "bad_messages": workers["master"]["bad_messages"],
            "gen_cores": round(gen_cpu / win, 3),
            "counts": counts, "errors": errors,
            "cpus": os.cpu_count(),
        })
        # the event loop's CPU per message (in or out): what one core can carry
        res["loop_us_per_msg"] = (round(1e6 * res["master_loop_cores"] / res["msgs_per_s"], 1)
                                  if res["msgs_per_s"] else None)
        res["sync_pct_of_subtask"] = (round(100 * res["sync_p99_ms"] / 1000 / subtask, 2)
                                      if res["sync_p99_ms"] is not None else None)
        return res
    finally:
        if a.pin:
            try:
                os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
            except OSError:
                pass
        stop.set()
        for pr in procs:
            pr.join(timeout=10)
            if pr.is_alive():
                pr.kill()
                pr.join(timeout=5)
        if master is not None and master.poll() is None:
            master.send_signal(signal.SIGTERM)
            try:
                master.wait(timeout=20)
            except subprocess.TimeoutExpired:
                master.kill()
                master.wait(timeout=10)
        if a.keep:
            print(f"  kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


COLS = [("machines", 5, "d"), ("jobs", 4, "d"), ("dop", 5, "s"), ("executors", 5, "d"),
        ("subtask", 6, "g"), ("msgs_per_s", 7, "d"), ("master_cores", 5, ".2f"), ("master_loop_cores", 5, ".2f"),
        ("loop_us_per_msg", 5, ".0f"), ("master_rss_mb", 6, ".0f"), ("gen_cores", 5, ".2f"), ("sync_rounds", 7, "d"),
        ("sync_p50_ms", 7, ".2f"), ("sync_p99_ms", 8, ".2f"), ("sync_pct_of_subtask", 6, ".1f"),
        ("status_p50_ms", 7, ".1f"), ("status_p99_ms", 7, ".1f"), ("hb_p99_ms", 7, ".1f"),
        ("unknown_worker", 4, "d"), ("lost_logged", 4, "d")]
HEAD = {"machines": "mach", "jobs": "jobs", "dop": "DoP", "executors": "execs",
        "subtask": "sub s", "msgs_per_s": "msg/s", "master_cores": "cores", "master_loop_cores": "loop",
        "master_rss_mb": "RSS MB", "loop_us_per_msg": "us/m", "gen_cores": "emu c", "sync_rounds": "rounds",
        "sync_p50_ms": "sync50", "sync_p99_ms": "sync99", "sync_pct_of_subtask": "%sub",
        "status_p50_ms": "stat50", "status_p99_ms": "stat99", "hb_p99_ms": "hb99",
        "unknown_worker": "unkw", "lost_logged": "lost"}


def table(rows: list[dict]) -> str:
    lines = [" ".join(f"{HEAD[c]:>{w}}" for c, w, _ in COLS)]
    for r in rows:
        cells = []
        for c, w, f in COLS:
            v = r.get(c)
            cells.append(f"{'-':>{w}}" if v is None else
                         f"{v:>{w}{f}}" if f != "s" else f"{v:>{w}}")
        lines.append(" ".join(cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--machines", type=int, default=10)
    p.add_argument("--jobs", type=int, default=20)
    p.add_argument("--dop", default="2-10", help="DoP range LO-HI (or one number)")
    p.add_argument("--subtask", type=float, default=0.1, help="subtask seconds")
    p.add_argument("--sweep", action="store_true", help="the issue's sweep points, in turn")
    p.add_argument("--points", default=None,
                   help="with --sweep: only these, e.g. 10x1,100x0.1 (machines x subtask)")
    p.add_argument("--warmup", type=float, default=5.0)
    p.add_argument("--duration", type=float, default=30.0, help="measured seconds")
    p.add_argument("--procs", type=int, default=2, help="emulator processes")
    p.add_argument("--iters", type=int, default=5, help="iterations per epoch")
    p.add_argument("--ckpt-every", type=int, default=5, help="checkpoint every N epochs")
    p.add_argument("--setup", type=float, default=0.2, help="emulated executor start-up s")
    p.add_argument("--poll-hz", type=float, default=3.0, help="each reader's requests/s")
    p.add_argument("--mode", default="harmony", choices=["harmony", "naive"])
    p.add_argument("--sync", default="leader", choices=["leader", "master"],
                   help="harmony mode: who synchronizes subtasks: a leader daemon of each "
                        "job (the default, #32) or the master (the emulated daemons then "
                        "register no sync endpoint)")
    p.add_argument("--policy", default="colocate")
    p.add_argument("--heartbeat-timeout", type=float, default=5.0)
    p.add_argument("--no-dashboard", dest="dashboard", action="store_false",
                   help="the master serves no dashboard (default: it does, and a reader "
                        "fetches its snapshot)")
    p.add_argument("--log-level", default="INFO")
    p.add_argument("--keys", default=None, help="key set dir (default: a cached one in /tmp)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--nice", type=int, default=0, help="run master and emulators niced")
    p.add_argument("--pin", action="store_true",
                   help="the master on CPU 0 alone, the emulators on the others")
    p.add_argument("--profile", default=None, metavar="PATH",
                   help="cProfile the master into PATH (HARMONY_MASTER_PROFILE)")
    p.add_argument("--liveness", action="store_true",
                   help="after the window: one machine goes silent (how long until it is "
                        "declared lost), then the master is killed with -9 and restarted "
                        "(how long until the machines and jobs are back); issue #32 item 3")
    p.add_argument("--check", action="store_true",
                   help="the emulators validate every message against the schemas (slower)")
    p.add_argument("--json", default=None, help="write the rows here")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (master log)")
    a = p.parse_args(argv)

    def _term(*_):
        raise SystemExit(143)
    signal.signal(signal.SIGTERM, _term)
    lo, _, hi = a.dop.partition("-")
    if a.sweep:
        want = None
        if a.points:
            want = {(int(x.split("x")[0]), float(x.split("x")[1])) for x in a.points.split(",")}
        points = [(m, j, d, s) for m, j, d in SWEEP_SHAPES for s in SWEEP_SUBTASKS
                  if want is None or (m, s) in want]
    else:
        points = [(a.machines, a.jobs, (int(lo), int(hi or lo)), a.subtask)]
    rows = []
    for m, j, d, s in points:
        print(f"point: {m} machines, {j} jobs of DoP {d[0]}-{d[1]}, subtasks {s:g}s "
              f"({a.mode}/{a.policy}, {a.duration:g}s measured)", flush=True)
        try:
            row = run_point(a, m, j, d, s)
        except (RuntimeError, OSError, zmq.ZMQError) as exc:
            row = {"machines": m, "jobs": j, "dop": f"{d[0]}-{d[1]}", "subtask": s,
                   "error": str(exc)[:500]}
            print(f"  failed: {exc}", flush=True)
        rows.append(row)
        if a.json:
            with open(a.json, "w") as fh:
                json.dump(rows, fh, indent=1)
        print(table([row]), flush=True)
    print()
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
