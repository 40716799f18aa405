"""The value of a group on m machines (Eq 4.1-4.4 on arrays): ``_evaluate``, ``_group_value``.

Part of :mod:`harmony.sched.grouping` (see its docstring)."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from harmony.sched.model import CPU_WEIGHT
from harmony.sched.grouping.base import _net


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
