"""The C allocator's handling of large buffers, for long-lived servers."""
from __future__ import annotations

import ctypes

#: buffers at least this large are given back to the system when freed
LARGE_BUFFER_BYTES = 256 << 10


def return_large_buffers(threshold: int = LARGE_BUFFER_BYTES) -> None:
    """Buffers of at least ``threshold`` bytes (message frames, a block's
    pieces) mmapped and given back to the system when freed: glibc's
    dynamic threshold would otherwise keep them in the heap after a burst of
    large messages, and the process's memory would stay at the burst's
    peak. No-op off glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, threshold)      # M_MMAP_THRESHOLD (fixed: no longer dynamic)
    except (OSError, AttributeError):
        pass
