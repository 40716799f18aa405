"""OASiS (``oasis``): online admission by a primal-dual payoff under
exponential resource prices (Bao et al., INFOCOM'18).

OASiS decides on each arriving job at once: it searches the job's best
schedule (completion slot, and workers and parameter servers per time slot
on the cheapest servers) under per-server, per-slot resource prices that
grow exponentially with the resources already committed,
P(g) = L (U/L)^(g/c); it admits the job if its utility at that completion
time less the schedule's cost (its payoff) is positive, and raises the
prices of what it took. Here:

* **Time slots** of ``SLOT`` seconds, ``HORIZON`` of them from now. The
  prices of a slot come from what the view's active jobs hold in it: each
  running job keeps its machines until its estimated end
  (``harmony.policies.estimates``), and the jobs admitted earlier in the same
  decision add theirs. The policy keeps no state between decisions, so this
  projection is OASiS's committed-resources record g(t), rebuilt each time.
* **Resources**: two per machine, its CPU and its link, capacity 1 each. A
  job's demand on one of its machines is the share of the CPU and of the
  link it keeps busy (``estimates.shares``); jobs share a machine while the
  sums stay within capacity (OASiS lets several jobs' workers share a
  server within its capacity).
* **Workers and parameter servers.** OASiS decides, per slot, w workers
  and s parameter servers with s <= w and s B >= w b (PS bandwidth at least
  the workers'). This runtime co-hosts a job's worker and server roles in
  one executor per machine (every executor holds one model shard), so a
  schedule's machine count is max(w, s) = w, and s = w is the only PS
  count it can run: s <= w holds with equality, and s B >= w b becomes
  B >= b per machine, i.e. the link of every chosen machine must carry the
  shard's traffic as well as the worker's. The measured COMM share counts
  both (a machine's PULL/PUSH bytes to the other shards and their workers'
  bytes to its shard), so that constraint is the link capacity check of
  the demand above: a machine whose link share left is below the job's is
  infeasible for it. The PS count is in the decision's note (the master
  logs no record of a start-only policy's decisions).
* **Schedules are constant**: a job starts now on w machines and keeps them
  to its end (OASiS's DP may vary w per slot and start later; a change of w
  here is a live resize with block moves, and a later start is what a
  rejection already gives, since rejected jobs wait and are reconsidered at
  the next arrival or completion: REFERENCE.md's Decision). So the search is
  over w = 1 .. the job's requested machines (its N_i: the cap on its
  workers); for each, the end slot is now + its estimated run time at w,
  the machines are the w cheapest feasible ones over those slots (COST_t's
  greedy), and the payoff is f(JCT) - cost.
* **Utility**: the job's own (``JobView.utility``, a
  ``harmony.policies.curves.Utility``: ``const`` or OASiS's sigmoid
  g1 / (1 + exp(g2 (t - g3))) of the JCT). A job without one gets a
  time-sensitive sigmoid: g1 = 1, g3 = ``DEFAULT_TARGET`` x its estimated
  run time alone at its requested machines (from its arrival), g2 = 4 / g3.
* **Price bounds** (the paper's Eqs 23-26, over the jobs in view, an
  estimate "from past experience" as the paper allows): U_r = max over jobs
  of f(best JCT) / demand_r, L = min over jobs of f(JCT at the horizon) /
  (4 x work x sum_r demand_r), work in machine-slots; L is kept at least
  U / ``MAX_SPREAD`` (a sigmoid's utility at the horizon is ~0, which
  would make the prices jump from nothing to everything).
* Non-preemptive: an admitted job is never paused or moved (a start-only
  policy, in the naive mode); FIFO order of consideration, no blocking: a
  rejected job does not hold back later ones.

Pure: a :class:`ClusterView` in, a :class:`Decision` out.
"""
from __future__ import annotations

import math

import numpy as np

from harmony.policies.estimates import Estimator
from harmony.policies.view import ClusterView, Decision, JobView
from harmony.policies.curves import CurveFits, Utility

SLOT = 300.0          # s per time slot
HORIZON = 288         # slots ahead (24 h)
DEFAULT_TARGET = 2.0  # a job without a utility: its sigmoid's midpoint, x its run time alone
MAX_SPREAD = 1e4      # U / L at most
CAP = 1.0             # capacity of each resource of a machine


def utility_fn(j: JobView, est_jct: float):
    """The job's utility of its JCT (seconds)."""
    if j.utility:
        u = Utility.parse(j.utility)
        return u.value
    g3 = DEFAULT_TARGET * max(est_jct, 1.0)
    return Utility("sigmoid", (1.0, 4.0 / g3, g3)).value


class Prices:
    """Committed shares g[machine, slot, resource] and their prices."""

    def __init__(self, n: int, lo: float, hi: np.ndarray) -> None:
        self.g = np.zeros((n, HORIZON, 2))
        self.lo, self.hi = lo, hi
        self._dirty = True

    def add(self, rows: list[int], slots: int, d: tuple[float, float]) -> None:
        self.g[rows, :slots, :] += np.asarray(d)
        self._dirty = True

    def price(self) -> np.ndarray:
        """P(g) = L (U/L)^(g/c) per machine, slot and resource."""
        return self.lo * (self.hi / self.lo) ** (np.minimum(self.g, CAP) / CAP)

    def tables(self) -> tuple[np.ndarray, np.ndarray]:
        """Cumulative price per machine over slots [0, k) per resource, and
        the cumulative max of the committed shares (feasibility)."""
        if self._dirty:
            self._cum = np.cumsum(self.price(), axis=1)
            self._peak = np.maximum.accumulate(self.g, axis=1)
            self._dirty = False
        return self._cum, self._peak


def oasis(view: ClusterView, fits: CurveFits | None = None) -> Decision:
    dec = Decision()
    names = [w.name for w in view.workers]
    if not names or not view.waiting:
        return dec
    idx = {n: i for i, n in enumerate(names)}
    est = Estimator(view, fits=fits)
    now = view.now

    # the jobs' utilities, best JCTs and the price bounds U_r, L
    jobs = [j for j in view.waiting if j.machines >= 1]
    util, best = {}, {}
    for j in jobs:
        m = min(j.machines, len(names))
        run = est.remaining_s(j, m)
        best[j.id] = (now - j.submitted) + run
        util[j.id] = utility_fn(j, run)
    hi = np.full(2, 0.0)
    lo = math.inf
    for j in jobs:
        m = min(j.machines, len(names))
        d = est.shares(j, m)
        f_best = util[j.id](best[j.id])
        f_end = util[j.id](now + HORIZON * SLOT - j.submitted)
        work = m * max(1.0, est.remaining_s(j, m) / SLOT)
        for r in range(2):
            hi[r] = max(hi[r], f_best / max(d[r], 0.01))
        lo = min(lo, f_end / (4.0 * work * sum(d)))
    if not np.all(hi > 0):
        return dec
    lo = min(max(lo, float(hi.max()) / MAX_SPREAD), float(hi.min()) / math.e)
    prices = Prices(len(names), lo, hi)

    # what the active jobs hold, until their estimated ends
    count = np.zeros(len(names), dtype=int)
    for j in view.active:
        rows = [idx[n] for n in j.workers if n in idx]
        if not rows:
            continue
        m = max(1, len(j.workers))
        slots = min(HORIZON, max(1, math.ceil(est.remaining_s(j, m) / SLOT)))
        prices.add(rows, slots, est.shares(j, m))
        count[rows] += 1

    notes = []
    for j in jobs:
        if j.machines > len(names):
            continue
        cum, peak = prices.tables()
        open_ = count < view.max_jobs if view.max_jobs else np.ones(len(names), dtype=bool)
        best_plan = None
        for w in range(1, j.machines + 1):
            run = est.remaining_s(j, w)
            k = math.ceil(run / SLOT)
            if k < 1 or k > HORIZON:
                continue
            d = np.asarray(est.shares(j, w))
            fits = open_ & np.all(peak[:, k - 1, :] + d <= CAP + 1e-9, axis=1)
            if fits.sum() < w:
                continue
            cost_h = cum[:, k - 1, :] @ d
            cand = np.flatnonzero(fits)
            pick = cand[np.argsort(cost_h[cand], kind="stable")[:w]]
            payoff = util[j.id](now + run - j.submitted) - float(cost_h[pick].sum())
            if best_plan is None or payoff > best_plan[0]:
                best_plan = (payoff, w, k, sorted(pick.tolist()), tuple(d))
        if best_plan is None or best_plan[0] <= 0:
            continue                      # rejected: it waits, reconsidered later
        payoff, w, k, rows, d = best_plan
        dec.start[j.id] = [names[i] for i in rows]
        prices.add(rows, k, d)
        count[rows] += 1
        notes.append(f"{j.id}: {w} workers + {w} PS, payoff {payoff:.3g}")
    dec.note = "; ".join(notes)
    return dec
