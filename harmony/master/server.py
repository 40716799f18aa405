"""The master process: the I/O shell around :class:`harmony.master.core.MasterCore`.

One thread, one ROUTER socket. Clients, worker daemons and job executors all
talk to it with DEALER sockets; every message is decoded with bounded limits
by :mod:`harmony.comm.messages` before the core sees it, and a bad one gets an
``error`` reply and a log line, never an exception out of the loop. This
module owns the socket, the job table on disk (:class:`JobDB`), the run
record files, the clock and signals; every decision is the core's.
"""
from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import queue
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import zmq

from harmony.comm import messages as M
from harmony.comm import security
from harmony.comm.zmqutil import make_socket
from harmony.dilation import Clock
from harmony.master import core as C
from harmony.master.core import (KEEP_MODELS, MasterCore, Reconfig, Run,  # noqa: F401
                                 Worker, balance)
from harmony.master.jobdb import JobDB, JobTableError, TableFull  # noqa: F401 (re-exported)
from harmony.master.jobs import RETENTION_S
from harmony.obs import dashboard as obs_dashboard
from harmony.util.malloc import return_large_buffers

log = logging.getLogger("harmony.master")

MASTER_RCVHWM = 4           # messages queued per peer before TCP pushes back (a flood)
# the metrics logs (STATE/metrics/*.jsonl): rotated by size, a few files kept
METRICS_LOG_BYTES = int(os.environ.get("HARMONY_METRICS_LOG_BYTES", 64 << 20))
METRICS_LOG_KEEP = 3


CLOCK_FILE = "clock.json"


def _clock_anchor(state_dir: str, dilation: float) -> float | None:
    """The dilated clock's anchor a master on ``state_dir`` used before
    (None: none, another dilation, or an unreadable file)."""
    try:
        with open(os.path.join(state_dir, CLOCK_FILE)) as fh:
            rec = json.load(fh)
        if float(rec["dilation"]) == float(dilation):
            return float(rec["anchor"])
        log.warning("the state dir's jobs ran at dilation %s, this master at %s: job times "
                    "before the restart are on another timeline", rec["dilation"], dilation)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def _save_clock_anchor(state_dir: str, clock: Clock) -> None:
    try:
        with open(os.path.join(state_dir, CLOCK_FILE), "w") as fh:
            json.dump({"dilation": clock.dilation, "anchor": clock.anchor}, fh)
    except OSError as exc:       # a full disk: a restart then starts a new timeline
        log.warning("cannot save the dilated clock's anchor: %s", exc)

class RotatingLog:
    """An append-only JSON-lines file rotated by size: PATH, then PATH.1 ..
    PATH.KEEP, the oldest dropped. A write never raises: a line that cannot
    be written (a full disk) is dropped, counted and logged (once a minute)."""

    def __init__(self, path: str, max_bytes: int = METRICS_LOG_BYTES,
                 keep: int = METRICS_LOG_KEEP) -> None:
        self.path, self.max_bytes, self.keep = path, max(1, max_bytes), max(0, keep)
        self.dropped = 0
        self._warned = 0.0
        self._fh = None
        self._size = 0
        self._open()

    def _open(self) -> None:
        try:
            self._fh = open(self.path, "a", buffering=1)
            self._size = self._fh.tell()
        except OSError as exc:
            self._fh = None
            self._fail(exc)

    def _fail(self, exc: OSError) -> None:
        now = time.time()
        if now - self._warned >= 60.0:
            self._warned = now
            log.warning("cannot write %s: %s (%d line(s) dropped so far)", self.path,
                        exc.strerror or exc, self.dropped)

    def _rotate(self) -> None:
        self._fh.close()
        self._fh = None
        if self.keep:
            for i in range(self.keep - 1, 0, -1):
                if os.path.exists(f"{self.path}.{i}"):
                    os.replace(f"{self.path}.{i}", f"{self.path}.{i + 1}")
            os.replace(self.path, f"{self.path}.1")
        else:
            os.unlink(self.path)
        self._open()

    def write(self, line: str) -> None:
        try:
            if self._fh is None:
                self._open()
                if self._fh is None:
                    self.dropped += 1
                    return
            if self._size and self._size + len(line) > self.max_bytes:
                self._rotate()
            self._fh.write(line)
            self._size += len(line)
        except OSError as exc:
            self.dropped += 1
            self._fail(exc)
            try:
                if self._fh is not None:
                    self._fh.close()
            except OSError:
                pass
            self._fh = None

    def close(self) -> None:
        try:
            if self._fh is not None:
                self._fh.close()
        except OSError:
            pass
        self._fh = None



#: the identity of the dashboard's requests (never a ZeroMQ peer's: those
#: the socket makes start with a zero byte and then 4 more bytes)
DASH_IDENT = b"\x00dashboard:"


class StateDirLocked(RuntimeError):
    pass


class Master:
    """The master process: sockets, the job table on disk, the run record,
    the clock; :attr:`core` decides everything."""

    def __init__(self, state_dir: str, host: str = "127.0.0.1", port: int = 5760,
                 heartbeat_timeout: float = 5.0, launch_timeout: float = 300.0,
                 policy: str | None = None, mode: str = "naive",
                 max_jobs_per_machine: int = 0, keys: security.Keys | None = None,
                 keep_models: int | None = None, recover: bool = False,
                 master_file: str | None = None, dashboard_port: int | None = None,
                 dashboard_host: str | None = None, cruise: bool = False,
                 max_moves: int = C.MAX_MOVES, dilation: float = 1.0,
                 sync: str = "leader", retention: float = RETENTION_S) -> None:
        # who may send what: with keys, every peer is authenticated (CURVE)
        # and each message type is accepted only from its role (the core's table)
        self.keys = keys
        if keep_models is None:
            keep_models = int(os.environ.get("HARMONY_KEEP_MODELS", KEEP_MODELS))
        self.state_dir = os.path.abspath(state_dir)
        # the core's clock: undilated seconds (harmony.dilation), so every
        # time the core measures or waits for is in undilated seconds; its
        # anchor is kept in the state dir, so a restarted master goes on
        # with the same timeline (job times persisted before stay right)
        anchor = _clock_anchor(self.state_dir, dilation)
        self.clock = Clock(dilation, anchor=anchor)
        # the core checks its settings before anything is opened or locked
        self.core = MasterCore(
            heartbeat_timeout=heartbeat_timeout, launch_timeout=launch_timeout, policy=policy,
            mode=mode, max_jobs_per_machine=max_jobs_per_machine, secure=keys is not None,
            keep_models=keep_models, pid=os.getpid(),
            revision=os.environ.get("HARMONY_REVISION") or None, state_dir=self.state_dir,
            now=self.clock(), cruise=cruise, max_moves=max_moves, predict_epochs=True,
            dilation=self.clock.dilation, sync=sync, retention=retention)
        if keys is not None:
            security.use(keys)
        os.makedirs(self.state_dir, exist_ok=True)
        self._lock_fh = open(os.path.join(self.state_dir, "master.lock"), "a+")
        try:
            fcntl.flock(self._lock_fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lock_fh.close()
            raise StateDirLocked(f"another master is running on state dir {self.state_dir}")
        if anchor is None and self.clock.dilation != 1.0:
            _save_clock_anchor(self.state_dir, self.clock)
        # checked before use: a damaged table refuses the start (JobTableError)
        # unless ``recover`` restores its last good copy
        self.db = JobDB(self.state_dir, recover=recover)
        self.core.jobs = {j.id: j for j in self.db.load_all()}
        self.core.datasets = self.db.load_datasets()
        self._run(self.core.recover(self.clock()))
        return_large_buffers()
        self.ctx = zmq.Context()
        self.sock = make_socket(self.ctx, zmq.ROUTER)
        # a larger frame than any legitimate message never reaches the process
        self.sock.setsockopt(zmq.MAXMSGSIZE, M.MASTER_MAX_BYTES)
        # a peer's messages waiting for the master: a few, then TCP pushes
        # back on that peer alone (a flood is not buffered here)
        self.sock.setsockopt(zmq.RCVHWM, MASTER_RCVHWM)
        if port == 0:
            port = self.sock.bind_to_random_port(f"tcp://{host}")
        else:
            self.sock.bind(f"tcp://{host}:{port}")
        self.endpoint = self.core.endpoint = f"tcp://{host}:{port}"
        self._stop = False
        # the core's slow pure work (Cruise's MILP): one thread, results
        # handed back to the event loop through a queue
        self._solver = ThreadPoolExecutor(1, thread_name_prefix="solve")
        self._solved: queue.SimpleQueue = queue.SimpleQueue()
        # the dashboard's controls (cancel, pause, resume) and the machines
        # that hold a job's logs: requests from its HTTP thread, handled by
        # the loop as a client's, answered back
        self._dash_in: queue.SimpleQueue = queue.SimpleQueue()
        self._dash_out: dict[bytes, list] = {}
        self._dash_lock = threading.Lock()
        self._dash_seq = 0
        os.makedirs(os.path.join(self.state_dir, "metrics"), exist_ok=True)
        # the run record: per-machine utilization and per-job profiles over time
        metrics = os.path.join(self.state_dir, "metrics")
        self._logs = {name: RotatingLog(os.path.join(metrics, f"{name}.jsonl"))
                      for name in ("machines", "jobs", "decisions", "predictions")}
        # [obs hook] dashboard + /metrics in its own thread, fed snapshots (harmony.obs)
        self.obs = obs_dashboard.start(self, dashboard_host or host, dashboard_port)
        # where daemons find this master (also at ``master_file``: e.g. a
        # local cluster's daemons, which cannot see this state dir)
        self.master_files = [os.path.join(self.state_dir, "master.json")] + (
            [os.path.abspath(master_file)] if master_file else [])
        info = {"endpoint": self.endpoint, "pid": os.getpid(), "mode": self.mode}
        for path in self.master_files:
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w") as fh:
                json.dump(info, fh)
            os.replace(tmp, path)

    # the core's state, as readers of the master (status, tests) know it
    jobs = property(lambda self: self.core.jobs)
    workers = property(lambda self: self.core.workers)
    runs = property(lambda self: self.core.runs)
    datasets = property(lambda self: self.core.datasets)
    mode = property(lambda self: self.core.mode)
    retention = property(lambda self: self.core.retention)
    now = property(lambda self: self.core.now)
    bad_messages = property(lambda self: self.core.bad_messages)

    # -- lifecycle -------------------------------------------------------------
    def request_stop(self, *_: Any) -> None:
        self._stop = True

    def serve_forever(self) -> None:
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)
        log.info("master listening on %s (mode %s, policy %s, state dir %s, %d jobs known)",
                 self.endpoint, self.mode, self.core.policy_name, self.state_dir,
                 len(self.jobs))
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        tick = C.Tick()
        try:
            while not self._stop:
                try:
                    events = poller.poll(100)
                except zmq.ZMQError as exc:
                    if exc.errno == errno.EINTR:
                        continue
                    raise
                if events:
                    for _ in range(1000):
                        try:
                            frames = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
                        except zmq.Again:
                            break
                        self._dispatch(frames)
                while not self._solved.empty():
                    self._run(self.core.handle(self._solved.get(), self.clock()))
                while not self._dash_in.empty():
                    ident, msg, role, name = self._dash_in.get()
                    if msg.type in obs_dashboard.MESSAGES:     # the log page's machines
                        self._send(ident, obs_dashboard.answer(self, msg, role, name))
                        continue
                    self._run(self.core.handle(C.Received(ident, msg, role, name), self.clock()))
                self._run(self.core.handle(tick, self.clock()))
                if self.obs is not None:        # [obs hook] at most once a second
                    self.obs.tick(self)
        finally:
            self.close()

    def close(self) -> None:
        self._solver.shutdown(wait=False, cancel_futures=True)
        if self.obs is not None:                # [obs hook]
            self.obs.stop()
        try:
            self.sock.close(linger=0)
            security.stop_authenticator(self.ctx)
            self.ctx.term()
        finally:
            for job in self.jobs.values():
                self.db.save(job)
            self.db.close()         # and its last good copy
            for lg in self._logs.values():
                lg.close()
            for path in self.master_files:
                try:
                    with open(path) as fh:
                        mine = json.load(fh).get("endpoint") == self.endpoint
                    if mine:
                        os.unlink(path)
                except (OSError, ValueError, AttributeError):
                    pass
            self._lock_fh.close()
            log.info("master stopped")

    # -- transport ---------------------------------------------------------------
    def _dispatch(self, frames: list) -> None:
        """Decode one message (bounded) and hand it to the core with its
        sender's authenticated role."""
        if len(frames) < 2:
            self.core.bad_messages += 1
            return
        user = frames[1].get("User-Id") if self.keys is not None and \
            hasattr(frames[1], "get") else None
        frames = [f.bytes if hasattr(f, "bytes") else f for f in frames]
        ident, body = frames[0], frames[1:]
        now = self.clock()
        try:
            msg = M.decode(body, M.MASTER_LIMITS)
        except M.ProtocolError as exc:
            return self._run(self.core.handle(C.Malformed(ident, str(exc)), now))
        role, name = self.keys.peer(user) if self.keys is not None else ("", "")
        if msg.type in obs_dashboard.MESSAGES:   # [obs hook] answered by harmony.obs
            return self._send(ident, obs_dashboard.answer(self, msg, role, name))
        self._run(self.core.handle(C.Received(ident, msg, role, name), now))

    def _run(self, commands: list) -> None:
        """Carry out the core's commands, in order."""
        last: tuple | None = None      # (type, fields) -> bytes, for a broadcast
        for cmd in commands:
            kind = type(cmd)
            if kind is C.Send:
                if last is not None and last[0] == cmd.type and last[1] is cmd.fields:
                    payload = last[2]
                else:
                    try:
                        payload = M.encode(cmd.type, **cmd.fields)
                    except M.ProtocolError:      # a bug of ours: loud, never fatal
                        log.exception("cannot encode %s", cmd.type)
                        continue
                    last = (cmd.type, cmd.fields, payload)
                if not self._send(cmd.to, payload) and cmd.fail is not None:
                    self._run(self.core.handle(cmd.fail, self.clock()))
            elif kind is C.Persist:
                getattr(self.db, cmd.op)(*cmd.args)
            elif kind is C.Record:
                self._logs[cmd.stream].write(json.dumps(cmd.obj) + "\n")
            elif kind is C.Admit:
                self._admit(cmd)
            elif kind is C.Solve:
                self._solver.submit(self._solve, cmd)
            else:
                raise TypeError(f"unknown command {cmd!r}")

    def _solve(self, cmd: C.Solve) -> None:
        """Run off the event loop; the loop hands the result to the core."""
        try:
            self._solved.put(C.Solved(cmd.key, cmd.fn()))
        except Exception as exc:  # noqa: BLE001 (reported to the core, which logs it)
            self._solved.put(C.Solved(cmd.key, error=f"{exc.__class__.__name__}: {exc}"))

    def _admit(self, cmd: C.Admit) -> None:
        """Number a submitted job and write it strictly: it exists only once
        its record is on disk."""
        job = cmd.job
        try:
            if not self.db.flush():
                raise TableFull(f"cannot write the job table {self.db.path}: "
                                f"{self.db.write_error}")
            job.id = f"job-{self.db.next_seq():04d}"
            self.db.save(job, strict=True)
        except TableFull as exc:
            return self._run(self.core.handle(C.AdmitFailed(cmd.ident, str(exc)), self.clock()))
        self._run(self.core.handle(C.Admitted(cmd.ident, job), self.clock()))

    def dashboard_request(self, mtype: str, fields: dict, role: str, name: str,
                          timeout: float = 5.0) -> M.Message:
        """A client request from the dashboard's HTTP thread, on behalf of
        the key its token names (``role``, ``name``): handled by the loop
        like one from that key, roles checked by the core. Its reply, or
        TimeoutError."""
        msg = M.decode([M.encode(mtype, **fields)])     # the schema, as for any peer
        with self._dash_lock:
            self._dash_seq += 1
            ident = DASH_IDENT + str(self._dash_seq).encode()
            slot: list = [threading.Event(), None]
            self._dash_out[ident] = slot
        try:
            self._dash_in.put((ident, msg, role, name))
            if not slot[0].wait(timeout):
                raise TimeoutError(f"no answer from the master's loop in {timeout:g}s")
            return M.decode([slot[1]])
        finally:
            with self._dash_lock:
                self._dash_out.pop(ident, None)

    def _send(self, ident: bytes, payload: bytes) -> bool:
        """Send without ever blocking the master: a peer whose queue is full
        (a client that stopped reading) or that vanished loses this reply."""
        if ident.startswith(DASH_IDENT):        # to the dashboard's HTTP thread
            with self._dash_lock:
                slot = self._dash_out.get(ident)
            if slot is not None:
                slot[1] = payload
                slot[0].set()
            return slot is not None
        try:
            self.sock.send_multipart([ident, payload], zmq.NOBLOCK)
            return True
        except zmq.Again:
            self.core._say("not_reading", "peer %r is not reading; reply dropped", ident[:64])
            return False
        except zmq.ZMQError as exc:
            log.warning("send to %r failed: %s", ident, exc)
            return False
