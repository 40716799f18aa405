"""The data plane's sealed messages: PS pulls and pushes and block moves
between a job attempt's executors, authenticated (and, by default,
encrypted) with AES-256-GCM from ``cryptography`` instead of CurveZMQ.

Why: CurveZMQ encrypts in each socket's one I/O thread, at ~0.2-0.6 of
plain-text throughput; AES-GCM with AES-NI runs at ~10 GB/s a core, with
the GIL released, so a sealed PS stream moves at close to plain-text speed
(bench/ps_throughput.py --designs). The control plane (master, daemons,
executors' control sockets) keeps CurveZMQ.

Keys. The master makes a random secret per job attempt and hands it to
the attempt's daemons over CurveZMQ; they hand it to their executors. The
attempt key is HKDF-SHA256 of that secret (salted with the job and the
attempt). Every sealing party (a shard's ROUTER, each client DEALER) draws
a random 16-byte id and seals under its own key, HKDF of the attempt key
and its id, so a (key, nonce) pair is never used twice although no party
knows the others' counters: the nonce is the party's message counter
(64 bits) and the chunk's index in the message (32 bits).

A message is ``[header, chunk, ...]`` (``signed``: ``[header, chunk, ...,
tags]``). The header (magic, mode, sender id, receiver id, counter, chunk
size, the inner frames' lengths) is the associated data of every chunk.
The receiver refuses, before anything is applied and with a
:class:`SealError` that says why, a message

- not for it (the receiver id is another party's: a message replayed to
  another shard or to a restarted one, whose id is new),
- whose counter is not above the last one it accepted from that sender on
  this connection (a replay, or a reordering),
- that fails authentication (a stranger's, a reader's or another attempt's
  key; a changed byte; a chunk moved, dropped or added),
- of the other mode (no downgrade from sealed to signed),

and keeps counting them (``Party.refused``).

A shard's address names its incarnation: ``tcp://HOST:PORT#ID`` (ID its
party id in hex), handed to the clients by the master over CurveZMQ; a
request carries the id as its receiver, and a reply the requesting
party's id.
"""
from __future__ import annotations

import itertools
import os
import struct
import sys
import threading
from typing import Any, Iterator

import numpy as np
import zmq
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from harmony.comm.zmqutil import make_socket

if not hasattr(AESGCM, "encrypt_into"):     # sealing in place: cryptography >= 47
    import cryptography
    raise ImportError(f"harmony's data plane needs cryptography >= 47 (AESGCM.encrypt_into); "
                      f"this is {cryptography.__version__}: pip install 'cryptography>=47'")

MAGIC = b"HSD1"
#: data plane modes: ``sealed`` (authenticated and encrypted, the default)
#: and ``signed`` (authenticated, in plain text: an explicit choice)
MODES = {"sealed": 1, "signed": 2}
DEFAULT_MODE = "sealed"
#: the largest piece sealed under one tag, and about the size of a record
#: (one ZeroMQ message); a larger frame is sealed in chunks. A frame of one
#: chunk is opened in place in the received buffer (no copy), one of
#: several into one new buffer. 4 MiB: of 1, 4, 16 and 64 MiB the best or
#: as good as the best at 16 and 64 MB in bench/ps_throughput.py (README)
CHUNK_BYTES = 4 << 20
MAX_INNER_FRAMES = 8
ID_BYTES = 16
TAG_BYTES = 16
_HEAD = struct.Struct("<4sB16s16sQIH")     # magic, mode, sender, receiver, counter, chunk, n
_LEN = struct.Struct("<Q")
_NONCE = struct.Struct(">QI")              # counter, chunk index
_HEAD_TAG_INDEX = 0xFFFFFFFF               # signed mode: the header's own tag
CONT_MAGIC = b"HSD+"
_CONT = struct.Struct("<4sQI")             # a record after the first: counter, chunk
_SALT = b"harmony data plane v1"


class SealError(ValueError):
    """A data-plane message refused (or one that cannot be sealed)."""


def attempt_key(secret: str, job: str, attempt: int) -> bytes:
    """The job attempt's data key: HKDF-SHA256 of the attempt's secret."""
    if not secret:
        raise SealError("no job attempt secret: the data plane cannot be sealed")
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=_SALT,
                info=f"attempt\0{job}\0{int(attempt)}".encode()).derive(secret.encode())


class DataKey:
    """A job attempt's data key and mode, shared by the parties of one
    process; derives (and caches) each sender's AES-GCM key."""

    CACHE = 4096

    def __init__(self, key: bytes, mode: str = DEFAULT_MODE) -> None:
        if mode not in MODES:
            raise SealError(f"unknown data plane mode {mode!r} (one of {', '.join(MODES)})")
        if len(key) != 32:
            raise SealError("a data key has 32 bytes")
        self._key = key
        self.mode = mode
        self.mode_byte = MODES[mode]
        self._aeads: dict[bytes, AESGCM] = {}
        self._lock = threading.Lock()

    @classmethod
    def for_attempt(cls, secret: str, job: str, attempt: int,
                    mode: str = DEFAULT_MODE) -> "DataKey":
        return cls(attempt_key(secret, job, attempt), mode)

    def aead(self, party_id: bytes) -> AESGCM:
        """AES-256-GCM under the key of the party ``party_id``."""
        with self._lock:
            a = self._aeads.get(party_id)
        if a is not None:
            return a
        k = HKDF(algorithm=hashes.SHA256(), length=32, salt=_SALT,
                 info=b"party\0" + party_id).derive(self._key)
        a = AESGCM(k)
        with self._lock:
            if len(self._aeads) >= self.CACHE:      # re-derived when needed again
                self._aeads.pop(next(iter(self._aeads)))
            self._aeads[party_id] = a
        return a


def _view(f: Any) -> memoryview:
    if isinstance(f, zmq.Frame):
        return f.buffer
    if isinstance(f, np.ndarray):
        f = np.ascontiguousarray(f)
        return memoryview(f.reshape(-1).view(np.uint8)) if f.size else memoryview(b"")
    v = memoryview(f)
    return v if v.format == "B" and v.ndim == 1 else v.cast("B")


def _chunks(lens: list[int], chunk: int) -> list[tuple[int, int, int]]:
    """``(inner frame, offset, size)`` of every chunk of a message (a frame
    of 0 bytes is one chunk of 0 bytes)."""
    out = []
    for j, n in enumerate(lens):
        out.extend((j, off, min(chunk, n - off)) for off in (range(0, n, chunk) if n else (0,)))
    return out


class _Pool:
    """Sealed chunks' buffers, reused once ZeroMQ has sent them: a fresh
    buffer per chunk costs a page fault per 4 KiB (malloc hands the heap's
    freed top back to the kernel), 0.1-0.2 CPU s/GB more on the sender at
    64 MB (README). Buffers of 1 MiB and more only; at most ``max_bytes``
    kept in all (smaller ones, and any past the cap, are allocated anew)."""

    MIN_BYTES = 1 << 20

    def __init__(self, max_bytes: int = 64 << 20) -> None:
        self.max_bytes = max_bytes
        self._bufs: dict[int, list[np.ndarray]] = {}
        self._held = 0
        self._lock = threading.Lock()

    def get(self, n: int) -> np.ndarray:
        if n < self.MIN_BYTES:
            return np.empty(n, dtype=np.uint8)
        with self._lock:
            bufs = self._bufs.setdefault(n, [])
            for a in bufs:
                # referenced by this list, the loop and getrefcount's argument
                # only: no frame in flight holds it any more
                if sys.getrefcount(a) <= 3:
                    return a
            a = np.empty(n, dtype=np.uint8)
            if self._held + n <= self.max_bytes:
                bufs.append(a)
                self._held += n
            return a


_POOL = _Pool()


class _Partial:
    """A message being opened: its header checked, chunks arriving."""

    __slots__ = ("frm", "counter", "head", "lens", "plan", "next", "single", "inner")

    def __init__(self, frm: bytes, counter: int, head: bytes, lens: list[int], chunk: int):
        self.frm, self.counter, self.head, self.lens = frm, counter, head, lens
        self.plan = _chunks(lens, chunk)
        self.next = 0                           # index of the next chunk expected
        per = [0] * len(lens)
        for j, _, _ in self.plan:
            per[j] += 1
        self.single = [c == 1 for c in per]     # opened in place in its frame
        self.inner: list = [None] * len(lens)


class Party:
    """One end of sealed connections: seals what it sends under its own
    key and opens what it receives, refusing replays per sender.

    A message goes as *records*, each one ZeroMQ message of about one chunk
    (the first with the header), so that the sender seals the next chunk
    while ZeroMQ's I/O thread sends the last, and the receiver opens one
    while the next arrives (frames of one ZeroMQ message are handed on only
    at its end)."""

    def __init__(self, key: DataKey, chunk: int | None = None) -> None:
        chunk = chunk or CHUNK_BYTES
        if not 4096 <= chunk <= (1 << 31):
            raise SealError(f"chunk size {chunk} out of range")
        self.key = key
        self.id = os.urandom(ID_BYTES)
        self.chunk = chunk
        self._aead = key.aead(self.id)
        self._counter = itertools.count(1)
        self._seen: dict[bytes, int] = {}       # sender id -> last counter accepted
        self.opened = 0
        self.refused = 0
        self.last_refusal = ""

    # -- sending -----------------------------------------------------------------
    def records(self, to: bytes, frames: list) -> Iterator[list]:
        """The records (lists of wire frames) of ``frames`` for the party
        ``to``, each sealed as it is asked for."""
        bufs = [_view(f) for f in frames]
        if not 1 <= len(bufs) <= MAX_INNER_FRAMES:
            raise SealError(f"a sealed message holds 1 to {MAX_INNER_FRAMES} frames, "
                            f"not {len(bufs)}")
        counter = next(self._counter)
        lens = [b.nbytes for b in bufs]
        head = _HEAD.pack(MAGIC, self.key.mode_byte, self.id, to, counter, self.chunk,
                          len(bufs)) + b"".join(_LEN.pack(n) for n in lens)
        aead, sealed = self._aead, self.key.mode == "sealed"
        rec: list = [head] if sealed else [
            head, aead.encrypt(_NONCE.pack(counter, _HEAD_TAG_INDEX), b"", head)]
        size = 0
        for i, (j, off, m) in enumerate(_chunks(lens, self.chunk)):
            piece = bufs[j][off:off + m]
            nonce = _NONCE.pack(counter, i)
            if sealed:
                out = memoryview(_POOL.get(m + TAG_BYTES))
                aead.encrypt_into(nonce, piece, head, out)
                rec.append(out)
            else:
                rec += [piece, aead.encrypt(nonce, b"", piece)]
            size += m
            if size >= self.chunk:
                yield rec
                rec, size = [_CONT.pack(CONT_MAGIC, counter, i + 1)], 0
        if len(rec) > 1:
            yield rec

    def seal(self, to: bytes, frames: list) -> list[list]:
        """All the records of a message (see :meth:`records`)."""
        return list(self.records(to, frames))

    # -- receiving ---------------------------------------------------------------
    def _refuse(self, why: str) -> SealError:
        self.refused += 1
        self.last_refusal = why
        return SealError(why)

    def start(self, frames: list, max_bytes: int, sender: bytes | None) -> _Partial:
        """Check a message's header (the first frame of its first record)."""
        head = frames[0]
        if head.nbytes < _HEAD.size or bytes(head[:4]) != MAGIC:
            raise self._refuse("not a sealed data-plane message (this data plane is "
                               "sealed: plain or CurveZMQ requests are refused)")
        _magic, mode, frm, to, counter, chunk, n = _HEAD.unpack_from(head)
        head = bytes(head)
        if mode != self.key.mode_byte:
            names = {v: k for k, v in MODES.items()}
            raise self._refuse(f"a {names.get(mode, f'mode {mode}')} message on a "
                               f"{self.key.mode} data plane (every machine of a cluster "
                               f"must run the same --data-plane)")
        if not 1 <= n <= MAX_INNER_FRAMES or len(head) != _HEAD.size + n * _LEN.size \
                or not 4096 <= chunk <= (1 << 31):
            raise self._refuse("malformed sealed header")
        if to != self.id:
            raise self._refuse("sealed for another party (a message for another shard or "
                               "connection, or for an earlier incarnation of this one)")
        if sender is not None and frm != sender:
            raise self._refuse("sealed by another party than the peer of this connection")
        last = self._seen.get(frm, 0)
        if counter <= last:
            raise self._refuse(f"replayed or reordered message (counter {counter}, last "
                               f"accepted {last})")
        lens = [_LEN.unpack_from(head, _HEAD.size + k * _LEN.size)[0] for k in range(n)]
        if sum(lens) > max_bytes:
            raise self._refuse(f"sealed message of {sum(lens)} bytes over the limit of "
                               f"{max_bytes}")
        return _Partial(frm, counter, head, lens, chunk)

    def feed(self, part: _Partial, frames: list, first: int) -> bool:
        """Open the chunks of one record (``frames[first:]``) into ``part``;
        True once the message is complete (and accepted)."""
        aead = self.key.aead(part.frm)
        sealed = self.key.mode == "sealed"
        step = 1 if sealed else 2
        if (len(frames) - first) % step:
            raise self._refuse("signed record with a chunk but no tag")
        try:
            for k in range(first, len(frames), step):
                if part.next >= len(part.plan):
                    raise self._refuse("more chunks than the header says")
                j, off, m = part.plan[part.next]
                nonce = _NONCE.pack(part.counter, part.next)
                f = frames[k]
                if f.nbytes != m + (TAG_BYTES if sealed else 0):
                    raise self._refuse("chunk of the wrong size")
                if not sealed:
                    aead.decrypt(nonce, bytes(frames[k + 1]), f)
                    if part.single[j]:
                        part.inner[j] = f
                    else:
                        if off == 0:
                            part.inner[j] = np.empty(part.lens[j], dtype=np.uint8)
                        part.inner[j][off:off + m] = np.frombuffer(f, dtype=np.uint8)
                elif part.single[j]:                # opened in place: no copy
                    if f.readonly:
                        f = memoryview(bytearray(f))
                    aead.decrypt_into(nonce, f, part.head, f[:m])
                    part.inner[j] = f[:m]
                else:
                    if off == 0:
                        part.inner[j] = memoryview(np.empty(part.lens[j], dtype=np.uint8))
                    aead.decrypt_into(nonce, f, part.head, part.inner[j][off:off + m])
                part.next += 1
        except InvalidTag:
            raise self._refuse("failed authentication (not sealed under this job attempt's "
                               "key, or altered on the way)") from None
        if part.next < len(part.plan):
            return False
        if part.counter <= self._seen.get(part.frm, 0):     # a replay that raced it
            raise self._refuse("replayed message")
        self._seen[part.frm] = part.counter
        self.opened += 1
        part.inner = [memoryview(x) if isinstance(x, np.ndarray) else x for x in part.inner]
        return True

    def first_record(self, frames: list, max_bytes: int, sender: bytes | None
                     ) -> tuple[_Partial, bool]:
        part = self.start(frames, max_bytes, sender)
        if self.key.mode == "signed":
            if len(frames) < 2 or frames[1].nbytes != TAG_BYTES:
                raise self._refuse("signed message without its header's tag")
            try:
                self.key.aead(part.frm).decrypt(_NONCE.pack(part.counter, _HEAD_TAG_INDEX),
                                                bytes(frames[1]), part.head)
            except InvalidTag:
                raise self._refuse("failed authentication (not signed under this job "
                                   "attempt's key, or altered on the way)") from None
            return part, self.feed(part, frames, 2)
        if len(frames) < 2:         # its first chunk authenticates the header
            raise self._refuse("a first record without a chunk")
        return part, self.feed(part, frames, 1)

    def next_record(self, part: _Partial, frames: list) -> bool:
        head = frames[0]
        if head.nbytes != _CONT.size or bytes(head[:4]) != CONT_MAGIC:
            raise self._refuse("a new message before the last one's end")
        _m, counter, i = _CONT.unpack_from(head)
        if counter != part.counter or i != part.next:
            raise self._refuse("record out of place in its message")
        return self.feed(part, frames, 1)

    def open(self, records: list[list], max_bytes: int = 1 << 31,
             sender: bytes | None = None) -> tuple[bytes, list[memoryview]]:
        """``(sender id, inner frames)`` of a whole message's records (see
        :meth:`seal`; opened in copies: the socket's path opens in place);
        raises :class:`SealError` (and counts it) for
        anything refused. Nothing is kept of a refused one."""
        if not records or not records[0]:
            raise self._refuse("empty message")

        def views(rec):         # read-only copies: what was given stays as it was
            return [memoryview(bytes(_view(f))) for f in rec]
        part, done = self.first_record(views(records[0]), max_bytes, sender)
        for rec in records[1:]:
            if done:
                raise self._refuse("records past the message's end")
            done = self.next_record(part, views(rec))
        if not done:
            raise self._refuse("message ends before its last chunk")
        return part.frm, part.inner


class SealedSocket(zmq.Socket):
    """A ZeroMQ socket whose multipart messages are sealed (see the module),
    each sent as records. A DEALER talks to one peer (``peer``: its party
    id); a ROUTER answers each connection's party (learnt from the last
    message it opened). A ROUTER's :meth:`recv_multipart` raises zmq.Again
    while a message is still arriving (poll and call again)."""

    party: Party | None = None
    peer: bytes | None = None
    max_bytes: int = 1 << 31
    _routes: dict | None = None
    _partials: dict | None = None

    def send_multipart(self, msg_parts, flags: int = 0, copy: bool = True, track: bool = False,
                       **kwargs):
        if self.type == zmq.ROUTER:
            ident = bytes(msg_parts[0])
            to = (self._routes or {}).get(ident)
            if to is None:
                raise SealError("no sealed message came from this peer: nothing to answer")
            pre, body = [msg_parts[0]], list(msg_parts[1:])
        else:
            to, pre, body = self.peer, [], list(msg_parts)
        tracker = None
        for rec in self.party.records(to, body):
            tracker = super().send_multipart([*pre, *rec], flags, copy=False, track=track,
                                             **kwargs)
        return tracker

    def send_plain(self, msg_parts: list, flags: int = 0):
        """Unsealed (a ROUTER's refusal, for a peer that sent no sealed message)."""
        return super().send_multipart(msg_parts, flags)

    def recv_multipart(self, flags: int = 0, copy: bool = True, track: bool = False):
        """The opened frames (memoryviews; a ROUTER's routing id first, as
        bytes). A refused message raises :class:`SealError` (a ROUTER's
        carries the routing id as ``exc.ident``, and ``exc.answer``: whether
        to tell the peer)."""
        if self.type != zmq.ROUTER:
            return self._recv_dealer(flags, track)
        if self._partials is None:
            self._partials, self._routes = {}, {}
        while True:
            frames = super().recv_multipart(flags, copy=False, track=track)
            flags |= zmq.NOBLOCK            # the rest as far as it has come
            ident = frames[0].bytes
            views = [f.buffer for f in frames[1:]]
            part = self._partials.pop(ident, None)
            try:
                if not views:
                    raise self.party._refuse("empty message")
                if part is None:
                    part, done = self.party.first_record(views, self.max_bytes, None)
                else:
                    done = self.party.next_record(part, views)
            except SealError as exc:
                # answered once a message: not for each record that follows
                exc.ident = ident
                exc.answer = part is None and not (views and bytes(views[0][:4]) == CONT_MAGIC)
                raise
            if not done:
                if len(self._partials) >= 4096:     # one per connection
                    self._partials.pop(next(iter(self._partials)))
                self._partials[ident] = part
                continue
            if len(self._routes) >= 65536:
                self._routes.pop(next(iter(self._routes)))
            self._routes[ident] = part.frm
            return [ident, *part.inner]

    def _recv_dealer(self, flags: int, track: bool) -> list:
        frames = super().recv_multipart(flags, copy=False, track=track)
        views = [f.buffer for f in frames]
        if views and bytes(views[0][:4]) not in (MAGIC, CONT_MAGIC) \
                and (plain := _plain_error(frames)):
            raise SealError(f"the peer answered in plain text: {plain}")
        if not views:
            raise self.party._refuse("empty message")
        part, done = self.party.first_record(views, self.max_bytes, self.peer)
        while not done:         # the rest of the message (within RCVTIMEO a record)
            frames = super().recv_multipart(0, copy=False, track=track)
            done = self.party.next_record(part, [f.buffer for f in frames])
        return part.inner


def _plain_error(frames: list) -> str:
    """The message of a plain-text error reply (a refusal), or ''."""
    try:
        import msgpack
        obj = msgpack.unpackb(frames[0].bytes if isinstance(frames[0], zmq.Frame)
                              else bytes(frames[0]), raw=False, max_str_len=4096,
                              max_bin_len=0, max_array_len=64, max_map_len=16)
        if isinstance(obj, dict) and obj.get("t") in ("ps_error", "error", "blk_ack"):
            return str(obj.get("message") or obj.get("error") or "")[:500]
    except Exception:
        pass
    return ""


def sealed_socket(ctx: zmq.Context, kind: int, key: DataKey, peer: bytes | None = None,
                  timeout_s: float | None = None, chunk: int | None = None) -> SealedSocket:
    """A socket of Harmony's options (no CurveZMQ: the messages are sealed)
    for a new party; a DEALER's ``peer`` is the party id of what it talks to."""
    kw = {} if timeout_s is None else {"timeout_s": timeout_s}
    s = make_socket(ctx, kind, curve=False, socket_class=SealedSocket, **kw)
    s.party = Party(key, chunk)
    s.peer = peer
    return s


def join_address(endpoint: str, party_id: bytes) -> str:
    """A shard's address: its endpoint and its party id."""
    return f"{endpoint}#{party_id.hex()}"


def split_address(address: str) -> tuple[str, bytes | None]:
    """``(endpoint, party id or None)`` of a shard's address."""
    ep, sep, ident = address.partition("#")
    if not sep:
        return ep, None
    try:
        raw = bytes.fromhex(ident)
    except ValueError:
        raw = b""
    if len(raw) != ID_BYTES:
        raise SealError(f"bad party id in the address {address!r}")
    return ep, raw
