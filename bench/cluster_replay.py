"""The simulator checked on the runtime's own runs (issue #31 item 5): every
run of a ``bench/cluster_e2e.py --out FILE`` replayed in the simulator with
the same machines and arrivals.

Calibration (``bench/sim_fidelity.py``'s ``calibrate``) from the file's
first isolated run of the load, or from another such file's
(``--calibrate-from``, for files without one): the jobs' profiles
(``harmony sim import``: medians over their epochs, checkpoint sizes),
start-up, epoch boundary, link. Each run of each mode is then simulated on
the file's N machines of 1 core (``cpus=1``), every job arriving when it
was submitted and asking for the machines it asked for, under the mode's
setup (``bench/cluster_e2e.py``'s ``setup_of``: isolated, isolated-best, isolated-1
-> ``isolated``; naive-K -> ``naive``, at most K jobs per machine; match ->
``match@harmony``; harmony -> ``harmony``). Status records are in
undilated seconds (the master's clock at dilation D) and the simulator's
machines are undilated: D enters only through what the calibration
measured.

Prints, per mode and run: makespan and mean JCT, runtime vs simulator,
their errors, the per-job JCT error median / max, and which goals are met
(makespan and mean JCT within 10%, the per-job median within 15%); where
the JCTs went, runtime vs simulator (``harmony.sim.placement.time_split``);
per epoch, the simulator's iteration time against the runtime's by group
size (1, 2, 3, 4+: the jobs on the epoch's machines, from the records'
events), beside both against the calibrated profile alone and the
runtime's COMP wall over CPU; and the master's prediction error by group
size (``bench/scheduler_e2e.py``'s tables where the file kept the
per-epoch samples, else a stand-in from each job's last prediction).

    python bench/cluster_replay.py /tmp/ce2e/quick.json [--load 0] [--jobs]
    python bench/cluster_replay.py /tmp/s15/h0.json --calibrate-from /tmp/ce2e/quick.json
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from cluster_e2e import setup_of  # noqa: E402
from scheduler_e2e import cells, print_prediction_tables  # noqa: E402
from sim_fidelity import Calibration, Replay, calibrate, print_calibration, replay  # noqa: E402

from harmony.sim.placement import SPLIT, by_size, epoch_samples, last_prediction_samples, \
    time_split  # noqa: E402
from harmony.sim.trace import iteration_profile  # noqa: E402

GOAL_RUN = 0.10         # makespan and mean JCT
GOAL_JOB = 0.15         # the per-job JCT error's median


def sim_setup(mode: str) -> tuple[str, int]:
    """(the simulator's setup name, max jobs per machine) of a bench mode."""
    s = setup_of(mode)
    name = f"{s['policy']}@{s['mode']}" if s.get("policy") else s["mode"]
    return name, int(s.get("cluster", {}).get("max_jobs_per_machine", 0))


def ok_runs(data: dict, load: str) -> dict[str, list[dict]]:
    return {m: [r for r in rs if "failed" not in r and r.get("statuses")]
            for m, rs in data["runs"][load].items()}


def pct(x: float) -> str:
    return f"{100 * x:+6.1f}%"


def print_replays(rows: list[tuple[str, int, list[dict], Replay]]) -> None:
    print(f"\n{'mode':14} {'run':>3} {'makespan run':>12} {'sim':>7} {'err':>7} "
          f"{'mean JCT run':>12} {'sim':>7} {'err':>7} {'per-job |err| median / max':>27}"
          f"  goals (10% / 15%)")
    for mode, i, _, r in rows:
        mk = (r.sim_makespan - r.run_makespan) / r.run_makespan
        jct = (r.sim_jct - r.run_jct) / r.run_jct
        met = [abs(mk) <= GOAL_RUN, abs(jct) <= GOAL_RUN, r.err_median <= GOAL_JOB]
        print(f"{mode:14} {i:3d} {r.run_makespan:11.1f}s {r.sim_makespan:6.1f}s {pct(mk)} "
              f"{r.run_jct:11.1f}s {r.sim_jct:6.1f}s {pct(jct)} "
              f"{100 * r.err_median:17.1f}% / {100 * r.err_max:5.1f}%  "
              + ("all met" if all(met) else "missed: " + ", ".join(
                  n for n, m in zip(("makespan", "mean JCT", "per-job"), met) if not m)))
    by_mode: dict[str, list[Replay]] = {}
    for mode, _, _, r in rows:
        by_mode.setdefault(mode, []).append(r)
    if any(len(v) > 1 for v in by_mode.values()):
        print("medians over the runs of a mode: makespan err, mean JCT err, per-job median")
        for mode, reps in by_mode.items():
            print(f"  {mode:14} "
                  f"{pct(statistics.median(r.sim_makespan / r.run_makespan - 1 for r in reps))} "
                  f"{pct(statistics.median(r.sim_jct / r.run_jct - 1 for r in reps))} "
                  f"{100 * statistics.median(r.err_median for r in reps):6.1f}%")


def print_jobs(mode: str, statuses: list[dict], r: Replay) -> None:
    t0 = min(s["submitted"] for s in statuses)
    sim = {j.id: j for j in r.result.jobs}
    print(f"\n{mode}: per job (s from the first submission): runtime start / end beside the "
          f"simulator's, JCT error")
    for s in sorted(statuses, key=lambda s: s["submitted"]):
        j = sim[s["name"]]
        print(f"  {s['name']:22s} DoP {s['machines']}  run {s['started'] - t0:5.1f} / "
              f"{s['ended'] - t0:5.1f}  sim {j.start:5.1f} / {j.end:5.1f}  "
              f"{pct(r.errors[s['name']])}")


def print_split(rows: list[tuple[str, int, list[dict], Replay]]) -> None:
    """Where the JCTs went, summed over a run's jobs: runtime / simulator."""
    print("\nwhere the JCTs went (s, summed over the jobs), runtime / simulator "
          "(harmony.sim.placement.time_split)")
    print(f"{'mode':14} {'run':>3} " + " ".join(f"{k:>15}" for k in SPLIT))
    for mode, i, statuses, rep in rows:
        tot = [{k: sum(time_split(st)[k] for st in sts) for k in SPLIT}
               for sts in (statuses, rep.result.meta["statuses"])]
        print(f"{mode:14} {i:3d} " + " ".join(f"{tot[0][k]:7.1f}/{tot[1][k]:<7.1f}"
                                             for k in SPLIT))


def epoch_rows(statuses: list[dict], rep: Replay, cal: Calibration
               ) -> list[tuple[int, float, float, float, float | None, bool]]:
    """Per runtime epoch (but a job's first) that the simulator ran too:
    (its group size in the runtime, (sim - run) / run of the iteration
    time, run / alone and sim / alone, alone the iteration time the
    calibrated profile gives at the epoch's machine count, the runtime's
    COMP wall over its COMP CPU, whether it ran on as many machines as
    the profile was measured on)."""
    sim = {(x.job, x.epoch): x for x in epoch_samples(rep.result.meta["statuses"])}
    timings = {(st["name"], e.get("epoch")): e.get("timings") or {}
               for st in statuses for e in st.get("epochs") or ()}
    out = []
    for x in epoch_samples(statuses):
        y = sim.get((x.job, x.epoch))
        if x.epoch == 0 or y is None or x.iter_s <= 0 or not x.machines:
            continue
        alone = sum(iteration_profile(cal.by_name[x.job], len(x.machines), cal.link))
        tm = timings.get((x.job, x.epoch), {})
        host = tm["comp"] / tm["comp_cpu"] if tm.get("comp_cpu", 0) > 0 else None
        out.append((x.size, (y.iter_s - x.iter_s) / x.iter_s, x.iter_s / alone,
                    y.iter_s / alone, host, len(x.machines) == cal.by_name[x.job].ref_dop))
    return out


def med(xs: list[float]) -> str:
    return f"{statistics.median(xs):7.2f}" if xs else f"{'-':>7}"


def print_epochs(rows: list[tuple[str, int, list]]) -> None:
    print("\nper epoch: the simulator's iteration time against the runtime's, by the runtime "
          "group size (jobs on the epoch's machines: harmony.sim.placement), all runs; "
          "x alone: iteration / the calibrated profile's alone at the epoch's machines "
          "(medians); COMP wall/CPU: the runtime's COMP seconds over its CPU seconds "
          "(1 = a core to itself; more = waiting for the host's real cores); "
          "size N*: at another machine count than the profile's (the model's DoP scaling)")
    print(f"{'mode':14} {'size':>4} {'epochs':>6} {'|err| median':>12} {'p90':>7} "
          f"{'signed':>7} {'run x alone':>11} {'sim x alone':>11} {'COMP wall/CPU':>13}")
    for mode in dict.fromkeys(m for m, _, _ in rows):
        got = [x for m, _, xs in rows if m == mode for x in xs]
        for label, sel in by_size((x[0], x) for x in got).items():
            for same in (True, False):
                part = [x for x in sel if x[5] == same]
                if part:
                    epoch_line(mode, label + ("" if same else "*"), part)


def epoch_line(mode: str, label: str, sel: list[tuple]) -> None:
    n, md, p9 = cells([abs(x[1]) for x in sel]).split()
    print(f"{mode:14} {label:>4} {n:>6} {md:>12} {p9:>7} "
          f"{100 * statistics.median(x[1] for x in sel):+6.1f}% "
          f"{med([x[2] for x in sel]):>11} {med([x[3] for x in sel]):>11} "
          f"{med([x[4] for x in sel if x[4] is not None]):>13}")


def print_predictions(runs: dict[str, list[dict]]) -> None:
    """The master's per-epoch prediction error by group size: the
    scheduler_e2e tables where the runs kept their samples, else the
    stand-in from each job's last prediction."""
    kept = {m: rs for m, rs in runs.items() if any(r.get("samples") for r in rs)}
    if kept:
        print_prediction_tables(kept, list(kept))
    rest = {m: rs for m, rs in runs.items() if m not in kept}
    got = {m: [x for r in rs for x in last_prediction_samples(r["statuses"])]
           for m, rs in rest.items()}
    got = {m: xs for m, xs in got.items() if xs}
    if not got:
        return
    print("\nprediction error of the iteration time by group size, from each job's last "
          "prediction (status predicted_iter) over its epochs since its company last changed "
          "(these runs kept no per-epoch predictions; harmony.sim.placement."
          "last_prediction_samples); the job's own prediction where the policy makes one, "
          "else its group's (match: Eq 4.1 of the pair)")
    print(f"{'mode':14} {'size':>4} {'epochs':>6} {'median':>7} {'p90':>7}")
    for mode, xs in got.items():
        for label, errs in by_size(xs).items():
            print(f"{mode:14} {label:>4} {cells(errs)}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", help="a bench/cluster_e2e.py --out file")
    ap.add_argument("--load", default=None, help="the load to replay (default: every one)")
    ap.add_argument("--calibrate-from", default=None,
                    help="take the isolated run from this file (same format) instead")
    ap.add_argument("--jobs", action="store_true", help="print every job's JCTs too")
    ap.add_argument("--startup-weight", type=float, default=None,
                    help="CPU weight of a start-up against a COMP thread (default: the "
                         "file's 'startup_weight', else the simulator's, 15/1024: start-ups "
                         "at nice 19; 1 for runs made before they were, session 17's)")
    ap.add_argument("--eq42", action="store_true",
                    help="COMP splits as 1/m from the isolated run's DoP (Eq 4.2) for every "
                         "job, not as measured where the file's runs ran it at other DoPs")
    ap.add_argument("--net-at", action="store_true",
                    help="each job's COMM as measured where the file's runs ran it alone at "
                         "other DoPs (the trace's net_at), not by the model from the isolated "
                         "run's DoP")
    a = ap.parse_args(argv)
    logging.getLogger("harmony.master").setLevel(logging.WARNING)
    data = json.load(open(a.file))
    cal_data = json.load(open(a.calibrate_from)) if a.calibrate_from else data
    loads = [a.load] if a.load is not None else list(data["runs"])
    n = int(data["machines"])
    print(f"{a.file}: {n} machines x 1 core at dilation {data.get('dilation', 1):g}, link "
          f"{data.get('bandwidth', 0) / 1e6:g} MB/s; the simulator: {n} machines x 1 core")
    if a.startup_weight is None and data.get("startup_weight") is None:
        print("(the file does not say at what weight its start-ups ran: the simulator's "
              "default is used; --startup-weight 1 for runs before start-ups ran at nice 19)")
    for load in loads:
        iso_src = ok_runs(cal_data, load if load in cal_data["runs"] else
                          next(iter(cal_data["runs"]))).get("isolated")
        if not iso_src:
            raise SystemExit(f"no isolated run in {a.calibrate_from or a.file} to calibrate "
                             f"from: pass --calibrate-from FILE")
        others = None if a.eq42 else [
            r["statuses"] for rs in ok_runs(data, load).values() for r in rs]
        cal = calibrate(iso_src[0]["statuses"], others=others, net_at=a.net_at)
        w = a.startup_weight if a.startup_weight is not None else data.get("startup_weight")
        if w is not None:
            cal.contention = dataclasses.replace(cal.contention, startup_weight=float(w))
        print(f"\nload {load}")
        print_calibration(cal, f"{'--calibrate-from ' if a.calibrate_from else ''}"
                               f"isolated run 0")
        rows, per_epoch = [], []
        runs = ok_runs(data, load)
        for mode, rs in runs.items():
            name, cap = sim_setup(mode)
            for i, run in enumerate(rs):
                rep = replay(run["statuses"], cal, n, name, max_jobs_per_machine=cap)
                rows.append((mode, i, run["statuses"], rep))
                per_epoch.append((mode, i, epoch_rows(run["statuses"], rep, cal)))
                if a.jobs:
                    print_jobs(f"{mode} run {i} (simulator: {name}"
                               f"{f', cap {cap}' if cap else ''})", run["statuses"], rep)
        print_replays(rows)
        print_split(rows)
        print_epochs(per_epoch)
        print_predictions(runs)

if __name__ == "__main__":
    main()
