"""Every comparable policy side by side in the simulator (issue #15).

The paper workload (``harmony.sim.workload``, Poisson arrivals) on a
simulated cluster, each setup through the master's own core and policies
(``harmony.sim.run.simulate``, as ``harmony sim compare`` runs them), one
table from ``harmony.sim.report.compare_table``: mean / median / p95 JCT,
makespan, CPU and network utilization, with ratios to isolated, SLAQ's
average normalized loss over time and OASiS's total utility. Then per
setup: wall time, decisions, jobs stopped early (mlfs-c), the mean
normalized loss jobs ended at (above 0: stopped early) and unfinished jobs.
Then the seed papers' headline claims, each in direction on its own metric:

* SLAQ: lower average normalized loss than fair sharing (``naive``: every
  job starts at once on its requested machines, sharing them equally with
  whoever is there, the closest of our setups to a fair scheduler's equal
  shares; also against ``isolated``, FIFO), and its second claim, a lower
  mean time to 90% loss reduction than fair sharing; and the loss integral
  per job (normalized-loss minutes, ``report.loss_integral``), which does
  not reward keeping nearly converged jobs around as the average over
  active jobs does;
* MLFS: lower mean JCT than SLAQ (``mlfs`` and ``mlfs-c``);
* OASiS: higher total utility than FIFO (``isolated``).

    python bench/policies.py [--jobs 40] [--machines 50] [--seed 1]
        [--mean-gap S] [--timeout S] [--from DIR]
        [--policies isolated,naive,harmony,match,slaq,slaq-maxmin,oasis,mlfs,mlfs-c]
        [--out DIR]

The defaults (40 jobs on 50 machines) finish in a few minutes on 2 cores;
``--jobs 80 --machines 100`` is the paper's size (bench/sim_paper.py).
``--timeout S`` runs each setup in a child process and gives up on it after
S seconds of wall time (reported, left out of the table). ``--out DIR``:
per-setup JSON (with its summary), ``claims.json`` and the plots;
``--from DIR`` prints the tables again from such a directory (no run).
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import multiprocessing as mp
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harmony.sim.engine import Contention  # noqa: E402
from harmony.sim.report import SimResult, compare_table, read_result, summarize, \
    write_plots, write_result  # noqa: E402
from harmony.sim.run import setup, simulate  # noqa: E402
from harmony.sim.trace import TraceJob  # noqa: E402
from harmony.sim.workload import PAPER_BANDWIDTH, generate  # noqa: E402

ALL = "isolated,naive,harmony,match,slaq,slaq-maxmin,oasis,mlfs,mlfs-c"
#: (claim, setup, its metric, baseline setup, "lower"/"higher" is better)
CLAIMS = (("SLAQ: lower avg normalized loss than fair sharing (naive)", "slaq",
           "avg_norm_loss", "naive", "lower"),
          ("SLAQ: lower avg normalized loss than FIFO (isolated)", "slaq",
           "avg_norm_loss", "isolated", "lower"),
          ("SLAQ: lower time to 90% loss reduction than fair sharing (naive)", "slaq",
           "time_to_90", "naive", "lower"),
          ("SLAQ: lower normalized-loss minutes per job than fair sharing (naive)", "slaq",
           "norm_loss_s", "naive", "lower"),
          ("MLFS: lower mean JCT than SLAQ (mlfs)", "mlfs", "mean_jct", "slaq", "lower"),
          ("MLFS: lower mean JCT than SLAQ (mlfs-c)", "mlfs-c", "mean_jct", "slaq", "lower"),
          ("OASiS: higher total utility than FIFO (isolated)", "oasis", "total_utility",
           "isolated", "higher"))


def run_one(trace: list[TraceJob], machines: int, name: str, seed: int) -> SimResult:
    return simulate(trace, machines, name, contention=Contention(bandwidth=PAPER_BANDWIDTH),
                    bandwidth=PAPER_BANDWIDTH, seed=seed)


def _child(conn: Any, *args: Any) -> None:
    conn.send(run_one(*args))


def run_bounded(trace: list[TraceJob], machines: int, name: str, seed: int,
                timeout: float) -> SimResult | None:
    """``run_one`` in a child process; None if it takes over ``timeout`` s."""
    ctx = mp.get_context("fork")
    a, b = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_child, args=(b, trace, machines, name, seed), daemon=True)
    p.start()
    b.close()
    if a.poll(timeout):
        try:
            r = a.recv()
        except EOFError:
            r = None
        p.join()
        return r
    p.terminate()
    p.join()
    return None


def claims(sums: dict[str, dict[str, float]]) -> list[dict[str, Any]]:
    """Each of ``CLAIMS`` whose two setups ran: ours and whether it holds."""
    out = []
    for text, who, key, base, better in CLAIMS:
        if who not in sums or base not in sums:
            continue
        a, b = sums[who][key], sums[base][key]
        holds = None if math.isnan(a) or math.isnan(b) else (a < b if better == "lower"
                                                             else a > b)
        out.append({"claim": text, "setup": who, "metric": key, "value": a,
                    "baseline": base, "baseline_value": b, "holds": holds})
    return out


def _extra(r: SimResult, wall: float) -> tuple:
    """wall, decisions, jobs stopped early, mean final normalized loss,
    unfinished, policy, mode."""
    stopped = {j for d in r.decisions for j in (d.data.get("stop") or {})}
    return (wall, len(r.decisions), len(stopped), summarize(r)["final_norm_loss"],
            len(r.meta["unfinished"]), r.meta["policy"], r.meta["mode"])


def _v(key: str, x: float) -> str:
    if math.isnan(x):
        return "-"
    if key.endswith("jct") or key.startswith("time_to") or key == "norm_loss_s":
        return f"{x / 60:.1f}m"
    return f"{x:.3f}" if key == "avg_norm_loss" else f"{x:.2f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=40)
    ap.add_argument("--machines", type=int, default=50)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--policies", default=ALL)
    ap.add_argument("--mean-gap", type=float, default=None,
                    help="mean interarrival in s (default: the paper's 240)")
    ap.add_argument("--timeout", type=float, default=0.0,
                    help="s of wall time per setup at most (0: no limit)")
    ap.add_argument("--out", default=None, help="per-policy JSON, claims and plots here")
    ap.add_argument("--from", dest="src", default=None,
                    help="print the tables from a previous --out DIR (no run)")
    a = ap.parse_args()
    logging.getLogger("harmony.master").setLevel(logging.WARNING)
    names = [n.strip() for n in a.policies.split(",") if n.strip()]
    for n in names:
        setup(n)
    results, extra, gave_up = {}, {}, []
    if a.src:
        meta = json.loads((Path(a.src) / "claims.json").read_text())
        a.jobs, a.machines, a.seed, a.mean_gap = (meta["jobs"], meta["machines"], meta["seed"],
                                                  meta["mean_gap"])
        gave_up = list(meta.get("not_done", []))
        for n in names:
            path = Path(a.src) / f"{n}.json"
            if path.exists():
                r = read_result(path)
                results[n], extra[n] = r, _extra(r, r.meta.get("wall_total_s",
                                                               r.meta.get("wall_s", math.nan)))
        names, a.out = [], None
    trace = generate("paper", a.jobs, a.seed, a.mean_gap) if names else []
    for n in names:
        t = time.perf_counter()
        r = (run_bounded(trace, a.machines, n, a.seed, a.timeout) if a.timeout
             else run_one(trace, a.machines, n, a.seed))
        wall = time.perf_counter() - t
        if r is None:
            gave_up.append(n)
            print(f"{n}: not done within {a.timeout:.0f}s", file=sys.stderr, flush=True)
            continue
        r.meta["wall_total_s"] = wall
        results[n], extra[n] = r, _extra(r, wall)
        print(f"{n}: {wall:.1f}s", file=sys.stderr, flush=True)
    from rich.console import Console
    console = None if sys.stdout.isatty() else Console(width=210, force_terminal=False)
    gap = f", mean gap {a.mean_gap:g} s" if a.mean_gap is not None else ""
    compare_table(results, baseline="isolated" if "isolated" in results else next(iter(results)),
                  title=f"paper workload, {a.jobs} jobs (seed {a.seed}{gap}) on {a.machines} "
                        f"machines", console=console)
    print(f"{'setup':14s} {'policy@mode':22s} {'wall':>7s} {'decisions':>9s} "
          f"{'stopped early':>13s} {'final norm loss':>15s} {'unfinished':>10s}")
    for n, (wall, dec, stops, fin, unf, pol, mode) in extra.items():
        print(f"{n:14s} {pol + '@' + mode:22s} {wall:6.1f}s {dec:9d} {stops:13d} "
              f"{fin:15.3f} {unf:10d}")
    for n in gave_up:
        print(f"{n:14s} not done within {a.timeout:.0f}s of wall time")
    sums = {n: summarize(r) for n, r in results.items()}
    cl = claims(sums)
    print(f"\n{'claim':72s} {'ours':>10s} {'baseline':>10s}  holds")
    for c in cl:
        holds = "-" if c["holds"] is None else "yes" if c["holds"] else "no"
        print(f"{c['claim']:72s} {_v(c['metric'], c['value']):>10s} "
              f"{_v(c['metric'], c['baseline_value']):>10s}  {holds}")
    if a.out:
        for n, r in results.items():
            write_result(r, a.out, n)
        with open(Path(a.out) / "claims.json", "w") as fh:
            json.dump({"jobs": a.jobs, "machines": a.machines, "seed": a.seed,
                       "mean_gap": a.mean_gap, "not_done": gave_up, "claims": cl}, fh, indent=1)
        write_plots(results, a.out)
    return 0 if not gave_up and all(e[4] == 0 for e in extra.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
