"""Every control message of Harmony, defined once and validated where received.

Wire format: a control message is one msgpack map ``{"t": TYPE, ...fields}``
in the first frame, optionally followed by raw binary frames (numpy buffers,
see :mod:`harmony.comm.arrays`). No pickle anywhere: msgpack is decoded with
explicit size limits and every field is type-checked against the schema
below before a handler sees it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

# Hard limits on what a receiver accepts.
MAX_HEADER_BYTES = 32 * 1024 * 1024      # app sources travel in headers
MAX_FRAMES = 16

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
               "checkpoint_every": (int, _OPT), "checkpoint_seconds": (_NUM, _OPT)},
    "submitted": {"job": str},
    "list_jobs": {},
    "jobs": {"jobs": list},
    "job_status": {"job": str},
    "status": {"job": dict},
    "cancel": {"job": str},
    "pause": {"job": str},
    "resize": {"job": str, "machines": int},
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
                 "executors": list, "data_endpoint": (str, _OPT), "revision": (str, _OPT)},
    "registered": {"heartbeat_interval": _NUM},
    "heartbeat": {"name": str, "executors": list, "stats": (dict, _OPT)},
    "hb_ack": {},
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
    # job executor <-> its worker daemon (subtask queues)
    "hello": {"job": str, "index": int, "attempt": int},
    "grant": {"seq": int, "role": str},
    "preempted": {"seq": int, "seconds": _NUM},   # how long a COMP stood stopped
    "sub_done": {"job": str, "seq": int},
    # job executor -> master
    "exec_ready": {"job": str, "index": int, "attempt": int, "endpoint": str,
                   "num_keys": int, "dim": int, "model_blocks": int, "local_blocks": int,
                   "join": (bool, _OPT)},
    "barrier": {"job": str, "index": int, "epoch": int, "iter": int},
    "sync": {"job": str, "index": int, "seq": int, "next": str},
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
                  "replica": (str, _OPT), "bytes": int},
    # the job's final checkpoint part (at its stop epoch, for the model
    # export), or why it could not be written
    "ckpt_final": {"job": str, "index": int, "epoch": int, "version": (int, _OPT),
                   "replica": (str, _OPT), "bytes": (int, _OPT), "error": (str, _OPT)},
    # live resize: an executor stopped at the epoch boundary; its input blocks
    "at_boundary": {"job": str, "index": int, "epoch": int, "seq": int, "inputs": list},
    "migrated": {"job": str, "index": int, "bytes_out": int, "bytes_in": int,
                 "seconds": _NUM},
    "migrating": {"job": str, "index": int, "bytes_out": int, "blocks_out": int},
    "ping": {"job": str, "index": int},
    "pong": {},
    # master -> job executor
    # replicas: per executor index, [machine, data endpoint] of its checkpoint replica
    "job_start": {"peers": list, "owner": list, "model_blocks": int, "mode": str,
                  "machines": list, "replicas": (list, _OPT)},
    # live resize: the new layout; index -1 leaves. sends: [[sec, block, new index]]
    "migrate": {"index": int, "count": int, "peers": list, "owner": list, "machines": list,
                "sends": list, "expect": int, "seq": int, "epoch": int,
                "replicas": (list, _OPT), "mode": (str, _OPT)},
    "reconfigured": {},
    "leave": {},
    "release": {"epoch": int, "iter": int},
    "epoch_sums": {"epoch": int, "sums": dict, "pause": (bool, _OPT),
                   "reconfig": (bool, _OPT), "checkpoint": (bool, _OPT)},
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
    "blk": {"mid": str, "sec": str, "bid": int, "arr": int, "narr": int, "off": int,
            "size": int, "h": int, "head": (bytes, _OPT)},
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


@dataclass(slots=True)
class Message:
    type: str
    fields: dict[str, Any]
    frames: list  # trailing raw frames (zmq.Frame or bytes)

    def __getitem__(self, key: str) -> Any:
        return self.fields[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)


def _check(mtype: str, fields: dict[str, Any]) -> None:
    schema = SCHEMAS.get(mtype)
    if schema is None:
        raise ProtocolError(f"unknown message type {mtype!r}")
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
    extra = set(fields) - set(schema)
    if extra:
        raise ProtocolError(f"{mtype}: unknown field(s) {sorted(extra)}")


def encode(mtype: str, **fields: Any) -> bytes:
    """Encode a control message header (validated: a sender bug fails loudly here)."""
    _check(mtype, fields)
    fields = {k: v for k, v in fields.items() if v is not None}
    return msgpack.packb({"t": mtype, **fields}, use_bin_type=True)


def decode(frames: list) -> Message:
    """Decode and validate ``[header, *raw_frames]``; raises ProtocolError."""
    if not frames:
        raise ProtocolError("empty message")
    if len(frames) > MAX_FRAMES:
        raise ProtocolError(f"too many frames ({len(frames)} > {MAX_FRAMES})")
    head = frames[0]
    raw = head.bytes if hasattr(head, "bytes") else head
    if len(raw) > MAX_HEADER_BYTES:
        raise ProtocolError(f"header too large ({len(raw)} bytes > {MAX_HEADER_BYTES})")
    try:
        # size is bounded above; nesting is bounded by msgpack's own limits
        obj = msgpack.unpackb(raw, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types
        raise ProtocolError(f"undecodable header: {exc.__class__.__name__}: {exc}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("t"), str):
        raise ProtocolError("header is not a map with a string 't' (message type)")
    mtype = obj.pop("t")
    _check(mtype, obj)
    return Message(mtype, obj, list(frames[1:]))


def error(code: str, message: str) -> bytes:
    return encode("error", code=code, message=message)
