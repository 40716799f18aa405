"""What a job's start-up costs the job already running on its machine
(the real-core runs of ``bench/cluster_e2e.py``: README, "What holds
co-location back on real cores"), with the start-up at the executor's own
priority and at nice 19 (``harmony.worker.executor.startup``), side by
side in one run.

One emulated machine on one real core (``cpus_per_machine=1``, pinned),
harmony mode (the subtask queues), ``colocate`` placement, undilated: job A
(LDA, COMP-heavy) runs; once it has done ``--warm`` epochs, job B (NMF, its
input read and parsed at start) is submitted onto the same machine. For
each setting, in alternating order over ``--rounds`` rounds:

* A's COMP wall time over its CPU time in the epochs that ended while B
  started (from B's submission to B's first epoch): 1.0 is a core to itself,
  2.0 half of it;
* A's seconds per iteration in those epochs against its epochs before B;
* B's start-up: seconds from its submission to its ``exec_ready``
  (``setup_s`` as the master recorded it) and to its first epoch.

    python bench/startup_interference.py [--rounds 3]
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
from harmony.cluster import LocalCluster, stop_clusters_on_sigterm  # noqa: E402
from harmony.datagen.lda import gen_lda  # noqa: E402
from harmony.datagen.nmf import gen_nmf  # noqa: E402


def one(nice: int, tmp: str, data: dict[str, str], a) -> dict:
    os.environ["HARMONY_STARTUP_NICE"] = str(nice)
    src = {k: (ROOT / "apps" / f"{k}.py").read_text() for k in ("lda", "nmf")}
    with LocalCluster(1, os.path.join(tmp, f"n{nice}-{time.time():.0f}"), port=0,
                      mode="harmony", policy="colocate", cpus_per_machine=1) as cl, \
            Client(cl.endpoint, keys=cl.keys) as c:
        ja = c.submit("lda.py", src["lda"], ["--input", data["lda"], "--topics", "20",
                                             "--max-epochs", "400", "--iters-per-epoch", "2"],
                      machines=1, name="A")
        t_end = time.time() + 120
        while time.time() < t_end and len(c.status(ja).get("epochs") or []) < a.warm:
            time.sleep(0.2)
        t_b = time.time()
        jb = c.submit("nmf.py", src["nmf"], ["--input", data["nmf"], "--rank", "16",
                                             "--max-epochs", "3", "--solver", "sgd"],
                      machines=1, name="B")
        first_b = None
        while time.time() < t_end:
            sb = c.status(jb)
            if sb.get("epochs"):
                first_b = sb["epochs"][0]["time"]
                break
            if sb["state"] in ("failed", "cancelled"):
                raise SystemExit(f"job B {sb['state']}: {sb.get('error')}")
            time.sleep(0.1)
        if first_b is None:
            raise SystemExit("job B did not start within 120 s")
        sa, sb = c.status(ja), c.status(jb)
        c.cancel(ja)
    before, during = [], []
    for e in sa["epochs"][1:]:
        t = e.get("timings") or {}
        if not t.get("comp_cpu"):
            continue
        row = (t["comp"] / t["comp_cpu"], t["train"] / max(1.0, t.get("iters", 1.0)))
        if e["time"] < t_b:
            before.append(row)
        elif e["time"] <= first_b:
            during.append(row)
    # [seconds since its process began, CPU seconds] per machine, at exec_ready
    setup = next((float(s[0]) for s in (sb.get("setups") or []) if s), None)
    med = lambda rows, i: statistics.median(r[i] for r in rows) if rows else float("nan")  # noqa: E731
    return {"nice": nice, "ratio_before": med(before, 0), "ratio_during": med(during, 0),
            "iter_before": med(before, 1), "iter_during": med(during, 1), "epochs": len(during),
            "b_ready": setup, "b_first": first_b - t_b}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warm", type=int, default=3, help="A's epochs before B is submitted")
    ap.add_argument("--data", default="/tmp/harmony-startup-interference")
    a = ap.parse_args()
    stop_clusters_on_sigterm()
    os.makedirs(a.data, exist_ok=True)
    data = {"lda": os.path.join(a.data, "lda.txt"), "nmf": os.path.join(a.data, "nmf.txt")}
    if not os.path.exists(data["lda"]):
        gen_lda(data["lda"], docs=2000, vocab=5000, topics=20, doc_len=200, seed=1)
    if not os.path.exists(data["nmf"]):
        gen_nmf(data["nmf"], users=20000, items=10000, rank=8, per_user=60, seed=2)
    print(f"1 machine on 1 core, undilated; A = LDA running, B = NMF starting beside it; "
          f"{os.cpu_count()}-core host, 1-minute load {os.getloadavg()[0]:.1f}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="harmony-startup-") as tmp:
        for r in range(a.rounds):
            for nice in ((0, 19) if r % 2 == 0 else (19, 0)):
                res = one(nice, tmp, data, a)
                rows.append(res)
                print(f"  round {r} nice {nice:2d}: A's COMP wall/CPU {res['ratio_before']:.2f} "
                      f"before, {res['ratio_during']:.2f} while B starts ({res['epochs']} "
                      f"epochs); A's s/iteration {res['iter_before']:.3f} -> "
                      f"{res['iter_during']:.3f}; B ready after {res['b_ready'] or 0:.1f} s, "
                      f"first epoch after {res['b_first']:.1f} s", flush=True)
    print("\nmedians        A's COMP wall/CPU while B starts   A's slowdown   B ready   B's first epoch")
    for nice in (0, 19):
        rs = [r for r in rows if r["nice"] == nice]
        m = {k: statistics.median(r[k] for r in rs if r[k] == r[k])
             for k in ("ratio_during", "iter_before", "iter_during", "b_first")}
        ready = statistics.median(r["b_ready"] or 0 for r in rs)
        print(f"  nice {nice:2d}      {m['ratio_during']:31.2f}   "
              f"{m['iter_during'] / m['iter_before']:11.2f}x   {ready:6.1f} s   "
              f"{m['b_first']:14.1f} s")


if __name__ == "__main__":
    main()
