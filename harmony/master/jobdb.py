"""The master's durable job table, in LMDB under the state directory."""
from __future__ import annotations

import os

import lmdb
import msgpack

from harmony.master.jobs import Job

MAP_SIZE = 1 << 30  # sparse; grown on MapFullError


class JobDB:
    def __init__(self, state_dir: str) -> None:
        os.makedirs(state_dir, exist_ok=True)
        self.path = os.path.join(state_dir, "master.lmdb")
        # fsync is explicit: job records (state changes) are synced, per-epoch
        # metric rows are not (a crash may lose the last seconds of metrics)
        self.env = lmdb.open(self.path, map_size=MAP_SIZE, max_dbs=4, subdir=True,
                             sync=False, metasync=False)
        self.jobs = self.env.open_db(b"jobs")
        self.meta = self.env.open_db(b"meta")
        self.epochs = self.env.open_db(b"epochs")
        self.data = self.env.open_db(b"datasets")   # the staged-input catalog

    def _write(self, fn) -> None:
        while True:
            try:
                with self.env.begin(write=True) as txn:
                    fn(txn)
                return
            except lmdb.MapFullError:
                self.env.set_mapsize(self.env.info()["map_size"] * 2)

    def save(self, job: Job) -> None:
        data = msgpack.packb(job.to_record(), use_bin_type=True)
        self._write(lambda txn: txn.put(job.id.encode(), data, db=self.jobs))
        self.env.sync(True)

    def save_epoch(self, job_id: str, epoch: dict) -> None:
        key = f"{job_id}/{epoch['epoch']:09d}".encode()
        data = msgpack.packb(epoch, use_bin_type=True)
        self._write(lambda txn: txn.put(key, data, db=self.epochs))

    def clear_epochs(self, job_id: str) -> None:
        prefix = f"{job_id}/".encode()

        def clear(txn):
            cur = txn.cursor(db=self.epochs)
            if cur.set_range(prefix):
                while cur.key().startswith(prefix):
                    if not cur.delete():
                        break
        self._write(clear)

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

    def close(self) -> None:
        self.env.sync(True)
        self.env.close()

    def next_seq(self) -> int:
        box = []

        def bump(txn):
            cur = txn.get(b"seq", db=self.meta)
            n = (int(cur) if cur else 0) + 1
            txn.put(b"seq", str(n).encode(), db=self.meta)
            box.append(n)
        self._write(bump)
        return box[-1]
