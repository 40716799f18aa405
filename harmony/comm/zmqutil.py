"""Small ZeroMQ helpers shared by every process."""
from __future__ import annotations

import zmq

from harmony.comm import security

DEFAULT_MASTER = "tcp://127.0.0.1:5760"

# Send and receive timeout of every socket but a ROUTER (those are client
# sides: DEALERs that connect). A DEALER whose peer refused its handshake
# (an unknown key, no key for a CURVE server) has no peer left, and a send
# on it would block forever; with SNDTIMEO it raises zmq.Again, which
# :func:`send` turns into :class:`NoHandshake`.
SOCKET_TIMEOUT_S = 60.0


class NoHandshake(zmq.Again):
    """A send timed out: the peer never completed the handshake (or, on a
    long-lived socket, stopped reading)."""

    def __init__(self, message: str) -> None:
        super().__init__()
        self.strerror = message     # Again.__init__ ignores a message
        self.args = (message,)


#: seconds a server's ROUTER waits to hand a reply to a peer whose queue is
#: full before it raises zmq.Again (the reply is then dropped)
ROUTER_SEND_S = 1.0


def make_socket(ctx: zmq.Context, kind: int, identity: bytes | None = None,
                keys: "security.Keys | None" = None,
                timeout_s: float | None = SOCKET_TIMEOUT_S, curve: bool = True,
                socket_class: type | None = None) -> zmq.Socket:
    """A socket with Harmony's options; with keys (``keys``, or the
    process's, :func:`harmony.comm.security.use`) a ROUTER is a CURVE server
    behind the ZAP handler and any other kind a CURVE client. Any kind but a
    ROUTER gets send and receive timeouts of ``timeout_s`` (None: none); a
    ROUTER a send timeout of ``ROUTER_SEND_S`` (servers poll to receive).
    ``curve=False``: no CurveZMQ whatever the keys (the data plane's sealed
    sockets, :mod:`harmony.comm.sealed`, authenticate each message instead);
    ``socket_class``: a subclass of zmq.Socket to make."""
    sock = ctx.socket(kind) if socket_class is None else ctx.socket(kind, socket_class=socket_class)
    if curve:
        security.secure_socket(ctx, sock, kind, keys)
    sock.setsockopt(zmq.LINGER, 0)
    if identity is not None:
        sock.setsockopt(zmq.IDENTITY, identity)
    if kind == zmq.ROUTER:
        # a send to a vanished peer raises EHOSTUNREACH instead of vanishing;
        # one to a peer that stopped reading (its queue full) raises Again
        # after ROUTER_SEND_S instead of blocking the server for good (every
        # server drops such a reply: a key holder that does not read cannot
        # stall a shard, a data service or a daemon for more than that)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.SNDTIMEO, max(1, int(ROUTER_SEND_S * 1000)))
    elif timeout_s is not None:
        sock.setsockopt(zmq.SNDTIMEO, max(1, int(timeout_s * 1000)))
        sock.setsockopt(zmq.RCVTIMEO, max(1, int(timeout_s * 1000)))
    # TCP-level liveness on top of application heartbeats
    sock.setsockopt(zmq.TCP_KEEPALIVE, 1)
    return sock


def handshake_hint(peer: str, endpoint: str, timeout_s: float) -> str:
    """What a send that timed out on a client socket means."""
    return (f"the {peer} at {endpoint} did not complete the handshake within "
            f"{timeout_s:.0f} s: is it running, and does it accept this key?")


def send(sock: zmq.Socket, frames: "bytes | list", peer: str = "peer",
         endpoint: str | None = None) -> None:
    """Send one message (a payload or a list of frames) on a client socket
    within its SNDTIMEO; a timeout raises :class:`NoHandshake` that names
    the ``peer`` (e.g. "master", "holder") and its endpoint."""
    try:
        if isinstance(frames, (bytes, bytearray, memoryview)):
            sock.send(frames)
        else:
            sock.send_multipart(frames, copy=False)
    except zmq.Again:
        ms = sock.getsockopt(zmq.SNDTIMEO)
        ep = endpoint or sock.getsockopt_string(zmq.LAST_ENDPOINT) or "?"
        raise NoHandshake(handshake_hint(peer, ep, max(ms, 0) / 1000)) from None


def bind_random(sock: zmq.Socket, host: str) -> str:
    """Bind to a random free port on ``host``; return the endpoint."""
    port = sock.bind_to_random_port(f"tcp://{host}")
    return f"tcp://{host}:{port}"


def check_endpoint(url: str) -> str:
    if not url.startswith("tcp://") or ":" not in url[6:]:
        raise ValueError(f"not a tcp://HOST:PORT address: {url!r}")
    return url
