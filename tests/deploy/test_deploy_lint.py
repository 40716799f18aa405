"""T0: deploy/ is lint-clean and every playbook parses; settings are checked.

- ansible-lint --offline --profile production --strict, from deploy/;
- ansible-playbook --syntax-check of every playbook against the example
  static inventory;
- site.yml fails on a bad setting before any host is contacted, and passes
  its check play on good ones;
- the unit files and firewall rules render from the roles' defaults, and
  inventory group/host vars override those defaults; both units run with
  the key set (--keys), the worker reports the deployed revision
  (--revision-file). The key tasks themselves: test_deploy_keys.py.

No host is contacted: runs against the example inventory happen in a
network namespace with only loopback (as root), with every host pointed at
127.0.0.1:1 as well.
"""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from deploytools import aws, offline  # noqa: F401  (fixtures; no conftest.py here: it would shadow tests/conftest.py)
from deploytools import (DEPLOY, HERE, PLAYBOOKS, ROOT, STATIC_INVENTORY, ansible_env, output,
                         recap, run, tool)

# Every host at a closed loopback port: a run that got past the checks is refused.
NOWHERE = ["-e", "ansible_host=127.0.0.1", "-e", "ansible_port=1"]


def test_ansible_lint_production_profile_is_clean():
    cp = run([tool("ansible-lint"), "--offline", "--profile", "production", "--strict", "--nocolor"],
             timeout=240)
    assert cp.returncode == 0, output(cp)


def test_every_playbook_is_covered():
    assert {"site.yml", "provision.yml", "teardown.yml"} <= set(PLAYBOOKS), PLAYBOOKS


@pytest.mark.parametrize("playbook", PLAYBOOKS)
def test_syntax_check(playbook):
    cp = run([tool("ansible-playbook"), "-i", str(STATIC_INVENTORY), "--syntax-check", playbook])
    assert cp.returncode == 0, output(cp)


def site(offline, *extra: str) -> subprocess.CompletedProcess:
    args = [tool("ansible-playbook"), "-i", str(STATIC_INVENTORY), "site.yml", *NOWHERE]
    for e in extra:
        args += ["-e", e]
    return run(args, prefix=offline.prefix, timeout=120)


@pytest.mark.parametrize("setting, message", [
    ("harmony_worker_cpus=abc", "harmony_worker_cpus must be empty or a positive whole number"),
    ("harmony_worker_cpus=0", "harmony_worker_cpus must be empty or a positive whole number"),
    ("harmony_worker_cpus=-2", "harmony_worker_cpus must be empty or a positive whole number"),
    ("harmony_worker_memory=lots", "harmony_worker_memory must be empty or a size"),
    ("harmony_master_port=99999", "harmony_master_port must be a port number"),
    ("harmony_dashboard_port=5760", "harmony_dashboard_port must be 0 (none) or a port"),
    ("harmony_dashboard_port=web", "harmony_dashboard_port must be 0 (none) or a port"),
    ("harmony_stop_timeout=soon", "harmony_stop_timeout must be a positive whole number"),
    ("harmony_source=svn", "harmony_source must be 'rsync' or 'git'"),
    ('{"harmony_operator_cidrs": []}', "set harmony_operator_cidrs"),
    ('{"harmony_operator_cidrs": ["everywhere"]}', "set harmony_operator_cidrs"),
    (f"harmony_keys_local_dir={ROOT}/keys", "must be outside the checkout"),
    ('{"harmony_keys_readers": ["../escape"]}', "harmony_keys_clients and harmony_keys_readers"),
])
def test_a_bad_setting_fails_site_yml_before_any_host_is_touched(offline, setting, message):
    cp = site(offline, setting)
    assert cp.returncode not in (0, 4), output(cp)  # 4 would mean it went on to the hosts
    counts = recap(cp.stdout)
    assert sum(c["failed"] for c in counts.values()) >= 1, output(cp)
    assert all(c["unreachable"] == 0 and c["changed"] == 0 for c in counts.values()), output(cp)
    assert message in cp.stdout + cp.stderr, output(cp)
    assert "PLAY [Gather facts from every host]" not in cp.stdout, output(cp)


def test_good_settings_pass_the_check_play(offline):
    cp = site(offline, "harmony_worker_cpus=8", "harmony_worker_memory=24G")
    # Past the checks, the next play tries to reach the hosts (127.0.0.1:1, refused).
    assert cp.returncode == 4, output(cp)
    assert "PLAY [Gather facts from every host]" in cp.stdout, output(cp)
    counts = recap(cp.stdout)
    assert set(counts) == {"harmony-master"} | {f"harmony-worker-{n}" for n in range(1, 5)}
    assert all(c["failed"] == 0 and c["unreachable"] == 1 for c in counts.values()), output(cp)


def render(tmp_path, inventory_text: str | None = None) -> dict[str, str]:
    """Render the units and firewall rules of every host of an inventory
    (default: the example) with tests/deploy/render_units.yml."""
    inv = STATIC_INVENTORY
    if inventory_text is not None:
        inv = tmp_path / "inventory.ini"
        inv.write_text(inventory_text)
    out = tmp_path / "rendered"
    out.mkdir()
    cp = run([tool("ansible-playbook"), "-i", str(inv), str(HERE / "render_units.yml"),
              "-e", f"harmony_roles={DEPLOY / 'roles'}", "-e", f"render_dir={out}",
              "-e", f"ansible_python_interpreter={sys.executable}"],
             env=ansible_env({"ANSIBLE_ROLES_PATH": str(DEPLOY / "roles")}))
    assert cp.returncode == 0, output(cp)
    return {p.name: p.read_text() for p in out.iterdir()}


def execstart(unit: str) -> str:
    return re.search(r"^ExecStart=(.*)$", unit, re.M)[1]


def test_units_and_firewall_render_from_the_defaults(tmp_path):
    r = render(tmp_path)
    # The master binds its private (default-route) address, not every interface.
    # Both run with the CurveZMQ key set (a service without --keys refuses to
    # start); the worker reports the deployed revision, the master reads it
    # from its environment file.
    assert execstart(r["harmony-master.service"]) == (
        "/opt/harmony/venv/bin/harmony-master start --host 203.0.113.10 --port 5760 "
        "--state-dir /var/lib/harmony/master --dashboard-port 8765 --dashboard-host "
        "203.0.113.10 --keys /etc/harmony/keys")
    assert "\nEnvironmentFile=-/opt/harmony/REVISION.env\n" in r["harmony-master.service"]
    assert execstart(r["harmony-worker-1.service"]) == (
        "/opt/harmony/venv/bin/harmony-worker start --master tcp://203.0.113.10:5760 "
        "--name harmony-worker-1 --host 203.0.113.11 --state-dir /var/lib/harmony/worker "
        "--keys /etc/harmony/keys --revision-file /opt/harmony/REVISION")
    # A host var of the inventory overrides the default advertise address.
    assert "--host 10.0.0.14 " in execstart(r["harmony-worker-4.service"])
    assert "--cpus" not in r["harmony-worker-1.service"]
    nft = r["harmony-worker-2.nft"]
    fleet = re.search(r"set fleet4 \{.*?elements = \{ (.*?) \}", nft, re.S)[1].split(", ")
    assert sorted(fleet) == ["10.0.0.14"] + [f"203.0.113.{n}" for n in range(10, 15)]
    assert re.search(r"set operator4 \{.*?elements = \{ 198\.51\.100\.7/32 \}", nft, re.S)
    rules = re.search(r"chain input \{(.*?)\n\t\}", nft, re.S)[1]
    lines = [ln.strip() for ln in rules.strip().splitlines()]
    assert lines[1:] == [
        'iif "lo" accept',
        "ct state established,related accept",
        "tcp dport 22 ip saddr @operator4 accept",
        "tcp dport 22 ip6 saddr @operator6 accept",
        "tcp dport 22 counter drop",
        "tcp dport { 5760, 8765, 49152-65535 } ip saddr @fleet4 accept",
        "tcp dport { 5760, 8765, 49152-65535 } ip saddr @client4 accept",
        "tcp dport { 5760, 8765, 49152-65535 } counter drop",
    ], rules
    # No client CIDR by default: the client set is empty.
    assert "elements" not in re.search(r"set client4 \{(.*?)\}", nft, re.S)[1]
    # The table replaces itself atomically: `nft -f` the file twice is a no-op.
    assert nft.index("table inet harmony\ndelete table inet harmony\n") < nft.index("table inet harmony {")


def test_inventory_group_and_host_vars_override_the_defaults(tmp_path):
    text = STATIC_INVENTORY.read_text()
    text = text.replace("harmony-worker-1 ansible_host=203.0.113.11",
                        "harmony-worker-1 ansible_host=203.0.113.11 harmony_worker_cpus=6 "
                        "harmony_worker_memory=20G")
    text += ("harmony_master_bind=10.0.0.99\nharmony_master_port=6000\nharmony_worker_cpus=4\n"
             "harmony_keys_dir=/srv/harmony-keys\nharmony_dashboard_port=0\n")
    r = render(tmp_path, text)
    assert "--host 10.0.0.99 --port 6000 " in execstart(r["harmony-master.service"])
    assert execstart(r["harmony-master.service"]).endswith(" --keys /srv/harmony-keys")
    assert " --keys /srv/harmony-keys " in execstart(r["harmony-worker-3.service"])
    w1, w2 = execstart(r["harmony-worker-1.service"]), execstart(r["harmony-worker-2.service"])
    assert w1.endswith(" --cpus 6 --memory 20G"), w1
    assert w2.endswith(" --cpus 4"), w2
    assert "--master tcp://203.0.113.10:6000 " in w2
    assert "tcp dport { 6000, 49152-65535 }" in r["harmony-master.nft"]    # no dashboard
    assert "--dashboard" not in execstart(r["harmony-master.service"])


# Ansible's templar, in a process of its own: importing ansible patches
# sys.intern, which breaks torch's compiler imported later in the same process
_GUARDS = r"""
import json, sys
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
when, cases = json.load(sys.stdin)
out = []
for services in cases:
    t = Templar(loader=DataLoader(), variables={"ansible_facts": {"services": services}})
    out.append(bool(t.evaluate_conditional(trust_as_template(when))))
print(json.dumps(out))
"""


def test_teardown_skips_a_unit_a_half_deploy_left_not_found():
    """#37 item 9: after a deploy that stopped half-way, service_facts lists
    harmony-master as not-found (the firewall unit's Before= names it); the
    guard passed and systemd_service failed, so no one could tear down. The
    guards, evaluated by Ansible's own templar on four sets of facts."""
    import json
    import yaml
    plays = yaml.safe_load((DEPLOY / "teardown.yml").read_text())
    guards = {t["ansible.builtin.systemd_service"]["name"]: t["when"]
              for p in plays for t in p.get("tasks", []) if "ansible.builtin.systemd_service" in t}
    assert set(guards) == {"harmony-worker", "harmony-master"}, guards
    for name, when in guards.items():
        unit = f"{name}.service"
        cases = [{}, {unit: {"name": unit, "state": "stopped", "status": "not-found"}},
                 {unit: {"name": unit, "state": "running", "status": "enabled"}},
                 {unit: {"name": unit, "state": "stopped", "status": "disabled"}}]
        cp = subprocess.run([sys.executable, "-c", _GUARDS], input=json.dumps([when, cases]),
                            capture_output=True, text=True, timeout=120)
        assert cp.returncode == 0, cp.stderr[-2000:]
        assert json.loads(cp.stdout) == [False, False, True, True], (name, cp.stdout)


def test_the_fleet_hosts_see_every_path_pip_is_configured_with(tmp_path):
    """#37 item 8: a host whose pip.conf names a constraint file it cannot
    read fails every pip install; the fleet binds whatever pip's settings
    name on this machine's disk (pip_paths), not only the wheel dirs."""
    from nspawnfleet import pip_paths
    cons = tmp_path / "xdg" / "constraints.txt"
    cons.parent.mkdir()
    cons.write_text("numpy<3\n")
    idx = tmp_path / "pypi" / "simple"
    idx.mkdir(parents=True)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    opts = {"constraint": str(cons), "extra-index-url": f"file://{idx} https://pypi.org/simple",
            "find-links": str(wheels), "cert": str(cons), "index-url": "file:///no/such/dir",
            "default-timeout": "180"}
    assert pip_paths(opts) == sorted({str(cons.parent), str(idx), str(wheels)})
