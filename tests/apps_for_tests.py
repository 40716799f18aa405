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
        return np.full(rows.shape, 0.1, dtype=np.float32)

    def objective(self, blocks, keys, rows):
        return {"objective": float(rows.sum()) if len(blocks) else 0.0}
'''
