"""SLAQ's loss-curve fit falls back instead of grinding (issue #32, item 6):
mlfs-c spent most of its time in scipy's least_squares on jobs with no real
loss curve (a simulated job without a curve reports the epochs left: a
straight line). Pure: no cluster, no simulator."""
from __future__ import annotations

import random
import time

import pytest
import scipy.optimize

from harmony.policies import curves
from harmony.policies.curves import LossCurve, fit_curve, slaq_fit, straight_line
from harmony.policies.estimates import Estimator
from harmony.policies.view import ClusterView, JobView


def _job(jid: str, progress: tuple) -> JobView:
    return JobView(id=jid, machines=2, submitted=0.0, progress=progress)


@pytest.fixture
def nfev(monkeypatch):
    """The function evaluations of every least_squares call."""
    seen: list[tuple[int, int]] = []
    real = scipy.optimize.least_squares

    def counted(*args, **kw):
        sol = real(*args, **kw)
        seen.append((sol.nfev, sol.status))
        return sol
    monkeypatch.setattr(scipy.optimize, "least_squares", counted)
    slaq_fit.cache_clear()
    yield seen
    slaq_fit.cache_clear()


def test_a_straight_line_is_no_loss_curve(nfev):
    slaq_fit(((0.0, 1.0), (1.0, 0.5), (2.0, 0.4)))      # scipy imported before timing
    nfev.clear()
    lines = []
    for n in (3, 5, 10, 30, 200):
        # the epochs left, as the simulator reports for a job without a curve
        lines.append(tuple((10.0 * i, float(n - i)) for i in range(n)))
        lines.append(tuple((5.0 * i, 3.0 + 0.25 * i) for i in range(n)))   # rising, offset
    assert all(straight_line(p) for p in lines)
    # not lines: two points, flat points, a real curve, noise
    c = LossCurve("sublinear", (0.001, 0.05, 1.0, 0.2))
    rng = random.Random(3)
    assert not straight_line(((0.0, 2.0), (10.0, 1.0)))
    assert not straight_line(((0.0, 2.0), (10.0, 2.0), (20.0, 2.0)))
    assert not straight_line(tuple((20.0 * k, c.loss(20.0 * k)) for k in range(3)))
    assert not straight_line(tuple((10.0 * i, 50.0 - i + rng.gauss(0, 0.3)) for i in range(8)))
    # mlfs's estimates: no fit for a line, at once, no least squares run
    est = Estimator(ClusterView(workers=(), waiting=()), fit_lines=False)
    t0 = time.perf_counter()
    for i, pts in enumerate(lines):
        assert est.gain_left(_job(f"j{i}", pts)) is None
    assert nfev == [] and time.perf_counter() - t0 < 0.5
    # slaq_fit itself still fits a line (slaq's and oasis's decisions are
    # unchanged)
    slaq_fit.cache_clear()
    assert slaq_fit(lines[2]) is not None and nfev


def test_noise_is_fitted_within_the_cap(nfev, monkeypatch):
    """With a cap set (MAX_NFEV; scipy's default otherwise) every fit stops
    within it."""
    monkeypatch.setattr(curves, "MAX_NFEV", 100)
    slaq_fit.cache_clear()
    rng = random.Random(7)
    for n in (4, 8, 16):
        pts = tuple((10.0 * i, 5.0 + rng.gauss(0, 1)) for i in range(n))
        slaq_fit(pts)
        pts = tuple((10.0 * i, 50.0 - i + rng.gauss(0, 0.3)) for i in range(n))
        slaq_fit(pts)
    assert nfev and max(n for n, _ in nfev) <= curves.MAX_NFEV


@pytest.mark.parametrize("curve", [LossCurve("sublinear", (0.001, 0.05, 1.0, 0.2)),
                                   LossCurve("sublinear", (0.01, 0.1, 1.0, 0.2)),
                                   LossCurve("linear", (0.98, 0.0, 0.3)),
                                   LossCurve("linear", (0.9, 2.0, -1.0))])
@pytest.mark.parametrize("n", [3, 5, 10, 30, 60])
def test_real_curves_fit_as_without_the_cap(nfev, monkeypatch, curve, n):
    pts = tuple((20.0 * k, curve.loss(20.0 * k)) for k in range(n))
    monkeypatch.setattr(curves, "MAX_NFEV", 100)
    slaq_fit.cache_clear()
    capped = slaq_fit(pts)
    assert capped is not None
    # (the other model may run to the cap on a curve it does not describe:
    # the winner is the same)
    monkeypatch.setattr(curves, "MAX_NFEV", None)      # scipy's default limit
    slaq_fit.cache_clear()
    assert slaq_fit(pts) == capped


def test_fit_curve_still_recovers_its_models():
    s = LossCurve("sublinear", (0.01, 0.1, 1.0, 0.2))
    lin = LossCurve("linear", (0.9, 2.0, 0.3))
    ks = list(range(1, 40))
    fit = fit_curve(ks, [s.loss(k) for k in ks], "sublinear", decay=1.0)
    assert max(abs(fit.loss(k) - s.loss(k)) / s.loss(k) for k in ks) < 0.01
    fit = fit_curve(ks, [lin.loss(k) for k in ks], "linear", decay=1.0)
    assert max(abs(fit.loss(k) - lin.loss(k)) / lin.loss(k) for k in ks) < 0.01
