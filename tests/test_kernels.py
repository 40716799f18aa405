"""The compiled kernels (harmony.kernels) against plain numpy/scipy
computations of the same math, written here independently."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.optimize import nnls

from harmony.kernels import lda as klda
from harmony.kernels import nmf as knmf

ROOT = Path(__file__).resolve().parent.parent


def _problems(rng, n, k, ridge):
    F = rng.standard_normal((n, 3 * k, k))
    y = rng.standard_normal((n, 3 * k))
    M = np.einsum("nij,nik->njk", F, F) + ridge * np.eye(k)
    v = np.einsum("nij,ni->nj", F, y)
    return F, y, M, v


@pytest.mark.parametrize("k", [1, 4, 16])
def test_nn_solve_many_is_scipy_nnls(k):
    rng = np.random.default_rng(k)
    ridge = 0.05
    F, y, M, v = _problems(rng, 40, k, ridge)
    x = np.empty_like(v)
    knmf.nn_solve_many(M, v, x)
    A = np.concatenate([F, np.broadcast_to(np.sqrt(ridge) * np.eye(k), (40, k, k))], axis=1)
    want = np.stack([nnls(A[j], np.concatenate([y[j], np.zeros(k)]))[0] for j in range(40)])
    assert (x >= 0).all()
    assert (x == 0).any()             # constraints were active (not only the unconstrained path)
    assert np.allclose(x, want, atol=1e-8)


def test_nn_solve_many_meets_kkt_on_ill_conditioned_rows():
    """Nearly collinear columns (conditioning ~1e8): the active-set solve
    still ends at the optimum (KKT: zero gradient on the free unknowns, a
    non-negative one on the bound ones)."""
    rng = np.random.default_rng(7)
    k, n = 12, 30
    base = rng.standard_normal((n, 60, 3))
    F = base @ rng.standard_normal((n, 3, k)) + 1e-4 * rng.standard_normal((n, 60, k))
    y = rng.standard_normal((n, 60))
    M = np.einsum("nij,nik->njk", F, F) + 1e-6 * np.eye(k)
    v = np.einsum("nij,ni->nj", F, y)
    x = np.empty_like(v)
    knmf.nn_solve_many(M, v, x)
    g = np.einsum("njk,nk->nj", M, x) - v
    scale = 1e-6 * (1 + np.abs(v).max(axis=1, keepdims=True))
    assert (x >= 0).all()
    assert (np.abs(np.where(x > 0, g, 0.0)) <= scale).all()
    assert (np.where(x == 0, g, 0.0) >= -scale).all()


def test_als_kernels_match_the_normal_equations_in_numpy():
    rng = np.random.default_rng(3)
    users, items, k, n, lam = 60, 25, 5, 900, 0.1
    u = rng.integers(0, users, n)
    ii = rng.integers(0, items, n)
    r = rng.uniform(0, 3, n).astype(np.float32)
    R = rng.uniform(0, 1, (items, k))
    L = np.full((users, k), -1.0, dtype=np.float32)      # rows without ratings stay
    knmf.als_users(u, ii, r, R, lam, L)
    for j in range(users):
        sel = u == j
        if not sel.any():
            assert (L[j] == -1).all()
            continue
        A = np.vstack([R[ii[sel]], np.sqrt(lam * sel.sum()) * np.eye(k)])
        want = nnls(A, np.concatenate([r[sel], np.zeros(k)]))[0]
        assert np.allclose(L[j], want, atol=1e-5), j
    P = k * (k + 1) // 2
    A, b, c = np.zeros((items, P)), np.zeros((items, k)), np.zeros(items)
    knmf.als_item_sums(ii, u, r, L, A, b, c)
    iu = np.triu_indices(k)
    for i in range(items):
        sel = ii == i
        f = L[u[sel]].astype(np.float64)
        assert np.allclose(A[i], (f.T @ f)[iu], rtol=1e-12, atol=1e-12)
        assert np.allclose(b[i], r[sel].astype(np.float64) @ f, rtol=1e-12, atol=1e-12)
        assert c[i] == sel.sum()


def test_sgd_sweep_is_the_vectorized_mini_batch_step():
    """The compiled sweep against the numpy form of the same mini-batch
    AdaGrad step (gather, scatter-add, then clip), float32."""
    rng = np.random.default_rng(5)
    users, items, k, n, bs = 40, 30, 6, 1000, 64
    u = rng.integers(0, users, n)
    i = rng.integers(0, items, n)
    r = rng.uniform(0, 4, n).astype(np.float32)
    L0 = rng.uniform(0, 1, (users, k)).astype(np.float32)
    R0 = rng.uniform(0, 1, (items, k)).astype(np.float32)
    f32 = np.float32
    lr, lam, eps, inv_k, scale_r, m = f32(0.2), f32(0.02), f32(1e-8), f32(1 / k), f32(2 / k), f32(2)
    L, R = L0.copy(), R0.copy()
    GL, GR = np.zeros(users, np.float32), np.full(items, 0.5, np.float32)
    knmf.sgd_sweep(u, i, r, L, GL, R, GR, bs, lr, lam, eps, inv_k, scale_r, m)
    L2, R2 = L0.copy(), R0.copy()
    GL2, GR2 = np.zeros(users, np.float32), np.full(items, 0.5, np.float32)
    for s in range(0, n, bs):
        uu, ii_, rr = u[s:s + bs], i[s:s + bs], r[s:s + bs]
        Lu, Ri = L2[uu], R2[ii_]
        err = np.einsum("ij,ij->i", Lu, Ri) - rr
        gL = err[:, None] * Ri + lam * Lu
        gR = err[:, None] * Lu + lam * Ri
        np.add.at(GL2, uu, np.einsum("ij,ij->i", gL, gL) * inv_k)
        np.add.at(GR2, ii_, np.einsum("ij,ij->i", gR, gR) * scale_r)
        gL *= (lr / np.sqrt(GL2[uu] + eps))[:, None]
        gR *= (m * lr / np.sqrt(GR2[ii_] + eps))[:, None]
        np.subtract.at(L2, uu, gL)
        np.subtract.at(R2, ii_, gR)
        L2[uu] = np.maximum(L2[uu], 0.0)
        R2[ii_] = np.maximum(R2[ii_], 0.0)
    assert not np.array_equal(L, L0) and (L >= 0).all() and (R >= 0).all()
    for got, want in ((L, L2), (R, R2), (GL, GL2), (GR, GR2)):
        assert np.allclose(got, want, rtol=2e-5, atol=1e-6)


def test_squared_error():
    rng = np.random.default_rng(9)
    L = rng.random((20, 4)).astype(np.float32)
    R = rng.random((10, 4)).astype(np.float32)
    u, i = rng.integers(0, 20, 300), rng.integers(0, 10, 300)
    r = rng.random(300).astype(np.float32)
    want = float(np.sum((np.einsum("ij,ij->i", L[u], R[i]) - r).astype(np.float64) ** 2))
    assert knmf.squared_error(L, R, u, i, r) == pytest.approx(want, rel=1e-6)


def _gibbs_reference(td, tw, z, ndka, bw, inv, bounds, u_all, learn, tiny):
    """The batched sweep written plainly: each batch's tokens sampled from
    the counts at the batch start, then the changes applied."""
    one = np.float32(1)
    for s, e in zip(bounds[:-1], bounds[1:]):
        new = []
        for t in range(s, e):
            a = ndka[td[t]].copy()
            q = bw[tw[t]].copy()
            o = z[t]
            if o >= 0:
                a[o] = max(a[o] - one, tiny)
                if learn:
                    q[o] = max((q[o] - inv[o]) / (one - inv[o]), tiny)
            P = np.cumsum(a * q, dtype=np.float32)    # float32, in topic order
            new.append(int(np.searchsorted(P, u_all[t] * P[-1], side="left")))
        for t, c in zip(range(s, e), new):
            o = z[t]
            if c != o:
                ndka[td[t], c] += one
                if learn:
                    bw[tw[t], c] += inv[c]
        for t, c in zip(range(s, e), new):
            o = z[t]
            if c != o:
                if o >= 0:
                    ndka[td[t], o] -= one
                    if learn:
                        bw[tw[t], o] -= inv[o]
                z[t] = c


@pytest.mark.parametrize("learn", [True, False])
def test_gibbs_sweep_is_the_batched_sampler_bit_for_bit(learn):
    rng = np.random.default_rng(11)
    docs, words, k, n = 30, 50, 7, 2000
    td = np.sort(rng.integers(0, docs, n)).astype(np.int32)
    tw = rng.integers(0, words, n).astype(np.int32)
    z0 = rng.integers(-1, k, n).astype(np.int16)          # some tokens unassigned
    # counts that hold the assigned tokens (as the app's do), plus others
    a = z0 >= 0
    ndk = rng.integers(0, 5, (docs, k)) + np.bincount(td[a] * k + z0[a], minlength=docs * k
                                                       ).reshape(docs, k)
    nwk = rng.integers(0, 5, (words, k)) + np.bincount(tw[a] * k + z0[a], minlength=words * k
                                                        ).reshape(words, k)
    ndka0 = (ndk + 0.1).astype(np.float32)
    inv = (1.0 / (nwk.sum(axis=0) + words * 0.05)).astype(np.float32)
    bw0 = ((nwk + 0.05) * inv).astype(np.float32)
    bounds = np.array([0, 300, 700, 1500, n], dtype=np.int64)
    u_all = rng.random(n, dtype=np.float32)
    got = [z0.copy(), ndka0.copy(), bw0.copy()]
    klda.gibbs_sweep(td, tw, got[0], got[1], got[2], inv, bounds, u_all, learn,
                     np.float32(1e-30), np.empty(800, np.int64))
    want = [z0.copy(), ndka0.copy(), bw0.copy()]
    _gibbs_reference(td, tw, want[0], want[1], want[2], inv, bounds, u_all, learn,
                     np.float32(1e-30))
    assert (got[0] != z0).mean() > 0.3                    # it moved tokens
    for g, w in zip(got, want):
        assert np.array_equal(g, w)


def test_an_executor_loads_its_apps_kernels_before_the_first_epoch():
    """preload (called in an executor's start-up) loads the kernels the app
    uses, so the first COMP does not: numba loads a kernel from its cache at
    the first call (0.5-0.7 s of CPU), and in the first COMP that made the
    master's first profile sample 90x an SGD COMP (273 against 3 ms an
    iteration). Run in a fresh process: nothing is loaded there yet. An app
    that uses no kernel costs nothing."""
    code = """
import sys
from pathlib import Path
from harmony.app import load_app
from harmony.kernels.warm import preload
toy = load_app(Path(sys.argv[1], "minimal.py").read_text(), "minimal.py")
assert preload(toy, "minimal.py") == 0.0
nmf = load_app(Path(sys.argv[1], "nmf.py").read_text(), "nmf.py")
from harmony.kernels import nmf as k
assert not k.sgd_sweep.signatures and not k.als_users.signatures
assert preload(nmf, "nmf.py") > 0
assert k.sgd_sweep.signatures and k.als_users.signatures and k.squared_error.signatures
lda = load_app(Path(sys.argv[1], "lda.py").read_text(), "lda.py")
from harmony.kernels import lda as kl
preload(lda, "lda.py")
assert kl.gibbs_sweep.signatures
"""
    r = subprocess.run([sys.executable, "-c", code, str(ROOT / "apps")], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
