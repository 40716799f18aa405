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

log = logging.getLogger("harmony.executor")


class Aborted(Exception):
    pass


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
        self.server: ShardServer | None = None
        self.client: PSClient | None = None

    def send(self, mtype: str, **fields) -> None:
        self.ctl.send(M.encode(mtype, job=self.job, index=self.index, **fields))

    def wait(self, mtype: str) -> M.Message:
        while True:
            msg = M.decode(self.ctl.recv_multipart())
            if msg.type == mtype:
                return msg
            if msg.type == "abort":
                raise Aborted(msg["reason"])
            if msg.type == "error":
                raise RuntimeError(f"master: {msg['code']}: {msg['message']}")
            log.warning("ignoring unexpected %s while waiting for %s", msg.type, mtype)

    def barrier(self, epoch: int, it: int) -> None:
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
            store = BlockStore()
            for blk in app.read_input(InputPart(self.index, self.count, opts.blocks)):
                store.put(blk)
            spec = app.model_spec()
            # the default update (add) runs in place on the shard
            update = None if type(app).update is App.update else app.update
            table = ShardTable(spec.dim, spec.dtype, update)
            self.server = ShardServer(self.ctx, s["host"], table)
            self.server.start()
            self.ctl.send(M.encode("exec_ready", job=self.job, index=self.index,
                                   attempt=self.attempt, endpoint=self.server.endpoint,
                                   num_keys=spec.num_keys, dim=spec.dim,
                                   model_blocks=opts.model_blocks, local_blocks=len(store)))
            start = self.wait("job_start")
            owner = np.asarray(start["owner"], dtype=np.int64)
            all_keys = np.arange(spec.num_keys, dtype=np.int64)
            mine = all_keys[owner[block_of(all_keys, start["model_blocks"])] == self.index]
            table.load(mine, app.init_rows(mine))
            self.client = PSClient(self.ctx, start["peers"], owner, spec.dim, spec.dtype)
            self.barrier(-1, 0)  # every shard initialized before the first pull
            self._train(app, opts, store, table)
            self.send("exec_finished")
            return 0
        except Aborted as exc:
            log.info("aborted by master: %s", exc)
            return 3
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
            self.send("exec_failed", error=error[:8000])
        except zmq.ZMQError:
            pass

    def _train(self, app: App, opts, store: BlockStore, table: ShardTable) -> None:
        assert self.client is not None
        blocks = list(store)
        groups = block_groups(blocks, opts.iters_per_epoch)
        for epoch in range(opts.max_epochs):
            tm = {"pull": 0.0, "comp": 0.0, "push": 0.0, "sync": 0.0}
            t_epoch = time.perf_counter()
            for it, group in enumerate(groups):
                t0 = time.perf_counter()
                keys = app.keys(group)
                rows = self.client.pull(keys)
                rows.flags.writeable = False
                t1 = time.perf_counter()
                deltas = app.compute(group, keys, rows, Step(epoch, it, opts.iters_per_epoch))
                t2 = time.perf_counter()
                self.client.push(keys, deltas)
                t3 = time.perf_counter()
                self.barrier(epoch, it)
                t4 = time.perf_counter()
                tm["pull"] += t1 - t0
                tm["comp"] += t2 - t1
                tm["push"] += t3 - t2
                tm["sync"] += t4 - t3
            tm["train"] = time.perf_counter() - t_epoch
            t0 = time.perf_counter()
            keys = app.keys(blocks)
            sums = _plain(app.objective(blocks, keys, self.client.pull(keys)))
            with table.lock:
                for k, v in _plain(app.model_objective(table.keys, table.rows)).items():
                    sums[k] = sums.get(k, 0.0) + v
            tm["eval"] = time.perf_counter() - t0
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

    def close(self) -> None:
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
