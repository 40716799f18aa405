"""Where each job ran and beside whom, from ``harmony status --json`` records
alone (a runtime run's, or the simulator's: the same master core writes
both), so that a run whose metrics directory is gone can still be told
epoch by epoch.

A job's *stints* come from its events: ``attempt N on m0, m1`` (a launch,
profiling or running) and ``...: now on m0, m1, m6, m7 (...)`` (a live
resize done) put it on machines from then; any other state (waiting,
profiled, paused, finished, failed, cancelled) takes it off them.

An epoch's *window* is its training part, ``[time - eval - train, time -
eval]`` on the master's clock (the report arrives after the evaluation).
Its *group size* is 1 plus the number of other jobs that had a stint on at
least one of its machines for at least half of that window: the jobs
sharing its machines (profiling or starting up included) while it trained.

A job's *time split* (``time_split``) says where its JCT went: waiting for
its first launch, start-ups (launch to its first epoch's training), the
epochs' training and evaluation, the boundaries between epochs (the sums'
round trip, checkpoints, live resizes), the ends of its stretches on
machines (the final or a pause's checkpoint), and the time off machines
between them (paused, waiting for a group).
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

_ON = re.compile(r"(?:^|\b)attempt \d+ on ([^()]+?)(?: \(|$)")
_NOW_ON = re.compile(r"\bnow on ([^()]+?) \(")
_ACTIVE = ("profiling", "running")


@dataclass(frozen=True)
class Stint:
    start: float
    end: float
    machines: frozenset[str]


@dataclass(frozen=True)
class EpochSample:
    """One epoch of one job: its training window, machines, the jobs beside
    it, and its measured training seconds per iteration."""
    job: str                    # the status record's name
    epoch: int
    start: float
    end: float
    machines: frozenset[str]
    mates: frozenset[str]       # other jobs on its machines (see the module docstring)
    iter_s: float

    @property
    def size(self) -> int:
        return 1 + len(self.mates)


def _machines(text: str) -> frozenset[str]:
    return frozenset(x.strip() for x in text.split(",") if x.strip())


def stints(rec: Mapping[str, Any]) -> list[Stint]:
    """The intervals a job held machines, from its events (see the module
    docstring); the last one ends at ``ended`` (or its last event)."""
    out: list[Stint] = []
    cur: tuple[float, frozenset[str]] | None = None
    events = sorted(rec.get("events") or (), key=lambda e: e[0])
    for t, state, text in events:
        t = float(t)
        m = _NOW_ON.search(text) or (_ON.search(text) if state in _ACTIVE else None)
        if state in _ACTIVE and m:
            new = _machines(m.group(1))
            if cur is not None and cur[1] != new:
                out.append(Stint(cur[0], t, cur[1]))
                cur = None
            if cur is None:
                cur = (t, new)
        elif state not in _ACTIVE and cur is not None:
            out.append(Stint(cur[0], t, cur[1]))
            cur = None
    if cur is not None:
        end = rec.get("ended")
        end = float(end) if end is not None else (float(events[-1][0]) if events else cur[0])
        out.append(Stint(cur[0], max(end, cur[0]), cur[1]))
    return out


def spans(st: Sequence[Stint]) -> list[tuple[float, float]]:
    """Stretches on machines: stints that follow one another without a gap
    (a live resize) joined."""
    out: list[list[float]] = []
    for x in st:
        if out and x.start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], x.end)
        else:
            out.append([x.start, x.end])
    return [(a, b) for a, b in out]


SPLIT = ("wait", "start-up", "train", "eval", "boundary", "end", "off")


def time_split(rec: Mapping[str, Any]) -> dict[str, float]:
    """Seconds of the job's JCT (``ended - submitted``) per part of
    ``SPLIT`` (see the module docstring); they add up to the JCT."""
    out = dict.fromkeys(SPLIT, 0.0)
    eps = sorted((e for e in rec.get("epochs") or () if "time" in e),
                 key=lambda e: float(e["time"]))
    sub = float(rec["submitted"])
    prev_end = None
    for lo, hi in spans(stints(rec)):
        if prev_end is None:
            out["wait"] += lo - sub
        else:
            out["off"] += lo - prev_end
        prev_end = hi
        inside = [e for e in eps if lo <= float(e["time"]) <= hi]
        t = lo
        for i, e in enumerate(inside):
            tm = e.get("timings") or {}
            tr, ev = float(tm.get("train", 0.0)), float(tm.get("eval", 0.0))
            out["train"] += tr
            out["eval"] += ev
            out["start-up" if i == 0 else "boundary"] += float(e["time"]) - t - tr - ev
            t = float(e["time"])
        out["end"] += hi - t
    if prev_end is None:
        out["wait"] = float(rec.get("ended") or sub) - sub
    elif rec.get("ended") is not None:
        out["end"] += float(rec["ended"]) - prev_end
    return out


def machines_at(st: Sequence[Stint], t: float) -> frozenset[str]:
    """The machines of the stint holding time ``t`` (the last one that
    started at or before it), empty if none."""
    best = frozenset()
    for s in st:
        if s.start <= t <= s.end:
            best = s.machines
    return best


def epoch_samples(records: Iterable[Mapping[str, Any]]) -> list[EpochSample]:
    """Every epoch (with iterations) of every job of a run, with its group
    (see the module docstring), in the records' order."""
    recs = list(records)
    where = {str(r.get("name") or r["id"]): stints(r) for r in recs}
    out = []
    for r in recs:
        name = str(r.get("name") or r["id"])
        for e in r.get("epochs") or ():
            tm = e.get("timings") or {}
            iters = float(tm.get("iters") or 0)
            if iters <= 0 or "time" not in e:
                continue
            t1 = float(e["time"]) - float(tm.get("eval", 0.0))
            t0 = t1 - float(tm.get("train", 0.0))
            mine = machines_at(where[name], (t0 + t1) / 2)
            mates = frozenset(o for o, st in where.items() if o != name and any(
                s.machines & mine and overlap(s, t0, t1) >= 0.5 * (t1 - t0) for s in st))
            out.append(EpochSample(name, int(e.get("epoch", 0)), t0, t1, mine, mates,
                                   float(tm.get("train", 0.0)) / iters))
    return out


def overlap(s: Stint, t0: float, t1: float) -> float:
    return max(0.0, min(s.end, t1) - max(s.start, t0))


def size_label(size: int) -> str:
    """'1', '2', '3' or '4+'."""
    return str(size) if size < 4 else "4+"


SIZE_LABELS = ("1", "2", "3", "4+")


def by_size(pairs: Iterable[tuple[int, float]]) -> dict[str, list[float]]:
    """(group size, value) pairs in lists per size label, in label order."""
    out: dict[str, list[float]] = {k: [] for k in SIZE_LABELS}
    for size, v in pairs:
        out[size_label(size)].append(v)
    return {k: v for k, v in out.items() if v}



def last_prediction_samples(records: Iterable[Mapping[str, Any]]) -> list[tuple[int, float]]:
    """(group size, |predicted - measured| / measured) for the epochs (but
    a job's first) of each job's last run beside the same jobs on the same
    machines, against the iteration time its status's ``predicted_iter``
    holds: the last prediction the master made for it, made for that
    company. A stand-in where a run's per-epoch predictions were not kept
    (the master's ``decisions.jsonl``); it leaves out every epoch before a
    job's last change of company."""
    recs = list(records)
    samples: dict[str, list[EpochSample]] = {}
    for x in epoch_samples(recs):
        samples.setdefault(x.job, []).append(x)
    out = []
    for r in recs:
        pred = r.get("predicted_iter")
        xs = sorted(samples.get(str(r.get("name") or r["id"]), ()), key=lambda x: x.end)
        if not isinstance(pred, (int, float)) or pred <= 0 or not xs:
            continue
        last = xs[-1]
        for x in reversed(xs):
            if x.mates != last.mates or x.machines != last.machines:
                break
            if x.epoch > 0 and x.iter_s > 0:
                out.append((x.size, abs(pred - x.iter_s) / x.iter_s))
    return out
