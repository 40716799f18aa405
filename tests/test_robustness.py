"""Regression tests for failure modes found in review."""
import json
import subprocess
import time

import numpy as np
import psutil
import pytest
import zmq

from harmony.comm.zmqutil import make_socket

from harmony.app import AppError, load_app, parse_app_args
from harmony.client import Client
from harmony.cluster import LocalCluster, cluster_down
from harmony.comm import messages as M
from harmony.ps.client import PSClient, PSError
from harmony.ps.server import ShardServer, ShardTable
from apps_for_tests import TOY_APP
from conftest import NMF_APP, wait_state

RAISING_UPDATE = TOY_APP.replace('''    def objective(self, blocks, keys, rows):''', '''    def update(self, rows, deltas):
        return rows / 0 if False else rows.nonexistent_attribute

    def objective(self, blocks, keys, rows):''')


def test_a_client_that_stops_reading_does_not_freeze_the_master(cluster, client):
    # a job with a long history makes every status reply tens of KB
    job = client.submit("toy.py", TOY_APP, ["--max-epochs", "300", "--keys", "4"], machines=1)
    assert wait_state(client, job, ("finished", "failed"))["state"] == "finished"
    ctx = zmq.Context()
    flood = make_socket(ctx, zmq.DEALER, keys=client.keys)   # an authenticated user
    flood.setsockopt(zmq.LINGER, 0)
    flood.setsockopt(zmq.SNDHWM, 0)
    flood.setsockopt(zmq.RCVHWM, 1)       # unread replies back up at once
    flood.setsockopt(zmq.RCVBUF, 4096)
    flood.connect(cluster.endpoint)
    req = M.encode("job_status", job=job)
    try:
        for _ in range(3_000):           # ~100 MB of replies pile up unread
            flood.send(req)
        time.sleep(1.0)
        t = time.time()
        assert isinstance(client.jobs(), list)
        assert time.time() - t < 5
    finally:
        flood.close()
        ctx.term()


def test_an_exception_in_update_fails_the_job_with_the_app_error(client):
    job = client.submit("toy.py", RAISING_UPDATE, ["--max-epochs", "3"], machines=2)
    st = wait_state(client, job, ("finished", "failed"), timeout=60)
    assert st["state"] == "failed"
    assert "AttributeError" in st["error"] and "nonexistent_attribute" in st["error"]


def test_shard_survives_bad_requests_and_serves_empty_pulls():
    ctx = zmq.Context()
    table = ShardTable(2, "float32", lambda rows, d: None)     # a broken update
    table.load(np.arange(4), np.zeros((4, 2), np.float32))
    srv = ShardServer(ctx, "127.0.0.1", table, tag="job-1:1")
    srv.start()
    c = PSClient(ctx, [srv.endpoint], np.zeros(1, np.int64), 2, timeout_s=5, tag="job-1:1")
    other = PSClient(ctx, [srv.endpoint], np.zeros(1, np.int64), 2, timeout_s=5, tag="job-1:2")
    try:
        assert c.pull(np.zeros(0, np.int64)).shape == (0, 2)
        with pytest.raises(PSError, match="update\\(\\) returned NoneType"):
            c.push(np.array([1]), np.ones((1, 2), np.float32))
        with pytest.raises(PSError, match="another job attempt") as err:
            other.pull(np.array([1]))
        assert "job-1:1" not in str(err.value)       # the tag (its secret) is never echoed
        with pytest.raises(PSError, match="another job attempt"):   # a push, too
            other.push(np.array([1]), np.ones((1, 2), np.float32))
        raw = ctx.socket(zmq.DEALER)                  # a values frame of the wrong size
        raw.connect(srv.endpoint)
        raw.send_multipart([M.encode("push", rid=9, n=1, dim=2, tag="job-1:1"),
                            np.array([1], np.int64), np.ones(3, np.float32)])
        assert raw.poll(5000)
        msg = M.decode(raw.recv_multipart())
        raw.close(0)
        assert msg.type == "ps_error" and "12 bytes, expected 8" in msg["message"]
        assert np.array_equal(c.pull(np.array([1, 2])), np.zeros((2, 2)))  # still serving
    finally:
        c.close()
        other.close()
        srv.stop()
        ctx.term()


def test_too_many_blocks_are_refused():
    cls = load_app(NMF_APP.read_text(), "nmf.py")
    with pytest.raises(AppError, match="--model-blocks must be <= 65536"):
        parse_app_args(cls, ["--input", "x", "--model-blocks", "100000000"])


def test_a_restarted_daemon_gets_its_lost_jobs_requeued(tmp_path):
    cl = LocalCluster(1, str(tmp_path / "c"), port=0, heartbeat_timeout=30.0)
    cl.start()
    try:
        with Client(cl.endpoint) as c:
            job = c.submit("toy.py", TOY_APP, ["--max-epochs", "100000", "--sleep", "0.01"], 1)
            wait_state(c, job, ("running",))
            while not c.status(job)["epochs"]:
                time.sleep(0.05)
            daemon = cl.procs[1]
            args = psutil.Process(daemon.pid).cmdline()
            daemon.kill()                       # and back within the heartbeat timeout
            daemon.wait()
            cl.procs[1] = subprocess.Popen(args, stdout=subprocess.DEVNULL,
                                           stderr=subprocess.DEVNULL)
            deadline = time.time() + 30
            while c.status(job)["attempt"] < 2:
                assert time.time() < deadline, "job stranded on the restarted daemon"
                time.sleep(0.2)
            st = c.status(job)
            assert any("executor on worker m0 is gone" in e[2] for e in st["events"])
            c.cancel(job)
    finally:
        cl.stop()


def test_cluster_down_on_a_damaged_record_is_no_traceback(tmp_path):
    """A cluster.json cut short (a full disk, a crash while written) or not
    a map: `cluster down` still looks for the cluster's processes by their
    command lines and removes the record, instead of a JSONDecodeError."""
    for text in ('{"pids": [1', "[1, 2]"):
        sd = tmp_path / f"c{len(text)}"
        sd.mkdir()
        (sd / "cluster.json").write_text(text)
        assert cluster_down(str(sd))
        assert not (sd / "cluster.json").exists()
    assert not cluster_down(str(tmp_path / "none"))


def test_cluster_down_never_signals_a_reused_pid(tmp_path):
    victim = subprocess.Popen(["sleep", "60"])
    try:
        sd = tmp_path / "c"
        sd.mkdir()
        (sd / "cluster.json").write_text(json.dumps(
            {"endpoint": "tcp://127.0.0.1:1", "pids": [victim.pid], "started": [12345.0]}))
        assert cluster_down(str(sd))
        time.sleep(0.3)
        assert victim.poll() is None, "an unrelated process was signalled"
    finally:
        victim.kill()
        victim.wait()
