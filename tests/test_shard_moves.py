"""A shard's table with model blocks moved into it: each block is kept as it
arrived and served at once, checked on arrival, and merged into the sorted
table later in steps (between requests) or at once where the flat arrays are
read. Every state answers as one sorted table would."""
from __future__ import annotations

import contextlib
import time

import numpy as np
import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from harmony.ps.client import PSClient
from harmony.ps.keymap import block_of
from harmony.ps.server import ShardServer, ShardTable
from harmony.store.transfer import Payload, send_payloads, wait_acks

NB, DIM = 8, 3


def _blocks(nkeys: int = 400, seed: int = 0) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    keys = np.arange(0, 3 * nkeys, 3, dtype=np.int64)
    bids = block_of(keys, NB)
    rng = np.random.default_rng(seed)
    return {b: (keys[bids == b], rng.random(((bids == b).sum(), DIM)).astype(np.float32))
            for b in range(NB)}


def _table(base: list[int], blocks, nblocks=NB, update=None) -> ShardTable:
    t = ShardTable(DIM, "float32", update, nblocks=nblocks)
    k = np.concatenate([blocks[b][0] for b in base] or [np.zeros(0, np.int64)])
    r = np.concatenate([blocks[b][1] for b in base] or [np.zeros((0, DIM), np.float32)])
    t.load(k, r)
    return t


def _reference(blocks, held) -> tuple[np.ndarray, np.ndarray]:
    k = np.concatenate([blocks[b][0] for b in held])
    r = np.concatenate([blocks[b][1] for b in held])
    o = np.argsort(k)
    return k[o], r[o].copy()


def test_moved_blocks_are_kept_as_they_came_and_served_at_once():
    blocks = _blocks()
    t = _table([0, 1, 2], blocks)
    moved = {b: (blocks[b][0].copy(), blocks[b][1].copy()) for b in (3, 5, 6)}
    for b, (k, r) in moved.items():
        t.add_rows(k, r, b)
    assert t.moved_blocks == 3 and t.merges == 0
    assert t._runs[0][2] is moved[3][1]            # no copy: the arrays themselves
    keys, rows = _reference(blocks, [0, 1, 2, 3, 5, 6])
    with t.lock:
        assert np.array_equal(t.pull(keys), rows)                  # every part at once
        sub = keys[::7]
        assert np.array_equal(t.pull(sub), rows[::7])
        one = blocks[5][0][2:9]                                     # one moved block
        assert np.array_equal(t.pull(one), blocks[5][1][2:9])
        t.push(sub, np.ones((len(sub), DIM), np.float32))
        rows[::7] += 1
        assert np.array_equal(t.pull(keys), rows)
        with pytest.raises(KeyError, match=r"2 key\(s\) not owned"):
            t.pull(np.array([keys[0], 1, keys[5], 4]))              # 1 and 4: not held
        with pytest.raises(ValueError, match="duplicate keys in one pull"):
            t.pull(np.array([blocks[3][0][0], blocks[0][0][0], blocks[3][0][0]]))
        with pytest.raises(ValueError, match="duplicate keys in one push"):
            t.push(np.array([blocks[3][0][0], blocks[0][0][0], blocks[3][0][0]]),
                   np.ones((3, DIM), np.float32))
        assert np.array_equal(t.pull(keys), rows)                   # refused: unchanged
        held = t.holds(np.array([blocks[6][0][0], 1, blocks[1][0][0], blocks[7][0][0]]))
        assert held.tolist() == [True, False, True, False]
    assert t.moved_blocks == 3                                      # none of that merged
    # the flat view merges first
    assert np.array_equal(t.keys, keys) and np.array_equal(t.rows, rows)
    assert t.moved_blocks == 0 and t.merges == 1


def test_a_moved_block_is_checked_on_arrival():
    blocks = _blocks()
    t = _table([0, 1], blocks)
    with pytest.raises(ValueError, match="keys of other blocks"):
        t.add_rows(np.concatenate([blocks[3][0], blocks[4][0][:1]]),
                   np.zeros((len(blocks[3][0]) + 1, DIM), np.float32), 3)
    with pytest.raises(ValueError, match="already holds"):
        t.add_rows(*blocks[1], 1)                                   # in the sorted table
    t.add_rows(*blocks[3], 3)
    with pytest.raises(ValueError, match="already holds"):
        t.add_rows(*blocks[3], 3)                                   # moved twice
    with pytest.raises(ValueError, match="not one of the job's 8 blocks"):
        t.add_rows(np.zeros(0, np.int64), np.zeros((0, DIM), np.float32), 8)
    with pytest.raises(ValueError, match="shape"):
        t.add_rows(blocks[4][0], np.zeros((1, DIM), np.float32), 4)
    k, r = blocks[4]
    t.add_rows(k[::-1], r[::-1], 4)                                 # out of order: sorted
    with t.lock:
        assert np.array_equal(t.pull(k), r)
    assert t.moved_blocks == 2


def test_without_a_block_count_moved_rows_merge_at_the_next_lookup():
    """As before blocks were kept: nothing to route by."""
    blocks = _blocks()
    t = _table([0], blocks, nblocks=None)
    t.add_rows(*blocks[2], 2)
    t.add_rows(*blocks[4])
    assert t.moved_blocks == 2
    with t.lock:
        assert np.array_equal(t.pull(blocks[4][0]), blocks[4][1])
    assert t.moved_blocks == 0 and t.merges == 1
    t.add_rows(*blocks[4])                                          # held already
    with pytest.raises(ValueError, match="already holds"), t.lock:
        t.pull(blocks[0][0])
    with t.lock:                                                    # dropped, as before
        assert np.array_equal(t.pull(blocks[4][0]), blocks[4][1])


def test_the_merge_runs_in_steps_and_keeps_pushes_made_between_them():
    blocks = _blocks(nkeys=3000)
    t = _table([0, 1, 2, 3], blocks)
    t.MERGE_STEP_BYTES = 2000                     # many small steps
    for b in (4, 5, 6, 7):
        t.add_rows(blocks[b][0].copy(), blocks[b][1].copy(), b)
    keys, rows = _reference(blocks, range(NB))
    rng = np.random.default_rng(1)
    steps = 0
    with t.lock:
        while t.merge_step():
            steps += 1
            sub = np.sort(rng.choice(keys, 50, replace=False))
            d = rng.random((50, DIM)).astype(np.float32)
            t.push(sub, d)
            rows[np.searchsorted(keys, sub)] += d
            assert np.array_equal(t.pull(keys), rows)
    assert steps > 5 and t.moved_blocks == 0 and t.merges == 1
    assert np.array_equal(t.keys, keys) and np.array_equal(t.rows, rows)
    assert t.rows.flags.c_contiguous and t.live(t.pull(keys))     # the zero-copy path again


def test_a_new_block_or_a_load_drops_a_merge_under_way():
    blocks = _blocks(nkeys=3000)
    t = _table([0, 1], blocks)
    t.MERGE_STEP_BYTES = 2000
    t.add_rows(*blocks[2], 2)
    with t.lock:
        assert t.merge_step()
        t.add_rows(*blocks[3], 3)                 # arrives mid-merge: merged again later
        assert t._merge is None
        t.settle()
    keys, rows = _reference(blocks, [0, 1, 2, 3])
    assert np.array_equal(t.keys, keys) and np.array_equal(t.rows, rows)
    t.add_rows(*blocks[4], 4)
    with t.lock:
        assert t.merge_step()
    t.load(*blocks[5])
    assert t.moved_blocks == 0 and np.array_equal(t.keys, blocks[5][0])


def test_an_apps_update_sees_every_row_of_a_push_at_once():
    blocks = _blocks()
    calls = []

    def update(cur, d):
        calls.append(len(cur))
        return np.maximum(cur + d, 0.5)
    t = _table([0, 1], blocks, update=update)
    t.add_rows(*[a.copy() for a in blocks[2]], 2)
    keys, rows = _reference(blocks, [0, 1, 2])
    with t.lock:
        t.push(keys, np.full((len(keys), DIM), -0.2, np.float32))
        assert calls == [len(keys)]
        assert np.allclose(t.pull(keys), np.maximum(rows - 0.2, 0.5))


def test_take_blocks_hands_moved_blocks_back_without_a_copy():
    blocks = _blocks()
    t = _table([0, 1, 2], blocks)
    t.add_rows(*blocks[5], 5)
    t.add_rows(*blocks[6], 6)
    base_rows = t._rows
    out = t.take_blocks({5}, NB)
    assert out[5]["rows"] is blocks[5][1] and t._rows is base_rows   # nothing else copied
    out = t.take_blocks({1, 6, 7}, NB)
    assert out[6]["rows"] is blocks[6][1]
    assert np.array_equal(out[1]["keys"], blocks[1][0]) and np.array_equal(out[1]["rows"],
                                                                          blocks[1][1])
    assert len(out[7]["keys"]) == 0 and out[7]["rows"].shape == (0, DIM)
    keys, rows = _reference(blocks, [0, 2])
    assert t.moved_blocks == 0
    assert np.array_equal(t.keys, keys) and np.array_equal(t.rows, rows)


def test_spill_merges_first(tmp_path):
    class Store(dict):
        def put(self, blk):
            self[blk.id] = blk

        def get(self, i):
            return self[i]
    blocks = _blocks()
    t = _table([0], blocks)
    t.attach_spill(Store())
    t.add_rows(*blocks[1], 1)
    keys, rows = _reference(blocks, [0, 1])
    assert t.spill(chunk_bytes=512) == rows.nbytes and t.moved_blocks == 0
    t.add_rows(*blocks[2], 2)                     # while spilled
    k2, r2 = _reference(blocks, [0, 1, 2])
    with t.lock:
        assert np.array_equal(t.pull(k2), r2) and not t.spilled


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_any_sequence_of_moves_requests_and_merge_steps_answers_as_one_table(data):
    blocks = _blocks(nkeys=300, seed=data.draw(st.integers(0, 3)))
    base = data.draw(st.sets(st.integers(0, NB - 1), max_size=NB))
    t = _table(sorted(base), blocks)
    t.MERGE_STEP_BYTES = data.draw(st.sampled_from([300, 4000, 1 << 20]))
    ref = {int(k): r.copy() for b in base for k, r in zip(*blocks[b])}
    for _ in range(data.draw(st.integers(1, 12))):
        op = data.draw(st.sampled_from(["move", "pull", "push", "step", "take"]))
        with t.lock:
            if op == "move":
                b = data.draw(st.integers(0, NB - 1))
                if any(int(k) in ref for k in blocks[b][0]):
                    with pytest.raises(ValueError):
                        t.add_rows(*blocks[b], b)
                else:
                    t.add_rows(blocks[b][0].copy(), blocks[b][1].copy(), b)
                    ref.update({int(k): r.copy() for k, r in zip(*blocks[b])})
            elif op in ("pull", "push") and ref:
                ks = np.array(sorted(data.draw(st.sets(st.sampled_from(sorted(ref)),
                                                       min_size=1))), np.int64)
                if op == "pull":
                    assert np.array_equal(t.pull(ks), np.array([ref[int(k)] for k in ks]))
                else:
                    d = np.full((len(ks), DIM), 0.25, np.float32)
                    t.push(ks, d)
                    for k in ks:
                        ref[int(k)] = ref[int(k)] + 0.25
            elif op == "step":
                t.merge_step()
            elif op == "take":
                gone = data.draw(st.sets(st.integers(0, NB - 1), max_size=3))
                out = t.take_blocks(gone, NB)
                for b, blk in out.items():
                    for k, r in zip(blk["keys"], blk["rows"]):
                        assert np.array_equal(ref.pop(int(k)), r)
                assert set(out) == gone
                left = np.array(sorted(ref), np.int64)
                assert not np.isin(block_of(left, NB), sorted(gone)).any()
    ks = np.array(sorted(ref), np.int64)
    with t.lock:
        if len(ks):
            assert np.array_equal(t.pull(ks), np.array([ref[int(k)] for k in ks]))
    assert np.array_equal(t.keys, ks)
    assert np.array_equal(t.rows, np.array([ref[int(k)] for k in ks]).reshape(-1, DIM))


@contextlib.contextmanager
def _moved_shard(mid, gate=None):
    """A shard holding blocks 0 and 1 into which blocks 2.. were moved (every
    block acknowledged, the move not declared over), and a client of it;
    ``gate``: the merge's MERGE_IDLE_S and MERGE_EVERY_S."""
    ctx = zmq.Context()
    blocks = _blocks(nkeys=20000)
    t = _table([0, 1], blocks)
    srv = ShardServer(ctx, "127.0.0.1", t)
    if gate is not None:
        srv.MERGE_IDLE_S = srv.MERGE_EVERY_S = gate
    srv.start()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(srv.endpoint)
    client = PSClient(ctx, [srv.endpoint], np.zeros(NB, np.int64), DIM)
    try:
        srv.set_layout(np.zeros(NB, np.int64), 0, [srv.endpoint])
        srv.expect(set(range(2, NB)))
        payloads = [Payload("model", b, block=_blk(b, blocks)) for b in range(2, NB)]
        send_payloads([sock], mid, payloads)
        wait_acks(lambda d: sock, {(0, "model", b) for b in range(2, NB)}, mid, 10)
        yield t, srv, client, blocks
    finally:
        client.close()
        sock.close(0)
        srv.stop()
        ctx.term()


def test_a_shard_serves_a_move_at_once_and_merges_it_once_the_move_is_over():
    with _moved_shard("mv:t") as (t, srv, client, blocks):
        keys, rows = _reference(blocks, range(NB))
        assert np.array_equal(client.pull(keys), rows)        # served before any merge
        time.sleep(0.2)
        assert t.moved_blocks == NB - 2                       # the move is not over: kept
        client.push(keys[::3], np.ones((len(keys[::3]), DIM), np.float32))
        rows[::3] += 1
        srv.end_arrivals()
        deadline = time.monotonic() + 10
        while t.moved_blocks and time.monotonic() < deadline:
            assert np.array_equal(client.pull(keys), rows)    # during the merge too
        assert t.moved_blocks == 0 and t.merges == 1
        assert np.array_equal(client.pull(keys), rows)
        assert np.array_equal(t.keys, keys)


def test_the_merge_waits_for_a_pause_in_requests_and_is_not_starved_by_them():
    """After the move the merge's steps (each holds the table) run once no
    request came for MERGE_IDLE_S, so the first pull after a move does not
    wait behind one; requests that never pause still let a step run every
    MERGE_EVERY_S. Gates of an hour and of none make it deterministic."""
    with _moved_shard("mv:g", gate=3600.0) as (t, srv, client, blocks):
        keys, rows = _reference(blocks, range(NB))
        srv.end_arrivals()
        assert np.array_equal(client.pull(keys), rows)
        time.sleep(0.3)
        assert t.moved_blocks == NB - 2 and t.merges == 0      # no pause long enough yet
        srv.MERGE_EVERY_S = 0.0                 # a step between any two requests
        srv.end_arrivals()                      # (wakes the shard's thread)
        deadline = time.monotonic() + 10
        while t.moved_blocks and time.monotonic() < deadline:
            assert np.array_equal(client.pull(keys), rows)     # requests without a pause
        assert t.moved_blocks == 0 and t.merges == 1
        assert np.array_equal(client.pull(keys), rows)


def _blk(b, blocks):
    from harmony.store.blocks import Block
    return Block(b, {"keys": blocks[b][0], "rows": blocks[b][1]})
