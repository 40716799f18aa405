"""Checkpoints: where each executor's part is replicated, periodic
checkpoints (due, parts acknowledged, resume point, old parts dropped), the
final checkpoint a finished job keeps for ``harmony model get`` and how
many are kept, and the model's sources for an export."""
from __future__ import annotations

import heapq

from harmony.comm import messages as M
from harmony.master.core.protocol import Send, _err, _msg
from harmony.master.core.records import Run
from harmony.master.core.state import CoreState, executor_message, log
from harmony.master.jobs import Job, JobState


class Checkpoints(CoreState):
    def _resume_sources(self, job: Job) -> dict | None:
        """The job's checkpoint as a launch sees it: every part with the data
        services of the live machines that hold it (the part's own machine
        and its replica)."""
        if not job.resume:
            return None
        parts = []
        for part in job.resume["parts"]:
            srcs = [[h, self.workers[h].data_endpoint] for h in part["holders"]
                    if h in self.workers and self.workers[h].alive
                    and self.workers[h].data_endpoint]
            parts.append({"index": part["index"], "epoch": part["epoch"], "sources": srcs})
        return {"epoch": job.resume["epoch"], "parts": parts}

    def _moving(self) -> set[str]:
        """The machines whose links carry a live move now: every machine of
        a job being resized, old and new."""
        out: set[str] = set()
        for jid, run in self.runs.items():
            rc = run.reconfig
            if rc is not None and jid in self.jobs:
                out.update(self.jobs[jid].workers)
                out.update(rc.to)
        return out

    def _holders_ranked(self) -> list[str]:
        """The live machines with a data service that best take a replica,
        best first: not in a live move, then fewest jobs placed. The first 5
        are enough (a replica and 2 alternates, skipping at most the part's
        own machine and its replica; not a sort of the whole fleet)."""
        placed, moving = self._placed(), self._moving()
        return [m for _, _, m in heapq.nsmallest(
            5, ((w.name in moving, len(placed.get(w.name, ())), w.name)
                for w in self.workers.values() if w.alive and w.data_endpoint))]

    def _replica_alts(self, machines: list[str], replicas: list,
                      ranked: list[str] | None = None) -> list:
        """Per executor, up to 2 more live machines to replicate its part on
        when its replica machine cannot take it (``_holders_ranked``)."""
        ranked = self._holders_ranked() if ranked is None else ranked
        out = []
        for name, rep in zip(machines, replicas):
            skip = {name, rep[0] if rep else None}
            out.append([[m, self.workers[m].data_endpoint] for m in ranked
                        if m not in skip][:2])
        return out

    def _replicas(self, machines: list[str], ranked: list[str] | None = None) -> list:
        """Where each executor's checkpoint part is replicated: the next
        machine of the job, or, for a job on one machine, another live one,
        one whose link carries no live move first, then the one with the
        fewest jobs (``_holders_ranked``; none: the part is kept on its own
        machine only).

        Decision: the link first. In bench/cluster_e2e.py (D = 8) the final
        checkpoints of 1-machine jobs went to the machine with the fewest
        jobs, which was the one a narrowing moved 34-51 MiB into: their
        replicas queued behind the move, 1.4-3.7 s from the job's last
        epoch to its end against 0.1 s in isolated. (Chosen again at each
        checkpoint: ``_fresh_replicas``.)"""
        out = []
        for i, name in enumerate(machines):
            if len(machines) > 1:
                other = machines[(i + 1) % len(machines)]
            else:
                ranked = self._holders_ranked() if ranked is None else ranked
                other = next((m for m in ranked if m != name), None)
            w = self.workers.get(other) if other else None
            out.append([other, w.data_endpoint] if w is not None else None)
        return out

    def _fresh_replicas(self, job: Job) -> dict:
        """The replica machines for a checkpoint ordered now (its holders as
        of now: a move may have started since the attempt did), as the
        fields of ``epoch_sums``."""
        ranked = self._holders_ranked()      # one ranking for both
        replicas = self._replicas(job.workers, ranked)
        self._may_hold_parts(job.id, [r[0] for r in replicas if r])
        return {"replicas": replicas,
                "replica_alts": self._replica_alts(job.workers, replicas, ranked)}

    def _checkpointed(self, job: Job, epoch: int, parts: dict[int, tuple]) -> None:
        """Every part of the checkpoint after ``epoch`` (and its replica) is
        acknowledged: it is the job's resume point now, and older parts on
        the machines can go. ``parts``: index -> (machine, replica, bytes)."""
        job.resume = {"epoch": epoch + 1, "parts": [
            {"index": i, "epoch": epoch, "holders": [m] + ([r] if r else [])}
            for i, (m, r, _) in sorted(parts.items())]}
        job.checkpoint = {"epoch": epoch, "time": self.now,
                          "parts": len(parts),
                          "replicas": sum(1 for _, r, _ in parts.values() if r),
                          "bytes": int(sum(b for _, _, b in parts.values())),
                          "holders": sorted({h for m, r, _ in parts.values()
                                             for h in (m, r) if h})}
        # what a periodic checkpoint (or a pause's: the same content) writes,
        # kept past the final one (the simulator's import reads it:
        # harmony.sim.importer)
        job.checkpoint["periodic_bytes"] = job.checkpoint["bytes"]
        self._persist("save", job)
        self._gc_checkpoints(job.id, epoch, job.checkpoint["holders"])
        self.snapshots.discard(job.id)      # a fresh model export has its checkpoint

    def _gc_checkpoints(self, job_id: str, keep: int | None,
                        holders: list[str] | None = None) -> None:
        """Tell machines to drop the job's checkpoint parts older than
        ``keep``, or all of them (None: the job ended or its final model is
        dropped). Only the machines that may hold parts are told: those the
        job ran on, those named as its replica targets (so a part whose
        write never finished goes too) and those that acknowledged a part,
        since this master started; every live machine when it does not know
        (after a restart). A periodic checkpoint (``keep``, with the
        machines that hold it: ``holders``) leaves the kept holders and any
        machine not reached as possible holders. At 1,000 machines, telling
        every machine at every checkpoint was the simulator's largest single
        cost."""
        fields = {"job": job_id, "keep": keep}
        out = self._out.append
        known = self._ckpt_at.get(job_id)
        told = set()
        for name in self.workers if known is None else sorted(known):
            w = self.workers.get(name)
            if w is not None and w.alive:
                out(Send(w.ident, "ckpt_gc", fields))
                told.add(name)
        if keep is None:
            self._ckpt_at.pop(job_id, None)
        else:     # what may hold parts now: the kept ones, and machines not told
            self._ckpt_at[job_id] = set(holders or ()) | ((known or set()) - told)

    def _may_hold_parts(self, job_id: str, machines) -> None:
        known = self._ckpt_at.get(job_id)
        if known is not None:
            known.update(m for m in machines if m)

    def _checkpoint_due(self, job: Job, run: Run, epoch: int) -> bool:
        first, at = run.last_ckpt
        return bool((job.ckpt_every and epoch + 1 - first >= job.ckpt_every)
                    or (job.ckpt_seconds and self.now - at >= job.ckpt_seconds))

    @executor_message
    def _on_ckpt_part(self, ident: bytes, msg: M.Message, job: Job, run: Run) -> None:
        if run.ckpt_epoch != msg["epoch"]:
            return
        i = msg["index"]
        if not 0 <= i < len(job.workers):
            return
        run.ckpt_parts[i] = (job.workers[i], msg.get("replica"), msg["bytes"], msg.get("error"))
        self._may_hold_parts(job.id, run.ckpt_parts[i][:2])
        if len(run.ckpt_parts) < len(job.workers):
            return
        ep, parts = run.ckpt_epoch, run.ckpt_parts
        run.ckpt_epoch, run.ckpt_parts = None, {}
        run.last_ckpt = (ep + 1, self.now)
        errors = [f"part {k} on {p[0]}: {p[3]}" for k, p in sorted(parts.items()) if p[3]]
        if errors:
            # degrade, not fail: the job goes on and resumes, if it must,
            # from its last complete checkpoint; the next one is tried as due
            why = "; ".join(errors)
            last = job.checkpoint.get("epoch") if job.checkpoint else None
            note = (f"checkpoint after epoch {ep + 1} skipped ({why}); "
                    + (f"the last complete one is after epoch {last + 1}"
                       if last is not None else "no complete checkpoint yet"))
            job.ckpt_skipped = note
            job.event(self.now, job.state.value, note)
            self._persist("save", job)
            self._dirty = True
            return self._say(f"ckpt:{job.id}", "%s: %s", job.id, note)
        job.ckpt_skipped = None
        self._checkpointed(job, ep, {k: p[:3] for k, p in parts.items()})
        log.info("%s: checkpoint after epoch %d complete (%d part(s), %d replica(s))", job.id,
                 ep, len(parts), job.checkpoint["replicas"])

    # -- model export (harmony model get) ----------------------------------------------------
    @executor_message
    def _on_ckpt_final(self, ident: bytes, msg: M.Message, job: Job, run: Run) -> None:
        i = msg["index"]
        run.final[i] = (job.workers[i], msg.get("replica"), msg.get("bytes") or 0,
                        msg["epoch"], msg.get("error"))
        self._may_hold_parts(job.id, run.final[i][:2])
        if msg.get("error"):
            log.warning("%s: final checkpoint part %d failed: %s", job.id, i, msg["error"])

    def _keep_final(self, job: Job, run: Run) -> str | None:
        """A finished job keeps its final checkpoint (every part written at
        its stop epoch) as ``job.checkpoint`` with ``final`` and ``model``
        (the parts and their holders); its older checkpoints go. Returns why
        not, when it cannot."""
        parts = run.final
        errors = [f"part {i}: {p[4]}" for i, p in sorted(parts.items()) if p[4]]
        epochs = {p[3] for p in parts.values()}
        if errors or len(parts) < len(job.workers) or len(epochs) != 1:
            job.checkpoint = None
            return "; ".join(errors) or (f"final checkpoint incomplete: {len(parts)} of "
                                         f"{len(job.workers)} part(s) at epochs {sorted(epochs)}")
        ep = epochs.pop()
        periodic = (job.checkpoint or {}).get("periodic_bytes")
        job.checkpoint = {
            "epoch": ep, "time": self.now, "parts": len(parts),
            "replicas": sum(1 for p in parts.values() if p[1]),
            "bytes": int(sum(p[2] for p in parts.values())),
            "holders": sorted({h for p in parts.values() for h in p[:2] if h}),
            "final": True,
            "model": [{"index": i, "epoch": ep, "holders": [m] + ([r] if r else [])}
                      for i, (m, r, _, _, _) in sorted(parts.items())]}
        # None: no periodic checkpoint completed (the key says that this
        # master records them: the importer then does not measure a hold)
        job.checkpoint["periodic_bytes"] = periodic
        self._gc_checkpoints(job.id, ep, job.checkpoint["holders"])
        return None

    def _retain_models(self, job: Job | None = None) -> None:
        """Only the ``keep_models`` most recently finished jobs keep their
        final checkpoint; older ones are dropped from the machines. ``job``:
        the one that just finished. The jobs holding one are indexed (from a
        scan of every job once, then as they finish), not found by scanning
        every job ever submitted at each finish."""
        models = self._models
        if models is None or models[0] is not self.jobs:
            models = self._models = (self.jobs, {j.id: j for j in self.jobs.values()})
        held = models[1]
        if job is not None:
            held[job.id] = job
        for jid in [jid for jid, j in held.items() if not (
                j.state == JobState.FINISHED and (j.checkpoint or {}).get("final"))]:
            del held[jid]
        kept = sorted(held.values(), key=lambda j: j.ended or 0.0, reverse=True)
        for job in kept[self.keep_models:]:
            job.checkpoint = None
            self._gc_checkpoints(job.id, None)
            job.event(self.now, job.state.value,
                      f"model dropped: only the {self.keep_models} most recently "
                      f"finished job(s) keep their final checkpoint")
            self._persist("save", job)
            log.info("%s: final checkpoint dropped (retention)", job.id)

    def _on_model_parts(self, ident: bytes, msg: M.Message) -> None:
        """Where a job's model is: its final checkpoint once finished, else
        its latest complete checkpoint. ``fresh`` on a running job: it also
        writes a new checkpoint at its next epoch end (the client waits for
        an epoch newer than the one answered now)."""
        job = self.jobs.get(msg["job"])
        if job is None:
            return self._send(ident, _err("unknown_job", f"no job {msg['job']!r}"))
        if job.state in (JobState.FAILED, JobState.CANCELLED):
            return self._send(ident, _err("no_model", f"{job.id} {job.state.value}: its "
                                                         f"checkpoints were dropped, there is "
                                                         f"no model to export"))
        ck = job.checkpoint or {}
        if job.state == JobState.FINISHED:
            if not ck.get("final"):
                why = next((e[2] for e in reversed(job.events) if str(e[2]).startswith(
                    ("no model kept", "model dropped"))), "it keeps no final checkpoint")
                return self._send(ident, _err("no_model", f"{job.id} finished, but its model "
                                                             f"is not kept ({why})"))
            epoch, parts = ck["epoch"], ck["model"]
        elif job.resume:
            epoch, parts = job.resume["epoch"] - 1, job.resume["parts"]
        else:
            epoch, parts = -1, []
        run = self.runs.get(job.id)
        if msg.get("fresh") and job.state.active and job.id not in self.snapshots \
                and (run is None or (run.ckpt_epoch is None and not run.pausing)):
            self.snapshots.add(job.id)
            log.info("%s: checkpoint at its next epoch end (model export)", job.id)
        pending = job.id in self.snapshots or bool(
            run is not None and job.state.active and (run.ckpt_epoch is not None or run.pausing))
        srcs = [{"index": p["index"], "epoch": p["epoch"],
                 "sources": [[h, self.workers[h].data_endpoint] for h in p["holders"]
                             if h in self.workers and self.workers[h].alive
                             and self.workers[h].data_endpoint]} for p in parts]
        self._send(ident, _msg(
            "model_source", job=job.id, state=job.state.value, epoch=int(epoch), parts=srcs,
            final=bool(ck.get("final")) and job.state == JobState.FINISHED, pending=pending,
            app_name=job.app_name, app_source=job.app_source, args=list(job.args)))
