"""A threading HTTP server with bounds, for the master's dashboard.

The standard :class:`~http.server.ThreadingHTTPServer` starts a thread per
connection and waits on it forever: a few hundred half-open connections hold
as many threads and file descriptors, and once the master's descriptors are
gone its accept loop spins and its ZeroMQ sockets cannot take new clients.
This one, all before any token is looked at:

* holds at most ``max_conns`` connections at once; one more is answered
  ``503`` (a best-effort, non-blocking write) and closed at once;
* gives each request ``header_timeout`` seconds for its request line and
  headers (a keep-alive connection as long to start its next request), then
  shuts the socket down: the server's own loop does it, no thread per timer;
* bounds every other read and write with ``io_timeout``;
* backs off when ``accept`` fails (out of file descriptors) instead of spinning;
* logs one short line for a connection that fails (a reset, a timeout), not a
  traceback, and never waits for handler threads when it closes.
"""
from __future__ import annotations

import errno
import logging
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

log = logging.getLogger("harmony.obs")

MAX_CONNS = 64
HEADER_TIMEOUT = 5.0
IO_TIMEOUT = 10.0
_BUSY_BODY = b"too many connections\n"
_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
         b"Content-Length: %d\r\nConnection: close\r\nRetry-After: 1\r\n\r\n%s"
         % (len(_BUSY_BODY), _BUSY_BODY))


class BoundedHTTPServer(ThreadingHTTPServer):
    """See the module docstring. Handlers derive from :class:`BoundedHandler`."""
    daemon_threads = True
    block_on_close = False          # never wait on a handler stuck in a read
    request_queue_size = 128        # a burst of connects is queued, not dropped

    def __init__(self, address: tuple[str, int], handler: type, *,
                 max_conns: int = MAX_CONNS, header_timeout: float = HEADER_TIMEOUT,
                 io_timeout: float = IO_TIMEOUT) -> None:
        self.max_conns = max_conns
        self.header_timeout = header_timeout
        self.io_timeout = io_timeout
        self._lock = threading.Lock()
        self._active = 0
        self._deadlines: dict[socket.socket, float] = {}
        self.refused = 0             # connections answered 503 (over the cap)
        self.expired = 0             # connections dropped for a slow request head
        self._accept_warned = 0.0
        super().__init__(address, handler)

    # -- the accept loop (serve_forever's thread) ---------------------------------------
    def get_request(self) -> tuple[socket.socket, Any]:
        try:
            return super().get_request()
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                now = time.monotonic()
                if now - self._accept_warned > 60:
                    self._accept_warned = now
                    log.error("dashboard cannot accept connections: %s (backing off)", exc)
                time.sleep(0.2)      # the listening socket stays readable: do not spin
            raise

    def process_request(self, request: socket.socket, client_address: Any) -> None:
        with self._lock:
            busy = self._active >= self.max_conns
            if not busy:
                self._active += 1
        if busy:
            self.refused += 1
            try:
                request.setblocking(False)
                request.send(_BUSY)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            with self._lock:
                self._active -= 1
            raise

    def process_request_thread(self, request: socket.socket, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._lock:
                self._active -= 1
                self._deadlines.pop(request, None)

    def service_actions(self) -> None:
        """Shut down the connections whose request head is overdue (a blocked
        read in their thread then returns end of file)."""
        now = time.monotonic()
        with self._lock:
            late = [s for s, t in self._deadlines.items() if t <= now]
            for s in late:
                del self._deadlines[s]
        for s in late:
            self.expired += 1
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    # -- the handler threads ------------------------------------------------------------
    def head_started(self, conn: socket.socket) -> None:
        with self._lock:
            self._deadlines[conn] = time.monotonic() + self.header_timeout

    def head_done(self, conn: socket.socket) -> None:
        with self._lock:
            self._deadlines.pop(conn, None)

    def active(self) -> int:
        with self._lock:
            return self._active

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        log.info("dashboard connection from %s ended: %s", _addr(client_address),
                 f"{type(exc).__name__}: {exc}" if exc is not None else "error")


class BoundedHandler(BaseHTTPRequestHandler):
    """A request handler for :class:`BoundedHTTPServer`: the request head is
    read under the server's deadline, everything else under its I/O timeout."""
    server: BoundedHTTPServer

    def setup(self) -> None:
        self.timeout = self.server.io_timeout
        super().setup()

    def handle_one_request(self) -> None:
        self.server.head_started(self.connection)
        try:
            super().handle_one_request()
        finally:
            self.server.head_done(self.connection)

    def parse_request(self) -> bool:
        ok = super().parse_request()
        self.server.head_done(self.connection)
        return ok


def _addr(client_address: Any) -> str:
    if isinstance(client_address, tuple) and len(client_address) >= 2:
        return f"{client_address[0]}:{client_address[1]}"
    return str(client_address)
