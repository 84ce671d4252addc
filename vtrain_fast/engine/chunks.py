"""Chunks of a sweep: keep modes, the index-space plan, Arrow batches over the kernels' row
buffers, and the evaluation of one chunk into its file (local lanes or a Dask task). The
orchestration (folders, manifests, resume, merge) is :mod:`vtrain_fast.engine.run`; the Dask runner,
:mod:`vtrain_fast.engine.distributed`, builds on this module only.

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

import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pyarrow as pa

from ..io.errors import InputError
from ..plan.grid import Grid, check_index_space, pruning_table
from ..model import sweep as ks
from ..model.records import HW_FIELDS, INPUT_NAMES, NUM_INPUTS, NUM_OUTPUTS, NUM_STATUS, OUTPUT_NAMES
from ..model.sweep import sweep_chunk
from ..io.schema import (INTEGER_OUTPUTS, SCHEMA, SETTING_COLUMNS, STATUS_LABELS, arch_array, resolve_objectives,
                         setting_array)
from ..model.arch import BY_NAME as ARCH_BY_NAME
from ..plan.spec import RECOMPUTE_VALUES
from ..io.writer import (PartWriter,
                     candidate_name, part_name, storage_schema)

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
        """``(obj_src, obj_col, obj_sign)`` for :func:`~vtrain_fast.model.sweep.scan_chunk`."""
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
    name (:func:`vtrain_fast.analysis.query.resolve_objectives`); :class:`InputError` unless COL is a
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
    :data:`~vtrain_fast.model.sweep.BLOCK` points, whose columns fit in L2.

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

    def evaluate(self, grid: Grid, start: int, n: int) -> None:
        """Evaluate grid points ``start .. start+n-1`` (``n <= capacity``) into columns ``0 .. n-1``."""
        sweep_chunk(start, n, *grid.kernel_args(), self.inputs, self.tokens, self.out, self.status)

    def output(self, name: str, rows: np.ndarray) -> np.ndarray:
        """Output column ``name`` (:data:`~vtrain_fast.io.schema.OUTPUT_NAMES`) at ``rows``, ``float64``."""
        return self.out[OUTPUT_NAMES.index(name), rows]

    def input(self, name: str, rows: np.ndarray) -> np.ndarray:
        """Integer input column ``name`` (:data:`~vtrain_fast.model.records.INPUT_NAMES`) at ``rows``, ``int64``."""
        return self.inputs[INPUT_NAMES.index(name), rows]


class _ArrowBuilder:
    """Zero-copy record batches over :class:`RowBuffers` (schema :data:`STORAGE_SCHEMA`)."""

    def __init__(self, grid: Grid):
        self.model_dict = pa.array(grid.model_names, pa.string())
        self.gpu_dict = pa.array(grid.gpu_names, pa.string())
        self.gpu_name_codes = grid.gpu_name_codes
        self.gpu_names_differ = not np.array_equal(grid.gpu_name_codes, np.arange(len(grid.gpu_name_codes)))
        self.input_rows = {name: k for k, name in enumerate(INPUT_NAMES)}
        # training settings per gpu-axis value (carried by the machine vectors)
        self.settings = {col: grid.hw_table[grid.gpus, HW_FIELDS.index(col)] for col in SETTING_COLUMNS}

    def batch(self, b: RowBuffers, n: int, index: np.ndarray | None = None) -> pa.RecordBatch:
        codes = b.codes
        np.copyto(codes[0, :n], b.inputs[ks.INPUT.model_index, :n], casting="unsafe")
        np.copyto(codes[1, :n], b.inputs[ks.INPUT.gpu_index, :n], casting="unsafe")
        np.copyto(codes[2, :n], b.inputs[ks.INPUT.recompute, :n], casting="unsafe")
        np.copyto(codes[3, :n], b.status[:n], casting="unsafe")
        # settings by gpu-axis value, then the axis value -> its GPU name's code
        settings = {col: setting_array(col, per_gpu, codes[1, :n]) for col, per_gpu in self.settings.items()}
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
            if a is None:
                row = b.inputs[self.input_rows[f.name], :n]
                a = arch_array(f.name, row) if f.name in ARCH_BY_NAME else pa.array(row)
            cols.append(a)
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
def reduce_candidates(keep: Keep, vals: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Positions of the rows of ``(vals, idx)`` that survive ``keep``'s reduction, in order
    (frontier: lexicographic by objectives; top: by value, then index)."""
    if keep.mode == "frontier":
        return ks.pareto_positions(vals, idx)
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


def evaluate_chunk(grid: Grid, start: int, n: int) -> pa.RecordBatch:
    """Evaluate grid points ``start .. start+n-1`` and return them as one record batch
    (schema :data:`STORAGE_SCHEMA`: :data:`vtrain_fast.io.schema.SCHEMA`'s columns)."""
    b = RowBuffers(n)
    b.evaluate(grid, start, n)
    return _ArrowBuilder(grid).batch(b, n)
