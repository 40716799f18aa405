"""harmony.sim around the engine: traces, workloads, the importer, reports,
the contention model. Pure and fast (no cluster)."""
from __future__ import annotations

import importlib.util
import io
import math
import statistics
from pathlib import Path

import pytest

from harmony.master.jobs import Job, JobState
from harmony.sched.model import t_cpu_at, t_net_at
from harmony.sim import contention, importer, report, workload
from harmony.policies.curves import LossCurve, Utility, fit_curve
from harmony.sim.trace import (COLUMNS, TraceError, TraceJob, iteration_profile, load_trace,
                               parse_trace, save_trace, sched_profile)

ROOT = Path(__file__).resolve().parent.parent

HEADER = "id,arrival,app,iterations,cpu_s,bytes,ref_dop,machines"


def job(**kw) -> TraceJob:
    base = dict(id="j1", arrival=0.0, app="nmf", iterations=10, cpu_s=1.0, bytes=1e6,
                ref_dop=2, machines=2)
    return TraceJob(**{**base, **kw})


# ---------------------------------------------------------------- trace CSV

def test_round_trip_all_columns(tmp_path):
    jobs = [job(id="a", dataset="netflix", iters_per_epoch=5, arrival=1.25,
                curve=LossCurve("sublinear", (0.1, 0.2, 1.0, 0.3)), target=0.35,
                net_s=0.4, link=12e6, eval_s=0.05, input_bytes=1e9, model_bytes=2.5e8,
                deadline=3600.0, utility=Utility("sigmoid", (10.0, 0.01, 1800.0))),
            job(id="b", app="lasso", curve=LossCurve("points", (0, 1.0, 10, 0.5, 20, 0.25))),
            job(id="c", app="lda", utility=Utility("const", (2.0,)),
                curve=LossCurve("linear", (0.9, -1.0, 0.1)), cpu_s=1 / 3,
                cpu_at=((1, 1.25), (4, 0.3)), net_at=((1, 0.005), (4, 0.35)),
                eval_at=((1, 0.054), (2, 0.044)))]
    path = tmp_path / "t.csv"
    save_trace(jobs, path)
    assert load_trace(path) == jobs
    assert path.read_text().splitlines()[1] == ",".join(COLUMNS)


def test_iterations_from_curve_and_target():
    text = ("id,arrival,app,curve,target,cpu_s,bytes,ref_dop,machines\n"
            'x,0,mlr,"sublinear:0,1,1,0",0.1,1,0,1,1\n')
    (j,) = parse_trace(text)
    # 1/(k+1) <= 0.1 first at k = 9
    assert j.iterations == 9
    assert j.curve.loss(9) == pytest.approx(0.1)


@pytest.mark.parametrize("text,where,col,what", [
    ("id,arrival,app,iterations,cpu_s,bytes,ref_dop\nx,0,nmf,1,1,1,1\n", ":1:", "machines",
     "missing column"),
    (f"{HEADER}\nx,0,nmf,10,abc,1,1,1\n", ":2:", "cpu_s", "not a number"),
    (f"{HEADER}\nx,0,nmf,10,1,-5,1,1\n", ":2:", "bytes", "negative"),
    (f"{HEADER}\nx,0,svm,10,1,1,1,1\n", ":2:", "app", "unknown app 'svm'"),
    (f"{HEADER}\nx,0,nmf,2.5,1,1,1,1\n", ":2:", "iterations", "not a whole number"),
    (f"{HEADER}\nx,0,nmf,10,1,1,1,\n", ":2:", "machines", "empty (required)"),
    (f"# c\n{HEADER}\nx,0,nmf,10,1,1,1,1\nx,1,nmf,10,1,1,1,1\n", ":4:", "id", "duplicate id"),
    (f"{HEADER},curve\nx,0,nmf,10,1,1,1,1,cubic:1\n", ":2:", "curve", "unknown curve kind"),
    (f"{HEADER}\nx,0,nmf,,1,1,1,1\n", ":2:", "iterations", "no curve and target"),
    ("id,arrival,app,curve,target,cpu_s,bytes,ref_dop,machines\n"
     'x,0,nmf,"linear:0.5,0,0.2",0.1,1,0,1,1\n', ":2:", "target", "never reaches"),
    (f"{HEADER},cpu_at\nx,0,mlr,10,1,1,2,2,1:abc\n", ":2:", "cpu_at", "could not convert"),
    (f"{HEADER},cpu_at\nx,0,mlr,10,1,1,2,2,0:1\n", ":2:", "cpu_at", "whole number >= 1"),
    (f"{HEADER},cpu_at\nx,0,mlr,10,1,1,2,2,\"1:1,1:2\"\n", ":2:", "cpu_at", "appears twice"),
    (f"{HEADER},cpu_at\nx,0,mlr,10,1,1,2,2,1\n", ":2:", "cpu_at", "not DOP:SECONDS"),
    (f"{HEADER},net_at\nx,0,mlr,10,1,1,2,2,1:-1\n", ":2:", "net_at", "finite and >= 0"),
])
def test_bad_rows_name_line_and_column(text, where, col, what):
    with pytest.raises(TraceError) as ei:
        parse_trace(text, "w.csv")
    msg = str(ei.value)
    assert msg.startswith("w.csv" + where), msg
    assert repr(col) in msg and what in msg, msg


def test_unknown_column_and_short_row():
    with pytest.raises(TraceError, match=r"w.csv:1: unknown column 'cpu'"):
        parse_trace("id,arrival,app,cpu\n", "w.csv")
    with pytest.raises(TraceError, match=r"w.csv:2: 3 cells, the header has 8"):
        parse_trace(f"{HEADER}\nx,0,nmf\n", "w.csv")


def test_cpu_at_measured_dops_replace_eq42_nearest_scales():
    """COMP measured at other DoPs is the COMP there; elsewhere the nearest
    measurement (ref_dop included) scales as 1/m. MLR's COMP on 1 machine
    was 1.2x its COMP on 2, where Eq 4.2 says 2x."""
    j = job(app="mlr", cpu_s=0.2, ref_dop=2, cpu_at=((1, 0.24), (8, 0.04)))
    assert iteration_profile(j, 1, 1e9)[0] == pytest.approx(0.24)
    assert iteration_profile(j, 2, 1e9)[0] == pytest.approx(0.2)
    assert iteration_profile(j, 4, 1e9)[0] == pytest.approx(0.1)          # from DoP 2
    assert iteration_profile(j, 6, 1e9)[0] == pytest.approx(0.04 * 8 / 6)  # from DoP 8
    assert iteration_profile(j, 16, 1e9)[0] == pytest.approx(0.02)
    plain = job(app="mlr", cpu_s=0.2, ref_dop=2)
    assert iteration_profile(plain, 1, 1e9)[0] == pytest.approx(0.4)
    assert iteration_profile(j, 1, 1e6)[1] == iteration_profile(plain, 1, 1e6)[1]


def test_net_at_measured_dops_and_the_model_from_the_nearest():
    """COMM measured at other DoPs is the COMM there; elsewhere the nearest
    measurement (net_s at ref_dop included) plus the model's change from
    that DoP to m, never below 0."""
    j = job(app="lasso", cpu_s=0.01, bytes=6e6, net_s=0.2, link=16e6, ref_dop=2,
            net_at=((1, 0.005), (4, 0.35)))
    plain = job(app="lasso", cpu_s=0.01, bytes=6e6, net_s=0.2, link=16e6, ref_dop=2)
    bw = 16e6
    model = {m: iteration_profile(plain, m, bw)[1] for m in (1, 2, 3, 4, 8)}
    assert model[1] == pytest.approx(0.2 - 6e6 / 16e6 / 2)      # the local part, by the split
    assert iteration_profile(j, 1, bw)[1] == pytest.approx(0.005)
    assert iteration_profile(j, 2, bw)[1] == pytest.approx(0.2)
    assert iteration_profile(j, 3, bw)[1] == pytest.approx(0.2 + model[3] - model[2])
    assert iteration_profile(j, 4, bw)[1] == pytest.approx(0.35)
    assert iteration_profile(j, 8, bw)[1] == pytest.approx(0.35 + model[8] - model[4])
    assert iteration_profile(j, 1, bw)[0] == iteration_profile(plain, 1, bw)[0]
    # from a measurement above m, the model's change is negative: not below 0
    low = job(app="lasso", bytes=6e6, net_s=0.5, link=16e6, ref_dop=8, machines=8,
              net_at=((4, 0.0),))
    assert iteration_profile(low, 3, bw)[1] == 0.0


def _rec(name, machines, comp_cpu, *, first=0, pull=0.05, start=9.0, epochs=4, **timings):
    on = ", ".join(f"m{first + i}" for i in range(machines))
    eps = [{"epoch": e, "time": start + 1.0 + e,
            "timings": {"iters": 2.0, "comp_cpu": comp_cpu, "comp": comp_cpu,
                        "train": 0.5, "pull": pull, "push": pull, **timings}}
           for e in range(epochs)]
    return {"name": name, "events": [[start, "running", f"attempt 1 on {on}"]],
            "epochs": eps, "ended": start + 1.0 + epochs}


def test_dop_table_from_runs_at_two_dops():
    """A replay's calibration takes each job's COMP at other DoPs from the
    runs that ran it there: its COMP CPU per iteration relative to that at
    ref_dop, applied to cpu_s; its COMM there as measured, from the epochs
    it ran alone on its machines. A job run at one DoP is kept as it is."""
    a, b = job(id="a", dataset="mlr-a", cpu_s=0.25, ref_dop=2), job(id="b", dataset="b")
    got = importer.with_dop_table([a, b], [[_rec("mlr-a", 2, 0.4)],
                                           [_rec("mlr-a", 1, 0.5, pull=0.002)],
                                           [_rec("mlr-a", 2, 0.4)], [_rec("other", 1, 9.0)]])
    assert got[0].cpu_at == ((1, pytest.approx(0.25 * 0.5 / 0.4)),)
    assert got[0].net_at == ((1, pytest.approx(0.002)),)
    assert got[1] == b


def test_eval_table_from_runs_at_two_dops_and_the_nearest_per_machine():
    """The evaluation's CPU per machine at each DoP the runs measured (at
    two or more), and at another DoP the nearest one's, unscaled: MLR's
    took 0.054 s on 1 machine and 0.044 s on each of 2, where eval_s / m
    says 0.089 on 1. One DoP: eval_s / m as before."""
    from harmony.sim.trace import eval_per_machine
    a = job(id="a", dataset="mlr-a", cpu_s=0.25, ref_dop=2, eval_s=0.088)
    got = importer.with_dop_table([a], [[_rec("mlr-a", 2, 0.4, eval_cpu=0.044)],
                                        [_rec("mlr-a", 1, 0.5, eval_cpu=0.054)]])[0]
    assert got.eval_at == ((1, pytest.approx(0.054)), (2, pytest.approx(0.044)))
    assert [eval_per_machine(got, m) for m in (1, 2, 3, 8)] == [
        pytest.approx(x) for x in (0.054, 0.044, 0.044, 0.044)]
    one = importer.with_dop_table([a], [[_rec("mlr-a", 2, 0.4, eval_cpu=0.044)]])[0]
    assert one.eval_at is None
    assert eval_per_machine(one, 1) == pytest.approx(0.088)
    assert eval_per_machine(one, 4) == pytest.approx(0.022)


def test_dop_table_takes_comm_only_where_the_job_ran_alone():
    """An epoch beside another job on its machine (a stint overlapping half
    of it) says what the pair's COMM was, not the job's: left out of
    net_at, still counted for cpu_at (COMP CPU, which a partner does not
    slow)."""
    a = job(id="a", dataset="mlr-a", cpu_s=0.25, ref_dop=2)
    ref = [_rec("mlr-a", 2, 0.4)]
    shared = [_rec("mlr-a", 1, 0.5, pull=0.03), _rec("lda", 1, 0.1)]
    got = importer.with_dop_table([a], [ref, shared])
    assert got[0].cpu_at == ((1, pytest.approx(0.25 * 0.5 / 0.4)),)
    assert got[0].net_at is None
    apart = [_rec("mlr-a", 1, 0.5, pull=0.03), _rec("lda", 1, 0.1, first=1)]
    assert importer.with_dop_table([a], [ref, apart])[0].net_at == ((1, pytest.approx(0.03)),)


def test_curves():
    lin = LossCurve.parse("linear:0.5,0,1")
    assert lin.loss(0) == 2 and lin.loss(1) == 1.5 and lin.floor == 1
    assert lin.iterations_to(1.25) == 2
    pts = LossCurve.parse("points:0:1,10:0.5")
    assert pts.loss(5) == 0.75 and pts.loss(99) == 0.5 and pts.iterations_to(0.6) == 8
    s = LossCurve("sublinear", (0.01, 0.1, 1.0, 0.2))
    assert s.scaled(10).loss(50) == pytest.approx(s.loss(5))
    assert lin.scaled(4).loss(8) == pytest.approx(lin.loss(2))
    assert LossCurve.parse(s.spec()) == s
    with pytest.raises(ValueError):
        LossCurve.parse("linear:1.5,0,0")
    ks = list(range(1, 40))
    fit = fit_curve(ks, [s.loss(k) for k in ks], "sublinear", decay=1.0)
    assert max(abs(fit.loss(k) - s.loss(k)) / s.loss(k) for k in ks) < 0.01
    fit = fit_curve(ks, [lin.loss(k) for k in ks], "linear", decay=1.0)
    assert max(abs(fit.loss(k) - lin.loss(k)) / lin.loss(k) for k in ks) < 0.01
    u = Utility.parse("sigmoid:10,1,5")
    assert u.value(5) == 5 and u.value(1e6) == 0 and Utility.parse("3").value(7) == 3


def test_iteration_profile_is_the_scheduler_model():
    j = job(cpu_s=2.0, bytes=12e6, ref_dop=4, net_s=1.0, link=12e6)
    bw = 24e6
    p = sched_profile(j, bw)
    # local part of the measurement: 1.0 - 1.0 * 3/4 = 0.25; remote at 24 MB/s: 0.5
    assert p.remote == pytest.approx(0.5) and p.net_base == pytest.approx(0.25)
    for m in (1, 2, 4, 8):
        c, n = iteration_profile(j, m, bw)
        assert c == pytest.approx(t_cpu_at(p, m)) == pytest.approx(8.0 / m)
        assert n == pytest.approx(t_net_at(p, m)) == pytest.approx(0.25 + 0.5 * (m - 1) / m)
    # no net_s: all COMM is transfer; m = 1 moves nothing
    assert iteration_profile(job(bytes=1e6), 1, 1e6) == (2.0, 0.0)
    assert iteration_profile(job(bytes=1e6), 2, 1e6)[1] == pytest.approx(0.5)


# ---------------------------------------------------------------- workloads

def test_paper_workload_deterministic_and_matches_profiles():
    a = workload.generate("paper", seed=3)
    assert a == workload.generate("paper", seed=3)
    assert a != workload.generate("paper", seed=4)
    assert len(a) == 80 and len({j.id for j in a}) == 80
    assert a[0].arrival == 0 and all(x.arrival <= y.arrival for x, y in zip(a, a[1:]))
    counts = {(ad.app, ad.dataset): 0 for ad in workload.PAPER_MIX}
    for j in a:
        counts[(j.app, j.dataset)] += 1
        assert j.ref_dop == workload.PAPER_DOP == j.machines
        # the job stops where its curve has made 95% of its loss reduction
        assert j.curve.iterations_to(j.target) in range(j.iterations - 1, j.iterations + 2)
    assert set(counts.values()) == {10}
    for ad in workload.PAPER_MIX:
        js = [j for j in a if (j.app, j.dataset) == (ad.app, ad.dataset)]
        # sizes from Table 4.1; model scaled by the hyper-parameter, 0.5-2x
        assert all(j.input_bytes == ad.input_bytes for j in js)
        assert all(0.5 <= j.model_bytes / ad.model_bytes <= 2 for j in js)
        # COMM at DoP 16 is t_net16 * h, h in [0.5, 2]
        nets = [iteration_profile(j, 16, workload.PAPER_BANDWIDTH)[1] for j in js]
        assert all(0.5 * ad.t_net16 - 1e-9 <= n <= 2 * ad.t_net16 + 1e-9 for n in nets)
    for app in ("nmf", "lda", "mlr", "lasso"):
        med = statistics.median(workload.ratio(j) for j in a if j.app == app)
        want = statistics.mean(ad.ratio for ad in workload.PAPER_MIX if ad.app == app)
        assert 0.6 * want < med < 1.6 * want, (app, med, want)
    gaps = [y.arrival - x.arrival for x, y in zip(a, a[1:])]
    assert 0.6 * 240 < statistics.mean(gaps) < 1.5 * 240
    cpu, net = workload.generate("paper-cpu", seed=3), workload.generate("paper-net", seed=3)
    assert len(cpu) == len(net) == 60
    assert statistics.median(map(workload.ratio, cpu)) > statistics.median(
        map(workload.ratio, net))


def test_e2e_workload_is_the_bench_job_set():
    jobs = workload.generate("e2e")
    assert [j.id for j in jobs] == ["cpu-heavy-1", "net-heavy-1", "cpu-heavy-2", "net-heavy-2",
                                    "cpu-heavy-3", "net-heavy-3", "cpu-heavy-4", "net-heavy-4"]
    spec = importlib.util.spec_from_file_location("scheduler_e2e",
                                                  ROOT / "bench" / "scheduler_e2e.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert [j.arrival for j in jobs] == bench.arrivals(8, 6.0, 1)
    assert [j.arrival for j in workload.generate("e2e", mean_gap=4, seed=1)] == \
        bench.arrivals(8, 4.0, 1)
    assert all(j.iterations == 24 and j.iters_per_epoch == 2 and j.machines == 1 for j in jobs)
    c, n = jobs[0], jobs[1]
    assert c.cpu_s > n.cpu_s and n.bytes > 10 * c.bytes


def test_e2e_predictions_leave_out_epochs_whose_partner_changed(tmp_path):
    """An epoch during which its partner ended (or a job joined) ran partly
    alone: the bench leaves it out of the prediction error, not counts the
    pair's prediction against the lone job's time."""
    import json
    spec = importlib.util.spec_from_file_location("scheduler_e2e",
                                                  ROOT / "bench" / "scheduler_e2e.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    tm = {"train": 0.2, "iters": 2.0}
    pair = {"t": 0.0, "assign": {"a": "g", "b": "g"}, "predicted": {"g": 0.1},
            "predicted_jobs": {"a": 0.1, "b": 0.1}, "profile": [], "promote": [], "pause": []}
    alone = dict(pair, t=5.5, assign={"b": "g"}, predicted={"g": 0.05}, predicted_jobs={})
    (tmp_path / "decisions.jsonl").write_text("\n".join(map(json.dumps, [pair, alone])))
    eps = [{"job": j, "epoch": e, "t": t, "workers": ["m0"], "timings": tm}
           for j, e, t in (("a", 0, 1.0), ("b", 0, 1.1), ("a", 1, 3.0), ("b", 1, 3.1),
                           ("a", 2, 5.0), ("b", 2, 5.2), ("b", 3, 6.0))]
    (tmp_path / "jobs.jsonl").write_text("\n".join(map(json.dumps, eps)))
    preds = [{"t": e["t"], "job": e["job"], "epoch": e["epoch"] + 1,
              "jobs": ["a", "b"] if e["t"] < 5.1 else ["b"], "predicted": 0.1,
              "predicted_epoch": 0.1} for e in eps]
    (tmp_path / "predictions.jsonl").write_text("\n".join(map(json.dumps, preds)))
    # a's epochs 1-2 and b's epoch 1 ran beside each other; b's epoch 2 ends
    # at 5.2 after a's end at 5.0, and the decision at 5.5 changed b's mates
    # during its epoch 3: both left out
    assert [(s[0], round(s[1], 3)) for s in bench.prediction_samples(str(tmp_path))] == \
        [(2, 0.0), (2, 0.0), (2, 0.0)]
    assert [(s[0], round(s[1], 3)) for s in bench.fresh_samples(str(tmp_path))] == \
        [(2, 0.0), (2, 0.0), (2, 0.0)]


# ---------------------------------------------------------------- importer

def _real_record(jid: str, submitted: float, machines: int = 2) -> dict:
    """A status record made by the master's own Job code (Job.detail())."""
    j = Job(jid, "nmf.py", "", ["--max-epochs", "3"], machines=machines, name=f"{jid}-name",
            submitted=submitted, entered=submitted)
    j.transition(JobState.RUNNING, now=submitted + 1)
    j.workers = [f"m{i}" for i in range(machines)]
    for e in range(3):
        tm = {"comp": 0.8 + 0.1 * e, "pull": 0.2, "push": 0.3, "train": 1.5, "iters": 2.0,
              "bytes": 2e6, "link": 12e6, "eval": 0.05, "sync": 0.0}
        j.epochs.append({"epoch": e, "metrics": {"objective": 10.0 / (e + 1)},
                         "timings": tm, "time": submitted + 2 + e})
        j.update_profile(tm, machines)
    j.store = {"m0": {"input_mb": 3.0, "shard_mb": 0.5}, "m1": {"input_mb": 1.0, "shard_mb": 0.5}}
    j.checkpoint = {"epoch": 2, "time": submitted + 6, "parts": 2, "replicas": 2,
                    "bytes": 1.5 * 2 ** 20, "holders": ["m0", "m1"], "final": True}
    j.transition(JobState.FINISHED, now=submitted + 6)
    return j.detail(now=submitted + 6)


def test_importer_on_real_records(tmp_path):
    import json
    never = Job("zz", "lda.py", "", [], machines=1, submitted=90.0).detail(now=95.0)
    recs = [_real_record("b", 105.5), _real_record("a", 100.0), never]
    path = tmp_path / "status.json"
    path.write_text(json.dumps(recs))
    out = tmp_path / "run.csv"
    jobs, skipped = importer.import_run([path], out=str(out))
    assert skipped == ["zz"]
    assert [j.id for j in jobs] == ["a", "b"]
    a = jobs[0]
    # arrival from the earliest submission of the run (the job that never ran)
    assert a.arrival == 10.0 and jobs[1].arrival == 15.5
    assert a.app == "nmf" and a.dataset == "a-name" and a.machines == 2 and a.ref_dop == 2
    assert a.iterations == 6 and a.iters_per_epoch == 2
    # the master's moving average (weight 0.3) of COMP per iteration
    w = 0.3
    avg = 0.4
    for x in (0.45, 0.5):
        avg = (1 - w) * avg + w * x
    assert a.cpu_s == pytest.approx(avg)
    assert a.net_s == pytest.approx(0.25) and a.bytes == pytest.approx(1e6)
    assert a.link == 12e6 and a.eval_s == 0.05 and a.input_bytes == 4 * 2 ** 20
    # the shards' rows and what the final checkpoint wrote: checkpoints' costs
    assert a.model_bytes == 2 ** 20 and a.final_bytes == 1.5 * 2 ** 20
    assert a.curve.spec() == "points:2:10,4:5,6:" + repr(10 / 3)
    assert load_trace(out) == jobs
    # with the master's jobs.jsonl: medians without the first epoch
    log = [{"t": 1.0 + e, "job": "a", "epoch": e, "workers": ["m0", "m1"],
            "timings": {"comp": c, "pull": 0.1, "push": 0.1, "iters": 2.0, "bytes": 4e6}}
           for e, c in enumerate((5.0, 1.0, 1.2, 1.4))]
    jobs, _ = importer.jobs_from_status(recs, log)
    assert jobs[0].cpu_s == pytest.approx(0.6) and jobs[0].net_s == pytest.approx(0.1)
    assert jobs[0].bytes == pytest.approx(2e6)
    assert jobs[1].cpu_s == pytest.approx(avg)      # no log rows for b


# ---------------------------------------------------------------- report

def _result(policy: str, scale: float) -> report.SimResult:
    jobs = [report.JobResult(f"j{i}", "nmf", arrival=float(i), start=float(i) + 1,
                             end=float(i) + scale * (i + 1)) for i in range(5)]
    util = [report.UtilSample(0.0, 10.0, 0.5, 0.2), report.UtilSample(10.0, 30.0, 0.9, 0.6)]
    dec = [report.SimDecision(0.0, "start", {"start": {"j0": ["m0"]}})]
    return report.SimResult(policy, jobs, util, dec, mode=policy, machines=4)


def test_report_statistics_exact():
    s = report.summarize(_result("isolated", 2.0))
    # JCTs 2, 4, 6, 8, 10
    assert s["jobs"] == 5 and s["mean_jct"] == 6.0 and s["median_jct"] == 6.0
    assert s["p95_jct"] == pytest.approx(9.6)          # 8 + 0.8 * (10 - 8)
    assert s["makespan"] == 14.0                        # last end 4 + 10, first arrival 0
    assert s["cpu_util"] == pytest.approx((0.5 * 10 + 0.9 * 30) / 40)
    assert s["net_util"] == pytest.approx((0.2 * 10 + 0.6 * 30) / 40)
    assert s["decisions"] == 1


def test_write_result_and_table_and_plots(tmp_path):
    from rich.console import Console
    results = {"isolated": _result("isolated", 2.0), "harmony": _result("harmony", 1.0)}
    path = report.write_result(results["harmony"], tmp_path)
    back = report.read_result(path)
    assert report.summarize(back) == report.summarize(results["harmony"])
    assert back.decisions[0].data == {"start": {"j0": ["m0"]}}
    text = report.compare_table(results, baseline="isolated",
                                console=Console(file=io.StringIO(), width=200))
    assert "isolated" in text and "harmony" in text
    assert "2.00x" in text        # harmony's mean JCT 3 s against isolated's 6 s
    assert "1.00x" in text
    paths = report.write_plots(results, tmp_path / "plots")
    for p in paths:
        data = Path(p).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000
    with report.sim_progress(10, enabled=False) as update:
        update(5)


# ---------------------------------------------------------------- contention

def test_contention_model_and_calibration():
    m = contention.ContentionModel(0.5, 0.0)
    assert m.cpu_rate(1) == 1.0 and m.cpu_rate(2) == pytest.approx(1 / 3)
    assert m.net_rate(2) == 0.5 and m.rate("net", 4) == 0.25
    jobs = contention.colocation_jobs()
    # isolated replay reproduces the run times alone (fixed cost included)
    mk, jct = contention.replay_pairs(jobs, contention.IDEAL, at_once=1)
    assert mk == pytest.approx(sum(a for *_, a in contention.COLOCATION_RUN["jobs"]))
    model, fit = contention.calibrate()
    assert model.cpu_k == contention.CALIBRATED.cpu_k == contention.CALIBRATED.net_k
    assert abs(fit["naive_makespan_err"]) < 0.1 and abs(fit["naive_mean_jct_err"]) < 0.1
    quiet, fit = contention.calibrate(use=("pair",))
    assert quiet.cpu_k == contention.QUIET.cpu_k == contention.QUIET.net_k
    assert all(abs(v) < 0.02 for key, v in fit.items() if key.endswith("_err"))
    # more interference, slower naive
    assert contention.replay_pairs(jobs, contention.PAPER_LIKE)[0] > \
        contention.replay_pairs(jobs, contention.IDEAL)[0]
    assert not math.isnan(fit["pair_cpu-heavy-1"])


def test_ceiling_bounds_the_makespan_and_the_cpu_utilization_any_schedule_can_reach():
    from harmony.sim.trace import ceiling
    a = job(id="a", arrival=0.0, iterations=10, cpu_s=1.0, bytes=0.0, ref_dop=2, machines=2)
    b = job(id="b", arrival=100.0, iterations=5, cpu_s=2.0, bytes=0.0, ref_dop=1, machines=1)
    c = ceiling([a, b], 2, None)
    # b arrives at 100 s; on both machines (lent one more than it asked) it
    # needs 5 x 1 s: no schedule ends before 105 s
    assert c.makespan == pytest.approx(105.0) and c.job == "b"
    # COMP work: a 10 x 1 s x 2 machines, b 5 x 2 s: 30 machine-s of 2 x 105
    assert c.cpu == pytest.approx(30.0 / 210.0)
    # many jobs at once: the work spread over the machines is the bound
    many = [job(id=f"j{i}", iterations=10, cpu_s=1.0, bytes=0.0, ref_dop=1, machines=1)
            for i in range(8)]
    c = ceiling(many, 2, None)
    assert c.makespan == pytest.approx(40.0) and c.cpu == pytest.approx(1.0)
    # a transfer-bound job is fastest on 1 machine (remote traffic grows with m)
    net = job(id="n", iterations=4, cpu_s=0.1, bytes=1e6, ref_dop=1, machines=4)
    assert ceiling([net], 4, 1e6).makespan == pytest.approx(4 * 0.1)
    # and one that scales: 2 iterations of 4 s COMP + 0.5 s remote on 2 machines
    wide = job(id="w", iterations=2, cpu_s=4.0, bytes=1e6, ref_dop=1, machines=2)
    assert ceiling([wide], 2, 1e6).makespan == pytest.approx(2 * (2.0 + 0.5))
    with pytest.raises(ValueError):
        ceiling([], 2, None)


def test_short_workload_is_many_short_small_jobs_over_weeks():
    """#32 item 6: the simulator's speed case, the shape of DL cluster traces."""
    from harmony.sim.workload import SHORT_RUN_CLIP_S, generate as gen
    jobs = gen("short", 2000, 3)
    assert jobs == gen("short", 2000, 3) and len(jobs) == 2000
    assert 2 * 7 * 86400 < jobs[-1].arrival < 4 * 7 * 86400           # about three weeks
    sizes = [j.machines for j in jobs]
    assert set(sizes) <= {1, 2, 4, 8} and 0.5 < sizes.count(1) / len(sizes) < 0.7
    bw = workload.PAPER_BANDWIDTH
    runs = sorted(j.iterations * (j.cpu_s + j.bytes / bw * 15 / 16) for j in jobs)
    assert runs[len(runs) // 2] < 30 * 60                               # most run minutes
    assert runs[-1] <= SHORT_RUN_CLIP_S[1] * 1.01


def test_a_minimum_epoch_length_groups_the_iterations_of_long_jobs():
    from harmony.sim.run import FINE_EPOCHS, sim_jobs
    jobs = workload.generate("short", 200, 2)
    fine = sim_jobs(jobs, workload.PAPER_BANDWIDTH)
    coarse = sim_jobs(jobs, workload.PAPER_BANDWIDTH, min_epoch_s=600.0)
    assert sum(j.epochs for j in coarse) < 0.8 * sum(j.epochs for j in fine)
    for a, b in zip(fine, coarse):
        # the same iterations; the profiling epochs stay at the trace's own
        assert sum(k for _, k in a.plan) == sum(k for _, k in b.plan)
        assert a.plan[:FINE_EPOCHS] == b.plan[:FINE_EPOCHS]
