"""NMF time per epoch: the runtime on 1 machine vs the plain single-process
reference loop (``harmony.app.run_local``: same app code, same data, no
processes or sockets), measured in the same run.

The runtime's epoch time is wall time between consecutive epoch reports at
the master, so it includes PULL, COMP, PUSH, barriers and the objective
round; the reference's is the wall time of its epoch loop body.

    python bench/nmf_epoch.py [--users 40000] [--items 4000] [--per-user 50] [--epochs 6]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harmony.app import load_app, run_local  # noqa: E402
from harmony.client import Client  # noqa: E402
from harmony.cluster import LocalCluster  # noqa: E402
from harmony.datagen import gen_nmf  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--users", type=int, default=40000)
    ap.add_argument("--items", type=int, default=4000)
    ap.add_argument("--per-user", type=int, default=50)
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--iters-per-epoch", type=int, default=4)
    ap.add_argument("--solver", choices=("sgd", "als"), default="sgd",
                    help="the app's solver (the README's figures: sgd)")
    a = ap.parse_args()
    src = (ROOT / "apps" / "nmf.py").read_text()
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "r.txt")
        shape = gen_nmf(data, a.users, a.items, 8, a.per_user, 0.1, seed=0)
        args = ["--input", data, "--rank", str(a.rank), "--max-epochs", str(a.epochs),
                "--iters-per-epoch", str(a.iters_per_epoch), "--solver", a.solver]
        ref = run_local(load_app(src, "nmf.py"), args)
        with LocalCluster(1, os.path.join(tmp, "c"), port=0) as cl, Client(cl.endpoint, keys=cl.keys) as c:
            job = c.submit("nmf.py", src, args, machines=1)
            while (st := c.status(job))["state"] not in ("finished", "failed"):
                time.sleep(0.2)
        if st["state"] != "finished":
            raise SystemExit(f"job failed: {st['error']}")
        times = [e["time"] for e in st["epochs"]]
        runtime = statistics.median(b - a_ for a_, b in zip(times, times[1:]))
        reference = statistics.median(ref.epoch_times[1:])
        same = abs(st["epochs"][-1]["metrics"]["objective"] / ref.history[-1]["objective"] - 1)
        items = shape["ratings"]
        print(f"NMF, {items:,} ratings, rank {a.rank}, {a.iters_per_epoch} iterations/epoch, "
              f"median of {a.epochs - 1} epochs")
        print(f"  reference (single process): {reference:.3f} s/epoch "
              f"({items / reference / 1e6:.2f} M ratings/s)")
        print(f"  runtime, 1 machine        : {runtime:.3f} s/epoch "
              f"({items / runtime / 1e6:.2f} M ratings/s)")
        print(f"  ratio runtime/reference   : {runtime / reference:.3f}  (goal <= 1.15)")
        print(f"  final objective rel. diff : {same:.2e}")


if __name__ == "__main__":
    main()
