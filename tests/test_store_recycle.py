"""Arrays of dropped disk-blocks reused by later loads (harmony/store/recycle.py)."""
from __future__ import annotations

import numpy as np
import pytest

from harmony.store.blocks import Block
from harmony.store.lmdb_store import JobStorage
from harmony.store.local import LocalInput
from harmony.store.recycle import ArrayPool
from harmony.store.reload import ReloadPipeline, BlockStore

N = 20_000      # rows: 320 KB of float32 x 4, above the pool's minimum


def make_block(bid: int) -> Block:
    rng = np.random.default_rng(bid)
    return Block(bid, {"L": rng.random((N, 4), dtype=np.float32),
                       "i": np.arange(N, dtype=np.int64) + bid})


@pytest.fixture
def storage(tmp_path):
    st = JobStorage(str(tmp_path), "job-r")
    yield st
    st.close()


def test_a_second_pass_loads_into_the_first_pass_arrays_and_reads_right(storage):
    ids = list(range(6))
    for b in ids:
        storage.input.put(make_block(b))
    pool = storage.input.pool
    for p in range(2):
        with ReloadPipeline(ids, ids, BlockStore(), storage.input, writeback=False) as pipe:
            for blk in pipe:
                want = make_block(blk.id)
                assert np.array_equal(blk["L"], want["L"]) and np.array_equal(blk["i"], want["i"])
    # the first pass's first loads are fresh; after that, each load reuses
    # the arrays of a block dropped before it
    assert pool.reused >= 2 * (len(ids) - 3)
    assert pool.fresh <= 2 * 3


def test_an_array_still_referenced_is_never_reused_until_it_is_let_go(storage):
    ids = list(range(5))
    for b in ids:
        storage.input.put(make_block(b))
    kept = None
    with ReloadPipeline(ids, ids, BlockStore(), storage.input, writeback=False) as pipe:
        for blk in pipe:
            if blk.id == 0:
                kept = blk["L"]           # a reference the app keeps
    assert np.array_equal(kept, make_block(0)["L"])     # not overwritten by blocks 1-4
    with ReloadPipeline(ids, ids, BlockStore(), storage.input, writeback=False) as pipe:
        for blk in pipe:
            pass
    assert np.array_equal(kept, make_block(0)["L"])
    assert not any(a is kept for free in storage.input.pool._free.values() for a in free)
    view = kept[10:20]
    del kept                               # a view holds it too
    assert storage.input.pool.take(np.dtype(np.float32), (N, 4)) is not view.base


def test_a_dropped_block_kept_against_the_contract_fails_loudly_not_silently(storage):
    ids = list(range(4))
    for b in ids:
        storage.input.put(make_block(b))
    blocks = []
    with ReloadPipeline(ids, ids, BlockStore(), storage.input, writeback=False) as pipe:
        for blk in pipe:
            blocks.append(blk)
    # the dropped blocks' arrays went to the pool: reading them is a KeyError,
    # never another block's data
    for blk in blocks:
        with pytest.raises(KeyError):
            blk["L"]


def test_changed_arrays_of_an_undeclared_input_are_not_reused(tmp_path):
    """LocalInput without declared input (the copy path): an array the app
    changes is pinned in memory (the residue) and must survive later loads."""
    st = JobStorage(str(tmp_path), "job-l")
    try:
        inp = LocalInput(st.input, depth=2)
        blocks = [make_block(b) for b in range(6)]
        for b in blocks:
            inp.add(b)
        inp.set_disk(set(range(6)))
        for p in range(3):
            seq = inp.view(list(range(6)))
            for blk in seq:
                assert np.array_equal(blk["L"], make_block(blk.id)["L"])
                assert blk["i"][0] == blk.id + p        # the changes of earlier passes
                blk["i"] += 1                            # changed: pinned from now on
            seq.close()
        assert st.input.pool.reused > 0                  # "L" arrays are reused
    finally:
        st.close()


def test_the_pool_is_bounded_and_cleared():
    pool = ArrayPool(max_bytes=3 * N * 16, per_shape=2)
    for b in range(5):
        pool.give(make_block(b))
    assert pool.free_bytes <= 3 * N * 16
    assert len(pool._free[(np.dtype(np.float32).str, (N, 4))]) <= 2
    pool.clear()
    assert pool.free_bytes == 0 and pool.take(np.float32, (N, 4)) is None
