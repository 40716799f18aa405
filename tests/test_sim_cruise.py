"""Cruise in the simulator: the master core's own Cruise adapter, driven by
simulated executors whose work follows the blocks they hold, on machines of
different speeds (harmony.sim.engine ``cruise``/``block_work``,
``harmony sim run --cruise``)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from harmony.cruise.adapter import JobCruise
from harmony.sim.engine import SimJob, Simulator
from harmony.sim.trace import TraceJob, save_trace

BW = 20e6          # bytes/s: the links of bench/cruise.py's emulated machines
MODEL = 3.2e6      # bytes a worker pulls + pushes per iteration (the whole model)


def mlr(i: str = "mlr", epochs: int = 40, cpu: float = 0.3, byts: float = MODEL,
        arrival: float = 0.0) -> SimJob:
    """An MLR-like job on 3 machines: ``cpu`` COMP seconds per iteration at
    DoP 1, the model's ``byts`` over the link at DoP m ((m-1)/m remote)."""
    return SimJob(id=i, app="mlr", arrival=arrival, epochs=epochs, machines=3, iters=4,
                  profile=lambda m: (cpu / m, 0.002 + byts / BW * (m - 1) / m),
                  bytes=byts, link=BW, net_local=0.002, model_bytes=1.6e6, input_bytes=48e6)


def epoch_times(sim: Simulator, jid: str = "job-0001") -> list[float]:
    t = [e["time"] for e in sim.core.jobs[jid].epochs]
    return [b - a for a, b in zip(t, t[1:])]


def test_cruise_moves_the_work_off_a_slow_machine_as_it_predicted():
    """m2 computes at half speed behind a link 5x slower. Cruise (the master
    core's adapter, fed the simulated executors' timings) gives it no data:
    the epoch shrinks by more than half, to within 15% of Cruise's own
    prediction, and the job ends far sooner than without Cruise. The
    executors hold what the layout says."""
    slow = dict(cpu_speed=[1, 1, 0.5], net_speed=[1, 1, 0.2])
    plain = Simulator([mlr()], 3, mode="isolated", **slow)
    base = plain.run().jobs[0]["jct"]
    sim = Simulator([mlr()], 3, mode="isolated", cruise=True, **slow)
    out = sim.run()
    job = sim.core.jobs["job-0001"]
    lay = job.layout
    assert lay is not None and lay["input_blocks"]["m2"] == 0, lay
    assert sum(lay["input_blocks"].values()) == sim.input_blocks
    assert sum(lay["model_blocks"].values()) == sim.model_blocks
    cr = lay["cruise"]
    before, after = epoch_times(sim)[1], epoch_times(sim)[-1]
    assert after < 0.5 * before
    assert after == pytest.approx(cr["after"], rel=0.15)
    assert out.jobs[0]["jct"] < 0.6 * base
    assert epoch_times(plain)[-1] == pytest.approx(before, rel=0.02)


def test_the_executors_work_follows_their_blocks_after_a_role_switch():
    """A compute-bound job on 3 equal machines, 12 input blocks (4 each);
    ``harmony resize --workers 1``: m0 then holds all 12 and the other two
    serve the model only, so an epoch takes 3x as long; the blocks are where
    the plan sent them."""
    job = mlr(cpu=0.3, byts=1.0, epochs=30)
    sim = Simulator([job], 3, mode="isolated", block_work=True, input_blocks=12)
    sim._at(10.0, sim._deliver, b"client", "resize",
            {"job": "job-0001", "machines": 3, "workers": 1, "servers": 3})
    sim.run()
    lay = sim.core.jobs["job-0001"].layout
    assert lay["input_blocks"] == {"m0": 12, "m1": 0, "m2": 0}, lay
    ts = epoch_times(sim)
    assert ts[-1] == pytest.approx(3 * ts[2], rel=0.02)


def test_without_block_work_every_executor_does_its_even_share():
    """The default (the paper-scale figures): 16 blocks over 3 machines
    (6/5/5) do not slow the one holding 6; with block_work they do (6 / 16/3)."""
    even = Simulator([mlr(byts=1.0)], 3, mode="isolated")
    even.run()
    blocks = Simulator([mlr(byts=1.0)], 3, mode="isolated", block_work=True)
    blocks.run()
    assert epoch_times(blocks)[-1] == pytest.approx(1.125 * epoch_times(even)[-1], rel=0.02)


def test_bad_speed_lists_are_refused():
    with pytest.raises(ValueError, match="one per machine"):
        Simulator([mlr()], 3, cpu_speed=[1, 1])
    with pytest.raises(ValueError, match="positive"):
        Simulator([mlr()], 3, net_speed=[0.0])


def test_a_settled_job_is_not_solved_again_every_epoch():
    """The MILP runs once while the estimates stay within 2% on the same
    layout, and again when one moves further."""
    jc = JobCruise(3, 16)
    per = {i: {"comp": 0.4, "blocks": 6 if i == 0 else 5, "bytes": 1e6, "link": 2e7,
               "input_bytes": 3e6} for i in range(3)}
    for _ in range(6):
        jc.observe(per)
        jc.propose([6, 5, 5], [6, 5, 5], epochs_left=10)
    assert jc.ready() and jc.solves == 1
    # what it found, for harmony status, though it does not move
    v = jc.view
    assert v["decision"] == "keep" and v["best"] <= v["now"] and "why" in v
    per[2] = dict(per[2], comp=0.8)
    for _ in range(3):
        jc.observe(per)
        jc.propose([6, 5, 5], [6, 5, 5], epochs_left=10)
    assert jc.solves >= 2


def test_sim_run_cli_with_cruise_on_heterogeneous_machines(tmp_path):
    trace = tmp_path / "t.csv"
    save_trace([TraceJob(id=f"mlr-{i}", arrival=20.0 * i, app="mlr", iterations=120,
                         cpu_s=0.3, bytes=MODEL, ref_dop=1, machines=3, iters_per_epoch=4,
                         net_s=0.002, link=BW, input_bytes=48e6, model_bytes=1.6e6)
                for i in range(2)], trace)
    base = [sys.executable, "-m", "harmony.cli", "sim", "run", "--trace", str(trace),
            "--machines", "3", "--policy", "isolated", "--bandwidth", str(BW), "--quiet",
            "--cpu-speed", "1,1,0.5", "--net-speed", "1,1,0.2"]
    got = {}
    for extra in ([], ["--cruise"]):
        p = subprocess.run(base + extra, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        got[bool(extra)] = json.loads(p.stdout)
    assert got[True]["mean_jct"] < 0.7 * got[False]["mean_jct"]
    assert set(got[True]["layouts"]) == {"mlr-0", "mlr-1"}
    assert "layouts" not in got[False]
    p = subprocess.run(base[:-4] + ["--cpu-speed", "1,0"], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2 and "positive" in p.stderr


def test_a_worker_that_owns_the_whole_model_still_pays_its_local_transfers():
    """2 machines; the layout puts every input and model block on m0. Its
    transfers then cross no link but keep their local part (CPU work, the
    PS client's copies): per iteration COMP 0.1 s (all 16 blocks) plus PULL
    and PUSH 0.025 s each, 4 iterations per epoch."""
    job = SimJob(id="j", app="mlr", arrival=0.0, epochs=30, machines=2, iters=4,
                 profile=lambda m: (0.1 / m, 0.05), bytes=1.0, link=BW, net_local=0.05)
    sim = Simulator([job], 2, mode="isolated", block_work=True)

    def switch() -> None:
        j = sim.core.jobs["job-0001"]
        assert sim.core.resize_job(j, list(j.workers), "test",
                                   {"input": [1.0, 0.0], "model": [1.0, 0.0]})
    sim._at(10.0, switch)
    sim.run()
    lay = sim.core.jobs["job-0001"].layout
    assert lay["input_blocks"] == {"m0": 16, "m1": 0}, lay
    assert lay["model_blocks"] == {"m0": 16, "m1": 0}, lay
    train = sim.core.jobs["job-0001"].epochs[-1]["timings"]["train"]
    assert train == pytest.approx(4 * (0.1 + 0.05), rel=0.01)


@pytest.mark.parametrize("mode", ["isolated", "naive", "harmony"])
def test_cruise_runs_under_every_mode_and_shortens_the_jobs(mode):
    """Two jobs on the unequal machines, in each execution mode (harmony:
    the daemon core's queues and the master's synchronizer): every job ends,
    Cruise takes the input off the slow machine, and the mean JCT drops."""
    slow = dict(cpu_speed=[1, 1, 0.5], net_speed=[1, 1, 0.2])
    jct = {}
    for cruise in (False, True):
        sim = Simulator([mlr("a"), mlr("b", arrival=5.0)], 3, mode=mode, cruise=cruise, **slow)
        out = sim.run()
        assert all(j["state"] == "finished" for j in out.jobs)
        jct[cruise] = sum(j["jct"] for j in out.jobs) / len(out.jobs)
        if cruise:
            lays = [j.layout for j in sim.core.jobs.values()]
            assert any(lay and lay["input_blocks"].get("m2") == 0 for lay in lays), lays
    assert jct[True] < 0.8 * jct[False]


def test_the_move_limit_reaches_the_simulated_master():
    """--max-moves of harmony sim run is the master core's (a resize's
    moves at once), as harmony-master's."""
    assert Simulator([mlr()], 3).core.max_moves == 4
    assert Simulator([mlr()], 3, max_moves=0).core.max_moves == 0
    with pytest.raises(ValueError, match="max-moves"):
        Simulator([mlr()], 3, max_moves=-1)
