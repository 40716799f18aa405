"""LIBSVM / svmlight sparse text format: a streaming reader and a fast writer.

One sample per line::

    label [qid:N] idx:val idx:val ...   [# comment]

``label`` is a number (a class id or a real target), ``idx`` a non-negative
integer feature index and ``val`` a number; fields are separated by
whitespace. ``qid:N`` tokens are accepted and ignored, everything after ``#``
is a comment, and blank lines are skipped. Dense data is the same format with
every index written. Indices need not be sorted; a repeated index within one
row adds up (as in a CSR matrix). Files ending in ``.gz`` are decompressed on
the fly.

**Feature index base.** LIBSVM files are usually 1-based, but many tools
(e.g. scikit-learn's ``dump_svmlight_file``) write 0-based files. The rule
here (``index_base``): ``"0"`` uses indices as written, ``"1"`` subtracts one
(index 0 is then an error), and ``"auto"`` (the default) means 0-based if
index 0 occurs anywhere in the input (all given files), else 1-based. Every
machine of a job reads every line, so all machines reach the same decision
and the same feature count ``num_features = max index - base + 1``.

**Streaming.** :func:`iter_chunks` reads the file in chunks of complete lines
(``CHUNK_BYTES``) and parses each chunk with a few vectorized passes over its
bytes and one C-level number conversion (``np.fromstring``); only if a chunk
does not have the expected token structure is it re-parsed line by line,
which finds the first offending line and raises
:class:`harmony.app.InputError` naming the file and the line.
:func:`read_libsvm_blocks` hashes rows to a job's input blocks by row number
and keeps only this machine's rows, without ever holding the whole file.
"""
from __future__ import annotations

import gzip
import math
import warnings
import zlib
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from harmony.app import InputError, InputPart, Option
from harmony.formats.pieces import PieceBuffer
from harmony.ps.keymap import mix64

# Options of every app that reads LIBSVM input (feature numbering, width)
LIBSVM_OPTIONS = [
    Option("index_base", str, "auto", "feature index base: 0, 1, or auto (0-based iff index "
           "0 occurs anywhere in the input files)", choices=("auto", "0", "1")),
    Option("num_features", int, None, "model width; unset: largest feature index + 1"),
]

CHUNK_BYTES = 8 << 20
MAX_INDEX = 2**31 - 2            # feature indices are stored as int32
TEST_ROW_OFFSET = 1 << 40        # block hashing of a separate test file's rows

_WS = np.zeros(256, dtype=bool)
_WS[[9, 10, 11, 12, 13, 32]] = True
_COLON, _HASH, _NL = 58, 35, 10


class _Malformed(Exception):
    """The fast path met something it does not handle; re-parse line by line."""


@dataclass
class Chunk:
    """Consecutive samples of one file, as CSR arrays with raw indices."""
    path: str
    first_row: int            # 0-based sample number (data lines only) of row 0
    labels: np.ndarray        # float64 (n,)
    indptr: np.ndarray        # int64 (n + 1,)
    indices: np.ndarray       # int64 (nnz,), as written in the file
    values: np.ndarray        # float64 (nnz,)
    lines: np.ndarray         # int64 (n,), 1-based line number of each row

    @property
    def num_rows(self) -> int:
        return len(self.labels)

    def error(self, row: int, reason: str) -> InputError:
        return InputError(self.path, int(self.lines[row]), reason)


# ---------------------------------------------------------------------------
# parsing


def open_binary(path: str):
    try:
        return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")
    except OSError as exc:
        raise InputError(path, None, f"cannot open input: {exc.strerror or exc}") from None


def iter_chunks(path: str, chunk_bytes: int = CHUNK_BYTES) -> Iterator[Chunk]:
    """Parse a LIBSVM file chunk by chunk (complete lines, about
    ``chunk_bytes`` each). Raises :class:`InputError` with file and line."""
    row, lineno = 0, 1
    with open_binary(path) as fh:
        while True:
            try:
                lines = fh.readlines(chunk_bytes)
            except (EOFError, OSError, zlib.error) as exc:  # BadGzipFile is an OSError
                raise InputError(path, None,
                                 f"unreadable input near line {lineno}: {exc}") from None
            if not lines:
                return
            c = parse_lines(lines, path, lineno, row)
            lineno += len(lines)
            row += c.num_rows
            yield c


def parse_lines(lines: list[bytes], path: str = "<input>", first_line: int = 1,
                first_row: int = 0) -> Chunk:
    """Parse complete lines (bytes, as ``readlines`` returns them)."""
    try:
        return _parse_fast(lines, path, first_line, first_row)
    except _Malformed:
        return _parse_slow(lines, path, first_line, first_row)


def _parse_fast(lines: list[bytes], path: str, first_line: int, first_row: int) -> Chunk:
    buf = b"".join(lines)
    if not buf.endswith(b"\n"):
        buf += b"\n"
    has_qid = b"qid:" in buf
    nb = len(buf)
    a = np.frombuffer(buf + b"    ", dtype=np.uint8)          # padded: safe lookahead
    nl = np.flatnonzero(a[:nb] == _NL)                        # one per line
    if len(nl) != len(lines):
        raise _Malformed
    if b"#" in buf:       # comments: blank from the first '#' of a line to its end
        a = a.copy()
        hashes = np.flatnonzero(a == _HASH)
        hl = np.searchsorted(nl, hashes)
        first_h = np.ones(len(hashes), dtype=bool)
        first_h[1:] = hl[1:] != hl[:-1]
        mark = np.zeros(len(a) + 1, dtype=np.int8)
        mark[hashes[first_h]] = 1
        mark[nl[hl[first_h]]] = -1
        a[np.cumsum(mark[:-1], dtype=np.int8) > 0] = 32
        buf = a[:nb].tobytes()
    ws = _WS[a]
    tok_start = ~ws
    tok_start[1:] &= ws[:-1]
    starts = np.flatnonzero(tok_start)
    T = len(starts)
    if T == 0:
        z = np.zeros(0, dtype=np.int64)
        return Chunk(path, first_row, np.zeros(0), np.zeros(1, dtype=np.int64), z,
                     np.zeros(0), z)
    tline = np.searchsorted(nl, starts)                        # line of each token
    is_label = np.empty(T, dtype=bool)
    is_label[0] = True
    np.not_equal(tline[1:], tline[:-1], out=is_label[1:])
    colons = np.flatnonzero(a == _COLON)
    # every ':' sits between two non-blank, non-':' bytes ...
    if len(colons) and (ws[colons - 1] | ws[colons + 1] | (a[colons - 1] == _COLON)
                        | (a[colons + 1] == _COLON)).any():
        raise _Malformed
    # ... and every token but the first of its line has exactly one
    ccount = np.bincount(np.searchsorted(starts, colons, side="right") - 1, minlength=T)
    if (ccount != ~is_label).any():
        raise _Malformed
    if has_qid:
        q = (~is_label & (a[starts] == ord("q")) & (a[starts + 1] == ord("i"))
             & (a[starts + 2] == ord("d")) & (a[starts + 3] == _COLON))
        if q.any():
            mark = np.zeros(len(a) + 1, dtype=np.int8)
            qs = starts[q]
            mark[qs] = 1
            nxt = np.searchsorted(starts, qs, side="right")   # blank up to the next token
            ends = np.where(nxt < T, starts[np.minimum(nxt, T - 1)], nb)
            mark[ends] = -1
            a = a.copy()
            a[np.cumsum(mark[:-1], dtype=np.int8) > 0] = 32
            buf = a[:nb].tobytes()
            keep = ~q
            tline, is_label = tline[keep], is_label[keep]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            nums = np.fromstring(buf.replace(b":", b" "), dtype=np.float64, sep=" ")
    except (ValueError, DeprecationWarning):
        raise _Malformed from None
    n = int(is_label.sum())
    nnz = len(is_label) - n
    if len(nums) != n + 2 * nnz:
        raise _Malformed
    row_line = tline[is_label]
    counts = np.bincount(tline, minlength=len(lines))[row_line] - 1
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    lab_pos = np.arange(n, dtype=np.int64) + 2 * indptr[:-1]
    labels = nums[lab_pos]
    mask = np.ones(len(nums), dtype=bool)
    mask[lab_pos] = False
    pairs = nums[mask].reshape(-1, 2)
    idx_f, vals = pairs[:, 0], pairs[:, 1]
    if not (np.isfinite(labels).all() and np.isfinite(vals).all()
            and ((idx_f >= 0) & (idx_f <= MAX_INDEX) & (idx_f == np.floor(idx_f))).all()):
        raise _Malformed                                      # let the slow path say where
    return Chunk(path, first_row, labels, indptr, idx_f.astype(np.int64),
                 np.ascontiguousarray(vals), first_line + row_line.astype(np.int64))


def _num(tok: bytes) -> float | None:
    try:
        return float(tok)
    except ValueError:
        return None


def _show(tok: bytes) -> str:
    return repr(tok.decode("utf-8", errors="replace")[:40])


def _parse_slow(lines: list[bytes], path: str, first_line: int, first_row: int) -> Chunk:
    """Line by line; the reference for what is accepted and for error messages."""
    labels: list[float] = []
    counts: list[int] = []
    idx: list[int] = []
    vals: list[float] = []
    lns: list[int] = []
    for off, raw in enumerate(lines):
        ln = first_line + off
        toks = raw.split(b"#", 1)[0].split()
        if not toks:
            continue
        lab = _num(toks[0])
        if lab is None:
            raise InputError(path, ln, f"bad label {_show(toks[0])}: expected a number")
        if not math.isfinite(lab):
            raise InputError(path, ln, f"bad label {_show(toks[0])}: not finite")
        k = 0
        for t in toks[1:]:
            i_s, sep, v_s = t.partition(b":")
            if t.startswith(b"qid:") and v_s and b":" not in v_s:
                continue
            if not sep or not i_s or not v_s or b":" in v_s:
                raise InputError(path, ln, f"bad feature {_show(t)}: expected idx:val")
            i = _num(i_s)
            if i is None or not math.isfinite(i) or i != math.floor(i):
                raise InputError(path, ln, f"bad feature index {_show(i_s)} in {_show(t)}: "
                                 "expected a non-negative integer")
            if i < 0:
                raise InputError(path, ln, f"negative feature index {int(i)} in {_show(t)}")
            if i > MAX_INDEX:
                raise InputError(path, ln, f"feature index {int(i)} too large (max {MAX_INDEX})")
            v = _num(v_s)
            if v is None:
                raise InputError(path, ln, f"bad feature value {_show(v_s)} in {_show(t)}: "
                                 "expected a number")
            if not math.isfinite(v):
                raise InputError(path, ln, f"feature value not finite in {_show(t)}")
            idx.append(int(i))
            vals.append(v)
            k += 1
        labels.append(lab)
        counts.append(k)
        lns.append(ln)
    indptr = np.zeros(len(labels) + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    return Chunk(path, first_row, np.array(labels, dtype=np.float64), indptr,
                 np.array(idx, dtype=np.int64), np.array(vals, dtype=np.float64),
                 np.array(lns, dtype=np.int64))


# ---------------------------------------------------------------------------
# CSR helpers


def row_gather(indptr: np.ndarray, sel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For CSR rows ``sel``: the new indptr and the positions of their entries."""
    sel = np.asarray(sel, dtype=np.int64)
    starts = indptr[sel]
    counts = indptr[sel + 1] - starts
    new_ptr = np.zeros(len(sel) + 1, dtype=np.int64)
    np.cumsum(counts, out=new_ptr[1:])
    pos = np.arange(new_ptr[-1], dtype=np.int64) + np.repeat(starts - new_ptr[:-1], counts)
    return new_ptr, pos


def take_rows(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray,
              sel: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows ``sel`` (in that order) of a CSR matrix given as arrays."""
    ptr, pos = row_gather(indptr, sel)
    return ptr, indices[pos], data[pos]


def hash_uniform(rows: np.ndarray, seed: int, salt: int) -> np.ndarray:
    """Uniform [0, 1) per row number, a function of (row, seed, salt) only."""
    with np.errstate(over="ignore"):
        base = mix64(np.uint64(seed % 2**64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(salt))
    h = mix64(np.asarray(rows).astype(np.uint64) ^ base)
    return (h >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def holdout_mask(rows: np.ndarray, frac: float, seed: int) -> np.ndarray:
    """Rows held out for testing: a hashed ``frac`` of the row numbers."""
    if frac <= 0:
        return np.zeros(len(rows), dtype=bool)
    return hash_uniform(rows, seed, salt=7919) < frac


# ---------------------------------------------------------------------------
# reading into a job's input blocks


@dataclass
class DataInfo:
    """Global facts about the input, identical on every machine of a job."""
    num_features: int
    index_base: int
    n_train: int
    n_test: int
    nnz_train: int
    labels: np.ndarray | None       # sorted distinct labels (collect_labels)
    sample: tuple | None            # (indptr, indices, data) of sampled training rows
    sample_rows: int
    sample_fraction: float          # 1.0: the sample is all training rows
    #: where the largest feature index is: (file, line, index as written)
    widest: tuple[str, int, int] | None = None


def check_model_bytes(info: DataInfo, part: InputPart, row_bytes: int, extra_keys: int = 0,
                      what: str = "model") -> int:
    """Refuse, before anything of its width is allocated, a model of
    ``info.num_features + extra_keys`` rows of ``row_bytes`` each (and an
    int64 key per row) beyond what a model may take on this machine
    (:meth:`InputPart.model_budget`): an :class:`InputError` naming the file,
    the line and the feature index that planned it (or ``--num-features``).
    Returns the planned bytes."""
    rows = info.num_features + extra_keys
    planned = rows * (row_bytes + 8)
    budget = part.model_budget()
    if planned <= budget:
        return planned
    size = (f"a {what} of {rows} rows x {row_bytes} bytes ({_gib(planned)} with its keys), "
            f"more than the {_gib(budget)} a model may take on this machine (memory budget "
            f"of {_gib(part.memory_budget())})")
    if info.widest is not None and info.widest[2] - info.index_base + 1 >= info.num_features:
        path, line, index = info.widest
        raise InputError(path, line, f"feature index {index} plans {size}; is the index "
                         f"right?")
    raise InputError("--num-features", None, f"{info.num_features} features plan {size}")


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"


class _Pieces:
    __slots__ = ("y", "counts", "idx", "val", "nnz")

    def __init__(self) -> None:
        self.y: list[np.ndarray] = []
        self.counts: list[np.ndarray] = []
        self.idx: list[np.ndarray] = []
        self.val: list[np.ndarray] = []
        self.nnz = 0

    def add(self, y, counts, idx, val) -> None:
        self.y.append(y)
        self.counts.append(counts)
        self.idx.append(idx)
        self.val.append(val)
        self.nnz += len(idx)

    def csr(self, base: int, dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(indptr, indices int32 shifted by -base, data, labels); empties self."""
        cnt = np.concatenate(self.counts) if self.counts else np.zeros(0, dtype=np.int64)
        ptr = np.zeros(len(cnt) + 1, dtype=np.int64)
        np.cumsum(cnt, out=ptr[1:])
        idx = np.concatenate(self.idx) if self.idx else np.zeros(0, dtype=np.int32)
        if base:
            idx -= np.int32(base)
        val = np.concatenate(self.val) if self.val else np.zeros(0, dtype=dtype)
        y = np.concatenate(self.y) if self.y else np.zeros(0)
        self.__init__()
        return ptr, idx.astype(np.int32, copy=False), val.astype(dtype, copy=False), y


def read_libsvm_blocks(part: InputPart, path: str, *, test_path: str | None = None,
                       holdout: float = 0.0, seed: int = 0, index_base: str = "auto",
                       num_features: int | None = None, dtype=np.float64,
                       collect_labels: bool = False, max_labels: int = 100_000,
                       check_labels: Callable[[Chunk], None] | None = None,
                       sample_nnz: int = 0, chunk_bytes: int = CHUNK_BYTES,
                       ) -> tuple[DataInfo, Iterator[tuple[int, dict[str, np.ndarray]]]]:
    """Stream ``path`` (and ``test_path``) once and keep this machine's rows.

    Row ``r`` of ``path`` goes to block ``part.block_of(r)``; it is a test
    row if ``holdout_mask`` says so (only without ``test_path``). Rows of
    ``test_path`` are all test rows, hashed to blocks by ``r + 2**40``.
    ``check_labels(chunk)`` may reject labels (raise ``chunk.error``).
    ``sample_nnz > 0`` also keeps a deterministic hashed sample of about that
    many nonzeros of training rows (the same on every machine).

    Returns the global :class:`DataInfo` and an iterator of
    ``(block_id, arrays)`` for this machine's blocks, with arrays
    ``indptr, indices (int32, base-shifted), data, y`` for training rows and
    ``t_indptr, t_indices, t_data, t_y`` for test rows. The iterator
    assembles one block at a time and frees its pieces.
    """
    if index_base not in ("auto", "0", "1"):
        raise InputError(path, None, f"bad index base {index_base!r} (auto, 0 or 1)")
    per_block = part.pieces()        # (block, test) -> (y, counts, idx, val) pieces
    chunk_bytes = part.chunk_bytes(chunk_bytes)
    try:
        return _read_blocks(part, path, per_block, test_path=test_path, holdout=holdout,
                            seed=seed, index_base=index_base, num_features=num_features,
                            dtype=dtype, collect_labels=collect_labels, max_labels=max_labels,
                            check_labels=check_labels, sample_nnz=sample_nnz,
                            chunk_bytes=chunk_bytes)
    except BaseException:
        per_block.close()
        raise


def _read_blocks(part: InputPart, path: str, per_block: PieceBuffer, *, test_path, holdout,
                 seed, index_base, num_features, dtype, collect_labels, max_labels,
                 check_labels, sample_nnz, chunk_bytes):
    label_set = np.zeros(0)
    min_idx, max_idx = None, -1
    widest: tuple[str, int, int] | None = None
    n_train = n_test = nnz_train = 0
    s_pieces: list[tuple[np.ndarray, _Pieces]] = []   # (hash values, rows)
    s_thr, s_nnz = 1.0, 0
    files = [(path, False)] + ([(test_path, True)] if test_path else [])
    for fpath, is_test_file in files:
        for c in iter_chunks(fpath, chunk_bytes):
            n = c.num_rows
            if n == 0:
                continue
            if check_labels is not None:
                check_labels(c)
            if collect_labels:
                label_set = np.union1d(label_set, np.unique(c.labels))
                if len(label_set) > max_labels:
                    raise InputError(fpath, None, f"more than {max_labels} distinct labels")
            if len(c.indices):
                lo = int(c.indices.min())
                if index_base == "1" and lo == 0:
                    raise c.error(int(np.searchsorted(c.indptr, int(np.argmax(c.indices == 0)),
                                                      side="right") - 1),
                                  "feature index 0 in a 1-based file (use --index-base 0)")
                min_idx = lo if min_idx is None else min(min_idx, lo)
                hi = int(c.indices.max())
                if hi > max_idx:
                    max_idx = hi
                    row = int(np.searchsorted(c.indptr, int(np.argmax(c.indices)),
                                              side="right") - 1)
                    widest = (fpath, int(c.lines[row]), hi)
            rows = np.arange(c.first_row, c.first_row + n, dtype=np.int64)
            if is_test_file:
                test = np.ones(n, dtype=bool)
                blk = part.block_of(rows + TEST_ROW_OFFSET)
            else:
                test = holdout_mask(rows, holdout, seed)
                blk = part.block_of(rows)
            row_nnz = np.diff(c.indptr)
            n_test += int(test.sum())
            n_train += n - int(test.sum())
            nnz_train += int(row_nnz[~test].sum())
            idx32 = c.indices.astype(np.int32)
            if sample_nnz > 0 and not is_test_file:
                u = hash_uniform(rows, seed, salt=104729)
                sel = np.flatnonzero(~test & (u < s_thr))
                if len(sel):
                    ptr, pos = row_gather(c.indptr, sel)
                    p = _Pieces()
                    p.add(c.labels[sel], np.diff(ptr), idx32[pos], c.values[pos])
                    s_pieces.append((u[sel], p))
                    s_nnz += p.nnz
                while s_nnz > sample_nnz:     # thin the sample (never to nothing)
                    thr = s_thr / 2
                    kept, kept_nnz = [], 0
                    for uu, p in s_pieces:
                        keep = np.flatnonzero(uu < thr)
                        if len(keep):
                            cnt = p.counts[0]
                            ptr = np.zeros(len(cnt) + 1, dtype=np.int64)
                            np.cumsum(cnt, out=ptr[1:])
                            ptr2, pos = row_gather(ptr, keep)
                            q = _Pieces()
                            q.add(p.y[0][keep], np.diff(ptr2), p.idx[0][pos], p.val[0][pos])
                            kept.append((uu[keep], q))
                            kept_nnz += q.nnz
                    if not kept:
                        break
                    s_pieces, s_thr, s_nnz = kept, thr, kept_nnz
            mine = np.flatnonzero(part.owns(blk))
            if len(mine) == 0:
                continue
            key = blk[mine] * 2 + test[mine]
            order = mine[np.argsort(key, kind="stable")]
            skey = blk[order] * 2 + test[order]
            ptr, pos = row_gather(c.indptr, order)
            cnt = np.diff(ptr)
            idx_o, val_o = idx32[pos], c.values[pos].astype(dtype)
            y_o = c.labels[order]
            cuts = np.flatnonzero(np.diff(skey)) + 1
            bounds = np.concatenate(([0], cuts, [len(order)]))
            for s, e in zip(bounds[:-1], bounds[1:]):
                k = int(skey[s])
                per_block.add((k // 2, bool(k % 2)), y_o[s:e], cnt[s:e],
                              idx_o[ptr[s]:ptr[e]], val_o[ptr[s]:ptr[e]])
    if n_train == 0:
        raise InputError(path, None, "no training samples in input")
    if index_base == "auto":
        base = 0 if min_idx == 0 else 1
    else:
        base = int(index_base)
    need = max(max_idx - base + 1, 1)
    if num_features is not None:
        if num_features < need:
            raise InputError(path, None, f"feature index {max_idx} needs at least {need} "
                             f"features (--num-features is {num_features})")
        need = num_features
    sample = None
    s_rows = 0
    if s_pieces:
        merged = _Pieces()
        for _, p in s_pieces:
            merged.add(p.y[0], p.counts[0], p.idx[0], p.val[0])
        sptr, sidx, sval, _ = merged.csr(base, np.float64)
        sample, s_rows = (sptr, sidx, sval), len(sptr) - 1
    info = DataInfo(num_features=need, index_base=base, n_train=n_train, n_test=n_test,
                    nnz_train=nnz_train, labels=label_set if collect_labels else None,
                    sample=sample, sample_rows=s_rows, sample_fraction=s_thr,
                    widest=widest)

    def blocks() -> Iterator[tuple[int, dict[str, np.ndarray]]]:
        try:
            for b in part.my_blocks():
                arrays: dict[str, np.ndarray] = {}
                for test, pre in ((False, ""), (True, "t_")):
                    pc = _Pieces()
                    for piece in per_block.take((b, test)):
                        pc.add(*piece)
                    ptr, idx, val, y = pc.csr(base, dtype)
                    arrays.update({pre + "indptr": ptr, pre + "indices": idx,
                                   pre + "data": val, pre + "y": y})
                yield b, arrays
        finally:
            per_block.close()

    return info, blocks()


# ---------------------------------------------------------------------------
# writing


def format_rows(labels: np.ndarray, indptr: np.ndarray, indices: np.ndarray,
                values: np.ndarray, *, label_fmt: str = "%.8g", value_fmt: str = "%.6g",
                index_offset: int = 0) -> str:
    """LIBSVM text for CSR rows (one C-level formatting call per chunk)."""
    n = len(labels)
    counts = np.diff(indptr)
    flat = np.empty(n + 2 * len(indices), dtype=np.float64)
    rows = np.repeat(np.arange(n, dtype=np.int64), counts)
    e = np.arange(len(indices), dtype=np.int64)
    flat[np.arange(n, dtype=np.int64) + 2 * indptr[:-1]] = labels
    flat[rows + 1 + 2 * e] = np.asarray(indices, dtype=np.float64) + index_offset
    flat[rows + 2 + 2 * e] = values
    pair = " %d:" + value_fmt
    fmt = "".join(label_fmt + pair * int(k) + "\n" for k in counts.tolist())
    return fmt % tuple(flat.tolist())
