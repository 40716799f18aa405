"""Helpers and fixtures for the tests of deploy/ (the Ansible playbooks).

T0: ansible-lint and --syntax-check (test_deploy_lint.py).
T1: provision.yml / teardown.yml against a local moto EC2 endpoint on
    127.0.0.1, inside a network namespace the test creates when it runs as
    root (test_deploy_ec2.py).

The tools come from the `deploy` extra of pyproject.toml (`make venv`
installs it). A missing tool fails the test; it never skips it.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
DEPLOY = ROOT / "deploy"
STATIC_INVENTORY = DEPLOY / "inventory" / "static.example.ini"
EC2_INVENTORY = DEPLOY / "inventory" / "ec2.aws_ec2.yml"
# Every top-level YAML file of deploy/ is a playbook except these.
NOT_PLAYBOOKS = {"requirements.yml"}
PLAYBOOKS = sorted(p.name for p in DEPLOY.glob("*.yml") if p.name not in NOT_PLAYBOOKS)

INSTALL_HINT = ("install the deploy extra into the test venv: "
                "`pip install -e '.[test,torch,deploy]'` (`make venv` does it)")


def tool(name: str) -> str:
    """Path of a console script: the test interpreter's venv first, then PATH.
    Fails (does not skip) when it is missing."""
    local = Path(sys.executable).parent / name
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} not found next to {sys.executable} nor on PATH: {INSTALL_HINT}",
                    pytrace=False)
    return found


def require_module(name: str) -> None:
    try:
        __import__(name)
    except ImportError as exc:
        pytest.fail(f"python module {name} is missing ({exc}): {INSTALL_HINT}", pytrace=False)


def ansible_env(extra: dict | None = None) -> dict:
    """Environment for ansible-*: no colour, no retry files, no real AWS
    credentials or config, no instance-metadata lookups (169.254.169.254)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AWS_", "ANSIBLE_", "BOTO"))}
    # The venv's bin first: ansible-* find each other (and ansible-lint does
    # not warn) even when the venv is not activated.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update({
        "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0", "ANSIBLE_RETRY_FILES_ENABLED": "0",
        "ANSIBLE_DEPRECATION_WARNINGS": "0", "PY_COLORS": "0",
        "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    })
    env.update(extra or {})
    return env


def run(cmd: list[str], *, env: dict | None = None, timeout: float = 120,
        cwd: Path = DEPLOY, prefix: list[str] | None = None) -> subprocess.CompletedProcess:
    full = [*(prefix or []), *cmd]
    return subprocess.run(full, cwd=cwd, env=env or ansible_env(), capture_output=True,
                          text=True, timeout=timeout)


def output(cp: subprocess.CompletedProcess) -> str:
    return f"$ {' '.join(cp.args)}\nrc={cp.returncode}\n--- stdout\n{cp.stdout}\n--- stderr\n{cp.stderr}"


RECAP = re.compile(r"^(\S+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)"
                   r"\s+skipped=(\d+)\s+rescued=(\d+)\s+ignored=(\d+)", re.M)


def recap(stdout: str) -> dict[str, dict[str, int]]:
    """PLAY RECAP counters per host."""
    keys = ("ok", "changed", "unreachable", "failed", "skipped", "rescued", "ignored")
    return {m[1]: dict(zip(keys, map(int, m.groups()[1:]))) for m in RECAP.finditer(stdout)}


# ---------------------------------------------------------------------------
# T1: a moto EC2 endpoint on loopback, in a network namespace of its own
# ---------------------------------------------------------------------------
@dataclass
class AwsEndpoint:
    url: str
    netns: str | None          # None: on the host's loopback (see netns_skip_reason)
    netns_skip_reason: str
    tmp: Path
    region: str = "us-east-1"
    proc: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def prefix(self) -> list[str]:
        """Command prefix that runs a program where the endpoint is reachable."""
        return ["ip", "netns", "exec", self.netns] if self.netns else []

    def env(self, extra: dict | None = None) -> dict:
        # AWS_URL: the amazon.aws modules' and the aws_ec2 inventory plugin's
        # endpoint override, so even a call without endpoint_url stays local.
        return ansible_env({"AWS_URL": self.url, **(extra or {})})

    def playbook(self, playbook: str, *extra_vars: str, timeout: float = 120
                 ) -> subprocess.CompletedProcess:
        inv = self.tmp / "localhost.ini"
        if not inv.exists():
            # Only localhost: the host plays of teardown.yml match nothing, so
            # no SSH is ever attempted to the fake instances' addresses.
            inv.write_text(f"localhost ansible_connection=local "
                           f"ansible_python_interpreter={sys.executable}\n")
        args = [tool("ansible-playbook"), "-i", str(inv), playbook,
                "-e", f"harmony_aws_endpoint_url={self.url}", "-e", f"harmony_aws_region={self.region}"]
        for v in extra_vars:
            args += ["-e", v]
        return run(args, env=self.env(), prefix=self.prefix, timeout=timeout)

    def dump(self) -> dict:
        cp = run([sys.executable, str(HERE / "aws_dump.py"), self.url, self.region],
                 env=self.env(), prefix=self.prefix, timeout=60)
        assert cp.returncode == 0, output(cp)
        return json.loads(cp.stdout)


def _netns_unavailable() -> str:
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "not root: `ip netns add` needs CAP_SYS_ADMIN"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    return ""


def _make_netns(tag: str) -> tuple[str | None, str]:
    """A fresh network namespace with only `lo` up: (name, "") or (None, why not)."""
    reason = _netns_unavailable()
    if reason:
        return None, reason
    name = f"harmony-{tag}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    add = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if add.returncode != 0:
        return None, f"`ip netns add` failed: {add.stderr.strip()}"
    subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
    return name, ""


@dataclass
class Offline:
    """Where to run an ansible-playbook that must contact no host."""
    netns: str | None
    reason: str

    @property
    def prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.netns] if self.netns else []


@pytest.fixture(scope="module")
def offline():
    """A network namespace with only loopback (as root), for playbook runs
    against the example inventory: its documentation addresses are never
    contacted. The tests also point every host at 127.0.0.1:1 (ansible_host,
    ansible_port), so a run that got past the checks would only be refused."""
    netns, reason = _make_netns("t0")
    try:
        yield Offline(netns, reason)
    finally:
        if netns:
            subprocess.run(["ip", "netns", "del", netns], capture_output=True)


@pytest.fixture(scope="module")
def aws(tmp_path_factory):
    """A moto server on 127.0.0.1 (free port). As root it runs in a fresh
    network namespace with only a loopback interface, and so do the
    ansible/boto3 commands of the tests: nothing can reach a real AWS
    endpoint. Without root it runs on the host's loopback instead, with
    fake credentials and instance metadata disabled."""
    require_module("moto")
    require_module("boto3")
    tmp = tmp_path_factory.mktemp("aws")
    netns, reason = _make_netns("t1")
    prefix = ["ip", "netns", "exec", netns] if netns else []
    env = ansible_env({"MOTO_AMIS_PATH": str(HERE / "moto_amis.json")})
    proc = None
    try:
        # `ip netns exec` execs the program: proc is the moto server itself.
        proc = subprocess.Popen([*prefix, sys.executable, str(HERE / "moto_endpoint.py")],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=open(tmp / "moto.log", "w"), text=True, env=env)
        line = proc.stdout.readline()
        if not line.startswith("PORT "):
            pytest.fail(f"moto server did not start: {line!r}\n{(tmp / 'moto.log').read_text()}")
        yield AwsEndpoint(f"http://127.0.0.1:{int(line.split()[1])}", netns, reason, tmp, proc=proc)
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if netns:
            subprocess.run(["ip", "netns", "del", netns], capture_output=True)
