"""Placement policies: pure functions from a cluster view to a decision.

They never touch sockets, processes or files, so the master and the
simulator call the same code. The scheduler issue adds the Harmony policy
(grouping, DoP sizing, regrouping) behind this same interface.
"""
from __future__ import annotations

from dataclasses import dataclass, field

PROFILE_SAMPLES = 3     # Harmony: epochs of profile before a job is placed by it
PROGRESS_POINTS = 32    # JobView.progress: the last this many (iterations, objective) points
MIN_GAIN = 0.05         # Harmony: no regrouping for less than this gain in U


@dataclass(frozen=True)
class WorkerView:
    name: str
    cpus: int
    memory: int
    jobs: int          # executors currently placed on it
    groups: tuple[str, ...] = ()   # explicit groups of the jobs running on it


@dataclass(frozen=True)
class JobView:
    id: str
    machines: int      # requested degree of parallelism
    submitted: float
    group: str = ""    # explicit job group: share the machines of that group
    # what the Harmony scheduler also looks at
    state: str = "waiting"      # waiting | profiled | paused | profiling | running
    # (Tcpu, Tnet, c_g, remote) once profiled; remote: seconds per iteration
    # to move all its PULL/PUSH bytes over the link (0: unknown)
    profile: tuple[float, ...] | None = None
    workers: tuple[str, ...] = ()                      # where it runs (active jobs)
    sched_group: str = ""                              # its scheduler group, if any
    # what the loss- and deadline-aware policies (slaq, ...) also look at
    epochs: int = 0                                    # epochs done (this attempt's)
    # epochs it may still run: its --max-epochs less those done (None: not known)
    epochs_left: int | None = None
    # (iterations done, objective) after each of its last PROGRESS_POINTS
    # epochs that reported an objective, oldest first
    progress: tuple[tuple[float, float], ...] = ()
    deadline: float | None = None      # absolute time (the view's clock), if it has one
    utility: str = ""                  # harmony.policies.curves.Utility spec, if it has one


@dataclass(frozen=True)
class ClusterView:
    workers: tuple[WorkerView, ...]
    waiting: tuple[JobView, ...]      # in submission order (waiting, profiled, paused)
    active: tuple[JobView, ...] = ()  # running and profiling jobs
    finished: tuple[JobView, ...] = ()  # active jobs that ended since the last decision
    max_jobs: int = 0                 # colocate: jobs per machine at most (0: no limit)
    now: float = 0.0                  # the master's clock (deadlines are on it)
    # seconds a live move (block migration) takes from the decision to its
    # end (its job stalls for part of it; decisions wait for it): the median
    # of the master's recent moves (0: none measured yet)
    move_cost: float = 0.0
    # seconds until the next job is expected: the mean gap between the last
    # submissions, or the time since the last one if longer (0: not known)
    arrival_gap: float = 0.0


@dataclass
class Decision:
    start: dict[str, list[str]] = field(default_factory=dict)   # job -> machines
    # the Harmony scheduler's further actions
    profile: dict[str, list[str]] = field(default_factory=dict)  # start profiling there
    pause: dict[str, list[str] | None] = field(default_factory=dict)  # pause (then move there)
    promote: list[str] = field(default_factory=list)   # profiled in place: keeps running
    assign: dict[str, str] = field(default_factory=dict)        # job -> scheduler group
    predicted: dict[str, float] = field(default_factory=dict)   # group -> iteration time (s)
    # job -> its own predicted iteration time (s), where the policy predicts
    # per job (the Harmony scheduler's queue replay); else the group's
    predicted_jobs: dict[str, float] = field(default_factory=dict)
    util: tuple[float, float] | None = None   # predicted cluster (CPU, net) utilization
    # end running jobs early (MLF-C's load control): job -> why. The master
    # asks the job to stop at its next epoch end; it then ends as a normal
    # stop (final checkpoint, FINISHED) with the objective it has reached
    stop: dict[str, str] = field(default_factory=dict)
    # job -> why it still waits, where the policy knows (``harmony status``)
    wait: dict[str, str] = field(default_factory=dict)
    note: str = ""


def least_loaded(view: ClusterView) -> Decision:
    """Co-location (the naive and harmony modes), FIFO without overtaking.

    A job without a group starts on the ``machines`` least-loaded live
    workers, so jobs share machines. An explicit job group is placed as a
    unit: its first job picks machines that host no other group, its later
    jobs join those machines, and a group that finds no such machines waits.
    Until the Harmony scheduler decides grouping, this is how complementary
    jobs are grouped by hand (``harmony submit --group G``).

    ``view.max_jobs`` caps the jobs a machine hosts at once: with 2, two
    jobs share the machines and the next waiting job starts as soon as one
    of them ends (no group needed).
    """
    cap = view.max_jobs
    load = {w.name: w.jobs for w in view.workers}
    order = {w.name: i for i, w in enumerate(view.workers)}
    homes: dict[str, list[str]] = {}
    for w in view.workers:
        for g in w.groups:
            homes.setdefault(g, []).append(w.name)
    dec = Decision()
    for job in view.waiting:
        room = [n for n in load if not cap or load[n] < cap]
        if job.machines > len(room):
            break
        if not job.group:
            chosen = sorted(room, key=lambda n: (load[n], order[n]))[:job.machines]
        elif job.group in homes:
            home = [n for n in homes[job.group] if n in room]
            if len(home) < job.machines:
                break
            chosen = sorted(home, key=lambda n: (load[n], order[n]))[:job.machines]
        else:
            taken = {n for ms in homes.values() for n in ms}
            free = [n for n in room if n not in taken]
            if len(free) < job.machines:
                break
            chosen = sorted(free, key=lambda n: (load[n], order[n]))[:job.machines]
            homes[job.group] = chosen
        dec.start[job.id] = chosen
        for n in chosen:
            load[n] += 1
    return dec


def isolated(view: ClusterView) -> Decision:
    """Isolated: every job on its own machines, never shared; FIFO, so jobs
    run one after another when machines are short (like Optimus or SLAQ)."""
    free = [w.name for w in view.workers if w.jobs == 0]
    dec = Decision()
    for job in view.waiting:
        if job.machines > len(free):
            break
        dec.start[job.id], free = free[:job.machines], free[job.machines:]
    return dec


def _harmony_util(view: ClusterView) -> Decision:
    from harmony.master.harmony_policy import harmony_util
    return harmony_util(view)


def _harmony(view: ClusterView) -> Decision:
    from harmony.master.harmony_policy import harmony
    return harmony(view)


# A policy with ``preempts = True`` gets its whole Decision applied by the
# master (start, profile, pause, move, promote) and is not called while a
# pause or a resize is in flight; the others (start-only) only start waiting
# jobs. ``queued = True``: its default execution mode is ``harmony`` (the
# subtask queues), e.g. for ``harmony sim run --policy NAME``.
_harmony.preempts = _harmony_util.preempts = True     # type: ignore[attr-defined]
_harmony.queued = _harmony_util.queued = True         # type: ignore[attr-defined]


def _predict_jobs(profiles: dict[str, tuple], machines: int) -> dict[str, tuple[float, float]]:
    from harmony.master.harmony_policy import predict_jobs
    return predict_jobs(profiles, machines)


# ``predict``: the policy's model of each job's (training, epoch) seconds per
# iteration in a group, from the jobs' profile tuples (as in a view) on
# ``machines`` machines; the master records it for the next epoch at every
# epoch report
_harmony.predict = _harmony_util.predict = _predict_jobs   # type: ignore[attr-defined]


def _muri(view: ClusterView) -> Decision:
    from harmony.master.muri_policy import muri
    return muri(view)


_muri.preempts = True         # type: ignore[attr-defined]
_muri.queued = True           # type: ignore[attr-defined]


def _slaq(view: ClusterView) -> Decision:
    from harmony.master.slaq_policy import slaq
    return slaq(view)


def _slaq_maxmin(view: ClusterView) -> Decision:
    from harmony.master.slaq_policy import slaq_maxmin
    return slaq_maxmin(view)


_slaq.preempts = _slaq_maxmin.preempts = True     # type: ignore[attr-defined]


def _oasis(view: ClusterView) -> Decision:
    from harmony.master.oasis_policy import oasis
    return oasis(view)


def _mlfs(view: ClusterView) -> Decision:
    from harmony.master.mlfs_policy import mlfs
    return mlfs(view)


def _mlfs_c(view: ClusterView) -> Decision:
    from harmony.master.mlfs_policy import mlfs_c
    return mlfs_c(view)


# oasis is non-preemptive (start-only); mlfs moves jobs off overloaded
# machines and mlfs-c also stops jobs early (Decision.stop)
_mlfs.preempts = _mlfs_c.preempts = True          # type: ignore[attr-defined]

# ``match`` is the Muri-style matching policy's name (issue #15), ``muri``
# an alias of it
POLICIES = {"least-loaded": least_loaded, "colocate": least_loaded, "isolated": isolated,
            "harmony": _harmony, "harmony-util": _harmony_util, "match": _muri,
            "muri": _muri, "slaq": _slaq, "slaq-maxmin": _slaq_maxmin, "oasis": _oasis,
            "mlfs": _mlfs, "mlfs-c": _mlfs_c}
# execution modes: placement policy, and whether subtasks go through the queues
MODES = {"isolated": ("isolated", False), "naive": ("colocate", False),
         "harmony": ("harmony", True)}
