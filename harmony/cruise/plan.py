"""Reconfiguration plans (§3.3.1 "Optimization Execution", Table 3.2).

A ``Layout`` says which machines run an executor and who owns every data
and model block (a machine's role follows from what it owns). ``retarget``
turns the optimizer's block counts into owners, moving as few blocks as
possible; ``make_plan`` turns (current, target) into a DAG of

    add(machine, role)        a new executor
    delete(machine)           an executor that holds nothing any more
    switch(machine, old, new) an executor changes role (worker/server/both)
    move(store, blocks, src, dst)   blocks change owner

with the dependencies: add(x) and switch(x) before every move onto x (the
runtime that receives blocks must exist); every move off x before
delete(x). A machine that gives up a role keeps its store until its blocks
are gone (the elastic store outlives the role), so moves off x do not wait
for switch(x); this keeps the graph acyclic even when two machines trade
roles. Moves are greedy, largest change first: the machine with the largest
surplus of a store's blocks sends to the one with the largest deficit, as
many blocks as one of them needs, until every count matches; no block moves
twice and no block moves that need not.

``Execution`` releases ready operations to a real executor (at most
``max_moves`` moves at once, the largest first); ``schedule`` drives the
same logic with given durations and returns the makespan. ``worth_applying``
is the 5% rule.
"""
from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass

from harmony.cruise.costmodel import BOTH, IDLE, SERVER, WORKER, role_of

DATA, MODEL = "data", "model"
MAX_MOVES = 4          # concurrent moves (the original runtime's limit; --max-moves)
MIN_GAIN = 0.05        # skip plans predicted to gain less (§3.3.1)


@dataclass(frozen=True)
class Layout:
    """``machines``: those running an executor of the job; ``data_owner[b]``
    and ``model_owner[b]``: the machine owning data / model block b."""
    machines: tuple[str, ...]
    data_owner: tuple[str, ...]
    model_owner: tuple[str, ...]

    def __post_init__(self) -> None:
        stray = (set(self.data_owner) | set(self.model_owner)) - set(self.machines)
        if stray:
            raise ValueError(f"blocks owned by machines not in the layout: {sorted(stray)}")

    def count(self, store: str, machine: str) -> int:
        return sum(1 for o in self._owner(store) if o == machine)

    def role(self, machine: str) -> str:
        """worker / server / both / idle (or idle for a machine not in it)."""
        return role_of(self.count(DATA, machine), self.count(MODEL, machine))

    def _owner(self, store: str) -> tuple[str, ...]:
        return self.data_owner if store == DATA else self.model_owner

    @classmethod
    def modulo(cls, machines: Sequence[str], data_blocks: int, model_blocks: int) -> Layout:
        """Harmony's layout today: every executor worker and server, block
        b on machine b % n."""
        n = len(machines)
        return cls(tuple(machines), tuple(machines[b % n] for b in range(data_blocks)),
                   tuple(machines[b % n] for b in range(model_blocks)))


def _greedy(owner: Sequence[str], want: dict[str, int]) -> list[tuple[str, str, list[int]]]:
    """Transfers (src, dst, blocks) that make owner counts equal ``want``:
    largest surplus to largest deficit first (ties by name)."""
    have: dict[str, list[int]] = {}
    for b, o in enumerate(owner):
        have.setdefault(o, []).append(b)
    if sum(want.values()) != len(owner):
        raise ValueError(f"target holds {sum(want.values())} blocks, there are {len(owner)}")
    surplus = {o: len(bs) - want.get(o, 0) for o, bs in have.items()}
    deficit = {o: k - len(have.get(o, ())) for o, k in want.items()}
    out = []
    while True:
        src = max((o for o in surplus if surplus[o] > 0), key=lambda o: (surplus[o], o),
                  default=None)
        if src is None:
            return out
        dst = max((o for o in deficit if deficit[o] > 0), key=lambda o: (deficit[o], o))
        k = min(surplus[src], deficit[dst])
        blocks, have[src] = have[src][-k:], have[src][:-k]      # the highest ids leave
        out.append((src, dst, blocks))
        surplus[src] -= k
        deficit[dst] -= k


def retarget(current: Layout, names: Sequence[str], d: Sequence[int],
             m: Sequence[int]) -> Layout:
    """The layout with ``d[i]`` data and ``m[i]`` model blocks on machine
    ``names[i]`` (an optimizer ``Solution``), reached from ``current`` by
    the greedy moves. Machines left with nothing are not in it."""
    data, model = list(current.data_owner), list(current.model_owner)
    for owner, counts in ((data, d), (model, m)):
        for src, dst, blocks in _greedy(owner, dict(zip(names, counts))):
            for b in blocks:
                owner[b] = dst
    keep = tuple(n for n in names if n in set(data) | set(model))
    return Layout(keep, tuple(data), tuple(model))


@dataclass(frozen=True)
class Op:
    """One operation: ``kind`` add / delete / switch / move. ``machine``:
    the machine (a move's source); move: ``dest``, ``store`` (data or
    model) and ``blocks``; add / switch: ``role`` (and ``old_role``)."""
    kind: str
    machine: str
    dest: str | None = None
    store: str | None = None
    blocks: tuple[int, ...] = ()
    role: str | None = None
    old_role: str | None = None

    def __str__(self) -> str:
        if self.kind == "move":
            return f"move {len(self.blocks)} {self.store} {self.machine}->{self.dest}"
        if self.kind == "switch":
            return f"switch {self.machine} {self.old_role}->{self.role}"
        return f"{self.kind} {self.machine}" + (f" ({self.role})" if self.role else "")


@dataclass(frozen=True)
class Plan:
    """Operations and dependencies (before, after) as indices into ``ops``."""
    ops: tuple[Op, ...]
    deps: tuple[tuple[int, int], ...]
    target: Layout

    def preds(self, i: int) -> set[int]:
        return {a for a, b in self.deps if b == i}

    @property
    def moves(self) -> list[Op]:
        return [o for o in self.ops if o.kind == "move"]

    def blocks_moved(self, store: str | None = None) -> int:
        return sum(len(o.blocks) for o in self.moves if store in (None, o.store))

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for o in self.ops:
            out[o.kind] = out.get(o.kind, 0) + 1
        return out


def _has(role: str, store: str) -> bool:
    return role == BOTH or role == (WORKER if store == DATA else SERVER)


def make_plan(current: Layout, target: Layout) -> Plan:
    """The DAG from ``current`` to ``target`` (see the module docstring)."""
    ops: list[Op] = []
    deps: list[tuple[int, int]] = []
    adds, switches = {}, {}
    for x in target.machines:
        new = target.role(x)
        if new == IDLE:
            continue
        if x not in current.machines:
            adds[x] = len(ops)
            ops.append(Op("add", x, role=new))
        elif current.role(x) != new:
            switches[x] = len(ops)
            ops.append(Op("switch", x, role=new, old_role=current.role(x)))
    moves_from: dict[str, list[int]] = {}
    for store in (DATA, MODEL):
        old, new = current._owner(store), target._owner(store)
        if len(old) != len(new):
            raise ValueError(f"{store}: {len(old)} blocks now, {len(new)} in the target")
        pairs: dict[tuple[str, str], list[int]] = {}
        for b, (o, t) in enumerate(zip(old, new)):
            if o != t:
                pairs.setdefault((o, t), []).append(b)
        for (src, dst), blocks in sorted(pairs.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            i = len(ops)
            ops.append(Op("move", src, dest=dst, store=store, blocks=tuple(blocks)))
            moves_from.setdefault(src, []).append(i)
            if dst in adds:
                deps.append((adds[dst], i))
            elif dst in switches and _has(target.role(dst), store) \
                    and not _has(current.role(dst), store):
                deps.append((switches[dst], i))
    for x in current.machines:
        if x not in target.machines or target.role(x) == IDLE:
            i = len(ops)
            ops.append(Op("delete", x, old_role=current.role(x)))
            deps.extend((j, i) for j in moves_from.get(x, ()))
    return Plan(tuple(ops), tuple(deps), target)


class Execution:
    """The plan's progress for a real executor: ``start()`` returns the
    operations that may start now (their predecessors done; moves up to
    ``max_moves`` at once, the most blocks first) and marks them running;
    ``done(i)`` records that operation i finished."""

    def __init__(self, plan: Plan, max_moves: int = MAX_MOVES) -> None:
        if max_moves < 1:
            raise ValueError("max_moves >= 1")
        self.plan, self.max_moves = plan, max_moves
        self._preds = [plan.preds(i) for i in range(len(plan.ops))]
        self.running: set[int] = set()
        self.finished_ops: set[int] = set()

    @property
    def finished(self) -> bool:
        return len(self.finished_ops) == len(self.plan.ops)

    def start(self) -> list[int]:
        ready = [i for i, p in enumerate(self._preds)
                 if i not in self.running and i not in self.finished_ops
                 and p <= self.finished_ops]
        ops = self.plan.ops
        moving = sum(1 for i in self.running if ops[i].kind == "move")
        out = [i for i in ready if ops[i].kind != "move"]
        moves = sorted((i for i in ready if ops[i].kind == "move"),
                       key=lambda i: (-len(ops[i].blocks), i))
        out += moves[:max(0, self.max_moves - moving)]
        self.running.update(out)
        return sorted(out)

    def done(self, i: int) -> None:
        if i not in self.running:
            raise ValueError(f"operation {i} is not running")
        self.running.discard(i)
        self.finished_ops.add(i)


def ready_ops(plan: Plan, max_moves: int = MAX_MOVES
              ) -> Generator[list[Op], Iterable[Op] | None, None]:
    """``Execution`` as a generator of operations: it yields the operations
    to start now and is sent back those that finished (possibly none)."""
    ex = Execution(plan, max_moves)
    index = {op: i for i, op in enumerate(plan.ops)}
    while not ex.finished:
        finished = yield [plan.ops[i] for i in ex.start()]
        for op in finished or ():
            ex.done(index[op])


@dataclass(frozen=True)
class OpCosts:
    """Seconds per operation. Defaults from §3.4.6: add and delete 2-3 s,
    switch negligible, a 100 MB data block ~6.5 s and a 2 MB model block
    ~0.4 s to move; scale the per-block times to the job's block sizes."""
    add: float = 2.5
    delete: float = 2.5
    switch: float = 0.1
    data_block: float = 6.5
    model_block: float = 0.4
    move_setup: float = 0.0

    def __call__(self, op: Op) -> float:
        if op.kind == "move":
            per = self.data_block if op.store == DATA else self.model_block
            return self.move_setup + per * len(op.blocks)
        return {"add": self.add, "delete": self.delete, "switch": self.switch}[op.kind]


@dataclass(frozen=True)
class Schedule:
    start: tuple[float, ...]
    end: tuple[float, ...]

    @property
    def makespan(self) -> float:
        return max(self.end, default=0.0)


def schedule(plan: Plan, duration: Callable[[Op], float] = OpCosts(),
             max_moves: int = MAX_MOVES) -> Schedule:
    """Start and end times of every operation when each starts as soon as
    ``Execution`` lets it (independent operations run concurrently)."""
    ex = Execution(plan, max_moves)
    n = len(plan.ops)
    start, end = [0.0] * n, [0.0] * n
    now = 0.0
    while not ex.finished:
        for i in ex.start():
            start[i], end[i] = now, now + float(duration(plan.ops[i]))
        if not ex.running:
            raise ValueError("the plan's dependencies have a cycle")
        now = min(end[i] for i in ex.running)
        for i in sorted(ex.running):
            if end[i] <= now:
                ex.done(i)
    return Schedule(tuple(start), tuple(end))


def predicted_gain(current_cost: float, target_cost: float, plan_cost: float,
                   remaining_work: float) -> float:
    """Relative time saved over the rest of the job: without the plan,
    ``remaining_work`` epochs at ``current_cost`` seconds each; with it,
    ``plan_cost`` seconds of reconfiguration (counted as lost, although
    training goes on meanwhile) then the epochs at ``target_cost``."""
    if remaining_work <= 0 or current_cost <= 0:
        return 0.0
    without = remaining_work * current_cost
    return (without - (plan_cost + remaining_work * target_cost)) / without


def worth_applying(current_cost: float, target_cost: float, plan_cost: float,
                   remaining_work: float, threshold: float = MIN_GAIN) -> bool:
    """Apply a plan only if ``predicted_gain`` >= ``threshold`` (5%): below
    it a job would oscillate around its optimum (§3.3.1). Costs in seconds
    per epoch, ``plan_cost`` in seconds (e.g. ``schedule(plan).makespan``),
    ``remaining_work`` in epochs."""
    return predicted_gain(current_cost, target_cost, plan_cost, remaining_work) >= threshold
