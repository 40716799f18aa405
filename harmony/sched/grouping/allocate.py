"""Machines for each group: balancing CPU and network per group (with remote COMM, the splits that pay).

Part of :mod:`harmony.sched.grouping` (see its docstring)."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from harmony.sched.model import Profile


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
