"""Time dilation, validated: a job's undilated epoch time is the same at any D.

For each app (nmf, lda, mlr, lasso), DoP and placement (alone, or two
copies of the job co-located on the same machines, one group), the job runs
on a local cluster at each dilation D of ``--dilations`` (one cluster of
``max(DoP)`` machines per D, the jobs one config after another). Its epoch
time is the median wall between consecutive epoch reports on the master's
clock, which at dilation D is already in undilated seconds; the table prints
it beside the ratio to the first D's, the share of the epoch that is the
control plane at the first D (the executors' ``sync``: slot requests,
barriers, the master's round trips; it does not dilate, so at D it shrinks
to 1/D), and the real CPU utilization: the cluster's own processes (master,
daemons, executors: CPU seconds over wall x cores, from psutil) and the
whole host's (other users included).

A ratio near 1 means dilation is exact. Where it is below 1, fixed
per-message costs that do not dilate were a large share of the epoch at the
first D; where the first D over-subscribed the real CPU (cluster CPU near
100%), its epochs were slowed by contention and the ratio is below 1 for
that reason instead (the N machines at D need about N/D cores).

    python bench/dilation.py --quick              # < 3 min: every app alone at DoP 2, nmf paired; D 1, 2, 4
    python bench/dilation.py [--dilations 1,2,4] [--dops 1,2,4] [--epochs 6] [--out bench/out]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harmony.client import Client  # noqa: E402
from harmony.cluster import LocalCluster, stop_clusters_on_sigterm  # noqa: E402
from harmony.datagen.lasso import gen_lasso  # noqa: E402
from harmony.datagen.lda import gen_lda  # noqa: E402
from harmony.datagen.mlr import gen_mlr  # noqa: E402
from harmony.datagen.nmf import gen_nmf  # noqa: E402

APPS = ("nmf", "lda", "mlr", "lasso")
DONE = ("finished", "failed", "cancelled")


def make_data(tmp: str) -> dict[str, str]:
    out = {a: os.path.join(tmp, f"{a}.txt") for a in APPS}
    gen_nmf(out["nmf"], users=6000, items=1000, rank=8, per_user=40, seed=3)
    gen_lda(out["lda"], docs=8000, vocab=1000, topics=10, doc_len=80, seed=7)
    gen_mlr(out["mlr"], samples=80000, features=1000, classes=10, nnz=40, seed=1)
    gen_lasso(out["lasso"], samples=30000, features=5000, nonzeros=20, nnz=60, seed=2)
    return out


def job_args(app: str, data: dict[str, str], epochs: int) -> list[str]:
    common = ["--max-epochs", str(epochs), "--iters-per-epoch", "2"]
    return {"nmf": ["--input", data["nmf"], "--rank", "32", "--holdout", "0", "--solver", "sgd"],
            "lda": ["--input", data["lda"], "--topics", "10", "--blocks", "8"],
            "mlr": ["--input", data["mlr"]],
            "lasso": ["--input", data["lasso"], "--lam", "0.05"]}[app] + common


class CpuMeter:
    """CPU seconds of a cluster's processes and their children (sampled:
    the last reading of each pid counts), and of the host, over a window."""

    def __init__(self, roots: list[int]) -> None:
        self.roots, self.seen = roots, {}
        self._stop = threading.Event()
        self.t0, self.host0 = time.time(), psutil.cpu_times()
        self._th = threading.Thread(target=self._run, daemon=True)
        self._th.start()

    def _sample(self) -> None:
        for r in self.roots:
            try:
                procs = [psutil.Process(r)]
                procs += procs[0].children(recursive=True)
            except psutil.Error:
                continue
            for p in procs:
                try:
                    t = p.cpu_times()
                    self.seen[(p.pid, p.create_time())] = t.user + t.system
                except psutil.Error:
                    pass

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            self._sample()

    def reset(self) -> None:
        self._sample()
        self.base, self.t0, self.host0 = dict(self.seen), time.time(), psutil.cpu_times()

    def read(self) -> tuple[float, float]:
        """(cluster CPU, host CPU) since reset, as fractions of all cores."""
        self._sample()
        wall = max(1e-6, time.time() - self.t0) * psutil.cpu_count()
        ours = sum(v - self.base.get(k, 0.0) for k, v in self.seen.items())
        h0, h1 = self.host0, psutil.cpu_times()
        busy = lambda t: t.user + t.nice + t.system + getattr(t, "irq", 0) + \
            getattr(t, "softirq", 0) + getattr(t, "steal", 0)   # noqa: E731
        tot = lambda t: busy(t) + t.idle + getattr(t, "iowait", 0)   # noqa: E731
        return ours / wall, (busy(h1) - busy(h0)) / max(1e-6, tot(h1) - tot(h0))

    def stop(self) -> None:
        self._stop.set()


def epoch_time(st: dict) -> tuple[float | None, float | None]:
    """The median epoch (undilated seconds, on the master's clock) between
    consecutive reports, and the median share of it that was the control
    plane (the executors' ``sync``, summed over machines / DoP)."""
    eps = st.get("epochs") or []
    walls, sync = [], []
    for a, b in zip(eps, eps[1:]):
        if b["epoch"] == a["epoch"] + 1 and "time" in a and "time" in b:
            walls.append(b["time"] - a["time"])
            tm, m = b.get("timings") or {}, max(1, len(st.get("workers") or []) or 1)
            if "sync" in tm and walls[-1] > 0:
                sync.append(tm["sync"] / m / walls[-1])
    if not walls:
        return None, None
    return statistics.median(walls), (statistics.median(sync) if sync else None)


def run_config(c: Client, meter: CpuMeter, app: str, dop: int, pair: bool,
               data: dict[str, str], epochs: int, timeout: float) -> dict:
    src = (ROOT / "apps" / f"{app}.py").read_text()
    group = f"g-{app}-{dop}-{time.time_ns()}" if pair else None
    ids = [c.submit(f"{app}.py", src, job_args(app, data, epochs), machines=dop,
                    name=f"{app}-{i}", group=group) for i in range(2 if pair else 1)]
    deadline = time.time() + timeout
    steady = False   # CPU from every job's first epoch report (the epochs' share)
    ours = host = float("nan")
    while True:
        sts = [c.status(j) for j in ids]
        if not steady and all(s.get("epochs") for s in sts):
            steady = True
            meter.reset()
        if steady and any(s["state"] in DONE for s in sts) and ours != ours:
            ours, host = meter.read()       # until the first job ends
        if all(s["state"] in DONE for s in sts) or time.time() > deadline:
            break
        time.sleep(0.2)
    for j, s in zip(ids, sts):
        if s["state"] not in DONE:
            c.cancel(j)
    res = [epoch_time(s) for s in sts]
    ok = all(s["state"] == "finished" for s in sts)
    ep = [r[0] for r in res if r[0] is not None]
    sy = [r[1] for r in res if r[1] is not None]
    # whole jobs, in undilated seconds: submission to end (the master's
    # clock), and each executor's start-up (process start to ready)
    jct = [s["elapsed"] for s in sts if s["state"] == "finished" and s.get("elapsed")]
    setups = [w for s in sts for w, *_ in (s.get("setups") or [])]
    return {"ok": ok, "states": [s["state"] for s in sts],
            "jct": statistics.mean(jct) if jct else None,
            "startup": statistics.median(setups) if setups else None,
            "errors": [s.get("error") for s in sts if s.get("error")],
            "epoch": statistics.mean(ep) if ep else None,
            "sync": statistics.mean(sy) if sy else None, "cpu": ours, "host": host}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="every app alone at DoP 2 and nmf paired at DoP 2, D 1 and 4")
    ap.add_argument("--apps", default=",".join(APPS))
    ap.add_argument("--dilations", default="1,2,4")
    ap.add_argument("--cpus-per-machine", type=int, default=1,
                    help="cores per emulated machine (pinned; BLAS threads; default 1)")
    ap.add_argument("--dops", default="1,2,4")
    ap.add_argument("--placements", default="alone,pair")
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--timeout", type=float, default=240, help="per config and D (wall s)")
    ap.add_argument("--out", default=None, help="write the figures here (JSON)")
    a = ap.parse_args(argv)
    stop_clusters_on_sigterm()
    ds = [float(x) for x in a.dilations.split(",")]
    configs = [(app, int(m), p == "pair") for m in a.dops.split(",")
               for p in a.placements.split(",") for app in a.apps.split(",")]
    if a.quick:
        configs = [(app, 2, False) for app in APPS] + [("nmf", 2, True)]
        a.epochs = min(a.epochs, 5)
    t_start = time.time()
    results: dict[tuple, dict[float, dict]] = {k: {} for k in configs}
    with tempfile.TemporaryDirectory(prefix="harmony-dilation-") as tmp:
        data = make_data(tmp)
        for d in ds:
            machines = max(m for _, m, _ in configs)
            with LocalCluster(machines, os.path.join(tmp, f"d{d:g}"), port=0, mode="naive",
                              dashboard=False, dilation=d,
                              cpus_per_machine=a.cpus_per_machine) as cl, \
                    Client(cl.endpoint, keys=cl.keys, timeout_s=30) as c:
                meter = CpuMeter([p.pid for p in cl.procs])
                for key in configs:
                    r = run_config(c, meter, *key, data, a.epochs, a.timeout)
                    results[key][d] = r
                    print(f"  D={d:g} {key[0]:6s} DoP {key[1]} {'pair ' if key[2] else 'alone'}"
                          f" epoch {r['epoch'] or float('nan'):.3f}s  cluster CPU "
                          f"{100 * r['cpu']:.0f}%  host {100 * r['host']:.0f}%"
                          + ("" if r["ok"] else f"  {r['states']} {r['errors']}"), flush=True)
                meter.stop()
    base = ds[0]
    print(f"\nUndilated epoch time (s) per D, ratio to D={base:g}; control plane share of "
          f"the epoch at D={base:g}; real CPU (cluster / host) per D; "
          f"{psutil.cpu_count()} cores, {time.time() - t_start:.0f} s in all")
    head = "app     DoP place  " + "".join(f"  D={d:<5g}" for d in ds) + \
        "".join(f" ratio{d:g}" for d in ds[1:]) + "  sync " + \
        "".join(f"  CPU D={d:g}  " for d in ds)
    print(head)
    rows = []
    for (app, m, pair), per in results.items():
        b = per.get(base, {}).get("epoch")
        line = f"{app:7s} {m:3d} {'pair ' if pair else 'alone'} "
        line += "".join(f"  {per[d]['epoch']:7.3f}" if per.get(d, {}).get("epoch")
                        else "        -" for d in ds)
        ratios = {d: per[d]["epoch"] / b for d in ds[1:]
                  if b and per.get(d, {}).get("epoch")}
        line += "".join(f"  {ratios[d]:6.3f}" if d in ratios else "       -" for d in ds[1:])
        s = per.get(base, {}).get("sync")
        line += f"  {100 * s:3.0f}%" if s is not None else "     -"
        line += "".join(f"  {100 * per[d]['cpu']:3.0f}/{100 * per[d]['host']:3.0f}%  "
                        if d in per else "       -    " for d in ds)
        print(line)
        rows.append({"app": app, "dop": m, "pair": pair, "ratios": ratios,
                     "per_d": {str(d): per[d] for d in per}})
    print(f"\nWhole jobs: JCT and an executor's start-up (median), undilated s per D, "
          f"ratio to D={base:g}")
    print("app     DoP place  " + "".join(f"  JCT D={d:<5g}" for d in ds)
          + "".join(f" ratio{d:g}" for d in ds[1:])
          + "".join(f"  start D={d:<4g}" for d in ds) + "".join(f" ratio{d:g}" for d in ds[1:]))
    for (app, m, pair), per in results.items():
        line = f"{app:7s} {m:3d} {'pair ' if pair else 'alone'} "
        for what, width in (("jct", 11), ("startup", 12)):
            b = per.get(base, {}).get(what)
            line += "".join(f"  {per[d][what]:{width}.2f}" if per.get(d, {}).get(what)
                            else "  " + "-".rjust(width) for d in ds)
            line += "".join(f"  {per[d][what] / b:6.3f}" if b and per.get(d, {}).get(what)
                            else "       -" for d in ds[1:])
        print(line)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "dilation.json"), "w") as fh:
            json.dump({"dilations": ds, "rows": rows, "cores": psutil.cpu_count()}, fh,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
