"""Validity rules of one configuration: the status codes of the shape rules and the settings
Megatron-LM refuses, all checked before anything is priced.

The divisibility rules (:func:`validate_split`, without the batch sizes, then :func:`validate_batch`;
:func:`validate_shape` both), interleaving's (:func:`validate_interleaving`), context and expert
parallelism's (:func:`validate_context`, :func:`validate_experts`), the refused settings
(:func:`refused_context_parallel`, :func:`refused_experts`, :func:`refused`), a machine that repeats
an earlier one of a sweep (:func:`repeats`) and the plan kind both masks are indexed by
(:func:`plan_case`); an infeasible row is NaN (:func:`fill_nan`). The status codes are
:mod:`vtrain_fast.model.records`'.

Sources: Megatron-LM's argument checks (``megatron/training/arguments.py``), Megatron-core
``TransformerConfig.__post_init__``, ``parallel_state.initialize_model_parallel``, ``MoELayer``,
``get_batch_on_this_cp_rank`` and Transformer Engine's context-parallel attention; commit 3ee489d
(2024-05-31) for interleaving at two stages.
"""
from __future__ import annotations

import math

from ._jit import jit, jit_inline
from . import memory, ops
from .arch import DEFAULT_ARCH
from .experts import ep_overlap_on, expert_sizes
from .layer_split import chunks_split, stage_layers, virtual_stages
from .layout import dp_cp_size
from .records import (BAD_BATCH, BAD_HEADS, BAD_INPUT, BAD_LAYERS, BAD_NUM_GPUS, BAD_SEQ_LENGTH, MACHINE, NUM_OUTPUTS,
                      OK)


@jit
def validate_experts(lay, hw, arch):
    """Status code of expert parallelism's rules for an MoE model (``OK`` for a dense one, where
    ``ep`` and ``etp`` have no effect): ``num_experts`` divisible by ``ep`` (Megatron-core
    ``MoELayer``: ``num_moe_experts % ep_size == 0``; ``BAD_HEADS``, as heads by tp), and the expert
    grid ``etp x ep x edp`` tiling the ranks of one pipeline stage, ``tp x cp x dp`` divisible by
    ``etp x ep`` (``parallel_state.initialize_model_parallel``; ``BAD_NUM_GPUS``)."""
    if arch.num_experts < 1.0:
        return OK
    ep, etp = expert_sizes(float(lay.tp), hw)
    if ep < 1.0:
        return BAD_INPUT
    if arch.num_experts % ep != 0.0:
        return BAD_HEADS
    if float(lay.tp * lay.cp * lay.dp) % (etp * ep) != 0.0:
        return BAD_NUM_GPUS
    return OK


@jit
def validate_split(L, h, a, g, f, v, s, lay, hw, arch=DEFAULT_ARCH):
    """Status code of the rules that do not involve the batch sizes, for parallel layout ``lay``
    (:data:`~vtrain_fast.model.layout.Layout`) on machine ``hw``: every size positive
    (``BAD_INPUT``), heads and query groups divisible by ``tp`` and hidden by heads unless
    ``arch.kv_channels`` sets the head width or the model has multi-head latent attention (``BAD_HEADS``), the
    layers split over ``pp`` stages (:func:`~vtrain_fast.model.layer_split.stage_layers`: evenly, or as the
    machine's uneven-stage settings ask; ``BAD_LAYERS``), an MoE model's expert grid
    (:func:`validate_experts`); ``OK`` when all hold."""
    t, p, d = lay.tp, lay.pp, lay.dp
    if L <= 0 or h <= 0 or a <= 0 or g <= 0 or f <= 0 or v <= 0 or s <= 0 or t <= 0 or p <= 0 or d <= 0:
        return BAD_INPUT
    if (a % t != 0 or g % t != 0 or (h % a != 0 and arch.kv_channels <= 0.0 and arch.multi_latent_attention == 0.0)
            or a % g != 0):
        return BAD_HEADS
    if not stage_layers(float(L), float(p), hw)[3]:
        return BAD_LAYERS
    if not memory.shards_divide(float(dp_cp_size(lay)), hw):
        return BAD_NUM_GPUS             # hybrid sharding: dp_shard does not divide dp x cp
    st = validate_experts(lay, hw, arch)
    if st != OK:
        return st
    return validate_context(s, lay)


@jit
def validate_context(s, lay):
    """Status code of context parallelism's rule: ``seq_length`` divisible by ``2 * cp`` (the
    sequence is cut into ``2 cp`` equal chunks for the causal load balance; Megatron-core's
    ``get_batch_on_this_cp_rank`` and TE assert it), else ``BAD_SEQ_LENGTH``; ``BAD_INPUT`` for a
    ``cp`` below 1; ``OK`` at ``cp = 1``."""
    if lay.cp <= 0:
        return BAD_INPUT
    if lay.cp > 1 and s % (2 * lay.cp) != 0:
        return BAD_SEQ_LENGTH
    return OK


@jit
def refused_context_parallel(lay, hw):
    """Whether Megatron-LM refuses context parallelism on this machine: ``cp > 1`` needs
    Transformer Engine's fused (flash) attention (Megatron-core's local ``DotProductAttention``
    asserts ``context_parallel_size == 1``; TE's unfused attention has no context-parallel path),
    i.e. ``use_flash_attn`` here, in 16-bit precision (:func:`~vtrain_fast.model.ops.flash_on`)."""
    return lay.cp > 1 and not ops.flash_on(hw)


@jit
def refused_experts(lay, hw, arch):
    """Whether Megatron-core refuses this MoE plan (``TransformerConfig.__post_init__``): expert
    parallelism together with tensor parallelism needs sequence parallelism ("When using expert
    parallelism and tensor parallelism, sequence parallelism must be used"), and
    ``overlap_moe_expert_parallel_comm`` needs ``ep > 1`` and, at ``pp > 1``, the interleaved
    schedule (``vpp > 1``) (its refusal with full recomputation: :func:`~vtrain_fast.model.pipeline.schedule`);
    never for a
    dense model."""
    if arch.num_experts < 1.0:
        return False
    if ep_overlap_on(hw) and (hw[MACHINE.ep] <= 1.0 or (lay.pp > 1 and hw[MACHINE.vpp] <= 1.0)):
        return True
    return hw[MACHINE.ep] > 1.0 and lay.tp > 1 and hw[MACHINE.sequence_parallel] == 0.0


@jit
def validate_batch(split_status, B, b, d):
    """Status code of a configuration whose :func:`validate_split` gave ``split_status``:
    ``BAD_INPUT`` when a batch size is not positive, else ``split_status`` when it is not
    ``OK``, else ``BAD_BATCH`` when ``global_batch_size`` is not divisible by
    ``dp * micro_batch_size``."""
    if B <= 0 or b <= 0:
        return BAD_INPUT
    if split_status != OK:
        return split_status
    if B % (d * b) != 0:
        return BAD_BATCH
    return OK


@jit_inline
def validate_interleaving(L, B, b, p, d, hw):
    """Status code of Megatron-LM's rules for the interleaved schedule (``vpp > 1`` and
    ``p > 1``): each stage's layers (:func:`~vtrain_fast.model.layer_split.stage_layers`; evenly: ``L / p``)
    divisible by
    ``vpp`` (``BAD_LAYERS``) and micro-batches per pipeline, ``B / (d * b)``, divisible by ``p``
    (``BAD_BATCH``); ``OK`` otherwise. Call only on shapes :func:`validate_shape` accepted and
    interleaving needs pipeline parallelism (``p > 1``; from 2 stages on since Megatron-LM commit
    3ee489d, 2024-05-31, "Enable virtual pipelining and P2P communication overlap at PP=2")."""
    vpp = virtual_stages(float(p), hw)
    if vpp <= 1.0:
        return OK
    if not chunks_split(float(L), float(p), vpp, hw):
        return BAD_LAYERS
    if (B // (d * b)) % p != 0:
        return BAD_BATCH
    return OK


@jit
def repeats(lay, hw):
    """Whether this machine (a value of a sweep's gpu axis) repeats an earlier one of the sweep at
    parallel layout ``lay``: bit ``(tp > 1) + 2 (pp > 1) + 4 (dp x cp > 1) + 8 (cp > 1)`` (the plan kinds of
    :data:`vtrain_fast.model.settings.LAYOUT_SIZES`)
    of the machine-vector field ``repeat_cases`` (set by :func:`vtrain_fast.plan.grid.repeat_cases`
    where the settings that tell the two machines apart have no effect: ``vpp`` at ``p = 1``,
    sequence parallelism at ``t = 1``, the asynchronous TP all-reduce at ``t = 1`` or with
    sequence parallelism, the distributed optimizer and overlapped gradient reduction at
    ``d = 1``)."""
    return (int(hw[MACHINE.repeat_cases]) >> plan_case(lay)) & 1 == 1


@jit
def plan_case(lay):
    """The kind of plan of layout ``lay`` as a bit number of the machine vector's repeat and
    refused masks: ``(tp > 1) + 2 (pp > 1) + 4 (dp x cp > 1) + 8 (cp > 1)`` (:func:`vtrain_fast.plan.spec.plan_kind`
    decodes it)."""
    return ((1 if lay.tp > 1 else 0) + (2 if lay.pp > 1 else 0) + (4 if dp_cp_size(lay) > 1 else 0)
            + (8 if lay.cp > 1 else 0))


@jit
def refused(lay, hw):
    """Whether Megatron-LM refuses this machine's settings on plans of layout ``lay``'s kind: bit
    ``(tp > 1) + 2 (pp > 1) + 4 (dp x cp > 1) + 8 (cp > 1)`` of the machine-vector field ``refused_cases`` (set by
    :func:`vtrain_fast.plan.spec.refused_cases` where a setting needs one that Megatron-LM
    switches off there, e.g. tp_comm_overlap at tp = 1, where sequence parallelism is off)."""
    return (int(hw[MACHINE.refused_cases]) >> plan_case(lay)) & 1 == 1


@jit
def validate_shape(L, h, a, g, f, v, s, B, b, lay, hw):
    """Status code for the divisibility rules of Megatron-LM (``OK`` when all hold): the
    checks of :func:`validate_split`, then of :func:`validate_batch`."""
    return validate_batch(validate_split(L, h, a, g, f, v, s, lay, hw), B, b, lay.dp)


@jit
def fill_nan(out, i):
    """Set every output of row ``i`` to NaN (infeasible shape)."""
    for k in range(NUM_OUTPUTS):
        out[k, i] = math.nan
