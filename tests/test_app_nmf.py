"""NMF quality: held-out RMSE on planted low-rank data approaches the noise."""
import pytest

from harmony.datagen.nmf import gen_nmf, netflix_shape
from conftest import NMF_APP, wait_state

NOISE = 0.1


def test_heldout_rmse_approaches_the_noise_level(client, tmp_path):
    data = tmp_path / "planted.txt"
    gen_nmf(str(data), users=2000, items=400, rank=4, per_user=80, noise=NOISE, seed=5)
    args = ["--input", str(data), "--rank", "8", "--max-epochs", "30"]   # default steps
    job = client.submit("nmf.py", NMF_APP.read_text(), args, machines=1)
    st = wait_state(client, job, ("finished", "failed"), timeout=180)
    assert st["state"] == "finished", st["error"]
    first, last = st["epochs"][0]["metrics"], st["epochs"][-1]["metrics"]
    assert first["test_rmse"] > 4 * NOISE
    assert last["test_rmse"] < 1.3 * NOISE      # measured: 0.1195
    assert last["rmse"] > 0.8 * NOISE            # fitting the signal, not the noise


def test_netflix_shape_preset():
    assert netflix_shape(16) == {"users": 1920756, "items": 71080, "per_user": 836}
    small = netflix_shape(0.001)
    assert small["users"] * small["per_user"] == pytest.approx(100e6 * 0.001, rel=0.1)
    with pytest.raises(ValueError):
        netflix_shape(0)


# -- MovieLens-shaped data against a non-negative ALS reference ---------------------------

import numpy as np                                      # noqa: E402

from harmony.app import load_app, run_local            # noqa: E402
from nmf_reference import load_split, nnls_als, reference_rmse   # noqa: E402

NMF = load_app(NMF_APP.read_text(), "nmf.py")
ZIPF = dict(users=2000, items=600, rank=8, per_user=40, noise=0.1, seed=5, activity="zipf")
RANK, EPOCHS = 16, 25


def _opts(args):
    from harmony.app import parse_app_args
    return parse_app_args(NMF, args)


@pytest.fixture(scope="module")
def zipf(tmp_path_factory):
    path = tmp_path_factory.mktemp("zipf") / "ratings.txt"
    shape = gen_nmf(str(path), **ZIPF)
    # the reference at its best regularization, chosen on the held-out ratings
    # (measured: 0.157 / 0.147 / 0.171 at lambda 0.003 / 0.01 / 0.03)
    best, by_lam = reference_rmse(str(path), RANK, lams=(0.01, 0.02), sweeps=25)
    print("NNLS-ALS test RMSE by lambda:", by_lam)
    return {"path": str(path), "shape": shape, "als": best}


def test_zipf_generator_is_movielens_shaped(zipf):
    s = zipf["shape"]
    assert s["min_per_user"] == ZIPF["per_user"] // 3       # many users at the minimum
    assert s["median_per_user"] < 0.75 * s["ratings"] / ZIPF["users"] < s["max_per_user"] / 4
    a = np.loadtxt(zipf["path"], usecols=(0, 1))
    assert (np.diff(a[:, 0]) >= 0).all()                    # sorted by user
    pop = np.sort(np.bincount(a[:, 1].astype(np.int64)))[::-1]
    assert pop[:30].mean() > 5 * pop[-300:].mean()          # a few popular items


def test_zipf_default_options_come_within_1_25x_of_als(zipf):
    res = run_local(NMF, ["--input", zipf["path"], "--rank", str(RANK),
                          "--max-epochs", str(EPOCHS)])
    got = res.history[-1]["test_rmse"]
    print(f"app {got:.4f}  ALS {zipf['als']:.4f}  ratio {got / zipf['als']:.3f}")
    assert got <= 1.25 * zipf["als"]
    app = NMF(_opts(["--input", zipf["path"], "--rank", str(RANK)]))
    R = app.export(np.arange(len(res.model)), res.model, {})["R"]
    assert R.shape == (ZIPF["items"], RANK) and (R >= 0).all()


def test_zipf_on_two_machines_comes_within_1_25x_of_als(client, zipf):
    args = ["--input", zipf["path"], "--rank", str(RANK), "--max-epochs", str(EPOCHS)]
    job = client.submit("nmf.py", NMF_APP.read_text(), args, machines=2)
    st = wait_state(client, job, ("finished", "failed"), timeout=180)
    assert st["state"] == "finished", st["error"]
    got = st["epochs"][-1]["metrics"]["test_rmse"]
    print(f"2 machines: app {got:.4f}  ALS {zipf['als']:.4f}  ratio {got / zipf['als']:.3f}")
    assert got <= 1.25 * zipf["als"]


def test_every_epoch_visits_ratings_in_a_new_seeded_order(zipf):
    """SGD: same seed: the same result; another seed: another order (and result)."""
    args = ["--input", zipf["path"], "--rank", "4", "--max-epochs", "2", "--solver", "sgd"]
    a, b = run_local(NMF, args), run_local(NMF, args)
    assert np.array_equal(a.model, b.model)
    c = run_local(NMF, args + ["--seed", "1"])
    assert not np.array_equal(a.model, c.model)


@pytest.mark.parametrize("body, line, text", [
    ("1 2 3.0\n4 9223372036854775807 1.0\n", 2, "user and item must be non-negative integers up to"),
    ("1 2 3.0\n3000000000 2 1.0\n", 2, "user and item must be non-negative integers up to"),
    ("1 2 3.0\n1 -2 1.0\n", 2, "user and item must be non-negative integers"),
])
def test_nmf_ids_out_of_range_name_the_file_and_line(tmp_path, body, line, text):
    """An item id of 2^63-1 gave a raw numpy error; ids past 2^31-2 are
    refused with the file and line, like LIBSVM's feature indices."""
    from harmony.app import InputError
    p = tmp_path / "r.txt"
    p.write_text(body)
    with pytest.raises(InputError, match=text) as ei:
        run_local(load_app(NMF_APP.read_text(), "nmf.py"), ["--input", str(p),
                                                           "--max-epochs", "1"])
    assert ei.value.path == str(p) and ei.value.line == line


def test_nmf_ids_that_plan_a_model_too_large_for_the_machine_are_refused(tmp_path):
    from harmony.app import InputError
    p = tmp_path / "r.txt"
    p.write_text("1 2 3.0\n2 2000000000 1.0\n")     # 2e9 rows of rank 16: 144 GiB
    with pytest.raises(InputError, match="plan a model of 2000000001 rows"):
        run_local(load_app(NMF_APP.read_text(), "nmf.py"), ["--input", str(p),
                                                           "--max-epochs", "1", "--rank", "16"])


# -- small and skewed data (issue #36): the defaults against the NNLS-ALS reference --------
#
# A few hundred users, ~30k ratings, planted rank 8, power-law activity at the
# ends of the range 1.3 (most skewed) .. 2, sorted by user (as MovieLens is)
# and shuffled. Only --input and --rank are given, 40 epochs.

SMALL = dict(users=400, items=1000, rank=8, per_user=90, noise=0.1, seed=1, activity="zipf")
SMALL_LAMS = (0.003, 0.01, 0.03)       # the reference's best of these (0.1: far worse)


def _small(d, exponent):
    paths = {}
    for order in ("user", "shuffled"):
        paths[order] = str(d / f"small-{exponent}-{order}.txt")
        gen_nmf(paths[order], zipf_exponent=exponent, order=order, **SMALL)
    best, by_lam = reference_rmse(paths["user"], 8, lams=SMALL_LAMS)
    print(f"exponent {exponent}: NNLS-ALS test RMSE by lambda {by_lam}")
    return {**paths, "als": best}


@pytest.fixture(scope="module")
def skewed(tmp_path_factory):
    return _small(tmp_path_factory.mktemp("skewed"), 2.0)


def test_skewed_generator_orders_and_exponents(skewed, tmp_path):
    a = np.loadtxt(skewed["user"])
    b = np.loadtxt(skewed["shuffled"])
    assert (np.diff(a[:, 0]) >= 0).all() and not (np.diff(b[:, 0]) >= 0).all()
    assert np.array_equal(a, b[np.lexsort((b[:, 1], b[:, 0]))])   # the same ratings
    assert 20_000 < len(a) < 40_000
    heavy = {}
    for s in (1.3, 2.0):
        p = tmp_path / f"{s}.txt"
        gen_nmf(str(p), zipf_exponent=s, **SMALL)
        c = np.sort(np.bincount(np.loadtxt(p, usecols=0).astype(np.int64)))[::-1]
        heavy[s] = c[:40].sum() / c.sum()               # the top 10% of users' share
    assert heavy[1.3] > heavy[2.0] + 0.05, heavy


@pytest.mark.parametrize("order, machines", [("user", 1), ("shuffled", 1), ("user", 2),
                                             ("shuffled", 2)])
def test_small_skewed_defaults_come_within_1_25x_of_nnls_als(skewed, order, machines):
    """The issue's case (the most regular end, exponent 2: the fewest ratings
    per item); measured 0.168 against the reference's 0.169 (was 0.33 with
    the SGD default)."""
    res = run_local(NMF, ["--input", skewed[order], "--rank", "8", "--max-epochs", "40"],
                    machines=machines)
    got = res.history[-1]["test_rmse"]
    print(f"{order}, {machines} machine(s): app {got:.4f}  ALS {skewed['als']:.4f}  "
          f"ratio {got / skewed['als']:.3f}")
    assert got <= 1.25 * skewed["als"]


@pytest.mark.slow
@pytest.mark.parametrize("exponent", [1.3, 1.6])
def test_small_skewed_grid_comes_within_1_25x_of_nnls_als(tmp_path, exponent):
    """The rest of the issue's small grid (exponent 2 above): sorted and
    shuffled, 1 and 2 machines."""
    d = _small(tmp_path, exponent)
    for order in ("user", "shuffled"):
        for m in (1, 2):
            got = run_local(NMF, ["--input", d[order], "--rank", "8", "--max-epochs", "40"],
                            machines=m).history[-1]["test_rmse"]
            print(f"exponent {exponent}, {order}, {m} machine(s): app {got:.4f}  "
                  f"ALS {d['als']:.4f}")
            assert got <= 1.25 * d["als"], (order, m)


def test_als_does_not_depend_on_the_machines_or_the_file_order(skewed):
    """ALS pushes each machine's share of every item's normal equations, so
    2 machines solve the same rows as 1 (up to float32 rounding of the
    stored sums), and the file's order changes only summation order."""
    args = ["--rank", "8", "--max-epochs", "6"]
    one = run_local(NMF, ["--input", skewed["user"], *args]).history
    for got in (run_local(NMF, ["--input", skewed["user"], *args], machines=2).history,
                run_local(NMF, ["--input", skewed["shuffled"], *args]).history):
        for a, b in zip(one, got):
            assert b["test_rmse"] == pytest.approx(a["test_rmse"], rel=1e-3)
            assert b["objective"] == pytest.approx(a["objective"], rel=1e-3)


def test_als_with_several_iterations_per_epoch_converges_alike(skewed):
    """--iters-per-epoch k: each iteration replaces its blocks' share of the
    stored sums (exact for k = 1, proportional for k > 1)."""
    args = ["--input", skewed["user"], "--rank", "8", "--max-epochs", "15"]
    one = run_local(NMF, args).history[-1]["test_rmse"]
    for m, k in ((1, 4), (2, 2)):
        got = run_local(NMF, args + ["--iters-per-epoch", str(k)],
                        machines=m).history[-1]["test_rmse"]
        print(f"{m} machine(s), {k} iterations/epoch: {got:.4f} (1 iteration: {one:.4f})")
        assert got <= 1.05 * one


def test_nn_solve_is_the_nonnegative_least_squares_solution():
    from scipy.optimize import nnls
    nn_solve = NMF.compute.__globals__["nn_solve"]
    rng = np.random.default_rng(4)
    F = rng.standard_normal((50, 30, 6))
    y = rng.standard_normal((50, 30))
    M = np.einsum("nij,nik->njk", F, F) + 0.1 * np.eye(6)
    v = np.einsum("nij,ni->nj", F, y)
    got = nn_solve(M, v)
    A = np.concatenate([F, np.broadcast_to(np.sqrt(0.1) * np.eye(6), (50, 6, 6))], axis=1)
    want = np.stack([nnls(A[j], np.concatenate([y[j], np.zeros(6)]))[0] for j in range(50)])
    assert (got >= 0).all() and (got == 0).any()
    assert np.allclose(got, want, atol=1e-8)


def test_the_reference_rows_are_exact_nnls(skewed):
    """The reference's row solve is the NNLS optimum (checked against the
    KKT conditions), not a clipped ridge solution: the item rows, solved
    last, against the final user rows."""
    u, i, r, test = load_split(skewed["user"])
    tr = ~test
    L, R = nnls_als(u[tr], i[tr], r[tr], u.max() + 1, i.max() + 1, 8, 0.01, sweeps=3)
    zeros = 0
    for item in np.unique(i[tr])[:200]:
        sel = tr & (i == item)
        A, y, x = L[u[sel]], r[sel], R[item]
        g = 2 * (A.T @ (A @ x - y) + 0.01 * sel.sum() * x)      # the objective's gradient
        assert (x >= 0).all()
        scale = 1e-6 * (1 + np.abs(A.T @ y).max())
        assert np.allclose(g[x > 0], 0, atol=scale) and (g[x == 0] >= -scale).all()
        zeros += int((x == 0).sum())
    assert zeros > 0           # some constraints are active (a clip would violate KKT there)
