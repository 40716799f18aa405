"""The policies by name: the only list of them (``harmony-master --policy``,
``harmony sim run --policy``), and the execution modes.

Each entry is a factory of a :class:`~harmony.policies.base.Policy`
(a class, or a function of no arguments): every master core calls
:func:`make` once and keeps the object, so a policy's state lives as long
as that core. Adding a policy is one module in this package and one line
here (docs/policies.md).
"""
from __future__ import annotations

from collections.abc import Callable
from functools import partial

from harmony.policies.base import FunctionPolicy, Policy, Predict
from harmony.policies.curves import CurveFits
from harmony.policies.harmony import harmony, harmony_util, predict_jobs
from harmony.policies.mlfs import mlfs, mlfs_c
from harmony.policies.muri import muri
from harmony.policies.oasis import oasis
from harmony.policies.simple import isolated, least_loaded
from harmony.policies.slaq import slaq, slaq_maxmin
from harmony.policies.view import ClusterView, Decision

Factory = Callable[[], Policy]


def fn(name: str, f: Callable[[ClusterView], Decision], *, preempts: bool = False,
       queued: bool = False, predict: Predict | None = None) -> Factory:
    """The factory of a :class:`FunctionPolicy` (a policy that is a function)."""
    return lambda: FunctionPolicy(name, f, preempts, queued, predict)


def fitting(name: str, f: Callable[..., Decision], *, preempts: bool = False) -> Factory:
    """The factory of a policy that fits its jobs' loss curves at every
    decision (``f(view, fits=...)``): each one keeps its own
    :class:`~harmony.policies.curves.CurveFits`, so a job's fit starts where
    its previous one ended."""
    return lambda: FunctionPolicy(name, partial(f, fits=CurveFits()), preempts)


_LEAST_LOADED = fn("least-loaded", least_loaded)
_MATCH = fn("match", muri, preempts=True, queued=True)

# an alias shares its policy's factory: ``colocate`` is ``least-loaded``,
# ``muri`` is ``match`` (the Muri-style matching policy, issue #15); oasis is
# non-preemptive (start-only); mlfs moves jobs off overloaded machines and
# mlfs-c also stops jobs early (Decision.stop)
POLICIES: dict[str, Factory] = {
    "least-loaded": _LEAST_LOADED,
    "colocate": _LEAST_LOADED,
    "isolated": fn("isolated", isolated),
    "harmony": fn("harmony", harmony, preempts=True, queued=True, predict=predict_jobs),
    "harmony-util": fn("harmony-util", harmony_util, preempts=True, queued=True,
                       predict=predict_jobs),
    "match": _MATCH,
    "muri": _MATCH,
    "slaq": fitting("slaq", slaq, preempts=True),
    "slaq-maxmin": fitting("slaq-maxmin", slaq_maxmin, preempts=True),
    "oasis": fitting("oasis", oasis),
    "mlfs": fitting("mlfs", mlfs, preempts=True),
    "mlfs-c": fitting("mlfs-c", mlfs_c, preempts=True),
}

# execution modes: placement policy, and whether subtasks go through the queues
MODES = {"isolated": ("isolated", False), "naive": ("colocate", False),
         "harmony": ("harmony", True)}


def make(name: str) -> Policy:
    """A new policy object of the registered ``name`` (KeyError if none)."""
    return POLICIES[name]()
