"""Re-splits, merges and splits of groups with remote COMM (``_reshape``), and ``_Looks``, the cache of its looks at groups.

Part of :mod:`harmony.sched.grouping` (see its docstring)."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from harmony.sched.grouping.base import _ALL_SPLITS, _BATCH_MIN, _REFINE_SKIP, _RESHAPE_ROUNDS
from harmony.sched.grouping.evaluate import _group_value_l
from harmony.sched.grouping.refine import _best_split, _best_split_small, _best_splits, _pair_rows, _row_sides, _split_rows


def _reshape(work: np.ndarray, base: np.ndarray, remote: np.ndarray | None,
             groups: list[list[int]], alloc: np.ndarray, machines: int,
             memo: dict | None = None, rounds: int = _RESHAPE_ROUNDS) -> np.ndarray:
    """``_refine`` with moves that change the number of groups, used when
    jobs have remote > 0. Each round: (1) every pair of groups is re-split
    (jobs and machines) as in ``_refine``; (2) every pair is merged into one
    group on their machines; (3) every group of at least two jobs and two
    machines is split into two sharing its machines (every split of up to
    _EXHAUSTIVE_PAIR jobs, else each job on its own); each move is made
    where it raises the pair's (or group's) share of U by more than 0.01% of
    M. Rounds stop when one changes nothing, or after ``rounds``. Groups
    (nearly) at full utilization are left alone, as in ``_refine``; the
    outcome of each look at a pair or group is kept in ``memo`` (keyed by
    job indices and machines: valid for every call on prefixes of the same
    job arrays and the same M), so a configuration another candidate
    already went through costs nothing. Updates ``groups`` in place (it may
    grow or shrink); returns the allocation.

    Decision: with COMM growing with DoP, a group on few machines pays
    little remote COMM, so good plans often hold small groups (or a few
    jobs together on one machine) that Algorithm 1's equal-DoP choice of
    n_G misses, and pair re-splits alone keep n_G and stall short of them.
    On the random instances of tests/test_sched_grouping.py (R = 0.5-1 x
    Tnet, 160 instances of 5-8 jobs) the worst plan was 0.93 of the prefix
    optimum with ``_refine`` on the three best n_G, 0.945 with ``_refine``
    on every n_G, and 0.996 with these moves on every n_G (``schedule``)."""
    return _reshape_all(work, base, remote, [(groups, alloc)], machines, memo, rounds)[0]


def _reshape_all(work: np.ndarray, base: np.ndarray, remote: np.ndarray | None,
                 plans: Sequence[tuple[list[list[int]], np.ndarray]], machines: int,
                 memo: dict | None = None, rounds: int = _RESHAPE_ROUNDS) -> list[np.ndarray]:
    """``_reshape`` of each (groups, alloc) of ``plans`` (groups updated in
    place; returns the allocations), run side by side so that the re-splits
    all of them look at are worked out together, in batches
    (``_best_splits``). Each plan goes through exactly ``_reshape``'s steps;
    a look's outcome depends on its key alone (``memo`` only caches), so
    the order in which looks are worked out changes nothing. Each round
    first asks for the re-splits of every pair as the groups stand (those
    that an earlier change in the round makes moot cost a little extra
    work, no change of outcome), then for any further one on its way."""
    looks = _Looks(work, base, remote, machines, {} if memo is None else memo)
    runs = [looks.reshape(groups, alloc, rounds) for groups, alloc in plans]
    out: list = [None] * len(runs)
    asks: dict[int, list[tuple]] = {}

    def advance(i: int) -> None:
        try:
            asks[i] = next(runs[i])
        except StopIteration as stop:
            out[i] = stop.value

    for i in range(len(runs)):
        advance(i)
    while asks:
        todo: dict = {}
        for i in sorted(asks):
            for ask in asks[i]:
                if ask[0] not in looks.memo:
                    todo.setdefault(ask[0], ask)
        looks.settle(list(todo.values()))
        for i in sorted(asks):
            del asks[i]
            advance(i)
    return out


class _Looks:
    """``_reshape``'s looks at groups of jobs (their values, and their best
    re-splits), cached in ``memo`` by job indices and machines."""

    def __init__(self, work: np.ndarray, base: np.ndarray, remote: np.ndarray | None,
                 machines: int, memo: dict) -> None:
        self.work, self.base, self.remote, self.machines, self.memo = \
            work, base, remote, machines, memo
        self.lists = (work.tolist(), base.tolist(), None if remote is None else remote.tolist())
        self.sums: dict = {}        # _best_splits' per job set sums

    def value(self, g: list[int], m: int) -> float:
        key = (tuple(g), m)
        v = self.memo.get(key)
        if v is None:
            v = self.memo[key] = _group_value_l(*self.lists, g, m)
        return v

    def settle(self, asks: list[tuple]) -> None:
        """Work out the re-splits ``asks`` (key, ga, ma_now, gb, mt, now):
        into ``memo`` the new split (jobs of A, jobs of B, machines of A) if
        it gains more than 0.01% of M, else None."""
        work, base, remote, machines = self.work, self.base, self.remote, self.machines
        single, batch = [], []
        for key, ga, ma_now, gb, mt, now in asks:
            u = ga + gb
            rows = _pair_rows(len(ga), len(gb)) if gb else _split_rows(len(u))
            (batch if remote is not None and mt > _ALL_SPLITS else single).append(
                (key, now, u, rows, mt, ma_now))
        if len(batch) < _BATCH_MIN:
            single += batch
            batch = []
        done = []
        for key, now, u, rows, mt, ma_now in single:
            if remote is not None and mt > _ALL_SPLITS and len(u) <= 3:
                work_l, base_l, remote_l = self.lists
                hit = _best_split_small(rows, [work_l[j] for j in u], [base_l[j] for j in u],
                                        [remote_l[j] for j in u], mt, ma_now)
            else:
                x = np.array(u)
                hit = _best_split(rows, work[x], base[x], None if remote is None else remote[x],
                                  mt, ma_now)
            done.append((key, now, u, rows, hit))
        if batch:
            hits = _best_splits([(rows, u, mt, ma_now) for *_, u, rows, mt, ma_now in batch],
                                work, base, remote, self.lists, self.sums)
            done += [(key, now, u, rows, hit)
                     for (key, now, u, rows, *_), hit in zip(batch, hits)]
        for key, now, u, rows, (v, i, ma) in done:
            a, b = _row_sides(rows)
            self.memo[key] = ([u[j] for j in a[i]], [u[j] for j in b[i]], ma) \
                if v > now + 1e-4 * machines else None

    def reshape(self, groups: list[list[int]], alloc: np.ndarray, rounds: int):
        """``_reshape`` as a generator: it yields the looks it needs next
        (lists of ``settle``'s asks), to be in ``memo`` when it resumes, and
        returns the allocation."""
        alloc_l = [int(x) for x in alloc]
        memo, value, machines = self.memo, self.value, self.machines
        for _ in range(rounds):
            changed = False
            for a in range(len(groups)):                 # (1) pair re-splits
                for b in range(a + 1, len(groups)):
                    ga, gb, mt = groups[a], groups[b], alloc_l[a] + alloc_l[b]
                    now = value(ga, alloc_l[a]) + value(gb, alloc_l[b])
                    if now >= mt * (1 - _REFINE_SKIP):
                        continue
                    key = ("split", tuple(ga), alloc_l[a], tuple(gb), mt)
                    if key not in memo:
                        yield [(key, ga, alloc_l[a], gb, mt, now)]
                    hit = memo[key]
                    if hit is not None:
                        groups[a], groups[b], alloc_l[a] = hit
                        alloc_l[b] = mt - alloc_l[a]
                        changed = True
            a = 0
            while a < len(groups):                       # (2) merges
                b = a + 1
                while b < len(groups):
                    ga, gb, mt = groups[a], groups[b], alloc_l[a] + alloc_l[b]
                    now = value(ga, alloc_l[a]) + value(gb, alloc_l[b])
                    if now < mt * (1 - _REFINE_SKIP) and \
                            value(ga + gb, mt) > now + 1e-4 * machines:
                        groups[a], alloc_l[a] = ga + gb, mt
                        del groups[b], alloc_l[b]
                        changed = True
                        continue
                    b += 1
                a += 1
            asks = []                                    # (3) splits, new groups last
            for g, mg in zip(groups, alloc_l):
                if len(g) >= 2 and mg >= 2:
                    now = value(g, mg)
                    if now < mg * (1 - _REFINE_SKIP):
                        asks.append((("split", tuple(g), mg // 2, (), mg), g, mg // 2, [], mg,
                                     now))
            yield asks
            for gi in range(len(groups)):
                g, mg = groups[gi], alloc_l[gi]
                if len(g) < 2 or mg < 2:
                    continue
                now = value(g, mg)
                if now >= mg * (1 - _REFINE_SKIP):
                    continue
                key = ("split", tuple(g), mg // 2, (), mg)
                if key not in memo:
                    yield [(key, g, mg // 2, [], mg, now)]
                hit = memo[key]
                if hit is not None:
                    groups[gi], new, alloc_l[gi] = hit
                    groups.append(new)
                    alloc_l.append(mg - alloc_l[gi])
                    changed = True
            if not changed:
                break
        return np.array(alloc_l, dtype=np.int64)
