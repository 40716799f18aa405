"""MLFS (``mlfs``, ``mlfs-c``): ML-feature-based priorities, placement by
distance to an ideal utilization vector, and load control (Wang, Liu, Shen,
CoNEXT'20). The heuristic MLF-H and its load control MLF-C; the RL variant
(MLF-RL) is not built (REFERENCE.md: underspecified).

* **Priority** (MLF-H, Eqs 2-6) of a job in the queue:
  P = a P_ML + (1 - a) P_C, a = ``ALPHA`` (0.3).
  P_ML = urgency x (1/I) x dl_(I-1) / sum_j dl_j x partition share, with I
  the job's current epoch (its objective is reported per epoch, so an
  epoch is the paper's iteration), dl_j the objective's drop in epoch j
  (sign-normalized: a log-likelihood that grows is negated), urgency 1 (no
  job states one) and partition share 1 (a job is placed as a gang of all
  its executors, one model shard each, so its tasks' priorities add up to
  the job's; for the same reason the children term gamma x sum of
  children's priorities is a constant factor per job, which normalization
  removes). I = 1 (nothing measured yet) gives 0 (REFERENCE.md's Decision).
  P_C = g_d / (deadline - now) + g_r / remaining + g_w x waiting time, with
  g_d = g_r = 0.3, g_w = 0.35; no deadline: 0; a passed deadline: as if 1 s
  away; remaining: ``harmony.policies.estimates`` (its fitted loss curve, or
  a default). **Normalization** (REFERENCE.md's Decision): P_ML and P_C are
  each min-max normalized to [0, 1] across the jobs prioritized together
  (all equal: 0). Our choice beyond it: P_C's three parts are normalized
  the same way before they are weighted, as their units differ (1/s, 1/s,
  s) and the waiting seconds would otherwise make P_C plain FIFO.
* **Placement**: jobs by descending priority, each on the ``machines`` it
  asked for (one executor per machine, all at once; a job that does not
  fit waits, and lower-priority jobs may still go: MLF-H picks tasks until
  no server is underloaded). A machine's utilization vector is the sum of
  its jobs' CPU and link shares (``estimates.shares``); the ideal virtual
  host is (min CPU, min link) over the underloaded machines (the paper's
  communication term is 0 for a job none of whose tasks is placed yet, and
  the movement-degradation term's ideal is 0); the job goes to the
  machines closest to it (Euclidean) that stay under ``OVERLOAD`` (90%) on
  every resource with the job on them. The rule is on what co-located jobs
  add up to: an empty machine always takes a job, and a machine with one
  job is never overloaded (a CPU-bound job alone keeps its CPU busier than
  90%). A job alone keeps its machines' CPU or link busy all the time here
  (its two shares add up to 1), so two jobs on one machine always add up
  to more than 90% on one resource: in this runtime MLF-H never co-locates
  and places each job on machines of its own, by priority, with backfilling.
* **Overloaded machines** (a measured profile pushed a machine over 90%):
  among the lowest-priority ``MIGRATE_SHARE`` (10%, at least one) of its
  jobs, the one closest to the ideal virtual task (max share on the
  overloaded resources, min on the others) leaves, until it is not
  overloaded; it is re-placed with the queue (a move: a live resize), or
  goes back to the queue (a pause) if nothing takes it.
* **MLF-C load control** (``mlfs-c`` only): when the cluster is overloaded
  (a job is left waiting after placement), running jobs whose fitted curve
  has less than ``STOP_GAIN`` of its reducible loss left are stopped early
  (``Decision.stop``: the master ends the job at its next epoch end, with
  its final checkpoint, as the app's own stop would). This is the paper's
  switch from option i) (run the iterations asked for) to option ii)
  (OptStop: stop when the accuracy is close to its maximum); every job is
  taken to permit it, as the runtime has no per-job opt-out. When the
  cluster is not overloaded, jobs run to their own stop rule.

Pure: a :class:`ClusterView` in, a :class:`Decision` out.
"""
from __future__ import annotations

import math

from harmony.policies.curves import CurveFits
from harmony.policies.estimates import Estimator
from harmony.policies.view import ClusterView, Decision, JobView

ALPHA = 0.3           # weight of P_ML
GAMMA_D = 0.3         # P_C: deadline
GAMMA_R = 0.3         # P_C: remaining time
GAMMA_W = 0.35        # P_C: waiting time
OVERLOAD = 0.9        # a resource over this share of its capacity is overloaded
MIGRATE_SHARE = 0.1   # the lowest-priority share of a machine's jobs that may move out
STOP_GAIN = 0.10      # MLF-C: a job with less reducible loss left than this may stop early


def _norm(xs: dict[str, float]) -> dict[str, float]:
    """Min-max normalization to [0, 1] (all equal: 0)."""
    if not xs:
        return {}
    lo, hi = min(xs.values()), max(xs.values())
    if hi - lo <= 1e-12 * max(1.0, abs(hi)):
        return {k: 0.0 for k in xs}
    return {k: (v - lo) / (hi - lo) for k, v in xs.items()}


def ml_term(j: JobView) -> float:
    """Eq 2 with urgency and partition share 1: (1/I) dl_(I-1) / sum dl."""
    pts = j.progress
    if len(pts) < 2:
        return 0.0                        # I = 1: no loss reduction measured yet
    ys = [y for _, y in pts]
    if ys[-1] > ys[0]:
        ys = [-y for y in ys]
    drops = [ys[i - 1] - ys[i] for i in range(1, len(ys))]
    total = sum(drops)
    if total <= 0:
        return 0.0
    epoch = max(j.epochs, len(pts)) + 1   # the epoch it is in: I
    return (1.0 / epoch) * max(0.0, drops[-1]) / total


def priorities(jobs: list[JobView], view: ClusterView, est: Estimator,
               waiting: set[str]) -> dict[str, float]:
    """P = ALPHA P_ML + (1 - ALPHA) P_C, each part normalized across ``jobs``;
    ``waiting``: the jobs whose waiting time counts (the queue's)."""
    now = view.now
    ml = _norm({j.id: ml_term(j) for j in jobs})
    dl = _norm({j.id: (1.0 / max(1.0, j.deadline - now) if j.deadline is not None else 0.0)
                for j in jobs})
    rem = _norm({j.id: 1.0 / max(1.0, est.remaining_s(j, max(1, len(j.workers) or j.machines)))
                 for j in jobs})
    wait = _norm({j.id: (now - j.submitted if j.id in waiting else 0.0) for j in jobs})
    pc = _norm({j.id: GAMMA_D * dl[j.id] + GAMMA_R * rem[j.id] + GAMMA_W * wait[j.id]
                for j in jobs})
    return {j.id: ALPHA * ml[j.id] + (1 - ALPHA) * pc[j.id] for j in jobs}


def _mlfs(view: ClusterView, control: bool, fits: CurveFits | None = None) -> Decision:
    dec = Decision()
    names = [w.name for w in view.workers]
    if not names:
        return dec
    # a job with no loss curve (its objective a straight line) gets no fit:
    # the defaults, at once (issue #32: mlfs-c spent 95% of its time there)
    est = Estimator(view, fit_lines=False, fits=fits)
    running = [j for j in view.active if j.state in ("running", "profiling")]
    queue_ids = {j.id for j in view.waiting}
    prio = priorities(list(view.waiting) + running, view, est, queue_ids)

    # utilization vectors and job counts from what runs now
    use = {n: [0.0, 0.0] for n in names}
    jobs_on: dict[str, list[JobView]] = {n: [] for n in names}
    for j in running:
        d = est.shares(j, max(1, len(j.workers)))
        for n in j.workers:
            if n in use:
                use[n][0] += d[0]
                use[n][1] += d[1]
                jobs_on[n].append(j)

    def over(n: str) -> list[int]:
        # a job alone may keep its CPU or link busier than 90% (a CPU-bound
        # one): the rule is on what co-located jobs add up to
        if len(jobs_on[n]) < 2:
            return []
        return [r for r in (0, 1) if use[n][r] > OVERLOAD + 1e-9]

    # overloaded machines: move their low-priority jobs out (virtually, to the queue)
    moved: list[JobView] = []
    for n in names:
        while over(n) and jobs_on[n]:
            res = over(n)
            cands = sorted(jobs_on[n], key=lambda j: (prio[j.id], -j.submitted))
            cands = cands[:max(1, math.ceil(MIGRATE_SHARE * len(cands)))]
            ds = {j.id: est.shares(j, max(1, len(j.workers))) for j in jobs_on[n]}
            ideal = [max(d[r] for d in ds.values()) if r in res else min(d[r] for d in ds.values())
                     for r in (0, 1)]
            j = min(cands, key=lambda j: (math.dist(ds[j.id], ideal), prio[j.id]))
            for m in j.workers:
                if m in use:
                    use[m][0] -= ds[j.id][0]
                    use[m][1] -= ds[j.id][1]
                    jobs_on[m] = [x for x in jobs_on[m] if x.id != j.id]
            moved.append(j)

    # placement by priority: the machines closest to the ideal host
    queue = sorted(list(view.waiting) + moved,
                   key=lambda j: (-prio[j.id], j.submitted, j.id))
    left: list[JobView] = []
    notes = []
    for j in queue:
        m = j.machines
        d = est.shares(j, m)
        under = [n for n in names if not over(n) and
                 (not view.max_jobs or len(jobs_on[n]) < view.max_jobs)]
        if not under or m > len(names):
            left.append(j)
            continue
        ideal = (min(use[n][0] for n in under), min(use[n][1] for n in under))
        fit = [n for n in under if not jobs_on[n] or (use[n][0] + d[0] <= OVERLOAD + 1e-9
                                                      and use[n][1] + d[1] <= OVERLOAD + 1e-9)]
        if len(fit) < m:
            left.append(j)
            continue
        fit.sort(key=lambda n: (math.dist(use[n], ideal), n))
        chosen = sorted(fit[:m])
        for n in chosen:
            use[n][0] += d[0]
            use[n][1] += d[1]
            jobs_on[n].append(j)
        if j.id in queue_ids:
            dec.start[j.id] = chosen
        elif chosen != sorted(j.workers):
            dec.pause[j.id] = chosen
            notes.append(f"{j.id} moves off an overloaded machine")
        dec.assign[j.id] = f"f:{j.id}"
    for j in left:
        if j.id not in queue_ids:
            dec.pause[j.id] = None
            notes.append(f"{j.id} leaves an overloaded machine for the queue")

    # MLF-C: an overloaded cluster stops low-gain jobs early
    if control and any(j.id in queue_ids for j in left):
        for j in running:
            if j.id in dec.pause or j.state != "running":
                continue
            g = est.gain_left(j)
            if g is not None and g < STOP_GAIN:
                dec.stop[j.id] = f"overloaded cluster; {100 * g:.1f}% of its loss reduction left"
        if dec.stop:
            notes.append(f"stops {', '.join(sorted(dec.stop))} early")
    dec.note = "; ".join(notes)
    return dec


def mlfs(view: ClusterView, fits: CurveFits | None = None) -> Decision:
    """MLF-H: priorities, placement, overload handling."""
    return _mlfs(view, control=False, fits=fits)


def mlfs_c(view: ClusterView, fits: CurveFits | None = None) -> Decision:
    """MLF-H with MLF-C's load control (early stops when overloaded)."""
    return _mlfs(view, control=True, fits=fits)
