"""Block migration over ZeroMQ, measured side by side with raw pyzmq.

Measurements, each printed as a ratio taken in one run:

1. **Throughput against raw pyzmq.** Two processes (a sender, and a
   receiver holding a real PS shard): a job's model rows (blocks of about
   4 MiB, each a hashed key range of the job's key space, as
   ``harmony.ps.keymap`` makes them) and input blocks, 16, 128 and 512 MiB
   in all, move from the sender into the empty shard with Harmony's block
   transfer (chunks with their CRC-32, the shard's assembly, acknowledgements,
   the end of the move) until the shard answers a pull of moved rows; and
   the same bytes move as raw pyzmq frames of the same chunk size between
   the same two processes. The two alternate, ``--rounds`` times; ratio =
   Harmony bytes/s / raw bytes/s of the same round, the median over the
   rounds (goal >= 0.7). Also printed: the ratio until every block is
   acknowledged, and until the moved rows are merged into the shard's one
   sorted table (the bench waits for that before the next measurement);
   and raw pyzmq whose receiver keeps every frame until the next
   measurement (as a receiver that holds the data must: fresh memory,
   page faults), the three taking turns.
1b. **Pull and push after a move**: the shard's rows after a move of
   ``--pullpush-mb`` MiB (before and after the merge), against the same
   rows loaded in place: pulls and pushes of every key and of 10% of them,
   one request each, the three shards in one process and taking turns,
   ``--pp-reps`` turns, medians of the per-turn ratios (goal: within 5%).
2. **Under a bandwidth cap** (the local cluster's network emulation, e.g.
   100 MB/s): ratio of Harmony's bytes/s to the cap (goal >= 0.85).
3. **Stand-still of a 1 -> 2 resize** on a 2-machine local cluster with the
   cap: how long the job's iterations stand still (the master's measure,
   from the epoch boundary to the new layout) against the time its moved
   bytes alone need at the cap (goal <= that + 1 s).
4. **Recovery**: a worker killed (SIGKILL) mid-run; epochs redone against
   the checkpoint interval (goal <= the interval).
5. **The plan's move limit**: a 2 -> 4 resize on a 4-machine cluster with
   the cap (8 moves from 2 senders), with the master's ``--max-moves`` at
   4 (Cruise's limit, the default), 1 and 0 (all at once), interleaved over
   ``--rounds``; the stand-still of each against the moved bytes at the cap.

    python bench/migration.py [--sizes 16,128,512] [--cap 100MB/s] [--json OUT]
    python bench/migration.py --only plans [--plan-limits 4,1,0] [--plan-mb 64]
    python bench/migration.py --only transfer [--rounds 5]   # 1, 1b and 2
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import signal
import sys
import tempfile
import time

import numpy as np
import zmq

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from harmony.client import Client  # noqa: E402
from harmony.cluster import LocalCluster  # noqa: E402
from harmony.ps.client import PSClient  # noqa: E402
from harmony.ps.keymap import block_of  # noqa: E402
from harmony.ps.server import ShardServer, ShardTable  # noqa: E402
from harmony.store.blocks import Block  # noqa: E402
from harmony.store.transfer import CHUNK_BYTES, Payload, send_payloads, wait_acks  # noqa: E402
from harmony.util.malloc import keep_working_memory  # noqa: E402
from harmony.worker.netem import NetEm, parse_rate  # noqa: E402

DIM = 64
BLOCK_MB = 4


def _receiver(q: mp.Queue, stop: mp.Event, memory: str = "dynamic") -> None:
    """A real shard (moved model blocks go into its table) and a raw sink
    that also takes the bench's commands. ``memory``: "keep" pins glibc's
    malloc thresholds as a training executor does before its first epoch
    (``keep_working_memory``: blocks moved into a running job arrive
    there), "dynamic" leaves them as a fresh process has them (a joining
    executor receives its blocks before that)."""
    if memory == "keep":
        keep_working_memory()
    ctx = zmq.Context()
    table = ShardTable(DIM, "float32", None)
    table.load(np.zeros(0, np.int64), np.zeros((0, DIM), np.float32))
    server = ShardServer(ctx, "127.0.0.1", table)
    server.start()
    sink = ctx.socket(zmq.ROUTER)
    sink_ep = f"tcp://127.0.0.1:{sink.bind_to_random_port('tcp://127.0.0.1')}"
    q.put((server.endpoint, sink_ep))
    poller = zmq.Poller()
    poller.register(sink, zmq.POLLIN)
    got, kept, keep = 0, [], False
    while not stop.is_set():
        if not poller.poll(100):
            continue
        frames = sink.recv_multipart(copy=False)
        cmd = frames[1].bytes if len(frames) == 2 and len(frames[1]) < 64 else b""
        if cmd.startswith(b"reset:") or cmd.startswith(b"load:"):
            # an empty shard expecting the model blocks of a key space of
            # nb blocks (reset), or the whole key space loaded (load)
            got, kept = 0, []
            nb, rows, *opt = (int(x) for x in cmd.split(b":")[1:])
            keep = bool(opt and opt[0])
            if cmd.startswith(b"load:"):
                table.load(np.arange(rows, dtype=np.int64),
                           np.random.default_rng(1).random((rows, DIM), dtype=np.float32))
            else:
                table.load(np.zeros(0, np.int64), np.zeros((0, DIM), np.float32))
            server.set_layout(np.zeros(nb, np.int64), 0, [server.endpoint])
            server.end_arrivals()
            if cmd.startswith(b"reset:"):
                server.expect(set(range(nb)))
            sink.send_multipart([frames[0], b"ok"])
        elif cmd == b"done?":
            sink.send_multipart([frames[0], str(got).encode()])
        elif cmd == b"settle":
            server.end_arrivals()      # the move is over: the shard serves the moved rows
            sink.send_multipart([frames[0], b"ok"])
        elif cmd == b"compacted?":     # moved rows merged into one sorted table
            sink.send_multipart([frames[0], b"0" if getattr(table, "_runs", None) else b"1"])
        else:
            got += sum(len(f.buffer) for f in frames[1:])
            if keep:
                kept.append(frames)
    server.stop()
    sink.close(0)
    ctx.term()


def _model_space(total_mb: int) -> tuple[int, int]:
    """(model blocks, keys) of the model half of a move of total_mb MiB:
    blocks of about BLOCK_MB MiB each, keys spread over them by the job's
    own hashing (harmony.ps.keymap), as a job's model blocks are."""
    nb = max(1, total_mb // BLOCK_MB // 2)
    return nb, nb * (BLOCK_MB * 2**20 // (4 * DIM + 8))


def _payloads(total_mb: int) -> list[Payload]:
    """Half model blocks (keys + rows of one hashed key range each), half
    input blocks (app arrays)."""
    rng = np.random.default_rng(0)
    out = []
    nb, nkeys = _model_space(total_mb)
    keys = np.arange(nkeys, dtype=np.int64)
    bids = block_of(keys, nb)
    order = np.argsort(bids, kind="stable")
    bounds = np.searchsorted(bids[order], np.arange(nb + 1))
    for b in range(nb):
        k = keys[order[bounds[b]:bounds[b + 1]]]
        blk = Block(b, {"keys": k, "rows": rng.random((len(k), DIM), dtype=np.float32)})
        out.append(Payload("model", b, block=blk))
    per = BLOCK_MB * 2**20
    for b in range(max(1, total_mb // BLOCK_MB - nb)):
        blk = Block(b, {"x": rng.random(per // 8), "c": np.zeros(16)})
        out.append(Payload("input", b, block=blk))
    return out


def _ctl(sock: zmq.Socket, cmd: str) -> bytes:
    sock.send(cmd.encode())
    return sock.recv()


def _move(ctl, shard, client, payloads, nb, nkeys, mid, throttle=None) -> dict:
    """One move into an empty shard: seconds until every block is
    acknowledged, until the shard answers a pull of moved rows (ready),
    and until the moved rows are merged into its sorted table."""
    _ctl(ctl, f"reset:{nb}:{nkeys}")
    probe = np.sort(np.array([int(p.block["keys"][0]) for p in payloads if p.sec == "model"]))
    t0 = time.perf_counter()
    send_payloads([shard], mid, payloads, throttle=throttle)
    wait_acks(lambda d: shard, {(0, p.sec, p.bid) for p in payloads}, mid, 300)
    acked = time.perf_counter() - t0
    _ctl(ctl, "settle")
    client.pull(probe)            # the shard serves the moved rows
    ready = time.perf_counter() - t0
    while _ctl(ctl, "compacted?") != b"1":
        time.sleep(0.002)
    return {"acked": acked, "ready": ready, "merged": time.perf_counter() - t0}


def transfer_run(sizes: list[int], cap: float | None, rounds: int,
                 memory: str = "dynamic") -> list[dict]:
    q, stop = mp.Queue(), mp.Event()
    proc = mp.Process(target=_receiver, args=(q, stop, memory), daemon=True)
    proc.start()
    shard_ep, sink_ep = q.get(timeout=30)
    ctx = zmq.Context()
    ctl = ctx.socket(zmq.DEALER)
    ctl.connect(sink_ep)
    shard = ctx.socket(zmq.DEALER)
    shard.connect(shard_ep)
    netem = None
    if cap:
        tmp = tempfile.mkdtemp()
        netem = NetEm.create(os.path.join(tmp, "netem.bin"), ["a", "b"], cap)
    results = []
    try:
        for mb in sizes:
            payloads = _payloads(mb)
            nb, nkeys = _model_space(mb)
            client = PSClient(ctx, [shard_ep], np.zeros(nb, np.int64), DIM)
            nbytes = sum(p.size for p in payloads)
            frames = [buf[o:o + CHUNK_BYTES] for p in payloads for buf in p.parts()[1]
                      for o in range(0, len(buf), CHUNK_BYTES)]
            got = {"raw": [], "raw_kept": [], "acked": [], "ready": [], "merged": []}
            throttle = (lambda d, n: netem.transfer("a", "b", n)) if netem else None
            for r in range(rounds):
                variants = ("raw", "harmony", "raw_kept")
                for variant in variants[r % 3:] + variants[:r % 3]:
                    if variant == "harmony":
                        t = _move(ctl, shard, client, payloads, nb, nkeys,
                                  f"bench:{mb}:{r}:{time.time()}", throttle)
                        for k, v in t.items():
                            got[k].append(nbytes / v)
                        continue
                    # raw pyzmq: the same bytes, the same chunking, no protocol;
                    # the receiver drops each frame (raw) or keeps them all
                    # until the next measurement, as a receiver that holds
                    # the data must (raw_kept)
                    _ctl(ctl, f"reset:{nb}:{nkeys}:{int(variant == 'raw_kept')}")
                    t0 = time.perf_counter()
                    for f in frames:
                        if netem is not None:
                            netem.transfer("a", "b", len(f))
                        ctl.send(f, copy=False)
                    while int(_ctl(ctl, "done?")) < nbytes:
                        pass
                    got[variant].append(nbytes / (time.perf_counter() - t0))
            client.close()
            med = {k: float(np.median(v)) for k, v in got.items()}
            # each round's Harmony against its own raw run (side by side),
            # the median of those ratios
            pair = {k: float(np.median(np.array(got[k]) / np.array(got["raw"])))
                    for k in ("acked", "ready", "merged")}
            kept = float(np.median(np.array(got["ready"]) / np.array(got["raw_kept"])))
            r = med["raw"]
            row = {"mib": mb, "bytes": nbytes, "rounds": rounds, "raw_MBps": r / 1e6,
                   "harmony_MBps": med["ready"] / 1e6, "ratio_raw": pair["ready"],
                   "acked_MBps": med["acked"] / 1e6, "ratio_raw_acked": pair["acked"],
                   "merged_MBps": med["merged"] / 1e6, "ratio_raw_merged": pair["merged"],
                   "ratios_raw_per_round": (np.array(got["ready"]) / np.array(got["raw"])
                                            ).round(3).tolist(),
                   "raw_kept_MBps": med["raw_kept"] / 1e6, "ratio_raw_kept": kept}
            if cap:
                row["cap_MBps"] = cap / 1e6
                row["ratio_cap"] = med["ready"] / cap
                row["ratio_cap_merged"] = med["merged"] / cap
            results.append(row)
            print(f"  {mb:4d} MiB: raw pyzmq {r / 1e6:7.1f} MB/s; harmony until the shard "
                  f"serves the moved rows {med['ready'] / 1e6:7.1f} MB/s, ratio "
                  f"{pair['ready']:.2f} (until every block is acknowledged "
                  f"{pair['acked']:.2f}, until the rows are merged into its sorted table "
                  f"{pair['merged']:.2f}); raw pyzmq keeping what it receives "
                  f"{med['raw_kept'] / 1e6:.1f} MB/s, harmony vs it {kept:.2f}"
                  + (f"; vs cap {med['ready'] / cap:.2f} ({med['merged'] / cap:.2f} merged)"
                     if cap else ""), flush=True)
    finally:
        stop.set()
        proc.join(10)
        ctl.close(0)
        shard.close(0)
        ctx.term()
        if netem is not None:
            netem.close()
    return results


STATES = ("loaded", "moved", "merged")


def _pp_receiver(q: mp.Queue, stop: mp.Event, nb: int, nkeys: int) -> None:
    """Three shards of one key space in one process: its rows loaded in
    place, moved in and not merged (the move not ended), moved in and
    merged."""
    ctx = zmq.Context()
    servers = {}
    for state in STATES:
        table = ShardTable(DIM, "float32", None)
        if state == "loaded":
            table.load(np.arange(nkeys, dtype=np.int64),
                       np.random.default_rng(1).random((nkeys, DIM), dtype=np.float32))
        else:
            table.load(np.zeros(0, np.int64), np.zeros((0, DIM), np.float32))
        srv = servers[state] = ShardServer(ctx, "127.0.0.1", table)
        srv.set_layout(np.zeros(nb, np.int64), 0, [srv.endpoint])
        srv.start()
        if state != "loaded":
            srv.expect(set(range(nb)))
    sink = ctx.socket(zmq.ROUTER)
    sink_ep = f"tcp://127.0.0.1:{sink.bind_to_random_port('tcp://127.0.0.1')}"
    q.put(({k: v.endpoint for k, v in servers.items()}, sink_ep))
    while not stop.is_set():
        if not sink.poll(100):
            continue
        ident, cmd = sink.recv_multipart()
        if cmd == b"end":
            servers["merged"].end_arrivals()
            sink.send_multipart([ident, b"ok"])
        elif cmd == b"merged?":
            sink.send_multipart([ident, b"0" if getattr(servers["merged"].table, "_runs", None)
                                 else b"1"])
    for srv in servers.values():
        srv.stop()
    sink.close(0)
    ctx.term()


def pullpush_run(mb: int, reps: int) -> dict:
    """Pull and push speed on a shard whose rows arrived by a move (before
    and after they are merged into its sorted table) against the same rows
    loaded in place: three shards in one process, each operation run on the
    three in turn, ``reps`` times; medians of the per-turn ratios."""
    payloads = [p for p in _payloads(mb) if p.sec == "model"]
    nb, nkeys = _model_space(mb)
    q, stop = mp.Queue(), mp.Event()
    proc = mp.Process(target=_pp_receiver, args=(q, stop, nb, nkeys), daemon=True)
    proc.start()
    eps, sink_ep = q.get(timeout=60)
    ctx = zmq.Context()
    ctl = ctx.socket(zmq.DEALER)
    ctl.connect(sink_ep)
    clients = {k: PSClient(ctx, [ep], np.zeros(nb, np.int64), DIM) for k, ep in eps.items()}
    rng = np.random.default_rng(2)
    allk = np.arange(nkeys, dtype=np.int64)
    sub = np.sort(rng.choice(nkeys, nkeys // 10, replace=False)).astype(np.int64)
    d_sub = np.full((len(sub), DIM), 1e-3, np.float32)
    d_all = np.full((nkeys, DIM), 1e-3, np.float32)
    ops = {"pull all": lambda c: c.pull(allk), "pull 10%": lambda c: c.pull(sub),
           "push 10%": lambda c: c.push(sub, d_sub), "push all": lambda c: c.push(allk, d_all)}
    t: dict[tuple[str, str], list[float]] = {}
    try:
        for state in ("moved", "merged"):
            sock = ctx.socket(zmq.DEALER)
            sock.connect(eps[state])
            send_payloads([sock], f"pp:{state}", payloads)
            wait_acks(lambda d: sock, {(0, p.sec, p.bid) for p in payloads}, f"pp:{state}", 300)
            sock.close(0)
        _ctl(ctl, "end")
        while _ctl(ctl, "merged?") != b"1":
            time.sleep(0.01)
        for r in range(-1, reps):            # turn -1 warms up, not counted
            for name, op in ops.items():
                # loaded and merged side by side (in turns, each first every
                # other turn); the unmerged one after them
                pair = ("loaded", "merged") if r % 2 == 0 else ("merged", "loaded")
                for state in (*pair, "moved"):
                    t0 = time.perf_counter()
                    op(clients[state])
                    if r >= 0:
                        t.setdefault((state, name), []).append(time.perf_counter() - t0)
    finally:
        for c in clients.values():
            c.close()
        stop.set()
        proc.join(10)
        ctl.close(0)
        ctx.term()
    out = {}
    for name in ops:
        base = np.array(t[("loaded", name)])
        row = out[name] = {"loaded_ms": float(np.median(base)) * 1e3}
        for state in ("moved", "merged"):
            x = np.array(t[(state, name)])
            row[f"{state}_ms"] = float(np.median(x)) * 1e3
            row[f"{state}_vs_loaded"] = float(np.median(base / x))    # speed, per turn
        print(f"  {name:9s}: loaded {row['loaded_ms']:7.2f} ms; moved and merged "
              f"{row['merged_ms']:7.2f} ms (speed {row['merged_vs_loaded']:.2f}x); moved, "
              f"not merged {row['moved_ms']:7.2f} ms ({row['moved_vs_loaded']:.2f}x)",
              flush=True)
    return out


BULK = '''
import numpy as np
from harmony.app import App, ModelSpec, Option
from harmony.store.blocks import Block


class Bulk(App):
    """Input blocks of block_mb MiB with a mutable counter each; a model of
    keys x dim floats; light compute."""
    name = "bulk"
    static_keys = True
    options = [Option("block_mb", float, 4.0, ""), Option("keys", int, 20000, ""),
               Option("dim", int, 64, "")]

    def read_input(self, part):
        n = int(self.opts.block_mb * 2**20 / 8)
        for b in part.my_blocks():
            yield Block(b, {"x": np.random.default_rng([1, b]).random(n), "c": np.zeros(1)})

    def model_spec(self):
        return ModelSpec(self.opts.keys, self.opts.dim)

    def keys(self, blocks):
        return np.arange(0, self.opts.keys, 97, dtype=np.int64)

    def compute(self, blocks, keys, rows, step):
        for b in blocks:
            b["c"] += 1
        return np.full(rows.shape, 0.001, dtype=np.float32)

    def objective(self, blocks, keys, rows):
        return {"objective": float(sum(b["c"][0] for b in blocks))}
'''


def resize_run(cap: float, input_mb: int, tmp: str, frm: int = 1, to: int = 2,
               max_moves: int = 4) -> dict:
    app = os.path.join(tmp, "bulk.py")
    with open(app, "w") as fh:
        fh.write(BULK)
    cl = LocalCluster(max(frm, to), os.path.join(tmp, f"rc{frm}{to}{max_moves}"), port=0,
                      net_bandwidth=cap, max_moves=max_moves)
    cl.start()
    try:
        with Client(cl.endpoint, keys=cl.keys) as c:
            blocks = max(2, input_mb // 4)
            job = c.submit("bulk.py", open(app).read(), ["--blocks", str(blocks),
                                                          "--max-epochs", "60"], machines=frm)
            while c.status(job)["epochs_total"] < 3:
                time.sleep(0.05)
            c.resize(job, to)
            while True:
                st = c.status(job)
                note = [e[2] for e in st["events"] if "iterations stood" in e[2]]
                if note or st["state"] in ("failed", "finished"):
                    break
                time.sleep(0.05)
            c.cancel(job)
    finally:
        cl.stop()
    if not note:
        raise RuntimeError(f"resize did not complete: {st.get('error')}")
    moved = float(note[0].split(" MiB moved")[0].split(", ")[-1]) * 2**20
    stood = float(note[0].split("iterations stood ")[1].split("s)")[0])
    need = moved / cap
    return {"moved_MiB": moved / 2**20, "stood_s": stood, "bytes_at_cap_s": need,
            "over_s": stood - need}


def recovery_run(tmp: str, every: int = 3) -> dict:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    from apps_for_tests import ORACLE_APP
    cl = LocalCluster(3, os.path.join(tmp, "kc"), port=0, heartbeat_timeout=1.5)
    cl.start()
    try:
        with Client(cl.endpoint, keys=cl.keys) as c:
            job = c.submit("oracle.py", ORACLE_APP, ["--max-epochs", "30", "--blocks", "12",
                                                     "--sleep", "0.05"], machines=2,
                           checkpoint_every=every, checkpoint_seconds=0)
            while c.status(job)["epochs_total"] < 8:
                time.sleep(0.02)
            st = c.status(job)
            done = st["epochs_total"]
            cl.procs[1 + int(st["workers"][-1][1:])].send_signal(signal.SIGKILL)
            while (st := c.status(job))["state"] not in ("finished", "failed"):
                time.sleep(0.1)
    finally:
        cl.stop()
    at = [int(e[2].split("resumes at epoch ")[1].rstrip(")")) for e in st["events"]
          if "resumes at epoch" in e[2]]
    return {"state": st["state"], "epochs_done_at_kill": done, "resumed_at": at[-1] if at else 0,
            "redone": done - (at[-1] if at else 0), "interval": every}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="16,128,512")
    ap.add_argument("--cap", default="100MB/s")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--resize-mb", type=int, default=128)
    ap.add_argument("--json", default=None)
    ap.add_argument("--only", choices=["plans", "transfer"], default=None,
                    help="run only the plan's move-limit measurement (5), or only the "
                         "transfer measurements (1, 1b and 2)")
    ap.add_argument("--pullpush-mb", type=int, default=128,
                    help="1b: the move (half of it model rows) after which pulls and pushes "
                         "are timed")
    ap.add_argument("--pp-reps", type=int, default=30, help="1b: turns of each operation")
    ap.add_argument("--plan-limits", default="4,1,0",
                    help="5: the master's --max-moves values compared (0: all at once)")
    ap.add_argument("--plan-mb", type=int, default=64, help="5: the job's input in MiB")
    ap.add_argument("--memory", choices=["keep", "dynamic"], default="dynamic",
                    help="1 and 2: the receiving process's malloc thresholds: pinned as a "
                         "training executor's (keep_working_memory), or glibc's dynamic ones "
                         "(a fresh process, as a joining executor receives its blocks)")
    a = ap.parse_args()
    sizes = [int(x) for x in a.sizes.split(",")]
    cap = parse_rate(a.cap)
    out = {}
    if a.only in (None, "transfer"):
        measure_transfer(out, sizes, cap, a)
    if a.only is None:
        measure_all(out, cap, a)
    if a.only in (None, "plans"):
        out["plans"] = plans_run(cap, a.plan_mb, [int(x) for x in a.plan_limits.split(",")],
                                 a.rounds)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=2)
    return 0


def measure_transfer(out: dict, sizes: list[int], cap: float, a) -> None:
    """1, 1b and 2."""
    print("1. block transfer vs raw pyzmq (loopback, no cap), medians of "
          f"{a.rounds} rounds, the two alternated; the receiver's malloc: {a.memory}:",
          flush=True)
    out["raw"] = transfer_run(sizes, None, a.rounds, a.memory)
    print(f"1b. pull/push of the rows of a {a.pullpush_mb} MiB move (one request each, "
          f"{a.pp_reps} turns): the shard after the move vs the same rows loaded",
          flush=True)
    out["pullpush"] = pullpush_run(a.pullpush_mb, a.pp_reps)
    print(f"2. under a cap of {cap / 1e6:.0f} MB/s:", flush=True)
    out["cap"] = transfer_run([s for s in sizes if s <= 128], cap, 1, a.memory)


def measure_all(out: dict, cap: float, a) -> None:
    """3 and 4 (1, 1b, 2: measure_transfer; 5: plans_run)."""
    with tempfile.TemporaryDirectory() as tmp:
        print(f"3. 1 -> 2 resize of a job with {a.resize_mb} MiB of input, cap "
              f"{cap / 1e6:.0f} MB/s:", flush=True)
        r = out["resize"] = resize_run(cap, a.resize_mb, tmp)
        print(f"   moved {r['moved_MiB']:.1f} MiB; iterations stood {r['stood_s']:.2f}s; the "
              f"bytes alone need {r['bytes_at_cap_s']:.2f}s at the cap: +{r['over_s']:.2f}s",
              flush=True)
        print("4. recovery after kill -9 of a worker (checkpoint every 3 epochs):", flush=True)
        r = out["recovery"] = recovery_run(tmp)
        print(f"   {r['state']}: killed after {r['epochs_done_at_kill']} epochs, resumed at "
              f"epoch {r['resumed_at']}: {r['redone']} epoch(s) redone (interval "
              f"{r['interval']})", flush=True)


def plans_run(cap: float, input_mb: int, limits: list[int], rounds: int) -> dict:
    """5: the same 2 -> 4 resize under each move limit, interleaved."""
    print(f"5. 2 -> 4 resize of a job with {input_mb} MiB of input, cap {cap / 1e6:.0f} MB/s, "
          f"master --max-moves {', '.join(map(str, limits))} (0: all at once), "
          f"{rounds} round(s) interleaved:", flush=True)
    runs: dict[int, list[dict]] = {k: [] for k in limits}
    for r in range(rounds):
        for k in (limits if r % 2 == 0 else limits[::-1]):
            with tempfile.TemporaryDirectory() as tmp:
                runs[k].append(resize_run(cap, input_mb, tmp, 2, 4, k))
            x = runs[k][-1]
            print(f"   round {r + 1}, --max-moves {k}: moved {x['moved_MiB']:.1f} MiB, stood "
                  f"{x['stood_s']:.2f}s ({x['bytes_at_cap_s']:.2f}s of bytes at the cap)",
                  flush=True)
    out = {}
    base = float(np.median([x["stood_s"] for x in runs[limits[0]]]))
    for k in limits:
        st = float(np.median([x["stood_s"] for x in runs[k]]))
        out[str(k)] = {"stood_s": st, "moved_MiB": runs[k][0]["moved_MiB"],
                       "ratio_to_first": st / base}
        print(f"   --max-moves {k}: stood {st:.2f}s (median), {st / base:.2f}x of "
              f"--max-moves {limits[0]}", flush=True)
    return out


if __name__ == "__main__":
    sys.exit(main())
