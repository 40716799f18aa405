"""MLR data: samples labelled by a planted softmax model, LIBSVM lines.

Each sample has ``nnz`` distinct random features with values uniform in
(0, 1] (all features, i.e. dense rows, when ``nnz >= features``). Its label
is ``argmax_c (x W*)_c + noise * Gumbel``, i.e. a draw from the planted
softmax model ``W*`` at temperature ``noise`` (0: noiseless). ``W* = A B``
has rank ``min(classes, 32)``, with ``A`` (features x rank) and ``B`` (rank x
classes) standard normal, and is scaled so that the logits have standard
deviation ``separation``. Labels are ``0 .. classes-1``; feature indices are
1-based unless ``--zero-based``. Row 0 always holds the first and the last
feature, so a reader recovers the exact width and index base.

Rows are generated and written in chunks (memory: the planted factor ``A``,
``features x 32`` floats, plus one chunk). Bösen's MLR data set in the
Cruise evaluation (100K samples, 160K features, 4K classes) at a fraction
``s``: ``--bosen-scale s`` (e.g. 0.1: 10K samples, 16K features, 400
classes).
"""
from __future__ import annotations

import argparse

import numpy as np

from harmony.datagen import open_out
from harmony.formats.libsvm import format_rows

KIND = "mlr"
HELP = "planted softmax classes: LIBSVM 'label idx:val ...' lines (sparse or dense)"

BOSEN = {"samples": 100_000, "features": 160_000, "classes": 4_000}


def _row_features(rng, rows: int, features: int, nnz: int, first_row: bool):
    """CSR pattern of ``rows`` rows with up to ``nnz`` distinct features each."""
    if nnz >= features:
        idx = np.tile(np.arange(features, dtype=np.int64), rows)
        ptr = np.arange(rows + 1, dtype=np.int64) * features
        return ptr, idx
    cand = np.sort(rng.integers(0, features, size=(rows, nnz)), axis=1)
    if first_row:
        cand[0, 0], cand[0, -1] = 0, features - 1
        cand[0] = np.sort(cand[0])
    keep = np.ones_like(cand, dtype=bool)
    keep[:, 1:] = cand[:, 1:] != cand[:, :-1]          # drop repeats within a row
    ptr = np.zeros(rows + 1, dtype=np.int64)
    np.cumsum(keep.sum(axis=1), out=ptr[1:])
    return ptr, cand[keep]


def gen_mlr(path: str, samples: int = 10_000, features: int = 1_000, classes: int = 10,
            nnz: int = 20, noise: float = 1.0, separation: float = 3.0, seed: int = 0,
            zero_based: bool = False, chunk_nnz: int = 1_000_000) -> dict:
    """Write ``samples`` LIBSVM rows; returns the shape written."""
    if samples < 1 or features < 1 or classes < 2 or nnz < 1 or noise < 0 or separation <= 0:
        raise ValueError("need samples, features, nnz >= 1, classes >= 2, noise >= 0, "
                         "separation > 0")
    rng = np.random.default_rng(seed)
    r = min(classes, 32)
    A = rng.standard_normal((features, r), dtype=np.float32)
    B = rng.standard_normal((r, classes), dtype=np.float32) / np.float32(np.sqrt(r))
    k = min(nnz, features)
    scale = np.float32(separation / np.sqrt(k / 3.0))  # E[x^2] = 1/3 for U(0, 1]
    chunk = max(1, chunk_nnz // k)
    total = 0
    counts = np.zeros(classes, dtype=np.int64)
    with open_out(path) as out:
        for start in range(0, samples, chunk):
            n = min(chunk, samples - start)
            ptr, idx = _row_features(rng, n, features, k, start == 0)
            val = (1.0 - rng.random(len(idx))).astype(np.float32)     # (0, 1]
            H = np.zeros((n, r), dtype=np.float32)
            _segment_sum(H, ptr, val[:, None] * A[idx])
            logits = (H @ B) * scale
            if noise > 0:
                logits += np.float32(noise) * rng.gumbel(size=logits.shape).astype(np.float32)
            y = logits.argmax(axis=1)
            counts += np.bincount(y, minlength=classes)
            out.write(format_rows(y.astype(np.float64), ptr, idx, val.astype(np.float64),
                                  label_fmt="%d", value_fmt="%.4g",
                                  index_offset=0 if zero_based else 1))
            total += len(idx)
    return {"samples": samples, "features": features, "classes": classes, "nnz": total,
            "index_base": 0 if zero_based else 1, "labels_used": int((counts > 0).sum())}


def _segment_sum(out: np.ndarray, ptr: np.ndarray, vals: np.ndarray) -> None:
    """out[i] = sum of vals[ptr[i]:ptr[i+1]] (rows may be empty)."""
    nonempty = np.flatnonzero(np.diff(ptr) > 0)
    if len(nonempty):
        out[nonempty] = np.add.reduceat(vals, ptr[nonempty], axis=0)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--samples", type=int, default=10_000)
    p.add_argument("--features", type=int, default=1_000)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--nnz", type=int, default=20,
                   help="nonzero features per sample (>= features: dense rows)")
    p.add_argument("--noise", type=float, default=1.0,
                   help="softmax temperature of the label draw (0: argmax)")
    p.add_argument("--separation", type=float, default=3.0, help="std. dev. of the logits")
    p.add_argument("--zero-based", action="store_true", help="write 0-based feature indices")
    p.add_argument("--bosen-scale", type=float, default=None,
                   help="Bösen's MLR shape (100K samples, 160K features, 4K classes) times "
                        "this factor; overrides --samples/--features/--classes")


def generate(a: argparse.Namespace) -> dict:
    samples, features, classes = a.samples, a.features, a.classes
    if a.bosen_scale is not None:
        if a.bosen_scale <= 0:
            raise ValueError("--bosen-scale must be > 0")
        samples = max(1, round(BOSEN["samples"] * a.bosen_scale))
        features = max(1, round(BOSEN["features"] * a.bosen_scale))
        classes = max(2, round(BOSEN["classes"] * a.bosen_scale))
    return gen_mlr(a.out, samples=samples, features=features, classes=classes, nnz=a.nnz,
                   noise=a.noise, separation=a.separation, seed=a.seed, zero_based=a.zero_based)
