"""What the deadline- and utility-aware policies (``oasis``, ``mlfs``)
estimate about a job from a :class:`ClusterView`: its per-machine resource
demand and its remaining run time. Pure functions.

Neither OASiS nor MLFS can be run without a job's remaining work, which
their papers take as given (OASiS: epochs x mini-batches x time per
mini-batch; MLFS: a sampled or historical running time). This runtime is
told none of it at submission (a job stops by its app's own rule), so:

* **Demand** of a job on one of its ``m`` machines: the share of the
  machine's CPU and of its link the job keeps busy running alone,
  ``(Tcpu(m), Tnet(m)) / (Tcpu(m) + Tnet(m))`` from its measured profile
  (``harmony.sched.model``). A job without a measured profile is taken to
  fill its machines (``UNKNOWN_SHARES``: 1 and 1), so it shares a machine
  with nobody until it has been measured (a first version gave it the
  median demand, which paired unknown jobs blindly: OASiS lost 1.5x of
  isolated's mean JCT to the naive mode's contention).
  Shares on a machine add up: two jobs fit on it while each sum stays
  under the policy's capacity (OASiS 1, MLFS 0.9).
* **Remaining iterations**: SLAQ's loss-curve fit on the job's (iterations,
  objective) points (``harmony.policies.curves.slaq_fit``), run until the
  fitted curve has made ``CONVERGED`` of its reducible loss (max objective
  in view less the fitted floor); the same rule the paper workload's jobs
  stop by (``harmony.sim.workload.CONVERGED``), which is an assumption
  about the jobs, not knowledge of them.
* **Remaining seconds** at ``m`` machines: those iterations times the
  Harmony model's iteration time at ``m``; without a fit (a new job, or too
  few points), ``DEFAULT_RUN_S`` at its requested machines, scaled to ``m``
  by the same model (its profile, else the median one).
"""
from __future__ import annotations

import statistics

from harmony.policies.view import ClusterView, JobView
from harmony.policies.curves import CurveFits, slaq_fit, straight_line
from harmony.sched.model import Profile, job_iter_time, t_cpu_at, t_net_at

#: a job's share of a machine's (CPU, link) without a profile of its own
UNKNOWN_SHARES = (1.0, 1.0)
#: ... and of a profile with no time in it
DEFAULT_SHARES = (0.5, 0.5)
#: remaining seconds of a job without a fitted loss curve, at its requested
#: DoP (the paper workload's median run alone; an estimate from experience)
DEFAULT_RUN_S = 2400.0
#: a job is done when its fitted curve has made this share of its reducible loss
CONVERGED = 0.95
#: objective points before a curve is fitted (as SLAQ)
MIN_POINTS = 3


def profile_of(j: JobView) -> Profile | None:
    p = j.profile
    return p if p is not None and p.t_cpu + p.t_net > 0 else None


def shares(p: Profile, m: int) -> tuple[float, float]:
    """(CPU share, link share) of one of its ``m`` machines that ``p`` keeps busy."""
    c, n = t_cpu_at(p, m), t_net_at(p, m)
    t = c + n
    return (c / t, n / t) if t > 0 else DEFAULT_SHARES


class Estimator:
    """Demand and remaining-time estimates for the jobs of one view."""

    def __init__(self, view: ClusterView, fit_lines: bool = True,
                 fits: CurveFits | None = None) -> None:
        # fit_lines False: a job whose objective falls on a straight line has
        # no loss curve: no fit (the defaults), not a fit ground out of it
        self.fit_lines = fit_lines
        self.fits = fits        # the policy's fits of earlier decisions (warm starts)
        self.profiles = {j.id: p for j in view.active + view.waiting
                         if (p := profile_of(j)) is not None}
        known = list(self.profiles.values())
        self.median: Profile | None = None
        if known:
            # the median job: median COMP and COMM at DoP 1, no remote share
            self.median = Profile("median", statistics.median(t_cpu_at(p, 1) for p in known),
                                  statistics.median(t_net_at(p, 1) for p in known), 1, 0.0)
        self._iters: dict[str, float | None] = {}

    def _fit(self, j: JobView):
        if not self.fit_lines and straight_line(j.progress):
            return None
        return self.fits.fit(j.id, j.progress) if self.fits is not None else \
            slaq_fit(j.progress)

    def profile(self, j: JobView) -> Profile | None:
        return self.profiles.get(j.id, self.median)

    def shares(self, j: JobView, m: int) -> tuple[float, float]:
        p = self.profiles.get(j.id)
        return shares(p, m) if p is not None else UNKNOWN_SHARES

    def remaining_iters(self, j: JobView) -> float | None:
        """Iterations left by its fitted loss curve (None: no fit)."""
        if j.id in self._iters:
            return self._iters[j.id]
        out = None
        if j.id in self.profiles and len(j.progress) >= MIN_POINTS:
            fit = self._fit(j)
            if fit is not None:
                curve, _, norm = fit
                k = j.progress[-1][0]
                end = curve.iterations_to(curve.floor + (1 - CONVERGED) * norm)
                step = k - j.progress[-2][0] if len(j.progress) > 1 else 1.0
                # at least one more epoch: it is still running
                out = max(float(step), (end if end is not None else 10 * k) - k)
        self._iters[j.id] = out
        return out

    def remaining_s(self, j: JobView, m: int) -> float:
        """Seconds left at ``m`` machines."""
        p = self.profiles.get(j.id)
        it = self.remaining_iters(j)
        if p is not None and it is not None:
            return it * job_iter_time(p, m)
        q = p or self.median
        if q is None:
            return DEFAULT_RUN_S * j.machines / max(1, m)
        return DEFAULT_RUN_S * job_iter_time(q, m) / job_iter_time(q, max(1, j.machines))

    def gain_left(self, j: JobView) -> float | None:
        """The share of its reducible loss its fitted curve has still to make
        (0: converged, 1: nothing made yet); None without a fit."""
        if len(j.progress) < MIN_POINTS:
            return None
        fit = self._fit(j)
        if fit is None:
            return None
        curve, _, norm = fit
        return max(0.0, (curve.loss(j.progress[-1][0]) - curve.floor) / norm) if norm else 0.0
