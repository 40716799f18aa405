"""Blocks over ZeroMQ: chunked, windowed by the socket's high-water mark,
verified end to end.

Every byte that moves between machines (live block migration, checkpoint
replicas, checkpoint fetches on resume, staged input) moves as *payloads*:
an exported block or a chunk of a file, named by ``(sec, bid)`` within one
transfer ``mid``. A payload travels as ``blk`` messages of at most
``CHUNK_BYTES`` each (the Cruise store streams migrations in chunks too),
the first carrying the payload's SHA-256. The receiver's :class:`Assembler`
puts the chunks together, checks the digest, and only then hands the payload
on; a torn or corrupt payload is never used. A sender keeps at most
``MAX_OPEN`` payloads open at once, largest first, and interleaves their
chunks (at most 4 concurrent moves, as in Cruise); ZeroMQ's send high-water
mark and TCP's flow control pace it, so no per-chunk round trip is paid.
"""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

import zmq

from harmony.comm import messages as M

CHUNK_BYTES = 1 << 20
MAX_OPEN = 4
SEND_TIMEOUT_MS = 60_000


class TransferError(RuntimeError):
    """A payload could not be sent, or arrived torn or corrupt."""


@dataclass
class Payload:
    sec: str          # "model", "input", "data", ...
    bid: int
    data: bytes | memoryview
    dest: int = 0     # index of the destination socket (sender side)

    @property
    def size(self) -> int:
        return len(self.data)


def digest(data: bytes | memoryview) -> bytes:
    return hashlib.sha256(data).digest()


def chunk_messages(mid: str, p: Payload, chunk: int = CHUNK_BYTES):
    """The ``blk`` messages of one payload: (header, data frame) pairs."""
    mv = memoryview(p.data).cast("B")
    total = len(mv)
    sha = digest(mv)
    off = 0
    while True:
        end = min(total, off + chunk)
        head = M.encode("blk", mid=mid, sec=p.sec, bid=int(p.bid), off=off, total=total,
                        sha=sha if off == 0 else None)
        yield head, mv[off:end]
        off = end
        if off >= total:
            return


def send_payloads(socks: list[zmq.Socket], mid: str, payloads: Iterable[Payload], *,
                  prefix: list[bytes] | None = None, max_open: int = MAX_OPEN,
                  chunk: int = CHUNK_BYTES,
                  throttle: Callable[[int, int], object] | None = None) -> int:
    """Send payloads to ``socks[p.dest]``, largest first, at most ``max_open``
    open at a time with their chunks interleaved. ``prefix`` frames (a
    ROUTER's peer identity) go before each message. ``throttle(dest, n)``
    is called per chunk (network emulation). Returns the bytes sent."""
    todo = sorted(payloads, key=lambda p: p.size, reverse=True)
    open_: list[tuple[Payload, object]] = []
    sent = 0
    pre = list(prefix or [])
    while todo or open_:
        while todo and len(open_) < max_open:
            p = todo.pop(0)
            open_.append((p, iter(chunk_messages(mid, p, chunk))))
        for item in list(open_):
            p, it = item
            nxt = next(it, None)
            if nxt is None:
                open_.remove(item)
                continue
            head, data = nxt
            if throttle is not None:
                throttle(p.dest, len(data))
            sock = socks[p.dest]
            try:
                if not sock.poll(SEND_TIMEOUT_MS, zmq.POLLOUT):
                    raise TransferError(f"transfer {mid}: peer not reading for "
                                        f"{SEND_TIMEOUT_MS / 1000:.0f}s")
                sock.send_multipart([*pre, head, data], copy=len(data) < 65536)
            except zmq.ZMQError as exc:
                raise TransferError(f"transfer {mid}: send failed: {exc}") from None
            sent += len(data)
    return sent


@dataclass
class _Partial:
    buf: bytearray
    sha: bytes | None
    got: int = 0
    started: float = field(default_factory=time.monotonic)


class Assembler:
    """Receiver side: chunks in, whole verified payloads out.

    ``max_bytes`` bounds what may be held half-received at once (a sender
    that announces more is refused, not buffered)."""

    def __init__(self, max_bytes: int = 8 << 30) -> None:
        self.max_bytes = max_bytes
        self.partial: dict[tuple[str, str, int], _Partial] = {}
        self.held = 0

    def add(self, msg: M.Message) -> tuple[str, str, int, bytes] | None:
        """Take one ``blk`` message; return ``(mid, sec, bid, payload)`` when
        the payload is complete and verified, else None. Raises
        :class:`TransferError` for a bad or corrupt payload (and forgets it)."""
        key = (msg["mid"], msg["sec"], int(msg["bid"]))
        total, off = int(msg["total"]), int(msg["off"])
        if not msg.frames:
            raise TransferError(f"transfer {key[0]}: chunk without data")
        fr = msg.frames[0]
        data = fr.buffer if hasattr(fr, "buffer") else memoryview(fr)
        part = self.partial.get(key)
        if part is None:
            if off != 0 or msg.get("sha") is None:
                raise TransferError(f"transfer {key[0]}: {key[1]} block {key[2]} does not "
                                    f"start with its first chunk")
            if total < 0 or self.held + total > self.max_bytes:
                raise TransferError(f"transfer {key[0]}: {total} bytes would exceed the "
                                    f"receive limit of {self.max_bytes} bytes")
            part = self.partial[key] = _Partial(bytearray(total), bytes(msg["sha"]))
            self.held += total
        if len(part.buf) != total or off != part.got or off + len(data) > total:
            self.forget(key)
            raise TransferError(f"transfer {key[0]}: {key[1]} block {key[2]}: chunk at "
                                f"{off} out of order or past its size")
        part.buf[off:off + len(data)] = data
        part.got += len(data)
        if part.got < total:
            return None
        self.forget(key)
        if digest(part.buf) != part.sha:
            raise TransferError(f"transfer {key[0]}: {key[1]} block {key[2]} arrived "
                                f"corrupt (SHA-256 mismatch)")
        return key[0], key[1], key[2], bytes(part.buf)

    def forget(self, key: tuple[str, str, int]) -> None:
        part = self.partial.pop(key, None)
        if part is not None:
            self.held -= len(part.buf)

    def drop_transfer(self, mid: str) -> None:
        for key in [k for k in self.partial if k[0] == mid]:
            self.forget(key)


def wait_acks(sock_of: Callable[[int], zmq.Socket], want: set[tuple[int, str, int]],
              mid: str, timeout_s: float, on_other: Callable[[int, M.Message], None]
              | None = None) -> None:
    """Wait for a ``blk_ack`` for every ``(dest, sec, bid)`` in ``want``."""
    dests = sorted({d for d, _, _ in want})
    poller = zmq.Poller()
    for d in dests:
        poller.register(sock_of(d), zmq.POLLIN)
    deadline = time.monotonic() + timeout_s
    pending = set(want)
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TransferError(f"transfer {mid}: {len(pending)} block(s) not acknowledged "
                                f"in {timeout_s:.0f}s")
        events = dict(poller.poll(min(1000, int(left * 1000) + 1)))
        for d in dests:
            s = sock_of(d)
            while s in events and s.poll(0):
                msg = M.decode(s.recv_multipart())
                if msg.type == "blk_ack" and msg["mid"] == mid:
                    if not msg["ok"]:
                        raise TransferError(f"transfer {mid}: receiver refused "
                                            f"{msg['sec']} block {msg['bid']}: "
                                            f"{msg.get('error') or '?'}")
                    pending.discard((d, msg["sec"], int(msg["bid"])))
                elif on_other is not None:
                    on_other(d, msg)
