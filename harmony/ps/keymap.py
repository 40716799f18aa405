"""Model keys -> blocks (hashed key ranges) and deterministic keyed randomness.

A key is a non-negative int64 row id. ``mix64`` (the splitmix64 finalizer)
spreads keys uniformly over 64 bits; block ``b`` of ``n`` owns the hash range
``[b·2^64/n, (b+1)·2^64/n)``. Blocks are what the master assigns to server
shards (the owner map) and what later moves between machines.
"""
from __future__ import annotations

import numpy as np

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLD = np.uint64(0x9E3779B97F4A7C15)


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer on a uint64 array (wrapping arithmetic)."""
    z = np.array(x, dtype=np.uint64, copy=True)
    with np.errstate(over="ignore"):
        z ^= z >> np.uint64(30)
        z *= _M1
        z ^= z >> np.uint64(27)
        z *= _M2
        z ^= z >> np.uint64(31)
    return z


def block_of(keys: np.ndarray, num_blocks: int) -> np.ndarray:
    """Block id (int64) of each key: hashed key ranges of equal width."""
    h = mix64(keys)
    h >>= np.uint64(32)
    h *= np.uint64(num_blocks)
    h >>= np.uint64(32)
    return h.view(np.int64)


def keyed_uniform(keys: np.ndarray, dim: int, seed: int, salt: int = 0) -> np.ndarray:
    """Uniform [0, 1) float64 matrix (len(keys), dim) that depends only on
    (key, column, seed, salt): the same row whatever machine creates it."""
    k = np.asarray(keys).astype(np.uint64).reshape(-1, 1)
    with np.errstate(over="ignore"):
        base = mix64(np.uint64(seed) * _GOLD + np.uint64(salt))
        ctr = k * np.uint64(dim) + np.arange(dim, dtype=np.uint64)
        z = mix64(ctr ^ base)
    return (z >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
