"""Compile the kernels into numba's on-disk cache ahead of the first job:
``python -m harmony.kernels.warm [APPS_DIR]`` (``make venv`` runs it after
installing, so the compile counts in the install time, not in a job's
first epoch).

It runs one tiny epoch of each NMF solver and of LDA through ``run_local``,
so every kernel is compiled for the argument types the apps really pass (a
read-only array is a type of its own to numba)."""
from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

from harmony.app import load_app, run_local
from harmony.datagen.lda import gen_lda
from harmony.datagen.nmf import gen_nmf

APPS = Path(__file__).resolve().parents[2] / "apps"


def warm(apps: Path = APPS) -> float:
    """Compile (or load) every kernel; returns the CPU seconds it took."""
    c0 = time.process_time()
    with tempfile.TemporaryDirectory(prefix="harmony-warm-") as tmp:
        data = os.path.join(tmp, "r.txt")
        gen_nmf(data, users=50, items=30, rank=2, per_user=5, seed=0)
        nmf = load_app((apps / "nmf.py").read_text(), "nmf.py")
        for solver in ("als", "sgd"):
            run_local(nmf, ["--input", data, "--rank", "4", "--max-epochs", "1",
                            "--solver", solver])
        data = os.path.join(tmp, "docword.txt")
        gen_lda(data, docs=40, vocab=50, topics=3, doc_len=20, seed=0)
        run_local(load_app((apps / "lda.py").read_text(), "lda.py"),
                  ["--input", data, "--topics", "3", "--max-epochs", "1"])
    return time.process_time() - c0


if __name__ == "__main__":
    # python -m harmony.kernels.warm [APPS_DIR]: the repository's apps/ by
    # default (an installed, non-editable package has none: give the source's)
    apps = Path(sys.argv[1]) if len(sys.argv) > 1 else APPS
    if not (apps / "nmf.py").exists():
        print(f"harmony.kernels: no apps in {apps}: nothing compiled")
        sys.exit(0)
    print(f"harmony.kernels: compiled (or loaded) in {warm(apps):.1f} s CPU")
