"""Small ZeroMQ helpers shared by every process."""
from __future__ import annotations

import zmq

from harmony.comm import security

DEFAULT_MASTER = "tcp://127.0.0.1:5760"


def make_socket(ctx: zmq.Context, kind: int, identity: bytes | None = None,
                keys: "security.Keys | None" = None) -> zmq.Socket:
    """A socket with Harmony's options; with keys (``keys``, or the
    process's, :func:`harmony.comm.security.use`) a ROUTER is a CURVE server
    behind the ZAP handler and any other kind a CURVE client."""
    sock = ctx.socket(kind)
    security.secure_socket(ctx, sock, kind, keys)
    sock.setsockopt(zmq.LINGER, 0)
    if identity is not None:
        sock.setsockopt(zmq.IDENTITY, identity)
    if kind == zmq.ROUTER:
        # a send to a vanished peer raises EHOSTUNREACH instead of vanishing
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    # TCP-level liveness on top of application heartbeats
    sock.setsockopt(zmq.TCP_KEEPALIVE, 1)
    return sock


def bind_random(sock: zmq.Socket, host: str) -> str:
    """Bind to a random free port on ``host``; return the endpoint."""
    port = sock.bind_to_random_port(f"tcp://{host}")
    return f"tcp://{host}:{port}"


def check_endpoint(url: str) -> str:
    if not url.startswith("tcp://") or ":" not in url[6:]:
        raise ValueError(f"not a tcp://HOST:PORT address: {url!r}")
    return url
