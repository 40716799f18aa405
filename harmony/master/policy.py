"""Placement policies: pure functions from a cluster view to a decision.

They never touch sockets, processes or files, so the master and the
simulator call the same code. The scheduler issue adds the Harmony policy
(grouping, DoP sizing, regrouping) behind this same interface.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class WorkerView:
    name: str
    cpus: int
    memory: int
    jobs: int          # executors currently placed on it


@dataclass(frozen=True)
class JobView:
    id: str
    machines: int      # requested degree of parallelism
    submitted: float


@dataclass(frozen=True)
class ClusterView:
    workers: tuple[WorkerView, ...]
    waiting: tuple[JobView, ...]      # in submission order


@dataclass
class Decision:
    start: dict[str, list[str]] = field(default_factory=dict)   # job -> machines


def least_loaded(view: ClusterView) -> Decision:
    """FIFO: start each waiting job on the ``machines`` least-loaded live
    workers (jobs may share machines). A job asking for more machines than
    the cluster has waits, and so do the jobs behind it (no overtaking)."""
    load = {w.name: w.jobs for w in view.workers}
    order = {w.name: i for i, w in enumerate(view.workers)}
    dec = Decision()
    for job in view.waiting:
        if job.machines > len(load):
            break
        chosen = sorted(load, key=lambda n: (load[n], order[n]))[:job.machines]
        dec.start[job.id] = chosen
        for n in chosen:
            load[n] += 1
    return dec


POLICIES = {"least-loaded": least_loaded}
