"""The master's durable job table, in LMDB under the state directory.

What a crash, a full disk or a damaged file can do to it, and what stops it:

- Every state change of a job is one LMDB write transaction (its record),
  synced. Epoch rows are not synced (a crash may lose the last seconds of
  metrics). A write that fails (a full disk) is kept in memory and written
  again with the next one, and a submission is refused with a clear error
  while the table cannot be written (:class:`TableFull`): the state on disk
  stays the last one written, never a half-written one.
- On start the file is checked before LMDB maps it (:func:`check_lmdb_file`:
  both meta pages parsed, the file at least as long as the last page they
  name; a truncated file would kill the process with SIGBUS on first
  access), and then every record is read and decoded. A record that does
  not decode is moved to the ``quarantine`` table and reported (a job's
  becomes a failed job whose error says so, which ``harmony jobs`` shows);
  a damaged table (LMDB errors) refuses the start.
- The last good copy: ``STATE/master.lmdb.bak``, a compacted copy (LMDB's
  own copy, consistent under writes) taken after every BACKUP_EVERY state
  changes (at most once per BACKUP_MIN_S) and at a clean shutdown.
  ``harmony-master start --recover`` puts it back when the table is damaged
  or missing (the damaged one is kept aside as ``master.lmdb.damaged-TIME``).
- ``STATE/master-history.json`` holds the last job number: a master never
  starts silently empty (or older) over a table that had a history.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import time
from typing import Any, Callable

import lmdb
import msgpack

from harmony.master.jobs import Job, JobState
from harmony.store import lmdbcheck

log = logging.getLogger("harmony.master")

MAP_SIZE = 1 << 30  # sparse; grown on MapFullError
BACKUP_EVERY = 50   # state changes between two backups of the table
BACKUP_MIN_S = 30.0  # ... and at least this many seconds
MAX_DBS = 8



class JobTableError(RuntimeError):
    """The job table cannot be used as it is (damaged, missing over a
    history); the message names the file and what to do."""


class TableFull(RuntimeError):
    """The job table could not be written (e.g. no space left on device)."""


def check_lmdb_file(path: str) -> dict[str, int]:
    """:func:`harmony.store.lmdbcheck.check_lmdb_file`, raising
    :class:`JobTableError` (the reason only)."""
    try:
        return lmdbcheck.check_lmdb_file(path)
    except lmdbcheck.LmdbFileError as exc:
        raise JobTableError(str(exc)) from None


def probe_table(path: str, subdir: bool = True) -> tuple[str | None, bool]:
    """Read and decode every record of an LMDB table in a child process:
    (the reason the table is damaged or None, whether a record is damaged).
    LMDB asserts (SIGABRT) or faults on some damaged pages, which would kill
    the master: only the child dies of it. (Call it before the process has
    threads, as the master does at its start.)"""
    if not hasattr(os, "fork"):
        return None, True
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                   # the child: no cleanup, no return
        code = 2
        try:
            os.close(r)
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 2)                       # LMDB's assertion text
            env = lmdb.open(path, subdir=subdir, readonly=True, lock=False, max_dbs=MAX_DBS)
            try:
                code = 3 if JobDB._scan_env(env, None) else 0
            finally:
                env.close()
        except BaseException as exc:
            try:
                os.write(w, f"{'lmdb: ' if isinstance(exc, lmdb.Error) else ''}"
                            f"{exc}".encode()[:1000])
            except BaseException:
                pass
        os._exit(code)
    os.close(w)
    out = b""
    with os.fdopen(r, "rb") as fh:
        out = fh.read()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        try:
            name = signal.Signals(os.WTERMSIG(status)).name
        except ValueError:
            name = f"signal {os.WTERMSIG(status)}"
        return f"reading it crashed LMDB ({name})", True
    if os.WEXITSTATUS(status) not in (0, 3):
        return out.decode("utf-8", "replace") or "it cannot be read", True
    return None, os.WEXITSTATUS(status) == 3


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def _check_job(key: bytes, value: bytes) -> Job:
    d = msgpack.unpackb(value, raw=False)
    job = Job.from_record(d)
    if job.id.encode() != key:
        raise ValueError(f"record of {job.id!r} under key {key!r}")
    return job


def _check_epoch(key: bytes, value: bytes) -> None:
    d = msgpack.unpackb(value, raw=False)
    if not isinstance(d, dict) or not isinstance(d.get("epoch"), int) \
            or not isinstance(d.get("metrics", {}), dict):
        raise ValueError("not an epoch row")
    key.decode()


def _check_dataset(key: bytes, value: bytes) -> None:
    d = msgpack.unpackb(value, raw=False)
    if not isinstance(d, dict) or d.get("name") != key.decode() \
            or not isinstance(d.get("filename"), str) or not isinstance(d.get("chunks"), list):
        raise ValueError("not a data set record")
    for c in d["chunks"]:
        if not (isinstance(c, dict) and isinstance(c.get("i"), int)
                and isinstance(c.get("sha"), bytes) and isinstance(c.get("holders"), list)):
            raise ValueError("a chunk entry is damaged")


def _check_meta(key: bytes, value: bytes) -> None:
    if key == b"seq":
        int(value)


class JobDB:
    def __init__(self, state_dir: str, recover: bool = False) -> None:
        os.makedirs(state_dir, exist_ok=True)
        self.state_dir = state_dir
        self.path = os.path.join(state_dir, "master.lmdb")
        self.data_path = os.path.join(self.path, "data.mdb")
        self.backup_path = self.path + ".bak"
        self.history_path = os.path.join(state_dir, "master-history.json")
        self.quarantined: list[dict[str, str]] = []   # table, key, reason
        self.restored: dict[str, Any] | None = None   # what --recover did
        self.unsaved: dict[str, Job] = {}             # job records a write failed for
        self.write_error: str | None = None
        self.changes = 0
        self._backup_at = (0, time.time())            # (changes, time) of the last backup
        self._warned = 0.0
        self._clean = False        # the child's probe read every record without a fault
        history = self._read_history()
        problem = self._problem(history)
        if problem is not None:
            if not recover:
                raise JobTableError(f"{problem}. {self._remedy()}")
            self._restore(problem)
        elif recover:
            log.info("--recover: the job table %s is intact; nothing to restore", self.data_path)
        self._open()
        try:
            self._scan()
        except lmdb.Error as exc:
            self.env.close()
            problem = f"the job table {self.data_path} is damaged (lmdb: {exc})"
            if not recover or self.restored:
                raise JobTableError(f"{problem}. {self._remedy()}") from None
            self._restore(problem)
            self._open()
            self._scan()
        seq = self.seq()
        if history.get("seq", 0) > seq and not self.restored:
            problem = (f"the job table {self.data_path} holds jobs up to job-{seq:04d}, but "
                       f"{self.history_path} records job-{history['seq']:04d}: the table "
                       f"is older than its history (replaced or rolled back)")
            if not recover:
                self.env.close()
                raise JobTableError(f"{problem}. {self._remedy()}")
            self.env.close()
            self._restore(problem)
            self._open()
            self._scan()
            seq = self.seq()
        if history.get("seq", 0) > seq:
            log.warning("the recovered job table ends at job-%04d; jobs up to job-%04d "
                        "are lost (their numbers are not used again)", seq, history["seq"])
            self._write(lambda txn: txn.put(b"seq", str(history["seq"]).encode(),
                                            db=self.meta))
            self.env.sync(True)
        self._write_history()

    # -- integrity ------------------------------------------------------------------------
    def _read_history(self) -> dict[str, Any]:
        try:
            with open(self.history_path) as fh:
                h = json.load(fh)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise JobTableError(f"the job table's history marker {self.history_path} is "
                                f"unreadable ({exc}); if the job table {self.path} is "
                                f"intact, remove the marker and start again") from None
        if not isinstance(h, dict) or not isinstance(h.get("seq", 0), int):
            raise JobTableError(f"the job table's history marker {self.history_path} is "
                                f"damaged; if the job table {self.path} is intact, remove "
                                f"the marker and start again")
        return h

    def _write_history(self) -> None:
        """The last job number, next to the table (atomic; never fatal)."""
        tmp = self.history_path + ".tmp"
        try:
            with open(tmp, "w") as fh:
                json.dump({"seq": self.seq(), "time": time.time(),
                           "table": self.data_path}, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.history_path)
        except OSError as exc:
            self._warn(f"cannot write {self.history_path}: {exc.strerror or exc}")
            try:
                os.unlink(tmp)
            except OSError:
                pass

    def _problem(self, history: dict[str, Any]) -> str | None:
        if not os.path.exists(self.data_path):
            if history.get("seq", 0) > 0:
                return (f"the job table {self.data_path} is missing, but "
                        f"{self.history_path} records a history up to "
                        f"job-{history['seq']:04d}")
            return None
        try:
            check_lmdb_file(self.data_path)
        except JobTableError as exc:
            return f"the job table {self.data_path} is damaged: {exc}"
        why, bad = probe_table(self.path)
        if why is not None:
            return f"the job table {self.data_path} is damaged: {why}"
        self._clean = not bad          # every record decodes: no scan needed here
        return None

    def _remedy(self) -> str:
        if os.path.exists(self.backup_path):
            when = time.strftime("%Y-%m-%d %H:%M:%S",
                                 time.localtime(os.path.getmtime(self.backup_path)))
            return (f"Start with 'harmony-master start --recover' to restore its last good "
                    f"copy {self.backup_path} (taken {when}; jobs submitted after it are "
                    f"lost), or restore the table from your own backup")
        return (f"No backup copy exists ({self.backup_path}); restore the table from your "
                f"own backup, or move {self.path} and {self.history_path} away to start "
                f"with an empty job table")

    def _restore(self, problem: str) -> None:
        """--recover: put the last good copy in place of a damaged or
        missing table (the damaged one is kept aside)."""
        bak = self.backup_path
        if not os.path.exists(bak):
            raise JobTableError(f"{problem}; --recover: no backup copy to restore "
                                f"({bak} does not exist). {self._remedy()}")
        try:
            check_lmdb_file(bak)
            why, _ = probe_table(bak, subdir=False)
            if why is not None:
                raise JobTableError(why)
            env = lmdb.open(bak, subdir=False, readonly=True, lock=False, max_dbs=MAX_DBS)
            try:
                bad = self._scan_env(env, None)
            finally:
                env.close()
        except (JobTableError, lmdb.Error) as exc:
            raise JobTableError(f"{problem}; --recover: the backup copy {bak} is damaged "
                                f"too ({exc}); restore the table from your own backup")
        if bad:
            raise JobTableError(f"{problem}; --recover: the backup copy {bak} has "
                                f"{len(bad)} damaged record(s); restore the table from "
                                f"your own backup")
        if os.path.exists(self.path):
            aside = f"{self.path}.damaged-{time.strftime('%Y%m%d-%H%M%S')}"
            os.rename(self.path, aside)
            log.warning("moved the damaged job table to %s", aside)
        os.makedirs(self.path)
        tmp = self.data_path + ".tmp"
        shutil.copyfile(bak, tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, self.data_path)
        _fsync_dir(self.path)
        taken = os.path.getmtime(bak)
        self.restored = {"from": bak, "taken": taken, "problem": problem}
        self._clean = True         # the copy was read record by record above
        log.warning("--recover: %s; restored the copy %s taken %s", problem, bak,
                    time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(taken)))

    def _open(self) -> None:
        size = MAP_SIZE
        if os.path.exists(self.data_path):
            size = max(size, check_lmdb_file(self.data_path)["mapsize"])
        # fsync is explicit: job records (state changes) are synced, per-epoch
        # metric rows are not (a crash may lose the last seconds of metrics)
        self.env = lmdb.open(self.path, map_size=size, max_dbs=MAX_DBS, subdir=True,
                             sync=False, metasync=False)
        self.jobs = self.env.open_db(b"jobs")
        self.meta = self.env.open_db(b"meta")
        self.epochs = self.env.open_db(b"epochs")
        self.data = self.env.open_db(b"datasets")   # the staged-input catalog
        self.quarantine = self.env.open_db(b"quarantine")   # damaged records, as found

    _CHECKS: dict[bytes, Callable[[bytes, bytes], Any]] = {
        b"jobs": _check_job, b"epochs": _check_epoch, b"datasets": _check_dataset,
        b"meta": _check_meta}

    @classmethod
    def _scan_env(cls, env: lmdb.Environment, dbs: dict[bytes, Any] | None) -> list[tuple]:
        """Read and decode every record; returns the damaged ones as
        (table, key, value, reason). lmdb errors (a damaged B-tree) raise."""
        bad = []
        with env.begin() as txn:
            for name, check in cls._CHECKS.items():
                db = dbs[name] if dbs is not None else None
                if db is None:
                    try:
                        db = env.open_db(name, txn=txn, create=False)
                    except lmdb.NotFoundError:
                        continue
                for k, v in txn.cursor(db=db):
                    try:
                        check(k, v)
                    except Exception as exc:   # any decoding error: the record is damaged
                        why = str(exc)[:200] or "undecodable"
                        bad.append((name, bytes(k), bytes(v), f"{exc.__class__.__name__}: {why}"))
        return bad

    def _scan(self) -> None:
        """Every record read and decoded; damaged ones quarantined."""
        if self._clean:
            return
        bad = self._scan_env(self.env, {b"jobs": self.jobs, b"epochs": self.epochs,
                                        b"datasets": self.data, b"meta": self.meta})
        if not bad:
            return
        dbs = {b"jobs": self.jobs, b"epochs": self.epochs, b"datasets": self.data,
               b"meta": self.meta}

        for name, k, _, reason in bad:
            key = k.decode("utf-8", "replace")
            self.quarantined.append({"table": name.decode(), "key": key, "reason": reason})
            log.error("the job table %s: the record %s/%s is damaged (%s); moved to its "
                      "'quarantine' table", self.path, name.decode(), key, reason)
        # a damaged job record becomes a failed job saying so (kept: every
        # later start and 'harmony jobs' show it); the bytes stay in quarantine
        stand_ins = {j.id.encode(): msgpack.packb(j.to_record(), use_bin_type=True)
                     for j in self.quarantined_jobs()}

        def move(txn):
            for name, k, v, _ in bad:
                txn.put(name + b"/" + k, v, db=self.quarantine)
                txn.delete(k, db=dbs[name])
            for k, v in stand_ins.items():
                txn.put(k, v, db=self.jobs)
        self._write(move)
        self.env.sync(True)

    def quarantined_jobs(self) -> list[Job]:
        """A failed job in place of every quarantined job record (their
        numbers and the reason stay visible in ``harmony jobs``)."""
        out = []
        for q in self.quarantined:
            if q["table"] != "jobs" or not q["key"].isprintable() or len(q["key"]) > 200:
                continue
            job = Job(id=q["key"], app_name="?", app_source="", args=[], machines=1,
                      state=JobState.FAILED, ended=time.time(),
                      error=f"its record in the job table was damaged and is quarantined "
                            f"({self.path}, table 'quarantine', key 'jobs/{q['key']}'): "
                            f"{q['reason']}")
            job.event(time.time(), "failed", "record damaged; quarantined")
            out.append(job)
        return out

    def backup(self) -> bool:
        """The last good copy of the table: a compacted LMDB copy written
        next to it and swapped in atomically (never fatal)."""
        tmp = self.backup_path + ".tmp"
        try:
            with open(tmp, "wb") as fh:
                self.env.copyfd(fh.fileno(), compact=True)
                fh.flush()
                os.fsync(fh.fileno())
            check_lmdb_file(tmp)
            os.replace(tmp, self.backup_path)
            _fsync_dir(self.state_dir)
        except (OSError, lmdb.Error, JobTableError) as exc:
            self._warn(f"cannot back up the job table to {self.backup_path}: {exc}")
            try:
                os.unlink(tmp)
            except OSError:
                pass
            return False
        self._backup_at = (self.changes, time.time())
        return True

    def _maybe_backup(self) -> None:
        n, t = self._backup_at
        if self.changes - n >= BACKUP_EVERY and time.time() - t >= BACKUP_MIN_S:
            self.backup()

    def _warn(self, text: str) -> None:
        now = time.time()
        if now - self._warned >= 10.0:      # a full disk fails every write: once per 10 s
            self._warned = now
            log.warning("%s", text)

    # -- writes -----------------------------------------------------------------------
    def _write(self, fn) -> None:
        while True:
            try:
                with self.env.begin(write=True) as txn:
                    fn(txn)
                return
            except lmdb.MapFullError:
                self.env.set_mapsize(self.env.info()["map_size"] * 2)

    def _put_jobs(self, jobs: list[Job]) -> None:
        recs = [(j.id.encode(), msgpack.packb(j.to_record(), use_bin_type=True)) for j in jobs]

        def put(txn):
            for k, v in recs:
                txn.put(k, v, db=self.jobs)
        self._write(put)
        self.env.sync(True)

    def save(self, job: Job, strict: bool = False) -> bool:
        """Write one job's record (one synced transaction). A failure (a full
        disk) keeps the record to be written again with the next save and
        returns False; with ``strict`` it raises :class:`TableFull`."""
        todo = [j for jid, j in self.unsaved.items() if jid != job.id] + [job]
        try:
            self._put_jobs(todo)
        except (lmdb.Error, OSError) as exc:
            self.write_error = _why(exc)
            if strict:
                raise TableFull(f"cannot write the job table {self.path}: "
                                f"{self.write_error}") from None
            self.unsaved[job.id] = job
            self._warn(f"cannot write the job table {self.path}: {self.write_error}; "
                       f"{len(self.unsaved)} job record(s) kept in memory and written "
                       f"again with the next change")
            return False
        if self.unsaved:
            log.info("the job table is writable again: %d kept record(s) written",
                     len(self.unsaved))
        self.unsaved.clear()
        self.write_error = None
        self.changes += 1
        self._maybe_backup()
        return True

    def flush(self) -> bool:
        """Write the records kept after failed writes; True when none is left."""
        if not self.unsaved:
            return True
        job = next(iter(self.unsaved.values()))
        return self.save(job)

    def save_epoch(self, job_id: str, epoch: dict) -> None:
        key = f"{job_id}/{epoch['epoch']:09d}".encode()
        data = msgpack.packb(epoch, use_bin_type=True)
        try:
            self._write(lambda txn: txn.put(key, data, db=self.epochs))
        except (lmdb.Error, OSError) as exc:
            self._warn(f"cannot write an epoch row of {job_id} to {self.path}: {_why(exc)}")

    def trim_epochs(self, job_id: str, keep: int) -> None:
        """Drop the job's epoch rows from epoch ``keep`` on (one transaction)."""
        prefix = f"{job_id}/".encode()
        first = f"{job_id}/{keep:09d}".encode()

        def trim(txn):
            cur = txn.cursor(db=self.epochs)
            if cur.set_range(first):
                while cur.key().startswith(prefix):
                    if not cur.delete():
                        break
        try:
            self._write(trim)
        except (lmdb.Error, OSError) as exc:
            self._warn(f"cannot drop epoch rows of {job_id} in {self.path}: {_why(exc)}")

    def clear_epochs(self, job_id: str) -> None:
        self.trim_epochs(job_id, 0)

    def load_all(self) -> list[Job]:
        out = []
        with self.env.begin() as txn:
            for _, v in txn.cursor(db=self.jobs):
                job = Job.from_record(msgpack.unpackb(v, raw=False))
                prefix = f"{job.id}/".encode()
                cur = txn.cursor(db=self.epochs)
                if cur.set_range(prefix):
                    for k, e in cur:
                        if not k.startswith(prefix):
                            break
                        job.epochs.append(msgpack.unpackb(e, raw=False))
                out.append(job)
        return out

    def save_dataset(self, rec: dict) -> None:
        data = msgpack.packb(rec, use_bin_type=True)
        self._write(lambda txn: txn.put(rec["name"].encode(), data, db=self.data))
        self.env.sync(True)

    def drop_dataset(self, name: str) -> None:
        self._write(lambda txn: txn.delete(name.encode(), db=self.data))
        self.env.sync(True)

    def load_datasets(self) -> dict[str, dict]:
        with self.env.begin() as txn:
            return {k.decode(): msgpack.unpackb(v, raw=False)
                    for k, v in txn.cursor(db=self.data)}

    def close(self, backup: bool = True) -> None:
        """A clean shutdown: the records kept after failed writes written if
        possible, then the last good copy taken."""
        try:
            self.flush()
            self.env.sync(True)
            if backup and not self.unsaved:
                self.backup()
        except (lmdb.Error, OSError) as exc:
            log.warning("closing the job table %s: %s", self.path, _why(exc))
        finally:
            self.env.close()

    def seq(self) -> int:
        with self.env.begin() as txn:
            cur = txn.get(b"seq", db=self.meta)
        return int(cur) if cur else 0

    def next_seq(self) -> int:
        """The next job number (raises :class:`TableFull` if it cannot be
        recorded: a number is never handed out twice)."""
        box = []

        def bump(txn):
            cur = txn.get(b"seq", db=self.meta)
            n = (int(cur) if cur else 0) + 1
            txn.put(b"seq", str(n).encode(), db=self.meta)
            box.append(n)
        try:
            self._write(bump)
        except (lmdb.Error, OSError) as exc:
            self.write_error = _why(exc)
            raise TableFull(f"cannot write the job table {self.path}: "
                            f"{self.write_error}") from None
        self._write_history()
        return box[-1]


def _why(exc: BaseException) -> str:
    """'no space left on device' rather than 'mdb_txn_commit: No space ...'."""
    text = getattr(exc, "strerror", None) or str(exc)
    if ": " in text and text.startswith("mdb_"):
        text = text.split(": ", 1)[1]
    return text[:1].lower() + text[1:] if text else exc.__class__.__name__
