import gzip

import numpy as np
import pytest

from harmony.app import AppError, InputError, InputPart, load_app, parse_app_args, run_local
from conftest import NMF_APP

NMF_SRC = NMF_APP.read_text()


@pytest.mark.parametrize("src, text", [
    ("def broken(:\n", r"bad\.py:1: syntax error"),
    ("x = 1\n", "exactly one subclass"),
    ("raise RuntimeError('boom at import')\n", "failed to load: RuntimeError: boom at import"),
    ("from harmony.app import App\nclass A(App):\n    pass\n", "does not define read_input"),
])
def test_bad_app_files(src, text):
    with pytest.raises(AppError, match=text):
        load_app(src, "bad.py")


def test_bad_app_options():
    cls = load_app(NMF_SRC, "nmf.py")
    with pytest.raises(AppError, match="required: --input"):
        parse_app_args(cls, [])
    with pytest.raises(AppError, match="unrecognized arguments: --nope"):
        parse_app_args(cls, ["--input", "x", "--nope"])
    with pytest.raises(AppError, match="invalid int value"):
        parse_app_args(cls, ["--input", "x", "--rank", "many"])
    with pytest.raises(AppError, match="--max-epochs must be >= 1"):
        parse_app_args(cls, ["--input", "x", "--max-epochs", "0"])


def _read(path, *extra):
    cls = load_app(NMF_SRC, "nmf.py")
    app = cls(parse_app_args(cls, ["--input", str(path), *extra]))
    return app, list(app.read_input(InputPart(0, 1, 4)))


@pytest.mark.parametrize("body, line, text", [
    ("1 2 3.0\n1 2\n", 2, "expected 'user item rating', got 2"),
    ("# comment\n1 2 3\n\n4 x 5\n", 4, "not a number: 'x'"),
    ("1 2 3\n-1 2 3\n", 2, "non-negative integers"),
    ("1 2 3\n1 2.5 3\n", 2, "non-negative integers"),
    ("1 2 nan\n", 1, "finite"),
])
def test_nmf_bad_input_lines_name_file_and_line(tmp_path, body, line, text):
    p = tmp_path / "r.txt"
    p.write_text(body)
    with pytest.raises(InputError, match=text) as ei:
        _read(p)
    assert ei.value.line == line and ei.value.path == str(p)


def test_input_error_survives_pickling():
    # a multiprocessing pool sends a worker's exception back pickled; one
    # that cannot be rebuilt hangs the pool instead of raising
    import pickle
    e = pickle.loads(pickle.dumps(InputError("/d/r.txt", 7, "not a number: 'x'")))
    assert (e.path, e.line, e.reason) == ("/d/r.txt", 7, "not a number: 'x'")
    assert str(e) == "/d/r.txt:7: not a number: 'x'"


def test_nmf_missing_and_empty_input(tmp_path):
    with pytest.raises(InputError, match="cannot open input"):
        _read(tmp_path / "nope.txt")
    (tmp_path / "e.txt").write_text("# nothing\n")
    with pytest.raises(InputError, match="no ratings"):
        _read(tmp_path / "e.txt")


def test_nmf_reads_gzip_and_movielens_separators(tmp_path):
    lines = "1::10::4::978300760\n2,11,3.5\n3\t10\t1\n"
    with gzip.open(tmp_path / "r.txt.gz", "wt") as fh:
        fh.write(lines)
    app, blocks = _read(tmp_path / "r.txt.gz", "--holdout", "0")
    assert app.model_spec().num_keys == 12
    got = sorted(zip(np.concatenate([b["uid"][b["u"]] for b in blocks]).tolist(),
                     np.concatenate([b["i"] for b in blocks]).tolist(),
                     np.concatenate([b["r"] for b in blocks]).tolist()))
    assert got == [(1, 10, 4.0), (2, 11, 3.5), (3, 10, 1.0)]


def test_input_partition_covers_every_rating_once(ratings):
    cls = load_app(NMF_SRC, "nmf.py")
    app_args = ["--input", ratings, "--holdout", "0"]
    total = 0
    users = []
    for idx in range(3):
        app = cls(parse_app_args(cls, app_args))
        for b in app.read_input(InputPart(idx, 3, 8)):
            assert b.id % 3 == idx
            total += len(b["r"])
            users.append(b["uid"])
    users = np.concatenate(users)
    assert total == 1500 * 20 and len(np.unique(users)) == len(users) == 1500


def test_run_local_reduces_objective(ratings):
    cls = load_app(NMF_SRC, "nmf.py")
    res = run_local(cls, ["--input", ratings, "--max-epochs", "4"])
    objs = [h["objective"] for h in res.history]
    assert len(objs) == 4 and objs[-1] < 0.5 * objs[0]
    assert (res.model >= 0).all()


# -- divergence ---------------------------------------------------------------------------

MINIMAL_SRC = (NMF_APP.parent / "minimal.py").read_text()


def test_rising_objective_fails_naming_the_step_option():
    cls = load_app(MINIMAL_SRC, "minimal.py")
    # least squares with a step past 2/lambda_max: the objective grows every epoch
    with pytest.raises(AppError, match=r"stayed over .* 3 epochs in a row.*lower --lr \(now 2\.5\)"):
        run_local(cls, ["--lr", "2.5", "--max-epochs", "30"])
    with pytest.raises(AppError, match=r"stayed over .* 5 epochs in a row"):
        run_local(cls, ["--lr", "2.5", "--max-epochs", "30", "--diverge-epochs", "5"])
    with pytest.raises(AppError, match=r"objective diverged at epoch \d+ \((inf|nan)\).*lower --lr"), \
            np.errstate(all="ignore"):      # float32 overflows on the way
        run_local(cls, ["--lr", "2.5", "--max-epochs", "2000", "--diverge-epochs", "0"])
    ok = run_local(cls, ["--max-epochs", "10"])              # the default step converges
    assert ok.history[-1]["objective"] < 1e-3 * ok.history[0]["objective"]


def test_an_app_may_only_warn(caplog):
    src = MINIMAL_SRC.replace('on_divergence = "fail"', 'on_divergence = "warn"')
    cls = load_app(src, "minimal.py")
    with caplog.at_level("WARNING", logger="harmony.app"):
        res = run_local(cls, ["--lr", "2.2", "--max-epochs", "8"])
    assert len(res.history) == 8
    warns = [r.getMessage() for r in caplog.records if "stayed over" in r.getMessage()]
    assert len(warns) == 1 and "lower --lr (now 2.2)" in warns[0]


def test_noise_sized_rises_are_not_divergence():
    from harmony.app import DivergenceWatch
    w = DivergenceWatch("lr", "fail")
    for e, obj in enumerate([1.0, 0.5, 0.5001, 0.50015, 0.5002, 0.50025, 0.4]):
        w.check(e, obj, 3)                      # rises below DIVERGE_RTOL do not count
    with pytest.raises(AppError):
        for e, obj in enumerate([0.4, 0.43, 0.45, 0.47]):
            w.check(e, obj, 3)
    # the NMF job, long past convergence: SGD noise of 0.6% around its
    # minimum, 3 rises in a row, thousands of epochs: never divergence
    w = DivergenceWatch("lr", "fail")
    rng = np.random.default_rng(0)
    w.check(0, 1.0e5, 3)
    for e in range(1, 3000):
        w.check(e, 2570.0 * (1 + 0.004 * abs(rng.standard_normal())), 3)
    for e, obj in enumerate([2573.73, 2580.1, 2584.9, 2588.42], start=3000):
        w.check(e, obj, 3)
    # ... and one that climbs away from its best by a fifth is
    with pytest.raises(AppError, match="3 epochs in a row"):
        for e, obj in enumerate([2700.0, 2900.0, 3100.0, 3300.0], start=4000):
            w.check(e, obj, 3)
    # an objective that reaches ~0 (0.1% of the progress made is the margin)
    w = DivergenceWatch("lr", "fail")
    for e, obj in enumerate([100.0, 1.0, 1e-3, 2e-3, 5e-3, 9e-3, 1e-3]):
        w.check(e, obj, 3)
    with pytest.raises(AppError, match="--diverge-epochs must be >= 0"):
        parse_app_args(load_app(MINIMAL_SRC, "minimal.py"), ["--diverge-epochs", "-1"])


def test_run_local_holds_an_app_to_its_declared_mutable_input():
    hook = "    def compute(self, blocks, keys, rows, step):\n"
    src = MINIMAL_SRC.replace(hook, hook + "        blocks[0]['y'][0] += 0.0\n")
    assert src != MINIMAL_SRC and "mutable_input = ()" in src
    with pytest.raises(ValueError, match="read-only"):   # as a spilled block would be
        run_local(load_app(src, "minimal.py"), ["--max-epochs", "1"])
    declared = src.replace("mutable_input = ()", "mutable_input = ('y',)")
    run_local(load_app(declared, "minimal.py"), ["--max-epochs", "1"])
    undeclared = src.replace("mutable_input = ()", "mutable_input = None")
    run_local(load_app(undeclared, "minimal.py"), ["--max-epochs", "1"])
    bad = src.replace("mutable_input = ()", "mutable_input = 'y'")
    with pytest.raises(AppError, match="mutable_input must be a tuple"):
        run_local(load_app(bad, "minimal.py"), ["--max-epochs", "1"])
