"""Compiled inner loops of the bundled apps (``apps/*.py``), and the PS
shard's check of pushed values (:mod:`harmony.kernels.finite`).

The kernels are plain Python functions compiled by numba (``nopython``, one
core, no threads) on their first call and cached on disk beside this package
(``cache=True``), so a fresh process loads them instead of compiling again.
numba is a hard dependency of the package (a manylinux wheel: nothing but
Python and pip is needed to install it). Each kernel does what a vectorized
numpy expression in the app did before, in one pass over the data and with
no temporaries: the apps' math, and so their results, are unchanged up to
float rounding (the summation order of a few reductions differs).
"""
from __future__ import annotations

from typing import Callable

import numba

#: numba.njit options of every kernel: compiled once per machine and kept
#: (NUMBA_CACHE_DIR moves the cache where this package's folder is read-only)
JIT = dict(nogil=True, cache=True)


def njit(fn: Callable) -> Callable:
    """``numba.njit`` with :data:`JIT` (type signatures inferred on first call)."""
    return numba.njit(**JIT)(fn)
