"""Random job profiles for the scheduler's tests and benchmarks."""
from __future__ import annotations

import numpy as np

from harmony.sched.model import Profile


def random_profiles(n: int, seed: int | np.random.Generator = 0, dop: int = 16,
                    t_net: tuple[float, float] = (0.5, 5.0),
                    ratio: tuple[float, float] = (0.25, 4.0),
                    remote: float | tuple[float, float] = 0.0) -> list[Profile]:
    """``n`` profiles measured at ``dop`` machines (the paper profiled at DoP
    16): Tnet log-uniform in ``t_net`` seconds and Tcpu = Tnet * r with the
    comp/comm ratio r log-uniform in ``ratio``, so some jobs are CPU-heavy and
    some network-heavy at that DoP. Ids are ``j0``, ``j1``, ...

    ``remote`` gives each job R = f * Tnet (``Profile.remote``, the COMM
    time of all of one machine's bytes over the link), with the fraction f
    that number or uniform in that (lo, hi) range; keep f <= dop/(dop-1) for
    profiles whose measured Tnet holds the remote part R*(dop-1)/dop. The
    default 0 draws nothing more: the same seed gives the same profiles as
    without the option."""
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    net = np.exp(rng.uniform(np.log(t_net[0]), np.log(t_net[1]), n))
    r = np.exp(rng.uniform(np.log(ratio[0]), np.log(ratio[1]), n))
    if isinstance(remote, tuple):
        f = rng.uniform(remote[0], remote[1], n)
    else:
        f = np.full(n, float(remote))
    return [Profile(f"j{i}", float(net[i] * r[i]), float(net[i]), dop, float(net[i] * f[i]))
            for i in range(n)]
