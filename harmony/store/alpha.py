"""The disk-block ratio α of one job on one machine: initial estimate and
per-job hill climbing (dissertation §4.3.3). Pure: no I/O, no clocks; the
executor feeds it observations and applies its decisions.

α_j = Bdisk_j / Btotal_j. The controller works in whole blocks ``n`` (α is
always ``n / num_blocks``) and keeps α inside:

* **the stall bound** ``Tbproc·(Btotal − 1) ≥ Tbload·(Bdisk − 1)`` (per COMP
  pass of ``Btotal`` blocks), i.e. ``Bdisk ≤ 1 + Tbproc·(Btotal − 1)/Tbload``,
  so reloads hide behind in-memory processing (:func:`max_disk_blocks`);
* **the memory band** of dask-like thresholds, as fractions of the machine's
  budget: target 0.60, spill 0.70, pause 0.80, terminate 0.95.

One :meth:`AlphaController.step` per observation (e.g. per iteration):

=====================================  =========================================
memory used / budget                   action
=====================================  =========================================
≥ terminate                            α = 1 at once, spill the model, and ask
                                       for a job to be paused here
≥ spill, α < 1                         **up** by the step, capped at the stall
                                       bound while below pause (above pause,
                                       memory wins over stalls), and not further
                                       than needed to get back under target
≥ spill, α = 1                         spill model blocks; if the model is
                                       already spilled and ≥ pause: ask to pause
< spill, COMP stalled on reload (stall **down**, but only as far as the projected
> tolerance · COMP time) or above the   memory (+ one block's bytes per block
stall bound                            brought back) stays below spill
< spill, this job not stalling, a      **up** by this job's part of the bytes the
co-located job starved (stalls ≥       starved jobs asked for (``others_need``;
``starve_stall`` of its COMP time, no  without it, by the climbing step), at
room to go down), ≥ target             most to the stall bound: memory to the
                                       job whose reloads cannot hide
< target                               **down** (less reload work), only as far
                                       as the projection stays below target
otherwise (target ≤ used < spill)      hold
=====================================  =========================================

Convergence: the step (in blocks) grows ×1.5 while moves keep the same
direction and halves on every reversal; a reversal at the minimum step (one
block) also starts a cool-down of ``cooldown`` observations in which only
memory pressure can move α. Down moves are checked against a projection of
memory use, and up moves stop at the target, so a steady job ends inside the
[target, spill) band or at a bound and stays there instead of oscillating.
Timings (Tbproc, Tbload) are smoothed with an EWMA.

Settling: a band narrower than the projection's error (or than one block)
leaves a position below target whose next block down is above spill, and
after each cool-down the controller would probe it again (one step down,
memory over spill, back up: every ``cooldown + 2`` observations, for ever).
So a *failed probe* (a move down that memory pressure reverses at the very
next observation) is counted against the position it left, and a position
with ``settle_after`` failed probes becomes a floor: no move down goes below
it, and at it the controller is **settled**: it makes no move of its own
(down for room or stalls, up for a co-located job) until the observations
there change materially: memory use by more than ``resume_mem`` of the
budget, or the stall by more than ``resume_stall`` of COMP time, against the
first observation at that position, in two observations in a row (one
outlier does not count), or a co-located job starts or stops starving. Then
it forgets the failures and probes again. Memory pressure (≥ spill) moves α
up as always, settled or not; the floors stay.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Thresholds:
    target: float = 0.60
    spill: float = 0.70
    pause: float = 0.80
    terminate: float = 0.95

    def __post_init__(self) -> None:
        if not 0 < self.target < self.spill < self.pause < self.terminate <= 1.0:
            raise ValueError(f"need 0 < target < spill < pause < terminate <= 1: {self}")


@dataclass(frozen=True)
class Observation:
    """One measurement of a job on a machine, after a COMP pass."""
    mem_used: int                      # bytes counted against the budget (memory.py)
    mem_budget: int                    # the machine's (effective) budget
    stall_s: float = 0.0               # consumer waited on reload in the pass
    comp_s: float | None = None        # COMP wall time incl. stalls (default tbproc·B + stall)
    tbproc: float | None = None        # mean seconds to process one block
    tbload: float | None = None        # mean seconds to load (+ write back) one disk-block
    blocks_total: int | None = None    # blocks in the pass (Btotal of the bound)
    block_bytes: float | None = None   # in-memory bytes of one input block
    others_starved: bool = False       # a co-located job stalls on reload but has no room
    others_need: float = 0.0           # the bytes such jobs asked for (0: not said)
    share: float = 1.0                 # this job's part of mem_used (co-located jobs)

    @classmethod
    def from_pass(cls, stats, mem_used: int, mem_budget: int,
                  block_bytes: float | None = None) -> "Observation":
        """From a :class:`harmony.store.reload.ReloadStats` (duck-typed)."""
        return cls(mem_used, mem_budget, stall_s=stats.stall_s, comp_s=stats.comp_s,
                   tbproc=stats.tbproc, tbload=stats.tbload,
                   blocks_total=stats.blocks or None, block_bytes=block_bytes)


@dataclass(frozen=True)
class Decision:
    alpha: float
    disk_blocks: int
    spill_model: bool      # keep model blocks spilled (checkpointed) between uses
    pause_job: bool        # memory critical with nothing left to spill: pause a job here
    direction: int         # +1 up, -1 down, 0 hold (of α)
    reason: str


def max_disk_blocks(tbproc: float | None, tbload: float | None, blocks_total: int) -> int:
    """The largest Bdisk with Tbproc·(Btotal − 1) ≥ Tbload·(Bdisk − 1)."""
    if blocks_total <= 0:
        return 0
    if not tbload or tbload <= 0 or tbproc is None:
        return blocks_total          # nothing measured yet: no bound known
    return max(1, min(blocks_total, 1 + int(math.floor(tbproc * (blocks_total - 1) / tbload
                                                       + 1e-9))))


def estimate_input_bytes(sample_sizes: Sequence[int], total_blocks: int) -> int:
    """Input size from the in-memory sizes of a sample of its blocks."""
    if not sample_sizes:
        raise ValueError("need at least one sampled block size")
    return int(math.ceil(sum(sample_sizes) / len(sample_sizes) * total_blocks))


def initial_alpha(input_bytes: int, model_bytes: int, budget_bytes: int,
                  other_jobs_bytes: int = 0, *, reserve_bytes: int = 0,
                  thresholds: Thresholds = Thresholds(), num_blocks: int | None = None) -> float:
    """α such that this job's input (the in-memory part), its model, the other
    jobs' memory and a reserve fit under ``target · budget``. Rounded up to a
    whole number of blocks when ``num_blocks`` is given."""
    if budget_bytes <= 0:
        raise ValueError("budget must be > 0")
    if input_bytes <= 0:
        return 0.0
    room = thresholds.target * budget_bytes - other_jobs_bytes - model_bytes - reserve_bytes
    alpha = min(1.0, max(0.0, 1.0 - room / input_bytes))
    if num_blocks:
        alpha = min(1.0, math.ceil(alpha * num_blocks - 1e-9) / num_blocks)
    return alpha


class AlphaController:
    """Hill-climbs the number of disk-blocks of one job on one machine."""

    def __init__(self, num_blocks: int, alpha: float = 0.0, *,
                 block_bytes: float | None = None, model_bytes: int | None = None,
                 thresholds: Thresholds = Thresholds(), stall_tolerance: float = 0.02,
                 initial_step: float | None = None, max_step: float | None = None,
                 cooldown: int = 6, smoothing: float = 0.5, spill_model: bool = False,
                 settle_after: int = 1, resume_mem: float = 0.10,
                 resume_stall: float = 0.10, starve_stall: float = 0.10,
                 give_at_once: bool = False) -> None:
        if num_blocks < 1:
            raise ValueError("num_blocks must be >= 1")
        if settle_after < 1:
            raise ValueError("settle_after must be >= 1")
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {alpha}")
        self.num_blocks = num_blocks
        self.n = min(num_blocks, int(math.ceil(alpha * num_blocks - 1e-9)))
        self.block_bytes, self.model_bytes = block_bytes, model_bytes
        self.th = thresholds
        self.stall_tolerance = stall_tolerance
        self.step_blocks = float(initial_step or max(1.0, num_blocks / 8))
        self.max_step = float(max_step or max(1.0, num_blocks / 2))
        self.cooldown = cooldown
        self.smoothing = smoothing
        self.spill_model = spill_model
        self.last_dir = 0
        self.reversals = 0
        self.cooldown_left = 0
        self.tbproc: float | None = None
        self.tbload: float | None = None
        self.history: list[Decision] = []
        #: the last step found reload stalling COMP by at least ``starve_stall``
        #: of its time and no memory to go down (co-located jobs then give it
        #: memory: their part of its ``need``, by their climbing step when it
        #: said none, or at once up to their stall bound with ``give_at_once``)
        self.starved = False
        #: while starved: the bytes it would bring back into memory to stop
        #: stalling (its disk-blocks above the stall bound, at least a step)
        self.need = 0.0
        self.starve_stall, self.give_at_once = starve_stall, give_at_once
        self.settle_after, self.resume_mem, self.resume_stall = (settle_after, resume_mem,
                                                                 resume_stall)
        #: failed probes down, by the position (disk-blocks) they left from
        self.failed: dict[int, int] = {}
        self._settled_ref: tuple[int, float, float, bool] | None = None
        self._changed_in_a_row = 0
        self._probe_from: int | None = None   # where the last move down started
        self._probe_obs = 0                    # observations since that move

    @classmethod
    def from_estimate(cls, num_blocks: int, input_bytes: int, model_bytes: int,
                      budget_bytes: int, other_jobs_bytes: int = 0, *, reserve_bytes: int = 0,
                      thresholds: Thresholds = Thresholds(), **kw) -> "AlphaController":
        """Start from :func:`initial_alpha`; spill the model from the start if
        it does not fit below ``spill`` even with every input block on disk."""
        a = initial_alpha(input_bytes, model_bytes, budget_bytes, other_jobs_bytes,
                          reserve_bytes=reserve_bytes, thresholds=thresholds,
                          num_blocks=num_blocks)
        spill = (a >= 1.0 and other_jobs_bytes + model_bytes + reserve_bytes
                 > thresholds.spill * budget_bytes)
        return cls(num_blocks, a, block_bytes=input_bytes / num_blocks, model_bytes=model_bytes,
                   thresholds=thresholds, spill_model=spill, **kw)

    @property
    def alpha(self) -> float:
        return self.n / self.num_blocks

    # -- internals -------------------------------------------------------------------
    def _smooth(self, old: float | None, new: float | None) -> float | None:
        if new is None:
            return old
        return new if old is None else self.smoothing * new + (1 - self.smoothing) * old

    def _bound_n(self, blocks_pass: int) -> int:
        """Job-level disk-block cap from the stall bound of one pass."""
        per_pass = max_disk_blocks(self.tbproc, self.tbload, blocks_pass)
        if per_pass >= blocks_pass:
            return self.num_blocks
        return min(self.num_blocks, int(math.floor(per_pass * self.num_blocks / blocks_pass)))

    def _planned_move(self, direction: int) -> tuple[int, float]:
        """Blocks to move in ``direction``; adapts the step (not committed)."""
        step = self.step_blocks
        if self.last_dir == -direction:
            step = max(1.0, step / 2)
        elif self.last_dir == direction:
            step = min(self.max_step, step * 1.5)
        return max(1, int(round(step))), step

    def _commit(self, direction: int, step: float) -> None:
        if self.last_dir == -direction:
            self.reversals += 1
            if self.step_blocks <= 1.0:
                self.cooldown_left = self.cooldown
        self.step_blocks = step
        self.last_dir = direction
        self._probe_from, self._probe_obs = (self.n, 0) if direction < 0 else (None, 0)

    def _pressure_up(self) -> None:
        """Memory pressure moves α up now: a move down at the observation
        just before was a failed probe of the position it left."""
        p = self._probe_from
        self._probe_from = None
        if self.last_dir < 0 and p is not None and self._probe_obs <= 1:
            self.failed[p] = self.failed.get(p, 0) + 1

    def _floor(self) -> int:
        """The highest position at or below this one whose probes down
        failed ``settle_after`` times: no move down goes below it."""
        return max((p for p, k in self.failed.items()
                    if k >= self.settle_after and p <= self.n), default=0)

    @property
    def settled(self) -> bool:
        """At a floor: no moves of its own until the observations change."""
        return self.failed.get(self.n, 0) >= self.settle_after

    def _still_settled(self, frac: float, stall_frac: float, others_starved: bool) -> bool:
        """While settled: have the observations at this position changed
        materially since the first one here (twice in a row)? If so the
        failures are forgotten."""
        ref = self._settled_ref
        if ref is None or ref[0] != self.n:
            self._settled_ref = (self.n, frac, stall_frac, others_starved)
            self._changed_in_a_row = 0
            return True
        _, f0, s0, o0 = ref
        if (abs(frac - f0) > self.resume_mem or abs(stall_frac - s0) > self.resume_stall
                or others_starved != o0):
            self._changed_in_a_row += 1
        else:
            self._changed_in_a_row = 0
        if self._changed_in_a_row < 2:
            return True
        self._settled_ref, self._changed_in_a_row = None, 0
        self.failed.clear()
        self.cooldown_left = 0
        return False

    def _decide(self, direction: int, reason: str, pause: bool = False) -> Decision:
        d = Decision(self.alpha, self.n, self.spill_model, pause, direction, reason)
        self.history.append(d)
        return d

    # -- the rule ----------------------------------------------------------------------
    def step(self, obs: Observation) -> Decision:
        th, N = self.th, self.num_blocks
        self.starved, self.need = False, 0.0
        if obs.mem_budget <= 0:
            raise ValueError("mem_budget must be > 0")
        self._probe_obs += 1
        budget, used = float(obs.mem_budget), float(obs.mem_used)
        frac = used / budget
        share = min(1.0, max(0.0, obs.share))
        self.tbproc = self._smooth(self.tbproc, obs.tbproc)
        self.tbload = self._smooth(self.tbload, obs.tbload)
        if obs.block_bytes:
            self.block_bytes = obs.block_bytes
        per_block = self.block_bytes
        b_pass = obs.blocks_total or N
        bound_n = self._bound_n(b_pass)
        comp = obs.comp_s if obs.comp_s is not None else (
            (self.tbproc or 0.0) * b_pass + obs.stall_s)
        stalling = obs.stall_s > self.stall_tolerance * comp if comp > 0 else obs.stall_s > 0

        # -- critical: everything to disk now, and ask for a pause
        if frac >= th.terminate:
            changed = self.n < N
            if changed:
                self._pressure_up()
            self.n, self.spill_model = N, True
            return self._decide(+1 if changed else 0, "terminate threshold", pause=True)

        # -- memory short: up
        if frac >= th.spill:
            if self.n >= N:
                if not self.spill_model:
                    self.spill_model = True
                    return self._decide(0, "alpha is 1 and memory short: spill model")
                if frac >= th.pause:
                    return self._decide(0, "pause threshold with everything spilled", pause=True)
                return self._decide(0, "everything spilled")
            limit = N if frac >= th.pause else max(self.n, bound_n)
            if self.n >= limit:
                return self._decide(0, "memory short but at the stall bound")
            move, step = self._planned_move(+1)
            if per_block:
                # this job's part of the gap (co-located jobs close theirs)
                need = int(math.ceil((used - th.target * budget) * share / per_block - 1e-9))
                move = min(move, max(1, need))
            self._pressure_up()
            self._commit(+1, step)
            self.n = min(limit, self.n + move)
            return self._decide(+1, "memory above spill threshold")

        # -- memory fine: model back in memory first, if it fits
        if self.spill_model:
            room = th.target * budget - used
            if self.model_bytes is not None and self.model_bytes < room:
                self.spill_model = False
                return self._decide(0, "memory below target: model back in memory")
            if self.model_bytes is None and frac < th.target / 2:
                self.spill_model = False
                return self._decide(0, "memory well below target: model back in memory")

        stall_frac = obs.stall_s / comp if comp > 0 else 0.0
        if self.settled and self._still_settled(frac, stall_frac, obs.others_starved):
            return self._decide(0, f"settled: {self.failed[self.n]} failed probe(s) of fewer "
                                   "disk-blocks; probing again when memory or stalls change")
        if self.cooldown_left > 0:
            self.cooldown_left -= 1
            return self._decide(0, "cool-down after a reversal")

        if self.n > 0 and (stalling or self.n > bound_n):
            why = "reload stalls COMP" if stalling else "above the stall bound"
            d = self._down(used, budget, per_block, th.spill, why,
                           at_least=self.n - bound_n if self.n > bound_n else 0)
            self.starved = d.direction == 0 and stall_frac >= self.starve_stall
            if self.starved and per_block:
                want = max(self.n - bound_n, self._planned_move(-1)[0])
                self.need = float(min(self.n, want) * per_block)
            return d
        if obs.others_starved and frac >= th.target and self.n < min(N, bound_n):
            # this job's reloads hide behind its compute, another job's stall
            # and find no room: give it memory, up to this job's stall bound
            # (all blocks if none is measured yet; its own stalls bring it
            # back down). Every block spilled costs this job reload work on
            # a CPU the starved job shares, so it gives its part of what the
            # others asked for (by its climbing step if they said no amount),
            # not everything at once
            if self.give_at_once:
                self._commit(+1, self.step_blocks)
                self.n = min(N, bound_n)
            elif 0 < obs.others_need < math.inf and per_block:
                # this job's part of what they asked for (the others give theirs)
                move = max(1, int(math.ceil(obs.others_need * share / per_block - 1e-9)))
                self._commit(+1, self.step_blocks)
                self.n = min(N, bound_n, self.n + move)
            else:
                move, step = self._planned_move(+1)
                self._commit(+1, step)
                self.n = min(N, bound_n, self.n + move)
            return self._decide(+1, "memory to a co-located job whose reloads stall")
        if self.n > 0 and frac < th.target:
            # only this job's part of the room: the others take theirs
            return self._down(used, budget, per_block, th.target, "memory below target",
                              share=share)
        return self._decide(0, "steady")

    def _down(self, used: float, budget: float, per_block: float | None, ceiling: float,
              why: str, at_least: int = 0, share: float = 1.0) -> Decision:
        move, step = self._planned_move(-1)
        move = min(self.n - self._floor(), max(move, at_least))
        if per_block:
            fits = int(math.floor((ceiling * budget - used) * share / per_block - 1e-9))
            move = min(move, fits)
        elif used >= self.th.target * budget:
            move = 0
        else:
            move = min(move, 1)
        if move <= 0:
            return self._decide(0, f"{why}, but memory does not allow fewer disk-blocks")
        self._commit(-1, step)
        self.n -= move
        return self._decide(-1, why)

    def state(self) -> dict:
        return {"alpha": self.alpha, "disk_blocks": self.n, "step": self.step_blocks,
                "spill_model": self.spill_model, "reversals": self.reversals,
                "starved": self.starved, "settled": self.settled,
                "tbproc": self.tbproc, "tbload": self.tbload}
