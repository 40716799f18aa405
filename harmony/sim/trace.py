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
eval_s              no        seconds of evaluation per epoch (CPU), default 0
input_bytes         no        input size, default 0
model_bytes         no        model size, default 0
final_bytes         no        bytes the job's final checkpoint writes (its
                              model and the input arrays its app exports,
                              e.g. NMF's user factors); empty: model_bytes
machines            yes       machines the job asks for (its DoP in the
                              isolated and naive modes)
deadline            no        seconds after arrival
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

``fit_curve`` fits the first two kinds to measured points, recent points
weighted more, as SLAQ does.

Bad rows raise :class:`TraceError` naming the file, the line and the
column: a missing column, a non-numeric or negative number, an unknown app,
a bad curve, a duplicate id.

Scaling with DoP (``iteration_profile``) is the scheduler's own model,
``harmony.sched.model`` (no second copy here): COMP splits over the m
machines (Eq 4.2, ``t_cpu_at``) and COMM is a local part plus the remote
share (m-1)/m of the machine's bytes over its link (``t_net_at``).
"""
from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields

from harmony.sched.model import Profile, job_iter_time, t_cpu_at, t_net_at
from harmony.sched.throughput import best_dop

APPS = ("nmf", "lda", "mlr", "lasso", "torch_mlp", "minimal", "synthetic")

COLUMNS = ("id", "arrival", "app", "dataset", "iterations", "iters_per_epoch", "curve",
           "target", "cpu_s", "bytes", "ref_dop", "net_s", "link", "eval_s", "input_bytes",
           "model_bytes", "final_bytes", "machines", "deadline", "utility")
REQUIRED = ("id", "arrival", "app", "cpu_s", "bytes", "ref_dop", "machines")
HEADER_COMMENT = "# harmony trace v1"


class TraceError(ValueError):
    """A bad trace file or row: the message names the file, line and column."""


# ---------------------------------------------------------------- loss curves

CURVE_KINDS = ("sublinear", "linear", "points")


@dataclass(frozen=True)
class LossCurve:
    """The loss after k iterations (see the module docstring)."""
    kind: str
    params: tuple[float, ...]

    def __post_init__(self) -> None:
        p = self.params
        if self.kind not in CURVE_KINDS:
            raise ValueError(f"unknown curve kind {self.kind!r} (one of {', '.join(CURVE_KINDS)})")
        if not all(math.isfinite(x) for x in p):
            raise ValueError("curve parameters must be finite")
        if self.kind == "sublinear":
            if len(p) != 4:
                raise ValueError("sublinear takes 4 parameters a,b,c,d")
            if p[0] < 0 or p[1] < 0 or p[2] <= 0:
                raise ValueError("sublinear needs a >= 0, b >= 0, c > 0")
        elif self.kind == "linear":
            if len(p) != 3:
                raise ValueError("linear takes 3 parameters mu,b,c")
            if not 0 < p[0] < 1:
                raise ValueError("linear needs 0 < mu < 1")
        else:
            if len(p) < 2 or len(p) % 2:
                raise ValueError("points takes k:loss pairs")
            ks = p[0::2]
            if ks[0] < 0 or any(b <= a for a, b in zip(ks, ks[1:])):
                raise ValueError("points: k must be >= 0 and strictly increasing")

    @classmethod
    def parse(cls, spec: str) -> LossCurve:
        """From ``KIND:PARAMS`` (raises ValueError)."""
        kind, sep, rest = spec.strip().partition(":")
        if not sep:
            raise ValueError(f"curve {spec!r} is not KIND:PARAMS")
        kind = kind.strip()
        try:
            if kind == "points":
                vals: list[float] = []
                for pair in rest.split(","):
                    k, sep2, v = pair.partition(":")
                    if not sep2:
                        raise ValueError(f"points: {pair!r} is not k:loss")
                    vals += [float(k), float(v)]
            else:
                vals = [float(x) for x in rest.split(",")]
        except ValueError as exc:
            raise ValueError(f"curve {spec!r}: {exc}") from None
        return cls(kind, tuple(vals))

    def spec(self) -> str:
        """The ``KIND:PARAMS`` form (exact: floats as repr)."""
        if self.kind == "points":
            body = ",".join(f"{_num(k)}:{_num(v)}" for k, v in zip(self.params[0::2],
                                                                   self.params[1::2]))
        else:
            body = ",".join(_num(x) for x in self.params)
        return f"{self.kind}:{body}"

    def loss(self, k: float) -> float:
        """The loss after ``k`` iterations."""
        p = self.params
        if self.kind == "sublinear":
            a, b, c, d = p
            return 1.0 / (a * k * k + b * k + c) + d
        if self.kind == "linear":
            mu, b, c = p
            return mu ** (k - b) + c
        ks, ls = p[0::2], p[1::2]
        if k <= ks[0]:
            return ls[0]
        for i in range(1, len(ks)):
            if k <= ks[i]:
                f = (k - ks[i - 1]) / (ks[i] - ks[i - 1])
                return ls[i - 1] + f * (ls[i] - ls[i - 1])
        return ls[-1]

    @property
    def floor(self) -> float:
        """The loss the curve tends to (its last point for ``points``)."""
        if self.kind == "sublinear":
            a, b, _, d = self.params
            return d if (a > 0 or b > 0) else self.loss(0)
        if self.kind == "linear":
            return self.params[2]
        return self.params[-1]

    def iterations_to(self, target: float) -> int | None:
        """The fewest whole iterations k >= 0 with ``loss(k) <= target``;
        None if the curve never gets there."""
        if self.loss(0) <= target:
            return 0
        p = self.params
        if self.kind == "sublinear":
            a, b, c, d = p
            if target <= d or (a == 0 and b == 0):
                return None
            need = 1.0 / (target - d)          # a k^2 + b k + c >= need
            if a > 0:
                k = (-b + math.sqrt(b * b + 4 * a * (need - c))) / (2 * a)
            else:
                k = (need - c) / b
        elif self.kind == "linear":
            mu, b, c = p
            if target <= c:
                return None
            k = b + math.log(target - c) / math.log(mu)
        else:
            ks = p[0::2]
            k = None
            for i in range(1, len(ks)):   # first segment that reaches the target
                lo, hi = ks[i - 1], ks[i]
                if self.loss(hi) <= target:
                    while hi - lo > 1e-9 * max(1.0, hi):
                        mid = (lo + hi) / 2
                        lo, hi = (lo, mid) if self.loss(mid) <= target else (mid, hi)
                    k = hi
                    break
            if k is None:
                return None
        n = max(0, math.ceil(k - 1e-9))
        while self.loss(n) > target:          # rounding at the boundary
            n += 1
        while n > 0 and self.loss(n - 1) <= target:
            n -= 1
        return n

    def scaled(self, factor: float) -> LossCurve:
        """The same curve stretched ``factor`` times along k: new.loss(k) ==
        self.loss(k / factor) (e.g. a curve per epoch to one per iteration
        with factor = iterations per epoch)."""
        if factor <= 0:
            raise ValueError("factor must be > 0")
        p = self.params
        if self.kind == "sublinear":
            a, b, c, d = p
            return LossCurve("sublinear", (a / factor ** 2, b / factor, c, d))
        if self.kind == "linear":
            mu, b, c = p
            return LossCurve("linear", (mu ** (1.0 / factor), b * factor, c))
        return LossCurve("points", tuple(x * factor if i % 2 == 0 else x
                                         for i, x in enumerate(p)))


def fit_curve(ks: Sequence[float], losses: Sequence[float], kind: str = "sublinear",
              decay: float = 0.9) -> LossCurve:
    """Fit SLAQ's ``sublinear`` or ``linear`` model to measured (k, loss)
    points by weighted least squares; the point i of n weighs
    ``decay**(n-1-i)`` (recent points count more, as in SLAQ). ``points``
    returns the points themselves."""
    import numpy as np
    from scipy.optimize import least_squares, nnls

    k = np.asarray(ks, dtype=float)
    y = np.asarray(losses, dtype=float)
    if len(k) != len(y) or len(k) < 2:
        raise ValueError("need at least 2 points, as many k as losses")
    if kind == "points":
        return LossCurve("points", tuple(float(v) for pair in zip(k, y) for v in pair))
    w = np.sqrt(decay ** np.arange(len(k) - 1, -1, -1))
    span = max(float(y.max() - y.min()), 1e-12)
    if kind == "sublinear":
        best = None
        # for a fixed floor d, 1/(y-d) = a k^2 + b k + c is linear in (a,b,c)
        # (non-negative least squares); the floor by a grid, then refined
        for frac in np.concatenate([np.geomspace(1e-4, 10, 40)]):
            d = float(y.min() - frac * span)
            A = np.stack([k * k, k, np.ones_like(k)], axis=1)
            coef, _ = nnls(A * w[:, None], w / (y - d))
            coef[2] = max(coef[2], 1e-12)
            r = float(np.sum((w * (1 / (A @ coef) + d - y)) ** 2))
            if best is None or r < best[0]:
                best = (r, (*coef, d))
        x0 = np.array(best[1], dtype=float)
        scale = np.maximum(np.abs(x0), 1e-12)

        def res(z):
            a, b, c, d = z * scale
            return w * (1.0 / (a * k * k + b * k + c) + d - y)
        lb = np.array([0.0, 0.0, 1e-12 / scale[2], -np.inf])
        sol = least_squares(res, x0 / scale, bounds=(lb, np.full(4, np.inf)))
        z = sol.x * scale if sol.success and np.sum(sol.fun ** 2) <= best[0] else x0
        a, b, c, d = (float(v) for v in z)
        return LossCurve("sublinear", (max(a, 0.0), max(b, 0.0), max(c, 1e-12), d))
    if kind == "linear":
        c0 = float(y.min() - 0.05 * span)
        mu0 = min(0.99, max(0.01, float(((y[-1] - c0) / (y[0] - c0)) ** (1 / max(k[-1] - k[0], 1)))))
        b0 = float(k[0] - math.log(max(y[0] - c0, 1e-12)) / math.log(mu0))

        def res(z):
            mu, b, c = z
            return w * (mu ** (k - b) + c - y)
        sol = least_squares(res, [mu0, b0, c0],
                            bounds=([1e-9, -np.inf, -np.inf], [1 - 1e-9, np.inf, np.inf]))
        mu, b, c = (float(v) for v in sol.x)
        return LossCurve("linear", (mu, b, c))
    raise ValueError(f"cannot fit a {kind!r} curve (sublinear, linear or points)")


# ---------------------------------------------------------------- utility

@dataclass(frozen=True)
class Utility:
    """A job's utility of its completion time: ``const`` (one parameter, the
    value whatever the JCT) or ``sigmoid`` (g1, g2, g3: OASiS's
    g1 / (1 + exp(g2 (t - g3))) of the JCT t)."""
    kind: str
    params: tuple[float, ...]

    def __post_init__(self) -> None:
        n = {"const": 1, "sigmoid": 3}.get(self.kind)
        if n is None:
            raise ValueError(f"unknown utility kind {self.kind!r} (a number or sigmoid:g1,g2,g3)")
        if len(self.params) != n or not all(math.isfinite(x) for x in self.params):
            raise ValueError(f"{self.kind} utility takes {n} finite parameter(s)")

    @classmethod
    def parse(cls, spec: str) -> Utility:
        s = spec.strip()
        kind, sep, rest = s.partition(":")
        try:
            if not sep:
                return cls("const", (float(s),))
            return cls(kind.strip(), tuple(float(x) for x in rest.split(",")))
        except ValueError as exc:
            raise ValueError(f"utility {spec!r}: {exc}") from None

    def spec(self) -> str:
        if self.kind == "const":
            return _num(self.params[0])
        return f"{self.kind}:" + ",".join(_num(x) for x in self.params)

    def value(self, jct: float) -> float:
        if self.kind == "const":
            return self.params[0]
        g1, g2, g3 = self.params
        z = g2 * (jct - g3)
        return 0.0 if z > 700 else g1 / (1.0 + math.exp(z))


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
    deadline: float | None = None
    utility: Utility | None = None

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
    return Profile(job.id, job.cpu_s, t_net, job.ref_dop, remote)


def iteration_profile(job: TraceJob, m: float, bandwidth: float | None) -> tuple[float, float]:
    """(COMP seconds, COMM seconds) per iteration of ``job`` on ``m``
    machines with links of ``bandwidth`` bytes/s, alone (no contention):
    ``t_cpu_at`` and ``t_net_at`` of ``harmony.sched.model`` on
    ``sched_profile(job, bandwidth)``. COMP = cpu_s * ref_dop / m; COMM =
    local + bytes/bandwidth * (m-1)/m."""
    if m < 1:
        raise ValueError("m must be >= 1")
    p = sched_profile(job, bandwidth)
    return t_cpu_at(p, m), t_net_at(p, m)


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
          "model_bytes", "final_bytes", "deadline"}


def _num(x: float | int) -> str:
    if isinstance(x, int) and not isinstance(x, bool):
        return str(x)
    x = float(x)
    return str(int(x)) if x.is_integer() and abs(x) < 1e15 else repr(x)


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
            elif isinstance(v, (int, float)):
                out.append(_num(v))
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
