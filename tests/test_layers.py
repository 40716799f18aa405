"""The import contracts of pyproject.toml's [tool.importlinter] hold
(``lint-imports``): the master does not import the simulator, the layers
sim > master > policies > sched, no ZeroMQ or LMDB under the policies and
the scheduler's core, and comm, store and ps import none of the master,
the workers or the simulator."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINT = "from importlinter.cli import lint_imports_command as c; c()"


def lint(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.run([sys.executable, "-c", LINT, "--no-cache", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)


def test_import_contracts_are_kept():
    r = lint()
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout and "KEPT" in r.stdout


def test_a_broken_contract_is_caught(tmp_path):
    """The check is not vacuous: the simulator does import the master."""
    cfg = tmp_path / "contracts.toml"
    cfg.write_text('[tool.importlinter]\nroot_package = "harmony"\n\n'
                   '[[tool.importlinter.contracts]]\nname = "inverted"\ntype = "forbidden"\n'
                   'source_modules = ["harmony.sim"]\nforbidden_modules = ["harmony.master"]\n')
    r = lint("--config", str(cfg))
    assert r.returncode != 0 and "inverted BROKEN" in r.stdout, r.stdout + r.stderr
