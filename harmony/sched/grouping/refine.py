"""The refinements of a grouping: best re-splits of pairs of groups (exhaustive on small ones, batched on numpy), ``_refine``.

Part of :mod:`harmony.sched.grouping` (see its docstring)."""
from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from harmony.sched.model import CPU_WEIGHT
from harmony.sched.grouping.base import _ALL_SPLITS, _EXHAUSTIVE_PAIR, _REFINE_SKIP
from harmony.sched.grouping.evaluate import _group_value, _np_sum


@lru_cache(maxsize=None)
def _pair_rows(a: int, b: int) -> np.ndarray:
    """Candidate splits of the union of two groups (sizes a and b, the first
    a columns being group A) into two non-empty groups, as boolean rows
    (True = in A): every split when a + b <= _EXHAUSTIVE_PAIR, else the
    current one, every single move and every single swap."""
    s = a + b
    if s <= _EXHAUSTIVE_PAIR:
        masks = np.arange(1, 2 ** (s - 1))     # the last job always in B
        return _frozen(((masks[:, None] >> np.arange(s)) & 1).astype(bool))
    base = np.zeros(s, dtype=bool)
    base[:a] = True
    rows = [base]
    if a > 1:
        r = np.repeat(base[None, :], a, 0)
        r[np.arange(a), np.arange(a)] = False
        rows.extend(r)
    if b > 1:
        r = np.repeat(base[None, :], b, 0)
        r[np.arange(b), a + np.arange(b)] = True
        rows.extend(r)
    r = np.repeat(base[None, :], a * b, 0)
    ia, ib = np.divmod(np.arange(a * b), b)
    r[np.arange(a * b), ia] = False
    r[np.arange(a * b), a + ib] = True
    rows.extend(r)
    return _frozen(np.array(rows))


def _frozen(x: np.ndarray) -> np.ndarray:
    x.setflags(write=False)     # cached and shared: nobody may change it
    return x


@lru_cache(maxsize=None)
def _split_rows(n: int) -> np.ndarray:
    """Candidate splits of one group of ``n`` jobs in two (``_reshape``'s
    splits): every split up to _EXHAUSTIVE_PAIR jobs, else each job alone."""
    return _pair_rows(n - 1, 1) if n <= _EXHAUSTIVE_PAIR else _frozen(~np.eye(n, dtype=bool))


def _best_split(rows: np.ndarray, w: np.ndarray, n: np.ndarray, nr: np.ndarray | None,
                mt: int, m_now: int) -> tuple[float, int, int]:
    """Best (value, row, machines of A) over candidate splits ``rows`` of a
    job set sharing ``mt`` machines; ``n`` holds the jobs' base and ``nr``
    their remote (None: constant Tnet = n). Machine splits tried per row:
    the balance points of A (where COMP = COMM: work_A / m = base_A +
    remote_A * (1 - 1/m), m = (work_A + remote_A) / (base_A + remote_A);
    work_A / net_A for constant Tnet) and of B, their proportional split,
    and the current one. Each split is evaluated with Tnet at its DoP; with
    remote and at most _ALL_SPLITS machines, every split is tried."""
    wa, na = rows @ w, rows @ n
    wb, nb = w.sum() - wa, n.sum() - na
    if nr is not None and mt <= _ALL_SPLITS:
        return _best_split_all(rows, w, n, nr, mt, wa, na, wb, nb)
    if nr is None:
        ra = wa / np.maximum(na, 1e-12)
        rb = wb / np.maximum(nb, 1e-12)
    else:
        qa = rows @ nr
        qb = nr.sum() - qa
        ra = (wa + qa) / np.maximum(na + qa, 1e-12)
        rb = (wb + qb) / np.maximum(nb + qb, 1e-12)
    prop = mt * ra / np.maximum(ra + rb, 1e-12)
    ma = np.clip(np.stack([np.floor(ra), np.ceil(ra), mt - np.floor(rb), mt - np.ceil(rb),
                           np.floor(prop), np.ceil(prop), np.full_like(ra, m_now)]),
                 1, mt - 1)                          # (splits, rows)
    mb = mt - ma
    if nr is None:
        ja = np.where(rows, w / ma[:, :, None] + n, 0.0).max(2)
        jb = np.where(rows, 0.0, w / mb[:, :, None] + n).max(2)
    else:      # Tnet at each side's DoP, per job and summed
        fa, fb = 1.0 - 1.0 / ma, 1.0 - 1.0 / mb
        ja = np.where(rows, w / ma[:, :, None] + n + nr * fa[:, :, None], 0.0).max(2)
        jb = np.where(rows, 0.0, w / mb[:, :, None] + n + nr * fb[:, :, None]).max(2)
        na, nb = na + qa * fa, nb + qb * fb
    v = _pair_value(wa / ma, na, ja, ma) + _pair_value(wb / mb, nb, jb, mb)
    c, i = np.unravel_index(int(np.argmax(v)), v.shape)
    return float(v[c, i]), int(i), int(ma[c, i])


def _pair_value(cpu: np.ndarray, net: np.ndarray, top: np.ndarray, m: np.ndarray) -> np.ndarray:
    """m * score(U) of one side of a split: summed Tcpu ``cpu``, summed Tnet
    ``net``, longest job iteration ``top`` (Eq 4.1, 4.3), on ``m`` machines."""
    t = np.maximum(np.maximum(cpu, net), top)
    return (CPU_WEIGHT * cpu + (1 - CPU_WEIGHT) * net) * m / np.where(t > 0, t, 1.0)


def _best_split_all(rows: np.ndarray, w: np.ndarray, n: np.ndarray, nr: np.ndarray, mt: int,
                    wa: np.ndarray, na: np.ndarray, wb: np.ndarray, nb: np.ndarray
                    ) -> tuple[float, int, int]:
    """``_best_split`` with remote COMM trying every machine split 1..mt-1
    (the same for every row, so per-job times are computed once per split)."""
    ma = np.arange(1, mt, dtype=float)[:, None]          # (splits, 1)
    mb = mt - ma
    fa, fb = 1.0 - 1.0 / ma, 1.0 - 1.0 / mb
    qa = rows @ nr
    qb = nr.sum() - qa
    ta_job = (w / ma + n + nr * fa)[:, None, :]         # (splits, 1, jobs)
    tb_job = (w / mb + n + nr * fb)[:, None, :]
    ja = np.where(rows, ta_job, 0.0).max(2)              # (splits, rows)
    jb = np.where(rows, 0.0, tb_job).max(2)
    v = _pair_value(wa / ma, na + qa * fa, ja, ma) + _pair_value(wb / mb, nb + qb * fb, jb, mb)
    c, i = np.unravel_index(int(np.argmax(v)), v.shape)
    return float(v[c, i]), int(i), int(ma[c, 0])


def _best_split_small(rows: np.ndarray, w: list[float], n: list[float], nr: list[float],
                      mt: int, m_now: int) -> tuple[float, int, int]:
    """``_best_split`` with remote COMM and mt > _ALL_SPLITS for at most
    three jobs (lists ``w``, ``n``, ``nr``), the same result bit for bit, in
    plain Python: there numpy's per-call cost is nearly all of the time.
    Each side of a split of three jobs holds at most two, whose sum is the
    same in any order, so ``rows @ w`` is exact here; the totals are added
    left to right like numpy's ``sum`` of fewer than eight numbers.
    Everything else is ``_best_split``'s float operations, on the distinct
    (row, machines of A) only; ties go, as ``np.argmax`` over its (splits,
    rows) array, to the first candidate split, then the first row."""
    assert len(w) <= 3
    sw = sn = sq = 0.0
    for wj, nj, rj in zip(w, n, nr):
        sw += wj
        sn += nj
        sq += rj
    hi = mt - 1
    cw, nw = CPU_WEIGHT, 1 - CPU_WEIGHT
    side_a, side_b = _row_sides(rows)
    at_a: dict[int, list[float]] = {}     # machines -> each job's time on them
    at_b: dict[int, list[float]] = {}
    values = []                          # per row: {machines of A: value}
    cands = []                           # per row: the 7 candidate machines of A
    for ia, ib in zip(side_a, side_b):
        wa = na = qa = 0.0
        for j in ia:
            wa += w[j]
            na += n[j]
            qa += nr[j]
        wb, nb, qb = sw - wa, sn - na, sq - qa
        ra = (wa + qa) / max(na + qa, 1e-12)
        rb = (wb + qb) / max(nb + qb, 1e-12)
        prop = mt * ra / max(ra + rb, 1e-12)
        # clip(floor(x)) == floor(clip(x)) on [1, mt - 1], and clamping to
        # +-1e18 first keeps math.floor off infinities without changing it
        ra, rb, prop = (min(max(x, -1e18), 1e18) for x in (ra, rb, prop))
        cs = [min(max(c, 1), hi) for c in (math.floor(ra), math.ceil(ra), mt - math.floor(rb),
                                           mt - math.ceil(rb), math.floor(prop),
                                           math.ceil(prop), m_now)]
        cands.append(cs)
        vals: dict[int, float] = {}
        for ma in cs:
            if ma in vals:
                continue
            mb = mt - ma
            fa, fb = 1.0 - 1.0 / ma, 1.0 - 1.0 / mb
            ta = at_a.get(ma)
            if ta is None:
                ta = at_a[ma] = [wj / ma + nj + rj * fa for wj, nj, rj in zip(w, n, nr)]
            tb = at_b.get(mb)
            if tb is None:
                tb = at_b[mb] = [wj / mb + nj + rj * fb for wj, nj, rj in zip(w, n, nr)]
            cpu, net = wa / ma, na + qa * fa
            t = max(cpu, net, 0.0, *[ta[j] for j in ia])
            va = (cw * cpu + nw * net) * ma / (t if t > 0 else 1.0)
            cpu, net = wb / mb, nb + qb * fb
            t = max(cpu, net, 0.0, *[tb[j] for j in ib])
            vals[ma] = va + (cw * cpu + nw * net) * mb / (t if t > 0 else 1.0)
        values.append(vals)
    best, bi, bm = -math.inf, 0, 0
    for c in range(7):
        for i, (cs, vals) in enumerate(zip(cands, values)):
            v = vals[cs[c]]
            if v > best:
                best, bi, bm = v, i, cs[c]
    return best, bi, bm


@lru_cache(maxsize=None)
def _row_sides_cached(key: bytes, shape: tuple[int, int]) -> tuple[tuple, tuple]:
    rows = np.frombuffer(key, dtype=bool).reshape(shape)
    return (tuple(tuple(np.flatnonzero(r).tolist()) for r in rows),
            tuple(tuple(np.flatnonzero(~r).tolist()) for r in rows))


def _row_sides(rows: np.ndarray) -> tuple[tuple, tuple]:
    """Per row, the job positions in side A and in side B."""
    return _row_sides_cached(rows.tobytes(), rows.shape)


def _split_sums(rows: np.ndarray, u: list[int], work: np.ndarray, base: np.ndarray,
                remote: np.ndarray, lists: tuple[list[float], list[float], list[float]]
                ) -> tuple[tuple[float, float, float], list[tuple[float, float, float]]]:
    """For ``_best_splits``: the totals (work, base, remote) of jobs ``u``
    as ``w.sum()`` gives them, and per row of ``rows`` side A's sums as
    ``rows @ w`` gives them (on at most three jobs a side holds at most two,
    whose sum is the same in any order: added here in plain Python)."""
    work_l, base_l, remote_l = lists
    ws, ns, rs = [work_l[j] for j in u], [base_l[j] for j in u], [remote_l[j] for j in u]
    totals = (_np_sum(ws), _np_sum(ns), _np_sum(rs))
    if len(u) > 3:
        x = np.array(u)
        return totals, list(zip((rows @ work[x]).tolist(), (rows @ base[x]).tolist(),
                                (rows @ remote[x]).tolist()))
    row_sums = []
    for side in _row_sides(rows)[0]:
        wa = na = qa = 0.0
        for j in side:
            wa += ws[j]
            na += ns[j]
            qa += rs[j]
        row_sums.append((wa, na, qa))
    return totals, row_sums


@lru_cache(maxsize=None)
def _padded_cached(key: bytes, shape: tuple[int, int], width: int) -> np.ndarray:
    rows = np.frombuffer(key, dtype=bool).reshape(shape)
    out = np.zeros((shape[0], width), dtype=bool)
    out[:, :shape[1]] = rows
    return _frozen(out)


def _padded(rows: np.ndarray, width: int) -> np.ndarray:
    """``rows`` with False columns added up to ``width``."""
    return _padded_cached(rows.tobytes(), rows.shape, width)


def _best_splits(items: Sequence[tuple[np.ndarray, list[int], int, int]],
                 work: np.ndarray, base: np.ndarray, remote: np.ndarray,
                 lists: tuple[list[float], list[float], list[float]], cache: dict
                 ) -> list[tuple[float, int, int]]:
    """``_best_split(rows, work[u], base[u], remote[u], mt, m_now)`` for each
    item (rows, u, mt, m_now) with mt > _ALL_SPLITS and remote COMM, the
    same results bit for bit, with the work on the candidate machine splits
    done once for all items: numpy's per-call cost is most of the time on
    one pair's few rows. ``lists`` holds work, base and remote as lists;
    ``cache`` keeps ``_split_sums`` per job set and rows between calls on
    the same arrays.

    Every number comes from the same float operations as in
    ``_best_split``: an item's side-A sums are its own ``rows @ w``
    products (BLAS's summation order), except on at most three jobs, where
    a side holds at most two and any order gives the same sum; totals are
    added as numpy's ``sum`` does (``_np_sum``); the rest is elementwise.
    Jobs are padded to the largest item with zeros, which ``max`` ignores
    (every job time is >= 0); ties go, as ``np.argmax`` over the (splits,
    rows) array, to the first split, then the first row."""
    n_rows, sides, sums, padded, masks = [], [], [], [], []
    width = max(len(u) for _, u, _, _ in items)
    pad = len(work)
    for rows, u, mt, m_now in items:
        n_rows.append(len(rows))
        # what depends on the jobs alone (not on the machines) is kept in
        # ``cache``: the same job set comes back on other machine counts
        key = (tuple(u), id(rows))     # rows: from _pair_rows' cache, never freed
        got = cache.get(key)
        if got is None:
            got = cache[key] = _split_sums(rows, u, work, base, remote, lists)
        totals, row_sums = got
        sums.append((*totals, mt, m_now))
        sides.extend(row_sums)
        padded.append(u + [pad] * (width - len(u)))
        masks.append(_padded(rows, width))
    total = len(sides)
    item = np.repeat(np.arange(len(items)), n_rows)            # item of each row
    starts = np.cumsum(n_rows) - n_rows
    sw, sn, sq, mt, m_now = np.array(sums, dtype=float)[item].T
    wa, na, qa = np.array(sides).T
    wb, nb, qb = sw - wa, sn - na, sq - qa
    # each row's jobs, padded with zeros; in_a: side A, in_b: side B
    idx = np.array(padded)[item]
    w = np.append(work, 0.0)[idx]
    n = np.append(base, 0.0)[idx]
    nr = np.append(remote, 0.0)[idx]
    in_a = np.concatenate(masks)
    in_b = (idx != pad) & ~in_a
    # as _best_split from here on, elementwise over all rows at once
    ra = (wa + qa) / np.maximum(na + qa, 1e-12)
    rb = (wb + qb) / np.maximum(nb + qb, 1e-12)
    prop = mt * ra / np.maximum(ra + rb, 1e-12)
    ma = np.minimum(np.maximum(np.stack([np.floor(ra), np.ceil(ra), mt - np.floor(rb),
                                         mt - np.ceil(rb), np.floor(prop), np.ceil(prop),
                                         m_now]), 1), mt - 1)      # (splits, rows)
    mb = mt - ma
    fa, fb = 1.0 - 1.0 / ma, 1.0 - 1.0 / mb
    ja = np.where(in_a, w / ma[:, :, None] + n + nr * fa[:, :, None], 0.0).max(2)
    jb = np.where(in_b, w / mb[:, :, None] + n + nr * fb[:, :, None], 0.0).max(2)
    v = _pair_value(wa / ma, na + qa * fa, ja, ma) + _pair_value(wb / mb, nb + qb * fb, jb, mb)
    # per item, the first maximum in (split, row) order
    top = np.maximum.reduceat(v.max(0), starts)
    key = np.where(v == top[item], np.arange(len(v))[:, None] * total + np.arange(total),
                   len(v) * total).min(0)
    out = []
    for lo, f in zip(starts.tolist(), np.minimum.reduceat(key, starts).tolist()):
        c, r = divmod(f, total)
        out.append((float(v[c, r]), r - lo, int(ma[c, r])))
    return out


def _refine(work: np.ndarray, base: np.ndarray, remote: np.ndarray | None,
            groups: list[list[int]], alloc: np.ndarray, machines: int, rounds: int = 2
            ) -> np.ndarray:
    """Fine-tuning on the model itself (an extension; see ``schedule``): for
    every pair of groups, re-split their jobs and their machines the way that
    maximizes the pair's share of U (every split for small pairs, single
    moves and swaps for larger ones), until a round changes nothing or
    ``rounds`` rounds. A change must raise U by more than 0.01%.
    Updates ``groups`` in place; returns the new allocation."""
    alloc = alloc.copy()
    n_g = len(groups)
    # a pair is looked at again only when one of its groups changed since
    version = [0] * n_g
    seen: dict[tuple[int, int], tuple[int, int]] = {}
    for _ in range(rounds):
        changed = False
        for a in range(n_g):
            for b in range(a + 1, n_g):
                mt = int(alloc[a] + alloc[b])
                if mt < 2 or seen.get((a, b)) == (version[a], version[b]):
                    continue
                seen[(a, b)] = (version[a], version[b])
                ga, gb = groups[a], groups[b]
                now = _group_value(work[ga], base[ga], None if remote is None else remote[ga],
                                   alloc[a]) + \
                    _group_value(work[gb], base[gb], None if remote is None else remote[gb],
                                 alloc[b])
                if now >= mt * (1 - _REFINE_SKIP):
                    continue       # both groups (nearly) at 100%: little to gain
                u = np.array(groups[a] + groups[b])
                rows = _pair_rows(len(groups[a]), len(groups[b]))
                v, i, ma = _best_split(rows, work[u], base[u],
                                       None if remote is None else remote[u], mt, int(alloc[a]))
                if v > now + 1e-4 * machines:
                    groups[a], groups[b] = u[rows[i]].tolist(), u[~rows[i]].tolist()
                    alloc[a], alloc[b] = ma, mt - ma
                    version[a] += 1
                    version[b] += 1
                    seen[(a, b)] = (version[a], version[b])
                    changed = True
        if not changed:
            break
    return alloc
