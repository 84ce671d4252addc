"""Run a sweep: plan chunks of the flat index space, run the parallel kernel on each, turn the
column buffers into Arrow record batches and hand them to a background Parquet writer, so that
writing overlaps computing.
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pyarrow as pa

from . import __version__
from .grid import Grid, build_grid
from .kernels.step import NUM_OUTPUTS, OUTPUT_NAMES
from .kernels.sweep import INPUT_NAMES, NUM_INPUTS, sweep_chunk
from .schema import INTEGER_OUTPUTS, SCHEMA, STATUS_LABELS
from .spec import RECOMPUTE_VALUES, SweepSpec
from .writer import MANIFEST, PartWriter, prepare_folder, write_json_atomic

_STATUS_DICT = pa.array(STATUS_LABELS, pa.string())
_RECOMPUTE_DICT = pa.array(RECOMPUTE_VALUES, pa.string())


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


def evaluate_chunk(grid: Grid, start: int, n: int) -> pa.RecordBatch:
    """Evaluate grid points ``start .. start+n-1`` and return them as one record batch
    (schema :data:`vtrain_fast.schema.SCHEMA`)."""
    inputs = np.empty((NUM_INPUTS, n), dtype=np.int64)
    tokens = np.empty(n, dtype=np.float64)
    out = np.empty((NUM_OUTPUTS, n), dtype=np.float64)
    status = np.empty(n, dtype=np.int8)
    sweep_chunk(start, n, *grid.kernel_args(), inputs, tokens, out, status)
    ins = {name: inputs[k] for k, name in enumerate(INPUT_NAMES)}
    arrays = {
        "model": _dict_array(ins["model_index"], pa.array(grid.model_names, pa.string())),
        "gpu": _dict_array(ins["gpu_index"], pa.array(grid.gpu_names, pa.string())),
        "recompute": _dict_array(ins["recompute"], _RECOMPUTE_DICT),
        "num_tokens": pa.array(tokens),
    }
    for f in SCHEMA:
        if f.name not in arrays and f.name in ins:
            arrays[f.name] = pa.array(ins[f.name])
    arrays.update(output_arrays(out, status))
    return pa.RecordBatch.from_arrays([arrays[f.name] for f in SCHEMA], schema=SCHEMA)


def plan_chunks(num_points: int, chunk_size: int) -> Iterator[tuple[int, int]]:
    """Yield ``(start, n)`` ranges covering ``[0, num_points)``."""
    for start in range(0, num_points, chunk_size):
        yield start, min(chunk_size, num_points - start)


def run_sweep(spec: SweepSpec, folder: str | Path, overwrite: bool = False,
              on_progress: Callable[[int], None] | None = None) -> dict:
    """Evaluate every point of ``spec`` and write ``folder/part-*.parquet`` plus the manifest.

    Parameters
    ----------
    spec : SweepSpec
    folder : str or Path
        Results folder; created if missing.
    overwrite : bool
        Replace an existing result in ``folder``.
    on_progress : callable, optional
        Called with the number of points finished after each chunk.

    Returns
    -------
    dict
        The manifest (also written to ``folder/manifest.json``, last).

    Raises
    ------
    InputError
        Non-empty folder without ``overwrite``; index space too large.
    """
    folder = Path(folder)
    grid = build_grid(spec)
    prepare_folder(folder, overwrite)
    writer = PartWriter(folder, SCHEMA)
    t0 = time.perf_counter()
    status_counts = np.zeros(len(STATUS_LABELS), dtype=np.int64)
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = []
        for start, n in plan_chunks(grid.num_points, spec.chunk_size):
            batch = evaluate_chunk(grid, start, n)
            codes = batch.column(SCHEMA.get_field_index("status")).indices.to_numpy()
            status_counts += np.bincount(codes, minlength=len(STATUS_LABELS))
            pending.append(pool.submit(writer.write, batch))
            while len(pending) > 2:
                pending.pop(0).result()
            if on_progress:
                on_progress(n)
        for f in pending:
            f.result()
    writer.close()
    elapsed = time.perf_counter() - t0
    manifest = {
        "complete": True,
        "name": spec.name,
        "package": "vtrain_fast",
        "version": __version__,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "spec_path": spec.path,
        "spec": spec.source,
        "num_points": grid.num_points,
        "num_rows": writer.rows,
        "status_counts": dict(zip(STATUS_LABELS, map(int, status_counts))),
        "parts": writer.parts,
        "elapsed_s": round(elapsed, 3),
        "gpus": {g.name: {"usd_per_gpu_hour": g.usd_per_gpu_hour, "gpus_per_node": g.gpus_per_node,
                          "intra_node_GBps": g.intra_node_GBps, "inter_node_Gbps": g.inter_node_Gbps,
                          "calibration": vars(g.calibration)} for g in spec.gpus},
    }
    write_json_atomic(folder / MANIFEST, manifest)
    return manifest
