"""Synthetic data sets in the apps' input formats, written streaming.

Each module in this package is one generator kind for ``harmony data gen
KIND``. It defines ``KIND`` (str), ``HELP`` (str), ``add_arguments(parser)``
(its options; ``--out`` and ``--seed`` are added for it) and
``generate(args) -> dict`` (writes ``args.out``, returns the shape written).
The CLI discovers the modules; nothing else needs registering.
"""
from __future__ import annotations

import gzip
import importlib
import io
import pkgutil
from types import ModuleType


def open_out(path: str):
    """A text file for writing; gzip-compressed when the path ends in .gz."""
    if path.endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, "wb", compresslevel=3), encoding="utf-8")
    return open(path, "w", encoding="utf-8")


def generators() -> dict[str, ModuleType]:
    out = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        mod = importlib.import_module(f"{__name__}.{info.name}")
        if hasattr(mod, "KIND") and hasattr(mod, "generate"):
            out[mod.KIND] = mod
    return out


def gen_nmf(*args, **kwargs) -> dict:
    from harmony.datagen.nmf import gen_nmf as _gen
    return _gen(*args, **kwargs)
