"""Grouping jobs and sizing groups: Algorithms 1 and 2 of §4.3.2.

``schedule`` (Algorithm 1) grows the set of jobs to run, taken in the given
order, while the cluster utilization U improves; for each candidate set it
picks the number of groups that balances CPU and network at equal DoP,
assigns jobs to groups (``assign_jobs``, Algorithm 2) and sizes the groups
(``allocate_machines``). The internals work on numpy arrays of
(work = Tcpu * c_g, base, remote) so that thousands of jobs schedule in well
under a second; the public helpers take and return ``Profile`` objects.

Decision (a deviation from the paper, see ``model``): a job's COMM time on m
machines is Tnet(m) = base + remote * (1 - 1/m), not a constant, because the
traffic to a machine's own server shard does not cross the network. Every
step below judges COMM at the DoP it assumes or allocates: Algorithm 1's n_G
at DoP M / n_G, Algorithm 2 at that DoP, the machine allocation at each
group's current m, the refinements at the split they evaluate. ``remote`` is
None throughout when every job has remote = 0 (the paper's model, and the
fast paths: results are then exactly those of the constant-Tnet code).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
import math

import numpy as np

from harmony.sched.model import CPU_WEIGHT, Profile, score

# Relative tolerance for "reduces the imbalance" in the swap fine-tuning, so
# that float noise cannot make swaps cycle.
_EPS = 1e-12
# Tuning of the non-literal Algorithm 1 (see ``schedule``)
_ALL_N_GROUPS = 8       # try every n_G up to this many
_REFINE_MAX_JOBS = 16   # model fine-tuning for job sets of at most this many jobs
_REFINE_MAX_GROUPS = 8  # ... in at most this many groups (it visits every pair)
_REFINE_TOP = 3         # ... on the three best n_G values per job set (remote > 0: all)
_REFINE_SKIP = 0.01     # ... leaving pairs of groups already within 1% of full U
_ALL_SPLITS = 8         # remote > 0: every machine split of pairs on up to 8 machines
_RESHAPE_ROUNDS = 3     # remote > 0: rounds of re-splits, merges and splits (_reshape)
_EXHAUSTIVE_PAIR = 8    # every split of two groups up to this many jobs, else moves/swaps
_FEWER_JOBS = 5e-3      # the smallest job set within this fraction of the best U wins
_BATCH_MIN = 2          # _Looks.settle: re-splits batched (_best_splits) from this many on


@dataclass(frozen=True)
class PlannedGroup:
    """One group of a plan: its jobs, how many machines it gets, and the
    group iteration time the model predicts for it there (Eq 4.1)."""
    jobs: tuple[str, ...]
    machines: int
    predicted_iter: float


@dataclass
class Plan:
    """A scheduling decision: groups to run, the jobs left waiting (in the
    order they were given) and the predicted cluster utilization
    (cpu, net) of Eq 4.4 over all machines."""
    groups: list[PlannedGroup] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)
    util: tuple[float, float] = (0.0, 0.0)

    @property
    def score(self) -> float:
        """U as one number (``model.score``)."""
        return score(*self.util)


# ---------------------------------------------------------------- internals
def _arrays(profiles: Sequence[Profile]
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(work, base, remote) per job: Tcpu * c_g, Tnet(1) and R (``model``);
    remote is None when every job's R is 0 (then base is Tnet)."""
    n = len(profiles)
    work = np.fromiter((p.t_cpu * p.dop for p in profiles), float, n)
    base = np.fromiter((p.net_base for p in profiles), float, n)
    if not any(p.remote > 0 for p in profiles):
        return work, base, None
    return work, base, np.fromiter((p.remote for p in profiles), float, n)


def _net(base: np.ndarray, remote: np.ndarray | None, m) -> np.ndarray:
    """Tnet at DoP ``m`` (a number or an array broadcasting against base):
    base + remote * (1 - 1/m)."""
    if remote is None:
        return base
    return base + remote * (1.0 - 1.0 / np.asarray(m, dtype=float))


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


def _allocate(work_sum: np.ndarray, net_sum: np.ndarray, machines: int,
              remote_sum: np.ndarray | None = None) -> np.ndarray:
    """One machine per group, then one more at a time to the most
    computation-bound group, i.e. the largest sum Tcpu(m_g) / sum Tnet(m_g)
    at the group's current m_g. With constant Tnet (``remote_sum`` None or
    all 0; ``net_sum`` is then sum Tnet) that is (work_g / net_g) / m_g, and
    handing out machines one at a time by the largest w_g / m_g is D'Hondt
    apportionment of the extra machines with weights w_g = work_g / net_g,
    computed here in closed form (bisection on the divisor) instead of a
    loop over ten thousand machines. Otherwise ``net_sum`` is the groups'
    summed base and ``_allocate_remote`` does the same with Tnet(m)."""
    n_g = len(work_sum)
    if n_g > machines:
        raise ValueError(f"{n_g} groups need at least {n_g} machines, have {machines}")
    if n_g == 0:
        return np.zeros(0, dtype=np.int64)
    if remote_sum is not None and (remote_sum > 0).any() and (work_sum > 0).any():
        return _allocate_remote(work_sum, net_sum, remote_sum, machines)
    w = work_sum / np.maximum(net_sum, 1e-12 * np.maximum(work_sum, 1e-300))
    if not (w > 0).any():
        w = np.ones(n_g)    # no COMP at all: spread the machines evenly
    extra = machines - n_g
    m = np.ones(n_g, dtype=np.int64)
    if extra == 0:
        return m
    # group g holding k extras gets the next at priority w_g / (k + 1); with
    # divisor d it holds floor(w_g / d) extras. Find d where that sums to <= extra.
    lo = w.sum() / (extra + n_g + 1)     # count(lo) > extra
    hi = w.max() * (1 + 1e-9)            # count(hi) == 0
    for _ in range(100):
        mid = np.sqrt(lo * hi) if lo > 0 else hi / 2
        if np.floor(w / mid).sum() > extra:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    k = np.floor(w / hi).astype(np.int64)
    left = extra - int(k.sum())
    if left > 0:       # ties at the divisor: by priority, then group order
        pri = w / (k + 1)
        take = np.lexsort((np.arange(n_g), -pri))[:left]
        k[take] += 1
    return m + k


def _allocate_remote(work: np.ndarray, base: np.ndarray, remote: np.ndarray,
                     machines: int) -> np.ndarray:
    """``_allocate`` with Tnet_g(m) = base_g + remote_g * (1 - 1/m): the
    next machine goes to the largest (work_g / m) / Tnet_g(m) at the current
    m = k + 1 (k extra machines held), i.e. work_g / (b_g + k * s_g) with
    b_g = base_g, s_g = base_g + remote_g. That is decreasing in k, so one
    machine at a time is the same as taking the ``extra`` largest of all
    these priorities, and the closed form survives as a divisor method with
    group-specific steps: at threshold d group g holds the extras of
    priority >= d, floor((work_g / d - b_g) / s_g) + 1 of them (0 when
    work_g / d < b_g); bisection on d, ties by priority then group order.

    Decision: "the most computation-bound" is judged with Tnet at the
    group's current m, so a group whose COMM grows with m (remote > 0)
    stops taking machines sooner than the paper's constant-Tnet rule would
    have it. A group with no COMM at one machine (base 0) gets the weight
    the constant case gives a group without COMM (base floored at 1e-12 of
    its work)."""
    n_g = len(work)
    extra = machines - n_g
    if extra <= 0:
        return np.ones(n_g, dtype=np.int64)
    b = np.maximum(base, 1e-12 * np.maximum(work, 1e-300))
    s = b + remote

    def count(d: float) -> np.ndarray:
        x = (work / d - b) / s
        return np.where(x >= 0, np.floor(x) + 1, 0.0).astype(np.int64)

    lo, hi = float((work / s).sum()) / (extra + n_g + 1), float((work / b).max()) * (1 + 1e-9)
    c_lo, c_hi = count(lo), count(hi)       # c_lo.sum() > extra >= c_hi.sum() == 0
    for _ in range(200):                    # until few extras lie in [lo, hi)
        if int(c_lo.sum() - c_hi.sum()) <= 2 * n_g + 16 or hi - lo <= 1e-12 * hi:
            break
        mid = np.sqrt(lo * hi)
        c = count(mid)
        if c.sum() > extra:
            lo, c_lo = mid, c
        else:
            hi, c_hi = mid, c
    # the extras between: by priority, then group order (one at a time would
    # take them in that order; a group's own priorities strictly decrease)
    k = c_hi
    left = extra - int(k.sum())
    if left > 0:
        span = np.maximum(c_lo - c_hi, 0)
        g = np.repeat(np.arange(n_g), span)
        kk = np.repeat(c_hi, span) + (np.arange(len(g)) - np.repeat(np.cumsum(span) - span, span))
        pri = work[g] / (b[g] + kk * s[g])
        take = g[np.lexsort((g, -pri))[:left]]
        k = k + np.bincount(take, minlength=n_g)
    return 1 + k


def _evaluate(work: np.ndarray, base: np.ndarray, remote: np.ndarray | None,
              groups: list[list[int]], alloc: np.ndarray, machines: int
              ) -> tuple[np.ndarray, float, float]:
    """Eq 4.1 per group at its allocated DoP, and Eq 4.3-4.4 over
    ``machines``, with each job's Tnet at its group's DoP."""
    label = np.empty(len(work), dtype=np.int64)
    idx = np.empty(len(work), dtype=np.int64)
    pos = 0
    for gi, g in enumerate(groups):
        label[pos:pos + len(g)] = gi
        idx[pos:pos + len(g)] = g
        pos += len(g)
    label, idx = label[:pos], idx[:pos]
    n_g = len(groups)
    m = alloc.astype(float)
    tcpu = work[idx] / m[label]
    jnet = base[idx] if remote is None else _net(base[idx], remote[idx], m[label])
    cpu = np.bincount(label, tcpu, n_g)
    nets = np.bincount(label, jnet, n_g)
    top = np.zeros(n_g)
    np.maximum.at(top, label, tcpu + jnet)
    t = np.maximum(np.maximum(cpu, nets), top)
    safe = np.where(t > 0, t, 1.0)
    u_cpu = float((m * cpu / safe).sum() / machines)
    u_net = float((m * nets / safe).sum() / machines)
    return t, u_cpu, u_net


def _group_value(w: np.ndarray, nb: np.ndarray, nr: np.ndarray | None, m: float) -> float:
    """m_g * score(U(g)) for one group (jobs' work ``w``, base ``nb``,
    remote ``nr``) on m machines; U is the sum of these over groups,
    divided by M."""
    if len(w) == 0:
        return 0.0
    n = _net(nb, nr, m)
    cpu, net = float(w.sum()) / m, float(n.sum())
    t = max(cpu, net, float((w / m + n).max()))
    if t <= 0:
        return 0.0
    return (CPU_WEIGHT * cpu + (1 - CPU_WEIGHT) * net) * m / t


def _np_sum(x: Sequence[float]) -> float:
    """``float(np.array(x).sum())`` bit for bit, on a list: numpy adds up a
    float64 array pairwise (eight running sums over blocks of up to 128,
    halves above that), which plain left-to-right addition matches only
    below eight terms."""
    n = len(x)
    if n < 8:
        r = 0.0
        for v in x:
            r += v
        return r
    if n > 128:
        h = n // 2
        h -= h % 8
        return _np_sum(x[:h]) + _np_sum(x[h:])
    r = list(x[:8])
    i, end = 8, n - n % 8
    while i < end:
        for k in range(8):
            r[k] += x[i + k]
        i += 8
    res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
    for v in x[end:]:
        res += v
    return res


def _group_value_l(work: list[float], base: list[float], remote: list[float] | None,
                   g: Sequence[int], m: int) -> float:
    """``_group_value`` of jobs ``g`` (indices into the lists ``work``,
    ``base``, ``remote``) on ``m`` machines, the same float for float, in
    plain Python: on a handful of jobs numpy's per-call cost is most of it."""
    if not g:
        return 0.0
    w = [work[j] for j in g]
    if remote is None:
        n = [base[j] for j in g]
    else:
        f = 1.0 - 1.0 / float(m)
        n = [base[j] + remote[j] * f for j in g]
    cpu, net = _np_sum(w) / m, _np_sum(n)
    t = max(cpu, net, max(wj / m + nj for wj, nj in zip(w, n)))
    if t <= 0:
        return 0.0
    return (CPU_WEIGHT * cpu + (1 - CPU_WEIGHT) * net) * m / t


@lru_cache(maxsize=None)
def _pair_rows(a: int, b: int) -> np.ndarray:
    """Candidate splits of the union of two groups (sizes a and b, the first
    a columns being group A) into two non-empty groups, as boolean rows
    (True = in A): every split when a + b <= _EXHAUSTIVE_PAIR, else the
    current one, every single move and every single swap."""
    s = a + b
    if s <= _EXHAUSTIVE_PAIR:
        masks = np.arange(1, 2 ** (s - 1))     # the last job always in B
        return _frozen(((masks[:, None] >> np.arange(s)) & 1).astype(bool))
    base = np.zeros(s, dtype=bool)
    base[:a] = True
    rows = [base]
    if a > 1:
        r = np.repeat(base[None, :], a, 0)
        r[np.arange(a), np.arange(a)] = False
        rows.extend(r)
    if b > 1:
        r = np.repeat(base[None, :], b, 0)
        r[np.arange(b), a + np.arange(b)] = True
        rows.extend(r)
    r = np.repeat(base[None, :], a * b, 0)
    ia, ib = np.divmod(np.arange(a * b), b)
    r[np.arange(a * b), ia] = False
    r[np.arange(a * b), a + ib] = True
    rows.extend(r)
    return _frozen(np.array(rows))


def _frozen(x: np.ndarray) -> np.ndarray:
    x.setflags(write=False)     # cached and shared: nobody may change it
    return x


@lru_cache(maxsize=None)
def _split_rows(n: int) -> np.ndarray:
    """Candidate splits of one group of ``n`` jobs in two (``_reshape``'s
    splits): every split up to _EXHAUSTIVE_PAIR jobs, else each job alone."""
    return _pair_rows(n - 1, 1) if n <= _EXHAUSTIVE_PAIR else _frozen(~np.eye(n, dtype=bool))


def _best_split(rows: np.ndarray, w: np.ndarray, n: np.ndarray, nr: np.ndarray | None,
                mt: int, m_now: int) -> tuple[float, int, int]:
    """Best (value, row, machines of A) over candidate splits ``rows`` of a
    job set sharing ``mt`` machines; ``n`` holds the jobs' base and ``nr``
    their remote (None: constant Tnet = n). Machine splits tried per row:
    the balance points of A (where COMP = COMM: work_A / m = base_A +
    remote_A * (1 - 1/m), m = (work_A + remote_A) / (base_A + remote_A);
    work_A / net_A for constant Tnet) and of B, their proportional split,
    and the current one. Each split is evaluated with Tnet at its DoP; with
    remote and at most _ALL_SPLITS machines, every split is tried."""
    wa, na = rows @ w, rows @ n
    wb, nb = w.sum() - wa, n.sum() - na
    if nr is not None and mt <= _ALL_SPLITS:
        return _best_split_all(rows, w, n, nr, mt, wa, na, wb, nb)
    if nr is None:
        ra = wa / np.maximum(na, 1e-12)
        rb = wb / np.maximum(nb, 1e-12)
    else:
        qa = rows @ nr
        qb = nr.sum() - qa
        ra = (wa + qa) / np.maximum(na + qa, 1e-12)
        rb = (wb + qb) / np.maximum(nb + qb, 1e-12)
    prop = mt * ra / np.maximum(ra + rb, 1e-12)
    ma = np.clip(np.stack([np.floor(ra), np.ceil(ra), mt - np.floor(rb), mt - np.ceil(rb),
                           np.floor(prop), np.ceil(prop), np.full_like(ra, m_now)]),
                 1, mt - 1)                          # (splits, rows)
    mb = mt - ma
    if nr is None:
        ja = np.where(rows, w / ma[:, :, None] + n, 0.0).max(2)
        jb = np.where(rows, 0.0, w / mb[:, :, None] + n).max(2)
    else:      # Tnet at each side's DoP, per job and summed
        fa, fb = 1.0 - 1.0 / ma, 1.0 - 1.0 / mb
        ja = np.where(rows, w / ma[:, :, None] + n + nr * fa[:, :, None], 0.0).max(2)
        jb = np.where(rows, 0.0, w / mb[:, :, None] + n + nr * fb[:, :, None]).max(2)
        na, nb = na + qa * fa, nb + qb * fb
    v = _pair_value(wa / ma, na, ja, ma) + _pair_value(wb / mb, nb, jb, mb)
    c, i = np.unravel_index(int(np.argmax(v)), v.shape)
    return float(v[c, i]), int(i), int(ma[c, i])


def _pair_value(cpu: np.ndarray, net: np.ndarray, top: np.ndarray, m: np.ndarray) -> np.ndarray:
    """m * score(U) of one side of a split: summed Tcpu ``cpu``, summed Tnet
    ``net``, longest job iteration ``top`` (Eq 4.1, 4.3), on ``m`` machines."""
    t = np.maximum(np.maximum(cpu, net), top)
    return (CPU_WEIGHT * cpu + (1 - CPU_WEIGHT) * net) * m / np.where(t > 0, t, 1.0)


def _best_split_all(rows: np.ndarray, w: np.ndarray, n: np.ndarray, nr: np.ndarray, mt: int,
                    wa: np.ndarray, na: np.ndarray, wb: np.ndarray, nb: np.ndarray
                    ) -> tuple[float, int, int]:
    """``_best_split`` with remote COMM trying every machine split 1..mt-1
    (the same for every row, so per-job times are computed once per split)."""
    ma = np.arange(1, mt, dtype=float)[:, None]          # (splits, 1)
    mb = mt - ma
    fa, fb = 1.0 - 1.0 / ma, 1.0 - 1.0 / mb
    qa = rows @ nr
    qb = nr.sum() - qa
    ta_job = (w / ma + n + nr * fa)[:, None, :]         # (splits, 1, jobs)
    tb_job = (w / mb + n + nr * fb)[:, None, :]
    ja = np.where(rows, ta_job, 0.0).max(2)              # (splits, rows)
    jb = np.where(rows, 0.0, tb_job).max(2)
    v = _pair_value(wa / ma, na + qa * fa, ja, ma) + _pair_value(wb / mb, nb + qb * fb, jb, mb)
    c, i = np.unravel_index(int(np.argmax(v)), v.shape)
    return float(v[c, i]), int(i), int(ma[c, 0])


def _best_split_small(rows: np.ndarray, w: list[float], n: list[float], nr: list[float],
                      mt: int, m_now: int) -> tuple[float, int, int]:
    """``_best_split`` with remote COMM and mt > _ALL_SPLITS for at most
    three jobs (lists ``w``, ``n``, ``nr``), the same result bit for bit, in
    plain Python: there numpy's per-call cost is nearly all of the time.
    Each side of a split of three jobs holds at most two, whose sum is the
    same in any order, so ``rows @ w`` is exact here; the totals are added
    left to right like numpy's ``sum`` of fewer than eight numbers.
    Everything else is ``_best_split``'s float operations, on the distinct
    (row, machines of A) only; ties go, as ``np.argmax`` over its (splits,
    rows) array, to the first candidate split, then the first row."""
    assert len(w) <= 3
    sw = sn = sq = 0.0
    for wj, nj, rj in zip(w, n, nr):
        sw += wj
        sn += nj
        sq += rj
    hi = mt - 1
    cw, nw = CPU_WEIGHT, 1 - CPU_WEIGHT
    side_a, side_b = _row_sides(rows)
    at_a: dict[int, list[float]] = {}     # machines -> each job's time on them
    at_b: dict[int, list[float]] = {}
    values = []                          # per row: {machines of A: value}
    cands = []                           # per row: the 7 candidate machines of A
    for ia, ib in zip(side_a, side_b):
        wa = na = qa = 0.0
        for j in ia:
            wa += w[j]
            na += n[j]
            qa += nr[j]
        wb, nb, qb = sw - wa, sn - na, sq - qa
        ra = (wa + qa) / max(na + qa, 1e-12)
        rb = (wb + qb) / max(nb + qb, 1e-12)
        prop = mt * ra / max(ra + rb, 1e-12)
        # clip(floor(x)) == floor(clip(x)) on [1, mt - 1], and clamping to
        # +-1e18 first keeps math.floor off infinities without changing it
        ra, rb, prop = (min(max(x, -1e18), 1e18) for x in (ra, rb, prop))
        cs = [min(max(c, 1), hi) for c in (math.floor(ra), math.ceil(ra), mt - math.floor(rb),
                                           mt - math.ceil(rb), math.floor(prop),
                                           math.ceil(prop), m_now)]
        cands.append(cs)
        vals: dict[int, float] = {}
        for ma in cs:
            if ma in vals:
                continue
            mb = mt - ma
            fa, fb = 1.0 - 1.0 / ma, 1.0 - 1.0 / mb
            ta = at_a.get(ma)
            if ta is None:
                ta = at_a[ma] = [wj / ma + nj + rj * fa for wj, nj, rj in zip(w, n, nr)]
            tb = at_b.get(mb)
            if tb is None:
                tb = at_b[mb] = [wj / mb + nj + rj * fb for wj, nj, rj in zip(w, n, nr)]
            cpu, net = wa / ma, na + qa * fa
            t = max(cpu, net, 0.0, *[ta[j] for j in ia])
            va = (cw * cpu + nw * net) * ma / (t if t > 0 else 1.0)
            cpu, net = wb / mb, nb + qb * fb
            t = max(cpu, net, 0.0, *[tb[j] for j in ib])
            vals[ma] = va + (cw * cpu + nw * net) * mb / (t if t > 0 else 1.0)
        values.append(vals)
    best, bi, bm = -math.inf, 0, 0
    for c in range(7):
        for i, (cs, vals) in enumerate(zip(cands, values)):
            v = vals[cs[c]]
            if v > best:
                best, bi, bm = v, i, cs[c]
    return best, bi, bm


@lru_cache(maxsize=None)
def _row_sides_cached(key: bytes, shape: tuple[int, int]) -> tuple[tuple, tuple]:
    rows = np.frombuffer(key, dtype=bool).reshape(shape)
    return (tuple(tuple(np.flatnonzero(r).tolist()) for r in rows),
            tuple(tuple(np.flatnonzero(~r).tolist()) for r in rows))


def _row_sides(rows: np.ndarray) -> tuple[tuple, tuple]:
    """Per row, the job positions in side A and in side B."""
    return _row_sides_cached(rows.tobytes(), rows.shape)


def _split_sums(rows: np.ndarray, u: list[int], work: np.ndarray, base: np.ndarray,
                remote: np.ndarray, lists: tuple[list[float], list[float], list[float]]
                ) -> tuple[tuple[float, float, float], list[tuple[float, float, float]]]:
    """For ``_best_splits``: the totals (work, base, remote) of jobs ``u``
    as ``w.sum()`` gives them, and per row of ``rows`` side A's sums as
    ``rows @ w`` gives them (on at most three jobs a side holds at most two,
    whose sum is the same in any order: added here in plain Python)."""
    work_l, base_l, remote_l = lists
    ws, ns, rs = [work_l[j] for j in u], [base_l[j] for j in u], [remote_l[j] for j in u]
    totals = (_np_sum(ws), _np_sum(ns), _np_sum(rs))
    if len(u) > 3:
        x = np.array(u)
        return totals, list(zip((rows @ work[x]).tolist(), (rows @ base[x]).tolist(),
                                (rows @ remote[x]).tolist()))
    row_sums = []
    for side in _row_sides(rows)[0]:
        wa = na = qa = 0.0
        for j in side:
            wa += ws[j]
            na += ns[j]
            qa += rs[j]
        row_sums.append((wa, na, qa))
    return totals, row_sums


@lru_cache(maxsize=None)
def _padded_cached(key: bytes, shape: tuple[int, int], width: int) -> np.ndarray:
    rows = np.frombuffer(key, dtype=bool).reshape(shape)
    out = np.zeros((shape[0], width), dtype=bool)
    out[:, :shape[1]] = rows
    return _frozen(out)


def _padded(rows: np.ndarray, width: int) -> np.ndarray:
    """``rows`` with False columns added up to ``width``."""
    return _padded_cached(rows.tobytes(), rows.shape, width)


def _best_splits(items: Sequence[tuple[np.ndarray, list[int], int, int]],
                 work: np.ndarray, base: np.ndarray, remote: np.ndarray,
                 lists: tuple[list[float], list[float], list[float]], cache: dict
                 ) -> list[tuple[float, int, int]]:
    """``_best_split(rows, work[u], base[u], remote[u], mt, m_now)`` for each
    item (rows, u, mt, m_now) with mt > _ALL_SPLITS and remote COMM, the
    same results bit for bit, with the work on the candidate machine splits
    done once for all items: numpy's per-call cost is most of the time on
    one pair's few rows. ``lists`` holds work, base and remote as lists;
    ``cache`` keeps ``_split_sums`` per job set and rows between calls on
    the same arrays.

    Every number comes from the same float operations as in
    ``_best_split``: an item's side-A sums are its own ``rows @ w``
    products (BLAS's summation order), except on at most three jobs, where
    a side holds at most two and any order gives the same sum; totals are
    added as numpy's ``sum`` does (``_np_sum``); the rest is elementwise.
    Jobs are padded to the largest item with zeros, which ``max`` ignores
    (every job time is >= 0); ties go, as ``np.argmax`` over the (splits,
    rows) array, to the first split, then the first row."""
    n_rows, sides, sums, padded, masks = [], [], [], [], []
    width = max(len(u) for _, u, _, _ in items)
    pad = len(work)
    for rows, u, mt, m_now in items:
        n_rows.append(len(rows))
        # what depends on the jobs alone (not on the machines) is kept in
        # ``cache``: the same job set comes back on other machine counts
        key = (tuple(u), id(rows))     # rows: from _pair_rows' cache, never freed
        got = cache.get(key)
        if got is None:
            got = cache[key] = _split_sums(rows, u, work, base, remote, lists)
        totals, row_sums = got
        sums.append((*totals, mt, m_now))
        sides.extend(row_sums)
        padded.append(u + [pad] * (width - len(u)))
        masks.append(_padded(rows, width))
    total = len(sides)
    item = np.repeat(np.arange(len(items)), n_rows)            # item of each row
    starts = np.cumsum(n_rows) - n_rows
    sw, sn, sq, mt, m_now = np.array(sums, dtype=float)[item].T
    wa, na, qa = np.array(sides).T
    wb, nb, qb = sw - wa, sn - na, sq - qa
    # each row's jobs, padded with zeros; in_a: side A, in_b: side B
    idx = np.array(padded)[item]
    w = np.append(work, 0.0)[idx]
    n = np.append(base, 0.0)[idx]
    nr = np.append(remote, 0.0)[idx]
    in_a = np.concatenate(masks)
    in_b = (idx != pad) & ~in_a
    # as _best_split from here on, elementwise over all rows at once
    ra = (wa + qa) / np.maximum(na + qa, 1e-12)
    rb = (wb + qb) / np.maximum(nb + qb, 1e-12)
    prop = mt * ra / np.maximum(ra + rb, 1e-12)
    ma = np.minimum(np.maximum(np.stack([np.floor(ra), np.ceil(ra), mt - np.floor(rb),
                                         mt - np.ceil(rb), np.floor(prop), np.ceil(prop),
                                         m_now]), 1), mt - 1)      # (splits, rows)
    mb = mt - ma
    fa, fb = 1.0 - 1.0 / ma, 1.0 - 1.0 / mb
    ja = np.where(in_a, w / ma[:, :, None] + n + nr * fa[:, :, None], 0.0).max(2)
    jb = np.where(in_b, w / mb[:, :, None] + n + nr * fb[:, :, None], 0.0).max(2)
    v = _pair_value(wa / ma, na + qa * fa, ja, ma) + _pair_value(wb / mb, nb + qb * fb, jb, mb)
    # per item, the first maximum in (split, row) order
    top = np.maximum.reduceat(v.max(0), starts)
    key = np.where(v == top[item], np.arange(len(v))[:, None] * total + np.arange(total),
                   len(v) * total).min(0)
    out = []
    for lo, f in zip(starts.tolist(), np.minimum.reduceat(key, starts).tolist()):
        c, r = divmod(f, total)
        out.append((float(v[c, r]), r - lo, int(ma[c, r])))
    return out


def _refine(work: np.ndarray, base: np.ndarray, remote: np.ndarray | None,
            groups: list[list[int]], alloc: np.ndarray, machines: int, rounds: int = 2
            ) -> np.ndarray:
    """Fine-tuning on the model itself (an extension; see ``schedule``): for
    every pair of groups, re-split their jobs and their machines the way that
    maximizes the pair's share of U (every split for small pairs, single
    moves and swaps for larger ones), until a round changes nothing or
    ``rounds`` rounds. A change must raise U by more than 0.01%.
    Updates ``groups`` in place; returns the new allocation."""
    alloc = alloc.copy()
    n_g = len(groups)
    # a pair is looked at again only when one of its groups changed since
    version = [0] * n_g
    seen: dict[tuple[int, int], tuple[int, int]] = {}
    for _ in range(rounds):
        changed = False
        for a in range(n_g):
            for b in range(a + 1, n_g):
                mt = int(alloc[a] + alloc[b])
                if mt < 2 or seen.get((a, b)) == (version[a], version[b]):
                    continue
                seen[(a, b)] = (version[a], version[b])
                ga, gb = groups[a], groups[b]
                now = _group_value(work[ga], base[ga], None if remote is None else remote[ga],
                                   alloc[a]) + \
                    _group_value(work[gb], base[gb], None if remote is None else remote[gb],
                                 alloc[b])
                if now >= mt * (1 - _REFINE_SKIP):
                    continue       # both groups (nearly) at 100%: little to gain
                u = np.array(groups[a] + groups[b])
                rows = _pair_rows(len(groups[a]), len(groups[b]))
                v, i, ma = _best_split(rows, work[u], base[u],
                                       None if remote is None else remote[u], mt, int(alloc[a]))
                if v > now + 1e-4 * machines:
                    groups[a], groups[b] = u[rows[i]].tolist(), u[~rows[i]].tolist()
                    alloc[a], alloc[b] = ma, mt - ma
                    version[a] += 1
                    version[b] += 1
                    seen[(a, b)] = (version[a], version[b])
                    changed = True
        if not changed:
            break
    return alloc


def _reshape(work: np.ndarray, base: np.ndarray, remote: np.ndarray | None,
             groups: list[list[int]], alloc: np.ndarray, machines: int,
             memo: dict | None = None, rounds: int = _RESHAPE_ROUNDS) -> np.ndarray:
    """``_refine`` with moves that change the number of groups, used when
    jobs have remote > 0. Each round: (1) every pair of groups is re-split
    (jobs and machines) as in ``_refine``; (2) every pair is merged into one
    group on their machines; (3) every group of at least two jobs and two
    machines is split into two sharing its machines (every split of up to
    _EXHAUSTIVE_PAIR jobs, else each job on its own); each move is made
    where it raises the pair's (or group's) share of U by more than 0.01% of
    M. Rounds stop when one changes nothing, or after ``rounds``. Groups
    (nearly) at full utilization are left alone, as in ``_refine``; the
    outcome of each look at a pair or group is kept in ``memo`` (keyed by
    job indices and machines: valid for every call on prefixes of the same
    job arrays and the same M), so a configuration another candidate
    already went through costs nothing. Updates ``groups`` in place (it may
    grow or shrink); returns the allocation.

    Decision: with COMM growing with DoP, a group on few machines pays
    little remote COMM, so good plans often hold small groups (or a few
    jobs together on one machine) that Algorithm 1's equal-DoP choice of
    n_G misses, and pair re-splits alone keep n_G and stall short of them.
    On the random instances of tests/test_sched_grouping.py (R = 0.5-1 x
    Tnet, 160 instances of 5-8 jobs) the worst plan was 0.93 of the prefix
    optimum with ``_refine`` on the three best n_G, 0.945 with ``_refine``
    on every n_G, and 0.996 with these moves on every n_G (``schedule``)."""
    return _reshape_all(work, base, remote, [(groups, alloc)], machines, memo, rounds)[0]


def _reshape_all(work: np.ndarray, base: np.ndarray, remote: np.ndarray | None,
                 plans: Sequence[tuple[list[list[int]], np.ndarray]], machines: int,
                 memo: dict | None = None, rounds: int = _RESHAPE_ROUNDS) -> list[np.ndarray]:
    """``_reshape`` of each (groups, alloc) of ``plans`` (groups updated in
    place; returns the allocations), run side by side so that the re-splits
    all of them look at are worked out together, in batches
    (``_best_splits``). Each plan goes through exactly ``_reshape``'s steps;
    a look's outcome depends on its key alone (``memo`` only caches), so
    the order in which looks are worked out changes nothing. Each round
    first asks for the re-splits of every pair as the groups stand (those
    that an earlier change in the round makes moot cost a little extra
    work, no change of outcome), then for any further one on its way."""
    looks = _Looks(work, base, remote, machines, {} if memo is None else memo)
    runs = [looks.reshape(groups, alloc, rounds) for groups, alloc in plans]
    out: list = [None] * len(runs)
    asks: dict[int, list[tuple]] = {}

    def advance(i: int) -> None:
        try:
            asks[i] = next(runs[i])
        except StopIteration as stop:
            out[i] = stop.value

    for i in range(len(runs)):
        advance(i)
    while asks:
        todo: dict = {}
        for i in sorted(asks):
            for ask in asks[i]:
                if ask[0] not in looks.memo:
                    todo.setdefault(ask[0], ask)
        looks.settle(list(todo.values()))
        for i in sorted(asks):
            del asks[i]
            advance(i)
    return out


class _Looks:
    """``_reshape``'s looks at groups of jobs (their values, and their best
    re-splits), cached in ``memo`` by job indices and machines."""

    def __init__(self, work: np.ndarray, base: np.ndarray, remote: np.ndarray | None,
                 machines: int, memo: dict) -> None:
        self.work, self.base, self.remote, self.machines, self.memo = \
            work, base, remote, machines, memo
        self.lists = (work.tolist(), base.tolist(), None if remote is None else remote.tolist())
        self.sums: dict = {}        # _best_splits' per job set sums

    def value(self, g: list[int], m: int) -> float:
        key = (tuple(g), m)
        v = self.memo.get(key)
        if v is None:
            v = self.memo[key] = _group_value_l(*self.lists, g, m)
        return v

    def settle(self, asks: list[tuple]) -> None:
        """Work out the re-splits ``asks`` (key, ga, ma_now, gb, mt, now):
        into ``memo`` the new split (jobs of A, jobs of B, machines of A) if
        it gains more than 0.01% of M, else None."""
        work, base, remote, machines = self.work, self.base, self.remote, self.machines
        single, batch = [], []
        for key, ga, ma_now, gb, mt, now in asks:
            u = ga + gb
            rows = _pair_rows(len(ga), len(gb)) if gb else _split_rows(len(u))
            (batch if remote is not None and mt > _ALL_SPLITS else single).append(
                (key, now, u, rows, mt, ma_now))
        if len(batch) < _BATCH_MIN:
            single += batch
            batch = []
        done = []
        for key, now, u, rows, mt, ma_now in single:
            if remote is not None and mt > _ALL_SPLITS and len(u) <= 3:
                work_l, base_l, remote_l = self.lists
                hit = _best_split_small(rows, [work_l[j] for j in u], [base_l[j] for j in u],
                                        [remote_l[j] for j in u], mt, ma_now)
            else:
                x = np.array(u)
                hit = _best_split(rows, work[x], base[x], None if remote is None else remote[x],
                                  mt, ma_now)
            done.append((key, now, u, rows, hit))
        if batch:
            hits = _best_splits([(rows, u, mt, ma_now) for *_, u, rows, mt, ma_now in batch],
                                work, base, remote, self.lists, self.sums)
            done += [(key, now, u, rows, hit)
                     for (key, now, u, rows, *_), hit in zip(batch, hits)]
        for key, now, u, rows, (v, i, ma) in done:
            a, b = _row_sides(rows)
            self.memo[key] = ([u[j] for j in a[i]], [u[j] for j in b[i]], ma) \
                if v > now + 1e-4 * machines else None

    def reshape(self, groups: list[list[int]], alloc: np.ndarray, rounds: int):
        """``_reshape`` as a generator: it yields the looks it needs next
        (lists of ``settle``'s asks), to be in ``memo`` when it resumes, and
        returns the allocation."""
        alloc_l = [int(x) for x in alloc]
        memo, value, machines = self.memo, self.value, self.machines
        for _ in range(rounds):
            changed = False
            for a in range(len(groups)):                 # (1) pair re-splits
                for b in range(a + 1, len(groups)):
                    ga, gb, mt = groups[a], groups[b], alloc_l[a] + alloc_l[b]
                    now = value(ga, alloc_l[a]) + value(gb, alloc_l[b])
                    if now >= mt * (1 - _REFINE_SKIP):
                        continue
                    key = ("split", tuple(ga), alloc_l[a], tuple(gb), mt)
                    if key not in memo:
                        yield [(key, ga, alloc_l[a], gb, mt, now)]
                    hit = memo[key]
                    if hit is not None:
                        groups[a], groups[b], alloc_l[a] = hit
                        alloc_l[b] = mt - alloc_l[a]
                        changed = True
            a = 0
            while a < len(groups):                       # (2) merges
                b = a + 1
                while b < len(groups):
                    ga, gb, mt = groups[a], groups[b], alloc_l[a] + alloc_l[b]
                    now = value(ga, alloc_l[a]) + value(gb, alloc_l[b])
                    if now < mt * (1 - _REFINE_SKIP) and \
                            value(ga + gb, mt) > now + 1e-4 * machines:
                        groups[a], alloc_l[a] = ga + gb, mt
                        del groups[b], alloc_l[b]
                        changed = True
                        continue
                    b += 1
                a += 1
            asks = []                                    # (3) splits, new groups last
            for g, mg in zip(groups, alloc_l):
                if len(g) >= 2 and mg >= 2:
                    now = value(g, mg)
                    if now < mg * (1 - _REFINE_SKIP):
                        asks.append((("split", tuple(g), mg // 2, (), mg), g, mg // 2, [], mg,
                                     now))
            yield asks
            for gi in range(len(groups)):
                g, mg = groups[gi], alloc_l[gi]
                if len(g) < 2 or mg < 2:
                    continue
                now = value(g, mg)
                if now >= mg * (1 - _REFINE_SKIP):
                    continue
                key = ("split", tuple(g), mg // 2, (), mg)
                if key not in memo:
                    yield [(key, g, mg // 2, [], mg, now)]
                hit = memo[key]
                if hit is not None:
                    groups[gi], new, alloc_l[gi] = hit
                    groups.append(new)
                    alloc_l.append(mg - alloc_l[gi])
                    changed = True
            if not changed:
                break
        return np.array(alloc_l, dtype=np.int64)


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


def choose_n_groups(profiles: Sequence[Profile], machines: int) -> int:
    """Algorithm 1 L6: the number of groups n_G in [1, min(|J|, M)] that
    minimizes sum_j |Tcpu_j(n_G) - Tnet_j(n_G)| at equal DoP M / n_G (ties:
    the larger n_G); Tnet_j(n_G) is ``model.t_net_at`` at that DoP."""
    if not profiles or machines < 1:
        raise ValueError("need at least one job and one machine")
    work, base, remote = _arrays(profiles)
    return _n_groups(work, base, remote, machines)


def allocate_machines(groups: Sequence[Sequence[Profile]], machines: int) -> list[int]:
    """Machines per group: one each, then one at a time to the group whose
    sum Tcpu(m_g) / sum Tnet(m_g) at its current m_g is largest (the most
    computation-bound), until all ``machines`` are handed out.

    Decision: the paper gives one machine at a time to "the most
    computation-intensive" group; that is measured here as the ratio of COMP
    to COMM time, not their difference, so that groups of short and of long
    jobs compare on the same scale. Decision: Tnet(m_g) is
    ``model.t_net_at`` at the group's current m_g, so a group whose remote
    COMM grows with m is spread less (see ``_allocate_remote``). Raises
    ValueError when there are more groups than machines (``schedule`` never
    asks for that: n_G <= M)."""
    work_sum = np.array([sum(p.work for p in g) for g in groups], dtype=float)
    base_sum = np.array([sum(p.net_base for p in g) for g in groups], dtype=float)
    remote_sum = np.array([sum(p.remote for p in g) for g in groups], dtype=float)
    return _allocate(work_sum, base_sum, machines, remote_sum).tolist()


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
