"""The attack suite: every probe of the security issue against one real,
secured 2-machine local cluster while a job runs on both machines.

After each probe: no process died, the job table (ids, states, attempts,
launches, failures) and the worker table (names, sizes, liveness) are as
before, and the master answers ``status`` within 1 s. At the end the master's
RSS grew < 100 MiB over the whole suite and the running job finishes with the
objective an undisturbed run reaches. The flood of malformed and oversized
messages runs here too (its per-payload variety is
``test_hardening._flood_payloads``); the unit-level checks of each defence
(shard tags, duplicate keys, frame caps, damaged tables, full disks) are in
``test_hardening.py``, ``test_robustness.py`` and ``test_security.py``.
"""
from __future__ import annotations

import os
import random
import socket
import statistics
import time

import msgpack
import numpy as np
import psutil
import pytest
import zmq

from harmony.client import Client
from harmony.cluster import LocalCluster
from harmony.comm import messages as M
from harmony.comm import security
from harmony.comm.handshake import Watch
from harmony.comm.zmqutil import make_socket
from harmony.store.transfer import chunk_digest
from apps_for_tests import TOY_APP
from conftest import ISOLATE, wait_state
from test_hardening import _flood_payloads, flood

MiB = 1 << 20
EPOCHS = 100_000         # the victim job: outlives the probes (cancelled at the end)
SLEEP = 0.02


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """A secured 2-machine cluster running one job on both machines."""
    d = tmp_path_factory.mktemp("attack")
    cl = LocalCluster(2, str(d / "cluster"), port=0, heartbeat_timeout=10.0, isolate=ISOLATE,
                      policy="least-loaded")
    cl.start()
    c = Client(cl.endpoint, timeout_s=10, keys=cl.keys)
    job = c.submit("toy.py", TOY_APP, ["--max-epochs", str(EPOCHS), "--sleep", str(SLEEP)],
                   machines=2)
    wait_state(c, job, ("running",))
    deadline = time.time() + 60
    while c.status(job)["epochs_total"] < 2:      # executors up, shards serving
        assert time.time() < deadline, c.status(job)
        time.sleep(0.1)
    master = psutil.Process(cl.procs[0].pid)
    cl.attack = {"client": c, "job": job, "stranger": _stranger(d),
                 "rss0": master.memory_info().rss, "master": master}
    yield cl
    c.close()
    cl.stop()


def _stranger(d) -> security.Keys:
    """A complete, valid key set of another cluster."""
    return security.Keys.load(security.init_keys(str(d / "other"), workers=["m0", "m1"]),
                              "client", "admin")


def _keys(cl, role: str, name: str) -> security.Keys:
    return security.Keys.load(cl.keys, role, name)


def _send(endpoint: str, frames: bytes | list[bytes], keys: security.Keys | None,
          wait_ms: int = 700) -> M.Message | None:
    """Send one message with ``keys`` (None: no CURVE at all); the reply or
    None: none within ``wait_ms``, or the handshake failed (the socket's
    monitor says so, and no handshake completed: the peer read nothing, so
    no reply can come and the rest of ``wait_ms`` is not waited out)."""
    return _send_all([(endpoint, frames, keys)], wait_ms)[0]


def _send_all(probes: list[tuple[str, bytes | list[bytes], security.Keys | None]],
              wait_ms: int = 700) -> list[M.Message | None]:
    """:func:`_send` for every (endpoint, frames, keys) of ``probes``, each
    on a connection of its own, all at once: every message is sent, then the
    answers are read together; each probe's reply, or None (none within
    ``wait_ms`` of its send, or its handshake failed). A key of another
    cluster at a CurveZMQ socket is dropped without an ERROR (the server
    cannot decrypt its HELLO), libzmq connects again, and the monitor never
    says why: such a probe waits out its ``wait_ms``, and overlapping those
    waits is what makes many probes cost one."""
    ctx = zmq.Context()
    conns: list[tuple[zmq.Socket, Watch]] = []
    out: list[M.Message | None] = [None] * len(probes)
    try:
        for endpoint, _, keys in probes:
            s = (make_socket(ctx, zmq.DEALER, keys=keys) if keys is not None
                 else ctx.socket(zmq.DEALER))
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.RECONNECT_IVL, RECONNECT_MS)
            conns.append((s, Watch(s)))
            s.connect(endpoint)
        until: dict[int, float] = {}         # a probe still waiting: its deadline
        poller = zmq.Poller()
        for i, (_, frames, _) in enumerate(probes):
            s, watch = conns[i]
            try:
                s.send_multipart([frames] if isinstance(frames, bytes) else frames, zmq.NOBLOCK)
            except zmq.Again:          # no peer: the handshake never completed
                continue
            until[i] = time.monotonic() + wait_ms / 1000
            poller.register(s, zmq.POLLIN)
            poller.register(watch.mon, zmq.POLLIN)
        while until:
            ready = dict(poller.poll(max(1, int((min(until.values()) - time.monotonic()) * 1000))))
            now = time.monotonic()
            for i in list(until):
                s, watch = conns[i]
                if s in ready:
                    out[i] = M.decode(s.recv_multipart())
                elif now < until[i] and not _no_handshake(watch):
                    continue
                del until[i]
                poller.unregister(s)
                poller.unregister(watch.mon)
        return out
    finally:
        for _, watch in conns:
            watch.close()
        ctx.destroy(0)


#: a probe socket's reconnect interval (libzmq's default: 100 ms). A peer
#: that closes a connection mid-greeting (a sealed shard seeing a CurveZMQ
#: greeting often does) is a failure without detail, and libzmq connects
#: again; the mechanism mismatch (or the ZAP handler's refusal) is seen on a
#: later try. Retrying sooner only brings that outcome sooner.
RECONNECT_MS = 10


def _no_handshake(watch: Watch) -> bool:
    """The peer refused the key (ZAP) or the mechanism and no handshake
    completed: nothing sent on the socket was or will be read (libzmq ends
    the session after a handshake fails on the protocol or on a refusal, it
    does not connect again, and messages are only sent after a handshake)."""
    watch.update()
    return (watch.refused or watch.mismatch) and not watch.succeeded


def _cluster_pids(cl) -> list[int]:
    """The master, the daemons and every executor they started."""
    pids = [p.pid for p in cl.procs]
    for p in cl.procs[1:]:
        try:
            pids += [c.pid for c in psutil.Process(p.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
    return pids


def _listening(cl) -> list[tuple[int, str]]:
    """(pid, tcp://127.0.0.1:PORT) of every socket the cluster listens on."""
    out = []
    for pid in _cluster_pids(cl):
        try:
            conns = psutil.Process(pid).net_connections(kind="tcp")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        out += [(pid, f"tcp://{c.laddr.ip}:{c.laddr.port}") for c in conns
                if c.status == psutil.CONN_LISTEN]
    return out


def _snapshot(cl) -> dict:
    c = cl.attack["client"]
    jobs = {j["id"]: j for j in c.jobs()}
    st = c.status(cl.attack["job"])
    return {"jobs": sorted((j, v["state"]) for j, v in jobs.items()),
            "victim": {k: st[k] for k in ("state", "attempt", "launches", "failures",
                                          "workers")},
            "workers": sorted((w["name"], w["cpus"], w["memory"], w["alive"])
                              for w in c.cluster()["workers"])}


def _unchanged(cl, before: dict, what: str) -> None:
    for p in cl.procs:
        assert p.poll() is None, f"{what}: a cluster process exited ({p.args[:4]})"
    t = time.perf_counter()
    after = _snapshot(cl)
    took = time.perf_counter() - t
    assert after == before, f"{what} changed the cluster:\n{before}\n{after}"
    assert took < 1.0 * 3, f"{what}: status took {took:.2f}s"     # 3 requests


# -- the probes --------------------------------------------------------------------------------
def probe_stranger_keys_at_the_master(cl):
    """A valid key set of another cluster: no answer to submit, cancel, register."""
    ep, job, k = cl.endpoint, cl.attack["job"], cl.attack["stranger"]
    for frames in (M.encode("submit", app_name="x.py", app_source=TOY_APP, args=[], machines=1),
                   M.encode("cancel", job=job), M.encode("list_jobs"),
                   M.encode("register", name="m0", host="127.0.0.1", cpus=64,
                            memory=1 << 40, pid=1, executors=[])):
        assert _send(ep, frames, k) is None


def probe_plain_text_at_the_master(cl):
    """No CURVE at all: the handshake fails, nothing is read."""
    assert _send(cl.endpoint, M.encode("cancel", job=cl.attack["job"]), None) is None


def probe_reader_and_worker_keys_beyond_their_role(cl):
    ep, job = cl.endpoint, cl.attack["job"]
    reader, m1 = _keys(cl, "reader", "reader"), _keys(cl, "worker", "m1")
    for keys, frames in (
            (reader, M.encode("submit", app_name="x.py", app_source=TOY_APP, args=[],
                              machines=1)),
            (reader, M.encode("cancel", job=job)),
            (reader, M.encode("pause", job=job)),
            (m1, M.encode("submit", app_name="x.py", app_source=TOY_APP, args=[],
                          machines=1)),
            (m1, M.encode("cancel", job=job)),
            # a worker key speaks only for its own machine: no fake m0, no new
            # 64-core machine
            (m1, M.encode("register", name="m0", host="127.0.0.1", cpus=64, memory=1 << 40,
                          pid=1, executors=[])),
            (m1, M.encode("register", name="m9", host="127.0.0.1", cpus=64, memory=1 << 40,
                          pid=1, executors=[]))):
        r = _send(ep, frames, keys, 3000)
        assert r is not None and r.type == "error" and r["code"] == "forbidden", (frames, r)


def probe_forged_executor_messages(cl):
    """A user's exec_failed/exec_ready is refused; a worker's for an executor
    on another machine changes nothing."""
    c, job = cl.attack["client"], cl.attack["job"]
    st = c.status(job)
    admin, m1 = _keys(cl, "client", "admin"), _keys(cl, "worker", "m1")
    for frames in (M.encode("exec_failed", job=job, index=0, attempt=st["attempt"],
                            error="forged"),
                   M.encode("exec_ready", job=job, index=0, attempt=st["attempt"],
                            endpoint="tcp://127.0.0.1:9", num_keys=1, dim=1, model_blocks=1,
                            local_blocks=1)):
        r = _send(cl.endpoint, frames, admin, 3000)
        assert r is not None and r.type == "error" and r["code"] == "forbidden", r
    idx = st["workers"].index("m0")
    _send(cl.endpoint, M.encode("exec_failed", job=job, index=idx, error="forged",
                                attempt=st["attempt"]), m1, 500)
    _send(cl.endpoint, M.encode("exec_failed", job="job-9999", index=0, error="forged",
                                attempt=1), m1, 500)


def probe_every_listening_socket(cl):
    """Every socket any cluster process listens on (master, daemons' executor
    and data sockets, the executors' PS shards, the dashboard): raw bytes, a
    plain-text ZMTP peer and a peer with another cluster's keys sending the
    messages that socket serves (hello, pull with a guessed tag, push). A
    CurveZMQ socket answers neither; a PS shard (its data plane sealed, no
    CurveZMQ) answers the plain-text peer with a refusal only."""
    job, k = cl.attack["job"], cl.attack["stranger"]
    eps = _listening(cl)
    assert len(eps) >= 1 + 2 + 2, eps        # master, 2 daemons, 2 shards at least
    shards = {ep for _, ep in _executors(cl)}
    guesses = [M.encode("hello", job=job, attempt=1, index=0),
               [M.encode("pull", rid=1, tag=f"{job}:1", n=1), np.zeros(1, np.int64).tobytes()],
               [M.encode("push", rid=2, tag=f"{job}:1", n=1, dim=2),
                np.zeros(1, np.int64).tobytes(), np.full(2, np.nan, np.float32).tobytes()],
               M.encode("sub_done", job=job, seq=0)]
    for _, ep in eps:
        host, port = ep[6:].rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=2) as s:
            s.sendall(random.Random(port).randbytes(4096))
            s.settimeout(0.3)
            try:
                s.recv(1024)
            except (socket.timeout, ConnectionError):
                pass
    # every socket, every guess, plain text and the stranger's key: one
    # connection each, all at once (each still waits 300 ms for an answer)
    probes = [(ep, frames, keys) for _, ep in eps
              for keys, sent in ((None, guesses[:2]), (k, guesses)) for frames in sent]
    for (ep, _, keys), r in zip(probes, _send_all(probes, 300)):
        if keys is None and ep in shards:
            _sealed_refusal(r, job)
        else:
            assert r is None, (ep, "plain text" if keys is None else "stranger", r)


def _sealed_refusal(r, job: str, why: str = "") -> None:
    """A sealed shard's answer to what it refused: a plain-text ps_error
    that names neither the job nor its secret."""
    assert r is not None and r.type == "ps_error", r
    assert r["message"].startswith("refused: ") and why in r["message"], r.fields
    assert job not in r["message"], r.fields


def probe_wrong_shard_tag_from_a_cluster_key(cl):
    """The shards' data plane is sealed under the job attempt's key: the
    cluster's own worker key does not even complete a handshake there (no
    CurveZMQ); a pull or a NaN push with a guessed tag in plain text, or
    sealed under a key from a guessed secret, is refused by both shards,
    and no secret is ever echoed."""
    from harmony.comm import sealed
    job = cl.attack["job"]
    m1 = _keys(cl, "worker", "m1")
    guessed = sealed.DataKey.for_attempt(f"{job}:1", job, 1)
    refused = []
    for _, ep in _executors(cl):
        for frames in ([M.encode("pull", rid=1, tag=f"{job}:1", n=1),
                        np.zeros(1, np.int64).tobytes()],
                       [M.encode("push", rid=2, tag=f"{job}:1", n=1, dim=2),
                        np.zeros(1, np.int64).tobytes(),
                        np.full(2, np.nan, np.float32).tobytes()]):
            assert _send(ep, frames, m1, 300) is None, ep
            _sealed_refusal(_send(ep, frames, None, 3000), job, "not a sealed")
            # the shard's party id is not known here either (only its job's
            # executors get its address, from the master)
            recs = sealed.Party(guessed).seal(os.urandom(16), frames)
            r = _send(ep, [bytes(memoryview(f).cast("B")) for f in recs[0]], None, 3000)
            _sealed_refusal(r, job, "another party")
            refused.append(ep)
    assert len(set(refused)) >= 2 and len(refused) % 2 == 0, refused   # both shards, both ops


def probe_heartbeat_bombs(cl):
    """A worker key's heartbeats with 1 MiB stats, 5000 executors, a stats
    map of 5000 fields and 5000 subtasks: refused by the schema, or (the
    subtasks) at most MAX_TASKS of them kept in a bounded ring."""
    m1 = _keys(cl, "worker", "m1")
    for frames in ([msgpack.packb({"t": "heartbeat", "name": "m1", "executors": [],
                                   "stats": {"cpu": "x" * MiB}})],
                   [msgpack.packb({"t": "heartbeat", "name": "m1",
                                   "executors": ["job-0001"] * 5000})],
                   [msgpack.packb({"t": "heartbeat", "name": "m1", "executors": [],
                                   "stats": {f"s{i}": i for i in range(5000)}})],
                   # the task stream: 5000 subtasks of 128-byte job names
                   [msgpack.packb({"t": "heartbeat", "name": "m1", "executors": [],
                                   "tasks": [[1.0, 0.5, "j" * 128, "cpu"]] * 5000})]):
        for _ in range(20):
            _send(cl.endpoint, frames, m1, 50)


def probe_submit_bombs(cl):
    """An app source over the cap and a submit with 4M machines: refused with
    a clear error; nothing admitted."""
    admin = _keys(cl, "client", "admin")
    r = _send(cl.endpoint, [msgpack.packb({"t": "submit", "app_name": "a.py",
                                           "app_source": "#" * (M.MAX_APP_SOURCE + 1),
                                           "args": [], "machines": 1})], admin, 3000)
    assert r is not None and r.type == "error", r
    r = _send(cl.endpoint, M.encode("cancel", job="job-9999"), admin, 3000)
    assert r is not None and r.type == "error" and "job-9999" in str(r.fields), r


def probe_flood(cl):
    """4 s of the hostile payload mix from 3 authenticated connections and
    one stranger; the master keeps answering within 1 s."""
    admin = _keys(cl, "client", "admin")
    ctx = zmq.Context()
    socks = []
    try:
        for i in range(4):
            s = make_socket(ctx, zmq.DEALER, keys=admin if i < 3 else cl.attack["stranger"])
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.SNDHWM, 4)
            s.setsockopt(zmq.RCVHWM, 1)
            s.connect(cl.endpoint)
            socks.append(s)
        rng = random.Random(11)
        payloads = [p for p in _flood_payloads(rng)
                    if b"submit" not in p[0][:64]]      # admin's submits would be real jobs
        c = cl.attack["client"]
        lat, _ = flood(socks, lambda i: rng.choice(payloads),
                       lambda: c.status(cl.attack["job"]), seconds=4, limit=3000)
        assert len(lat) >= 5 and statistics.median(lat) < 1.0, lat
    finally:
        ctx.destroy(0)


def _executors(cl) -> list[tuple[int, str]]:
    """(pid, endpoint) of every socket an executor listens on (its PS shard)."""
    others = {p.pid for p in cl.procs}
    return [(pid, ep) for pid, ep in _listening(cl) if pid not in others]


def _rss(pid: int) -> int:
    return psutil.Process(pid).memory_info().rss


def _blk(mid: str, bid: int, block: np.ndarray, **extra) -> list[bytes]:
    """One whole block (keys and rows arrays) as a first chunk (array 0)."""
    head = msgpack.packb({"id": bid, "arrays": [["keys", "<i8", [len(block)]],
                                                ["rows", "<f4", [len(block), 1]]]})
    data = block.astype("<i8").tobytes()
    return [M.encode("blk", mid=mid, sec="model", bid=bid, arr=0, narr=2, off=0,
                     size=len(data), h=chunk_digest(data), head=head, **extra), data]


def probe_moved_blocks_from_any_key(cl):
    """A block named as the job's own move (mv:JOB:...), for keys the shard
    holds, from a reader, a client and a worker key and in plain text (and
    with a guessed tag): refused by every shard (the keys' CurveZMQ peers do
    not complete a handshake with a sealed shard, plain text is answered
    with a refusal); ten 8 MiB chunks from each grow no executor by
    100 MiB; the job goes on (the snapshot checks its failures)."""
    job = cl.attack["job"]
    shards = _executors(cl)
    assert len(shards) >= 2, shards
    rss0 = {pid: _rss(pid) for pid, _ in shards}
    big = np.zeros(MiB, np.int64)                 # 8 MiB: the first of two arrays
    for keys in (_keys(cl, "reader", "reader"), _keys(cl, "client", "admin"),
                 _keys(cl, "worker", "m1"), None):
        for _, ep in shards:
            for blk in (_blk(f"mv:{job}:1:0", 0, np.arange(4)),
                        _blk(f"mv:{job}:1:0", 0, np.arange(4), tag=f"{job}:1:")):
                r = _send(ep, blk, keys, 3000)
                if keys is None:
                    _sealed_refusal(r, job, "not a sealed")
                else:
                    assert r is None, (ep, r)
            for i in range(10):
                _send(ep, _blk(f"mv:{job}:2:{i}", i, big), keys, 200)
    for pid, _ in shards:
        assert _rss(pid) - rss0[pid] < 100 * MiB, f"executor {pid} grew " \
            f"{(_rss(pid) - rss0[pid]) / MiB:.0f} MiB"


def probe_data_service_bombs_and_paths(cl, tmp_path_factory=None):
    """At each daemon's data service, from a worker and a client key: a
    9 MB payload header, 8 MiB arrays announced in a block of 1,000,
    replicas and reads naming ../ and absolute paths. All refused; no
    directory appears outside the state directories; no daemon grows by
    100 MiB."""
    c, job = cl.attack["client"], cl.attack["job"]
    places = c.log_sources(job)
    assert len(places) == 2, places
    daemons = {p.pid: p for p in cl.procs[1:]}
    rss0 = {pid: _rss(pid) for pid in daemons}
    outside = os.path.join(os.path.dirname(cl.state_dir), "escaped")
    data = os.urandom(1024)
    for keys in (_keys(cl, "worker", "m1"), _keys(cl, "client", "admin")):
        for _, ep in places:
            r = _send(ep, [M.encode("blk", mid="rep:x", sec="model", bid=0, arr=0, narr=1,
                                    off=0, size=4, h=chunk_digest(b"1234"),
                                    head=b"\x90" * (8 << 20)), b"1234"], keys, 3000)
            assert r is not None and r.type == "error", r
            head = msgpack.packb({"id": 0, "arrays": [[f"a{i}", "<u1", [8 << 20]]
                                                      for i in range(64)]})
            piece = os.urandom(4096)
            r = _send(ep, [M.encode("blk", mid="rep:y", sec="model", bid=0, arr=0, narr=1000,
                                    off=0, size=8 << 20, h=chunk_digest(piece), head=head),
                           piece], keys, 3000)
            assert r is not None and r.type == "blk_ack" and not r["ok"], r
            for bad in ("../../../escaped", outside, "a/../../b", ".."):
                s = _dealer(ep, keys)
                try:
                    s.send_multipart([M.encode("blk", mid="rep:z", sec="model", bid=0, arr=0,
                                               narr=1, off=0, size=len(data),
                                               h=chunk_digest(data),
                                               head=msgpack.packb({"raw": True})), data])
                    assert s.poll(3000)
                    assert M.decode(s.recv_multipart())["ok"]
                    s.send(M.encode("blk_end", mid="rep:z", count=1, meta={
                        "job": bad, "epoch": 1, "index": 0, "iteration": 0}))
                    assert s.poll(3000)
                    r = M.decode(s.recv_multipart())
                    assert r.type in ("blk_done", "error") and not r.get("ok"), r
                    assert "bad job id" in str(r.fields), r.fields
                finally:
                    s.close(0)
                r = _send(ep, M.encode("ckpt_manifest", job=bad, epoch=1, index=0), keys, 3000)
                assert r is not None and r.type == "error" and "bad job id" in r["message"], r
    assert not os.path.exists(outside), "a replica was written outside the state dir"
    for pid in daemons:
        assert _rss(pid) - rss0[pid] < 100 * MiB, \
            f"daemon {pid} grew {(_rss(pid) - rss0[pid]) / MiB:.0f} MiB"


def _dealer(endpoint: str, keys: security.Keys) -> zmq.Socket:
    s = make_socket(_CTX, zmq.DEALER, keys=keys)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.SNDTIMEO, 3000)
    s.connect(endpoint)
    return s


_CTX = zmq.Context.instance()


# -- every message type at every socket, from every role: a table ------------------------------
#: Who may send each message type to each socket: (master, a daemon's executor
#: socket, a daemon's data service, a PS shard). C client, R reader, W worker
#: keys; O only the executors of the daemon's own machine (its worker key); T
#: nobody without the job attempt's secret (a shard's data plane is sealed
#: under a key derived from it: no CurveZMQ key completes a handshake there,
#: tests/test_sealed.py has the rest); - nobody. A
#: message type without a row fails ``test_every_message_type_has_a_rule``.
RULES = {
    'abort': ('-', '-', '-', '-'),
    'ack': ('-', '-', '-', '-'),
    'alpha_state': ('-', 'O', '-', '-'),
    'at_boundary': ('W', '-', '-', '-'),
    'barrier': ('W', '-', '-', '-'),
    'blk': ('-', '-', 'WC', 'T'),
    'blk_ack': ('-', '-', '-', '-'),
    'blk_done': ('-', '-', '-', '-'),
    'blk_end': ('-', '-', 'WC', '-'),
    'cancel': ('C', '-', '-', '-'),
    'ckpt_fetch': ('-', '-', 'WC', '-'),
    'ckpt_final': ('W', '-', '-', '-'),
    'ckpt_gc': ('-', '-', '-', '-'),
    'ckpt_manifest': ('-', '-', 'WC', '-'),
    'ckpt_part': ('W', '-', '-', '-'),
    'cluster': ('-', '-', '-', '-'),
    'cluster_info': ('CR', '-', '-', '-'),
    'dashboard': ('-', '-', '-', '-'),
    'dashboard_info': ('CR', '-', '-', '-'),
    'data_commit': ('C', '-', '-', '-'),
    'data_copied': ('W', '-', '-', '-'),
    'data_copy': ('-', '-', '-', '-'),
    'data_fetch': ('-', '-', 'WC', '-'),
    'data_gc': ('-', '-', '-', '-'),
    'data_list': ('CR', '-', '-', '-'),
    'data_placement': ('-', '-', '-', '-'),
    'data_plan': ('C', '-', '-', '-'),
    'data_rm': ('C', '-', '-', '-'),
    'datasets': ('-', '-', '-', '-'),
    'enqueue': ('-', '-', '-', '-'),
    'epoch_done': ('W', '-', '-', '-'),
    'epoch_report': ('W', '-', '-', '-'),
    'epoch_sums': ('-', '-', '-', '-'),
    'error': ('-', '-', '-', '-'),
    'exec_exited': ('W', '-', '-', '-'),
    'exec_failed': ('W', '-', '-', '-'),
    'exec_finished': ('W', '-', '-', '-'),
    'exec_paused': ('W', '-', '-', '-'),
    'exec_ready': ('W', '-', '-', '-'),
    'grant': ('-', '-', '-', '-'),
    'hb_ack': ('-', '-', '-', '-'),
    'heartbeat': ('W', '-', '-', '-'),
    'hello': ('-', 'O', '-', '-'),
    'job_start': ('-', '-', '-', '-'),
    'job_status': ('CR', '-', '-', '-'),
    'jobs': ('-', '-', '-', '-'),
    'kill': ('-', '-', '-', '-'),
    'launch': ('-', '-', '-', '-'),
    'leave': ('-', '-', '-', '-'),
    'list_jobs': ('CR', '-', '-', '-'),
    'log_data': ('-', '-', '-', '-'),
    'log_places': ('-', '-', '-', '-'),
    'log_read': ('-', '-', 'CR', '-'),
    'log_sources': ('CR', '-', '-', '-'),
    'manifest': ('-', '-', '-', '-'),
    'mem_query': ('-', 'O', '-', '-'),
    'mem_state': ('-', '-', '-', '-'),
    'migrate': ('-', '-', '-', '-'),
    'migrated': ('W', '-', '-', '-'),
    'migrating': ('W', '-', '-', '-'),
    'model_parts': ('C', '-', '-', '-'),
    'model_source': ('-', '-', '-', '-'),
    'move': ('-', '-', '-', '-'),
    'moved': ('W', '-', '-', '-'),
    'ok': ('-', '-', '-', '-'),
    'pause': ('C', '-', '-', '-'),
    'ping': ('W', '-', '-', '-'),
    'pong': ('-', '-', '-', '-'),
    'preempted': ('-', '-', '-', '-'),
    'ps_error': ('-', '-', '-', '-'),
    'ps_moved': ('-', '-', '-', '-'),
    'pull': ('-', '-', '-', 'T'),
    'push': ('-', '-', '-', 'T'),
    'reconfigured': ('-', '-', '-', '-'),
    'register': ('W', '-', '-', '-'),
    'registered': ('-', '-', '-', '-'),
    'release': ('-', '-', '-', '-'),
    'resize': ('C', '-', '-', '-'),
    'resume': ('C', '-', '-', '-'),
    'rows': ('-', '-', '-', '-'),
    'status': ('-', '-', '-', '-'),
    'sub_done': ('-', 'O', '-', '-'),
    'submit': ('C', '-', '-', '-'),
    'submitted': ('-', '-', '-', '-'),
    'sync': ('W', 'O', '-', '-'),
    # the synchronizer off the master: plans come from the master only; an
    # lsync reaches a daemon's sync socket (probed as a "daemon" socket, with
    # the executors' one) and is taken only from the machine it names, for a
    # job that machine's plan has; a leader's verdict goes to the master
    'sync_plan': ('-', '-', '-', '-'),
    'lsync': ('-', '-', '-', '-'),
    'sync_failed': ('W', '-', '-', '-'),
}
SOCKETS = ("master", "daemon", "data", "shard")
ROLE_OF = {"C": "client", "R": "reader", "W": "worker"}
#: what a refusal looks like, per socket: an error (forbidden, unexpected, a
#: bad message), a shard's ps_error or refused block, or no answer at all
REFUSED = {"error", "ps_error", "blk_ack", "blk_done", "abort", None}


def test_every_message_type_has_a_rule():
    assert set(RULES) == set(M.SCHEMAS), (
        f"message types without a rule: {sorted(set(M.SCHEMAS) - set(RULES))}; "
        f"rules for no type: {sorted(set(RULES) - set(M.SCHEMAS))}")
    assert all(len(r) == len(SOCKETS) for r in RULES.values())


def _minimal(mtype: str) -> bytes:
    """The smallest message of ``mtype`` its schema accepts (fake ids)."""
    fill = {str: "job-9999", int: 0, float: 0.0, bool: False, bytes: b"", list: [], dict: {}}
    fields = {}
    for name, spec in M.SCHEMAS[mtype].items():
        if isinstance(spec, tuple) and len(spec) == 2 and not isinstance(spec[1], type):
            continue                                  # optional
        typ = spec[0] if isinstance(spec, tuple) else spec
        fields[name] = fill[typ]
    return M.encode(mtype, **fields)


class _Refusals:
    """One connection that sends every message of ``types`` to a socket that
    must refuse them all; ``bad``: the answers that were not a refusal.
    ``silent``: a socket that ignores every one of them: any answer is a
    failure.

    All messages are sent first, then the answers read (:func:`_refusals`,
    every connection at once). A server reads one connection's messages in
    order and answers each at most once, so a connection is done when it has
    an answer for every message sent, or none came for ``wait_ms``
    (``silent``: 1 s) after its last send or answer (a socket that drops
    what it refuses: a probe that waited ``wait_ms`` for each message's
    answer in turn sees no answer this one misses), or its monitor says the
    handshake failed (nothing was read: :func:`_no_handshake`)."""

    def __init__(self, what: str, endpoint: str, keys, types: list[str],
                 silent: bool = False, wait_ms: int = 2000) -> None:
        self.what, self.types, self.silent = what, types, silent
        self.quiet = (1000 if silent else wait_ms) / 1000
        self.sock = make_socket(_CTX, zmq.DEALER, keys=keys)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RECONNECT_IVL, RECONNECT_MS)
        self.watch = Watch(self.sock)
        self.sock.connect(endpoint)
        self.bad: list[str] = []
        self.sent = self.got = 0
        self.done = False
        self.until = 0.0

    def send(self) -> None:
        for t in self.types:
            if not self._send(_minimal(t)):
                self.done = True              # nothing was read
                return
            self.sent += 1
        self.until = time.monotonic() + self.quiet

    def _send(self, frame: bytes, timeout_s: float = 3.0) -> bool:
        """Queue ``frame`` within ``timeout_s``; False: the handshake failed
        (no peer to queue it for: libzmq drops a connection's queue when its
        handshake fails) or never completed."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.sock.send(frame, zmq.NOBLOCK)
                return True
            except zmq.Again:
                if _no_handshake(self.watch) or time.monotonic() >= deadline:
                    return False
                self.watch.mon.poll(10)

    def read(self) -> None:
        while not self.done:
            try:
                r = M.decode(self.sock.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                return
            self.got, self.until = self.got + 1, time.monotonic() + self.quiet
            if self.silent:
                self.bad.append(f"an answer: {r.fields}")
            elif r.type not in REFUSED or r.get("ok"):
                self.bad.append(f"{r.type} {r.fields} (answer {self.got} to "
                                f"{self.sent} sent)")
            self.done = not self.silent and self.got >= self.sent

    def close(self) -> None:
        self.watch.close()
        self.sock.close(0)


def _refusals(conns: list[_Refusals]) -> list[str]:
    """Send on every connection, then read all their answers at once
    (:class:`_Refusals`); what each answered that was not a refusal."""
    try:
        for c in conns:
            c.send()
        poller = zmq.Poller()
        for c in conns:
            if not c.done:
                poller.register(c.sock, zmq.POLLIN)
                poller.register(c.watch.mon, zmq.POLLIN)
        live = [c for c in conns if not c.done]
        while live:
            now = time.monotonic()
            for c in live:
                c.read()
                if not c.done and (now >= c.until or _no_handshake(c.watch)):
                    c.done = True
                if c.done:
                    poller.unregister(c.sock)
                    poller.unregister(c.watch.mon)
            live = [c for c in live if not c.done]
            if live:
                wait = min(c.until for c in live) - time.monotonic()
                poller.poll(max(1, int(wait * 1000)))
        return [f"{c.what}: {b}" for c in conns for b in c.bad]
    finally:
        for c in conns:
            c.close()


def probe_every_message_type_from_every_role(cl):
    """Every message type at every socket (the master, both daemons'
    executor sockets and data services, both PS shards) from a client, a
    reader and a worker key (m1's: at m0's daemon it is another machine's):
    refused wherever RULES does not allow that role; no process grows by
    100 MiB."""
    c, job = cl.attack["client"], cl.attack["job"]
    data = dict(c.log_sources(job))                       # machine -> data endpoint
    daemons = {p.pid: p.args for p in cl.procs[1:]}
    daemon_eps = [(pid, ep) for pid, ep in _listening(cl) if pid in daemons
                  and ep not in data.values()]
    shards = _executors(cl)
    procs = [p.pid for p in cl.procs] + [pid for pid, _ in shards]
    rss0 = {pid: _rss(pid) for pid in procs}
    keys = {"client": _keys(cl, "client", "admin"), "reader": _keys(cl, "reader", "reader"),
            "worker": _keys(cl, "worker", "m1")}
    targets = [("master", cl.endpoint)] + [("data", ep) for ep in data.values()] + \
        [("shard", ep) for _, ep in shards] + [("daemon", ep) for _, ep in daemon_eps]
    m1_daemon = {ep for pid, ep in daemon_eps if "m1" in daemons[pid]}
    # each daemon: its executors' socket and its synchronizer's
    assert len(targets) == 1 + 2 + 2 + 2 * 2, targets
    conns = []
    for sock, ep in targets:
        col = SOCKETS.index(sock)
        for role, k in keys.items():
            own = sock == "daemon" and role == "worker" and ep in m1_daemon
            deny = [t for t, r in RULES.items()
                    if not any(ROLE_OF.get(x) == role or (own and x == "O") for x in r[col])]
            # a daemon hears only its own machine's executors: m1's key at m0's
            # daemon (and any client or reader key) gets no answer at all
            silent = sock == "daemon" and not own
            conns.append(_Refusals(f"{sock} {ep} {role}", ep, k, deny, silent))
    bad = _refusals(conns)          # every connection's answers at once
    assert not bad, bad
    for pid in procs:
        assert _rss(pid) - rss0[pid] < 100 * MiB, f"{pid} grew {(_rss(pid) - rss0[pid]) / MiB:.0f} MiB"


PROBES = [probe_stranger_keys_at_the_master, probe_plain_text_at_the_master,
          probe_reader_and_worker_keys_beyond_their_role, probe_forged_executor_messages,
          probe_every_listening_socket, probe_wrong_shard_tag_from_a_cluster_key,
          probe_heartbeat_bombs, probe_submit_bombs, probe_flood,
          probe_moved_blocks_from_any_key, probe_data_service_bombs_and_paths,
          probe_every_message_type_from_every_role]


@pytest.mark.parametrize("probe", PROBES, ids=[p.__name__[6:] for p in PROBES])
def test_probe_changes_nothing(target, probe):
    before = _snapshot(target)
    probe(target)
    time.sleep(0.3)          # let anything the probe set off reach the tables
    _unchanged(target, before, probe.__name__)
    peak = target.attack["master"].memory_info().rss
    assert peak - target.attack["rss0"] < 100 * MiB, \
        f"master RSS grew {(peak - target.attack['rss0']) / MiB:.0f} MiB"


def test_the_victim_job_finishes_undisturbed(target):
    """After every probe the job ends as an undisturbed run does: all its
    epochs, no failure, the toy's exact objective."""
    c, job = target.attack["client"], target.attack["job"]
    c.cancel(job)                     # not a fault: a user's own action ends it early
    st = wait_state(c, job, ("cancelled", "failed", "finished"))
    assert st["state"] == "cancelled" and st["failures"] == 0, st
    obj = np.array([e["metrics"]["objective"] for e in st["epochs"]])
    assert len(obj) >= 10, st
    steps = np.diff(obj)              # the toy adds the same amount every epoch
    # the objective is a float32 sum: past 2**19 its steps are whole
    # multiples of 1/32 (the probes ran longer as sockets were added: seen)
    ulp = float(np.spacing(np.float32(np.abs(obj).max())))
    assert np.allclose(steps, np.median(steps), rtol=1e-3, atol=4 * ulp), \
        "an update was lost or doubled"
