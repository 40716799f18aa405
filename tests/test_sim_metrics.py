"""The seed papers' own metrics in the simulator's report (issue #15 item 6):
SLAQ's average normalized loss over time and OASiS's total utility, on
hand-computed cases, and filled in by a real simulation."""
from __future__ import annotations

import math

import pytest

from harmony.sim import report
from harmony.sim.report import JobResult, SimResult
from harmony.sim.run import default_utility, simulate
from harmony.policies.curves import Utility
from test_policies_zoo import small_trace


def _jobs() -> list[JobResult]:
    # A: loss 2 -> 0 over its curve; reports 1.0 (0.5 normalized) at t=4, 0 at t=8
    a = JobResult("a", "x", 0.0, 0.0, 10.0, loss=[(4.0, 1.0), (8.0, 0.0)],
                  loss_range=(2.0, 0.0), utility="sigmoid:1,1,10")
    # B: loss 1 -> 0.5; reports 0.75 (0.5 normalized) at t=5, ends at 6 (stopped early)
    b = JobResult("b", "x", 2.0, 2.0, 6.0, loss=[(5.0, 0.75)], loss_range=(1.0, 0.5),
                  utility="3")
    return [a, b]


def test_average_normalized_loss_over_time_by_hand():
    r = SimResult("p", _jobs())
    # active: [0,2) A=1; [2,4) A=B=1; [4,5) 0.5, 1; [5,8) 0.5, 0.5 (B ends at 6); [8,10) 0
    assert report.norm_loss_series(r) == [(0.0, 1.0, 1), (2.0, 1.0, 2), (4.0, 0.75, 2),
                                          (5.0, 0.5, 2), (6.0, 0.5, 1), (8.0, 0.0, 1),
                                          (10.0, 0.0, 0)]
    assert report.avg_norm_loss(r) == pytest.approx((2 + 2 + 0.75 + 0.5 + 1 + 0) / 10)
    # a job alone later, with no report: 1.0 while it is active; the idle gap
    # between (no active job) does not count
    c = JobResult("c", "x", 20.0, 25.0, 30.0, loss_range=(1.0, 0.0))
    assert report.avg_norm_loss(SimResult("p", _jobs() + [c])) == pytest.approx(
        (6.25 + 10) / 20)
    s = report.summarize(r)
    assert s["final_norm_loss"] == pytest.approx(0.25)     # B stopped at 0.5
    assert s["avg_norm_loss"] == pytest.approx(0.625)
    # 90% of the loss reduction: A at t=8 (arrived at 0); B never (stopped at 50%)
    assert report.time_to(r.jobs[0], 0.9) == 8.0 and math.isnan(report.time_to(r.jobs[1], 0.9))
    assert report.time_to(r.jobs[1], 0.5) == 3.0 and s["time_to_90"] == 8.0
    # normalized-loss seconds: A 4 x 1 + 4 x 0.5 + 2 x 0 = 6; B 3 x 1 + 1 x 0.5 = 3.5
    assert report.loss_integral(r.jobs[0]) == 6.0 and report.loss_integral(r.jobs[1]) == 3.5
    assert s["norm_loss_s"] == pytest.approx(4.75)


def test_total_utility_by_hand_and_without_curves_or_utilities():
    r = SimResult("p", _jobs())
    assert report.total_utility(r) == pytest.approx(0.5 + 3.0)   # sigmoid at its midpoint
    bare = SimResult("p", [JobResult("a", "x", 0.0, 0.0, 1.0)])
    assert math.isnan(report.total_utility(bare)) and math.isnan(report.avg_norm_loss(bare))


def test_a_simulation_reports_losses_and_utilities():
    trace = small_trace()
    res = simulate(trace, 4, "isolated", grain=10)
    by_id = {tj.id: tj for tj in trace}
    for j in res.jobs:
        tj = by_id[j.id]
        assert j.loss_range == (tj.curve.loss(0), tj.curve.loss(tj.iterations))
        assert len(j.loss) == 10 and j.loss[-1][1] == pytest.approx(j.loss_range[1])
        assert all(j.arrival <= t <= j.end for t, _ in j.loss)
        # no utility in the trace: the sigmoid oasis assumes, around twice its run alone
        assert j.utility == default_utility(tj, 1.25e9, 4).spec()
    u = Utility.parse(res.jobs[0].utility)
    assert u.kind == "sigmoid" and u.value(u.params[2]) == pytest.approx(0.5)
    s = report.summarize(res)
    assert 0 < s["avg_norm_loss"] < 1 and s["final_norm_loss"] == pytest.approx(0.0)
    assert 0 < s["total_utility"] <= len(trace)
    back = report.SimResult.from_dict(res.to_dict())
    assert report.summarize(back)["avg_norm_loss"] == pytest.approx(s["avg_norm_loss"])
