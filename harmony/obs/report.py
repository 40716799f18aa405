"""``harmony report``: PNG plots of a run, from what the master recorded.

* ``utilization.png``: each machine's CPU and network utilization and its
  CPU/NET queues' busy fractions over time (``STATE/metrics/machines.jsonl``);
* ``iteration.png``: each scheduler group's predicted iteration time (the
  decisions log) against its jobs' measured ones (``jobs.jsonl``);
* ``jct.png``: each job's completion time, split into waiting and running
  (the job table, through the master; else the first and last epoch of
  ``jobs.jsonl``);
* ``objective.png``: each job's objective per epoch (the job table);
* ``summary.json``: the numbers behind them.

matplotlib draws them (``pip install 'harmony-ps[report]'``), headless (Agg).
"""
from __future__ import annotations

import glob
import json
import os
from collections import defaultdict
from typing import Any, Iterator


class ReportError(RuntimeError):
    pass


def read_jsonl(metrics_dir: str, name: str) -> Iterator[dict]:
    """Records of a rotated metrics log, oldest first (name.3 … name)."""
    base = os.path.join(metrics_dir, name)
    rotated = sorted(glob.glob(base + ".[0-9]*"), key=lambda p: -int(p.rsplit(".", 1)[1]))
    for path in rotated + [base]:
        try:
            fh = open(path, encoding="utf-8", errors="replace")
        except OSError:
            continue
        with fh:
            for line in fh:
                try:
                    d = json.loads(line)
                except ValueError:
                    continue
                if isinstance(d, dict):
                    yield d


RUNS = ("running", "profiling")
WAITS = ("waiting", "profiled", "paused")


def jct_split(job: dict) -> tuple[float, float]:
    """(seconds waiting, seconds running) of a job's completion time: from
    its time per state where the record has it (a job paused, or profiled
    and waiting for a group, after it started waits then too), else its
    start less its submission and its end less its start."""
    st = job.get("state_time")
    if isinstance(st, dict) and st:
        num = lambda v: float(v) if isinstance(v, (int, float)) else 0.0  # noqa: E731
        return (sum(num(st.get(s)) for s in WAITS), sum(num(st.get(s)) for s in RUNS))
    sub = job["submitted"]
    start = job.get("started")
    wait = max(0.0, (start or job.get("ended") or sub) - sub)
    run = max(0.0, (job.get("ended") or start or 0) - (start or 0)) if start else 0.0
    return wait, run


def load(metrics_dir: str, jobs: list[dict] | None = None) -> dict[str, Any]:
    """What the plots show, as plain data."""
    machines: dict[str, list] = defaultdict(list)
    for r in read_jsonl(metrics_dir, "machines.jsonl"):
        if "machine" in r and "t" in r:
            machines[r["machine"]].append(r)
    measured: dict[str, list] = defaultdict(list)     # job -> [(t, t_iter)]
    epoch_times: dict[str, list] = defaultdict(list)
    for r in read_jsonl(metrics_dir, "jobs.jsonl"):
        if "job" in r and "t" in r:
            epoch_times[r["job"]].append(r["t"])
            ti = (r.get("profile") or {}).get("t_iter")
            if isinstance(ti, (int, float)):
                measured[r["job"]].append((r["t"], ti))
    predicted: dict[str, list] = defaultdict(list)    # group -> [(t, predicted)]
    assign_at: list[tuple[float, dict]] = []
    for r in read_jsonl(metrics_dir, "decisions.jsonl"):
        t = r.get("t")
        if not isinstance(t, (int, float)):
            continue
        for g, v in (r.get("predicted") or {}).items():
            if isinstance(v, (int, float)):
                predicted[g].append((t, v))
        if r.get("assign"):
            assign_at.append((t, r["assign"]))
    # a job's measured iteration time counts for the group it was in then
    group_measured: dict[str, list] = defaultdict(list)
    for job, pts in measured.items():
        for t, v in pts:
            group = None
            for ta, assign in assign_at:
                if ta > t:
                    break
                group = assign.get(job, group)
            if group:
                group_measured[group].append((t, v, job))
    if jobs is None:
        jobs = [{"id": j, "submitted": ts[0], "started": ts[0], "ended": ts[-1],
                 "state": "?", "epochs": []} for j, ts in sorted(epoch_times.items())]
    t0 = min([r["t"] for rs in machines.values() for r in rs]
             + [j["submitted"] for j in jobs if j.get("submitted")] or [0.0])
    return {"t0": t0, "machines": dict(machines), "predicted": dict(predicted),
            "measured": dict(group_measured), "jobs": jobs}


def write(out_dir: str, data: dict[str, Any]) -> list[str]:
    """The PNGs (and summary.json) in ``out_dir``; their paths."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ReportError("harmony report needs matplotlib: pip install "
                          "'harmony-ps[report]' (or matplotlib)") from None
    os.makedirs(out_dir, exist_ok=True)
    t0, out = data["t0"], []

    def save(fig, name):
        path = os.path.join(out_dir, name)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        out.append(path)

    ms = sorted(data["machines"])
    if ms:
        fig, axes = plt.subplots(len(ms), 1, figsize=(10, 2.2 * len(ms) + 0.6), sharex=True,
                                 squeeze=False)
        for ax, m in zip(axes[:, 0], ms):
            rs = data["machines"][m]
            ts = [r["t"] - t0 for r in rs]
            for key, label in (("cpu", "CPU"), ("net", "network"), ("q_cpu", "CPU queue busy"),
                               ("q_net", "NET queue busy")):
                ys = [r.get(key) for r in rs]
                if any(y is not None for y in ys):
                    ax.plot(ts, [y if y is not None else float("nan") for y in ys], label=label,
                            lw=1.2)
            ax.set_ylim(0, 1.05)
            ax.set_ylabel(m)
            ax.grid(alpha=0.3)
        axes[0, 0].legend(loc="upper right", ncol=4, fontsize=8)
        axes[0, 0].set_title("Utilization per machine")
        axes[-1, 0].set_xlabel("seconds since the run began")
        save(fig, "utilization.png")

    groups = sorted(set(data["predicted"]) | set(data["measured"]))
    if groups:
        fig, ax = plt.subplots(figsize=(10, 4))
        for k, g in enumerate(groups):
            color = f"C{k % 10}"
            p = data["predicted"].get(g, [])
            if p:
                ax.step([t - t0 for t, _ in p], [v for _, v in p], where="post", color=color,
                        ls="--", label=f"{g} predicted")
            m = data["measured"].get(g, [])
            if m:
                ax.plot([t - t0 for t, _, _ in m], [v for _, v, _ in m], ".", color=color,
                        ms=4, label=f"{g} measured")
        ax.set_xlabel("seconds since the run began")
        ax.set_ylabel("iteration time (s)")
        ax.set_title("Predicted vs measured iteration time per group")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
        save(fig, "iteration.png")

    jobs = [j for j in data["jobs"] if j.get("submitted")]
    if jobs:
        fig, ax = plt.subplots(figsize=(10, 0.4 * len(jobs) + 1.2))
        names = [j["id"] for j in jobs]
        wait, run = zip(*(jct_split(j) for j in jobs))
        ax.barh(names, wait, color="#c9cfdb", label="waiting (all its waits, paused too)")
        ax.barh(names, run, left=wait, color="#2f6fdf", label="running (and profiling)")
        for i, j in enumerate(jobs):
            ax.text(wait[i] + run[i], i, f" {wait[i] + run[i]:.1f}s {j.get('state', '')}",
                    va="center", fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("job completion time (s)")
        ax.set_title("Job completion time")
        ax.legend(fontsize=8)
        save(fig, "jct.png")

    curves = [(j["id"], [(e["epoch"] + 1, e["metrics"].get("objective"))
                         for e in j.get("epochs") or []
                         if isinstance((e.get("metrics") or {}).get("objective"), (int, float))])
              for j in data["jobs"]]
    curves = [(n, c) for n, c in curves if c]
    if curves:
        fig, ax = plt.subplots(figsize=(10, 4))
        for n, c in curves:
            ax.plot([x for x, _ in c], [y for _, y in c], marker=".", label=n)
        if all(y > 0 for _, c in curves for _, y in c):
            ax.set_yscale("log")
        ax.set_xlabel("epoch")
        ax.set_ylabel("objective")
        ax.set_title("Objective per job")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        save(fig, "objective.png")

    summary = {"machines": {m: len(rs) for m, rs in data["machines"].items()},
               "groups": {g: {"predicted": data["predicted"].get(g, [])[-1:],
                              "measured_samples": len(data["measured"].get(g, []))}
                          for g in groups},
               "jobs": [{"id": j["id"], "state": j.get("state"), "submitted": j.get("submitted"),
                         "started": j.get("started"), "ended": j.get("ended"),
                         "epochs": len(j.get("epochs") or []),
                         "objective": ((j.get("epochs") or [{}])[-1].get("metrics") or {}).get(
                             "objective")} for j in data["jobs"]]}
    path = os.path.join(out_dir, "summary.json")
    with open(path, "w") as fh:
        json.dump(summary, fh, indent=2)
    out.append(path)
    return out
