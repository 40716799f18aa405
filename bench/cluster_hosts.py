"""The same cluster bench on two hosts (or two dilations), job by job: the
check of the dilation against real cores (issue #31 item 6).

Two hosts' cores differ in speed, so their seconds cannot be compared as
they are. Every epoch record carries the CPU its COMPs took (``comp_cpu``,
real seconds, not dilated): the ratio of a job's median COMP CPU per
iteration on host B to host A is B's core speed against A's for that job's
kernels. Where the dilation holds, a job's time on B is its time on A
times that ratio, whatever the dilations. This prints, per mode both files
ran and per job: the JCTs, the COMP CPU ratio, the JCT ratio, and the
ratio of each part of an epoch (COMP, PULL, PUSH, the barrier, the
evaluation; undilated seconds) to show which part scales differently, and
each job's time from its submission to its first epoch's end (start-up).

    python bench/cluster_hosts.py A.json B.json [--modes isolated-1]

(A and B: ``bench/cluster_e2e.py --out`` files of the same trace, e.g. the
dilated run on a small host and ``bench/cluster_cores.sh`` on a large one.)
"""
from __future__ import annotations

import argparse
import json
import statistics

PARTS = ("comp", "pull", "push", "sync", "eval")


def _per_job(runs: list[dict]) -> dict[str, dict[str, float]]:
    """name -> medians over the runs' epochs (the first epoch left out: its
    start-up) of each part per iteration, COMP CPU per iteration, and the
    median JCT over the runs."""
    jct: dict[str, list[float]] = {}
    start: dict[str, list[float]] = {}
    parts: dict[str, dict[str, list[float]]] = {}
    for r in runs:
        for s in r["statuses"]:
            jct.setdefault(s["name"], []).append(s["ended"] - s["submitted"])
            if s["epochs"]:     # submitted to the first epoch's end: the start-up's share
                start.setdefault(s["name"], []).append(s["epochs"][0]["time"] - s["submitted"])
            acc = parts.setdefault(s["name"], {})
            for e in s["epochs"][1:]:
                t = e["timings"]
                it = max(1.0, float(t.get("iters") or 1.0))
                for k in PARTS + ("comp_cpu",):
                    acc.setdefault(k, []).append(float(t.get(k, 0.0)) / it)
    return {n: {"jct": statistics.median(jct[n]), "start": statistics.median(start.get(n, [0.0])),
                **{k: statistics.median(v) for k, v in parts[n].items() if v}}
            for n in jct if parts.get(n)}


def _ratio(b: float, a: float) -> float:
    return b / a if a > 0 else float("nan")


def compare(a: dict, b: dict, modes: list[str] | None = None) -> None:
    print(f"A: {a['machines']} machines at dilation {a['dilation']:g}; "
          f"B: {b['machines']} machines at dilation {b['dilation']:g}")
    for load, by_mode in a["runs"].items():
        for mode, runs_a in by_mode.items():
            runs_b = b["runs"].get(load, {}).get(mode, [])
            runs_a = [r for r in runs_a if "failed" not in r]
            runs_b = [r for r in runs_b if "failed" not in r]
            if (modes and mode not in modes) or not runs_a or not runs_b:
                continue
            ja, jb = _per_job(runs_a), _per_job(runs_b)
            print(f"\nload {load}, {mode}: {len(runs_a)} run(s) on A, {len(runs_b)} on B; "
                  f"core = B/A COMP CPU per iteration; error = JCT B / (JCT A x core) - 1")
            print(f"{'job':22s} {'JCT A':>7s} {'JCT B':>7s} {'B/A':>5s} {'core':>5s} "
                  f"{'error':>6s} {'first epoch A/B':>15s}  " + " ".join(f"{p:>5s}" for p in PARTS) + "  (B/A per part)")
            errs = []
            for n in sorted(set(ja) & set(jb)):
                x, y = ja[n], jb[n]
                core = _ratio(y["comp_cpu"], x["comp_cpu"])
                err = _ratio(y["jct"], x["jct"] * core) - 1
                errs.append(err)
                print(f"{n:22s} {x['jct']:6.1f}s {y['jct']:6.1f}s {_ratio(y['jct'], x['jct']):5.2f} "
                      f"{core:5.2f} {100 * err:+5.1f}% {x['start']:6.1f}/{y['start']:5.1f}s  "
                      + " ".join(f"{_ratio(y.get(p, 0.0), x.get(p, 0.0)):5.2f}" for p in PARTS))
            if errs:
                print(f"median |error| {100 * statistics.median(abs(e) for e in errs):.1f}%, "
                      f"within 5%: {sum(abs(e) <= 0.05 for e in errs)} of {len(errs)}")
            ma = statistics.median(r["makespan"] for r in runs_a)
            mb = statistics.median(r["makespan"] for r in runs_b)
            print(f"makespan A {ma:.1f}s B {mb:.1f}s ({mb / ma:.2f}x); mean JCT A "
                  f"{statistics.median(r['mean_jct'] for r in runs_a):.1f}s B "
                  f"{statistics.median(r['mean_jct'] for r in runs_b):.1f}s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--modes", default=None, help="comma-separated; default: every mode in both")
    args = ap.parse_args()
    with open(args.a) as fa, open(args.b) as fb:
        compare(json.load(fa), json.load(fb), args.modes.split(",") if args.modes else None)


if __name__ == "__main__":
    main()
