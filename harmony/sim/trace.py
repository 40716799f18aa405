"""Job-stream traces for the simulator: a CSV schema, loss curves, and the
scaling of a job's per-iteration profile with its DoP.

A trace is a CSV file, one job per row, with a header row naming the
columns (any order). Lines starting with ``#`` and blank lines are ignored
(``save_trace`` writes a ``# harmony trace v1`` line first). Times are
seconds, sizes bytes, rates bytes per second. An empty cell is "not given".

==================  ========  ===============================================
column              required  meaning
==================  ========  ===============================================
id                  yes       job id, unique in the trace
arrival             yes       submission time, seconds from the trace start
app                 yes       ``nmf``, ``lda``, ``mlr``, ``lasso``,
                              ``torch_mlp``, ``minimal`` or ``synthetic``
dataset             no        free text (e.g. ``netflix64x``); for reports
iterations          (1)       iterations (PULL-COMP-PUSH) the job runs
iters_per_epoch     no        iterations per epoch (default 1); a job pauses,
                              checkpoints and reports its objective at epoch
                              ends only
curve               (1)       loss after k iterations, ``KIND:PARAMS`` (below)
target              (1)       the job stops once ``curve`` reaches this loss
cpu_s               yes       COMP seconds per iteration on each machine when
                              the job runs on ``ref_dop`` machines
bytes               yes       PULL + PUSH data bytes per iteration of one
                              machine (local and remote; the master's
                              ``profile["bytes"]``)
ref_dop             yes       the DoP ``cpu_s`` (and ``net_s``) was measured at
net_s               no        measured COMM seconds per iteration at
                              ``ref_dop``; empty: all COMM is transfer time
                              (see ``iteration_profile``)
link                no        link rate (bytes/s) ``net_s`` was measured at;
                              empty: the simulated link
eval_s              no        seconds of evaluation per epoch: its CPU on one
                              machine, split over the job's m machines; the
                              simulator adds a pull of the model (one PULL's
                              COMM) before it. Default 0
input_bytes         no        input size, default 0
model_bytes         no        model size, default 0
final_bytes         no        bytes the job's final checkpoint writes (its
                              model and the input arrays its app exports,
                              e.g. NMF's user factors); empty: model_bytes
ckpt_bytes          no        bytes a periodic checkpoint (or a pause) writes,
                              all parts together (the model and the input
                              state the app declares mutable; the whole input
                              when it declares none); empty: model_bytes +
                              input_bytes
machines            yes       machines the job asks for (its DoP in the
                              isolated and naive modes)
deadline            no        seconds after arrival
startup_s           no        seconds from launch to a ready executor on each
                              machine, measured; empty: the simulated
                              machines' (``Contention.startup``)
startup_cpu_s       no        the CPU seconds of that start-up (imports,
                              parsing the input), which compete with the
                              COMPs beside it; empty: the machines'
comm_cpu_s          no        CPU seconds per iteration its COMM costs each
                              machine at ``ref_dop`` (framing, encryption,
                              I/O threads, serving the other machines),
                              measured; it runs beside the COMPs there.
                              Empty: only the traffic to the machine's own
                              shard (COMM at DoP 1) is CPU work
cpu_at              no        COMP seconds per iteration measured at other
                              DoPs, ``m:seconds,m:seconds`` (e.g. ``1:0.21``):
                              at those DoPs the job's COMP is that, and at
                              any other DoP it scales as 1/m from the nearest
                              measured one. A job's COMP need not split as
                              Eq 4.2 says: MLR's local passes over its model
                              are done on every machine. Empty: 1/m from
                              ``cpu_s`` at ``ref_dop``
net_at              no        COMM seconds per iteration measured at other
                              DoPs, alone on the machines, the same form: at
                              those DoPs the job's COMM is that, and at any
                              other DoP the nearest measurement (``net_s`` at
                              ``ref_dop`` included) plus the model's change
                              from there. A job's COMM on 1 machine is its
                              traffic to its own shard, which the model can
                              only split off a measurement at DoP 2 by
                              assumption (Lasso's: 5 ms measured, 12 ms by
                              the split). Empty: the model from ``net_s``
eval_at             no        evaluation CPU seconds per epoch of each
                              machine, measured at DoPs, the same form: at
                              any DoP the nearest measurement's, unscaled.
                              The apps' evaluations do not split over their
                              machines as ``eval_s`` assumes: MLR's took
                              0.054 s on 1 machine and 0.044 s on each of 2,
                              NMF's 0.011 s on 1 and 0.009 s on each of 4.
                              Empty: ``eval_s`` / m
utility             no        a number (a constant utility / weight) or
                              ``sigmoid:g1,g2,g3`` (OASiS: g1/(1+exp(g2(t-g3)))
                              of the JCT t)
==================  ========  ===============================================

(1) ``iterations``, or ``curve`` and ``target`` (the first iteration at which
the curve reaches the target), or all three (``iterations`` wins; the curve
then still tells a loss-aware policy such as SLAQ what each iteration gains).

Loss curves (``curve``), k = iterations done (k >= 0):

* ``sublinear:a,b,c,d``  ``1/(a k^2 + b k + c) + d`` (SLAQ's model for
  sublinear optimizers: SGD, Gibbs sampling); a, b >= 0, c > 0
* ``linear:mu,b,c``      ``mu^(k - b) + c`` (SLAQ's linear / superlinear
  model), 0 < mu < 1
* ``points:k:l,k:l,...`` measured (iteration, loss) points, k strictly
  increasing; linear in between, the last value after the last point

The curves and utilities are :mod:`harmony.policies.curves` (the policies
use them too); its ``fit_curve`` fits the first two kinds to measured
points, recent points weighted more, as SLAQ does.

Bad rows raise :class:`TraceError` naming the file, the line and the
column: a missing column, a non-numeric or negative number, an unknown app,
a bad curve, a duplicate id.

Scaling with DoP (``iteration_profile``) is the scheduler's own model,
``harmony.sched.model`` (no second copy here): COMP splits over the m
machines (Eq 4.2, ``t_cpu_at``) and COMM is a local part plus the remote
share (m-1)/m of the machine's bytes over its link (``t_net_at``); where
``cpu_at`` measured COMP at other DoPs, the nearest measurement scales.
"""
from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields

from harmony.policies.curves import LossCurve, Utility, num_spec
from harmony.sched.model import Profile, job_iter_time, t_cpu_at, t_net_at
from harmony.sched.throughput import best_dop

APPS = ("nmf", "lda", "mlr", "lasso", "torch_mlp", "minimal", "synthetic")

COLUMNS = ("id", "arrival", "app", "dataset", "iterations", "iters_per_epoch", "curve",
           "target", "cpu_s", "bytes", "ref_dop", "net_s", "link", "eval_s", "input_bytes",
           "model_bytes", "final_bytes", "ckpt_bytes", "machines", "deadline", "utility",
           "startup_s", "startup_cpu_s", "comm_cpu_s", "cpu_at", "net_at", "eval_at")
REQUIRED = ("id", "arrival", "app", "cpu_s", "bytes", "ref_dop", "machines")
HEADER_COMMENT = "# harmony trace v1"


class TraceError(ValueError):
    """A bad trace file or row: the message names the file, line and column."""


# ---------------------------------------------------------------- jobs

@dataclass(frozen=True)
class TraceJob:
    """One row of a trace (the columns of the module docstring).
    ``iterations`` is always set: from the row, or from ``curve`` and
    ``target``."""
    id: str
    arrival: float
    app: str
    iterations: int
    cpu_s: float
    bytes: float
    ref_dop: int
    machines: int
    dataset: str = ""
    iters_per_epoch: int = 1
    curve: LossCurve | None = None
    target: float | None = None
    net_s: float | None = None
    link: float | None = None
    eval_s: float = 0.0
    input_bytes: float = 0.0
    model_bytes: float = 0.0
    final_bytes: float | None = None
    ckpt_bytes: float | None = None
    deadline: float | None = None
    utility: Utility | None = None
    startup_s: float | None = None
    startup_cpu_s: float | None = None
    comm_cpu_s: float | None = None
    cpu_at: tuple[tuple[int, float], ...] | None = None
    net_at: tuple[tuple[int, float], ...] | None = None
    eval_at: tuple[tuple[int, float], ...] | None = None

    def __post_init__(self) -> None:
        bad = [f.name for f in fields(self) if f.name != "target"
               and isinstance(getattr(self, f.name), (int, float))
               and not isinstance(getattr(self, f.name), bool)
               and (getattr(self, f.name) < 0 or not math.isfinite(getattr(self, f.name)))]
        if bad:
            raise ValueError(f"job {self.id}: {', '.join(bad)} must be finite and >= 0")
        if self.ref_dop < 1 or self.machines < 1 or self.iters_per_epoch < 1:
            raise ValueError(f"job {self.id}: ref_dop, machines and iters_per_epoch must be >= 1")
        if self.link is not None and self.link <= 0:
            raise ValueError(f"job {self.id}: link must be > 0")
        if self.app not in APPS:
            raise ValueError(f"job {self.id}: unknown app {self.app!r} (one of {', '.join(APPS)})")
        for col in ("cpu_at", "net_at", "eval_at"):
            table = getattr(self, col)
            if table is not None and not all(
                    isinstance(m, int) and m >= 1 and math.isfinite(c) and c >= 0
                    for m, c in table):
                raise ValueError(f"job {self.id}: {col} needs DoPs >= 1 and seconds >= 0")

    @property
    def epochs(self) -> int:
        """Epochs it runs (the last one may be partial)."""
        return -(-self.iterations // self.iters_per_epoch)

    def loss(self, k: float) -> float | None:
        """Its loss after ``k`` iterations, if it has a curve."""
        return None if self.curve is None else self.curve.loss(k)


def sched_profile(job: TraceJob, bandwidth: float | None) -> Profile:
    """The job's profile as the scheduler sees it (``harmony.sched.model``):
    measured at ``ref_dop``, with ``remote`` = bytes / bandwidth, the seconds
    per iteration to move all of one machine's bytes over a simulated link of
    ``bandwidth`` bytes/s (None or 0: no network model, remote = 0).

    COMM at ``ref_dop`` is the local part of the measurement plus the remote
    share of the bytes at the simulated link: with ``net_s`` measured on
    ``link`` (default: the simulated link), local = max(0, net_s -
    bytes/link * (ref_dop-1)/ref_dop); without ``net_s`` it is 0."""
    remote = job.bytes / bandwidth if bandwidth else 0.0
    if job.net_s is None:
        base = 0.0
    else:
        link = job.link or bandwidth
        measured_remote = job.bytes / link if link else 0.0
        base = max(0.0, job.net_s - measured_remote * (job.ref_dop - 1) / job.ref_dop)
    t_net = base + remote * (job.ref_dop - 1) / job.ref_dop
    return Profile(job.id, job.cpu_s, t_net, job.ref_dop, remote,
                   comm_cpu=job.comm_cpu_s or 0.0)


def iteration_profile(job: TraceJob, m: float, bandwidth: float | None) -> tuple[float, float]:
    """(COMP seconds, COMM seconds) per iteration of ``job`` on ``m``
    machines with links of ``bandwidth`` bytes/s, alone (no contention):
    ``t_cpu_at`` and ``t_net_at`` of ``harmony.sched.model`` on
    ``sched_profile(job, bandwidth)``. COMP = cpu_s * ref_dop / m, or from
    the measured DoP (``ref_dop`` or one of ``cpu_at``) nearest m, c * m' /
    m; COMM = local + bytes/bandwidth * (m-1)/m, or from the measured DoP
    (``ref_dop`` or one of ``net_at``) nearest m, its COMM plus the model's
    change from there to m."""
    if m < 1:
        raise ValueError("m must be >= 1")
    p = sched_profile(job, bandwidth)
    if job.cpu_at:
        dop, c = _nearest(job.ref_dop, job.cpu_s, job.cpu_at, m)
        t_cpu = c * dop / m
    else:
        t_cpu = t_cpu_at(p, m)
    t_net = t_net_at(p, m)
    if job.net_at:
        dop, n = _nearest(job.ref_dop, t_net_at(p, job.ref_dop), job.net_at, m)
        t_net = max(0.0, n + t_net - t_net_at(p, dop))
    return t_cpu, t_net


def _nearest(ref: int, at_ref: float, table: tuple[tuple[int, float], ...], m: float
             ) -> tuple[int, float]:
    """The (DoP, seconds) of ``table`` or (``ref``, ``at_ref``) nearest m,
    the smaller DoP on a tie."""
    return min(((ref, at_ref), *table), key=lambda x: (abs(x[0] - m), x[0]))


def eval_per_machine(job: TraceJob, m: int) -> float:
    """The evaluation's CPU seconds per epoch on each of ``m`` machines: the
    ``eval_at`` measurement at the DoP nearest m (the smaller on a tie),
    else ``eval_s`` / m."""
    if job.eval_at:
        (ref, at_ref), *rest = job.eval_at
        return _nearest(ref, at_ref, tuple(rest), m)[1]
    return job.eval_s / m


@dataclass(frozen=True)
class Ceiling:
    """What no schedule of a trace can beat on ``machines`` machines (see
    :func:`ceiling`): the makespan's lower bound in seconds, the job that
    sets it, and the CPU utilization that bound caps."""
    makespan: float
    job: str
    cpu: float          # the COMP work / (machines x makespan)


def ceiling(trace: Sequence[TraceJob], machines: int, bandwidth: float | None) -> Ceiling:
    """Bounds any schedule of ``trace`` obeys, from the scheduler's own model.

    The makespan (last end less first arrival) is at least every job's
    arrival plus its run alone at its fastest DoP on up to all ``machines``
    (a group or a contended machine only slows a job down; a policy may
    lend a job more machines than it asked for), and at least the COMP work
    spread over all machines. COMP work in machine-seconds does not depend
    on the DoP (Eq 4.2: ``t_cpu`` x m is constant), so CPU utilization over
    the run is at most that work / (machines x the bound). Evaluation and
    start-up CPU, which a run adds, are left out. The network has no such
    bound: its remote bytes grow with the DoP a policy picks."""
    if not trace or machines < 1:
        raise ValueError("ceiling needs jobs and at least one machine")
    t0 = min(j.arrival for j in trace)
    cpu = 0.0
    end, who = 0.0, trace[0].id
    for j in trace:
        p = sched_profile(j, bandwidth)
        cpu += j.iterations * t_cpu_at(p, 1)
        m = best_dop(p, machines, 0.0)
        alone = j.iterations * job_iter_time(p, m)
        if j.arrival - t0 + alone > end:
            end, who = j.arrival - t0 + alone, j.id
    span = max(end, cpu / machines)
    return Ceiling(span, who, cpu / (machines * span) if span > 0 else 0.0)


# ---------------------------------------------------------------- CSV

_INT = {"iterations", "iters_per_epoch", "ref_dop", "machines"}
_FLOAT = {"arrival", "target", "cpu_s", "bytes", "net_s", "link", "eval_s", "input_bytes",
          "model_bytes", "final_bytes", "ckpt_bytes", "deadline", "startup_s", "startup_cpu_s",
          "comm_cpu_s"}


def _dop_table(text: str) -> tuple[tuple[int, float], ...]:
    """``m:seconds,...`` as ((m, seconds), ...), sorted by m; ValueError
    on a bad or repeated entry."""
    out: dict[int, float] = {}
    for part in text.split(","):
        m, sep, c = part.strip().partition(":")
        if not sep:
            raise ValueError(f"{part.strip()!r} is not DOP:SECONDS")
        dop, sec = float(m), float(c)
        if not dop.is_integer() or dop < 1 or not math.isfinite(sec) or sec < 0:
            raise ValueError(f"{part.strip()!r}: the DoP must be a whole number >= 1 and "
                             f"the seconds finite and >= 0")
        if int(dop) in out:
            raise ValueError(f"DoP {int(dop)} appears twice")
        out[int(dop)] = sec
    return tuple(sorted(out.items()))


def load_trace(path: str | os.PathLike) -> list[TraceJob]:
    """The jobs of the trace at ``path``, in file order (raises TraceError,
    naming file:line and column, on the first bad row)."""
    with open(path, newline="") as fh:
        text = fh.read()
    return parse_trace(text, str(path))


def parse_trace(text: str, name: str = "<trace>") -> list[TraceJob]:
    """``load_trace`` on the text of a trace file."""
    header: list[str] | None = None
    jobs: list[TraceJob] = []
    seen: dict[str, int] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        cells = [c.strip() for c in next(csv.reader([line]))]
        if header is None:
            header = cells
            unknown = [c for c in header if c not in COLUMNS]
            if unknown:
                raise TraceError(f"{name}:{lineno}: unknown column {unknown[0]!r} "
                                 f"(columns: {', '.join(COLUMNS)})")
            dup = [c for c in header if header.count(c) > 1]
            if dup:
                raise TraceError(f"{name}:{lineno}: column {dup[0]!r} appears twice")
            missing = [c for c in REQUIRED if c not in header]
            if missing:
                raise TraceError(f"{name}:{lineno}: missing column {missing[0]!r} "
                                 f"(required: {', '.join(REQUIRED)})")
            continue
        if len(cells) != len(header):
            raise TraceError(f"{name}:{lineno}: {len(cells)} cells, the header has "
                             f"{len(header)}")
        job = _row(dict(zip(header, cells)), f"{name}:{lineno}")
        if job.id in seen:
            raise TraceError(f"{name}:{lineno}: column 'id': duplicate id {job.id!r} "
                             f"(line {seen[job.id]})")
        seen[job.id] = lineno
        jobs.append(job)
    if header is None:
        raise TraceError(f"{name}: no header row")
    return jobs


def _row(row: dict[str, str], where: str) -> TraceJob:
    def err(col: str, msg: str) -> TraceError:
        return TraceError(f"{where}: column {col!r}: {msg}")

    kw: dict = {}
    for col in REQUIRED:
        if not row.get(col):
            raise err(col, "empty (required)")
    for col, s in row.items():
        if s == "":
            continue
        if col in _INT or col in _FLOAT:
            try:
                v = float(s)
            except ValueError:
                raise err(col, f"{s!r} is not a number") from None
            if not math.isfinite(v):
                raise err(col, f"{s!r} is not a finite number")
            if v < 0 and col != "target":      # a loss may be negative
                raise err(col, f"{s!r} is negative")
            if col in _INT:
                if not v.is_integer():
                    raise err(col, f"{s!r} is not a whole number")
                v = int(v)
                if v < 1:
                    raise err(col, f"{s!r} must be >= 1")
            if col == "link" and v <= 0:
                raise err(col, "must be > 0")
            kw[col] = v
        elif col == "app":
            if s not in APPS:
                raise err(col, f"unknown app {s!r} (one of {', '.join(APPS)})")
            kw[col] = s
        elif col == "curve":
            try:
                kw[col] = LossCurve.parse(s)
            except ValueError as exc:
                raise err(col, str(exc)) from None
        elif col == "utility":
            try:
                kw[col] = Utility.parse(s)
            except ValueError as exc:
                raise err(col, str(exc)) from None
        elif col in ("cpu_at", "net_at", "eval_at"):
            try:
                kw[col] = _dop_table(s)
            except ValueError as exc:
                raise err(col, str(exc)) from None
        else:
            kw[col] = s
    if "iterations" not in kw:
        curve, target = kw.get("curve"), kw.get("target")
        if curve is None or target is None:
            raise err("iterations", "empty, and no curve and target to derive it from")
        n = curve.iterations_to(target)
        if n is None:
            raise err("target", f"the curve never reaches {target!r} (it tends to "
                                f"{curve.floor!r})")
        kw["iterations"] = max(1, n)
    try:
        return TraceJob(**kw)
    except ValueError as exc:
        raise TraceError(f"{where}: {exc}") from None


def dumps_trace(jobs: Iterable[TraceJob]) -> str:
    """The CSV text ``save_trace`` writes."""
    buf = io.StringIO()
    buf.write(HEADER_COMMENT + "\n")
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(COLUMNS)
    for j in jobs:
        out = []
        for col in COLUMNS:
            v = getattr(j, col)
            if v is None:
                out.append("")
            elif isinstance(v, (LossCurve, Utility)):
                out.append(v.spec())
            elif col in ("cpu_at", "net_at", "eval_at"):
                out.append(",".join(f"{m}:{num_spec(c)}" for m, c in v))
            elif isinstance(v, (int, float)):
                out.append(num_spec(v))
            else:
                out.append(str(v))
        w.writerow(out)
    return buf.getvalue()


def save_trace(jobs: Iterable[TraceJob], path: str | os.PathLike) -> None:
    """Write ``jobs`` as a trace CSV (all columns; ``load_trace`` reads back
    equal jobs)."""
    text = dumps_trace(jobs)
    with open(path, "w", newline="") as fh:
        fh.write(text)
