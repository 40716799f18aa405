"""A machine's network use from its NICs' counters (harmony.worker.nicstats),
with injected counters; and the real ones of this machine."""
from types import SimpleNamespace as NS

import pytest

from harmony.worker.nicstats import DEFAULT_SPEED, NicMeter, _counters, _speeds


def test_utilization_is_the_busier_direction_over_the_nics_speed():
    box = {"eth0": NS(bytes_sent=0, bytes_recv=0), "lo": NS(bytes_sent=0, bytes_recv=0)}
    m = NicMeter(counters=lambda: box, speeds=lambda: {"eth0": 125e6})   # 1 Gbit/s
    assert m.read(0.0) is None                         # the counters to count from
    box["eth0"] = NS(bytes_sent=50e6, bytes_recv=10e6)
    box["lo"] = NS(bytes_sent=9e9, bytes_recv=9e9)     # loopback: not the network
    sent, recv, util = m.read(2.0)
    assert (sent, recv) == (50e6, 10e6) and util == pytest.approx(0.2)
    box["eth0"] = NS(bytes_sent=50e6 + 500e6, bytes_recv=10e6)
    assert m.read(1.0)[2] == 1.0                       # capped
    # an unknown speed (virtual NICs report 0): the default, or the link given
    m = NicMeter(counters=lambda: box, speeds=lambda: {"eth0": 0.0})
    m.read(0.0)
    box["eth0"] = NS(bytes_sent=box["eth0"].bytes_sent + DEFAULT_SPEED, bytes_recv=0)
    assert m.read(1.0)[2] == pytest.approx(1.0)
    m = NicMeter(link=1e6, counters=lambda: box, speeds=lambda: {"eth0": 0.0})
    m.read(0.0)
    box["eth0"] = NS(bytes_sent=box["eth0"].bytes_sent + 0.5e6, bytes_recv=0)
    assert m.read(1.0)[2] == pytest.approx(0.5)


def test_this_machines_nics_read_without_error():
    """The real psutil path: loopback is never counted, and two reads give
    non-negative byte counts and a utilization in [0, 1]."""
    assert "lo" not in _speeds() and isinstance(_counters(), dict)
    m = NicMeter()
    m.read(0.0)
    sent, recv, util = m.read(1.0)
    assert sent >= 0 and recv >= 0 and 0.0 <= util <= 1.0
