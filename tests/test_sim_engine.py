"""The simulator drives the master's own core and the daemon's own queue
core in simulated time (harmony.sim.engine, harmony.sim.run, harmony sim)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from harmony.master.core import MasterCore
from harmony.sim.engine import Contention, SimJob, Simulator
from harmony.sim.run import setup, sim_jobs, simulate
from harmony.sim.trace import TraceJob, save_trace
from harmony.worker.daemon_core import DaemonCore


def job(i: str, arrival: float, cpu: float, net: float, epochs: int = 2, iters: int = 1,
        machines: int = 1) -> SimJob:
    return SimJob(id=i, app="nmf", arrival=arrival, epochs=epochs, machines=machines,
                  iters=iters, profile=lambda m, c=cpu, n=net: (c / m, n))


def test_isolated_runs_jobs_one_after_another_to_the_simulated_second():
    """Start-up 1 s, then per iteration PULL 0.25 + COMP 1.0 + PUSH 0.25:
    two epochs of one iteration end 4 s after the launch; the second job
    waits for the machine."""
    sim = Simulator([job("a", 0.0, 1.0, 0.5), job("b", 0.5, 1.0, 0.5)], 1, mode="isolated")
    out = sim.run()
    got = {j["id"]: (j["start"], j["end"], j["state"]) for j in out.jobs}
    assert got == {"a": (0.0, 4.0, "finished"), "b": (4.0, 8.0, "finished")}
    assert out.makespan == 8.0
    cpu, net = out.utilization()
    assert cpu == pytest.approx(4.0 / 8.0) and net == pytest.approx(2.0 / 8.0)


def test_checkpoints_hold_the_executor_as_the_runtime_does():
    """The periodic checkpoint (every 10 epochs) writes the input and the
    model, and copies them to the replica, behind the job: the next epoch
    starts at once, a pause or a resize waits for it, and the final
    checkpoint drops it. The final
    one writes ``final_bytes`` at the boundary. 21 epochs of 1 s: the
    periodic parts of 4 MB at 2 MB/s (disk 1e12) take 2 s each and cost
    nothing (the one after epoch 20 is dropped 1 s before it is done), the
    final 1 MB takes 0.5 s."""
    c = Contention(startup=0.0, bandwidth=2e6, disk=1e12)

    def jct(epochs: int = 21, **kw) -> float:
        j = SimJob(id="a", app="nmf", arrival=0.0, epochs=epochs, machines=1, iters=1,
                   profile=lambda m: (1.0, 0.0), **kw)
        (r,) = Simulator([j], 1, mode="isolated", contention=c).run().jobs
        return r["end"] - r["start"]

    bare = jct()
    assert bare == pytest.approx(21.0, abs=1e-3)
    assert jct(input_bytes=3e6, model_bytes=1e6) == pytest.approx(bare, abs=1e-3)
    assert jct(final_bytes=1e6) == pytest.approx(bare + 0.5, abs=1e-3)
    assert jct(final_bytes=1e6, input_bytes=3e6, model_bytes=1e6) == \
        pytest.approx(bare + 0.5, abs=1e-3)


def test_a_start_up_shares_the_cpu_with_what_runs_on_its_machine():
    """``startup_cpu`` of a start-up is CPU work outside the queues. At the
    COMP's priority (``startup_weight`` 1), b's start-up beside a's 10 s
    COMP on one core takes 2 s instead of 1, and a's COMP 1 s longer (b's
    own COMP then waits for a's in the queue). At nice 19, as the runtime
    starts executors (the default weight, 15/1024), it takes what a's COMP
    leaves: a is delayed by 9 x 15/1024 s only, and b is ready when a's COMP
    ends, so b ends as before."""
    def one(i: str, arrival: float, cpu: float) -> SimJob:
        return SimJob(id=i, app="nmf", arrival=arrival, epochs=1, machines=1, iters=1,
                      profile=lambda m, c=cpu: (c, 0.0))

    def ends(startup_cpu: float, **kw) -> dict:
        c = Contention(startup=1.0, startup_cpu=startup_cpu, **kw)
        out = Simulator([one("a", 0.0, 10.0), one("b", 2.0, 1.0)], 1, mode="harmony",
                        policy="colocate", contention=c, cpus=1).run()
        return {j["id"]: j["end"] for j in out.jobs}
    assert ends(0.0) == {"a": pytest.approx(11.0), "b": pytest.approx(12.0)}
    assert ends(1.0, startup_weight=1.0) == {"a": pytest.approx(12.0), "b": pytest.approx(13.0)}
    assert ends(1.0) == {"a": pytest.approx(11.0 + 9 * 15 / 1024), "b": pytest.approx(13.0)}


def test_the_engine_runs_the_real_cores():
    sim = Simulator([job("a", 0.0, 1.0, 0.5)], 2, mode="harmony")
    assert type(sim.core) is MasterCore
    assert all(type(m.q) is DaemonCore for m in sim.machines.values())
    sim.run()
    (j,) = sim.core.jobs.values()
    assert j.state.value == "finished" and len(j.epochs) == 2
    assert j.profile["t_cpu"] > 0 and j.profile["samples"] >= 1     # what executors reported


def test_harmony_overlaps_complementary_jobs_that_isolated_runs_in_turn():
    """A CPU-heavy and a network-heavy job on one machine: the queues run
    one's COMP during the other's COMM, so both finish sooner than one
    after the other; naive sharing without the queues pays the contention
    model's interference."""
    jobs = [job("cpu", 0.0, 1.0, 0.2, epochs=8, iters=2),
            job("net", 0.0, 0.2, 1.0, epochs=8, iters=2)]
    res = {m: Simulator(jobs, 1, mode=m).run() for m in ("isolated", "naive", "harmony")}
    assert all(j["state"] == "finished" for r in res.values() for j in r.jobs)
    assert res["harmony"].makespan < 0.8 * res["isolated"].makespan
    assert res["naive"].makespan > res["harmony"].makespan
    cpu_h, _ = res["harmony"].utilization()
    cpu_i, _ = res["isolated"].utilization()
    assert cpu_h > cpu_i


def test_a_pause_and_a_live_resize_complete_in_simulation():
    """Jobs that arrive while others run make the Harmony policy regroup:
    moves (live resizes) and pauses go through the core's protocol and
    every job still finishes with all its epochs. (Jobs that ask for one
    machine each: the first ones are widened onto idle machines and give
    them back when the next arrive.)"""
    jobs = [job(f"j{i}", 3.0 * i, 1.0 if i % 2 else 0.2, 0.2 if i % 2 else 1.0,
                epochs=12, iters=2, machines=1) for i in range(6)]
    sim = Simulator(jobs, 4, mode="harmony", validate=True)   # invariants after every instant
    out = sim.run()
    assert all(j["state"] == "finished" and j["epochs"] == 12 for j in out.jobs)
    events = [e[2] for j in sim.core.jobs.values() for e in j.events]
    assert sum("moves to" in e for e in events) >= 2
    assert out.decisions


def test_trace_jobs_keep_their_iterations_whatever_the_grain():
    tj = TraceJob(id="t", arrival=0.0, app="nmf", iterations=1000, cpu_s=1.0, bytes=1e6,
                  ref_dop=1, machines=1, iters_per_epoch=5)
    for grain in (10, 60, 1000):
        (sj,) = sim_jobs([tj], 1e8, grain=grain)
        assert sum(n * k for n, k in sj.plan) == 1000
        assert sj.plan[:4] == [(1, 5)] * 4                 # the profiling epochs
        assert len(sj.plan) <= 4 + grain


def test_setups_name_policies_and_modes():
    assert setup("isolated") == ("isolated", "isolated")
    assert setup("harmony") == ("harmony", "harmony")
    assert setup("colocate") == ("colocate", "naive")
    assert setup("colocate@harmony") == ("colocate", "harmony")
    with pytest.raises(ValueError, match="unknown policy"):
        setup("nope")


def test_simulate_reports_every_job(tmp_path):
    trace = [TraceJob(id=f"t{i}", arrival=5.0 * i, app="lda", iterations=20, cpu_s=0.5,
                      bytes=2e6, ref_dop=1, machines=1) for i in range(4)]
    r = simulate(trace, 2, "harmony", bandwidth=1e7)
    assert sorted(j.id for j in r.jobs) == ["t0", "t1", "t2", "t3"]
    assert not r.meta["unfinished"] and r.meta["events"] > 0
    assert all(j.end > j.start >= j.arrival for j in r.jobs)


def test_the_cli_runs_compares_and_refuses_a_bad_trace(tmp_path):
    trace = tmp_path / "t.csv"
    save_trace([TraceJob(id=f"t{i}", arrival=3.0 * i, app="nmf", iterations=12,
                         cpu_s=0.3 if i % 2 else 0.05, bytes=3e6 if i % 2 else 2e7,
                         ref_dop=1, machines=1, iters_per_epoch=2) for i in range(4)], trace)
    cmd = [sys.executable, "-m", "harmony.cli", "sim"]
    p = subprocess.run(cmd + ["run", "--trace", str(trace), "--machines", "2", "--policy",
                              "harmony", "--bandwidth", "1.2e7", "--out", str(tmp_path / "r")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)
    assert s["jobs"] == 4 and s["unfinished"] == 0 and s["makespan"] > 0
    assert (tmp_path / "r" / "harmony.json").stat().st_size > 0
    p = subprocess.run(cmd + ["compare", "--trace", str(trace), "--machines", "2",
                              "--bandwidth", "1.2e7", "--out", str(tmp_path / "c")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "isolated" in p.stdout and "harmony" in p.stdout and "x isolated" in p.stdout
    for png in ("jct_cdf.png", "utilization.png"):
        assert (tmp_path / "c" / png).read_bytes()[:4] == b"\x89PNG"
    bad = tmp_path / "bad.csv"
    bad.write_text("id,arrival,app,iterations,cpu_s,bytes,ref_dop,machines\n"
                   "x,0,nmf,10,-1,5,1,1\n")
    p = subprocess.run(cmd + ["run", "--trace", str(bad), "--machines", "2"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "bad.csv:2" in p.stderr and "cpu_s" in p.stderr
    # a generated workload's arrivals: all at 0 with --mean-gap 0
    p = subprocess.run(cmd + ["run", "--workload", "e2e", "--jobs", "2", "--mean-gap", "0",
                              "--machines", "2", "--policy", "isolated", "--quiet",
                              "--out", str(tmp_path / "g")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    got = json.loads((tmp_path / "g" / "isolated.json").read_text())
    assert [j["arrival"] for j in got["jobs"]] == [0.0, 0.0]


@pytest.mark.slow
def test_paper_scale_run_finishes_every_job():
    from harmony.sim.workload import PAPER_BANDWIDTH, generate
    r = simulate(generate("paper"), 100, "harmony", bandwidth=PAPER_BANDWIDTH)
    assert len(r.jobs) == 80 and not r.meta["unfinished"]


def test_a_wall_limit_stops_the_run_and_reports_what_is_unfinished():
    from harmony.sim.workload import PAPER_BANDWIDTH, generate
    r = simulate(generate("paper", 20, 1), 20, "isolated", bandwidth=PAPER_BANDWIDTH,
                 wall_limit=0.0)
    assert r.meta["unfinished"] and r.meta["events"] >= 5000
    assert r.meta["sim_time"] > 0


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["isolated", "naive", "harmony", "match", "slaq"])
def test_arrivals_past_2_to_the_24_seconds_finish_as_at_zero(mode):
    """Past 2**24 s (about 4,660 h) 1e-9 s of work left is below the clock's
    resolution: a task was never counted done and the same event fired at
    the same instant forever (traces that span months hung every policy)."""
    def trace(base):
        return [TraceJob(id=f"t{i}", arrival=base + 5.0 * i, app="lda", iterations=20,
                         cpu_s=0.37, bytes=1.3e6, ref_dop=1, machines=1) for i in range(4)]
    far = simulate(trace(float(2 ** 25)), 2, mode, bandwidth=1e7)
    near = simulate(trace(0.0), 2, mode, bandwidth=1e7)
    assert not far.meta["unfinished"]
    assert [round(j.jct, 3) for j in far.jobs] == pytest.approx(
        [round(j.jct, 3) for j in near.jobs], abs=2e-3)


def test_the_synchronizers_delay_slows_queued_jobs_by_about_its_rounds():
    """#32 item 5: sync_s per round, k rounds behind each simulated subtask;
    0 changes nothing (the golden runs keep their results)."""
    from harmony.sim.run import simulate
    from harmony.sim.report import summarize
    from harmony.sim.workload import PAPER_BANDWIDTH, generate
    trace = generate("paper", 6, 2, mean_gap=60.0)
    runs = {s: summarize(simulate(trace, 16, "harmony", bandwidth=PAPER_BANDWIDTH, sync_s=s))
            for s in (0.0, 0.5)}
    base, slow = runs[0.0], runs[0.5]
    # +4.9% since periodic checkpoints run behind the job (+5.7% before;
    # the policy's decisions moved with the boundaries' timing)
    assert slow["mean_jct"] > 1.03 * base["mean_jct"]
    # isolated jobs' barriers go through the master too (free mode)
    iso = [summarize(simulate(trace, 16, "isolated", bandwidth=PAPER_BANDWIDTH, sync_s=s))
           for s in (0.0, 0.5)]
    assert iso[1]["mean_jct"] > 1.05 * iso[0]["mean_jct"]
    with pytest.raises(ValueError):
        simulate(trace, 16, "harmony", sync_s=-1.0)


def test_a_narrowing_moves_the_input_over_the_receivers_link():
    """A job on 4 machines narrowed to 1 (Lasso-like: its COMM grows with
    the DoP) receives three machines' input over one link: the move lasts
    at least those bytes over the link (before, the receiver counted only
    model blocks, and the move took one sender's share: 0.95 s here)."""
    import re
    tj = TraceJob(id="lasso", arrival=0.0, app="lasso", iterations=60, cpu_s=0.02, bytes=3e6,
                  ref_dop=2, machines=4, iters_per_epoch=1, input_bytes=5.12e7)
    r = simulate([tj], 4, "harmony", bandwidth=1.6e7, statuses=True,
                 contention=Contention(bandwidth=1.6e7))
    (st,) = r.meta["statuses"]
    moved = [e[2] for e in st["events"] if "now on m0" in e[2]]
    assert moved, st["events"]
    mib, took = map(float, re.search(r"([\d.]+) MiB moved; took ([\d.]+)s", moved[0]).groups())
    assert mib * 2**20 >= 0.7 * 5.12e7                 # three of the four machines' input
    assert took >= mib * 2**20 / 1.6e7
