import numpy as np
import pytest

from harmony.ps.keymap import block_of, keyed_uniform
from harmony.store.blocks import Block, BlockFormatError, BlockStore, export_block, import_block


def test_block_export_import_is_byte_identical():
    rng = np.random.default_rng(0)
    blk = Block(7, {"u": rng.integers(0, 100, 50), "L": rng.random((10, 4), dtype=np.float32),
                    "empty": np.zeros((0, 3))})
    data = export_block(blk)
    back = import_block(data)
    assert back.id == 7 and list(back.arrays) == list(blk.arrays)
    for k in blk.arrays:
        assert back[k].dtype == blk[k].dtype and back[k].shape == blk[k].shape
        assert back[k].tobytes() == blk[k].tobytes()
    assert export_block(back) == data


@pytest.mark.parametrize("mutate", [lambda d: b"XXXX" + d[4:], lambda d: d[:-3],
                                    lambda d: d + b"junk", lambda d: d[:10]])
def test_corrupt_block_is_rejected(mutate):
    data = export_block(Block(1, {"a": np.arange(10)}))
    with pytest.raises(BlockFormatError):
        import_block(mutate(data))


def test_store_interface():
    st = BlockStore()
    st.put(Block(2, {"a": np.arange(4)}))
    st.put(Block(1, {"a": np.arange(2)}))
    assert st.ids() == [1, 2] and st.size(2) == 32 and st.total_bytes() == 48
    data = st.export(2)
    st.remove(2)
    assert st.import_(data) == 2 and np.array_equal(st.get(2)["a"], np.arange(4))
    with pytest.raises(KeyError, match="block 9"):
        st.get(9)


def test_block_of_spreads_keys_evenly():
    b = block_of(np.arange(100_000), 16)
    counts = np.bincount(b, minlength=16)
    assert b.min() >= 0 and b.max() < 16
    assert counts.min() > 0.9 * 100_000 / 16 and counts.max() < 1.1 * 100_000 / 16


def test_keyed_uniform_depends_only_on_key():
    keys = np.arange(1000)
    full = keyed_uniform(keys, 5, seed=3)
    part = keyed_uniform(keys[[999, 3, 500]], 5, seed=3)
    assert np.array_equal(part, full[[999, 3, 500]])
    assert 0 <= full.min() and full.max() < 1 and abs(full.mean() - 0.5) < 0.02
    assert not np.array_equal(full, keyed_uniform(keys, 5, seed=4))
