"""Per-layer and per-split costs: the parts of a configuration that the schedule composes.

:func:`micro_batch_costs` prices one micro-batch of one layer, the embedding and the head, and the
exchanges between them (fixed by model, machine, micro_batch_size, tp and cp; layout
:data:`MICRO_NAMES`); :func:`split_costs` the parts fixed by the parallel layout (parameters per
stage, the data-parallel gradient exchange, the optimizer step, gradient accumulation, ZeRO-3
gathers, parameter-offload copies, the per-stage layer counts; layout :data:`SPLIT_NAMES`);
:func:`fp8_weight_cast_s` the once-per-iteration FP8 weight cast. The sweep drivers cache both
tuples across the points that share them.

Sources: the operator, communication and memory formulas of :mod:`vtrain_fast.model.ops`,
:mod:`~vtrain_fast.model.comm` and :mod:`~vtrain_fast.model.memory` (their own sources there);
Korthikanti et al. 2022 (activations, sequence parallelism); Rajbhandari et al. 2020, "ZeRO"
(sharded states and exchanges); PyTorch autograd's ``AccumulateGrad`` (gradient accumulation);
Transformer Engine's FP8 weight caching (``is_first_microbatch``).
"""
from __future__ import annotations

from ._jit import jit
from . import comm, memory, ops
from .arch import DEFAULT_ARCH
from .experts import ep_exchange_s, expert_sizes, moe_layer_extra
from .layer_split import bf16_layer_counts, bf16_layers_of, moe_layer_counts, moe_layers_of, stage_layers
from .layout import dp_cp_size, dp_cp_stride, pp_stride, spans_nodes
from .offload import activation_offload_layers
from .overlap import cp_exchange_s, mlp_tp_hidden_s, tp_hidden_s
from .records import MACHINE, MicroCosts, PRECISION_BF16, SplitCosts


# Gradient accumulation (per parameter, per micro-batch from the second on): read the new and the
# accumulated 16-bit gradient, write the sum, 2 + 2 + 2 bytes (4 + 4 + 4 under fp32 / tf32). The
# pass stays at these bytes with fp32 main gradients: Megatron-core's default
# gradient_accumulation_fusion accumulates into main_grad inside the weight-gradient GEMM
# (wgrad_gemm_accum_fp32 or _fp16, megatron/core/tensor_parallel/layers.py; TE's
# fuse_wgrad_accumulation), whose output traffic is small beside its K = tokens reduction, so
# the gradient's dtype adds no pass of its own; this separate pass is the model's calibrated
# stand-in for the accumulation (fitted with it), not a kernel of fp32 main gradients.
GRAD_ACCUMULATE_BYTES_PER_PARAM = 6.0


@jit
def micro_batch_costs(b, s, h, a, g, f, v, t, hw, arch=DEFAULT_ARCH, cp=1.0):
    """Costs of one micro-batch that depend only on the model, the machine, ``b``, ``t`` and ``cp``.

    Parameters
    ----------
    b, s, h, a, g, f, v, t : float
        micro_batch_size, seq_length, hidden_size, num_attention_heads, num_query_groups,
        ffn_hidden_size, vocab_size, tp.
    hw : numpy.ndarray
        Machine vector, ``float64``, shape ``(NUM_HW_FIELDS,)``.
    arch : Arch
        The model's architecture flags (:mod:`vtrain_fast.model.arch`).

    Returns
    -------
    tuple of float
        ``NUM_MICRO`` values laid out as :data:`MICRO_NAMES`: forward and backward seconds of
        one layer, the TP all-reduce of one activation (``2bsh`` bytes; with sequence
        parallelism a reduce-scatter plus an all-gather, which move the same bytes, Korthikanti
        et al. 2022, Sec. 4.2.2, at the latency of two collectives) and of the
        cross-entropy statistics (``4bs`` bytes), embedding and head seconds (forward plus
        backward), the pipeline NVLink all-gather of one activation, one pipeline send of
        ``1/t`` of it inside a node and across nodes, activation bytes of one layer, and the
        last stage's logits bytes (16-bit logits + fp32 softmax, ``6 s b v / t``; ``8`` under fp32), and the attention
        core's forward seconds and stored bytes of one layer (what selective recomputation
        reruns and drops), and the TP exchange seconds that asynchronous communication hides
        (:func:`~vtrain_fast.model.overlap.tp_backward_hidden_s`, 0 unless ``async_tensor_model_parallel_allreduce`` or
        sequence parallelism is set; plus :func:`~vtrain_fast.model.overlap.tp_comm_overlap_hidden_s` with
        ``tp_comm_overlap`` and sequence parallelism), and with ``precision`` = fp8 the
        once-per-iteration FP8 weight cast of one layer (:func:`fp8_weight_cast_s`) and the bytes
        of one layer's FP8 weight copies (:func:`~vtrain_fast.model.memory.fp8_weight_copy_bytes`),
        both 0.0 in bf16; the layer's activation bytes are then the FP8 ones
        (:func:`~vtrain_fast.model.memory.fp8_activation_saving_bytes` fewer).

        With context parallelism (``cp > 1``) every token-wise cost is that of this rank's
        ``s / cp`` tokens (so the activations are Korthikanti's with ``s / cp``), the layer's
        forward and backward (and the attention core that selective recomputation reruns) add the
        context-parallel attention beyond one local FlashAttention call
        (:func:`~vtrain_fast.model.ops.cp_attention_forward_extra_s`,
        :func:`~vtrain_fast.model.ops.cp_attention_backward_extra_s`), and the last two values
        are the exposed K/V exchange of one layer's forward and backward
        (:func:`~vtrain_fast.model.overlap.cp_exchange_s`);
        both 0.0 at ``cp = 1``.
    """
    s = s / cp                          # context parallelism: this rank's tokens of each sequence
    eb = ops.element_bytes(hw)          # bytes of an activation element: 2, 4 under fp32 / tf32
    sbh2 = eb * b * s * h
    flash = 1.0 if ops.flash_on(hw) else 0.0
    gated = arch.gated_mlp
    fp8 = 1.0 if ops.fp8_on(hw) else 0.0
    mxfp8 = 1.0 if ops.mxfp8_on(hw) else 0.0        # MXFP8 block scaling: the scales' bytes
    qw = ops.attention_width(h, a, arch)            # queries, context, projection input: a x kv_channels
    cw = ops.context_width(h, a, arch)              # the projection's input (qw but with MLA)
    latent = ops.mla_latent_width(arch) if ops.mla_on(arch) else 0.0   # MLA's compressed q and kv
    if hw[MACHINE.sequence_parallel] != 0.0:
        # the activation between stages is already split over the TP ranks: each sends its
        # 1/t and no all-gather follows
        gather = 0.0
        tp_exchange = comm.group_reduce_scatter_allgather_s(sbh2, t, 1.0, hw)
    else:
        gather = comm.intra_allgather_s(sbh2, t, hw)
        tp_exchange = comm.group_allreduce_s(sbh2, t, 1.0, hw)
    cp_fwd = ops.cp_attention_forward_extra_s(b, s, qw, a, g, t, cp, hw)    # 0.0 at cp = 1
    cp_bwd = ops.cp_attention_backward_extra_s(b, s, qw, a, g, t, cp, hw)
    cp_fwd_exposed, cp_bwd_exposed = cp_exchange_s(b, s, qw, a, g, t, cp, hw)
    layer_fwd = ops.layer_forward_s(b, s, h, a, g, f, t, hw, arch)
    layer_bwd = ops.layer_backward_s(b, s, h, a, g, f, t, hw, arch)
    tp_hidden = tp_hidden_s(b, s, h, a, g, f, t, tp_exchange, hw, gated, qw, arch)
    act_saving = memory.fp8_activation_saving_bytes(b, s, h, f, t, flash, hw[MACHINE.sequence_parallel], fp8, mxfp8, cw,
                                                    latent)
    # a layer kept in bf16 under FP8 (num_layers_at_start/end_in_bf16): what it costs beyond an FP8 one
    fwd16 = bwd16 = hidden16 = 0.0
    if fp8 != 0.0 and (hw[MACHINE.num_layers_at_start_in_bf16] > 0.0 or hw[MACHINE.num_layers_at_end_in_bf16] > 0.0):
        hw16 = hw.copy()
        hw16[MACHINE.precision] = PRECISION_BF16
        fwd16 = ops.layer_forward_s(b, s, h, a, g, f, t, hw16, arch) - layer_fwd
        bwd16 = ops.layer_backward_s(b, s, h, a, g, f, t, hw16, arch) - layer_bwd
        hidden16 = tp_hidden_s(b, s, h, a, g, f, t, tp_exchange, hw16, gated, qw, arch) - tp_hidden
    moe_fwd = moe_bwd = ep_fwd = ep_bwd = moe_act = mlp_hidden = 0.0
    if arch.num_experts >= 1.0:
        moe_fwd, moe_bwd, moe_act = moe_layer_extra(b, s, h, f, t, hw, arch)
        ep_fwd, ep_bwd = ep_exchange_s(b, s, h, t, hw, arch)
        mlp_hidden = mlp_tp_hidden_s(b, s, h, f, t, tp_exchange, hw, gated)
        if (fp8 != 0.0 and (hw[MACHINE.num_layers_at_start_in_bf16] > 0.0 or hw[MACHINE.num_layers_at_end_in_bf16] > 0.0)
                and arch.moe_layer_step == 1.0 and arch.moe_first_dense_layers == 0.0):
            # where every layer is an MoE layer (Mixtral, Qwen3-MoE, gpt-oss) a bf16 layer runs its
            # experts in bf16 too, and the TP exchange it hides is the attention's (no dense MLP);
            # with dense layers among them the bf16 layers' experts stay FP8 (not told apart)
            moe16_fwd, moe16_bwd, _ = moe_layer_extra(b, s, h, f, t, hw16, arch)
            fwd16 += moe16_fwd - moe_fwd
            bwd16 += moe16_bwd - moe_bwd
            hidden16 -= mlp_tp_hidden_s(b, s, h, f, t, tp_exchange, hw16, gated) - mlp_hidden
    return MicroCosts(layer_forward_s=layer_fwd + cp_fwd, layer_backward_s=layer_bwd + cp_bwd,
                      tp_allreduce_activation_s=tp_exchange,
                      tp_allreduce_ce_s=comm.group_allreduce_s(4.0 * b * s, t, 1.0, hw),
                      embedding_s=ops.embedding_s(b, s, h, v, t, hw, arch), head_s=ops.head_s(b, s, h, v, t, hw),
                      pp_allgather_s=gather, pp_send_intra_s=comm.p2p_s(sbh2 / t, False, hw),
                      pp_send_inter_s=comm.p2p_s(sbh2 / t, True, hw),
                      layer_activation_bytes=memory.layer_activation_bytes(b, s, h, a, g, f, t, flash, hw[MACHINE.sequence_parallel], gated, qw, latent, eb) - act_saving,
                      logits_bytes=s * b * v / t * (eb + 4.0),
                      attention_core_forward_s=ops.attention_core_forward_s(b, s, qw, a, g, t, hw) + cp_fwd,
                      attention_core_activation_bytes=memory.attention_core_activation_bytes(b, s, a, t, flash, eb),
                      tp_backward_hidden_s=tp_hidden,
                      fp8_weight_cast_s=fp8_weight_cast_s(h, a, g, f, t, hw, gated, qw, arch),
                      fp8_weight_bytes=memory.fp8_weight_copy_bytes(h, a, g, f, t, fp8, gated, mxfp8, qw, arch),
                      cp_forward_exposed_s=cp_fwd_exposed, cp_backward_exposed_s=cp_bwd_exposed,
                      bf16_layer_forward_extra_s=fwd16, bf16_layer_backward_extra_s=bwd16,
                      bf16_layer_tp_hidden_extra_s=hidden16, bf16_layer_activation_extra_bytes=act_saving,
                      moe_layer_forward_extra_s=moe_fwd, moe_layer_backward_extra_s=moe_bwd, ep_forward_s=ep_fwd,
                      ep_backward_s=ep_bwd, moe_layer_activation_extra_bytes=moe_act, moe_mlp_tp_hidden_s=mlp_hidden)


# FP8 weight cast: bytes per weight (read bf16 2, write the FP8 weight 1 and its transpose 1) and
# kernels (one per linear) of Transformer Engine's cast-transpose under delayed scaling; the other
# recipes' per-weight bytes and kernels per linear are ops.fp8_quantize_cost's.
FP8_WEIGHT_CAST_BYTES_PER_PARAM = 4.0


FP8_WEIGHT_CAST_KERNELS = 4.0


@jit
def fp8_weight_cast_s(h, a, g, f, t, hw, gated=0.0, qw=0.0, arch=DEFAULT_ARCH):
    """Seconds of casting one layer's linear weights (one TP rank's shard,
    :func:`~vtrain_fast.model.memory.linear_weights_per_rank`) to FP8 with their transposes, once
    per iteration: Transformer Engine caches the FP8 weights over the micro-batches of a step
    (Megatron-LM passes ``is_first_microbatch``), so :func:`~vtrain_fast.model.pipeline.schedule` spreads it over
    the ``m``
    micro-batches. 4 bytes per weight at ``hbm_Bps * hbm_efficiency``, four kernels (delayed
    scaling); per ``fp8_recipe`` the bytes per weight and kernels per linear of
    :func:`~vtrain_fast.model.ops.fp8_quantize_cost` (tensorwise 6 and 3: the weight's amax pass;
    mxfp8 4 + 2/32 and 1); 0.0 in bf16."""
    if not ops.fp8_on(hw):
        return 0.0
    weights = memory.linear_weights_per_rank(h, a, g, f, t, gated, qw, arch)
    per_weight, kernels = ops.fp8_quantize_cost(hw)
    if ops.mla_on(arch):                # MLA's linears instead of QKV: one cast each
        return ops.memory_bound_time_s(per_weight * weights, (ops.FP8_LINEARS - 1.0 + ops.mla_linears(arch)) * kernels,
                                       hw)
    return ops.memory_bound_time_s(per_weight * weights, ops.FP8_LINEARS * kernels, hw)


@jit
def stage_params(layers, nm, p_layer, p_moe, p_exp):
    """``(dense, expert)`` parameters per GPU of a pipeline device's ``layers`` transformer layers, ``nm``
    of them MoE layers: each layer ``p_layer`` (:func:`~vtrain_fast.model.memory.layer_params_per_rank`),
    an MoE layer its dense part ``p_moe`` (attention, norms, router, shared experts) instead and its
    local experts' ``p_exp`` (:func:`~vtrain_fast.model.memory.moe_layer_params_per_rank`); the
    embedding and the head not counted (:func:`split_costs` adds them to the first and the last)."""
    return layers * p_layer + nm * (p_moe - p_layer), nm * p_exp


@jit
def split_costs(L, h, a, g, f, v, s, lay, hw, arch=DEFAULT_ARCH):
    """Costs that depend on the model, the machine and the parallel layout but not on the
    batch sizes or recomputation.

    Parameters
    ----------
    L, h, a, g, f, v, s : float
        Model shape (as :func:`~vtrain_fast.model.step.step`).
    lay : Layout
        Parallel layout (:mod:`vtrain_fast.model.layout`).
    hw : numpy.ndarray
        Machine vector.
    arch : Arch
        The model's architecture flags (:mod:`vtrain_fast.model.arch`).

    Returns
    -------
    SplitCosts
        :class:`~vtrain_fast.model.records.SplitCosts`, among them: parameters per GPU on the first
        and the last stage (the first carries the word and the learned position embeddings, the
        last the LM head and final norm, its own copy of the word embedding when they are tied;
        one stage carries all, the shared table once when tied), ``dp_comm_s`` the data-parallel
        gradient all-reduce seconds (a reduce-scatter plus an all-gather with a sharded optimizer,
        ``dp_gather_s`` the all-gather's part; the slower stage's), gradients of
        :func:`~vtrain_fast.model.ops.grad_bytes` (4 with fp32 main gradients) and weights of
        :func:`~vtrain_fast.model.ops.element_bytes`; the Adam seconds of the larger stage, 1.0 when
        the pipeline group (``pp`` ranks :func:`~vtrain_fast.model.layout.pp_stride` apart) leaves
        its node (:func:`~vtrain_fast.model.layout.spans_nodes`) else 0.0, and the seconds of one
        gradient accumulation (:data:`GRAD_ACCUMULATE_BYTES_PER_PARAM`, 6 bytes per parameter, 12
        under fp32 / tf32, at ``hbm_Bps * hbm_efficiency``, over ``d`` with sharded gradients,
        ZeRO-2/3) of a stage's layers, of the
        embeddings and of the head; with ZeRO-3 (:func:`~vtrain_fast.model.memory.sharding_stage`)
        the seconds of one all-gather of a layer's, the embeddings' and the head's 16-bit
        parameters and of one reduce-scatter of their gradients over the data-parallel group and
        the bytes held gathered (:func:`~vtrain_fast.model.memory.zero3_gathered_bytes`), else 0.
        Also the seconds of the all-reduce of the tied word embedding's gradient between the
        first and the last stage (Megatron-LM's embedding group, ``v h / t`` gradients, after the
        backward; 0 at ``pp = 1`` or when untied).
    """
    t, p = float(lay.tp), float(lay.pp)
    eb = ops.element_bytes(hw)             # bytes of a weight element moved: 2, 4 under fp32 / tf32
    gb = ops.grad_bytes(hw)                # bytes of a gradient element kept and reduced: 4 with fp32 main gradients
    d_all = float(dp_cp_size(lay))         # gradients are reduced (and sharded) over dp x cp ranks
    dp_apart = float(dp_cp_stride(lay))    # ranks between their neighbours (tp)
    zero = memory.sharding_stage(hw)
    # ZeRO shards within groups of dp_shard ranks (hybrid sharding; all of them by default), whose
    # replicas all-reduce their gradient shards; DDP reduces over all
    d = memory.shard_ranks(d_all, hw) if zero >= 1.0 else d_all
    p_layer = memory.layer_params_per_rank(h, a, g, f, t, arch)
    l_first, l_mid, l_last, _ = stage_layers(L, p, hw)
    p_body = l_first * p_layer             # the first stage's layers (L / p each when even)
    p_body_last = l_last * p_layer
    p_mid = l_mid * p_layer
    # MoE: each MoE layer holds its dense part (attention, norms, router, shared experts) over t
    # instead of a dense layer, and its local experts' weights over etp (the middle: the one with most)
    nm_first, nm_second, nm_last, nm_mid_sum, nm_mid_max, _ = moe_layer_counts(L, p, hw, arch)
    moe = arch.num_experts >= 1.0
    e_first = e_mid = e_last = 0.0
    edz = 1.0
    ep, etp = expert_sizes(t, hw)
    if moe:
        p_moe, p_exp = memory.moe_layer_params_per_rank(h, a, g, f, t, ep, etp, arch)
        p_body, e_first = stage_params(l_first, nm_first, p_layer, p_moe, p_exp)
        p_body_last, e_last = stage_params(l_last, nm_last, p_layer, p_moe, p_exp)
        p_mid, e_mid = stage_params(l_mid, nm_mid_max, p_layer, p_moe, p_exp)
        if p <= 2.0:        # no middle stage: its counts enter no maximum
            p_mid = min(p_body, p_body_last)
            e_mid = min(e_first, e_last)
        # the expert-data-parallel group: the ranks of a stage over the expert grid, etp x ep apart
        edz = float(lay.tp * lay.cp * lay.dp) / (etp * ep)
    untied = arch.untie_embeddings_and_output_weights
    p_emb = v * h / t + memory.position_table_params(s, h, arch)   # word embedding shard + positions
    p_head = v * h / t + memory.norm_params(h, arch)               # LM head shard + final norm
    p_first = p_body + p_emb
    p_last = p_body_last + p_head
    emb_sync_s = 0.0
    if p == 1.0:
        p_first = p_body + p_emb + p_head - (1.0 - untied) * v * h / t   # a tied head is the word embedding
        p_last = p_first
    elif untied == 0.0:
        # Megatron-LM keeps the tied table on both ends and all-reduces its gradient between them
        emb_sync_s = comm.group_allreduce_s(gb * v * h / t, 2.0, (p - 1.0) * float(pp_stride(lay)), hw)
    dp_gather_s = 0.0
    if zero >= 1.0:
        # ZeRO: gradient reduce-scatter (of gb-byte gradients) + parameter all-gather (of eb-byte
        # weights; per iteration at stage 1, the reduce-scatter per micro-batch at stage 2, per layer
        # at stage 3: see schedule); the larger stage's
        dp_gather_s = max(comm.group_allgather_s(eb * p_first, d, dp_apart, hw),
                          comm.group_allgather_s(eb * p_last, d, dp_apart, hw))
        dp_comm_s = max(comm.group_allgather_s(gb * p_first, d, dp_apart, hw),
                        comm.group_allgather_s(gb * p_last, d, dp_apart, hw))
        if p_mid > p_first and p_mid > p_last:      # uneven stages: a middle stage may hold more
            dp_gather_s = max(dp_gather_s, comm.group_allgather_s(eb * p_mid, d, dp_apart, hw))
            dp_comm_s = max(dp_comm_s, comm.group_allgather_s(gb * p_mid, d, dp_apart, hw))
        dp_comm_s += dp_gather_s
    else:
        dp_comm_s = max(comm.group_allreduce_s(gb * p_first, d, dp_apart, hw),
                        comm.group_allreduce_s(gb * p_last, d, dp_apart, hw))
        if p_mid > p_first and p_mid > p_last:
            dp_comm_s = max(dp_comm_s, comm.group_allreduce_s(gb * p_mid, d, dp_apart, hw))
    if moe and edz > 1.0:
        # the experts' gradients: reduced (reduce-scatter + all-gather with ZeRO) over their own
        # expert-data-parallel group, after the dense ones
        e_max = max(e_first, e_mid, e_last)
        if zero >= 1.0:
            e_gather = comm.group_allgather_s(eb * e_max, edz, etp * ep, hw)
            dp_comm_s += comm.group_allgather_s(gb * e_max, edz, etp * ep, hw) + e_gather
            dp_gather_s += e_gather
        else:
            dp_comm_s += comm.group_allreduce_s(gb * e_max, edz, etp * ep, hw)
    # hybrid sharding: the replicas of a shard group all-reduce their 1/d gradient shards
    replica_s = 0.0
    if d < d_all:
        replica_s = comm.group_allreduce_s(gb * max(p_first, p_last, p_mid) / d, d_all / d, dp_apart * d, hw)
    # a sharded optimizer updates only its 1/d of the parameters
    optimizer_time_s = ops.optimizer_step_s(max(p_first, p_last, p_mid) / memory.optimizer_shards(d, zero), hw, d)
    if moe:     # + the expert parameters' shard (over the expert-data-parallel ranks)
        optimizer_time_s = ops.optimizer_step_s(max(p_first, p_last, p_mid) / memory.optimizer_shards(d, zero)
                                           + max(e_first, e_mid, e_last) / memory.optimizer_shards(edz, zero), hw, d)
    crosses = 1.0 if spans_nodes(p, float(pp_stride(lay)), hw[MACHINE.gpus_per_node]) else 0.0
    # one gradient accumulation (into .grad) of a stage's layers, embeddings and head; with
    # sharded gradients (ZeRO-2/3) into this rank's 1/d shard only
    # gradient accumulation: the note at the top of this module
    per_param = GRAD_ACCUMULATE_BYTES_PER_PARAM * ops.activation_scale(hw) / (hw[MACHINE.hbm_Bps] * hw[MACHINE.hbm_efficiency])
    if zero >= 2.0:
        per_param = per_param / d
    ag_layer = ag_emb = ag_head = 0.0
    rs_layer = rs_emb = rs_head = 0.0
    if zero >= 3.0:
        # ZeRO-3 / FSDP: one all-gather of a layer's (embedding's, head's) fp16 parameters
        ag_layer = comm.group_allgather_s(eb * p_layer, d, dp_apart, hw)
        ag_emb = comm.group_allgather_s(eb * p_emb, d, dp_apart, hw)
        ag_head = comm.group_allgather_s(eb * p_head, d, dp_apart, hw)
        # and one reduce-scatter of its gradients, in their own dtype
        rs_layer = comm.group_allgather_s(gb * p_layer, d, dp_apart, hw)
        rs_emb = comm.group_allgather_s(gb * p_emb, d, dp_apart, hw)
        rs_head = comm.group_allgather_s(gb * p_head, d, dp_apart, hw)
    # one stage with a tied head: the shared table is accumulated once (with the embedding's)
    acc_head = p_head - (1.0 - untied) * v * h / t if p == 1.0 else p_head
    n16_first, n16_second, n16_last, n16_mid_sum, n16_mid_max, n16_mid_min = bf16_layer_counts(L, p, hw)
    # activation offloading (cpu_offloading_num_layers, pp = 1 only): how many of the offloaded first
    # layers are bf16 layers under FP8 and MoE layers (their stored bytes differ from a dense FP8 layer's)
    k_off = activation_offload_layers(hw)
    off16 = off_moe = 0.0
    if k_off > 0.0:
        if ops.fp8_on(hw):
            off16 = bf16_layers_of(0.0, k_off, L, hw)
        if moe:
            off_moe = moe_layers_of(0.0, k_off, arch.moe_layer_step, arch.moe_first_dense_layers)
    # parameter offloading (param_cpu_offload): one copy of a layer's (embedding's, head's) fp32 shard
    return SplitCosts(params_first=p_first, params_last=p_last, dp_comm_s=dp_comm_s, dp_gather_s=dp_gather_s,
                      optimizer_s=optimizer_time_s,
                      crosses_node=crosses, accumulate_layers_s=per_param * (p_mid + e_mid),
                      accumulate_embedding_s=per_param * p_emb, accumulate_head_s=per_param * acc_head,
                      zero3_layer_gather_s=ag_layer, zero3_embedding_gather_s=ag_emb, zero3_head_gather_s=ag_head,
                      zero3_layer_reduce_s=rs_layer, zero3_embedding_reduce_s=rs_emb, zero3_head_reduce_s=rs_head,
                      zero3_gathered_bytes=memory.zero3_gathered_bytes(p_layer, d, zero, eb, gb), layers_first=l_first,
                      layers_middle=l_mid, layers_last=l_last, params_middle=p_mid,
                      accumulate_first_s=per_param * (p_body + e_first),
                      accumulate_last_s=per_param * (p_body_last + e_last), embedding_sync_s=emb_sync_s,
                      replica_allreduce_s=replica_s, bf16_layers_first=n16_first, bf16_layers_second=n16_second,
                      bf16_layers_last=n16_last, bf16_layers_middle_sum=n16_mid_sum,
                      bf16_layers_middle_max=n16_mid_max, bf16_layers_middle_min=n16_mid_min,
                      expert_params_first=e_first, expert_params_middle=e_mid, expert_params_last=e_last,
                      expert_shard_ranks=edz, moe_layers_first=nm_first, moe_layers_second=nm_second,
                      moe_layers_last=nm_last, moe_layers_middle_sum=nm_mid_sum, moe_layers_middle_max=nm_mid_max,
                      offloaded_bf16_layers=off16, offloaded_moe_layers=off_moe,
                      param_copy_layer_s=ops.param_offload_copy_s(p_layer / d, d, hw),
                      param_copy_embedding_s=ops.param_offload_copy_s(p_emb / d, d, hw),
                      param_copy_head_s=ops.param_offload_copy_s(p_head / d, d, hw))
