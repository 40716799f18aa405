"""What a client socket's handshakes with its peer came to, from the
socket's monitor (``zmq_socket_monitor``): whether the peer's ZAP handler
refused our key, our security mechanism did not match its (no key for a
CURVE server), or a handshake succeeded. Used to say why a request got no
answer: "the master refused this key" rather than "is it running?".
"""
from __future__ import annotations

import zmq
from zmq.utils.monitor import parse_monitor_message

EVENTS = (zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
          | zmq.EVENT_HANDSHAKE_SUCCEEDED)


class Watch:
    """Handshake outcomes of one socket; make it before ``connect``, close
    it before the socket (and before its context is terminated)."""

    def __init__(self, sock: zmq.Socket) -> None:
        self.sock = sock
        self.mon: zmq.Socket | None = sock.get_monitor_socket(EVENTS)
        # since the last handshake that completed (if any):
        self.refused = False        # the peer's ZAP handler refused our key
        self.mismatch = False       # a handshake failed on the protocol (e.g. mechanism)
        self.succeeded = False      # a handshake completed

    def update(self) -> "Watch":
        """Read the events so far (never blocks)."""
        while self.mon is not None and self.mon.poll(0):
            try:
                ev = parse_monitor_message(self.mon.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                break
            kind = int(ev["event"])
            if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                self.refused = True
            elif kind == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
                self.mismatch = True
            elif kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.succeeded = True
                self.refused = self.mismatch = False
        return self

    def close(self) -> None:
        if self.mon is None:
            return
        try:
            self.sock.disable_monitor()
        except zmq.ZMQError:
            pass
        self.mon.close(linger=0)
        self.mon = None
