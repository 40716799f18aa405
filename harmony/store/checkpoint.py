"""Checkpoints of a job's model blocks (and mutable input state), in LMDB.

A checkpoint *version* is a set of blocks (block id -> ``Block`` or bytes) in
two sections, ``model`` (the server shard's model blocks) and ``input`` (the
mutable part of this machine's input blocks, e.g. NMF's user factors, which
live with the input and would be lost otherwise), plus metadata (job, epoch,
iteration, caller's dict, array dtypes and shapes of every block).

Atomicity and integrity
-----------------------
* Block values are written first, as pieces of at most ``PIECE_BYTES``
  (:mod:`harmony.store.pieces`), in transactions of at most ``chunk_bytes``
  (one txn for everything would keep the whole checkpoint as dirty pages in
  memory until commit, which is exactly what a machine short of memory cannot
  afford; one value for a whole block would keep that block). Then the *manifest* is committed in its own transaction: it lists
  every block with its length and SHA-256, the totals, and ends with the
  SHA-256 of the manifest itself. The manifest commit is the commit point: a
  version without a manifest does not exist (its blocks are garbage-collected
  on the next open or write).
* The env is opened with ``sync=True, metasync=True``: every commit is on disk
  when ``write`` returns. (``MDB_NOSYNC`` would let a system crash corrupt the
  whole environment, older checkpoints included.)
* Older versions are pruned only after the new manifest is committed, and the
  newest ``keep`` (default 2) complete versions are kept, so the previous good
  version survives until the new one is complete, and one more remains to fall
  back on if the newest is later found damaged.
* ``restore`` verifies the manifest checksum, the job, and every block's
  presence, length and SHA-256 before returning anything; any failure raises
  :class:`CheckpointError` naming the version and block. Nothing damaged is
  ever returned. ``restore_latest_good`` falls back to older versions, but only
  when asked and it reports what it skipped.

Formats: a format-2 manifest (written now) stores each block as pieces,
keys ``version|section|block|piece``; a format-1 one (before) as one value,
key ``version|section|block``. Both are read, and both range by range from
the data file (:class:`~harmony.store.pieces.FileRanges`), so a block is
streamed to another machine (:meth:`CheckpointStore.stream`) or verified
without being held whole, and assembled only by :meth:`restore`, for a
consumer that needs its arrays.

SHA-256 rather than CRC-32 here: checkpoints are written rarely and read back
after crashes, moves or long pauses, where a 32-bit check is too weak; with
SHA-NI it runs at ~1.8 GB/s on this machine (spill blocks, on the hot reload
path, use CRC-32 at ~6 GB/s).

Consistency across machines: every machine of a job writes its own shards'
checkpoint for the same (epoch, iteration) after the PUSH barrier. Whoever
restores must pick the newest (epoch, iteration) that *all* machines of the
job hold and verify (``find``/``versions``), not each machine's own latest.
"""
from __future__ import annotations

import hashlib
import logging
import struct
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

import msgpack

from harmony.store.blocks import Block, BlockFormatError, export_block, import_block
from harmony.store.lmdb_env import LmdbEnv, MiB
from harmony.store.pieces import (PIECE_BYTES, FileRanges, Hashed, PieceWriter, Source,
                                  as_source, piece_count, piece_key)

log = logging.getLogger("harmony.store.checkpoint")

#: the format written (pieces); FORMATS: those read (1: one value a block)
FORMAT = 2
FORMATS = (1, 2)
#: the longest exported block header read for a manifest's dtypes and shapes
MAX_HEADER_BYTES = 1 * MiB
SECTIONS = {"model": b"m", "input": b"i"}
_SECTION_NAME = {v: k for k, v in SECTIONS.items()}
_V = struct.Struct(">Q")
_SHA = 32


class CheckpointError(Exception):
    """A checkpoint is missing, torn or corrupt; it was not loaded."""


@dataclass(frozen=True)
class CheckpointInfo:
    version: int
    job: str
    epoch: int
    iteration: int
    created: float
    num_blocks: int
    total_bytes: int
    meta: dict = field(default_factory=dict)


@dataclass
class Checkpoint:
    info: CheckpointInfo
    blocks: dict[int, Block | bytes]          # model section
    input_blocks: dict[int, Block | bytes]    # input section


def _dkey(version: int, section: str, block_id: int) -> bytes:
    if block_id < 0:
        raise ValueError(f"block id must be >= 0, got {block_id}")
    return _V.pack(version) + SECTIONS[section] + _V.pack(block_id)


def _block_desc(src: Source) -> dict:
    """dtype and shape of every array in an exported block (from its
    header, read from ``src`` alone); ``BlockFormatError`` if it is not one."""
    if src.size < 8:
        raise BlockFormatError(f"{src.size} bytes: too short for a block")
    head_len = struct.unpack("<I", bytes(src.read(4, 4)))[0]
    if head_len > min(MAX_HEADER_BYTES, src.size - 8):
        raise BlockFormatError(f"block header of {head_len} bytes (at most "
                               f"{MAX_HEADER_BYTES}, within the block's {src.size})")
    try:
        head = msgpack.unpackb(bytes(src.read(8, head_len)), raw=False)
        return {str(name): [dt, shape] for name, dt, shape, _ in head["arrays"]}
    except Exception as exc:
        raise BlockFormatError(f"corrupt block header: {str(exc)[:100]}") from None


class CheckpointStore:
    """Versioned, verified checkpoints in one (synced) LMDB environment."""

    def __init__(self, env: LmdbEnv, keep: int = 2, chunk_bytes: int = 64 * MiB,
                 piece_bytes: int = PIECE_BYTES) -> None:
        if not env.sync:
            raise ValueError("checkpoints need an env opened with sync=True")
        if keep < 1:
            raise ValueError("keep must be >= 1")
        self.env, self.job, self.keep, self.chunk_bytes = env, env.job, keep, chunk_bytes
        self.piece_bytes = piece_bytes
        self._data = env.db("ckpt_blocks")
        self._man = env.db("ckpt_manifests")
        self._lock = threading.Lock()
        torn = self._gc_torn()
        if torn:
            log.warning("%s: removed incomplete checkpoint versions %s (job %s)",
                        env.path, torn, self.job)

    @classmethod
    def open(cls, path: str, job: str, *, keep: int = 2, chunk_bytes: int = 64 * MiB,
             map_size: int = 1 << 30, max_map_size: int | None = None,
             piece_bytes: int = PIECE_BYTES) -> "CheckpointStore":
        env = LmdbEnv(path, job=job, sync=True, map_size=map_size, max_map_size=max_map_size)
        try:
            return cls(env, keep=keep, chunk_bytes=chunk_bytes, piece_bytes=piece_bytes)
        except BaseException:
            env.close()
            raise

    def close(self) -> None:
        self.env.close()

    def _err(self, version: int | None, what: str) -> CheckpointError:
        v = "" if version is None else f" v{version}"
        return CheckpointError(f"checkpoint{v} of job {self.job} ({self.env.path}): {what}")

    # -- write -------------------------------------------------------------------
    def write(self, blocks: Mapping[int, Block | bytes | Source], *, epoch: int,
              iteration: int, meta: dict | None = None,
              input_blocks: Mapping[int, Block | bytes | Source] | None = None,
              exported: bool = False) -> CheckpointInfo:
        """Write one checkpoint version; returns its info once it is durable.
        On any failure (e.g. ``StoreFullError``) the partial version is removed
        and the previous versions are untouched. ``exported``: byte values
        are blocks already exported (:func:`export_block`), e.g. received
        from another machine, and are restored as blocks. A value may be a
        :class:`~harmony.store.pieces.Source` (a spool file's range): it is
        read a piece at a time and never held whole, and released piece by
        piece as they are committed."""
        with self._lock:
            version = self._last_version() + 1
            entries: list[list] = []
            hashed: list[Hashed] = []
            total = 0
            w = PieceWriter(self.env, self._data, self.chunk_bytes, self.piece_bytes)
            try:
                for section, src in (("model", blocks), ("input", input_blocks or {})):
                    for bid in sorted(src):
                        val = src[bid]
                        where = f"block {bid} [{section}]"
                        if isinstance(val, Block):
                            if val.id != bid:
                                raise ValueError(f"block under id {bid} has id {val.id}")
                            data, kind = as_source(export_block(val)), "block"
                        else:
                            data, kind = as_source(val), "block" if exported else "bytes"
                        try:
                            desc = _block_desc(data) if kind == "block" else None
                        except BlockFormatError as exc:
                            raise self._err(version, f"{where}: {exc}") from None
                        entries.append([section, int(bid), data.size, len(hashed), kind, desc])
                        hashed.append(Hashed(data, what=where))
                        w.put(_dkey(version, section, int(bid)), hashed[-1])
                        total += data.size
                w.flush()
                for e in entries:       # every piece is read: the digests are known
                    e[3] = hashed[e[3]].digest()
                hashed.clear()
                doc = {"format": FORMAT, "job": self.job, "version": version,
                       "epoch": int(epoch), "iteration": int(iteration), "created": time.time(),
                       "meta": meta or {}, "blocks": entries, "num_blocks": len(entries),
                       "total_bytes": total, "piece_bytes": self.piece_bytes}
                packed = msgpack.packb(doc, use_bin_type=True)
                self._commit_manifest(version, packed + hashlib.sha256(packed).digest())
            except BaseException:
                try:
                    self.env.write(lambda txn: self._delete_version(txn, version), 0)
                except Exception as exc:   # GC'd on the next open anyway
                    log.warning("could not remove partial checkpoint v%d: %s", version, exc)
                raise
            self._prune()
            return self._info(doc)

    def _commit_manifest(self, version: int, value: bytes) -> None:
        self.env.write(lambda txn: txn.put(_V.pack(version), value, db=self._man), len(value))

    # -- read ----------------------------------------------------------------------
    def _parse_manifest(self, version: int, value) -> dict:
        mv = memoryview(value)
        if len(mv) <= _SHA:
            raise self._err(version, "manifest truncated")
        body = bytes(mv[:len(mv) - _SHA])
        if hashlib.sha256(body).digest() != bytes(mv[len(mv) - _SHA:]):
            raise self._err(version, "manifest checksum mismatch (corrupt manifest)")
        try:
            doc = msgpack.unpackb(body, raw=False)
        except Exception as exc:
            raise self._err(version, f"manifest unreadable: {exc}") from None
        if doc.get("format") not in FORMATS or doc.get("version") != version:
            raise self._err(version, "manifest does not describe this version")
        if doc.get("job") != self.job:
            raise self._err(version, f"manifest belongs to job {doc.get('job')!r}")
        return doc

    def _info(self, doc: dict) -> CheckpointInfo:
        return CheckpointInfo(doc["version"], doc["job"], doc["epoch"], doc["iteration"],
                              doc["created"], doc["num_blocks"], doc["total_bytes"],
                              dict(doc["meta"]))

    def _manifest_keys(self) -> list[int]:
        def scan(txn):
            return [_V.unpack(bytes(k))[0]
                    for k in txn.cursor(db=self._man).iternext(keys=True, values=False)]
        return self.env.read(scan)

    def versions(self) -> list[CheckpointInfo]:
        """Complete versions whose manifest is intact, oldest first (blocks are
        not verified here; ``restore``/``verify`` do that)."""
        out = []
        for v in self._manifest_keys():
            try:
                out.append(self._info(self.env.read(
                    lambda txn: self._parse_manifest(v, txn.get(_V.pack(v), db=self._man)))))
            except CheckpointError as exc:
                log.warning("%s", exc)
        return out

    def latest(self) -> CheckpointInfo | None:
        vs = self.versions()
        return vs[-1] if vs else None

    def manifest(self, version: int) -> dict:
        """A version's verified manifest: ``blocks`` lists
        ``[section, id, nbytes, sha256, kind, desc]``."""
        def read(txn):
            value = txn.get(_V.pack(version), db=self._man)
            if value is None:
                raise self._err(version, "no such version (missing manifest)")
            return self._parse_manifest(version, value)
        return self.env.read(read)

    def find(self, epoch: int, iteration: int) -> CheckpointInfo | None:
        for info in reversed(self.versions()):
            if (info.epoch, info.iteration) == (epoch, iteration):
                return info
        return None

    def _newest(self, version: int | None) -> int:
        if version is None:
            keys = self._manifest_keys()
            if not keys:
                raise self._err(None, "no checkpoint")
            version = keys[-1]
        return version

    def restore(self, version: int | None = None, *, decode: bool = True,
                want: Callable[[str, int], bool] | None = None) -> Checkpoint:
        """Load and verify one version (default: the newest manifest present,
        even if damaged: then this raises rather than silently loading an
        older one). ``decode=False`` returns exported blocks as bytes.
        ``want(section, block_id)`` ("model" or "input") selects the blocks
        to read, verify and decode; the others are not touched. Each block
        is assembled whole here (its arrays are what the caller wants);
        :meth:`stream` hands them on without that."""
        with self._lock:
            version = self._newest(version)
            out: dict[str, dict] = {"model": {}, "input": {}}

            def load(txn):
                doc, blocks = self._extents(txn, version, want)
                for section, bid, nbytes, digest, kind, ranges in blocks:
                    where = f"block {bid} [{section}]"
                    buf = bytearray(nbytes)
                    FileRanges(self.env, ranges).readinto_all(memoryview(buf))
                    if hashlib.sha256(buf).digest() != digest:
                        raise self._err(version, f"{where} checksum mismatch (corrupt data)")
                    if kind == "block" and decode:
                        try:
                            blk = import_block(buf, copy=False)    # views of buf
                        except BlockFormatError as exc:
                            raise self._err(version, f"{where}: {exc}") from None
                        if blk.id != bid:
                            raise self._err(version, f"{where} holds block {blk.id}")
                        out[section][bid] = blk
                    else:
                        out[section][bid] = bytes(buf)
                return doc
            doc = self.env.read(load)
            return Checkpoint(self._info(doc), out["model"], out["input"])

    @contextmanager
    def stream(self, version: int | None = None,
               want: Callable[[str, int], bool] | None = None
               ) -> Iterator[tuple[CheckpointInfo, list[tuple[str, int, Hashed]]]]:
        """One version's selected blocks as sources to read range by range,
        ``(info, [(section, block id, source), ...])``, valid inside the
        ``with``. Each source checks the block's SHA-256 as it is read:
        reading its last range raises :class:`CheckpointError` if the block
        is damaged, so a damaged block is never read whole. A missing or
        resized block is refused here, before anything is read."""
        with self._lock:
            version = self._newest(version)
            lease = self.env.lease()
            try:
                doc, blocks = self._extents(lease.txn, version, want)
                yield self._info(doc), [
                    (section, bid, Hashed(FileRanges(self.env, ranges), expect=digest,
                                          error=lambda m: self._err(version, m),
                                          what=f"block {bid} [{section}]"))
                    for section, bid, _n, digest, _kind, ranges in blocks]
            finally:
                lease.close()

    def verify(self, version: int) -> CheckpointInfo:
        """Check a version completely, one range of a block at a time."""
        with self.stream(version) as (info, blocks):
            for _s, _b, src in blocks:
                for off in range(0, src.size, self.piece_bytes):
                    src.read(off, min(self.piece_bytes, src.size - off))
            return info

    def restore_latest_good(self) -> tuple[Checkpoint, list[tuple[int, str]]]:
        """The newest version that verifies, and (version, error) for each newer
        one that did not. Raises CheckpointError if none verifies."""
        skipped: list[tuple[int, str]] = []
        for v in reversed(self._manifest_keys()):
            try:
                return self.restore(v), skipped
            except CheckpointError as exc:
                skipped.append((v, str(exc)))
        raise self._err(None, "no intact checkpoint" +
                        (f" (damaged: {[v for v, _ in skipped]})" if skipped else ""))

    def _extents(self, txn, version: int, want: Callable[[str, int], bool] | None
                 ) -> tuple[dict, list[tuple[str, int, int, bytes, str, list]]]:
        """A version's verified manifest, and for each block ``want``
        selects ``(section, id, nbytes, sha256, kind, ranges)``: where its
        bytes lie in the data file (one range, or one a piece), every piece
        checked for presence and length."""
        value = txn.get(_V.pack(version), db=self._man)
        if value is None:
            raise self._err(version, "no such version (missing manifest)")
        doc = self._parse_manifest(version, value)
        pieces = int(doc.get("piece_bytes") or 0) if doc["format"] >= 2 else 0
        if doc["format"] >= 2 and pieces <= 0:
            raise self._err(version, "manifest gives no piece size")
        out = []
        total = 0
        for section, bid, nbytes, digest, kind, _desc in doc["blocks"]:
            total += nbytes
            if want is not None and not want(section, bid):
                continue
            where = f"block {bid} [{section}]"
            key = _dkey(version, section, bid)
            if not pieces:
                data = txn.get(key, db=self._data)
                if data is None:
                    raise self._err(version, f"{where} missing")
                if len(data) != nbytes:
                    raise self._err(version, f"{where} truncated or resized: {len(data)} "
                                             f"bytes, manifest says {nbytes}")
                ranges = [self.env.extent(data)]
            else:
                ranges = []
                for i in range(piece_count(nbytes, pieces)):
                    data = txn.get(piece_key(key, i), db=self._data)
                    size = min(pieces, nbytes - i * pieces)
                    if data is None:
                        raise self._err(version, f"{where} missing (piece {i})")
                    if len(data) != size:
                        raise self._err(version, f"{where} truncated or resized: piece {i} "
                                                 f"has {len(data)} bytes, not {size}")
                    ranges.append(self.env.extent(data))
            out.append((section, bid, nbytes, bytes(digest), kind, ranges))
        if total != doc["total_bytes"] or len(doc["blocks"]) != doc["num_blocks"]:
            raise self._err(version, "manifest totals do not match its block list")
        return doc, out

    # -- housekeeping ----------------------------------------------------------------
    def _last_version(self) -> int:
        def last(txn):
            hi = 0
            for db in (self._data, self._man):
                cur = txn.cursor(db=db)
                if cur.last():
                    hi = max(hi, _V.unpack(bytes(cur.key())[:8])[0])
            return hi
        return self.env.read(last)

    def _delete_version(self, txn, version: int, manifest: bool = True) -> None:
        prefix = _V.pack(version)
        cur = txn.cursor(db=self._data)
        if cur.set_range(prefix):
            while bytes(cur.key())[:8] == prefix:
                if not cur.delete():
                    break
        if manifest:
            txn.delete(prefix, db=self._man)

    def _data_versions(self) -> set[int]:
        def scan(txn):
            out = set()
            cur = txn.cursor(db=self._data)
            ok = cur.first()
            while ok:
                v = _V.unpack(bytes(cur.key())[:8])[0]
                out.add(v)
                ok = cur.set_range(_V.pack(v + 1))   # skip to the next version
            return out
        return self.env.read(scan)

    def _gc_torn(self) -> list[int]:
        torn = sorted(self._data_versions() - set(self._manifest_keys()))
        if torn:
            def drop(txn):
                for v in torn:
                    self._delete_version(txn, v, manifest=False)
            self.env.write(drop, 0)
        return torn

    def _prune(self) -> None:
        # only versions with an intact manifest count towards ``keep``: a
        # damaged newest manifest must not push the good ones out
        keys = self._manifest_keys()
        good = [i.version for i in self.versions()]
        old = good[:-self.keep] if len(good) > self.keep else []
        torn = sorted(self._data_versions() - set(keys))
        if old or torn:
            def drop(txn):
                for v in old:
                    self._delete_version(txn, v)
                for v in torn:
                    self._delete_version(txn, v, manifest=False)
            self.env.write(drop, 0)

    def delete(self, version: int) -> None:
        with self._lock:
            self.env.write(lambda txn: self._delete_version(txn, version), 0)

    def summary(self) -> dict[str, Any]:
        vs = self.versions()
        return {"job": self.job, "path": self.env.path,
                "versions": [(i.version, i.epoch, i.iteration, i.total_bytes) for i in vs]}
