"""Transfers held on disk until their end: the receiving side of replicas
and staged chunks at a worker's data service.

A transfer (``blk`` messages of one ``mid``, closed by ``blk_end``) is kept
until its closing message names where its payloads go. Kept in memory, a
key holder could make the receiver hold its whole budget by never sending
that message. Here every chunk is written, as it arrives, at its place in
one *spool file* per transfer (``ROOT/t<n>``; the transfer id comes from the
peer and is never part of a path): the first chunk of a payload reserves the
payload's whole size at the file's end (``posix_fallocate``, so a full disk
is a clear refusal at once, not a short write later), and every chunk is
checked (its CRC-32, its place, the size its header gave) before it is
written. What stays in memory is an index: per open transfer, the place
and size of each payload. Payloads are opaque bytes only (a data service
takes exported blocks, not arrays).

Bounds, all refused with a :class:`~harmony.store.transfer.TransferError`
(the receiver answers it, and drops the transfer with its file):

* memory: every open transfer costs ``TRANSFER_COST`` and every payload
  ``ENTRY_COST`` (more than their index entries take), plus the length of
  the transfer id and section name they keep, of ``max_held`` bytes
  (64 MiB: some 250,000 payloads; one checkpoint part has at most 2 x
  65,536 blocks). No payload byte is held between messages.
* disk: all spool files together at most ``share`` (half) of what the disk
  would have free without them: what is spooled becomes a part or staged
  chunks of the same size at its end, which need that room. (Each range
  of the file is punched out, ``FALLOC_FL_PUNCH_HOLE``, once the store has
  committed it: a transfer takes its size on disk once, plus one write
  batch, while it is copied.) A cap per transfer would bound nothing more,
  since any key holder may open as many transfers as it likes.
* time: a transfer with no chunk for ``idle_s`` is dropped by
  :meth:`Spool.expire` and its file deleted.

A spool directory is this process's alone: what a previous run left there
(a daemon killed mid-transfer) is deleted when a :class:`Spool` opens it.
"""
from __future__ import annotations

import ctypes
import errno
import os
import shutil
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Callable

from harmony.comm import messages as M
from harmony.store.transfer import IDLE_S, TransferError, _check_head, chunk_digest

MiB = 1 << 20
#: the Python bytes the index may take, all transfers together
MAX_HELD_BYTES = 64 * MiB
#: what one open transfer and one payload are charged against it (their
#: records, dict slots and keys take less: tests/test_spool.py measures it)
TRANSFER_COST = 4096
ENTRY_COST = 256
#: the share of the disk's free space (spool files included) they may take
SPOOL_SHARE = 0.5
_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_FALLOC_FL_KEEP_SIZE, _FALLOC_FL_PUNCH_HOLE = 1, 2
_libc = ctypes.CDLL(None, use_errno=True)
_fallocate = getattr(_libc, "fallocate64", None) or getattr(_libc, "fallocate", None)
if _fallocate is not None:
    _fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    _fallocate.restype = ctypes.c_int


def punch_hole(fd: int, off: int, n: int) -> bool:
    """Free the disk blocks of ``[off, off + n)`` of a file (its size stays;
    the range reads as zeros). False where the file system cannot."""
    if _fallocate is None or n <= 0:
        return False
    if _fallocate(fd, _FALLOC_FL_KEEP_SIZE | _FALLOC_FL_PUNCH_HOLE, off, n) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
        return False
    raise OSError(err, os.strerror(err))


@dataclass
class _Open:
    """A payload being received: its region of the spool file."""
    start: int
    size: int
    got: int = 0


@dataclass
class _Transfer:
    path: str
    touched: float
    end: int = 0                                    # bytes reserved in the file
    charged: int = 0                                # its part of Spool.held
    done: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)
    open: dict[tuple[str, int], _Open] = field(default_factory=dict)


class SpoolRange:
    """One payload in a spool file, as a :class:`~harmony.store.pieces.Source`:
    read a range at a time; a range released (stored for good elsewhere)
    is punched out of the file."""

    def __init__(self, spooled: "Spooled", key: tuple[str, int]) -> None:
        self.spooled, self.key = spooled, key
        self.start, self.size = spooled.index[key]

    def read(self, off: int, n: int) -> bytearray:
        if off < 0 or n < 0 or off + n > self.size:
            raise ValueError(f"{self.key}: read of {n} at {off} outside its {self.size} bytes")
        return self.spooled.read(self.key, self.start + off, n)

    def release(self, off: int, n: int) -> None:
        self.spooled.punch(self.start + off, n)


class Spooled(Mapping):
    """A closed transfer's payloads, ``(sec, bid) -> bytes``, each read
    from the spool file when it is asked for (:meth:`source`: as ranges).
    Use as a context manager (or call :meth:`close`): the file is deleted
    on exit."""

    def __init__(self, path: str | None, index: dict[tuple[str, int], tuple[int, int]]) -> None:
        self.path, self.index = path, index
        self._fd = os.open(path, os.O_RDWR) if path else None
        self._punch = True
        self.punched = 0            # bytes punched out of the file

    def read(self, key: tuple[str, int], at: int, n: int) -> bytearray:
        out = bytearray(n)
        mv, got = memoryview(out), 0
        while got < n:              # one read returns at most ~2 GiB
            k = os.preadv(self._fd, [mv[got:]], at + got)
            if k <= 0:
                raise TransferError(f"spool file {self.path}: {key[0]} block {key[1]} cut "
                                    f"short")
            got += k
        return out

    def punch(self, at: int, n: int) -> None:
        if self._punch and self._fd is not None:
            self._punch = punch_hole(self._fd, at, n)
            self.punched += n if self._punch else 0

    def source(self, key: tuple[str, int]) -> SpoolRange:
        """Payload ``key`` as a source read range by range."""
        return SpoolRange(self, key)

    def __getitem__(self, key: tuple[str, int]) -> bytes:
        start, size = self.index[key]
        return bytes(self.read(key, start, size))

    def __iter__(self) -> Iterator[tuple[str, int]]:
        return iter(self.index)

    def __len__(self) -> int:
        return len(self.index)

    def section(self, sec: str) -> "_Section":
        """The payloads of one section, ``bid -> SpoolRange``."""
        return _Section(self, sec)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self.path:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass

    def __enter__(self) -> "Spooled":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Section(Mapping):
    def __init__(self, spooled: Spooled, sec: str) -> None:
        self.spooled, self.sec = spooled, sec
        self.bids = sorted(b for s, b in spooled.index if s == sec)

    def __getitem__(self, bid: int) -> SpoolRange:
        return self.spooled.source((self.sec, bid))

    def __iter__(self) -> Iterator[int]:
        return iter(self.bids)

    def __len__(self) -> int:
        return len(self.bids)


class Spool:
    """Chunks of opaque payloads in, written to disk as they arrive; whole
    transfers out at their end (:meth:`take`). See the module's docstring
    for its bounds. ``free_bytes(root)``: the disk's free bytes (a test's
    stand-in for ``shutil.disk_usage``)."""

    def __init__(self, root: str, *, max_held: int = MAX_HELD_BYTES,
                 share: float = SPOOL_SHARE, idle_s: float = IDLE_S,
                 free_bytes: Callable[[str], int] | None = None) -> None:
        self.root, self.max_held, self.share, self.idle_s = root, max_held, share, idle_s
        self._free = free_bytes or (lambda p: shutil.disk_usage(p).free)
        shutil.rmtree(root, ignore_errors=True)        # a previous run's
        os.makedirs(root, exist_ok=True)
        self.transfers: dict[str, _Transfer] = {}
        self.held = 0                 # bytes charged against max_held
        self.spooled = 0              # bytes reserved in spool files
        self._n = 0

    # -- receiving ---------------------------------------------------------------------
    def _charge(self, mid: str, n: int) -> None:
        if self.held + n > self.max_held:
            raise TransferError(f"transfer {mid}: too many transfers or blocks open at this "
                                f"receiver (their index would exceed {self.max_held} bytes)")
        self.held += n

    def _open_transfer(self, mid: str, now: float) -> _Transfer:
        cost = TRANSFER_COST + len(mid)        # the id is a key of two dicts
        self._charge(mid, cost)
        self._n += 1
        t = _Transfer(os.path.join(self.root, f"t{self._n}"), now, charged=cost)
        try:
            os.close(os.open(t.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
        except OSError as exc:
            self.held -= cost
            full = "spool full: " if exc.errno in _FULL else ""
            raise TransferError(f"transfer {mid}: {full}spool file: {exc.strerror}") from None
        self.transfers[mid] = t
        return t

    def _reserve(self, mid: str, t: _Transfer, size: int) -> int:
        """Room for ``size`` bytes at the end of the transfer's file."""
        if size:
            free = self._free(self.root)
            cap = int(self.share * (free + self.spooled))
            if self.spooled + size > cap:
                raise TransferError(
                    f"transfer {mid}: spool full: {size} more bytes would exceed "
                    f"{self.share:.0%} of the free disk at {self.root} ({self.spooled} "
                    f"bytes spooled, {free} free)")
            try:
                fd = os.open(t.path, os.O_WRONLY)
                try:
                    os.posix_fallocate(fd, t.end, size)
                finally:
                    os.close(fd)
            except OSError as exc:
                if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL):
                    pass            # no fallocate here: a full disk shows at the write
                elif exc.errno in _FULL:
                    raise TransferError(f"transfer {mid}: spool full: no room on disk at "
                                        f"{self.root} for {size} bytes "
                                        f"({exc.strerror})") from None
                else:
                    raise TransferError(f"transfer {mid}: spool file: {exc}") from None
        start = t.end
        t.end += size
        self.spooled += size
        return start

    def add(self, msg: M.Message, now: float | None = None) -> tuple[str, str, int, int] | None:
        """Take one ``blk`` message; ``(mid, sec, bid, size)`` when its
        payload is complete, else None. Raises :class:`TransferError` for a
        bad, corrupt, duplicate or over-budget chunk, or one the disk cannot
        take; the caller then drops the transfer (:meth:`drop`)."""
        mid, sec, bid = msg["mid"], msg["sec"], int(msg["bid"])
        key, where = (sec, bid), f"transfer {mid}: {sec} block {bid}"
        if not msg.frames:
            raise TransferError(f"transfer {mid}: chunk without data")
        fr = msg.frames[0]
        data = fr.buffer if hasattr(fr, "buffer") else memoryview(fr)
        if chunk_digest(data) != msg["h"]:
            raise TransferError(f"{where} arrived corrupt (chunk digest mismatch)")
        now = time.monotonic() if now is None else now
        t = self.transfers.get(mid)
        part = t.open.get(key) if t is not None else None
        ai, off, size = int(msg["arr"]), int(msg["off"]), int(msg["size"])
        if part is None:
            if msg.get("head") is None or ai != 0 or off != 0:
                raise TransferError(f"{where} does not start with its first chunk")
            if t is not None and key in t.done:
                raise TransferError(f"{where} sent twice")
            head, _ = _check_head(msg["head"], int(msg["narr"]), (mid, sec, bid))
            if not head.get("raw"):
                raise TransferError(f"{where} arrived as a block, not as exported bytes")
            if size < 0:
                raise TransferError(f"{where}: negative size")
            if t is None:
                t = self._open_transfer(mid, now)
            start = self._reserve(mid, t, size)      # counted in t.end, so in _forget
            self._charge(mid, ENTRY_COST + len(sec))
            t.charged += ENTRY_COST + len(sec)
            part = t.open[key] = _Open(start, size)
        t.touched = now
        if ai != 0 or off != part.got or off + len(data) > part.size or size != part.size:
            raise TransferError(f"{where}: chunk {ai}@{off} out of order, past its size or "
                                f"not the size its header gives")
        if len(data):
            try:
                fd = os.open(t.path, os.O_WRONLY)
                try:
                    n = os.pwrite(fd, data, part.start + off)
                finally:
                    os.close(fd)
            except OSError as exc:
                full = "spool full: " if exc.errno in _FULL else ""
                raise TransferError(f"{where}: {full}spool file: {exc.strerror}") from None
            if n != len(data):
                raise TransferError(f"{where}: spool full: short write ({n} of {len(data)} "
                                    f"bytes)")
        part.got = off + len(data)
        if part.got < part.size:
            return None
        del t.open[key]
        t.done[key] = (part.start, part.size)
        return mid, sec, bid, part.size

    # -- handing out and dropping ------------------------------------------------------
    def _forget(self, mid: str) -> _Transfer | None:
        t = self.transfers.pop(mid, None)
        if t is not None:
            self.held -= t.charged
            self.spooled -= t.end
        return t

    def take(self, mid: str) -> Spooled:
        """The whole payloads of transfer ``mid`` (none if it is unknown),
        read from its file; they no longer count against the budgets, and
        the file goes when the :class:`Spooled` is closed. Half-received
        payloads are dropped."""
        t = self._forget(mid)
        if t is None:
            return Spooled(None, {})
        if not t.done:
            _unlink(t.path)
            return Spooled(None, {})
        return Spooled(t.path, t.done)

    def drop(self, mid: str) -> None:
        """Forget transfer ``mid`` and delete its file."""
        t = self._forget(mid)
        if t is not None:
            _unlink(t.path)

    def expire(self, now: float | None = None) -> list[str]:
        """Drop every transfer with no chunk for ``idle_s`` (files deleted).
        Returns their ids."""
        now = time.monotonic() if now is None else now
        gone = [mid for mid, t in self.transfers.items() if now - t.touched > self.idle_s]
        for mid in gone:
            self.drop(mid)
        return gone

    def close(self) -> None:
        """Drop every transfer, and the spool directory."""
        for mid in list(self.transfers):
            self.drop(mid)
        shutil.rmtree(self.root, ignore_errors=True)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
