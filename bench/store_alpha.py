"""Disk ratio α under a memory budget: fixed α ∈ {0, 0.1, …, 1} vs adaptive.

One emulated machine with a memory budget (``--memory-per-machine``,
enforced by the worker's emulated OOM killer) runs three co-located jobs in
naive mode (they share the machine's 2 cores freely):

  nmf-r8  : NMF rank 8,  32 MiB of input   (compute-bound: reloads hide)
  nmf-r16 : NMF rank 16, 16 MiB
  lasso   : Lasso (FISTA), 70 MiB          (light compute per byte: reloads
                                            cannot hide behind it)

For every setting — each fixed ``--disk-ratio`` for all three jobs, and
``auto`` (per job: estimated, then hill-climbed per epoch) — the jobs are
submitted together on the same cluster; the NMF jobs run ``--epochs``
epochs and Lasso runs until they end (then it is cancelled). The settings
run in rounds, in a different order each round (forward, backward, ...), to
spread the shared VM's drift over all of them.

Per job: seconds per iteration from the master's epoch report times, over
the epochs after the first that ran while all three jobs were training
(and, second table, over the second half of that window only); median over
rounds. Score of a setting: the mean over jobs of (the job's time / its best
time in any setting). A setting where the OOM killer stopped a job is OOM.

The budget is relative to what this host's executors use: the sum over the
jobs of (an idle executor with its app loaded, 24-44 MiB of imports, + 12 MiB
of working memory) + ``--room`` × the
jobs' total input. With the default room 0.8 the inputs exceed what the
budget leaves for data, not the budget itself; ``--scale 2`` doubles them.

    python bench/store_alpha.py [--rounds 2] [--epochs 12] [--room 0.8] [--scale 1]
    python bench/store_alpha.py --report      # tables and plot again from the JSON

Writes ``OUT/store_alpha.json`` and ``OUT/store_alpha.png`` (OUT: bench/out).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harmony.client import Client  # noqa: E402
from harmony.cluster import LocalCluster  # noqa: E402
from harmony.datagen.lasso import gen_lasso  # noqa: E402
from harmony.datagen.nmf import gen_nmf  # noqa: E402

MiB = 1 << 20
FIXED = [round(0.1 * i, 1) for i in range(11)]
OVERHEAD = 12 * MiB   # what a training executor holds besides input (measured ~10-15 MiB)


def idle_executor_bytes(app: str) -> int:
    """An executor's anonymous memory with its app loaded (imports: Lasso's
    SciPy is ~20 MiB that the other apps do not hold)."""
    code = ("import harmony.worker.executor, lmdb, zmq; from pathlib import Path; "
            "from harmony.app import load_app; "
            f"load_app(Path('apps/{app}').read_text(), '{app}'); "
            "from harmony.util.malloc import own_memory; print(own_memory()[1])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    return int(out.stdout.strip())


def make_data(tmp: str, scale: float) -> list[dict]:
    """The three jobs: (name, app file, args, approximate input MiB, lead).
    The NMF jobs ("lead") run a fixed number of epochs; Lasso runs until
    they finish and is then cancelled."""
    common = ["--blocks", "32", "--iters-per-epoch", "2"]
    jobs = []
    for i, (name, users, rank) in enumerate((("nmf-r8", 32000, 8), ("nmf-r16", 16000, 16))):
        path = os.path.join(tmp, f"{name}.txt")
        users = int(users * scale)
        gen_nmf(path, users=users, items=3000, rank=4, per_user=50, seed=10 + i)
        jobs.append({"name": name, "app": "nmf.py", "lead": True,
                     "args": ["--input", path, "--rank", str(rank), "--batch-size", "4096",
                              "--solver", "sgd", *common],
                     "input_mb": users * 50 * 20 / MiB + users * rank * 4 / MiB})
    path = os.path.join(tmp, "lasso.svm")
    samples = int(150000 * scale)
    gen_lasso(path, samples=samples, features=4000, nonzeros=40, nnz=40, noise=0.1, seed=3)
    jobs.append({"name": "lasso", "app": "lasso.py", "lead": False,
                 # L from a 0.5M-nonzero sample (6 MB; the default 4M holds 48 MB
                 # while the input is read, before any block can be spilled)
                 "args": ["--input", path, "--lam", "0.01", "--max-epochs", "100000",
                          "--lipschitz-sample-nnz", "500000", *common],
                 "input_mb": samples * 40 * 12.35 / MiB})   # CSR blocks, measured
    return jobs


def run_setting(c: Client, jobs: list[dict], ratio: str, epochs: int) -> dict:
    ids = {}
    for j in jobs:
        args = j["args"] + (["--max-epochs", str(epochs)] if j["lead"] else [])
        ids[j["name"]] = c.submit(j["app"], (ROOT / "apps" / j["app"]).read_text(),
                                  args + ["--disk-ratio", ratio], machines=1,
                                  name=f"{j['name']}@{ratio}")
    lead = {j["name"] for j in jobs if j["lead"]}
    sts = {}
    deadline = time.time() + 600
    while len(sts) < len(ids):
        for name, jid in ids.items():
            if name in sts:
                continue
            st = c.status(jid)
            if st["state"] in ("finished", "failed", "cancelled"):
                sts[name] = st
        if lead <= set(sts) and len(sts) < len(ids):     # the leads are done:
            for name, jid in ids.items():                 # stop the others
                if name not in sts:
                    try:
                        c.cancel(jid)
                    except Exception:
                        pass
        if time.time() > deadline:
            raise RuntimeError(f"setting {ratio} did not finish in time")
        time.sleep(0.2)
    out = {"ratio": ratio, "jobs": {}, "oom": [], "failed": []}
    for name, st in sts.items():
        err = st.get("error") or ""
        if st["state"] == "failed":
            (out["oom"] if "out of memory" in err else out["failed"]).append(name)
            out["jobs"][name] = {"state": st["state"], "error": err[:300]}
            continue
        eps = st["epochs"]
        out["jobs"][name] = {
            "state": st["state"],
            "times": [e["time"] for e in eps],
            "alpha": [e["timings"].get("alpha", 0.0) for e in eps],
            "stall": [e["timings"].get("stall", 0.0) for e in eps],
            "iters": eps[0]["timings"].get("iters", 1.0) if eps else 1.0,
            "store": st.get("store", {}),
        }
    ok = not out["oom"] and not out["failed"]
    out["per_job"] = per_job_times(out["jobs"]) if ok else None
    return out


def per_job_times(jobs: dict, late: bool = False) -> dict[str, float]:
    """Seconds per iteration of each job, over its epochs after the first
    that ran while every job was training (``late``: only those in the
    second half of that window, after adaptive α had time to move)."""
    start = max(j["times"][1] if len(j["times"]) > 1 else j["times"][0]
                for j in jobs.values())
    end = min(j["times"][-1] for j in jobs.values())
    if late:
        start = (start + end) / 2
    out = {}
    for name, j in jobs.items():
        t = j["times"]
        d = [(b - a) / j["iters"] for a, b in zip(t, t[1:]) if a >= start and b <= end]
        if not d:
            d = [(b - a) / j["iters"] for a, b in zip(t[1:], t[2:])] or [float("nan")]
        out[name] = statistics.mean(d)
    return out


def summarize(runs: dict[str, list[dict]], names: list[str], late: bool = False) -> dict:
    """Per setting: per-job seconds per iteration (median over rounds), and
    the score: the mean over jobs of (its time / its best time over all
    settings), i.e. the mean slowdown against each job's own best."""
    per = {s: [None if (r["oom"] or r["failed"]) else per_job_times(r["jobs"], late)
               for r in rs] for s, rs in runs.items()}
    med: dict[str, dict | None] = {}
    for s, rs in per.items():
        med[s] = None if any(r is None for r in rs) else \
            {n: statistics.median(r[n] for r in rs) for n in names}
    best = {n: min(m[n] for m in med.values() if m) for n in names}
    out = {}
    for s, rs in per.items():
        m = med[s]
        out[s] = {"per_job": m,
                  "score": None if m is None else statistics.mean(m[n] / best[n] for n in names),
                  "rounds": [None if r is None else statistics.mean(r[n] / best[n] for n in names)
                             for r in rs],
                  "oom": [r["oom"] for r in runs[s]]}
    return out


def report(res: dict) -> None:
    """Print both tables (whole run, late half) and the verdict."""
    names = list(res["jobs"])
    settings = list(res["raw"])
    for key, title in (("settings", "epochs after the first, while all jobs ran"),
                       ("settings_late", "second half of that window")):
        sm = res[key]
        print(f"\n{title}:\n")
        print("| α | " + " | ".join(f"{n} s/iter" for n in names)
              + " | score (mean slowdown vs each job's best) | OOM in rounds |")
        print("|---" * (len(names) + 3) + "|")
        order = [s for s in settings if s != "auto"] + (["auto"] if "auto" in sm else [])
        for s in order:
            v = sm[s]
            pj = v["per_job"]
            cells = [("OOM" if pj is None else f"{pj[n]:.3f}") for n in names]
            sc = "OOM" if v["score"] is None else f"{v['score']:.3f}"
            nom = sum(1 for o in v["oom"] if o)
            print(f"| {'adaptive' if s == 'auto' else s} | " + " | ".join(cells)
                  + f" | {sc} | {nom} of {len(v['oom'])} |")
        fixed = {s: v for s, v in sm.items() if s != "auto"}
        ranked = sorted(fixed.values(), key=lambda v: (v["score"] is None, v["score"] or 0))
        median = ranked[len(ranked) // 2]["score"] if ranked else None
        ok = {s: v["score"] for s, v in fixed.items() if v["score"] is not None}
        best = min(ok.items(), key=lambda kv: kv[1]) if ok else (None, None)
        auto = sm.get("auto", {}).get("score")
        fmt = (lambda x: "OOM" if x is None else f"{x:.3f}")
        print(f"\nbest fixed α {best[0]}: {fmt(best[1])}; median fixed α: {fmt(median)}; "
              f"adaptive: {fmt(auto)}")
        res.setdefault("verdict", {})[key] = {"best_fixed": best, "median_fixed": median,
                                               "adaptive": auto}


def plot(res: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11.5, 4.3))
    xs, ys, oom = [], [], []
    for r in FIXED:
        v = res["settings"].get(str(r))
        if v is None:
            continue
        if v["score"] is None:
            oom.append(r)
        else:
            xs.append(r)
            ys.append(v["score"])
            ax.plot([r] * len(v["rounds"]), [t for t in v["rounds"] if t], ".", color="0.6")
    auto = res["settings"].get("auto", {}).get("score")
    top = max(ys + [auto or 0]) * 1.12 if ys else 2.0
    ax.plot(xs, ys, "o-", label="fixed α for all jobs (median of rounds)")
    if oom:
        ax.plot(oom, [top] * len(oom), "x", color="red", ms=9, mew=2, label="out of memory")
    if auto:
        ax.axhline(auto, ls="--", color="green", label="adaptive α per job")
    ax.axhline(1.0, color="0.8", lw=0.8)
    ax.set_xlabel("fixed disk ratio α")
    ax.set_ylabel("iteration time / each job's best (mean over jobs)")
    ax.set_ylim(0.8, top * 1.06)
    ax.set_title(f"{len(res['jobs'])} co-located jobs, inputs {res['input_mb']:.0f} MiB, "
                 f"budget {res['budget_mb']:.0f} MiB", fontsize=10)
    ax.legend(fontsize=8, loc="lower left", framealpha=0.95)
    last = res["raw"]["auto"][-1]["jobs"] if res["raw"].get("auto") else {}
    t0 = min((j["times"][0] for j in last.values() if j.get("times")), default=0.0)
    for name, j in last.items():
        if j.get("times"):
            ax2.step([t - t0 for t in j["times"]], j["alpha"], where="post", marker=".",
                     ms=3, label=name)
    ax2.set_xlabel("seconds since the first epoch (adaptive, last round)")
    ax2.set_ylabel("α (per epoch)")
    ax2.set_ylim(-0.05, 1.05)
    ax2.legend(fontsize=8)
    ax2.set_title("adaptive α per job; NMF jobs end, then lasso is stopped", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--epochs", type=int, default=12, help="epochs of the NMF jobs")
    p.add_argument("--room", type=float, default=0.8,
                   help="budget = the executors' memory without input + ROOM x total input")
    p.add_argument("--scale", type=float, default=1.0, help="data size multiplier")
    p.add_argument("--mode", default="naive", choices=["naive", "harmony"])
    p.add_argument("--only", default=None, help="comma-separated settings (exploration)")
    p.add_argument("--out", default=str(ROOT / "bench" / "out"))
    p.add_argument("--keep-logs", default=None, help="copy the cluster's logs here")
    p.add_argument("--report", action="store_true", help="only recompute the tables and "
                   "redraw the plot from OUT/store_alpha.json")
    a = p.parse_args()
    if a.report:
        with open(os.path.join(a.out, "store_alpha.json")) as fh:
            res = json.load(fh)
        names = list(res["jobs"])
        res["settings"] = summarize(res["raw"], names)
        res["settings_late"] = summarize(res["raw"], names, True)
        report(res)
        plot(res, os.path.join(a.out, "store_alpha.png"))
        return 0
    os.makedirs(a.out, exist_ok=True)
    t_start = time.time()
    settings = [str(r) for r in FIXED] + ["auto"]
    if a.only:
        settings = [x.strip() for x in a.only.split(",")]
    with tempfile.TemporaryDirectory(prefix="harmony-alpha-") as tmp:
        jobs = make_data(tmp, a.scale)
        names = [j["name"] for j in jobs]
        input_mb = sum(j["input_mb"] for j in jobs)
        idles = {j["app"]: idle_executor_bytes(j["app"]) for j in jobs}
        idle = sum(idles[j["app"]] for j in jobs) / len(jobs)
        budget = int(sum(idles[j["app"]] + OVERHEAD for j in jobs) + a.room * input_mb * MiB)
        print(f"jobs {', '.join(names)}: inputs {input_mb:.0f} MiB in all; idle executor "
              f"{idle / MiB:.1f} MiB; budget {budget / MiB:.0f} MiB ({a.mode} mode)", flush=True)
        runs: dict[str, list[dict]] = {s: [] for s in settings}
        with LocalCluster(1, os.path.join(tmp, "cluster"), port=0, mode=a.mode,
                          memory_per_machine=budget) as cl, Client(cl.endpoint, keys=cl.keys) as c:
            for rnd in range(a.rounds):
                order = settings if rnd % 2 == 0 else settings[::-1]
                for s in order:
                    r = run_setting(c, jobs, s, a.epochs)
                    runs[s].append(r)
                    if r["oom"] or r["failed"]:
                        t = ("OOM " + ",".join(r["oom"])) if r["oom"] else \
                            ("FAILED " + ",".join(r["failed"]))
                    else:
                        t = "  ".join(f"{n} {v:.3f}" for n, v in r["per_job"].items()) + \
                            " s/iter"
                    print(f"round {rnd + 1}  α={s:>4}: {t}", flush=True)
                    for n, j in r["jobs"].items():
                        if j.get("error") and (a.only or "out of memory" not in j["error"]):
                            print("   ", n, j["error"][:200].replace("\n", " "))
                        if s == "auto" and "alpha" in j:
                            print(f"    {n}: alpha {' '.join(f'{x:.2f}' for x in j['alpha'])}",
                                  flush=True)
        if a.keep_logs:
            import shutil
            shutil.copytree(os.path.join(tmp, "cluster"), a.keep_logs, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("*.mdb", "*.bin"))
    res = {"budget_mb": budget / MiB, "input_mb": input_mb, "idle_executor_mb": idle / MiB,
           "jobs": {j["name"]: j["input_mb"] for j in jobs}, "mode": a.mode,
           "epochs": a.epochs, "rounds": a.rounds, "raw": runs,
           "settings": summarize(runs, names), "settings_late": summarize(runs, names, True),
           "wall_s": time.time() - t_start}
    report(res)
    print(f"wall time {res['wall_s']:.0f} s")
    with open(os.path.join(a.out, "store_alpha.json"), "w") as fh:
        json.dump(res, fh, indent=1)
    try:
        plot(res, os.path.join(a.out, "store_alpha.png"))
        print("plot:", os.path.join(a.out, "store_alpha.png"))
    except ImportError:
        print("matplotlib missing: no plot (pip install -e '.[bench]')")
    return 0


if __name__ == "__main__":
    sys.exit(main())
