"""A server's ROUTER and a peer that stops reading: a reply gives up after
ROUTER_SEND_S (and is dropped by the server) instead of blocking it for good;
a transfer waits for the peer up to its own timeout, then fails clearly."""
import time

import pytest
import zmq

from harmony.comm import zmqutil
from harmony.store import transfer
from harmony.store.transfer import Payload, TransferError, send_payloads


@pytest.fixture
def pair():
    ctx = zmq.Context()
    router = zmqutil.make_socket(ctx, zmq.ROUTER)
    router.setsockopt(zmq.SNDHWM, 4)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    peer = zmqutil.make_socket(ctx, zmq.DEALER, identity=b"slow", timeout_s=5)
    peer.setsockopt(zmq.RCVHWM, 4)
    peer.connect(f"tcp://127.0.0.1:{port}")
    peer.send(b"hello")                       # the router learns the peer
    assert router.poll(5000) and router.recv_multipart()[0] == b"slow"
    yield router, peer
    router.close(linger=0)
    peer.close(linger=0)
    ctx.term()


def test_a_reply_to_a_peer_that_does_not_read_gives_up(pair):
    router, _ = pair
    t0 = time.monotonic()
    with pytest.raises(zmq.Again):
        for _ in range(100000):              # never read: the queues fill
            router.send_multipart([b"slow", b"x" * 65536])
    assert time.monotonic() - t0 < 10 * zmqutil.ROUTER_SEND_S + 5


def test_a_transfer_to_a_peer_that_does_not_read_fails_after_its_timeout(pair, monkeypatch):
    router, _ = pair
    monkeypatch.setattr(transfer, "SEND_TIMEOUT_MS", 3000)
    t0 = time.monotonic()
    with pytest.raises(TransferError, match="not reading"):
        send_payloads([router], "m", [Payload("data", 0, b"y" * (64 << 20))],
                      prefix=[b"slow"], chunk=65536)
    assert 2.5 < time.monotonic() - t0 < 20
