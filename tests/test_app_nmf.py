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
