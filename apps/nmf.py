"""NMF: ratings M ~ L R with L, R >= 0, by alternating non-negative least
squares (``--solver als``, the default) or by SGD (``--solver sgd``).

The model on the parameter servers has one row per item (key = item id).
User factors L live with the input: every input block holds one hashed range
of users, their ratings and their rows of L, so a user's factors stay on the
machine that owns the user.

ALS (the default). Each epoch is one sweep of exact row solves with the
per-rating L2 of ``--lam`` (weighted-lambda regularization):

    L_u = argmin_{x >= 0} sum_i (x . R_i - r_ui)^2 + lam n_u |x|^2

and the same for every item with the user rows fixed. The row solve is the
unconstrained solution where that is already >= 0, else the exact active-set
NNLS on the normal equations (``nn_solve``; the compiled row loops are in
``harmony.kernels.nmf``). A user's solve needs only its own
ratings and the item rows, so it runs where the user lives. An item's solve
needs the normal equations ``S_i = sum_u L_u L_u'``, ``s_i = sum_u r_ui L_u``
over all its ratings, which the machines hold in parts: the servers keep
them. An item's row is ``[R0_i, S_i (upper triangle), s_i, q_i]`` (``q_i``:
the ratings in the sums; ``R0_i``: its initial factors, used until it has
sums), ``rank + rank(rank+1)/2 + rank + 1`` values. One COMP:

1. pull the rows, solve every pulled item ``R_i`` from ``S_i + lam q_i I``
   and ``s_i`` (``item_factors``; every machine solves the same sums to
   the same row);
2. solve every user of its blocks against those ``R``;
3. build its part ``A_i, b_i, c_i`` of each item's new sums from the new
   user rows and push ``A_i - w S_i``, ``b_i - w s_i``, ``c_i - w q_i``
   with ``w = c_i / n_i``, its share of the item's training ratings
   (``n_i`` is counted from the whole file, which every machine reads).

The servers add: the stored sums become ``sum_m A_i^m + (1 - sum_m w_m) S_i``,
and the shares of every rating's machine sum to 1, so that is exactly the new
sums, at any number of machines and after a resize (blocks carry their
ratings: the shares still sum to 1). The result is plain ALS (users, then
items, from the users just solved), the same on 1 or m machines up to the
float32 rounding of the stored sums. With ``--iters-per-epoch k > 1`` an
iteration replaces its blocks' share of the sums (proportionally: exact
when the sums are proportional to the counts) and converges alike. The
model is larger than SGD's (rank 16: 169 values per item against 17) and a
COMP builds a Gram matrix and solves a small system per row: rank^2 work
per rating against SGD's rank. With the compiled kernels a COMP took 2.6x
SGD's CPU time at rank 16 on 900k ratings (0.19 against 0.072 s; README,
"Kernels against compiled libraries"), in far fewer epochs.

SGD (``--solver sgd``). Each COMP runs mini-batch SGD over the iteration's
blocks against a local copy of the pulled item rows ``[R_i, G_i]`` and
pushes the change of those rows. It needs many more epochs on small or
skewed data (README, "NMF": 1.5-2x the reference's held-out RMSE after 40
epochs on a few hundred users, where ALS is within 2%).

What makes SGD converge on real-shaped data (MovieLens/Netflix: files sorted by
user, skewed activity, most users near the minimum count):

* every epoch visits each block's ratings in a fresh order, a permutation
  seeded by (seed, epoch, block): files sorted by user would otherwise give
  mini-batches of one or two users;
* a per-row adaptive step (AdaGrad with one accumulator per row): a row's
  step is ``lr / sqrt(eps + G)``, ``G`` the sum of the mean squared gradients
  of the row's updates so far. Heavy users and blockbusters take small steps,
  the long tail large ones, with no per-data-set tuning. A user's ``G`` lives
  in its input block next to its row of L (``gL``); an item's ``G`` is an
  extra column of its server row (``[R_i, G_i]``, ``rank + 1`` values);
* the schedule is AdaGrad's own ``1 / sqrt(sum of squared gradients)`` decay,
  whose steps sum to infinity (no stall), times ``--decay ** epoch`` (1 by
  default: an extra geometric decay stops progress after ~1 / (1 - decay)
  epochs).

SGD on several machines: ``--batch-size`` is the *global* mini-batch, as in MLR and
torch_mlp. On ``m`` machines each steps on ``batch_size / m`` of its own
ratings, so a machine takes as many SGD steps per epoch as one machine alone
and each step is one machine's share of a global step. This is what keeps
the math independent of the DoP. Measured with ``run_local(..., machines=m)``
(the in-process emulation of ``m`` machines) on MovieLens-shaped data: with
``batch_size`` ratings per *local* step the effective global batch was
``m * batch_size``, and test RMSE after 20 epochs was 0.274 / 0.290 / 0.327
at DoP 1 / 2 / 4. One machine with ``--batch-size 512`` / ``1024`` gives the
same numbers: a larger batch makes each step a simultaneous (Jacobi) update
of users and items on more ratings. With the global batch split, DoP 2 is
within seed noise of DoP 1 and DoP 4 trails by about two seed deviations;
``--iters-per-epoch 4`` closes that too (README, "NMF").

The SGD reducer (``combine_deltas``; ALS's is the plain sum): the mean of the
factor columns, the sum of the ``G`` column. Every rating belongs to one user, so to one machine. On
``m`` machines each machine's ratings of an item stand for the item's
ratings on all machines: in its local run each counts ``m`` times (its
gradient and its squared gradient in ``G``), so a machine moves an item row
as one machine would over all its ratings, and the servers *average* the
rows the machines reach. To first order (small moves) that is the 1-machine
step exactly. A *sum* of unscaled local moves is also right to first order
but was far worse (test RMSE 0.38 / 0.45 at DoP 2 / 4): a machine's users
then see its items move only ``1/m`` of the way and correct the rest of the
error themselves, and the items' summed move corrects it again. A mean
weighted by each machine's share of the item's ratings (with the local step
scaled by the inverse share) measured the same as the plain mean. ``G`` is a
sum over updates, so its column sums: each machine pushes its exact local
total.

The servers only add, for both solvers (``update`` is the default add,
applied in place; a clip there would make the result depend on the order of
the pushes). ALS's item rows are >= 0 by their solve. SGD: each machine pushes ``R_new - R`` with ``R_new >= 0``, so the mean of the pushes
keeps every stored row ``>= 0``: the projection is exact at any ``m``.

Input: text lines ``user item rating [timestamp]`` separated by whitespace,
commas or ``::`` (MovieLens/Netflix style), optionally gzip-compressed
(``.gz``). Lines starting with ``#`` or ``%`` are comments. Make data with
``harmony data gen nmf`` (``--activity zipf``: MovieLens-shaped;
``--zipf-exponent``, ``--order shuffled``).
"""
from __future__ import annotations

import gzip
import hashlib
import math

import numpy as np
from harmony.app import App, InputError, InputPart, ModelSpec, Option, Step
from harmony.kernels import nmf as knmf
from harmony.ps.keymap import keyed_uniform, mix64
from harmony.store.blocks import Block

CHUNK_LINES = 200_000
EPS = 1e-8               # AdaGrad's floor under the accumulated squared gradients
RIDGE_FLOOR = 1e-6       # ALS: L2 per rating always added (a row with fewer ratings than
#                          the rank stays solvable at --lam 0)
FACTOR_CACHE = 4         # ALS: item-factor solves kept by their rows' digest


def open_text(path: str):
    try:
        if path.endswith(".gz"):
            return gzip.open(path, "rt", encoding="utf-8", errors="strict")
        return open(path, "rt", encoding="utf-8", errors="strict")
    except OSError as exc:
        raise InputError(path, None, f"cannot open input: {exc.strerror or exc}") from None


#: user and item ids are stored as int64 keys and items index the model's
#: rows: at most this (the largest exact float64 integer range is far beyond)
MAX_ID = 2**31 - 2


def _parse_lines(lines: list[str], path: str, first: int) -> np.ndarray:
    """Parse ``user item rating`` lines into an (n, 3) float64 array."""
    flat: list[str] = []
    for off, line in enumerate(lines):
        s = line.strip()
        if not s or s[0] in "#%":
            continue
        p = s.replace("::", " ").replace(",", " ").split()
        if len(p) not in (3, 4):
            raise InputError(path, first + off,
                             f"expected 'user item rating', got {len(p)} field(s): {s[:60]!r}")
        flat += p[:3]
    try:
        arr = np.array(flat, dtype=np.float64).reshape(-1, 3)
    except ValueError:
        for off, line in enumerate(lines):  # slow path: find the culprit
            s = line.strip()
            if not s or s[0] in "#%":
                continue
            for field in s.replace("::", " ").replace(",", " ").split()[:3]:
                try:
                    float(field)
                except ValueError:
                    raise InputError(path, first + off, f"not a number: {field!r}") from None
        raise
    bad = ~np.isfinite(arr).all(axis=1) | (arr[:, 0] < 0) | (arr[:, 1] < 0) \
        | (arr[:, 0] > MAX_ID) | (arr[:, 1] > MAX_ID) \
        | (arr[:, 0] != np.floor(arr[:, 0])) | (arr[:, 1] != np.floor(arr[:, 1]))
    if bad.any():
        # map the first bad record back to its line number
        k = int(np.argmax(bad))
        seen = -1
        for off, line in enumerate(lines):
            s = line.strip()
            if s and s[0] not in "#%":
                seen += 1
                if seen == k:
                    raise InputError(path, first + off,
                                     f"user and item must be non-negative integers up to "
                                     f"{MAX_ID} and the rating finite: {s[:60]!r}")
    return arr


def iter_ratings(path: str, chunk_lines: int = CHUNK_LINES):
    """Yield (n, 3) float64 arrays of ratings, streaming the file in chunks."""
    with open_text(path) as fh:
        lineno = 1
        while True:
            try:
                lines = [ln for _, ln in zip(range(chunk_lines), fh)]
            except (UnicodeDecodeError, EOFError, OSError, gzip.BadGzipFile) as exc:
                raise InputError(path, None, f"unreadable input near line {lineno}: {exc}") from None
            if not lines:
                return
            yield _parse_lines(lines, path, lineno)
            lineno += len(lines)


def holdout_mask(users: np.ndarray, items: np.ndarray, frac: float, seed: int) -> np.ndarray:
    if frac <= 0:
        return np.zeros(len(users), dtype=bool)
    h = mix64((users.astype(np.uint64) << np.uint64(32)) ^ items.astype(np.uint64)
              ^ np.uint64(seed * 7919 + 1))
    return (h >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53)) < frac


def nn_solve(M: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Per row ``j``: ``argmin_{x >= 0} x' M_j x - 2 v_j' x`` (``M_j`` positive
    definite), i.e. the non-negative least squares of a row given its Gram
    matrix: the unconstrained solution where it is already >= 0, elsewhere
    the active-set NNLS on the normal equations (compiled:
    ``harmony.kernels.nmf``)."""
    x = np.empty(v.shape)
    knmf.nn_solve_many(np.ascontiguousarray(M, dtype=np.float64),
                       np.ascontiguousarray(v, dtype=np.float64), x)
    return x


def positions(keys: np.ndarray, items: np.ndarray) -> np.ndarray:
    """Row of each item in the sorted ``keys`` (every item is one of them):
    a lookup table over the item ids (1.5 ms against
    ``np.searchsorted``'s 57 ms on 900k ratings of 5,000 items)."""
    if len(items) == 0:
        return np.zeros(0, dtype=np.int64)
    table = np.zeros(int(keys[-1]) + 1, dtype=np.int64)
    table[keys] = np.arange(len(keys))
    return table[items]


class NMF(App):
    """Non-negative matrix factorization by ALS or SGD (ratings -> user/item factors)."""

    name = "nmf"
    static_keys = True    # keys(blocks) depends only on which blocks it gets
    mutable_input = ("L", "gL")   # user factors and their AdaGrad sums
    step_option = "lr"
    on_divergence = "fail"
    options = [
        Option("input", str, None, "ratings file: 'user item rating' lines (.gz ok)", required=True),
        Option("rank", int, 16, "factor rank"),
        Option("solver", str, "als", "'als': alternating non-negative least squares (exact "
               "per row; the servers keep each item's normal equations), or 'sgd': "
               "mini-batch SGD with per-row AdaGrad steps", choices=("als", "sgd")),
        Option("lr", float, 0.2, "sgd: AdaGrad step size (per row: lr / sqrt(sum of its "
               "squared gradients))"),
        Option("decay", float, 1.0, "sgd: extra step size multiplier per epoch (1: AdaGrad's "
               "own decay only)"),
        Option("lam", float, None, "L2 regularization, per rating (default: 0.01 with "
               "--solver als, 0.02 with sgd)"),
        Option("batch_size", int, 256, "sgd: global mini-batch: ratings per SGD step, split "
               "over the machines (each steps on batch_size / machines of its own)"),
        Option("holdout", float, 0.1, "fraction of ratings held out for test RMSE"),
    ]

    #: --lam when not given, per solver (measured: README, "NMF")
    DEFAULT_LAM = {"als": 0.01, "sgd": 0.02}

    def __init__(self, opts) -> None:
        super().__init__(opts)
        if opts.lam is None:
            opts.lam = self.DEFAULT_LAM[opts.solver]

    def read_input(self, part: InputPart):
        o = self.opts
        if o.rank < 1 or o.batch_size < 1 or not (0 <= o.holdout < 1) or o.lr <= 0 \
                or not (0 < o.decay <= 1) or o.lam < 0:
            raise InputError(o.input, None, "bad options: need rank>=1, batch_size>=1, "
                             "0<=holdout<1, lr>0, 0<decay<=1, lam>=0")
        with part.pieces() as per_block:   # block -> rating pieces, in bounded memory
            yield from self._blocks(part, per_block)

    def _blocks(self, part: InputPart, per_block):
        o = self.opts
        max_item, total, count = -1, 0.0, 0
        counts = []                 # training ratings per item, over the whole file (ALS)
        # ~100 bytes of memory per line while a chunk is parsed
        for arr in iter_ratings(o.input, max(1000, part.chunk_bytes(100 * CHUNK_LINES) // 100)):
            if len(arr) == 0:
                continue
            max_item = max(max_item, int(arr[:, 1].max()))
            total += float(arr[:, 2].sum())
            count += len(arr)
            if o.solver == "als":
                tr = ~holdout_mask(arr[:, 0].astype(np.int64), arr[:, 1].astype(np.int64),
                                   o.holdout, o.seed)
                counts.append(np.bincount(arr[tr, 1].astype(np.int64)))
            blocks = part.block_of(arr[:, 0].astype(np.int64))
            mine = part.owns(blocks)
            for b in np.unique(blocks[mine]):
                per_block.add(int(b), arr[blocks == b])
        if count == 0:
            raise InputError(o.input, None, "no ratings in input")
        dim = self._dim()
        planned = (max_item + 1) * (dim * 4 + 8)     # the model's rows and keys
        if planned > part.model_budget():
            raise InputError(o.input, None,
                             f"item ids up to {max_item} plan a model of {max_item + 1} rows x "
                             f"{dim * 4} bytes ({planned / 2**30:.1f} GiB with its "
                             f"keys), more than the {part.model_budget() / 2**30:.1f} GiB a "
                             f"model may take on this machine; are the ids right?"
                             + (f" (--solver als keeps {dim} values per item at rank "
                                f"{o.rank}; --solver sgd keeps {o.rank + 1})"
                                if o.solver == "als" else ""))
        self.num_items = max_item + 1
        if o.solver == "als":
            self.item_count = np.zeros(self.num_items, dtype=np.float64)
            for c in counts:
                self.item_count[:len(c)] += c
        self.mean_rating = max(total / count, 1e-3)
        self.scale = 2.0 * math.sqrt(self.mean_rating / o.rank)
        for b in sorted(per_block.keys()):
            arr = np.concatenate([p[0] for p in per_block.take(b)])
            users = arr[:, 0].astype(np.int64)
            items = arr[:, 1].astype(np.int64)
            ratings = arr[:, 2].astype(np.float32)
            test = holdout_mask(users, items, o.holdout, o.seed)
            uid = np.unique(users)
            L = (keyed_uniform(uid, o.rank, o.seed, salt=1) * self.scale).astype(np.float32)
            tr = ~test
            yield Block(b, {
                "uid": uid, "L": L, "gL": np.zeros(len(uid), dtype=np.float32),
                "u": np.searchsorted(uid, users[tr]), "i": items[tr], "r": ratings[tr],
                "tu": np.searchsorted(uid, users[test]), "ti": items[test], "tr": ratings[test],
            })

    def _dim(self) -> int:
        """sgd: ``[R_i, G_i]``; als: ``[R0_i, S_i (packed upper triangle), s_i, q_i]``."""
        k = self.opts.rank
        return k + 1 if self.opts.solver == "sgd" else k + k * (k + 1) // 2 + k + 1

    def model_spec(self) -> ModelSpec:
        return ModelSpec(num_keys=self.num_items, dim=self._dim())

    def init_rows(self, keys: np.ndarray) -> np.ndarray:
        k = self.opts.rank
        rows = np.zeros((len(keys), self._dim()), dtype=np.float32)
        rows[:, :k] = keyed_uniform(keys, k, self.opts.seed, salt=2) * self.scale
        return rows

    def item_factors(self, rows: np.ndarray) -> np.ndarray:
        """The item factors ``R`` (float64) of model rows. sgd: the rows' first
        ``rank`` columns. als: where the item has normal equations (``q > 0``),
        the non-negative solution of ``(S + lam q I) x = s``; elsewhere its
        initial row ``R0``. Depends on the rows and the options only (the
        export calls it on the client). The last few results are kept by
        the rows' digest: an epoch solves the same rows for its evaluation
        and the next COMP (measured: a third of an epoch at rank 32)."""
        k = self.opts.rank
        R = np.array(rows[:, :k], dtype=np.float64)
        if self.opts.solver == "sgd":
            return R
        rows = np.ascontiguousarray(rows)
        digest = (rows.shape, hashlib.blake2b(rows.view(np.uint8), digest_size=16).digest())
        cache = self.__dict__.setdefault("_factors", {})
        if digest in cache:
            return cache[digest].copy()
        P = k * (k + 1) // 2
        has = np.flatnonzero(rows[:, k + P + k] >= 0.5)
        knmf.solve_packed(rows, has, k, self.opts.lam + RIDGE_FLOOR, R)
        while len(cache) >= FACTOR_CACHE:
            del cache[next(iter(cache))]
        cache[digest] = R.copy()
        return R

    # update: the default add (commutative; the projection is in the deltas)

    def keys(self, blocks: list[Block]) -> np.ndarray:
        # one block at a time (disk-blocks are loaded while the loop runs):
        # a mask over the items instead of concatenating every block's items
        seen = np.zeros(self.num_items, dtype=bool)
        for b in blocks:
            seen[b["i"]] = True
            seen[b["ti"]] = True
        return np.flatnonzero(seen).astype(np.int64)

    def compute(self, blocks: list[Block], keys: np.ndarray, rows: np.ndarray,
                step: Step) -> np.ndarray:
        if self.opts.solver == "als":
            return self._compute_als(blocks, keys, rows)
        return self._compute_sgd(blocks, keys, rows, step)

    def _compute_als(self, blocks: list[Block], keys: np.ndarray,
                     rows: np.ndarray) -> np.ndarray:
        """One ALS sweep: every user of the blocks solved against the item
        factors of the pulled normal equations, then the items' normal
        equations rebuilt from the new user factors and pushed as the
        replacement of this machine's share of the stored ones (see the
        module docstring)."""
        o = self.opts
        k = o.rank
        P = k * (k + 1) // 2
        R = self.item_factors(rows)
        A = np.zeros((len(keys), P))
        b = np.zeros((len(keys), k))
        c = np.zeros(len(keys))
        for blk in blocks:
            ii = positions(keys, blk["i"])
            knmf.als_users(blk["u"], ii, blk["r"], R, o.lam + RIDGE_FLOOR, blk["L"])
            knmf.als_item_sums(ii, blk["u"], blk["r"], blk["L"], A, b, c)
        total = self.item_count[keys]
        w = np.divide(c, total, out=np.zeros(len(keys)), where=total > 0)[:, None]
        out = np.zeros_like(rows)
        out[:, k:k + P] = A - w * rows[:, k:k + P]
        out[:, k + P:k + P + k] = b - w * rows[:, k + P:k + P + k]
        out[:, k + P + k] = c - w[:, 0] * rows[:, k + P + k]
        return out

    def _compute_sgd(self, blocks: list[Block], keys: np.ndarray, rows: np.ndarray,
                     step: Step) -> np.ndarray:
        o = self.opts
        k = o.rank
        R = np.array(rows[:, :k], dtype=np.float32)
        G0 = rows[:, k]
        GR = np.array(G0, dtype=np.float32)
        # on m machines a local rating of an item stands for m of them: its
        # gradient and squared gradient count m times (G is pushed exactly)
        m = np.float32(step.machines)
        scale_r = np.float32(step.machines / k)
        lr = np.float32(o.lr * o.decay ** step.epoch)
        lam, eps, inv_k = np.float32(o.lam), np.float32(EPS), np.float32(1.0 / k)
        bs = max(1, round(o.batch_size / step.machines))   # the global batch, split
        for blk in blocks:
            L, GL = blk["L"], blk["gL"]
            n = len(blk["r"])
            perm = np.random.default_rng([o.seed % 2**63, step.epoch, blk.id, 41]).permutation(n)
            knmf.sgd_sweep(blk["u"][perm], positions(keys, blk["i"])[perm], blk["r"][perm],
                           L, GL, R, GR, bs, lr, lam, eps, inv_k, scale_r, m)
        out = np.empty_like(rows)
        np.subtract(R, rows[:, :k], out=out[:, :k])
        np.subtract(GR, G0, out=out[:, k])
        out[:, k] *= np.float32(1.0 / step.machines)
        return out

    def combine_deltas(self, keys: np.ndarray, deltas: np.ndarray, machines: int) -> np.ndarray:
        """The app's reducer. sgd: the mean of the factor columns, the sum of
        the adaptive-step column; als: the sum (each machine pushes its share
        of the replacement; see the module docstring)."""
        if machines > 1 and self.opts.solver == "sgd":
            deltas[:, :self.opts.rank] *= np.float32(1.0 / machines)
        return deltas

    def objective(self, blocks: list[Block], keys: np.ndarray, rows: np.ndarray) -> dict:
        rows = self.item_factors(rows).astype(np.float32)
        sse = tsse = l2 = 0.0
        n = tn = 0
        for blk in blocks:
            L = blk["L"]
            for u, i, r, test in ((blk["u"], blk["i"], blk["r"], False),
                                  (blk["tu"], blk["ti"], blk["tr"], True)):
                e = knmf.squared_error(L, rows, u, positions(keys, i), r)
                if test:
                    tsse, tn = tsse + e, tn + len(r)
                else:
                    sse, n = sse + e, n + len(r)
            l2 += float(np.vdot(L, L))
        return {"sse": sse, "n": n, "test_sse": tsse, "test_n": tn, "l2_L": l2}

    def model_objective(self, keys: np.ndarray, rows: np.ndarray) -> dict:
        R = self.item_factors(rows).astype(np.float32)
        return {"l2_R": float(np.vdot(R, R))}

    # -- export (harmony model get) -------------------------------------------------
    export_input_arrays = ("uid", "L")    # a final checkpoint keeps only these of a block

    def export(self, keys: np.ndarray, rows: np.ndarray, meta: dict) -> dict:
        """Item factors ``R`` (items x rank): row ``i`` is item ``i``, and a
        rating is predicted as ``L[u] @ R[i]`` (sgd: the AdaGrad column is left
        out; als: solved from each item's normal equations, see
        ``item_factors``)."""
        return {"R": np.ascontiguousarray(self.item_factors(rows).astype(np.float32)),
                "item_ids": keys}

    def export_inputs(self, blocks: list[Block], meta: dict) -> dict:
        """User factors ``L`` (users x rank), row ``j`` for user
        ``user_ids[j]`` (sorted): they live in the input blocks."""
        k = self.opts.rank
        uid = np.concatenate([b["uid"] for b in blocks] + [np.zeros(0, np.int64)])
        L = np.concatenate([b["L"] for b in blocks] + [np.zeros((0, k), np.float32)])
        order = np.argsort(uid, kind="stable")
        return {"user_ids": uid[order], "L": L[order]}

    def metrics(self, s: dict) -> dict:
        lam = self.opts.lam
        out = {"objective": s.get("sse", 0.0) + lam * (s.get("l2_L", 0.0) + s.get("l2_R", 0.0)),
               "rmse": math.sqrt(s["sse"] / s["n"]) if s.get("n") else math.nan}
        if s.get("test_n"):
            out["test_rmse"] = math.sqrt(s["test_sse"] / s["test_n"])
        return out
