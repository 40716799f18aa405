"""The Harmony policy on the master: profiling, placement, regrouping.

Pure tests drive ``harmony_policy.harmony`` with cluster views and apply its
decisions the way the master does; the end-to-end test runs it on a local
cluster.
"""
import dataclasses

import pytest

from harmony.client import Client
from harmony.cluster import LocalCluster
from harmony.policies.harmony import harmony
from harmony.policies.view import ClusterView, JobView, WorkerView
from apps_for_tests import TOY_APP
from conftest import ISOLATE, wait_state

M2 = tuple(WorkerView(f"m{i}", 1, 1 << 30, 0) for i in range(2))
M4 = tuple(WorkerView(f"m{i}", 1, 1 << 30, 0) for i in range(4))


def job(i, state="waiting", profile=None, workers=(), group="", epochs=0):
    return JobView(f"job-{i:04d}", 1, float(i), state=state, profile=profile,
                   workers=tuple(workers), sched_group=group, epochs=epochs)


def apply(view, dec):
    """The master's application of a decision, as a new view (pauses done)."""
    jobs = {j.id: j for j in view.waiting + view.active}
    group_of = {j.id: j.sched_group for j in view.active}
    group_of.update(dec.assign)
    out = {}
    for jid, j in jobs.items():
        state, workers = j.state, j.workers
        if jid in dec.profile:
            state, workers = "profiling", dec.profile[jid]
        elif jid in dec.start:
            state, workers = "running", dec.start[jid]
        elif jid in dec.pause:
            to = dec.pause[jid]
            state, workers = ("running", to) if to else (
                "profiled" if j.state == "profiling" else "paused", ())
        elif jid in dec.promote:
            state = "running"
        out[jid] = JobView(jid, 1, j.submitted, state=state, profile=j.profile,
                           workers=tuple(workers), sched_group=group_of.get(jid, ""),
                           epochs=j.epochs)
    return ClusterView(view.workers,
                       tuple(j for j in out.values() if j.state not in ("running", "profiling")),
                       tuple(j for j in out.values() if j.state in ("running", "profiling")))


def settle(view, rounds=6):
    for _ in range(rounds):
        dec = harmony(view)
        if not (dec.profile or dec.start or dec.pause or dec.promote):
            return view, dec
        view = apply(view, dec)
    raise AssertionError(f"the policy did not settle: {dec}")


def test_new_jobs_are_profiled_on_free_machines_then_where_there_is_room():
    view = ClusterView(M2, (job(1), job(2), job(3)))
    dec = harmony(view)
    # nothing idle for the third, and a job alone on one machine uses no
    # network: beside a job of unknown profile there is no known room
    assert dec.profile == {"job-0001": ["m0"], "job-0002": ["m1"]}
    assert "job-0003 waits" in dec.note
    assert "no room to profile it" in dec.wait["job-0003"]
    assert not dec.start and not dec.pause
    busy = (1.0, 0.01, 1)          # one machine's CPU kept busy: no room
    gaps = (0.5, 0.5, 1)           # half of each iteration off the CPU
    running = lambda i, p, m: job(i, "running", p, [m], f"g{i}", epochs=5)  # noqa: E731
    dec = harmony(ClusterView(M2, (job(3),), (running(1, busy, "m0"), running(2, busy, "m1"))))
    assert dec.profile == {} and "job-0003 waits" in dec.note
    dec = harmony(ClusterView(M2, (job(3),), (running(1, busy, "m0"), running(2, gaps, "m1"))))
    assert dec.profile == {"job-0003": ["m1"]}
    assert dec.assign["job-0003"] == "g2"
    # on several machines the newcomer may use the network the group leaves
    wide = JobView("job-0001", 2, 1.0, state="running", profile=(1.0, 0.01, 2),
                   workers=("m0", "m1"), sched_group="g1", epochs=5)
    dec = harmony(ClusterView(M2, (job(3),), (wide,)))
    assert dec.profile == {"job-0003": ["m0", "m1"]}


def test_a_profiled_job_alone_grows_to_the_whole_cluster():
    j = job(1, "profiling", (1.0, 0.2, 1), ["m0"], "g:job-0001", epochs=3)
    view = ClusterView(M2, (), (JobView(j.id, 2, j.submitted, state=j.state, profile=j.profile,
                                        workers=j.workers, sched_group=j.sched_group,
                                        epochs=3),))
    dec = harmony(view)
    # one computation-bound job profiled on one machine of the two it asked
    # for: its speed-up curve pays for both (1.2 s -> 0.7 s per iteration)
    assert dec.pause == {"job-0001": ["m0", "m1"]}
    assert harmony(view, objective="util").pause == dec.pause     # Algorithm 1 agrees
    # one that asked for one machine is lent the second (nothing waits),
    # given back when another job needs it, if the time it saves repays two
    # moves: not with 3 iterations left (as many as it ran), with 30 it does
    assert harmony(ClusterView(M2, (), (j,))).pause == {}
    long = dataclasses.replace(j, profile=(1.0, 0.2, 1, 0.0, 0.0, 10))
    assert harmony(ClusterView(M2, (), (long,))).pause == {"job-0001": ["m0", "m1"]}
    view, last = settle(apply(view, dec))
    assert [j.workers for j in view.active] == [("m0", "m1")]
    assert last.predicted[view.active[0].sched_group] == pytest.approx(0.5 + 0.2)


def test_a_job_near_its_epoch_budget_is_not_lent_machines():
    """With --max-epochs known, the iterations left are its budget less what
    it ran, not "as many as it ran": a long-running job with 1 epoch left
    is not lent a machine, a young one with 30 left is."""
    prof = (1.0, 0.2, 1, 0.0, 0.0, 1)         # 1 iteration per epoch
    old = JobView("job-0001", 1, 1.0, state="running", profile=prof, workers=("m0",),
                  sched_group="g1", epochs=30, epochs_left=1)
    assert harmony(ClusterView(M2, (), (old,))).pause == {}
    young = dataclasses.replace(old, epochs=3, epochs_left=30)
    assert harmony(ClusterView(M2, (), (young,))).pause == {"job-0001": ["m0", "m1"]}
    assert harmony(ClusterView(M2, (), (dataclasses.replace(old, epochs_left=None),))
                   ).pause == {"job-0001": ["m0", "m1"]}     # unknown: as many as it ran


def test_complementary_jobs_share_a_group_and_the_decision_is_stable():
    cpu = (1.0, 0.1, 1)
    net = (0.1, 1.0, 1)
    view = ClusterView(M2, (), (job(1, "running", cpu, ["m0"], "g1"),
                                job(2, "running", net, ["m1"], "g2")))
    view, _ = settle(view)
    # whatever the grouping, a second call changes nothing
    dec = harmony(view)
    assert not (dec.profile or dec.start or dec.pause or dec.promote)
    assert {j.state for j in view.active} == {"running"}


def test_a_finished_job_frees_machines_for_the_rest():
    cpu = (1.0, 0.1, 1)

    def two(epochs):          # it asked for 2 machines and got 1
        return JobView("job-0001", 2, 1.0, state="running", profile=cpu, workers=("m0",),
                       sched_group="g1", epochs=epochs)
    view = ClusterView(M2, (), (two(5),))      # job 2 on m1 finished
    dec = harmony(view)
    assert dec.pause == {"job-0001": ["m0", "m1"]}
    # a job with little done is taken to have little left: a move would not repay
    assert not harmony(ClusterView(M2, (), (two(1),))).pause


def test_widening_stops_where_the_speed_up_curve_does():
    # remote traffic: 1.25 s per iteration on 1 machine, 1.0 + 0.5 + 0.05 on 2
    chatty = (1.0, 0.05, 1, 1.0)
    view = ClusterView(M2, (), (job(1, "running", chatty, ["m0"], "g1", epochs=5),))
    assert not harmony(view).pause


def test_a_job_that_lowers_utilization_waits():
    # two saturated complementary groups: a third CPU-heavy job fits nowhere
    cpu, net = (1.0, 0.1, 1), (0.1, 1.0, 1)
    view = ClusterView(M2, (job(5, "profiled", cpu),),
                       (job(1, "running", cpu, ["m0"], "g1"), job(2, "running", net, ["m0"], "g1"),
                        job(3, "running", cpu, ["m1"], "g2"), job(4, "running", net, ["m1"], "g2")))
    dec = harmony(view)
    assert not dec.pause and not dec.start and not dec.promote
    assert dec.predicted == {"g1": pytest.approx(1.1), "g2": pytest.approx(1.1)}


def test_no_regrouping_for_less_than_five_percent():
    # g1 leaves the network 7% idle, g2 nothing: U is within 1.2% of its
    # maximum, so no regrouping can gain 5%
    view = ClusterView(M2, (), (
        job(1, "running", (1.0, 0.1, 1), ["m0"], "g1"),
        job(2, "running", (0.1, 0.92, 1), ["m0"], "g1"),
        job(3, "running", (1.0, 0.1, 1), ["m1"], "g2"),
        job(4, "running", (0.1, 1.0, 1), ["m1"], "g2")))
    dec = harmony(view)
    assert not dec.pause and not dec.start


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
    j = JobView("job-0001", 1, 1.0, state="running", profile=(1.0, 0.2, 1, 0.0, 0.0, 10),
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
    busy = (1.0, 0.01, 1, 0.0, 0.0, 1)       # 1 iteration per epoch
    gaps = (0.75, 0.75, 1, 0.0, 0.0, 1)      # epochs of 1.5 s
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
