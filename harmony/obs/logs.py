"""Executor logs from any machine (``harmony logs``), and how long they stay.

Each worker keeps its executors' logs on its own disk:

* a running (or failed) executor's in its directory,
  ``STATE/jobs/JOB.INDEX.ATTEMPT/executor.log``;
* a finished or stopped executor's log moved, when the daemon reaps it, to
  ``STATE/logs/JOB.INDEX.ATTEMPT.log``, kept within a size and an age limit
  (``$HARMONY_LOG_KEEP_MB``, default 256 MiB per machine, and
  ``$HARMONY_LOG_KEEP_DAYS``, default 7), the oldest dropped first.

They are read over ZeroMQ from the worker's data service (``log_read``), the
same service that serves checkpoints: shared nothing, no file system is
shared. Only client and reader keys may read them. The master only says
which machines to ask (``log_sources``).
"""
from __future__ import annotations

import codecs
import os
import re
import shutil
import time
import uuid
from typing import Any

import zmq

from harmony.comm import messages as M
from harmony.comm.zmqutil import NoHandshake, make_socket, send
from harmony.util import names

KEEP_BYTES = int(float(os.environ.get("HARMONY_LOG_KEEP_MB", 256)) * 2**20)
KEEP_SECONDS = float(os.environ.get("HARMONY_LOG_KEEP_DAYS", 7)) * 86400
READ_MAX = 1 << 20            # bytes of log in one reply
_NAME = re.compile(r"^(?P<job>.+)\.(?P<index>\d+)\.(?P<attempt>\d+)$")


def kept_dir(state_dir: str) -> str:
    return os.path.join(state_dir, "logs")


def retire(state_dir: str, exec_dir: str, keep_bytes: int | None = None,
           keep_seconds: float | None = None) -> None:
    """An executor is done: keep its log (within the limits), drop its dir."""
    try:
        src = os.path.join(exec_dir, "executor.log")
        if os.path.isfile(src) and os.path.getsize(src) > 0:
            os.makedirs(kept_dir(state_dir), exist_ok=True)
            os.replace(src, os.path.join(kept_dir(state_dir),
                                         os.path.basename(exec_dir.rstrip("/")) + ".log"))
        prune(state_dir, KEEP_BYTES if keep_bytes is None else keep_bytes,
              KEEP_SECONDS if keep_seconds is None else keep_seconds)
    except OSError:
        pass      # a full or broken disk loses a log, never the daemon
    finally:
        shutil.rmtree(exec_dir, ignore_errors=True)


def prune(state_dir: str, keep_bytes: int, keep_seconds: float, now: float | None = None) -> int:
    """Drop kept logs older than ``keep_seconds``, then the oldest until at
    most ``keep_bytes`` are left; the number dropped."""
    now = time.time() if now is None else now
    d = kept_dir(state_dir)
    try:
        entries = os.listdir(d)
    except OSError:
        return 0
    files = []
    for n in entries:
        p = os.path.join(d, n)
        try:
            st = os.stat(p)
        except OSError:
            continue
        files.append((st.st_mtime, st.st_size, p))
    files.sort()
    total = sum(f[1] for f in files)
    dropped = 0
    for mtime, size, p in files:
        if now - mtime <= keep_seconds and total <= keep_bytes:
            break
        try:
            os.unlink(p)
            dropped += 1
            total -= size
        except OSError:
            pass
    return dropped


def find(state_dir: str, job: str) -> list[dict[str, Any]]:
    """The logs of ``job`` on this machine, oldest first: name
    (JOB.INDEX.ATTEMPT), path, live (its executor's dir still exists)."""
    if not names.NAME_RE.fullmatch(job):
        return []
    out = []
    for root, live in ((os.path.join(state_dir, "jobs"), True), (kept_dir(state_dir), False)):
        try:
            entries = os.listdir(root)
        except OSError:
            continue
        for n in entries:
            base = n[:-4] if not live and n.endswith(".log") else n
            m = _NAME.match(base)
            if not m or m.group("job") != job:
                continue
            p = os.path.join(root, n, "executor.log") if live else os.path.join(root, n)
            try:
                st = os.stat(p)
            except OSError:
                continue
            out.append({"name": base, "path": p, "live": live, "mtime": st.st_mtime,
                        "size": st.st_size, "index": int(m.group("index")),
                        "attempt": int(m.group("attempt"))})
    out.sort(key=lambda f: (f["mtime"], f["name"]))
    return out


# bytes that are not UTF-8 read as one "?" each: the text of a reply is as
# long in UTF-8 as the bytes it was read from, so a reader's next offset is
# its offset plus its text's UTF-8 length, exactly
codecs.register_error("harmony-log", lambda e: ("?" * (e.end - e.start), e.end))


def _whole_chars(data: bytes) -> bytes:
    """``data`` without a UTF-8 character cut off at its end (the next read
    starts at it); as it is if that would leave nothing."""
    for k in range(1, min(4, len(data)) + 1):
        b = data[-k]
        if b < 0x80:
            return data                     # ASCII: whole
        if b >= 0xC0:                       # a lead byte, k - 1 bytes after it
            need = 2 if b < 0xE0 else 3 if b < 0xF0 else 4
            return data if k >= need or k == len(data) else data[:-k]
    return data                             # no lead byte: not UTF-8 anyway


def read(state_dir: str, machine: str, job: str, offset: int = 0, which: int | None = None,
         max_bytes: int = READ_MAX) -> dict[str, Any]:
    """``log_data`` fields: the log ``which`` (an index into :func:`find`'s
    list, default the newest) of ``job`` here, from byte ``offset``; a
    negative ``offset``: about its last ``-offset`` bytes, from the start of
    a line (the reply's ``offset`` says where). At most ``max_bytes``
    (capped at READ_MAX), never ending inside a UTF-8 character when more
    follows; bytes that are not UTF-8 read as ``?``."""
    files = find(state_dir, job)
    listing = [[f["name"], f["size"], f["live"]] for f in files]
    if not files:
        return {"job": job, "machine": machine, "attempt": -1, "offset": 0, "text": "",
                "size": 0, "live": False, "attempts": []}
    k = len(files) - 1 if which is None or not -len(files) <= which < len(files) else which
    f = files[k]
    offset = int(offset)
    tail = offset < 0
    offset = max(0, min(f["size"] + offset if tail else offset, f["size"]))
    limit = max(0, min(int(max_bytes), READ_MAX))
    with open(f["path"], "rb") as fh:
        fh.seek(offset)
        data = fh.read(limit)
        more = bool(fh.read(1))
    if tail and offset > 0:                 # from the first whole line
        cut = data.find(b"\n")
        if 0 <= cut < len(data) - 1:
            data, offset = data[cut + 1:], offset + cut + 1
    if more:
        data = _whole_chars(data)
    return {"job": job, "machine": machine, "attempt": k % len(files), "offset": offset,
            "text": data.decode("utf-8", "harmony-log"), "size": f["size"], "live": f["live"],
            "attempts": listing}


def fetch(ctx: zmq.Context, endpoint: str, job: str, offset: int = 0,
          which: int | None = None, keys=None, timeout_s: float = 10.0) -> dict[str, Any]:
    """Ask one worker's data service for a job's log (a client's side)."""
    sock = make_socket(ctx, zmq.DEALER, identity=f"logs-{uuid.uuid4().hex[:12]}".encode(),
                       keys=keys, timeout_s=timeout_s)
    try:
        sock.connect(endpoint)
        try:
            send(sock, M.encode("log_read", job=job, offset=offset, attempt=which),
                 "data service", endpoint)
        except NoHandshake as exc:
            raise TimeoutError(str(exc)) from None
        if not sock.poll(int(timeout_s * 1000)):
            raise TimeoutError(f"no answer from {endpoint} within {timeout_s:.0f}s")
        msg = M.decode(sock.recv_multipart())
    finally:
        sock.close(linger=0)
    if msg.type == "error":
        raise PermissionError(msg["message"]) if msg["code"] == "forbidden" else \
            RuntimeError(msg["message"])
    return dict(msg.fields)


def fetch_many(ctx: zmq.Context, asks: list[tuple[str, str, int]], job: str, keys=None,
               timeout_s: float = 2.0, max_bytes: int = READ_MAX) -> dict[str, dict[str, Any]]:
    """Ask several data services at once (``asks``: machine, endpoint,
    offset) for at most ``max_bytes`` of ``job``'s newest log each, all
    within ``timeout_s`` together: a machine that does not answer in time
    (dead, or unreachable) costs no more than that and holds up no other.
    Per machine the ``log_data`` fields, or ``{"error": why}``."""
    out: dict[str, dict[str, Any]] = {}
    socks: dict[zmq.Socket, str] = {}
    poller = zmq.Poller()
    try:
        for machine, endpoint, offset in asks:
            sock = make_socket(ctx, zmq.DEALER, identity=f"logs-{uuid.uuid4().hex[:12]}".encode(),
                               keys=keys, timeout_s=timeout_s)
            socks[sock] = machine
            try:
                sock.connect(endpoint)
                # queued until connected (no wait here): the poll below bounds it
                sock.send(M.encode("log_read", job=job, offset=int(offset),
                                   max_bytes=int(max_bytes)), zmq.NOBLOCK)
            except zmq.ZMQError as exc:
                out[machine] = {"error": f"cannot ask {endpoint}: {exc}"}
                continue
            poller.register(sock, zmq.POLLIN)
        deadline = time.monotonic() + timeout_s
        waiting = sum(1 for m in socks.values() if m not in out)
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for sock, _ in poller.poll(max(1, int(left * 1000))):
                machine = socks[sock]
                poller.unregister(sock)
                waiting -= 1
                try:
                    msg = M.decode(sock.recv_multipart(zmq.NOBLOCK))
                except (zmq.ZMQError, M.ProtocolError) as exc:
                    out[machine] = {"error": f"a bad answer: {exc}"}
                    continue
                if msg.type == "log_data":
                    out[machine] = dict(msg.fields)
                elif msg.type == "error":
                    out[machine] = {"error": msg["message"], "code": msg["code"]}
                else:
                    out[machine] = {"error": f"an unexpected answer: {msg.type}"}
        for machine in socks.values():
            out.setdefault(machine, {"error": f"no answer within {timeout_s:g} s"})
    finally:
        for sock in socks:
            sock.close(linger=0)
    return out
