"""Small app files used by tests (written to temp files and submitted)."""

TOY_APP = '''
import os, time
import numpy as np
from harmony.app import App, ModelSpec, Option
from harmony.store.blocks import Block


class Toy(App):
    """A tiny app: every key moves by 0.1 per iteration; can crash on demand."""
    name = "toy"
    options = [Option("crash", str, "none", "none|raise|abort|exit"),
               Option("crash_epoch", int, 1, ""),
               Option("sleep", float, 0.0, "seconds of COMP per iteration"),
               Option("spin", float, 0.0, "CPU seconds of COMP per iteration (busy)"),
               Option("keys", int, 50, "")]

    def read_input(self, part):
        for b in part.my_blocks():
            yield Block(b, {"k": np.arange(self.opts.keys, dtype=np.int64)})

    def model_spec(self):
        return ModelSpec(self.opts.keys, 2)

    def keys(self, blocks):
        return np.arange(self.opts.keys, dtype=np.int64) if blocks else np.zeros(0, np.int64)

    def compute(self, blocks, keys, rows, step):
        if step.epoch == self.opts.crash_epoch:
            if self.opts.crash == "raise":
                raise ZeroDivisionError("toy app blew up on purpose")
            if self.opts.crash == "abort":
                os.abort()
            if self.opts.crash == "exit":
                os._exit(7)
        time.sleep(self.opts.sleep)
        t = time.thread_time()
        while time.thread_time() - t < self.opts.spin:
            pass
        return np.full(rows.shape, 0.1, dtype=np.float32)

    def objective(self, blocks, keys, rows):
        return {"objective": float(rows.sum()) if len(blocks) else 0.0}
'''

BULK_APP = '''
import numpy as np
from harmony.app import App, ModelSpec, Option
from harmony.store.blocks import Block


class Bulk(App):
    """Large immutable input blocks, a small mutable state in each, light
    compute: memory-heavy, for the block store's tests."""
    name = "bulk"
    static_keys = True
    options = [Option("block_mb", float, 4.0, "payload per block (MiB)"),
               Option("keys", int, 64, "model keys")]

    def read_input(self, part):
        n = int(self.opts.block_mb * 2**20 / 8)
        for b in part.my_blocks():
            x = np.random.default_rng([self.opts.seed, b]).random(n)
            yield Block(b, {"x": x, "s": np.zeros(self.opts.keys)})

    def model_spec(self):
        return ModelSpec(self.opts.keys, 1)

    def keys(self, blocks):
        return np.arange(self.opts.keys, dtype=np.int64)

    def compute(self, blocks, keys, rows, step):
        k = len(keys)
        d = np.zeros((k, 1), dtype=np.float32)
        for b in blocks:
            x = b["x"]
            part = x[:len(x) // k * k].reshape(k, -1).mean(axis=1)
            b["s"] += part * (1.0 + rows[:, 0])          # mutable input state
            d[:, 0] += ((part - rows[:, 0]) * 0.1).astype(np.float32)
        return d

    def objective(self, blocks, keys, rows):
        return {"objective": float(sum(float(b["s"].sum()) for b in blocks)
                                   + float(rows.sum()))}
'''

ORACLE_APP = '''
import time
import numpy as np
from harmony.app import App, ModelSpec, Option
from harmony.store.blocks import Block


def block_keys(b, keys):
    k = np.arange(keys, dtype=np.int64)
    return k[(k + b) % 3 == 0]


class Oracle(App):
    """Every push adds known integers (exact in float64), so the model after
    any number of epochs has a closed form (see closed_form in the tests).
    Each input block carries a counter c (mutable app state, like NMF's L):
    processing block b adds c*(b+1) to column 0 and 1 to column 1 of its
    keys, then c += 1. A block processed twice, lost, or restored from a
    different epoch than the model changes the result."""
    name = "oracle"
    static_keys = True
    options = [Option("keys", int, 96, "model keys"),
               Option("sleep", float, 0.0, "seconds of COMP per iteration")]

    def read_input(self, part):
        for b in part.my_blocks():
            yield Block(b, {"c": np.ones(1, dtype=np.int64),
                            "k": block_keys(b, self.opts.keys)})

    def model_spec(self):
        return ModelSpec(self.opts.keys, 2, dtype="float64")

    def keys(self, blocks):
        ks = [b["k"] for b in blocks]
        return np.unique(np.concatenate(ks)) if ks else np.zeros(0, np.int64)

    def compute(self, blocks, keys, rows, step):
        time.sleep(self.opts.sleep)
        d = np.zeros((len(keys), 2))
        for b in blocks:
            idx = np.searchsorted(keys, b["k"])
            d[idx, 0] += float(b["c"][0] * (b.id + 1))
            d[idx, 1] += 1.0
            b["c"] += 1
        return d

    def objective(self, blocks, keys, rows):
        return {"c_sum": float(sum(int(b["c"][0]) - 1 for b in blocks)),
                "nblocks": float(len(blocks))}

    def model_objective(self, keys, rows):
        return {"m0": float(((keys + 1) * rows[:, 0]).sum()), "m1": float(rows[:, 1].sum())}

    def metrics(self, s):
        return {"objective": s.get("m0", 0.0), "m1": s.get("m1", 0.0),
                "c_sum": s.get("c_sum", 0.0), "nblocks": s.get("nblocks", 0.0)}
'''


def oracle_closed_form(epochs_done: int, blocks: int, keys: int = 96) -> dict:
    """The oracle app's metrics after ``epochs_done`` epochs (every block
    processed once per epoch, with c = 1, 2, ...)."""
    import numpy as np
    k = np.arange(keys)
    tri = epochs_done * (epochs_done + 1) // 2
    m0 = m1 = 0
    for b in range(blocks):
        ks = k[(k + b) % 3 == 0]
        m0 += int((ks + 1).sum()) * (b + 1) * tri
        m1 += len(ks) * epochs_done
    return {"objective": float(m0), "m1": float(m1), "c_sum": float(blocks * epochs_done),
            "nblocks": float(blocks)}
