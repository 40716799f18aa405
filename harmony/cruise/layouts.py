"""Cruise's layout problem without the MILP: classes of machines, the exact
optimum over classes for disjoint roles, and heuristic layouts.

Machines i and k are interchangeable when swapping them maps every cost
term onto an equal one (same Cwproc, same links to every other machine and
to each other, same link to themselves). A cluster of N machines of K kinds
has K classes, and for disjoint roles (no machine both worker and server)
the problem only depends on how many workers and servers each class has
and on each class's block totals:

    Given the roles, a worker i of class c pays, per mini-batch,
    P_c = max(W·max_c' a_cc'·max_{j∈c'} m_j, Σ_c' a_cc'·M_c') (it holds no
    model itself, so every server j is another machine: a_ij = a_c,class(j)).
    (1) Spreading class c''s servers' M_c' blocks evenly (shares within
        one block) keeps every Σ term and lowers or keeps every max term:
        it is optimal for every worker at once.
    (2) The workers of class c then all cost f_c(d) = Cwproc_c·q·d +
        ⌈q·d/B⌉·P_c, one nondecreasing function of their own d: the
        largest of them is at least f_c(⌈D_c/W_c⌉), which the even spread
        of D_c reaches.
    (3) With idle machines allowed, a class's model is best held by as many
        of its non-workers as it has blocks: more servers lower the max.

So ``disjoint`` enumerates the workers per class and the model's split
over the classes (servers per class by (3)) and places the data exactly:
the epoch cost of a worker layout is the D-th cheapest block slot (each
worker offers f(1) ≤ f(2) ≤ ..., and holds at least one block). Its work
grows with Π(n_c+1)·C(M+K−1, K−1), not with N; ``size`` says how much.

With a machine both worker and server (``allow_both``) this is no longer
exact: a worker holding a shard of its own class pays less for it, so
uneven shares inside a class can be strictly better. 3 equal machines
(Cwproc 0.01 s, links 100 units/s), 7 data blocks of 100 items, 5 model
blocks of 10 units, B = 100: the optimum, 3.9 s, is d = (2, 2, 3),
m = (1, 1, 3) (the machine with most data keeps most model); every layout
whose shares differ by at most one costs 4.8 s or more. ``candidates``
therefore only gives layouts (upper bounds) for that case: each class all
workers, all servers, all both or idle, the model split over classes as
above. ``improve`` is a local search over any layout's roles and model
blocks (the data placed at its best), ``starts`` the layouts it starts from
when there are no classes to speak of.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
import itertools
import math
import time

import numpy as np

from harmony.cruise.costmodel import Machines, Workload


def swappable(machines: Machines, i: int, k: int) -> bool:
    """Swapping machines i and k maps every cost term onto an equal one."""
    wp, bw = machines.wproc, machines.bw
    if wp[i] != wp[k] or bw[i][i] != bw[k][k] or bw[i][k] != bw[k][i]:
        return False
    return all(bw[i][o] == bw[k][o] and bw[o][i] == bw[o][k]
               for o in range(len(wp)) if o not in (i, k))


def classes(machines: Machines) -> list[list[int]]:
    """Classes of interchangeable machines (every member swappable with the
    class's first, hence with each other), in order of first member."""
    out: list[list[int]] = []
    for i in range(len(machines)):
        for c in out:
            if swappable(machines, c[0], i):
                c.append(i)
                break
        else:
            out.append([i])
    return out


def spread(total: int, k: int) -> list[int]:
    """``total`` blocks over ``k`` owners, shares differing by at most one."""
    return [total // k + (1 if i < total % k else 0) for i in range(k)]


def batches(job: Workload, blocks: np.ndarray | int) -> np.ndarray:
    """⌈q·d/B⌉ mini-batches for d blocks (the cost model's rounding)."""
    return np.ceil(np.asarray(blocks, dtype=float) * job.items_per_block / job.batch - 1e-9)


def _splits(total: int, k: int) -> Iterator[tuple[int, ...]]:
    """Every way to write ``total`` as ``k`` parts ≥ 0."""
    for cuts in itertools.combinations(range(total + k - 1), k - 1):
        edges = (-1,) + cuts + (total + k - 1,)
        yield tuple(edges[t + 1] - edges[t] - 1 for t in range(k))


class _Kinds:
    """Per-class constants: sizes, seconds per data block, a_cc'."""

    def __init__(self, machines: Machines, job: Workload, cls: list[list[int]]) -> None:
        self.cls = cls
        self.size = np.array([len(c) for c in cls])
        self.cq = np.array([machines.wproc[c[0]] * job.items_per_block for c in cls])
        a = job.block_units / np.asarray(machines.bw, dtype=float)       # inf -> 0
        K = len(cls)
        self.a = np.zeros((K, K))           # a between distinct machines of c and c'
        for s, c in enumerate(cls):
            for t, e in enumerate(cls):
                other = [j for j in e if j != c[0]]
                self.a[s, t] = a[c[0], other[0]] if other else 0.0


def size(machines: Machines, job: Workload, cls: list[list[int]] | None = None) -> int:
    """Worker layouts × model splits that ``disjoint`` evaluates (an upper bound)."""
    cls = classes(machines) if cls is None else cls
    K = len(cls)
    return math.prod(len(c) + 1 for c in cls) * math.comb(job.model_blocks + K - 1, K - 1)


def data_cost(job: Workload, cq: np.ndarray, P: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The epoch cost of the best data split, per row: ``w[c]`` workers that
    each cost ``cq[c]``·d + ⌈q·d/B⌉·``P[r, c]`` for d blocks (d ≥ 1), D blocks
    in all. ``P``: rows × kinds; returns one cost per row."""
    D = job.data_blocks
    W = int(w.sum())
    act = np.flatnonzero(w > 0)
    dd = np.arange(1, D - W + 2)
    nb = batches(job, dd)
    # f[r, c, k]: the (k+1)-th block slot of a worker of kind c
    f = cq[act][None, :, None] * dd[None, None, :] + nb[None, None, :] * P[:, act][:, :, None]
    rows = f.shape[0]
    vals = f.reshape(rows, -1)
    if np.all(w[act] == 1):             # one worker per kind: the D-th value
        dth = np.partition(vals, D - 1, axis=1)[:, D - 1]
    else:
        wts = np.repeat(w[act], len(dd))
        order = np.argsort(vals, axis=1, kind="stable")
        cum = np.cumsum(wts[order], axis=1)
        k = np.argmax(cum >= D, axis=1)
        dth = np.take_along_axis(vals, order, axis=1)[np.arange(rows), k]
    return np.maximum(dth, f[:, :, 0].max(axis=1))


def place_data(job: Workload, cq: Sequence[float], P: Sequence[float], cost: float) -> list[int]:
    """Blocks per worker (``cq[i]``, ``P[i]`` as in ``data_cost``) that fit in
    ``cost``, D in all, at least one each."""
    D = job.data_blocks
    caps = []
    for c, p in zip(cq, P):
        dd = np.arange(1, D + 1)
        f = c * dd + batches(job, dd) * p
        caps.append(max(1, int(np.searchsorted(f, cost * (1 + 1e-12) + 1e-15, side="right"))))
    d = [1] * len(caps)
    left = D - len(caps)
    for i, cap in enumerate(caps):
        t = min(cap - 1, left)
        d[i] += t
        left -= t
    if left:
        raise AssertionError(f"{left} data blocks do not fit in {cost}")
    return d


def disjoint(machines: Machines, job: Workload, *, allow_idle: bool = True,
             cls: list[list[int]] | None = None,
             chunk: int = 4096) -> tuple[float, tuple[int, ...], tuple[int, ...]] | None:
    """The exact optimum with disjoint roles (module docstring): (cost, d, m),
    or None when no configuration fits."""
    cls = classes(machines) if cls is None else cls
    kinds = _Kinds(machines, job, cls)
    K, D, M = len(cls), job.data_blocks, job.model_blocks
    n = kinds.size
    best: tuple[float, np.ndarray, np.ndarray] | None = None
    for wv in itertools.product(*(range(s + 1) for s in n)):
        w = np.array(wv)
        W = int(w.sum())
        if W < 1 or W > D:
            continue
        avail = n - w
        if not allow_idle and avail.sum() > M:
            continue
        open_ = np.flatnonzero(avail > 0)
        if len(open_) == 0:
            continue
        it = _splits(M, len(open_))
        while True:
            rows = list(itertools.islice(it, chunk))
            if not rows:
                break
            Mc = np.zeros((len(rows), K))
            Mc[:, open_] = np.array(rows, dtype=float)
            S = np.minimum(avail[None, :], Mc) if allow_idle else np.broadcast_to(
                avail[None, :], Mc.shape).astype(float)
            if not allow_idle:
                ok = np.all(Mc >= S, axis=1)
                if not ok.any():
                    continue
                Mc, S = Mc[ok], S[ok]
            mu = np.where(S > 0, np.ceil(Mc / np.maximum(S, 1)), 0.0)
            # P[r, c] = max(W·max_c' a_cc' mu_c', Σ_c' a_cc' M_c')
            P = np.maximum(W * (kinds.a[None, :, :] * mu[:, None, :]).max(axis=2),
                           Mc @ kinds.a.T)
            cost = data_cost(job, kinds.cq, P, w)
            r = int(np.argmin(cost))
            if best is None or cost[r] < best[0]:
                best = (float(cost[r]), w.copy(), Mc[r].astype(int), P[r])
    if best is None:
        return None
    cost, w, Mc, P = best
    d, m = [0] * len(machines), [0] * len(machines)
    workers = [i for c, k in zip(cls, w) for i in c[:k]]
    wc = [s for s, k in enumerate(w) for _ in range(k)]
    for i, v in zip(workers, place_data(job, kinds.cq[wc], P[wc], cost)):
        d[i] = v
    for c, k, tot in zip(cls, w, Mc):
        rest = c[k:]
        s = min(len(rest), tot) if allow_idle else len(rest)
        for j, v in zip(rest[:s], spread(int(tot), s) if s else []):
            m[j] = v
    return cost, tuple(d), tuple(m)


def _per_machine_cost(machines: Machines, job: Workload, workers: np.ndarray,
                      m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Epoch cost (best data split) of each model layout (rows of ``m``)
    with the workers where ``workers`` is 1, and every machine's P per row."""
    a = job.block_units / np.asarray(machines.bw, dtype=float)
    w = np.asarray(workers, dtype=int)
    W = int(w.sum())
    # P[r, i] = max(W·max_j a_ij m_j, Σ_j a_ij m_j), in chunks of rows
    n = len(machines)
    P = np.empty((len(m), n))
    step = max(1, 2_000_000 // (n * n))
    for s in range(0, len(m), step):
        prod = a[None, :, :] * m[s:s + step, None, :]
        P[s:s + step] = np.maximum(W * prod.max(axis=2), prod.sum(axis=2))
    cq = np.array(machines.wproc) * job.items_per_block
    return data_cost(job, cq, P, w), P


def _layout(machines: Machines, job: Workload, workers: np.ndarray, m: np.ndarray,
            cost: float, P: np.ndarray) -> tuple[float, tuple[int, ...], tuple[int, ...]]:
    cq = np.array(machines.wproc) * job.items_per_block
    idx = np.flatnonzero(workers)
    d = [0] * len(machines)
    for i, v in zip(idx, place_data(job, cq[idx], P[idx], cost)):
        d[i] = v
    return cost, tuple(d), tuple(int(v) for v in m)


def candidates(machines: Machines, job: Workload, *, allow_both: bool, allow_idle: bool,
               cls: list[list[int]] | None = None, budget: int = 20000
               ) -> Iterator[tuple[float, tuple[int, ...], tuple[int, ...]]]:
    """Layouts (cost, d, m) where every machine of a class has the same role:
    worker, server, both (``allow_both``) or idle (``allow_idle``); each
    class's model blocks spread evenly over its servers, the model's split
    over the classes enumerated, the data placed at its best. Upper bounds
    for the MILP; skipped (nothing yielded) past ``budget`` model layouts."""
    cls = classes(machines) if cls is None else cls
    K, n, D, M = len(cls), len(machines), job.data_blocks, job.model_blocks
    kinds = "wsx"[: 3 if allow_both else 2] + ("i" if allow_idle else "")
    if len(kinds) ** K * math.comb(M + K - 1, K - 1) > budget:
        return
    cq = np.array(machines.wproc) * job.items_per_block
    for ty in itertools.product(kinds, repeat=K):
        roles = [""] * n
        for c, t in zip(cls, ty):
            for i in c:
                roles[i] = t
        W = sum(1 for r in roles if r in "wx")
        srv = [s for s, t in enumerate(ty) if t in "sx"]
        need = [len(cls[s]) for s in srv]
        if not 1 <= W <= D or not srv or sum(need) > M:
            continue
        rows = [tuple(x + k for x, k in zip(sp, need)) for sp in _splits(M - sum(need), len(srv))]
        m = np.zeros((len(rows), n))
        for r, tot in enumerate(rows):
            for s, t in zip(srv, tot):
                for j, v in zip(cls[s], spread(t, len(cls[s]))):
                    m[r, j] = v
        wk = np.array([1 if r in "wx" else 0 for r in roles])
        cost, P = _per_machine_cost(machines, job, wk, m)
        r = int(np.argmin(cost))
        yield _layout(machines, job, wk, m[r], float(cost[r]), P[r])


def improve(machines: Machines, job: Workload, d: Sequence[int], m: Sequence[int], *,
            allow_both: bool, allow_idle: bool, deadline: float | None = None,
            rounds: int = 500) -> tuple[float, tuple[int, ...], tuple[int, ...]]:
    """Steepest descent from the layout (d, m) over the roles and the model
    layout, the data always placed at its best: each round takes the best
    of moving one model block between two machines, adding a worker (a
    server's blocks going to the other servers when roles are disjoint) or
    removing one (it may take a model block), or a worker and a non-worker
    trading roles (and, with disjoint roles, model blocks). Ties in cost go
    to less communication (Σ P over the workers). Stops at a local optimum,
    after ``rounds`` rounds or at ``deadline`` (``time.perf_counter()``)."""
    n, D = len(machines), job.data_blocks
    wk = np.array([1 if v > 0 else 0 for v in d])
    cur = np.array(m, dtype=float)

    def key(w: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        cost, P = _per_machine_cost(machines, job, w, rows)
        return cost, (P * w[None, :]).sum(axis=1), P

    def move(rows: np.ndarray, i: int, j: int) -> np.ndarray:
        r = rows.copy()
        r[i] -= 1
        r[j] += 1
        return r

    def served(w: np.ndarray, rows: np.ndarray) -> bool:
        return bool(np.all((rows > 0) | (w > 0) | allow_idle))

    c0, s0, P0 = key(wk, cur[None, :])
    best = (float(c0[0]), float(s0[0]), wk, cur, P0[0])
    for _ in range(rounds):
        if deadline is not None and time.perf_counter() > deadline:
            break
        wk, cur = best[2], best[3]
        trials: list[tuple[np.ndarray, np.ndarray]] = []
        # one model block i -> j, same workers
        rows = [move(cur, i, j) for i in range(n) if cur[i] >= 1 for j in range(n)
                if j != i and (allow_both or not wk[j])]
        rows = [r for r in rows if served(wk, r)]
        if rows:
            trials.append((wk, np.array(rows)))
        W = int(wk.sum())
        for k in range(n):
            w2 = wk.copy()
            if wk[k] and W > 1:
                w2[k] = 0
                opts = [cur] if (cur[k] > 0 or allow_idle) else []
                opts += [move(cur, i, k) for i in range(n) if i != k and cur[i] >= 1]
                opts = [r for r in opts if served(w2, r)]
            elif not wk[k] and W < D:
                w2[k] = 1
                r = cur.copy()
                if not allow_both and r[k] > 0:
                    others = [j for j in range(n) if j != k and not wk[j]]
                    if not others:
                        continue
                    for _b in range(int(r[k])):
                        j = min(others, key=lambda j: (r[j] == 0, r[j]))
                        r[j] += 1
                    r[k] = 0
                opts = [r] if served(w2, r) and (r > 0).any() else []
            else:
                continue
            if opts:
                trials.append((w2, np.array(opts)))
        for k in range(n):                  # worker k and non-worker j trade roles
            for j in range(n):
                if wk[k] and not wk[j] and (cur[j] > 0 or allow_idle):
                    w2 = wk.copy()
                    w2[k], w2[j] = 0, 1
                    r = cur.copy()
                    if not allow_both:
                        r[k], r[j] = r[j], 0
                    if served(w2, r):
                        trials.append((w2, r[None, :]))
        improved = False
        for w2, rows_ in trials:
            cost, comm, P = key(w2, rows_)
            for r in range(len(rows_)):
                c, sc = float(cost[r]), float(comm[r])
                if c < best[0] * (1 - 1e-12) or (c <= best[0] * (1 + 1e-12)
                                                  and sc < best[1] * (1 - 1e-12)):
                    best = (c, sc, w2, rows_[r], P[r])
                    improved = True
        if not improved:
            break
    c, _, wk, cur, P = best
    return _layout(machines, job, wk, cur, c, P)


def starts(machines: Machines, job: Workload, *, allow_both: bool, allow_idle: bool,
           cls: list[list[int]] | None = None
           ) -> Iterator[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Simple layouts to start ``improve`` from: for every W, the W machines
    that compute fastest are the workers and the others servers (shares
    within one block); with ``allow_both``, also every machine both, and for
    every W and class a hub: one machine of the class holds the whole model
    (its own reads are free) and works with the W−1 fastest others."""
    n, D, M = len(machines), job.data_blocks, job.model_blocks
    order = sorted(range(n), key=lambda i: (machines.wproc[i], i))
    for W in range(1, min(n - 1, D) + 1):
        ws, ss = order[:W], order[W:]
        if not allow_idle and len(ss) > M:
            continue
        ss = ss[:M]
        d, m = [0] * n, [0] * n
        for i, v in zip(ws, spread(D, W)):
            d[i] = v
        for j, v in zip(ss, spread(M, len(ss))):
            m[j] = v
        yield tuple(d), tuple(m)
    if not allow_both:
        return
    if n <= min(D, M):
        yield tuple(spread(D, n)), tuple(spread(M, n))
    for c in classes(machines) if cls is None else cls:
        h = c[0]
        rest = [i for i in order if i != h]
        for W in range(1, min(n, D) + 1):
            if not allow_idle and W < n:
                continue
            d, m = [0] * n, [0] * n
            for i, v in zip([h] + rest[:W - 1], spread(D, W)):
                d[i] = v
            m[h] = M
            yield tuple(d), tuple(m)
