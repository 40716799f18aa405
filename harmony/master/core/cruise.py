"""Cruise inside running jobs (``--cruise``): each epoch's per-executor
timings feed the job's estimates; a better role and partition layout on its
machines, worth its move, starts as a live resize. The MILP runs off the
event loop (:class:`Solve` / :class:`Solved`)."""
from __future__ import annotations

from harmony.master.core.protocol import Solve, Solved
from harmony.master.core.records import Run
from harmony.master.core.resize import Resize
from harmony.master.core.state import log
from harmony.master.jobs import Job, JobState


class Cruise(Resize):
    def _cruise(self, job: Job, run: Run, per_index: dict[int, dict]) -> None:
        """Cruise (``--cruise``): feed the epoch's per-executor timings to the
        job's estimates and, when a better role and partition layout on its
        machines is worth its move, start it as a live reconfiguration."""
        from harmony.cruise.adapter import JobCruise
        n = len(job.workers)
        if run.reconfig is not None or job.state != JobState.RUNNING or n < 2:
            return
        if run.cruise is None or run.cruise.n != n:
            run.cruise = JobCruise(n, len(run.owner))
        run.cruise.observe(per_index)
        d_now = [int(per_index[i].get("blocks") or 0) for i in range(n)]
        m_now = [run.owner.count(i) for i in range(n)]
        if sum(d_now) == 0 or run.solving is not None:
            return
        left = max(1, len(job.epochs))
        solve = run.cruise.prepare(d_now, m_now)
        if solve is not None:      # the MILP: off the event loop, then decide
            run.solving = (solve, d_now, m_now, left)
            self._out.append(Solve((job.id, run.attempt, id(run.cruise)), solve))
            return
        self._cruise_decide(job, run, d_now, m_now, left)

    def _solved(self, ev: Solved) -> None:
        """A Cruise solve came back: decide with it, on the layout it was
        asked for, if the job still runs there."""
        jid, attempt, cruise = ev.key
        job, run = self.jobs.get(jid), self.runs.get(jid)
        if run is None or job is None or run.attempt != attempt or run.solving is None:
            return
        solve, d_now, m_now, left = run.solving
        run.solving = None
        if run.cruise is None or id(run.cruise) != cruise:
            return                 # its estimates were dropped meanwhile (a resize)
        if ev.error is not None:   # a solver failure must not stop the master
            log.error("%s: the Cruise optimizer failed: %s", jid, ev.error)
            run.cruise = None
            return
        run.cruise.accept(solve, ev.result)
        if run.reconfig is None and job.state == JobState.RUNNING:
            self._cruise_decide(job, run, d_now, m_now, left)

    def _cruise_decide(self, job: Job, run: Run, d_now: list[int], m_now: list[int],
                       left: int) -> None:
        """Cruise's decision with its last solution (never a solve here)."""
        try:
            prop = run.cruise.propose(d_now, m_now, epochs_left=left, solve_here=False)
        except Exception:          # a solver failure must not stop the master
            log.exception("%s: the Cruise optimizer failed", job.id)
            run.cruise = None
            return
        if run.cruise.view is not None:
            job.cruise = dict(run.cruise.view, at_epoch=len(job.epochs))
        if prop is None:
            return
        layout = {"input": [float(x) for x in prop.d], "model": [float(x) for x in prop.m]}
        note = f"cruise: {prop.reason}"
        if self.resize_job(job, list(job.workers), note, layout):
            run.reconfig.predicted = {"before": prop.now, "after": prop.target,
                                      "move_s": prop.move_s}
            log.info("%s: %s", job.id, note)
