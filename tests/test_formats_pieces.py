"""PieceBuffer (a reader's per-block pieces in bounded memory) and the
readers that use it: the same blocks with a memory limit as without."""
import os
from pathlib import Path

import numpy as np
import pytest

from harmony.app import InputPart, load_app, parse_app_args
from harmony.datagen.lasso import gen_lasso
from harmony.datagen.lda import gen_lda
from harmony.datagen.nmf import gen_nmf
from harmony.formats.pieces import PieceBuffer

APPS = Path(__file__).resolve().parent.parent / "apps"


def test_pieces_come_back_in_order_within_the_limit(tmp_path):
    rng = np.random.default_rng(0)
    added: dict[int, list] = {}
    with PieceBuffer(limit=64 << 10, scratch_dir=str(tmp_path / "s")) as buf:
        for i in range(400):
            key = int(rng.integers(0, 7))
            piece = (rng.random(int(rng.integers(1, 800))),
                     np.arange(int(rng.integers(0, 50)), dtype=np.int32) + i)
            buf.add(key, *piece)
            added.setdefault(key, []).append(piece)
            assert buf.held <= (64 << 10) + piece[0].nbytes + piece[1].nbytes
        assert buf.spilled > 0 and buf.keys() == set(added)
        assert os.listdir(tmp_path / "s")
        for key, pieces in added.items():
            got = buf.take(key)
            assert len(got) == len(pieces)
            for g, p in zip(got, pieces):
                assert all(a.dtype == b.dtype and np.array_equal(a, b) for a, b in zip(g, p))
        assert buf.take(99) == [] and buf.held == 0 and not buf.keys()
    assert not os.listdir(tmp_path / "s")


def test_without_a_limit_nothing_is_written(tmp_path):
    buf = PieceBuffer(scratch_dir=str(tmp_path / "s"))
    for i in range(100):
        buf.add(i % 3, np.zeros(10_000))
    assert buf.spilled == 0 and not (tmp_path / "s").exists()
    assert len(buf.take(0)) == 34
    buf.close()


def _blocks(app: str, args: list[str], part: InputPart) -> dict:
    cls = load_app((APPS / app).read_text(), app)
    return {b.id: b.arrays for b in cls(parse_app_args(cls, args)).read_input(part)}


@pytest.mark.parametrize("app,gen", [
    ("nmf.py", lambda p: gen_nmf(p, users=3000, items=300)),
    ("lasso.py", lambda p: gen_lasso(p, samples=3000, features=200)),
    ("mlr.py", None),
    ("lda.py", lambda p: gen_lda(p, docs=400, vocab=300)),
])
def test_readers_give_the_same_blocks_in_bounded_memory(tmp_path, app, gen):
    path = str(tmp_path / "input.txt")
    if gen is None:
        from harmony.datagen.mlr import gen_mlr
        gen_mlr(path, samples=3000, features=200, classes=4)
    else:
        gen(path)
    args = ["--input", path, "--blocks", "8"]
    free = _blocks(app, args, InputPart(1, 2, 8))
    scratch = tmp_path / "scratch"
    tight = _blocks(app, args, InputPart(1, 2, 8, memory_limit=16 << 10,
                                         scratch_dir=str(scratch)))
    assert sorted(free) == sorted(tight) == [1, 3, 5, 7]
    for b in free:
        assert list(free[b]) == list(tight[b])
        for name in free[b]:
            assert np.array_equal(free[b][name], tight[b][name]), (b, name)
    assert scratch.exists() and not any(scratch.iterdir())   # written, then removed
