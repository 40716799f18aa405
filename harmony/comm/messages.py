"""Every control message of Harmony, defined once and validated where received.

Wire format: a control message is one msgpack map ``{"t": TYPE, ...fields}``
in the first frame, optionally followed by raw binary frames (numpy buffers,
see :mod:`harmony.comm.arrays`). No pickle anywhere: every limit of a
:class:`Limits` (frame count, total bytes over all frames, header bytes) is
checked before a byte is decoded; msgpack then decodes with explicit caps on
string, binary, array and map sizes (no ext types), the nesting depth is
bounded, and every field is type-checked against the schema below before a
handler sees it. Strings are capped per field (64 KiB unless named in
``_STR_CAPS``). Errors name what was wrong in bounded text: a hostile message
never makes a reply or a log line larger than a few hundred bytes.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Any

import msgpack

KiB, MiB = 1 << 10, 1 << 20


@dataclass(frozen=True)
class Limits:
    """What one receiver accepts in one message. ``max_bytes`` counts every
    frame (header and raw frames); the container caps are per container."""
    max_bytes: int
    max_header: int
    max_frames: int = 16
    max_str: int = 32 * MiB
    max_bin: int = 16 * MiB
    max_array: int = 1 << 20
    max_map: int = 1 << 16
    max_depth: int = 32
    #: containers and the values in them, all together: what a header may
    #: decode into is bounded by this, not by its bytes (an 8 MiB header of
    #: empty maps would be 8 million dicts, ~0.5 GiB)
    max_objects: int = 4 << 20

    def __post_init__(self) -> None:
        # msgpack's options, built once (decode runs for every message)
        object.__setattr__(self, "unpack_options", dict(
            raw=False, strict_map_key=True, use_list=True, max_str_len=self.max_str,
            max_bin_len=self.max_bin, max_array_len=self.max_array,
            max_map_len=self.max_map, max_ext_len=0))


# Hard limits on what a receiver accepts, by default: replies and commands
# from the master (an app source travels in "launch"; "jobs" and "status"
# replies grow with the job table) and block chunks of at most 8 MiB.
MAX_HEADER_BYTES = 32 * MiB
MAX_FRAMES = 16
DEFAULT_LIMITS = Limits(max_bytes=MAX_HEADER_BYTES + 16 * MiB, max_header=MAX_HEADER_BYTES,
                        max_frames=MAX_FRAMES)
# The master's socket: every message to it is one header, the largest a
# submit with an app source of at most MAX_APP_SOURCE bytes (or a staged data
# set's catalog record, ~90 bytes per chunk). The socket's ZMQ_MAXMSGSIZE is
# MASTER_MAX_BYTES too, so a larger frame never reaches the process.
MAX_APP_SOURCE = 4 * MiB
MASTER_MAX_BYTES = 2 * MAX_APP_SOURCE
#: a staged data set's catalog record ("data_commit") holds 9 values per
#: chunk (its map, 5 fields, the holders list and 2 holders): a data set has at
#: most this many chunks (64 GiB at 4 MiB chunks, a record of ~1.4 MiB)
MAX_DATA_CHUNKS = 1 << 14
MASTER_LIMITS = Limits(max_bytes=MASTER_MAX_BYTES, max_header=MASTER_MAX_BYTES,
                       max_frames=MAX_FRAMES, max_str=MASTER_MAX_BYTES, max_bin=64 * KiB,
                       max_array=MAX_DATA_CHUNKS, max_map=4096,
                       max_objects=12 * MAX_DATA_CHUNKS)
#: strings in a field are at most this long unless the field is named below
MAX_FIELD_STR = 64 * KiB
_STR_CAPS = {"app_source": None,            # bounded by the header (and MAX_APP_SOURCE)
             "error": MiB, "log_tail": MiB, "message": MiB, "reason": MiB,
             "text": 4 * MiB}

_OPT = object()  # marker: optional field


class ProtocolError(ValueError):
    """A message that is malformed, oversized, unknown or fails its schema."""


# Field type specs: a Python type, a tuple of types, or (spec, _OPT) for optional.
_NUM = (int, float)
SCHEMAS: dict[str, dict[str, Any]] = {
    # generic replies
    "ok": {"info": (dict, _OPT)},
    "error": {"code": str, "message": str},
    # client -> master
    "submit": {"app_name": str, "app_source": str, "args": list, "machines": int,
               "name": (str, _OPT), "group": (str, _OPT),
               "checkpoint_every": (int, _OPT), "checkpoint_seconds": (_NUM, _OPT),
               # seconds after submission; a Utility spec of the JCT (OASiS, MLFS)
               "deadline": (_NUM, _OPT), "utility": (str, _OPT)},
    "submitted": {"job": str},
    # all: also the finished jobs past the master's --retention (hidden: how
    # many were left out)
    "list_jobs": {"all": (bool, _OPT)},
    "jobs": {"jobs": list, "hidden": (int, _OPT), "retention": (_NUM, _OPT)},
    "job_status": {"job": str},
    "status": {"job": dict},
    "cancel": {"job": str},
    "pause": {"job": str},
    "resize": {"job": str, "machines": int, "workers": (int, _OPT), "servers": (int, _OPT)},
    "resume": {"job": str, "machines": (int, _OPT)},
    "cluster_info": {},
    # model export (harmony model get): the checkpoint to read a job's model
    # from; fresh: a running job writes a new one at its next epoch end
    "model_parts": {"job": str, "fresh": (bool, _OPT)},
    # parts: [{"index", "epoch", "sources": [[machine, data endpoint]]}];
    # epoch -1: none yet; pending: a fresh one is on the way
    "model_source": {"job": str, "state": str, "epoch": int, "parts": list, "final": bool,
                     "pending": bool, "app_name": str, "app_source": str, "args": list},
    "cluster": {"workers": list, "master": dict},
    # worker daemon -> master
    "register": {"name": str, "host": str, "cpus": int, "memory": int, "pid": int,
                 "executors": list, "data_endpoint": (str, _OPT), "revision": (str, _OPT),
                 "dilation": (_NUM, _OPT),      # its time dilation (harmony.dilation)
                 # where its daemon leads the subtask synchronizer of jobs
                 # (harmony.subtasks.sync); none: the master synchronizes them
                 "sync_endpoint": (str, _OPT)},
    "registered": {"heartbeat_interval": _NUM},
    # launches: launch messages the daemon received since it registered
    # tasks: the subtasks that ended since the last heartbeat, while the
    # master asks for them (the dashboard's task stream; clean_tasks)
    "heartbeat": {"name": str, "executors": list, "stats": (dict, _OPT),
                  "launches": (int, _OPT), "tasks": (list, _OPT)},
    # tasks: send the subtasks that end (someone watches the dashboard)
    "hb_ack": {"tasks": (bool, _OPT)},
    "exec_exited": {"job": str, "index": int, "attempt": int, "code": int, "log_tail": str},
    # master -> worker daemon
    # resume: {"epoch", "parts": [{"index", "epoch", "sources": [[machine, endpoint]]}]};
    # join: a machine added to a running job (its blocks arrive by migration)
    "launch": {"job": str, "index": int, "count": int, "app_name": str,
               "app_source": str, "args": list, "attempt": int,
               "resume": (dict, _OPT), "join": (bool, _OPT),
               "datasets": (dict, _OPT),    # harmony://NAME in args: NAME -> catalog entry
               "secret": (str, _OPT)},      # the job attempt's PS secret
    "kill": {"job": str},
    # drop a job's checkpoints on this machine, all but epoch ``keep``
    "ckpt_gc": {"job": str, "keep": (int, _OPT)},
    # subtask synchronizer; prio: the subtask's expected seconds
    "enqueue": {"job": str, "seq": int, "kind": str, "prio": (_NUM, _OPT)},
    # the synchronizer off the master (harmony.subtasks.sync): who leads a job
    # attempt's layout ``gen``, sent to every daemon of the job
    "sync_plan": {"job": str, "attempt": int, "gen": int, "machines": list, "leader": str,
                  "endpoint": str},
    # a member daemon -> the leader daemon: an executor's sync (machine: the
    # sender's name, checked against its key where there are keys; tag: the
    # job attempt's secret, which only the job's daemons and executors hold)
    "lsync": {"job": str, "attempt": int, "gen": int, "index": int, "seq": int,
              "next": str, "prio": (_NUM, _OPT), "machine": str, "tag": str},
    # the leader daemon -> the master: the job's executors broke the protocol
    "sync_failed": {"job": str, "attempt": int, "error": str},
    # job executor <-> its worker daemon (subtask queues)
    "hello": {"job": str, "index": int, "attempt": int},
    "grant": {"seq": int, "role": str},
    "preempted": {"seq": int, "seconds": _NUM},   # how long a COMP stood stopped
    "sub_done": {"job": str, "seq": int},
    # job executor <-> its worker daemon (memory and the α controllers): the
    # machine's memory as the daemon's latest sample has it, for the
    # executor's α controller: the budget, the other executors whose input
    # is loaded (bytes, count), the sample's age in seconds (none: no sample;
    # the daemon samples only with a budget), and whether another job here
    # said it is starved (within harmony.worker.daemon_core.STARVED_FRESH_S),
    # with the bytes those jobs asked for (others_need)
    "mem_query": {"job": str, "attempt": int, "rid": int},
    "mem_state": {"rid": int, "budget": int, "others_bytes": int, "others_count": int,
                  "age": (_NUM, _OPT), "others_starved": bool,
                  "others_need": (_NUM, _OPT)},
    # an executor's α controller after its epoch step: its disk ratio, and
    # whether its reloads stall with no memory to keep more blocks (starved),
    # and then the bytes it would bring back to stop stalling (need)
    "alpha_state": {"job": str, "attempt": int, "alpha": _NUM, "starved": bool,
                    "need": (_NUM, _OPT)},
    # job executor -> master
    "exec_ready": {"job": str, "index": int, "attempt": int, "endpoint": str,
                   "num_keys": int, "dim": int, "model_blocks": int, "local_blocks": int,
                   "join": (bool, _OPT), "setup_s": (_NUM, _OPT), "setup_cpu": (_NUM, _OPT),
                   "setup_stretched": (bool, _OPT)},
    "barrier": {"job": str, "index": int, "epoch": int, "iter": int},
    # to the master, or (with attempt and gen, leader synchronization) to the
    # executor's daemon; prio: the next subtask's expected seconds
    "sync": {"job": str, "index": int, "seq": int, "next": str,
             "attempt": (int, _OPT), "gen": (int, _OPT), "prio": (_NUM, _OPT)},
    "epoch_done": {"job": str, "index": int, "epoch": int, "sums": dict,
                   "timings": dict, "store": (dict, _OPT)},   # store: block-store stats
    "epoch_report": {"job": str, "index": int, "epoch": int, "metrics": dict,
                     "stop": bool},
    "exec_failed": {"job": str, "index": int, "error": str, "attempt": (int, _OPT)},
    "exec_finished": {"job": str, "index": int},
    "exec_paused": {"job": str, "index": int, "attempt": int, "epoch": int, "version": int,
                    "replica": (str, _OPT), "bytes": (int, _OPT)},
    # a periodic checkpoint part is written here and on ``replica`` (verified)
    "ckpt_part": {"job": str, "index": int, "epoch": int, "version": int,
                  "replica": (str, _OPT), "bytes": int,
                  # the part could not be written or replicated: the checkpoint
                  # is skipped (the job goes on from its last complete one)
                  "error": (str, _OPT)},
    # the job's final checkpoint part (at its stop epoch, for the model
    # export), or why it could not be written
    "ckpt_final": {"job": str, "index": int, "epoch": int, "version": (int, _OPT),
                   "replica": (str, _OPT), "bytes": (int, _OPT), "error": (str, _OPT)},
    # live resize: an executor stopped at the epoch boundary; its input blocks
    "at_boundary": {"job": str, "index": int, "epoch": int, "seq": int, "inputs": list},
    "migrated": {"job": str, "index": int, "bytes_out": int, "bytes_in": int,
                 "seconds": _NUM},
    "migrating": {"job": str, "index": int, "bytes_out": int, "blocks_out": int},
    # a paced resize: the move ``op`` of the plan that the master sent is sent
    # and acknowledged by its receiver
    "moved": {"job": str, "index": int, "op": int, "bytes_out": int},
    "ping": {"job": str, "index": int},
    "pong": {},
    # master -> job executor
    # replicas: per executor index, [machine, data endpoint] of its checkpoint replica
    "job_start": {"peers": list, "owner": list, "model_blocks": int, "mode": str,
                  "machines": list, "replicas": (list, _OPT),
                  # per index: more holders to try, in order, when the replica
                  # machine cannot take the part (its disk is full, it is gone)
                  "replica_alts": (list, _OPT),
                  # sync_gen: the executors send syncs to their daemon, for
                  # the leader of layout gen (none: to the master)
                  "sync_gen": (int, _OPT)},
    # live resize: the new layout; index -1 leaves. sends: [[sec, block, new index]];
    # paced: the executor sends them only as the master's ``move`` commands say
    "migrate": {"index": int, "count": int, "peers": list, "owner": list, "machines": list,
                "sends": list, "expect": int, "seq": int, "epoch": int,
                "replicas": (list, _OPT), "replica_alts": (list, _OPT), "mode": (str, _OPT),
                "workers": (int, _OPT),        # executors holding input (default: count)
                "paced": (bool, _OPT)},
    # one move of a paced resize's plan (sends as in migrate); op -1: no more
    "move": {"op": int, "sends": list},
    "reconfigured": {"sync_gen": (int, _OPT)},
    "leave": {},
    "release": {"epoch": int, "iter": int},
    "epoch_sums": {"epoch": int, "sums": dict, "pause": (bool, _OPT),
                   "reconfig": (bool, _OPT), "checkpoint": (bool, _OPT),
                   "stop": (bool, _OPT),
                   # with a checkpoint, a pause or the stop: its parts' replica
                   # machines and alternates, chosen now (as in migrate)
                   "replicas": (list, _OPT), "replica_alts": (list, _OPT),
                   # the job's expected COMP and network subtask seconds (the
                   # subtask priorities that leader-synchronized syncs carry)
                   "prio": (list, _OPT)},
    "abort": {"reason": str},
    # PS data plane (executor <-> server shard); arrays follow as raw frames
    # "tag" names the job attempt: a shard refuses requests of another attempt
    "pull": {"rid": int, "n": int, "tag": str},               # frames: keys int64[n]
    "push": {"rid": int, "n": int, "dim": int, "tag": str},   # frames: keys, values[n, dim]
    "rows": {"rid": int, "n": int, "dim": int},     # frames: values[n, dim]
    "ack": {"rid": int},
    "ps_error": {"rid": int, "message": str},
    # the shard no longer owns (some of) the keys: the owner map in force
    "ps_moved": {"rid": int, "owner": list, "peers": list},
    # blocks over the network (harmony.store.transfer); frames: one chunk
    # (tag: a PS shard's job attempt and secret, as in pull/push: a moved
    # block is taken only from the job's own executors)
    "blk": {"mid": str, "sec": str, "bid": int, "arr": int, "narr": int, "off": int,
            "size": int, "h": int, "head": (bytes, _OPT), "tag": (str, _OPT)},
    "blk_ack": {"mid": str, "sec": str, "bid": int, "ok": bool, "error": (str, _OPT)},
    "blk_end": {"mid": str, "count": int, "meta": dict},
    "blk_done": {"mid": str, "ok": bool, "digest": (bytes, _OPT), "error": (str, _OPT)},
    # a worker's data service: checkpoint parts it holds (its own or replicas)
    "ckpt_manifest": {"job": str, "epoch": int, "index": int},
    "manifest": {"entries": list, "epoch": int, "iteration": int, "meta": dict},
    "ckpt_fetch": {"mid": str, "job": str, "epoch": int, "index": int, "want": list},
    # staged input (harmony data put / harmony://NAME)
    "data_fetch": {"mid": str, "name": str, "chunks": list},
    "data_plan": {"name": str, "size": int, "chunks": int},
    "data_placement": {"holders": list},
    "data_commit": {"name": str, "filename": str, "size": int, "chunks": list},
    "data_list": {},
    "datasets": {"datasets": list},
    "data_rm": {"name": str},
    "data_gc": {"name": str},     # master -> daemon: drop a data set's chunks
    # master -> daemon: copy chunks to another worker (a holder was lost); and back
    "data_copy": {"name": str, "chunks": list, "to": str, "endpoint": str},
    "data_copied": {"name": str, "chunks": list, "to": str, "ok": bool,
                    "error": (str, _OPT)},
}


# -- observability (harmony.obs): dashboard address and token, executor logs --
SCHEMAS.update({
    # client -> master: where the dashboard and /metrics are, and this
    # client's token for them (under the master's own dashboard secret,
    # good until ``expires``, unix seconds)
    "dashboard_info": {},
    "dashboard": {"url": (str, _OPT), "token": (str, _OPT), "expires": (int, _OPT)},
    # client -> master: which machines ran a job, and their data services
    "log_sources": {"job": str},
    "log_places": {"job": str, "machines": list},   # [[machine, data endpoint]]
    # client -> a worker's data service: a job's executor logs held there,
    # from byte ``offset`` of attempt ``attempt`` (default: the newest)
    "log_read": {"job": str, "offset": (int, _OPT), "attempt": (int, _OPT),
                 "max_bytes": (int, _OPT)},
    "log_data": {"job": str, "machine": str, "attempt": int, "offset": int, "text": str,
                 "size": int, "live": bool, "attempts": list},
})


@dataclass(slots=True)
class Message:
    type: str
    fields: dict[str, Any]
    frames: list  # trailing raw frames (zmq.Frame or bytes)

    def __getitem__(self, key: str) -> Any:
        return self.fields[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)


def _short(value: Any, n: int = 60) -> str:
    """A bounded repr for error texts (a hostile value may be megabytes)."""
    r = repr(value)
    return r if len(r) <= n else r[:n] + f"...({len(r)} chars)"


def _check(mtype: str, fields: dict[str, Any]) -> None:
    schema = SCHEMAS.get(mtype)
    if schema is None:
        raise ProtocolError(f"unknown message type {_short(mtype)}")
    for name, spec in schema.items():
        optional = isinstance(spec, tuple) and len(spec) == 2 and spec[1] is _OPT
        typ = spec[0] if optional else spec
        if name not in fields or fields[name] is None:
            if optional:
                continue
            raise ProtocolError(f"{mtype}: missing field {name!r}")
        val = fields[name]
        # bool is an int subclass; keep them apart.
        if typ is int and isinstance(val, bool):
            raise ProtocolError(f"{mtype}: field {name!r} must be int, got bool")
        if not isinstance(val, typ):
            want = typ.__name__ if isinstance(typ, type) else "/".join(t.__name__ for t in typ)
            raise ProtocolError(
                f"{mtype}: field {name!r} must be {want}, got {type(val).__name__}")
        if isinstance(val, str):
            cap = _STR_CAPS.get(name, MAX_FIELD_STR)
            if cap is not None and len(val) > cap:
                raise ProtocolError(f"{mtype}: field {name!r} is {len(val)} characters long "
                                    f"(at most {cap})")
    extra = set(fields) - set(schema)
    if extra:
        names = sorted(_short(k, 40) for k in extra)
        more = f" and {len(names) - 5} more" if len(names) > 5 else ""
        raise ProtocolError(f"{mtype}: unknown field(s) {names[:5]}{more}")


def encode(mtype: str, **fields: Any) -> bytes:
    """Encode a control message header (validated: a sender bug fails loudly here)."""
    _check(mtype, fields)
    fields = {k: v for k, v in fields.items() if v is not None}
    return msgpack.packb({"t": mtype, **fields}, use_bin_type=True)


def _is_frame(x: Any) -> bool:
    """Whether ``x`` is a zmq.Frame, without importing zmq here (the cores
    that use these schemas stay free of it): where zmq is not loaded, no
    object can be one."""
    zmq = sys.modules.get("zmq")
    return zmq is not None and isinstance(x, zmq.Frame)


def _nbytes(frame: Any) -> int:
    if isinstance(frame, (bytes, bytearray)) or _is_frame(frame):
        return len(frame)
    try:
        return memoryview(frame).nbytes     # zmq.Frame, memoryview, numpy: no copy
    except TypeError:
        raise ProtocolError(f"a frame of type {type(frame).__name__} is not a buffer") from None


# msgpack's container type bytes (fixmap, fixarray, array 16/32, map 16/32):
# a header with at most max_depth of these bytes cannot nest deeper
_NOT_CONTAINER = bytes(b for b in range(256) if not (0x80 <= b <= 0x9f or 0xdc <= b <= 0xdf))


def _containers(raw: Any) -> int:
    """How many bytes of a header are container type bytes (C speed)."""
    return len((raw if isinstance(raw, bytes) else bytes(raw)).translate(None, _NOT_CONTAINER))


def _depth_ok(obj: Any, max_depth: int) -> bool:
    """Containers nest at most ``max_depth`` deep (level by level, no
    recursion; linear in the values, which ``max_objects`` bounds)."""
    level = [obj]
    for _ in range(max_depth):
        nxt: list = []
        for o in level:
            vals = o.values() if type(o) is dict else o
            nxt += [v for v in vals if type(v) is list or type(v) is dict]
        if not nxt:
            return True
        level = nxt
    return False


class _Budget:
    """msgpack hooks that count every container and its values as it is
    built and stop the decoding past ``limit``."""
    __slots__ = ("left",)

    def __init__(self, limit: int) -> None:
        self.left = limit

    def _take(self, n: int) -> None:
        self.left -= n
        if self.left < 0:
            raise ValueError("too many values in the header")

    def list_hook(self, obj: list) -> list:
        self._take(len(obj) + 1)
        return obj

    def object_hook(self, obj: dict) -> dict:
        self._take(len(obj) + 1)
        return obj


def decode(frames: list, limits: Limits = DEFAULT_LIMITS) -> Message:
    """Decode and validate ``[header, *raw_frames]``; raises ProtocolError.

    Every size limit of ``limits`` is checked before the header is decoded."""
    if not frames:
        raise ProtocolError("empty message")
    if len(frames) > limits.max_frames:
        raise ProtocolError(f"too many frames ({len(frames)} > {limits.max_frames})")
    sizes = [len(f) if type(f) is bytes else _nbytes(f) for f in frames]
    total = sum(sizes)
    if total > limits.max_bytes:
        raise ProtocolError(f"message too large ({total} bytes in {len(frames)} frame(s) "
                            f"> {limits.max_bytes})")
    if sizes[0] > limits.max_header:
        raise ProtocolError(f"header too large ({sizes[0]} bytes > {limits.max_header})")
    head = frames[0]
    # a large zmq.Frame: its buffer, not a copy (a refused header costs none)
    raw = head if type(head) is bytes else (
        (head.bytes if sizes[0] < 65536 else head.buffer) if _is_frame(head)
        else memoryview(head))
    # every value takes a byte at least: a header shorter than the budget
    # cannot exceed it, and is decoded without the counting hooks
    try:
        if sizes[0] > limits.max_objects:
            budget = _Budget(limits.max_objects)
            obj = msgpack.unpackb(raw, **limits.unpack_options, list_hook=budget.list_hook,
                                  object_hook=budget.object_hook)
        else:
            obj = msgpack.unpackb(raw, **limits.unpack_options)
    except Exception as exc:  # msgpack raises several unrelated types
        raise ProtocolError(f"undecodable header: {exc.__class__.__name__}: "
                            f"{str(exc)[:200]}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("t"), str):
        raise ProtocolError("header is not a map with a string 't' (message type)")
    if sizes[0] > limits.max_depth and _containers(raw) > limits.max_depth \
            and not _depth_ok(obj, limits.max_depth):
        raise ProtocolError(f"header nests deeper than {limits.max_depth} levels")
    mtype = obj.pop("t")
    _check(mtype, obj)
    return Message(mtype, obj, list(frames[1:]))


# -- heartbeat statistics -----------------------------------------------------------
#: what a daemon reports per heartbeat (harmony.worker.daemon.Daemon._stats):
#: time, interval, CPU / memory / queue / network utilization, the free and
#: total bytes of the disk that holds its state dir, and the subtask queues'
#: counters since the daemon started (COUNTER_KEYS)
STATS_KEYS = frozenset({"t", "dt", "cpu", "mem", "q_cpu", "q_net", "net",
                        "disk_free", "disk_total", "net_sent", "net_recv"})
#: per resource R (cpu, net): qg_R subtasks granted (told their executor),
#: qw_R their seconds waiting in the queue, qd_R subtasks done, qr_R their
#: run seconds (DaemonCore.queue_stats); never negative
COUNTER_KEYS = frozenset(f"{k}_{r}" for k in ("qg", "qw", "qd", "qr") for r in ("cpu", "net"))
#: never negative: the counters, the disk's bytes and the NICs' bytes of the
#: interval (net_sent, net_recv: a machine without emulated links)
NONNEG_KEYS = COUNTER_KEYS | {"disk_free", "disk_total", "net_sent", "net_recv"}
STATS_KEYS = STATS_KEYS | COUNTER_KEYS
MAX_STATS_ENTRIES = 32


def clean_stats(stats: Any) -> dict[str, float] | None:
    """A heartbeat's ``stats`` against their schema: a map of at most
    MAX_STATS_ENTRIES entries whose known keys (STATS_KEYS) hold finite
    numbers (NONNEG_KEYS: not negative); unknown keys (a newer daemon's)
    are dropped. None: refused (not a map, too large, or a known key that
    is not such a number)."""
    if not isinstance(stats, dict) or len(stats) > MAX_STATS_ENTRIES:
        return None
    out: dict[str, float] = {}
    for k, v in stats.items():
        if k not in STATS_KEYS:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return None
        v = float(v) if isinstance(v, float) or abs(v) < 2**53 else math.nan
        if not math.isfinite(v) or (v < 0 and k in NONNEG_KEYS):
            return None
        out[k] = v
    return out


#: subtasks a heartbeat carries at most (the daemon keeps the latest)
MAX_TASKS = 400
TASK_KINDS = ("cpu", "net")


def clean_tasks(tasks: Any) -> list[tuple[float, float, str, str]]:
    """A heartbeat's ``tasks``: [start, end, job, kind] per subtask that
    ended since the last heartbeat, start and end in seconds before the
    heartbeat was sent (wall seconds, so that the master can place them on
    its own clock whatever the machines' clocks say). Malformed entries
    are dropped, at most MAX_TASKS are kept: what a daemon sends cannot
    grow the master."""
    if not isinstance(tasks, list):
        return []
    out = []
    for t in tasks[:MAX_TASKS]:
        if not isinstance(t, list) or len(t) != 4:
            continue
        a, b, job, kind = t
        if isinstance(a, bool) or isinstance(b, bool) or not isinstance(a, (int, float)) \
                or not isinstance(b, (int, float)) or not isinstance(job, str) \
                or kind not in TASK_KINDS or not 0 < len(job) <= 128:
            continue
        a, b = float(a), float(b)
        if math.isfinite(a) and math.isfinite(b) and 0 <= b <= a <= 3600:
            out.append((a, b, job, kind))
    return out


def error(code: str, message: str) -> bytes:
    return encode("error", code=code, message=message)
