"""The PS data plane over real ZeroMQ sockets on loopback."""
import msgpack
import numpy as np
import pytest
import zmq

from harmony.comm import messages as M
from harmony.ps.client import PSClient, PSError
from harmony.ps.keymap import block_of
from harmony.ps.server import ShardServer, ShardTable

NB, DIM, KEYS = 32, 4, 1000


@pytest.fixture
def shards():
    ctx = zmq.Context()
    owner = np.arange(NB) % 2
    keys = np.arange(KEYS)
    servers = []
    for s in range(2):
        table = ShardTable(DIM, "float32", lambda rows, d: np.maximum(rows + d, 0))
        mine = keys[owner[block_of(keys, NB)] == s]
        table.load(mine, np.tile(mine[:, None].astype(np.float32), (1, DIM)))
        srv = ShardServer(ctx, "127.0.0.1", table)
        srv.start()
        servers.append(srv)
    client = PSClient(ctx, [s.endpoint for s in servers], owner, DIM, timeout_s=5)
    yield client, servers, ctx
    client.close()
    for s in servers:
        s.stop()
    ctx.term()


def test_pull_returns_rows_in_key_order_across_shards(shards):
    client, servers, _ = shards
    keys = np.array([5, 999, 0, 17, 500, 1, 2, 3, 4, 6, 7])
    assert len(set(block_of(keys, NB) % 2)) == 2  # both shards are asked
    rows = client.pull(keys)
    assert rows.shape == (len(keys), DIM) and np.array_equal(rows[:, 0], keys.astype(np.float32))
    assert servers[0].requests > 0 and servers[1].requests > 0


def test_push_applies_update_function_per_key(shards):
    client, _, _ = shards
    keys = np.arange(0, KEYS, 7)
    deltas = np.full((len(keys), DIM), -10.0, dtype=np.float32)
    deltas[0] = 1.0
    client.push(keys, deltas)
    after = client.pull(keys)
    expect = np.maximum(keys[:, None].astype(np.float32) + deltas, 0)
    assert np.array_equal(after, expect)
    untouched = client.pull(np.array([1, 2, 3]))
    assert np.array_equal(untouched[:, 0], [1, 2, 3])
    # data bytes (a key and a row each) by direction, and per peer both
    row = 8 + DIM * 4
    assert client.push_bytes == len(keys) * row
    assert client.pull_bytes == (len(keys) + 3) * row
    assert sum(client.peer_bytes) == client.pull_bytes + client.push_bytes


def test_unknown_keys_and_bad_shapes_error_clearly(shards):
    client, servers, _ = shards
    with pytest.raises(PSError, match="not owned"):
        client.pull(np.array([KEYS + 5]))
    with pytest.raises(ValueError, match="shape"):
        client.push(np.array([1, 2]), np.zeros((3, DIM), dtype=np.float32))
    assert client.pull(np.array([3]))[0, 0] == 3  # shard still serving


def test_malformed_requests_get_error_replies(shards):
    _, servers, ctx = shards
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(servers[0].endpoint)
    try:
        for frames in ([b"garbage"],
                       [M.encode("pull", rid=4, n=3, tag=""), b"\x00" * 5],     # wrong frame size
                       [M.encode("push", rid=5, n=1, dim=DIM + 1, tag=""), b"\x00" * 8, b"\x00" * 20],
                       [msgpack.packb({"t": "cancel", "job": "x"})]):
            s.send_multipart(frames)
            assert s.poll(5000)
            reply = M.decode(s.recv_multipart())
            assert reply.type == "ps_error" and reply["message"]
        assert servers[0].errors == 4
    finally:
        s.close()


def test_dead_shard_times_out_with_clear_error():
    ctx = zmq.Context()
    c = PSClient(ctx, ["tcp://127.0.0.1:1"], np.zeros(4, dtype=np.int64), 2, timeout_s=0.3)
    try:
        with pytest.raises(PSError, match="not responding"):
            c.pull(np.array([1]))
    finally:
        c.close()
        ctx.term()


def test_the_own_shard_is_served_in_process_with_the_same_results(shards):
    """set_local: requests for this process's shard skip the ZeroMQ round trip
    (several thread wake-ups, each up to a time slice under load); the
    other shard is asked over the socket as before. Same rows, same update,
    same byte counts, the same errors."""
    client, servers, ctx = shards
    other = PSClient(ctx, [s.endpoint for s in servers], np.arange(NB) % 2, DIM, timeout_s=5)
    try:
        client.set_local(servers[0])
        keys = np.arange(0, KEYS, 3)
        deltas = np.full((len(keys), DIM), -100.0, dtype=np.float32)
        deltas[::2] = 0.5
        served = servers[0].requests
        client.push(keys, deltas)
        assert client.local_requests == 1 and servers[0].requests == served + 1
        assert np.array_equal(client.pull(keys), other.pull(keys))       # local vs socket
        assert np.array_equal(client.pull(keys),
                              np.maximum(keys[:, None].astype(np.float32) + deltas, 0))
        row = 8 + DIM * 4
        assert client.push_bytes == len(keys) * row
        with pytest.raises(PSError, match="duplicate keys in one pull"):
            client.pull(np.array([0, 0]))
        bad = np.full((len(keys), DIM), np.nan, dtype=np.float32)
        with pytest.raises(PSError, match="push refused: .* not finite"):
            client.push(keys, bad)
        # a key the shard does not hold: the shard's thread answers (an error here)
        mine = servers[0].table.keys
        servers[0].table.keys = mine[mine != 0]
        servers[0].table.rows = servers[0].table.rows[1:]
        with pytest.raises(PSError, match="not owned by this shard"):
            client.pull(np.array([0]))
    finally:
        other.close()


@pytest.mark.parametrize("update", [None, lambda rows, d: rows - 2 * d])
def test_a_planned_push_changes_nothing_until_its_write(update):
    """ShardTable.plan_push does every check and computes the new rows; the
    table changes only when its write runs (the shard acknowledges in
    between). Whole table in order, a subset, and a moved block's part."""
    t = ShardTable(3, "float32", update, nblocks=4)
    keys = np.arange(0, 40, 2)
    mine = keys[block_of(keys, 4) != 3]
    t.load(mine, np.ones((len(mine), 3), np.float32))
    moved = keys[block_of(keys, 4) == 3]
    t.add_rows(moved, np.full((len(moved), 3), 5, np.float32), 3)
    apply = (lambda r, d: r + d) if update is None else update
    for ks in (mine, mine[1::3], np.sort(np.concatenate([mine[::2], moved]))):
        d = np.random.default_rng(len(ks)).normal(size=(len(ks), 3)).astype(np.float32)
        before = t.pull(ks).copy()
        write = t.plan_push(ks, d)
        assert np.array_equal(t.pull(ks), before)       # nothing changed yet
        write()
        assert np.array_equal(t.pull(ks), apply(before, d))
    # a refused push raises from the plan: no write to run, nothing changed
    state = t.pull(mine).copy()
    bad = np.zeros((len(mine), 3), np.float32)
    bad[-1, 0] = np.inf
    with pytest.raises(ValueError, match="not finite"):
        t.plan_push(mine, bad)
    with pytest.raises(ValueError, match="duplicate keys"):
        t.plan_push(mine[[0, 1, 0]], np.zeros((3, 3), np.float32))
    with pytest.raises(KeyError):
        t.plan_push(np.array([1]), np.zeros((1, 3), np.float32))
    assert np.array_equal(t.pull(mine), state)


def test_a_push_is_acknowledged_only_under_the_table_lock(shards):
    """The shard acknowledges a push before writing it, but under the table
    lock it holds until the write is done: a reader that holds the lock
    (a checkpoint) keeps the ack back, and once the client has its ack
    every reader sees the push whole."""
    import threading
    client, servers, _ = shards
    t = servers[0].table
    keys = t.keys[:50].copy()
    before = client.pull(keys)
    done = threading.Event()
    with t.lock:
        th = threading.Thread(target=lambda: (client.push(keys, np.ones((50, DIM), np.float32)),
                                              done.set()))
        th.start()
        assert not done.wait(0.5)                       # no ack while a reader holds the lock
        assert np.array_equal(t.pull(keys), before)
    th.join(10)
    assert done.is_set()
    with t.lock:                                        # acked: the write is there
        assert np.array_equal(t.pull(keys), np.maximum(before + 1, 0))


def test_a_moved_block_read_and_written_whole_without_a_gather():
    """Every key of a moved block, in order, is a slice of its rows: a pull
    of just those is the block's own memory (``live``: the shard tracks the
    zero-copy reply before a push changes it), a push adds in place; mixed
    with other keys, the same rows come back as by key."""
    t = ShardTable(2, "float32", None, nblocks=4)
    keys = np.arange(40)
    mine = keys[block_of(keys, 4) != 1]
    t.load(mine, np.zeros((len(mine), 2), np.float32))
    moved = keys[block_of(keys, 4) == 1]
    rows = np.tile(moved[:, None].astype(np.float32), (1, 2))
    t.add_rows(moved, rows.copy(), 1)
    got = t.pull(moved)
    assert t.live(got) and np.array_equal(got, rows)
    assert not t.live(t.pull(moved[1:]))                 # a subset: a copy
    t.push(moved, np.ones((len(moved), 2), np.float32))
    t.push(keys, np.ones((40, 2), np.float32))           # both parts, one whole
    expect = np.zeros((40, 2), np.float32) + 1
    expect[moved] += rows + 1                            # pushed twice
    assert np.array_equal(t.pull(keys), expect)
    with pytest.raises(ValueError, match="duplicate"):
        t.push(np.sort(np.concatenate([keys, moved[:1]])), np.zeros((41, 2), np.float32))
    assert np.array_equal(t.pull(keys), expect)
