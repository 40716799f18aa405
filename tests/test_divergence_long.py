"""Long runs of every bundled app at its defaults on small data: a job far
past convergence (SGD noise around its minimum) is never failed as diverged
(the hardening issue: an NMF job failed at epoch ~2,600 on a 0.6% rise).
The real divergence checks stay in test_app_api.py and test_app_mlr.py."""
from __future__ import annotations

import pytest

from harmony.app import load_app, run_local
from harmony.datagen.lasso import gen_lasso
from harmony.datagen.lda import gen_lda
from harmony.datagen.mlr import gen_mlr
from harmony.datagen.nmf import gen_nmf
from conftest import ROOT

EPOCHS = 400


def _data(app: str, d) -> list[str]:
    p = str(d / f"{app}.txt")
    if app == "nmf":
        gen_nmf(p, users=300, items=120, rank=4, per_user=30, noise=0.3, seed=2,
                activity="zipf")
        return ["--input", p, "--rank", "4"]
    if app == "lda":
        gen_lda(p, docs=150, vocab=200, topics=5, doc_len=40, seed=2)
        return ["--input", p, "--topics", "5"]
    if app == "mlr":
        gen_mlr(p, samples=600, features=80, classes=5, nnz=10, noise=1.0, seed=2)
        return ["--input", p]
    gen_lasso(p, samples=400, features=60, nonzeros=8, noise=0.5, seed=2)
    return ["--input", p]


@pytest.mark.parametrize("app", ["nmf", "lda", "mlr", "lasso"])
def test_a_long_run_at_the_defaults_is_not_failed_as_diverged(tmp_path, app):
    cls = load_app((ROOT / "apps" / f"{app}.py").read_text(), f"{app}.py")
    res = run_local(cls, _data(app, tmp_path) + ["--max-epochs", str(EPOCHS)])
    assert len(res.history) == EPOCHS
    objs = [h["objective"] for h in res.history]
    assert min(objs) < objs[0]
