"""The NMF quality reference: non-negative ALS with L2, NNLS per row.

Each sweep solves, for every user ``u`` with the item factors fixed,

    min_{x >= 0}  sum_{i rated by u} (x . R_i - r_ui)^2 + lam * n_u * |x|^2

(``n_u``: the user's training ratings, the same per-rating L2 as the app's
``--lam``), then the same for every item with the user factors fixed. The
non-negative least squares is exact (``scipy.optimize.nnls`` on the ratings'
rows stacked over ``sqrt(lam n_u) I``), not a ridge solution clipped at 0,
and written independently of the app's solver (which solves the normal
equations).

``reference_rmse`` loads a ratings file, splits it with the app's own
hashed hold-out, and returns the held-out RMSE at the best ``lam`` of a
grid, chosen on the held-out ratings themselves (which favours the
reference over the app, which cannot choose on them).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
from scipy.optimize import nnls

ROOT = Path(__file__).resolve().parent.parent
LAMS = (0.003, 0.01, 0.03, 0.1)


def _app_module():
    spec = importlib.util.spec_from_file_location("nmf_reference_app", ROOT / "apps" / "nmf.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _solve_rows(a, b, r, F, n, lam, prev):
    """Row x of every a-index: NNLS of F[b] x ~ r over its ratings, L2 lam * count
    (a row without ratings keeps its value in ``prev``): ``nnls`` of the
    ratings' rows stacked over ``sqrt(lam * count) I``."""
    k = F.shape[1]
    order = np.argsort(a, kind="stable")
    cnt = np.bincount(a, minlength=n)
    bounds = np.concatenate([[0], np.cumsum(cnt)])
    out = np.array(prev, dtype=np.float64)
    for j in np.flatnonzero(cnt):
        sel = order[bounds[j]:bounds[j + 1]]
        A = np.vstack([F[b[sel]], np.sqrt(lam * cnt[j]) * np.eye(k)])
        out[j] = nnls(A, np.concatenate([r[sel], np.zeros(k)]))[0]
    return out


def nnls_als(u, i, r, nu, ni, k, lam, sweeps=40, seed=0):
    """(L, R) after ``sweeps`` alternating NNLS sweeps (users first) from a
    uniform start of the app's scale."""
    rng = np.random.default_rng(seed)
    scale = 2.0 * np.sqrt(max(float(np.mean(r)), 1e-3) / k)
    L = rng.uniform(0, scale, (nu, k))
    R = rng.uniform(0, scale, (ni, k))
    for _ in range(sweeps):
        L = _solve_rows(u, i, r, R, nu, lam, L)
        R = _solve_rows(i, u, r, L, ni, lam, R)
    return L, R


def load_split(path, holdout=0.1, seed=0):
    """(u, i, r, test mask) of a ratings file, split by the app's hashed hold-out."""
    a = np.loadtxt(path, ndmin=2)
    u, i, r = a[:, 0].astype(np.int64), a[:, 1].astype(np.int64), a[:, 2]
    return u, i, r, _app_module().holdout_mask(u, i, holdout, seed)


def reference_rmse(path, rank, lams=LAMS, sweeps=40, holdout=0.1, seed=0):
    """(best held-out RMSE, {lam: held-out RMSE}) of the NNLS-ALS reference."""
    u, i, r, test = load_split(path, holdout, seed)
    tr = ~test
    got = {}
    for lam in lams:
        L, R = nnls_als(u[tr], i[tr], r[tr], u.max() + 1, i.max() + 1, rank, lam, sweeps)
        d = (L[u[test]] * R[i[test]]).sum(1) - r[test]
        got[lam] = float(np.sqrt(np.mean(d * d)))
    return min(got.values()), got
