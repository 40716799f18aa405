"""Reload rate of the block store vs a plain LMDB read, side by side in one run.

For the same LMDB data (BLOCKS input blocks of BLOCK_MB each, in a temp dir
outside the repo) it measures, interleaved, REPS times each:

  raw      : one read txn, cursor scan, each value copied out (``bytes(v)``):
             the least any reader must do to get the bytes into memory
  reload   : ReloadPipeline over all blocks as disk-blocks (α = 1), consumer
             doing nothing: background thread, CRC-32 check, Block objects
  no-check : reload without the integrity check (what the check costs)
  fresh    : reload with every block copied into new arrays, none reused
             from the blocks dropped before (what ``ArrayPool`` gains)
  mutable  : the executor's path for input that the app changes (LocalInput,
             α = 1): the consumer changes one array (``i``, 11% of a block)
             of every block in every pass; after the first pass it is pinned
             in memory, and each dropped block's other arrays are hashed to
             detect new changes (the write-back of mutable blocks as the
             executor does it: nothing is rewritten in steady state)
  rewrite  : ReloadPipeline with ``writeback`` into LMDB: every block written
             back whole after use (no executor path does this since mutated
             arrays are pinned; kept as the upper bound of write-back cost)
  frozen   : the executor's path for an app that declares its input
             read-only (``App.mutable_input = ()``: MLR, Lasso): LocalInput
             hands each disk-block over zero-copy, as read-only views of
             LMDB's file, CRC-checked
  declared : the same for an app that declares which arrays it changes
             (``mutable_input = ("i",)``, as NMF declares ``L``): the consumer
             changes ``i`` in every pass, which stays in memory; the rest is
             handed over zero-copy
  raw-crc  : a second baseline: the raw cursor scan with the CRC-32 of each
             value instead of a copy (the least a reader that checks must do)

each with a warm page cache and a cold one (the data file is evicted with
posix_fadvise(DONTNEED) after closing the env, so only this file is dropped).
Each measurement is paired with a raw scan just before it (same cache state),
and the ratio kind/raw is taken per pair: the VM is shared and its speed
drifts, so the median of paired ratios is the figure to read. It prints
median MB/s (bytes handed to the consumer per second) and median ratios, and
the process CPU seconds per GB (all threads) of each kind.

A last section checks overlap: α = 0.5 over 32 blocks with a consumer that
spends Tbproc per block (sleep: a COMP that releases the GIL, like numpy) so
that the bound holds, and reports the stall as a fraction of COMP time.

    python bench/store_reload.py [--blocks 64] [--block-mb 4] [--reps 7]
        [--kinds raw,reload,...]

(Kinds up to ``rewrite`` use only interfaces that older versions of the
store also have, so they measure them too: run it with PYTHONPATH at an older
checkout and ``--kinds reload,no-check,mutable,rewrite``.)
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

import numpy as np

from harmony.store.alpha import max_disk_blocks
from harmony.store.blocks import Block, BlockStore
from harmony.store.framing import crc32
from harmony.store.lmdb_env import LmdbEnv
from harmony.store.lmdb_store import LmdbBlockStore
from harmony.store.local import LocalInput
from harmony.store.reload import ReloadPipeline, choose_disk_blocks


KINDS = ("raw", "reload", "fresh", "no-check", "mutable", "rewrite", "frozen", "declared", "raw-crc")
DBS = ("input", "local", "frozen", "declared")


def make_blocks(n: int, mb: float) -> list[Block]:
    rng = np.random.default_rng(0)
    rows = int(mb * (1 << 20) / (16 * 4 + 8))
    return [Block(b, {"X": rng.random((rows, 16), dtype=np.float32),
                      "i": np.arange(rows, dtype=np.int64) + b * rows}) for b in range(n)]


class Bench:
    def __init__(self, path: str, blocks: list[Block]) -> None:
        self.path = path
        self.open()
        self.store.put_many(blocks)
        self.env.sync_now()
        self.ids = [b.id for b in blocks]
        self.nbytes = self.store.total_bytes()
        # the executor's owner of input blocks, every block a disk-block
        # (stored once more under its own db: the same bytes)
        self.local = LocalInput(LmdbBlockStore(self.env, "local"))
        for blk in blocks:
            self.local.add(blk, to_disk=True)
        self.env.sync_now()
        self.mutable(passes=1)           # first pass: `i` is found to change and pinned
        # apps that declare what they change: zero-copy (each its own db)
        self.frozen = LocalInput(LmdbBlockStore(self.env, "frozen"), mutable=())
        self.declared = LocalInput(LmdbBlockStore(self.env, "declared"), mutable=("i",))
        for owner in (self.frozen, self.declared):   # each db's values contiguous
            for blk in blocks:
                owner.add(blk, to_disk=True)
        self.env.sync_now()

    def open(self) -> None:
        self.env = LmdbEnv(self.path, job="bench", sync=False, map_size=4 << 30)
        self.store = LmdbBlockStore(self.env, "input")
        self.unverified = LmdbBlockStore(self.env, "input", verify=False)
        self.fresh = LmdbBlockStore(self.env, "input")
        self.fresh.pool = None
        for name in ("local", "frozen", "declared"):
            if hasattr(self, name):
                getattr(self, name).disk = LmdbBlockStore(self.env, name)

    def evict(self) -> None:
        """Drop this file's pages from the page cache (unmapped first)."""
        self.env.close()
        fd = os.open(os.path.join(self.path, "data.mdb"), os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        self.open()

    def warm(self) -> None:
        for name in DBS:
            db = self.env.db(name)
            with self.env.env.begin(buffers=True) as txn:
                for _, v in txn.cursor(db=db):
                    bytes(v)

    def raw(self) -> int:
        db = self.env.db("input")
        n = 0
        with self.env.env.begin(buffers=True) as txn:
            for _, v in txn.cursor(db=db):
                n += len(bytes(v))
        return n

    def pipeline(self, writeback: bool, verify: bool = True, reuse: bool = True) -> int:
        n = 0
        disk = self.unverified if not verify else self.store if reuse else self.fresh
        with ReloadPipeline(self.ids, self.ids, BlockStore(), disk,
                            writeback=writeback) as pipe:
            for blk in pipe:
                n += blk.nbytes
        return n

    def raw_crc(self) -> int:
        db = self.env.db("input")
        n = 0
        with self.env.env.begin(buffers=True) as txn:
            for _, v in txn.cursor(db=db):
                crc32(v)
                n += len(v)
        return n

    def mutable(self, passes: int = 1, owner: str = "local") -> int:
        n = 0
        for _ in range(passes):
            seq = getattr(self, owner).view(self.ids)
            try:
                for blk in seq:
                    blk["i"][0] += 1
                    n += blk.nbytes
            finally:
                seq.close()
        return n

    def read_only(self) -> int:
        n = 0
        seq = self.frozen.view(self.ids)
        try:
            for blk in seq:
                n += blk.nbytes
        finally:
            seq.close()
        return n

    def run(self, kind: str) -> int:
        if kind == "raw":
            return self.raw()
        if kind == "mutable":
            return self.mutable()
        if kind == "declared":
            return self.mutable(owner="declared")
        if kind == "frozen":
            return self.read_only()
        if kind == "raw-crc":
            return self.raw_crc()
        return self.pipeline(kind == "rewrite", verify=kind != "no-check",
                             reuse=kind != "fresh")


def measure(b: Bench, kind: str, cache: str) -> tuple[float, float]:
    """(bytes/s, CPU seconds per byte) of one run of ``kind``."""
    b.env.sync_now()   # no dirty pages of an earlier kind (rewrite) flushed meanwhile
    if cache == "cold":
        b.evict()
    else:   # steady state: the page cache holds every db, and one untimed pass
        b.warm()    # of this kind has run (the zero-copy kinds read through the
        b.run(kind)  # env's own mapping of the file, which a cold run dropped)
    c0, t0 = time.process_time(), time.perf_counter()
    n = b.run(kind)
    dt, dc = time.perf_counter() - t0, time.process_time() - c0
    return n / dt, dc / n


def overlap(store_blocks: list[Block], path: str) -> None:
    blocks = store_blocks[:32]
    env = LmdbEnv(path, job="bench-overlap", sync=False, map_size=4 << 30)
    disk = LmdbBlockStore(env, "input")
    disk.put_many(blocks)
    ids = [b.id for b in blocks]
    # measure Tbload, then pick Tbproc so that α = 0.5 satisfies the bound with margin
    t0 = time.perf_counter()
    for b in ids[:4]:
        disk.get(b)
    tbload = (time.perf_counter() - t0) / 4
    tbproc = 1.5 * tbload * (16 - 1) / (32 - 1)
    target = choose_disk_blocks([ids], 0.5)
    mem = BlockStore()
    for b in blocks:
        if b.id not in target:
            mem.put(b)
    pipe = ReloadPipeline(ids, target, mem, disk, writeback=False)
    time.sleep(tbload)                      # the first load hides behind PULL
    with pipe:
        for _ in pipe:
            time.sleep(tbproc)
    st = pipe.stats
    bound = max_disk_blocks(st.tbproc, st.tbload, len(ids))
    print(f"\noverlap: 32 blocks, 16 disk-blocks, Tbload {st.tbload * 1e3:.2f} ms, "
          f"Tbproc {st.tbproc * 1e3:.2f} ms (bound allows {bound} disk-blocks): "
          f"stall {st.stall_s * 1e3:.2f} ms in {st.stalls} waits = "
          f"{100 * st.stall_s / st.comp_s:.2f}% of COMP {st.comp_s * 1e3:.0f} ms")
    env.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=64)
    ap.add_argument("--block-mb", type=float, default=4.0)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--kinds", default=",".join(KINDS[1:]),
                    help="comma-separated, from: " + ", ".join(KINDS[1:]))
    a = ap.parse_args()
    kinds = [k for k in a.kinds.split(",") if k]
    for k in kinds:
        if k not in KINDS[1:]:
            ap.error(f"unknown kind {k!r}")
    tmp = tempfile.mkdtemp(prefix="harmony-bench-reload-")
    try:
        blocks = make_blocks(a.blocks, a.block_mb)
        b = Bench(os.path.join(tmp, "spill"), blocks)
        del blocks
        print(f"{a.blocks} blocks x {a.block_mb} MB = {b.nbytes / 1e6:.0f} MB in LMDB, "
              f"{a.reps} interleaved reps; median MB/s, median of ratios to the raw scan "
              f"just before (min - max)")
        rate: dict[tuple[str, str], list[float]] = {}
        cpu: dict[tuple[str, str], list[float]] = {}
        ratio: dict[tuple[str, str], list[float]] = {}
        for _ in range(a.reps):
            for cache in ("warm", "cold"):
                for kind in kinds:
                    r0, c0 = measure(b, "raw", cache)
                    r1, c1 = measure(b, kind, cache)
                    rate.setdefault((cache, "raw"), []).append(r0)
                    cpu.setdefault((cache, "raw"), []).append(c0)
                    rate.setdefault((cache, kind), []).append(r1)
                    cpu.setdefault((cache, kind), []).append(c1)
                    ratio.setdefault((cache, kind), []).append(r1 / r0)
        med = statistics.median
        print(f"{'':6}{'kind':>10}{'MB/s':>8}{'/raw':>7}{'min - max':>13}{'CPU s/GB':>10}")
        for cache in ("warm", "cold"):
            for kind in ("raw", *kinds):
                line = (f"{cache:6}{kind:>10}{med(rate[cache, kind]) / 1e6:8.0f}")
                if kind == "raw":
                    line += f"{'':7}{'':13}"
                else:
                    rs = ratio[cache, kind]
                    line += f"{med(rs):7.2f}{min(rs):6.2f} - {max(rs):4.2f}"
                print(line + f"{med(cpu[cache, kind]) * 1e9:10.3f}")
        b.env.close()
        del b
        overlap(make_blocks(32, a.block_mb), os.path.join(tmp, "overlap"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
