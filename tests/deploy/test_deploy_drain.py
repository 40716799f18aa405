"""The rolling upgrade's drain and resume (roles/common/tasks/drain.yml and
resume.yml), run by ansible against a real local Harmony cluster.

site.yml's worker restart handler pauses the jobs that have an executor on
the workers of its batch, waits until they have checkpointed, restarts, and
resumes exactly those jobs. The restart itself needs real systemd hosts
(T2); here the same task files run with connection local against a
LocalCluster, and the test checks which jobs were paused and resumed.
"""
from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest

from deploytools import DEPLOY, HERE, ansible_env, output, run, tool
from harmony.client import Client
from harmony.cluster import LocalCluster
from harmony.comm.security import init_keys

ROOT = HERE.parent.parent
NMF = ROOT / "apps" / "nmf.py"
LONG = ["--rank", "6", "--blocks", "8", "--max-epochs", "100000"]


@pytest.fixture
def local_cluster(tmp_path):
    # Its own key set, with the playbooks' client key (harmony_deploy_key,
    # default "deploy") besides the admin's: the task files must use that one.
    keys = init_keys(str(tmp_path / "keys"), workers=["m0", "m1"], clients=["admin", "deploy"])
    cl = LocalCluster(2, str(tmp_path / "cluster"), port=0, heartbeat_timeout=3.0, mode="naive",
                      keys=keys)
    cl.start()
    try:
        yield cl
    finally:
        cl.stop()


def wait_for(client: Client, job: str, pred, what: str, timeout: float = 60) -> dict:
    deadline = time.time() + timeout
    while True:
        st = client.status(job)
        if pred(st):
            return st
        assert time.time() < deadline, f"{job}: not {what} after {timeout}s: {st['state']} {st.get('error')}"
        time.sleep(0.1)


def notes(st: dict) -> list[str]:
    return [e[2] for e in st["events"]]


def test_drain_pauses_only_the_jobs_on_the_restarting_worker_and_resumes_them(
        local_cluster, ratings, tmp_path):
    with Client(local_cluster.endpoint, timeout_s=10, keys=local_cluster.keys) as c:
        both = c.submit("nmf.py", NMF.read_text(), ["--input", ratings, *LONG], machines=2)
        wait_for(c, both, lambda s: s["state"] == "running" and s["epochs_total"] >= 1, "running")
        one = c.submit("nmf.py", NMF.read_text(), ["--input", ratings, *LONG], machines=1)
        st = wait_for(c, one, lambda s: s["state"] == "running" and s["epochs_total"] >= 1, "running")
        (host_of_one,) = st["workers"]
        restarting = ({"m0", "m1"} - {host_of_one}).pop()   # the machine `one` is not on

        inv = tmp_path / "inventory.ini"
        inv.write_text("[harmony_master]\nharmony-master\n[harmony_workers]\nm0\nm1\n"
                       "[harmony:children]\nharmony_master\nharmony_workers\n"
                       f"[all:vars]\nansible_connection=local\n"
                       f"ansible_python_interpreter={sys.executable}\n")
        cp = run([tool("ansible-playbook"), "-i", str(inv), str(HERE / "drain_local.yml"),
                  "-e", f"harmony_venv={Path(sys.executable).parent.parent}",
                  "-e", f"harmony_master_endpoint={local_cluster.endpoint}",
                  # where the hosts keep the playbooks' client key (a key set)
                  "-e", f"harmony_deploy_keys_dir={local_cluster.keys}",
                  "-e", json.dumps({"drain_machines": [restarting]})],
                 env=ansible_env({"ANSIBLE_ROLES_PATH": str(DEPLOY / "roles")}), timeout=180)
        assert cp.returncode == 0, output(cp)
        drained = re.search(r"DRAINED=\[(.*?)\]", cp.stdout)[1].split()
        assert drained == [both], output(cp)

        st = wait_for(c, both, lambda s: s["state"] == "running", "running again")
        n = notes(st)
        assert any(x.startswith("paused by user; checkpointed after epoch") for x in n), n
        assert "resume requested by user" in n, n
        assert any("resumes at epoch" in x for x in n), n
        st = c.status(one)
        assert st["state"] == "running", st
        assert not any("paused" in x for x in notes(st)), notes(st)
        for job in (both, one):
            c.cancel(job)
