"""Checks of an LMDB data file before LMDB maps it, and setting a damaged
environment aside.

LMDB maps ``data.mdb`` and trusts it: a file shorter than the pages its meta
page names (a truncated copy, a disk that filled while it was written) kills
the process with SIGBUS on the first access past its end, with every thread
in it. :func:`check_lmdb_file` reads only the two meta pages with ordinary
reads and compares them with the file's size, so that the opener gets an
exception it can handle instead. The master checks its job table with it,
and every :class:`harmony.store.lmdb_env.LmdbEnv` (a worker's staged
chunks, checkpoints, spilled blocks) checks its file when it opens one.
"""
from __future__ import annotations

import os
import struct

# LMDB's file format (lmdb.h / mdb.c, data version 1): pages 0 and 1 are meta
# pages; a page starts with a 16-byte header (pgno u64, pad u16, flags u16,
# lower/upper u16); the meta follows it: magic u32, version u32, address
# u64, mapsize u64, two 48-byte MDB_db records (the first one's leading u32
# is the page size), last page number u64, transaction id u64.
_PAGE_HDR = 16
_P_META = 0x08
_MAGIC = 0xBEEFC0DE
_DATA_VERSION = 1


class LmdbFileError(RuntimeError):
    """An LMDB data file is damaged; the message says what is wrong (not
    which file: the caller names it)."""


def check_lmdb_file(path: str) -> dict[str, int]:
    """Check an LMDB data file against its meta pages without mapping it;
    returns ``{"size", "psize", "last_pg", "txnid", "mapsize"}`` of the
    newer meta page. Raises :class:`LmdbFileError` (the reason only)."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            head = fh.read(2 * 65536)
    except OSError as exc:
        raise LmdbFileError(f"cannot read it: {exc.strerror or exc}") from None
    if size == 0:
        raise LmdbFileError("it is empty (0 bytes)")
    if len(head) < _PAGE_HDR + 48:
        raise LmdbFileError(f"it is {size} bytes, shorter than an LMDB meta page")
    psize = struct.unpack_from("<I", head, _PAGE_HDR + 24)[0]
    if psize < 512 or psize > 65536 or psize & (psize - 1):
        raise LmdbFileError(f"its first meta page is damaged (page size {psize})")
    if size < 2 * psize:
        raise LmdbFileError(f"it is {size} bytes, shorter than its two meta pages "
                            f"({2 * psize} bytes)")
    metas = []
    for i in (0, 1):
        off = i * psize
        pgno, _, flags = struct.unpack_from("<QHH", head, off)
        magic, version, _, mapsize = struct.unpack_from("<IIQQ", head, off + _PAGE_HDR)
        last_pg, txnid = struct.unpack_from("<QQ", head, off + _PAGE_HDR + 120)
        if pgno != i or not flags & _P_META or magic != _MAGIC:
            raise LmdbFileError(f"meta page {i} is damaged (not an LMDB meta page)")
        if version != _DATA_VERSION:
            raise LmdbFileError(f"meta page {i} has LMDB data version {version}, "
                                f"expected {_DATA_VERSION}")
        metas.append({"psize": psize, "last_pg": last_pg, "txnid": txnid, "mapsize": mapsize})
    meta = max(metas, key=lambda m: m["txnid"])
    need = (meta["last_pg"] + 1) * psize
    if meta["last_pg"] < 1:
        raise LmdbFileError(f"its meta page is damaged (last page {meta['last_pg']})")
    if size < need:
        raise LmdbFileError(f"it is truncated: {size} bytes, but its meta page names "
                            f"{meta['last_pg'] + 1} pages of {psize} bytes ({need} bytes)")
    return {"size": size, **meta}


def set_aside(path: str) -> str:
    """Rename ``path`` (a damaged environment's directory or file) to
    ``PATH.damaged`` (``PATH.damaged.N`` if that is taken): kept for
    inspection or recovery, never deleted. Returns the new path."""
    aside = f"{path}.damaged"
    n = 1
    while os.path.lexists(aside):
        aside = f"{path}.damaged.{n}"
        n += 1
    os.rename(path, aside)
    return aside
