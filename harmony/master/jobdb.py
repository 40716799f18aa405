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
        self.env = lmdb.open(self.path, map_size=MAP_SIZE, max_dbs=4, subdir=True,
                             sync=True, metasync=True)
        self.jobs = self.env.open_db(b"jobs")
        self.meta = self.env.open_db(b"meta")

    def close(self) -> None:
        self.env.close()

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

    def load_all(self) -> list[Job]:
        out = []
        with self.env.begin() as txn:
            for _, v in txn.cursor(db=self.jobs):
                out.append(Job.from_record(msgpack.unpackb(v, raw=False)))
        return out

    def next_seq(self) -> int:
        box = []

        def bump(txn):
            cur = txn.get(b"seq", db=self.meta)
            n = (int(cur) if cur else 0) + 1
            txn.put(b"seq", str(n).encode(), db=self.meta)
            box.append(n)
        self._write(bump)
        return box[-1]
