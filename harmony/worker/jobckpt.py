"""Checkpoints of a whole job, shared-nothing: written where they are made,
replicated to a second machine over ZeroMQ, fetched over ZeroMQ on resume.

At a checkpoint (a pause, or the periodic checkpoint every N epochs/seconds)
every executor of the job writes one *part* at the same epoch boundary
(after the epoch's last PUSH and its evaluation): its server shard's model
rows, grouped by model block, and its input blocks, which carry the app's
mutable per-record state (NMF's user factors, LDA's topic assignments).

* The part's content is taken at the boundary; a periodic part is then
  written and replicated behind the job, which trains on
  (:mod:`harmony.worker.executor.checkpoints`), a pause's part in line.
* The part is a :class:`CheckpointStore` (SHA-256 manifest) on the
  executor's own machine, ``WORKER_STATE/ckpt/JOB/e<epoch>-p<index>``.
* The same exported blocks are streamed to one other machine's data service
  (:mod:`harmony.worker.dataservice`), which writes an identical part there
  and answers with the digest of its manifest; the executor compares it
  with its own. Only then does it report the part to the master, and the
  master counts a checkpoint complete only when every part and its replica
  are acknowledged. A half-written checkpoint is never used.
* A resumed attempt (after a pause, a lost machine or a master restart) may
  run on other machines and on a different number of them: input block
  ``b`` goes to executor ``b % count``, model block ``b`` to its new owner.
  Each executor asks the holders of every old part (its own machine's data
  service first, then the replica) for the manifest, then for just the
  blocks it now owns, and checks every block's SHA-256 against the manifest.
  A holder that is gone or holds a damaged copy is skipped for the next one.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from typing import Callable, Iterable, Mapping

import numpy as np
import zmq

from harmony.comm import messages as M
from harmony.comm.zmqutil import make_socket, send
from harmony.ps.keymap import block_of
from harmony.store.blocks import Block, BlockFormatError, export_block, import_block
from harmony.store.checkpoint import CheckpointError, CheckpointStore
from harmony.store.pieces import Source
from harmony.store.transfer import Payload, TransferError, receive, send_payloads, wait_acks
from harmony.util import names

FETCH_TIMEOUT_S = 120.0


def ckpt_root(state_dir: str, job: str) -> str:
    """``STATE/ckpt/JOB``; a job id that is not a plain name (``..``, a
    path) raises :class:`~harmony.util.names.BadName`."""
    return names.under(os.path.join(state_dir, "ckpt"), job, what="job id")


def part_dir(state_dir: str, job: str, epoch: int, index: int) -> str:
    if int(epoch) < 0 or int(index) < 0:
        raise names.BadName(f"checkpoint part e{epoch}-p{index}: negative epoch or index")
    return os.path.join(ckpt_root(state_dir, job), f"e{int(epoch)}-p{int(index)}")


def parse_part_dir(name: str) -> tuple[int, int] | None:
    """``e<epoch>-p<index>`` -> (epoch, index)."""
    try:
        e, p = name.split("-")
        if e[0] == "e" and p[0] == "p":
            return int(e[1:]), int(p[1:])
    except (ValueError, IndexError):
        pass
    return None


def gc(state_dir: str, job: str, keep: int | None) -> list[str]:
    """Delete this machine's parts of ``job`` older than epoch ``keep`` (all
    of them with ``keep=None``). Newer ones may be a checkpoint in progress."""
    root = ckpt_root(state_dir, job)
    if keep is None:
        shutil.rmtree(root, ignore_errors=True)
        return [root]
    gone = []
    try:
        entries = os.listdir(root)
    except FileNotFoundError:
        return gone
    for name in entries:
        ep = parse_part_dir(name)
        if ep is not None and ep[0] < keep:
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
            gone.append(name)
    return gone


def model_blocks_of(keys: np.ndarray, rows: np.ndarray, num_blocks: int) -> dict[int, Block]:
    """A shard's rows, one Block per model block (keys + rows)."""
    bids = block_of(keys, num_blocks)
    order = np.argsort(bids, kind="stable")
    bids, keys, rows = bids[order], keys[order], rows[order]
    cuts = np.flatnonzero(np.diff(bids)) + 1
    out = {}
    for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, len(bids)]):
        if hi > lo:
            b = int(bids[lo])
            out[b] = Block(b, {"keys": keys[lo:hi].copy(), "rows": rows[lo:hi].copy()})
    return out


def export_part(keys: np.ndarray, rows: np.ndarray, num_blocks: int,
                inputs: Iterable[Block]) -> list[Payload]:
    """A part's blocks as exported payloads (what is written and sent)."""
    out = [Payload("model", b, export_block(blk))
           for b, blk in model_blocks_of(keys, rows, num_blocks).items()]
    out += [Payload("input", blk.id, export_block(blk)) for blk in inputs]
    return out


def entries_digest(entries: Iterable[tuple[str, int, bytes]]) -> bytes:
    """One digest of a part's content: its blocks' (section, id, SHA-256)."""
    h = hashlib.sha256()
    for sec, bid, sha in sorted((str(s), int(b), bytes(d)) for s, b, d in entries):
        h.update(f"{sec}:{bid}:".encode() + sha)
    return h.digest()


def write_payloads(path: str, job: str, payloads: list[Payload], *, epoch: int,
                   iteration: int, meta: dict | None = None) -> tuple[int, bytes]:
    """Write a part from exported payloads; returns (version, digest)."""
    return write_part(path, job, {p.bid: p.data for p in payloads if p.sec == "model"},
                      {p.bid: p.data for p in payloads if p.sec == "input"}, epoch=epoch,
                      iteration=iteration, meta=meta)


def write_part(path: str, job: str, model: Mapping[int, "bytes | Source"],
               inputs: Mapping[int, "bytes | Source"],
               *, epoch: int, iteration: int, meta: dict | None = None,
               batch_bytes: int = 64 << 20) -> tuple[int, bytes]:
    """Write a part from exported blocks, ``bid -> bytes`` (or a
    :class:`~harmony.store.pieces.Source`, as a replica's spool file gives)
    per section; returns (version, digest). A block is stored as pieces,
    read from its source one at a time when it is written, and at most
    ``batch_bytes`` and one piece are held until their transaction commits,
    whatever the block's size."""
    store = CheckpointStore.open(path, job, keep=1, chunk_bytes=batch_bytes)
    try:
        info = store.write(model, input_blocks=inputs, epoch=epoch, iteration=iteration,
                           meta=dict(meta or {}), exported=True)
        man = store.manifest(info.version)
    finally:
        store.close()
    return info.version, entries_digest((e[0], e[1], e[3]) for e in man["blocks"])


def replicate(ctx: zmq.Context, endpoint: str, job: str, index: int, epoch: int,
              iteration: int, payloads: list[Payload], want_digest: bytes,
              throttle: Callable[[int, int], object] | None = None,
              timeout_s: float = FETCH_TIMEOUT_S) -> int:
    """Stream a part to another machine's data service, which writes it;
    check that its manifest matches ours. Returns the bytes sent."""
    mid = f"rep:{job}:{epoch}:{index}:{uuid.uuid4().hex[:8]}"
    sock = make_socket(ctx, zmq.DEALER, timeout_s=timeout_s)
    try:
        sock.connect(endpoint)
        for p in payloads:
            p.dest = 0
        sent = send_payloads([sock], mid, payloads, throttle=throttle)
        wait_acks(lambda d: sock, {(0, p.sec, p.bid) for p in payloads}, mid, timeout_s)
        send(sock, M.encode("blk_end", mid=mid, count=len(payloads), meta={
            "job": job, "index": index, "epoch": epoch, "iteration": iteration}),
             "holder", endpoint)
        if not sock.poll(int(timeout_s * 1000)):
            raise TransferError(f"replica of part {index} at {endpoint}: no answer")
        msg = M.decode(sock.recv_multipart())
        if msg.type != "blk_done" or not msg["ok"]:
            raise TransferError(f"replica of part {index} at {endpoint} failed: "
                                f"{msg.get('error') or msg.get('message') or msg.type}")
        if bytes(msg["digest"]) != want_digest:
            raise TransferError(f"replica of part {index} at {endpoint} differs from the "
                                f"part written here (manifest digest mismatch)")
        return sent
    finally:
        sock.close(linger=0)


def fetch_part(ctx: zmq.Context, endpoint: str, job: str, epoch: int, index: int,
               want: Callable[[str, int], bool],
               timeout_s: float = FETCH_TIMEOUT_S,
               keys=None) -> tuple[dict, dict[tuple[str, int], Block]]:
    """From one holder's data service: the manifest of part ``index`` of the
    checkpoint after ``epoch``, and the blocks ``want(sec, bid)`` selects,
    each checked against the manifest's SHA-256. ``keys``: CurveZMQ keys
    (default: the process's)."""
    sock = make_socket(ctx, zmq.DEALER, keys=keys, timeout_s=timeout_s)
    try:
        sock.connect(endpoint)

        def ask(payload: bytes) -> M.Message:
            send(sock, payload, "holder", endpoint)
            if not sock.poll(int(timeout_s * 1000)):
                raise TransferError(f"holder {endpoint} does not answer")
            msg = M.decode(sock.recv_multipart(copy=False))
            if msg.type == "error":
                raise CheckpointError(f"holder {endpoint}: {msg['message']}")
            return msg
        man = ask(M.encode("ckpt_manifest", job=job, epoch=epoch, index=index))
        shas = {(e[0], int(e[1])): bytes(e[3]) for e in man["entries"]}
        chosen = [[s, b] for (s, b) in shas if want(s, b)]
        mid = f"get:{job}:{epoch}:{index}:{uuid.uuid4().hex[:8]}"
        send(sock, M.encode("ckpt_fetch", mid=mid, job=job, epoch=epoch, index=index,
                            want=chosen), "holder", endpoint)
        got: dict[tuple[str, int], Block] = {}
        for sec, bid, data in receive(sock, timeout_s, f"holder {endpoint} (part {index})",
                                      CheckpointError):
            if hashlib.sha256(data).digest() != shas.get((sec, bid)):
                raise CheckpointError(f"part {index} {sec} block {bid} from {endpoint} does "
                                      f"not match its manifest")
            try:
                blk = import_block(data)
            except BlockFormatError as exc:
                raise CheckpointError(f"part {index} {sec} block {bid}: {exc}") from None
            got[(sec, bid)] = blk
        if len(got) != len(chosen):
            raise CheckpointError(f"holder {endpoint} sent {len(got)} of {len(chosen)} "
                                  f"blocks of part {index}")
        return {"epoch": man["epoch"], "iteration": man["iteration"], "meta": man["meta"]}, got
    finally:
        sock.close(linger=0)


class Restored:
    """What a resumed executor takes from the parts of a checkpoint."""

    def __init__(self, ctx: zmq.Context, job: str, resume: dict, me: str = "") -> None:
        """``resume`` is the master's record for this launch: ``epoch`` (the
        first epoch to run) and ``parts``, each ``{"index", "epoch",
        "sources": [[machine, data endpoint], ...]}``; ``me`` is this
        machine's name (its own copy is read first)."""
        self.ctx, self.job = ctx, job
        self.epoch = int(resume["epoch"])
        self.parts = list(resume["parts"])
        self.me = me
        self.fetched_bytes = 0

    def _fetch(self, part: dict, want) -> dict[tuple[str, int], Block]:
        sources = sorted(part["sources"], key=lambda s: s[0] != self.me)
        errors = []
        for machine, endpoint in sources:
            try:
                info, blocks = fetch_part(self.ctx, endpoint, self.job, int(part["epoch"]),
                                          int(part["index"]), want)
            except (CheckpointError, TransferError, M.ProtocolError, zmq.ZMQError) as exc:
                errors.append(f"{machine}: {exc}")
                continue
            if info["epoch"] + 1 != self.epoch:
                errors.append(f"{machine}: part of epoch {info['epoch']}, expected "
                              f"{self.epoch - 1}")
                continue
            return blocks
        raise CheckpointError(f"checkpoint part {part['index']} of job {self.job} (after epoch "
                              f"{self.epoch - 1}) could not be read from any holder: "
                              + ("; ".join(errors) or "no holder alive"))

    def load(self, index: int, count: int, model_owner: np.ndarray) -> None:
        """From every part, fetch (and verify) only the input blocks executor
        ``index`` of ``count`` owns and the model blocks ``model_owner``
        gives it."""
        self.inputs: dict[int, Block] = {}
        model: dict[int, Block] = {}

        def want(section: str, bid: int) -> bool:
            if section == "input":
                return bid % count == index
            return 0 <= bid < len(model_owner) and model_owner[bid] == index
        for part in self.parts:
            for (sec, bid), blk in self._fetch(part, want).items():
                self.fetched_bytes += blk.nbytes
                (self.inputs if sec == "input" else model)[bid] = blk
        keys = [b["keys"] for b in model.values()]
        self.keys = np.concatenate(keys) if keys else np.zeros(0, np.int64)
        self.rows = (np.concatenate([b["rows"] for b in model.values()]) if keys else None)

    def model_rows(self, mine: np.ndarray, dim: int, dtype: str) -> np.ndarray:
        """Rows for this shard's keys ``mine`` (sorted), from the parts."""
        if len(mine) != len(self.keys):
            raise CheckpointError(f"checkpoint of job {self.job} holds {len(self.keys)} model "
                                  f"rows for this shard, expected {len(mine)}")
        if not len(mine):
            return np.zeros((0, dim), dtype=dtype)
        order = np.argsort(self.keys, kind="stable")
        if not np.array_equal(self.keys[order], mine):
            raise CheckpointError(f"checkpoint of job {self.job}: model keys do not match "
                                  f"this shard's keys")
        return np.asarray(self.rows[order], dtype=dtype)
