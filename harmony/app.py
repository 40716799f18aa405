"""The app API: what an app file defines, and how the runtime drives it.

An app file (``apps/nmf.py``) defines one subclass of :class:`App`. App code
never touches ZeroMQ, LMDB, processes or threads: the runtime calls these
methods on every machine of the job and moves the data between them.

One *epoch* is ``iters_per_epoch`` synchronous *iterations*. In iteration
``i`` every machine takes its i-th group of local input blocks and runs

    keys = app.keys(blocks)                 # which model rows it needs
    rows = PULL(keys)                        # network
    deltas = app.compute(blocks, keys, rows, step)   # CPU
    deltas = app.combine_deltas(keys, deltas, machines)   # the reducer's worker half
    PUSH(keys, deltas)                       # network; servers apply app.update

and no machine pulls for iteration i+1 before every push of iteration i was
applied. At each epoch end every machine evaluates ``app.objective`` on its
data (and ``app.model_objective`` on its server shard); the runtime sums the
partial dictionaries over machines and ``app.metrics`` turns the sums into
reported numbers, one of which is ``objective``.

How the deltas of several machines combine (``App.combine``): the servers
always apply every machine's push with ``update`` (commutative and
associative, default: add), so the reducer is chosen by what each machine
pushes. ``"sum"`` pushes the deltas as computed: right when a machine's
delta is its share of a global quantity (counts; a gradient already divided
by the *global* sample count; per-sample steps over disjoint samples).
``"mean"`` divides them by the number of machines first: right when each
machine's delta is a whole update computed from its own share of the data
(a step on its local mean gradient). An app with mixed needs overrides
``combine_deltas``. With one machine every reducer is the identity, so a
1-machine job matches :func:`run_local` bit for bit.

Divergence: at every epoch end the runtime checks the objective. A
non-finite value, or one that stayed well above the best value the job has
reached for ``--diverge-epochs`` epochs in a row, fails the job. "Well
above" is by more than ``DIVERGE_RTOL`` of the best, or more than
``DIVERGE_PROGRESS`` (0.1%) of what the job gained from its first epoch to its best,
whichever is larger, so that SGD noise around a minimum (an NMF job long
past convergence rises 0.6% over 3 epochs) is never taken for divergence,
and an objective that climbs away from its best is. That (``App.on_divergence = "fail"``, which the bundled apps but LDA choose)
or logs a warning (``"warn"``, the default), with a message naming the app's
step-size option (``App.step_option``). A non-finite objective always fails.
"""
from __future__ import annotations

import argparse
import hashlib
import logging
import math
import time
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np
import psutil

from harmony.formats.pieces import PieceBuffer
from harmony.ps.keymap import block_of
from harmony.store.blocks import Block


class AppError(Exception):
    """A bad app file, bad app options, or an app-level failure."""


class InputError(AppError):
    """Bad input data; names the file and line."""

    def __init__(self, path: str, line: int | None, reason: str) -> None:
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {reason}")
        self.path, self.line, self.reason = path, line, reason

    def __reduce__(self):
        # pickled by its fields (a multiprocessing pool, a process pool's
        # result): the default rebuilds it from the message alone, which
        # this __init__ cannot take, and the pool's result thread dies
        return type(self), (self.path, self.line, self.reason)


@dataclass(frozen=True)
class Option:
    """One app option, exposed as ``--name`` on ``harmony submit``."""
    name: str
    type: Callable[[str], Any] = str
    default: Any = None
    help: str = ""
    required: bool = False
    choices: tuple | None = None


@dataclass(frozen=True)
class ModelSpec:
    """The server-side model: ``num_keys`` rows of ``dim`` values."""
    num_keys: int
    dim: int
    dtype: str = "float32"


#: the share of a machine's memory budget that a model may take
MODEL_SHARE = 0.5


@dataclass(frozen=True)
class InputPart:
    """Which input blocks this machine owns: block ``b`` goes to machine
    ``b % count``, unless ``owned`` names them (a machine that joins a
    running job reads the input's metadata but owns no block: its blocks
    arrive from the other machines). ``block_of`` maps record keys (e.g.
    user ids) to blocks."""
    index: int
    count: int
    num_blocks: int
    owned: frozenset | None = None
    #: memory for the pieces a reader collects before it can assemble
    #: blocks (None: unbounded), and where the rest may go (this machine's
    #: disk): see :meth:`pieces`
    memory_limit: int | None = None
    scratch_dir: str | None = None
    #: this machine's memory budget (``harmony-worker --memory``; None: the
    #: host's physical memory): a model planned from the input beyond
    #: MODEL_SHARE of it is refused before it is allocated
    #: (:func:`harmony.formats.libsvm.check_model_bytes`)
    machine_memory: int | None = None

    def memory_budget(self) -> int:
        """This machine's memory budget in bytes."""
        if self.machine_memory is not None:
            return int(self.machine_memory)
        return int(psutil.virtual_memory().total)

    def model_budget(self) -> int:
        """The most bytes a model planned from the input may take here (its
        rows and keys): MODEL_SHARE of the memory budget, the rest being for
        the input, the app's temporaries and the machine's other jobs."""
        return int(self.memory_budget() * MODEL_SHARE)

    def chunk_bytes(self, default: int) -> int:
        """Bytes of input a reader parses at a time: ``default``, or less
        under a memory limit (a vectorized parse of a chunk takes up to ~20x
        its text in temporaries: 8 MiB of LIBSVM text peaked at 150 MiB)."""
        if self.memory_limit is None:
            return default
        return max(64 << 10, min(default, self.memory_limit // 32))

    def pieces(self) -> PieceBuffer:
        """A buffer for a reader's per-block pieces within this part's
        memory limit (harmony.formats.pieces); close it when done."""
        return PieceBuffer(self.memory_limit, self.scratch_dir)

    def block_of(self, ids: np.ndarray) -> np.ndarray:
        return block_of(ids, self.num_blocks)

    def owns(self, block_ids: np.ndarray) -> np.ndarray:
        if self.owned is not None:
            return np.isin(np.asarray(block_ids), np.fromiter(self.owned, np.int64,
                                                              len(self.owned)))
        return (np.asarray(block_ids) % self.count) == self.index

    def my_blocks(self) -> list[int]:
        if self.owned is not None:
            return sorted(int(b) for b in self.owned)
        return [b for b in range(self.num_blocks) if b % self.count == self.index]


@dataclass(frozen=True)
class Step:
    epoch: int
    iter: int
    iters_per_epoch: int
    machines: int = 1     # the job's machines holding input now (workers; it changes
    #                       when a job is resized or its roles change)


MAX_BLOCKS = 65536
COMBINES = ("sum", "mean")
#: an objective within this fraction of its best so far is noise around a
#: minimum, not divergence ...
DIVERGE_RTOL = 0.05
#: ... nor one within this fraction of the progress made from the first
#: epoch's objective to the best (where the best is near zero)
DIVERGE_PROGRESS = 1e-3

log = logging.getLogger("harmony.app")

# Options every app gets from the runtime.
COMMON_OPTIONS = [
    Option("max_epochs", int, 10, "stop after this many epochs"),
    Option("target_objective", float, None, "stop once the objective is <= this"),
    Option("iters_per_epoch", int, 1, "synchronous iterations (PULL-COMP-PUSH) per epoch"),
    Option("blocks", int, 16, "input blocks (split over machines by block id)"),
    Option("model_blocks", int, 256, "model blocks (hashed key ranges) over server shards"),
    Option("seed", int, 0, "random seed (model init, data order)"),
    Option("spill", bool, True, "let the runtime keep input blocks on disk when memory is "
           "short (--no-spill: fail instead, naming the memory budget)"),
    Option("disk_ratio", str, "auto", "fraction of this job's input blocks kept on disk and "
           "reloaded in the background: 'auto' (hill-climbed against the memory budget) "
           "or a fixed value in [0, 1]"),
    Option("diverge_epochs", int, 3, "stop the job as diverged when the objective stayed well "
           "above its best (by 5 percent, or 0.1 percent of the progress made, the larger) this "
           "many epochs in a row (0: never; a non-finite objective always stops it)"),
]


class App:
    """Base class of an app. Override the methods marked *required*."""

    name: str = "app"
    options: list[Option] = []
    #: ``keys(blocks)`` depends only on which blocks it gets (not on changes
    #: the app makes to them or to itself): the runtime may then compute it
    #: once per block group and reuse it, which saves a reload pass over
    #: disk-blocks per iteration. Leave False if unsure.
    static_keys: bool = False
    #: how the deltas of several machines combine: "sum" or "mean" (see the
    #: module docstring); override ``combine_deltas`` for another reducer
    combine: str = "sum"
    #: the option that sets the step size, named when the objective diverges
    step_option: str | None = None
    #: on a rising objective: "fail" the job, or "warn" (log once) and go on.
    #: "warn" by default: not every app's objective is a loss that must fall
    on_divergence: str = "warn"
    #: a push whose deltas hold NaN or an infinity is refused by the server
    #: shard and fails the job with a clear error (the model is never
    #: changed by it). Float models only; False applies such pushes as they come.
    finite_updates: bool = True
    #: the input arrays that ``compute`` or ``objective`` change, by name
    #: (NMF's ``("L", "gL")``; ``()``: none). Declaring them lets the block
    #: store hand every other array of a spilled block over without copying:
    #: read-only views of the stored bytes (changing one raises numpy's
    #: "assignment destination is read-only"). None, the default, declares
    #: nothing: each array of a spilled block is then copied on load and
    #: checked for changes when the block is dropped.
    mutable_input: tuple[str, ...] | None = None

    def __init__(self, opts: argparse.Namespace) -> None:
        self.opts = opts
        # the runtime's divergence check (should_stop) reads the app's choices here
        opts.__dict__["_divergence"] = DivergenceWatch(type(self).step_option,
                                                       type(self).on_divergence, opts)

    # -- input --------------------------------------------------------------
    def read_input(self, part: InputPart) -> Iterable[Block]:  # required
        raise NotImplementedError

    # -- model (server side) -------------------------------------------------
    def model_spec(self) -> ModelSpec:  # required; called after read_input
        raise NotImplementedError

    def init_rows(self, keys: np.ndarray) -> np.ndarray:
        """Initial rows for ``keys``; must depend only on the keys (use
        :func:`harmony.ps.keymap.keyed_uniform`). Default: zeros."""
        spec = self.model_spec()
        return np.zeros((len(keys), spec.dim), dtype=spec.dtype)

    def update(self, rows: np.ndarray, deltas: np.ndarray) -> np.ndarray:
        """Server update, applied per key; must be commutative and
        associative in the deltas. Default: add."""
        return rows + deltas

    def combine_deltas(self, keys: np.ndarray, deltas: np.ndarray,
                       machines: int) -> np.ndarray:
        """The worker's half of the reducer: what this machine pushes, given
        that ``machines`` machines push for the same iteration. Default: per
        ``combine``, the deltas as they are ("sum") or divided by
        ``machines`` ("mean"). Called once right after each ``compute``."""
        return scale_deltas(deltas, self.combine, machines)

    # -- iteration (worker side) --------------------------------------------
    def keys(self, blocks: list[Block]) -> np.ndarray:  # required
        """Sorted unique int64 keys the blocks need."""
        raise NotImplementedError

    def compute(self, blocks: list[Block], keys: np.ndarray, rows: np.ndarray,
                step: Step) -> np.ndarray:  # required
        """Return deltas (same shape as rows) to push. ``rows`` is read-only."""
        raise NotImplementedError

    # -- objective ------------------------------------------------------------
    def objective(self, blocks: list[Block], keys: np.ndarray,
                  rows: np.ndarray) -> dict[str, float]:  # required
        """Partial sums over this machine's data; summed over machines."""
        raise NotImplementedError

    def model_objective(self, keys: np.ndarray, rows: np.ndarray) -> dict[str, float]:
        """Partial sums over one server shard's rows (e.g. a regularizer)."""
        return {}

    def metrics(self, sums: dict[str, float]) -> dict[str, float]:
        """Turn summed partials into metrics; must contain ``objective``."""
        return {"objective": float(sums.get("objective", math.nan))}

    # -- export (``harmony model get``; see harmony/export.py) ----------------------
    #: the arrays of an input block that ``export_inputs`` reads: a job's final
    #: checkpoint keeps only these of its input blocks (None: whole blocks).
    #: Only used by an app that overrides ``export_inputs``.
    export_input_arrays: tuple[str, ...] | None = None

    def export_meta(self) -> dict:
        """Facts the export needs that only the input knows (MLR's class
        labels, Lasso's index base, LDA's vocabulary): a small dict of
        msgpack-able values (str, numbers, lists). Called on every executor
        (after ``read_input``) at every checkpoint and stored with its part;
        ``export`` gets the parts' dicts merged (part 0 first). Default:
        nothing."""
        return {}

    def export(self, keys: np.ndarray, rows: np.ndarray, meta: dict) -> dict[str, np.ndarray]:
        """The model as named arrays (``harmony model get`` writes them as
        NPZ). Runs on the client, on an app built from the job's options
        only (``read_input`` was not called: what the input alone knows
        comes in ``meta``, see ``export_meta``). ``keys`` is every model key
        in order (``0 .. num_keys - 1``) and ``rows`` their rows, exactly
        the model :func:`run_local` returns. Default: both, as they are."""
        return {"keys": keys, "rows": rows}

    def export_inputs(self, blocks: list[Block], meta: dict) -> dict[str, np.ndarray]:
        """Optional: state the app keeps in its input blocks (NMF's user
        factors), as named arrays merged into the export. ``blocks`` are
        every input block of the checkpoint, in id order (a final
        checkpoint keeps only ``export_input_arrays`` of them). Not called
        unless overridden."""
        return {}

    def export_text(self, arrays: dict[str, np.ndarray]) -> str:
        """Optional: a text form of the export (``harmony model get --out
        FILE.txt``). Not defined by default."""
        raise AppError(f"app {self.name} has no text form of its model (write .npz)")


# ---------------------------------------------------------------------------
# Loading app files and parsing their options


def load_app(source: str, filename: str = "<app>") -> type[App]:
    """Execute an app file's source and return its single App subclass."""
    try:
        code = compile(source, filename, "exec")
    except SyntaxError as exc:
        raise AppError(f"{filename}:{exc.lineno}: syntax error: {exc.msg}") from None
    mod = types.ModuleType("harmony_app_" + hashlib.sha1(source.encode()).hexdigest()[:10])
    mod.__file__ = filename
    try:
        exec(code, mod.__dict__)
    except Exception as exc:
        raise AppError(f"{filename}: failed to load: {exc.__class__.__name__}: {exc}") from None
    found = [v for v in mod.__dict__.values()
             if isinstance(v, type) and issubclass(v, App) and v is not App
             and v.__module__ == mod.__name__]
    if len(found) != 1:
        raise AppError(f"{filename}: must define exactly one subclass of harmony.app.App "
                       f"(found {len(found)})")
    cls = found[0]
    for meth in ("read_input", "model_spec", "keys", "compute", "objective"):
        if getattr(cls, meth) is getattr(App, meth):
            raise AppError(f"{filename}: app {cls.__name__} does not define {meth}()")
    if cls.combine not in COMBINES and cls.combine_deltas is App.combine_deltas:
        raise AppError(f"{filename}: app {cls.__name__}: combine must be one of {COMBINES} "
                       f"(or define combine_deltas), not {cls.combine!r}")
    if cls.on_divergence not in ("fail", "warn"):
        raise AppError(f"{filename}: app {cls.__name__}: on_divergence must be 'fail' or "
                       f"'warn', not {cls.on_divergence!r}")
    return cls


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # raise instead of sys.exit
        raise AppError(f"bad app options: {message}")


def option_parser(cls: type[App]) -> argparse.ArgumentParser:
    p = _Parser(prog=f"harmony submit {cls.name}", add_help=False,
                formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                description=(cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else None)
    names = set()
    for opt in list(cls.options) + COMMON_OPTIONS:
        if opt.name in names:
            continue  # an app may override a common option's default
        names.add(opt.name)
        flag = "--" + opt.name.replace("_", "-")
        kw: dict[str, Any] = {"dest": opt.name, "help": opt.help}
        if opt.type is bool:
            kw["action"] = argparse.BooleanOptionalAction
            kw["default"] = bool(opt.default)
        else:
            kw["type"] = opt.type
            kw["default"] = opt.default
            kw["required"] = opt.required
            if opt.choices:
                kw["choices"] = opt.choices
        p.add_argument(flag, **kw)
    return p


def parse_app_args(cls: type[App], args: list[str]) -> argparse.Namespace:
    ns = option_parser(cls).parse_args(args)
    for name in ("max_epochs", "iters_per_epoch", "blocks", "model_blocks"):
        if getattr(ns, name) < 1:
            raise AppError(f"bad app options: --{name.replace('_', '-')} must be >= 1")
    if ns.diverge_epochs < 0:
        raise AppError("bad app options: --diverge-epochs must be >= 0")
    for name in ("blocks", "model_blocks"):
        if getattr(ns, name) > MAX_BLOCKS:
            raise AppError(f"bad app options: --{name.replace('_', '-')} must be <= {MAX_BLOCKS}")
    disk_ratio(ns)
    return ns


def mutable_input(cls: type) -> tuple[str, ...] | None:
    """An app class's ``mutable_input`` checked: None, or a tuple of names."""
    v = getattr(cls, "mutable_input", None)
    if v is None:
        return None
    if isinstance(v, str) or not all(isinstance(n, str) for n in v):
        raise AppError(f"app {getattr(cls, 'name', cls.__name__)!r}: mutable_input must be "
                       f"a tuple of input array names (or None), not {v!r}")
    return tuple(v)


def disk_ratio(opts: argparse.Namespace) -> float | None:
    """The job's fixed disk ratio α, or None for 'auto' (hill-climbed)."""
    text = str(getattr(opts, "disk_ratio", "auto") or "auto").strip().lower()
    if text == "auto":
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.0 <= value <= 1.0:
        raise AppError(f"bad app options: --disk-ratio must be 'auto' or in [0, 1], got {text!r}")
    return value


def block_groups(blocks: list[Block], iters: int) -> list[list[Block]]:
    """Split this machine's blocks (sorted by id) into ``iters`` groups."""
    n = len(blocks)
    return [blocks[i * n // iters:(i + 1) * n // iters] for i in range(iters)]


def scale_deltas(deltas: np.ndarray, combine: str, machines: int) -> np.ndarray:
    """``deltas`` for a "sum" reducer, ``deltas / machines`` for "mean"."""
    if combine not in COMBINES:
        raise AppError(f"app combine must be one of {COMBINES} (or override combine_deltas), "
                       f"not {combine!r}")
    if combine == "sum" or machines == 1:
        return deltas
    d = np.asarray(deltas)
    return d * d.dtype.type(1.0 / machines) if d.dtype.kind == "f" else d / machines


class DivergenceWatch:
    """The objective's recent history (one per app instance, i.e. per
    executor): ``check`` raises or warns when it diverges."""

    def __init__(self, step_option: str | None, action: str,
                 opts: argparse.Namespace | None = None) -> None:
        if action not in ("fail", "warn"):
            raise AppError(f"app on_divergence must be 'fail' or 'warn', not {action!r}")
        self.step_option, self.action, self.opts = step_option, action, opts
        self.first: float | None = None      # the first epoch's objective
        self.best: float | None = None       # the lowest so far
        self.above = 0                       # epochs in a row well above the best
        self.warned = False

    def _advice(self) -> str:
        o = self.step_option
        if not o:
            return "lower the step size"
        now = getattr(self.opts, o, None) if self.opts is not None else None
        flag = "--" + o.replace("_", "-")
        return f"lower {flag}" + (f" (now {now})" if now is not None else "")

    def check(self, epoch: int, obj: float | None, k: int) -> None:
        if obj is None:
            return
        why = None
        if not math.isfinite(obj):
            why = f"objective diverged at epoch {epoch} ({obj})"
        else:
            if self.first is None:
                self.first = self.best = obj
            self.best = min(self.best, obj)
            tol = max(DIVERGE_RTOL * abs(self.best),
                      DIVERGE_PROGRESS * (self.first - self.best))
            self.above = self.above + 1 if obj > self.best + tol else 0
            if k > 0 and self.above >= k:
                why = (f"objective diverged: it stayed over {self.best + tol:.6g} (its best "
                       f"{self.best:.6g} + {tol:.3g}) {self.above} epochs in a row, "
                       f"{obj:.6g} at epoch {epoch}")
        if why is None:
            return
        msg = f"{why}; {self._advice()}"
        if self.action == "fail" or not math.isfinite(obj):
            raise AppError(msg)
        if not self.warned:
            self.warned = True
            log.warning("%s", msg)


def should_stop(opts: argparse.Namespace, epoch: int, metrics: dict[str, float]) -> bool:
    """The runtime's decision at an epoch end (every machine makes the same
    one): stop at the target objective or after ``max_epochs``; raise
    :class:`AppError` (failing the job) when the objective diverges."""
    obj = metrics.get("objective")
    if opts.target_objective is not None and obj is not None and obj <= opts.target_objective:
        return True
    watch = opts.__dict__.get("_divergence")
    if watch is None:          # opts not given to an App: the check without step advice
        watch = opts.__dict__["_divergence"] = DivergenceWatch(None, "fail", opts)
    watch.check(epoch, obj, getattr(opts, "diverge_epochs", 3))
    return epoch + 1 >= opts.max_epochs


@dataclass
class LocalResult:
    history: list[dict[str, float]] = field(default_factory=list)
    epoch_times: list[float] = field(default_factory=list)   # seconds, wall
    epoch_cpu: list[float] = field(default_factory=list)     # seconds, this process's CPU
    model: np.ndarray | None = None


def run_local(cls: type[App], args: list[str], machines: int = 1) -> LocalResult:
    """The plain single-process reference: the same app code and the same
    iteration order, with the model in one array and no runtime at all.

    ``machines = k > 1`` emulates a job on ``k`` machines in this process,
    with the runtime's math (not its timing): ``k`` app instances, instance
    ``j`` reading ``InputPart(j, k, blocks)``; in every iteration each
    computes on its own block group from the model as it was before the
    iteration (strict BSP), its deltas go through ``combine_deltas(keys,
    deltas, k)``, and then every push is applied with ``update``. The
    objective is the sum of the instances' partials plus ``model_objective``
    of the whole model. It answers "does the app's math depend on the DoP"
    in seconds, without a cluster."""
    if machines < 1:
        raise AppError("machines must be >= 1")
    opts = parse_app_args(cls, args)
    apps = [cls(opts if j == 0 else parse_app_args(cls, args)) for j in range(machines)]
    parts = [sorted(a.read_input(InputPart(j, machines, opts.blocks)), key=lambda b: b.id)
             for j, a in enumerate(apps)]
    declared = mutable_input(cls)
    if declared is not None:   # held to its declaration, as spilled blocks are
        for blocks in parts:
            for blk in blocks:
                for name, arr in blk.arrays.items():
                    if name not in declared:
                        arr.flags.writeable = False
    app = apps[0]
    spec = app.model_spec()
    all_keys = np.arange(spec.num_keys, dtype=np.int64)
    model = np.asarray(app.init_rows(all_keys), dtype=spec.dtype)
    groups = [block_groups(blocks, opts.iters_per_epoch) for blocks in parts]
    res = LocalResult()
    for epoch in range(opts.max_epochs):
        t0, c0 = time.perf_counter(), time.process_time()
        for it in range(opts.iters_per_epoch):
            pushes = []
            for a, g in zip(apps, groups):
                keys = a.keys(g[it])
                rows = model[keys]
                rows.flags.writeable = False
                deltas = a.compute(g[it], keys, rows,
                                   Step(epoch, it, opts.iters_per_epoch, machines))
                pushes.append((keys, a.combine_deltas(keys, deltas, machines)))
            for keys, deltas in pushes:
                model[keys] = app.update(model[keys], np.asarray(deltas, dtype=spec.dtype))
        sums: dict[str, float] = {}
        for a, blocks in zip(apps, parts):
            keys = a.keys(blocks)
            for k, v in a.objective(blocks, keys, model[keys]).items():
                sums[k] = sums.get(k, 0.0) + v
        for k, v in app.model_objective(all_keys, model).items():
            sums[k] = sums.get(k, 0.0) + v
        metrics = app.metrics(sums)
        res.history.append(metrics)
        res.epoch_times.append(time.perf_counter() - t0)
        res.epoch_cpu.append(time.process_time() - c0)
        if should_stop(opts, epoch, metrics):
            break
    res.model = model
    return res
