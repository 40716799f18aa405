"""An executor's start-up runs at the lowest CPU priority, in a thread of
its own, and executors share their daemon's session (so that nice values
count where the kernel shares CPU time between sessions first)."""
import json
import os
import threading

import pytest

from harmony.client import Client
from harmony.cluster import LocalCluster
from harmony.worker.executor.startup import run_low, startup_nice
from conftest import wait_state


def _nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def test_run_low_runs_in_a_thread_of_its_own_at_nice_19():
    before = _nice()
    seen = {}

    def fn():
        seen["nice"], seen["thread"] = _nice(), threading.get_ident()
        return 42
    assert run_low(fn, nice=19) == 42
    assert seen["nice"] == 19 and seen["thread"] != threading.get_ident()
    assert _nice() == before                      # the caller keeps its priority


def test_run_low_reraises_and_0_runs_inline():
    def boom():
        raise ZeroDivisionError("on purpose")
    with pytest.raises(ZeroDivisionError, match="on purpose"):
        run_low(boom, nice=19)
    assert run_low(threading.get_ident, nice=0) == threading.get_ident()


def test_the_nice_value_comes_from_the_environment(monkeypatch):
    for raw, want in (("", 19), ("0", 0), ("7", 7), ("40", 19), ("-3", 0), ("x", 19)):
        monkeypatch.setenv("HARMONY_STARTUP_NICE", raw)
        assert startup_nice() == want, raw


PROBE_APP = '''
import json, os, threading
import numpy as np
from harmony.app import App, ModelSpec, Option
from harmony.store.blocks import Block


class Probe(App):
    """Writes, from its input reader, the priority and session it runs in."""
    name = "probe"
    options = [Option("out", str, "", "where to write")]

    def read_input(self, part):
        with open(self.opts.out, "w") as fh:
            json.dump({"nice": os.getpriority(os.PRIO_PROCESS, threading.get_native_id()),
                       "main": threading.current_thread() is threading.main_thread(),
                       "sid": os.getsid(0), "daemon_sid": os.getsid(os.getppid()),
                       "pgid": os.getpgid(0), "pid": os.getpid()}, fh)
        for b in part.my_blocks():
            yield Block(b, {"k": np.arange(4, dtype=np.int64)})

    def model_spec(self):
        return ModelSpec(4, 1)

    def keys(self, blocks):
        return np.arange(4, dtype=np.int64) if blocks else np.zeros(0, np.int64)

    def compute(self, blocks, keys, rows, step):
        return np.zeros_like(rows)

    def objective(self, blocks, keys, rows):
        return {"objective": 0.0}
'''


def test_an_executor_reads_its_input_at_nice_19_in_its_daemons_session(tmp_path):
    out = tmp_path / "probe.json"
    with LocalCluster(1, str(tmp_path / "cl"), port=0) as cl, \
            Client(cl.endpoint, keys=cl.keys) as c:
        j = c.submit("probe.py", PROBE_APP, ["--out", str(out), "--max-epochs", "1"],
                     machines=1)
        st = wait_state(c, j, ("finished", "failed"))
        assert st["state"] == "finished", st["error"]
    seen = json.loads(out.read_text())
    assert seen["nice"] == 19 and not seen["main"], seen
    assert seen["sid"] == seen["daemon_sid"], seen      # not a session of its own
    assert seen["pgid"] == seen["pid"], seen            # its own group: the daemon signals it
