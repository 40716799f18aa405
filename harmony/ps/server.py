"""A server shard: the rows of the model blocks one executor owns.

The shard runs in its own thread inside the job executor (the executor holds
both the worker role and the server role of its job on that machine, as in
the paper) and answers PULL/PUSH requests on a ROUTER socket. Requests are
served one at a time under the table lock, so the app's update function is
applied to each key atomically.
"""
from __future__ import annotations

import hmac
import itertools
import logging
import threading
import time
import traceback

import numpy as np
import zmq

from harmony.comm import messages as M
from harmony.comm.sealed import DataKey, SealError, join_address, sealed_socket
from harmony.comm.zmqutil import bind_random, make_socket
from harmony.ps.keymap import block_of
# the table is the shard's; its names stay importable from here
from harmony.ps.table import (AppUpdateError, NonFiniteUpdate, ShardTable,  # noqa: F401
                              first_duplicate)
from harmony.store.blocks import Block
from harmony.store.transfer import Assembler, TransferError

log = logging.getLogger(__name__)

MiB = 1 << 20
#: The largest array frame of a PS request or reply (keys, or rows): the
#: client splits a larger pull or push into requests under it, the shard
#: refuses a larger one, and its socket drops a larger frame before it is
#: read (ZMQ_MAXMSGSIZE; block-transfer chunks are at most 8 MiB).
MAX_FRAME_BYTES = 64 * MiB
#: what a shard (and a PS client) decodes: a small header and at most two
#: array frames (keys and values) or one block chunk
PS_LIMITS = M.Limits(max_bytes=2 * MAX_FRAME_BYTES + MiB, max_header=MiB, max_frames=4,
                     max_str=64 * 1024, max_bin=MiB, max_array=1 << 17, max_map=1024,
                     max_objects=1 << 18)


#: names of the shards' wake-up sockets (inproc, one context)
_WAKE_IDS = itertools.count()


class LocalRequestError(Exception):
    """A request of the shard's own process refused (the message a remote
    client gets in ``ps_error``)."""


def _frame_array(frame, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    buf = frame.buffer if hasattr(frame, "buffer") else memoryview(frame)
    need = int(np.prod(shape)) * dtype.itemsize
    if buf.nbytes != need:
        raise M.ProtocolError(f"array frame has {buf.nbytes} bytes, expected {need}")
    return np.frombuffer(buf, dtype=dtype).reshape(shape)


class ShardServer:
    """Serves one ShardTable on a ROUTER socket from a background thread.

    Block migration (Cruise's elastic store): ownership moves first, then
    data. :meth:`set_layout` installs the new owner map; from then on a
    request for keys whose block this shard gave away is answered with
    ``ps_moved`` and the map in force (the old owner redirects), and a
    request for keys of a block announced by :meth:`expect` but not arrived
    yet is held until its data arrives (the new owner queues). Blocks arrive
    as ``blk`` chunks (:mod:`harmony.store.transfer`): a model block joins
    the table as it arrived (served at once), input blocks are kept for the
    executor. Once the move is over (:meth:`end_arrivals`), the shard's
    thread merges the moved blocks into the sorted table in steps while no
    request waits (:meth:`ShardTable.merge_step`)."""

    #: a merge step waits until no request has come for this long (s), or
    #: until this long after the last step (_merge_gates)
    MERGE_IDLE_S = 0.005
    MERGE_EVERY_S = 0.05

    def __init__(self, ctx: zmq.Context, host: str, table: ShardTable, tag: str = "",
                 key: DataKey | None = None) -> None:
        """``key``: the job attempt's data key: requests and block chunks are
        sealed (:mod:`harmony.comm.sealed`), the socket runs no CurveZMQ, and
        ``endpoint`` is the shard's address (its party id after a '#').
        None: CurveZMQ (with the process's keys) and ``tag`` checked per
        request ("" accepts any)."""
        self.table = table
        self.key = key
        self.tag = "" if key is not None else tag   # the job attempt it serves
        if key is None:
            self.sock = make_socket(ctx, zmq.ROUTER)
        else:
            self.sock = sealed_socket(ctx, zmq.ROUTER, key)
            self.sock.max_bytes = PS_LIMITS.max_bytes
        # a frame larger than any legitimate request is dropped by ZeroMQ
        # (its sender disconnected) before it takes memory here
        self.sock.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES + MiB)
        self.bound = bind_random(self.sock, host)
        self.endpoint = self.bound if key is None else join_address(self.bound,
                                                                    self.sock.party.id)
        self.refused = 0        # sealed messages refused (replayed, forged, altered)
        # the layout (for redirects) and the blocks on their way here
        self.owner: np.ndarray | None = None
        self.me = -1
        self.peers: list[str] = []
        self.incoming: set[int] = set()          # model blocks announced, not arrived
        self._held_requests: list[tuple[bytes, list]] = []
        self._asm = Assembler()
        self._arrived = threading.Condition()
        self.arrived_inputs: dict[int, Block] = {}
        self._arrived_model: set[int] = set()
        self.arrived_count = 0
        self.arrived_bytes = 0
        self.transfer_error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ps-shard", daemon=True)
        self.requests = 0
        self.errors = 0
        # zero-copy replies that still reference the live table: a mutation
        # waits until zmq has finished sending them
        self._inflight: list[zmq.MessageTracker] = []
        # one request at a time: the shard's thread and serve_local (the
        # executor's own client, in its thread) take turns
        self._serving = threading.RLock()
        # the move is over: merge the moved blocks while idle; the wake-up
        # sockets (made by start) end the thread's poll at once when it is
        self._ctx = ctx
        self._merge_due = False
        self._release_held = False      # the move ended: serve the held requests again
        self._last_request = 0.0        # monotonic times: the last request served,
        self._last_step = 0.0           # the merge's last step (or the move's end)
        self._wake_lock = threading.Lock()
        self._wake_rx: zmq.Socket | None = None
        self._wake_tx: zmq.Socket | None = None

    def start(self) -> None:
        wake = f"inproc://ps-wake-{next(_WAKE_IDS)}"
        self._wake_rx = self._ctx.socket(zmq.PAIR)
        self._wake_rx.bind(wake)
        self._wake_tx = self._ctx.socket(zmq.PAIR)
        self._wake_tx.connect(wake)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close(linger=0)
        with self._wake_lock:
            for w in (self._wake_tx, self._wake_rx):
                if w is not None:
                    w.close(linger=0)
            self._wake_tx = None

    # -- migration ---------------------------------------------------------------
    def set_layout(self, owner: np.ndarray, me: int, peers: list[str]) -> None:
        """The owner map in force (ownership moves at this instant)."""
        with self.table.lock:
            self.owner = np.asarray(owner, dtype=np.int64)
            self.me = me
            self.peers = list(peers)
            self.table.set_blocks(len(self.owner))

    def expect(self, model_blocks: set[int]) -> None:
        """Model blocks on their way here: requests for them wait."""
        with self._arrived:
            self.incoming |= {int(b) for b in model_blocks} - self._arrived_model

    def wait_arrivals(self, count: int, timeout_s: float) -> None:
        """Block until ``count`` blocks (model and input) have arrived."""
        deadline = time.monotonic() + timeout_s
        with self._arrived:
            while self.arrived_count < count:
                if self.transfer_error:
                    raise TransferError(self.transfer_error)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TransferError(f"{count - self.arrived_count} of {count} block(s) "
                                        f"did not arrive in {timeout_s:.0f}s")
                self._arrived.wait(min(left, 0.5))

    def end_arrivals(self) -> dict[int, Block]:
        """Stop accepting blocks; hand over the input blocks that came. The
        model blocks that came are served already; the shard's thread merges
        them into its sorted table from now on, between requests (until a
        block of the next move arrives). Requests held for a block that did
        not come are answered now (an error, or a redirect where another
        shard owns it)."""
        self._merge_due = self.table.moved_blocks > 0
        self._last_step = time.monotonic()
        with self._arrived:
            inputs, self.arrived_inputs = self.arrived_inputs, {}
            self.arrived_count = 0
            self._arrived_model.clear()
            self.incoming.clear()
            self.transfer_error = None
        # no block comes any more: what waited for one is answered now (a
        # move that ended short would otherwise leave it to the client's timeout)
        self._release_held = True
        with self._wake_lock:
            if self._wake_tx is not None:
                try:
                    self._wake_tx.send(b"", zmq.NOBLOCK)
                except zmq.ZMQError:
                    pass        # a wake-up is pending already
        return inputs

    def _on_block(self, ident: bytes, msg: M.Message) -> None:
        # only the job attempt's own executors move blocks here: every chunk
        # is sealed under the attempt's key (a sealed shard: the socket
        # opened it) or carries the attempt's secret, as pulls and pushes do. A chunk
        # without it is refused and changes nothing (no transfer error: a
        # stranger cannot fail the move). Blocks of a move may arrive
        # before this executor has read the master's plan (the senders read
        # it first): they are kept and counted all the same.
        if self.tag and not hmac.compare_digest(str(msg.get("tag") or ""), self.tag):
            return self._send(ident, [M.encode("blk_ack", mid=msg["mid"], sec=msg["sec"],
                                               bid=msg["bid"], ok=False,
                                               error="block for another job attempt (or "
                                                     "without its secret)")])
        self._merge_due = False         # a move under way: no merge until it is over
        try:
            done = self._asm.add(msg)
            if done is None:
                return
            mid, sec, bid, blk = done
            if not isinstance(blk, Block):
                raise TransferError(f"{sec} block {bid} arrived as bytes, not as a block")
            if sec == "model":
                self.table.add_rows(blk["keys"], blk["rows"], bid)
            elif sec == "input":
                blk.id = bid
            else:
                raise TransferError(f"unknown block section {sec!r}")
        except (TransferError, ValueError, KeyError) as exc:
            with self._arrived:
                self.transfer_error = str(exc)
                self._arrived.notify_all()
            return self._send(ident, [M.encode("blk_ack", mid=msg["mid"], sec=msg["sec"],
                                               bid=msg["bid"], ok=False, error=str(exc))])
        with self._arrived:
            if sec == "model":
                self.incoming.discard(bid)
                self._arrived_model.add(bid)
            else:
                self.arrived_inputs[bid] = blk
            self.arrived_count += 1
            self.arrived_bytes += blk.nbytes
            self._arrived.notify_all()
        self._send(ident, [M.encode("blk_ack", mid=mid, sec=sec, bid=bid, ok=True)])
        if sec == "model":
            self._serve_held()

    def _serve_held(self) -> None:
        """Serve again the requests held for blocks on their way (the new
        owner's queue): answered now, or held again for a block still due.
        The shard's thread only (its socket)."""
        if self._held_requests:
            held, self._held_requests = self._held_requests, []
            for who, body in held:
                self._serve(who, body)

    def _send(self, ident: bytes, reply: list, live: bool = False) -> None:
        try:
            if live and self.key is None:   # sealing copies: nothing stays in flight
                self._inflight.append(
                    self.sock.send_multipart([ident, *reply], copy=False, track=True))
            else:
                self.sock.send_multipart([ident, *reply], copy=False)
            if len(self._inflight) > 64:
                self._inflight = [tr for tr in self._inflight if not tr.done]
        except zmq.ZMQError as exc:
            log.warning("PS reply to vanished peer dropped: %s", exc)

    def _not_here(self, keys: np.ndarray) -> str:
        """For keys this shard does not hold: "wait" (their block is on its
        way here), "moved" (another shard owns it now) or "" (an error)."""
        if self.owner is None:
            return ""
        bids = block_of(keys, len(self.owner))
        missing = ~self.table.holds(keys)
        if self.incoming and np.isin(bids[missing], list(self.incoming)).any():
            return "wait"
        if (self.owner[bids[missing]] != self.me).any():
            return "moved"
        return ""

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(self._wake_rx, zmq.POLLIN)
        next_expiry = 0.0
        while not self._stop.is_set():
            if time.monotonic() >= next_expiry:     # what a sender left half-sent
                next_expiry = time.monotonic() + 1.0
                with self._serving:
                    for mid in self._asm.expire():
                        log.warning("transfer %s sent nothing for %.0fs: dropped",
                                    mid, self._asm.idle_s)
            merging = self._merge_due and self.table.moved_blocks > 0
            due_in = min(self._merge_gates()) if merging else 0.1
            events = dict(poller.poll(max(0, int(due_in * 1000) + (due_in > 0))))
            if self._wake_rx in events:
                while self._wake_rx.poll(0):
                    self._wake_rx.recv()
            if self._release_held:
                self._release_held = False
                self._serve_held()
            if merging:
                idle_left, every_left = self._merge_gates()
                if (idle_left <= 0 and self.sock not in events) or every_left <= 0:
                    self._merge_step()
                    self._last_step = time.monotonic()
            if self.sock not in events:
                continue
            try:
                frames = self.sock.recv_multipart(copy=False)
            except SealError as exc:    # nothing of it is read, nothing answered sealed
                self._refuse(exc)
                continue
            except zmq.Again:           # a sealed message still arriving
                continue
            except zmq.ZMQError:
                if self._stop.is_set():
                    return
                raise
            self._serve(frames[0] if self.key is not None else frames[0].bytes, frames[1:])

    def _refuse(self, exc: SealError) -> None:
        """A message that is not sealed for this shard by its job attempt:
        counted, logged, answered in plain text with why (no secret in it)."""
        self.refused += 1
        if self.refused <= 10 or self.refused % 1000 == 0:      # a flood logs little
            log.warning("PS shard %s refused a message (%d so far): %s", self.bound,
                        self.refused, exc)
        ident = getattr(exc, "ident", None)
        if ident is not None and getattr(exc, "answer", False):    # once a message
            try:
                self.sock.send_plain([ident, M.encode("ps_error", rid=0,
                                                      message=f"refused: {exc}")])
            except zmq.ZMQError:
                pass

    def _merge_gates(self) -> tuple[float, float]:
        """Seconds until each gate of the merge's next step opens: once no
        request has come for MERGE_IDLE_S and none waits (a step holds the
        table for ~2-15 ms, which a request right behind another would wait
        for: a burst of an iteration's, the first pull after a move), or
        MERGE_EVERY_S after the last step whatever waits (under requests
        that never pause, the merge still ends)."""
        now = time.monotonic()
        return (self.MERGE_IDLE_S - (now - self._last_request),
                self.MERGE_EVERY_S - (now - self._last_step))

    def _merge_step(self) -> None:
        t = self.table
        with self._serving:
            with t.lock:
                try:
                    more = t.merge_step()
                except Exception as exc:      # the moved blocks stay where they are
                    log.warning("merging moved blocks into the shard's table failed: %s", exc)
                    more = False
        if not more:
            self._merge_due = False

    def _serve(self, ident: bytes, body: list) -> None:
        with self._serving:
            self._serve_locked(ident, body)
            self._last_request = time.monotonic()

    @staticmethod
    def _request_error(exc: Exception) -> Exception:
        """What a failed request answers: protocol, key and value errors as
        they are; anything else (an app's update) as AppUpdateError naming
        where it was raised."""
        if isinstance(exc, (M.ProtocolError, KeyError, ValueError)):
            return exc
        tb = traceback.extract_tb(exc.__traceback__)
        return AppUpdateError(f"{exc.__class__.__name__}: {exc}"
                              + (f" (at {tb[-1].filename}:{tb[-1].lineno})" if tb else ""))

    def serve_local(self, kind: str, keys: np.ndarray, vals: np.ndarray | None = None):
        """A pull or push of this process's own client, served in the
        caller's thread. The ZeroMQ round trip through the shard's thread
        costs several thread wake-ups, each up to a scheduler time slice on
        a loaded machine (measured: a 40 KB push 0.8 ms idle, 6 ms at load
        average 7 on 2 cores). Same table operations and checks as a
        request over the socket. Returns the rows of a pull (the caller's
        own array: the table's rows copied, or the gather that already is
        a copy), True
        for an applied push, or None where the shard's thread must answer
        (keys not here: a block on its way or moved; shard not ready).
        A refused request raises :class:`LocalRequestError` with the message
        a remote client would get."""
        t = self.table
        with self._serving:
            self._last_request = time.monotonic()
            if not t.ready:
                return None
            self.requests += 1
            try:
                if kind == "pull":
                    with t.lock:
                        rows = t.pull(keys)
                        # a copy only where the answer is the live table (a
                        # gather is one already: one copy of the rows, not two)
                        return np.array(rows) if t.live(rows) or not rows.flags.owndata \
                            else rows
                self.wait_sends()
                with t.lock:
                    t.push(keys, vals)
                return True
            except KeyError:
                self.requests -= 1
                return None
            except Exception as exc:
                self.errors += 1
                err = self._request_error(exc)
                log.warning("PS request failed: %s", err)
                raise LocalRequestError(str(err)) from None

    def _serve_locked(self, ident: bytes, body: list) -> None:
        try:
            reply, live = self._handle(ident, body)
            if reply is None:       # answered already (a block chunk, a push) or held
                if live:
                    self._held_requests.append((ident, body))
                return
        except Exception as exc:  # never let one request kill the shard
            self.errors += 1
            exc = self._request_error(exc)
            log.warning("PS request failed: %s", exc)
            rid = 0
            try:
                rid = int(M.decode(body[:1], PS_LIMITS).get("rid", 0))
            except Exception:
                pass
            reply, live = [M.encode("ps_error", rid=rid, message=str(exc))], False
        self._send(ident, reply, live)

    def _handle(self, ident: bytes, body: list) -> tuple[list | None, bool]:
        msg = M.decode(body, PS_LIMITS)
        if msg.type == "blk":
            self._on_block(ident, msg)
            return None, False
        self.requests += 1
        t = self.table
        if msg.type not in ("pull", "push"):
            raise M.ProtocolError(f"unexpected {msg.type!r} on a PS shard")
        if self.tag and not hmac.compare_digest(str(msg["tag"]), self.tag):
            raise ValueError("request for another job attempt (or without its secret)")
        if not t.ready:
            raise ValueError("shard not initialized yet")
        n = msg["n"]
        if n < 0 or len(msg.frames) < 1:
            raise M.ProtocolError(f"{msg.type}: missing keys frame")
        if n * max(8, t.dim * t.dtype.itemsize) > MAX_FRAME_BYTES:
            raise ValueError(f"{msg.type} of {n} rows of {t.dim} x {t.dtype} is over the "
                             f"shard's cap of {MAX_FRAME_BYTES} bytes per frame; split it "
                             f"(PSClient does)")
        keys = _frame_array(msg.frames[0], np.dtype(np.int64), (n,))
        if msg.type == "push" and (msg["dim"] != t.dim or len(msg.frames) < 2):
            raise M.ProtocolError(f"push: dim {msg['dim']} != {t.dim} or missing values frame")
        try:
            if msg.type == "pull":
                with t.lock:
                    rows = t.pull(keys)
                head = M.encode("rows", rid=msg["rid"], n=n, dim=t.dim)
                return [head, rows], t.live(rows)
            vals = _frame_array(msg.frames[1], t.dtype, (n, t.dim))
            self.wait_sends()
            with t.lock:
                # every check (and the app's update) first, nothing changed;
                # then the ack, then the write, all under the table lock: no
                # request (served one at a time) and no reader of the table
                # sees it between the two, so the ack means "applied" to all
                # of them, and the client's wait does not include the write
                write = t.plan_push(keys, vals)
                self._send(ident, [M.encode("ack", rid=msg["rid"])])
                write()
            return None, False
        except KeyError:
            with t.lock:
                why = self._not_here(keys)
            if why == "wait":
                return None, True
            if why == "moved":
                return [M.encode("ps_moved", rid=msg["rid"], owner=self.owner.tolist(),
                                 peers=list(self.peers))], False
            raise

    def wait_sends(self) -> None:
        """Block until no reply references the live table any more."""
        for tr in self._inflight:
            tr.wait()
        self._inflight.clear()
