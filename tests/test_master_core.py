"""The master core as a state machine: events in, commands out, no sockets,
no files, no wall clock (``harmony.master.core``). Message races are played
in the orders a network can deliver them."""
from __future__ import annotations

import pytest

from harmony.comm import messages as M
from harmony.master import core as C
from harmony.master.core.master import REJOIN_GRACE_S
from harmony.master.jobs import JobState


class Cluster:
    """A core with workers registered and helpers to speak for its peers."""

    def __init__(self, machines: int = 2, mode: str = "naive", **kw) -> None:
        self.t = 0.0
        self.core = C.MasterCore(mode=mode, heartbeat_timeout=5.0, launch_timeout=60.0, **kw)
        self.sent: list[C.Send] = []
        self.persisted: list[C.Persist] = []
        self.moved: list[tuple[bytes, int]] = []     # moves reported, in order
        self.core_out: list = []                      # every command the core gave
        for i in range(machines):
            self.msg(f"d:m{i}".encode(), "register", name=f"m{i}", host="h", cpus=2,
                     memory=1 << 30, pid=1, executors=[], data_endpoint=f"tcp://h:{i}")

    def run(self, cmds: list) -> list:
        # the core's invariant that _on_epoch_report's "alone" relies on:
        # every active job has a run (launched, executors not yet ended)
        active = {j.id for j in self.core.jobs.values() if j.state.active}
        assert active <= set(self.core.runs), active - set(self.core.runs)
        self.core.validate()    # phases, and the machine -> jobs index against a scan
        out = []
        self.core_out += cmds
        for c in cmds:
            if isinstance(c, C.Admit):
                c.job.id = f"job-{len(self.core.jobs) + 1:04d}"
                out += self.run(self.core.handle(C.Admitted(c.ident, c.job), self.t))
            else:
                if isinstance(c, C.Send):
                    M.encode(c.type, **c.fields)      # every message it sends is valid
                    self.sent.append(c)
                elif isinstance(c, C.Persist):
                    self.persisted.append(c)
                out.append(c)
        return out

    def msg(self, ident: bytes, mtype: str, **fields) -> list:
        return self.run(self.core.handle(C.Received(ident, M.Message(mtype, fields, [])),
                                         self.t))

    def tick(self, dt: float = 0.0) -> list:
        self.t += dt
        return self.run(self.core.handle(C.Tick(), self.t))

    def to(self, ident: bytes, mtype: str | None = None, since: int = 0) -> list[C.Send]:
        return [s for s in self.sent[since:] if s.to == ident
                and (mtype is None or s.type == mtype)]

    def submit(self, machines: int = 1) -> str:
        self.msg(b"client", "submit", app_name="a.py", app_source="", args=[],
                 machines=machines)
        jid = max(self.core.jobs)
        self.tick()
        return jid

    def start(self, jid: str) -> list[bytes]:
        """Every executor of the job reports ready; returns their idents."""
        job = self.core.jobs[jid]
        run = self.core.runs[jid]
        idents = []
        for i, _ in enumerate(job.workers):
            ident = f"x:{jid}:{i}:{run.attempt}".encode()
            self.msg(ident, "exec_ready", job=jid, index=i, attempt=run.attempt,
                     endpoint=f"tcp://h:{100 + i}", num_keys=8, dim=1, model_blocks=4,
                     local_blocks=1)
            idents.append(ident)
        assert run.started
        return idents

    def do_moves(self, jid: str) -> int:
        """Every executor of ``jid`` makes the moves the master sent it and
        has not reported yet (a paced resize), until none are left; returns
        how many it made."""
        run, made = self.core.runs[jid], 0
        while True:
            rc = run.reconfig
            if rc is None or rc.execution is None:
                return made
            todo = [s for s in self.sent if s.type == "move" and s.fields["op"] >= 0
                    and (s.to, s.fields["op"]) not in self.moved
                    and s.fields["op"] in rc.execution.running]
            if not todo:
                return made
            for s in todo:
                job, idx = s.to.decode().split(":")[1:3]
                self.moved.append((s.to, s.fields["op"]))
                self.msg(s.to, "moved", job=job, index=int(idx), op=s.fields["op"],
                         bytes_out=10 * len(s.fields["sends"]))
                made += 1

    def heartbeat(self, names: list[str]) -> None:
        for n in names:
            self.msg(f"d:{n}".encode(), "heartbeat", name=n, executors=[
                j.id for j in self.core.jobs.values() if j.state.active and n in j.workers])


def test_submit_launch_start_and_finish_without_sockets():
    c = Cluster(machines=2)
    jid = c.submit(machines=2)
    job = c.core.jobs[jid]
    assert job.state == JobState.RUNNING and job.workers == ["m0", "m1"]
    assert [s.fields["index"] for s in c.sent if s.type == "launch"] == [0, 1]
    assert any(p.op == "save" and p.args[0] is job for p in c.persisted)
    ex = c.start(jid)
    assert all(c.to(i, "job_start") for i in ex)
    for i, ident in enumerate(ex):
        c.msg(ident, "epoch_done", job=jid, index=i, epoch=0, sums={"objective": 2.0},
              timings={"comp": 1.0 + i, "pull": 0.5, "push": 0.5, "train": 2.0, "iters": 1,
                       "bytes_pull": 100.0 * (i + 1), "bytes_push": 10.0 * (i + 1),
                       "bytes": 110.0 * (i + 1)})
    sums = c.to(ex[0], "epoch_sums")
    assert sums and sums[-1].fields["sums"] == {"objective": 4.0}
    c.msg(ex[0], "epoch_report", job=jid, index=0, epoch=0, metrics={"objective": 4.0},
          stop=True)
    # an epoch's timings: its slowest (largest) machine's, but the bytes
    # pulled and pushed, summed over the job's machines
    tm = job.epochs[0]["timings"]
    assert (tm["comp"], tm["bytes"]) == (2.0, 220.0)
    assert (tm["bytes_pull"], tm["bytes_push"]) == (300.0, 30.0)
    for i, ident in enumerate(ex):
        c.msg(ident, "exec_finished", job=jid, index=i)
    assert job.state == JobState.FINISHED and job.ended == c.t


def test_the_clock_is_the_events_time():
    c = Cluster(machines=1)
    c.t = 1234.5
    c.heartbeat(["m0"])
    jid = c.submit()
    job = c.core.jobs[jid]
    assert job.submitted == 1234.5 and job.started == 1234.5
    assert all(e[0] == 1234.5 for e in job.events)


def test_a_sync_that_overtakes_another_machines_sync_waits_for_it():
    """The synchronizer enqueues subtask seq+1 only when every machine of
    the job finished seq, whatever order their syncs arrive in, and sends
    the enqueues to every machine in the same order."""
    c = Cluster(machines=2, mode="harmony", policy="colocate")
    jid = c.submit(machines=2)
    ex = c.start(jid)
    n = len(c.sent)
    c.msg(ex[1], "sync", job=jid, index=1, seq=0, next="net")
    assert not [s for s in c.sent[n:] if s.type == "enqueue"]
    c.msg(ex[0], "sync", job=jid, index=0, seq=0, next="net")
    enq = [s for s in c.sent[n:] if s.type == "enqueue"]
    assert [s.to for s in enq] == [b"d:m0", b"d:m1"]
    assert {s.fields["seq"] for s in enq} == {1}
    # a sync repeated by a confused executor does not enqueue twice
    n = len(c.sent)
    c.msg(ex[0], "sync", job=jid, index=0, seq=1, next="cpu")
    c.msg(ex[0], "sync", job=jid, index=0, seq=1, next="cpu")
    assert not [s for s in c.sent[n:] if s.type == "enqueue"]


def _leading_cluster(machines: int = 3, **kw) -> Cluster:
    """Daemons that can lead synchronizers (they registered an endpoint)."""
    c = Cluster(machines=0, mode="harmony", policy="colocate", **kw)
    for i in range(machines):
        c.msg(f"d:m{i}".encode(), "register", name=f"m{i}", host="h", cpus=2,
              memory=1 << 30, pid=1, executors=[], data_endpoint=f"tcp://h:{i}",
              sync_endpoint=f"tcp://h:9{i}")
    return c


def test_a_leader_daemon_synchronizes_and_the_master_hears_no_syncs():
    """#32: every daemon of the job gets the plan before its executors start;
    co-located jobs share the leader, one of their machines; the master
    ignores syncs of a led job; the epoch's answer carries the priorities."""
    c = _leading_cluster()
    a = c.submit(machines=2)
    n = len(c.sent)
    ex = c.start(a)
    job, run = c.core.jobs[a], c.core.runs[a]
    plans = [s for s in c.sent[n:] if s.type == "sync_plan"]
    assert sorted(s.to for s in plans) == sorted(f"d:{m}".encode() for m in job.workers)
    leader = plans[0].fields["leader"]
    assert leader in job.workers and run.sync_leader == leader
    assert plans[0].fields["endpoint"] == f"tcp://h:9{leader[1:]}"
    first_start = next(i for i, s in enumerate(c.sent) if s.type == "job_start")
    assert all(c.sent.index(p) < first_start for p in plans)       # plans first
    assert all(s.fields["sync_gen"] == 1 for s in c.sent[n:] if s.type == "job_start")
    n = len(c.sent)
    for i in range(2):
        c.msg(ex[i], "sync", job=a, index=i, seq=0, next="net")
    assert not [s for s in c.sent[n:] if s.type == "enqueue"]
    c.core.validate()
    # a job placed beside it (colocate: m2 and m0) takes its leader, which
    # is one of its own machines, rather than its own first machine
    b = c.submit(machines=2)
    assert leader == "m0" and c.core.jobs[b].workers == ["m2", "m0"]
    c.start(b)
    assert c.core.runs[b].sync_leader == "m0"


def test_a_sync_failure_counts_only_from_the_jobs_leader():
    c = _leading_cluster()
    a = c.submit(machines=2)
    c.start(a)
    run, job = c.core.runs[a], c.core.jobs[a]
    other = next(m for m in ("m0", "m1", "m2") if m != run.sync_leader)
    c.msg(f"d:{other}".encode(), "sync_failed", job=a, attempt=run.attempt, error="x")
    assert job.state.active
    c.msg(f"d:{run.sync_leader}".encode(), "sync_failed", job=a, attempt=run.attempt,
          error="executors disagree on the next subtask after 3")
    assert job.state == JobState.FAILED and "disagree" in job.error


def test_with_sync_master_or_a_daemon_that_cannot_lead_the_master_synchronizes():
    for c in (_leading_cluster(sync="master"), Cluster(machines=2, mode="harmony",
                                                       policy="colocate")):
        a = c.submit(machines=2)
        n = len(c.sent)
        ex = c.start(a)
        assert not [s for s in c.sent[n:] if s.type == "sync_plan"]
        for i in range(2):
            c.msg(ex[i], "sync", job=a, index=i, seq=0, next="net")
        assert len([s for s in c.sent[n:] if s.type == "enqueue"]) == 2


def test_executors_that_disagree_on_the_next_subtask_fail_the_job():
    c = Cluster(machines=2, mode="harmony", policy="colocate")
    jid = c.submit(machines=2)
    ex = c.start(jid)
    c.msg(ex[0], "sync", job=jid, index=0, seq=0, next="net")
    c.msg(ex[1], "sync", job=jid, index=1, seq=0, next="cpu")
    job = c.core.jobs[jid]
    assert job.state == JobState.FAILED and "disagree on the next subtask" in job.error


def test_a_worker_lost_during_a_barrier_requeues_the_job_and_the_late_barrier_is_refused():
    c = Cluster(machines=3)
    jid = c.submit(machines=2)
    ex = c.start(jid)
    c.msg(ex[0], "barrier", job=jid, index=0, epoch=0, iter=0)
    c.heartbeat(["m0", "m2"])            # m1 stops sending heartbeats
    c.t = 3.0
    c.heartbeat(["m0", "m2"])
    c.tick(3.0)                          # 6 s since m1's last heartbeat > 5 s
    job = c.core.jobs[jid]
    assert not c.core.workers["m1"].alive
    assert job.failures == 1 and "worker m1 lost" in job.events[-2][2] or \
        any("worker m1 lost" in e[2] for e in job.events)
    # requeued, then relaunched on the live machines at once (same tick)
    assert job.state == JobState.RUNNING and "m1" not in job.workers
    n = len(c.sent)
    c.msg(ex[1], "barrier", job=jid, index=1, epoch=0, iter=0)   # from the old attempt
    assert [s.type for s in c.sent[n:]] == ["abort"]
    assert not c.to(ex[0], "release")


def test_a_pause_during_a_move_is_refused_and_the_move_completes():
    c = Cluster(machines=3)
    jid = c.submit(machines=1)
    ex = c.start(jid)
    job = c.core.jobs[jid]
    c.t = 10.0
    c.msg(b"client", "resize", job=jid, machines=2)
    assert c.sent[-1].type == "ok" and c.sent[-1].fields["info"]["machines"] == ["m0", "m1"]
    c.t = 12.5
    n = len(c.sent)
    c.msg(b"client", "pause", job=jid)
    reply = c.sent[n]
    assert reply.type == "error" and reply.fields["code"] == "busy"
    run = c.core.runs[jid]
    assert not run.pausing
    # the joiner gets ready, the epoch ends: the move is planned and done
    launch = [s for s in c.sent if s.type == "launch" and s.fields.get("join")][-1]
    assert launch.to == b"d:m1"
    joiner = f"x:{jid}:1:{run.attempt}:join".encode()
    c.msg(joiner, "exec_ready", job=jid, index=1, attempt=run.attempt, endpoint="tcp://h:9",
          num_keys=8, dim=1, model_blocks=4, local_blocks=0, join=True)
    c.msg(ex[0], "epoch_done", job=jid, index=0, epoch=0, sums={}, timings={})
    assert c.to(ex[0], "epoch_sums")[-1].fields["reconfig"]
    c.msg(ex[0], "at_boundary", job=jid, index=0, epoch=0, seq=7, inputs=[[0, 10], [1, 10]])
    migrate = {s.to: s.fields for s in c.sent if s.type == "migrate"}
    assert set(migrate) == {ex[0], joiner}
    assert migrate[ex[0]]["seq"] == 7 and migrate[joiner]["index"] == 1
    # the joiner reports first: nothing commits until every executor did
    c.msg(joiner, "migrated", job=jid, index=1, bytes_out=0, bytes_in=20, seconds=0.1)
    assert job.workers == ["m0"]
    # m0 sends as the plan says: one move of model blocks, one of input
    assert migrate[ex[0]]["paced"] and not migrate[joiner].get("paced")
    assert c.do_moves(jid) == 2
    assert c.to(ex[0], "move")[-1].fields == {"op": -1, "sends": []}
    c.msg(ex[0], "migrated", job=jid, index=0, bytes_out=20, bytes_in=0, seconds=0.1)
    assert job.workers == ["m0", "m1"] and run.reconfig is None
    assert c.to(joiner, "reconfigured") and c.to(ex[0], "reconfigured")
    # what the move cost, for the policy: decision to end (2.5 s here)
    assert c.core._view([], []).move_cost == pytest.approx(2.5)
    # now a pause is accepted
    c.msg(b"client", "pause", job=jid)
    assert c.core.runs[jid].pausing


def _grow(c: Cluster, machines: int, to: int, model_blocks: int = 24,
          inputs: int = 6) -> tuple[str, list[bytes], list[bytes]]:
    """A job on ``machines`` machines resized to ``to``: every joiner ready,
    every executor at the boundary. Returns the job, its executors and the
    joiners."""
    c.msg(b"client", "submit", app_name="a.py", app_source="", args=[], machines=machines)
    jid = max(c.core.jobs)
    c.tick()
    run = c.core.runs[jid]
    ex = []
    for i in range(machines):
        ex.append(f"x:{jid}:{i}:{run.attempt}".encode())
        c.msg(ex[-1], "exec_ready", job=jid, index=i, attempt=run.attempt,
              endpoint=f"tcp://h:{100 + i}", num_keys=96, dim=1, model_blocks=model_blocks,
              local_blocks=model_blocks // machines)
    c.msg(b"client", "resize", job=jid, machines=to)
    joiners = []
    for s in [s for s in c.sent if s.type == "launch" and s.fields.get("join")]:
        i = s.fields["index"]
        joiners.append(f"x:{jid}:{i}:{run.attempt}:join".encode())
        c.msg(joiners[-1], "exec_ready", job=jid, index=i, attempt=run.attempt,
              endpoint=f"tcp://h:{200 + i}", num_keys=96, dim=1, model_blocks=model_blocks,
              local_blocks=0, join=True)
    for i, e in enumerate(ex):
        c.msg(e, "epoch_done", job=jid, index=i, epoch=0, sums={}, timings={})
    for i, e in enumerate(ex):
        c.msg(e, "at_boundary", job=jid, index=i, epoch=0, seq=3,
              inputs=[[b, 10] for b in range(i * inputs, (i + 1) * inputs)])
    return jid, ex, joiners


@pytest.mark.parametrize("limit", [4, 1, 0])
def test_a_resize_runs_its_plan_at_most_max_moves_moves_at_once_largest_first(limit):
    """2 -> 6 machines: each old machine sends input blocks to each of the 4
    joiners and model blocks to 2 of them (12 moves). The master releases them as Cruise's plan
    says: at most ``limit`` at once over the job (0: all), the most blocks
    first; a sender hears op -1 after its last; every block moves once."""
    c = Cluster(machines=6, max_moves=limit)
    jid, ex, joiners = _grow(c, 2, 6)
    job, run = c.core.jobs[jid], c.core.runs[jid]
    migrate = {s.to: s.fields for s in c.sent if s.type == "migrate"}
    assert all(migrate[e]["paced"] for e in ex)
    assert not any(migrate[j].get("paced") or migrate[j]["sends"] for j in joiners)
    plan = run.reconfig.execution.plan
    assert plan.counts() == {"add": 4, "move": 12}
    sizes, peak = [], 0
    while True:
        open_ = [s for s in c.sent if s.type == "move" and s.fields["op"] >= 0
                 and (s.to, s.fields["op"]) not in c.moved]
        if not open_:
            break
        peak = max(peak, len(open_))
        # report the oldest open move only, so that the next is released alone
        s = open_[0]
        sizes.append(len(s.fields["sends"]))
        c.moved.append((s.to, s.fields["op"]))
        c.msg(s.to, "moved", job=jid, index=ex.index(s.to), op=s.fields["op"], bytes_out=1)
        if limit:
            assert len([x for x in c.sent if x.type == "move" and x.fields["op"] >= 0
                        and (x.to, x.fields["op"]) not in c.moved]) <= limit
    assert peak == (limit or 12)
    if limit:                                   # the model's moves (4 blocks each) first
        assert sizes == [4] * 4 + [1] * 8
    for e in ex:
        assert c.to(e, "move")[-1].fields["op"] == -1
        sent = [tuple(x) for m in c.to(e, "move") for x in m.fields["sends"]]
        assert sorted(sent) == sorted(tuple(x) for x in migrate[e]["sends"])
    assert job.move["ops_done"] == job.move["ops"] == 16
    for e in ex + joiners:
        i = ex.index(e) if e in ex else int(e.decode().split(":")[2])
        c.msg(e, "migrated", job=jid, index=i, bytes_out=0, bytes_in=0, seconds=0.1)
    assert job.workers == [f"m{i}" for i in range(6)] and run.reconfig is None


def test_a_move_that_was_not_sent_or_a_migrated_before_the_moves_fails_the_job():
    c = Cluster(machines=4)
    jid, ex, joiners = _grow(c, 2, 4)
    sent = {s.fields["op"] for s in c.to(ex[0], "move")}
    c.msg(ex[0], "moved", job=jid, index=0, op=max(sent) + 100, bytes_out=1)
    assert c.core.jobs[jid].state == JobState.FAILED
    assert "not sent" in c.core.jobs[jid].error
    c = Cluster(machines=4)
    jid, ex, joiners = _grow(c, 2, 4)
    c.msg(ex[1], "migrated", job=jid, index=1, bytes_out=0, bytes_in=0, seconds=0.1)
    assert c.core.jobs[jid].state == JobState.FAILED
    assert "before the moves" in c.core.jobs[jid].error


def test_a_shrink_drops_the_block_store_stats_of_the_machine_that_left():
    """job.store holds the latest block-store stats per machine of the job:
    after a resize the machine that left is gone from it (status and the
    trace importer sum it)."""
    c = Cluster(machines=2)
    jid = c.submit(machines=2)
    ex = c.start(jid)
    job = c.core.jobs[jid]
    for i in range(2):
        c.msg(ex[i], "epoch_done", job=jid, index=i, epoch=0, sums={}, timings={},
              store={"shard_mb": 1.5, "alpha": 0.0})
    assert set(job.store) == {"m0", "m1"}
    c.msg(b"client", "resize", job=jid, machines=1)
    assert c.sent[-1].type == "ok"
    for i in range(2):
        c.msg(ex[i], "epoch_done", job=jid, index=i, epoch=1, sums={}, timings={},
              store={"shard_mb": 1.5, "alpha": 0.0})
    for i in range(2):
        c.msg(ex[i], "at_boundary", job=jid, index=i, epoch=1, seq=7, inputs=[[i, 10]])
    c.do_moves(jid)
    for i in range(2):
        c.msg(ex[i], "migrated", job=jid, index=i, bytes_out=10 * i, bytes_in=10 * (1 - i),
              seconds=0.1)
    assert job.workers == ["m0"] and c.core.runs[jid].reconfig is None
    assert set(job.store) == {"m0"}


def test_a_master_restart_during_a_pause_requeues_from_the_last_checkpoint():
    c = Cluster(machines=1)
    jid = c.submit()
    ex = c.start(jid)
    job = c.core.jobs[jid]
    c.msg(ex[0], "epoch_done", job=jid, index=0, epoch=0, sums={}, timings={})
    assert c.to(ex[0], "epoch_sums")[-1].fields.get("checkpoint") is None
    # a checkpoint after epoch 0 (asked for by a model export), then a pause
    c.core.snapshots.add(jid)
    c.msg(ex[0], "epoch_done", job=jid, index=0, epoch=1, sums={}, timings={})
    c.msg(ex[0], "ckpt_part", job=jid, index=0, epoch=1, version=1, bytes=100)
    assert job.resume["epoch"] == 2
    c.msg(b"client", "pause", job=jid)
    assert c.core.runs[jid].pausing
    # the master stops before exec_paused arrives; a new core loads the table
    core2 = C.MasterCore({jid: job}, mode="naive")
    cmds = core2.recover(100.0)
    assert job.state == JobState.WAITING and job.failures == 1
    assert "restarts from epoch 2" in job.events[-1][2]
    assert [p.op for p in cmds if isinstance(p, C.Persist)] == ["save"]
    # the old executor's late exec_paused reaches the new core: refused
    out = core2.handle(C.Received(ex[0], M.Message("exec_paused", {
        "job": jid, "index": 0, "attempt": 1, "epoch": 1, "version": 1}, [])), 101.0)
    assert [s.type for s in out if isinstance(s, C.Send)] == ["abort"]
    assert job.state == JobState.WAITING


def _scan_jobs_on(core, name: str) -> list[str]:
    """What ``_jobs_on`` answered before its index: a scan of every job."""
    return [j.id for j in core.jobs.values() if j.state.active and name in j.workers]


def test_the_machine_index_agrees_with_a_scan_of_every_job_through_a_jobs_life():
    """Launch, a heartbeat that reports an executor gone, a lost machine, a
    shrink, a pause and its resume, a finish, a cancel and a master restart:
    after each, ``_jobs_on`` (the machine -> jobs index that heartbeats ask)
    answers what a scan of every job answers, and ``validate`` agrees."""
    c = Cluster(machines=4)
    names = [f"m{i}" for i in range(4)]

    def check(core=None) -> None:
        core = core or c.core
        core.validate()
        for n in names:
            assert [j.id for j in core._jobs_on(n)] == _scan_jobs_on(core, n), n
        # a job that is over runs nowhere: it left the index, its workers stay
        for j in core.jobs.values():
            if j.state.terminal:
                # nor does the view's cache of its progress keep it
                assert j.id not in core._progress, j.id
                assert all(j.id not in core._on.get(n, {}) for n in names)

    a = c.submit(machines=2)
    b = c.submit(machines=2)
    check()
    ex_a = c.start(a)
    c.start(b)
    check()
    # a heartbeat from a machine whose daemon lost b's executor requeues b
    jb = c.core.jobs[b]
    gone = jb.workers[0]
    c.t = 4.0                            # past the launch's grace
    c.heartbeat([n for n in names if n != gone])
    c.msg(f"d:{gone}".encode(), "heartbeat", name=gone, executors=[
        jid for jid in _scan_jobs_on(c.core, gone) if jid != b])
    assert jb.failures == 1
    c.tick()
    check()
    assert jb.state.active
    c.start(b)
    # a shrink of a: 2 machines -> 1
    ja = c.core.jobs[a]
    c.msg(b"client", "resize", job=a, machines=1)
    assert c.sent[-1].type == "ok"
    for i in range(2):
        c.msg(ex_a[i], "epoch_done", job=a, index=i, epoch=0, sums={}, timings={})
    for i in range(2):
        c.msg(ex_a[i], "at_boundary", job=a, index=i, epoch=0, seq=7, inputs=[[i, 10]])
    c.do_moves(a)
    for i in range(2):
        c.msg(ex_a[i], "migrated", job=a, index=i, bytes_out=10 * i, bytes_in=10 * (1 - i),
              seconds=0.1)
    assert len(ja.workers) == 1 and c.core.runs[a].reconfig is None
    check()
    # a machine of b stops sending heartbeats: b is requeued and relaunched
    c.heartbeat(names)
    lost = c.core.jobs[b].workers[-1]
    c.t += 3.0
    c.heartbeat([n for n in names if n != lost])
    c.tick(3.0)
    assert not c.core.workers[lost].alive and c.core.jobs[b].failures == 2
    assert c.core.jobs[b].state.active and lost not in c.core.jobs[b].workers
    check()
    # a pauses (held) and resumes
    c.msg(b"client", "pause", job=a)
    ex_a = ex_a[:1]
    c.msg(ex_a[0], "epoch_done", job=a, index=0, epoch=1, sums={}, timings={})
    c.msg(ex_a[0], "exec_paused", job=a, index=0, attempt=c.core.runs[a].attempt, epoch=1,
          version=1)
    assert ja.state == JobState.PAUSED and ja.workers == []
    check()
    c.msg(b"client", "resume", job=a)
    c.tick()
    assert ja.state.active and ja.workers
    check()
    # a third job finishes (its workers stay, it leaves the index); b is cancelled
    d = c.submit(machines=1)
    assert c.core.jobs[d].state.active
    ex_d = c.start(d)
    c.msg(ex_d[0], "epoch_done", job=d, index=0, epoch=0, sums={}, timings={})
    c.msg(ex_d[0], "epoch_report", job=d, index=0, epoch=0, metrics={}, stop=True)
    c.msg(ex_d[0], "exec_finished", job=d, index=0, attempt=c.core.runs[d].attempt)
    assert c.core.jobs[d].state == JobState.FINISHED and c.core.jobs[d].workers
    check()
    c.msg(b"client", "cancel", job=b)
    assert c.core.jobs[b].state == JobState.CANCELLED
    check()
    # a restarted master loads the table (the shell replaces it) and requeues
    core2 = C.MasterCore(mode="naive")
    core2.jobs = dict(c.core.jobs)
    core2.recover(c.t + 1)
    check(core2)
    assert all(core2._jobs_on(n) == [] for n in names)


def test_exec_exited_before_exec_finished_is_not_a_failure_after_the_stop():
    c = Cluster(machines=1)
    jid = c.submit()
    ex = c.start(jid)
    c.msg(ex[0], "epoch_done", job=jid, index=0, epoch=0, sums={}, timings={})
    c.msg(ex[0], "epoch_report", job=jid, index=0, epoch=0, metrics={}, stop=True)
    # the daemon's exit report overtakes the executor's exec_finished
    c.msg(b"d:m0", "exec_exited", job=jid, index=0, attempt=1, code=0, log_tail="")
    assert c.core.jobs[jid].state == JobState.FINISHED


def test_a_launch_that_cannot_be_sent_marks_the_machine_lost_and_retries():
    c = Cluster(machines=2)
    jid = c.submit()
    launch = [s for s in c.sent if s.type == "launch"][-1]
    assert isinstance(launch.fail, C.Unreachable)
    c.run(c.core.handle(launch.fail, c.t))
    job = c.core.jobs[jid]
    assert not c.core.workers[launch.fail.worker].alive
    assert job.failures == 1 and job.state == JobState.WAITING
    c.tick()
    assert job.state == JobState.RUNNING and job.workers != [launch.fail.worker]


@pytest.mark.parametrize("mtype,fields", [
    ("sync", {"seq": 0, "next": "net"}), ("epoch_done", {"epoch": 0, "sums": {}, "timings": {}}),
    ("barrier", {"epoch": 0, "iter": 0}), ("exec_finished", {}),
])
def test_executor_messages_from_strangers_change_nothing(mtype, fields):
    c = Cluster(machines=1)
    jid = c.submit()
    c.start(jid)
    job = c.core.jobs[jid]
    before = (job.state, len(job.events), dict(c.core.runs[jid].syncs))
    n = len(c.sent)
    c.msg(b"stranger", mtype, job=jid, index=0, **fields)
    assert [s.type for s in c.sent[n:]] == ["abort"]
    assert (job.state, len(job.events), dict(c.core.runs[jid].syncs)) == before


def test_roles_are_checked_when_peers_are_authenticated():
    core = C.MasterCore(secure=True)
    out = core.handle(C.Received(b"w", M.Message("submit", {
        "app_name": "a", "app_source": "", "args": [], "machines": 1}, []),
        role="worker", name="m0"), 0.0)
    assert [(s.type, s.fields["code"]) for s in out] == [("error", "forbidden")]
    out = core.handle(C.Received(b"x", M.Message("register", {
        "name": "m1", "host": "h", "cpus": 1, "memory": 1, "pid": 1, "executors": []}, []),
        role="worker", name="m0"), 0.0)     # a worker key registering another name
    assert [(s.type, s.fields["code"]) for s in out] == [("error", "forbidden")]
    assert not core.workers and core.bad_messages == 2


#: who may send what with keys, as the master has always checked it: these
#: from a client's key, these from a client's or a reader's, the rest (daemons
#: and their executors) from a worker's; register only for the key's own name
CLIENT_ONLY = {"submit", "cancel", "pause", "resume", "resize", "data_plan", "data_commit",
               "data_rm", "model_parts"}
READ_ONLY = {"list_jobs", "job_status", "cluster_info", "data_list"}


def allowed(mtype: str) -> set[str]:
    return ({"client"} if mtype in CLIENT_ONLY else {"client", "reader"}
            if mtype in READ_ONLY else {"worker"})


def test_the_message_table_names_every_handler_and_its_roles():
    """dispatch.MESSAGES is the only list of what the master accepts: one
    route per ``_on_`` handler, with the roles of CLIENT_ONLY and READ_ONLY."""
    handlers = {n[4:] for n in dir(C.MasterCore) if n.startswith("_on_")}
    assert set(C.MESSAGES) == handlers
    assert set(C.MESSAGES) <= set(M.SCHEMAS)
    for mtype, route in C.MESSAGES.items():
        assert route.handler is getattr(C.MasterCore, "_on_" + mtype), mtype
        assert route.roles == allowed(mtype), mtype
        assert route.own_name == (mtype == "register"), mtype


@pytest.mark.parametrize("secure", [False, True])
def test_every_message_is_accepted_or_refused_by_its_senders_role(secure):
    """Without keys every known type reaches its handler; with keys only the
    roles of its route do (the others: 'forbidden'). An unknown type is
    'unexpected' either way; each refusal counts as a bad message."""
    for mtype in sorted(M.SCHEMAS) + ["no_such_type"]:
        route = C.MESSAGES.get(mtype)
        for role in ("client", "reader", "worker", "", "other"):
            core = C.MasterCore(secure=secure)
            out = core.handle(C.Received(b"x", M.Message(mtype, {"name": "m1"}, []),
                                         role=role, name="m1"), 0.0)
            codes = [s.fields.get("code") for s in out if s.type == "error"]
            if route is None:
                assert codes == ["unexpected"] and core.bad_messages == 1, (mtype, role)
            elif secure and role not in allowed(mtype):
                assert codes == ["forbidden"] and core.bad_messages == 1, (mtype, role)
            else:       # its handler ran (on an empty message: it may fail, 'internal')
                assert "forbidden" not in codes and "unexpected" not in codes, (mtype, role)
                assert core.bad_messages == 0, (mtype, role)


def test_block_shares_by_role_weights():
    from harmony.master.core import balance, shares
    assert shares(10, 3) == [4, 3, 3]
    assert shares(10, 3, [1, 1, 0]) == [5, 5, 0]           # index 2: a server only
    assert shares(32, 3, [0, 0, 1]) == [0, 0, 32]
    assert shares(7, 3, [2, 1, 1]) == [3, 2, 2]             # 3.5, 1.75, 1.75: largest remainders
    assert shares(6, 4, [1, 1, 1, 1]) == [2, 2, 1, 1]       # ties: the lower index
    with pytest.raises(ValueError):
        shares(4, 2, [0, 0])
    with pytest.raises(ValueError):
        shares(4, 2, [1])
    # blocks stay where they are unless their owner is over its new share
    old = [0, 1, 2, 0, 1, 2]
    new = balance(old, 3, [1, 1, 0])
    assert [new.count(i) for i in range(3)] == [3, 3, 0]
    assert all(n == o for n, o in zip(new, old) if o != 2)
    assert balance(old, 3) == old


def _why(c: Cluster, jid: str) -> str:
    n = len(c.sent)
    c.msg(b"client", "job_status", job=jid)
    return c.to(b"client", "status", since=n)[-1].fields["job"]["why"]


def test_status_says_why_a_job_runs_where_it_runs():
    c = Cluster(machines=2, mode="harmony")
    jid = c.submit(machines=1)
    job = c.core.jobs[jid]
    assert job.state == JobState.PROFILING
    assert _why(c, jid) == f"profiling on {job.workers[0]}, 0 of 3 epochs"
    ex = c.start(jid)
    c.msg(ex[0], "epoch_done", job=jid, index=0, epoch=0, sums={},
          timings={"comp": 0.3, "pull": 0.1, "push": 0.1, "train": 0.5, "iters": 1})
    c.msg(ex[0], "epoch_report", job=jid, index=0, epoch=0, metrics={"objective": 1.0})
    assert _why(c, jid) == f"profiling on {job.workers[0]}, 1 of 3 epochs"
    # a group of the Harmony scheduler: its members and the predicted gain
    other = c.submit(machines=1)
    for j, t in ((job, (0.3, 0.2)), (c.core.jobs[other], (0.1, 0.4))):
        j.state, j.workers, j.sched_group, j.predicted = JobState.RUNNING, ["m0"], "g1", 0.6
        j.profile.update(t_cpu=t[0], t_net=t[1], machines=1, samples=3)
    c.core._reindex()       # placed by hand: the machine -> jobs index learns it
    assert _why(c, jid) == (f"harmony: grouped with {other} in g1 on m0: predicted +67% "
                            f"throughput over running them one after another")
    # a start-only policy
    c2 = Cluster(machines=2, mode="naive")
    a, b = c2.submit(machines=2), c2.submit(machines=1)
    assert _why(c2, b) == f"placed by colocate on {c2.core.jobs[b].workers[0]}, sharing with {a}"


def _epoch(c: Cluster, jid: str, idents: list[bytes], epoch: int, store: dict | None = None,
           on: str | None = None) -> None:
    job = c.core.jobs[jid]
    for i, ident in enumerate(idents):
        st = store if (on is None or job.workers[i] == on) else None
        c.msg(ident, "epoch_done", job=jid, index=i, epoch=epoch, sums={},
              timings={"comp": 0.1, "iters": 1}, store=st)
    c.msg(idents[0], "epoch_report", job=jid, index=0, epoch=epoch, metrics={}, stop=False)


def test_a_machine_out_of_memory_pauses_its_youngest_job_until_a_job_ends():
    c = Cluster(machines=1)
    a, b = c.submit(), c.submit()
    ea, eb = c.start(a), c.start(b)
    _epoch(c, a, ea, 0)
    _epoch(c, b, eb, 0, store={"pause_wanted": False})
    c.tick()
    assert not c.core.runs[b].pausing
    _epoch(c, a, ea, 1, store={"pause_wanted": True})     # the older job asks
    c.tick()
    assert c.core.runs[b].pausing and not c.core.runs[a].pausing     # the youngest goes
    c.msg(eb[0], "exec_paused", job=b, index=0, attempt=c.core.runs[b].attempt, epoch=1,
          version=1)
    job_b = c.core.jobs[b]
    assert job_b.state == JobState.PAUSED and not job_b.held
    c.tick(1.0)
    assert job_b.state == JobState.PAUSED            # not straight back onto m0
    assert "out of memory" in job_b.reason
    c.msg(b"client", "cancel", job=a)                # memory frees
    c.tick(1.0)
    assert job_b.state == JobState.RUNNING and job_b.workers == ["m0"]


def test_a_machine_out_of_memory_moves_its_youngest_job_to_an_idle_machine():
    c = Cluster(machines=2)
    a = c.submit(machines=2)
    b = c.submit(machines=1)
    ea, eb = c.start(a), c.start(b)
    m = c.core.jobs[b].workers[0]
    c.msg(b"d:m2", "register", name="m2", host="h", cpus=2, memory=1 << 30, pid=1,
          executors=[], data_endpoint="tcp://h:2")
    _epoch(c, a, ea, 0, store={"pause_wanted": True}, on=m)
    _epoch(c, b, eb, 0)
    c.tick()
    rc = c.core.runs[b].reconfig
    assert rc is not None and rc.to == ["m2"] and "memory" in rc.note
    assert c.core.runs[a].reconfig is None and not c.core.runs[a].pausing


def test_checkpoint_gc_tells_only_machines_that_may_hold_parts():
    """A periodic checkpoint tells the machines the job ran on and its
    replica target (which acknowledged a part); the job's end tells them
    again, and not the machines that never held anything; a core that
    restarted, not knowing, tells every machine."""
    c = Cluster(machines=4)
    jid = c.submit()
    ex = c.start(jid)
    job = c.core.jobs[jid]
    here = job.workers[0]
    start, = [s for s in c.sent if s.type == "job_start"]
    replica = start.fields["replicas"][0][0]       # where the master asks for the copy
    assert replica != here
    c.core.snapshots.add(jid)          # a model export asks for a checkpoint
    c.msg(ex[0], "epoch_done", job=jid, index=0, epoch=0, sums={}, timings={})
    n = len(c.sent)
    c.msg(ex[0], "ckpt_part", job=jid, index=0, epoch=0, version=1, bytes=100,
          replica=replica)
    gc = [s for s in c.sent[n:] if s.type == "ckpt_gc"]
    told = {s.to for s in gc}
    assert told == {f"d:{here}".encode(), f"d:{replica}".encode()}
    assert all(s.fields == {"job": jid, "keep": 0} for s in gc)
    # the job's end tells the same machines to drop everything
    n = len(c.sent)
    c.msg(b"client", "cancel", job=jid)
    gc = [s for s in c.sent[n:] if s.type == "ckpt_gc"]
    assert {s.to for s in gc} == {f"d:{here}".encode(), f"d:{replica}".encode()}
    assert all(s.fields == {"job": jid, "keep": None} for s in gc)


def test_checkpoint_gc_at_the_end_reaches_a_replica_target_that_never_acknowledged():
    """A part whose replica write never finished (no acknowledgement) may
    still sit on the replica target: the job's end tells it too."""
    c = Cluster(machines=4)
    jid = c.submit()
    c.start(jid)
    here = c.core.jobs[jid].workers[0]
    start, = [s for s in c.sent if s.type == "job_start"]
    replica = start.fields["replicas"][0][0]
    n = len(c.sent)
    c.msg(b"client", "cancel", job=jid)
    assert {s.to for s in c.sent[n:] if s.type == "ckpt_gc"} == \
        {f"d:{here}".encode(), f"d:{replica}".encode()}


def test_after_a_restart_requeued_jobs_wait_for_the_machines_to_register_again():
    """#32 item 3: placing the requeued jobs on the first machines back
    piled 6 jobs on 6 of 20 machines; they wait REJOIN_GRACE_S, then spread."""
    c = Cluster(machines=4, mode="harmony", policy="colocate")
    ids = [c.submit(machines=1) for _ in range(4)]
    jobs = {j: c.core.jobs[j] for j in ids}
    c.core = C.MasterCore(jobs, mode="harmony", policy="colocate", heartbeat_timeout=5.0,
                          launch_timeout=60.0)
    c.run(c.core.recover(0.0))
    c.msg(b"d:m0", "register", name="m0", host="h", cpus=2, memory=1 << 30, pid=1,
          executors=[], data_endpoint="tcp://h:0")
    c.tick(1.0)
    assert all(not j.workers for j in jobs.values())       # m0 alone: nothing placed
    for i in range(1, 4):
        c.msg(f"d:m{i}".encode(), "register", name=f"m{i}", host="h", cpus=2,
              memory=1 << 30, pid=1, executors=[], data_endpoint=f"tcp://h:{i}")
    c.tick(REJOIN_GRACE_S)
    assert sorted(j.workers[0] for j in jobs.values()) == ["m0", "m1", "m2", "m3"]


def test_after_a_restart_the_wait_lasts_while_machines_keep_registering():
    from harmony.master.core.daemons import REJOIN_QUIET_S
    from harmony.master.core.master import REJOIN_MAX_S
    c = Cluster(machines=2, mode="harmony", policy="colocate")
    jid = c.submit(machines=1)
    c.core = C.MasterCore({jid: c.core.jobs[jid]}, mode="harmony", policy="colocate",
                          heartbeat_timeout=1e9, launch_timeout=60.0)
    c.run(c.core.recover(0.0))
    for i in range(40):             # one machine back every second, for 40 s
        c.msg(f"d:m{i}".encode(), "register", name=f"m{i}", host="h", cpus=2,
              memory=1 << 30, pid=1, executors=[], data_endpoint="tcp://h:0")
        c.tick(1.0)
        assert not c.core.jobs[jid].workers, i
    c.tick(REJOIN_QUIET_S)
    assert c.core.jobs[jid].workers                  # quiet: placed
    assert REJOIN_MAX_S >= 40


def test_checkpoint_gc_after_a_master_restart_tells_every_machine():
    c = Cluster(machines=4)
    jid = c.submit()
    job = c.core.jobs[jid]
    # a new core loads the table: it does not know where the job's parts are
    c.core = C.MasterCore({jid: job}, mode="naive", heartbeat_timeout=5.0,
                          launch_timeout=60.0)
    c.run(c.core.recover(0.0))
    for i in range(4):
        c.msg(f"d:m{i}".encode(), "register", name=f"m{i}", host="h", cpus=2,
              memory=1 << 30, pid=1, executors=[], data_endpoint=f"tcp://h:{i}")
    c.tick()
    # the requeued job waits for the machines to come back (#32)
    assert not c.core.jobs[jid].workers
    c.tick(REJOIN_GRACE_S)
    ex = c.start(jid)
    c.core.snapshots.add(jid)
    c.msg(ex[0], "epoch_done", job=jid, index=0, epoch=0, sums={}, timings={})
    n = len(c.sent)
    c.msg(ex[0], "ckpt_part", job=jid, index=0, epoch=0, version=1, bytes=100)
    assert {s.to for s in c.sent[n:] if s.type == "ckpt_gc"} == \
        {f"d:m{i}".encode() for i in range(4)}


def test_the_view_carries_the_expected_gap_to_the_next_arrival_and_the_move_cost():
    c = Cluster(machines=1)
    assert c.core._view([], []).arrival_gap == 0.0       # not known yet
    for t in (0.0, 2.0, 4.0):
        c.t = t
        c.submit()
    assert c.core._view([], []).arrival_gap == pytest.approx(2.0)
    c.tick(6.0)                                           # none for 6 s: longer than the mean
    assert c.core._view([], []).arrival_gap == pytest.approx(6.0)
    assert c.core._view([], []).move_cost == 0.0          # no live move measured yet


def test_the_view_carries_the_epochs_a_job_may_still_run():
    from harmony.app import COMMON_OPTIONS
    from harmony.master.jobs import DEFAULT_MAX_EPOCHS, declared_epochs
    # the master's copy of the runtime's default (the master does not import the app API)
    assert DEFAULT_MAX_EPOCHS == next(o.default for o in COMMON_OPTIONS if o.name == "max_epochs")
    assert declared_epochs([]) == 10                          # the runtime's default
    assert declared_epochs(["--rank", "4", "--max-epochs", "12"]) == 12
    assert declared_epochs(["--max-epochs=7", "--max-epochs", "9"]) == 9   # the last wins
    assert declared_epochs(["--max-epochs", "x"]) == 10       # the app refuses it at launch
    c = Cluster(machines=1)
    c.msg(b"client", "submit", app_name="a.py", app_source="", args=["--max-epochs", "5"],
          machines=1)
    jid = max(c.core.jobs)
    c.tick()
    ex = c.start(jid)
    (v,) = c.core._view([], []).active
    assert v.epochs_left == 5
    for e in range(2):
        _epoch(c, jid, ex, e)
    (v,) = c.core._view([], []).active
    assert v.epochs_left == 3


def test_executors_start_ups_are_kept_on_the_job():
    c = Cluster(machines=2)
    jid = c.submit(machines=2)
    run = c.core.runs[jid]
    for i, (wall, cpu) in enumerate(((1.25, 0.75), (float("nan"), 0.5))):
        c.msg(f"x:{jid}:{i}:{run.attempt}".encode(), "exec_ready", job=jid, index=i,
              attempt=run.attempt, endpoint=f"tcp://h:{100 + i}", num_keys=8, dim=1,
              model_blocks=4, local_blocks=1, setup_s=wall, setup_cpu=cpu)
    job = c.core.jobs[jid]
    assert job.setups == [[1.25, 0.75]]               # a non-finite report is dropped
    assert job.detail(now=c.t)["setups"] == [[1.25, 0.75]]


def _cruise_epoch(c: Cluster, jid: str, ex: list[bytes], ep: int, links=(40e6, 40e6, 4e6)):
    for i, e in enumerate(ex):
        c.msg(e, "epoch_done", job=jid, index=i, epoch=ep, sums={}, timings={
            "comp": 0.004, "blocks": 4, "bytes": 2e6, "link": links[i], "input_bytes": 4e5,
            "pull": 0.05, "push": 0.05, "train": 0.2, "iters": 1})
    c.msg(ex[0], "epoch_report", job=jid, index=0, epoch=ep, metrics={}, stop=False)


def test_cruise_solves_off_the_event_loop_and_decides_when_the_solve_returns():
    """With --cruise the core never runs the MILP itself: it hands the shell
    a Solve (pure work) and goes on; the job keeps its epochs meanwhile, no
    second solve starts, and the Solved result decides the move. A Solved
    for an older attempt changes nothing; a failed one drops the estimates."""
    c = Cluster(machines=3, cruise=True)
    jid = c.submit(machines=3)
    ex = c.start(jid)
    job, run = c.core.jobs[jid], c.core.runs[jid]
    solves = []
    ep = 0
    while not solves and ep < 20:
        n = len(c.sent)
        c.t += 1.0
        _cruise_epoch(c, jid, ex, ep)
        ep += 1
        solves = [x for x in c.core_out if isinstance(x, C.Solve)]
    assert solves, "no solve asked for"
    (solve,) = solves
    assert solve.key[0] == jid and run.reconfig is None and job.move is None
    for _ in range(3):                    # epochs go on; one solve at a time
        c.t += 1.0
        _cruise_epoch(c, jid, ex, ep)
        ep += 1
    assert [x for x in c.core_out if isinstance(x, C.Solve)] == [solve]
    # an answer for another attempt is not this one's
    c.run(c.core.handle(C.Solved((jid, run.attempt + 1, solve.key[2]), None), c.t))
    assert run.solving is not None
    c.run(c.core.handle(C.Solved(solve.key, solve.fn()), c.t))
    assert run.solving is None and job.cruise is not None
    # the slow link's machine loses its input: a move worth making
    assert job.cruise["decision"] == "move", job.cruise
    assert run.reconfig is not None and run.reconfig.layout["input"][2] == 0.0
    # a solver failure: logged, the estimates start again, nothing moves
    c2 = Cluster(machines=3, cruise=True)
    jid2 = c2.submit(machines=3)
    ex2 = c2.start(jid2)
    for e in range(12):
        _cruise_epoch(c2, jid2, ex2, e)
        got = [x for x in c2.core_out if isinstance(x, C.Solve)]
        if got:
            break
    c2.run(c2.core.handle(C.Solved(got[0].key, error="ValueError: boom"), c2.t))
    assert c2.core.runs[jid2].cruise is None and c2.core.runs[jid2].reconfig is None


def test_a_sender_lost_mid_plan_requeues_the_job_and_its_late_moved_changes_nothing():
    """2 -> 4 with the moves in flight; m1 (a sender) stops: the job is
    requeued and relaunched as a new attempt (from its checkpoint, none
    here: from the start), and the old attempt's late 'moved' neither fails
    the new attempt nor starts its plan."""
    c = Cluster(machines=4)
    jid, ex, joiners = _grow(c, 2, 4)
    job = c.core.jobs[jid]
    sent = [s for s in c.sent if s.type == "move" and s.to == ex[1] and s.fields["op"] >= 0]
    assert sent, "m1 was sent no move"
    alive = ["m0", "m2", "m3"]
    c.heartbeat(alive)
    c.t = 3.0
    c.heartbeat(alive)
    c.tick(3.0)                          # m1 silent for 6 s > 5 s
    assert not c.core.workers["m1"].alive
    assert any("worker m1 lost" in e[2] for e in job.events), job.events
    # it asked for 4 machines (the resize) and 3 are alive: it waits, its
    # old attempt's plan gone with its run
    assert job.state == JobState.WAITING and jid not in c.core.runs, job.state
    n = len(c.sent)
    c.msg(ex[1], "moved", job=jid, index=1, op=sent[0].fields["op"], bytes_out=1)
    c.msg(ex[0], "migrated", job=jid, index=0, bytes_out=1, bytes_in=0, seconds=0.1)
    assert job.state == JobState.WAITING and job.error in (None, ""), job.error
    assert [s.type for s in c.sent[n:]] == ["abort", "abort"]
    # a machine comes back: the job runs again, as a new attempt
    c.msg(b"d:m4", "register", name="m4", host="h", cpus=2, memory=1 << 30, pid=1,
          executors=[], data_endpoint="tcp://h:9")
    c.tick()
    assert job.state == JobState.RUNNING and c.core.runs[jid].reconfig is None


def test_the_master_records_each_jobs_prediction_for_its_next_epoch():
    """At every epoch report the policy's model predicts the job's next
    epoch from the profiles then (the run record's predictions stream)."""
    def predictions(c: Cluster) -> list[dict]:
        return [r.obj for r in c.core_out if isinstance(r, C.Record)
                and r.stream == "predictions"]

    c = Cluster(machines=1, mode="harmony", predict_epochs=True)
    a = c.submit()
    ea = c.start(a)
    _epoch(c, a, ea, 0)
    _epoch(c, a, ea, 1)
    p = c.core.jobs[a].profile
    assert [(r["job"], r["epoch"], r["jobs"]) for r in predictions(c)] == \
        [(a, 1, [a]), (a, 2, [a])]
    last = predictions(c)[-1]
    assert last["predicted"] == pytest.approx(p["t_cpu"] + p["t_net"] + p.get("overhead", 0.0))
    assert last["predicted_epoch"] == pytest.approx(
        last["predicted"] + (p.get("end_cpu", 0.0) + p.get("end_other", 0.0)) / p["iters"])
    # off (the simulator's default), or a policy without a model: none
    for kw in ({"mode": "harmony"}, {"mode": "harmony", "policy": "colocate",
                                     "predict_epochs": True}):
        c = Cluster(machines=1, **kw)
        a = c.submit()
        ea = c.start(a)
        _epoch(c, a, ea, 0)
        assert c.core.jobs[a].epochs and not predictions(c)


def test_status_says_why_a_new_job_waits_under_the_harmony_scheduler():
    c = Cluster(machines=1, mode="harmony")
    a = c.submit()
    b = c.submit()
    assert c.core.jobs[a].state == JobState.PROFILING
    assert c.core.jobs[b].state == JobState.WAITING
    assert "no room to profile it beside a group's jobs" in _why(c, b)
    d = c.submit()
    assert _why(c, d) == f"waits behind {b} (first come, first served) to be profiled"


def test_a_data_set_record_is_checked_before_it_enters_the_catalog():
    """A raw data_commit (any client key): no name that is not a plain
    name, no silent replacement of an entry, no holder the master does not
    know, chunks numbered 0..n-1 with a SHA-256 each."""
    cl = Cluster(2)

    def commit(name, chunks):
        n = len(cl.sent)
        cl.msg(b"client", "data_commit", name=name, filename="f.txt", size=10, chunks=chunks)
        (reply,) = cl.to(b"client", since=n)
        return reply

    good = [{"i": 0, "sha": b"s" * 32, "size": 10, "first_line": 1, "holders": ["m0", "m1"]}]
    for name in ("..", "../x", "/etc", ".x"):
        r = commit(name, good)
        assert r.type == "error" and "bad data set name" in r.fields["message"], r
    r = commit("d", [dict(good[0], holders=["m0", "m7"])])
    assert r.type == "error" and "unknown holder(s) ['m7']" in r.fields["message"], r
    r = commit("d", [dict(good[0], i=3)])
    assert r.type == "error" and "numbered" in r.fields["message"], r
    r = commit("d", [dict(good[0], sha=b"x")])
    assert r.type == "error" and "SHA-256" in r.fields["message"], r
    assert not cl.core.datasets
    assert commit("d", good).type == "ok" and cl.core.datasets["d"]["chunks"][0]["size"] == 10
    r = commit("d", [dict(good[0], size=99)])
    assert r.type == "error" and r.fields["code"] == "exists", r
    assert cl.core.datasets["d"]["chunks"][0]["size"] == 10


def test_a_jobs_story_is_bounded_and_keeps_its_first_event():
    """A job paused and moved for weeks: its events keep the first
    ("submitted") and the latest EVENTS_KEPT - 1, and count what they
    dropped; `harmony status --events` says so."""
    from harmony.cli.jobs import event_lines
    from harmony.master.jobs import EVENTS_KEPT, Job
    j = Job("job-0001", "a.py", "", [], 1)
    j.event(0.0, "waiting", "submitted")
    for i in range(EVENTS_KEPT + 49):
        j.event(1.0 + i, "running", f"move {i}")
    assert len(j.events) == EVENTS_KEPT and j.events_dropped == 50
    assert j.events[0][2] == "submitted" and j.events[-1][2] == f"move {EVENTS_KEPT + 48}"
    assert j.events[1][2] == "move 50"
    back = Job.from_record(j.to_record())
    assert back.events_dropped == 50 and back.events == j.events
    lines = event_lines(dict(j.detail(now=500.0), submitted=0.0))
    assert "50 older ones dropped" in lines[0] and "submitted" in lines[1]
    assert "50 event(s) dropped" in lines[2] and lines[3].split()[:3] == ["51.0s", "running", "move"]


def test_jobs_lists_how_long_a_finished_job_has_been_finished():
    """`harmony jobs` FOR: the time in its state; for a finished job the
    time since it ended (it was 0.0s for every finished job)."""
    from harmony.master.jobs import Job, JobState
    j = Job("job-0001", "a.py", "", [], 1, submitted=0.0)
    j.transition(JobState.RUNNING, now=1.0)
    assert j.summary(now=5.0)["in_state"] == pytest.approx(4.0)
    j.transition(JobState.FINISHED, now=10.0)
    assert j.summary(now=70.0)["in_state"] == pytest.approx(60.0)


def test_a_run_in_two_phases_at_once_is_caught():
    """Run.phase and MasterCore.validate: pausing while a live resize is in
    flight is a bug; stopping while one is (the last epoch came) is not."""
    from harmony.master.core import MasterCore
    from harmony.master.core.records import Phase, PhaseError, Reconfig, Run
    from harmony.master.jobs import Job, JobState
    run = Run(attempt=1, launched=0.0)
    assert run.phase is Phase.LAUNCHING
    run.started = True
    assert run.phase is Phase.RUNNING
    run.reconfig = Reconfig(to=["m0"], join=[], note="", t0=0.0)
    assert run.phase is Phase.RESIZING
    run.validate("j")
    run.stopping = True
    assert run.phase is Phase.STOPPING
    run.validate("j")
    run.stopping, run.pausing = False, True
    with pytest.raises(PhaseError, match="pausing, resizing"):
        run.validate("j")
    core = MasterCore()
    core.jobs["job-0001"] = j = Job("job-0001", "a.py", "", [], 1)
    core.runs["job-0001"] = Run(attempt=1, launched=0.0)
    core.validate()
    j.transition(JobState.CANCELLED, now=1.0)
    with pytest.raises(PhaseError, match="a job that is cancelled"):
        core.validate()


def test_data_rm_clears_the_chunks_of_a_put_that_never_committed():
    """A put whose client (or master) died after the plan left chunks on the
    workers: `data rm` of the unrecorded name asks every live worker to drop
    them, but not while a put of that name is in flight (PUT_S)."""
    from harmony.master.core.catalog import PUT_S
    cl = Cluster(2)

    def rm(name):
        n = len(cl.sent)
        cl.msg(b"client", "data_rm", name=name)
        return cl.to(b"client", since=n)[0], [s for s in cl.sent[n:] if s.type == "data_gc"]

    cl.msg(b"client", "data_plan", name="half", size=100, chunks=2)
    (reply, gcs) = rm("half")
    assert reply.type == "error" and reply.fields["code"] == "in_use" and not gcs
    cl.core.puts["half"] -= PUT_S + 1         # planned long ago (workers still beating)
    (reply, gcs) = rm("half")
    assert reply.type == "ok" and reply.fields["info"] == {"name": "half", "recorded": False}
    assert sorted(g.to for g in gcs) == [b"d:m0", b"d:m1"]
    (reply, gcs) = rm("../x")
    assert reply.type == "error" and "bad data set name" in reply.fields["message"] and not gcs


def test_finished_jobs_leave_the_live_views_after_the_retention():
    """#37: `harmony jobs` and the dashboard show a job that ended for
    --retention seconds; `jobs --all` and `status` always do; the count by
    state (harmony_jobs) keeps every job."""
    from harmony.obs.snapshot import build_snapshot
    c = Cluster(machines=1, retention=100.0)
    done, live = c.submit(), c.submit()
    ex = c.start(done)
    c.msg(ex[0], "epoch_done", job=done, index=0, epoch=0, sums={}, timings={})
    c.msg(ex[0], "epoch_report", job=done, index=0, epoch=0, metrics={}, stop=True)
    c.msg(ex[0], "exec_finished", job=done, index=0)
    assert c.core.jobs[done].state == JobState.FINISHED

    def listed(**kw):
        c.msg(b"client", "list_jobs", **kw)
        reply = [s for s in c.sent if s.to == b"client" and s.type == "jobs"][-1].fields
        return [j["id"] for j in reply["jobs"]], reply["hidden"]
    assert listed() == ([done, live], 0)
    c.tick(101.0)
    assert listed() == ([live], 1)
    assert listed(all=True) == ([done, live], 0)
    c.msg(b"client", "job_status", job=done)
    assert [s for s in c.sent if s.to == b"client"][-1].type == "status"
    snap = build_snapshot(c.core)
    assert [j["id"] for j in snap["jobs"]] == [live]
    assert snap["job_counts"]["finished"] == 1
    with pytest.raises(ValueError):
        C.MasterCore(retention=-1)


def test_a_heartbeat_sent_before_the_daemon_saw_a_launch_does_not_requeue_it():
    """#32: under load a heartbeat can be handled seconds after a launch it
    was sent before; the daemon's count of launches tells them apart."""
    c = Cluster(machines=1)
    jid = c.submit()
    run = c.core.runs[jid]
    assert run.launch_seq == {"m0": 1}
    for _ in range(3):                             # past LAUNCH_GRACE
        c.tick(2.0)
        c.msg(b"d:m0", "heartbeat", name="m0", executors=[], launches=0)
    assert c.core.runs[jid] is run and c.core.jobs[jid].attempt == 1     # not gone
    c.msg(b"d:m0", "heartbeat", name="m0", executors=[jid], launches=1)
    assert c.core.runs[jid] is run
    c.msg(b"d:m0", "heartbeat", name="m0", executors=[], launches=1)     # seen, then gone
    assert c.core.runs.get(jid) is not run
    assert any("its executor on worker m0 is gone" in e[2] for e in c.core.jobs[jid].events)


def test_a_heartbeat_without_a_launch_count_keeps_the_grace_rule():
    c = Cluster(machines=1)
    jid = c.submit()
    run = c.core.runs[jid]
    c.msg(b"d:m0", "heartbeat", name="m0", executors=[])
    assert c.core.runs[jid] is run                 # within LAUNCH_GRACE
    for _ in range(2):
        c.tick(2.0)
        c.msg(b"d:m0", "heartbeat", name="m0", executors=[])
    assert c.core.runs.get(jid) is not run


# -- rules once checked by starting processes (#33 item 6) ---------------------------------
def _finish(c: Cluster, jid: str) -> None:
    """The job's executors start, run one epoch and stop."""
    ex = c.start(jid)
    for i, e in enumerate(ex):
        c.msg(e, "epoch_done", job=jid, index=i, epoch=0, sums={}, timings={})
    c.msg(ex[0], "epoch_report", job=jid, index=0, epoch=0, metrics={}, stop=True)
    for i, e in enumerate(ex):
        c.msg(e, "exec_finished", job=jid, index=i)
    c.tick()
    assert c.core.jobs[jid].state == JobState.FINISHED


def _reply(c: Cluster, n: int):
    return [s for s in c.sent[n:] if s.to == b"client"][-1]


def test_a_job_larger_than_the_cluster_waits_and_does_not_block_others():
    c = Cluster(machines=2)
    big = c.submit(machines=50)
    small = c.submit(machines=1)
    assert c.core.jobs[big].state == JobState.WAITING
    assert "needs 50 machines; 2 alive" in c.core.jobs[big].reason
    assert c.core.jobs[small].workers                     # placed beside it
    _finish(c, small)
    assert c.core.jobs[big].state == JobState.WAITING


def test_pause_and_resume_refuse_what_cannot_be_paused_or_resumed():
    c = Cluster(machines=1)
    n = len(c.sent)
    c.msg(b"client", "pause", job="job-9999")
    r = _reply(c, n)
    assert r.type == "error" and r.fields["code"] == "unknown_job" and "no job" in \
        r.fields["message"]
    jid = c.submit()
    _finish(c, jid)
    n = len(c.sent)
    c.msg(b"client", "pause", job=jid)
    assert _reply(c, n).type == "error" and "not running" in _reply(c, n).fields["message"]
    n = len(c.sent)
    c.msg(b"client", "resume", job=jid)
    assert _reply(c, n).type == "error" and "not paused" in _reply(c, n).fields["message"]


def test_explicit_groups_place_their_jobs_together():
    c = Cluster(machines=2, mode="harmony", policy="colocate")
    ids = []
    for group in ("g1", "g1", None):
        c.msg(b"client", "submit", app_name="a.py", app_source="", args=[], machines=1,
              group=group)
        ids.append(max(c.core.jobs))
        c.tick()
    a, b, other = (c.core.jobs[j].workers for j in ids)
    assert a and a == b and other and other != a


@pytest.mark.parametrize("mode", ["isolated", "naive", "naive-cap2"])
def test_isolated_runs_jobs_one_after_another_naive_shares(mode):
    """Isolated: one job at a time. Naive: all three share the machines.
    With --max-jobs-per-machine 2: two share them, the third starts when
    one of them ends, and says why it waits."""
    cap = 2 if mode == "naive-cap2" else 0
    c = Cluster(machines=2, mode=mode.split("-")[0], max_jobs_per_machine=cap)
    ids = [c.submit(machines=2) for _ in range(3)]
    placed = [bool(c.core.jobs[j].workers) for j in ids]
    if mode == "isolated":
        assert placed == [True, False, False]
        _finish(c, ids[0])
        assert c.core.jobs[ids[1]].workers and not c.core.jobs[ids[2]].workers
    elif mode == "naive":
        assert placed == [True, True, True]
    else:
        assert placed == [True, True, False]
        assert "max-jobs-per-machine" in c.core.jobs[ids[2]].reason
        _finish(c, ids[0])
        assert c.core.jobs[ids[2]].workers


def test_a_daemon_that_registers_again_reports_its_executors_gone():
    """A restarted daemon counts launches from 0: the launches before it
    registered are not waited for (a job stranded on it, seen)."""
    c = Cluster(machines=1)
    jid = c.submit()
    run = c.core.runs[jid]
    c.tick(1.0)
    c.msg(b"d:m0b", "register", name="m0", host="h", cpus=2, memory=1 << 30, pid=2,
          executors=[], data_endpoint="tcp://h:0")           # within LAUNCH_GRACE
    assert c.core.runs[jid] is run
    for _ in range(2):
        c.tick(2.0)
        c.msg(b"d:m0b", "heartbeat", name="m0", executors=[], launches=0)
    assert c.core.runs.get(jid) is not run


def test_a_checkpoints_replica_goes_to_a_machine_no_move_is_using():
    """A 1-machine job's checkpoint is replicated on a machine whose link
    carries no live move (chosen as the checkpoint is ordered), before the
    one with the fewest jobs: here job b grows from m1 onto m2 and m3, idle
    until now, and a's replica goes to m4, not to m2."""
    c = Cluster(machines=5)
    a = c.submit()
    exa = c.start(a)
    b = c.submit()
    c.start(b)
    ja, jb = c.core.jobs[a], c.core.jobs[b]
    assert (ja.workers, jb.workers) == (["m0"], ["m1"])
    c.msg(b"client", "resize", job=b, machines=3)
    assert c.core.runs[b].reconfig.to == ["m1", "m2", "m3"]
    c.core.snapshots.add(a)           # a checkpoint is due at a's next epoch end
    c.msg(exa[0], "epoch_done", job=a, index=0, epoch=0, sums={}, timings={})
    sums = c.to(exa[0], "epoch_sums")[-1].fields
    assert sums["checkpoint"]
    assert sums["replicas"] == [["m4", c.core.workers["m4"].data_endpoint]]
    assert all(h[0] != "m0" for h in sums["replica_alts"][0])
    # the part's holders as the executor reports them are what gc tells
    c.msg(exa[0], "ckpt_part", job=a, index=0, epoch=0, version=1, bytes=100, replica="m4")
    assert ja.checkpoint["holders"] == ["m0", "m4"]
    # the last epoch its --max-epochs allows (10 by default): the executor
    # stops by its own rule and writes the final checkpoint; its holders are
    # chosen then too (none at an epoch without a checkpoint)
    for ep in range(1, 10):
        c.msg(exa[0], "epoch_done", job=a, index=0, epoch=ep, sums={}, timings={})
        sums = c.to(exa[0], "epoch_sums")[-1].fields
        assert sums["epoch"] == ep and ("replicas" in sums) == (ep == 9), sums
    assert sums["replicas"] == [["m4", c.core.workers["m4"].data_endpoint]]
