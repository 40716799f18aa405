"""The one interface of a scheduling policy, and helpers to write one.

A policy is an object with

* ``name``: the name it is registered under (``harmony.policies.registry``);
* ``preempts``: True if the master applies its whole :class:`Decision`
  (start, profile, pause, move, promote, stop) and does not call it while
  a pause or a resize is in flight; False for a start-only policy (the
  master only starts the waiting jobs it names in ``Decision.start``);
* ``queued``: True if its default execution mode is ``harmony`` (the
  subtask queues), e.g. for ``harmony sim run --policy NAME``;
* ``decide(view) -> Decision``: the decision for a
  :class:`~harmony.policies.view.ClusterView`. Pure with respect to the
  world: no sockets, processes, files or clocks (the view's ``now`` is the
  clock). The object may keep state between calls (the registry makes a
  fresh one for each master core, so each run has its own);
* ``predict``: None, or the policy's model of each job's (training,
  epoch) seconds per iteration in a group, from the jobs' profiles (by
  job, as in a view) on ``machines`` machines; the master records it for the
  next epoch at every epoch report.

:class:`FunctionPolicy` adapts a plain function ``view -> Decision`` (most
policies are one); :func:`decision_from_target` turns the allocation a
policy wants (job -> machines) into the decision that gets there.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from harmony.policies.view import ClusterView, Decision
from harmony.sched.model import Profile

MIN_GAIN = 0.05         # Harmony (and match): no regrouping for less than this gain in U

#: ``predict``'s type: (profiles by job, machines) -> job -> (training, epoch) s/iteration
Predict = Callable[[dict[str, Profile], int], dict[str, tuple[float, float]]]


@runtime_checkable
class Policy(Protocol):
    """What the master core and the simulator call (see the module docstring)."""
    name: str
    preempts: bool
    queued: bool
    predict: Predict | None

    def decide(self, view: ClusterView) -> Decision:
        ...


@dataclass(frozen=True)
class FunctionPolicy:
    """A policy made of a function ``view -> Decision`` (its state, if any, bound
    into the function: ``registry.fitting``)."""
    name: str
    fn: Callable[[ClusterView], Decision]
    preempts: bool = False
    queued: bool = False
    predict: Predict | None = None

    def decide(self, view: ClusterView) -> Decision:
        return self.fn(view)


def decision_from_target(view: ClusterView, target: Mapping[str, Sequence[str]], *,
                         group: Callable[[str], str] | None = None,
                         note: str = "") -> Decision:
    """The :class:`Decision` that takes the cluster from what runs in
    ``view`` to ``target``: job id -> the machines it should run on (a job
    absent from ``target``, or with no machines, gets none). Per job:

    * a running or profiling job on exactly those machines (same order)
      keeps running; a profiling one is promoted (its profile so far is
      kept, it runs on as placed);
    * on other machines: it moves there (``pause`` with a destination: the
      master resizes it live, or pauses it and resumes it there);
    * with none: it is paused (checkpointed at its next epoch end);
    * a waiting (or paused, profiled) job with machines starts there.

    ``group(job)``, if given, names each placed job's scheduler group
    (``Decision.assign``). Moves and pauses are applied only for a policy
    with ``preempts = True``; a start-only policy should give running jobs
    their machines. Raises ValueError for a job that is neither waiting nor
    active in the view, a machine that is not a live worker of the view, or
    a machine named twice for one job.
    """
    live = {w.name for w in view.workers}
    known = {j.id for j in view.active} | {j.id for j in view.waiting}
    for jid, ms in target.items():
        if jid not in known:
            raise ValueError(f"{jid!r} is neither waiting nor active in the view")
        bad = [m for m in ms if m not in live]
        if bad:
            raise ValueError(f"{jid!r}: {bad[0]!r} is not a live worker of the view")
        if len(set(ms)) != len(ms):
            raise ValueError(f"{jid!r}: a machine is named twice")
    dec = Decision(note=note)
    for j in view.active:
        if j.state not in ("running", "profiling"):
            continue
        ms = list(target.get(j.id, ()))
        if not ms:
            dec.pause[j.id] = None
            continue
        if ms != list(j.workers):
            dec.pause[j.id] = ms
        if j.state == "profiling":
            dec.promote.append(j.id)
        if group is not None:
            dec.assign[j.id] = group(j.id)
    for j in view.waiting:
        ms = list(target.get(j.id, ()))
        if ms:
            dec.start[j.id] = ms
            if group is not None:
                dec.assign[j.id] = group(j.id)
    return dec
