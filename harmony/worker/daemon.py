"""The worker daemon: one per machine.

Registers the machine with the master, sends heartbeats, and starts and stops
job executor processes (one per job on this machine). An executor that
crashes is reported to the master with its exit status and the tail of its
log; it never takes the daemon down. On SIGTERM/SIGINT the daemon stops its
executors (SIGTERM, then SIGKILL) before it exits; executors also die with
the daemon if it is killed outright (PR_SET_PDEATHSIG).
"""
from __future__ import annotations

import errno
import json
import logging
import os
import queue
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections import deque

import psutil
import zmq

from harmony.comm import messages as M
from harmony.comm import security
from harmony.comm.sealed import DEFAULT_MODE, MODES
from harmony import dilation as dil
from harmony.comm.zmqutil import bind_random, check_endpoint, make_socket
from harmony.store import staging
from harmony.store.lmdb_store import sweep_stale
from harmony.util import names
from harmony.worker import jobckpt
from harmony.worker.dataservice import DataService
from harmony.worker.netem import NetEm, job_token
from harmony.worker.syncservice import SyncService
from harmony.util.malloc import return_large_buffers
from harmony.worker.nicstats import NicMeter
from harmony.worker.execprocs import KILL_GRACE_S, ExecProc, ExecutorProcesses
from harmony.worker.daemon_core import (DaemonCore, Deliver, Demote, Done, Grant,
                                        Promote, QueueError, Resume, Stop, Sub)

log = logging.getLogger("harmony.worker")

MEM_CHECK_S = 0.1     # how often the executors' memory is sampled (with a budget)
#: what the executors' socket accepts in one frame: their messages (hello,
#: sub_done, mem_query, alpha_state) are a few dozen bytes; a larger frame
#: disconnects its sender before it is read (ZMQ_MAXMSGSIZE)
EXEC_MAX_BYTES = 64 * 1024
EXEC_LIMITS = M.Limits(max_bytes=EXEC_MAX_BYTES, max_header=EXEC_MAX_BYTES, max_frames=1,
                       max_str=EXEC_MAX_BYTES, max_bin=1024, max_array=64, max_map=64,
                       max_depth=4, max_objects=1024)


class Daemon(ExecutorProcesses):
    def __init__(self, master: str, name: str | None = None, host: str = "127.0.0.1",
                 cpus: int | None = None, memory: int | None = None,
                 state_dir: str | None = None, cpu_set: list[int] | None = None,
                 netem: str | None = None, oom_kill: bool = False,
                 store_max: int | None = None, preempt: bool = True,
                 keys: security.Keys | None = None, master_file: str | None = None,
                 cpu_speed: float = 1.0, dilation: float = 1.0,
                 data_plane: str = DEFAULT_MODE) -> None:
        # time dilation (harmony.dilation): the master's D, checked when it
        # registers; the queues' clock runs in undilated seconds
        self.dilation = dil.check(dilation)
        if not 0 < cpu_speed <= 1:
            raise ValueError(f"--cpu-speed must be in (0, 1], not {cpu_speed}")
        self.cpu_speed = cpu_speed      # emulated: COMPs here take 1/cpu_speed as long
        if data_plane not in MODES:
            raise ValueError(f"--data-plane must be one of {', '.join(MODES)}, "
                             f"not {data_plane!r}")
        # its executors' PS and block traffic: sealed (AES-GCM, the default)
        # or signed (authenticated, plain text: an explicit choice)
        self.data_plane = data_plane
        self.master = master
        self.keys = keys            # this worker's keys (CURVE); its executors use them too
        if keys is not None:
            security.use(keys)
        # where the master writes its endpoint: read again when it stops
        # answering (a master restarted on another port)
        self.master_file = os.path.abspath(master_file) if master_file else None
        self._master_read = 0.0
        self.name = name or f"{socket.gethostname()}-{os.getpid()}"
        self.host = host
        self.cpu_set = sorted(cpu_set) if cpu_set else None
        if self.cpu_set:
            # an emulated machine: this daemon and its executors on these cores
            os.sched_setaffinity(0, self.cpu_set)
        self.cpus = cpus or (len(self.cpu_set) if self.cpu_set else None) \
            or psutil.cpu_count(logical=True) or 1
        self.netem_path = netem
        self.netem = NetEm(netem) if netem else None
        # no emulated link on a machine of its own (a real fleet, not a
        # local cluster on 127.0.0.1, whose daemons share one host's NICs):
        # the machine's NICs
        self.nics = NicMeter() if self.netem is None and not host.startswith("127.") \
            and host not in ("localhost", "::1") else None
        if self.netem is not None and self.name not in self.netem.index:
            raise ValueError(f"machine {self.name!r} is not in the network emulation "
                             f"({self.netem.names})")
        # the memory budget: shared by this machine's executors (each sees
        # the machine's use against it and adapts its disk ratio); with
        # oom_kill, exceeding it stops the largest executor (emulated OOM)
        self.memory_set = bool(memory)
        self.memory = memory or psutil.virtual_memory().total
        if oom_kill and not memory:
            raise ValueError("--oom-kill needs --memory")
        self.oom_kill = oom_kill
        self.store_max = store_max
        self.state_dir = os.path.abspath(state_dir or os.path.join(
            os.path.expanduser("~/.harmony/workers"), self.name))
        os.makedirs(os.path.join(self.state_dir, "jobs"), exist_ok=True)
        # job stores of executors that crashed in an earlier run of this worker
        for d in sweep_stale(os.path.join(self.state_dir, "store")):
            log.info("cleaned stale job store %s", d)
        self._mem_at = 0.0
        self.ctx = zmq.Context()
        self.sock = make_socket(self.ctx, zmq.DEALER, identity=f"w:{self.name}:{os.getpid()}".encode())
        self.sock.connect(master)
        # executors of this machine talk to the daemon here (subtask queues)
        self.xsock = make_socket(self.ctx, zmq.ROUTER)
        self.xsock.setsockopt(zmq.MAXMSGSIZE, EXEC_MAX_BYTES)
        self.xendpoint = bind_random(self.xsock, "127.0.0.1")
        # what this machine's disk holds (checkpoint parts, replicas), served
        # to the other machines: the only way anyone else reaches it
        self.data = DataService(self.ctx, self.host, self.state_dir, self.name)
        self.data.start()
        # the subtask queues and the protocol state around them (pure; its
        # clock is ours: time.monotonic)
        self.core = DaemonCore(preempt=preempt, memory_budget=int(self.memory),
                               oom_kill=oom_kill)
        self.clock = dil.Clock(self.dilation, time.monotonic)
        # the synchronizer of the jobs this machine leads, and the way to
        # the leaders of the others (harmony.subtasks.sync)
        self.syncs = SyncService(self.ctx, self.host, self.name, self._enqueue,
                                 self._send, self.clock)
        self._netem_primary: int | None = None     # the token last set (None: not yet)
        self.xident: dict[str, bytes] = {}           # job -> executor identity
        self.events_path = os.path.join(self.state_dir, "queue-events.jsonl")
        self._events = open(self.events_path, "a", buffering=1)
        # the dashboard's task stream: subtasks that ended since the last
        # heartbeat ([start, end, job, kind], wall clock), sent while the
        # master asks for them (its hb_ack says so while someone watches)
        self._tasks_wanted = False
        self._task_open: dict[tuple[str, int], tuple[float, str]] = {}
        self._tasks: deque = deque(maxlen=M.MAX_TASKS)
        self._stats_prev: dict | None = None
        self._cpu_last: dict[int, float] = {}
        self.execs: dict[str, ExecProc] = {}
        self.retiring: list[ExecProc] = []     # older attempts being stopped
        self.registered = False
        self.launches_seen = 0        # launch messages since the last registration
        self.hb_interval = 1.0
        self._stop = False
        self._outbox: queue.Queue = queue.Queue()   # replies from helper threads
        self._last_send = 0.0
        self._last_ack = time.time()

    def request_stop(self, *_: object) -> None:
        self._stop = True

    def _send(self, mtype: str, **fields) -> None:
        try:
            self.sock.send(M.encode(mtype, **fields), zmq.NOBLOCK)
        except zmq.Again:
            log.warning("master unreachable; %s not sent", mtype)

    def serve_forever(self) -> None:
        # a block's chunks and pieces (8 and 4 MiB) go back to the system
        # when freed, not to a heap that stays at the largest burst's size
        return_large_buffers()
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)
        log.info("worker %s (%d cpus, %.1f GiB) -> master %s", self.name, self.cpus,
                 self.memory / 2**30, self.master)
        log.info("data service on %s, subtask synchronizer on %s", self.data.endpoint,
                 self.syncs.endpoint)
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(self.xsock, zmq.POLLIN)
        self.syncs.register(poller)
        try:
            while not self._stop:
                try:
                    ready = dict(poller.poll(100))
                    while self.xsock in ready:
                        try:
                            frames = self.xsock.recv_multipart(zmq.NOBLOCK, copy=False)
                        except zmq.Again:
                            break
                        if self.keys is not None and (len(frames) < 2 or self.keys.worker_name(
                                frames[1].get("User-Id")) != self.name):
                            continue    # only this machine's executors (its worker key)
                        self._guarded(self._handle_exec, [f.bytes for f in frames])
                    while self.sock in ready:
                        try:
                            frames = self.sock.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        self._guarded(self._handle, frames)
                    for sock in self.syncs.sockets():
                        if sock in ready:
                            self._guarded(self.syncs.drain, sock)
                except zmq.ZMQError as exc:
                    if exc.errno != errno.EINTR:
                        raise
                while not self._outbox.empty():
                    mtype, fields = self._outbox.get_nowait()
                    self._send(mtype, **fields)
                now = time.time()
                if now - self._last_send >= self.hb_interval:
                    self._last_send = now
                    if self.registered:
                        tasks = ([[now - a, now - b, job, kind] for a, b, job, kind in self._tasks]
                                 if self._tasks_wanted else [])
                        self._tasks.clear()
                        self._send("heartbeat", name=self.name, executors=sorted(self.execs),
                                   stats=self._stats(now), launches=self.launches_seen,
                                   **({"tasks": tasks} if tasks else {}))
                        if now - self._last_ack > 5 * self.hb_interval:
                            log.warning("no reply from master for %.0fs; re-registering",
                                        now - self._last_ack)
                            self.registered = False
                    else:
                        self._follow_master(now)
                        self._send("register", name=self.name, host=self.host, cpus=self.cpus,
                                   memory=self.memory, pid=os.getpid(),
                                   executors=sorted(self.execs),
                                   data_endpoint=self.data.endpoint,
                                   sync_endpoint=self.syncs.endpoint,
                                   revision=os.environ.get("HARMONY_REVISION") or None,
                                   dilation=self.dilation)
                if self.memory_set and now - self._mem_at >= MEM_CHECK_S:
                    self._mem_at = now
                    self._check_memory()
                self._guarded(self._reap)
        finally:
            self.shutdown()

    def _guarded(self, fn, *args) -> None:
        """Run a handler; its failure (e.g. a full disk under a store it
        writes) is logged and never stops the daemon and its other jobs."""
        try:
            fn(*args)
        except Exception:
            log.exception("worker %s: %s failed; going on", self.name, fn.__name__)

    def _follow_master(self, now: float) -> None:
        """Not registered: if the master file names another endpoint (the
        master restarted elsewhere), connect there instead."""
        if self.master_file is None or now - self._master_read < max(1.0, self.hb_interval):
            return
        self._master_read = now
        try:
            with open(self.master_file) as fh:
                endpoint = json.load(fh).get("endpoint")
            endpoint = check_endpoint(endpoint) if isinstance(endpoint, str) else None
        except (OSError, ValueError, AttributeError):
            return          # not there (yet): the master is down or starting
        if endpoint is None or endpoint == self.master:
            return
        log.warning("the master moved: %s -> %s (from %s); registering there", self.master,
                    endpoint, self.master_file)
        try:
            self.sock.disconnect(self.master)
        except zmq.ZMQError:
            pass
        self.sock.connect(endpoint)
        self.master = endpoint
        self._last_ack = now

    def shutdown(self) -> None:
        everyone = list(self.execs.values()) + self.retiring
        for ep in everyone:
            self._terminate(ep)
        deadline = time.time() + KILL_GRACE_S
        for ep in everyone:
            try:
                ep.proc.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                ep.proc.kill()
                ep.proc.wait()
        self.execs.clear()
        self.data.stop()
        self.syncs.close()
        self.sock.close(linger=0)
        self.xsock.close(linger=0)
        security.stop_authenticator(self.ctx)
        self.ctx.term()
        try:
            self._events.close()
        except OSError:
            pass
        if self.netem is not None:
            self.netem.close()
        log.info("worker %s stopped", self.name)

    # -- messages from the master ------------------------------------------------
    def _handle(self, frames: list[bytes]) -> None:
        try:
            msg = M.decode(frames)
        except M.ProtocolError as exc:
            log.warning("malformed message from master: %s", exc)
            return
        self._last_ack = time.time()
        if msg.type == "registered":
            self.registered = True
            self.launches_seen = 0      # the master counts its launches from here
            self.hb_interval = dil.wall(float(msg["heartbeat_interval"]), self.dilation)
            log.info("registered with master")
        elif msg.type == "hb_ack":
            self._tasks_wanted = bool(msg.get("tasks"))
        elif msg.type == "error":
            if msg["code"] == "unknown_worker":
                self.registered = False
            else:
                log.warning("master error: %s: %s", msg["code"], msg["message"])
        elif msg.type == "launch":
            self.launches_seen += 1
            self._launch(msg)
        elif msg.type == "enqueue":
            self._enqueue(Sub(msg["job"], msg["seq"], msg["kind"], float(msg.get("prio") or 0.0)))
        elif msg.type == "sync_plan":
            self.syncs.plan(msg)
        elif msg.type == "data_copy":
            threading.Thread(target=self._copy_chunks, args=(dict(msg.fields),),
                             daemon=True).start()
        elif msg.type == "data_gc":
            n = self.data.chunks.remove(msg["name"])
            shutil.rmtree(names.under(os.path.join(self.state_dir, "data"), msg["name"],
                                      what="data set name"), ignore_errors=True)
            log.info("dropped data set %s (%d chunk(s) here)", msg["name"], n)
        elif msg.type == "ckpt_gc":
            gone = jobckpt.gc(self.state_dir, msg["job"], msg.get("keep"))
            if gone:
                log.info("dropped checkpoint parts of %s: %s", msg["job"], gone)
        elif msg.type == "kill":
            self._drop(msg["job"])
            ep = self.execs.get(msg["job"])
            if ep is not None:
                log.info("stopping executor of %s", msg["job"])
                self._terminate(ep)
        else:
            log.warning("unexpected %s from master", msg.type)

    def _copy_chunks(self, req: dict) -> None:
        """Re-replicate staged chunks held here to another worker (off the
        daemon's loop: the reply goes back through ``_outbox``)."""
        try:
            chunks = [(int(i), self.data.chunks.get(req["name"], int(i))) for i in req["chunks"]]
            staging.push_chunks(self.ctx, req["endpoint"], req["name"], chunks)
            out = {"ok": True}
        except Exception as exc:
            out = {"ok": False, "error": f"{exc.__class__.__name__}: {exc}"[:2000]}
        self._outbox.put(("data_copied", dict(name=req["name"], chunks=req["chunks"],
                                              to=req["to"], **out)))

    # -- subtask queues ------------------------------------------------------------
    def _log_event(self, ev: str, sub: Sub, role: str = "") -> None:
        now = time.time()
        key = (sub.job, sub.seq)
        if ev in ("grant", "resume"):
            if len(self._task_open) > 4 * M.MAX_TASKS:    # subtasks of executors gone
                self._task_open.clear()
            self._task_open.setdefault(key, (now, sub.kind))
        elif ev in ("done", "stop"):
            opened = self._task_open.pop(key, None)
            if opened is not None and self._tasks_wanted:
                self._tasks.append((opened[0], now, sub.job, opened[1]))
        try:
            self._events.write(f'{{"t": {now:.6f}, "ev": "{ev}", "job": "{sub.job}", '
                               f'"seq": {sub.seq}, "kind": "{sub.kind}", "role": "{role}"}}\n')
        except OSError as exc:        # a full disk loses queue events, never the daemon
            now = time.time()
            if now - getattr(self, "_events_warned", 0.0) > 60:
                self._events_warned = now
                log.warning("cannot write %s: %s", self.events_path, exc)

    def _apply(self, actions: list) -> None:
        """Carry out the core's actions."""
        for act in actions:
            t = type(act)
            sub = act.sub
            if t is Grant:
                self._log_event("grant", sub, act.role)
                if not act.held:
                    self._grant(sub, act.role)
            elif t is Deliver:
                self._grant(sub, act.role)
            elif t is Done:
                self._log_event("done", sub)
            elif t is Promote:
                self._log_event("promote", sub, "primary")
            elif t is Demote:     # a shorter newcomer leads the link now
                self._log_event("demote", sub, "secondary")
            elif t is Stop:
                self._log_event("stop", sub, "cpu")
                self._signal(sub.job, signal.SIGSTOP)
            elif t is Resume:
                ident = self.xident.get(sub.job)
                if act.tell and ident is not None:
                    # before it runs on: it reads this after its COMP, so its
                    # COMP time (its profile) does not count the other's COMP
                    stood = dil.wall(act.stood, self.dilation)    # the executor's clock
                    self._xsend(ident, M.encode("preempted", seq=sub.seq, seconds=stood))
                self._log_event("resume", sub, "cpu")
                self._signal(sub.job, signal.SIGCONT)
        if self.netem is not None:
            prim = self.core.primary()
            token = job_token(prim.job) if prim is not None else 0
            if token != self._netem_primary:
                self.netem.set_primary(self.name, token)
                self._netem_primary = token

    def _enqueue(self, sub: Sub) -> None:
        """The synchronizer (the master, or the job's leader daemon)
        enqueued ``sub`` here."""
        self._log_event("enqueue", sub)
        try:
            # (deferred by the core if it overtook the release of the job's
            # previous subtask)
            self._apply(self.core.enqueue(sub, self.clock()))
        except QueueError as exc:
            log.warning("enqueue refused: %s", exc)

    def _grant(self, sub: Sub, role: str) -> None:
        ident = self.xident.get(sub.job)
        if ident is not None:
            self._xsend(ident, M.encode("grant", seq=sub.seq, role=role))

    def _xsend(self, ident: bytes, payload: bytes) -> None:
        try:
            self.xsock.send_multipart([ident, payload])
        except zmq.ZMQError as exc:
            log.warning("executor unreachable: %s", exc)

    def _drop(self, job: str) -> None:
        """The job left this machine's queues (killed, relaunched)."""
        self.xident.pop(job, None)
        self._apply(self.core.left(job, self.clock()))

    def _mine(self, ident: bytes, msg: M.Message) -> ExecProc | None:
        """The executor process that sent ``msg`` (its job, attempt and
        socket identity), or None."""
        ep = self.execs.get(msg["job"])
        if ep is None or ep.attempt != msg["attempt"] or ep.ident() != ident:
            return None
        return ep

    def _handle_exec(self, frames: list[bytes]) -> None:
        ident = frames[0]
        try:
            msg = M.decode(frames[1:], EXEC_LIMITS)
        except M.ProtocolError as exc:
            log.warning("malformed message from an executor: %s", exc)
            return self._xsend(ident, M.error("bad_message", str(exc)))
        if msg.type == "hello":
            ep = self.execs.get(msg["job"])
            if ep is None or ep.attempt != msg["attempt"]:
                return self._xsend(ident, M.encode("abort", reason="not an executor of this machine"))
            self.xident[msg["job"]] = ident
            acts = self.core.ready(msg["job"], self.clock())
            if self.memory_set:
                self._check_memory()     # at once: it may be over with its input alone
            self._apply(acts)
        elif msg.type == "sub_done":
            if self.xident.get(msg["job"]) != ident:
                return self._xsend(ident, M.error("unexpected", "sub_done from a stranger"))
            try:
                acts = self.core.done(msg["job"], msg["seq"], self.clock())
            except QueueError as exc:
                return self._xsend(ident, M.error("bad_request", str(exc)))
            self._apply(acts)
        elif msg.type == "sync":       # to the job's leader (harmony.subtasks.sync)
            if msg.get("attempt") is None or self._mine(ident, msg) is None:
                return self._xsend(ident, M.error("unexpected", "sync from a stranger"))
            self.syncs.exec_sync(msg)
        elif msg.type == "mem_query":
            if self._mine(ident, msg) is None:
                return self._xsend(ident, M.error("unexpected", "mem_query from a stranger"))
            v = self.core.memory_view(msg["job"], self.clock())
            self._xsend(ident, M.encode("mem_state", rid=msg["rid"], budget=v.budget,
                                        others_bytes=v.others_bytes,
                                        others_count=v.others_count, age=v.age,
                                        others_starved=v.others_starved,
                                        others_need=v.others_need))
        elif msg.type == "alpha_state":
            if self._mine(ident, msg) is None:
                return self._xsend(ident, M.error("unexpected", "alpha_state from a stranger"))
            self.core.alpha_state(msg["job"], msg["alpha"], msg["starved"], self.clock(),
                                  msg.get("need") or 0.0)
        else:
            self._xsend(ident, M.error("unexpected", f"the daemon does not accept {msg.type!r}"))

    def _stats(self, now: float) -> dict:
        """Utilization of this machine since the last heartbeat: CPU from the
        executors' CPU time (psutil), network from the emulated links or,
        without them, from the machine's NICs (``nicstats``), and
        the busy time of both subtask queues; and the queues' counters
        since the daemon started (``qg_R``, ``qw_R``, ``qd_R``, ``qr_R`` per
        resource R: granted, wait seconds, done, run seconds)."""
        dcpu = 0.0
        seen: dict[int, float] = {}
        for ep in self.execs.values():
            try:
                t = psutil.Process(ep.proc.pid).cpu_times()
            except psutil.Error:
                continue
            total = t.user + t.system
            seen[ep.proc.pid] = total
            dcpu += total - self._cpu_last.get(ep.proc.pid, 0.0)
        self._cpu_last = seen
        eg = ing = 0.0
        if self.netem is not None:
            eg, ing, _ = self.netem.counters(self.name)
        q_cpu, q_net = self.core.busy(self.clock())
        cur = {"t": now, "eg": eg, "in": ing, "q_cpu": q_cpu, "q_net": q_net}
        prev, self._stats_prev = self._stats_prev, cur
        if prev is None:
            if self.nics is not None:
                self.nics.read(0.0)         # the counters to count from
            return {"t": now}
        wdt = max(now - prev["t"], 1e-6)   # wall seconds; the rest: undilated
        dt = dil.undilated(wdt, self.dilation)
        mem = sum(self._exec_memory(self.core.memory_jobs(loaded_only=True)).values())
        out = {"t": now, "dt": dt, "cpu": min(1.0, max(0.0, dcpu) / (dt * self.cpus)),
               "mem": mem / self.memory,
               "q_cpu": min(1.0, (cur["q_cpu"] - prev["q_cpu"]) / dt),
               "q_net": min(1.0, (cur["q_net"] - prev["q_net"]) / (2 * dt))}
        if self.netem is not None:
            out["net"] = min(1.0, max(cur["eg"] - prev["eg"], cur["in"] - prev["in"])
                             / (wdt * self.netem.rate_of(self.name)))
        elif self.nics is not None:
            got = self.nics.read(wdt)
            if got is not None:
                out["net_sent"], out["net_recv"], out["net"] = got
        for r, q in self.core.queue_stats().items():
            out[f"qg_{r}"], out[f"qw_{r}"] = q.granted, q.wait
            out[f"qd_{r}"], out[f"qr_{r}"] = q.done, q.run
        try:        # spills, checkpoint parts and staged data live there
            du = psutil.disk_usage(self.state_dir)
            out["disk_free"], out["disk_total"] = float(du.free), float(du.total)
        except OSError:
            pass
        return out
