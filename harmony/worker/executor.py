"""The job executor: one process per (job, machine).

It holds the job's worker role on this machine (input blocks, the app's
compute) and its PS server shard (a thread serving this machine's model
blocks). The master synchronizes iterations across the job's machines.
Started by the worker daemon as ``python -m harmony.worker.executor SPEC``.
"""
from __future__ import annotations

import logging
import math
import os
import signal
import sys
import time
import traceback

import msgpack
import numpy as np
import zmq

from harmony.app import (App, AppError, InputPart, Step, block_groups, load_app,
                         parse_app_args, should_stop)
from harmony.comm import messages as M
from harmony.comm.zmqutil import make_socket
from harmony.ps.client import PSClient, PSError
from harmony.ps.keymap import block_of
from harmony.ps.server import ShardServer, ShardTable
from harmony.store.blocks import BlockStore
from harmony.worker import jobckpt
from harmony.worker.netem import NetEm, job_token

log = logging.getLogger("harmony.executor")


PING_AFTER_S = 10.0       # ping the master after this long without a word
MASTER_TIMEOUT_S = 60.0   # and give up after this long


class Aborted(Exception):
    pass


class MasterLost(Exception):
    pass


class Paused(Exception):
    """The master paused the job; its checkpoint part is written."""


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
        self.job, self.index, self.attempt = spec["job"], spec["index"], spec["attempt"]
        self.count = spec["count"]
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
        self.last_contact = self.last_ping = time.monotonic()
        self.net_wait = 0.0   # seconds spent in emulated transfers

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
        if quiet > MASTER_TIMEOUT_S:
            raise MasterLost(f"no word from the master for {quiet:.0f}s")
        if quiet > PING_AFTER_S and time.monotonic() - self.last_ping > PING_AFTER_S:
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
            opts = parse_app_args(cls, list(s["args"]))
            app: App = cls(opts)
            # input is always (re)read: it also sets the app's own fields; a
            # resumed attempt then replaces the blocks' mutable state below
            store = BlockStore()
            for blk in app.read_input(InputPart(self.index, self.count, opts.blocks)):
                store.put(blk)
            restored = jobckpt.Restored(self.job, s["resume"]) if s.get("resume") else None
            spec = app.model_spec()
            # the default update (add) runs in place on the shard
            update = None if type(app).update is App.update else app.update
            table = ShardTable(spec.dim, spec.dtype, update)
            tag = f"{self.job}:{self.attempt}"
            self.server = ShardServer(self.ctx, s["host"], table, tag=tag)
            self.server.start()
            self.ctl.send(M.encode("exec_ready", job=self.job, index=self.index,
                                   attempt=self.attempt, endpoint=self.server.endpoint,
                                   num_keys=spec.num_keys, dim=spec.dim,
                                   model_blocks=opts.model_blocks, local_blocks=len(store)))
            start = self.wait("job_start")
            self.queued = start["mode"] == "queued"
            owner = np.asarray(start["owner"], dtype=np.int64)
            all_keys = np.arange(spec.num_keys, dtype=np.int64)
            mine = all_keys[owner[block_of(all_keys, start["model_blocks"])] == self.index]
            if restored is None:
                table.load(mine, app.init_rows(mine))
            else:
                restored.load(self.index, self.count, owner)
                if sorted(restored.inputs) != store.ids():
                    raise jobckpt.CheckpointError(
                        f"checkpoint holds input blocks {sorted(restored.inputs)[:8]}... for "
                        f"executor {self.index}, its input has {store.ids()[:8]}...")
                for blk in restored.inputs.values():
                    store.put(blk)
                table.load(mine, restored.model_rows(mine, spec.dim, spec.dtype))
                log.info("resumed from checkpoint at epoch %d", restored.epoch)
            self.client = PSClient(self.ctx, start["peers"], owner, spec.dim, spec.dtype,
                                   throttle=self._throttle_fn(start["machines"]), tag=tag)
            if self.queued:
                self.dsock.send(M.encode("hello", job=self.job, index=self.index,
                                         attempt=self.attempt))
            else:
                self.barrier(-1, 0)  # every shard initialized before the first pull
            self._train(app, opts, store, table, restored.epoch if restored else 0)
            self.send("exec_finished")
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
        except (AppError, PSError) as exc:
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
        self.send("sync", seq=self.seq, next=kind)
        self.seq += 1
        while True:
            while self.ctl.poll(0):  # pongs, aborts
                self._from_master(M.decode(self.ctl.recv_multipart()))
            if not self.dsock.poll(1000):
                self._liveness()
                continue
            msg = M.decode(self.dsock.recv_multipart())
            if msg.type == "grant" and msg["seq"] == self.seq:
                break
            if msg.type == "abort":
                raise Aborted(msg["reason"])
            if msg.type == "error":
                raise RuntimeError(f"daemon: {msg['code']}: {msg['message']}")
        try:
            return fn()
        finally:
            self.dsock.send(M.encode("sub_done", job=self.job, seq=self.seq))

    def _train(self, app: App, opts, store: BlockStore, table: ShardTable,
               first_epoch: int = 0) -> None:
        assert self.client is not None
        blocks = list(store)
        groups = block_groups(blocks, opts.iters_per_epoch)
        for epoch in range(first_epoch, opts.max_epochs):
            tm = {"pull": 0.0, "comp": 0.0, "push": 0.0, "sync": 0.0}
            self.net_wait = 0.0
            moved = list(self.client.peer_bytes)
            t_epoch = time.perf_counter()
            client = self.client
            for it, group in enumerate(groups):
                step = Step(epoch, it, opts.iters_per_epoch)
                keys = app.keys(group)
                box = {}

                def pull():
                    t = time.perf_counter()
                    # own, aligned memory for the app (a ZeroMQ frame is only
                    # malloc-aligned; measured slower in sparse kernels)
                    rows = np.array(client.pull(keys))
                    rows.flags.writeable = False
                    box["rows"] = rows
                    tm["pull"] += time.perf_counter() - t

                def comp():
                    t = time.perf_counter()
                    box["deltas"] = app.compute(group, keys, box["rows"], step)
                    tm["comp"] += time.perf_counter() - t

                def push():
                    t = time.perf_counter()
                    client.push(keys, box["deltas"])
                    tm["push"] += time.perf_counter() - t

                t0 = time.perf_counter()
                self._sub("net", pull)
                if not self.queued:
                    # strict BSP: no machine pushes iteration k before every
                    # machine pulled it (the synchronizer does this in harmony mode)
                    self.barrier(epoch, 2 * it)
                self._sub("cpu", comp)
                self._sub("net", push)
                if not self.queued:
                    self.barrier(epoch, 2 * it + 1)
                tm["sync"] += time.perf_counter() - t0
            tm["sync"] -= tm["pull"] + tm["comp"] + tm["push"]
            tm["train"] = time.perf_counter() - t_epoch
            tm["iters"] = float(len(groups))
            # PULL/PUSH data bytes of the epoch's iterations, all and to other
            # machines, and this machine's link rate (0: not known)
            delta = [b - a for a, b in zip(moved, self.client.peer_bytes)]
            tm["bytes"] = float(sum(delta))
            tm["remote_bytes"] = float(sum(delta) - delta[self.index])
            tm["link"] = float(self.netem.rate) if self.netem is not None else 0.0
            t0 = time.perf_counter()
            keys = app.keys(blocks)
            box = {}
            self._sub("net", lambda: box.__setitem__("rows", np.array(client.pull(keys))))

            def evaluate():
                box["sums"] = _plain(app.objective(blocks, keys, box["rows"]))
                with table.lock:
                    for k, v in _plain(app.model_objective(table.keys, table.rows)).items():
                        box["sums"][k] = box["sums"].get(k, 0.0) + v
            self._sub("cpu", evaluate)
            sums = box["sums"]
            tm["eval"] = time.perf_counter() - t0
            tm["net_wait"] = self.net_wait
            self.send("epoch_done", epoch=epoch, sums=sums, timings=tm)
            total = self.wait("epoch_sums")
            metrics = _plain(app.metrics(total["sums"]))
            stop = should_stop(opts, epoch, metrics)
            if self.index == 0:
                self.send("epoch_report", epoch=epoch, metrics=metrics, stop=stop)
            log.info("epoch %d: %s", epoch, {k: round(v, 6) for k, v in metrics.items()
                                              if math.isfinite(v)})
            if stop:
                return
            if total.get("pause"):
                self._pause(opts, store, table, epoch, len(groups))

    def _pause(self, opts, store: BlockStore, table: ShardTable, epoch: int, iters: int) -> None:
        """Write this executor's checkpoint part at the epoch boundary (every
        push of the epoch is applied and evaluated) and tell the master."""
        if not self.spec.get("ckpt"):
            raise RuntimeError("asked to pause without a checkpoint directory")
        t0 = time.perf_counter()
        with table.lock:
            keys, rows = table.keys.copy(), table.rows.copy()
        version = jobckpt.write_part(
            self.spec["ckpt"], self.job, self.index, keys=keys, rows=rows,
            model_blocks=self.client.nblocks, inputs=list(store), epoch=epoch,
            iteration=iters - 1, meta={"attempt": self.attempt, "count": self.count})
        self.ctl.send(M.encode("exec_paused", job=self.job, index=self.index,
                               attempt=self.attempt, epoch=epoch, version=version))
        raise Paused(f"checkpoint v{version} after epoch {epoch} in "
                     f"{time.perf_counter() - t0:.2f}s")

    def close(self) -> None:
        if self.netem is not None:
            self.netem.close()
        self.dsock.close(linger=100)
        if self.client is not None:
            self.client.close()
        if self.server is not None:
            self.server.stop()
        self.ctl.close(linger=200)  # let the final report leave
        self.ctx.term()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s executor[%(process)d] %(levelname)s %(message)s")

    def _term(signum, _frame):
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, _term)
    signal.signal(signal.SIGINT, _term)
    with open(argv[0], "rb") as fh:
        spec = msgpack.unpackb(fh.read(), raw=False)
    return Executor(spec).run()


if __name__ == "__main__":
    sys.exit(main())
