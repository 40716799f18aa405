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
3. **Simulator.** The job's profile measured on the even layout of the
   homogeneous grid (COMP and PULL+PUSH seconds and bytes per iteration,
   the link rate) drives the simulator (``harmony.sim``, ``block_work``:
   executors' work follows their blocks) through the same grid and the
   same Cruise run from the worst layout, on machines of the variant's
   speeds; the sim's epoch times are printed beside the runtime's.

With --machines 2 (at most the host's cores) every emulated machine is
pinned to its own core; with more they share the host's cores, so that a
compute-bound job's COMP does not scale with its workers.

    python bench/cruise.py [--variants homog,hetero] [--epochs 90] [--machines 3]
        [--samples 12000] [--features 20000]   # 120000 / 2000: compute-bound
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
from harmony.worker.netem import parse_rate  # noqa: E402

N = 3          # emulated machines (--machines)


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


KEEP_MARGIN = 10     # epochs left for measuring when Cruise has kept the layout


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
    rate = a.rate if variant == "homog" else ",".join([a.rate] * (N - 1) + [a.slow_rate])
    speed = None if variant == "homog" else ",".join(["1"] * (N - 1) + ["0.5"])
    # one core per emulated machine where the host has enough (else they share)
    pin = 1 if N <= len(os.sched_getaffinity(0)) else None
    return LocalCluster(N, os.path.join(tmp, name), port=0, policy="least-loaded",
                        net_bandwidth=rate, cpu_speed=speed, cruise=cruise,
                        cpus_per_machine=pin)


def submit(c: Client, data: str, a) -> str:
    return c.submit("mlr.py", (ROOT / "apps" / "mlr.py").read_text(),
                    ["--input", data, "--max-epochs", str(a.epochs), "--holdout", "0",
                     "--iters-per-epoch", "2", "--blocks", "12", "--model-blocks", "24",
                     "--lr", "0.5"], machines=N)


def measured_profile(c: Client, job: str, a) -> dict:
    """Per iteration on the even layout: COMP and PULL+PUSH seconds, the
    bytes one executor moves, its link rate (medians over --measure epochs
    after --settle; each epoch's timings are the slowest executor's)."""
    wait_epochs(c, job, a.settle)
    at = c.status(job)["epochs_total"]
    wait_epochs(c, job, a.measure)
    eps = [e["timings"] for e in c.status(job)["epochs"] if e["epoch"] >= at][:a.measure]
    med = lambda k: statistics.median(float(t.get(k) or 0.0) / float(t["iters"]) for t in eps)
    return {"cpu": med("comp"), "net": med("pull") + med("push"), "bytes": med("bytes"),
            "link": statistics.median(float(t.get("link") or 0.0) for t in eps),
            "iters": int(eps[0]["iters"])}


def run_variant(variant: str, data: str, tmp: str, a) -> dict:
    grid = {}
    moves: list[tuple[float, float, float]] = []
    with cluster(tmp, f"grid-{variant}", variant, a, False) as cl, \
            Client(cl.endpoint, keys=cl.keys) as c:
        job = submit(c, data, a)
        wait_epochs(c, job, 2)
        prof = measured_profile(c, job, a)
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
        t0, kept = time.time(), None
        while not (c.status(job).get("layout") or {}).get("cruise"):
            if time.time() - t0 > 300:
                raise SystemExit("Cruise did not reconfigure in 300 s")
            cv = c.status(job).get("cruise")
            if cv and cv["decision"] == "keep" \
                    and cv["at_epoch"] >= a.epochs - a.settle - a.measure - KEEP_MARGIN:
                kept = cv     # Cruise stayed to the end: its model says no move pays
                break
            wait_epochs(c, job, 1)
        st = c.status(job)
        while st["move"] is not None:
            time.sleep(0.1)
            st = c.status(job)
        lay = st["layout"]
        cruise_move = move_note(st) if kept is None else None
        tuned = epoch_time(c, job, a)
        c.cancel(job)
    return {"variant": variant, "grid": grid, "best": best, "worst": worst, "bad": bad,
            "tuned": tuned, "layout": lay, "moves": moves, "cruise_move": cruise_move,
            "profile": prof, "kept": kept}


START = 5.0   # simulated seconds: the switch to a layout (the job runs by then)


def sim_job(prof: dict, epochs: int):
    """The measured job as the simulator's: COMP scales as 1/m, COMM is its
    local part plus the bytes over the link for the (m-1)/m that is remote."""
    from harmony.sim.engine import SimJob
    cpu3, byts, link = prof["cpu"] * N, prof["bytes"], prof["link"]
    local = max(0.0, prof["net"] - byts / link * (N - 1) / N)
    return SimJob(id="mlr", app="mlr", arrival=0.0, epochs=epochs, machines=N,
                  iters=prof["iters"], bytes=byts, link=link, net_local=local,
                  profile=lambda m: (cpu3 / m, local + byts / link * (m - 1) / m))


def sim_variant(variant: str, prof: dict, worst: tuple[int, int], a) -> dict:
    """The grid and the Cruise run of ``run_variant`` in the simulator."""
    from harmony.sim.engine import Simulator
    slow = parse_rate(a.slow_rate) / parse_rate(a.rate)
    speeds = {} if variant == "homog" else {"cpu_speed": [1] * (N - 1) + [0.5],
                                             "net_speed": [1] * (N - 1) + [slow]}

    def run(w: int | None, s: int | None, cruise: bool) -> tuple[list[dict], dict | None]:
        sim = Simulator([sim_job(prof, 60)], N, policy="least-loaded", mode="naive",
                        input_blocks=12, model_blocks=24, block_work=True, cruise=cruise,
                        **speeds)
        if w is not None and (w < N or s < N):
            sim._at(START, sim._deliver, b"client", "resize",
                    {"job": "job-0001", "machines": N, "workers": w, "servers": s})
        sim.run()
        j = sim.core.jobs["job-0001"]
        if w is not None and (w < N or s < N) and not j.layout:
            raise SystemExit(f"the simulated job did not switch to ({w}, {s})")
        eps = [e["timings"] for e in j.epochs]
        # the first epoch in the layout asked for
        first = next(i for i, e in enumerate(j.epochs) if e["time"] > START)
        return eps, first, j.layout

    def settled(eps: list[dict], after: int) -> float:
        return statistics.median(t["train"] for t in eps[after + a.settle:]
                                 [:max(a.measure, 8)])
    grid = {}
    for w, s in layouts():
        eps, first, _ = run(w, s, False)
        grid[(w, s)] = settled(eps, first)
    eps, _, lay = run(*worst, True)
    at = (lay or {}).get("cruise", {}).get("at_epoch")
    tuned = settled(eps, at) if at is not None else None
    return {"grid": grid, "layout": lay, "tuned": tuned,
            "predicted": (lay or {}).get("cruise", {}).get("after")}


def fit(moves: list[tuple[float, float, float]]) -> tuple[float, float] | None:
    """Least squares took = a + b * MiB over the grid's reconfigurations."""
    if len(moves) < 2 or len({m for m, _, _ in moves}) < 2:
        return None
    xs, ys = [m for m, _, _ in moves], [t for _, t, _ in moves]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def main() -> None:
    global N
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
    ap.add_argument("--machines", type=int, default=N,
                    help="emulated machines (each pinned to a core where the host has "
                         "enough; the last one is the slow one in the hetero variant)")
    a = ap.parse_args()
    if a.machines < 2:
        raise SystemExit("--machines must be >= 2")
    N = a.machines
    with tempfile.TemporaryDirectory(prefix="harmony-cruise-") as tmp:
        data = os.path.join(tmp, "mlr.txt")
        gen_mlr(data, samples=a.samples, features=a.features, classes=a.classes, nnz=20,
                seed=1)
        results = [run_variant(v, data, tmp, a) for v in a.variants.split(",")]
    prof = next((r["profile"] for r in results if r["variant"] == "homog"), None)
    for r in results:
        r["sim"] = sim_variant(r["variant"], prof, r["worst"], a) if prof else None
    print(f"\nMLR {a.samples} x {a.features} features x {a.classes} classes on {N} machines; "
          f"epoch time: median of {a.measure} epochs after {a.settle}")
    print(f"{'variant':8} {'grid best (W,S)':>16} {'s':>7} {'worst':>7} {'cruise':>7} "
          f"{'x best':>7} {'from bad start':>15} {'cruise layout'}")
    for r in results:
        b, w = r["grid"][r["best"]], r["grid"][r["worst"]]
        lay = r["layout"]
        desc = (f"workers {lay['input_blocks']} servers {lay['model_blocks']}" if lay
                else "even")
        if r.get("kept"):
            k = r["kept"]
            desc = (f"kept the bad start ({desc}): predicted {k['now']:.3f}s there, "
                    f"{k['best']:.3f}s with {k['workers']} worker(s) and {k['servers']} "
                    f"server(s); {k['why']}")
        print(f"{r['variant']:8} {str(r['best']):>16} {b:7.3f} {w:7.3f} {r['tuned']:7.3f} "
              f"{r['tuned'] / b:7.2f} {r['bad']:7.3f} -> {1 - r['tuned'] / r['bad']:+.0%}  "
              f"{desc}")
    if prof:
        print(f"\nsimulator (harmony.sim, block_work) on the profile measured on the even "
              f"homogeneous layout: COMP {prof['cpu'] * 1e3:.1f} ms, PULL+PUSH "
              f"{prof['net'] * 1e3:.1f} ms, {prof['bytes'] / 1e6:.2f} MB per iteration, link "
              f"{prof['link'] / 1e6:.1f} MB/s; epoch (training part) runtime vs sim")
        for r in results:
            sm = r["sim"]
            errs = [abs(sm["grid"][k] / v - 1) for k, v in r["grid"].items()]
            cells = "  ".join(f"{k[0]},{k[1]}: {v:.3f}/{sm['grid'][k]:.3f}"
                              for k, v in sorted(r["grid"].items()))
            print(f"{r['variant']:8} {cells}")
            sbest = min(sm["grid"], key=sm["grid"].get)
            lay = sm["layout"]
            print(f"{'':8} |error| median {statistics.median(errs):.0%} max {max(errs):.0%}; "
                  f"best layout runtime {r['best']} sim {sbest}; Cruise runtime "
                  f"{r['tuned']:.3f} s, sim {sm['tuned'] if sm['tuned'] is None else round(sm['tuned'], 3)} s "
                  f"(its prediction {sm['predicted']}) with "
                  f"{(lay or {}).get('input_blocks')} / {(lay or {}).get('model_blocks')}")
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
