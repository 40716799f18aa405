"""This process's memory: the C allocator's handling of large buffers (for
long-lived servers) and of an executor's working memory, giving the freed
heap back, and measuring it (RSS and its anonymous part, once or sampled
for a peak)."""
from __future__ import annotations

import ctypes
import os
import threading

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
    (:func:`trim_heap`: after reading the input, after
    spilling or dropping blocks) still give all free memory back. No-op off
    glibc."""
    _mallopt((_M_MMAP_THRESHOLD, mmap_threshold), (_M_TRIM_THRESHOLD, 2 * mmap_threshold))


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def own_memory() -> tuple[int, int]:
    """(rss, anonymous rss) of this process in bytes, from /proc/self/statm
    (a few microseconds). Anonymous = rss - shared (file-backed and shmem
    pages, e.g. LMDB's map, are page cache the kernel can drop)."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            f = fh.read().split()
        rss, shared = int(f[1]) * _PAGE, int(f[2]) * _PAGE
        return rss, max(0, rss - shared)
    except (OSError, IndexError, ValueError):
        return 0, 0


_libc = None


def _get_libc():
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL("libc.so.6")
        except OSError:
            _libc = False
    return _libc


def trim_heap() -> None:
    """Give freed heap memory back to the OS (glibc ``malloc_trim``, every
    arena; ~0.2 ms). glibc raises its mmap threshold after a large free, so
    the arrays of dropped disk-blocks come from, and stay in, the heap: the
    RSS would not go down without this after a pass. (A fixed low threshold,
    ``M_MMAP_THRESHOLD``, does the same but measured 50% slower NMF epochs:
    its per-batch temporaries then each cost an mmap and page faults.)"""
    libc = _get_libc()
    if libc:
        try:
            libc.malloc_trim(0)
        except AttributeError:
            pass


class MemoryWatch:
    """Samples this process's anonymous memory every ``interval`` seconds in a
    daemon thread and keeps the peak since the last :meth:`take`."""

    def __init__(self, interval: float = 0.02) -> None:
        self.interval = interval
        self._peak = own_memory()[1]
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="harmony-memwatch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> int:
        anon = own_memory()[1]
        with self._lock:
            self._peak = max(self._peak, anon)
        return anon

    def take(self) -> int:
        """The peak since the last call; starts a new window at the current value."""
        now = own_memory()[1]
        with self._lock:
            peak, self._peak = max(self._peak, now), now
        return peak

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=1)
