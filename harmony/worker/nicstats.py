"""A machine's network use from its NICs' counters (psutil), for machines
without an emulated link (a real fleet): bytes sent and received since the
last reading over the time between, against the NICs' speed.

Loopback and NICs that are down are left out: on a real machine the
parameter-server traffic between machines crosses its NICs, and traffic to
its own shard stays in the process or on loopback. A daemon uses it when
it has no emulated link and does not run on 127.0.0.1: the daemons of a
local cluster share one host's NICs and loopback, so no machine's traffic
can be told apart there; the emulated links (``--net-bandwidth``,
:mod:`harmony.worker.netem`) count it instead.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import psutil

#: a NIC whose speed the kernel does not know (virtual NICs say 0) counts
#: at this rate unless the daemon is told its link (bytes/s): 10 Gbit/s,
#: the low end of the cloud instances the playbooks deploy to
DEFAULT_SPEED = 10e9 / 8


def _counters() -> Mapping[str, Any]:
    return psutil.net_io_counters(pernic=True)


def _speeds() -> dict[str, float]:
    """Bytes/s of every NIC that is up, except loopback (0: not known)."""
    out = {}
    for nic, st in psutil.net_if_stats().items():
        if st.isup and nic != "lo" and "loopback" not in str(getattr(st, "flags", "")):
            out[nic] = st.speed * 1e6 / 8 if st.speed else 0.0
    return out


class NicMeter:
    """``read(dt)``: (bytes sent, bytes received, utilization 0..1) over the
    ``dt`` seconds since the previous read (None on the first). The
    utilization is the busier direction over the NICs' summed speed
    (``link``, bytes/s, where given; else the kernel's, with
    ``DEFAULT_SPEED`` for a NIC that reports none). ``counters`` and
    ``speeds`` are injectable for tests."""

    def __init__(self, link: float | None = None,
                 counters: Callable[[], Mapping[str, Any]] = _counters,
                 speeds: Callable[[], dict[str, float]] = _speeds) -> None:
        self.link, self.counters, self.speeds = link, counters, speeds
        self.prev: tuple[float, float] | None = None

    def read(self, dt: float) -> tuple[float, float, float] | None:
        nics = self.speeds()
        now = self.counters()
        sent = float(sum(now[n].bytes_sent for n in nics if n in now))
        recv = float(sum(now[n].bytes_recv for n in nics if n in now))
        prev, self.prev = self.prev, (sent, recv)
        if prev is None or dt <= 0:
            return None
        ds, dr = max(0.0, sent - prev[0]), max(0.0, recv - prev[1])
        speed = self.link or sum(s or DEFAULT_SPEED for s in nics.values())
        return ds, dr, (min(1.0, max(ds, dr) / (dt * speed)) if speed > 0 else 0.0)
