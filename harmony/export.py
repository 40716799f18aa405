"""Model export (``harmony model get``): a job's model as named arrays.

The model is read from the job's checkpoint, shared-nothing, over ZeroMQ:

1. the master answers ``model_parts`` with the checkpoint to read (a
   finished job's final checkpoint, written at its stop epoch and kept; a
   running or paused job's latest complete one, or with ``fresh`` a new one
   the job writes at its next epoch end), each part with the data services
   of the live machines holding it, and the job's app source and options;
2. every part's model blocks (keys and rows, grouped by model block), the
   app's export meta and, if asked, its input blocks are fetched from a
   holder with :func:`harmony.worker.jobckpt.fetch_part` (each block checked
   against the part's SHA-256 manifest; a holder that is gone or holds a
   damaged copy is skipped for the next one);
3. the rows are assembled into the whole model (keys ``0 .. num_keys - 1``,
   as :func:`harmony.app.run_local` returns it) and handed to the app's
   :meth:`~harmony.app.App.export` (and ``export_inputs``), on an app built
   from the job's options with :func:`harmony.app.load_app`; the arrays are
   written as NPZ (or the app's text form).

Whose code runs: the export runs the app's code in the caller's process,
and the app came from whoever submitted the job. So it runs only when the
caller vouches for it (:func:`vouch`): the job's source is byte for byte a
bundled app of this installation (``apps/``), or the caller's own copy given
with ``--app FILE`` (compared with the job's), or ``--trust-app`` says to run
the job's own code. Otherwise the export is refused, naming those options.

The app's export meta (``App.export_meta``: what only the input knows, e.g.
MLR's class labels) travels in each part as one extra model-section block
with id ``model_blocks``, outside the model's block range.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import msgpack
import numpy as np
import zmq

from harmony.app import App, AppError, load_app, parse_app_args
from harmony.comm import messages as M
from harmony.store.blocks import Block
from harmony.store.checkpoint import CheckpointError
from harmony.store.transfer import TransferError
from harmony.worker.jobckpt import fetch_part

ACTIVE = ("running", "profiling")
#: the bundled apps of a source checkout (an app whose source is one of these
#: byte for byte is this installation's own code)
BUNDLED = Path(__file__).resolve().parent.parent / "apps"
RESERVED = {"harmony_info", "file", "allow_pickle"}     # not array names in an NPZ (np.savez)


class ExportError(RuntimeError):
    """The model cannot be exported (no checkpoint, no holder, a bad app hook)."""


@dataclass
class Source:
    """The master's ``model_source`` answer."""
    job: str
    state: str
    epoch: int            # the checkpoint's epoch (-1: none yet)
    parts: list
    final: bool
    pending: bool
    app_name: str
    app_source: str
    args: list
    trusted: bool = False       # the caller vouched for the app's code (vouch)

    @classmethod
    def of(cls, msg: M.Message) -> "Source":
        f = msg.fields
        return cls(f["job"], f["state"], int(f["epoch"]), list(f["parts"]), bool(f["final"]),
                   bool(f["pending"]), f["app_name"], f["app_source"], list(f["args"]))


@dataclass
class Model:
    """A job's model as fetched: every key's row, the app's export meta,
    and (if asked for) the input blocks."""
    source: Source
    keys: np.ndarray
    rows: np.ndarray
    meta: dict = field(default_factory=dict)
    inputs: list[Block] | None = None
    nbytes: int = 0


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def vouch(src: Source, app_file: str | None = None, trust: bool = False) -> Source:
    """``src`` marked trusted if its app code may run in this process: it is
    a bundled app byte for byte, or the same as the caller's ``app_file``,
    or ``trust`` says so. Raises :class:`ExportError` saying how otherwise."""
    if app_file is not None:
        try:
            mine = Path(app_file).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise ExportError(f"--app {app_file}: {exc}") from None
        if mine != src.app_source:
            raise ExportError(
                f"--app {app_file} is not the app {src.job} ran ({src.app_name}: sha256 "
                f"{_sha(src.app_source)}, yours {_sha(mine)}); its model may not fit your "
                f"copy. Pass the file the job was submitted with, or --trust-app to run "
                f"the job's own code")
        return replace(src, trusted=True)
    bundled = BUNDLED / os.path.basename(src.app_name)
    try:
        if bundled.is_file() and bundled.read_text() == src.app_source:
            return replace(src, trusted=True)
    except (OSError, UnicodeDecodeError):
        pass
    if trust:
        return replace(src, trusted=True)
    raise ExportError(
        f"{src.job}'s app {src.app_name} is not a bundled app of this installation, and "
        f"exporting runs its code in this process (whoever submitted the job wrote it). "
        f"Pass --app FILE with your copy of it (it must match the job's source), or "
        f"--trust-app to run the job's own code")


def app_of(src: Source) -> tuple[type[App], App]:
    """The job's app class and an instance built from its options (no input
    read); only for a source the caller vouched for (:func:`vouch`)."""
    if not src.trusted:
        raise ExportError(f"{src.job}'s app {src.app_name}: its code was not vouched for "
                          f"(harmony.export.vouch)")
    try:
        cls = load_app(src.app_source, src.app_name)
        return cls, cls(parse_app_args(cls, list(src.args)))
    except AppError as exc:
        raise ExportError(f"cannot load the app of {src.job}: {exc}") from None


def wants_inputs(cls: type[App]) -> bool:
    return cls.export_inputs is not App.export_inputs


def fetch(ctx: zmq.Context, src: Source, inputs: bool = False, auth=None) -> Model:
    """Fetch the checkpoint's model blocks (and input blocks with ``inputs``)
    from the parts' holders and assemble the whole model."""
    if src.epoch < 0 or not src.parts:
        raise ExportError(f"{src.job} has no checkpoint yet ({src.state})")
    cls, app = app_of(src)
    nblocks = int(app.opts.model_blocks)

    def want(sec: str, bid: int) -> bool:
        return (sec == "model" and 0 <= bid <= nblocks) or (inputs and sec == "input")

    keys, rows, blocks, metas, nbytes = [], [], {}, {}, 0
    for part in sorted(src.parts, key=lambda p: p["index"]):
        errors = []
        for machine, endpoint in part["sources"]:
            try:
                info, got = fetch_part(ctx, endpoint, src.job, int(part["epoch"]),
                                       int(part["index"]), want, keys=auth)
            except (CheckpointError, TransferError, M.ProtocolError, zmq.ZMQError) as exc:
                errors.append(f"{machine}: {exc}")
                continue
            break
        else:
            raise ExportError(f"part {part['index']} of {src.job}'s checkpoint after epoch "
                              f"{src.epoch + 1} could not be read from any holder: "
                              + ("; ".join(errors) or "no holder alive"))
        for (sec, bid), blk in sorted(got.items()):
            nbytes += blk.nbytes
            if sec == "input":
                blocks[bid] = blk
            elif bid == nblocks:
                metas[int(part["index"])] = msgpack.unpackb(blk["msgpack"].tobytes(), raw=False)
            else:
                keys.append(blk["keys"])
                rows.append(blk["rows"])
    if not keys:
        raise ExportError(f"{src.job}'s checkpoint after epoch {src.epoch + 1} holds no model rows")
    k = np.concatenate(keys)
    order = np.argsort(k, kind="stable")
    k, r = k[order], np.concatenate(rows)[order]
    if not np.array_equal(k, np.arange(len(k))):
        raise ExportError(f"{src.job}'s checkpoint after epoch {src.epoch + 1} does not hold "
                          f"every model key once ({len(k)} rows, keys {k[:3]}...{k[-3:]})")
    meta: dict = {}
    for i in sorted(metas):                   # part 0 first
        for name, value in (metas[i] or {}).items():
            meta.setdefault(name, value)
    return Model(src, k, r, meta, [blocks[b] for b in sorted(blocks)] if inputs else None,
                 nbytes)


def export_arrays(model: Model) -> dict[str, np.ndarray]:
    """The app's named arrays of the model (``App.export``, plus
    ``export_inputs`` when input blocks were fetched)."""
    cls, app = app_of(model.source)
    if "_error" in model.meta:
        raise ExportError(f"{model.source.job}: {model.meta['_error']}")
    try:
        out = dict(app.export(model.keys, model.rows, model.meta))
        if model.inputs is not None and wants_inputs(cls):
            out.update(app.export_inputs(model.inputs, model.meta))
    except Exception as exc:
        raise ExportError(f"app {cls.name}: export failed: {exc.__class__.__name__}: "
                          f"{exc}") from None
    arrays = {}
    for name, value in out.items():
        arr = np.asarray(value)
        if not isinstance(name, str) or not name or arr.dtype.kind not in "biufcUS":
            raise ExportError(f"app {cls.name}: export returned {name!r} as {arr.dtype} "
                              f"(need named numeric or string arrays)")
        arrays[name] = arr
    return arrays


def provenance(model: Model) -> dict:
    s = model.source
    return {"job": s.job, "app": s.app_name, "args": s.args, "state": s.state,
            "epoch": s.epoch, "epochs_done": s.epoch + 1, "final": s.final,
            "exported": time.time()}


def write(path: str, model: Model, arrays: dict[str, np.ndarray]) -> str:
    """Write the export: NPZ (the arrays plus ``harmony_info``, a JSON
    string naming the job, app, options and epoch), or with a ``.txt``
    path the app's text form (``App.export_text``). Atomic (a temporary
    file renamed). Returns the format written."""
    if os.path.isdir(path):
        raise ExportError(f"--out {path} is a directory: name the file to write")
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        fmt = _write_tmp(tmp, path, model, arrays)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):      # a failed write (a full disk, a directory) leaves none
            os.unlink(tmp)
    return fmt


def _write_tmp(tmp: str, path: str, model: Model, arrays: dict[str, np.ndarray]) -> str:
    if path.endswith(".txt"):
        _, app = app_of(model.source)
        try:
            text = app.export_text(arrays)
        except AppError as exc:
            raise ExportError(str(exc)) from None
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
        fmt = "text"
    else:
        bad = sorted(set(arrays) & RESERVED)
        if bad:
            raise ExportError(f"app export uses reserved name(s) {bad}")
        with open(tmp, "wb") as fh:     # a file object: np.savez adds no .npz suffix
            np.savez(fh, harmony_info=np.array(json.dumps(provenance(model))), **arrays)
        fmt = "npz"
    return fmt


def describe(arrays: dict[str, np.ndarray]) -> str:
    return ", ".join(f"{k} {'x'.join(map(str, a.shape)) or 'scalar'} {a.dtype}"
                     for k, a in arrays.items())
