"""An executor's checkpoint parts.

A part of a periodic checkpoint (or a pause's) at an epoch boundary,
written on this machine's disk and replicated on the first holder that
takes it, with the app's export meta; and the part of the job's final
checkpoint at its stop epoch (``ckpt_final``, for ``harmony model get``).
"""
from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

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
from harmony.worker.netem import NetEm, job_token

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




#: bytes of a part's transfer behind the job between two looks at whether
#: it was dropped (0.13 s at 2 MB/s: an emulated 16 MB/s link at D = 8)
DROP_STEP = 256 * 1024


@dataclass
class Pending:
    """A periodic checkpoint part written and replicated behind the job."""
    epoch: int
    thread: threading.Thread | None = None
    result: tuple | None = None          # (version, replica, bytes, seconds)
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)
    drop: threading.Event = field(default_factory=threading.Event)   # superseded


class Superseded(TransferError):
    """A part behind the job dropped: the final checkpoint supersedes it."""


class Checkpoints(Links):
    """Checkpoint parts: periodic, for a pause, and final.

    Decision: a periodic part is written and replicated behind the job. At
    the boundary the executor only snapshots its shard's rows and its input
    state into exported bytes; the disk write and the replica's transfer run
    in a thread while the next epochs train, and ``ckpt_part`` goes to the
    master at the first epoch end after it is done (the master orders no
    other checkpoint until then). Before a pause or a resize the executor
    waits for it; the final checkpoint supersedes it (a finished job
    resumes from nothing): its replica's transfer stops at its next step
    (``DROP_STEP``), the part is not reported, and the holder drops what
    it got (an idle transfer, ``dataservice.IDLE_S``). The part's exported
    bytes (the shard's rows and the input state it writes) stay in memory
    until it is done, across the epochs it overlaps. Written in line, a
    1-machine job stood 1.3-2.6 s per checkpoint at D = 8 while its replica
    crossed the 16 MB/s emulated link behind other jobs' moves
    (bench/cluster_e2e.py, session 23: about 12 of the 28 s its jobs spent
    at epoch boundaries). A pause's part and the final one stay in line:
    the executor exits after them."""

    _pending: Pending | None = None

    def _checkpoint(self, inp: LocalInput, table: ShardTable, epoch: int,
                    iters: int, app: App | None = None,
                    inputs=None, behind: bool = False) -> tuple[int, str | None, int, float]:
        """Write this executor's checkpoint part at the epoch boundary (every
        push of the epoch is applied and evaluated) on this machine's disk,
        and the same part on its replica machine over ZeroMQ (verified by the
        digest of both manifests). ``inputs``: the input blocks to write
        (default: every block, whole, or, for an app that declared its
        ``mutable_input``, only those arrays: the rest is read again from
        the input on resume). With ``app``, the app's export meta goes with
        the part (:meth:`_meta_payload`). Returns (version, replica machine,
        bytes, seconds). With ``behind``, the part's content is exported now
        and the rest runs in a thread (:meth:`_ckpt_report` reports it);
        returns (0, None, bytes, seconds so far)."""
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
        # exported: bytes of their own, whatever the next epochs change
        payloads = jobckpt.export_part(keys, rows, self.client.nblocks, inputs)
        if app is not None:
            payloads += self._meta_payload(app)
        nbytes = sum(p.size for p in payloads)
        root = self.spec.get("state_dir") or os.path.join(os.getcwd(), "state")
        path = jobckpt.part_dir(root, self.job, epoch, self.index)
        meta = {"attempt": self.attempt, "count": self.count}
        replica = self.replicas[self.index] if self.replicas and \
            self.index < len(self.replicas) and self.replicas[self.index] else None
        holders = []
        if replica:
            alts = self.replica_alts[self.index] if self.replica_alts and \
                self.index < len(self.replica_alts) else []
            holders = [replica] + [a for a in alts if a]

        def finish(wait: Callable[[str, int], float] | None,
                   dropped: Callable[[], None] = lambda: None) -> tuple:
            version, digest = jobckpt.write_payloads(path, self.job, payloads, epoch=epoch,
                                                     iteration=iters - 1, meta=meta)
            dropped()
            held = self._replicate(epoch, iters, payloads, digest, holders, wait) \
                if holders else None
            secs = time.perf_counter() - t0
            log.info("checkpoint after epoch %d: %.1f MiB here%s in %.2fs%s", epoch,
                     nbytes / 2**20, f" and on {held[0]}" if held else "", secs,
                     " (behind the job)" if behind else "")
            return version, held[0] if held else None, nbytes, secs

        if not behind:
            return finish(None)
        self._ckpt_wait()        # one at a time (the master orders none before)
        pend = Pending(epoch)

        def dropped() -> None:
            if pend.drop.is_set():
                raise Superseded("superseded by the final checkpoint")

        def work() -> None:
            netem = None
            try:
                # a link emulation of its own: NetEm's lock is a flock, which
                # does not exclude another thread on the same open file
                netem = NetEm(self.netem.path) if self.netem is not None else None
                link = None if netem is None else self._link_wait(netem)

                def wait(to: str, n: int) -> None:
                    # paced in steps (a chunk of send_payloads is up to 8 MiB,
                    # seconds on a slow link): a drop stops it at the next step
                    for off in range(0, max(1, n), DROP_STEP):
                        dropped()
                        if link is not None:
                            link(to, min(DROP_STEP, n - off))
                pend.result = finish(wait, dropped)
            except BaseException as exc:      # reported by _ckpt_report
                pend.error = exc
            finally:
                if netem is not None:
                    netem.close()
                pend.done.set()

        pend.thread = threading.Thread(target=work, name=f"ckpt-e{epoch}", daemon=True)
        pend.thread.start()
        self._pending = pend
        return 0, None, nbytes, time.perf_counter() - t0

    def _take_replicas(self, msg: M.Message) -> None:
        """The replica machines (and alternates) the master chose for the
        checkpoint it orders at this boundary, where it sends them; kept
        only if they are well formed (one per executor: None or [machine,
        data endpoint], alternates a list of those per executor)."""
        reps, alts = msg.get("replicas"), msg.get("replica_alts")
        if reps is None:
            return

        def holder(h) -> bool:
            return isinstance(h, list) and len(h) == 2 and all(isinstance(x, str) for x in h)
        if not (isinstance(reps, list) and len(reps) == self.count
                and all(r is None or holder(r) for r in reps)
                and isinstance(alts, list) and len(alts) == self.count
                and all(isinstance(a, list) and all(holder(h) for h in a) for a in alts)):
            log.warning("epoch_sums: malformed replicas ignored (the attempt's are kept)")
            return
        self.replicas, self.replica_alts = reps, alts

    def _link_wait(self, netem: NetEm) -> Callable[[str, int], float]:
        me, token = self.spec["worker"], job_token(self.job)
        return lambda to, n: netem.transfer(me, to, n, token)

    def _ckpt_wait(self) -> None:
        """Wait for the part written behind the job, if any, and report it."""
        if self._pending is not None:
            self._pending.done.wait()
            self._ckpt_report()

    def _ckpt_drop(self) -> None:
        """Drop the part behind the job, if any (the final checkpoint
        supersedes it): its transfer stops at its next step (a local write
        or a replica's acknowledgement under way is waited for). A part
        done by then is reported all the same (its holders are then known
        to the master, whose gc removes them)."""
        pend = self._pending
        if pend is None:
            return
        pend.drop.set()
        pend.done.wait()
        if pend.result is not None:
            return self._ckpt_report()
        self._pending = None
        log.info("checkpoint after epoch %d dropped: the final one supersedes it", pend.epoch)

    def _ckpt_report(self) -> None:
        """Report the part written behind the job (``ckpt_part``) once it is
        done; one that failed is reported as skipped, as in line."""
        pend = self._pending
        if pend is None or not pend.done.is_set():
            return
        self._pending = None
        if pend.error is not None:
            exc = pend.error
            if not isinstance(exc, CKPT_ERRORS + (M.ProtocolError, zmq.ZMQError)):
                raise exc
            log.warning("checkpoint after epoch %d skipped: %s", pend.epoch, exc)
            self.send("ckpt_part", epoch=pend.epoch, version=0, bytes=0,
                      error=f"{exc.__class__.__name__}: {str(exc)[:1000]}")
            return
        version, replica, nbytes, _ = pend.result
        self.send("ckpt_part", epoch=pend.epoch, version=version, replica=replica, bytes=nbytes)

    def _replicate(self, epoch: int, iters: int, payloads: list[Payload], digest: bytes,
                   holders: list, wait: Callable[[str, int], float] | None = None) -> list:
        """Replicate the part on the first of ``holders`` ([machine, data
        endpoint]) that takes it (one whose disk is full, or that is gone,
        is passed over for the next); returns that holder. Raises the
        errors of all when none does. ``wait(machine, bytes)``: the link
        emulation's wait of a part written behind the job (not counted in
        the epoch's own network wait)."""
        errors = []
        for name, endpoint in holders:
            throttle = None
            if wait is not None:
                def throttle(_dest, n, name=name):
                    wait(name, n)
            elif self.netem is not None:
                me, token = self.spec["worker"], job_token(self.job)

                def throttle(_dest, n, name=name):
                    self.net_wait += self.netem.transfer(me, name, n, token)
            try:
                jobckpt.replicate(self.ctx, endpoint, self.job, self.index, epoch, iters - 1,
                                  payloads, digest, throttle=throttle,
                                  timeout_s=jobckpt.FETCH_TIMEOUT_S * self.dil)
                return [name, endpoint]
            except Superseded:
                raise
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
