"""NMF data: planted non-negative low-rank ratings, 'user item rating' lines.

``--activity uniform`` (the default): every user rates ``per_user`` distinct
items drawn uniformly. ``--activity zipf``: MovieLens-shaped. Users' rating
counts follow a power law (Pareto, exponent ``ZIPF_A``) from a minimum of
``per_user // 3`` (mean about ``per_user``, at most half the items), so most
users sit near the minimum and a few rate hundreds. Items are picked by a
Zipf-like popularity ``1 / (rank + 10)^0.8`` (a few blockbusters, a long
tail). The file is sorted by user, as MovieLens and Netflix files are
(``--order shuffled``: not). ``--zipf-exponent`` sets the power law's
exponent (default 1.5; 1.3 is more skewed, 2 less).
"""
from __future__ import annotations

import argparse
import io

import numpy as np

from harmony.datagen import open_out

KIND = "nmf"
HELP = "planted low-rank ratings: 'user item rating' lines"


ZIPF_A = 1.5          # Pareto exponent of the users' rating counts (zipf activity)
ITEM_SKEW = 0.8       # item popularity ~ 1 / (rank + 10)^ITEM_SKEW


def zipf_counts(rng: np.random.Generator, n: int, per_user: int, items: int,
                exponent: float = ZIPF_A) -> np.ndarray:
    """Ratings per user: Pareto(exponent) from per_user // 3, capped at items // 2
    (the share of users with more than c ratings falls as c^-exponent)."""
    lo = max(1, per_user // 3)
    hi = max(lo, items // 2)
    c = np.floor(lo * (1.0 - rng.random(n)) ** (-1.0 / exponent)).astype(np.int64)
    return np.clip(c, lo, hi)


def popular_items(rng: np.random.Generator, counts: np.ndarray, cdf: np.ndarray,
                  order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(user offset, item) pairs: ``counts[u]`` distinct items per user drawn by
    popularity (``cdf`` over popularity ranks, ``order`` maps rank -> item).
    Candidates are drawn with replacement and deduplicated, in draw order."""
    items = len(cdf)
    want = counts.copy()
    users_out, items_out = [], []
    taken = np.zeros(0, dtype=np.int64)        # user * items + item already chosen
    for _ in range(8):
        if not want.any():
            break
        k = np.repeat(np.arange(len(counts)), 2 * want + 4)
        cand = order[np.minimum(np.searchsorted(cdf, rng.random(len(k)), "right"), items - 1)]
        key = k * items + cand
        _, first = np.unique(key, return_index=True)
        first = np.sort(first)                 # first draws, in draw order
        key = key[first]
        key = key[~np.isin(key, taken)]
        u = key // items
        # keep the first want[u] new items of each user
        start = np.searchsorted(u, np.arange(len(counts)))
        rank = np.arange(len(u)) - start[u]
        keep = rank < want[u]
        key = key[keep]
        taken = np.concatenate([taken, key])
        want -= np.bincount(key // items, minlength=len(counts))
    taken.sort()
    return taken // items, taken % items


def gen_nmf(path: str, users: int = 1000, items: int = 500, rank: int = 8,
            per_user: int = 50, noise: float = 0.1, seed: int = 0,
            chunk_users: int = 10_000, activity: str = "uniform",
            zipf_exponent: float = ZIPF_A, order: str = "user") -> dict:
    """Planted non-negative low-rank ratings ``r = (L* R*)_ui + N(0, noise²)``.

    Each user rates ``per_user`` distinct random items (``activity="zipf"``:
    a power-law number of items picked by popularity, see the module
    docstring; ``zipf_exponent`` is the power law's exponent). Users are
    written in chunks, so any size can be made without holding it in memory.
    ``order="shuffled"`` shuffles the lines within each chunk of
    ``chunk_users`` users (the whole file when ``users <= chunk_users``);
    ``"user"``, the default, keeps them sorted by user. Returns the shape
    written.
    """
    if users < 1 or items < 1 or rank < 1 or not (1 <= per_user <= items) or noise < 0:
        raise ValueError("need users, items, rank >= 1, 1 <= per_user <= items, noise >= 0")
    if activity not in ("uniform", "zipf"):
        raise ValueError(f"activity must be 'uniform' or 'zipf', not {activity!r}")
    if order not in ("user", "shuffled"):
        raise ValueError(f"order must be 'user' or 'shuffled', not {order!r}")
    if not zipf_exponent > 0:
        raise ValueError("zipf_exponent must be > 0")
    # the shuffle has its own stream: a sorted file is the same with or without it
    shuffle = np.random.default_rng([seed, 0x5FF]) if order == "shuffled" else None
    if activity == "zipf":
        return _gen_zipf(path, users, items, rank, per_user, noise, seed, chunk_users,
                         zipf_exponent, shuffle)
    rng = np.random.default_rng(seed)
    # factors scaled so that ratings average about 3
    R = rng.uniform(0, 1, size=(rank, items)) * np.sqrt(12.0 / rank)
    n = 0
    with open_out(path) as out:
        for start in range(0, users, chunk_users):
            cu = min(chunk_users, users - start)
            L = rng.uniform(0, 1, size=(cu, rank)) * np.sqrt(12.0 / rank)
            # distinct items per user: random keys, take the per_user smallest
            if per_user * 4 >= items:
                choice = np.argsort(rng.random((cu, items)), axis=1)[:, :per_user]
            else:
                choice = np.empty((cu, per_user), dtype=np.int64)
                for k in range(cu):
                    choice[k] = rng.choice(items, per_user, replace=False)
            vals = np.einsum("uk,kui->ui", L, R[:, choice])
            vals += rng.normal(0, noise, size=vals.shape) if noise > 0 else 0.0
            uids = np.repeat(np.arange(start, start + cu), per_user)
            block = np.column_stack([uids, choice.ravel(), vals.ravel()])
            if shuffle is not None:
                block = block[shuffle.permutation(len(block))]
            buf = io.StringIO()
            np.savetxt(buf, block, fmt=["%d", "%d", "%.4f"])
            out.write(buf.getvalue())
            n += len(block)
    return {"users": users, "items": items, "rank": rank, "ratings": n, "noise": noise,
            "order": order}


def _gen_zipf(path: str, users: int, items: int, rank: int, per_user: int, noise: float,
              seed: int, chunk_users: int, exponent: float,
              shuffle: np.random.Generator | None) -> dict:
    rng = np.random.default_rng([seed, 0x21F])
    R = rng.uniform(0, 1, size=(rank, items)) * np.sqrt(12.0 / rank)
    pop = 1.0 / (np.arange(items) + 10.0) ** ITEM_SKEW
    cdf = np.cumsum(pop / pop.sum())
    cdf[-1] = 1.0
    order = rng.permutation(items)             # popularity rank -> item id
    n = 0
    counts_all = []
    with open_out(path) as out:
        for start in range(0, users, chunk_users):
            cu = min(chunk_users, users - start)
            L = rng.uniform(0, 1, size=(cu, rank)) * np.sqrt(12.0 / rank)
            counts = zipf_counts(rng, cu, per_user, items, exponent)
            u, it = popular_items(rng, counts, cdf, order)
            vals = np.einsum("uk,ku->u", L[u], R[:, it])
            if noise > 0:
                vals += rng.normal(0, noise, size=len(vals))
            block = np.column_stack([u + start, it, vals])
            if shuffle is not None:
                block = block[shuffle.permutation(len(block))]
            buf = io.StringIO()
            np.savetxt(buf, block, fmt=["%d", "%d", "%.4f"])
            out.write(buf.getvalue())
            n += len(block)
            counts_all.append(np.bincount(u, minlength=cu))
    c = np.concatenate(counts_all)
    return {"users": users, "items": items, "rank": rank, "ratings": n, "noise": noise,
            "activity": "zipf", "zipf_exponent": exponent, "order": "user" if shuffle is None
            else "shuffled", "min_per_user": int(c.min()), "median_per_user": int(np.median(c)),
            "max_per_user": int(c.max())}


# Netflix prize data: 480,189 users, 17,770 movies, ~100 M ratings (~209 per user)
NETFLIX = {"users": 480_189, "items": 17_770, "per_user": 209}


def netflix_shape(scale: float) -> dict:
    """Netflix-style shape with ``scale`` x the ratings. Users, items and
    ratings per user each grow with sqrt(scale), the way the papers' "16x
    Netflix" (1.9 M users, 71 K movies) is built."""
    if scale <= 0:
        raise ValueError("--netflix-scale must be > 0")
    r = scale ** 0.5
    items = max(2, round(NETFLIX["items"] * r))
    return {"users": max(1, round(NETFLIX["users"] * r)), "items": items,
            "per_user": max(1, min(items, round(NETFLIX["per_user"] * r)))}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--netflix-scale", type=float, default=None,
                   help="Netflix-style shape with this factor of its ~100M ratings (e.g. 0.001: "
                        "15K users, 562 items, 7 per user); overrides --users/--items/--per-user")
    p.add_argument("--users", type=int, default=1000)
    p.add_argument("--items", type=int, default=500)
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--per-user", type=int, default=50,
                   help="ratings per user (zipf activity: about the mean)")
    p.add_argument("--activity", choices=("uniform", "zipf"), default="uniform",
                   help="ratings per user: all --per-user, or 'zipf': MovieLens-shaped (power-law "
                        "activity from --per-user/3, popular items, many users near the minimum)")
    p.add_argument("--zipf-exponent", type=float, default=ZIPF_A,
                   help="zipf activity: the power law's exponent (the share of users with more "
                        "than c ratings falls as c^-exponent; smaller: more skewed)")
    p.add_argument("--order", choices=("user", "shuffled"), default="user",
                   help="lines sorted by user (as MovieLens/Netflix files are) or shuffled "
                        "(within each chunk of 10,000 users)")
    p.add_argument("--noise", type=float, default=0.1, help="std. dev. of Gaussian noise")


def generate(a: argparse.Namespace) -> dict:
    shape = {"users": a.users, "items": a.items, "per_user": a.per_user}
    if a.netflix_scale is not None:
        shape = netflix_shape(a.netflix_scale)
    return gen_nmf(a.out, rank=a.rank, noise=a.noise, seed=a.seed,
                   activity=getattr(a, "activity", "uniform"),
                   zipf_exponent=getattr(a, "zipf_exponent", ZIPF_A),
                   order=getattr(a, "order", "user"), **shape)
