"""LMDB-backed block storage for one job on one machine: spilled input blocks,
spilled model blocks and (through :mod:`harmony.store.checkpoint`) checkpoints.

Layout and the one-environment-per-job decision
-----------------------------------------------
Everything of job ``J`` on a machine lives under ``ROOT/J/``::

    ROOT/J/OWNER    flock'ed by the one process using the directory (pid inside)
    ROOT/J/spill/   LMDB env, sync=False: spilled input blocks ("input" db) and
                    spilled model blocks ("model" db). Scratch: rebuilt from the
                    input (and the latest checkpoint) by every new owner.
    ROOT/J/ckpt/    LMDB env, sync=True: model checkpoints (checkpoint.py).

One environment per *job* (not one per machine), because:

* cleanup is ``rm -rf ROOT/J`` (job finished) or ``rm -rf ROOT/J/spill``
  (executor crashed); nothing has to be deleted key by key inside a shared
  file, whose pages LMDB would keep anyway (LMDB files never shrink);
* isolation: a job that fills its map or the disk gets a ``StoreFullError``
  in its own environment; a full or damaged file of one job can never take
  another job's data with it, and a per-job hard cap (``max_map_size``) is a
  disk quota;
* LMDB allows one write transaction per environment: per-job envs do not
  serialize the spill writes of co-located jobs behind one lock;
* exactly one process (the job's executor) opens the env, which is what LMDB
  wants (an env must not be opened twice in one process) and makes the
  ``OWNER`` lock meaningful.

The cost is one sparse memory map and a few file descriptors per job, and
there are only a handful of jobs per machine.

Spill and checkpoints are *separate* environments because durability is a
per-environment setting: the spill cache runs with ``sync=False`` (fast; after
a crash it is deleted, since it can be rebuilt), while ``MDB_NOSYNC`` lets a
system crash corrupt the whole environment, so checkpoints live in an env
opened with ``sync=True, metasync=True``.

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
* Every stored block carries a CRC-32 trailer, checked on every read; a bad
  or missing block raises :class:`BlockLoadError` naming the block. The CRC
  is zlib's CRC-32 computed by ISA-L (the ``isal`` package: carry-less
  multiply, 60-80 GB/s over data in L2 here, against 3-4 GB/s for
  ``zlib.crc32``; ``zlib.crc32`` gives the same value if ``isal`` is missing).
  Reads copy each array out of the map in chunks of ``_CHUNK`` bytes and run
  the CRC over each chunk right after copying it, while it is in cache, so
  memory is read once: the check costs a fraction of the one copy that any
  reader makes. :meth:`LmdbBlockStore.get_view` copies nothing: the arrays
  are read-only views of the data file through the env's own read-only
  mapping, valid while a :class:`ReadLease` (a read txn) is held; leases
  hold off map growth (py-lmdb aborts open txns when the map grows).
  Checkpoints use SHA-256 in their manifest instead.
* Stale state: a new owner takes ``flock(OWNER)`` (released by the kernel when
  a process dies, so it is never stale itself); if another live process holds
  it the open fails with :class:`StoreBusyError`. The spill env and an input
  reader's leftover pieces (``parse``) are always deleted on open (they are
  scratch; the spill env is recreated); the checkpoint env is kept
  and its stale reader slots are cleared (``reader_check``).
  :func:`sweep_stale` does the same for every job dir no process owns (for a
  worker daemon at start-up).
"""
from __future__ import annotations

import errno
import fcntl
import json
import logging
import math
import mmap
import os
import resource
import shutil
import socket
import struct
import sys
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator, TypeVar

import lmdb
import numpy as np

from harmony.store import lmdbcheck
from harmony.store.blocks import _MAGIC, Block, BlockFormatError, pack_header, parse_header
from harmony.util import names

try:    # the same CRC-32 as zlib's, 20x faster (hardware carry-less multiply)
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - isal is a dependency; same values
    from zlib import crc32

log = logging.getLogger("harmony.store.lmdb")

MiB = 1 << 20
DEFAULT_MAP_SIZE = 1 << 30        # sparse: address space only
DEFAULT_TXN_BYTES = 256 * MiB     # put_many splits bigger batches (bounds dirty memory)
_KEY = struct.Struct(">Q")        # big-endian: cursor order == block id order
_TRAILER = struct.Struct("<4sIQ")  # magic, crc32(payload), len(payload)
_TMAGIC = b"HSC1"
_CHUNK = 512 << 10                # copy + CRC granularity: the chunk stays in L2

T = TypeVar("T")


class StoreError(Exception):
    """An LMDB store failed (other than a full disk or a bad block)."""


class StoreFullError(StoreError):
    """No room: the env reached its hard cap or the disk/file limit is hit."""

    def __init__(self, path: str, job: str, needed: int, available: int | None,
                 reason: str) -> None:
        avail = "unknown" if available is None else f"{available} bytes"
        super().__init__(f"store full: job {job}, {path}: {reason} "
                         f"(needed {needed} bytes, room left {avail})")
        self.path, self.job, self.needed, self.available = path, job, needed, available


class StoreBusyError(StoreError):
    """Another live process owns the job directory."""


class DamagedStoreError(StoreError):
    """An env's data file failed its check before LMDB mapped it (opening it
    would have killed the process with SIGBUS). ``data_path``: the file;
    ``reason``: what is wrong with it."""

    def __init__(self, data_path: str, job: str, reason: str) -> None:
        super().__init__(f"the LMDB file {data_path} (job {job}) is damaged: {reason}")
        self.data_path, self.job, self.reason = data_path, job, reason


class BlockLoadError(StoreError):
    """A block could not be loaded: missing, corrupt, or the read failed."""

    def __init__(self, block_id: int, where: str, reason: str) -> None:
        super().__init__(f"block {block_id} ({where}): {reason}")
        self.block_id, self.where, self.reason = block_id, where, reason


def _key(block_id: int) -> bytes:
    if block_id < 0:
        raise ValueError(f"block id must be >= 0, got {block_id}")
    return _KEY.pack(block_id)


def frame(payload: bytes | memoryview) -> bytes:
    """``payload`` + trailer (magic, CRC-32, length)."""
    return b"".join([payload, _TRAILER.pack(_TMAGIC, crc32(payload), len(payload))])


def _copy_crc(dst: np.ndarray, src: np.ndarray, crc: int | None) -> int | None:
    """``dst[:] = src`` (flat uint8 arrays of one length), continuing ``crc``
    over each chunk of ``dst`` right after copying it, while it is in cache
    (``None``: no CRC)."""
    n = len(src)
    for o in range(0, n, _CHUNK):
        d = dst[o:o + _CHUNK]
        d[:] = src[o:o + _CHUNK]
        if crc is not None:
            crc = crc32(d, crc)
    return crc


_scratch = threading.local()


def frame_block(block: Block) -> memoryview:
    """``frame(export_block(block))`` in one pass, into a per-thread scratch
    buffer that is reused (no fresh allocation, hence no page faults, per
    block; the CRC runs over each chunk just written, still in cache). The view is
    valid until the same thread frames the next block: hand it to ``txn.put``
    (which copies) at once. Byte-identical to ``frame(export_block(block))``
    (a test checks it); ``export_block_into`` in blocks.py would be its home."""
    arrays = []
    meta = []
    for name, arr in block.arrays.items():
        arr = np.ascontiguousarray(arr)          # as export_block (0-d becomes 1-d)
        arrays.append(arr)
        meta.append([name, arr.dtype.str, list(arr.shape), arr.nbytes])
    head = pack_header(block.id, meta)
    n = 8 + len(head) + sum(a.nbytes for a in arrays)
    buf = getattr(_scratch, "buf", None)
    if buf is None or len(buf) < n + _TRAILER.size:
        buf = _scratch.buf = bytearray(max(n + _TRAILER.size, 2 * len(buf or b"")))
    mv = memoryview(buf)
    mv[0:4] = _MAGIC
    struct.pack_into("<I", buf, 4, len(head))
    mv[8:8 + len(head)] = head
    off = 8 + len(head)
    crc = crc32(mv[:off])
    for arr in arrays:
        if arr.nbytes:
            crc = _copy_crc(np.frombuffer(buf, np.uint8, arr.nbytes, off),
                            arr.reshape(-1).view(np.uint8), crc)
            off += arr.nbytes
    _TRAILER.pack_into(buf, n, _TMAGIC, crc, n)
    return mv[:n + _TRAILER.size]


def release_scratch() -> None:
    """Free this thread's :func:`frame_block` buffer (it is as large as the
    largest block framed so far, up to twice that). Call it after a burst of
    writes where memory is short, e.g. after spilling blocks."""
    _scratch.buf = None


def _split_trailer(value: bytes | memoryview) -> tuple[memoryview, int]:
    """(payload, stored CRC) of a framed value; ``ValueError`` if damaged."""
    mv = memoryview(value)
    if len(mv) < _TRAILER.size:
        raise ValueError(f"truncated value ({len(mv)} bytes)")
    magic, crc, n = _TRAILER.unpack(mv[len(mv) - _TRAILER.size:])
    if magic != _TMAGIC:
        raise ValueError("bad trailer (truncated or overwritten value)")
    if n != len(mv) - _TRAILER.size:
        raise ValueError(f"length mismatch: trailer says {n} bytes, "
                         f"value holds {len(mv) - _TRAILER.size}")
    return mv[:n], crc


def _arrays(payload: memoryview, meta: list, off: int, make) -> dict[str, np.ndarray]:
    """Walk a block's arrays from ``off``: check each against the payload
    and its shape and dtype, build it with ``make(dtype, shape, off,
    nbytes)``; a damaged header becomes a ``BlockFormatError``."""
    arrays = {}
    try:
        for name, dtype, shape, nbytes in meta:
            if off + nbytes > len(payload):
                raise BlockFormatError(f"truncated block data for array {name!r}")
            dt = np.dtype(dtype)
            count = math.prod(shape)
            if count * dt.itemsize != nbytes:
                raise BlockFormatError(f"array {name!r}: {nbytes} bytes stored, "
                                       f"{count * dt.itemsize} for its shape and dtype")
            arrays[name] = make(dt, shape, off, nbytes)
            off += nbytes
    except BlockFormatError:
        raise
    except Exception as exc:         # e.g. a damaged dtype or shape in the header
        raise BlockFormatError(f"corrupt block header: {exc.__class__.__name__}: {exc}") from None
    if off != len(payload):
        raise BlockFormatError("trailing bytes after block data")
    return arrays


def decode_block(value: bytes | memoryview, verify: bool = True) -> Block:
    """Check the trailer of a stored block and import it: each array is
    copied out of the map (the one copy) in chunks, and the CRC runs over
    each chunk right after it is copied, while it is in cache, so the map is
    read once and the check costs a CRC of cache-hot data. Raises
    ``ValueError``/``BlockFormatError`` with the reason if damaged."""
    payload, stored = _split_trailer(value)
    bid, meta, off = parse_header(payload)
    crc = crc32(payload[:off]) if verify else None
    src = np.frombuffer(payload, np.uint8)

    def make(dt, shape, at, nbytes):
        nonlocal crc
        arr = np.empty(shape, dtype=dt)
        if nbytes:
            crc = _copy_crc(arr.reshape(-1).view(np.uint8), src[at:at + nbytes], crc)
        return arr
    arrays = _arrays(payload, meta, off, make)
    if crc is not None and crc != stored:
        raise ValueError("checksum mismatch (CRC-32): corrupt data")
    return Block(bid, arrays)


def unframe(value: bytes | memoryview) -> memoryview:
    """Check the trailer of a stored value; return the payload (a view).
    Raises ``ValueError`` with the reason if the value is damaged."""
    payload, stored = _split_trailer(value)
    if crc32(payload) != stored:
        raise ValueError("checksum mismatch (CRC-32): corrupt data")
    return payload


def decode_view(payload_and_trailer: memoryview, verify: bool = True,
                keep: list | None = None) -> Block:
    """Check a stored block and import it **without copying**: each array is
    a read-only view of ``payload_and_trailer`` (the caller keeps what it
    views valid). The CRC runs over the whole payload, so with ``verify``
    every page is read (and faulted in) here, not in the app. An array that
    is not aligned for its dtype (not expected: ``pack_header`` aligns the
    first one) is copied, read-only too. The views are appended to
    ``keep``. Raises ``ValueError``/``BlockFormatError`` if damaged."""
    payload, stored = _split_trailer(payload_and_trailer)
    bid, meta, off = parse_header(payload)
    addr = np.frombuffer(payload, np.uint8).ctypes.data if len(payload) else 0

    def make(dt, shape, at, nbytes):
        if not nbytes:
            arr = np.empty(shape, dt)
        else:
            # one array over the buffer (no reshape on top): views the app
            # takes then have this array as their base, which is what
            # ReadLease.in_use counts
            arr = np.ndarray(shape, dt, buffer=payload, offset=at)
            if (addr + at) % dt.alignment:
                arr = arr.copy()
            elif keep is not None:
                keep.append(arr)
        arr.flags.writeable = False
        return arr
    arrays = _arrays(payload, meta, off, make)
    if verify and crc32(payload) != stored:
        raise ValueError("checksum mismatch (CRC-32): corrupt data")
    return Block(bid, arrays)


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


class LmdbBlockStore:
    """Blocks in one named database of an :class:`LmdbEnv`; the same interface
    as :class:`harmony.store.blocks.BlockStore` where it makes sense.

    Values are ``export_block(block)`` plus a CRC-32 trailer; ``get`` checks it
    and raises :class:`BlockLoadError` (naming the block) if the block is
    missing or damaged. Thread-safe.
    """

    def __init__(self, env: LmdbEnv, name: str, txn_bytes: int = DEFAULT_TXN_BYTES,
                 verify: bool = True) -> None:
        self.env, self.name = env, name
        self.txn_bytes, self.verify = txn_bytes, verify
        self._db = env.db(name)

    def _where(self) -> str:
        return f"job {self.env.job}, {self.env.path} [{self.name}]"

    # -- write -------------------------------------------------------------------
    def put(self, block: Block) -> int:
        """Store (or replace) a block; returns the bytes stored."""
        key = _key(block.id)
        size = 8 + block.nbytes

        def fn(txn):
            value = frame_block(block)
            txn.put(key, value, db=self._db)
            return len(value)
        return self.env.write(fn, size)

    def put_bytes(self, block_id: int, payload: bytes | memoryview) -> int:
        key, value = _key(block_id), frame(payload)
        self.env.write(lambda txn: txn.put(key, value, db=self._db), len(value))
        return len(value)

    def put_many(self, blocks: Iterable[Block]) -> int:
        """Store many blocks in as few transactions as possible (each at most
        ``txn_bytes``, so the txn's dirty pages stay bounded)."""
        total = 0
        batch: list[Block] = []
        size = 0

        def flush() -> int:
            items = list(batch)

            def fn(txn):
                n = 0
                for blk in items:
                    value = frame_block(blk)
                    txn.put(_key(blk.id), value, db=self._db)
                    n += len(value)
                return n
            return self.env.write(fn, size)

        for blk in blocks:
            _key(blk.id)
            batch.append(blk)
            size += blk.nbytes + 4096
            if size >= self.txn_bytes:
                total += flush()
                batch, size = [], 0
        if batch:
            total += flush()
        return total

    def remove(self, block_id: int) -> None:
        key = _key(block_id)
        found = self.env.write(lambda txn: txn.delete(key, db=self._db), 0)
        if not found:
            raise KeyError(f"block {block_id} is not in {self._where()}")

    def discard(self, block_id: int) -> bool:
        key = _key(block_id)
        return bool(self.env.write(lambda txn: txn.delete(key, db=self._db), 0))

    def clear(self) -> None:
        self.env.write(lambda txn: txn.drop(self._db, delete=False), 0)

    # -- read ----------------------------------------------------------------------
    def _read(self, block_id: int, decode):
        """Look a value up and decode it; every failure is a BlockLoadError
        naming the block."""
        key = _key(block_id)

        def load(txn):
            value = txn.get(key, db=self._db)
            if value is None:
                raise BlockLoadError(block_id, self._where(), "not in store")
            try:
                return decode(value)
            except (ValueError, BlockFormatError) as exc:
                raise BlockLoadError(block_id, self._where(), str(exc)) from None
        try:
            return self.env.read(load)
        except lmdb.Error as exc:
            raise BlockLoadError(block_id, self._where(), f"LMDB read failed: {exc}") from exc

    def get(self, block_id: int) -> Block:
        """Load a block (one copy: from the map straight into its arrays)."""
        blk = self._read(block_id, lambda v: decode_block(v, self.verify))
        if blk.id != block_id:
            raise BlockLoadError(block_id, self._where(), f"holds block {blk.id} instead")
        return blk

    def get_view(self, block_id: int) -> tuple[Block, ReadLease]:
        """Load a block without copying it: its arrays are read-only views of
        the stored bytes, valid while the returned lease is held (end it with
        ``lease.end()`` once the block is dropped). The CRC is checked (with
        ``verify``) before the block is returned."""
        key = _key(block_id)
        try:
            lease = self.env.lease()
        except lmdb.Error as exc:
            raise BlockLoadError(block_id, self._where(), f"LMDB read failed: {exc}") from exc
        try:
            value = lease.txn.get(key, db=self._db)   # the lease holds off map growth
            if value is None:
                raise BlockLoadError(block_id, self._where(), "not in store")
            off, n = self.env._file_offset(value), len(value)
            blk = decode_view(self.env.file_view(off, n), self.verify, lease.arrays)
        except BlockLoadError:
            lease.end()
            raise
        except (ValueError, BlockFormatError, StoreError) as exc:
            lease.arrays.clear()
            lease.end()
            raise BlockLoadError(block_id, self._where(), str(exc)) from None
        except lmdb.Error as exc:
            lease.arrays.clear()
            lease.end()
            raise BlockLoadError(block_id, self._where(), f"LMDB read failed: {exc}") from exc
        if blk.id != block_id:
            lease.arrays.clear()
            lease.end()
            raise BlockLoadError(block_id, self._where(), f"holds block {blk.id} instead")
        return blk, lease

    def get_bytes(self, block_id: int) -> bytes:
        """The checked payload (``export_block`` bytes) of a block, as a copy."""
        return self._read(block_id, lambda v: bytes(unframe(v)))

    def ids(self) -> list[int]:
        def scan(txn):
            return [_KEY.unpack(bytes(k))[0]
                    for k in txn.cursor(db=self._db).iternext(keys=True, values=False)]
        return self.env.read(scan)

    def __contains__(self, block_id: int) -> bool:
        key = _key(block_id)
        return self.env.read(lambda txn: txn.get(key, db=self._db) is not None)

    def size(self, block_id: int) -> int:
        """Stored payload bytes of a block."""
        key = _key(block_id)

        def n(txn):
            v = txn.get(key, db=self._db)
            if v is None:
                raise KeyError(f"block {block_id} is not in {self._where()}")
            return len(v) - _TRAILER.size
        return self.env.read(n)

    def total_bytes(self) -> int:
        def scan(txn):
            return sum(len(v) - _TRAILER.size for _, v in txn.cursor(db=self._db))
        return self.env.read(scan)

    def __len__(self) -> int:
        return int(self.env.read(lambda txn: txn.stat(self._db)["entries"]))

    def __iter__(self) -> Iterator[Block]:
        for bid in self.ids():
            yield self.get(bid)


# ---------------------------------------------------------------------------
# The job directory: owner lock, spill env, checkpoint env


def _check_job(job: str) -> str:
    try:
        return names.check(job, "job id for a store directory")
    except names.BadName as exc:
        raise ValueError(str(exc)) from None


def _try_lock(path: str) -> int | None:
    """flock ``path`` (created if missing); None if another process holds it.
    Guards against the lock-file-was-replaced race by comparing inodes."""
    while True:
        os.makedirs(os.path.dirname(path), exist_ok=True)   # a sweeper may have removed it
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)   # the file was removed/replaced under us: lock the new one


def _read_owner(path: str) -> dict:
    try:
        with open(path) as fh:
            text = fh.read().strip()
        return json.loads(text) if text else {}
    except (OSError, ValueError):
        return {}


class JobStorage:
    """The on-disk storage of one job on one machine (see the module doc).

    ``input`` and ``model`` are :class:`LmdbBlockStore` s in the spill env;
    ``checkpoints`` is a :class:`harmony.store.checkpoint.CheckpointStore`.
    """

    def __init__(self, root: str, job: str, *, map_size: int = DEFAULT_MAP_SIZE,
                 max_map_size: int | None = None, ckpt_map_size: int = DEFAULT_MAP_SIZE,
                 ckpt_max_map_size: int | None = None, lock_wait_s: float = 2.0) -> None:
        self.job = _check_job(job)
        self.dir = os.path.join(root, job)
        os.makedirs(self.dir, exist_ok=True)
        self._owner_path = os.path.join(self.dir, "OWNER")
        deadline = time.monotonic() + lock_wait_s
        while True:
            fd = _try_lock(self._owner_path)
            if fd is not None:
                break
            if time.monotonic() >= deadline:
                who = _read_owner(self._owner_path)
                raise StoreBusyError(f"{self.dir} (job {job}) is in use by pid "
                                     f"{who.get('pid', '?')} on {who.get('host', '?')}")
            time.sleep(0.05)
        self._lock_fd = fd
        prev = _read_owner(self._owner_path)
        #: the previous owner did not close cleanly (crashed or was killed)
        self.recovered = bool(prev)
        if prev:
            log.warning("%s: previous owner pid %s did not close; discarding its spill cache",
                        self.dir, prev.get("pid"))
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                  "since": time.time()}).encode(), 0)
        self.spill_path = os.path.join(self.dir, "spill")
        self.ckpt_path = os.path.join(self.dir, "ckpt")
        #: where an input reader's pieces go while it reads (formats.pieces)
        self.parse_path = os.path.join(self.dir, "parse")
        shutil.rmtree(self.spill_path, ignore_errors=True)   # scratch: always rebuilt
        # a reader that crashed or was killed left its pieces: scratch too
        shutil.rmtree(self.parse_path, ignore_errors=True)
        self._ckpt_opts = dict(map_size=ckpt_map_size, max_map_size=ckpt_max_map_size)
        self._ckpt = None
        self._ckpt_lock = threading.Lock()
        try:
            self.spill_env = LmdbEnv(self.spill_path, job=job, sync=False, map_size=map_size,
                                     max_map_size=max_map_size)
            self.input = LmdbBlockStore(self.spill_env, "input")
            self.model = LmdbBlockStore(self.spill_env, "model")
        except BaseException:
            self._release()
            raise
        self.closed = False

    @property
    def checkpoints(self):
        """The job's checkpoint store (opened on first use; kept across runs)."""
        with self._ckpt_lock:
            if self._ckpt is None:
                from harmony.store.checkpoint import CheckpointStore
                env = LmdbEnv(self.ckpt_path, job=self.job, sync=True, **self._ckpt_opts)
                try:
                    env.env.reader_check()   # stale reader slots of a dead process
                except lmdb.Error:
                    pass
                self._ckpt = CheckpointStore(env)
            return self._ckpt

    def has_checkpoints(self) -> bool:
        return os.path.exists(os.path.join(self.ckpt_path, "data.mdb"))

    def _release(self) -> None:
        if self._lock_fd is not None:
            os.ftruncate(self._lock_fd, 0)   # empty OWNER = closed cleanly
            os.close(self._lock_fd)           # releases the flock
            self._lock_fd = None

    def close(self) -> None:
        """Close both envs, delete the spill cache, release ownership.
        Checkpoints stay on disk."""
        if self.closed:
            return
        self.closed = True
        try:
            self.spill_env.close()
            if self._ckpt is not None:
                self._ckpt.close()
            shutil.rmtree(self.spill_path, ignore_errors=True)
        finally:
            self._release()

    def destroy(self) -> None:
        """The job is over here: close and delete the whole job directory."""
        self.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "JobStorage":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def sweep_stale(root: str) -> list[str]:
    """Delete the spill caches of job directories under ``root`` that no live
    process owns (left by crashed executors); keep their checkpoints. A job
    directory with no checkpoint is removed entirely. Returns the job dirs
    cleaned. Safe to run while executors are using other job dirs."""
    cleaned = []
    try:
        entries = sorted(os.listdir(root))
    except FileNotFoundError:
        return cleaned
    for name in entries:
        d = os.path.join(root, name)
        owner = os.path.join(d, "OWNER")
        if not (names.NAME_RE.fullmatch(name) and os.path.isfile(owner)):
            continue
        fd = _try_lock(owner)
        if fd is None:
            continue   # a live process owns it
        try:
            if os.path.exists(os.path.join(d, "spill")) or _read_owner(owner):
                shutil.rmtree(os.path.join(d, "spill"), ignore_errors=True)
                os.ftruncate(fd, 0)
                cleaned.append(d)
            if not os.path.exists(os.path.join(d, "ckpt", "data.mdb")):
                shutil.rmtree(d, ignore_errors=True)
                if d not in cleaned:
                    cleaned.append(d)
        finally:
            os.close(fd)
    return cleaned
