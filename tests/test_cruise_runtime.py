"""Cruise driving a running job (``--cruise``) on a heterogeneous local
cluster (one link 10x slower) with a job bound by its model traffic: the
optimizer finds a layout with fewer workers and more local model, the layout
moves live, and every epoch stays exact."""
from __future__ import annotations

import time


from harmony.client import Client
from harmony.cluster import LocalCluster
from apps_for_tests import ORACLE_APP, oracle_closed_form
from conftest import run_cli, wait_state


KEYS = 60_000       # 2 x float64 each: ~1 MB of model rows pulled per iteration


def test_cruise_moves_work_off_a_slow_link(tmp_path):
    cl = LocalCluster(3, str(tmp_path / "c"), port=0, policy="least-loaded", cruise=True,
                      net_bandwidth="40M,40M,4M")
    cl.start()
    try:
        with Client(cl.endpoint, timeout_s=10, keys=cl.keys) as c:
            job = c.submit("oracle.py", ORACLE_APP,
                           ["--max-epochs", "30", "--blocks", "12", "--keys", str(KEYS),
                            "--model-blocks", "32"], machines=3)
            deadline = time.time() + 240
            while True:
                st = c.status(job)
                if st.get("layout") or st["state"] in ("finished", "failed"):
                    break
                assert time.time() < deadline, st["events"][-3:]
                time.sleep(0.5)
            lay = st["layout"]
            assert lay is not None, st["events"]
            # the job is bound by its model traffic (its COMP is trivial): the
            # optimizer gathers the data and most of the model where they need
            # no link (which machine is a tie), instead of 3 workers pulling
            # the model over the links every iteration
            assert len(lay["workers"]) < 3, lay
            assert lay["cruise"]["after"] < 0.8 * lay["cruise"]["before"], lay
            assert any("cruise: predicted epoch" in e[2] for e in st["events"]), st["events"]
            r = run_cli("status", job, "--master", cl.endpoint, env={"HARMONY_KEYS": cl.keys})
            assert "cruise     predicted epoch" in r.stdout, r.stdout + r.stderr
            st = wait_state(c, job, ("finished", "failed"), timeout=300)
        assert st["state"] == "finished", st["error"]
        # Cruise looked again on the new layout; status says what it found
        assert st["cruise"]["at_epoch"] > lay["cruise"]["at_epoch"], (st["cruise"], lay)
        r = run_cli("status", job, "--master", cl.endpoint, env={"HARMONY_KEYS": cl.keys})
        assert "cruise     at epoch" in r.stdout, r.stdout + r.stderr
        for i, ep in enumerate(st["epochs"]):      # every epoch exact: nothing lost
            assert ep["metrics"] == oracle_closed_form(i + 1, 12, KEYS), i
    finally:
        cl.stop()
