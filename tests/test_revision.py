"""The deployed revision: each worker reports the code revision it runs
($HARMONY_REVISION or ``--revision-file``) when it registers, and
``harmony cluster status`` shows it per worker (and the master's, from its
environment)."""
import json
import os
import subprocess
import sys
import time

import pytest

from harmony.cli.daemons import _revision
from harmony.cluster import LocalCluster
from conftest import run_cli

REV = "0123456789abcdef0123456789abcdef01234567-dirty"


@pytest.fixture
def env_revision():
    """Set HARMONY_REVISION for the processes a test starts; restore it after."""
    old = os.environ.get("HARMONY_REVISION")

    def set_(value):
        if value is None:
            os.environ.pop("HARMONY_REVISION", None)
        else:
            os.environ["HARMONY_REVISION"] = value
    yield set_
    set_(old)


def status(endpoint: str) -> dict:
    r = run_cli("cluster", "status", "--master", endpoint, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_cluster_status_shows_each_workers_revision(tmp_path, env_revision):
    env_revision(REV)     # inherited by the master and m0
    cl = LocalCluster(1, str(tmp_path / "cluster"), port=0, heartbeat_timeout=3.0)
    cl.start()
    extra = None
    try:
        info = status(cl.endpoint)
        assert [(w["name"], w["revision"]) for w in info["workers"]] == [("m0", REV)], info
        assert info["master"]["revision"] == REV, info["master"]
        table = run_cli("cluster", "status", "--master", cl.endpoint).stdout.splitlines()
        assert f"revision {REV[:12]}" in table[0] or f"revision {REV}" in table[0], table
        assert "REVISION" in table[1] and REV[:12] in table[2], table

        # a worker started the way the deploy's unit starts it: --revision-file
        # (which wins over an inherited $HARMONY_REVISION)
        rev_file = tmp_path / "REVISION"
        rev_file.write_text("feedc0de\n")
        with open(tmp_path / "m1.log", "wb") as log:
            extra = subprocess.Popen(
                [sys.executable, "-m", "harmony.worker", "start", "--master", cl.endpoint,
                 "--name", "m1", "--state-dir", str(tmp_path / "m1"), "--keys", cl.keys,
                 "--revision-file", str(rev_file)], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while True:
            workers = {w["name"]: w for w in status(cl.endpoint)["workers"] if w["alive"]}
            if "m1" in workers:
                break
            assert extra.poll() is None, (tmp_path / "m1.log").read_text()
            assert time.time() < deadline, (tmp_path / "m1.log").read_text()
            time.sleep(0.2)
        assert workers["m1"]["revision"] == "feedc0de"
        assert workers["m0"]["revision"] == REV
    finally:
        if extra is not None:
            extra.terminate()
            extra.wait(timeout=20)
        cl.stop()


def test_revision_sources(tmp_path, env_revision):
    f = tmp_path / "REVISION"
    f.write_text("abc123\nsecond line ignored\n")
    env_revision("from-env")
    assert _revision(str(f)) == "abc123"            # an explicit file wins
    assert _revision(None) == "from-env"            # then the environment
    env_revision(None)
    assert _revision(str(tmp_path / "missing")) == ""   # a missing file is ignored
    f.write_text("x" * 1000)
    assert _revision(str(f)) == "x" * 128           # bounded
