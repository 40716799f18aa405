"""Process lifecycle: master restart, clean shutdown, lost workers."""
import json
import os
import signal
import subprocess
import sys
import time

import psutil

from harmony.client import Client
from harmony.cluster import LocalCluster
from apps_for_tests import TOY_APP
from conftest import ISOLATE, NMF_APP, run_cli, wait_state


def _descendants(pids):
    out = set()
    for pid in pids:
        try:
            out |= {c.pid for c in psutil.Process(pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            pass
    return out


def _running(pid: int) -> bool:
    """Alive and not a zombie; a process that exits while it is looked at
    is gone (pid_exists then Process() raced: a flaky failure once)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_gone(pids, timeout=20):
    deadline = time.time() + timeout
    alive = set(pids)
    while alive and time.time() < deadline:
        alive = {p for p in alive if _running(p)}
        time.sleep(0.1)
    return alive


def test_master_restart_keeps_jobs_and_requeues_running_ones(tmp_path, ratings):
    cl = LocalCluster(2, str(tmp_path / "c"), port=0, heartbeat_timeout=3.0, isolate=ISOLATE)
    cl.start()
    try:
        with Client(cl.endpoint) as c:
            done = c.submit("nmf.py", NMF_APP.read_text(),
                            ["--input", ratings, "--max-epochs", "3"], machines=2)
            before = wait_state(c, done, ("finished",))
            # the finished job's executors exit (not at once: a CI run counted
            # them beside the next job's, 4 where 2 were meant)
            assert not _wait_gone(_descendants([p.pid for p in cl.procs[1:]]), 20)
            long = c.submit("toy.py", TOY_APP, ["--max-epochs", "100000", "--sleep", "0.01"],
                            machines=2)
            deadline = time.time() + 60
            while not c.status(long)["epochs"]:
                assert time.time() < deadline
                time.sleep(0.05)
        old_execs = {p for p in _descendants([p.pid for p in cl.procs[1:]]) if _running(p)}
        assert len(old_execs) == 2
        master = cl.procs[0]
        master.send_signal(signal.SIGTERM)
        assert master.wait(timeout=15) == 0
        # a new master on the same state dir and port
        port = cl.endpoint.rsplit(":", 1)[1]
        cl.procs[0] = cl._spawn(["harmony.master", "start", "--port", port, "--state-dir",
                                 os.path.join(cl.state_dir, "master"),
                                 "--heartbeat-timeout", "3"], "master2.log")
        with Client(cl.endpoint, timeout_s=10) as c:
            deadline = time.time() + 30
            while True:
                try:
                    c.jobs()  # the new master answers
                    break
                except Exception:
                    assert time.time() < deadline
                    time.sleep(0.2)
            after = c.status(done)
            assert after["state"] == "finished"
            assert after["epochs"] == before["epochs"]      # results kept exactly
            st = wait_state(c, long, ("running",), timeout=30)
            assert st["attempt"] == 2 and any("master restarted" in e[2] for e in st["events"])
            # the old attempt's executors were stopped, a new attempt runs
            assert not (_wait_gone(old_execs, 20))
            deadline = time.time() + 60
            while not c.status(long)["epochs"]:
                assert time.time() < deadline
                time.sleep(0.05)
            c.cancel(long)
    finally:
        cl.stop()


def test_cluster_up_down_leaves_nothing_behind(tmp_path):
    sd = str(tmp_path / "c")
    r = run_cli("cluster", "up", "--machines", "2", "--port", "0", "--detach", "--state-dir", sd)
    assert r.returncode == 0, r.stderr + r.stdout
    info = json.load(open(os.path.join(sd, "cluster.json")))
    ep = info["endpoint"]
    r = run_cli("submit", str(NMF_APP), "--master", ep, "--machines", "2", "--input",
                "/dev/null/none")  # fails at input: still exercises launch/cleanup
    assert r.returncode == 0
    with Client(ep) as c:
        long = c.submit("toy.py", TOY_APP, ["--max-epochs", "100000", "--sleep", "0.01"], 2)
        wait_state(c, long, ("running",))
        deadline = time.time() + 30
        while not c.status(long)["epochs"]:
            assert time.time() < deadline
            time.sleep(0.05)
    everything = set(info["pids"]) | _descendants(info["pids"])
    assert len(everything) >= 5  # master, 2 daemons, 2 executors
    r = run_cli("cluster", "down", "--state-dir", sd)
    assert r.returncode == 0 and "stopped" in r.stdout
    assert not _wait_gone(everything), "orphans left behind"
    assert not os.path.exists(os.path.join(sd, "cluster.json"))
    assert not os.path.exists(os.path.join(sd, "master", "master.json"))
    # nothing stale blocks the next start on the same state dir
    r = run_cli("cluster", "up", "--machines", "1", "--port", "0", "--detach", "--state-dir", sd)
    assert r.returncode == 0, r.stderr
    info2 = json.load(open(os.path.join(sd, "cluster.json")))
    with Client(info2["endpoint"]) as c:
        states = {j["id"]: j["state"] for j in c.jobs()}
        events = c.status("job-0002")["events"]
    # requeued (the Harmony scheduler may already have placed it on the one machine)
    assert states["job-0001"] == "failed" and states["job-0002"] != "failed"
    assert any("master restarted; requeued" in e[2] for e in events)
    assert run_cli("cluster", "down", "--state-dir", sd).returncode == 0
    assert run_cli("cluster", "down", "--state-dir", sd).returncode == 1


def test_second_master_on_same_state_dir_is_refused(tmp_path):
    sd = str(tmp_path / "m")
    p = subprocess.Popen([sys.executable, "-m", "harmony.master", "start", "--port", "0",
                          "--state-dir", sd], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 20
        while not os.path.exists(os.path.join(sd, "master.json")):
            assert time.time() < deadline and p.poll() is None
            time.sleep(0.05)
        r = subprocess.run([sys.executable, "-m", "harmony.master", "start", "--port", "0",
                            "--state-dir", sd], capture_output=True, text=True, timeout=30)
        assert r.returncode == 1 and "another master is running" in r.stderr
    finally:
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=15) == 0


def test_lost_worker_is_noticed_and_its_job_moves(tmp_path):
    cl = LocalCluster(2, str(tmp_path / "c"), port=0, heartbeat_timeout=2.0, isolate=ISOLATE)
    cl.start()
    try:
        with Client(cl.endpoint) as c:
            job = c.submit("toy.py", TOY_APP, ["--max-epochs", "100000", "--sleep", "0.01"], 1)
            st = wait_state(c, job, ("running",))
            victim = st["workers"][0]
            idx = int(victim[1:]) + 1
            execs = _descendants([cl.procs[idx].pid])
            cl.procs[idx].kill()               # the daemon dies without a word
            assert not _wait_gone(execs, 10)    # its executors die with it
            deadline = time.time() + 30
            while True:
                ws = {w["name"]: w for w in c.cluster()["workers"]}
                if not ws[victim]["alive"]:
                    break
                assert time.time() < deadline
                time.sleep(0.2)
            st = wait_state(c, job, ("running",), timeout=30)
            deadline = time.time() + 30
            while not (st["attempt"] == 2 and st["workers"] and st["workers"][0] != victim):
                assert time.time() < deadline
                time.sleep(0.2)
                st = c.status(job)
            assert any("lost" in e[2] for e in st["events"])
            c.cancel(job)
    finally:
        cl.stop()


def test_a_lost_sync_leader_is_a_lost_machine_and_its_jobs_go_on(tmp_path):
    """#32: the daemon that synchronizes a job's subtasks dies with its
    machine: the job resumes elsewhere under a new leader and finishes."""
    cl = LocalCluster(3, str(tmp_path / "c"), port=0, heartbeat_timeout=2.0,
                      mode="harmony", policy="colocate", isolate=ISOLATE)
    cl.start()
    try:
        with Client(cl.endpoint) as c:
            job = c.submit("toy.py", TOY_APP, ["--max-epochs", "60", "--sleep", "0.01"], 2,
                           checkpoint_every=5)
            st = wait_state(c, job, ("running",))
            log = os.path.join(cl.state_dir, "logs", "master.log")
            deadline = time.time() + 10
            while f"{job}: its subtasks are synchronized by" not in open(log).read():
                assert time.time() < deadline
                time.sleep(0.1)
            leader = open(log).read().split(f"{job}: its subtasks are synchronized by ")[1][:2]
            assert leader in st["workers"]
            idx = int(leader[1:]) + 1
            cl.procs[idx].kill()               # the leader's machine goes silent
            deadline = time.time() + 60
            while True:
                st = c.status(job)
                if st["attempt"] >= 2 and st["state"] == "running" and leader not in st["workers"]:
                    break
                assert st["state"] not in ("failed", "finished"), st["error"]
                assert time.time() < deadline, st
                time.sleep(0.2)
            st = wait_state(c, job, ("finished", "failed"), timeout=120)
            assert st["state"] == "finished", st["error"]
            text = open(log).read()
            assert text.count(f"{job}: its subtasks are synchronized by") >= 2
            assert any("lost" in e[2] for e in st["events"])
    finally:
        cl.stop()


def test_cluster_down_stops_a_master_restarted_by_hand(tmp_path):
    """A master killed and restarted on the cluster's state dir is not in
    cluster.json: `cluster down` finds it by its command line and stops it
    (it said "stopped" and left it running)."""
    sd = str(tmp_path / "c")
    r = run_cli("cluster", "up", "--machines", "1", "--port", "0", "--detach", "--state-dir", sd)
    assert r.returncode == 0, r.stderr + r.stdout
    info = json.load(open(os.path.join(sd, "cluster.json")))
    master = psutil.Process(info["pids"][0])
    cmd, env = master.cmdline(), master.environ()
    master.kill()
    master.wait(10)
    again = subprocess.Popen(cmd, env=env, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(1.0)
        assert again.poll() is None, "the restarted master did not start"
        everything = set(info["pids"][1:]) | {again.pid}
        r = run_cli("cluster", "down", "--state-dir", sd)
        assert r.returncode == 0 and "stopped" in r.stdout
        assert again.wait(20) is not None
        assert not _wait_gone(everything), "a restarted master or a daemon was left running"
    finally:
        if again.poll() is None:
            again.kill()
            again.wait()
