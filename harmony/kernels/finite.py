"""The PS shard's check that a push's values are all finite, compiled.

A float is NaN or infinite exactly when its exponent bits are all ones, so
the check reads the values once as unsigned integers of their width and ORs
one comparison per value: no temporary, no floating point, a loop LLVM
vectorizes. Measured on the 2-core VM, 16 MB of float32 just written (in
cache): 0.21-0.24 ms against 0.55-0.59 ms for numpy's float32 sum (the
check :meth:`harmony.ps.table.ShardTable.check_finite` uses otherwise),
and 0.26 ms against 9.8 ms for float16 (whose sum numpy accumulates in
float32 through a buffer); from memory (64 MB) 1.9 ms against 2.8 ms.

Used only where this process already runs numba: loading the compiler
costs a fresh process 0.3-0.5 s of CPU (``python -c`` with a cached
kernel), which a job that never loads an app kernel would pay for a few
hundred microseconds a push. :func:`load` (the executor calls it after its
app's kernels are loaded: ~3 ms more) makes :func:`all_finite` answer;
until then it returns None and the caller uses numpy.
"""
from __future__ import annotations

import numpy as np

from harmony.kernels import njit

#: the exponent bits of an IEEE float of each width (all ones: NaN or inf)
_EXPONENT = {2: np.uint16(0x7C00), 4: np.uint32(0x7F800000),
             8: np.uint64(0x7FF0000000000000)}
_UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}

#: True once :func:`load` ran: :func:`all_finite` uses the compiled loop
loaded = False


@njit
def _any_exponent_full(bits: np.ndarray, mask) -> bool:
    bad = False
    for k in range(bits.size):
        bad |= (bits[k] & mask) == mask
    return bad


def load(dtypes: tuple[str, ...] = ("float32", "float64")) -> None:
    """Compile (or load from numba's cache) the loop for ``dtypes``' widths
    and make :func:`all_finite` use it."""
    global loaded
    for dt in dtypes:
        width = np.dtype(dt).itemsize
        bits = np.zeros(2, dtype=_UINT[width])
        _any_exponent_full(bits, _EXPONENT[width])
        bits.flags.writeable = False    # a received frame's: a type of its own to numba
        _any_exponent_full(bits, _EXPONENT[width])
    loaded = True


def all_finite(values: np.ndarray) -> bool | None:
    """Whether every value of a float or complex array is finite; None where
    the compiled loop does not apply (not loaded, not C-contiguous, not in
    the machine's byte order, another kind or width): the caller checks another way."""
    if not loaded or not values.flags.c_contiguous or not values.dtype.isnative:
        return None
    kind = values.dtype.kind
    width = values.dtype.itemsize // (2 if kind == "c" else 1)
    if kind not in "fc" or width not in _UINT:
        return None
    bits = values.reshape(-1).view(_UINT[width])
    return not _any_exponent_full(bits, _EXPONENT[width])
