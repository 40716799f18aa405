"""A client whose handshake with the master never completes gets an error,
not a hang, and a key the master does not know is named as such.

The "master" here is a real CURVE ROUTER behind Harmony's ZAP handler, on
127.0.0.1 and a random port, that knows one key set (and never answers).
Once it refuses a client's handshake, libzmq drops the client's only peer,
and a send on a DEALER with no peer blocks until one appears: forever,
unless the socket has a send timeout. On a loaded machine the refusal can
come before the client's first send (as in CI); the tests make that order
certain by waiting until the client's socket has no peer left.
"""
import os
import shutil
import time

import pytest
import zmq

from harmony.client import Client, ClientError
from harmony.comm import security
from harmony.comm.zmqutil import make_socket

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def master(tmp_path):
    """(endpoint, key dir) of a CURVE ROUTER that admits its own key set only."""
    d = security.init_keys(str(tmp_path / "cluster"))
    ctx = zmq.Context()
    sock = make_socket(ctx, zmq.ROUTER, keys=security.Keys.load(d, "master"))
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    try:
        yield f"tcp://127.0.0.1:{port}", d
    finally:
        sock.close(linger=0)
        security.stop_authenticator(ctx)
        ctx.term()


def stranger(tmp_path, cluster_dir: str) -> security.Keys:
    """A client key of another key set that knows this cluster's server key
    (a removed key, a key from another cluster's set): its handshake reaches
    the master's ZAP handler, which refuses it."""
    d = security.init_keys(str(tmp_path / "stranger"))
    shutil.copy(os.path.join(cluster_dir, "cluster.key"), os.path.join(d, "cluster.key"))
    os.unlink(os.path.join(d, "cluster.key_secret"))
    return security.Keys.load(d, "client", "admin")


def wait_peerless(sock: zmq.Socket, within_s: float = 30.0) -> None:
    """Until ``sock`` cannot send (its handshake was refused, its peer dropped)."""
    deadline = time.monotonic() + within_s
    while sock.poll(0, zmq.POLLOUT):
        assert time.monotonic() < deadline, "the handshake was never refused"
        time.sleep(0.02)


def test_a_send_after_a_refused_handshake_times_out(master, tmp_path):
    endpoint, d = master
    ctx = zmq.Context()
    sock = make_socket(ctx, zmq.DEALER, keys=stranger(tmp_path, d))
    try:
        sock.connect(endpoint)
        wait_peerless(sock)
        assert sock.getsockopt(zmq.SNDTIMEO) > 0 and sock.getsockopt(zmq.RCVTIMEO) > 0
        sock.setsockopt(zmq.SNDTIMEO, 200)
        with pytest.raises(zmq.Again):
            sock.send(b"hello")
    finally:
        sock.close(linger=0)
        ctx.term()


def test_a_refused_key_is_named(master, tmp_path):
    endpoint, d = master
    with Client(endpoint, timeout_s=1, keys=stranger(tmp_path, d)) as c:
        for _ in range(2):      # and again on the fresh socket after the first error
            with pytest.raises(ClientError, match="refused this key") as err:
                c.jobs()
            assert err.value.code == "refused"


def test_a_refused_key_is_named_when_refused_before_the_first_send(master, tmp_path):
    endpoint, d = master
    with Client(endpoint, timeout_s=1, keys=stranger(tmp_path, d)) as c:
        wait_peerless(c.sock)
        with pytest.raises(ClientError, match="refused this key"):
            c.jobs()


def test_a_client_without_keys_gets_an_error_not_a_hang(master):
    endpoint, _ = master
    with Client(endpoint, timeout_s=1, insecure=True) as c:
        wait_peerless(c.sock)
        with pytest.raises(ClientError, match="did not complete the handshake within 1 s") \
                as err:
            c.jobs()
        assert err.value.code == "unreachable"
        assert "has no key" in str(err.value)
