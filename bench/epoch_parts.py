"""Where a 1-machine job's epoch goes, against the plain loop's
(``harmony.app.run_local``), for one or more versions of the runtime side by
side (issue #36): timestamps taken inside the executor, by its own clock.

The executor's methods are wrapped from a ``sitecustomize`` module that
this script writes and puts first on its clusters' ``PYTHONPATH`` (only
processes started as ``harmony.worker.executor`` are touched; nothing in
the package changes). Per epoch it records: the training part and the
objective (``train+eval``), the end of the epoch until the next one starts
(``boundary``: the store's α step ``adapt``, ``epoch_done`` out and
``epoch_sums`` back ``send..sums``, the report and the log line
``report..next``), the executor's ``period`` (one epoch start to the next),
and the CPU time and page faults of the app's calls (COMP and objective,
the thread that runs them). The reference loop's app calls are measured
alike. Printed per part: median, 10th percentile and minimum over the
epochs of every round (the first and the last epoch of a job, and epochs
with a checkpoint, left out). Variants and data as in ``overhead_ab.py``.

    python bench/epoch_parts.py --app lasso-wide --variant base=d6d1895 \\
        --variant new=. [--rounds 3] [--epochs 30]
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import argparse  # noqa: E402
import glob  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from contextlib import ExitStack  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from harmony.app import load_app  # noqa: E402
from harmony.client import Client  # noqa: E402
from harmony.cluster import LocalCluster  # noqa: E402
from overhead_ab import data_and_args, reference, tree_of  # noqa: E402

SITE = r'''
import os, sys
_d = os.environ.get("EPOCH_PARTS_DIR")
if _d and "harmony.worker.executor" in " ".join(getattr(sys, "orig_argv", [])):
    import json, resource, time
    import harmony.store.local as _sl
    import harmony.worker.executor.training as tr
    _pc, TS, acc = time.perf_counter, [], [0.0, 0]
    _out = open(os.path.join(_d, f"parts-{os.getpid()}.jsonl"), "a")

    def _mark(name):
        TS.append((name, _pc()))

    _call0 = tr._call
    def _call(view, fn):
        f0, c0 = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt, time.thread_time()
        try:
            return _call0(view, fn)
        finally:
            acc[0] += time.thread_time() - c0
            acc[1] += resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - f0
    tr._call = _call

    def _wrap(cls, name, before=None, after=None):
        f = getattr(cls, name)
        def w(self, *a, **k):
            if before:
                _mark(before(*a) if callable(before) else before)
            out = f(self, *a, **k)
            if after:
                _mark(after(*a) if callable(after) else after)
            return out
        setattr(cls, name, w)
    _wrap(_sl.LocalInput, "take_totals", before="eval_end")
    _wrap(tr.Training, "_adapt", before="adapt0", after="adapt1")
    _wrap(tr.Training, "wait", after=lambda m: "got_" + m)
    _wrap(tr.Training, "_keys", before=lambda app, inp, ids, cache, slot: f"keys_{slot}")
    _send = tr.Training.send
    def send(self, kind, **kw):
        _mark("send0_" + kind)
        if kind == "epoch_done":
            TS.append(("app", acc[0], acc[1]))
            acc[0], acc[1] = 0.0, 0
        out = _send(self, kind, **kw)
        if kind == "epoch_report":
            _out.write(json.dumps(TS) + "\n")
            _out.flush()
            TS.clear()
        return out
    tr.Training.send = send
'''

med = statistics.median


def q(x: list[float], p: float) -> float:
    return sorted(x)[int(p * (len(x) - 1))]


def parts(d: str) -> dict[str, list[float]]:
    """Per-epoch parts (seconds; page faults as counts) from the executor's marks."""
    rows = [json.loads(line) for f in sorted(glob.glob(os.path.join(d, "parts-*.jsonl")))
            for line in open(f)]
    out: dict[str, list[float]] = {}
    for r, nxt in zip(rows[1:-1], rows[2:]):
        if any(m[0].startswith("send0_ckpt") for m in r):
            continue
        m = {x[0]: x[1] for x in r if x[0] != "app"}
        app = next(x for x in r if x[0] == "app")
        t0, tn = r[0][1], nxt[0][1]
        for k, v in (("period", tn - t0), ("train+eval", m["eval_end"] - t0),
                     ("boundary", tn - m["eval_end"]), ("adapt", m["adapt1"] - m["adapt0"]),
                     ("send..sums", m["got_epoch_sums"] - m["send0_epoch_done"]),
                     ("report..next", tn - m["got_epoch_sums"]),
                     ("app CPU", app[1]), ("app faults", app[2])):
            out.setdefault(k, []).append(v)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--app", required=True, choices=("nmf-als", "nmf-sgd", "lasso-tall",
                                                      "lasso-wide"))
    ap.add_argument("--variant", action="append", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--app-args", default="")
    ap.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "harmony-ab"))
    a = ap.parse_args()
    variants = [(v.partition("=")[0], tree_of(v.partition("=")[2] or ".", a.cache))
                for v in a.variant]
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        os.chdir(tmp)        # "python -m" looks in its working directory first
        site = os.path.join(tmp, "site")
        os.makedirs(site)
        Path(site, "sitecustomize.py").write_text(SITE)
        name, args = data_and_args(a.app, tmp, a.epochs)
        args += a.app_args.split()
        src = (ROOT / "apps" / f"{name}.py").read_text()
        base = load_app(src, f"{name}.py")
        app_cpu = [0.0, 0]

        class Timed(base):       # the reference's app calls, measured as the executor's
            def compute(self, *x):
                return self._timed(super().compute, x)

            def objective(self, *x):
                return self._timed(super().objective, x)

            def metrics(self, s):                      # once per epoch, after both
                Timed.per_epoch.append(tuple(app_cpu))
                return super().metrics(s)

            @staticmethod
            def _timed(fn, x):
                f0 = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
                c0 = time.thread_time()
                try:
                    return fn(*x)
                finally:
                    app_cpu[0] += time.thread_time() - c0
                    app_cpu[1] += resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - f0
        Timed.__module__ = base.__module__
        clients, dirs = {}, {}
        for v, tree in variants:
            dirs[v] = os.path.join(tmp, "parts-" + v)
            os.makedirs(dirs[v])
            saved = dict(os.environ)
            os.environ["PYTHONPATH"] = site + (os.pathsep + tree if tree else "")
            os.environ["EPOCH_PARTS_DIR"] = dirs[v]
            try:
                cl = stack.enter_context(LocalCluster(1, os.path.join(tmp, "c-" + v), port=0))
            finally:
                os.environ.clear()
                os.environ.update(saved)
            clients[v] = stack.enter_context(Client(cl.endpoint, keys=cl.keys))
        ref_epoch: list[float] = []
        ref_app: dict[str, list[float]] = {"app CPU": [], "app faults": []}
        got: dict[str, dict[str, list[float]]] = {v: {} for v, _ in variants}
        print(f"{a.app} {' '.join(args[2:])}: {a.rounds} rounds; variants "
              + ", ".join(f"{v}={t or 'this tree'}" for v, t in variants), flush=True)
        for r in range(a.rounds):
            Timed.per_epoch = []
            app_cpu[:] = [0.0, 0]
            ref = reference(Timed, args)
            ref_epoch += ref.epoch_times[1:]
            pe = Timed.per_epoch
            for (c0, f0), (c1, f1) in zip(pe, pe[1:]):
                ref_app["app CPU"].append(c1 - c0)
                ref_app["app faults"].append(f1 - f0)
            for v, _ in variants[r % len(variants):] + variants[:r % len(variants)]:
                for f in glob.glob(os.path.join(dirs[v], "*")):
                    os.unlink(f)
                job = clients[v].submit(f"{name}.py", src, args, machines=1)
                while (st := clients[v].status(job))["state"] not in ("finished", "failed"):
                    time.sleep(0.2)
                if st["state"] != "finished":
                    raise SystemExit(f"job failed: {st['error']}")
                for k, x in parts(dirs[v]).items():
                    got[v].setdefault(k, []).extend(x)
            print(f"round {r} done (load {os.getloadavg()[0]:.2f})", flush=True)

        def line(label: str, x: list[float], faults: bool = False) -> str:
            s = 1.0 if faults else 1e3
            unit = "" if faults else " ms"
            return (f"  {label:>24}: median {med(x) * s:9.3f}  p10 {q(x, .1) * s:9.3f}  "
                    f"min {min(x) * s:9.3f}{unit}  (n={len(x)})")
        print(line("reference epoch", ref_epoch))
        print(line("reference app CPU", ref_app["app CPU"]))
        print(line("reference app faults", ref_app["app faults"], True))
        for v, _ in variants:
            for k, x in got[v].items():
                print(line(f"{v} {k}", x, k == "app faults"))
            p = got[v]["period"]
            print(f"  {v} period / reference epoch: median {med(p) / med(ref_epoch):.3f}, "
                  f"p10 {q(p, .1) / q(ref_epoch, .1):.3f}, min {min(p) / min(ref_epoch):.3f}")


if __name__ == "__main__":
    main()
