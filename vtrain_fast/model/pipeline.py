"""The 1F1B composition: a configuration's parts into its iteration time, memory and outputs.

Schedule: Megatron-LM's 1F1B (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training
on GPU Clusters", Sec. 2.2). With ``m`` micro-batches and per-stage times ``T_i`` (forward +
backward of one micro-batch, including its TP and pipeline communication;
:func:`stage_micro_batch_s` of :func:`stage_costs`), the pipeline flushes after
``(m - 1) * max_i T_i + sum_i T_i``; for equal stages this is the paper's ``(m + p - 1) * T`` with
bubble ``(p - 1) * T``. At ``pp = 1`` it reduces to gradient accumulation, ``m * T``. With ``vpp``
model chunks per device (the interleaved schedule, Sec. 2.2.2) the bubble shrinks to
``(p - 1) * T / vpp`` while every chunk boundary adds a pipeline send, and device 0 holds more
micro-batch chunks in flight. The data-parallel gradient all-reduce and the Adam step follow the
flush (no overlap, as in Megatron-LM's local DDP); with ``overlap_grad_reduce`` (machine vector
field ``dp_overlap``) the all-reduce hides behind the backward of the last micro-batch and only the
longer part is exposed (Megatron-LM's distributed DDP, ``--overlap-grad-reduce``). The first stage
carries the embeddings, the last the final layer norm, LM head and cross-entropy. From the second
micro-batch of a step on, each stage also adds its new weight gradients into the accumulated ones
(PyTorch autograd's ``AccumulateGrad`` into fp16 ``.grad``: 6 bytes per parameter at the achievable
HBM rate). Memory per GPU is the fullest stage's (:func:`stage_memory`: model states and stored
activations of its micro-batches in flight; Korthikanti et al. 2022, Rajbhandari et al. 2020);
fp16's loss scaling skips steps (:func:`loss_scale_skipped_steps`, Megatron-LM
``DynamicGradScaler``).
"""
from __future__ import annotations

import math

from ._jit import jit, jit_inline
from . import memory, ops

from .experts import ep_overlap_on
from .layer_split import virtual_stages
from .layout import dp_cp_size, world_size
from .offload import activation_offload_exposed_s, activation_offload_layers, refused_activation_offload
from .records import (MACHINE, OK, OUT_OF_MEMORY, OUTPUT, PRECISION_FP16, RECOMPUTE_FULL, RECOMPUTE_SELECTIVE,
                      REFUSED, StageCosts)
from .rules import fill_nan
from .totals import ATTENTION_FLOPS_PER_TOKEN_PER_S_H


GiB = 1024.0 ** 3


SECONDS_PER_DAY = 86400.0


@jit_inline
def schedule_sizes(B, b, lay, recompute, hw, split):
    """The sizes :func:`stage_costs` and :func:`schedule` both read: ``(p, d, dz, zero, m, l_first,
    l_mid, l_last, l_min, vs, rc, sel)``: pipeline and data-parallel sizes, the ranks a ZeRO shard
    spans (dp x cp, or ``dp_shard`` with hybrid sharding), the ZeRO stage, the micro-batches per
    pipeline ``B / (dp b)``, the layers of the first, a middle and the last stage and the fewest
    (``split_costs``), the model chunks per device, and 1.0 / 0.0 for full and selective
    recomputation."""
    p, d = float(lay.pp), float(lay.dp)
    dz = float(dp_cp_size(lay))        # data-parallel x context-parallel ranks
    zero = memory.sharding_stage(hw)
    # the ranks a ZeRO shard spans: all of dz, or dp_shard with hybrid sharding
    dz = memory.shard_ranks(dz, hw) if zero >= 1.0 else dz
    m = B / (d * b)
    # layers of the first, a middle and the last stage (L / p each unless uneven; stage_layers)
    l_first, l_mid, l_last = split.layers_first, split.layers_middle, split.layers_last
    l_min = min(l_first, l_mid, l_last)
    vs = virtual_stages(p, hw)         # model chunks per device (interleaved 1F1B when > 1)
    rc = 1.0 if recompute == RECOMPUTE_FULL else 0.0
    sel = 1.0 if recompute == RECOMPUTE_SELECTIVE else 0.0
    return p, d, dz, zero, m, l_first, l_mid, l_last, l_min, vs, rc, sel


@jit_inline
def stage_costs(L, s, B, b, lay, recompute, hw, mb, split):
    """Per-micro-batch seconds of each kind of pipeline stage (first, middle, last) by part, the parts
    :func:`schedule` composes into its 1F1B schedule (and :mod:`vtrain_fast.analysis.show` into its
    event timeline).

    Parameters
    ----------
    L, s, B, b : float
        num_layers, seq_length, global_batch_size, micro_batch_size.
    lay : Layout
        Parallel layout.
    recompute : int
        As :func:`schedule`.
    hw : numpy.ndarray
        Machine vector.
    mb, split : tuple of float
        :func:`~vtrain_fast.model.costs.micro_batch_costs` and :func:`~vtrain_fast.model.costs.split_costs` of this
        configuration.

    Returns
    -------
    tuple of float
        ``NUM_STAGE_COSTS`` values laid out as :data:`STAGE_COST_NAMES`, seconds per micro-batch:
        the compute (forward, recomputed forward, backward, gradient accumulation, FP8 casts) of the
        first / middle / last stage's layers and of the embedding and head, their exposed TP, sharded
        DP (ZeRO-2/3), CP and EP exchanges, what one bf16 layer (under FP8) and one MoE layer add to a
        middle stage, the pipeline sends and receives of one micro-batch (all chunks), and the backward
        window of the shortest stage that the data-parallel reduction hides under.
    """
    p, d, dz, zero, m, l_first, l_mid, l_last, l_min, vs, rc, sel = schedule_sizes(B, b, lay, recompute, hw, split)
    core = sel * mb.attention_core_forward_s        # selective: the attention core runs again before backward
    fwd = mb.layer_forward_s
    ar_act = mb.tp_allreduce_activation_s

    # ---- per micro-batch compute and TP communication, per stage type (first, middle, last)
    layer_compute = fwd + mb.layer_backward_s + rc * fwd + core
    layer_tp = (4.0 + 2.0 * rc) * ar_act - mb.tp_backward_hidden_s   # minus what async TP hides
    first_compute = l_first * layer_compute
    mid_compute = l_mid * layer_compute
    last_compute = l_last * layer_compute
    first_tp = l_first * layer_tp
    mid_tp = l_mid * layer_tp
    last_tp = l_last * layer_tp
    # context parallelism's exposed K/V exchange (0 at cp = 1): every forward (recomputed ones too,
    # and the attention core rerun by selective recomputation) and every backward of a layer
    layer_cp = (1.0 + rc + sel) * mb.cp_forward_exposed_s + mb.cp_backward_exposed_s
    first_cp = l_first * layer_cp
    mid_cp = l_mid * layer_cp
    last_cp = l_last * layer_cp
    emb_compute = mb.embedding_s
    emb_tp = ar_act
    head_compute = mb.head_s
    head_tp = ar_act + 3.0 * mb.tp_allreduce_ce_s
    # gradient accumulation into .grad from the second micro-batch on (6 bytes per parameter),
    # spread over the m micro-batches
    acc = (m - 1.0) / m
    # + the FP8 weight cast (0 in bf16): once per iteration, spread over the micro-batches; with
    # ZeRO-3 the weights are gathered per use, so each layer is cast at its forward and backward gather
    regather = zero >= 3.0 and dz > 1.0
    cast = 2.0 * mb.fp8_weight_cast_s if regather else mb.fp8_weight_cast_s / m
    first_compute += acc * split.accumulate_first_s + l_first * cast
    mid_compute += acc * split.accumulate_layers_s + l_mid * cast
    last_compute += acc * split.accumulate_last_s + l_last * cast
    # layers kept in bf16 under FP8 (0 otherwise): each adds its bf16 GEMMs' extra time (forward,
    # recomputed forward, backward) and the TP exchange they hide beyond the FP8 ones', and has no
    # FP8 weight cast; a middle stage's time is that of a stage without them, plus theirs
    n16_first, n16_last = split.bf16_layers_first, split.bf16_layers_last
    x16_compute = (1.0 + rc) * mb.bf16_layer_forward_extra_s + mb.bf16_layer_backward_extra_s - cast
    x16_tp = -mb.bf16_layer_tp_hidden_extra_s
    first_compute += n16_first * x16_compute
    last_compute += n16_last * x16_compute
    first_tp += n16_first * x16_tp
    last_tp += n16_last * x16_tp
    emb_compute += acc * split.accumulate_embedding_s
    head_compute += acc * split.accumulate_head_s
    # MoE layers (0 for a dense model): each adds what its MLP costs beyond a dense one (forward,
    # recomputed forward, backward) and its exposed token dispatch and combine (expert parallelism,
    # forward and recomputed forward, backward); a middle stage's time is that of a stage without
    # them, plus theirs
    nm_first, nm_last = split.moe_layers_first, split.moe_layers_last
    xm_compute = (1.0 + rc) * mb.moe_layer_forward_extra_s + mb.moe_layer_backward_extra_s
    xm_ep = (1.0 + rc) * mb.ep_forward_s + mb.ep_backward_s
    if ep_overlap_on(hw):
        # overlap_moe_expert_parallel_comm (Megatron-core combined_1f1b): a micro-batch's forward runs
        # with another's backward, an MoE layer of each in turn, the all-to-alls of the one on their own
        # stream under the other's compute, so a pair exposes what its MoE layer's exchanges take beyond
        # the layer's forward and backward; the warm-up's forwards and the cool-down's backwards have
        # no partner: one micro-batch's at pp = 1, the interleaved warm-up's (p - 1) 2 + (vs - 1) p chunks
        # of the first stage at pp > 1 (Megatron-core get_pp_rank_microbatches), in micro-batches
        alone = 1.0 if p == 1.0 else ((p - 1.0) * 2.0 + (vs - 1.0) * p) / vs
        u = min(1.0, alone / m)
        xm_ep = u * xm_ep + (1.0 - u) * max(0.0, xm_ep - (layer_compute + xm_compute))
    first_compute += nm_first * xm_compute
    last_compute += nm_last * xm_compute
    first_ep = nm_first * xm_ep
    last_ep = nm_last * xm_ep
    # an MoE layer runs no dense MLP: the MLP's tensor-parallel exchange (forward, recomputed
    # forward, backward: one activation's each), less what its linears hid, comes off the layer's
    xm_tp = mb.moe_mlp_tp_hidden_s - (2.0 + rc) * ar_act
    first_tp += nm_first * xm_tp
    last_tp += nm_last * xm_tp

    # ---- pipeline point-to-point per micro-batch (activation forward, gradient backward);
    # scatter-gather: each TP rank sends 1/t, then an intra-node all-gather (Megatron-LM).
    pp_mb = 0.0
    if p > 1.0:
        send = mb.pp_send_inter_s if split.crosses_node != 0.0 else mb.pp_send_intra_s
        exchange = send + mb.pp_allgather_s
        pp_mb = 2.0 * vs * exchange   # each of the vs chunks sends and receives
        if vs > 1.0 and hw[MACHINE.overlap_p2p_comm] != 0.0:
            # overlap_p2p_comm (Megatron-core's interleaved schedule, schedules.py): each chunk's send
            # and receive run asynchronously under the next chunk's forward (activation) or backward
            # (gradient), so only what is longer than a chunk of the shortest stage shows
            chunk_layers = l_min / vs
            pp_mb = vs * (max(0.0, exchange - chunk_layers * fwd)
                          + max(0.0, exchange - chunk_layers * (mb.layer_backward_s + rc * fwd + core)))

    # ---- sharded data parallelism per micro-batch (ZeRO-2/3), exposed part per stage
    # a stage's backward of one micro-batch (+ recompute); with uneven stages the shortest's
    window = l_min * (mb.layer_backward_s + rc * fwd + core)
    first_dp = 0.0
    mid_dp = 0.0
    last_dp = 0.0
    emb_dp = 0.0
    head_dp = 0.0
    if zero >= 3.0:
        # ZeRO-3 / FSDP: each layer's parameters are all-gathered before its forward and again
        # before its backward, and its gradients reduce-scattered after it; the next layer's
        # gather is prefetched behind this layer's compute, so a layer exposes what its
        # exchanges take beyond its compute, and the first gather of the forward and of the
        # backward and the last reduce-scatter wait, 3 exchanges of a layer (Rajbhandari
        # et al. 2020, Sec. 5.3; PyTorch FSDP forward/backward prefetch, Zhao et al. 2023,
        # "PyTorch FSDP", VLDB, Sec. 3.3). The embedding's exchanges have no compute to hide
        # behind; the head's hide behind the head. A reduce-scatter of fp32 gradients takes
        # longer than a gather of 16-bit weights: ``extra`` (0 when the two move the same bytes).
        ag = split.zero3_layer_gather_s
        extra = split.zero3_layer_reduce_s - ag
        layer_dp = max(0.0, ag - fwd) + max(0.0, 2.0 * ag + extra - (mb.layer_backward_s + rc * fwd + core))
        first_dp = l_first * layer_dp + 3.0 * ag + extra
        mid_dp = l_mid * layer_dp + 3.0 * ag + extra
        last_dp = l_last * layer_dp + 3.0 * ag + extra
        emb_dp = 3.0 * split.zero3_embedding_gather_s + (split.zero3_embedding_reduce_s - split.zero3_embedding_gather_s)
        head_dp = max(0.0, 3.0 * split.zero3_head_gather_s + (split.zero3_head_reduce_s - split.zero3_head_gather_s)
                      - mb.head_s)
    elif zero >= 2.0:
        # ZeRO-2: the gradients are reduce-scattered into their shards after every micro-batch
        # (the larger stage's; the exchange less its all-gather), under that backward with overlap_grad_reduce
        rs = split.dp_comm_s - split.dp_gather_s
        first_dp = rs - hw[MACHINE.overlap_grad_reduce] * min(rs, window)
        mid_dp = first_dp
        last_dp = first_dp

    # ---- offloading: the exposed GPU<->host copies (0 with both settings off)
    first_off = 0.0
    mid_off = 0.0
    last_off = 0.0
    c = split.param_copy_layer_s
    if zero >= 3.0 and c > 0.0:
        # parameter offloading (FSDP2 CPUOffloadPolicy): each layer's fp32 shard is copied to the GPU
        # before its all-gather, in forward and again in backward, and its gradient shard copied back
        # after the reduce-scatter, in the same prefetched chain as ZeRO-3's exchanges (above): a
        # layer exposes what its copies and exchanges take beyond its compute, less what the
        # exchanges alone expose (in dp_comm_s); the first copy of the forward and of the backward and
        # the last copy back wait in full; the embedding's copies have no compute to hide behind, the
        # head's hide behind the head
        ag = split.zero3_layer_gather_s
        extra = split.zero3_layer_reduce_s - ag
        back = mb.layer_backward_s + rc * fwd + core
        layer_off = (max(0.0, ag + c - fwd) + max(0.0, 2.0 * (ag + c) + extra - back)
                     - max(0.0, ag - fwd) - max(0.0, 2.0 * ag + extra - back))
        emb_off = 3.0 * split.param_copy_embedding_s
        ag_head, c_head = split.zero3_head_gather_s, split.param_copy_head_s
        extra_head = split.zero3_head_reduce_s - ag_head
        head_off = (max(0.0, 3.0 * (ag_head + c_head) + extra_head - mb.head_s)
                    - max(0.0, 3.0 * ag_head + extra_head - mb.head_s))
        first_off = l_first * layer_off + 3.0 * c + emb_off + (head_off if p == 1.0 else 0.0)
        mid_off = l_mid * layer_off + 3.0 * c
        last_off = l_last * layer_off + 3.0 * c + head_off
    k_off = activation_offload_layers(hw)
    if k_off > 0.0 and p == 1.0:
        # activation offloading (cpu_offloading_num_layers): the first k layers' saved activations to
        # the host in forward and back in backward, each direction at host_link_Bps, exposed beyond
        # the other layers' compute (activation_offload_exposed_s)
        n16_off = split.offloaded_bf16_layers
        nm_off = split.offloaded_moe_layers
        nbytes = memory.offloaded_activation_bytes(k_off, mb.layer_activation_bytes, n16_off, mb.bf16_layer_activation_extra_bytes, nm_off, mb.moe_layer_activation_extra_bytes)
        copy = nbytes / k_off / hw[MACHINE.host_link_Bps]
        first_off += (activation_offload_exposed_s(k_off, l_first, copy, fwd)
                      + activation_offload_exposed_s(k_off, l_first, copy, mb.layer_backward_s))

    return StageCosts(first_compute_s=first_compute, middle_compute_s=mid_compute, last_compute_s=last_compute,
                      embedding_compute_s=emb_compute, head_compute_s=head_compute, first_tp_s=first_tp,
                      middle_tp_s=mid_tp, last_tp_s=last_tp, embedding_tp_s=emb_tp, head_tp_s=head_tp,
                      first_dp_s=first_dp, middle_dp_s=mid_dp, last_dp_s=last_dp, embedding_dp_s=emb_dp,
                      head_dp_s=head_dp, first_cp_s=first_cp, middle_cp_s=mid_cp, last_cp_s=last_cp,
                      first_ep_s=first_ep, last_ep_s=last_ep, bf16_layer_compute_s=x16_compute, bf16_layer_tp_s=x16_tp,
                      moe_layer_compute_s=xm_compute, moe_layer_ep_s=xm_ep, moe_layer_tp_s=xm_tp, pp_s=pp_mb,
                      dp_window_s=window, first_offload_s=first_off, middle_offload_s=mid_off, last_offload_s=last_off)


@jit
def stage_micro_batch_s(sc, kind, n16, nm):
    """Seconds one pipeline stage spends on one micro-batch (all its chunks, forward, recomputation
    and backward, with their exposed TP, CP, EP, pipeline and sharded-DP exchanges), from
    :func:`stage_costs` ``sc``: ``kind`` 0 the first stage (with the embedding), 2 the last (with the
    head, final norm and loss), 1 a middle one, which adds ``n16`` layers kept in bf16 under FP8 and
    ``nm`` MoE layers to a stage of dense FP8 (or bf16) layers (the first and the last carry theirs
    already), 3 the only one (``pp = 1``: the embedding and the head too). The ``T_i`` of
    :func:`schedule`'s ``(m - 1) max_i T_i + sum_i T_i`` (at ``pp = 1``, ``m T``)."""
    if kind == 3:
        return (sc.first_compute_s + sc.embedding_compute_s + sc.head_compute_s + sc.first_tp_s + sc.embedding_tp_s
                + sc.head_tp_s + sc.first_dp_s + sc.embedding_dp_s + sc.head_dp_s + sc.first_cp_s + sc.first_ep_s
                + sc.first_offload_s)
    if kind == 0:
        return (sc.first_compute_s + sc.embedding_compute_s + sc.first_tp_s + sc.embedding_tp_s + sc.pp_s + sc.first_dp_s
                + sc.embedding_dp_s + sc.first_cp_s + sc.first_ep_s + sc.first_offload_s)
    if kind == 2:
        return (sc.last_compute_s + sc.head_compute_s + sc.last_tp_s + sc.head_tp_s + sc.pp_s + sc.last_dp_s
                + sc.head_dp_s + sc.last_cp_s + sc.last_ep_s + sc.last_offload_s)
    return (sc.middle_compute_s + sc.middle_tp_s + sc.pp_s + sc.middle_dp_s + sc.middle_cp_s + sc.middle_offload_s
            + n16 * (sc.bf16_layer_compute_s + sc.bf16_layer_tp_s) + nm * (sc.moe_layer_compute_s + sc.moe_layer_ep_s + sc.moe_layer_tp_s))


@jit_inline
def stage_memory(i, p, m, vs, layers, n16, nm, params, experts, b, sl, h, t, dz, zero, rc, sel, hw, mb, split):
    """Bytes pipeline device ``i`` (0 .. ``p - 1``, a float) keeps at the peak of its schedule: its model
    states and the stored activations of its micro-batches in flight; :func:`schedule` takes the
    fullest of the first, the second and the last device, :mod:`vtrain_fast.analysis.show` every one.

    Parameters
    ----------
    i, p, m, vs : float
        The device, the pipeline size, micro-batches per pipeline, model chunks per device
        (:func:`schedule_sizes`).
    layers, n16, nm : float
        The device's transformer layers (:func:`~vtrain_fast.model.layer_split.stage_layers`), those
        kept in bf16 under FP8 and its MoE layers (:func:`~vtrain_fast.model.layer_split.device_layer_count`).
    params, experts : float
        Its parameters per GPU, dense and expert (:func:`~vtrain_fast.model.costs.split_costs` for the
        first and the last, :func:`~vtrain_fast.model.costs.stage_params` for any).
    b, sl, h, t : float
        micro_batch_size, this rank's tokens of a sequence (``seq_length / cp``), hidden_size, tp.
    dz, zero, rc, sel : float
        The ranks a ZeRO shard spans, the ZeRO stage, 1.0 for full / selective recomputation
        (:func:`schedule_sizes`).
    hw : numpy.ndarray
        Machine vector.
    mb, split : tuple of float
        :func:`~vtrain_fast.model.costs.micro_batch_costs` and
        :func:`~vtrain_fast.model.costs.split_costs` of the configuration.

    Returns
    -------
    tuple of float
        ``(states, activations, layer_activations, host_activations, in_flight, fp8_weights)``: model-state bytes
        (:func:`~vtrain_fast.model.memory.model_state_bytes` of the dense and the expert parameters,
        the parameters ZeRO-3 holds gathered, TE's FP8 weight copies), activation bytes on the GPU (the
        layers' stored activations, ``min(p - i, m)`` micro-batches in flight in 1F1B,
        ``min(m vpp, 2 (p - 1 - i) + (vpp - 1) p + 1)`` chunks of ``1 / vpp`` of its layers interleaved
        (Megatron-LM's interleaved schedule); the first device also the embedding's output per
        micro-batch, the last two hidden-state copies and the logits; the layer a selective
        recomputation rebuilds; what bf16 and MoE layers store beyond a dense FP8 one), of them the
        layers' own stored activations, the bytes activation offloading keeps in host memory instead
        (``pp = 1``), the micro-batches in flight and the bytes of the FP8 weight copies among the states.
    """
    full = mb.layer_activation_bytes - sel * mb.attention_core_activation_bytes   # selective keeps all but the attention core's
    rebuilt = sel * mb.attention_core_activation_bytes      # ... and rebuilds one layer's core at a time in backward
    hs = h / ops.sequence_split(t, hw)  # hidden size a rank keeps per token outside TP regions
    eb = ops.element_bytes(hw)          # bytes of an activation element: 2, 4 under fp32 / tf32
    ce = eb * 0.5                       # the stage's extra terms below are written for 2-byte elements
    x16_act = mb.bf16_layer_activation_extra_bytes            # a bf16 layer under FP8 saves its linears' inputs in bf16
    xm_act = mb.moe_layer_activation_extra_bytes              # an MoE layer's stored bytes beyond a dense layer's
    last = i == p - 1.0
    host = 0.0
    if p == 1.0:
        n_in = 1.0
        layer = memory.stage_activation_bytes_from_layer(layers, 1.0, b, sl, hs, full, rc, eb)
        act = (layer + ce * sl * b * hs * 3.0 + mb.logits_bytes + rebuilt
               + memory.bf16_layers_extra_bytes(n16, 1.0, x16_act, rc)
               + memory.bf16_layers_extra_bytes(nm, 1.0, xm_act, rc))
        # activation offloading (cpu_offloading_num_layers, refused but at pp = 1 without
        # recomputation): the first k layers' saved activations live in host memory
        k_off = activation_offload_layers(hw)
        host = memory.offloaded_activation_bytes(k_off, full, split.offloaded_bf16_layers, x16_act, split.offloaded_moe_layers, xm_act)
        act -= host
        layer -= k_off * full
    elif vs <= 1.0:
        n_in = min(p - i, m)
        layer = memory.stage_activation_bytes_from_layer(layers, n_in, b, sl, hs, full, rc, eb)
        act = layer
        if i == 0.0:
            act += ce * n_in * sl * b * hs
        elif last:
            act = act + ce * 2.0 * sl * b * hs + mb.logits_bytes
        act = (act + rebuilt + memory.bf16_layers_extra_bytes(n16, n_in, x16_act, rc)
               + memory.bf16_layers_extra_bytes(nm, n_in, xm_act, rc))
    else:
        # interleaved: device 0 runs 2(p-1) + (vs-1)p warm-up chunk forwards before its first
        # backward, device i 2(p-1-i) + (vs-1)p, the last device (vs-1)p (Megatron-LM's
        # interleaved schedule); each chunk holds a stage's layers / vs of one micro-batch
        # (a device's bf16 layers sit in one chunk: counted at chunks / vs micro-batches in flight)
        chunks = min(m * vs, 2.0 * (p - 1.0 - i) + (vs - 1.0) * p + 1.0)
        n_in = chunks / vs
        layer = memory.stage_activation_bytes_from_layer(layers / vs, chunks, b, sl, hs, full, rc, eb)
        act = layer
        if i == 0.0:
            act += ce * chunks / vs * sl * b * hs
        elif last:
            act = act + ce * 2.0 * sl * b * hs + mb.logits_bytes
        act = (act + rebuilt + memory.bf16_layers_extra_bytes(n16, n_in, x16_act, rc)
               + memory.bf16_layers_extra_bytes(nm, n_in, xm_act, rc))
    # FP8 weight copies of the device's FP8 layers (0 in bf16); with ZeRO-3 of the layers held gathered
    regather = zero >= 3.0 and dz > 1.0
    fp8 = (memory.ZERO3_GATHERED_LAYERS if regather else layers - n16) * mb.fp8_weight_bytes
    # MoE: the experts' states over the expert-data-parallel ranks
    states = (memory.model_state_bytes(params, dz, zero, hw) + split.zero3_gathered_bytes + fp8
              + memory.model_state_bytes(experts, split.expert_shard_ranks, zero, hw))
    return states, act, layer, host, n_in, fp8


@jit
def schedule(L, h, s, v, B, b, lay, recompute, num_tokens, hw, mb, split, totals, out, i):
    """Compose the 1F1B schedule, memory and totals of one shape-valid configuration from its
    per-micro-batch, per-split and per-model parts, write its outputs into column ``i`` of
    ``out`` and return ``OK`` or ``OUT_OF_MEMORY`` (``REFUSED``, outputs NaN: an MoE model with
    ``overlap_moe_expert_parallel_comm`` and full recomputation).

    Parameters
    ----------
    L, h, s, v, B, b : float
        num_layers, hidden_size, seq_length, vocab_size, global_batch_size, micro_batch_size.
    lay : Layout
        Parallel layout (:mod:`vtrain_fast.model.layout`).
    recompute : int
        ``RECOMPUTE_NONE`` (0), ``RECOMPUTE_FULL`` (1, every layer's forward again before its
        backward, only layer inputs kept) or ``RECOMPUTE_SELECTIVE`` (2, only the attention core
        again, its softmax and dropout tensors not kept; Korthikanti et al. 2022, Sec. 5).
    num_tokens : float
        Tokens to train on.
    hw : numpy.ndarray
        Machine vector.
    mb, split, totals : tuple of float
        :func:`~vtrain_fast.model.costs.micro_batch_costs`, :func:`~vtrain_fast.model.costs.split_costs` and
        :func:`~vtrain_fast.model.totals.model_totals` of this
        configuration.
    out : numpy.ndarray
        ``float64``, shape ``(NUM_OUTPUTS, n)``, output (layout :data:`~vtrain_fast.model.records.OUTPUT_NAMES`).
    i : int
        Column to write.
    """
    status = OK
    t = float(lay.tp)
    p, d, dz, zero, m, l_first, l_mid, l_last, l_min, vs, rc, sel = schedule_sizes(B, b, lay, recompute, hw, split)
    sl = s / float(lay.cp)             # tokens of a sequence on one rank (context parallelism)
    if rc != 0.0 and ep_overlap_on(hw) and split.moe_layers_first + split.moe_layers_last + split.moe_layers_middle_sum > 0.0:
        fill_nan(out, i)                # Megatron-core: "disable full recomputation when enabling
        return REFUSED                  # overlap_moe_expert_parallel_comm"
    if refused_activation_offload(L, p, recompute, hw):
        fill_nan(out, i)                # Megatron-core: no CPU offloading with pipeline parallelism,
        return REFUSED                  # recomputation, or of every layer
    num_gpus = float(world_size(lay))
    fwd = mb.layer_forward_s
    sc = stage_costs(L, s, B, b, lay, recompute, hw, mb, split)
    (first_compute, mid_compute, last_compute, emb_compute, head_compute,
     first_tp, mid_tp, last_tp, emb_tp, head_tp,
     first_dp, mid_dp, last_dp, emb_dp, head_dp,
     first_cp, mid_cp, last_cp, first_ep, last_ep,
     x16_compute, x16_tp, xm_compute, xm_ep, xm_tp, pp_mb, window, first_off, mid_off, last_off) = sc
    n16_first, n16_last = split.bf16_layers_first, split.bf16_layers_last
    nm_first, nm_last = split.moe_layers_first, split.moe_layers_last

    # ---- schedule
    if p == 1.0:
        c_slow = first_compute + emb_compute + head_compute
        tp_slow = first_tp + emb_tp + head_tp
        dp_slow = first_dp + emb_dp + head_dp
        cp_slow = first_cp
        ep_slow = first_ep
        off_slow = first_off
        pp_slow = 0.0
        bubble = 0.0
    else:
        t_first = stage_micro_batch_s(sc, 0, 0.0, 0.0)
        t_last = stage_micro_batch_s(sc, 2, 0.0, 0.0)
        t_mid = stage_micro_batch_s(sc, 1, 0.0, 0.0)
        x16 = x16_compute + x16_tp
        xm = xm_compute + xm_ep + xm_tp
        total = t_first + t_last + (p - 2.0) * t_mid + split.bf16_layers_middle_sum * x16 + split.moe_layers_middle_sum * xm
        if t_last >= t_first:
            c_slow = last_compute + head_compute
            tp_slow = last_tp + head_tp
            dp_slow = last_dp + head_dp
            cp_slow = last_cp
            ep_slow = last_ep
            off_slow = last_off
            t_slow = t_last
        else:
            c_slow = first_compute + emb_compute
            tp_slow = first_tp + emb_tp
            dp_slow = first_dp + emb_dp
            cp_slow = first_cp
            ep_slow = first_ep
            off_slow = first_off
            t_slow = t_first
        # the slowest middle stage: the one with the most bf16 layers, or the fewest where a bf16
        # layer is the faster (small GEMMs, where FP8's quantize kernels cost more than they save)
        # (and the one with the most MoE layers: with bf16 layers too, an upper bound)
        n16_mid = split.bf16_layers_middle_max if x16 >= 0.0 else split.bf16_layers_middle_min
        nm_mid = split.moe_layers_middle_max
        if p > 2.0 and t_mid + n16_mid * x16 + nm_mid * xm > t_slow:   # uneven stages: a middle stage may be the slowest
            c_slow = mid_compute + n16_mid * x16_compute + nm_mid * xm_compute
            tp_slow = mid_tp + n16_mid * x16_tp + nm_mid * xm_tp
            dp_slow = mid_dp
            cp_slow = mid_cp
            ep_slow = nm_mid * xm_ep
            off_slow = mid_off
            t_slow = t_mid + n16_mid * x16 + nm_mid * xm
        pp_slow = pp_mb
        # interleaving splits each device's work into vs chunks: warm-up and cool-down take
        # (p - 1) chunk times instead of (p - 1) stage times (Narayanan et al. 2021, Sec. 2.2.2)
        bubble = (total - t_slow) / vs
    compute_s = m * c_slow
    tp_comm_s = m * tp_slow
    pp_comm_s = m * pp_slow
    cp_comm_s = m * cp_slow
    ep_comm_s = m * ep_slow
    offload_s = m * off_slow
    # Bucketed overlap of the DP all-reduce with backward (Megatron-LM --overlap-grad-reduce,
    # when enabled): gradient buckets are reduced while the last micro-batch's backward (with its
    # recomputation) runs on each stage, so only the part longer than that backward is exposed.
    if zero >= 3.0:
        dp_comm_s = m * dp_slow             # nothing is left to exchange after the flush
    elif zero >= 1.0:
        # distributed optimizer: only the gradient reduce-scatter (the exchange less its all-gather) can run
        # under the backward (ZeRO-2: it ran after every micro-batch, above); the parameter
        # all-gather waits for the step and runs after it, or with --overlap-param-gather (which
        # needs --overlap-grad-reduce) bucket by bucket under the first forward of the next
        # iteration (Megatron-LM DistributedOptimizer)
        gather = split.dp_gather_s
        reduce = split.dp_comm_s - gather
        gather_window = l_min * fwd if hw[MACHINE.overlap_grad_reduce] != 0.0 else 0.0
        if zero >= 2.0:
            dp_comm_s = m * dp_slow + gather - hw[MACHINE.overlap_param_gather] * min(gather, gather_window)
        else:
            dp_comm_s = (reduce - hw[MACHINE.overlap_grad_reduce] * min(reduce, window)
                         + gather - hw[MACHINE.overlap_param_gather] * min(gather, gather_window))
    else:
        dp_comm_s = split.dp_comm_s - hw[MACHINE.overlap_grad_reduce] * min(split.dp_comm_s, window)
    dp_comm_s += split.embedding_sync_s          # the tied embedding's gradient (pp > 1), after the backward
    if split.replica_allreduce_s > 0.0:
        # hybrid sharding: the shard replicas' all-reduce, under the last backward where gradient
        # reduction overlaps (overlap_grad_reduce; FSDP always)
        hides = 1.0 if (zero >= 3.0 or hw[MACHINE.overlap_grad_reduce] != 0.0) else 0.0
        dp_comm_s += split.replica_allreduce_s - hides * min(split.replica_allreduce_s, window)
    optimizer_time_s = split.optimizer_s
    overhead_s = hw[MACHINE.iteration_overhead_s]
    iteration = compute_s + tp_comm_s + pp_comm_s + bubble + dp_comm_s + optimizer_time_s + overhead_s + cp_comm_s
    iteration += ep_comm_s
    iteration += offload_s

    # ---- memory per GPU (the fullest of the first, the second and the last stage: stage_memory)
    n16_second = split.bf16_layers_second
    # the second stage may be the fullest with more layers than the first (uneven stages), or
    # when the first keeps bf16 layers (their activations against the second's FP8 weight copies)
    # (or with more MoE layers than the first: dense first layers)
    nm_mid = split.moe_layers_middle_max
    check_mid = p > 2.0 and (l_mid > l_first or n16_first > 0.0 or nm_mid > nm_first)
    state_first, act_first, _, _, _, _ = stage_memory(0.0, p, m, vs, l_first, n16_first, nm_first, split.params_first,
                                                   split.expert_params_first, b, sl, h, t, dz, zero, rc, sel, hw, mb, split)
    state_last, act_last = state_first, act_first
    if p > 1.0:
        state_last, act_last, _, _, _, _ = stage_memory(p - 1.0, p, m, vs, l_last, n16_last, nm_last, split.params_last,
                                                     split.expert_params_last, b, sl, h, t, dz, zero, rc, sel, hw, mb, split)
    mem_first = state_first + act_first
    mem_last = state_last + act_last
    if mem_first >= mem_last:
        states, act = state_first, act_first
    else:
        states, act = state_last, act_last
    if check_mid:
        state_mid, act_mid, _, _, _, _ = stage_memory(1.0, p, m, vs, l_mid, n16_second, nm_mid, split.params_middle,
                                                   split.expert_params_middle, b, sl, h, t, dz, zero, rc, sel, hw, mb, split)
        if act_mid > 0.0 and state_mid + act_mid > states + act:   # uneven stages: the second may be the fullest
            states, act = state_mid, act_mid
    mem_total = states + act + hw[MACHINE.reserved_bytes]
    if mem_total > hw[MACHINE.hbm_bytes]:
        status = OUT_OF_MEMORY

    # ---- throughput, utilisation, totals
    tokens_iter = B * s
    fwd_flops = totals.forward_flops_per_token
    model_flops = 3.0 * tokens_iter * fwd_flops
    hw_flops = (model_flops + rc * tokens_iter * (fwd_flops - 2.0 * h * v)
                + sel * tokens_iter * L * ATTENTION_FLOPS_PER_TOKEN_PER_S_H * s * h)
    steps = math.ceil(num_tokens / tokens_iter) + loss_scale_skipped_steps(num_tokens / tokens_iter, hw)
    train_s = steps * iteration
    gpu_hours = num_gpus * train_s * (1.0 / 3600.0)
    # rates multiply by reciprocals instead of dividing (a few ulp from tests/reference.py)
    per_iteration = 1.0 / iteration
    per_peak = 1.0 / (num_gpus * hw[MACHINE.peak_flops])

    out[OUTPUT.iteration_time_s, i] = iteration
    out[OUTPUT.tokens_per_s, i] = tokens_iter * per_iteration
    out[OUTPUT.model_tflops_per_gpu, i] = model_flops * per_iteration * (1.0 / (num_gpus * 1e12))
    out[OUTPUT.mfu, i] = model_flops * per_iteration * per_peak
    out[OUTPUT.hfu, i] = hw_flops * per_iteration * per_peak
    out[OUTPUT.memory_per_gpu_GiB, i] = mem_total / GiB
    out[OUTPUT.model_states_GiB, i] = states / GiB
    out[OUTPUT.activations_GiB, i] = act / GiB
    out[OUTPUT.compute_s, i] = compute_s
    out[OUTPUT.tp_comm_s, i] = tp_comm_s
    out[OUTPUT.pp_comm_s, i] = pp_comm_s
    out[OUTPUT.dp_comm_s, i] = dp_comm_s
    out[OUTPUT.bubble_s, i] = bubble
    out[OUTPUT.optimizer_s, i] = optimizer_time_s
    out[OUTPUT.overhead_s, i] = overhead_s
    out[OUTPUT.num_parameters, i] = totals.num_parameters
    out[OUTPUT.num_micro_batches, i] = m
    out[OUTPUT.num_steps, i] = steps
    out[OUTPUT.train_days, i] = train_s * (1.0 / SECONDS_PER_DAY)
    out[OUTPUT.gpu_hours, i] = gpu_hours
    out[OUTPUT.cost_usd, i] = gpu_hours * hw[MACHINE.usd_per_gpu_hour]
    out[OUTPUT.energy_kWh, i] = gpu_hours * hw[MACHINE.tdp_W] * 1e-3 * hw[MACHINE.pue]
    out[OUTPUT.loss, i] = totals.loss
    out[OUTPUT.cp_comm_s, i] = cp_comm_s
    out[OUTPUT.ep_comm_s, i] = ep_comm_s
    out[OUTPUT.offload_s, i] = offload_s
    return status


# fp16's dynamic loss scaling (Megatron-LM DynamicGradScaler, megatron/core/optimizer/grad_scaler.py,
# with its defaults: --initial-loss-scale 2^32, --loss-scale-window 1000, --hysteresis 2, backoff 0.5,
# growth 2): a step whose gradients overflow is skipped. Assumed here: the scale settles at 2^16,
# so the start skips the 16 halvings from 2^32 plus the first overflow that the hysteresis absorbs
# (17 steps); after that every growth (one per window of clean steps) overflows once more and
# the scale is halved back at the second overflow (hysteresis 2): 2 skipped steps per 1,000.
# Assumptions to check against a run's logs ("skipped iterations"); the iterations still read
# their batch, so the run takes that many more iterations for the same updates.
FP16_INITIAL_SKIPPED_STEPS = 17.0


FP16_SKIPPED_PER_WINDOW = 2.0


FP16_LOSS_SCALE_WINDOW = 1000.0


@jit
def loss_scale_skipped_steps(updates, hw):
    """Iterations fp16's dynamic loss scaling skips in a run of ``updates`` optimizer steps:
    :data:`FP16_INITIAL_SKIPPED_STEPS` plus :data:`FP16_SKIPPED_PER_WINDOW` per
    :data:`FP16_LOSS_SCALE_WINDOW` clean steps (rounded up), under ``precision`` fp16; 0
    otherwise (bf16, fp8 and fp32 need no loss scaling)."""
    if hw[MACHINE.precision] != PRECISION_FP16:
        return 0.0
    return FP16_INITIAL_SKIPPED_STEPS + math.ceil(FP16_SKIPPED_PER_WINDOW * updates / FP16_LOSS_SCALE_WINDOW)
