"""harmony.cruise.optimizer: the HiGHS MILP against enumeration, Eq 3.5
against the MILP, and the shift of work on a heterogeneous cluster; the
class enumeration and the MILP methods against enumeration and against the
plain MILP."""
import itertools
import math
import random

import pytest

from harmony.cruise import layouts
from harmony.cruise.costmodel import Machines, Workload, block_cost
from harmony.cruise.optimizer import (_bound, _compositions, _Model, _twins, eq35, exhaustive,
                                      heterogeneous, homogeneous, spread)

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


def class_machines(rng: random.Random, n: int, kinds: int) -> Machines:
    """``n`` machines of ``kinds`` kinds: one compute speed per kind, one
    link speed per pair of kinds (so machines of a kind are interchangeable)."""
    kind = sorted(rng.randrange(kinds) for _ in range(n))
    wp = [rng.choice([0.002, 0.005, 0.01, 0.02]) for _ in range(kinds)]
    link = {}
    for a in range(kinds):
        for b in range(a, kinds):
            link[a, b] = link[b, a] = rng.uniform(20, 200)
    return Machines(tuple(wp[k] for k in kind),
                    tuple(tuple(INF if i == j else link[kind[i], kind[j]] for j in range(n))
                          for i in range(n)))


def valid(sol, n: int, both: bool, idle: bool) -> bool:
    if not both and any(a and b for a, b in zip(sol.d, sol.m)):
        return False
    return idle or all(a or b for a, b in zip(sol.d, sol.m))


@pytest.mark.parametrize("seed", range(5))
def test_classes_match_enumeration(seed):
    rng = random.Random(100 + seed)
    for _ in range(5):
        n = rng.randint(3, 5)
        mach = class_machines(rng, n, rng.randint(1, 3))
        job = Workload(rng.randint(n, 7), rng.randint(1, 6), rng.choice([50, 100, 150, 250]),
                       10.0, 100)
        idle = rng.random() < 0.6
        ref = exhaustive(mach, job, allow_idle=idle)
        sol = heterogeneous(mach, job, allow_idle=idle, method="classes")
        assert sol.status == "optimal" and sol.source == "classes"
        assert sol.cost == pytest.approx(ref.cost, rel=1e-9)
        assert block_cost(mach, job, sol.d, sol.m).cost == pytest.approx(sol.cost, rel=1e-12)
        assert valid(sol, n, False, idle)


def test_even_shares_within_a_class_miss_the_optimum_with_both_roles():
    mach = Machines.homogeneous(3, 0.01, 100.0)
    job = Workload(7, 5, 100, 10.0, 100)
    ex = exhaustive(mach, job, allow_both=True)
    assert ex.cost == pytest.approx(3.9)
    assert block_cost(mach, job, (2, 2, 3), (1, 1, 3)).cost == pytest.approx(3.9)

    def even(d, m):                 # shares of each role differ by at most one block
        for role in (lambda i: d[i] > 0 and m[i] > 0, lambda i: d[i] == 0 and m[i] > 0,
                     lambda i: d[i] > 0 and m[i] == 0):
            for v in (d, m):
                sh = [v[i] for i in range(3) if role(i)]
                if sh and max(sh) - min(sh) > 1:
                    return False
        return True
    best_even = min(block_cost(mach, job, d, m).cost
                    for d in itertools.product(range(8), repeat=3) if sum(d) == 7
                    for m in itertools.product(range(6), repeat=3) if sum(m) == 5
                    if even(d, m))
    assert best_even == pytest.approx(4.8)
    assert heterogeneous(mach, job, allow_both=True).cost == pytest.approx(3.9)
    with pytest.raises(ValueError):
        heterogeneous(mach, job, allow_both=True, method="classes")


@pytest.mark.parametrize("method", ["by_w", "milp"])
@pytest.mark.parametrize("seed,n,kinds,both,idle", [
    (1, 4, 4, True, True), (2, 4, 2, True, False), (3, 5, 5, False, True),
    (4, 4, 1, True, True), (5, 5, 3, False, False), (6, 3, 3, True, False),
])
def test_milp_methods_match_enumeration(method, seed, n, kinds, both, idle):
    rng = random.Random(seed)
    mach = class_machines(rng, n, kinds) if kinds < n else random_machines(rng, n)
    job = Workload(rng.randint(n, 7), rng.randint(2, 5), rng.choice([50, 100, 150, 250]),
                   10.0, 100)
    ref = exhaustive(mach, job, allow_both=both, allow_idle=idle)
    sol = heterogeneous(mach, job, allow_both=both, allow_idle=idle, method=method)
    assert sol.status == "optimal"
    assert sol.cost == pytest.approx(ref.cost, rel=1e-6)
    assert block_cost(mach, job, sol.d, sol.m).cost == pytest.approx(sol.cost, rel=1e-12)
    assert valid(sol, n, both, idle)


def test_by_w_matches_enumeration_with_both_roles():
    # end to end with both roles: search, bounds and per-W MILPs together
    rng = random.Random(23)
    for _ in range(12):
        n = rng.randint(3, 4)
        mach = (class_machines(rng, n, rng.randint(1, n)) if rng.random() < 0.5
                else random_machines(rng, n))
        job = Workload(rng.randint(n, 6), rng.randint(1, 5), rng.choice([50, 100, 150, 250]),
                       10.0, 100)
        idle = rng.random() < 0.5
        ref = exhaustive(mach, job, allow_both=True, allow_idle=idle)
        sol = heterogeneous(mach, job, allow_both=True, allow_idle=idle)
        assert sol.status == "optimal"
        assert sol.cost == pytest.approx(ref.cost, rel=1e-6), (mach, job, idle)
        assert valid(sol, n, True, idle)


def test_milp_rows_alone_keep_the_optimum():
    # the MILPs without an incumbent (the search often finds the optimum
    # and would hide a row that cuts it off): one with W in binary, one per W
    rng = random.Random(31)
    for t in range(8):
        n = rng.randint(3, 4)
        mach = random_machines(rng, n)
        job = Workload(rng.randint(n, 6), rng.randint(1, 5), rng.choice([50, 100, 150, 250]),
                       10.0, 100)
        both, idle = t % 2 == 0, rng.random() < 0.5
        ref = exhaustive(mach, job, allow_both=both, allow_idle=idle).cost
        opts = {"disp": False, "mip_rel_gap": 1e-9}
        res, d, m = _Model(mach, job, both, idle, True).solve(opts)
        assert res.status == 0 and block_cost(mach, job, d, m).cost == pytest.approx(ref)
        per_w = []
        for w in range(1, n + 1):
            res, d, m = _Model(mach, job, both, idle, True, W=w).solve(opts)
            if res.status == 0:
                per_w.append(block_cost(mach, job, d, m).cost)
        assert min(per_w) == pytest.approx(ref)


def het_cluster(n: int) -> Machines:
    """bench/cruise_solve.py's mix: 1 in 8 machines computes 2x faster and
    has twice the bandwidth to the other fast ones."""
    fast = set(range(max(1, n // 8)))
    return Machines(tuple(1e-3 if i in fast else 2e-3 for i in range(n)),
                    tuple(tuple(INF if i == j else (80.0 if i in fast and j in fast else 40.0)
                                for j in range(n)) for i in range(n)))


def test_new_methods_agree_with_the_plain_milp():
    # 8 machines of two kinds with disjoint roles, 6 of three kinds with both
    job = Workload(24, 12, 100, 1.0, 100)
    mach = het_cluster(8)
    plain = heterogeneous(mach, job, method="plain")
    assert plain.status == "optimal"
    for method in ("auto", "classes", "by_w"):
        sol = heterogeneous(mach, job, method=method)
        assert sol.status == "optimal" and sol.cost == pytest.approx(plain.cost, rel=1e-6)
    rng = random.Random(9)
    mach = class_machines(rng, 6, 3)
    job = Workload(12, 6, 100, 10.0, 100)
    plain = heterogeneous(mach, job, allow_both=True, method="plain")
    assert plain.status == "optimal"
    for method in ("auto", "milp"):
        sol = heterogeneous(mach, job, allow_both=True, method=method)
        assert sol.status == "optimal" and sol.cost == pytest.approx(plain.cost, rel=1e-6)


def test_classes_solve_64_machines_and_beat_or_match_the_closed_form():
    job = Workload(128, 64, 1000, 1.0, 1000)
    for n in (16, 64):
        mach = het_cluster(n)
        sol = heterogeneous(mach, job)
        assert sol.status == "optimal" and sol.source == "classes" and sol.seconds < 5
        cf = homogeneous(n, job, wproc=2e-3, bw=40.0)
        assert sol.cost <= block_cost(mach, job, cf.d, cf.m).cost + 1e-9
    assert heterogeneous(het_cluster(16), job).cost == pytest.approx(54.0)   # the MILP's


def test_bound_is_below_every_layout_with_that_many_workers():
    rng = random.Random(11)
    for _ in range(6):
        mach = random_machines(rng, 3)
        job = Workload(rng.randint(3, 6), rng.randint(1, 4), rng.choice([50, 100, 150]),
                       10.0, 100)
        for both in (False, True):
            least: dict[int, float] = {}
            for roles in itertools.product([(1, 0), (0, 1), (1, 1), (0, 0)], repeat=3):
                if not both and (1, 1) in roles:
                    continue
                ws = [i for i in range(3) if roles[i][0]]
                ss = [i for i in range(3) if roles[i][1]]
                if not ws or not ss or len(ws) > job.data_blocks or len(ss) > job.model_blocks:
                    continue
                for dp in _compositions(job.data_blocks, len(ws)):
                    for mp in _compositions(job.model_blocks, len(ss)):
                        d, m = [0] * 3, [0] * 3
                        for i, v in zip(ws, dp):
                            d[i] = v
                        for j, v in zip(ss, mp):
                            m[j] = v
                        c = block_cost(mach, job, d, m).cost
                        least[len(ws)] = min(least.get(len(ws), INF), c)
            for w, c in least.items():
                assert _bound(mach, job, w, both) <= c * (1 + 1e-9)


def test_local_search_never_worsens_and_keeps_roles_valid():
    rng = random.Random(5)
    for _ in range(5):
        mach = random_machines(rng, 5)
        job = Workload(rng.randint(5, 12), rng.randint(2, 6), 100, 10.0, 100)
        cf = homogeneous(mach, job)
        for both, idle in ((False, True), (True, False)):
            c, d, m = layouts.improve(mach, job, cf.d, cf.m, allow_both=both, allow_idle=idle)
            assert c <= cf.cost + 1e-12
            assert block_cost(mach, job, d, m).cost == pytest.approx(c, rel=1e-12)
            assert (both or all(not (a and b) for a, b in zip(d, m)))
            assert idle or all(a or b for a, b in zip(d, m))


def test_time_limit_returns_the_better_of_the_milp_and_the_closed_form():
    job = Workload(128, 64, 1000, 1.0, 1000)
    mach = het_cluster(16)
    cf = block_cost(mach, job, *(lambda s: (s.d, s.m))(homogeneous(mach, job))).cost
    for method in ("plain", "by_w"):
        sol = heterogeneous(mach, job, allow_both=True, time_limit=0.2, method=method)
        assert sol.cost <= cf + 1e-9
        assert sol.source in ("milp", "closed_form", "classes", "search")
        assert block_cost(mach, job, sol.d, sol.m).cost == pytest.approx(sol.cost, rel=1e-12)
        if sol.status == "time_limit":
            assert 0.0 <= sol.gap <= 1.0
    plain = heterogeneous(mach, job, time_limit=0.05, method="plain")
    assert plain.status == "time_limit" and plain.cost <= cf + 1e-9
