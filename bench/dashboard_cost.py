"""What watching costs the master (issue #37): its CPU with nobody
watching, then with browsers open on the dashboard (each fetches the
snapshot every second, as the page does) and Prometheus scraping
``/metrics`` every 5 s, side by side in one run, on a local cluster with
``--jobs`` running jobs.

The master's CPU is read with psutil from its process (every thread: the
loop, ZeroMQ's I/O thread and the dashboard's HTTP thread), over
``--window`` seconds per phase; the phases alternate over ``--rounds``.
Watched, the daemons also send their subtasks for the task stream.

    python bench/dashboard_cost.py [--jobs 20] [--browsers 5] [--window 20] [--rounds 3] [--sleep 0.5]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from apps_for_tests import TOY_APP  # noqa: E402
from harmony.client import Client  # noqa: E402
from harmony.cluster import LocalCluster  # noqa: E402


def _get(url: str, token: str | None) -> int:
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(req, timeout=10) as r:
        return len(r.read())


def watchers(url: str, token: str | None, browsers: int, stop: threading.Event) -> list:
    """Threads that poll as the page and Prometheus do; returns them and the
    byte counts they keep."""
    got = {"snapshot": [], "metrics": []}

    def browser() -> None:
        _get(url + "static/app.js", token)
        while not stop.is_set():
            got["snapshot"].append(_get(url + "api/snapshot", token))
            stop.wait(1.0)

    def prometheus() -> None:
        while not stop.is_set():
            got["metrics"].append(_get(url + "metrics", token))
            stop.wait(5.0)
    ts = [threading.Thread(target=browser, daemon=True) for _ in range(browsers)]
    ts.append(threading.Thread(target=prometheus, daemon=True))
    for t in ts:
        t.start()
    return [ts, got]


def master_cpu(proc: psutil.Process, window: float) -> float:
    c0, t0 = sum(proc.cpu_times()[:2]), time.perf_counter()
    time.sleep(window)
    return (sum(proc.cpu_times()[:2]) - c0) / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=20)
    ap.add_argument("--machines", type=int, default=2)
    ap.add_argument("--browsers", type=int, default=5)
    ap.add_argument("--window", type=float, default=20.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sleep", type=float, default=0.5,
                    help="each job's COMP seconds per iteration (fewer messages: the "
                         "master's own load stays small beside what is measured)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="harmony-dash-cost-") as tmp, \
            LocalCluster(a.machines, os.path.join(tmp, "cl"), port=0, mode="naive") as cl, \
            Client(cl.endpoint, keys=cl.keys) as c:
        dash = c.dashboard()
        jobs = [c.submit("toy.py", TOY_APP, ["--max-epochs", "1000000", "--sleep", str(a.sleep),
                                             "--keys", "2000"], 1, name=f"j{i}")
                for i in range(a.jobs)]
        deadline = time.time() + 120
        while sum(c.status(j)["state"] == "running" for j in jobs) < a.jobs:
            if time.time() > deadline:
                raise SystemExit("the jobs did not all start within 120 s")
            time.sleep(0.5)
        master = next(psutil.Process(p.pid) for p in cl.procs
                      if any("harmony.master" in x for x in p.args))
        time.sleep(3.0)        # past the start-ups
        print(f"{a.jobs} jobs running on {a.machines} machines (naive mode); "
              f"{os.cpu_count()}-core host, 1-minute load {os.getloadavg()[0]:.1f}", flush=True)
        rows: dict[str, list[float]] = {"idle": [], "watched": []}
        sizes: dict[str, list[int]] = {}
        for r in range(a.rounds):
            for phase in (("idle", "watched") if r % 2 == 0 else ("watched", "idle")):
                stop = threading.Event()
                ts = got = None
                if phase == "watched":
                    ts, got = watchers(dash["url"], dash["token"], a.browsers, stop)
                    time.sleep(2.0)      # the task stream starts with the next heartbeats
                cores = master_cpu(master, a.window)
                stop.set()
                if ts:
                    for t in ts:
                        t.join(timeout=15)
                    for k, v in got.items():
                        sizes.setdefault(k, []).extend(v)
                rows[phase].append(cores)
                print(f"  round {r} {phase:8s} master {100 * cores:5.1f}% of a core", flush=True)
        idle, watched = (statistics.median(rows[k]) for k in ("idle", "watched"))
        # paired by round: the master's own load drifts as the jobs' epochs pile up
        delta = statistics.median(w - i for w, i in zip(rows["watched"], rows["idle"]))
        snap = statistics.median(sizes.get("snapshot") or [0])
        print(f"\nmedians: master {100 * idle:.1f}% of a core unwatched, {100 * watched:.1f}% "
              f"with {a.browsers} browsers (1 snapshot/s each, {snap / 1024:.0f} KiB) and "
              f"Prometheus (/metrics every 5 s); watched - unwatched, per round: "
              f"{', '.join(f'{100 * (w - i):+.1f}%' for w, i in zip(rows['watched'], rows['idle']))}"
              f"; the dashboard costs {100 * delta:.1f}% of a core, median (goal <= 5%). "
              f"The snapshot's build, once a second, is in both.")
        for j in jobs:
            c.cancel(j)


if __name__ == "__main__":
    main()
