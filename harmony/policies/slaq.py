"""SLAQ (``slaq``): quality-driven allocation by predicted loss reduction.

SLAQ (SoCC'17) fits each job's loss curve from its recent objective values
(recent points weighted more), predicts how much each job's loss would drop
with one more unit of resource, and hands the units out greedily (a heap of
marginal gains). Here:

* **Unit of allocation: a machine.** SLAQ allocates cores; in this runtime
  a job's DoP is its number of machines (one worker and one server shard on
  each, using all its cores), so the unit is a whole machine and machines
  are never shared between jobs (SLAQ is an isolated scheduler). A job gets
  at most the machines it asked for (its requested DoP is its cap).
* **Loss curve**: ``harmony.policies.curves.slaq_fit`` (``fit_curve``) on the
  job's (iterations done, objective) points, both of SLAQ's forms (sublinear
  1/(a k^2 + b k + c) + d and linear mu^(k-b) + c), the one with the smaller
  weighted residual chosen per job. An objective that grows (e.g. a
  log-likelihood) is negated first. Fewer than ``MIN_POINTS`` points or no
  profile: the job is new and ranks first for its first machine (a new job's
  normalized loss reduction is 1 by SLAQ's definition), and gets no more.
* **Iteration time as a function of allocation**: the Harmony model
  (``harmony.sched.model.job_iter_time``: COMP / m, COMM with the remote
  share (m-1)/m) on the job's measured profile.
* **Predicted gain** of m machines: the fitted loss drop over the next
  ``HORIZON`` seconds, f(k) - f(k + HORIZON / t_iter(m)), normalized by the
  job's reducible loss in view, max(objective) - fitted floor. Decision:
  SLAQ divides by the largest per-iteration drop seen; our points are per
  epoch of varying length, so we divide by what the job could still lose as
  of its oldest point in view, which also puts every job on [0, 1].
* **Greedy**: one machine per job by descending gain of that machine
  (jobs beyond capacity wait: the lowest gains), then each further machine
  to the job with the largest marginal gain (heap) until the machines run
  out or no gain is left. A running job's gains up to its current machines
  count ``STICKY`` more (a resize costs a block migration; without it
  allocations flap between decisions).
* ``slaq-maxmin``: the max-min variant; the next machine goes to the job
  with the largest predicted normalized loss at the horizon with what it
  has (REFERENCE.md's Decision: the largest loss, not the smallest).
* **Applying**: a running job keeps its machines if its count is unchanged,
  shrinks to a prefix of them or grows onto free machines (a live resize),
  and pauses at 0; a waiting job starts on free machines.

Pure: a :class:`ClusterView` in, a :class:`Decision` out (the fits are
memoized on their inputs).
"""
from __future__ import annotations

import heapq

from harmony.policies.view import ClusterView, Decision, JobView
from harmony.policies.curves import CurveFits, slaq_fit
from harmony.sched.model import job_iter_time

HORIZON = 600.0     # s: the gain of an allocation is the loss drop over this time
MIN_POINTS = 3      # objective points before a curve is fitted
STICKY = 0.10       # a running job's gains up to its current machines weigh this much more
NEW = 1.0           # a new job's gain for its first machine (the normalized maximum)


class _Job:
    """A job's predicted normalized loss reduction as a function of machines."""

    def __init__(self, j: JobView, cap: int, fits: CurveFits | None = None) -> None:
        self.view, self.cap = j, cap
        self.fit = None
        if j.profile is not None and len(j.progress) >= MIN_POINTS:
            self.fit = fits.fit(j.id, j.progress) if fits is not None else slaq_fit(j.progress)
        self.prof = j.profile if self.fit is not None else None
        self.memo: dict[int, float] = {0: 0.0}

    @property
    def new(self) -> bool:
        return self.fit is None

    def gain(self, m: int) -> float:
        g = self.memo.get(m)
        if g is None:
            if self.fit is None:
                g = NEW if m >= 1 else 0.0
            else:
                curve, _, norm = self.fit
                k = self.view.progress[-1][0]
                t = job_iter_time(self.prof, m)
                ahead = HORIZON / t if t > 0 else 1e12
                g = (curve.loss(k) - curve.loss(k + ahead)) / norm if norm else 0.0
                g = max(0.0, g)
            self.memo[m] = g
        return g

    def loss(self) -> float:
        """Its current normalized loss (the max-min variant's key)."""
        if self.fit is None:
            return 1.0
        curve, _, norm = self.fit
        return (curve.loss(self.view.progress[-1][0]) - curve.floor) / norm if norm else 0.0


def _allocate(jobs: list[_Job], machines: int, maxmin: bool) -> dict[str, int]:
    alloc = {x.view.id: 0 for x in jobs}
    cur = {x.view.id: len(x.view.workers) for x in jobs}

    def marginal(x: _Job, m: int) -> float:
        g = x.gain(m + 1) - x.gain(m)
        return g * (1 + STICKY) if m + 1 <= cur[x.view.id] else g

    # one machine each, best first; ties: running jobs, then FIFO
    order = sorted(range(len(jobs)), key=lambda i: (
        -(jobs[i].loss() if maxmin else marginal(jobs[i], 0)),
        not jobs[i].view.workers, jobs[i].view.submitted, jobs[i].view.id))
    left = machines
    for i in order:
        if left <= 0:
            break
        alloc[jobs[i].view.id] = 1
        left -= 1
    heap = []
    for i, x in enumerate(jobs):
        if alloc[x.view.id] == 1 and x.cap > 1 and not x.new:
            key = x.loss() - x.gain(1) if maxmin else marginal(x, 1)
            heap.append((-key, i))
    heapq.heapify(heap)
    while left > 0 and heap:
        negkey, i = heapq.heappop(heap)
        x = jobs[i]
        m = alloc[x.view.id]
        if marginal(x, m) <= 1e-12:
            continue                  # no gain from more machines
        alloc[x.view.id] = m + 1
        left -= 1
        if m + 1 < x.cap:
            key = x.loss() - x.gain(m + 1) if maxmin else marginal(x, m + 1)
            heapq.heappush(heap, (-key, i))
    return alloc


def _slaq(view: ClusterView, maxmin: bool, fits: CurveFits | None = None) -> Decision:
    dec = Decision()
    live = [w.name for w in view.workers]
    if not live:
        return dec
    alive = set(live)
    running = [j for j in view.active if j.state in ("running", "profiling")]
    jobs = [_Job(j, min(j.machines, len(live)), fits) for j in running + list(view.waiting)]
    alloc = _allocate(jobs, len(live), maxmin)
    # machines kept by running jobs, then free ones for growth and starts
    keep: dict[str, list[str]] = {}
    for j in running:
        ms = [m for m in j.workers if m in alive]
        keep[j.id] = ms[:alloc[j.id]]
    used = {m for ms in keep.values() for m in ms}
    held = {m for j in running for m in j.workers}
    # machines still held by a job that shrinks or pauses go last (they free
    # up at its next epoch end)
    free = [m for m in live if m not in held] + [m for m in live if m in held and m not in used]
    for j in running:
        n = alloc[j.id]
        if n == 0:
            dec.pause[j.id] = None
            continue
        ms = keep[j.id]
        if len(ms) < n:
            ms, free = ms + free[:n - len(ms)], free[n - len(ms):]
        if ms != list(j.workers):
            dec.pause[j.id] = ms
        if j.state == "profiling":
            dec.promote.append(j.id)
        dec.assign[j.id] = f"s:{j.id}"
    for j in view.waiting:
        n = alloc.get(j.id, 0)
        if n and n <= len(free):
            dec.start[j.id], free = free[:n], free[n:]
            dec.assign[j.id] = f"s:{j.id}"
    if dec.start or dec.pause:
        dec.note = "machines " + ", ".join(f"{x.view.id}:{alloc[x.view.id]}" for x in jobs
                                           if alloc[x.view.id])
    return dec


def slaq(view: ClusterView, fits: CurveFits | None = None) -> Decision:
    return _slaq(view, maxmin=False, fits=fits)


def slaq_maxmin(view: ClusterView, fits: CurveFits | None = None) -> Decision:
    return _slaq(view, maxmin=True, fits=fits)
