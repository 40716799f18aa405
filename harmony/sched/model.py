"""Harmony's performance model (dissertation §4.3.2, Eq 4.1-4.4).

A job j is profiled as (Tcpu_j, Tnet_j, c_g): the per-iteration seconds of
its COMP subtasks and of its COMM (PULL + PUSH) subtasks, measured while its
group ran on c_g machines. COMP time scales as 1/DoP (Eq 4.2). A job's own
iteration time is Tcpu_j + Tnet_j (its subtasks run one after the other).

Decision (a deviation from the paper): COMM time depends on the DoP m.
In this runtime each machine of a job runs a worker and the server shard of
1/m of the model, and traffic to the local shard does not cross the
network, so a fraction (m-1)/m of a machine's PULL + PUSH bytes is remote:

    Tnet(m) = base + R * (m - 1) / m

with R (``Profile.remote``) the seconds to move all of one machine's PULL +
PUSH bytes per iteration over its link (bytes / link rate) and base the
local part (serialization etc.). At m = 1 a job uses no network at all; at
m = 2 half its traffic is remote. On small clusters (2-4 machines) this
matters a lot: a job profiled on one machine looks CPU-only. The paper's
constant Tnet (Eq 4.2) is the limit for large m, and the exact special case
R = 0 (the default): then ``t_net_at(p, m) == p.t_net`` for every m. Every
formula here evaluates COMM at the group's actual DoP (``t_net_at``).

Everything here is pure arithmetic on profiles: no clocks, no I/O.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

# Decision: the paper says "CPU utilization rates are treated more importantly
# than the network utilization in our model, since CPU resources directly
# contribute to the job progress" (§4.3.2) but gives no formula. U is compared
# as one scalar, the weighted mean below, with CPU counting twice as much as
# network. A scalar (not a lexicographic order) is needed because the
# regrouping rules compare gains in U as percentages ("< 5% of U").
CPU_WEIGHT = 2.0 / 3.0


@dataclass(frozen=True)
class Profile:
    """Per-iteration COMP seconds ``t_cpu`` and COMM seconds ``t_net`` of job
    ``id``, measured with the job's group on ``dop`` machines (c_g).

    The one form of a job's profile from the master to the policies: the
    master builds it from its moving averages of the executors' reports
    (``harmony.master.jobs.Job.sched_profile``), a policy's view carries it
    (``harmony.policies.view.JobView.profile``), the queue replay derives
    its ``Shape`` from it (``harmony.sched.replay.shape_at``) and the
    simulator builds one from a trace row (``harmony.sim.trace.sched_profile``).

    ``remote`` (default 0: the paper's constant Tnet) is R, the seconds per
    iteration to move all of one machine's PULL + PUSH bytes over its link
    (bytes / link rate); the part (dop-1)/dop of it was remote, and is
    contained in ``t_net``, when the profile was measured (see the module
    docstring and ``t_net_at``)."""
    id: str
    t_cpu: float
    t_net: float
    dop: int
    remote: float = 0.0
    # seconds per iteration the job spends outside its COMP and COMM when it
    # runs alone: queue grants, the synchronizer's round trips (measured)
    overhead: float = 0.0
    # the epoch's shape, for the queue replay (harmony.sched.replay):
    # iterations per epoch (0: not known), the evaluation's seconds at ``dop``
    # and the rest of the epoch's end (barrier, sums, report), measured alone
    iters: float = 0.0
    end_cpu: float = 0.0
    end_other: float = 0.0
    # the part of ``t_cpu`` that does not shrink with more machines (work on
    # the whole model in every COMP, e.g. MLR's local passes), measured once
    # the job ran at two DoPs (0: not known, the paper's 1/m of Eq 4.2)
    cpu_fixed: float = 0.0
    # CPU seconds per iteration its COMM costs each machine (serialization,
    # encryption, ZeroMQ's I/O threads, its shard serving the others: the
    # executor's CPU while training less its COMP thread's), measured at
    # ``dop``. It runs beside whatever COMP the machine runs (0: not known)
    comm_cpu: float = 0.0
    # the lowest COMP per iteration among its last few epochs at ``dop`` (0:
    # not known, take ``t_cpu``): what it computes when nothing else holds
    # the machine's memory or its host's cores. A move is judged on it
    # (``throughput.plan``'s widening): a COMP measured high for a few
    # epochs while other jobs start or end is not a reason to move.
    t_cpu_low: float = 0.0

    def __post_init__(self) -> None:
        if self.t_cpu < 0 or self.t_net < 0 or self.dop < 1 or not self.remote >= 0 \
                or not self.overhead >= 0 or not 0 <= self.cpu_fixed <= self.t_cpu \
                or not self.comm_cpu >= 0 or not 0 <= self.t_cpu_low <= self.t_cpu \
                or not all(x >= 0 for x in (self.iters, self.end_cpu, self.end_other)):
            raise ValueError(f"bad profile {self!r}: times must be >= 0 and dop >= 1")

    @property
    def work(self) -> float:
        """COMP seconds per iteration on one machine (Tcpu * c_g; with a
        fixed part f, f + (Tcpu - f) * c_g)."""
        return self.cpu_fixed + (self.t_cpu - self.cpu_fixed) * self.dop

    @property
    def net_base(self) -> float:
        """The local part of COMM, Tnet(1): ``t_net`` less the remote part it
        contained at ``dop``, R * (dop-1)/dop, and never below 0 (a ``remote``
        larger than the measured COMM allows is taken as all of it)."""
        if self.remote == 0:
            return self.t_net
        return max(0.0, self.t_net - self.remote * (self.dop - 1) / self.dop)


def steady(p: Profile) -> Profile:
    """The profile with its lowest recent COMP (``t_cpu_low``) as its COMP,
    the fixed part kept within it; itself where none is known."""
    if not 0 < p.t_cpu_low < p.t_cpu:
        return p
    return replace(p, t_cpu=p.t_cpu_low, cpu_fixed=min(p.cpu_fixed, p.t_cpu_low))


def t_cpu_at(p: Profile, m: float) -> float:
    """Eq 4.2: the job's COMP time per iteration on ``m`` machines, Tcpu *
    c_g / m; with a measured fixed part f (``cpu_fixed``), f + (Tcpu - f) *
    c_g / m.

    Decision (beyond the paper): a job's COMP may hold work that every
    machine does whatever its share of the input (MLR's local passes over
    its model). On the runtime, MLR widened from 2 to 4 machines kept its
    COMP per iteration (0.25-0.4 s of CPU on 2, 0.18-0.4 s on 4) while its
    remote traffic grew by half: 1.6 s per epoch instead of 1.0
    (bench/cluster_e2e.py). One DoP cannot tell the parts apart; a second
    can (``fixed_part``), and the scheduler then narrows it back."""
    if p.cpu_fixed:
        return p.cpu_fixed + (p.t_cpu - p.cpu_fixed) * p.dop / m
    return p.t_cpu * p.dop / m


def fixed_part(m1: int, t1: float, m2: int, t2: float) -> float:
    """The fixed part f of COMP per iteration at DoP ``m2`` from the COMP
    seconds ``t1`` measured at ``m1`` and ``t2`` at ``m2``, fitting t(m) =
    f + w/m: f = (m2 t2 - m1 t1) / (m2 - m1), clamped to [0, t2] (noise may
    put it outside). 0 when the DoPs are equal."""
    if m1 == m2 or m1 < 1 or m2 < 1:
        return 0.0
    f = (m2 * t2 - m1 * t1) / (m2 - m1)
    return min(max(0.0, f), t2)


def t_net_at(p: Profile, m: float) -> float:
    """The job's COMM time per iteration on ``m`` machines:
    ``net_base + remote * (m-1)/m``, i.e.
    max(0, t_net - remote*(dop-1)/dop) + remote*(m-1)/m.

    Decision (not the paper's Eq 4.2, where Tnet is constant): the share
    (m-1)/m of a machine's PULL + PUSH bytes goes to the other machines'
    server shards (see the module docstring). ``t_net_at(p, p.dop) ==
    p.t_net`` (up to rounding) unless ``remote`` exceeds what ``t_net`` can
    hold; with ``remote == 0`` it is ``p.t_net`` for every m."""
    if p.remote == 0:
        return p.t_net
    return p.net_base + p.remote * (m - 1) / m


def comm_cpu_at(p: Profile, m: float) -> float:
    """The CPU seconds per iteration the job's COMM costs each machine on
    ``m`` machines: ``comm_cpu`` scaled with the share of bytes that cross
    the network, (m-1)/m against (dop-1)/dop. Decision: that work is mostly
    per remote byte (encryption, framing, the I/O threads, serving the other
    machines' pulls); traffic to the machine's own shard takes no ZeroMQ
    round trip. Measured alone on one machine, the job's 2-3 ms an iteration
    is all local and is kept at every m (nothing to scale it by)."""
    if p.comm_cpu == 0 or p.dop == 1:
        return p.comm_cpu
    return p.comm_cpu * (m - 1) / m * p.dop / (p.dop - 1)


def job_iter_time(p: Profile, m: float) -> float:
    """The job's own iteration time on ``m`` machines (Tj_itr = Tcpu + Tnet,
    plus its measured per-iteration overhead)."""
    return t_cpu_at(p, m) + t_net_at(p, m) + p.overhead


def group_iter_time(profiles: Iterable[Profile], m: float) -> float:
    """Eq 4.1: max(sum Tcpu_j(m), sum Tnet_j(m), max_j Tj_itr(m)) for one
    group on ``m`` machines; 0 for an empty group.

    Decision (beyond the paper): the machine's CPU also does every job's
    COMM work (``comm_cpu_at``), so the CPU's sum holds it beside the
    COMPs. A job's own time does not: alone, that work is inside its COMM."""
    cpu = net = top = 0.0
    for p in profiles:
        c, n = t_cpu_at(p, m), t_net_at(p, m)
        cpu += c + comm_cpu_at(p, m)
        net += n
        top = max(top, c + n + p.overhead)
    return max(cpu, net, top)


def group_util(profiles: Sequence[Profile], m: float) -> tuple[float, float]:
    """Eq 4.3: (sum Tcpu_j(m) / Tg_itr, sum Tnet_j(m) / Tg_itr) of one group
    on ``m`` machines; (0, 0) for an empty or all-zero group."""
    t = group_iter_time(profiles, m)
    if t <= 0:
        return 0.0, 0.0
    return (sum(t_cpu_at(p, m) + comm_cpu_at(p, m) for p in profiles) / t,
            sum(t_net_at(p, m) for p in profiles) / t)


def cluster_util(groups: Iterable[tuple[Sequence[Profile], int]],
                 total_machines: int | None = None) -> tuple[float, float]:
    """Eq 4.4: the machine-weighted mean of the groups' utilizations.

    ``groups`` holds (profiles, machines) per group. With ``total_machines``
    the denominator is the whole cluster, so idle machines count as 0%
    utilization; without it, it is the machines of the groups, as in Eq 4.4
    (the same thing when every machine belongs to a group, as in every plan
    ``schedule`` makes).
    """
    cpu = net = 0.0
    used = 0
    for profiles, m in groups:
        c, n = group_util(profiles, m)
        cpu += m * c
        net += m * n
        used += m
    denom = used if total_machines is None else total_machines
    if denom <= 0:
        return 0.0, 0.0
    return cpu / denom, net / denom


def score(u_cpu: float, u_net: float) -> float:
    """U as one number: ``CPU_WEIGHT * u_cpu + (1 - CPU_WEIGHT) * u_net``.

    Decision: CPU weighs twice as much as network (see ``CPU_WEIGHT``); the
    paper: "CPU utilization rates are treated more importantly than the
    network utilization in our model". Because it is linear, the score of the
    cluster is the machine-weighted mean of the groups' scores.
    """
    return CPU_WEIGHT * u_cpu + (1.0 - CPU_WEIGHT) * u_net
