"""PyTorch modules on the parameter servers: a module's parameters as model rows.

The app API stays the NumPy one (``keys``/``compute``/``objective`` on arrays);
this helper only maps a ``torch.nn.Module``'s parameters to rows and back::

    self.net = MLP(...)                       # the same seed on every machine
    self.rows = ModuleRows(self.net)          # every parameter, flattened
    model_spec()      -> self.rows.spec()
    init_rows(keys)   -> self.rows.init_rows(keys)
    keys(blocks)      -> self.rows.keys()
    compute(...):   self.rows.bind(rows)      # the module now trains on the rows
                    ... optimizer steps ...
                    return self.rows.deltas(rows)

Parameters are laid out one after another (``module.parameters()`` order)
in rows of ``dim`` float32 values, the last row zero-padded. ``bind`` copies
the pulled rows once into a working buffer that the parameters are *views*
of (``torch.from_numpy``, no copies after that: the optimizer's in-place
steps write the buffer), and ``deltas`` is the buffer minus the pulled rows.
The pulled rows themselves are read-only, which is why the one copy is
needed: the delta is the change from them.
"""
from __future__ import annotations

import numpy as np
import torch

from harmony.app import ModelSpec


class ModuleRows:
    """A module's trainable parameters as ``num_keys`` rows of ``dim`` values."""

    def __init__(self, module: torch.nn.Module, dim: int = 1024) -> None:
        if dim < 1:
            raise ValueError("dim must be >= 1")
        self.module = module
        self.params = [p for p in module.parameters() if p.requires_grad]
        for p in self.params:
            if p.dtype != torch.float32:
                raise TypeError(f"ModuleRows needs float32 parameters, got {p.dtype}")
        self.sizes = [p.numel() for p in self.params]
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        self.numel = int(self.offsets[-1])
        self.dim = int(dim)
        self.num_keys = max(1, -(-self.numel // self.dim))
        self._buf: np.ndarray | None = None

    # -- the model on the servers ------------------------------------------------
    def spec(self) -> ModelSpec:
        return ModelSpec(num_keys=self.num_keys, dim=self.dim, dtype="float32")

    def keys(self) -> np.ndarray:
        """Every row: data-parallel training pulls the whole module."""
        return np.arange(self.num_keys, dtype=np.int64)

    def flatten(self) -> np.ndarray:
        """The module's current parameters as rows (a new array)."""
        out = np.zeros(self.num_keys * self.dim, dtype=np.float32)
        with torch.no_grad():
            for p, a, n in zip(self.params, self.offsets, self.sizes):
                out[a:a + n] = p.detach().reshape(-1).numpy()
        return out.reshape(self.num_keys, self.dim)

    def init_rows(self, keys: np.ndarray) -> np.ndarray:
        """Initial rows = the module's parameters as constructed (build the
        module from the job's seed so every machine makes the same ones)."""
        return self.flatten()[np.asarray(keys, dtype=np.int64)]

    # -- a pulled copy to train on -------------------------------------------------
    def bind(self, rows: np.ndarray) -> torch.nn.Module:
        """Make the module's parameters views of a working copy of ``rows``
        (all keys, in key order); returns the module."""
        if rows.shape != (self.num_keys, self.dim):
            raise ValueError(f"expected rows of shape {(self.num_keys, self.dim)}, "
                             f"got {rows.shape}: pull every key (ModuleRows.keys())")
        if self._buf is None:
            self._buf = np.empty((self.num_keys, self.dim), dtype=np.float32)
            flat = torch.from_numpy(self._buf).view(-1)        # shares the buffer's memory
            with torch.no_grad():
                for p, a, n in zip(self.params, self.offsets, self.sizes):
                    p.data = flat[a:a + n].view_as(p)
        np.copyto(self._buf, rows)
        return self.module

    def deltas(self, rows: np.ndarray) -> np.ndarray:
        """What training changed since ``bind(rows)``: buffer - rows."""
        if self._buf is None:
            raise RuntimeError("deltas() before bind()")
        return self._buf - rows
