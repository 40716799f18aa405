"""docs/policies.md's example policy, run from the doc itself: registered
(as its one registry line would) and simulated; and
``decision_from_target``, the helper it answers with."""
from __future__ import annotations

import json
import re
import types
from pathlib import Path

import pytest

from harmony.policies import registry as R
from harmony.policies.base import Policy, decision_from_target
from harmony.policies.view import ClusterView, JobView, WorkerView
from harmony.sim.run import setup, simulate
from harmony.sim.trace import load_trace

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"


def example_module() -> types.ModuleType:
    doc = (ROOT / "docs" / "policies.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", doc, re.S)
    code = next(b for b in blocks if b.startswith("# harmony/policies/smallest_first.py"))
    mod = types.ModuleType("smallest_first")
    exec(compile(code, "docs/policies.md", "exec"), mod.__dict__)
    return mod


@pytest.fixture
def registered(monkeypatch):
    cls = example_module().SmallestFirst
    monkeypatch.setitem(R.POLICIES, "smallest-first", cls)      # its registry line
    return cls


def workers(*loads: int) -> tuple[WorkerView, ...]:
    return tuple(WorkerView(f"m{i}", 8, 1 << 30, n) for i, n in enumerate(loads))


def test_example_is_a_policy_and_lets_a_small_job_overtake(registered):
    p = R.make("smallest-first")
    assert isinstance(p, Policy) and p.name == "smallest-first"
    assert setup("smallest-first") == ("smallest-first", "naive")
    view = ClusterView(workers(1, 0, 0, 0), waiting=(
        JobView("big", 4, 0.0), JobView("small", 2, 1.0), JobView("mid", 2, 2.0)),
        active=(JobView("old", 1, -1.0, state="running", workers=("m0",)),))
    dec = p.decide(view)
    assert dec.start == {"small": ["m1", "m2"]}
    assert not dec.pause and not dec.promote


def test_example_runs_in_the_simulator(registered):
    """Every job of the golden trace asks for 16 machines, so smallest-first
    places them in arrival order, isolated: the isolated policy's JCTs."""
    res = simulate(load_trace(DATA / "paper12.csv"), 40, "smallest-first", grain=20, seed=3)
    assert res.meta["policy"] == "smallest-first" and not res.meta["unfinished"]
    want = json.loads((DATA / "paper12_jct.json").read_text())["isolated"]
    assert {j.id: j.end - j.arrival for j in res.jobs} == pytest.approx(want, rel=1e-9)


# ---------------------------------------------------------------- decision_from_target

def test_target_keeps_moves_pauses_promotes_and_starts():
    view = ClusterView(workers(1, 1, 1, 1, 0, 0), waiting=(
        JobView("w1", 1, 5.0), JobView("w2", 1, 6.0)), active=(
        JobView("keep", 1, 0.0, state="running", workers=("m0",)),
        JobView("move", 1, 1.0, state="running", workers=("m1",)),
        JobView("drop", 1, 2.0, state="running", workers=("m2",)),
        JobView("prof", 1, 3.0, state="profiling", workers=("m3",))))
    dec = decision_from_target(view, {"keep": ["m0"], "move": ["m4", "m1"], "prof": ["m3"],
                                      "w2": ["m5"]}, group=lambda j: f"g:{j}", note="n")
    assert dec.pause == {"move": ["m4", "m1"], "drop": None}
    assert dec.promote == ["prof"]
    assert dec.start == {"w2": ["m5"]}
    assert dec.assign == {"keep": "g:keep", "move": "g:move", "prof": "g:prof", "w2": "g:w2"}
    assert dec.note == "n" and not dec.profile and not dec.stop
    # nothing wanted changes: an empty decision
    same = decision_from_target(view, {"keep": ["m0"], "move": ["m1"], "drop": ["m2"]})
    assert same.pause == {"prof": None} and not same.start and not same.promote


@pytest.mark.parametrize("target, what", [
    ({"ghost": ["m0"]}, "neither waiting nor active"),
    ({"w1": ["m9"]}, "not a live worker"),
    ({"w1": ["m0", "m0"]}, "named twice"),
])
def test_target_rejects_unknown_jobs_and_machines(target, what):
    view = ClusterView(workers(0, 0), waiting=(JobView("w1", 1, 0.0),))
    with pytest.raises(ValueError, match=what):
        decision_from_target(view, target)
