"""Fit collective-communication parameters to nccl-tests measurements.

Reads the plain text that nccl-tests' ``*_perf`` binaries print (any collective) or the CSV
form of vTrain's ``AR_GPU*_LUT`` tables, and fits, by weighted linear least squares on relative
error, the model of :mod:`vtrain_fast.kernels.comm`::

    time = latency_s + steps(n) * step_latency_s + factor(n) * size / (link_Bps * efficiency)

with ``steps = 2(n-1)``, ``factor = 2(n-1)/n`` for all-reduce; ``n-1`` and ``(n-1)/n`` for
all-gather, reduce-scatter and all-to-all; ``0`` and ``1`` for send/recv (nccl-tests' busbw
definitions, ``doc/PERFORMANCE.md``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.optimize import nnls

from .errors import InputError

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "alltoall", "sendrecv")


@dataclass
class Table:
    """One nccl-tests run: ``n`` ranks, collective name, sizes (bytes) and times (seconds)."""
    path: str
    collective: str
    n: int
    size_bytes: np.ndarray
    time_s: np.ndarray


def _factors(collective: str, n: int) -> tuple[float, float]:
    if collective == "all_reduce":
        return 2.0 * (n - 1), 2.0 * (n - 1) / n
    if collective == "sendrecv":
        return 0.0, 1.0
    return float(n - 1), (n - 1) / n


def _guess_collective(name: str) -> str | None:
    low = name.lower().replace("-", "_")
    for c, keys in (("all_reduce", ("all_reduce", "allreduce", "ar_")), ("all_gather", ("all_gather", "allgather")),
                    ("reduce_scatter", ("reduce_scatter", "reducescatter")), ("alltoall", ("alltoall", "all_to_all")),
                    ("sendrecv", ("sendrecv", "send_recv", "p2p"))):
        if any(k in low for k in keys):
            return c
    return None


def read_table(path: str | Path, collective: str | None = None, n: int | None = None) -> Table:
    """Read one nccl-tests output file (text or vTrain CSV).

    Parameters
    ----------
    path : str or Path
    collective : str, optional
        One of :data:`COLLECTIVES`; guessed from the file name or the text when omitted.
    n : int, optional
        Ranks; read from the text (``#  Rank`` lines or ``nGpus``) or the file name
        (``..._8gpu...``, ``GPU8``) when omitted.

    Raises
    ------
    InputError
        Unreadable file, no data rows, unknown collective or rank count.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise InputError(str(p), "file", str(p), "a readable nccl-tests output file", e.strerror or "") from None
    collective = collective or _guess_collective(p.name) or _guess_collective(text[:2000])
    if collective not in COLLECTIVES:
        raise InputError(str(p), "collective", collective, ", ".join(COLLECTIVES),
                         "pass --collective or name the file after the collective (e.g. all_reduce_8gpu.txt)")
    sizes, times = [], []
    if text.lstrip().startswith("size(B)"):           # vTrain CSV: size,count,type,time(ns),busbw,...
        for line in text.splitlines()[1:]:
            parts = line.split(",")
            if len(parts) >= 4 and parts[0].strip().isdigit():
                sizes.append(float(parts[0]))
                times.append(float(parts[3]) * 1e-9)
    else:                                              # nccl-tests text: size count type redop root time(us) ...
        for line in text.splitlines():
            if line.startswith("#"):
                continue
            parts = line.split()
            if len(parts) >= 8 and parts[0].isdigit():
                try:
                    sizes.append(float(parts[0]))
                    times.append(float(parts[5]) * 1e-6)
                except ValueError:
                    continue
    if n is None:
        ranks = len(re.findall(r"^#\s+Rank\s+\d+", text, flags=re.M))
        m = re.search(r"(\d+)\s*gpus?\b", p.name, flags=re.I) or re.search(r"gpu_?(\d+)", p.name, flags=re.I)
        n = ranks or (int(m.group(1)) if m else None)
    if not n or n < 2:
        raise InputError(str(p), "ranks", n, "2 or more", "pass --ranks N")
    if len(sizes) < 3:
        raise InputError(str(p), "data rows", len(sizes), "at least 3 'size count type ... time' rows",
                         "give the stdout of an nccl-tests *_perf binary")
    keep = np.array(sizes) > 0
    return Table(str(p), collective, int(n), np.array(sizes)[keep], np.array(times)[keep])


def fit_tables(tables: list[Table], link_GBps: float) -> dict:
    """Fit latency, per-step latency and bus-bandwidth efficiency to all tables at once.

    Parameters
    ----------
    tables : list of Table
    link_GBps : float
        Link bandwidth per GPU per direction, 10^9 bytes/s (the preset's NVLink or NIC).

    Returns
    -------
    dict
        ``latency_s``, ``step_latency_s``, ``efficiency``, and the fit's ``mape_pct``
        and ``rows``.
    """
    rows, target = [], []
    for t in tables:
        steps, factor = _factors(t.collective, t.n)
        for s, y in zip(t.size_bytes, t.time_s):
            rows.append((1.0, steps, factor * s / (link_GBps * 1e9)))
            target.append(y)
    a = np.array(rows)
    y = np.array(target)
    w = 1.0 / y                       # relative error
    coef, _ = nnls(a * w[:, None], y * w)   # non-negative latencies and inverse bandwidth
    coef[2] = max(coef[2], 1e-6)
    pred = a @ coef
    return dict(latency_s=float(coef[0]), step_latency_s=float(coef[1]),
                efficiency=float(min(1.0, 1.0 / coef[2])),
                mape_pct=float(np.mean(np.abs(pred - y) / y) * 100), rows=int(len(y)))
