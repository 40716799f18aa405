"""The performance model (Eq 4.1-4.4) on hand-computed cases."""
import dataclasses

import pytest

import numpy as np

from harmony.sched.model import (CPU_WEIGHT, Profile, cluster_util, comm_cpu_at,
                                 group_iter_time, group_util, job_iter_time, score, t_cpu_at,
                                 t_net_at, steady)
from harmony.sched.synthetic import random_profiles


def test_tcpu_scales_with_dop_and_tnet_does_not():
    p = Profile("a", t_cpu=4.0, t_net=1.0, dop=2)     # 8 s of COMP on one machine
    assert t_cpu_at(p, 2) == 4.0
    assert t_cpu_at(p, 4) == 2.0
    assert t_cpu_at(p, 1) == 8.0
    assert job_iter_time(p, 4) == 3.0                 # 2 s COMP + 1 s COMM
    assert p.work == 8.0


def test_group_iter_time_three_cases():
    # CPU-bound: sum Tcpu = 4 + 2 = 6 > sum Tnet = 2, longest job 4 + 1 = 5
    cpu_bound = [Profile("a", 4, 1, 2), Profile("b", 2, 1, 2)]
    assert group_iter_time(cpu_bound, 2) == 6.0
    # at 4 machines Tcpu halves: sums 3 and 2, longest job 2 + 1 = 3
    assert group_iter_time(cpu_bound, 4) == 3.0
    # network-bound: sum Tnet = 5 > sum Tcpu = 2, longest job 1 + 3 = 4
    net_bound = [Profile("a", 1, 3, 1), Profile("b", 1, 2, 1)]
    assert group_iter_time(net_bound, 1) == 5.0
    # job-bound: sums 1.5 and 5.5, but job a alone takes 1 + 5 = 6
    job_bound = [Profile("a", 1, 5, 1), Profile("b", 0.5, 0.5, 1)]
    assert group_iter_time(job_bound, 1) == 6.0
    assert group_iter_time([], 3) == 0.0


def test_group_util():
    cpu_bound = [Profile("a", 4, 1, 2), Profile("b", 2, 1, 2)]
    assert group_util(cpu_bound, 2) == pytest.approx((1.0, 2 / 6))
    job_bound = [Profile("a", 1, 5, 1), Profile("b", 0.5, 0.5, 1)]
    assert group_util(job_bound, 1) == pytest.approx((1.5 / 6, 5.5 / 6))
    # two identical jobs at their balance DoP pipeline perfectly
    twins = [Profile("a", 2, 1, 1), Profile("b", 2, 1, 1)]
    assert group_util(twins, 2) == pytest.approx((1.0, 1.0))
    assert group_util([], 2) == (0.0, 0.0)


def test_cluster_util_is_machine_weighted():
    g1 = [Profile("a", 4, 1, 2), Profile("b", 2, 1, 2)]      # (1, 1/3) on 2 machines
    g2 = [Profile("c", 1, 5, 1), Profile("d", 0.5, 0.5, 1)]  # (1/4, 11/12) on 1 machine
    cpu, net = cluster_util([(g1, 2), (g2, 1)])
    assert cpu == pytest.approx((2 * 1.0 + 1 * 0.25) / 3)
    assert net == pytest.approx((2 * (1 / 3) + 1 * (11 / 12)) / 3)
    # with the whole cluster as denominator, idle machines count as 0%
    cpu5, net5 = cluster_util([(g1, 2), (g2, 1)], total_machines=5)
    assert cpu5 == pytest.approx(cpu * 3 / 5) and net5 == pytest.approx(net * 3 / 5)
    assert cluster_util([]) == (0.0, 0.0)


def test_score_weighs_cpu_above_network():
    assert score(1.0, 0.0) == pytest.approx(CPU_WEIGHT)
    assert score(0.0, 1.0) == pytest.approx(1 - CPU_WEIGHT)
    assert score(1.0, 1.0) == pytest.approx(1.0)
    assert CPU_WEIGHT > 0.5
    assert score(0.9, 0.5) > score(0.5, 0.9)


def test_profile_validation_and_the_masters_profile_of_a_job():
    from harmony.master.jobs import Job
    with pytest.raises(ValueError):
        Profile("a", -1.0, 1.0, 1)
    with pytest.raises(ValueError):
        Profile("a", 1.0, 1.0, 0)
    # the master's profile of a job: from the moving averages of its reports
    j = Job("j", "a.py", "", [], 4)
    assert j.sched_profile() is None                   # nothing measured yet
    tm = {"comp": 1.0, "pull": 0.2, "push": 0.3, "train": 1.6, "iters": 2.0,
          "bytes": 2e6, "link": 1e7, "eval": 0.25}
    j.update_profile(tm, 4, alone=True, wall=2.0)
    assert j.sched_profile(need=2) is None             # one epoch of two
    p = j.sched_profile()
    # (t_cpu, t_net, dop, remote = bytes / link, overhead, iters, end_cpu,
    # end_other = wall - train - eval, cpu_fixed, comm_cpu: none reported,
    # t_cpu_low: not from one sample)
    assert p.id == "j" and dataclasses.astuple(p)[1:] == pytest.approx(
        (0.5, 0.25, 4, 0.1, 0.05, 2.0, 0.25, 0.15, 0.0, 0.0, 0.0))
    assert j.sched_profile() is p                      # unchanged averages: the same one
    j.update_profile(tm, 4)
    # a second epoch alike (now with a lowest recent COMP: the same)
    assert j.sched_profile(need=2) == dataclasses.replace(p, t_cpu_low=0.5)
    j.update_profile(dict(tm, comp=2.0), 4)
    assert j.sched_profile().t_cpu == pytest.approx(0.65)   # 0.7 * 0.5 + 0.3 * 1.0
    # the lowest COMP of the last COMP_KEPT epochs beside the average; what
    # model.steady judges a move on
    assert j.sched_profile().t_cpu_low == pytest.approx(0.5)
    assert steady(j.sched_profile()).t_cpu == pytest.approx(0.5)
    # it is derived, not stored: the durable record holds the averages only
    assert "_sched_profile" not in j.to_record() and Job.from_record(
        j.to_record()).sched_profile() == j.sched_profile()
    # the CPU its COMM costs the machine: the executor's CPU while training
    # less its COMP thread's, per iteration, averaged from its first report
    j.update_profile(dict(tm, train_cpu=1.3, comp_cpu=0.9), 4)
    assert j.sched_profile().comm_cpu == pytest.approx(0.2)
    j.update_profile(dict(tm, train_cpu=1.5, comp_cpu=0.9), 4)
    assert j.sched_profile().comm_cpu == pytest.approx(0.7 * 0.2 + 0.3 * 0.3)


def test_the_lowest_recent_comp_keeps_a_window_and_restarts_at_a_new_dop():
    from harmony.master.jobs import COMP_KEPT, Job
    j = Job("j", "a.py", "", [], 2)
    tm = {"comp": 0.2, "pull": 0.1, "push": 0.1, "train": 0.4, "iters": 1.0}
    j.update_profile(tm, 2)
    j.update_profile(dict(tm, comp=0.1), 2)               # one quiet epoch
    for _ in range(COMP_KEPT - 1):
        j.update_profile(dict(tm, comp=0.3), 2)           # then a crowded host
    p = j.sched_profile()
    assert p.t_cpu_low == pytest.approx(0.1) and p.t_cpu > 0.25
    j.update_profile(dict(tm, comp=0.3), 2)               # the quiet one leaves the window
    p = j.sched_profile()          # (never above the average, still a little below 0.3)
    assert p.t_cpu_low == p.t_cpu and 0.28 < p.t_cpu < 0.3
    j.update_profile(dict(tm, comp=0.5), 1)               # another DoP: from scratch
    assert j.sched_profile().t_cpu_low == 0.0
    # steady keeps a fixed part within the lower COMP, and a profile
    # without one as it is
    q = Profile("q", 0.4, 0.1, 2, cpu_fixed=0.3, t_cpu_low=0.2)
    assert (steady(q).t_cpu, steady(q).cpu_fixed) == (0.2, 0.2)
    assert steady(Profile("r", 0.4, 0.1, 2)) == Profile("r", 0.4, 0.1, 2)
    with pytest.raises(ValueError):
        Profile("s", 0.4, 0.1, 2, t_cpu_low=0.5)          # never above the average


# ------------------------------------------------ COMM's CPU at a DoP
def test_comm_cpu_scales_with_the_bytes_that_cross_the_network():
    p = Profile("a", 0.4, 0.2, 2, remote=0.2, comm_cpu=0.02)
    assert comm_cpu_at(p, 2) == pytest.approx(0.02)
    assert comm_cpu_at(p, 4) == pytest.approx(0.02 * (3 / 4) / (1 / 2))
    assert comm_cpu_at(p, 1) == 0.0
    alone = Profile("b", 0.4, 0.003, 1, comm_cpu=0.003)   # all local: kept at any m
    assert comm_cpu_at(alone, 4) == 0.003
    with pytest.raises(ValueError):
        Profile("c", 0.4, 0.2, 2, comm_cpu=-0.1)


# ------------------------------------------------ Tnet at a DoP (remote > 0)
def test_t_net_at_hand_cases():
    # measured on 4 machines: 3/4 of R = 2 was remote, so base = 3 - 1.5 = 1.5
    p = Profile("a", t_cpu=2.0, t_net=3.0, dop=4, remote=2.0)
    assert p.net_base == 1.5
    assert t_net_at(p, 1) == 1.5                      # one machine: all traffic local
    assert t_net_at(p, 2) == 2.5                      # half of R is remote
    assert t_net_at(p, 4) == 3.0                      # where it was measured
    assert t_net_at(p, 8) == pytest.approx(1.5 + 2.0 * 7 / 8)
    assert t_net_at(p, 1e9) == pytest.approx(3.5)     # large m: base + R
    assert all(t_net_at(p, m) < t_net_at(p, m + 1) for m in range(1, 20))
    # a job profiled on one machine shows only its base
    q = Profile("q", 1.0, 0.25, 1, remote=4.0)
    assert t_net_at(q, 1) == 0.25 and t_net_at(q, 2) == 2.25 and t_net_at(q, 4) == 3.25
    # remote larger than the measured COMM allows: base clamps at 0
    c = Profile("c", 1.0, 0.5, 2, remote=4.0)
    assert c.net_base == 0.0 and t_net_at(c, 1) == 0.0 and t_net_at(c, 2) == 2.0


def test_t_net_at_is_constant_without_remote():
    p = Profile("a", 2.0, 1.3, 3)
    assert p.remote == 0.0 and p.net_base == 1.3
    assert [t_net_at(p, m) for m in (1, 2, 3, 7, 1000)] == [1.3] * 5


def test_t_net_at_round_trip_at_the_measured_dop():
    for p in random_profiles(200, 7, dop=3, remote=(0.0, 1.5)):
        assert t_net_at(p, p.dop) == pytest.approx(p.t_net, rel=1e-12, abs=1e-12)
        assert t_net_at(p, 1) == pytest.approx(p.net_base)
    # exact where the arithmetic is exact
    p = Profile("b", 1.0, 1.5, 2, remote=1.0)
    assert t_net_at(p, 2) == 1.5 and t_net_at(p, 1) == 1.0


def test_group_time_and_util_with_remote():
    a = Profile("a", t_cpu=4.0, t_net=1.5, dop=2, remote=2.0)   # work 8, base 0.5
    b = Profile("b", t_cpu=1.0, t_net=2.0, dop=1)                # constant COMM 2
    g = [a, b]
    # m = 1: COMP 8 + 1 = 9, COMM 0.5 + 2 = 2.5: CPU-bound
    assert group_iter_time(g, 1) == 9.0
    assert group_util(g, 1) == pytest.approx((1.0, 2.5 / 9))
    # m = 2: COMP 4 + 0.5, COMM 1.5 + 2; job a alone takes 4 + 1.5: job-bound
    assert job_iter_time(a, 2) == 5.5
    assert group_iter_time(g, 2) == 5.5
    assert group_util(g, 2) == pytest.approx((4.5 / 5.5, 3.5 / 5.5))
    # m = 4: COMP 2 + 0.25, COMM (0.5 + 1.5) + 2 = 4: network-bound (the
    # constant model would say COMM 3.5)
    assert job_iter_time(a, 4) == 4.0
    assert group_iter_time(g, 4) == 4.0
    assert group_util(g, 4) == pytest.approx((2.25 / 4, 1.0))
    const = [Profile("a", 4.0, 1.5, 2), b]
    assert group_iter_time(const, 4) == 3.5
    cpu, net = cluster_util([(g, 1), (g, 4)])
    assert cpu == pytest.approx((1 * 1.0 + 4 * 2.25 / 4) / 5)
    assert net == pytest.approx((1 * 2.5 / 9 + 4 * 1.0) / 5)


def test_remote_profile_validation_and_record():
    with pytest.raises(ValueError):
        Profile("a", 1.0, 1.0, 1, remote=-0.5)
    with pytest.raises(ValueError):
        Profile("a", 1.0, 1.0, 1, remote=float("nan"))
    # seeds draw the same profiles with or without the remote option
    plain, rem = random_profiles(20, 3), random_profiles(20, 3, remote=0.5)
    ranged = random_profiles(20, 3, remote=(0.5, 1.0))
    assert [(p.t_cpu, p.t_net) for p in plain] == [(p.t_cpu, p.t_net) for p in rem] == \
        [(p.t_cpu, p.t_net) for p in ranged]
    assert all(0.5 * p.t_net <= p.remote <= p.t_net for p in ranged)
    assert all(p.remote == 0 for p in plain)
    assert np.allclose([p.remote for p in rem], [0.5 * p.t_net for p in rem])


def test_a_jobs_measured_overhead_counts_in_its_own_iteration_time():
    from harmony.master.jobs import Job
    from harmony.sched.model import Profile, group_iter_time, job_iter_time
    p = Profile("a", 0.4, 0.2, 1, overhead=0.1)
    assert (p.remote, p.overhead) == (0.0, 0.1)
    assert job_iter_time(p, 1) == pytest.approx(0.7)
    q = Profile("b", 0.2, 0.4, 1)
    # the sums are work the resources do; the overhead is the job's own wait
    assert group_iter_time([p, q], 1) == pytest.approx(0.7)
    assert group_iter_time([p], 1) == pytest.approx(0.7)
    # measured only while the job runs alone: in a group its waits for the
    # other jobs' subtasks are in that time too
    j = Job("j", "a.py", "", [], 1)
    tm = {"comp": 0.4, "pull": 0.1, "push": 0.1, "train": 0.75, "iters": 1}
    j.update_profile(tm, 1, alone=False)
    assert "overhead" not in j.profile
    j.update_profile(tm, 1, alone=True)
    assert j.profile["overhead"] == pytest.approx(0.15)


def test_a_steady_jobs_profile_converges_geometrically():
    """The moving average (weight 0.3): a steady job's profile is its sample
    from the first epoch; after a step the gap to the new value shrinks by
    0.7 every epoch, and a change of machine count starts it over."""
    from harmony.master.jobs import Job
    j = Job("j", "a.py", "", [], 2)
    steady = {"comp": 0.06, "pull": 0.02, "push": 0.02, "train": 0.1, "iters": 2}
    for _ in range(3):
        j.update_profile(steady, 2)
        assert j.profile["t_cpu"] == pytest.approx(0.03)
        assert j.profile["t_net"] == pytest.approx(0.02)
    step = dict(steady, comp=0.16)           # COMP 0.08 s per iteration from now on
    gaps = []
    for _ in range(6):
        j.update_profile(step, 2)
        gaps.append(0.08 - j.profile["t_cpu"])
    assert gaps == pytest.approx([0.05 * 0.7 ** (k + 1) for k in range(6)])
    j.update_profile(steady, 3)
    assert j.profile["machines"] == 3 and j.profile["t_cpu"] == pytest.approx(0.03)
    # ... keeping the COMP it measured at the DoP it left: COMP 0.08 s per
    # iteration on 2 machines and still 0.06 s on 4 is mostly fixed part in
    # the view's profile (f + w/m: f = 0.04)
    from harmony.sched.model import t_cpu_at
    k = Job("k", "a.py", "", [], 2)
    for _ in range(2):
        k.update_profile(step, 2)
    k.update_profile(dict(steady, comp=0.12), 4)
    assert k.profile["cpu_prev"] == [2, pytest.approx(0.08)]
    prof = k.sched_profile()
    assert prof.dop == 4 and prof.cpu_fixed == pytest.approx(0.04)
    assert t_cpu_at(prof, 8) == pytest.approx(0.05)      # not 0.03


def test_steady_epochs_restart_at_a_move():
    """JobView.steady counts the epochs measured at the job's current width:
    right after a move (before an epoch there) it is 0, not the old width's
    samples."""
    from harmony.master.core.views import _steady
    from harmony.master.jobs import Job
    j = Job("j", "a.py", "", [], 2)
    j.workers = ["m0", "m1"]
    step = {"comp": 0.1, "pull": 0.02, "push": 0.02, "train": 0.2, "iters": 2}
    for _ in range(4):
        j.update_profile(step, 2)
    assert _steady(j) == 4
    j.workers = ["m0"]                     # moved, no epoch there yet
    assert _steady(j) == 0
    j.update_profile(step, 1)
    assert _steady(j) == 1


def test_iter_s_is_the_recent_epochs_since_the_job_was_placed():
    """JobView.iter_s: the median interval between the last epochs' ends
    over their iterations, only among the epochs that ended after the job
    was last placed (its machines or its mates changed: the first of them
    only a starting point), at least 3 intervals, at most the latest 5; an
    epoch without an iteration count counts the profile's."""
    from harmony.master.core.views import _iter_s
    from harmony.master.jobs import Job
    j = Job("j", "a.py", "", [], 1)
    j.workers = ["m0"]
    step = {"comp": 0.1, "pull": 0.0, "push": 0.0, "train": 0.2, "iters": 2}
    assert _iter_s(j) is None
    for k, t in enumerate([10.0, 10.4, 10.8, 14.0, 14.4]):    # one 3.2 s stall
        j.epochs.append({"epoch": k, "timings": step, "time": t})
        j.update_profile(step, 1)
    assert _iter_s(j) == pytest.approx(0.2)      # median of 0.2, 0.2, 1.6, 0.2
    assert _iter_s(j, since=10.8) is None        # placed at 10.8: 2 intervals since
    for k, t in enumerate([15.4, 16.4, 17.4, 18.4, 19.4, 20.4], start=5):
        j.epochs.append({"epoch": k, "timings": {"train": 1.0}, "time": t})  # no iters
    assert _iter_s(j) == pytest.approx(0.5)      # the latest 5, over the profile's 2
    assert _iter_s(j, since=17.0) == pytest.approx(0.5)
    assert _iter_s(j, since=19.0) is None


def test_a_placement_stamps_the_job_and_its_mates():
    """The core stamps when a job's machines change, and when a job beside
    it comes or goes: its epochs before then are not where it runs now."""
    from harmony.master.core import MasterCore
    from harmony.master.jobs import Job, JobState
    core = MasterCore()
    a, b = Job("a", "a.py", "", [], 1), Job("b", "b.py", "", [], 1)
    for j in (a, b):
        j.state = JobState.RUNNING
        core.jobs[j.id] = j
    core.now = 5.0
    core._set_workers(a, ["m0"])
    assert core._placed_at == {"a": 5.0}
    core.now = 9.0
    core._set_workers(b, ["m0"])                 # a mate joins a's machine
    assert core._placed_at == {"a": 9.0, "b": 9.0}
    core.now = 12.0
    core._set_workers(b, ["m0"])                 # no change: no stamp
    assert core._placed_at["b"] == 9.0
    b.state = JobState.FINISHED
    core._set_workers(b, [])                     # b ends: a's mates changed
    assert core._placed_at == {"a": 12.0}
