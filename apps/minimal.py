"""Least squares by gradient descent: the smallest complete Harmony app."""
import numpy as np

from harmony.app import App, ModelSpec, Option
from harmony.store.blocks import Block


class LeastSquares(App):
    """Fit w in y = X w on generated data; w lives on the servers."""
    name = "minimal"
    combine = "sum"       # each machine's gradient is divided by ALL samples: the sum is one step
    step_option = "lr"    # named in the error if the objective diverges
    on_divergence = "fail"
    mutable_input = ()    # input is read-only: spilled blocks load zero-copy
    options = [Option("samples", int, 2000, "rows of X"),
               Option("features", int, 20, "columns of X (= model keys)"),
               Option("lr", float, 0.5, "step size")]

    def read_input(self, part):           # this machine's blocks of samples
        rng = np.random.default_rng(self.opts.seed)
        w_true = rng.normal(size=self.opts.features)
        X = rng.normal(size=(self.opts.samples, self.opts.features))
        y = X @ w_true
        blocks = part.block_of(np.arange(self.opts.samples))
        for b in part.my_blocks():
            yield Block(b, {"X": X[blocks == b], "y": y[blocks == b]})

    def model_spec(self):                 # one row of 1 value per feature
        return ModelSpec(num_keys=self.opts.features, dim=1)

    def keys(self, blocks):               # every block needs all of w
        return np.arange(self.opts.features)

    def compute(self, blocks, keys, rows, step):
        w = rows[:, 0]
        grad = sum((b["X"].T @ (b["X"] @ w - b["y"]) for b in blocks), np.zeros(len(w)))
        return (-self.opts.lr / self.opts.samples * grad)[:, None].astype(np.float32)

    def objective(self, blocks, keys, rows):  # summed over machines
        r = [b["X"] @ rows[:, 0] - b["y"] for b in blocks]
        return {"objective": 0.5 * sum(float(v @ v) for v in r) / self.opts.samples}

    def export(self, keys, rows, meta):       # harmony model get: the model as named arrays
        return {"w": rows[:, 0].copy()}
