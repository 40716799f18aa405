"""A run's phase (``harmony.master.core.records``): the phases that may be
under way together, driven through the real core (``tests/coredriver.py``
checks ``MasterCore.validate`` after every event)."""
from __future__ import annotations

from harmony.master.jobs import JobState
from coredriver import CoreDriver, work


def test_a_pause_asked_in_the_last_epoch_ends_in_a_stop():
    """The pause comes with the last epoch's sums, but the executors' own
    stop rule comes first (final checkpoint, exec_finished): the run is
    stopping while pausing, and the job finishes with its model kept."""
    d = CoreDriver(2, mode="naive")
    j = d.submit(machines=2, epochs=2)
    d.tick()
    d.epochs({j: work(1.0, 0.1)})
    d.deliver(d.client, "pause", job=j)
    assert d.core.runs[j].pausing
    d.epochs({j: work(1.0, 0.1)})
    job = d.core.jobs[j]
    assert job.state == JobState.FINISHED and len(job.epochs) == 2
    assert job.checkpoint["final"] and j not in d.core.runs
    assert not [s for s in d.sent if s.type == "launch" and s.fields["attempt"] > 1]
