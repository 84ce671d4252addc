"""Axes of a sweep as kernel arrays, and the flat-index encoding (Python twins of the kernel).

A grid point's flat index is a mixed-radix number over the axes in
:data:`vtrain_fast.model.records.AXES` order, last axis fastest. The engine hands index ranges
to :func:`vtrain_fast.model.sweep.sweep_chunk`, which decodes them; the grid itself is never
materialised.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..io.errors import InputError
from ..hardware.gpus import machine_vector
from ..model.records import AXES, HW_FIELDS, NUM_MODEL_FIELDS
from ..model.sweep import PREFIX_AXES, prefix_table
from .spec import RECOMPUTE_VALUES, SweepSpec, refused_cases, repeat_cases

INT64_MAX = 2 ** 63 - 1
# Largest pruning table built (entries of uint8); beyond it sweeps run unpruned.
MAX_PREFIX_TABLE = 1 << 26


@dataclass(frozen=True)
class Grid:
    """Kernel-ready axes.

    Attributes
    ----------
    radices : numpy.ndarray
        ``int64``, shape ``(NUM_AXES,)``: length of each axis.
    models : numpy.ndarray
        ``int64``, shape ``(n_models, 7)``, see ``ModelShape.as_row``.
    model_names : list of str
    gpu_names : list of str
        Distinct GPU preset names, in spec order.
    gpu_name_codes : numpy.ndarray
        ``int32``, shape ``(n_gpus,)``: index into ``gpu_names`` per gpu-axis value (several
        values share a name when training settings are axes).
    tokens : numpy.ndarray
        ``float64``.
    gpus : numpy.ndarray
        ``int64``, index into ``hw_table`` per gpu-axis value.
    hw_table : numpy.ndarray
        ``float64``, shape ``(n_gpus, NUM_HW_FIELDS)``.
    sizes, tps, cps, pps, mbss, gbss, recomputes : numpy.ndarray
        ``int64`` axis values.
    sizes_in_nodes : bool
    num_points : int
    """

    radices: np.ndarray
    models: np.ndarray
    model_names: list
    tokens: np.ndarray
    gpus: np.ndarray
    gpu_names: list
    gpu_name_codes: np.ndarray
    hw_table: np.ndarray
    sizes: np.ndarray
    sizes_in_nodes: bool
    tps: np.ndarray
    cps: np.ndarray
    pps: np.ndarray
    mbss: np.ndarray
    gbss: np.ndarray
    recomputes: np.ndarray
    num_points: int

    def kernel_args(self):
        """Axis arguments of ``sweep_chunk`` after ``start, n``, in order."""
        return (self.radices, self.models, self.tokens, self.gpus, self.hw_table, self.sizes,
                self.sizes_in_nodes, self.tps, self.cps, self.pps, self.mbss, self.gbss, self.recomputes)


def build_grid(spec: SweepSpec) -> Grid:
    """Turn a validated spec into kernel arrays.

    Raises
    ------
    InputError
        If the number of points does not fit in a signed 64-bit index.
    """
    n = spec.num_points
    check_index_space(n, spec.path)
    recompute_codes = [RECOMPUTE_VALUES.index(r) for r in spec.recompute]
    arrays = dict(
        model=[m.as_row() for m in spec.models], num_tokens=spec.num_tokens,
        gpu=list(range(len(spec.gpus))), cluster_size=spec.cluster_sizes, tp=spec.tp, cp=spec.cp, pp=spec.pp,
        micro_batch_size=spec.micro_batch_size, global_batch_size=spec.global_batch_size,
        recompute=recompute_codes,
    )
    radices = np.array([len(arrays[a]) for a in AXES], dtype=np.int64)
    names = list(dict.fromkeys(g.name for g in spec.gpus))
    i64 = lambda x: np.ascontiguousarray(x, dtype=np.int64)  # noqa: E731
    return Grid(
        radices=radices,
        models=i64(arrays["model"]).reshape(len(spec.models), NUM_MODEL_FIELDS),
        model_names=[m.name for m in spec.models],
        tokens=np.array(spec.num_tokens, dtype=np.float64),
        gpus=i64(arrays["gpu"]),
        gpu_names=names,
        gpu_name_codes=np.array([names.index(g.name) for g in spec.gpus], dtype=np.int32),
        hw_table=_hw_table(spec.gpus),
        sizes=i64(spec.cluster_sizes), sizes_in_nodes=spec.sizes_in_nodes,
        tps=i64(spec.tp), cps=i64(spec.cp), pps=i64(spec.pp), mbss=i64(spec.micro_batch_size),
        gbss=i64(spec.global_batch_size), recomputes=i64(recompute_codes),
        num_points=n,
    )


def _hw_table(presets) -> np.ndarray:
    """Machine vectors of the gpu axis, ``float64`` ``(len(presets), NUM_HW_FIELDS)``, with
    their ``repeat_cases`` and ``refused_cases`` (:func:`repeat_cases`, :func:`refused_cases`)."""
    table = np.stack([machine_vector(g) for g in presets])
    refused = refused_cases(presets)
    table[:, HW_FIELDS.index("repeat_cases")] = repeat_cases(presets, refused)
    table[:, HW_FIELDS.index("refused_cases")] = refused
    return table


def decode(index: int, radices) -> list[int]:
    """Plain-Python twin of ``model.sweep.decode_index``: flat index -> digit per axis."""
    digits = [0] * len(radices)
    for k in range(len(radices) - 1, -1, -1):
        index, digits[k] = divmod(index, int(radices[k]))
    return digits


def encode(digits, radices) -> int:
    """Inverse of :func:`decode`: digits per axis -> flat index."""
    index = 0
    for d, r in zip(digits, radices):
        index = index * int(r) + int(d)
    return index


def count_points(radices) -> int:
    """Exact number of grid points (Python int; no overflow)."""
    return math.prod(int(r) for r in radices)


def check_index_space(num_points: int, where: str = "<spec>") -> None:
    """Check that flat indices ``0 .. num_points-1`` (and every chunk end) fit in ``int64``.

    Raises
    ------
    InputError
        If ``num_points > 2**63 - 1``.
    """
    if num_points > INT64_MAX:
        raise InputError(where, "number of points", num_points,
                         f"at most {INT64_MAX:,} (2^63 - 1, the int64 flat index)",
                         "split the sweep into several specs or shorten some axes")


def pruning_table(grid: Grid) -> np.ndarray:
    """Per prefix of the axes :data:`~vtrain_fast.model.sweep.PREFIX_AXES` (model, gpu,
    cluster_size, tp, cp, pp), whether any point under it can be feasible.

    A prefix is infeasible when num_gpus does not split into a layout (``tp * cp * pp`` must divide it) or the model breaks a
    heads, layers or sequence-length (``2 cp``) divisibility rule for that ``tp``/``cp``/``pp``; then every combination of the
    remaining axes (micro_batch_size, global_batch_size, recompute, a contiguous run of the
    flat index) is infeasible too and the scan kernel skips it without evaluating it.

    Returns
    -------
    numpy.ndarray
        ``uint8``, shape ``(prod(radices[PREFIX_AXES]),)``; shape ``(0,)`` (no pruning) when
        the table would exceed :data:`MAX_PREFIX_TABLE` entries.
    """
    size = math.prod(int(grid.radices[a]) for a in PREFIX_AXES)
    if size > MAX_PREFIX_TABLE:
        return np.zeros(0, dtype=np.uint8)
    table = np.empty(size, dtype=np.uint8)
    prefix_table(grid.radices, grid.models, grid.gpus, grid.hw_table, grid.sizes,
                 grid.sizes_in_nodes, grid.tps, grid.cps, grid.pps, table)
    return table
