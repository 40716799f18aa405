"""Reload rate of the block store vs a plain LMDB read, side by side in one run.

For the same LMDB data (BLOCKS input blocks of BLOCK_MB each, in a temp dir
outside the repo) it measures, interleaved, REPS times each:

  raw      : one read txn, cursor scan, each value copied out (``bytes(v)``):
             the least any reader must do to get the bytes into memory
  pipeline : ReloadPipeline over all blocks as disk-blocks (α = 1), consumer
             doing nothing: background thread, CRC-32 check, Block objects
  no-crc   : the same without the CRC-32 check (what the check costs)
  pipe+wb  : the pipeline with write-back of every block after use (mutable
             input, as NMF's L), counted as bytes reloaded per second

each with a warm page cache and a cold one (the data file is evicted with
posix_fadvise(DONTNEED) after closing the env, so only this file is dropped),
and prints median MB/s and the ratio pipeline/raw.

A last section checks overlap: α = 0.5 over 32 blocks with a consumer that
spends Tbproc per block (sleep: a COMP that releases the GIL, like numpy) so
that the bound holds, and reports the stall as a fraction of COMP time.

    python bench/store_reload.py [--blocks 64] [--block-mb 4] [--reps 7]
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
from harmony.store.lmdb_store import LmdbBlockStore, LmdbEnv
from harmony.store.reload import ReloadPipeline, choose_disk_blocks


KINDS = ("raw", "pipeline", "no-crc", "pipe+wb")


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

    def open(self) -> None:
        self.env = LmdbEnv(self.path, job="bench", sync=False, map_size=4 << 30)
        self.store = LmdbBlockStore(self.env, "input")
        self.unverified = LmdbBlockStore(self.env, "input", verify=False)

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

    def raw(self) -> float:
        db = self.env.db("input")
        t0 = time.perf_counter()
        n = 0
        with self.env.env.begin(buffers=True) as txn:
            for _, v in txn.cursor(db=db):
                n += len(bytes(v))
        return n / (time.perf_counter() - t0)

    def pipeline(self, writeback: bool, verify: bool = True) -> float:
        t0 = time.perf_counter()
        n = 0
        with ReloadPipeline(self.ids, self.ids, BlockStore(),
                            self.store if verify else self.unverified,
                            writeback=writeback) as pipe:
            for blk in pipe:
                n += blk.nbytes
        return n / (time.perf_counter() - t0)


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
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="harmony-bench-reload-")
    try:
        blocks = make_blocks(a.blocks, a.block_mb)
        b = Bench(os.path.join(tmp, "spill"), blocks)
        print(f"{a.blocks} blocks x {a.block_mb} MB = {b.nbytes / 1e6:.0f} MB in LMDB, "
              f"{a.reps} interleaved reps, median MB/s")
        res: dict[str, list[float]] = {}
        for _ in range(a.reps):
            for cache in ("warm", "cold"):
                for kind in KINDS:
                    if cache == "cold":
                        b.evict()
                    else:
                        b.raw()   # make sure it is all cached
                    rate = (b.raw() if kind == "raw" else
                            b.pipeline(kind == "pipe+wb", verify=kind != "no-crc"))
                    res.setdefault(f"{cache} {kind}", []).append(rate)
        med = {k: statistics.median(v) / 1e6 for k, v in res.items()}
        print(f"{'':6}" + "".join(f"{k:>10}" for k in KINDS)
              + "".join(f"{k + '/raw':>13}" for k in KINDS[1:]))
        for cache in ("warm", "cold"):
            r = [med[f"{cache} {k}"] for k in KINDS]
            print(f"{cache:6}" + "".join(f"{x:10.0f}" for x in r)
                  + "".join(f"{x / r[0]:13.2f}" for x in r[1:]))
            lo = min(x / y for x, y in zip(res[f"{cache} pipeline"], res[f"{cache} raw"]))
            hi = max(x / y for x, y in zip(res[f"{cache} pipeline"], res[f"{cache} raw"]))
            print(f"{'':6}pipeline/raw per rep: {lo:.2f} - {hi:.2f}")
        b.env.close()
        del b
        overlap(blocks, os.path.join(tmp, "overlap"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
