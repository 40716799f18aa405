"""The plan types and the array views of profiles shared by every step of the grouping (Algorithms 1 and 2): ``PlannedGroup``, ``Plan``, the constants.

Part of :mod:`harmony.sched.grouping` (see its docstring)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from harmony.sched.model import Profile, score
# that float noise cannot make swaps cycle.
_EPS = 1e-12
# Tuning of the non-literal Algorithm 1 (see ``schedule``)
_ALL_N_GROUPS = 8       # try every n_G up to this many
_REFINE_MAX_JOBS = 16   # model fine-tuning for job sets of at most this many jobs
_REFINE_MAX_GROUPS = 8  # ... in at most this many groups (it visits every pair)
_REFINE_TOP = 3         # ... on the three best n_G values per job set (remote > 0: all)
_REFINE_SKIP = 0.01     # ... leaving pairs of groups already within 1% of full U
_ALL_SPLITS = 8         # remote > 0: every machine split of pairs on up to 8 machines
_RESHAPE_ROUNDS = 3     # remote > 0: rounds of re-splits, merges and splits (_reshape)
_EXHAUSTIVE_PAIR = 8    # every split of two groups up to this many jobs, else moves/swaps
_FEWER_JOBS = 5e-3      # the smallest job set within this fraction of the best U wins
_BATCH_MIN = 2          # _Looks.settle: re-splits batched (_best_splits) from this many on


@dataclass(frozen=True)
class PlannedGroup:
    """One group of a plan: its jobs, how many machines it gets, and the
    group iteration time the model predicts for it there (Eq 4.1)."""
    jobs: tuple[str, ...]
    machines: int
    predicted_iter: float


@dataclass
class Plan:
    """A scheduling decision: groups to run, the jobs left waiting (in the
    order they were given) and the predicted cluster utilization
    (cpu, net) of Eq 4.4 over all machines."""
    groups: list[PlannedGroup] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)
    util: tuple[float, float] = (0.0, 0.0)

    @property
    def score(self) -> float:
        """U as one number (``model.score``)."""
        return score(*self.util)


# ---------------------------------------------------------------- internals
def _arrays(profiles: Sequence[Profile]
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(work, base, remote) per job: Tcpu * c_g, Tnet(1) and R (``model``);
    remote is None when every job's R is 0 (then base is Tnet)."""
    n = len(profiles)
    work = np.fromiter((p.t_cpu * p.dop for p in profiles), float, n)
    base = np.fromiter((p.net_base for p in profiles), float, n)
    if not any(p.remote > 0 for p in profiles):
        return work, base, None
    return work, base, np.fromiter((p.remote for p in profiles), float, n)


def _net(base: np.ndarray, remote: np.ndarray | None, m) -> np.ndarray:
    """Tnet at DoP ``m`` (a number or an array broadcasting against base):
    base + remote * (1 - 1/m)."""
    if remote is None:
        return base
    return base + remote * (1.0 - 1.0 / np.asarray(m, dtype=float))
