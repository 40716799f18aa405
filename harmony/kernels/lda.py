"""LDA kernel (``apps/lda.py``): the batched collapsed Gibbs sweep, compiled
by numba.

It computes what the vectorized numpy sweep did, bit for bit: within a
batch every token is sampled from the counts as they were at the batch's
start (its own assignment taken out), by inverse CDF over the float32
prefix sums of ``(n_dk + alpha)(n_wk + beta) / (n_k + W beta)`` summed in
topic order; then the batch's changes are applied, all additions first and
all subtractions after, as ``np.add.at`` did. What it saves is the numpy
pipeline's gathers into a batch matrix, its transpose into topics x batch
layout and the per-topic-row calls: one pass per token over its two rows.
"""
from __future__ import annotations

import numpy as np

from harmony.kernels import njit


@njit
def gibbs_sweep(td: np.ndarray, tw: np.ndarray, z: np.ndarray, ndka: np.ndarray, bw: np.ndarray,
                inv: np.ndarray, bounds: np.ndarray,
                u_all: np.ndarray, learn: bool, tiny: np.float32, new: np.ndarray) -> None:
    """One sweep over the tokens (document ``td``, word ``tw``, topic ``z``;
    -1 = unassigned) batch by batch (``bounds``), updating ``z``, ``ndka``
    ((docs, K) float32, n_dk + alpha) and, when ``learn``, ``bw`` ((words,
    K) float32, (n_wk + beta) * inv) in place. ``u_all``: one float32
    uniform per token; ``new``: an int64 work array of the largest batch."""
    k = ndka.shape[1]
    one = np.float32(1.0)
    P = np.empty(k, np.float32)
    for bi in range(bounds.shape[0] - 1):
        s, e = bounds[bi], bounds[bi + 1]
        for t in range(s, e):
            d, w, o = td[t], tw[t], z[t]
            acc = np.float32(0.0)
            for j in range(k):
                a = ndka[d, j]
                q = bw[w, j]
                if j == o:
                    a = max(a - one, tiny)
                    if learn:
                        iv = inv[j]
                        q = max((q - iv) / (one - iv), tiny)
                acc += a * q
                P[j] = acc
            u = u_all[t] * acc
            c = 0
            while c < k and P[c] < u:
                c += 1
            new[t - s] = c
        for t in range(s, e):                 # additions first, as np.add.at did
            c = new[t - s]
            if c != z[t]:
                ndka[td[t], c] += one
                if learn:
                    bw[tw[t], c] += inv[c]
        for t in range(s, e):                 # then the subtractions
            c, o = new[t - s], z[t]
            if c != o:
                if o >= 0:
                    ndka[td[t], o] -= one
                    if learn:
                        bw[tw[t], o] -= inv[o]
                z[t] = c
