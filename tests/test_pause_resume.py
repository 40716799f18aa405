"""Pause, resume and migration: model and input state survive exactly."""
import glob
import os
import time

import pytest

from harmony.app import load_app, run_local
from harmony.client import Client
from conftest import NMF_APP, run_cli, wait_state

NMF_ARGS = ["--rank", "6", "--blocks", "8"]


def _wait_epochs(c, job, n, timeout=60):
    deadline = time.time() + timeout
    while c.status(job)["epochs_total"] < n:
        assert time.time() < deadline, c.status(job)
        time.sleep(0.02)


def _pause(c, job):
    c.pause(job)
    return wait_state(c, job, ("paused",), timeout=60)


@pytest.mark.parametrize("disk", ["0", "0.5"])
def test_pause_resume_on_one_machine_is_bit_identical_to_the_reference(client, ratings, disk):
    # with disk-blocks too: the checkpoint reads them back, the resume replaces them
    args = ["--input", ratings, "--max-epochs", "12", *NMF_ARGS, "--disk-ratio", disk]
    ref = run_local(load_app(NMF_APP.read_text(), "nmf.py"), args)
    job = client.submit("nmf.py", NMF_APP.read_text(), args, machines=1)
    _wait_epochs(client, job, 2)
    st = _pause(client, job)
    at = st["epochs_total"]
    assert 2 <= at < 12, "paused too late to test anything"
    assert any("checkpointed after epoch" in e[2] for e in st["events"])
    # paused: nothing runs, the checkpoint is on disk, and it stays paused
    time.sleep(0.5)
    assert client.status(job)["state"] == "paused"
    client.resume(job)
    st = wait_state(client, job, ("finished", "failed"))
    assert st["state"] == "finished", st["error"]
    got = [e["metrics"]["objective"] for e in st["epochs"]]
    want = [h["objective"] for h in ref.history]
    assert got == want          # bit-identical, including the epochs after the resume
    assert any(f"resumes at epoch {at}" in e[2] for e in st["events"])


def test_migration_from_two_machines_to_one_keeps_the_model(client, ratings):
    args = ["--input", ratings, "--max-epochs", "40", *NMF_ARGS]
    job = client.submit("nmf.py", NMF_APP.read_text(), args, machines=2)
    _wait_epochs(client, job, 3)
    st = _pause(client, job)
    before = st["epochs"][-1]["metrics"]["objective"]
    at = st["epochs_total"]
    client.resume(job, machines=1)
    _wait_epochs(client, job, at + 1)
    st = client.status(job)
    assert len(st["workers"]) == 1
    after = st["epochs"][at]["metrics"]["objective"]
    first = st["epochs"][0]["metrics"]["objective"]
    # training continued from the checkpointed model, not from scratch
    assert after <= before * 1.05 and after < first * 0.9
    client.cancel(job)


def _corrupt(path):
    with open(path, "r+b") as fh:      # flip bytes in the middle of the block data
        size = os.path.getsize(path)
        fh.seek(size // 2)
        chunk = fh.read(4096)
        fh.seek(size // 2)
        fh.write(bytes(b ^ 0xFF for b in chunk))


def _parts(cluster, job):
    """Every copy of the job's checkpoint parts, on each worker's own disk."""
    return sorted(glob.glob(os.path.join(cluster.state_dir, "workers", "*", "ckpt", job, "*",
                                         "data.mdb")))


def test_a_corrupt_copy_of_a_checkpoint_is_skipped_for_its_replica(cluster, client, ratings):
    args = ["--input", ratings, "--max-epochs", "40", *NMF_ARGS]
    job = client.submit("nmf.py", NMF_APP.read_text(), args, machines=1)
    _wait_epochs(client, job, 1)
    st = _pause(client, job)
    assert st["checkpoint"]["replicas"] == 1 and len(st["checkpoint"]["holders"]) == 2
    copies = _parts(cluster, job)
    assert len(copies) == 2, copies       # the part and its replica, on two machines
    own = [c for c in copies if f"/workers/{st['events'][-1][2].split(' on ')[-1]}/" in c]
    _corrupt(own[0] if own else copies[0])
    client.resume(job)
    st = wait_state(client, job, ("failed", "finished"))
    assert st["state"] == "finished", st["error"]


def test_corrupt_checkpoint_fails_the_resume_cleanly(cluster, client, ratings):
    args = ["--input", ratings, "--max-epochs", "30", *NMF_ARGS]
    job = client.submit("nmf.py", NMF_APP.read_text(), args, machines=1)
    _wait_epochs(client, job, 1)
    _pause(client, job)
    copies = _parts(cluster, job)
    assert len(copies) == 2, copies
    for c in copies:
        _corrupt(c)
    client.resume(job)
    st = wait_state(client, job, ("failed", "finished"))
    assert st["state"] == "failed"
    assert "checkpoint" in st["error"] and "any holder" in st["error"]
    deadline = time.time() + 10
    while _parts(cluster, job) and time.time() < deadline:   # dropped on every machine
        time.sleep(0.05)
    assert not _parts(cluster, job)


def test_pause_resume_cli(cluster, ratings):
    out = run_cli("submit", str(NMF_APP), "--master", cluster.endpoint, "--machines", "1",
                  "--input", ratings, "--max-epochs", "200", *NMF_ARGS)
    assert out.returncode == 0, out.stderr
    job = out.stdout.strip().splitlines()[0]
    with Client(cluster.endpoint) as c:
        _wait_epochs(c, job, 1)
        r = run_cli("pause", job, "--master", cluster.endpoint)
        assert r.returncode == 0 and "pausing" in r.stdout, r.stderr
        wait_state(c, job, ("paused",))
        r = run_cli("resume", job, "--master", cluster.endpoint)
        assert r.returncode == 0, r.stderr
        wait_state(c, job, ("running",))
        c.cancel(job)
