"""Compile the kernels into numba's on-disk cache ahead of the first job:
``python -m harmony.kernels.warm [APPS_DIR]`` (``make venv`` runs it after
installing, so the compile counts in the install time, not in a job's
first epoch).

It runs one tiny epoch of each NMF solver and of LDA, and three of Lasso's
working-set solver, through ``run_local``,
so every kernel is compiled for the argument types the apps really pass (a
read-only array is a type of its own to numba)."""
from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

from harmony.app import load_app, run_local
from harmony.datagen.lasso import gen_lasso
from harmony.datagen.lda import gen_lda
from harmony.datagen.nmf import gen_nmf

APPS = Path(__file__).resolve().parents[2] / "apps"


def _tiny_runs(tmp: str, only: str | None = None) -> dict[str, list[list[str]]]:
    """Per kernel module, the bundled app that uses it (its file name) and
    the arguments of one tiny epoch for each of its kernel paths, on data
    generated in ``tmp``; with ``only`` (an app's file name), that app's
    alone (an executor's start-up generates no other app's data)."""
    out: dict[str, list[list[str]]] = {}
    if only in (None, "nmf.py"):
        nmf = os.path.join(tmp, "r.txt")
        gen_nmf(nmf, users=50, items=30, rank=2, per_user=5, seed=0)
        out["nmf.py"] = [["--input", nmf, "--rank", "4", "--max-epochs", "1", "--solver", s]
                         for s in ("als", "sgd")]
    if only in (None, "lda.py"):
        lda = os.path.join(tmp, "docword.txt")
        gen_lda(lda, docs=40, vocab=50, topics=3, doc_len=20, seed=0)
        out["lda.py"] = [["--input", lda, "--topics", "3", "--max-epochs", "1"]]
    if only in (None, "lasso.py"):
        lasso = os.path.join(tmp, "l.svm")
        gen_lasso(lasso, samples=60, features=20, nonzeros=4, seed=0)
        # three epochs: the first gradient, a working set, its block solve
        out["lasso.py"] = [["--input", lasso, "--lam", "0.01", "--max-epochs", "3"]]
    return out


#: which bundled app drives which kernel module
USES = {"harmony.kernels.nmf": "nmf.py", "harmony.kernels.lda": "lda.py",
        "harmony.kernels.lasso": "lasso.py"}


def warm(apps: Path = APPS) -> float:
    """Compile (or load) every kernel; returns the CPU seconds it took."""
    from harmony.kernels import finite
    c0 = time.process_time()
    with tempfile.TemporaryDirectory(prefix="harmony-warm-") as tmp:
        for name, runs in _tiny_runs(tmp).items():
            app = load_app((apps / name).read_text(), name)
            for args in runs:
                run_local(app, args)
    finite.load()           # the PS shard's check of pushes
    return time.process_time() - c0


def preload(app: type, name: str) -> float:
    """Load the compiled kernels a job's app uses into this process before
    its first epoch (an executor's start-up): one tiny epoch of each of its
    kernel paths. numba loads a kernel from its cache at the first call,
    0.5-0.7 s of CPU a process; in the first COMP that time made the
    master's first profile sample of a 10 ms COMP hundreds of ms, and its
    predictions 70-180% off for several epochs. Only for a bundled app that
    imported a kernel module (by its file name); returns the CPU seconds
    (0: nothing to load). Best effort: a failure here is the first epoch's
    to report."""
    if not any(m in sys.modules and USES[m] == name for m in USES):
        return 0.0
    c0 = time.process_time()
    try:
        with tempfile.TemporaryDirectory(prefix="harmony-preload-") as tmp:
            for args in _tiny_runs(tmp, name).get(name, ()):
                run_local(app, args)
    except Exception:           # noqa: BLE001 (best effort, see above)
        pass
    return time.process_time() - c0


if __name__ == "__main__":
    # python -m harmony.kernels.warm [APPS_DIR]: the repository's apps/ by
    # default (an installed, non-editable package has none: give the source's)
    apps = Path(sys.argv[1]) if len(sys.argv) > 1 else APPS
    if not (apps / "nmf.py").exists():
        print(f"harmony.kernels: no apps in {apps}: nothing compiled")
        sys.exit(0)
    print(f"harmony.kernels: compiled (or loaded) in {warm(apps):.1f} s CPU")
