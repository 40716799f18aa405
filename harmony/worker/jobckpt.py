"""Pause and resume checkpoints of a whole job (used for pause/migrate).

When the master pauses a job, every executor of the job writes one *part*
at the same epoch boundary (after the epoch's last PUSH and its evaluation):
its server shard's model rows, grouped by model block, and its input
blocks, which carry the app's mutable per-record state (NMF's user factors,
LDA's topic assignments). Each part is a :class:`CheckpointStore` version in
its own LMDB environment ``<job dir>/part-<index>``, so the parts are written
in parallel and each one is verified (SHA-256 manifest) when read back.

A resumed attempt may run on other machines and on a different number of
them: model block ``b`` goes to the new owner ``b % count`` and input block
``b`` to executor ``b % count``, whichever old part holds it.

Decision: the job directory lies under the master's state directory and is
reached by path, which needs a file system shared by the master and the
workers: true for the local cluster; an EC2 fleet needs a shared mount (e.g.
EFS) for migration between hosts. Parts are not copied between daemons.
"""
from __future__ import annotations

import os
import shutil
from typing import Iterable

import numpy as np

from harmony.ps.keymap import block_of
from harmony.store.blocks import Block
from harmony.store.checkpoint import CheckpointError, CheckpointStore


def part_path(job_dir: str, index: int) -> str:
    return os.path.join(job_dir, f"part-{index}")


def model_blocks_of(keys: np.ndarray, rows: np.ndarray, num_blocks: int) -> dict[int, Block]:
    """A shard's rows, one Block per model block (keys + rows)."""
    bids = block_of(keys, num_blocks)
    order = np.argsort(bids, kind="stable")
    bids, keys, rows = bids[order], keys[order], rows[order]
    cuts = np.flatnonzero(np.diff(bids)) + 1
    out = {}
    for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, len(bids)]):
        if hi > lo:
            b = int(bids[lo])
            out[b] = Block(b, {"keys": keys[lo:hi].copy(), "rows": rows[lo:hi].copy()})
    return out


def write_part(job_dir: str, job: str, index: int, *, keys: np.ndarray, rows: np.ndarray,
               model_blocks: int, inputs: Iterable[Block], epoch: int, iteration: int,
               meta: dict | None = None) -> int:
    """Write this executor's part; returns the checkpoint version (durable
    when this returns)."""
    os.makedirs(job_dir, exist_ok=True)
    store = CheckpointStore.open(part_path(job_dir, index), job, keep=1)
    try:
        info = store.write(model_blocks_of(keys, rows, model_blocks), epoch=epoch,
                           iteration=iteration, meta=dict(meta or {}),
                           input_blocks={b.id: b for b in inputs})
        return info.version
    finally:
        store.close()


class Restored:
    """What a resumed executor takes from the parts of a paused attempt."""

    def __init__(self, job: str, resume: dict) -> None:
        """``resume`` is the master's record: ``dir``, ``versions`` (one per
        old part, in index order), ``epoch`` (the first epoch to run)."""
        self.job, self.dir = job, resume["dir"]
        self.versions = [int(v) for v in resume["versions"]]
        self.epoch = int(resume["epoch"])

    def _parts(self, want):
        for i, version in enumerate(self.versions):
            path = part_path(self.dir, i)
            if not os.path.exists(os.path.join(path, "data.mdb")):
                raise CheckpointError(f"checkpoint part {i} of job {self.job} is missing "
                                      f"({path})")
            store = CheckpointStore.open(path, self.job, keep=1)
            try:
                yield store.restore(version, want=want)
            finally:
                store.close()

    def load(self, index: int, count: int, model_owner: np.ndarray) -> None:
        """From every part, read (and verify) only the input blocks executor
        ``index`` of ``count`` owns and the model blocks ``model_owner``
        gives it; the other executors verify the rest."""
        self.inputs: dict[int, Block] = {}
        model: dict[int, Block] = {}

        def want(section: str, bid: int) -> bool:
            if section == "input":
                return bid % count == index
            return 0 <= bid < len(model_owner) and model_owner[bid] == index
        for ck in self._parts(want):
            if ck.info.epoch + 1 != self.epoch:
                raise CheckpointError(f"checkpoint of job {self.job} is of epoch "
                                      f"{ck.info.epoch}, expected {self.epoch - 1}")
            self.inputs.update(ck.input_blocks)     # only what ``want`` chose
            model.update(ck.blocks)
        keys = [b["keys"] for b in model.values()]
        self.keys = np.concatenate(keys) if keys else np.zeros(0, np.int64)
        self.rows = (np.concatenate([b["rows"] for b in model.values()]) if keys else None)

    def model_rows(self, mine: np.ndarray, dim: int, dtype: str) -> np.ndarray:
        """Rows for this shard's keys ``mine`` (sorted), from the parts."""
        if len(mine) != len(self.keys):
            raise CheckpointError(f"checkpoint of job {self.job} holds {len(self.keys)} model "
                                  f"rows for this shard, expected {len(mine)}")
        if not len(mine):
            return np.zeros((0, dim), dtype=dtype)
        order = np.argsort(self.keys, kind="stable")
        if not np.array_equal(self.keys[order], mine):
            raise CheckpointError(f"checkpoint of job {self.job}: model keys do not match "
                                  f"this shard's keys")
        return np.asarray(self.rows[order], dtype=dtype)


def remove(job_dir: str) -> None:
    shutil.rmtree(job_dir, ignore_errors=True)
