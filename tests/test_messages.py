import logging
import math
import os
import tempfile

# hypothesis keeps a cache of constants it found: outside the work tree
os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY",
                      os.path.join(tempfile.gettempdir(), "harmony-hypothesis"))

import msgpack  # noqa: E402
import numpy as np
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harmony.comm import messages as M
from harmony.master.jobdb import JobTableError, check_lmdb_file
from harmony.master.jobs import Job
from harmony.ps.server import PS_LIMITS, ShardServer, ShardTable
from harmony.store.transfer import Assembler, TransferError, chunk_digest

# Fuzzing: a fixed seed (derandomize) and a bounded number of examples per
# property in the default run; HYPOTHESIS_PROFILE=harmony-long for more.
settings.register_profile("harmony", max_examples=200, derandomize=True, deadline=None,
                          database=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow,
                                                 HealthCheck.data_too_large])
settings.register_profile("harmony-long", parent=settings.get_profile("harmony"),
                          max_examples=5000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "harmony"))

ALL_LIMITS = [M.DEFAULT_LIMITS, M.MASTER_LIMITS, PS_LIMITS]


def test_roundtrip_with_frames():
    head = M.encode("barrier", job="job-0001", index=1, epoch=2, iter=0)
    msg = M.decode([head, b"\x00" * 8])
    assert msg.type == "barrier" and msg["epoch"] == 2 and msg.frames == [b"\x00" * 8]


def test_optional_field_may_be_omitted():
    msg = M.decode([M.encode("submit", app_name="a.py", app_source="", args=[], machines=1)])
    assert msg.get("name") is None


@pytest.mark.parametrize("frames, text", [
    ([], "empty"),
    ([b"\xc1garbage"], "undecodable"),
    ([msgpack.packb([1, 2])], "not a map"),
    ([msgpack.packb({"t": "no_such"})], "unknown message type"),
    ([msgpack.packb({"t": "cancel"})], "missing field 'job'"),
    ([msgpack.packb({"t": "cancel", "job": 7})], "must be str"),
    ([msgpack.packb({"t": "submit", "app_name": "a", "app_source": "", "args": [],
                     "machines": True})], "must be int, got bool"),
    ([msgpack.packb({"t": "cancel", "job": "j", "evil": 1})], "unknown field"),
    ([b"x"] * (M.MAX_FRAMES + 1), "too many frames"),
])
def test_malformed_messages_are_rejected_clearly(frames, text):
    with pytest.raises(M.ProtocolError, match=text):
        M.decode(frames)


def test_oversized_header_rejected():
    big = msgpack.packb({"t": "cancel", "job": "x" * (M.MAX_HEADER_BYTES + 1)})
    with pytest.raises(M.ProtocolError, match="too large"):
        M.decode([big])


def test_sender_side_validation():
    with pytest.raises(M.ProtocolError):
        M.encode("cancel")


# -- limits, each before or while decoding ----------------------------------------------
def _cancel(**extra) -> bytes:
    return msgpack.packb({"t": "cancel", "job": "j", **extra}, use_bin_type=True)


@pytest.mark.parametrize("frames, limits, text", [
    # counted before a byte is decoded
    ([b"x"] * 5, M.Limits(max_bytes=100, max_header=100, max_frames=4), "too many frames"),
    ([_cancel(), b"x" * 100], M.Limits(max_bytes=100, max_header=100), "message too large"),
    ([_cancel(), b"y" * 3, b"z" * 3], M.Limits(max_bytes=20, max_header=100),
     "message too large"),
    ([_cancel(pad="x" * 200)], M.Limits(max_bytes=10_000, max_header=100), "header too large"),
    # msgpack's own caps: declared sizes are refused before anything is allocated
    ([b"\xdd\xff\xff\xff\xff"], M.MASTER_LIMITS, "exceeds max_array_len"),
    ([b"\xdf\xff\xff\xff\xff"], M.MASTER_LIMITS, "exceeds max_map_len"),
    ([b"\xdb\xff\xff\xff\xff" + b"x" * 10], M.MASTER_LIMITS, "undecodable"),
    ([b"\xc6\xff\xff\xff\xff" + b"x" * 10], M.MASTER_LIMITS, "undecodable"),
    ([_cancel(x="s" * 2000)], M.Limits(max_bytes=1 << 20, max_header=1 << 20, max_str=1000),
     "exceeds max_str_len"),
    ([_cancel(x=b"b" * 2000)], M.Limits(max_bytes=1 << 20, max_header=1 << 20, max_bin=1000),
     "exceeds max_bin_len"),
    ([_cancel(x=list(range(2000)))], M.Limits(max_bytes=1 << 20, max_header=1 << 20,
                                              max_array=1000), "exceeds max_array_len"),
    ([msgpack.packb({"t": "cancel", "job": "j", "x": msgpack.ExtType(1, b"x")})],
     M.MASTER_LIMITS, "exceeds max_ext_len"),
    ([_cancel(x=[[] for _ in range(1000)])], M.Limits(max_bytes=1 << 20, max_header=1 << 20,
                                                      max_objects=500), "too many values"),
    ([_cancel(x=[{} for _ in range(1000)])], M.Limits(max_bytes=1 << 20, max_header=1 << 20,
                                                      max_objects=500), "too many values"),
    # nesting: past msgpack's own stack, and past the limit
    ([b"\x81\xa1t\xa6cancel" + b"\x91" * 5000 + b"\xc0"], M.MASTER_LIMITS, "undecodable"),
    ([_cancel(x=[[[[[[[[]]]]]]]])], M.Limits(max_bytes=1000, max_header=1000, max_depth=4),
     "nests deeper than 4"),
    # per-field string caps
    ([_cancel(job="j" * (M.MAX_FIELD_STR + 1))], M.MASTER_LIMITS, "characters long"),
])
def test_each_limit(frames, limits, text):
    with pytest.raises(M.ProtocolError, match=text):
        M.decode(frames, limits)


def test_limits_let_legitimate_messages_through():
    # the largest app source the master accepts, and a data set's largest record
    src = "x = 1\n" * (M.MAX_APP_SOURCE // 6)
    M.decode([M.encode("submit", app_name="a.py", app_source=src, args=["--x"] * 100,
                       machines=4)], M.MASTER_LIMITS)
    chunks = [{"i": i, "first_line": i * 1000, "sha": os.urandom(32), "size": 4 << 20,
               "holders": ["worker-17", "worker-42"]} for i in range(M.MAX_DATA_CHUNKS)]
    msg = M.decode([M.encode("data_commit", name="ratings", filename="ratings.txt",
                             size=1 << 36, chunks=chunks)], M.MASTER_LIMITS)
    assert len(msg["chunks"]) == M.MAX_DATA_CHUNKS
    # containers nested exactly as deep as the limit (header map, sums map, lists)
    deep: list = []
    for _ in range(M.MASTER_LIMITS.max_depth - 3):
        deep = [deep]
    M.decode([msgpack.packb({"t": "epoch_done", "job": "j", "index": 0, "epoch": 0,
                             "sums": {"x": deep}, "timings": {}})], M.MASTER_LIMITS)
    with pytest.raises(M.ProtocolError, match="nests deeper"):
        M.decode([msgpack.packb({"t": "epoch_done", "job": "j", "index": 0, "epoch": 0,
                                 "sums": {"x": [deep]}, "timings": {}})], M.MASTER_LIMITS)


def test_error_texts_stay_short_whatever_the_message():
    for raw in (msgpack.packb({"t": "x" * 1_000_000}),
                msgpack.packb({"t": "cancel", "job": "j", **{"k" * 5000 + str(i): 1
                                                             for i in range(100)}}),
                msgpack.packb({"t": "cancel", "job": "j" * 2_000_000})):
        with pytest.raises(M.ProtocolError) as ei:
            M.decode([raw], M.MASTER_LIMITS)
        assert len(str(ei.value)) < 400


def test_zmq_frames_are_decoded_without_copy():
    ctx = zmq.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    try:
        a.bind("inproc://m")
        b.connect("inproc://m")
        a.send_multipart([M.encode("pull", rid=1, n=2, tag="t"), np.arange(2)])
        msg = M.decode(b.recv_multipart(copy=False), PS_LIMITS)
        assert msg.type == "pull" and len(msg.frames) == 1
    finally:
        a.close(0)
        b.close(0)
        ctx.term()


def test_heartbeat_tasks_are_checked_and_bounded():
    """The task stream's entries (a heartbeat's ``tasks``): [start, end, job,
    kind] in seconds before the heartbeat; malformed ones are dropped and at
    most MAX_TASKS kept, whatever a daemon sends."""
    good = [[2.0, 1.5, "job-0001", "cpu"], [1, 0, "job-0002", "net"]]
    assert M.clean_tasks(good) == [(2.0, 1.5, "job-0001", "cpu"), (1.0, 0.0, "job-0002", "net")]
    bad = [[1.0, 2.0, "j", "cpu"],          # ends before it starts
           [-1.0, -2.0, "j", "cpu"], [1.0, 0.5, "j", "disk"], [1.0, 0.5, "", "cpu"],
           [1.0, 0.5, "j" * 129, "cpu"], [math.nan, 0.5, "j", "cpu"], [True, 0, "j", "cpu"],
           [1.0, 0.5, 3, "cpu"], [1.0, 0.5, "j"], "x", None, [7200.0, 1.0, "j", "net"]]
    assert M.clean_tasks(bad + good) == M.clean_tasks(good)
    assert M.clean_tasks({"a": 1}) == [] and M.clean_tasks(None) == []
    many = [[1.0, 0.5, "j", "cpu"]] * (M.MAX_TASKS + 50)
    assert len(M.clean_tasks(many)) == M.MAX_TASKS
    # the schema takes the field, and an ack that asks for it
    M.decode([M.encode("heartbeat", name="m0", executors=[], tasks=good)])
    assert M.decode([M.encode("hb_ack", tasks=True)])["tasks"] is True


def test_heartbeat_stats_schema():
    ok = {"t": 1.0, "dt": 1.0, "cpu": 0.5, "mem": 0.25, "q_cpu": 0, "q_net": 0.1, "net": 1}
    assert M.clean_stats(ok) == {k: float(v) for k, v in ok.items()}
    assert M.clean_stats({**ok, "future_key": "x"}) == M.clean_stats(ok)   # dropped
    assert M.clean_stats({**ok, "cpu": "lots"}) is None
    assert M.clean_stats({**ok, "cpu": True}) is None
    assert M.clean_stats({**ok, "cpu": math.nan}) is None
    assert M.clean_stats({**ok, "mem": math.inf}) is None
    assert M.clean_stats({**ok, "cpu": 10 ** 30}) is None
    assert M.clean_stats({str(i): 1 for i in range(M.MAX_STATS_ENTRIES + 1)}) is None
    assert M.clean_stats([1, 2]) is None
    # the queues' counters: known, finite and not negative
    q = {"qg_cpu": 3, "qw_cpu": 0.5, "qd_cpu": 2, "qr_cpu": 1.25,
         "qg_net": 0, "qw_net": 0.0, "qd_net": 0, "qr_net": 0.0}
    assert set(q) == M.COUNTER_KEYS
    assert M.clean_stats({**ok, **q}) == {k: float(v) for k, v in {**ok, **q}.items()}
    assert M.clean_stats({**ok, "qw_net": -0.1}) is None
    assert M.clean_stats({**ok, "qg_cpu": math.inf}) is None
    assert M.clean_stats({**ok, "q_cpu": -0.1}) is not None      # not a counter
    # a machine's NIC bytes of the interval (no emulated links): kept, not negative
    nic = {"net_sent": 1.5e6, "net_recv": 2e3}
    assert M.clean_stats({**ok, **nic}) == {k: float(v) for k, v in {**ok, **nic}.items()}
    assert M.clean_stats({**ok, "net_recv": -1.0}) is None


# -- property-based fuzzing of every decoder ----------------------------------------------
scalars = (st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1)
           | st.floats(allow_nan=False) | st.text(max_size=20) | st.binary(max_size=20))
values = st.recursive(scalars, lambda c: st.lists(c, max_size=5)
                      | st.dictionaries(st.text(max_size=8), c, max_size=5), max_leaves=25)


def _field(spec):
    optional = isinstance(spec, tuple) and len(spec) == 2 and spec[1] is M._OPT
    typ = spec[0] if optional else spec
    types = typ if isinstance(typ, tuple) else (typ,)
    parts = []
    for t in types:
        parts.append({int: st.integers(-2**63, 2**63 - 1), float: st.floats(allow_nan=False),
                      str: st.text(max_size=40), bytes: st.binary(max_size=40),
                      bool: st.booleans(), list: st.lists(values, max_size=6),
                      dict: st.dictionaries(st.text(max_size=10), values, max_size=6)}[t])
    s = st.one_of(*parts)
    return (st.none() | s) if optional else s


@st.composite
def valid_messages(draw):
    mtype = draw(st.sampled_from(sorted(M.SCHEMAS)))
    fields = {name: draw(_field(spec)) for name, spec in M.SCHEMAS[mtype].items()}
    return mtype, fields


@given(valid_messages())
def test_every_message_type_round_trips(m):
    mtype, fields = m
    msg = M.decode([M.encode(mtype, **fields)])
    assert msg.type == mtype
    assert msg.fields == {k: v for k, v in fields.items() if v is not None}
    for limits in ALL_LIMITS:          # a receiver's tighter limits refuse, never crash
        try:
            M.decode([M.encode(mtype, **fields)], limits)
        except M.ProtocolError:
            pass


def _decodes_or_refuses(frames, limits=M.DEFAULT_LIMITS):
    try:
        msg = M.decode(frames, limits)
    except M.ProtocolError as exc:
        assert len(str(exc)) < 1000
        return None
    # what gets through satisfies its schema: it encodes again
    M.encode(msg.type, **msg.fields)
    return msg


@given(st.lists(st.binary(max_size=300), min_size=0, max_size=20),
       st.sampled_from(ALL_LIMITS))
def test_arbitrary_frames_are_refused_or_valid(frames, limits):
    _decodes_or_refuses(frames, limits)


@given(st.one_of(st.sampled_from(sorted(M.SCHEMAS)), st.text(max_size=12), values),
       st.dictionaries(st.sampled_from(["job", "index", "epoch", "rid", "n", "name",
                                        "stats", "args", "machines", "app_source", "x"])
                       | st.text(max_size=6), values, max_size=8),
       st.sampled_from(ALL_LIMITS))
def test_arbitrary_maps_are_refused_or_valid(mtype, fields, limits):
    raw = msgpack.packb({"t": mtype, **fields}, use_bin_type=True)
    _decodes_or_refuses([raw], limits)


@given(valid_messages(), st.data())
def test_mutated_messages_are_refused_or_valid(m, data):
    raw = bytearray(M.encode(m[0], **m[1]))
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        i = data.draw(st.integers(0, max(0, len(raw) - 1)))
        if op == "flip" and raw:
            raw[i] ^= data.draw(st.integers(1, 255))
        elif op == "insert":
            raw[i:i] = data.draw(st.binary(min_size=1, max_size=8))
        elif op == "delete" and raw:
            del raw[i]
        elif op == "truncate":
            del raw[i:]
    _decodes_or_refuses([bytes(raw)], data.draw(st.sampled_from(ALL_LIMITS)))


@given(st.one_of(values, st.dictionaries(st.sampled_from(sorted(M.STATS_KEYS))
                                         | st.text(max_size=5),
                                         scalars | st.floats(), max_size=40)))
def test_heartbeat_stats_are_cleaned_or_refused(stats):
    out = M.clean_stats(stats)
    if out is not None:
        assert set(out) <= M.STATS_KEYS
        assert all(isinstance(v, float) and math.isfinite(v) for v in out.values())


@pytest.fixture(scope="module")
def shard():
    ctx = zmq.Context()
    table = ShardTable(2, "float32", None)
    table.load(np.arange(0, 64, 2), np.zeros((32, 2), np.float32))
    srv = ShardServer(ctx, "127.0.0.1", table, tag="job-1:1")   # not started: _handle
    yield srv
    srv.sock.close(0)
    ctx.term()


@given(st.sampled_from(["pull", "push", "blk", "rows", "cancel"]), st.integers(-5, 40),
       st.integers(0, 4), st.sampled_from(["job-1:1", "job-1:2", ""]),
       st.lists(st.binary(max_size=400), max_size=3), st.data())
def test_shard_requests_are_served_or_refused(shard, mtype, n, dim, tag, frames, data):
    """Whatever arrives, a shard answers with its rows, an ack, or a clear
    error (ProtocolError / ValueError / KeyError / TransferError), and a
    refused push changes nothing."""
    if mtype == "pull":
        head = M.encode("pull", rid=1, n=n, tag=tag)
    elif mtype == "push":
        head = M.encode("push", rid=1, n=n, dim=dim, tag=tag)
    elif mtype == "blk":
        head = M.encode("blk", mid=data.draw(st.sampled_from(["mv:job-1:1", "x"])), sec="model",
                        bid=data.draw(st.integers(-1, 3)), arr=0, narr=1, off=0,
                        size=data.draw(st.integers(-1, 500)), h=data.draw(st.integers(0, 5)),
                        head=data.draw(st.none() | st.binary(max_size=30)))
    else:
        head = M.encode(mtype, **({"rid": 1, "n": 1, "dim": 2} if mtype == "rows"
                                  else {"job": "j"}))
    if data.draw(st.booleans()) and frames:     # well-formed keys where it matters
        keys = np.array(data.draw(st.lists(st.integers(0, 70), max_size=8)), np.int64)
        frames = [keys.tobytes(), os.urandom(len(keys) * 8)] + frames[2:]
    shard.table.load(np.arange(0, 64, 2), np.zeros((32, 2), np.float32))
    shard._asm = Assembler()
    before = shard.table.rows.copy()
    try:
        reply, _ = shard._handle(b"peer", [head, *frames])
    except (M.ProtocolError, ValueError, KeyError, TransferError):
        assert np.array_equal(shard.table.rows, before, equal_nan=True)
        return
    if reply is not None:
        out = M.decode(reply[:1], PS_LIMITS)
        assert out.type in ("rows", "ack", "ps_moved")


@given(st.binary(max_size=9000), st.integers(0, 20000))
def test_lmdb_meta_parser_refuses_or_accepts_any_file(tmp_path_factory, data, size):
    path = tmp_path_factory.getbasetemp() / "fuzz-data.mdb"
    with open(path, "wb") as fh:
        fh.write(data)
        fh.truncate(max(len(data), size) if size % 3 else len(data))
    try:
        meta = check_lmdb_file(str(path))
    except JobTableError:
        return
    assert meta["size"] >= (meta["last_pg"] + 1) * meta["psize"]


@given(st.dictionaries(st.sampled_from(["id", "app_name", "app_source", "args", "machines",
                                        "state", "attempt", "launches", "events", "epochs",
                                        "resume", "x"]),
                       values | st.sampled_from(["waiting", "running", "failed"]), max_size=12))
def test_damaged_job_records_are_refused_or_valid(rec):
    try:
        job = Job.from_record(rec)
    except (TypeError, ValueError, KeyError):
        return
    Job.from_record(job.to_record())
    assert isinstance(job.args, list) and isinstance(job.id, str)


@given(st.integers(0, 3), st.integers(-1, 3), st.integers(-2, 40), st.integers(-2, 40),
       st.binary(max_size=40), st.booleans(), st.none() | st.binary(max_size=40))
def test_block_chunks_are_assembled_or_refused(arr, narr, off, size, chunk, good_digest, head):
    asm = Assembler(max_bytes=1 << 16)
    if good_digest and head is not None and len(head) % 2:
        head = msgpack.packb({"id": 1, "arrays": [["a", "<u1", [len(chunk)]]]})
    msg = M.decode([M.encode("blk", mid="m", sec="input", bid=0, arr=arr, narr=narr, off=off,
                             size=size, h=chunk_digest(chunk) if good_digest else 1,
                             head=head), chunk])
    try:
        asm.add(msg)
    except TransferError:
        pass
    assert asm.held <= asm.max_bytes


def test_the_master_dispatcher_survives_any_message(tmp_path, caplog):
    """Fuzzed messages of every type from strangers, through the master's
    dispatcher (decode, schema, handler): nothing escapes it."""
    from harmony.master.server import Master
    m = Master(str(tmp_path / "m"), port=0)
    m._send = lambda ident, payload: True
    m._admit = lambda cmd: None
    try:
        @settings(max_examples=200)
        @given(st.one_of(valid_messages().map(lambda x: [M.encode(x[0], **x[1])]),
                         st.lists(st.binary(max_size=200), max_size=3)))
        def dispatch(body):
            m._dispatch([b"stranger", *body])
        with caplog.at_level(logging.ERROR, logger="harmony.master"):
            dispatch()
        crashed = [r.getMessage() for r in caplog.records if r.getMessage().startswith(
            "error handling")]
        assert not crashed, f"handlers raised on fuzzed input: {crashed[:5]}"
    finally:
        m.close()
