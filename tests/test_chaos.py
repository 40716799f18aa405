"""Chaos: kill -9 an executor, a worker daemon and the master at random
points of a 2-machine run; the job still finishes with the result of an
undisturbed run, and nothing is left behind.

The job is the oracle app (every push adds known integers, input blocks
carry counters), so "the same result" is exact. A 2-machine NMF run is not
comparable this way: its float32 pushes from two machines are applied in
arrival order, and SGD carries that rounding on (two runs seen 0.04% and
0.5% apart after 24 epochs)."""
import os
import random
import signal
import time

import psutil
import pytest

from harmony.client import Client
from harmony.cluster import LocalCluster
from harmony.store.lmdb_store import sweep_stale
from apps_for_tests import ORACLE_APP, oracle_closed_form
from conftest import ISOLATE, wait_state

EPOCHS, BLOCKS = 40, 12
ARGS = ["--blocks", str(BLOCKS), "--max-epochs", str(EPOCHS), "--iters-per-epoch", "2",
        "--sleep", "0.03", "--model-blocks", "32"]


def _execs(pids):
    out = []
    for pid in pids:
        try:
            out += [c.pid for c in psutil.Process(pid).children(recursive=True)
                    if "harmony.worker.executor" in " ".join(c.cmdline())]
        except psutil.Error:
            pass
    return out


def _wait_epochs(c, job, n, timeout=120):
    deadline = time.time() + timeout
    while True:
        try:
            st = c.status(job)
        except Exception:
            st = None
        if st and st["epochs_total"] >= n and st["state"] == "running":
            return st
        assert time.time() < deadline, st
        time.sleep(0.05)


@pytest.mark.parametrize("seed", [3])
def test_kill_9_of_each_kind_of_process_loses_nothing(tmp_path, seed):
    rng = random.Random(seed)
    cl = LocalCluster(3, str(tmp_path / "c"), port=0, heartbeat_timeout=2.0, isolate=ISOLATE)
    cl.start()
    try:
        with Client(cl.endpoint, timeout_s=10) as c:
            ref = c.submit("oracle.py", ORACLE_APP, ARGS,
                           machines=2, checkpoint_every=0, checkpoint_seconds=0)
            want = wait_state(c, ref, ("finished", "failed"), timeout=180)
            assert want["state"] == "finished", want["error"]
            job = c.submit("oracle.py", ORACLE_APP, ARGS,
                           machines=2, checkpoint_every=2, checkpoint_seconds=0)
            # 1. an executor, somewhere inside an epoch
            st = _wait_epochs(c, job, rng.randint(3, 6))
            time.sleep(rng.uniform(0, 0.2))
            victim = st["workers"][rng.randrange(2)]
            ex = _execs([cl.procs[1 + int(victim[1:])].pid])
            assert ex
            os.kill(ex[0], signal.SIGKILL)
            # 2. a worker daemon (its executors die with it)
            st = _wait_epochs(c, job, c.status(job)["epochs_total"] + 2)
            time.sleep(rng.uniform(0, 0.2))
            victim = lost = st["workers"][rng.randrange(2)]
            cl.procs[1 + int(victim[1:])].send_signal(signal.SIGKILL)
            st = _wait_epochs(c, job, c.status(job)["epochs_total"] + 2)
        # 3. the master; a new one on the same state dir and port
        time.sleep(rng.uniform(0, 0.2))
        cl.procs[0].send_signal(signal.SIGKILL)
        cl.procs[0].wait(timeout=10)
        port = cl.endpoint.rsplit(":", 1)[1]
        cl.procs[0] = cl._spawn(["harmony.master", "start", "--port", port, "--state-dir",
                                 os.path.join(cl.state_dir, "master"), "--heartbeat-timeout",
                                 "2", "--keys", cl.keys], "master2.log")
        with Client(cl.endpoint, timeout_s=10) as c:
            got = wait_state(c, job, ("finished", "failed"), timeout=240)
        assert got["state"] == "finished", got["error"]
        assert got["attempt"] >= 3
        a = [e["metrics"] for e in got["epochs"]]
        b = [e["metrics"] for e in want["epochs"]]
        assert len(a) == len(b) == EPOCHS
        # the kills cost time, not results: every epoch exactly as undisturbed
        assert a == b
        assert a[-1] == oracle_closed_form(EPOCHS, BLOCKS)
    finally:
        daemons = [p.pid for p in cl.procs[1:]]
        cl.stop()
    # nothing left behind: no executor, no lock held, no job store
    deadline = time.time() + 10
    while _execs(daemons) and time.time() < deadline:
        time.sleep(0.1)
    assert not any("harmony.worker.executor" in " ".join(p.info["cmdline"] or [])
                   and str(tmp_path) in " ".join(p.info["cmdline"] or [])
                   for p in psutil.process_iter(["cmdline"]))
    for w in ("m0", "m1", "m2"):
        store = os.path.join(cl.state_dir, "workers", w, "store")
        if w == lost:     # killed: what it left is swept when it starts again
            sweep_stale(store)
        assert not sweep_stale(store), w
