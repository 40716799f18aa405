"""Lasso regression: distributed working-set coordinate descent, or FISTA.

Minimizes ``F(w) = 1/(2n) ||y - X w||^2 + lam ||w||_1`` (scikit-learn's
``Lasso(alpha=lam, fit_intercept=False)``; with ``--intercept`` an
unpenalized intercept is added). Samples are hashed to input blocks by row
number; each machine keeps its blocks as CSR matrices.

**Solvers.** ``--solver ws`` (the default) is a working-set method (an
active-set block coordinate descent; cf. glmnet's strong-set/KKT cycle,
Tibshirani et al. 2012, JRSS-B 74(2), and Celer's growing working sets,
Massias, Gramfort & Salmon, ICML 2018). Epoch ``e``, on every machine, from
the slot of epoch ``e - 1`` (x, gradient, working set ``W`` by position):

* the Lasso restricted to ``W`` (others fixed) is solved by coordinate
  descent on ``W``'s Gram matrix ``X_W^T X_W``, which the servers hold
  (no data pass): ``x_e``; the objective never rises;
* ``W`` grows by the features that violate the optimality conditions at
  ``x_(e-1)`` (``|g_j| > lam``), the worst first, at most
  ``max(256, |W|)`` per epoch and ``--ws-size`` in all;
* one pass over the data at ``x_e``: the full gradient (the KKT check of
  the next epoch), the residual's squared sum (the objective) and the Gram
  rows of the features just added. The residual is kept per block and
  updated from the few entries of ``W``'s columns (kept per block too).

Block minimization with exact block solves converges for this separable
nonsmooth objective (Tseng 2001, JOTA 109(3)); once ``W`` holds the
support and no feature outside violates the conditions, ``x`` is the
optimum. With a full working set and a violator outside it, every other
epoch is a proximal gradient step on all coordinates instead (step
``step_scale / L``): both steps are monotone, so ISTA's sufficient decrease
still drives it to the optimum. The Gram matrix is packed (lower triangle)
into model keys after the intercept and scalars, 6 values a key, tagged so
that the update only ever adds to them: ``--ws-size`` 512 adds 21,888 keys
(1.4 MB) to the model. ``--solver fista`` is the proximal gradient solver
below, one step per epoch (the only one before session 20); the rest of
this docstring describes it, and the slots both share.

**The problem.** The soft-thresholding step of a proximal method needs the
*whole* gradient ``g = sum over machines of X_b^T (X_b v - y_b) / n``. It is
not additive, so it cannot run on the servers as the machines' deltas arrive
one at a time. (This design was also made robust to a machine's PULL of
iteration ``i`` seeing PUSHes of iteration ``i`` from faster machines; the
runtime now runs strict BSP, with a barrier after PULL too, so that no longer
happens, but nothing here depends on it.)

**The design.** The proximal step runs on the workers, identically on every
machine, from state that nobody writes while it is being read:

* one epoch = one full-gradient pass = one proximal step. Its
  ``--iters-per-epoch`` iterations each process one group of blocks;
* the model has two *slots*, used in alternate epochs. Row ``j`` (feature
  ``j``; key ``num_features`` is the intercept) is
  ``[e_A, x_A, v_A, g_A,  e_B, x_B, v_B, g_B]``: per slot the epoch ``e`` it
  belongs to, the iterate ``x_e``, the extrapolated point ``v_e`` and the
  gradient at ``v_e``. Key ``num_features + 1`` holds FISTA's scalars
  ``t_e, beta_e`` in the same layout;
* in every iteration of epoch ``e`` every machine reads slot ``(e-1) % 2``,
  complete since the end of epoch ``e - 1`` and not written in epoch ``e``,
  and computes the same step (bit for bit, same inputs, same code)::

      x_e = soft_threshold(v - eta g, eta lam)        (v, g, x, t: epoch e-1)
      t_e = (1 + sqrt(1 + 4 t^2)) / 2,  beta_e = (t - 1) / t_e
      v_e = x_e + beta_e (x_e - x)
      momentum restart (t_e = 1, v_e = x_e) when (v - x_e).(x_e - x) > 0

  then pushes into slot ``e % 2`` its partial gradient at ``v_e``; machine 0
  also pushes ``x_e``, ``v_e``, ``t_e``, ``beta_e`` (once per epoch, in the
  first iteration; the others push zeros there);
* the server update (``update``) is commutative and associative: a delta
  tagged with a newer epoch than the slot *replaces* the slot, one with the
  same epoch is *added*, an older one is ignored. So the first push of epoch
  ``e`` resets the slot of epoch ``e - 2`` (no separate reset step that
  readers could race with) and ``x_e`` lands exactly (``0 + x_e``);
* the step size is ``eta = step_scale / L`` with ``L`` the largest eigenvalue
  of ``X^T X / n`` (with the intercept column if fitted). Every machine reads
  the whole input, so every machine computes the same ``L`` at read time by
  Lanczos iterations (ARPACK, fixed start vector) on the training rows: all
  of them when they have at most ``--lipschitz-sample-nnz`` nonzeros, else a
  hashed row sample of about that size (the same sample on every machine),
  whose estimate is then raised by 5%;
* one sparse product ``X_b x`` and one ``X_b^T r`` per block and epoch:
  ``X_b v_e = (1 + beta_e) X_b x_e - beta_e X_b x_(e-1)`` from
  ``X_b x_(e-1)``, kept per block from the previous epoch (one float per
  sample; without it ``X_b x`` and ``X_b v`` come from one two-column
  product);
* the objective of epoch ``e`` is ``F(x_e)``. Its data term is a by-product
  of the gradient pass (``X_b x_e``), so evaluating it costs no extra pass;
  ``||x_e||_1`` and the support size ``nnz`` are summed over the server
  shards.

Without ``--accel`` it is plain ISTA (``v = x``). The iterations of an epoch
split one gradient pass into smaller PULL/COMP/PUSH subtasks without changing
the result. 1 or m machines compute the same iterates up to the rounding of
the partial-gradient sums. A run on one machine, or on two with one
iteration per epoch (a replace followed by one commutative add), is
bit-for-bit reproducible; otherwise the order in which pushes arrive may
change the last bits of the sums, never the agreement between machines.

Input: LIBSVM/svmlight lines ``target idx:val ...`` (real targets; ``qid:``
ignored, ``.gz`` ok; see :mod:`harmony.formats.libsvm`). Make data with
``harmony data gen lasso``.

CPU/network ratio: every iteration pulls and pushes the whole model
(``(num_features + 2) x 8`` doubles each way) while COMP costs about
``3 x nnz`` multiply-adds of the iteration's samples. More samples per
feature, denser rows, or fewer ``--iters-per-epoch`` make it CPU-heavy;
many features with few nonzeros, or many iterations per epoch, make it
network-heavy.
"""
from __future__ import annotations

import math
import os

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from harmony.app import App, AppError, InputPart, ModelSpec, Option, Step
from harmony.formats.libsvm import LIBSVM_OPTIONS, check_model_bytes, read_libsvm_blocks
from harmony.kernels import lasso as kern
from harmony.store.blocks import Block

E, X, V, G = 0, 1, 2, 3        # columns within a slot (ws: V holds the position + 1)
SLOT = 4                        # slot s occupies columns [4s, 4s + 4)
NEVER = -np.inf                 # epoch tag of a delta that must not touch a slot
GRAM = -3.0                     # the tag of the Gram keys (ws): always "same epoch", so added
GCOLS = np.array([1, 2, 3, 5, 6, 7])   # the Gram values' columns in a Gram key
WS_START = 256                  # the working set's first size (then it may double per epoch)
WS_TOL = 1e-6                   # block solve: stop at changes <= this x the residual's norm
WS_SWEEPS = 200                 # block solve: at most this many CD sweeps per epoch


def _csr(indptr, indices, data, ncols: int) -> sp.csr_matrix:
    return sp.csr_matrix((data, indices, indptr), shape=(len(indptr) - 1, ncols), copy=False)


def lipschitz(sample: tuple, ncols: int, intercept: bool) -> float:
    """Largest eigenvalue of A^T A / m for the sample rows A (= [X 1] with an
    intercept). Deterministic: ARPACK from a fixed start vector."""
    ptr, idx, val = sample
    m = len(ptr) - 1
    X = _csr(ptr, idx, val, ncols)
    XT = X.T.tocsr()
    d = ncols + (1 if intercept else 0)

    def mv(v):
        v = np.asarray(v, dtype=np.float64).ravel()
        u = X @ v[:ncols]
        if intercept:
            u = u + v[ncols]
        out = XT @ u
        if intercept:
            out = np.append(out, u.sum())
        return out / m

    frob = (float(np.dot(val, val)) + (m if intercept else 0)) / m   # trace >= lambda_max
    if d <= 64:                        # small: the exact Gram matrix, in row chunks
        G = np.zeros((d, d))
        for s in range(0, m, 65536):
            A = X[s:s + 65536].toarray()
            if intercept:
                A = np.column_stack([A, np.ones(len(A))])
            G += A.T @ A
        return float(np.linalg.eigvalsh(G / m)[-1]) * (1 + 1e-9)
    op = spla.LinearOperator((d, d), matvec=mv, dtype=np.float64)
    try:
        # a relative tolerance of 1e-3, with that margin on top: the step
        # needs L to a few digits (a sampled L gets 5% more anyway), and 1e-8
        # took twice the CPU (2.8 s against 1.5 s on 35k sample rows of the
        # cluster bench's data set: a third of its start-up)
        ev = spla.eigsh(op, k=1, which="LA", v0=np.ones(d), tol=1e-3, maxiter=10 * d + 1000,
                        return_eigenvectors=False)
        return float(ev[0]) * (1 + 2e-3)
    except spla.ArpackNoConvergence:
        return frob


class Lasso(App):
    """Lasso regression (squared loss + L1) by distributed proximal gradient (FISTA)."""

    # the epoch tags of FISTA's slots use -inf ("never") on purpose: the
    # runtime must apply such pushes, not refuse them as a divergence
    finite_updates = False
    name = "lasso"
    static_keys = True    # keys(blocks) depends only on which blocks it gets
    mutable_input = ()    # input is read-only: spilled blocks load zero-copy
    # sum: a machine's gradient is its blocks' part of X^T r divided by the
    # *global* n_train, and only machine 0 pushes x, v, t, beta (the others push
    # 0 there), so the sum over machines is exactly the one-machine slot
    combine = "sum"
    step_option = "step_scale"
    on_divergence = "fail"
    options = [
        Option("input", str, None, "training data: LIBSVM 'target idx:val ...' lines (.gz ok)",
               required=True),
        Option("test", str, None, "test data (same format) for test_mse"),
        Option("holdout", float, 0.0, "fraction of --input rows held out for test_mse "
               "(ignored with --test)"),
        *LIBSVM_OPTIONS,
        Option("lam", float, 0.1, "L1 strength: objective = 1/(2n)||y - Xw||^2 + lam ||w||_1 "
               "(scikit-learn's alpha)"),
        Option("solver", str, "ws", "'ws': working-set block coordinate descent (the Gram "
               "matrix of a growing set of features on the servers, exact block solves by "
               "coordinate descent on every machine; a few epochs); 'fista': proximal gradient, "
               "one step per epoch (the solver before session 20)"),
        Option("ws_size", int, 512, "ws: the largest working set (its packed Gram matrix, "
               "ws_size^2 / 2 doubles, is part of the model); when it is full, every other "
               "epoch is a proximal gradient step instead"),
        Option("accel", bool, True, "fista: momentum with adaptive restart (--no-accel: ISTA)"),
        Option("step_scale", float, 1.0, "fista (and ws's steps once its working set is "
               "full): step size = step_scale / L, L = largest eigenvalue of X^T X / n"),
        Option("intercept", bool, False, "fit an unpenalized intercept"),
        Option("lipschitz_sample_nnz", int, 4_000_000, "nonzeros used to compute L (all "
               "training rows if they have fewer, else a hashed sample)"),
        Option("max_epochs", int, 100, "stop after this many epochs (= proximal steps)"),
        Option("model_out", str, None, "write the coefficients here at every epoch end "
               "(machine 0): 'index weight' lines of the nonzeros, the input's index base; "
               "'intercept b' first with --intercept"),
    ]

    # -- input ------------------------------------------------------------------
    def read_input(self, part: InputPart):
        o = self.opts
        if o.lam < 0 or not (0 <= o.holdout < 1) or not (0 < o.step_scale) \
                or o.lipschitz_sample_nnz < 1 or o.solver not in ("ws", "fista") \
                or o.ws_size < 1:
            raise AppError("bad app options: need lam >= 0, 0 <= holdout < 1, step_scale > 0, "
                           "lipschitz_sample_nnz >= 1, solver ws or fista, ws_size >= 1")
        info, blocks = read_libsvm_blocks(
            part, o.input, test_path=o.test, holdout=0.0 if o.test else o.holdout, seed=o.seed,
            index_base=o.index_base, num_features=o.num_features, dtype=np.float64,
            sample_nnz=o.lipschitz_sample_nnz)
        # the model (model_spec: two slots of float64 per key, + 2 keys)
        # refused up front if it cannot fit, before anything of its width
        self.F = F = info.num_features
        self.ws = o.solver == "ws"
        # ws: at most P working-set positions (features, and the intercept
        # column when fitted); their packed Gram matrix in 6 values per key
        self.P = min(o.ws_size, F + (1 if o.intercept else 0)) if self.ws else 0
        self.gram_keys = -(-kern.tri(self.P) // len(GCOLS))
        check_model_bytes(info, part, 2 * SLOT * 8, extra_keys=2 + self.gram_keys)
        self.base = info.index_base
        self.n_train, self.n_test = info.n_train, info.n_test
        self.leader = part.index == 0
        self.L = self.eta = math.nan
        if not self.ws or self.P < F + (1 if o.intercept else 0):  # ws: for a full working set
            L = lipschitz(info.sample, self.F, o.intercept)
            if info.sample_fraction < 1.0:
                L *= 1.05
            self.L = max(L, 1e-12)
            self.eta = o.step_scale / self.L
        self._resid: dict[int, tuple[int, np.ndarray]] = {}   # ws: block -> (x tag, residual)
        self._cols: dict[int, tuple[bytes, tuple]] = {}       # ws: block -> (W, A_W rows)
        self._solved: tuple | None = None                     # ws: the last block solve
        self._all_keys = np.arange(self.F + 2 + self.gram_keys, dtype=np.int64)
        self._x_ref: np.ndarray | None = None    # the x of the latest gradient pass
        self._x_tag = 0
        self._prev_ref: np.ndarray | None = None  # the x before it
        self._Xx: dict[int, tuple[int, np.ndarray]] = {}   # block -> (x tag, X_b x)
        self._sse: dict[int, tuple[int, float]] = {}   # block -> (x tag, sse at x)
        for b, a in blocks:
            yield Block(b, a)

    # -- model --------------------------------------------------------------------
    def model_spec(self) -> ModelSpec:
        return ModelSpec(num_keys=self.F + 2 + self.gram_keys, dim=2 * SLOT, dtype="float64")

    def init_rows(self, keys: np.ndarray) -> np.ndarray:
        rows = np.zeros((len(keys), 2 * SLOT))
        rows[:, E] = -2.0                            # slot 0: epoch 0 will replace it
        rows[:, SLOT + E] = -1.0                     # slot 1: "epoch -1", read in epoch 0
        rows[keys == self.F + 1, SLOT + X] = 1.0     # FISTA's t = 1
        gram = keys >= self.F + 2
        rows[gram, E] = rows[gram, SLOT + E] = GRAM  # ws: the Gram keys only ever add
        return rows

    def update(self, rows: np.ndarray, deltas: np.ndarray) -> np.ndarray:
        """Per slot: a newer epoch replaces, the same epoch adds, an older one
        is ignored (a commutative, associative combination)."""
        out = np.array(rows, copy=True)
        for c in (0, SLOT):
            de, re = deltas[:, c + E], rows[:, c + E]
            if not len(de) or (de[0] == NEVER and (de == NEVER).all()):
                continue                                  # the slot not written now
            if (de == re).all():
                out[:, c + 1:c + SLOT] += deltas[:, c + 1:c + SLOT]
            elif (de > re).all():
                out[:, c:c + SLOT] = deltas[:, c:c + SLOT]
            else:
                newer, same = de > re, de == re
                out[newer, c:c + SLOT] = deltas[newer, c:c + SLOT]
                out[same, c + 1:c + SLOT] += deltas[same, c + 1:c + SLOT]
        return out

    def keys(self, blocks: list[Block]) -> np.ndarray:
        return self._all_keys                      # the prox step needs every row

    # -- iteration --------------------------------------------------------------------
    def _step(self, rows: np.ndarray, epoch: int):
        """(x_e, v_e, t_e, beta_e, x_(e-1)) from the slot of epoch e - 1."""
        o, F = self.opts, self.F
        c = SLOT * ((epoch - 1) % 2)
        if not np.all(rows[:, c + E] == epoch - 1):
            raise AppError(f"lasso: model slot of epoch {epoch - 1} not found at epoch {epoch} "
                           "(the model state is out of step with the epochs)")
        x, v, g = rows[:F + 1, c + X], rows[:F + 1, c + V], rows[:F + 1, c + G]
        t, beta = rows[F + 1, c + X], rows[F + 1, c + V]
        if epoch == 0:
            return x, v, t, beta, x
        z = v - self.eta * g
        xn = np.sign(z) * np.maximum(np.abs(z) - self.eta * o.lam, 0.0)
        xn[F] = z[F] if o.intercept else 0.0
        if not o.accel or np.dot(v - xn, xn - x) > 0:   # ISTA, or momentum restart
            return xn, xn, 1.0, 0.0, x
        tn = (1.0 + math.sqrt(1.0 + 4.0 * t * t)) / 2.0
        bn = (t - 1.0) / tn
        return xn, xn + bn * (xn - x), tn, bn, x

    def compute(self, blocks: list[Block], keys: np.ndarray, rows: np.ndarray,
                step: Step) -> np.ndarray:
        if self.ws:
            return self._ws_compute(blocks, rows, step)
        F = self.F
        x, v, t, beta, x_prev = self._step(rows, step.epoch)
        if self._x_ref is None or not np.array_equal(x, self._x_ref):
            self._prev_ref, self._x_ref = self._x_ref, np.array(x)
            self._x_tag += 1
        same = np.array_equal(x, v)
        prev_ok = self._prev_ref is not None and np.array_equal(x_prev, self._prev_ref)
        grad = np.zeros(F + 1)
        for blk in blocks:
            Xb = _csr(blk["indptr"], blk["indices"], blk["data"], F)
            y = blk["y"]
            old = self._Xx.get(blk.id)
            if same:
                Xx = Xb @ x[:F]
                rv = Xx + (v[F] - y)
            elif old is not None and prev_ok and old[0] == self._x_tag - 1:
                # v = x + beta (x - x_prev): X v from X x and the kept X x_prev
                Xx = Xb @ x[:F]
                rv = (1.0 + beta) * Xx - beta * old[1] + (v[F] - y)
            else:
                XP = Xb @ np.column_stack([x[:F], v[:F]])
                Xx = np.ascontiguousarray(XP[:, 0])
                rv = XP[:, 1] + (v[F] - y)
            self._Xx[blk.id] = (self._x_tag, Xx)
            rx = Xx + (x[F] - y)
            self._sse[blk.id] = (self._x_tag, float(np.dot(rx, rx)))
            grad[:F] += Xb.T @ rv
            grad[F] += rv.sum()
        if not self.opts.intercept:
            grad[F] = 0.0
        c = SLOT * (step.epoch % 2)
        delta = np.zeros_like(rows)
        delta[:, E] = delta[:, SLOT + E] = NEVER
        delta[:, c + E] = step.epoch
        delta[:F + 1, c + G] = grad / self.n_train
        if self.leader and step.iter == 0:
            delta[:F + 1, c + X] = x
            delta[:F + 1, c + V] = v
            delta[F + 1, c + X] = t
            delta[F + 1, c + V] = beta
        return delta

    # -- the working-set solver (--solver ws) -----------------------------------------
    def _gram(self, rows: np.ndarray, nw: int) -> np.ndarray:
        """The dense Gram matrix of the first ``nw`` working-set positions."""
        packed = rows[self.F + 2:, GCOLS].ravel()[:kern.tri(nw)]
        return kern.unpack(np.ascontiguousarray(packed), nw)

    def _ws_step(self, rows: np.ndarray, epoch: int):
        """(x_e, pos_e, W_e, |W_(e-1)|, sse at x_(e-1)) from the slot of epoch e - 1:
        the block solve on W_(e-1) (or, with a full working set and a KKT
        violator outside it, in odd epochs, a proximal gradient step), and
        W_e = W_(e-1) plus the worst violators of the optimality conditions at
        x_(e-1). Every machine computes it from the same rows, bit for bit."""
        o, F = self.opts, self.F
        c = SLOT * ((epoch - 1) % 2)
        if not np.all(rows[:F + 2, c + E] == epoch - 1):
            raise AppError(f"lasso: model slot of epoch {epoch - 1} not found at epoch {epoch} "
                           "(the model state is out of step with the epochs)")
        x, posf, g = rows[:F + 1, c + X], rows[:F + 1, c + V], rows[:F + 1, c + G]
        sse = float(rows[F + 1, c + G])
        inw = np.flatnonzero(posf)
        W = np.empty(len(inw), np.int64)
        W[posf[inw].astype(np.int64) - 1] = inw
        if epoch == 0:                          # no gradient yet: the pass at x_0 = 0 first
            return np.array(x), np.array(posf), W, len(W), sse
        s = self._solved
        if s is not None and s[0] == epoch and np.array_equal(s[1], x) \
                and np.array_equal(s[2], g) and np.array_equal(s[3], posf):
            return s[4]                         # another iteration of this epoch
        xn = np.array(x)
        viol = np.flatnonzero((posf[:F] == 0) & (np.abs(g[:F]) > o.lam))
        if len(W) == self.P and len(viol) and epoch % 2 == 1:
            # the working set is full: a proximal gradient step on all
            # coordinates. Monotone, as the block solves are, so the
            # alternation converges to the optimum (ISTA's sufficient decrease)
            z = x - self.eta * g
            xn = np.sign(z) * np.maximum(np.abs(z) - self.eta * o.lam, 0.0)
            xn[F] = z[F] if o.intercept else 0.0
        elif len(W):
            ww = np.array(x[W])
            q = g[W] * self.n_train
            free = int(posf[F]) - 1 if o.intercept else -1
            kern.cd_gram(self._gram(rows, len(W)), q, ww, o.lam * self.n_train, free,
                         WS_TOL * math.sqrt(sse), WS_SWEEPS)
            xn[W] = ww
        add = [F] if o.intercept and posf[F] == 0 else []
        k = min(max(WS_START, len(W)), self.P - len(W) - len(add), len(viol))
        if k > 0:
            order = np.argsort(-np.abs(g[viol]), kind="stable")[:k]
            add += viol[order].tolist()
        posn = np.array(posf)
        posn[add] = len(W) + 1 + np.arange(len(add))
        out = (xn, posn, np.concatenate([W, np.array(add, np.int64)]), len(W), sse)
        self._solved = (epoch, np.array(x), np.array(g), np.array(posf), out)
        return out

    def _residual(self, blk: Block, x: np.ndarray, wpos: np.ndarray) -> np.ndarray:
        """``X_b x + b - y``: from the one kept for the previous x when x
        changed only on the working set whose columns are kept for the block
        (``wpos``: position + 1 by feature), else from scratch."""
        F = self.F
        old = self._resid.get(blk.id)
        if old is not None and old[0] == self._x_tag:
            return old[1]
        cols = self._cols.get(blk.id)
        if old is not None and cols is not None and old[0] == self._x_tag - 1 \
                and self._prev_ref is not None:
            d = np.flatnonzero(x != self._prev_ref)
            p = wpos[d].astype(np.int64)
            if len(d) and p.min() > 0 and p.max() <= cols[1]:
                dw = np.zeros(cols[1])
                dw[p - 1] = x[d] - self._prev_ref[d]
                kern.resid_update(*cols[2], dw, old[1])
                return old[1]
        if not x[:F].any():                     # x_0 = 0: no product needed
            return x[F] - blk["y"]
        Xb = _csr(blk["indptr"], blk["indices"], blk["data"], F)
        return Xb @ x[:F] + (x[F] - blk["y"])

    def _ws_compute(self, blocks: list[Block], rows: np.ndarray, step: Step) -> np.ndarray:
        """One pass at x_e over the blocks: the gradient ``X^T r / n``, the
        residual's squared sum, and the Gram rows of the positions W_e added."""
        F = self.F
        x, posn, W, nw_old, _ = self._ws_step(rows, step.epoch)
        if self._x_ref is None or not np.array_equal(x, self._x_ref):
            self._prev_ref, self._x_ref = self._x_ref, np.array(x)
            self._x_tag += 1
        nw = len(W)
        wkey = W.tobytes()
        colpos = posn[:F].astype(np.int64) - 1
        icpt_pos = int(posn[F]) - 1
        gram = np.zeros(kern.tri(nw) - kern.tri(nw_old))
        grad = np.zeros(F + 1)
        sse = 0.0
        for blk in blocks:
            ptr, idx, val = blk["indptr"], blk["indices"], blk["data"]
            r = self._residual(blk, x, posn)      # (the block's kept A_W is a prefix of W's)
            self._resid[blk.id] = (self._x_tag, r)
            cols = self._cols.get(blk.id)
            fresh = cols is None or cols[0] != wkey
            s, *got = kern.xt_r(ptr, idx, val, r, grad, colpos, icpt_pos, fresh and nw > 0)
            if fresh:
                cols = (wkey, nw, tuple(got))
                self._cols[blk.id] = cols
            if nw > nw_old:
                kern.gram_rows(*cols[2], nw_old, gram)
            self._sse[blk.id] = (self._x_tag, s)
            sse += s
        if not self.opts.intercept:
            grad[F] = 0.0
        c = SLOT * (step.epoch % 2)
        delta = np.zeros_like(rows)
        delta[:F + 2, E] = delta[:F + 2, SLOT + E] = NEVER
        delta[F + 2:, E] = delta[F + 2:, SLOT + E] = GRAM
        delta[:F + 2, c + E] = step.epoch
        delta[:F + 1, c + G] = grad / self.n_train
        delta[F + 1, c + G] = sse
        if self.leader and step.iter == 0:
            delta[:F + 1, c + X] = x
            delta[:F + 1, c + V] = posn
        if len(gram):
            at = kern.tri(nw_old) + np.arange(len(gram))
            delta[F + 2 + at // len(GCOLS), GCOLS[at % len(GCOLS)]] = gram
        return delta

    # -- objective ----------------------------------------------------------------------
    def _latest_x(self, rows: np.ndarray) -> np.ndarray:
        """x of the newest slot, per row."""
        return np.where(rows[:, E] > rows[:, SLOT + E], rows[:, X], rows[:, SLOT + X])

    def objective(self, blocks: list[Block], keys: np.ndarray, rows: np.ndarray) -> dict:
        F = self.F
        x = self._latest_x(rows)[:F + 1]
        current = self._x_ref is not None and np.array_equal(x, self._x_ref)
        sse = tsse = tn = 0.0
        for blk in blocks:
            st = self._sse.get(blk.id)
            if current and st is not None and st[0] == self._x_tag:
                sse += st[1]
            else:
                r = _csr(blk["indptr"], blk["indices"], blk["data"], F) @ x[:F] + x[F] - blk["y"]
                sse += float(np.dot(r, r))
            if len(blk["t_y"]):
                r = (_csr(blk["t_indptr"], blk["t_indices"], blk["t_data"], F) @ x[:F]
                     + x[F] - blk["t_y"])
                tsse += float(np.dot(r, r))
                tn += len(r)
        if self.leader and self.opts.model_out:
            self._write_model(x)
        return {"sse": sse, "test_sse": tsse, "test_n": tn}

    def _write_model(self, x: np.ndarray) -> None:
        path = self.opts.model_out
        nz = np.flatnonzero(x[:self.F])
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w") as fh:
            if self.opts.intercept:
                fh.write(f"intercept {float(x[self.F])!r}\n")
            fh.writelines(f"{j + self.base} {float(x[j])!r}\n" for j in nz.tolist())
        os.replace(tmp, path)

    # -- export (harmony model get) -------------------------------------------------
    def export_meta(self) -> dict:
        return {"index_base": int(self.base), "features": int(self.F)}

    def export(self, keys: np.ndarray, rows: np.ndarray, meta: dict) -> dict:
        """``coef`` (features): the iterate of the last epoch, whose
        objective was reported; ``coef[j]`` is the input's feature index
        ``j + index_base``. ``intercept`` (0 without ``--intercept``)."""
        x = self._latest_x(rows)
        # the feature count: after it, the intercept, FISTA's scalars, ws's Gram
        F = int(meta.get("features", len(rows) - 2))
        out = {"coef": np.array(x[:F]), "intercept": np.float64(x[F])}
        if "index_base" in meta:
            out["index_base"] = np.int64(meta["index_base"])
        return out

    def export_text(self, arrays: dict) -> str:
        """Like ``--model-out``: ``index weight`` lines of the nonzeros in the
        input's index base, ``intercept b`` first with ``--intercept``."""
        coef, base = arrays["coef"], int(arrays.get("index_base", 0))
        lines = [f"intercept {float(arrays['intercept'])!r}\n"] if self.opts.intercept else []
        lines += [f"{j + base} {float(coef[j])!r}\n" for j in np.flatnonzero(coef).tolist()]
        return "".join(lines)

    def model_objective(self, keys: np.ndarray, rows: np.ndarray) -> dict:
        w = self._latest_x(rows)[keys < self.F]
        return {"l1": float(np.abs(w).sum()), "nnz": float(np.count_nonzero(w))}

    def metrics(self, s: dict) -> dict:
        loss = 0.5 * s.get("sse", 0.0) / self.n_train
        out = {"objective": loss + self.opts.lam * s.get("l1", 0.0), "loss": loss,
               "nnz": s.get("nnz", 0.0)}
        if s.get("test_n"):
            out["test_mse"] = s["test_sse"] / s["test_n"]
        return out
