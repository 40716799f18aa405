"""The names of staged data sets, pure (no ZeroMQ, no LMDB): what the
master's core checks and looks up (``harmony://NAME`` in a job's options,
a data set's name). :mod:`harmony.store.staging` moves the data."""
from __future__ import annotations

from harmony.util import names

URL = "harmony://"


class StagingError(RuntimeError):
    pass


def check_name(name: str) -> str:
    """``name`` if it is a valid data set name, else StagingError."""
    try:
        return names.check(name, "data set name")
    except names.BadName as exc:
        raise StagingError(str(exc)) from None


def refs(args: list[str]) -> list[str]:
    """Data set names referred to as ``harmony://NAME`` in app options."""
    out = []
    for a in args:
        for part in str(a).split("="):
            if part.startswith(URL):
                out.append(part[len(URL):])
    return out
