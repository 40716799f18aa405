"""An emulated machine's cores, shared by the CPU work of the executors on
it that run without the daemon's queues (``naive`` mode), in a dilated or
slowed-down cluster.

A real machine's OS shares its cores among the COMPs that run at once
(processor sharing). An emulated one does its CPU work at real speed and
sleeps the rest (:mod:`harmony.dilation`, ``--cpu-speed``): in queued mode
the sleep holds the machine's CPU slot (the daemon's queue grants one COMP
at a time), but unqueued executors slept side by side, so two jobs on one
emulated core each computed as if alone. In an 8-machine run at D = 8 the
naive mode's co-located epochs ran 1.26-1.33x their time alone where the
simulator (processor sharing) put them at 1.51-1.70x, and their
evaluations summed 27.6 s against 38.9 s (`bench/cluster_replay.py`).

Here each unqueued executor of the machine holds an ``flock`` on a file of
its own in a folder of the machine's state dir while it does CPU work; the
work running at once is the number of those files locked (a process that
dies releases its lock). A piece of work that needs ``target`` seconds of a
core to itself advances, while ``n`` run at once, at ``min(1, cores / n)``
of a core: it sleeps in slices of ``SLICE_S``, reading ``n`` at each. The
compute itself (the real work, 1/D of the whole) is counted at the mean
of the sharing at its start and end.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator

import psutil


class CPUShare:
    """The cores of the emulated machine whose state folder is ``folder``,
    as seen by this process (one per executor)."""

    #: the longest sleep between two readings of the work running at once
    SLICE_S = 0.005

    def __init__(self, folder: str, cores: int) -> None:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        self.folder = folder
        self.cores = max(1, int(cores))
        self._sweep()
        self.path = os.path.join(folder, str(os.getpid()))
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        self.active = False
        self._n0 = 1

    def _sweep(self) -> None:
        """Remove the files of processes that are gone (never locked now)."""
        for name in os.listdir(self.folder):
            if name.isdigit() and not psutil.pid_exists(int(name)):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(self.folder, name))

    def running(self) -> int:
        """How many pieces of CPU work run on the machine now (this one's
        included while :meth:`busy`)."""
        n = int(self.active)
        for name in os.listdir(self.folder):
            path = os.path.join(self.folder, name)
            if path == self.path:
                continue
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:
                continue            # gone meanwhile
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                n += 1              # held: that executor is computing
            except OSError:
                pass
            finally:
                os.close(fd)
        return n

    def share(self, n: int) -> float:
        """The fraction of a core each of ``n`` pieces of work gets."""
        return min(1.0, self.cores / max(1, n))

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        """This process does CPU work on the machine (a COMP, an evaluation)."""
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        self.active = True
        try:
            self._n0 = self.running()
            yield
        finally:
            self.active = False
            fcntl.flock(self.fd, fcntl.LOCK_UN)

    def stretch_to(self, elapsed: float, target: float,
                   sleep: Callable[[float], None] = time.sleep,
                   clock: Callable[[], float] = time.perf_counter) -> float:
        """Within :meth:`busy`, after a compute that lasted ``elapsed``: sleep
        until the work has had ``target`` seconds of a core to itself, the
        machine's cores shared equally among the work running on it. Returns
        the seconds slept."""
        done = elapsed * (self.share(self._n0) + self.share(self.running())) / 2
        slept = 0.0
        while done < target - 1e-9:
            s = self.share(self.running())
            t = clock()
            sleep(min(self.SLICE_S, (target - done) / s))
            dt = clock() - t
            slept += dt
            done += dt * s
        return slept

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)
        with contextlib.suppress(OSError):
            os.unlink(self.path)
