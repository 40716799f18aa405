"""bench/daemon_queue.py (issue #32 item 4): the analysis of a daemon's
queue events on a made-up log, and the bench at a tiny size on a real
one-machine cluster, so that it cannot rot silently."""
from __future__ import annotations

import pytest

from conftest import load_bench


def _bench():
    return load_bench("daemon_queue")


def ev(t, ev, job, seq, kind="cpu"):
    return {"t": t, "ev": ev, "job": job, "seq": seq, "kind": kind, "role": ""}


def test_a_handover_counts_only_when_the_next_comp_was_waiting():
    dq = _bench()
    log = [ev(0.0, "enqueue", "a", 1), ev(0.0, "grant", "a", 1),
           ev(0.001, "enqueue", "b", 1),                 # b waits behind a
           ev(0.020, "done", "a", 1), ev(0.0203, "grant", "b", 1),
           ev(0.040, "done", "b", 1),
           ev(0.050, "enqueue", "a", 2),                 # late: the CPU was idle
           ev(0.0505, "grant", "a", 2), ev(0.070, "done", "a", 2)]
    r = dq.analyse(log, 0.0, 0.1)
    assert r["handovers"] == 1 and r["handover_p50_ms"] == pytest.approx(0.3)
    assert r["rounds"] == 1 and r["round_p50_ms"] == pytest.approx(30.0)   # a: 1 done -> 2
    assert r["cpu_busy"] == pytest.approx((0.020 + 0.0197 + 0.0195) / 0.1, abs=1e-6)


@pytest.mark.timeout(180)
def test_daemon_queue_tiny():
    dq = _bench()
    r = dq.run(jobs=3, comp=0.02, seconds=3.0, warmup=1.0, log=lambda *_: None)
    assert r["handovers"] > 10 and r["rounds"] > 10, r
    assert 0 < r["handover_p50_ms"] <= r["handover_p99_ms"] < 1000
    assert r["cpu_busy"] > 0.3
