"""Blocks stored as pieces: a block of any size is written from a spool a
piece at a time (the spool's ranges punched out as they are committed),
read back whole only by restore, streamed range by range to a fetcher with
its SHA-256 checked as it goes; stores written before pieces (a checkpoint
manifest of format 1, a staged chunk as one value) still open, restore and
are served by a data service."""
from __future__ import annotations

import hashlib
import os
import time
import tracemalloc

import msgpack
import numpy as np
import pytest
import zmq

from harmony.store import staging
from harmony.store.blocks import Block, export_block
from harmony.store.checkpoint import CheckpointError, CheckpointStore, _block_desc, _dkey
from harmony.store.pieces import BytesSource, piece_key
from harmony.store.spool import Spooled, punch_hole
from harmony.store.staging import StagingError
from harmony.store.transfer import TransferError
from harmony.worker import jobckpt
from test_spool import service  # noqa: F401  (the fixture: a real data service)

KiB, MiB = 1 << 10, 1 << 20


def blocks(seed: int, sizes: list[int]) -> dict[int, Block]:
    rng = np.random.default_rng(seed)
    return {b: Block(b, {"keys": np.arange(n, dtype=np.int64), "rows": rng.random((n, 4))})
            for b, n in enumerate(sizes)}


def same(a: Block, b: Block) -> bool:
    return export_block(a) == export_block(b)


def write_format1(path: str, job: str, model: dict[int, Block], inputs: dict[int, Block],
                  epoch: int) -> None:
    """A checkpoint as the store wrote it before pieces: each block one
    value under ``version|section|block``, a manifest of format 1."""
    st = CheckpointStore.open(path, job, keep=1)
    try:
        entries = []

        def fn(txn):
            entries.clear()
            for sec, src in (("model", model), ("input", inputs)):
                for bid in sorted(src):
                    data = export_block(src[bid])
                    txn.put(_dkey(1, sec, bid), data, db=st._data)
                    entries.append([sec, bid, len(data), hashlib.sha256(data).digest(), "block",
                                    _block_desc(BytesSource(data))])
        st.env.write(fn, 1 << 20)
        doc = {"format": 1, "job": job, "version": 1, "epoch": epoch, "iteration": 0,
               "created": time.time(), "meta": {}, "blocks": entries,
               "num_blocks": len(entries), "total_bytes": sum(e[2] for e in entries)}
        packed = msgpack.packb(doc, use_bin_type=True)
        st._commit_manifest(1, packed + hashlib.sha256(packed).digest())
    finally:
        st.close()


def flip(st: CheckpointStore, key: bytes, at: int) -> None:
    def fn(txn):
        v = bytearray(txn.get(key, db=st._data))
        v[at] ^= 0x40
        txn.put(key, bytes(v), db=st._data)
    st.env.write(fn, 1 << 20)


def test_a_block_of_many_pieces_round_trips_and_each_piece_is_checked(tmp_path):
    m = blocks(1, [20_000, 3, 0])                      # ~480 KiB, tiny, empty
    st = CheckpointStore.open(str(tmp_path / "c"), "j", chunk_bytes=100 * KiB,
                              piece_bytes=64 * KiB)
    try:
        st.write(m, epoch=1, iteration=0)
        n = len(export_block(m[0]))
        keys = st.env.read(lambda txn: [bytes(k) for k in txn.cursor(db=st._data)
                                        .iternext(keys=True, values=False)])
        assert len([k for k in keys if k.startswith(_dkey(1, "model", 0))]) == -(-n // (64 * KiB))
        ck = st.restore()
        assert all(same(ck.blocks[b], m[b]) for b in m)
        ck.blocks[0]["rows"][0, 0] = 7.0               # restored arrays are the caller's
        assert st.verify(1).num_blocks == 3
        with st.stream(want=lambda s, b: b == 0) as (info, got):
            (sec, bid, src), = got
            data = b"".join(bytes(src.read(off, min(MiB, src.size - off)))
                            for off in range(0, src.size, MiB))
            assert (info.epoch, sec, bid, data) == (1, "model", 0, export_block(m[0]))

        flip(st, piece_key(_dkey(1, "model", 0), 3), 100)     # one byte of a middle piece
        with pytest.raises(CheckpointError, match=r"block 0 \[model\] checksum mismatch"):
            st.restore()
        with pytest.raises(CheckpointError, match="checksum mismatch"):
            st.verify(1)
        with st.stream(want=lambda s, b: b == 0) as (_, got):
            src = got[0][2]
            src.read(0, src.size - 1)                  # all but its last byte: not checked yet
            with pytest.raises(CheckpointError, match=r"block 0 \[model\] checksum mismatch"):
                src.read(src.size - 1, 1)
        st.env.write(lambda txn: txn.delete(piece_key(_dkey(1, "model", 0), 5), db=st._data), 0)
        with pytest.raises(CheckpointError, match=r"block 0 \[model\] missing \(piece 5\)"):
            with st.stream():
                pass
        assert same(st.restore(want=lambda s, b: b == 1).blocks[1], m[1])
    finally:
        st.close()


def test_a_block_header_is_bounded_before_anything_is_written(tmp_path):
    st = CheckpointStore.open(str(tmp_path / "c"), "j")
    try:
        bad = b"HBK1" + (64 * MiB).to_bytes(4, "little") + b"\0" * 1000
        with pytest.raises(CheckpointError, match="block 3 \\[model\\]: block header of"):
            st.write({3: bad}, epoch=1, iteration=0, exported=True)
        assert st.versions() == [] and st._data_versions() == set()
    finally:
        st.close()


def test_a_checkpoint_written_before_pieces_opens_restores_and_is_served(service, tmp_path):
    ctx, svc = service
    m, inp = blocks(2, [5000, 40]), blocks(3, [7])
    path = jobckpt.part_dir(os.path.join(str(tmp_path), "state"), "job-1", 4, 0)
    write_format1(path, "job-1", m, inp, epoch=4)
    st = CheckpointStore.open(path, "job-1", keep=1)
    try:
        ck = st.restore()
        assert ck.info.epoch == 4 and all(same(ck.blocks[b], m[b]) for b in m)
        assert same(ck.input_blocks[0], inp[0]) and st.verify(1).num_blocks == 3
    finally:
        st.close()
    info, got = jobckpt.fetch_part(ctx, svc.endpoint, "job-1", 4, 0, lambda s, b: True,
                                   timeout_s=30)
    assert info["epoch"] == 4 and sorted(got) == [("input", 0), ("model", 0), ("model", 1)]
    assert same(got[("model", 0)], m[0]) and same(got[("input", 0)], inp[0])
    # a damaged old block is refused by the holder as it streams it
    st = CheckpointStore.open(path, "job-1", keep=1)
    flip(st, _dkey(1, "model", 0), 2000)
    st.close()
    with pytest.raises(CheckpointError, match="checksum mismatch|does not match"):
        jobckpt.fetch_part(ctx, svc.endpoint, "job-1", 4, 0, lambda s, b: True, timeout_s=30)


def test_a_damaged_piece_is_never_sent_whole(service, tmp_path):
    """A holder streams a block of many pieces; a flipped byte in its
    second piece is found at its last chunk, and the fetch fails with the
    holder's reason instead of taking the block."""
    ctx, svc = service
    m = {0: Block(0, {"a": np.arange(3 * MiB, dtype=np.float64)})}     # 24 MiB: 6 pieces
    payloads = [jobckpt.Payload("model", 0, export_block(m[0]))]
    _, digest = jobckpt.write_payloads(str(tmp_path / "mine"), "job-2", payloads, epoch=1,
                                       iteration=0)
    jobckpt.replicate(ctx, svc.endpoint, "job-2", 0, 1, 0, payloads, digest, timeout_s=30)
    st = CheckpointStore.open(jobckpt.part_dir(svc.state_dir, "job-2", 1, 0), "job-2", keep=1)
    flip(st, piece_key(_dkey(1, "model", 0), 1), 10)
    st.close()
    with pytest.raises(CheckpointError, match=r"block 0 \[model\] checksum mismatch"):
        jobckpt.fetch_part(ctx, svc.endpoint, "job-2", 1, 0, lambda s, b: True, timeout_s=30)


def test_staged_chunks_before_and_after_pieces(service, tmp_path):
    ctx, svc = service
    old = b"1,2,3\n" * 5000
    svc.chunks.env.write(lambda txn: txn.put(svc.chunks._key("ds", 0), old, db=svc.chunks.db),
                         len(old))                     # as it was stored before pieces
    big = os.urandom(9 * MiB + 5)                      # three pieces
    staging.push_chunks(ctx, svc.endpoint, "ds", [(1, big)])
    assert svc.chunks.get("ds", 0) == old and svc.chunks.get("ds", 1) == big
    got = staging.fetch_chunks(ctx, svc.endpoint, "ds", {0: hashlib.sha256(old).digest(),
                                                         1: hashlib.sha256(big).digest()})
    assert got == {0: old, 1: big}
    staging.push_chunks(ctx, svc.endpoint, "ds", [(1, b"x\n")])     # replaced, pieces gone
    assert svc.chunks.get("ds", 1) == b"x\n"
    assert svc.chunks.remove("ds") == 2
    with pytest.raises(StagingError, match="not on this machine"):
        svc.chunks.get("ds", 0)
    n = svc.chunks.env.read(lambda txn: sum(1 for _ in txn.cursor(db=svc.chunks.pieces)))
    assert n == 0


def _spool_file(tmp_path, data: bytes) -> str:
    path = str(tmp_path / "t1")
    with open(path, "wb") as fh:
        fh.write(data)
        os.fsync(fh.fileno())
    return path


def test_a_part_is_written_from_its_spool_a_piece_at_a_time(tmp_path):
    """A 48 MiB block written from a spool file: the writer never holds
    more than a piece or two in Python objects (LMDB's dirty pages, one
    batch, are C memory), and every range is punched out of the spool once
    it is committed, so the spool's disk blocks are gone at the end."""
    blk = export_block(Block(0, {"a": np.arange(6 * MiB, dtype=np.float64)}))
    path = _spool_file(tmp_path, blk)
    probe = os.open(str(tmp_path / "probe"), os.O_RDWR | os.O_CREAT)
    try:
        os.write(probe, b"\1" * 65536)
        can_punch = punch_hole(probe, 0, 65536)
    finally:
        os.close(probe)
    spooled = Spooled(path, {("model", 0): (0, len(blk))})
    try:
        tracemalloc.start()
        try:
            _, digest = jobckpt.write_part(str(tmp_path / "part"), "j", spooled.section("model"),
                                           {}, epoch=1, iteration=0, batch_bytes=8 * MiB)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 12 * MiB, peak                       # not the block's 48 MiB
        assert digest == jobckpt.entries_digest([("model", 0, hashlib.sha256(blk).digest())])
        if can_punch:
            assert spooled.punched == len(blk)
            assert os.stat(path).st_blocks * 512 < MiB      # its size stays, its blocks went
    finally:
        spooled.close()
    st = CheckpointStore.open(str(tmp_path / "part"), "j")
    try:
        assert export_block(st.restore().blocks[0]) == blk
    finally:
        st.close()


def test_pieces_written_before_a_failure_leave_no_version(tmp_path):
    """A spool file cut short (its index says more than it holds): the
    pieces committed before the short read are removed with the version,
    and the previous version stays the latest."""
    st = CheckpointStore.open(str(tmp_path / "c"), "j", chunk_bytes=64 * KiB,
                              piece_bytes=16 * KiB)
    data = export_block(blocks(2, [20_000])[0])
    spooled = Spooled(_spool_file(tmp_path, data[:200 * KiB]), {("model", 0): (0, len(data))})
    try:
        st.write(blocks(1, [100]), epoch=1, iteration=0)
        with pytest.raises(TransferError, match="cut short"):
            st.write(spooled.section("model"), epoch=2, iteration=0, exported=True)
        assert st._data_versions() == {1} and [i.version for i in st.versions()] == [1]
        assert same(st.restore().blocks[0], blocks(1, [100])[0])
    finally:
        spooled.close()
        st.close()


def test_a_reader_that_does_not_read_holds_the_sender_to_a_few_chunks(tmp_path, monkeypatch):
    """A block streamed from disk to a peer that reads nothing: the sender
    (a ROUTER, as a data service) reads the next chunk only once ZeroMQ has
    let go of all but MAX_QUEUED - 1 of those it read, so what it holds
    stays a few chunks, not the block, and it gives up after its send
    timeout (shortened here) with a clear error."""
    from harmony.comm.zmqutil import make_socket
    from harmony.store import transfer
    monkeypatch.setattr(transfer, "SEND_TIMEOUT_MS", 2000)
    size = 20 * transfer.CHUNK_BYTES
    path = str(tmp_path / "t1")
    with open(path, "wb") as fh:
        fh.truncate(size)                              # read back as zeros
    ctx = zmq.Context()
    router = make_socket(ctx, zmq.ROUTER)
    reader = ctx.socket(zmq.DEALER)
    reader.setsockopt(zmq.LINGER, 0)
    reader.setsockopt(zmq.RCVHWM, 1)
    try:
        port = router.bind_to_random_port("tcp://127.0.0.1")
        reader.connect(f"tcp://127.0.0.1:{port}")
        reader.send(b"hello")
        assert router.poll(5000)
        ident = router.recv_multipart()[0]
        with Spooled(path, {("model", 0): (0, size)}) as got:
            tracemalloc.start()
            try:
                with pytest.raises(TransferError, match="peer not reading"):
                    transfer.send_payloads([router], "get:x", [transfer.Payload(
                        "model", 0, source=got.source(("model", 0)))], prefix=[ident])
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
        assert peak < (transfer.MAX_QUEUED + 3) * transfer.CHUNK_BYTES < size, peak
    finally:
        reader.close(0)
        router.close(0)
        ctx.term()
