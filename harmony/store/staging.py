"""Staged input: a file put into the cluster once, as line-aligned chunks
spread over the workers' LMDB stores with a replica each (``harmony data
put``), and read by jobs as ``--input harmony://NAME`` on any machine.

No shared file system: the client streams each chunk to its two holders'
data services over ZeroMQ; an executor that needs the file fetches every
chunk (from its own machine first, else the other holder), checks each
chunk's SHA-256 against the master's catalog, and reassembles the file on its
own machine's disk, where the app reads it as a local file. Lines keep their
numbers, so parse errors still name the file and the line.
"""
from __future__ import annotations

import hashlib
import logging
import os
import struct
import uuid
from contextlib import contextmanager
from typing import Iterator

import zmq

from harmony.comm import messages as M
from harmony.comm.zmqutil import NoHandshake, make_socket, send
from harmony.store import lmdbcheck
from harmony.store.datanames import URL, StagingError, check_name, refs  # noqa: F401
from harmony.store.errors import DamagedStoreError
from harmony.store.lmdb_env import LmdbEnv, MiB
from harmony.store.pieces import (PIECE_BYTES, FileRanges, PieceWriter, Source, as_source,
                                  piece_count, piece_key)
from harmony.store.transfer import Payload, TransferError, receive, send_payloads, wait_acks
from harmony.util import names

log = logging.getLogger("harmony.store.staging")

CHUNK_BYTES = 4 << 20
TIMEOUT_S = 120.0
#: a staged chunk is written in transactions of this many bytes (and one
#: piece): what its writer holds, whatever the chunk's size
WRITE_BATCH_BYTES = 16 * MiB
_REC = struct.Struct(">QQ")          # a chunk's record: its size, its piece size


def split_lines(path: str, chunk_bytes: int = CHUNK_BYTES) -> Iterator[tuple[int, int, bytes]]:
    """``(chunk index, first line number (1-based), bytes)``: chunks end at a
    line end (a line longer than ``chunk_bytes`` is a chunk of its own)."""
    line, i, data, eof = 1, 0, b"", False
    with open(path, "rb") as fh:
        while data or not eof:
            if not eof and len(data) < chunk_bytes:
                buf = fh.read(chunk_bytes)
                eof, data = not buf, data + buf
                continue
            cut = len(data)
            if not eof or len(data) > chunk_bytes:
                cut = data.rfind(b"\n", 0, chunk_bytes) + 1 or data.find(b"\n", chunk_bytes) + 1
                if not cut:
                    if not eof:             # a line longer than what is read yet
                        buf = fh.read(chunk_bytes)
                        eof, data = not buf, data + buf
                        continue
                    cut = len(data)
            yield i, line, data[:cut]
            line += data.count(b"\n", 0, cut)
            i += 1
            data = data[cut:]


class ChunkStore:
    """A worker's staged chunks, in one LMDB env on its own disk.

    A chunk is stored as pieces (:mod:`harmony.store.pieces`, db
    ``chunk_pieces``) and then its record (db ``chunk_index``: size and
    piece size), the commit point; chunks stored before pieces (db
    ``chunks``, one value each) are read as they are.

    A damaged env (its file fails :func:`harmony.store.lmdbcheck.check_lmdb_file`)
    is renamed ``staged.damaged`` (kept, never deleted) and the store starts
    empty, with an error logged: every chunk has a replica on another holder,
    which readers then use, and the machine keeps its other roles; refusing to
    start would take the whole machine (and the replicas it holds) away.
    ``damaged``: that error, or None.
    """

    def __init__(self, state_dir: str) -> None:
        path = os.path.join(state_dir, "staged")
        self.damaged: str | None = None
        try:
            self.env = LmdbEnv(path, job="staged", sync=True, map_size=1 << 30)
        except DamagedStoreError as exc:
            aside = lmdbcheck.set_aside(path)
            self.damaged = (f"staged data store: {exc}; moved it to {aside} and started "
                            f"with an empty store (its chunks are read from their other "
                            f"holders)")
            log.error("%s", self.damaged)
            self.env = LmdbEnv(path, job="staged", sync=True, map_size=1 << 30)
        self.db = self.env.db("chunks")              # before pieces: whole values
        self.index = self.env.db("chunk_index")
        self.pieces = self.env.db("chunk_pieces")

    @staticmethod
    def _key(name: str, i: int) -> bytes:
        return f"{name}\0{int(i):08d}".encode()

    @staticmethod
    def _drop_prefix(txn, db, prefix: bytes) -> int:
        n, cur = 0, txn.cursor(db=db)
        if cur.set_range(prefix):
            while cur.key().startswith(prefix):
                if not cur.delete():
                    break
                n += 1
        return n

    def put(self, name: str, i: int, data: bytes | Source,
            batch_bytes: int = WRITE_BATCH_BYTES) -> None:
        """Store chunk ``i`` (bytes, or a source read a piece at a time and
        released as its pieces are committed), replacing any before it."""
        key, src = self._key(name, i), as_source(data)

        def clear(txn):
            txn.delete(key, db=self.db)
            txn.delete(key, db=self.index)
            self._drop_prefix(txn, self.pieces, key + b"\0")
        self.env.write(clear, 0)
        w = PieceWriter(self.env, self.pieces, batch_bytes)
        w.put(key + b"\0", src)
        w.flush()
        rec = _REC.pack(src.size, PIECE_BYTES)
        self.env.write(lambda txn: txn.put(key, rec, db=self.index), len(rec))

    def _ranges(self, txn, name: str, i: int) -> list[tuple[int, int]]:
        key = self._key(name, i)
        rec = txn.get(key, db=self.index)
        if rec is None:
            data = txn.get(key, db=self.db)
            if data is None:
                raise StagingError(f"chunk {i} of data set {name!r} is not on this machine")
            return [self.env.extent(data)]
        size, piece = _REC.unpack(bytes(rec))
        out = []
        for p in range(piece_count(size, piece)):
            data = txn.get(piece_key(key + b"\0", p), db=self.pieces)
            if data is None or len(data) != min(piece, size - p * piece):
                raise StagingError(f"chunk {i} of data set {name!r}: piece {p} missing or "
                                   f"resized on this machine")
            out.append(self.env.extent(data))
        return out

    def get(self, name: str, i: int) -> bytes:
        """Chunk ``i``, whole."""
        def read(txn):
            src = FileRanges(self.env, self._ranges(txn, name, i))
            buf = bytearray(src.size)
            src.readinto_all(memoryview(buf))
            return bytes(buf)
        return self.env.read(read)

    @contextmanager
    def sources(self, name: str, chunks: list[int]) -> Iterator[list[tuple[int, FileRanges]]]:
        """Chunks of ``name`` as sources read range by range, valid inside
        the ``with`` (a read transaction holds their pages)."""
        lease = self.env.lease()
        try:
            yield [(int(i), FileRanges(self.env, self._ranges(lease.txn, name, int(i))))
                   for i in chunks]
        finally:
            lease.close()

    def remove(self, name: str) -> int:
        prefix = f"{name}\0".encode()

        def drop(txn):
            self._drop_prefix(txn, self.pieces, prefix)
            return self._drop_prefix(txn, self.db, prefix) + \
                self._drop_prefix(txn, self.index, prefix)
        return self.env.write(drop, 0)

    def close(self) -> None:
        self.env.close()


def push_chunks(ctx: zmq.Context, endpoint: str, name: str,
                chunks: list[tuple[int, bytes]], keys=None) -> None:
    """Send chunks of data set ``name`` to one holder's data service, which
    stores them and acknowledges each after checking its digest."""
    mid = f"stage:{name}:{uuid.uuid4().hex[:8]}"
    sock = make_socket(ctx, zmq.DEALER, keys=keys, timeout_s=TIMEOUT_S)
    try:
        sock.connect(endpoint)
        send_payloads([sock], mid, [Payload("data", i, d) for i, d in chunks])
        wait_acks(lambda d: sock, {(0, "data", i) for i, _ in chunks}, mid, TIMEOUT_S)
        send(sock, M.encode("blk_end", mid=mid, count=len(chunks),
                            meta={"kind": "stage", "dataset": name}), "holder", endpoint)
        if not sock.poll(int(TIMEOUT_S * 1000)):
            raise StagingError(f"holder {endpoint} did not confirm data set {name!r}")
        msg = M.decode(sock.recv_multipart())
        if msg.type != "blk_done" or not msg["ok"]:
            raise StagingError(f"holder {endpoint}: {msg.get('error') or msg.type}")
    except (TransferError, NoHandshake) as exc:
        raise StagingError(f"data set {name!r} to {endpoint}: {exc}") from None
    finally:
        sock.close(linger=0)


def fetch_chunks(ctx: zmq.Context, endpoint: str, name: str, want: dict[int, bytes],
                 timeout_s: float = TIMEOUT_S) -> dict[int, bytes]:
    """Chunks ``want`` (index -> SHA-256) of ``name`` from one holder,
    each checked against its digest."""
    mid = f"getdata:{name}:{uuid.uuid4().hex[:8]}"
    sock = make_socket(ctx, zmq.DEALER, timeout_s=timeout_s)
    try:
        sock.connect(endpoint)
        send(sock, M.encode("data_fetch", mid=mid, name=name, chunks=sorted(want)), "holder",
             endpoint)
        got = {}
        for _, i, data in receive(sock, timeout_s, f"holder {endpoint} (data set {name!r})",
                                  StagingError):
            if hashlib.sha256(data).digest() != want.get(i):
                raise StagingError(f"chunk {i} of data set {name!r} from {endpoint} does "
                                   f"not match the catalog")
            got[i] = data
        return got
    finally:
        sock.close(linger=0)


def materialize(ctx: zmq.Context, record: dict, state_dir: str, me: str = "") -> str:
    """This machine's copy of a staged data set as a local file (fetched
    once per machine and content; reused while the catalog entry is the
    same). Returns its path."""
    name = check_name(record["name"])
    digest = hashlib.sha256(b"".join(bytes(c["sha"]) for c in record["chunks"])).hexdigest()
    d = names.under(os.path.join(state_dir, "data"), name, digest[:16], what="data set name")
    fname = os.path.basename(str(record.get("filename") or name))
    path = os.path.join(d, fname if names.NAME_RE.fullmatch(fname) else name)
    if os.path.exists(path):
        return path
    os.makedirs(d, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as out:
            for c in record["chunks"]:
                errors = []
                for holder, endpoint in sorted(c["sources"], key=lambda s: s[0] != me):
                    try:
                        data = fetch_chunks(ctx, endpoint, name,
                                            {int(c["i"]): bytes(c["sha"])})[int(c["i"])]
                        break
                    except (StagingError, TransferError, M.ProtocolError, KeyError,
                            zmq.ZMQError) as exc:
                        errors.append(f"{holder}: {exc}")
                else:
                    raise StagingError(f"chunk {c['i']} of data set {name!r} could not be "
                                       f"read from any holder: "
                                       + ("; ".join(errors) or "no holder alive"))
                out.write(data)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path
