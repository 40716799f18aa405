"""What a hostile key holder can make each socket hold: the worst RSS growth
per process under probe-style floods, and what is left once the receivers'
idle timeout has passed (the hardening issue's memory goal).

A secured 2-machine local cluster runs one job on both machines; then, one
socket at a time, with the cluster's own keys (client, reader, worker):

  master   4 s of the attack suite's malformed and oversized messages from 3
           client connections (tests/test_hardening.py's payload mix)
  shard    ten 8 MiB model blocks named as the job's own move, from each key
  data     an 8 MiB payload header, then 70 whole 8 MiB payloads of a
           replica whose closing message never comes (worker key); they
           go to the daemon's spool on disk, whose size is printed too;
           then one replica of a single --huge MiB block (512), closed, so
           that it is written to the daemon's store, and a fetch of it back
  daemon   every executor message type from another machine's worker key

    python bench/attack_memory.py [--idle 60] [--huge 512]

Prints, per socket, the process's RSS before, at its peak during the flood,
and after the idle timeout (60 s: ``harmony.store.transfer.IDLE_S``); for
the data services, the bytes in their spool files after the flood and after
the idle timeout.
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

import msgpack
import numpy as np
import psutil
import zmq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from harmony.client import Client  # noqa: E402
from harmony.cluster import LocalCluster  # noqa: E402
from harmony.comm import messages as M  # noqa: E402
from harmony.comm import security  # noqa: E402
from harmony.comm.zmqutil import make_socket  # noqa: E402
from harmony.store.blocks import Block, export_block  # noqa: E402
from harmony.store.transfer import IDLE_S, Payload, chunk_digest  # noqa: E402
from harmony.store.transfer import send_payloads, wait_acks  # noqa: E402
from harmony.worker import jobckpt  # noqa: E402
from apps_for_tests import TOY_APP  # noqa: E402
from test_hardening import _flood_payloads  # noqa: E402

MiB = 1 << 20


class Peak:
    """The highest RSS of ``pid`` while it runs (sampled every 20 ms)."""

    def __init__(self, pid: int) -> None:
        self.p = psutil.Process(pid)
        self.before = self.peak = self.p.memory_info().rss
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self.p.memory_info().rss)

    def stop(self) -> None:
        self._stop.set()
        self._t.join()


def dealer(ctx, ep: str, keys) -> zmq.Socket:
    s = make_socket(ctx, zmq.DEALER, keys=keys, timeout_s=10)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(ep)
    return s


def du(path: str) -> int:
    """Bytes of the files under ``path`` (their disk blocks)."""
    return sum(os.stat(os.path.join(d, f)).st_blocks * 512
               for d, _, fs in os.walk(path) for f in fs)


def listening(pids) -> list[tuple[int, str]]:
    out = []
    for pid in pids:
        for c in psutil.Process(pid).net_connections(kind="tcp"):
            if c.status == psutil.CONN_LISTEN:
                out.append((pid, f"tcp://{c.laddr.ip}:{c.laddr.port}"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--idle", type=float, default=IDLE_S + 5,
                    help="seconds to wait after the floods before the last reading")
    ap.add_argument("--huge", type=int, default=512,
                    help="MiB of the one block sent in a closed replica (0: none)")
    a = ap.parse_args()
    ctx = zmq.Context()
    with tempfile.TemporaryDirectory() as tmp:
        cl = LocalCluster(2, os.path.join(tmp, "c"), port=0, policy="least-loaded")
        cl.start()
        try:
            k = {r: security.Keys.load(cl.keys, r, n) for r, n in
                 (("client", "admin"), ("reader", "reader"), ("worker", "m1"))}
            with Client(cl.endpoint, keys=cl.keys) as c:
                job = c.submit("toy.py", TOY_APP, ["--max-epochs", "100000", "--sleep",
                                                   "0.02"], machines=2)
                while c.status(job)["epochs_total"] < 2:
                    time.sleep(0.1)
                data = dict(c.log_sources(job))
            daemons = [p.pid for p in cl.procs[1:]]
            kids = [ch.pid for d in daemons for ch in psutil.Process(d).children()]
            shards = listening(kids)
            rows = []
            spools = {}

            # master
            pk = Peak(cl.procs[0].pid)
            rng = random.Random(1)
            pay = [p for p in _flood_payloads(rng) if b"submit" not in p[0][:64]]
            socks = [dealer(ctx, cl.endpoint, k["client"]) for _ in range(3)]
            t_end = time.time() + 4
            while time.time() < t_end:
                for s in socks:
                    try:
                        s.send_multipart(rng.choice(pay), zmq.NOBLOCK)
                    except zmq.Again:
                        pass
                    while s.poll(0):
                        s.recv_multipart()
            time.sleep(0.5)
            pk.stop()
            for s in socks:
                s.close(0)          # (left open, ctx.term() below waited for them for good)
            rows.append(("master", "malformed/oversized flood, 4 s", pk))

            # PS shards
            head = msgpack.packb({"id": 0, "arrays": [["keys", "<i8", [MiB]],
                                                      ["rows", "<f4", [MiB, 1]]]})
            big = np.zeros(MiB, np.int64).tobytes()
            for pid, ep in shards:
                pk = Peak(pid)
                for role in ("client", "reader", "worker"):
                    s = dealer(ctx, ep, k[role])
                    for i in range(10):
                        s.send_multipart([M.encode("blk", mid=f"mv:{job}:2:{i}", sec="model",
                                                   bid=i, arr=0, narr=2, off=0, size=len(big),
                                                   h=chunk_digest(big), head=head), big])
                    time.sleep(0.5)
                    s.close(0)
                pk.stop()
                rows.append((f"shard {ep}", "10 x 8 MiB moved blocks per key", pk))

            # data services
            piece = os.urandom(8 * MiB)
            raw = msgpack.packb({"raw": True})
            for name, ep in data.items():
                pid = daemons[0] if name == "m0" else daemons[1]
                pk = Peak(pid)
                s = dealer(ctx, ep, k["worker"])
                s.send_multipart([M.encode("blk", mid="rep:x", sec="model", bid=0, arr=0,
                                           narr=1, off=0, size=4, h=chunk_digest(b"1234"),
                                           head=b"\x90" * (8 * MiB)), b"1234"])
                for i in range(70):
                    s.send_multipart([M.encode("blk", mid="rep:held", sec="model", bid=i,
                                               arr=0, narr=1, off=0, size=len(piece),
                                               h=chunk_digest(piece), head=raw), piece])
                n = 0
                while n < 71 and s.poll(10_000):
                    s.recv_multipart()
                    n += 1
                time.sleep(0.5)
                pk.stop()
                rows.append((f"data {name}", "8 MiB header + 70 x 8 MiB never closed", pk))
                s.close(0)
                spools[name] = os.path.join(tmp, "c", "workers", name, "spool")
                print(f"data {name}: {du(spools[name]) / MiB:.0f} MiB in its spool after the "
                      f"flood", flush=True)

            # data services: one huge block, closed (written to the store), fetched back
            if a.huge:
                blk = export_block(Block(0, {"a": np.zeros(a.huge * MiB // 8)}))
            for name, ep in data.items() if a.huge else ():
                pid = daemons[0] if name == "m0" else daemons[1]
                pk = Peak(pid)
                s = dealer(ctx, ep, k["worker"])
                s.setsockopt(zmq.RCVTIMEO, 120_000)
                mid = f"rep:huge:{name}"
                send_payloads([s], mid, [Payload("model", 0, blk)])
                wait_acks(lambda d: s, {(0, "model", 0)}, mid, 120)
                s.send_multipart([M.encode("blk_end", mid=mid, count=1, meta={
                    "job": "huge", "epoch": 1, "index": 0, "iteration": 0})])
                done = M.decode(s.recv_multipart())
                assert done.type == "blk_done" and done["ok"], done.fields
                time.sleep(0.5)
                pk.stop()
                s.close(0)
                rows.append((f"data {name}", f"one {a.huge} MiB block, closed", pk))
                pk = Peak(pid)
                _, got = jobckpt.fetch_part(ctx, ep, "huge", 1, 0, lambda s, b: True,
                                            timeout_s=120, keys=k["worker"])
                assert got[("model", 0)].nbytes == a.huge * MiB
                del got
                time.sleep(0.5)
                pk.stop()
                rows.append((f"data {name}", "fetch of that block", pk))

            # daemons' executor sockets: another machine's key
            xs = [(pid, ep) for pid, ep in listening(daemons) if ep not in data.values()]
            for pid, ep in xs:
                pk = Peak(pid)
                s = dealer(ctx, ep, k["worker"])
                for _ in range(20):
                    for t in ("hello", "sub_done", "mem_query", "alpha_state"):
                        s.send_multipart([msgpack.packb({"t": t, "job": "x" * 60000})])
                time.sleep(0.5)
                s.close(0)
                pk.stop()
                rows.append((f"daemon {ep}", "executor messages from another machine", pk))

            print(f"waiting {a.idle:.0f}s for the idle timeout ...", flush=True)
            time.sleep(a.idle)
            print(f"\n{'socket':32} {'flood':42} {'before':>8} {'peak':>8} {'growth':>8} "
                  f"{'after':>8}  (MiB)")
            for what, flood, pk in rows:
                after = pk.p.memory_info().rss
                print(f"{what:32} {flood:42} {pk.before / MiB:8.0f} {pk.peak / MiB:8.0f} "
                      f"{(pk.peak - pk.before) / MiB:8.0f} {after / MiB:8.0f}")
            for name, path in spools.items():
                print(f"data {name}: {du(path) / MiB:.0f} MiB in its spool after the idle "
                      f"timeout")
        finally:
            cl.stop()
    ctx.term()


if __name__ == "__main__":
    main()
