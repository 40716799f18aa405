"""bench/master_load.py at a tiny size against a real master process: the
measurements are produced and plausible, so the load generator cannot rot
silently (issue #32, item 1)."""
from __future__ import annotations

import argparse

import pytest

from conftest import load_bench


def _bench():
    return load_bench("master_load")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode,sync", [("harmony", "leader"), ("harmony", "master"),
                                       ("naive", "master")])
def test_master_load_tiny(tmp_path, mode, sync):
    ml = _bench()
    a = argparse.Namespace(
        mode=mode, sync=sync, policy="colocate", warmup=1.0, duration=3.0, procs=2, iters=3,
        ckpt_every=2, setup=0.05, poll_hz=4.0, heartbeat_timeout=5.0, dashboard=False,
        log_level="INFO", keys=str(tmp_path / "keys"), seed=3, nice=0, profile=None,
        keep=False, check=True, pin=False, liveness=False)
    row = ml.run_point(a, machines=4, jobs=2, dop=(2, 3), subtask=0.05, log=lambda *_: None)
    assert "error" not in row, row
    # every job ran, on machines that stayed alive: no lost worker, no requeue
    assert row["running_at_end"] == 2 and row["alive_at_end"] == 4
    assert row["lost_logged"] == 0 and row["unknown_worker"] == 0 and row["requeued"] == 0
    assert row["bad_messages"] == 0 and row["counts"]["aborts"] == 0
    assert row["counts"]["unsupported"] == 0 and row["counts"]["queue_errors"] == 0
    # the synchronizer's (or barriers') rounds: many, every one complete, delays > 0
    assert row["sync_rounds"] >= 20, row
    assert row["sync_incomplete"] == 0, row
    assert 0 < row["sync_p50_ms"] <= row["sync_p99_ms"] < 1000
    # epochs ended, a periodic checkpoint was asked for and written
    assert row["counts"]["epochs"] > 0 and row["counts"]["ckpts"] > 0
    # the readers were answered; heartbeats were acknowledged
    assert row["poll_failed"] == 0 and 0 < row["status_p50_ms"] < 1000
    assert row["hb_p50_ms"] is not None and row["hb_p50_ms"] > 0
    assert row["msgs_per_s"] > 0 and row["master_cores"] > 0 and row["master_rss_mb"] > 10
    assert "sync99" in ml.table([row])
    # with leader daemons the master hears no sync; the daemons speak among
    # themselves (lsync and enqueue) instead
    peers = row["counts"]["peer_sent"] + row["counts"]["peer_recv"]
    assert (peers > 0) == (sync == "leader"), row["counts"]


@pytest.mark.timeout(180)
def test_master_load_liveness_and_restart(tmp_path):
    """#32 item 3 at a tiny size: a silent machine is declared lost within
    the heartbeat timeout and no other is; after the master's kill -9 and
    restart every machine registers again and every job runs new epochs."""
    ml = _bench()
    a = argparse.Namespace(
        mode="harmony", sync="leader", policy="colocate", warmup=1.0, duration=2.0, procs=2,
        iters=3, ckpt_every=2, setup=0.05, poll_hz=2.0, heartbeat_timeout=2.0,
        dashboard=False, log_level="INFO", keys=str(tmp_path / "keys"), seed=4, nice=0,
        profile=None, keep=False, check=True, pin=False, liveness=True)
    row = ml.run_point(a, machines=6, jobs=3, dop=(2, 3), subtask=0.05, log=lambda *_: None)
    assert "error" not in row, row
    # (a loose upper bound: the goal, within the timeout, is measured by the bench)
    assert row["silent_lost_after_s"] is not None and row["silent_lost_after_s"] < 4 * 2.0
    assert row["others_lost"] == 0
    assert row["restart_rejoin_s"] is not None and row["restart_all_running_s"] is not None
    assert row["restart_jobs_running"] == 3
    assert row["restart_all_running_s"] < 60
