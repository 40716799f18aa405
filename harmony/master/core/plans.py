"""Block shares (pure): how many blocks each owner of a job's layout holds,
which blocks move in a resize, and what ``harmony status`` shows of the
roles."""
from __future__ import annotations

def _layout_summary(machines: list[str], owner: list[int], input_counts: list[int],
                    layout: dict | None) -> dict | None:
    """What ``harmony status`` shows of a job's roles: its workers (machines
    holding input), servers (holding model blocks) and the blocks of each."""
    if layout is None:
        return None
    model = [owner.count(i) for i in range(len(machines))]
    return {"workers": [m for m, c in zip(machines, input_counts) if c > 0],
            "servers": [m for m, c in zip(machines, model) if c > 0],
            "input_blocks": dict(zip(machines, input_counts)),
            "model_blocks": dict(zip(machines, model))}


def shares(total: int, n: int, weights: list[float] | None = None) -> list[int]:
    """``total`` blocks apportioned over ``n`` owners: evenly (shares differ
    by at most one, the extra ones to the lowest indexes), or in proportion
    to ``weights`` by largest remainder (ties to the lower index); an owner
    of weight 0 gets none."""
    if weights is None:
        return [total // n + (1 if i < total % n else 0) for i in range(n)]
    if len(weights) != n or any(w < 0 for w in weights) or not any(w > 0 for w in weights):
        raise ValueError(f"weights must be {n} non-negative numbers, one positive: {weights}")
    s = float(sum(weights))
    exact = [total * w / s for w in weights]
    out = [int(x) for x in exact]
    for i in sorted(range(n), key=lambda i: (-(exact[i] - out[i]), i))[:total - sum(out)]:
        out[i] += 1
    return out


def balance(owner: list[int], n: int, weights: list[float] | None = None) -> list[int]:
    """New owners of blocks over ``n`` owners: a block stays with its owner
    (-1: its owner leaves) unless that owner holds more than its share; the
    others go, in order, to the owners furthest below their share. Shares
    are :func:`shares` (even, or by ``weights``); the result is deterministic."""
    total = len(owner)
    share = shares(total, n, weights)
    held = [0] * n
    out = [-1] * total
    for b, o in enumerate(owner):
        if 0 <= o < n and held[o] < share[o]:
            out[b] = o
            held[o] += 1
    for b in range(total):
        if out[b] < 0:
            o = max(range(n), key=lambda i: (share[i] - held[i], -i))
            out[b] = o
            held[o] += 1
    return out
