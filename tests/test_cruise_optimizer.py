"""harmony.cruise.optimizer: the HiGHS MILP against enumeration, Eq 3.5
against the MILP, and the shift of work on a heterogeneous cluster."""
import math
import random

import pytest

from harmony.cruise.costmodel import Machines, Workload, block_cost
from harmony.cruise.optimizer import (_twins, eq35, exhaustive, heterogeneous, homogeneous,
                                      spread)

INF = math.inf


def random_machines(rng: random.Random, n: int) -> Machines:
    wp = tuple(rng.choice([0.005, 0.01, 0.02]) * rng.uniform(0.8, 1.2) for _ in range(n))
    bw = tuple(tuple(INF if i == j else rng.uniform(20, 200) for j in range(n))
               for i in range(n))
    return Machines(wp, bw)


@pytest.mark.parametrize("seed,n,both", [(1, 3, False), (2, 4, False), (3, 5, False),
                                         (4, 3, True), (5, 4, True)])
def test_milp_matches_enumeration(seed, n, both):
    rng = random.Random(seed)
    mach = random_machines(rng, n)
    job = Workload(data_blocks=rng.randint(n, 6), model_blocks=rng.randint(2, 4),
                   items_per_block=rng.choice([50, 100, 150]), block_units=10.0, batch=100)
    ref = exhaustive(mach, job, allow_both=both)
    sol = heterogeneous(mach, job, allow_both=both)
    assert sol.status == "optimal"
    assert sol.cost == pytest.approx(ref.cost, rel=1e-6)
    # the layout it returns really costs that, and is a valid configuration
    assert block_cost(mach, job, sol.d, sol.m).cost == pytest.approx(sol.cost)
    if not both:
        assert all(not (a and b) for a, b in zip(sol.d, sol.m))


def test_milp_every_machine_used_when_idle_is_not_allowed():
    mach = Machines((0.01, 0.01, 0.5), ((INF, 50, 1), (50, INF, 1), (1, 1, INF)))
    job = Workload(4, 2, 100, 10.0, 100)
    free = heterogeneous(mach, job)
    assert free.d[2] == free.m[2] == 0            # a hopeless machine is left idle
    busy = heterogeneous(mach, job, allow_idle=False)
    assert busy.d[2] + busy.m[2] > 0
    assert busy.cost == pytest.approx(exhaustive(mach, job, allow_idle=False).cost)
    assert busy.cost > free.cost


@pytest.mark.parametrize("n,wproc,bw,job", [
    (4, 0.01, 100.0, Workload(8, 6, 100, 10.0, 50)),
    (5, 0.01, 60.0, Workload(12, 6, 100, 10.0, 100)),
    (6, 0.002, 50.0, Workload(12, 12, 100, 10.0, 100)),   # communication-heavy: more servers
    (6, 0.05, 500.0, Workload(20, 4, 100, 10.0, 100)),    # compute-heavy: more workers
])
def test_closed_form_matches_milp_on_equal_machines(n, wproc, bw, job):
    mach = Machines.homogeneous(n, wproc, bw)
    cf = homogeneous(mach, job)
    sol = heterogeneous(mach, job)
    assert cf.cost == pytest.approx(sol.cost, rel=1e-6)
    assert cf.workers + cf.servers == n
    # Eq 3.5's value is the cost model's when blocks and mini-batches divide evenly
    if job.data_blocks % cf.workers == 0 and job.model_blocks % cf.servers == 0:
        assert cf.predicted == pytest.approx(cf.cost)


def test_closed_form_trades_workers_for_servers():
    job = Workload(60, 60, 100, 10.0, 100)
    compute_bound = homogeneous(8, job, wproc=0.1, bw=1000.0)
    network_bound = homogeneous(8, job, wproc=0.001, bw=10.0)
    assert compute_bound.workers > network_bound.workers
    # Eq 3.5 is minimized at w*, checked against every w
    w = compute_bound.workers
    assert all(eq35(8, w, 0.1, 1000.0, job) <= eq35(8, k, 0.1, 1000.0, job) + 1e-12
               for k in range(1, 8))
    assert sum(compute_bound.d) == 60 and sum(compute_bound.m) == 60
    assert spread(7, 3) == [3, 2, 2]


def test_heterogeneous_shift_of_work():
    job = Workload(12, 6, 100, 10.0, 100)
    base = Machines.homogeneous(5, 0.01, 60.0)
    even = heterogeneous(base, job)
    assert even.workers == 3 and even.servers == 2
    assert sorted(x for x in even.d if x) == [4, 4, 4]
    # machine 0 computes 4x slower, the link 1 <-> 3 is 10x slower
    wp = list(base.wproc)
    wp[0] = 0.04
    bw = [list(r) for r in base.bw]
    bw[1][3] = bw[3][1] = 6.0
    het = Machines(tuple(wp), tuple(map(tuple, bw)))
    sol = heterogeneous(het, job)
    assert sol.d[0] == 0 and sol.m[0] > 0           # the slow machine serves
    for i, j in ((1, 3), (3, 1)):                   # no traffic over the slow link
        assert not (sol.d[i] > 0 and sol.m[j] > 0)
    assert sol.cost == pytest.approx(exhaustive(het, job).cost)
    # the even layout on the slow machines costs more than the new optimum
    slow_even = block_cost(het, job, (4, 4, 4, 0, 0), (0, 0, 0, 3, 3)).cost
    assert slow_even > 1.5 * sol.cost


def test_slower_worker_gets_fewer_blocks():
    # machines 0 and 1 compute 2x slower: one serves the (small) model, the
    # other works on half the data blocks of a fast machine
    job = Workload(14, 2, 100, 1.0, 100)
    wp = (0.02, 0.02, 0.01, 0.01, 0.01)
    mach = Machines(wp, Machines.homogeneous(5, 0.01, 1000.0).bw)
    sol = heterogeneous(mach, job)
    slow = sorted((sol.d[0], sol.d[1]))
    assert slow[0] == 0 and sol.m[0] + sol.m[1] == 2
    assert sol.d[2:] == (4, 4, 4) and slow[1] == 2
    assert sol.cost == pytest.approx(exhaustive(mach, job).cost)


def test_twins_finds_interchangeable_machines():
    wp = (0.01, 0.02, 0.01, 0.01)
    bw = tuple(tuple(INF if i == j else (5.0 if 3 in (i, j) else 10.0) for j in range(4))
               for i in range(4))
    # 0 and 2 alike; 1 differs in compute, 3 in links
    assert _twins(Machines(wp, bw)) == [(0, 2)]
    assert _twins(Machines.homogeneous(3, 0.1, 1.0)) == [(0, 1), (1, 2)]
    # symmetry breaking keeps the optimum
    job = Workload(6, 3, 100, 10.0, 100)
    m = Machines(wp, bw)
    assert heterogeneous(m, job).cost == pytest.approx(
        heterogeneous(m, job, symmetry=False).cost)
