"""A run's phase (``harmony.master.core.records``): the phases that may be
under way together, driven through the real core (``tests/coredriver.py``
checks ``MasterCore.validate`` after every event); the moves of the phase
(``TRANSITIONS``, ``Run.enter``, ``Run.leave``), pure."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from harmony.master.core import records
from harmony.master.core.records import TRANSITIONS, Phase, PhaseError, Reconfig, Run
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


def test_a_pause_asked_before_the_executors_are_ready_or_asked_twice():
    """A pause may be asked while the run launches: its executors get ready
    under it (no move of its phase) and it pauses at its first epoch end. A
    pause asked again on its way is taken (no move either)."""
    d = CoreDriver(2, mode="naive", ready=False)
    j = d.submit(machines=2, epochs=10)
    d.tick()
    run = d.core.runs[j]
    assert run.phase is Phase.LAUNCHING
    d.deliver(d.client, "pause", job=j)
    assert run.phase is Phase.PAUSING and not run.started
    d.ready(j)
    assert run.phase is Phase.PAUSING and run.started
    assert [s.to for s in d.sent if s.type == "job_start"] == [
        x.ident for x in d.executors(j)]
    d.deliver(d.client, "pause", job=j)                         # asked again
    assert [(s.type, s.fields.get("info", {}).get("state")) for s in d.sent
            if s.to == d.client][-2:] == [("ok", "pausing")] * 2
    d.epochs({j: work(1.0, 0.1)})
    job = d.core.jobs[j]
    assert job.state == JobState.PAUSED and job.held and j not in d.core.runs
    assert job.resume["epoch"] == 1


# -- the transition table (pure) --------------------------------------------------------
def _flags(run: Run) -> tuple:
    return (run.started, run.pausing, run.pause_to, run.pause_note, run.reconfig,
            run.stopping, run.ending)


def _enter(run: Run, phase: Phase) -> None:
    run.enter(phase, note="why", to=["m1"],
              reconfig=Reconfig(to=["m0", "m1"], join=["m1"], note="", t0=0.0))


def _walk() -> set:
    """Every run Run.enter and Run.leave can make from a new one (each try
    of every phase in every run reached): the moves of its phase made. A
    try that raises must leave the run as it was; every run reached must
    pass validate."""
    seen, moves = set(), set()
    todo = [[]]
    while todo:
        path = todo.pop()
        for op in ("enter", "leave"):
            for phase in Phase:
                run = Run(attempt=1, launched=0.0)
                for o, p in path:
                    _enter(run, p) if o == "enter" else run.leave(p)
                old, before = run.phase, _flags(run)
                try:
                    _enter(run, phase) if op == "enter" else run.leave(phase)
                except PhaseError:
                    assert _flags(run) == before, (path, op, phase)
                    continue
                run.validate()
                new = run.phase
                if new is not old:
                    assert new in TRANSITIONS[old], (path, op, phase)
                    moves.add((old, new))
                key = (run.started,) + tuple(sorted(p.value for p in run._on()))
                if key not in seen:
                    seen.add(key)
                    todo.append(path + [(op, phase)])
    return moves


def test_the_table_covers_every_phase_and_every_move_is_made():
    assert set(TRANSITIONS) == set(Phase)
    assert all(isinstance(q, Phase) and q is not p for p, qs in TRANSITIONS.items() for q in qs)
    moves = _walk()
    # every move of the table is one enter or leave makes, and no other
    assert moves == {(p, q) for p, qs in TRANSITIONS.items() for q in qs}
    assert {p for m in moves for p in m} == set(Phase)


def test_a_move_not_in_the_table_raises_and_changes_nothing():
    run = Run(attempt=1, launched=0.0)
    with pytest.raises(PhaseError, match="launching -> resizing"):
        _enter(run, Phase.RESIZING)           # a resize needs running executors
    with pytest.raises(PhaseError, match="leaving pausing"):
        run.leave(Phase.PAUSING)
    run.enter(Phase.PAUSING, to=None, note="paused by user")
    before = _flags(run)
    for phase in (Phase.RESIZING, Phase.ENDING, Phase.PAUSING):
        with pytest.raises(PhaseError, match=f"pausing -> {phase.value}"):
            _enter(run, phase)
        assert _flags(run) == before
    with pytest.raises(PhaseError, match="leaving pausing"):
        run.leave(Phase.PAUSING)                # a pause is never undone
    run.enter(Phase.RUNNING)                    # its executors got ready meanwhile: no move
    assert run.phase is Phase.PAUSING and run.started
    run.enter(Phase.STOPPING)                   # its last epoch came first
    for phase in Phase:
        with pytest.raises(PhaseError):
            _enter(run, phase)                  # nothing leaves STOPPING
    # a resize: back to RUNNING when committed, or under a stop
    run = Run(attempt=1, launched=0.0)
    run.enter(Phase.RUNNING)
    _enter(run, Phase.RESIZING)
    run.leave(Phase.RESIZING)
    assert run.phase is Phase.RUNNING and run.reconfig is None
    _enter(run, Phase.RESIZING)
    run.enter(Phase.STOPPING)
    assert run.phase is Phase.STOPPING and run.reconfig is not None
    run.leave(Phase.RESIZING)
    assert run.phase is Phase.STOPPING and run.reconfig is None


def test_only_run_enter_and_leave_write_a_runs_phase():
    """The core's components change a run's phase flags only through
    Run.enter and Run.leave (records.py)."""
    write = re.compile(r"\b(run|r)\.(started|pausing|stopping|ending|reconfig)\s*(,[^=]*)?=(?!=)")
    core = Path(records.__file__).parent
    found = [f"{p.name}:{i}: {line.strip()}" for p in sorted(core.glob("*.py"))
             if p.name != "records.py"
             for i, line in enumerate(p.read_text().splitlines(), 1) if write.search(line)]
    assert not found, found
