"""The data service's receiving side on disk (no cluster): whole payloads
of a transfer never closed go to spool files, not memory, under bounds on
the index, the disk and idle time (injected clock and free-space figure);
a real data service still writes replicas and staged chunks from them,
answers with the same digests, and refuses cleanly when its disk is full."""
from __future__ import annotations

import gc
import hashlib
import os
import tracemalloc

import msgpack
import numpy as np
import pytest
import zmq

from harmony.comm import messages as M
from harmony.store import spool as sp
from harmony.store.blocks import Block, export_block
from harmony.store.spool import Spool
from harmony.store.transfer import Payload, TransferError, chunk_digest, chunk_messages
from harmony.worker import dataservice, jobckpt
from test_hardening import fill_disk, small_fs  # noqa: F401  (a fixture)

MiB = 1 << 20


def _msgs(mid: str, p: Payload, chunk: int = MiB) -> list[M.Message]:
    return [M.decode([h, bytes(d)]) for h, d in chunk_messages(mid, p, chunk)]


def _raw(mid: str, bid: int, data: bytes, size: int | None = None) -> M.Message:
    return M.decode([M.encode("blk", mid=mid, sec="model", bid=bid, arr=0, narr=1, off=0,
                              size=len(data) if size is None else size, h=chunk_digest(data),
                              head=msgpack.packb({"raw": True})), data])


def _files(root) -> list[str]:
    return sorted(os.listdir(root))


def test_payloads_never_closed_go_to_disk_and_expire(tmp_path):
    """40 whole 2 MiB payloads (80 MiB, each in 1 MiB chunks) of a transfer
    whose end never comes: Python holds well under a MiB for them (the
    index), the spool file holds them, and the idle timeout deletes it."""
    root = tmp_path / "spool"
    (root / "t99").parent.mkdir()
    (root / "t99").write_bytes(b"left by a previous run")
    s = Spool(str(root), idle_s=60)
    assert _files(root) == []                      # the previous run's spool is gone
    data = os.urandom(2 * MiB)
    msgs = [m for bid in range(40) for m in _msgs("rep:held", Payload("model", bid, data))]
    gc.collect()
    tracemalloc.start()
    try:
        done = [s.add(m, now=100.0) for m in msgs]
        now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [d for d in done if d] == [("rep:held", "model", b, 2 * MiB) for b in range(40)]
    assert peak < MiB and now < 256 << 10, (now, peak)
    assert s.held == sp.TRANSFER_COST + 8 + 40 * (sp.ENTRY_COST + 5) <= sp.MAX_HELD_BYTES
    # the charges are above what the index really takes
    assert now < s.held, (now, s.held)
    assert s.spooled == 80 * MiB and len(_files(root)) == 1
    assert os.path.getsize(root / _files(root)[0]) == 80 * MiB
    # another transfer half-sent: its region is reserved, half written
    half = _msgs("rep:half", Payload("model", 0, data))
    assert s.add(half[0], now=130.0) is None
    assert s.spooled == 82 * MiB and len(_files(root)) == 2
    assert s.expire(now=159.0) == []                     # idle 59 s: kept
    assert s.expire(now=161.0) == ["rep:held"]           # 61 s: dropped, file deleted
    assert len(_files(root)) == 1 and s.spooled == 2 * MiB
    assert s.expire(now=191.0) == ["rep:half"]
    assert _files(root) == [] and s.held == 0 and s.spooled == 0 and not s.transfers


def test_a_closed_transfer_is_read_back_block_by_block(tmp_path):
    root = tmp_path / "spool"
    s = Spool(str(root))
    blocks = {("model", 3): os.urandom(3 * MiB + 5), ("input", 1): b"", ("model", 0): b"ab",
              ("input", 7): os.urandom(70_000)}
    # interleaved chunks of several payloads, as send_payloads sends them
    its = [iter(_msgs("rep:a", Payload(sec, bid, d))) for (sec, bid), d in blocks.items()]
    while its:
        for it in list(its):
            m = next(it, None)
            if m is None:
                its.remove(it)
            else:
                s.add(m)
    with s.take("rep:a") as got:
        assert len(got) == 4 and s.held == 0 and s.spooled == 0 and not s.transfers
        assert {k: got[k] for k in got} == blocks
        assert {b: bytes(r.read(0, r.size)) for b, r in got.section("model").items()} == \
            {0: b"ab", 3: blocks[("model", 3)]}
        assert list(got.section("input")) == [1, 7]
    assert _files(root) == []
    # an unknown transfer is empty; one with only half a payload too
    assert len(s.take("rep:none")) == 0
    s.add(_msgs("rep:b", Payload("model", 0, os.urandom(2 * MiB)))[0])
    assert len(s.take("rep:b")) == 0 and _files(root) == []


def test_bad_chunks_are_refused_and_the_caller_drops_the_transfer(tmp_path):
    root = tmp_path / "spool"
    s = Spool(str(root))
    ok = _msgs("rep:x", Payload("model", 0, os.urandom(2 * MiB)))
    s.add(ok[0])
    s.add(ok[1])
    with pytest.raises(TransferError, match="twice"):
        s.add(ok[0])
    blk = _msgs("rep:x", Payload("input", 0, block=Block(0, {"a": np.zeros(4, np.int64)})))
    with pytest.raises(TransferError, match="not as exported bytes"):
        s.add(blk[0])
    second = _msgs("rep:x", Payload("model", 1, os.urandom(2 * MiB)))
    with pytest.raises(TransferError, match="first chunk"):
        s.add(second[1])
    s.add(second[0])
    with pytest.raises(TransferError, match="out of order"):
        s.add(second[0])                              # its first chunk again
    bad = _raw("rep:x", 2, b"1234")
    bad.fields["h"] ^= 1
    with pytest.raises(TransferError, match="corrupt"):
        s.add(bad)
    s.drop("rep:x")
    assert _files(root) == [] and s.held == 0 and s.spooled == 0


def test_the_index_budget_and_the_disk_share_are_enforced(tmp_path):
    root = tmp_path / "spool"
    s = Spool(str(root), max_held=sp.TRANSFER_COST + 5 + 3 * (sp.ENTRY_COST + 5))
    for bid in range(3):
        s.add(_raw("rep:a", bid, b"x"))
    with pytest.raises(TransferError, match="too many"):
        s.add(_raw("rep:a", 3, b"x"))
    s.drop("rep:a")
    # a flood of tiny payloads, in many transfers, with long section names:
    # refused once the index reaches its budget, which it does not outgrow
    s = Spool(str(root), max_held=2 * MiB)
    msgs = [M.decode([M.encode("blk", mid=f"rep:{i % 50}", sec="s" * (i % 3000), bid=i,
                               arr=0, narr=1, off=0, size=1, h=chunk_digest(b"x"),
                               head=msgpack.packb({"raw": True})), b"x"])
            for i in range(20_000)]
    gc.collect()
    tracemalloc.start()
    try:
        with pytest.raises(TransferError, match="too many"):
            for m in msgs:
                s.add(m)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held < s.held <= 2 * MiB, (held, s.held)
    s.close()
    free = {"n": 100 * MiB}
    s = Spool(str(root), free_bytes=lambda p: free["n"])
    s.add(_raw("rep:a", 0, b"x" * MiB, size=40 * MiB))   # 40 of (100 + 0) / 2: taken
    free["n"] -= 40 * MiB
    with pytest.raises(TransferError, match="spool full"):
        s.add(_raw("rep:b", 0, b"x" * MiB, size=11 * MiB))   # 51 > (60 + 40) / 2
    s.drop("rep:b")
    s.add(_raw("rep:b", 0, b"x" * MiB, size=10 * MiB))       # 50: just fits
    s.close()
    assert not root.exists()


def test_a_disk_that_cannot_take_the_reservation_refuses_it(small_fs):  # noqa: F811
    """With the share check out of the way (a disk said to have 1 TiB
    free), a full disk is met by posix_fallocate at the payload's first
    chunk: a clear refusal."""
    s = Spool(str(small_fs / "spool"), free_bytes=lambda p: 1 << 40)
    filler = fill_disk(small_fs)
    try:
        with pytest.raises(TransferError, match="spool full: no room on disk"):
            s.add(_raw("rep:a", 0, b"x" * 4096, size=MiB))
        s.drop("rep:a")
        assert _files(small_fs / "spool") == [] and s.spooled == 0 and s.held == 0
    finally:
        os.unlink(filler)


# -- a real data service -------------------------------------------------------------------
@pytest.fixture
def service(tmp_path):
    ctx = zmq.Context()
    svc = dataservice.DataService(ctx, "127.0.0.1", str(tmp_path / "state"), "m0")
    svc.start()
    try:
        yield ctx, svc
    finally:
        svc.stop()
        ctx.term()


def _part(seed: int, n: int, big: int) -> list[Payload]:
    rng = np.random.default_rng(seed)
    out = [Payload("model", b, export_block(Block(b, {"keys": np.arange(4, dtype=np.int64),
                                                     "rows": rng.random((big if b == 0 else 4,
                                                                         8))})))
           for b in range(n)]
    return out + [Payload("input", 5, export_block(Block(5, {"u": rng.random(100)})))]


def test_a_replica_round_trip_writes_the_part_from_the_spool(service, tmp_path):
    """A part with a block of three chunks: the holder writes it from its
    spool, its digest matches the one written here, and nothing is left in
    the spool."""
    ctx, svc = service
    assert svc.sock.getsockopt(zmq.RCVHWM) == dataservice.RCV_HWM     # paced, not queued
    payloads = _part(1, 6, 400_000)                    # block 0: ~25 MiB
    assert max(p.size for p in payloads) > 3 * dataservice.CHUNK_BYTES
    _, want = jobckpt.write_payloads(str(tmp_path / "mine"), "job-1", payloads, epoch=3,
                                     iteration=9)
    jobckpt.replicate(ctx, svc.endpoint, "job-1", 0, 3, 9, payloads, want, timeout_s=30)
    info, got = jobckpt.fetch_part(ctx, svc.endpoint, "job-1", 3, 0, lambda s, b: True,
                                   timeout_s=30)
    assert info["epoch"] == 3 and len(got) == len(payloads)
    assert got[("model", 0)]["rows"].shape == (400_000, 8)
    assert os.listdir(svc.spool.root) == [] and svc.spool.held == 0


def test_staged_chunks_answer_the_same_digest(service):
    from harmony.store import staging
    ctx, svc = service
    chunks = [(0, b"a,b\n" * 1000), (1, os.urandom(9 * MiB))]
    staging.push_chunks(ctx, svc.endpoint, "ds", chunks)       # checks blk_done ok
    assert [svc.chunks.get("ds", i) for i, _ in chunks] == [d for _, d in chunks]
    # the digest the client is answered with is the one it computes
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.SNDTIMEO, 5000)
    s.connect(svc.endpoint)
    try:
        for m in chunk_messages("stage:x", Payload("data", 4, b"line\n")):
            s.send_multipart(list(m))
        assert s.poll(5000) and M.decode(s.recv_multipart())["ok"]
        s.send(M.encode("blk_end", mid="stage:x", count=1, meta={"kind": "stage",
                                                                 "dataset": "ds2"}))
        assert s.poll(5000)
        r = M.decode(s.recv_multipart())
        assert r["ok"] and bytes(r["digest"]) == jobckpt.entries_digest(
            [("data", 4, hashlib.sha256(b"line\n").digest())])
    finally:
        s.close(0)


def test_a_full_disk_refuses_the_transfer_and_the_service_lives(small_fs, tmp_path):  # noqa: F811
    """The state dir on a 32 MiB tmpfs: a replica larger than the spool's
    share is refused at its first chunk (blk_ack ok=False, with the
    reason); on a disk filled up, even a small one is; the service then
    still stores what fits once there is room, and keeps no spool file."""
    ctx = zmq.Context()
    svc = dataservice.DataService(ctx, "127.0.0.1", str(small_fs / "state"), "m0")
    svc.start()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.SNDTIMEO, 5000)
    s.connect(svc.endpoint)

    def send(mid: str, p: Payload) -> M.Message:
        s.send_multipart(list(next(chunk_messages(mid, p))))
        assert s.poll(5000)
        return M.decode(s.recv_multipart())
    try:
        r = send("rep:big", Payload("model", 0, os.urandom(20 * MiB)))
        assert r.type == "blk_ack" and not r["ok"] and "spool full" in r["error"], r.fields
        filler = fill_disk(small_fs)
        r = send("rep:small", Payload("model", 0, os.urandom(64 << 10)))
        assert r.type == "blk_ack" and not r["ok"] and "spool full" in r["error"], r.fields
        assert os.listdir(svc.spool.root) == []
        # the end of a transfer that cannot be written: blk_done ok=False
        os.truncate(filler, os.path.getsize(filler) - 256 * 1024)
        ok = send("rep:ok", Payload("model", 0, export_block(Block(0, {"a": np.zeros(8)}))))
        assert ok["ok"], ok.fields
        fill_disk(small_fs)                                          # full again
        s.send(M.encode("blk_end", mid="rep:ok", count=1, meta={"job": "j", "epoch": 1,
                                                                "index": 0}))
        assert s.poll(10_000)
        r = M.decode(s.recv_multipart())
        assert r.type == "blk_done" and not r["ok"] and r["error"], r.fields
        assert os.listdir(svc.spool.root) == []
        os.unlink(filler)
        for p in small_fs.iterdir():
            if p.name.startswith("filler"):
                p.unlink()
        from harmony.store import staging
        staging.push_chunks(ctx, svc.endpoint, "after", [(0, b"x\n" * 100)])
        assert svc.chunks.get("after", 0) == b"x\n" * 100
        assert svc._thread.is_alive()
    finally:
        s.close(0)
        svc.stop()
        ctx.term()
