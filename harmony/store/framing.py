"""The frame of every value in an LMDB store, and the block codecs.

A stored value is its payload (for a block, ``export_block`` bytes) and a
trailer: magic, CRC-32 of the payload, length. :func:`frame_block` frames a
block in one pass into a reused buffer; :func:`decode_block` copies a block
out of the map while checking it, :func:`decode_view` makes read-only views
of it instead (zero-copy, see :class:`harmony.store.lmdb_env.ReadLease`).

* Every stored block carries a CRC-32 trailer, checked on every read; a bad
  or missing block raises :class:`BlockLoadError` naming the block. The CRC
  is zlib's CRC-32 computed by ISA-L (the ``isal`` package: carry-less
  multiply, 60-80 GB/s over data in L2 here, against 3-4 GB/s for
  ``zlib.crc32``; ``zlib.crc32`` gives the same value if ``isal`` is missing).
  Reads copy each array out of the map in chunks of ``_CHUNK`` bytes and run
  the CRC over each chunk right after copying it, while it is in cache, so
  memory is read once: the check costs a fraction of the one copy that any
  reader makes. :meth:`LmdbBlockStore.get_view` copies nothing: the arrays
  are read-only views of the data file through the env's own read-only
  mapping, valid while a :class:`ReadLease` (a read txn) is held; leases
  hold off map growth (py-lmdb aborts open txns when the map grows).
  Checkpoints use SHA-256 in their manifest instead.
"""
from __future__ import annotations

import math
import struct
import threading

import numpy as np

from harmony.store.blocks import _MAGIC, Block, BlockFormatError, pack_header, parse_header

try:    # the same CRC-32 as zlib's, 20x faster (hardware carry-less multiply)
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - isal is a dependency; same values
    from zlib import crc32

_TRAILER = struct.Struct("<4sIQ")  # magic, crc32(payload), len(payload)
_TMAGIC = b"HSC1"
_CHUNK = 512 << 10                # copy + CRC granularity: the chunk stays in L2


def frame(payload: bytes | memoryview) -> bytes:
    """``payload`` + trailer (magic, CRC-32, length)."""
    return b"".join([payload, _TRAILER.pack(_TMAGIC, crc32(payload), len(payload))])


def _copy_crc(dst: np.ndarray, src: np.ndarray, crc: int | None) -> int | None:
    """``dst[:] = src`` (flat uint8 arrays of one length), continuing ``crc``
    over each chunk of ``dst`` right after copying it, while it is in cache
    (``None``: no CRC)."""
    n = len(src)
    for o in range(0, n, _CHUNK):
        d = dst[o:o + _CHUNK]
        d[:] = src[o:o + _CHUNK]
        if crc is not None:
            crc = crc32(d, crc)
    return crc


_scratch = threading.local()


def frame_block(block: Block) -> memoryview:
    """``frame(export_block(block))`` in one pass, into a per-thread scratch
    buffer that is reused (no fresh allocation, hence no page faults, per
    block; the CRC runs over each chunk just written, still in cache). The view is
    valid until the same thread frames the next block: hand it to ``txn.put``
    (which copies) at once. Byte-identical to ``frame(export_block(block))``
    (a test checks it); ``export_block_into`` in blocks.py would be its home."""
    arrays = []
    meta = []
    for name, arr in block.arrays.items():
        arr = np.ascontiguousarray(arr)          # as export_block (0-d becomes 1-d)
        arrays.append(arr)
        meta.append([name, arr.dtype.str, list(arr.shape), arr.nbytes])
    head = pack_header(block.id, meta)
    n = 8 + len(head) + sum(a.nbytes for a in arrays)
    buf = getattr(_scratch, "buf", None)
    if buf is None or len(buf) < n + _TRAILER.size:
        buf = _scratch.buf = bytearray(max(n + _TRAILER.size, 2 * len(buf or b"")))
    mv = memoryview(buf)
    mv[0:4] = _MAGIC
    struct.pack_into("<I", buf, 4, len(head))
    mv[8:8 + len(head)] = head
    off = 8 + len(head)
    crc = crc32(mv[:off])
    for arr in arrays:
        if arr.nbytes:
            crc = _copy_crc(np.frombuffer(buf, np.uint8, arr.nbytes, off),
                            arr.reshape(-1).view(np.uint8), crc)
            off += arr.nbytes
    _TRAILER.pack_into(buf, n, _TMAGIC, crc, n)
    return mv[:n + _TRAILER.size]


def release_scratch() -> None:
    """Free this thread's :func:`frame_block` buffer (it is as large as the
    largest block framed so far, up to twice that). Call it after a burst of
    writes where memory is short, e.g. after spilling blocks."""
    _scratch.buf = None


def _split_trailer(value: bytes | memoryview) -> tuple[memoryview, int]:
    """(payload, stored CRC) of a framed value; ``ValueError`` if damaged."""
    mv = memoryview(value)
    if len(mv) < _TRAILER.size:
        raise ValueError(f"truncated value ({len(mv)} bytes)")
    magic, crc, n = _TRAILER.unpack(mv[len(mv) - _TRAILER.size:])
    if magic != _TMAGIC:
        raise ValueError("bad trailer (truncated or overwritten value)")
    if n != len(mv) - _TRAILER.size:
        raise ValueError(f"length mismatch: trailer says {n} bytes, "
                         f"value holds {len(mv) - _TRAILER.size}")
    return mv[:n], crc


def _arrays(payload: memoryview, meta: list, off: int, make) -> dict[str, np.ndarray]:
    """Walk a block's arrays from ``off``: check each against the payload
    and its shape and dtype, build it with ``make(dtype, shape, off,
    nbytes)``; a damaged header becomes a ``BlockFormatError``."""
    arrays = {}
    try:
        for name, dtype, shape, nbytes in meta:
            if off + nbytes > len(payload):
                raise BlockFormatError(f"truncated block data for array {name!r}")
            dt = np.dtype(dtype)
            count = math.prod(shape)
            if count * dt.itemsize != nbytes:
                raise BlockFormatError(f"array {name!r}: {nbytes} bytes stored, "
                                       f"{count * dt.itemsize} for its shape and dtype")
            arrays[name] = make(dt, shape, off, nbytes)
            off += nbytes
    except BlockFormatError:
        raise
    except Exception as exc:         # e.g. a damaged dtype or shape in the header
        raise BlockFormatError(f"corrupt block header: {exc.__class__.__name__}: {exc}") from None
    if off != len(payload):
        raise BlockFormatError("trailing bytes after block data")
    return arrays


def decode_block(value: bytes | memoryview, verify: bool = True, pool=None) -> Block:
    """Check the trailer of a stored block and import it: each array is
    copied out of the map (the one copy) in chunks, and the CRC runs over
    each chunk right after it is copied, while it is in cache, so the map is
    read once and the check costs a CRC of cache-hot data. With ``pool`` (an
    :class:`~harmony.store.recycle.ArrayPool`), arrays of dropped blocks of
    the same dtype and shape are copied into instead of new ones. Raises
    ``ValueError``/``BlockFormatError`` with the reason if damaged."""
    payload, stored = _split_trailer(value)
    bid, meta, off = parse_header(payload)
    crc = crc32(payload[:off]) if verify else None
    src = np.frombuffer(payload, np.uint8)

    def make(dt, shape, at, nbytes):
        nonlocal crc
        arr = pool.take(dt, shape) if pool is not None and nbytes else None
        if arr is None:
            arr = np.empty(shape, dtype=dt)
        if nbytes:
            crc = _copy_crc(arr.reshape(-1).view(np.uint8), src[at:at + nbytes], crc)
        return arr
    arrays = _arrays(payload, meta, off, make)
    if crc is not None and crc != stored:
        raise ValueError("checksum mismatch (CRC-32): corrupt data")
    return Block(bid, arrays)


def unframe(value: bytes | memoryview) -> memoryview:
    """Check the trailer of a stored value; return the payload (a view).
    Raises ``ValueError`` with the reason if the value is damaged."""
    payload, stored = _split_trailer(value)
    if crc32(payload) != stored:
        raise ValueError("checksum mismatch (CRC-32): corrupt data")
    return payload


def decode_view(payload_and_trailer: memoryview, verify: bool = True,
                keep: list | None = None) -> Block:
    """Check a stored block and import it **without copying**: each array is
    a read-only view of ``payload_and_trailer`` (the caller keeps what it
    views valid). The CRC runs over the whole payload, so with ``verify``
    every page is read (and faulted in) here, not in the app. An array that
    is not aligned for its dtype (not expected: ``pack_header`` aligns the
    first one) is copied, read-only too. The views are appended to
    ``keep``. Raises ``ValueError``/``BlockFormatError`` if damaged."""
    payload, stored = _split_trailer(payload_and_trailer)
    bid, meta, off = parse_header(payload)
    addr = np.frombuffer(payload, np.uint8).ctypes.data if len(payload) else 0

    def make(dt, shape, at, nbytes):
        if not nbytes:
            arr = np.empty(shape, dt)
        else:
            # one array over the buffer (no reshape on top): views the app
            # takes then have this array as their base, which is what
            # ReadLease.in_use counts
            arr = np.ndarray(shape, dt, buffer=payload, offset=at)
            if (addr + at) % dt.alignment:
                arr = arr.copy()
            elif keep is not None:
                keep.append(arr)
        arr.flags.writeable = False
        return arr
    arrays = _arrays(payload, meta, off, make)
    if verify and crc32(payload) != stored:
        raise ValueError("checksum mismatch (CRC-32): corrupt data")
    return Block(bid, arrays)
