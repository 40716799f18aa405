"""Layout and block moves: which model and input blocks this executor owns.

A normal start (the master's ``job_start``: the owner map, the model from
the app's init or from a checkpoint), a machine joining a running job
(``migrate``: it takes the blocks the others send), and a live resize at
an epoch boundary (``at_boundary``, ``migrate``, paced ``move`` commands,
``moved``/``migrating``/``migrated``, ``reconfigured``, or ``leave``).
"""
from __future__ import annotations

import logging
import time

import numpy as np
import zmq

from harmony.app import App, ModelSpec
from harmony import dilation as dil
from harmony.comm import messages as M
from harmony.comm.sealed import sealed_socket, split_address
from harmony.comm.zmqutil import make_socket
from harmony.ps.client import PSClient
from harmony.ps.keymap import block_of
from harmony.ps.server import ShardTable
from harmony.store.local import LocalInput
from harmony.store.transfer import Payload, TransferError, send_payloads, wait_acks
from harmony.worker import jobckpt
from harmony.worker.executor.memory import Memory
from harmony.worker.netem import job_token

log = logging.getLogger("harmony.executor")


class Left(Exception):
    """This machine left the job (a resize); its blocks moved away."""




class Layout(Memory):
    """Start, join and resize: the owner map and the blocks that move."""

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
                               timeout_s=dil.wall(120.0, self.dil), key=self.data_key)
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
                                   timeout_s=dil.wall(120.0, self.dil), key=self.data_key)
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
                if self.data_key is None:
                    sk = make_socket(self.ctx, zmq.DEALER, timeout_s=self.MOVE_TIMEOUT_S)
                    sk.connect(peers[d])
                else:       # sealed for the new owner's shard, as pulls and pushes
                    ep, party = split_address(peers[d])
                    if party is None:
                        raise TransferError(f"shard address {peers[d]!r} names no party id")
                    sk = sealed_socket(self.ctx, zmq.DEALER, self.data_key, peer=party,
                                       timeout_s=self.MOVE_TIMEOUT_S)
                    sk.connect(ep)
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
                                tag=self.tag if self.data_key is None else None)
            wait_acks(lambda d: socks[d], {(p.dest, p.sec, p.bid) for p in payloads}, mid,
                      self.MOVE_TIMEOUT_S)
        finally:
            for sk in socks.values():
                sk.close(linger=0)
        return out
