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
