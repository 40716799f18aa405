"""PS data-plane throughput vs raw pyzmq, side by side in one run.

For each payload size (float32 rows of DIM values) it measures, over loopback
with the server in its own process:

  raw pull : DEALER sends the key bytes, ROUTER answers with the payload bytes
  PS  pull : PSClient.pull(keys) against a ShardServer owning those keys
  raw push : DEALER sends keys + payload, ROUTER answers a small ack
  PS  push : PSClient.push(keys, deltas); the shard applies ``rows += deltas``
  PS+jit push : the same, the shard's finite check compiled (an executor
             whose app loaded numba kernels: harmony.kernels.finite)

and prints MB/s, the ratio PS/raw (goal: >= 0.8 from 16 MB up; a push:
>= 0.95 at 16 and 64 MB, >= 0.8 at 1 MB) and the CPU seconds per GB of the
client's process and the server's. A shard acknowledges a push once it is
checked, then writes it (see ShardServer._handle): after each timed PS
push an untimed round trip waits for that write, so that its CPU counts
here and it never overlaps the next timed call.

With ``--designs`` it compares ways to run the PS data plane instead, each
shard in its own process, pulls and pushes interleaved design by design
(the first design is the baseline of the ratios), and prints MB/s, the
ratio and the CPU seconds per GB moved of the client's and the shard's
processes (all threads):

  plain     : no encryption, no authentication (the baseline)
  sealed    : AES-256-GCM sealed messages (harmony.comm.sealed, the default)
  signed    : the same, authenticated but not encrypted (--data-plane signed)
  curve     : CurveZMQ on the PS sockets (how the data plane ran before)
  curve-xN  : CurveZMQ, the rows in N shards over N connections, N I/O
              threads a side (encryption on more than one core)
  plain-xN  : the same split without encryption
  sealed-cK : sealed in chunks of K MiB

``--curve`` is ``--designs plain,curve``.

    python bench/ps_throughput.py [--sizes 1,16,64] [--dim 256] [--reps 20]
    python bench/ps_throughput.py --designs plain,sealed,signed,curve,curve-x2,curve-x4,plain-x2
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time

import numpy as np
import zmq

DIM = 256


def raw_server(port_q, n_bytes_list):
    ctx = zmq.Context()
    s = ctx.socket(zmq.ROUTER)
    s.setsockopt(zmq.LINGER, 0)
    port = s.bind_to_random_port("tcp://127.0.0.1")
    payloads = {n: np.ones(n // 4, dtype=np.float32) for n in n_bytes_list}
    port_q.put(port)
    while True:
        frames = s.recv_multipart(copy=False)
        ident, kind = frames[0], frames[1].bytes
        if kind == b"stop":
            break
        if kind.startswith(b"pull"):
            n = int(kind[4:])
            s.send_multipart([ident, b"rows", payloads[n]], copy=False)
        else:
            s.send_multipart([ident, b"ack"])
    s.close()
    ctx.term()


def ps_server(port_q, rows_total, dim, keys_dir=None, shards=1, io_threads=1,
              data_key=None, chunk=None, reply_q=None, compiled_check=False):
    """One process serving ``rows_total`` rows in ``shards`` shards (keys by
    block, owner map ``arange(shards)``), on a context of ``io_threads`` I/O
    threads; with ``keys_dir`` CurveZMQ, with ``data_key`` (key, mode) sealed;
    with ``compiled_check`` the finite check of pushes compiled, as in an
    executor whose app loaded numba kernels (harmony.kernels.finite)."""
    if compiled_check:
        from harmony.kernels import finite
        finite.load()
    from harmony.comm import sealed
    from harmony.ps.keymap import block_of
    from harmony.ps.server import ShardServer, ShardTable
    if keys_dir:
        from harmony.comm import security
        security.use(security.Keys.load(keys_dir, "worker", "w0"))
    if chunk:
        sealed.CHUNK_BYTES = chunk
    key = sealed.DataKey(*data_key) if data_key else None
    ctx = zmq.Context(io_threads=io_threads)
    keys = np.arange(rows_total, dtype=np.int64)
    blocks = block_of(keys, shards)
    servers = []
    for i in range(shards):
        table = ShardTable(dim, "float32", None)  # None: the default add, in place
        mine = keys[blocks == i]
        table.load(mine, np.ones((len(mine), dim), dtype=np.float32))
        srv = ShardServer(ctx, "127.0.0.1", table, key=key)
        srv.start()
        servers.append(srv)
    port_q.put([s.endpoint for s in servers])
    # until "stop": "reset" drops the blocks moved in (and answers on reply_q)
    while port_q.get() == "reset":
        for srv in servers:
            srv.end_arrivals()
        reply_q.put("done")
    for srv in servers:
        srv.stop()
    from harmony.comm import security
    security.stop_authenticator(ctx)
    ctx.term()


def timed_many(fns, reps):
    """Median seconds and CPU seconds (this process, and ``pid``'s: all its
    threads) of each ``name -> (fn, pid[, sync])``, measured interleaved so
    that drift in the machine's speed hits all alike (one untimed warm-up
    each). ``sync``, run after ``fn``'s timed call and before the CPU
    readings, waits until the server has done all its work for the call
    (the shard writes a push after acknowledging it): that work counts in
    the CPU figures and never runs into the next timed call."""
    for fn, *_ in fns.values():
        fn()
    ts = {k: [] for k in fns}
    cpu = {k: [0.0, 0.0] for k in fns}
    for _ in range(reps):
        for k, (fn, pid, *sync) in fns.items():
            s0, c0 = cpu_ns(pid), time.process_time()
            t = time.perf_counter()
            fn()
            ts[k].append(time.perf_counter() - t)
            for f in sync:
                f()
            cpu[k][0] += time.process_time() - c0
            cpu[k][1] += (cpu_ns(pid) - s0) / 1e9
    return {k: (statistics.median(v), *cpu[k]) for k, v in ts.items()}


def cpu_ns(pid: int) -> int:
    """CPU nanoseconds of all threads of process ``pid`` so far (the
    scheduler's own count, /proc/PID/task/*/schedstat: ns, not ticks)."""
    total = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{t}/schedstat") as fh:
                total += int(fh.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass            # a thread that ended: its time is in no task any more
    return total


class Design:
    """One way to run the PS data plane: a server process and a client."""

    def __init__(self, name, ctx, nrows, dim, zctx_threads=1, keys_dir=None, client_keys=None,
                 shards=1, data_key=None, chunk=None):
        from harmony.comm import sealed, security
        from harmony.ps.client import PSClient
        self.name = name
        self.q = ctx.Queue()
        self.proc = ctx.Process(target=ps_server, daemon=True,
                                args=(self.q, nrows, dim, keys_dir, shards, zctx_threads,
                                      data_key, chunk))
        self.proc.start()
        eps = self.q.get(timeout=60)
        self.zctx = zmq.Context(io_threads=zctx_threads)
        security.use(client_keys)
        old_chunk = sealed.CHUNK_BYTES
        if chunk:
            sealed.CHUNK_BYTES = chunk
        self.client = PSClient(self.zctx, eps, np.arange(shards, dtype=np.int64), dim,
                               key=sealed.DataKey(*data_key) if data_key else None)
        sealed.CHUNK_BYTES = old_chunk
        security.use(None)
        self.server = self.proc.pid
        self.wall = {"pull": [], "push": []}
        self.cpu_c = {"pull": 0.0, "push": 0.0}
        self.cpu_s = {"pull": 0.0, "push": 0.0}

    def run(self, op, keys, deltas, nbytes):
        s0, c0 = cpu_ns(self.server), time.process_time()
        t = time.perf_counter()
        if op == "pull":
            assert self.client.pull(keys).nbytes == nbytes
        else:
            self.client.push(keys, deltas)
        self.wall[op].append(time.perf_counter() - t)
        if op == "push":            # the shard writes a push after its ack: counted here
            self.client.pull(keys[:1])
        self.cpu_c[op] += time.process_time() - c0
        self.cpu_s[op] += (cpu_ns(self.server) - s0) / 1e9

    def close(self):
        self.client.close()
        self.zctx.term()
        self.q.put("stop")
        self.proc.join(timeout=10)


def design_args(name, keys_dir, curve_keys):
    """Server and client settings of a design's name: plain, curve, sealed,
    signed, curve-xN / plain-xN (N shards, N I/O threads a side), sealed-cK
    (chunks of K MiB)."""
    import secrets
    from harmony.comm import sealed
    base, _, arg = name.partition("-")
    kw = {}
    if arg.startswith("x"):
        kw.update(shards=int(arg[1:]), zctx_threads=int(arg[1:]))
    elif arg.startswith("c"):
        kw.update(chunk=int(float(arg[1:]) * 2**20))
    if base == "curve":
        kw.update(keys_dir=keys_dir, client_keys=curve_keys)
    elif base in ("sealed", "signed"):
        kw.update(data_key=(sealed.attempt_key(secrets.token_hex(16), "bench", 1), base))
    elif base != "plain":
        raise SystemExit(f"unknown design {name!r}")
    return kw


def compare(designs, sizes, dim, reps, keys_dir, curve_keys):
    """Every design's pull and push at every size, interleaved rep by rep
    (the first design is the baseline of the ratios)."""
    ctx = mp.get_context("spawn")
    rows = []
    for nbytes in sizes:
        nrows = nbytes // (4 * dim)
        keys = np.arange(nrows, dtype=np.int64)
        deltas = np.full((nrows, dim), 0.5, dtype=np.float32)
        ds = [Design(n, ctx, nrows, dim, **design_args(n, keys_dir, curve_keys)) for n in designs]
        for op in ("pull", "push"):
            for d in ds:
                d.run(op, keys, deltas, nbytes)         # warm-up
                d.wall[op].clear()
                d.cpu_c[op] = d.cpu_s[op] = 0.0
            for _ in range(reps):
                for d in ds:
                    d.run(op, keys, deltas, nbytes)
        gb = reps * nbytes / 1e9
        for d in ds:
            r = [d.name, nbytes / 2**20]
            for op in ("pull", "push"):
                med, base = statistics.median(d.wall[op]), statistics.median(ds[0].wall[op])
                r += [nbytes / 2**20 / med, base / med, d.cpu_c[op] / gb, d.cpu_s[op] / gb]
            rows.append(r)
        for d in ds:
            d.close()
    return rows


def moves(designs, mb, reps, keys_dir, curve_keys):
    """Blocks moved into a shard (send_payloads, then every acknowledgement)
    by each design, interleaved move by move: ``mb`` MiB as 4 MiB blocks."""
    from harmony.comm import sealed, security
    from harmony.comm.zmqutil import make_socket
    from harmony.store.blocks import Block
    from harmony.store.transfer import Payload, send_payloads, wait_acks
    ctx = mp.get_context("spawn")
    n = max(1, mb // 4)
    blocks = [Block(i, {"rows": np.full((4096, 256), i, np.float32)}) for i in range(n)]
    zctx = zmq.Context()
    ds = []
    for name in designs:
        kw = design_args(name, keys_dir, curve_keys)
        q, rq = ctx.Queue(), ctx.Queue()
        proc = ctx.Process(target=ps_server, daemon=True, args=(
            q, 0, 256, kw.get("keys_dir"), 1, 1, kw.get("data_key"), kw.get("chunk"), rq))
        proc.start()
        ep = q.get(timeout=60)[0]
        if kw.get("data_key"):
            bound, party = sealed.split_address(ep)
            sock = sealed_socket_for(zctx, kw, party)
            sock.connect(bound)
        else:
            sock = make_socket(zctx, zmq.DEALER, keys=kw.get("client_keys"), curve="keys_dir" in kw)
            sock.connect(ep)
        ds.append({"name": name, "q": q, "rq": rq, "proc": proc, "sock": sock, "wall": [], "c": 0.0,
                   "s": 0.0})
    for r in range(reps + 1):
        for d in ds:
            s0, c0, t = cpu_ns(d["proc"].pid), time.process_time(), time.perf_counter()
            mid = f"mv:bench:{r}"
            send_payloads([d["sock"]], mid, [Payload("input", b.id, block=b) for b in blocks])
            wait_acks(lambda _: d["sock"], {(0, "input", b.id) for b in blocks}, mid, 120)
            if r:                   # the first is a warm-up
                d["wall"].append(time.perf_counter() - t)
                d["c"] += time.process_time() - c0
                d["s"] += (cpu_ns(d["proc"].pid) - s0) / 1e9
            d["q"].put("reset")
            assert d["rq"].get(timeout=60) == "done"
    gb = reps * n * (4 << 20) / 1e9
    base = statistics.median(ds[0]["wall"])
    out = []
    for d in ds:
        med = statistics.median(d["wall"])
        out.append((d["name"], n * 4 / med, base / med, d["c"] / gb, d["s"] / gb))
        d["sock"].close(0)
        d["q"].put("stop")
        d["proc"].join(timeout=10)
    zctx.term()
    return out


def sealed_socket_for(zctx, kw, party):
    from harmony.comm import sealed
    return sealed.sealed_socket(zctx, zmq.DEALER, sealed.DataKey(*kw["data_key"]), peer=party,
                                timeout_s=60, chunk=kw.get("chunk"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1,16,64", help="payload sizes in MB")
    ap.add_argument("--dim", type=int, default=DIM)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--curve", action="store_true",
                    help="also compare the PS with CurveZMQ (= --designs plain,curve)")
    ap.add_argument("--designs", default="",
                    help="compare data plane designs side by side instead of raw vs PS, "
                         "e.g. plain,curve,curve-x2,plain-x2,sealed,signed,sealed-c4 "
                         "(the first is the baseline)")
    ap.add_argument("--moves", type=int, default=0, metavar="MB",
                    help="with --designs: measure block moves of MB MiB into a shard "
                         "(4 MiB blocks) instead of pulls and pushes")
    a = ap.parse_args()
    sizes = [int(float(x) * 2**20) for x in a.sizes.split(",")]
    designs = [d for d in a.designs.split(",") if d] or (["plain", "curve"] if a.curve else [])
    if designs:
        import tempfile
        from harmony.comm import security
        keys_dir = security.init_keys(tempfile.mkdtemp(), workers=["w0"])
        curve_keys = security.Keys.load(keys_dir, "worker", "w0")
        load0, t0 = os.getloadavg()[0], time.time()
        if a.moves:
            out = moves(designs, a.moves, a.reps, keys_dir, curve_keys)
            print(f"Block moves of {a.moves} MiB (4 MiB blocks) into a shard over loopback "
                  f"(median of {a.reps}, interleaved; ratio = design / {designs[0]}; CPU s "
                  f"per GB moved, sender and shard process, all threads)")
            print(f"load average {load0:.2f} at start, {os.getloadavg()[0]:.2f} at end, "
                  f"{time.time() - t0:.0f} s")
            print(f"{'design':>10} | {'MB/s':>9} {'ratio':>5} {'cpu c':>5} {'cpu s':>5}")
            for name, mbs, ratio, cc, cs in out:
                print(f"{name:>10} | {mbs:5.0f}MB/s {ratio:5.2f} {cc:5.2f} {cs:5.2f}")
            return
        rows = compare(designs, sizes, a.dim, a.reps, keys_dir, curve_keys)
        print(f"PS data plane designs over loopback (dim {a.dim}, median of {a.reps}, "
              f"interleaved; ratio = design / {designs[0]}; CPU s per GB moved, client "
              f"and server process, all threads)")
        print(f"load average {load0:.2f} at start, {os.getloadavg()[0]:.2f} at end, "
              f"{time.time() - t0:.0f} s")
        print(f"{'design':>10} {'size':>5} | {'pull':>9} {'ratio':>5} {'cpu c':>5} "
              f"{'cpu s':>5} | {'push':>9} {'ratio':>5} {'cpu c':>5} {'cpu s':>5}")
        for name, mb, *v in rows:
            print(f"{name:>10} {mb:4.0f}M | {v[0]:5.0f}MB/s {v[1]:5.2f} {v[2]:5.2f} "
                  f"{v[3]:5.2f} | {v[4]:5.0f}MB/s {v[5]:5.2f} {v[6]:5.2f} {v[7]:5.2f}")
        return
    ctx = mp.get_context("spawn")

    q = ctx.Queue()
    rp = ctx.Process(target=raw_server, args=(q, sizes), daemon=True)
    rp.start()
    raw_port = q.get(timeout=60)

    from harmony.ps import client as ps_client
    zctx = zmq.Context()
    raw = zctx.socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(f"tcp://127.0.0.1:{raw_port}")
    load0 = os.getloadavg()[0]

    results = []
    for nbytes in sizes:
        nrows = nbytes // (4 * a.dim)
        keys = np.arange(nrows, dtype=np.int64)
        deltas = np.full((nrows, a.dim), 0.5, dtype=np.float32)
        shards = {}     # who -> (queue, process, client)
        for who, compiled in (("PS", False), ("PS+jit", True)):
            pq = ctx.Queue()
            pp = ctx.Process(target=ps_server, args=(pq, nrows, a.dim),
                             kwargs={"compiled_check": compiled}, daemon=True)
            pp.start()
            ep = pq.get(timeout=60)
            shards[who] = (pq, pp, ps_client.PSClient(zctx, ep, np.zeros(1, dtype=np.int64),
                                                      a.dim))

        def raw_pull():
            raw.send_multipart([b"pull%d" % nbytes, keys], copy=False)
            f = raw.recv_multipart(copy=False)
            assert len(f[1].buffer) == nbytes

        def raw_push():
            raw.send_multipart([b"push", keys, deltas], copy=False)
            raw.recv_multipart()

        def ps_pull(client):
            r = client.pull(keys)
            assert r.nbytes == nbytes

        def ps_push(client):
            client.push(keys, deltas)

        def ps_sync(client):      # a round trip to the shard: after its write
            client.pull(keys[:1])

        pulls = timed_many({"raw": (raw_pull, rp.pid),
                            "PS": (lambda: ps_pull(shards["PS"][2]), shards["PS"][1].pid)},
                           a.reps)
        pushes = timed_many({"raw": (raw_push, rp.pid),
                             **{who: (lambda c=c: ps_push(c), pp.pid, lambda c=c: ps_sync(c))
                                for who, (_, pp, c) in shards.items()}}, a.reps)
        results.append((nbytes, pulls, pushes))
        for pq, pp, client in shards.values():
            client.close()
            pq.put("stop")
            pp.join(timeout=10)

    raw.send_multipart([b"stop"])
    raw.close()
    zctx.term()
    rp.join(timeout=10)

    print(f"PS data plane vs raw pyzmq over loopback (dim {a.dim}, median of {a.reps}, "
          f"interleaved; CPU s per GB moved, client / server process, all threads)")
    print(f"load average {load0:.2f} at start, {os.getloadavg()[0]:.2f} at end")
    print(f"{'size':>6} {'op':>4} {'who':>8} | {'MB/s':>9} {'ratio':>6} | {'CPU c/s':>11}")
    for nbytes, pulls, pushes in results:
        mb, gb = nbytes / 2**20, a.reps * nbytes / 1e9
        for op, res in (("pull", pulls), ("push", pushes)):
            base = res["raw"][0]
            for who, (med, cc, cs) in res.items():
                print(f"{mb:5.0f}M {op:>4} {who:>8} | {mb / med:5.0f}MB/s {base / med:6.2f} | "
                      f"{cc / gb:5.2f}/{cs / gb:5.2f}")


if __name__ == "__main__":
    main()
