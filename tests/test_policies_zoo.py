"""The comparison policies (muri, slaq) as pure functions on hand-made views,
and each end to end in the simulator (harmony.master.muri_policy,
harmony.master.slaq_policy)."""
from __future__ import annotations

import pytest

from harmony.master import policy as P
from harmony.master.muri_policy import MIN_EFF, efficiency, match, muri
from harmony.master.policy import ClusterView, JobView, WorkerView
from harmony.master.slaq_policy import slaq, slaq_maxmin
from harmony.sched.model import Profile
from harmony.sim.run import setup, simulate
from harmony.sim.trace import LossCurve, TraceJob


def workers(*loads):
    return tuple(WorkerView(f"m{i}", 8, 1 << 30, n) for i, n in enumerate(loads))


def prof(cpu, net, dop=1):
    return (cpu, net, dop, 0.0)


# ---------------------------------------------------------------- muri

def test_pair_efficiency_is_work_over_twice_the_interleaved_iteration():
    a, b = Profile("a", 1.0, 0.2, 1), Profile("b", 0.2, 1.0, 1)
    # Eq 4.1: max(1.2, 1.2, 1.2) = 1.2; work 2.4 -> 2.4 / 2.4 = 1
    assert efficiency(a, b, 1) == pytest.approx(1.0)
    # two CPU-bound jobs: max(2.0, 0.4, 1.2) = 2.0; work 2.4 -> 0.6
    assert efficiency(a, Profile("c", 1.0, 0.2, 1), 1) == pytest.approx(0.6)
    # COMP halves on 2 machines: a (0.5, 0.2), b (0.1, 1.0): max(0.6, 1.2, 1.1)
    assert efficiency(a, b, 2) == pytest.approx(1.8 / 2.4)


def test_matching_maximizes_total_efficiency_not_greedy_pairs():
    """Greedy takes the best pair c-d (0.875), leaving a-b (0.5625): 1.4375.
    The maximum-weight matching takes a-d (0.71875) and b-c (0.8214): 1.54."""
    p = {"a": Profile("a", 0.1, 0.6, 1), "b": Profile("b", 0.1, 1.0, 1),
         "c": Profile("c", 0.8, 0.4, 1), "d": Profile("d", 0.6, 1.0, 1)}
    e = {(x, y): efficiency(p[x], p[y], 1) for x in p for y in p if x < y}
    # hand-computed: c-d: (1.2 + 1.6) / (2 * max(1.4, 1.4, 1.6)) = 2.8 / 3.2
    assert e["c", "d"] == pytest.approx(0.875) and e["a", "b"] == pytest.approx(0.5625)
    assert e["a", "d"] == pytest.approx(2.3 / 3.2) and e["b", "c"] == pytest.approx(2.3 / 2.8)
    assert max(e, key=e.get) == ("c", "d")
    pairs = match(["a", "b", "c", "d"], p, {k: 1 for k in p})
    assert sorted(map(sorted, pairs)) == [["a", "d"], ["b", "c"]]
    # below MIN_EFF there is no edge: two CPU-only jobs stay unmatched
    q = {"x": Profile("x", 1.0, 0.0, 1), "y": Profile("y", 1.0, 0.0, 1)}
    assert efficiency(q["x"], q["y"], 1) == pytest.approx(0.5) and 0.5 < MIN_EFF
    assert match(["x", "y"], q, {"x": 1, "y": 1}) == []


def test_muri_starts_complementary_pairs_on_free_machines_fifo():
    view = ClusterView(workers(0, 0, 0, 0), waiting=(
        JobView("c1", 2, 0.0, state="profiled", profile=prof(1.0, 0.2)),
        JobView("c2", 2, 1.0, state="profiled", profile=prof(1.0, 0.2)),
        JobView("n1", 2, 2.0, state="profiled", profile=prof(0.2, 1.0)),
        JobView("n2", 1, 3.0, state="profiled", profile=prof(0.2, 1.0))))
    dec = muri(view)
    # c1 and c2 each pair with a network-heavy job; each pair on max(DoP) machines
    assert set(dec.start) == {"c1", "c2", "n1", "n2"}
    assert dec.assign["c1"] == dec.assign[[x for x in ("n1", "n2")
                                           if dec.start[x] == dec.start["c1"]][0]]
    assert len(dec.start["c1"]) == 2 and len(dec.start["c2"]) == 2
    assert not set(dec.start["c1"]) & set(dec.start["c2"])
    assert not dec.pause


def test_muri_lets_a_waiting_job_join_a_running_singleton_and_keeps_fifo():
    view = ClusterView(
        workers(1, 1, 0),
        waiting=(JobView("big", 3, 0.0, state="profiled", profile=prof(1.0, 0.2)),
                 JobView("net", 2, 1.0, state="profiled", profile=prof(0.2, 1.0)),
                 JobView("new", 1, 2.0)),
        active=(JobView("cpu", 2, -1.0, state="running", profile=prof(2.0, 0.4, 2),
                        workers=("m0", "m1"), sched_group="m:cpu"),))
    dec = muri(view)
    # net joins the CPU-bound singleton on its machines; big (3 machines) waits
    # for free ones and "new" may not overtake it (FIFO), though m2 is free
    assert dec.start == {"net": ["m0", "m1"]}
    assert dec.assign["net"] == dec.assign["cpu"] == "m:cpu"
    assert not dec.profile and not dec.pause


def test_muri_profiles_new_jobs_and_pauses_a_poor_pair():
    view = ClusterView(
        workers(1, 2),
        waiting=(JobView("new", 1, 5.0),),
        active=(JobView("solo", 1, 0.0, state="running", profile=prof(1.0, 0.2),
                        workers=("m0",), sched_group="m:solo"),
                JobView("host", 1, 1.0, state="running", profile=prof(1.0, 0.0),
                        workers=("m1",), sched_group="m:host"),
                JobView("guest", 1, 2.0, state="profiling", profile=prof(1.0, 0.0),
                        workers=("m1",), sched_group="m:host")))
    dec = muri(view)
    assert dec.pause == {"guest": None}          # two CPU-bound jobs: no gain
    assert dec.profile == {"new": ["m0"]}        # no free machine: beside a singleton
    # a profiled job alone stays where it is
    alone = ClusterView(workers(1), (), active=(JobView("p", 1, 0.0, state="profiling",
                                                    profile=prof(1.0, 0.2), workers=("m0",)),))
    dec = muri(alone)
    assert dec.promote == ["p"] and not dec.pause


# ---------------------------------------------------------------- slaq

def curve_points(curve: LossCurve, ks):
    return tuple((float(k), curve.loss(k)) for k in ks)


STEEP = LossCurve("linear", (0.9, 0.0, 1.0))        # still dropping fast after 20 iterations
FLAT = LossCurve("linear", (0.5, 0.0, 1.0))         # converged after 20 iterations


def test_slaq_gives_machines_to_the_job_whose_loss_drops_most():
    ks = range(2, 22, 2)
    view = ClusterView(workers(0, 0, 0, 0, 0), waiting=(
        JobView("flat", 4, 0.0, state="paused", profile=prof(60.0, 0.0, 1),
                progress=curve_points(FLAT, ks)),
        JobView("steep", 4, 1.0, state="paused", profile=prof(60.0, 0.0, 1),
                progress=curve_points(STEEP, ks))))
    dec = slaq(view)
    # one machine each, then the rest to the steep job (up to its request)
    assert len(dec.start["steep"]) == 4 and len(dec.start["flat"]) == 1
    assert not set(dec.start["steep"]) & set(dec.start["flat"])


def test_slaq_new_jobs_first_and_jobs_beyond_capacity_wait():
    ks = range(2, 22, 2)
    view = ClusterView(workers(1, 1), waiting=(
        JobView("new", 2, 5.0),),
        active=(JobView("flat", 1, 0.0, state="running", profile=prof(60.0, 0.0, 1),
                        progress=curve_points(FLAT, ks), workers=("m0",)),
                JobView("steep", 1, 1.0, state="running", profile=prof(60.0, 0.0, 1),
                        progress=curve_points(STEEP, ks), workers=("m1",))))
    dec = slaq(view)
    # a new job's first machine gains most (1, normalized); the converged
    # job has the smallest gain: it is paused and its machine goes to "new"
    assert dec.pause == {"flat": None}
    assert dec.start == {"new": ["m0"]}


def test_slaq_resizes_running_jobs_and_maxmin_favours_the_highest_loss():
    ks = range(2, 22, 2)
    active = (JobView("flat", 3, 0.0, state="running", profile=prof(60.0, 0.0, 1),
                      progress=curve_points(FLAT, ks), workers=("m0", "m1")),
              JobView("steep", 3, 1.0, state="running", profile=prof(60.0, 0.0, 1),
                      progress=curve_points(STEEP, ks), workers=("m2",)))
    view = ClusterView(workers(1, 1, 1, 0), (), active=active)
    dec = slaq(view)
    assert dec.pause == {"flat": ["m0"], "steep": ["m2", "m3", "m1"]}
    # max-min: the steep job has the larger loss left, it gets the spare machine
    # first; the converged one keeps one machine
    dec = slaq_maxmin(view)
    assert len(dec.pause.get("steep", ["m2"])) >= 2
    assert len(dec.pause.get("flat", ["m0", "m1"])) <= 2


# ---------------------------------------------------------------- end to end

def small_trace():
    jobs = []
    for i in range(6):
        cpu, net = (0.8, 0.1) if i % 2 else (0.1, 0.8)
        curve = LossCurve("sublinear", (0.0, 0.05 * (i + 1), 1.0, 0.5))
        jobs.append(TraceJob(id=f"t{i}", arrival=5.0 * i, app="synthetic", iterations=40,
                             iters_per_epoch=4, cpu_s=cpu, bytes=net * 1.25e9,
                             net_s=net, ref_dop=2, machines=2, curve=curve))
    return jobs


@pytest.mark.parametrize("name", ["muri", "slaq", "slaq-maxmin"])
def test_policies_run_end_to_end_in_the_simulator(name):
    assert name in P.POLICIES and getattr(P.POLICIES[name], "preempts", False)
    res = simulate(small_trace(), 4, name, grain=10)
    assert not res.meta["unfinished"]
    assert all(j.end == j.end for j in res.jobs)       # every job finished (no NaN)
    if name == "muri":
        assert setup(name) == ("muri", "harmony")     # its pairs need the subtask queues
        assert any(d.data.get("promote") or d.data.get("start") for d in res.decisions)
