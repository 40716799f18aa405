"""T2: site.yml converges a fleet of real systemd hosts (systemd-nspawn, see
nspawnfleet.py), a 2-machine job runs on it end to end, a rolling upgrade
drains and resumes a running job, and teardown.yml stops the services.

Opt in: `make test-deploy`, or `pytest -m deploy_t2 tests/deploy/test_deploy_t2.py`
(root; slow: the first run debootstraps the cached rootfs; every run installs
torch on three hosts). The tests run in file order on one fleet; a later one
needs the earlier ones to have passed.
"""
from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

import nspawnfleet
from deploytools import ROOT, ansible_env, output, recap, run, tool

pytestmark = [pytest.mark.slow, pytest.mark.deploy_t2, pytest.mark.timeout(3600)]

_why = nspawnfleet.unavailable()
if _why:
    pytestmark.append(pytest.mark.skip(reason=f"T2 fleet unavailable: {_why}"))

MASTER = "harmony-master"
WORKERS = ["harmony-worker-1", "harmony-worker-2"]
PORT = 5760
NMF_SHORT = ["--rank", "4", "--blocks", "4", "--max-epochs", "3"]


class Deploy:
    """The operator's side: a copy of the checkout (its own git history, so
    an upgrade is a new commit), the key set, the inventory, the CLI."""

    def __init__(self, fleet: nspawnfleet.Fleet, work: Path):
        self.fleet, self.work = fleet, work
        self.checkout = work / "checkout"
        self.keys = work / "fleet-keys"
        self.inventory = work / "inventory.ini"
        files = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True,
                               check=True).stdout.decode().split("\0")
        for f in filter(None, files):
            src = ROOT / f
            if src.is_file():
                dst = self.checkout / f
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dst)
        self.git("init", "-q")
        self.git("add", "-A")
        self.git("commit", "-q", "-m", "revision 1")
        ops = json.dumps([f"{fleet.gateway}/32"])
        hosts = fleet.hosts
        self.inventory.write_text(
            "[harmony_master]\n"
            f"{MASTER} ansible_host={hosts[MASTER].address}\n\n[harmony_workers]\n"
            + "".join(f"{w} ansible_host={hosts[w].address}\n" for w in WORKERS)
            + "\n[harmony:children]\nharmony_master\nharmony_workers\n\n[harmony:vars]\n"
            f"ansible_user={nspawnfleet.USER}\n"
            f"ansible_ssh_private_key_file={fleet.key}\n"
            f"harmony_operator_cidrs={ops}\n"
            f"harmony_client_cidrs={ops}\n"
            f"harmony_local_checkout={self.checkout}\n"
            f"harmony_keys_local_dir={self.keys}\n"
            f"harmony_local_cli={tool('harmony')}\n"
            # torch from the hosts' pip configuration: this machine's (bound in)
            "harmony_torch_index_url=''\n"
            "harmony_health_timeout=180\n")

    staged_objective = float("inf")   # set by test_staged_two_machine_job

    def git(self, *args: str) -> str:
        return subprocess.run(["git", "-C", str(self.checkout), "-c", "user.name=t2",
                               "-c", "user.email=t2@localhost", *args],
                              capture_output=True, text=True, check=True).stdout.strip()

    def env(self) -> dict:
        # Host keys checked against the file the fleet wrote, never accepted.
        ssh_args = ("-o ControlMaster=auto -o ControlPersist=60s -o StrictHostKeyChecking=yes "
                    f"-o UserKnownHostsFile={self.fleet.known_hosts} "
                    f"-o ControlPath={self.work}/cp-%C")
        return ansible_env({"ANSIBLE_SSH_ARGS": ssh_args, "ANSIBLE_HOST_KEY_CHECKING": "True"})

    def playbook(self, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
        cp = run([tool("ansible-playbook"), "-i", str(self.inventory), *args], env=self.env(),
                 timeout=timeout)
        (self.work / "playbook.log").open("a").write(output(cp) + "\n")
        return cp

    def harmony(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        env = self.env()
        env.update(HARMONY_KEYS=str(self.keys), HARMONY_MASTER=self.master_url)
        env.pop("HARMONY_KEY_NAME", None)
        return subprocess.run([tool("harmony"), *args], env=env, capture_output=True, text=True,
                              timeout=timeout, cwd=self.work)

    @property
    def master_url(self) -> str:
        return f"tcp://{self.fleet.hosts[MASTER].address}:{PORT}"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    f = nspawnfleet.Fleet(tmp_path_factory.mktemp("t2-fleet"), [MASTER, *WORKERS])
    try:
        f.start()
        yield f
    finally:
        f.stop()


@pytest.fixture(scope="module")
def deploy(fleet, tmp_path_factory):
    return Deploy(fleet, tmp_path_factory.mktemp("t2-operator"))


def converged(cp) -> dict:
    assert cp.returncode == 0, output(cp)[-20000:]
    r = recap(cp.stdout)
    assert set(r) >= {MASTER, *WORKERS}, output(cp)[-5000:]
    for host, c in r.items():
        assert c["failed"] == 0 and c["unreachable"] == 0, (host, c)
    return r


def changed_tasks(stdout: str) -> list[str]:
    """The tasks that reported 'changed', for the failure message."""
    out, task = [], ""
    for line in stdout.splitlines():
        if line.startswith(("TASK [", "RUNNING HANDLER [")):
            task = line
        elif line.startswith("changed:"):
            out.append(f"{task} {line}")
    return out


def wait_job(d: Deploy, job: str, states: tuple[str, ...], timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        cp = d.harmony("status", job, "--json")
        st = json.loads(cp.stdout) if cp.returncode == 0 else {"state": f"? {cp.stderr[-300:]}"}
        if st.get("state") in states:
            return st
        assert time.monotonic() < deadline, f"{job}: not {states} after {timeout}s: {st}"
        time.sleep(2)


def test_converge(deploy):
    t = time.monotonic()
    r = converged(deploy.playbook("site.yml"))
    print(f"first converge: {time.monotonic() - t:.0f}s {r}")
    for name in [MASTER, *WORKERS]:
        unit = "harmony-master" if name == MASTER else "harmony-worker"
        cp = deploy.fleet.ssh(name, f"systemctl is-active {unit} harmony-firewall", check=False)
        assert cp.stdout.split() == ["active", "active"], (name, cp.stdout, cp.stderr)
        rev = deploy.fleet.ssh(name, "cat /opt/harmony/REVISION").stdout.strip()
        assert rev == deploy.git("rev-parse", "HEAD")


def test_second_converge_changes_nothing(deploy):
    cp = deploy.playbook("site.yml")
    r = converged(cp)
    assert all(c["changed"] == 0 for c in r.values()), (r, changed_tasks(cp.stdout))


def test_check_mode_changes_nothing(deploy):
    cp = deploy.playbook("site.yml", "--check")
    r = converged(cp)
    assert all(c["changed"] == 0 for c in r.values()), (r, changed_tasks(cp.stdout))


def _reachable(src: str | None, host: str, port: int) -> bool:
    s = socket.socket()
    s.settimeout(3)
    try:
        if src:
            s.bind((src, 0))
        s.connect((host, port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def test_firewall(deploy, fleet):
    master = fleet.hosts[MASTER].address
    probe = ("python3 -c \"import socket,sys; s=socket.socket(); s.settimeout(3); "
             "sys.exit(s.connect_ex(('{a}', {p})))\"")
    # the workers reach the master's control port
    for w in WORKERS:
        cp = fleet.ssh(w, probe.format(a=master, p=PORT), check=False)
        assert cp.returncode == 0, (w, cp.stderr)
    # the operator (a client CIDR) reaches it and SSH; an address of this
    # machine outside the fleet and the client/operator CIDRs reaches neither
    assert _reachable(fleet.gateway, master, PORT)
    assert _reachable(fleet.gateway, master, 22)
    assert not _reachable(fleet.outsider, master, PORT)
    assert not _reachable(fleet.outsider, master, 22)
    assert not _reachable(fleet.outsider, fleet.hosts[WORKERS[0]].address, 22)
    cp = fleet.ssh(MASTER, "sudo nft list table inet harmony")
    # the dropped SSH attempt above was counted by the table's drop rule
    dropped = re.search(r"tcp dport 22 counter packets (\d+)", cp.stdout)
    assert dropped and int(dropped[1]) > 0, cp.stdout


def test_cluster_status_shows_the_revision(deploy):
    cp = deploy.harmony("cluster", "status", "--json")
    assert cp.returncode == 0, cp.stderr
    cl = json.loads(cp.stdout)
    head = deploy.git("rev-parse", "HEAD")
    workers = {w["name"]: w for w in cl["workers"]}
    assert set(workers) == set(WORKERS), cl
    assert all(w["revision"] == head and w["alive"] for w in workers.values()), cl


def test_staged_two_machine_job(deploy):
    data = deploy.work / "ratings.txt"
    cp = deploy.harmony("data", "gen", "nmf", "--out", str(data), "--seed", "0",
                        "--users", "400", "--items", "120", "--per-user", "20")
    assert cp.returncode == 0, cp.stderr
    cp = deploy.harmony("data", "put", str(data), "--name", "ratings")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    cp = deploy.harmony("data", "ls")
    assert cp.returncode == 0 and "ratings" in cp.stdout, cp.stdout + cp.stderr
    cp = deploy.harmony("submit", str(ROOT / "apps" / "nmf.py"), "--machines", "2", "--wait",
                        "--input", "harmony://ratings", *NMF_SHORT, timeout=900)
    assert cp.returncode == 0, cp.stdout[-3000:] + cp.stderr[-3000:]
    job = re.search(r"\b(job-\d+)\b", cp.stdout + cp.stderr)
    assert job, cp.stdout[-2000:]
    st = json.loads(deploy.harmony("status", job[1], "--json").stdout)
    assert st["state"] == "finished", st
    # It ran on both machines. The deployed master runs the Harmony
    # scheduler (mode harmony, the default): it profiles a new job on as many
    # idle machines as it asks for, then may keep or change its machine set
    # (`workers` is the last one). So the check is on the run's history: the
    # epochs that completed while the job held both workers (from its launch
    # on both to the first event that moved it, if any).
    both = set(WORKERS)
    spans, start = [], None
    for t, _state, note in st["events"]:
        on = set(re.findall(r"harmony-worker-\d+", note.split("->")[-1]))
        if start is None and on == both and ("attempt" in note or "->" in note):
            start = t
        elif start is not None and on and on != both:
            spans.append((start, t))
            start = None
    if start is not None:
        spans.append((start, float("inf")))
    on_both = [e for e in st["epochs"] if any(a <= e["time"] <= b for a, b in spans)]
    assert on_both, (st["events"], [(e["epoch"], e["time"]) for e in st["epochs"]])
    # ... and it learned: 3 epochs, the objective finite and falling
    obj = [e["metrics"]["objective"] for e in st["epochs"]]
    assert len(obj) == 3 and all(o == o and o < float("inf") for o in obj), obj
    assert obj[-1] < obj[0], obj
    deploy.staged_objective = obj[-1]
    print(f"staged job {job[1]}: {len(on_both)} of {len(obj)} epochs on both workers; "
          f"events {[e[2] for e in st['events']]}")


# The upgrade's job must still be running when the rollout reaches it, and
# a rollout takes minutes (rsync, a pip install per host, restarts), while
# NMF on this data runs an epoch in well under a second. So the job is
# apps/nmf.py with a brake: while HOLD exists on a worker, its compute step
# sleeps HOLD_SLEEP seconds per call there. The test makes HOLD on every
# worker before the submit and removes it after the rollout, and the job
# then runs its remaining epochs at full speed. The brake touches nothing
# the rollout does: the pauses, checkpoints, restarts and resumes are real.
HOLD = "/var/tmp/harmony-t2-hold"
HOLD_SLEEP = 0.5
UPGRADE_EPOCHS = 1500   # held: >= 750 s running; a rollout took 150-280 s here
BRAKE = f"""

# --- T2 (tests/deploy/test_deploy_t2.py): a brake, while {HOLD} exists
import os as _os
import time as _time

_nmf_compute = NMF.compute


def _braked_compute(self, *args, **kwargs):
    if _os.path.exists({HOLD!r}):
        _time.sleep({HOLD_SLEEP})
    return _nmf_compute(self, *args, **kwargs)


NMF.compute = _braked_compute
"""


def _events(st: dict) -> list[str]:
    return [f"{e[1]}: {e[2]}" for e in st.get("events", [])]


def test_rolling_upgrade_keeps_the_job_alive(deploy, fleet):
    app = deploy.work / "nmf_braked.py"
    app.write_text((ROOT / "apps" / "nmf.py").read_text() + BRAKE)
    for w in WORKERS:
        fleet.ssh(w, f"touch {HOLD}")
    cp = deploy.harmony("submit", str(app), "--machines", "2", "--input", "harmony://ratings",
                        "--rank", "4", "--blocks", "4", "--max-epochs", str(UPGRADE_EPOCHS))
    assert cp.returncode == 0, cp.stderr
    job = re.search(r"\b(job-\d+)\b", cp.stdout)[1]
    wait_job(deploy, job, ("running",), 300)
    # a new revision of the checkout
    init = deploy.checkout / "harmony" / "__init__.py"
    init.write_text(init.read_text() + "# T2 upgrade\n")
    deploy.git("commit", "-q", "-am", "revision 2")
    head = deploy.git("rev-parse", "HEAD")
    t = time.monotonic()
    cp = deploy.playbook("site.yml")
    r = converged(cp)
    print(f"upgrade converge: {time.monotonic() - t:.0f}s {r}")
    st = json.loads(deploy.harmony("status", job, "--json").stdout)
    # the rollout did not outlast the job: it is still under way
    assert st["state"] not in ("finished", "failed", "cancelled"), _events(st)
    ev = _events(st)
    # the master's restart and each worker's, one at a time: a pause (with
    # its checkpoint) and a resume per restart, three in all
    paused = [e for e in ev if e.startswith("paused:") and "paused by user" in e]
    resumed = [e for e in ev if "resume requested by user" in e]
    assert len(paused) == 3 and len(resumed) == 3, ev
    # the workers restarted one at a time (serial 1): a batch (a play of its
    # own in the output) per worker, each restarting only its worker and
    # resuming the job before the next batch starts
    batches = cp.stdout.split("PLAY [Deploy the Harmony workers]")[1:]
    restarted = [sorted({re.search(r"changed: \[([^\]\s]+)", c)[1] for c in changed_tasks(b)
                         if "[worker : Restart harmony-worker]" in c}) for b in batches]
    assert restarted == [[w] for w in WORKERS], restarted
    assert all("[worker : Resume the drained jobs]" in b for b in batches)
    # every host restarted on the new code and says so
    cl = json.loads(deploy.harmony("cluster", "status", "--json").stdout)
    assert {w["name"] for w in cl["workers"] if w["alive"]} == set(WORKERS), cl
    assert all(w["revision"] == head for w in cl["workers"]), cl
    for name in [MASTER, *WORKERS]:
        assert deploy.fleet.ssh(name, "cat /opt/harmony/REVISION").stdout.strip() == head
    # release the brake: the job finishes
    for w in WORKERS:
        fleet.ssh(w, f"rm -f {HOLD}")
    st = wait_job(deploy, job, ("finished", "failed", "cancelled"), 900)
    assert st["state"] == "finished", _events(st)
    assert st["epochs_total"] == UPGRADE_EPOCHS, st["epochs_total"]
    # the same data and rank as the staged job, UPGRADE_EPOCHS epochs against 3
    assert st["objective"] < deploy.staged_objective, (st["objective"], deploy.staged_objective)
    print(f"upgrade job {job}: {' | '.join(_events(st))}")


def test_teardown_stops_the_services(deploy, fleet):
    cp = deploy.playbook("teardown.yml")
    assert cp.returncode == 0, output(cp)[-5000:]
    for name in [MASTER, *WORKERS]:
        unit = "harmony-master" if name == MASTER else "harmony-worker"
        st = fleet.ssh(name, f"systemctl is-active {unit}", check=False).stdout.strip()
        assert st != "active", (name, st)
