"""Memory pressure: what a machine's job executors use against its budget.

*Used* memory is the **anonymous** resident memory of a process tree
(``rss - shared`` from ``/proc/PID/statm`` through psutil: RssAnon, roughly),
not plain RSS. Pages of an LMDB map that a process has read count in its RSS
as file-backed pages, but they are page cache the kernel drops under pressure.
Counting them would make spilling look like it *raises* memory use (more
disk-blocks, more mapped pages touched), and the α controller would spiral up.
Shared memory segments (``RssShmem``) are counted as shared, hence not at all;
the runtime does not use any.

The *budget* is the per-machine memory the worker offers
(``harmony-worker --memory 8G``, default: all of it). The effective budget is
also capped by what the machine really has (``used + available``), so other
tenants of the host raise the pressure too.
"""
from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass

import psutil

_SIZE_RE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(%|[kKmMgGtT]?)(?:i?[bB])?\s*")
_MULT = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def parse_budget(text: str | int | float, total: int | None = None) -> int:
    """A memory budget in bytes: ``8G``, ``8GiB``, ``512m``, ``1.5T``,
    ``1048576``, or ``75%`` (of ``total``, default the machine's memory).
    Units are binary (K = 1024). Raises ValueError on anything else."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        if text <= 0:
            raise ValueError(f"memory budget must be > 0, got {text}")
        return int(text)
    m = _SIZE_RE.fullmatch(str(text))
    if not m:
        raise ValueError(f"not a memory size: {text!r} (e.g. 8G, 512M, 75%)")
    num, unit = float(m.group(1)), m.group(2).lower()
    if unit == "%":
        if not 0 < num <= 100:
            raise ValueError(f"memory percentage must be in (0, 100], got {text!r}")
        total = psutil.virtual_memory().total if total is None else total
        value = int(total * num / 100)
    else:
        value = int(num * _MULT[unit])
    if value <= 0:
        raise ValueError(f"memory budget must be > 0, got {text!r}")
    return value


@dataclass(frozen=True)
class TreeMemory:
    rss: int     # resident, file-backed pages included
    anon: int    # resident anonymous memory (rss - shared)
    procs: int   # processes counted


def tree_memory(pid: int | None = None, children: bool = True) -> TreeMemory:
    """Resident memory of ``pid`` (default: this process) and, optionally, all
    its descendants. Processes that exit while being measured are skipped."""
    root = psutil.Process(os.getpid() if pid is None else pid)
    procs = [root]
    if children:
        try:
            procs += root.children(recursive=True)
        except psutil.NoSuchProcess:
            pass
    rss = anon = n = 0
    for p in procs:
        try:
            mi = p.memory_info()
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            continue
        shared = getattr(mi, "shared", 0)   # Linux: RssFile + RssShmem
        rss += mi.rss
        anon += max(0, mi.rss - shared)
        n += 1
    return TreeMemory(rss, anon, n)


@dataclass(frozen=True)
class MemorySample:
    t: float
    used: int               # bytes counted against the budget
    budget: int             # configured budget
    effective_budget: int   # min(budget, used + machine's available memory)
    rss: int
    available: int          # psutil.virtual_memory().available

    @property
    def fraction(self) -> float:
        return self.used / self.effective_budget if self.effective_budget > 0 else 1.0


class MemoryProbe:
    """Measures a process tree (e.g. the worker daemon and its executors, or
    one executor) against a budget. ``anon=False`` counts plain RSS."""

    def __init__(self, budget: int | str, pid: int | None = None, *, children: bool = True,
                 anon: bool = True) -> None:
        self.budget = parse_budget(budget)
        self.pid = os.getpid() if pid is None else pid
        self.children, self.anon = children, anon

    def sample(self) -> MemorySample:
        tm = tree_memory(self.pid, self.children)
        used = tm.anon if self.anon else tm.rss
        avail = int(psutil.virtual_memory().available)
        return MemorySample(time.time(), used, self.budget, min(self.budget, used + avail),
                            tm.rss, avail)


def executors_memory(daemon_pid: int, exclude: int | None = None) -> tuple[int, int]:
    """(anonymous bytes, count) of the job executors of a worker daemon (its
    direct children), leaving out pid ``exclude`` (e.g. the caller)."""
    try:
        kids = psutil.Process(daemon_pid).children()
    except psutil.Error:
        return 0, 0
    used = n = 0
    for p in kids:
        if p.pid == exclude:
            continue
        try:
            mi = p.memory_info()
        except psutil.Error:
            continue
        used += max(0, mi.rss - getattr(mi, "shared", 0))
        n += 1
    return used, n
