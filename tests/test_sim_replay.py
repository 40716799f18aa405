"""Replaying runtime runs in the simulator (bench/cluster_replay.py): where
jobs ran and beside whom from their status records alone
(harmony.sim.placement), what the importer measures of them (profiles from
the records' epochs, periodic checkpoints), and a simulated run replayed
by itself."""
from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

import pytest

from harmony.master.jobs import Job, JobState
from harmony.sim import importer
from harmony.sim.engine import Contention
from harmony.sim.placement import SPLIT, Stint, by_size, epoch_samples, \
    last_prediction_samples, machines_at, size_label, stints, time_split
from harmony.sim.run import simulate
from harmony.sim.trace import TraceJob, dumps_trace, parse_trace

ROOT = Path(__file__).resolve().parent.parent


def record(name: str, submitted: float, epochs: list[tuple[float, float]],
           events: list[tuple[float, JobState, str]], ended: float,
           machines: int = 2, iters: float = 2.0, predicted: float | None = None) -> dict:
    """A status record made by the master's own Job code: ``epochs`` are
    (end time, train seconds) with 0.1 s of evaluation each, ``events`` the
    transitions with their notes (as the core writes them)."""
    j = Job(name, "nmf.py", "", [], machines=machines, name=name, submitted=submitted,
            entered=submitted)
    for t, state, note in events:
        if state == j.state:        # (a live resize's events keep the state)
            j.events.append([t, state.value, note])
        else:
            j.transition(state, note, now=t)
    for e, (t, train) in enumerate(epochs):
        tm = {"comp": 0.6 * train, "pull": 0.2 * train, "push": 0.2 * train, "train": train,
              "iters": iters, "eval": 0.1, "bytes": 1e6, "link": 10e6, "sync": 0.0}
        j.epochs.append({"epoch": e, "metrics": {"objective": 1.0 / (e + 1)}, "timings": tm,
                         "time": t})
        j.update_profile(tm, machines)
    j.predicted = predicted
    j.transition(JobState.FINISHED, "done", now=ended)
    return j.detail(now=ended)


R, P, F = JobState.RUNNING, JobState.PROFILING, JobState.FINISHED


def test_stints_follow_launches_pauses_and_resizes():
    rec = record("a", 0.0, [], [
        (1.0, P, "attempt 1 on m0, m1"),
        (4.0, JobState.PROFILED, "profiled; waits for a group; checkpointed after epoch 3 on m0, m1"),
        (6.0, R, "attempt 1 on m2, m3 (resumes at epoch 4) (launch 2)"),
        (7.0, R, "regrouped: moves to m2, m3, m4: resizing m2, m3 -> m2, m3, m4"),
        (8.0, R, "regrouped: moves to m2, m3, m4: now on m2, m3, m4 (3 block(s), 1.0 MiB "
                 "moved; took 1.00s, iterations stood 0.10s)")], ended=10.0)
    st = stints(rec)
    assert st == [Stint(1.0, 4.0, frozenset({"m0", "m1"})), Stint(6.0, 8.0, frozenset({"m2", "m3"})),
                  Stint(8.0, 10.0, frozenset({"m2", "m3", "m4"}))]
    assert machines_at(st, 5.0) == frozenset()
    assert machines_at(st, 7.5) == {"m2", "m3"} and machines_at(st, 9.0) == {"m2", "m3", "m4"}
    # "profiled; stays in G on ..." keeps the job where it is
    rec = record("b", 0.0, [], [(0.5, P, "attempt 1 on m0"),
                                (2.0, R, "profiled; stays in g:b on m0")], ended=3.0)
    assert stints(rec) == [Stint(0.5, 3.0, frozenset({"m0"}))]


def test_group_sizes_count_the_jobs_on_an_epochs_machines_while_it_trained():
    """a trains on m0, m1 from 1 to 13, in epochs of 1.9 s ending at 2.9,
    4.9, ...; b joins m1 at 5 (with m5), c m0 from 8.9 to 10.5 (not in a's
    epoch [7, 8.9], 1.5 s of [9, 10.9]), e m1 from 11.5 to 12.2 (0.7 s of
    [11, 12.9]: less than half); d sits on other machines all along."""
    a = record("a", 0.0, [(3.0 + 2 * k, 1.9) for k in range(6)],
               [(1.0, R, "attempt 1 on m0, m1")], ended=13.0, predicted=0.5)
    b = record("b", 0.0, [(7.0, 1.0)], [(5.0, R, "attempt 1 on m1, m5")], ended=13.0)
    c = record("c", 0.0, [(10.0, 0.5)], [(8.9, R, "attempt 1 on m0")], ended=10.5,
               machines=1)
    d = record("d", 0.0, [(4.0, 1.0)], [(0.0, R, "attempt 1 on m6, m7")], ended=13.0)
    e = record("e", 0.0, [(12.1, 0.4)], [(11.5, R, "attempt 1 on m1")], ended=12.2,
               machines=1)
    got = {(x.job, x.epoch): x.size for x in epoch_samples([a, b, c, d, e])}
    assert [got[("a", k)] for k in range(6)] == [1, 1, 2, 2, 3, 2]
    assert (got[("b", 0)], got[("c", 0)], got[("d", 0)], got[("e", 0)]) == (2, 2, 1, 3)
    x = next(x for x in epoch_samples([a]) if x.epoch == 2)
    assert (x.start, x.end) == pytest.approx((5.0, 6.9)) and x.iter_s == pytest.approx(0.95)
    assert [size_label(n) for n in (1, 2, 3, 4, 9)] == ["1", "2", "3", "4+", "4+"]
    assert by_size([(5, 0.1), (1, 0.2), (4, 0.3), (2, 0.4)]) == {
        "1": [0.2], "2": [0.4], "4+": [0.1, 0.3]}
    # the stand-in for per-epoch predictions: a's epochs since its company
    # last changed (b alone beside it in its last epoch, b and c before),
    # against predicted_iter; the others have none
    got = last_prediction_samples([a, b, c, d, e])
    assert got == [(2, pytest.approx(abs(0.5 - 0.95) / 0.95))]


def test_time_split_adds_up_to_the_jct():
    rec = record("a", 0.0, [(3.0, 1.0), (4.5, 1.2), (12.0, 1.0), (13.2, 1.0)], [
        (0.5, P, "attempt 1 on m0, m1"),
        (5.0, JobState.PROFILED, "profiled; waits for a group"),
        (9.0, R, "attempt 1 on m0, m1 (resumes at epoch 2) (launch 2)")], ended=13.5)
    sp = time_split(rec)
    assert list(sp) == list(SPLIT)
    assert sum(sp.values()) == pytest.approx(13.5)
    assert sp["wait"] == 0.5 and sp["off"] == 4.0
    assert sp["start-up"] == pytest.approx((3.0 - 0.5 - 1.1) + (12.0 - 9.0 - 1.1))
    assert sp["train"] == pytest.approx(4.2) and sp["eval"] == pytest.approx(0.4)
    assert sp["boundary"] == pytest.approx((4.5 - 3.0 - 1.3) + (13.2 - 12.0 - 1.1))
    assert sp["end"] == pytest.approx((5.0 - 4.5) + (13.5 - 13.2))


def test_importer_takes_medians_and_the_periodic_checkpoint_from_the_records():
    """Epochs of 1 s training, 0.1 s evaluation, 0.05 s between them; the
    periodic checkpoints after epochs 9 and 19 hold the job 0.5 s more:
    0.5 s x 10 MB/s x 2 machines = 10 MB in all."""
    ts, t = [], 1.0
    trains = [3.0] + [1.0] * 20
    for e, tr in enumerate(trains):
        t += tr + 0.1 + (0.05 if e else 0.0) + (0.5 if e in (10, 20) else 0.0)
        ts.append((t, tr))
    rec = record("a", 0.0, ts, [(1.0, R, "attempt 1 on m0, m1")], ended=t + 0.1)
    assert importer.checkpoint_hold(rec) == pytest.approx(0.5)
    (j,), _ = importer.jobs_from_status([rec])
    # medians over the epochs but the first (3 s), per iteration (2 each)
    assert j.cpu_s == pytest.approx(0.3) and j.net_s == pytest.approx(0.2)
    assert j.ckpt_bytes == pytest.approx(0.5 * 10e6 * 2)
    assert parse_trace(dumps_trace([j])) == [j]
    # no machines in the events (an older record): the master's averages stay
    bare = record("b", 0.0, ts, [(1.0, R, "")], ended=t + 0.1)
    (jb,), _ = importer.jobs_from_status([bare])
    assert jb.cpu_s == pytest.approx(bare["profile"]["t_cpu"]) and jb.ckpt_bytes is None
    # a master that records what its periodic checkpoints wrote (written
    # behind the job, they hold nothing to measure): that, not the hold
    rec["checkpoint"] = {"final": True, "bytes": 4e6, "periodic_bytes": 7e6}
    (j,), _ = importer.jobs_from_status([rec])
    assert j.ckpt_bytes == 7e6 and j.final_bytes == 4e6
    # none completed (each dropped by the final one): not the hold's ~0
    rec["checkpoint"]["periodic_bytes"] = None
    (j,), _ = importer.jobs_from_status([rec])
    assert j.ckpt_bytes is None


def _bench(name: str):
    sys.path.insert(0, str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod         # (its dataclasses look their module up)
    spec.loader.exec_module(mod)
    return mod


def test_a_simulated_isolated_run_replays_itself():
    """The simulator's own isolated run, as status records, calibrates a
    replay of itself: the same JCTs within 5%. And the bench's modes map to
    the simulator's setups as bench/cluster_e2e.py maps them to masters'."""
    trace = [TraceJob(id=f"j{i}", arrival=0.5 * i, app="nmf", iterations=24, cpu_s=0.3 + 0.1 * i,
                      bytes=1e6, ref_dop=2, machines=2, iters_per_epoch=2, net_s=0.1,
                      link=10e6, eval_s=0.05, model_bytes=1e6) for i in range(4)]
    run = simulate(trace, 4, "isolated", contention=Contention(startup=1.0), bandwidth=10e6,
                   grain=10 ** 6, cpus=1, statuses=True)
    sts = run.meta["statuses"]
    assert sorted(s["name"] for s in sts) == [f"j{i}" for i in range(4)]
    sf = _bench("sim_fidelity")
    rep = sf.replay(sts, sf.calibrate(sts), 4, "isolated")
    assert rep.sim_makespan == pytest.approx(rep.run_makespan, rel=0.05)
    assert rep.err_max < 0.05
    cr = _bench("cluster_replay")
    assert [cr.sim_setup(m) for m in ("isolated", "isolated-best", "isolated-1", "naive-2",
                                      "match", "harmony")] == [
        ("isolated", 0), ("isolated", 0), ("isolated", 0), ("naive", 2), ("match@harmony", 0),
        ("harmony@harmony", 0)]


def test_evaluation_is_imported_as_its_cpu_on_one_machine():
    """A trace's eval_s is the objective's CPU on one machine; the simulator
    adds the pull of the model. The runtime's evaluation wall time holds
    that pull: Lasso's took 0.092 s on 2 machines and 0.001 s on 1, so
    its eval_cpu x machines is imported, the wall time only where no epoch
    records eval_cpu."""
    def rec(timings, on="m0, m1"):
        eps = [{"epoch": e, "time": 5.0 + e, "timings": {"iters": 1.0, **timings}}
               for e in range(3)]
        return {"name": "a", "events": [[4.0, R, f"attempt 1 on {on}"]], "epochs": eps,
                "ended": 9.0}
    assert importer.eval_per_epoch(rec({"eval": 0.092, "eval_cpu": 0.009})) == \
        [pytest.approx(0.018)] * 3
    assert importer.eval_per_epoch(rec({"eval": 0.092, "eval_cpu": 0.009}, "m3")) == \
        [pytest.approx(0.009)] * 3
    assert importer.eval_per_epoch(rec({"eval": 0.092})) == [0.092] * 3


def test_the_simulated_evaluation_takes_the_measured_cpu_per_machine():
    """With ``eval_at``, each machine's evaluation CPU per epoch is the
    measurement at the nearest DoP, not eval_s split over the machines."""
    def run(**kw):
        trace = [TraceJob(id="j", arrival=0.0, app="mlr", iterations=6, cpu_s=0.1, bytes=1e5,
                          ref_dop=2, machines=1, net_s=0.01, link=10e6, eval_s=0.2, **kw)]
        sts = simulate(trace, 1, "isolated", bandwidth=10e6, grain=10 ** 6, cpus=1,
                       statuses=True).meta["statuses"]
        return sorted({round(e["timings"]["eval_cpu"], 9) for e in sts[0]["epochs"]})
    assert run() == [0.2]                                    # eval_s / 1
    assert run(eval_at=((1, 0.05), (2, 0.04))) == [0.05]
    assert run(eval_at=((2, 0.04), (4, 0.01))) == [0.04]     # the nearest: 2


def test_a_dilated_runs_stretched_startups_are_replayed_as_waits():
    """At D > 1 an executor sleeps until its start-up has lasted D x its
    CPU seconds; the CPU ran on the host's idle cores, not its emulated
    machine's. So a replay of such a run charges a start-up as a wait: no
    CPU work beside the COMPs (a start-up at nice 19 on a real machine
    would take what they leave: the D = 1 runs keep that)."""
    trace = [TraceJob(id=f"j{i}", arrival=0.5 * i, app="nmf", iterations=12, cpu_s=0.3,
                      bytes=1e6, ref_dop=1, machines=1, iters_per_epoch=2, net_s=0.01,
                      link=10e6, eval_s=0.05) for i in range(2)]
    sts = simulate(trace, 2, "isolated", contention=Contention(startup=1.0), bandwidth=10e6,
                   grain=10 ** 6, cpus=1, statuses=True).meta["statuses"]
    sf = _bench("sim_fidelity")

    def marked(d, entries):
        return [{**s, "dilation": d, "setups": entries} for s in sts]
    assert not importer.stretched_startups(marked(8.0, [[3.0, 0.8]]))
    assert not importer.stretched_startups(marked(1.0, [[3.0, 0.8, 1]]))
    assert not importer.stretched_startups(marked(8.0, []))
    assert importer.stretched_startups(marked(8.0, [[3.0, 0.8, 1]]))
    cal = sf.calibrate(marked(8.0, [[3.0, 0.8, 1]]))
    assert cal.contention.startup_cpu == 0.0
    assert all(t.startup_cpu_s == 0.0 for t in cal.by_name.values())
    cal = sf.calibrate(marked(1.0, [[3.0, 0.8]]))
    assert cal.contention.startup_cpu == pytest.approx(0.8)


def test_each_job_starts_up_at_its_own_measured_cost():
    """A job's start-up (launch to ready, and its CPU part) is imported from
    its record and simulated per job: a Lasso job parsing its input took 6 s
    of CPU where an NMF job took 2 (session 17's real-core run), and a single
    machine-wide median made the simulator's co-located jobs too fast. A
    join still costs the machines' figure: it takes its blocks as they are."""
    rec = record("a", 0.0, [(5.0, 1.0), (6.2, 1.0), (7.4, 1.0)],
                 [(0.5, R, "attempt 1 on m0, m1")], ended=7.5)
    rec["setups"] = [[3.0, 2.0], [3.4, 2.6]]
    rec["dilation"] = 2.0
    wall, cpu = importer.job_startup(rec)
    assert wall == pytest.approx(5.0 - 0.5 - 1.0 - 0.1)
    assert cpu == pytest.approx(2.3 / 2.0)          # the median, undilated
    (j,), _ = importer.jobs_from_status([rec])
    assert (j.startup_s, j.startup_cpu_s) == (pytest.approx(wall), pytest.approx(cpu))
    assert parse_trace(dumps_trace([j])) == [j]
    assert importer.job_startup({"epochs": []}) == (None, None)

    def first_epoch_start(startup_s, startup_cpu_s, beside=False):
        trace = [TraceJob(id="x", arrival=0.0, app="nmf", iterations=4, cpu_s=0.5, bytes=0.0,
                          ref_dop=1, machines=1, startup_s=startup_s,
                          startup_cpu_s=startup_cpu_s)]
        if beside:   # a long COMP-bound job already on the one machine
            trace.insert(0, TraceJob(id="w", arrival=0.0, app="nmf", iterations=40,
                                     cpu_s=1.0, bytes=0.0, ref_dop=1, machines=1))
            trace[1] = dataclasses.replace(trace[1], arrival=5.0)
        res = simulate(trace, 1, "naive", contention=Contention(startup=1.0, startup_cpu=0.5,
                                                                startup_weight=1.0),
                       grain=10 ** 6, cpus=1, statuses=True)
        return {s["name"]: s for s in res.meta["statuses"]}
    own = first_epoch_start(4.0, 3.0)["x"]
    common = first_epoch_start(None, None)["x"]
    assert own["epochs"][0]["time"] - common["epochs"][0]["time"] == pytest.approx(3.0, abs=0.01)
    # its CPU part competes with the COMPs beside it: 3 s of it at an equal
    # share take ~6 s there, and slow the other job's COMPs as much
    busy = first_epoch_start(4.0, 3.0, beside=True)
    busy_common = first_epoch_start(None, None, beside=True)
    assert busy["w"]["ended"] - busy_common["w"]["ended"] >= 2.0


def test_a_measured_comm_cpu_slows_the_partner_and_reaches_the_scheduler():
    """Issue #34 item 2 in the simulator: a job whose trace measured its
    COMM's CPU (comm_cpu_s, imported from the executors' train_cpu less
    comp_cpu) runs that much of each COMM as CPU work on its machine, beside
    the partner's COMP, and reports it as the runtime's executors do, so the
    master's profile (and Eq 4.1) counts it. Alone its iteration time is its
    COMM either way."""
    def run(comm_cpu_s):
        trace = [TraceJob(id="c", arrival=0.0, app="nmf", iterations=40, cpu_s=1.0, bytes=0.0,
                          ref_dop=2, machines=2, iters_per_epoch=4),
                 TraceJob(id="n", arrival=0.0, app="nmf", iterations=40, cpu_s=0.05,
                          bytes=5e6, ref_dop=2, machines=2, iters_per_epoch=4, net_s=0.5,
                          link=10e6, comm_cpu_s=comm_cpu_s)]
        res = simulate(trace, 2, "naive", contention=Contention(startup=0.0), bandwidth=10e6,
                       grain=10 ** 6, cpus=1, statuses=True)
        return {s["name"]: s for s in res.meta["statuses"]}
    light, heavy = run(0.0), run(0.4)
    jct = lambda s: s["ended"] - s["started"]           # noqa: E731
    assert jct(heavy["c"]) > 1.1 * jct(light["c"])     # its COMPs shared the core
    assert heavy["n"]["profile"]["comm_cpu"] == pytest.approx(0.4, rel=0.05)
    assert light["n"]["profile"]["comm_cpu"] == pytest.approx(0.0, abs=1e-9)
    (imp,), _ = importer.jobs_from_status([heavy["n"]])
    assert imp.comm_cpu_s == pytest.approx(0.4, rel=0.05)
    assert parse_trace(dumps_trace([imp])) == [imp]
