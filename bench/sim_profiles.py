"""Measure what ``harmony/sim/workload.py`` hard-codes: each app's loss curve
and the per-iteration profiles of ``bench/scheduler_e2e.py``'s two NMF kinds.

    python bench/sim_profiles.py [--epochs 30] [--out bench/out/sim_profiles.json]

1. Loss curves: every app (nmf, lda, mlr, lasso) runs in-process
   (``harmony.app.run_local``: the app's own code, no runtime) on small data
   from ``harmony.datagen``, one iteration per epoch, and the objective after
   every epoch is normalized by the first one and fitted with SLAQ's
   sublinear model ``1/(a k^2 + b k + c) + d`` and its linear model
   ``mu^(k-b) + c`` (``harmony.policies.curves.fit_curve``, epochs 2.. , equal
   weights), keeping the better fit (the smaller largest relative error).
   Also reported: the epoch by which the objective came within 1% of its
   final value ("converged").
2. scheduler_e2e profiles: the CPU-heavy and network-heavy NMF jobs of
   ``bench/scheduler_e2e.py`` (same generator arguments and app options),
   COMP seconds per iteration on this machine (one process, like an emulated
   1-core machine) and the PULL + PUSH data bytes per iteration of one
   machine at DoP 1 (distinct keys x rank x 4 bytes, pulled and pushed).

Takes about half a minute. The numbers printed are copied into workload.py with
the date of the run.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from harmony.app import InputPart, Step, block_groups, load_app, parse_app_args, run_local  # noqa: E402
from harmony.datagen.lasso import gen_lasso  # noqa: E402
from harmony.datagen.lda import gen_lda  # noqa: E402
from harmony.datagen.mlr import gen_mlr  # noqa: E402
from harmony.datagen.nmf import gen_nmf  # noqa: E402
from harmony.policies.curves import fit_curve  # noqa: E402


def app_cls(name: str):
    return load_app((ROOT / "apps" / f"{name}.py").read_text(), f"{name}.py")


def curves(tmp: str, epochs: int) -> dict:
    data = {
        "nmf": (lambda p: gen_nmf(p, users=2000, items=500, rank=8, per_user=40, seed=1,
                                  activity="zipf"), ["--rank", "8", "--solver", "sgd"]),
        "lda": (lambda p: gen_lda(p, docs=400, vocab=800, topics=10, seed=1), ["--topics", "10"]),
        "mlr": (lambda p: gen_mlr(p, samples=4000, features=200, classes=10, seed=1), []),
        "lasso": (lambda p: gen_lasso(p, samples=1000, features=200, nonzeros=20, seed=1),
                  ["--lam", "0.05"]),
    }
    out = {}
    for app, (gen, extra) in data.items():
        path = os.path.join(tmp, f"{app}.txt")
        gen(path)
        t0 = time.perf_counter()
        res = run_local(app_cls(app), ["--input", path, "--max-epochs", str(epochs),
                                       "--iters-per-epoch", "1", "--diverge-epochs", "1000",
                                       *extra])
        obj = [h["objective"] for h in res.history]
        rel = [o / obj[0] for o in obj]
        ks = list(range(1, len(rel) + 1))
        final = rel[-1]
        conv = next(k for k, v in zip(ks, rel) if abs(v - final) <= 0.01 * abs(final))
        # both of SLAQ's models, all points weighted alike, from epoch 2 on
        # (the first epoch starts from the random model); the better fit wins
        fits = []
        for kind in ("sublinear", "linear"):
            c = fit_curve(ks[1:], rel[1:], kind=kind, decay=1.0)
            fits.append((max(abs(c.loss(k) - v) / abs(v) for k, v in zip(ks[1:], rel[1:])), c))
        err, curve = min(fits, key=lambda f: f[0])
        out[app] = {"objective": obj, "relative": rel, "curve": curve.spec(),
                    "max_rel_fit_error": err, "converged_epoch": conv,
                    "seconds": time.perf_counter() - t0}
        print(f"{app:6} {curve.spec():60} fit err {100 * err:.2f}%  converged at epoch {conv}  "
              f"rel objective {rel[0]:.3f} -> {rel[-1]:.4f}", flush=True)
    return out


def e2e_profiles(tmp: str) -> dict:
    """The two job kinds of bench/scheduler_e2e.py with its default sizes."""
    cpu_data, net_data = os.path.join(tmp, "cpu.txt"), os.path.join(tmp, "net.txt")
    gen_nmf(cpu_data, users=8000, items=500, rank=8, per_user=60, seed=1)
    gen_nmf(net_data, users=20000, items=100000, rank=8, per_user=10, seed=2)
    common = ["--max-epochs", "2", "--holdout", "0", "--iters-per-epoch", "2", "--solver", "sgd"]
    kinds = {"cpu": ["--input", cpu_data, "--rank", "64", *common],
             "net": ["--input", net_data, "--rank", "32", "--batch-size", "4096", *common]}
    cls = app_cls("nmf")
    out = {}
    for kind, args in kinds.items():
        opts = parse_app_args(cls, args)
        app = cls(opts)
        blocks = sorted(app.read_input(InputPart(0, 1, opts.blocks)), key=lambda b: b.id)
        spec = app.model_spec()
        model = np.asarray(app.init_rows(np.arange(spec.num_keys, dtype=np.int64)),
                           dtype=spec.dtype)
        groups = block_groups(blocks, opts.iters_per_epoch)
        comp, nbytes, iters = [], [], 0
        for epoch in range(opts.max_epochs):
            for it, group in enumerate(groups):
                keys = app.keys(group)
                rows = model[keys]
                rows.flags.writeable = False
                t = time.perf_counter()
                deltas = app.compute(group, keys, rows, Step(epoch, it, opts.iters_per_epoch))
                comp.append(time.perf_counter() - t)
                deltas = app.combine_deltas(keys, deltas, 1)
                model[keys] = app.update(model[keys], np.asarray(deltas, dtype=spec.dtype))
                row = spec.dim * np.dtype(spec.dtype).itemsize
                nbytes.append(2.0 * len(keys) * row)     # PULL + PUSH
                iters += 1
        input_bytes = os.path.getsize(args[1])
        out[kind] = {"t_cpu_median": float(np.median(comp)), "t_cpu_min": float(min(comp)),
                     "bytes_per_iter": float(np.mean(nbytes)), "iters_per_epoch": 2,
                     "model_bytes": float(spec.num_keys * spec.dim
                                          * np.dtype(spec.dtype).itemsize),
                     "input_bytes": input_bytes}
        print(f"e2e {kind}-heavy: COMP {np.median(comp):.3f}s (min {min(comp):.3f}s) per "
              f"iteration, {np.mean(nbytes) / 1e6:.2f} MB pulled+pushed per iteration, model "
              f"{out[kind]['model_bytes'] / 1e6:.2f} MB, input {input_bytes / 1e6:.1f} MB",
              flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=100)
    ap.add_argument("--out", default=str(ROOT / "bench" / "out" / "sim_profiles.json"))
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="harmony-simprof-") as tmp:
        res = {"curves": curves(tmp, a.epochs), "e2e": e2e_profiles(tmp)}
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as fh:
        json.dump(res, fh, indent=1)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
