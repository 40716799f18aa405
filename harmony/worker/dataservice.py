"""A worker's data service: what this machine's disk holds, served over ZeroMQ.

One thread of the worker daemon, with its own ROUTER socket (its endpoint is
sent to the master at registration). Shared nothing: this is the only way
any other process reaches data on this machine's disk.

* ``ckpt_manifest`` / ``ckpt_fetch``: checkpoint parts held here (written by
  this machine's executors, or replicas received from other machines), each
  block verified against its SHA-256 before it is sent.
* ``blk`` … ``blk_end`` with a ``rep:`` transfer id: a replica of another
  machine's checkpoint part, assembled, verified, written to this machine's
  disk, and answered with ``blk_done`` carrying the digest of its manifest.
  ``blk_end`` with meta kind "stage": chunks of a staged data set.

Until its ``blk_end`` a transfer's chunks go to disk as they arrive, one
spool file per transfer under ``STATE/spool`` (:mod:`harmony.store.spool`:
its bounds on memory, disk and idle time), and at its end its blocks are
read back from there one at a time: a peer that never closes what it sent
leaves files, not memory, and those go after ``IDLE_S``.

No block costs this process its size, however large: a replica's blocks
and a staged chunk are copied from the spool into LMDB a piece at a time,
each spool range punched out once it is committed
(:mod:`harmony.store.pieces`), and a fetched block or chunk is read from
LMDB's file and sent one chunk at a time, its SHA-256 checked as it goes
(at most ``transfer.MAX_QUEUED`` chunks read for it wait in ZeroMQ's
queue for a slow reader: the ROUTER's high-water mark stays at its
default, since replies to a peer that left block on a full one).
"""
from __future__ import annotations

import logging
import os
import threading
import time

import zmq

from harmony.comm import messages as M
from harmony.comm import security
from harmony.comm.zmqutil import bind_random, make_socket
from harmony.obs import logs as obs_logs
from harmony.store.checkpoint import CheckpointError, CheckpointStore
from harmony.store.errors import StoreError
from harmony.store import staging
from harmony.store.staging import ChunkStore, StagingError
from harmony.store.pieces import Hashed
from harmony.store.spool import Spool, Spooled
from harmony.store.transfer import (CHUNK_BYTES, HEAD_BYTES, Payload, TransferError,
                                    send_payloads)
from harmony.util.names import BadName
from harmony.worker import jobckpt

log = logging.getLogger("harmony.data")

#: messages (a block chunk: up to 8 MiB) that wait in ZeroMQ's queue for one
#: connection before the service reads them: beyond it the sender waits (TCP
#: pushes back) instead of this process holding what it sent (the default,
#: 1,000, let a flood of 70 chunks grow the daemon by 104-208 MiB while the
#: spool wrote them, against 32-40 MiB with 4: bench/attack_memory.py)
RCV_HWM = 4
#: a transfer that sends nothing for IDLE_S is dropped, its spool file deleted
IDLE_S = 60.0
#: a replica's blocks are written to its part, as pieces, in transactions of
#: this many bytes (and one piece): what is held while they commit
REPLICA_BATCH_BYTES = 16 << 20
#: the largest frame the service reads (ZMQ_MAXMSGSIZE: a larger one
#: disconnects its sender before it is buffered): a block chunk is at most
#: CHUNK_BYTES; headers (a chunk's, with its payload's array list; a fetch's
#: list of wanted blocks) are far below the extra MiB
MAX_FRAME_BYTES = CHUNK_BYTES + (1 << 20)
#: what the service decodes: one header of at most 1 MiB (a fetch's list of
#: wanted blocks, a chunk's payload header) and one chunk
DATA_LIMITS = M.Limits(max_bytes=MAX_FRAME_BYTES + (1 << 20), max_header=1 << 20,
                       max_frames=2, max_str=64 * 1024, max_bin=HEAD_BYTES,
                       max_array=1 << 17, max_map=1024, max_objects=1 << 19)


class DataService:
    def __init__(self, ctx: zmq.Context, host: str, state_dir: str, name: str = "") -> None:
        self.state_dir = state_dir
        self.name = name              # the machine's (in log replies)
        self.chunks = ChunkStore(state_dir)      # staged input (harmony data put)
        self.sock = make_socket(ctx, zmq.ROUTER)
        self.sock.setsockopt(zmq.SNDTIMEO, 60_000)
        self.sock.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
        self.sock.setsockopt(zmq.RCVHWM, RCV_HWM)
        self.endpoint = bind_random(self.sock, host)
        self.spool = Spool(os.path.join(state_dir, "spool"), idle_s=IDLE_S)
        self._stop = threading.Event()
        self._next_expiry = 0.0
        self._thread = threading.Thread(target=self._run, name="data-service", daemon=True)
        self.served_bytes = 0
        self.received_bytes = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close(linger=0)
        self.chunks.close()
        self.spool.close()

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        while not self._stop.is_set():
            if time.monotonic() >= self._next_expiry:
                self._expire()
            try:
                if not poller.poll(200):
                    continue
                frames = self.sock.recv_multipart(copy=False)
            except zmq.ZMQError:
                if self._stop.is_set():
                    return
                raise
            ident = frames[0].bytes
            keys = security.current()
            role = keys.peer(frames[1].get("User-Id"))[0] if keys is not None and \
                len(frames) > 1 else None
            if keys is not None and role not in ("worker", "client", "reader"):
                self._reply(ident, M.error("forbidden", "the data service serves workers and "
                                                        "clients, not this key"))
                continue
            try:
                msg = M.decode(frames[1:], DATA_LIMITS)
            except M.ProtocolError as exc:
                self._reply(ident, M.error("bad_message", str(exc)))
                continue
            # [obs] executor logs: client and reader keys only; the rest: workers, clients
            if keys is not None and role not in (("client", "reader") if msg.type == "log_read"
                                                 else ("worker", "client")):
                self._reply(ident, M.error("forbidden", f"{msg.type!r} is not allowed for "
                                                        f"this key"))
                continue
            try:
                self._handle(ident, msg)
            except (CheckpointError, TransferError, StagingError, StoreError, BadName,
                    OSError) as exc:     # StoreError: e.g. a damaged checkpoint part
                log.warning("data service: %s failed: %s", msg.type, exc)
                if msg.type == "blk_end":
                    self._reply(ident, M.encode("blk_done", mid=msg["mid"], ok=False,
                                                error=str(exc)))
                else:
                    self._reply(ident, M.error("data", str(exc)))
            except Exception as exc:   # never let one request kill the service
                log.exception("data service: %s failed", msg.type)
                self._reply(ident, M.error("internal", f"{exc.__class__.__name__}: {exc}"))

    def _expire(self) -> None:
        self._next_expiry = time.monotonic() + 1.0
        for mid in self.spool.expire():
            log.warning("data service: transfer %s sent nothing for %.0fs: dropped with "
                        "what it held", mid, self.spool.idle_s)

    def _reply(self, ident: bytes, payload: bytes) -> None:
        try:
            self.sock.send_multipart([ident, payload])
        except zmq.ZMQError as exc:
            log.warning("data service: reply dropped: %s", exc)

    def _part(self, job: str, epoch: int, index: int) -> CheckpointStore:
        path = jobckpt.part_dir(self.state_dir, job, epoch, index)
        if not os.path.exists(os.path.join(path, "data.mdb")):
            raise CheckpointError(f"no part {index} of job {job}'s checkpoint after epoch "
                                  f"{epoch} on this machine")
        return CheckpointStore.open(path, job, keep=1)

    def _handle(self, ident: bytes, msg: M.Message) -> None:
        if msg.type == "ckpt_manifest":
            store = self._part(msg["job"], msg["epoch"], msg["index"])
            try:
                info = store.latest()
                if info is None:
                    raise CheckpointError(f"part {msg['index']} of job {msg['job']} has no "
                                          f"complete version here")
                man = store.manifest(info.version)
            finally:
                store.close()
            self._reply(ident, M.encode(
                "manifest", entries=[[e[0], e[1], e[2], e[3]] for e in man["blocks"]],
                epoch=man["epoch"], iteration=man["iteration"], meta=man["meta"]))
        elif msg.type == "ckpt_fetch":
            want = {(str(s), int(b)) for s, b in msg["want"]}
            store = self._part(msg["job"], msg["epoch"], msg["index"])
            try:
                with store.stream(want=lambda s, b: (s, b) in want) as (_, blocks):
                    payloads = [Payload(sec, bid, source=src) for sec, bid, src in blocks]
                    self.served_bytes += send_payloads([self.sock], msg["mid"], payloads,
                                                       prefix=[ident])
            finally:
                store.close()
            self._reply(ident, M.encode("blk_end", mid=msg["mid"], count=len(payloads),
                                        meta={}))
        elif msg.type == "blk":
            mid = msg["mid"]
            try:
                done = self.spool.add(msg)
            except TransferError as exc:
                self.spool.drop(mid)
                return self._reply(ident, M.encode("blk_ack", mid=mid, sec=msg["sec"],
                                                   bid=msg["bid"], ok=False, error=str(exc)))
            if done is not None:
                _, sec, bid, size = done
                self.received_bytes += size
                self._reply(ident, M.encode("blk_ack", mid=mid, sec=sec, bid=bid, ok=True))
        elif msg.type == "data_fetch":
            with self.chunks.sources(msg["name"], list(msg["chunks"])) as chunks:
                payloads = [Payload("data", i, source=src) for i, src in chunks]
                self.served_bytes += send_payloads([self.sock], msg["mid"], payloads,
                                                   prefix=[ident])
            self._reply(ident, M.encode("blk_end", mid=msg["mid"], count=len(payloads),
                                        meta={}))
        elif msg.type == "blk_end":
            with self.spool.take(msg["mid"]) as got:    # its spool file goes on exit
                self._end(ident, msg, got)
        elif msg.type == "log_read":        # [obs] executor logs (harmony.obs.logs)
            self._reply(ident, M.encode("log_data", **obs_logs.read(
                self.state_dir, self.name, msg["job"], msg.get("offset") or 0,
                msg.get("attempt"), msg.get("max_bytes") or obs_logs.READ_MAX)))
        else:
            self._reply(ident, M.error("unexpected",
                                       f"the data service does not accept {msg.type!r}"))

    def _end(self, ident: bytes, msg: M.Message, got: Spooled) -> None:
        """A transfer's ``blk_end``: its blocks, read from the spool one at
        a time, stored where its meta says; ``blk_done`` with their digest."""
        mid, meta = msg["mid"], msg["meta"]
        if len(got) != msg["count"]:
            raise TransferError(f"transfer {mid}: {len(got)} of {msg['count']} blocks "
                                f"arrived")
        if meta.get("kind") == "stage":
            name = staging.check_name(str(meta["dataset"]))
            shas = []
            for s, i in sorted(got):
                src = Hashed(got.source((s, i)))
                self.chunks.put(name, i, src)
                shas.append((s, i, src.digest()))
            log.info("stored %d chunk(s) of data set %s", len(got), name)
            return self._reply(ident, M.encode("blk_done", mid=mid, ok=True,
                                               digest=jobckpt.entries_digest(shas)))
        job, epoch, index = str(meta["job"]), int(meta["epoch"]), int(meta["index"])
        path = jobckpt.part_dir(self.state_dir, job, epoch, index)
        _, digest = jobckpt.write_part(
            path, job, got.section("model"), got.section("input"), epoch=epoch,
            iteration=int(meta.get("iteration", 0)), meta={"replica": True},
            batch_bytes=REPLICA_BATCH_BYTES)
        log.info("replica of %s part %d (epoch %d) written: %d blocks", job, index, epoch,
                 len(got))
        self._reply(ident, M.encode("blk_done", mid=mid, ok=True, digest=digest))
