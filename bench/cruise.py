"""Cruise on the runtime: grid search of roles against the optimizer's choice,
and the gain of optimizing online from a bad start.

One MLR job (sparse LIBSVM data, a model of FEATURES x CLASSES rows pulled
and pushed every iteration) on 3 emulated machines, homogeneous (every NIC
at --rate) and heterogeneous (the last machine's NIC at --slow-rate and its
CPU at half speed).

1. **Grid.** On a cluster without --cruise, the job is switched live through
   every (W workers, S servers) with W + S >= 3 (the first W machines hold
   input, the last S the model, blocks even within a role); each layout's
   epoch time is the median of --measure epochs after --settle epochs.
2. **Optimizer from a bad start.** On a cluster with --cruise, the same job
   is first switched to the grid's worst layout; Cruise measures it and
   moves to its own choice (any partition, not only the grid's). Its epoch
   time there (median after it settled) is compared with the grid's best,
   and with the bad start's.

    python bench/cruise.py [--variants homog,hetero] [--epochs 90]
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

from harmony.client import Client  # noqa: E402
from harmony.cluster import LocalCluster  # noqa: E402
from harmony.datagen.mlr import gen_mlr  # noqa: E402

N = 3


def layouts() -> list[tuple[int, int]]:
    return [(w, s) for w in range(1, N + 1) for s in range(1, N + 1) if w + s >= N]


def epochs_since(c: Client, job: str, n: int) -> list[dict]:
    return [e for e in c.status(job)["epochs"] if e["epoch"] >= n]


def wait_epochs(c: Client, job: str, count: int, timeout: float = 300) -> int:
    """Wait until ``count`` more epochs are done; the epoch count then."""
    t0 = time.time()
    start = c.status(job)["epochs_total"]
    while True:
        st = c.status(job)
        if st["epochs_total"] >= start + count:
            return st["epochs_total"]
        if st["state"] in ("finished", "failed", "cancelled"):
            raise SystemExit(f"{job} ended early: {st['state']} {st.get('error')}")
        if time.time() - t0 > timeout:
            raise SystemExit(f"{job}: no progress in {timeout}s")
        time.sleep(0.2)


def epoch_time(c: Client, job: str, a) -> float:
    wait_epochs(c, job, a.settle)
    at = c.status(job)["epochs_total"]
    wait_epochs(c, job, a.measure)
    eps = [e for e in c.status(job)["epochs"] if e["epoch"] >= at][:a.measure]
    return statistics.median(e["timings"]["train"] for e in eps)


def move_note(st: dict) -> tuple[float, float, float] | None:
    """(MiB moved, seconds from the request to the new layout, seconds the
    iterations stood) of the job's last live reconfiguration."""
    notes = [e[2] for e in st["events"] if " MiB moved; took " in str(e[2])]
    if not notes:
        return None
    n = notes[-1]
    mib = float(n.split(" MiB moved")[0].split(", ")[-1])
    took = float(n.split(" MiB moved; took ")[1].split("s,")[0])
    stood = float(n.split("iterations stood ")[1].split("s)")[0])
    return mib, took, stood


def switch(c: Client, job: str, w: int, s: int, moves: list | None = None) -> None:
    info = c.resize(job, N, workers=w if w < N or s < N else None,
                    servers=s if w < N or s < N else None)
    if info.get("state") == "unchanged":
        return
    t0 = time.time()
    while (st := c.status(job))["move"] is not None:
        if time.time() - t0 > 120:
            raise SystemExit("a role switch did not finish in 120 s")
        time.sleep(0.1)
    if moves is not None and (m := move_note(st)) is not None:
        moves.append(m)


def cluster(tmp: str, name: str, variant: str, a, cruise: bool) -> LocalCluster:
    rate = a.rate if variant == "homog" else f"{a.rate},{a.rate},{a.slow_rate}"
    speed = None if variant == "homog" else "1,1,0.5"
    return LocalCluster(N, os.path.join(tmp, name), port=0, policy="least-loaded",
                        net_bandwidth=rate, cpu_speed=speed, cruise=cruise)


def submit(c: Client, data: str, a) -> str:
    return c.submit("mlr.py", (ROOT / "apps" / "mlr.py").read_text(),
                    ["--input", data, "--max-epochs", str(a.epochs), "--holdout", "0",
                     "--iters-per-epoch", "2", "--blocks", "12", "--model-blocks", "24",
                     "--lr", "0.5"], machines=N)


def run_variant(variant: str, data: str, tmp: str, a) -> dict:
    grid = {}
    moves: list[tuple[float, float, float]] = []
    with cluster(tmp, f"grid-{variant}", variant, a, False) as cl, \
            Client(cl.endpoint, keys=cl.keys) as c:
        job = submit(c, data, a)
        wait_epochs(c, job, 2)
        for w, s in layouts():
            switch(c, job, w, s, moves)
            grid[(w, s)] = epoch_time(c, job, a)
            print(f"  {variant} W={w} S={s}: {grid[(w, s)]:.3f} s/epoch", flush=True)
        c.cancel(job)
    best = min(grid, key=grid.get)
    worst = max(grid, key=grid.get)
    with cluster(tmp, f"cruise-{variant}", variant, a, True) as cl, \
            Client(cl.endpoint, keys=cl.keys) as c:
        job = submit(c, data, a)
        wait_epochs(c, job, 1)
        switch(c, job, *worst)
        bad = epoch_time(c, job, a)
        t0 = time.time()
        while not (c.status(job).get("layout") or {}).get("cruise"):
            if time.time() - t0 > 300:
                raise SystemExit("Cruise did not reconfigure in 300 s")
            wait_epochs(c, job, 1)
        st = c.status(job)
        while st["move"] is not None:
            time.sleep(0.1)
            st = c.status(job)
        lay = st["layout"]
        cruise_move = move_note(st)
        tuned = epoch_time(c, job, a)
        c.cancel(job)
    return {"variant": variant, "grid": grid, "best": best, "worst": worst, "bad": bad,
            "tuned": tuned, "layout": lay, "moves": moves, "cruise_move": cruise_move}


def fit(moves: list[tuple[float, float, float]]) -> tuple[float, float] | None:
    """Least squares took = a + b * MiB over the grid's reconfigurations."""
    if len(moves) < 2 or len({m for m, _, _ in moves}) < 2:
        return None
    xs, ys = [m for m, _, _ in moves], [t for _, t, _ in moves]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default="homog,hetero")
    ap.add_argument("--rate", default="20M")
    ap.add_argument("--slow-rate", default="4M")
    ap.add_argument("--samples", type=int, default=12000)
    ap.add_argument("--features", type=int, default=20000)
    ap.add_argument("--classes", type=int, default=20)
    ap.add_argument("--epochs", type=int, default=200, help="max epochs (the bench cancels)")
    ap.add_argument("--settle", type=int, default=2)
    ap.add_argument("--measure", type=int, default=4)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="harmony-cruise-") as tmp:
        data = os.path.join(tmp, "mlr.txt")
        gen_mlr(data, samples=a.samples, features=a.features, classes=a.classes, nnz=20,
                seed=1)
        results = [run_variant(v, data, tmp, a) for v in a.variants.split(",")]
    print(f"\nMLR {a.samples} x {a.features} features x {a.classes} classes on {N} machines; "
          f"epoch time: median of {a.measure} epochs after {a.settle}")
    print(f"{'variant':8} {'grid best (W,S)':>16} {'s':>7} {'worst':>7} {'cruise':>7} "
          f"{'x best':>7} {'from bad start':>15} {'cruise layout'}")
    for r in results:
        b, w = r["grid"][r["best"]], r["grid"][r["worst"]]
        lay = r["layout"]
        desc = (f"workers {lay['input_blocks']} servers {lay['model_blocks']}" if lay
                else "even")
        print(f"{r['variant']:8} {str(r['best']):>16} {b:7.3f} {w:7.3f} {r['tuned']:7.3f} "
              f"{r['tuned'] / b:7.2f} {r['bad']:7.3f} -> {1 - r['tuned'] / r['bad']:+.0%}  "
              f"{desc}")
    print("\nplan execution (live reconfigurations of the grid and Cruise's): time from the "
          "request to the new layout, and how long iterations stood, against MiB moved")
    print(f"{'variant':8} {'plans':>5} {'MiB min-max':>13} {'took min-max (s)':>17} "
          f"{'stood median (s)':>17} {'fit: s + s/MiB':>16} {'cruise plan':>24}")
    for r in results:
        mv = r["moves"]
        if not mv:
            continue
        f = fit(mv)
        cm = r["cruise_move"]
        print(f"{r['variant']:8} {len(mv):5d} "
              f"{min(m for m, _, _ in mv):5.1f}-{max(m for m, _, _ in mv):<7.1f} "
              f"{min(t for _, t, _ in mv):8.2f}-{max(t for _, t, _ in mv):<8.2f} "
              f"{statistics.median(s for _, _, s in mv):17.2f} "
              f"{(f'{f[0]:.2f} + {f[1]:.3f}' if f else '-'):>16} "
              f"{(f'{cm[0]:.1f} MiB in {cm[1]:.2f}s' if cm else '-'):>24}")


if __name__ == "__main__":
    main()
