"""A trace from what the runtime recorded for real jobs, so that a measured
run can be replayed in the simulator.

    harmony status JOB --json > JOB.json      # for every job of the run
    python -m harmony.sim.importer JOB1.json JOB2.json ... [--jobs-log DIR/master/metrics/jobs.jsonl] --out run.csv

Input: ``harmony status --json`` output, i.e. the master's
``Job.detail()`` (``harmony/master/jobs.py``) plus its group prediction: one
JSON object, a JSON array of them, or JSON lines. Per job it uses:

==============  ==============================================================
trace column    from the status record
==============  ==============================================================
id              ``id``
arrival         ``submitted`` less the earliest ``submitted`` of the run
app             ``app`` without ``.py`` (e.g. ``nmf.py`` -> ``nmf``); an app
                the trace does not know becomes ``synthetic``
dataset         ``name`` (the name given at submission)
iterations      the sum of ``timings["iters"]`` over its epochs (the status
                holds the last 1000 epochs: ``epochs_total`` x iterations
                per epoch when more ran)
iters_per_epoch ``timings["iters"]`` of its epochs (the most common value)
cpu_s, net_s,   the profile: ``t_cpu``, ``t_net`` (PULL + PUSH), ``bytes``,
bytes, link,    ``link`` (0: not known -> empty) and ``machines`` of the
ref_dop         master's moving averages, where possible replaced by the
                medians over the job's epochs at the profile's machine count,
                leaving out the first such epoch (warm-up): those of the
                master's ``metrics/jobs.jsonl`` (``jobs_log``), else of the
                status's own epochs, their machines told by its events
                (``epoch_rows``)
eval_s          the median of ``timings["eval_cpu"]`` x the epoch's machines
                (the objective's CPU on one machine), else of
                ``timings["eval"]`` (:func:`eval_per_epoch`)
cpu_at          the profile's ``cpu_prev``: the COMP at the DoP the job
                left, where the master measured it at two; else empty
input_bytes     the sum over its machines of ``store[m]["input_mb"]`` (MiB)
model_bytes     the sum over its machines of ``store[m]["shard_mb"]`` (MiB; the
                server shards' rows), 0 where not recorded
final_bytes     ``checkpoint["bytes"]`` of a finished job's final checkpoint
                (its model and the input arrays the app exports); empty
                where it has none
ckpt_bytes      what its periodic checkpoints wrote, all parts:
                ``checkpoint["periodic_bytes"]`` (the last one's) where the
                master records it (empty where it is None: none completed);
                else, for records from before periodic
                parts were written behind the job, as measured
                (``checkpoint_hold``): the median time a periodic checkpoint
                held its executors at the epoch boundary (beyond an ordinary
                boundary) x the link x its machines; empty where its records
                show no periodic checkpoint
curve           ``points:`` (iterations done, objective) after every epoch
machines        ``machines`` (what the job asked for)
==============  ==============================================================

A job with no profile or no epoch (it never ran) is skipped, and its id is
returned among the skipped ones. Profiles are as measured: import a run in
isolated mode for profiles without co-location effects (in naive mode COMP
includes time-slicing with co-located jobs; in harmony mode COMP is the
job's own, as the executors subtract the time a preempted COMP stood).

A run on a dilated cluster (``harmony cluster up --dilation D``) is
imported as it is: its status records are in undilated seconds already
(the master's clock and the executors' timings divide by D, see
``harmony.dilation``) and name their ``dilation``; a simulator run describes
undilated machines. Records of runs at different dilations are refused
together (one run at a time).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from harmony.policies.curves import LossCurve
from harmony.sim.placement import epoch_samples, machines_at, spans, stints
from harmony.sim.trace import APPS, TraceJob, save_trace

MIB = 2 ** 20
#: the master's periodic checkpoint interval in epochs (``Job.ckpt_every``'s
#: default): after the epochs first + 9, first + 19, ... of an attempt
#: that started (or resumed) at epoch ``first``
CKPT_EVERY = 10


def load_status(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Status records from a file: one JSON object, an array, or JSON lines."""
    text = open(path).read().strip()
    if not text:
        return []
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = [json.loads(line) for line in text.splitlines() if line.strip()]
    recs = data if isinstance(data, list) else [data]
    for i, r in enumerate(recs):
        if not isinstance(r, dict) or "id" not in r:
            raise ValueError(f"{path}: record {i + 1} is not a job status (no 'id')")
    return recs


def load_jobs_log(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The master's ``metrics/jobs.jsonl``: one row per job epoch (``t``,
    ``job``, ``epoch``, ``workers``, ``profile``, ``timings``)."""
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _app(name: str) -> str:
    base = os.path.basename(str(name or ""))
    base = base[:-3] if base.endswith(".py") else base
    return base if base in APPS else "synthetic"


def _per_iter(tm: Mapping[str, float]) -> dict[str, float]:
    it = max(1.0, float(tm.get("iters", 1.0)))
    out = {"t_cpu": tm.get("comp", 0.0) / it,
           "t_net": (tm.get("pull", 0.0) + tm.get("push", 0.0)) / it,
           "bytes": tm.get("bytes", 0.0) / it}
    if "train_cpu" in tm and "comp_cpu" in tm:    # the CPU its COMM cost (Profile.comm_cpu)
        out["comm_cpu"] = max(0.0, tm["train_cpu"] - tm["comp_cpu"]) / it
    return out


def _median_profile(rows: Sequence[Mapping[str, Any]], machines: int) -> dict[str, float] | None:
    """Medians of the per-iteration COMP, COMM and bytes over a job's epochs
    on ``machines`` machines, without the first such epoch."""
    same = sorted((r for r in rows if len(r.get("workers", ())) == machines),
                  key=lambda r: r.get("t", 0.0))
    if len(same) > 1:
        same = same[1:]
    if not same:
        return None
    per = [_per_iter(r.get("timings", {})) for r in same]
    out = {k: statistics.median(p[k] for p in per) for k in ("t_cpu", "t_net", "bytes")}
    if all("comm_cpu" in p for p in per):
        out["comm_cpu"] = statistics.median(p["comm_cpu"] for p in per)
    return out


def checkpoint_hold(rec: Mapping[str, Any], every: int = CKPT_EVERY) -> float | None:
    """Seconds a periodic checkpoint held the job's executors at an epoch
    boundary: the median over its periodic checkpoints of the time between
    two epoch reports not spent in the second epoch's training and
    evaluation, less the median of that at its other boundaries (None where
    its records show no periodic checkpoint). Boundaries are counted within
    one stretch on machines (``placement.spans``: a live resize does not
    start a new one) from its first epoch there, as the master counts."""
    eps = sorted((e for e in rec.get("epochs") or () if "time" in e),
                 key=lambda e: float(e["time"]))
    held, plain = [], []
    for lo, hi in spans(stints(rec)):
        inside = [e for e in eps if lo <= float(e["time"]) <= hi]
        if not inside:
            continue
        first = int(inside[0].get("epoch", 0))
        for a, b in zip(inside, inside[1:]):
            if int(b.get("epoch", -1)) != int(a.get("epoch", 0)) + 1:
                continue
            tm = b.get("timings") or {}
            gap = float(b["time"]) - float(a["time"]) - float(tm.get("train", 0.0)) \
                - float(tm.get("eval", 0.0))
            (held if (int(a["epoch"]) + 1 - first) % every == 0 else plain).append(gap)
    if not held:
        return None
    return max(0.0, statistics.median(held) - (statistics.median(plain) if plain else 0.0))


def epoch_rows(rec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Rows like the master's ``jobs.jsonl``'s from a status record's own
    epochs: ``t``, ``epoch``, ``timings`` and ``workers``, the machines it
    held when the epoch ended (from its events, ``placement.stints``)."""
    st = stints(rec)
    return [{"t": float(e["time"]), "epoch": e.get("epoch"), "timings": e.get("timings") or {},
             "workers": sorted(machines_at(st, float(e["time"])))}
            for e in rec.get("epochs") or () if "time" in e]


def job_from_status(rec: Mapping[str, Any], t0: float,
                    log_rows: Sequence[Mapping[str, Any]] = ()) -> TraceJob | None:
    """One status record as a trace job (None if it never ran: no profile
    or no epoch). ``t0``: the run's first submission time. ``log_rows``:
    this job's rows of ``jobs.jsonl``."""
    prof = rec.get("profile") or {}
    epochs = rec.get("epochs") or []
    if not prof or not prof.get("machines") or not epochs:
        return None
    ref = int(prof["machines"])
    p = dict(prof)
    med = _median_profile(log_rows or epoch_rows(rec), ref)
    if med:
        p.update(med)
    iters = [int(e.get("timings", {}).get("iters") or 0) for e in epochs]
    ipe = Counter(i for i in iters if i > 0).most_common(1)
    ipe = ipe[0][0] if ipe else 1
    shown = sum(i or ipe for i in iters)
    total_epochs = int(rec.get("epochs_total", len(epochs)))
    n_iters = shown + (total_epochs - len(epochs)) * ipe
    # the loss curve: objective after every recorded epoch, in iterations done
    first = total_epochs - len(epochs)
    pts: list[float] = []
    done = first * ipe
    for e, n in zip(epochs, iters):
        done += n or ipe
        obj = (e.get("metrics") or {}).get("objective")
        if isinstance(obj, (int, float)) and obj == obj and (not pts or done > pts[-2]):
            pts += [float(done), float(obj)]
    curve = LossCurve("points", tuple(pts)) if len(pts) >= 2 else None
    evals = eval_per_epoch(rec)
    store = rec.get("store") or {}
    input_mb = sum(float(s.get("input_mb", 0.0)) for s in store.values()
                   if isinstance(s, Mapping))
    shard_mb = sum(float(s.get("shard_mb", 0.0)) for s in store.values()
                   if isinstance(s, Mapping))
    ckpt = rec.get("checkpoint") or {}
    final = float(ckpt["bytes"]) if ckpt.get("final") and \
        isinstance(ckpt.get("bytes"), (int, float)) else None
    link = float(p.get("link") or 0.0)
    hold = checkpoint_hold(rec)
    periodic = hold * link * ref if hold is not None and link > 0 else None
    if "periodic_bytes" in ckpt:   # as recorded (parts written behind the job hold nothing)
        got = ckpt["periodic_bytes"]
        periodic = float(got) if isinstance(got, (int, float)) and got > 0 else None
    net = float(p.get("t_net", 0.0))
    startup, startup_cpu = job_startup(rec)
    return TraceJob(
        id=str(rec["id"]), arrival=max(0.0, float(rec["submitted"]) - t0),
        app=_app(rec.get("app", "")), dataset=str(rec.get("name") or ""),
        iterations=max(1, n_iters), iters_per_epoch=ipe, curve=curve,
        cpu_s=float(p.get("t_cpu", 0.0)), net_s=net,
        bytes=float(p.get("bytes", 0.0)), link=link if link > 0 else None, ref_dop=ref,
        eval_s=statistics.median(evals) if evals else 0.0, input_bytes=input_mb * MIB,
        model_bytes=shard_mb * MIB, final_bytes=final, ckpt_bytes=periodic,
        machines=max(1, int(rec.get("machines") or ref)), startup_s=startup,
        startup_cpu_s=startup_cpu,
        comm_cpu_s=float(p["comm_cpu"]) if isinstance(p.get("comm_cpu"), (int, float)) else None,
        cpu_at=cpu_prev(p))


def eval_per_epoch(rec: Mapping[str, Any]) -> list[float]:
    """A job's evaluation per epoch as the trace's ``eval_s`` means it: its
    CPU seconds on one machine (``eval_cpu`` x the epoch's machines, the
    objective's pass split over them), where the epochs record it; else its
    wall seconds (``eval``). The wall time at the DoP it ran holds the pull
    of the model, which the simulator charges as a PULL of its own: Lasso's
    evaluation took 0.092 s on 2 machines and 0.001 s on 1."""
    cpu = [float(row["timings"]["eval_cpu"]) * len(row["workers"]) for row in epoch_rows(rec)
           if isinstance(row["timings"].get("eval_cpu"), (int, float)) and row["workers"]]
    if cpu:
        return cpu
    return [float(e["timings"]["eval"]) for e in rec.get("epochs") or ()
            if isinstance((e.get("timings") or {}).get("eval"), (int, float))]


def cpu_prev(p: Mapping[str, Any]) -> tuple[tuple[int, float], ...] | None:
    """The COMP the master measured at the DoP the job left (``cpu_prev``),
    as a ``cpu_at`` table; None where it ran at one DoP."""
    prev = p.get("cpu_prev")
    try:
        m, t = int(prev[0]), float(prev[1])
    except (TypeError, ValueError, IndexError):
        return None
    return ((m, t),) if m >= 1 and t >= 0 and m != p.get("machines") else None


def setup_cpu(entry: Sequence, dilation: float) -> float:
    """A ``setups`` entry's CPU seconds of start-up in undilated seconds: as
    they are where the start-up was stretched (a third element, 1: it lasted
    at least D x its CPU, as every start-up since session 21), else / D (an
    unstretched start-up's CPU work took 1/D undilated seconds)."""
    stretched = len(entry) >= 3 and bool(entry[2])
    return float(entry[1]) if stretched else float(entry[1]) / dilation


def stretched_startups(records: Iterable[Mapping[str, Any]]) -> bool:
    """Whether the records are of a dilated run (D > 1) whose start-ups
    were all stretched (every ``setups`` entry's third element 1, at least
    one entry): each lasted D x its CPU seconds by sleeping the rest, its
    CPU spent on the host's cores beside the emulated machines' (see
    ``harmony.dilation``)."""
    recs = list(records)
    if run_dilation(recs) <= 1:
        return False
    entries = [s for r in recs for s in r.get("setups") or () if isinstance(s, Sequence)]
    return bool(entries) and all(len(s) >= 3 and bool(s[2]) for s in entries)


def job_startup(rec: Mapping[str, Any]) -> tuple[float | None, float | None]:
    """A job's start-up on each machine (None where not recorded): from its
    start to its first epoch report, less that epoch's training and
    evaluation (undilated seconds, as the master's clock), and the CPU
    seconds of it, the median over its machines' ``setups`` ([wall, cpu,
    stretched] real seconds each, / the run's dilation where the start-up
    was not stretched: :func:`setup_cpu`). Start-ups differ by app and input: in one 8-job run they
    took 1.6-6.4 CPU s (NMF against Lasso)."""
    eps = rec.get("epochs") or []
    wall = None
    if eps and isinstance(rec.get("started"), (int, float)) and "time" in eps[0]:
        t = eps[0].get("timings") or {}
        w = float(eps[0]["time"]) - float(rec["started"]) - float(t.get("train", 0.0)) \
            - float(t.get("eval", 0.0))
        wall = w if w >= 0 else None
    cpus = [setup_cpu(s, float(rec.get("dilation") or 1.0)) for s in rec.get("setups") or ()
            if isinstance(s, Sequence) and len(s) >= 2 and isinstance(s[1], (int, float))
            and s[1] >= 0]
    cpu = statistics.median(cpus) if cpus else None
    if wall is not None and cpu is not None:
        cpu = min(cpu, wall)
    return wall, cpu


def jobs_from_status(records: Iterable[Mapping[str, Any]],
                     jobs_log: Iterable[Mapping[str, Any]] | None = None
                     ) -> tuple[list[TraceJob], list[str]]:
    """(trace jobs in arrival order, ids of the jobs skipped because they
    never ran) from status records, optionally with the rows of the
    master's ``jobs.jsonl`` (see the module docstring)."""
    recs = list(records)
    if not recs:
        return [], []
    t0 = min(float(r["submitted"]) for r in recs)
    by_job: dict[str, list] = {}
    for row in jobs_log or ():
        by_job.setdefault(str(row.get("job")), []).append(row)
    out, skipped = [], []
    for r in recs:
        j = job_from_status(r, t0, by_job.get(str(r["id"]), ()))
        if j is None:
            skipped.append(str(r["id"]))
        else:
            out.append(j)
    out.sort(key=lambda j: (j.arrival, j.id))
    return out, skipped


def with_dop_table(jobs: Iterable[TraceJob], runs: Iterable[Sequence[Mapping[str, Any]]],
                   comm: bool = True) -> list[TraceJob]:
    """``jobs`` with ``cpu_at`` and ``net_at`` filled in from runs of the
    same jobs (each run a list of status records, matched by ``name`` =
    dataset) at other DoPs than ``ref_dop``, the medians over each record's
    epochs after its first:

    - ``cpu_at``: the COMP's CPU seconds per iteration (``comp_cpu``, which
      a partner does not slow as it does the COMP's wall time) at each
      machine count relative to the same at ``ref_dop``, times ``cpu_s``.
      One DoP cannot tell how a job's COMP scales: MLR's COMP CPU per
      iteration on 1 machine was 1.2x its COMP on 2, where Eq 4.2 says 2x
      (its local passes over the model).
    - ``net_at``: the COMM (PULL + PUSH) seconds per iteration at each
      machine count, over the epochs it ran alone on its machines
      (``placement.epoch_samples``: no other job's stint overlapped half of
      it), as measured (COMM is not CPU work a partner could be told from).
      On 1 machine a job's COMM is the traffic to its own shard: Lasso's
      took 5 ms an iteration where the model's split of its COMM at DoP 2
      says 12.

    - ``eval_at``: the evaluation's CPU seconds per epoch of each machine
      (``eval_cpu``), at each machine count, where the runs have it at two
      or more. The evaluations did not split over the machines as
      ``eval_s`` / m says: MLR's took 0.054 s on 1 machine and 0.044 s on
      each of 2 (the replays had isolated-1's evaluations at 24.6 s summed
      against 14-15 s run).

    DoPs a job already has in a table are kept. ``comm=False``: ``cpu_at``
    only (``net_at`` as the job has it)."""
    cpu: dict[str, dict[int, list[float]]] = {}
    net: dict[str, dict[int, list[float]]] = {}
    evals: dict[str, dict[int, list[float]]] = {}
    for records in runs:
        records = list(records)
        alone = {(x.job, x.epoch) for x in epoch_samples(records) if x.size == 1}
        for r in records:
            # matched to trace jobs by name; epoch_samples names a record
            # without one by its id
            name, sample = str(r.get("name") or ""), str(r.get("name") or r.get("id"))
            for row in epoch_rows(r)[1:]:
                tm, n = row["timings"], len(row["workers"])
                iters = float(tm.get("iters") or 0)
                if not n or iters <= 0:
                    continue
                if isinstance(tm.get("comp_cpu"), (int, float)):
                    cpu.setdefault(name, {}).setdefault(n, []).append(
                        float(tm["comp_cpu"]) / iters)
                if isinstance(tm.get("eval_cpu"), (int, float)):
                    evals.setdefault(name, {}).setdefault(n, []).append(float(tm["eval_cpu"]))
                if comm and (sample, int(row.get("epoch") or 0)) in alone and all(
                        isinstance(tm.get(k), (int, float)) for k in ("pull", "push")):
                    net.setdefault(name, {}).setdefault(n, []).append(
                        (float(tm["pull"]) + float(tm["push"])) / iters)
    out = []
    for j in jobs:
        at = cpu.get(j.dataset, {})
        ref = statistics.median(at[j.ref_dop]) if at.get(j.ref_dop) else 0.0
        table = dict(j.cpu_at or ())
        for m, xs in at.items():
            if m != j.ref_dop and m not in table and ref > 0:
                table[m] = j.cpu_s * statistics.median(xs) / ref
        comm = dict(j.net_at or ())
        for m, xs in net.get(j.dataset, {}).items():
            if m != j.ref_dop and m not in comm:
                comm[m] = statistics.median(xs)
        ev = dict(j.eval_at or ())
        measured = evals.get(j.dataset, {})
        if len(set(measured) | set(ev)) > 1:
            for m, xs in measured.items():
                ev.setdefault(m, statistics.median(xs))
        out.append(replace(j, cpu_at=tuple(sorted(table.items())) or None,
                           net_at=tuple(sorted(comm.items())) or None,
                           eval_at=tuple(sorted(ev.items())) if len(ev) > 1 else j.eval_at))
    return out


def run_dilation(records: Iterable[Mapping[str, Any]]) -> float:
    """The dilation the records' run had (1 where not recorded); their
    times are undilated seconds either way. A mix of runs at different
    dilations is a ValueError."""
    ds = {float(r.get("dilation") or 1.0) for r in records}
    if len(ds) > 1:
        raise ValueError(f"status records of runs at different dilations "
                         f"({', '.join(f'{d:g}' for d in sorted(ds))}): import one run at a time")
    return ds.pop() if ds else 1.0


def import_run(status_paths: Sequence[str | os.PathLike], jobs_log: str | None = None,
               out: str | None = None) -> tuple[list[TraceJob], list[str]]:
    """``jobs_from_status`` on status files (and a ``jobs.jsonl``); writes the
    trace to ``out`` if given."""
    recs = [r for p in status_paths for r in load_status(p)]
    run_dilation(recs)
    jobs, skipped = jobs_from_status(recs, load_jobs_log(jobs_log) if jobs_log else None)
    if out:
        save_trace(jobs, out)
    return jobs, skipped


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harmony.sim.importer",
                                 description="a trace from 'harmony status --json' records")
    ap.add_argument("status", nargs="+", help="files of 'harmony status JOB --json' output")
    ap.add_argument("--jobs-log", default=None, help="the master's metrics/jobs.jsonl")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    jobs, skipped = import_run(a.status, a.jobs_log, a.out)
    print(f"{len(jobs)} jobs -> {a.out}" + (f"; skipped (never ran): {', '.join(skipped)}"
                                            if skipped else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
