"""What the master core and its shells say to each other: the commands the
core returns (:class:`Send`, :class:`Persist`, :class:`Admit`,
:class:`Record`, :class:`Solve`) and the events it is handed
(:class:`Received`, :class:`Malformed`, :class:`Tick`, :class:`Admitted`,
:class:`AdmitFailed`, :class:`Solved`, :class:`Unreachable`); see
:mod:`harmony.master.core`. Plain records, no behaviour."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harmony.comm import messages as M
from harmony.master.jobs import Job


# -- commands (core -> shell) ---------------------------------------------------------
@dataclass(slots=True)
class Send:
    to: bytes
    type: str
    fields: dict[str, Any]
    fail: Any = None          # the event to hand back if it cannot be delivered


@dataclass(slots=True)
class Persist:
    op: str                   # a JobDB method: save, save_epoch, trim_epochs, ...
    args: tuple


@dataclass(slots=True)
class Admit:
    ident: bytes              # who submitted it (the reply goes there)
    job: Job                  # without its id yet


@dataclass(slots=True)
class Record:
    stream: str               # machines | jobs | decisions | predictions
    obj: dict[str, Any]


@dataclass(slots=True)
class Solve:
    """Pure work too slow for the event loop (Cruise's MILP, up to seconds):
    the shell runs ``fn()`` wherever it likes and hands back
    :class:`Solved` with the same ``key``."""
    key: tuple
    fn: Any


# -- events (shell -> core) -------------------------------------------------------------
@dataclass(slots=True)
class Received:
    ident: bytes
    msg: M.Message
    role: str = ""            # with keys: client | reader | worker ("" unknown)
    name: str = ""            # the key's name (a worker's machine name)


@dataclass(slots=True)
class Malformed:
    ident: bytes
    error: str


@dataclass(slots=True)
class Tick:
    pass


@dataclass(slots=True)
class Admitted:
    ident: bytes
    job: Job                  # numbered and on disk


@dataclass(slots=True)
class AdmitFailed:
    ident: bytes
    error: str


@dataclass(slots=True)
class Solved:
    key: tuple
    result: Any = None
    error: str | None = None  # fn raised: why


@dataclass(slots=True)
class Unreachable:
    worker: str
    job: str
    attempt: int
    why: str


# -- replies ----------------------------------------------------------------------------
def _msg(mtype: str, **fields: Any) -> tuple[str, dict[str, Any]]:
    return (mtype, fields)


def _err(code: str, message: str) -> tuple[str, dict[str, Any]]:
    return ("error", {"code": code, "message": message})
