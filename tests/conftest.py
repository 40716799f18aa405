"""Shared fixtures: real local clusters on random loopback ports, real data."""
from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from harmony.client import Client
from harmony.comm.security import init_keys
from harmony.cluster import LocalCluster, isolation_unavailable
from harmony.datagen import gen_nmf

ROOT = Path(__file__).resolve().parent.parent

# Every test cluster runs with CurveZMQ keys (as every cluster does by
# default): one key set for the session, found by clients through the
# environment, as a user's shell would.
_KEYS = tempfile.mkdtemp(prefix="harmony-test-keys-")
atexit.register(shutil.rmtree, _KEYS, True)     # every run made one and left it
init_keys(_KEYS, workers=[f"m{i}" for i in range(8)] + ["w1"])
os.environ["HARMONY_KEYS"] = _KEYS
NMF_APP = ROOT / "apps" / "nmf.py"


def run_cli(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harmony.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


def wait_state(client: Client, job: str, states: tuple[str, ...], timeout: float = 120) -> dict:
    deadline = time.time() + timeout
    while True:
        st = client.status(job)
        if st["state"] in states:
            return st
        if time.time() > deadline:
            raise AssertionError(f"{job} still {st['state']} after {timeout}s: {st.get('error')}")
        time.sleep(0.1)


def ckpt_parts_left(state_dir: str, job: str, want: list[str], timeout: float = 10) -> list[str]:
    """The checkpoint parts of ``job`` left on every worker's disk of a
    local cluster (``e<epoch>-p<index>`` directories, sorted), once they are
    ``want`` or ``timeout`` seconds have passed (old parts go when the
    master's gc reaches the daemons)."""
    import glob
    deadline = time.time() + timeout
    while True:
        parts = sorted(os.path.basename(p) for p in glob.glob(
            os.path.join(state_dir, "workers", "*", "ckpt", job, "*")))
        if parts == want or time.time() > deadline:
            return parts
        time.sleep(0.1)


@pytest.fixture(scope="session")
def ratings(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("data") / "ratings.txt"
    gen_nmf(str(path), users=1500, items=300, rank=6, per_user=20, noise=0.1, seed=3)
    return str(path)


# Shared nothing, proved: where mount namespaces are available (root), every
# worker daemon of a test cluster runs in its own, with the master's and the
# other daemons' state dirs hidden behind an empty tmpfs.
ISOLATE = not isolation_unavailable()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cl = LocalCluster(2, str(tmp_path_factory.mktemp("cluster")), port=0, heartbeat_timeout=3.0,
                      isolate=ISOLATE)
    cl.start()
    yield cl
    cl.stop()


@pytest.fixture
def client(cluster):
    with Client(cluster.endpoint, timeout_s=10) as c:
        yield c


def load_bench(name: str):
    """bench/NAME.py as a module (the benches are scripts, not a package)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
