"""T1: provision.yml and teardown.yml against a local EC2 API (moto).

The fleet is provisioned for real against the endpoint (security group,
AMI lookup, instances, tags), checked through the EC2 API and through the
aws_ec2 inventory config, provisioned again (nothing may change), and torn
down (only when confirmed, and only its own cluster). No SSH: the playbooks run with harmony_ec2_wait_for_ssh=false and
an inventory that holds only localhost.
"""
from __future__ import annotations

import json
import re

import pytest

from deploytools import aws, offline  # noqa: F401  (fixtures; no conftest.py here: it would shadow tests/conftest.py)
from deploytools import EC2_INVENTORY, output, recap, run, tool

OPERATOR_CIDR = "198.51.100.7/32"  # TEST-NET-2: never routed
NEWEST_CANONICAL_NOBLE = "ami-0c0ffee0000000002"  # see moto_amis.json
WORKERS = 2


def provision(aws, cluster: str = "harmony", workers: int = WORKERS):
    return aws.playbook("provision.yml", f"harmony_cluster={cluster}",
                        "harmony_ec2_key_name=harmony-test-key",
                        f"harmony_ec2_ssh_cidr={OPERATOR_CIDR}",
                        f"harmony_ec2_worker_count={workers}",
                        "harmony_ec2_wait_for_ssh=false")


def instances_of(state: dict, cluster: str, states=("pending", "running")) -> list[dict]:
    return [i for i in state["instances"]
            if {"Key": "harmony_cluster", "Value": cluster} in i.get("Tags", [])
            and i["State"]["Name"] in states]


def tags(instance: dict) -> dict:
    return {t["Key"]: t["Value"] for t in instance.get("Tags", [])}


@pytest.fixture(scope="module")
def fleet(aws):
    """The `harmony` cluster (the name inventory/ec2.aws_ec2.yml filters on)."""
    first = provision(aws)
    assert first.returncode == 0, output(first)
    return {"first": first, "state": aws.dump()}


def test_t1_runs_in_its_own_network_namespace(aws):
    if aws.netns is None:
        pytest.skip(f"T1 ran on the host's loopback, not in a network namespace: "
                    f"{aws.netns_skip_reason}")
    cp = run(["ip", "netns", "identify", str(aws.proc.pid)], timeout=10)
    assert cp.stdout.strip() == aws.netns, output(cp)
    cp = run(["ip", "-o", "link"], prefix=aws.prefix, timeout=10)
    assert [ln.split(":")[1].strip() for ln in cp.stdout.splitlines()] == ["lo"], cp.stdout


def test_provision_launches_the_tagged_fleet(fleet):
    state = fleet["state"]
    insts = instances_of(state, "harmony")
    names = sorted(tags(i)["Name"] for i in insts)
    assert names == ["harmony-master"] + [f"harmony-worker-{n}" for n in range(1, WORKERS + 1)]
    sg = next(g for g in state["security_groups"] if g["GroupName"] == "harmony-sg")
    for inst in insts:
        t = tags(inst)
        assert t["harmony_cluster"] == "harmony"
        assert t["harmony_role"] == ("master" if t["Name"] == "harmony-master" else "worker")
        assert inst["ImageId"] == NEWEST_CANONICAL_NOBLE, "not the newest Canonical noble AMI"
        assert inst["KeyName"] == "harmony-test-key"
        assert inst["InstanceType"] == "m4.2xlarge"
        assert [g["GroupId"] for g in inst["SecurityGroups"]] == [sg["GroupId"]]
    assert {"Key": "harmony_cluster", "Value": "harmony"} in sg.get("Tags", [])


def test_security_group_opens_ssh_to_the_operator_and_harmony_ports_to_the_fleet(fleet):
    sg = next(g for g in fleet["state"]["security_groups"] if g["GroupName"] == "harmony-sg")
    rules = {}
    for p in sg["IpPermissions"]:
        key = (p["IpProtocol"], p.get("FromPort"), p.get("ToPort"))
        assert key not in rules, f"duplicate rule {key}"
        rules[key] = p
    assert set(rules) == {("tcp", 22, 22), ("tcp", 5760, 5760), ("tcp", 49152, 65535)}, rules
    ssh = rules[("tcp", 22, 22)]
    assert [r["CidrIp"] for r in ssh["IpRanges"]] == [OPERATOR_CIDR]
    assert not ssh["UserIdGroupPairs"] and not ssh.get("Ipv6Ranges") and not ssh.get("PrefixListIds")
    for port in [("tcp", 5760, 5760), ("tcp", 49152, 65535)]:
        r = rules[port]
        assert [g["GroupId"] for g in r["UserIdGroupPairs"]] == [sg["GroupId"]], r
        assert not r["IpRanges"] and not r.get("Ipv6Ranges") and not r.get("PrefixListIds"), r


def test_second_provision_changes_nothing(aws, fleet):
    second = provision(aws)
    assert second.returncode == 0, output(second)
    rc1, rc2 = recap(fleet["first"].stdout), recap(second.stdout)
    assert rc1["localhost"]["changed"] > 0, output(fleet["first"])
    assert rc2["localhost"]["changed"] == 0 and rc2["localhost"]["failed"] == 0, output(second)
    state = aws.dump()
    assert sorted(i["InstanceId"] for i in instances_of(state, "harmony")) == \
        sorted(i["InstanceId"] for i in instances_of(fleet["state"], "harmony"))


def test_ec2_inventory_groups_the_fleet_by_role(aws, fleet):
    cp = run([tool("ansible-inventory"), "-i", str(EC2_INVENTORY), "--graph"],
             env=aws.env(), prefix=aws.prefix, timeout=60)
    assert cp.returncode == 0, output(cp)
    groups: dict[str, set[str]] = {}
    current = None
    for line in cp.stdout.splitlines():
        m = re.match(r"^[\s|]*--@(\S+):$", line) or re.match(r"^@(\S+):$", line)
        if m:
            current = groups.setdefault(m[1], set())
        elif (h := re.match(r"^[\s|]*--([^@\s]\S*)$", line)) and current is not None:
            current.add(h[1])
    workers = {f"harmony-worker-{n}" for n in range(1, WORKERS + 1)}
    assert groups.get("harmony_master") == {"harmony-master"}, cp.stdout
    assert groups.get("harmony_workers") == workers, cp.stdout
    assert groups.get("harmony") == workers | {"harmony-master"}, cp.stdout
    # Host vars composed by the config: reached over the public IP, as the
    # AMI's login user, with the host firewall left to the security group.
    cp = run([tool("ansible-inventory"), "-i", str(EC2_INVENTORY), "--host", "harmony-master"],
             env=aws.env(), prefix=aws.prefix, timeout=60)
    assert cp.returncode == 0, output(cp)
    hv = json.loads(cp.stdout)
    master = next(i for i in instances_of(fleet["state"], "harmony")
                  if tags(i)["Name"] == "harmony-master")
    assert hv["ansible_host"] == master.get("PublicIpAddress", master["PrivateIpAddress"])
    assert hv["ansible_user"] == "ubuntu"
    assert hv["harmony_firewall"] is False


def test_teardown_without_confirmation_terminates_nothing(aws, fleet):
    cp = aws.playbook("teardown.yml")          # harmony_cluster=harmony, not confirmed
    assert cp.returncode == 0, output(cp)
    assert recap(cp.stdout)["localhost"]["changed"] == 0, output(cp)
    assert "No instances terminated" in cp.stdout
    cp = aws.playbook("teardown.yml", "harmony_confirm_teardown=yes")   # not the cluster's name
    assert cp.returncode == 0, output(cp)
    assert recap(cp.stdout)["localhost"]["changed"] == 0, output(cp)
    state = aws.dump()
    assert len(instances_of(state, "harmony")) == 1 + WORKERS
    assert "harmony-sg" in {g["GroupName"] for g in state["security_groups"]}


def test_confirmed_teardown_terminates_its_cluster_only(aws, fleet):
    cluster = "t1-teardown"
    cp = provision(aws, cluster, workers=1)
    assert cp.returncode == 0, output(cp)
    assert len(instances_of(aws.dump(), cluster)) == 2

    cp = aws.playbook("teardown.yml", f"harmony_cluster={cluster}",
                      f"harmony_confirm_teardown={cluster}")
    assert cp.returncode == 0, output(cp)
    state = aws.dump()
    assert instances_of(state, cluster, states=("pending", "running", "stopping", "stopped")) == []
    assert f"{cluster}-sg" not in {g["GroupName"] for g in state["security_groups"]}
    # The other cluster is untouched.
    assert len(instances_of(state, "harmony")) == 1 + WORKERS
    assert "harmony-sg" in {g["GroupName"] for g in state["security_groups"]}
