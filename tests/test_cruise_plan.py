"""harmony.cruise.plan: plan DAGs, greedy moves, the scheduler and the 5% rule."""
import pytest

from harmony.cruise.plan import (DATA, MODEL, Execution, Layout, OpCosts, make_plan,
                                 predicted_gain, ready_ops, retarget, schedule,
                                 worth_applying)


def kinds(plan):
    return [str(o) for o in plan.ops]


def test_retarget_moves_few_blocks_largest_first():
    cur = Layout(("a", "b", "c"), ("a",) * 6 + ("b",) * 3 + ("c",) * 3, ("c",) * 4)
    tgt = retarget(cur, ["a", "b", "c", "d"], [2, 3, 3, 4], [0, 0, 2, 2])
    assert [tgt.count(DATA, x) for x in "abcd"] == [2, 3, 3, 4]
    assert [tgt.count(MODEL, x) for x in "abcd"] == [0, 0, 2, 2]
    # only a's surplus moves, all to d in one go; b and c keep theirs
    moved = [b for b, (o, t) in enumerate(zip(cur.data_owner, tgt.data_owner)) if o != t]
    assert len(moved) == 4 and all(cur.data_owner[b] == "a" for b in moved)
    plan = make_plan(cur, tgt)
    assert plan.blocks_moved(DATA) == 4 and plan.blocks_moved(MODEL) == 2
    assert len(plan.moves) == 2
    with pytest.raises(ValueError):
        retarget(cur, ["a", "b"], [6, 5], [4, 0])           # 11 of 12 data blocks


def test_greedy_pairs_largest_surplus_with_largest_deficit():
    cur = Layout(("a", "b", "c", "d"), ("a",) * 7 + ("b",) * 3 + ("c",) * 2, ("a",))
    tgt = retarget(cur, ["a", "b", "c", "d"], [2, 2, 4, 4], [1, 0, 0, 0])
    plan = make_plan(cur, tgt)
    moves = sorted((o.machine, o.dest, len(o.blocks)) for o in plan.moves)
    # a (+5) -> d (-4) takes 4, then a (+1) and b (+1) -> c (-2)
    assert moves == [("a", "c", 1), ("a", "d", 4), ("b", "c", 1)]
    assert plan.blocks_moved() == 6          # the sum of the surpluses: the fewest possible


def test_plan_ops_and_dependencies():
    # a, b workers + c, d servers  ->  a worker, b server, d both, e (new) worker; c deleted
    cur = Layout(("a", "b", "c", "d"), ("a",) * 4 + ("b",) * 4, ("c",) * 2 + ("d",) * 2)
    tgt = retarget(cur, ["a", "b", "c", "d", "e"], [3, 0, 0, 2, 3], [0, 2, 0, 2, 0])
    assert [tgt.role(x) for x in "abde"] == ["worker", "server", "both", "worker"]
    assert "c" not in tgt.machines
    plan = make_plan(cur, tgt)
    ops = plan.ops
    idx = {str(o): i for i, o in enumerate(ops)}
    assert plan.counts() == {"add": 1, "switch": 2, "move": 4, "delete": 1}
    add_e = idx["add e (worker)"]
    sw_b, sw_d = idx["switch b worker->server"], idx["switch d server->both"]
    dele = idx["delete c"]
    for i, o in enumerate(ops):
        before = plan.preds(i)
        if o.kind == "move" and o.dest == "e":
            assert add_e in before                       # add before moves onto it
        if o.kind == "move" and o.dest == "b" and o.store == MODEL:
            assert sw_b in before                        # b becomes a server first
        if o.kind == "move" and o.dest == "d" and o.store == DATA:
            assert sw_d in before                        # d becomes a worker first
        if o.kind == "move" and o.machine == "b":
            assert sw_b not in before                    # b's data leaves whenever
    moves_off_c = {i for i, o in enumerate(ops) if o.kind == "move" and o.machine == "c"}
    assert moves_off_c and plan.preds(dele) == moves_off_c    # moves off before delete


def test_role_swap_is_acyclic():
    # a: worker -> server, b: server -> worker: each needs the other's blocks
    cur = Layout(("a", "b"), ("a",) * 4, ("b",) * 2)
    tgt = retarget(cur, ["a", "b"], [0, 4], [2, 0])
    plan = make_plan(cur, tgt)
    assert plan.counts() == {"switch": 2, "move": 2}
    s = schedule(plan, OpCosts(switch=1.0, data_block=1.0, model_block=1.0))
    assert s.makespan == pytest.approx(1.0 + 4.0)    # switches, then the moves in parallel


def test_schedule_limits_concurrent_moves():
    # 6 single-block moves from a to six new machines, 1 s each; add 2 s
    cur = Layout(("a",), ("a",) * 7, ("a",))
    names = ["a"] + [f"n{i}" for i in range(6)]
    tgt = retarget(cur, names, [1] * 7, [1] + [0] * 6)
    plan = make_plan(cur, tgt)
    assert plan.counts() == {"add": 6, "move": 6}
    costs = OpCosts(add=2.0, data_block=1.0)
    s = schedule(plan, costs, max_moves=4)
    assert s.makespan == pytest.approx(2.0 + 1.0 + 1.0)   # 4 moves, then 2
    for t in (2.0, 2.5, 3.0):
        running = sum(1 for i, o in enumerate(plan.ops) if o.kind == "move"
                      and s.start[i] <= t < s.end[i])
        assert running <= 4
    assert schedule(plan, costs, max_moves=1).makespan == pytest.approx(2.0 + 6.0)
    assert schedule(plan, costs, max_moves=6).makespan == pytest.approx(3.0)


def test_largest_moves_start_first():
    cur = Layout(("a", "b", "c", "d", "e"), ("a",) * 10 + ("b",) * 5, ("a",))
    tgt = retarget(cur, list("abcde"), [1, 1, 6, 4, 3], [1, 0, 0, 0, 0])
    plan = make_plan(cur, tgt)
    s = schedule(plan, OpCosts(data_block=1.0), max_moves=1)
    order = sorted(range(len(plan.ops)), key=lambda i: s.start[i])
    sizes = [len(plan.ops[i].blocks) for i in order if plan.ops[i].kind == "move"]
    assert sizes == sorted(sizes, reverse=True)


def test_execution_and_generator_agree_with_dependencies():
    cur = Layout(("a", "b", "c"), ("a",) * 4 + ("b",) * 4, ("c",) * 2)
    tgt = retarget(cur, ["a", "b", "d"], [3, 3, 2], [0, 0, 2])    # c leaves, d comes
    plan = make_plan(cur, tgt)
    ex = Execution(plan)
    first = ex.start()
    assert {str(plan.ops[i]) for i in first} == {"add d (both)"} | {
        str(o) for o in plan.ops if o.kind == "move" and o.dest != "d"}
    assert ex.start() == []                         # nothing new until something ends
    with pytest.raises(ValueError):
        ex.done(len(plan.ops) - 1)                  # delete c has not started
    gen = ready_ops(plan)
    seen, batch = [], next(gen)
    while True:
        seen += batch
        for op in batch:                            # everything started is ready
            i = plan.ops.index(op)
            assert all(plan.ops[p] in seen for p in plan.preds(i))
        try:
            batch = gen.send(batch)                 # all finish at once
        except StopIteration:
            break
    assert sorted(map(str, seen)) == sorted(map(str, plan.ops))


def test_modulo_layout_is_harmony_today():
    lay = Layout.modulo(["m0", "m1", "m2"], 7, 5)
    assert lay.data_owner[4] == "m1" and lay.model_owner[3] == "m0"
    assert all(lay.role(m) == "both" for m in lay.machines)
    assert make_plan(lay, lay).ops == ()
    with pytest.raises(ValueError):
        Layout(("a",), ("b",), ("a",))


def test_worth_applying_the_5_percent_rule():
    # 10 epochs of 100 s left; the target takes 90 s; the plan 20 s
    assert predicted_gain(100, 90, 20, 10) == pytest.approx((1000 - 920) / 1000)
    assert worth_applying(100, 90, 20, 10)                       # 8%
    assert not worth_applying(100, 90, 60, 10)                   # 4%: not worth it
    assert not worth_applying(100, 96, 0, 10)                    # 4% even for free
    assert worth_applying(100, 95, 0, 10)                        # exactly 5%
    assert not worth_applying(100, 50, 20, 0)                    # nothing left to gain
    assert not worth_applying(100, 120, 0, 10)                   # worse
    assert worth_applying(100, 90, 60, 100)                      # longer jobs amortize
    assert worth_applying(100, 90, 60, 10, threshold=0.0)
