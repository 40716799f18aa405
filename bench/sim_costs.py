"""Where a simulator run's CPU goes (issue #32 item 6), on the ``short``
workload bounded by simulated time (so that two versions of the engine run
the same events): the master core's handling of messages, its decisions
(the ticks that schedule: the core's scheduling and the policy), and the
rest (the engine, the simulated machines, executors and daemon queues);
per event, per message, per decision, and the decisions' cost by the
number of jobs waiting.

It also measures what simulating a group of identical machines once
(one machine standing for every machine of a job whose machines all hold
the same queued jobs) could save at most: every 5,000 events it looks at
the machines running executors and counts, for each, ``(w - 1) / w`` where
``w`` is the size of its symmetric group (1 if it has none).

    python bench/sim_costs.py --short 10000x1000 --setup harmony --hours 40
    python bench/sim_costs.py --short 2500x64 --setup harmony-util --hours 100
"""
from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harmony.master import core as C  # noqa: E402
from harmony.sim.engine import Simulator  # noqa: E402
from harmony.sim.run import setup, sim_jobs  # noqa: E402
from harmony.sim.workload import PAPER_BANDWIDTH, generate  # noqa: E402

WAITING = ("waiting", "paused", "profiled")


def symmetric(sim: Simulator) -> tuple[float, int]:
    """(sum over busy machines of (w - 1) / w, busy machines) now."""
    core, saved, busy = sim.core, 0.0, 0
    for m in sim.machines.values():
        if not m.execs:
            continue
        busy += 1
        here = frozenset(m.execs)
        if not all(ex.queued for ex in m.execs.values()):
            continue
        mates: set[str] | None = None
        for jid in here:
            cj = core.jobs.get(jid)
            ws = set(cj.workers) if cj is not None else set()
            mates = ws if mates is None else mates & ws
        if not mates or any(frozenset(sim.machines[n].execs) != here
                            or not all(e.queued for e in sim.machines[n].execs.values())
                            for n in mates):
            continue
        saved += (len(mates) - 1) / len(mates)
    return saved, busy


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--short", default="2500x64", metavar="JOBSxMACHINES")
    ap.add_argument("--setup", default="harmony-util")
    ap.add_argument("--hours", type=float, default=60.0, help="simulated hours run")
    a = ap.parse_args()
    logging.getLogger("harmony.master").setLevel(logging.ERROR)
    nj, nm = (int(x) for x in a.short.split("x"))
    policy, mode = setup(a.setup)
    jobs = sim_jobs(generate("short", nj, 1), PAPER_BANDWIDTH)
    span = max(j.arrival for j in jobs)
    sym = [0.0, 0]
    spent = {"msg": 0.0, "tick": 0.0, "other": 0.0, "sym": 0.0}

    def progress(_: float) -> None:
        t = time.process_time()
        s, b = symmetric(sim)
        sym[0] += s
        sym[1] += b
        spent["sym"] += time.process_time() - t     # (not the engine's: left out)
    sim = Simulator(jobs, nm, policy=policy, mode=mode, bucket=max(1.0, span / 200), cpus=8,
                    horizon=a.hours * 3600, progress=progress)
    core, handle, pc = sim.core, sim.core.handle, time.perf_counter
    count = {"msg": 0, "tick": 0}
    decisions: list[tuple[int, float]] = []     # (jobs waiting, seconds) of each tick that decided

    def timed(ev: object, now: float) -> list:
        t = pc()
        try:
            return handle(ev, now)
        finally:
            d = pc() - t
            kind = type(ev)
            if kind is C.Received:
                spent["msg"] += d
                count["msg"] += 1
            elif kind is C.Tick:
                spent["tick"] += d
                count["tick"] += 1
                if d > 2e-4:
                    decisions.append((sum(1 for j in core.jobs.values()
                                          if j.state.value in WAITING), d))
            else:
                spent["other"] += d
    core.handle = timed             # the engine calls core.handle (bound at run())
    c0, w0 = time.process_time(), pc()
    o = sim.run()
    cpu, wall = time.process_time() - c0 - spent["sym"], pc() - w0
    ev, dec = o.events, len(o.decisions)
    engine = cpu - spent["msg"] - spent["tick"] - spent["other"]
    print(f"{a.short} {a.setup}, {a.hours:g} simulated h: {cpu:.1f} s CPU ({wall:.1f} s wall), "
          f"{ev} events, {o.messages} messages, {dec} decisions, "
          f"{sum(1 for j in o.jobs if j['end'] is not None)} jobs done")
    print(f"  per event: {1e6 * cpu / ev:.1f} us of CPU ({ev / cpu:.0f} events per CPU s)")
    print(f"  core, messages: {spent['msg']:.1f} s ({100 * spent['msg'] / cpu:.0f}%), "
          f"{1e6 * spent['msg'] / max(1, count['msg']):.1f} us each, "
          f"{o.messages / ev:.2f} per event")
    print(f"  core, ticks (scheduling + policy): {spent['tick']:.1f} s "
          f"({100 * spent['tick'] / cpu:.0f}%), {1e3 * spent['tick'] / max(1, dec):.1f} ms "
          f"per decision")
    print(f"  engine, machines, executors, daemon queues: {engine:.1f} s "
          f"({100 * engine / cpu:.0f}%), {1e6 * engine / ev:.1f} us per event")
    print(f"  identical machines as one could save at most "
          f"{100 * sym[0] / max(1, sym[1]):.0f}% of the machines' events")
    if decisions:
        decisions.sort()
        n = len(decisions)
        for lo, hi in ((0, n // 3), (n // 3, 2 * n // 3), (2 * n // 3, n)):
            part = decisions[lo:hi]
            if part:
                print(f"  decisions with {part[0][0]}-{part[-1][0]} jobs waiting: "
                      f"{1e3 * sum(d for _, d in part) / len(part):.1f} ms each ({len(part)})")


if __name__ == "__main__":
    main()
