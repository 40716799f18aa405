"""Lasso app and the shared LIBSVM reader: parser errors by file and line,
generator round trip, scikit-learn's optimum on a real local cluster, the
1-machine run against the single-process reference, 1 vs 2 machines."""
import gzip

import numpy as np
import pytest
from sklearn.linear_model import Lasso as SkLasso

from harmony.app import InputError, InputPart, load_app, run_local
from harmony.client import Client
from harmony.datagen.lasso import gen_lasso
from harmony.formats import libsvm
from conftest import ROOT, run_cli, wait_state

LASSO_APP = ROOT / "apps" / "lasso.py"
SRC = LASSO_APP.read_text()
LAM = 0.05
SAMPLES, FEATURES, NONZEROS = 240, 300, 12   # more features than samples


def _read_all(path, **kw):
    """The whole file as one dense matrix, through the streaming reader."""
    info, blocks = libsvm.read_libsvm_blocks(InputPart(0, 1, 4), str(path), **kw)
    blocks = list(blocks)
    X, y = [], []
    for _, a in blocks:
        n = len(a["indptr"]) - 1
        A = np.zeros((n, info.num_features))
        rows = np.repeat(np.arange(n), np.diff(a["indptr"]))
        np.add.at(A, (rows, a["indices"]), a["data"])
        X.append(A)
        y.append(a["y"])
    return info, np.vstack(X), np.concatenate(y)


def _objective(X, y, w):
    r = y - X @ w
    return 0.5 * float(r @ r) / len(y) + LAM * float(np.abs(w).sum())


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    d = tmp_path_factory.mktemp("lasso")
    path, truth = d / "train.svm", d / "truth.txt"
    gen_lasso(str(path), samples=SAMPLES, features=FEATURES, nonzeros=NONZEROS, noise=0.5,
              seed=7, truth=str(truth))
    _, X, y = _read_all(path)
    sk = SkLasso(alpha=LAM, fit_intercept=False, tol=1e-12, max_iter=200_000).fit(X, y)
    return {"path": str(path), "dir": d, "X": X, "y": y, "coef": sk.coef_,
            "objective": _objective(X, y, sk.coef_)}


@pytest.fixture(scope="module")
def runs(cluster, planted):
    """One 1-machine and one 2-machine job on the cluster, side by side."""
    args = ["--input", planted["path"], "--lam", str(LAM), "--max-epochs", "120"]
    jobs = {}
    with Client(cluster.endpoint, timeout_s=10) as c:
        for m, extra in ((1, ["--iters-per-epoch", "2"]), (2, ["--iters-per-epoch", "3"])):
            out = planted["dir"] / f"w{m}.txt"
            a = args + extra + ["--model-out", str(out)]
            jobs[m] = (c.submit("lasso.py", SRC, a, machines=m), a, out)
        res = {}
        for m, (job, a, out) in jobs.items():
            st = wait_state(c, job, ("finished", "failed"))
            assert st["state"] == "finished", st["error"]
            res[m] = {"args": a, "epochs": [e["metrics"] for e in st["epochs"]],
                      "model": out.read_text()}
    return res


def _support_and_weights(text):
    pairs = [ln.split() for ln in text.splitlines()]
    w = np.zeros(FEATURES)
    for j, v in pairs:
        w[int(j) - 1] = float(v)            # the generator writes 1-based indices
    return w


def test_reaches_sklearn_objective_and_support(runs, planted):
    sk_obj, sk_coef = planted["objective"], planted["coef"]
    for m in (1, 2):
        got = runs[m]["epochs"][-1]
        assert got["objective"] == pytest.approx(sk_obj, rel=0.01), m
        w = _support_and_weights(runs[m]["model"])
        assert set(np.flatnonzero(w)) == set(np.flatnonzero(sk_coef)), m
        assert got["nnz"] == np.count_nonzero(sk_coef)
        # the reported objective is the objective of the written coefficients
        assert _objective(planted["X"], planted["y"], w) == pytest.approx(got["objective"],
                                                                          rel=1e-9)
    # it is in fact much closer than 1%
    assert runs[1]["epochs"][-1]["objective"] == pytest.approx(sk_obj, rel=1e-6)


def test_one_machine_matches_single_process_reference(runs):
    ref = run_local(load_app(SRC, "lasso.py"), runs[1]["args"][:-2])   # without --model-out
    got = runs[1]["epochs"]
    assert len(got) == len(ref.history) == 120
    for g, r in zip(got, ref.history):
        for k in ("objective", "loss", "nnz"):
            assert g[k] == pytest.approx(r[k], rel=1e-6), k


def test_two_machines_reach_the_one_machine_objective(runs):
    one, two = runs[1]["epochs"], runs[2]["epochs"]
    assert two[-1]["objective"] == pytest.approx(one[-1]["objective"], rel=1e-6)
    # same algorithm: the same trajectory up to the rounding of the gradient sums
    for a, b in zip(one, two):
        assert b["objective"] == pytest.approx(a["objective"], rel=1e-5)


def test_fista_iterations_per_epoch_and_ista_converge_too(planted):
    """The old solver (--solver fista), locally: 1 or 5 iterations per epoch
    give the same iterates; ISTA (no momentum) also reaches the optimum, more
    slowly."""
    base = ["--input", planted["path"], "--lam", str(LAM), "--max-epochs", "60",
            "--solver", "fista"]
    cls = load_app(SRC, "lasso.py")
    a = run_local(cls, base)
    b = run_local(cls, base + ["--iters-per-epoch", "5"])
    assert np.allclose([h["objective"] for h in a.history],
                       [h["objective"] for h in b.history], rtol=1e-12)
    c = run_local(cls, base + ["--no-accel", "--max-epochs", "400"])
    assert c.history[-1]["objective"] == pytest.approx(planted["objective"], rel=1e-4)
    assert a.history[-1]["objective"] < c.history[59]["objective"]   # FISTA is faster


def test_working_set_solver_is_exact_in_a_few_epochs(planted):
    """The default solver (--solver ws) reaches scikit-learn's optimum to
    1e-9 within 10 epochs, where FISTA is still 1e-3 away; 1 or 5 iterations
    per epoch, and 1 or 3 machines (run_local's emulation), give the same
    iterates up to the rounding of the sums."""
    base = ["--input", planted["path"], "--lam", str(LAM), "--max-epochs", "10"]
    cls = load_app(SRC, "lasso.py")
    a = run_local(cls, base)
    assert a.history[-1]["objective"] == pytest.approx(planted["objective"], rel=1e-9)
    assert a.history[-1]["nnz"] == np.count_nonzero(planted["coef"])
    f = run_local(cls, base + ["--solver", "fista"])
    assert f.history[-1]["objective"] > planted["objective"] * (1 + 1e-3)
    for extra in (["--iters-per-epoch", "5"], ["--blocks", "7"]):
        b = run_local(cls, base + extra, machines=3 if "--blocks" in extra else 1)
        assert np.allclose([h["objective"] for h in a.history],
                           [h["objective"] for h in b.history], rtol=1e-9), extra
    # the objective never rises: block minimizations from the current point
    obj = [h["objective"] for h in a.history]
    assert all(y <= x * (1 + 1e-12) for x, y in zip(obj, obj[1:]))


def test_working_set_too_small_still_converges(planted):
    """A working set smaller than the solution's support: the full set
    alternates block solves with proximal gradient steps, and still reaches
    the optimum; the model has only the Gram keys of that set."""
    cls = load_app(SRC, "lasso.py")
    args = ["--input", planted["path"], "--lam", str(LAM), "--ws-size", "6",
            "--max-epochs", "300"]
    res = run_local(cls, args)
    assert np.count_nonzero(planted["coef"]) > 6
    assert res.history[-1]["objective"] == pytest.approx(planted["objective"], rel=1e-6)
    assert len(res.model) == FEATURES + 2 + 4    # 21 packed Gram entries, 6 per key


def test_intercept_and_holdout(tmp_path):
    path = tmp_path / "shift.svm"
    gen_lasso(str(path), samples=400, features=30, nonzeros=5, noise=0.2, seed=2)
    text = path.read_text().splitlines()
    shifted = [f"{float(ln.split(' ', 1)[0]) + 5.0!r} {ln.split(' ', 1)[1]}" for ln in text]
    path.write_text("\n".join(shifted) + "\n")
    _, X, y = _read_all(path)
    sk = SkLasso(alpha=LAM, fit_intercept=True, tol=1e-12, max_iter=100_000).fit(X, y)
    r = y - X @ sk.coef_ - sk.intercept_
    sk_obj = 0.5 * float(r @ r) / len(y) + LAM * float(np.abs(sk.coef_).sum())
    cls = load_app(SRC, "lasso.py")
    for solver, epochs in (("ws", 10), ("fista", 150)):
        res = run_local(cls, ["--input", str(path), "--lam", str(LAM), "--intercept",
                              "--max-epochs", str(epochs), "--solver", solver])
        assert res.history[-1]["objective"] == pytest.approx(sk_obj, rel=1e-6), solver
    res = run_local(cls, ["--input", str(path), "--lam", str(LAM), "--intercept",
                          "--holdout", "0.2", "--max-epochs", "30"])
    assert 0 < res.history[-1]["test_mse"] < 1.0


def test_bad_input_fails_the_job_with_file_and_line(client, tmp_path):
    bad = tmp_path / "bad.svm"
    bad.write_text("1.5 1:2 3:4\n# comment\n2.5 1:2 -3:4\n")
    job = client.submit("lasso.py", SRC, ["--input", str(bad)], machines=2)
    st = wait_state(client, job, ("finished", "failed"))
    assert st["state"] == "failed" and f"{bad}:3: negative feature index -3" in st["error"]


def test_submit_help_lists_the_options():
    for app, opt in (("lasso.py", "--lam"), ("mlr.py", "--l2")):
        r = run_cli("submit", str(ROOT / "apps" / app), "--help")
        assert r.returncode == 0 and opt in r.stdout and "--iters-per-epoch" in r.stdout


# -- the LIBSVM reader (pure unit tests) -------------------------------------------------


@pytest.mark.parametrize("body, line, text", [
    ("1 1:2\nx 1:2\n", 2, "bad label 'x': expected a number"),
    ("1 1:2\n\n# c\n1,2 3:1\n", 4, "bad label '1,2'"),
    ("1 1:2\n2 1:2 5\n", 2, "bad feature '5': expected idx:val"),
    ("1 1:2 3:x\n", 1, "bad feature value 'x' in '3:x'"),
    ("1 1:2:3\n", 1, "bad feature '1:2:3'"),
    ("1 :3\n", 1, "bad feature ':3'"),
    ("1 2.5:3\n", 1, "bad feature index '2.5'"),
    ("0 1:1\n0 2:1 -4:1\n", 2, "negative feature index -4 in '-4:1'"),
    ("nan 1:1\n", 1, "bad label 'nan': not finite"),
    ("1 1:inf\n", 1, "feature value not finite"),
    ("1 3000000000:1\n", 1, "feature index 3000000000 too large"),
])
def test_parser_errors_name_file_and_line(tmp_path, body, line, text):
    p = tmp_path / "d.svm"
    p.write_text(body)
    with pytest.raises(InputError, match=text) as ei:
        for _ in libsvm.iter_chunks(str(p)):
            pass
    assert ei.value.path == str(p) and ei.value.line == line
    assert str(ei.value).startswith(f"{p}:{line}: ")


def test_parser_error_line_numbers_across_chunks(tmp_path):
    p = tmp_path / "d.svm.gz"
    lines = [f"{i % 3} {i % 7 + 1}:0.5 9:1\n" for i in range(5000)]
    lines[4321] = "2 1:0.5 9\n"
    with gzip.open(p, "wt") as fh:
        fh.writelines(lines)
    with pytest.raises(InputError) as ei:
        for _ in libsvm.iter_chunks(str(p), chunk_bytes=1000):
            pass
    assert ei.value.line == 4322 and "bad feature '9'" in str(ei.value)


def test_parser_fast_path_agrees_with_line_by_line(tmp_path):
    rng = np.random.default_rng(1)
    lines = []
    for i in range(400):
        k = int(rng.integers(0, 6))
        idx = np.sort(rng.choice(50, k, replace=False))
        feats = " ".join(f"{j}:{v:.5g}" for j, v in zip(idx, rng.normal(size=k)))
        qid = f" qid:{i % 4}" if i % 5 == 0 else ""
        sep = "\t" if i % 7 == 0 else " "
        comment = "  # note: 1:2" if i % 11 == 0 else ""
        end = "\r\n" if i % 13 == 0 else "\n"
        lines.append(f"{rng.normal():.6g}{qid}{sep}{feats}{comment}{end}".encode())
        if i % 17 == 0:
            lines.append(b"# a comment line\n" if i % 2 else b"   \n")
    fast = libsvm._parse_fast(lines, "f", 1, 0)
    slow = libsvm._parse_slow(lines, "f", 1, 0)
    for k in ("labels", "indptr", "indices", "values", "lines"):
        assert np.array_equal(getattr(fast, k), getattr(slow, k)), k


def test_index_base_rules(tmp_path):
    one = tmp_path / "one.svm"
    one.write_text("1 1:1 4:2\n2 2:1\n")
    zero = tmp_path / "zero.svm"
    zero.write_text("1 0:1 3:2\n2 1:1\n")
    for path, kw, nf, base in ((one, {}, 4, 1), (zero, {}, 4, 0),
                               (one, {"index_base": "0"}, 5, 0)):
        info, X, _ = _read_all(path, **kw)
        assert (info.num_features, info.index_base) == (nf, base)
        assert X.sum() == 4.0 and X.shape[1] == nf
    with pytest.raises(InputError, match=r"zero\.svm:1: feature index 0 in a 1-based file"):
        _read_all(zero, index_base="1")
    # a separate test file takes part in the decision and the width
    info, _, _ = _read_all(one, test_path=str(zero))
    assert (info.num_features, info.index_base, info.n_test) == (5, 0, 2)


def test_rows_hash_to_blocks_and_machines_keep_only_theirs(planted):
    n_rows = []
    for m in range(3):
        part = InputPart(m, 3, 8)
        info, blocks = libsvm.read_libsvm_blocks(part, planted["path"])
        got = list(blocks)
        assert [b for b, _ in got] == part.my_blocks()
        n_rows.append(sum(len(a["y"]) for _, a in got))
    assert sum(n_rows) == SAMPLES == info.n_train


def test_generator_round_trip(tmp_path):
    p, truth = tmp_path / "l.svm.gz", tmp_path / "t.txt"
    shape = gen_lasso(str(p), samples=500, features=80, nonzeros=6, noise=0.0, nnz=10,
                      seed=4, zero_based=True, truth=str(truth), chunk_nnz=700)
    info, X, y = _read_all(p)
    assert (info.n_train, info.num_features, info.nnz_train, info.index_base) == \
        (shape["samples"], shape["features"], shape["nnz"], 0)
    assert (np.count_nonzero(X, axis=1) <= 10).all()
    w = np.zeros(80)
    for ln in truth.read_text().splitlines():
        j, v = ln.split()
        w[int(j)] = float(v)
    assert np.count_nonzero(w) == 6
    # noiseless: the targets are X w* (up to the digits written)
    assert np.abs(X @ w - y).max() < 1e-4
    r = run_cli("data", "gen", "lasso", "--out", str(tmp_path / "c.svm"), "--samples", "20",
                "--features", "7", "--nonzeros", "2")
    assert r.returncode == 0 and '"samples": 20' in r.stdout
    info, X, _ = _read_all(tmp_path / "c.svm")
    assert X.shape == (20, 7) and info.index_base == 1


def test_missing_empty_and_corrupt_inputs(tmp_path):
    with pytest.raises(InputError, match="cannot open input"):
        _read_all(tmp_path / "nope.svm")
    (tmp_path / "e.svm").write_text("# only a comment\n\n")
    with pytest.raises(InputError, match="no training samples"):
        _read_all(tmp_path / "e.svm")
    (tmp_path / "c.svm.gz").write_bytes(gzip.compress(b"1 1:2\n" * 1000)[:-30])
    with pytest.raises(InputError, match=r"c\.svm\.gz: unreadable input near line"):
        _read_all(tmp_path / "c.svm.gz")
