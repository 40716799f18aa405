"""Checkpoints: consistent versions, integrity checks, torn writes."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from harmony.store.blocks import Block, export_block
from harmony.store.checkpoint import CheckpointError, CheckpointStore, _dkey
from harmony.store.errors import StoreFullError
from harmony.store.lmdb_env import LmdbEnv
from harmony.store.pieces import piece_key

ROOT = Path(__file__).resolve().parent.parent


def model(version: int, n: int = 4, rows: int = 500) -> dict[int, Block]:
    rng = np.random.default_rng(version)
    return {b: Block(b, {"keys": np.arange(b * rows, (b + 1) * rows, dtype=np.int64),
                         "rows": rng.random((rows, 16), dtype=np.float32) + version})
            for b in range(n)}


def same(a: Block, b: Block) -> bool:
    return export_block(a) == export_block(b)


@pytest.fixture
def store(tmp_path):
    st = CheckpointStore.open(str(tmp_path / "ckpt"), "job-7", chunk_bytes=40_000)
    yield st
    if not st.env.closed:
        st.close()


def first_piece(version: int, section: str, bid: int) -> bytes:
    """The key of a stored block's first (here: only) piece."""
    return piece_key(_dkey(version, section, bid), 0)


def raw_put(st: CheckpointStore, db, key: bytes, value: bytes | None) -> None:
    def fn(txn):
        if value is None:
            txn.delete(key, db=db)
        else:
            txn.put(key, value, db=db)
    st.env.write(fn, len(value or b""))


def raw_get(st: CheckpointStore, db, key: bytes) -> bytes:
    return st.env.read(lambda txn: bytes(txn.get(key, db=db)))


def test_round_trip_with_metadata_and_input_state(store):
    m = model(1)
    inp = {3: Block(3, {"L": np.ones((7, 4), dtype=np.float32)})}
    info = store.write(m, epoch=4, iteration=2, meta={"lr": 0.01, "owner": [0, 1]},
                       input_blocks=inp)
    assert (info.version, info.job, info.epoch, info.iteration) == (1, "job-7", 4, 2)
    assert info.num_blocks == 5 and info.meta == {"lr": 0.01, "owner": [0, 1]}
    ck = store.restore()
    assert ck.info == info
    assert sorted(ck.blocks) == [0, 1, 2, 3] and all(same(m[b], ck.blocks[b]) for b in m)
    assert same(inp[3], ck.input_blocks[3])
    raw = store.restore(decode=False)
    assert raw.blocks[2] == export_block(m[2])
    # bytes values are kept as bytes
    store.write({9: b"opaque\x00bytes"}, epoch=5, iteration=0)
    assert store.restore().blocks == {9: b"opaque\x00bytes"}
    assert store.find(4, 2).version == 1 and store.find(4, 3) is None


def test_dtypes_and_shapes_recorded_in_manifest(store):
    import msgpack
    store.write(model(1, n=1, rows=3), epoch=0, iteration=0)
    raw = raw_get(store, store._man, (1).to_bytes(8, "big"))
    doc = msgpack.unpackb(raw[:-32], raw=False)
    assert doc["blocks"][0][5] == {"keys": ["<i8", [3]], "rows": ["<f4", [3, 16]]}


def test_keeps_previous_version_until_new_complete(store):
    for v in range(1, 4):
        store.write(model(v), epoch=v, iteration=0)
    assert [i.version for i in store.versions()] == [2, 3]   # keep=2
    assert same(store.restore(2).blocks[1], model(2)[1])
    with pytest.raises(CheckpointError, match="v1 .*missing manifest"):
        store.restore(1)
    assert store._data_versions() == {2, 3}


@pytest.mark.parametrize("damage,reason", [
    (lambda v: v[:1000] + bytes([v[1000] ^ 0x40]) + v[1001:], "block 2 \\[model\\] checksum mismatch"),
    (lambda v: v[:-1], "block 2 \\[model\\] truncated"),
    (None, "block 2 \\[model\\] missing"),
])
def test_damaged_block_in_lmdb_is_rejected(store, damage, reason):
    store.write(model(1), epoch=1, iteration=0)
    store.write(model(2), epoch=2, iteration=0)
    key = first_piece(2, "model", 2)
    raw_put(store, store._data, key, damage(raw_get(store, store._data, key)) if damage else None)
    with pytest.raises(CheckpointError, match=f"checkpoint v2 of job job-7 .*{reason}"):
        store.restore()                   # the newest is damaged: no silent fallback
    with pytest.raises(CheckpointError):
        store.verify(2)
    ck, skipped = store.restore_latest_good()   # explicit fallback, reported
    assert ck.info.version == 1 and [v for v, _ in skipped] == [2]
    assert same(ck.blocks[2], model(1)[2])


def test_a_selective_restore_reads_and_verifies_only_its_blocks(store):
    """A resuming executor takes only the blocks it now owns from a part."""
    m = model(1)
    inp = {b: Block(b, {"L": np.full((3, 2), b, dtype=np.float32)}) for b in range(4)}
    store.write(m, epoch=1, iteration=0, input_blocks=inp)
    key = first_piece(1, "model", 2)
    v = raw_get(store, store._data, key)
    raw_put(store, store._data, key, v[:10] + bytes([v[10] ^ 1]) + v[11:])
    ck = store.restore(1, want=lambda section, bid: bid % 2 == 1)
    assert sorted(ck.blocks) == [1, 3] and sorted(ck.input_blocks) == [1, 3]
    assert same(ck.blocks[3], m[3]) and same(ck.input_blocks[1], inp[1])
    with pytest.raises(CheckpointError, match="block 2 \\[model\\] checksum mismatch"):
        store.restore(1, want=lambda section, bid: section == "model" and bid == 2)


def test_damaged_manifest_is_rejected(store):
    store.write(model(1), epoch=1, iteration=0)
    store.write(model(2), epoch=2, iteration=0)
    key = (2).to_bytes(8, "big")
    v = raw_get(store, store._man, key)
    raw_put(store, store._man, key, v[:10] + bytes([v[10] ^ 1]) + v[11:])
    with pytest.raises(CheckpointError, match="v2 .*manifest checksum mismatch"):
        store.restore()
    assert [i.version for i in store.versions()] == [1]
    # a further write prunes by *good* versions: v1 must survive the damaged v2
    store.write(model(3), epoch=3, iteration=0)
    assert [i.version for i in store.versions()] == [1, 3]


def test_corruption_on_disk_is_detected(tmp_path):
    path = str(tmp_path / "ckpt")
    st = CheckpointStore.open(path, "job-7")
    marker = bytes(range(256)) * 64
    st.write({1: marker + b"payload" * 1000}, epoch=0, iteration=0)
    st.close()
    data = Path(path, "data.mdb")
    buf = bytearray(data.read_bytes())
    at = buf.find(marker)
    assert at >= 0 and buf.find(marker, at + 1) < 0
    buf[at + 5000] ^= 0xFF                         # one flipped byte on disk
    data.write_bytes(bytes(buf))
    st = CheckpointStore.open(path, "job-7")
    try:
        with pytest.raises(CheckpointError, match="block 1 \\[model\\] checksum mismatch"):
            st.restore()
    finally:
        st.close()


def test_torn_write_keeps_previous_version(tmp_path):
    """The process dies after the block data of v2 is committed but before its
    manifest: v1 stays the latest and the torn data is removed on reopen."""
    path = str(tmp_path / "ckpt")
    st = CheckpointStore.open(path, "job-7")
    st.write(model(1), epoch=1, iteration=0)
    st.close()
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import os
        import numpy as np
        from harmony.store.blocks import Block
        from harmony.store.checkpoint import CheckpointStore
        st = CheckpointStore.open({path!r}, "job-7", chunk_bytes=10_000)
        def die(version, value):
            os._exit(7)
        st._commit_manifest = die
        st.write({{b: Block(b, {{"rows": np.zeros((500, 16), np.float32)}}) for b in range(4)}},
                 epoch=2, iteration=0)
    """)], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 7, r.stderr
    st = CheckpointStore.open(path, "job-7")
    try:
        assert st._data_versions() == {1}          # torn v2 garbage-collected
        assert [i.version for i in st.versions()] == [1]
        ck = st.restore()
        assert ck.info.epoch == 1 and all(same(ck.blocks[b], model(1)[b]) for b in range(4))
        assert st.write(model(3), epoch=3, iteration=0).version == 2
    finally:
        st.close()


def test_failed_write_leaves_previous_version_intact(tmp_path):
    st = CheckpointStore.open(str(tmp_path / "ckpt"), "job-7", map_size=1 << 20,
                              max_map_size=1 << 20)
    try:
        st.write(model(1, rows=200), epoch=1, iteration=0)
        with pytest.raises(StoreFullError, match="job-7"):
            st.write(model(2, n=40, rows=2000), epoch=2, iteration=0)
        assert [i.version for i in st.versions()] == [1]
        assert st._data_versions() == {1}          # partial v2 removed
        assert same(st.restore().blocks[0], model(1, rows=200)[0])
    finally:
        st.close()


def test_requires_synced_env_and_matching_job(tmp_path):
    env = LmdbEnv(str(tmp_path / "nosync"), job="job-7", sync=False)
    with pytest.raises(ValueError, match="sync=True"):
        CheckpointStore(env)
    env.close()
    path = str(tmp_path / "ckpt")
    st = CheckpointStore.open(path, "job-7")
    st.write({1: b"x"}, epoch=0, iteration=0)
    st.close()
    other = CheckpointStore.open(path, "job-8")
    try:
        with pytest.raises(CheckpointError, match="belongs to job 'job-7'"):
            other.restore(1)
    finally:
        other.close()


def test_no_checkpoint(store):
    with pytest.raises(CheckpointError, match="no checkpoint"):
        store.restore()
    with pytest.raises(CheckpointError, match="no intact checkpoint"):
        store.restore_latest_good()
    assert store.latest() is None and os.path.isdir(store.env.path)
