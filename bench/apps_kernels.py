"""The apps' kernels against compiled libraries, per core, side by side in one
run (issue #36): items (ratings, tokens, samples) per CPU second for the app
(``harmony.app.run_local``: the app's own epoch loop, no runtime) and for an
anchor library on the same data, with each one's quality, and the CPU each
takes to reach the same quality.

    python bench/apps_kernels.py [--only nmf,lda,mlr,lasso,compile] [--scale 1.0]

Everything runs in this one process on one core (BLAS pinned to one thread
before numpy loads; the apps and the anchors are single-threaded), so CPU
seconds (``time.process_time``) are core seconds; wall seconds are printed
beside them to show how loaded the machine was.

Per app, one line per side:

* ``items/s/core``: items per epoch (a pass over the training data) over the
  median CPU seconds of an epoch (the app: epochs 2.. of its loop, its
  per-epoch evaluation included, the first apart as it loads the compiled
  kernels; an anchor: its fit's CPU over its passes);
* ``quality``: the side's quality at the end of its budget;
* ``CPU to target``: CPU seconds until the side first reached the target,
  the worse of the two final qualities (a level both reach): the equal-
  quality comparison. The app's ratio to the anchor is printed last.

Anchors: NMF: scikit-surprise's ``NMF`` (Cython SGD with multiplicative
updates), when it imports (``pip install scikit-surprise``), on the app's
own training split, scored on its held-out ratings (test RMSE). LDA:
scikit-learn's ``LatentDirichletAllocation`` (online variational Bayes,
Cython E-step), both models' held-out perplexity by document completion with
the same scorer (``apps/lda.py``'s ``heldout_perplexity``). MLR:
``LogisticRegression`` (lbfgs) at the app's L2, the training objective
(mean cross-entropy + l2/2 |W|^2). Lasso: ``Lasso`` (coordinate descent) at
the app's lambda, the objective 1/(2n)|y - Xw|^2 + lam |w|_1; the app with
both its solvers, the working-set one (the default) and FISTA, after its
kernels were loaded as an executor loads them at start-up. An anchor's
trajectory is fits with growing iteration budgets, each timed alone.

``compile``: the CPU of a fresh ``python -m harmony.kernels.warm`` (one
tiny epoch of each kernel's app), with an empty numba cache (compiling)
and then with the cache it left (loading).
"""
from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_v] = "1"

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import math  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from harmony.app import load_app, run_local  # noqa: E402
from harmony.datagen.lasso import gen_lasso  # noqa: E402
from harmony.datagen.lda import gen_lda  # noqa: E402
from harmony.datagen.mlr import gen_mlr  # noqa: E402
from harmony.datagen.nmf import gen_nmf  # noqa: E402


def _app(name):
    return load_app((ROOT / "apps" / f"{name}.py").read_text(), f"{name}.py")


def _module(name):
    spec = importlib.util.spec_from_file_location(f"kbench_{name}", ROOT / "apps" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def clocks():
    return time.perf_counter(), time.process_time()


def timed_local(cls, args, snapshot=None):
    """run_local with (wall, CPU) clocks at the end of reading the input and
    at every epoch's end; ``snapshot(model)``, when given, is called on the
    whole model at every epoch end, outside the clocks. Returns (history,
    per-epoch [(wall, cpu)], snapshots)."""
    stamps, snaps = [], []

    class Timed(cls):
        def read_input(self, part):
            yield from super().read_input(part)
            stamps.append(clocks())

        def model_objective(self, keys, rows):
            if snapshot is not None:
                w, c = clocks()
                snaps.append(snapshot(rows))
                stamps.append((None, w, c, clocks()))   # time to leave out
            return super().model_objective(keys, rows)

        def metrics(self, s):
            out = super().metrics(s)
            stamps.append(clocks())
            return out

    Timed.__name__ = cls.__name__
    res = run_local(Timed, args)
    epochs, skip_w, skip_c = [], 0.0, 0.0
    last = stamps[0]
    for st in stamps[1:]:
        if st[0] is None:
            skip_w += st[3][0] - st[1]
            skip_c += st[3][1] - st[2]
            continue
        epochs.append((st[0] - last[0] - skip_w, st[1] - last[1] - skip_c))
        last, skip_w, skip_c = st, 0.0, 0.0
    return res.history, epochs, snaps


def cpu_to(traj, target, lower_better=True):
    """First cumulative CPU of a trajectory [(cpu, quality)] at the target."""
    for cpu, q in traj:
        if (q <= target) if lower_better else (q >= target):
            return cpu
    return math.nan


def report(name, unit, items, app_rows, anchor_rows, lower_better=True):
    """Print one block: per side (label, epochs [(wall, cpu)] or None, passes,
    fit (wall, cpu), trajectory [(cum cpu, quality)])."""
    finals = [traj[-1][1] for *_, traj in app_rows + anchor_rows]
    target = max(finals) if lower_better else min(finals)
    print(f"\n{name}: {items:,} {unit} per pass; target quality {target:.4f} "
          f"(the worst final one)")
    print(f"  {'side':44s} {'passes':>6s} {unit + '/s/core':>16s} {'CPU/pass':>9s} "
          f"{'wall/pass':>9s} {'quality':>9s} {'CPU to target':>13s}")
    to = {}
    for label, epochs, passes, fit, traj in app_rows + anchor_rows:
        if epochs is not None:
            rest = epochs[1:] or epochs
            cpu = statistics.median(c for _, c in rest)
            wall = statistics.median(w for w, _ in rest)
            extra = f"  (first epoch: {epochs[0][1]:.3f} s CPU)"
        else:
            cpu, wall, extra = fit[1] / passes, fit[0] / passes, ""
        to[label] = cpu_to(traj, target, lower_better)
        print(f"  {label:44s} {passes:6d} {items / cpu:16,.0f} {cpu:9.4f} {wall:9.4f} "
              f"{traj[-1][1]:9.4f} {to[label]:13.3f}{extra}")
    for label0, *_, traj0 in app_rows:
        tag = f" ({label0})" if len(app_rows) > 1 else ""
        for label, *_, traj in anchor_rows:
            print(f"  app / anchor, CPU to target{tag}: {to[label0] / to[label]:.2f}")
            best = traj[-1][1]
            got = cpu_to(traj0, best, lower_better)
            print(f"  the app reaches the anchor's final quality {best:.4f}{tag}: "
                  + (f"at {got:.3f} s CPU ({got / traj[-1][0]:.2f}x the anchor's)"
                     if got == got else "not within its epochs"))


def cum(epochs, quality):
    out, c = [], 0.0
    for (_, cpu), q in zip(epochs, quality):
        c += cpu
        out.append((c, q))
    return out


# -- NMF ------------------------------------------------------------------------------


def bench_nmf(tmp, scale, epochs_als, epochs_sgd, rank):
    path = os.path.join(tmp, "ratings.txt")
    users = max(100, round(20_000 * scale))
    shape = gen_nmf(path, users=users, items=5000, rank=16, per_user=50, noise=0.1, seed=0)
    print(f"\nNMF data: {shape}; app rank {rank}")
    nmf = _app("nmf")
    rows = []
    for solver, ep in (("als", epochs_als), ("sgd", epochs_sgd)):
        hist, epochs, _ = timed_local(nmf, ["--input", path, "--rank", str(rank), "--solver",
                                            solver, "--max-epochs", str(ep)])
        rows.append((f"harmony nmf --solver {solver}", epochs, ep, None,
                     cum(epochs, [h["test_rmse"] for h in hist])))
    mod = _module("nmf")
    a = np.loadtxt(path)
    u, i = a[:, 0].astype(np.int64), a[:, 1].astype(np.int64)
    test = mod.holdout_mask(u, i, 0.1, 0)
    n_train = int((~test).sum())
    anchors = []
    try:
        from surprise import NMF as SurpriseNMF
        from surprise import Dataset, Reader
    except ImportError:
        print("  scikit-surprise is not installed: no anchor (pip install scikit-surprise)")
    else:
        tr = os.path.join(tmp, "train.txt")
        np.savetxt(tr, a[~test], fmt="%d %d %.4f")
        data = Dataset.load_from_file(tr, Reader(line_format="user item rating", sep=" ",
                                                 rating_scale=(0.0, float(a[:, 2].max()))))
        ts = data.build_full_trainset()
        traj = []
        for ne in (5, 10, 20, 50):
            algo = SurpriseNMF(n_factors=rank, n_epochs=ne, biased=False, random_state=0)
            w0, c0 = clocks()
            algo.fit(ts)
            fit = (time.perf_counter() - w0, time.process_time() - c0)
            # ids loaded from a file are strings (raw ids); an unknown id
            # would be predicted as the global mean
            err = [algo.predict(str(int(uu)), str(int(ii)), clip=False).est - r
                   for uu, ii, r in a[test]]
            traj.append((fit[1], float(np.sqrt(np.mean(np.square(err))))))
        anchors.append((f"scikit-surprise NMF, {ne} epochs", None, ne, fit, traj))
    report("NMF", "ratings", n_train, rows[:1], anchors)
    report("NMF", "ratings", n_train, rows[1:], anchors)


# -- LDA ------------------------------------------------------------------------------


def bench_lda(tmp, scale, epochs, topics):
    from scipy.sparse import csr_matrix
    from sklearn.decomposition import LatentDirichletAllocation

    from harmony.formats.uci_bow import read_docword
    path = os.path.join(tmp, "docword.txt")
    docs = max(200, round(5000 * scale))
    shape = gen_lda(path, docs=docs, vocab=5000, topics=topics, doc_len=100, alpha=0.1,
                    beta=0.05, seed=7)
    print(f"\nLDA data: {shape}; {topics} topics, alpha 0.1, beta 0.05")
    lda = _module("lda")
    h, doc, word, cnt = read_docword(path)
    held = lda.heldout_docs(doc, 0.1, 3)

    def perplexity(phi):
        return lda.heldout_perplexity(phi, doc[held], word[held], cnt[held], 0.1, seed=11)

    W = h.words
    snap = (lambda rows: lda.phi_from_counts(rows, 0.05, W).astype(np.float64))
    hist, ep, phis = timed_local(_app("lda"), [
        "--input", path, "--topics", str(topics), "--alpha", "0.1", "--beta", "0.05",
        "--seed", "3", "--max-epochs", str(epochs)], snapshot=snap)
    n_tokens = int(hist[-1]["tokens"])
    app = [("harmony lda (collapsed Gibbs)", ep, epochs, None,
            cum(ep, [perplexity(p) for p in phis]))]
    X = csr_matrix((cnt[~held], (doc[~held], word[~held])), shape=(h.docs, h.words))
    X = X[np.unique(doc[~held])]
    traj = []
    for it in (1, 2, 5, 10, 20):
        sk = LatentDirichletAllocation(n_components=topics, doc_topic_prior=0.1,
                                       topic_word_prior=0.05, learning_method="online",
                                       max_iter=it, random_state=0)
        w0, c0 = clocks()
        sk.fit(X)
        fit = (time.perf_counter() - w0, time.process_time() - c0)
        phi = sk.components_ / sk.components_.sum(axis=1, keepdims=True)
        traj.append((fit[1], perplexity(phi)))
    anchor = [(f"sklearn LDA online VB, {it} passes", None, it, fit, traj)]
    report("LDA", "tokens", n_tokens, app, anchor)


# -- MLR and Lasso ----------------------------------------------------------------------


def _split_svm(path, tmp, frac_test=0.1):
    from sklearn.datasets import dump_svmlight_file, load_svmlight_file
    X, y = load_svmlight_file(path)
    n_test = round(frac_test * X.shape[0])
    tr, te = os.path.join(tmp, "tr.svm"), os.path.join(tmp, "te.svm")
    dump_svmlight_file(X[n_test:], y[n_test:], tr)
    dump_svmlight_file(X[:n_test], y[:n_test], te)
    return X[n_test:].tocsr(), y[n_test:], tr, te


def bench_mlr(tmp, scale, epochs, l2):
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    path = os.path.join(tmp, "mlr.svm")
    shape = gen_mlr(path, samples=max(500, round(5000 * scale)), features=8000, classes=200,
                    nnz=100, seed=0)
    print(f"\nMLR data: {shape}; l2 {l2}")
    X, y, tr, te = _split_svm(path, tmp)
    hist, ep, _ = timed_local(_app("mlr"), ["--input", tr, "--test", te, "--l2", repr(l2),
                                            "--max-epochs", str(epochs)])
    app = [("harmony mlr (mini-batch SGD)", ep, epochs, None,
            cum(ep, [h["objective"] for h in hist]))]

    def objective(sk):
        Z = X @ sk.coef_.T + sk.intercept_
        Z -= Z.max(axis=1, keepdims=True)
        lse = np.log(np.exp(Z).sum(axis=1))
        cls = np.searchsorted(sk.classes_, y)
        ce = float(np.mean(lse - Z[np.arange(len(y)), cls]))
        return ce + 0.5 * l2 * float(np.sum(sk.coef_ ** 2))

    traj = []
    for it in (5, 10, 20, 40, 80):
        sk = LogisticRegression(C=1.0 / (l2 * X.shape[0]), max_iter=it, tol=1e-10)
        w0, c0 = clocks()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            sk.fit(X, y)
        fit = (time.perf_counter() - w0, time.process_time() - c0)
        traj.append((fit[1], objective(sk)))
    passes = int(np.max(sk.n_iter_))
    anchor = [(f"sklearn LogisticRegression lbfgs, {passes} it.", None, passes, fit, traj)]
    report("MLR", "samples", X.shape[0], app, anchor)


def bench_lasso(tmp, scale, epochs, lam):
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import Lasso
    path = os.path.join(tmp, "lasso.svm")
    shape = gen_lasso(path, samples=max(1000, round(100_000 * scale)), features=5000,
                      nonzeros=200, noise=0.5, nnz=100, seed=0)
    print(f"\nLasso data: {shape}; lambda {lam}")
    X, y, tr, te = _split_svm(path, tmp)
    from harmony.kernels.warm import preload
    cls = _app("lasso")
    # as an executor does at its start-up: load the compiled kernels first
    print(f"  kernels loaded (harmony.kernels.warm.preload) in {preload(cls, 'lasso.py'):.2f} "
          "s CPU, before the clocks")
    app = []
    for solver, ep_max, label in (("ws", epochs // 4, "harmony lasso --solver ws (working set)"),
                                  ("fista", epochs, "harmony lasso --solver fista")):
        hist, ep, _ = timed_local(cls, ["--input", tr, "--test", te, "--lam", repr(lam),
                                        "--max-epochs", str(ep_max), "--solver", solver])
        app.append((label, ep, ep_max, None, cum(ep, [h["objective"] for h in hist])))
    Xc = X.tocsc()
    traj = []
    for it in (2, 4, 8, 16, 32):
        sk = Lasso(alpha=lam, fit_intercept=False, max_iter=it, tol=0.0)
        w0, c0 = clocks()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            sk.fit(Xc, y)
        fit = (time.perf_counter() - w0, time.process_time() - c0)
        r = y - X @ sk.coef_
        traj.append((fit[1], 0.5 * float(r @ r) / len(y) + lam * float(np.abs(sk.coef_).sum())))
    anchor = [(f"sklearn Lasso coordinate descent, {it} passes", None, it, fit, traj)]
    report("Lasso", "samples", X.shape[0], app, anchor)


# -- compile time ------------------------------------------------------------------------

def bench_compile(tmp):
    env = dict(os.environ, NUMBA_CACHE_DIR=os.path.join(tmp, "numba-cache"),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    print("\nCompile: a fresh process running `python -m harmony.kernels.warm` (one tiny "
          "epoch of NMF ALS, NMF SGD and LDA)")
    for label in ("empty numba cache (compiles)", "the cache it left (loads)"):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        w0 = time.perf_counter()
        sys.stdout.flush()
        subprocess.run([sys.executable, "-m", "harmony.kernels.warm"], env=env, check=True)
        wall = time.perf_counter() - w0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        print(f"  {label:30s} whole process: wall {wall:6.2f} s, CPU {cpu:6.2f} s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="nmf,lda,mlr,lasso,compile")
    ap.add_argument("--scale", type=float, default=1.0,
                    help="data size (1: 1M ratings, 500k tokens, 5k MLR and 100k Lasso samples)")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--topics", type=int, default=20)
    a = ap.parse_args()
    only = set(a.only.split(","))
    print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    w0, c0 = clocks()
    with tempfile.TemporaryDirectory(prefix="bench-kernels-") as tmp:
        if "nmf" in only:
            bench_nmf(tmp, a.scale, 10, 30, a.rank)
        if "lda" in only:
            bench_lda(tmp, a.scale, 40, a.topics)
        if "mlr" in only:
            bench_mlr(tmp, a.scale, 20, 1e-4)
        if "lasso" in only:
            bench_lasso(tmp, a.scale, 60, 0.01)
        if "compile" in only:
            bench_compile(tmp)
    print(f"\ntotal: wall {time.perf_counter() - w0:.1f} s, CPU {time.process_time() - c0:.1f} s "
          f"(this process); load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
