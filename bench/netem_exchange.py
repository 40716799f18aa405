"""How close the emulated links come to their ideal on a PS exchange.

m emulated machines (``harmony.worker.netem``) each pull and then push
``--mb`` MB in all from and to the m-1 others at once, as a PS at DoP m does
in one iteration: one flow per peer, a small request and then the rows for
a pull, the rows and then a small reply for a push. Every machine's ingress
and egress carry ``--mb`` MB each way, so ``2 * mb / rate`` is the ideal
time of the exchange (the busiest link's bytes over its rate). The figure
is the slowest machine's wall time over that ideal, per rep; 1.00 is a
network that never leaves a link idle while a flow needs it.

Each machine is a thread with its own ``NetEm`` handle (its own open file,
so ``flock`` excludes the others), on the real clock.

    python bench/netem_exchange.py [--machines 2,3,4,6,8] [--rate 2e6] [--mb 2] [--reps 3]

The default rate, 2 MB/s, is bench/cluster_e2e.py's 16 MB/s links (its
default until session 26; 48 MB/s since) at dilation 8.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harmony.worker.netem import NetEm  # noqa: E402

REQUEST = 200           # bytes of a pull's request or a push's reply


def exchange(path: str, names: list[str], nbytes: float) -> float:
    """Wall seconds of one pull + push of ``nbytes`` per machine, at once."""
    per = int(nbytes / (len(names) - 1))
    took: dict[int, float] = {}

    def machine(i: int) -> None:
        em = NetEm(path)
        try:
            me = names[i]
            peers = [q for q in names if q != me]
            t = em.transfer_many([[(me, q, REQUEST), (q, me, per)] for q in peers])
            t += em.transfer_many([[(me, q, per), (q, me, REQUEST)] for q in peers])
            took[i] = t
        finally:
            em.close()
    threads = [threading.Thread(target=machine, args=(i,)) for i in range(len(names))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return max(took.values())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--machines", default="2,3,4,6,8")
    ap.add_argument("--rate", type=float, default=2e6, help="bytes/s of every link")
    ap.add_argument("--mb", type=float, default=2.0, help="MB each machine pulls (and pushes)")
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args(argv)
    nbytes = a.mb * 1e6
    ideal = 2 * nbytes / a.rate
    print(f"PS exchange on emulated links of {a.rate / 1e6:g} MB/s: each machine pulls and "
          f"pushes {a.mb:g} MB in all; ideal {ideal:.2f} s")
    print(f"{'machines':>8}  exchange time / ideal, per rep")
    with tempfile.TemporaryDirectory(prefix="harmony-netem-") as tmp:
        for m in (int(x) for x in a.machines.split(",")):
            if m < 2:
                raise SystemExit("--machines: at least 2 each")
            names = [f"m{i}" for i in range(m)]
            path = os.path.join(tmp, f"net{m}")
            NetEm.create(path, names, a.rate).close()
            ratios = [exchange(path, names, nbytes) / ideal for _ in range(a.reps)]
            print(f"{m:>8}  " + "  ".join(f"{r:.3f}" for r in ratios), flush=True)


if __name__ == "__main__":
    main()
