"""The master core: its components composed into one class, with the one
entry point :meth:`MasterCore.handle` (and :meth:`MasterCore.recover` after
a restart). See :mod:`harmony.master.core`."""
from __future__ import annotations

from typing import Any

from harmony.master.core.clients import Clients
from harmony.master.core.daemons import HEARTBEAT_INTERVAL, Daemons
from harmony.master.core.dispatch import Dispatch
from harmony.master.core.executors import Executors
from harmony.master.core.protocol import (Admitted, AdmitFailed, Malformed, Received, Solved,
                                          Tick, Unreachable, _err)
from harmony.master.core.scheduling import Scheduling
from harmony.master.core.state import log
from harmony.master.jobs import MAX_ATTEMPTS, JobState

#: after a restart, the requeued jobs wait this long (undilated seconds) for
#: the machines to register again: a daemon told it is unknown registers at
#: its next heartbeat, within two intervals
REJOIN_GRACE_S = 2 * HEARTBEAT_INTERVAL + 1.0
#: ... and while machines keep registering (each one extends the wait to
#: daemons.REJOIN_QUIET_S after it), at most REJOIN_MAX_S after the restart: 1,000
#: machines took 38 s to come back in bench/master_load.py --liveness
REJOIN_MAX_S = 60.0


class MasterCore(Dispatch, Clients, Daemons, Scheduling, Executors):
    """See :mod:`harmony.master.core`. ``jobs`` and ``datasets``: the job
    table and the data catalog as loaded (the shell owns their storage)."""

    # -- the one entry point -----------------------------------------------------------------
    def handle(self, event: Any, now: float) -> list:
        """Apply one event at time ``now``; returns the commands to carry out."""
        self.now = now
        kind = type(event)
        if kind is Received:
            self._dispatch(event)
        elif kind is Tick:
            if now - self._last_check >= self.liveness_every:
                self._last_check = now
                try:
                    self._check_liveness(now)
                except Exception:   # a bug here must not stop the master either
                    log.exception("the liveness check failed")
            if self.wake_at and now >= self.wake_at:
                self.wake_at, self._dirty = 0.0, True
            if self._dirty and now >= self.rejoin_until:
                self._dirty = False
                try:
                    self._schedule()
                except Exception:   # a policy bug must not stop the master
                    log.exception("the scheduler failed; its decision is skipped")
        elif kind is Malformed:
            self.bad_messages += 1
            self._say("malformed", "malformed message from %r: %s", event.ident[:64], event.error)
            self._send(event.ident, _err("bad_message", event.error))
        elif kind is Admitted:
            self._admitted(event.ident, event.job)
        elif kind is AdmitFailed:
            self._say("table_full", "submission refused: %s", event.error)
            self._send(event.ident, _err("table_full", f"{event.error}; the job was not submitted "
                                                       f"(free space in {self.state_dir} and "
                                                       f"submit again)"))
        elif kind is Unreachable:
            self._unreachable(event)
        elif kind is Solved:
            self._solved(event)
        else:
            raise TypeError(f"unknown event {event!r}")
        out, self._out = self._out, []
        return out

    def validate(self) -> None:
        """Check the core's invariants (the simulator with ``validate=True``
        and the tests call it after every event): every attempt is in one
        phase at most (``Run.validate``) and belongs to a job that is not
        over; the machine -> jobs index agrees with a scan of every job
        (``_jobs_on``). A PhaseError (an AssertionError) names what is wrong."""
        from harmony.master.core.records import PhaseError
        errors = self._index_errors()
        if errors:
            raise PhaseError("the machine -> jobs index: " + "; ".join(errors[:5]))
        for jid, run in self.runs.items():
            run.validate(jid)
            job = self.jobs.get(jid)
            if job is None or job.state.terminal:
                raise PhaseError(f"{jid}: attempt {run.attempt} runs for a job that is "
                                 f"{'unknown' if job is None else job.state.value}")
            if run.sync_leader is not None and run.sync_leader not in job.workers:
                # a leader is always a machine of its job: losing it is losing
                # a machine of the job, which the liveness check handles
                raise PhaseError(f"{jid}: its synchronizer {run.sync_leader} is not one "
                                 f"of its machines {job.workers}")

    def recover(self, now: float) -> list:
        """Jobs that were active when the last master stopped go back to the
        queue: they restart from their last pause checkpoint if they have
        one, else from epoch 0; nothing is silently dropped. Paused jobs stay
        paused (their checkpoints are on disk)."""
        self.now = now
        self._reindex()         # the shell loaded the job table
        requeued = False
        for job in self.jobs.values():
            if job.state.active:
                requeued = True
                where = (f"epoch {job.resume['epoch']} (its last checkpoint)" if job.resume
                         else "epoch 0")
                # its run was stopped: that counts as a failed attempt, but a
                # master restart alone never makes a job give up
                job.failures = min(job.failures + 1, MAX_ATTEMPTS - 1)
                job.transition(JobState.WAITING, f"master restarted; requeued (restarts from "
                                                 f"{where})", now=now)
                self._set_workers(job, [])
                self._persist("save", job)
        if requeued:
            # the machines re-register at their next heartbeat (they are
            # told they are unknown): placing the requeued jobs on the first
            # few back would pile them there (seen at 20 machines: 6 jobs
            # on the first 6 back, their epochs 10x slower)
            self.rejoin_until = now + REJOIN_GRACE_S
            self.rejoin_max = now + REJOIN_MAX_S
        out, self._out = self._out, []
        return out
