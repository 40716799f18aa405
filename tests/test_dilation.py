"""Time dilation (harmony.dilation): the scaled constants, the undilated
reports (pure, injected clocks), and one dilated cluster end to end."""
from __future__ import annotations

import argparse
import time

import pytest

from harmony import dilation as dil
from harmony.client import Client
from harmony.cluster import ClusterError, LocalCluster
from harmony.comm import messages as M
from harmony.master import core as C

from conftest import NMF_APP, wait_state


@pytest.mark.parametrize("bad", [0, 0.5, -2, "x", None, float("nan"), float("inf"), "0.9"])
def test_dilation_must_be_a_number_at_least_one(bad):
    with pytest.raises(dil.DilationError, match="--dilation must be a number >= 1"):
        dil.check(bad)
    with pytest.raises(ClusterError, match="--dilation"):
        LocalCluster(2, "/nonexistent-harmony-test", dilation=bad)
    p = argparse.ArgumentParser()
    dil.add_argument(p)
    with pytest.raises(SystemExit):
        p.parse_args(["--dilation", str(bad)])
    assert p.parse_args(["--dilation", "4"]).dilation == 4.0


def test_sim_import_takes_a_stretched_start_ups_cpu_as_it_is():
    """A start-up stretched at D (its CPU work lasted as long, undilated, as
    at D = 1) keeps its CPU seconds; one made before start-ups were
    stretched took 1/D undilated seconds of CPU."""
    from harmony.sim.importer import setup_cpu
    assert setup_cpu([3.3, 0.4, 1], 8.0) == 0.4
    assert setup_cpu([0.45, 0.4], 8.0) == 0.05


def test_work_is_its_cpu_not_its_wait_for_a_shared_host_core():
    """A COMP's compute on its emulated machine is its CPU seconds (its
    thread's, or its process's over the machine's cores where more), never
    more than its wall time. Two executors pinned to one host core computed
    at once and each took twice its CPU: the stretch multiplied that wait."""
    assert dil.work_seconds(0.4, 0.2, 0.21, 1) == pytest.approx(0.21)    # shared core
    assert dil.work_seconds(0.2, 0.2, 0.2, 1) == pytest.approx(0.2)      # a core to itself
    assert dil.work_seconds(0.1, 0.1, 0.4, 4) == pytest.approx(0.1)      # 4 threads on 4 cores
    assert dil.work_seconds(0.1, 0.02, 0.4, 4) == pytest.approx(0.1)     # their CPU / cores
    assert dil.work_seconds(0.3, 0.35, 0.35, 1) == pytest.approx(0.3)    # never above the wall
    slept = []
    assert dil.stretch_to(0.4, 8 * dil.work_seconds(0.4, 0.2, 0.2, 1), slept.append) == \
        pytest.approx(1.2) and slept == [pytest.approx(1.2)]             # 8 x 0.2, not 8 x 0.4


def test_a_stretch_to_a_target_sleeps_only_what_is_missing():
    slept = []
    assert dil.stretch_to(1.0, 4.0, slept.append) == 3.0 and slept == [3.0]
    # a start-up already slower than D x its CPU (starved) is not stretched
    assert dil.stretch_to(5.0, 4.0, slept.append) == 0.0 and slept == [3.0]


@pytest.mark.parametrize("d", [1.0, 2.0, 4.0, 7.5])
def test_constants_scale_by_d_and_reports_divide_by_d(d):
    assert dil.wall(C.HEARTBEAT_INTERVAL, d) == pytest.approx(d * C.HEARTBEAT_INTERVAL)
    assert dil.undilated(dil.wall(5.0, d), d) == pytest.approx(5.0)
    assert dil.link_rate(12e6, d) == pytest.approx(12e6 / d)
    assert dil.cpu_factor(1.0, d) == d
    assert dil.cpu_factor(0.5, d) == 2 * d          # effective speed s / D
    slept = []
    assert dil.stretch(0.25, d, sleep=slept.append) == pytest.approx(0.25 * (d - 1))
    assert slept == ([0.25 * (d - 1)] if d > 1 else [])
    tm = {"pull": 1.0, "comp": 2.0, "push": 3.0, "sync": 0.5, "train": 8.0, "eval": 1.5,
          "stood": 0.2, "net_wait": 0.7, "stall": 0.1, "comp_cpu": 1.9, "train_cpu": 2.1,
          "iters": 2.0, "bytes": 1e6, "blocks": 8.0, "alpha": 0.5, "link": 3e6}
    out = dil.undilate_timings(tm, d)
    for k in dil.WALL_TIMINGS:
        assert out[k] == pytest.approx(tm[k] / d), k
    assert out["link"] == pytest.approx(tm["link"] * d)   # the link's undilated rate
    for k in ("comp_cpu", "train_cpu", "iters", "bytes", "blocks", "alpha"):
        assert out[k] == tm[k], k                         # CPU seconds, counts, ratios


def test_clock_runs_one_over_d():
    wall = [1000.0]
    clk = dil.Clock(4.0, base=lambda: wall[0])
    assert clk() == 1000.0
    wall[0] += 40.0
    assert clk() == pytest.approx(1010.0)
    assert dil.Clock(1.0, base=lambda: wall[0])() == wall[0]


def _register(core, now, name="m0", **extra):
    return core.handle(C.Received(f"d:{name}".encode(), M.Message("register", {
        "name": name, "host": "h", "cpus": 1, "memory": 1 << 30, "pid": 1,
        "executors": [], **extra}, [])), now)


@pytest.mark.parametrize("d", [1.0, 4.0])
def test_master_timeouts_scale_with_its_clock(d):
    """On the master's dilated clock, a worker that stops beating is lost
    after D x heartbeat_timeout wall seconds, not before."""
    wall = [0.0]
    clk = dil.Clock(d, base=lambda: wall[0])
    core = C.MasterCore(heartbeat_timeout=5.0, dilation=d, now=clk())
    out = _register(core, clk(), dilation=d)
    assert [s.type for s in out if isinstance(s, C.Send)][:1] == ["registered"]
    wall[0] = 5.0 * d - 0.5
    core.handle(C.Tick(), clk())
    assert core.workers["m0"].alive
    wall[0] = 5.0 * d + 0.5
    core.handle(C.Tick(), clk())
    assert not core.workers["m0"].alive


def test_master_refuses_a_daemon_of_another_dilation():
    core = C.MasterCore(dilation=4.0)
    out = _register(core, 0.0)                      # a daemon at D = 1
    assert [(s.type, s.fields["code"]) for s in out] == [("error", "bad_dilation")]
    assert "--dilation 4" in out[0].fields["message"] and not core.workers
    assert [s.type for s in _register(core, 0.0, dilation=4.0)
            if isinstance(s, C.Send)][:1] == ["registered"]


def test_nmf_on_a_cluster_at_dilation_4(tmp_path, ratings):
    d = 4.0
    with LocalCluster(2, str(tmp_path / "c"), port=0, dashboard=False, dilation=d) as cl, \
            Client(cl.endpoint, timeout_s=10) as c:
        assert c.cluster()["master"]["dilation"] == d
        t0 = time.time()
        job = c.submit("nmf.py", NMF_APP.read_text(),
                       ["--input", ratings, "--max-epochs", "4", "--iters-per-epoch", "2"],
                       machines=2)
        st = wait_state(c, job, ("finished", "failed"), timeout=240)
        wall = time.time() - t0
    assert st["state"] == "finished", st.get("error")
    assert st["dilation"] == d and len(st["epochs"]) == 4
    # the master's clock: the JCT is the wall it took over D
    assert 0 < st["elapsed"] <= wall / d + 0.05
    # each COMP lasted D x its compute; the reports hold the compute (undilated)
    comp = sum(e["timings"]["comp"] for e in st["epochs"])
    assert comp > 0 and wall >= d * comp
    assert all(e["timings"]["comp"] >= 0.9 * e["timings"]["comp_cpu"] for e in st["epochs"])
    # the start-ups were stretched too: in undilated seconds each lasted its
    # wall at D = 1 (at least most of its CPU seconds), not a quarter of it
    assert len(st["setups"]) == 2
    assert all(wall_s >= 0.6 * cpu_s > 0 and flag == [1]
               for wall_s, cpu_s, *flag in st["setups"]), st["setups"]


def test_sim_import_takes_a_dilated_run_as_is_and_refuses_a_mix():
    from harmony.sim.importer import run_dilation
    assert run_dilation([{"id": "a"}, {"id": "b", "dilation": 1}]) == 1.0
    assert run_dilation([{"id": "a", "dilation": 4.0}, {"id": "b", "dilation": 4}]) == 4.0
    with pytest.raises(ValueError, match="different dilations"):
        run_dilation([{"id": "a", "dilation": 4.0}, {"id": "b"}])


def test_a_restarted_master_keeps_its_dilated_timeline(tmp_path):
    """The dilated clock's anchor is kept in the state dir: a master
    restarted on it goes on with the same timeline, so the times of jobs it
    persisted before (submitted, started) stay comparable with its clock."""
    from harmony.master.server import Master
    m = Master(str(tmp_path / "m"), port=0, dilation=4)
    anchor, t0 = m.clock.anchor, m.clock()
    m.close()
    time.sleep(0.2)
    m = Master(str(tmp_path / "m"), port=0, dilation=4)
    try:
        assert m.clock.anchor == anchor
        assert 0 <= m.clock() - t0 < 60
    finally:
        m.close()
    m = Master(str(tmp_path / "m"), port=0, dilation=2)      # another D: a new timeline
    try:
        assert m.clock.anchor != anchor
    finally:
        m.close()
