"""Pipeline layer accounting: which transformer layers each pipeline stage and device holds.

The layers of the first, a middle and the last stage (:func:`stage_layers`: even, uneven with
``first/last_pipeline_num_layers``, or with the embedding and loss counted as layers), their split
into interleaved model chunks (:func:`chunks_split`, :func:`virtual_stages`), and per device the
layers of a kind: kept in bf16 under FP8 (:func:`bf16_layer_counts`) or MoE layers
(:func:`moe_layer_counts`), by walking the virtual stages in order (:func:`device_layer_count`).

Sources: Megatron-core ``TransformerConfig`` and ``get_num_layers_to_build``
(``--decoder-first-pipeline-num-layers``, ``--decoder-last-pipeline-num-layers``,
``--account-for-embedding-in-pipeline-split``, ``--account-for-loss-in-pipeline-split``), the
interleaved schedule's virtual stages (Narayanan et al. 2021, Sec. 2.2.2), Megatron-DeepSpeed's
partition (BLOOM's 70 layers over 12 stages), ``fp8_utils.is_first_last_bf16_layer``
(``--num-layers-at-start-in-bf16``, ``--num-layers-at-end-in-bf16``) and ``--moe-layer-freq``.
"""
from __future__ import annotations

import math

from ._jit import jit
from . import ops

from .records import MACHINE














@jit
def stage_layers(L, p, hw):
    """Transformer layers of the first, a middle and the last of ``p`` pipeline stages for ``L``
    layers, and whether the split is valid: ``(first, middle, last, ok)`` (floats, ``ok`` bool).

    Megatron-core's split (``TransformerConfig``, ``get_num_layers_to_build``): evenly, ``L / p``
    each; with ``first_pipeline_num_layers`` / ``last_pipeline_num_layers`` set (non-zero) those
    stages take that many and the others split the rest evenly (``--decoder-first-pipeline-num-layers``,
    ``--decoder-last-pipeline-num-layers``); with ``account_for_embedding_in_pipeline_split`` /
    ``account_for_loss_in_pipeline_split`` the embedding / the output layer and loss count as one
    layer of the first / last stage: ``(L + e + l) / p`` each, one fewer there (Megatron-DeepSpeed's
    partition: BLOOM's 70 layers over 12 stages, 5 + 10 x 6 + 5). Not ok when the rest does not
    split evenly or a stage is left without a layer. At ``p = 1``: ``(L, L, L)``. With no middle
    stage the middle count is the smaller of the two (it then only enters maxima and minima).
    """
    if p <= 1.0:
        return L, L, L, L >= 1.0
    first = hw[MACHINE.first_pipeline_num_layers]
    last = hw[MACHINE.last_pipeline_num_layers]
    e = 1.0 if hw[MACHINE.account_for_embedding_in_pipeline_split] != 0.0 else 0.0
    lo = 1.0 if hw[MACHINE.account_for_loss_in_pipeline_split] != 0.0 else 0.0
    if e + lo > 0.0:
        total = L + e + lo
        per = total / p
        mid = per if p > 2.0 else min(per - e, per - lo)
        return per - e, mid, per - lo, math.floor(per) == per and per - e >= 1.0 and per - lo >= 1.0
    if first <= 0.0 and last <= 0.0:
        per = L / p
        return per, per, per, math.floor(per) == per and per >= 1.0
    fixed = (1.0 if first > 0.0 else 0.0) + (1.0 if last > 0.0 else 0.0)
    rest = L - max(first, 0.0) - max(last, 0.0)
    others = p - fixed
    if others <= 0.0:
        return first, min(first, last), last, rest == 0.0
    mid = rest / others
    ok = rest >= others and math.floor(mid) == mid
    return (first if first > 0.0 else mid), mid, (last if last > 0.0 else mid), ok


@jit
def chunks_split(L, p, vpp, hw):
    """Whether the layers of each of ``p`` stages split into ``vpp`` model chunks, as Megatron-core
    splits them (``get_num_layers_to_build``): every stage's layers (:func:`stage_layers`) divisible
    by ``vpp``; with the embedding / loss counted as layers, ``(L + e + l) / (p vpp)`` per chunk,
    one fewer in the first chunk of the first stage / the last chunk of the last stage."""
    first, mid, last, _ = stage_layers(L, p, hw)
    if hw[MACHINE.account_for_embedding_in_pipeline_split] != 0.0 or hw[MACHINE.account_for_loss_in_pipeline_split] != 0.0:
        first += 1.0 if hw[MACHINE.account_for_embedding_in_pipeline_split] != 0.0 else 0.0
        last += 1.0 if hw[MACHINE.account_for_loss_in_pipeline_split] != 0.0 else 0.0
    return first % vpp == 0.0 and (p <= 2.0 or mid % vpp == 0.0) and last % vpp == 0.0


@jit
def bf16_layers_of(lo, hi, L, hw):
    """How many of the global layers ``lo .. hi - 1`` are kept in bf16 under FP8: the first
    ``num_layers_at_start_in_bf16`` and the last ``num_layers_at_end_in_bf16`` of the ``L``
    (Megatron-core ``fp8_utils.is_first_last_bf16_layer``: ``layer_no < start or layer_no >= L -
    end``, a global index, so a count beyond a stage's layers goes on to the next stage)."""
    start = hw[MACHINE.num_layers_at_start_in_bf16]
    end_from = max(start, L - hw[MACHINE.num_layers_at_end_in_bf16])      # layers from here on: the end's (not counted twice)
    return max(0.0, min(hi, start) - lo) + max(0.0, hi - max(lo, end_from))


@jit
def device_layer_count(i, L, p, hw, moe, step_, first_dense):
    """Layers of a kind on pipeline device ``i`` (0 .. ``p - 1``): kept in bf16 under FP8
    (:func:`bf16_layers_of`), or with ``moe`` true MoE layers (:func:`moe_layers_of` with ``step_``,
    ``first_dense``). Device ``i`` holds, in interleaved 1F1B, chunk ``c`` of every row of ``p``
    chunks (virtual stage ``c p + i``; Megatron-core), each ``1 / vpp`` of its stage's layers
    (:func:`stage_layers`; with the embedding / loss counted as layers one fewer in the first / last
    chunk, :func:`chunks_split`), so the global layers of each device follow from walking the virtual
    stages in order."""
    if p <= 1.0:
        return layers_of(0.0, L, L, hw, moe, step_, first_dense)
    l_first, l_mid, l_last, _ = stage_layers(L, p, hw)
    vs = virtual_stages(p, hw)
    e = 1.0 if hw[MACHINE.account_for_embedding_in_pipeline_split] != 0.0 else 0.0
    lo = 1.0 if hw[MACHINE.account_for_loss_in_pipeline_split] != 0.0 else 0.0
    n_dev = int(p)
    n = l_first + e if i == 0 else (l_last + lo if i == n_dev - 1 else l_mid)
    count = 0.0
    for c in range(int(vs)):
        size = n / vs
        if i == 0 and c == 0:
            size -= e
        if i == n_dev - 1 and c == int(vs) - 1:
            size -= lo
        # layers before chunk c of device i: c full rows of (L + e + lo) / vs layer slots, then
        # the earlier devices' chunks of this row (less the embedding slot of the first chunk)
        row = c * (L + e + lo) / vs - (e if c > 0 else 0.0)
        before = row + (0.0 if i == 0 else (l_first + e) / vs - (e if c == 0 else 0.0) + (i - 1) * l_mid / vs)
        count += layers_of(before, before + size, L, hw, moe, step_, first_dense)
    return count


@jit
def device_layer_counts(L, p, hw, moe, step_, first_dense):
    """Layers of a kind per pipeline device (:func:`device_layer_count`): ``(first, second, last,
    middle_sum, middle_max, middle_min)``, the middle ones over devices ``1 .. p - 2`` (all 0.0 in
    bf16 or with both counts 0)."""
    if p <= 1.0:
        whole = layers_of(0.0, L, L, hw, moe, step_, first_dense)
        return whole, 0.0, whole, 0.0, 0.0, 0.0
    first = second = last = mid_sum = mid_max = 0.0
    mid_min = L
    n_dev = int(p)
    for i in range(n_dev):
        count = device_layer_count(i, L, p, hw, moe, step_, first_dense)
        if i == 0:
            first = count
        elif i == n_dev - 1:
            last = count
        else:
            mid_sum += count
            mid_max = max(mid_max, count)
            mid_min = min(mid_min, count)
            if i == 1:
                second = count
    return first, second, last, mid_sum, mid_max, mid_min if n_dev > 2 else 0.0


@jit
def bf16_layer_counts(L, p, hw):
    """Layers kept in bf16 under FP8 (:func:`bf16_layers_of`) per pipeline device
    (:func:`device_layer_counts`); all 0.0 in bf16 or with both counts 0."""
    if not ops.fp8_on(hw) or (hw[MACHINE.num_layers_at_start_in_bf16] <= 0.0 and hw[MACHINE.num_layers_at_end_in_bf16] <= 0.0):
        return 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
    return device_layer_counts(L, p, hw, False, 1.0, 0.0)


@jit
def moe_layers_of(lo, hi, step_, first_dense):
    """How many of the global layers ``lo .. hi - 1`` are MoE layers: layer ``i`` is one when
    ``i >= first_dense`` and ``i % step_ == 0`` (Megatron-core ``--moe-layer-freq``: an int ``k``
    is ``i % k == 0``, DeepSeek-V3's ``[0]*3 + [1]*58`` is ``first_dense`` 3, step 1;
    :func:`vtrain_fast.model.moe.layer_placement`)."""
    lo2 = max(lo, first_dense)
    if hi <= lo2:
        return 0.0
    return math.ceil(hi / step_) - math.ceil(lo2 / step_)


@jit
def layers_of(lo, hi, L, hw, moe, step_, first_dense):
    """:func:`moe_layers_of` with ``moe`` true, else :func:`bf16_layers_of`."""
    if moe:
        return moe_layers_of(lo, hi, step_, first_dense)
    return bf16_layers_of(lo, hi, L, hw)


@jit
def moe_layer_counts(L, p, hw, arch):
    """MoE layers per pipeline device (:func:`device_layer_counts`, :func:`moe_layers_of` with the
    model's ``moe_layer_step`` and ``moe_first_dense_layers``): ``(first, second, last, middle_sum,
    middle_max, middle_min)``; all 0.0 for a dense model (``num_experts`` 0)."""
    if arch.num_experts < 1.0:
        return 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
    return device_layer_counts(L, p, hw, True, arch.moe_layer_step, arch.moe_first_dense_layers)


@jit
def virtual_stages(p, hw):
    """Model chunks per device of the interleaved 1F1B schedule: the machine vector's ``vpp``
    with pipeline parallelism, 1 without (``p == 1`` has nothing to interleave)."""
    return hw[MACHINE.vpp] if p > 1.0 else 1.0
