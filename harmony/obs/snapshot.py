"""The master's state as one plain, JSON-able dict: what the dashboard, the
Prometheus endpoint and ``harmony report`` read.

:func:`build_snapshot` reads only attributes of the master object
(``jobs``, ``workers``, ``runs``, ``mode``, ``endpoint``, ``state_dir``) and
the decisions log it writes (``STATE/metrics/decisions.jsonl``); it never
changes anything. The master calls it at most once a second
(``dashboard.PUBLISH_EVERY``), in its own loop, and hands the result to the
HTTP thread (:mod:`harmony.obs.dashboard`), which never touches the master's
objects and encodes it once (:class:`SnapshotEncoder`).

Its cost on the loop does not grow with the machines' history (issue #32):
the machines' job lists come from one pass over the jobs, and each machine's
timeline is kept from one build to the next (:class:`_Timeline`: only the
heartbeats since the last build are converted); the dicts a snapshot holds
are never changed after it is built (a later snapshot may share them).
"""
from __future__ import annotations

import json
import math
import os
import re
import time
from collections import deque
from typing import Any

#: per-machine utilization samples in a snapshot (one a heartbeat, ~1 s)
TIMELINE = 300
#: points of each job's objective curve
CURVE = 500
#: recent scheduler decisions
DECISIONS = 30
#: a job's latest events in its entry (the job page's story; harmony status
#: JOB --events has them all)
JOB_EVENTS = 40
#: the task stream: each machine's subtasks of the last TASK_WINDOW seconds
#: (the master's clock), at most TASK_SHOWN, on the first TASK_MACHINES
#: machines (by name): its cost stays bounded on a fleet
TASK_WINDOW = 60.0
TASK_SHOWN = 400
TASK_MACHINES = 32
DEFAULT_MAX_EPOCHS = 10     # harmony.app's default --max-epochs

_QUEUE_KEYS = (("qg", "granted"), ("qw", "wait"), ("qd", "done"), ("qr", "run"))
_MAX_EPOCHS = re.compile(r"--max-epochs(?:=(\d+))?$")


def max_epochs(args: list) -> int:
    """A job's --max-epochs from its app options (the default if absent)."""
    for i, a in enumerate(args):
        m = _MAX_EPOCHS.match(str(a))
        if m:
            val = m.group(1) or (args[i + 1] if i + 1 < len(args) else "")
            try:
                return max(1, int(val))
            except ValueError:
                return DEFAULT_MAX_EPOCHS
    return DEFAULT_MAX_EPOCHS


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = float(v)
    return v if math.isfinite(v) else None


class DecisionTail:
    """The decisions log, read incrementally: the last few and a count."""

    def __init__(self, path: str, keep: int = DECISIONS) -> None:
        self.path = path
        self.offset = 0
        self.count = 0
        self.recent: deque = deque(maxlen=keep)
        self._partial = b""

    def poll(self) -> None:
        try:
            size = os.path.getsize(self.path)
        except OSError:
            return
        if size < self.offset:          # rotated: the new file from its start
            self.offset, self._partial = 0, b""
        if size == self.offset:
            return
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read(min(size - self.offset, 8 << 20))
        except OSError:
            return
        self.offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            try:
                d = json.loads(line)
            except ValueError:
                continue
            if isinstance(d, dict):
                self.count += 1
                self.recent.append(d)


_tails: dict[str, DecisionTail] = {}


def _decisions(master) -> tuple[list, int]:
    sd = getattr(master, "state_dir", None)
    if not sd:
        return [], 0
    path = os.path.join(sd, "metrics", "decisions.jsonl")
    tail = _tails.get(path)
    if tail is None:
        tail = _tails[path] = DecisionTail(path)
    tail.poll()
    out = []
    for d in tail.recent:
        moves = d.get("pause") or {}
        out.append({"t": d.get("t"), "note": d.get("note", ""),
                    "start": d.get("start") or {}, "profile": d.get("profile") or {},
                    "pause": moves, "promote": d.get("promote") or [],
                    "assign": d.get("assign") or {}, "predicted": d.get("predicted") or {},
                    "util": d.get("util")})
    return out, tail.count


def _byte_sums(job, sums: list | None) -> list:
    """[epochs summed, data bytes, bytes pulled, bytes pushed, the last epoch
    summed] of ``job``, carried on from ``sums`` (its previous ones: only
    the epochs since are added, so a running job's entry does not cost
    O(its epochs) a second); from the start when its epochs are not those
    counted (a resume from a checkpoint drops the epochs after it)."""
    eps = job.epochs
    if sums is None or sums[0] > len(eps) or (sums[0] and eps[sums[0] - 1] is not sums[4]):
        sums = [0, 0.0, 0.0, 0.0, None]
    n, data_bytes, pulled, pushed, _ = sums
    for e in eps[n:]:
        tm = e.get("timings") or {}
        data_bytes += _num(tm.get("bytes")) or 0.0
        pulled += _num(tm.get("bytes_pull")) or 0.0     # these two: all its machines
        pushed += _num(tm.get("bytes_push")) or 0.0
    return [len(eps), data_bytes, pulled, pushed, eps[-1] if eps else None]


def _job(job, now: float, sums: list | None = None) -> dict[str, Any]:
    """A job's entry; ``sums``: its byte sums so far (``_byte_sums``),
    updated in place."""
    eps = job.epochs
    last = eps[-1] if eps else {}
    metrics = {k: v for k, v in (last.get("metrics") or {}).items() if _num(v) is not None}
    me = max_epochs(job.args)
    state = job.state.value
    terminal = job.state.terminal
    eta = None
    if not terminal and eps and job.started:
        t_last = last.get("time") or now
        per = (t_last - job.started) / len(eps) if t_last > job.started else None
        if per:
            # it counts down only while the job runs: a waiting, profiled or
            # paused job keeps the work it has left
            since = (now - t_last) if state in ("running", "profiling") else 0.0
            eta = max(0.0, per * max(0, me - len(eps)) - since)
    elif terminal:
        eta = 0.0
    curve = [[e["epoch"] + 1, _num((e.get("metrics") or {}).get("objective")), e.get("time")]
             for e in eps[-CURVE:]]
    got = _byte_sums(job, sums)
    if sums is not None:
        sums[:] = got
    _, data_bytes, pulled, pushed, _ = got
    p = job.profile or {}
    store = {}
    for m, st in (job.store or {}).items():
        store[m] = {k: (float(v) if isinstance(v, (int, float)) else v)
                    for k, v in st.items() if isinstance(v, (int, float, bool, str))}
    ck = job.checkpoint or None
    migrations = sum(1 for ev in job.events if len(ev) > 2 and " MiB moved;" in str(ev[2]))
    return {
        "id": job.id, "name": job.name or job.app_name, "app": job.app_name, "state": state,
        "group": job.sched_group or job.group or "", "machines": job.machines,
        "workers": list(job.workers), "epoch": len(eps), "max_epochs": me,
        "objective": _num(metrics.get("objective")), "metrics": metrics,
        "eta": eta, "submitted": job.submitted, "started": job.started, "ended": job.ended,
        "elapsed": ((job.ended or now) - job.started) if job.started else 0.0,
        "predicted_iter": _num(job.predicted), "t_iter": _num(p.get("t_iter")),
        "t_cpu": _num(p.get("t_cpu")), "t_net": _num(p.get("t_net")),
        "attempt": job.attempt, "error": (job.error or "")[:500],
        "reason": job.reason, "curve": curve, "data_bytes": data_bytes,
        "bytes_pulled": pulled, "bytes_pushed": pushed,
        "last_timings": {k: v for k, v in (last.get("timings") or {}).items()
                         if _num(v) is not None},
        "store": store, "migrations": migrations,
        "checkpoint": {"epoch": ck.get("epoch"), "time": ck.get("time"),
                       "final": bool(ck.get("final"))} if isinstance(ck, dict) else None,
        "note": (job.events[-1][2] if job.events and len(job.events[-1]) > 2 else ""),
        # the job page: its latest events ([time, state, note]), how many
        # earlier ones are not here, its attempt's start-ups per machine
        # ([seconds, CPU seconds]) and its epochs' seconds per iteration
        "events": [[_num(ev[0]), str(ev[1]), str(ev[2])[:300]]
                   for ev in job.events[-JOB_EVENTS:] if len(ev) > 2],
        "events_earlier": max(0, len(job.events) - JOB_EVENTS) + job.events_dropped,
        "setups": [[_num(x[0]), _num(x[1])] for x in (job.setups or [])
                   if isinstance(x, (list, tuple)) and len(x) >= 2][:64],
        "iters": [[e["epoch"] + 1, _iter_s(e)] for e in eps[-CURVE:]],
    }


def _iter_s(epoch: dict) -> float | None:
    """An epoch's training seconds per iteration (its report's timings)."""
    tm = epoch.get("timings") or {}
    train, iters = _num(tm.get("train")), _num(tm.get("iters"))
    return train / iters if train is not None and iters else None


def _job_cached(cache: dict, job, now: float) -> dict[str, Any]:
    """A finished, failed or cancelled job's entry does not change: built
    once; a running one's byte sums grow by its new epochs only."""
    if not job.state.terminal:
        hit = cache.get(job.id)
        sums = hit if isinstance(hit, list) else None
        if sums is None:
            sums = cache[job.id] = [0, 0.0, 0.0, 0.0, None]
        return _job(job, now, sums)
    key = (job.state.value, len(job.epochs), job.ended, len(job.events) + job.events_dropped)
    hit = cache.get(job.id)
    if hit is None or hit[0] != key:
        hit = cache[job.id] = (key, _job(job, now))
    return hit[1]


_SAMPLE_KEYS = ("t", "cpu", "net", "q_cpu", "q_net", "mem")


def _sample(s: dict) -> dict[str, Any]:
    return {k: s.get(k) for k in _SAMPLE_KEYS if k in s}


class _Timeline:
    """One machine's last TIMELINE samples as the snapshot shows them, kept
    from one snapshot to the next: a heartbeat appends one sample (never
    changed after), so each build converts only the samples that arrived
    since the last one, instead of TIMELINE new dicts per machine (issue
    #32: 70,000 dicts a snapshot at 1,000 machines)."""

    __slots__ = ("worker", "last", "shown", "queues", "disk")

    def __init__(self, worker) -> None:
        self.worker = worker
        self.last = None                  # the newest raw sample converted
        self.shown: deque = deque(maxlen=TIMELINE)
        self.queues: dict = {}
        self.disk: dict = {}

    def update(self, stats) -> None:
        last = stats[-1] if stats else None
        if last is self.last:
            return
        new = []
        found = False
        for s in reversed(stats):         # the newest first, back to the last one seen
            if s is self.last:
                found = True
                break
            new.append(s)
            if len(new) >= TIMELINE:
                break
        if not found and len(new) < TIMELINE:     # not an append: start again
            self.shown.clear()
        self.shown.extend(_sample(s) for s in reversed(new))
        self.last = last
        last = last or {}
        # the subtask queues' counters since the daemon started (see
        # harmony.comm.messages.COUNTER_KEYS); {} from a daemon without them
        self.queues = {r: {name: last[f"{k}_{r}"] for k, name in _QUEUE_KEYS}
                       for r in ("cpu", "net")
                       if all(f"{k}_{r}" in last for k, _ in _QUEUE_KEYS)}
        # the state dir's disk (bytes): {} from a daemon that does not say
        self.disk = ({"free": last["disk_free"], "total": last["disk_total"]}
                     if "disk_free" in last and "disk_total" in last else {})


class _Cache:
    """What a master's snapshots keep between builds: the entries of jobs
    that are over, and each machine's timeline."""

    def __init__(self) -> None:
        self.jobs: dict[str, tuple] = {}
        self.machines: dict[str, _Timeline] = {}


_caches: dict[int, _Cache] = {}


def build_snapshot(master) -> dict[str, Any]:
    """The master's state now, as a JSON-able dict (see the module doc)."""
    now = time.time()
    cache = _caches.get(id(master))
    if cache is None:
        cache = _caches[id(master)] = _Cache()
    # finished jobs leave the live view after the master's retention (its
    # own clock); they are still counted by state
    retention, mnow = getattr(master, "retention", 0.0), getattr(master, "now", None)
    counts: dict[str, int] = {}
    for j in master.jobs.values():
        counts[j.state.value] = counts.get(j.state.value, 0) + 1
    jobs = [_job_cached(cache.jobs, j, now)
            for j in sorted(master.jobs.values(), key=lambda j: j.id)
            if mnow is None or j.retained(mnow, retention)]
    placed: dict[str, list] = {}         # machine -> its running jobs, in id order
    for j in jobs:
        if j["state"] in ("running", "profiling"):
            for n in dict.fromkeys(j["workers"]):
                placed.setdefault(n, []).append(j["id"])
    machines = []
    timelines = cache.machines
    seen = set()
    core = getattr(master, "core", master)
    streaming = bool(getattr(core, "task_stream", False)) and mnow is not None
    for i, w in enumerate(sorted(master.workers.values(), key=lambda w: w.name)):
        tl = timelines.get(w.name)
        if tl is None or tl.worker is not w:      # new, or registered again
            tl = timelines[w.name] = _Timeline(w)
        tl.update(w.stats)
        seen.add(w.name)
        machines.append({
            "name": w.name, "host": w.host, "cpus": w.cpus, "memory": w.memory,
            "alive": bool(w.alive), "last_seen": w.last_seen,
            "jobs": placed.get(w.name, []),
            "timeline": list(tl.shown),
            "queues": tl.queues, "disk": tl.disk,
            # [start, end, job, kind], seconds before now (the master's clock)
            "tasks": _tasks(w, mnow) if streaming and i < TASK_MACHINES else []})
    if len(timelines) > len(seen):
        for name in [n for n in timelines if n not in seen]:
            del timelines[name]
    groups: dict[str, dict] = {}
    for j in jobs:
        if j["state"] not in ("running", "profiling") or not j["group"]:
            continue
        g = groups.setdefault(j["group"], {"group": j["group"], "jobs": [], "machines": set(),
                                           "predicted": None, "measured": []})
        g["jobs"].append(j["id"])
        g["machines"].update(j["workers"])
        if j["predicted_iter"] is not None:
            g["predicted"] = j["predicted_iter"]
        if j["t_iter"] is not None:
            g["measured"].append(j["t_iter"])
    group_list = []
    for g in sorted(groups.values(), key=lambda g: g["group"]):
        measured = sum(g["measured"]) / len(g["measured"]) if g["measured"] else None
        err = (abs(g["predicted"] - measured) / measured
               if g["predicted"] is not None and measured else None)
        group_list.append({"group": g["group"], "jobs": g["jobs"],
                           "machines": sorted(g["machines"]), "predicted": g["predicted"],
                           "measured": measured, "error": err})
    decisions, n_decisions = _decisions(master)
    runs = getattr(master, "runs", {}) or {}
    return {"t": now, "mode": getattr(master, "mode", ""),
            "endpoint": getattr(master, "endpoint", ""),
            "jobs": jobs, "job_counts": counts, "machines": machines,
            "groups": group_list,
            "decisions": decisions, "decisions_total": n_decisions,
            "running_attempts": len(runs)}


def _tasks(w, now: float) -> list:
    """A machine's latest subtasks for the task stream, relative to now."""
    out = []
    for a, b, job, kind in reversed(getattr(w, "tasks", ())):
        if b < now - TASK_WINDOW or len(out) >= TASK_SHOWN:
            break
        out.append([round(a - now, 3), round(b - now, 3), job, kind])
    out.reverse()
    return out


class SnapshotEncoder:
    """A snapshot as JSON bytes, in pieces: each job and each machine is
    encoded on its own (the encoder holds the interpreter's lock for one
    piece at a time, not for the whole snapshot: the master's loop runs in
    between), and a machine's timeline samples, shared from one snapshot to
    the next (:class:`_Timeline`), are encoded once each. Not thread-safe:
    one caller at a time (the dashboard holds a lock)."""

    def __init__(self) -> None:
        self._enc = json.JSONEncoder(allow_nan=False, default=str).encode
        # machine name -> its timeline's samples and their JSON, as last encoded
        self._timelines: dict[str, tuple[list, list]] = {}

    def encode(self, snap: dict[str, Any]) -> bytes:
        enc = self._enc
        parts = []
        seen = set()
        for k, v in snap.items():
            if k in ("jobs", "machines") and isinstance(v, list):
                if k == "machines":
                    items = [self._machine(x, seen) for x in v]
                else:
                    items = [enc(x) for x in v]
                parts.append(f"{enc(k)}: [{', '.join(items)}]")
            else:
                parts.append(f"{enc(k)}: {enc(v)}")
        for name in [n for n in self._timelines if n not in seen]:
            del self._timelines[name]
        return ("{" + ", ".join(parts) + "}").encode()

    def _machine(self, m: Any, seen: set) -> str:
        enc = self._enc
        tl = m.get("timeline") if isinstance(m, dict) else None
        if not isinstance(tl, list) or not isinstance(m.get("name"), str):
            return enc(m)
        name = m["name"]
        seen.add(name)
        samples, frags = self._timelines.get(name, ([], []))
        # the samples that arrived since (a window that moves on: the same
        # objects, then new ones at its end)
        last = samples[-1] if samples else None
        n = 0
        for s in reversed(tl):
            if s is last:
                break
            n += 1
        keep = len(tl) - n                  # samples already encoded, at the window's end
        if last is None or n == len(tl) or keep > len(samples) \
                or tl[0] is not samples[len(samples) - keep]:
            samples, frags = list(tl), [enc(s) for s in tl]
        else:
            frags = frags[len(frags) - keep:] + [enc(s) for s in tl[keep:]]
            samples = list(tl)
        self._timelines[name] = (samples, frags)
        rest = enc({k: v for k, v in m.items() if k != "timeline"})
        return f"{rest[:-1]}{', ' if len(rest) > 2 else ''}\"timeline\": [{', '.join(frags)}]}}"
