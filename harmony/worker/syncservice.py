"""A daemon's part of the synchronizer off the master (:mod:`harmony.subtasks.sync`).

One ROUTER socket, where this daemon leads the jobs whose plans name it:
member daemons forward their executors' syncs to it (``lsync``) and it sends
``enqueue`` back on the same connections, so one connection carries a
member's syncs and enqueues in order. One DEALER per leader this daemon's
executors report to. Runs on the daemon's thread and poller.

With keys, the ROUTER is a CURVE server behind the key set's ZAP handler and
a sync is taken only from the worker key of the machine it names; without
keys (a local cluster without security) the name is trusted, as every
message is there. Either way a sync carries the job attempt's secret (the
one its PS shards check), which the master gives only to the job's daemons
in ``launch``: a key holder outside the job, or a stolen key used from
elsewhere, cannot complete, open or fill a job's rounds.
"""
from __future__ import annotations

import hmac
import logging
from collections.abc import Callable

import zmq

from harmony.comm import messages as M
from harmony.comm import security
from harmony.comm.zmqutil import bind_random, make_socket
from harmony.subtasks.queues import Sub
from harmony.subtasks.sync import Enqueue, Failed, Plan, Sync, SyncLeader, SyncRouter

log = logging.getLogger("harmony.worker")

#: an lsync or an enqueue is a few hundred bytes
SYNC_MAX_BYTES = 4096
SYNC_LIMITS = M.Limits(max_bytes=SYNC_MAX_BYTES, max_header=SYNC_MAX_BYTES, max_frames=1,
                       max_str=1024, max_bin=0, max_array=16, max_map=16,
                       max_objects=64)
#: leaders one daemon keeps connections to (one per group it is in; the
#: least recently used is closed past this)
MAX_LEADERS = 256


class SyncService:
    def __init__(self, ctx: zmq.Context, host: str, name: str,
                 enqueue: Callable[[Sub], None], to_master: Callable[..., None],
                 clock: Callable[[], float]) -> None:
        self.ctx, self.name = ctx, name
        self._enqueue, self._to_master, self._clock = enqueue, to_master, clock
        self.sock = make_socket(ctx, zmq.ROUTER)
        self.sock.setsockopt(zmq.MAXMSGSIZE, SYNC_MAX_BYTES)
        self.endpoint = bind_random(self.sock, host)
        self.leader = SyncLeader(name)
        self.router = SyncRouter()
        self._members: dict[str, bytes] = {}         # machine -> its connection here
        self._secrets: dict[str, tuple[int, str]] = {}   # job -> (attempt, its secret)
        self._leaders: dict[str, zmq.Socket] = {}    # leader endpoint -> DEALER
        self._poller: zmq.Poller | None = None
        self.bad = 0

    # -- the daemon's loop ------------------------------------------------------------
    def register(self, poller: zmq.Poller) -> None:
        self._poller = poller
        poller.register(self.sock, zmq.POLLIN)
        for s in self._leaders.values():
            poller.register(s, zmq.POLLIN)

    def sockets(self) -> list[zmq.Socket]:
        return [self.sock, *self._leaders.values()]

    def drain(self, sock: zmq.Socket) -> None:
        """Read what ``sock`` (one of :meth:`sockets`) has."""
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            if sock is self.sock:
                self._from_member(frames)
            else:
                self._from_leader(frames)

    def close(self) -> None:
        for s in [self.sock, *self._leaders.values()]:
            s.close(linger=0)
        self._leaders.clear()

    # -- from the master and this machine's executors --------------------------------------
    def plan(self, msg: M.Message) -> None:
        """``sync_plan`` from the master."""
        machines = msg["machines"]
        if not all(isinstance(m, str) for m in machines) or self.name not in machines:
            log.warning("sync plan of %s refused: not a list of machines with this one",
                        msg["job"])
            return
        try:
            plan = Plan(msg["job"], msg["attempt"], msg["gen"], tuple(machines),
                        msg["leader"], msg["endpoint"])
        except ValueError as exc:
            log.warning("sync plan refused: %s", exc)
            return
        now = self._clock()
        self._apply(self.leader.plan(plan, now))
        for p, s in self.router.plan(plan, now):
            self._forward(p, s)

    def exec_sync(self, msg: M.Message) -> None:
        """An executor of this machine finished a subtask (checked by the
        daemon: its job, attempt and socket)."""
        if msg.get("gen") is None:
            return
        s = Sync(msg["job"], msg["attempt"], msg["gen"], msg["index"], msg["seq"],
                 msg["next"], _prio(msg.get("prio")))
        p = self.router.route(s, self._clock())
        if p is not None:
            self._forward(p, s)

    def launched(self, job: str, attempt: int, secret: str | None) -> None:
        """This machine runs ``attempt`` of ``job``: its secret tags the
        syncs sent for it and is what syncs for it must carry here."""
        self._secrets[job] = (attempt, secret or "")

    def exited(self, job: str, attempt: int) -> None:
        """The job's executor (this attempt) left this machine."""
        self.leader.drop(job, attempt)
        self.router.drop(job, attempt)
        sec = self._secrets.get(job)
        if sec is not None and sec[0] <= attempt:
            del self._secrets[job]

    # -- internals ----------------------------------------------------------------------
    def _forward(self, p: Plan, s: Sync) -> None:
        if p.leader == self.name:
            return self._apply(self.leader.sync(self.name, s, self._clock()))
        sec = self._secrets.get(s.job)
        if sec is None or sec[0] != s.attempt:
            return          # not launched here (an executor checked by the daemon: none)
        sock = self._leader(p.endpoint)
        try:
            sock.send(M.encode("lsync", job=s.job, attempt=s.attempt, gen=s.gen,
                               index=s.index, seq=s.seq, next=s.next, prio=s.prio,
                               machine=self.name, tag=sec[1]), zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            # its leader is gone or stalled: so is a machine of the job, and
            # the master's liveness check requeues it
            log.warning("sync of %s not sent to its leader %s: %s", s.job, p.leader, exc)

    def _leader(self, endpoint: str) -> zmq.Socket:
        sock = self._leaders.pop(endpoint, None)
        if sock is None:
            if len(self._leaders) >= MAX_LEADERS:
                old_ep = next(iter(self._leaders))
                old = self._leaders.pop(old_ep)
                if self._poller is not None:
                    self._poller.unregister(old)
                old.close(linger=0)
            sock = make_socket(self.ctx, zmq.DEALER)
            sock.setsockopt(zmq.MAXMSGSIZE, SYNC_MAX_BYTES)
            sock.connect(endpoint)
            if self._poller is not None:
                self._poller.register(sock, zmq.POLLIN)
        self._leaders[endpoint] = sock      # most recently used last
        return sock

    def _decode(self, frames: list, want: str, who: str) -> M.Message | None:
        """The message ``frames`` hold if it is a well-formed ``want``."""
        try:
            msg = M.decode([f.bytes for f in frames], SYNC_LIMITS)
        except M.ProtocolError as exc:
            self.bad += 1
            log.warning("malformed message from %s: %s", who, exc)
            return None
        if msg.type != want:
            self.bad += 1
            return None
        return msg

    def _from_member(self, frames: list) -> None:
        ident = frames[0].bytes
        msg = self._decode(frames[1:], "lsync", "a member daemon")
        if msg is None:
            return
        keys = security.current()
        if keys is not None and (len(frames) < 2 or keys.worker_name(
                frames[1].get("User-Id")) != msg["machine"]):
            self.bad += 1
            return          # only a machine's own key speaks for it
        sec = self._secrets.get(msg["job"])
        if sec is None or sec[0] != msg["attempt"] or not hmac.compare_digest(
                msg["tag"].encode(), sec[1].encode()):
            self.bad += 1
            return          # not a job attempt this machine runs, or not its secret
        machine = msg["machine"]
        self._members[machine] = ident
        s = Sync(msg["job"], msg["attempt"], msg["gen"], msg["index"], msg["seq"],
                 msg["next"], _prio(msg.get("prio")))
        self._apply(self.leader.sync(machine, s, self._clock()))

    def _from_leader(self, frames: list) -> None:
        msg = self._decode(frames, "enqueue", "a sync leader")
        if msg is None:
            return
        p = self.router.plan_of(msg["job"])
        if p is None:
            return          # the job left this machine
        self._enqueue(Sub(msg["job"], msg["seq"], msg["kind"], _prio(msg.get("prio"))))

    def _apply(self, cmds: list) -> None:
        for c in cmds:
            if isinstance(c, Enqueue):
                if c.machine == self.name:
                    self._enqueue(Sub(c.job, c.seq, c.kind, c.prio))
                    continue
                ident = self._members.get(c.machine)
                if ident is None:
                    log.warning("enqueue of %s for %s: that machine never synced here",
                                c.job, c.machine)
                    continue
                try:
                    self.sock.send_multipart([ident, M.encode(
                        "enqueue", job=c.job, seq=c.seq, kind=c.kind, prio=c.prio)])
                except zmq.ZMQError as exc:
                    log.warning("enqueue of %s not sent to %s: %s", c.job, c.machine, exc)
            elif isinstance(c, Failed):
                log.warning("%s: %s", c.job, c.error)
                self._to_master("sync_failed", job=c.job, attempt=c.attempt, error=c.error)


def _prio(x: object) -> float:
    try:
        v = float(x)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0.0
    return v if 0.0 <= v < float("inf") else 0.0
