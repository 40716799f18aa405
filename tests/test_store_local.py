"""LocalInput (one job's input blocks on a machine, in memory or in LMDB) and
the model shard's spill, without processes."""
import threading

import numpy as np
import pytest

from harmony.ps.server import ShardTable
from harmony.store.blocks import Block
from harmony.store.errors import StoreError, StoreFullError
from harmony.store.lmdb_store import JobStorage
from harmony.store.local import BlockSeq, LocalInput, SpillDisabledError, digests


def blocks(n: int = 8, size: int = 2000) -> list[Block]:
    return [Block(b, {"x": np.arange(size, dtype=np.float64) + b,
                      "L": np.full((10, 2), float(b), dtype=np.float32)}) for b in range(n)]


@pytest.fixture
def storage(tmp_path):
    st = JobStorage(str(tmp_path), "job-l")
    yield st
    st.close()


@pytest.fixture
def inp(storage):
    li = LocalInput(storage.input)
    li.ingest(blocks())
    li.set_groups(2)
    return li


def run_pass(view, fn):
    try:
        for blk in view:
            fn(blk)
    finally:
        if isinstance(view, BlockSeq):
            view.close()


def test_placement_round_trip_keeps_every_byte(inp, storage):
    before = {b.id: digests(b.arrays) for b in blocks()}
    spilled, back = inp.set_alpha(0.5)
    assert len(spilled) == 4 and back == [] and inp.alpha == 0.5
    assert sorted(storage.input.ids()) == sorted(inp.on_disk)
    # each iteration's group gets its share of disk-blocks, never its first block
    for g in inp.groups:
        assert sum(b in inp.on_disk for b in g) == 2 and g[0] not in inp.on_disk
    assert {b.id: digests(b.arrays) for b in inp.iter_blocks()} == before
    spilled, back = inp.set_alpha(0.0)
    assert spilled == [] and len(back) == 4 and len(storage.input) == 0
    assert {b.id: digests(b.arrays) for b in inp.iter_blocks()} == before


def test_a_group_without_disk_blocks_is_a_plain_list(inp):
    inp.set_alpha(0.25)
    views = [inp.view(g) for g in inp.groups]
    assert isinstance(views[0], BlockSeq) or isinstance(views[1], BlockSeq)
    inp.set_alpha(0.0)
    v = inp.view(inp.groups[0])
    assert type(v) is list and [b.id for b in v] == inp.groups[0]


def test_changed_arrays_are_pinned_in_memory_and_never_lost(inp, storage):
    inp.set_alpha(1.0)
    for epoch in range(3):
        for g in inp.groups:
            run_pass(inp.view(g, prefetch=True), lambda b: b["L"].__iadd__(1.0))
    assert inp.pinned == {"L"}
    assert inp.residue_bytes() == 8 * 10 * 2 * 4          # only L stays in memory
    # each block was written again once, without L: reloads read only x
    t = inp.take_totals()
    assert t.rewrites == 8 and "L" not in storage.input.get(0).arrays
    for g in inp.groups:
        run_pass(inp.view(g), lambda b: b["L"].__iadd__(0.0))
    assert inp.take_totals().rewrites == 0
    for b in inp.iter_blocks():
        assert (b["L"] == b.id + 3).all() and b["x"][0] == b.id
    # LMDB holds only the immutable part after a new spill
    inp.set_alpha(0.0)
    inp.set_alpha(1.0)
    assert "L" not in storage.input.get(0).arrays
    assert (next(iter(inp.iter_blocks()))["L"] == 3).all()


def test_replaced_array_and_removed_array_are_kept(inp, storage):
    inp.set_alpha(1.0)

    def change(b):
        b["new"] = np.ones(3)           # added: pinned
        if b.id == 3:
            del b.arrays["x"]           # removed: the block is written again
    run_pass(inp.view(inp.ids()), change)
    got = {b.id: b for b in inp.iter_blocks()}
    assert "x" not in got[3].arrays and "x" in got[2].arrays
    assert all((b["new"] == 1).all() for b in got.values())
    assert "x" not in storage.input.get(3).arrays


def test_indexing_a_disk_block_loads_it_and_keeps_changes(inp):
    inp.set_alpha(1.0)
    seq = inp.view(inp.groups[0])
    assert len(seq) == 4 and seq[0].id == inp.groups[0][0]
    seq[1]["L"][:] = -7.0
    assert [b.id for b in seq[1:3]] == inp.groups[0][1:3]
    seq.close()
    assert (dict((b.id, b) for b in inp.iter_blocks())[inp.groups[0][1]]["L"] == -7).all()
    with pytest.raises(Exception, match="after its app call ended"):
        iter(seq)


def test_replace_by_id_reaches_disk_blocks(inp):
    inp.set_alpha(1.0)
    inp.replace(Block(5, {"x": np.zeros(4), "L": np.ones((1, 2), np.float32)}))
    got = {b.id: b for b in inp.iter_blocks()}
    assert got[5]["x"].tolist() == [0, 0, 0, 0] and got[5]["L"].shape == (1, 2)
    assert len(inp) == 8


def test_ingest_spills_beyond_the_limit_or_refuses(storage):
    li = LocalInput(storage.input)
    size = blocks()[0].nbytes
    li.ingest(blocks(), memory_limit=3 * size)
    # room is kept for the block in hand while one is written to disk
    assert len(li.memory) == 2 and len(li.on_disk) == 6
    li2 = LocalInput(None)
    seen = []

    def counted():
        for b in blocks():
            # what is in memory once the next block is made: never over the limit
            seen.append(li2.memory.total_bytes() + b.nbytes)
            yield b
    with pytest.raises(SpillDisabledError, match=r"budget X; spilling is disabled \(--no-spill\)"):
        li2.ingest(counted(), memory_limit=3 * size, spill=False, budget_note=" budget X")
    # refused while the block in hand still fits: no moment over the limit
    # for the daemon's OOM killer to catch before the job says why
    assert max(seen) <= 3 * size and len(li2.memory) == 2


def test_full_store_is_a_clear_error(tmp_path):
    st = JobStorage(str(tmp_path), "job-f", max_map_size=1 << 20)
    try:
        li = LocalInput(st.input)
        li.ingest(blocks(8, size=40000))
        li.set_groups(1)
        with pytest.raises(StoreFullError, match="store full: job job-f"):
            li.set_alpha(1.0)
        # what was placed stays consistent: every block still readable
        assert sorted(b.id for b in li.iter_blocks()) == list(range(8))
    finally:
        st.close()


def test_model_shard_spill_and_reload_on_demand(storage):
    t = ShardTable(3, "float32", None)
    keys = np.arange(0, 20000, 2, dtype=np.int64)
    t.load(keys, np.arange(len(keys) * 3, dtype=np.float32).reshape(-1, 3))
    t.attach_spill(storage.model)
    ref = t.rows.copy()
    assert t.spill(chunk_bytes=4096) == ref.nbytes and t.spilled and t.rows is None
    assert t.spill() == 0                                  # already out
    with t.lock:
        got = t.pull(keys[5:9])                           # a pull brings it back
    assert not t.spilled and np.array_equal(got, ref[5:9]) and t.reloads == 1
    t.spill()
    with t.lock:
        t.push(keys[:2], np.ones((2, 3), np.float32))     # so does a push
    ref[:2] += 1
    t.spill()
    t.restore()
    assert np.array_equal(t.rows, ref) and t.spills == 3


def test_release_runs_on_the_reload_thread_only_for_disk_blocks(inp):
    inp.set_alpha(0.5)
    seen = []
    orig = inp._release

    def spy(b):
        seen.append((b.id, threading.current_thread().name))
        orig(b)
    inp._release = spy
    run_pass(inp.view(inp.ids()), lambda b: None)
    assert sorted(i for i, _ in seen) == sorted(inp.on_disk)
    assert {n for _, n in seen} == {"harmony-reload"}


def test_declared_input_is_handed_over_zero_copy_and_read_only(storage):
    li = LocalInput(storage.input, mutable=("L",))
    li.ingest(blocks())
    li.set_groups(2)
    li.set_alpha(1.0)
    before = {b.id: b["x"].copy() for b in blocks()}
    for epoch in range(3):
        for g in li.groups:
            def step(blk):
                assert not blk["x"].flags.writeable and not blk["x"].flags.owndata
                assert np.array_equal(blk["x"], before[blk.id])
                assert blk["L"].flags.writeable          # declared: pinned, in memory
                blk["L"] += 1.0
                with pytest.raises(ValueError, match="read-only"):
                    blk["x"][0] = -1.0
            run_pass(li.view(g), step)
    assert li.pinned == {"L"} and li.totals.rewrites == 0 and li.totals.pinned_now == 0
    assert not li._lingering
    for blk in li.iter_blocks():
        assert np.array_equal(blk["L"], np.full((10, 2), blk.id + 3.0, np.float32))
    # a view the app keeps past its block holds that block's snapshot: its
    # bytes stay exact while the store is rewritten, and its read txn ends
    # at a later release once the view is gone
    kept = []
    run_pass(li.view(li.groups[0]), lambda blk: kept.append(blk["x"][::2]))
    assert len(li._lingering) == len(li.groups[0])
    li.set_alpha(0.0)
    li.set_alpha(1.0)
    for v, bid in zip(kept, li.groups[0]):
        assert np.array_equal(v, before[bid][::2])
    del v
    kept.clear()
    run_pass(li.view(li.groups[1]), lambda blk: None)
    assert not li._lingering


def test_undeclared_input_is_copied_and_changes_are_found(storage):
    li = LocalInput(storage.input)
    li.ingest(blocks())
    li.set_groups(1)
    li.set_alpha(1.0)

    def step(blk):
        assert blk["x"].flags.writeable and blk.lease is None
        blk["x"][0] += 1.0
    run_pass(li.view(li.groups[0]), step)
    assert li.pinned == {"x"}


def test_declared_mutable_state_is_all_a_checkpoint_needs(storage):
    li = LocalInput(storage.input, mutable=("L",))
    li.ingest(blocks())
    li.set_groups(2)
    li.set_alpha(0.5)
    for g in li.groups:
        run_pass(li.view(g), lambda blk: blk["L"].__iadd__(1.0))
    loads = li.totals.disk_blocks
    state = list(li.mutable_state())
    assert li.totals.disk_blocks == loads            # nothing reloaded for it
    assert [b.id for b in state] == li.ids() and all(list(b.arrays) == ["L"] for b in state)
    assert all(np.array_equal(b["L"], np.full((10, 2), b.id + 1.0)) for b in state)
    # a resume: the input read again (L as first read), then the state merged
    with JobStorage(str(storage.dir) + "-2", "job-l2") as st2:
        li2 = LocalInput(st2.input, mutable=("L",))
        li2.ingest(blocks())
        li2.set_groups(2)
        li2.set_alpha(0.5)
        for b in state:
            li2.restore_state(b)
        for blk in li2.iter_blocks():
            assert np.array_equal(blk["L"], np.full((10, 2), blk.id + 1.0, np.float32))
            assert np.array_equal(blk["x"], np.arange(2000, dtype=np.float64) + blk.id)
        del blk
        li2.close()
    with pytest.raises(StoreError, match="declared mutable input"):
        next(LocalInput(storage.input).mutable_state())


def test_mutable_state_with_extra_arrays_reloads_them(storage):
    li = LocalInput(storage.input, mutable=("L",))
    li.ingest(blocks())
    li.set_groups(1)
    li.set_alpha(0.5)
    state = list(li.mutable_state(extra=("x",)))
    assert all(sorted(b.arrays) == ["L", "x"] for b in state)
    assert all(np.array_equal(b["x"], np.arange(2000, dtype=np.float64) + b.id) for b in state)
    del state
    li.close()
