"""The comparison policies (muri, slaq) as pure functions on hand-made views,
and each end to end in the simulator (harmony.policies.muri,
harmony.policies.slaq, ...)."""
from __future__ import annotations

import numpy as np
import pytest

from harmony.policies import registry as P
from harmony.policies.muri import MIN_EFF, efficiency, match, muri
from harmony.policies.slaq import slaq, slaq_maxmin
from harmony.policies.view import ClusterView, JobView, WorkerView
from harmony.sched.model import Profile
from harmony.sim.run import setup, simulate
from harmony.policies.curves import LossCurve
from harmony.sim.trace import TraceJob


def workers(*loads):
    return tuple(WorkerView(f"m{i}", 8, 1 << 30, n) for i, n in enumerate(loads))


def prof(jid, cpu, net, dop=1):
    return Profile(jid, cpu, net, dop)


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
        JobView("c1", 2, 0.0, state="profiled", profile=prof("c1", 1.0, 0.2)),
        JobView("c2", 2, 1.0, state="profiled", profile=prof("c2", 1.0, 0.2)),
        JobView("n1", 2, 2.0, state="profiled", profile=prof("n1", 0.2, 1.0)),
        JobView("n2", 1, 3.0, state="profiled", profile=prof("n2", 0.2, 1.0))))
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
        waiting=(JobView("big", 3, 0.0, state="profiled", profile=prof("big", 1.0, 0.2)),
                 JobView("net", 2, 1.0, state="profiled", profile=prof("net", 0.2, 1.0)),
                 JobView("new", 1, 2.0)),
        active=(JobView("cpu", 2, -1.0, state="running", profile=prof("cpu", 2.0, 0.4, 2),
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
        active=(JobView("solo", 1, 0.0, state="running", profile=prof("solo", 1.0, 0.2),
                        workers=("m0",), sched_group="m:solo"),
                JobView("host", 1, 1.0, state="running", profile=prof("host", 1.0, 0.0),
                        workers=("m1",), sched_group="m:host"),
                JobView("guest", 1, 2.0, state="profiling", profile=prof("guest", 1.0, 0.0),
                        workers=("m1",), sched_group="m:host")))
    dec = muri(view)
    assert dec.pause == {"guest": None}          # two CPU-bound jobs: no gain
    assert dec.profile == {"new": ["m0"]}        # no free machine: beside a singleton
    # a profiled job alone stays where it is
    alone = ClusterView(workers(1), (), active=(JobView("p", 1, 0.0, state="profiling",
                                                    profile=prof("p", 1.0, 0.2), workers=("m0",)),))
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
        JobView("flat", 4, 0.0, state="paused", profile=prof("flat", 60.0, 0.0, 1),
                progress=curve_points(FLAT, ks)),
        JobView("steep", 4, 1.0, state="paused", profile=prof("steep", 60.0, 0.0, 1),
                progress=curve_points(STEEP, ks))))
    dec = slaq(view)
    # one machine each, then the rest to the steep job (up to its request)
    assert len(dec.start["steep"]) == 4 and len(dec.start["flat"]) == 1
    assert not set(dec.start["steep"]) & set(dec.start["flat"])


def test_slaq_new_jobs_first_and_jobs_beyond_capacity_wait():
    ks = range(2, 22, 2)
    view = ClusterView(workers(1, 1), waiting=(
        JobView("new", 2, 5.0),),
        active=(JobView("flat", 1, 0.0, state="running", profile=prof("flat", 60.0, 0.0, 1),
                        progress=curve_points(FLAT, ks), workers=("m0",)),
                JobView("steep", 1, 1.0, state="running", profile=prof("steep", 60.0, 0.0, 1),
                        progress=curve_points(STEEP, ks), workers=("m1",))))
    dec = slaq(view)
    # a new job's first machine gains most (1, normalized); the converged
    # job has the smallest gain: it is paused and its machine goes to "new"
    assert dec.pause == {"flat": None}
    assert dec.start == {"new": ["m0"]}


def test_slaq_resizes_running_jobs_and_maxmin_favours_the_highest_loss():
    ks = range(2, 22, 2)
    active = (JobView("flat", 3, 0.0, state="running", profile=prof("flat", 60.0, 0.0, 1),
                      progress=curve_points(FLAT, ks), workers=("m0", "m1")),
              JobView("steep", 3, 1.0, state="running", profile=prof("steep", 60.0, 0.0, 1),
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


@pytest.mark.parametrize("name", ["muri", "slaq", "slaq-maxmin", "oasis", "mlfs", "mlfs-c"])
def test_policies_run_end_to_end_in_the_simulator(name):
    assert name in P.POLICIES
    assert P.make(name).preempts == (name != "oasis")   # oasis: start-only
    res = simulate(small_trace(), 4, name, grain=10)
    assert not res.meta["unfinished"]
    assert all(j.end == j.end for j in res.jobs)       # every job finished (no NaN)
    if name == "muri":
        assert setup(name) == ("muri", "harmony")     # its pairs need the subtask queues
        assert any(d.data.get("promote") or d.data.get("start") for d in res.decisions)
    if name in ("oasis", "mlfs", "mlfs-c"):
        assert setup(name) == (name, "naive")         # no queues: they co-locate by capacity


# ---------------------------------------------------------------- oasis

from harmony.policies import oasis as O  # noqa: E402
from harmony.policies.estimates import Estimator, shares  # noqa: E402
from harmony.policies.mlfs import mlfs, mlfs_c, ml_term, priorities  # noqa: E402


def test_oasis_admits_on_the_cheapest_machines_and_reports_ps_equal_to_workers():
    # m0, m1 hold a job using half of their CPU and link each: their prices
    # are higher, so a 2-machine job goes to m2, m3
    view = ClusterView(workers(1, 1, 0, 0), waiting=(
        JobView("new", 2, 0.0, state="paused", profile=prof("new", 1.0, 1.0, 2)),),
        active=(JobView("old", 2, -5.0, state="running", profile=prof("old", 1.0, 1.0, 2),
                        workers=("m0", "m1")),))
    dec = O.oasis(view)
    assert dec.start == {"new": ["m2", "m3"]}
    assert "2 workers + 2 PS" in dec.note


def test_oasis_uses_fewer_workers_when_capacity_is_short():
    # m0's link is taken (a network-only job): the waiting job needs link
    # share 0.5 on each machine, so of the 3 it asked for only m1, m2 fit
    view = ClusterView(workers(1, 0, 0), waiting=(
        JobView("j", 3, 0.0, state="paused", profile=prof("j", 1.0, 1.0, 3)),),
        active=(JobView("net", 1, -5.0, state="running", profile=prof("net", 0.0, 1.0, 1),
                        workers=("m0",)),))
    dec = O.oasis(view)
    assert dec.start == {"j": ["m1", "m2"]}


def test_oasis_rejects_a_job_whose_utility_does_not_pay_and_admits_a_later_one():
    view = ClusterView(workers(0, 0), waiting=(
        JobView("poor", 2, 0.0, state="paused", profile=prof("poor", 1.0, 1.0, 2), utility="1e-6"),
        JobView("rich", 2, 1.0, state="paused", profile=prof("rich", 1.0, 1.0, 2), utility="100")))
    dec = O.oasis(view)
    # the first job's payoff is negative: it waits without blocking the second.
    # A constant utility does not reward speed: the cheapest schedule wins,
    # 1 machine for 3600 s (COMP doubles) over 2 machines for 2400 s each
    assert dec.start == {"rich": ["m0"]}
    # alone, the poor job's utility sets the lowest price L: it is admitted
    assert "poor" in O.oasis(ClusterView(workers(0, 0), waiting=view.waiting[:1])).start


def test_oasis_prices_rise_exponentially_with_committed_shares():
    p = O.Prices(1, 0.01, np.array([100.0, 100.0]))
    p.add([0], 2, (0.5, 0.0))
    pr = p.price()
    assert pr[0, 0, 0] == pytest.approx(0.01 * (1e4) ** 0.5)      # L (U/L)^(g/c)
    assert pr[0, 0, 1] == pytest.approx(0.01) and pr[0, 2, 0] == pytest.approx(0.01)
    p.add([0], 1, (0.5, 0.0))
    assert p.price()[0, 0, 0] == pytest.approx(100.0)               # full: U


def test_oasis_sigmoid_utility_from_the_job_or_the_default():
    j = JobView("j", 1, 0.0, utility="sigmoid:10,0.01,1000")
    f = O.utility_fn(j, 500.0)
    assert f(1000.0) == pytest.approx(5.0) and f(0.0) > 9.9 and f(3000.0) < 0.01
    g = O.utility_fn(JobView("k", 1, 0.0), 500.0)     # default: midpoint at 2x the run
    assert g(1000.0) == pytest.approx(0.5) and g(0.0) > 0.98


# ---------------------------------------------------------------- mlfs

def test_mlfs_ml_term_is_the_last_drop_share_over_the_epoch_and_zero_at_first():
    j = JobView("j", 1, 0.0, epochs=3, progress=((1, 10.0), (2, 6.0), (3, 5.0)))
    assert ml_term(j) == pytest.approx((1 / 4) * (1 / 5))
    assert ml_term(JobView("n", 1, 0.0)) == 0.0                      # I = 1
    up = JobView("u", 1, 0.0, epochs=3, progress=((1, -10.0), (2, -6.0), (3, -5.0)))
    assert ml_term(up) == pytest.approx(ml_term(j))                  # a growing objective


def test_mlfs_priorities_are_normalized_and_mixed_with_alpha():
    now = 1000.0
    a = JobView("a", 1, 0.0, epochs=3, progress=((1, 10.0), (2, 6.0), (3, 5.0)),
                deadline=1100.0)
    b = JobView("b", 1, 900.0)
    view = ClusterView(workers(0), waiting=(a, b), now=now)
    p = priorities([a, b], view, Estimator(view), {"a", "b"})
    # a: P_ML 1 (b's is 0), its deadline and waiting time the largest: P_C 1
    assert p["a"] == pytest.approx(1.0) and p["b"] == pytest.approx(0.0)
    c = JobView("c", 1, 0.0)          # waited as long as a, no deadline, no progress
    view = ClusterView(workers(0), waiting=(a, c), now=now)
    p = priorities([a, c], view, Estimator(view), {"a", "c"})
    # P_C(c) = normalized (0.3 * 0 + 0.3 * 0 + 0.35 * 1) / max; a has all three
    assert p["c"] == pytest.approx(0.0) and p["a"] == pytest.approx(1.0)


def test_mlfs_places_by_priority_on_machines_under_90_percent_and_backfills():
    # m1 runs a job: one job's CPU and link shares add up to 1, so any
    # second job would take a resource over 90% there
    view = ClusterView(workers(0, 1, 0), waiting=(
        JobView("big", 3, 0.0), JobView("small", 2, 5.0)),
        active=(JobView("r", 1, -1.0, state="running", profile=prof("r", 1.0, 1.0, 1),
                        workers=("m1",)),), now=10.0)
    dec = mlfs(view)
    # big (3 machines) cannot be placed; small goes to the empty machines
    assert dec.start == {"small": ["m0", "m2"]}
    assert not dec.stop and not dec.pause


def test_mlfs_moves_the_low_priority_job_off_an_overloaded_machine():
    # m0 hosts two jobs whose measured shares add up to CPU 1.3: overloaded.
    # "late" has the lower priority (less progress per epoch, shorter wait)
    early = JobView("early", 1, 0.0, state="running", profile=prof("early", 0.8, 0.2, 1),
                    workers=("m0",), epochs=3, progress=((1, 10.0), (2, 6.0), (3, 5.0)))
    late = JobView("late", 1, 5.0, state="running", profile=prof("late", 0.5, 0.5, 1),
                   workers=("m0",), epochs=3, progress=((1, 10.0), (2, 9.9), (3, 9.89)))
    view = ClusterView(workers(2, 0), (), active=(early, late), now=100.0)
    dec = mlfs(view)
    assert dec.pause == {"late": ["m1"]}                 # a move (a live resize)
    # no free machine: it goes back to the queue
    view = ClusterView(workers(2), (), active=(early, late), now=100.0)
    assert mlfs(view).pause == {"late": None}


def test_mlfs_c_stops_converged_jobs_only_when_the_cluster_is_overloaded():
    ks = range(2, 22, 2)
    done = JobView("done", 1, 0.0, state="running", profile=prof("done", 60.0, 0.0, 1),
                   workers=("m0",), epochs=10, progress=curve_points(FLAT, ks))
    going = JobView("going", 1, 1.0, state="running", profile=prof("going", 60.0, 0.0, 1),
                    workers=("m1",), epochs=10, progress=curve_points(STEEP, ks))
    est = Estimator(ClusterView(workers(1, 1), (), active=(done, going)))
    assert est.gain_left(done) < 0.01 and est.gain_left(going) > 0.1
    busy = ClusterView(workers(1, 1), waiting=(JobView("w", 1, 5.0),),
                       active=(done, going), now=50.0)
    assert mlfs_c(busy).stop.keys() == {"done"}
    assert not mlfs(busy).stop                                # MLF-H alone never stops
    idle = ClusterView(workers(1, 1, 0), waiting=(JobView("w", 1, 5.0),),
                       active=(done, going), now=50.0)
    dec = mlfs_c(idle)
    assert dec.start == {"w": ["m2"]} and not dec.stop       # not overloaded


def test_estimates_demand_and_remaining_time():
    p = Profile("p", 3.0, 1.0, 1)
    assert shares(p, 1) == pytest.approx((0.75, 0.25))
    assert shares(p, 3) == pytest.approx((0.5, 0.5))          # COMP / 3 on 3 machines
    # a fitted curve: the iterations left until 95% of its reducible loss
    ks = range(2, 22, 2)
    j = JobView("j", 1, 0.0, state="running", profile=prof("j", 1.0, 0.0, 1), workers=("m0",),
                progress=curve_points(STEEP, ks))
    est = Estimator(ClusterView(workers(1), (), active=(j,)))
    left = est.remaining_iters(j)
    end = STEEP.iterations_to(STEEP.floor + 0.05 * (STEEP.loss(2) - STEEP.floor))
    assert left == pytest.approx(end - 20, abs=2)
    assert est.remaining_s(j, 1) == pytest.approx(left * 1.0)


def test_mlfs_c_early_stop_ends_the_job_in_the_simulator():
    """Decision.stop through the real master core: the job's executors stop
    at the next epoch end and the job ends FINISHED, noted as an early stop."""
    from harmony.sim.engine import Simulator
    from harmony.sim.run import sim_jobs
    jobs = []
    for i in range(4):
        jobs.append(TraceJob(id=f"t{i}", arrival=1.0 * i, app="synthetic", iterations=200,
                             iters_per_epoch=4, cpu_s=0.5, bytes=0.5 * 1.25e9, net_s=0.5,
                             ref_dop=2, machines=2,
                             curve=LossCurve("linear", (0.7, 0.0, 1.0))))
    sim = Simulator(sim_jobs(jobs, 1.25e9, grain=40), 2, policy="mlfs-c", mode="naive")
    out = sim.run()
    assert all(j["end"] is not None for j in out.jobs)
    early = [j for j in sim.core.jobs.values()
             if any("stopped early" in e[2] for e in j.events)]
    assert early, "no job was stopped early"
    plan = len(sim_jobs(jobs[:1], 1.25e9, grain=40)[0].plan)
    assert all(len(j.epochs) < plan for j in early)
    assert any(d.get("stop") for d in out.decisions)
