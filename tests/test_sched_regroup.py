"""Dynamic regrouping: the 5% rules on arrival and completion, the diff the
master applies, and placement on machine names."""
import pytest

from harmony.sched.grouping import PlannedGroup
from harmony.sched.model import Profile, group_iter_time, score
from harmony.sched.regroup import (TOLERANCE, Current, RunningGroup, on_arrival, on_completion,
                                   pick, place, regroup, regroup_candidates)
from harmony.sched.synthetic import random_profiles

M4 = ("m1", "m2", "m3", "m4")


def twin(name: str, scale: float = 1.0, ratio: float = 2.0) -> Profile:
    """Tcpu / Tnet = ratio, Tcpu + Tnet = 3 * scale, measured on 2 machines."""
    t_net = 3.0 * scale / (1 + ratio)
    return Profile(name, ratio * t_net, t_net, 2)


def two_groups(**extra: Profile) -> tuple[Current, dict[str, Profile]]:
    """g1 = (f, a) on m1 m2, g2 = (c, d) on m3 m4; all four jobs alike."""
    profiles = {x: twin(x) for x in "facd"} | extra
    cur = Current((RunningGroup("g1", ("f", "a"), ("m1", "m2")),
                   RunningGroup("g2", ("c", "d"), ("m3", "m4"))), M4)
    return cur, profiles


# ------------------------------------------------------------ completion
@pytest.mark.parametrize("scale,ratio,replaced", [
    (1.04, 2.0, True),           # iteration time 4% longer, same comp/comm ratio
    (0.96, 2.0, True),
    (1.0, 2.0 * 1.04, True),     # same iteration time, ratio 4% higher
    (1.06, 2.0, False),          # 6% longer
    (1.0, 2.0 * 1.06, False),    # ratio 6% higher
    (1.0, 2.0 * 0.94, False),
])
def test_completion_replaces_by_a_similar_job_within_5_percent(scale, ratio, replaced):
    cur, profiles = two_groups(w=twin("w", scale, ratio))
    ch = on_completion(cur, "f", ["w"], profiles)
    if replaced:
        assert ch.reason == "replace"
        assert ch.start == {"w": "g1"} and ch.migrate == {} and ch.pause == ()
        assert sorted(ch.keep) == ["a", "c", "d"]
        assert ch.groups[0] == RunningGroup("g1", ("a", "w"), ("m1", "m2"))
    else:
        assert ch.reason != "replace"


def test_completion_takes_the_first_similar_job_in_line():
    cur, profiles = two_groups(x=twin("x", 3.0), w1=twin("w1", 1.01), w2=twin("w2", 1.0))
    ch = on_completion(cur, "f", ["x", "w1", "w2"], profiles)
    assert ch.start == {"w1": "g1"}


@pytest.mark.parametrize("scale,replaced", [(1.0, True), (1.04, True), (1.06, False)])
def test_completion_replaces_by_a_set_with_the_same_sums(scale, replaced):
    # two half-size jobs with the finished job's comp/comm ratio: their summed
    # iteration time is 3 * scale, their summed COMP / summed COMM is 2
    cur, profiles = two_groups(h1=twin("h1", 0.5 * scale), h2=twin("h2", 0.5 * scale),
                               x=twin("x", 5.0))
    ch = on_completion(cur, "f", ["x", "h1", "h2"], profiles)
    if replaced:
        assert ch.reason == "replace-set"
        assert ch.start == {"h1": "g1", "h2": "g1"} and ch.moved == 0
    else:
        assert ch.reason not in ("replace", "replace-set")


def test_completion_without_replacement_regroups_with_fewer_moves_unless_5_percent():
    # after f finishes: g1 = (a) and g2 = (b) each alone on 2 machines
    # (U 0.5); waiting w is network-heavy and like none of them.
    profiles = {x: Profile(x, 2.0, 1.0, 1) for x in "fab"} | {"w": Profile("w", 1.0, 1.5, 1)}
    cur = Current((RunningGroup("g1", ("f", "a"), ("m1", "m2")),
                   RunningGroup("g2", ("b",), ("m3", "m4"))), M4)
    after = Current((RunningGroup("g1", ("a",), ("m1", "m2")),
                     RunningGroup("g2", ("b",), ("m3", "m4"))), M4)
    cands = regroup_candidates(after, ["w"], profiles, seed="g1")
    # candidate 0 regroups g1 only: w joins a, nobody moves; candidate 1 also
    # takes g2: a and b pair up, w gets its own group, b moves
    (few, many) = cands
    assert few.moved == 0 and few.start == {"w": "g1"}
    assert many.moved == 1 and set(many.migrate) == {"b"}
    u_few, u_many = score(*few.util), score(*many.util)
    base = score(*few.util_before)
    gain = u_many / u_few - 1                       # about 15%
    assert u_few > base and gain > TOLERANCE
    assert on_completion(cur, "f", ["w"], profiles).groups == many.groups
    # the same choice on both sides of the margin
    assert on_completion(cur, "f", ["w"], profiles, tol=gain * 0.99).groups == many.groups
    assert on_completion(cur, "f", ["w"], profiles, tol=gain * 1.01).groups == few.groups


def test_completion_no_regroup_below_5_percent_gain():
    # pairs of these jobs pipeline perfectly on 2 machines. f leaves a alone
    # on 2 machines (U 0.5); no grouping of a, c, d on 4 machines beats the
    # cluster's U 0.75 now: nothing changes
    profiles = {x: Profile(x, 2.0, 1.0, 1) for x in "facd"}
    cur = Current((RunningGroup("g1", ("f", "a"), ("m1", "m2")),
                   RunningGroup("g2", ("c", "d"), ("m3", "m4"))), M4)
    ch = on_completion(cur, "f", [], profiles)
    assert ch.noop and "no candidate" in ch.reason
    assert ch.groups[0] == RunningGroup("g1", ("a",), ("m1", "m2"))
    # margin on both sides for a regroup that does gain: f alone in g1
    # finishes and frees m1 m2; g2 = (c, d) is CPU-bound on its 2 machines
    # and balanced on 4
    profiles = {"f": twin("f"), "c": Profile("c", 4.0, 1.0, 1), "d": Profile("d", 4.0, 1.0, 1)}
    cur = Current((RunningGroup("g1", ("f",), ("m1", "m2")),
                   RunningGroup("g2", ("c", "d"), ("m3", "m4"))), M4)
    after = Current((cur.groups[1],), M4)
    (cand,) = [c for c in regroup_candidates(after, [], profiles) if c.moved]
    gain = score(*cand.util) / score(*cand.util_before) - 1
    assert gain > 0
    assert not on_completion(cur, "f", [], profiles, tol=gain * 0.99).noop
    assert on_completion(cur, "f", [], profiles, tol=gain * 1.01).noop


def test_completion_of_a_job_alone_in_its_group():
    profiles = {"f": twin("f"), "w": twin("w", 1.02), "c": twin("c"), "d": twin("d")}
    cur = Current((RunningGroup("g1", ("f",), ("m1", "m2")),
                   RunningGroup("g2", ("c", "d"), ("m3", "m4"))), M4)
    ch = on_completion(cur, "f", ["w"], profiles)
    assert ch.reason == "replace" and ch.groups[0] == RunningGroup("g1", ("w",), ("m1", "m2"))
    # nothing waits: g1's machines go idle or to another group
    ch = on_completion(cur, "f", [], profiles)
    assert all("f" not in g.jobs and g.jobs for g in ch.groups)


def test_no_migration_that_only_raises_network_utilization():
    # (a, b) pipeline perfectly on m1 m2; c finishes and frees m3 m4. Spreading
    # a and b over 4 machines raises U (more network busy) but not their speed:
    # Tnet does not shrink with DoP. Nothing moves.
    profiles = {x: Profile(x, 2.0, 1.0, 1) for x in "abc"}
    cur = Current((RunningGroup("g1", ("a", "b"), ("m1", "m2")),
                   RunningGroup("g2", ("c",), ("m3", "m4"))), M4)
    after = Current(cur.groups[:1], M4)
    (spread,) = regroup_candidates(after, [], profiles)
    assert spread.moved == 2 and score(*spread.util) > score(*spread.util_before) * 1.05
    assert spread.util[0] == pytest.approx(spread.util_before[0])
    ch = on_completion(cur, "c", [], profiles)
    assert ch.noop and ch.groups == after.groups


def test_completion_of_a_job_not_running_changes_nothing():
    cur, profiles = two_groups()
    assert on_completion(cur, "zzz", [], profiles).noop


# --------------------------------------------------------------- arrival
def test_arrival_joins_the_group_that_maximizes_u():
    profiles = {"a": Profile("a", 2.0, 1.0, 1), "b": Profile("b", 0.5, 1.0, 1),
                "n": Profile("n", 2.0, 1.0, 1)}
    cur = Current((RunningGroup("g1", ("a",), ("m1", "m2")),
                   RunningGroup("g2", ("b",), ("m3", "m4"))), M4)
    ch = on_arrival(cur, "n", [], profiles)
    assert ch.start == {"n": "g1"} and ch.moved == 0 and sorted(ch.keep) == ["a", "b"]
    assert score(*ch.util) > score(*ch.util_before)
    assert ch.predicted["g1"] == pytest.approx(2.0)


def test_arrival_waits_when_it_would_lower_u():
    profiles = {"a": Profile("a", 2.0, 1.0, 1), "b": Profile("b", 2.0, 1.0, 1),
                "z": Profile("z", 0.01, 9.0, 1)}
    cur = Current((RunningGroup("g1", ("a", "b"), ("m1", "m2")),), ("m1", "m2"))
    ch = on_arrival(cur, "z", [], profiles)
    assert ch.noop and "waits" in ch.reason


def test_arrival_waits_when_others_wait_unless_asked_to_regroup():
    profiles = {"a": Profile("a", 2.0, 1.0, 1), "w": Profile("w", 2.0, 1.0, 1),
                "n": Profile("n", 2.0, 1.0, 1)}
    cur = Current((RunningGroup("g1", ("a",), ("m1", "m2")),), ("m1", "m2"))
    ch = on_arrival(cur, "n", ["w"], profiles)
    assert ch.noop and "other" in ch.reason
    ch = on_arrival(cur, "n", ["w"], profiles, regroup_if_others_wait=True)
    assert ch.start == {"w": "g1"}      # w is ahead in line; a and w pipeline


def test_arrival_of_a_running_job_is_an_error():
    profiles = {"a": Profile("a", 2.0, 1.0, 1)}
    cur = Current((RunningGroup("g1", ("a",), ("m1",)),), ("m1",))
    with pytest.raises(ValueError):
        on_arrival(cur, "a", [], profiles)


def test_arrival_uses_idle_machines():
    profiles = {"a": Profile("a", 2.0, 1.0, 1), "b": Profile("b", 2.0, 1.0, 1),
                "n": Profile("n", 2.0, 1.0, 1)}
    cur = Current((RunningGroup("g1", ("a", "b"), ("m1", "m2")),), M4)
    ch = on_arrival(cur, "n", [], profiles)
    assert ch.groups[1] == RunningGroup("g2", ("n",), ("m3", "m4"))
    assert ch.start == {"n": "g2"}


# ---------------------------------------------------------------- pick
def test_pick_applies_the_5_percent_rules():
    base = 0.80
    assert pick(base, []) is None
    assert pick(base, [(0, 0.80)]) is None                 # no gain
    assert pick(base, [(0, 0.801)]) == 0                   # nobody moves: any gain
    assert pick(base, [(2, 0.80 * 1.049)]) is None         # moves, gains 4.9%
    assert pick(base, [(2, 0.80 * 1.051)]) == 0            # moves, gains 5.1%
    # fewer moved jobs win unless more movement gains >= 5% over them
    few, more = (1, 0.80 * 1.06), (5, 0.80 * 1.06 * 1.04)
    assert pick(base, [more, few]) == 1
    more = (5, 0.80 * 1.06 * 1.06)
    assert pick(base, [more, few]) == 0
    # equal moves: the higher U
    assert pick(base, [(1, 0.90), (1, 0.95)]) == 1


# ------------------------------------------------------------ placement
def test_place_keeps_machine_sets_and_ids():
    cur = Current((RunningGroup("x", ("a", "b"), ("m1", "m2")),
                   RunningGroup("y", ("c",), ("m3", "m4", "m5"))),
                  ("m1", "m2", "m3", "m4", "m5", "m6"))
    plan = [PlannedGroup(("c", "d"), 3, 1.0), PlannedGroup(("a", "b"), 2, 1.0),
            PlannedGroup(("e",), 1, 1.0)]
    got = place(plan, cur)
    assert got[0] == RunningGroup("y", ("c", "d"), ("m3", "m4", "m5"))
    assert got[1] == RunningGroup("x", ("a", "b"), ("m1", "m2"))
    assert got[2] == RunningGroup("g1", ("e",), ("m6",))
    # shrinking keeps a prefix of the machines; growing takes idle ones first
    plan = [PlannedGroup(("a",), 1, 1.0), PlannedGroup(("c",), 4, 1.0)]
    got = place(plan, cur)
    assert got[0] == RunningGroup("x", ("a",), ("m1",))
    assert got[1] == RunningGroup("y", ("c",), ("m3", "m4", "m5", "m6"))
    with pytest.raises(ValueError):
        place([PlannedGroup(("a",), 7, 1.0)], cur)


def test_initial_schedule_on_an_empty_cluster():
    profiles = {p.id: p for p in random_profiles(12, 3)}
    machines = tuple(f"m{i}" for i in range(16))
    ch = regroup(Current((), machines), list(profiles), profiles)
    assert ch.groups and ch.moved == 0
    assert set(ch.start) == {j for g in ch.groups for j in g.jobs}
    used = [m for g in ch.groups for m in g.machines]
    assert sorted(used) == sorted(machines)             # every machine, once
    assert len({g.id for g in ch.groups}) == len(ch.groups)


def test_change_accounts_for_every_running_job():
    """Random clusters: each running job is kept, migrated or paused, once;
    kept jobs have exactly their old machines; ids stay unique."""
    for seed in range(8):
        ps = random_profiles(14, seed, dop=2)
        profiles = {p.id: p for p in ps}
        machines = tuple(f"m{i}" for i in range(12))
        first = regroup(Current((), machines), [p.id for p in ps[:8]], profiles)
        cur = Current(first.groups, machines)
        running = cur.running
        finished = running[seed % len(running)]
        waiting = [p.id for p in ps[8:]]
        ch = on_completion(cur, finished, waiting, profiles)
        before = {j: set(g.machines) for g in cur.groups for j in g.jobs if j != finished}
        after = {j: (g.id, set(g.machines)) for g in ch.groups for j in g.jobs}
        assert set(ch.keep) | set(ch.migrate) | set(ch.pause) == set(before)
        assert len(ch.keep) + len(ch.migrate) + len(ch.pause) == len(before)
        for j in ch.keep:
            assert after[j][1] == before[j]
        for j, gid in ch.migrate.items():
            assert after[j] == (gid, after[j][1]) and after[j][1] != before[j]
        assert set(ch.start) <= set(waiting)
        assert len({g.id for g in ch.groups}) == len(ch.groups)
        used = [m for g in ch.groups for m in g.machines]
        assert len(used) == len(set(used)) and set(used) <= set(machines)


# ------------------------------------------------ Tnet at a DoP (remote > 0)
def test_replacement_similarity_is_judged_at_the_groups_dop():
    # f (measured on its group's 2 machines): COMP 2 + COMM 1 there.
    # w was profiled on one machine (COMM 0.5, all local) with R = 1: on 2
    # machines COMM is 0.5 + 1/2 = 1, exactly f's; the constant model would
    # see 2 + 0.5 (17% shorter) and not replace.
    w = Profile("w", 4.0, 0.5, 1, remote=1.0)
    cur, profiles = two_groups(w=w)
    ch = on_completion(cur, "f", ["w"], profiles)
    assert ch.reason == "replace" and ch.start == {"w": "g1"}
    cur, profiles = two_groups(w=Profile("w", 4.0, 0.5, 1))
    assert on_completion(cur, "f", ["w"], profiles).reason != "replace"
    # the reverse: like f under the constant model (2 + 1), but on 2
    # machines its COMM is 1 + 1/2: 17% longer
    cur, profiles = two_groups(v=Profile("v", 4.0, 1.0, 1, remote=1.0))
    assert on_completion(cur, "f", ["v"], profiles).reason != "replace"
    cur, profiles = two_groups(v=Profile("v", 4.0, 1.0, 1))
    assert on_completion(cur, "f", ["v"], profiles).reason == "replace"


def test_change_predictions_use_comm_at_each_groups_dop():
    profiles = {p.id: p for p in random_profiles(10, 5, dop=2, remote=(0.5, 1.0))}
    machines = tuple(f"m{i}" for i in range(8))
    ch = regroup(Current((), machines), list(profiles), profiles)
    assert ch.groups and sorted(m for g in ch.groups for m in g.machines) == sorted(machines)
    for g in ch.groups:
        assert ch.predicted[g.id] == pytest.approx(
            group_iter_time([profiles[j] for j in g.jobs], len(g.machines)))


def test_a_bound_caps_the_regrouping_candidates_and_the_waiting_jobs():
    from harmony.sched.regroup import Bound
    machines = tuple(f"m{i}" for i in range(24))
    groups = tuple(RunningGroup(f"g{i}", (f"r{i}",), machines[2 * i:2 * i + 2])
                   for i in range(12))
    cur = Current(groups, machines)
    profiles = {f"r{i}": twin(f"r{i}", 1.0 + i / 10) for i in range(12)} | \
        {f"w{i}": twin(f"w{i}", 1.0, 0.5) for i in range(6)}
    waiting = [f"w{i}" for i in range(6)]
    free = regroup_candidates(cur, waiting, profiles)
    same = regroup_candidates(cur, waiting, profiles, bound=None)
    assert [c.groups for c in free] == [c.groups for c in same]
    bounded = regroup_candidates(cur, waiting, profiles, bound=Bound(groups=2, waiting=1))
    assert 0 < len(bounded) <= 3 < len(free)
    for c in bounded:        # only the first waiting job is ever placed
        placed = {j for g in c.groups for j in g.jobs}
        assert not placed & set(waiting[1:])
