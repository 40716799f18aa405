"""The scheduler adapter: on a tick after a change, act on memory pressure,
sort the queue, ask the policy (:mod:`harmony.policies`) for a decision on
the cluster view and apply it on one path (``_apply``: profile, start,
pause, move, promote, stop). A preemptive policy is asked only while no
pause or resize is in flight; a start-only one (least-loaded, isolated)
also sees a job larger than the live cluster last, so it does not block
the others."""
from __future__ import annotations

from harmony.master.core.records import Worker
from harmony.master.core.resize import Resize
from harmony.master.core.state import log
from harmony.master.jobs import Job, JobState
from harmony.policies import view as P


class Scheduling(Resize):
    def _schedule(self) -> None:
        live = [w for w in self.workers.values() if w.alive]
        self._memory_pressure(live)
        for jid, at in list(self.mem_wait.items()):
            j = self.jobs.get(jid)
            pausing = j is not None and j.id in self.runs and self.runs[j.id].pausing
            if j is None or j.held or self.ends > at or not (j.state == JobState.PAUSED
                                                              or pausing):
                del self.mem_wait[jid]
            elif j.state == JobState.PAUSED:
                j.reason = "paused: a machine ran out of memory; waits for a job to end"
        if self.policy.preempts and (
                not live or any(r.pausing or r.reconfig for r in self.runs.values())):
            return      # _schedule_full's rule, before the queue is sorted for nothing
        waiting = sorted((j for j in self._open_jobs()
                          if j.id not in self.mem_wait and (j.state == JobState.WAITING or (
                              j.state in (JobState.PAUSED, JobState.PROFILED) and not j.held))),
                         key=lambda j: (j.submitted, j.id))
        if self.policy.preempts:
            return self._schedule_full(live, waiting)
        # a start-only policy (least-loaded, isolated): it only starts waiting jobs
        self._ended = []
        for job in waiting:
            job.reason = "no live workers" if not live else ""
        if not waiting or not live:
            return
        # a job larger than the live cluster waits without blocking the others
        waiting = [j for j in waiting if j.machines <= len(live)] + \
            [j for j in waiting if j.machines > len(live)]
        view = self._view(live, waiting)
        dec = self.policy.decide(view)
        start = dec.start
        load = {w.name: w.jobs for w in view.workers}
        for machines in start.values():
            for n in machines:
                load[n] += 1
        room = sum(1 for n in load.values() if not self.max_jobs or n < self.max_jobs)
        for job in waiting:
            job.reason = (f"needs {job.machines} machines; {len(live)} alive"
                          if job.machines > len(live) else
                          f"machines full ({self.max_jobs} jobs each, --max-jobs-per-machine)"
                          if job.id not in start and job.machines > room else "")
        if dec.profile or dec.start or dec.pause or dec.promote or dec.stop:
            self._apply(dec)

    def _memory_pressure(self, live: list[Worker]) -> None:
        """Act on the block store's "pause me": a machine over its pause
        threshold with everything spilled (``pause_wanted`` in an executor's
        store stats of the latest epoch). The youngest job there leaves it:
        moved live to an idle machine if there is one, else paused until a
        job ends. A job alone on its machine is left to the OOM guard."""
        asks: dict[str, list[Job]] = {}
        for job in self._active():
            if not job.store:
                continue
            last = len(job.epochs) - 1
            for m, st in job.store.items():
                if st.get("pause_wanted") and st.get("epoch", -1) >= last and m in job.workers:
                    asks.setdefault(m, []).append(job)
        # the asker named: the first submitted there
        want = {m: min(js, key=lambda j: (j.submitted, j.id)).id for m, js in asks.items()}
        if not want:
            return
        placed = self._placed()
        busy = {n for n, js in placed.items() if js}
        idle = sorted(w.name for w in live if w.name not in busy)
        for m, asker in sorted(want.items()):
            here = [j for j in placed.get(m, ()) if j.state.active]
            if len(here) < 2:
                continue
            victim = max(here, key=lambda j: (j.started or 0.0, j.id))
            run = self.runs.get(victim.id)
            if run is None or run.pausing or run.reconfig is not None or run.stopping:
                continue
            why = (f"memory: machine {m} is over its pause threshold with everything "
                   f"spilled ({asker} asked)")
            if idle:
                to = [idle.pop(0) if n == m else n for n in victim.workers]
                if self.resize_job(victim, to, f"{why}; moves to {', '.join(to)}"):
                    continue
            self.pause_job(victim, None, f"{why}; waits for a job there to end")
            self.mem_wait[victim.id] = self.ends

    def _schedule_full(self, live: list[Worker], waiting: list[Job]) -> None:
        """A policy that may start, profile, pause, move and promote jobs
        (harmony, muri, slaq): its decisions wait while a pause or a resize
        is still in flight, then the whole decision is applied."""
        if not live or any(r.pausing or r.reconfig for r in self.runs.values()):
            return
        dec = self.policy.decide(self._view(live, waiting))
        if dec.again_at > self.now:
            self.wake_at = min(self.wake_at or dec.again_at, dec.again_at)
        self._ended = []
        for job in waiting:
            if job.state == JobState.WAITING:
                job.reason = dec.wait.get(job.id, "")
        if not (dec.profile or dec.start or dec.pause or dec.promote or dec.stop):
            self._set_predictions(dec)
            if dec.predicted and dec.predicted != self._last_predicted:
                # e.g. a group lost a finished job: the run record must hold
                # the prediction the groups now run under
                self._log_decision(dec)
            return
        self._apply(dec)

    def _apply(self, dec: P.Decision) -> None:
        """The one path every policy's decision takes: profile, promote,
        pause or move (a live resize where possible), stop, start; then the
        predictions and the run record (metrics/decisions.jsonl)."""
        for jid, ms in dec.profile.items():
            self._launch(self.jobs[jid], ms, JobState.PROFILING)
        for jid in dec.promote:
            job = self.jobs[jid]
            job.transition(JobState.RUNNING, f"profiled; stays in {dec.assign.get(jid, '?')} on "
                                             f"{', '.join(job.workers)}", now=self.now)
            self._persist("save", job)
        for jid, to in dec.pause.items():
            job = self.jobs[jid]
            who = "regrouped" if self.policy_name == "harmony" else self.policy_name
            why = (f"{who}: moves to {', '.join(to)}" if to else
                   "profiled; waits for a group" if job.state == JobState.PROFILING else
                   f"{who}: waits")
            # a move of a running job is a live resize (its blocks move over
            # the network); a pause and a resume elsewhere only if not possible
            if not (to and self.resize_job(job, list(to), why)):
                self.pause_job(job, to, why)
        for jid, why in dec.stop.items():
            if jid not in dec.pause:
                self.end_early(self.jobs[jid], f"{self.policy_name}: {why}")
        for jid, ms in dec.start.items():
            self._launch(self.jobs[jid], ms)
        self._set_predictions(dec)
        self._log_decision(dec)
        log.info("scheduler: %s (profile %s, start %s, pause/move %s, promote %s, stop %s)",
                 dec.note, sorted(dec.profile), sorted(dec.start), sorted(dec.pause),
                 dec.promote, sorted(dec.stop))
