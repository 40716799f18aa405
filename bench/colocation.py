"""Co-location benchmark: isolated vs naive vs harmony, side by side.

2 emulated machines (1 core each, a per-machine bandwidth cap), a mix of 4
NMF jobs at DoP 2, all submitted at once (CPU-heavy, network-heavy,
CPU-heavy, network-heavy), run to completion in each mode on a fresh local
cluster. Isolated runs one job at a time on both machines. Naive and harmony
run two jobs at a time on both machines (the colocate policy with
``--max-jobs-per-machine 2``): the first pair is complementary, and the next
waiting job starts as soon as one of the running ones ends.
``--placement pairs`` instead runs two fixed pairs (``--group``), one after
the other; ``--placement all`` co-locates all four at once.

  cpu-heavy x2 : few items, many ratings, high rank  -> long COMP, tiny COMM
  net-heavy x2 : many items, few ratings             -> big PULL/PUSH, short COMP

The cap and the CPU-heavy job's size are chosen so that the network-heavy
job's COMM time is comparable to the CPU-heavy job's COMP time (the run
prints both, measured in isolated mode). Reports makespan, mean JCT and average CPU and
network utilization, as ratios to isolated, and writes a per-machine
utilization timeline PNG.

    python bench/colocation.py [--rounds 3] [--epochs 6] [--bandwidth 12MB/s] [--out bench/out]

The plot shows the last round.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harmony.client import Client  # noqa: E402
from harmony.cluster import LocalCluster, stop_clusters_on_sigterm  # noqa: E402
from harmony.datagen.nmf import gen_nmf  # noqa: E402

MODES = ("isolated", "naive", "harmony", "harmony-fifo")


def make_jobs(tmp: str, a: argparse.Namespace) -> list[tuple[str, list[str]]]:
    cpu_data = os.path.join(tmp, "cpu.txt")
    net_data = os.path.join(tmp, "net.txt")
    gen_nmf(cpu_data, users=a.cpu_users, items=500, rank=8, per_user=a.cpu_per_user, seed=1)
    gen_nmf(net_data, users=a.net_users, items=a.net_items, rank=8, per_user=10, seed=2)
    common = ["--max-epochs", str(a.epochs), "--holdout", "0",
              "--iters-per-epoch", str(a.iters), "--solver", "sgd"]   # SGD: the README's figures
    cpu = ["--input", cpu_data, "--rank", str(a.cpu_rank), *common]
    net = ["--input", net_data, "--rank", "32", "--batch-size", "4096", *common]
    # (name, args, group): two complementary pairs, as Harmony would group them
    return [("cpu-heavy-1", cpu, "pair1"), ("net-heavy-1", net, "pair1"),
            ("cpu-heavy-2", cpu, "pair2"), ("net-heavy-2", net, "pair2")]


def run_mode(mode: str, jobs, tmp: str, a) -> dict:
    src = (ROOT / "apps" / "nmf.py").read_text()
    sd = os.path.join(tmp, mode)
    # harmony mode with the colocate policy (placement given here, not by
    # the Harmony scheduler); harmony-fifo: without CPU preemption
    base = mode.split("-")[0]
    with LocalCluster(2, sd, port=0, mode=base, cpus_per_machine=1,
                      policy="colocate" if base == "harmony" else None,
                      net_bandwidth=a.bandwidth, preempt=mode != "harmony-fifo",
                      max_jobs_per_machine=2 if a.placement == "two" else 0) as cl, \
            Client(cl.endpoint, keys=cl.keys) as c:
        # isolated ignores groups and runs one job at a time
        ids = {c.submit("nmf.py", src, args, machines=2, name=name,
                        group=group if a.placement == "pairs" else None): name
               for name, args, group in jobs}
        while True:
            sts = {j: c.status(j) for j in ids}
            if all(s["state"] in ("finished", "failed", "cancelled") for s in sts.values()):
                break
            time.sleep(0.5)
        time.sleep(1.2)  # one more utilization sample after the end
    bad = [f"{ids[j]}: {s['error']}" for j, s in sts.items() if s["state"] != "finished"]
    if bad:
        raise SystemExit(f"{mode}: jobs failed: {bad}")
    t0 = min(s["submitted"] for s in sts.values())
    t1 = max(s["ended"] for s in sts.values())
    samples = [json.loads(line) for line in
               open(os.path.join(sd, "master", "metrics", "machines.jsonl"))]
    samples = [s for s in samples if t0 <= s["t"] - s["dt"] / 2 <= t1]
    # windows where >= 2 jobs (one of each kind) run at once
    spans = [(s["started"], s["ended"], ids[j]) for j, s in sts.items()]

    def kinds_running(t):
        return {n.split("-")[0] for a_, b_, n in spans if a_ <= t <= b_}
    both = [s for s in samples if kinds_running(s["t"] - s["dt"] / 2) == {"cpu", "net"}]
    jct = {ids[j]: s["ended"] - s["submitted"] for j, s in sts.items()}
    prof = {ids[j]: {k: s["profile"].get(k) for k in ("t_cpu", "t_net", "t_iter")}
            for j, s in sts.items()}
    return {"mode": mode, "profiles": prof, "makespan": t1 - t0, "mean_jct": statistics.mean(jct.values()),
            "jct": jct, "cpu": statistics.mean(s["cpu"] for s in samples),
            "net": statistics.mean(s["net"] for s in samples),
            "cpu_both": statistics.mean(s["cpu"] for s in both) if both else float("nan"),
            "net_both": statistics.mean(s["net"] for s in both) if both else float("nan"),
            "t0": t0, "samples": samples, "spans": spans}


def plot(results: list[dict], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(results), 2, figsize=(12, 2.6 * len(results)),
                             sharey=True, squeeze=False)
    span = max(r["makespan"] for r in results)
    for row, r in enumerate(results):
        for col, m in enumerate(("m0", "m1")):
            ax = axes[row][col]
            ss = [s for s in r["samples"] if s["machine"] == m]
            t = [s["t"] - r["t0"] for s in ss]
            ax.step(t, [100 * s["cpu"] for s in ss], where="pre", label="CPU")
            ax.step(t, [100 * s["net"] for s in ss], where="pre", label="network")
            ax.set_xlim(0, span * 1.02)
            ax.set_ylim(0, 105)
            ax.set_title(f"{r['mode']}: machine {m} (makespan {r['makespan']:.1f}s)", fontsize=9)
            if col == 0:
                ax.set_ylabel("utilization %")
            if row == len(results) - 1:
                ax.set_xlabel("seconds since submission")
    axes[0][0].legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--bandwidth", default="12MB/s")
    ap.add_argument("--cpu-users", type=int, default=16000)
    ap.add_argument("--cpu-per-user", type=int, default=100)
    ap.add_argument("--cpu-rank", type=int, default=64)
    ap.add_argument("--net-users", type=int, default=20000)
    ap.add_argument("--net-items", type=int, default=150000)
    ap.add_argument("--iters", type=int, default=4, help="iterations per epoch")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--placement", default="two", choices=["two", "pairs", "all"],
                    help="naive/harmony: two: at most 2 jobs at a time, the next starts "
                         "when one ends; pairs: two fixed pairs, one after the other; "
                         "all: all 4 at once")
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds of all modes, interleaved; the summary reports medians")
    ap.add_argument("--out", default=str(ROOT / "bench" / "out"))
    a = ap.parse_args()
    stop_clusters_on_sigterm()
    os.makedirs(a.out, exist_ok=True)
    modes = a.modes.split(",")
    rounds: list[list[dict]] = []
    with tempfile.TemporaryDirectory(prefix="harmony-coloc-") as tmp:
        jobs = make_jobs(tmp, a)
        # rounds interleave the modes, so that a slow minute of a shared
        # machine hits every mode alike; the summary takes medians
        for rnd in range(a.rounds):
            results = []
            for mode in modes:
                r = run_mode(mode, jobs, tmp, a)
                results.append(r)
                print(f"round {rnd + 1} {mode:18} makespan {r['makespan']:6.1f}s  "
                      f"mean JCT {r['mean_jct']:6.1f}s  "
                      f"CPU {100 * r['cpu']:5.1f}%  net {100 * r['net']:5.1f}%  "
                      f"(both kinds running: CPU {100 * r['cpu_both']:5.1f}% "
                      f"net {100 * r['net_both']:5.1f}%)  JCTs "
                      + " ".join(f"{k}={v:.1f}" for k, v in sorted(r["jct"].items())),
                      flush=True)
            rounds.append(results)

    def med(mode: str, key: str) -> float:
        return statistics.median(r[key] for rs in rounds for r in rs if r["mode"] == mode)
    base_mode = "isolated" if "isolated" in modes else modes[0]
    base = next(r for r in rounds[-1] if r["mode"] == base_mode)
    print(f"\nper-iteration profiles in {base_mode} mode, last round "
          f"(COMP, PULL+PUSH, iteration):")
    for name, p in sorted(base["profiles"].items()):
        print(f"  {name:12} COMP {p['t_cpu']:.3f}s  COMM {p['t_net']:.3f}s  "
              f"iteration {p['t_iter']:.3f}s")
    print(f"\n4 NMF jobs (2 CPU-heavy, 2 network-heavy), DoP 2, placement {a.placement}, "
          f"2 machines x 1 core, "
          f"{a.bandwidth} per machine; medians of {a.rounds} round(s), ratios to "
          f"{base_mode} from the same rounds")
    print(f"{'mode':18} {'makespan':>9} {'speedup':>8} {'mean JCT':>9} {'speedup':>8} "
          f"{'CPU util':>9} {'net util':>9} {'CPU, both kinds':>16}")
    for mode in modes:
        print(f"{mode:18} {med(mode, 'makespan'):8.1f}s "
              f"{med(base_mode, 'makespan') / med(mode, 'makespan'):7.2f}x "
              f"{med(mode, 'mean_jct'):8.1f}s "
              f"{med(base_mode, 'mean_jct') / med(mode, 'mean_jct'):7.2f}x "
              f"{100 * med(mode, 'cpu'):8.1f}% {100 * med(mode, 'net'):8.1f}% "
              f"{100 * med(mode, 'cpu_both'):15.1f}%")
    results = rounds[-1]
    png = os.path.join(a.out, "colocation.png")
    try:
        plot(results, png)
        print(f"timeline: {png}")
    except ImportError:
        print("matplotlib not installed: no plot (pip install matplotlib)")
    with open(os.path.join(a.out, "colocation.json"), "w") as fh:
        json.dump([[{k: v for k, v in r.items() if k not in ("samples",)} for r in rs]
                   for rs in rounds], fh, indent=1)


if __name__ == "__main__":
    main()
