"""One job's input blocks on one machine: in memory, or disk-blocks in LMDB.

:class:`LocalInput` is the single owner of a job executor's input blocks.
Everything that touches input goes through it: ingest (``read_input`` today,
a checkpoint restore later), the placement of a fraction α of the blocks on
disk (:meth:`LocalInput.set_alpha`), every pass of the app over blocks
(:meth:`LocalInput.view`, which reloads disk-blocks in the background through
:class:`~harmony.store.reload.ReloadPipeline`), and whole-set access for
checkpoints (:meth:`LocalInput.iter_blocks`, :meth:`LocalInput.replace`).

Mutable input (NMF's user factors ``L``, LDA's topic assignments ``z``)
-----------------------------------------------------------------------
Apps may change arrays of their input blocks in ``compute`` and
``objective``. A disk-block is dropped after use, so its changes must not be
lost. We chose to **keep the mutated arrays in memory** rather than writing
whole blocks back after every use:

* when a disk-block is dropped, the CRC-32 of each of its arrays is compared
  with the CRC recorded when the block was last stored; an array that changed
  (or was added) is *pinned*: from then on that array name is mutable for the
  whole job, and every disk-block keeps its copy of a pinned array in memory
  (the *residue*), merged back into the block when it is loaded again;
* so nothing is written back in steady state: NMF's ``L`` (about 8% of a
  block at rank 16 and 40 ratings per user) and LDA's ``z`` (about 20%) stay
  in memory, the immutable ratings and
  tokens are reloaded, read-only, from LMDB. A changed non-pinned array is
  detected on the very use that changed it, so no change is ever lost (up to
  a CRC-32 collision, 2^-32 per changed array);
* blocks are written to LMDB without their pinned arrays; a block whose set of
  arrays shrank, or that LMDB still holds with arrays pinned since, is
  written again (once: its later reloads read only the immutable part).

Writing mutated blocks back instead would rewrite over 10x more bytes than
NMF changes, on every pass; the price of pinning is that mutable state never
leaves memory (documented in the README; model spill is the next lever).

Declared input (``App.mutable_input``)
--------------------------------------
An app may declare which input arrays it changes (``mutable`` here). Those
are pinned from the start, and every other array of a disk-block is handed
over zero-copy: a read-only view of the stored bytes
(:meth:`LmdbBlockStore.get_view`), with a read txn (a lease) held until the
block is released. Views need no change check (they cannot change); a
release drops them from the block and ends the lease, unless the app still
refers to a view, in which case the lease ends at a later release. A block
brought back into memory by placement is copied.

Apps must not keep references to a disk-block after moving past it in a
pass (the block is dropped, and changes made later to its non-pinned arrays
would not be seen); pinned arrays are shared with the residue, so changes to
them always stick.

What the app sees
-----------------
A group without disk-blocks is handed over as a plain ``list`` (exactly as
before the store was wired in). A group with disk-blocks is a
:class:`BlockSeq`: a read-only sequence (``len``, iteration, indexing). Each
iteration over it is one pipelined pass: disk-blocks are loaded ahead in a
background thread, at most ``depth`` at once, and dropped when the app asks
for the next block. Indexing a disk-block loads it synchronously and keeps it
until the app call ends (:meth:`BlockSeq.close`).
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as np

from harmony.store.blocks import Block, BlockStore
from harmony.store.errors import StoreError
from harmony.store.framing import crc32, release_scratch
from harmony.store.lmdb_store import LmdbBlockStore
from harmony.util.malloc import trim_heap
from harmony.store.reload import ReloadPipeline, ReloadStats, choose_disk_blocks

log = logging.getLogger("harmony.store.local")

class SpillDisabledError(StoreError):
    """Input does not fit the memory budget and spilling is disabled."""


# ---------------------------------------------------------------------------
# Change detection


def _crc(a: np.ndarray) -> int:
    """CRC-32 of an array's bytes (ISA-L's, see framing: this runs over
    every non-pinned array of every dropped disk-block)."""
    if not a.nbytes:
        return 0
    if not a.flags.c_contiguous:
        a = np.ascontiguousarray(a)
    return crc32(a.reshape(-1).view(np.uint8))


def digests(arrays: dict[str, np.ndarray], skip: Iterable[str] = ()) -> dict[str, tuple]:
    """Per-array (dtype, shape, CRC-32), leaving out the names in ``skip``."""
    skip = set(skip)
    return {n: (a.dtype.str, tuple(a.shape), _crc(a)) for n, a in arrays.items()
            if n not in skip}


def _nbytes(arrays: dict[str, np.ndarray]) -> int:
    return int(sum(a.nbytes for a in arrays.values()))


# ---------------------------------------------------------------------------
# Per-epoch statistics


@dataclass
class PassTotals(ReloadStats):
    """Reload statistics summed over the passes of an epoch (and the loads
    of blocks an app read at random); Tbload, Tbproc and the COMP time come
    from :class:`ReloadStats`."""
    passes: int = 0
    pinned_now: int = 0      # arrays newly pinned
    rewrites: int = 0        # blocks written again (array set changed)

    def add(self, st: ReloadStats) -> None:
        self.passes += 1
        self.blocks += st.blocks
        self.disk_blocks += st.disk_blocks
        self.stall_s += st.stall_s
        self.stalls += st.stalls
        self.load_s.extend(st.load_s)
        self.store_s.extend(st.store_s)
        self.proc_s.extend(st.proc_s)
        self.bytes_loaded += st.bytes_loaded
        self.max_resident = max(self.max_resident, st.max_resident)


# ---------------------------------------------------------------------------
# The owner


class _DiskSide:
    """What one reload pass sees as 'the disk': loads merge the residue of
    pinned arrays back in; 'write-back' checks for changes and pins them."""

    def __init__(self, owner: "LocalInput") -> None:
        self.owner = owner

    def get(self, block_id: int) -> Block:
        return self.owner._load(block_id)

    def put(self, block: Block) -> int:
        self.owner._release(block)
        return 0

    def recycle(self, block: Block) -> None:
        """After ``put``: a copied block's arrays that nothing refers to
        (pinned ones are held by the residue) back later loads."""
        disk = self.owner.disk
        if not self.owner.zero_copy and hasattr(disk, "recycle"):
            disk.recycle(block)


class LocalInput:
    """This job's input blocks on this machine (see the module doc).

    ``disk`` is the job's LMDB input store (``JobStorage.input``); without
    one (``None``) every block stays in memory and α is always 0.
    """

    def __init__(self, disk: LmdbBlockStore | None, *, depth: int = 2,
                 mutable: Iterable[str] | None = None) -> None:
        self.memory = BlockStore()
        self.disk = disk
        self.depth = depth
        self.on_disk: set[int] = set()
        #: the app declared which input arrays it changes (``App.mutable_input``):
        #: those are pinned from the start and every other array of a
        #: disk-block is loaded zero-copy, read-only
        self.zero_copy = mutable is not None
        self.pinned: set[str] = set(mutable or ())
        self._lingering: list = []     # leases whose views the app still holds
        self._warned = False
        self._residue: dict[int, dict[str, np.ndarray]] = {}
        self._stored: dict[int, dict[str, tuple]] = {}   # digests of what LMDB holds
        self._size: dict[int, int] = {}                   # full in-memory bytes per block
        self._lock = threading.Lock()
        self._ids: list[int] = []
        self.groups: list[list[int]] = []
        self.totals = PassTotals()
        self.spilled_bytes = 0      # written to LMDB (placement), cumulative
        self.closed = False

    # -- what is where ----------------------------------------------------------
    def ids(self) -> list[int]:
        return list(self._ids)

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._size

    def is_disk(self, block_id: int) -> bool:
        return block_id in self.on_disk

    @property
    def alpha(self) -> float:
        return len(self.on_disk) / len(self._ids) if self._ids else 0.0

    def block_bytes(self, block_id: int) -> int:
        return self._size[block_id]

    def total_bytes(self) -> int:
        """In-memory size of all blocks (as if none were on disk)."""
        return sum(self._size.values())

    def residue_bytes(self) -> int:
        with self._lock:
            return sum(_nbytes(r) for r in self._residue.values())

    def memory_bytes(self) -> int:
        """Bytes of input held in memory: memory-blocks plus pinned residue."""
        return self.memory.total_bytes() + self.residue_bytes()

    def spillable_block_bytes(self) -> float:
        """Mean bytes one more disk-block frees (its pinned arrays stay)."""
        with self._lock:
            pinned = set(self.pinned)
        if not self._size:
            return 0.0
        if not pinned:
            return self.mean_block_bytes()
        mem = [self.memory.get(b) for b in self.memory.ids()]
        if mem:
            return sum(b.nbytes - sum(a.nbytes for n, a in b.arrays.items() if n in pinned)
                       for b in mem) / len(mem)
        return max(0.0, self.mean_block_bytes() - self.residue_bytes() / max(1, len(self.on_disk)))

    def mean_block_bytes(self) -> float:
        return self.total_bytes() / len(self._size) if self._size else 0.0

    def set_groups(self, iters: int) -> list[list[int]]:
        """The blocks of each iteration (ids sorted, split as ``block_groups``)."""
        n = len(self._ids)
        self.groups = [self._ids[i * n // iters:(i + 1) * n // iters] for i in range(iters)]
        return self.groups

    # -- ingest and import ----------------------------------------------------------
    def add(self, block: Block, *, to_disk: bool = False) -> None:
        """Add a new block, in memory or (``to_disk``) straight to LMDB."""
        bid = int(block.id)
        if bid in self._size:
            raise ValueError(f"input block {bid} given twice")
        self._size[bid] = block.nbytes
        self._ids.append(bid)
        self._ids.sort()
        if to_disk:
            self._require_disk()
            self._spill_blocks([block])
        else:
            self.memory.put(block)

    def ingest(self, blocks: Iterable[Block], *, memory_limit: int | None = None,
               spill: bool = True, budget_note: str = "") -> None:
        """Take blocks from an iterable (``app.read_input``, or a restored
        checkpoint). Once the in-memory input would exceed ``memory_limit``
        bytes, further blocks go straight to LMDB, or, with ``spill`` off,
        :class:`SpillDisabledError` is raised (naming ``budget_note``).

        With ``spill`` off the limit keeps one block of room: a block is in
        memory before it can be counted, so a job refused only once a block
        overshoots has already crossed its budget, and the daemon's OOM
        killer, which counts the process, may kill it before it reports why
        (seen under load). The room keeps the process under the limit.

        With ``spill`` on, a block goes to disk once keeping it would leave no
        room for the next one: a block spilled is in memory while it is
        written (the next one is being read, and LMDB's write copies it), so
        keeping blocks up to the limit let the process cross it by a block or
        two (an emulated OOM kill at 71 MiB of a 70 MiB budget, seen under
        load)."""
        held = self.memory.total_bytes()
        for blk in blocks:
            if not isinstance(blk, Block):
                raise TypeError(f"read_input yielded {type(blk).__name__}, not a Block")
            over = memory_limit is not None and held + 2 * blk.nbytes > memory_limit
            if not spill and memory_limit is not None and held + 2 * blk.nbytes > memory_limit:
                raise SpillDisabledError(
                    f"out of memory: input blocks need more than {_mib(memory_limit)} "
                    f"(held {_mib(held)}, next block {_mib(blk.nbytes)}, and room for "
                    f"the one after){budget_note}; spilling is disabled (--no-spill)")
            if over and self.disk is not None:
                self.add(blk, to_disk=True)
                blk = None
                trim_heap()   # else the spilled blocks' memory stays in the heap,
                #               counted against the budget until ingest ends
            else:
                self.add(blk)
                held += blk.nbytes
        release_scratch()

    def replace(self, block: Block) -> None:
        """Replace a block's contents by id (e.g. from a checkpoint), wherever
        it lives; a new id is added in memory."""
        bid = int(block.id)
        if bid not in self._size:
            return self.add(block)
        self._size[bid] = block.nbytes
        if bid in self.on_disk:
            with self._lock:
                self._residue.pop(bid, None)
            self._spill_blocks([block])
        else:
            self.memory.put(block)

    def mutable_state(self, extra: Iterable[str] = ()) -> Iterator[Block]:
        """Every block's declared mutable arrays (the app declared
        ``mutable_input``) and the ``extra`` arrays asked for, in id order:
        what a checkpoint must keep, since the rest is read again from the
        input on resume. Without extra arrays no disk-block is reloaded.
        Blocks with none of these arrays come as empty blocks (their ids
        still check the resume)."""
        if not self.zero_copy:
            raise StoreError("mutable_state needs the app's declared mutable input")
        names = self.pinned | set(extra)
        if names != self.pinned:     # e.g. the arrays an export reads
            for blk in self.iter_blocks():
                yield Block(blk.id, {n: a for n, a in blk.arrays.items() if n in names})
            return
        for bid in self._ids:
            if bid in self.on_disk:
                with self._lock:
                    arrays = dict(self._residue.get(bid, {}))
            else:
                arrays = {n: a for n, a in self.memory.get(bid).arrays.items()
                          if n in self.pinned}
            yield Block(bid, arrays)

    def restore_state(self, block: Block) -> None:
        """Put back a checkpoint's version of a block. With declared mutable
        input, its declared arrays are merged into the block read from the
        input (the others, if the checkpoint has them, are what the input
        gave again); otherwise it replaces the block whole."""
        bid = int(block.id)
        if not (self.zero_copy and bid in self._size):
            return self.replace(block)
        arrays = {n: a for n, a in block.arrays.items() if n in self.pinned}
        if bid in self.on_disk:
            with self._lock:
                self._residue.setdefault(bid, {}).update(arrays)
        else:
            self.memory.get(bid).arrays.update(arrays)

    def remove(self, block_id: int) -> None:
        """Drop a block wherever it lives (it moved to another machine).
        Between passes only; call :meth:`set_groups` after."""
        bid = int(block_id)
        if bid not in self._size:
            raise KeyError(f"input block {bid} is not on this machine")
        del self._size[bid]
        self._ids.remove(bid)
        if bid in self.on_disk:
            self.on_disk.discard(bid)
            with self._lock:
                self._residue.pop(bid, None)
                self._stored.pop(bid, None)
            self.disk.discard(bid)
        else:
            self.memory.remove(bid)

    def iter_blocks(self, ids: Iterable[int] | None = None) -> Iterator[Block]:
        """Every block (or those in ``ids``) in id order, complete (disk-blocks
        loaded in the background, residue merged), e.g. to checkpoint them.
        Changes made to the yielded blocks are kept as in any pass."""
        seq = self.view(self._ids if ids is None else sorted(ids), as_list=False)
        try:
            yield from seq
        finally:
            seq.close()

    # -- placement ---------------------------------------------------------------------
    def _require_disk(self) -> None:
        if self.disk is None:
            raise StoreError("no disk store for input blocks on this machine")

    def _spill_blocks(self, blocks: list[Block]) -> None:
        """Store blocks in LMDB without their pinned arrays; keep those."""
        with self._lock:
            pinned = set(self.pinned)
        parts = []
        for blk in blocks:
            keep = {n: a for n, a in blk.arrays.items() if n in pinned}
            rest = {n: a for n, a in blk.arrays.items() if n not in pinned}
            parts.append((blk.id, keep, rest))
        self.spilled_bytes += self.disk.put_many(Block(bid, rest) for bid, _, rest in parts)
        for bid, keep, rest in parts:
            with self._lock:
                if keep:
                    self._residue[bid] = keep
                self._stored[bid] = digests(rest)
            self.on_disk.add(bid)

    def set_disk(self, target: set[int]) -> tuple[list[int], list[int]]:
        """Make exactly ``target`` the disk-blocks: spill memory-blocks in it,
        bring back disk-blocks not in it. Between passes only."""
        target = {int(b) for b in target}
        unknown = target - set(self._size)
        if unknown:
            raise KeyError(f"not input blocks of this job: {sorted(unknown)[:5]}")
        if target:
            self._require_disk()
        spill = [bid for bid in self.memory.ids() if bid in target]
        back = sorted(self.on_disk - target)
        for bid in spill:
            # one block per transaction, dropped at once: an LMDB write txn
            # holds its dirty pages in memory until it commits, so spilling
            # many blocks in one txn would first need their size again
            self._spill_blocks([self.memory.get(bid)])
            self.memory.remove(bid)
            release_scratch()
        for bid in back:
            blk = self._load(bid, copy=True)    # its own memory from now on
            self.memory.put(blk)
            self.on_disk.discard(bid)
            with self._lock:
                self._residue.pop(bid, None)
                self._stored.pop(bid, None)
            self.disk.discard(bid)
        if spill or back:
            release_scratch()
            if spill:
                self._clear_pool()    # memory is wanted back: no free arrays kept
            trim_heap()
        return spill, back

    def _clear_pool(self) -> None:
        """Let go of the free arrays the disk side keeps for reuse (an LMDB
        store's ``ArrayPool``; other disk sides keep none)."""
        pool = getattr(self.disk, "pool", None)
        if pool is not None:
            pool.clear()

    def set_alpha(self, alpha: float) -> tuple[list[int], list[int]]:
        """Place ``disk_count(B, alpha)`` disk-blocks, spread over the passes
        (:func:`~harmony.store.reload.choose_disk_blocks`, monotone in α)."""
        groups = self.groups or [self._ids]
        return self.set_disk(choose_disk_blocks(groups, alpha))

    def set_disk_count(self, n: int) -> tuple[list[int], list[int]]:
        total = len(self._ids)
        return self.set_alpha(min(1.0, max(0, n) / total) if total else 0.0)

    # -- loading and dropping one disk-block -----------------------------------------
    def _load(self, bid: int, copy: bool = False) -> Block:
        """A disk-block with its residue; zero-copy (read-only views, a
        lease held until :meth:`_release`) when declared, unless ``copy``."""
        if self.zero_copy and not copy:
            blk, blk.lease = self.disk.get_view(bid)
        else:
            blk = self.disk.get(bid)
        with self._lock:
            res = self._residue.get(bid)
            if res:
                blk.arrays.update(res)
        return blk

    def _release(self, blk: Block) -> None:
        """A used disk-block is being dropped: pin the arrays that changed;
        write the block again if arrays were removed, or if LMDB still holds
        arrays that are pinned now (once per block: later reloads then read
        only the immutable part)."""
        bid = blk.id
        with self._lock:
            pinned = set(self.pinned)
            stored = self._stored.get(bid, {})
        # a zero-copy load's views are read-only views of what LMDB holds:
        # unchanged by construction, so not hashed again
        viewed = ({n for n, a in blk.arrays.items() if n in stored
                   and any(a is v for v in blk.lease.arrays)} if blk.lease is not None else set())
        now = digests({n: a for n, a in blk.arrays.items() if n not in viewed}, skip=pinned)
        now.update({n: stored[n] for n in viewed if n not in pinned})
        changed = {n for n, d in now.items() if stored.get(n) != d}
        removed = {n for n in stored if n not in blk.arrays and n not in pinned}
        if changed:
            with self._lock:
                new = changed - self.pinned
                self.pinned |= changed
                self.totals.pinned_now += len(new)
            if new:
                log.info("input arrays %s change in the app: kept in memory from now on",
                         sorted(new))
        with self._lock:
            keep = {n: a for n, a in blk.arrays.items() if n in self.pinned}
            if keep:
                self._residue[bid] = keep
            else:
                self._residue.pop(bid, None)
        stale = {n for n in stored if n in keep}
        if removed or stale:
            rest = {n: a for n, a in blk.arrays.items() if n not in keep}
            self.disk.put(Block(bid, rest))
            # unchanged since ``now`` was taken (changed arrays are in keep)
            rest_digests = {n: now[n] for n in rest if n in now}
            if len(rest_digests) < len(rest):
                rest_digests = digests(rest)
            with self._lock:
                self._stored[bid] = rest_digests
                self.totals.rewrites += 1
        if blk.lease is not None:
            self._end_lease(blk, viewed)

    def _end_lease(self, blk: Block, viewed: set[str]) -> None:
        """Drop a zero-copy block's views and end its read txn, or keep the
        txn while the app still holds a view (ended at a later release)."""
        lease, blk.lease = blk.lease, None
        for n in viewed:
            del blk.arrays[n]
        with self._lock:
            held = [x for x in self._lingering if not x.end()]
            if not lease.end():
                # usually the app's loop variables, still bound to the block
                # it just left while the reload thread releases it: ended at
                # the next release. Many at once mean kept references.
                held.append(lease)
                if len(held) > 2 * self.depth + 2 and not self._warned:
                    self._warned = True
                    log.warning("the app keeps views of %d dropped input blocks (block %d "
                                "last): their read transactions stay open until the views "
                                "go, and the spill store cannot grow meanwhile",
                                len(held), blk.id)
            self._lingering = held

    # -- passes ----------------------------------------------------------------------------
    def _pass(self, ids: list[int]) -> ReloadPipeline:
        return ReloadPipeline(ids, [b for b in ids if b in self.on_disk], self.memory,
                              _DiskSide(self), depth=self.depth, writeback=True)

    def view(self, ids: Sequence[int], *, prefetch: bool = False,
             as_list: bool | None = None) -> "list[Block] | BlockSeq":
        """The blocks ``ids`` as the app gets them: a plain list if none is
        a disk-block (or ``as_list``), else a :class:`BlockSeq` (with
        ``prefetch``, its first pass starts loading now)."""
        ids = [int(b) for b in ids]
        has_disk = any(b in self.on_disk for b in ids)
        if as_list or (as_list is None and not has_disk):
            if has_disk:
                raise ValueError("disk-blocks cannot be handed out as a list")
            return [self.memory.get(b) for b in ids]
        return BlockSeq(self, ids, prefetch=prefetch)

    def take_totals(self) -> PassTotals:
        t, self.totals = self.totals, PassTotals()
        return t

    def stats(self) -> dict[str, float]:
        return {"alpha": self.alpha, "mem_blocks": float(len(self.memory)),
                "disk_blocks": float(len(self.on_disk)),
                "input_mb": self.total_bytes() / 2**20,
                "input_mem_mb": self.memory_bytes() / 2**20}

    def close(self) -> None:
        self.closed = True
        self.memory = BlockStore()
        self._clear_pool()
        with self._lock:
            self._residue.clear()
            for lease in self._lingering:
                lease.close()
            self._lingering = []


def _mib(n: int | float) -> str:
    return f"{n / 2**20:.1f} MiB"


class BlockSeq(Sequence):
    """A group of input blocks with disk-blocks among them, as the app sees
    it: ``len``, iteration (one pipelined pass per iteration) and indexing.
    Close it when the app call returns (the executor does)."""

    def __init__(self, owner: LocalInput, ids: list[int], *, prefetch: bool = False) -> None:
        self._owner = owner
        self._ids = ids
        self._pending: ReloadPipeline | None = owner._pass(ids) if prefetch else None
        self._open: list[ReloadPipeline] = []
        self._borrowed: dict[int, Block] = {}
        self._closed = False

    def __len__(self) -> int:
        return len(self._ids)

    @property
    def owner(self) -> LocalInput:
        return self._owner

    def ids(self) -> list[int]:
        return list(self._ids)

    def __iter__(self) -> Iterator[Block]:
        if self._closed:
            raise StoreError("block sequence used after its app call ended")
        pipe, self._pending = self._pending, None
        if pipe is None:
            pipe = self._owner._pass(self._ids)
        self._open.append(pipe)
        return self._run(pipe)

    def _run(self, pipe: ReloadPipeline) -> Iterator[Block]:
        for blk in pipe:
            yield blk
        self._finish(pipe)

    def _finish(self, pipe: ReloadPipeline) -> None:
        if pipe in self._open:
            self._open.remove(pipe)
            try:
                pipe.close()
            finally:
                self._owner.totals.add(pipe.stats)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self._ids)))]
        bid = self._ids[i]
        if bid not in self._owner.on_disk:
            return self._owner.memory.get(bid)
        blk = self._borrowed.get(bid)
        if blk is None:
            t0 = time.perf_counter()
            blk = self._borrowed[bid] = self._owner._load(bid)
            dt = time.perf_counter() - t0
            tot = self._owner.totals
            tot.stall_s += dt          # the app waited for it
            tot.load_s.append(dt)
        return blk

    def close(self) -> None:
        """End of the app call: finish open passes, drop borrowed blocks."""
        if self._closed:
            return
        self._closed = True
        err = None
        if self._pending is not None:   # prefetched but never iterated
            pipe, self._pending = self._pending, None
            try:
                pipe.close()
            finally:
                self._owner.totals.add(pipe.stats)
        for pipe in list(self._open):
            try:
                self._finish(pipe)
            except Exception as exc:   # raise the first, after closing all
                err = err or exc
        for blk in self._borrowed.values():
            self._owner._release(blk)
        self._borrowed.clear()
        trim_heap()      # the dropped disk-blocks' memory back to the OS
        if err is not None:
            raise err

    def __enter__(self) -> "BlockSeq":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"BlockSeq({len(self._ids)} blocks, {sum(b in self._owner.on_disk for b in self._ids)} on disk)"
