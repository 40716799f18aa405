"""Cruise's optimizer (§3.2.3): roles and partitions that minimize the epoch cost.

``homogeneous``: the closed form of Eq 3.5 for equal machines and links,

    w* = argmin_w (D/w)·T(w),  T(w) = Cwproc + (M/b)·max(1, w/(N−w))/B,

workers and servers disjoint, d_i = D/w*, m_j = M/(N−w*) (rounded to whole
blocks, shares differing by at most one block). O(N).

``heterogeneous``: a mixed-integer linear program solved by HiGHS
(``scipy.optimize.milp``). With q items per data block, σ model units per
model block, a_ij = σ / b_ij (0 for a free link), machines i, j ∈ 0..N−1:

    variables  x_i, y_i ∈ {0,1}            worker / server on machine i
               d_i, m_i ∈ Z                data / model blocks of machine i
               u_l ∈ {0,1}, l < L          W = Σ_i x_i = Σ_l 2^l u_l
               z_ik ∈ {0,1}, k < K         mini-batches n_i = Σ_k 2^k z_ik
               r_jl ≥ 0                    r_jl ≥ m_j·u_l   (so Σ_l 2^l r_jl ≥ m_j·W)
               P_i ∈ [0, U_i]              one mini-batch's communication of worker i
               g_ik ≥ 0                    g_ik ≥ P_i·z_ik  (so Σ_k 2^k g_ik ≥ n_i·P_i)
               C                           the epoch cost
    minimize   C
    subject to Σ_i d_i = D,  Σ_i m_i = M
               x_i ≤ d_i ≤ D·x_i,  y_i ≤ m_i ≤ M·y_i   (a role holds ≥ 1 block)
               B·n_i ≥ q·d_i                         (n_i = ⌈q·d_i / B⌉ at the optimum)
               r_jl ≥ m_j − M·(1 − u_l)
               P_i ≥ Σ_l 2^l·a_ij·r_jl       for all i, j    (server-bound: m_j·W/b_ij)
               P_i ≥ Σ_j a_ij·m_j            for all i       (worker-bound: Σ_j m_j/b_ij)
               g_ik ≥ P_i − U_i·(1 − z_ik)
               C ≥ Cwproc_i·q·d_i + Σ_k 2^k·g_ik   for all i  (C = max_i C_i)
               x_i + y_i ≤ 1                 unless ``allow_both``
               x_i + y_i ≥ 1                 unless ``allow_idle``
               (M+1)·d_i + m_i ≥ (M+1)·d_k + m_k   for interchangeable i < k

The max terms become epigraph constraints (C ≥ every C_i, P_i ≥ both
communication bounds); the products m_j·W and n_i·P_i become sums over the
binary digits of W and n_i (the binary encoding of §3.2.3), each digit times
a bounded variable linearized with a big-M (U_i = M·N·max_j a_ij, m ≤ M).
Every linearized variable is only bounded from below and has a positive
weight on the way to C, so at the optimum each equals its product and C
equals the cost model's ``block_cost`` of (d, m) (checked on every solve).
The last constraint breaks the symmetry of machines that are alike (same
Cwproc, same links): without it, HiGHS spends most of its time proving
permutations of one layout (8 machines of two kinds: 49 s -> 1.5 s).
``exhaustive`` enumerates every configuration: the reference for tests.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
import itertools
import math
import time

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_array

from harmony.cruise.costmodel import Machines, Workload, block_cost


@dataclass(frozen=True)
class Solution:
    """Blocks per machine (``d`` data, ``m`` model), the cost model's epoch
    time of that layout, how it was found and how long that took.
    ``status``: "optimal", "time_limit" (best found; ``gap`` is its relative
    distance to the solver's bound) or "closed_form"/"exhaustive"."""
    d: tuple[int, ...]
    m: tuple[int, ...]
    cost: float
    status: str
    seconds: float
    gap: float = 0.0
    predicted: float | None = None     # Eq 3.5's value, for the closed form

    @property
    def workers(self) -> int:
        return sum(1 for x in self.d if x > 0)

    @property
    def servers(self) -> int:
        return sum(1 for x in self.m if x > 0)


def spread(total: int, k: int) -> list[int]:
    """``total`` blocks over ``k`` owners, shares differing by at most one."""
    return [total // k + (1 if i < total % k else 0) for i in range(k)]


def eq35(n: int, w: int, wproc: float, bw: float, job: Workload) -> float:
    """(D/w)·T(w) of Eq 3.5 for ``w`` workers out of ``n`` (items, units)."""
    items, units = job.data_blocks * job.items_per_block, job.model_blocks * job.block_units
    t = wproc + (units / bw) * max(1.0, w / (n - w)) / job.batch
    return items / w * t


def homogeneous(machines: Machines | int, job: Workload, wproc: float | None = None,
                bw: float | None = None) -> Solution:
    """Eq 3.5 on ``n`` equal machines (a ``Machines`` whose off-diagonal
    links and compute times are equal, or ``n`` with ``wproc`` and ``bw``):
    the first ``w*`` machines are workers, the others servers."""
    t0 = time.perf_counter()
    if isinstance(machines, Machines):
        n = len(machines)
        wproc = machines.wproc[0] if wproc is None else wproc
        if bw is None:
            bw = min(machines.bw[i][j] for i in range(n) for j in range(n) if i != j)
    else:
        n = machines
        machines = Machines.homogeneous(n, wproc, bw)
    if n < 2:
        raise ValueError("Eq 3.5 needs two machines (disjoint workers and servers)")
    hi = min(n - 1, job.data_blocks)
    lo = max(1, n - job.model_blocks)
    if lo > hi:
        raise ValueError(f"no split of {n} machines fits {job.data_blocks} data and "
                         f"{job.model_blocks} model blocks")
    w = min(range(lo, hi + 1), key=lambda k: (eq35(n, k, wproc, bw, job), k))
    d = spread(job.data_blocks, w) + [0] * (n - w)
    m = [0] * w + spread(job.model_blocks, n - w)
    cost = block_cost(machines, job, d, m).cost
    return Solution(tuple(d), tuple(m), cost, "closed_form", time.perf_counter() - t0,
                    predicted=eq35(n, w, wproc, bw, job))


def _bits(n: int) -> int:
    return max(1, int(n).bit_length())


def _swappable(machines: Machines, i: int, k: int) -> bool:
    """Swapping machines i and k maps every cost term onto an equal one."""
    wp, bw = machines.wproc, machines.bw
    if wp[i] != wp[k] or bw[i][i] != bw[k][k] or bw[i][k] != bw[k][i]:
        return False
    return all(bw[i][o] == bw[k][o] and bw[o][i] == bw[o][k]
               for o in range(len(wp)) if o not in (i, k))


def _twins(machines: Machines) -> list[tuple[int, int]]:
    """Consecutive pairs within classes of interchangeable machines (every
    member swappable with the class's first, hence with each other)."""
    classes: list[list[int]] = []
    for i in range(len(machines)):
        for c in classes:
            if _swappable(machines, c[0], i):
                c.append(i)
                break
        else:
            classes.append([i])
    return [(c[t], c[t + 1]) for c in classes for t in range(len(c) - 1)]


class _Model:
    """The MILP's matrices (variables laid out in blocks: ``off``)."""

    def __init__(self, machines: Machines, job: Workload, allow_both: bool,
                 allow_idle: bool, symmetry: bool) -> None:
        n, D, M = len(machines), job.data_blocks, job.model_blocks
        q, B = job.items_per_block, job.batch
        a = job.block_units / np.asarray(machines.bw, dtype=float)     # inf -> 0
        K = _bits(math.ceil(D * q / B - 1e-9))
        L = _bits(n)
        U = [M * n * max(float(a[i].max()), 1e-300) for i in range(n)]
        self.n, self.nv, self.off = n, 0, {}
        for name, size in (("x", n), ("y", n), ("d", n), ("m", n), ("u", L),
                           ("z", n * K), ("r", n * L), ("P", n), ("g", n * K), ("C", 1)):
            self.off[name] = self.nv
            self.nv += size
        o = self.off
        lb, ub, integ = np.zeros(self.nv), np.full(self.nv, np.inf), np.zeros(self.nv)
        for name in ("x", "y", "u", "z"):
            ub[o[name]:o[name] + (L if name == "u" else n * K if name == "z" else n)] = 1
        ub[o["d"]:o["d"] + n], ub[o["m"]:o["m"] + n] = D, M
        integ[:o["r"]] = 1                                 # x, y, d, m, u, z
        ub[o["P"]:o["P"] + n] = U
        rows: list[int] = []
        cols: list[int] = []
        vals: list[float] = []
        lo: list[float] = []
        hi: list[float] = []
        inf = np.inf

        def con(terms: list[tuple[int, float]], low: float, high: float) -> None:
            for c, v in terms:
                rows.append(len(lo)); cols.append(c); vals.append(v)
            lo.append(low); hi.append(high)

        x = lambda i: o["x"] + i                           # noqa: E731
        y = lambda i: o["y"] + i                           # noqa: E731
        d = lambda i: o["d"] + i                           # noqa: E731
        m = lambda i: o["m"] + i                           # noqa: E731
        P = lambda i: o["P"] + i                           # noqa: E731
        C = o["C"]
        u = lambda l: o["u"] + l                           # noqa: E731
        z = lambda i, k: o["z"] + i * K + k                # noqa: E731
        r = lambda j, l: o["r"] + j * L + l                # noqa: E731
        g = lambda i, k: o["g"] + i * K + k                # noqa: E731
        con([(d(i), 1.0) for i in range(n)], D, D)
        con([(m(i), 1.0) for i in range(n)], M, M)
        con([(x(i), 1.0) for i in range(n)] + [(u(l), -2.0 ** l) for l in range(L)], 0, 0)
        for i in range(n):
            con([(d(i), 1.0), (x(i), -1.0)], 0, inf)
            con([(d(i), 1.0), (x(i), -float(D))], -inf, 0)
            con([(m(i), 1.0), (y(i), -1.0)], 0, inf)
            con([(m(i), 1.0), (y(i), -float(M))], -inf, 0)
            con([(z(i, k), B * 2.0 ** k) for k in range(K)] + [(d(i), -q)], 0, inf)
            if not allow_both:
                con([(x(i), 1.0), (y(i), 1.0)], -inf, 1)
            if not allow_idle:
                con([(x(i), 1.0), (y(i), 1.0)], 1, inf)
        for j in range(n):
            for l in range(L):                   # r_jl - m_j - M u_l >= -M
                con([(r(j, l), 1.0), (m(j), -1.0), (u(l), -float(M))], -M, inf)
        for i in range(n):
            for j in range(n):
                if a[i, j] > 0:                  # P_i >= a_ij m_j W
                    con([(P(i), 1.0)] + [(r(j, l), -(2.0 ** l) * a[i, j])
                                         for l in range(L)], 0, inf)
            con([(P(i), 1.0)] + [(m(j), -a[i, j]) for j in range(n) if a[i, j] > 0], 0, inf)
            for k in range(K):                   # g_ik - P_i - U_i z_ik >= -U_i
                con([(g(i, k), 1.0), (P(i), -1.0), (z(i, k), -U[i])], -U[i], inf)
            con([(C, 1.0), (d(i), -machines.wproc[i] * q)]
                + [(g(i, k), -(2.0 ** k)) for k in range(K)], 0, inf)
        if symmetry:
            for i, k in _twins(machines):        # interchangeable: sorted by (d, m)
                con([(d(i), M + 1.0), (m(i), 1.0), (d(k), -(M + 1.0)), (m(k), -1.0)], 0, inf)
        self.A = coo_array((vals, (rows, cols)), shape=(len(lo), self.nv)).tocsr()
        self.lo, self.hi = np.array(lo), np.array(hi)
        self.bounds, self.integ = Bounds(lb, ub), integ

    def solve(self, options: dict):
        c = np.zeros(self.nv)
        c[self.off["C"]] = 1.0
        res = milp(c, constraints=LinearConstraint(self.A, self.lo, self.hi),
                   integrality=self.integ, bounds=self.bounds, options=options)
        if res.x is None:
            return res, None, None
        n, o = self.n, self.off
        d = tuple(int(round(v)) for v in res.x[o["d"]:o["d"] + n])
        m = tuple(int(round(v)) for v in res.x[o["m"]:o["m"] + n])
        return res, d, m


def heterogeneous(machines: Machines, job: Workload, *, allow_both: bool = False,
                  allow_idle: bool = True, time_limit: float | None = None,
                  mip_gap: float = 1e-6, symmetry: bool = True) -> Solution:
    """The MILP of the module docstring, solved by HiGHS. ``allow_both``:
    a machine may be worker and server at once (Harmony's executors);
    ``allow_idle``: a machine may get no role (its executor is deleted);
    ``symmetry``: order interchangeable machines (``_twins``) by
    (d_i, m_i), which removes their permutations from the search and
    keeps the optimum (any solution sorts into one that satisfies it).
    ``time_limit`` (seconds): past it, the best layout found so far comes
    back with status "time_limit" and its relative ``gap``."""
    t0 = time.perf_counter()
    opts: dict = {"disp": False, "mip_rel_gap": mip_gap}
    if time_limit is not None:
        opts["time_limit"] = float(time_limit)
    res, d, m = _Model(machines, job, allow_both, allow_idle, symmetry).solve(opts)
    if d is None:
        raise RuntimeError(f"HiGHS found no configuration: {res.message}")
    cost = block_cost(machines, job, d, m).cost
    if res.status == 0 and not math.isclose(cost, res.fun, rel_tol=1e-5, abs_tol=1e-9):
        raise AssertionError(f"MILP objective {res.fun} != cost model {cost} for d={d}, m={m}")
    gap = float(getattr(res, "mip_gap", 0.0) or 0.0) if res.status != 0 else 0.0
    return Solution(d, m, cost, "optimal" if res.status == 0 else "time_limit",
                    time.perf_counter() - t0, gap=gap)


def _compositions(total: int, k: int) -> Iterator[tuple[int, ...]]:
    """Every way to write ``total`` as ``k`` positive parts."""
    for cuts in itertools.combinations(range(1, total), k - 1):
        edges = (0,) + cuts + (total,)
        yield tuple(edges[t + 1] - edges[t] for t in range(k))


def exhaustive(machines: Machines, job: Workload, *, allow_both: bool = False,
               allow_idle: bool = True) -> Solution:
    """The optimum by enumeration of every role assignment and every
    partition into whole blocks: small instances only (3-5 machines)."""
    t0 = time.perf_counter()
    n = len(machines)
    roles = [(1, 0), (0, 1)] + ([(1, 1)] if allow_both else []) + ([(0, 0)] if allow_idle else [])
    best: tuple[float, tuple[int, ...], tuple[int, ...]] | None = None
    for assign in itertools.product(roles, repeat=n):
        ws = [i for i in range(n) if assign[i][0]]
        ss = [i for i in range(n) if assign[i][1]]
        if not ws or not ss or len(ws) > job.data_blocks or len(ss) > job.model_blocks:
            continue
        for dp in _compositions(job.data_blocks, len(ws)):
            d = [0] * n
            for i, v in zip(ws, dp):
                d[i] = v
            for mp in _compositions(job.model_blocks, len(ss)):
                m = [0] * n
                for j, v in zip(ss, mp):
                    m[j] = v
                cost = block_cost(machines, job, d, m).cost
                if best is None or cost < best[0] - 1e-12:
                    best = (cost, tuple(d), tuple(m))
    if best is None:
        raise ValueError("no configuration fits")
    return Solution(best[1], best[2], best[0], "exhaustive", time.perf_counter() - t0)
