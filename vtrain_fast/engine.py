"""Run a sweep: plan chunks of the flat index space, evaluate them with the parallel kernels,
keep what the user asked for, write Parquet in background threads, and record progress so that
a killed sweep resumes where it stopped.

Terms
-----
batch
    Points per kernel call. In ``--keep all`` a batch is one Parquet row group.
chunk
    A contiguous range of flat indices: the unit of work, of resumption and of Dask tasks.
    Chunk ``c`` covers ``[c * chunk_points, (c + 1) * chunk_points)`` whatever the machine, so
    shards, resumed runs and Dask workers agree on it. It writes ``part-{c:06d}.parquet`` (rows)
    or ``reduce/c-{c:06d}.parquet`` (frontier / top-K candidates).
keep
    ``all`` every row; ``feasible`` rows with status ``ok``; ``frontier`` the Pareto frontier
    of the ``ok`` rows over ``--minimize`` objectives; ``top:K:COL`` the K ``ok`` rows with the
    smallest ``COL`` (``-COL``: largest). The reduced modes never materialise rows they drop:
    the scan kernel returns only candidate indices, a frontier or top-K is reduced per chunk
    and merged at the end, and only the survivors are evaluated again as full rows.
"""
from __future__ import annotations

import hashlib
import json
import os
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterator

import numba
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from . import __version__
from .errors import InputError, check_output_folder, format_bytes, free_bytes
from .grid import Grid, build_grid, check_index_space, pruning_table
from .kernels import sweep as ks
from .kernels.step import NUM_OUTPUTS, NUM_STATUS, OUTPUT_NAMES
from .kernels.sweep import INPUT_NAMES, NUM_INPUTS, sweep_chunk
from .kernels.params import HW_FIELDS
from .schema import INTEGER_OUTPUTS, SCHEMA, SETTING_FIELDS, STATUS_LABELS, setting_values
from .query import resolve_objectives
from .spec import RECOMPUTE_VALUES, SweepSpec, variant_label
from .writer import (FINAL, MANIFEST, MANIFEST_FORMAT, SHARD_MANIFEST_RE, FolderLock, PartWriter,
                     candidate_name, check_files, check_manifest, clear_folder, file_problem, is_sweep_file, part_name, read_json,
                     rebuild_fix, remove_leftovers, shard_manifest_name, storage_schema, write_json_atomic)

_STATUS_DICT = pa.array(STATUS_LABELS, pa.string())
_RECOMPUTE_DICT = pa.array(RECOMPUTE_VALUES, pa.string())
# Schema of the files: SCHEMA with only the integer outputs nullable (they are null on rows
# whose shape is infeasible); readers see the same column types as SCHEMA.
STORAGE_SCHEMA = storage_schema(SCHEMA, INTEGER_OUTPUTS)
INDEX_COLUMN = "index"
CANDIDATE_SCHEMA = STORAGE_SCHEMA.append(pa.field(INDEX_COLUMN, pa.int64(), nullable=False))

KEEP_MODES = ("all", "feasible", "frontier", "top:K:COL")
DEFAULT_OBJECTIVES = ("cost_usd", "train_days")

# ---- planning constants (see plan_sweep)
ROW_CHUNK_POINTS = 1 << 19        # keep all: points per part file (2 row groups of 2^18)
FEASIBLE_CHUNK_POINTS = 1 << 22   # keep feasible: points per part file
SCAN_CHUNK_POINTS = 1 << 24       # frontier / top: points per chunk (resume unit, ~2-5 s)
SCAN_BATCH_POINTS = 1 << 20       # frontier / top: points per scan kernel call
ROW_BUFFER_BUDGET = 640 << 20     # bytes of row buffers in flight (compute + write queue)
ROW_BUFFERS_PER_LANE = 2          # one being written, one filled or queued
_INT_ROWS = tuple(OUTPUT_NAMES.index(n) for n in INTEGER_OUTPUTS if n in OUTPUT_NAMES)
ROW_BYTES = (NUM_INPUTS * 8 + 8 + NUM_OUTPUTS * 8 + 1 + 4 * 4 + len(_INT_ROWS) * 9)


# ------------------------------------------------------------------------------------ keep modes
@dataclass(frozen=True)
class Keep:
    """What a sweep keeps.

    Attributes
    ----------
    mode : str
        ``all``, ``feasible``, ``frontier`` or ``top``.
    objectives : tuple of str
        Numeric columns; a leading ``-`` maximises. Frontier: all objectives; top: one.
    k : int
        Rows kept by ``top``.
    """

    mode: str
    objectives: tuple = ()
    k: int = 0

    @property
    def label(self) -> str:
        if self.mode == "frontier":
            return "frontier:" + ",".join(self.objectives)
        if self.mode == "top":
            return f"top:{self.k}:{self.objectives[0]}"
        return self.mode

    @property
    def reduces(self) -> bool:
        """True for frontier and top (a merge step at the end)."""
        return self.mode in ("frontier", "top")

    def objective_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(obj_src, obj_col, obj_sign)`` for :func:`~vtrain_fast.kernels.sweep.scan_chunk`."""
        src, col, sign = [], [], []
        for o in self.objectives:
            name = o.lstrip("-")
            sign.append(-1.0 if o.startswith("-") else 1.0)
            if name in OUTPUT_NAMES:
                src.append(ks.SRC_OUTPUT)
                col.append(OUTPUT_NAMES.index(name))
            elif name == "num_tokens":
                src.append(ks.SRC_TOKENS)
                col.append(0)
            else:
                src.append(ks.SRC_INPUT)
                col.append(INPUT_NAMES.index(name))
        return (np.array(src, dtype=np.int64), np.array(col, dtype=np.int64),
                np.array(sign, dtype=np.float64))


def _numeric_columns() -> tuple[str, ...]:
    names = [f.name for f in SCHEMA if f.type in (pa.int64(), pa.float64())]
    return tuple(n for n in names if n in OUTPUT_NAMES or n in INPUT_NAMES or n == "num_tokens")


def _objective(where: str, value: str) -> str:
    """``value`` (``COL`` or ``-COL``, a table header's short name allowed) with the full column
    name (:func:`vtrain_fast.query.resolve_objectives`); :class:`InputError` unless COL is a
    numeric input or output the sweep kernels evaluate (not a setting column such as vpp)."""
    out = resolve_objectives(where, [value], where)[0]
    if out.lstrip("-") not in _numeric_columns():
        raise InputError(where, where, value, "numeric columns: " + ", ".join(_numeric_columns()),
                         "rank by an input or output of the cost model, e.g. -mfu")
    return out


def parse_keep(keep: str | Keep = "all", minimize: list[str] | tuple | None = None) -> Keep:
    """Parse ``--keep`` (and ``--minimize``) into a :class:`Keep`.

    Parameters
    ----------
    keep : str or Keep
        ``all``, ``feasible``, ``frontier`` or ``top:K:COL``.
    minimize : list of str, optional
        Frontier objectives (default ``cost_usd``, ``train_days``); only with ``frontier``.

    Raises
    ------
    InputError
        Unknown mode, bad K, unknown or non-numeric column, ``--minimize`` without frontier.
    """
    if isinstance(keep, Keep):
        return keep
    minimize = list(minimize or [])
    text = str(keep).strip()
    mode = text.split(":", 1)[0]
    if mode not in ("all", "feasible", "frontier", "top") or (mode != "top" and ":" in text):
        raise InputError("--keep", "--keep", keep, ", ".join(KEEP_MODES),
                         "e.g. --keep frontier --minimize cost_usd --minimize train_days, "
                         "or --keep top:100:cost_usd")
    if minimize and mode != "frontier":
        raise InputError("--minimize", "--minimize", minimize, "only together with --keep frontier",
                         "add --keep frontier, or drop --minimize")
    if mode == "frontier":
        objectives = tuple(_objective("--minimize", m) for m in (minimize or DEFAULT_OBJECTIVES))
        if len({o.lstrip("-") for o in objectives}) != len(objectives):
            raise InputError("--minimize", "--minimize", minimize, "each column once")
        return Keep("frontier", objectives)
    if mode == "top":
        parts = text.split(":")
        if len(parts) != 3 or not parts[1].isdigit() or int(parts[1]) < 1:
            raise InputError("--keep", "--keep", keep, "top:K:COL with K a whole number >= 1",
                             "e.g. --keep top:100:cost_usd (or top:100:-mfu for the largest)")
        return Keep("top", (_objective("--keep", parts[2]),), int(parts[1]))
    return Keep(mode)


# ------------------------------------------------------------------------------------- planning
@dataclass(frozen=True)
class Plan:
    """Index-space plan of a sweep (see the module docstring).

    Attributes
    ----------
    num_points : int
    chunk_points : int
        Points per chunk; the last chunk may be shorter.
    batch_points : int
        Points per kernel call.
    """

    num_points: int
    chunk_points: int
    batch_points: int

    @property
    def num_chunks(self) -> int:
        return -(-self.num_points // self.chunk_points)

    def chunk(self, c: int) -> tuple[int, int]:
        """``(start, n)`` of chunk ``c``."""
        start = c * self.chunk_points
        return start, min(self.chunk_points, self.num_points - start)

    def batches(self, c: int) -> Iterator[tuple[int, int]]:
        """``(start, n)`` of the kernel calls of chunk ``c``."""
        start, n = self.chunk(c)
        for s in range(start, start + n, self.batch_points):
            yield s, min(self.batch_points, start + n - s)

    def shard_chunks(self, shard: tuple[int, int] | None) -> range:
        """Chunks of shard ``(K, N)``: the K-th of N contiguous, disjoint slices."""
        if shard is None:
            return range(self.num_chunks)
        k, n = shard
        m = self.num_chunks
        return range((k - 1) * m // n, k * m // n)

    def as_dict(self) -> dict:
        return {"num_points": self.num_points, "chunk_points": self.chunk_points,
                "batch_points": self.batch_points, "num_chunks": self.num_chunks}


def plan_sweep(num_points: int, keep: Keep, row_group_points: int = 1 << 18,
               chunk_points: int | None = None, batch_points: int | None = None,
               num_buffers: int = 5) -> Plan:
    """Choose chunk and batch sizes.

    Row modes (``all``): a batch is one row group of ``row_group_points`` (the spec's
    ``output.chunk_size``) capped so that ``num_buffers`` row buffers of ``ROW_BYTES`` per point
    (kernel columns plus Arrow side arrays) stay within :data:`ROW_BUFFER_BUDGET`; a chunk is
    about :data:`ROW_CHUNK_POINTS` points (one part file of several row groups). ``feasible``
    scans batches of ``row_group_points`` (so the rows they yield fit one row buffer) in
    chunks of :data:`FEASIBLE_CHUNK_POINTS`. ``frontier``/``top`` scan batches of
    :data:`SCAN_BATCH_POINTS` (candidate buffers of ``8 (k + 1)`` bytes per point) in chunks of
    :data:`SCAN_CHUNK_POINTS`. Inside a kernel call every thread takes blocks of
    :data:`~vtrain_fast.kernels.sweep.BLOCK` points, whose columns fit in L2.

    Raises
    ------
    InputError
        If ``num_points`` does not fit in int64 or a size is below 1.
    """
    check_index_space(num_points)
    for name, v in (("chunk_points", chunk_points), ("batch_points", batch_points),
                    ("row_group_points", row_group_points)):
        if v is not None and v < 1:
            raise InputError("plan", name, v, "an integer >= 1")
    max_rows = max(ks.BLOCK, ROW_BUFFER_BUDGET // (num_buffers * ROW_BYTES))
    if keep.mode == "all":
        batch = batch_points or min(row_group_points, max_rows)
        chunk = chunk_points or batch * max(1, ROW_CHUNK_POINTS // batch)
    elif keep.mode == "feasible":
        batch = batch_points or min(row_group_points, max_rows)
        chunk = chunk_points or batch * max(1, FEASIBLE_CHUNK_POINTS // batch)
    else:
        batch = batch_points or SCAN_BATCH_POINTS
        chunk = chunk_points or SCAN_CHUNK_POINTS
    num_points = max(int(num_points), 0)
    chunk = max(1, min(chunk, num_points or 1))
    batch = max(1, min(batch, chunk))
    return Plan(num_points, int(chunk), int(batch))


# ------------------------------------------------------------------------------- Arrow building
def _dict_array(codes: np.ndarray, dictionary: pa.Array) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(pa.array(codes.astype(np.int32, copy=False)), dictionary)


def output_arrays(out: np.ndarray, status: np.ndarray) -> dict[str, pa.Array]:
    """Arrow arrays for ``status`` and every output column.

    Parameters
    ----------
    out : numpy.ndarray
        ``float64``, shape ``(NUM_OUTPUTS, n)``.
    status : numpy.ndarray
        ``int8``, shape ``(n,)``.
    """
    arrays = {"status": _dict_array(status, _STATUS_DICT)}
    for k, name in enumerate(OUTPUT_NAMES):
        col = out[k]
        if name in INTEGER_OUTPUTS:
            nan = np.isnan(col)
            arrays[name] = pa.array(np.where(nan, 0, col).astype(np.int64), mask=nan)
        else:
            arrays[name] = pa.array(col)
    return arrays


class RowBuffers:
    """Preallocated kernel output columns for up to ``capacity`` rows, plus the side arrays
    Arrow needs (int32 dictionary codes, int64 integer outputs and their validity), reused
    from batch to batch: fresh pages cost a page fault each, which on a VM is slower than
    the cost model."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.inputs = np.empty((NUM_INPUTS, capacity), dtype=np.int64)
        self.tokens = np.empty(capacity, dtype=np.float64)
        self.out = np.empty((NUM_OUTPUTS, capacity), dtype=np.float64)
        self.status = np.empty(capacity, dtype=np.int8)
        self.codes = np.empty((4, capacity), dtype=np.int32)
        self.ints = np.empty((len(_INT_ROWS), capacity), dtype=np.int64)
        self.valid = np.empty((len(_INT_ROWS), capacity), dtype=np.uint8)


class _ArrowBuilder:
    """Zero-copy record batches over :class:`RowBuffers` (schema :data:`STORAGE_SCHEMA`)."""

    def __init__(self, grid: Grid):
        self.model_dict = pa.array(grid.model_names, pa.string())
        self.gpu_dict = pa.array(grid.gpu_names, pa.string())
        self.gpu_name_codes = grid.gpu_name_codes
        self.gpu_names_differ = not np.array_equal(grid.gpu_name_codes, np.arange(len(grid.gpu_name_codes)))
        self.input_rows = {name: k for k, name in enumerate(INPUT_NAMES)}
        # training settings per gpu-axis value (carried by the machine vectors)
        self.settings = {}
        for col, field in SETTING_FIELDS.items():
            self.settings[col] = setting_values(col, grid.hw_table[grid.gpus, HW_FIELDS.index(field)])

    def batch(self, b: RowBuffers, n: int, index: np.ndarray | None = None) -> pa.RecordBatch:
        codes = b.codes
        np.copyto(codes[0, :n], b.inputs[ks.I_MODEL, :n], casting="unsafe")
        np.copyto(codes[1, :n], b.inputs[ks.I_GPU, :n], casting="unsafe")
        np.copyto(codes[2, :n], b.inputs[ks.I_RECOMPUTE, :n], casting="unsafe")
        np.copyto(codes[3, :n], b.status[:n], casting="unsafe")
        # settings by gpu-axis value, then the axis value -> its GPU name's code
        settings = {col: pa.array(per_gpu[codes[1, :n]]) for col, per_gpu in self.settings.items()}
        if self.gpu_names_differ:
            np.take(self.gpu_name_codes, codes[1, :n], out=codes[1, :n])
        arrays = {
            "model": pa.DictionaryArray.from_arrays(pa.array(codes[0, :n]), self.model_dict, safe=False),
            "gpu": pa.DictionaryArray.from_arrays(pa.array(codes[1, :n]), self.gpu_dict, safe=False),
            "recompute": pa.DictionaryArray.from_arrays(pa.array(codes[2, :n]), _RECOMPUTE_DICT, safe=False),
            "status": pa.DictionaryArray.from_arrays(pa.array(codes[3, :n]), _STATUS_DICT, safe=False),
            "num_tokens": pa.array(b.tokens[:n]),
        }
        arrays.update(settings)
        for q, row in enumerate(_INT_ROWS):
            vals, valid = b.ints[q, :n], b.valid[q, :n]
            ks.integer_column(b.out[row, :n], vals, valid)
            bitmap = None
            if n and not valid.all():
                bitmap = pa.py_buffer(np.packbits(valid, bitorder="little"))
            arrays[OUTPUT_NAMES[row]] = pa.Array.from_buffers(pa.int64(), n, [bitmap, pa.py_buffer(vals)])
        for k, name in enumerate(OUTPUT_NAMES):
            if name not in arrays:
                arrays[name] = pa.array(b.out[k, :n])
        cols = []
        for f in STORAGE_SCHEMA:
            a = arrays.get(f.name)
            cols.append(a if a is not None else pa.array(b.inputs[self.input_rows[f.name], :n]))
        schema = STORAGE_SCHEMA
        if index is not None:
            cols.append(pa.array(index))
            schema = CANDIDATE_SCHEMA
        return pa.RecordBatch.from_arrays(cols, schema=schema)


# Parquet dictionary encoding for every column but the float64 ones: inputs, status and
# integer outputs repeat heavily, while hashing every float of a high-cardinality output
# (train_days, cost_usd, ...) costs more write time than it saves space (measured: 5% faster
# writes, 1% larger files).
DICTIONARY_COLUMNS = [f.name for f in STORAGE_SCHEMA if f.type != pa.float64()]


# ---------------------------------------------------------------------------- chunk evaluation
def _pareto_positions(vals: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Positions of the Pareto frontier of ``vals`` (``(m, k)``, minimised), ties broken by the
    lower ``idx``, in lexicographic order of (objectives, idx)."""
    if vals.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    keys = [idx] + [vals[:, q] for q in range(vals.shape[1] - 1, -1, -1)]
    order = np.lexsort(keys).astype(np.int64)
    return ks.pareto_sorted(np.ascontiguousarray(vals), idx, order)


def reduce_candidates(keep: Keep, vals: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Positions of the rows of ``(vals, idx)`` that survive ``keep``'s reduction, in order
    (frontier: lexicographic by objectives; top: by value, then index)."""
    if keep.mode == "frontier":
        return _pareto_positions(vals, idx)
    order = np.lexsort((idx, vals[:, 0]))
    return order[:keep.k].astype(np.int64)


class ChunkEvaluator:
    """Everything needed to evaluate chunks of one sweep: the grid, the keep mode, the plan,
    the pruning table and reusable buffers. One per process (Dask workers build their own)."""

    def __init__(self, grid: Grid, keep: Keep, plan: Plan, prune: bool = True, key: str = ""):
        self.grid, self.keep, self.plan = grid, keep, plan
        self.key = key          # the sweep key, written into every file (writer.ORIGIN_KEY)
        self.prefix_ok = pruning_table(grid) if (prune and keep.mode != "all") else np.zeros(0, np.uint8)
        self.obj_src, self.obj_col, self.obj_sign = keep.objective_arrays()
        self.arrow = _ArrowBuilder(grid)
        self.kernel_args = grid.kernel_args()
        self._scan_bufs = None
        self._row_bufs: list[RowBuffers] = []
        self._row_lock = threading.Lock()

    # -- row buffers (a small pool: the writer threads hold some while the kernel fills others)
    def take_rows(self, capacity: int) -> RowBuffers:
        with self._row_lock:
            for i, b in enumerate(self._row_bufs):
                if b.capacity >= capacity:
                    return self._row_bufs.pop(i)
        return RowBuffers(capacity)

    def give_rows(self, b: RowBuffers) -> None:
        with self._row_lock:
            self._row_bufs.append(b)

    # -- keep all
    def row_batch(self, start: int, n: int, b: RowBuffers) -> tuple[pa.RecordBatch, np.ndarray]:
        """Every row of ``start .. start+n-1`` as a record batch over ``b``, and the status
        counts (``int64``, shape ``(NUM_STATUS,)``)."""
        sweep_chunk(start, n, *self.kernel_args, b.inputs, b.tokens, b.out, b.status)
        counts = np.bincount(b.status[:n], minlength=NUM_STATUS).astype(np.int64)
        return self.arrow.batch(b, n), counts

    # -- explicit indices (feasible rows, frontier / top survivors)
    def rows_at(self, indices: np.ndarray, b: RowBuffers, with_index: bool = False) -> pa.RecordBatch:
        """Full rows at flat ``indices`` (``int64``), written into ``b``."""
        n = indices.shape[0]
        ks.sweep_points(indices, *self.kernel_args, b.inputs, b.tokens, b.out, b.status)
        return self.arrow.batch(b, n, indices if with_index else None)

    # -- reduced modes
    def scan(self, start: int, n: int, front_vals: np.ndarray, front_idx: np.ndarray):
        """Candidates among ``start .. start+n-1`` (see ``scan_chunk``).

        Returns
        -------
        idx : numpy.ndarray
            ``int64 (m,)``, ascending.
        vals : numpy.ndarray
            ``float64 (m, k)``, signed objectives.
        counts : numpy.ndarray
            ``int64 (NUM_STATUS,)``, evaluated points per status.
        pruned : int
            Points skipped by the pruning table.
        """
        k = self.obj_src.shape[0]
        cap = max(n, self.plan.batch_points)
        nb = -(-cap // ks.BLOCK)
        if self._scan_bufs is None or self._scan_bufs[0].shape[0] < n:
            self._scan_bufs = (np.empty(cap, np.int64), np.empty((k, cap)), np.empty(nb, np.int64),
                               np.empty((nb, NUM_STATUS), np.int64), np.empty(nb, np.int64))
        cand_idx, cand_vals, fill, status, pruned = self._scan_bufs
        nbn = -(-n // ks.BLOCK)
        mode = {"feasible": ks.KEEP_FEASIBLE, "frontier": ks.KEEP_FRONTIER, "top": ks.KEEP_TOP}[self.keep.mode]
        ks.scan_chunk(start, n, *self.kernel_args, self.prefix_ok, mode, self.obj_src, self.obj_col,
                      self.obj_sign, front_vals, front_idx, cand_idx, cand_vals, fill[:nbn],
                      status[:nbn], pruned[:nbn])
        m = int(fill[:nbn].sum())
        idx = np.empty(m, np.int64)
        vals = np.empty((m, k))
        ks.compact_candidates(cand_idx, cand_vals, fill[:nbn], idx, vals, 0)
        return idx, vals, status[:nbn].sum(axis=0), int(pruned[:nbn].sum())


# ------------------------------------------------------------------------------------ chunk runs
class _SyncSink:
    """Writes part files in the calling thread (Dask tasks)."""

    def write(self, chunk: int, writer: PartWriter, batch, release: Callable[[], None]) -> None:
        try:
            writer.write(batch)
        finally:
            release()

    def finish(self, chunk: int, writer: PartWriter, info: dict, record: Callable[[dict], None]) -> None:
        _closed(info, writer.close())
        record(info)


class _LaneSink:
    """Background Parquet writers: each chunk's row groups go, in order, to one single-thread
    lane (the least busy when the chunk starts), so several part files are written at once
    while the kernel runs."""

    def __init__(self, lanes: int):
        self.pools = [ThreadPoolExecutor(1, thread_name_prefix=f"vtrain-writer-{i}") for i in range(lanes)]
        self.futures: list = []
        self.done: queue.Queue = queue.Queue()
        self.lane_of: dict[int, int] = {}
        self.queued = [0] * lanes
        self._lock = threading.Lock()

    def _submit(self, chunk, fn):
        with self._lock:
            lane = self.lane_of.get(chunk)
            if lane is None:
                lane = self.lane_of[chunk] = min(range(len(self.pools)), key=self.queued.__getitem__)
            self.queued[lane] += 1

        def job():
            try:
                fn()
            finally:
                with self._lock:
                    self.queued[lane] -= 1
        self.futures.append(self.pools[lane].submit(job))

    def write(self, chunk, writer, batch, release) -> None:
        def job():
            try:
                writer.write(batch)
            finally:
                release()
        self._submit(chunk, job)

    def finish(self, chunk, writer, info, record) -> None:
        def job():
            _closed(info, writer.close())
            self.done.put(info)
        self._submit(chunk, job)
        self.lane_of.pop(chunk, None)

    def check(self) -> None:
        """Raise the first error of a finished write; forget finished writes."""
        pending = []
        for f in self.futures:
            if f.done():
                f.result()
            else:
                pending.append(f)
        self.futures = pending

    def drain(self, record: Callable[[dict], None]) -> None:
        self.check()
        self.record_finished(record)

    def record_finished(self, record: Callable[[dict], None]) -> None:
        """Record the chunks whose files are complete, without raising the errors of others
        (after a failure, so that a rerun redoes only what is missing)."""
        while True:
            try:
                record(self.done.get_nowait())
            except queue.Empty:
                return

    def close(self, wait: bool) -> None:
        """Finish every queued write (``wait``), or drop the queued ones and let only the
        running ones end (after an error)."""
        for p in self.pools:
            p.shutdown(wait=True, cancel_futures=not wait)
        if wait:
            self.check()


def _new_info(chunk: int, n: int) -> dict:
    """A chunk's manifest entry: its points, rows, status counts, and its file (``part`` or
    ``candidates`` by name, ``file`` the record readers check; None when it kept no rows)."""
    return {"chunk": chunk, "points": n, "rows": 0, "status_counts": [0] * NUM_STATUS,
            "pruned": 0, "part": None, "candidates": None, "file": None}


def _closed(info: dict, record: dict | None) -> None:
    """Enter a row chunk's closed part file (``record``, or None: no rows) into ``info``."""
    info["part"] = record["name"] if record else None
    info["file"] = record


def run_chunk(ev: ChunkEvaluator, folder: Path, chunk: int, sink, record: Callable[[dict], None],
              on_batch: Callable[[int], None] | None = None, front=None, pool=None):
    """Evaluate chunk ``chunk`` and write its file; call ``record(info)`` once it is final.

    Parameters
    ----------
    ev : ChunkEvaluator
    folder : Path
    chunk : int
    sink : _SyncSink or _LaneSink
        Where row batches go.
    record : callable
        Receives the chunk's info dict (rows, status counts, part or candidates file).
    on_batch : callable, optional
        Called with the number of points after every kernel call.
    front : list, optional
        ``[vals, idx]`` of the running frontier / top-K threshold across chunks (updated in
        place; only used to discard points early, never changes results).
    pool : queue.Queue, optional
        Limits row buffers in flight (``keep all`` / ``feasible``).
    """
    keep, plan = ev.keep, ev.plan
    _, n = plan.chunk(chunk)
    info = _new_info(chunk, n)
    counts = np.zeros(NUM_STATUS, dtype=np.int64)

    def take():
        if pool is not None:
            pool.get()
        return ev.take_rows(plan.batch_points)

    def release_fn(b):
        def release():
            ev.give_rows(b)
            if pool is not None:
                pool.put(None)
        return release

    if keep.mode in ("all", "feasible"):
        writer = PartWriter(folder, part_name(chunk), STORAGE_SCHEMA, DICTIONARY_COLUMNS, origin=(ev.key, chunk))
        for s, m in plan.batches(chunk):
            b = take()
            if keep.mode == "all":
                batch, c = ev.row_batch(s, m, b)
            else:
                idx, _, c, pruned = ev.scan(s, m, np.empty((0, 0)), np.empty(0, np.int64))
                info["pruned"] += pruned
                batch = ev.rows_at(idx, b) if idx.size else None
            counts += c
            if batch is not None and batch.num_rows:
                info["rows"] += batch.num_rows
                sink.write(chunk, writer, batch, release_fn(b))
            else:
                release_fn(b)()
            if on_batch:
                on_batch(m)
        info["status_counts"] = counts.tolist()
        sink.finish(chunk, writer, info, record)
        return

    # frontier / top: reduce per batch, keep the chunk's survivors as full rows
    k = ev.obj_src.shape[0]
    c_vals, c_idx = np.empty((0, k)), np.empty(0, np.int64)
    if front is None:
        front = [np.empty((0, k)), np.empty(0, np.int64)]
    for s, m in plan.batches(chunk):
        fv, fi = front
        if keep.mode == "top":
            fv, fi = (fv[keep.k - 1:keep.k], fi[keep.k - 1:keep.k]) if fi.size >= keep.k else (fv[:0], fi[:0])
        idx, vals, c, pruned = ev.scan(s, m, np.ascontiguousarray(fv), fi)
        counts += c
        info["pruned"] += pruned
        if idx.size:
            v = np.concatenate([c_vals, vals])
            i = np.concatenate([c_idx, idx])
            pos = reduce_candidates(keep, v, i)
            c_vals, c_idx = v[pos], i[pos]
            v = np.concatenate([front[0], vals])
            i = np.concatenate([front[1], idx])
            pos = reduce_candidates(keep, v, i)
            front[0], front[1] = v[pos], i[pos]
        if on_batch:
            on_batch(m)
    info["status_counts"] = counts.tolist()
    order = np.argsort(c_idx, kind="stable")
    c_idx = np.ascontiguousarray(c_idx[order])
    name = candidate_name(chunk)
    w = PartWriter(folder, name, CANDIDATE_SCHEMA, DICTIONARY_COLUMNS, origin=(ev.key, chunk))
    if c_idx.size:
        b = ev.take_rows(c_idx.size)
        try:
            w.write(ev.rows_at(c_idx, b, with_index=True))
        finally:
            ev.give_rows(b)
    else:
        w.write(CANDIDATE_SCHEMA.empty_table())
    info["file"] = w.close()             # its name is relative to the folder: reduce/c-NNNNNN.parquet
    info["rows"] = int(c_idx.size)
    info["candidates"] = name
    record(info)


# ----------------------------------------------------------------------------------- manifests
def sweep_key(spec: SweepSpec, grid: Grid, keep: Keep, plan: Plan) -> str:
    """Identity of a sweep's results: spec text, machine vectors (calibration included), keep
    mode, chunking, package version and a hash of the kernel sources (a cost-model change makes
    old rows a different sweep). Resuming or merging requires equal keys."""
    from ._jit import _kernel_source_hash
    doc = {"spec": spec.source, "hw": grid.hw_table.tolist(), "keep": keep.label,
           "plan": plan.as_dict(), "version": __version__, "kernels": _kernel_source_hash()}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:32]


def _header(spec: SweepSpec, grid: Grid, keep: Keep, plan: Plan, shard) -> dict:
    return {
        "complete": False,
        "name": spec.name,
        "package": "vtrain_fast",
        "version": __version__,
        "format": MANIFEST_FORMAT,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "spec_path": spec.path,
        "spec": spec.source,
        "num_points": grid.num_points,
        "keep": keep.label,
        "objectives": list(keep.objectives),
        "top_k": keep.k or None,
        "plan": plan.as_dict(),
        "shard": list(shard) if shard else None,
        "sweep_key": sweep_key(spec, grid, keep, plan),
        "gpus": {g.name: {"usd_per_gpu_hour": g.usd_per_gpu_hour, "gpus_per_node": g.gpus_per_node,
                          "intra_node_GBps": g.intra_node_GBps, "inter_node_Gbps": g.inter_node_Gbps,
                          "pue": g.pue, "reserved_GiB": g.reserved_GiB,
                          "calibration": vars(g.calibration)} for g in spec.gpus},
        "setting_axes": list(spec.setting_axes),
        "setting_values": {k: list(vals) for k, vals in spec.settings},
        "machine_vectors": {variant_label(g, spec.setting_axes): row
                            for g, row in zip(spec.gpus, grid.hw_table.tolist())},
        "elapsed_s": 0.0,
        "chunks": {},
    }


def _tree_bytes(path: Path) -> int:
    """Bytes of the file at ``path``, or of every file under the folder ``path``; 0 if absent."""
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size if path.is_file() else 0


def _chunk_files(folder: Path, chunks) -> list[Path]:
    out = []
    for c in chunks:
        out += [folder / part_name(c), folder / candidate_name(c)]
    return out


def _check_one_split(folder: Path, shard: tuple[int, int]) -> None:
    """Refuse shard ``K/N`` in a folder that holds shards of a split into another number of
    slices: their chunks overlap, so both would write the same files."""
    for p in folder.iterdir():
        m = SHARD_MANIFEST_RE.match(p.name)
        if m and int(m.group(2)) != shard[1]:
            raise InputError(str(folder), "--shard", f"{shard[0]}/{shard[1]}",
                             f"K/{m.group(2)}, the split of the shards already in this folder ({p.name})",
                             f"run the shards as K/{m.group(2)}, or give this split its own -o (or delete the "
                             f"manifest-shard-*-of-{m.group(2)}.json files and their parts first)")


def _damaged_chunks(folder: Path, state: dict, chunks: range) -> list[tuple[int, str, str]]:
    """``(chunk, file name, problem)`` of the recorded chunks of ``chunks`` whose file fails its
    check (:func:`~vtrain_fast.writer.file_problem`)."""
    bad = []
    for c in chunks:
        info = state["chunks"].get(str(c))
        if info and info.get("file"):
            prob = file_problem(folder, info["file"], state["sweep_key"])
            if prob:
                bad.append((c, info["file"]["name"], prob))
    return bad


def _final_problems(folder: Path, state: dict) -> list[tuple[str, str]]:
    """``(name, problem)`` of the files a finished manifest lists that fail their check."""
    files = state.get("files") or {}
    return [(n, prob) for n in state.get("parts") or []
            if n in files and (prob := file_problem(folder, files[n], state["sweep_key"]))]


# Keys a finished manifest adds to the run's state (:func:`finalize`); dropped when a damaged
# folder is reopened for repair.
_FINAL_KEYS = ("complete", "num_rows", "status_counts", "pruned_points", "parts", "files", "shards")


def _open_run(folder: Path, header: dict, shard, chunks: range, overwrite: bool,
              on_note: Callable[[str], None] | None = None) -> dict:
    """Start or resume the run described by ``header`` in ``folder``; return its state.

    Resuming checks every recorded chunk's file: a missing, truncated or damaged one is deleted
    and its chunk evaluated again. A finished folder of the same sweep whose files fail their
    check is reopened the same way (repair); one whose files pass is refused (already done).

    Raises
    ------
    InputError
        The folder holds other results, a different sweep, a finished and intact copy of this
        sweep, shards of another split, or a manifest from an older version.
    """
    name = shard_manifest_name(shard)
    path = folder / name
    note = on_note or (lambda text: None)
    if shard is not None:
        _check_one_split(folder, shard)
    others = [p for p in folder.iterdir() if not p.name.startswith(".lock")]
    if overwrite:
        if shard is None:
            clear_folder(folder)
        else:
            for p in [folder / MANIFEST, path] + _chunk_files(folder, chunks):
                if p.exists():
                    p.unlink()
            remove_leftovers(folder, chunks)
    elif path.exists():
        old = read_json(path)
        if old.get("complete") and old.get("sweep_key") != header["sweep_key"]:
            raise InputError(str(folder), "output folder", str(folder), "an empty or new folder",
                             f"it holds a different, finished sweep ({old.get('name')}); pass --overwrite "
                             "to replace it, or choose another -o")
        if old.get("sweep_key") != header["sweep_key"]:
            raise InputError(str(path), "sweep", old.get("name"),
                             "the same spec, calibration, --keep and chunking as the interrupted run",
                             "the folder holds a different sweep; pass --overwrite to replace it, "
                             "or choose another -o")
        check_manifest(old, path, whole=shard is None)
        damaged = _damaged_chunks(folder, old, chunks)
        chunk_files = {n for _, n, _ in damaged}
        final = ([(n, prob) for n, prob in _final_problems(folder, old) if n not in chunk_files]
                 if old.get("complete") and shard is None else [])
        if old.get("complete"):
            if not damaged and not final:
                raise InputError(str(folder), "output folder", str(folder),
                                 "an unfinished or damaged sweep to resume, or an empty or new folder",
                                 "it already holds this finished sweep, every file intact; pass --overwrite to "
                                 "recompute it" + (f", or run `vtrain-fast merge {folder}`" if shard else ""))
            for k in _FINAL_KEYS:
                old.pop(k, None)
            old["complete"] = False
            if shard is not None and (folder / MANIFEST).exists():
                (folder / MANIFEST).unlink()      # the merged result no longer holds: merge again after
            for n, prob in final:
                note(f"{n} is {prob}; it is written again from the chunks")
        for c, n, prob in damaged:
            note(f"{n} is {prob}; chunk {c} is evaluated again")
            del old["chunks"][str(c)]
        remove_leftovers(folder, None if shard is None else chunks)
        done = set(old["chunks"])
        stale = [c for c in chunks if str(c) not in done]
        for p in _chunk_files(folder, stale):
            if p.exists():
                p.unlink()
        old["resumed"] = old.get("resumed", 0) + 1
        write_json_atomic(path, old)
        return old
    elif shard is None and others:
        raise InputError(str(folder), "output folder", str(folder), "an empty or new folder",
                         "pass --overwrite to replace its contents, or choose another -o")
    elif shard is not None:
        for p in others:
            m = SHARD_MANIFEST_RE.match(p.name)
            if p.name == MANIFEST or (m and read_json(p).get("sweep_key") != header["sweep_key"]):
                raise InputError(str(folder), "output folder", str(folder),
                                 "a folder holding only shards of this same sweep",
                                 f"{p.name} belongs to another or a merged sweep; pass --overwrite "
                                 "or choose another -o")
    state = dict(header)
    write_json_atomic(path, state)
    return state


def _totals(chunks: dict) -> tuple[np.ndarray, int, int]:
    counts = np.zeros(NUM_STATUS, dtype=np.int64)
    rows = pruned = 0
    for info in chunks.values():
        counts += np.asarray(info["status_counts"], dtype=np.int64)
        rows += info["rows"]
        pruned += info["pruned"]
    return counts, rows, pruned


def chunk_records(chunks: dict) -> list[dict]:
    """The file records of the chunks in ``chunks`` (a manifest's ``chunks``), in chunk order."""
    return [info["file"] for _, info in sorted(chunks.items(), key=lambda kv: int(kv[0])) if info.get("file")]


def finalize(folder: Path, state: dict, keep: Keep) -> dict:
    """Turn a state whose chunks are all done into the final ``manifest.json``: list the part
    files with their records (``files``), or (frontier / top) merge every chunk's candidates
    into ``part-000000.parquet``. Every chunk's file is checked first.

    Raises
    ------
    InputError
        A chunk's file is missing, truncated or damaged (:func:`~vtrain_fast.writer.check_files`).
    """
    chunks = state["chunks"]
    counts, rows, pruned = _totals(chunks)
    check_files(folder, chunk_records(chunks), rebuild_fix(state, folder), state["sweep_key"])
    if keep.reduces:
        tables = [pq.read_table(folder / info["candidates"]) for _, info in sorted(
            chunks.items(), key=lambda kv: int(kv[0])) if info.get("rows")]
        table = pa.concat_tables(tables) if tables else CANDIDATE_SCHEMA.empty_table()
        table = table.cast(CANDIDATE_SCHEMA)
        idx = np.array(table[INDEX_COLUMN].to_numpy(), dtype=np.int64)     # writable copy
        vals = np.column_stack([
            table[o.lstrip("-")].to_numpy(zero_copy_only=False).astype(np.float64)
            * (-1.0 if o.startswith("-") else 1.0) for o in keep.objectives]) if table.num_rows \
            else np.empty((0, len(keep.objectives)))
        pos = reduce_candidates(keep, vals, idx)
        result = table.take(pa.array(pos, pa.int64())).drop_columns([INDEX_COLUMN])
        w = PartWriter(folder, part_name(0), STORAGE_SCHEMA, DICTIONARY_COLUMNS, origin=(state["sweep_key"], FINAL))
        w.write(result.cast(STORAGE_SCHEMA))
        records = [w.close()]
        rows = result.num_rows
    else:
        records = sorted((info["file"] for info in chunks.values() if info.get("part")), key=lambda r: r["name"])
        if not records:           # nothing feasible: an empty part keeps scans working
            w = PartWriter(folder, part_name(0), STORAGE_SCHEMA, origin=(state["sweep_key"], FINAL))
            w.write(STORAGE_SCHEMA.empty_table())
            records = [w.close()]
    remove_leftovers(folder)     # temporary files of failed attempts (e.g. a lost Dask worker)
    manifest = {k: v for k, v in state.items() if k != "chunks"}
    manifest.update({
        "complete": True,
        "format": MANIFEST_FORMAT,
        "num_rows": int(rows),
        "status_counts": dict(zip(STATUS_LABELS, map(int, counts))),
        "pruned_points": int(pruned),
        "parts": [r["name"] for r in records],
        "files": {r["name"]: r for r in records},
        "chunks": chunks,
    })
    write_json_atomic(folder / MANIFEST, manifest)
    return manifest


# Parquet bytes per kept row, a lower bound: `make bench` measures about 15 on the default sweep.
MIN_BYTES_PER_ROW = 10


def check_room_for_rows(folder: Path, rows: int, reclaimable: int = 0) -> None:
    """Refuse a ``--keep all`` sweep whose rows cannot fit on the disk of ``folder`` (at
    :data:`MIN_BYTES_PER_ROW` each), before any work: a new sweep's rows, or those of the chunks
    a resumed run still has to write; ``reclaimable`` bytes of old files that ``--overwrite``
    deletes count as free (checked before they are deleted, so a refusal loses nothing).

    Raises
    ------
    InputError
        Naming the rows, the bytes needed and free, and the fix.
    """
    free = free_bytes(folder)
    free = None if free is None else free + reclaimable    # reclaimable: old files --overwrite deletes
    need = rows * MIN_BYTES_PER_ROW
    if free is not None and need > free:
        raise InputError(str(folder), "--keep all", f"{rows:,} rows",
                         f"at most about {free // MIN_BYTES_PER_ROW:,} rows here (at least {format_bytes(need)} "
                         f"needed, {format_bytes(free)} free)",
                         "keep fewer rows (--keep feasible, --keep frontier or --keep top:K:COL), shorten "
                         "some axes, or write to a disk with more room (-o)")



# ------------------------------------------------------------------------------------ the sweep
def _parse_shard(shard) -> tuple[int, int] | None:
    if shard is None:
        return None
    if isinstance(shard, str):
        try:
            k, n = (int(x) for x in shard.split("/"))
        except ValueError:
            raise InputError("--shard", "--shard", shard, "K/N with whole numbers 1 <= K <= N",
                             "e.g. --shard 3/8 (SLURM: --shard $((SLURM_ARRAY_TASK_ID+1))/$SLURM_ARRAY_TASK_COUNT)") from None
    else:
        k, n = shard
    if not 1 <= k <= n:
        raise InputError("--shard", "--shard", f"{k}/{n}", "K/N with whole numbers 1 <= K <= N")
    return int(k), int(n)


def run_sweep(spec: SweepSpec, folder: str | Path, overwrite: bool = False,
              on_progress: Callable[[int], None] | None = None, *, keep: str | Keep = "all",
              minimize: list[str] | None = None, shard: str | tuple[int, int] | None = None,
              scheduler: str | None = None, threads: int | None = None,
              writer_threads: int | None = None, chunk_points: int | None = None,
              batch_points: int | None = None, prune: bool = True,
              on_note: Callable[[str], None] | None = None) -> dict:
    """Evaluate the points of ``spec`` and write ``folder/part-*.parquet`` plus the manifest.

    Parameters
    ----------
    spec : SweepSpec
    folder : str or Path
        Results folder; created if missing.
    overwrite : bool
        Replace an existing result (with ``shard``: only that shard's files).
    on_progress : callable, optional
        Called with the number of points finished, after every kernel call (local) or chunk
        (Dask); on a resumed run first with the points already done.
    keep : str or Keep
        ``all``, ``feasible``, ``frontier`` or ``top:K:COL`` (see :func:`parse_keep`).
    minimize : list of str, optional
        Frontier objectives.
    shard : str or (int, int), optional
        ``"K/N"``: evaluate only the K-th of N contiguous slices of chunks; finish with
        :func:`merge_shards`.
    scheduler : str, optional
        Dask scheduler address, or ``local:N`` for a ``LocalCluster`` of N workers
        (see :mod:`vtrain_fast.distributed`).
    threads : int, optional
        Numba threads for the kernels (default: all).
    writer_threads : int, optional
        Background Parquet writers (default: ``min(4, cores)``).
    chunk_points, batch_points : int, optional
        Override the plan (:func:`plan_sweep`); results do not depend on them.
    prune : bool
        Skip infeasible sub-spaces in the reduced modes (never changes results).
    on_note : callable, optional
        Called with a sentence for each file a resumed run finds damaged and rebuilds.

    Returns
    -------
    dict
        The manifest (``folder/manifest.json``, or the shard's manifest when ``shard``).

    Raises
    ------
    InputError
        Folder holds other results (or shards of another split), another process writes it,
        bad keep/shard/scheduler, index space too large, a write fails (disk full, file-size
        limit, unwritable place: the failed chunk is not recorded, so a rerun completes it).
    """
    folder = Path(folder)
    check_output_folder(folder)
    keep = parse_keep(keep, minimize)
    shard = _parse_shard(shard)
    if scheduler is not None:
        from .distributed import check_scheduler
        check_scheduler(scheduler)
    grid = build_grid(spec)
    lanes = writer_threads or max(1, min(4, os.cpu_count() or 1))
    plan = plan_sweep(grid.num_points, keep, spec.chunk_size, chunk_points, batch_points,
                      num_buffers=ROW_BUFFERS_PER_LANE * lanes)
    chunks = plan.shard_chunks(shard)
    header = _header(spec, grid, keep, plan, shard)
    old_threads = numba.get_num_threads()
    if threads:
        numba.set_num_threads(max(1, min(int(threads), numba.config.NUMBA_NUM_THREADS)))
    try:
        with FolderLock(folder, shard) as folder_lock:
            if keep.mode == "all" and overwrite:
                old = ([p for p in folder.iterdir() if is_sweep_file(p.name)] if shard is None
                       else [folder / shard_manifest_name(shard)] + _chunk_files(folder, chunks))
                check_room_for_rows(folder, sum(plan.chunk(c)[1] for c in chunks),
                                    sum(_tree_bytes(p) for p in old))
            with folder_lock.opening():
                state = _open_run(folder, header, shard, chunks, overwrite, on_note)
            mpath = folder / shard_manifest_name(shard)
            lock = threading.Lock()

            def record(info: dict) -> None:
                with lock:
                    state["chunks"][str(info["chunk"])] = info
                    write_json_atomic(mpath, state)

            todo = [c for c in chunks if str(c) not in state["chunks"]]
            if keep.mode == "all" and not overwrite:
                check_room_for_rows(folder, sum(plan.chunk(c)[1] for c in todo))
            if on_progress:
                done = sum(plan.chunk(c)[1] for c in chunks if str(c) in state["chunks"])
                if done:
                    on_progress(done)
            t0 = time.perf_counter()
            try:
                if scheduler:
                    from .distributed import run_chunks_dask
                    run_chunks_dask(scheduler, grid, keep, plan, folder, todo, record, on_progress,
                                    threads=threads, prune=prune, key=header["sweep_key"])
                else:
                    _run_local(ChunkEvaluator(grid, keep, plan, prune, header["sweep_key"]), folder, todo, record,
                               on_progress, lanes)
            finally:
                with lock:
                    state["elapsed_s"] = round(state.get("elapsed_s", 0.0) + time.perf_counter() - t0, 3)
                    write_json_atomic(mpath, state)
            if shard is not None:
                remove_leftovers(folder, chunks)
                counts, rows, pruned = _totals(state["chunks"])
                state.update({"complete": True, "num_rows": rows, "pruned_points": pruned,
                              "status_counts": dict(zip(STATUS_LABELS, map(int, counts)))})
                write_json_atomic(mpath, state)
                return state
            return finalize(folder, state, keep)
    finally:
        numba.set_num_threads(old_threads)


def _run_local(ev: ChunkEvaluator, folder: Path, todo: list[int], record, on_progress, lanes: int) -> None:
    """Evaluate ``todo`` chunks in this process; row batches are written by ``lanes`` background
    threads, at most ``ROW_BUFFERS_PER_LANE * lanes`` row buffers in flight."""
    sink = _LaneSink(lanes)
    pool: queue.Queue = queue.Queue()
    for _ in range(ROW_BUFFERS_PER_LANE * lanes):
        pool.put(None)
    front = None
    if ev.keep.reduces:
        k = ev.obj_src.shape[0]
        front = [np.empty((0, k)), np.empty(0, np.int64)]
    try:
        for c in todo:
            run_chunk(ev, folder, c, sink, record,
                      on_batch=lambda m: (sink.drain(record), on_progress and on_progress(m)),
                      front=front, pool=pool)
            sink.drain(record)
    except BaseException:
        sink.close(wait=False)     # queued writes dropped, their chunks not recorded
        try:
            sink.record_finished(record)    # chunks whose files were completed are kept
        except Exception:                   # (a full disk may refuse the manifest too)
            pass
        remove_leftovers(folder, todo)      # the other lanes' unfinished files of this run
        raise
    sink.close(wait=True)
    sink.drain(record)


def evaluate_chunk(grid: Grid, start: int, n: int) -> pa.RecordBatch:
    """Evaluate grid points ``start .. start+n-1`` and return them as one record batch
    (schema :data:`STORAGE_SCHEMA`: :data:`vtrain_fast.schema.SCHEMA`'s columns)."""
    b = RowBuffers(n)
    sweep_chunk(start, n, *grid.kernel_args(), b.inputs, b.tokens, b.out, b.status)
    return _ArrowBuilder(grid).batch(b, n)


def plan_chunks(num_points: int, chunk_size: int) -> Iterator[tuple[int, int]]:
    """Yield ``(start, n)`` ranges covering ``[0, num_points)``."""
    for start in range(0, num_points, chunk_size):
        yield start, min(chunk_size, num_points - start)


# ----------------------------------------------------------------------------------- shards
def merge_shards(folder: str | Path) -> dict:
    """Combine the shards of a sweep run with ``--shard K/N`` into one result.

    Checks that every shard 1..N is present, finished and of the same sweep, and that their
    chunks cover the index space exactly once; then writes ``manifest.json`` (frontier / top:
    after merging all candidates).

    Raises
    ------
    InputError
        No shards, missing or unfinished shards, shards of different sweeps.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(str(folder), "results folder", str(folder), "a folder written by `vtrain-fast sweep --shard`")
    with FolderLock(folder):
        found = {}
        for p in folder.iterdir():
            m = SHARD_MANIFEST_RE.match(p.name)
            if m:
                found[(int(m.group(1)), int(m.group(2)))] = read_json(p)
        if not found:
            raise InputError(str(folder), "shard manifests", None, "manifest-shard-K-of-N.json files",
                             "run `vtrain-fast sweep SPEC --shard K/N -o DIR` for K = 1..N first")
        counts = {n for _, n in found}
        if len(counts) != 1:
            raise InputError(str(folder), "shards", sorted(found), "shards of one split K/N (one N)",
                             "remove the shard manifests of the other split")
        n = counts.pop()
        missing = [k for k in range(1, n + 1) if (k, n) not in found]
        unfinished = [k for (k, _), m in sorted(found.items()) if not m.get("complete")]
        if missing or unfinished:
            raise InputError(str(folder), "shards", f"{len(found)} of {n} present",
                             f"all {n} shards, finished",
                             f"missing: {missing or 'none'}; unfinished: {unfinished or 'none'}; "
                             "run (or rerun, to resume) those shards, then merge again")
        for (k, n_), m in found.items():
            check_manifest(m, folder / shard_manifest_name((k, n_)), whole=False)
        keys = {m["sweep_key"] for m in found.values()}
        if len(keys) != 1:
            raise InputError(str(folder), "shards", "different sweeps", "shards of one sweep",
                             "rerun the odd shards with the same spec, calibration and --keep")
        first = found[(1, n)]
        chunks: dict = {}
        for m in found.values():
            chunks.update(m["chunks"])
        num_chunks = first["plan"]["num_chunks"]
        if sorted(int(c) for c in chunks) != list(range(num_chunks)):
            raise InputError(str(folder), "chunks", len(chunks), f"chunks 0..{num_chunks - 1} once each",
                             "rerun the shards with --overwrite")
        state = {k: v for k, v in first.items() if k not in ("shard", "status_counts", "num_rows")}
        state.update({"shards": n, "chunks": chunks,
                      "elapsed_s": round(sum(m.get("elapsed_s", 0.0) for m in found.values()), 3)})
        keep = parse_keep(first["keep"].split(":")[0] if first["keep"].startswith("frontier")
                          else first["keep"], first["objectives"] if first["keep"].startswith("frontier") else None)
        return finalize(folder, state, keep)
