"""Simulation results: what a run produced (``SimResult``), its statistics,
JSON output, a side-by-side table of policies and PNG plots.

- ``summarize(result)``: number of jobs, mean / median / p95 JCT (p95 by
  linear interpolation between order statistics, numpy's default), makespan
  (last end less first arrival), and the average CPU and network
  utilization (the utilization samples weighted by their bucket length);
  SLAQ's metric, the average normalized loss of the active jobs over time
  (``avg_norm_loss``, :func:`norm_loss_series`), and OASiS's, the total
  utility of the JCTs (``total_utility``, :func:`total_utility`).
- ``write_result(result, out_dir)``: ``<out_dir>/<name>.json`` with the
  result and its summary (``read_result`` reads it back).
- ``compare_table(results, baseline="isolated")``: a ``rich`` table, one row
  per policy, with ratios to the baseline (baseline / value for times, so
  2.0x means twice as fast; value / baseline for utilization).
- ``write_plots(results, out_dir)``: ``jct_cdf.png`` (JCT CDF per policy)
  and ``utilization.png`` (CPU and network utilization over time, one panel
  per policy), matplotlib's Agg backend.
- ``sim_progress(total)``: a ``rich`` progress bar for long runs.
"""
from __future__ import annotations

import contextlib
import io
import json
import math
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class JobResult:
    """One job of a simulation: ``arrival`` (submitted), ``start`` (first
    ran), ``end`` (finished), seconds of simulated time; ``machines``: its
    machine count over time as (time, count) pairs, optional.

    For the quality metrics, optional: ``loss``, the objective it reported
    after each epoch as (time, loss) pairs; ``loss_range``, (initial, final)
    loss of its curve (the loss before any iteration and after all the
    iterations it was submitted with), which normalizes ``loss`` to 1 ..
    0; ``utility``, a :class:`harmony.policies.curves.Utility` spec of its JCT."""
    id: str
    app: str
    arrival: float
    start: float
    end: float
    machines: list[tuple[float, int]] = field(default_factory=list)
    loss: list[tuple[float, float]] = field(default_factory=list)
    loss_range: tuple[float, float] | None = None
    utility: str = ""

    @property
    def jct(self) -> float:
        """Job completion time: end less arrival."""
        return self.end - self.arrival


@dataclass
class UtilSample:
    """Cluster utilization in the bucket [t, t + dt): the busy fraction of
    all machines' CPUs and of all their links (0..1)."""
    t: float
    dt: float
    cpu: float
    net: float


@dataclass
class SimDecision:
    """A scheduling decision at simulated time ``t``: its note and details."""
    t: float
    note: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class SimResult:
    """What one simulation run produced. ``makespan`` None: computed from
    the jobs (last end less first arrival)."""
    policy: str
    jobs: list[JobResult]
    util: list[UtilSample] = field(default_factory=list)
    decisions: list[SimDecision] = field(default_factory=list)
    mode: str = ""
    machines: int = 0
    makespan: float | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def get_makespan(self) -> float:
        if self.makespan is not None:
            return self.makespan
        if not self.jobs:
            return 0.0
        return max(j.end for j in self.jobs) - min(j.arrival for j in self.jobs)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["makespan"] = self.get_makespan()
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SimResult:
        return cls(policy=d["policy"], mode=d.get("mode", ""), machines=d.get("machines", 0),
                   makespan=d.get("makespan"), meta=dict(d.get("meta", {})),
                   jobs=[JobResult(**{**j, "machines": [tuple(x) for x in j.get("machines", [])],
                                      "loss": [tuple(x) for x in j.get("loss", [])],
                                      "loss_range": tuple(j["loss_range"])
                                      if j.get("loss_range") else None})
                         for j in d["jobs"]],
                   util=[UtilSample(**u) for u in d.get("util", [])],
                   decisions=[SimDecision(**x) for x in d.get("decisions", [])])


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100), linear between order statistics."""
    if not values:
        return math.nan
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def normalized(job: JobResult, loss: float) -> float:
    """(loss - final) / (initial - final) of ``job``'s ``loss_range``,
    clipped to [0, 1] (1: no progress, 0: its full training's loss)."""
    assert job.loss_range is not None
    first, final = job.loss_range
    if first == final:
        return 0.0
    return min(1.0, max(0.0, (loss - final) / (first - final)))


def norm_loss_series(result: SimResult) -> list[tuple[float, float, int]]:
    """SLAQ's Figure 7(a): the average normalized loss of the active jobs
    over time, as (t, average, active jobs) steps, each holding until the
    next. A job is active from its arrival to its end (waiting, paused and
    running alike); it counts 1.0 until it reports its first loss (SLAQ: "a
    new job's initial loss is 1.0"), then its last reported loss normalized
    by :func:`normalized`. Only jobs with a ``loss_range`` (a loss curve)
    count; a job stopped early (mlfs-c) leaves the average at its end, like
    any other, whatever loss it stopped at."""
    ev: list[tuple[float, int, float, int]] = []   # (t, order, delta value, delta count)
    for j in result.jobs:
        if j.loss_range is None or not j.arrival == j.arrival:
            continue
        end = j.end if j.end == j.end else math.inf
        ev.append((j.arrival, 0, 1.0, 1))
        cur = 1.0
        for t, loss in j.loss:
            if t >= end:
                t = end
            v = normalized(j, loss)
            ev.append((t, 1, v - cur, 0))
            cur = v
        if end < math.inf:
            ev.append((end, 2, -cur, -1))
    ev.sort(key=lambda e: (e[0], e[1]))
    out: list[tuple[float, float, int]] = []
    total, n = 0.0, 0
    for i, (t, _, dv, dn) in enumerate(ev):
        total += dv
        n += dn
        if i + 1 < len(ev) and ev[i + 1][0] == t:
            continue
        point = (t, total / n if n else 0.0, n)
        if out and out[-1][0] == t:
            out[-1] = point
        else:
            out.append(point)
    return out


def avg_norm_loss(result: SimResult) -> float:
    """The time average of :func:`norm_loss_series` over the time some job
    with a loss curve is active (SLAQ's headline metric; nan: no such job)."""
    s = norm_loss_series(result)
    num = den = 0.0
    for (t0, avg, n), (t1, _, _) in zip(s, s[1:]):
        if n:
            num += avg * (t1 - t0)
            den += t1 - t0
    return num / den if den else math.nan


def total_utility(result: SimResult) -> float:
    """OASiS's objective: the sum over finished jobs of their utility of
    their JCT (``JobResult.utility``; nan: no job has one)."""
    from harmony.policies.curves import Utility

    vals = [Utility.parse(j.utility).value(j.jct) for j in result.jobs
            if j.utility and j.end == j.end]
    return sum(vals) if vals else math.nan


def loss_integral(job: JobResult) -> float:
    """The integral of ``job``'s normalized loss over its life, arrival to
    end (1.0 until its first report; nan if it has no curve or no end):
    normalized-loss seconds, which a schedule lowers by making a job's
    early progress sooner and by ending it sooner."""
    if job.loss_range is None or not job.end == job.end:
        return math.nan
    total, t, v = 0.0, job.arrival, 1.0
    for at, loss in job.loss:
        at = min(at, job.end)
        total += v * (at - t)
        t, v = at, normalized(job, loss)
    return total + v * (job.end - t)


def time_to(job: JobResult, reduction: float) -> float:
    """Seconds from ``job``'s arrival until it reported ``reduction`` (0..1)
    of its loss reduction, i.e. a normalized loss <= 1 - reduction (SLAQ's
    "time to 90% loss reduction"); nan if it never did or has no curve."""
    if job.loss_range is None:
        return math.nan
    for t, loss in job.loss:
        if normalized(job, loss) <= 1.0 - reduction + 1e-12:
            return t - job.arrival
    return math.nan


def summarize(result: SimResult) -> dict[str, float]:
    """jobs, mean_jct, median_jct, p95_jct, makespan, cpu_util, net_util,
    decisions, avg_norm_loss, final_norm_loss (the mean over jobs with a
    curve of the normalized loss they ended at: above 0 for jobs stopped
    early), time_to_90 (the mean of :func:`time_to` 90% over the jobs that
    got there), norm_loss_s (the mean of :func:`loss_integral`),
    total_utility (see the module docstring)."""
    jcts = [j.jct for j in result.jobs]
    total = sum(u.dt for u in result.util)
    finals = [normalized(j, j.loss[-1][1]) for j in result.jobs if j.loss_range and j.loss]
    t90 = [t for t in (time_to(j, 0.9) for j in result.jobs) if t == t]
    areas = [a for a in (loss_integral(j) for j in result.jobs) if a == a]
    return {
        "jobs": len(jcts),
        "mean_jct": sum(jcts) / len(jcts) if jcts else math.nan,
        "median_jct": percentile(jcts, 50),
        "p95_jct": percentile(jcts, 95),
        "makespan": result.get_makespan(),
        "cpu_util": sum(u.cpu * u.dt for u in result.util) / total if total else math.nan,
        "net_util": sum(u.net * u.dt for u in result.util) / total if total else math.nan,
        "decisions": len(result.decisions),
        "avg_norm_loss": avg_norm_loss(result),
        "final_norm_loss": sum(finals) / len(finals) if finals else math.nan,
        "time_to_90": sum(t90) / len(t90) if t90 else math.nan,
        "norm_loss_s": sum(areas) / len(areas) if areas else math.nan,
        "total_utility": total_utility(result),
    }


def write_result(result: SimResult, out_dir: str | os.PathLike, name: str | None = None) -> str:
    """Write ``<out_dir>/<name or policy>.json``: the result and its
    ``summary``; returns the path."""
    os.makedirs(out_dir, exist_ok=True)
    fname = (name or result.policy or "result").replace(os.sep, "_")
    path = os.path.join(out_dir, f"{fname}.json")
    d = result.to_dict()
    d["summary"] = summarize(result)
    with open(path, "w") as fh:
        json.dump(d, fh, indent=1, default=_jsonable)
    return path


def read_result(path: str | os.PathLike) -> SimResult:
    with open(path) as fh:
        return SimResult.from_dict(json.load(fh))


def _jsonable(x: Any) -> Any:
    if hasattr(x, "item"):          # numpy scalars
        return x.item()
    if isinstance(x, (set, frozenset, tuple)):
        return list(x)
    return str(x)


# ---------------------------------------------------------------- table

_TIME_COLS = (("mean_jct", "mean JCT"), ("median_jct", "median JCT"), ("p95_jct", "p95 JCT"),
              ("makespan", "makespan"))


def _fmt_s(x: float) -> str:
    if x != x:
        return "-"
    return f"{x:.1f}s" if x < 600 else f"{x / 60:.1f}m" if x < 36000 else f"{x / 3600:.2f}h"


def _ratio(num: float, den: float) -> str:
    if not (num == num and den == den) or den == 0:
        return "-"
    return f"{num / den:.2f}x"


def compare_table(results: Mapping[str, SimResult], baseline: str = "isolated",
                  console: Any = None, title: str | None = None) -> str:
    """Print a side-by-side table of ``results`` (policy name -> result):
    mean / median / p95 JCT and makespan, each with its speedup over
    ``baseline`` (baseline / value), and the average CPU and network
    utilization with their ratio to the baseline's, SLAQ's average
    normalized loss over time and OASiS's total utility (lower and higher
    are better; "-" where no job has a loss curve or a utility; see
    :func:`summarize`). Without the baseline
    among the results the ratio columns show "-". Returns the table as
    plain text (also when printed to ``console``, a ``rich`` Console;
    default: one on stdout)."""
    from rich.console import Console
    from rich.table import Table

    sums = {name: summarize(r) for name, r in results.items()}
    base = sums.get(baseline)
    table = Table(title=title or f"{len(results)} policies, ratios to {baseline}")
    table.add_column("policy", style="bold")
    table.add_column("jobs", justify="right")
    for _, label in _TIME_COLS:
        table.add_column(label, justify="right")
        table.add_column(f"x {baseline}", justify="right")
    for label in ("CPU util", "net util"):
        table.add_column(label, justify="right")
        table.add_column(f"x {baseline}", justify="right")
    table.add_column("avg norm loss", justify="right")
    table.add_column("total utility", justify="right")
    for name, s in sums.items():
        row = [name, str(s["jobs"])]
        for key, _ in _TIME_COLS:
            row += [_fmt_s(s[key]), _ratio(base[key], s[key]) if base else "-"]
        for key in ("cpu_util", "net_util"):
            row += ["-" if s[key] != s[key] else f"{100 * s[key]:.1f}%",
                    _ratio(s[key], base[key]) if base else "-"]
        row += ["-" if s["avg_norm_loss"] != s["avg_norm_loss"] else f"{s['avg_norm_loss']:.3f}",
                "-" if s["total_utility"] != s["total_utility"] else f"{s['total_utility']:.2f}"]
        table.add_row(*row)
    rec = Console(record=True, width=200, file=io.StringIO())
    rec.print(table)
    text = rec.export_text()
    (console or Console()).print(table)
    return text


# ---------------------------------------------------------------- plots

def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_jct_cdf(results: Mapping[str, SimResult], path: str | os.PathLike) -> str:
    """One JCT CDF line per policy in one PNG."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, r in results.items():
        jcts = sorted(j.jct for j in r.jobs)
        if not jcts:
            continue
        ys = [(i + 1) / len(jcts) for i in range(len(jcts))]
        ax.step(jcts, ys, where="post", label=f"{name} (mean {_fmt_s(sum(jcts) / len(jcts))})")
    ax.set_xlabel("job completion time (s)")
    ax.set_ylabel("fraction of jobs")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def plot_utilization(results: Mapping[str, SimResult], path: str | os.PathLike) -> str:
    """CPU and network utilization over time, one panel per policy, shared
    time axis, the makespan as a vertical line."""
    plt = _pyplot()
    n = max(1, len(results))
    fig, axes = plt.subplots(n, 1, figsize=(9, 2.4 * n), sharex=True, squeeze=False)
    for ax, (name, r) in zip(axes[:, 0], results.items()):
        t0 = min((j.arrival for j in r.jobs), default=0.0)
        ts = [u.t - t0 for u in r.util]
        ax.step(ts, [100 * u.cpu for u in r.util], where="post", label="CPU")
        ax.step(ts, [100 * u.net for u in r.util], where="post", label="network")
        ax.axvline(r.get_makespan(), color="gray", ls="--", lw=1)
        s = summarize(r)
        ax.set_title(f"{name}: makespan {_fmt_s(s['makespan'])}, CPU "
                     f"{100 * s['cpu_util']:.0f}%, net {100 * s['net_util']:.0f}%", fontsize=9)
        ax.set_ylim(0, 105)
        ax.set_ylabel("util. %")
    axes[0, 0].legend(loc="lower right", fontsize=8)
    axes[-1, 0].set_xlabel("simulated seconds since the first arrival")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def write_plots(results: Mapping[str, SimResult], out_dir: str | os.PathLike) -> list[str]:
    """``jct_cdf.png`` and ``utilization.png`` in ``out_dir``; their paths."""
    os.makedirs(out_dir, exist_ok=True)
    return [plot_jct_cdf(results, os.path.join(out_dir, "jct_cdf.png")),
            plot_utilization(results, os.path.join(out_dir, "utilization.png"))]


# ---------------------------------------------------------------- progress

@contextlib.contextmanager
def sim_progress(total: float, description: str = "simulating",
                 enabled: bool | None = None) -> Iterator[Callable[[float], None]]:
    """A progress bar for a long run: ``with sim_progress(total) as update:``
    then ``update(done)`` with the work done so far (e.g. simulated seconds
    or finished jobs, in the units of ``total``). ``enabled`` None: only
    when stderr is a terminal; False: ``update`` does nothing."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        yield lambda done: None
        return
    from rich.progress import (BarColumn, Progress, TaskProgressColumn, TextColumn,
                               TimeElapsedColumn, TimeRemainingColumn)
    with Progress(TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
                  TimeElapsedColumn(), TimeRemainingColumn(), transient=True) as prog:
        task = prog.add_task(description, total=total)
        yield lambda done: prog.update(task, completed=min(done, total))
