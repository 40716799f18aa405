"""What the master core keeps of its executors' epoch reports (the job's
epochs and the profile the policies see), and the reasons it gives waiting
jobs, through the real core (``tests/coredriver.py`` checks
``MasterCore.validate`` after every event)."""
from __future__ import annotations

from coredriver import CoreDriver, work


def test_a_duplicate_epoch_report_changes_nothing():
    """An ``epoch_report`` for an epoch the core has already recorded (a
    resent message) neither adds a second row for that epoch nor feeds the
    profile's averages again; the next epoch is recorded as usual."""
    d = CoreDriver(1, mode="naive")
    j = d.submit(epochs=5)
    d.tick()
    d.epochs({j: work(1.0, 0.1)})
    job = d.core.jobs[j]
    before = ([e["epoch"] for e in job.epochs], dict(job.profile))
    assert before[0] == [0] and before[1]["samples"] == 1
    x = d.executors(j)[0]
    x.send("epoch_report", epoch=0, metrics={"objective": 0.0}, stop=False)
    assert ([e["epoch"] for e in job.epochs], job.profile) == before
    d.epochs({j: work(1.0, 0.1)})
    assert [e["epoch"] for e in job.epochs] == [0, 1] and job.profile["samples"] == 2
