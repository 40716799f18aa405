"""Lasso data: a planted sparse linear model, LIBSVM 'target idx:val' lines.

``y = x . w* + noise * N(0, 1)`` with ``w*`` having ``nonzeros`` nonzero
coefficients at random features, of random sign and magnitude uniform in
[1, 3]. Rows are dense standard normal (``nnz >= features``, the default) or
hold ``nnz`` distinct random features with standard normal values. Feature
indices are 1-based unless ``--zero-based``; row 0 always holds the first
and the last feature, so a reader recovers the exact width and index base.
``--truth PATH`` also writes the planted coefficients (``index weight``
lines, same index base).

Rows are generated and written in chunks (memory: one chunk). A wide sparse
design in the style of Bösen's synthetic Lasso data at reduced scale, e.g.
``--samples 50000 --features 100000 --nnz 50 --nonzeros 200``.
"""
from __future__ import annotations

import argparse

import numpy as np

from harmony.datagen import open_out
from harmony.datagen.mlr import _row_features
from harmony.formats.libsvm import format_rows

KIND = "lasso"
HELP = "planted sparse linear model: LIBSVM 'target idx:val ...' lines"


def planted_coefficients(features: int, nonzeros: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(sorted feature ids, weights) of the planted model."""
    rng = np.random.default_rng([seed, 1])
    support = np.sort(rng.choice(features, size=nonzeros, replace=False))
    w = rng.uniform(1.0, 3.0, size=nonzeros) * rng.choice([-1.0, 1.0], size=nonzeros)
    return support, w


def gen_lasso(path: str, samples: int = 1_000, features: int = 100, nonzeros: int = 10,
              noise: float = 0.1, nnz: int | None = None, seed: int = 0,
              zero_based: bool = False, truth: str | None = None,
              chunk_nnz: int = 1_000_000) -> dict:
    """Write ``samples`` LIBSVM rows; returns the shape written."""
    k = features if nnz is None else min(nnz, features)
    if samples < 1 or features < 1 or not (0 <= nonzeros <= features) or noise < 0 or k < 1:
        raise ValueError("need samples, features, nnz >= 1, 0 <= nonzeros <= features, "
                         "noise >= 0")
    support, w_s = planted_coefficients(features, nonzeros, seed)
    w = np.zeros(features)
    w[support] = w_s
    rng = np.random.default_rng([seed, 2])
    chunk = max(1, chunk_nnz // k)
    total = 0
    off = 0 if zero_based else 1
    with open_out(path) as out:
        for start in range(0, samples, chunk):
            n = min(chunk, samples - start)
            ptr, idx = _row_features(rng, n, features, k, start == 0)
            val = rng.standard_normal(len(idx))
            prod = val * w[idx]
            y = np.zeros(n)
            nonempty = np.flatnonzero(np.diff(ptr) > 0)
            if len(nonempty):
                y[nonempty] = np.add.reduceat(prod, ptr[nonempty])
            if noise > 0:
                y += noise * rng.standard_normal(n)
            out.write(format_rows(y, ptr, idx, val, label_fmt="%.10g", value_fmt="%.6g",
                                  index_offset=off))
            total += len(idx)
    if truth:
        with open_out(truth) as fh:
            fh.writelines(f"{j + off} {v!r}\n" for j, v in zip(support.tolist(), w_s.tolist()))
    return {"samples": samples, "features": features, "nonzeros": nonzeros, "nnz": total,
            "noise": noise, "index_base": off}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--samples", type=int, default=1_000)
    p.add_argument("--features", type=int, default=100)
    p.add_argument("--nonzeros", type=int, default=10, help="nonzero planted coefficients")
    p.add_argument("--noise", type=float, default=0.1, help="std. dev. of Gaussian noise")
    p.add_argument("--nnz", type=int, default=None,
                   help="nonzero features per sample (default: dense rows)")
    p.add_argument("--zero-based", action="store_true", help="write 0-based feature indices")
    p.add_argument("--truth", default=None, help="also write the planted coefficients here")


def generate(a: argparse.Namespace) -> dict:
    return gen_lasso(a.out, samples=a.samples, features=a.features, nonzeros=a.nonzeros,
                     noise=a.noise, nnz=a.nnz, seed=a.seed, zero_based=a.zero_based,
                     truth=a.truth)
