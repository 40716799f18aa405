"""A simulated machine: its CPU, link and serving side shared by the
subtasks that run there (processor sharing, rates recomputed on every
change), and, in the harmony mode, the worker daemon's own subtask queues
(:class:`harmony.worker.daemon_core.DaemonCore`) whose actions it carries
out. Without the queues (the isolated and naive modes) subtasks share the
machine under the contention model (:class:`harmony.sim.engine.Contention`).
"""
from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Any, Callable

from harmony.worker.daemon_core import DaemonCore, Deliver
from harmony.subtasks.queues import Grant, Resume, Stop

if TYPE_CHECKING:
    from harmony.sim.engine import Simulator
    from harmony.sim.executor import _Exec

INF = float("inf")


class _Res:
    """One resource of one machine (its CPU or its link): the subtasks
    using it progress at rates that depend on who else runs (processor
    sharing), recomputed on every change."""
    __slots__ = ("sim", "kind", "machine", "running", "last", "version", "busy_since", "due",
                 "busy", "use")

    def __init__(self, sim: "Simulator", kind: str, machine: "_Machine") -> None:
        self.sim, self.kind, self.machine = sim, kind, machine
        # where its busy time goes: the engine's utilization buckets
        # (Util.add on the CPU's or the link's list; None for "up")
        self.busy = None if kind == "up" else sim.util.add
        self.use = sim.util.cpu if kind == "cpu" else sim.util.net
        self.running: dict[Any, list] = {}     # key -> [remaining, rate, callback]
        self.last = 0.0
        self.version = 0
        self.due = INF          # when the one valid pending event fires (INF: none)
        self.busy_since: float | None = None

    def _advance(self, now: float) -> None:
        dt = now - self.last
        if dt > 0:
            for r in self.running.values():
                if r[1] > 0:
                    break
            else:
                self.last = now
                return
            for r in self.running.values():
                r[0] -= dt * r[1]
            if self.busy is not None:       # (the serving side is counted by its readers)
                self.busy(self.use, self.last, now)
        self.last = now

    def start(self, key: Any, work: float, done: Callable[[], None], now: float) -> None:
        if now != self.last:
            self._advance(now)
        self.running[key] = [max(0.0, work), 0.0, done]
        self._reschedule(now)

    def drop(self, key: Any, now: float) -> None:
        if now != self.last:
            self._advance(now)
        if self.running.pop(key, None) is not None:
            self._reschedule(now)

    def set_rates(self, now: float) -> None:
        if now != self.last:
            self._advance(now)
        self._reschedule(now)

    def _reschedule(self, now: float) -> None:
        """Recompute the rates and the next completion. The pending event
        stays valid when the next completion did not move (a subtask that
        joins at rate 0, a rate change elsewhere): half of the events at
        1,000 machines were such stale wake-ups."""
        nxt = INF
        if self.running:
            self.machine.rates(self)
            for r in self.running.values():
                rate = r[1]
                if rate > 0:
                    t = now + r[0] / rate
                    if t < nxt:
                        nxt = t
        if nxt == self.due:
            return
        self.version += 1
        self.due = nxt
        if nxt < INF:
            sim = self.sim
            heapq.heappush(sim._q, (nxt, next(sim._n), self._fire, (self.version,)))

    def _fire(self, version: int) -> None:
        if version != self.version:
            return
        self.due = INF
        now = self.sim.now
        self._advance(now)
        running = self.running
        # done: no work left to speak of, or so little that the clock cannot
        # tell its end from now (past 2**24 s, 1e-9 s is below a double's
        # resolution: the same event fired at the same instant forever)
        cbs = []
        for k, r in running.items():
            rate = r[1]
            if rate > 0 and (r[0] <= 1e-9 or now + r[0] / rate <= now):
                cbs.append(k)
        for i, k in enumerate(cbs):
            cbs[i] = running.pop(k)[2]
        self._reschedule(now)
        for cb in cbs:
            cb()


class _Machine:
    """One simulated machine: its resources, speeds, executors and queues."""

    def __init__(self, sim: "Simulator", name: str, queued: bool) -> None:
        self.sim, self.name = sim, name
        self.ident = f"d:{name}".encode()
        self.cpu = _Res(sim, "cpu", self)
        self.net = _Res(sim, "net", self)
        self.up = _Res(sim, "up", self)       # serving model blocks (block_work)
        self.cpu_speed = self.net_speed = 1.0
        self.q = DaemonCore() if queued else None      # the daemon's own protocol core
        self.execs: dict[str, "_Exec"] = {}       # job -> its executor here
        self.roles: dict[tuple[str, int], str] = {}   # queued: running net subtask roles
        self.stopped: set[tuple[str, int]] = set()

    def rates(self, res: _Res) -> None:
        c = self.sim.contention
        run = res.running
        n = len(run)
        if not n:
            return
        if res.kind == "up":                # a server's link: shared evenly by its readers
            for r in run.values():
                r[1] = 1.0 / n
            return
        if res.kind == "cpu":
            # COMPs use every core of the machine, the local part of a
            # transfer (serialization, copies to the machine's own shard)
            # one: all progress at cores / demand when the demand exceeds
            # the cores; the queues decide which COMPs run (a stopped one
            # does not), not the transfers' local parts
            # start-ups at low priority (nice 19, "setup-low") weigh
            # startup_weight against the others' threads: the CPU the
            # others leave, else their weighted share
            cores = self.sim.cpus
            stopped = self.stopped
            comps = whole = low = 0
            for key in run:
                if len(key) == 2:
                    whole += 1
                    if key not in stopped:
                        comps += 1
                elif key[1] == "setup-low":
                    low += 1
            locals_ = n - whole - low
            demand = cores * comps + locals_
            rate = rate_low = 1.0
            if demand + low > cores:
                w = c.startup_weight
                rate = min(1.0, cores / (demand + low * w))
                rate_low = min(1.0, (cores - demand) / low if demand < cores
                               else w * cores / (demand + low * w)) if low else 0.0
            if self.q is None and comps + locals_ + low > 1:   # no queues: interference
                m = comps + locals_ + low
                f = m * c.model.rate("cpu", m)
                rate, rate_low = rate * f, rate_low * f
            if stopped or low:
                for key, r in run.items():
                    r[1] = 0.0 if key in stopped else \
                        rate_low if len(key) == 3 and key[1] == "setup-low" else rate
            else:
                for r in run.values():
                    r[1] = rate
            return
        # transfers at once share the link by the contention model, under
        # the queues too (issue #31, session 25): the runtime's NET queue
        # names a primary, but on the emulated links of the match runs two
        # network-heavy jobs paired on 4 machines each slowed alike, 1.9-2.0x
        # alone, where a primary at the full link would have kept one near
        # 1x. A flow leads where either end's primary is its job, so on jobs
        # spread over machines the priority washes out; the model calibrated
        # on naive co-location fits those runs (two transfers at 0.45 of the
        # link each with the quiet pair's k, bench/cluster_replay.py)
        rate = c.model.rate(res.kind, n)
        for r in run.values():
            r[1] = rate

    # queue actions (harmony mode), as the daemon carries them out
    def act(self, actions: list) -> None:
        now = self.sim.now
        for a in actions:
            kind = type(a)
            if kind is Grant or kind is Deliver:
                if kind is Grant and a.held:
                    continue            # delivered once its executor is ready
                ex = self.execs.get(a.sub.job)
                if ex is not None:
                    ex.granted(a.sub.seq)
            elif kind is Stop:
                self.stopped.add((a.sub.job, a.sub.seq))
                self.cpu.set_rates(now)
            elif kind is Resume:
                self.stopped.discard((a.sub.job, a.sub.seq))
                self.cpu.set_rates(now)
                ex = self.execs.get(a.sub.job)
                if ex is not None and a.tell:
                    ex.stood += a.stood
