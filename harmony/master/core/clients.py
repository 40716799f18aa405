"""Client requests: submit (checked here, numbered and written by the shell,
then admitted), the job list, a job's status and why it runs where it
runs, cancel, pause, resume, and the cluster's machines."""
from __future__ import annotations

import math
from typing import Any

from harmony.comm import messages as M
from harmony.master.core.lifecycle import Lifecycle
from harmony.master.core.protocol import Admit, _err, _msg
from harmony.master.core.state import log
from harmony.master.jobs import Job, JobState
from harmony.policies import view as P
from harmony.policies.curves import Utility
from harmony.store import datanames as staging

MAX_STATUS_EPOCHS = 1000    # epochs returned by a status request
MAX_APP_SOURCE = M.MAX_APP_SOURCE


class Clients(Lifecycle):
    def _on_submit(self, ident: bytes, msg: M.Message) -> None:
        # The master never compiles or runs an app's source: the client checks
        # it before sending and the executors load it. Only its size is bounded.
        src = msg["app_source"]
        if len(src) > MAX_APP_SOURCE or len(src.encode("utf-8", "surrogatepass")) > MAX_APP_SOURCE:
            return self._send(ident, _err("bad_app", "app file larger than 4 MiB"))
        if not 1 <= msg["machines"] <= 100_000:
            return self._send(ident, _err("bad_request", "--machines must be in 1..100000"))
        if not all(isinstance(a, str) for a in msg["args"]):
            return self._send(ident, _err("bad_request", "app args must be strings"))
        missing = [n for n in staging.refs(msg["args"]) if n not in self.datasets]
        if missing:
            return self._send(ident, _err("unknown_data", f"no staged data set "
                                                             f"{missing[0]!r} ('harmony data "
                                                             f"ls' lists them)"))
        every, secs = msg.get("checkpoint_every"), msg.get("checkpoint_seconds")
        if (every is not None and every < 0) or (secs is not None and secs < 0):
            return self._send(ident, _err("bad_request", "checkpoint intervals must be >= 0"))
        # a job is accepted only once its record is on disk (the shell numbers
        # it and writes it strictly, then answers Admitted or AdmitFailed);
        # while the table cannot be written new jobs are refused, never half kept
        deadline, utility = msg.get("deadline"), msg.get("utility") or ""
        if deadline is not None and not (math.isfinite(deadline) and deadline > 0):
            return self._send(ident, _err("bad_request", "a deadline must be > 0 seconds"))
        if utility:
            try:
                utility = Utility.parse(utility).spec()
            except ValueError as exc:
                return self._send(ident, _err("bad_request", str(exc)))
        job = Job(id="", app_name=msg["app_name"], app_source=src, args=list(msg["args"]),
                  machines=msg["machines"], name=msg.get("name") or "",
                  group=msg.get("group") or "", submitted=self.now, entered=self.now,
                  deadline=None if deadline is None else self.now + float(deadline),
                  utility=utility)
        if every is not None:
            job.ckpt_every = int(every)
        if secs is not None:
            job.ckpt_seconds = float(secs)
        job.event(job.submitted, "waiting", "submitted")
        self._out.append(Admit(ident, job))

    def _admitted(self, ident: bytes, job: Job) -> None:
        self.jobs[job.id] = job
        self._ckpt_at[job.id] = set()        # new: no machine holds its parts yet
        self._arrivals.append(self.now)
        self._dirty = True
        log.info("submitted %s (%s, %d machine(s))", job.id, job.app_name, job.machines)
        self._send(ident, _msg("submitted", job=job.id))

    def _on_list_jobs(self, ident: bytes, msg: M.Message) -> None:
        every = bool(msg.get("all"))
        shown = [j for j in sorted(self.jobs.values(), key=lambda j: j.id)
                 if every or j.retained(self.now, self.retention)]
        self._send(ident, _msg("jobs", jobs=[j.summary(now=self.now) for j in shown],
                               hidden=len(self.jobs) - len(shown),
                               retention=self.retention))

    def _on_job_status(self, ident: bytes, msg: M.Message) -> None:
        job = self.jobs.get(msg["job"])
        if job is None:
            return self._send(ident, _err("unknown_job", f"no job {msg['job']!r}"))
        d = job.detail(now=self.now, max_epochs=MAX_STATUS_EPOCHS)
        d.update(self._group_prediction(job))
        d["why"] = self._why(job)
        d["dilation"] = self.dilation       # its times are undilated seconds
        self._send(ident, _msg("status", job=d))

    def _why(self, job: Job) -> str:
        """Why a job runs where it runs, in words (``harmony status``)."""
        if not job.state.active:
            return job.reason
        on = ", ".join(job.workers)
        if job.state == JobState.PROFILING:
            p = job.profile
            done = p.get("samples", 0) if p.get("machines") == len(job.workers) else 0
            return (f"profiling on {on}, {min(done, P.PROFILE_SAMPLES)} of "
                    f"{P.PROFILE_SAMPLES} epochs")
        mates = sorted(j.id for j in self.jobs.values() if j is not job and j.state.active
                       and set(j.workers) & set(job.workers))
        if job.sched_group and job.predicted:
            group = [j for j in self.jobs.values() if j.state.active
                     and j.sched_group == job.sched_group]
            others = sorted(j.id for j in group if j is not job)
            alone = [p.t_cpu + p.t_net if (p := j.sched_profile()) else 0.0 for j in group]
            if not others:
                return (f"{self.policy_name}: alone in {job.sched_group} on {on}; predicted "
                        f"iteration {job.predicted:.3f}s")
            gain = (f": predicted {sum(alone) / job.predicted - 1:+.0%} throughput over "
                    f"running them one after another" if all(alone) else "")
            return (f"{self.policy_name}: grouped with {', '.join(others)} in "
                    f"{job.sched_group} on {on}{gain}")
        share = f", sharing with {', '.join(mates)}" if mates else ""
        return f"placed by {self.policy_name or 'the policy'} on {on}{share}"

    def _group_prediction(self, job: Job) -> dict[str, Any]:
        """The scheduler's predicted iteration time of the job in its group
        and the measured one (its moving average)."""
        if not job.sched_group or job.predicted is None or not job.state.active:
            return {}
        measured = job.profile.get("t_iter")
        if not measured:
            return {}
        return {"measured_iter": measured,
                "prediction_error": abs(job.predicted - measured) / measured}

    def _on_cancel(self, ident: bytes, msg: M.Message) -> None:
        job = self.jobs.get(msg["job"])
        if job is None:
            return self._send(ident, _err("unknown_job", f"no job {msg['job']!r}"))
        if job.state.terminal:
            return self._send(ident, _err("not_active", f"{job.id} is already {job.state.value}"))
        self._end(job, JobState.CANCELLED, "cancelled by user")
        self._send(ident, _msg("ok", info={"job": job.id, "state": job.state.value}))

    def _on_pause(self, ident: bytes, msg: M.Message) -> None:
        job = self.jobs.get(msg["job"])
        if job is None:
            return self._send(ident, _err("unknown_job", f"no job {msg['job']!r}"))
        if not job.state.active or job.id not in self.runs:
            return self._send(ident, _err("not_active", f"{job.id} is {job.state.value}, "
                                                           f"not running"))
        if self.runs[job.id].reconfig is not None:
            return self._send(ident, _err("busy", f"{job.id} is being resized; pause it "
                                                     f"when the move is done"))
        self.pause_job(job, None, "paused by user", held=True)
        self._send(ident, _msg("ok", info={"job": job.id, "state": "pausing"}))

    def _on_resume(self, ident: bytes, msg: M.Message) -> None:
        job = self.jobs.get(msg["job"])
        if job is None:
            return self._send(ident, _err("unknown_job", f"no job {msg['job']!r}"))
        if job.state not in (JobState.PAUSED, JobState.PROFILED):
            return self._send(ident, _err("not_paused", f"{job.id} is {job.state.value}, "
                                                           f"not paused"))
        machines = msg.get("machines")
        if machines is not None:
            if not 1 <= machines <= 100_000:
                return self._send(ident, _err("bad_request", "--machines must be in 1..100000"))
            job.machines = machines
        job.transition(JobState.WAITING, "resume requested by user", now=self.now)
        job.held = False
        self._persist("save", job)
        self._dirty = True
        self._send(ident, _msg("ok", info={"job": job.id, "state": job.state.value}))

    def _on_cluster_info(self, ident: bytes, msg: M.Message) -> None:
        ws = [{"name": w.name, "host": w.host, "cpus": w.cpus, "memory": w.memory,
               "alive": w.alive, "last_seen": w.last_seen, "revision": w.revision or None,
               "jobs": [j.id for j in self._jobs_on(w.name)],
               "utilization": w.stats[-1] if w.stats else {}}
              for w in sorted(self.workers.values(), key=lambda w: w.name)]
        self._send(ident, _msg("cluster", workers=ws, master={
            "endpoint": self.endpoint, "pid": self.pid, "bad_messages": self.bad_messages,
            "mode": self.mode, "revision": self.revision or None, "dilation": self.dilation}))
