"""The performance model (Eq 4.1-4.4) on hand-computed cases."""
import pytest

from harmony.sched.model import (CPU_WEIGHT, Profile, cluster_util, group_iter_time,
                                 group_util, job_iter_time, score, t_cpu_at)


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


def test_profile_validation_and_master_record():
    with pytest.raises(ValueError):
        Profile("a", -1.0, 1.0, 1)
    with pytest.raises(ValueError):
        Profile("a", 1.0, 1.0, 0)
    p = Profile.from_record("j", {"t_cpu": 0.5, "t_net": 0.25, "t_iter": 0.8,
                                  "machines": 4, "samples": 3})
    assert p == Profile("j", 0.5, 0.25, 4)
