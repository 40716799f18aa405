"""A worker daemon under many executors: the delay its subtask queues add
(issue #32, item 4: 16 executors of 20 ms subtasks, <= 1 ms at p99).

A real local cluster of ONE machine in harmony mode (a real master, a real
``harmony-worker`` daemon, real executor processes of a small app), and
``--jobs`` single-machine jobs whose COMP is ``--comp`` seconds of busy CPU
and whose PULL and PUSH move a few rows over loopback. Each job's leader is
its own machine, so every sync goes executor -> daemon -> the daemon's
synchronizer -> its queues -> the next grant, all inside the machine.

Measured from the daemon's own event log (``queue-events.jsonl``, one clock):

* **handover**: on the CPU queue, from the ``done`` of one COMP to the
  ``grant`` of the next, counted only when the next one was already enqueued
  before that ``done`` (it was waiting: the gap is the daemon's work, its
  handling of ``sub_done`` and the grant, not a lack of work); p50 / p99;
* **round**: per job, from the ``done`` of subtask s to the ``enqueue`` of
  s+1: the executor's release, its sync and the synchronizer (includes the
  executor's own work between its two messages);
* the CPU queue's busy share over the window: with the COMPs always
  waiting, what the handovers cost shows as the idle rest.

    python bench/daemon_queue.py                         # 16 jobs, 20 ms COMPs
    python bench/daemon_queue.py --jobs 4 --comp 0.02 --seconds 10

The executors share this machine's cores with the daemon (they run niced,
as the daemon starts them); on a 2-core VM 16 executor processes and the
daemon contend for 2 cores, so the figures are this VM's, labelled with it.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from apps_for_tests import TOY_APP  # noqa: E402
from harmony.client import Client  # noqa: E402
from harmony.cluster import LocalCluster  # noqa: E402


def _pct(xs: np.ndarray, q: float) -> float | None:
    return round(float(np.percentile(xs, q)), 3) if len(xs) else None


def analyse(events: list[dict], t0: float, t1: float) -> dict:
    """Handover and round delays (ms) from a daemon's queue events within
    [t0, t1)."""
    enq: dict[tuple[str, int], float] = {}
    done_at: dict[tuple[str, int], float] = {}
    last_cpu_done: tuple[float, tuple[str, int]] | None = None
    handover, rounds = [], []
    busy, running = 0.0, None
    for e in events:
        key, t = (e["job"], e["seq"]), e["t"]
        ev = e["ev"]
        if ev == "enqueue":
            enq[key] = t
            prev = done_at.pop((e["job"], e["seq"] - 1), None)
            if prev is not None and t0 <= t < t1:
                rounds.append(t - prev)
        elif ev == "grant" and e["kind"] == "cpu":
            if last_cpu_done is not None and t0 <= t < t1:
                td, _ = last_cpu_done
                if enq.get(key, float("inf")) <= td:    # it was waiting
                    handover.append(t - td)
            running = t
        elif ev == "done":
            done_at[key] = t
            if e["kind"] == "cpu":
                last_cpu_done = (t, key)
                if running is not None:
                    busy += max(0.0, min(t, t1) - max(running, t0))
                running = None
    h, r = np.asarray(handover) * 1e3, np.asarray(rounds) * 1e3
    return {"handovers": len(h), "handover_p50_ms": _pct(h, 50), "handover_p99_ms": _pct(h, 99),
            "handover_max_ms": round(float(h.max()), 3) if len(h) else None,
            "rounds": len(r), "round_p50_ms": _pct(r, 50), "round_p99_ms": _pct(r, 99),
            "cpu_busy": round(busy / (t1 - t0), 3) if t1 > t0 else None}


def run(jobs: int, comp: float, seconds: float, warmup: float, keep: bool = False,
        log=print) -> dict:
    tmp = tempfile.mkdtemp(prefix="harmony-daemon-queue-")
    cl = LocalCluster(1, tmp, port=0, mode="harmony", policy="colocate", dashboard=False)
    cl.start()
    try:
        with Client(cl.endpoint, keys=cl.keys) as c:
            args = ["--spin", str(comp), "--keys", "200", "--iters-per-epoch", "20",
                    "--max-epochs", "100000"]
            ids = [c.submit("toy.py", TOY_APP, args, machines=1) for _ in range(jobs)]
            deadline = time.time() + 120
            while time.time() < deadline:
                if all(c.status(j)["epochs_total"] >= 1 for j in ids):
                    break
                time.sleep(0.5)
            else:
                raise RuntimeError("the jobs did not all start within 120 s")
            log(f"  {jobs} jobs running; warm-up {warmup}s, window {seconds}s")
            time.sleep(warmup)
            t0 = time.time()
            time.sleep(seconds)
            t1 = time.time()
            for j in ids:
                c.cancel(j)
        path = os.path.join(cl.state_dir, "workers", "m0", "queue-events.jsonl")
        events = [json.loads(line) for line in open(path) if line.strip()]
        res = {"jobs": jobs, "comp_s": comp, "window_s": round(t1 - t0, 2),
               "cpus": os.cpu_count(), **analyse(events, t0, t1)}
        return res
    finally:
        cl.stop()
        if keep:
            log(f"  kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=16)
    p.add_argument("--comp", type=float, default=0.02, help="COMP seconds per iteration")
    p.add_argument("--seconds", type=float, default=15.0, help="measured window")
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--json", default=None)
    p.add_argument("--keep", action="store_true")
    a = p.parse_args(argv)
    res = run(a.jobs, a.comp, a.seconds, a.warmup, a.keep)
    print(" jobs  comp ms  handovers  hand p50  hand p99  hand max   rounds  round p50  "
          "round p99  cpu busy")
    print(f"{res['jobs']:5d}  {1e3 * res['comp_s']:7.1f}  {res['handovers']:9d}  "
          f"{res['handover_p50_ms']!s:>8}  {res['handover_p99_ms']!s:>8}  "
          f"{res['handover_max_ms']!s:>8}  {res['rounds']:7d}  {res['round_p50_ms']!s:>9}  "
          f"{res['round_p99_ms']!s:>9}  {res['cpu_busy']!s:>8}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(res, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
