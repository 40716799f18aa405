"""One LMDB environment handled as a database (:class:`LmdbEnv`): map growth,
a hard cap, clear errors when the disk is full, the lock file allocated
before LMDB maps it, and read leases for zero-copy views
(:class:`ReadLease`). The job directory that holds a job's environments is
:mod:`harmony.store.lmdb_store`.

LMDB handled as a database
--------------------------
* The map is sparse: ``map_size`` costs address space, not disk. It starts at
  ``map_size`` and, on ``MapFullError``, the transaction is aborted, the map is
  grown (doubled, or more for a large value) and the write is retried. Growing
  needs no live transaction in the process, so every transaction holds a
  shared lock and growth takes it exclusively.
* ``max_map_size`` is a hard cap (a per-job disk quota). Reaching it, or a
  write that the OS refuses for lack of room (``ENOSPC``, ``EDQUOT``, a file
  size limit; LMDB reports a short write as ``EIO``), raises
  :class:`StoreFullError` naming the path, the job, the bytes needed and the
  room left. The failed transaction is aborted by LMDB, so what was committed
  before stays readable.
* ``writemap`` stays off: with a writable map a full disk becomes a SIGBUS
  that kills the process instead of an error. LMDB's lock file is a shared
  writable map all the same: a new one is allocated on disk
  (``posix_fallocate``) before LMDB maps it, so that a full disk is a
  :class:`StoreFullError` at open, not a SIGBUS at the first transaction
  (a daemon writing a checkpoint replica on a full disk died of it).
"""
from __future__ import annotations

import ctypes
import errno
import logging
import mmap
import os
import resource
import shutil
import sys
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator, TypeVar

import lmdb
import numpy as np

from harmony.store import lmdbcheck
from harmony.store.errors import DamagedStoreError, StoreError, StoreFullError

log = logging.getLogger("harmony.store.lmdb")

MiB = 1 << 20
DEFAULT_MAP_SIZE = 1 << 30        # sparse: address space only

T = TypeVar("T")


class ReadLease:
    """A read transaction held while zero-copy views of its values are in
    use: LMDB never reuses a page that a live reader's snapshot can see, so
    the views stay exact however the store is written meanwhile. The views
    themselves point into :class:`LmdbEnv`'s own read-only mapping of the
    data file, not into LMDB's map, so neither a map growth nor closing the
    env can leave them dangling (the worst a view kept past :meth:`end` can
    see is a page LMDB reused: never a crash).

    :meth:`end` ends the transaction only when nothing but the lease refers
    to its arrays (a reference count); otherwise it returns False and is
    called again later (by the owner, at its next release)."""

    def __init__(self, env: "LmdbEnv") -> None:
        self.arrays: list[np.ndarray] = []
        self.ended = True
        self._rw = env._rw
        self._rw.lease()        # no map growth (which aborts txns) until end()
        try:
            self.txn = env.env.begin(buffers=True)
        except BaseException:
            self._rw.unlease()
            raise
        self.ended = False

    def in_use(self) -> bool:
        """Whether anything besides the lease still refers to a view: the
        references counted are the list, the loop variable and the argument."""
        return any(sys.getrefcount(a) > 3 for a in self.arrays)

    def end(self) -> bool:
        """End the transaction unless a view is still in use (then False)."""
        if self.ended:
            return True
        if self.in_use():
            return False
        self.close()
        return True

    def close(self) -> None:
        """End the transaction now, in use or not (at shutdown; a view kept
        after this may later show pages LMDB reused, never unmapped memory)."""
        if self.ended:
            return
        self.arrays.clear()
        self.ended = True
        try:
            self.txn.abort()
        except lmdb.Error:      # the env was closed, which ended it
            pass
        finally:
            self._rw.unlease()

    def __del__(self) -> None:   # dropped unended (e.g. a prefetched block never used)
        self.close()


class _ResizeLock:
    """Shared for transactions, exclusive for ``set_mapsize`` (which needs no
    live transaction in the process: py-lmdb aborts the open ones). Waiting
    resizers block new short readers and writers, not new read *leases*: a
    lease holder (a reload pass) may need another lease before it can let
    its first one go, so a resize waits for a moment without leases (the end
    of a pass), at most ``LEASE_WAIT_S``."""

    LEASE_WAIT_S = 120.0

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._active = 0
        self._leases = 0
        self._resizing = False
        self._waiting = 0

    @contextmanager
    def shared(self) -> Iterator[None]:
        with self._cv:
            while self._resizing or self._waiting:
                self._cv.wait()
            self._active += 1
        try:
            yield
        finally:
            with self._cv:
                self._active -= 1
                if self._active == 0:
                    self._cv.notify_all()

    def lease(self) -> None:
        with self._cv:
            while self._resizing:
                self._cv.wait()
            self._leases += 1

    def unlease(self) -> None:
        with self._cv:
            self._leases -= 1
            if self._leases == 0:
                self._cv.notify_all()

    @contextmanager
    def exclusive(self, leases: bool = True) -> Iterator[None]:
        """``leases``: wait for read leases too (a resize; closing the env
        does not, since views use the env's own map of the file)."""
        deadline = time.monotonic() + self.LEASE_WAIT_S
        with self._cv:
            self._waiting += 1
            try:
                while self._resizing or self._active or (leases and self._leases):
                    left = deadline - time.monotonic()
                    if leases and self._leases and left <= 0:
                        raise StoreError(f"cannot grow the map: {self._leases} zero-copy "
                                         f"block view(s) still in use after "
                                         f"{self.LEASE_WAIT_S:.0f} s")
                    self._cv.wait(left if self._leases and leases else None)
            finally:
                self._waiting -= 1
                if not self._waiting:
                    self._cv.notify_all()
            self._resizing = True
        try:
            yield
        finally:
            with self._cv:
                self._resizing = False
                self._cv.notify_all()


def room_left(path: str) -> int:
    """Bytes a file under ``path`` can still grow by: free disk space, capped by
    this process's file size limit (RLIMIT_FSIZE) minus the data file's size."""
    free = shutil.disk_usage(path).free
    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    if soft != resource.RLIM_INFINITY:
        data = os.path.join(path, "data.mdb")
        size = os.path.getsize(data) if os.path.exists(data) else 0
        free = min(free, max(0, soft - size))
    return free


_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
_FULL_TEXT = ("No space left", "Disk quota", "File too large")


def _mapping_of(addr: int) -> tuple[int, int]:
    """(start, end) of this process's memory mapping that holds ``addr``."""
    with open("/proc/self/maps", "rb") as fh:
        for line in fh:
            lo, _, hi = line.split(b" ", 1)[0].partition(b"-")
            lo, hi = int(lo, 16), int(hi, 16)
            if lo <= addr < hi:
                return lo, hi
    raise StoreError(f"address {addr:#x} is in no mapping of this process")


_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_MADV_DONTNEED = 4
_PAGE = mmap.PAGESIZE


def _drop_pages(addr: int, n: int) -> None:
    """Unmap the whole pages of ``[addr, addr + n)`` from this process (a
    read-only shared file map: they come back from the page cache on the
    next touch)."""
    lo = -(-addr // _PAGE) * _PAGE
    hi = (addr + n) // _PAGE * _PAGE
    if hi > lo:
        _libc.madvise(lo, hi - lo, _MADV_DONTNEED)


#: what a lock file is allocated with (LMDB's for its 126 default reader
#: slots is 8 KiB; it grows a file only when it is smaller than it needs)
LOCK_FILE_BYTES = 64 << 10


def _allocate_lock_file(path: str, job: str) -> None:
    """Give a new env's ``lock.mdb`` its disk blocks before LMDB maps it
    (shared and writable: a page that cannot be allocated is a SIGBUS)."""
    lock = os.path.join(path, "lock.mdb")
    if os.path.exists(lock):
        return
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise StoreError(f"cannot create {lock} (job {job}): {exc}") from exc
    try:
        os.posix_fallocate(fd, 0, LOCK_FILE_BYTES)
    except OSError as exc:
        os.close(fd)
        os.unlink(lock)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            raise StoreFullError(path, job, LOCK_FILE_BYTES, 0,
                                 f"no room for the lock file: {exc.strerror}") from None
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise StoreError(f"cannot allocate {lock} (job {job}): {exc}") from exc
        return          # a file system without fallocate: LMDB's own ftruncate
    os.close(fd)


class LmdbEnv:
    """One LMDB environment with map growth, a hard cap and clear errors.

    Thread-safe: reads may run in several threads; writes are serialized.
    """

    def __init__(self, path: str, *, job: str, sync: bool,
                 map_size: int = DEFAULT_MAP_SIZE, max_map_size: int | None = None,
                 max_dbs: int = 8) -> None:
        if max_map_size is not None and max_map_size < map_size:
            map_size = max_map_size
        self.path, self.job, self.sync = path, job, sync
        self.max_map_size = max_map_size
        os.makedirs(path, exist_ok=True)
        data_path = os.path.join(path, "data.mdb")
        if os.path.exists(data_path) and os.path.getsize(data_path) > 0:
            # checked before LMDB maps it (no SIGBUS); an empty file is a new env
            try:
                lmdbcheck.check_lmdb_file(data_path)
            except lmdbcheck.LmdbFileError as exc:
                raise DamagedStoreError(data_path, job, str(exc)) from None
        _allocate_lock_file(path, job)
        try:
            self.env = lmdb.open(path, map_size=map_size, subdir=True, max_dbs=max_dbs,
                                 sync=sync, metasync=sync, writemap=False, meminit=False,
                                 max_spare_txns=4)
        except lmdb.Error as exc:
            raise StoreError(f"cannot open LMDB env {path} (job {job}): {exc}") from exc
        self._rw = _ResizeLock()
        self._wlock = threading.Lock()
        self._dbs: dict[str, object] = {}
        self.grows = 0   # number of map growths (for tests and logs)
        self.closed = False
        self._fmap: mmap.mmap | None = None     # own read-only map of data.mdb
        self._fmap_lock = threading.Lock()
        self._lmdb_base: tuple[int, int] | None = None   # LMDB's map: (start, end)
        self._fd: int | None = None             # data.mdb, for pread_into

    # -- databases -----------------------------------------------------------
    def db(self, name: str):
        with self._wlock:
            if name not in self._dbs:
                # open_db writes (creates the db) on first use: same retry path
                def _open():
                    return self.env.open_db(name.encode(), create=True)
                self._dbs[name] = self._retry_full(_open, 4096, lambda f: f())
            return self._dbs[name]

    @property
    def map_size(self) -> int:
        return int(self.env.info()["map_size"])

    # -- transactions ----------------------------------------------------------
    def read(self, fn: Callable[[lmdb.Transaction], T]) -> T:
        """Run ``fn(txn)`` in a read txn with ``buffers=True``: values are views
        into the map, valid only inside ``fn``."""
        with self._rw.shared():
            with self.env.begin(buffers=True) as txn:
                return fn(txn)

    def lease(self) -> ReadLease:
        """A read transaction to hold while zero-copy views are in use."""
        return ReadLease(self)

    def _file_offset(self, value: memoryview) -> int:
        """Offset in data.mdb of a value that a read txn returned (call with
        the resize lock or a lease held: LMDB's map moves when it grows). LMDB maps the
        file from offset 0; its start address comes from /proc/self/maps
        (py-lmdb does not expose it), looked up once per map."""
        addr = np.frombuffer(value, np.uint8).ctypes.data
        base = self._lmdb_base
        if base is None or not base[0] <= addr < base[1]:
            base = self._lmdb_base = _mapping_of(addr)
        return addr - base[0]

    def file_view(self, off: int, n: int) -> memoryview:
        """Read-only view of bytes [off, off+n) of data.mdb through this env's
        own mapping (remapped when the file grew past it; an old mapping
        lives on while views of it do)."""
        with self._fmap_lock:
            fm = self._fmap
            if fm is None or off + n > len(fm):
                with open(os.path.join(self.path, "data.mdb"), "rb") as fh:
                    size = os.fstat(fh.fileno()).st_size
                    if off + n > size:
                        raise StoreError(f"{self.path}: value at {off}+{n} lies past the "
                                         f"end of data.mdb ({size} bytes)")
                    fm = self._fmap = mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_READ)
        return memoryview(fm)[off:off + n]

    def extent(self, value: memoryview) -> tuple[int, int]:
        """``(offset in data.mdb, length)`` of a value that a read txn
        returned with ``buffers=True`` (call inside that txn: the pages
        stay put while it lives). py-lmdb has touched every page of the
        value (its ``preload``, so that no page fault is taken with the GIL
        held): they are dropped from this process's page tables again
        (``MADV_DONTNEED`` on LMDB's read-only shared map, which only
        refaults them from the page cache), so that a value found here and
        read with :meth:`pread_into` is not counted in its RSS whole."""
        n = len(value)
        if not n:
            return 0, 0
        addr = np.frombuffer(value, np.uint8).ctypes.data
        off = self._file_offset(value)
        _drop_pages(addr, n)
        return off, n

    def pread_into(self, off: int, buf: memoryview) -> None:
        """Fill ``buf`` with bytes ``[off, off + len(buf))`` of data.mdb,
        read with ``preadv`` rather than through a map: what is read costs
        the page cache, not pages mapped into this process (call inside the
        read txn whose value it is)."""
        with self._fmap_lock:
            if self._fd is None:
                self._fd = os.open(os.path.join(self.path, "data.mdb"), os.O_RDONLY)
            fd = self._fd
        got = 0
        while got < len(buf):
            n = os.preadv(fd, [buf[got:]], off + got)
            if n <= 0:
                raise StoreError(f"{self.path}: data.mdb ends inside a value at "
                                 f"{off + got} (job {self.job})")
            got += n

    def write(self, fn: Callable[[lmdb.Transaction], T], size_hint: int) -> T:
        """Run ``fn(txn)`` in one write txn and commit it, growing the map and
        retrying on ``MapFullError``. ``fn`` must be safe to re-run (it is run
        again from scratch after a growth). ``size_hint``: bytes it writes."""
        def attempt(f):
            with self._rw.shared():
                with self.env.begin(write=True) as txn:   # commit on exit, abort on error
                    return f(txn)
        with self._wlock:
            return self._retry_full(fn, size_hint, attempt)

    def _retry_full(self, fn, size_hint: int, attempt):
        while True:
            try:
                return attempt(fn)
            except lmdb.MapFullError:
                self._grow(size_hint)
            except (lmdb.TxnFullError, lmdb.BadValsizeError) as exc:
                raise StoreError(f"{self.path} (job {self.job}): {exc}") from exc
            except lmdb.Error as exc:
                self._write_failed(exc, size_hint)

    def _grow(self, need: int) -> None:
        cur = self.map_size
        new = max(cur * 2, cur + 2 * need + 4 * MiB)
        new = -(-new // MiB) * MiB
        if self.max_map_size is not None:
            if cur >= self.max_map_size:
                raise StoreFullError(self.path, self.job, need, None,
                                     f"environment reached its cap of {self.max_map_size} bytes")
            new = min(new, self.max_map_size)
        left = room_left(self.path)
        if need > left:
            raise StoreFullError(self.path, self.job, need, left, "not enough disk space")
        with self._rw.exclusive():
            self.env.set_mapsize(new)
            self._lmdb_base = None
        self.grows += 1
        log.info("%s: map grown %d -> %d MiB (job %s)", self.path, cur // MiB, new // MiB,
                 self.job)

    def _write_failed(self, exc: lmdb.Error, need: int) -> None:
        text = str(exc)
        left = room_left(self.path)
        code = exc.args[1] if len(exc.args) > 1 and isinstance(exc.args[1], int) else None
        full = (isinstance(exc, lmdb.DiskError) or code in _FULL_ERRNOS
                or any(t in text for t in _FULL_TEXT)
                # LMDB turns a short write (disk full in mid-write) into EIO
                or ("Input/output error" in text and left < need + 4 * MiB))
        if full:
            raise StoreFullError(self.path, self.job, need, left, f"write refused: {text}") from exc
        raise StoreError(f"{self.path} (job {self.job}): write failed: {text}") from exc

    def sync_now(self) -> None:
        self.env.sync(True)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            with self._rw.exclusive(leases=False):
                self.env.close()
            with self._fmap_lock:
                self._fmap = None   # unmapped when the last view of it goes
                if self._fd is not None:
                    os.close(self._fd)
                    self._fd = None
