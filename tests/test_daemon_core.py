"""The daemon's protocol core (harmony.worker.daemon_core): pure, no sockets,
an injected clock. Each case is a table of steps: (time, call, arguments,
the actions expected, rendered short)."""
import pytest

from harmony.worker.daemon_core import (STARVED_FRESH_S, DaemonCore, Deliver, Demote, Done,
                                        Grant, OomKill, Promote, QueueError, QueueStats, Resume,
                                        Stop, Sub)


def render(a) -> str:
    t = type(a)
    s = f"{a.sub.job}{a.sub.seq}" if hasattr(a, "sub") else ""
    if t is Grant:
        return f"{'held' if a.held else 'grant'} {s} {a.role}"
    if t is Deliver:
        return f"deliver {s} {a.role}"
    if t is Resume:
        return f"resume {s} stood={a.stood:g}" + (" tell" if a.tell else "")
    if t is OomKill:
        return f"oom {a.job} {a.used}/{a.total}" + ("" if a.loaded else " setup")
    return {Done: "done", Promote: "promote", Demote: "demote", Stop: "stop"}[t] + " " + s


def S(job, seq, kind, prio=0.0):
    return Sub(job, seq, kind, prio)


def run(core, steps):
    for i, (now, call, args, want) in enumerate(steps):
        if call == "enqueue":
            got = core.enqueue(S(*args), now)
        elif call in ("ready", "left", "exited"):
            got = getattr(core, call)(args, now)
        elif call == "done":
            got = core.done(*args, now)
        else:
            raise AssertionError(call)
        assert [render(a) for a in got] == want, f"step {i}: {call}{args} at t={now}"


CASES = {
    # the normal order: the executor's done, then the master's next enqueue
    "done before the next enqueue": [
        (0.0, "ready", "a", []),
        (0.0, "enqueue", ("a", 1, "cpu"), ["grant a1 cpu"]),
        (1.0, "done", ("a", 1), ["done a1"]),
        (1.5, "enqueue", ("a", 2, "net"), ["grant a2 primary"]),
    ],
    # the master's enqueue of a2 overtakes the executor's release of a1: it
    # waits for that done, and b's COMP queued meanwhile goes first
    "enqueue overtakes the done": [
        (0.0, "ready", "a", []), (0.0, "ready", "b", []),
        (0.0, "enqueue", ("a", 1, "cpu"), ["grant a1 cpu"]),
        (0.1, "enqueue", ("a", 2, "cpu"), []),
        (0.2, "enqueue", ("b", 1, "cpu"), []),
        (1.0, "done", ("a", 1), ["done a1", "grant b1 cpu"]),
        (2.0, "done", ("b", 1), ["done b1", "grant a2 cpu"]),
    ],
    "deferred enqueue of the other kind starts with the done": [
        (0.0, "ready", "a", []),
        (0.0, "enqueue", ("a", 1, "net"), ["grant a1 primary"]),
        (0.1, "enqueue", ("a", 2, "cpu"), []),
        (1.0, "done", ("a", 1), ["done a1", "grant a2 cpu"]),
    ],
    # an enqueue for a job whose executor has not said hello: the slot is
    # taken (FIFO) but the grant is held until it is ready
    "executor not ready yet": [
        (0.0, "enqueue", ("a", 1, "cpu"), ["held a1 cpu"]),
        (0.0, "ready", "b", []),
        (0.1, "enqueue", ("b", 1, "cpu"), []),
        (0.5, "ready", "a", ["deliver a1 cpu"]),
        (0.6, "ready", "a", []),                              # twice: nothing more
        (1.0, "done", ("a", 1), ["done a1", "grant b1 cpu"]),
    ],
    "a job leaves before its executor was ready": [
        (0.0, "enqueue", ("a", 1, "net"), ["held a1 primary"]),
        (0.0, "ready", "b", []),
        (0.1, "enqueue", ("b", 1, "net"), ["grant b1 secondary"]),
        (0.2, "left", "a", ["promote b1"]),
        (0.3, "ready", "a", []),                              # its held grant is gone
    ],
    # a job leaves holding the primary: the secondary leads, the waiting one runs
    "a job leaves with a granted subtask": [
        (0.0, "ready", "a", []), (0.0, "ready", "b", []), (0.0, "ready", "c", []),
        (0.0, "enqueue", ("a", 1, "net"), ["grant a1 primary"]),
        (0.0, "enqueue", ("b", 1, "net"), ["grant b1 secondary"]),
        (0.0, "enqueue", ("c", 1, "net"), []),
        (0.0, "enqueue", ("a", 2, "cpu"), []),                # deferred: dropped too
        (1.0, "left", "a", ["promote b1", "grant c1 secondary"]),
        (1.5, "left", "a", []),
        (2.0, "done", ("b", 1), ["done b1", "promote c1"]),
    ],
    # CPU preemption: the long COMP stands 0.5 s while the short one runs,
    # and its executor is told so when it goes on
    "stop and resume, stood time": [
        (0.0, "ready", "L", []), (0.0, "ready", "s", []),
        (0.0, "enqueue", ("L", 1, "cpu", 1.0), ["grant L1 cpu"]),
        (2.0, "enqueue", ("s", 1, "cpu", 0.1), ["stop L1", "grant s1 cpu"]),
        (2.5, "done", ("s", 1), ["done s1", "resume L1 stood=0.5 tell"]),
        (3.0, "done", ("L", 1), ["done L1"]),
    ],
    # the long COMP had ended just before the stop reached it: its done
    # counts, it is only continued (nothing to tell), and holds no slot
    "done of a stopped COMP": [
        (0.0, "ready", "L", []), (0.0, "ready", "s", []),
        (0.0, "enqueue", ("L", 1, "cpu", 1.0), ["grant L1 cpu"]),
        (2.0, "enqueue", ("s", 1, "cpu", 0.1), ["stop L1", "grant s1 cpu"]),
        (2.1, "done", ("L", 1), ["done L1", "resume L1 stood=0.1"]),
        (2.5, "done", ("s", 1), ["done s1"]),
    ],
    # the short job's next COMP was enqueued early: the long one goes on
    # and is stopped again; each stand is told (none is lost)
    "resume then stop again": [
        (0.0, "ready", "L", []), (0.0, "ready", "s", []),
        (0.0, "enqueue", ("L", 1, "cpu", 1.0), ["grant L1 cpu"]),
        (1.0, "enqueue", ("s", 1, "cpu", 0.1), ["stop L1", "grant s1 cpu"]),
        (1.1, "enqueue", ("s", 2, "cpu", 0.1), []),
        (1.2, "done", ("s", 1), ["done s1", "resume L1 stood=0.2 tell", "stop L1",
                                 "grant s2 cpu"]),
        (1.5, "done", ("s", 2), ["done s2", "resume L1 stood=0.3 tell"]),
    ],
    "the short job leaves while the long one stands": [
        (0.0, "ready", "L", []), (0.0, "ready", "s", []),
        (0.0, "enqueue", ("L", 1, "cpu", 1.0), ["grant L1 cpu"]),
        (1.0, "enqueue", ("s", 1, "cpu", 0.1), ["stop L1", "grant s1 cpu"]),
        (1.25, "left", "s", ["resume L1 stood=0.25 tell"]),
    ],
    "the stopped job leaves": [
        (0.0, "ready", "L", []), (0.0, "ready", "s", []),
        (0.0, "enqueue", ("L", 1, "cpu", 1.0), ["grant L1 cpu"]),
        (1.0, "enqueue", ("s", 1, "cpu", 0.1), ["stop L1", "grant s1 cpu"]),
        (1.1, "exited", "L", []),
        (1.2, "done", ("s", 1), ["done s1"]),
    ],
    "a shorter transfer leads the link": [
        (0.0, "ready", "a", []), (0.0, "ready", "b", []),
        (0.0, "enqueue", ("a", 1, "net", 0.3), ["grant a1 primary"]),
        (0.1, "enqueue", ("b", 1, "net", 0.01), ["demote a1", "grant b1 primary"]),
        (0.2, "done", ("b", 1), ["done b1", "promote a1"]),
    ],
    # a stopped COMP whose executor is not ready: continued, not told
    "resume of a held grant is not told": [
        (0.0, "ready", "s", []),
        (0.0, "enqueue", ("L", 1, "cpu", 1.0), ["held L1 cpu"]),
        (1.0, "enqueue", ("s", 1, "cpu", 0.1), ["stop L1", "grant s1 cpu"]),
        (1.5, "done", ("s", 1), ["done s1", "resume L1 stood=0.5"]),
        (1.6, "ready", "L", ["deliver L1 cpu"]),
    ],
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_protocol(name):
    run(DaemonCore(), CASES[name])


def test_busy_time_under_an_injected_clock():
    c = DaemonCore()
    run(c, CASES["stop and resume, stood time"][:5])      # up to t=2.5, L running again
    # CPU held: L 0-2, s 2-2.5, L 2.5-3 (a stopped COMP holds nothing)
    assert c.busy(3.0) == pytest.approx((3.0, 0.0))
    c.done("L", 1, 3.0)
    assert c.busy(10.0) == pytest.approx((3.0, 0.0))
    c = DaemonCore()
    run(c, CASES["a job leaves with a granted subtask"])  # a 0-1, b 0-2, c 1-...
    assert c.busy(4.0) == pytest.approx((0.0, 1.0 + 2.0 + 3.0))


# (granted, wait s, done, run s) per resource after a case's steps (then
# more steps, if any): wait = joined the queue -> the executor told (grant
# or deliver); run = told -> done, less the time a COMP stood stopped
QUEUE_STATS = {
    # a1 told at its deliver (0.5), run 0.5-1; b1 queued 0.1-1
    "executor not ready yet": ([], {"cpu": (2, 0.5 + 0.9, 1, 0.5)}),
    # L runs 0-2 and 2.5-3 (stood 0.5), s 2-2.5
    "stop and resume, stood time": ([], {"cpu": (2, 0.0, 2, 2.5 + 0.5)}),
    # L ran 0-2, its done came while it stood
    "done of a stopped COMP": ([], {"cpu": (2, 0.0, 2, 2.0 + 0.5)}),
    # L's grant held 0-1.6 (it was stopped and resumed meanwhile), runs to 2
    "resume of a held grant is not told": ([(2.0, "done", ("L", 1), ["done L1"])],
                                           {"cpu": (2, 1.6, 2, 0.5 + 0.4)}),
    # b1 waits 0.2-1; a2 joins the queue at a1's done (1) and waits to 2
    "enqueue overtakes the done": ([], {"cpu": (3, 0.8 + 1.0, 2, 1.0 + 1.0)}),
    # c1 waits 0-1; a1 left holding the primary: never done; b1 0-2
    "a job leaves with a granted subtask": ([], {"net": (3, 1.0, 1, 2.0)}),
    "a shorter transfer leads the link": ([], {"net": (2, 0.0, 1, 0.1)}),
    # L runs 0-1, 1.2-1.2, 1.5-2; s1 1-1.2, s2 (deferred, joins at 1.2) 1.2-1.5
    "resume then stop again": ([(2.0, "done", ("L", 1), ["done L1"])],
                               {"cpu": (3, 0.0, 3, 1.5 + 0.2 + 0.3)}),
}


@pytest.mark.parametrize("name", sorted(QUEUE_STATS))
def test_queue_waits_and_run_times_under_an_injected_clock(name):
    more, want = QUEUE_STATS[name]
    c = DaemonCore()
    run(c, CASES[name] + more)
    got = c.queue_stats()
    assert set(got) == {"cpu", "net"}
    for kind in ("cpu", "net"):
        g = got[kind]
        w = want.get(kind, (0, 0.0, 0, 0.0))
        assert isinstance(g, QueueStats) and (g.granted, g.done) == (w[0], w[2]), kind
        assert g.wait == pytest.approx(w[1], abs=1e-12), kind
        assert g.run == pytest.approx(w[3], abs=1e-12), kind


def test_queue_stats_of_a_done_before_its_deliver_and_of_a_job_that_left():
    c = DaemonCore()
    c.enqueue(S("a", 1, "cpu"), 0.0)                 # held: a not ready
    c.done("a", 1, 1.5)                              # its wait ends at the done; ran 0
    c.ready("b", 2.0)
    c.enqueue(S("b", 1, "net"), 2.0)
    c.enqueue(S("b", 2, "cpu"), 2.5)                 # deferred
    c.left("b", 3.0)                                 # b1 told, never done; b2 never joined
    c.enqueue(S("b", 1, "net"), 4.0)                 # a new executor of b: held, left
    c.left("b", 5.0)
    assert c.queue_stats() == {"cpu": QueueStats(1, 1.5, 1, 0.0),
                               "net": QueueStats(1, 0.0, 0, 0.0)}
    assert c.busy(5.0) == pytest.approx((1.5, 1.0 + 1.0))


def test_refusals_change_nothing():
    c = DaemonCore()
    c.ready("a", 0)
    c.enqueue(S("a", 1, "cpu"), 0.0)
    with pytest.raises(QueueError, match="not running"):
        c.done("a", 2, 1.0)                       # a subtask that holds no slot
    with pytest.raises(QueueError, match="not running"):
        c.done("b", 1, 1.0)
    with pytest.raises(QueueError, match="kind"):
        c.enqueue(S("a", 2, "gpu"), 1.0)          # refused, not deferred
    with pytest.raises(QueueError, match="already has"):
        c.enqueue(S("a", 1, "cpu"), 1.0)          # the same subtask twice
    assert c.current("a") == S("a", 1, "cpu")
    assert [render(x) for x in c.done("a", 1, 2.0)] == ["done a1"]   # no deferred gpu
    assert c.current("a") is None


def test_oom_killer_counts_executors_from_process_start():
    """An executor setting up (not ready: parsing input, building its
    model) counts against the budget; the α view shows loaded ones only."""
    c = DaemonCore(memory_budget=100, oom_kill=True)
    c.started("a", 0.0)
    c.started("b", 0.0)
    c.ready("b", 0.0)
    assert sorted(c.memory_jobs()) == ["a", "b"] and c.memory_jobs(loaded_only=True) == ["b"]
    assert c.memory(0.1, {"a": 30, "b": 40}) == []
    v = c.memory_view("a", 0.3)
    assert (v.budget, v.others_bytes, v.others_count) == (100, 40, 1)
    assert v.age == pytest.approx(0.2)
    assert c.memory_view("b", 0.3).others_count == 0      # a is not loaded
    kill = c.memory(0.4, {"a": 70, "b": 40})
    assert [render(k) for k in kill] == ["oom a 70/110 setup"]
    assert c.memory_jobs() == ["b"]                        # not counted twice
    assert c.memory(0.5, {"b": 40}) == []
    # loaded and the largest: killed as loaded
    c.started("d", 1.0)
    c.ready("d", 1.0)
    assert [render(k) for k in c.memory(1.1, {"b": 40, "d": 61})] == ["oom d 61/101"]
    c.exited("a", 2.0)
    c.exited("d", 2.0)
    assert c.memory_jobs() == ["b"]
    # no killer without oom_kill; no sample, no age
    quiet = DaemonCore(memory_budget=10)
    assert quiet.memory_view("x", 5.0).age is None
    quiet.started("x", 0.0)
    assert quiet.memory(0.1, {"x": 1000}) == []


def test_starved_alpha_state_is_fresh_for_a_while_and_never_ones_own():
    c = DaemonCore(memory_budget=100)
    c.alpha_state("a", 0.5, True, 100.0)
    c.alpha_state("b", 0.2, False, 100.0)
    assert c.memory_view("b", 100.0 + STARVED_FRESH_S - 0.1).others_starved
    assert not c.memory_view("b", 100.0 + STARVED_FRESH_S + 0.1).others_starved
    assert not c.memory_view("a", 101.0).others_starved
    c.alpha_state("a", 0.5, False, 102.0)
    assert not c.memory_view("b", 102.0).others_starved
    c.alpha_state("a", 0.5, True, 103.0)
    c.exited("a", 104.0)                                   # gone: no news of it
    assert not c.memory_view("b", 104.0).others_starved


def test_the_bytes_starved_jobs_ask_for_are_summed_for_the_others():
    c = DaemonCore(memory_budget=100)
    c.alpha_state("a", 0.5, True, 100.0, need=3e6)
    c.alpha_state("b", 0.7, True, 100.0, need=1e6)
    c.alpha_state("c", 0.1, False, 100.0, need=9e6)        # not starved: its need is no ask
    v = c.memory_view("c", 101.0)
    assert v.others_starved and v.others_need == 4e6
    assert c.memory_view("a", 101.0).others_need == 1e6    # never its own
    assert c.memory_view("c", 100.0 + STARVED_FRESH_S + 1).others_need == 0.0
    for bad in (float("inf"), float("nan"), -5.0):         # a broken executor's number
        c.alpha_state("a", 0.5, True, 200.0, need=bad)
        c.alpha_state("b", 0.5, False, 200.0)
        assert c.memory_view("c", 200.0).others_need == 0.0
