"""Co-located execution on emulated machines: queues, synchronizer, modes."""
import json
import os
import time

import pytest

from harmony.client import Client
from harmony.cluster import LocalCluster
from apps_for_tests import TOY_APP
from conftest import run_cli, wait_state

STEADY = ["--keys", "100000", "--sleep", "0.03", "--iters-per-epoch", "2"]


@pytest.fixture(scope="module")
def hcluster(tmp_path_factory):
    # explicit placement (--machines, --group) under the queues: the colocate policy
    cl = LocalCluster(2, str(tmp_path_factory.mktemp("hcl")), port=0, mode="harmony",
                      policy="colocate",
                      cpus_per_machine=1, net_bandwidth="40MB/s", heartbeat_timeout=3.0)
    cl.start()
    yield cl
    cl.stop()


@pytest.fixture(scope="module")
def pcluster(tmp_path_factory):
    """As hcluster (preemption is on by default there too), for the
    preemption tests' own event logs."""
    cl = LocalCluster(2, str(tmp_path_factory.mktemp("pcl")), port=0, mode="harmony",
                      policy="colocate", cpus_per_machine=1, net_bandwidth="40MB/s",
                      heartbeat_timeout=3.0, preempt=True)
    cl.start()
    yield cl
    cl.stop()


def events(cl, machine):
    path = os.path.join(cl.state_dir, "workers", machine, "queue-events.jsonl")
    return [json.loads(line) for line in open(path)]


def intervals(evs, kind, role=None):
    """[start, end, job, seq] of subtasks from the daemon's grant/done log."""
    start, out = {}, []
    for e in evs:
        key = (e["job"], e["seq"])
        if e["ev"] == "grant" and e["kind"] == kind and (role is None or e["role"] == role):
            start[key] = e["t"]
        elif e["ev"] == "promote" and e["kind"] == kind and role == "primary":
            start[key] = e["t"]
        elif e["ev"] == "demote" and key in start and role == "primary":
            out.append((start.pop(key), e["t"], *key))
        elif e["ev"] == "stop" and key in start:        # a preempted COMP stands
            out.append((start.pop(key), e["t"], *key))
        elif e["ev"] == "resume" and e["kind"] == kind:
            start[key] = e["t"]
        elif e["ev"] == "done" and key in start:
            out.append((start.pop(key), e["t"], *key))
    return sorted(out)


def overlaps(iv):
    return [(a, b) for a, b in zip(iv, iv[1:]) if b[0] < a[1] - 1e-6]


def test_harmony_queues_and_synchronizer(hcluster):
    with Client(hcluster.endpoint) as c:
        jobs = [c.submit("toy.py", TOY_APP, ["--max-epochs", "6", *STEADY], machines=2)
                for _ in range(3)]
        for j in jobs:
            st = wait_state(c, j, ("finished", "failed"))
            assert st["state"] == "finished", st["error"]
        stats = [w["utilization"] for w in c.cluster()["workers"]]
    assert all("net" in s and "q_cpu" in s for s in stats)
    per_machine = {m: events(hcluster, m) for m in ("m0", "m1")}
    for m, evs in per_machine.items():
        mine = [e for e in evs if e["job"] in jobs]
        cpu = intervals(mine, "cpu")
        assert len(cpu) == 3 * 6 * (2 + 1), m   # 2 COMPs per epoch + 1 evaluation
        assert not overlaps(cpu), f"two COMPs at once on {m}"
        assert not overlaps(intervals(mine, "net", "primary")), f"two NET primaries on {m}"
        assert len({e["job"] for e in mine if e["role"] == "secondary"}) > 0
        assert not any(e["ev"] == "stop" for e in mine)     # equal COMPs never preempt
    # the same order of co-located jobs' subtasks on every machine, from the
    # group's leader daemon (#32): the master synchronized none of them
    log = open(os.path.join(hcluster.state_dir, "logs", "master.log")).read()
    leaders = {j: log.split(f"{j}: its subtasks are synchronized by ")[1].split()[0]
               for j in jobs}
    assert len(set(leaders.values())) == 1 and leaders[jobs[0]] in ("m0", "m1"), leaders
    order = {m: [(e["job"], e["seq"], e["kind"]) for e in evs
                 if e["ev"] == "grant" and e["job"] in jobs]
             for m, evs in per_machine.items()}
    for kind in ("cpu", "net"):
        assert [x for x in order["m0"] if x[2] == kind] == \
               [x for x in order["m1"] if x[2] == kind]


def test_a_short_comp_preempts_a_long_one(pcluster):
    """A job with 0.2 s COMPs and one with 0.03 s COMPs in one group: once
    profiled, the short COMP stops the long one instead of waiting behind
    it; still one COMP at a time, and the long job's COMP time does not
    count the time it stood."""
    base = ["--keys", "1000", "--iters-per-epoch", "2", "--max-epochs", "5"]
    with Client(pcluster.endpoint) as c:
        long = c.submit("toy.py", TOY_APP, [*base, "--spin", "0.2"], machines=2, group="pre")
        short = c.submit("toy.py", TOY_APP, [*base, "--spin", "0.03"], machines=2,
                         group="pre")
        sts = [wait_state(c, j, ("finished", "failed"), timeout=90) for j in (long, short)]
    assert all(s["state"] == "finished" for s in sts), [s["error"] for s in sts]
    for m in ("m0", "m1"):
        mine = [e for e in events(pcluster, m) if e["job"] in (long, short)]
        assert not overlaps(intervals(mine, "cpu")), f"two COMPs at once on {m}"
        stops = [e for e in mine if e["ev"] == "stop"]
        assert stops and all(e["job"] == long for e in stops)
        assert len(stops) == len([e for e in mine if e["ev"] == "resume"])
    # the executors learnt how long they stood (the daemons logged it too)
    rec = [json.loads(line) for line in
           open(os.path.join(pcluster.state_dir, "master", "metrics", "jobs.jsonl"))]
    stood = sum(r["timings"].get("stood", 0.0) for r in rec if r["job"] == long)
    logged = 0.0
    n = 0
    for m in ("m0", "m1"):
        at = {}
        for e in events(pcluster, m):
            if e["job"] == long and e["ev"] == "stop":
                at[e["seq"]] = e["t"]
            elif e["job"] == long and e["ev"] == "resume" and e["seq"] in at:
                logged += e["t"] - at.pop(e["seq"])
                n += 1
    # jobs.jsonl holds one record per epoch: each timing is the largest over
    # the machines, so the epochs' sum lies between half and all of both logs;
    # the daemon and the executor read their clocks at different moments of
    # each stop (a few ms apart on a loaded machine: a CI run had 0.0995 s
    # against a bound of 0.1015 s over ~10 stops), hence 5 ms a stop of slack
    slack = 0.005 * n
    assert 0 < 0.9 * logged / 2 - slack <= stood <= 1.1 * logged + slack
    # 0.2 s of CPU time a COMP: at least that much wall time (a loaded
    # machine adds more, so there is no upper bound here)
    assert sts[0]["profile"]["t_cpu"] >= 0.18


def test_cancelling_a_preempted_job_does_not_hang(pcluster):
    """Cancel a long-COMP job while short COMPs keep stopping it: a stopped
    executor still gets its SIGTERM (the daemon continues it), and its
    partner goes on."""
    base = ["--keys", "1000", "--iters-per-epoch", "2"]
    with Client(pcluster.endpoint) as c:
        long = c.submit("toy.py", TOY_APP, [*base, "--max-epochs", "40", "--spin", "0.2"],
                        machines=2, group="pre2")
        short = c.submit("toy.py", TOY_APP, [*base, "--max-epochs", "12", "--spin", "0.03"],
                         machines=2, group="pre2")
        path = os.path.join(pcluster.state_dir, "workers", "m0", "queue-events.jsonl")
        deadline = time.time() + 60
        with open(path) as fh:     # cancel just after a stop, while it stands
            while time.time() < deadline:
                line = fh.readline()
                if not line:
                    time.sleep(0.002)
                elif f'"stop", "job": "{long}"' in line:
                    break
        c.cancel(long)
        assert wait_state(c, long, ("cancelled", "failed"), timeout=20)["state"] == "cancelled"
        st = wait_state(c, short, ("finished", "failed"), timeout=60)
    assert st["state"] == "finished", st["error"]


def test_profiles_converge_on_a_steady_job(hcluster):
    with Client(hcluster.endpoint) as c:
        job = c.submit("toy.py", TOY_APP, ["--max-epochs", "8", *STEADY], machines=2)
        st = wait_state(c, job, ("finished", "failed"))
    assert st["state"] == "finished"
    p = st["profile"]
    assert p["machines"] == 2 and p["samples"] == 8
    # the app's COMP time: at least its 0.03 s sleep (a loaded machine adds
    # to it: 0.043 s once while other test runs shared the VM)
    assert 0.03 <= p["t_cpu"] < 0.5
    # 100,000 keys x 2 floats, half on the other machine, pulled and pushed at 40 MB/s
    assert p["t_net"] > 0.8 * (2 * 100_000 * 8 * 0.5 + 100_000 * 16 * 0.5) / 40e6
    rec = [json.loads(line) for line in
           open(os.path.join(hcluster.state_dir, "master", "metrics", "jobs.jsonl"))]
    mine = [r for r in rec if r["job"] == job]
    assert len(mine) == 8
    # every recorded profile is the moving average of the epochs measured so
    # far (how fast it converges is tested on the pure Job, without timing)
    avg: dict[str, float] = {}
    for r in mine:
        tm, n = r["timings"], r["timings"]["iters"]
        sample = {"t_cpu": tm["comp"] / n, "t_net": (tm["pull"] + tm["push"]) / n,
                  "t_iter": tm["train"] / n}
        avg = sample if not avg else {k: 0.7 * avg[k] + 0.3 * v for k, v in sample.items()}
        for k, v in avg.items():
            assert r["profile"][k] == pytest.approx(v, rel=1e-9), (r["epoch"], k)
    r = run_cli("jobs", "--master", hcluster.endpoint)
    assert "T_CPU" in r.stdout and job in r.stdout


def test_a_failing_job_does_not_stall_its_group(hcluster):
    with Client(hcluster.endpoint) as c:
        good = c.submit("toy.py", TOY_APP, ["--max-epochs", "5", *STEADY], machines=2)
        bad = c.submit("toy.py", TOY_APP, ["--max-epochs", "5", "--crash", "raise", *STEADY],
                       machines=2)
        assert wait_state(c, bad, ("finished", "failed"))["state"] == "failed"
        st = wait_state(c, good, ("finished", "failed"), timeout=60)
        assert st["state"] == "finished", st["error"]


def test_with_sync_master_the_master_synchronizes_in_the_same_order(tmp_path):
    """harmony-master --sync master: the synchronizer in the master's loop
    (no leader appointed), the same order of co-located subtasks."""
    cl = LocalCluster(2, str(tmp_path / "c"), port=0, mode="harmony", policy="colocate",
                      cpus_per_machine=1, sync="master")
    cl.start()
    try:
        with Client(cl.endpoint) as c:
            jobs = [c.submit("toy.py", TOY_APP, ["--max-epochs", "3", *STEADY], machines=2)
                    for _ in range(2)]
            for j in jobs:
                st = wait_state(c, j, ("finished", "failed"))
                assert st["state"] == "finished", st["error"]
        log = open(os.path.join(cl.state_dir, "logs", "master.log")).read()
        assert "its subtasks are synchronized by" not in log
        order = {m: [(e["job"], e["seq"], e["kind"]) for e in events(cl, m)
                     if e["ev"] == "grant" and e["job"] in jobs] for m in ("m0", "m1")}
        assert len(order["m0"]) > 10
        for kind in ("cpu", "net"):
            assert [x for x in order["m0"] if x[2] == kind] == \
                   [x for x in order["m1"] if x[2] == kind]
    finally:
        cl.stop()


def test_forged_and_malformed_syncs_at_a_leader_change_nothing(hcluster):
    """#32: the leader's sync socket takes a sync only from the machine it
    names (its worker key) with the job attempt's secret, for a plan it has,
    within its bounds. Another machine's key speaking for the leader's own
    machine, bogus rounds from a member's key (without the secret they
    stalled both jobs: every open round taken), a client's key and garbage:
    the jobs finish as undisturbed ones do (every epoch, the toy's exact
    objective steps)."""
    import numpy as np
    import zmq
    from harmony.comm import messages as M
    from harmony.comm import security
    from harmony.comm.zmqutil import make_socket
    logs = {m: open(os.path.join(hcluster.state_dir, "logs", f"worker-{m}.log")).read()
            for m in ("m0", "m1")}
    ep = {m: t.split("subtask synchronizer on ")[1].split()[0] for m, t in logs.items()}
    ctx = zmq.Context()
    socks = []

    def sock(role, name, m):
        s = make_socket(ctx, zmq.DEALER, keys=security.Keys.load(hcluster.keys, role, name),
                        timeout_s=2.0)
        s.connect(ep[m])
        socks.append(s)
        return s
    try:
        with Client(hcluster.endpoint) as c:
            jobs = [c.submit("toy.py", TOY_APP, ["--max-epochs", "6", *STEADY], machines=2)
                    for _ in range(2)]
            for j in jobs:
                wait_state(c, j, ("running",))
            attackers = [(sock("worker", "m1", m), sock("client", "admin", m)) for m in ep]
            for w, cl in attackers:
                for j in jobs:
                    for seq in range(40):
                        for attempt, gen in ((1, 1), (1, 2), (2, 1)):
                            for s in (w, cl):
                                # m1's key speaking for m0; m1 for itself at bogus rounds
                                for machine, index in (("m0", 0), ("m1", 1), ("m1", 7)):
                                    s.send(M.encode("lsync", job=j, attempt=attempt, gen=gen,
                                                    index=index, seq=seq * 1000 + 5,
                                                    next="cpu", prio=1e9, machine=machine,
                                                    tag="0" * 32))
                    w.send(b"\x93garbage")
                    w.send(M.encode("enqueue", job=j, seq=1, kind="cpu"))
            sts = [wait_state(c, j, ("finished", "failed")) for j in jobs]
        for st in sts:
            assert st["state"] == "finished" and st["failures"] == 0, st["error"]
            obj = np.array([e["metrics"]["objective"] for e in st["epochs"]])
            assert len(obj) == 6
            steps = np.diff(obj)
            assert np.allclose(steps, steps[0], rtol=1e-3), "an update was lost or doubled"
        assert all(p.poll() is None for p in hcluster.procs)    # every daemon still runs
    finally:
        for s in socks:
            s.close(0)
        ctx.term()
