"""The master's state machine, without I/O: ``handle(event, now) -> commands``.

:class:`MasterCore` owns everything the master decides: the job table and
each job's lifecycle and attempts, the worker table with liveness and
reconcile, the scheduler adapter (the cluster view built from state, the
policy's decisions applied, the pause-in-flight rule), the subtask
synchronizer with its ordering and priorities, epoch barriers and sums,
checkpoints, live resizes and the staged-data catalog.

It never touches a socket, a file or the wall clock. Every call gets the
time as ``now`` and returns the commands its shell carries out, in order:

- :class:`Send`: a message to one peer (``to``: its ZeroMQ identity). The
  shell encodes it (``harmony.comm.messages.encode`` checks the schema). If
  it cannot be delivered and ``fail`` is set, the shell hands ``fail`` (an
  event) back to :meth:`MasterCore.handle`.
- :class:`Persist`: a job-table write, ``getattr(JobDB, op)(*args)``.
- :class:`Admit`: a submitted job that needs a number and a strict write
  before it exists; the shell answers with :class:`Admitted` or
  :class:`AdmitFailed`.
- :class:`Record`: one line of the run record (``machines``, ``jobs``,
  ``decisions``).
- :class:`Solve`: pure work too slow for the event loop (Cruise's MILP);
  the shell answers with :class:`Solved`.

Events: :class:`Received` (a decoded message and its sender's role),
:class:`Malformed` (a message that failed to decode), :class:`Tick` (the
shell's timer: liveness checks and the scheduler run on it),
:class:`Admitted` / :class:`AdmitFailed`, :class:`Solved` and
:class:`Unreachable` (a send that failed). The real master
(:mod:`harmony.master.server`) and the simulator (:mod:`harmony.sim.engine`)
drive this same class.

The class is composed of one component per module, each a mixin that
derives only from the components it calls (bottom to top; the import
contract in ``pyproject.toml`` and ``tests/test_layers.py`` check it):

- ``protocol``: the commands and events above; ``records``: :class:`Worker`,
  :class:`Run`, :class:`Reconfig`; ``plans``: block shares (:func:`shares`,
  :func:`balance`);
- ``state``: the state, the outbox, the shared queries and the executor
  check (:func:`~harmony.master.core.state.executor_message`);
- ``views`` (what the policy sees), ``checkpoints`` (parts, replicas,
  resume points, the final model and its export), ``catalog`` (staged data);
- ``lifecycle``: launch, pause, stop early, end, retry or fail;
- ``resize``: live resizes and their plans of block moves;
- ``cruise``: Cruise inside running jobs;
- ``clients``, ``daemons`` (and liveness), ``scheduling`` (the scheduler
  adapter), ``executors`` (the executors' protocol);
- ``dispatch``: the message table (type -> handler, allowed roles);
- ``master``: :class:`MasterCore`, ``handle`` and ``recover``.
"""
from __future__ import annotations

from harmony.cruise.plan import MAX_MOVES
from harmony.master.core.clients import MAX_APP_SOURCE, MAX_STATUS_EPOCHS
from harmony.master.core.daemons import HEARTBEAT_INTERVAL, LAUNCH_GRACE, MAX_EXECUTORS
from harmony.master.core.dispatch import MESSAGES, Route
from harmony.master.core.executors import SUMMED_TIMINGS
from harmony.master.core.master import MasterCore
from harmony.master.core.plans import balance, shares
from harmony.master.core.protocol import (Admit, Admitted, AdmitFailed, Malformed, Persist,
                                          Received, Record, Send, Solve, Solved, Tick,
                                          Unreachable)
from harmony.master.core.records import Reconfig, Run, Worker
from harmony.master.core.state import KEEP_MODELS, LIVENESS_EVERY

__all__ = [
    "MasterCore", "MESSAGES", "Route",
    "Send", "Persist", "Admit", "Record", "Solve",
    "Received", "Malformed", "Tick", "Admitted", "AdmitFailed", "Solved", "Unreachable",
    "Worker", "Run", "Reconfig", "shares", "balance",
    "HEARTBEAT_INTERVAL", "LAUNCH_GRACE", "LIVENESS_EVERY", "KEEP_MODELS", "MAX_MOVES",
    "MAX_STATUS_EPOCHS", "MAX_APP_SOURCE", "MAX_EXECUTORS", "SUMMED_TIMINGS",
]
