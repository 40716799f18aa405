"""Loss curves and utilities of completion time: what the loss- and
deadline-aware policies (SLAQ, OASiS, MLF-H) and the simulator's traces
share.

* :class:`LossCurve`: the loss after k iterations, ``KIND:PARAMS``:

  - ``sublinear:a,b,c,d``  ``1/(a k^2 + b k + c) + d`` (SLAQ's model for
    sublinear optimizers: SGD, Gibbs sampling); a, b >= 0, c > 0
  - ``linear:mu,b,c``      ``mu^(k - b) + c`` (SLAQ's linear / superlinear
    model), 0 < mu < 1
  - ``points:k:l,k:l,...`` measured (iteration, loss) points, k strictly
    increasing; linear in between, the last value after the last point

* :func:`fit_curve` fits the first two kinds to measured points, recent
  points weighted more, as SLAQ does; :func:`slaq_fit` is SLAQ's choice of
  the better of the two on a job's (iterations, objective) points.
* :class:`Utility`: a job's utility of its completion time (a constant, or
  OASiS's sigmoid ``g1/(1+exp(g2(t-g3)))`` of the JCT t).

Pure: no sockets, files or processes (the master and the simulator both
use them; the simulator's trace columns ``curve`` and ``utility`` are these
specs, :mod:`harmony.sim.trace`).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache


def num_spec(x: float | int) -> str:
    """``x`` as text that parses back to the same number (ints and whole
    floats without a fraction)."""
    if isinstance(x, int) and not isinstance(x, bool):
        return str(x)
    x = float(x)
    return str(int(x)) if x.is_integer() and abs(x) < 1e15 else repr(x)


# ---------------------------------------------------------------- loss curves

CURVE_KINDS = ("sublinear", "linear", "points")


@dataclass(frozen=True)
class LossCurve:
    """The loss after k iterations (see the module docstring)."""
    kind: str
    params: tuple[float, ...]

    def __post_init__(self) -> None:
        p = self.params
        if self.kind not in CURVE_KINDS:
            raise ValueError(f"unknown curve kind {self.kind!r} (one of {', '.join(CURVE_KINDS)})")
        if not all(math.isfinite(x) for x in p):
            raise ValueError("curve parameters must be finite")
        if self.kind == "sublinear":
            if len(p) != 4:
                raise ValueError("sublinear takes 4 parameters a,b,c,d")
            if p[0] < 0 or p[1] < 0 or p[2] <= 0:
                raise ValueError("sublinear needs a >= 0, b >= 0, c > 0")
        elif self.kind == "linear":
            if len(p) != 3:
                raise ValueError("linear takes 3 parameters mu,b,c")
            if not 0 < p[0] < 1:
                raise ValueError("linear needs 0 < mu < 1")
        else:
            if len(p) < 2 or len(p) % 2:
                raise ValueError("points takes k:loss pairs")
            ks = p[0::2]
            if ks[0] < 0 or any(b <= a for a, b in zip(ks, ks[1:])):
                raise ValueError("points: k must be >= 0 and strictly increasing")

    @classmethod
    def parse(cls, spec: str) -> LossCurve:
        """From ``KIND:PARAMS`` (raises ValueError)."""
        kind, sep, rest = spec.strip().partition(":")
        if not sep:
            raise ValueError(f"curve {spec!r} is not KIND:PARAMS")
        kind = kind.strip()
        try:
            if kind == "points":
                vals: list[float] = []
                for pair in rest.split(","):
                    k, sep2, v = pair.partition(":")
                    if not sep2:
                        raise ValueError(f"points: {pair!r} is not k:loss")
                    vals += [float(k), float(v)]
            else:
                vals = [float(x) for x in rest.split(",")]
        except ValueError as exc:
            raise ValueError(f"curve {spec!r}: {exc}") from None
        return cls(kind, tuple(vals))

    def spec(self) -> str:
        """The ``KIND:PARAMS`` form (exact: floats as repr)."""
        if self.kind == "points":
            body = ",".join(f"{num_spec(k)}:{num_spec(v)}" for k, v in zip(self.params[0::2],
                                                                   self.params[1::2]))
        else:
            body = ",".join(num_spec(x) for x in self.params)
        return f"{self.kind}:{body}"

    def loss(self, k: float) -> float:
        """The loss after ``k`` iterations."""
        p = self.params
        if self.kind == "sublinear":
            a, b, c, d = p
            return 1.0 / (a * k * k + b * k + c) + d
        if self.kind == "linear":
            mu, b, c = p
            return mu ** (k - b) + c
        ks, ls = p[0::2], p[1::2]
        if k <= ks[0]:
            return ls[0]
        for i in range(1, len(ks)):
            if k <= ks[i]:
                f = (k - ks[i - 1]) / (ks[i] - ks[i - 1])
                return ls[i - 1] + f * (ls[i] - ls[i - 1])
        return ls[-1]

    @property
    def floor(self) -> float:
        """The loss the curve tends to (its last point for ``points``)."""
        if self.kind == "sublinear":
            a, b, _, d = self.params
            return d if (a > 0 or b > 0) else self.loss(0)
        if self.kind == "linear":
            return self.params[2]
        return self.params[-1]

    def iterations_to(self, target: float) -> int | None:
        """The fewest whole iterations k >= 0 with ``loss(k) <= target``;
        None if the curve never gets there."""
        if self.loss(0) <= target:
            return 0
        p = self.params
        if self.kind == "sublinear":
            a, b, c, d = p
            if target <= d or (a == 0 and b == 0):
                return None
            need = 1.0 / (target - d)          # a k^2 + b k + c >= need
            if a > 0:
                k = (-b + math.sqrt(b * b + 4 * a * (need - c))) / (2 * a)
            else:
                k = (need - c) / b
        elif self.kind == "linear":
            mu, b, c = p
            if target <= c:
                return None
            k = b + math.log(target - c) / math.log(mu)
        else:
            ks = p[0::2]
            k = None
            for i in range(1, len(ks)):   # first segment that reaches the target
                lo, hi = ks[i - 1], ks[i]
                if self.loss(hi) <= target:
                    while hi - lo > 1e-9 * max(1.0, hi):
                        mid = (lo + hi) / 2
                        lo, hi = (lo, mid) if self.loss(mid) <= target else (mid, hi)
                    k = hi
                    break
            if k is None:
                return None
        n = max(0, math.ceil(k - 1e-9))
        while self.loss(n) > target:          # rounding at the boundary
            n += 1
        while n > 0 and self.loss(n - 1) <= target:
            n -= 1
        return n

    def scaled(self, factor: float) -> LossCurve:
        """The same curve stretched ``factor`` times along k: new.loss(k) ==
        self.loss(k / factor) (e.g. a curve per epoch to one per iteration
        with factor = iterations per epoch)."""
        if factor <= 0:
            raise ValueError("factor must be > 0")
        p = self.params
        if self.kind == "sublinear":
            a, b, c, d = p
            return LossCurve("sublinear", (a / factor ** 2, b / factor, c, d))
        if self.kind == "linear":
            mu, b, c = p
            return LossCurve("linear", (mu ** (1.0 / factor), b * factor, c))
        return LossCurve("points", tuple(x * factor if i % 2 == 0 else x
                                         for i, x in enumerate(p)))


def _refine(res, jac, x0, lb, ub):
    """Least squares of ``res`` from ``x0`` within [lb, ub]: first without
    the bounds by Levenberg-Marquardt (MINPACK's lmder through the thin
    ``leastsq``: about 10x faster than the bounded trust region, whose
    every step is Python), kept when it converges inside them (a minimum
    of the bounded problem then); else the bounded trust region, as before.
    Returns (x, converged, sum of squares)."""
    import numpy as np
    from scipy.optimize import least_squares, leastsq

    # a start on a bound (the grid's NNLS leaves a coefficient at 0): just inside it
    with np.errstate(invalid="ignore"):
        start = np.where(x0 > lb, x0, lb + 1e-6 * np.maximum(1.0, np.abs(lb)))
    if np.all(start > lb) and np.all(start < ub):
        with np.errstate(all="ignore"):
            try:
                x, _, info, _, ier = leastsq(res, start, Dfun=jac, full_output=True,
                                             maxfev=0 if MAX_NFEV is None else MAX_NFEV)
            except (TypeError, ValueError, FloatingPointError):     # fewer points than
                ier = 0                                              # parameters, a bad x0
        if 1 <= ier <= 4 and np.all(np.isfinite(info["fvec"])) \
                and np.all(x > lb) and np.all(x < ub):
            return x, True, float(np.sum(info["fvec"] ** 2))
    sol = least_squares(res, np.clip(x0, lb, ub), jac=jac, bounds=(lb, ub),
                        max_nfev=MAX_NFEV)
    return sol.x, bool(sol.success), float(np.sum(sol.fun ** 2))


def fit_curve(ks: Sequence[float], losses: Sequence[float], kind: str = "sublinear",
              decay: float = 0.9, start: LossCurve | None = None) -> LossCurve:
    """Fit SLAQ's ``sublinear`` or ``linear`` model to measured (k, loss)
    points by weighted least squares; the point i of n weighs
    ``decay**(n-1-i)`` (recent points count more, as in SLAQ). ``points``
    returns the points themselves. ``start``: a fit of the same kind to
    nearly the same points (the job's previous ones): the least squares
    start there instead of at the grid's or the heuristic's guess, and the
    cold fit runs only if it does not converge (:class:`CurveFits`)."""
    import numpy as np
    from scipy.optimize import least_squares, nnls

    k = np.asarray(ks, dtype=float)
    y = np.asarray(losses, dtype=float)
    if len(k) != len(y) or len(k) < 2:
        raise ValueError("need at least 2 points, as many k as losses")
    if kind == "points":
        return LossCurve("points", tuple(float(v) for pair in zip(k, y) for v in pair))
    w = np.sqrt(decay ** np.arange(len(k) - 1, -1, -1))
    span = max(float(y.max() - y.min()), 1e-12)
    if start is not None and start.kind != kind:
        start = None
    if kind == "sublinear":
        if start is not None:
            warm = _sublinear(k, y, w, np.array(start.params, dtype=float), None)
            if warm is not None:
                return warm
        best = None
        # for a fixed floor d, 1/(y-d) = a k^2 + b k + c is linear in (a,b,c)
        # (non-negative least squares); the floor by a grid, then refined
        A = np.stack([k * k, k, np.ones_like(k)], axis=1)
        Aw = A * w[:, None]
        for frac in np.geomspace(1e-4, 10, 40):
            d = float(y.min() - frac * span)
            coef, _ = nnls(Aw, w / (y - d))
            coef[2] = max(coef[2], 1e-12)
            r = float(np.sum((w * (1 / (A @ coef) + d - y)) ** 2))
            if best is None or r < best[0]:
                best = (r, (*coef, d))
        return _sublinear(k, y, w, np.array(best[1], dtype=float), best[0])
    if kind == "linear":
        if start is not None:
            mu0, b0, c0 = start.params
        else:
            c0 = float(y.min() - 0.05 * span)
            mu0 = min(0.99, max(0.01, float(((y[-1] - c0) / (y[0] - c0))
                                            ** (1 / max(k[-1] - k[0], 1)))))
            b0 = float(k[0] - math.log(max(y[0] - c0, 1e-12)) / math.log(mu0))

        def res(z):
            mu, b, c = z
            return w * (mu ** (k - b) + c - y)

        def jac(z):
            mu, b, _ = z
            p = mu ** (k - b)
            return np.stack([w * (k - b) * p / mu, -w * p * math.log(mu), w], axis=1)
        x, ok, _ = _refine(res, jac, np.array([mu0, b0, c0]),
                           np.array([1e-9, -np.inf, -np.inf]), np.array([1 - 1e-9, np.inf, np.inf]))
        if start is not None and not ok:
            return fit_curve(ks, losses, kind, decay)
        mu, b, c = (float(v) for v in x)
        return LossCurve("linear", (mu, b, c))
    raise ValueError(f"cannot fit a {kind!r} curve (sublinear, linear or points)")


def _sublinear(k, y, w, x0, floor: float | None) -> LossCurve | None:
    """The sublinear model's least squares from ``x0`` = (a, b, c, d). A
    cold start (``floor``: the grid's residual) keeps ``x0`` unless the
    refinement converges below it; a warm one (``floor`` None) is None
    unless it converges."""
    import numpy as np

    scale = np.maximum(np.abs(x0), 1e-12)
    kk = k * k

    def res(z):
        a, b, c, d = z * scale
        return w * (1.0 / (a * kk + b * k + c) + d - y)

    def jac(z):         # exact: the finite differences cost 4 more calls a step
        a, b, c, _ = z * scale
        g = -w / (a * kk + b * k + c) ** 2
        return np.stack([g * kk * scale[0], g * k * scale[1], g * scale[2],
                         w * scale[3]], axis=1)
    lb = np.array([0.0, 0.0, 1e-12 / scale[2], -np.inf])
    x, ok, cost = _refine(res, jac, x0 / scale, lb, np.full(4, np.inf))
    if floor is None:
        if not ok or not math.isfinite(cost):
            return None
        z = x * scale
    else:
        z = x * scale if ok and cost <= floor else x0
    a, b, c, d = (float(v) for v in z)
    return LossCurve("sublinear", (max(a, 0.0), max(b, 0.0), max(c, 1e-12), d))


# ---------------------------------------------------------------- utility

@dataclass(frozen=True)
class Utility:
    """A job's utility of its completion time: ``const`` (one parameter, the
    value whatever the JCT) or ``sigmoid`` (g1, g2, g3: OASiS's
    g1 / (1 + exp(g2 (t - g3))) of the JCT t)."""
    kind: str
    params: tuple[float, ...]

    def __post_init__(self) -> None:
        n = {"const": 1, "sigmoid": 3}.get(self.kind)
        if n is None:
            raise ValueError(f"unknown utility kind {self.kind!r} (a number or sigmoid:g1,g2,g3)")
        if len(self.params) != n or not all(math.isfinite(x) for x in self.params):
            raise ValueError(f"{self.kind} utility takes {n} finite parameter(s)")

    @classmethod
    def parse(cls, spec: str) -> Utility:
        s = spec.strip()
        kind, sep, rest = s.partition(":")
        try:
            if not sep:
                return cls("const", (float(s),))
            return cls(kind.strip(), tuple(float(x) for x in rest.split(",")))
        except ValueError as exc:
            raise ValueError(f"utility {spec!r}: {exc}") from None

    def spec(self) -> str:
        if self.kind == "const":
            return num_spec(self.params[0])
        return f"{self.kind}:" + ",".join(num_spec(x) for x in self.params)

    def value(self, jct: float) -> float:
        if self.kind == "const":
            return self.params[0]
        g1, g2, g3 = self.params
        z = g2 * (jct - g3)
        return 0.0 if z > 700 else g1 / (1.0 + math.exp(z))


# ---------------------------------------------------------------- SLAQ's fit

#: least_squares' function evaluations per model in ``fit_curve`` (None:
#: scipy's default, 100 per parameter: 400 and 300). A real loss curve
#: converges in well under 100 (measured: at most ~70); points that are not
#: one run to the limit. Kept at scipy's default: a cap of 100 changed
#: slaq's decisions on the golden trace (its fits of curve-less simulated
#: jobs), and mlfs, whose fits ground, now asks ``straight_line`` first.
MAX_NFEV: int | None = None


def straight_line(points: Sequence[tuple[float, float]]) -> bool:
    """Three or more (k, loss) points on a straight line (least squares, to
    within 1e-6 of their span), not flat: an objective that falls by the
    same amount every epoch (e.g. a simulated job without a loss curve
    reports the epochs left). Neither of SLAQ's models fits it (their
    floors run off to minus infinity): it is no loss curve."""
    if len(points) < 3:
        return False
    ks = [float(k) for k, _ in points]
    ys = [float(y) for _, y in points]
    span = max(ys) - min(ys)
    if span <= 1e-12 * max(1.0, abs(ys[0])):
        return False
    n = len(ks)
    mk, my = sum(ks) / n, sum(ys) / n
    sxx = sum((k - mk) ** 2 for k in ks)
    if sxx <= 0:
        return False
    slope = sum((k - mk) * (y - my) for k, y in zip(ks, ys)) / sxx
    return max(abs(y - (my + slope * (k - mk))) for k, y in zip(ks, ys)) <= 1e-6 * span


@lru_cache(maxsize=8192)
def slaq_fit(points: tuple[tuple[float, float], ...]
             ) -> tuple[LossCurve, float, float | None] | None:
    """SLAQ's fit of a job's (iterations done, objective) points: the better
    of the two fits (weighted residual), its sign (-1: the objective grows and
    was negated) and the normalizer; None when the points cannot be fitted.
    Memoized on the points (the policies call it on every decision).
    Each model's least squares stops at ``MAX_NFEV`` evaluations (scipy's
    default): points that are no loss curve (noise, a straight line) run to
    that limit; a caller that wants no fit for a straight line asks
    :func:`straight_line` first (``estimates.Estimator``). A policy that
    fits the same jobs decision after decision uses :class:`CurveFits`."""
    return _slaq_fit(points, None)[0]


Fit = tuple[LossCurve, float, "float | None"]


def _slaq_fit(points: tuple[tuple[float, float], ...], starts: dict | None
              ) -> tuple[Fit | None, dict | None]:
    """:func:`slaq_fit`, each model started from ``starts`` (its sign and a
    curve per kind, from the job's previous fit) where given; also returns
    those of this fit."""
    import numpy as np

    ks = [k for k, _ in points]
    ys = [y for _, y in points]
    sign = -1.0 if ys[-1] > ys[0] else 1.0
    ys = [sign * y for y in ys]
    if max(ys) - min(ys) <= 1e-12 * max(1.0, abs(ys[0])):
        return None, None
    if starts is not None and starts["sign"] != sign:
        starts = None
    w = 0.9 ** np.arange(len(ks) - 1, -1, -1)
    best = None
    curves: dict = {"sign": sign}
    for kind in ("sublinear", "linear"):
        try:
            c = fit_curve(ks, ys, kind, start=starts.get(kind) if starts else None)
        except Exception:       # noqa: BLE001 - a failed fit is no fit
            continue
        curves[kind] = c
        r = float(np.sum(w * (np.array([c.loss(k) for k in ks]) - ys) ** 2))
        if math.isfinite(r) and (best is None or r < best[0]):
            best = (r, c)
    if best is None:
        return None, None
    curve = best[1]
    norm = max(ys) - min(curve.floor, min(ys))
    return (curve, sign, norm if norm > 0 else None), curves


class CurveFits:
    """A policy's :func:`slaq_fit` of its jobs over a run. A job's points
    change a little between decisions (one epoch more, the oldest out of
    the window), so each fit starts where the job's previous one ended:
    the least squares converge in a few steps, and the grid of floors
    (the cold start) runs only for a job's first fit or when the warm one
    does not converge. On the ``short`` trace this is most of what slaq,
    mlfs and oasis cost (``bench/sim_paper.py --speed --short``). A warm
    fit may end in another local minimum than a cold one of the same
    points: a run's fits depend on its history (deterministically).
    Holds the latest ``MAX_JOBS`` jobs."""

    MAX_JOBS = 4096

    def __init__(self) -> None:
        from collections import OrderedDict
        self._last: OrderedDict[str, tuple[tuple, Fit | None, dict | None]] = OrderedDict()

    def fit(self, job: str, points: tuple[tuple[float, float], ...]) -> Fit | None:
        last = self._last.get(job)
        if last is not None and last[0] == points:
            self._last.move_to_end(job)
            return last[1]
        out, curves = _slaq_fit(points, last[2] if last is not None else None)
        self._last[job] = (points, out, curves if curves is not None else
                           (last[2] if last is not None else None))
        self._last.move_to_end(job)
        if len(self._last) > self.MAX_JOBS:
            self._last.popitem(last=False)
        return out
