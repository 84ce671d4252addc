"""Parameter counts and memory per GPU, in bytes.

Model states: mixed-precision Adam without ZeRO keeps 16 bytes per parameter (fp16 weight 2,
fp16 gradient 2, fp32 master weight 4, Adam momentum 4 and variance 4; Rajbhandari et al. 2020,
"ZeRO", Sec. 3.1), 18 with the fp32 main gradients Megatron-LM keeps under bf16 by default (a
4-byte gradient, :func:`~vtrain_fast.model.ops.grad_bytes`; ``grad_reduce_in_bf16`` gives the 2
back); ZeRO stages 1-3 divide the Adam states, then the gradients, then the weights
over the data-parallel ranks (:func:`model_state_bytes`, the paper's Figure 1). Activations: Korthikanti et al. 2022, "Reducing Activation Recomputation in
Large Transformer Models", Sec. 4 (tensor parallelism without sequence parallelism:
``s*b*h*(10 + 24/t + 5*a*s/(h*t))`` bytes per layer), generalised here to grouped-query
attention and any ``ffn_hidden_size`` (the ``24/t`` term is ``(4 + 4g/a + 4f/h)/t``) and heads of
``kv_channels`` channels (attention width ``qw = a d``: the ``4 + 4g/a`` of Q, K, V and the context
scale by ``qw / h``).

Under ``precision`` fp32 or tf32 (no mixed precision) every weight, gradient and activation
element is 4 bytes (:func:`~vtrain_fast.model.ops.element_bytes`) and the weights are their own
master copy: ``4 + 4 + 8 = 16`` bytes per parameter with fp32 Adam moments (ZeRO's Sec. 3.1 counts
the same 16 for fp32 training), the activations Korthikanti's with 4-byte elements and 1-byte
dropout masks (:func:`layer_activation_bytes`).
"""
from __future__ import annotations

from ._jit import jit, jit_inline
from .ops import (MXFP8_SCALE_BYTES_PER_ELEMENT, adam_moment_bytes, attention_width, context_width, element_bytes,
                  full_precision, grad_bytes, fused_softmax, mla_latent_width, mla_weights, offloaded_fraction)
from .arch import DEFAULT_ARCH, LEARNED_POSITIONS, RMSNORM
from .ops import param_offload_on
from .records import MACHINE


STATE_BYTES_PER_PARAM = 16.0
WEIGHT_BYTES_PER_PARAM = 2.0             # fp16 / bf16 weight
OPTIMIZER_BYTES_PER_PARAM = 12.0         # fp32 master weight, Adam momentum and variance (ZeRO's K)
# The precision-aware optimizer's master weight: the bf16 weight plus a 16-bit remainder (int16),
# Megatron-core's store_param_remainders (megatron/core/optimizer/distrib_optimizer.py), 2 bytes.
REMAINDER_MASTER_BYTES_PER_PARAM = 2.0
# ZeRO-3 / FSDP keeps the parameters of the layer it computes and of the next one (prefetched)
# gathered, with their unsharded gradients until the reduce-scatter: two layers of weight and
# gradient (PyTorch FSDP's default limit of two all-gathers in flight).
ZERO3_GATHERED_LAYERS = 2.0


@jit
def sharding_stage(hw):
    """The ZeRO stage a machine vector asks for (0-3): its ``zero_stage``, or 1 with
    ``distributed_optimizer`` (Megatron-LM's distributed optimizer is ZeRO-1)."""
    return max(hw[MACHINE.zero_stage], hw[MACHINE.distributed_optimizer])


@jit
def shard_ranks(d, hw):
    """Ranks one ZeRO shard group spans among ``d`` data-parallel (x context-parallel) ranks: the
    machine vector's ``dp_shard`` (hybrid sharding: the groups are replicas), or all ``d`` when it
    is 0."""
    k = hw[MACHINE.dp_shard]
    return k if k > 0.0 else d


@jit
def shards_divide(d, hw):
    """Whether ``dp_shard`` divides the ``d`` data-parallel (x context-parallel) ranks (true when 0,
    or without ZeRO sharding, where it has no effect)."""
    k = hw[MACHINE.dp_shard]
    return k <= 0.0 or sharding_stage(hw) < 1.0 or (k <= d and d % k == 0.0)


@jit
def optimizer_shards(d, stage):
    """Ranks the Adam states are spread over: ``d`` from ZeRO stage 1 on (``stage >= 1``: the
    distributed optimizer), else 1."""
    return d if stage >= 1.0 else 1.0


@jit_inline
def optimizer_bytes_per_param(hw):
    """Bytes of optimizer state per parameter on the GPU before sharding (ZeRO's K): 12 (fp32
    master weight, Adam momentum and variance), or under the precision-aware optimizer the 2-byte
    master remainder (:data:`REMAINDER_MASTER_BYTES_PER_PARAM`) plus the moments in their dtypes
    (:func:`~vtrain_fast.model.ops.adam_moment_bytes`: 8-bit states give 4), less the share
    offloaded to the host (:func:`~vtrain_fast.model.ops.offloaded_fraction`). Under fp32 or tf32
    (:func:`~vtrain_fast.model.ops.full_precision`) no master weight: the moments' bytes only (8)."""
    if full_precision(hw):          # fp32 / tf32: the weights are the master weights, Adam's moments only
        return adam_moment_bytes(hw) * (1.0 - offloaded_fraction(hw))
    if hw[MACHINE.use_precision_aware_optimizer] == 0.0:
        return OPTIMIZER_BYTES_PER_PARAM
    # the offloaded share's states live in host memory (optimizer_cpu_offload)
    return (REMAINDER_MASTER_BYTES_PER_PARAM + adam_moment_bytes(hw)) * (1.0 - offloaded_fraction(hw))


@jit_inline
def model_state_bytes(params, d, stage, hw):
    """Model-state bytes of ``params`` parameters on one GPU at ZeRO ``stage`` (0-3) over ``d``
    data-parallel ranks: fp16 weight (2 bytes, divided by ``d`` at stage 3), gradient
    (:func:`~vtrain_fast.model.ops.grad_bytes`: 2, or 4 for fp32 main gradients; divided at stages 2
    and 3) and fp32 master weight, Adam momentum and variance (12, divided
    from stage 1 on). Rajbhandari et al. 2020, "ZeRO", Figure 1 and Sec. 5: ``(2 + 2 + K)``,
    ``2 + 2 + K/N_d``, ``2 + (2 + K)/N_d`` and ``(2 + 2 + K)/N_d`` bytes per parameter with
    ``K = 12`` (7.5B parameters over 64 ranks: 120, 31.4, 16.6 and 1.88 GB); ``K`` from the
    machine vector ``hw`` (:func:`optimizer_bytes_per_param`)."""
    w, g, o = state_bytes_per_param(d, stage, hw)
    return params * (w + g + o)


@jit_inline
def state_bytes_per_param(d, stage, hw):
    """:func:`model_state_bytes` per parameter by part: ``(weight, gradient, optimizer)`` bytes one
    GPU keeps per parameter at ZeRO ``stage`` over ``d`` ranks (16-bit weight, 4-byte under fp32 /
    tf32, :func:`~vtrain_fast.model.ops.element_bytes`; the gradient's
    :func:`~vtrain_fast.model.ops.grad_bytes`, 4 for fp32 main gradients; the optimizer's
    :func:`optimizer_bytes_per_param`); all 0.0 with parameter offloading
    (:func:`~vtrain_fast.model.ops.param_offload_on`: they live in host memory)."""
    if param_offload_on(hw, d):
        # FSDP2's CPUOffloadPolicy: parameter shards, gradient shards and optimizer states in host
        # memory (what the GPU holds gathered: zero3_gathered_bytes)
        return 0.0, 0.0, 0.0
    e = element_bytes(hw) * (1.0 / WEIGHT_BYTES_PER_PARAM)
    w = e * WEIGHT_BYTES_PER_PARAM / (d if stage >= 3.0 else 1.0)
    g = grad_bytes(hw) / (d if stage >= 2.0 else 1.0)
    return w, g, optimizer_bytes_per_param(hw) / optimizer_shards(d, stage)


@jit
def zero3_gathered_bytes(layer_params_on_rank, d, stage, e=2.0, eg=2.0):
    """Bytes ZeRO-3 / FSDP holds unsharded at a time: :data:`ZERO3_GATHERED_LAYERS` layers of
    ``layer_params_on_rank`` parameters, a weight of ``e`` bytes (2: 16-bit; 4 under fp32,
    :func:`~vtrain_fast.model.ops.element_bytes`) and a gradient of ``eg`` bytes each
    (:func:`~vtrain_fast.model.ops.grad_bytes`) (0 below stage 3 or at ``d = 1``,
    where nothing is sharded; the same with the shards in host memory, ``param_cpu_offload``)."""
    if stage < 3.0 or d <= 1.0:
        return 0.0
    return ZERO3_GATHERED_LAYERS * layer_params_on_rank * (e + eg)


@jit
def norm_params(h, arch):
    """Parameters of one normalization over ``h``: weight and bias (``2h``) for LayerNorm, the
    weight (``h``) for RMSNorm (``arch.normalization``, :mod:`vtrain_fast.model.arch`)."""
    return h if arch.normalization == RMSNORM else 2.0 * h


@jit
def layer_params(h, a, g, f, arch=DEFAULT_ARCH):
    """Parameters of one transformer layer: the four linears' weights (a gated MLP,
    ``arch.gated_mlp`` 1, SwiGLU, has three ``h x f`` matrices instead of two), their biases
    (``arch.add_bias_linear``) and two norms (:func:`norm_params`). Heads of ``arch.kv_channels``
    channels (:func:`~vtrain_fast.model.ops.attention_width` ``qw``): QKV ``h x (qw + 2 qw g/a)``,
    projection ``qw x h``. Multi-head latent attention: its block, :func:`mla_attention_params_per_rank`
    at ``t = 1``, instead of QKV and projection."""
    gated = arch.gated_mlp
    if arch.multi_latent_attention != 0.0:
        return (mla_attention_params_per_rank(h, a, 1.0, arch) + (2.0 + gated) * h * f
                + arch.add_bias_linear * (h + (1.0 + gated) * f + h) + 2.0 * norm_params(h, arch))
    qw = attention_width(h, a, arch)
    qkv_out = qw + 2.0 * qw * g / a
    weights = h * qkv_out + qw * h + (2.0 + gated) * h * f
    biases = arch.add_bias_linear * (qkv_out + h + (1.0 + gated) * f + h)
    return weights + biases + 2.0 * norm_params(h, arch)


@jit
def mla_attention_params_per_rank(h, a, t, arch):
    """Parameters of one multi-head latent attention block held by one tensor-parallel rank (no
    biases: Megatron-core's MLA linears take none, as DeepSeek's): the down projections and the q
    and kv norms (over ``q_lora_rank`` and ``kv_lora_rank``, :func:`norm_params`) replicated
    (TELinear ``parallel_mode="duplicated"``), the up projections and the output projection ``a
    v_head_dim x h`` over ``t`` (:func:`~vtrain_fast.model.ops.mla_weights`; DeepSeek-V2
    Sec. 2.1.2-2.1.3). At ``t = 1``, :func:`vtrain_fast.model.moe.attention_params`."""
    rep, split = mla_weights(h, a, arch)
    return rep + norm_params(mla_latent_width(arch), arch) + (split + context_width(h, a, arch) * h) / t


@jit
def layer_params_per_rank(h, a, g, f, t, arch=DEFAULT_ARCH):
    """Parameters of one layer held by one tensor-parallel rank (:func:`layer_params`): the
    weights and the column-parallel biases (QKV, FC1) over ``t``, the row-parallel biases
    (projection, FC2) and the norms replicated; with multi-head latent attention its block as
    :func:`mla_attention_params_per_rank` holds it."""
    gated = arch.gated_mlp
    if arch.multi_latent_attention != 0.0:       # MLA: its down projections and norms replicated
        return (mla_attention_params_per_rank(h, a, t, arch)
                + ((2.0 + gated) * h * f + arch.add_bias_linear * (1.0 + gated) * f) / t
                + arch.add_bias_linear * 2.0 * h + 2.0 * norm_params(h, arch))
    qw = attention_width(h, a, arch)
    qkv_out = qw + 2.0 * qw * g / a
    split = h * qkv_out + qw * h + (2.0 + gated) * h * f + arch.add_bias_linear * (qkv_out + (1.0 + gated) * f)
    return split / t + arch.add_bias_linear * 2.0 * h + 2.0 * norm_params(h, arch)


@jit
def moe_layer_params_per_rank(h, a, g, f, t, ep, etp, arch):
    """``(dense part, experts)`` of one MoE layer's parameters held by one rank: the attention and
    norms as :func:`layer_params_per_rank` holds them, the router (``E h``, replicated: Megatron-core
    ``TopKRouter.weight``) and the shared experts (an MLP of ``moe_shared_expert_intermediate_size``
    split over ``t``, its FC2 bias replicated) over the tensor-parallel group; and the ``E / ep``
    local routed experts, each ``(2 + gated) h f_e`` weights (+ ``(1 + gated) f_e`` biases) over
    ``etp`` and its FC2 bias ``h`` replicated. At ``t = ep = etp = 1``, with
    :func:`layer_params`, :func:`vtrain_fast.model.moe.param_counts`'s counts."""
    gated = arch.gated_mlp
    bias = arch.add_bias_linear
    if arch.multi_latent_attention != 0.0:
        attn = mla_attention_params_per_rank(h, a, t, arch) + bias * h + 2.0 * norm_params(h, arch)
    else:
        qw = attention_width(h, a, arch)
        qkv_out = qw + 2.0 * qw * g / a
        attn = (h * qkv_out + qw * h + bias * qkv_out) / t + bias * h + 2.0 * norm_params(h, arch)
    fs = arch.moe_shared_expert_intermediate_size
    shared = 0.0
    if fs > 0.0:
        shared = ((2.0 + gated) * h * fs + bias * (1.0 + gated) * fs) / t + bias * h
    fe = arch.moe_ffn_hidden_size if arch.moe_ffn_hidden_size > 0.0 else f
    local = arch.num_experts / ep
    experts = local * (((2.0 + gated) * h * fe + bias * (1.0 + gated) * fe) / etp + bias * h)
    return attn + arch.num_experts * h + shared, experts


@jit
def position_table_params(s, h, arch):
    """Parameters of the position embedding: the learned ``s x h`` table, none with RoPE or none
    (``arch.position_embedding_type``)."""
    return s * h if arch.position_embedding_type == LEARNED_POSITIONS else 0.0


@jit
def model_params(num_layers, h, a, g, f, v, s, arch=DEFAULT_ARCH):
    """Total parameters: layers (:func:`layer_params`), word embedding ``v h``, position embedding
    (:func:`position_table_params`), final norm (:func:`norm_params`) and the LM head's ``v h``
    unless it shares the word embedding (``arch.untie_embeddings_and_output_weights`` 0,
    Megatron-LM's default, as GPT-3)."""
    return (num_layers * layer_params(h, a, g, f, arch) + (1.0 + arch.untie_embeddings_and_output_weights) * v * h
            + position_table_params(s, h, arch) + norm_params(h, arch))


@jit
def layer_activation_bytes(b, s, h, a, g, f, t, flash, sp, gated=0.0, qw=0.0, latent=0.0, e=2.0):
    """Activation bytes one layer stores for backward, one micro-batch, no recomputation
    (Korthikanti et al. 2022, Sec. 4.1, generalised; see module docstring).

    Without FlashAttention the scores cost ``5 a s^2 b / t`` bytes, ``7 a s^2 b / t`` when the
    softmax runs unfused in fp32 (:func:`~vtrain_fast.model.ops.fused_softmax`).
    With FlashAttention (``flash`` non-zero) the ``5 a s^2 b / t`` bytes of softmax output,
    dropout mask and dropout output are not stored; the kernel keeps Q, K, V and the output
    (already counted) plus an fp32 log-sum-exp per query row, ``4 b (a/t) s`` bytes
    (Dao 2023, "FlashAttention-2").

    With sequence parallelism (``sp`` non-zero) the ``10 s b h`` bytes kept outside the
    tensor-parallel regions (layer-norm inputs, dropout masks and outputs) are split over the
    ``t`` ranks too: ``s b h (10 + 4 + 4g/a + 4f/h) / t`` (Korthikanti et al. 2022, Sec. 4.2.2,
    Table 2: ``sbh (34/t + 5as/(ht))``). The MLP keeps FC1's output and the activation's
    (``4f/h``); a gated MLP (``gated`` 1) keeps gate and up and the product (``6f/h``).

    Heads of ``kv_channels`` channels (``qw = a d``, the attention width,
    :func:`~vtrain_fast.model.ops.attention_width`; 0: ``h``): Q and the context (the projection's
    input) are ``2 s b qw`` bytes each and K and V ``2 s b qw g / a`` each, so ``4 + 4g/a`` becomes
    ``(4 + 4g/a) qw / h``; the layer-norm outputs, dropouts and MLP terms keep ``h``.

    Multi-head latent attention (``qw`` its :func:`~vtrain_fast.model.ops.attention_width`, ``g =
    a``, so that ``(4 + 4g/a) qw`` is exactly its Q and K of ``dq = qk_head_dim +
    qk_pos_emb_head_dim`` and V and the context of ``v_head_dim`` channels per head, the core's
    inputs and output, ``2 a (2 dq + 2 v_head_dim)`` bytes per token over ``t``): the down
    projections' input is the layer norm's output that QKV's is (in the ``10``, on ``s b / t`` rows
    with sequence parallelism); ``latent`` (``q_lora_rank + kv_lora_rank``,
    :func:`~vtrain_fast.model.ops.mla_latent_width`; 0 without MLA) adds the q and kv norms' inputs
    and outputs (the up projections' inputs), ``2 + 2`` bytes per channel per token, on the ``s b
    / t`` rows they run on with sequence parallelism (TE saves the local input and gathers it again
    for the weight gradient). The up projections' outputs are not kept beyond the assembled Q, K, V
    (their backward needs only their inputs); the rotary kernels keep nothing.

    ``e`` is the bytes of an activation element (2; 4 under fp32 / tf32,
    :func:`~vtrain_fast.model.ops.element_bytes`): every term above scales by ``e / 2`` except the
    two 1-byte dropout masks of the ``10`` (``10 = 4 e + 2`` at ``e = 2``) and the score dropout
    mask (:func:`attention_core_activation_bytes`)."""
    c = e * 0.5
    kept = 4.0 * e + 2.0                                   # Korthikanti's 10 at e = 2 (2 one-byte masks)
    outside = kept / t if sp != 0.0 else kept
    r = qw / h if qw > 0.0 else 1.0
    base = s * b * h * (outside + c * (4.0 * r + 4.0 * r * g / a + (4.0 + 2.0 * gated) * f / h) / t)
    core = base + attention_core_activation_bytes(b, s, a, t, flash, e)
    if latent > 0.0:
        return core + 2.0 * e * s * b * latent / (t if sp != 0.0 else 1.0)
    return core


@jit
def attention_core_activation_bytes(b, s, a, t, flash, e=2.0):
    """Bytes of one layer's stored activations that only the attention core needs, one
    micro-batch: softmax output (2 bytes per score element, 4 when the softmax runs unfused in
    fp32, :func:`~vtrain_fast.model.ops.fused_softmax`), dropout mask (1) and dropout output (2)
    over ``b (a/t) s^2`` elements; with FlashAttention (``flash`` non-zero) the fp32
    log-sum-exp per query row, ``4 b (a/t) s``. Selective recomputation drops exactly these; a
    GPT layer then keeps ``sbh (10 + 24/t)`` (Korthikanti et al. 2022, Sec. 5, Table 2). With ``e``
    bytes per activation element (4 under fp32 / tf32) the softmax output and the dropout output
    are ``e`` bytes each (the mask stays 1)."""
    if flash != 0.0:
        return 4.0 * b * a / t * s
    softmax_out = e if fused_softmax(b, s, a, t) != 0.0 or e > 2.0 else 4.0
    return (softmax_out + 1.0 + e) * a * s * s * b / t


@jit
def stage_activation_bytes_from_layer(layers_on_stage, in_flight, b, s, h, full, recompute, e=2.0):
    """Activation bytes of one pipeline stage holding ``in_flight`` micro-batches (or chunks)
    of ``layers_on_stage`` layers, given ``full``, the bytes of one layer
    (:func:`layer_activation_bytes`), so that callers can reuse it across stages.

    With full recomputation each layer keeps only its input (``e s b h``, ``e`` the bytes of an
    element: 2, 4 under fp32 / tf32; ``h`` is the hidden size a rank keeps, ``h / t`` with sequence
    parallelism) and one layer's full activations are rebuilt at a time during backward."""
    if recompute:
        return in_flight * layers_on_stage * e * s * b * h + full
    return in_flight * layers_on_stage * full


@jit
def bf16_layers_extra_bytes(n16, in_flight, extra, recompute):
    """Activation bytes more that a stage's ``n16`` layers kept in bf16 under FP8 store than FP8
    layers would, ``in_flight`` micro-batches held: ``extra`` per layer and micro-batch
    (:func:`fp8_activation_saving_bytes`, the saving they lack). With full recomputation (``recompute``
    true) the layers keep only their inputs, as FP8 ones do, and one layer is rebuilt at a time: ``extra``
    once when the stage has any."""
    if recompute:
        return extra if n16 > 0.0 else 0.0
    return in_flight * n16 * extra


@jit
def offloaded_activation_bytes(k, full, n16, extra16, nm, extra_moe):
    """Activation bytes of one micro-batch that activation offloading (``cpu_offloading_num_layers``
    ``k``) keeps in host memory instead of HBM: the saved tensors of a rank's first ``k`` transformer
    layers, ``k full`` (``full`` one layer's, :func:`layer_activation_bytes`) plus what the ``n16``
    of them kept in bf16 under FP8 and the ``nm`` of them that are MoE layers store beyond a dense FP8
    layer (``extra16``, ``extra_moe`` each); 0.0 at ``k <= 0``.

    The rule (Transformer Engine >= 2.10, transformer_engine/pytorch/cpu_offload.py,
    ``OffloadSynchronizer._default_offload_sync_init``, the schedule Megatron-core's
    ``get_cpu_offload_context`` gets): layers ``0 .. k - 1`` are offloaded; layer ``i``'s copy to the
    host must finish before the forward of layer ``N - k + i`` starts (its GPU copy is freed then) and
    its copy back starts at the backward of layer ``N - 1 - k + i``, so "activation memory usage is
    equal to (num_layers - num_offloaded_layers) x T": the whole ``k`` layers' bytes leave, including
    the one in flight (which takes the place of a layer already freed). Every saved tensor counts as
    offloaded (TE skips tensors under 2^20 elements and weights: not told apart here)."""
    if k <= 0.0:
        return 0.0
    return k * full + n16 * extra16 + nm * extra_moe


# FP8 (Transformer Engine): bytes per element of an FP8 tensor, and of the FP8 weight copies
# TE keeps per linear weight between micro-batches (the FP8 weight and its FP8 transpose for the
# data-gradient GEMM, Hopper's FP8 GEMMs taking only the TN layout).
FP8_BYTES = 1.0
FP8_WEIGHT_COPY_BYTES_PER_PARAM = 2.0


@jit
def linear_weights_per_rank(h, a, g, f, t, gated=0.0, qw=0.0, arch=DEFAULT_ARCH):
    """Weights (no biases) of one layer's four linears held by one tensor-parallel rank:
    QKV ``h (qw + 2 qw g/a)``, projection ``qw h``, FC1 and FC2 ``(2 + gated) h f``, over ``t``
    (``qw`` the attention width, :func:`~vtrain_fast.model.ops.attention_width`; 0: ``h``). With
    multi-head latent attention (``arch``) MLA's linears instead of QKV, the down projections whole
    and the up projections over ``t`` (:func:`~vtrain_fast.model.ops.mla_weights`), and the
    projection ``a v_head_dim x h`` over ``t``."""
    if arch.multi_latent_attention != 0.0:
        rep, split = mla_weights(h, a, arch)
        return rep + (split + context_width(h, a, arch) * h + (2.0 + gated) * h * f) / t
    q = qw if qw > 0.0 else h
    return (h * (q + 2.0 * q * g / a) + q * h + (2.0 + gated) * h * f) / t


@jit
def fp8_weight_copy_bytes(h, a, g, f, t, fp8, gated=0.0, mxfp8=0.0, qw=0.0, arch=DEFAULT_ARCH):
    """Bytes of one layer's FP8 weight copies on one TP rank with ``fp8`` non-zero: 2 bytes per
    linear weight (:data:`FP8_WEIGHT_COPY_BYTES_PER_PARAM`: the FP8 weight and its transpose,
    cached by Transformer Engine across the micro-batches of a step) on top of the bf16 weights
    and fp32 states; 0.0 otherwise. Embeddings and the LM head have none (not TE layers).

    With ``mxfp8`` non-zero (``fp8_recipe`` = mxfp8) TE's MXFP8 weight keeps a rowwise and a
    columnwise FP8 copy, each with one E8M0 (1-byte) scale per 32 elements
    (:data:`~vtrain_fast.model.ops.MXFP8_SCALE_BYTES_PER_ELEMENT`): 2 + 2/32 bytes per weight.
    Delayed and tensorwise scaling keep one fp32 scale per tensor (not counted)."""
    if fp8 == 0.0:
        return 0.0
    per_weight = FP8_WEIGHT_COPY_BYTES_PER_PARAM + (2.0 * MXFP8_SCALE_BYTES_PER_ELEMENT if mxfp8 != 0.0 else 0.0)
    return per_weight * linear_weights_per_rank(h, a, g, f, t, gated, qw, arch)


@jit
def fp8_activation_saving_bytes(b, s, h, f, t, flash, sp, fp8, mxfp8=0.0, qw=0.0, latent=0.0):
    """Bytes fewer that one layer stores for backward, one micro-batch, with ``fp8`` non-zero:
    Transformer Engine saves the FP8 (1-byte) copy of a linear's input for its weight-gradient
    GEMM instead of the bf16 one (:func:`layer_activation_bytes` counts 2 bytes). Saved inputs
    that nothing else needs: QKV's and FC1's (the layer-norm outputs, ``s b h`` each; split over
    ``t`` with sequence parallelism), FC2's (the activation output, ``s b f / t``) and, without
    FlashAttention, the projection's (the context, ``s b qw / t``, ``qw`` the attention width, 0:
    ``h``; FlashAttention keeps it in bf16
    as its output for its own backward). 0.0 otherwise. With multi-head latent attention ``qw`` is
    the context's width (:func:`~vtrain_fast.model.ops.context_width`) and ``latent`` (``q_lora_rank
    + kv_lora_rank``) adds the up projections' inputs (``s b latent``, over ``t`` with sequence
    parallelism); its two down projections are counted as QKV's one saved input (each keeps its
    own FP8 copy of it: the second copy is not counted, an approximation).

    With ``mxfp8`` non-zero the saved (columnwise) MXFP8 copy carries its E8M0 scales, 1/32 byte
    per element (:data:`~vtrain_fast.model.ops.MXFP8_SCALE_BYTES_PER_ELEMENT`): 1 - 1/32 bytes
    fewer per element."""
    if fp8 == 0.0:
        return 0.0
    outside = 2.0 / t if sp != 0.0 else 2.0       # the QKV and FC1 inputs
    proj = 0.0 if flash != 0.0 else (qw if qw > 0.0 else h) / t
    saved = FP8_BYTES + (MXFP8_SCALE_BYTES_PER_ELEMENT if mxfp8 != 0.0 else 0.0)
    if latent > 0.0:        # MLA: the up projections' inputs too
        return (2.0 - saved) * s * b * (outside * h + f / t + proj + 0.5 * outside * latent)
    return (2.0 - saved) * s * b * (outside * h + f / t + proj)
