"""Every registered policy in the simulator on a fixed 12-job paper trace
(``tests/data/paper12.csv``, 40 machines, grain 20) gives the per-job JCTs
recorded in ``tests/data/paper12_jct.json``: a refactoring of the policies,
the master core or the simulator must not change a single decision.

The expected values were generated before the policies moved to
``harmony.policies``. When a change of behaviour is intended, regenerate
them (and say why in the commit)::

    PYTHONPATH=. python tests/test_sim_golden.py --write

The runs are made in a child process whose OpenBLAS uses its generic
x86-64 kernels (``OPENBLAS_CORETYPE=Prescott``): the loss-curve fits of
SLAQ go through BLAS, whose FMA kernels (chosen on Haswell and Zen CPUs)
round differently, and that changed SLAQ's decisions (per-job JCTs 12-44%
apart on an AMD EPYC): SLAQ's choices turn on the last bits of its fits.
Where numpy does not use OpenBLAS, or not on x86-64, the variable does
nothing and the recorded values may not hold.
"""
from __future__ import annotations

import json
import os
import subprocess
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


def run_all(names: list[str]) -> dict[str, dict[str, float | None]]:
    """``run`` of each setup, in a child process with OpenBLAS's generic
    kernels (see the module docstring)."""
    env = dict(os.environ, OPENBLAS_CORETYPE="Prescott", OPENBLAS_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(DATA.parent.parent)] + [
                   x for x in [os.environ.get("PYTHONPATH")] if x]))
    try:
        out = subprocess.run([sys.executable, __file__, "--json", *names], env=env,
                             capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the setups' runs took over {exc.timeout} s:\n{exc.stderr or ''}")
    if out.returncode:
        pytest.fail(f"the setups' runs failed (exit {out.returncode}):\n{out.stderr[-5000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])     # the last line: the results


GOLDEN = json.loads(EXPECTED.read_text()) if EXPECTED.exists() else {}


@pytest.fixture(scope="module")
def results() -> dict[str, dict[str, float | None]]:
    return run_all(sorted(set(GOLDEN) & set(setups())))


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_policy_jcts_unchanged(name: str, results) -> None:
    assert name in setups(), f"{name} is no longer registered"
    got = results[name]
    want = GOLDEN[name]
    assert sorted(got) == sorted(want)
    # exact up to float noise across platforms (numpy / scipy builds)
    assert got == pytest.approx(want, rel=1e-9, abs=1e-9)


def test_every_setup_is_covered() -> None:
    assert set(setups()) <= set(GOLDEN)


if __name__ == "__main__":      # regenerate (see the module docstring)
    if sys.argv[1:2] == ["--json"]:         # run_all's child
        print(json.dumps({name: run(name) for name in sys.argv[2:]}))
        sys.exit(0)
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: PYTHONPATH=. python tests/test_sim_golden.py --write")
    from harmony.sim.trace import save_trace
    from harmony.sim.workload import generate
    if not TRACE.exists():
        save_trace(generate("paper", 12, SEED), TRACE)
    out = run_all(setups())
    EXPECTED.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"{len(out)} setups -> {EXPECTED}")
