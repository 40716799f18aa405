"""Machines with NICs of their own on one host, for tests: network
namespaces, each joined to a bridge in the root namespace by a veth pair.

``Fabric(n)`` makes a bridge holding the root namespace's address
(``fabric.root``, x.x.x.1 of a private /24 no route of this host uses) and
``n`` namespaces, namespace ``i`` with address ``fabric.addrs[i]`` on its
end of its veth pair (loopback up too). Traffic between the namespaces, and
between one of them and the root namespace, crosses the veths: each
namespace's NIC counters (``/proc/net/dev`` there) count its own. Root
only (``unavailable()`` says why not); ``close()`` deletes the namespaces
(and with them their veths), the bridge, and kills what still runs in
them (only what the test started can be in a namespace of its own).
"""
from __future__ import annotations

import ipaddress
import os
import shutil
import signal
import subprocess
import time

_IP_TIMEOUT = 10


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=_IP_TIMEOUT)
    if check and r.returncode != 0:
        raise OSError(f"ip {' '.join(args)}: {r.stderr.strip() or r.returncode}")
    return r


def unavailable() -> str | None:
    """Why network namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces and veth pairs need root"
    if shutil.which("ip") is None:
        return "no 'ip' command (iproute2)"
    name = f"hprobe{os.getpid()}"
    try:
        r = _ip("netns", "add", name, check=False)
        if r.returncode != 0:
            return f"'ip netns add' failed: {r.stderr.strip()}"
    finally:
        _ip("netns", "del", name, check=False)
    return None


def _free_subnet() -> ipaddress.IPv4Network:
    """A private /24 that no address or route of this host touches."""
    used = []
    for line in _ip("-4", "route", "show", "table", "all").stdout.splitlines() \
            + _ip("-4", "-o", "addr").stdout.splitlines():
        for word in line.split():
            try:
                used.append(ipaddress.ip_network(word, strict=False))
            except ValueError:
                continue
    used = [u for u in used if u.prefixlen > 0]      # not the default route
    start = os.getpid() % 200
    for k in range(200):
        net = ipaddress.ip_network(f"10.213.{(start + k) % 200 + 20}.0/24")
        if not any(net.overlaps(u) for u in used):
            return net
    raise OSError("no free 10.213.x.0/24 on this host")


class Fabric:
    def __init__(self, n: int, tag: str | None = None) -> None:
        # names of at most 15 characters, unique to this process
        self.tag = tag or f"hx{os.getpid() % 100000}"
        self.bridge = f"{self.tag}br"
        self.names = [f"{self.tag}n{i}" for i in range(n)]
        self.veths = [f"{self.tag}v{i}" for i in range(n)]
        self.made: list[str] = []           # what close() undoes, in order made
        try:
            net = _free_subnet()
            hosts = list(net.hosts())
            self.root = str(hosts[0])
            self.addrs = [str(hosts[i + 1]) for i in range(n)]
            _ip("link", "add", self.bridge, "type", "bridge")
            self.made.append("bridge")
            _ip("addr", "add", f"{self.root}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for name, veth, addr in zip(self.names, self.veths, self.addrs):
                _ip("netns", "add", name)
                self.made.append(name)
                _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", name)
                _ip("link", "set", veth, "master", self.bridge)
                _ip("link", "set", veth, "up")
                _ip("-n", name, "addr", "add", f"{addr}/24", "dev", "eth0")
                _ip("-n", name, "link", "set", "eth0", "up")
                _ip("-n", name, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise

    def exec_prefix(self, i: int) -> list[str]:
        """Run a command in namespace ``i``: this, then the command."""
        return ["ip", "netns", "exec", self.names[i]]

    def pids(self, i: int) -> list[int]:
        r = _ip("netns", "pids", self.names[i], check=False)
        return [int(p) for p in r.stdout.split() if p.isdigit()]

    def close(self) -> None:
        """Kill what still runs in the namespaces, delete them (their veths
        go with them) and the bridge; never raises, safe to call twice."""
        for name in self.made:
            if name == "bridge":
                continue
            i = self.names.index(name)
            for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 2.0)):
                pids = self.pids(i)
                for pid in pids:
                    try:
                        os.kill(pid, sig)
                    except OSError:
                        pass
                deadline = time.monotonic() + wait
                while pids and time.monotonic() < deadline:
                    time.sleep(0.1)
                    pids = self.pids(i)
                if not pids:
                    break
        for name in reversed(self.made):
            try:
                if name == "bridge":
                    _ip("link", "del", self.bridge, check=False)
                else:
                    # the pair goes now, not when the kernel frees the namespace
                    _ip("link", "del", self.veths[self.names.index(name)], check=False)
                    _ip("netns", "del", name, check=False)
            except (OSError, subprocess.SubprocessError):
                pass
        self.made.clear()

    def __enter__(self) -> "Fabric":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
