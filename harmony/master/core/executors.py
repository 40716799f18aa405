"""The executors' protocol: a job's executors report ready and get
``job_start``; barriers; the subtask synchronizer; epoch sums, with what
happens at the epoch's end (go on, checkpoint, pause, resize, stop); epoch
reports and the profile; pauses, failures and the end of a job's run."""
from __future__ import annotations

import math

from harmony.comm import messages as M
from harmony.master.core.cruise import Cruise
from harmony.master.core.protocol import Send, _msg
from harmony.master.core.records import Phase, Run
from harmony.master.core.state import executor_message, log
from harmony.master.jobs import SETUPS_KEPT, Job, JobState
from harmony.policies import view as P

#: an epoch's timings are those of its slowest (largest) machine, but for
#: these: summed over the job's machines (the job's PS bytes pulled, pushed)
SUMMED_TIMINGS = frozenset({"bytes_pull", "bytes_push"})


def _note_setup(job: Job, msg: M.Message) -> None:
    """Keep an executor's start-up (seconds, CPU seconds, and 1 where it was
    stretched at a dilation: its CPU work then took as long, undilated, as at
    D = 1) on its job."""
    wall, cpu = msg.get("setup_s"), msg.get("setup_cpu")
    if isinstance(wall, (int, float)) and isinstance(cpu, (int, float)) \
            and math.isfinite(wall) and math.isfinite(cpu):
        entry = [round(float(wall), 4), round(float(cpu), 4)]
        if msg.get("setup_stretched"):
            entry.append(1)
        job.setups = (job.setups + [entry])[-SETUPS_KEPT:]


class Executors(Cruise):
    def _machine_ok(self, job: Job, run: Run | None, index: int) -> bool:
        """With keys: the sender is the worker the executor ``index`` runs
        on (or joins, during a resize)."""
        if not self.secure:
            return True
        role, name = self._peer
        if role != "worker":
            return False
        machines = list(job.workers)
        if run is not None and run.reconfig:
            machines += run.reconfig.join
            if 0 <= index < len(run.reconfig.to) and run.reconfig.to[index] == name:
                return True
        return 0 <= index < len(job.workers) and job.workers[index] == name

    def _on_exec_ready(self, ident: bytes, msg: M.Message) -> None:
        job = self.jobs.get(msg["job"])
        run = self.runs.get(msg["job"])
        if job is not None and not self._machine_ok(job, run, msg["index"]):
            return self._send(ident, _msg("abort", reason="not an executor of that job"))
        if msg.get("join"):
            rc = run.reconfig if run is not None else None
            name = self.by_ident.get(ident)
            idx = msg["index"]
            if job is None or rc is None or msg["attempt"] != run.attempt \
                    or not (0 <= idx < len(rc.to)) or rc.to[idx] not in rc.join:
                return self._send(ident, _msg("abort", reason=f"job {msg['job']} is not "
                                                                  f"being resized onto here"))
            name = rc.to[idx]
            rc.ready[name] = dict(msg.fields)
            rc.idents[name] = ident
            _note_setup(job, msg)
            self.exec_ident[ident] = (job.id, idx, run.attempt)
            log.info("%s: %s ready to join (%d of %d)", job.id, name, len(rc.ready),
                     len(rc.join))
            return
        if job is None or run is None or not job.state.active \
                or msg["attempt"] != run.attempt or not (0 <= msg["index"] < len(job.workers)):
            return self._send(ident, _msg("abort", reason=f"job {msg['job']} attempt "
                                                          f"{msg['attempt']} is not running"))
        idx = msg["index"]
        run.ready[idx] = dict(msg.fields)
        run.idents[idx] = ident
        _note_setup(job, msg)
        self.exec_ident[ident] = (job.id, idx, run.attempt)
        if len(run.ready) < len(job.workers):
            return
        shapes = {(r["num_keys"], r["dim"], r["model_blocks"]) for r in run.ready.values()}
        if len(shapes) != 1:
            return self._end(job, JobState.FAILED,
                             f"executors disagree on the model (num_keys, dim, blocks): {sorted(shapes)}")
        (_, _, nblocks), = shapes
        peers = [run.ready[i]["endpoint"] for i in range(len(job.workers))]
        owner = [b % len(peers) for b in range(nblocks)]
        run.owner = owner
        job.layout = None        # every (re)start is even: roles are set by a live resize
        if not run.started:     # (not again for a duplicate ready)
            run.enter(Phase.RUNNING)
        run.last_ckpt = (job.resume["epoch"] if job.resume else 0, self.now)
        ranked = self._holders_ranked()
        replicas = self._replicas(job.workers, ranked)
        alts = self._replica_alts(job.workers, replicas, ranked)
        self._may_hold_parts(job.id, [r[0] for r in replicas if r])
        gen = self._sync_plan(job, run)
        for i in sorted(run.idents):
            self._send(run.idents[i], _msg(
                "job_start", peers=peers, owner=owner, model_blocks=nblocks,
                mode="queued" if self.queued else "free", machines=list(job.workers),
                replicas=replicas, replica_alts=alts, sync_gen=gen))

    def _on_sync_failed(self, ident: bytes, msg: M.Message) -> None:
        """A leader daemon says the job's executors broke the protocol."""
        job, run = self.jobs.get(msg["job"]), self.runs.get(msg["job"])
        if job is None or run is None or run.attempt != msg["attempt"] \
                or run.sync_leader is None or not job.state.active \
                or self.by_ident.get(ident) != run.sync_leader:
            return
        self._end(job, JobState.FAILED, f"{msg['error']} (from its synchronizer, "
                                        f"{run.sync_leader})")

    @executor_message
    def _on_barrier(self, ident: bytes, msg: M.Message, job: Job, run: Run) -> None:
        f = msg.fields
        key = (f["epoch"], f["iter"])
        arrived = run.barriers.get(key)
        if arrived is None:
            arrived = run.barriers[key] = set()
        arrived.add(f["index"])
        if len(arrived) == len(job.workers):
            del run.barriers[key]
            rel = {"epoch": key[0], "iter": key[1]}
            out = self._out.append
            for i in self._all_idents(run):
                out(Send(i, "release", rel))

    @executor_message
    def _on_sync(self, ident: bytes, msg: M.Message, job: Job, run: Run) -> None:
        """The subtask synchronizer: once every machine of the job finished
        subtask ``seq``, enqueue subtask ``seq + 1`` on all of them. The
        master handles one message at a time and sends to the daemons in
        the same order, so co-located jobs' subtasks are enqueued in the
        same order on every machine of a group."""
        if run.sync_leader is not None:
            return              # a leader daemon synchronizes this layout
        f = msg.fields
        nxt, seq = f["next"], f["seq"]
        if nxt != "cpu" and nxt != "net":
            return self._end(job, JobState.FAILED, f"bad subtask kind {nxt!r}")
        got = run.syncs.get(seq)
        if got is None:
            got = run.syncs[seq] = {}
        got[f["index"]] = nxt
        if len(got) < len(job.workers):
            return
        del run.syncs[seq]
        kinds = set(got.values())
        if len(kinds) != 1:
            return self._end(job, JobState.FAILED,
                             f"executors disagree on the next subtask after {msg['seq']}: {got}")
        kind = kinds.pop()
        # the subtask's expected seconds from the job's profile: of two
        # network subtasks on a machine, the shorter leads the link
        prio = self._prio(job)[0 if kind == "cpu" else 1]
        out = _msg("enqueue", job=job.id, seq=seq + 1, kind=kind, prio=float(prio))
        workers, send = self.workers, self._out.append
        for name in job.workers:
            send(Send(workers[name].ident, "enqueue", out[1]))

    @staticmethod
    def _prio(job: Job) -> list[float]:
        """The expected seconds of the job's COMP and network subtasks."""
        p = job.profile
        return [float(p.get("t_cpu") or 0.0), float(p.get("t_net", 0.0) or 0.0) / 2]

    @executor_message
    def _on_epoch_done(self, ident: bytes, msg: M.Message, job: Job, run: Run) -> None:
        f = msg.fields
        ep = f["epoch"]
        if f.get("store") is not None:   # the block store's latest, per machine
            if f["store"].get("pause_wanted"):
                self._dirty = True          # _memory_pressure acts on it
            job.store[job.workers[f["index"]]] = {"epoch": ep, **{
                str(k): v for k, v in f["store"].items()
                if isinstance(v, (int, float, bool)) or (isinstance(v, str) and len(v) < 200)}}
        got = run.sums.get(ep)
        if got is None:
            got = run.sums[ep] = {}
        got[f["index"]] = (f["sums"], f["timings"])
        if len(got) < len(job.workers):
            return
        total: dict[str, float] = {}
        timings: dict[str, float] = {}
        num = (int, float)
        for i in sorted(got):
            sums, tim = got[i]
            for k, v in sums.items():
                if isinstance(v, num):
                    total[k] = total.get(k, 0.0) + v
            for k, v in tim.items():
                if isinstance(v, num):
                    v = float(v)
                    if k in SUMMED_TIMINGS:
                        timings[k] = timings.get(k, 0.0) + v
                    else:
                        w = timings.get(k)
                        # max(0.0, v) as before: the first value counts against 0.0
                        timings[k] = max(0.0 if w is None else w, v)
        if self.cruise and not run.pausing and not run.ending:
            self._cruise(job, run, {i: got[i][1] for i in got})
        del run.sums[ep]
        run.timings[ep] = timings
        rc = run.reconfig
        reconfig = bool(rc and not rc.planned and rc.all_ready() and not run.pausing)
        if reconfig:
            rc.stood_since = self.now
        end = bool(run.ending) and not run.pausing and not reconfig
        ckpt = (not run.pausing and not reconfig and not end and run.ckpt_epoch is None
                and (self._checkpoint_due(job, run, ep) or job.id in self.snapshots))
        if ckpt:
            run.ckpt_epoch, run.ckpt_parts = ep, {}
        out = {"epoch": ep, "sums": total, "pause": run.pausing or None,
               "reconfig": reconfig or None, "checkpoint": ckpt or None, "stop": end or None}
        if ckpt or end or run.pausing or ep + 1 >= job.epoch_budget():
            # where its parts go, chosen now (_replicas); at its last declared
            # epoch the executor's own stop writes the final checkpoint
            out.update(self._fresh_replicas(job))
        if run.sync_leader is not None:    # the syncs carry their subtasks' priority
            out["prio"] = self._prio(job)
        send = self._out.append
        for i in self._all_idents(run):
            send(Send(i, "epoch_sums", out))

    @executor_message
    def _on_epoch_report(self, ident: bytes, msg: M.Message, job: Job, run: Run) -> None:
        if job.epochs and msg["epoch"] <= job.epochs[-1].get("epoch", -1):
            # already recorded (a resent report): a second row, and its
            # timings (gone by now) fed to the profile as zeros, would be wrong
            log.warning("%s: epoch %d reported again; ignored", job.id, msg["epoch"])
            return
        timings = run.timings.pop(msg["epoch"], {})
        job.epochs.append({"epoch": msg["epoch"], "metrics": msg["metrics"],
                           "timings": timings, "time": self.now})
        mine = set(job.workers)
        alone = not any(j is not job and not mine.isdisjoint(j.workers) for j in self._active())
        prev = job.epochs[-2] if len(job.epochs) > 1 else None
        wall = self.now - prev["time"] if prev is not None and \
            prev.get("epoch") == msg["epoch"] - 1 and "time" in prev else None
        job.update_profile(timings, len(job.workers), alone=alone, wall=wall)
        if job.profile.get("samples") in (1, P.PROFILE_SAMPLES):
            self._dirty = True   # a profile became usable: the scheduler may act
        self._persist("save_epoch", job.id, job.epochs[-1])
        self._record("jobs", {"t": self.now, "job": job.id, "epoch": msg["epoch"],
                              "workers": job.workers, "profile": job.profile,
                              "timings": timings})
        if self.predict_epochs and not msg["stop"]:
            self._predict_next(job)
        if msg["stop"]:
            if not run.stopping:
                run.enter(Phase.STOPPING)
            self._persist("save", job)

    @executor_message
    def _on_ping(self, ident: bytes, msg: M.Message, job: Job, run: Run) -> None:
        """An executor waiting for a long time checks that its job still runs."""
        self._send(ident, _msg("pong"))

    @executor_message
    def _on_exec_paused(self, ident: bytes, msg: M.Message, job: Job, run: Run) -> None:
        if not run.pausing or msg["attempt"] != run.attempt:
            return self._end(job, JobState.FAILED, "an executor paused without being asked")
        run.paused[msg["index"]] = (msg["epoch"], msg["version"], msg.get("bytes") or 0)
        run.replicas[msg["index"]] = msg.get("replica")
        if len(run.paused) < len(job.workers):
            return
        epochs = {e for e, _, _ in run.paused.values()}
        if len(epochs) != 1:
            return self._end(job, JobState.FAILED, f"executors paused at different epochs "
                                                   f"{sorted(epochs)}")
        epoch = epochs.pop()
        self.runs.pop(job.id, None)
        for i in run.idents.values():
            self.exec_ident.pop(i, None)
        old = list(job.workers)
        self._checkpointed(job, epoch, {i: (old[i], run.replicas.get(i), run.paused[i][2])
                                        for i in range(len(old))})
        self._set_workers(job, [])
        target = JobState.PROFILED if job.state == JobState.PROFILING and run.pause_to is None \
            and not job.held else JobState.PAUSED
        job.transition(target, f"{run.pause_note}; checkpointed after epoch {epoch} on "
                               f"{', '.join(old)}", now=self.now)
        self._persist("save", job)
        self._dirty = True
        log.info("%s %s after epoch %d", job.id, target.value, epoch)
        if run.pause_to:
            live = [n for n in run.pause_to if n in self.workers and self.workers[n].alive]
            if len(live) == len(run.pause_to):
                self._launch(job, live)

    def _on_exec_failed(self, ident: bytes, msg: M.Message) -> None:
        job, run = self.jobs.get(msg["job"]), self.runs.get(msg["job"])
        if job is not None and not self._machine_ok(job, run, msg["index"]):
            return
        if ident not in self.exec_ident and job is not None and run is not None \
                and job.state.active and msg.get("attempt") == run.attempt \
                and 0 <= msg["index"] < len(job.workers):
            # failed before it was ready (bad app options, bad input): the
            # error itself, not just a log tail, is what the user should see
            name = job.workers[msg["index"]]
            return self._end(job, JobState.FAILED,
                             f"{msg['error']} (executor {msg['index']} on {name})")
        jr = self._exec_run(ident, msg)
        if jr is None:
            return
        job, _ = jr
        name = job.workers[msg["index"]]
        self._end(job, JobState.FAILED, f"{msg['error']} (executor {msg['index']} on {name})")

    @executor_message
    def _on_exec_finished(self, ident: bytes, msg: M.Message, job: Job, run: Run) -> None:
        self._finish_index(job, run, msg["index"])
