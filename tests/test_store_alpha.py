"""The α controller (pure) and memory-pressure measurement."""
from __future__ import annotations

import mmap
import os
import random
import subprocess
import sys
import time

import numpy as np
import pytest

from harmony.store.alpha import (AlphaController, Observation, Thresholds, estimate_input_bytes,
                                 initial_alpha, max_disk_blocks)
from harmony.store.memory import MemoryProbe, parse_budget, tree_memory
from harmony.store.reload import ReloadStats

GB = 1e9


class SteadyJob:
    """A simulated job on a machine: memory = other jobs + model (unless
    spilled) + in-memory input blocks + the reload working set; stalls follow
    the overlap model behind the bound (first disk-block loaded during PULL)."""

    def __init__(self, N=20, block=0.1 * GB, other=1.0 * GB, model=0.5 * GB, budget=4.0 * GB,
                 tbproc=0.05, tbload=0.1, depth=2, noise=0.0, seed=0):
        self.__dict__.update(locals())
        self.rng = random.Random(seed)

    def observe(self, ctl: AlphaController) -> Observation:
        n = ctl.n
        used = (self.other + (0 if ctl.spill_model else self.model)
                + (self.N - n) * self.block + min(n, self.depth) * self.block)
        used *= 1 + self.noise * self.rng.uniform(-1, 1)
        stall = max(0.0, (n - 1) * self.tbload - (self.N - 1) * self.tbproc) if n else 0.0
        return Observation(int(used), int(self.budget), stall_s=stall,
                           comp_s=self.N * self.tbproc + stall, tbproc=self.tbproc,
                           tbload=self.tbload if n else None, blocks_total=self.N,
                           block_bytes=self.block)

    def run(self, ctl: AlphaController, steps: int = 60):
        trace = []
        for _ in range(steps):
            obs = self.observe(ctl)
            d = ctl.step(obs)
            trace.append((obs, d))
        return trace


def test_initial_alpha_from_sizes():
    # fits: no disk-blocks
    assert initial_alpha(1 * GB, 0.5 * GB, 4 * GB) == 0.0
    # room under target (0.6·4 − 1 − 0.5 = 0.9 GB) for 0.9 of 2 GB of input
    assert initial_alpha(2 * GB, 0.5 * GB, 4 * GB, 1 * GB) == pytest.approx(0.55)
    assert initial_alpha(2 * GB, 0.5 * GB, 4 * GB, 1 * GB, num_blocks=20) == pytest.approx(0.55)
    assert initial_alpha(2 * GB, 0.5 * GB, 4 * GB, 1 * GB, num_blocks=8) == pytest.approx(0.625)
    # no room at all
    assert initial_alpha(2 * GB, 3 * GB, 4 * GB) == 1.0
    assert initial_alpha(0, 1, 10) == 0.0
    assert estimate_input_bytes([100, 120, 110], 30) == 3300
    c = AlphaController.from_estimate(20, int(2 * GB), int(3.5 * GB), int(4 * GB))
    assert c.alpha == 1.0 and c.spill_model      # even all on disk the model does not fit
    c = AlphaController.from_estimate(20, int(2 * GB), int(0.5 * GB), int(4 * GB), int(1 * GB))
    assert c.n == 11 and not c.spill_model and c.block_bytes == pytest.approx(0.1 * GB)


def test_bound_formula_matches_the_inequality():
    for B in range(1, 30):
        for tbproc, tbload in ((0.05, 0.1), (0.1, 0.05), (0.01, 0.5), (0.3, 0.3)):
            m = max_disk_blocks(tbproc, tbload, B)
            assert tbproc * (B - 1) >= tbload * (m - 1) - 1e-12
            if m < B:
                assert tbproc * (B - 1) < tbload * m
    assert max_disk_blocks(None, None, 10) == 10 and max_disk_blocks(0.1, 0.0, 10) == 10


@pytest.mark.parametrize("n0,noise", [(0, 0.0), (20, 0.0), (0, 0.03), (5, 0.03), (18, 0.05)])
def test_converges_on_a_steady_job_without_oscillating(n0, noise):
    job = SteadyJob(noise=noise, seed=n0)
    ctl = AlphaController(job.N, n0 / job.N)
    trace = job.run(ctl, 80)
    ns = [d.disk_blocks for _, d in trace]
    tail = ns[-40:]
    assert len(set(tail)) == 1, ns                           # settled
    moves = [d.direction for _, d in trace if d.direction]
    reversals = sum(1 for a, b in zip(moves, moves[1:]) if a != b)
    assert reversals <= 2, ns
    obs = job.observe(ctl)
    frac = obs.mem_used / obs.mem_budget
    assert frac < Thresholds().spill + noise
    assert obs.stall_s == 0.0                                # inside the stall bound
    assert ctl.n <= max_disk_blocks(job.tbproc, job.tbload, job.N)
    assert not ctl.spill_model


@pytest.mark.parametrize("known_size", [True, False])
def test_no_oscillation_when_one_block_is_wider_than_the_band(known_size):
    """One block is 15% of the budget, wider than the 10% [target, spill) band:
    no position of α lands inside it, and the controller must still settle."""
    job = SteadyJob(N=6, block=0.6 * GB, budget=4 * GB, other=0.5 * GB, noise=0.02)
    ctl = AlphaController(job.N, 0.0)
    ns = []
    for _ in range(60):
        obs = job.observe(ctl)
        if not known_size:
            obs = Observation(**{**obs.__dict__, "block_bytes": None})
        ns.append(ctl.step(obs).disk_blocks)
    assert len(set(ns[-45:])) == 1, ns
    assert ctl.reversals <= 2


def test_rises_under_memory_pressure():
    job = SteadyJob(budget=3.0 * GB, tbload=0.01)            # 0 disk-blocks: 3.5/3 of budget
    ctl = AlphaController(job.N, 0.0)
    trace = job.run(ctl, 30)
    ns = [d.disk_blocks for _, d in trace]
    assert trace[0][1].direction == +1 and trace[0][1].reason == "terminate threshold"
    assert ns[0] == job.N and trace[0][1].pause_job          # > 0.95: all at once
    assert ns == sorted(ns, reverse=True)                    # then back down, carefully,
    o = job.observe(ctl)                                     # staying under spill
    assert all(ob.mem_used / ob.mem_budget < 0.70 for ob, _ in trace[1:])
    assert o.mem_used / o.mem_budget < 0.70 and ctl.n < job.N
    job2 = SteadyJob(budget=4.5 * GB, tbload=0.01)           # 0.78 of budget: climb
    ctl2 = AlphaController(job2.N, 0.0)
    ns2 = [d.disk_blocks for _, d in job2.run(ctl2, 30)]
    assert ns2[0] > 0 and ns2 == sorted(ns2) and ns2[-1] > ns2[0]   # up, then holds
    o = job2.observe(ctl2)
    assert o.mem_used / o.mem_budget < 0.70


def test_falls_when_reload_stalls_comp():
    job = SteadyJob(tbload=0.3, budget=4.2 * GB)
    ctl = AlphaController(job.N, 0.8)                        # too many disk-blocks
    trace = job.run(ctl, 40)
    first = trace[0][1]
    assert first.direction == -1 and first.reason == "reload stalls COMP"
    ns = [d.disk_blocks for _, d in trace]
    assert ns == sorted(ns, reverse=True) and ns[-1] < 16
    bound = max_disk_blocks(job.tbproc, job.tbload, job.N)   # 4
    # stops where memory would cross spill, or at the bound
    o = job.observe(ctl)
    assert ctl.n <= bound or o.mem_used + job.block >= 0.70 * job.budget


def test_memory_plentiful_brings_blocks_back():
    job = SteadyJob(budget=16 * GB)
    ctl = AlphaController(job.N, 0.75)
    ns = [d.disk_blocks for _, d in job.run(ctl, 30)]
    assert ns[-1] == 0 and ns == sorted(ns, reverse=True)


def test_bound_respected_below_pause_but_not_above():
    # between spill and pause: α stops at the stall bound
    job = SteadyJob(tbload=0.5, budget=4.7 * GB)
    ctl = AlphaController(job.N, 0.0)
    trace = job.run(ctl, 30)
    bound = max_disk_blocks(job.tbproc, job.tbload, job.N)   # 2
    assert ctl.n == bound and trace[-1][1].reason == "memory short but at the stall bound"
    # above pause: memory wins over stalls
    job = SteadyJob(tbload=0.5, budget=4.0 * GB)
    ctl = AlphaController(job.N, 0.0)
    job.run(ctl, 30)
    assert ctl.n > bound
    o = job.observe(ctl)
    assert o.mem_used / o.mem_budget < 0.80


def test_model_spill_only_at_alpha_one_and_back_when_memory_frees():
    th = Thresholds()
    ctl = AlphaController(10, 0.9, block_bytes=1.0, model_bytes=30)
    d = ctl.step(Observation(75, 100))                       # short: first α → 1
    assert d.alpha == 1.0 and not d.spill_model
    d = ctl.step(Observation(74, 100))                       # α = 1 and still short
    assert d.spill_model and not d.pause_job and "spill model" in d.reason
    d = ctl.step(Observation(85, 100))                       # pause with all spilled
    assert d.pause_job and d.spill_model
    d = ctl.step(Observation(96, 100))                       # terminate
    assert d.pause_job and d.alpha == 1.0
    d = ctl.step(Observation(65, 100))                       # in band: hold, keep spilled
    assert d.spill_model and d.direction == 0
    d = ctl.step(Observation(20, 100))                       # room for the model again
    assert not d.spill_model and d.alpha == 1.0
    assert th.target < th.spill < th.pause < th.terminate


def test_observation_from_reload_stats():
    st = ReloadStats(blocks=10, disk_blocks=3, load_s=[0.1, 0.1, 0.1], store_s=[0.05] * 3,
                     proc_s=[0.02] * 10, stall_s=0.04)
    o = Observation.from_pass(st, 50, 100, block_bytes=7)
    assert o.tbload == pytest.approx(0.15) and o.tbproc == pytest.approx(0.02)
    assert o.comp_s == pytest.approx(0.24) and o.blocks_total == 10 and o.block_bytes == 7


def test_bad_arguments():
    with pytest.raises(ValueError):
        Thresholds(target=0.8, spill=0.7)
    with pytest.raises(ValueError):
        AlphaController(0)
    with pytest.raises(ValueError):
        AlphaController(10, 1.5)
    with pytest.raises(ValueError):
        AlphaController(10).step(Observation(1, 0))


# -- memory.py ----------------------------------------------------------------------


def test_parse_budget():
    assert parse_budget("8G") == 8 << 30
    assert parse_budget("8GiB") == 8 << 30
    assert parse_budget("512m") == 512 << 20
    assert parse_budget("1.5T") == int(1.5 * (1 << 40))
    assert parse_budget("1048576") == 1 << 20
    assert parse_budget("75%", total=1000) == 750
    assert 0 < parse_budget("50%") < parse_budget("100%")
    assert parse_budget(4096) == 4096
    for bad in ("", "8X", "-1G", "0", "150%", "0%", "G", -5):
        with pytest.raises(ValueError):
            parse_budget(bad)


def test_anonymous_memory_excludes_mapped_file_pages(tmp_path):
    """LMDB reads pages through mmap: they show in RSS but are page cache,
    so they must not count as memory pressure."""
    path = tmp_path / "f"
    size = 64 << 20
    with open(path, "wb") as fh:
        fh.truncate(size)
    before = tree_memory(children=False)
    with open(path, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), size, prot=mmap.PROT_READ)
        total = sum(mm[i] for i in range(0, size, 4096))     # touch every page
        mid = tree_memory(children=False)
        mm.close()
    assert total == 0
    assert mid.rss - before.rss > 48 << 20
    assert mid.anon - before.anon < 16 << 20
    a = np.ones(64 << 17)                                    # 64 MiB anonymous
    after = tree_memory(children=False)
    assert after.anon - mid.anon > 48 << 20
    del a


def test_probe_counts_the_process_tree():
    child = subprocess.Popen([sys.executable, "-c",
                              "import sys, numpy as np; a = np.ones(48 << 17); "
                              "print('ok', flush=True); sys.stdin.read()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ok"
        probe = MemoryProbe("64G")
        s = probe.sample()
        alone = tree_memory(children=False)
        assert s.used >= alone.anon + (40 << 20)             # the child's 48 MiB
        assert tree_memory().procs >= 2
        assert s.budget == 64 << 30 and s.effective_budget <= s.budget
        assert 0 < s.fraction < 1 and s.available > 0 and s.t <= time.time()
        tight = MemoryProbe("1M", anon=False).sample()       # plain RSS, tiny budget
        assert tight.used >= s.used and tight.fraction > 1.0
        assert MemoryProbe("1G", pid=os.getpid(), children=False).sample().used == \
            pytest.approx(tree_memory(children=False).anon, rel=0.2)
    finally:
        child.stdin.close()
        child.wait(10)


def test_colocated_jobs_trade_memory_to_the_one_whose_reloads_stall():
    """Two jobs on one machine, one controller each: A's reloads hide behind
    its compute, B's cannot. Both start at α = 0.5, memory between target and
    spill, so pressure moves neither: B stalls and finds no room, A gives it
    memory step by step while B still stalls. B ends with its stalls gone
    (two disk-blocks: one reload hides behind 19 blocks of COMP), A with what
    B did not need still in memory, and both settle."""
    N, blk, base, budget = 20, 0.1 * GB, 1.0 * GB, 5.5 * GB
    jobs = {"A": dict(tbproc=0.2, tbload=0.01), "B": dict(tbproc=0.005, tbload=0.05)}
    ctl = {k: AlphaController(N, 0.5, thresholds=Thresholds(0.75, 0.85, 0.92, 0.97))
           for k in jobs}
    starved = {k: False for k in jobs}
    trace = []

    def used(k):
        n = ctl[k].n
        return base + (N - n) * blk + min(n, 2) * blk

    for _ in range(60):
        total = sum(used(k) for k in jobs)
        for k, j in jobs.items():
            n = ctl[k].n
            stall = max(0.0, (n - 1) * j["tbload"] - (N - 1) * j["tbproc"]) if n else 0.0
            other = "B" if k == "A" else "A"
            ctl[k].step(Observation(
                int(total), int(budget), stall_s=stall, comp_s=N * j["tbproc"] + stall,
                tbproc=j["tbproc"], tbload=j["tbload"] if n else None, blocks_total=N,
                block_bytes=blk, others_starved=starved[other], share=used(k) / total))
            starved[k] = ctl[k].starved
        trace.append((ctl["A"].n, ctl["B"].n, total / budget))
    a, b, frac = trace[-1]
    assert trace[0][2] >= 0.75                        # no room for B at first
    assert b <= 2 and N // 2 < a < N                 # B keeps memory; A gave what B needed
    assert frac < 0.97 and all(f < 0.97 for _, _, f in trace[1:])   # never near the limit
    assert len(set(trace[-10:])) == 1                 # settled
    assert any(d.reason == "memory to a co-located job whose reloads stall"
               for d in ctl["A"].history)


def test_each_colocated_job_closes_only_its_part_of_the_gap():
    th = Thresholds(0.75, 0.85, 0.92, 0.97)
    block, budget = 0.1 * GB, 10 * GB
    used = th.spill * budget + 1                       # memory short
    need = (used - th.target * budget) / block         # the machine's gap in blocks
    moves = []
    for share in (0.25, 0.75):
        c = AlphaController(100, 0.0, thresholds=th, initial_step=50, max_step=100)
        c.step(Observation(int(used), int(budget), block_bytes=block, share=share))
        moves.append(c.n)
    assert moves[0] == pytest.approx(need * 0.25, abs=1)
    assert moves[1] == pytest.approx(need * 0.75, abs=1)


# -- settling: no probing for ever once a probe failed ---------------------------------

EXEC_TH = Thresholds(0.75, 0.85, 0.92, 0.97)     # the executor's until session 11
BUDGET = 1_000_000
BLOCK = 0.02 * BUDGET


def narrow_band(n: int) -> float:
    """Memory (fraction of the budget) at ``n`` of 16 disk-blocks: at 11 it is
    below target, one block fewer is over spill (the projection, 2% per
    block, is wrong by 13%): the position the hill-climber used to probe
    every ``cooldown + 2`` observations for ever."""
    if n >= 11:
        return 0.72 - 0.03 * (n - 11)
    return 0.87 + 0.05 * (10 - n)


def obs_at(frac: float, stall: float = 0.0) -> Observation:
    return Observation(int(frac * BUDGET), BUDGET, stall_s=stall, comp_s=1.0, tbproc=0.05,
                       tbload=0.01, blocks_total=16, block_bytes=BLOCK)


def drive(ctl: AlphaController, steps: int, mem=narrow_band, stall=lambda i: 0.0,
          shift=lambda i: 0.0, start: int = 0) -> list[int]:
    """Feed ``steps`` observations: memory from the position (plus a shift
    by step index), stall by step index. Returns the disk-blocks after each."""
    ns = []
    for i in range(start, start + steps):
        ctl.step(obs_at(mem(ctl.n) + shift(i), stall(i)))
        ns.append(ctl.n)
    return ns


@pytest.mark.parametrize("settle_after", [1, 2])
def test_settles_after_failed_probes_and_stops_probing(settle_after):
    ctl = AlphaController(16, 11 / 16, block_bytes=BLOCK, thresholds=EXEC_TH,
                          settle_after=settle_after)
    ns = drive(ctl, 60)
    assert ns.count(10) == settle_after, ns           # each probe of 10 failed, then no more
    assert ns[-40:] == [11] * 40, ns
    assert ctl.settled and ctl.failed == {11: settle_after}
    assert ctl.history[-1].direction == 0 and ctl.history[-1].reason.startswith("settled")
    # what it replaces: without settling, a probe every cooldown + 2 observations
    never = AlphaController(16, 11 / 16, block_bytes=BLOCK, thresholds=EXEC_TH,
                            settle_after=10**9)
    assert drive(never, 60).count(10) >= 7


def test_one_outlier_does_not_end_the_settled_state():
    ctl = AlphaController(16, 11 / 16, block_bytes=BLOCK, thresholds=EXEC_TH)
    drive(ctl, 10)
    assert ctl.settled
    # one observation 10% lower (another job's peak missed), then back
    ns = drive(ctl, 20, shift=lambda i: -0.10 if i == 12 else 0.0, start=10)
    assert ns == [11] * 20 and ctl.settled


def test_probes_again_when_memory_frees_materially():
    ctl = AlphaController(16, 11 / 16, block_bytes=BLOCK, thresholds=EXEC_TH)
    drive(ctl, 10)
    assert ctl.settled and ctl.n == 11
    # a co-located job ended: 30% of the budget freed from observation 10 on
    ns = drive(ctl, 30, shift=lambda i: -0.30 if i >= 10 else 0.0, start=10)
    assert ns[0] == 11                                  # one observation is not enough
    assert not ctl.settled and ctl.failed == {}
    assert min(ns) < 11                                 # fewer disk-blocks now that it fits
    assert any(d.reason == "memory below target" for d in ctl.history[-30:])


def test_probes_again_when_stalls_change():
    ctl = AlphaController(16, 11 / 16, block_bytes=BLOCK, thresholds=EXEC_TH)
    drive(ctl, 10)
    assert ctl.settled
    # COMP starts waiting on reloads (20% of its time) and memory frees a bit
    drive(ctl, 3, stall=lambda i: 0.2, shift=lambda i: -0.04, start=10)
    assert not ctl.settled
    assert any(d.reason == "reload stalls COMP" for d in ctl.history[-3:])


def test_memory_pressure_moves_a_settled_controller_at_once():
    ctl = AlphaController(16, 11 / 16, block_bytes=BLOCK, thresholds=EXEC_TH)
    drive(ctl, 10)
    assert ctl.settled
    d = ctl.step(obs_at(0.90))                           # pressure: no waiting
    assert d.direction == +1 and d.reason == "memory above spill threshold"
    assert not ctl.settled and ctl.n > 11
    # the spike passes: back down, but not below the position that failed
    ns = drive(ctl, 30, start=11)
    assert min(ns) == 11 and ns[-20:] == [11] * 20 and ctl.settled


def test_settle_after_must_be_positive():
    with pytest.raises(ValueError):
        AlphaController(10, settle_after=0)


def test_a_small_stall_does_not_starve_and_memory_is_given_step_by_step():
    """A job is "starved" (co-located jobs give it memory) only when its
    reloads stall at least ``starve_stall`` (10%) of its COMP time with no
    room to go down; a job giving memory climbs by its step, not straight to
    its stall bound (each block it spills costs it reloads on a shared CPU)."""
    th = Thresholds(0.75, 0.85, 0.92, 0.97)
    N, budget = 16, 1_000_000
    full = int(0.84 * budget)                      # above target, below spill: no room
    for stall, starved in ((0.05, False), (0.25, True)):
        c = AlphaController(N, 0.5, thresholds=th, block_bytes=0.05 * budget)
        c.step(Observation(full, budget, stall_s=stall, comp_s=1.0, tbproc=0.05,
                           tbload=0.01, blocks_total=N))
        assert c.starved is starved and c.n == 8
    giver = AlphaController(N, 0.0, thresholds=th, initial_step=2)
    seen = []
    for _ in range(8):
        giver.step(Observation(full, budget, comp_s=1.0, tbproc=0.05, tbload=0.01,
                               blocks_total=N, others_starved=True))
        seen.append(giver.n)
    assert seen[0] == 2 and seen[1] == 5 and seen[-1] == N     # 2, +3, +4.5, ... up to N
    assert seen == sorted(seen)
    # with the bytes the starved jobs asked for: this job's part of them at once
    asked = AlphaController(N, 0.0, thresholds=th, block_bytes=0.05 * budget)
    asked.step(Observation(full, budget, comp_s=1.0, tbproc=0.05, tbload=0.01,
                           blocks_total=N, others_starved=True, others_need=0.4 * budget,
                           share=0.5))
    assert asked.n == 4                              # 0.4 x 0.5 of the budget, 5% per block
    starving = AlphaController(N, 0.5, thresholds=th, block_bytes=0.05 * budget)
    starving.step(Observation(full, budget, stall_s=0.25, comp_s=1.0, tbproc=0.01,
                              tbload=0.05, blocks_total=N))
    # the stall bound: 1 + 0.01 x 15 / 0.05 = 4 disk-blocks; it asks for the other 4
    assert starving.starved and starving.need == pytest.approx(4 * 0.05 * budget)
    at_once = AlphaController(N, 0.0, thresholds=th, give_at_once=True)
    at_once.step(Observation(full, budget, comp_s=1.0, tbproc=0.05, tbload=0.01,
                             blocks_total=N, others_starved=True))
    assert at_once.n == N
