"""Hardening on real processes: hostile input, damaged state, full disks,
retries that count failures only, daemons that follow a moved master."""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time

import lmdb
import msgpack
import numpy as np
import psutil
import pytest
import zmq

from harmony.comm.zmqutil import make_socket

import harmony.ps.client as ps_client
import harmony.ps.server as ps_server
from harmony.app import App
from harmony.client import Client, ClientError
from harmony.cluster import LocalCluster
from harmony.comm import messages as M
from harmony.master.jobs import MAX_ATTEMPTS, JobState
from harmony.ps.client import PSClient, PSError
from harmony.ps.server import NonFiniteUpdate, ShardServer, ShardTable
from apps_for_tests import TOY_APP
from conftest import run_cli, wait_state

MiB = 1 << 20
LONG = ["--max-epochs", "100000", "--sleep", "0.02"]


# -- helpers -------------------------------------------------------------------------------
def start_master(state_dir, *extra: str, env: dict | None = None,
                 timeout: float = 60) -> tuple[subprocess.Popen, str]:
    """``harmony-master start`` on a random port; (process, endpoint)."""
    state_dir = str(state_dir)
    mjson = os.path.join(state_dir, "master.json")
    if os.path.exists(mjson):
        os.unlink(mjson)
    log = open(os.path.join(os.path.dirname(state_dir), "master.log"), "ab")
    proc = subprocess.Popen([sys.executable, "-m", "harmony.master", "start", "--port", "0",
                             "--state-dir", state_dir, "--log-level", "INFO", *extra],
                            stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, **(env or {})})
    deadline = time.time() + timeout
    while not os.path.exists(mjson):
        if proc.poll() is not None:
            raise AssertionError(f"master exited with {proc.returncode}: "
                                 f"{open(log.name).read()[-2000:]}")
        assert time.time() < deadline, "master did not start"
        time.sleep(0.05)
    return proc, json.load(open(mjson))["endpoint"]


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def master_refuses(state_dir, *extra: str) -> str:
    """Start a master that must refuse: its error text."""
    r = subprocess.run([sys.executable, "-m", "harmony.master", "start", "--port", "0",
                        "--state-dir", str(state_dir), *extra], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1, f"the master started (or crashed: {r.returncode}): {r.stderr}"
    return r.stderr


def fill_disk(d) -> str:
    """Fill the file system of ``d``; the filler's path."""
    path = os.path.join(str(d), "filler")
    with open(path, "wb", buffering=0) as fh:
        for size in (MiB, 4096, 1):
            try:
                while True:
                    fh.write(b"\0" * size)
            except OSError:
                pass
    return path


@pytest.fixture
def small_fs(tmp_path):
    """A small tmpfs: a disk that fills up (needs root to mount)."""
    if os.geteuid() != 0:
        pytest.skip("a full disk is emulated with a small tmpfs, which needs root to mount")
    d = tmp_path / "small"
    d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "harmony-test-full", str(d)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    yield d
    subprocess.run(["umount", "-l", str(d)], capture_output=True)


# -- hostile input -------------------------------------------------------------------------
def _flood_payloads(rng: random.Random) -> list[list[bytes]]:
    lists = msgpack.packb({"t": "heartbeat", "name": "x", "executors": [["ab"] * 16000] * 20})
    dicts = msgpack.packb({"t": "heartbeat", "name": "x", "executors": [[{}] * 16000] * 20})
    return [
        [rng.randbytes(2 * MiB)],                                 # garbage under the cap
        [rng.randbytes(rng.randrange(1, 4096))],                  # small garbage
        [b"\xdd\xff\xff\xff\xff"], [b"\xdf\xff\xff\xff\xff"],     # 4G elements declared
        [b"\xdb\xff\xff\xff\xff" + b"x" * 64],                    # a 4 GB string declared
        [b"\x81\xa1t" + b"\x91" * 100_000 + b"\xc0"],             # nested 100000 deep
        [msgpack.packb({"t": "cancel", "job": "j", "x": eval("[" * 40 + "]" * 40)})],
        [b"x" * 100] * 40,                                        # too many frames
        [lists], [dicts],                                         # value budget bombs
        [msgpack.packb({"t": "x" * 1_000_000})],                  # unknown, long type
        [msgpack.packb({"t": "cancel", **{f"f{i}": i for i in range(5000)}})],
        [msgpack.packb({"t": "submit", "app_name": "a.py",
                        "app_source": "#" * (M.MAX_APP_SOURCE + 1024), "args": [],
                        "machines": 1})],                         # app source over 4 MiB
        [msgpack.packb({"t": "heartbeat", "name": "m0", "executors": ["j"] * 5000,
                        "stats": {"cpu": "x" * 60000}})],         # from a stranger
        [M.encode("job_status", job="job-9999")],
    ]


def flood(socks: list, pick, probe, seconds: float, limit: int) -> tuple[list[float], int]:
    """Send ``pick(i)`` on every socket ``i`` in turn without blocking, for
    ``seconds`` or ``limit`` messages; every 0.25 s time ``probe()``.
    Returns (probe latencies, messages sent)."""
    lat, sent, t0, last = [], 0, time.time(), 0.0
    while time.time() - t0 < seconds and sent < limit:
        for i, s in enumerate(socks):
            try:
                s.send_multipart(pick(i), zmq.NOBLOCK)
                sent += 1
            except zmq.Again:
                pass
        if time.time() - last >= 0.25:
            last = time.time()
            t = time.perf_counter()
            probe()
            lat.append(time.perf_counter() - t)
        else:
            time.sleep(0.002)
    return lat, sent


def test_a_flood_of_hostile_messages_leaves_the_master_answering(tmp_path):
    """Oversized frames, garbage, container and nesting bombs, too many
    frames, unknown types, spoofed heartbeats, from 4 connections on
    loopback until 1500 are sent (at most 20 s): the master answers ``cluster_info``
    within 1 s (median over the probes) and its RSS grows < 100 MiB."""
    proc, ep = start_master(tmp_path / "m")
    ctx = zmq.Context()
    socks = []
    try:
        rss = psutil.Process(proc.pid).memory_info
        with Client(ep, timeout_s=10) as c:
            c.cluster()
            time.sleep(0.3)
            rss0 = peak = rss().rss
            for i in range(4):
                # authenticated users gone bad (strangers never get past the
                # handshake: tests/test_security.py), and one stranger
                s = make_socket(ctx, zmq.DEALER, keys=c.keys) if i < 3 else ctx.socket(zmq.DEALER)
                s.setsockopt(zmq.LINGER, 0)
                s.setsockopt(zmq.SNDHWM, 4)              # bounded here too
                s.setsockopt(zmq.RCVHWM, 1)          # never reads its error replies
                s.connect(ep)
                socks.append(s)
            rng = random.Random(7)
            payloads = _flood_payloads(rng)
            oversized = [[b"\0" * (M.MASTER_MAX_BYTES + 1)], [rng.randbytes(12 * MiB)]]
            peaks = [peak]

            def probe() -> None:
                c.cluster()
                peaks.append(rss().rss)
            lat, sent = flood(socks, lambda i: rng.choice(oversized if i == 0 else payloads),
                              probe, seconds=20, limit=1500)
            peak = max(peaks)
            for s in socks:
                s.close(0)
            socks.clear()
            time.sleep(1.0)
            info = c.cluster()["master"]
            end = rss().rss
        assert proc.poll() is None
        assert len(lat) >= 10 and statistics.median(lat) < 1.0, lat
        assert info["bad_messages"] >= 100, info
        assert peak - rss0 < 100 * MiB, f"RSS grew {(peak - rss0) / MiB:.0f} MiB"
        assert end - rss0 < 100 * MiB
        print(f"flood: {sent} messages, {info['bad_messages']} refused; probes median "
              f"{statistics.median(lat) * 1000:.0f} ms, max {max(lat) * 1000:.0f} ms; RSS "
              f"+{(peak - rss0) / MiB:.0f} MiB at peak, +{(end - rss0) / MiB:.0f} MiB after")
    finally:
        for s in socks:
            s.close(0)
        ctx.term()
        stop(proc)
    log = open(tmp_path / "master.log").read()
    assert log.count("malformed message") <= 200      # warnings rate-limited


def test_heartbeat_stats_schema_and_metrics_logs_rotate(tmp_path):
    sd = tmp_path / "m"
    proc, ep = start_master(sd, env={"HARMONY_METRICS_LOG_BYTES": "2000"})
    ctx = zmq.Context()
    from harmony.comm import security
    d = make_socket(ctx, zmq.DEALER, keys=security.Keys.load(
        security.init_keys(os.environ["HARMONY_KEYS"], workers=["w1"]), "worker", "w1"))
    d.setsockopt(zmq.LINGER, 0)
    d.connect(ep)

    def ask(mtype, **f):
        d.send(M.encode(mtype, **f))
        while True:
            assert d.poll(10_000), f"no answer to {mtype}"
            msg = M.decode(d.recv_multipart())
            if msg.type != "kill":          # for the unknown jobs it reported
                return msg
    try:
        assert ask("register", name="w1", host="127.0.0.1", cpus=1, memory=1 << 30, pid=1,
                   executors=[]).type == "registered"
        good = {"t": 1.0, "dt": 1.0, "cpu": 0.5, "mem": 0.25, "q_cpu": 0.0, "q_net": 0.0}
        for i in range(120):
            assert ask("heartbeat", name="w1", executors=[], stats={**good, "t": float(i)}
                       ).type == "hb_ack"
        # stats off the schema are dropped; the heartbeat still counts
        for bad in ({"cpu": "lots", "dt": 1.0}, {"dt": 1.0, "mem": float("nan")},
                    {str(i): 1.0 for i in range(100)}, {**good, "t": 119.0, "junk": "x" * 60000}):
            assert ask("heartbeat", name="w1", executors=["j"] * 3000,
                       stats=bad).type == "hb_ack"
        with Client(ep, timeout_s=10) as user:   # a user's view (a worker may not read)
            ws = user.cluster()["workers"]
        assert ws[0]["alive"] and set(ws[0]["utilization"]) <= M.STATS_KEYS
        assert ws[0]["utilization"]["t"] == 119.0
    finally:
        d.close(0)
        ctx.term()
        stop(proc)
    logs = sorted(os.listdir(sd / "metrics"))
    assert {"machines.jsonl", "machines.jsonl.1", "machines.jsonl.2",
            "machines.jsonl.3"} <= set(logs) and "machines.jsonl.4" not in logs
    for name in logs:
        assert os.path.getsize(sd / "metrics" / name) <= 2000 + 200
    lines = [json.loads(x) for x in open(sd / "metrics" / "machines.jsonl")]
    assert lines and all(set(x) <= M.STATS_KEYS | {"machine"} for x in lines)


# -- the PS data plane ---------------------------------------------------------------------
@pytest.fixture
def shard():
    ctx = zmq.Context()
    table = ShardTable(4, "float32", None)
    table.load(np.arange(1000), np.zeros((1000, 4), np.float32))
    srv = ShardServer(ctx, "127.0.0.1", table, tag="j:1")
    srv.start()
    c = PSClient(ctx, [srv.endpoint], np.zeros(1, np.int64), 4, timeout_s=10, tag="j:1")
    yield srv, c
    c.close()
    srv.stop()
    ctx.term()


def test_a_pull_asking_a_key_twice_is_refused(shard):
    srv, c = shard
    with pytest.raises(PSError, match=r"duplicate keys in one pull \(key 7 more than once\)"):
        c.pull(np.array([3, 7, 7, 9]))
    with pytest.raises(PSError, match=r"duplicate keys in one pull \(key 5"):
        c.pull(np.array([5, 1, 5]))          # unsorted too
    assert c.pull(np.array([9, 3])).shape == (2, 4)      # unsorted, unique: served


def test_pulls_and_pushes_over_the_frame_cap_are_split_or_refused(monkeypatch):
    """The client splits a pull or push whose rows exceed the shards' cap per
    frame; a raw request over it is refused; a frame over the socket's
    ZMQ_MAXMSGSIZE disconnects its sender, and the shard serves on."""
    monkeypatch.setattr(ps_server, "MAX_FRAME_BYTES", 1024)
    monkeypatch.setattr(ps_client, "MAX_FRAME_BYTES", 1024)
    ctx = zmq.Context()
    table = ShardTable(4, "float32", None)
    table.load(np.arange(1000), np.zeros((1000, 4), np.float32))
    srv = ShardServer(ctx, "127.0.0.1", table, tag="j:1")
    srv.start()
    c = PSClient(ctx, [srv.endpoint], np.zeros(1, np.int64), 4, timeout_s=10, tag="j:1")
    raw = ctx.socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(srv.endpoint)
    try:
        keys = np.arange(0, 1000, 2)                    # 500 rows of 16 bytes: 8 requests
        c.push(keys, np.ones((500, 4), np.float32))
        rows = c.pull(np.arange(1000))
        assert rows[::2].sum() == 500 * 4 and rows[1::2].sum() == 0
        before = srv.requests
        c.pull(keys)
        assert srv.requests - before == 8
        raw.send_multipart([M.encode("pull", rid=5, n=100, tag="j:1"),
                            np.arange(100, dtype=np.int64)])
        assert raw.poll(10_000)
        msg = M.decode(raw.recv_multipart())
        assert msg.type == "ps_error" and "over the shard's cap of 1024 bytes" in msg["message"]
        n = 300_000                                   # a 2.4 MB keys frame: over MAXMSGSIZE
        raw.send_multipart([M.encode("push", rid=6, n=n, dim=4, tag="j:1"),
                            np.arange(n, dtype=np.int64), np.zeros(4 * n, np.float32)])
        assert not raw.poll(1000)                     # dropped with its connection
        assert c.pull(np.array([0, 1])).tolist() == [[1.0] * 4, [0.0] * 4]   # still serving
    finally:
        raw.close(0)
        c.close()
        srv.stop()
        ctx.term()


def test_a_push_with_non_finite_values_is_refused(shard):
    srv, c = shard
    d = np.ones((3, 4), np.float32)
    d[1, 2] = np.nan
    with pytest.raises(PSError, match=r"push refused: 1 of 12 values are not finite .*key 5"):
        c.push(np.array([4, 5, 6]), d)
    d[1, 2] = np.inf
    with pytest.raises(PSError, match="not finite"):
        c.push(np.array([4, 5, 6]), d)
    assert not c.pull(np.arange(1000)).any()               # nothing applied
    c.push(np.array([4]), np.full((1, 4), 3e38, np.float32))   # large but finite
    # an app may let them through (App.finite_updates = False)
    assert App.finite_updates is True
    assert not ShardTable(4, "float32", None, finite=False).finite
    assert not ShardTable(4, "int64", None).finite             # only float models

    class Lenient(App):
        finite_updates = False

        def update(self, rows, deltas):
            return rows + deltas
    t = ShardTable(2, "float32", Lenient.__new__(Lenient).update)
    t.load(np.arange(2), np.zeros((2, 2), np.float32))
    t.push(np.arange(2), np.full((2, 2), np.nan, np.float32))
    assert np.isnan(t.rows).all()


@pytest.fixture(params=["numpy", "compiled"])
def finite_check(request, monkeypatch):
    """Both ways a shard checks a push's values: numpy's sum (a process
    without numba) and the compiled loop (harmony.kernels.finite, loaded)."""
    from harmony.kernels import finite
    if request.param == "compiled":
        finite.load(("float16", "float32", "float64"))
    monkeypatch.setattr(finite, "loaded", request.param == "compiled")
    return request.param


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "complex64"])
def test_the_finite_check_is_exact_whatever_the_sum(dtype, finite_check):
    """Either check refuses a NaN or an infinity anywhere (alone, or +inf
    with -inf), and the push changes nothing; finite values whose sum
    overflows pass. numpy's check sums the deltas and looks at every value
    only when the sum is not finite; the compiled one tests exponent bits."""
    from harmony.kernels import finite
    t = ShardTable(8, dtype, None)
    probe = np.ones((2, 8), dtype)      # which check this process runs
    assert (finite.all_finite(probe) is None) == (finite_check == "numpy")
    n = 3000                                    # past numpy's pairwise blocks
    t.load(np.arange(n), np.zeros((n, 8), dtype))
    big = float(np.finfo(dtype).max) / 2
    for bad in ([np.nan], [np.inf], [-np.inf], [np.inf, -np.inf]):
        for at in (0, n * 8 // 2 + 3, n * 8 - 1):
            d = np.ones((n, 8), dtype)
            d.flat[at:at + len(bad)] = bad
            with pytest.raises(NonFiniteUpdate, match="not finite"):
                t.push(np.arange(n), d)
    assert not t.rows.any()                     # nothing applied
    d = np.zeros((n, 8), dtype)
    d[0, :4] = big                              # the sum overflows; every value is finite
    t.push(np.arange(n), d)
    assert np.isfinite(t.rows).all() and t.rows[0, 0] == np.array(big, dtype)


def test_the_compiled_check_declines_what_it_cannot_read():
    """Arrays the compiled loop would misread go to numpy's check: not
    contiguous, another byte order, not floats, a width it has no mask for."""
    from harmony.kernels import finite
    finite.load()
    d = np.ones((6, 4), np.float32)
    assert finite.all_finite(d) is True
    d[5, 3] = np.nan
    assert finite.all_finite(d) is False
    assert finite.all_finite(d[:, :2]) is None                  # not contiguous
    assert finite.all_finite(d.astype(">f4")) is None           # big-endian
    assert finite.all_finite(np.ones(4, np.int32)) is None
    assert finite.all_finite(np.ones(4, np.longdouble)) is None
    ro = np.full(33, np.inf, np.float64)                        # a received frame's array
    ro.flags.writeable = False
    assert finite.all_finite(ro) is False


NAN_APP = TOY_APP.replace("        return np.full(rows.shape, 0.1, dtype=np.float32)",
                          "        return np.full(rows.shape, np.nan if step.epoch >= 2 "
                          "else 0.1, dtype=np.float32)")


def test_a_job_pushing_nan_fails_with_a_clear_error(client):
    job = client.submit("nan.py", NAN_APP, ["--max-epochs", "10"], machines=2)
    st = wait_state(client, job, ("finished", "failed"), timeout=90)
    assert st["state"] == "failed"
    assert "push refused" in st["error"] and "not finite" in st["error"]
    assert 1 <= len(st["epochs"]) <= 2                  # epochs 0 and 1 ran


# -- retries count failures only -------------------------------------------------------------
def test_pauses_and_resumes_are_launches_not_attempts(client):
    job = client.submit("toy.py", TOY_APP, LONG, machines=1)
    st = wait_state(client, job, ("running",))
    for _ in range(MAX_ATTEMPTS + 1):
        deadline = time.time() + 60
        while not client.status(job)["epochs"]:
            assert time.time() < deadline
            time.sleep(0.05)
        client.pause(job)
        wait_state(client, job, ("paused",), timeout=60)
        client.resume(job)
        st = wait_state(client, job, ("running",), timeout=60)
    assert (st["attempt"], st["failures"], st["launches"]) == (1, 0, MAX_ATTEMPTS + 2)
    assert any(f"(launch {MAX_ATTEMPTS + 2})" in e[2] for e in st["events"])
    client.cancel(job)


def test_only_failures_count_toward_max_attempts():
    """The master core's bookkeeping on a job (no sockets): failures start
    attempts, every other relaunch is only a launch, the failure after the
    last attempt fails the job, and a master restart never exhausts the
    attempts."""
    from harmony.master import core as C

    def master(jobs=None):
        m = C.MasterCore(jobs)
        m.workers["w"] = C.Worker("w", b"w", "127.0.0.1", 1, 1 << 30, 1, 0.0)
        return m

    def submit(m):
        cmds = m.handle(C.Received(b"c", M.Message("submit", {
            "app_name": "a.py", "app_source": "", "args": [], "machines": 1}, [])), 1.0)
        admit, = [c for c in cmds if isinstance(c, C.Admit)]
        admit.job.id = "job-0001"
        m.handle(C.Admitted(b"c", admit.job), 1.0)
        return admit.job

    m = master()
    job = submit(m)

    def relaunch():            # a pause and a resume elsewhere, as the scheduler does
        m.runs.pop(job.id)
        job.transition(JobState.PAUSED)
        m._launch(job, ["w"])
    m._launch(job, ["w"])
    for _ in range(5):
        relaunch()
    assert (job.attempt, job.failures, job.launches) == (1, 0, 6)
    assert m.runs[job.id].attempt == 6                 # the executors' tag
    m._retry_or_fail(job, "worker w lost")
    m._launch(job, ["w"])
    relaunch()
    assert (job.attempt, job.failures, job.launches) == (2, 1, 8)
    m._retry_or_fail(job, "worker w lost")
    m._launch(job, ["w"])
    assert job.attempt == MAX_ATTEMPTS
    m._retry_or_fail(job, "worker w lost")
    assert job.state == JobState.FAILED
    assert job.error.endswith(f"gave up after {MAX_ATTEMPTS} attempts")
    # a master restart counts as a failure of a running job, but never the last one
    m = master()
    job = submit(m)
    for _ in range(MAX_ATTEMPTS + 2):
        m._launch(job, ["w"])
        m = master({job.id: job})
        m.recover(2.0)
        assert job.state == JobState.WAITING and job.failures <= MAX_ATTEMPTS - 1
    m._launch(job, ["w"])
    assert job.attempt == MAX_ATTEMPTS


# -- the job table: damage, quarantine, recovery ----------------------------------------------
@pytest.fixture(scope="module")
def history(tmp_path_factory):
    """A master's state dir with three jobs, stopped cleanly (its last good
    copy taken)."""
    sd = tmp_path_factory.mktemp("history") / "m"
    proc, ep = start_master(sd)
    try:
        with Client(ep) as c:
            ids = [c.submit("toy.py", TOY_APP, ["--max-epochs", "1"], 1) for _ in range(3)]
    finally:
        stop(proc)
    assert os.path.exists(sd / "master.lmdb.bak")
    return sd, ids


def _copy(history, tmp_path):
    sd = tmp_path / "m"
    shutil.copytree(history[0], sd)
    return sd, sd / "master.lmdb" / "data.mdb"


@pytest.mark.parametrize("damage, why", [
    ("empty", "it is empty (0 bytes)"),
    ("half", "it is truncated"),
    ("three pages", "it is truncated"),
    ("meta pages", "meta page"),
    ("every page", "is damaged"),
])
def test_a_damaged_job_table_refuses_the_start(history, tmp_path, damage, why):
    sd, data = _copy(history, tmp_path)
    size = os.path.getsize(data)
    if damage == "empty":
        os.truncate(data, 0)
    elif damage == "half":
        os.truncate(data, size // 2)
    elif damage == "three pages":
        assert size > 3 * 4096
        os.truncate(data, 3 * 4096)
    else:
        with open(data, "r+b") as fh:
            if damage == "meta pages":
                fh.write(b"\0" * 8192)
            else:
                fh.seek(8192)
                fh.write(random.Random(3).randbytes(size - 8192))
    err = master_refuses(sd)
    assert str(data) in err and why in err, err
    assert "--recover" in err and "master.lmdb.bak" in err


def test_recover_restores_the_last_good_copy(history, tmp_path):
    sd, data = _copy(history, tmp_path)
    os.truncate(data, os.path.getsize(data) // 2)
    proc, ep = start_master(sd, "--recover")
    try:
        with Client(ep) as c:
            assert [j["id"] for j in c.jobs()] == history[1]
            new = c.submit("toy.py", TOY_APP, ["--max-epochs", "1"], 1)
            assert new == "job-0004"                      # numbers never reused
    finally:
        stop(proc)
    assert any(n.startswith("master.lmdb.damaged-") for n in os.listdir(sd))
    proc, ep = start_master(sd)                          # and it starts normally after
    try:
        with Client(ep) as c:
            assert len(c.jobs()) == 4
    finally:
        stop(proc)


def test_a_missing_table_over_a_history_refuses_the_start(history, tmp_path):
    sd, _ = _copy(history, tmp_path)
    shutil.rmtree(sd / "master.lmdb")
    err = master_refuses(sd)
    assert "is missing" in err and "master-history.json" in err and "job-0003" in err
    proc, ep = start_master(sd, "--recover")
    try:
        with Client(ep) as c:
            assert [j["id"] for j in c.jobs()] == history[1]
    finally:
        stop(proc)
    # no backup either: refused, saying how to start over
    shutil.rmtree(sd / "master.lmdb")
    os.unlink(sd / "master.lmdb.bak")
    err = master_refuses(sd, "--recover")
    assert "no backup copy" in err and "move" in err


def test_a_damaged_record_is_quarantined_and_shown(history, tmp_path):
    sd, _ = _copy(history, tmp_path)
    victim = history[1][1]
    env = lmdb.open(str(sd / "master.lmdb"), max_dbs=8)
    with env.begin(write=True) as txn:
        txn.put(victim.encode(), b"\x93\x01\x02", db=env.open_db(b"jobs", txn=txn))
    env.close()
    proc, ep = start_master(sd)
    try:
        r = run_cli("jobs", "--master", ep, "--json")
        jobs = {j["id"]: j for j in json.loads(r.stdout)}
        assert set(jobs) == set(history[1])
        assert jobs[victim]["state"] == "failed" and "quarantined" in jobs[victim]["error"]
        assert all(jobs[j]["state"] == "waiting" for j in history[1] if j != victim)
        r = run_cli("jobs", "--master", ep)
        assert victim in r.stdout and "failed" in r.stdout
    finally:
        stop(proc)
    assert "quarantine" in open(sd.parent / "master.log").read()
    env = lmdb.open(str(sd / "master.lmdb"), max_dbs=8, readonly=True, lock=False)
    with env.begin() as txn:
        assert txn.get(f"jobs/{victim}".encode(), db=env.open_db(b"quarantine", txn=txn)) \
            == b"\x93\x01\x02"
    env.close()


# -- full disks ------------------------------------------------------------------------------
def test_a_full_disk_refuses_submissions_and_keeps_the_table(small_fs, tmp_path):
    sd = small_fs / "m"
    proc, ep = start_master(sd)
    accepted, refused = [], None
    try:
        with Client(ep) as c:
            accepted.append(c.submit("toy.py", TOY_APP, ["--max-epochs", "1"], 1))
            filler = fill_disk(small_fs)
            for _ in range(200):       # LMDB reuses its free pages first
                try:
                    accepted.append(c.submit("toy.py", TOY_APP, ["--max-epochs", "1"], 1))
                except ClientError as exc:
                    refused = exc
                    break
            assert refused is not None, "submissions accepted on a full disk"
            assert refused.code == "table_full"
            assert "no space left on device" in str(refused) and "not submitted" in str(refused)
            assert [j["id"] for j in c.jobs()] == accepted
            c.cluster()                                   # still answering
            os.unlink(filler)
            accepted.append(c.submit("toy.py", TOY_APP, ["--max-epochs", "1"], 1))
    finally:
        stop(proc)
    proc, ep = start_master(sd)           # the table verifies: nothing half written
    try:
        with Client(ep) as c:
            assert [j["id"] for j in c.jobs()] == accepted
    finally:
        stop(proc)


def test_a_full_disk_at_launch_fails_that_job_only(small_fs, tmp_path):
    """The worker's disk is full when a job is launched: that job fails with
    the cause, the daemon and the job already running on it go on."""
    root = tmp_path / "c"
    (root / "workers").mkdir(parents=True)
    os.symlink(small_fs, root / "workers" / "m0")
    cl = LocalCluster(1, str(root), port=0)
    cl.start()
    filler = None
    try:
        with Client(cl.endpoint) as c:
            a = c.submit("toy.py", TOY_APP, LONG, 1, checkpoint_every=0, checkpoint_seconds=0)
            wait_state(c, a, ("running",))
            deadline = time.time() + 60
            while not c.status(a)["epochs"]:
                assert time.time() < deadline
                time.sleep(0.05)
            filler = fill_disk(small_fs)
            b = c.submit("toy.py", TOY_APP, ["--max-epochs", "2"], 1)
            st = wait_state(c, b, ("failed", "finished"), timeout=60)
            assert st["state"] == "failed", st
            assert "cannot start the executor: no space left on device: " in st["error"]
            assert "spec.msgpack" in st["error"]
            n = len(c.status(a)["epochs"])
            deadline = time.time() + 30
            while len(c.status(a)["epochs"]) < n + 3:
                assert time.time() < deadline, "the running job stalled"
                time.sleep(0.1)
            assert c.status(a)["state"] == "running"
            assert cl.procs[1].poll() is None and c.cluster()["workers"][0]["alive"]
            os.unlink(filler)
            filler = None
            d = c.submit("toy.py", TOY_APP, ["--max-epochs", "2"], 1)
            assert wait_state(c, d, ("failed", "finished"), timeout=60)["state"] == "finished"
            c.cancel(a)
    finally:
        if filler:
            os.unlink(filler)
        cl.stop()


# -- daemons follow a master that moved ----------------------------------------------------
def test_daemons_follow_a_master_restarted_on_another_port(tmp_path):
    cl = LocalCluster(1, str(tmp_path / "c"), port=0, heartbeat_timeout=3.0)
    cl.start()
    try:
        old = cl.endpoint
        stop(cl.procs[0])
        assert not os.path.exists(cl.master_file)
        proc, ep = start_master(os.path.join(cl.state_dir, "master"), "--master-file",
                                cl.master_file, "--heartbeat-timeout", "3")
        cl.procs[0] = proc
        assert ep != old and json.load(open(cl.master_file))["endpoint"] == ep
        with Client(ep) as c:
            deadline = time.time() + 40
            while not [w for w in c.cluster()["workers"] if w["alive"]]:
                assert time.time() < deadline, "the daemon did not find the moved master"
                time.sleep(0.2)
            job = c.submit("toy.py", TOY_APP, ["--max-epochs", "2"], 1)
            assert wait_state(c, job, ("failed", "finished"), timeout=60)["state"] == "finished"
        assert "the master moved" in open(os.path.join(cl.state_dir, "logs",
                                                        "worker-m0.log")).read()
    finally:
        cl.stop()


def test_the_last_good_copy_is_taken_every_n_state_changes(tmp_path, monkeypatch):
    import harmony.master.jobdb as jobdb
    from harmony.master.jobs import Job
    monkeypatch.setattr(jobdb, "BACKUP_EVERY", 3)
    monkeypatch.setattr(jobdb, "BACKUP_MIN_S", 0.0)
    db = jobdb.JobDB(str(tmp_path))
    bak = tmp_path / "master.lmdb.bak"
    jobs = [Job(id=f"job-{db.next_seq():04d}", app_name="a", app_source="", args=[],
                machines=1) for _ in range(4)]
    for j in jobs[:2]:
        db.save(j)
    assert not bak.exists()
    db.save(jobs[2])                                     # the third state change
    assert bak.exists() and jobdb.check_lmdb_file(str(bak))["size"] > 0
    env = lmdb.open(str(bak), subdir=False, readonly=True, lock=False, max_dbs=8)
    with env.begin() as txn:
        assert txn.stat(env.open_db(b"jobs", txn=txn, create=False))["entries"] == 3
    env.close()
    db.save(jobs[3])
    db.close(backup=False)


def test_daemon_sockets_drop_frames_over_their_cap(tmp_path):
    """#12: the data service reads frames up to a block chunk (8 MiB) plus a
    header's room, the daemon's executor socket small control messages;
    a larger frame disconnects its sender (ZMQ_MAXMSGSIZE) and both serve on."""
    from harmony.store import staging
    from harmony.store.transfer import CHUNK_BYTES
    from harmony.worker import daemon as wd, dataservice
    from harmony.worker.daemon import Daemon
    d = Daemon("tcp://127.0.0.1:9", name="m0", state_dir=str(tmp_path / "w"))
    ctx = d.ctx
    socks = []

    def dealer(endpoint):
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(endpoint)
        socks.append(s)
        return s
    try:
        assert d.data.sock.getsockopt(zmq.MAXMSGSIZE) == dataservice.MAX_FRAME_BYTES \
            > CHUNK_BYTES
        assert d.xsock.getsockopt(zmq.MAXMSGSIZE) == wd.EXEC_MAX_BYTES
        # the largest legitimate frame, a full 8 MiB chunk, goes through
        big = np.random.default_rng(1).bytes(CHUNK_BYTES)
        staging.push_chunks(ctx, d.data.endpoint, "d", [(0, big)])
        assert d.data.chunks.get("d", 0) == big
        ask = M.encode("ckpt_manifest", job="j", epoch=0, index=0)
        raw = dealer(d.data.endpoint)
        raw.send_multipart([ask, b"\0" * (dataservice.MAX_FRAME_BYTES + 1)])
        assert not raw.poll(1000)                          # dropped with its connection
        ok = dealer(d.data.endpoint)
        ok.send(ask)
        assert ok.poll(5000)
        assert "no part 0 of job j" in M.decode(ok.recv_multipart())["message"]
        # the executors' socket: nothing over its cap reaches the daemon
        raw = dealer(d.xendpoint)
        raw.send(M.encode("hello", job="j", index=0, attempt=1) + b"\0" * wd.EXEC_MAX_BYTES)
        assert not d.xsock.poll(500)
        ok = dealer(d.xendpoint)
        ok.send(M.encode("hello", job="j", index=0, attempt=1))
        assert d.xsock.poll(5000)
        d._handle_exec(d.xsock.recv_multipart())          # not its executor: aborted
        assert ok.poll(5000) and M.decode(ok.recv_multipart()).type == "abort"
    finally:
        for s in socks:
            s.close(0)
        d.shutdown()
