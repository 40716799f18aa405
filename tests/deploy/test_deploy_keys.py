"""T0: the CurveZMQ key tasks of site.yml (roles/common/tasks/keys.yml), run
for real with connection local against an inventory of a master and two
workers whose key directories are temp dirs (tests/deploy/keys_local.yml).

- the key set is made once on the controller (`harmony keys init`), with
  its secrets 0600; --check makes it but touches no host;
- each host gets exactly what its service needs: the cluster pair and every
  public key, a worker also its own pair, never a client's or reader's
  secret; the playbooks' own client key goes to the master only; dirs 0700,
  secrets 0600, public keys 0644, owned by harmony_user; the services can
  load them (harmony.comm.security.Keys.load); the master's service also
  gets the dashboard's reader pair (it reads the job pages' logs with it);
- a second run changes nothing and restarts nothing; a new worker gets its
  pair (existing keys kept) and every host its public key; a planted secret
  or a revoked key is removed, a loosened mode restored; a secret readable
  by others on the controller fails the run.

No host is contacted: every host is localhost (connection local).
"""
from __future__ import annotations

import grp
import os
import pwd
import re
import stat
import sys
from pathlib import Path

import pytest

from deploytools import DEPLOY, HERE, ROOT, ansible_env, output, recap, run, tool
from harmony.comm import security

WORKERS = {"w1": "w1", "w2": "worker-two"}      # inventory host -> harmony_worker_name
PUBLIC = {"cluster.key", "clients/admin.key", "clients/deploy.key", "readers/reader.key",
          "readers/dashboard.key"}


class Fleet:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.local = tmp / "controller" / "fleet-keys"
        self.user = pwd.getpwuid(os.getuid()).pw_name
        self.group = grp.getgrgid(os.getgid()).gr_name
        self.workers = dict(WORKERS)

    def keys(self, host: str) -> Path:
        return self.tmp / "hosts" / host / "keys"

    @property
    def deploy_keys(self) -> Path:
        return self.tmp / "hosts" / "master" / "deploy-keys"

    def inventory(self) -> Path:
        inv = self.tmp / "inventory.ini"
        lines = ["[harmony_master]",
                 f"master harmony_keys_dir={self.keys('master')} "
                 f"harmony_deploy_keys_dir={self.deploy_keys}",
                 "[harmony_workers]"]
        lines += [f"{h} harmony_keys_dir={self.keys(h)} harmony_worker_name={n}"
                  for h, n in self.workers.items()]
        lines += ["[harmony:children]", "harmony_master", "harmony_workers", "[all:vars]",
                  "ansible_connection=local", f"ansible_python_interpreter={sys.executable}",
                  f"harmony_keys_local_dir={self.local}", f"harmony_user={self.user}",
                  f"harmony_group={self.group}", f"harmony_deploy_keys_owner={self.user}"]
        inv.write_text("\n".join(lines) + "\n")
        return inv

    def play(self, *extra: str, expect_rc: int = 0):
        cp = run([tool("ansible-playbook"), "-i", str(self.inventory()),
                  str(HERE / "keys_local.yml"), *extra],
                 env=ansible_env({"ANSIBLE_ROLES_PATH": str(DEPLOY / "roles")}), timeout=240)
        assert cp.returncode == expect_rc, output(cp)
        return cp


def restarted(cp) -> set[str]:
    return set(re.findall(r'"msg": "RESTART (\S+)"', cp.stdout))


def files(d: Path) -> dict[str, int]:
    """relative path -> mode of every file below d (and '.'/dirs with a trailing /)."""
    out = {}
    for p in [d, *d.rglob("*")]:
        rel = str(p.relative_to(d)) + ("/" if p.is_dir() else "")
        out[rel] = stat.S_IMODE(p.stat().st_mode)
    return out


def expected_host(fleet: Fleet, host: str) -> dict[str, int]:
    want = {"./": 0o700, "workers/": 0o700, "clients/": 0o700, "readers/": 0o700,
            "cluster.key_secret": 0o600}
    want |= {p: 0o644 for p in PUBLIC}
    want |= {f"workers/{n}.key": 0o644 for n in fleet.workers.values()}
    if host in fleet.workers:
        want[f"workers/{fleet.workers[host]}.key_secret"] = 0o600
    else:                   # the master: the dashboard's reader key (harmony.obs.dashboard)
        want["readers/dashboard.key_secret"] = 0o600
    return want


def check_hosts(fleet: Fleet) -> None:
    for host in ["master", *fleet.workers]:
        d = fleet.keys(host)
        assert files(d) == expected_host(fleet, host), host
        for p in [d, *d.rglob("*")]:
            assert (p.stat().st_uid, p.stat().st_gid) == (os.getuid(), os.getgid()), p
            if p.is_file():       # the very bytes of the controller's set
                assert p.read_bytes() == (fleet.local / p.relative_to(d)).read_bytes(), p
    # the services load them (the key modes are checked again there)
    security.Keys.load(str(fleet.keys("master")), "master")
    from harmony.obs.dashboard import LOG_READER
    assert security.Keys.load(str(fleet.keys("master")), "reader", LOG_READER).role == "reader"
    for host, name in fleet.workers.items():
        assert security.Keys.load(str(fleet.keys(host)), "worker", name).name == name
    # the playbooks' client key: on the master only, root's (here: the test user's)
    assert files(fleet.deploy_keys) == {"./": 0o700, "clients/": 0o700, "cluster.key": 0o644,
                                        "clients/deploy.key": 0o644,
                                        "clients/deploy.key_secret": 0o600}
    assert security.Keys.load(str(fleet.deploy_keys), "client", "deploy").role == "client"
    assert not any((fleet.tmp / "hosts" / h / "deploy-keys").exists() for h in fleet.workers)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    return Fleet(tmp_path_factory.mktemp("keys"))


def test_check_mode_makes_the_key_set_and_touches_no_host(fleet):
    cp = fleet.play("--check")
    assert not (fleet.tmp / "hosts").exists(), output(cp)
    local = files(fleet.local)
    assert local.pop("./") == 0o700
    secrets = {p: m for p, m in local.items() if p.endswith(".key_secret")}
    assert set(secrets) == {"cluster.key_secret", "workers/w1.key_secret",
                            "workers/worker-two.key_secret", "clients/admin.key_secret",
                            "clients/deploy.key_secret", "readers/reader.key_secret",
                            "readers/dashboard.key_secret"}
    assert set(secrets.values()) == {0o600}, secrets


def test_each_host_gets_its_keys_with_their_modes(fleet):
    cp = fleet.play()
    assert restarted(cp) == {"master", "w1", "w2"}, output(cp)
    check_hosts(fleet)


def test_a_second_run_changes_nothing(fleet):
    cp = fleet.play()
    counts = recap(cp.stdout)
    assert set(counts) == {"master", "w1", "w2"}
    assert all(c["changed"] == 0 and c["failed"] == 0 for c in counts.values()), output(cp)
    assert restarted(cp) == set(), output(cp)


def test_a_new_worker_gets_a_pair_and_every_host_its_public_key(fleet):
    before = {p: (fleet.local / p).read_bytes() for p in ("cluster.key_secret",
                                                           "workers/w1.key_secret")}
    fleet.workers["w3"] = "w3"
    cp = fleet.play()
    assert restarted(cp) == {"master", "w1", "w2", "w3"}, output(cp)
    assert (fleet.local / "workers" / "w3.key_secret").exists()
    assert all((fleet.local / p).read_bytes() == b for p, b in before.items())  # kept
    check_hosts(fleet)


def test_planted_revoked_and_loosened_keys_are_fixed(fleet):
    w1 = fleet.keys("w1")
    (w1 / "clients" / "admin.key_secret").write_bytes(
        (fleet.local / "clients" / "admin.key_secret").read_bytes())     # a client secret
    (w1 / "readers" / "mallory.key").write_text("not in the set\n")      # revoked
    (w1 / "workers" / "w1.key_secret").chmod(0o644)                      # loosened
    cp = fleet.play()
    assert restarted(cp) == {"w1"}, output(cp)
    check_hosts(fleet)


def test_a_loose_secret_on_the_controller_fails_the_run(fleet):
    secret = fleet.local / "readers" / "reader.key_secret"
    secret.chmod(0o640)
    try:
        cp = fleet.play(expect_rc=2)
        assert "Secret keys readable by others" in cp.stdout and str(secret) in cp.stdout, \
            output(cp)
    finally:
        secret.chmod(0o600)


def test_the_repository_ignores_key_sets():
    ignore = (ROOT / ".gitignore").read_text().split()
    assert "*.key_secret" in ignore and "fleet-keys/" in ignore
