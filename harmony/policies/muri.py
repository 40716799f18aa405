"""Muri-style matching (``match``, alias ``muri``): pair jobs whose stages use different
resources, the pairing picked by maximum-weight matching.

Muri (SIGCOMM'22) interleaves the stages of jobs that use different
resources and picks the groups by maximum-weight matching on a graph of
jobs weighted by their interleaving efficiency. Here:

* **Efficiency** of a pair (a, b) on m machines: the sum of their
  per-iteration CPU and network seconds over twice the pair's interleaved
  iteration time, (Tcpu_a + Tnet_a + Tcpu_b + Tnet_b) / (2 * Titr_ab), with
  Titr_ab the Harmony model of the runtime's subtask queues
  (``harmony.sched.model.group_iter_time``, Eq 4.1) and every term at the
  pair's DoP (``t_cpu_at``/``t_net_at``). 1 is a perfect interleave (both
  resources busy all the time), 0.5 no gain over running the two one after
  the other. Pairs below ``MIN_EFF`` (a gain under ``MIN_GAIN``) get no edge.
* **Matching**: networkx's ``max_weight_matching`` (Edmonds' blossom) on
  the profiled waiting jobs (the first ``MAX_POOL`` in FIFO order) and the
  running jobs that run alone ("open" singletons: a waiting job may join
  one on its machines). Two running singletons are not merged (that would
  be a migration; this policy never moves a running job).
* **Groups of 2, as Muri does with two resource types.** Muri's groups
  have at most k jobs for k interleaved resource types: it matches jobs
  into pairs (Blossom) and, with k = 4 (storage IO, CPU, GPU, network),
  matches the pairs again into groups of up to 4 (repeated matching,
  weight = the merged group's efficiency). Its interleaved iteration time
  of a group runs job ``idx``'s stage on resource (stage - idx) mod k (the
  paper's Figure 5; ``calc_iteration_time`` in its simulator,
  github.com/Rivendile/Muri ``simulator/matching.py``), so a (k+1)-th job
  would need a resource another job of the group holds at the same time;
  the efficiency is work / (k x interleaved time). This runtime interleaves
  two resource types (COMP on the CPU queue, PULL/PUSH on the NET queue),
  so k = 2 and Muri's grouping stops at pairs: its abstract's "perfect
  grouping plan for ... two resource types" is one Blossom round. The
  queues themselves would serve more jobs per machine (FIFO grants: one
  COMP and two transfers at a time; Harmony's own groups are larger), so a
  group of 3-4 here would be a Harmony-style group under Eq 4.1, not
  Muri's interleave: the limit is Muri's model, not the runtime.
* **Machines**: DoP as Harmony sizes it (``throughput.best_dop``: the
  smallest machine count within 5% of the job's fastest on its own speed-up
  curve, at most its request); a new pair runs on the larger of its two
  jobs' DoPs, both jobs at that DoP; a job joining a running singleton runs
  on that singleton's machines; an unmatched job runs alone at its DoP.
* **Admission**: FIFO without overtaking for everything that needs free
  machines (a unit is ordered by its earliest-submitted job); joins of
  running singletons need none and always happen.
* **Profiles**: a new job is profiled alone on its requested free machines,
  else (none free) beside an open singleton, as Harmony does (§4.3.2);
  when its profile is ready it stays if alone, stays in its pair if the pair
  reaches ``MIN_EFF``, else it pauses and waits to be matched.

Pure: a :class:`ClusterView` in, a :class:`Decision` out.
"""
from __future__ import annotations

from harmony.policies.base import MIN_GAIN
from harmony.policies.view import ClusterView, Decision, JobView
from harmony.sched.model import Profile, group_iter_time, t_cpu_at, t_net_at
from harmony.sched.throughput import best_dop

#: pairs below this efficiency get no edge: a pair must beat running its
#: two jobs one after the other by MIN_GAIN (2 * eff >= 1 + MIN_GAIN)
MIN_EFF = (1.0 + MIN_GAIN) / 2
#: waiting jobs in the matching at most (FIFO head): blossom is O(n^3)
MAX_POOL = 64


def efficiency(a: Profile, b: Profile, m: float) -> float:
    """(Tcpu_a + Tnet_a + Tcpu_b + Tnet_b) / (2 Titr_ab) on ``m`` machines."""
    t = group_iter_time((a, b), m)
    if t <= 0:
        return 0.0
    work = sum(t_cpu_at(p, m) + t_net_at(p, m) for p in (a, b))
    return work / (2.0 * t)


def match(pool: list[str], profiles: dict[str, Profile], dop: dict[str, int],
          fixed: set[str] = frozenset()) -> list[tuple[str, str]]:
    """The maximum-weight matching of ``pool`` by pair efficiency (edges
    only where it reaches ``MIN_EFF``; none between two ``fixed`` jobs, whose
    DoP is their running one). Pairs in the order of ``pool``."""
    import networkx as nx

    g = nx.Graph()
    g.add_nodes_from(pool)
    for i, a in enumerate(pool):
        for b in pool[i + 1:]:
            if a in fixed and b in fixed:
                continue
            m = dop[a] if a in fixed else dop[b] if b in fixed else max(dop[a], dop[b])
            e = efficiency(profiles[a], profiles[b], m)
            if e >= MIN_EFF:
                g.add_edge(a, b, weight=e)
    order = {x: i for i, x in enumerate(pool)}
    pairs = [tuple(sorted(p, key=order.__getitem__)) for p in nx.max_weight_matching(g)]
    return sorted(pairs, key=lambda p: order[p[0]])


def muri(view: ClusterView) -> Decision:
    dec = Decision()
    live = [w.name for w in view.workers]
    if not live:
        return dec
    busy = {m for j in view.active for m in j.workers}
    free = [w.name for w in view.workers if w.jobs == 0 and w.name not in busy]
    profiles = {j.id: j.profile for j in view.active + view.waiting if j.profile is not None}

    groups: dict[str, list[JobView]] = {}
    for j in view.active:
        groups.setdefault(j.sched_group or f"m:{j.id}", []).append(j)
    gid_of = {j.id: gid for gid, js in groups.items() for j in js}
    notes = []

    # 1. profiled jobs that were profiling: stay (alone, or in a good pair) or pause
    for gid, js in groups.items():
        for j in js:
            if j.state != "profiling" or j.id not in profiles:
                continue
            mates = [x for x in js if x.id != j.id]
            m = max(1, len(j.workers))
            if mates and not (mates[0].id in profiles and efficiency(
                    profiles[j.id], profiles[mates[0].id], m) >= MIN_EFF):
                dec.pause[j.id] = None
                notes.append(f"{j.id} profiled: pauses (a poor pair with {mates[0].id})")
            else:
                dec.promote.append(j.id)
                dec.assign[j.id] = gid
    # open singletons: running alone with a profile, not leaving
    open_ = [js[0] for gid, js in groups.items()
             if len(js) == 1 and js[0].id in profiles and js[0].id not in dec.pause
             and (js[0].state == "running" or js[0].id in dec.promote)]

    # 2. matching: profiled waiting jobs (FIFO head) and open singletons
    fits = [j for j in view.waiting if j.machines <= len(live)]
    cands = [j for j in fits if j.id in profiles][:MAX_POOL]
    by_id = {j.id: j for j in list(view.waiting) + list(view.active)}
    # DoP as Harmony sizes it: the job's own speed-up curve, at most its request
    dop = {j.id: best_dop(profiles[j.id], j.machines, MIN_GAIN) for j in cands}
    dop.update({j.id: max(1, len(j.workers)) for j in open_})
    fixed = {j.id for j in open_}
    pool = [j.id for j in cands] + [j.id for j in open_]
    pairs = match(pool, profiles, dop, fixed) if len(pool) > 1 else []
    partner = {}
    for a, b in pairs:
        partner[a], partner[b] = b, a

    # 3. joins of open singletons (need no free machines)
    hosted: set[str] = set()        # open singletons that got a partner
    for a, b in pairs:
        host, guest = (a, b) if a in fixed else (b, a) if b in fixed else (None, None)
        if host is None:
            continue
        h = by_id[host]
        gid = gid_of.get(host, f"m:{host}")
        dec.start[guest] = list(h.workers)
        dec.assign[guest] = dec.assign[host] = gid
        hosted.add(host)
        notes.append(f"{guest} joins {host} (eff {efficiency(profiles[a], profiles[b], dop[host]):.2f})")

    # 4. FIFO units that need free machines: pairs, singles, profiling runs
    done: set[str] = set(dec.start)
    blocked = False
    for j in fits:
        if j.id in done:
            continue
        mate = partner.get(j.id)
        if mate is not None and mate in fixed:
            continue
        unit = [j] if mate is None else [j, by_id[mate]]
        done.update(x.id for x in unit)
        need = max(dop.get(x.id, x.machines) for x in unit)
        if not blocked and need <= len(free):
            ms, free = free[:need], free[need:]
            gid = f"m:{j.id}"
            for x in unit:
                if x.id in profiles:
                    dec.start[x.id] = list(ms)
                else:
                    dec.profile[x.id] = list(ms)
                dec.assign[x.id] = gid
            continue
        blocked = True
        if j.id not in profiles:
            # no free machines: profile it beside an open singleton that has
            # no partner yet (the one whose DoP is closest to its request)
            spare = [h for h in open_ if h.id not in hosted]
            if spare:
                h = min(spare, key=lambda h: (abs(len(h.workers) - j.machines), h.id))
                hosted.add(h.id)
                dec.profile[j.id] = list(h.workers)
                dec.assign[j.id] = gid_of.get(h.id, f"m:{h.id}")
                dec.assign.setdefault(h.id, dec.assign[j.id])

    for gid in sorted(set(dec.assign.values())):     # (a stable order in the run record)
        members = [x for x, g in dec.assign.items() if g == gid and x in profiles]
        members += [j.id for j in groups.get(gid, ()) if j.id in profiles
                    and j.id not in members and j.id not in dec.pause]
        ms = next((dec.start.get(x) or dec.profile.get(x) or by_id[x].workers
                   for x, g in dec.assign.items() if g == gid), ())
        if members and ms:
            dec.predicted[gid] = group_iter_time([profiles[x] for x in members], len(ms))
    dec.note = "; ".join(notes)
    return dec
