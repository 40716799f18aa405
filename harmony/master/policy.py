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
    groups: tuple[str, ...] = ()   # explicit groups of the jobs running on it


@dataclass(frozen=True)
class JobView:
    id: str
    machines: int      # requested degree of parallelism
    submitted: float
    group: str = ""    # explicit job group: share the machines of that group


@dataclass(frozen=True)
class ClusterView:
    workers: tuple[WorkerView, ...]
    waiting: tuple[JobView, ...]      # in submission order


@dataclass
class Decision:
    start: dict[str, list[str]] = field(default_factory=dict)   # job -> machines


def least_loaded(view: ClusterView) -> Decision:
    """Co-location (the naive and harmony modes): FIFO; start each waiting
    job on the ``machines`` least-loaded live workers, so jobs share
    machines. A job with an explicit group goes to the machines its group
    already runs on. A job asking for more machines than the cluster has
    waits, and so do the jobs behind it (no overtaking)."""
    load = {w.name: w.jobs for w in view.workers}
    order = {w.name: i for i, w in enumerate(view.workers)}
    homes: dict[str, list[str]] = {}
    for w in view.workers:
        for g in w.groups:
            homes.setdefault(g, []).append(w.name)
    dec = Decision()
    for job in view.waiting:
        if job.machines > len(load):
            break
        home = homes.get(job.group) if job.group else None
        if home and len(home) >= job.machines:
            chosen = sorted(home, key=lambda n: (load[n], order[n]))[:job.machines]
        else:
            chosen = sorted(load, key=lambda n: (load[n], order[n]))[:job.machines]
        dec.start[job.id] = chosen
        if job.group:
            homes.setdefault(job.group, [])
            homes[job.group] = sorted(set(homes[job.group]) | set(chosen), key=order.get)
        for n in chosen:
            load[n] += 1
    return dec


def isolated(view: ClusterView) -> Decision:
    """Isolated: every job on its own machines, never shared; FIFO, so jobs
    run one after another when machines are short (like Optimus or SLAQ)."""
    free = [w.name for w in view.workers if w.jobs == 0]
    dec = Decision()
    for job in view.waiting:
        if job.machines > len(free):
            break
        dec.start[job.id], free = free[:job.machines], free[job.machines:]
    return dec


POLICIES = {"least-loaded": least_loaded, "colocate": least_loaded, "isolated": isolated}
# execution modes: placement policy, and whether subtasks go through the queues
MODES = {"isolated": ("isolated", False), "naive": ("colocate", False),
         "harmony": ("colocate", True)}
