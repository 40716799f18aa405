"""Warm-started loss-curve fits (``harmony.policies.curves.CurveFits``;
issue #32 item 6): slaq, mlfs and oasis refit every running job's curve at
every decision, one epoch apart; starting where the job's last fit ended
skips the grid of floors and converges in a few steps. Pure."""
from __future__ import annotations

import random

import numpy as np
import pytest
import scipy.optimize

from harmony.policies import curves, registry
from harmony.policies.curves import CurveFits, LossCurve, _slaq_fit


def _residual(fit, points) -> float:
    curve, sign, _ = fit
    ks = [k for k, _ in points]
    ys = [sign * y for _, y in points]
    w = 0.9 ** np.arange(len(ks) - 1, -1, -1)
    return float(np.sum(w * (np.array([curve.loss(k) for k in ks]) - ys) ** 2))


def _windows(curve: LossCurve, n: int, window: int, noise: float, seed: int):
    """A job's progress as the view shows it, epoch after epoch: the latest
    ``window`` (iterations, objective) points, with noise."""
    rng = random.Random(seed)
    pts = [(10.0 * e, curve.loss(10.0 * e) * (1 + rng.gauss(0, noise))) for e in range(n)]
    return [tuple(pts[max(0, e - window):e]) for e in range(3, n + 1)]


@pytest.fixture
def grids(monkeypatch):
    """The NNLS solves of the cold fits' grid of floors."""
    calls = [0]
    real = scipy.optimize.nnls

    def counted(*a, **kw):
        calls[0] += 1
        return real(*a, **kw)
    monkeypatch.setattr(scipy.optimize, "nnls", counted)
    return calls


@pytest.mark.parametrize("curve", [LossCurve("sublinear", (1e-5, 0.01, 1.0, 0.1)),
                                   LossCurve("linear", (0.97, 0.0, 0.3))])
def test_warm_fits_skip_the_grid_and_fit_as_well(curve, grids):
    seq = _windows(curve, 60, 32, 0.002, seed=4)
    cold = [_slaq_fit(p, None)[0] for p in seq]
    per_cold = grids[0] / len(seq)
    assert per_cold >= 40           # every cold fit runs the grid
    grids[0] = 0
    fits = CurveFits()
    warm = [fits.fit("j", p) for p in seq]
    # the grid ran for the first fit (and where a warm one did not converge)
    assert grids[0] <= 0.2 * per_cold * len(seq)
    for p, c, w in zip(seq, cold, warm):
        span = (max(y for _, y in p) - min(y for _, y in p)) ** 2
        assert _residual(w, p) <= _residual(c, p) + 1e-6 * span


def test_the_same_points_are_not_fitted_again(grids, monkeypatch):
    pts = _windows(LossCurve("sublinear", (1e-4, 0.02, 1.0, 0.2)), 12, 32, 0.0, seed=1)[-1]
    fits = CurveFits()
    first = fits.fit("j", pts)
    ran = []
    monkeypatch.setattr(curves, "_slaq_fit", lambda *a: ran.append(a) or (None, None))
    assert fits.fit("j", pts) is first and not ran
    fits.fit("k", pts)                          # another job: its own fit
    assert len(ran) == 1


def test_a_flipped_objective_starts_cold():
    """A job whose objective turns from falling to rising (the fit negates
    it) must not start from the falling fit's parameters."""
    c = LossCurve("linear", (0.9, 0.0, 0.5))
    down = tuple((10.0 * e, c.loss(10.0 * e)) for e in range(8))
    up = tuple((k, 2.0 - y) for k, y in down)
    fits = CurveFits()
    fits.fit("j", down)
    assert fits.fit("j", up) == _slaq_fit(up, None)[0]


def test_fits_are_bounded_and_each_policy_has_its_own(monkeypatch):
    monkeypatch.setattr(CurveFits, "MAX_JOBS", 3)
    fits = CurveFits()
    pts = _windows(LossCurve("linear", (0.9, 0.0, 0.5)), 6, 32, 0.0, seed=2)[-1]
    for j in "abcde":
        fits.fit(j, pts)
    assert list(fits._last) == ["c", "d", "e"]
    a, b = registry.make("slaq"), registry.make("slaq")
    assert a.fn.keywords["fits"] is not b.fn.keywords["fits"]
    assert all(isinstance(registry.make(n).fn.keywords["fits"], CurveFits)
               for n in ("slaq", "slaq-maxmin", "mlfs", "mlfs-c", "oasis"))
