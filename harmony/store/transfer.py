"""Blocks over ZeroMQ: chunked, paced by the socket's high-water mark,
verified chunk by chunk, and zero-copy where the arrays allow.

Every byte that moves between machines (live block migration, checkpoint
replicas, checkpoint fetches on resume, staged input) moves as *payloads*
named ``(sec, bid)`` within one transfer ``mid``. A payload is either a
:class:`~harmony.store.blocks.Block` (its arrays travel as they lie in
memory: no export, no join), opaque bytes, or an opaque *source* read one
chunk at a time as it is sent (an exported block streamed from a
checkpoint on disk, a chunk of a staged file: never held whole).

On the wire a payload is a run of ``blk`` messages, one per *chunk* of at
most ``CHUNK_BYTES`` of one array, each with the CRC-32 of its bytes (by
ISA-L, tens of GB/s: the check costs little next to the copy it replaces;
SHA-256 per payload cost more than the copy). The first carries the payload's header (array names,
dtypes, shapes). An array that fits in one chunk is taken on the receiving
side as the ZeroMQ frame itself, without a copy; a larger one is assembled
in one buffer. A sender keeps at most ``MAX_OPEN`` payloads open at once,
largest first, and interleaves their chunks (at most 4 concurrent moves, as
in Cruise); ZeroMQ's high-water mark and TCP pace it, so no per-chunk round
trip is paid. Checkpoints keep their SHA-256 manifests on top of this.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

import msgpack
import numpy as np
import zmq

from harmony.comm import messages as M
from harmony.store.blocks import Block
from harmony.store.framing import crc32

CHUNK_BYTES = 8 << 20
MAX_OPEN = 4
#: chunks read from a source (and so held by nothing but ZeroMQ's queue)
#: that one transfer lets ZeroMQ hold at once: a send waits for the oldest
#: to leave it (a tracked zero-copy frame) before the next is read
MAX_QUEUED = 4
SEND_TIMEOUT_MS = 60_000


class TransferError(RuntimeError):
    """A payload could not be sent, or arrived torn or corrupt."""


def chunk_digest(buf) -> int:
    return crc32(buf)


@dataclass
class Payload:
    sec: str                      # "model", "input", "data", ...
    bid: int
    data: bytes | memoryview | None = None    # opaque bytes, or
    block: Block | None = None                # a block, sent array by array, or
    source: object = None         # opaque bytes read by range (harmony.store.pieces.Source)
    dest: int = 0                 # index of the destination socket (sender side)

    def __post_init__(self) -> None:
        if sum(x is not None for x in (self.data, self.block, self.source)) != 1:
            raise ValueError("a payload is bytes, a block or a source")

    @property
    def size(self) -> int:
        if self.source is not None:
            return self.source.size
        return len(self.data) if self.block is None else self.block.nbytes

    def parts(self) -> tuple[dict, list]:
        if self.source is not None:
            return {"raw": True}, [self.source]
        if self.block is None:
            return {"raw": True}, [memoryview(self.data).cast("B")]
        arrays = [(n, np.ascontiguousarray(a)) for n, a in self.block.arrays.items()]
        head = {"id": int(self.block.id),
                "arrays": [[n, a.dtype.str, list(a.shape)] for n, a in arrays]}
        return head, [memoryview(a.reshape(-1).view(np.uint8)) if a.size else memoryview(b"")
                      for _, a in arrays]


def chunk_messages(mid: str, p: Payload, chunk: int = CHUNK_BYTES, tag: str | None = None
                   ) -> Iterator[tuple[bytes, memoryview]]:
    """The ``blk`` messages of one payload: (header, data frame) pairs
    (``tag``: the receiving PS shard's job attempt secret)."""
    head, bufs = p.parts()
    packed = msgpack.packb(head, use_bin_type=True)
    first = True
    for ai, buf in enumerate(bufs):
        src = buf if hasattr(buf, "read") else None
        size, off = (src.size if src is not None else len(buf)), 0
        while True:
            piece = (src.read(off, min(chunk, size - off)) if src is not None
                     else buf[off:off + chunk])
            yield M.encode("blk", mid=mid, sec=p.sec, bid=int(p.bid), arr=ai, narr=len(bufs),
                           off=off, size=size, h=chunk_digest(piece),
                           head=packed if first else None, tag=tag), piece
            first = False
            off += len(piece)
            if off >= size:
                break


def send_payloads(socks: list[zmq.Socket], mid: str, payloads: Iterable[Payload], *,
                  prefix: list[bytes] | None = None, max_open: int = MAX_OPEN,
                  chunk: int = CHUNK_BYTES,
                  throttle: Callable[[int, int], object] | None = None,
                  progress: Callable[[int, int], object] | None = None,
                  tag: str | None = None) -> int:
    """Send payloads to ``socks[p.dest]``, largest first, at most ``max_open``
    open at a time with their chunks interleaved. ``prefix`` frames (a
    ROUTER's peer identity) go before each message. ``throttle(dest, n)``
    is called per chunk (network emulation), ``progress(bytes, payloads
    done)`` after each; ``tag`` goes in every chunk (a PS shard's job
    attempt secret). Returns the bytes sent."""
    todo = sorted(payloads, key=lambda p: p.size, reverse=True)
    open_: list[tuple[Payload, Iterator]] = []
    sent = done = 0
    pre = list(prefix or [])
    queued: list[zmq.MessageTracker] = []     # read chunks ZeroMQ still holds
    while todo or open_:
        while todo and len(open_) < max_open:
            p = todo.pop(0)
            open_.append((p, chunk_messages(mid, p, chunk, tag)))
        for item in list(open_):
            p, it = item
            nxt = next(it, None)
            if nxt is None:
                open_.remove(item)
                done += 1
                continue
            head, data = nxt
            if throttle is not None and len(data):
                throttle(p.dest, len(data))
            sock = socks[p.dest]
            deadline = time.monotonic() + SEND_TIMEOUT_MS / 1000
            track = p.source is not None and len(data) >= 65536
            while True:
                try:
                    if not sock.poll(SEND_TIMEOUT_MS, zmq.POLLOUT):
                        raise TransferError(f"transfer {mid}: peer not reading for "
                                            f"{SEND_TIMEOUT_MS / 1000:.0f}s")
                    tracker = sock.send_multipart([*pre, head, data], copy=len(data) < 65536,
                                                  track=track)
                    if track:
                        queued.append(tracker)
                        _drain(queued, MAX_QUEUED - 1, mid)
                    break
                except zmq.Again:
                    # a ROUTER (always writable) whose peer's queue is full gives
                    # up each try after its send timeout: the transfer waits on
                    # for the peer to read, up to SEND_TIMEOUT_MS in all
                    if time.monotonic() > deadline:
                        raise TransferError(f"transfer {mid}: peer not reading for "
                                            f"{SEND_TIMEOUT_MS / 1000:.0f}s") from None
                except zmq.ZMQError as exc:
                    raise TransferError(f"transfer {mid}: send failed: {exc}") from None
            sent += len(data)
            if progress is not None:
                progress(sent, done)
    return sent


def _drain(queued: list, keep: int, mid: str) -> None:
    """Wait until at most ``keep`` of the tracked frames are still in
    ZeroMQ's hands (the oldest leave first)."""
    while len(queued) > keep:
        try:
            queued[0].wait(SEND_TIMEOUT_MS / 1000)
        except zmq.NotDone:
            raise TransferError(f"transfer {mid}: peer not reading for "
                                f"{SEND_TIMEOUT_MS / 1000:.0f}s") from None
        queued.pop(0)


#: what one payload header may hold: at most this many arrays, of at most
#: MAX_DIMS dimensions, with names and dtypes of at most 64 characters; the
#: header itself at most HEAD_BYTES (it is decoded with these caps, so a
#: hostile header costs at most its own size)
MAX_ARRAYS = 64
MAX_DIMS = 8
HEAD_BYTES = 64 << 10
#: a transfer with no chunk for this long is dropped, with all it held
IDLE_S = 60.0
_HEAD_OPTS = dict(raw=False, strict_map_key=True, max_str_len=64, max_bin_len=0,
                  max_ext_len=0, max_array_len=MAX_ARRAYS, max_map_len=8)


def _check_head(raw, narr: int, key) -> tuple[dict, list[int] | None]:
    """A payload header, decoded within bounds and checked: ``(head, sizes)``
    with the byte size each array must have (None for an opaque payload)."""
    where = f"transfer {key[0]}: {key[1]} block {key[2]}"
    if not isinstance(raw, bytes) or len(raw) > HEAD_BYTES:
        raise TransferError(f"{where}: payload header missing or over {HEAD_BYTES} bytes")
    if not 1 <= narr <= MAX_ARRAYS:
        raise TransferError(f"{where}: {narr} arrays (1 to {MAX_ARRAYS})")
    try:
        head = msgpack.unpackb(raw, **_HEAD_OPTS)
    except Exception as exc:
        raise TransferError(f"{where}: bad payload header: {str(exc)[:100]}") from None
    if not isinstance(head, dict):
        raise TransferError(f"{where}: payload header is not a map")
    if head.get("raw"):
        if narr != 1:
            raise TransferError(f"{where}: an opaque payload is one array, not {narr}")
        return head, None
    arrays = head.get("arrays")
    if not isinstance(arrays, list) or len(arrays) != narr \
            or not isinstance(head.get("id", 0), int):
        raise TransferError(f"{where}: payload header does not describe {narr} arrays")
    sizes = []
    for a in arrays:
        try:
            name, dtype, shape = a
            dt = np.dtype(dtype)
            if not (isinstance(name, str) and isinstance(shape, list)
                    and len(shape) <= MAX_DIMS and dt.kind in "biufc"
                    and all(type(n) is int and n >= 0 for n in shape)):
                raise ValueError("bad array description")
            sizes.append(int(np.prod(shape, dtype=object)) * dt.itemsize)
        except (TypeError, ValueError) as exc:
            raise TransferError(f"{where}: payload header: {str(exc)[:100]}") from None
    return head, sizes


@dataclass
class _Partial:
    head: dict
    narr: int
    sizes: list[int] | None           # each array's bytes (None: opaque)
    arrays: list = field(default_factory=list)     # finished buffers, in order
    buf: np.ndarray | None = None                  # the array being assembled
    got: int = 0
    held: int = 0                     # bytes of this payload counted in the budget


class Assembler:
    """Receiver side: chunks in, whole verified payloads out.

    ``max_bytes`` bounds every byte held for payloads not yet handed out
    (assembled buffers and the frames kept without a copy alike, and, with
    ``keep=True``, finished payloads waiting for their transfer's
    ``blk_end``): a sender that would exceed it is refused, not buffered.
    A transfer that sends nothing for ``idle_s`` is dropped by
    :meth:`expire`, which the receiver's loop calls, so what a peer leaves
    half-sent is freed. Headers are decoded within fixed caps and checked
    against the sizes that arrive."""

    def __init__(self, max_bytes: int = 8 << 30, *, keep: bool = False,
                 idle_s: float = IDLE_S) -> None:
        self.max_bytes = max_bytes
        self.keep = keep
        self.idle_s = idle_s
        self.partial: dict[tuple[str, str, int], _Partial] = {}
        self.done: dict[str, dict[tuple[str, int], "Block | bytes"]] = {}
        self._done_bytes: dict[str, int] = {}
        self.touched: dict[str, float] = {}      # transfer -> its last chunk's time
        self.held = 0

    def _take(self, key, part: _Partial, n: int) -> None:
        if self.held + n > self.max_bytes:
            self.forget(key)
            raise TransferError(f"transfer {key[0]}: {n} more bytes would exceed the "
                                f"receive limit of {self.max_bytes} bytes")
        part.held += n
        self.held += n

    def add(self, msg: M.Message, now: float | None = None
            ) -> tuple[str, str, int, "Block | bytes"] | None:
        """Take one ``blk`` message; return ``(mid, sec, bid, payload)`` when
        the payload is complete (a Block, or bytes for opaque payloads),
        else None (with ``keep``, a complete payload is held for
        :meth:`take` and returned too). Raises :class:`TransferError` for a
        bad, corrupt or over-budget chunk (and forgets the payload)."""
        key = (msg["mid"], msg["sec"], int(msg["bid"]))
        if not msg.frames:
            raise TransferError(f"transfer {key[0]}: chunk without data")
        fr = msg.frames[0]
        data = fr.buffer if hasattr(fr, "buffer") else memoryview(fr)
        if chunk_digest(data) != msg["h"]:
            self.forget(key)
            raise TransferError(f"transfer {key[0]}: {key[1]} block {key[2]} arrived corrupt "
                                f"(chunk digest mismatch)")
        self.touched[key[0]] = time.monotonic() if now is None else now
        part = self.partial.get(key)
        ai, off, size = int(msg["arr"]), int(msg["off"]), int(msg["size"])
        if part is None:
            if msg.get("head") is None or ai != 0 or off != 0:
                raise TransferError(f"transfer {key[0]}: {key[1]} block {key[2]} does not "
                                    f"start with its first chunk")
            if self.keep and (key[1], key[2]) in self.done.get(key[0], {}):
                raise TransferError(f"transfer {key[0]}: {key[1]} block {key[2]} sent twice")
            head, sizes = _check_head(msg["head"], int(msg["narr"]), key)
            part = self.partial[key] = _Partial(head, int(msg["narr"]), sizes)
        if ai != len(part.arrays) or off != part.got or off + len(data) > size \
                or size < 0 or ai >= part.narr \
                or (part.sizes is not None and size != part.sizes[ai]):
            self.forget(key)
            raise TransferError(f"transfer {key[0]}: {key[1]} block {key[2]}: chunk "
                                f"{ai}@{off} out of order, past its size or not the size "
                                f"its header gives")
        if off == 0 and len(data) == size:
            self._take(key, part, size)
            part.arrays.append(data)            # the frame itself: no copy
        else:
            if off == 0:
                self._take(key, part, size)
                part.buf = np.empty(size, dtype=np.uint8)
            part.buf[off:off + len(data)] = np.frombuffer(data, dtype=np.uint8)
            part.got = off + len(data)
            if part.got < size:
                return None
            part.arrays.append(part.buf)
            part.buf = None
        part.got = 0
        if len(part.arrays) < part.narr:
            return None
        del self.partial[key]
        try:
            out = self._build(key, part)
        finally:
            self.held -= part.held
            if not self.keep and not any(k[0] == key[0] for k in self.partial):
                self.touched.pop(key[0], None)
        if self.keep:
            n = len(out) if isinstance(out, (bytes, bytearray)) else out.nbytes
            self.held += n
            self._done_bytes[key[0]] = self._done_bytes.get(key[0], 0) + n
            self.done.setdefault(key[0], {})[(key[1], key[2])] = out
        return key[0], key[1], key[2], out

    def take(self, mid: str) -> dict[tuple[str, int], "Block | bytes"]:
        """The finished payloads of transfer ``mid`` (``keep``), handed out:
        they no longer count against the budget. Drops its partial ones."""
        got = self.done.pop(mid, {})
        self.held -= self._done_bytes.pop(mid, 0)
        self.drop_transfer(mid)
        return got

    def expire(self, now: float | None = None) -> list[str]:
        """Drop every transfer with no chunk for ``idle_s``: what it held
        is freed. Returns their ids."""
        now = time.monotonic() if now is None else now
        gone = [mid for mid, t in self.touched.items() if now - t > self.idle_s]
        for mid in gone:
            self.take(mid)
        return gone

    @staticmethod
    def _build(key, part: _Partial):
        if part.head.get("raw"):
            buf = part.arrays[0]
            return bytes(buf) if not isinstance(buf, np.ndarray) else buf.tobytes()
        arrays = {}
        for (name, dtype, shape), buf in zip(part.head["arrays"], part.arrays):
            try:
                arr = np.frombuffer(buf, dtype=np.dtype(dtype)).reshape(shape)
            except (TypeError, ValueError) as exc:
                raise TransferError(f"transfer {key[0]}: array {name!r}: {exc}") from None
            if not arr.flags.writeable:
                # app state in input blocks and a shard's moved model rows
                # are changed in place (the frames ZeroMQ hands over are
                # writable: no copy there)
                arr = arr.copy()
            arrays[name] = arr
        return Block(int(part.head.get("id", key[2])), arrays)

    def forget(self, key: tuple[str, str, int]) -> None:
        part = self.partial.pop(key, None)
        if part is not None:
            self.held -= part.held

    def drop_transfer(self, mid: str) -> None:
        for key in [k for k in self.partial if k[0] == mid]:
            self.forget(key)
        if mid not in self.done:
            self.touched.pop(mid, None)


def receive(sock: zmq.Socket, timeout_s: float, what: str,
            error: type[Exception] = TransferError) -> Iterator[tuple[str, int, "Block | bytes"]]:
    """``(sec, bid, payload)`` of a sender's stream on ``sock`` until its
    ``blk_end``; an ``error`` reply raises ``error``, silence for
    ``timeout_s`` a TransferError (``what`` names the stream in both)."""
    asm = Assembler()
    while True:
        if not sock.poll(int(timeout_s * 1000)):
            raise TransferError(f"{what}: the sender stopped sending")
        msg = M.decode(sock.recv_multipart(copy=False))
        if msg.type == "error":
            raise error(f"{what}: {msg['message']}")
        if msg.type == "blk_end":
            return
        if msg.type == "blk" and (done := asm.add(msg)) is not None:
            yield done[1], done[2], done[3]


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
