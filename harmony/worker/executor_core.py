"""The executor's core: what an executor does at an epoch boundary, pure.

At the end of each epoch every executor sends ``epoch_done`` and waits for
the master's ``epoch_sums``: the job's summed objective and what happens
next. :func:`handle` turns that answer into the executor's commands, in
order; the process executor (``harmony/worker/executor/training.py``) and
the simulator's (``harmony/sim/executor.py``) both drive it, each doing
the commands its own way (a checkpoint part written and replicated, or its
seconds simulated).

The commands of one boundary: :class:`SetPrio` (the job's subtask
priorities, when the answer has them), :class:`Report` (the epoch's
metrics: to the master from executor 0, in every executor's log), then one
of :class:`FinalCheckpoint` (the stop epoch: the final checkpoint's part,
then ``exec_finished``), :class:`Pause` (a checkpoint part, ``exec_paused``
and exit), or an optional :class:`Checkpoint` (a periodic part, skipped on
failure) followed by :class:`Reconfigure` (a live resize: ``at_boundary``
and the moves; the next epoch in the new layout) or :class:`Continue` (the
next epoch).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Union


@dataclass(frozen=True)
class EpochSums:
    """The event: the master's ``epoch_sums`` ``answer`` after ``epoch``, at
    executor ``index``; ``stop``: the executor's own stop rule said stop
    (the app's, or the simulated job's last epoch)."""
    epoch: int
    index: int
    stop: bool
    answer: Mapping[str, Any]


@dataclass(frozen=True)
class SetPrio:
    """The expected seconds of the job's COMP and network subtasks, which
    its syncs carry from now on."""
    cpu: float
    net: float


@dataclass(frozen=True)
class Report:
    """The epoch's metrics: ``epoch_report`` to the master when
    ``to_master`` (executor 0), and the executor's log."""
    epoch: int
    stop: bool
    to_master: bool


@dataclass(frozen=True)
class FinalCheckpoint:
    """The stop epoch: write the part of the final checkpoint (``ckpt_final``),
    then finish (``exec_finished``)."""
    epoch: int


@dataclass(frozen=True)
class Pause:
    """Write a checkpoint part, report ``exec_paused`` and exit."""
    epoch: int


@dataclass(frozen=True)
class Checkpoint:
    """A periodic checkpoint part (``ckpt_part``; one that cannot be written
    or replicated is skipped and the job goes on)."""
    epoch: int


@dataclass(frozen=True)
class Reconfigure:
    """A live resize at this boundary (``at_boundary``, the block moves),
    then the next epoch in the new layout."""
    epoch: int


@dataclass(frozen=True)
class Continue:
    """On with the next epoch."""
    epoch: int


Command = Union[SetPrio, Report, FinalCheckpoint, Pause, Checkpoint, Reconfigure, Continue]


def handle(ev: EpochSums) -> list[Command]:
    """The commands of one epoch boundary, in the order to do them."""
    a = ev.answer
    out: list[Command] = []
    pr = a.get("prio")
    if isinstance(pr, list) and len(pr) == 2 and all(isinstance(x, (int, float)) for x in pr):
        out.append(SetPrio(float(pr[0]), float(pr[1])))
    # the executor's own stop rule, or the scheduler ends the job early
    stop = ev.stop or bool(a.get("stop"))
    out.append(Report(ev.epoch, stop, ev.index == 0))
    if stop:
        out.append(FinalCheckpoint(ev.epoch))
        return out
    if a.get("pause"):
        out.append(Pause(ev.epoch))
        return out
    if a.get("checkpoint"):
        out.append(Checkpoint(ev.epoch))
    out.append(Reconfigure(ev.epoch) if a.get("reconfig") else Continue(ev.epoch + 1))
    return out
