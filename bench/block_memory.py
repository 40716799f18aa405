"""What one huge block costs a worker's data service: its RSS (anonymous
and file-backed pages apart) and its disk while a key holder sends one
large block in a replica and closes it, fetches it back, and stages one
large chunk and fetches that back (the hardening issue's memory goal: no
block, whatever its size, may grow the daemon by more than ~64 MiB).

A data service runs alone in a child process (no cluster, no keys; the
C allocator set as a worker daemon sets it: large buffers given back when
freed) with
its state directory under ``--dir`` (default: a temporary directory on the
disk of /tmp). The sender runs here; its own memory is not measured.

    python bench/block_memory.py [--mib 512] [--dir DIR]

Per phase: the service's RSS before, at its peak (sampled every 5 ms from
/proc/PID/status: RssAnon and RssFile apart) and the growth; for the
replica, the peak bytes on disk under its state directory (spool and part
together) and the block's size. Also the wall and CPU seconds of each phase
(the service's CPU from /proc/PID/stat).
"""
from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import zmq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harmony.store import staging  # noqa: E402
from harmony.store.blocks import Block, export_block  # noqa: E402
from harmony.store.transfer import Payload  # noqa: E402
from harmony.worker import jobckpt  # noqa: E402

MiB = 1 << 20

CHILD = """
import sys, time, zmq
sys.path.insert(0, {root!r})
from harmony.util.malloc import return_large_buffers
from harmony.worker.dataservice import DataService
return_large_buffers()          # as the worker daemon does at its start
svc = DataService(zmq.Context(), "127.0.0.1", {state!r}, "m0")
svc.start()
print(svc.endpoint, flush=True)
sys.stdin.read()          # until the parent closes it
svc.stop()
"""


def status(pid: int) -> dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            k, _, v = line.partition(":")
            if k in ("RssAnon", "RssFile", "RssShmem", "VmRSS"):
                out[k] = int(v.split()[0]) * 1024
    return out


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        f = fh.read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def disk(path: str) -> int:
    n = 0
    for d, _, fs in os.walk(path):
        for f in fs:
            try:
                n += os.stat(os.path.join(d, f)).st_blocks * 512
            except FileNotFoundError:
                pass
    return n


class Watch:
    """Peaks of the service's RSS (total, anonymous, file) and of the
    bytes on disk under its state directory, sampled every 5 ms."""

    def __init__(self, pid: int, state: str) -> None:
        self.pid, self.state = pid, state
        self.before = status(pid)
        self.disk0 = disk(state)
        self.peak = dict(self.before)
        self.disk = self.disk0
        self.cpu0, self.t0 = cpu_s(pid), time.perf_counter()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            s = status(self.pid)
            for k, v in s.items():
                self.peak[k] = max(self.peak[k], v)
            self.disk = max(self.disk, disk(self.state))

    def stop(self) -> "Watch":
        self._stop.set()
        self._t.join()
        self.wall = time.perf_counter() - self.t0
        self.cpu = cpu_s(self.pid) - self.cpu0
        return self

    def row(self, what: str) -> str:
        g = {k: (self.peak[k] - self.before[k]) / MiB for k in self.before}
        return (f"{what:34} {self.before['VmRSS'] / MiB:7.0f} {self.peak['VmRSS'] / MiB:7.0f} "
                f"{g['VmRSS']:7.0f} {g['RssAnon']:7.0f} {g['RssFile']:7.0f} "
                f"{(self.disk - self.disk0) / MiB:7.0f} {self.wall:6.1f} {self.cpu:6.1f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=512, help="the block's size")
    ap.add_argument("--dir", default=None, help="where the service's state goes")
    a = ap.parse_args()
    tmp = tempfile.TemporaryDirectory(dir=a.dir)
    state = os.path.join(tmp.name, "state")
    child = subprocess.Popen([sys.executable, "-c", CHILD.format(root=str(ROOT), state=state)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    ctx = zmq.Context()
    rows = []
    try:
        ep = child.stdout.readline().strip()
        pid = child.pid
        n = a.mib * MiB // 8
        blk = export_block(Block(0, {"a": np.arange(n, dtype=np.float64)}))
        payloads = [Payload("model", 0, blk)]
        digest = jobckpt.entries_digest([("model", 0, hashlib.sha256(blk).digest())])
        time.sleep(0.5)

        w = Watch(pid, state)
        jobckpt.replicate(ctx, ep, "j", 0, 1, 0, payloads, digest, timeout_s=600)
        rows.append(w.stop().row(f"replica: one {a.mib} MiB block"))

        w = Watch(pid, state)
        _, got = jobckpt.fetch_part(ctx, ep, "j", 1, 0, lambda s, b: True, timeout_s=600)
        rows.append(w.stop().row("fetch it back"))
        assert np.array_equal(got[("model", 0)]["a"][-4:], np.arange(n - 4, n, dtype=np.float64))
        del got

        raw = bytes(memoryview(blk)[:a.mib * MiB])
        w = Watch(pid, state)
        staging.push_chunks(ctx, ep, "ds", [(0, raw)])
        rows.append(w.stop().row(f"staged chunk of {a.mib} MiB"))

        w = Watch(pid, state)
        back = staging.fetch_chunks(ctx, ep, "ds", {0: hashlib.sha256(raw).digest()},
                                    timeout_s=600)
        rows.append(w.stop().row("fetch it back"))
        assert len(back[0]) == len(raw)
    finally:
        child.stdin.close()
        child.wait(30)
        ctx.term()
        tmp.cleanup()
    print(f"\n{'phase (service RSS, MiB)':34} {'before':>7} {'peak':>7} {'growth':>7} "
          f"{'anon':>7} {'file':>7} {'disk+':>7} {'wall':>6} {'cpu':>6}")
    for r in rows:
        print(r)


if __name__ == "__main__":
    main()
