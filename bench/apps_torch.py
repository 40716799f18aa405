"""torch_mlp epoch time: the runtime on 1 machine vs a plain single-process
torch loop (same MLP, same data, same optimizer, same batch size, one torch
thread each), measured in the same run; prints the ratios.

Two parts of an epoch:

* ``train``: the runtime's training part of an epoch (PULL + COMP + PUSH +
  barriers: the job's ``timings.train``) against the plain loop's epoch of
  SGD steps;
* ``epoch``: training plus the objective round (evaluating loss and accuracy
  on the train and test data, summing over machines: ``timings.eval``)
  against the plain loop's epoch plus the same evaluation done in the loop.

Each in two clocks:

* wall time, what a user waits for. On a shared machine much of it is the
  other load's: a process that waits for a core is charged the wait;
* CPU time: the plain loop's process CPU seconds per epoch against the
  executor process's (``timings.train_cpu`` / ``eval_cpu``: all its
  threads, the PS shard's and ZeroMQ's included; the master's and the
  daemon's few messages per epoch are not). It counts the work each side
  does and moves little with background load.

The machine is shared, so the two alternate for ``--rounds`` rounds in ABBA
order (plain, runtime, runtime, plain, ...), so that a slow drift of the
load hits both alike. Each side's time is its median epoch over all rounds
(the first two epochs of each run skipped); the per-round ratios are printed
too, to show the noise, and the load average before and after. Load comes
in bursts of seconds, and on a VM even CPU time includes the time a virtual
core was taken away (steal), so both clocks move with it; the ratio of the
10th percentiles (the epochs that ran with the least interference on each
side) is steadier. Steadiest is the product of two ratios that each pair
like with like under the same load: the app's COMP against the plain loop's
epoch, alternated epoch by epoch in one process, times the job's training
part over its own COMP in the same epochs (the runtime's PULL, PUSH and
barriers); printed as the estimate.

    python bench/apps_torch.py [--rounds 4] [--epochs 12] [--hidden 128] [--layers 1]
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

import torch  # noqa: E402

from harmony.app import load_app  # noqa: E402
from harmony.client import Client  # noqa: E402
from harmony.cluster import LocalCluster  # noqa: E402

SRC = (ROOT / "apps" / "torch_mlp.py").read_text()
G = load_app(SRC, "torch_mlp.py").read_input.__globals__
KINDS = ("train", "epoch", "train_cpu", "epoch_cpu")


def train_epoch(net, opt, X, y, g, batch_size: int) -> None:
    """One epoch of the plain single-process loop: shuffled mini-batches."""
    perm = torch.randperm(len(y), generator=g)
    for s in range(0, len(y), batch_size):
        idx = perm[s:s + batch_size]
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(net(X[idx]), y[idx]).backward()
        opt.step()


def plain_loop(a) -> dict[str, list[float]]:
    """Per-epoch wall and CPU seconds of training alone and of training +
    evaluation, and the final test accuracy."""
    torch.set_num_threads(1)
    Xtr, ytr, Xte, yte = G["digits"](0)
    net = G["make_mlp"](Xtr.shape[1], a.hidden, a.layers, 10, a.seed)
    opt = torch.optim.SGD(net.parameters(), lr=a.lr, momentum=0.9)
    X, y = torch.from_numpy(Xtr), torch.from_numpy(ytr)
    tX, ty = torch.from_numpy(Xte), torch.from_numpy(yte)
    g = torch.Generator().manual_seed(a.seed)
    out: dict[str, list[float]] = {k: [] for k in KINDS}
    acc = 0.0
    for _ in range(a.epochs):
        t0, c0 = time.perf_counter(), time.process_time()
        train_epoch(net, opt, X, y, g, a.batch_size)
        t1, c1 = time.perf_counter(), time.process_time()
        with torch.no_grad():
            for xx, yy in ((X, y), (tX, ty)):
                z = net(xx)
                float(torch.nn.functional.cross_entropy(z, yy, reduction="sum"))
                acc = float((z.argmax(1) == yy).float().mean())
        t2, c2 = time.perf_counter(), time.process_time()
        out["train"].append(t1 - t0)
        out["epoch"].append(t2 - t0)
        out["train_cpu"].append(c1 - c0)
        out["epoch_cpu"].append(c2 - c0)
    out["acc"] = [acc]
    return out


def runtime(a) -> dict[str, list[float]]:
    """The same per-epoch numbers from a 1-machine job's epoch timings."""
    args = ["--max-epochs", str(a.epochs), "--seed", str(a.seed), "--hidden", str(a.hidden),
            "--layers", str(a.layers), "--lr", str(a.lr), "--batch-size", str(a.batch_size)]
    with tempfile.TemporaryDirectory(prefix="bench-torch-") as tmp:
        cl = LocalCluster(1, tmp, port=0)
        cl.start()
        try:
            with Client(cl.endpoint, keys=cl.keys, timeout_s=10) as c:
                job = c.submit("torch_mlp.py", SRC, args, machines=1)
                while True:
                    st = c.status(job)
                    if st["state"] in ("finished", "failed"):
                        break
                    time.sleep(0.05)
                if st["state"] != "finished":
                    raise SystemExit(f"job failed: {st['error']}")
        finally:
            cl.stop()
    tm = [e["timings"] for e in st["epochs"]]
    return {"train": [t["train"] for t in tm],
            "epoch": [t["train"] + t["eval"] for t in tm],
            "train_cpu": [t["train_cpu"] for t in tm],
            "epoch_cpu": [t["train_cpu"] + t["eval_cpu"] for t in tm],
            "comp": [t["comp"] for t in tm], "comp_cpu": [t["comp_cpu"] for t in tm],
            "acc": [st["epochs"][-1]["metrics"]["test_accuracy"]]}


def p10(xs: list[float]) -> float:
    """The 10th percentile: an epoch that ran with little interference."""
    return statistics.quantiles(xs, n=10)[0] if len(xs) > 1 else xs[0]


def paired(a) -> dict[str, list[float]]:
    """The app's COMP against the plain loop's epoch in one process,
    alternating epoch by epoch (plain, app, app, plain, ...), so that both
    see the same load: per-pair ratios of wall and CPU time. The app side is
    what the runtime's COMP runs (``bind``, the stacked samples, the SGD
    steps, ``deltas``) on a model kept as the runtime keeps it."""
    from harmony.app import InputPart, Step, parse_app_args
    cls = load_app(SRC, "torch_mlp.py")
    opts = parse_app_args(cls, ["--seed", str(a.seed), "--hidden", str(a.hidden), "--layers",
                                str(a.layers), "--lr", str(a.lr), "--batch-size",
                                str(a.batch_size)])
    app = cls(opts)
    blocks = sorted(app.read_input(InputPart(0, 1, opts.blocks)), key=lambda b: b.id)
    keys = app.keys(blocks)
    model = app.init_rows(keys)
    torch.set_num_threads(1)
    Xtr, ytr, _, _ = G["digits"](0)
    net = G["make_mlp"](Xtr.shape[1], a.hidden, a.layers, 10, a.seed)
    opt = torch.optim.SGD(net.parameters(), lr=a.lr, momentum=0.9)
    X, y = torch.from_numpy(Xtr), torch.from_numpy(ytr)
    g = torch.Generator().manual_seed(a.seed)

    def plain_epoch(_):
        train_epoch(net, opt, X, y, g, a.batch_size)

    def app_epoch(epoch):
        nonlocal model
        rows = model.copy()
        rows.flags.writeable = False
        model = model + app.compute(blocks, keys, rows, Step(epoch, 0, 1))

    out: dict[str, list[float]] = {"wall": [], "cpu": []}
    for e in range(a.epochs * 2):
        t = {}
        for f in ((plain_epoch, app_epoch) if e % 2 == 0 else (app_epoch, plain_epoch)):
            t0, c0 = time.perf_counter(), time.process_time()
            f(e)
            t[f] = (time.perf_counter() - t0, time.process_time() - c0)
        if e >= 2:
            out["wall"].append(t[app_epoch][0] / t[plain_epoch][0])
            out["cpu"].append(t[app_epoch][1] / t[plain_epoch][1])
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seed", type=int, default=3)
    a = p.parse_args()
    skip = 2                                  # warm-up epochs (allocator, first calls)
    load0 = os.getloadavg()
    P: dict[str, list[float]] = {k: [] for k in KINDS}
    R: dict[str, list[float]] = {k: [] for k in KINDS + ("comp", "comp_cpu")}
    rounds: list[dict[str, float]] = []
    pacc = racc = 0.0
    for r in range(a.rounds):
        order = (plain_loop, runtime) if r % 2 == 0 else (runtime, plain_loop)
        got = {f.__name__: f(a) for f in order}
        pl, rt = got["plain_loop"], got["runtime"]
        pacc, racc = pl["acc"][0], rt["acc"][0]
        for k in P:
            P[k].extend(pl[k][skip:])
        for k in R:
            R[k].extend(rt[k][skip:])
        rounds.append({k: statistics.median(rt[k][skip:]) / statistics.median(pl[k][skip:])
                       for k in KINDS})
    pair = paired(a)
    load1 = os.getloadavg()
    print(f"torch_mlp on digits: MLP 64-{a.hidden}x{a.layers}-10, batch {a.batch_size}, "
          f"{a.epochs} epochs x {a.rounds} rounds (ABBA), median epoch; load average "
          f"{load0[0]:.1f} -> {load1[0]:.1f} on {os.cpu_count()} cores")
    print(f"  test accuracy: plain loop {pacc:.4f}, harmony {racc:.4f}")
    print("  | clock | part | plain loop (ms) | harmony, 1 machine (ms) | ratio of medians "
          "| ratio of 10th percentiles | per-round ratios of medians |")
    print("  |---|---|---|---|---|---|---|")
    for k in KINDS:
        clock, part = ("CPU", k[:-4]) if k.endswith("_cpu") else ("wall", k)
        pm, rm = statistics.median(P[k]), statistics.median(R[k])
        pq, rq = p10(P[k]), p10(R[k])
        print(f"  | {clock} | {part} | {pm * 1e3:.2f} | {rm * 1e3:.2f} | {rm / pm:.3f}x | "
              f"{rq / pq:.3f}x | " + " ".join(f"{x[k]:.2f}" for x in rounds) + " |")
    print(f"  harmony COMP alone: wall {statistics.median(R['comp']) * 1e3:.2f} ms, CPU "
          f"{statistics.median(R['comp_cpu']) * 1e3:.2f} ms per epoch")
    # the load-robust estimate: (app COMP / plain epoch, paired in one process)
    # x (the job's training part / its COMP, in the same epochs)
    # (the epoch: the job's (train + eval) / COMP over the plain loop's
    # (train + eval) / train, each within the same epochs)
    def med_ratio(num, den):
        return statistics.median(x / y for x, y in zip(num, den))
    over = {"train": med_ratio(R["train"], R["comp"]),
            "train_cpu": med_ratio(R["train_cpu"], R["comp_cpu"]),
            "epoch": med_ratio(R["epoch"], R["comp"]) / med_ratio(P["epoch"], P["train"]),
            "epoch_cpu": med_ratio(R["epoch_cpu"], R["comp_cpu"])
            / med_ratio(P["epoch_cpu"], P["train_cpu"])}
    cw, cc = statistics.median(pair["wall"]), statistics.median(pair["cpu"])
    print(f"  paired in one process, app COMP / plain epoch: wall {cw:.3f}x, CPU {cc:.3f}x; "
          f"the job's train / COMP: wall {over['train']:.3f}x, CPU {over['train_cpu']:.3f}x")
    print(f"  estimate (the product): train wall {cw * over['train']:.3f}x, CPU "
          f"{cc * over['train_cpu']:.3f}x; epoch (with eval) wall {cw * over['epoch']:.3f}x, "
          f"CPU {cc * over['epoch_cpu']:.3f}x")


if __name__ == "__main__":
    main()
