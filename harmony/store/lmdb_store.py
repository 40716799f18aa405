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

The environment itself (map growth, the hard cap, full disks, lock files,
read leases) is :mod:`harmony.store.lmdb_env`; the stored values' CRC-32
frame and the block codecs are :mod:`harmony.store.framing`; the exceptions
are :mod:`harmony.store.errors`.

Owners and stale state
----------------------
A new owner takes ``flock(OWNER)`` (released by the kernel when
a process dies, so it is never stale itself); if another live process holds
it the open fails with :class:`StoreBusyError`. The spill env and an input
reader's leftover pieces (``parse``) are always deleted on open (they are
scratch; the spill env is recreated); the checkpoint env is kept
and its stale reader slots are cleared (``reader_check``).
:func:`sweep_stale` does the same for every job dir no process owns (for a
worker daemon at start-up).
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import socket
import struct
import threading
import time
from typing import Iterable, Iterator

import lmdb

from harmony.store.blocks import Block, BlockFormatError
from harmony.store.errors import BlockLoadError, StoreBusyError, StoreError
from harmony.store.framing import (_TRAILER, decode_block, decode_view, frame, frame_block,
                                   unframe)
from harmony.store.lmdb_env import DEFAULT_MAP_SIZE, MiB, LmdbEnv, ReadLease
from harmony.store.recycle import ArrayPool
from harmony.util import names

log = logging.getLogger("harmony.store.lmdb")

DEFAULT_TXN_BYTES = 256 * MiB     # put_many splits bigger batches (bounds dirty memory)
_KEY = struct.Struct(">Q")        # big-endian: cursor order == block id order


def _key(block_id: int) -> bytes:
    if block_id < 0:
        raise ValueError(f"block id must be >= 0, got {block_id}")
    return _KEY.pack(block_id)


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
        # arrays of blocks the reader is done with (``recycle``), copied into
        # by later ``get``s instead of new ones (None: always new ones)
        self.pool: ArrayPool | None = ArrayPool()

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
        blk = self._read(block_id, lambda v: decode_block(v, self.verify, self.pool))
        if blk.id != block_id:
            raise BlockLoadError(block_id, self._where(), f"holds block {blk.id} instead")
        return blk

    def recycle(self, block: Block) -> None:
        """The caller is done with ``block`` (from :meth:`get`): its arrays
        that nothing else refers to may back later loads
        (:class:`~harmony.store.recycle.ArrayPool`; they leave the block).
        Nothing is reused where ``pool`` is None."""
        if self.pool is not None:
            self.pool.give(block)

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
