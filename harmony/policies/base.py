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
  epoch) seconds per iteration in a group, from the jobs' profile tuples
  (as in a view) on ``machines`` machines; the master records it for the
  next epoch at every epoch report.

:class:`FunctionPolicy` adapts a plain function ``view -> Decision`` (most
policies are one).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from harmony.policies.view import ClusterView, Decision

MIN_GAIN = 0.05         # Harmony (and match): no regrouping for less than this gain in U

#: ``predict``'s type: (profiles by job, machines) -> job -> (training, epoch) s/iteration
Predict = Callable[[dict[str, tuple], int], dict[str, tuple[float, float]]]


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
    """A stateless policy made of a function ``view -> Decision``."""
    name: str
    fn: Callable[[ClusterView], Decision]
    preempts: bool = False
    queued: bool = False
    predict: Predict | None = None

    def decide(self, view: ClusterView) -> Decision:
        return self.fn(view)

