"""LDA by collapsed Gibbs sampling (word-topic counts on the servers).

Model and placement
-------------------
The servers hold the word-topic counts: one row per word (key = word id,
``--topics`` columns) plus the topic totals ``n_k`` in extra keys ``W ..
W+R-1`` (``W`` = vocabulary size): ``n_k`` is split over R = min(64,
--blocks) rows, block b adding to row W + b mod R, so that no single count
comes near 2^24 even on PubMed (730 M tokens). Counts are float32 and exact
(integers below 2^24); a COMP that would cross 2^24 fails the job with a
clear error instead of drifting. Documents are hashed to input blocks by document id; a block
holds its documents' tokens and their topic assignments ``z`` and lives only
on the machine that owns it. Document-topic counts are rebuilt from ``z``
when a block is sampled, so nothing else is stored per document.

One COMP samples every token of its blocks once against the pulled
word-topic rows (a stale snapshot, as in AD-LDA, Bösen and Petuum: the
standard distributed approximation) and pushes the count deltas (new - old
assignments, exact integers); the servers' default additive update applies
them. Within one COMP the blocks are sampled one after another and each
block's changes are applied to the local copy of the rows before the next
block, so one machine's blocks see each other's updates at once.

Initialization (``--init``): ``random`` (default) gives every token a
uniform random topic at its block's first COMP, whose counts are pushed with
that COMP's changes; ``progressive`` leaves tokens unassigned and samples
their first topic against the counts made so far. Progressive starts lower
but, measured on generated data (5,000 documents, 20 topics), ends 2-3%
worse in log-likelihood after 20 epochs, so random is the default.

Sampler
-------
The conditional for token i of document d and word w is

    p(z_i = k) ∝ (n_dk^-i + alpha) (n_wk^-i + beta) / (n_k^-i + W beta).

It is evaluated for a batch of tokens (a few thousand, see below) at a
time, every token of the batch against the counts as they were at the
batch's start (its own assignment taken out): the float32 products
``(n_dk + alpha) (n_wk + beta) / (n_k + W beta)`` summed over topics in
order, one uniform per token scaled by the total, the first topic whose
prefix sum reaches it (inverse CDF); then the batch's count changes are
applied. O(K) work per token, in one compiled loop
(``harmony.kernels.lda``, numba). Until issue #36 the same arithmetic ran
as numpy over a topics x batch matrix (gathers, a cache-blocked transpose,
one vectorized add per topic row, a vectorized binary search); the kernel
gives bit-identical topics and counts. COMP per core, 450k training
tokens, 5,000 documents (``bench/apps_kernels.py`` data): 5.5-6.5 M ->
10-11 M tokens/s at K = 20, 2.6-2.8 M -> 5.1 M at K = 100; the held-out
fold-in 3x faster.

Why not SparseLDA or alias sampling: both are O(nonzeros) or O(1) per token
but sequential per token, which in plain Python was far slower than the
vectorized dense sampler. Measured before the kernel (one core; K = 100,
500 documents, Zipf vocabulary of 50,000 words, 10^5 tokens):

    ==============================================  ===========================
    sampler                                         tokens/s (one core)
    ==============================================  ===========================
    SparseLDA buckets s/r/q, Python per token       110 k (random state),
                                                    230 k (sparse state)
    alias tables + MH (LightLDA cycle), Python      40 k - 60 k
    the vectorized dense inverse-CDF sampler        13.7 M (K=20), 2.5-3.3 M
                                                    (K=100), 0.6 M (K=500),
                                                    0.16-0.18 M (K=1000)
    ==============================================  ===========================

Compiled, a sparse sampler is no longer held back by Python: at K of a few
hundred and more, with converged (sparse) counts, SparseLDA's buckets in a
kernel would be the next step.

Relaxation of sequential dependence: tokens of one batch are sampled
simultaneously from the same counts (the counts are then updated before
the next batch). To keep this close to a sequential sweep, a block's tokens
are ordered once at load time so that every batch takes an evenly spread
slice of every document (stratified by position in the document); each
batch then holds only a few tokens of any one document and any one
document's counts move little between batches (a block has at least
``MIN_BATCHES`` batches). Within a batch, tokens are sorted by word (better
gather locality). The topic totals in the denominator are held fixed while
one block is sampled (they move by a tiny fraction; each token's own
assignment is still excluded exactly). This is the same kind
of delayed update as WarpLDA's, and much milder. Measured (5,000 documents,
20 topics, objective after 18 epochs, lower is better): one batch per block
(fully simultaneous) 6.70, the default (>= 8 batches per block) 6.51,
batches of 256 tokens 6.55; with batches of 1 token the sampler is the
exact sequential collapsed Gibbs sampler and its trajectories match a
plain per-token reference implementation. Sampling is deterministic
given (seed, epoch, iteration, block id): every block draws from its own
``SeedSequence``; no global RNG state is used, and only elementwise numpy
operations (no reductions whose order could depend on memory alignment)
feed the sampling decisions.

Input
-----
UCI bag-of-words (``docword.*.txt``: lines D, W, NNZ, then ``docID wordID
count``, 1-based; gzip optional), read streaming in chunks (see
:mod:`harmony.formats.uci_bow`); each machine keeps only the entries of its
own blocks. ``--vocab vocab.*.txt`` (one word per line) is used to log the
top words per topic at the end. Make data with ``harmony data gen lda``.

Reported per epoch
------------------
``objective``: the negative collapsed log joint per training token,
-log p(w, z) / N (Griffiths & Steyvers 2004; Mallet's "LL/token" negated):
lower is better, so ``--target-objective`` works as usual.
``loglik_per_token`` = -objective. ``perplexity``: held-out perplexity by
*document completion* (Wallach et al. 2009): a ``--holdout`` fraction of
documents (hashed by id) is left out of training; each held-out document's
tokens are split at random into an observed half and an evaluated half;
theta_d is estimated from the observed half by Gibbs sampling against the
current word-topic counts held fixed (fold-in; the chains persist across
epochs and run ``--fold-in-sweeps`` sweeps per epoch, theta averaged over
them), and the perplexity is exp(-sum log sum_k theta_dk phi_wk / N) over
the evaluated half, with phi_wk = (n_wk + beta) / (n_k + W beta).
"""
from __future__ import annotations

import logging
import math

import numpy as np
from scipy.special import gammaln

from harmony.app import App, AppError, InputError, InputPart, ModelSpec, Option, Step
from harmony.formats.uci_bow import CHUNK_BYTES, DocwordReader, read_vocab
from harmony.kernels import lda as klda
from harmony.ps.keymap import mix64
from harmony.store.blocks import Block

log = logging.getLogger("harmony.app.lda")

TOTAL_ROWS = 64         # topic totals n_k are split over min(this, blocks) server rows
_EXACT = float(1 << 24)  # float32 holds integer counts exactly below this
MAX_BATCH = 16384       # tokens per sampling batch (upper bound)
MIN_BATCHES = 8         # batches per block (keeps the within-block relaxation mild)
_TINY = np.float32(1e-30)
_ONE = np.float32(1.0)
# RNG stream salts
_S_ORDER, _S_SPLIT, _S_TRAIN, _S_FOLD = 1, 2, 3, 4


def rng_for(seed: int, *parts: int) -> np.random.Generator:
    """A generator that depends only on (seed, parts): no global state."""
    return np.random.default_rng(np.random.SeedSequence(
        [int(seed) % (1 << 64)] + [int(p) % (1 << 64) for p in parts]))


def heldout_docs(doc_ids: np.ndarray, frac: float, seed: int) -> np.ndarray:
    """Which documents are held out: a hash of (doc id, seed) below ``frac``."""
    if frac <= 0:
        return np.zeros(len(doc_ids), dtype=bool)
    h = mix64(np.asarray(doc_ids).astype(np.uint64) ^ np.uint64((seed * 0x9E3779B1 + 77)
                                                                  % (1 << 64)))
    return (h >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53)) < frac


def batch_size(topics: int, tokens: int) -> int:
    """Tokens per sampling batch: about 8 MB of float32 per batch matrix
    (2048..16384 tokens; fewer, larger batches amortize the per-topic numpy
    calls), and at least MIN_BATCHES batches per block."""
    b = min(MAX_BATCH, max(2048, (1 << 21) // max(topics, 1)))
    return int(max(1, min(b, -(-tokens // MIN_BATCHES))))


def order_tokens(td: np.ndarray, tw: np.ndarray, ndocs: int, batch: int,
                 rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Sampling order of a block's tokens (``td`` sorted by document) and the
    batch bounds: every batch takes an evenly spread slice of every document
    (key = (rank in document + U_d) / length, U_d uniform per document), and
    each batch is sorted by word."""
    n = len(td)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(1, np.int64)
    lens = np.bincount(td, minlength=ndocs)
    starts = np.zeros(ndocs, np.int64)
    np.cumsum(lens[:-1], out=starts[1:])
    rank = np.arange(n, dtype=np.int64) - starts[td]
    key = (rank + rng.random(ndocs)[td]) / lens[td]
    perm = np.argsort(key, kind="stable")
    bid = np.arange(n, dtype=np.int64) // batch
    perm = perm[np.lexsort((tw[perm], bid))]
    bounds = np.append(np.arange(0, n, batch, dtype=np.int64), n)
    return perm, bounds


def topic_counts(rows_of_token: np.ndarray, z: np.ndarray, nrows: int, k: int) -> np.ndarray:
    """(nrows, k) int64 counts of assigned tokens (z >= 0) per (row, topic)."""
    m = z >= 0
    idx = rows_of_token[m].astype(np.int64) * k + z[m]
    return np.bincount(idx, minlength=nrows * k).reshape(nrows, k)


class Workspace:
    """Reused buffers of the batch sampler: the new topics of a batch."""

    def __init__(self, topics: int, batch: int) -> None:
        self.K, self.B = topics, batch
        self.new = np.empty(batch, np.int64)


def gibbs_sweep(td: np.ndarray, tw: np.ndarray, z: np.ndarray, ndka: np.ndarray,
                bw: np.ndarray, inv: np.ndarray, bounds: np.ndarray,
                rng: np.random.Generator, ws: Workspace, learn: bool) -> None:
    """One sweep over tokens (doc ``td``, word ``tw``, topic ``z``; -1 =
    unassigned), batch by batch, updating ``z`` and the counts in place
    (compiled: ``harmony.kernels.lda.gibbs_sweep``).

    ``ndka``: (docs, K) n_dk + alpha. ``bw``: (words, K) word factor
    (n_wk + beta) * inv when ``learn`` (the tokens are in those counts and
    are moved), or fixed phi_wk when not (fold-in). ``inv``: (K,) float32
    1 / (n_k + W beta), fixed during the sweep (a token's own assignment is
    still taken out of its n_k exactly).
    """
    u_all = rng.random(len(z), dtype=np.float32)
    klda.gibbs_sweep(td, tw, z, ndka, bw, np.ascontiguousarray(inv, dtype=np.float32),
                     bounds, u_all, learn, _TINY, ws.new)


class _LogGammaSum:
    """sum(lgamma(n + c) - lgamma(c)) over non-negative integer counts, by
    table lookup for small counts."""

    def __init__(self, c: float, size: int = 1 << 16) -> None:
        self.c, self.size = c, size
        self.table = gammaln(np.arange(size, dtype=np.float64) + c) - gammaln(c)

    def __call__(self, counts: np.ndarray) -> float:
        x = np.asarray(counts).reshape(-1)
        x = x[x > 0].astype(np.int64)
        small = x < self.size
        s = float(self.table[x[small]].sum())
        if not small.all():
            big = x[~small].astype(np.float64)
            s += float((gammaln(big + self.c) - gammaln(self.c)).sum())
        return s


def phi_from_counts(model: np.ndarray, beta: float, num_words: int) -> np.ndarray:
    """Topic-word distributions (K x W) from the server rows (the W word
    rows first, then the topic-totals rows)."""
    nwk = np.asarray(model[:num_words], dtype=np.float64)
    w = nwk.shape[0]
    return ((nwk + beta) / (nwk.sum(axis=0) + w * beta)).T


def top_words(phi: np.ndarray, vocab: list[str] | None, n: int = 10,
              words: np.ndarray | None = None) -> list[str]:
    """One line per topic: its ``n`` most probable words. ``phi`` is K x
    len(words) (``words``: their ids, default 0..)."""
    out = []
    ids = np.arange(phi.shape[1]) if words is None else np.asarray(words)
    for k in range(phi.shape[0]):
        top = np.argsort(-phi[k], kind="stable")[:n]
        names = [vocab[int(ids[i])] if vocab else str(int(ids[i]) + 1) for i in top]
        out.append(f"topic {k:3d}: " + " ".join(names))
    return out


def fold_in_theta(td, tw, z, ndocs, phi_rows, alpha, bounds, sweeps, rng, ws):
    """theta (ndocs x K) of documents from their tokens by Gibbs sampling
    against fixed ``phi_rows`` (len(words) x K), averaged over ``sweeps``
    sweeps; ``z`` (the chains) is updated in place."""
    k = phi_rows.shape[1]
    ndka = topic_counts(td, z, ndocs, k).astype(np.float32) + np.float32(alpha)
    nd = np.bincount(td, minlength=ndocs).astype(np.float64)[:, None] + k * alpha
    theta = np.zeros((ndocs, k))
    dummy = np.ones(k, np.float32)
    for _ in range(sweeps):
        gibbs_sweep(td, tw, z, ndka, phi_rows, dummy, bounds, rng, ws, learn=False)
        theta += ndka / nd
    return theta / max(sweeps, 1)


def heldout_perplexity(phi: np.ndarray, doc: np.ndarray, word: np.ndarray, count: np.ndarray,
                       alpha: float, sweeps: int = 30, burn_in: int = 10, seed: int = 0) -> float:
    """Document-completion perplexity of a topic model ``phi`` (K x W, rows
    sum to 1) on documents given as entries (doc, word, count; 0-based):
    each document's tokens are split at random in halves; theta is
    estimated on one half by Gibbs fold-in against ``phi`` (``sweeps``
    sweeps, the average after ``burn_in``), the other half is scored.
    The same split (``seed``) for any ``phi``, so models can be compared."""
    k = phi.shape[0]
    rng = rng_for(seed, 0xE7A1)
    docs_u, dl = np.unique(doc, return_inverse=True)
    order = np.argsort(dl, kind="stable")
    dl, wg, cnt = dl[order], np.asarray(word)[order], np.asarray(count)[order]
    td = np.repeat(dl, cnt)
    twg = np.repeat(wg, cnt)
    obs = rng.random(len(td)) < 0.5
    words_u, tw = np.unique(twg, return_inverse=True)
    phi_rows = np.ascontiguousarray(phi[:, words_u].T, dtype=np.float32)
    otd, otw = td[obs], tw[obs]
    bsz = batch_size(k, len(otd))
    perm, bounds = order_tokens(otd, otw, len(docs_u), bsz, rng)
    otd, otw = otd[perm].astype(np.int32), otw[perm].astype(np.int32)
    z = np.full(len(otd), -1, np.int32)
    ws = Workspace(k, bsz)
    ndocs = len(docs_u)
    if burn_in:
        fold_in_theta(otd, otw, z, ndocs, phi_rows, alpha, bounds, burn_in, rng, ws)
    theta = fold_in_theta(otd, otw, z, ndocs, phi_rows, alpha, bounds,
                          max(1, sweeps - burn_in), rng, ws)
    etd, etw = td[~obs], tw[~obs]
    p = np.einsum("ij,ij->i", theta[etd], phi_rows[etw].astype(np.float64))
    return float(np.exp(-np.log(p).sum() / max(len(p), 1)))


class LDA(App):
    """Latent Dirichlet allocation by collapsed Gibbs sampling (UCI bag-of-words input)."""

    name = "lda"
    static_keys = True    # keys(blocks) depends only on which blocks it gets
    mutable_input = ("z", "hz")   # topic assignments (training, held-out)
    # sum: the deltas are exact integer count changes of this machine's tokens
    # (each token lives on one machine), so the sum is the 1-machine count table
    combine = "sum"
    # a Gibbs sampler has no step size, and its log joint may wander up a
    # little once converged: a long rise is reported, not fatal
    on_divergence = "warn"
    options = [
        Option("input", str, None, "UCI docword file: D, W, NNZ header lines, then "
               "'docID wordID count' lines (.gz ok)", required=True),
        Option("vocab", str, None, "UCI vocab file (one word per line) to log top words"),
        Option("topics", int, 20, "number of topics K"),
        Option("alpha", float, 0.1, "symmetric Dirichlet prior of document-topic mixtures"),
        Option("beta", float, 0.01, "symmetric Dirichlet prior of topic-word distributions"),
        Option("holdout", float, 0.1, "fraction of documents held out for perplexity"),
        Option("fold_in_sweeps", int, 2, "Gibbs sweeps per epoch over held-out documents "
               "(their chains persist across epochs)"),
        Option("init", str, "random", "first topic of each token: uniform 'random', or "
               "'progressive' (sampled against the counts so far)",
               choices=("random", "progressive")),
        Option("top_words", int, 10, "words per topic logged at the end (with --vocab)"),
    ]

    # -- input ------------------------------------------------------------------
    def read_input(self, part: InputPart):
        o = self.opts
        if (o.topics < 1 or o.topics > 1 << 15 or o.alpha <= 0 or o.beta <= 0
                or not (0 <= o.holdout < 1) or o.fold_in_sweeps < 1 or o.top_words < 0):
            raise InputError(o.input, None, "bad options: need 1 <= topics <= 32768, alpha > 0, "
                             "beta > 0, 0 <= holdout < 1, fold_in_sweeps >= 1")
        self.part_index = part.index
        self.K = o.topics
        self._epochs = 0
        self._top = None
        with part.pieces() as per_block:   # block -> token pieces, in bounded memory
            yield from self._blocks(part, per_block)

    def _blocks(self, part: InputPart, per_block):
        o = self.opts
        with DocwordReader(o.input, part.chunk_bytes(CHUNK_BYTES)) as r:
            h = r.header
            if h.docs >= 1 << 31 or h.words >= 1 << 31:
                raise InputError(o.input, 1, "more than 2^31 documents or words")
            self.W, self.D = h.words, h.docs
            self.R = min(TOTAL_ROWS, o.blocks)
            for ch in r:
                blocks = part.block_of(ch.doc)
                mine = part.owns(blocks)
                if not mine.any():
                    continue
                b = blocks[mine]
                arr = np.stack([ch.doc[mine], ch.word[mine], ch.count[mine]], axis=1) \
                    .astype(np.int32)
                order = np.argsort(b, kind="stable")
                b, arr = b[order], arr[order]
                ub, first = np.unique(b, return_index=True)
                for i, blk in enumerate(ub.tolist()):
                    end = first[i + 1] if i + 1 < len(ub) else len(b)
                    per_block.add(blk, arr[first[i]:end])
        self.vocab = read_vocab(o.vocab, self.W) if (o.vocab and part.index == 0) else None
        for b in sorted(per_block.keys()):
            arr = np.concatenate([p[0] for p in per_block.take(b)])
            yield self._make_block(b, arr[:, 0], arr[:, 1], arr[:, 2])

    def _make_block(self, b: int, doc: np.ndarray, word: np.ndarray, cnt: np.ndarray) -> Block:
        o, k = self.opts, self.K
        zdt = np.int16 if k < (1 << 15) else np.int32
        order = np.argsort(doc, kind="stable")
        doc, word, cnt = doc[order], word[order], cnt[order]
        held = heldout_docs(doc, o.holdout, o.seed)
        arrays = {}
        rng = rng_for(o.seed, _S_ORDER, b)
        for pre, sel in (("", ~held), ("h", held)):
            uw, wl = np.unique(word[sel], return_inverse=True)   # the part's words
            d_ids, dl = np.unique(doc[sel], return_inverse=True)
            c = cnt[sel].astype(np.int64)
            td = np.repeat(dl, c)
            tw = np.repeat(wl, c)
            if pre == "h":                         # document completion: observed / evaluated
                obs = rng_for(o.seed, _S_SPLIT, b).random(len(td)) < 0.5
                pair, ec = np.unique(td[~obs].astype(np.int64) * len(uw) + tw[~obs],
                                     return_counts=True)
                arrays["ed"] = (pair // max(len(uw), 1)).astype(np.int32)
                arrays["ew"] = (pair % max(len(uw), 1)).astype(np.int32)
                arrays["ec"] = ec.astype(np.float64)
                td, tw = td[obs], tw[obs]
            perm, bounds = order_tokens(td, tw, len(d_ids), batch_size(k, len(td)), rng)
            arrays[pre + "uw"] = uw.astype(np.int64)
            arrays[pre + "docs"] = d_ids.astype(np.int64)
            arrays[pre + "td"] = td[perm].astype(np.int32)
            arrays[pre + "tw"] = tw[perm].astype(np.int32)
            arrays[pre + "z"] = np.full(len(td), -1, dtype=zdt)
            arrays[pre + "tb"] = bounds
        return Block(b, arrays)

    # -- model ------------------------------------------------------------------
    def model_spec(self) -> ModelSpec:
        return ModelSpec(num_keys=self.W + self.R, dim=self.K)

    def keys(self, blocks: list[Block]) -> np.ndarray:
        """The blocks' words, then all topic-totals rows (always: n_k is
        their sum, and machine 0 scores it even without blocks)."""
        tot = np.arange(self.W, self.W + self.R, dtype=np.int64)
        if not blocks:
            return tot
        words = np.unique(np.concatenate([b["uw"] for b in blocks] + [b["huw"] for b in blocks]))
        return np.concatenate([words, tot])

    def _workspace(self, batch: int) -> Workspace:
        ws = getattr(self, "_ws", None)
        if ws is None or ws.B < batch:
            ws = self._ws = Workspace(self.K, max(batch, 1))
        return ws

    def _lgamma(self, c: float) -> _LogGammaSum:
        cache = self.__dict__.setdefault("_lg_cache", {})
        if c not in cache:
            cache[c] = _LogGammaSum(c)
        return cache[c]

    def _inv(self, nk: np.ndarray) -> np.ndarray:
        return (1.0 / (nk + self.W * self.opts.beta)).astype(np.float32)

    # -- iteration ----------------------------------------------------------------
    def compute(self, blocks: list[Block], keys: np.ndarray, rows: np.ndarray,
                step: Step) -> np.ndarray:
        o, k, nr = self.opts, self.K, self.R
        nwk = np.array(rows[:-nr], dtype=np.float32)         # exact integer counts
        tot = rows[-nr:].astype(np.float64)                   # topic totals, in R parts
        nk = tot.sum(axis=0)
        beta, alpha = np.float32(o.beta), np.float32(o.alpha)
        for blk in blocks:
            z, td, tw, bounds = blk["z"], blk["td"], blk["tw"], blk["tb"]
            if len(z) == 0:
                continue
            rowmap = np.searchsorted(keys, blk["uw"])
            z_old = z.copy()
            rng = rng_for(o.seed, _S_TRAIN, step.epoch, step.iter, blk.id)
            if o.init == "random" and z[0] < 0:     # first visit: uniform random topics
                z[:] = rng.integers(0, k, len(z))
                np.add.at(nwk.reshape(-1), rowmap[tw] * k + z, _ONE)
                dk = np.bincount(z, minlength=k)
                nk += dk
                tot[blk.id % nr] += dk
                z_old = z.copy()
            inv = self._inv(nk)
            bw = (nwk[rowmap] + beta) * inv
            ndka = topic_counts(td, z, len(blk["docs"]), k).astype(np.float32) + alpha
            ws = self._workspace(int(np.diff(bounds).max()))
            gibbs_sweep(td, tw, z, ndka, bw, inv, bounds, rng, ws, learn=True)
            ch = np.flatnonzero(z != z_old)       # push exact integer count changes
            zn, zo = z[ch].astype(np.intp), z_old[ch].astype(np.intp)
            was = zo >= 0
            r = rowmap[tw[ch]] * k
            nf = nwk.reshape(-1)
            np.add.at(nf, r + zn, _ONE)
            np.add.at(nf, r[was] + zo[was], -_ONE)
            dk = np.bincount(zn, minlength=k) - np.bincount(zo[was], minlength=k)
            nk += dk
            tot[blk.id % nr] += dk
        if (len(nwk) and nwk.max() >= _EXACT) or tot.max() >= _EXACT:
            raise AppError("a count reached 2^24, beyond exact float32 integers: "
                           f"use more --blocks (topic totals are split over min({TOTAL_ROWS}, "
                           "blocks) rows) or fewer tokens")
        deltas = np.empty((len(keys), k), dtype=np.float32)
        np.subtract(nwk, rows[:-nr], out=deltas[:-nr])
        np.subtract(tot, rows[-nr:], out=deltas[-nr:])
        return deltas

    # -- objective ----------------------------------------------------------------
    def objective(self, blocks: list[Block], keys: np.ndarray, rows: np.ndarray) -> dict:
        o, k = self.opts, self.K
        epoch = self._epochs
        self._epochs += 1
        lg_a = self._lgamma(o.alpha)
        ld = 0.0
        n = 0
        ho_ll = 0.0
        ho_n = 0.0
        nr = self.R
        nk = rows[-nr:].astype(np.float64).sum(axis=0)
        inv = 1.0 / (nk + self.W * o.beta)
        out = {}
        if getattr(self, "part_index", 0) == 0:      # the topic-totals term, once
            wb = self.W * o.beta
            out["lk"] = float(k * gammaln(wb) - gammaln(nk + wb).sum())
        for blk in blocks:
            z, td = blk["z"], blk["td"]
            ndocs = len(blk["docs"])
            if len(z):
                ndk = topic_counts(td, z, ndocs, k)
                nd = np.bincount(td, minlength=ndocs).astype(np.float64)
                ld += lg_a(ndk) - float((gammaln(nd + k * o.alpha) - gammaln(k * o.alpha)).sum())
                n += len(z)
            if len(blk["ed"]):                       # held-out documents: fold in, then score
                rowmap = np.searchsorted(keys, blk["huw"])
                phi = ((rows[rowmap].astype(np.float64) + o.beta) * inv).astype(np.float32)
                hz, hb = blk["hz"], blk["htb"]
                ws = self._workspace(int(np.diff(hb).max()) if len(hz) else 1)
                rng = rng_for(o.seed, _S_FOLD, epoch, blk.id)
                theta = fold_in_theta(blk["htd"], blk["htw"], hz, len(blk["hdocs"]), phi,
                                      o.alpha, hb, o.fold_in_sweeps, rng, ws)
                p = np.einsum("ij,ij->i", theta[blk["ed"]], phi[blk["ew"]].astype(np.float64))
                ho_ll += float(blk["ec"] @ np.log(p))
                ho_n += float(blk["ec"].sum())
        may_stop = self._epochs >= o.max_epochs or o.target_objective is not None
        if getattr(self, "part_index", 0) == 0 and self.vocab and len(keys) > nr and may_stop:
            self._top = (np.array(rows[:-nr]), keys[:-nr], inv)   # for metrics() to log
        out.update({"ld": ld, "n": float(n), "ho_ll": ho_ll, "ho_n": ho_n})
        return out

    def model_objective(self, keys: np.ndarray, rows: np.ndarray) -> dict:
        return {"lw": self._lgamma(self.opts.beta)(rows[keys < self.W])}

    # -- export (harmony model get) -------------------------------------------------
    def export_meta(self) -> dict:
        return {"vocab": list(self.vocab)} if self.vocab else {}

    def export(self, keys: np.ndarray, rows: np.ndarray, meta: dict) -> dict:
        """``word_topic`` (words x topics) counts, row ``w`` for UCI word id
        ``w + 1``; ``topic_totals``; ``alpha``, ``beta``; per topic its
        ``--top-words`` most probable words: ``top_word_ids`` (rows of
        ``word_topic``) and, when the job had ``--vocab``, ``top_words``.
        phi = (word_topic + beta) / (topic_totals + W beta), column-wise."""
        o = self.opts
        W = len(rows) - min(TOTAL_ROWS, o.blocks)
        nwk = np.rint(rows[:W]).astype(np.int32)
        out = {"word_topic": nwk, "topic_totals": nwk.sum(axis=0, dtype=np.int64),
               "alpha": np.float64(o.alpha), "beta": np.float64(o.beta)}
        n = min(o.top_words, W)
        if n > 0:
            phi = phi_from_counts(rows, o.beta, W)
            ids = np.argsort(-phi, axis=1, kind="stable")[:, :n]
            out["top_word_ids"] = ids
            vocab = meta.get("vocab")
            if vocab and len(vocab) >= W:
                out["top_words"] = np.array([[vocab[i] for i in r] for r in ids.tolist()])
        return out

    def export_text(self, arrays: dict) -> str:
        """The top words per topic, one line per topic."""
        if "top_word_ids" not in arrays:
            raise AppError("no top words (the job ran with --top-words 0)")
        words = arrays.get("top_words")
        if words is None:
            words = arrays["top_word_ids"] + 1            # UCI word ids
        return "".join(f"topic {k:3d}: " + " ".join(str(w) for w in r) + "\n"
                       for k, r in enumerate(words.tolist()))

    def metrics(self, s: dict) -> dict:
        o = self.opts
        n = s.get("n", 0.0)
        ll = s.get("lw", 0.0) + s.get("lk", 0.0) + s.get("ld", 0.0)
        out = {"objective": -ll / n if n else math.nan,
               "loglik_per_token": ll / n if n else math.nan,
               "tokens": n}
        if s.get("ho_n"):
            out["perplexity"] = math.exp(-s["ho_ll"] / s["ho_n"])
        done = self._epochs >= o.max_epochs or (
            o.target_objective is not None and out["objective"] <= o.target_objective)
        if done and self._top is not None:
            nwk, words, inv = self._top
            phi = ((nwk.astype(np.float64) + o.beta) * inv).T
            for line in top_words(phi, self.vocab, o.top_words, words):
                log.info("%s", line)
        return out


if __name__ == "__main__":   # python apps/lda.py --input docword.txt [--vocab vocab.txt] ...
    import sys

    from harmony.app import parse_app_args, run_local

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    argv = sys.argv[1:]
    opts = parse_app_args(LDA, argv)
    res = run_local(LDA, argv)                   # logs the top words when --vocab is given
    for e, m in enumerate(res.history):
        print(f"epoch {e:3d}  " + "  ".join(f"{k} {v:.4f}" for k, v in m.items()), flush=True)
    if not opts.vocab:
        for line in top_words(phi_from_counts(res.model, opts.beta, res.model.shape[0]
                                              - min(TOTAL_ROWS, opts.blocks)),
                              None, opts.top_words):
            print(line)
