"""Quality table: every app against its scikit-learn / NumPy / plain-torch
reference on two data sets each, on 1 and 2 machines of a local cluster.

    python bench/apps_quality.py [--out table.md] [--only nmf,mlr]

Rows (data generated in a temporary directory, seeded; sklearn's data sets
are shipped with scikit-learn):

* nmf: held-out RMSE against non-negative ALS (exact NNLS per row, L2 per
  rating; the best of lambda 0.003 / 0.01 / 0.03 / 0.1 on the held-out
  ratings, 40 sweeps: ``tests/nmf_reference.py``), same split.
  MovieLens-shaped (``--activity zipf``), uniform planted data, and small
  skewed sets (400 users, ~30k ratings, activity exponent 2 sorted by user
  and 1.3 shuffled: issue #36); default app options.
* mlr: test accuracy against ``LogisticRegression`` with the same L2.
  Digits (tuned ``--lr 2 --batch-size 32``) and standardized dense data of
  width 100 with 10% label noise (default ``--lr auto``).
* lasso: the objective against ``Lasso(fit_intercept=False)``'s, tall and
  wide (more features than samples) planted problems.
* lda: held-out perplexity (document completion) against
  ``LatentDirichletAllocation`` with the same priors (its topics scored by
  ``apps/lda.py``'s ``heldout_perplexity`` on the app's held-out documents;
  the app reports its own fold-in estimate on them), two generated corpora.
* torch_mlp: test accuracy against the same MLP in a plain torch loop (same
  seed, epochs, optimizer), digits and breast_cancer.
* minimal: the least-squares objective (noiseless data: the optimum is 0),
  two widths.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from scipy.sparse import csr_matrix  # noqa: E402

from harmony.app import InputPart, load_app  # noqa: E402
from harmony.client import Client  # noqa: E402
from harmony.cluster import LocalCluster  # noqa: E402
from harmony.datagen.lasso import gen_lasso  # noqa: E402
from harmony.datagen.lda import gen_lda  # noqa: E402
from harmony.datagen.nmf import gen_nmf  # noqa: E402
from harmony.formats import libsvm  # noqa: E402


def _src(app):
    return (ROOT / "apps" / f"{app}.py").read_text()


def _module(app):
    spec = importlib.util.spec_from_file_location(f"bench_{app}", ROOT / "apps" / f"{app}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# -- references ----------------------------------------------------------------------


# the non-negative ALS reference is the one the NMF tests check against
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from nmf_reference import reference_rmse  # noqa: E402


def ref_nmf(path, rank):
    return reference_rmse(path, rank)[0]


def ref_mlr(train, test, l2):
    from sklearn.datasets import load_svmlight_file
    from sklearn.linear_model import LogisticRegression
    Xtr, ytr = load_svmlight_file(train)
    Xte, yte = load_svmlight_file(test, n_features=Xtr.shape[1])
    sk = LogisticRegression(C=1.0 / (l2 * len(ytr)), max_iter=5000).fit(Xtr, ytr)
    return float(sk.score(Xte, yte))


def ref_lasso(path, lam):
    from sklearn.linear_model import Lasso
    info, blocks = libsvm.read_libsvm_blocks(InputPart(0, 1, 1), path)
    X, y = [], []
    for _, a in blocks:
        n = len(a["indptr"]) - 1
        A = np.zeros((n, info.num_features))
        np.add.at(A, (np.repeat(np.arange(n), np.diff(a["indptr"])), a["indices"]), a["data"])
        X.append(A)
        y.append(a["y"])
    X, y = np.vstack(X), np.concatenate(y)
    w = Lasso(alpha=lam, fit_intercept=False, tol=1e-12, max_iter=200_000).fit(X, y).coef_
    r = y - X @ w
    return 0.5 * float(r @ r) / len(y) + lam * float(np.abs(w).sum())


def ref_lda(path, k, alpha, beta, seed):
    from sklearn.decomposition import LatentDirichletAllocation

    from harmony.formats.uci_bow import read_docword
    lda = _module("lda")
    h, doc, word, cnt = read_docword(path)
    held = lda.heldout_docs(doc, 0.1, seed)
    X = csr_matrix((cnt[~held], (doc[~held], word[~held])), shape=(h.docs, h.words))
    X = X[np.unique(doc[~held])]
    sk = LatentDirichletAllocation(n_components=k, doc_topic_prior=alpha, topic_word_prior=beta,
                                   learning_method="batch", max_iter=40, random_state=0).fit(X)
    phi = sk.components_ / sk.components_.sum(axis=1, keepdims=True)
    return lda.heldout_perplexity(phi, doc[held], word[held], cnt[held], alpha, seed=11)


def ref_torch(dataset, epochs, seed, lr=0.05, batch=32):
    import torch
    mod = _module("torch_mlp")
    torch.set_num_threads(1)
    Xtr, ytr, Xte, yte = mod.dataset(dataset, 0)
    net = mod.make_mlp(Xtr.shape[1], 128, 1, int(ytr.max()) + 1, seed)
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    X, y = torch.from_numpy(Xtr), torch.from_numpy(ytr)
    g = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        perm = torch.randperm(len(y), generator=g)
        for s in range(0, len(y), batch):
            idx = perm[s:s + batch]
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(net(X[idx]), y[idx]).backward()
            opt.step()
    with torch.no_grad():
        return float((net(torch.from_numpy(Xte)).argmax(1).numpy() == yte).mean())


# -- the table -----------------------------------------------------------------------


def rows(d: Path):
    """(app, data set, metric, args, reference thunk) per row."""
    from sklearn.datasets import dump_svmlight_file, load_digits
    from sklearn.model_selection import train_test_split
    out = []
    z, u = str(d / "zipf.txt"), str(d / "uniform.txt")
    gen_nmf(z, users=2000, items=600, rank=8, per_user=40, noise=0.1, seed=5, activity="zipf")
    gen_nmf(u, users=2000, items=400, rank=4, per_user=80, noise=0.1, seed=5)
    out.append(("nmf", "zipf 2000x600 (MovieLens-shaped)", "test RMSE",
                ["--input", z, "--rank", "16", "--max-epochs", "25"], lambda: ref_nmf(z, 16)))
    out.append(("nmf", "uniform 2000x400, 80/user", "test RMSE",
                ["--input", u, "--rank", "8", "--max-epochs", "30"], lambda: ref_nmf(u, 8)))
    for s, order in ((2.0, "user"), (1.3, "shuffled")):
        p = str(d / f"small-{s}-{order}.txt")
        info = gen_nmf(p, users=400, items=1000, rank=8, per_user=90, noise=0.1, seed=1,
                       activity="zipf", zipf_exponent=s, order=order)
        name = (f"small skewed: 400 users, {info['ratings'] // 1000}k ratings, exponent {s}, "
                + ("sorted by user" if order == "user" else "shuffled"))
        out.append(("nmf", name, "test RMSE", ["--input", p, "--rank", "8", "--max-epochs", "40"],
                    lambda p=p: ref_nmf(p, 8)))

    X, y = load_digits(return_X_y=True)
    Xtr, Xte, ytr, yte = train_test_split(X / 16.0, y, test_size=0.25, random_state=0,
                                          stratify=y)
    dtr, dte = str(d / "digits.svm"), str(d / "digits.t.svm")
    dump_svmlight_file(Xtr, ytr, dtr)
    dump_svmlight_file(Xte, yte, dte)
    l2d = 1.0 / len(ytr)
    out.append(("mlr", "digits (sklearn)", "test accuracy",
                ["--input", dtr, "--test", dte, "--l2", repr(l2d), "--lr", "2", "--batch-size",
                 "32", "--max-epochs", "25"], lambda: ref_mlr(dtr, dte, l2d)))
    rng = np.random.default_rng(100)
    n, w = 2000, 100
    Xs = rng.standard_normal((n + 600, w))
    ys = (Xs @ (rng.standard_normal((w, 10)) * (3 / np.sqrt(w)))
          + rng.gumbel(size=(n + 600, 10))).argmax(1)
    flip = rng.random(n + 600) < 0.1
    ys[flip] = rng.integers(0, 10, int(flip.sum()))
    Xs = (Xs - Xs.mean(0)) / Xs.std(0)
    str_, ste = str(d / "std.svm"), str(d / "std.t.svm")
    dump_svmlight_file(Xs[:n], ys[:n], str_)
    dump_svmlight_file(Xs[n:], ys[n:], ste)
    out.append(("mlr", "standardized dense, width 100", "test accuracy",
                ["--input", str_, "--test", ste, "--l2", "1e-4", "--max-epochs", "12"],
                lambda: ref_mlr(str_, ste, 1e-4)))

    lt, lw = str(d / "tall.svm"), str(d / "wide.svm")
    gen_lasso(lt, samples=2000, features=100, nonzeros=10, noise=0.5, seed=3)
    gen_lasso(lw, samples=240, features=300, nonzeros=12, noise=0.5, seed=7)
    for path, name in ((lt, "tall 2000x100"), (lw, "wide 240x300")):
        out.append(("lasso", name, "objective",
                    ["--input", path, "--lam", "0.05", "--max-epochs", "150"],
                    lambda p=path: ref_lasso(p, 0.05)))

    for k, docs, name in ((6, 1200, "K=6, 1200 docs"), (10, 2000, "K=10, 2000 docs")):
        path = str(d / f"docword.{k}.txt")
        gen_lda(path, docs=docs, vocab=300 if k == 6 else 500, topics=k, doc_len=50,
                alpha=0.1, beta=0.05, seed=7)
        out.append(("lda", name, "held-out perplexity",
                    ["--input", path, "--topics", str(k), "--alpha", "0.1", "--beta", "0.05",
                     "--blocks", "8", "--seed", "3", "--max-epochs", "25"],
                    lambda p=path, k=k: ref_lda(p, k, 0.1, 0.05, 3)))

    for ds in ("digits", "breast_cancer"):
        out.append(("torch_mlp", f"{ds} (sklearn)", "test accuracy",
                    ["--dataset", ds, "--max-epochs", "15", "--seed", "3"],
                    lambda ds=ds: ref_torch(ds, 15, 3)))

    for f in (20, 100):
        out.append(("minimal", f"planted, {f} features", "objective",
                    ["--features", str(f), "--max-epochs", "30"], lambda: 0.0))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="also write the table here (markdown)")
    p.add_argument("--only", default=None, help="only these apps' rows (comma-separated)")
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-quality-") as tmp:
        d = Path(tmp)
        table = rows(d)
        if a.only:
            table = [row for row in table if row[0] in a.only.split(",")]
        cl = LocalCluster(2, str(d / "cluster"), port=0, heartbeat_timeout=10.0)
        cl.start()
        got = {}
        try:
            with Client(cl.endpoint, keys=cl.keys, timeout_s=30) as c:
                jobs = {(j, m): c.submit(f"{app}.py", _src(app), args, machines=m)
                        for j, (app, _, _, args, _) in enumerate(table) for m in (1, 2)}
                for key, job in jobs.items():
                    while True:
                        st = c.status(job)
                        if st["state"] in ("finished", "failed"):
                            break
                        import time
                        time.sleep(0.2)
                    if st["state"] != "finished":
                        raise SystemExit(f"{table[key[0]][0]}: {st['error']}")
                    got[key] = st["epochs"][-1]["metrics"]
        finally:
            cl.stop()
        key_of = {"test RMSE": "test_rmse", "test accuracy": "test_accuracy",
                  "objective": "objective", "held-out perplexity": "perplexity"}
        lines = ["| app | data set | metric | reference | harmony, 1 machine | harmony, 2 machines |"
                 " ref. |", "|---|---|---|---|---|---|---|"]
        names = {"nmf": "NN-ALS", "mlr": "sklearn LogisticRegression", "lasso": "sklearn Lasso",
                 "lda": "sklearn LDA", "torch_mlp": "plain torch loop", "minimal": "optimum"}
        for j, (app, data, metric, _, ref) in enumerate(table):
            r = ref()
            v1, v2 = (got[(j, m)][key_of[metric]] for m in (1, 2))
            fmt = (lambda v: f"{v:.3g}") if app == "minimal" else (lambda v: f"{v:.4f}")
            lines.append(f"| {app} | {data} | {metric} | {fmt(r)} | {fmt(v1)} | {fmt(v2)} | "
                         f"{names[app]} |")
            print(lines[-1], flush=True) if j == 0 else None
        text = "\n".join(lines)
        print("\n" + text)
        if a.out:
            Path(a.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
