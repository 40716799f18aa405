"""The sealed data plane (harmony.comm.sealed): AES-256-GCM messages between a
job attempt's executors. A stranger's, a reader's, another attempt's, a
replayed, a reordered, an altered, a truncated and a misdirected message are
refused before anything is applied; a PS pull, push and block move work over
real sockets in both modes."""
import os

import numpy as np
import pytest
import zmq

from harmony.comm import sealed
from harmony.comm import security
from harmony.comm.sealed import DataKey, Party, SealError, sealed_socket, split_address
from harmony.ps.client import PSClient, PSError
from harmony.ps.keymap import block_of
from harmony.ps.server import ShardServer, ShardTable
from harmony.store.transfer import Payload, send_payloads, wait_acks

SECRET = "5e" * 16


def _key(mode="sealed", secret=SECRET, job="job-1", attempt=1):
    return DataKey.for_attempt(secret, job, attempt, mode)


def _msg():
    """A header, a 3-chunk frame, an empty frame and a small one (chunk 4096)."""
    return [b'{"t":"x"}', np.arange(2500, dtype=np.float32), b"", b"tail"]


def _same(inner, frames):
    assert [bytes(x) for x in inner] == [bytes(memoryview(f).cast("B")) if not
                                         isinstance(f, bytes) else f for f in frames]


@pytest.mark.parametrize("mode", ["sealed", "signed"])
def test_round_trip_in_records(mode):
    k = _key(mode)
    a, b = Party(k, chunk=4096), Party(k, chunk=4096)
    frames = _msg()
    recs = a.seal(b.id, frames)
    assert len(recs) >= 3                       # about one chunk a record
    frm, inner = b.open(recs)
    assert frm == a.id and b.opened == 1 and b.refused == 0
    _same(inner, frames)
    # the next message of the same sender is taken, an old one is not
    b.open(a.seal(b.id, frames))
    with pytest.raises(SealError, match="replayed"):
        b.open(recs)
    assert b.refused == 1


def test_sealed_hides_the_payload_and_signed_does_not():
    payload = b"the model's secret rows " * 200
    for mode, visible in (("sealed", False), ("signed", True)):
        k = _key(mode)
        a, b = Party(k), Party(k)
        wire = b"".join(bytes(memoryview(f).cast("B")) for rec in a.seal(b.id, [payload])
                        for f in rec)
        assert (payload[:64] in wire) is visible, mode
        assert SECRET.encode() not in wire and bytes.fromhex(SECRET) not in wire


def _keys_of_others(tmp_path):
    """Keys a stranger, a reader and another attempt would seal with."""
    d = security.init_keys(str(tmp_path / "keys"), workers=["m0"])
    reader = security.Keys.load(d, "reader", "reader")
    return {"stranger": DataKey(os.urandom(32)),
            # a reader holds a CurveZMQ key of the cluster, not the attempt's secret
            "reader": DataKey(sealed.attempt_key(reader.secret.decode(), "job-1", 1)),
            "other attempt": _key(attempt=2),
            "other job": _key(job="job-2")}


@pytest.mark.parametrize("mode", ["sealed", "signed"])
def test_strangers_readers_and_other_attempts_are_refused(tmp_path, mode):
    b = Party(_key(mode), chunk=4096)
    for who, k in _keys_of_others(tmp_path).items():
        k.mode, k.mode_byte = mode, sealed.MODES[mode]
        x = Party(k, chunk=4096)
        with pytest.raises(SealError, match="failed authentication"):
            b.open(x.seal(b.id, _msg()))
    assert b.refused == 4 and b.opened == 0
    # the refusals left no state: the real sender's first message is taken
    a = Party(_key(mode), chunk=4096)
    b.open(a.seal(b.id, _msg()))


def _flip(rec, i, pos=-1):
    out = [bytes(memoryview(f).cast("B")) for f in rec]
    b = bytearray(out[i])
    b[pos] ^= 1
    out[i] = bytes(b)
    return out


@pytest.mark.parametrize("mode", ["sealed", "signed"])
def test_altered_reordered_truncated_and_misdirected_messages_are_refused(mode):
    k = _key(mode)
    a, b, c = Party(k, chunk=4096), Party(k, chunk=4096), Party(k, chunk=4096)
    frames = _msg()

    def refused(recs, match):
        before = b.refused
        with pytest.raises(SealError, match=match):
            b.open(recs)
        assert b.refused == before + 1

    recs = a.seal(b.id, frames)
    refused([_flip(recs[0], 1)] + recs[1:], "failed authentication")      # a data byte
    refused([_flip(recs[0], 0, _HEAD_LEN_POS)] + recs[1:], "failed auth|wrong size|malformed")
    refused([recs[0], _flip(recs[1], len(recs[1]) - 1)] + recs[2:], "failed authentication")
    refused([recs[0], recs[2], recs[1]] + recs[3:], "out of place")       # reordered
    refused(recs[:-1], "ends before its last chunk")                     # truncated
    refused(a.seal(c.id, frames), "another party")                       # for c, not b
    if mode == "sealed":            # a header alone is not authenticated: not kept
        refused([[recs[0][0]]], "without a chunk")
    # the untouched original still opens: none of the above marked it seen
    _same(b.open(recs)[1], frames)
    # a later message then an earlier one of the same sender: the earlier is refused
    first, second = a.seal(b.id, frames), a.seal(b.id, frames)
    b.open(second)
    refused(first, "replayed or reordered")


_HEAD_LEN_POS = sealed._HEAD.size      # the first byte of the first frame's length


def test_a_signed_message_on_a_sealed_plane_is_refused():
    b = Party(_key("sealed"))
    with pytest.raises(SealError, match="signed message on a sealed data plane"):
        b.open(Party(_key("signed")).seal(b.id, [b"x"]))


def test_parties_never_share_a_key_and_nonce():
    k = _key()
    parties = [Party(k) for _ in range(50)]
    assert len({p.id for p in parties}) == 50
    p = parties[0]
    heads = [p.seal(parties[1].id, [b"x"])[0][0] for _ in range(3)]
    counters = [sealed._HEAD.unpack_from(h)[4] for h in heads]
    assert counters == sorted(set(counters))


def test_addresses():
    pid = os.urandom(16)
    assert split_address(sealed.join_address("tcp://h:1", pid)) == ("tcp://h:1", pid)
    assert split_address("tcp://h:1") == ("tcp://h:1", None)
    with pytest.raises(SealError, match="bad party id"):
        split_address("tcp://h:1#abc")


# -- over real sockets -------------------------------------------------------------

NB, DIM, KEYS = 16, 128, 6000


@pytest.fixture(params=["sealed", "signed"])
def sealed_shards(request):
    ctx = zmq.Context()
    key = _key(request.param)
    owner = np.arange(NB) % 2
    keys = np.arange(KEYS)
    servers = []
    for s in range(2):
        t = ShardTable(DIM, "float32", None)
        mine = keys[owner[block_of(keys, NB)] == s]
        t.load(mine, np.tile(mine[:, None].astype(np.float32), (1, DIM)))
        srv = ShardServer(ctx, "127.0.0.1", t, key=key)
        srv.start()
        servers.append(srv)
    client = PSClient(ctx, [s.endpoint for s in servers], owner, DIM, timeout_s=10, key=key)
    yield client, servers, ctx, key
    client.close()
    for s in servers:
        s.stop()
    ctx.term()


def test_pull_and_push_over_the_sealed_plane(sealed_shards):
    client, servers, _, _ = sealed_shards
    keys = np.arange(KEYS)              # 3 MB of rows: several records a shard
    rows = client.pull(keys)
    assert np.array_equal(rows[:, 0], keys.astype(np.float32))
    client.push(keys, np.ones((KEYS, DIM), np.float32))
    assert np.array_equal(client.pull(keys)[:, -1], keys + 1.0)
    assert all(s.refused == 0 and s.requests >= 3 for s in servers)
    assert all("#" in s.endpoint and s.tag == "" for s in servers)


def test_a_strangers_push_is_refused_and_changes_nothing(sealed_shards, tmp_path):
    client, servers, ctx, key = sealed_shards
    before = client.pull(np.arange(KEYS))
    for who, k in _keys_of_others(tmp_path).items():
        k.mode, k.mode_byte = key.mode, key.mode_byte
        other = PSClient(ctx, [s.endpoint for s in servers], np.arange(NB) % 2, DIM,
                         timeout_s=10, key=k)
        with pytest.raises(PSError, match="refused: failed authentication"):
            other.push(np.arange(KEYS), np.full((KEYS, DIM), 7, np.float32))
        other.close()
    assert np.array_equal(client.pull(np.arange(KEYS)), before)
    assert sum(s.refused for s in servers) >= 4


def test_plain_and_curve_peers_are_refused(sealed_shards, tmp_path):
    """A plain-text peer gets a refusal that names no secret; a reader's
    CurveZMQ key does not even complete a handshake with the shard."""
    client, servers, ctx, _ = sealed_shards
    from harmony.comm import messages as M
    srv = servers[0]
    before = client.pull(np.arange(KEYS))
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(srv.bound)
    s.send_multipart([M.encode("push", rid=1, n=1, dim=DIM, tag="job-1:1:"),
                      np.zeros(1, np.int64), np.full(DIM, 9, np.float32)])
    assert s.poll(5000)
    r = M.decode(s.recv_multipart())
    assert r.type == "ps_error" and r["message"].startswith("refused: not a sealed")
    assert SECRET not in r["message"] and "job-1" not in r["message"]
    s.close()
    reader = security.Keys.load(security.init_keys(str(tmp_path / "k")), "reader", "reader")
    from harmony.comm.zmqutil import make_socket
    s = make_socket(ctx, zmq.DEALER, keys=reader, timeout_s=1)
    s.connect(srv.bound)
    try:
        s.send_multipart([M.encode("pull", rid=1, n=1, tag=""), np.zeros(1, np.int64)])
    except zmq.Again:
        pass                            # no handshake: nothing sent
    assert not s.poll(500)
    s.close()
    assert np.array_equal(client.pull(np.arange(KEYS)), before)


def test_a_replayed_push_is_applied_once(sealed_shards):
    """Records of a genuine push, sent again on a new connection (as a
    reader of the wire would): refused; the rows moved once."""
    client, servers, ctx, key = sealed_shards
    from harmony.comm import messages as M
    srv = servers[0]
    ep, shard_id = split_address(srv.endpoint)
    k0 = srv.table.keys[:4].copy()
    before = client.pull(k0)
    me = Party(key)
    recs = me.seal(shard_id, [M.encode("push", rid=1, n=4, dim=DIM, tag=""), k0,
                              np.ones((4, DIM), np.float32)])
    replies = []
    for attempt in range(2):
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(ep)
        for r in recs:
            s.send_multipart([bytes(memoryview(f).cast("B")) for f in r])
        assert s.poll(5000)
        replies.append(s.recv_multipart())
        s.close()
    assert me.open([replies[0]])[1]                        # the first: a sealed ack
    assert b"replayed" in replies[1][0]                    # the second: refused
    assert np.array_equal(client.pull(k0), before + 1)
    assert srv.refused == 1


def test_a_signed_client_on_a_sealed_plane_is_told_why(sealed_shards):
    client, servers, ctx, key = sealed_shards
    other = "signed" if key.mode == "sealed" else "sealed"
    c = PSClient(ctx, [s.endpoint for s in servers], np.arange(NB) % 2, DIM, timeout_s=10,
                 key=DataKey(sealed.attempt_key(SECRET, "job-1", 1), other))
    with pytest.raises(PSError, match="must run the same --data-plane"):
        c.pull(np.arange(10))
    c.close()


@pytest.mark.parametrize("mode", ["sealed", "signed"])
def test_a_live_move_over_the_sealed_plane(mode):
    """Blocks move sealed to their new owner, a stale client is redirected
    (the new owner map names the shards' sealed addresses), pushes land
    once; a block chunk in plain text (with the tag a CurveZMQ shard wanted)
    is refused."""
    import threading
    import time
    from harmony.comm import messages as M
    ctx = zmq.Context()
    key = _key(mode)
    nblocks, dim = 8, 2
    keys = np.arange(40, dtype=np.int64)
    a, b = ShardTable(dim, "float64", None), ShardTable(dim, "float64", None)
    a.load(keys, np.tile(keys[:, None], (1, dim)).astype(float))   # a owns everything
    b.load(np.zeros(0, np.int64), np.zeros((0, dim)))
    sa, sb = ShardServer(ctx, "127.0.0.1", a, key=key), ShardServer(ctx, "127.0.0.1", b, key=key)
    sa.start(), sb.start()
    try:
        peers = [sa.endpoint, sb.endpoint]
        old = np.zeros(nblocks, np.int64)
        client = PSClient(ctx, peers, old, dim, "float64", key=key, timeout_s=10)
        sa.set_layout(old, 0, peers)
        np.testing.assert_array_equal(client.pull(keys)[:, 0], keys)
        new = old.copy()
        new[4:] = 1
        sb.expect(set(range(4, nblocks)))
        sb.set_layout(new, 1, peers)
        sa.set_layout(new, 0, peers)
        moving = a.take_blocks(set(range(4, nblocks)), nblocks)
        box = {}
        t = threading.Thread(target=lambda: box.update(rows=client.pull(keys)))
        t.start()
        plain = ctx.socket(zmq.DEALER)
        plain.setsockopt(zmq.LINGER, 0)
        plain.connect(sb.bound)
        plain.send_multipart([M.encode("blk", mid="mv:x", sec="model", bid=4, arr=0, narr=2,
                                       off=0, size=8, h=0, head=b"\x80", tag="job-1:1:"),
                              b"1" * 8])
        assert plain.poll(5000) and b"refused" in plain.recv_multipart()[0]
        plain.close()
        deadline = time.monotonic() + 10
        while client.redirects < 1:            # held at the new owner
            assert time.monotonic() < deadline and t.is_alive()
            time.sleep(0.01)
        ep, party = split_address(sb.endpoint)
        sock = sealed_socket(ctx, zmq.DEALER, key, peer=party, timeout_s=10)
        sock.connect(ep)
        payloads = [Payload("model", bb, block=blk) for bb, blk in moving.items()]
        send_payloads([sock], "mv:test", payloads)
        wait_acks(lambda d: sock, {(0, "model", bb) for bb in moving}, "mv:test", 10)
        t.join(10)
        np.testing.assert_array_equal(box["rows"][:, 0], keys)
        client.push(keys, np.ones((len(keys), dim)))
        np.testing.assert_array_equal(client.pull(keys)[:, 0], keys + 1)
        assert set(block_of(b.keys, nblocks)) == set(range(4, nblocks))
        assert sb.refused == 1 and sa.refused == 0
        sock.close(0)
        client.close()
    finally:
        sa.stop(), sb.stop()
        ctx.term()


def test_a_job_on_a_signed_data_plane_matches_the_sealed_default(cluster, client, ratings,
                                                                  tmp_path):
    """The same 2-machine NMF job on the default (sealed) data plane and on
    a cluster started with --data-plane signed: both finish, epoch by epoch
    the same objective."""
    from harmony.client import Client
    from harmony.cluster import LocalCluster
    from conftest import ISOLATE, NMF_APP, wait_state
    app = NMF_APP.read_text()
    args = ["--input", ratings, "--max-epochs", "3"]
    runs = {}
    signed = LocalCluster(2, str(tmp_path / "signed"), port=0, heartbeat_timeout=3.0,
                          isolate=ISOLATE, data_plane="signed")
    signed.start()
    try:
        assert all("signed" in p.args for p in signed.procs[1:])
        with Client(signed.endpoint, timeout_s=10) as c:
            for name, cl in (("sealed", client), ("signed", c)):
                job = cl.submit("nmf.py", app, args, machines=2)
                st = wait_state(cl, job, ("finished", "failed"))
                assert st["state"] == "finished", st["error"]
                runs[name] = [e["metrics"]["objective"] for e in st["epochs"]]
    finally:
        signed.stop()
    assert len(runs["sealed"]) == 3
    assert runs["signed"] == pytest.approx(runs["sealed"], rel=1e-5)


def test_pooled_buffers_are_not_reused_while_in_flight():
    """Sealed chunks' buffers come from a pool: three 12 MiB messages (3
    chunks each) queued unread in ZeroMQ, then read: each opens and is
    what was sent (a buffer reused in flight would fail authentication)."""
    ctx = zmq.Context()
    key = _key()
    router = sealed_socket(ctx, zmq.ROUTER, key)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    dealer = sealed_socket(ctx, zmq.DEALER, key, peer=router.party.id, timeout_s=10)
    dealer.connect(f"tcp://127.0.0.1:{port}")
    try:
        sent = [np.full(3 << 20, i, np.float32) for i in range(3)]
        for a in sent:
            dealer.send_multipart([b"h", a])
        got = []
        while len(got) < 3:
            assert router.poll(10000)
            try:
                got.append(router.recv_multipart())
            except zmq.Again:           # the rest of a message still coming
                continue
        for a, frames in zip(sent, got):
            assert np.array_equal(np.frombuffer(frames[2], np.float32), a)
        assert router.party.refused == 0 and sealed._POOL._held > 0
    finally:
        router.close(0)
        dealer.close(0)
        ctx.term()
