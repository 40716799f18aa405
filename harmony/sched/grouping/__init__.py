"""Grouping jobs and sizing groups: Algorithms 1 and 2 of §4.3.2.

``schedule`` (Algorithm 1) grows the set of jobs to run, taken in the given
order, while the cluster utilization U improves; for each candidate set it
picks the number of groups that balances CPU and network at equal DoP,
assigns jobs to groups (``assign_jobs``, Algorithm 2) and sizes the groups
(``allocate_machines``). The internals work on numpy arrays of
(work = Tcpu * c_g, base, remote) so that thousands of jobs schedule in well
under a second; the public helpers take and return ``Profile`` objects.

Decision (a deviation from the paper, see ``model``): a job's COMM time on m
machines is Tnet(m) = base + remote * (1 - 1/m), not a constant, because the
traffic to a machine's own server shard does not cross the network. Every
step below judges COMM at the DoP it assumes or allocates: Algorithm 1's n_G
at DoP M / n_G, Algorithm 2 at that DoP, the machine allocation at each
group's current m, the refinements at the split they evaluate. ``remote`` is
None throughout when every job has remote = 0 (the paper's model, and the
fast paths: results are then exactly those of the constant-Tnet code).

The steps, one module each, depending one way only (base <- evaluate <-
refine <- reshape <- search; assign and allocate beside them): ``base``
(the plan types, the array view of profiles, the constants), ``evaluate``
(a group's value), ``assign`` (Algorithm 2), ``allocate`` (machines per
group), ``refine`` (best re-splits of pairs of groups), ``reshape``
(re-splits, merges and splits with remote COMM), ``search`` (Algorithm 1
and ``schedule``).
"""
from __future__ import annotations

from harmony.sched.grouping.allocate import allocate_machines
from harmony.sched.grouping.assign import assign_jobs
from harmony.sched.grouping.base import Plan, PlannedGroup
from harmony.sched.grouping.search import choose_n_groups, schedule

__all__ = ["Plan", "PlannedGroup", "allocate_machines", "assign_jobs", "choose_n_groups",
           "schedule"]
