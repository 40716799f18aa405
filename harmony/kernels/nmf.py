"""NMF kernels (``apps/nmf.py``): ALS row solves and normal equations, the
mini-batch AdaGrad SGD sweep and the squared error, compiled by numba.

Non-negative row solves are exact: the unconstrained Cholesky solution where
it is already >= 0, else the active-set NNLS of Lawson and Hanson in its
normal-equation form (Bro and de Jong's "fast NNLS"), which works on the Gram
matrix ``M`` and ``v`` directly: ``argmin_{x >= 0} x'Mx - 2v'x``. ``M`` is
positive definite (the apps add a ridge), so the optimum is unique and this
is the same solution as ``scipy.optimize.nnls`` on the least-squares form.
"""
from __future__ import annotations

import math

import numpy as np

from harmony.kernels import njit

#: outer iterations of the active-set NNLS per unknown before it gives up and
#: keeps the clipped solution (never reached in the tests: it converges in at
#: most one pass per unknown in practice)
NNLS_ITERS_PER_UNKNOWN = 3


@njit
def _chol_solve_sub(M, idx, n, v, C, y, out):
    """Solve ``M[idx, idx] out[idx] = v[idx]`` (first ``n`` of ``idx``) by
    Cholesky; ``C``, ``y`` are work arrays. False when not positive definite."""
    for a in range(n):
        ia = idx[a]
        for b in range(a + 1):
            s = M[ia, idx[b]]
            for p in range(b):
                s -= C[a, p] * C[b, p]
            if a == b:
                if s <= 0.0:
                    return False
                C[a, a] = math.sqrt(s)
            else:
                C[a, b] = s / C[b, b]
    for a in range(n):
        s = v[idx[a]]
        for p in range(a):
            s -= C[a, p] * y[p]
        y[a] = s / C[a, a]
    for a in range(n - 1, -1, -1):
        s = y[a]
        for p in range(a + 1, n):
            s -= C[p, a] * y[p]
        y[a] = s / C[a, a]
    for a in range(n):
        out[idx[a]] = y[a]
    return True


@njit
def _passive_solve(M, passive, idx, v, C, y, s):
    """``s`` = the solve on the passive unknowns (0 elsewhere), their
    indices in ``idx``; False when none is passive or it is not positive
    definite."""
    n = 0
    for a in range(len(passive)):
        s[a] = 0.0
        if passive[a]:
            idx[n] = a
            n += 1
    return n > 0 and _chol_solve_sub(M, idx, n, v, C, y, s)


@njit
def nn_solve_one(M: np.ndarray, v: np.ndarray, x: np.ndarray, C: np.ndarray, y: np.ndarray,
                 s: np.ndarray, w: np.ndarray, idx: np.ndarray,
                 passive: np.ndarray) -> None:
    """``x = argmin_{x >= 0} x'Mx - 2v'x`` for one ``k x k`` positive definite
    ``M`` (float64); the other arguments are work arrays of size ``k`` (``C``:
    ``k x k``). The unconstrained solution where it is >= 0, else Lawson-Hanson
    on the normal equations."""
    k = v.shape[0]
    for a in range(k):
        idx[a] = a
    if _chol_solve_sub(M, idx, k, v, C, y, x):
        ok = True
        for a in range(k):
            if x[a] < 0.0:
                ok = False
                break
        if ok:
            return
    scale = 0.0
    for a in range(k):
        scale = max(scale, abs(v[a]))
        passive[a] = x[a] > 0.0
    # start on the face of the unconstrained solution's positive part: drop
    # the unknowns that go <= 0 on it until none does (x = 0 if none is left);
    # Lawson-Hanson below goes on from there to the optimum, as from x = 0
    for a in range(k):
        x[a] = 0.0
    for _drop in range(k):
        if not _passive_solve(M, passive, idx, v, C, y, s):
            for a in range(k):
                passive[a] = False
            break
        done = True
        for a in range(k):
            if passive[a] and s[a] <= 0.0:
                passive[a] = False
                done = False
        if done:
            for a in range(k):
                x[a] = s[a]
            break
    for a in range(k):
        t = v[a]
        for b in range(k):
            t -= M[a, b] * x[b]
        w[a] = t
    tol = 1e-12 * (1.0 + scale)
    for _outer in range(NNLS_ITERS_PER_UNKNOWN * k):
        j, best = -1, tol
        for a in range(k):
            if not passive[a] and w[a] > best:
                j, best = a, w[a]
        if j < 0:
            break
        passive[j] = True
        for _inner in range(NNLS_ITERS_PER_UNKNOWN * k):
            if not _passive_solve(M, passive, idx, v, C, y, s):
                break
            alpha = 2.0
            for a in range(k):
                if passive[a] and s[a] <= 0.0:
                    t = x[a] / (x[a] - s[a])
                    if t < alpha:
                        alpha = t
            if alpha > 1.0:          # every passive unknown > 0: accept s
                break
            for a in range(k):
                x[a] += alpha * (s[a] - x[a])
                if passive[a] and x[a] <= 1e-15 * (1.0 + scale):
                    passive[a] = False
                    x[a] = 0.0
        for a in range(k):
            x[a] = s[a] if passive[a] else 0.0
        for a in range(k):
            t = v[a]
            for b in range(k):
                t -= M[a, b] * x[b]
            w[a] = t
    for a in range(k):
        if x[a] < 0.0:
            x[a] = 0.0


@njit
def nn_solve_many(M: np.ndarray, v: np.ndarray, x: np.ndarray) -> None:
    """:func:`nn_solve_one` for every row: ``M`` (n, k, k), ``v``, ``x`` (n, k)."""
    k = v.shape[1]
    C = np.empty((k, k))
    y, s, w = np.empty(k), np.empty(k), np.empty(k)
    idx = np.empty(k, np.int64)
    passive = np.empty(k, np.bool_)
    for j in range(M.shape[0]):
        nn_solve_one(M[j], v[j], x[j], C, y, s, w, idx, passive)


@njit
def group_by(a: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Counting sort of ``a`` (values in ``0..n-1``): ``(start, order)`` with
    ``order[start[j]:start[j + 1]]`` the positions of value ``j``, ascending."""
    start = np.zeros(n + 1, np.int64)
    for t in range(a.shape[0]):
        start[a[t] + 1] += 1
    for j in range(n):
        start[j + 1] += start[j]
    fill = start[:-1].copy()
    order = np.empty(a.shape[0], np.int64)
    for t in range(a.shape[0]):
        order[fill[a[t]]] = t
        fill[a[t]] += 1
    return start, order


@njit
def _gram(order, lo, hi, b_idx, r, F, M, v):
    """``M = sum F_b F_b'`` (full square), ``v = sum r F_b`` over the
    ratings ``order[lo:hi]`` (rows ``b_idx`` of ``F``), in float64."""
    k = F.shape[1]
    for a in range(k):
        v[a] = 0.0
        for q in range(k):
            M[a, q] = 0.0
    for p in range(lo, hi):
        t = order[p]
        j = b_idx[t]
        rt = np.float64(r[t])
        for a in range(k):
            fa = np.float64(F[j, a])
            v[a] += rt * fa
            for q in range(k):
                M[a, q] += fa * F[j, q]


@njit
def als_users(u: np.ndarray, ii: np.ndarray, r: np.ndarray, R: np.ndarray, lam: float,
              L: np.ndarray) -> None:
    """Solve every user with ratings: ``L[u] = argmin_{x >= 0} sum_t (x . R[ii_t]
    - r_t)^2 + lam n_u |x|^2`` over the user's ratings ``t``. ``u`` indexes
    the rows of ``L`` (float32, written in place), ``ii`` those of ``R``
    (float64). Ratings are grouped by user with a counting sort."""
    n_users, k = L.shape
    start, order = group_by(u, n_users)
    M = np.empty((k, k))
    v, x = np.empty(k), np.empty(k)
    C = np.empty((k, k))
    y, s, w = np.empty(k), np.empty(k), np.empty(k)
    idx = np.empty(k, np.int64)
    passive = np.empty(k, np.bool_)
    for j in range(n_users):
        lo, hi = start[j], start[j + 1]
        if lo == hi:
            continue
        _gram(order, lo, hi, ii, r, R, M, v)
        ridge = lam * (hi - lo)
        for a in range(k):
            M[a, a] += ridge
        nn_solve_one(M, v, x, C, y, s, w, idx, passive)
        for a in range(k):
            L[j, a] = x[a]


@njit
def als_item_sums(ii: np.ndarray, u: np.ndarray, r: np.ndarray, L: np.ndarray, A: np.ndarray,
                  b: np.ndarray, c: np.ndarray) -> None:
    """Add each item's normal equations over the given ratings: ``A[i] +=``
    the packed upper triangle of ``sum L_u L_u'`` (row-major, as
    ``np.triu_indices``), ``b[i] += sum r L_u``, ``c[i] +=`` the count."""
    n_items = A.shape[0]
    k = L.shape[1]
    start, order = group_by(ii, n_items)
    M = np.empty((k, k))
    v = np.empty(k)
    for i in range(n_items):
        lo, hi = start[i], start[i + 1]
        if lo == hi:
            continue
        _gram(order, lo, hi, u, r, L, M, v)
        p = 0
        for a in range(k):
            b[i, a] += v[a]
            for q in range(a, k):
                A[i, p] += M[a, q]
                p += 1
        c[i] += hi - lo


@njit
def solve_packed(rows: np.ndarray, has: np.ndarray, k: int, lam: float, R: np.ndarray) -> None:
    """Item factors from server rows ``[R0, S (packed upper), s, q]``: for each
    row index in ``has``, ``R[h] = argmin_{x >= 0} x'(S + lam q I)x - 2 s'x``."""
    P = k * (k + 1) // 2
    M = np.empty((k, k))
    v = np.empty(k)
    C = np.empty((k, k))
    y, s, w = np.empty(k), np.empty(k), np.empty(k)
    idx = np.empty(k, np.int64)
    passive = np.empty(k, np.bool_)
    for h in has:
        row = rows[h]
        p = k
        for a in range(k):
            for b in range(a, k):
                M[a, b] = row[p]
                M[b, a] = row[p]
                p += 1
        ridge = lam * np.float64(row[k + P + k])
        for a in range(k):
            M[a, a] += ridge
            v[a] = row[k + P + a]
        nn_solve_one(M, v, R[h], C, y, s, w, idx, passive)


@njit
def sgd_sweep(u_all: np.ndarray, i_all: np.ndarray, r_all: np.ndarray, L: np.ndarray,
              GL: np.ndarray, R: np.ndarray, GR: np.ndarray,
              bs: int, lr: np.float32, lam: np.float32, eps: np.float32,
              inv_k: np.float32, scale_r: np.float32, m: np.float32) -> None:
    """Mini-batch SGD with per-row AdaGrad steps over ratings in the given
    order, ``bs`` at a time, all float32. Within a batch every gradient is
    taken at the batch's starting point (a Jacobi step, as the vectorized
    form: gather, then scatter-add), the AdaGrad sums first take the whole
    batch's squared gradients, then every rating steps its user and item
    row, then the touched rows are clipped at 0."""
    k = L.shape[1]
    n = u_all.shape[0]
    gL = np.empty((bs, k), np.float32)
    gR = np.empty((bs, k), np.float32)
    zero = np.float32(0.0)
    for s0 in range(0, n, bs):
        e = min(n, s0 + bs)
        for t in range(s0, e):
            u, i, j = u_all[t], i_all[t], t - s0
            err = zero
            for a in range(k):
                err += L[u, a] * R[i, a]
            err -= r_all[t]
            sl = zero
            sr = zero
            for a in range(k):
                la, ra = L[u, a], R[i, a]
                x = err * ra + lam * la
                y = err * la + lam * ra
                gL[j, a] = x
                gR[j, a] = y
                sl += x * x
                sr += y * y
            GL[u] += sl * inv_k
            GR[i] += sr * scale_r
        for t in range(s0, e):
            u, i, j = u_all[t], i_all[t], t - s0
            stl = lr / np.sqrt(GL[u] + eps)
            str_ = m * lr / np.sqrt(GR[i] + eps)
            for a in range(k):
                L[u, a] -= gL[j, a] * stl
                R[i, a] -= gR[j, a] * str_
        for t in range(s0, e):
            u, i = u_all[t], i_all[t]
            for a in range(k):
                if L[u, a] < zero:
                    L[u, a] = zero
                if R[i, a] < zero:
                    R[i, a] = zero


@njit
def squared_error(L: np.ndarray, R: np.ndarray, u: np.ndarray, ii: np.ndarray,
                  r: np.ndarray) -> float:
    """``sum_t (L[u_t] . R[ii_t] - r_t)^2``: predictions in float32 (the
    factors' type), the sum in float64."""
    k = L.shape[1]
    total = 0.0
    for t in range(u.shape[0]):
        p = np.float32(0.0)
        for a in range(k):
            p += L[u[t], a] * R[ii[t], a]
        d = np.float64(p - r[t])
        total += d * d
    return total
