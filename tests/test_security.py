"""CurveZMQ keys and who may say what: probes from strangers and from keys of
the wrong role against a real local cluster, on loopback."""
import glob
import os
import stat

import pytest
import zmq

from harmony.client import Client, ClientError
from harmony.comm import messages as M
from harmony.comm import security
from harmony.comm.zmqutil import make_socket
from apps_for_tests import TOY_APP
from conftest import run_cli, wait_state


def test_keys_init_makes_private_secrets_and_refuses_loose_modes(tmp_path):
    d = security.init_keys(str(tmp_path / "k"), workers=["w1"])
    sec = os.path.join(d, "workers", "w1.key_secret")
    assert stat.S_IMODE(os.stat(sec).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    keys = security.Keys.load(d, "worker", "w1")
    assert keys.peer(keys.public.decode()) == ("worker", "w1")
    assert keys.peer("not-a-key") == ("", "")
    os.chmod(sec, 0o644)
    with pytest.raises(security.SecurityError, match="readable by others"):
        security.Keys.load(d, "worker", "w1")
    with pytest.raises(security.SecurityError, match="no worker key"):
        security.Keys.load(security.init_keys(str(tmp_path / "k2")), "worker", "nobody")


def test_cli_keys_init(tmp_path):
    r = run_cli("keys", "init", "--dir", str(tmp_path / "k"), "--workers", "a,b")
    assert r.returncode == 0, r.stderr
    assert os.path.isfile(tmp_path / "k" / "workers" / "b.key_secret")
    assert "export HARMONY_KEYS=" in r.stdout


def _probe(endpoint, keys, msg, timeout=3000):
    ctx = zmq.Context()
    s = make_socket(ctx, zmq.DEALER, keys=keys)
    s.connect(endpoint)
    try:
        s.send(msg)
        return M.decode(s.recv_multipart()) if s.poll(timeout) else None
    finally:
        s.close(0)
        ctx.term()


def test_a_stranger_key_gets_no_answer(cluster, tmp_path):
    other = security.Keys.load(security.init_keys(str(tmp_path / "other")), "client", "admin")
    assert _probe(cluster.endpoint, other, M.encode("list_jobs"), 1500) is None


def test_roles_are_enforced(cluster, client):
    keys_dir = client.keys.directory
    reader = security.Keys.load(keys_dir, "reader", "reader")
    worker = security.Keys.load(keys_dir, "worker", "m1")
    # a reader may read, not control
    assert _probe(cluster.endpoint, reader, M.encode("list_jobs")).type == "jobs"
    r = _probe(cluster.endpoint, reader, M.encode("submit", app_name="toy.py",
                                                 app_source=TOY_APP, args=[], machines=1))
    assert r.type == "error" and r["code"] == "forbidden"
    # a worker key cannot speak for another worker, nor submit jobs
    r = _probe(cluster.endpoint, worker, M.encode("register", name="m0", host="127.0.0.1",
                                                 cpus=64, memory=1 << 40, pid=1, executors=[]))
    assert r.type == "error" and r["code"] == "forbidden"
    r = _probe(cluster.endpoint, worker, M.encode("cancel", job="job-0001"))
    assert r.type == "error" and r["code"] == "forbidden"
    # the real m0 is still there, with its real size
    ws = {w["name"]: w for w in client.cluster()["workers"]}
    assert ws["m0"]["alive"] and ws["m0"]["cpus"] != 64


def test_forged_executor_messages_do_not_touch_a_running_job(cluster, client):
    job = client.submit("toy.py", TOY_APP, ["--max-epochs", "60", "--sleep", "0.01"], machines=2)
    wait_state(client, job, ("running",))
    keys_dir = client.keys.directory
    user = security.Keys.load(keys_dir, "client", "admin")
    m1 = security.Keys.load(keys_dir, "worker", "m1")
    st = client.status(job)
    # a user's key cannot say an executor failed; a worker's key cannot speak
    # for an executor on another machine
    r = _probe(cluster.endpoint, user, M.encode("exec_failed", job=job, index=0, error="x",
                                               attempt=st["attempt"]))
    assert r.type == "error" and r["code"] == "forbidden"
    other = st["workers"].index("m0") if "m0" in st["workers"] else 0
    _probe(cluster.endpoint, m1, M.encode("exec_failed", job=job, index=other, error="forged",
                                          attempt=st["attempt"]), 500)
    # the executors' specs carry the attempt's data-plane secret: owner-only
    specs = glob.glob(os.path.join(cluster.state_dir, "**", f"{job}.*", "spec.msgpack"),
                      recursive=True)
    assert len(specs) == 2, specs
    assert all(os.stat(p).st_mode & 0o777 == 0o600 for p in specs)
    st = wait_state(client, job, ("finished", "failed"))
    assert st["state"] == "finished", st["error"]


def test_an_executor_refuses_a_spec_others_can_read(tmp_path):
    """The spec holds the attempt's secret: one readable by others is refused
    before it is parsed (the daemon writes it 0600)."""
    spec = tmp_path / "spec.msgpack"
    spec.write_bytes(b"\x80")          # an empty map: never read
    spec.chmod(0o644)
    from harmony.worker.executor.process import main as executor_main
    assert executor_main([str(spec)]) == 2


def test_a_client_without_keys_is_told_why(cluster, monkeypatch, tmp_path):
    monkeypatch.setenv("HARMONY_KEYS", str(tmp_path / "none"))
    monkeypatch.setenv("HARMONY_HOME", str(tmp_path / "home"))
    import harmony.client as hc
    monkeypatch.setattr(hc, "DEFAULT_KEYS", str(tmp_path / "home" / "keys"))
    with Client(cluster.endpoint, timeout_s=1) as c:
        assert c.keys is None
        with pytest.raises(ClientError, match="no key set found"):
            c.jobs()


def test_insecure_is_for_loopback_only(tmp_path):
    r = run_cli("cluster", "up", "--insecure", "--machines", "1", "--port", "0", "--detach",
                "--state-dir", str(tmp_path / "c"))
    try:
        assert r.returncode == 0, r.stderr
        assert "WARNING" in r.stdout + r.stderr
    finally:
        run_cli("cluster", "down", "--state-dir", str(tmp_path / "c"))
    from harmony.cli import master_main
    assert master_main(["start", "--insecure", "--host", "0.0.0.0", "--port", "0",
                        "--state-dir", str(tmp_path / "m")]) == 1
