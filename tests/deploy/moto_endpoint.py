"""Run a moto server (a local AWS API) on 127.0.0.1 at a free port.

Prints ``PORT <n>`` once it listens, then serves until SIGTERM/SIGINT or
until its standard input closes (so it never outlives the test that started
it). Run it inside a network namespace to be sure nothing reaches a real
AWS endpoint.
"""
from __future__ import annotations

import signal
import sys
import threading

from moto.server import ThreadedMotoServer


def main() -> None:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    port = server.get_host_and_port()[1]
    print(f"PORT {port}", flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    done.wait()
    server.stop()


if __name__ == "__main__":
    main()
