"""torch_mlp epoch time: the runtime on 1 machine vs a plain single-process
torch loop (same MLP, same data, same optimizer, same batch size, one torch
thread each), measured in the same run; prints the ratio.

Two ratios:

* ``train``: the runtime's training part of an epoch (PULL + COMP + PUSH +
  barriers: the job's ``timings.train``) against the plain loop's epoch of
  SGD steps;
* ``epoch``: wall time between consecutive epoch reports at the master
  (training plus the objective round: evaluating loss and accuracy on the
  train and test data, summing over machines) against the plain loop's
  epoch plus the same evaluation done in the loop.

The machine is shared, so the two alternate for ``--rounds`` rounds (plain,
runtime, plain, ...); each side's time is its median epoch over all rounds
(the first two epochs of each run skipped), and the per-round ratios are
printed too, to show the noise.

    python bench/apps_torch.py [--rounds 3] [--epochs 12] [--hidden 128] [--layers 1]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from harmony.app import load_app  # noqa: E402
from harmony.client import Client  # noqa: E402
from harmony.cluster import LocalCluster  # noqa: E402

SRC = (ROOT / "apps" / "torch_mlp.py").read_text()
G = load_app(SRC, "torch_mlp.py").read_input.__globals__


def plain_loop(a) -> tuple[list[float], list[float], float]:
    """Per-epoch seconds of training alone and of training + evaluation, and
    the final test accuracy."""
    torch.set_num_threads(1)
    Xtr, ytr, Xte, yte = G["digits"](0)
    net = G["make_mlp"](Xtr.shape[1], a.hidden, a.layers, 10, a.seed)
    opt = torch.optim.SGD(net.parameters(), lr=a.lr, momentum=0.9)
    X, y = torch.from_numpy(Xtr), torch.from_numpy(ytr)
    tX, ty = torch.from_numpy(Xte), torch.from_numpy(yte)
    g = torch.Generator().manual_seed(a.seed)
    train, full = [], []
    acc = 0.0
    for _ in range(a.epochs):
        t0 = time.perf_counter()
        perm = torch.randperm(len(y), generator=g)
        for s in range(0, len(y), a.batch_size):
            idx = perm[s:s + a.batch_size]
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(net(X[idx]), y[idx]).backward()
            opt.step()
        t1 = time.perf_counter()
        with torch.no_grad():
            for xx, yy in ((X, y), (tX, ty)):
                z = net(xx)
                float(torch.nn.functional.cross_entropy(z, yy, reduction="sum"))
                acc = float((z.argmax(1) == yy).float().mean())
        t2 = time.perf_counter()
        train.append(t1 - t0)
        full.append(t2 - t0)
    return train, full, acc


def runtime(a) -> tuple[list[float], list[float], float]:
    args = ["--max-epochs", str(a.epochs), "--seed", str(a.seed), "--hidden", str(a.hidden),
            "--layers", str(a.layers), "--lr", str(a.lr), "--batch-size", str(a.batch_size)]
    with tempfile.TemporaryDirectory(prefix="bench-torch-") as tmp:
        cl = LocalCluster(1, tmp, port=0)
        cl.start()
        try:
            with Client(cl.endpoint, keys=cl.keys, timeout_s=10) as c:
                job = c.submit("torch_mlp.py", SRC, args, machines=1)
                seen, stamps = 0, []
                while True:
                    st = c.status(job)
                    n = len(st["epochs"])
                    if n > seen:
                        stamps += [time.perf_counter()] * (n - seen)
                        seen = n
                    if st["state"] in ("finished", "failed"):
                        break
                    time.sleep(0.002)
                if st["state"] != "finished":
                    raise SystemExit(f"job failed: {st['error']}")
        finally:
            cl.stop()
    train = [e["timings"]["train"] for e in st["epochs"]]
    epochs = [e["timings"]["train"] + e["timings"]["eval"] for e in st["epochs"]]
    return train, epochs, st["epochs"][-1]["metrics"]["test_accuracy"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seed", type=int, default=3)
    a = p.parse_args()
    skip = 2                                  # warm-up epochs (allocator, first calls)
    P, R, ratios = ([], []), ([], []), []
    pacc = racc = 0.0
    for _ in range(a.rounds):
        pt, pf, pacc = plain_loop(a)
        rt, rf, racc = runtime(a)
        P[0].extend(pt[skip:]), P[1].extend(pf[skip:])
        R[0].extend(rt[skip:]), R[1].extend(rf[skip:])
        ratios.append(statistics.median(rt[skip:]) / statistics.median(pt[skip:]))
    pt, pf2, _ = plain_loop(a)
    P[0].extend(pt[skip:]), P[1].extend(pf2[skip:])
    plain_train, plain_full = statistics.median(P[0]), statistics.median(P[1])
    run_train, run_full = statistics.median(R[0]), statistics.median(R[1])
    print(f"torch_mlp on digits: MLP 64-{a.hidden}x{a.layers}-10, batch {a.batch_size}, "
          f"{a.epochs} epochs x {a.rounds} rounds, median epoch")
    print(f"  plain torch loop : train {plain_train * 1e3:7.2f} ms/epoch, with eval "
          f"{plain_full * 1e3:7.2f} ms/epoch, test accuracy {pacc:.4f}")
    print(f"  harmony, 1 machine: train {run_train * 1e3:7.2f} ms/epoch, with eval "
          f"{run_full * 1e3:7.2f} ms/epoch, test accuracy {racc:.4f}")
    print("  per-round train ratios: " + " ".join(f"{r:.3f}" for r in ratios))
    print(f"  ratio train {run_train / plain_train:.3f}x   epoch (with eval) "
          f"{run_full / plain_full:.3f}x")

if __name__ == "__main__":
    main()
