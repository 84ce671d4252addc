"""Fit collective-communication parameters to nccl-tests measurements.

Reads the plain text that nccl-tests' ``*_perf`` binaries print (any collective) or the CSV
form of vTrain's ``AR_GPU*_LUT`` tables, and fits, by weighted linear least squares on relative
error, the model of :mod:`vtrain_fast.model.comm`::

    time = latency_s + steps(n) * step_latency_s + factor(n) * size / (link_Bps * efficiency)

with ``steps = 2(n-1)``, ``factor = 2(n-1)/n`` for all-reduce; ``n-1`` and ``(n-1)/n`` for
all-gather, reduce-scatter and all-to-all; ``0`` and ``1`` for send/recv (nccl-tests' busbw
definitions, ``doc/PERFORMANCE.md``).
"""
from __future__ import annotations

import math

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.optimize import nnls

from ..io.errors import InputError
from ..io.inputs import MAX_TEXT_BYTES, read_input_bytes
from ..model.records import MACHINE

# Largest rank count of a table (the largest job of a sweep, spec.INT_RANGES["num_gpus"]).
MAX_RANKS = 100_000_000
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "alltoall", "sendrecv")


@dataclass
class Table:
    """One nccl-tests run: ``n`` ranks, collective name, sizes (bytes) and times (seconds)."""
    path: str
    collective: str
    n: int
    size_bytes: np.ndarray
    time_s: np.ndarray


def _factors(collective: str, n: int, tree: bool = False) -> tuple[float, float]:
    """(latency steps, bytes-through-each-link factor) of one collective over ``n`` ranks; with
    ``tree``, the all-reduce's double binary tree (``2 * floor(log2 n)`` steps)."""
    if collective == "all_reduce" and tree:
        return 2.0 * math.floor(math.log2(n)), 2.0 * (n - 1) / n
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
    text = read_input_bytes(p, "nccl-tests output file", MAX_TEXT_BYTES).decode("utf-8", errors="replace")
    collective = collective or _guess_collective(p.name) or _guess_collective(text[:2000])
    if collective not in COLLECTIVES:
        raise InputError(str(p), "collective", collective, ", ".join(COLLECTIVES),
                         "pass --collective or name the file after the collective (e.g. all_reduce_8gpu.txt)")
    sizes, times = [], []
    if text.lstrip().startswith("size(B)"):           # vTrain CSV: size,count,type,time(ns),busbw,...
        rows = [line.split(",") for line in text.splitlines()[1:]]
        size_col, time_col, scale = 0, 3, 1e-9
    else:                                              # nccl-tests text, columns named by its header
        size_col, time_col, scale = _header_columns(text)
        rows = [line.split() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    for parts in rows:
        try:
            size, time = float(parts[size_col]), float(parts[time_col]) * scale
        except (ValueError, IndexError):
            continue
        if size > 0 and time > 0 and np.isfinite(size) and np.isfinite(time):
            sizes.append(size)
            times.append(time)
    if n is None:
        ranks = len(re.findall(r"^#\s+Rank\s+\d+", text, flags=re.M))
        m = re.search(r"(\d+)\s*gpus?\b", p.name, flags=re.I) or re.search(r"gpu_?(\d+)", p.name, flags=re.I)
        n = ranks or (int(m.group(1)) if m else None)
    if not n or not 2 <= n <= MAX_RANKS:
        raise InputError(str(p), "ranks", n, f"a whole number from 2 to {MAX_RANKS:,}",
                         "pass --ranks N, the GPUs the table was measured on")
    if len(sizes) < 3:
        raise InputError(str(p), "data rows", len(sizes), "at least 3 'size count type ... time' rows",
                         "give the stdout of an nccl-tests *_perf binary")
    return Table(str(p), collective, int(n), np.array(sizes), np.array(times))


def _header_columns(text: str) -> tuple[int, int, float]:
    """Column of the size and of the (out-of-place) time in nccl-tests text output, from its
    ``#  size  count  type  redop  root  time ...`` header (older versions lack ``root``);
    times are in microseconds."""
    for line in text.splitlines():
        if line.startswith("#"):
            tokens = line.lstrip("#").split()
            if "size" in tokens and "time" in tokens:
                return tokens.index("size"), tokens.index("time"), 1e-6
    return 0, 5, 1e-6


LATENCY_MAX_S = 1e-2
STEP_LATENCY_MAX_S = 1e-3
# A fit with a value clipped to its bound and a MAPE above this is refused, not written.
MAX_CLIPPED_MAPE_PCT = 10.0


def fit_tables(tables: list[Table], link_GBps: float, gpus_per_node: int | None = None,
               hw=None) -> dict:
    """Fit latency, per-step latency and bus-bandwidth efficiency to all tables at once.

    Parameters
    ----------
    tables : list of Table
    link_GBps : float
        Link bandwidth per GPU per direction, 10^9 bytes/s (the preset's NVLink or NIC).
    gpus_per_node : int, optional
        Inter-node mode: the tables are all-reduces over ``n = nodes * g`` ranks with
        ``g = min(n, gpus_per_node)`` per node. The model is then the kernel's hierarchical
        all-reduce (:func:`vtrain_fast.model.comm.group_allreduce_s`): the intra-node
        reduce-scatter and all-gather, priced with the machine vector ``hw``, are subtracted and
        the inter-node tree all-reduce of ``size / g`` over ``nodes`` ranks is fitted to the
        rest (rows where the rest is not positive are left out).
    hw : numpy.ndarray, optional
        Machine vector: the intra-node part in inter-node mode, and the per-step latency kept
        when every table has the same number of steps (default 0 without ``hw``).

    Returns
    -------
    dict
        ``latency_s``, ``step_latency_s``, ``efficiency`` (clipped to the allowed ranges),
        the fit's ``mape_pct`` with the clipped values, ``rows``, ``clipped`` (names of
        the values that hit a bound) and ``step_latency_kept`` (True when every table has the
        same number of steps, so that a per-step latency cannot be told from the fixed one:
        it then keeps ``hw``'s value and only latency and efficiency are fitted).

    Raises
    ------
    InputError
        Inter-node tables that do not span two or more nodes, or that are not all-reduces;
        ``gpus_per_node`` below 1 (0 does not mean "not given": pass None for an intra-node fit);
        a link bandwidth that is not a finite number > 0.
    """
    from ..model.comm import intra_allgather_s
    if gpus_per_node is not None and not gpus_per_node >= 1:     # 0 is not "not given"
        raise InputError(tables[0].path if tables else "<tables>", "gpus_per_node", gpus_per_node,
                         "a whole number >= 1 (GPUs per node of the measured cluster)",
                         "give --gpus-per-node, e.g. 8")
    if not (math.isfinite(link_GBps) and link_GBps > 0):
        raise InputError(tables[0].path if tables else "<tables>", "link bandwidth", link_GBps,
                         "a finite number of GB/s > 0", "check --inter-node-Gbps and the preset")
    rows, target, fixed = [], [], []
    for t in tables:
        if gpus_per_node is not None:
            if t.collective != "all_reduce":
                raise InputError(t.path, "collective", t.collective, "all_reduce for --inter-node fits")
            g = min(t.n, gpus_per_node)
            nodes = t.n // g
            if nodes < 2 or t.n % g:
                raise InputError(t.path, "ranks", t.n, f"a multiple of {gpus_per_node} spanning 2 or more nodes",
                                 "give --gpus-per-node or use tables measured across nodes")
            steps, factor = _factors("all_reduce", nodes, tree=True)
            for s, y in zip(t.size_bytes, t.time_s):
                intra = 2.0 * intra_allgather_s(float(s), float(g), hw)
                if y > intra:
                    rows.append((1.0, steps, factor * s / g / (link_GBps * 1e9)))
                    target.append(y)
                    fixed.append(intra)
        else:
            steps, factor = _factors(t.collective, t.n)
            for s, y in zip(t.size_bytes, t.time_s):
                rows.append((1.0, steps, factor * s / (link_GBps * 1e9)))
                target.append(y)
                fixed.append(0.0)
    if not rows:
        raise InputError(tables[0].path, "rows", 0, "measurements slower than the intra-node phases",
                         "these tables do not show the inter-node link; check --gpus-per-node")
    a = np.array(rows)
    y = np.array(target)
    rest = y - np.array(fixed)
    w = 1.0 / y                       # relative error
    kept = bool(np.ptp(a[:, 1]) == 0.0 and a[0, 1] > 0.0)   # sendrecv tables have no steps at all
    if kept:
        
        step = 0.0 if hw is None else float(hw[MACHINE.inter_node_step_latency_s if gpus_per_node else MACHINE.intra_node_step_latency_s])
        sub, _ = nnls((a[:, [0, 2]]) * w[:, None], (rest - step * a[:, 1]) * w)
        coef = np.array([sub[0], step, sub[1]])
    else:
        coef, _ = nnls(a * w[:, None], rest * w)   # non-negative latencies and inverse bandwidth
    clipped = []
    bounds = ((0, LATENCY_MAX_S, "latency_s"), (1, STEP_LATENCY_MAX_S, "step_latency_s"))
    for i, hi, name in bounds:
        if coef[i] > hi:
            coef[i] = hi
            clipped.append(name)
    if coef[2] < 1.0:                 # busbw above the link bandwidth
        coef[2] = 1.0
        clipped.append("efficiency")
    pred = a @ coef + np.array(fixed)
    return dict(latency_s=float(coef[0]), step_latency_s=float(coef[1]), efficiency=float(1.0 / coef[2]),
                mape_pct=float(np.mean(np.abs(pred - y) / y) * 100), rows=int(len(y)), clipped=clipped,
                step_latency_kept=kept)


def check_fit(res: dict, where: str, link_GBps: float) -> None:
    """Refuse a fit of :func:`fit_tables` that ends on a bound (``res["clipped"]``) with a MAPE
    above :data:`MAX_CLIPPED_MAPE_PCT`: the model does not describe the tables with the given
    link and node size, and writing its values would only hide that.

    Raises
    ------
    InputError
        Naming the MAPE, the clipped values and what to check.
    """
    if res["clipped"] and res["mape_pct"] > MAX_CLIPPED_MAPE_PCT:
        raise InputError(where, "fit", f"MAPE {res['mape_pct']:.1f}% with {', '.join(res['clipped'])} "
                         "at the allowed bound",
                         f"a fit within the bounds, or one with MAPE <= {MAX_CLIPPED_MAPE_PCT:g}%",
                         f"check --gpu, --ranks, --gpus-per-node, --inter-node and the link bandwidth "
                         f"({link_GBps:g} GB/s per GPU); no calibration was written")
