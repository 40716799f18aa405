"""The synchronizer off the master (harmony.subtasks.sync), pure: a leader
completes a round once every executor reported, in any order, enqueues on
every machine in the same order for all the jobs it leads, and refuses what
does not belong; members hold syncs that overtake their plan; leaders are
chosen so that co-located jobs share one."""
import random

import pytest
from hypothesis import given, settings, strategies as st

from harmony.subtasks import sync as S
from harmony.subtasks.sync import Enqueue, Failed, Plan, Sync, SyncLeader, SyncRouter


def plan(job="a", machines=("m0", "m1"), leader="m0", attempt=1, gen=1):
    return Plan(job, attempt, gen, tuple(machines), leader, "tcp://x:1")


def sync(job="a", index=0, seq=0, nxt="net", attempt=1, gen=1, prio=0.0):
    return Sync(job, attempt, gen, index, seq, nxt, prio)


def test_a_round_completes_when_every_machine_reported_in_any_order():
    ld = SyncLeader("m0")
    ld.plan(plan(machines=("m0", "m1", "m2")), 0.0)
    assert ld.sync("m2", sync(index=2), 0.0) == []
    assert ld.sync("m0", sync(index=0, prio=0.2), 0.0) == []
    out = ld.sync("m1", sync(index=1, prio=0.1), 0.0)
    assert out == [Enqueue(m, "a", 1, "net", 0.2) for m in ("m0", "m1", "m2")]
    # a repeated or late sync of a completed round enqueues nothing
    assert ld.sync("m1", sync(index=1), 0.0) == []
    assert ld.refused == 1


def test_syncs_that_do_not_belong_are_refused():
    ld = SyncLeader("m0")
    ld.plan(plan(), 0.0)
    assert ld.sync("m1", sync(index=0), 0.0) == []            # not index 0's machine
    assert ld.sync("m1", sync(index=5), 0.0) == []            # no such index
    assert ld.sync("m1", sync(index=1, attempt=0), 0.0) == []  # an older attempt
    assert ld.refused == 3
    # rounds open at once are bounded: a hostile member cannot grow them
    for seq in range(S.MAX_OPEN_ROUNDS + 3):
        ld.sync("m1", sync(index=1, seq=seq), 0.0)
    assert ld.refused == 6


def test_executors_that_disagree_fail_the_attempt_once():
    ld = SyncLeader("m0")
    ld.plan(plan(), 0.0)
    ld.sync("m0", sync(index=0, nxt="cpu"), 0.0)
    out = ld.sync("m1", sync(index=1, nxt="net"), 0.0)
    assert len(out) == 1 and isinstance(out[0], Failed) and "disagree" in out[0].error
    assert ld.sync("m0", sync(index=0, seq=1), 0.0) == []     # nothing after that


def test_a_sync_before_its_plan_is_held_then_completes_the_round():
    ld = SyncLeader("m0")
    assert ld.sync("m1", sync(index=1), 0.0) == []
    assert ld.sync("m0", sync(index=0), 0.0) == []
    assert len(ld.plan(plan(), 1.0)) == 2
    # held ones expire
    ld2 = SyncLeader("m0")
    ld2.sync("m1", sync(index=1), 0.0)
    ld2.sync("m1", sync(job="b", index=1), S.HELD_S + 1)
    assert ld2.refused == 1


def test_a_new_layout_replaces_the_old_one_and_an_old_plan_is_ignored():
    ld = SyncLeader("m0")
    ld.plan(plan(gen=2, machines=("m0", "m1", "m2")), 0.0)
    assert ld.plan(plan(gen=1), 0.0) == []
    assert ld.leads("a").machines == ("m0", "m1", "m2")
    ld.plan(plan(gen=3, machines=("m1", "m2"), leader="m1"), 0.0)   # led elsewhere now
    assert ld.leads("a") is None
    ld.plan(plan(attempt=2), 0.0)
    ld.drop("a", attempt=1)                # the old attempt's executor exits later
    assert ld.leads("a") is not None
    ld.drop("a", attempt=2)
    assert ld.leads("a") is None


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000))
def test_co_located_jobs_are_enqueued_in_the_same_order_on_every_machine(seed):
    """Three jobs on the same three machines, one leader: whatever order
    the syncs arrive in, every machine gets the enqueues in one order."""
    rnd = random.Random(seed)
    ms = ("m0", "m1", "m2")
    ld = SyncLeader("m0")
    for j in "abc":
        ld.plan(plan(job=j, machines=ms), 0.0)
    pending = [(j, i, 0) for j in "abc" for i in range(3)]
    got: dict[str, list] = {m: [] for m in ms}
    rounds = 0
    while pending and rounds < 200:
        rounds += 1
        j, i, seq = pending.pop(rnd.randrange(len(pending)))
        for c in ld.sync(ms[i], sync(job=j, index=i, seq=seq,
                                     nxt="net"), 0.0):
            got[c.machine].append((c.job, c.seq))
            if c.seq < 4:
                pending.append((c.job, ms.index(c.machine), c.seq))
    assert got["m0"] == got["m1"] == got["m2"]
    assert len(got["m0"]) == 3 * 4


def test_the_router_holds_syncs_until_their_plan_and_drops_stale_ones():
    r = SyncRouter()
    assert r.route(sync(), 0.0) is None
    ready = r.plan(plan(), 0.0)
    assert [s for _, s in ready] == [sync()]
    assert r.route(sync(seq=1), 0.0) == plan()
    r.plan(plan(gen=2), 0.0)
    assert r.route(sync(seq=2, gen=1), 0.0) is None and r.refused == 1   # stale
    r.drop("a", attempt=1)
    assert r.plan_of("a") is None


def test_the_leader_is_shared_by_co_located_jobs_and_is_one_of_the_jobs_machines():
    assert S.choose_leader(["m3", "m1"], []) == "m1"
    # the group's leader, if it is one of mine
    assert S.choose_leader(["m1", "m2"], [(["m2", "m5"], "m5"), (["m2", "m1"], "m2")]) == "m2"
    # a neighbour's leader that is not one of my machines cannot lead me
    assert S.choose_leader(["m1", "m2"], [(["m0", "m1"], "m0")]) == "m1"
    # jobs on other machines do not vote
    assert S.choose_leader(["m4"], [(["m1"], "m1")]) == "m4"
    with pytest.raises(ValueError):
        Plan("a", 1, 1, ("m0",), "m9")


def test_one_machine_cannot_fill_the_syncs_held_for_their_plans():
    ld = SyncLeader("m0")
    for seq in range(S.MAX_HELD_PER_MACHINE + 10):
        ld.sync("m1", sync(job=f"j{seq}", index=1), 0.0)
    assert ld.refused == 10
    assert ld.sync("m2", sync(job="x", index=1), 0.0) == [] and ld.refused == 10   # held
