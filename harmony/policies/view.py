"""What a policy sees and what it answers: the frozen :class:`ClusterView`
(its :class:`WorkerView` and :class:`JobView` records) and the
:class:`Decision`.

The master core (``harmony.master.core``) builds a view from its state
and applies the decision; the simulator drives that same core, so a policy
sees the same views in both. Views are frozen: a policy never changes
what it is given.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from harmony.sched.model import Profile

PROFILE_SAMPLES = 3     # Harmony: epochs of profile before a job is placed by it
PROGRESS_POINTS = 32    # JobView.progress: the last this many (iterations, objective) points


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
    # its measured profile (the master's Job.sched_profile; its id is the
    # job's) once profiled, else None
    profile: Profile | None = None
    workers: tuple[str, ...] = ()                      # where it runs (active jobs)
    sched_group: str = ""                              # its scheduler group, if any
    # what the loss- and deadline-aware policies (slaq, ...) also look at
    epochs: int = 0                                    # epochs done (this attempt's)
    # epochs measured on its current machine count (a move to another count
    # starts the profile over): a job just moved is not moved again before
    # its profile there has settled (None: not known, taken as settled)
    steady: int | None = None
    # seconds per iteration it has measured lately where it runs now (its
    # whole epochs, evaluation and epoch end included, beside whatever
    # shares its machines): the median over its last epochs since its
    # machines or the jobs beside it last changed (None: too few of them)
    iter_s: float | None = None
    # epochs it may still run: its --max-epochs less those done (None: not known)
    epochs_left: int | None = None
    # (iterations done, objective) after each of its last PROGRESS_POINTS
    # epochs that reported an objective, oldest first
    progress: tuple[tuple[float, float], ...] = ()
    deadline: float | None = None      # absolute time (the view's clock), if it has one
    utility: str = ""                  # harmony.policies.curves.Utility spec, if it has one

    def __post_init__(self) -> None:
        if self.profile is not None and self.profile.id != self.id:
            raise ValueError(f"job {self.id}: its view's profile is {self.profile.id}'s")


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
    # ask the policy again at this time of the master's clock even if nothing
    # happens before (0: on the next event only)
    again_at: float = 0.0
    note: str = ""
