"""Algorithm 2: jobs into n_G groups at a DoP, then the swap fine-tuning.

Part of :mod:`harmony.sched.grouping` (see its docstring)."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from harmony.sched.model import Profile
from harmony.sched.grouping.base import _EPS, _arrays, _net


def _assign(work: np.ndarray, net: np.ndarray, n_groups: int, dop: float,
            max_swaps: int | None = None) -> list[list[int]]:
    """Algorithm 2 on arrays; returns lists of job indices, one per group.
    ``net`` is each job's Tnet at the assumed DoP ``dop`` (``_net``)."""
    n = len(work)
    if not 1 <= n_groups <= n:
        raise ValueError(f"cannot make {n_groups} non-empty groups of {n} jobs")
    tcpu = work / dop
    tdiff = tcpu - net
    titr = tcpu + net
    # L2: sort by job iteration time, descending (stable: ties keep input order)
    order = np.argsort(-titr, kind="stable")
    # the sorted list split by sign: jobs with Tdiff >= 0 and jobs with
    # Tdiff <= 0 (Tdiff = 0 in both), each in sorted order; L7 and L9 always
    # take the head of one of them
    od = tdiff[order]
    pos_q, neg_q = order[od >= 0].tolist(), order[od <= 0].tolist()
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    rank_l = rank.tolist()
    tdiff_l = tdiff.tolist()
    hp = hn = 0
    lp, ln = len(pos_q), len(neg_q)
    taken = bytearray(n)

    # L4-11: fill each group with floor(|J| / n_G) jobs. Decision: the paper's
    # pseudo-code loops "while |g| <= floor(|J|/n_G)", which would put one more
    # job in every group than there may be jobs; its text says "until each of
    # the n_G job groups are filled up with floor(|J|/n_G) jobs", followed here.
    per = n // n_groups
    label = np.full(n, -1, dtype=np.int64)
    groups: list[list[int]] = []
    for gi in range(n_groups):
        g: list[int] = []
        s = 0.0
        for _ in range(per):
            while hp < lp and taken[pos_q[hp]]:
                hp += 1
            while hn < ln and taken[neg_q[hn]]:
                hn += 1
            # L7: the largest job with Tdiff_j * Sdiff_g <= 0, else (L8-9) the
            # largest job left (pseudo-code "pop()"; the text says "largest")
            if hp < lp and (hn >= ln or s < 0 or
                            (s == 0 and rank_l[pos_q[hp]] < rank_l[neg_q[hn]])):
                j = pos_q[hp]
                hp += 1
            else:
                j = neg_q[hn]
                hn += 1
            taken[j] = 1
            g.append(j)
            s += tdiff_l[j]
        groups.append(g)
        label[g] = gi
    placed = label >= 0
    s_diff = np.bincount(label[placed], tdiff[placed], n_groups)

    # L12-22: the rest (< n_G jobs) by |Tdiff| descending, each to the group
    # that balances it best, skipping groups it would make job-bound
    rest = order[~placed[order]].tolist()
    if rest:
        rest.sort(key=lambda j: -abs(tdiff_l[j]))
        lab = label[placed]
        cpu_sum = np.bincount(lab, tcpu[placed], n_groups)
        net_sum = np.bincount(lab, net[placed], n_groups)
        max_itr = np.zeros(n_groups)
        np.maximum.at(max_itr, lab, titr[placed])
        for j in rest:
            cost = np.abs(tdiff[j] + s_diff)
            # L16-19: a group is skipped when j is longer than all its jobs and
            # g + {j} would be job-bound (Tg_itr = Tj_itr: j's COMM outlasts
            # the group's COMP and j's COMP outlasts the group's COMM). Note:
            # as written this never fires, since L7 fills every group first
            # with the largest job left, which is at least as long as j.
            bound = (titr[j] > max_itr) & (net[j] > cpu_sum) & (tcpu[j] > net_sum)
            if bound.all():
                # Decision (the paper does not say): every group would be
                # job-bound, so take the best-balancing one anyway
                gi = int(np.argmin(cost))
            else:
                gi = int(np.argmin(np.where(bound, np.inf, cost)))
            groups[gi].append(j)
            s_diff[gi] += tdiff[j]
            cpu_sum[gi] += tcpu[j]
            net_sum[gi] += net[j]
            max_itr[gi] = max(max_itr[gi], titr[j])

    _fine_tune(groups, s_diff, tdiff, max_swaps)
    return groups


def _fine_tune(groups: list[list[int]], s_diff: np.ndarray, tdiff: np.ndarray,
               max_swaps: int | None) -> None:
    """Swap fine-tuning of Algorithm 2 (text after the pseudo-code): take the
    most imbalanced group g_u = argmax |Sdiff_g| and its most complementary
    group argmax |Sdiff_gu - Sdiff_g|, swap the pair of jobs that balances the
    two best, provided the swap reduces the imbalance of both; repeat until
    no such swap exists. Each swap strictly lowers sum_g |Sdiff_g|, so this
    ends; ``max_swaps`` (default 4 * groups) bounds it anyway."""
    n_g = len(groups)
    if n_g < 2:
        return
    limit = 4 * n_g if max_swaps is None else max_swaps
    for _ in range(limit):
        abs_s = np.abs(s_diff)
        u = int(np.argmax(abs_s))
        far = np.abs(s_diff[u] - s_diff)
        far[u] = -1.0
        v = int(np.argmax(far))
        su, sv = s_diff[u], s_diff[v]
        if su * sv >= 0:
            return        # same sign: no swap can reduce both imbalances
        # swapping a (from u) with b (from v) moves delta = d_a - d_b from u to v:
        # S_u' = S_u - delta, S_v' = S_v + delta. Both shrink iff delta lies
        # strictly between 0 and 2*S_u and between 0 and -2*S_v; the best
        # balance of the two is at delta = (S_u - S_v) / 2.
        da = tdiff[groups[u]]
        db = tdiff[groups[v]]
        small = len(da) * len(db) <= 4096 or len(db) < 2
        delta = da[:, None] - db[None, :] if small else None
        target = (su - sv) / 2.0
        if delta is not None:
            ok = (np.abs(su - delta) < np.abs(su) * (1 - _EPS)) & \
                 (np.abs(sv + delta) < np.abs(sv) * (1 - _EPS))
            if not ok.any():
                return
            cost = np.where(ok, np.maximum(np.abs(su - delta), np.abs(sv + delta)), np.inf)
            ia, ib = np.unravel_index(int(np.argmin(cost)), cost.shape)
        else:   # large groups: for each a, the b whose d_b is nearest d_a - target
            ob = np.argsort(db)
            sb = db[ob]
            pos = np.clip(np.searchsorted(sb, da - target), 1, len(sb) - 1)
            best = None
            for cand in (pos - 1, pos):
                d = da - sb[cand]
                ok = (np.abs(su - d) < np.abs(su) * (1 - _EPS)) & \
                     (np.abs(sv + d) < np.abs(sv) * (1 - _EPS))
                c = np.where(ok, np.maximum(np.abs(su - d), np.abs(sv + d)), np.inf)
                k = int(np.argmin(c))
                if np.isfinite(c[k]) and (best is None or c[k] < best[0]):
                    best = (c[k], k, int(ob[cand[k]]))
            if best is None:
                return
            ia, ib = best[1], best[2]
        ja, jb = groups[u][ia], groups[v][ib]
        groups[u][ia], groups[v][ib] = jb, ja
        d = tdiff[ja] - tdiff[jb]
        s_diff[u] -= d
        s_diff[v] += d


# ------------------------------------------------------------------- public
def assign_jobs(profiles: Sequence[Profile], n_groups: int, dop: float,
                max_swaps: int | None = None) -> list[list[Profile]]:
    """Algorithm 2: split ``profiles`` into ``n_groups`` non-empty groups of
    complementary jobs, evaluating every job at ``dop`` machines (Algorithm 1
    assumes equal DoP, machines / n_groups). Groups of floor(|J|/n_G) jobs
    are filled largest-first with jobs of the opposite resource bias, the
    rest go where they balance best without making a group job-bound, then
    pairs of jobs are swapped between the most imbalanced group and its most
    complementary one while that helps both. Tnet is each job's at ``dop``
    (``model.t_net_at``)."""
    work, base, remote = _arrays(profiles)
    return [[profiles[j] for j in g]
            for g in _assign(work, _net(base, remote, dop), n_groups, dop, max_swaps)]
