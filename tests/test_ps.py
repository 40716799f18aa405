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
