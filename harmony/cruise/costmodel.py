"""Cruise's cost of one epoch (§3.2, Eqs 3.1-3.4) and its runtime estimators.

C = max_i C_i over the workers i, C_i = Ccomp_i + Ccomm_i with

    Ccomp_i = Cwproc_i · d_i
    Ccomm_i = ⌈d_i / B⌉ · max( max_j m_j·w / b_ij , Σ_j m_j / b_ij )

d_i: data items of worker i, m_j: model units (bytes, rows, ...) of server
j, w: the number of workers, b_ij: model units per second from worker i to
server j, B: the mini-batch size in items. A machine is a worker when it
holds data (d_i > 0) and a server when it holds model (m_j > 0); it may be
both. A link of bandwidth ``inf`` is free (a machine's own server shard).
Every mini-batch pulls (and pushes) the whole model once: fold the factor
of push + pull into b or into the model unit.

The estimators are pure: they are fed observations and never read a clock.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
import math

import numpy as np

WORKER, SERVER, BOTH, IDLE = "worker", "server", "both", "idle"


def role_of(data: float, model: float) -> str:
    """The role a machine plays with ``data`` items and ``model`` units."""
    if data > 0 and model > 0:
        return BOTH
    if data > 0:
        return WORKER
    return SERVER if model > 0 else IDLE


@dataclass(frozen=True)
class Breakdown:
    """The cost of one epoch and its per-machine terms (0 for non-workers)."""
    cost: float
    comp: tuple[float, ...]
    comm: tuple[float, ...]

    @property
    def per_machine(self) -> tuple[float, ...]:
        return tuple(a + b for a, b in zip(self.comp, self.comm))


def epoch_cost(wproc: Sequence[float], bw: Sequence[Sequence[float]] | np.ndarray,
               d: Sequence[float], m: Sequence[float], batch: float) -> Breakdown:
    """Eq 3.1-3.4: the epoch time of a configuration.

    ``wproc[i]``: seconds per data item on machine i; ``bw[i][j]``: model
    units per second from i to j (``inf``: free); ``d[i]`` data items and
    ``m[j]`` model units per machine; ``batch``: the mini-batch size B.
    """
    n = len(wproc)
    b = np.asarray(bw, dtype=float)
    if b.shape != (n, n) or len(d) != n or len(m) != n:
        raise ValueError(f"sizes differ: {n} machines, bw {b.shape}, d {len(d)}, m {len(m)}")
    if batch <= 0 or np.any(b <= 0):
        raise ValueError("the batch size and every bandwidth must be positive")
    mv = np.asarray(m, dtype=float)
    w = sum(1 for x in d if x > 0)
    inv = 1.0 / b                                   # inf -> 0: a free link
    comp, comm = [], []
    for i in range(n):
        if d[i] <= 0:
            comp.append(0.0)
            comm.append(0.0)
            continue
        per_batch = max(float(np.max(mv * w * inv[i])), float(np.sum(mv * inv[i])))
        comp.append(wproc[i] * d[i])
        comm.append(math.ceil(d[i] / batch - 1e-9) * per_batch)
    return Breakdown(max(a + c for a, c in zip(comp, comm)) if w else math.inf,
                     tuple(comp), tuple(comm))


@dataclass(frozen=True)
class Workload:
    """A job in blocks: ``data_blocks`` (D) blocks of ``items_per_block``
    items, ``model_blocks`` (M) blocks of ``block_units`` model units each,
    mini-batches of ``batch`` (B) items."""
    data_blocks: int
    model_blocks: int
    items_per_block: float
    block_units: float
    batch: float

    def __post_init__(self) -> None:
        if self.data_blocks < 1 or self.model_blocks < 1:
            raise ValueError("a job has at least one data block and one model block")
        if self.items_per_block <= 0 or self.block_units <= 0 or self.batch <= 0:
            raise ValueError("block sizes and the batch size must be positive")


@dataclass(frozen=True)
class Machines:
    """The machines a configuration may use: ``wproc[i]`` seconds per data
    item, ``bw[i][j]`` model units per second from i to j."""
    wproc: tuple[float, ...]
    bw: tuple[tuple[float, ...], ...]

    @classmethod
    def homogeneous(cls, n: int, wproc: float, bw: float, local: float = math.inf) -> Machines:
        """``n`` equal machines; ``local``: the bandwidth of a machine to itself."""
        return cls((float(wproc),) * n,
                   tuple(tuple(local if i == j else float(bw) for j in range(n))
                         for i in range(n)))

    def __len__(self) -> int:
        return len(self.wproc)


def block_cost(machines: Machines, job: Workload, d: Sequence[int],
               m: Sequence[int]) -> Breakdown:
    """``epoch_cost`` of ``d[i]`` data blocks and ``m[j]`` model blocks."""
    if sum(d) != job.data_blocks or sum(m) != job.model_blocks:
        raise ValueError(f"partitions {sum(d)}/{sum(m)} blocks, job has "
                         f"{job.data_blocks}/{job.model_blocks}")
    return epoch_cost(machines.wproc, machines.bw, [x * job.items_per_block for x in d],
                      [x * job.block_units for x in m], job.batch)


class MovingAverage:
    """Mean of the last ``window`` observations after skipping the first
    ``skip`` (warm-up mini-batches: JIT, caches, connection set-up)."""

    def __init__(self, window: int = 10, skip: int = 2) -> None:
        if window < 1 or skip < 0:
            raise ValueError("window >= 1 and skip >= 0")
        self.window, self.skip = window, skip
        self.seen = 0
        self._vals: deque[tuple[float, float]] = deque(maxlen=window)

    def add(self, value: float, weight: float = 1.0) -> None:
        """One observation; ``weight`` > 0 makes the mean a ratio of sums
        (e.g. seconds over items), robust to mini-batches of uneven size."""
        self.seen += 1
        if self.seen > self.skip:
            self._vals.append((float(value), float(weight)))

    @property
    def count(self) -> int:
        return len(self._vals)

    @property
    def value(self) -> float | None:
        if not self._vals:
            return None
        return sum(v for v, _ in self._vals) / sum(w for _, w in self._vals)


class Estimator:
    """Cost-model inputs from runtime metrics, per machine and per link.

    ``compute(i, seconds, items)``: a worker's local computation of one
    mini-batch; ``transfer(i, j, units, seconds)``: one pull/push between
    worker i and server j. Cwproc_i = Σseconds / Σitems and b_ij =
    Σunits / Σseconds over the last ``window`` observations of each, the
    first ``skip`` of each dropped. ``ready`` says when every machine and
    link asked about has ``min_samples`` kept observations.
    """

    def __init__(self, window: int = 10, skip: int = 2, min_samples: int = 3) -> None:
        self.window, self.skip, self.min_samples = window, skip, min_samples
        self._comp: dict[int, MovingAverage] = {}
        self._link: dict[tuple[int, int], MovingAverage] = {}

    def compute(self, i: int, seconds: float, items: float) -> None:
        if items > 0:
            self._comp.setdefault(i, MovingAverage(self.window, self.skip)).add(seconds, items)

    def transfer(self, i: int, j: int, units: float, seconds: float) -> None:
        if seconds > 0:
            self._link.setdefault((i, j), MovingAverage(self.window, self.skip)).add(units, seconds)

    def wproc(self, i: int) -> float | None:
        a = self._comp.get(i)
        return a.value if a is not None else None

    def bandwidth(self, i: int, j: int) -> float | None:
        a = self._link.get((i, j))
        return a.value if a is not None else None

    def ready(self, workers: Sequence[int], links: Sequence[tuple[int, int]] = ()) -> bool:
        ok = all(i in self._comp and self._comp[i].count >= self.min_samples for i in workers)
        return ok and all(k in self._link and self._link[k].count >= self.min_samples
                          for k in links)

    def machines(self, n: int, default_wproc: float | None = None,
                 default_bw: float | None = None, local: float = math.inf) -> Machines:
        """``Machines`` for indices 0..n-1; a machine or link without
        estimates takes the default (e.g. the mean of the known ones for a
        machine that has not run yet), or raises if there is none."""
        wp, bw = [], []
        for i in range(n):
            v = self.wproc(i)
            if v is None:
                if default_wproc is None:
                    raise ValueError(f"no compute estimate for machine {i}")
                v = default_wproc
            wp.append(v)
            row = []
            for j in range(n):
                b = local if i == j else self.bandwidth(i, j)
                if b is None:
                    if default_bw is None:
                        raise ValueError(f"no bandwidth estimate for link {i}->{j}")
                    b = default_bw
                row.append(b)
            bw.append(tuple(row))
        return Machines(tuple(wp), tuple(bw))
