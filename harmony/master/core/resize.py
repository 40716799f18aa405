"""Live resizes (block migration): a running job moves or resizes onto new
machines, or switches roles on the same ones, while it runs: joiners start,
every executor stops at the next boundary, the plan of moves runs at most
``max_moves`` at a time, and the new layout is committed."""
from __future__ import annotations

from harmony.comm import messages as M
from harmony.master.core.lifecycle import Lifecycle
from harmony.master.core.plans import _layout_summary, balance, shares
from harmony.master.core.protocol import Unreachable, _err, _msg
from harmony.master.core.records import Phase, Reconfig, Run
from harmony.master.core.state import executor_message, log
from harmony.master.jobs import Job, JobState


class Resize(Lifecycle):
    def resize_job(self, job: Job, to: list[str], note: str,
                   layout: dict | None = None) -> bool:
        """Move or resize a running job onto machines ``to`` while it runs:
        executors on machines that stay keep running; machines that join get
        a new executor, which reads the input's metadata meanwhile; at the
        next epoch boundary every executor hands its leaving blocks over
        (ownership first, then data, over ZeroMQ) and the job goes on.
        ``layout`` gives the roles on ``to`` (:class:`Reconfig`); with the
        same machines and a new layout, only blocks move (a role switch)."""
        run = self.runs.get(job.id)
        to = list(dict.fromkeys(to))
        if run is None or not run.started or run.stopping or run.pausing or run.ending \
                or run.reconfig is not None or not job.state.active \
                or (to == job.workers and layout == run.layout) \
                or not to or any(n not in self.workers or not self.workers[n].alive for n in to):
            return False
        if layout is not None:
            for k in ("input", "model"):
                shares(1, len(to), layout[k])        # raises ValueError on bad weights
        join = [n for n in to if n not in job.workers]
        run.enter(Phase.RESIZING,
                  reconfig=Reconfig(to=to, join=join, note=note, t0=self.now, layout=layout))
        job.move = {"from": list(job.workers), "to": to, "state": "starting executors",
                    "blocks": 0, "blocks_moved": 0, "bytes_moved": 0}
        for n in join:
            self.workers[n].launches_sent += 1
            run.launch_seq[n] = self.workers[n].launches_sent
            self._send(self.workers[n].ident, _msg(
                "launch", job=job.id, index=to.index(n), count=len(to), app_name=job.app_name,
                app_source=job.app_source, args=job.args, attempt=run.attempt, join=True,
                datasets=self._datasets_for(job), secret=run.secret),
                fail=Unreachable(n, job.id, run.attempt, "when resizing"))
        job.event(self.now, job.state.value,
                  f"{note}: resizing {', '.join(job.workers)} -> {', '.join(to)}")
        log.info("%s: resizing %s -> %s (%s)", job.id, job.workers, to, note)
        return True

    def _on_resize(self, ident: bytes, msg: M.Message) -> None:
        job = self.jobs.get(msg["job"])
        if job is None:
            return self._send(ident, _err("unknown_job", f"no job {msg['job']!r}"))
        n = msg["machines"]
        nw, ns = msg.get("workers"), msg.get("servers")
        layout = None
        if nw is not None or ns is not None:
            nw, ns = (n if nw is None else nw), (n if ns is None else ns)
            if not (1 <= nw <= n and 1 <= ns <= n and nw + ns >= n):
                return self._send(ident, _err(
                    "bad_request", f"--workers and --servers must be in 1..{n} and cover "
                                   f"the {n} machines (workers + servers >= {n}): the first "
                                   f"W machines hold input, the last S the model"))
            if nw < n or ns < n:
                layout = {"input": [1.0] * nw + [0.0] * (n - nw),
                          "model": [0.0] * (n - ns) + [1.0] * ns}
        placed = self._placed()
        live = sorted((w for w in self.workers.values() if w.alive),
                      key=lambda w: (len(placed.get(w.name, ())), w.name))
        if not 1 <= n <= len(live):
            return self._send(ident, _err("bad_request", f"--machines must be in "
                                                            f"1..{len(live)} (live machines)"))
        if not job.state.active or job.id not in self.runs:
            return self._send(ident, _err("not_active", f"{job.id} is {job.state.value}, "
                                                           f"not running"))
        keep = [m for m in job.workers if m in self.workers and self.workers[m].alive][:n]
        to = keep + [w.name for w in live if w.name not in keep][:n - len(keep)]
        run = self.runs[job.id]
        if to == job.workers and layout == run.layout:
            return self._send(ident, _msg("ok", info={"job": job.id, "machines": to,
                                                          "state": "unchanged"}))
        job.machines = n
        if not self.resize_job(job, to, "resized by user" if layout is None else
                               f"resized by user ({nw} worker(s), {ns} server(s))", layout):
            return self._send(ident, _err("busy", f"{job.id} cannot be resized now (it is "
                                                     f"starting, pausing, stopping or already "
                                                     f"being resized); try again"))
        self._persist("save", job)
        self._send(ident, _msg("ok", info={"job": job.id, "machines": to,
                                               "state": "resizing"}))

    @executor_message
    def _on_at_boundary(self, ident: bytes, msg: M.Message, job: Job, run: Run) -> None:
        rc = run.reconfig
        if rc is None or rc.planned:
            return self._end(job, JobState.FAILED, "an executor stopped for a resize that "
                                                   "was not asked for")
        rc.boundary[msg["index"]] = dict(msg.fields)
        if len(rc.boundary) < len(job.workers):
            return
        seqs = {b["seq"] for b in rc.boundary.values()}
        epochs = {b["epoch"] for b in rc.boundary.values()}
        if len(seqs) != 1 or len(epochs) != 1:
            return self._end(job, JobState.FAILED, f"executors reached the resize at different "
                                                   f"points (epochs {sorted(epochs)}, subtasks "
                                                   f"{sorted(seqs)})")
        self._send_migration(job, run, epochs.pop(), seqs.pop())

    def _send_migration(self, job: Job, run: Run, epoch: int, seq: int) -> None:
        """The plan of a resize: the new owner of every model and input
        block (blocks stay where they are unless their machine leaves or
        holds more than its share), sent to every executor, old and new."""
        rc = run.reconfig
        old, to = list(job.workers), rc.to
        remap = [to.index(m) if m in to else -1 for m in old]
        lay = rc.layout or {}
        model_owner = balance([remap[o] for o in run.owner], len(to), lay.get("model"))
        in_ids, in_old, holder = [], [], {}      # holder: input block -> old index
        for i in sorted(rc.boundary):
            for bid, _ in rc.boundary[i]["inputs"]:
                in_ids.append(int(bid))
                in_old.append(remap[i])
                holder[int(bid)] = i
        in_new = balance(in_old, len(to), lay.get("input"))
        rc.input_counts = [in_new.count(i) for i in range(len(to))]
        workers = len(to) if rc.layout is None else sum(1 for w in lay["input"] if w > 0)
        sends = self._plan_moves(rc, run, old, model_owner, holder, in_ids, in_new)
        expect = [0] * len(to)
        for batch in sends.values():
            for _, _, n in batch:
                expect[n] += 1
        peers = []
        for m in to:
            if m in rc.ready:
                peers.append(rc.ready[m]["endpoint"])
            else:
                peers.append(run.ready[old.index(m)]["endpoint"])
        rc.planned, rc.owner = True, model_owner
        rc.blocks = sum(len(v) for v in sends.values())
        job.move.update({"state": "moving blocks", "blocks": rc.blocks, "epoch": epoch})
        ranked = self._holders_ranked()
        replicas = self._replicas(to, ranked)
        self._may_hold_parts(job.id, [r[0] for r in replicas if r])
        common = dict(count=len(to), peers=peers, owner=model_owner, machines=list(to),
                      seq=seq, epoch=epoch, replicas=replicas, workers=workers,
                      replica_alts=self._replica_alts(to, replicas, ranked),
                      mode="queued" if self.queued else "free")
        # (the simulator counts what each receiver gets from the senders'
        # parts: every part of a plan goes out in this one list of commands)
        for i in range(len(old)):
            rc.sends[run.idents[i]] = sends[i]
            self._send(run.idents[i], _msg("migrate", index=remap[i], sends=sends[i],
                                               expect=expect[remap[i]] if remap[i] >= 0 else 0,
                                               paced=bool(sends[i]), **common))
        for m in rc.join:
            n = to.index(m)
            self._send(rc.idents[m], _msg("migrate", index=n, sends=[], expect=expect[n],
                                              **common))
        log.info("%s: moving %d block(s) after epoch %d: %s -> %s (plan: %s)", job.id,
                 rc.blocks, epoch, old, to, rc.execution.plan.counts())
        self._release_moves(job, rc)

    def _plan_moves(self, rc: Reconfig, run: Run, old: list[str], model_owner: list[int],
                    holder: dict[int, int], in_ids: list[int], in_new: list[int]
                    ) -> dict[int, list]:
        """The resize as Cruise's plan (``harmony.cruise.plan.make_plan``): add,
        switch, move and delete operations with their dependencies, executed
        by :class:`~harmony.cruise.plan.Execution` at most ``max_moves`` moves
        at once over the whole job, the most blocks first. Joiners are ready
        and ownership is handed over before the first move (add and switch
        are done when the plan starts); a machine that leaves gets ``leave``
        once every executor migrated (after its moves: delete). Returns each
        old executor's sends ([store, block, new index]), its moves' blocks."""
        from harmony.cruise.plan import DATA, Execution, Layout, make_plan
        to = rc.to
        cur = Layout(tuple(old), tuple(old[holder[b]] for b in in_ids),
                     tuple(old[o] for o in run.owner))
        tgt = Layout(tuple(to), tuple(to[n] for n in in_new),
                     tuple(to[n] for n in model_owner))
        plan = make_plan(cur, tgt)
        rc.execution = Execution(plan, self.max_moves or max(1, len(plan.moves)))
        sends: dict[int, list] = {i: [] for i in range(len(old))}
        for i, op in enumerate(plan.ops):
            if op.kind != "move":
                continue
            src, dest = old.index(op.machine), to.index(op.dest)
            batch = ([["input", in_ids[p], dest] for p in op.blocks] if op.store == DATA
                     else [["model", b, dest] for b in op.blocks])
            sends[src] += batch
            rc.moves[i] = (run.idents[src], batch)
            rc.left[run.idents[src]] = rc.left.get(run.idents[src], 0) + 1
        return sends

    def _release_moves(self, job: Job, rc: Reconfig) -> None:
        """Start every operation of the plan that may start now."""
        ex = rc.execution
        while True:
            started = ex.start()
            instant = [i for i in started if i not in rc.moves]
            for i in started:
                if i in rc.moves:
                    to, batch = rc.moves[i]
                    self._send(to, _msg("move", op=i, sends=batch))
            for i in instant:           # add, switch (done), delete (at commit)
                ex.done(i)
            if not instant:
                break
        running = sorted(i for i in ex.running if i in rc.moves)
        if job.move is not None:
            job.move.update({"ops": len(ex.plan.ops), "ops_done": len(ex.finished_ops),
                             "moves_running": [str(ex.plan.ops[i]) for i in running]})

    @executor_message
    def _on_moved(self, ident: bytes, msg: M.Message, job: Job, run: Run) -> None:
        rc = run.reconfig
        op = msg["op"]
        if rc is None or rc.execution is None or op not in rc.moves \
                or rc.moves[op][0] != ident or op not in rc.execution.running:
            return self._end(job, JobState.FAILED, f"an executor reported move {op}, which "
                                                   f"it was not sent")
        rc.execution.done(op)
        rc.left[ident] -= 1
        if not rc.left[ident]:
            self._send(ident, _msg("move", op=-1, sends=[]))
        self._release_moves(job, rc)

    @executor_message
    def _on_migrating(self, ident: bytes, msg: M.Message, job: Job, run: Run) -> None:
        rc = run.reconfig
        if rc is None or job.move is None:
            return
        rc.progress[ident] = (msg["bytes_out"], msg["blocks_out"])
        job.move["bytes_moved"] = int(sum(b for b, _ in rc.progress.values()))
        job.move["blocks_moved"] = int(sum(n for _, n in rc.progress.values()))

    @executor_message
    def _on_migrated(self, ident: bytes, msg: M.Message, job: Job, run: Run) -> None:
        rc = run.reconfig
        if rc is None or not rc.planned:
            return self._end(job, JobState.FAILED, "an executor reported a move that was "
                                                   "not planned")
        if rc.left.get(ident):
            return self._end(job, JobState.FAILED, "an executor reported its move done "
                                                   "before the moves it was sent")
        rc.migrated[ident] = dict(msg.fields)
        rc.progress[ident] = (msg["bytes_out"], len(rc.sends.get(ident, ())))
        job.move["bytes_moved"] = int(sum(b for b, _ in rc.progress.values()))
        job.move["blocks_moved"] = int(sum(n for _, n in rc.progress.values()))
        if len(rc.migrated) < len(job.workers) + len(rc.join):
            return
        self._commit_resize(job, run)

    def _commit_resize(self, job: Job, run: Run) -> None:
        """Every block arrived: the new layout is the job's layout."""
        rc = run.reconfig
        old = list(job.workers)
        idents, ready = {}, {}
        for i, m in enumerate(rc.to):
            if m in rc.idents:
                idents[i], ready[i] = rc.idents[m], rc.ready[m]
            else:
                j = old.index(m)
                idents[i], ready[i] = run.idents[j], run.ready[j]
        for j, m in enumerate(old):
            if m not in rc.to:
                ident = run.idents[j]
                self.exec_ident.pop(ident, None)
                self._send(ident, _msg("leave"))
        for i, ident in idents.items():
            self.exec_ident[ident] = (job.id, i, run.attempt)
        run.idents, run.ready, run.owner = idents, ready, rc.owner
        run.layout = rc.layout
        run.cruise = None                 # estimates start again on the new layout
        job.layout = _layout_summary(rc.to, rc.owner, rc.input_counts, rc.layout)
        if job.layout is not None and rc.predicted:
            job.layout["cruise"] = dict(rc.predicted, at_epoch=len(job.epochs))
        run.leave(Phase.RESIZING)
        moved = int(sum(m["bytes_out"] for m in rc.migrated.values()))
        stood = self.now - (rc.stood_since or rc.t0)
        self._move_took.append(self.now - rc.t0)
        self._set_workers(job, rc.to)
        # the block store's stats of machines that left would be summed with
        # the new ones (status, the trace importer's model bytes)
        job.store = {m: st for m, st in job.store.items() if m in rc.to}
        self._may_hold_parts(job.id, rc.to)
        job.move = None
        note = (f"{rc.note}: now on {', '.join(job.workers)} ({rc.blocks} block(s), "
                f"{moved / 2**20:.1f} MiB moved; took {self.now - rc.t0:.2f}s, iterations "
                f"stood {stood:.2f}s)")
        if job.state == JobState.PROFILING:
            job.transition(JobState.RUNNING, note, now=self.now)
        else:
            job.event(self.now, job.state.value, note)
        self._persist("save", job)
        self._dirty = True
        gen = self._sync_plan(job, run)
        for i in sorted(run.idents):
            self._send(run.idents[i], _msg("reconfigured", sync_gen=gen))
        log.info("%s: %s", job.id, note)
