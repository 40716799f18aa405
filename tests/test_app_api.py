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
