"""The Harmony policy on the master: profiling, placement, regrouping.

The first tests drive the real master core (``tests/coredriver.py``: events
in, its state and commands checked) under the harmony policy, with jobs of
known work reporting their epochs; the later ones call
``harmony_policy.harmony`` on hand-built cluster views; the end-to-end test
runs it on a local cluster.
"""
import dataclasses

import pytest

from harmony.client import Client
from harmony.cluster import LocalCluster
from harmony.master.jobs import JobState
from harmony.policies.harmony import harmony
from harmony.policies.view import ClusterView, JobView, WorkerView
from harmony.sched.model import Profile
from apps_for_tests import TOY_APP
from conftest import ISOLATE, wait_state
from coredriver import CoreDriver, acts, work

M2 = tuple(WorkerView(f"m{i}", 1, 1 << 30, 0) for i in range(2))
WAITING, PROFILING, RUNNING = JobState.WAITING, JobState.PROFILING, JobState.RUNNING
CPU, NET = work(1.0, 0.1), work(0.1, 1.0)      # complementary jobs


def job(i, state="waiting", profile=None, workers=(), group="", epochs=0):
    """A view of job ``i``; ``profile``: its Profile's (t_cpu, t_net, dop)."""
    jid = f"job-{i:04d}"
    return JobView(jid, 1, float(i), state=state,
                   profile=None if profile is None else Profile(jid, *profile),
                   workers=tuple(workers), sched_group=group, epochs=epochs)


def moves(decisions):
    """The profile, start, pause (move) and promote actions of decisions."""
    return [{k: d[k] for k in ("profile", "start", "pause", "promote") if d[k]}
            for d in decisions if acts(d)]


def test_new_jobs_are_profiled_on_free_machines_then_where_there_is_room():
    d = CoreDriver(2)
    j1, j2, j3 = (d.submit(epochs=100) for _ in range(3))
    dec, = d.tick()
    # nothing idle for the third, and a job alone on one machine uses no
    # network: beside a job of unknown profile there is no known room
    assert dec["profile"] == {j1: ["m0"], j2: ["m1"]}
    assert [d.state(j) for j in (j1, j2, j3)] == [PROFILING, PROFILING, WAITING]
    assert [(s.to, s.fields["job"]) for s in d.sent if s.type == "launch"] == [
        (b"d:m0", j1), (b"d:m1", j2)]
    assert f"{j3} waits" in dec["note"]
    assert "no room to profile it" in d.core.jobs[j3].reason
    assert not dec["start"] and not dec["pause"]
    busy = work(1.0, 0.01)         # one machine's CPU kept busy: no room
    gaps = work(0.5, 0.5)          # half of each iteration off the CPU
    decs = d.epochs({j1: busy, j2: busy}, 5)
    assert [d.state(j) for j in (j1, j2, j3)] == [RUNNING, RUNNING, WAITING]
    assert moves(decs) == [{"promote": [j1, j2]}] and f"{j3} waits" in decs[-1]["note"]
    d = CoreDriver(2)
    j1, j2 = d.submit(epochs=100), d.submit(epochs=100)
    d.tick()
    d.epochs({j1: busy, j2: gaps}, 5)
    j3 = d.submit(epochs=100)
    dec, = d.tick()
    assert dec["profile"] == {j3: ["m1"]}
    assert d.state(j3) == PROFILING and d.workers(j3) == ["m1"]
    assert d.group(j3) == dec["assign"][j3] == d.group(j2)
    # on several machines the newcomer may use the network the group leaves
    d = CoreDriver(2)
    wide = d.submit(machines=2, epochs=100)
    d.tick()
    d.epochs({wide: work(2.0, 0.01)}, 5)       # (1.0, 0.01) per iteration on 2
    assert d.core.jobs[wide].profile["t_cpu"] == pytest.approx(1.0)
    j3 = d.submit(epochs=100)
    dec, = d.tick()
    assert dec["profile"] == {j3: ["m0", "m1"]} and d.workers(j3) == ["m0", "m1"]


def test_a_profiled_job_alone_grows_to_the_whole_cluster():
    # one computation-bound job profiled on one machine of the two it asked
    # for (the second registered after it started): its speed-up curve pays
    # for both (1.2 s -> 0.7 s per iteration), with 3 epochs left as with
    # more; Algorithm 1 (harmony-util) agrees
    for policy in ("harmony", "harmony-util"):
        d = CoreDriver(1, policy=policy)
        j = d.submit(machines=2, epochs=6)
        d.tick()
        d.register("m1")
        decs = d.epochs({j: work(1.0, 0.2)}, 3)
        assert moves(decs) == [{"pause": {j: ["m0", "m1"]}}], policy
        assert d.core.runs[j].reconfig is not None          # moved live
        assert decs[-1]["predicted"][d.group(j)] == pytest.approx(0.5 + 0.2)
        decs = d.epochs({j: work(1.0, 0.2)}, 2)
        assert d.workers(j) == ["m0", "m1"] and d.state(j) == RUNNING, policy
        assert not moves(decs) and d.core.runs[j].reconfig is None
        assert d.decisions[-1]["predicted"][d.group(j)] == pytest.approx(0.5 + 0.2)
    # one that asked for one machine is lent the second (nothing waits),
    # given back when another job needs it, if the time it saves repays two
    # moves: not with 3 iterations left, with 30 (10 per epoch) it does
    for iters, lent in ((1, False), (10, True)):
        d = CoreDriver(2)
        j = d.submit(machines=1, epochs=6)
        d.tick()
        decs = d.epochs({j: work(1.0, 0.2, iters=iters)}, 3)
        assert d.workers(j) == ["m0"]
        assert moves(decs) == ([{"pause": {j: ["m0", "m1"]}}] if lent else
                               [{"promote": [j]}]), iters
        d.epochs({j: work(1.0, 0.2, iters=iters)}, 1)
        assert d.workers(j) == (["m0", "m1"] if lent else ["m0"])


def test_a_job_near_its_epoch_budget_is_not_lent_machines():
    """With --max-epochs known, the iterations left are its budget less what
    it ran, not "as many as it ran": a long-running job with 1 epoch left
    is not lent a machine that joins, a young one with 30 left is."""
    for done, budget, lent in ((30, 31, False), (3, 33, True)):
        d = CoreDriver(1)
        j = d.submit(epochs=budget)          # 1 iteration per epoch
        d.tick()
        d.epochs({j: work(1.0, 0.2)}, done)
        assert d.state(j) == RUNNING and d.core.jobs[j].epochs_left() == budget - done
        d.register("m1")
        assert moves(d.tick()) == ([{"pause": {j: ["m0", "m1"]}}] if lent else [])
        d.epochs({j: work(1.0, 0.2)}, 1)
        assert d.workers(j) == (["m0", "m1"] if lent else ["m0"])
    # a view without the budget (the core always knows one: its app's
    # default) takes as many left as it ran: lent
    prof = Profile("job-0001", 1.0, 0.2, 1, iters=1)
    old = JobView("job-0001", 1, 1.0, state="running", profile=prof, workers=("m0",),
                  sched_group="g1", epochs=30, epochs_left=None)
    assert harmony(ClusterView(M2, (), (old,))).pause == {"job-0001": ["m0", "m1"]}


def test_complementary_jobs_share_a_group_and_the_decision_is_stable():
    d = CoreDriver(2)
    j1, j2 = d.submit(epochs=100), d.submit(epochs=100)
    d.tick()
    d.settle({j1: CPU, j2: NET})
    # whatever the grouping, the policy asked again changes nothing (a
    # daemon reconnects: the core schedules again)
    where, asked = {j: d.workers(j) for j in (j1, j2)}, len(d.views)
    d.reconnect("m0")
    assert not moves(d.epochs({j1: CPU, j2: NET}, 3)) and len(d.views) > asked
    assert {j: d.workers(j) for j in (j1, j2)} == where
    assert {d.state(j) for j in (j1, j2)} == {RUNNING}


def test_a_finished_job_frees_machines_for_the_rest():
    # job 1 asked for 2 machines and got the one job 2 left; job 2 finishes
    d = CoreDriver(2)
    j2 = d.submit(epochs=6)
    d.tick()
    j1 = d.submit(machines=2, epochs=100)
    d.tick()
    assert d.workers(j2) == ["m0"] and d.workers(j1) == ["m1"]
    d.epochs({j1: CPU, j2: CPU}, 5)
    assert d.state(j1) == RUNNING and d.workers(j1) == ["m1"]
    decs = d.epochs({j1: CPU, j2: CPU}, 1)
    assert d.state(j2) == JobState.FINISHED
    assert moves(decs) == [{"pause": {j1: ["m1", "m0"]}}]
    d.epochs({j1: CPU}, 1)
    assert d.workers(j1) == ["m1", "m0"]
    # a job with little done (restarted after its executor was killed: its
    # first epoch of this attempt) is taken to have little left: a move
    # would not repay; one epoch later it has done enough (and is widened
    # when the core next asks the policy: on a change, here a daemon that
    # reconnects)
    d = CoreDriver(2)
    j2 = d.submit(epochs=6)
    d.tick()
    j1 = d.submit(machines=2, epochs=100)
    d.tick()
    d.epochs({j1: CPU, j2: CPU}, 5)
    d.crash(j1)
    d.tick()
    assert d.state(j1) == RUNNING and d.core.jobs[j1].failures == 1
    assert len(d.workers(j1)) == 1
    decs = d.epochs({j1: CPU, j2: CPU}, 1)
    assert d.state(j2) == JobState.FINISHED and len(d.core.jobs[j1].epochs) == 1
    assert not moves(decs) and len(d.workers(j1)) == 1
    d.epochs({j1: CPU}, 1)
    d.reconnect("m1")
    assert moves(d.tick()) == [{"pause": {j1: [d.workers(j1)[0], "m1"]}}]


def test_widening_stops_where_the_speed_up_curve_does():
    # remote traffic: 1.05 s per iteration on 1 machine, 0.5 + 0.05 + 0.5 on 2
    chatty = work(1.0, 0.05, remote=1.0)
    d = CoreDriver(2)
    j = d.submit(epochs=100)
    d.tick()
    decs = d.epochs({j: chatty}, 5)
    assert d.core.jobs[j].profile["bytes"] / d.core.jobs[j].profile["link"] == 1.0
    asked = len(d.views)
    d.reconnect("m0")           # asked again after 5 epochs
    decs += d.epochs({j: chatty}, 1)
    assert len(d.views) > asked
    assert moves(decs) == [{"promote": [j]}] and d.workers(j) == ["m0"]


def test_a_job_that_lowers_utilization_waits():
    # two saturated complementary groups: a third CPU-heavy job fits nowhere.
    # It ran beside the first CPU-heavy job until its user paused it; the
    # second network-heavy job took its place meanwhile; then it is resumed
    d = CoreDriver(2)
    cpu1, net1 = d.submit(epochs=100), d.submit(epochs=100)
    d.tick()
    w = {cpu1: CPU, net1: NET}
    d.settle(w)
    cpu2 = d.submit(epochs=100)
    w[cpu2] = CPU
    d.settle(w)
    third = d.submit(epochs=100)
    w[third] = CPU
    d.settle(w)
    assert d.workers(cpu2) == d.workers(net1) and d.workers(third) == d.workers(cpu1)
    d.deliver(d.client, "pause", job=third)
    d.settle(w)
    assert d.state(third) == JobState.PAUSED
    net2 = d.submit(epochs=100)
    w[net2] = NET
    d.settle(w)
    assert d.group(net2) == d.group(cpu1) != d.group(net1) == d.group(cpu2)
    d.deliver(d.client, "resume", job=third)
    assert d.state(third) == WAITING and d.core.jobs[third].profile
    asked = len(d.views)
    decs = d.epochs(w, 3)
    assert len(d.views) > asked and d.views[-1].waiting[0].id == third
    assert not moves(decs) and d.state(third) == WAITING
    assert d.decisions[-1]["predicted"] == {d.group(cpu1): pytest.approx(1.1),
                                            d.group(net1): pytest.approx(1.1)}


def test_no_regrouping_for_less_than_five_percent():
    # g1 leaves the network 7% idle, g2 nothing: U is within 1.2% of its
    # maximum, so no regrouping can gain 5%
    d = CoreDriver(2)
    js = [d.submit(epochs=100) for _ in range(4)]
    d.tick()
    w = dict(zip(js, (CPU, NET, CPU, work(0.1, 0.92))))
    d.settle(w)
    j1, j2, j3, j4 = js
    assert d.group(j1) == d.group(j4) != d.group(j2) == d.group(j3)
    asked = len(d.views)
    d.reconnect("m0")
    assert not moves(d.epochs(w, 3)) and len(d.views) > asked
    assert d.group(j1) == d.group(j4) != d.group(j2) == d.group(j3)


@pytest.fixture(scope="module")
def scluster(tmp_path_factory):
    cl = LocalCluster(2, str(tmp_path_factory.mktemp("sched")), port=0, mode="harmony",
                      heartbeat_timeout=3.0, isolate=ISOLATE)
    cl.start()
    yield cl
    cl.stop()


def test_jobs_are_profiled_then_placed_end_to_end(scluster):
    with Client(scluster.endpoint) as c:
        a = c.submit("toy.py", TOY_APP, ["--max-epochs", "40", "--sleep", "0.03"], machines=1)
        st = wait_state(c, a, ("running",), timeout=60)
        b = c.submit("toy.py", TOY_APP, ["--max-epochs", "15", "--sleep", "0.01"], machines=1)
        sts = [wait_state(c, j, ("finished", "failed"), timeout=120) for j in (a, b)]
    for st in sts:
        assert st["state"] == "finished", st["error"]
        states = [e[1] for e in st["events"]]
        assert states[:2] == ["waiting", "profiling"], states
        assert st["state_time"].get("profiling", 0) > 0
        assert st["sched_group"]
        # pauses and moves resumed where they stopped: every epoch once
        assert [e["epoch"] for e in st["epochs"]] == list(range(len(st["epochs"])))
    assert len(sts[0]["epochs"]) == 40 and len(sts[1]["epochs"]) == 15
    assert sts[0]["predicted_iter"] is not None


def test_a_profiled_job_stays_where_it_was_profiled_when_that_is_as_good():
    view = ClusterView(M2, (), (job(1, "profiling", None, ["m0"], "g:job-0001"),
                                job(2, "profiling", (0.5, 0.5, 1), ["m1"], "g:job-0002")))
    dec = harmony(view)
    assert dec.promote == ["job-0002"] and not dec.pause


def test_a_job_that_adds_little_to_a_shared_group_waits_instead():
    m1 = (WorkerView("m0", 1, 1 << 30, 0),)
    cpu = (1.0, 0.02, 1)
    view = ClusterView(m1, (), (job(1, "running", cpu, ["m0"], "g1"),
                                job(2, "profiling", cpu, ["m0"], "g1")))
    dec = harmony(view)
    # two CPU-bound jobs time-slicing one core: U +2%, so job 2 waits, paused
    assert dec.pause == {"job-0002": None} and not dec.promote
    # a complementary job raises U by far more and stays
    view = ClusterView(m1, (), (job(1, "running", cpu, ["m0"], "g1"),
                                job(2, "profiling", (0.05, 1.0, 1), ["m0"], "g1")))
    dec = harmony(view)
    assert dec.promote == ["job-0002"] and not dec.pause


def test_a_job_just_moved_is_not_moved_again_before_its_profile_settles():
    """A job lent a machine is widened once its profile on its current
    machine count has ``SETTLE`` epochs, not on the first one measured there
    (a one-epoch profile at a new width moved MLR 2 -> 3 -> 1 machines)."""
    from harmony.policies.harmony import SETTLE
    j = JobView("job-0001", 1, 1.0, state="running", profile=Profile("job-0001", 1.0, 0.2, 1, iters=10),
                workers=("m0",), sched_group="g1", epochs=8)
    assert harmony(ClusterView(M2, (), (j,))).pause == {"job-0001": ["m0", "m1"]}
    fresh = dataclasses.replace(j, steady=SETTLE - 1)
    assert harmony(ClusterView(M2, (), (fresh,))).pause == {}
    settled = dataclasses.replace(j, steady=SETTLE)
    assert harmony(ClusterView(M2, (), (settled,))).pause == {"job-0001": ["m0", "m1"]}


def test_a_new_job_waits_for_a_machine_that_frees_before_its_profile_would():
    """No machine idle; job 2 leaves room on m1 (half its iteration off the
    CPU). With many epochs left on both machines the new job is profiled
    beside job 2; when job 1 ends within the epochs a profile there would
    take (FREES_EPOCHS of job 2's), the new job waits for m0 instead (then
    runs alone, with no pause to leave a poor pair)."""
    busy = Profile("job-0001", 1.0, 0.01, 1, iters=1)     # 1 iteration per epoch
    gaps = Profile("job-0002", 0.75, 0.75, 1, iters=1)    # epochs of 1.5 s
    one = JobView("job-0001", 1, 1.0, state="running", profile=busy, workers=("m0",),
                  sched_group="g1", epochs=5, epochs_left=40)
    two = JobView("job-0002", 1, 2.0, state="running", profile=gaps, workers=("m1",),
                  sched_group="g2", epochs=5, epochs_left=40)
    dec = harmony(ClusterView(M2, (job(3),), (one, two)))
    assert dec.profile == {"job-0003": ["m1"]}
    # job 1 ends in about 1 s, within one of job 2's epochs (FREES_EPOCHS)
    ending = dataclasses.replace(one, epochs_left=1)
    dec = harmony(ClusterView(M2, (job(3),), (ending, two)))
    assert dec.profile == {} and "machines free in about 1 s" in dec.wait["job-0003"]
    # ... or within that and the restart a poor pair would cost it (a move's
    # measured cost, else DEFAULT_MOVE_COST): ends in about 2 s, one epoch
    # of job 2's is 1.5 s, a restart 1 s
    later = dataclasses.replace(one, epochs_left=2)
    dec = harmony(ClusterView(M2, (job(3),), (later, two)))
    assert dec.profile == {} and "machines free in about 2 s" in dec.wait["job-0003"]
    # where moves are measured cheaper (0.2 s), it is profiled beside job 2
    dec = harmony(ClusterView(M2, (job(3),), (later, two), move_cost=0.2))
    assert dec.profile == {"job-0003": ["m1"]}


def test_the_policy_is_asked_again_when_a_job_may_move():
    """The core asks the policy again when a job's profile reaches
    PROFILE_SAMPLES epochs at its machine count (and at its first); it has
    no other trigger at an epoch report. So the harmony policy's own
    thresholds for moving or widening a running job (SETTLE epochs at its
    width, WIDEN_AFTER epochs done) must be reached by then, or a job that
    crossed one later would wait for some unrelated event (an arrival, a
    finish) to be considered."""
    from harmony.policies import harmony as H
    from harmony.policies.view import PROFILE_SAMPLES
    assert H.SETTLE <= PROFILE_SAMPLES and H.WIDEN_AFTER <= PROFILE_SAMPLES


def test_a_batch_is_profiled_on_one_machine_each():
    """Jobs submitted together (less than ``BATCH_GAP`` apart) are profiled
    on one machine each, as the paper does with the jobs a cluster starts
    with; a job submitted alone gets the machines it asked for once the gap
    has passed with no other submission (``Decision.again_at``: the master
    asks again then)."""
    from harmony.policies.harmony import BATCH_GAP
    m4 = tuple(WorkerView(f"m{i}", 1, 1 << 30, 0) for i in range(4))
    first = JobView("job-0001", 2, 10.0)
    # alone, it waits out the gap for the rest of a batch, then takes its 2
    held = harmony(ClusterView(m4, (first,), now=10.0 + BATCH_GAP / 2))
    assert held.profile == {} and held.again_at == 10.0 + BATCH_GAP
    assert "batch" in held.wait["job-0001"]
    assert harmony(ClusterView(m4, (first,), now=10.0 + BATCH_GAP)).profile == {
        "job-0001": ["m0", "m1"]}
    near = JobView("job-0002", 2, 10.0 + BATCH_GAP / 10)
    assert harmony(ClusterView(m4, (first, near))).profile == {"job-0001": ["m0"],
                                                               "job-0002": ["m1"]}
    late = JobView("job-0002", 2, 10.0 + BATCH_GAP * 10)
    apart = ClusterView(m4, (first, late), now=20.0)
    assert harmony(apart).profile == {"job-0001": ["m0", "m1"], "job-0002": ["m2", "m3"]}
    running = JobView("job-0001", 2, 10.0, state="profiling", workers=("m0", "m1"),
                      sched_group="g:job-0001")
    assert harmony(ClusterView(m4, (near,), (running,))).profile == {"job-0002": ["m2"]}
