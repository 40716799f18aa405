"""PS data-plane throughput vs raw pyzmq, side by side in one run.

For each payload size (float32 rows of DIM values) it measures, over loopback
with the server in its own process:

  raw pull : DEALER sends the key bytes, ROUTER answers with the payload bytes
  PS  pull : PSClient.pull(keys) against a ShardServer owning those keys
  raw push : DEALER sends keys + payload, ROUTER answers a small ack
  PS  push : PSClient.push(keys, deltas); the shard applies ``rows += deltas``

and prints MB/s and the ratio PS/raw (goal: >= 0.8 from 16 MB up). With
``--curve`` it also runs the PS with CurveZMQ (authenticated, encrypted, as
every cluster runs by default) against the same PS in plain text, and prints
what encryption costs.

    python bench/ps_throughput.py [--sizes 1,16,64] [--dim 256] [--reps 20] [--curve]
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
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


def ps_server(port_q, rows_total, dim, keys_dir=None):
    from harmony.ps.server import ShardServer, ShardTable
    if keys_dir:
        from harmony.comm import security
        security.use(security.Keys.load(keys_dir, "worker", "w0"))
    ctx = zmq.Context()
    table = ShardTable(dim, "float32", None)  # None: the default add, in place
    keys = np.arange(rows_total, dtype=np.int64)
    table.load(keys, np.ones((rows_total, dim), dtype=np.float32))
    srv = ShardServer(ctx, "127.0.0.1", table)
    srv.start()
    port_q.put(srv.endpoint)
    port_q.get()  # wait for stop
    srv.stop()
    from harmony.comm import security
    security.stop_authenticator(ctx)
    ctx.term()


def timed_pair(fa, fb, reps):
    """Median seconds of fa and fb, measured interleaved so that drift in
    the machine's speed hits both alike."""
    fa(), fb()  # warm-up
    ta, tb = [], []
    for _ in range(reps):
        for fn, ts in ((fa, ta), (fb, tb)):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
    return statistics.median(ta), statistics.median(tb)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1,16,64", help="payload sizes in MB")
    ap.add_argument("--dim", type=int, default=DIM)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--curve", action="store_true", help="also measure the PS with CurveZMQ")
    a = ap.parse_args()
    keys_dir = None
    if a.curve:
        import tempfile
        from harmony.comm import security
        keys_dir = security.init_keys(tempfile.mkdtemp(), workers=["w0"])
        curve_keys = security.Keys.load(keys_dir, "worker", "w0")
    sizes = [int(float(x) * 2**20) for x in a.sizes.split(",")]
    ctx = mp.get_context("spawn")

    q = ctx.Queue()
    rp = ctx.Process(target=raw_server, args=(q, sizes), daemon=True)
    rp.start()
    raw_port = q.get(timeout=60)

    from harmony.ps.client import PSClient
    zctx = zmq.Context()
    raw = zctx.socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(f"tcp://127.0.0.1:{raw_port}")

    results, curve_rows = [], []
    for nbytes in sizes:
        nrows = nbytes // (4 * a.dim)
        keys = np.arange(nrows, dtype=np.int64)
        deltas = np.full((nrows, a.dim), 0.5, dtype=np.float32)
        pq = ctx.Queue()
        pp = ctx.Process(target=ps_server, args=(pq, nrows, a.dim), daemon=True)
        pp.start()
        ep = pq.get(timeout=60)
        client = PSClient(zctx, [ep], np.zeros(1, dtype=np.int64), a.dim)
        if a.curve:
            cq = ctx.Queue()
            cp = ctx.Process(target=ps_server, args=(cq, nrows, a.dim, keys_dir), daemon=True)
            cp.start()
            cep = cq.get(timeout=60)
            security.use(curve_keys)
            cclient = PSClient(zctx, [cep], np.zeros(1, dtype=np.int64), a.dim)
            security.use(None)

        def raw_pull():
            raw.send_multipart([b"pull%d" % nbytes, keys], copy=False)
            f = raw.recv_multipart(copy=False)
            assert len(f[1].buffer) == nbytes

        def raw_push():
            raw.send_multipart([b"push", keys, deltas], copy=False)
            raw.recv_multipart()

        def ps_pull():
            r = client.pull(keys)
            assert r.nbytes == nbytes

        def ps_push():
            client.push(keys, deltas)

        rp_, pp_ = timed_pair(raw_pull, ps_pull, a.reps)
        rs_, ps_ = timed_pair(raw_push, ps_push, a.reps)
        mb = nbytes / 2**20
        results.append((mb, mb / rp_, mb / pp_, rp_ / pp_, mb / rs_, mb / ps_, rs_ / ps_))
        if a.curve:
            def c_pull():
                assert cclient.pull(keys).nbytes == nbytes
            t_plain, t_curve = timed_pair(ps_pull, c_pull, a.reps)
            u_plain, u_curve = timed_pair(ps_push, lambda: cclient.push(keys, deltas), a.reps)
            curve_rows.append((mb, mb / t_plain, mb / t_curve, t_plain / t_curve,
                               mb / u_plain, mb / u_curve, u_plain / u_curve))
            cclient.close()
            cq.put("stop")
            cp.join(timeout=10)
        client.close()
        pq.put("stop")
        pp.join(timeout=10)

    raw.send_multipart([b"stop"])
    raw.close()
    zctx.term()
    rp.join(timeout=10)

    print(f"PS data plane vs raw pyzmq over loopback (dim {a.dim}, median of {a.reps})")
    print(f"{'size':>6} | {'raw pull':>9} {'PS pull':>9} {'ratio':>6} | "
          f"{'raw push':>9} {'PS push':>9} {'ratio':>6}")
    for mb, rpl, ppl, r1, rps, pps, r2 in results:
        print(f"{mb:5.0f}M | {rpl:7.0f}MB/s {ppl:7.0f}MB/s {r1:6.2f} | "
              f"{rps:7.0f}MB/s {pps:7.0f}MB/s {r2:6.2f}")
    if curve_rows:
        print("\nPS with CurveZMQ vs the same PS in plain text (ratio = CURVE / plain)")
        print(f"{'size':>6} | {'pull':>9} {'CURVE':>9} {'ratio':>6} | "
              f"{'push':>9} {'CURVE':>9} {'ratio':>6}")
        for mb, a1, b1, r1, a2, b2, r2 in curve_rows:
            print(f"{mb:5.0f}M | {a1:7.0f}MB/s {b1:7.0f}MB/s {r1:6.2f} | "
                  f"{a2:7.0f}MB/s {b2:7.0f}MB/s {r2:6.2f}")


if __name__ == "__main__":
    main()
