"""What the policies see: the :class:`~harmony.policies.view.ClusterView`
built from the core's state (machines, waiting and active jobs with their
profiles and progress, completions, move cost, arrival gap), and what comes
back besides the decision itself: the groups' predictions and the run
record's decision and prediction lines."""
from __future__ import annotations

import math
import statistics
from typing import Any

from harmony.master.core.records import Worker
from harmony.master.core.state import CoreState, log
from harmony.master.jobs import Job, JobState
from harmony.policies import view as P


class Views(CoreState):
    def _job_view(self, j: Job, **kw: Any) -> P.JobView:
        """What every policy sees of a job: its request, state, profile, where
        it runs, its progress (iterations done, objective) after its last
        ``P.PROGRESS_POINTS`` epochs, and its deadline and utility if any."""
        # the points are summed up incrementally: a view is built on every
        # scheduling pass, and a job's epochs list only grows (a launch
        # replaces it); the cache holds the list it summed, so a new list
        # starts over
        epochs = j.epochs
        c = self._progress.get(j.id)
        if c is None or c[0] is not epochs or c[1] > len(epochs):
            c = [epochs, 0, 0.0, []]
            self._progress[j.id] = c
        _, seen, done, progress = c
        for e in epochs[seen:] if seen else epochs:
            done += float((e.get("timings") or {}).get("iters") or 1.0)
            obj = (e.get("metrics") or {}).get("objective")
            if isinstance(obj, (int, float)) and math.isfinite(obj):
                progress.append((done, float(obj)))
        if len(progress) > 2 * P.PROGRESS_POINTS:
            del progress[:-P.PROGRESS_POINTS]
        c[1], c[2] = len(epochs), done
        return P.JobView(j.id, j.machines, j.submitted, j.group, state=j.state.value,
                         workers=tuple(j.workers), sched_group=j.sched_group,
                         epochs=len(epochs), epochs_left=j.epochs_left(),
                         steady=_steady(j),
                         iter_s=_iter_s(j, self._placed_at.get(j.id, 0.0)),
                         progress=tuple(progress[-P.PROGRESS_POINTS:]),
                         deadline=j.deadline, utility=j.utility, **kw)

    def _view(self, live: list[Worker], waiting: list[Job]) -> P.ClusterView:
        placed = self._placed()
        active = sorted(self._active(), key=lambda j: (j.submitted, j.id))
        # a machine's view is rebuilt only when it changed (views are frozen,
        # so the last one is reused: on a large cluster most machines keep theirs)
        cache = self._worker_views
        workers = []
        for w in sorted(live, key=lambda w: w.name):
            here = placed.get(w.name)
            n, groups = (len(here), tuple(sorted({j.group for j in here if j.group}))) \
                if here else (0, ())
            v = cache.get(w.name)
            if v is None or v.jobs != n or v.groups != groups or v.cpus != w.cpus \
                    or v.memory != w.memory:
                v = cache[w.name] = P.WorkerView(w.name, w.cpus, w.memory, n, groups)
            workers.append(v)
        return P.ClusterView(
            workers=tuple(workers),
            waiting=tuple(self._job_view(j, profile=j.sched_profile()) for j in waiting),
            active=tuple(self._job_view(
                j, profile=j.sched_profile(P.PROFILE_SAMPLES if j.state ==
                                           JobState.PROFILING else 1)) for j in active),
            finished=tuple(self._ended), max_jobs=self.max_jobs, now=self.now,
            move_cost=statistics.median(self._move_took) if self._move_took else 0.0,
            arrival_gap=self._arrival_gap())

    def _arrival_gap(self) -> float:
        """Seconds until the next job is expected: the mean gap between the
        recent submissions, or the time since the last one if that is longer
        (0: fewer than two submissions seen)."""
        a = self._arrivals
        if len(a) < 2:
            return 0.0
        return max((a[-1] - a[0]) / (len(a) - 1), self.now - a[-1])

    def _predict_next(self, job: Job) -> None:
        """Record the policy's prediction of ``job``'s next epoch (seconds per
        iteration: training, and the whole epoch over its iterations) from the
        profiles as they are now, beside the jobs that share its machines;
        none while one of them has no profile yet."""
        predict = self.policy.predict
        if predict is None:
            return
        mine = set(job.workers)
        mates = [j for j in self._active() if j is job or not mine.isdisjoint(j.workers)]
        profiles = {j.id: j.sched_profile() for j in mates}
        if any(p is None for p in profiles.values()):
            return
        try:
            pred = predict(profiles, len(job.workers)).get(job.id)
        except Exception:       # a model bug must not stop the master
            log.exception("predicting %s's next epoch failed", job.id)
            return
        if pred:
            self._record("predictions", {"t": self.now, "job": job.id,
                                         "epoch": job.epochs[-1]["epoch"] + 1,
                                         "jobs": sorted(profiles), "predicted": pred[0],
                                         "predicted_epoch": pred[1]})

    def _log_decision(self, dec: P.Decision) -> None:
        self._last_predicted = dict(dec.predicted)
        self.decisions += 1
        self._record("decisions", {
            "t": self.now, "note": dec.note, "util": dec.util, "profile": dec.profile,
            "start": dec.start, "pause": dec.pause, "promote": dec.promote,
            "assign": dec.assign, "predicted": dec.predicted,
            **({"predicted_jobs": dec.predicted_jobs} if dec.predicted_jobs else {}),
            **({"stop": dec.stop} if dec.stop else {})})

    def _set_predictions(self, dec: P.Decision) -> None:
        for jid, g in dec.assign.items():
            self.jobs[jid].sched_group = g
        if dec.predicted:
            for job in self._open_jobs():
                if job.sched_group in dec.predicted:
                    job.predicted = dec.predicted_jobs.get(job.id,
                                                           dec.predicted[job.sched_group])


#: intervals between epoch ends that JobView.iter_s needs (at least) and
#: takes (the latest, at most)
ITER_S_MIN, ITER_S_MAX = 3, 5


def _iter_s(j: Job, since: float = 0.0) -> float | None:
    """Seconds per iteration the job measured where it runs now: the median
    of the intervals between its epochs' ends, each over its iterations,
    among the epochs that ended after ``since`` (when its machines or the
    jobs beside them last changed: the first such epoch, whose interval
    spans the change, is only a starting point), the latest
    ``ITER_S_MAX``; None with fewer than ``ITER_S_MIN`` intervals. An epoch
    without an iteration count counts the profile's."""
    last: list[tuple[float, float]] = []
    default = float(j.profile.get("iters") or 1.0) if j.profile else 1.0
    for e in reversed(j.epochs):
        t = e.get("time")
        if not isinstance(t, (int, float)) or t < since:
            break
        iters = (e.get("timings") or {}).get("iters")
        last.append((float(t), float(iters) if isinstance(iters, (int, float)) and iters > 0
                     else default))
        if len(last) > ITER_S_MAX:
            break
    xs = [(tb - ta) / max(1.0, n) for (tb, n), (ta, _) in zip(last, last[1:]) if tb > ta]
    return statistics.median(xs) if len(xs) >= ITER_S_MIN else None


def _steady(j: Job) -> int:
    """Epochs measured on the job's current machine count: its profile's
    samples, or 0 just after a move to another count (the profile restarts
    only at the first epoch reported there; a decision between the move's
    commit and that report saw the old width's samples and widened MLR
    again at once: 2 -> 1 -> 2 machines within 9 s)."""
    p = j.profile or {}
    if not p or int(p.get("machines", 0)) != len(j.workers):
        return 0
    return int(p.get("samples", 0))
