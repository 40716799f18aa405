"""Multinomial logistic regression (softmax regression) by mini-batch SGD.

Model: one weight row per feature, ``W[j] in R^classes``, on the parameter
servers (key = feature index ``j``), plus one bias row (key =
``num_features``; not regularized). Input samples are hashed to input blocks
by row number; each machine keeps its own blocks as CSR matrices. Each
iteration takes the machine's next group of blocks (``--iters-per-epoch``
groups per epoch), pulls the rows of the features that occur in them, runs
SGD over their samples in mini-batches of ``--batch-size`` against a local
copy of those rows (``--local-passes`` times), and pushes the change of the
rows; the servers add the changes of all machines.

Objective (reported per epoch):
``mean cross-entropy over training samples + l2/2 * ||W||^2`` (bias
excluded), plus training ``accuracy`` and, on held-out samples
(``--holdout``, a hashed fraction of the input rows, or a separate ``--test``
file), ``test_loss`` (mean cross-entropy) and ``test_accuracy``.

Input: LIBSVM/svmlight lines ``label idx:val idx:val ... [# comment]``
(``qid:`` ignored, ``.gz`` ok, see :mod:`harmony.formats.libsvm`). Labels
must be integers (e.g. ``0..9`` or ``-1 +1``); the classes are the distinct
labels of the input files, in increasing order. Feature indices: see
``--index-base``. Make data with ``harmony data gen mlr``.

CPU/network ratio. Per iteration and machine, PULL and PUSH each move
``U x classes x 4`` bytes, where ``U`` is the number of distinct features in
the iteration's samples, and COMP costs about ``3 x S x nnz x classes``
multiply-adds for ``S`` samples of ``nnz`` nonzeros (forward pass, gradient,
update) times ``--local-passes``. Classes scale both sides alike; what moves
the ratio is how many samples share one pulled row:

* network-heavy: wide and sparse data (many features, few nonzeros per row;
  ``harmony data gen mlr --features``/``--nnz``), many iterations per epoch
  (``--iters-per-epoch`` up: fewer samples per pull while ``U`` shrinks
  slowly), many machines (each pulls its own copy of the rows);
* CPU-heavy: dense rows / many nonzeros per row, few iterations per epoch
  (more samples per pull), ``--local-passes`` > 1 (more computation for the
  same pull and push), a small ``--batch-size`` (more, smaller steps: more
  CPU per sample).

Several machines (``combine = "mean"``). ``--batch-size`` is the *global*
mini-batch: on ``m`` machines each takes SGD steps on ``batch_size / m`` of
its own samples, so every machine takes as many steps per epoch as one
machine alone does, and the servers average the machines' row changes. One
step on each machine, averaged, is exactly one step on the global batch;
several local steps per iteration are local SGD with model averaging, which
stays stable where adding the changes would not: in a well-determined
direction every machine's local run converges to about the same point, and
the *sum* of ``m`` such moves overshoots by ``m - 1`` times the distance (it
oscillates for ``m = 2`` and grows for ``m >= 3``), while the mean lands on
it. Each sample still moves the weights by ``lr / batch_size`` times its
gradient, to first order, at any ``m``. The objective of a 2-machine run
follows the 1-machine one closely but not bit for bit.

Step size. ``--lr auto`` (the default) is ``--lr-scale / L`` with ``L`` the
largest eigenvalue of ``A A^T / b`` for mini-batches ``A`` of ``b =
batch_size`` training rows with a bias column (the largest over a few
batches of a hashed row sample, the same on every machine): the curvature a
mini-batch step sees, which is about the mean squared row norm for narrow
data and far less for wide data. The softmax Hessian is at most ``L / 2``
per sample, so ``lr < 4 / L`` is stable at the worst case; the default
scale 2 is half that (room for the smaller local batches on more machines;
the softmax's curvature is nearer ``L / classes`` in practice). So the
default step converges on standardized data of any width. It is
conservative on uncentered data (all-positive pixels: the mean direction
sets ``L``), where a tuned number does better: ``--lr 2 --batch-size 32`` on
digits. A number sets the step directly. A training loss above ``2 log(C) +
1`` (the all-zero model has ``log C``) also fails the job as diverged.
"""
from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp

from harmony.app import App, AppError, InputError, InputPart, ModelSpec, Option, Step
from harmony.ps.keymap import mix64
from harmony.formats.libsvm import (LIBSVM_OPTIONS, check_model_bytes, read_libsvm_blocks,
                                    take_rows)
from harmony.store.blocks import Block

EVAL_ROWS = 8192       # samples per vectorized slice in objective()


def _csr(indptr, indices, data, ncols: int) -> sp.csr_matrix:
    return sp.csr_matrix((data, indices, indptr), shape=(len(indptr) - 1, ncols), copy=False)


try:   # scipy's CSR kernels, which accumulate into a given output array
    from scipy.sparse import _sparsetools as _st
    _st.csr_matvecs, _st.csc_matvecs
except (ImportError, AttributeError):  # pragma: no cover - other scipy versions
    _st = None


def _row_range(X: sp.csr_matrix, s: int, e: int) -> tuple:
    """Rows s:e of X as (indptr, indices, data) views (indptr rebased)."""
    a, b = X.indptr[s], X.indptr[e]
    return X.indptr[s:e + 1] - a, X.indices[a:b], X.data[a:b]


def _spmm(sub: tuple, V: np.ndarray, n: int, k: int) -> np.ndarray:
    """X_b @ V for CSR rows ``sub`` = (indptr, indices, data) over k columns."""
    if _st is None:
        return np.asarray(_csr(*sub, k) @ V)
    Z = np.zeros((n, V.shape[1]), dtype=V.dtype)
    _st.csr_matvecs(n, k, V.shape[1], sub[0], sub[1], sub[2], V.ravel(), Z.ravel())
    return Z


def _spmm_t_add(sub: tuple, Z: np.ndarray, V: np.ndarray, n: int, k: int) -> None:
    """V += X_b^T @ Z in place, touching only the rows of V that X_b uses."""
    if _st is None:
        X = _csr(*sub, k)
        cols = np.unique(sub[1])
        V[cols] += (X.T @ Z)[cols]
        return
    _st.csc_matvecs(k, n, Z.shape[1], sub[0], sub[1], sub[2], Z.ravel(), V.ravel())


def _check_int_labels(chunk) -> None:
    bad = chunk.labels != np.round(chunk.labels)
    if bad.any():
        r = int(np.argmax(bad))
        raise chunk.error(r, f"bad label {float(chunk.labels[r])!r}: "
                          "class labels must be integers")


def _lr_value(text: str):
    """``--lr``: 'auto' or a positive number."""
    if str(text).strip().lower() == "auto":
        return "auto"
    return float(text)


LR_SAMPLE_NNZ = 400_000    # nonzeros of the row sample that the auto step size is computed on
LR_BATCHES = 8             # mini-batches of that sample whose curvature is measured


def batch_curvature(sample: tuple, ncols: int, batch: int, seed: int) -> float:
    """The largest eigenvalue of ``A A^T / b`` (``A``: ``b`` rows of the sample
    with a bias column), the largest over ``LR_BATCHES`` hashed batches."""
    ptr, idx, val = sample
    n = len(ptr) - 1
    X = _csr(ptr, idx, val.astype(np.float64), ncols)
    b = max(1, min(batch, n))
    order = np.argsort(mix64(np.arange(n, dtype=np.uint64) ^ np.uint64(seed * 2654435761 + 5)),
                       kind="stable")
    top = 0.0
    for k in range(min(LR_BATCHES, max(1, n // b))):
        rows = order[k * b:(k + 1) * b]
        A = X[rows]
        G = (A @ A.T).toarray() + 1.0                   # + the bias column
        top = max(top, float(np.linalg.eigvalsh(G / len(rows))[-1]))
    return max(top, 1e-12)


class MLR(App):
    """Multinomial logistic regression (softmax, cross-entropy + L2) by mini-batch SGD."""

    name = "mlr"
    static_keys = True    # keys(blocks) depends only on which blocks it gets
    mutable_input = ()    # input is read-only: spilled blocks load zero-copy
    # each machine's delta is a whole local SGD run on its share of the global
    # batch: averaging them is one step on the global batch (see the module
    # docstring on why a sum would overshoot)
    combine = "mean"
    step_option = "lr"
    on_divergence = "fail"
    options = [
        Option("input", str, None, "training data: LIBSVM 'label idx:val ...' lines (.gz ok)",
               required=True),
        Option("test", str, None, "test data (same format); unset: hashed --holdout of --input"),
        Option("holdout", float, 0.1, "fraction of --input rows held out for test metrics "
               "(ignored with --test)"),
        *LIBSVM_OPTIONS,
        Option("lr", _lr_value, "auto", "SGD step size, or 'auto': --lr-scale / L, L = the "
               "curvature of a mini-batch step (see the app's docstring)"),
        Option("lr_scale", float, 2.0, "with --lr auto: the step size times L"),
        Option("decay", float, 0.9, "step size multiplier per epoch"),
        Option("l2", float, 1e-4, "L2 strength: objective adds l2/2 * ||W||^2 (bias excluded)"),
        Option("batch_size", int, 100, "samples per local SGD step inside an iteration"),
        Option("local_passes", int, 1, "SGD passes over an iteration's samples per COMP "
               "(more CPU per pull/push)"),
    ]

    # -- input ------------------------------------------------------------------
    def read_input(self, part: InputPart):
        o = self.opts
        auto = o.lr == "auto"
        if not (0 <= o.holdout < 1) or (not auto and not o.lr > 0) or o.batch_size < 1 \
                or o.l2 < 0 or o.local_passes < 1 or not (0 < o.decay <= 1) \
                or not o.lr_scale > 0:
            raise AppError("bad app options: need 0 <= holdout < 1, lr > 0 or 'auto', "
                           "lr_scale > 0, batch_size >= 1, l2 >= 0, local_passes >= 1, "
                           "0 < decay <= 1")
        info, blocks = read_libsvm_blocks(
            part, o.input, test_path=o.test, holdout=0.0 if o.test else o.holdout, seed=o.seed,
            index_base=o.index_base, num_features=o.num_features, dtype=np.float32,
            collect_labels=True, check_labels=_check_int_labels,
            sample_nnz=LR_SAMPLE_NNZ if auto else 0)
        # the model (+ bias row, float32 per class) refused up front if it
        # cannot fit, before anything of its width is allocated
        check_model_bytes(info, part, max(len(info.labels), 1) * 4, extra_keys=1)
        # (compute splits the global batch over step.machines: combine = "mean")
        if auto:
            self.curvature = batch_curvature(info.sample, info.num_features, o.batch_size,
                                             o.seed)
            self.lr0 = o.lr_scale / self.curvature
        else:
            self.lr0 = float(o.lr)
        if len(info.labels) < 2:
            raise InputError(o.input, None, f"need at least 2 classes, found {len(info.labels)}")
        self.labels = info.labels
        self.classes = len(info.labels)
        self.F = info.num_features
        self.n_train, self.n_test = info.n_train, info.n_test
        self.index_base = info.index_base          # for the export (export_meta)
        self._keys_cache: dict[tuple, np.ndarray] = {}
        for b, a in blocks:
            # sample order within a block: a seeded shuffle (files are often sorted by class)
            n = len(a["indptr"]) - 1
            perm = np.random.default_rng([o.seed % 2**63, b, 17]).permutation(n)
            ptr, idx, val = take_rows(a["indptr"], a["indices"], a["data"], perm)
            if ptr[-1] < 2**31 and a["t_indptr"][-1] < 2**31:   # match the int32 indices
                ptr, a["t_indptr"] = ptr.astype(np.int32), a["t_indptr"].astype(np.int32)
            y = a["y"][perm]
            # features as local ids into the block's sorted feature list
            feats, inv = np.unique(np.concatenate([idx, a["t_indices"]]), return_inverse=True)
            inv = inv.astype(np.int32)
            yield Block(b, {
                "feats": feats.astype(np.int64),
                "indptr": ptr, "lidx": inv[:len(idx)], "data": val,
                "y": np.searchsorted(self.labels, y).astype(np.int32),
                "t_indptr": a["t_indptr"], "t_lidx": inv[len(idx):], "t_data": a["t_data"],
                "t_y": np.searchsorted(self.labels, a["t_y"]).astype(np.int32),
            })

    # -- model --------------------------------------------------------------------
    def model_spec(self) -> ModelSpec:
        return ModelSpec(num_keys=self.F + 1, dim=self.classes)   # + bias row

    def keys(self, blocks: list[Block]) -> np.ndarray:
        ck = tuple(b.id for b in blocks)
        keys = self._keys_cache.get(ck)
        if keys is None:
            if not blocks:
                feats = np.zeros(0, dtype=np.int64)
            elif len(blocks) == 1:
                feats = blocks[0]["feats"]
            else:
                total = sum(len(b["feats"]) for b in blocks)
                if 8 * total >= self.F:
                    mask = np.zeros(self.F, dtype=bool)
                    for b in blocks:
                        mask[b["feats"]] = True
                    feats = np.flatnonzero(mask)
                else:
                    feats = np.unique(np.concatenate([b["feats"] for b in blocks]))
            keys = np.append(feats, self.F).astype(np.int64)       # bias row last
            self._keys_cache[ck] = keys
        return keys

    @staticmethod
    def _local(blk: Block, keys: np.ndarray, test: bool = False) -> sp.csr_matrix:
        """The block's samples as CSR over the columns ``keys[:-1]``."""
        feats = blk["feats"]
        p = "t_" if test else ""
        lidx = blk[p + "lidx"]
        if len(feats) != len(keys) - 1 or not np.array_equal(feats, keys[:-1]):
            lidx = np.searchsorted(keys[:-1], feats).astype(np.int32)[lidx]
        return _csr(blk[p + "indptr"], lidx, blk[p + "data"], len(keys) - 1)

    # -- iteration --------------------------------------------------------------------
    def compute(self, blocks: list[Block], keys: np.ndarray, rows: np.ndarray,
                step: Step) -> np.ndarray:
        o = self.opts
        K = len(keys) - 1
        C = self.classes
        W0, b0 = rows[:-1], rows[-1]
        # W = s * V: the L2 shrink of every step is folded into the scalar s,
        # so a step only touches the rows of the features its samples use
        V = np.array(W0, dtype=np.float32)
        s = 1.0
        bias = np.array(b0, dtype=np.float32)
        lr = self.lr0 * o.decay ** step.epoch
        shrink = 1.0 - lr * o.l2
        if shrink <= 0:
            raise AppError(f"lr * l2 = {lr * o.l2} >= 1: lower --lr or --l2")
        bs = max(1, round(o.batch_size / step.machines))   # the global batch, split
        rng = np.random.default_rng([o.seed % 2**63, step.epoch, step.iter, 29])
        for _ in range(o.local_passes):
            for blk in blocks:
                X = self._local(blk, keys)
                y = blk["y"]
                for start in rng.permutation(np.arange(0, X.shape[0], bs)):
                    end = min(start + bs, X.shape[0])
                    nb = end - start
                    sub = _row_range(X, start, end)
                    Z = _spmm(sub, V, nb, K)                      # logits / s
                    Z *= np.float32(s)
                    Z += bias
                    Z -= Z.max(axis=1, keepdims=True)
                    np.exp(Z, out=Z)
                    Z /= Z.sum(axis=1, keepdims=True)
                    Z[np.arange(nb), y[start:end]] -= 1.0        # d cross-entropy / d logits
                    gb = Z.sum(axis=0)
                    s *= shrink
                    if s < 1e-4:     # fold the scale back in before it underflows
                        V *= np.float32(s)
                        s = 1.0
                    Z *= np.float32(-lr / (nb * s))
                    _spmm_t_add(sub, Z, V, nb, K)                 # V += X_b^T Z
                    bias -= np.float32(lr / nb) * gb
        V *= np.float32(s)
        out = np.empty((K + 1, C), dtype=np.float32)
        np.subtract(V, W0, out=out[:-1])
        np.subtract(bias, b0, out=out[-1])
        return out

    # -- objective ----------------------------------------------------------------------
    def objective(self, blocks: list[Block], keys: np.ndarray, rows: np.ndarray) -> dict:
        W, bias = rows[:-1], rows[-1]
        out = {"ce": 0.0, "n": 0.0, "correct": 0.0,
               "test_ce": 0.0, "test_n": 0.0, "test_correct": 0.0}
        for blk in blocks:
            for test, pre in ((False, ""), (True, "test_")):
                X = self._local(blk, keys, test)
                y = blk["t_y" if test else "y"]
                for s in range(0, X.shape[0], EVAL_ROWS):
                    e = min(s + EVAL_ROWS, X.shape[0])
                    Z = _spmm(_row_range(X, s, e), W, e - s, len(keys) - 1)
                    Z += bias
                    ys = y[s:s + EVAL_ROWS]
                    picked = Z[np.arange(len(ys)), ys]
                    mx = Z.max(axis=1)
                    Z -= mx[:, None]
                    np.exp(Z, out=Z)
                    lse = mx + np.log(Z.sum(axis=1))
                    out[pre + "ce"] += float(np.sum(lse - picked, dtype=np.float64))
                    out[pre + "correct"] += float((picked >= mx).sum())
                    out[pre + "n"] += len(ys)
        return out

    def model_objective(self, keys: np.ndarray, rows: np.ndarray) -> dict:
        w = rows[keys < self.F].astype(np.float64)
        return {"w2": float(np.einsum("ij,ij->", w, w))}

    # -- export (harmony model get) -------------------------------------------------
    def export_meta(self) -> dict:
        return {"labels": [float(v) for v in self.labels], "index_base": int(self.index_base)}

    def export(self, keys: np.ndarray, rows: np.ndarray, meta: dict) -> dict:
        """``W`` (classes x features) and ``bias`` (classes): the logits of a
        sample ``x`` are ``W @ x + bias``. Class ``c`` is ``classes[c]`` (the
        input's labels, in increasing order); column ``j`` of ``W`` is the
        input's feature index ``j + index_base``."""
        F = len(rows) - 1
        out = {"W": np.ascontiguousarray(rows[:F].T), "bias": np.array(rows[F])}
        if "labels" in meta:
            lab = np.asarray(meta["labels"], dtype=np.float64)
            out["classes"] = lab.astype(np.int64) if (lab == np.round(lab)).all() else lab
        if "index_base" in meta:
            out["index_base"] = np.int64(meta["index_base"])
        return out

    def metrics(self, s: dict) -> dict:
        n = s.get("n", 0.0)
        loss = s.get("ce", 0.0) / n if n else math.nan
        if n and loss > 2.0 * math.log(self.classes) + 1.0:
            raise AppError(f"objective diverged: training loss {loss:.4g} is far above the "
                           f"all-zero model's {math.log(self.classes):.4g}; lower --lr "
                           f"(now {self.opts.lr if self.opts.lr != 'auto' else self.lr0})")
        out = {"objective": loss + 0.5 * self.opts.l2 * s.get("w2", 0.0),
               "loss": loss,
               "accuracy": s.get("correct", 0.0) / n if n else math.nan}
        if s.get("test_n"):
            out["test_loss"] = s["test_ce"] / s["test_n"]
            out["test_accuracy"] = s["test_correct"] / s["test_n"]
        return out
