"""The executor process: its entry point (:func:`main`) and :class:`Executor`.

The executor's state, its sockets and its life: load the app, read the
input, start the PS shard, report ``exec_ready``, start or join, train,
and close; what it exits with (0, or 1 failed, 3 aborted, 4 the master
lost).
"""
from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
import time
import traceback

import msgpack
import numpy as np
import psutil
import zmq

from harmony.app import (App, AppError, InputPart, disk_ratio, load_app, mutable_input,
                         parse_app_args)
from harmony import dilation as dil
from harmony.comm import messages as M
from harmony.comm import security
from harmony.comm.sealed import DEFAULT_MODE, DataKey
from harmony.comm.zmqutil import make_socket
from harmony.ps.client import PSClient, PSError
from harmony.ps.server import ShardServer, ShardTable
from harmony.store import staging
from harmony.store.alpha import AlphaController
from harmony.store.checkpoint import CheckpointError
from harmony.store.errors import StoreError
from harmony.store.lmdb_store import JobStorage
from harmony.store.local import LocalInput
from harmony.util.malloc import MemoryWatch, keep_working_memory, trim_heap
from harmony.store.transfer import TransferError
from harmony.worker import jobckpt
from harmony.worker.cpushare import CPUShare
from harmony.worker.executor.layout import Left
from harmony.worker.executor.links import Aborted, MasterLost
from harmony.worker.executor.memory import MachineMemory
from harmony.worker.executor.startup import run_low
from harmony.worker.executor.training import Paused, Training
from harmony.worker.netem import NetEm

log = logging.getLogger("harmony.executor")


def _subst(arg: str, paths: dict[str, str]) -> str:
    for name, path in paths.items():
        url = staging.URL + name
        if arg == url or arg.endswith("=" + url):
            return arg[:len(arg) - len(url)] + path
    return arg




class Executor(Training):
    """One job's executor on this machine: the state the components
    (:mod:`links`, :mod:`memory`, :mod:`layout`, :mod:`training`,
    :mod:`checkpoints`) share, and the process's life."""

    def __init__(self, spec: dict) -> None:
        self.spec = spec
        if spec.get("keys"):
            # the machine's worker key: the master, the daemon and the other
            # machines' sockets know this executor by it
            security.use(security.Keys.load(spec["keys"], "worker", spec["worker"]))
        self.job, self.index, self.attempt = spec["job"], spec["index"], spec["attempt"]
        self.count = spec["count"]
        # executors that hold input (workers): what a "mean" reducer divides by
        # and Step.machines; fewer than count once some executors are servers only
        self.workers = self.count
        self.cpu_speed = float(spec.get("cpu_speed") or 1.0)
        # time dilation (harmony.dilation): subtasks last D times as long,
        # timeouts too; timings are reported in undilated seconds
        self.dil = dil.check(spec.get("dilation") or 1.0)
        # the emulated machine's cores (its daemon's affinity, inherited)
        self.cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
            else (os.cpu_count() or 1)
        # an emulated machine's cores shared by the CPU work of unqueued
        # executors (naive mode), where it sleeps part of that work
        self.cpu_share = CPUShare(os.path.join(spec["state_dir"], "cpu-share"), self.cores) \
            if (self.dil > 1.0 or self.cpu_speed < 1.0) and spec.get("state_dir") else None
        self.MOVE_TIMEOUT_S = dil.wall(Executor.MOVE_TIMEOUT_S, self.dil)
        self.DAEMON_REPLY_S = dil.wall(Executor.DAEMON_REPLY_S, self.dil)
        self.ctx = zmq.Context()
        ident = f"x:{self.job}:{self.index}:{self.attempt}:{os.getpid()}".encode()
        self.ctl = make_socket(self.ctx, zmq.DEALER, identity=ident)
        self.ctl.connect(spec["master"])
        self.dsock = make_socket(self.ctx, zmq.DEALER, identity=ident)
        if spec.get("daemon"):
            self.dsock.connect(spec["daemon"])
        self.netem = NetEm(spec["netem"]) if spec.get("netem") else None
        self.server: ShardServer | None = None
        self.client: PSClient | None = None
        self.queued = False
        self.seq = 0
        # syncs go to this machine's daemon, for the leader of this layout
        # generation (harmony.subtasks.sync); None: to the master
        self.sync_gen: int | None = None
        self.prio = (0.0, 0.0)    # the job's expected COMP and network subtask seconds
        self.last_contact = self.last_ping = time.monotonic()
        self.net_wait = 0.0   # seconds spent in emulated transfers
        self.machines: list[str] = []          # the job's machines, by executor index
        self.replicas: list | None = None      # per index: [machine, data endpoint]
        self.replica_alts: list | None = None  # per index: more holders to try, in order
        self.tag = ""
        self.data_key: DataKey | None = None    # the sealed data plane's (None: CurveZMQ)
        self.stood = 0.0      # seconds its COMPs stood stopped (CPU preemption)
        self._held: list[M.Message] = []   # daemon messages read early
        # the block store
        self.mem = MachineMemory(spec, query=self._daemon_memory)
        self._rid = 0
        self.storage: JobStorage | None = None
        self.input: LocalInput | None = None
        self.table: ShardTable | None = None
        self.watch: MemoryWatch | None = None
        self.alpha_ctl: AlphaController | None = None     # None: α fixed
        # (when asked, (starved, bytes needed)): co-located jobs' state, cached
        self._starved: tuple[float, tuple[bool, float]] = (-1e9, (False, 0.0))
        # (when, (alpha, starved, need)): the α state last told the daemon
        self._published: tuple[float, tuple | None] = (-1e9, None)
        self.spill_model = False
        self.pause_wanted = False
        self.model_bytes = 0
        self.shard_bytes = 0      # its server shard's rows (what a checkpoint part holds)
        self.reserve = 0          # this executor's memory besides input and model
        self.note = ""            # why α is what it is

    def run(self) -> int:
        s = self.spec
        try:
            cls = load_app(s["app_source"], s["app_name"])
            # at the executor's own priority: a machine joining a running job
            # (that job's iterations wait for it: a live resize), and a torch
            # app (its thread pool would be made by its first parallel op, in
            # the start-up's thread, and keep the low priority)
            join = bool(s.get("join"))
            app, opts, inp, fixed, restored, spec = run_low(
                lambda: self._start_up(cls, join),
                nice=0 if join or "torch" in sys.modules else None)
            if self.watch is not None:
                self.watch.take()   # epoch peaks from here on (not the app's parsing)
            # the default update (add) runs in place on the shard
            update = None if type(app).update is App.update else app.update
            table = self.table = ShardTable(spec.dim, spec.dtype, update,
                                            finite=bool(app.finite_updates),
                                            nblocks=int(opts.model_blocks))
            table.attach_spill(self.storage.model)
            # the PS tag names the job attempt and carries the master's secret
            # for this launch: a shard serves only requests that know it. With
            # a secret (every master hands one) the data plane is sealed under
            # the key derived from it instead (harmony.comm.sealed): the tag is
            # never sent, the shard's socket runs no CurveZMQ
            tag = f"{self.job}:{self.attempt}:{s.get('ps_secret') or ''}"
            self.tag = tag
            if s.get("ps_secret"):
                self.data_key = DataKey.for_attempt(s["ps_secret"], self.job, self.attempt,
                                                    s.get("data_plane") or DEFAULT_MODE)
            self.server = ShardServer(self.ctx, s["host"], table, tag=tag, key=self.data_key)
            self.server.start()
            me = psutil.Process()
            # an emulated machine at dilation D also starts up D times
            # slower (the interpreter, the imports, the input's load): its
            # start-up lasts at least D x its CPU seconds. Without it a
            # dilated cluster's start-ups cost 1/D of their real time in
            # undilated seconds. Its CPU, not its wall, is what is scaled:
            # a start-up runs at nice 19, so its wall also holds the waits
            # for the host's real cores behind other machines' work, which
            # a D x stretch of the wall would multiply. A machine of
            # --cpu-speed s starts up s times slower again, as its COMPs run
            if self.dil > 1.0:
                dil.stretch_to(time.time() - me.create_time(),
                               dil.cpu_factor(self.cpu_speed, self.dil)
                               * sum(me.cpu_times()[:2]))
            self.ctl.send(M.encode("exec_ready", job=self.job, index=self.index,
                                   attempt=self.attempt, endpoint=self.server.endpoint,
                                   num_keys=spec.num_keys, dim=spec.dim,
                                   model_blocks=opts.model_blocks, local_blocks=len(inp),
                                   join=join or None,
                                   # its start-up: seconds since the process began,
                                   # and the CPU seconds they took (imports, input)
                                   setup_s=dil.undilated(max(0.0, time.time() - me.create_time()),
                                                         self.dil),
                                   setup_cpu=sum(me.cpu_times()[:2]),
                                   setup_stretched=self.dil > 1.0 or None))
            if join:
                table.load(np.zeros(0, np.int64), np.zeros((0, spec.dim), spec.dtype))
                first = self._join(app, opts, inp, table, spec, fixed)
            else:
                first = self._start(app, inp, table, spec, restored)
            if self.spec.get("daemon"):
                # the daemon's subtask queues (harmony mode) and its memory
                # accounting (every mode) count this executor from now on
                self.dsock.send(M.encode("hello", job=self.job, index=self.index,
                                         attempt=self.attempt))
            if not self.queued and not join:
                self.barrier(-1, 0)  # every shard initialized before the first pull
            # the start-up's memory is given back (trim_heap); the COMPs' from
            # here on stays in the heap from one iteration to the next
            keep_working_memory()
            self._train(app, opts, inp, table, first)
            self._ckpt_wait()     # (none: the final checkpoint dropped or reported it)
            self.send("exec_finished")
            return 0
        except Left as exc:
            log.info("left the job: %s", exc)
            return 0
        except Paused as exc:
            log.info("paused: %s", exc)
            return 0
        except Aborted as exc:
            log.info("aborted by master: %s", exc)
            return 3
        except MasterLost as exc:
            log.error("giving up: %s", exc)
            return 4
        except (AppError, PSError, StoreError, TransferError, CheckpointError,
                staging.StagingError) as exc:
            self._fail(str(exc))
            return 1
        except Exception as exc:
            tb = traceback.extract_tb(exc.__traceback__)
            where = next((f"{f.filename}:{f.lineno}" for f in reversed(tb)
                          if f.filename == s["app_name"]), None)
            self._fail(f"{exc.__class__.__name__}: {exc}" + (f" (at {where})" if where else ""))
            log.error("job failed:\n%s", traceback.format_exc())
            return 1
        finally:
            self.close()

    def _start_up(self, cls: type, join: bool) -> tuple:
        """Parse the app's options, read this machine's input and place it:
        the start-up's CPU work, at the lowest priority (:func:`run_low`)."""
        s = self.spec
        opts = parse_app_args(cls, self._local_inputs(list(s["args"])))
        app: App = cls(opts)
        fixed = disk_ratio(opts)
        if fixed and not opts.spill:
            raise AppError("bad app options: --disk-ratio > 0 needs spilling (--spill)")
        inp = self._open_input(mutable_input(cls))
        # -- input: the one place this machine's input blocks come from.
        # Input is always (re)read, which also sets the app's own fields;
        # a resumed attempt then replaces its blocks' mutable state from
        # the checkpoint once the owner map is known (below). A machine
        # joining a running job reads the input's metadata only: its
        # blocks arrive from the other machines (block migration).
        limits = self._ingest_limits(opts)
        # the reader's pieces stay within the same limit (the rest goes
        # to this machine's disk until the blocks are assembled)
        part = InputPart(self.index, self.count, opts.blocks,
                         owned=frozenset() if join else None,
                         memory_limit=limits["memory_limit"] if opts.spill else None,
                         scratch_dir=self.storage.parse_path,
                         machine_memory=self.mem.budget)
        inp.ingest(app.read_input(part), **limits)
        inp.set_groups(opts.iters_per_epoch)
        # the compiled kernels the app uses, loaded now rather than in its
        # first COMP (numba itself only where the app imported a kernel: it
        # costs an executor ~20 MiB); after the options and the input are
        # read, so that a job that fails on them does not load them first
        if any(m.startswith("harmony.kernels.") for m in sys.modules):
            from harmony.kernels import finite
            from harmony.kernels.warm import preload
            preload(cls, s["app_name"])
            try:        # the shard's check of pushes: ~3 ms now (the compiler is loaded)
                finite.load()
            except Exception:       # noqa: BLE001 (best effort: numpy's check stays)
                log.warning("compiled finite check not loaded: pushes checked by numpy",
                            exc_info=True)
        trim_heap()
        restored = (jobckpt.Restored(self.ctx, self.job, s["resume"], me=s.get("worker", ""))
                    if s.get("resume") else None)
        spec = app.model_spec()
        if not join:
            self._place_input(inp, opts, spec, fixed)
        return app, opts, inp, fixed, restored, spec

    def _local_inputs(self, args: list[str]) -> list[str]:
        """``harmony://NAME`` in the app's options -> this machine's copy of
        the staged data set (fetched from its holders, verified)."""
        sets = self.spec.get("datasets") or {}
        if not sets:
            return args
        root = self.spec.get("state_dir") or os.path.join(os.getcwd(), "state")
        paths = {name: staging.materialize(self.ctx, rec, root, self.spec.get("worker", ""))
                 for name, rec in sets.items()}
        return [_subst(a, paths) for a in args]

    def close(self) -> None:
        # a part still behind the job (an abort, a failure, SIGTERM): stopped
        # at its next step before the context goes, and not reported
        pend, self._pending = self._pending, None
        if pend is not None:
            pend.drop.set()
            pend.done.wait(5.0)
        if self.watch is not None:
            self.watch.close()
        if self.input is not None:
            self.input.close()
        if self.storage is not None:
            try:
                if self.storage.has_checkpoints():
                    self.storage.close()       # the spill cache goes, checkpoints stay
                else:
                    self.storage.destroy()
            except Exception as exc:
                log.warning("closing the job's store: %s", exc)
        if self.netem is not None:
            self.netem.close()
        if self.cpu_share is not None:
            self.cpu_share.close()
        self.dsock.close(linger=100)
        if self.client is not None:
            self.client.close()
        if self.server is not None:
            self.server.stop()
        self.ctl.close(linger=200)  # let the final report leave
        security.stop_authenticator(self.ctx)
        self.ctx.term()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s executor[%(process)d] %(levelname)s %(message)s")
    with open(argv[0], "rb") as fh:
        mode = os.fstat(fh.fileno()).st_mode
        if mode & 0o077:
            # the spec carries the attempt's data-plane secret (the daemon
            # writes it 0600): one that others could read may have leaked
            log.error("refusing %s: readable by others (mode %o); the spec holds "
                      "this attempt's secret and must be its owner's alone",
                      argv[0], mode & 0o777)
            return 2
        spec = msgpack.unpackb(fh.read(), raw=False)
    # a crash in native code (e.g. numpy's ufunc.at writing to a read-only
    # zero-copy input view, which ignores the flag) leaves the Python stack
    # in the log, whose tail the job's error shows
    faulthandler.enable()

    def _term(signum, _frame):
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, _term)
    signal.signal(signal.SIGINT, _term)
    return Executor(spec).run()
