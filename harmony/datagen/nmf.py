"""NMF data: planted non-negative low-rank ratings, 'user item rating' lines."""
from __future__ import annotations

import argparse
import io

import numpy as np

from harmony.datagen import open_out

KIND = "nmf"
HELP = "planted low-rank ratings: 'user item rating' lines"


def gen_nmf(path: str, users: int = 1000, items: int = 500, rank: int = 8,
            per_user: int = 50, noise: float = 0.1, seed: int = 0,
            chunk_users: int = 10_000) -> dict:
    """Planted non-negative low-rank ratings ``r = (L* R*)_ui + N(0, noise²)``.

    Each user rates ``per_user`` distinct random items. Users are written in
    chunks, so any size can be made without holding it in memory. Returns
    the shape written.
    """
    if users < 1 or items < 1 or rank < 1 or not (1 <= per_user <= items) or noise < 0:
        raise ValueError("need users, items, rank >= 1, 1 <= per_user <= items, noise >= 0")
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
            buf = io.StringIO()
            np.savetxt(buf, block, fmt=["%d", "%d", "%.4f"])
            out.write(buf.getvalue())
            n += len(block)
    return {"users": users, "items": items, "rank": rank, "ratings": n, "noise": noise}


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
    p.add_argument("--per-user", type=int, default=50, help="ratings per user")
    p.add_argument("--noise", type=float, default=0.1, help="std. dev. of Gaussian noise")


def generate(a: argparse.Namespace) -> dict:
    shape = {"users": a.users, "items": a.items, "per_user": a.per_user}
    if a.netflix_scale is not None:
        shape = netflix_shape(a.netflix_scale)
    return gen_nmf(a.out, rank=a.rank, noise=a.noise, seed=a.seed, **shape)
