"""Values of any size in LMDB, written and read a piece at a time.

LMDB keeps a value as one run of pages: to put one, the whole value is
handed to ``txn.put`` and copied into as many dirty pages (``writemap``
off: malloc'd memory) until the transaction commits; to read one back
whole, it is mapped or copied whole. A block of a checkpoint part or a
staged chunk may be hundreds of MiB, and a key holder decides how large,
so a worker's data service that wrote or read such a block whole would
grow by it (twice, at a replica's end: the read and LMDB's copy).

Here a value is stored as *pieces* of at most ``PIECE_BYTES``, each under
its own key (the value's key and the piece's index), and the commit point
(a checkpoint's manifest, a staged chunk's record) is written after them:

* :class:`PieceWriter` puts pieces in transactions of at most
  ``batch_bytes`` (and one piece); each piece is read from its
  :class:`Source` inside the transaction, so what is held is that batch's
  dirty pages and one piece. After a commit the source may *release* what
  was stored (the spool punches its range out of its file: a replica takes
  its size on disk once, not twice).
* :class:`Hashed` takes a value's SHA-256 as its pieces are first read,
  and, given the digest it must have, refuses its last piece when it does
  not match (a damaged copy is never handed on whole).
* :class:`FileRanges` reads a stored value, whole or pieces, range by range
  with ``preadv`` from the data file (:meth:`~harmony.store.lmdb_env.LmdbEnv.pread_into`)
  while a read transaction holds its pages: a value streamed to another
  machine costs one chunk of memory, and the page cache, not pages mapped
  into the process.
"""
from __future__ import annotations

import hashlib
import struct
from typing import Callable, Protocol

from harmony.store.lmdb_env import LmdbEnv, MiB

#: the largest piece of a stored value
PIECE_BYTES = 4 * MiB
_P = struct.Struct(">Q")


class Source(Protocol):
    """A value's bytes, read a range at a time."""
    size: int

    def read(self, off: int, n: int) -> bytes | bytearray | memoryview: ...

    def release(self, off: int, n: int) -> None:
        """``[off, off + n)`` is stored for good: its bytes may go."""


class BytesSource:
    """Bytes already in memory (no copy: ranges are views)."""

    def __init__(self, data: bytes | bytearray | memoryview) -> None:
        self.mv = memoryview(data).cast("B")
        self.size = len(self.mv)

    def read(self, off: int, n: int) -> memoryview:
        return self.mv[off:off + n]

    def release(self, off: int, n: int) -> None:
        pass


def as_source(value) -> Source:
    """A :class:`Source` as it is, bytes-like values wrapped."""
    return value if hasattr(value, "read") and hasattr(value, "size") else BytesSource(value)


class Hashed:
    """A source whose SHA-256 is taken as its bytes are first read, in
    order (a range read again, as a transaction retried after its map grew
    reads it, is not hashed twice). With ``expect``, reading its last byte
    raises ``error(message)`` unless the digest matches."""

    def __init__(self, src: Source, expect: bytes | None = None,
                 error: Callable[[str], Exception] | None = None, what: str = "value") -> None:
        self.src, self.size = src, src.size
        self.expect, self.error, self.what = expect, error or ValueError, what
        self._h = hashlib.sha256()
        self._upto = 0
        self._digest: bytes | None = None
        if self.size == 0:
            self._finish()

    def _finish(self) -> None:
        self._digest = self._h.digest()
        if self.expect is not None and self._digest != self.expect:
            raise self.error(f"{self.what} checksum mismatch (corrupt data)")

    def read(self, off: int, n: int):
        data = self.src.read(off, n)
        if len(data) != n:
            raise self.error(f"{self.what}: {len(data)} bytes where {n} were asked for at {off}")
        if off > self._upto:
            raise ValueError(f"{self.what}: read at {off} skips bytes from {self._upto}")
        if off + n > self._upto:
            self._h.update(memoryview(data)[self._upto - off:])
            self._upto = off + n
            if self._upto == self.size:
                self._finish()
        return data

    def release(self, off: int, n: int) -> None:
        self.src.release(off, n)
        if off + n == self.size and self._digest is not None:
            self.src = None         # all of it stored: what it read from may go

    def digest(self) -> bytes:
        if self._digest is None:
            raise ValueError(f"{self.what}: digest asked for before all of it was read")
        return self._digest


def piece_key(prefix: bytes, i: int) -> bytes:
    return prefix + _P.pack(i)


def piece_count(size: int, piece_bytes: int) -> int:
    return -(-size // piece_bytes)


class PieceWriter:
    """Puts values as pieces into one db of ``env``, in transactions of at
    most ``batch_bytes`` and one piece; each piece is read from its source
    inside its transaction (and read again if LMDB retries it), and
    released once it is committed."""

    def __init__(self, env: LmdbEnv, db, batch_bytes: int, piece_bytes: int = PIECE_BYTES
                 ) -> None:
        self.env, self.db = env, db
        self.batch_bytes, self.piece_bytes = batch_bytes, piece_bytes
        self._pending: list[tuple[bytes, Source, int, int]] = []
        self._size = 0
        self.written = 0

    def put(self, prefix: bytes, src: Source) -> int:
        """Queue value ``src`` as pieces under ``prefix``; returns their count."""
        count = piece_count(src.size, self.piece_bytes)
        for i in range(count):
            off = i * self.piece_bytes
            n = min(self.piece_bytes, src.size - off)
            self._pending.append((piece_key(prefix, i), src, off, n))
            self._size += n
            if self._size >= self.batch_bytes:
                self.flush()
        return count

    def put_small(self, key: bytes, value: bytes) -> None:
        """Queue one small value under ``key`` itself."""
        src = BytesSource(value)
        self._pending.append((key, src, 0, src.size))
        self._size += src.size

    def flush(self) -> None:
        if not self._pending:
            return
        items, db = self._pending, self.db

        def fn(txn):
            for key, src, off, n in items:
                txn.put(key, src.read(off, n), db=db)
        self.env.write(fn, self._size + 4096)
        self.written += self._size
        self._pending, self._size = [], 0
        for _, src, off, n in items:
            src.release(off, n)


class FileRanges:
    """The bytes of a stored value as ranges of the env's data file
    (``extents``: ``(offset, length)`` pairs, in order), read with
    ``preadv``. Valid while the read transaction they came from lives."""

    def __init__(self, env: LmdbEnv, extents: list[tuple[int, int]]) -> None:
        self.env, self.extents = env, extents
        self.size = sum(n for _, n in extents)

    def read(self, off: int, n: int) -> bytearray:
        out = bytearray(n)
        mv = memoryview(out)
        pos = done = 0
        for start, length in self.extents:
            if done == n:
                break
            lo = max(off + done, pos)
            if lo < pos + length:
                k = min(pos + length - lo, n - done)
                self.env.pread_into(start + lo - pos, mv[done:done + k])
                done += k
            pos += length
        if done != n:
            raise ValueError(f"read of {n} bytes at {off} past the value's {self.size}")
        return out

    def readinto_all(self, buf: memoryview) -> None:
        """The whole value into ``buf`` (its size)."""
        pos = 0
        for start, length in self.extents:
            self.env.pread_into(start, buf[pos:pos + length])
            pos += length

    def release(self, off: int, n: int) -> None:
        pass
