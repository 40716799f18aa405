"""Following a job from the CLI (``harmony submit --wait``).

On a terminal: a live progress bar (rich) with epochs of max epochs (or the
distance to a target objective), elapsed time, ETA and the latest metrics,
each epoch's line printed above it. Not on a terminal: plain lines, one per
epoch and state change. With ``json_lines``: one JSON object per line at
full precision (epochs, state changes, the end).
"""
from __future__ import annotations

import json
import math
import sys
import time
from typing import Any, Callable

TERMINAL = ("finished", "failed", "cancelled")


def fmt_value(v: Any, digits: int = 10) -> str:
    if isinstance(v, float):
        return f"{v:.{digits}g}" if math.isfinite(v) else str(v)
    return str(v)


def fmt_metrics(metrics: dict, digits: int = 10) -> str:
    return "  ".join(f"{k} {fmt_value(v, digits)}" for k, v in metrics.items()
                     if isinstance(v, (int, float)) and not isinstance(v, bool)
                     and (not isinstance(v, float) or math.isfinite(v)))


def fmt_dur(s: float | None) -> str:
    if s is None or not math.isfinite(s):
        return "?"
    s = max(0.0, float(s))
    if s < 60:
        return f"{s:.1f}s"
    m, sec = divmod(int(round(s)), 60)
    if m < 60:
        return f"{m}m{sec:02d}s"
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m"


def eta(st: dict, max_epochs: int | None) -> float | None:
    """Seconds left: the mean epoch time of this attempt so far times the
    epochs left; None if unknown (no epoch yet, or no max epochs)."""
    eps = st.get("epochs") or []
    if not max_epochs or not eps or st.get("state") in TERMINAL:
        return None if st.get("state") not in TERMINAL else 0.0
    done = len(eps)
    t0 = st.get("started") or eps[0].get("time")
    t1 = eps[-1].get("time")
    if not t0 or not t1 or t1 <= t0:
        return None
    # it counts down only while the job runs: a waiting, profiled or paused
    # job keeps the work it has left
    since = (time.time() - t1) if st.get("state") in ("running", "profiling") else 0.0
    return max(0.0, (t1 - t0) / done * (max_epochs - done) - since)


class Follower:
    """Polls a job's status and reports what changed to ``emit`` callbacks."""

    def __init__(self, status: Callable[[str], dict], job: str, poll_s: float = 0.5) -> None:
        self.status, self.job, self.poll_s = status, job, poll_s
        self.shown, self.state, self.t0 = 0, None, time.time()

    def run(self, on_epoch, on_state, on_tick=None) -> dict:
        while True:
            st = self.status(self.job)
            eps = st.get("epochs") or []
            if len(eps) < self.shown:      # a new attempt restarted from an earlier epoch
                self.shown = 0
            for ep in eps[self.shown:]:
                on_epoch(st, ep)
            self.shown = len(eps)
            if st["state"] != self.state:
                self.state = st["state"]
                on_state(st)
            if on_tick is not None:
                on_tick(st)
            if st["state"] in TERMINAL:
                return st
            time.sleep(self.poll_s)


def _where_why(st: dict) -> str:
    state = st["state"]
    where = f" on {', '.join(st['workers'])}" if st.get("workers") and \
        state in ("running", "profiling") else ""
    why = st["events"][-1][2] if st.get("events") else ""
    return where + (f"  ({why})" if why and state != "finished" else "")


def follow(client, job: str, out=None, err=None, poll_s: float = 0.5,
           max_epochs: int | None = None, target: float | None = None,
           json_lines: bool = False, console=None) -> int:
    """Follow ``job`` until it ends; 0 iff it finished. ``console``: a rich
    Console to draw the bar on (default: one on ``out`` if it is a terminal)."""
    out = out or sys.stdout
    err = err or sys.stderr
    f = Follower(client.status, job, poll_s)
    t0 = time.time()
    of = f"/{max_epochs}" if max_epochs else ""

    def end(st: dict) -> int:
        if st["state"] == "finished":
            return 0
        out.flush()
        print(f"{job} {st['state']}: {st.get('error') or ''}", file=err, flush=True)
        return 1

    if json_lines:
        def jl(**rec):
            print(json.dumps({"job": job, "t": round(time.time() - t0, 3), **rec}), file=out,
                  flush=True)
        st = f.run(lambda st, ep: jl(event="epoch", epoch=ep["epoch"] + 1,
                                     max_epochs=max_epochs, metrics=ep["metrics"],
                                     timings=ep.get("timings", {})),
                   lambda st: jl(event="state", state=st["state"], workers=st.get("workers"),
                                 note=(st["events"][-1][2] if st.get("events") else "")))
        jl(event="end", state=st["state"], elapsed=st.get("elapsed"), error=st.get("error"),
           metrics=(st["epochs"][-1]["metrics"] if st.get("epochs") else {}))
        return 0 if st["state"] == "finished" else 1

    if console is None and getattr(out, "isatty", lambda: False)():
        from rich.console import Console
        console = Console(file=out)
    if console is None:       # plain lines
        def line(text: str) -> None:
            print(f"[{time.time() - t0:7.1f}s] {text}", file=out, flush=True)

        def on_epoch(st, ep):
            left = eta(st, max_epochs) if ep is st["epochs"][-1] else None
            tail = f"  ETA {fmt_dur(left)}" if left is not None and left > 0 else ""
            line(f"{job} epoch {ep['epoch'] + 1:3d}{of}  {fmt_metrics(ep['metrics'])}{tail}")
        st = f.run(on_epoch, lambda st: line(f"{job} {st['state']}{_where_why(st)}"))
        if st["state"] == "finished":
            final = st["epochs"][-1]["metrics"] if st.get("epochs") else {}
            print(f"{job} finished in {st['elapsed']:.1f}s: {fmt_metrics(final)}", file=out,
                  flush=True)
        return end(st)

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
    cols = [TextColumn("[bold]{task.description}"), BarColumn(bar_width=30),
            MofNCompleteColumn() if max_epochs else TextColumn("epoch {task.completed}"),
            TextColumn("elapsed {task.fields[elapsed]}  ETA {task.fields[eta]}"),
            TextColumn("{task.fields[metrics]}")]
    with Progress(*cols, console=console, transient=False, refresh_per_second=4) as prog:
        task = prog.add_task(f"{job} waiting", total=max_epochs, elapsed="0.0s", eta="?",
                             metrics="")

        def on_epoch(st, ep):
            prog.console.print(f"{job} epoch {ep['epoch'] + 1:3d}{of}  "
                               f"{fmt_metrics(ep['metrics'])}", highlight=False)

        def on_state(st):
            prog.console.print(f"{job} {st['state']}{_where_why(st)}", highlight=False)

        def on_tick(st):
            eps = st.get("epochs") or []
            m = eps[-1]["metrics"] if eps else {}
            obj = m.get("objective")
            text = f"objective {fmt_value(obj)}" if obj is not None else ""
            if target is not None and obj is not None:
                text += f" (target {fmt_value(target)})"
            prog.update(task, completed=len(eps), description=f"{job} {st['state']}",
                        elapsed=fmt_dur(st.get("elapsed")),
                        eta=fmt_dur(eta(st, max_epochs)) if max_epochs else "?",
                        metrics=text)
        st = f.run(on_epoch, on_state, on_tick)
    if st["state"] == "finished":
        final = st["epochs"][-1]["metrics"] if st.get("epochs") else {}
        console.print(f"{job} finished in {st['elapsed']:.1f}s: {fmt_metrics(final)}",
                      highlight=False)
    return end(st)


def epoch_table(epochs: list[dict], started: float | None = None, digits: int = 8) -> list[str]:
    """A job's epochs as an aligned table: its metrics, the phase times of
    each epoch (slowest machine) and when it ended (since the job started)."""
    keys: list[str] = []
    for ep in epochs:
        for k, v in (ep.get("metrics") or {}).items():
            if k not in keys and isinstance(v, (int, float)) and not isinstance(v, bool):
                keys.append(k)
    phases = [p for p in ("pull", "comp", "push", "sync")
              if any(p in (ep.get("timings") or {}) for ep in epochs)]
    head = ["EPOCH"] + [k.upper() for k in keys] + [p.upper() for p in phases] + ["AT"]
    rows = []
    for ep in epochs:
        m, tm = ep.get("metrics") or {}, ep.get("timings") or {}
        at = ep.get("time")
        rows.append([str(ep["epoch"] + 1)]
                    + [fmt_value(m[k], digits) if k in m else "" for k in keys]
                    + [f"{tm[p]:.3f}s" if p in tm else "" for p in phases]
                    + [fmt_dur(at - started) if at and started else ""])
    widths = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]
    return ["  ".join(c.rjust(w) for c, w in zip(r, widths)).rstrip() for r in [head] + rows]
