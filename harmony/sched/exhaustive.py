"""The exact optimum of U by enumeration, for small instances only.

Used by the tests and the quality benchmark as the ground truth the greedy
``schedule`` is measured against (the paper's "Oracle", §4.4.7). It tries
every subset of jobs to run, every partition of it into groups and every
split of all machines among the groups (each group at least one machine).

Because U (``model.score`` of Eq 4.4 over all M machines) is a sum over
groups of m_g * score(U(g)) / M, the search is a dynamic program over
subsets of jobs and machine counts, O(3^n * M^2): fine up to about 8 jobs
and 10 machines. With constant Tnet (every ``remote`` 0, the paper's model)
handing a group more machines never lowers its m_g * U(g), so plans that
leave machines idle are never better and are not enumerated. With remote >
0 COMM grows with m (``model.t_net_at``) and one more machine can lower
m_g * U(g); then a group on m machines may also use fewer and leave the rest
idle (at 0% in U), taken only when strictly better, so the result is the
optimum over all plans, idle machines included (``schedule`` always uses
every machine, so this can only be as good or better than it).
"""
from __future__ import annotations

from collections.abc import Sequence

from harmony.sched.grouping import Plan, PlannedGroup
from harmony.sched.model import (Profile, comm_cpu_at, group_iter_time, group_util, score,
                                 t_cpu_at, t_net_at)

MAX_JOBS = 12


def best_plan(profiles: Sequence[Profile], machines: int, run: str = "any") -> Plan:
    """The plan of maximum U, over the job sets ``run`` allows: "any"
    non-empty subset (the rest wait), a "prefix" of ``profiles`` (the sets
    Algorithm 1 chooses from: jobs run in the given priority order), or
    "all" jobs. Among plans of equal U the first found wins (no preference
    is promised). Raises ValueError beyond ``MAX_JOBS`` jobs."""
    if run not in ("any", "prefix", "all"):
        raise ValueError(f"run must be any, prefix or all, not {run!r}")
    n = len(profiles)
    if n > MAX_JOBS:
        raise ValueError(f"exhaustive search is for at most {MAX_JOBS} jobs, got {n}")
    if n == 0 or machines < 1:
        return Plan([], [p.id for p in profiles], (0.0, 0.0))
    full = (1 << n) - 1
    neg = float("-inf")
    # f[s][m]: m * score(U(group s on m machines)), for m = 1..M
    members = [[profiles[i] for i in range(n) if s >> i & 1] for s in range(full + 1)]
    f = [[neg] * (machines + 1) for _ in range(full + 1)]
    # with remote > 0: fu[s][m], the machines group s really uses (<= m)
    idle_ok = any(p.remote > 0 for p in profiles)
    fu = [list(range(machines + 1)) for _ in range(full + 1)]
    idx = [[i for i in range(n) if s >> i & 1] for s in range(full + 1)]
    for m in range(1, machines + 1):
        # group_util (Eq 4.1, 4.3) with each job's times at m computed once
        tc = [t_cpu_at(p, m) for p in profiles]
        tn = [t_net_at(p, m) for p in profiles]
        cc = [comm_cpu_at(p, m) for p in profiles]
        for s in range(1, full + 1):
            cpu = net = top = 0.0
            for i in idx[s]:
                cpu += tc[i] + cc[i]
                net += tn[i]
                top = max(top, tc[i] + tn[i])
            t = max(cpu, net, top)
            f[s][m] = m * score(cpu / t, net / t) if t > 0 else 0.0
    for s in range(1, full + 1):
        for m in range(1, machines + 1):
            if idle_ok and m > 1 and f[s][m - 1] > f[s][m] * (1 + 1e-12):
                f[s][m], fu[s][m] = f[s][m - 1], fu[s][m - 1]
    # best[s][m]: best sum over partitions of s into groups using exactly m machines
    best = [[neg] * (machines + 1) for _ in range(full + 1)]
    choice: list[list[tuple[int, int] | None]] = [[None] * (machines + 1)
                                                  for _ in range(full + 1)]
    best[0][0] = 0.0
    for s in range(1, full + 1):
        low = s & -s
        rest_bits = s ^ low
        sub = rest_bits
        while True:            # every group containing the lowest job of s
            g = sub | low
            r = s ^ g
            fg, br = f[g], best[r]
            for m in range(1, machines + 1):
                bs = best[s]
                for mg in range(1, m + 1):
                    v = fg[mg] + br[m - mg]
                    if v > bs[m]:
                        bs[m] = v
                        choice[s][m] = (g, mg)
            if sub == 0:
                break
            sub = (sub - 1) & rest_bits
    cands = {"any": range(1, full + 1), "prefix": [(1 << k) - 1 for k in range(1, n + 1)],
             "all": [full]}[run]
    top = max(cands, key=lambda s: best[s][machines])
    if best[top][machines] == neg:
        raise ValueError("no feasible plan")
    groups: list[PlannedGroup] = []
    s, m = top, machines
    while s:
        c = choice[s][m]
        assert c is not None
        g, mg = c
        ps = members[g]
        use = fu[g][mg]
        groups.append(PlannedGroup(tuple(p.id for p in ps), use, group_iter_time(ps, use)))
        s, m = s ^ g, m - mg
    cpu = sum(g.machines * group_util(members_of(profiles, g.jobs), g.machines)[0]
              for g in groups) / machines
    net = sum(g.machines * group_util(members_of(profiles, g.jobs), g.machines)[1]
              for g in groups) / machines
    running = {j for g in groups for j in g.jobs}
    return Plan(groups, [p.id for p in profiles if p.id not in running], (cpu, net))


def members_of(profiles: Sequence[Profile], ids: Sequence[str]) -> list[Profile]:
    by_id = {p.id: p for p in profiles}
    return [by_id[i] for i in ids]
