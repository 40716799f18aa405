"""Lasso kernels (``apps/lasso.py``'s working-set solver), compiled by numba.

The working set ``W`` is an ordered list of features (and the intercept
column, when fitted) with positions ``0, 1, ...`` handed out in order. Its
Gram matrix ``A_W^T A_W`` (``A = [X 1]`` with an intercept) is kept packed:
the lower triangle row by row, entry ``(a, b)``, ``b <= a``, at
``a (a + 1) / 2 + b``, so the rows of the positions added in one epoch are
one contiguous range.

* :func:`xt_r`: ``X^T r`` and ``sum r``, one pass over the rows, and in the
  same read, when ``W`` changed, the block's entries in ``W``'s columns row
  by row (a compact CSR of ``A_W``: a few entries per row);
* :func:`gram_rows`: the Gram rows of newly added positions, from those;
* :func:`resid_update`: the residual after ``w`` changed on ``W`` only;
* :func:`cd_gram`: cyclic coordinate descent for the Lasso restricted to
  ``W``, on its Gram matrix (no data pass): the block minimization.
"""
from __future__ import annotations

import numpy as np

from harmony.kernels import njit


def tri(a: int) -> int:
    """Packed offset of the Gram row of working-set position ``a``."""
    return a * (a + 1) // 2


@njit
def gram_rows(ptr: np.ndarray, pos: np.ndarray, val: np.ndarray, new_lo: int,
              out: np.ndarray) -> None:
    """Adds the packed Gram entries ``(a, b)``, ``b <= a``, of every
    position ``a >= new_lo`` into ``out`` (``out[0]`` is entry
    ``(new_lo, 0)``)."""
    off = new_lo * (new_lo + 1) // 2
    for i in range(len(ptr) - 1):
        s, e = ptr[i], ptr[i + 1]
        for u in range(s, e):
            pa = pos[u]
            if pa >= new_lo:
                base = pa * (pa + 1) // 2 - off
                va = val[u]
                for v in range(s, e):
                    pb = pos[v]
                    if pb <= pa:
                        out[base + pb] += va * val[v]


@njit
def resid_update(ptr: np.ndarray, pos: np.ndarray, val: np.ndarray, dw: np.ndarray,
                 r: np.ndarray) -> None:
    """``r += A_W dw`` (``dw`` by working-set position), in place."""
    for i in range(len(ptr) - 1):
        acc = 0.0
        for u in range(ptr[i], ptr[i + 1]):
            acc += val[u] * dw[pos[u]]
        r[i] += acc


@njit
def _grow(pos: np.ndarray, val: np.ndarray, m: int) -> tuple:
    pos2 = np.empty(2 * len(pos), np.int64)
    val2 = np.empty(2 * len(pos), np.float64)
    pos2[:m] = pos[:m]
    val2[:m] = val[:m]
    return pos2, val2


@njit
def xt_r(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, r: np.ndarray,
         grad: np.ndarray, colpos: np.ndarray, icpt_pos: int, collect: bool) -> tuple:
    """Adds ``X^T r`` into ``grad[:F]`` and ``sum r`` into ``grad[F]``
    (``F = len(grad) - 1``). Returns ``(r . r, ptr, pos, val)``: with
    ``collect``, the rows' entries in working-set columns (CSR:
    position, value; the intercept's 1 last when ``icpt_pos >= 0``), else empty arrays."""
    n = len(indptr) - 1
    f = len(grad) - 1
    sse = 0.0
    rs = 0.0
    ptr = np.zeros(n + 1 if collect else 1, np.int64)
    pos = np.empty(1024, np.int64)
    val = np.empty(1024, np.float64)
    m = 0
    for i in range(n):
        ri = r[i]
        sse += ri * ri
        rs += ri
        for k in range(indptr[i], indptr[i + 1]):
            j = indices[k]
            grad[j] += ri * data[k]
            if collect and colpos[j] >= 0:
                if m + 2 > len(pos):
                    pos, val = _grow(pos, val, m)
                pos[m] = colpos[j]
                val[m] = data[k]
                m += 1
        if collect:
            if icpt_pos >= 0:
                if m + 2 > len(pos):
                    pos, val = _grow(pos, val, m)
                pos[m] = icpt_pos
                val[m] = 1.0
                m += 1
            ptr[i + 1] = m
    grad[f] += rs
    return sse, ptr, pos[:m].copy(), val[:m].copy()


@njit
def unpack(gram: np.ndarray, nw: int) -> np.ndarray:
    """The dense symmetric (nw, nw) matrix of a packed lower triangle."""
    out = np.empty((nw, nw))
    for a in range(nw):
        base = a * (a + 1) // 2
        for b in range(a + 1):
            out[a, b] = gram[base + b]
            out[b, a] = gram[base + b]
    return out


@njit
def _cd_coord(G: np.ndarray, q: np.ndarray, w: np.ndarray, a: int, lam_n: float,
              free: int) -> float:
    d = G[a, a]
    old = w[a]
    z = old - q[a] / d
    if a == free:
        new = z
    else:
        t = lam_n / d
        new = z - t if z > t else (z + t if z < -t else 0.0)
    dw = new - old
    if dw != 0.0:
        w[a] = new
        for b in range(len(w)):
            q[b] += G[a, b] * dw
    return abs(dw) * np.sqrt(d)


@njit
def cd_gram(G: np.ndarray, q: np.ndarray, w: np.ndarray, lam_n: float, free: int,
            tol: float, max_sweeps: int) -> int:
    """Coordinate descent on ``1/2 w^T G w + c^T w + lam_n |w|_1`` over the
    working set, in place: ``q = G w + c`` on entry (``n`` times the
    gradient at ``w``, on ``W``), kept up to date. Position ``free`` (the
    intercept; -1: none) is not penalized. glmnet's cycling: a sweep over
    all positions, then sweeps over the nonzero ones until they settle, then
    all again, until a full sweep's largest change ``|dw_a| sqrt(G_aa)`` (of
    the predictions, in the residual's norm) is <= ``tol``. Returns the
    number of sweeps."""
    nw = len(w)
    active = np.empty(nw, np.int64)
    sweeps = 0
    while sweeps < max_sweeps:
        big = 0.0
        na = 0
        for a in range(nw):
            if G[a, a] <= 0.0:
                continue                          # a column of zeros
            big = max(big, _cd_coord(G, q, w, a, lam_n, free))
            if w[a] != 0.0:
                active[na] = a
                na += 1
        sweeps += 1
        if big <= tol:
            break
        while sweeps < max_sweeps:
            small = 0.0
            for u in range(na):
                small = max(small, _cd_coord(G, q, w, active[u], lam_n, free))
            sweeps += 1
            if small <= tol:
                break
    return sweeps
