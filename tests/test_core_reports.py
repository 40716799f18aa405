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


def test_only_the_jobs_left_waiting_wait_behind_the_first_that_cannot_be_profiled():
    """Three jobs submitted at once on two machines: the harmony policy
    profiles the first two on the idle machines and the third waits (no
    machine idle, and no room beside jobs not yet profiled). The reason
    "waits behind" is for jobs queued after it, not for the two it
    profiles in the same decision (their submission times tie with it)."""
    d = CoreDriver(2)
    a, b, c = d.submit(epochs=5), d.submit(epochs=5), d.submit(epochs=5)
    d.tick()
    jobs = d.core.jobs
    assert [jobs[x].state.value for x in (a, b, c)] == ["profiling", "profiling", "waiting"]
    assert jobs[a].submitted == jobs[c].submitted
    assert "no room to profile it" in jobs[c].reason
    assert (jobs[a].reason, jobs[b].reason) == ("", "")
    e = d.submit(epochs=5)          # later: it does wait behind the third
    d.tick()
    assert jobs[e].reason.startswith(f"waits behind {c}")
