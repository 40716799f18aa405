"""A worker daemon's executor processes: their launch (the spec, the
environment, the process group, the lowest-priority parent death signal),
memory sampling and the emulated OOM killer, signals (CPU preemption),
termination and reaping (the exit reported to the master with its log's
tail), and the failed executors' directories kept.

:class:`ExecutorProcesses` is a part of :class:`harmony.worker.daemon.Daemon`
(it uses the daemon's ``execs``, ``retiring``, ``core``, ``syncs``, state
dir and sends); the daemon's sockets and loop stay in ``daemon.py``.
"""
from __future__ import annotations

import ctypes
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import msgpack
import psutil

from harmony.comm import messages as M
from harmony.obs import logs as obs_logs
from harmony.store.lmdb_store import sweep_stale
from harmony.util import names
from harmony.worker.daemon_core import OomKill

log = logging.getLogger("harmony.worker")

KILL_GRACE_S = 5.0
EXECUTOR_NICE = 5


def _die_with_parent() -> None:  # runs in the child before exec
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass
    # the control plane (daemon, master) before the data plane: a subtask's
    # grant or a barrier's release then wakes its process at once instead of
    # waiting for a running COMP's time slice (raising nice needs no rights)
    os.nice(EXECUTOR_NICE)


@dataclass
class ExecProc:
    job: str
    index: int
    attempt: int
    proc: subprocess.Popen
    dir: str
    log_path: str
    term_sent: float | None = None
    oom: str = ""                 # why the emulated OOM killer stopped it

    def ident(self) -> bytes:
        """The socket identity its executor connects to the daemon with."""
        return f"x:{self.job}:{self.index}:{self.attempt}:{self.proc.pid}".encode()


def _launch_error(exc: BaseException) -> str:
    """'no space left on device: /path' rather than '[Errno 28] No space ...'."""
    if isinstance(exc, OSError) and exc.strerror:
        text = exc.strerror[:1].lower() + exc.strerror[1:]
        where = exc.filename if exc.filename is not None else ""
        return f"{text}: {where}" if where else text
    return f"{exc.__class__.__name__}: {exc}"


def _tail(path: str, n: int = 2000) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - n))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


class ExecutorProcesses:
    """The executor processes of one daemon (see the module docstring)."""

    def _launch(self, msg: M.Message) -> None:
        """Start an executor. Nothing that fails here (a full disk writing
        its spec, no memory or pids to fork) stops the daemon: the job fails
        with the cause, reported to the master like an executor that exited."""
        job = msg["job"]
        old = self.execs.pop(job, None)
        if old is not None:
            # an older attempt of the same job: stop it without blocking the
            # daemon (its shard refuses the new attempt's requests meanwhile)
            self._drop(job)
            self.syncs.exited(job, old.attempt)
            self._terminate(old)
            self.retiring.append(old)
        d = names.under(os.path.join(self.state_dir, "jobs"),
                        f"{names.check(job, 'job id')}.{int(msg['index'])}.{int(msg['attempt'])}")
        try:
            proc, log_path = self._start_executor(msg, d)
        except Exception as exc:
            why = _launch_error(exc)
            log.error("cannot start executor %d of %s: %s", msg["index"], job, why)
            shutil.rmtree(d, ignore_errors=True)
            self._send("exec_exited", job=job, index=msg["index"], attempt=msg["attempt"],
                       code=127, log_tail=f"harmony-worker {self.name}: cannot start the "
                                          f"executor: {why}"[:4000])
            return
        self.execs[job] = ExecProc(job, msg["index"], msg["attempt"], proc, d, log_path)
        self.syncs.launched(job, msg["attempt"], msg.get("secret"))
        self.core.started(job, self.clock())      # its memory counts from now
        log.info("started executor %d of %s (attempt %d, pid %d)", msg["index"], job,
                 msg["attempt"], proc.pid)

    def _start_executor(self, msg: M.Message, d: str) -> tuple[subprocess.Popen, str]:
        job = msg["job"]
        os.makedirs(d, exist_ok=True)
        spec = {"job": job, "index": msg["index"], "count": msg["count"],
                "attempt": msg["attempt"], "app_name": msg["app_name"],
                "app_source": msg["app_source"], "args": msg["args"],
                "master": self.master, "host": self.host, "worker": self.name,
                "daemon": self.xendpoint, "netem": self.netem_path,
                "cpu_speed": self.cpu_speed, "dilation": self.dilation,
                "resume": msg.get("resume"), "join": bool(msg.get("join")),
                "datasets": msg.get("datasets"),
                "keys": self.keys.directory if self.keys is not None else None,
                "ps_secret": msg.get("secret"), "data_plane": self.data_plane,
                # the block store: job stores under STATE/store, the budget
                "state_dir": self.state_dir, "memory": int(self.memory),
                "memory_set": self.memory_set, "daemon_pid": os.getpid(),
                "store_max": self.store_max}
        spec_path = os.path.join(d, "spec.msgpack")
        try:
            # it carries the attempt's data-plane secret: its owner's alone,
            # from its creation (a file made 0644 then chmodded could be
            # opened by another local user in between)
            if os.path.exists(spec_path):
                os.unlink(spec_path)
            fd = os.open(spec_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(msgpack.packb(spec, use_bin_type=True))
                fh.flush()
                os.fsync(fh.fileno())     # a full disk shows here, not in the executor
        except OSError as exc:
            exc.filename = exc.filename or spec_path       # name the file it could not write
            raise
        log_path = os.path.join(d, "executor.log")
        env = dict(os.environ)
        threads = str(self.cpus)  # numeric libraries use this machine's cores only
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                    "NUMEXPR_NUM_THREADS", "HARMONY_THREADS"):
            env[var] = threads
        with open(log_path, "ab") as logf:
            proc = subprocess.Popen(
                [sys.executable, "-m", "harmony.worker.executor", spec_path],
                stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                # its own process group (the daemon signals the group: SIGSTOP,
                # SIGTERM) in the daemon's session: where the kernel groups
                # CPU time by session (autogroup, the default on desktop and
                # many cloud kernels) a session of its own would get as much
                # CPU as the daemon and every other executor, whatever their
                # nice values (EXECUTOR_NICE, the start-up's nice 19)
                process_group=0, preexec_fn=_die_with_parent, cwd=d, env=env)
        return proc, log_path

    def _exec_memory(self, jobs) -> dict[str, int]:
        """Anonymous RSS of these jobs' executors."""
        out = {}
        for job in jobs:
            ep = self.execs.get(job)
            if ep is None:
                continue
            try:
                mi = psutil.Process(ep.proc.pid).memory_info()
            except psutil.Error:
                continue
            out[job] = max(0, mi.rss - getattr(mi, "shared", 0))
        return out

    def _check_memory(self) -> None:
        """Sample every executor's memory from the moment its process started
        (input parsing and model setup included) for the core: what the
        executors' α controllers are told (``mem_query``: the loaded ones)
        and, with ``oom_kill``, the emulated OOM killer: over the budget,
        SIGKILL the largest, as the kernel would."""
        now = self.clock()
        for kill in self.core.memory(now, self._exec_memory(self.core.memory_jobs())):
            self._oom_kill(kill)

    def _oom_kill(self, k: OomKill) -> None:
        ep = self.execs.get(k.job)
        if ep is None:
            return
        setup = "" if k.loaded else " while setting up (before its input was loaded)"
        ep.oom = (f"out of memory: the executors of machine {self.name} used "
                  f"{k.total / 2**20:.0f} MiB, over its memory budget of "
                  f"{k.budget / 2**20:.0f} MiB (--memory); the largest, {k.job} "
                  f"({k.used / 2**20:.0f} MiB{setup}), was killed (emulated OOM killer)")
        log.warning(ep.oom)
        try:
            with open(ep.log_path, "a") as fh:
                fh.write(f"harmony-worker: {ep.oom}\n")
        except OSError:
            pass
        try:
            ep.proc.kill()
        except (OSError, ProcessLookupError):
            pass

    def _terminate(self, ep: ExecProc) -> None:
        if ep.proc.poll() is None and ep.term_sent is None:
            ep.term_sent = time.time()
            try:
                ep.proc.terminate()
                os.killpg(ep.proc.pid, signal.SIGCONT)   # if preempted: let it see SIGTERM
            except ProcessLookupError:
                pass

    def _signal(self, job: str, sig: int) -> None:
        """CPU preemption: stop a long COMP's executor (SIGSTOP to its
        process group) while a much shorter COMP runs, continue it after."""
        ep = self.execs.get(job)
        if ep is None or ep.proc.poll() is not None:
            return
        try:
            os.killpg(ep.proc.pid, sig)
        except ProcessLookupError:
            pass

    def _reap(self) -> None:
        now = time.time()
        for ep in list(self.retiring):
            code = ep.proc.poll()
            if code is None:
                if ep.term_sent is not None and now - ep.term_sent > KILL_GRACE_S:
                    ep.proc.kill()
                continue
            self.retiring.remove(ep)
            obs_logs.retire(self.state_dir, ep.dir)     # [obs] its log kept (size/age limits)
        for job, ep in list(self.execs.items()):
            code = ep.proc.poll()
            if code is None:
                if ep.term_sent is not None and now - ep.term_sent > KILL_GRACE_S:
                    ep.proc.kill()
                continue
            del self.execs[job]
            self.xident.pop(job, None)
            self.syncs.exited(job, ep.attempt)
            self._apply(self.core.exited(job, self.clock()))
            tail = _tail(ep.log_path) if code != 0 else ""
            if ep.oom:   # the reason first: the log's tail may be long
                tail = f"{ep.oom}\n{tail}"
            log.info("executor of %s exited with %s", job, code)
            self._send("exec_exited", job=job, index=ep.index, attempt=ep.attempt,
                       code=int(code), log_tail=tail)
            if code == 0 or ep.term_sent is not None:
                obs_logs.retire(self.state_dir, ep.dir)     # [obs] its log kept (limits)
            else:
                self._prune_failed()
                # a killed executor (e.g. by the OOM killer) left its job
                # store behind: delete its spill cache (checkpoints stay)
                sweep_stale(os.path.join(self.state_dir, "store"))

    def _prune_failed(self, keep: int = 20) -> None:
        """Keep the directories (logs) of the newest failed executors only."""
        root = os.path.join(self.state_dir, "jobs")
        live = {ep.dir for ep in self.execs.values()}

        def mtime(path: str) -> float:
            try:
                return os.path.getmtime(path)
            except OSError:        # gone meanwhile
                return 0.0
        try:
            dirs = sorted((os.path.join(root, d) for d in os.listdir(root)), key=mtime)
        except OSError as exc:
            log.warning("cannot list %s: %s", root, exc)
            return
        old = [d for d in dirs if d not in live]
        for d in old[:max(0, len(old) - keep)]:
            shutil.rmtree(d, ignore_errors=True)
