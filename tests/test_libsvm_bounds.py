"""A LIBSVM feature index that plans a model beyond the machine's memory is
refused before the model is allocated, naming the file, the line and the
index: in the local runner (a child process under an address-space limit, so
that a regression fails instead of eating the host's memory) and on a real
one-machine cluster (the error in ``status`` and in the executor's log)."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from conftest import ROOT, run_cli, wait_state
from harmony.client import Client
from harmony.cluster import LocalCluster

HUGE = 2147483646          # the largest index the reader takes (int32)
LINE = 7                   # the line that holds it


def _write(path: str, app: str) -> str:
    lines = []
    for i in range(1, 13):
        label = i % 2 if app == "mlr" else 0.5 * i
        idx = HUGE if i == LINE else (i % 5) + 1
        lines.append(f"{label} 1:0.5 {idx}:1.0\n")
    with open(path, "w") as fh:
        fh.writelines(lines)
    return path


_CHILD = r"""
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
from harmony.app import load_app, run_local
app, path = sys.argv[1], sys.argv[2]
cls = load_app(open(f"apps/{app}.py").read(), f"{app}.py")
try:
    run_local(cls, ["--input", path, "--max-epochs", "1"])
    out = {"error": None}
except BaseException as exc:
    out = {"error": f"{type(exc).__name__}: {exc}"}
out["maxrss_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps(out))
"""


@pytest.mark.parametrize("app", ["mlr", "lasso"])
def test_run_local_refuses_a_huge_index_naming_line_and_index(tmp_path, app):
    path = _write(str(tmp_path / "huge.svm"), app)
    r = subprocess.run([sys.executable, "-c", _CHILD, app, path], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    err = out["error"] or ""
    assert err.startswith("InputError: "), err
    assert f"{path}:{LINE}:" in err and f"feature index {HUGE}" in err, err
    assert "memory budget" in err, err
    assert out["maxrss_kib"] < 1 << 20, out          # under 1 GiB: nothing of its width


def test_a_cluster_job_with_a_huge_index_fails_naming_line_and_index(tmp_path):
    path = _write(str(tmp_path / "huge.svm"), "mlr")
    cl = LocalCluster(1, str(tmp_path / "cl"), port=0, memory_per_machine=1 << 30)
    cl.start()
    try:
        with Client(cl.endpoint, timeout_s=30) as c:
            job = c.submit("mlr.py", (ROOT / "apps" / "mlr.py").read_text(),
                           ["--input", path, "--max-epochs", "2"], 1)
            st = wait_state(c, job, ("failed", "finished"), timeout=180)
        assert st["state"] == "failed"
        want = f"{path}:{LINE}: feature index {HUGE}"
        assert want in (st["error"] or "") and "memory budget of 1.0 GiB" in st["error"], st
        r = run_cli("status", job, "--master", cl.endpoint)
        assert r.returncode == 0 and want in r.stdout, r.stdout + r.stderr
        # the executor's own log says it too (kept by its daemon once it is done)
        deadline = time.time() + 30
        while True:
            r = run_cli("logs", job, "--master", cl.endpoint)
            if r.returncode == 0 and want in r.stdout:
                break
            assert time.time() < deadline, r.stdout + r.stderr
            time.sleep(0.5)
    finally:
        cl.stop()
