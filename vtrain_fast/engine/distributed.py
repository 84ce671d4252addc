"""Run the chunks of a sweep as tasks on a Dask distributed cluster.

Each chunk is one task (:func:`chunk_task`): the worker evaluates it with the same kernels as a
local run and writes the chunk's own file (``part-{c:06d}.parquet`` or
``reduce/c-{c:06d}.parquet``) under a temporary name, renamed when complete, so a retried task
(a lost worker, a failed attempt) simply writes the same file again. The driver records each
finished chunk in the manifest as results arrive, so an interrupted distributed sweep resumes
like a local one. Workers must see the results folder (a shared file system on a cluster).

``scheduler`` is a scheduler address (``tcp://host:8786``), ``local:N`` (a
``distributed.LocalCluster`` of N single-threaded workers in this process; Numba kernels and
Parquet writing release the GIL), or an existing ``distributed.Client``.
"""
from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Callable

from ..io.errors import InputError

# Attempts after the first for a task that raises; tasks lost with a worker are rescheduled by
# the scheduler itself (``distributed.scheduler.allowed-failures``).
RETRIES = 3

_local = threading.local()


def _evaluator(key: str, grid, keep, plan, prune: bool):
    """One :class:`~vtrain_fast.engine.chunks.ChunkEvaluator` per worker thread and sweep (its scan
    buffers are not shared between threads)."""
    from .chunks import ChunkEvaluator
    cache = getattr(_local, "evaluators", None)
    if cache is None:
        cache = _local.evaluators = {}
    ev = cache.get(key)
    if ev is None:
        cache.clear()
        ev = cache[key] = ChunkEvaluator(grid, keep, plan, prune, key)
    return ev


def chunk_task(key: str, grid, keep, plan, folder: str, chunk: int, threads: int | None,
               prune: bool) -> dict:
    """Dask task: evaluate chunk ``chunk`` and write its file; return its info dict (as
    recorded in the manifest)."""
    import numba

    from .chunks import _SyncSink, run_chunk
    if threads:
        numba.set_num_threads(max(1, min(int(threads), numba.config.NUMBA_NUM_THREADS)))
    ev = _evaluator(key, grid, keep, plan, prune)
    infos: list[dict] = []
    run_chunk(ev, Path(folder), chunk, _SyncSink(), infos.append)
    return infos[0]


def check_scheduler(scheduler) -> None:
    """Validate ``--scheduler`` before any work starts.

    Raises
    ------
    InputError
        ``local:N`` with N not a whole number >= 1, or an empty address.
    """
    from distributed import Client
    if isinstance(scheduler, Client):
        return
    text = str(scheduler).strip()
    if text.startswith("local:"):
        n = text.split(":", 1)[1]
        if not n.isdigit() or int(n) < 1:
            raise InputError("--scheduler", "--scheduler", text, "local:N with N >= 1, or an address",
                             "e.g. --scheduler local:2 or --scheduler tcp://head-node:8786")
    elif not text:
        raise InputError("--scheduler", "--scheduler", text, "local:N, or a scheduler address",
                         "e.g. --scheduler tcp://head-node:8786")


def connect(scheduler):
    """Return ``(client, close)`` for ``scheduler`` (address, ``local:N`` or a Client).

    Raises
    ------
    InputError
        Bad ``local:N`` or an address that does not answer.
    """
    from distributed import Client, LocalCluster
    if isinstance(scheduler, Client):
        return scheduler, lambda: None
    check_scheduler(scheduler)
    text = str(scheduler).strip()
    if text.startswith("local:"):
        n = int(text.split(":", 1)[1])
        cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=False,
                               dashboard_address=":0")
        client = Client(cluster)

        def close():
            client.close()
            cluster.close()
        return client, close
    try:
        client = Client(text, timeout="20s")
    except (OSError, TimeoutError, ValueError) as e:
        raise InputError("--scheduler", "--scheduler", text, "the address of a running Dask scheduler",
                         f"could not connect ({e}); start one with `dask scheduler` or use local:N") from None
    return client, client.close


def _cluster_failure(scheduler, chunk, exc: Exception) -> InputError:
    """The one-message error for a chunk the cluster could not finish (``KilledWorker``: the
    workers that ran it died more often than the scheduler allows; or a lost scheduler)."""
    name = type(exc).__name__
    why = ("the workers that ran it died each time (KilledWorker): look in their logs for a kill "
           "or an out-of-memory event") if name == "KilledWorker" else f"{name}: {str(exc)[:300]}"
    return InputError(str(scheduler), "--scheduler", str(scheduler), "a cluster that finishes every chunk",
                      f"chunk {chunk} did not finish: {why}; the chunks that finished are recorded, so rerunning "
                      "the same command resumes the sweep (give the workers more memory, or use --threads 1)")


def run_chunks_dask(scheduler, grid, keep, plan, folder: Path, todo: list[int],
                    record: Callable[[dict], None], on_progress: Callable[[int], None] | None,
                    threads: int | None = None, prune: bool = True, key: str | None = None) -> None:
    """Submit one :func:`chunk_task` per chunk in ``todo`` and ``record`` each result as it
    arrives (in completion order; the manifest is keyed by chunk).

    Parameters
    ----------
    scheduler : str or distributed.Client
    grid, keep, plan
        As in :class:`~vtrain_fast.engine.chunks.ChunkEvaluator`.
    folder : Path
        Results folder, visible to every worker.
    todo : list of int
        Chunks still to do.
    record : callable
        Called in this thread with each finished chunk's info.
    on_progress : callable, optional
        Called with the chunk's number of points after each chunk.
    threads : int, optional
        Numba threads per task (default 1: one task per worker thread).
    """
    from distributed import as_completed
    if not todo:
        return
    client, close = connect(scheduler)
    key = key or f"{id(grid):x}"
    nonce = uuid.uuid4().hex[:8]
    futures = []
    try:
        for c in todo:
            futures.append(client.submit(chunk_task, key, grid, keep, plan, str(folder), c,
                                         threads or 1, prune, key=f"vtrain-{key[:12]}-{nonce}-chunk-{c}",
                                         retries=RETRIES, pure=False))
        chunk_of = {f.key: c for f, c in zip(futures, todo)}
        for fut in as_completed(futures):
            try:
                info = fut.result()
            except InputError:
                raise
            except Exception as e:      # lost workers beyond allowed-failures, a scheduler gone
                raise _cluster_failure(scheduler, chunk_of.get(fut.key), e) from None
            record(info)
            if on_progress:
                on_progress(info["points"])
    finally:
        for f in futures:
            if not f.done():
                f.cancel()
        close()
