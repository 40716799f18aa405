"""The worker daemons: registration, heartbeats (stats, the executors they
run, reconciled with what should run there), executors that exited, and
liveness: lost machines and launches or resizes that never finished."""
from __future__ import annotations

import signal

from harmony.comm import messages as M
from harmony.master.core.lifecycle import Lifecycle
from harmony.master.core.protocol import _err, _msg
from harmony.master.core.records import Worker
from harmony.master.core.state import log
from harmony.master.jobs import JobState

HEARTBEAT_INTERVAL = 1.0
REJOIN_QUIET_S = 1.5 * HEARTBEAT_INTERVAL   # see core/master.py
LAUNCH_GRACE = 3.0          # s: a launched executor shows up in heartbeats by then
MAX_EXECUTORS = 1024        # job executors a daemon may report in one heartbeat


class Daemons(Lifecycle):
    def _on_register(self, ident: bytes, msg: M.Message) -> None:
        name = msg["name"]
        if float(msg.get("dilation") or 1.0) != self.dilation:
            return self._send(ident, _err("bad_dilation", f"this master runs at dilation "
                                          f"{self.dilation:g}, worker {name} at "
                                          f"{msg.get('dilation') or 1:g}: start it with "
                                          f"--dilation {self.dilation:g}"))
        old = self.workers.get(name)
        if old is not None and old.ident != ident:
            self.by_ident.pop(old.ident, None)
        w = Worker(name, ident, msg["host"], msg["cpus"], msg["memory"], msg["pid"], self.now,
                   data_endpoint=msg.get("data_endpoint") or "", revision=msg.get("revision") or "",
                   sync_endpoint=msg.get("sync_endpoint") or "")
        self.workers[name] = w
        self.by_ident[ident] = name
        # a daemon that registers counts launches from 0: the ones sent to
        # this machine before were seen by an earlier daemon or by none, so
        # any report from this one may say their executors are gone
        for run in self.runs.values():
            if name in run.launch_seq:
                run.launch_seq[name] = 0
        if self.now < self.rejoin_until:      # after a restart: machines still coming back
            self.rejoin_until = min(self.rejoin_max, max(self.rejoin_until,
                                                         self.now + REJOIN_QUIET_S))
        log.info("worker %s registered (%s, %d cpus, %.1f GiB)", name, w.host, w.cpus,
                 w.memory / 2**30)
        self._send(ident, _msg("registered", heartbeat_interval=HEARTBEAT_INTERVAL))
        self._reconcile(w, msg["executors"])
        self._dirty = True

    def _on_heartbeat(self, ident: bytes, msg: M.Message) -> None:
        name = self.by_ident.get(ident)
        w = self.workers.get(name) if name else None
        if w is None or not w.alive:
            return self._send(ident, _err("unknown_worker", "register first"))
        w.last_seen = self.now
        self._send(ident, _msg("hb_ack", tasks=True) if self.task_stream else _msg("hb_ack"))
        if msg.get("tasks") is not None:
            # seconds before the heartbeat, wall: on this clock, / D
            d = self.dilation
            w.tasks.extend([self.now - a / d, self.now - b / d, job, kind]
                           for a, b, job, kind in M.clean_tasks(msg["tasks"]))
        st = msg.get("stats")
        if st is not None:
            # known keys with finite numbers only (M.clean_stats): what is kept
            # per worker and logged is bounded whatever a daemon sends
            clean = M.clean_stats(st)
            if clean is None:
                self._say("stats", "worker %s: heartbeat stats refused (not a map of at most "
                          "%d known numbers)", w.name, M.MAX_STATS_ENTRIES)
            elif "dt" in clean:
                if self.dilation != 1.0:    # on the master's (undilated) clock
                    clean["t"] = self.now
                w.stats.append(clean)
                self._record("machines", {"machine": w.name, **clean})
        executors = msg["executors"]
        if len(executors) > MAX_EXECUTORS:
            self._say("executors", "worker %s reports %d executors; only the first %d are "
                      "reconciled", w.name, len(executors), MAX_EXECUTORS)
            executors = executors[:MAX_EXECUTORS]
        seen = msg.get("launches")
        self._reconcile(w, executors, seen if isinstance(seen, int) and seen >= 0 else None)

    def _reconcile(self, w: Worker, executors: list, seen: int | None = None) -> None:
        """Kill executors a daemon runs for jobs that are not running there,
        and requeue jobs that should run there but whose executor is gone
        (e.g. the daemon restarted). ``seen``: the launches the daemon had
        received when it sent this report: a job whose launch it had not seen
        yet is not gone, however late the report is handled (a loop behind
        its socket requeued 300 jobs at 1,000 machines on the time rule
        alone); without it (a registration), LAUNCH_GRACE seconds after the
        launch."""
        reported = {j for j in executors if isinstance(j, str)}
        for jid in reported:
            job = self.jobs.get(jid)
            run = self.runs.get(jid)
            joining = run.reconfig.join if run is not None and run.reconfig else []
            if job is None or not job.state.active or (w.name not in job.workers
                                                       and w.name not in joining):
                self._send(w.ident, _msg("kill", job=jid))
        on = self._on.get(w.name)       # the jobs placed here (state.py's index)
        if not on or reported.issuperset(on):
            return                          # every one of them reported: the usual case
        now, runs = self.now, self.runs
        gone = [job for jid, job in on.items() if jid not in reported and job.state.active
                and (run := runs.get(jid)) is not None and not run.stopping
                and not run.pausing and now - run.launched > LAUNCH_GRACE
                and (seen is None or run.launch_seq.get(w.name, 0) <= seen)]
        # requeuing one job changes no other job's run: deciding them all
        # first is what deciding them one by one gave (_jobs_on's order)
        for job in self._in_table_order(gone):
            self._retry_or_fail(job, f"its executor on worker {w.name} is gone")

    def _on_exec_exited(self, ident: bytes, msg: M.Message) -> None:
        if ident not in self.by_ident:
            return      # only a registered daemon reports its executors
        name = self.by_ident.get(ident, "?")
        job = self.jobs.get(msg["job"])
        run = self.runs.get(msg["job"]) if job is not None else None
        if run is not None and run.reconfig and name in run.reconfig.join \
                and msg["attempt"] == run.attempt and job.state.active:
            tail = msg["log_tail"].strip()
            return self._retry_or_fail(job, f"the executor joining on {name} exited with code "
                                            f"{msg['code']} during a resize"
                                            + (f"; its log ends with:\n{tail}" if tail else ""))
        if job is None or not job.state.active or name not in job.workers:
            return
        if run is not None and msg["attempt"] != run.attempt:
            return  # a late report about an earlier attempt
        code = msg["code"]
        if run is not None and msg["index"] in run.finished:
            return
        if code == 0 and run is not None and run.pausing:
            return  # its exec_paused is on the way (another path)
        if code == 0 and run is not None and run.stopping:
            # a clean exit after the stop decision: as good as exec_finished
            return self._finish_index(job, run, msg["index"])
        how = f"signal {-code}" if code < 0 else f"code {code}"
        tail = msg["log_tail"].strip()
        what = f"executor {msg['index']} on worker {name} exited with {how}"
        if code in (-signal.SIGKILL, -signal.SIGTERM) and "out of memory" not in tail:
            # killed from outside (not by the app, not by the OOM guard): a
            # fault of the machine, not of the job; it resumes from its last
            # checkpoint, and this counts as a failed attempt
            return self._retry_or_fail(job, what)
        self._end(job, JobState.FAILED, what + (f"; its log ends with:\n{tail}" if tail else ""))

    def _check_liveness(self, now: float) -> None:
        for w in self.workers.values():
            if w.alive and now - w.last_seen > self.heartbeat_timeout:
                w.alive = False
                log.warning("worker %s stopped sending heartbeats", w.name)
                self._rereplicate(w.name)
                for job in self._jobs_on(w.name):
                    self._retry_or_fail(job, f"worker {w.name} lost (no heartbeat for "
                                             f"{now - w.last_seen:.1f}s)")
                self._dirty = True
        for jid, run in list(self.runs.items()):
            job = self.jobs[jid]
            if not run.started and now - run.launched > self.launch_timeout:
                self._retry_or_fail(job, f"executors not ready after {self.launch_timeout:.0f}s")
            elif run.reconfig and now - run.reconfig.t0 > self.launch_timeout:
                self._retry_or_fail(job, f"resize not done after {self.launch_timeout:.0f}s")
            elif run.reconfig and any(not self.workers[m].alive for m in run.reconfig.join
                                      if m in self.workers):
                self._retry_or_fail(job, "a machine joining the job was lost during a resize")
