"""The runtime's overhead (issue #36) of several versions of the runtime, side
by side in one run: each version's 1-machine job against the plain loop
(``harmony.app.run_local``: same app code and data, no processes or sockets)
of the same round.

Each ``--variant NAME=REV`` runs the master, the worker daemon and the
executor from git revision ``REV`` of this repository (exported once into
``--cache``; ``NAME=.`` is this working tree): its cluster's processes get
that tree first on ``PYTHONPATH``. The reference loop, the app file and the
data are this tree's in every round. A round runs the reference, then one
job per variant (in an order rotated from round to round, so that none
always runs first); the epoch times are those of ``bench/nmf_epoch.py`` and
``bench/apps_epoch_mlr_lasso.py``: the job's wall time between consecutive
epoch reports at the master and its executor's CPU time in the epoch
(``train_cpu + eval_cpu``), against the reference's epoch loop body (wall
and CPU), medians over the epochs after the first. Printed: every round's
medians and ratios, and per variant the ratio of the best medians (as the
other benches) and the median of the rounds' ratios (each against its own
round's reference: steadier on a shared machine). With ``--stat min`` the
fastest epoch stands for each run instead of the median (on a loaded
machine other processes only ever add time to an epoch, so the fastest
epochs are the least disturbed ones). BLAS is pinned to one thread in the
reference (the apps' kernels are single-threaded), and the reference runs
at the executors' nice value (the daemon adds ``EXECUTOR_NICE``, 5, to its
own): on a machine shared with other work, a reference at a higher
priority than the executor would favour the reference's wall time.

    python bench/overhead_ab.py --app nmf-als|nmf-sgd|lasso-tall|lasso-wide
        --variant base=d6d1895 --variant new=. [--rounds 4] [--epochs N]
        [--app-args '...'] [--stat median|min]
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import argparse  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from contextlib import ExitStack  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harmony.app import load_app, run_local  # noqa: E402
from harmony.client import Client  # noqa: E402
from harmony.cluster import LocalCluster  # noqa: E402
from harmony.datagen import gen_nmf  # noqa: E402
from harmony.datagen.lasso import gen_lasso  # noqa: E402
from harmony.worker.daemon import EXECUTOR_NICE  # noqa: E402

med = statistics.median


def tree_of(rev: str, cache: str) -> str | None:
    """The source tree of ``rev`` (None: this working tree), exported once
    under ``cache`` with its kernels compiled."""
    if rev == ".":
        return None
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", rev], check=True,
                         capture_output=True, text=True).stdout.strip()
    out = os.path.join(cache, sha[:12])
    if not os.path.exists(os.path.join(out, ".done")):
        os.makedirs(out, exist_ok=True)
        arch = subprocess.run(["git", "-C", str(ROOT), "archive", sha], check=True,
                              capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", out], input=arch, check=True)
        env = dict(os.environ, PYTHONPATH=out)
        subprocess.run([sys.executable, "-m", "harmony.kernels.warm", os.path.join(out, "apps")],
                       check=True, env=env, cwd=out, capture_output=True)
        Path(out, ".done").touch()
    return out


def data_and_args(app: str, tmp: str, epochs: int | None) -> tuple[str, list[str]]:
    """The app file and its options, on the data of the existing benches."""
    data = os.path.join(tmp, "data")
    if app.startswith("nmf-"):       # bench/nmf_epoch.py's data; ALS at rank 16
        gen_nmf(data, 40000, 4000, 8, 50, 0.1, seed=0)
        solver = app[4:]
        return "nmf", ["--input", data, "--rank", "16" if solver == "als" else "32",
                       "--max-epochs", str(epochs or 6), "--iters-per-epoch", "4",
                       "--solver", solver]
    n, f = {"lasso-tall": (100_000, 5_000), "lasso-wide": (50_000, 20_000)}[app]
    gen_lasso(data, samples=n, features=f, nonzeros=200, noise=0.5, nnz=100, seed=0)
    return "lasso", ["--input", data, "--lam", "0.01", "--max-epochs", str(epochs or 8)]


def reference(cls, args: list[str]):
    """``run_local`` in a thread at the executors' nice value."""
    nice = min(19, os.getpriority(os.PRIO_PROCESS, 0) + EXECUTOR_NICE)
    box: dict = {}

    def body() -> None:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
        try:
            box["res"] = run_local(cls, args)
        except BaseException as exc:       # re-raised in the caller
            box["err"] = exc
    t = threading.Thread(target=body)
    t.start()
    t.join()
    if "err" in box:
        raise box["err"]
    return box["res"]


def job_stats(c: Client, name: str, src: str, args: list[str], stat) -> tuple[float, float]:
    job = c.submit(f"{name}.py", src, args, machines=1)
    while (st := c.status(job))["state"] not in ("finished", "failed"):
        time.sleep(0.2)
    if st["state"] != "finished":
        raise SystemExit(f"job failed: {st['error']}")
    times = [e["time"] for e in st["epochs"]]
    wall = stat([b - a for a, b in zip(times, times[1:])])
    cpu = stat([e["timings"]["train_cpu"] + e["timings"]["eval_cpu"] for e in st["epochs"][1:]])
    return wall, cpu


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--app", required=True, choices=("nmf-als", "nmf-sgd", "lasso-tall",
                                                      "lasso-wide"))
    ap.add_argument("--variant", action="append", required=True,
                    help="NAME=REV (a git revision, or '.' for this working tree)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=None)
    ap.add_argument("--app-args", default="", help="more app options, e.g. '--solver fista'")
    ap.add_argument("--stat", choices=("median", "min"), default="median",
                    help="what stands for a run's epochs: their median, or the fastest")
    ap.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "harmony-ab"))
    a = ap.parse_args()
    stat = med if a.stat == "median" else min
    variants = []
    for v in a.variant:
        name, _, rev = v.partition("=")
        variants.append((name, tree_of(rev or ".", a.cache)))
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        # the clusters' processes start here: a "python -m" finds its modules
        # in its working directory first, before PYTHONPATH
        os.chdir(tmp)
        name, args = data_and_args(a.app, tmp, a.epochs)
        args += a.app_args.split()
        src = (ROOT / "apps" / f"{name}.py").read_text()
        cls = load_app(src, f"{name}.py")
        clients = {}
        for vname, tree in variants:
            old = os.environ.get("PYTHONPATH")
            if tree is not None:
                os.environ["PYTHONPATH"] = tree
            try:
                cl = stack.enter_context(LocalCluster(1, os.path.join(tmp, f"c-{vname}"), port=0))
            finally:
                if old is None:
                    os.environ.pop("PYTHONPATH", None)
                else:
                    os.environ["PYTHONPATH"] = old
            clients[vname] = stack.enter_context(Client(cl.endpoint, keys=cl.keys))
        refs: list[tuple[float, float]] = []
        runs: dict[str, list[tuple[float, float]]] = {v: [] for v, _ in variants}
        print(f"{a.app} {' '.join(args[2:])}: {a.rounds} rounds, {a.stat} epoch; variants "
              + ", ".join(f"{v}={t or 'this tree'}" for v, t in variants), flush=True)
        for r in range(a.rounds):
            ref = reference(cls, args)
            refs.append((stat(ref.epoch_times[1:]), stat(ref.epoch_cpu[1:])))
            order = variants[r % len(variants):] + variants[:r % len(variants)]
            for vname, _ in order:
                runs[vname].append(job_stats(clients[vname], name, src, args, stat))
            rw, rc = refs[-1]
            print(f"round {r} (load {os.getloadavg()[0]:.2f}): reference {rw * 1e3:.2f} ms wall, "
                  f"{rc * 1e3:.2f} ms CPU; " + "; ".join(
                      f"{v} {runs[v][-1][0] * 1e3:.2f} / {runs[v][-1][1] * 1e3:.2f} "
                      f"(x{runs[v][-1][0] / rw:.3f} / x{runs[v][-1][1] / rc:.3f})"
                      for v, _ in variants), flush=True)
        bw, bc = min(x[0] for x in refs), min(x[1] for x in refs)
        print(f"reference best: {bw * 1e3:.2f} ms wall, {bc * 1e3:.2f} ms CPU per epoch")
        for v, _ in variants:
            w, c = min(x[0] for x in runs[v]), min(x[1] for x in runs[v])
            mw = med(x[0] / y[0] for x, y in zip(runs[v], refs))
            mc = med(x[1] / y[1] for x, y in zip(runs[v], refs))
            print(f"  {v:>8}: best {w * 1e3:.2f} ms wall, {c * 1e3:.2f} ms CPU: ratio of bests "
                  f"wall {w / bw:.3f}, CPU {c / bc:.3f}; median of round ratios wall {mw:.3f}, "
                  f"CPU {mc:.3f}  (issue #36: <= 1.05)")


if __name__ == "__main__":
    main()
