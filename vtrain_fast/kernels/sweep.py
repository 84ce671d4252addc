"""Parallel drivers: one ``prange`` loop over many configurations.

:func:`sweep_chunk` decodes flat indices ``start .. start+n-1`` into axis values (mixed radix,
last axis fastest; no Cartesian product is ever built) and :func:`evaluate_rows` walks explicit
configurations. Both call :func:`vtrain_fast.kernels.step.step` for each point and write one
column of the preallocated output matrices per point; every thread writes only its own columns.
"""
from __future__ import annotations

import math

import numpy as np
from numba import prange

from .._jit import jit, pjit
from .params import H_GPUS_PER_NODE
from .step import BAD_NUM_GPUS, fill_nan, step

# Axis order of a sweep (first = slowest varying, last = fastest).
AXES = ("model", "num_tokens", "gpu", "cluster_size", "tp", "pp", "micro_batch_size",
        "global_batch_size", "recompute")
NUM_AXES = len(AXES)
(A_MODEL, A_TOKENS, A_GPU, A_SIZE, A_TP, A_PP, A_MBS, A_GBS, A_RECOMPUTE) = range(NUM_AXES)

# Integer input columns written by the sweep kernel: rows of the int64 input matrix.
INPUT_NAMES = (
    "model_index", "gpu_index", "num_layers", "hidden_size", "num_attention_heads",
    "num_query_groups", "ffn_hidden_size", "vocab_size", "seq_length", "num_gpus", "num_nodes",
    "tp", "pp", "dp", "micro_batch_size", "global_batch_size", "recompute",
)
NUM_INPUTS = len(INPUT_NAMES)
(I_MODEL, I_GPU, I_LAYERS, I_HIDDEN, I_HEADS, I_GROUPS, I_FFN, I_VOCAB, I_SEQ, I_NUM_GPUS,
 I_NUM_NODES, I_TP, I_PP, I_DP, I_MBS, I_GBS, I_RECOMPUTE) = range(NUM_INPUTS)


@jit
def decode_index(index, radices, digits):
    """Decode a flat index into mixed-radix digits (last axis fastest).

    Parameters
    ----------
    index : int
        Flat index in ``[0, prod(radices))``.
    radices : numpy.ndarray
        ``int64``, shape ``(NUM_AXES,)``: the length of each axis.
    digits : numpy.ndarray
        ``int64``, shape ``(NUM_AXES,)``: output, the index into each axis.
    """
    rem = index
    for k in range(radices.shape[0] - 1, -1, -1):
        digits[k] = rem % radices[k]
        rem //= radices[k]


@pjit
def sweep_chunk(start, n, radices, models, tokens, gpus, hw_table, sizes, sizes_in_nodes,
                tps, pps, mbss, gbss, recomputes, inputs, token_col, out, status):
    """Evaluate the ``n`` grid points ``start .. start+n-1``.

    Parameters
    ----------
    start, n : int
        First flat index and number of points.
    radices : numpy.ndarray
        ``int64``, shape ``(NUM_AXES,)``, lengths of the axes in :data:`AXES` order.
    models : numpy.ndarray
        ``int64``, shape ``(n_models, 7)``: num_layers, hidden_size, num_attention_heads,
        num_query_groups, ffn_hidden_size, vocab_size, seq_length.
    tokens : numpy.ndarray
        ``float64``, tokens to train on.
    gpus : numpy.ndarray
        ``int64``, row of ``hw_table`` for each value of the gpu axis.
    hw_table : numpy.ndarray
        ``float64``, shape ``(n_gpu_types, NUM_HW_FIELDS)``, machine vectors.
    sizes : numpy.ndarray
        ``int64``, cluster sizes, in GPUs or (when ``sizes_in_nodes``) in nodes.
    tps, pps, mbss, gbss, recomputes : numpy.ndarray
        ``int64`` axis values.
    inputs : numpy.ndarray
        ``int64``, shape ``(NUM_INPUTS, >= n)``, output: decoded inputs (:data:`INPUT_NAMES`).
    token_col : numpy.ndarray
        ``float64``, shape ``(>= n,)``, output: tokens to train on.
    out : numpy.ndarray
        ``float64``, shape ``(NUM_OUTPUTS, >= n)``, output: see ``step.OUTPUT_NAMES``.
    status : numpy.ndarray
        ``int8``, shape ``(>= n,)``, output: status codes.
    """
    for j in prange(n):
        digits = np.empty(radices.shape[0], dtype=np.int64)
        decode_index(start + j, radices, digits)
        mi = digits[A_MODEL]
        gi = gpus[digits[A_GPU]]
        hw = hw_table[gi]
        gpn = int(hw[H_GPUS_PER_NODE])
        size = sizes[digits[A_SIZE]]
        num_gpus = size * gpn if sizes_in_nodes else size
        t = tps[digits[A_TP]]
        p = pps[digits[A_PP]]
        d = num_gpus // (t * p)
        inputs[I_MODEL, j] = mi
        inputs[I_GPU, j] = gi
        for k in range(7):
            inputs[I_LAYERS + k, j] = models[mi, k]
        inputs[I_NUM_GPUS, j] = num_gpus
        inputs[I_NUM_NODES, j] = (num_gpus + gpn - 1) // gpn
        inputs[I_TP, j] = t
        inputs[I_PP, j] = p
        inputs[I_DP, j] = d
        inputs[I_MBS, j] = mbss[digits[A_MBS]]
        inputs[I_GBS, j] = gbss[digits[A_GBS]]
        inputs[I_RECOMPUTE, j] = recomputes[digits[A_RECOMPUTE]]
        token_col[j] = tokens[digits[A_TOKENS]]
        if d <= 0 or num_gpus % (t * p) != 0:
            fill_nan(out, j)
            status[j] = BAD_NUM_GPUS
            continue
        status[j] = step(models[mi, 0], models[mi, 1], models[mi, 2], models[mi, 3],
                         models[mi, 4], models[mi, 5], models[mi, 6],
                         inputs[I_GBS, j], inputs[I_MBS, j], t, p, d,
                         inputs[I_RECOMPUTE, j], token_col[j], hw, out, j)


@pjit
def evaluate_rows(cols, tokens, hw_rows, out, status):
    """Evaluate explicit configurations, one per column of ``cols``.

    Parameters
    ----------
    cols : numpy.ndarray
        ``int64``, shape ``(13, n)``: num_layers, hidden_size, num_attention_heads,
        num_query_groups, ffn_hidden_size, vocab_size, seq_length, global_batch_size,
        micro_batch_size, tp, pp, dp, recompute (0/1).
    tokens : numpy.ndarray
        ``float64``, shape ``(n,)``, tokens to train on.
    hw_rows : numpy.ndarray
        ``float64``, shape ``(n, NUM_HW_FIELDS)``, the machine vector of each row.
    out : numpy.ndarray
        ``float64``, shape ``(NUM_OUTPUTS, n)``, output.
    status : numpy.ndarray
        ``int8``, shape ``(n,)``, output.
    """
    for j in prange(cols.shape[1]):
        status[j] = step(cols[0, j], cols[1, j], cols[2, j], cols[3, j], cols[4, j], cols[5, j],
                         cols[6, j], cols[7, j], cols[8, j], cols[9, j], cols[10, j], cols[11, j],
                         cols[12, j], tokens[j], hw_rows[j], out, j)
