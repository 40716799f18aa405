"""A damaged LMDB file on a worker: checked before LMDB maps it (a truncated
file would kill the daemon, and every executor on the machine, with SIGBUS),
set aside (never deleted), and the daemon starts with an empty store."""
from __future__ import annotations

import os
import signal
import time

import pytest

from conftest import NMF_APP
from harmony.client import Client
from harmony.cluster import LocalCluster
from harmony.store.errors import DamagedStoreError
from harmony.store.lmdb_env import LmdbEnv
from harmony.store.staging import ChunkStore


def test_an_env_over_a_truncated_file_is_refused_before_it_is_mapped(tmp_path):
    store = ChunkStore(str(tmp_path))
    for i in range(8):
        store.put("d", i, bytes([i]) * (64 << 10))
    store.close()
    data = tmp_path / "staged" / "data.mdb"
    cut = data.stat().st_size // 2
    os.truncate(data, cut)
    with pytest.raises(DamagedStoreError) as e:
        LmdbEnv(str(tmp_path / "staged"), job="staged", sync=True)
    assert str(data) in str(e.value) and "truncated" in str(e.value)
    # the staged store sets it aside and starts empty: nothing deleted
    store = ChunkStore(str(tmp_path))
    try:
        assert store.damaged and str(data) in store.damaged
        assert (tmp_path / "staged.damaged" / "data.mdb").stat().st_size == cut
        store.put("d", 0, b"x")
        assert store.get("d", 0) == b"x"
    finally:
        store.close()


def test_a_truncated_staged_store_does_not_kill_the_daemon(tmp_path, ratings):
    state = str(tmp_path / "cl")
    cl = LocalCluster(2, state, port=0)
    cl.start()
    try:
        with Client(cl.endpoint, timeout_s=30) as c:
            info = c.data_put(ratings, "ratings", chunk_bytes=16 << 10)
            assert info["chunks"] > 3
    finally:
        cl.stop()
    staged = os.path.join(state, "workers", "m0", "staged")
    data = os.path.join(staged, "data.mdb")
    size = os.path.getsize(data)
    os.truncate(data, size // 2)

    cl = LocalCluster(2, state, port=0)
    cl.start()                              # before the fix: m0 died of SIGBUS here or below
    try:
        daemons = cl.procs[1:]
        with Client(cl.endpoint, timeout_s=30) as c:
            # a job reading the staged set on both machines: m0's chunks now
            # come from their other holder
            job = c.submit("nmf.py", NMF_APP.read_text(),
                           ["--input", "harmony://ratings", "--rank", "4", "--blocks", "4",
                            "--max-epochs", "2"], machines=2)
            deadline = time.time() + 120
            while True:
                for p in daemons:
                    assert p.poll() is None, f"a daemon exited with {p.returncode}" + (
                        " (SIGBUS)" if p.returncode == -signal.SIGBUS else "")
                st = c.status(job)
                if st["state"] in ("finished", "failed"):
                    break
                assert time.time() < deadline, f"{job} still {st['state']}"
                time.sleep(0.2)
            assert st["state"] == "finished", st.get("error")
            assert all(w["alive"] for w in c.cluster()["workers"])
        with open(os.path.join(state, "logs", "worker-m0.log")) as fh:
            log = fh.read()
        line = next((ln for ln in log.splitlines() if data in ln and "damaged" in ln), None)
        assert line is not None and "ERROR" in line and "truncated" in line, log[-3000:]
        # kept, not deleted: the damaged file is there as it was
        assert os.path.getsize(os.path.join(f"{staged}.damaged", "data.mdb")) == size // 2
    finally:
        cl.stop()
