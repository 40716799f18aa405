"""The normalized-throughput planner (harmony.sched.throughput), pure."""
from __future__ import annotations

import pytest

from harmony.sched import throughput as TP
from harmony.sched.model import Profile, job_iter_time
from harmony.sched.regroup import Current, RunningGroup

CPU = Profile("cpu", 1.0, 0.1, 1)                 # COMP-heavy, alone on 1 machine
NET = Profile("net", 0.1, 0.9, 1)                 # COMM-heavy
WIDE = Profile("wide", 4.0, 0.2, 1, remote=0.0)   # scales: 4 s of COMP on 1 machine
CHATTY = Profile("chatty", 1.0, 0.05, 1, remote=2.0)   # remote traffic grows with DoP
PURE = Profile("pure", 1.0, 0.0, 1)              # COMP only


def test_best_dop_follows_the_speed_up_curve_up_to_the_request():
    assert TP.best_dop(WIDE, 4) == 4               # 4.2, 2.2, 1.53, 1.2 s
    assert TP.best_dop(WIDE, 2) == 2               # never wider than asked
    # widening adds remote traffic: 1.05 s on 1 machine, 1.55 on 2
    assert job_iter_time(CHATTY, 2) > job_iter_time(CHATTY, 1)
    assert TP.best_dop(CHATTY, 8) == 1


def test_best_dop_search_matches_a_scan_of_every_width():
    """best_dop binary-searches T(m), convex in 1/m; a linear scan of every
    m is the definition it must match (random jobs and groups, overheads,
    remote traffic, caps 1..300)."""
    import random

    from harmony.sched.model import group_iter_time
    rnd = random.Random(7)
    for _ in range(400):
        ps = [Profile(f"j{i}", rnd.choice([0.0, rnd.uniform(0, 5)]), rnd.uniform(0, 2),
                      rnd.randint(1, 16), remote=rnd.choice([0.0, rnd.uniform(0, 3)]),
                      overhead=rnd.choice([0.0, rnd.uniform(0, 0.3)]))
              for i in range(rnd.randint(1, 4))]
        cap, tol = rnd.randint(1, 300), rnd.choice([0.0, 0.05, 0.2])
        times = [group_iter_time(ps, m) for m in range(1, cap + 1)]
        want = next(m for m, t in enumerate(times, 1) if t <= (1 + tol) * min(times))
        assert TP.best_dop(ps, cap, tol) == want, (ps, cap, tol)


def test_efficiency_of_complementary_and_similar_pairs():
    assert TP.efficiency([CPU, NET], 1) == pytest.approx((1.1 + 1.0) / 1.1)
    assert TP.efficiency([CPU, Profile("cpu2", 1.0, 0.1, 1)], 1) == pytest.approx(2.2 / 2.0)
    assert TP.efficiency([PURE, PURE], 1) == pytest.approx(1.0)      # pure time-slicing


def _cur(*groups, machines=("m0", "m1", "m2", "m3")):
    return Current(tuple(RunningGroup(*g) for g in groups), tuple(machines))


def test_a_waiting_job_goes_alone_on_idle_machines_at_its_best_dop():
    profiles = {"wide": WIDE}
    cur, left, _ = TP.plan(_cur(), ["wide"], [], profiles, {"wide": 2})
    assert left == [] and cur.group_of("wide").machines == ("m0", "m1")


def test_a_complementary_job_joins_a_lone_job_when_no_machine_is_idle():
    profiles = {"cpu": CPU, "net": NET}
    cur0 = _cur(("g1", ("cpu",), ("m0",)), machines=("m0",))
    cur, left, notes = TP.plan(cur0, ["net"], [], profiles, {"cpu": 1, "net": 1})
    assert left == [] and cur.group_of("net").id == "g1", notes


def test_a_similar_job_waits_instead_of_time_slicing():
    profiles = {"pure": PURE, "cpu": CPU}
    cur0 = _cur(("g1", ("pure",), ("m0",)), machines=("m0",))
    # E = 2.1 / 2.0 = 1.05: the 0.1 s of COMM hides, just at the threshold
    assert TP.efficiency([PURE, CPU], 1) == pytest.approx(1.05)
    cur, left, _ = TP.plan(cur0, ["cpu"], [], profiles, {"cpu": 1, "pure": 1}, tol=0.06)
    assert left == ["cpu"] and cur.groups == cur0.groups


def test_an_arrival_stays_alone_or_in_a_good_pair_and_leaves_a_poor_one():
    profiles = {"cpu": CPU, "net": NET, "cpu2": PURE}
    caps = {"cpu": 1, "net": 1, "cpu2": 1}
    good = _cur(("g1", ("cpu", "net"), ("m0",)), machines=("m0",))
    cur, left, _ = TP.plan(good, [], ["net"], profiles, caps)
    assert cur.group_of("net").id == "g1" and not left
    poor = _cur(("g1", ("cpu", "cpu2"), ("m0",)), machines=("m0",))
    cur, left, _ = TP.plan(poor, [], ["cpu2"], profiles, caps, tol=0.06)
    assert cur.group_of("cpu2") is None and left == ["cpu2"]
    assert cur.group_of("cpu").jobs == ("cpu",)


def test_a_lone_job_widens_onto_idle_machines_only_when_it_pays_and_has_work_left():
    profiles = {"wide": WIDE}
    cur0 = _cur(("g1", ("wide",), ("m0",)))
    cur, _, _ = TP.plan(cur0, [], [], profiles, {"wide": 4}, movable=["wide"])
    assert len(cur.group_of("wide").machines) == 4
    cur, _, _ = TP.plan(cur0, [], [], profiles, {"wide": 4}, movable=[])
    assert len(cur.group_of("wide").machines) == 1          # too new to repay a move
    profiles = {"chatty": CHATTY}
    cur0 = _cur(("g1", ("chatty",), ("m0",)))
    cur, _, _ = TP.plan(cur0, [], [], profiles, {"chatty": 4}, movable=["chatty"])
    assert len(cur.group_of("chatty").machines) == 1        # wider would be slower


def test_widening_is_judged_on_the_lowest_recent_comp_not_a_passing_high():
    """The bench's MLR: 0.11 s of COMP an iteration alone on one machine,
    0.1 s of remote traffic a machine at 2. For a few epochs its COMP read
    0.16 s (jobs beside it on the host ending): on that, 2 machines predict
    1.2x; on its lowest recent COMP, 1.07x, not worth a move."""
    from dataclasses import replace
    mlr = Profile("mlr", 0.16, 0.001, 1, remote=0.1, t_cpu_low=0.11)
    cur0 = _cur(("g1", ("mlr",), ("m0",)))
    cur, _, notes = TP.plan(cur0, [], [], {"mlr": mlr}, {"mlr": 2}, movable=["mlr"])
    assert cur.group_of("mlr").machines == ("m0",), notes
    # the same high COMP with no lower one known: widened, as before
    cur, _, notes = TP.plan(cur0, [], [], {"mlr": replace(mlr, t_cpu_low=0.0)}, {"mlr": 2},
                            movable=["mlr"])
    assert len(cur.group_of("mlr").machines) >= 2 and "widened" in notes[-1]
    # and where its COMP is steadily high, the gain is real: widened
    cur, _, _ = TP.plan(cur0, [], [], {"mlr": replace(mlr, t_cpu_low=0.16)}, {"mlr": 2},
                        movable=["mlr"])
    assert len(cur.group_of("mlr").machines) >= 2


def test_a_third_job_joins_a_pair_only_when_it_improves_the_interleaving():
    a, b = Profile("a", 1.0, 0.1, 1), Profile("b", 0.1, 0.5, 1)
    c, d = Profile("c", 0.05, 0.4, 1), Profile("d", 1.0, 0.1, 1)
    profiles = {x.id: x for x in (a, b, c, d)}
    caps = dict.fromkeys(profiles, 1)
    pair = _cur(("g1", ("a", "b"), ("m0",)), machines=("m0",))
    # the pair leaves 0.5 s of the link idle per 1.1 s iteration: c fills it
    assert TP.efficiency([a, b, c], 1) > 1.05 * TP.efficiency([a, b], 1)
    cur, left, notes = TP.plan(pair, ["c"], [], profiles, caps)
    assert left == [] and cur.group_of("c").id == "g1", notes
    # d only time-slices the CPU with a: the pair's interleaving gets worse
    assert TP.efficiency([a, b, d], 1) < TP.efficiency([a, b], 1)
    cur, left, _ = TP.plan(pair, ["d"], [], profiles, caps)
    assert left == ["d"] and cur.groups == pair.groups
    # never more than MAX_GROUP jobs in a group
    full = _cur(("g1", ("a", "b", "c"), ("m0",)), machines=("m0",))
    e = Profile("e", 0.0, 0.05, 1)
    profiles["e"] = e
    cur, left, _ = TP.plan(full, ["e"], [], profiles, dict.fromkeys(profiles, 1))
    assert TP.MAX_GROUP == 3 and left == ["e"]


def test_widening_is_lent_and_given_back_when_a_job_waits_or_a_new_one_comes():
    profiles = {"wide": WIDE, "cpu": CPU}
    caps = {"wide": 1, "cpu": 1}
    cur0 = _cur(("g1", ("wide",), ("m0",)))
    wide, _, _ = TP.plan(cur0, [], [], profiles, caps, movable=["wide"])
    assert wide.group_of("wide").machines == ("m0", "m1", "m2", "m3")   # beyond its 1
    # no widening while a new job waits to be profiled
    cur, _, _ = TP.plan(cur0, [], [], profiles, caps, movable=["wide"], pending=1)
    assert cur.group_of("wide").machines == ("m0",)
    # a new job to profile and no idle machine, or a profiled one waiting:
    # the lent machines come back
    cur, _, notes = TP.plan(wide, [], [], profiles, caps, movable=["wide"], pending=1)
    assert cur.group_of("wide").machines == ("m0",) and "gives back" in notes[0]
    # ... but not while enough machines are idle for the new job
    part = _cur(("g1", ("wide",), ("m0", "m1", "m2")))
    cur, _, notes = TP.plan(part, [], [], profiles, caps, movable=["wide"], pending=1)
    assert cur.group_of("wide").machines == ("m0", "m1", "m2") and not notes
    cur, left, _ = TP.plan(wide, ["cpu"], [], profiles, caps, movable=["wide"])
    assert left == [] and cur.group_of("cpu").machines == ("m1",)
    # (with nothing left waiting, it may widen again onto what is still idle)
    assert cur.group_of("wide").machines == ("m0", "m2", "m3")


def test_a_job_that_gains_more_apart_leaves_before_the_group_widens():
    """WIDE and NET on one machine: WIDE runs at x 1, NET at 0.24 of its
    rate alone. With 3 machines idle WIDE leaves for one (the pair's summed
    x 1.24 -> 2) and is then lent the other two; NET stays. (A group widens
    as a whole only where no job gains more apart: in this model COMM does
    not shrink with more machines, so that is a group whose COMP dominates
    and which then interleaves poorly, and splitting wins.)"""
    profiles = {"wide": WIDE, "net": NET}
    cur0 = _cur(("g1", ("wide", "net"), ("m0",)))
    cur, _, notes = TP.plan(cur0, [], [], profiles, {"wide": 1, "net": 1},
                            movable=["wide", "net"])
    assert cur.group_of("net").machines == ("m0",) and "leaves g1" in notes[0]
    assert cur.group_of("wide").machines == ("m1", "m2", "m3")
    cur, _, _ = TP.plan(cur0, [], [], profiles, {"wide": 1, "net": 1}, movable=["wide"])
    assert cur.group_of("net").machines == ("m0",)     # net too new to move


def test_throughput_counts_each_job_against_its_best_alone():
    profiles = {"cpu": CPU, "net": NET}
    caps = {"cpu": 1, "net": 1}
    pair = [RunningGroup("g", ("cpu", "net"), ("m0",))]
    alone = [RunningGroup("a", ("cpu",), ("m0",)), RunningGroup("b", ("net",), ("m1",))]
    assert TP.throughput(alone, profiles, caps) == pytest.approx(2.0)
    assert TP.throughput(pair, profiles, caps) == pytest.approx(
        TP.efficiency([CPU, NET], 1))


def test_an_arrival_beside_a_job_still_profiling_stays_until_that_one_is_profiled():
    profiles = {"cpu": CPU}
    cur0 = _cur(("g1", ("cpu", "new"), ("m0",)), machines=("m0",))
    cur, left, _ = TP.plan(cur0, [], ["cpu"], profiles, {"cpu": 1, "new": 1})
    assert cur.group_of("cpu").jobs == ("cpu", "new") and not left
    # in a group of three it stays too, until the last of them is profiled
    # (leaving paused it only to resume it in place seconds later)
    cur0 = _cur(("g1", ("cpu", "new", "new2"), ("m0",)), machines=("m0",))
    cur, left, _ = TP.plan(cur0, [], ["cpu"], profiles, {"cpu": 1, "new": 1, "new2": 1})
    assert cur.group_of("cpu").jobs == ("cpu", "new", "new2") and not left
    # ... and the last one profiled is judged: a second COMP-heavy job in the
    # group does not raise its interleaving, so it leaves (no machine idle)
    profiles = {"cpu": CPU, "net": NET, "cpu2": Profile("cpu2", 1.0, 0.1, 1)}
    cur0 = _cur(("g1", ("cpu", "net", "cpu2"), ("m0",)), machines=("m0",))
    cur, left, _ = TP.plan(cur0, [], ["cpu2"], profiles, dict.fromkeys(profiles, 1),
                           tol=0.06)
    assert cur.group_of("cpu").jobs == ("cpu", "net") and left == ["cpu2"]


def test_a_group_wider_than_its_best_dop_is_narrowed_when_it_repays_one_move():
    """CHATTY alone on 4 machines: 1.05 s per iteration on 1, 1.8 s on 4
    (its remote traffic grows with the DoP). With work left it is narrowed
    to 1 and the 3 machines it frees take a waiting job; with 2 iterations
    left the 1.5 s saved repays one 1 s move (nothing gives the machines
    back: it is not lending), with 1 left the 0.75 s does not; a job not
    yet movable (too few epochs) stays."""
    profiles = {"chatty": CHATTY, "cpu": CPU}
    caps = {"chatty": 4, "cpu": 1}
    cur0 = _cur(("g1", ("chatty",), ("m0", "m1", "m2", "m3")))
    cur, left, notes = TP.plan(cur0, ["cpu"], [], profiles, caps, movable=["chatty"],
                               iters_left={"chatty": 10}, move_cost=1.0)
    assert cur.group_of("chatty").machines == ("m0",), notes
    assert left == [] and cur.group_of("cpu").machines == ("m1",)
    assert any("narrowed to 1" in n for n in notes)
    cur, _, _ = TP.plan(cur0, [], [], profiles, caps, movable=["chatty"],
                        iters_left={"chatty": 2}, move_cost=1.0)
    assert cur.group_of("chatty").machines == ("m0",)
    cur, _, _ = TP.plan(cur0, [], [], profiles, caps, movable=["chatty"],
                        iters_left={"chatty": 1}, move_cost=1.0)
    assert len(cur.group_of("chatty").machines) == 4
    cur, _, _ = TP.plan(cur0, [], [], profiles, caps, movable=[],
                        iters_left={"chatty": 10}, move_cost=1.0)
    assert len(cur.group_of("chatty").machines) == 4


def test_lending_must_repay_two_moves():
    """WIDE saves 3 s per iteration on 4 machines (4.2 -> 1.2): with 10
    iterations left that repays two moves of 1 s, with 1 left not two of
    2 s; growing to the 2 machines it asked for is not lending."""
    profiles = {"wide": WIDE}
    cur0 = _cur(("g1", ("wide",), ("m0",)))
    cur, _, _ = TP.plan(cur0, [], [], profiles, {"wide": 1}, movable=["wide"],
                        iters_left={"wide": 10}, move_cost=1.0)
    assert len(cur.group_of("wide").machines) == 4
    cur, _, notes = TP.plan(cur0, [], [], profiles, {"wide": 1}, movable=["wide"],
                            iters_left={"wide": 1}, move_cost=2.0)
    assert len(cur.group_of("wide").machines) == 1 and "two moves" in notes[0]
    cur, _, _ = TP.plan(cur0, [], [], profiles, {"wide": 2}, movable=["wide"],
                        iters_left={"wide": 1}, move_cost=2.0)
    assert len(cur.group_of("wide").machines) == 2


def test_lending_counts_only_until_the_next_arrival_is_expected():
    """With 10 iterations left WIDE would repay two 1 s moves; if the next
    job is expected in 0.5 s (and takes the machines back) it does not."""
    profiles = {"wide": WIDE}
    cur0 = _cur(("g1", ("wide",), ("m0",)))
    cur, _, _ = TP.plan(cur0, [], [], profiles, {"wide": 1}, movable=["wide"],
                        iters_left={"wide": 10}, move_cost=1.0, arrival_gap=30.0)
    assert len(cur.group_of("wide").machines) == 4
    cur, _, notes = TP.plan(cur0, [], [], profiles, {"wide": 1}, movable=["wide"],
                            iters_left={"wide": 10}, move_cost=1.0, arrival_gap=0.5)
    assert len(cur.group_of("wide").machines) == 1 and "two moves" in notes[0]


def test_a_measured_fixed_comp_part_stops_widening_and_narrows_back():
    """MLR-like: 0.3 s of COMP per iteration on 2 machines and still 0.3 s
    on 4 (the work on its model does not shrink), with remote traffic that
    grows with the DoP. Known only from 2 (no fixed part) it is lent the 2
    idle machines; with the fixed part measured at 4 it is narrowed back."""
    from harmony.sched.model import fixed_part, t_cpu_at
    assert fixed_part(2, 0.3, 4, 0.3) == pytest.approx(0.3)
    assert fixed_part(2, 0.4, 4, 0.2) == 0.0                 # perfect scaling
    assert fixed_part(2, 0.4, 4, 0.25) == pytest.approx(0.1)
    assert fixed_part(4, 0.25, 2, 0.4) == pytest.approx(0.1)  # either order
    two = Profile("mlr", 0.3, 0.15, 2, remote=0.3)
    assert t_cpu_at(two, 4) == pytest.approx(0.15)
    cur0 = _cur(("g1", ("mlr",), ("m0", "m1")))
    cur, _, _ = TP.plan(cur0, [], [], {"mlr": two}, {"mlr": 2}, movable=["mlr"],
                        iters_left={"mlr": 40}, move_cost=1.0)
    assert len(cur.group_of("mlr").machines) == 4
    four = Profile("mlr", 0.3, 0.225, 4, remote=0.3, cpu_fixed=0.3)
    assert t_cpu_at(four, 2) == pytest.approx(0.3)
    cur, _, notes = TP.plan(_cur(("g1", ("mlr",), ("m0", "m1", "m2", "m3"))), [], [],
                            {"mlr": four}, {"mlr": 2}, movable=["mlr"],
                            iters_left={"mlr": 40}, move_cost=1.0)
    assert cur.group_of("mlr").machines[:1] == ("m0",) and len(cur.group_of("mlr").machines) < 4


def test_a_job_leaves_its_group_for_idle_machines_when_it_pays():
    """Two COMP-heavy jobs time-slice one machine (E about 1.05); with a
    machine idle and work left, one of them moves there (both then run at
    their rate alone). Not with a waiting job to place, nor when the time
    saved does not repay two moves, nor for a job too new to move."""
    cpu2 = Profile("cpu2", 1.0, 0.1, 1)
    profiles = {"cpu": CPU, "cpu2": cpu2}
    caps = {"cpu": 1, "cpu2": 1}
    pair = _cur(("g1", ("cpu", "cpu2"), ("m0",)), machines=("m0", "m1"))
    cur, left, notes = TP.plan(pair, [], [], profiles, caps, movable=["cpu", "cpu2"],
                               iters_left={"cpu": 20, "cpu2": 20}, move_cost=1.0)
    assert {g.machines for g in cur.groups} == {("m0",), ("m1",)}, notes
    assert any("leaves g1" in n for n in notes)
    cur, _, _ = TP.plan(pair, [], [], profiles, caps, movable=["cpu", "cpu2"],
                        iters_left={"cpu": 1, "cpu2": 1}, move_cost=1.0)
    assert cur.groups == pair.groups
    cur, _, _ = TP.plan(pair, [], [], profiles, caps, movable=["cpu"],
                        iters_left={"cpu": 20, "cpu2": 20}, move_cost=1.0)
    assert cur.groups == pair.groups
    cur, _, _ = TP.plan(pair, [], [], profiles, caps, movable=["cpu", "cpu2"], pending=1,
                        iters_left={"cpu": 20, "cpu2": 20}, move_cost=1.0)
    assert cur.groups == pair.groups
    # a complementary pair interleaves well: it stays together
    good = _cur(("g1", ("cpu", "net"), ("m0",)), machines=("m0", "m1"))
    cur, _, _ = TP.plan(good, [], [], {"cpu": CPU, "net": NET}, {"cpu": 1, "net": 1},
                        movable=["cpu", "net"], iters_left={"cpu": 20, "net": 20},
                        move_cost=1.0)
    assert cur.groups == good.groups


def test_a_split_is_judged_by_the_iterations_measured_where_the_job_runs():
    """A short-COMP job beside a long-COMP one on one machine: by the
    model's lockstep group time (0.31 s an iteration) moving the short one
    to the idle machine saves 0.3 s x 60 iterations, far more than two
    moves; measured, it runs at 0.09 s there (it takes its turns between
    the other's COMPs), so the move saves 4.8 s and does not repay two 3 s
    moves (bench/cluster_e2e.py: Lasso beside MLR, a 7.6 s move that set
    the makespan). Without a measurement the model's time decides."""
    big, small = Profile("big", 0.3, 0.0, 1), Profile("small", 0.01, 0.0, 1)
    profiles, caps = {"big": big, "small": small}, {"big": 1, "small": 1}
    pair = _cur(("g1", ("big", "small"), ("m0",)), machines=("m0", "m1"))
    kw = dict(movable=["big", "small"], iters_left={"big": 20, "small": 60}, move_cost=3.0)
    cur, _, notes = TP.plan(pair, [], [], profiles, caps, **kw)
    assert cur.group_of("small").machines == ("m1",), notes
    cur, _, notes = TP.plan(pair, [], [], profiles, caps, measured={"small": 0.09, "big": 0.37},
                            **kw)
    assert cur.groups == pair.groups, notes
    # measured slower still, the move repays itself again
    cur, _, notes = TP.plan(pair, [], [], profiles, caps, measured={"small": 0.2}, **kw)
    assert cur.group_of("small").machines == ("m1",), notes
