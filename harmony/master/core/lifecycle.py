"""A job's lifecycle on its machines: a launch (a new attempt or a new
launch of the same one) and the leader that synchronizes it, a pause or an early stop asked at the next epoch
end, and every way it leaves them: finished, failed, cancelled, or
requeued after a failure."""
from __future__ import annotations

from harmony.master.core.catalog import Catalog
from harmony.master.core.checkpoints import Checkpoints
from harmony.master.core.protocol import Unreachable, _msg
from harmony.master.core.records import Phase, Run
from harmony.master.core.state import log
from harmony.master.core.views import Views
from harmony.master.jobs import MAX_ATTEMPTS, Job, JobState
from harmony.policies import view as P
from harmony.subtasks.sync import choose_leader


class Lifecycle(Checkpoints, Catalog, Views):
    # -- start -------------------------------------------------------------------------------
    def _launch(self, job: Job, machines: list[str], state: JobState = JobState.RUNNING) -> None:
        # every launch gets a new number (it tags the executors, their
        # messages and PS requests); only failures start a new attempt
        job.launches += 1
        job.attempt = job.failures + 1
        self._set_workers(job, machines)
        self._may_hold_parts(job.id, machines)    # its executors write parts there
        if job.resume:
            # resume: keep the epochs up to the checkpoint, drop any later
            # ones (an attempt that failed after it), in one transaction
            keep = job.resume["epoch"]
            if len(job.epochs) > keep:
                job.epochs = job.epochs[:keep]
                self._persist("trim_epochs", job.id, keep)
        else:
            job.epochs = []
            self._persist("clear_epochs", job.id)
        job.store = {}
        job.error = None
        how = f" (resumes at epoch {job.resume['epoch']})" if job.resume else ""
        job.transition(state, f"attempt {job.attempt} on {', '.join(machines)}{how}"
                       + (f" (launch {job.launches})" if job.launches != job.attempt else ""), now=self.now)
        self.runs[job.id] = Run(job.launches, self.now)
        self._persist("save", job)
        log.info("launching %s attempt %d (launch %d) on %s", job.id, job.attempt,
                 job.launches, machines)
        resume = self._resume_sources(job)
        datasets = self._datasets_for(job)
        run = self.runs[job.id]
        for idx, name in enumerate(machines):
            w = self.workers[name]
            w.launches_sent += 1
            run.launch_seq[name] = w.launches_sent
            self._send(w.ident, _msg(
                "launch", job=job.id, index=idx, count=len(machines), app_name=job.app_name,
                app_source=job.app_source, args=job.args, attempt=job.launches,
                resume=resume, datasets=datasets, secret=self.runs[job.id].secret),
                fail=Unreachable(name, job.id, job.launches, "at launch"))

    def _sync_plan(self, job: Job, run: Run) -> int | None:
        """Appoint the leader that synchronizes this attempt's subtasks on
        its current machines (``harmony.subtasks.sync``) and tell every
        daemon of the job, before its executors hear of the layout. Returns
        the layout's generation, or None: this loop synchronizes the job
        (``--sync master``, not queued, or a daemon that cannot lead)."""
        run.sync_leader = None
        if self.sync != "leader" or not self.queued or not all(
                self.workers[m].sync_endpoint for m in job.workers if m in self.workers) \
                or not all(m in self.workers for m in job.workers):
            return None
        others = [(j.workers, r.sync_leader) for j in self._active()
                  if j is not job and (r := self.runs.get(j.id)) is not None and r.sync_leader]
        leader = choose_leader(list(job.workers), others)
        run.sync_leader, run.sync_gen = leader, run.sync_gen + 1
        plan = _msg("sync_plan", job=job.id, attempt=run.attempt, gen=run.sync_gen,
                    machines=list(job.workers), leader=leader,
                    endpoint=self.workers[leader].sync_endpoint)
        for m in job.workers:
            self._send(self.workers[m].ident, plan)
        log.info("%s: its subtasks are synchronized by %s (layout %d)", job.id, leader,
                 run.sync_gen)
        return run.sync_gen

    def _unreachable(self, ev: Unreachable) -> None:
        """A launch could not be sent: the machine is taken as lost (at
        launch) and the job tries again elsewhere."""
        w = self.workers.get(ev.worker)
        if w is not None and ev.why == "at launch":
            w.alive = False
            self._dirty = True
        job, run = self.jobs.get(ev.job), self.runs.get(ev.job)
        if job is not None and run is not None and run.attempt == ev.attempt \
                and job.state.active:
            self._retry_or_fail(job, f"worker {ev.worker} unreachable {ev.why}")

    def pause_job(self, job: Job, to: list[str] | None, note: str, held: bool = False) -> None:
        """Pause ``job`` at its next epoch end: every executor checkpoints
        its model shard and input state and exits; with ``to``, the job then
        resumes on those machines (a migration). A ``held`` job stays paused
        until the user resumes it."""
        run = self.runs.get(job.id)
        if run is None or run.stopping or run.ending or not job.state.active \
                or run.reconfig is not None:
            return
        if run.pausing:     # asked again (e.g. by its user while a move is on the way)
            run.pause_to, run.pause_note = to, note
        else:
            run.enter(Phase.PAUSING, to=to, note=note)
        job.held = held
        log.info("pausing %s at its next epoch end%s", job.id,
                 f", then resuming on {to}" if to else "")

    def end_early(self, job: Job, note: str) -> bool:
        """Ask a running job to stop at its next epoch end (a scheduler's
        early stop, e.g. MLF-C): its executors take the same path as the
        app's own stop (final checkpoint, exit) and the job ends FINISHED
        with the objective it has reached. False when it is not running (or
        already stopping, pausing or resizing)."""
        run = self.runs.get(job.id)
        if run is None or job.state != JobState.RUNNING or run.stopping or run.pausing \
                or run.ending or run.reconfig is not None:
            return False
        run.enter(Phase.ENDING, note=note)
        job.event(self.now, job.state.value, f"stops at its next epoch end: {note}")
        log.info("%s stops early at its next epoch end: %s", job.id, note)
        return True

    # -- end ---------------------------------------------------------------------------------
    def _note_ended(self, job: Job) -> None:
        """An active job leaves its group: the Harmony policy's completion event."""
        self.ends += 1
        self._progress.pop(job.id, None)    # its view's cache: rebuilt if it runs again
        if job.state.active and job.workers:
            self._ended.append(P.JobView(job.id, job.machines, job.submitted, state="finished",
                                         profile=job.sched_profile(),
                                         workers=tuple(job.workers),
                                         sched_group=job.sched_group))

    def _kill_executors(self, job: Job) -> None:
        run = self.runs.pop(job.id, None)
        joining = run.reconfig.join if run is not None and run.reconfig else []
        for name in list(job.workers) + joining:
            w = self.workers.get(name)
            if w is not None and w.alive:
                self._send(w.ident, _msg("kill", job=job.id))
        if run is not None:
            for ident in list(run.idents.values()) + (
                    list(run.reconfig.idents.values()) if run.reconfig else []):
                self.exec_ident.pop(ident, None)
            job.move = None

    def _end(self, job: Job, state: JobState, note: str) -> None:
        if job.state.terminal:
            return
        self._kill_executors(job)
        if state == JobState.FAILED:
            job.error = note
        self._note_ended(job)
        job.transition(state, note, now=self.now)
        self._unindex(job)          # over: it runs nowhere (its workers stay shown)
        job.resume = None
        self._gc_checkpoints(job.id, None)
        self.snapshots.discard(job.id)
        self._persist("save", job)
        self._dirty = True
        log.info("%s %s: %s", job.id, state.value, note.splitlines()[0] if note else "")

    def _retry_or_fail(self, job: Job, reason: str) -> None:
        if job.state.terminal:
            return
        # a failure: the next launch is a new attempt (pauses, moves and
        # resumes are launches, not attempts: they never count here)
        if job.failures + 1 >= MAX_ATTEMPTS:
            return self._end(job, JobState.FAILED,
                             f"{reason}; gave up after {job.failures + 1} attempts")
        job.failures += 1
        self._kill_executors(job)
        self._note_ended(job)
        job.transition(JobState.WAITING, f"{reason}; requeued", now=self.now)
        self._set_workers(job, [])
        self._persist("save", job)
        self._dirty = True
        log.warning("%s requeued: %s", job.id, reason)

    def _finish_index(self, job: Job, run: Run, index: int) -> None:
        run.finished.add(index)
        if len(run.finished) == len(job.workers):
            if not run.stopping:
                return self._end(job, JobState.FAILED, "executors finished without a stop decision")
            self.runs.pop(job.id, None)
            for i in run.idents.values():
                self.exec_ident.pop(i, None)
            self._note_ended(job)
            job.transition(JobState.FINISHED, f"{len(job.epochs)} epoch(s)" + (
                f"; stopped early: {run.ending}" if run.ending else ""), now=self.now)
            self._unindex(job)
            job.resume = None
            self.snapshots.discard(job.id)
            why = self._keep_final(job, run)
            if why is not None:
                self._gc_checkpoints(job.id, None)
                job.event(self.now, job.state.value, f"no model kept: {why}")
                log.warning("%s: no model kept: %s", job.id, why)
            self._persist("save", job)
            self._retain_models(job)
            self._dirty = True
            log.info("%s finished after %d epochs", job.id, len(job.epochs))
