"""Background reload of disk-blocks while in-memory blocks are processed
(dissertation §4.3.3, Figure 4.8).

A fraction α of a job's input blocks (the *disk-blocks*) lives in LMDB; the
rest stays in a :class:`~harmony.store.blocks.BlockStore`. For one COMP pass
over an ordered list of block ids, :class:`ReloadPipeline` hands the blocks to
the consumer in order. A background thread loads disk-blocks ahead of their
use, at most ``depth`` disk-blocks resident at once (being loaded, loaded and
waiting, in use, or being written back), so memory stays bounded. A
disk-block is handed out only once it is completely loaded and verified, and
it is dropped as soon as the consumer asks for the next block (written back
first when ``writeback`` is on: input blocks may carry mutable state, e.g.
NMF's user factors ``L``).

The pipeline measures what the α controller needs: ``Tbload`` (background
time per disk-block: load, plus write-back), ``Tbproc`` (consumer time per
block) and the stall (time the consumer waited for a disk-block).

Start the pipeline *before* the consumer needs it (e.g. before PULL): it
starts prefetching at construction, so the first disk-block loads while the
network subtasks run. That is the ``-1`` in the bound
``Tbproc·(Btotal − 1) ≥ Tbload·(Bdisk − 1)``.

:func:`choose_disk_blocks` decides which blocks are disk-blocks for a given α,
and :func:`apply_placement` moves blocks between memory and LMDB to match.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Protocol, Sequence

from harmony.store.blocks import Block, BlockStore
from harmony.store.errors import BlockLoadError, StoreError

log = logging.getLogger("harmony.store.reload")


class DiskBlocks(Protocol):
    """What the pipeline needs from the disk side (LmdbBlockStore has it)."""
    def get(self, block_id: int) -> Block: ...
    def put(self, block: Block) -> int: ...
    # optional: ``recycle(block)``, called once the pass is done with a
    # disk-block (dropped, or written back): its arrays may back later loads


class PipelineClosed(StoreError):
    """The pipeline was closed while the consumer was still using it."""


class WritebackError(StoreError):
    """A used disk-block could not be written back (its updates would be lost)."""

    def __init__(self, block_id: int, cause: BaseException) -> None:
        super().__init__(f"block {block_id}: write-back failed: {cause}")
        self.block_id = block_id


# ---------------------------------------------------------------------------
# Which blocks are disk-blocks


def disk_count(total: int, alpha: float) -> int:
    """Number of disk-blocks for ratio ``alpha`` out of ``total`` blocks."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    return min(total, int(math.floor(alpha * total + 1e-9)))


def _van_der_corput(k: int) -> float:
    v, denom = 0.0, 1.0
    while k:
        denom *= 2.0
        k, r = divmod(k, 2)
        v += r / denom
    return v


def _spread(m: int) -> list[int]:
    """0..m-1 ordered so that every prefix is spread evenly (van der Corput)."""
    order, seen, k = [], set(), 0
    while len(order) < m:
        j = int(_van_der_corput(k) * m)
        if j not in seen:
            seen.add(j)
            order.append(j)
        k += 1
    return order


def spill_priority(n: int) -> list[int]:
    """Positions 0..n-1 of a pass in the order they become disk-blocks as α
    grows.

    First every other position counted from the end (n-1, n-3, ...), then the
    rest, each half in van der Corput order so that every prefix is spread
    over the pass; position 0 always comes last (nothing overlaps the load of
    the block needed first), position n-1 first (its load has the whole pass
    to hide behind). So up to α = 1/2 no two disk-blocks are adjacent (every
    load has at least one in-memory block to overlap with), and raising α by
    one block spills exactly one more block (no reshuffle)."""
    if n <= 0:
        return []
    a = [p for p in range(n - 1, 0, -2)]             # n-1, n-3, ... (> 0)
    b = [p for p in range(n - 2, 0, -2)]             # n-2, n-4, ... (> 0)
    return [a[j] for j in _spread(len(a))] + [b[j] for j in _spread(len(b))] + [0]


def choose_disk_blocks(groups: Sequence[Sequence[int]], alpha: float) -> set[int]:
    """The disk-blocks for ratio ``alpha`` over a job's blocks on one machine,
    given in the order they are processed (one list per iteration, as
    ``block_groups`` makes them). Pure and deterministic.

    ``disk_count(Btotal, alpha)`` blocks are chosen; each group gets its share
    in proportion to its size, spread within the group by
    :func:`spill_priority`. Monotone: the set for a larger α contains the set
    for a smaller one."""
    ranked = []
    for g, ids in enumerate(groups):
        n = len(ids)
        for rank, pos in enumerate(spill_priority(n)):
            ranked.append(((rank + 0.5) / n, g, pos, ids[pos]))
    ranked.sort()
    total = sum(len(g) for g in groups)
    return {bid for *_, bid in ranked[:disk_count(total, alpha)]}


def apply_placement(memory: BlockStore, disk, target: set[int]) -> tuple[list[int], list[int]]:
    """Move blocks so that exactly the ids in ``target`` are on disk: spill
    in-memory blocks that should be disk-blocks, load back disk-blocks that
    should not. Returns (spilled, restored). Call between iterations (not while
    a pipeline runs). A block is in one place at a time; it is removed from
    memory only after it was stored."""
    on_disk = set(disk.ids())
    spill = [bid for bid in memory.ids() if bid in target]
    restore = sorted(on_disk - target)
    if spill:
        disk.put_many(memory.get(bid) for bid in spill)
        for bid in spill:
            memory.remove(bid)
    for bid in restore:
        memory.put(disk.get(bid))
        disk.remove(bid)
    return spill, restore


# ---------------------------------------------------------------------------
# The pipeline


@dataclass
class ReloadStats:
    blocks: int = 0                   # blocks handed out
    disk_blocks: int = 0              # of which disk-blocks
    load_s: list[float] = field(default_factory=list)    # per disk-block load
    store_s: list[float] = field(default_factory=list)   # per disk-block write-back
    proc_s: list[float] = field(default_factory=list)    # per block, consumer side
    stall_s: float = 0.0              # total consumer wait for disk-blocks
    stalls: int = 0                   # number of waits
    bytes_loaded: int = 0
    max_resident: int = 0             # most disk-blocks resident at once

    @property
    def tbload(self) -> float | None:
        """Mean background seconds per disk-block (load + write-back)."""
        if not self.load_s:
            return None
        return (sum(self.load_s) + sum(self.store_s)) / len(self.load_s)

    @property
    def tbproc(self) -> float | None:
        """Mean consumer seconds per block."""
        return sum(self.proc_s) / len(self.proc_s) if self.proc_s else None

    @property
    def comp_s(self) -> float:
        """Consumer wall time: processing plus stalls."""
        return sum(self.proc_s) + self.stall_s


class ReloadPipeline:
    """One ordered pass over a set of blocks, disk-blocks reloaded ahead.

    ::

        pipe = ReloadPipeline(order, disk_ids, memory, disk)   # prefetch starts
        ...                                                     # e.g. PULL
        with pipe:
            for blk in pipe:          # in order; a disk-block is dropped when
                process(blk)          # the next one is asked for
        pipe.stats.tbload, pipe.stats.tbproc, pipe.stats.stall_s

    The consumer must not keep references to disk-blocks after moving on (that
    would defeat the memory bound, and with ``writeback`` its later changes
    would be lost). A pass can be iterated once. A load error is raised to the
    consumer when it reaches that block, as :class:`BlockLoadError` naming the
    block; a write-back error at the next ``next()`` or at ``close()``.
    ``close()`` may be called from any thread: it stops prefetching, drops
    prefetched blocks, finishes pending write-backs and joins the thread.
    """

    def __init__(self, order: Sequence[int], disk_ids: Iterable[int], memory: BlockStore,
                 disk: DiskBlocks, *, depth: int = 2, writeback: bool = True,
                 start: bool = True) -> None:
        if depth < 1:
            raise ValueError("depth must be >= 1")
        self.order = [int(b) for b in order]
        if len(set(self.order)) != len(self.order):
            raise ValueError("a block id appears twice in one pass")
        disk_set = set(int(b) for b in disk_ids)
        self._is_disk = [b in disk_set for b in self.order]
        self._disk_seq = [b for b, d in zip(self.order, self._is_disk) if d]
        self.memory, self.disk = memory, disk
        self.depth, self.writeback = depth, writeback
        self.stats = ReloadStats()

        self._cv = threading.Condition()
        self._ready: dict[int, Block] = {}
        self._errors: dict[int, BaseException] = {}
        self._wb: deque[Block] = deque()
        self._wb_error: WritebackError | None = None
        self._resident = 0
        self._next_load = 0
        self._load_failed = False
        self._closed = False
        self._consumer_done = False

        self._consumer = threading.Lock()
        self._consumer_thread: int | None = None
        self._broken: BaseException | None = None
        self._pos = 0
        self._current: tuple[Block, bool] | None = None
        self._handed_at = 0.0
        self._iterated = False
        self._thread = threading.Thread(target=self._run, name="harmony-reload", daemon=True)
        self._started = False
        if start:
            self.start()

    def start(self) -> None:
        if not self._started:
            self._started = True
            self._thread.start()

    def __len__(self) -> int:
        return len(self.order)

    # -- background thread ---------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cv:
                while True:
                    if self._wb:
                        task, arg = "store", self._wb.popleft()
                        break
                    if self._closed or self._consumer_done:
                        return
                    if (not self._load_failed and self._next_load < len(self._disk_seq)
                            and self._resident < self.depth):
                        task, arg = "load", self._disk_seq[self._next_load]
                        self._next_load += 1
                        self._resident += 1
                        self.stats.max_resident = max(self.stats.max_resident, self._resident)
                        break
                    self._cv.wait()
            if task == "load":
                self._load(arg)
            else:
                self._store(arg)

    def _load(self, bid: int) -> None:
        t0 = time.perf_counter()
        try:
            blk = self.disk.get(bid)
            if blk.id != bid:
                raise BlockLoadError(bid, "reload", f"loader returned block {blk.id}")
        except BaseException as exc:   # handed to the consumer, never lost
            if not isinstance(exc, BlockLoadError):
                exc = BlockLoadError(bid, "reload", f"{exc.__class__.__name__}: {exc}")
            with self._cv:
                self._errors[bid] = exc
                self._load_failed = True
                self._resident -= 1
                self._cv.notify_all()
            return
        dt = time.perf_counter() - t0
        with self._cv:
            self.stats.load_s.append(dt)
            self.stats.bytes_loaded += blk.nbytes
            if self._closed:
                self._resident -= 1   # nobody will use it
            else:
                self._ready[bid] = blk
            self._cv.notify_all()

    def _store(self, blk: Block) -> None:
        t0 = time.perf_counter()
        err = None
        try:
            self.disk.put(blk)
        except BaseException as exc:
            err = WritebackError(blk.id, exc)
            err.__cause__ = exc
        if err is None:
            self._recycle(blk)
        dt = time.perf_counter() - t0
        with self._cv:
            self.stats.store_s.append(dt)
            if err is not None and self._wb_error is None:
                self._wb_error = err
            self._resident -= 1
            self._cv.notify_all()

    def _recycle(self, blk: Block) -> None:
        recycle = getattr(self.disk, "recycle", None)
        if recycle is not None:
            try:
                recycle(blk)
            except Exception:     # an optimization: never the pass's failure
                log.exception("recycling block %d's arrays failed", blk.id)

    # -- consumer ---------------------------------------------------------------------
    def __iter__(self) -> Iterator[Block]:
        if self._iterated:
            raise RuntimeError("a reload pass can be iterated only once")
        self._iterated = True
        self.start()
        return self

    def _release_current(self, now: float) -> None:
        """The consumer is done with the block it holds (caller holds _cv)."""
        if self._current is None:
            return
        blk, is_disk = self._current
        self._current = None
        self.stats.proc_s.append(now - self._handed_at)
        if is_disk:
            if self.writeback:
                self._wb.append(blk)
            else:
                # before the loader is let on: its next load can reuse these
                self._recycle(blk)
                self._resident -= 1
            self._cv.notify_all()

    def __next__(self) -> Block:
        with self._consumer:
            self._consumer_thread = threading.get_ident()
            now = time.perf_counter()
            with self._cv:
                self._release_current(now)
                if self._broken is not None:
                    raise self._broken
                if self._wb_error is not None:
                    raise self._wb_error
                if self._closed:
                    raise PipelineClosed("reload pipeline closed")
                if self._pos >= len(self.order):
                    self._consumer_done = True
                    self._cv.notify_all()
                    raise StopIteration
                bid, is_disk = self.order[self._pos], self._is_disk[self._pos]
                self._pos += 1
                if is_disk:
                    if bid not in self._ready and bid not in self._errors:
                        if not self._started:
                            raise RuntimeError("pipeline not started (iterate it with for/iter)")
                        t0 = time.perf_counter()
                        self.stats.stalls += 1
                        while (bid not in self._ready and bid not in self._errors
                               and not self._closed):
                            self._cv.wait()
                        self.stats.stall_s += time.perf_counter() - t0
                    if bid in self._errors:
                        self._broken = self._errors[bid]   # later disk-blocks won't load
                        raise self._broken
                    if self._closed:
                        raise PipelineClosed("reload pipeline closed")
                    blk = self._ready.pop(bid)
                    self.stats.disk_blocks += 1
            if not is_disk:
                blk = self.memory.get(bid)
            with self._cv:
                self._current = (blk, is_disk)
                self.stats.blocks += 1
                self._handed_at = time.perf_counter()
            return blk

    def close(self, timeout: float | None = 30.0) -> None:
        """Stop, drop prefetched blocks, finish write-backs, join the thread.
        Raises a pending :class:`WritebackError`."""
        with self._cv:
            if not self._closed:
                if self._current is not None and self._consumer_thread not in (
                        None, threading.get_ident()):
                    # closed from another thread (abort) while the consumer may
                    # still be changing its block: writing it back could store a
                    # half-updated block, so keep the last stored version
                    blk, is_disk = self._current
                    self._current = None
                    if is_disk:
                        self._resident -= 1
                        log.warning("block %d was in use when the pipeline was closed "
                                    "from another thread; its changes are not written back",
                                    blk.id)
                self._release_current(time.perf_counter())
                self._closed = True
                self._resident -= len(self._ready)
                self._ready.clear()
                self._cv.notify_all()
        if self._started:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise StoreError("reload thread did not stop "
                                 f"within {timeout} s (a load or write-back is hung)")
        if self._wb_error is not None:
            err, self._wb_error = self._wb_error, None
            raise err

    def __enter__(self) -> "ReloadPipeline":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:   # always close: the thread holds self
        if exc_type is None:
            self.close()
        else:   # don't mask the consumer's exception
            try:
                self.close()
            except Exception as err:
                log.error("while closing after %s: %s", exc_type.__name__, err)
