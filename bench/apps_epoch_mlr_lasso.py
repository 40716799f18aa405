"""MLR and Lasso time per epoch: the runtime on 1 machine vs the plain
single-process reference loop (``harmony.app.run_local``: same app code, same
data, no processes or sockets), measured in the same run, plus samples
processed per second per core.

The runtime's epoch time is wall time between consecutive epoch reports at
the master, so it includes PULL, COMP, PUSH, barriers and the objective
round; the reference's is the wall time of its epoch loop body. The apps'
kernels (scipy sparse) are single-threaded and BLAS is pinned to one thread
in the reference, so samples/s is also samples/s per core. COMP and the
objective evaluation are also timed on both sides: their difference between
the two shows machine noise (this machine is shared), the rest of the
runtime's epoch is its own cost (PULL, PUSH, barriers, epoch round).

    python bench/apps_epoch_mlr_lasso.py [--scale 1.0] [--epochs 8]
                                         [--apps mlr,lasso-tall,lasso-wide]

Data (generated, in a temporary directory): MLR in Bösen's shape at
``0.05 * scale`` (5,000 samples, 8,000 features, 200 classes, 100 nonzeros
per sample); Lasso with 100 nonzeros per sample and 200 planted
coefficients, "tall" (100,000 x ``scale`` samples, 5,000 features) and
"wide" (50,000 x ``scale`` samples, 20,000 features: 4x the model traffic
for half the computation). The reference runs before and after the runtime
(the development machine is shared) and its median over both is used.
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harmony.app import load_app, run_local  # noqa: E402
from harmony.client import Client  # noqa: E402
from harmony.cluster import LocalCluster  # noqa: E402
from harmony.datagen.lasso import gen_lasso  # noqa: E402
from harmony.datagen.mlr import BOSEN, gen_mlr  # noqa: E402


def timed(cls):
    """The app class with COMP and objective timed (per call, in lists)."""
    class Timed(cls):
        comp: list[float] = []
        eval: list[float] = []

        def compute(self, *a):
            t = time.perf_counter()
            out = super().compute(*a)
            Timed.comp.append(time.perf_counter() - t)
            return out

        def objective(self, *a):
            t = time.perf_counter()
            out = super().objective(*a)
            Timed.eval.append(time.perf_counter() - t)
            return out
    Timed.__module__ = cls.__module__
    return Timed


def bench(name: str, app: str, args: list[str], samples: int, tmp: str,
          rounds: int = 2) -> None:
    """Reference and runtime interleaved for ``rounds`` rounds on one cluster;
    each side's best median epoch time counts (the 2 cores are shared, and
    memory-bound kernels swing by tens of percent between minutes)."""
    src = (ROOT / "apps" / f"{app}.py").read_text()
    cls = timed(load_app(src, f"{app}.py"))
    refs, runs = [], []
    ref_total = 0.0
    with LocalCluster(1, os.path.join(tmp, f"c-{name}"), port=0) as cl, \
            Client(cl.endpoint, keys=cl.keys) as c:
        for r in range(rounds):
            t0 = time.perf_counter()
            refs.append(run_local(cls, args))
            ref_total = time.perf_counter() - t0
            job = c.submit(f"{app}.py", src, args, machines=1)
            while (st := c.status(job))["state"] not in ("finished", "failed"):
                time.sleep(0.2)
            if st["state"] != "finished":
                raise SystemExit(f"{name} job failed: {st['error']}")
            runs.append(st)
    before = refs[0]

    def run_median(st):
        times = [e["time"] for e in st["epochs"]]
        return statistics.median(b - a for a, b in zip(times, times[1:]))
    ref_m = [statistics.median(r.epoch_times[1:]) for r in refs]
    run_m = [run_median(st) for st in runs]
    reference, runtime = min(ref_m), min(run_m)
    st = runs[run_m.index(runtime)]
    epochs = st["epochs"]
    print(f"{name}: rounds (s/epoch): reference "
          + ", ".join(f"{v:.4f}" for v in ref_m) + "; runtime "
          + ", ".join(f"{v:.4f}" for v in run_m))
    same = abs(epochs[-1]["metrics"]["objective"] / before.history[-1]["objective"] - 1)
    tm = {k: statistics.median(e["timings"].get(k, 0.0) for e in epochs[1:])
          for k in ("pull", "comp", "push", "sync", "eval")}
    # COMP calls per epoch (reference runs only: the cluster's executor is
    # another process and does not append to these lists)
    iters = max(1, len(cls.comp) // (len(before.epoch_times) * len(refs)))
    ref_comp = statistics.median(cls.comp) * iters
    ref_eval = statistics.median(cls.eval)
    print(f"{name}: {samples:,} samples/epoch, median of {len(epochs) - 1} epochs "
          f"(a reference run, reading included: {ref_total:.1f} s)")
    print(f"  reference (single process): {reference:.4f} s/epoch "
          f"({samples / reference:,.0f} samples/s per core)")
    print(f"    of which comp {ref_comp:.4f}, eval {ref_eval:.4f}")
    print(f"  runtime, 1 machine        : {runtime:.4f} s/epoch "
          f"({samples / runtime:,.0f} samples/s per core)")
    print("    of which " + ", ".join(f"{k} {v:.4f}" for k, v in tm.items()))
    print(f"  ratio runtime/reference   : {runtime / reference:.3f}  (issue #36: <= 1.05)")
    print(f"  final objective rel. diff : {same:.2e}  "
          f"(objective {epochs[-1]['metrics']['objective']:.6g})", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--apps", default="mlr,lasso-tall,lasso-wide")
    ap.add_argument("--lasso-args", default="",
                    help="more Lasso options, e.g. '--solver fista' (default: its ws solver)")
    ap.add_argument("--samples-factor", type=float, default=1.0,
                    help="more samples per epoch on the same model (more COMP per PULL/PUSH)")
    a = ap.parse_args()
    apps = a.apps.split(",")
    common = ["--max-epochs", str(a.epochs)]
    with tempfile.TemporaryDirectory() as tmp:
        if "mlr" in apps:
            s = 0.05 * a.scale
            n = round(BOSEN["samples"] * s * a.samples_factor)
            data = os.path.join(tmp, "mlr.svm")
            shape = gen_mlr(data, samples=n, features=round(BOSEN["features"] * s),
                            classes=round(BOSEN["classes"] * s), nnz=100, seed=0)
            print(f"MLR data: {shape}; 2 iterations/epoch, batch 100, 10% held out")
            bench("mlr", "mlr", ["--input", data, "--iters-per-epoch", "2"] + common,
                  round(0.9 * n), tmp)
        for name, n, f in (("lasso-tall", 100_000, 5_000), ("lasso-wide", 50_000, 20_000)):
            if name not in apps:
                continue
            n = round(n * a.scale * a.samples_factor)
            data = os.path.join(tmp, f"{name}.svm")
            shape = gen_lasso(data, samples=n, features=f, nonzeros=200, noise=0.5, nnz=100,
                              seed=0)
            print(f"Lasso data: {shape}; 1 iteration (full gradient) per epoch")
            bench(name, "lasso", ["--input", data, "--lam", "0.01"] + a.lasso_args.split()
                  + common, n, tmp)
            os.unlink(data)


if __name__ == "__main__":
    main()
