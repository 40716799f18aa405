"""Cruise's optimizer (§3.2.3): roles and partitions that minimize the epoch cost.

``homogeneous``: the closed form of Eq 3.5 for equal machines and links,

    w* = argmin_w (D/w)·T(w),  T(w) = Cwproc + (M/b)·max(1, w/(N−w))/B,

workers and servers disjoint, d_i = D/w*, m_j = M/(N−w*) (rounded to whole
blocks, shares differing by at most one block). O(N).

``heterogeneous``: the optimum of the cost model over roles and integer
partitions for any machines, by one of four methods (``method=``):

"classes" (default for disjoint roles): machines that are interchangeable
(same Cwproc and links) form a class, and with disjoint roles an optimum
spreads each class's data over its workers and its model over its servers
within one block; the problem then depends on the workers per class and the
model's split over the classes only, which ``layouts.disjoint`` enumerates
exactly (its size grows with the number of classes, not of machines). Not
exact when a machine may be both worker and server (``layouts``' docstring
has a counter-example), nor used when the classes are too many
(``CLASS_LIMIT``).

"by_w" (default otherwise), "milp": the MILP below, solved by HiGHS
(``scipy.optimize.milp``) under a cutoff: first ``_incumbent`` finds a good
layout without it (the closed form's layout, class-uniform layouts, the
class optimum for disjoint roles, and a local search, ``layouts.improve``),
then the MILP only looks for layouts cheaper than that by more than the
gap (C ≤ cutoff, and so d_i ≤ cutoff / (Cwproc_i·q)); "infeasible" proves
the incumbent optimal. "by_w" solves one MILP per number of workers W,
where m_j·W is linear, from the incumbent's W outwards, skipping the W whose
lower bound (``_bound``) is past the cutoff; "milp" solves one with W
encoded in binary. "plain": the MILP alone (the formulation before these).

With q items per data block, σ model units per model block, a_ij = σ / b_ij
(0 for a free link), machines i, j ∈ 0..N−1:

    variables  x_i, y_i ∈ {0,1}            worker / server on machine i
               d_i, m_i ∈ Z                data / model blocks of machine i
               u_l ∈ {0,1}, l < L          W = Σ_i x_i = Σ_l 2^l u_l  (W not fixed)
               z_ik ∈ {0,1}, k < K_i       mini-batches n_i = Σ_k 2^k z_ik
               r_jl ≥ 0                    r_jl ≥ m_j·u_l   (so Σ_l 2^l r_jl ≥ m_j·W)
               P_i ∈ [0, U_i]              one mini-batch's communication of worker i
               g_ik ≥ 0                    g_ik ≥ P_i·z_ik  (so Σ_k 2^k g_ik ≥ n_i·P_i)
               C ≤ cutoff                  the epoch cost
    minimize   C
    subject to Σ_i d_i = D,  Σ_i m_i = M
               x_i ≤ d_i ≤ dmax_i·x_i,  y_i ≤ m_i ≤ M·y_i   (a role holds ≥ 1 block)
               B·n_i ≥ q·d_i                         (n_i = ⌈q·d_i / B⌉ at the optimum)
               r_jl ≥ m_j − M·(1 − u_l)             (W fixed: no u, r; m_j·W is linear)
               P_i ≥ Σ_l 2^l·a_ij·r_jl       for all i, j    (server-bound: m_j·W/b_ij)
               P_i ≥ Σ_j a_ij·m_j            for all i       (worker-bound: Σ_j m_j/b_ij)
               g_ik ≥ P_i − U_i·(1 − z_ik)
               C ≥ Cwproc_i·q·d_i + Σ_k 2^k·g_ik   for all i  (C = max_i C_i)
               C ≥ Cwproc_i·q·d_i + p_i·n_i         disjoint roles (p_i: ``_comm_floor``)
               C ≥ Cwproc_i·q·d_i + amin_i·(M·n_i − nmax_i·m_i)   with ``allow_both``
               x_i + y_i ≤ 1                 unless ``allow_both``
               x_i + y_i ≥ 1                 unless ``allow_idle``
               (M+1)·d_i + m_i ≥ (M+1)·d_k + m_k   for interchangeable i < k

The max terms become epigraph constraints (C ≥ every C_i, P_i ≥ both
communication bounds); the products m_j·W and n_i·P_i become sums over the
binary digits of W and n_i (the binary encoding of §3.2.3), each digit times
a bounded variable linearized with a big-M (U_i = M·W·max_j a_ij, m ≤ M).
Every linearized variable is only bounded from below and has a positive
weight on the way to C, so at the optimum each equals its product and C
equals the cost model's ``block_cost`` of (d, m) (checked on every solve).
The big-M rows give the LP relaxation no communication at all; the two
floor rows give it some, and are valid for every layout under the cutoff:
a worker's P_i ≥ Σ_{j≠i} a_ij·m_j ≥ amin_i·(M − m_i) (amin_i = min_{j≠i}
a_ij; with disjoint roles m_i = 0 and the floor also has the server-bound
term), and n_i·(M − m_i) ≥ M·n_i − nmax_i·m_i as n_i ≤ nmax_i = ⌈q·dmax_i/B⌉.
(8 distinct machines, disjoint roles: 9-55 s -> 0.1-8 s.) The symmetry
constraint orders machines that are alike: without it, HiGHS spends most of
its time proving permutations of one layout (8 machines of two kinds: 49 s
-> 1.5 s). ``exhaustive`` enumerates every configuration: the reference for
tests.
"""
from __future__ import annotations

from collections.abc import Iterator
import contextlib
from dataclasses import dataclass
import itertools
import math
import time

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_array

from harmony.cruise.layouts import (candidates, classes, disjoint, improve, size, spread, starts,
                                    swappable)
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
    source: str = ""                   # what found the layout (``heterogeneous``)

    @property
    def workers(self) -> int:
        return sum(1 for x in self.d if x > 0)

    @property
    def servers(self) -> int:
        return sum(1 for x in self.m if x > 0)


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


_swappable = swappable


def _twins(machines: Machines) -> list[tuple[int, int]]:
    """Consecutive pairs within classes of interchangeable machines (every
    member swappable with the class's first, hence with each other)."""
    return [(c[t], c[t + 1]) for c in classes(machines) for t in range(len(c) - 1)]


class _Model:
    """The MILP's matrices (variables laid out in blocks: ``off``). ``W``:
    the number of workers, fixed (m_j·W is then linear: no u, r) or None;
    ``cutoff``: only layouts that cost at most this (C's upper bound, which
    also bounds every d_i by cutoff / (Cwproc_i·q) and so the digits of n_i);
    ``floors``: add the two communication floor rows (off: the formulation
    of "plain", as it was before them)."""

    def __init__(self, machines: Machines, job: Workload, allow_both: bool,
                 allow_idle: bool, symmetry: bool, W: int | None = None,
                 cutoff: float = math.inf, floors: bool = True) -> None:
        n, D, M = len(machines), job.data_blocks, job.model_blocks
        q, B = job.items_per_block, job.batch
        a = job.block_units / np.asarray(machines.bw, dtype=float)     # inf -> 0
        cq = [machines.wproc[i] * q for i in range(n)]
        dmax = [min(D, int(math.floor(cutoff / cq[i] * (1 + 1e-9))))
                if math.isfinite(cutoff) and cq[i] > 0 else D for i in range(n)]
        K = [_bits(math.ceil(dmax[i] * q / B - 1e-9)) for i in range(n)]
        Wmax = (min(n, D) if floors else n) if W is None else W
        L = _bits(n) if W is None else 0
        U = [M * max(Wmax, 1) * max(float(a[i].max()), 1e-300) for i in range(n)]
        plb = _comm_floor(a, M, W) if not allow_both else [0.0] * n
        amin = [min((float(a[i, j]) for j in range(n) if j != i), default=0.0) for i in range(n)]
        nmax = [math.ceil(dmax[i] * q / B - 1e-9) for i in range(n)]
        self.n, self.nv, self.off = n, 0, {}
        for name, size_ in (("x", n), ("y", n), ("d", n), ("m", n), ("u", L), ("z", sum(K)),
                            ("r", n * L), ("P", n), ("g", sum(K)), ("C", 1)):
            self.off[name] = self.nv
            self.nv += size_
        o = self.off
        zo = [o["z"] + sum(K[:i]) for i in range(n)]
        go = [o["g"] + sum(K[:i]) for i in range(n)]
        lb, ub, integ = np.zeros(self.nv), np.full(self.nv, np.inf), np.zeros(self.nv)
        ub[o["x"]:o["x"] + n] = [1 if dm > 0 else 0 for dm in dmax]
        ub[o["y"]:o["y"] + n] = 1
        ub[o["u"]:o["u"] + L] = 1
        ub[o["z"]:o["z"] + sum(K)] = 1
        ub[o["d"]:o["d"] + n], ub[o["m"]:o["m"] + n] = dmax, M
        integ[:o["r"]] = 1                                 # x, y, d, m, u, z
        ub[o["P"]:o["P"] + n] = U
        ub[o["C"]] = cutoff
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
        z = lambda i, k: zo[i] + k                         # noqa: E731
        r = lambda j, l: o["r"] + j * L + l                # noqa: E731
        g = lambda i, k: go[i] + k                         # noqa: E731
        con([(d(i), 1.0) for i in range(n)], D, D)
        con([(m(i), 1.0) for i in range(n)], M, M)
        if W is None:
            con([(x(i), 1.0) for i in range(n)] + [(u(l), -2.0 ** l) for l in range(L)], 0, 0)
        else:
            con([(x(i), 1.0) for i in range(n)], W, W)
        for i in range(n):
            con([(d(i), 1.0), (x(i), -1.0)], 0, inf)
            con([(d(i), 1.0), (x(i), -float(dmax[i]))], -inf, 0)
            con([(m(i), 1.0), (y(i), -1.0)], 0, inf)
            con([(m(i), 1.0), (y(i), -float(M))], -inf, 0)
            con([(z(i, k), B * 2.0 ** k) for k in range(K[i])] + [(d(i), -q)], 0, inf)
            if not allow_both:
                con([(x(i), 1.0), (y(i), 1.0)], -inf, 1)
            if not allow_idle:
                con([(x(i), 1.0), (y(i), 1.0)], 1, inf)
        for j in range(n):
            for l in range(L):                   # r_jl - m_j - M u_l >= -M
                con([(r(j, l), 1.0), (m(j), -1.0), (u(l), -float(M))], -M, inf)
        for i in range(n):
            for j in range(n):
                if a[i, j] > 0 and W is None:    # P_i >= a_ij m_j W
                    con([(P(i), 1.0)] + [(r(j, l), -(2.0 ** l) * a[i, j])
                                         for l in range(L)], 0, inf)
                elif a[i, j] > 0:
                    con([(P(i), 1.0), (m(j), -W * a[i, j])], 0, inf)
            con([(P(i), 1.0)] + [(m(j), -a[i, j]) for j in range(n) if a[i, j] > 0], 0, inf)
            for k in range(K[i]):                # g_ik - P_i - U_i z_ik >= -U_i
                con([(g(i, k), 1.0), (P(i), -1.0), (z(i, k), -U[i])], -U[i], inf)
            con([(C, 1.0), (d(i), -cq[i])]
                + [(g(i, k), -(2.0 ** k)) for k in range(K[i])], 0, inf)
            if floors and not allow_both and plb[i] > 0:   # C >= Cwproc_i q d_i + n_i p_i
                con([(C, 1.0), (d(i), -cq[i])]
                    + [(z(i, k), -(2.0 ** k) * plb[i]) for k in range(K[i])], 0, inf)
            elif floors and allow_both and amin[i] > 0:    # n_i P_i >= amin_i (M n_i - nmax_i m_i)
                con([(C, 1.0), (d(i), -cq[i]), (m(i), amin[i] * nmax[i])]
                    + [(z(i, k), -(2.0 ** k) * amin[i] * M) for k in range(K[i])], 0, inf)
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


METHODS = ("auto", "classes", "milp", "by_w", "plain")
CLASS_LIMIT = 1_000_000        # worker layouts × model splits for "auto" to pick "classes"
SEARCH_SECONDS = 0.5           # at most this long in the local search before the MILP,
SEARCH_SHARE = 0.1             # and at most this share of the time limit


def _options(mip_gap: float, left: float | None) -> dict:
    opts: dict = {"disp": False, "mip_rel_gap": mip_gap}
    if left is not None:
        opts["time_limit"] = max(float(left), 1e-3)
    return opts


def _incumbent(machines: Machines, job: Workload, allow_both: bool, allow_idle: bool,
               cls: list[list[int]], deadline: float
               ) -> tuple[float, tuple[int, ...], tuple[int, ...], str] | None:
    """The cheapest layout known without the MILP: (cost, d, m, source).
    Candidates: the closed form's layout (when it fits), the class-uniform
    layouts of ``layouts.candidates``, the exact disjoint optimum when
    that is cheap, and ``layouts.improve`` run from the best of these and
    from ``layouts.starts`` until ``deadline``."""
    found: list[tuple[float, tuple[int, ...], tuple[int, ...], str]] = []
    if len(machines) >= 2:
        try:
            cf = homogeneous(machines, job)
            found.append((cf.cost, cf.d, cf.m, "closed_form"))
        except ValueError:
            pass
    found += [(c, d, m, "classes") for c, d, m in
              candidates(machines, job, allow_both=allow_both, allow_idle=allow_idle, cls=cls)]
    if size(machines, job, cls) <= CLASS_LIMIT // 10:
        r = disjoint(machines, job, allow_idle=allow_idle, cls=cls)
        if r is not None:
            found.append((*r, "classes"))
    seeds = sorted(found, key=lambda f: f[0])[:2]
    seeds += sorted(((block_cost(machines, job, d, m).cost, d, m, "search") for d, m in
                     starts(machines, job, allow_both=allow_both, allow_idle=allow_idle,
                            cls=cls)),
                    key=lambda f: f[0])
    for c0, d, m, src in seeds:
        if time.perf_counter() > deadline:
            break
        c, d2, m2 = improve(machines, job, d, m, allow_both=allow_both,
                            allow_idle=allow_idle, deadline=deadline)
        found.append((c, d2, m2, src if c >= c0 else "search"))
    return min(found, key=lambda f: f[0]) if found else None


def _comm_floor(a: np.ndarray, M: int, W: int | None) -> list[float]:
    """A worker's least communication per mini-batch with disjoint roles
    (every server another machine): Σ_j a_ij·m_j ≥ M·min_j a_ij and, with W
    workers and so at most N−W servers, W·max_j a_ij·m_j ≥ W·min_j a_ij·⌈M/S⌉."""
    n = len(a)
    amin = [min((float(a[i, j]) for j in range(n) if j != i), default=0.0) for i in range(n)]
    if W is None or n - W < 1:
        return [M * v for v in amin]
    S = min(n - W, M)
    return [max(M * v, W * v * math.ceil(M / S)) for v in amin]


def _bound(machines: Machines, job: Workload, W: int, allow_both: bool) -> float:
    """A lower bound on the cost of any layout with ``W`` workers. With
    n_i ≥ q·d_i/B and n_i ≥ 1, a worker with per-batch communication at
    least p_i costs at least d_i·(Cwproc_i·q + q·p_i/B) and Cwproc_i·q + p_i:
    the D blocks need Σ 1/(Cwproc_i·q + q·p_i/B) ≥ D/C over the W best
    machines, and the W-th cheapest first block is paid. p_i: with disjoint
    roles, ``_comm_floor``. With a machine both worker and server, let μ
    be the largest model share (μ ≥ ⌈M/min(N, M)⌉) and h a machine holding
    it: every other worker sees μ on another machine and holds at most μ
    itself, p_i ≥ amin_i·max(W·μ, M − μ), and h pays p_h ≥ amin_h·(M − μ)
    (amin_i = min_{j≠i} a_ij); the bound is the least over h and μ."""
    n, D, M = len(machines), job.data_blocks, job.model_blocks
    q, B = job.items_per_block, job.batch
    cq = np.array(machines.wproc) * q
    a = job.block_units / np.asarray(machines.bw, dtype=float)
    if not allow_both:
        if n - W < 1:
            return math.inf
        p = np.array(_comm_floor(a, M, W))[None, :]
    else:
        amin = np.array([min((float(a[i, j]) for j in range(n) if j != i), default=0.0)
                         for i in range(n)])
        mu = np.arange(math.ceil(M / min(n, M)), M + 1, dtype=float)[:, None]
        other = amin[None, :] * np.maximum(W * mu, M - mu)                 # (μ, i)
        p = np.repeat(other[None, :, :], n, axis=0)                        # (h, μ, i)
        idx = np.arange(n)
        p[idx, :, idx] = amin[:, None] * (M - mu[:, 0])[None, :]
        p = p.reshape(-1, n)
    per_block = np.sort(cq[None, :] + q * p / B, axis=1)[:, :W]
    first = np.sort(cq[None, :] + p, axis=1)[:, W - 1]
    fluid = D / np.sum(1.0 / np.maximum(per_block, 1e-300), axis=1)
    return float(np.min(np.maximum(fluid, first)))


def heterogeneous(machines: Machines, job: Workload, *, allow_both: bool = False,
                  allow_idle: bool = True, time_limit: float | None = None,
                  mip_gap: float = 1e-6, symmetry: bool = True,
                  method: str = "auto") -> Solution:
    """The optimum of the cost model over roles and partitions. ``allow_both``:
    a machine may be worker and server at once (Harmony's executors);
    ``allow_idle``: a machine may get no role (its executor is deleted);
    ``symmetry``: order interchangeable machines (``_twins``) by
    (d_i, m_i) in the MILP, which removes their permutations from the
    search and keeps the optimum (any solution sorts into one that
    satisfies it). ``time_limit`` (seconds): past it, the best layout found
    so far comes back with status "time_limit" and its relative ``gap``.

    ``method`` (module docstring): "classes" (exact, disjoint roles only),
    "by_w" (one MILP per number of workers, each below the best layout
    known), "milp" (one MILP below the best layout known), "plain" (the
    MILP alone); "auto": "classes" when roles are disjoint and the classes
    are few enough (``CLASS_LIMIT``), "by_w" otherwise. ``Solution.source``
    says where the returned layout comes from: "classes", "closed_form",
    "search" (the local search) or "milp"; past the time limit it is the
    best of these (every method but "classes" tries the closed form's
    layout when there are two machines or more)."""
    if method not in METHODS:
        raise ValueError(f"method {method!r}: one of {METHODS}")
    t0 = time.perf_counter()
    cls = classes(machines)
    if method == "auto":
        method = "classes" if not allow_both and size(machines, job, cls) <= CLASS_LIMIT \
            else "by_w"
    if method == "classes":
        if allow_both:
            raise ValueError("the class formulation is exact for disjoint roles only")
        r = disjoint(machines, job, allow_idle=allow_idle, cls=cls)
        if r is None:
            raise RuntimeError("no configuration fits")
        return Solution(r[1], r[2], r[0], "optimal", time.perf_counter() - t0,
                        source="classes")
    if method == "plain":
        res, d, m = _Model(machines, job, allow_both, allow_idle, symmetry,
                           floors=False).solve(_options(mip_gap, time_limit))
        if res.status == 0:
            cost = block_cost(machines, job, d, m).cost
            if not math.isclose(cost, res.fun, rel_tol=1e-5, abs_tol=1e-9):
                raise AssertionError(f"MILP objective {res.fun} != cost model {cost} "
                                     f"for d={d}, m={m}")
            return Solution(d, m, cost, "optimal", time.perf_counter() - t0, source="milp")
        # stopped early: the better of HiGHS's best and the closed form's layout
        found = [] if d is None else [(block_cost(machines, job, d, m).cost, d, m, "milp")]
        with contextlib.suppress(ValueError):
            cf = homogeneous(machines, job)
            found.append((cf.cost, cf.d, cf.m, "closed_form"))
        if not found:
            raise RuntimeError(f"HiGHS found no configuration: {res.message}")
        cost, d, m, source = min(found, key=lambda f: f[0])
        db = getattr(res, "mip_dual_bound", None)
        gap = max(0.0, (cost - db) / cost) if db is not None and math.isfinite(db) \
            and cost > 0 else 1.0
        return Solution(d, m, cost, "time_limit", time.perf_counter() - t0, gap=gap,
                        source=source)
    budget = SEARCH_SHARE * time_limit if time_limit is not None else SEARCH_SECONDS
    inc = _incumbent(machines, job, allow_both, allow_idle, cls,
                     time.perf_counter() + min(budget, SEARCH_SECONDS))
    best = inc
    bound = math.inf                    # the least cost no layout can beat
    n = len(machines)
    if method == "milp":
        Ws: list[int | None] = [None]
    else:
        hi = min(n, job.data_blocks) if allow_both else min(n - 1, job.data_blocks)
        w0 = sum(1 for v in best[1] if v) if best else 1
        Ws = sorted(range(1, hi + 1), key=lambda w: (abs(w - w0), w))
    done = True
    for t, W in enumerate(Ws):
        left = None if time_limit is None else time_limit - (time.perf_counter() - t0)
        # only layouts better than the best so far by more than the gap
        cutoff = best[0] * (1 - mip_gap) if best else math.inf
        lb = _bound(machines, job, W, allow_both) if W is not None else 0.0
        if lb >= cutoff:                # no layout with W workers beats the best
            bound = min(bound, lb)
            continue
        if left is not None and left <= 0:
            done = False
            bound = min([bound] + [_bound(machines, job, w, allow_both) if w is not None
                                   else 0.0 for w in Ws[t:]])
            break
        res, d, m = _Model(machines, job, allow_both, allow_idle, symmetry, W=W,
                           cutoff=cutoff).solve(_options(mip_gap, left))
        if res.status == 4 and best is not None:
            # HiGHS's solve error: it found a layout at the cutoff within its
            # tolerances; again with the best so far feasible
            cutoff = best[0] * (1 + 1e-7)
            left = None if time_limit is None else time_limit - (time.perf_counter() - t0)
            res, d, m = _Model(machines, job, allow_both, allow_idle, symmetry, W=W,
                               cutoff=cutoff).solve(_options(mip_gap, left))
        if d is not None:
            cost = block_cost(machines, job, d, m).cost
            if res.status == 0 and not math.isclose(cost, res.fun, rel_tol=1e-5,
                                                    abs_tol=1e-9):
                raise AssertionError(f"MILP objective {res.fun} != cost model {cost} "
                                     f"for d={d}, m={m}")
            if best is None or cost < best[0]:
                best = (cost, d, m, "milp")
        if res.status == 0:             # optimal for this W (or overall)
            bound = min(bound, res.fun if d is not None else cutoff)
        elif res.status == 2:           # nothing below the cutoff
            bound = min(bound, cutoff)
        else:                           # time limit: HiGHS's bound
            done = False
            db = getattr(res, "mip_dual_bound", None)
            bound = min(bound, max(lb, float(db)) if db is not None and math.isfinite(db)
                        else lb)
    if best is None:
        raise RuntimeError("no configuration fits")
    cost, d, m, source = best
    gap = 0.0 if done else max(0.0, (cost - bound) / cost) if cost > 0 else 0.0
    return Solution(d, m, cost, "optimal" if done else "time_limit",
                    time.perf_counter() - t0, gap=gap, source=source)


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
