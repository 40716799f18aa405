"""A checkpoint that cannot be written or replicated degrades instead of
failing the job: a replica goes to another holder when its machine's disk
is full, a part that cannot be written here skips that checkpoint (the job
goes on from its last complete one, and `harmony status` says why), and the
next one is complete again once there is room. Every worker's disk is a
small tmpfs of its own (root needed to mount them)."""
from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time

import pytest

from harmony.client import Client
from harmony.cluster import LocalCluster
from apps_for_tests import TOY_APP
from conftest import ckpt_parts_left, wait_state

LONG = ["--max-epochs", "100000", "--sleep", "0.05"]


@pytest.fixture
def disks(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("full disks are emulated with small tmpfs mounts, which need root")
    out = []
    try:
        for name in ("m0", "m1", "m2"):
            d = tmp_path / "disks" / name
            d.mkdir(parents=True)
            r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", f"harmony-{name}",
                                str(d)], capture_output=True, text=True)
            if r.returncode != 0:
                pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
            out.append(d)
        yield out
    finally:
        for d in out:
            subprocess.run(["umount", "-l", str(d)], capture_output=True)


class Full:
    """Keep a file system full: what a deleted file frees (old checkpoint
    parts are dropped as new ones complete) is taken again at once."""

    def __init__(self, d) -> None:
        self.path = os.path.join(str(d), "filler")
        self._stop = threading.Event()
        self._fh = open(self.path, "ab", buffering=0)
        self._fill()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _fill(self) -> None:
        for size in (1 << 20, 4096, 1):
            try:
                while True:
                    self._fh.write(b"\0" * size)
            except OSError:
                pass

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            self._fill()

    def release(self) -> None:
        self._stop.set()
        self._t.join()
        self._fh.close()
        os.unlink(self.path)


def _until(c: Client, job: str, ok, what: str, timeout: float = 90.0) -> dict:
    deadline = time.time() + timeout
    while True:
        st = c.status(job)
        if ok(st):
            return st
        assert st["state"] == "running", (what, st["state"], st.get("error"))
        assert time.time() < deadline, f"{what}: {st.get('checkpoint')} {st.get('ckpt_skipped')}"
        time.sleep(0.1)


def test_full_disks_skip_or_move_checkpoints_and_never_fail_the_job(disks, tmp_path):
    root = tmp_path / "c"
    (root / "workers").mkdir(parents=True)
    for d in disks:
        os.symlink(d, root / "workers" / d.name)
    cl = LocalCluster(3, str(root), port=0, policy="least-loaded")
    cl.start()
    fillers = []
    try:
        with Client(cl.endpoint) as c:
            job = c.submit("toy.py", TOY_APP, LONG, 1, checkpoint_every=1,
                           checkpoint_seconds=0)
            wait_state(c, job, ("running",))
            st = _until(c, job, lambda s: s.get("checkpoint"), "a first checkpoint")
            here, replica = st["checkpoint"]["holders"]
            third = ({"m0", "m1", "m2"} - {here, replica}).pop()
            # 1. the replica's machine is full: the replica goes to the third one
            fillers.append(Full(next(d for d in disks if d.name == replica)))
            ep = c.status(job)["checkpoint"]["epoch"]     # one under way may predate the fill
            st = _until(c, job, lambda s: s["checkpoint"]["epoch"] > ep + 1,
                        "checkpoints with the replica machine full")
            assert st["checkpoint"]["holders"] == [here, third], st["checkpoint"]
            assert not st.get("ckpt_skipped")
            # 2. its own machine is full too: checkpoints are skipped, the job runs on
            fillers.append(Full(next(d for d in disks if d.name == here)))
            st = _until(c, job, lambda s: s.get("ckpt_skipped"), "a skipped checkpoint")
            last = st["checkpoint"]["epoch"]
            assert f"the last complete one is after epoch {last + 1}" in st["ckpt_skipped"]
            assert "part 0 on " + here in st["ckpt_skipped"], st["ckpt_skipped"]
            n = st["epochs_total"]
            st = _until(c, job, lambda s: s["epochs_total"] >= n + 5, "epochs after the skip")
            assert st["failures"] == 0 and st["checkpoint"]["epoch"] == last
            assert any("skipped" in e[2] for e in st["events"])
            # 3. room again: the next checkpoint is complete, the warning gone
            for f in fillers:
                f.release()
            fillers = []
            st = _until(c, job, lambda s: s["checkpoint"]["epoch"] > last
                        and not s.get("ckpt_skipped"), "a complete checkpoint again")
            assert st["failures"] == 0 and st["attempt"] == 1
            c.cancel(job)
    finally:
        for f in fillers:
            f.release()
        cl.stop()


@contextlib.contextmanager
def _slow_link(tmp_path, epochs: int):
    """A 2-machine cluster with 200 KB/s links, running a toy job of
    ``epochs`` epochs on 1 machine, a periodic checkpoint every 3 epochs:
    yields (client, cluster, job)."""
    cl = LocalCluster(2, str(tmp_path / "c"), port=0, net_bandwidth="200k")
    cl.start()
    try:
        with Client(cl.endpoint, timeout_s=10, keys=cl.keys) as c:
            yield c, cl, c.submit("toy.py", TOY_APP, ["--max-epochs", str(epochs), "--sleep",
                                                      "0.02", "--keys", "4000"],
                                  machines=1, checkpoint_every=3)
    finally:
        cl.stop()


def test_a_periodic_checkpoint_is_replicated_behind_the_job(tmp_path):
    """A periodic checkpoint's part crosses a slow link (200 KB/s; the part,
    16 input blocks and the model, is about 0.6 MB: 3 s) to its replica
    while the job trains on: epochs after the checkpoint's are reported
    before the master counts it complete. (In
    line, the executor reported the part before it began the next epoch,
    so no later epoch could come first.) The part is complete all the same,
    with its replica on the other machine, and what it wrote is kept past
    the final checkpoint (the simulator's import reads it)."""
    with _slow_link(tmp_path, 300) as (c, cl, job):
        deadline = time.monotonic() + 120
        st = c.status(job)
        while not st.get("checkpoint") and time.monotonic() < deadline:
            assert st["state"] in ("waiting", "profiling", "running"), st.get("error")
            time.sleep(0.2)
            st = c.status(job)
        ck = st["checkpoint"]
        assert ck and ck["replicas"] == 1 and ck["bytes"] > 300_000, ck
        assert ck["periodic_bytes"] == ck["bytes"]
        later = [e["epoch"] for e in st["epochs"]
                 if e["epoch"] > ck["epoch"] and e["time"] < ck["time"]]
        assert len(later) >= 2, (ck, [(e["epoch"], e["time"]) for e in st["epochs"]])
        # what a periodic checkpoint wrote stays beside the final one
        st = wait_state(c, job, ("finished", "failed"))
        assert st["state"] == "finished", st["error"]
        assert st["checkpoint"]["final"] and \
            st["checkpoint"]["periodic_bytes"] == ck["bytes"], st["checkpoint"]


def test_the_final_checkpoint_supersedes_a_part_still_behind_the_job(tmp_path):
    """The job ends two epochs after a periodic checkpoint whose part needs
    about 3 s over the 200 KB/s link: the final checkpoint (the model
    only, about 0.1 MB) drops it instead of waiting, so the job finishes
    without a complete periodic checkpoint, and only the final one's parts
    stay on the machines."""
    with _slow_link(tmp_path, 5) as (c, cl, job):
        st = wait_state(c, job, ("finished", "failed"))
        assert st["state"] == "finished", st["error"]
        ck = st["checkpoint"]
        assert ck["final"] and ck["epoch"] == 4 and ck["replicas"] == 1, ck
        assert ck["periodic_bytes"] is None, ck
        assert ckpt_parts_left(cl.state_dir, job, ["e4-p0", "e4-p0"]) == \
            ["e4-p0", "e4-p0"]
