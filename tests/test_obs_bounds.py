"""The dashboard's bounds on a real local cluster: half-open connections
cannot take the master's file descriptors or threads (a connection cap and a
deadline for the request head, both before the token check), and a reset
connection is one short log line, not a traceback."""
from __future__ import annotations

import os
import socket
import struct
import time
import urllib.error
import urllib.request

import psutil
import pytest

from harmony.client import Client
from harmony.cluster import LocalCluster
from harmony.obs.httpserver import HEADER_TIMEOUT, MAX_CONNS

HALF_OPEN = 300
# The master's descriptor limit for this test: low enough that HALF_OPEN
# held connections would exhaust it (as 377 did on a host with the common
# 1024), high enough for the master's own sockets and the capped ones.
FD_LIMIT = 200


@pytest.fixture
def small_cluster(tmp_path):
    cl = LocalCluster(1, str(tmp_path / "cl"), port=0)
    cl.start()
    try:
        yield cl
    finally:
        cl.stop()


def _port(url: str) -> int:
    return int(url.rstrip("/").rsplit(":", 1)[1])


def _get(url: str, timeout: float = 10) -> int:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        r.read()
        return r.status


def test_half_open_connections_leave_master_and_dashboard_answering(small_cluster):
    cl = small_cluster
    master = psutil.Process(cl.procs[0].pid)
    assert master.num_fds() + MAX_CONNS + 20 < FD_LIMIT < HALF_OPEN
    master.rlimit(psutil.RLIMIT_NOFILE, (FD_LIMIT, master.rlimit(psutil.RLIMIT_NOFILE)[1]))
    with Client(cl.endpoint, timeout_s=10) as c:
        dash = c.dashboard()
    port = _port(dash["url"])
    socks: list[socket.socket] = []
    try:
        for _ in range(HALF_OPEN):        # connect, send nothing (or half a request line)
            try:
                s = socket.create_connection(("127.0.0.1", port), timeout=5)
            except OSError:
                break                      # the master stopped accepting: checked below
            if len(socks) % 2:
                s.sendall(b"GET /api/snapshot HT")
            socks.append(s)
        # the master answers clients while they are held
        with Client(cl.endpoint, timeout_s=10) as c:
            assert c.jobs() == []
        assert len(socks) == HALF_OPEN, f"only {len(socks)} connections were accepted"
        # the dashboard drops them (capped ones at once, the others after the
        # head deadline) and serves a valid token again, while they are still
        # open on this side
        deadline = time.time() + HEADER_TIMEOUT + 30
        while True:
            try:
                assert _get(f"{dash['url']}api/snapshot?token={dash['token']}") == 200
                break
            except urllib.error.HTTPError as e:
                assert e.code == 503, e
            except (urllib.error.URLError, OSError):
                pass
            assert time.time() < deadline, "the dashboard never served a page again"
            time.sleep(0.5)
        dropped = 0
        for s in socks:
            s.settimeout(10)
            try:
                while s.recv(4096):
                    pass
                dropped += 1
            except ConnectionResetError:   # closed with our half request unread
                dropped += 1
            except TimeoutError:           # still held by the master
                pass
        assert dropped == HALF_OPEN
        assert master.num_fds() < FD_LIMIT - 20
    finally:
        for s in socks:
            s.close()
    with Client(cl.endpoint, timeout_s=10) as c:
        assert c.jobs() == []
    assert master.is_running()


def test_a_reset_connection_is_one_short_log_line(small_cluster):
    cl = small_cluster
    with Client(cl.endpoint, timeout_s=10) as c:
        dash = c.dashboard()
    log_path = os.path.join(cl.state_dir, "logs", "master.log")
    before = os.path.getsize(log_path)
    for _ in range(3):                     # half a request, then a TCP reset
        s = socket.create_connection(("127.0.0.1", _port(dash["url"])), timeout=5)
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
    # a request after them is answered (so the resets were handled), then the log
    assert _get(f"{dash['url']}healthz") == 200
    deadline = time.time() + 20
    while True:                            # the master's process writes its log
        with open(log_path, "rb") as fh:
            fh.seek(before)
            new = fh.read().decode(errors="replace")
        lines = [ln for ln in new.splitlines() if "dashboard connection" in ln]
        if len(lines) == 3 or time.time() > deadline:
            break
        time.sleep(0.2)
    assert "Traceback" not in new, new
    assert len(lines) == 3 and all(len(ln) < 300 for ln in lines), new
