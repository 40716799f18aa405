"""The executor's core (harmony.worker.executor_core): what an executor does
with the master's ``epoch_sums`` answer, as commands in order. The process
executor and the simulator's executor both drive it."""
from __future__ import annotations

from harmony.worker import executor_core as core
from harmony.worker.executor_core import (Checkpoint, Continue, EpochSums, FinalCheckpoint,
                                          Pause, Reconfigure, Report, SetPrio, handle)


def cmds(answer: dict, stop: bool = False, index: int = 0, epoch: int = 4) -> list:
    return handle(EpochSums(epoch, index, stop, {"epoch": epoch, "sums": {}, **answer}))


def test_an_ordinary_boundary_reports_and_goes_on():
    assert cmds({}) == [Report(4, False, True), Continue(5)]
    # only executor 0 reports to the master; every executor logs the epoch
    assert cmds({}, index=2) == [Report(4, False, False), Continue(5)]


def test_the_priorities_come_first_when_the_answer_has_them():
    assert cmds({"prio": [1.5, 2]})[0] == SetPrio(1.5, 2.0)
    # malformed: ignored
    for bad in ([1.0], "x", [1.0, "a"], None):
        assert not any(isinstance(c, SetPrio) for c in cmds({"prio": bad}))


def test_stop_by_the_executors_rule_or_the_masters_ends_with_the_final_checkpoint():
    assert cmds({}, stop=True) == [Report(4, True, True), FinalCheckpoint(4)]
    assert cmds({"stop": True}, index=1) == [Report(4, True, False), FinalCheckpoint(4)]
    # a stop wins over everything else the answer asks for
    assert cmds({"stop": True, "pause": True, "checkpoint": True, "reconfig": True})[-1] \
        == FinalCheckpoint(4)


def test_a_pause_writes_a_part_and_exits():
    assert cmds({"pause": True}) == [Report(4, False, True), Pause(4)]
    assert cmds({"pause": True, "checkpoint": True, "reconfig": True})[-1] == Pause(4)


def test_a_periodic_checkpoint_comes_before_the_next_epoch_or_the_resize():
    assert cmds({"checkpoint": True}) == [Report(4, False, True), Checkpoint(4), Continue(5)]
    assert cmds({"checkpoint": True, "reconfig": True}) == [
        Report(4, False, True), Checkpoint(4), Reconfigure(4)]
    assert cmds({"reconfig": True}) == [Report(4, False, True), Reconfigure(4)]


def test_the_core_is_pure():
    """No sockets, no stores: the simulator imports it without them."""
    import subprocess
    import sys
    code = ("import sys, harmony.worker.executor_core\n"
            "print(sorted(m for m in ('zmq', 'lmdb', 'harmony.worker.executor') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
    assert core.handle.__module__ == "harmony.worker.executor_core"
