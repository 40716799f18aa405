"""Trace in, :class:`~harmony.sim.report.SimResult` out: the simulator's front.

``simulate(trace, machines, setup)`` turns the trace's jobs into what the
engine needs (:func:`sim_jobs`), runs :class:`~harmony.sim.engine.Simulator`
on the master core with the setup's policy and mode, and reports per-job
JCTs, makespan, utilization over time and the scheduler's decisions.

A *setup* names what the master would run: a mode (``isolated``, ``naive``,
``harmony``: its default policy) or a policy (``harmony-master --policy``),
optionally both as ``POLICY@MODE``.
"""
from __future__ import annotations

import math
import random
from typing import Callable

from harmony.cruise.plan import MAX_MOVES
from harmony.policies import registry as R
from harmony.policies.view import PROFILE_SAMPLES
from harmony.sim.engine import Contention, Outcome, SimJob, Simulator
from harmony.sim.report import JobResult, SimDecision, SimResult, UtilSample
from harmony.policies.curves import Utility
from harmony.sched.model import Profile, comm_cpu_at
from harmony.sim.trace import TraceJob, eval_per_machine, iteration_profile, sched_profile

#: at most this many simulated epochs per job after its profiling epochs: a
#: simulated epoch is one simulated iteration of k real ones (k x the COMP
#: and COMM seconds), k at least the trace's iterations per epoch, more for
#: jobs with more epochs than this; pauses and moves happen at epoch ends,
#: so a coarser grain delays them (bench/sim_paper.py: at 20, harmony's
#: speedup over isolated fell from 1.31x to 0.95x on one seed; 200 keeps the
#: paper workload's own epochs at the same simulation speed)
GRAIN = 200
#: epochs that run at the trace's own epoch length first (one simulated
#: iteration of iters_per_epoch real ones each): the scheduler profiles a
#: job on its first PROFILE_SAMPLES epochs
FINE_EPOCHS = PROFILE_SAMPLES + 1


def setup(name: str) -> tuple[str, str]:
    """(policy, mode) of a setup name (see the module docstring)."""
    policy, _, mode = name.partition("@")
    if not mode:
        if policy in R.MODES:
            return R.MODES[policy][0], policy
        mode = "harmony" if policy in R.POLICIES and R.make(policy).queued else "naive"
    if policy in R.MODES and policy not in R.POLICIES:
        policy = R.MODES[policy][0]
    if policy not in R.POLICIES:
        raise ValueError(f"unknown policy {policy!r}: choose from "
                         f"{', '.join(sorted(set(R.POLICIES) | set(R.MODES)))}")
    if mode not in R.MODES:
        raise ValueError(f"unknown mode {mode!r}: choose from {', '.join(sorted(R.MODES))}")
    return policy, mode


def sim_jobs(trace: list[TraceJob], bandwidth: float, grain: int = GRAIN,
             error: float = 0.0, seed: int = 1, min_epoch_s: float = 0.0) -> list[SimJob]:
    """The engine's jobs: profiles from ``iteration_profile`` (the
    scheduler's own DoP model), iterations grouped by ``grain`` (and, with
    ``min_epoch_s``, into simulated epochs of at least that many seconds at
    the DoP asked for), and an optional relative ``error`` injected into
    what each job reports (its sign drawn per job, seeded)."""
    rng = random.Random(seed)
    out = []
    for tj in trace:
        ipe, total = tj.iters_per_epoch, tj.iterations
        # the first epochs run real iterations (the scheduler profiles a job
        # on them); the rest in at most ``grain`` chunks of k real ones
        fine = min(total, FINE_EPOCHS * ipe)
        plan = [(1, min(ipe, fine - i)) for i in range(0, fine, ipe)]
        rest = total - fine
        if rest:
            k = max(ipe, math.ceil(rest / grain))
            if min_epoch_s > 0:
                it = sum(iteration_profile(tj, max(1, tj.machines), bandwidth))
                k = max(k, math.ceil(min_epoch_s / it) if it > 0 else k)
            plan += [(1, min(k, rest - i)) for i in range(0, rest, k)]
        link = tj.link or bandwidth
        memo: dict[int, tuple[float, float]] = {}

        def profile(m: int, tj: TraceJob = tj, memo: dict = memo) -> tuple[float, float]:
            p = memo.get(m)
            if p is None:
                p = memo[m] = iteration_profile(tj, m, bandwidth)
            return p
        # COMM's local part (traffic to the machine's own shard: CPU work,
        # the same at any DoP) is all of it at DoP 1; where its COMM's CPU
        # was measured (comm_cpu_s), that instead, at each DoP
        local = iteration_profile(tj, 1, bandwidth)[1] if tj.net_s else 0.0
        comm_cpu = None
        if tj.comm_cpu_s is not None:
            sp = sched_profile(tj, bandwidth)

            def comm_cpu(m: int, sp: Profile = sp) -> float:
                return comm_cpu_at(sp, m)
        e = error * (1 if rng.random() < 0.5 else -1) if error else 0.0
        out.append(SimJob(id=tj.id, app=tj.app, arrival=tj.arrival, epochs=len(plan),
                          machines=tj.machines, iters=ipe, profile=profile,
                          eval_cpu=tj.eval_s, bytes=tj.bytes, link=link, net_local=local,
                          model_bytes=tj.model_bytes, input_bytes=tj.input_bytes, error=e,
                          final_bytes=tj.model_bytes if tj.final_bytes is None
                          else tj.final_bytes, ckpt_bytes=tj.ckpt_bytes,
                          plan=plan, loss=tj.curve.loss if tj.curve is not None else None,
                          deadline=tj.deadline,
                          utility=tj.utility.spec() if tj.utility is not None else "",
                          startup=tj.startup_s, startup_cpu=tj.startup_cpu_s,
                          comm_cpu=comm_cpu,
                          eval_at=(lambda m, tj=tj: eval_per_machine(tj, m))
                          if tj.eval_at else None))
    return out


def simulate(trace: list[TraceJob], machines: int, name: str = "harmony", *,
             contention: Contention | None = None, bandwidth: float = 1.25e9,
             grain: int = GRAIN, error: float = 0.0, seed: int = 1, bucket: float | None = None,
             max_jobs_per_machine: int = 0, cpus: int = 8,
             progress: Callable[[float], None] | None = None,
             wall_limit: float | None = None, cruise: bool = False,
             cpu_speed: list[float] | None = None,
             net_speed: list[float] | None = None,
             max_moves: int = MAX_MOVES, statuses: bool = False,
             validate: bool = False, min_epoch_s: float = 0.0,
             sync_s: float = 0.0) -> SimResult:
    """Simulate ``trace`` on ``machines`` under the setup ``name``;
    ``cruise``, ``cpu_speed``, ``net_speed``, ``max_moves``, ``validate``:
    see :class:`Simulator`. ``statuses``: keep every job's ``harmony status
    --json`` record as the master core has it at the end (its epochs and
    events; its name is the trace's id) in ``meta["statuses"]``.
    ``min_epoch_s``: simulated epochs (after the profiling ones) of at least
    this many seconds (0: the grain alone): long traces of short jobs run
    faster, with pauses and moves at coarser epoch ends. ``sync_s``: the
    synchronizer's delay per round (:class:`Simulator`)."""
    policy, mode = setup(name)
    jobs = sim_jobs(trace, bandwidth, grain, error, seed, min_epoch_s)
    if bucket is None:
        span = max((j.arrival for j in jobs), default=0.0)
        bucket = max(1.0, span / 200)
    sim = Simulator(jobs, machines, policy=policy, mode=mode, contention=contention,
                    bucket=bucket, max_jobs_per_machine=max_jobs_per_machine, cpus=cpus,
                    progress=progress, wall_limit=wall_limit, cruise=cruise,
                    cpu_speed=cpu_speed, net_speed=net_speed, max_moves=max_moves,
                    validate=validate, sync_s=sync_s)
    o = sim.run()
    # what each job reported after its epochs (the master's own record)
    losses = {}
    for j in o.jobs:
        cj = sim.core.jobs.get(j["job"])
        if cj is not None:
            losses[j["id"]] = [(float(e["time"]), float(e["metrics"]["objective"]))
                               for e in cj.epochs
                               if (e.get("metrics") or {}).get("objective") is not None]
    res = to_result(o, name, trace, losses, bandwidth, machines)
    if cruise:      # the layout each job ended with (Cruise's, with its prediction)
        by_job = {j["job"]: j["id"] for j in o.jobs}
        res.meta["layouts"] = {by_job[jid]: cj.layout for jid, cj in sorted(sim.core.jobs.items())
                               if cj.layout is not None and jid in by_job}
    if statuses:
        res.meta["statuses"] = [cj.detail(now=sim.now) for _, cj in sorted(sim.core.jobs.items())]
    return res


def default_utility(tj: TraceJob, bandwidth: float, machines: int | None = None) -> Utility:
    """The utility of a job whose trace gives none, for OASiS's total-utility
    metric: the sigmoid ``oasis`` assumes for such a job (g1 = 1, g3 =
    ``DEFAULT_TARGET`` x its run time alone, g2 = 4 / g3), its run time
    alone here the trace's own: iterations x (COMP + COMM) at its requested
    machines (at most ``machines``) plus an evaluation per epoch."""
    from harmony.policies.oasis import DEFAULT_TARGET
    m = tj.machines if machines is None else max(1, min(tj.machines, machines))
    t_cpu, t_net = iteration_profile(tj, m, bandwidth)
    alone = tj.iterations * (t_cpu + t_net) + tj.epochs * tj.eval_s / m
    g3 = DEFAULT_TARGET * max(alone, 1.0)
    return Utility("sigmoid", (1.0, 4.0 / g3, g3))


def to_result(o: Outcome, name: str, trace: list[TraceJob] | None = None,
              losses: dict[str, list[tuple[float, float]]] | None = None,
              bandwidth: float = 1.25e9, machines: int | None = None) -> SimResult:
    """The engine's outcome as a :class:`SimResult`; with the ``trace``, each
    job also gets its loss range (its curve's loss at 0 and at all its
    iterations) and its utility (the trace's, else :func:`default_utility`),
    and ``losses`` (trace id -> (time, loss) reports) its loss over time."""
    by_id = {tj.id: tj for tj in trace or ()}
    jobs = []
    for j in o.jobs:
        jr = JobResult(j["id"], j["app"], j["arrival"], j["start"] if j["start"] is not None
                       else math.nan, j["end"] if j["end"] is not None else math.nan)
        tj = by_id.get(j["id"])
        if tj is not None:
            if tj.curve is not None:
                jr.loss_range = (tj.curve.loss(0), tj.curve.loss(tj.iterations))
                jr.loss = list((losses or {}).get(j["id"], ()))
            u = tj.utility or default_utility(tj, bandwidth, machines)
            jr.utility = u.spec()
        jobs.append(jr)
    b, n = o.util.bucket, o.machines
    util = [UtilSample(i * b, b, c / (b * n), (o.util.net[i] if i < len(o.util.net) else 0.0)
                       / (b * n)) for i, c in enumerate(o.util.cpu)]
    decisions = [SimDecision(d.get("t", 0.0), d.get("note", ""), {
        k: v for k, v in d.items() if k not in ("t", "note")}) for d in o.decisions]
    unfinished = [j["id"] for j in o.jobs if j["end"] is None]
    return SimResult(policy=name, jobs=jobs, util=util, decisions=decisions, mode=o.mode,
                     machines=n, makespan=o.makespan, meta={
                         "policy": o.policy, "mode": o.mode, "wall_s": o.wall,
                         "events": o.events, "messages": o.messages, "sim_time": o.sim_time,
                         "decisions_per_s": len(o.decisions) / o.wall if o.wall else 0.0,
                         "unfinished": unfinished})
