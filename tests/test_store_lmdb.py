"""LMDB block store: byte-identical spill/reload, map growth, full store and
full disk, corrupt blocks, stale owners."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import lmdb
import numpy as np
import pytest

from harmony.store.blocks import Block, export_block
from harmony.store.errors import BlockLoadError, StoreBusyError, StoreError, StoreFullError
from harmony.store.framing import decode_block, frame, frame_block
from harmony.store.lmdb_env import LmdbEnv, _ResizeLock
from harmony.store.lmdb_store import JobStorage, LmdbBlockStore, sweep_stale

ROOT = Path(__file__).resolve().parent.parent


def make_block(bid: int, n: int = 1000, seed: int = 0) -> Block:
    rng = np.random.default_rng(seed + bid)
    return Block(bid, {
        "L": rng.random((n, 8), dtype=np.float32),
        "u": rng.integers(0, 1 << 40, n),
        "r": rng.random(n).astype(np.float16),
        "mask": rng.random(n) < 0.5,
        "strided": np.arange(3 * n, dtype=np.int32)[::3],   # not contiguous
        "empty": np.zeros((0, 4), dtype=np.float64),
    })


def assert_same(a: Block, b: Block) -> None:
    assert a.id == b.id and list(a.arrays) == list(b.arrays)
    for k in a.arrays:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert np.ascontiguousarray(a[k]).tobytes() == b[k].tobytes(), k


def run_py(code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


def test_spill_reload_is_byte_identical(tmp_path):
    blocks = [make_block(i) for i in (5, 0, 17, 3)]
    with JobStorage(str(tmp_path), "job-0001") as st:
        st.input.put(blocks[0])
        st.input.put_many(blocks[1:])
        assert st.input.ids() == [0, 3, 5, 17] and len(st.input) == 4
        assert 3 in st.input and 4 not in st.input
        for b in blocks:
            back = st.input.get(b.id)
            assert_same(b, back)
            assert export_block(back) == export_block(b)
            assert st.input.get_bytes(b.id) == export_block(b)
            assert st.input.size(b.id) == len(export_block(b))
        assert st.input.total_bytes() == sum(len(export_block(b)) for b in blocks)
        # replace, remove; model blocks live in their own db
        b2 = make_block(5, seed=9)
        st.input.put(b2)
        assert_same(b2, st.input.get(5))
        st.model.put(make_block(5, n=10))
        assert st.model.get(5)["L"].shape == (10, 8) and st.input.get(5)["L"].shape == (1000, 8)
        st.input.remove(17)
        with pytest.raises(KeyError, match="block 17"):
            st.input.remove(17)
        with pytest.raises(BlockLoadError, match="block 17.*not in store"):
            st.input.get(17)
        assert [b.id for b in st.input] == [0, 3, 5]
        spill = st.spill_path
        assert os.path.isdir(spill)
    assert not os.path.exists(spill)        # scratch: gone after close


def test_fast_framing_matches_export_block_format():
    """frame_block (one pass into a reused buffer) must produce exactly
    frame(export_block(b)), whatever the arrays look like and in any order of
    sizes (the scratch buffer is reused and grown)."""
    rng = np.random.default_rng(1)
    cases = [make_block(1, n=5000), make_block(2, n=3),
             Block(3, {"scalar": np.array(2.5), "F": np.asfortranarray(rng.random((4, 3))),
                       "T": rng.random((3, 5)).T, "c": np.array([1 + 2j]), "u8": np.arange(7,
                       dtype=np.uint8), "none": np.zeros(0, dtype=np.int16)}),
             Block(4, {}), make_block(5, n=20_000), make_block(6, n=1)]
    for blk in cases:
        want = frame(export_block(blk))
        got = bytes(frame_block(blk))
        assert got == want, blk.id
        back = decode_block(got)
        assert export_block(back) == export_block(blk)


def test_crc_is_zlibs_so_blocks_stored_before_isal_still_read(tmp_path):
    """The check is zlib's CRC-32 computed by ISA-L: the stored format did
    not change, and a value framed with zlib.crc32 (as every earlier version
    wrote it) decodes, also with arrays spanning several copy chunks."""
    import struct
    import zlib

    from harmony.store import framing
    blk = make_block(7, n=3 * framing._CHUNK // 32 + 5)     # "L" spans 3+ chunks
    payload = export_block(blk)
    old = payload + struct.pack("<4sIQ", b"HSC1", zlib.crc32(payload), len(payload))
    assert frame(payload) == old == bytes(frame_block(blk))
    assert_same(blk, decode_block(old))
    bad = bytearray(old)
    bad[len(payload) - 5] ^= 0x10                          # last chunk of the last array
    with pytest.raises(ValueError, match="checksum"):
        decode_block(bytes(bad))
    with JobStorage(str(tmp_path), "job-z") as st:
        _raw_put(st, "input", (7).to_bytes(8, "big"), old)
        assert_same(blk, st.input.get(7))


def test_unverified_store_reads_without_the_crc(tmp_path):
    with JobStorage(str(tmp_path), "job-v") as st:
        fast = LmdbBlockStore(st.spill_env, "input", verify=False)
        st.input.put(make_block(1))
        dbi = st.spill_env.db("input")
        key = (1).to_bytes(8, "big")
        v = bytearray(_raw_get(st, "input", key))
        v[len(v) // 2] ^= 1
        _raw_put(st, "input", key, bytes(v))
        assert fast.get(1).id == 1                     # not checked: loads
        with pytest.raises(BlockLoadError, match="checksum"):
            st.input.get(1)
        assert dbi is not None


def test_map_grows_from_tiny_map_with_concurrent_readers(tmp_path):
    blocks = [make_block(i, n=10_000) for i in range(40)]         # ~470 KB each
    with JobStorage(str(tmp_path), "job-grow", map_size=64 << 10) as st:
        st.input.put(blocks[0])
        stop, errors = threading.Event(), []

        def reader():
            while not stop.is_set():
                try:
                    assert_same(blocks[0], st.input.get(0))
                except Exception as exc:   # pragma: no cover - reported below
                    errors.append(exc)
                    return
        threads = [threading.Thread(target=reader) for _ in range(2)]
        for t in threads:
            t.start()
        for b in blocks[1:20]:
            st.input.put(b)
        st.input.put_many(blocks[20:])
        stop.set()
        for t in threads:
            t.join()
        assert not errors, errors
        assert st.spill_env.grows >= 3 and st.spill_env.map_size > (64 << 10)
        for b in blocks:
            assert_same(b, st.input.get(b.id))


def test_hard_cap_raises_store_full_and_other_jobs_are_untouched(tmp_path):
    root = str(tmp_path)
    with JobStorage(root, "job-a", map_size=256 << 10, max_map_size=2 << 20) as a, \
            JobStorage(root, "job-b", map_size=256 << 10) as b:
        kept = []
        with pytest.raises(StoreFullError) as ei:
            for i in range(100):
                blk = make_block(i, n=2000)
                a.input.put(blk)
                b.input.put(blk)
                kept.append(blk)
        msg = str(ei.value)
        assert "job-a" in msg and a.spill_path in msg and "cap" in msg
        assert ei.value.job == "job-a" and ei.value.path == a.spill_path
        assert 3 <= len(kept) < 100
        for blk in kept:                       # what was committed is intact
            assert_same(blk, a.input.get(blk.id))
            assert_same(blk, b.input.get(blk.id))
        b.input.put(make_block(999, n=50_000))  # the other job carries on
        assert b.input.get(999)["L"].shape == (50_000, 8)
        a.input.remove(kept[0].id)              # and the full one can still delete


def test_os_refusing_the_write_raises_store_full(tmp_path):
    """A real write failure from the OS inside LMDB's commit. Portable stand-in
    for a full disk: RLIMIT_FSIZE makes write() fail (EFBIG) past a file size,
    without root or a tmpfs; LMDB reports the short write as EIO."""
    out = run_py(f"""
        import json, os, resource, signal
        import numpy as np
        from harmony.store.blocks import Block
        from harmony.store.errors import StoreFullError
        from harmony.store.lmdb_store import JobStorage
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        st = JobStorage({str(tmp_path)!r}, "job-disk")
        small = Block(1, {{"a": np.arange(1000)}})
        st.input.put(small)
        size = os.path.getsize(os.path.join(st.spill_path, "data.mdb"))
        resource.setrlimit(resource.RLIMIT_FSIZE, (size + (1 << 20), resource.RLIM_INFINITY))
        res = {{}}
        try:
            st.input.put(Block(2, {{"a": np.ones(1 << 20)}}))    # 8 MB
        except StoreFullError as exc:
            res = {{"error": str(exc), "job": exc.job, "path": exc.path}}
        res["small_ok"] = bool((st.input.get(1)["a"] == np.arange(1000)).all())
        res["ids"] = st.input.ids()
        print(json.dumps(res))
    """)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["job"] == "job-disk" and "job-disk" in res["error"]
    assert res["path"].endswith(os.path.join("job-disk", "spill"))
    assert "write refused" in res["error"]
    assert res["small_ok"] and res["ids"] == [1]


def _raw_put(st: JobStorage, db: str, key: bytes, value: bytes) -> None:
    dbi = st.spill_env.db(db)
    st.spill_env.write(lambda txn: txn.put(key, value, db=dbi), len(value))


def _raw_get(st: JobStorage, db: str, key: bytes) -> bytes:
    dbi = st.spill_env.db(db)
    return st.spill_env.read(lambda txn: bytes(txn.get(key, db=dbi)))


@pytest.mark.parametrize("damage,reason", [
    (lambda v: v[:len(v) // 2] + bytes([v[len(v) // 2] ^ 0x01]) + v[len(v) // 2 + 1:],
     "checksum"),                                          # a bit flip in the data
    (lambda v: v[:100] + bytes([v[100] ^ 0x01]) + v[101:], "checksum|corrupt|truncated"),
    (lambda v: v.replace(b"<f4", b"<f5", 1), "corrupt block header.*f5"),   # header
    (lambda v: v.replace(b"<f4", b"<i4", 1), "checksum"),  # header still parses
    (lambda v: v[:len(v) // 2], "trailer|truncated"),
    (lambda v: v[:-20] + v[-16:], "length mismatch"),
    (lambda v: b"", "truncated"),
])
@pytest.mark.parametrize("zero_copy", [False, True])
def test_corrupt_block_is_rejected_naming_the_block(tmp_path, damage, reason, zero_copy):
    with JobStorage(str(tmp_path), "job-c") as st:
        st.input.put(make_block(3))
        key = (3).to_bytes(8, "big")
        _raw_put(st, "input", key, damage(_raw_get(st, "input", key)))
        with pytest.raises(BlockLoadError, match=rf"block 3 \(job job-c.*\): .*({reason})") as ei:
            st.input.get_view(3) if zero_copy else st.input.get(3)
        assert ei.value.block_id == 3


def test_zero_copy_load_is_read_only_aligned_and_pins_its_snapshot(tmp_path):
    env = LmdbEnv(str(tmp_path / "e"), job="job-z", sync=False, map_size=8 << 20)
    store = LmdbBlockStore(env, "input")
    small = [make_block(b, n=3000, seed=b) for b in range(3)]
    store.put_many(small)
    blk, lease = store.get_view(1)
    assert_same(blk, small[1])
    assert not any(arr.flags.writeable for arr in blk.arrays.values())
    # the first array is used in place, 64-byte aligned (pack_header pads)
    assert not blk["L"].flags.owndata and blk["L"].ctypes.data % 64 == 0
    with pytest.raises(ValueError, match="read-only"):
        blk["L"][0] = 1.0
    # overwriting and deleting the viewed block, then writing more: this
    # reader's snapshot keeps its pages from being reused
    store.put(make_block(1, n=3000, seed=99))
    store.remove(1)
    store.put_many(make_block(20 + b, n=3000, seed=b) for b in range(12))
    assert env.grows == 0
    assert_same(blk, small[1])
    # a view in use keeps the transaction; dropping the block ends it
    x = blk["L"][5:]
    assert not lease.end() and not lease.ended
    del x, blk
    assert lease.end() and lease.ended
    # views taken before close stay readable (this env's own map of the file)
    blk2, lease2 = store.get_view(2)
    env.close()
    assert_same(blk2, small[2])
    del blk2
    assert lease2.end()


def test_map_growth_waits_for_zero_copy_views_and_new_leases_do_not_wait(tmp_path):
    env = LmdbEnv(str(tmp_path / "e"), job="job-g", sync=False, map_size=1 << 20)
    store = LmdbBlockStore(env, "input")
    small = [make_block(b, n=3000, seed=b) for b in range(3)]
    store.put_many(small)
    blk, lease = store.get_view(1)
    errors = []

    def grow():   # more than the 1 MiB map holds: needs a growth (a remap)
        try:
            store.put_many(make_block(10 + b, n=60000, seed=b) for b in range(4))
        except Exception as exc:   # pragma: no cover - reported below
            errors.append(exc)
    t = threading.Thread(target=grow)
    t.start()
    t.join(0.5)
    assert t.is_alive() and env.grows == 0          # it cannot grow under a lease
    blk2, lease2 = store.get_view(2)                # a reload pass is not held up
    assert_same(blk, small[1])
    assert_same(blk2, small[2])
    del blk, blk2
    assert lease.end() and lease2.end()
    t.join(60)
    assert not t.is_alive() and not errors and env.grows >= 1
    assert_same(store.get_view(12)[0], make_block(12, n=60000, seed=2))
    env.close()


def test_map_growth_gives_up_with_a_clear_error_when_a_view_is_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(_ResizeLock, "LEASE_WAIT_S", 0.2)
    env = LmdbEnv(str(tmp_path / "e"), job="job-k", sync=False, map_size=1 << 20)
    store = LmdbBlockStore(env, "input")
    store.put(make_block(1, n=3000))
    kept, lease = store.get_view(1)
    with pytest.raises(StoreError, match="cannot grow the map: 1 zero-copy block view"):
        store.put_many(make_block(10 + b, n=60000, seed=b) for b in range(4))
    assert_same(kept, make_block(1, n=3000))
    del kept
    assert lease.end()
    store.put_many(make_block(10 + b, n=60000, seed=b) for b in range(4))   # now it can
    env.close()


def test_block_stored_under_wrong_id_is_rejected(tmp_path):
    with JobStorage(str(tmp_path), "job-w") as st:
        st.input.put(make_block(4))
        _raw_put(st, "input", (9).to_bytes(8, "big"),
                 _raw_get(st, "input", (4).to_bytes(8, "big")))
        with pytest.raises(BlockLoadError, match="block 9.*holds block 4"):
            st.input.get(9)


def test_crashed_owner_spill_is_discarded_and_checkpoints_kept(tmp_path):
    out = run_py(f"""
        import os
        import numpy as np
        from harmony.store.blocks import Block
        from harmony.store.lmdb_store import JobStorage
        st = JobStorage({str(tmp_path)!r}, "job-x")
        st.input.put(Block(1, {{"a": np.arange(10)}}))
        st.checkpoints.write({{7: Block(7, {{"w": np.ones(5)}})}}, epoch=2, iteration=0)
        # a reader in the middle of its input: pieces spilled to scratch files
        from harmony.formats.pieces import PieceBuffer
        buf = PieceBuffer(1024, st.parse_path)
        for k in range(4):
            buf.add(k, np.arange(1000))
        assert os.listdir(st.parse_path)
        os._exit(0)   # crash: no close
    """)
    assert out.returncode == 0, out.stderr
    owner = json.loads((tmp_path / "job-x" / "OWNER").read_text())
    assert owner["pid"] != os.getpid()
    assert (tmp_path / "job-x" / "parse").is_dir()
    with JobStorage(str(tmp_path), "job-x") as st:
        assert st.recovered
        assert not os.path.exists(st.parse_path)        # the reader's leftovers are gone
        assert st.input.ids() == []                     # spill rebuilt from scratch
        ck = st.checkpoints.restore()
        assert ck.info.epoch == 2 and np.array_equal(ck.blocks[7]["w"], np.ones(5))
    with JobStorage(str(tmp_path), "job-x") as st:       # clean close last time
        assert not st.recovered


def test_live_owner_is_refused(tmp_path):
    with JobStorage(str(tmp_path), "job-l"):
        with pytest.raises(StoreBusyError, match=f"in use by pid {os.getpid()}"):
            JobStorage(str(tmp_path), "job-l", lock_wait_s=0.1)
    JobStorage(str(tmp_path), "job-l").destroy()
    assert not (tmp_path / "job-l").exists()


def test_sweep_stale(tmp_path):
    root = str(tmp_path)
    code = f"""
        import os, sys
        import numpy as np
        from harmony.store.blocks import Block
        from harmony.store.lmdb_store import JobStorage
        st = JobStorage({root!r}, sys.argv[1])
        st.input.put(Block(1, {{"a": np.arange(10)}}))
        if sys.argv[2] == "ckpt":
            st.checkpoints.write({{1: b"x"}}, epoch=0, iteration=0)
        os._exit(0)
    """
    for job, ck in (("job-dead1", "ckpt"), ("job-dead2", "none")):
        r = subprocess.run([sys.executable, "-c", textwrap.dedent(code), job, ck],
                           capture_output=True, text=True, cwd=ROOT, timeout=60)
        assert r.returncode == 0, r.stderr
    with JobStorage(root, "job-live") as live:
        live.input.put(make_block(1))
        cleaned = sweep_stale(root)
        assert sorted(os.path.basename(d) for d in cleaned) == ["job-dead1", "job-dead2"]
        assert not (tmp_path / "job-dead1" / "spill").exists()
        assert (tmp_path / "job-dead1" / "ckpt").exists()   # checkpoints kept
        assert not (tmp_path / "job-dead2").exists()        # nothing worth keeping
        assert live.input.ids() == [1]                        # owned: untouched
    with JobStorage(root, "job-dead1") as st:
        assert not st.recovered and st.checkpoints.restore().blocks[1] == b"x"


def test_bad_job_id(tmp_path):
    for bad in ("", "../x", "a/b", ".hidden"):
        with pytest.raises(ValueError):
            JobStorage(str(tmp_path), bad)


def test_lmdb_error_on_read_is_a_block_load_error(tmp_path, monkeypatch):
    with JobStorage(str(tmp_path), "job-r") as st:
        st.input.put(make_block(2))

        def boom(fn):
            raise lmdb.ReadersFullError("mdb_txn_begin: MDB_READERS_FULL")
        monkeypatch.setattr(st.spill_env, "read", boom)
        with pytest.raises(BlockLoadError, match="block 2.*LMDB read failed"):
            st.input.get(2)
