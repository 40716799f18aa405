"""Every registered policy in the simulator on a fixed 12-job paper trace
(``tests/data/paper12.csv``, 40 machines, grain 20) gives the per-job JCTs
recorded in ``tests/data/paper12_jct.json``: a refactoring of the policies,
the master core or the simulator must not change a single decision.

The expected values were generated before the policies moved to
``harmony.policies``. When a change of behaviour is intended, regenerate
them (and say why in the commit)::

    PYTHONPATH=. python tests/test_sim_golden.py --write
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from harmony.sim.run import simulate
from harmony.sim.trace import load_trace

DATA = Path(__file__).resolve().parent / "data"
TRACE = DATA / "paper12.csv"
EXPECTED = DATA / "paper12_jct.json"
MACHINES, GRAIN, SEED = 40, 20, 3


def setups() -> list[str]:
    from harmony.policies.registry import MODES, POLICIES
    return sorted(set(POLICIES) | set(MODES))


def run(name: str) -> dict[str, float | None]:
    # validate: the core's invariants (MasterCore.validate) after every instant
    res = simulate(load_trace(TRACE), MACHINES, name, grain=GRAIN, seed=SEED, validate=True)
    return {j.id: j.end - j.arrival for j in res.jobs}


GOLDEN = json.loads(EXPECTED.read_text()) if EXPECTED.exists() else {}


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_policy_jcts_unchanged(name: str) -> None:
    assert name in setups(), f"{name} is no longer registered"
    got = run(name)
    want = GOLDEN[name]
    assert sorted(got) == sorted(want)
    # exact up to float noise across platforms (numpy / scipy builds)
    assert got == pytest.approx(want, rel=1e-9, abs=1e-9)


def test_every_setup_is_covered() -> None:
    assert set(setups()) <= set(GOLDEN)


if __name__ == "__main__":      # regenerate (see the module docstring)
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: PYTHONPATH=. python tests/test_sim_golden.py --write")
    from harmony.sim.trace import save_trace
    from harmony.sim.workload import generate
    if not TRACE.exists():
        save_trace(generate("paper", 12, SEED), TRACE)
    out = {name: run(name) for name in setups()}
    EXPECTED.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"{len(out)} setups -> {EXPECTED}")
