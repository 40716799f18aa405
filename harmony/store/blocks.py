"""In-memory block store with the interface spill/reload and migration extend.

A block is a named set of numpy arrays (e.g. one hash range of users with
their ratings and local factors). Blocks have integer ids unique within a job
and can be exported as one self-describing byte string and imported back
(used by migration and, later, by the LMDB spill path).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Iterator

import msgpack
import numpy as np

_MAGIC = b"HBK1"
#: where a block's bytes start inside an LMDB overflow page (its page header)
_LMDB_VALUE_OFFSET = 16
#: the first array's bytes start at a multiple of this inside an LMDB page,
#: so the zero-copy read path can use them in place (numpy's BLAS paths want
#: aligned arrays)
ARRAY_ALIGN = 64


class BlockFormatError(ValueError):
    pass


@dataclass
class Block:
    id: int
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    #: a zero-copy load's :class:`~harmony.store.lmdb_env.ReadLease` (its
    #: read-only arrays are views of the stored bytes), else None
    lease: object = field(default=None, repr=False, compare=False)

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]

    def __setitem__(self, name: str, value: np.ndarray) -> None:
        self.arrays[name] = value

    @property
    def nbytes(self) -> int:
        return int(sum(a.nbytes for a in self.arrays.values()))


def pack_header(block_id: int, meta: list) -> bytes:
    """The msgpack header of an exported block, padded (a ``pad`` entry that
    readers ignore) so that the first array starts ``ARRAY_ALIGN``-aligned
    when the block is a large LMDB value (which starts 16 bytes into a page)."""
    head = {"id": int(block_id), "arrays": meta, "pad": b""}
    n = len(msgpack.packb(head, use_bin_type=True))
    head["pad"] = bytes(-(_LMDB_VALUE_OFFSET + 8 + n) % ARRAY_ALIGN)
    return msgpack.packb(head, use_bin_type=True)


def export_block(block: Block) -> bytes:
    """Serialize a block: magic, header length, msgpack header, raw buffers."""
    meta = []
    bufs = []
    for name, arr in block.arrays.items():
        arr = np.ascontiguousarray(arr)
        meta.append([name, arr.dtype.str, list(arr.shape), arr.nbytes])
        bufs.append(arr.tobytes())
    head = pack_header(block.id, meta)
    return b"".join([_MAGIC, struct.pack("<I", len(head)), head, *bufs])


def parse_header(data: bytes | memoryview) -> tuple[int, list, int]:
    """(block id, array list ``[name, dtype, shape, nbytes]``, offset of the
    first array's bytes) of an exported block; ``BlockFormatError`` if the
    magic or the header is damaged."""
    mv = memoryview(data)
    if len(mv) < 8 or bytes(mv[:4]) != _MAGIC:
        raise BlockFormatError("not a Harmony block (bad magic)")
    (hlen,) = struct.unpack("<I", mv[4:8])
    if 8 + hlen > len(mv):
        raise BlockFormatError("truncated block header")
    try:
        head = msgpack.unpackb(bytes(mv[8:8 + hlen]), raw=False)
        meta = head["arrays"]
        bid = int(head["id"])
    except Exception as exc:
        raise BlockFormatError(f"corrupt block header: {exc}") from None
    return bid, meta, 8 + hlen


def import_block(data: bytes | bytearray | memoryview, copy: bool = True) -> Block:
    """A block from its exported bytes; ``copy=False``: its arrays are views
    of ``data`` (a ``bytearray`` the caller hands over: writable arrays)."""
    mv = memoryview(data)
    bid, meta, off = parse_header(mv)
    arrays = {}
    for name, dtype, shape, nbytes in meta:
        if off + nbytes > len(mv):
            raise BlockFormatError(f"truncated block data for array {name!r}")
        arr = np.frombuffer(mv[off:off + nbytes], dtype=np.dtype(dtype)).reshape(shape)
        arrays[name] = arr.copy() if copy else arr
        off += nbytes
    if off != len(mv):
        raise BlockFormatError("trailing bytes after block data")
    return Block(bid, arrays)


class BlockStore:
    """Blocks of one job on one machine, held in memory."""

    def __init__(self) -> None:
        self._blocks: dict[int, Block] = {}

    def put(self, block: Block) -> None:
        self._blocks[block.id] = block

    def get(self, block_id: int) -> Block:
        try:
            return self._blocks[block_id]
        except KeyError:
            raise KeyError(f"block {block_id} is not in this store") from None

    def remove(self, block_id: int) -> Block:
        return self._blocks.pop(block_id)

    def ids(self) -> list[int]:
        return sorted(self._blocks)

    def size(self, block_id: int) -> int:
        return self.get(block_id).nbytes

    def total_bytes(self) -> int:
        return sum(b.nbytes for b in self._blocks.values())

    def export(self, block_id: int) -> bytes:
        return export_block(self.get(block_id))

    def import_(self, data: bytes | memoryview) -> int:
        blk = import_block(data)
        self.put(blk)
        return blk.id

    def __len__(self) -> int:
        return len(self._blocks)

    def __iter__(self) -> Iterator[Block]:
        for bid in self.ids():
            yield self._blocks[bid]
