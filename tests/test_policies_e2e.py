"""One end-to-end run per policy on a 2-machine local cluster (issue #15
item 5): the real master started with ``--policy NAME`` in the mode the
simulator gives it (``harmony.sim.run.setup``: the queued policies in the
harmony mode, the others naive), three small toy jobs of one machine each,
all must finish, with one cheap check of what the policy does.

The start-only and simple policies run by default; the ones that profile
jobs first or refit loss curves each epoch (harmony, match, slaq,
slaq-maxmin, mlfs-c: more decisions, pauses and restarts, slower on a loaded
machine) are marked slow.
"""
from __future__ import annotations

import pytest

from apps_for_tests import TOY_APP
from conftest import ISOLATE, wait_state
from harmony.client import Client
from harmony.cluster import LocalCluster
from harmony.sim.run import setup

SLOW = pytest.mark.slow
CASES = ["isolated", "colocate", "oasis", "mlfs",
         pytest.param("harmony", marks=SLOW), pytest.param("match", marks=SLOW),
         pytest.param("slaq", marks=SLOW), pytest.param("slaq-maxmin", marks=SLOW),
         pytest.param("mlfs-c", marks=SLOW)]
EPOCHS = (8, 6, 6)


@pytest.mark.parametrize("name", CASES)
def test_policy_runs_toy_jobs_to_the_end_on_two_machines(name, tmp_path):
    policy, mode = setup(name)
    cl = LocalCluster(2, str(tmp_path), port=0, policy=policy, mode=mode,
                      heartbeat_timeout=5.0, isolate=ISOLATE)
    cl.start()
    try:
        with Client(cl.endpoint, timeout_s=20) as c:
            ids = [c.submit("toy.py", TOY_APP, ["--max-epochs", str(n), "--sleep", "0.01"],
                            machines=1) for n in EPOCHS]
            sts = [wait_state(c, j, ("finished", "failed"), timeout=150) for j in ids]
    finally:
        cl.stop()
    for st, n in zip(sts, EPOCHS):
        assert st["state"] == "finished", (name, st["error"], st["events"])
        # pauses and moves (harmony, match, slaq, mlfs) resume where they
        # stopped; mlfs-c may stop a job early, never run an epoch twice
        done = [e["epoch"] for e in st["epochs"]]
        assert done == list(range(len(done))), (name, done)
        assert len(done) == n or (name == "mlfs-c" and 0 < len(done) <= n), (name, done)
    states = [[e[1] for e in st["events"]] for st in sts]
    if name == "isolated":
        # never shared: with 2 machines, the last job to start started once
        # one of the others had ended
        first, second, third = sorted(sts, key=lambda s: s["started"])
        assert third["started"] >= min(first["ended"], second["ended"]), sts
    if name in ("harmony", "match"):
        # profiled first, then placed in a scheduler group
        for st, ss in zip(sts, states):
            assert ss[:2] == ["waiting", "profiling"], (name, ss)
            assert st["sched_group"], (name, st)
    if name in ("colocate", "oasis", "mlfs", "slaq", "slaq-maxmin", "mlfs-c"):
        assert all("profiling" not in ss for ss in states), (name, states)
