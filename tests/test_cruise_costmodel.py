"""harmony.cruise.costmodel: Eq 3.1-3.4 by hand, and the estimators."""
import math

import pytest

from harmony.cruise.costmodel import (BOTH, IDLE, SERVER, WORKER, Estimator, Machines,
                                      MovingAverage, Workload, block_cost, epoch_cost,
                                      role_of)

INF = math.inf


def test_epoch_cost_by_hand():
    # machines 0, 1 workers; 2, 3 servers; d items, m model units
    wproc = [0.01, 0.02, 0.01, 0.01]
    bw = [[INF, 10, 100, 50],
          [10, INF, 100, 100],
          [100, 100, INF, 10],
          [50, 100, 10, INF]]
    d, m = [300, 100, 0, 0], [0, 0, 60, 40]
    br = epoch_cost(wproc, bw, d, m, batch=100)
    # worker 0: 3 mini-batches; server-bound max(60*2/100, 40*2/50) = 1.6,
    # worker-bound 60/100 + 40/50 = 1.4 -> 1.6 per mini-batch
    assert br.comp[0] == pytest.approx(3.0)
    assert br.comm[0] == pytest.approx(3 * 1.6)
    # worker 1: 1 mini-batch; max(1.2, 0.8) vs 0.6 + 0.4 = 1.0 -> 1.2
    assert br.comp[1] == pytest.approx(2.0)
    assert br.comm[1] == pytest.approx(1.2)
    assert br.comm[2] == br.comp[2] == 0.0            # servers have no epoch time
    assert br.cost == pytest.approx(7.8)
    assert br.per_machine[1] == pytest.approx(3.2)


def test_worker_bound_and_ceil():
    # one worker, two servers: Σ m_j/b_ij dominates when w = 1
    br = epoch_cost([0.0, 0.0, 0.0], [[INF, 1, 1], [1, INF, 1], [1, 1, INF]],
                    [101, 0, 0], [0, 5, 5], batch=100)
    assert br.comm[0] == pytest.approx(2 * 10)        # ⌈101/100⌉ = 2 mini-batches of 10 s
    # exactly divisible: no extra mini-batch from float noise
    br = epoch_cost([0.0, 0.0], [[INF, 1], [1, INF]], [0.3 * 1000, 0], [0, 1], batch=0.1 * 1000)
    assert br.comm[0] == pytest.approx(3.0)


def test_self_link_is_free_for_both_roles():
    # one machine both worker and server: no communication at all
    br = epoch_cost([0.5], [[INF]], [4], [10], batch=2)
    assert br.cost == pytest.approx(2.0) and br.comm == (0.0,)
    assert role_of(4, 10) == BOTH and role_of(4, 0) == WORKER
    assert role_of(0, 1) == SERVER and role_of(0, 0) == IDLE


def test_bad_inputs():
    with pytest.raises(ValueError):
        epoch_cost([1.0], [[1.0, 1.0]], [1], [1], 1)
    with pytest.raises(ValueError):
        epoch_cost([1.0, 1.0], [[INF, 0.0], [1, INF]], [1, 0], [0, 1], 1)
    with pytest.raises(ValueError):
        Workload(0, 1, 1, 1, 1)
    job = Workload(4, 2, 10, 1.0, 5)
    with pytest.raises(ValueError):           # partitions must cover the job
        block_cost(Machines.homogeneous(2, 0.1, 1.0), job, [3, 0], [0, 2])


def test_block_cost_scales_blocks():
    job = Workload(data_blocks=4, model_blocks=2, items_per_block=10, block_units=3.0, batch=20)
    mach = Machines.homogeneous(2, wproc=0.1, bw=6.0)
    br = block_cost(mach, job, [4, 0], [0, 2])
    # 40 items: comp 4.0; 2 mini-batches of max(6*1/6, 6/6) = 1.0
    assert br.cost == pytest.approx(6.0)


def test_moving_average_skips_warmup_and_slides():
    a = MovingAverage(window=3, skip=2)
    a.add(100.0)
    a.add(100.0)                    # warm-up, dropped
    assert a.value is None and a.count == 0
    for v in (1.0, 2.0, 3.0, 4.0):
        a.add(v)
    assert a.count == 3 and a.value == pytest.approx(3.0)      # mean of 2, 3, 4
    b = MovingAverage(window=10, skip=0)
    b.add(2.0, weight=4.0)          # ratio of sums: 2 s over 4 items
    b.add(1.0, weight=1.0)
    assert b.value == pytest.approx(3.0 / 5.0)


def test_estimator_builds_machines():
    e = Estimator(window=5, skip=1, min_samples=2)
    for s in (9.0, 1.0, 1.2, 0.8):          # first (9 s) is warm-up
        e.compute(0, s, items=100)
    e.compute(1, 5.0, items=100)
    e.compute(1, 2.0, items=100)
    e.transfer(0, 1, units=50, seconds=10)      # warm-up
    e.transfer(0, 1, units=100, seconds=1)
    e.transfer(0, 1, units=300, seconds=2)
    assert e.wproc(0) == pytest.approx(0.01)
    assert e.bandwidth(0, 1) == pytest.approx(400 / 3)
    assert not e.ready([0, 1])                  # machine 1 has one sample kept
    assert e.ready([0], [(0, 1)])
    m = e.machines(2, default_bw=10.0)
    assert m.wproc == pytest.approx((0.01, 0.02))
    assert m.bw[0][1] == pytest.approx(400 / 3) and m.bw[1][0] == 10.0
    assert m.bw[0][0] == INF
    with pytest.raises(ValueError):
        e.machines(3)                           # machine 2 has no estimate
