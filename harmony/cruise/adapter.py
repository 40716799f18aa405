"""Cruise inside a running job: the runtime's epoch metrics in, a role and
partition layout out (pure; the master core drives it, ``--cruise``).

How the runtime maps onto the cost model (:mod:`harmony.cruise.costmodel`):

* a data item is an input **block**; ``Cwproc_i`` = COMP seconds of an
  epoch on machine i / the input blocks it holds;
* every worker runs the job's ``iters_per_epoch`` iterations per epoch
  whatever its share of the data (its blocks are split over them), each
  pulling and pushing the model rows it touches. So the Cruise mini-batch
  count ``⌈d_i / B⌉`` is 1 with ``B = D``, and a model block's "units" are
  the bytes one worker moves for it in a whole epoch (pull + push): the
  workers' measured bytes per epoch over the model blocks;
* ``b_ij``: bytes/s between machines i and j, the slower of the two links
  the executors report (the emulated NIC rates; on a fleet without
  emulation, each executor's bytes over its PULL + PUSH seconds); a machine
  to itself is free.

The layout is chosen on the job's current machines (Harmony's scheduler
decides how many); a machine may be a worker, a server or both, as in the
runtime. A plan is applied only if Cruise's rule holds: the predicted gain,
after losing the time the move takes, is ≥ 5% of the remaining time, taken
as the epochs done so far (a job is expected to run about as long again).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
import math

from harmony.cruise.costmodel import Machines, MovingAverage, Workload, block_cost
from harmony.cruise.optimizer import Solution, heterogeneous, homogeneous
from harmony.cruise.plan import MIN_GAIN, predicted_gain, worth_applying

SKIP = 2             # epochs after a (re)configuration not used (warm-up, moves)
SAMPLES = 3          # epochs of estimates before a decision
TIME_LIMIT = 5.0     # seconds for the MILP (the master runs it off its event loop)
MOVE_OVERHEAD = 1.0  # seconds a reconfiguration stalls beyond its bytes (boundary, acks)
#: estimates within this relative change of the last solve's, on the same
#: layout, reuse its solution: the MILP (up to TIME_LIMIT) is not re-solved
#: every epoch for a job whose best layout was not worth its move
RESOLVE = 0.02


@dataclass(frozen=True)
class Proposal:
    """A better layout: blocks per machine, its predicted epoch time against
    the current one's, and the seconds the move is predicted to take."""
    d: tuple[int, ...]
    m: tuple[int, ...]
    now: float
    target: float
    move_s: float
    solution: Solution
    reason: str


@dataclass(frozen=True)
class PendingSolve:
    """One solve of the best layout for estimates taken on layout (d, m):
    pure, callable anywhere (``solve()``)."""
    d: tuple[int, ...]
    m: tuple[int, ...]
    machines: Machines
    job: Workload
    homog: bool             # equal machines and links: Eq 3.5 is a candidate too

    def __call__(self) -> Solution:
        cands = [homogeneous(self.machines, self.job)] if self.homog else []
        cands.append(heterogeneous(self.machines, self.job, allow_both=True, allow_idle=False,
                                   time_limit=TIME_LIMIT))
        return min(cands, key=lambda s: s.cost)


@dataclass
class JobCruise:
    """Estimates of one running job on its current machines (indices 0..n-1)."""
    n: int
    model_blocks: int
    comp: dict[int, MovingAverage] = field(default_factory=dict)     # s per block
    bytes: dict[int, MovingAverage] = field(default_factory=dict)    # per epoch, worker
    rate: dict[int, MovingAverage] = field(default_factory=dict)     # link bytes/s
    block_bytes: MovingAverage = field(default_factory=lambda: MovingAverage(10, 0))
    epochs: int = 0
    solves: int = 0
    _last: tuple | None = None          # (d, m, machines, workload, solution) last solved
    #: what the last ``propose`` found, moving or not: ``now`` and ``best``
    #: predicted epoch seconds, the best layout's ``workers``/``servers``,
    #: ``move_s`` and ``decision`` (move / keep) with ``why`` (for status)
    view: dict | None = None

    def observe(self, per_index: Mapping[int, Mapping[str, float]]) -> None:
        """One epoch's timings of every executor (``comp`` seconds, ``blocks``
        held, ``bytes`` pulled + pushed, ``pull``/``push`` seconds, ``link``
        bytes/s or 0, ``input_bytes`` of its blocks)."""
        self.epochs += 1
        for i, tm in per_index.items():
            blocks = float(tm.get("blocks") or 0)
            if blocks > 0:
                self.comp.setdefault(i, MovingAverage(10, SKIP)).add(
                    float(tm.get("comp", 0.0)), blocks)
                self.bytes.setdefault(i, MovingAverage(10, SKIP)).add(float(tm.get("bytes", 0)))
                if tm.get("input_bytes"):
                    self.block_bytes.add(float(tm["input_bytes"]), blocks)
            link = float(tm.get("link") or 0.0)
            if link <= 0:
                secs = float(tm.get("pull", 0.0)) + float(tm.get("push", 0.0))
                link = float(tm.get("bytes", 0.0)) / secs if secs > 0 else 0.0
            if link > 0:
                self.rate.setdefault(i, MovingAverage(10, SKIP)).add(link)

    def ready(self) -> bool:
        return self.epochs >= SKIP + SAMPLES and bool(self.comp) and len(self.rate) == self.n \
            and all(a.count >= SAMPLES for a in self.comp.values())

    def model(self, data_blocks: int) -> tuple[Machines, Workload]:
        """The cost model's machines and workload from the estimates."""
        known = [a.value for a in self.comp.values() if a.value is not None]
        mean = sum(known) / len(known)
        wproc = tuple(self.comp[i].value if i in self.comp and self.comp[i].value is not None
                      else mean for i in range(self.n))
        rates = [self.rate[i].value or 1.0 for i in range(self.n)]
        bw = tuple(tuple(math.inf if i == j else min(rates[i], rates[j])
                         for j in range(self.n)) for i in range(self.n))
        per_worker = [a.value for a in self.bytes.values() if a.value is not None]
        units = max(1.0, sum(per_worker) / len(per_worker) / self.model_blocks)
        return (Machines(wproc, bw),
                Workload(data_blocks, self.model_blocks, 1.0, units, float(data_blocks)))

    def prepare(self, d_now: Sequence[int], m_now: Sequence[int]) -> PendingSolve | None:
        """The solve ``propose`` needs on this layout, as a pure function to
        run anywhere (the master runs it off its event loop, then hands the
        result to :meth:`accept`), or None if none is needed: estimates not
        ready yet, or the last solution still holds (same layout, every
        estimate within RESOLVE)."""
        if not self.ready():
            return None
        machines, job = self.model(sum(d_now))
        last = self._last
        if last is not None and last[0] == tuple(d_now) and last[1] == tuple(m_now) \
                and _close(last[2], last[3], machines, job):
            return None
        same = len(set(machines.wproc)) == 1 or max(machines.wproc) <= 1.05 * min(
            machines.wproc)
        links = {b for row in machines.bw for b in row if b != math.inf}
        return PendingSolve(tuple(d_now), tuple(m_now), machines, job,
                            same and len(links) <= 1 and self.n >= 2)

    def accept(self, solve: PendingSolve, best: Solution) -> None:
        """The result of a :meth:`prepare` solve: what ``propose`` reuses."""
        self._last = (solve.d, solve.m, solve.machines, solve.job, best)
        self.solves += 1

    def propose(self, d_now: Sequence[int], m_now: Sequence[int],
                epochs_left: float, solve_here: bool = True) -> Proposal | None:
        """A layout worth moving to, or None. ``d_now``/``m_now``: blocks per
        machine now; ``epochs_left``: the work a move has to repay. Solves
        here if :meth:`prepare` says a solve is needed, unless not
        ``solve_here`` (then the last accepted solution is used)."""
        if not self.ready() or (not solve_here and self._last is None):
            return None
        solve = self.prepare(d_now, m_now) if solve_here else None
        if solve is not None:
            self.accept(solve, solve())
        D = sum(d_now)
        machines, job = self.model(D)
        now = block_cost(machines, job, d_now, m_now).cost
        best = self._last[4]
        moved = _moved_bytes(d_now, m_now, best.d, best.m,
                             self.block_bytes.value or 0.0, job.block_units)
        slowest = min(min(r for r in row if r != math.inf) for row in machines.bw) \
            if self.n > 1 else math.inf
        move_s = MOVE_OVERHEAD + moved / slowest
        self.view = {"now": now, "best": best.cost, "workers": best.workers,
                     "servers": best.servers, "move_s": move_s, "decision": "keep"}
        if tuple(best.d) == tuple(d_now) and tuple(best.m) == tuple(m_now):
            self.view["why"] = "the best layout is this one"
            return None
        if not worth_applying(now, best.cost, move_s, epochs_left):
            gain = predicted_gain(now, best.cost, move_s, epochs_left)
            self.view["why"] = (f"predicted gain {gain:.0%} over the {epochs_left:.0f} "
                                f"epoch(s) it counts on, after the move: under "
                                f"{MIN_GAIN:.0%}")
            return None
        self.view.update(decision="move", why="worth its move")
        return Proposal(tuple(best.d), tuple(best.m), now, best.cost, move_s, best,
                        f"predicted epoch {now:.2f}s -> {best.cost:.2f}s "
                        f"({best.workers} worker(s), {best.servers} server(s), {best.status})")


def _close(m0: Machines, w0: Workload, m1: Machines, w1: Workload) -> bool:
    """Every estimate within RESOLVE of the other's."""
    def near(a: float, b: float) -> bool:
        return a == b or abs(a - b) <= RESOLVE * max(abs(a), abs(b))
    same_job = w0 == w1 or (w0.data_blocks == w1.data_blocks
                            and w0.model_blocks == w1.model_blocks
                            and near(w0.block_units, w1.block_units))
    return same_job and len(m0) == len(m1) \
        and all(near(a, b) for a, b in zip(m0.wproc, m1.wproc)) \
        and all(near(a, b) for r0, r1 in zip(m0.bw, m1.bw) for a, b in zip(r0, r1))


def _moved_bytes(d0: Sequence[int], m0: Sequence[int], d1: Sequence[int], m1: Sequence[int],
                 input_block: float, model_units: float) -> float:
    """Bytes that leave their machine going from (d0, m0) to (d1, m1); a
    model block's size is taken as its per-epoch traffic (an upper bound)."""
    din = sum(max(0, a - b) for a, b in zip(d0, d1))
    mout = sum(max(0, a - b) for a, b in zip(m0, m1))
    return din * input_block + mout * model_units


__all__ = ["JobCruise", "PendingSolve", "Proposal", "MIN_GAIN"]
