"""The CLI's rough edges (issue 19): a cluster found by its state dir, a taken
port, output in order, readable status at full precision, the progress
display of --wait. Two real local clusters, started by the CLI."""
import io
import json
import os
import socket
import subprocess
import sys

import pytest

from apps_for_tests import TOY_APP
from conftest import ROOT, run_cli, wait_state
from harmony.client import Client

ENV = {"HARMONY_MASTER": ""}     # never the user's: the state dir must be what counts


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    p = tmp_path_factory.mktemp("apps") / "toy.py"
    p.write_text(TOY_APP)
    return str(p)


@pytest.fixture(scope="module")
def up(tmp_path_factory):
    """A local cluster started by 'harmony cluster up' on a port of ours."""
    sd = str(tmp_path_factory.mktemp("cli-cluster") / "c")
    port = _free_port()
    r = run_cli("cluster", "up", "--machines", "2", "--port", str(port), "--detach",
                "--state-dir", sd, env=ENV)
    assert r.returncode == 0, r.stdout + r.stderr
    yield sd, port, r.stdout
    run_cli("cluster", "down", "--state-dir", sd)


def test_state_dir_finds_the_cluster(up, tmp_path):
    sd, port, out = up
    ep = f"tcp://127.0.0.1:{port}"
    info = json.load(open(os.path.join(sd, "cluster.json")))
    assert info["endpoint"] == ep
    assert f"--state-dir {sd}" in out and "dashboard http://127.0.0.1:" in out
    r = run_cli("cluster", "status", "--state-dir", sd, "--json", env=ENV)
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    assert st["master"]["endpoint"] == ep and len(st["workers"]) == 2
    # a table for people (#37 item 6): no internal counter names
    r = run_cli("cluster", "status", "--state-dir", sd, env=ENV)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"master {ep} (harmony mode): 2 of 2 machine(s) alive"), lines
    assert lines[1].split()[:3] == ["MACHINE", "STATE", "SEEN"], lines
    assert [ln.split()[:2] for ln in lines[2:]] == [["m0", "alive"], ["m1", "alive"]], lines
    assert "qg_cpu" not in r.stdout and "{" not in r.stdout
    r = run_cli("jobs", "--state-dir", sd, "--json", env=ENV)
    assert r.returncode == 0 and isinstance(json.loads(r.stdout), list), r.stderr
    # no cluster there: said plainly, not "no answer from the master"
    r = run_cli("jobs", "--state-dir", str(tmp_path / "none"), env=ENV)
    assert r.returncode == 3 and "no local cluster runs from" in r.stderr


def test_taken_port_names_the_other_cluster_or_moves(up, tmp_path):
    sd, port, _ = up
    other = str(tmp_path / "other")
    r = run_cli("cluster", "up", "--machines", "1", "--port", str(port), "--detach",
                "--state-dir", other, env=ENV)
    assert r.returncode == 1
    assert f"port {port}" in r.stderr and "taken by" in r.stderr and sd in r.stderr, r.stderr
    assert not os.path.exists(os.path.join(other, "cluster.json"))
    # the default port taken: a free one instead, said, with the export line
    r = run_cli("cluster", "up", "--machines", "1", "--detach", "--state-dir", other,
                env={**ENV, "HARMONY_PORT": str(port)})
    try:
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"port {port} is taken by the Harmony master of the local cluster in {sd}" \
            in r.stdout
        ep2 = json.load(open(os.path.join(other, "cluster.json")))["endpoint"]
        assert ep2 != f"tcp://127.0.0.1:{port}" and f"export HARMONY_MASTER={ep2}" in r.stdout
        st = json.loads(run_cli("cluster", "status", "--state-dir", other, "--json",
                                env=ENV).stdout)
        assert st["master"]["endpoint"] == ep2 and len(st["workers"]) == 1
    finally:
        assert run_cli("cluster", "down", "--state-dir", other).returncode == 0


def test_wait_plain_lines_json_lines_and_status(up, toy):
    sd, _, _ = up
    r = run_cli("submit", toy, "--state-dir", sd, "--wait", "--max-epochs", "3", env=ENV)
    assert r.returncode == 0, r.stderr
    job = r.stdout.split()[0]
    assert "epoch   3/3" in r.stdout and f"{job} finished in" in r.stdout
    r = run_cli("submit", toy, "--state-dir", sd, "--wait", "--json", "--max-epochs", "3",
                env=ENV)
    assert r.returncode == 0, r.stderr
    recs = [json.loads(line) for line in r.stdout.splitlines()]
    job2 = recs[0]["job"]
    eps = [x for x in recs[1:] if x["event"] == "epoch"]
    assert [e["epoch"] for e in eps] == [1, 2, 3] and eps[0]["max_epochs"] == 3
    assert recs[-1]["event"] == "end" and recs[-1]["state"] == "finished"
    st = json.loads(run_cli("status", job2, "--json", "--state-dir", sd, env=ENV).stdout)
    # --json: every digit the master has
    assert [e["metrics"] for e in st["epochs"]] == [e["metrics"] for e in eps]
    r = run_cli("status", job, "--state-dir", sd, env=ENV)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.split()[:2] == ["EPOCH", "OBJECTIVE"])
    rows = [line.split() for line in lines[head + 1:head + 4]]
    assert [row[0] for row in rows] == ["1", "2", "3"]
    assert "PULL" in lines[head] and "COMP" in lines[head] and "AT" in lines[head]
    # --events: the job's story, from its submission to its end
    r = run_cli("status", job, "--events", "--state-dir", sd, env=ENV)
    assert r.returncode == 0, r.stderr
    story = r.stdout.split("events     ", 1)[1].splitlines()
    assert "waiting" in story[1] and "submitted" in story[1]
    assert any("finished" in line for line in story[2:])


def test_progress_bar_on_a_terminal(up, toy):
    from rich.console import Console
    from harmony.obs import progress
    sd, port, _ = up
    with Client(f"tcp://127.0.0.1:{port}") as c:
        job = c.submit("toy.py", TOY_APP, ["--max-epochs", "4", "--sleep", "0.05"], 2)
        buf = io.StringIO()
        rc = progress.follow(c, job, poll_s=0.1, max_epochs=4,
                             console=Console(file=buf, force_terminal=True, width=140))
    out = buf.getvalue()
    assert rc == 0
    assert "4/4" in out and "ETA" in out and "elapsed" in out and "objective" in out
    assert "━" in out                               # the bar itself
    assert f"{job} finished in" in out


def test_output_and_errors_in_order(up, toy):
    sd, _, _ = up
    # stdout and stderr into one pipe: the failure is the last thing said
    p = subprocess.run([sys.executable, "-m", "harmony.cli", "submit", toy, "--state-dir", sd,
                        "--wait", "--crash", "raise", "--crash-epoch", "1",
                        "--max-epochs", "3"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=120,
                       env={**os.environ, **ENV}, cwd=str(ROOT))
    assert p.returncode == 1
    lines = [line for line in p.stdout.splitlines() if line.strip()]
    job = lines[0]
    assert lines[-1].startswith(f"{job} failed:") or f"{job} failed:" in "\n".join(lines[-6:])
    first_fail = next(i for i, line in enumerate(lines) if f"{job} failed:" in line)
    assert all("epoch" not in line and "running" not in line for line in lines[first_fail:])
    with Client(json.load(open(os.path.join(sd, "cluster.json")))["endpoint"]) as c:
        wait_state(c, job, ("failed",))


def test_shell_completion_script(tmp_path):
    r = run_cli("completion", "bash")
    assert r.returncode == 0 and "complete -o filenames -F _harmony_complete harmony" in r.stdout
    script = tmp_path / "c.sh"
    script.write_text(r.stdout)
    out = subprocess.run(["bash", "-c", f'source {script}; COMP_WORDS=(harmony logs j --fo); '
                          'COMP_CWORD=3; _harmony_complete; echo "${COMPREPLY[*]}"'],
                         capture_output=True, text=True, timeout=30)
    assert out.stdout.split() == ["--follow"], out.stderr


def test_cluster_status_shows_a_small_use_as_under_one_percent():
    from harmony.cli.cluster import _pct
    # a NIC's few KB/s against its 10 Gbit/s rounded to "0%", as if idle
    assert [_pct({"net": v}, "net") for v in (0.0, 1.5e-5, 0.0049, 0.005, 0.006, 0.42, 1.0)] \
        == ["0%", "<1%", "<1%", "<1%", "1%", "42%", "100%"]
    assert _pct({}, "net") == "-" and _pct({"net": "x"}, "net") == "-"
