"""The training loop: the epochs of the job on this machine.

Per iteration: PULL, COMP (the app's compute over a group of input
blocks) and PUSH, each a subtask (its slot from the daemon in queued
mode, or BSP barriers); per epoch: the objective's partial sums, the
timings and store stats in ``epoch_done``, and what the master's
``epoch_sums`` answer says next (stop, checkpoint, pause, resize): the
commands of :func:`harmony.worker.executor_core.handle`, done here.
"""
from __future__ import annotations

import logging
import math
import time

import numpy as np

from harmony.app import App, AppError, Step, should_stop
from harmony import dilation as dil
from harmony.comm import messages as M
from harmony.ps.server import ShardTable
from harmony.store.local import BlockSeq, LocalInput
from harmony.util.malloc import own_memory
from harmony.worker import executor_core as core
from harmony.worker.executor.checkpoints import CKPT_ERRORS, Checkpoints
from harmony.worker.executor.layout import Layout

log = logging.getLogger("harmony.executor")


class Paused(Exception):
    """The master paused the job; its checkpoint part is written."""



def _close_quietly(view) -> None:
    if isinstance(view, BlockSeq):
        try:
            view.close()
        except Exception as exc:
            log.error("closing the block passes after an error: %s", exc)



def _call(view, fn):
    """``fn(view)``, then end the view's passes (a BlockSeq: finish reloads,
    drop disk-blocks). An error of the call wins over one of the close."""
    if not isinstance(view, BlockSeq):
        return fn(view)
    try:
        out = fn(view)
    except Exception as exc:
        _close_quietly(view)
        # numpy: ValueError "... is read-only"; a numba kernel refuses to
        # compile a write to one (TypingError "Cannot modify readonly array")
        msg = str(exc)
        if ("read-only" in msg or "readonly array" in msg) and view.owner.zero_copy:
            raise AppError(f"the app changed an input array it did not declare in "
                           f"mutable_input {tuple(sorted(view.owner.pinned))} (spilled "
                           f"input blocks are read-only views): {msg[:2000]}") from exc
        raise
    except BaseException:
        _close_quietly(view)
        raise
    view.close()
    return out



def _own(rows: np.ndarray) -> np.ndarray:
    """Pulled rows in the app's own, aligned memory: a reply's ZeroMQ frame
    is only malloc-aligned (measured slower in sparse kernels) and is
    copied; rows that already are an array of their own (this process's
    shard answered, or a pull assembled from several shards) are not
    copied again."""
    if rows.flags.owndata and rows.flags.c_contiguous and rows.flags.aligned \
            and rows.flags.writeable:
        return rows
    return np.array(rows)


def _plain(d: dict) -> dict:
    """App partial sums as msgpack-able floats."""
    out = {}
    for k, v in d.items():
        try:
            out[str(k)] = float(v)
        except (TypeError, ValueError):
            raise AppError(f"objective value {k!r} is not a number: {v!r}") from None
    return out




class Training(Layout, Checkpoints):
    """The epochs: iterations as subtasks, then the epoch boundary."""

    def _keys(self, app: App, inp: LocalInput, ids: list[int], cache: dict, slot) -> np.ndarray:
        """``app.keys`` of some blocks; computed once per slot if the app's
        keys are static (no reload pass per iteration just for the keys)."""
        keys = cache.get(slot)
        if keys is None:
            keys = _call(inp.view(ids), app.keys)
            if getattr(app, "static_keys", False):
                cache[slot] = keys
        return keys

    def _stretch_work(self, t0: float, thread_cpu: float, process_cpu0: float,
                      factor: float) -> None:
        """Dilated (or a slower machine): CPU work begun at ``t0`` (wall) and
        ``process_cpu0`` (this process's CPU) lasts ``factor`` x what it
        computed (``dilation.work_seconds``), not x its wall time."""
        if factor == 1.0:
            return
        elapsed = time.perf_counter() - t0
        work = dil.work_seconds(elapsed, thread_cpu, time.process_time() - process_cpu0,
                                self.cores)
        if self.cpu_share is not None and self.cpu_share.active:
            self.cpu_share.stretch_to(elapsed, factor * work)   # unqueued: cores shared
        else:
            dil.stretch_to(elapsed, factor * work)

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
                    rows = _own(client.pull(keys))
                    rows.flags.writeable = False
                    box["rows"] = rows
                    # dilated: its own work x D (the link's wait is x D already)
                    dil.stretch(time.perf_counter() - t - (self.net_wait - w), self.dil)
                    tm["pull"] += time.perf_counter() - t

                def comp():
                    t, c, pc = time.perf_counter(), time.thread_time(), time.process_time()
                    if self.spill_model:   # every machine has pulled: shard idle until PUSH
                        table.spill()
                    box["deltas"] = _call(group, lambda g: app.compute(g, keys, box["rows"],
                                                                       step))
                    cpu = time.thread_time() - c
                    # an emulated slower machine, dilated: its compute x D / cpu_speed
                    self._stretch_work(t, cpu, pc, dil.cpu_factor(self.cpu_speed, self.dil))
                    tm["comp"] += time.perf_counter() - t
                    tm["comp_cpu"] += cpu

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
                t, c, pc = time.perf_counter(), time.thread_time(), time.process_time()
                box["sums"] = _plain(_call(blocks, lambda b: app.objective(b, keys,
                                                                           box["rows"])))
                table.restore()
                with table.lock:
                    for k, v in _plain(app.model_objective(table.keys, table.rows)).items():
                        box["sums"][k] = box["sums"].get(k, 0.0) + v
                self._stretch_work(t, time.thread_time() - c, pc, self.dil)
            try:
                self._sub("net", lambda: box.__setitem__("rows", _own(client.pull(keys))))
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
            self._ckpt_report()     # a part written behind the job, once done
            self.send("epoch_done", epoch=epoch, sums=sums,
                      timings=dil.undilate_timings(tm, self.dil), store=store)
            total = self.wait("epoch_sums")
            self._take_replicas(total)    # a checkpoint's holders, chosen as it is ordered
            metrics = _plain(app.metrics(total["sums"]))
            # the app's own stop rule (the scheduler's, to end the job early,
            # is in the answer): what comes next is the core's (executor_core)
            app_stop = should_stop(opts, epoch, metrics)
            for cmd in core.handle(core.EpochSums(epoch, self.index, app_stop, total)):
                kind = type(cmd)
                if kind is core.SetPrio:
                    self.prio = (cmd.cpu, cmd.net)
                elif kind is core.Report:
                    if cmd.to_master:
                        self.send("epoch_report", epoch=epoch, metrics=metrics, stop=cmd.stop)
                    log.info("epoch %d: %s  [alpha %.2f -> %.2f, stall %.3fs, mem %.0f/%.0f "
                             "MiB: %s]", epoch, {k: round(v, 6) for k, v in metrics.items()
                                                 if math.isfinite(v)},
                             store["alpha"], store["next_alpha"], tot.stall_s,
                             store["machine_mb"], store["budget_mb"], store["reason"])
                elif kind is core.FinalCheckpoint:
                    self._ckpt_drop()      # superseded: no resume after the end
                elif kind is not core.Continue:
                    # the part written behind the job is reported before a
                    # pause, a resize or the next one
                    self._ckpt_wait()
                if kind is core.FinalCheckpoint:
                    self._final_checkpoint(app, inp, table, epoch, len(groups))
                    return
                elif kind is core.Checkpoint:
                    # a periodic checkpoint degrades: one that cannot be written
                    # (a full disk) or replicated is skipped and the job goes on
                    # (its disk write and replica run behind the job: _ckpt_report)
                    try:
                        self._checkpoint(inp, table, epoch, len(groups), app, behind=True)
                    except CKPT_ERRORS as exc:
                        log.warning("checkpoint after epoch %d skipped: %s", epoch, exc)
                        self.send("ckpt_part", epoch=epoch, version=0, bytes=0,
                                  error=f"{exc.__class__.__name__}: {str(exc)[:1000]}")
                elif kind is core.Pause:
                    version, replica, nbytes, secs = self._checkpoint(inp, table, epoch,
                                                                      len(groups), app)
                    self.ctl.send(M.encode("exec_paused", job=self.job, index=self.index,
                                           attempt=self.attempt, epoch=epoch, version=version,
                                           replica=replica, bytes=nbytes))
                    raise Paused(f"checkpoint v{version} after epoch {epoch} in {secs:.2f}s")
                elif kind is core.Reconfigure:
                    self._reconfigure(opts, inp, table, epoch)
                    groups, all_ids, keys_cache = inp.groups, inp.ids(), {}
