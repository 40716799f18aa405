"""Input pieces collected per block while a file is parsed, in bounded memory.

A reader sees a block's records scattered over the whole file (records are
hashed to blocks), so it keeps every piece until the file is read, and only
then assembles blocks. Without a bound that holds a machine's whole input,
plus the parse's temporaries, before the block store can spill any of it:
three jobs reading their input at once on a machine with a tight memory
budget were killed by the OOM guard while setting up, whatever their α.

:class:`PieceBuffer` keeps pieces in memory up to ``limit`` bytes; over it,
it appends the pieces of the blocks holding the most bytes to one scratch
file per block (``.npy`` records, in order) until it is under half the
limit, and :meth:`PieceBuffer.take` reads a block's pieces back in the order
they were added. Without a limit (``run_local``, tests) nothing is written.
The scratch directory is on this machine's disk and removed by
:meth:`PieceBuffer.close`.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Hashable

import numpy as np

from harmony.util.malloc import trim_heap


Piece = tuple[np.ndarray, ...]


class PieceBuffer:
    """Pieces (tuples of arrays) per key, within ``limit`` bytes of memory."""

    def __init__(self, limit: int | None = None, scratch_dir: str | None = None) -> None:
        self.limit = limit
        self._parent = scratch_dir
        self._dir: str | None = None
        self._mem: dict[Hashable, list[Piece]] = {}
        self._bytes: dict[Hashable, int] = {}
        self._files: dict[Hashable, str] = {}
        self.held = 0              # bytes of pieces in memory
        self.spilled = 0           # bytes written to scratch files, in all
        self.peak = 0

    def add(self, key: Hashable, *arrays: np.ndarray) -> None:
        """Keep a piece. Under a limit, a view is copied: a slice of a parsed
        chunk would otherwise keep the whole chunk alive after the slice was
        written out."""
        if self.limit is not None:
            arrays = tuple(a.copy() if a.base is not None else a for a in arrays)
        n = int(sum(a.nbytes for a in arrays))
        self._mem.setdefault(key, []).append(arrays)
        self._bytes[key] = self._bytes.get(key, 0) + n
        self.held += n
        self.peak = max(self.peak, self.held)
        if self.limit is not None and self.held > self.limit:
            self._spill()

    def keys(self) -> set[Hashable]:
        return set(self._mem) | set(self._files)

    def _spill(self) -> None:
        if self._dir is None:
            if self._parent:
                os.makedirs(self._parent, exist_ok=True)
            self._dir = tempfile.mkdtemp(prefix="pieces-", dir=self._parent)
        for key in sorted(self._bytes, key=self._bytes.get, reverse=True):
            if self.held <= self.limit // 2:
                break
            path = self._files.get(key)
            if path is None:
                path = self._files[key] = os.path.join(self._dir, f"{len(self._files)}.npy")
            with open(path, "ab") as fh:
                for piece in self._mem.pop(key):
                    fh.write(len(piece).to_bytes(4, "little"))
                    for a in piece:
                        np.save(fh, np.ascontiguousarray(a), allow_pickle=False)
            n = self._bytes.pop(key)
            self.held -= n
            self.spilled += n
        trim_heap()   # the written pieces' memory back to the OS

    def take(self, key: Hashable) -> list[Piece]:
        """Every piece of ``key``, in the order added; the key is dropped."""
        out: list[Piece] = []
        path = self._files.pop(key, None)
        if path is not None:
            with open(path, "rb") as fh:
                while head := fh.read(4):
                    k = int.from_bytes(head, "little")
                    out.append(tuple(np.load(fh, allow_pickle=False) for _ in range(k)))
            os.unlink(path)
        out.extend(self._mem.pop(key, ()))
        self.held -= self._bytes.pop(key, 0)
        return out

    def close(self) -> None:
        self._mem.clear()
        self._bytes.clear()
        self._files.clear()
        self.held = 0
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> "PieceBuffer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
