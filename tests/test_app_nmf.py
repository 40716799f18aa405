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
from scipy.sparse import csr_matrix                     # noqa: E402

from harmony.app import load_app, run_local            # noqa: E402

NMF = load_app(NMF_APP.read_text(), "nmf.py")
ZIPF = dict(users=2000, items=600, rank=8, per_user=40, noise=0.1, seed=5, activity="zipf")
RANK, EPOCHS = 16, 25


def nn_als(u, i, r, nu, ni, k, lam, iters=12, seed=0):
    """Non-negative ALS: each row the ridge solution (lam per rating), clipped at 0."""
    rng = np.random.default_rng(seed)
    L, R = rng.uniform(0, 1, (nu, k)), rng.uniform(0, 1, (ni, k))

    def solve(a, b, F, n):
        S = csr_matrix((np.ones(len(a)), (a, np.arange(len(a)))), shape=(n, len(a)))
        A = (S @ (F[b][:, :, None] * F[b][:, None, :]).reshape(len(a), k * k)).reshape(n, k, k)
        A += lam * np.maximum(np.bincount(a, minlength=n), 1)[:, None, None] * np.eye(k)
        return np.maximum(np.linalg.solve(A, (S @ (F[b] * r[:, None]))[:, :, None])[..., 0], 0)

    for _ in range(iters):
        L = solve(u, i, R, nu)
        R = solve(i, u, L, ni)
    return L, R


@pytest.fixture(scope="module")
def zipf(tmp_path_factory):
    path = tmp_path_factory.mktemp("zipf") / "ratings.txt"
    shape = gen_nmf(str(path), **ZIPF)
    a = np.loadtxt(path)
    u, i, r = a[:, 0].astype(np.int64), a[:, 1].astype(np.int64), a[:, 2]
    test = NMF.read_input.__globals__["holdout_mask"](u, i, 0.1, 0)   # the app's split
    best = {}
    for lam in (0.01, 0.03):          # the reference at its best regularization (of 0.005..0.03)
        L, R = nn_als(u[~test], i[~test], r[~test], u.max() + 1, i.max() + 1, RANK, lam)
        best[lam] = float(np.sqrt(np.mean(((L[u[test]] * R[i[test]]).sum(1) - r[test]) ** 2)))
    print("ALS test RMSE by lambda:", best)
    return {"path": str(path), "shape": shape, "als": min(best.values())}


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
    assert (res.model[:, :RANK] >= 0).all()


def test_zipf_on_two_machines_comes_within_1_25x_of_als(client, zipf):
    args = ["--input", zipf["path"], "--rank", str(RANK), "--max-epochs", str(EPOCHS)]
    job = client.submit("nmf.py", NMF_APP.read_text(), args, machines=2)
    st = wait_state(client, job, ("finished", "failed"), timeout=180)
    assert st["state"] == "finished", st["error"]
    got = st["epochs"][-1]["metrics"]["test_rmse"]
    print(f"2 machines: app {got:.4f}  ALS {zipf['als']:.4f}  ratio {got / zipf['als']:.3f}")
    assert got <= 1.25 * zipf["als"]


def test_every_epoch_visits_ratings_in_a_new_seeded_order(zipf):
    """Same seed: the same result; another seed: another order (and result)."""
    args = ["--input", zipf["path"], "--rank", "4", "--max-epochs", "2"]
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
