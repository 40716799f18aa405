"""Algorithm 1: the number of groups, the candidate job sets and ``schedule``, which grows the set of jobs while U improves.

Part of :mod:`harmony.sched.grouping` (see its docstring)."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from harmony.sched.model import Profile, score
from harmony.sched.grouping.allocate import _allocate
from harmony.sched.grouping.assign import _assign
from harmony.sched.grouping.base import Plan, PlannedGroup, _ALL_N_GROUPS, _EPS, _FEWER_JOBS, _REFINE_MAX_GROUPS, _REFINE_MAX_JOBS, _REFINE_TOP, _arrays, _net
from harmony.sched.grouping.evaluate import _evaluate
from harmony.sched.grouping.refine import _refine
from harmony.sched.grouping.reshape import _reshape_all


def _n_groups(work: np.ndarray, base: np.ndarray, remote: np.ndarray | None,
              machines: int) -> int:
    """Algorithm 1 L6: argmin over n_G in [1, min(|J|, M)] of
    sum_j |Tcpu_j(n_G) - Tnet_j(n_G)|, where equal DoP M / n_G makes
    Tcpu_j(n_G) = work_j * n_G / M and Tnet_j(n_G) = base_j + remote_j *
    (1 - n_G / M). Each term is |a_j * n_G - b_j| with a_j = (work_j +
    remote_j) / M and b_j = base_j + remote_j, so the sum is convex in n_G
    and a binary search on its forward difference finds the minimum. Ties go
    to the larger n_G (fewer jobs per group)."""
    hi = min(len(work), machines)
    if remote is None:
        a, b = work / machines, base
    else:
        a, b = (work + remote) / machines, base + remote

    def f(x: int) -> float:
        return float(np.abs(a * x - b).sum())

    lo = 1   # invariant: f(lo) <= f(lo - 1) (true for lo = 1); answer in [lo, hi]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        fm, fp = f(mid), f(mid - 1)
        if fm <= fp + _EPS * max(fp, 1.0):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _score_bound(work: np.ndarray, base: np.ndarray, machines: int) -> float:
    """An upper bound of U for these jobs on ``machines``: m_g * Ucpu(g) <=
    work_g / net_g(m_g) (Tg_itr >= sum Tnet), and merging jobs never raises
    work / net above the sum of the jobs' own ratios, so Ucpu <= min(1,
    sum_j work_j / net_j / M); Unet <= 1. With remote > 0 Tnet_j(m) >=
    base_j = Tnet_j(1) for every m, so the bound takes the base: still a
    valid upper bound (a job with base 0 makes it the trivial bound 1)."""
    ratio = float((work / np.maximum(base, 1e-300)).sum())
    return score(min(1.0, ratio / machines), 1.0)


def _candidate_n_groups(work: np.ndarray, base: np.ndarray, remote: np.ndarray | None,
                        machines: int) -> list[int]:
    """n_G values to try for one job set, largest first: all of them when
    there are at most _ALL_N_GROUPS, else L6's n*_G and the aggregate balance
    point round(M * sum Tnet / sum work), where the groups' summed COMP and
    COMM match at equal DoP (with remote: sum work * n / M = sum base +
    sum remote * (1 - n / M), n = M * (sum base + sum remote) / (sum work +
    sum remote)). (L6 alone lands at U 0.73 on 800 jobs / 1,000 machines,
    with the balance point 0.99; adding n*_G +- 1 or the floor and ceiling
    of the balance point changed U by < 0.1% at twice the time.)"""
    hi = min(len(work), machines)
    if hi <= _ALL_N_GROUPS:
        return list(range(hi, 0, -1))
    if remote is None:
        agg = machines * float(base.sum()) / max(float(work.sum()), 1e-300)
    else:
        r = float(remote.sum())
        agg = machines * (float(base.sum()) + r) / max(float(work.sum()) + r, 1e-300)
    agg_n = int(min(max(round(agg), 1), hi))
    return sorted({_n_groups(work, base, remote, machines), agg_n}, reverse=True)


def _plan_for(work: np.ndarray, base: np.ndarray, remote: np.ndarray | None, machines: int,
              n_g: int) -> tuple[float, list[list[int]], np.ndarray]:
    """Algorithm 1 L7-9 for one job set and n_G: (score, groups, allocation).
    Algorithm 2 sees each job's Tnet at the equal DoP M / n_G."""
    dop = machines / n_g
    groups = _assign(work, _net(base, remote, dop), n_g, dop)
    label = np.empty(len(work), dtype=np.int64)
    for gi, g in enumerate(groups):
        label[g] = gi
    alloc = _allocate(np.bincount(label, work, n_g), np.bincount(label, base, n_g), machines,
                      None if remote is None else np.bincount(label, remote, n_g))
    _, u_cpu, u_net = _evaluate(work, base, remote, groups, alloc, machines)
    return score(u_cpu, u_net), groups, alloc


def choose_n_groups(profiles: Sequence[Profile], machines: int) -> int:
    """Algorithm 1 L6: the number of groups n_G in [1, min(|J|, M)] that
    minimizes sum_j |Tcpu_j(n_G) - Tnet_j(n_G)| at equal DoP M / n_G (ties:
    the larger n_G); Tnet_j(n_G) is ``model.t_net_at`` at that DoP."""
    if not profiles or machines < 1:
        raise ValueError("need at least one job and one machine")
    work, base, remote = _arrays(profiles)
    return _n_groups(work, base, remote, machines)


def _k_steps(n: int, literal: bool) -> list[int]:
    """Job-set sizes Algorithm 1 tries: every k in literal mode; otherwise
    every k up to 32, then steps of ceil(k/8) (about 12%), and always n."""
    if literal:
        return list(range(1, n + 1))
    ks, k = [], 1
    while k < n:
        ks.append(k)
        k += 1 if k < 32 else -(-k // 8)
    ks.append(n)
    return ks


def _candidates(work: np.ndarray, base: np.ndarray, remote: np.ndarray | None, machines: int,
                ks: Sequence[int], literal: bool, memo: dict
                ) -> list[tuple[float, list[list[int]], np.ndarray]]:
    """``schedule``'s plan (score, groups, allocation) for each job-set size
    in ``ks`` (prefixes of the jobs), the best over its n_G candidates after
    fine-tuning (see ``schedule``); the _reshape fine-tuning of all of them
    runs side by side (``_reshape_all``)."""
    out, cands_k, reshape = [], [], []
    for k in ks:
        w, n = work[:k], base[:k]
        r = None if remote is None else remote[:k]
        if literal:
            out.append(_plan_for(w, n, r, machines, _n_groups(w, n, r, machines)))
            continue
        cands = [_plan_for(w, n, r, machines, n_g)
                 for n_g in _candidate_n_groups(w, n, r, machines)]
        if k <= _REFINE_MAX_JOBS:   # refine the most promising n_G values
            bound = _score_bound(w, n, machines)
            top = sorted(range(len(cands)), key=lambda i: -cands[i][0])
            for i in top[:_REFINE_TOP] if r is None else top:
                if cands[i][0] >= bound * (1 - 1e-6):
                    continue        # nothing to gain
                _, groups, alloc = cands[i]
                if r is not None and len(groups) <= _REFINE_MAX_GROUPS:
                    reshape.append((len(cands_k), i))
                    continue
                elif 1 < len(groups) <= _REFINE_MAX_GROUPS:
                    alloc = _refine(w, n, r, groups, alloc, machines)
                else:
                    continue
                cands[i] = (score(*_evaluate(w, n, r, groups, alloc, machines)[1:]),
                            groups, alloc)
        cands_k.append((k, cands))
    if reshape:     # indices below k: the whole arrays serve every prefix
        allocs = _reshape_all(work, base, remote,
                              [cands_k[c][1][i][1:] for c, i in reshape], machines, memo)
        for (c, i), alloc in zip(reshape, allocs):
            k, cands = cands_k[c]
            w, n = work[:k], base[:k]
            r = None if remote is None else remote[:k]
            groups = cands[i][1]
            cands[i] = (score(*_evaluate(w, n, r, groups, alloc, machines)[1:]), groups, alloc)
    for _, cands in cands_k:
        cand = cands[0]
        for c in cands[1:]:        # largest n_G first: ties keep more groups
            if c[0] > cand[0]:
                cand = c
        out.append(cand)
    return out


def schedule(profiles: Sequence[Profile], machines: int, literal: bool = False) -> Plan:
    """Algorithm 1: the plan that maximizes U over growing prefixes of
    ``profiles``; jobs not in it are returned in ``waiting``, in order.

    ``profiles`` is J_to_sched in priority order (Algorithm 1 L2 takes
    profiled, then paused, then running jobs). For a growing number k of
    jobs it picks the number of groups n_G, assigns the first k jobs to n_G
    groups (Algorithm 2, at equal DoP M / n_G), allocates all ``machines``
    (``allocate_machines``), evaluates U and keeps the best plan.

    ``literal=True`` follows the pseudo-code: k = 1, 2, ..., n_G = L6's
    argmin of sum_j |Tcpu_j(n_G) - Tnet_j| only, stop at the first k whose U
    is not higher. The default adds, as decisions of this project, because
    the literal version lands far from the optimum on random instances (mean
    U 0.83 of the exhaustive optimum on 6 jobs / 8 machines; see
    bench/sched_speed.py):

    1. n_G: every value up to min(k, M) when that is at most 8, else L6's
       n*_G and the aggregate balance point (``_candidate_n_groups``); the
       best U wins, ties to more groups (the paper prefers fewer jobs per
       group).
    2. Fine-tuning on the model (``_refine``), after Algorithm 2's own swap
       fine-tuning: for job sets of at most 16 jobs in at most 8 groups, the
       three best n_G candidates have every pair of groups re-split (jobs
       and machines) where that raises U (two rounds; pairs already within
       1% of full utilization are left alone). Algorithm 2 assumes equal DoP
       and pairs opposite jobs; with per-group DoP, jobs of similar
       comp/comm ratio on a DoP that balances them are often better, and
       small instances are where the coarse choice costs most. Larger sets
       skip it: U is already ~0.99 at 80 jobs / 100 machines. When jobs
       have remote > 0 (COMM grows with DoP, see ``model``), every n_G
       candidate of such a job set is fine-tuned with ``_reshape``, which
       also merges and splits groups (so changes n_G).
    3. Stopping: U(k) is noisy in k (one ill-fitting job lowers it, the next
       raises it again), so the search goes on until k has doubled (and
       grown by 3) since the last k that beat the best U, then returns the
       smallest k whose U is within 0.5% of the best (the paper prefers
       fewer jobs). k steps by one up to 32, then by ceil(k/8): U moves
       little between neighbouring large k, and 8,000 jobs then take a
       fraction of a second.

    Decisions in both modes: the pseudo-code starts at n_j = 2 with
    J[0 : n_j - 1] while the text says "starting from a single job": k runs
    from 1 to |J|. The pseudo-code returns the last G, which at the break is
    the one that did not improve; the best one is returned.
    """
    ids = [p.id for p in profiles]
    if len(set(ids)) != len(ids):
        raise ValueError("duplicate job ids")
    if not profiles or machines < 1:
        return Plan([], ids, (0.0, 0.0))
    work, base, remote = _arrays(profiles)
    memo: dict = {}     # ``_reshape``'s looks at groups of jobs: the same for every k
    seen: list[tuple[int, tuple[float, list[list[int]], np.ndarray]]] = []
    best_s, best_k = -1.0, 0
    ks = _k_steps(len(profiles), literal)
    pos = 0
    while pos < len(ks):
        # the job-set sizes surely tried next, worked out together so that
        # their _reshape looks batch (_reshape_all): the search stops only at
        # a k >= max(2 * best_k, best_k + 3), and best_k never shrinks
        end = pos + 1
        if not literal:
            stop = max(2 * best_k, best_k + 3)
            while end < len(ks) and ks[end - 1] < stop and ks[end] <= _REFINE_MAX_JOBS:
                end += 1
        chunk = ks[pos:end]
        pos = end
        for k, cand in zip(chunk, _candidates(work, base, remote, machines, chunk, literal,
                                              memo)):
            seen.append((k, cand))
            if cand[0] > best_s:
                best_s, best_k = cand[0], k
            elif literal or k >= max(2 * best_k, best_k + 3):
                pos = len(ks)
                break
    # fewer jobs: the smallest job set whose U is within _FEWER_JOBS of the best
    floor = best_s * (1 - (0.0 if literal else _FEWER_JOBS))
    best_k, best = next((k, c) for k, c in seen if c[0] >= floor)
    _, groups, alloc = best
    t, u_cpu, u_net = _evaluate(work, base, remote, groups, alloc, machines)
    planned = [PlannedGroup(tuple(ids[j] for j in g), int(a), float(ti))
               for g, a, ti in zip(groups, alloc, t)]
    return Plan(planned, ids[best_k:], (u_cpu, u_net))
