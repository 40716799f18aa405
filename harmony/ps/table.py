"""A server shard's table: the rows of the model blocks one executor owns,
their keys, how a pull or a push finds them, and the blocks that moved in
by a live resize (kept as they arrived, merged off the request path).
:mod:`harmony.ps.server` serves it."""
from __future__ import annotations

import sys
import threading
import time
from typing import Callable

import numpy as np

from harmony.ps.keymap import block_of
from harmony.store.blocks import Block
from harmony.store.framing import release_scratch


class AppUpdateError(Exception):
    """The app's update function failed on the server."""


class NonFiniteUpdate(ValueError):
    """A push with NaN or infinite values, refused (App.finite_updates)."""


def first_duplicate(keys: np.ndarray) -> int | None:
    """A key that occurs twice in ``keys`` (None if all differ); O(n) when
    they are sorted, as clients send them."""
    if len(keys) < 2 or (np.diff(keys) > 0).all():
        return None
    s = np.sort(keys)
    dup = s[1:][s[1:] == s[:-1]]
    return int(dup[0]) if len(dup) else None


class ShardTable:
    """The rows of the keys a shard holds.

    Two parts: a *sorted table* (the keys in order, their rows in the same
    order; lookups by binary search) and the model blocks *moved* here
    since its last merge, each kept as it arrived (its own sorted keys and
    rows, the arrays of the transfer itself: a block is added in O(1) of
    its size, with no copy). A model block is a hashed key range
    (:func:`~harmony.ps.keymap.block_of`), so a lookup routes each key to
    the part holding its block in one vectorized pass; a moved block is
    checked on arrival (its keys are of its block, and no other part holds
    that block). The shard merges the moved blocks into the sorted table
    later, off the request path (:meth:`merge_step`, in steps between
    requests, from its thread when idle), or at once where the flat
    arrays are needed (:meth:`settle`; the :attr:`keys` and :attr:`rows`
    properties). A table that does not know its block count merges moved
    rows at the next lookup, as before blocks were kept."""

    #: bytes of rows a merge step moves at most (one step between requests)
    MERGE_STEP_BYTES = 8 << 20

    def __init__(self, dim: int, dtype: str,
                 update: Callable[[np.ndarray, np.ndarray], np.ndarray] | None,
                 finite: bool | None = None, nblocks: int | None = None) -> None:
        """``update=None`` means plain addition, applied in place. ``finite``:
        refuse pushes with NaN or infinite values (float models only);
        None: the app's ``finite_updates`` where ``update`` is an app's
        method, else True (App.finite_updates' default). ``nblocks``: the
        job's model block count (None: set by the shard's first layout)."""
        self.dim = dim
        self.dtype = np.dtype(dtype)
        self.update = update
        if finite is None:
            finite = bool(getattr(getattr(update, "__self__", None), "finite_updates", True))
        self.finite = finite and self.dtype.kind in "fc"
        self._keys = np.zeros(0, dtype=np.int64)
        self._rows = np.zeros((0, dim), dtype=self.dtype)
        self.nblocks = nblocks
        self.ready = False
        # re-entrant: the keys/rows properties merge under it, and callers
        # read them with it held
        self.lock = threading.RLock()
        # model spill (the block store's last resort): rows in LMDB, not here
        self._spill_store = None
        self.spilled = False
        self.spills = self.reloads = 0
        self.reload_s = 0.0
        self._chunks = 0
        # model blocks moved here, not merged: (block id or None, keys, rows)
        self._runs: list[tuple[int | None, np.ndarray, np.ndarray]] = []
        self._routed = True          # every run has a block id checked against nblocks
        self._route: np.ndarray | None = None     # block -> part (0: the sorted table)
        self._held: tuple | None = None           # (keys, nblocks, blocks the table holds)
        self._merge: _Merge | None = None         # a merge under way
        self._dirty: list[np.ndarray] = []        # keys pushed while it is
        self.merges = 0

    # -- the flat view -------------------------------------------------------------
    @property
    def keys(self) -> np.ndarray:
        """Every key held, sorted (moved blocks merged first)."""
        if self._runs:
            with self.lock:
                self.settle()
        return self._keys

    @keys.setter
    def keys(self, value: np.ndarray) -> None:
        self._keys = value

    @property
    def rows(self) -> np.ndarray | None:
        """The rows of :attr:`keys`, in order (None while spilled)."""
        if self._runs:
            with self.lock:
                self.settle()
        return self._rows

    @rows.setter
    def rows(self, value: np.ndarray | None) -> None:
        self._rows = value

    def live(self, rows: np.ndarray) -> bool:
        """``rows`` (a pull's answer) is the table's own memory, not a copy:
        the sorted table's rows, or a moved block's (pushes change both in
        place)."""
        return rows is self._rows or any(rows is r for _, _, r in self._runs)

    @property
    def moved_blocks(self) -> int:
        """Moved blocks not merged yet."""
        return len(self._runs)

    def load(self, keys: np.ndarray, rows: np.ndarray) -> None:
        order = np.argsort(keys, kind="stable")
        with self.lock:
            self._drop_merge()
            self._runs, self._routed, self._route = [], True, None
            self._keys = np.ascontiguousarray(keys[order], dtype=np.int64)
            self._rows = np.ascontiguousarray(np.asarray(rows, dtype=self.dtype)[order])
            if self._rows.shape != (len(self._keys), self.dim):
                raise ValueError(f"init rows have shape {self._rows.shape}, "
                                 f"expected {(len(self._keys), self.dim)}")
            self.ready = True
            self.spilled = False

    def set_blocks(self, nblocks: int) -> None:
        """The job's model block count (the shard's layout gives it)."""
        with self.lock:
            if nblocks == self.nblocks:
                return
            self.settle()            # moved blocks were routed by the old count
            self.nblocks = int(nblocks)
            self._route = self._held = None

    # -- moved blocks --------------------------------------------------------------
    def add_rows(self, keys: np.ndarray, rows: np.ndarray, block: int | None = None) -> None:
        """Rows of keys this shard did not hold: model block ``block`` moved
        here. Kept as they are (no copy where the arrays are writable and in
        order) until the next merge; checked first: the keys of a block,
        none held here already (ValueError)."""
        keys = np.asarray(keys, dtype=np.int64)
        rows = np.asarray(rows, dtype=self.dtype)
        if rows.shape != (len(keys), self.dim):
            raise ValueError(f"moved rows have shape {rows.shape}, expected "
                             f"{(len(keys), self.dim)}")
        if len(keys) > 1 and not (keys[1:] > keys[:-1]).all():
            order = np.argsort(keys, kind="stable")
            keys, rows = keys[order], rows[order]
            if (keys[1:] == keys[:-1]).any():
                raise ValueError("a moved block holds a key twice")
        if not (rows.flags.writeable and rows.flags.c_contiguous):
            rows = np.array(rows, order="C")     # pushes change them in place
        with self.lock:
            self._drop_merge()
            nb = self.nblocks
            if block is None or nb is None or not self._routed:
                # no block count to route by: merged at the next lookup
                self._runs.append((None, keys, rows))
                self._routed = False
                self._route = None
                return
            block = int(block)
            if not 0 <= block < nb:
                raise ValueError(f"moved block {block} is not one of the job's {nb} blocks")
            if len(keys) and (block_of(keys, nb) != block).any():
                raise ValueError(f"moved block {block} holds keys of other blocks")
            if any(b == block for b, _, _ in self._runs) or self._holds_blocks()[block]:
                raise ValueError(f"moved rows for keys this shard already holds "
                                 f"(block {block})")
            self._runs.append((block, keys, rows))
            self._route = None

    def _holds_blocks(self) -> np.ndarray:
        """Which blocks the sorted table holds keys of (bool per block)."""
        h = self._held
        if h is None or h[0] is not self._keys or h[1] != self.nblocks:
            held = np.zeros(self.nblocks, dtype=bool)
            if len(self._keys):
                held[block_of(self._keys, self.nblocks)] = True
            h = self._held = (self._keys, self.nblocks, held)
        return h[2]

    def _parts(self) -> list[tuple[np.ndarray, np.ndarray]]:
        return [(self._keys, self._rows)] + [(k, r) for _, k, r in self._runs]

    def _routing(self) -> np.ndarray:
        """Part of each block's keys: 0 the sorted table, i the i-th run."""
        if self._route is None:
            route = np.zeros(self.nblocks, dtype=np.int16 if len(self._runs) < 2**15
                             else np.int64)
            for i, (b, _, _) in enumerate(self._runs):
                route[b] = i + 1
            self._route = route
        return self._route

    @staticmethod
    def _find(tkeys: np.ndarray, keys: np.ndarray, whole: bool) -> np.ndarray | slice:
        """Positions of ``keys`` in the sorted ``tkeys`` (a slice where they
        are all of them, in order and ``whole`` allows it); KeyError naming
        keys not there."""
        n = len(tkeys)
        if len(keys) == 0:
            return np.zeros(0, dtype=np.int64)
        if whole and len(keys) == n and keys[0] == tkeys[0] and keys[-1] == tkeys[-1] \
                and np.array_equal(keys, tkeys):
            return slice(None)  # the whole table, in order: no gather needed
        idx = np.searchsorted(tkeys, keys)
        idx_c = np.minimum(idx, max(n - 1, 0))
        if n == 0 or not np.array_equal(tkeys[idx_c], keys):
            bad = keys[(idx >= n) | (tkeys[idx_c] != keys)] if n else keys
            raise KeyError(f"{len(bad)} key(s) not owned by this shard (e.g. {int(bad[0])})")
        return idx

    def _locate(self, keys: np.ndarray) -> list[tuple[int, np.ndarray | None,
                                                      np.ndarray | slice]]:
        """Where ``keys`` are: ``(part, positions in keys or None for all,
        positions in the part)``, one per part they are in (caller holds the
        lock). KeyError if any is not here."""
        if self._runs and not self._routed:
            self.settle()
        if not self._runs:
            return [(0, None, self._find(self._keys, keys, True))]
        parts = self._parts()
        if len(keys) == 0:
            return [(0, None, np.zeros(0, dtype=np.int64))]
        where = self._routing()[block_of(keys, self.nblocks)]
        first = where[0]
        if (where == first).all():
            return [(int(first), None, self._find(parts[first][0], keys, True))]
        order = np.argsort(where, kind="stable")
        counts = np.bincount(where, minlength=len(parts))
        out, s, bad = [], 0, []
        for p in np.flatnonzero(counts):
            pos = order[s:s + counts[p]]
            s += counts[p]
            try:
                # every key of a part, in order: a slice (no gather)
                out.append((int(p), pos, self._find(parts[p][0], keys[pos], True)))
            except KeyError:
                sub, tk = keys[pos], parts[p][0]
                bad.append(sub[~np.isin(sub, tk)])
        if bad:
            bad = np.concatenate(bad)
            raise KeyError(f"{len(bad)} key(s) not owned by this shard (e.g. {int(bad[0])})")
        return out

    def holds(self, keys: np.ndarray) -> np.ndarray:
        """For each key, whether this shard holds it (caller holds the lock)."""
        if self._runs and not self._routed:
            self.settle()
        if not self._runs:
            return np.isin(keys, self._keys)
        parts = self._parts()
        where = self._routing()[block_of(keys, self.nblocks)]
        out = np.zeros(len(keys), dtype=bool)
        for p in np.unique(where):
            sel = where == p
            out[sel] = np.isin(keys[sel], parts[p][0])
        return out

    # -- the merge -----------------------------------------------------------------
    def _drop_merge(self) -> None:
        self._merge = None
        self._dirty = []

    def _start_merge(self) -> "_Merge":
        """Plan a merge: the key space cut into ranges of about
        MERGE_STEP_BYTES of rows each (cut points from a sample of every
        part's keys), and where each range starts in every part (all
        sorted) and in the merged table."""
        self._ensure()
        parts = self._parts()
        n = sum(len(k) for k, _ in parts)
        row = max(1, self.dim * self.dtype.itemsize)
        ranges = max(1, -(-n * row // self.MERGE_STEP_BYTES))
        if ranges > 1:
            # every part's keys at every `every`-th position, each part's
            # from its own offset (parts are alike: hashed key ranges)
            every = max(1, n // (ranges * 64))
            sample = np.sort(np.concatenate([k[i * every // len(parts)::every]
                                             for i, (k, _) in enumerate(parts)]))
            cuts = np.unique(sample[(np.arange(1, ranges) * len(sample)) // ranges])
        else:
            cuts = np.zeros(0, dtype=np.int64)
        # at[p, j]: where range j starts in part p (the last column: its end)
        at = np.array([np.concatenate([[0], np.searchsorted(k, cuts), [len(k)]])
                       for k, _ in parts], dtype=np.int64)
        start = np.concatenate([[0], np.cumsum((at[:, 1:] - at[:, :-1]).sum(axis=0))])
        self._merge = _Merge(parts, at, start, np.empty(n, dtype=np.int64),
                             np.empty((n, self.dim), dtype=self.dtype))
        return self._merge

    def merge_step(self) -> bool:
        """One step of merging the moved blocks into the sorted table: the
        keys of one or more key ranges (about MERGE_STEP_BYTES of rows) from
        every part, sorted, and their rows copied in that order; returns
        whether more is left (caller holds the lock). ValueError for a key
        held twice (only where blocks were not routed: the moved rows are
        dropped, as the merge did before)."""
        if not self._runs:
            self._drop_merge()
            return False
        m = self._merge if self._merge is not None else self._start_merge()
        done = 0
        while m.next < len(m.start) - 1 and done < self.MERGE_STEP_BYTES:
            j = m.next
            lo, hi = m.at[:, j], m.at[:, j + 1]
            use = np.flatnonzero(hi > lo)
            if len(use):
                k = np.concatenate([m.parts[p][0][lo[p]:hi[p]] for p in use])
                order = np.argsort(k, kind="stable")      # sorted runs: a few merges
                k = k[order]
                if len(k) > 1 and not (k[1:] > k[:-1]).all():
                    self._runs, self._routed, self._route = [], True, None
                    self._drop_merge()
                    raise ValueError("moved rows for keys this shard already holds")
                a, b = m.start[j], m.start[j + 1]
                m.keys[a:b] = k
                _gather_rows(m.out[a:b], [m.parts[p][1][lo[p]:hi[p]] for p in use], order)
                done += (b - a) * m.out.itemsize * max(1, self.dim)
            m.next += 1
        if m.next < len(m.start) - 1:
            return True
        dirty = np.unique(np.concatenate(self._dirty)) if self._dirty else None
        vals = self.pull(dirty) if dirty is not None and len(dirty) else None
        self._keys, self._rows = m.keys, m.out
        self._runs, self._routed, self._route = [], True, None
        self._drop_merge()
        if vals is not None:      # pushed after their rows were copied: again
            self._rows[np.searchsorted(self._keys, dirty)] = vals
        self.merges += 1
        self.ready = True
        return False

    def settle(self) -> None:
        """Merge the moved blocks into the sorted table now (caller holds
        the lock)."""
        while self.merge_step():
            pass

    def take_blocks(self, blocks: set[int], num_blocks: int) -> dict[int, Block]:
        """Remove the rows of model ``blocks`` (moving away); returns them
        as one Block (keys + rows) per model block. A moved block not merged
        yet leaves as it came (no copy)."""
        with self.lock:
            self._ensure()
            self.set_blocks(num_blocks)
            if not self._routed:
                self.settle()
            self._drop_merge()
            out: dict[int, Block] = {}
            keep = []
            for b, k, r in self._runs:
                if b in blocks:
                    out[int(b)] = Block(int(b), {"keys": k, "rows": r})
                else:
                    keep.append((b, k, r))
            if len(keep) != len(self._runs):
                self._runs, self._route = keep, None
            rest = [b for b in blocks if b not in out]
            if not rest or not len(self._keys):
                for b in rest:
                    out[int(b)] = Block(int(b), {"keys": np.zeros(0, np.int64),
                                                 "rows": np.zeros((0, self.dim), self.dtype)})
                return out
            bids = block_of(self._keys, num_blocks)
            rest = np.sort(np.fromiter(rest, np.int64, len(rest)))
            gone = np.isin(bids, rest)
            sel = np.flatnonzero(gone)
            sel = sel[np.argsort(bids[sel], kind="stable")]    # by block, keys in order
            starts = np.searchsorted(bids[sel], rest)
            ends = np.searchsorted(bids[sel], rest, side="right")
            for b, s, e in zip(rest.tolist(), starts, ends):
                idx = sel[s:e]
                out[b] = Block(b, {"keys": self._keys[idx], "rows": self._rows[idx]})
            if len(sel):
                self._keys = np.ascontiguousarray(self._keys[~gone])
                self._rows = np.ascontiguousarray(self._rows[~gone])
            return out

    # -- model spill -------------------------------------------------------------
    def attach_spill(self, store) -> None:
        """Where :meth:`spill` puts the rows: a block store with ``put``/``get``
        (the job's LMDB ``model`` store)."""
        self._spill_store = store

    def spill(self, chunk_bytes: int = 4 << 20) -> int:
        """Write the rows to the spill store (in chunks of ~``chunk_bytes``)
        and drop them from memory; they come back on the next pull or push
        (or :meth:`restore`). The rows are mutable, so every spill writes
        them again. Moved blocks are merged first. Returns the bytes
        spilled (0 if nothing to do)."""
        with self.lock:
            if self._spill_store is None or not self.ready or self.spilled:
                return 0
            self.settle()
            rows = self._rows
            step = max(1, chunk_bytes // max(1, rows.itemsize * self.dim))
            n = 0
            for c, s in enumerate(range(0, max(len(rows), 1), step)):
                self._spill_store.put(Block(c, {"rows": rows[s:s + step]}))
                n += 1
            self._chunks = n
            release_scratch()
            self._rows = None
            self.spilled = True
            self.spills += 1
            return rows.nbytes

    def _ensure(self) -> None:
        """Reload spilled rows (caller holds the lock)."""
        if self.spilled:
            t0 = time.perf_counter()
            parts = [self._spill_store.get(c)["rows"] for c in range(self._chunks)]
            self._rows = parts[0] if len(parts) == 1 else np.concatenate(parts)
            self.spilled = False
            self.reloads += 1
            self.reload_s += time.perf_counter() - t0

    def restore(self) -> None:
        """Bring spilled rows back into memory (no-op if not spilled)."""
        with self.lock:
            self._ensure()

    def index(self, keys: np.ndarray) -> np.ndarray | slice:
        """Positions of ``keys`` in :attr:`keys` (KeyError for keys not here)."""
        if self._runs:
            self.settle()
        return self._find(self._keys, keys, True)

    def pull(self, keys: np.ndarray) -> np.ndarray:
        self._ensure()
        loc = self._locate(keys)
        parts = self._parts()
        if len(loc) == 1 and isinstance(loc[0][2], slice):
            return parts[loc[0][0]][1]          # the whole part, without a copy
        dup = first_duplicate(keys)
        if dup is not None:
            raise ValueError(f"duplicate keys in one pull (key {dup} more than once); "
                             f"pull each key once")
        if len(loc) == 1:
            p, _, idx = loc[0]
            return parts[p][1][idx]
        out = np.empty((len(keys), self.dim), dtype=self.dtype)
        for p, pos, idx in loc:
            out[pos] = parts[p][1][idx]
        return out

    def check_finite(self, keys: np.ndarray, deltas: np.ndarray) -> None:
        """Refuse non-finite deltas (one read of the deltas: about half the
        cost of the add it guards)."""
        if not self.finite or deltas.size == 0:
            return
        # the compiled loop where this process already runs numba (see
        # harmony.kernels.finite: never imported here, it would load numba)
        compiled = sys.modules.get("harmony.kernels.finite")
        ok = compiled.all_finite(deltas) if compiled is not None else None
        if ok or (ok is None and self._check_sum(deltas)):
            return
        self._refuse_nonfinite(keys, deltas)

    @staticmethod
    def _check_sum(deltas: np.ndarray) -> bool:
        """numpy's check: True where the deltas' sum proves them finite."""
        # a NaN or an infinity makes the sum NaN or infinite (IEEE arithmetic
        # never turns either back into a number), so a finite sum proves all
        # values finite: one read of the deltas, no temporary. The sum is in
        # the deltas' own type: asking numpy for a float64 sum of float32
        # casts through a buffer at ~1/4 of the memory speed (it cost twice
        # the add it guards: issue #34); types under 4 bytes are summed in
        # float32 (float16 overflows at 65504). A sum that overflows from
        # finite values falls through to the full check, and passes.
        acc = None if deltas.dtype.itemsize >= 4 else np.float32
        with np.errstate(over="ignore", invalid="ignore"):     # no warning: checked below
            total = np.add.reduce(deltas, axis=None, dtype=acc)
        return bool(np.isfinite(total))

    @staticmethod
    def _refuse_nonfinite(keys: np.ndarray, deltas: np.ndarray) -> None:
        """Raise NonFiniteUpdate naming the first bad key, if any value is
        not finite (the full, slow check: only for a push that failed the
        fast one)."""
        bad = ~np.isfinite(deltas)
        if not bad.any():
            return
        nbad = int(bad.sum())
        row = int(np.flatnonzero(bad.reshape(len(deltas), -1).any(axis=1))[0])
        raise NonFiniteUpdate(
            f"push refused: {nbad} of {deltas.size} values are not finite (nan or inf; the "
            f"first at key {int(keys[row])}): the app's updates diverged (lower its step "
            f"size), or set App.finite_updates = False to apply such updates")

    def push(self, keys: np.ndarray, deltas: np.ndarray) -> None:
        self.plan_push(keys, deltas)()

    def plan_push(self, keys: np.ndarray, deltas: np.ndarray) -> Callable[[], None]:
        """Everything a push does that can fail, and nothing that changes the
        table: every check (finite values, keys held, duplicates), the
        app's update computed; returns the write that applies it, which
        allocates nothing and cannot fail (caller holds the lock from here
        until it has run it: the shard acknowledges in between)."""
        self.check_finite(keys, deltas)
        self._ensure()
        loc = self._locate(keys)
        parts = self._parts()
        writes = []
        if len(loc) == 1:
            p, _, idx = loc[0]
            rows = parts[p][1]
            if not isinstance(idx, slice) and len(idx) > 1 and not (np.diff(idx) > 0).all() \
                    and len(np.unique(idx)) != len(idx):
                raise ValueError("duplicate keys in one push")
            if self.update is None and isinstance(idx, slice):
                writes.append(lambda: np.add(rows, deltas, out=rows))
            elif self.update is None:
                new = rows[idx]
                new += deltas
                writes.append(_put(rows, idx, new))
            else:
                cur = rows if isinstance(idx, slice) else rows[idx]
                writes.append(_put(rows, idx, self._updated(cur, deltas)))
        else:
            if first_duplicate(keys) is not None:
                raise ValueError("duplicate keys in one push")
            if self.update is None:
                for p, pos, idx in loc:
                    rows = parts[p][1]
                    if isinstance(idx, slice):      # the whole part: added in place
                        writes.append(_add(rows, np.ascontiguousarray(deltas[pos])))
                        continue
                    new = rows[idx]
                    new += deltas[pos]
                    writes.append(_put(rows, idx, new))
            else:       # one call of the app's update with every row, as for one part
                cur = np.empty((len(keys), self.dim), dtype=self.dtype)
                for p, pos, idx in loc:
                    cur[pos] = parts[p][1][idx]
                new = self._updated(cur, deltas)
                for p, pos, idx in loc:
                    writes.append(_put(parts[p][1], idx, np.ascontiguousarray(new[pos])))
        if self._merge is not None:
            self._dirty.append(np.array(keys, dtype=np.int64))

        def write() -> None:
            for w in writes:
                w()
        return write

    def _updated(self, cur: np.ndarray, deltas: np.ndarray) -> np.ndarray:
        new = self.update(cur, deltas)
        if not isinstance(new, np.ndarray) or new.shape != cur.shape:
            raise AppUpdateError(
                f"the app's update() returned {type(new).__name__} "
                f"{getattr(new, 'shape', '')}, expected an array of shape {cur.shape}")
        return new


def _add(rows: np.ndarray, deltas: np.ndarray) -> Callable[[], None]:
    """The write ``rows += deltas``, in place (same shape: no allocation)."""
    return lambda: np.add(rows, deltas, out=rows)


def _put(rows: np.ndarray, idx: np.ndarray | slice, new: np.ndarray) -> Callable[[], None]:
    """The write ``rows[idx] = new`` (same dtype and shape: no allocation)."""
    def put() -> None:
        rows[idx] = new
    return put


class _Merge:
    """A merge of moved blocks into the sorted table, under way: the parts
    (the sorted table's and each moved block's keys and rows), where each
    key range starts in each part (``at``) and in the merged table
    (``start``), the merged keys and rows so far, and the next range."""

    def __init__(self, parts: list, at: np.ndarray, start: np.ndarray, keys: np.ndarray,
                 out: np.ndarray) -> None:
        self.parts, self.at, self.start, self.keys, self.out = parts, at, start, keys, out
        self.next = 0


def _gather_rows(out: np.ndarray, srcs: list[np.ndarray], order: np.ndarray) -> None:
    """``out[:] = concatenate(srcs)[order]`` for rows: each source's rows
    written once to where they go, each row moved as one item (numpy's
    row-by-row copy of a 2-d array, and its take of such items, are several
    times slower)."""
    dest = np.empty(len(order), dtype=np.intp)
    dest[order] = np.arange(len(order), dtype=np.intp)
    rb = out.shape[1] * out.itemsize if out.ndim == 2 else 0
    void = rb and out.flags.c_contiguous and all(s.flags.c_contiguous for s in srcs)
    if void:
        t = np.dtype((np.void, rb))
        out = out.view(t).reshape(len(out))
    o = 0
    for s in srcs:
        out[dest[o:o + len(s)]] = s.view(t).reshape(len(s)) if void else s
        o += len(s)
