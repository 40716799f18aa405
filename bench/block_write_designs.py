"""Writing one large block from a spool file into LMDB: three designs,
each in a child process of its own, its RSS (anonymous and file-backed
pages apart) sampled from here every 5 ms, and the disk its directory
takes at the peak.

  whole     as the data service wrote a replica before pieces: the block
            read from the spool whole, ``txn.put`` of it whole (LMDB copies
            it into malloc'd dirty pages until the commit)
  pieces    what it does now: ``CheckpointStore.write`` from the spool's
            range, 4 MiB pieces in 16 MiB transactions, each spool range
            punched out once committed
  writemap  LMDB opened with ``writemap=True`` and the value passed as a
            memoryview of an mmap of the spool file, one transaction (no
            anonymous copy; the data and the spool go through the page
            cache, mapped into the process)

    python bench/block_write_designs.py [--mib 512] [--dir DIR]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from block_memory import Watch  # noqa: E402
from harmony.store.blocks import Block, export_block  # noqa: E402

MiB = 1 << 20

CHILD = """
import mmap, os, sys
sys.path.insert(0, {root!r})
import lmdb
from harmony.store.checkpoint import CheckpointStore
from harmony.store.spool import Spooled
spool, out, size, design = {spool!r}, {out!r}, {size}, {design!r}
sys.stdin.readline()                 # the parent's watch is running
if design == "whole":
    env = lmdb.open(out, map_size=4 << 30, sync=True)
    fd = os.open(spool, os.O_RDONLY)
    data = os.pread(fd, size, 0)
    with env.begin(write=True) as txn:
        txn.put(b"block", data)
    del data
    env.close()
elif design == "pieces":
    with Spooled(spool, {{("model", 0): (0, size)}}) as got:
        st = CheckpointStore.open(out, "j", keep=1, chunk_bytes=16 << 20)
        st.write(got.section("model"), epoch=1, iteration=0, exported=True)
        st.close()
elif design == "writemap":
    env = lmdb.open(out, map_size=4 << 30, sync=True, writemap=True)
    with open(spool, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_READ)
    with env.begin(write=True) as txn:
        txn.put(b"block", memoryview(mm))
    env.close()
    mm.close()
print("done", flush=True)
sys.stdin.readline()
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--dir", default=None)
    a = ap.parse_args()
    blk = export_block(Block(0, {"a": np.arange(a.mib * MiB // 8, dtype=np.float64)}))
    rows = []
    for design in ("whole", "pieces", "writemap"):
        with tempfile.TemporaryDirectory(dir=a.dir) as tmp:
            spool = os.path.join(tmp, "t1")
            with open(spool, "wb") as fh:
                fh.write(blk)
                os.fsync(fh.fileno())
            code = CHILD.format(root=str(ROOT), spool=spool, out=os.path.join(tmp, "part"),
                                size=len(blk), design=design)
            p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
            try:
                w = Watch(p.pid, tmp)
                p.stdin.write("go\n")
                p.stdin.flush()
                assert p.stdout.readline().strip() == "done"
                rows.append(w.stop().row(design))
                p.stdin.write("end\n")
                p.stdin.flush()
            finally:
                p.wait(60)
    print(f"\n{'design (child RSS, MiB)':34} {'before':>7} {'peak':>7} {'growth':>7} "
          f"{'anon':>7} {'file':>7} {'disk+':>7} {'wall':>6} {'cpu':>6}")
    for r in rows:
        print(r)


if __name__ == "__main__":
    main()
