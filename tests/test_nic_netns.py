"""#37 item 2, for real: a cluster whose machines have NICs of their own (a
network namespace each, joined to the master's by veth pairs on a bridge;
no emulated links) shows each machine's network use from its NIC counters
(harmony.worker.nicstats) in the master's view while a 2-machine job runs:
``harmony cluster status --json``'s utilization and Prometheus'
``harmony_machine_utilization_ratio{resource="net"}``."""
import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

import netns
from conftest import NMF_APP
from harmony.client import Client, ClientError
from harmony.cluster import stop_pids

WHY = netns.unavailable()


@pytest.fixture
def fabric():
    if WHY:
        pytest.skip(WHY)
    f = netns.Fabric(2)
    try:
        yield f
    finally:
        f.close()


def _spawn(cmd: list[str], log: str) -> subprocess.Popen:
    with open(log, "ab") as fh:
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=fh,
                                stderr=subprocess.STDOUT)


def _metrics_net(dash: dict) -> dict[str, float]:
    req = urllib.request.Request(dash["url"] + "metrics",
                                 headers={"Authorization": f"Bearer {dash['token']}"})
    with urllib.request.urlopen(req, timeout=5) as r:
        text = r.read().decode()
    return {s.labels["machine"]: s.value
            for f in text_string_to_metric_families(text)
            if f.name == "harmony_machine_utilization_ratio"
            for s in f.samples if s.labels.get("resource") == "net"}


def _net(c: Client, key: str = "net") -> dict[str, float | None]:
    return {w["name"]: (w.get("utilization") or {}).get(key)
            for w in c.cluster()["workers"] if w["alive"]}


def test_machines_in_network_namespaces_report_nic_traffic(fabric, tmp_path, ratings):
    keys = os.environ["HARMONY_KEYS"]
    mdir = tmp_path / "master"
    procs: list[subprocess.Popen] = []
    try:
        procs.append(_spawn([sys.executable, "-m", "harmony.master", "start",
                             "--host", fabric.root, "--port", "0", "--state-dir", str(mdir),
                             "--keys", keys, "--dashboard-port", "0",
                             "--heartbeat-timeout", "5"], str(tmp_path / "master.log")))
        deadline = time.time() + 30
        while not (mdir / "master.json").exists():
            assert procs[0].poll() is None and time.time() < deadline, \
                (tmp_path / "master.log").read_text()[-3000:]
            time.sleep(0.05)
        ep = json.loads((mdir / "master.json").read_text())["endpoint"]
        assert ep == f"tcp://{fabric.root}:{ep.rsplit(':', 1)[1]}"
        for i, addr in enumerate(fabric.addrs):
            # each machine in its namespace, bound to its own address, with
            # a state dir of its own
            procs.append(_spawn(fabric.exec_prefix(i) + [
                sys.executable, "-m", "harmony.worker", "start", "--master", ep,
                "--name", f"m{i}", "--host", addr, "--state-dir", str(tmp_path / f"w{i}"),
                "--keys", keys], str(tmp_path / f"worker-m{i}.log")))
        with Client(ep, timeout_s=5) as c:
            deadline = time.time() + 30
            while True:
                try:
                    ws = c.cluster()["workers"]
                except ClientError:
                    ws = []
                if sum(w["alive"] for w in ws) == 2:
                    break
                assert time.time() < deadline and all(p.poll() is None for p in procs), \
                    "workers did not register: " + "".join(
                        (tmp_path / f"worker-m{i}.log").read_text()[-2000:] for i in range(2))
                time.sleep(0.2)
            assert {w["host"] for w in ws} == set(fabric.addrs), ws
            dash = c.dashboard()
            # idle: only heartbeats cross the veths (a few hundred bytes a
            # second); the job's parameter-server traffic, far more
            idle: dict[str, float] = {}
            t_end = time.time() + 3
            while time.time() < t_end:
                for m, v in _net(c).items():
                    idle[m] = max(idle.get(m, 0.0), v or 0.0)
                time.sleep(0.3)
            job = c.submit("nmf.py", NMF_APP.read_text(),
                           ["--input", ratings, "--max-epochs", "100000"], 2)
            seen: dict[str, float] = {}
            scraped: dict[str, float] = {}
            sent: dict[str, float] = {}         # bytes a reading (the master keeps them)
            deadline = time.time() + 90
            while True:
                st = c.status(job)
                if st["state"] == "running":
                    for m, v in _net(c).items():
                        seen[m] = max(seen.get(m, 0.0), v or 0.0)
                    for m, v in _metrics_net(dash).items():
                        scraped[m] = max(scraped.get(m, 0.0), v)
                    for m, v in _net(c, "net_sent").items():
                        sent[m] = max(sent.get(m, 0.0), v or 0.0)
                if len(seen) == 2 and min(seen.values()) > 0 and len(scraped) == 2 \
                        and min(scraped.values()) > 0 and len(sent) == 2 \
                        and min(sent.values()) > 1000 and all(
                            seen[m] > 10 * idle.get(m, 0.0) for m in seen):
                    break
                assert st["state"] in ("waiting", "profiling", "running") \
                    and time.time() < deadline, (st["state"], st.get("error"), idle, seen,
                                                 scraped, sent)
                time.sleep(0.3)
            print(f"net utilization, idle peak {idle}, during the job {seen}, "
                  f"/metrics {scraped}, bytes sent a reading {sent}")
            c.cancel(job)
    finally:
        stop_pids([p.pid for p in procs], timeout=10)
