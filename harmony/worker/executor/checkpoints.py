"""An executor's checkpoint parts.

A part of a periodic checkpoint (or a pause's) at an epoch boundary,
written on this machine's disk and replicated on the first holder that
takes it, with the app's export meta; and the part of the job's final
checkpoint at its stop epoch (``ckpt_final``, for ``harmony model get``).
"""
from __future__ import annotations

import logging
import os
import time
from typing import Iterable

import msgpack
import numpy as np
import zmq

from harmony.app import App
from harmony.comm import messages as M
from harmony.ps.server import ShardTable
from harmony.store.blocks import Block, export_block
from harmony.store.checkpoint import CheckpointError
from harmony.store.errors import StoreError
from harmony.store.local import LocalInput
from harmony.store.transfer import Payload, TransferError
from harmony.worker import jobckpt
from harmony.worker.executor.links import Links
from harmony.worker.netem import job_token

log = logging.getLogger("harmony.executor")


#: what a periodic checkpoint may fail with and be skipped for (a full or
#: broken disk here, or no machine that takes the replica)
CKPT_ERRORS = (StoreError, CheckpointError, TransferError, OSError)


def _export_arrays(app: App) -> tuple[str, ...] | None:
    """The input arrays an app's export reads: () if it exports no input
    state, None if it reads whole blocks (``App.export_input_arrays``)."""
    if type(app).export_inputs is App.export_inputs:
        return ()
    keep = app.export_input_arrays
    return None if keep is None else tuple(keep)




class Checkpoints(Links):
    """Checkpoint parts: periodic, for a pause, and final."""

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
