"""The worker daemon: one per machine.

Registers the machine with the master, sends heartbeats, and starts and stops
job executor processes (one per job on this machine). An executor that
crashes is reported to the master with its exit status and the tail of its
log; it never takes the daemon down. On SIGTERM/SIGINT the daemon stops its
executors (SIGTERM, then SIGKILL) before it exits; executors also die with
the daemon if it is killed outright (PR_SET_PDEATHSIG).
"""
from __future__ import annotations

import ctypes
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

import msgpack
import psutil
import zmq

from harmony.comm import messages as M
from harmony.comm.zmqutil import make_socket

log = logging.getLogger("harmony.worker")

KILL_GRACE_S = 5.0


def _die_with_parent() -> None:  # runs in the child before exec
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


@dataclass
class ExecProc:
    job: str
    index: int
    attempt: int
    proc: subprocess.Popen
    dir: str
    log_path: str
    term_sent: float | None = None


def _tail(path: str, n: int = 2000) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - n))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


class Daemon:
    def __init__(self, master: str, name: str | None = None, host: str = "127.0.0.1",
                 cpus: int | None = None, memory: int | None = None,
                 state_dir: str | None = None) -> None:
        self.master = master
        self.name = name or f"{socket.gethostname()}-{os.getpid()}"
        self.host = host
        self.cpus = cpus or psutil.cpu_count(logical=True) or 1
        self.memory = memory or psutil.virtual_memory().total
        self.state_dir = os.path.abspath(state_dir or os.path.join(
            os.path.expanduser("~/.harmony/workers"), self.name))
        os.makedirs(os.path.join(self.state_dir, "jobs"), exist_ok=True)
        self.ctx = zmq.Context()
        self.sock = make_socket(self.ctx, zmq.DEALER, identity=f"w:{self.name}:{os.getpid()}".encode())
        self.sock.connect(master)
        self.execs: dict[str, ExecProc] = {}
        self.registered = False
        self.hb_interval = 1.0
        self._stop = False
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
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)
        log.info("worker %s (%d cpus, %.1f GiB) -> master %s", self.name, self.cpus,
                 self.memory / 2**30, self.master)
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        try:
            while not self._stop:
                try:
                    if poller.poll(100):
                        while True:
                            try:
                                frames = self.sock.recv_multipart(zmq.NOBLOCK)
                            except zmq.Again:
                                break
                            self._handle(frames)
                except zmq.ZMQError as exc:
                    if exc.errno != zmq.EINTR:
                        raise
                now = time.time()
                if now - self._last_send >= self.hb_interval:
                    self._last_send = now
                    if self.registered:
                        self._send("heartbeat", name=self.name, executors=sorted(self.execs))
                        if now - self._last_ack > 5 * self.hb_interval:
                            log.warning("no reply from master for %.0fs; re-registering",
                                        now - self._last_ack)
                            self.registered = False
                    else:
                        self._send("register", name=self.name, host=self.host, cpus=self.cpus,
                                   memory=self.memory, pid=os.getpid(),
                                   executors=sorted(self.execs))
                self._reap()
        finally:
            self.shutdown()

    def shutdown(self) -> None:
        for ep in self.execs.values():
            self._terminate(ep)
        deadline = time.time() + KILL_GRACE_S
        for ep in list(self.execs.values()):
            try:
                ep.proc.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                ep.proc.kill()
                ep.proc.wait()
        self.execs.clear()
        self.sock.close(linger=0)
        self.ctx.term()
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
            self.hb_interval = float(msg["heartbeat_interval"])
            log.info("registered with master")
        elif msg.type == "hb_ack":
            pass
        elif msg.type == "error":
            if msg["code"] == "unknown_worker":
                self.registered = False
            else:
                log.warning("master error: %s: %s", msg["code"], msg["message"])
        elif msg.type == "launch":
            self._launch(msg)
        elif msg.type == "kill":
            ep = self.execs.get(msg["job"])
            if ep is not None:
                log.info("stopping executor of %s", msg["job"])
                self._terminate(ep)
        else:
            log.warning("unexpected %s from master", msg.type)

    def _launch(self, msg: M.Message) -> None:
        job = msg["job"]
        old = self.execs.pop(job, None)
        if old is not None:  # an older attempt of the same job: stop it first
            self._terminate(old)
            try:
                old.proc.wait(timeout=KILL_GRACE_S)
            except subprocess.TimeoutExpired:
                old.proc.kill()
        d = os.path.join(self.state_dir, "jobs", f"{job}.{msg['index']}.{msg['attempt']}")
        os.makedirs(d, exist_ok=True)
        spec = {"job": job, "index": msg["index"], "count": msg["count"],
                "attempt": msg["attempt"], "app_name": msg["app_name"],
                "app_source": msg["app_source"], "args": msg["args"],
                "master": self.master, "host": self.host, "worker": self.name}
        spec_path = os.path.join(d, "spec.msgpack")
        with open(spec_path, "wb") as fh:
            fh.write(msgpack.packb(spec, use_bin_type=True))
        log_path = os.path.join(d, "executor.log")
        with open(log_path, "ab") as logf:
            proc = subprocess.Popen(
                [sys.executable, "-m", "harmony.worker.executor", spec_path],
                stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=_die_with_parent, cwd=d)
        self.execs[job] = ExecProc(job, msg["index"], msg["attempt"], proc, d, log_path)
        log.info("started executor %d of %s (attempt %d, pid %d)", msg["index"], job,
                 msg["attempt"], proc.pid)

    def _terminate(self, ep: ExecProc) -> None:
        if ep.proc.poll() is None and ep.term_sent is None:
            ep.term_sent = time.time()
            try:
                ep.proc.terminate()
            except ProcessLookupError:
                pass

    def _reap(self) -> None:
        now = time.time()
        for job, ep in list(self.execs.items()):
            code = ep.proc.poll()
            if code is None:
                if ep.term_sent is not None and now - ep.term_sent > KILL_GRACE_S:
                    ep.proc.kill()
                continue
            del self.execs[job]
            tail = _tail(ep.log_path) if code != 0 else ""
            log.info("executor of %s exited with %s", job, code)
            self._send("exec_exited", job=job, index=ep.index, code=int(code), log_tail=tail)
            if code == 0:
                shutil.rmtree(ep.dir, ignore_errors=True)
