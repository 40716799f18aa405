"""The Harmony policy: profiling, grouping, DoP sizing and regrouping.

A pure function from a :class:`ClusterView` to a :class:`Decision`, like the
other policies; the master applies the decision (launch, pause, migrate) and
calls the policy again whenever something changed. The arithmetic (the
performance model, Algorithms 1 and 2, the regrouping rules) lives in
:mod:`harmony.sched`; this module maps it onto machines and job states:

* A new job has no profile: it is *profiled* on a free machine if there is
  one, else on the smallest group (fewest machines), co-located with that
  group's jobs under the subtask queues (dissertation §4.3.2).
* Once it has ``PROFILE_SAMPLES`` epochs of profile it becomes a candidate
  with the profiled, paused and waiting-with-profile jobs. The running
  grouping is kept unless a new one (Algorithm 1 over running + candidates)
  raises the predicted cluster utilization U by at least ``MIN_GAIN`` (5%);
  otherwise a single candidate joins the group where it raises U most (it
  stays where it was profiled when that is the best place) or waits, paused.
* A new grouping is mapped onto machines keeping as many jobs as possible on
  the machines they already use; a job whose machine set changes is paused
  at its next epoch end and resumed there (migration); a running job the new
  grouping leaves out is paused.

Decision: U counts every live machine, an idle one at zero, so machines
freed by a finished job make a regrouping that uses them worth its cost.
"""
from __future__ import annotations

from dataclasses import dataclass

from harmony.master.policy import MIN_GAIN, PROFILE_SAMPLES, ClusterView, Decision, JobView
from harmony.sched.grouping import schedule
from harmony.sched.model import Profile, group_iter_time, group_util, score

__all__ = ["harmony", "PROFILE_SAMPLES", "MIN_GAIN"]


@dataclass
class _Group:
    id: str
    machines: list[str]
    jobs: list[JobView]        # profiled members (running)
    profiling: list[JobView]   # jobs profiled on these machines


def _profile(j: JobView) -> Profile:
    assert j.profile is not None
    t_cpu, t_net, dop = j.profile
    return Profile(j.id, t_cpu, t_net, max(1, int(dop)))


def _util(groups: list[tuple[list[Profile], int]], total: int) -> tuple[float, float]:
    """Eq 4.4 over ``total`` machines (idle ones count as zero)."""
    if total <= 0:
        return 0.0, 0.0
    cpu = net = 0.0
    for profs, m in groups:
        if profs and m:
            c, n = group_util(profs, m)
            cpu, net = cpu + m * c, net + m * n
    return cpu / total, net / total


def _U(groups: list[tuple[list[Profile], int]], total: int) -> float:
    return score(*_util(groups, total))


def harmony(view: ClusterView) -> Decision:
    dec = Decision()
    live = [w.name for w in view.workers]
    total = len(live)
    if not total:
        return dec
    groups: dict[str, _Group] = {}
    for j in view.active:
        gid = j.sched_group or f"g:{j.id}"
        g = groups.setdefault(gid, _Group(gid, list(j.workers), [], []))
        (g.profiling if j.state == "profiling" else g.jobs).append(j)
        for m in j.workers:
            if m not in g.machines:
                g.machines.append(m)
    used = {m for g in groups.values() for m in g.machines}
    free = [m for m in live if m not in used]

    ready = [j for j in view.active if j.state == "profiling" and j.profile is not None]
    pending = [j for j in view.waiting if j.profile is not None]
    unprofiled = [j for j in view.waiting if j.profile is None]

    # 1. place new jobs for profiling
    for j in unprofiled:
        if free:
            ms, gid = [free.pop(0)], f"g:{j.id}"
            groups[gid] = _Group(gid, ms, [], [j])
        else:
            g = min(groups.values(), key=lambda g: (len(g.machines), len(g.jobs) + len(g.profiling),
                                                     g.id))
            ms, gid = list(g.machines), g.id
            g.profiling.append(j)
        dec.profile[j.id] = ms
        dec.assign[j.id] = gid

    if not ready and not pending and not any(g.jobs for g in groups.values()):
        return dec
    if any(j.profile is None for g in groups.values() for j in g.jobs):
        return dec   # a job just (re)started has no profile yet: decide later

    # 2. the running grouping, and the best new one
    running = [(g, [_profile(j) for j in g.jobs]) for g in groups.values() if g.jobs]
    cur = [(profs, len(g.machines)) for g, profs in running]
    u_now = _U(cur, total)
    cands = sorted([j for g, _ in running for j in g.jobs], key=lambda j: (j.submitted, j.id)) \
        + sorted(ready + pending, key=lambda j: (j.submitted, j.id))
    by_id = {j.id: j for j in cands}
    plan = schedule([_profile(j) for j in cands], total)
    planned = [([by_id[i] for i in pg.jobs], pg.machines) for pg in plan.groups]
    u_plan = _U([([_profile(j) for j in js], m) for js, m in planned], total)
    if u_plan >= (1 + MIN_GAIN) * u_now and u_plan > u_now:
        _apply_plan(dec, planned, groups, live, by_id)
        dec.util = _util([([_profile(j) for j in js], m) for js, m in planned], total)
        dec.note = f"regroup: U {u_now:.3f} -> {u_plan:.3f}"
        return dec

    # 3. otherwise add candidates one at a time where they raise U most
    for j in ready + sorted(pending, key=lambda j: (j.submitted, j.id)):
        best, best_u = None, u_now
        for gi, (g, profs) in enumerate(running):
            trial = list(cur)
            trial[gi] = (profs + [_profile(j)], len(g.machines))
            u = _U(trial, total)
            if u > best_u:
                best, best_u = gi, u
        if best is None:
            if j.state == "profiling":
                dec.pause[j.id] = None     # profiled; waits (checkpointed)
            continue
        g, profs = running[best]
        running[best] = (g, profs + [_profile(j)])
        g.jobs.append(j)
        cur[best] = (running[best][1], len(g.machines))
        u_now = best_u
        if j.state == "profiling" and set(j.workers) == set(g.machines):
            dec.promote.append(j.id)
        elif j.state == "profiling":
            dec.pause[j.id] = list(g.machines)
        else:
            dec.start[j.id] = list(g.machines)
        dec.assign[j.id] = g.id
        dec.note = f"add {j.id} to {g.id}: U -> {best_u:.3f}"
    for g, profs in running:
        if profs:
            dec.predicted[g.id] = group_iter_time(profs, len(g.machines))
    dec.util = _util(cur, total)
    return dec


def _apply_plan(dec: Decision, planned: list[tuple[list[JobView], int]],
                groups: dict[str, _Group], live: list[str], by_id: dict[str, JobView]) -> None:
    """Map planned groups onto machine names, keeping jobs where they run."""
    home = {j.id: g.id for g in groups.values() for j in g.jobs + g.profiling}
    claimed: set[str] = set()
    order = sorted(range(len(planned)), key=lambda i: -len(planned[i][0]))
    names: dict[int, list[str]] = {}
    gids: dict[int, str] = {}
    taken_gids: set[str] = set()
    # first pass: each planned group inherits the current group holding most of its jobs
    for i in order:
        js, m = planned[i]
        votes: dict[str, int] = {}
        for j in js:
            if j.id in home and home[j.id] not in taken_gids:
                votes[home[j.id]] = votes.get(home[j.id], 0) + 1
        if votes:
            gid = max(votes, key=lambda k: (votes[k], k))
            taken_gids.add(gid)
            gids[i] = gid
            keep = [n for n in groups[gid].machines if n in live and n not in claimed][:m]
            names[i] = keep
            claimed.update(keep)
    for i in order:
        js, m = planned[i]
        got = names.setdefault(i, [])
        spare = [n for n in live if n not in claimed]
        add = spare[:m - len(got)]
        got.extend(add)
        claimed.update(add)
        gids.setdefault(i, "g:" + min(j.id for j in js))
    in_plan = set()
    for i, (js, m) in enumerate(planned):
        ms, gid = names[i], gids[i]
        for j in js:
            in_plan.add(j.id)
            dec.assign[j.id] = gid
            if j.state in ("running", "profiling"):
                if set(j.workers) == set(ms):
                    if j.state == "profiling":
                        dec.promote.append(j.id)
                else:
                    dec.pause[j.id] = list(ms)
            else:
                dec.start[j.id] = list(ms)
        dec.predicted[gid] = group_iter_time([_profile(j) for j in js], len(ms))
    for jid, j in by_id.items():
        if jid not in in_plan and j.state in ("running", "profiling"):
            dec.pause[jid] = None
