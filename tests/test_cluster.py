"""End to end on a real 2-machine local cluster: processes, sockets, LMDB."""
import json
import time

import psutil
import pytest
import zmq

from harmony.app import load_app, run_local
from apps_for_tests import TOY_APP
from conftest import NMF_APP, run_cli, wait_state


@pytest.fixture(scope="module")
def toy_app(tmp_path_factory):
    p = tmp_path_factory.mktemp("apps") / "toy.py"
    p.write_text(TOY_APP)
    return str(p)


def test_cli_submit_nmf_on_two_machines(cluster, ratings):
    r = run_cli("submit", str(NMF_APP), "--master", cluster.endpoint, "--machines", "2",
                "--wait", "--input", ratings, "--max-epochs", "4", "--iters-per-epoch", "2")
    assert r.returncode == 0, r.stderr
    job = r.stdout.split()[0]
    assert "epoch   4" in r.stdout and f"{job} finished" in r.stdout
    st = json.loads(run_cli("status", job, "--json", "--master", cluster.endpoint).stdout)
    assert st["state"] == "finished" and sorted(st["workers"]) == ["m0", "m1"]
    objs = [e["metrics"]["objective"] for e in st["epochs"]]
    assert len(objs) == 4 and objs[-1] < 0.5 * objs[0]
    assert all(e["timings"]["comp"] > 0 for e in st["epochs"])
    listing = run_cli("jobs", "--master", cluster.endpoint)
    assert job in listing.stdout and "finished" in listing.stdout


def test_submit_says_what_a_job_larger_than_the_cluster_gets(cluster, client, toy_app):
    """--machines 99 on 2 machines: submit says the cluster has 2 and what
    the job gets in this mode (here naive: it waits), instead of silence."""
    r = run_cli("submit", toy_app, "--master", cluster.endpoint, "--machines", "99")
    assert r.returncode == 0, r.stderr
    job = r.stdout.split()[0]
    assert f"the cluster has 2 live machine(s); {job} asks for 99 and waits" in r.stderr
    assert "waits" in r.stderr and "naive mode" in r.stderr
    client.cancel(job)
    r = run_cli("submit", toy_app, "--master", cluster.endpoint, "--machines", "2")
    assert r.returncode == 0 and "note:" not in r.stderr, r.stderr
    client.cancel(r.stdout.split()[0])


def test_one_machine_matches_single_process_reference(client, ratings):
    args = ["--input", ratings, "--max-epochs", "5", "--iters-per-epoch", "3", "--seed", "11"]
    ref = run_local(load_app(NMF_APP.read_text(), "nmf.py"), args)
    job = client.submit("nmf.py", NMF_APP.read_text(), args, machines=1)
    st = wait_state(client, job, ("finished", "failed"))
    assert st["state"] == "finished", st["error"]
    got = [e["metrics"] for e in st["epochs"]]
    assert len(got) == len(ref.history) == 5
    for g, r in zip(got, ref.history):
        for k in ("objective", "rmse", "test_rmse"):
            assert g[k] == pytest.approx(r[k], rel=1e-6), k


def test_two_machines_reach_the_one_machine_objective(client, ratings):
    args = ["--input", ratings, "--max-epochs", "8"]
    res = {}
    for m in (1, 2):
        job = client.submit("nmf.py", NMF_APP.read_text(), args, machines=m)
        st = wait_state(client, job, ("finished", "failed"))
        assert st["state"] == "finished", st["error"]
        res[m] = st["epochs"][-1]["metrics"]["test_rmse"]
    assert res[2] == pytest.approx(res[1], rel=0.05)


@pytest.mark.parametrize("crash, text", [
    ("raise", "ZeroDivisionError: toy app blew up on purpose (at toy.py:"),
    ("abort", "exited with signal 6"),
    ("exit", "exited with code 7"),
])
def test_crashing_app_fails_its_own_job_only(client, cluster, ratings, toy_app, crash, text):
    good = client.submit("nmf.py", NMF_APP.read_text(),
                         ["--input", ratings, "--max-epochs", "6"], machines=2)
    bad = client.submit("toy.py", open(toy_app).read(), ["--crash", crash, "--max-epochs", "5"],
                        machines=2)
    st = wait_state(client, bad, ("finished", "failed"))
    assert st["state"] == "failed" and text in st["error"], st["error"]
    st = wait_state(client, good, ("finished", "failed"))
    assert st["state"] == "finished", st["error"]
    alive = [w for w in client.cluster()["workers"] if w["alive"]]
    assert len(alive) == 2  # the daemons survived


def test_bad_input_fails_the_job_with_file_and_line(client, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("1 2 3\n1 2 x\n")
    job = client.submit("nmf.py", NMF_APP.read_text(), ["--input", str(bad)], machines=2)
    st = wait_state(client, job, ("finished", "failed"))
    assert st["state"] == "failed" and f"{bad}:2: not a number: 'x'" in st["error"]
    assert "exited with" not in st["error"]      # the error itself, not a log tail


def test_cancel_stops_executors(client, cluster, toy_app):
    job = client.submit("toy.py", open(toy_app).read(), ["--max-epochs", "100000",
                                                         "--sleep", "0.01"], machines=2)
    deadline = time.time() + 60
    while not client.status(job)["epochs"]:
        assert time.time() < deadline
        time.sleep(0.05)
    daemons = [psutil.Process(p.pid) for p in cluster.procs[1:]]
    assert sum(len(d.children()) for d in daemons) >= 2
    client.cancel(job)
    assert client.status(job)["state"] == "cancelled"
    deadline = time.time() + 15
    while sum(len(d.children()) for d in daemons):
        assert time.time() < deadline, "executors still running after cancel"
        time.sleep(0.1)
    r = run_cli("cancel", job, "--master", cluster.endpoint)
    assert r.returncode == 1 and "already cancelled" in r.stderr


def test_malformed_messages_get_error_replies(cluster, client):
    from harmony.comm import messages as M
    from harmony.comm.zmqutil import make_socket
    ctx = zmq.Context()
    s = make_socket(ctx, zmq.DEALER, keys=client.keys)     # an authenticated user
    plain = ctx.socket(zmq.DEALER)                         # a stranger without keys
    plain.setsockopt(zmq.LINGER, 0)
    s.connect(cluster.endpoint)
    plain.connect(cluster.endpoint)
    try:
        for payload in (b"\xc1\xc1", b"\x93\x01\x02\x03",
                        b"\x81\xa1t\xa7no_such", b"\x81\xa1t\xa6cancel"):
            s.send(payload)
            assert s.poll(5000), "master did not answer"
            reply = s.recv_multipart()
            msg = M.decode(reply)
            assert msg.type == "error" and msg["code"] == "bad_message", msg.fields
        # an executor-only message from a user's key is refused, not obeyed
        s.send(M.encode("barrier", job="job-9999", index=0, epoch=0, iter=0))
        assert s.poll(5000)
        msg = M.decode(s.recv_multipart())
        assert msg.type == "error" and msg["code"] == "forbidden"
        # a stranger is refused before anything is read: no answer at all.
        # Once its handshake has failed, its DEALER has no peer left to queue
        # to, and a blocking send would wait forever (it did, under load):
        # the message is either queued and never answered, or not sendable.
        try:
            plain.send(M.encode("list_jobs"), zmq.NOBLOCK)
        except zmq.Again:
            pass
        assert not plain.poll(1000)
    finally:
        s.close()
        plain.close()
        ctx.term()
    assert client.cluster()["master"]["bad_messages"] >= 4
    assert isinstance(client.jobs(), list)  # still serving


def test_cli_errors_are_clear(cluster, tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f(:\n")
    r = run_cli("submit", str(bad), "--master", cluster.endpoint)
    assert r.returncode == 2 and "bad.py:1: syntax error" in r.stderr
    r = run_cli("submit", str(tmp_path / "missing.py"), "--master", cluster.endpoint)
    assert r.returncode == 2 and "cannot read app file" in r.stderr
    r = run_cli("submit", str(NMF_APP), "--master", cluster.endpoint, "--rank", "x", "--input", "y")
    assert r.returncode == 2 and "--rank: invalid int value" in r.stderr
    r = run_cli("status", "job-9999", "--master", cluster.endpoint)
    assert r.returncode == 1 and "no job 'job-9999'" in r.stderr
    r = run_cli("jobs", "--master", "tcp://127.0.0.1:1", env={"HARMONY_CLIENT_TIMEOUT": "1"})
    assert r.returncode == 3 and "no answer from the master" in r.stderr
    r = run_cli("submit", str(NMF_APP), "--help")
    assert r.returncode == 0 and "--rank" in r.stdout and "--max-epochs" in r.stdout


def test_a_heterogeneous_cluster_emulates_a_slow_machine(tmp_path):
    """``--cpu-speed 1,0.1``: COMPs on m1 take 10x their measured time, so a
    2-machine job's epoch COMP (its slowest machine's) is at least 10x the
    spin (a hard lower bound), and the link rates are per machine."""
    from harmony.client import Client
    from harmony.cluster import LocalCluster
    cl = LocalCluster(2, str(tmp_path / "c"), port=0, cpu_speed="1,0.1",
                      net_bandwidth="20M,10M")
    cl.start()
    try:
        with Client(cl.endpoint, timeout_s=10, keys=cl.keys) as c:
            job = c.submit("toy.py", TOY_APP, ["--max-epochs", "3", "--spin", "0.02"],
                           machines=2)
            st = wait_state(c, job, ("finished", "failed"))
            assert st["state"] == "finished", st["error"]
            for e in st["epochs"]:
                tm = e["timings"]
                assert tm["comp"] / tm["iters"] >= 0.02 / 0.1 * 0.95, tm
                assert tm["link"] in (20e6, 10e6), tm
    finally:
        cl.stop()
    with pytest.raises(Exception, match="cpu-speed"):
        LocalCluster(2, str(tmp_path / "d"), cpu_speed="1,2")


def test_an_app_option_named_like_a_cli_option_goes_after_dashdash(cluster, client, toy_app):
    """The toy app has --keys (model keys); harmony submit has --keys (the
    key directory). After "--" it is the app's; before, the CLI's, with a
    note saying how to give the app's."""
    r = run_cli("submit", toy_app, "--master", cluster.endpoint, "--", "--keys", "7")
    assert r.returncode == 0, r.stderr
    job = r.stdout.split()[0]
    st = json.loads(run_cli("status", job, "--json", "--master", cluster.endpoint).stdout)
    assert st["args"] == ["--keys", "7"] and "note: --keys" not in r.stderr
    r = run_cli("submit", toy_app, "--master", cluster.endpoint, "--keys", "/nonexistent")
    assert "note: --keys was taken as harmony's own option" in r.stderr


def test_a_script_stopped_by_sigterm_stops_its_cluster(tmp_path):
    """A bench that runs a LocalCluster in a with block and calls
    stop_clusters_on_sigterm leaves no master or daemon behind when it is
    sent SIGTERM (the default would exit without running __exit__)."""
    import signal
    import subprocess
    import sys

    import psutil
    script = tmp_path / "s.py"
    script.write_text(
        "import sys, time\n"
        "from harmony.cluster import LocalCluster, stop_clusters_on_sigterm\n"
        "stop_clusters_on_sigterm()\n"
        f"with LocalCluster(1, {str(tmp_path / 'c')!r}, port=0, dashboard=False) as cl:\n"
        "    print(' '.join(str(p.pid) for p in cl.procs), flush=True)\n"
        "    time.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        pids = [int(x) for x in line.split()]
        assert len(pids) == 2, line            # the master and one daemon
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) != 0
        procs = []
        for p in pids:
            try:
                procs.append(psutil.Process(p))
            except psutil.NoSuchProcess:
                pass
        gone, alive = psutil.wait_procs(procs, timeout=15)
        assert not alive, f"left running: {alive}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
