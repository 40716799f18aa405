"""The job executor: one process per (job, machine).

It holds the job's worker role on this machine (input blocks, the app's
compute) and its PS server shard (a thread serving this machine's model
blocks). The master synchronizes iterations across the job's machines.
Started by the worker daemon as ``python -m harmony.worker.executor SPEC``.

Input blocks live in a :class:`~harmony.store.local.LocalInput` backed by the
job's LMDB store under the worker's state dir (``STATE/store/JOB``). A
fraction α of them are disk-blocks, reloaded in the background during each
pass of the app over its blocks. α is fixed (``--disk-ratio``) or starts from
an estimate of input and model size against this job's part of the machine's
memory budget and is hill-climbed per epoch
(:class:`~harmony.store.alpha.AlphaController`) from the measured reload
stall and memory pressure. When α is 1 and memory is still short, the model
shard is spilled during COMP too.
"""
from __future__ import annotations

import faulthandler
import logging
import math
import os
import signal
import sys
import time
import traceback
from typing import Iterable

import msgpack
import numpy as np
import psutil
import zmq

from harmony.app import (App, AppError, InputPart, ModelSpec, Step, disk_ratio, load_app,
                         mutable_input, parse_app_args, should_stop)
from harmony import dilation as dil
from harmony.comm import messages as M
from harmony.comm import security
from harmony.comm.zmqutil import make_socket
from harmony.ps.client import PSClient, PSError
from harmony.ps.keymap import block_of
from harmony.ps.server import ShardServer, ShardTable
from harmony.store import staging
from harmony.store.blocks import Block, export_block
from harmony.store.checkpoint import CheckpointError
from harmony.store.transfer import Payload, TransferError, send_payloads, wait_acks
from harmony.worker import jobckpt
from harmony.store.alpha import AlphaController, Observation, Thresholds, initial_alpha
from harmony.store.errors import StoreError
from harmony.store.lmdb_store import JobStorage
from harmony.store.local import (BlockSeq, LocalInput, MemoryWatch, SpillDisabledError,
                                 own_memory, trim_heap)
from harmony.store.memory import executors_memory
from harmony.worker.netem import NetEm, job_token

log = logging.getLogger("harmony.executor")


# Memory thresholds of the α controller, as fractions of the machine's budget.
# Higher than dask's defaults (0.6/0.7/0.8/0.95, the controller's own): what
# is measured here is each executor's *peak* anonymous memory (sampled every
# 20 ms) against a hard budget measured the same way, with no garbage
# collector between them, and an executor's fixed cost (the interpreter and
# its libraries, ~20 MiB) is a large share of small emulated budgets.
#: memory thresholds of the α controller, as fractions of the machine's budget
#: (the epoch's peak against a hard budget). 0.75/0.85/0.92 until session 11:
#: bench/store_alpha.py had adaptive α 14% behind the best fixed α, which ran
#: at about 0.83 of the budget; with 0.80/0.90/0.94 adaptive came within 2-6%
#: of it (ahead in one run), with no out-of-memory kill (README, Block store)
THRESHOLDS = Thresholds(target=0.80, spill=0.90, pause=0.94, terminate=0.97)

#: what a periodic checkpoint may fail with and be skipped for (a full or
#: broken disk here, or no machine that takes the replica)
CKPT_ERRORS = (StoreError, CheckpointError, TransferError, OSError)
PING_AFTER_S = 10.0       # ping the master after this long without a word
MASTER_TIMEOUT_S = 60.0   # and give up after this long


class Aborted(Exception):
    pass


class MasterLost(Exception):
    pass


class Paused(Exception):
    """The master paused the job; its checkpoint part is written."""


class Left(Exception):
    """This machine left the job (a resize); its blocks moved away."""


def _close_quietly(view) -> None:
    if isinstance(view, BlockSeq):
        try:
            view.close()
        except Exception as exc:
            log.error("closing the block passes after an error: %s", exc)


def _export_arrays(app: App) -> tuple[str, ...] | None:
    """The input arrays an app's export reads: () if it exports no input
    state, None if it reads whole blocks (``App.export_input_arrays``)."""
    if type(app).export_inputs is App.export_inputs:
        return ()
    keep = app.export_input_arrays
    return None if keep is None else tuple(keep)


def _call(view, fn):
    """``fn(view)``, then end the view's passes (a BlockSeq: finish reloads,
    drop disk-blocks). An error of the call wins over one of the close."""
    if not isinstance(view, BlockSeq):
        return fn(view)
    try:
        out = fn(view)
    except ValueError as exc:
        _close_quietly(view)
        if "read-only" in str(exc) and view.owner.zero_copy:
            raise AppError(f"the app changed an input array it did not declare in "
                           f"mutable_input {tuple(sorted(view.owner.pinned))} (spilled "
                           f"input blocks are read-only views): {exc}") from exc
        raise
    except BaseException:
        _close_quietly(view)
        raise
    view.close()
    return out


class MachineMemory:
    """This machine's memory budget (``harmony-worker --memory``) and what
    its executors use (anonymous RSS, psutil over the daemon's children).
    ``query``: asks the daemon for its latest sample (``mem_query`` ->
    ``mem_state``), None when it does not answer."""

    def __init__(self, spec: dict, query=None) -> None:
        self.budget = int(spec.get("memory") or psutil.virtual_memory().total)
        self.explicit = bool(spec.get("memory_set"))
        self.daemon_pid = spec.get("daemon_pid") or os.getppid()
        self.query = query if self.explicit and spec.get("daemon") else None
        self._others = (0, 0)
        self._at = self._loading_at = -1e9
        self._loading = 0

    def others(self, max_age: float = 1.0) -> tuple[int, int]:
        """(bytes, count) of the machine's other executors whose input is
        loaded: from the daemon's latest sample (``mem_state``) when fresh,
        else measured here (then executors
        still reading their input count too). Cached ``max_age`` seconds."""
        now = time.monotonic()
        if now - self._at > max_age:
            self._others = self._from_daemon() or executors_memory(self.daemon_pid,
                                                                   exclude=os.getpid())
            self._at = now
        return self._others

    def loading_others(self, max_age: float = 1.0) -> int:
        """Executors here that have not loaded their input yet (known only
        with the daemon's sample; 0 without it). Cached ``max_age`` seconds."""
        now = time.monotonic()
        if now - self._loading_at > max_age:
            self._loading_at = now
            loaded = self._from_daemon()
            self._loading = 0
            if loaded is not None:
                _, everyone = executors_memory(self.daemon_pid, exclude=os.getpid())
                self._loading = max(0, everyone - loaded[1])
        return self._loading

    def _from_daemon(self) -> tuple[int, int] | None:
        if self.query is None:
            return None
        st = self.query()
        if st is None or st.get("age") is None or st["age"] > 2.0:
            return None
        return st["others_bytes"], st["others_count"]

    def effective(self, used: int) -> int:
        """The budget, capped by what the machine really has left."""
        return max(1, min(self.budget, used + int(psutil.virtual_memory().available)))


def _subst(arg: str, paths: dict[str, str]) -> str:
    for name, path in paths.items():
        url = staging.URL + name
        if arg == url or arg.endswith("=" + url):
            return arg[:len(arg) - len(url)] + path
    return arg


def _plain(d: dict) -> dict:
    """App partial sums as msgpack-able floats."""
    out = {}
    for k, v in d.items():
        try:
            out[str(k)] = float(v)
        except (TypeError, ValueError):
            raise AppError(f"objective value {k!r} is not a number: {v!r}") from None
    return out


class Executor:
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
        self.spill_model = False
        self.pause_wanted = False
        self.model_bytes = 0
        self.shard_bytes = 0      # its server shard's rows (what a checkpoint part holds)
        self.reserve = 0          # this executor's memory besides input and model
        self.note = ""            # why α is what it is

    def send(self, mtype: str, **fields) -> None:
        self.ctl.send(M.encode(mtype, job=self.job, index=self.index, **fields))

    def _from_master(self, msg: M.Message) -> None:
        self.last_contact = time.monotonic()
        if msg.type == "abort":
            raise Aborted(msg["reason"])
        if msg.type == "error":
            raise RuntimeError(f"master: {msg['code']}: {msg['message']}")

    def _liveness(self) -> None:
        """While waiting long, ping the master; give up when it is gone."""
        quiet = time.monotonic() - self.last_contact
        ping_after = dil.wall(PING_AFTER_S, self.dil)
        if quiet > dil.wall(MASTER_TIMEOUT_S, self.dil):
            raise MasterLost(f"no word from the master for {quiet:.0f}s")
        if quiet > ping_after and time.monotonic() - self.last_ping > ping_after:
            self.last_ping = time.monotonic()
            self.send("ping")

    def wait(self, mtype: str) -> M.Message:
        while True:
            if not self.ctl.poll(1000):
                self._liveness()
                continue
            msg = M.decode(self.ctl.recv_multipart())
            self._from_master(msg)
            if msg.type == mtype:
                return msg
            if msg.type != "pong":
                log.warning("ignoring unexpected %s while waiting for %s", msg.type, mtype)

    def barrier(self, epoch: int, it: int) -> None:
        if self.count == 1 and epoch >= 0:
            return  # nothing to wait for (the -1 barrier also reports "ready")
        self.send("barrier", epoch=epoch, iter=it)
        while True:
            rel = self.wait("release")
            if (rel["epoch"], rel["iter"]) == (epoch, it):
                return

    def run(self) -> int:
        s = self.spec
        try:
            cls = load_app(s["app_source"], s["app_name"])
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
            join = bool(s.get("join"))
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
            trim_heap()
            restored = (jobckpt.Restored(self.ctx, self.job, s["resume"], me=s.get("worker", ""))
                        if s.get("resume") else None)
            spec = app.model_spec()
            if not join:
                self._place_input(inp, opts, spec, fixed)
            if self.watch is not None:
                self.watch.take()   # epoch peaks from here on (not the app's parsing)
            # the default update (add) runs in place on the shard
            update = None if type(app).update is App.update else app.update
            table = self.table = ShardTable(spec.dim, spec.dtype, update,
                                            finite=bool(app.finite_updates))
            table.attach_spill(self.storage.model)
            # the PS tag names the job attempt and carries the master's secret
            # for this launch: a shard serves only requests that know it
            tag = f"{self.job}:{self.attempt}:{s.get('ps_secret') or ''}"
            self.tag = tag
            self.server = ShardServer(self.ctx, s["host"], table, tag=tag)
            self.server.start()
            me = psutil.Process()
            self.ctl.send(M.encode("exec_ready", job=self.job, index=self.index,
                                   attempt=self.attempt, endpoint=self.server.endpoint,
                                   num_keys=spec.num_keys, dim=spec.dim,
                                   model_blocks=opts.model_blocks, local_blocks=len(inp),
                                   join=join or None,
                                   # its start-up: seconds since the process began,
                                   # and the CPU seconds they took (imports, input)
                                   setup_s=dil.undilated(max(0.0, time.time() - me.create_time()),
                                                         self.dil),
                                   setup_cpu=sum(me.cpu_times()[:2])))
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
            self._train(app, opts, inp, table, first)
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

    # -- start, join, resize ----------------------------------------------------------
    MOVE_TIMEOUT_S = 300.0

    def _start(self, app: App, inp: LocalInput, table: ShardTable, spec: ModelSpec,
               restored: "jobckpt.Restored | None") -> int:
        """A normal start: the master's owner map, the model from the app's
        init or from a checkpoint. Returns the first epoch to run."""
        start = self.wait("job_start")
        self.queued = start["mode"] == "queued"
        self.sync_gen = start.get("sync_gen")
        self.machines = list(start["machines"])
        self.replicas = start.get("replicas")
        self.replica_alts = start.get("replica_alts")
        owner = np.asarray(start["owner"], dtype=np.int64)
        all_keys = np.arange(spec.num_keys, dtype=np.int64)
        mine = all_keys[owner[block_of(all_keys, start["model_blocks"])] == self.index]
        if restored is None:
            table.load(mine, app.init_rows(mine))
        else:
            restored.load(self.index, self.count, owner)
            if sorted(restored.inputs) != inp.ids():
                raise jobckpt.CheckpointError(
                    f"checkpoint holds input blocks {sorted(restored.inputs)[:8]}... for "
                    f"executor {self.index}, its input has {inp.ids()[:8]}...")
            for blk in restored.inputs.values():
                inp.restore_state(blk)
            restored.inputs = {}
            table.load(mine, restored.model_rows(mine, spec.dim, spec.dtype))
            log.info("resumed from checkpoint at epoch %d (%.1f MiB fetched)", restored.epoch,
                     restored.fetched_bytes / 2**20)
        self.server.set_layout(owner, self.index, start["peers"])
        self.client = PSClient(self.ctx, start["peers"], owner, spec.dim, spec.dtype,
                               throttle=self._throttle_fn(self.machines), tag=self.tag,
                               timeout_s=dil.wall(120.0, self.dil))
        self.client.set_local(self.server)      # this machine's shard: no ZeroMQ round trip
        return restored.epoch if restored else 0

    def _join(self, app: App, opts, inp: LocalInput, table: ShardTable, spec: ModelSpec,
              fixed: float | None) -> int:
        """This machine joins a running job: wait for the new layout, take
        the blocks the others send, and start at the next epoch."""
        m = self.wait("migrate")
        t0 = time.perf_counter()
        self.queued = m.get("mode") == "queued"
        owner = np.asarray(m["owner"], dtype=np.int64)
        self.server.expect({int(b) for b in np.flatnonzero(owner == m["index"])})
        self.server.set_layout(owner, m["index"], m["peers"])
        self.server.wait_arrivals(m["expect"], self.MOVE_TIMEOUT_S)
        for blk in sorted(self.server.end_arrivals().values(), key=lambda b: b.id):
            inp.add(blk)
        inp.set_groups(opts.iters_per_epoch)
        self._place_input(inp, opts, spec, fixed)
        self.seq = m["seq"]
        self.send("migrated", bytes_out=0, bytes_in=int(self.server.arrived_bytes),
                  seconds=dil.undilated(time.perf_counter() - t0, self.dil))
        self._apply_layout(m, spec.dim, spec.dtype)
        self.sync_gen = self.wait("reconfigured").get("sync_gen")
        return m["epoch"] + 1

    def _apply_layout(self, m: M.Message, dim: int, dtype: str) -> None:
        self.index, self.count = m["index"], m["count"]
        self.workers = m.get("workers") or self.count
        self.machines = list(m["machines"])
        self.replicas = m.get("replicas")
        self.replica_alts = m.get("replica_alts")
        owner = np.asarray(m["owner"], dtype=np.int64)
        self.server.set_layout(owner, self.index, m["peers"])
        if self.client is None:
            self.client = PSClient(self.ctx, m["peers"], owner, dim, dtype,
                                   throttle=self._throttle_fn(self.machines), tag=self.tag,
                               timeout_s=dil.wall(120.0, self.dil))
            self.client.set_local(self.server)
        else:
            self.client.set_layout(m["peers"], owner)
            self.client.throttle = self._throttle_fn(self.machines)

    def _reconfigure(self, opts, inp: LocalInput, table: ShardTable, epoch: int) -> None:
        """A resize at this epoch boundary: hand over ownership, send the
        blocks that leave this executor (model rows and input blocks with the
        app's state in them), take those that come, and go on with the new
        layout; or leave (:class:`Left`) if this machine is not in it."""
        self.send("at_boundary", epoch=epoch, seq=self.seq,
                  inputs=[[b, inp.block_bytes(b)] for b in inp.ids()])
        m = self.wait("migrate")
        t0 = time.perf_counter()
        old_owner = self.client.owner
        new_owner = np.asarray(m["owner"], dtype=np.int64)
        me = m["index"]
        nblocks = self.client.nblocks
        coming = set()
        if me >= 0:
            coming = {int(b) for b in np.flatnonzero((new_owner == me)
                                                     & (old_owner != self.index))}
        self.server.expect(coming)
        # ownership first: from here on this shard redirects what it gave away
        self.server.set_layout(new_owner, me, m["peers"])
        sends = [(str(sec), int(b), int(d)) for sec, b, d in m["sends"]]
        out = nsent = 0
        # not paced: nothing to send, or a master from before paced plans (its
        # workers upgraded while it runs): everything at once, as it asked
        if not m.get("paced"):
            out, nsent = self._move_blocks(m, sends, inp, table, nblocks,
                                           f"mv:{self.job}:{epoch}:{self.index}", (0, 0)), len(sends)
        while m.get("paced"):
            # the master's plan says which moves to make and when (at most a
            # few at once over the whole job): send every one it released
            # together, report each; op -1: this executor's moves are done
            cmds = [self.wait("move")] + self._more("move")
            ops = [c for c in cmds if c["op"] >= 0]
            if ops:
                batch = [(str(sec), int(b), int(d)) for c in ops for sec, b, d in c["sends"]]
                sizes: dict[tuple[str, int], int] = {}
                n = self._move_blocks(m, batch, inp, table, nblocks,
                                      f"mv:{self.job}:{epoch}:{self.index}:{ops[0]['op']}",
                                      (out, nsent), sizes)
                out, nsent = out + n, nsent + len(batch)
                for c in ops:
                    self.send("moved", op=int(c["op"]), bytes_out=int(sum(
                        sizes.get((str(sec), int(b)), 0) for sec, b, _ in c["sends"])))
            if len(ops) < len(cmds):
                break
        if me >= 0:
            self.server.wait_arrivals(m["expect"], self.MOVE_TIMEOUT_S)
        for blk in sorted(self.server.end_arrivals().values(), key=lambda b: b.id):
            inp.add(blk)
        inp.set_groups(opts.iters_per_epoch)
        log.info("resize after epoch %d: sent %d block(s) (%.1f MiB), received %d, in %.2fs",
                 epoch, nsent, out / 2**20, m["expect"], time.perf_counter() - t0)
        self.send("migrated", bytes_out=int(out), bytes_in=int(self.server.arrived_bytes),
                  seconds=dil.undilated(time.perf_counter() - t0, self.dil))
        self.server.arrived_bytes = 0
        if me < 0:
            self.wait("leave")
            raise Left(f"moved {nsent} block(s) away after epoch {epoch}")
        self._apply_layout(m, table.dim, table.dtype.str)
        self.sync_gen = self.wait("reconfigured").get("sync_gen")

    def _more(self, mtype: str) -> list[M.Message]:
        """Messages of ``mtype`` that have arrived already (no waiting)."""
        out = []
        while self.ctl.poll(0):
            msg = M.decode(self.ctl.recv_multipart())
            self._from_master(msg)
            if msg.type == mtype:
                out.append(msg)
            elif msg.type != "pong":
                log.warning("ignoring unexpected %s while waiting for %s", msg.type, mtype)
        return out

    def _move_blocks(self, m: M.Message, sends: list[tuple[str, int, int]], inp: LocalInput,
                     table: ShardTable, nblocks: int, mid: str, base: tuple[int, int],
                     sizes: dict[tuple[str, int], int] | None = None) -> int:
        """Send the model and input blocks ``sends`` names ([sec, block, new
        index]) to their new owners and wait until every one is acknowledged;
        returns the bytes sent. ``base``: the bytes and blocks this resize sent
        before (for progress); ``sizes`` gets each payload's bytes."""
        if not sends:
            return 0
        model_dest = {b: d for sec, b, d in sends if sec == "model"}
        payloads = [Payload("model", b, block=blk, dest=model_dest[b])
                    for b, blk in table.take_blocks(set(model_dest), nblocks).items()]
        in_dest = {b: d for sec, b, d in sends if sec == "input"}
        if in_dest:
            for blk in inp.iter_blocks(sorted(in_dest)):
                payloads.append(Payload("input", blk.id, block=blk, dest=in_dest[blk.id]))
            for b in in_dest:
                inp.remove(b)
        if sizes is not None:
            sizes.update(((p.sec, p.bid), p.size) for p in payloads)
        peers = m["peers"]
        socks = {}
        try:
            for d in sorted({p.dest for p in payloads}):
                sk = make_socket(self.ctx, zmq.DEALER, timeout_s=self.MOVE_TIMEOUT_S)
                sk.connect(peers[d])
                socks[d] = sk
            throttle = None
            if self.netem is not None:
                me_name, token = self.spec["worker"], job_token(self.job)

                def throttle(dest, n):
                    self.net_wait += self.netem.transfer(me_name, m["machines"][dest], n, token)
            ordered = [socks.get(i) for i in range(max(socks, default=-1) + 1)]
            last = [time.monotonic()]

            def progress(nbytes, blocks):
                if time.monotonic() - last[0] > 0.25:     # for harmony status
                    last[0] = time.monotonic()
                    self.send("migrating", bytes_out=int(base[0] + nbytes),
                              blocks_out=int(base[1] + blocks))
            out = send_payloads(ordered, mid, payloads, throttle=throttle, progress=progress,
                                tag=self.tag)
            wait_acks(lambda d: socks[d], {(p.dest, p.sec, p.bid) for p in payloads}, mid,
                      self.MOVE_TIMEOUT_S)
        finally:
            for sk in socks.values():
                sk.close(linger=0)
        return out

    # -- the block store ----------------------------------------------------------
    def _open_input(self, mutable: tuple[str, ...] | None = None) -> LocalInput:
        """The job's LMDB store on this machine (``STATE/store/JOB``) and the
        owner of its input blocks."""
        s = self.spec
        root = os.path.join(s.get("state_dir") or os.path.join(os.getcwd(), "state"), "store")
        # an older attempt's executor may still be stopping: wait for its lock
        self.storage = JobStorage(root, self.job, max_map_size=s.get("store_max"),
                                  lock_wait_s=10.0)
        if self.mem.explicit:
            self.watch = MemoryWatch()
        self.input = LocalInput(self.storage.input, mutable=mutable)
        return self.input

    def _budget_note(self) -> str:
        return (f" (memory budget of machine {self.spec.get('worker', '?')}: "
                f"{self.mem.budget / 2**20:.0f} MiB{'' if self.mem.explicit else ', all of it'})")

    def _others_share(self) -> int:
        """Memory the other executors here take, for this job's estimates:
        what they use now, or, if more, their equal shares of the target
        memory (jobs starting together have not loaded their input yet), so
        that each job starts from its own equal share."""
        used, _ = self.mem.others(max_age=0)
        _, n = executors_memory(self.mem.daemon_pid, exclude=os.getpid())   # loaded or not
        return max(used, int(THRESHOLDS.target * self.mem.budget * n / (n + 1)))

    def _ingest_limits(self, opts) -> dict:
        """How much input this job may hold in memory while reading it."""
        B = self.mem.budget
        base = own_memory()[1]
        if not opts.spill:
            used, _ = self.mem.others(max_age=0)
            limit = B - used - base
        else:
            # adaptive α, or a fixed one placed after reading: either way the
            # blocks beyond this go to disk as they are read, so that reading
            # the input stays under the budget (the daemon's OOM killer counts
            # an executor from its start)
            limit = int(THRESHOLDS.target * B) - self._others_share() - base
        return {"memory_limit": None if limit is None else max(0, limit),
                "spill": opts.spill, "budget_note": self._budget_note()}

    def _place_input(self, inp: LocalInput, opts, spec: ModelSpec,
                     fixed: float | None) -> None:
        """The initial α: fixed, or estimated from the input's measured size
        and the model's size against this job's part of the budget."""
        item = np.dtype(spec.dtype).itemsize
        model = spec.num_keys * spec.dim * item
        # the shard, the pulled rows, and the app's working copy of them
        self.shard_bytes = -(-spec.num_keys // self.count) * spec.dim * item
        self.model_bytes = self.shard_bytes + 2 * model
        self.reserve = max(0, own_memory()[1] - inp.memory_bytes())
        nblocks = len(inp)
        # disk-blocks in flight during a pass: loading ahead, in use, dropping
        pipeline = (inp.depth + 1) * inp.mean_block_bytes()
        B = self.mem.budget
        if fixed is not None:
            alpha, self.note = fixed, "fixed (--disk-ratio)"
        elif not opts.spill or nblocks == 0:
            alpha, self.note = 0.0, "spilling disabled" if not opts.spill else "no blocks"
            used, _ = self.mem.others(max_age=0)
            need = used + self.reserve + inp.total_bytes() + self.model_bytes
            if not opts.spill and need > B:
                raise SpillDisabledError(
                    f"out of memory: input {inp.total_bytes() / 2**20:.1f} MiB + model "
                    f"{self.model_bytes / 2**20:.1f} MiB + this executor "
                    f"{self.reserve / 2**20:.1f} MiB + other jobs {used / 2**20:.1f} MiB "
                    f"exceed{self._budget_note()}; spilling is disabled (--no-spill)")
        else:
            others = self._others_share()
            alpha = initial_alpha(inp.total_bytes(), self.model_bytes, B, others,
                                  reserve_bytes=self.reserve, num_blocks=nblocks,
                                  thresholds=THRESHOLDS)
            if alpha > 0:   # with disk-blocks, the pipeline's blocks need room too
                alpha = initial_alpha(inp.total_bytes(), self.model_bytes, B, others,
                                      reserve_bytes=self.reserve + int(pipeline),
                                      num_blocks=nblocks, thresholds=THRESHOLDS)
            th = THRESHOLDS
            self.spill_model = (alpha >= 1.0 and others + self.model_bytes + self.reserve
                                > th.spill * B)
            self.alpha_ctl = AlphaController(nblocks, alpha, block_bytes=inp.mean_block_bytes(),
                                             model_bytes=self.model_bytes, thresholds=th,
                                             spill_model=self.spill_model)
            self.note = "initial estimate"
        inp.set_alpha(alpha)
        log.info("input: %d blocks, %.1f MiB; model %.1f MiB; alpha %.2f (%s); budget %.0f MiB",
                 nblocks, inp.total_bytes() / 2**20, self.model_bytes / 2**20, inp.alpha,
                 self.note, B / 2**20)

    def _adapt(self, inp: LocalInput, tot, mem_peak: int, blocks_per_pass: float) -> dict:
        """One hill-climbing step per epoch; returns the epoch's store stats.
        The machine's pressure is (this executor's peak + the others' use) /
        budget. The budget is shared in proportion to use: when memory is
        short, each executor closes its own part of the gap (its use / the
        machine's use), and when it is plentiful each releases only its part
        of the room; a job whose reloads stall may take all the room there
        is, and jobs whose reloads hide take more disk-blocks to make room
        for a job that stalls and finds none (``others_starved``)."""
        others, _ = self.mem.others()
        machine = mem_peak + others
        eff = self.mem.effective(machine)
        stats = {"alpha": inp.alpha, "mem_blocks": len(inp.memory), "disk_blocks":
                 len(inp.on_disk), "stall_s": round(tot.stall_s, 6),
                 "reload_mb": round(tot.bytes_loaded / 2**20, 3),
                 "rss_mb": round(own_memory()[0] / 2**20, 2),
                 "anon_mb": round(mem_peak / 2**20, 2),
                 "machine_mb": round(machine / 2**20, 2),
                 "budget_mb": round(self.mem.budget / 2**20, 2),
                 "input_mb": round(inp.total_bytes() / 2**20, 2),
                 "shard_mb": round(self.shard_bytes / 2**20, 3),
                 "pinned_mb": round(inp.residue_bytes() / 2**20, 3),
                 "model_spilled": bool(self.spill_model)}
        waiting = (machine < THRESHOLDS.spill * eff and self.mem.loading_others() > 0)
        if self.alpha_ctl is not None and len(inp) and waiting:
            # co-located jobs are still reading their input: the memory looks
            # more plentiful than it will be, so only pressure may move α now
            self.note = "co-located jobs still loading their input"
        elif self.alpha_ctl is not None and len(inp):
            free = inp.spillable_block_bytes()
            starved, need = self._others_starved()
            d = self.alpha_ctl.step(Observation(
                mem_used=machine, mem_budget=eff, share=mem_peak / machine if machine else 1.0,
                stall_s=tot.stall_s,
                comp_s=tot.comp_s if tot.proc_s else None, tbproc=tot.tbproc,
                tbload=tot.tbload, blocks_total=max(1, int(round(blocks_per_pass))),
                block_bytes=free or None, others_starved=starved, others_need=need))
            self._publish(inp.alpha if d.disk_blocks == len(inp.on_disk) else
                          d.disk_blocks / len(inp), self.alpha_ctl.starved,
                          self.alpha_ctl.need)
            self.note = d.reason
            self.spill_model = d.spill_model
            if d.pause_job and not self.pause_wanted:
                log.warning("memory critical with everything spilled: this job should be "
                            "paused here (%s)", d.reason)
            self.pause_wanted = d.pause_job
            if d.disk_blocks != len(inp.on_disk):
                inp.set_disk_count(d.disk_blocks)
        stats.update({"next_alpha": inp.alpha, "pause_wanted": self.pause_wanted,
                      "reason": self.note})
        return stats

    # Co-located jobs see each other's α state through their daemon
    # (``alpha_state`` in, ``mem_state.others_starved`` out): a job whose
    # reloads stall and that finds no memory to keep more blocks is
    # "starved", and jobs whose reloads hide behind their compute then take
    # more disk-blocks.
    DAEMON_REPLY_S = 1.0      # a daemon that does not answer in this long: no news

    def _publish(self, alpha: float, starved: bool, need: float = 0.0) -> None:
        if not self.spec.get("daemon"):
            return
        try:
            self.dsock.send(M.encode("alpha_state", job=self.job, attempt=self.attempt,
                                     alpha=float(alpha), starved=bool(starved),
                                     need=float(need)), zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            log.debug("cannot publish alpha state: %s", exc)

    def _others_starved(self) -> tuple[bool, float]:
        """Whether a co-located job is starved, and the bytes they asked for."""
        st = self._daemon_memory()
        if st is None or not st["others_starved"]:
            return False, 0.0
        return True, float(st.get("others_need") or 0.0)

    def _daemon_memory(self) -> dict | None:
        """The daemon's ``mem_state`` for this executor (None: no daemon, or
        no answer in DAEMON_REPLY_S). Other daemon messages read meanwhile
        (grants, preemption news) are kept for :meth:`_sub`."""
        if not self.spec.get("daemon"):
            return None
        self._rid += 1
        rid = self._rid
        try:
            self.dsock.send(M.encode("mem_query", job=self.job, attempt=self.attempt, rid=rid),
                            zmq.NOBLOCK)
        except zmq.ZMQError:
            return None
        deadline = time.monotonic() + self.DAEMON_REPLY_S
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self.dsock.poll(int(left * 1000) + 1):
                return None
            msg = M.decode(self.dsock.recv_multipart())
            if msg.type == "mem_state":
                if msg["rid"] == rid:
                    return msg.fields
            elif msg.type == "preempted":
                self.stood += msg["seconds"]
            else:
                self._held.append(msg)

    def _fail(self, error: str) -> None:
        log.error("job failed: %s", error)
        try:
            self.send("exec_failed", error=error[:8000], attempt=self.attempt)
        except zmq.ZMQError:
            pass

    def _throttle_fn(self, machines: list[str]):
        if self.netem is None:
            return None
        me, token = self.spec["worker"], job_token(self.job)

        def throttle(peer: int, nbytes: int, direction: str) -> None:
            other = machines[peer]
            src, dst = (me, other) if direction == "out" else (other, me)
            self.net_wait += self.netem.transfer(src, dst, nbytes, token)
        return throttle

    def _sub(self, kind: str, fn):
        """Run one subtask. In queued (Harmony) mode: report the previous
        subtask to the master's synchronizer, wait for this machine's
        daemon to grant the CPU or NET slot, run, and release the slot."""
        if not self.queued:
            return fn()
        if self.sync_gen is None:
            self.send("sync", seq=self.seq, next=kind)
        else:
            self.dsock.send(M.encode("sync", job=self.job, index=self.index, seq=self.seq,
                                     next=kind, attempt=self.attempt, gen=self.sync_gen,
                                     prio=self.prio[0 if kind == "cpu" else 1]))
        self.seq += 1
        while True:
            while self.ctl.poll(0):  # pongs, aborts
                self._from_master(M.decode(self.ctl.recv_multipart()))
            if self._held:
                msg = self._held.pop(0)
            elif self.dsock.poll(1000):
                msg = M.decode(self.dsock.recv_multipart())
            else:
                self._liveness()
                continue
            if msg.type == "grant" and msg["seq"] == self.seq:
                break
            if msg.type == "preempted":    # late news of the previous COMP
                self.stood += msg["seconds"]
            elif msg.type == "abort":
                raise Aborted(msg["reason"])
            elif msg.type == "error":
                raise RuntimeError(f"daemon: {msg['code']}: {msg['message']}")
        try:
            return fn()
        finally:
            if kind == "cpu":
                self._read_preempted()
            self.dsock.send(M.encode("sub_done", job=self.job, seq=self.seq))

    def _read_preempted(self) -> None:
        """The daemon sends "preempted" before it continues a stopped COMP,
        so the news is here when that COMP ends; other messages wait."""
        while self.dsock.poll(0):
            msg = M.decode(self.dsock.recv_multipart())
            if msg.type == "preempted":
                self.stood += msg["seconds"]
            else:
                self._held.append(msg)

    def _keys(self, app: App, inp: LocalInput, ids: list[int], cache: dict, slot) -> np.ndarray:
        """``app.keys`` of some blocks; computed once per slot if the app's
        keys are static (no reload pass per iteration just for the keys)."""
        keys = cache.get(slot)
        if keys is None:
            keys = _call(inp.view(ids), app.keys)
            if getattr(app, "static_keys", False):
                cache[slot] = keys
        return keys

    def _train(self, app: App, opts, inp: LocalInput, table: ShardTable,
               first_epoch: int = 0) -> None:
        assert self.client is not None
        groups = inp.groups
        all_ids = inp.ids()
        keys_cache: dict = {}
        for epoch in range(first_epoch, opts.max_epochs):
            tm = {"pull": 0.0, "comp": 0.0, "push": 0.0, "sync": 0.0, "comp_cpu": 0.0}
            cpu_epoch = time.process_time()
            self.net_wait = 0.0
            stood0 = self.stood
            moved = list(self.client.peer_bytes)
            pulled, pushed = self.client.pull_bytes, self.client.push_bytes
            t_epoch = time.perf_counter()
            client = self.client
            for it, ids in enumerate(groups):
                step = Step(epoch, it, opts.iters_per_epoch, self.workers)
                keys = self._keys(app, inp, ids, keys_cache, it)
                # disk-blocks start loading now, behind the PULL
                group = inp.view(ids, prefetch=True)
                box = {}

                def pull():
                    t, w = time.perf_counter(), self.net_wait
                    # own, aligned memory for the app (a ZeroMQ frame is only
                    # malloc-aligned; measured slower in sparse kernels)
                    rows = np.array(client.pull(keys))
                    rows.flags.writeable = False
                    box["rows"] = rows
                    # dilated: its own work x D (the link's wait is x D already)
                    dil.stretch(time.perf_counter() - t - (self.net_wait - w), self.dil)
                    tm["pull"] += time.perf_counter() - t

                def comp():
                    t, c = time.perf_counter(), time.thread_time()
                    if self.spill_model:   # every machine has pulled: shard idle until PUSH
                        table.spill()
                    box["deltas"] = _call(group, lambda g: app.compute(g, keys, box["rows"],
                                                                       step))
                    # an emulated slower machine, dilated: x D / cpu_speed
                    dil.stretch(time.perf_counter() - t, dil.cpu_factor(self.cpu_speed, self.dil))
                    tm["comp"] += time.perf_counter() - t
                    tm["comp_cpu"] += time.thread_time() - c

                def push():
                    t, w = time.perf_counter(), self.net_wait
                    client.push(keys, app.combine_deltas(keys, box["deltas"], self.workers))
                    dil.stretch(time.perf_counter() - t - (self.net_wait - w), self.dil)
                    tm["push"] += time.perf_counter() - t

                t0 = time.perf_counter()
                try:
                    self._sub("net", pull)
                    if not self.queued:
                        # strict BSP: no machine pushes iteration k before every
                        # machine pulled it (the synchronizer does this in harmony mode)
                        self.barrier(epoch, 2 * it)
                    self._sub("cpu", comp)
                except BaseException:
                    _close_quietly(group)      # stop its prefetch
                    raise
                self._sub("net", push)
                if not self.queued:
                    self.barrier(epoch, 2 * it + 1)
                tm["sync"] += time.perf_counter() - t0
            # COMP time is the job's own: not the time it stood stopped while
            # a shorter job's COMP ran (that time stays in the iteration time)
            tm["stood"] = self.stood - stood0
            tm["comp"] = max(0.0, tm["comp"] - tm["stood"])
            tm["sync"] -= tm["pull"] + tm["comp"] + tm["push"] + tm["stood"]
            tm["train"] = time.perf_counter() - t_epoch
            # CPU seconds of this executor process (all its threads) in the
            # training part; less sensitive to other load than the wall time
            tm["train_cpu"] = time.process_time() - cpu_epoch
            tm["iters"] = float(len(groups))
            tm["blocks"] = float(len(all_ids))      # input blocks held (Cruise's d_i)
            tm["input_bytes"] = float(sum(inp.block_bytes(b) for b in all_ids))
            # PULL/PUSH data bytes of the epoch's iterations: pulled, pushed,
            # both, and to other machines; this machine's link rate (0: not known)
            delta = [b - a for a, b in zip(moved, self.client.peer_bytes)]
            tm["bytes_pull"] = float(self.client.pull_bytes - pulled)
            tm["bytes_push"] = float(self.client.push_bytes - pushed)
            tm["bytes"] = tm["bytes_pull"] + tm["bytes_push"]
            tm["remote_bytes"] = float(sum(delta) - delta[self.index])
            tm["link"] = float(self.netem.rate_of(self.spec["worker"])) \
                if self.netem is not None else 0.0
            t0 = time.perf_counter()
            keys = self._keys(app, inp, all_ids, keys_cache, "all")
            blocks = inp.view(all_ids, prefetch=True)
            box = {}

            def evaluate():
                t = time.perf_counter()
                box["sums"] = _plain(_call(blocks, lambda b: app.objective(b, keys,
                                                                           box["rows"])))
                table.restore()
                with table.lock:
                    for k, v in _plain(app.model_objective(table.keys, table.rows)).items():
                        box["sums"][k] = box["sums"].get(k, 0.0) + v
                dil.stretch(time.perf_counter() - t, self.dil)
            try:
                self._sub("net", lambda: box.__setitem__("rows", np.array(client.pull(keys))))
                self._sub("cpu", evaluate)
            except BaseException:
                _close_quietly(blocks)
                raise
            sums = box["sums"]
            tm["eval"] = time.perf_counter() - t0
            tm["eval_cpu"] = time.process_time() - cpu_epoch - tm["train_cpu"]
            tm["net_wait"] = self.net_wait
            tot = inp.take_totals()
            tm["stall"] = tot.stall_s          # reload stall of the epoch
            tm["alpha"] = inp.alpha            # the disk ratio it ran with
            mem_peak = self.watch.take() if self.watch is not None else own_memory()[1]
            store = self._adapt(inp, tot, mem_peak, len(all_ids) / max(1, len(groups)))
            self.send("epoch_done", epoch=epoch, sums=sums,
                      timings=dil.undilate_timings(tm, self.dil), store=store)
            total = self.wait("epoch_sums")
            pr = total.get("prio")
            if isinstance(pr, list) and len(pr) == 2 \
                    and all(isinstance(x, (int, float)) for x in pr):
                self.prio = (float(pr[0]), float(pr[1]))
            metrics = _plain(app.metrics(total["sums"]))
            # the app's own stop rule, or the scheduler ends the job early
            stop = should_stop(opts, epoch, metrics) or bool(total.get("stop"))
            if self.index == 0:
                self.send("epoch_report", epoch=epoch, metrics=metrics, stop=stop)
            log.info("epoch %d: %s  [alpha %.2f -> %.2f, stall %.3fs, mem %.0f/%.0f MiB: %s]",
                     epoch, {k: round(v, 6) for k, v in metrics.items() if math.isfinite(v)},
                     store["alpha"], store["next_alpha"], tot.stall_s, store["machine_mb"],
                     store["budget_mb"], store["reason"])
            if stop:
                self._final_checkpoint(app, inp, table, epoch, len(groups))
                return
            if total.get("checkpoint") and not total.get("pause"):
                # a periodic checkpoint degrades: one that cannot be written
                # (a full disk) or replicated is skipped and the job goes on
                try:
                    version, replica, nbytes, secs = self._checkpoint(inp, table, epoch,
                                                                      len(groups), app)
                except CKPT_ERRORS as exc:
                    log.warning("checkpoint after epoch %d skipped: %s", epoch, exc)
                    self.send("ckpt_part", epoch=epoch, version=0, bytes=0,
                              error=f"{exc.__class__.__name__}: {str(exc)[:1000]}")
                else:
                    self.send("ckpt_part", epoch=epoch, version=version, replica=replica,
                              bytes=nbytes)
            elif total.get("pause"):
                version, replica, nbytes, secs = self._checkpoint(inp, table, epoch,
                                                                  len(groups), app)
                self.ctl.send(M.encode("exec_paused", job=self.job, index=self.index,
                                       attempt=self.attempt, epoch=epoch, version=version,
                                       replica=replica, bytes=nbytes))
                raise Paused(f"checkpoint v{version} after epoch {epoch} in {secs:.2f}s")
            if total.get("reconfig"):
                self._reconfigure(opts, inp, table, epoch)
                groups, all_ids, keys_cache = inp.groups, inp.ids(), {}

    def _checkpoint(self, inp: LocalInput, table: ShardTable, epoch: int,
                    iters: int, app: App | None = None,
                    inputs=None) -> tuple[int, str | None, int, float]:
        """Write this executor's checkpoint part at the epoch boundary (every
        push of the epoch is applied and evaluated) on this machine's disk,
        and the same part on its replica machine over ZeroMQ (verified by the
        digest of both manifests). ``inputs``: the input blocks to write
        (default: every block, whole, or, for an app that declared its
        ``mutable_input``, only those arrays: the rest is read again from
        the input on resume). With ``app``, the app's export meta goes with
        the part (:meth:`_meta_payload`). Returns (version, replica machine,
        bytes, seconds)."""
        t0 = time.perf_counter()
        table.restore()       # a spilled model shard comes back first
        with table.lock:
            keys, rows = table.keys.copy(), table.rows.copy()
        if inputs is None:   # an app that declared its mutable input: only that,
            # and the arrays its export reads (a running job's export reads
            # its latest periodic checkpoint)
            keep = _export_arrays(app) if app is not None else ()
            inputs = (inp.mutable_state(keep) if inp.zero_copy and keep is not None
                      else inp.iter_blocks())
        payloads = jobckpt.export_part(keys, rows, self.client.nblocks, inputs)
        if app is not None:
            payloads += self._meta_payload(app)
        root = self.spec.get("state_dir") or os.path.join(os.getcwd(), "state")
        version, digest = jobckpt.write_payloads(
            jobckpt.part_dir(root, self.job, epoch, self.index), self.job, payloads,
            epoch=epoch, iteration=iters - 1, meta={"attempt": self.attempt, "count": self.count})
        nbytes = sum(p.size for p in payloads)
        replica = self.replicas[self.index] if self.replicas and \
            self.index < len(self.replicas) and self.replicas[self.index] else None
        if replica:
            alts = self.replica_alts[self.index] if self.replica_alts and \
                self.index < len(self.replica_alts) else []
            replica = self._replicate(epoch, iters, payloads, digest,
                                      [replica] + [a for a in alts if a])
        secs = time.perf_counter() - t0
        log.info("checkpoint after epoch %d: %.1f MiB here%s in %.2fs", epoch, nbytes / 2**20,
                 f" and on {replica[0]}" if replica else "", secs)
        return version, replica[0] if replica else None, nbytes, secs

    def _replicate(self, epoch: int, iters: int, payloads: list[Payload], digest: bytes,
                   holders: list) -> list:
        """Replicate the part on the first of ``holders`` ([machine, data
        endpoint]) that takes it (one whose disk is full, or that is gone,
        is passed over for the next); returns that holder. Raises the
        errors of all when none does."""
        errors = []
        for name, endpoint in holders:
            throttle = None
            if self.netem is not None:
                me, token = self.spec["worker"], job_token(self.job)

                def throttle(_dest, n, name=name):
                    self.net_wait += self.netem.transfer(me, name, n, token)
            try:
                jobckpt.replicate(self.ctx, endpoint, self.job, self.index, epoch, iters - 1,
                                  payloads, digest, throttle=throttle,
                                  timeout_s=jobckpt.FETCH_TIMEOUT_S * self.dil)
                return [name, endpoint]
            except (TransferError, M.ProtocolError, zmq.ZMQError) as exc:
                log.warning("replica of part %d on %s failed: %s", self.index, name, exc)
                errors.append(f"{name}: {exc}")
        raise TransferError("no machine took the replica: " + "; ".join(errors))

    def _meta_payload(self, app: App) -> list[Payload]:
        """The app's export meta (``App.export_meta``, e.g. MLR's class
        labels) as one extra model-section block with id ``model_blocks``:
        outside the model's block range, so a resume never fetches it, and
        replicated with the part. Nothing if the app has none."""
        try:
            meta = app.export_meta()
            data = msgpack.packb(meta, use_bin_type=True) if meta else b""
        except Exception as exc:   # an export hook must not fail training
            log.warning("export_meta() failed: %s", exc)
            data = msgpack.packb({"_error": f"export_meta() failed on executor {self.index}: "
                                            f"{exc.__class__.__name__}: {exc}"})
        if not data:
            return []
        nb = self.client.nblocks
        blk = Block(nb, {"msgpack": np.frombuffer(data, dtype=np.uint8)})
        return [Payload("model", nb, export_block(blk))]

    def _final_checkpoint(self, app: App, inp: LocalInput, table: ShardTable, epoch: int,
                          iters: int) -> None:
        """At the stop epoch: the part of the job's final checkpoint, which
        the master keeps after the job finished for ``harmony model get``.
        The model rows and the app's export meta; input blocks only for an
        app that exports input state (``App.export_inputs``), trimmed to its
        ``export_input_arrays``. Never resumed from. A failure is reported,
        not fatal: the job's result stands without an exportable model."""
        inputs: Iterable[Block] = ()
        if type(app).export_inputs is not App.export_inputs:
            keep = _export_arrays(app)
            inputs = inp.iter_blocks() if keep is None else (
                Block(b.id, {k: b[k] for k in keep if k in b.arrays}) for b in inp.iter_blocks())
        try:
            version, replica, nbytes, _ = self._checkpoint(inp, table, epoch, iters, app,
                                                           inputs=inputs)
        except (CheckpointError, TransferError, StoreError, OSError, zmq.ZMQError) as exc:
            log.warning("final checkpoint after epoch %d failed: %s", epoch, exc)
            self.send("ckpt_final", epoch=epoch, error=str(exc)[:2000])
            return
        self.send("ckpt_final", epoch=epoch, version=version, replica=replica, bytes=nbytes)

    def close(self) -> None:
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
    # a crash in native code (e.g. numpy's ufunc.at writing to a read-only
    # zero-copy input view, which ignores the flag) leaves the Python stack
    # in the log, whose tail the job's error shows
    faulthandler.enable()

    def _term(signum, _frame):
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, _term)
    signal.signal(signal.SIGINT, _term)
    with open(argv[0], "rb") as fh:
        spec = msgpack.unpackb(fh.read(), raw=False)
    return Executor(spec).run()


if __name__ == "__main__":
    sys.exit(main())
