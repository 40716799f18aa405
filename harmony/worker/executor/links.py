"""The executor's links: its sockets to the master (``ctl``) and to this
machine's daemon (``dsock``).

Messages to the master and waits for its answers (with pings while it is
quiet, and giving up when it is gone), the BSP barrier, a subtask's slot
from the daemon's queues (:meth:`Links._sub`: ``sync`` to the master or,
with a ``sync_gen``, to the daemon for the job's leader; ``grant``,
``sub_done``, ``preempted``), the daemon's memory sample (``mem_query`` ->
``mem_state``) and the emulated network's throttle for the PS client.
"""
from __future__ import annotations

import logging
import time

import zmq

from harmony import dilation as dil
from harmony.comm import messages as M
from harmony.worker.netem import job_token

log = logging.getLogger("harmony.executor")

PING_AFTER_S = 10.0       # ping the master after this long without a word
MASTER_TIMEOUT_S = 60.0   # and give up after this long


class Aborted(Exception):
    pass


class MasterLost(Exception):
    pass




class Links:
    """The executor's messages to and from the master and its daemon (the
    sockets and the state they use are set up by
    :class:`~harmony.worker.executor.process.Executor`)."""

    DAEMON_REPLY_S = 1.0      # a daemon that does not answer in this long: no news

    def send(self, mtype: str, **fields) -> None:
        self.ctl.send(M.encode(mtype, job=self.job, index=self.index, **fields))

    def _from_master(self, msg: M.Message) -> None:
        self.last_contact = time.monotonic()
        if msg.type == "abort":
            raise Aborted(msg["reason"])
        if msg.type == "error":
            raise RuntimeError(f"master: {msg['code']}: {msg['message']}")

    def _liveness(self) -> None:
        """While waiting long, ping the master; give up when it is gone."""
        quiet = time.monotonic() - self.last_contact
        ping_after = dil.wall(PING_AFTER_S, self.dil)
        if quiet > dil.wall(MASTER_TIMEOUT_S, self.dil):
            raise MasterLost(f"no word from the master for {quiet:.0f}s")
        if quiet > ping_after and time.monotonic() - self.last_ping > ping_after:
            self.last_ping = time.monotonic()
            self.send("ping")

    def wait(self, mtype: str) -> M.Message:
        while True:
            if not self.ctl.poll(1000):
                self._liveness()
                continue
            msg = M.decode(self.ctl.recv_multipart())
            self._from_master(msg)
            if msg.type == mtype:
                return msg
            if msg.type != "pong":
                log.warning("ignoring unexpected %s while waiting for %s", msg.type, mtype)

    def barrier(self, epoch: int, it: int) -> None:
        if self.count == 1 and epoch >= 0:
            return  # nothing to wait for (the -1 barrier also reports "ready")
        self.send("barrier", epoch=epoch, iter=it)
        while True:
            rel = self.wait("release")
            if (rel["epoch"], rel["iter"]) == (epoch, it):
                return

    def _more(self, mtype: str) -> list[M.Message]:
        """Messages of ``mtype`` that have arrived already (no waiting)."""
        out = []
        while self.ctl.poll(0):
            msg = M.decode(self.ctl.recv_multipart())
            self._from_master(msg)
            if msg.type == mtype:
                out.append(msg)
            elif msg.type != "pong":
                log.warning("ignoring unexpected %s while waiting for %s", msg.type, mtype)
        return out

    def _daemon_memory(self) -> dict | None:
        """The daemon's ``mem_state`` for this executor (None: no daemon, or
        no answer in DAEMON_REPLY_S). Other daemon messages read meanwhile
        (grants, preemption news) are kept for :meth:`_sub`."""
        if not self.spec.get("daemon"):
            return None
        self._rid += 1
        rid = self._rid
        try:
            self.dsock.send(M.encode("mem_query", job=self.job, attempt=self.attempt, rid=rid),
                            zmq.NOBLOCK)
        except zmq.ZMQError:
            return None
        deadline = time.monotonic() + self.DAEMON_REPLY_S
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self.dsock.poll(int(left * 1000) + 1):
                return None
            msg = M.decode(self.dsock.recv_multipart())
            if msg.type == "mem_state":
                if msg["rid"] == rid:
                    return msg.fields
            elif msg.type == "preempted":
                self.stood += msg["seconds"]
            else:
                self._held.append(msg)

    def _fail(self, error: str) -> None:
        log.error("job failed: %s", error)
        try:
            self.send("exec_failed", error=error[:8000], attempt=self.attempt)
        except zmq.ZMQError:
            pass

    def _throttle_fn(self, machines: list[str]):
        if self.netem is None:
            return None
        me, token = self.spec["worker"], job_token(self.job)

        def throttle(flows: list[list[tuple[int, int, str]]]) -> None:
            self.net_wait += self.netem.transfer_many(
                [[(me, machines[p], n) if d == "out" else (machines[p], me, n)
                  for p, n, d in legs] for legs in flows], token)
        return throttle

    def _sub(self, kind: str, fn):
        """Run one subtask. In queued (Harmony) mode: report the previous
        subtask to the master's synchronizer, wait for this machine's
        daemon to grant the CPU or NET slot, run, and release the slot."""
        if not self.queued:
            if kind == "cpu" and self.cpu_share is not None:
                with self.cpu_share.busy():     # the emulated machine's cores, shared
                    return fn()
            return fn()
        if self.sync_gen is None:
            self.send("sync", seq=self.seq, next=kind)
        else:
            self.dsock.send(M.encode("sync", job=self.job, index=self.index, seq=self.seq,
                                     next=kind, attempt=self.attempt, gen=self.sync_gen,
                                     prio=self.prio[0 if kind == "cpu" else 1]))
        self.seq += 1
        while True:
            while self.ctl.poll(0):  # pongs, aborts
                self._from_master(M.decode(self.ctl.recv_multipart()))
            if self._held:
                msg = self._held.pop(0)
            elif self.dsock.poll(1000):
                msg = M.decode(self.dsock.recv_multipart())
            else:
                self._liveness()
                continue
            if msg.type == "grant" and msg["seq"] == self.seq:
                break
            if msg.type == "preempted":    # late news of the previous COMP
                self.stood += msg["seconds"]
            elif msg.type == "abort":
                raise Aborted(msg["reason"])
            elif msg.type == "error":
                raise RuntimeError(f"daemon: {msg['code']}: {msg['message']}")
        try:
            return fn()
        finally:
            if kind == "cpu":
                self._read_preempted()
            self.dsock.send(M.encode("sub_done", job=self.job, seq=self.seq))

    def _read_preempted(self) -> None:
        """The daemon sends "preempted" before it continues a stopped COMP,
        so the news is here when that COMP ends; other messages wait."""
        while self.dsock.poll(0):
            msg = M.decode(self.dsock.recv_multipart())
            if msg.type == "preempted":
                self.stood += msg["seconds"]
            else:
                self._held.append(msg)
