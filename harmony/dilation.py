"""Time dilation: a bigger cluster emulated on a small host.

With dilation D every emulated machine runs D times slower: a subtask's
wall time is D times what it took (the executor sleeps the difference while
it holds the machine's CPU or NET slot; without the queues, naive mode's
COMPs and evaluations share the machine's cores while they sleep:
:mod:`harmony.worker.cpushare`), each link's cap is divided by D,
and every interval and timeout of the control plane is D times longer. N
machines then need about N/D real cores. Seen at 1/D speed, the cluster is
the undilated one in slow motion.

Every figure the cluster reports is in undilated seconds. Two places divide
by D, and only these:

* the master's clock (:class:`Clock`): the master core sees ``now`` advance
  1/D second per wall second, so JCTs, epoch walls, profiling windows,
  checkpoint periods and every time constant of the core (heartbeat
  timeout, launch grace, the scheduler's rules) are in undilated seconds
  without a change to the core; the worker daemon's queue clock likewise;
* the executor's epoch timings (:func:`undilate_timings`) before they are
  sent: COMP, PULL, PUSH, the epoch's training and evaluation walls.

An executor's start-up (the interpreter, the app's imports, its input's
load) lasts at least D x its CPU seconds: it sleeps the difference before
it reports ready, so a start-up costs in undilated seconds about what it
costs at D = 1 (without this, 1/D of it: the dilation check's largest
error on whole runs). Its CPU and not its wall is scaled: the start-up
runs at nice 19, and its wall also holds waits for the host's cores
behind other machines' work, which a stretch of the wall would multiply.

What does not scale: the control plane's per-message costs (a subtask's
slot request to the daemon, the synchronizer's and barriers' round trips
through the master, msgpack and ZeroMQ hops) run at real speed, so at
dilation D they shrink to 1/D in undilated seconds. ``bench/dilation.py``
measures how much of an epoch they are.
"""
from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable, Mapping

#: timing keys of an executor's epoch report that are wall seconds (the rest
#: are CPU seconds, counts, bytes or ratios and are the same at any D)
WALL_TIMINGS = frozenset({"pull", "comp", "push", "sync", "stood", "train", "eval",
                          "net_wait", "stall"})
#: ... and those that are rates (bytes/s of the emulated link: x D)
RATE_TIMINGS = frozenset({"link"})


class DilationError(ValueError):
    pass


def check(value: object) -> float:
    """``value`` as a dilation factor: a finite number >= 1 (1: none)."""
    try:
        d = float(value)            # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise DilationError(f"--dilation must be a number >= 1, not {value!r}") from None
    if not math.isfinite(d) or d < 1.0:
        raise DilationError(f"--dilation must be a number >= 1, not {value!r}")
    return d


def add_argument(parser: argparse.ArgumentParser) -> None:
    """``--dilation D`` on a command line that starts (part of) a cluster."""
    def parse(text: str) -> float:
        try:
            return check(text)
        except DilationError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    parser.add_argument("--dilation", type=parse, default=1.0, metavar="D",
                        help="time dilation: emulated machines run D times slower (COMPs, "
                             "links, heartbeats and timeouts x D), so N machines need about "
                             "N/D cores; every reported time is in undilated seconds "
                             "(default 1: none)")


def wall(seconds: float, dilation: float) -> float:
    """A base interval or timeout (undilated seconds) in wall seconds."""
    return seconds * dilation


def undilated(seconds: float, dilation: float) -> float:
    """Wall seconds measured on a dilated cluster, in undilated seconds."""
    return seconds / dilation


def cpu_factor(cpu_speed: float, dilation: float) -> float:
    """How many times longer than its real compute a COMP lasts on a machine
    of speed ``cpu_speed`` at ``dilation``: the effective speed is s / D."""
    return dilation / cpu_speed


def work_seconds(elapsed: float, thread_cpu: float, process_cpu: float, cores: int) -> float:
    """What a piece of CPU work (a COMP, an evaluation) computed, in seconds
    of its emulated machine: its thread's CPU seconds, or its process's
    spread over the machine's ``cores`` where more (other threads: a numeric
    library's pool, the PS shard serving the other machines meanwhile),
    never more than it lasted. Not its wall time: where emulated machines
    share the host's cores (N machines on about N/D of them, each pinned to
    one), a thread also waits for a core another machine's work holds,
    which the machine it emulates would not, and a stretch of the wall
    multiplied that wait by D: a job's two executors on machines pinned to
    one host core computed at once and took twice their CPU (COMP wall /
    CPU 2.0-2.2 in every mode of an 8-machine D = 8 run, wherever two of a
    job's machines shared a core; 1.0-1.2 elsewhere)."""
    return min(elapsed, max(thread_cpu, process_cpu / max(1, cores)))


def link_rate(rate: float, dilation: float) -> float:
    """A link cap (bytes/s) at ``dilation``."""
    return rate / dilation


def stretch(elapsed: float, factor: float,
            sleep: Callable[[float], None] = time.sleep) -> float:
    """Sleep so that work that took ``elapsed`` seconds lasts ``factor``
    times as long; returns the seconds slept."""
    return stretch_to(elapsed, elapsed * factor, sleep)


def stretch_to(elapsed: float, target: float,
               sleep: Callable[[float], None] = time.sleep) -> float:
    """Sleep so that work that took ``elapsed`` seconds lasts ``target``
    (nothing if it already took that long); returns the seconds slept."""
    extra = target - elapsed
    if extra > 0:
        sleep(extra)
        return extra
    return 0.0


def undilate_timings(tm: Mapping[str, float], dilation: float) -> dict[str, float]:
    """An executor's epoch timings in undilated seconds (wall keys / D)."""
    if dilation == 1.0:
        return dict(tm)
    return {k: (v / dilation if k in WALL_TIMINGS else v * dilation if k in RATE_TIMINGS
                else v) for k, v in tm.items()}


class Clock:
    """A clock that runs 1/D as fast as ``base`` from ``anchor`` (default:
    now): ``now() = anchor + (base() - anchor) / D``. At D = 1 it is ``base``."""

    def __init__(self, dilation: float = 1.0, base: Callable[[], float] = time.time,
                 anchor: float | None = None) -> None:
        self.dilation = check(dilation)
        self.base = base
        self.anchor = base() if anchor is None else anchor

    def __call__(self) -> float:
        if self.dilation == 1.0:
            return self.base()
        return self.anchor + (self.base() - self.anchor) / self.dilation
