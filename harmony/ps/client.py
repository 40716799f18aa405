"""The worker side of the data plane: batched PULL and PUSH to server shards.

Keys are routed to shards by the owner map (block -> shard) that the master
hands out; one request per shard is sent, all shards are asked at once, and
values travel as raw ZeroMQ frames (zero-copy on both ends).
"""
from __future__ import annotations

import itertools
from typing import Callable

import numpy as np
import zmq

from harmony.comm import messages as M
from harmony.comm.sealed import DataKey, SealError, sealed_socket, split_address
from harmony.comm.zmqutil import make_socket
from harmony.ps.keymap import block_of
from harmony.ps.server import MAX_FRAME_BYTES, PS_LIMITS, LocalRequestError, _frame_array


class PSError(RuntimeError):
    pass


class _LocalReply:
    """A reply of this process's own shard (ShardServer.serve_local)."""

    def __init__(self, frames: list) -> None:
        self.frames = frames


class PSClient:
    def __init__(self, ctx: zmq.Context, peers: list[str], owner: np.ndarray, dim: int,
                 dtype: str = "float32", timeout_s: float = 120.0,
                 throttle: Callable[[list[list[tuple[int, int, str]]]], object] | None = None,
                 tag: str = "", key: DataKey | None = None) -> None:
        """``throttle(flows)`` is called once per pull or push with one flow
        per peer, each a list of (peer, nbytes, "out"|"in") legs in order
        (network emulation of local clusters: the flows run in parallel, as
        on a NIC); None for a real network.
        ``key``: the job attempt's data key: requests are sealed for each
        shard (``peers`` are shard addresses with their party ids) and no
        ``tag`` is sent; None: CurveZMQ sockets, ``tag`` in every request."""
        self.throttle = throttle
        self.key = key
        self.tag = "" if key is not None else tag
        self.peers = list(peers)
        self.owner = np.asarray(owner, dtype=np.int64)
        self.nblocks = len(self.owner)
        self.dim = dim
        self.dtype = np.dtype(dtype)
        self.timeout_ms = int(timeout_s * 1000)
        self.socks = [self._connect(ctx, ep) for ep in self.peers]
        self._rid = itertools.count(1)
        self.bytes_sent = 0
        self.bytes_received = 0
        # data bytes (keys + rows) moved to/from each peer's shard, as the
        # network sees them; the profiler splits local from remote traffic
        self.peer_bytes = [0] * len(self.peers)
        # the same data bytes, all peers, by direction of the operation: PULL
        # (keys out, rows in) and PUSH (keys and deltas out)
        self.pull_bytes = 0
        self.push_bytes = 0
        self.redirects = 0      # sub-requests a shard redirected (ownership moved)
        # this process's own shard, served in this thread (ShardServer.serve_local)
        self.local = None
        self.local_requests = 0

    def _connect(self, ctx: zmq.Context, address: str) -> zmq.Socket:
        if self.key is None:
            s = make_socket(ctx, zmq.DEALER)
            s.connect(address)
            return s
        ep, party = split_address(address)
        if party is None:
            raise PSError(f"shard address {address!r} names no party id: a sealed data "
                          f"plane needs one (is that shard's data plane sealed?)")
        s = sealed_socket(ctx, zmq.DEALER, self.key, peer=party)
        s.max_bytes = PS_LIMITS.max_bytes
        s.connect(ep)
        return s

    def set_local(self, server) -> None:
        """Serve requests for ``server`` (a ShardServer of this process,
        found among the peers by its endpoint) in the caller's thread,
        without the ZeroMQ round trip; the byte counts and the network
        emulation see them as before."""
        self.local = server

    def close(self) -> None:
        for s in self.socks:
            s.close(linger=0)

    def _route(self, keys: np.ndarray):
        if len(self.peers) == 1:
            return [(0, None, keys)]
        shard = self.owner[block_of(keys, self.nblocks)]
        if len(shard) and (shard == shard[0]).all():
            p = int(shard[0]) if len(shard) else 0
            return [(p, None, keys)]
        order = np.argsort(shard, kind="stable")
        counts = np.bincount(shard, minlength=len(self.peers))
        out, start = [], 0
        for p, c in enumerate(counts):
            if c:
                sel = order[start:start + c]
                out.append((p, sel, np.ascontiguousarray(keys[sel])))
                start += c
        return out

    def set_layout(self, peers: list[str], owner) -> None:
        """A new owner map (after a redirect or a resize): reconnect to
        shards whose endpoint changed."""
        ctx = self.socks[0].context if self.socks else zmq.Context.instance()
        for i, ep in enumerate(peers):
            if i < len(self.peers) and self.peers[i] == ep:
                continue
            s = self._connect(ctx, ep)
            if i < len(self.socks):
                self.socks[i].close(linger=0)
                self.socks[i] = s
            else:
                self.socks.append(s)
        for s in self.socks[len(peers):]:
            s.close(linger=0)
        del self.socks[len(peers):]
        self.peers = list(peers)
        self.owner = np.asarray(owner, dtype=np.int64)
        self.peer_bytes = (self.peer_bytes + [0] * len(peers))[:len(peers)]

    def _collect(self, pending: dict[int, tuple]) -> tuple[dict[int, M.Message], list[int]]:
        """Replies of every pending shard; and the shards that answered
        ``ps_moved`` (they no longer own those keys: the new owner map is
        installed, and the caller sends those keys again)."""
        poller = zmq.Poller()
        for p in pending:
            poller.register(self.socks[p], zmq.POLLIN)
        got: dict[int, M.Message] = {}
        moved: list[int] = []
        while len(got) + len(moved) < len(pending):
            events = dict(poller.poll(self.timeout_ms))
            if not events:
                missing = [self.peers[p] for p in pending if p not in got and p not in moved]
                raise PSError(f"server shard(s) not responding: {missing}")
            for p in pending:
                if p in got or p in moved or self.socks[p] not in events:
                    continue
                try:
                    msg = M.decode(self.socks[p].recv_multipart(copy=False), PS_LIMITS)
                except SealError as exc:      # nothing of the reply is used
                    raise PSError(f"shard {self.peers[p]}: {exc}") from None
                if msg.get("rid") != pending[p][0]:
                    continue  # a stale reply from an earlier timed-out request
                if msg.type == "ps_error":
                    raise PSError(f"shard {self.peers[p]}: {msg['message']}")
                poller.unregister(self.socks[p])
                if msg.type == "ps_moved":
                    moved.append(p)
                    new_map = (msg["peers"], msg["owner"])
                else:
                    got[p] = msg
        if moved:
            self.redirects += len(moved)
            self.set_layout(*new_map)
        return got, moved

    def _rounds(self, keys: np.ndarray, send, local=None
                ) -> list[tuple[int, np.ndarray | None, int, M.Message]]:
        """Route ``keys``, ``send(peer, sel, keys)`` one request per shard,
        and collect; keys a shard redirected are routed again with the new
        owner map. ``local(sel, keys)`` serves this process's own shard in
        this thread (a reply, or None: send it as usual). Returns (peer,
        selection into keys, count, reply)."""
        out = []
        sel_all: np.ndarray | None = None
        me = self.local.endpoint if (self.local is not None and local is not None) else None
        for _ in range(8):
            k = keys if sel_all is None else keys[sel_all]
            pending, mine = {}, []
            for p, sel, kk in self._route(k):
                absolute = sel if sel_all is None else (sel_all if sel is None else sel_all[sel])
                if me is not None and self.peers[p] == me:
                    mine.append((p, absolute, kk))      # after the others are asked
                    continue
                pending[p] = (send(p, absolute, kk), absolute, len(kk))
            for p, absolute, kk in mine:
                reply = local(absolute, kk)
                if reply is None:                       # the shard's thread answers
                    pending[p] = (send(p, absolute, kk), absolute, len(kk))
                else:
                    self.local_requests += 1
                    out.append((p, absolute, len(kk), reply))
            if not pending:
                return out
            got, moved = self._collect(pending)
            for p, msg in got.items():
                out.append((p, pending[p][1], pending[p][2], msg))
            if not moved:
                return out
            parts = [pending[p][1] if pending[p][1] is not None else np.arange(len(keys))
                     for p in moved]
            sel_all = np.sort(np.concatenate(parts))
        raise PSError("keys still redirected after 8 rounds (owner map keeps changing)")

    def _local(self, kind: str, keys: np.ndarray, vals: np.ndarray | None):
        try:
            return self.local.serve_local(kind, keys, vals)
        except LocalRequestError as exc:
            raise PSError(f"shard {self.local.endpoint}: {exc}") from None

    def _span(self) -> int:
        """Keys per request: no frame of a request or reply over the shards'
        cap (MAX_FRAME_BYTES); a larger pull or push is split."""
        return max(1, MAX_FRAME_BYTES // max(8, self.dim * self.dtype.itemsize))

    def pull(self, keys: np.ndarray) -> np.ndarray:
        """Rows for sorted unique int64 ``keys`` (read-only when zero-copy).
        A key asked twice is refused by its shard (PSError)."""
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        span = self._span()
        if len(keys) > span:
            out = np.empty((len(keys), self.dim), dtype=self.dtype)
            for s in range(0, len(keys), span):
                out[s:s + span] = self._pull(keys[s:s + span])
            return out
        return self._pull(keys)

    def _pull(self, keys: np.ndarray) -> np.ndarray:
        if len(keys) == 0:
            return np.zeros((0, self.dim), dtype=self.dtype)

        def send(p, sel, k):
            rid = next(self._rid)
            self.socks[p].send_multipart([M.encode("pull", rid=rid, n=len(k), tag=self.tag), k],
                                         copy=False)
            self.bytes_sent += k.nbytes
            return rid

        def local(sel, k):
            rows = self._local("pull", k, None)
            return None if rows is None else _LocalReply([rows])
        replies = self._rounds(keys, send, local)
        for p, sel, n, _ in replies:
            self.peer_bytes[p] += n * (8 + self.dim * self.dtype.itemsize)
            self.pull_bytes += n * (8 + self.dim * self.dtype.itemsize)
        if self.throttle is not None:     # each peer's keys out, then its rows in
            self.throttle([[(p, n * 8, "out"), (p, n * self.dim * self.dtype.itemsize, "in")]
                           for p, _, n, _ in replies])
        if len(replies) == 1 and replies[0][1] is None:
            frame = replies[0][3].frames[0]
            if isinstance(frame, np.ndarray) and frame.dtype == self.dtype \
                    and frame.shape == (len(keys), self.dim):
                # this process's shard: its own array, as it is (no view of
                # it, so that the caller sees an array owning its memory)
                self.bytes_received += frame.nbytes
                return frame
            rows = _frame_array(frame, self.dtype, (len(keys), self.dim))
            self.bytes_received += rows.nbytes
            return rows
        out = np.empty((len(keys), self.dim), dtype=self.dtype)
        for p, sel, n, msg in replies:
            part = _frame_array(msg.frames[0], self.dtype, (n, self.dim))
            self.bytes_received += part.nbytes
            out[slice(None) if sel is None else sel] = part
        return out

    def push(self, keys: np.ndarray, deltas: np.ndarray) -> None:
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        deltas = np.ascontiguousarray(deltas, dtype=self.dtype)
        if deltas.shape != (len(keys), self.dim):
            raise ValueError(f"deltas have shape {deltas.shape}, expected {(len(keys), self.dim)}")
        span = self._span()
        for s in range(0, len(keys), span):
            self._push(keys[s:s + span], deltas[s:s + span])

    def _push(self, keys: np.ndarray, deltas: np.ndarray) -> None:
        if len(keys) == 0:
            return

        def send(p, sel, k):
            v = deltas if sel is None else np.ascontiguousarray(deltas[sel])
            rid = next(self._rid)
            self.socks[p].send_multipart(
                [M.encode("push", rid=rid, n=len(k), dim=self.dim, tag=self.tag), k, v],
                copy=False)
            self.bytes_sent += k.nbytes + v.nbytes
            return rid

        def local(sel, k):
            v = deltas if sel is None else np.ascontiguousarray(deltas[sel])
            done = self._local("push", k, v)
            return None if done is None else _LocalReply([])
        replies = self._rounds(keys, send, local)
        for p, sel, n, _ in replies:
            self.peer_bytes[p] += n * (8 + self.dim * self.dtype.itemsize)
            self.push_bytes += n * (8 + self.dim * self.dtype.itemsize)
        if self.throttle is not None:
            self.throttle([[(p, n * (8 + self.dim * self.dtype.itemsize), "out")]
                           for p, _, n, _ in replies])
