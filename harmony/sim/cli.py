"""``harmony sim``: run, compare, generate and import traces.

- ``harmony sim run --trace F --machines N --policy P [--mode M] [--out DIR]``
- ``harmony sim compare --trace F --machines N --policies a,b,c [--out DIR]``
- ``harmony sim gen KIND --out F`` (the paper's workloads, scheduler_e2e's)
- ``harmony sim import STATUS.json... --out F`` (a measured run as a trace)

A trace is ``--trace F`` (CSV, :mod:`harmony.sim.trace`) or ``--workload
KIND`` (generated, :mod:`harmony.sim.workload`).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from harmony.cruise.plan import MAX_MOVES
from harmony.sim import contention as CM
from harmony.sim.engine import Contention
from harmony.sim.report import SimResult, compare_table, sim_progress, summarize, \
    write_plots, write_result
from harmony.sim.run import GRAIN, setup, simulate
from harmony.sim.trace import TraceError, TraceJob, load_trace
from harmony.sim.workload import KINDS, PAPER_BANDWIDTH, generate

MODELS = {"calibrated": CM.CALIBRATED, "paper": CM.PAPER_LIKE, "ideal": CM.IDEAL}


def add_parser(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("sim", help="trace-driven simulation on the master's own core")
    ss = s.add_subparsers(dest="sim_cmd", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        src = p.add_mutually_exclusive_group(required=True)
        src.add_argument("--trace", help="a trace CSV (docs/sim.md)")
        src.add_argument("--workload", choices=KINDS, help="a generated workload")
        p.add_argument("--jobs", type=int, default=None, help="--workload: job count")
        p.add_argument("--mean-gap", type=float, default=None,
                       help="--workload: mean interarrival in seconds (default: the kind's, "
                            "240 s for paper: 1,000 jobs then arrive over about 67 hours)")
        p.add_argument("--seed", type=int, default=1)
        p.add_argument("--machines", type=int, required=True)
        p.add_argument("--bandwidth", type=float, default=PAPER_BANDWIDTH,
                       help="bytes/s per machine link (default 1.1 Gbit/s, the paper's)")
        p.add_argument("--contention", choices=sorted(MODELS), default="calibrated",
                       help="naive co-location's interference model (default: calibrated "
                            "on this project's measured runs)")
        p.add_argument("--grain", type=int, default=GRAIN,
                       help="simulated iterations per job at most (longer jobs run k real "
                            "iterations per simulated one)")
        p.add_argument("--error", type=float, default=0.0,
                       help="relative error injected into the profiles jobs report")
        p.add_argument("--cruise", action="store_true",
                       help="Cruise inside jobs (as harmony-master --cruise); executors' work "
                            "then follows the blocks they hold")
        p.add_argument("--cpu-speed", type=_factors, default=None,
                       help="CPU speed factor, one or one per machine (e.g. 1,1,0.5)")
        p.add_argument("--net-speed", type=_factors, default=None,
                       help="link rate factor of --bandwidth, one or one per machine")
        p.add_argument("--max-moves", type=int, default=MAX_MOVES, metavar="N",
                       help="a live resize's block moves at once over the job, as "
                            "harmony-master --max-moves (default 4; 0: all at once)")
        p.add_argument("--out", default=None, help="write JSON results (and plots) here")
        p.add_argument("--quiet", action="store_true", help="no progress bar")

    r = ss.add_parser("run", help="simulate one policy")
    common(r)
    r.add_argument("--policy", default="harmony",
                   help="a master policy or mode: isolated, naive, harmony, colocate, "
                        "least-loaded, match (alias muri), slaq, slaq-maxmin, oasis, mlfs, mlfs-c "
                        "(POLICY@MODE to set both)")
    r.add_argument("--mode", default=None, help="the execution mode (isolated, naive, harmony)")
    c = ss.add_parser("compare", help="simulate policies side by side")
    common(c)
    c.add_argument("--policies", default="isolated,naive,harmony")
    g = ss.add_parser("gen", help="write a generated workload as a trace CSV")
    g.add_argument("kind", choices=KINDS)
    g.add_argument("--jobs", type=int, default=None)
    g.add_argument("--seed", type=int, default=1)
    g.add_argument("--mean-gap", type=float, default=None, help="mean interarrival (s)")
    g.add_argument("--out", required=True)
    i = ss.add_parser("import", help="a trace from 'harmony status JOB --json' records")
    i.add_argument("status", nargs="+")
    i.add_argument("--jobs-log", default=None, help="the master's metrics/jobs.jsonl")
    i.add_argument("--out", required=True)


def _factors(text: str) -> list[float]:
    try:
        vals = [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of numbers: {text!r}")
    if not vals or not all(v > 0 for v in vals):
        raise argparse.ArgumentTypeError(f"factors must be positive: {text!r}")
    return vals


def _trace(a: argparse.Namespace) -> list[TraceJob]:
    if a.trace:
        return load_trace(a.trace)
    if a.mean_gap is not None and a.mean_gap < 0:
        raise ValueError("--mean-gap must be >= 0")
    return generate(a.workload, a.jobs, a.seed, a.mean_gap)


def _run(a: argparse.Namespace, trace: list[TraceJob], name: str) -> SimResult:
    cont = Contention(model=MODELS[a.contention], bandwidth=a.bandwidth)
    with sim_progress(1.0, f"{name}: {len(trace)} jobs, {a.machines} machines",
                      enabled=False if a.quiet else None) as update:
        return simulate(trace, a.machines, name, contention=cont, bandwidth=a.bandwidth,
                        grain=a.grain, error=a.error, seed=a.seed, progress=update,
                        cruise=a.cruise, cpu_speed=a.cpu_speed, net_speed=a.net_speed,
                        max_moves=a.max_moves)


def cmd_sim(a: argparse.Namespace) -> int:
    logging.getLogger("harmony.master").setLevel(logging.WARNING)
    try:
        if a.sim_cmd == "gen":
            from harmony.sim.trace import save_trace
            jobs = generate(a.kind, a.jobs, a.seed, a.mean_gap)
            save_trace(jobs, a.out)
            print(f"{len(jobs)} jobs -> {a.out}")
            return 0
        if a.sim_cmd == "import":
            from harmony.sim.importer import import_run
            jobs, skipped = import_run(a.status, a.jobs_log, a.out)
            print(f"{len(jobs)} jobs -> {a.out}" + (
                f"; skipped (never ran): {', '.join(skipped)}" if skipped else ""))
            return 0
        if a.machines < 1:
            raise ValueError("--machines must be >= 1")
        trace = _trace(a)
        if not trace:
            raise ValueError("the trace has no jobs")
        if a.sim_cmd == "run":
            name = a.policy if a.mode is None else f"{a.policy}@{a.mode}"
            setup(name)
            res = _run(a, trace, name)
            s = summarize(res)
            s.update({k: res.meta[k] for k in ("wall_s", "events", "decisions_per_s")})
            s["unfinished"] = len(res.meta["unfinished"])
            if "layouts" in res.meta:
                s["layouts"] = res.meta["layouts"]
            if a.out:
                path = write_result(res, a.out)
                print(f"results: {path}", file=sys.stderr)
            print(json.dumps(s, indent=2))
            return 0 if not res.meta["unfinished"] else 1
        names = [n.strip() for n in a.policies.split(",") if n.strip()]
        for n in names:
            setup(n)
        results = {n: _run(a, trace, n) for n in names}
        from rich.console import Console
        console = None if sys.stdout.isatty() else Console(width=210, force_terminal=False)
        compare_table(results, baseline=names[0] if "isolated" not in names else "isolated",
                      title=f"{len(trace)} jobs on {a.machines} machines", console=console)
        if a.out:
            os.makedirs(a.out, exist_ok=True)
            for n, r in results.items():
                write_result(r, a.out, n)
            for p in write_plots(results, a.out):
                print(f"plot: {p}")
        return 0 if all(not r.meta["unfinished"] for r in results.values()) else 1
    except (TraceError, ValueError, OSError) as exc:
        print(f"harmony sim: {exc}", file=sys.stderr)
        return 2
