"""Background reload pipeline and the choice of disk-blocks."""
from __future__ import annotations

import threading
import time
import weakref

import numpy as np
import pytest

from harmony.store.blocks import Block, BlockStore, export_block
from harmony.store.errors import BlockLoadError
from harmony.store.lmdb_store import JobStorage
from harmony.store.reload import (PipelineClosed, ReloadPipeline, WritebackError,
                                  apply_placement, choose_disk_blocks, disk_count,
                                  spill_priority)


def make_block(bid: int, n: int = 200) -> Block:
    rng = np.random.default_rng(bid)
    return Block(bid, {"L": rng.random((n, 4), dtype=np.float32), "i": np.arange(n) + bid})


@pytest.fixture
def storage(tmp_path):
    st = JobStorage(str(tmp_path), "job-r")
    yield st
    st.close()


def split(blocks: list[Block], disk_ids: set[int], storage: JobStorage) -> BlockStore:
    mem = BlockStore()
    for b in blocks:
        if b.id in disk_ids:
            storage.input.put(b)
        else:
            mem.put(b)
    return mem


class SlowDisk:
    """An instrumented disk side: loads take ``load_s`` and build the block's
    array in steps; records when each block became complete; counts live
    loaded blocks."""

    def __init__(self, blocks: dict[int, Block], load_s: float = 0.02, steps: int = 4,
                 fail: dict[int, BaseException] | None = None, fail_put: bool = False) -> None:
        self.blocks, self.load_s, self.steps = blocks, load_s, steps
        self.fail, self.fail_put = fail or {}, fail_put
        self.done_at: dict[int, float] = {}
        self.loads, self.puts = [], []
        self.live = self.max_live = 0
        self._lock = threading.Lock()

    def _dead(self) -> None:
        with self._lock:
            self.live -= 1

    def get(self, bid: int) -> Block:
        self.loads.append(bid)
        if bid in self.fail:
            raise self.fail[bid]
        src = self.blocks[bid]["L"]
        arr = np.full_like(src, np.nan)             # sentinel: not loaded yet
        rows = len(arr)
        for s in range(self.steps):
            time.sleep(self.load_s / self.steps)
            arr[s * rows // self.steps:(s + 1) * rows // self.steps] = \
                src[s * rows // self.steps:(s + 1) * rows // self.steps]
        blk = Block(bid, {"L": arr})
        self.done_at[bid] = time.perf_counter()
        with self._lock:
            self.live += 1
            self.max_live = max(self.max_live, self.live)
        weakref.finalize(blk, self._dead)
        return blk

    def put(self, blk: Block) -> int:
        if self.fail_put:
            raise OSError(28, "No space left on device")
        self.puts.append(blk.id)
        self.blocks[blk.id] = Block(blk.id, {"L": blk["L"].copy()})
        return blk.nbytes


def test_blocks_come_in_order_and_identical(storage):
    blocks = [make_block(b) for b in range(12)]
    order = [7, 2, 11, 0, 5, 9, 1, 3, 10, 4, 8, 6]
    disk = {2, 0, 9, 10, 6}
    mem = split(blocks, disk, storage)
    with ReloadPipeline(order, disk, mem, storage.input, writeback=False) as pipe:
        assert len(pipe) == 12
        got = [(b.id, export_block(b)) for b in pipe]
    assert [g[0] for g in got] == order
    for bid, data in got:
        assert data == export_block(blocks[bid])
    st = pipe.stats
    assert (st.blocks, st.disk_blocks, len(st.load_s), len(st.proc_s)) == (12, 5, 5, 12)
    assert st.tbload > 0 and st.tbproc >= 0 and st.bytes_loaded == sum(
        blocks[b].nbytes for b in disk)
    assert not pipe._thread.is_alive()
    assert storage.input.ids() == sorted(disk)          # reload does not remove


def test_never_hands_out_a_block_before_it_is_fully_loaded():
    src = {b: make_block(b, n=400) for b in range(8)}
    disk = SlowDisk(src, load_s=0.03, steps=6)
    mem = BlockStore()
    for b in (0, 2, 4, 6):
        mem.put(src[b])
    order = list(range(8))
    seen = []
    with ReloadPipeline(order, {1, 3, 5, 7}, mem, disk, writeback=False) as pipe:
        for blk in pipe:                                # a fast consumer
            t = time.perf_counter()
            assert not np.isnan(blk["L"]).any(), f"block {blk.id} handed out half-loaded"
            assert np.array_equal(blk["L"], src[blk.id]["L"])
            if blk.id % 2:
                assert disk.done_at[blk.id] <= t
            seen.append(blk.id)
    assert seen == order
    assert pipe.stats.stalls >= 3 and pipe.stats.stall_s > 0.05   # it had to wait


def test_prefetch_overlaps_processing_when_the_bound_holds():
    """Tbproc·(B−1) ≥ Tbload·(Bdisk−1) with room to spare: the consumer (almost)
    never waits, since loads run behind in-memory blocks."""
    src = {b: make_block(b) for b in range(10)}
    disk_ids = choose_disk_blocks([list(range(10))], 0.4)        # 4 disk-blocks, spread
    disk = SlowDisk(src, load_s=0.02, steps=2)
    mem = BlockStore()
    for b in range(10):
        if b not in disk_ids:
            mem.put(src[b])
    pipe = ReloadPipeline(range(10), disk_ids, mem, disk, writeback=False)
    time.sleep(0.03)                                   # e.g. PULL: the first load hides here
    with pipe:
        for _ in pipe:
            time.sleep(0.04)                           # Tbproc
    st = pipe.stats
    assert st.disk_blocks == 4
    assert st.stall_s < 0.25 * sum(st.load_s), (st.stall_s, st.load_s)


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_memory_stays_bounded(depth):
    src = {b: make_block(b) for b in range(16)}
    disk = SlowDisk(src, load_s=0.004, steps=1)
    mem = BlockStore()
    with ReloadPipeline(range(16), range(16), mem, disk, depth=depth) as pipe:
        for blk in pipe:
            time.sleep(0.002)
            del blk
    assert pipe.stats.max_resident <= depth
    assert disk.max_live <= depth + 1   # + the consumer's loop variable, briefly
    assert disk.live == 0                # all dropped after use
    assert disk.puts == list(range(16))  # and written back


def test_disk_blocks_are_written_back_after_use(storage):
    blocks = [make_block(b) for b in range(6)]
    mem = split(blocks, {1, 4}, storage)
    with ReloadPipeline(range(6), {1, 4}, mem, storage.input) as pipe:
        for blk in pipe:
            blk["L"] += 1.0                        # COMP updates local state
    for b in (1, 4):
        assert np.array_equal(storage.input.get(b)["L"], blocks[b]["L"] + 1.0)
    assert len(pipe.stats.store_s) == 2
    assert pipe.stats.tbload == pytest.approx(
        (sum(pipe.stats.load_s) + sum(pipe.stats.store_s)) / 2)
    with ReloadPipeline(range(6), {1, 4}, mem, storage.input, writeback=False) as pipe:
        for blk in pipe:
            blk["L"] += 1.0
    assert np.array_equal(storage.input.get(1)["L"], blocks[1]["L"] + 1.0)   # unchanged


def test_corrupt_block_error_reaches_the_consumer_naming_it(storage):
    blocks = [make_block(b) for b in range(8)]
    mem = split(blocks, {1, 3, 5}, storage)
    dbi = storage.spill_env.db("input")
    key = (3).to_bytes(8, "big")
    val = storage.spill_env.read(lambda txn: bytearray(txn.get(key, db=dbi)))
    val[200] ^= 0xFF
    storage.spill_env.write(lambda txn: txn.put(key, bytes(val), db=dbi), len(val))
    got = []
    pipe = ReloadPipeline(range(8), {1, 3, 5}, mem, storage.input)
    with pytest.raises(BlockLoadError, match="block 3 .*checksum") as ei:
        for blk in pipe:
            got.append(blk.id)
    assert ei.value.block_id == 3 and got == [0, 1, 2]
    with pytest.raises(BlockLoadError, match="block 3"):
        next(pipe)                                 # stays broken, never hangs
    pipe.close()
    assert not pipe._thread.is_alive()
    assert np.array_equal(storage.input.get(1)["L"], blocks[1]["L"])   # write-back done


def test_any_loader_exception_is_wrapped_with_the_block_id():
    src = {b: make_block(b) for b in range(4)}
    disk = SlowDisk(src, load_s=0.001, fail={2: RuntimeError("MDB_CORRUPTED")})
    with pytest.raises(BlockLoadError, match="block 2 .*RuntimeError: MDB_CORRUPTED"):
        with ReloadPipeline(range(4), range(4), BlockStore(), disk) as pipe:
            list(pipe)
    assert not pipe._thread.is_alive()


def test_early_exit_drops_prefetched_and_finishes_writebacks():
    src = {b: make_block(b) for b in range(10)}
    disk = SlowDisk(src, load_s=0.002, steps=1)
    with ReloadPipeline(range(10), range(10), BlockStore(), disk, depth=3) as pipe:
        for blk in pipe:
            if blk.id == 3:
                break
    assert not pipe._thread.is_alive()
    assert disk.puts == [0, 1, 2, 3]               # used blocks written back, incl. the last
    assert set(disk.loads) <= set(range(7))        # prefetch stopped within depth
    del blk
    assert disk.live == 0


def test_close_from_another_thread_wakes_a_waiting_consumer():
    src = {b: make_block(b) for b in range(3)}
    disk = SlowDisk(src, load_s=1.0, steps=20)
    pipe = ReloadPipeline(range(3), range(3), BlockStore(), disk)
    errors = []

    def consume():
        try:
            for _ in pipe:
                pass
        except PipelineClosed as exc:
            errors.append(exc)
    t = threading.Thread(target=consume)
    t.start()
    time.sleep(0.05)
    t0 = time.perf_counter()
    pipe.close()
    t.join(5)
    assert not t.is_alive() and len(errors) == 1
    assert time.perf_counter() - t0 < 2.0
    assert not pipe._thread.is_alive()


def test_writeback_failure_is_raised_not_lost():
    src = {b: make_block(b) for b in range(3)}
    disk = SlowDisk(src, load_s=0.001, fail_put=True)
    pipe = ReloadPipeline(range(3), range(3), BlockStore(), disk)
    with pytest.raises(WritebackError, match="block 0: write-back failed.*No space"):
        for _ in pipe:
            time.sleep(0.02)
        pipe.close()


def test_a_pass_is_iterated_once(storage):
    mem = BlockStore()
    mem.put(make_block(0))
    with ReloadPipeline([0], [], mem, storage.input) as pipe:
        assert [b.id for b in pipe] == [0]
        with pytest.raises(RuntimeError, match="once"):
            iter(pipe)
    with pytest.raises(ValueError):
        ReloadPipeline([1, 1], [], mem, storage.input)


# -- which blocks are disk-blocks ---------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3, 7, 8, 16, 33])
def test_spill_priority_is_a_spread_permutation(n):
    pr = spill_priority(n)
    assert sorted(pr) == list(range(n))
    assert pr[0] == n - 1                        # the last block first
    if n > 1:
        assert pr[-1] == 0                       # the first block last


def test_choose_disk_blocks_counts_monotone_deterministic_interleaved():
    groups = [list(range(g * 10, g * 10 + 10)) for g in range(3)] + [[30, 31, 32, 33]]
    total = 34
    prev: set[int] = set()
    for k in range(total + 1):
        a = k / total
        d = choose_disk_blocks(groups, a)
        assert len(d) == disk_count(total, a) == k
        assert prev <= d                          # raising α only adds disk-blocks
        assert d == choose_disk_blocks(groups, a)
        prev = d
        if a < 1:
            per_group = [sum(b in d for b in g) for g in groups]
            assert max(abs(c - a * len(g)) for c, g in zip(per_group, groups)) <= 1.0
            for g in groups:
                assert g[0] not in d or all(b in d for b in g[1:])   # first block in memory
                if sum(b in d for b in g) <= len(g) // 2:          # ≤ half: never adjacent
                    flags = [b in d for b in g]
                    assert not any(x and y for x, y in zip(flags, flags[1:])), (a, g, flags)
    assert choose_disk_blocks(groups, 1.0) == set(range(34))
    assert choose_disk_blocks(groups, 0.0) == set()
    with pytest.raises(ValueError):
        choose_disk_blocks(groups, 1.5)


def test_apply_placement_moves_blocks_both_ways(storage):
    blocks = [make_block(b) for b in range(8)]
    mem = BlockStore()
    for b in blocks:
        mem.put(b)
    groups = [list(range(8))]
    target = choose_disk_blocks(groups, 0.5)
    spilled, restored = apply_placement(mem, storage.input, target)
    assert set(spilled) == target and restored == []
    assert set(storage.input.ids()) == target and set(mem.ids()) == set(range(8)) - target
    lower = choose_disk_blocks(groups, 0.25)
    spilled, restored = apply_placement(mem, storage.input, lower)
    assert spilled == [] and set(restored) == target - lower
    assert set(storage.input.ids()) == lower
    for b in blocks:
        got = storage.input.get(b.id) if b.id in lower else mem.get(b.id)
        assert export_block(got) == export_block(b)
