"""Arrays of dropped disk-blocks, reused by the next loads (issue #34 item 5).

A reload copies each disk-block out of LMDB into new arrays. Fresh arrays
cost page faults and land in memory that is not in cache, while the block
just dropped had arrays of the same shapes: a CRC-checked warm reload that
copies into those ran at 0.47-0.53 of a raw scan against 0.42 into fresh
ones, with 10-19% less CPU (bench/store_reload.py, README "Block store").

The hazard is reusing an array someone still reads. An array is reused only
when nothing but this pool refers to it (``sys.getrefcount``): every view,
slice, memoryview, buffer or tensor made from an array holds a reference to
it, and so does a variable still bound to it. An app's loop variables are
often still bound to the block it just left when the pipeline drops it, so a
given array waits (``held``) and is checked again at later calls. The arrays
taken are removed from their block, so code that kept a dropped block, which
the pipeline's contract forbids, gets a ``KeyError`` and never another
block's data. Only arrays that own their memory, are writable and C-ordered
are taken; others are left in their block.
"""
from __future__ import annotations

import sys
import threading
from collections import deque

import numpy as np

#: arrays smaller than this are not worth a pool entry
MIN_BYTES = 64 << 10
#: how many dropped arrays wait for their last outside reference to go
MAX_HELD = 32
#: references an array just taken out of ``held`` has when only the pool
#: holds it: the local variable's and ``getrefcount``'s argument's
_ALONE = 2


class ArrayPool:
    """Free arrays by (dtype, shape), from dropped blocks, for later loads.

    Holds at most ``max_bytes`` of free arrays, and ``per_shape`` of one
    shape: a reload pass holds at most its depth (2) plus the consumer's
    block at once, so 3 blocks' arrays carry a pass into the next; what does
    not fit is left to the garbage collector. Thread-safe:
    the reload thread takes, the consumer (or the reload thread after a
    write-back) gives.
    """

    def __init__(self, max_bytes: int = 256 << 20, per_shape: int = 3) -> None:
        self.max_bytes, self.per_shape = max_bytes, per_shape
        self._lock = threading.Lock()
        self._held: deque[np.ndarray] = deque()
        self._free: dict[tuple, list[np.ndarray]] = {}
        self.free_bytes = 0
        self.reused = 0        # arrays handed out again
        self.fresh = 0         # arrays asked for that the pool did not have

    def give(self, block) -> int:
        """Take the arrays of a dropped ``block`` that may back later loads
        (removed from the block); returns how many were taken."""
        n = 0
        with self._lock:
            for name in list(block.arrays):
                a = block.arrays[name]
                if (a.base is None and a.flags.c_contiguous and a.flags.writeable
                        and a.nbytes >= MIN_BYTES):
                    del block.arrays[name]
                    self._held.append(a)
                    n += 1
            a = None
            while len(self._held) > MAX_HELD:
                self._held.popleft()
            self._sweep()
        return n

    def take(self, dtype: np.dtype, shape: tuple) -> np.ndarray | None:
        """A free array of this dtype and shape (its content is stale: the
        caller overwrites all of it), or None."""
        key = (np.dtype(dtype).str, tuple(int(s) for s in shape))
        with self._lock:
            self._sweep()
            free = self._free.get(key)
            if not free:
                self.fresh += 1
                return None
            a = free.pop()
            self.free_bytes -= a.nbytes
            self.reused += 1
            return a

    def clear(self) -> None:
        """Let every pooled array go (e.g. when memory is short)."""
        with self._lock:
            self._held.clear()
            self._free.clear()
            self.free_bytes = 0

    def _sweep(self) -> None:
        """Move held arrays nobody else refers to any more to the free lists
        (caller holds the lock)."""
        keep: deque[np.ndarray] = deque()
        while self._held:
            a = self._held.popleft()
            if sys.getrefcount(a) > _ALONE:
                keep.append(a)
                continue
            key = (a.dtype.str, a.shape)
            free = self._free.setdefault(key, [])
            if len(free) < self.per_shape and self.free_bytes + a.nbytes <= self.max_bytes:
                free.append(a)
                self.free_bytes += a.nbytes
        self._held = keep
