"""Shared nothing: jobs resize, move and recover with their blocks streamed
over ZeroMQ, on local clusters whose daemons cannot see each other's disks.

The correctness oracle is an app whose every push adds known integers
(exact in float64): after any sequence of resizes, moves and a killed
worker, every epoch's model must equal the closed form exactly: no update
lost, none applied twice, and the app state carried in the input blocks
moved with them.
"""
import os
import random
import re
import signal
import time

import numpy as np
import pytest
import zmq

from harmony.client import Client, ClientError
from harmony.cluster import LocalCluster, isolation_unavailable
from harmony.ps.client import PSClient
from harmony.ps.keymap import block_of
from harmony.ps.server import ShardServer, ShardTable
from harmony.store.transfer import Payload, send_payloads, wait_acks
from apps_for_tests import ORACLE_APP, oracle_closed_form
from conftest import NMF_APP, run_cli, wait_state
from harmony.app import load_app, run_local
from harmony.datagen import gen_nmf

ISOLATION = isolation_unavailable()
BLOCKS = 12


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """3 machines, each daemon in its own mount namespace (master's and the
    other daemons' state dirs hidden behind an empty tmpfs). A resize runs
    at most 2 of its plan's moves at once (the default is 4), so that the
    limit binds on 3 machines: 1 -> 3 is 4 moves from one sender, in 2
    waves of 2 sent together."""
    if ISOLATION:
        pytest.skip(f"mount namespaces unavailable: {ISOLATION}")
    operator = tmp_path_factory.mktemp("operator")   # the user's disk: no daemon sees it
    cl = LocalCluster(3, str(tmp_path_factory.mktemp("fleet")), port=0, heartbeat_timeout=2.0,
                      isolate=True, hide=[str(operator)], max_moves=2)
    cl.operator = str(operator)
    cl.start()
    yield cl
    cl.stop()


def _oracle(c, tmp_path, epochs, machines=1, sleep=0.05, every=2):
    return c.submit("oracle.py", ORACLE_APP, ["--max-epochs", str(epochs), "--blocks",
                                              str(BLOCKS), "--iters-per-epoch", "2",
                                              "--sleep", str(sleep), "--model-blocks", "32"],
                    machines=machines, checkpoint_every=every, checkpoint_seconds=0)


def _check_exact(st):
    assert st["state"] == "finished", st.get("error")
    for i, ep in enumerate(st["epochs"]):
        assert ep["epoch"] == i
        want = oracle_closed_form(i + 1, BLOCKS)
        assert ep["metrics"] == want, (i, ep["metrics"], want)


def _wait(c, job, pred, timeout=60):
    deadline = time.time() + timeout
    while True:
        st = c.status(job)
        if pred(st):
            return st
        assert st["state"] not in ("failed", "finished", "cancelled"), st.get("error")
        assert time.time() < deadline, st
        time.sleep(0.02)


def test_daemons_cannot_see_each_others_disks(fleet):
    with Client(fleet.endpoint) as c:
        assert len([w for w in c.cluster()["workers"] if w["alive"]]) == 3
    # the proof is in /proc: each daemon's mount table hides the others
    me = fleet.procs[1].pid
    mounts = open(f"/proc/{me}/mounts").read()
    for other in ("m1", "m2"):
        assert os.path.join(fleet.state_dir, "workers", other) in mounts
    assert os.path.join(fleet.state_dir, "master") in mounts
    assert os.path.join(fleet.state_dir, "workers", "m0") not in mounts


def test_resizes_1_2_3_1_keep_every_update_exactly(fleet, tmp_path):
    rng = random.Random(11)
    with Client(fleet.endpoint) as c:
        job = _oracle(c, tmp_path, epochs=60)
        at = 1
        for n in (2, 3, 1):
            at += rng.randint(1, 4)
            _wait(c, job, lambda st: st["epochs_total"] >= at)
            time.sleep(rng.uniform(0, 0.1))          # somewhere inside an epoch
            assert c.resize(job, n)["state"] == "resizing"
            st = _wait(c, job, lambda st: st["move"] is None and len(st["workers"]) == n)
            at = st["epochs_total"]
        st = wait_state(c, job, ("finished", "failed"), timeout=120)
    _check_exact(st)
    moves = [e[2] for e in st["events"] if "now on" in e[2]]
    assert len(moves) == 3, st["events"]
    assert st["attempt"] == 1            # no restart: executors that stay keep running
    # each resize ran as Cruise's plan: 1 -> 2 adds m1, 2 -> 3 adds m2 (the
    # two senders' moves in waves), 3 -> 1 deletes two after their moves
    log = open(os.path.join(fleet.state_dir, "logs", "master.log")).read()
    plans = re.findall(rf"{job}: moving .* \(plan: (.*)\)", log)
    assert plans == ["{'add': 1, 'move': 2}", "{'add': 1, 'move': 4}",
                     "{'move': 4, 'delete': 2}"], plans


def test_roles_switch_online_and_keep_every_update_exactly(fleet, tmp_path):
    """Cruise's roles on the runtime: the same 3 machines go from all
    worker+server to 2 workers and 1 server (disjoint), to 1 worker and 3
    servers, then to 2 machines of both roles; blocks move at epoch
    boundaries while the job runs, and every epoch is still exact."""
    with Client(fleet.endpoint) as c:
        job = _oracle(c, tmp_path, epochs=50, machines=3)
        _wait(c, job, lambda st: st["epochs_total"] >= 2 and st["state"] == "running")
        with pytest.raises(Exception, match="cover"):
            c.resize(job, 3, workers=1, servers=1)
        for n, w, s, want_w, want_s in ((3, 2, 1, 2, 1), (3, 1, 3, 1, 3), (2, None, None, 2, 2)):
            at = c.status(job)["epochs_total"]
            assert c.resize(job, n, workers=w, servers=s)["state"] == "resizing"
            st = _wait(c, job, lambda st: st["move"] is None and len(st["workers"]) == n
                       and st["epochs_total"] > at)
            lay = st["layout"]
            if w is None:
                assert lay is None, lay                    # even again
                continue
            assert len(lay["workers"]) == want_w and len(lay["servers"]) == want_s, lay
            assert lay["workers"] == st["workers"][:want_w]
            assert lay["servers"] == st["workers"][n - want_s:]
            assert sum(lay["input_blocks"].values()) == BLOCKS
            assert sum(lay["model_blocks"].values()) == 32
            assert all(lay["input_blocks"][m] == 0 for m in st["workers"][want_w:])
            assert all(lay["model_blocks"][m] == 0 for m in st["workers"][:n - want_s])
            r = run_cli("status", job, "--master", fleet.endpoint)
            assert "roles      workers" in r.stdout, r.stdout + r.stderr
        st = wait_state(c, job, ("finished", "failed"), timeout=120)
    _check_exact(st)
    assert st["attempt"] == 1 and st["launches"] == 1


def test_a_move_onto_other_machines_and_back(fleet, tmp_path):
    with Client(fleet.endpoint) as c:
        job = _oracle(c, tmp_path, epochs=40, machines=2)
        st = _wait(c, job, lambda st: st["epochs_total"] >= 2 and st["state"] == "running")
        # 2 -> 2 on another pair: the job scheduler's kind of move
        c.resize(job, 3)
        _wait(c, job, lambda st: st["move"] is None and len(st["workers"]) == 3)
        c.resize(job, 2)
        st = wait_state(c, job, ("finished", "failed"), timeout=120)
    _check_exact(st)


@pytest.mark.parametrize("seed", [5])
def test_a_killed_worker_costs_at_most_one_checkpoint_interval(tmp_path, seed):
    if ISOLATION:
        pytest.skip(f"mount namespaces unavailable: {ISOLATION}")
    rng = random.Random(seed)
    every = 3
    cl = LocalCluster(3, str(tmp_path / "c"), port=0, heartbeat_timeout=1.5, isolate=True)
    cl.start()
    try:
        staged = tmp_path / "in.txt"
        staged.write_text("".join(f"{i} {i % 7} 1.0\n" for i in range(20000)))
        with Client(cl.endpoint) as c:
            c.data_put(str(staged), "in", chunk_bytes=16 << 10)
            job = _oracle(c, tmp_path, epochs=24, machines=2, every=every)
            kill_at = rng.randint(every + 1, 10)
            st = _wait(c, job, lambda st: st["epochs_total"] >= kill_at)
            time.sleep(rng.uniform(0, 0.1))
            victim = st["workers"][rng.randrange(len(st["workers"]))]
            done = c.status(job)["epochs_total"]
            cl.procs[1 + int(victim[1:])].send_signal(signal.SIGKILL)
            st = wait_state(c, job, ("finished", "failed"), timeout=180)
            _check_exact(st)
            requeue = [e[2] for e in st["events"] if "requeued" in e[2]]
            assert requeue and "lost" in requeue[0], st["events"]
            restart = int(requeue[0].split("restarts from epoch ")[1].split()[0]) \
                if "restarts from epoch" in requeue[0] else None
            resumed = [e[2] for e in st["events"] if "resumes at epoch" in e[2]]
            assert resumed, st["events"]
            at = int(resumed[-1].split("resumes at epoch ")[1].rstrip(")"))
            assert done - at <= every + 1, (done, at, st["events"])   # lost work bounded
            assert restart is None or restart == at
            # the lost machine's staged chunks were copied again: 2 live copies each
            deadline = time.time() + 30
            while (d := c.data_list()[0])["min_copies"] < 2 and time.time() < deadline:
                time.sleep(0.1)
            assert d["min_copies"] == 2 and victim not in d["holders"], d
    finally:
        cl.stop()


def test_shard_redirects_stale_requests_and_queues_until_data_arrives():
    """Cruise's ownership-first protocol on two real shards: after the
    handover the old owner answers with a redirect, and the new owner holds
    requests for a block until its data has arrived."""
    ctx = zmq.Context()
    nblocks, dim = 8, 2
    keys = np.arange(40, dtype=np.int64)
    bids = block_of(keys, nblocks)
    a, b = ShardTable(dim, "float64", None), ShardTable(dim, "float64", None)
    a.load(keys, np.tile(keys[:, None], (1, dim)).astype(float))   # a owns everything
    b.load(np.zeros(0, np.int64), np.zeros((0, dim)))
    sa, sb = ShardServer(ctx, "127.0.0.1", a), ShardServer(ctx, "127.0.0.1", b)
    sa.start(), sb.start()
    try:
        peers = [sa.endpoint, sb.endpoint]
        old = np.zeros(nblocks, np.int64)
        client = PSClient(ctx, peers, old, dim, "float64")
        sa.set_layout(old, 0, peers)
        np.testing.assert_array_equal(client.pull(keys)[:, 0], keys)
        new = old.copy()
        new[4:] = 1                      # blocks 4..7 move to shard b
        sb.expect(set(range(4, nblocks)))
        sb.set_layout(new, 1, peers)
        sa.set_layout(new, 0, peers)     # ownership first ...
        moving = a.take_blocks(set(range(4, nblocks)), nblocks)
        # ... a stale client is redirected to b, which holds the request
        import threading
        box = {}
        t = threading.Thread(target=lambda: box.update(rows=client.pull(keys)))
        t.start()
        time.sleep(0.3)
        assert t.is_alive() and client.redirects == 1     # held at the new owner
        sock = ctx.socket(zmq.DEALER)
        sock.connect(sb.endpoint)
        payloads = [Payload("model", bb, block=blk) for bb, blk in moving.items()]
        send_payloads([sock], "mv:test", payloads)         # ... then the data
        wait_acks(lambda d: sock, {(0, "model", bb) for bb in moving}, "mv:test", 10)
        t.join(10)
        np.testing.assert_array_equal(box["rows"][:, 0], keys)
        # pushes land exactly once, on the new owner
        client.push(keys, np.ones((len(keys), dim)))
        np.testing.assert_array_equal(client.pull(keys)[:, 0], keys + 1)
        assert set(block_of(b.keys, nblocks)) == set(range(4, nblocks))
        assert set(block_of(a.keys, nblocks)) == set(range(4)) & set(bids)
        sock.close(0)
        client.close()
    finally:
        sa.stop(), sb.stop()
        ctx.term()


def test_a_request_held_for_a_block_that_never_comes_is_answered_when_the_move_ends():
    """A request for a block on its way is held at the new owner; if the
    move ends without that block (its sender died), the request is answered
    then (an error naming the keys), not left to the client's timeout."""
    import threading
    ctx = zmq.Context()
    nblocks, dim = 8, 2
    b = ShardTable(dim, "float64", None)
    b.load(np.zeros(0, np.int64), np.zeros((0, dim)))
    sb = ShardServer(ctx, "127.0.0.1", b)
    sb.start()
    client = PSClient(ctx, [sb.endpoint], np.zeros(nblocks, np.int64), dim, "float64",
                      timeout_s=60)
    try:
        sb.set_layout(np.zeros(nblocks, np.int64), 0, [sb.endpoint])
        sb.expect(set(range(nblocks)))
        box = {}

        def pull():
            try:
                client.pull(np.arange(4, dtype=np.int64))
            except Exception as exc:        # noqa: BLE001 (the test reads it)
                box["error"] = exc
        t = threading.Thread(target=pull)
        t.start()
        time.sleep(0.3)
        assert t.is_alive()                 # held: its blocks are on their way
        t0 = time.monotonic()
        sb.end_arrivals()                   # ... and never come
        t.join(10)
        assert not t.is_alive() and time.monotonic() - t0 < 10
        assert "error" in box and "shard" in str(box["error"])
    finally:
        client.close()
        sb.stop()
        ctx.term()


def test_nmf_widened_by_the_scheduler_on_a_shared_nothing_fleet(fleet, ratings):
    """The reported failure: a job profiled on one machine and then widened
    to two read a checkpoint part from another host's disk."""
    with Client(fleet.endpoint) as c:
        job = c.submit("nmf.py", NMF_APP.read_text(),
                       ["--input", ratings, "--max-epochs", "12", "--rank", "6", "--blocks", "8"],
                       machines=1)
        _wait(c, job, lambda st: st["epochs_total"] >= 2)
        c.pause(job)
        wait_state(c, job, ("paused",))
        c.resume(job, machines=2)
        st = wait_state(c, job, ("finished", "failed"), timeout=120)
    assert st["state"] == "finished", st["error"]
    assert len(st["workers"]) == 2


def test_staged_input_is_read_by_machines_that_cannot_see_the_file(fleet):
    path = os.path.join(fleet.operator, "ratings.txt")
    gen_nmf(path, users=800, items=150, rank=4, per_user=15, noise=0.1, seed=5)
    args = ["--rank", "4", "--blocks", "6", "--max-epochs", "4"]
    with Client(fleet.endpoint) as c:
        # the daemons cannot read the operator's file ...
        job = c.submit("nmf.py", NMF_APP.read_text(), ["--input", path, *args], machines=2)
        st = wait_state(c, job, ("failed", "finished"))
        assert st["state"] == "failed" and "ratings.txt" in st["error"]
        # ... so it is staged: chunks on the workers' own stores, 2 copies each
        info = c.data_put(path, "ratings", chunk_bytes=32 << 10)
        assert info["chunks"] > 3
        ls = {d["name"]: d for d in c.data_list()}
        assert ls["ratings"]["chunks"] == info["chunks"] and len(ls["ratings"]["holders"]) == 3
        job = c.submit("nmf.py", NMF_APP.read_text(), ["--input", "harmony://ratings", *args],
                       machines=1)
        # a job that reads the data set holds it: removing it is refused, not
        # left to fail the job at its next resume
        with pytest.raises(ClientError, match=f"read by job.*{job}"):
            c.data_rm("ratings")
        st = wait_state(c, job, ("failed", "finished"))
        assert "ratings" in {d["name"] for d in c.data_list()}
    assert st["state"] == "finished", st["error"]
    ref = run_local(load_app(NMF_APP.read_text(), "nmf.py"), ["--input", path, *args])
    assert [e["metrics"]["objective"] for e in st["epochs"]] == \
        [h["objective"] for h in ref.history]          # the same bytes, bit for bit


def test_staging_from_the_cli_and_errors_naming_file_and_line(fleet):
    path = os.path.join(fleet.operator, "bad.txt")
    with open(path, "w") as fh:
        fh.write("1 2 3.0\n" * 500 + "1 2 oops\n" + "3 4 5.0\n" * 10)
    env = {"HARMONY_MASTER": fleet.endpoint}
    r = run_cli("data", "put", path, "--name", "bad", env=env)
    assert r.returncode == 0, r.stderr
    assert "harmony://bad" in r.stdout
    r = run_cli("data", "ls", env=env)
    assert "bad" in r.stdout
    r = run_cli("submit", str(NMF_APP), "--machines", "2", "--wait", "--input", "harmony://bad",
                "--max-epochs", "2", env=env, timeout=120)
    assert r.returncode == 1
    assert "bad.txt:501" in r.stdout + r.stderr        # the file's name and the bad line
    r = run_cli("submit", str(NMF_APP), "--input", "harmony://nope", env=env)
    assert r.returncode == 1 and "no staged data set 'nope'" in r.stderr
    r = run_cli("data", "rm", "bad", env=env)
    assert r.returncode == 0, r.stderr
    r = run_cli("data", "ls", "--json", env=env)
    assert "bad" not in [d["name"] for d in __import__("json").loads(r.stdout)]


def test_nmf_resized_mid_run_matches_the_run_that_stayed(fleet, ratings):
    """A real app across a live resize: with its mean reducer, NMF's math does
    not depend on the machine count, so widening it from 1 to 2 machines in
    the middle of a run gives the quality of the run that stayed on 1.

    The run is long (300 epochs, ~10 s) so that the move ends inside it:
    with the compiled kernels an epoch of this data takes ~13-30 ms, 30
    epochs ended 0.4 s after the resize, and the move took ~2 s. The move
    is awaited while the job runs (the test fails if the job ended first)."""
    args = ["--input", ratings, "--rank", "6", "--blocks", "8", "--max-epochs", "300"]
    with Client(fleet.endpoint) as c:
        stay = c.submit("nmf.py", NMF_APP.read_text(), args, machines=1)
        moved = c.submit("nmf.py", NMF_APP.read_text(), args, machines=1)
        _wait(c, moved, lambda st: st["epochs_total"] >= 5)
        assert c.resize(moved, 2)["state"] == "resizing"
        _wait(c, moved, lambda st: st["move"] is None and len(st["workers"]) == 2)
        a = wait_state(c, stay, ("finished", "failed"), timeout=180)
        b = wait_state(c, moved, ("finished", "failed"), timeout=180)
    assert a["state"] == b["state"] == "finished", (a["error"], b["error"])
    assert len(b["workers"]) == 2 and any("now on" in e[2] for e in b["events"])
    ra, rb = a["epochs"][-1]["metrics"]["rmse"], b["epochs"][-1]["metrics"]["rmse"]
    assert rb <= 1.1 * ra, (ra, rb)
    objs = [e["metrics"]["objective"] for e in b["epochs"]]
    assert objs[-1] < objs[4]          # it kept converging after the move


def test_a_file_that_changes_while_it_is_staged_is_not_recorded(fleet):
    """The file changes between data put's digests and its transfer: it
    is refused, nothing is recorded, and a job cannot read it (it was
    recorded with digests its chunks did not have, failing every job)."""
    from harmony.store.staging import StagingError
    path = os.path.join(fleet.operator, "moving.txt")
    gen_nmf(path, users=400, items=100, rank=4, per_user=15, noise=0.1, seed=6)

    def change(done: int, total: int) -> None:
        if done == 1:
            with open(path, "r+") as fh:
                fh.seek(0, os.SEEK_END)
                size = fh.tell()
                fh.seek(size // 2)
                fh.write("9")
    with Client(fleet.endpoint) as c:
        with pytest.raises(StagingError, match="changed while it was staged"):
            c.data_put(path, "moving", chunk_bytes=8 << 10, progress=change)
        assert "moving" not in {d["name"] for d in c.data_list()}
