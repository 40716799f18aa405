"""An emulated machine's cores shared by unqueued executors' CPU work
(harmony.worker.cpushare): other processes' work is seen through their
locks, a dead one's is not, and the stretch gives each piece of work its
share of the cores. Sleeps go to an injected clock."""
import os
import subprocess
import sys
import textwrap

import pytest

from harmony.worker.cpushare import CPUShare

HOLDER = textwrap.dedent("""
    import sys
    from harmony.worker.cpushare import CPUShare
    share = CPUShare(sys.argv[1], 1)
    with share.busy():
        print("busy", flush=True)
        sys.stdin.readline()           # until the test closes our stdin
    share.close()
""")


class FakeClock:
    def __init__(self):
        self.now = 0.0
        self.sleeps = []

    def sleep(self, s):
        self.sleeps.append(s)
        self.now += s

    def __call__(self):
        return self.now


@pytest.fixture
def holder(tmp_path):
    """Another executor's process, computing on the machine until closed."""
    procs = []

    def start():
        p = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": os.getcwd()})
        procs.append(p)
        assert p.stdout.readline().strip() == "busy"
        return p
    yield start
    for p in procs:
        if p.poll() is None:
            p.stdin.close()
            p.wait(timeout=30)


def test_alone_the_work_has_the_core_to_itself(tmp_path):
    share = CPUShare(str(tmp_path), cores=1)
    clock = FakeClock()
    assert share.running() == 0
    with share.busy():
        assert share.running() == 1
        slept = share.stretch_to(0.1, 1.0, sleep=clock.sleep, clock=clock)
    assert slept == pytest.approx(0.9)
    assert max(clock.sleeps) <= CPUShare.SLICE_S + 1e-12   # n read at every slice
    share.close()
    assert not os.listdir(tmp_path)


def test_two_pieces_of_work_on_one_core_each_get_half(tmp_path, holder):
    p = holder()
    share = CPUShare(str(tmp_path), cores=1)
    clock = FakeClock()
    with share.busy():
        assert share.running() == 2
        # its compute (0.1 s) counted at half speed, the rest slept at half speed
        assert share.stretch_to(0.1, 1.0, sleep=clock.sleep, clock=clock) \
            == pytest.approx((1.0 - 0.05) / 0.5)
    two = CPUShare(str(tmp_path), cores=2)
    with two.busy():                    # two cores: each piece of work has one
        assert two.stretch_to(0.1, 1.0, sleep=clock.sleep, clock=clock) == pytest.approx(0.9)
    p.kill()                            # a dead executor's lock goes with it
    p.wait(timeout=30)
    assert share.running() == 0
    share.close()
    two.close()
    CPUShare(str(tmp_path), cores=1).close()    # a new one sweeps the dead one's file
    assert not os.listdir(tmp_path)


def test_an_idle_executor_does_not_count(tmp_path, holder):
    p = holder()
    idle = CPUShare(str(tmp_path), cores=1)     # exists, computes nothing
    mine = CPUShare(str(tmp_path), cores=1)
    with mine.busy():
        assert mine.running() == 2              # the holder and this one, not `idle`
    p.stdin.close()
    p.wait(timeout=30)
    with mine.busy():
        assert mine.running() == 1
    idle.close()
    mine.close()
