"""The start-only placement policies: ``least-loaded`` (alias ``colocate``,
the naive and harmony modes' co-location) and ``isolated``.

They only start waiting jobs (``Decision.start``); the master never asks
them to pause or move anything.
"""
from __future__ import annotations

from harmony.policies.view import ClusterView, Decision


def least_loaded(view: ClusterView) -> Decision:
    """Co-location (the naive and harmony modes), FIFO without overtaking.

    A job without a group starts on the ``machines`` least-loaded live
    workers, so jobs share machines. An explicit job group is placed as a
    unit: its first job picks machines that host no other group, its later
    jobs join those machines, and a group that finds no such machines waits.
    Until the Harmony scheduler decides grouping, this is how complementary
    jobs are grouped by hand (``harmony submit --group G``).

    ``view.max_jobs`` caps the jobs a machine hosts at once: with 2, two
    jobs share the machines and the next waiting job starts as soon as one
    of them ends (no group needed).
    """
    cap = view.max_jobs
    load = {w.name: w.jobs for w in view.workers}
    order = {w.name: i for i, w in enumerate(view.workers)}
    homes: dict[str, list[str]] = {}
    for w in view.workers:
        for g in w.groups:
            homes.setdefault(g, []).append(w.name)
    dec = Decision()
    for job in view.waiting:
        room = [n for n in load if not cap or load[n] < cap]
        if job.machines > len(room):
            break
        if not job.group:
            chosen = sorted(room, key=lambda n: (load[n], order[n]))[:job.machines]
        elif job.group in homes:
            home = [n for n in homes[job.group] if n in room]
            if len(home) < job.machines:
                break
            chosen = sorted(home, key=lambda n: (load[n], order[n]))[:job.machines]
        else:
            taken = {n for ms in homes.values() for n in ms}
            free = [n for n in room if n not in taken]
            if len(free) < job.machines:
                break
            chosen = sorted(free, key=lambda n: (load[n], order[n]))[:job.machines]
            homes[job.group] = chosen
        dec.start[job.id] = chosen
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
