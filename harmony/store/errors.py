"""The exceptions of the LMDB stores: :class:`StoreError` and its kinds (a
full store, a busy job directory, a damaged data file, a block that cannot
be loaded)."""
from __future__ import annotations


class StoreError(Exception):
    """An LMDB store failed (other than a full disk or a bad block)."""


class StoreFullError(StoreError):
    """No room: the env reached its hard cap or the disk/file limit is hit."""

    def __init__(self, path: str, job: str, needed: int, available: int | None,
                 reason: str) -> None:
        avail = "unknown" if available is None else f"{available} bytes"
        super().__init__(f"store full: job {job}, {path}: {reason} "
                         f"(needed {needed} bytes, room left {avail})")
        self.path, self.job, self.needed, self.available = path, job, needed, available


class StoreBusyError(StoreError):
    """Another live process owns the job directory."""


class DamagedStoreError(StoreError):
    """An env's data file failed its check before LMDB mapped it (opening it
    would have killed the process with SIGBUS). ``data_path``: the file;
    ``reason``: what is wrong with it."""

    def __init__(self, data_path: str, job: str, reason: str) -> None:
        super().__init__(f"the LMDB file {data_path} (job {job}) is damaged: {reason}")
        self.data_path, self.job, self.reason = data_path, job, reason


class BlockLoadError(StoreError):
    """A block could not be loaded: missing, corrupt, or the read failed."""

    def __init__(self, block_id: int, where: str, reason: str) -> None:
        super().__init__(f"block {block_id} ({where}): {reason}")
        self.block_id, self.where, self.reason = block_id, where, reason
