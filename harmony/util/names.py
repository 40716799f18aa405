"""The one check of every name that becomes part of a filesystem path.

Job ids, data set names, machine names and the like arrive in messages
from peers (any key holder) and become directory names under a state
directory. :func:`check` admits only a plain name (letters, digits, ``.``,
``_``, ``-``; at most 128 characters; not starting with a dot or a dash),
so no ``..``, no separator and no absolute path can pass, and
:func:`under` joins checked names to a root and verifies that the result
stays below it. Every module that builds a path from a received name goes
through these two functions.
"""
from __future__ import annotations

import os
import re

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
MAX_NAME = 128


class BadName(ValueError):
    """A name that may not become part of a path."""


def check(name: object, what: str = "name") -> str:
    """``name`` if it is a plain name, else :class:`BadName` saying why
    (the bad value is shown bounded: it may be hostile)."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        shown = repr(name)
        shown = shown if len(shown) <= 60 else shown[:60] + "..."
        raise BadName(f"bad {what} {shown}: letters, digits, '.', '_', '-' (at most "
                      f"{MAX_NAME}, not starting with a dot or dash)")
    return name


def under(root: str, *names: str, what: str = "name") -> str:
    """``root/name/...`` for checked ``names``; raises :class:`BadName` if
    a name is not plain or the joined path would leave ``root`` (a link
    placed inside it, say)."""
    for n in names:
        check(n, what)
    path = os.path.join(root, *names)
    base = os.path.realpath(root)
    real = os.path.realpath(path)
    if real != base and not real.startswith(base + os.sep):
        raise BadName(f"{what} {'/'.join(names)!r} leads outside {root}")
    return path
