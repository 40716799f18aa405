"""An executor's start-up yields the core to the COMPs already running.

A job that starts on a machine where other jobs run (co-location, a move,
a resumed attempt) loads its app and reads its input there: CPU work of
seconds (parsing, the app's set-up: Lasso's Lipschitz constant) that goes
through no queue. At the same priority it takes half the core from the
COMP of the job already running: on the real-core runs of
``bench/cluster_e2e.py`` an LDA job's COMPs ran at twice their CPU time for
the 12 s a Lasso job took to start beside it (README, "What holds
co-location back on real cores").

:func:`run_low` runs that work in a thread of its own at nice 19, as the
CPU queue would treat one long COMP beside short ones (a shorter COMP
goes first): it gets what the running jobs leave (their COMM time) and,
against their nice 5, a share of about 4% besides, so it is never
starved. Linux schedules threads, and a thread's nice value is its own:
the executor's other threads (its PS shard, ZeroMQ's I/O threads, the
training loop) keep theirs. An unprivileged process may lower a thread's
priority but not raise it back, hence a thread that ends with the
start-up rather than the main thread lowered and restored. This needs the
executors in their daemon's session (``daemon.py``): where the kernel
shares CPU time between sessions first (autogroup), nice values count only
within one.

A machine that joins a running job (a live resize) starts at the
executor's own priority: that job's iterations wait for it, and at nice 19
beside another job's COMPs a resize did not finish before its job did.

``HARMONY_STARTUP_NICE`` sets the nice value (0: off, the start-up at the
executor's own priority; the benches' side-by-side).
"""
from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: the start-up thread's nice value (19: the lowest priority; 0: off)
STARTUP_NICE = 19


def startup_nice() -> int:
    """The nice value for start-ups: ``HARMONY_STARTUP_NICE`` if set (0 to
    19), else :data:`STARTUP_NICE`."""
    raw = os.environ.get("HARMONY_STARTUP_NICE", "")
    try:
        value = int(raw) if raw else STARTUP_NICE
    except ValueError:
        return STARTUP_NICE
    return min(19, max(0, value))


def run_low(fn: Callable[[], T], nice: int | None = None) -> T:
    """``fn()`` in a thread at ``nice`` (default :func:`startup_nice`) and
    its result, or its exception re-raised here. The calling thread waits
    in short joins, so a signal handler of the main thread (SIGTERM) still
    runs while it waits; the thread is a daemon and does not keep a
    process that exits alive."""
    nice = startup_nice() if nice is None else nice
    if nice <= 0:
        return fn()
    box: dict[str, object] = {}

    def body() -> None:
        try:
            # this thread only (its native id); where the process may not
            # change it, the start-up runs at the process's priority
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
        except OSError:
            pass
        try:
            box["value"] = fn()
        except BaseException as exc:   # re-raised in the caller, whatever it is
            box["error"] = exc

    t = threading.Thread(target=body, name="startup", daemon=True)
    t.start()
    while t.is_alive():
        t.join(0.2)
    if "error" in box:
        raise box["error"]             # type: ignore[misc]
    return box["value"]                # type: ignore[return-value]
