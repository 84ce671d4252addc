"""Parallel drivers: one ``prange`` loop over many configurations.

:func:`sweep_chunk` decodes flat indices ``start .. start+n-1`` into axis values (mixed radix,
last axis fastest; no Cartesian product is ever built) and writes one full row per point;
:func:`sweep_points` does the same for an explicit list of flat indices; :func:`scan_chunk`
evaluates a range but keeps only the indices (and objective values) of feasible points that may
survive a reduction (all feasible points, a Pareto frontier, or a top-K); :func:`evaluate_rows`
walks explicit configurations with :func:`vtrain_fast.model.step.step`. Every thread writes
only its own columns.

The range drivers split their range into blocks of ``BLOCK`` consecutive points (one ``prange``
iteration each). A block decodes its first index once and then steps an odometer over the axis
digits. The grid drivers evaluate the same parts as ``step`` (``micro_batch_costs``,
``split_costs``, ``model_totals``, ``schedule``) but keep the first three in block caches
(:func:`refresh_prefix`, :func:`grid_point`): consecutive points differ mostly in the batch axes
and recompute, which only the schedule reads, so a point costs the schedule plus a handful of
loads, and its outputs are bit-for-bit those of ``step``.
"""
from __future__ import annotations

import math

import numpy as np
from numba import prange

from ._jit import compile_in_helper, jit, jit_inline, jit_inline_ir, pjit
from .arch import Arch
from .layout import Layout, split_world
from .records import (AXIS, BAD_NUM_GPUS, INPUT, INPUT_NAMES, MACHINE, MODEL, NUM_AXES, NUM_HW_FIELDS, NUM_INPUTS, NUM_MICRO,
                      NUM_MODEL_FIELDS, NUM_OUTPUTS, NUM_SPLIT, NUM_STATUS, NUM_TOTALS, OK, REFUSED, REPEAT, ROW,
                      ROW_FIELDS, MicroCosts, SplitCosts, Totals)
from .costs import micro_batch_costs, split_costs
from .layer_split import chunks_split, virtual_stages
from .pipeline import schedule
from .rules import (fill_nan, refused, refused_context_parallel, refused_experts, repeats, validate_batch,
                    validate_interleaving, validate_split)
from .step import step
from .totals import model_totals


# Axes of the pruning table (everything the num_gpus, heads and layers rules depend on); the
# axes after AXIS.pp only enter the batch rule, so an infeasible prefix rules out a whole
# contiguous run of ``radices[AXIS.micro_batch_size] * radices[AXIS.global_batch_size] * radices[AXIS.recompute]`` points.
PREFIX_AXES = (AXIS.model, AXIS.gpu, AXIS.cluster_size, AXIS.tp, AXIS.cp, AXIS.pp)


# Points per prange iteration of the range drivers (one decode of the flat index each).
BLOCK = 1024
# The row driver evaluates SCRATCH points at a time into thread-local columns that stay in L1
# (64 x (17 + 1 + NUM_OUTPUTS) x 8 B ~ 21 KB) and then copies them out, 64 contiguous values
# per column: writing each point straight into ~40 output columns costs more than the model.
SCRATCH = 64

# Where a reduction objective comes from (scan_chunk's ``obj_src``).
SRC_OUTPUT, SRC_INPUT, SRC_TOKENS = 0, 1, 2
# scan_chunk modes.
KEEP_FEASIBLE, KEEP_FRONTIER, KEEP_TOP = 0, 1, 2


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


@jit
def advance_digits(digits, radices):
    """Step mixed-radix ``digits`` to the next flat index in place (odometer, last axis
    fastest) and return the first (slowest) axis that changed; after the last index the
    digits wrap to zero and -1 is returned."""
    k = radices.shape[0] - 1
    while k >= 0:
        digits[k] += 1
        if digits[k] < radices[k]:
            return k
        digits[k] = 0
        k -= 1
    return -1


@jit
def prefix_index(digits, radices):
    """Row of the pruning table for ``digits``: mixed radix over :data:`PREFIX_AXES`."""
    return (((((digits[AXIS.model] * radices[AXIS.gpu] + digits[AXIS.gpu]) * radices[AXIS.cluster_size]
               + digits[AXIS.cluster_size]) * radices[AXIS.tp] + digits[AXIS.tp]) * radices[AXIS.cp] + digits[AXIS.cp]) * radices[AXIS.pp]
            + digits[AXIS.pp])


@jit
def prefix_values(digits, gpus, hw_table, sizes, sizes_in_nodes, tps, cps, pps):
    """Quantities fixed by the axes up to ``pp``: ``(gpu_index, num_gpus, num_nodes, layout,
    ok)``; the layout (:func:`~vtrain_fast.model.layout.split_world`) gives dp the rest, and
    ``ok`` is False when tp x cp x pp does not divide num_gpus."""
    gi = gpus[digits[AXIS.gpu]]
    gpn = int(hw_table[gi, MACHINE.gpus_per_node])
    size = sizes[digits[AXIS.cluster_size]]
    num_gpus = size * gpn if sizes_in_nodes else size
    lay, ok = split_world(num_gpus, tps[digits[AXIS.tp]], cps[digits[AXIS.cp]], pps[digits[AXIS.pp]])
    return gi, num_gpus, (num_gpus + gpn - 1) // gpn, lay, ok


@jit
def arch_of(values, at):
    """The :data:`~vtrain_fast.model.arch.Arch` of one model's integer columns, by field name.

    Parameters
    ----------
    values : numpy.ndarray
        ``int64``, shape ``(len(at),)``: a row of the model table, or a column of explicit
        configurations.
    at : tuple
        The index record of that layout (:data:`~vtrain_fast.model.records.MODEL` or
        :data:`~vtrain_fast.model.records.ROW`); both name the flag and MoE columns as ``Arch``'s fields.
    """
    return Arch(gated_mlp=float(values[at.gated_mlp]),
                normalization=float(values[at.normalization]),
                position_embedding_type=float(values[at.position_embedding_type]),
                add_bias_linear=float(values[at.add_bias_linear]),
                untie_embeddings_and_output_weights=float(values[at.untie_embeddings_and_output_weights]),
                num_experts=float(values[at.num_experts]),
                moe_router_topk=float(values[at.moe_router_topk]),
                moe_ffn_hidden_size=float(values[at.moe_ffn_hidden_size]),
                moe_shared_expert_intermediate_size=float(values[at.moe_shared_expert_intermediate_size]),
                moe_layer_step=float(values[at.moe_layer_step]),
                moe_first_dense_layers=float(values[at.moe_first_dense_layers]),
                kv_channels=float(values[at.kv_channels]),
                multi_latent_attention=float(values[at.multi_latent_attention]),
                q_lora_rank=float(values[at.q_lora_rank]),
                kv_lora_rank=float(values[at.kv_lora_rank]),
                qk_head_dim=float(values[at.qk_head_dim]),
                qk_pos_emb_head_dim=float(values[at.qk_pos_emb_head_dim]),
                v_head_dim=float(values[at.v_head_dim]))


@jit
def model_arch(models, mi):
    """The :data:`~vtrain_fast.model.arch.Arch` of row ``mi`` of the model table."""
    return arch_of(models[mi], MODEL)


def helper_kernels():
    """The kernels a cold driver's compile leaves to the compile helper
    (:func:`~vtrain_fast.model._jit.compile_in_helper`): those :func:`grid_point` and
    :func:`~vtrain_fast.model.step.step` reach after micro_batch_costs, the largest, which the
    driver compiles meanwhile; each with example arguments typed as those callers pass them
    (float64 shapes, sizes and token counts, a Layout of int64 sizes, a machine vector: a row of
    the C-contiguous machine table, the Arch record of float64 codes, the records of the other
    parts, the output table and an int64 column)."""
    hw, arch, lay = np.zeros(NUM_HW_FIELDS), Arch(*(0.0,) * len(Arch._fields)), Layout(1, 1, 1, 1)
    return ((split_costs, (0.0,) * 7 + (lay, hw, arch)),
            (model_totals, (0.0,) * 8 + (arch,)),
            (schedule, (0.0,) * 6 + (lay, 0, 0.0, hw, EMPTY_MICRO, EMPTY_SPLIT, EMPTY_TOTALS,
                                     np.zeros((NUM_OUTPUTS, 1)), 0)))


# Block caches. A block keeps, for the current prefix (the axes up to ``pp``) and token
# budget, :func:`~vtrain_fast.model.costs.split_costs` and
# :func:`~vtrain_fast.model.totals.model_totals` in ``ctx`` (a one-item list of the pair, valid
# while ``ctx_ok[0]`` is 1), and for the current (model, gpu, tp, cp)
# :func:`~vtrain_fast.model.costs.micro_batch_costs` over the micro_batch_size axis in ``micro``
# (a list of records, entry ``db`` valid while ``micro_ok[db]`` is 1). Both are filled by the
# first point that passes the shape rules. The points that share them differ only in the batch
# axes and recompute, so the full model costs them only the schedule.
EMPTY_MICRO = MicroCosts(*(math.nan,) * NUM_MICRO)      # placeholders the caches start from
EMPTY_SPLIT = SplitCosts(*(math.nan,) * NUM_SPLIT)
EMPTY_TOTALS = Totals(*(math.nan,) * NUM_TOTALS)
compile_in_helper(helper_kernels)


@jit
def refresh_prefix(digits, models, gpus, hw_table, sizes, sizes_in_nodes, tps, cps, pps, ctx_ok,
                   micro_key, micro_ok):
    """Recompute what a block caches for the prefix of ``digits`` (see the block caches above).

    Marks the block's split cache empty (``ctx_ok``, ``uint8``, shape ``(1,)``), and clears ``micro_ok``
    (``uint8``, one per micro_batch_size value) when (model, gpu, tp, cp) differs from
    ``micro_key`` (``int64``, shape ``(4,)``, updated). Returns
    ``(gpu_index, num_gpus, num_nodes, layout, ok, split_status)``, the first five as
    :func:`prefix_values`; ``split_status`` is
    :func:`~vtrain_fast.model.rules.validate_split`'s code (``BAD_NUM_GPUS`` when not ``ok``),
    or ``REFUSED`` / ``REPEAT`` where it is ``OK`` but Megatron-LM refuses the machine's settings on
    this plan (:func:`~vtrain_fast.model.rules.refused`) / the machine repeats an earlier one
    (:func:`~vtrain_fast.model.rules.repeats`).
    """
    gi, num_gpus, nodes, lay, ok = prefix_values(digits, gpus, hw_table, sizes, sizes_in_nodes, tps, cps, pps)
    mi = digits[AXIS.model]
    split_status = BAD_NUM_GPUS
    if ok:
        arch = model_arch(models, mi)
        split_status = validate_split(models[mi, MODEL.num_layers], models[mi, MODEL.hidden_size], models[mi, MODEL.num_attention_heads],
                                      models[mi, MODEL.num_query_groups], models[mi, MODEL.ffn_hidden_size], models[mi, MODEL.vocab_size],
                                      models[mi, MODEL.seq_length], lay, hw_table[gi], arch)
        if split_status == OK and (refused(lay, hw_table[gi]) or refused_context_parallel(lay, hw_table[gi])
                                   or refused_experts(lay, hw_table[gi], arch)):
            split_status = REFUSED      # Megatron-LM refuses these settings on this plan
        elif split_status == OK and repeats(lay, hw_table[gi]):
            split_status = REPEAT       # an earlier machine of the sweep has these rows
    ctx_ok[0] = 0
    if micro_key[0] != mi or micro_key[1] != gi or micro_key[2] != lay.tp or micro_key[3] != lay.cp:
        micro_key[0] = mi
        micro_key[1] = gi
        micro_key[2] = lay.tp
        micro_key[3] = lay.cp
        micro_ok[:] = 0
    return gi, num_gpus, nodes, lay, ok, split_status


@jit_inline_ir
def grid_point(mi, gi, num_gpus, num_nodes, lay, ok, split_status, db, b, B, rc, tok, models,
               hw, ctx, ctx_ok, micro, micro_ok, inputs, token_col, out, status, j):
    """Write the inputs of one point into column ``j``, evaluate it and return its status.

    ``ok``/``split_status`` come from :func:`refresh_prefix` for this point's prefix and
    ``ctx`` / ``ctx_ok`` is its cache (filled here if empty); ``micro`` (a list of
    :class:`~vtrain_fast.model.records.MicroCosts`, one per micro_batch_size value) and ``micro_ok`` are the block's micro-batch table, whose
    row ``db`` (this point's micro_batch_size digit) is filled here if empty. Not ``ok``: ``BAD_NUM_GPUS``; a shape error: NaN outputs; otherwise the same
    numbers as :func:`~vtrain_fast.model.step.step`.
    """
    inputs[INPUT.model_index, j] = mi
    inputs[INPUT.gpu_index, j] = gi
    for k in range(NUM_MODEL_FIELDS):
        inputs[INPUT.num_layers + k, j] = models[mi, k]
    inputs[INPUT.num_gpus, j] = num_gpus
    inputs[INPUT.num_nodes, j] = num_nodes
    inputs[INPUT.tp, j] = lay.tp
    inputs[INPUT.cp, j] = lay.cp
    inputs[INPUT.pp, j] = lay.pp
    inputs[INPUT.dp, j] = lay.dp
    inputs[INPUT.micro_batch_size, j] = b
    inputs[INPUT.global_batch_size, j] = B
    inputs[INPUT.recompute, j] = rc
    token_col[j] = tok
    if not ok:
        fill_nan(out, j)
        status[j] = BAD_NUM_GPUS
        return BAD_NUM_GPUS
    st = validate_batch(split_status, B, b, lay.dp)
    if st == OK:
        st = validate_interleaving(models[mi, MODEL.num_layers], B, b, lay.pp, lay.dp, hw)
    if st != OK:
        fill_nan(out, j)
        status[j] = st
        return st
    L, h, a = float(models[mi, MODEL.num_layers]), float(models[mi, MODEL.hidden_size]), float(models[mi, MODEL.num_attention_heads])
    g, f = float(models[mi, MODEL.num_query_groups]), float(models[mi, MODEL.ffn_hidden_size])
    v, s = float(models[mi, MODEL.vocab_size]), float(models[mi, MODEL.seq_length])
    # micro_batch_costs first: a cold compile types the calls in this order, and the compile
    # helper compiles the kernels after it meanwhile (helper_kernels)
    if micro_ok[db] == 0:
        micro[db] = micro_batch_costs(float(b), s, h, a, g, f, v, float(lay.tp), hw, model_arch(models, mi),
                                      float(lay.cp))
        micro_ok[db] = 1
    if ctx_ok[0] == 0:
        arch = model_arch(models, mi)
        ctx[0] = (split_costs(L, h, a, g, f, v, s, lay, hw, arch), model_totals(L, h, a, g, f, v, s, tok, arch))
        ctx_ok[0] = 1
    sc, mt = ctx[0]
    st = schedule(L, h, s, v, float(B), float(b), lay, rc, tok, hw, micro[db], sc, mt, out, j)
    status[j] = st
    return st


@pjit
def sweep_chunk(start, n, radices, models, tokens, gpus, hw_table, sizes, sizes_in_nodes,
                tps, cps, pps, mbss, gbss, recomputes, inputs, token_col, out, status):
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
    tps, cps, pps, mbss, gbss, recomputes : numpy.ndarray
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
    nblocks = (n + BLOCK - 1) // BLOCK
    for bi in prange(nblocks):
        lo = bi * BLOCK
        hi = min(n, lo + BLOCK)
        digits = np.empty(NUM_AXES, dtype=np.int64)
        ins = np.empty((NUM_INPUTS, SCRATCH), dtype=np.int64)
        tk = np.empty(SCRATCH, dtype=np.float64)
        res = np.empty((NUM_OUTPUTS, SCRATCH), dtype=np.float64)
        st = np.empty(SCRATCH, dtype=np.int8)
        ctx = [(EMPTY_SPLIT, EMPTY_TOTALS)]
        ctx_ok = np.zeros(1, dtype=np.uint8)
        micro = [EMPTY_MICRO] * radices[AXIS.micro_batch_size]
        micro_ok = np.zeros(radices[AXIS.micro_batch_size], dtype=np.uint8)
        micro_key = np.full(4, -1, dtype=np.int64)
        decode_index(start + lo, radices, digits)
        gi, num_gpus, nodes, lay, ok, split_status = refresh_prefix(
            digits, models, gpus, hw_table, sizes, sizes_in_nodes, tps, cps, pps, ctx_ok,
            micro_key, micro_ok)
        mi = digits[AXIS.model]
        tok = tokens[digits[AXIS.num_tokens]]
        hw = hw_table[gi]
        for s0 in range(lo, hi, SCRATCH):
            m = min(SCRATCH, hi - s0)
            for j in range(m):
                db = digits[AXIS.micro_batch_size]
                grid_point(mi, gi, num_gpus, nodes, lay, ok, split_status, db, mbss[db],
                           gbss[digits[AXIS.global_batch_size]], recomputes[digits[AXIS.recompute]], tok, models,
                           hw, ctx, ctx_ok, micro, micro_ok, ins, tk, res, st, j)
                if advance_digits(digits, radices) <= AXIS.pp:
                    gi, num_gpus, nodes, lay, ok, split_status = refresh_prefix(
                        digits, models, gpus, hw_table, sizes, sizes_in_nodes, tps, cps, pps,
                        ctx_ok, micro_key, micro_ok)
                    mi = digits[AXIS.model]
                    tok = tokens[digits[AXIS.num_tokens]]
                    hw = hw_table[gi]
            for k in range(NUM_INPUTS):
                inputs[k, s0:s0 + m] = ins[k, :m]
            for k in range(NUM_OUTPUTS):
                out[k, s0:s0 + m] = res[k, :m]
            token_col[s0:s0 + m] = tk[:m]
            status[s0:s0 + m] = st[:m]


@pjit
def sweep_points(indices, radices, models, tokens, gpus, hw_table, sizes, sizes_in_nodes,
                 tps, cps, pps, mbss, gbss, recomputes, inputs, token_col, out, status):
    """Evaluate the grid points at the flat ``indices`` (``int64``, shape ``(n,)``) into
    columns ``0 .. n-1`` of the output arrays; arguments as :func:`sweep_chunk`. Any order
    works; ascending indices are fastest (a step of up to 8 advances the odometer instead of
    decoding the index again)."""
    n = indices.shape[0]
    nblocks = (n + SCRATCH - 1) // SCRATCH
    for bi in prange(nblocks):
        digits = np.empty(NUM_AXES, dtype=np.int64)
        ctx = [(EMPTY_SPLIT, EMPTY_TOTALS)]
        ctx_ok = np.zeros(1, dtype=np.uint8)
        micro = [EMPTY_MICRO] * radices[AXIS.micro_batch_size]
        micro_ok = np.zeros(radices[AXIS.micro_batch_size], dtype=np.uint8)
        micro_key = np.full(4, -1, dtype=np.int64)
        prev = -1
        prev_prefix = -1
        prev_tok = -1
        gi, num_gpus, nodes, lay, ok, split_status = 0, 0, 0, split_world(0, 1, 1, 1)[0], False, BAD_NUM_GPUS
        for j in range(bi * SCRATCH, min(n, bi * SCRATCH + SCRATCH)):
            gap = indices[j] - prev
            if prev >= 0 and 0 <= gap <= 8:
                for _ in range(gap):
                    advance_digits(digits, radices)
            else:
                decode_index(indices[j], radices, digits)
            prev = indices[j]
            pre = prefix_index(digits, radices)
            if pre != prev_prefix or digits[AXIS.num_tokens] != prev_tok:
                gi, num_gpus, nodes, lay, ok, split_status = refresh_prefix(
                    digits, models, gpus, hw_table, sizes, sizes_in_nodes, tps, cps, pps, ctx_ok,
                    micro_key, micro_ok)
                prev_prefix = pre
                prev_tok = digits[AXIS.num_tokens]
            db = digits[AXIS.micro_batch_size]
            grid_point(digits[AXIS.model], gi, num_gpus, nodes, lay, ok, split_status, db,
                       mbss[db], gbss[digits[AXIS.global_batch_size]], recomputes[digits[AXIS.recompute]],
                       tokens[digits[AXIS.num_tokens]], models, hw_table[gi], ctx, ctx_ok, micro, micro_ok,
                       inputs, token_col, out, status, j)


@jit_inline
def objective_value(src, col, inputs, token_col, out, j):
    """Value of one reduction objective for column ``j`` (see ``SRC_*``)."""
    if src == SRC_OUTPUT:
        return out[col, j]
    if src == SRC_INPUT:
        return float(inputs[col, j])
    return token_col[j]


@jit_inline
def _dominated(vals, idx, front_vals, front_idx):
    """True if a row of ``front_vals`` (``(F, k)``) dominates point ``vals`` with flat index
    ``idx``: ``f <= vals`` everywhere and ``f != vals`` or ``f`` has the lower index.
    For ``k = 2`` the front must be sorted by the first objective (then its second objective
    strictly decreases) and one binary search decides; otherwise every row is checked."""
    nf = front_vals.shape[0]
    k = vals.shape[0]
    if nf == 0:
        return False
    if k == 2:
        lo, hi = 0, nf            # last row with f0 <= vals[0]
        while lo < hi:
            mid = (lo + hi) // 2
            if front_vals[mid, 0] <= vals[0]:
                lo = mid + 1
            else:
                hi = mid
        r = lo - 1
        if r < 0 or front_vals[r, 1] > vals[1]:
            return False
        return not (front_vals[r, 0] == vals[0] and front_vals[r, 1] == vals[1]
                    and front_idx[r] > idx)
    for r in range(nf):
        le, eq = True, True
        for q in range(k):
            if front_vals[r, q] > vals[q]:
                le = False
                break
            if front_vals[r, q] != vals[q]:
                eq = False
        if le and (not eq or front_idx[r] < idx):
            return True
    return False


@pjit
def scan_chunk(start, n, radices, models, tokens, gpus, hw_table, sizes, sizes_in_nodes,
               tps, cps, pps, mbss, gbss, recomputes, prefix_ok, mode, obj_src, obj_col, obj_sign,
               front_vals, front_idx, cand_idx, cand_vals, block_fill, block_status,
               block_pruned):
    """Evaluate grid points ``start .. start+n-1`` and keep only candidates of a reduction.

    A point is a candidate when its status is ``OK``, its objectives are not NaN and
    (``mode``) ``KEEP_FEASIBLE``: always; ``KEEP_FRONTIER``: no row of ``front_vals``
    dominates it; ``KEEP_TOP``: ``(value, index)`` is lexicographically at most
    ``(front_vals[0, 0], front_idx[0])`` (no threshold when ``front_vals`` is empty).
    Prefixes (:data:`PREFIX_AXES`) with ``prefix_ok == 0`` are skipped without evaluation.

    Parameters
    ----------
    start, n, radices ... recomputes
        As :func:`sweep_chunk`.
    prefix_ok : numpy.ndarray
        ``uint8``, shape ``(prod(radices[PREFIX_AXES]),)`` or ``(0,)`` (no pruning): 0 where
        every point of that prefix is infeasible whatever the batch axes.
    mode : int
        ``KEEP_FEASIBLE``, ``KEEP_FRONTIER`` or ``KEEP_TOP``.
    obj_src, obj_col : numpy.ndarray
        ``int64``, shape ``(k,)``: objective sources (``SRC_*``) and rows.
    obj_sign : numpy.ndarray
        ``float64``, shape ``(k,)``: +1 minimise, -1 maximise (values are stored times sign).
    front_vals, front_idx : numpy.ndarray
        ``float64 (F, k)`` / ``int64 (F,)``: the frontier (or top-K threshold) found so far,
        signed; used only to discard points early.
    cand_idx : numpy.ndarray
        ``int64``, shape ``(>= n,)``, output: candidate flat indices, block ``b`` filling
        ``b*BLOCK .. b*BLOCK + block_fill[b] - 1``.
    cand_vals : numpy.ndarray
        ``float64``, shape ``(k, >= n)``, output: signed objective values, same layout.
    block_fill : numpy.ndarray
        ``int64``, shape ``(ceil(n / BLOCK),)``, output: candidates per block.
    block_status : numpy.ndarray
        ``int64``, shape ``(ceil(n / BLOCK), NUM_STATUS)``, output: evaluated points per
        status code.
    block_pruned : numpy.ndarray
        ``int64``, shape ``(ceil(n / BLOCK),)``, output: points skipped by ``prefix_ok``.
    """
    k = obj_src.shape[0]
    nblocks = (n + BLOCK - 1) // BLOCK
    inner = radices[AXIS.micro_batch_size] * radices[AXIS.global_batch_size] * radices[AXIS.recompute]
    use_prefix = prefix_ok.shape[0] > 0
    for bi in prange(nblocks):
        lo = bi * BLOCK
        hi = min(n, lo + BLOCK)
        digits = np.empty(NUM_AXES, dtype=np.int64)
        ins = np.empty((NUM_INPUTS, 1), dtype=np.int64)
        tok = np.empty(1, dtype=np.float64)
        res = np.empty((NUM_OUTPUTS, 1), dtype=np.float64)
        st = np.empty(1, dtype=np.int8)
        vals = np.empty(k, dtype=np.float64)
        ctx = [(EMPTY_SPLIT, EMPTY_TOTALS)]
        ctx_ok = np.zeros(1, dtype=np.uint8)
        micro = [EMPTY_MICRO] * radices[AXIS.micro_batch_size]
        micro_ok = np.zeros(radices[AXIS.micro_batch_size], dtype=np.uint8)
        micro_key = np.full(4, -1, dtype=np.int64)
        for q in range(NUM_STATUS):
            block_status[bi, q] = 0
        fill = 0
        pruned = 0
        decode_index(start + lo, radices, digits)
        gi, num_gpus, nodes, lay, ok, split_status = refresh_prefix(
            digits, models, gpus, hw_table, sizes, sizes_in_nodes, tps, cps, pps, ctx_ok,
            micro_key, micro_ok)
        live = not use_prefix or prefix_ok[prefix_index(digits, radices)] != 0
        j = lo
        while j < hi:
            if not live:
                skip = min(inner - (start + j) % inner, hi - j)
                pruned += skip
                j += skip
                if j >= hi:
                    break
                decode_index(start + j, radices, digits)
                changed = 0
            else:
                db = digits[AXIS.micro_batch_size]
                # shape errors are only counted here: no candidate, so no row to write
                if not ok:
                    s = BAD_NUM_GPUS
                else:
                    s = validate_batch(split_status, gbss[digits[AXIS.global_batch_size]], mbss[db], lay.dp)
                    if s == OK:
                        s = validate_interleaving(models[digits[AXIS.model], MODEL.num_layers], gbss[digits[AXIS.global_batch_size]], mbss[db],
                                                  lay.pp, lay.dp, hw_table[gi])
                if s == OK:
                    s = grid_point(digits[AXIS.model], gi, num_gpus, nodes, lay, ok, split_status,
                                   db, mbss[db], gbss[digits[AXIS.global_batch_size]],
                                   recomputes[digits[AXIS.recompute]], tokens[digits[AXIS.num_tokens]],
                                   models, hw_table[gi], ctx, ctx_ok, micro, micro_ok, ins, tok, res, st, 0)
                block_status[bi, s] += 1
                if s == OK:
                    keep = True
                    for q in range(k):
                        v = objective_value(obj_src[q], obj_col[q], ins, tok, res, 0) * obj_sign[q]
                        if math.isnan(v):
                            keep = False
                        vals[q] = v
                    index = start + j
                    if keep and mode == KEEP_FRONTIER:
                        keep = not _dominated(vals, index, front_vals, front_idx)
                    elif keep and mode == KEEP_TOP and front_vals.shape[0] > 0:
                        keep = (vals[0] < front_vals[0, 0]
                                or (vals[0] == front_vals[0, 0] and index < front_idx[0]))
                    if keep:
                        cand_idx[lo + fill] = index
                        for q in range(k):
                            cand_vals[q, lo + fill] = vals[q]
                        fill += 1
                j += 1
                changed = advance_digits(digits, radices)
            if changed <= AXIS.pp:
                gi, num_gpus, nodes, lay, ok, split_status = refresh_prefix(
                    digits, models, gpus, hw_table, sizes, sizes_in_nodes, tps, cps, pps, ctx_ok,
                    micro_key, micro_ok)
                live = not use_prefix or prefix_ok[prefix_index(digits, radices)] != 0
        block_fill[bi] = fill
        block_pruned[bi] = pruned


@jit
def compact_candidates(cand_idx, cand_vals, block_fill, out_idx, out_vals, offset):
    """Append the per-block candidates of :func:`scan_chunk` to ``out_idx[offset:]`` /
    ``out_vals[offset:, :]`` (``(m, k)``) and return the new fill level."""
    m = offset
    for bi in range(block_fill.shape[0]):
        base = bi * BLOCK
        for r in range(block_fill[bi]):
            out_idx[m] = cand_idx[base + r]
            for q in range(cand_vals.shape[0]):
                out_vals[m, q] = cand_vals[q, base + r]
            m += 1
    return m


@jit
def pareto_sorted(vals, idx, order):
    """Frontier of rows ``order`` of ``vals`` (``(m, k)``, all objectives minimised), given
    that ``order`` sorts the rows lexicographically by objectives, then by ``idx``.

    Returns the positions (into ``vals``) of the frontier rows, in ``order`` order. A row is
    dropped if an earlier row in ``order`` is ``<=`` it in every objective (this includes exact
    duplicates, of which the lowest ``idx`` survives). For ``k = 2`` the check is against the
    running minimum of the second objective (Kung, Luccio, Preparata 1975); otherwise against
    the frontier so far.
    """
    m, k = vals.shape
    keep = np.empty(m, dtype=np.int64)
    nk = 0
    if m == 0:
        return keep[:0]
    if k == 1:
        keep[0] = order[0]
        return keep[:1]
    if k == 2:
        best = math.inf
        for r in range(m):
            i = order[r]
            if r == 0 or vals[i, 1] < best:     # the first row is never dominated (even at inf)
                best = vals[i, 1]
                keep[nk] = i
                nk += 1
        return keep[:nk]
    for r in range(m):
        i = order[r]
        dominated = False
        for fr in range(nk):
            f = keep[fr]
            le = True
            for q in range(k):
                if vals[f, q] > vals[i, q]:
                    le = False
                    break
            if le:
                dominated = True
                break
        if not dominated:
            keep[nk] = i
            nk += 1
    return keep[:nk]


@jit
def integer_column(col, values, valid):
    """``float64`` column -> ``int64`` ``values`` and ``uint8`` ``valid`` (0 where NaN)."""
    for j in range(col.shape[0]):
        x = col[j]
        if math.isnan(x):
            values[j] = 0
            valid[j] = 0
        else:
            values[j] = np.int64(x)
            valid[j] = 1


@jit
def prefix_table(radices, models, gpus, hw_table, sizes, sizes_in_nodes, tps, cps, pps, table):
    """Fill the pruning table of :func:`scan_chunk` (``uint8``, shape
    ``(prod(radices[PREFIX_AXES]),)``): 1 where the prefix's num_gpus splits into
    a layout (:func:`~vtrain_fast.model.layout.split_world`) and the model passes
    :func:`~vtrain_fast.model.rules.validate_split` with that split (the shape rules that do
    not involve the batch sizes, so some batch is valid) and, with an interleaved schedule,
    splits its layers into ``pp * vpp`` chunks, else 0."""
    r = 0
    for mi in range(radices[AXIS.model]):
        L, h, a, g = models[mi, MODEL.num_layers], models[mi, MODEL.hidden_size], models[mi, MODEL.num_attention_heads], models[mi, MODEL.num_query_groups]
        f, v, s = models[mi, MODEL.ffn_hidden_size], models[mi, MODEL.vocab_size], models[mi, MODEL.seq_length]
        for gd in range(radices[AXIS.gpu]):
            gpn = int(hw_table[gpus[gd], MACHINE.gpus_per_node])
            for sd in range(radices[AXIS.cluster_size]):
                num_gpus = sizes[sd] * gpn if sizes_in_nodes else sizes[sd]
                for td in range(radices[AXIS.tp]):
                    for cd in range(radices[AXIS.cp]):
                        for pd in range(radices[AXIS.pp]):
                            lay, ok = split_world(num_gpus, tps[td], cps[cd], pps[pd])
                            if ok:
                                ok = validate_split(L, h, a, g, f, v, s, lay, hw_table[gpus[gd]],
                                                    model_arch(models, mi)) == OK
                            if ok:
                                hw = hw_table[gpus[gd]]
                                vs = virtual_stages(float(lay.pp), hw)
                                ok = vs <= 1.0 or chunks_split(float(L), float(lay.pp), vs, hw)
                            table[r] = 1 if ok else 0
                            r += 1


@pjit
def evaluate_rows(cols, tokens, hw_rows, out, status):
    """Evaluate explicit configurations, one per column of ``cols``.

    Parameters
    ----------
    cols : numpy.ndarray
        ``int64``, shape ``(len(ROW_FIELDS), n)``, rows laid out as
        :data:`~vtrain_fast.model.records.ROW_FIELDS`: the model, global_batch_size,
        micro_batch_size, tp, cp, pp, dp, recompute (0/1/2: none/full/selective).
    tokens : numpy.ndarray
        ``float64``, shape ``(n,)``, tokens to train on.
    hw_rows : numpy.ndarray
        ``float64``, shape ``(n, NUM_HW_FIELDS)``, the machine vector of each row.
    out : numpy.ndarray
        ``float64``, shape ``(NUM_OUTPUTS, n)``, output.
    status : numpy.ndarray
        ``int8``, shape ``(n,)``, output.
    """
    for jj in prange(cols.shape[1]):
        # int64 column: Numba types the prange index as int64 in the loop and as uint64 in the
        # parallel function it makes of it, and would compile step (and schedule) for both
        j = np.int64(jj)
        lay = Layout(cols[ROW.tp, j], cols[ROW.cp, j], cols[ROW.dp, j], cols[ROW.pp, j])
        status[j] = step(cols[ROW.num_layers, j], cols[ROW.hidden_size, j], cols[ROW.num_attention_heads, j], cols[ROW.num_query_groups, j], cols[ROW.ffn_hidden_size, j],
                         cols[ROW.vocab_size, j], cols[ROW.seq_length, j], cols[ROW.global_batch_size, j], cols[ROW.micro_batch_size, j], lay,
                         cols[ROW.recompute, j], tokens[j], hw_rows[j], out, j,
                         arch_of(cols[:, j], ROW))


def rows_from_inputs(inputs: np.ndarray) -> np.ndarray:
    """The configurations of sweep rows (``inputs``: ``int64``, shape ``(NUM_INPUTS, n)``, laid
    out as :data:`INPUT_NAMES`) as :func:`evaluate_rows` takes them: ``int64``, shape
    ``(len(ROW_FIELDS), n)``, C-contiguous."""
    rows = np.ones((len(ROW_FIELDS), inputs.shape[1]), dtype=np.int64)
    for k, name in enumerate(ROW_FIELDS):
        if name in INPUT_NAMES:
            rows[k] = inputs[INPUT_NAMES.index(name)]
    return rows


def pareto_positions(vals: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Positions of the Pareto frontier of ``vals`` (``float64 (m, k)``, minimised, no NaN), ties
    broken by the lower ``idx`` (``int64 (m,)``), in lexicographic order of (objectives, idx):
    the one wrapper of :func:`pareto_sorted` that the sweep's reductions and the queries share."""
    if vals.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    keys = [idx] + [vals[:, q] for q in range(vals.shape[1] - 1, -1, -1)]
    order = np.lexsort(keys).astype(np.int64)
    return pareto_sorted(np.ascontiguousarray(vals), idx, order)
