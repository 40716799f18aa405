"""The queue replay: per-job iteration times of a group under the runtime's queues."""
from __future__ import annotations

import pytest

from harmony.policies.harmony import harmony
from harmony.policies.view import ClusterView, JobView, WorkerView
from harmony.sched.model import Profile, group_iter_time, job_iter_time
from harmony.sched.replay import Shape, iteration_times, predict


def test_alone_is_its_own_iteration_time():
    t = iteration_times([Shape("a", 0.7, 0.2, 0.03)])
    assert t["a"] == pytest.approx(0.93)


def test_two_cpu_jobs_take_turns():
    t = iteration_times([Shape("a", 1.0, 0.0), Shape("b", 1.0, 0.0)])
    assert t == pytest.approx({"a": 2.0, "b": 2.0})


def test_complementary_pair_between_eq41_and_one_after_the_other():
    shapes = [Shape("a", 1.0, 0.2), Shape("b", 0.2, 1.0)]
    t = iteration_times(shapes)
    eq41 = group_iter_time([Profile("a", 1.0, 0.2, 1), Profile("b", 0.2, 1.0, 1)], 1)
    for v in t.values():
        assert eq41 - 1e-9 <= v < 2.4       # never better than Eq 4.1, better than in turn


def test_a_transfers_cpu_work_slows_the_comp_beside_it():
    """Issue #34 item 2: a COMM's own CPU (framing, encryption, the I/O
    threads) shares the core with the partner's COMP. A CPU job beside a
    network job whose transfers keep 40% of a core busy runs its COMP at
    0.6 of its pace while they move; alone (no partner) nothing changes, and
    Eq 4.1's CPU sum counts the COMM's CPU too."""
    def pair(net_cpu):
        return iteration_times([Shape("cpu", 1.0, 0.2), Shape("net", 0.2, 1.0,
                                                              net_cpu=net_cpu)])
    t0, t1, t3 = pair(0.0), pair(0.4), pair(3.0)
    assert t0["cpu"] == pytest.approx(1.4)
    # its 1 s COMP is beside the partner's transfers at 0.6 of its pace
    assert t0["cpu"] * 1.3 < t1["cpu"] <= t0["cpu"] / 0.6 + 1e-9, t1
    # at most half the core: two busy threads share it fairly
    assert t1["cpu"] < t3["cpu"] <= t0["cpu"] / 0.5 + 1e-9, t3
    # a job's own COMM never runs beside its own COMP
    assert iteration_times([Shape("a", 0.7, 0.2, 0.03, net_cpu=0.2)])["a"] == \
        pytest.approx(0.93)
    p_cpu, p_net = Profile("cpu", 1.0, 0.0, 1), Profile("net", 0.0, 1.0, 1, comm_cpu=0.4)
    assert group_iter_time([p_cpu, p_net], 1) == pytest.approx(1.4)
    assert job_iter_time(p_net, 1) == pytest.approx(1.0)


def test_partner_at_its_epoch_end_runs_alone():
    """Eq 4.1 says 2 s per iteration for two equal CPU jobs; with 2 iterations
    per epoch and a 2 s epoch end (barrier, report) the partner is away a
    large part of the time, and each job's iterations run faster."""
    shapes = [Shape(x, 1.0, 0.0, iters=2, end_other=2.0) for x in "ab"]
    t = iteration_times(shapes)
    assert all(1.0 <= v < 1.9 for v in t.values()), t


def test_short_comp_preempts_a_long_one():
    """The queue stops a COMP 4x longer for a short one (harmony.subtasks.queues):
    the short job does not wait out its partner's long COMP as in lockstep."""
    t = iteration_times([Shape("short", 0.1, 0.05), Shape("long", 1.0, 0.05)])
    assert t["short"] < 0.6 < 1.1 <= t["long"], t


def test_bad_shapes():
    with pytest.raises(ValueError):
        Shape("a", -1.0, 0.0)
    with pytest.raises(ValueError):
        iteration_times([Shape("a", 1.0, 0.0), Shape("a", 1.0, 0.0)])


def test_predict_alone_and_cached():
    p = Profile("a", 0.5, 0.1, 1, overhead=0.02, iters=2, end_cpu=0.3)
    assert predict([p], 1) == {"a": pytest.approx(job_iter_time(p, 1))}
    q = Profile("b", 0.1, 0.5, 1, iters=3)
    one, two = predict([p, q], 1), predict([p, q], 1)
    assert one == two and set(one) == {"a", "b"}
    # on 2 machines COMP halves: both iterate faster
    wide = predict([p, q], 2)
    assert wide["a"] < one["a"]


def test_harmony_decision_predicts_per_job():
    """The scheduler's decision carries each grouped job's own prediction."""
    w = (WorkerView("m0", 1, 1 << 30, 2),)
    prof = {"j1": Profile("j1", 1.0, 0.05, 1, 0.0, 0.01, 2, 0.3, 0.2),
            "j2": Profile("j2", 0.1, 0.6, 1, 0.0, 0.01, 2, 0.1, 0.2)}
    active = tuple(JobView(j, 1, float(i), state="running", profile=prof[j], workers=("m0",),
                           sched_group="g", epochs=5) for i, j in enumerate(prof))
    dec = harmony(ClusterView(workers=w, waiting=(), active=active, now=10.0))
    assert set(dec.predicted_jobs) == {"j1", "j2"}
    want = predict(list(prof.values()), 1)
    assert dec.predicted_jobs == pytest.approx(want)
    assert dec.predicted_jobs["j1"] != dec.predicted_jobs["j2"]


def test_long_epochs_are_replayed_capped_with_the_same_end_share():
    """An epoch of 400 iterations is replayed as one of ITERS_CAP with its end
    scaled alike: the prediction matches the explicitly scaled shape's."""
    from harmony.sched.replay import ITERS_CAP
    p = Profile("a", 1.0, 0.1, 1, iters=400, end_cpu=40.0, end_other=8.0)
    q = Profile("b", 0.2, 0.5, 1, iters=ITERS_CAP)
    f = ITERS_CAP / 400
    small = Profile("a", 1.0, 0.1, 1, iters=ITERS_CAP, end_cpu=40.0 * f, end_other=8.0 * f)
    assert predict([p, q], 1) == pytest.approx(predict([small, q], 1))


def test_a_job_that_laps_its_partner_thousands_of_times_is_bounded():
    """A 0.1 ms job beside a 1 s one: the replay stops at its event bound
    (fast: it runs in the master's loop). The short job stops the long COMP
    at most MAX_BYPASS times over its run, so the long job keeps its own
    pace (its COMP and COMM, 1.01 s, plus the bypasses and its partner's
    COMM), and the short one waits behind each long COMP."""
    r = iteration_times([Shape("fast", 1e-4, 1e-4, iters=4), Shape("slow", 1.0, 0.01, iters=4)])
    assert r["slow"] == pytest.approx(1.01, rel=0.02) and r["fast"] < 0.02


def test_replay_predicts_whole_epochs_beside_the_training_phase():
    """A job's epoch (its end included) is what its progress follows; where a
    wait falls, in its training phase or at its epoch's end, is not. Alone:
    training + end / iters. A CPU-bound pair on one machine: each epoch at
    least as long as alone, and the CPU never busier than 100%."""
    from harmony.sched.replay import replay
    long = Shape("long", 0.36, 0.0, 0.01, 2, 0.04, 0.0, 0.01)
    short = Shape("short", 0.11, 0.016, 0.01, 2, 0.046, 0.0, 0.01)
    alone = {s.id: replay([s])[s.id] for s in (long, short)}
    for s in (long, short):
        train, epoch = alone[s.id]
        assert epoch == pytest.approx(train + (s.end_cpu + s.end_other) / s.iters)
    both = replay([long, short])
    assert all(both[j][1] >= alone[j][1] for j in both)
    busy = sum((s.t_cpu * s.iters + s.end_cpu) / (both[s.id][1] * s.iters) for s in (long, short))
    assert busy <= 1.0 + 1e-9
    assert both["long"][1] == pytest.approx(both["short"][1], rel=0.05)  # one cycle per epoch
