"""The C allocator's handling of large buffers, for long-lived servers and
for executors."""
from __future__ import annotations

import ctypes

#: buffers at least this large are given back to the system when freed
LARGE_BUFFER_BYTES = 256 << 10

#: glibc's ceiling for its dynamic mmap threshold on 64-bit systems
#: (``DEFAULT_MMAP_THRESHOLD_MAX``): buffers at least this large are always
#: mmapped, and freeing one raises the threshold no further
DYNAMIC_MMAP_MAX = 32 << 20

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def _mallopt(*settings: tuple[int, int]) -> None:
    try:
        libc = ctypes.CDLL("libc.so.6")
        for param, value in settings:
            libc.mallopt(param, value)
    except (OSError, AttributeError):
        pass


def return_large_buffers(threshold: int = LARGE_BUFFER_BYTES) -> None:
    """Buffers of at least ``threshold`` bytes (message frames, a block's
    pieces) mmapped and given back to the system when freed: glibc's
    dynamic threshold would otherwise keep them in the heap after a burst of
    large messages, and the process's memory would stay at the burst's
    peak. No-op off glibc."""
    _mallopt((_M_MMAP_THRESHOLD, threshold))     # fixed: no longer dynamic


def keep_working_memory(mmap_threshold: int = DYNAMIC_MMAP_MAX) -> None:
    """An executor's COMPs reuse their temporaries' memory from one
    iteration to the next instead of taking it from the system again each
    time: buffers under ``mmap_threshold`` come from the heap, and up to
    twice that of free memory at the heap's top stays there when freed
    (where glibc's dynamic thresholds end once a process has freed a buffer
    of ``DYNAMIC_MMAP_MAX``). Left dynamic, where they end depends on the
    process's history: in an executor (its input read in another thread, in
    smaller chunks) the heap's top went back to the system at every COMP's
    end. Measured on NMF ALS (rank 16, 2M ratings): 13 ``brk`` calls and
    11,200 page faults per epoch in its COMPs and objective (44 MB
    zero-filled again), where the plain loop (:func:`harmony.app.run_local`)
    took none after its first epoch (and no ``brk`` or ``mmap`` call); the
    plain loop with its heap trimmed after every COMP took 5% more CPU. With
    this, the executor's epochs take no page fault either. The
    memory kept is at most what the COMPs use anyway (their peak, which the
    block store's accounting counts already), and the explicit trims
    (``harmony.store.local.trim_heap``: after reading the input, after
    spilling or dropping blocks) still give all free memory back. No-op off
    glibc."""
    _mallopt((_M_MMAP_THRESHOLD, mmap_threshold), (_M_TRIM_THRESHOLD, 2 * mmap_threshold))
