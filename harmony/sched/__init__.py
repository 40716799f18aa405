"""Harmony's scheduling core (dissertation §4.3.2), pure: profiles in,
decisions out. No sockets, processes, files or clocks.

- ``model``: the performance model (Eq 4.1-4.4) and the scalar U; COMM
  time at a DoP (``t_net_at``: Decision, traffic to a machine's own server
  shard stays local, so Tnet grows with DoP; constant when remote = 0).
- ``grouping``: Algorithm 1 (``schedule``), Algorithm 2 (``assign_jobs``),
  machine allocation (``allocate_machines``).
- ``regroup``: the dynamic rules on arrival and completion, as a diff the
  master applies, and ``place`` (planned groups onto machine names).
- ``exhaustive``: the exact optimum for small instances (tests, benchmark).
"""
from harmony.sched.grouping import (Plan, PlannedGroup, allocate_machines, assign_jobs,
                                    choose_n_groups, schedule)
from harmony.sched.model import (Profile, cluster_util, group_iter_time, group_util,
                                 job_iter_time, score, t_cpu_at, t_net_at)
from harmony.sched.regroup import (Change, Current, RunningGroup, on_arrival, on_completion,
                                   place, regroup)

__all__ = ["Change", "Current", "Plan", "PlannedGroup", "Profile", "RunningGroup",
           "allocate_machines", "assign_jobs", "choose_n_groups", "cluster_util",
           "group_iter_time", "group_util", "job_iter_time", "on_arrival", "on_completion",
           "place", "regroup", "schedule", "score", "t_cpu_at", "t_net_at"]
