"""A PyTorch MLP trained data-parallel on the parameter servers.

The module's parameters live on the servers as rows
(:class:`harmony.torch_helper.ModuleRows`). Every iteration a machine pulls
all rows, binds them to its copy of the module (the parameters become views
of one working copy of the pulled rows), runs SGD with momentum over its
share of the iteration's samples with gradients from autograd, and pushes the
change of the parameters.

Several machines (``combine = "mean"``): ``--batch-size`` is the global
mini-batch. On ``m`` machines each steps on ``batch_size / m`` of its own
samples and the servers average the changes: with one optimizer step per
iteration that is exactly one step on the global batch (SGD and its momentum
are linear in the gradients, and each machine's momentum buffer sees the
same sequence as a global one would, averaged); with several local steps per
iteration it is local SGD with model averaging, every machine taking as many
steps per epoch as one machine alone. The momentum buffers stay on their
machines (they are not checkpointed: a resumed job restarts them at 0).

Data (``--dataset``): scikit-learn's handwritten digits (8x8 pixels / 16, 10
classes; the default), wine or breast_cancer (standardized), all shipped
with scikit-learn (no download), split 75/25 into train and test with
``--split-seed``; samples are hashed to input blocks by index. Reported
per epoch: ``objective`` (mean training cross-entropy), ``accuracy``,
``test_loss`` and ``test_accuracy``.
"""
from __future__ import annotations

import math
import os

import numpy as np
import torch
from torch import nn

from harmony.app import App, AppError, InputPart, ModelSpec, Option, Step
from harmony.store.blocks import Block
from harmony.torch_helper import ModuleRows


DATASETS = ("digits", "wine", "breast_cancer")


def dataset(name: str = "digits", split_seed: int = 0):
    """(X_train, y_train, X_test, y_test) of one of scikit-learn's shipped data
    sets, a stratified 75/25 split: digits / 16; the others standardized
    with the training split's mean and deviation."""
    from sklearn import datasets
    from sklearn.model_selection import train_test_split
    X, y = getattr(datasets, f"load_{name}")(return_X_y=True)
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.25, random_state=split_seed,
                                          stratify=y)
    if name == "digits":
        Xtr, Xte = Xtr / 16.0, Xte / 16.0
    else:
        mu, sd = Xtr.mean(0), Xtr.std(0) + 1e-12
        Xtr, Xte = (Xtr - mu) / sd, (Xte - mu) / sd
    return (Xtr.astype(np.float32), ytr.astype(np.int64), Xte.astype(np.float32),
            yte.astype(np.int64))


def digits(split_seed: int = 0):
    return dataset("digits", split_seed)


def make_mlp(inputs: int, hidden: int, layers: int, classes: int, seed: int) -> nn.Module:
    """The MLP, its initial weights a function of ``seed`` only."""
    g = torch.Generator().manual_seed(seed)
    mods: list[nn.Module] = []
    width = inputs
    for _ in range(layers):
        mods += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    mods.append(nn.Linear(width, classes))
    net = nn.Sequential(*mods)
    with torch.no_grad():                     # nn.Linear's default init, from our generator
        for m in net:
            if isinstance(m, nn.Linear):
                bound = 1.0 / math.sqrt(m.in_features)
                m.weight.uniform_(-bound, bound, generator=g)
                m.bias.uniform_(-bound, bound, generator=g)
    return net


class TorchMLP(App):
    """A torch MLP on scikit-learn's digits (or wine, breast_cancer), data-parallel SGD."""

    name = "torch_mlp"
    static_keys = True
    combine = "mean"        # each machine's delta is a whole SGD update on its share
    step_option = "lr"
    on_divergence = "fail"
    mutable_input = ()    # input is read-only: spilled blocks load zero-copy
    options = [
        Option("hidden", int, 128, "units per hidden layer"),
        Option("layers", int, 1, "hidden layers"),
        Option("lr", float, 0.05, "SGD step size"),
        Option("momentum", float, 0.9, "SGD momentum"),
        Option("batch_size", int, 32, "global mini-batch (split over the machines)"),
        Option("dataset", str, "digits", "scikit-learn data set (shipped, no download)",
               choices=DATASETS),
        Option("split_seed", int, 0, "seed of the train/test split"),
        Option("threads", int, 0, "torch intra-op threads per machine (0: the machine's "
               "cores, as the worker daemon sets HARMONY_THREADS; 1 outside a cluster)"),
    ]

    def read_input(self, part: InputPart):
        o = self.opts
        if o.hidden < 1 or o.layers < 0 or o.lr <= 0 or not (0 <= o.momentum < 1) \
                or o.batch_size < 1 or o.threads < 0:
            raise AppError("bad app options: need hidden >= 1, layers >= 0, lr > 0, "
                           "0 <= momentum < 1, batch_size >= 1, threads >= 0")
        threads = o.threads or int(os.environ.get("HARMONY_THREADS") or 1)
        torch.set_num_threads(max(1, threads))
        Xtr, ytr, Xte, yte = dataset(o.dataset, o.split_seed)
        self.net = make_mlp(Xtr.shape[1], o.hidden, o.layers, int(ytr.max()) + 1, o.seed)
        self.rows = ModuleRows(self.net)
        self.opt = torch.optim.SGD(self.net.parameters(), lr=o.lr, momentum=o.momentum)
        btr = part.block_of(np.arange(len(ytr)))
        bte = part.block_of(np.arange(len(yte)))
        for b in part.my_blocks():
            yield Block(b, {"X": Xtr[btr == b], "y": ytr[btr == b],
                            "tX": Xte[bte == b], "ty": yte[bte == b]})

    def model_spec(self) -> ModelSpec:
        return self.rows.spec()

    def init_rows(self, keys: np.ndarray) -> np.ndarray:
        return self.rows.init_rows(keys)

    def keys(self, blocks: list[Block]) -> np.ndarray:
        return self.rows.keys()

    def compute(self, blocks: list[Block], keys: np.ndarray, rows: np.ndarray,
                step: Step) -> np.ndarray:
        net = self.rows.bind(rows)
        if not blocks:
            return self.rows.deltas(rows)
        X, y = self._stack(blocks, "X", "y")
        g = torch.Generator().manual_seed(self.opts.seed * 1_000_003 + step.epoch * 1009
                                          + step.iter)
        perm = torch.randperm(len(y), generator=g)
        bs, opt = max(1, round(self.opts.batch_size / step.machines)), self.opt
        for s in range(0, len(y), bs):
            idx = perm[s:s + bs]
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(net(X[idx]), y[idx]).backward()
            opt.step()
        return self.rows.deltas(rows)

    def objective(self, blocks: list[Block], keys: np.ndarray, rows: np.ndarray) -> dict:
        net = self.rows.bind(rows)
        out = {"ce": 0.0, "n": 0.0, "correct": 0.0, "test_ce": 0.0, "test_n": 0.0,
               "test_correct": 0.0}
        with torch.no_grad():
            for pre, xk, yk in (("", "X", "y"), ("test_", "tX", "ty")):
                X, y = self._stack(blocks, xk, yk)     # one forward pass, not one per block
                if not len(y):
                    continue
                z = net(X)
                out[pre + "ce"] += float(nn.functional.cross_entropy(z, y, reduction="sum"))
                out[pre + "correct"] += float((z.argmax(1) == y).sum())
                out[pre + "n"] += len(y)
        return out

    def _stack(self, blocks: list[Block], xk: str, yk: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The blocks' samples as two tensors. A block's samples depend only
        on its id, so they are kept by block ids and every epoch after the
        first reuses them (the data sets are small: this is one more copy of
        the machine's input; a few sets of ids at a time)."""
        key = (xk, tuple(int(b.id) for b in blocks))
        cache = self.__dict__.setdefault("_stacked", {})
        got = cache.get(key)
        if got is None:
            if len(cache) >= 8:       # the groups changed (a resize, other iterations)
                cache.clear()
            X = np.concatenate([b[xk] for b in blocks]) if blocks else \
                np.zeros((0, self.net[0].in_features), np.float32)
            y = np.concatenate([b[yk] for b in blocks]) if blocks else np.zeros(0, np.int64)
            got = cache[key] = (torch.from_numpy(X), torch.from_numpy(y))
        return got

    # -- export (harmony model get) -------------------------------------------------
    def export_meta(self) -> dict:
        return {"params": [[name, list(p.shape)] for name, p in self.net.named_parameters()
                           if p.requires_grad]}

    def export(self, keys: np.ndarray, rows: np.ndarray, meta: dict) -> dict:
        """The module's parameters by ``state_dict`` name (``0.weight``,
        ``0.bias``, ...): ``make_mlp(...).load_state_dict({k: torch.from_numpy(v)})``
        loads them."""
        if "params" not in meta:
            raise AppError("the checkpoint holds no parameter layout (export_meta)")
        flat, out, at = rows.reshape(-1), {}, 0
        for name, shape in meta["params"]:
            n = int(np.prod(shape, dtype=np.int64))
            out[name] = flat[at:at + n].reshape(shape).copy()
            at += n
        return out

    def metrics(self, s: dict) -> dict:
        n, tn = s.get("n", 0.0), s.get("test_n", 0.0)
        out = {"objective": s["ce"] / n if n else math.nan,
               "accuracy": s["correct"] / n if n else math.nan}
        if tn:
            out["test_loss"] = s["test_ce"] / tn
            out["test_accuracy"] = s["test_correct"] / tn
        return out
