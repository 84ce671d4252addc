"""Run a sweep: open or resume a results folder, evaluate its chunks (:mod:`vtrain_fast.engine.chunks`)
here or on a Dask cluster (:mod:`vtrain_fast.engine.distributed`), record each finished chunk in the
manifest so that a killed sweep resumes where it stopped, and finish the folder (or merge the
shards of one). Terms (chunk, batch, keep): :mod:`vtrain_fast.engine.chunks`.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import queue
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import numba
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .. import __version__
from ..io.errors import InputError, check_output_folder, format_bytes, free_bytes
from ..plan.grid import Grid, build_grid
from ..model.records import NUM_STATUS
from ..io.schema import STATUS_LABELS
from ..io.schema import variant_label
from ..plan.spec import SweepSpec, recorded_spec_problem
from .chunks import (CANDIDATE_SCHEMA, DICTIONARY_COLUMNS, INDEX_COLUMN, ROW_BUFFERS_PER_LANE, STORAGE_SCHEMA,
                     ChunkEvaluator, Keep, Plan, _LaneSink, parse_keep, plan_sweep, reduce_candidates, run_chunk)
from ..io.writer import (FINAL, MANIFEST, MANIFEST_FORMAT, SHARD_MANIFEST_RE, FolderLock, PartWriter,
                     _record_problem, at_odds, candidate_name, check_files, check_manifest, clear_folder, file_problem,
                     final_problem, is_sweep_file,
                     part_name, read_json, rebuild_fix, remove_leftovers, shard_manifest_name, write_json_atomic)


# ----------------------------------------------------------------------------------- manifests
def sweep_key(spec: SweepSpec, grid: Grid, keep: Keep, plan: Plan) -> str:
    """Identity of a sweep's results: spec text, machine vectors (calibration included), keep
    mode, chunking, package version and a hash of the kernel sources (a cost-model change makes
    old rows a different sweep). Resuming or merging requires equal keys."""
    from ..model._jit import _kernel_source_hash
    doc = {"spec": spec.source, "hw": grid.hw_table.tolist(), "keep": keep.label,
           "plan": plan.as_dict(), "version": __version__, "kernels": _kernel_source_hash()}
    if spec.model_files:        # shapes read from other files than the spec: a changed file is another sweep
        doc["model_files"] = _model_file_shapes(spec)
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:32]


def _model_file_shapes(spec: SweepSpec) -> dict:
    """The spec's model files and the shapes of the sweep, for the key and the manifest."""
    return {"files": list(spec.model_files), "models": [dataclasses.asdict(m) for m in spec.models]}


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
        **({"model_files": _model_file_shapes(spec)} if spec.model_files else {}),
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
    check (:func:`~vtrain_fast.io.writer.file_problem`)."""
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
    files = state.get("files") if isinstance(state.get("files"), dict) else {}
    parts = state.get("parts") if isinstance(state.get("parts"), list) else []
    return [(n, prob) for n in parts
            if isinstance(n, str) and isinstance(files.get(n), dict) and not _record_problem(files[n])
            and (prob := file_problem(folder, files[n], state["sweep_key"]))]


# Keys a finished manifest adds to the run's state (:func:`finalize`); dropped when a damaged
# folder is reopened for repair.
_FINAL_KEYS = ("complete", "num_rows", "status_counts", "pruned_points", "parts", "files", "shards")
# Keys of a run's state that are not the header's: every other key follows from what the sweep key
# covers (spec, machine vectors, plan), so a reopened folder takes them from this run's header (a
# description edited in the manifest is written again; io.writer.cluster_problem and
# plan.spec.recorded_spec_problem say when one was).
_RUN_KEYS = ("complete", "created", "elapsed_s", "chunks", "resumed")


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
            differs = [what for what, key in (("spec text", "spec"), ("model files", "model_files"),
                                              ("--keep", "keep"), ("chunking", "plan"),
                                              ("package version", "version")) if old.get(key) != header.get(key)]
            raise InputError(str(path), "sweep", old.get("name"),
                             "the same spec, calibration, --keep and chunking as the interrupted run",
                             "the folder holds a different sweep (" + (", ".join(differs) + " differ" if differs else
                             "its spec, --keep and chunking agree, so the calibration or the cost model's code "
                             "changed since it ran: its rows would not match new ones")
                             + "); pass --overwrite to replace it, or choose another -o")
        check_manifest(old, path, whole=shard is None, final=False)     # the result fields: below
        # a finished manifest at odds with itself (its machines, its spec's grid, its result fields)
        odd = ((final_problem(old) or recorded_spec_problem(old)) if old.get("complete") and shard is None
               else None)
        old.update({k: v for k, v in header.items() if k not in _RUN_KEYS})     # the same sweep key
        damaged = _damaged_chunks(folder, old, chunks)
        chunk_files = {n for _, n, _ in damaged}
        final = ([(n, prob) for n, prob in _final_problems(folder, old) if n not in chunk_files]
                 if old.get("complete") and shard is None else [])
        if odd:             # a result that disagrees with the chunks is written again from them
            final.append((MANIFEST, at_odds(odd)))
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
        c = np.asarray(info["status_counts"], dtype=np.int64)[:NUM_STATUS]
        counts[:c.size] += c            # an older version's chunks count fewer statuses
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
        A chunk's file is missing, truncated or damaged (:func:`~vtrain_fast.io.writer.check_files`).
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
        (see :mod:`vtrain_fast.engine.distributed`).
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
            from ..io.errors import number_ranges
            raise InputError(str(folder), "shards", f"{len(missing):,} of {n:,} missing, {len(unfinished):,} unfinished",
                             f"all {n:,} shards, finished",
                             f"missing: {number_ranges(missing)}; unfinished: {number_ranges(unfinished)}; "
                             f"run (or rerun, to resume) those shards (--shard K/{n}), then merge again")
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
