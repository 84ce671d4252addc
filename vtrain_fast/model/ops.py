"""Per-operator cost formulas: FLOPs, bytes moved and seconds on one GPU.

All functions are scalar, ``float64`` in and out, and compiled with :func:`vtrain_fast.model._jit.jit`.
Symbols (Megatron-LM names): ``b`` micro_batch_size, ``s`` seq_length, ``h`` hidden_size,
``a`` num_attention_heads, ``g`` num_query_groups, ``f`` ffn_hidden_size, ``v`` vocab_size,
``t`` tensor-parallel size. Activations are 2-byte (fp16/bf16), 4-byte under ``precision`` fp32 or
tf32 (:func:`element_bytes`).

Time model: roofline (Williams, Waterman, Patterson 2009, "Roofline", CACM 52(4)) with achievable
fractions of peak, plus a per-kernel overhead:
``time = max(flops / (peak * gemm_efficiency * sm_util), bytes / (hbm_Bps * hbm_efficiency)) + overhead``
where ``sm_util = min(1, tiles / num_sms)`` is the fraction of SMs a GEMM with fewer 128 x 128
output tiles than SMs keeps busy (NVIDIA, "Matrix Multiplication Background User's Guide", 2023,
tile and wave quantization). From one wave up, no tail is charged: cuBLAS picks the tile shape
(and split-K) per problem, and a fixed 128 x 128 wave sawtooth fitted vTrain's single-node
measurements worse (MAPE 6.89% vs 6.52%, same free parameters). ``gemm_efficiency`` is the
large-GEMM ceiling: for the A100 it is pinned to a published matmul benchmark, not fitted
(see ``gemm_efficiency`` in ``vtrain_fast/data/gpus/a100-sxm4-80gb.toml``). A phase of kernels lasts at least
``num_kernels * host_launch_s`` (:func:`phase_s`).
"""
from __future__ import annotations

import math

from ._jit import jit, jit_inline
from .arch import DEFAULT_ARCH, LEARNED_POSITIONS, ROPE
from .records import (CP_ALL_GATHER, FP8_MXFP8, FP8_TENSORWISE, MACHINE, PRECISION_FP16, PRECISION_FP32,
                      PRECISION_FP8, PRECISION_TF32)






BYTES_PER_ELEMENT = 2.0  # fp16 / bf16 activations and weights
FP32_BYTES_PER_ELEMENT = 4.0  # fp32 activations and weights (precision fp32 or tf32)
GEMM_TILE = 128.0        # output tile edge of a tensor-core GEMM (CUTLASS/cuBLAS 128x128 tiles)
# Kernels launched per phase, as modelled below (GEMMs + memory-bound kernels).
# Forward memory-bound: LN1, scale-mask-softmax, dropout, permute copy, bias-dropout-add, LN2,
# bias-GeLU, bias-dropout-add = 8. Backward: 2 LN, softmax, dropout, permute copy, 2
# bias-dropout-add, 2 residual-gradient adds, bias-GeLU, and 2 bias-gradient reductions = 12.
LAYER_FORWARD_MEMORY_KERNELS = 8.0
LAYER_BACKWARD_MEMORY_KERNELS = 12.0
LAYER_FORWARD_KERNELS = 6.0 + LAYER_FORWARD_MEMORY_KERNELS
# With FlashAttention (machine-vector field ``flash_attn``) the scores and context GEMMs, the
# softmax and the attention dropout become one fused kernel forward and three backward
# (FlashAttention-2: dO.O preprocessing, the main kernel, the fp32 dQ conversion).
FLASH_LAYER_FORWARD_MEMORY_KERNELS = LAYER_FORWARD_MEMORY_KERNELS - 2.0
FLASH_LAYER_BACKWARD_MEMORY_KERNELS = LAYER_BACKWARD_MEMORY_KERNELS - 2.0
FLASH_FORWARD_KERNELS = 1.0
FLASH_BACKWARD_KERNELS = 3.0
FLASH_LAYER_FORWARD_KERNELS = 4.0 + FLASH_FORWARD_KERNELS + FLASH_LAYER_FORWARD_MEMORY_KERNELS
FLASH_LAYER_BACKWARD_KERNELS = 8.0 + FLASH_BACKWARD_KERNELS + FLASH_LAYER_BACKWARD_MEMORY_KERNELS
LAYER_BACKWARD_KERNELS = 12.0 + LAYER_BACKWARD_MEMORY_KERNELS
# Megatron's fused scale-mask-softmax (FusedScaleMaskSoftmax.is_kernel_available, Megatron-LM
# megatron/core/fusions/fused_softmax.py) runs only for 16 < s <= 4096, s % 4 == 0 and
# (micro_batch_size * heads per TP rank) a multiple of the causal kernel's batches per block (4;
# 8 for s <= 128). Megatron-DeepSpeed and Megatron-LM before 2022 (megatron/model/fused_softmax.py)
# allow s <= 2048 and only check the multiple of 4: the rules agree for 128 < s <= 2048.
# Otherwise PyTorch runs it unfused in fp32 (query-key layer scaling on, Megatron's default until
# 2024): cast to fp32, scale, in-place masked fill, softmax, cast back = 5 kernels instead of 1
# forward, and their 5 gradients backward (see softmax_costs).
FUSED_SOFTMAX_MAX_SEQ = 4096.0
FUSED_SOFTMAX_SHORT_SEQ = 128.0   # up to here a warp holds two rows: 8 batches per block
UNFUSED_SOFTMAX_EXTRA_KERNELS = 4.0
# The attention core's memory-bound kernels: softmax, dropout, context permute copy.
ATTENTION_CORE_MEMORY_KERNELS = 3.0
EMBEDDING_KERNELS = 3.0 + 4.0
HEAD_KERNELS = (1.0 + 1.0 + 4.0) + (2.0 + 2.0 + 2.0)
# FP8 (machine-vector field ``precision`` = fp8, Transformer Engine): bytes per element of a
# linear's quantized operand written by TE's fused cast-transpose kernel (read bf16 2, write the
# FP8 copy 1 and its FP8 transpose 1; the amax of delayed scaling is taken in the same pass), and
# per element of a GEMM's FP8 operands. Four linears per layer (QKV, projection, FC1, FC2).
FP8_CAST_TRANSPOSE_BYTES = 4.0
FP8_BYTES_PER_ELEMENT = 1.0
FP8_LINEARS = 4.0
# FP8 recipes (machine-vector field ``fp8_recipe``, Megatron-LM --fp8-recipe, read in
# megatron/training/arguments.py _add_transformer_engine_args; default delayed).
# tensorwise (TE Float8CurrentScaling): Float8CurrentScalingQuantizer::quantize_impl
# (transformer_engine/pytorch/csrc/quantizer.cpp) runs nvte_compute_amax over the high-precision
# tensor (one more read, 2 bytes per element), then nvte_compute_scale_from_amax (a one-thread
# kernel), then the cast: 2 more kernels and 2 more bytes per element for each quantized tensor.
FP8_AMAX_BYTES = 2.0
FP8_AMAX_KERNELS = 2.0
# mxfp8 (TE MXFP8BlockScaling, Blackwell): one E8M0 (1-byte) scale per block of 32 consecutive
# elements (TE docs, features/low_precision_training/mxfp8), in each direction that is written:
# TE's MXFP8 quantize writes the rowwise and the columnwise copy with their scales in one kernel
# and takes no amax pass; a block-scaled GEMM also reads its operands' scales.
MXFP8_BLOCK = 32.0
MXFP8_SCALE_BYTES_PER_ELEMENT = 1.0 / MXFP8_BLOCK


@jit
def attention_width(h, a, arch):
    """Width of the attention's queries, context and output-projection input, ``a x d`` with
    ``d = arch.kv_channels`` (Megatron-LM ``--kv-channels``; Megatron-core's
    ``query_projection_size``), or ``h`` when ``kv_channels`` is 0 (``d = h / a``, the default).
    Keys and values are ``g x d`` each (``attention_width * g / a``); the attention-only formulas
    below take it where they name ``h``.

    With multi-head latent attention (:func:`mla_on`) the attention core's queries and keys have
    ``dq = qk_head_dim + qk_pos_emb_head_dim`` channels per head and its values and output
    ``v_head_dim``, ``g = a`` heads of each: this is then ``a (dq + v_head_dim) / 2``, the one
    head width that gives the core's exact FLOPs (``Q K^T`` ``2 s^2 dq`` plus ``P V`` ``2 s^2
    v_head_dim`` per head: ``4 s^2 (dq + v_head_dim) / 2``), FlashAttention's forward bytes (Q, K,
    V and O together), the context-parallel K/V bytes and Korthikanti's Q, K, V and context
    activations exactly (their sum is what each formula takes); the backward's bytes and the
    unfused core's GEMM tile counts are those of the mean width (an approximation). The output
    projection's input is :func:`context_width`."""
    if arch.multi_latent_attention != 0.0:
        return a * (arch.qk_head_dim + arch.qk_pos_emb_head_dim + arch.v_head_dim) / 2.0
    d = arch.kv_channels
    return a * d if d > 0.0 else h


@jit
def context_width(h, a, arch):
    """Width of the attention's output (the context, the output projection's input): ``a x
    v_head_dim`` with multi-head latent attention, else :func:`attention_width`."""
    if arch.multi_latent_attention != 0.0:
        return a * arch.v_head_dim
    return attention_width(h, a, arch)


# Multi-head latent attention (DeepSeek-V2, arXiv:2405.04434, Sec. 2.1.2-2.1.3; DeepSeek-V3,
# arXiv:2412.19437, Sec. 2.1.1; Megatron-core MLASelfAttention, megatron/core/transformer/
# multi_latent_attention.py). Its linears replace QKV: with q_lora_rank, linear_q_down_proj h ->
# q_lora_rank (a TELinear in parallel_mode "duplicated": every TP rank holds the whole weight and
# runs it on its own tokens, the sequence-parallel share b s / t with sequence parallelism), the
# q norm, linear_q_up_proj q_lora_rank -> a dq (column parallel, over t; with sequence
# parallelism it gathers its q_lora_rank-wide input); without, linear_q_proj h -> a dq (column
# parallel); linear_kv_down_proj h -> kv_lora_rank + qk_pos_emb_head_dim (duplicated), the kv
# norm, linear_kv_up_proj kv_lora_rank -> a (qk_head_dim + v_head_dim) (column parallel); the
# rotary key channels are shared by the heads. Then the query and key are assembled per head
# (torch.cat of the rotary and the other channels, the value made contiguous): one copy kernel
# each, read and written once.
MLA_COPY_KERNELS = 3.0


@jit
def mla_on(arch):
    """Whether the model has multi-head latent attention (the kernels' ``multi_latent_attention`` column)."""
    return arch.multi_latent_attention != 0.0


@jit
def mla_linears(arch):
    """MLA's linears before the output projection: 4 with ``q_lora_rank`` (two down, two up), 3 without."""
    return 4.0 if arch.q_lora_rank > 0.0 else 3.0


@jit
def mla_latent_width(arch):
    """Channels per token of MLA's compressed, normalised activations: ``q_lora_rank + kv_lora_rank``."""
    return arch.q_lora_rank + arch.kv_lora_rank


@jit
def mla_weights(h, a, arch):
    """``(replicated, split)`` weights of MLA's linears before the output projection (no biases):
    replicated on every TP rank, the down projections ``h q_lora_rank + h (kv_lora_rank +
    qk_pos_emb_head_dim)``; split over ``t``, the up projections ``q_lora_rank a dq +
    kv_lora_rank a (qk_head_dim + v_head_dim)`` (without ``q_lora_rank``: ``h a dq`` for the
    query, split, and no query down projection), ``dq = qk_head_dim + qk_pos_emb_head_dim``
    (DeepSeek-V2 Sec. 2.1.2-2.1.3: W^DQ, W^UQ, W^QR; W^DKV, W^KR; W^UK, W^UV). The output projection
    ``a v_head_dim x h`` is split too (:func:`context_width`)."""
    dq = arch.qk_head_dim + arch.qk_pos_emb_head_dim
    rep = h * (arch.kv_lora_rank + arch.qk_pos_emb_head_dim)
    split = arch.kv_lora_rank * a * (arch.qk_head_dim + arch.v_head_dim)
    if arch.q_lora_rank > 0.0:
        rep += h * arch.q_lora_rank
        split += arch.q_lora_rank * a * dq
    else:
        split += h * a * dq
    return rep, split


@jit
def mla_linear_s(m, n, k, backward, hw):
    """One MLA linear ``(m x k) @ (k x n)``: forward, or (``backward`` True) its data-gradient and
    weight-gradient GEMMs (:func:`linear_gemm_time_s`)."""
    if backward:
        return linear_gemm_time_s(m, k, n, hw) + linear_gemm_time_s(k, n, m, hw)
    return linear_gemm_time_s(m, n, k, hw)


@jit
def mla_gemms_s(tokens, h, a, t, sp, backward, hw, arch):
    """Seconds of MLA's linears before the output projection, one micro-batch, one TP rank
    (``tokens = b s``; ``sp`` = :func:`sequence_split`), forward or (``backward``) both gradients:
    the down projections on ``tokens / sp`` rows (replicated weights on each rank's own tokens),
    the up projections on ``tokens`` rows into ``1/t`` of their outputs (column parallel), as
    :data:`MLA_COPY_KERNELS`' comment lists them."""
    rows = tokens / sp
    dq = a * (arch.qk_head_dim + arch.qk_pos_emb_head_dim) / t
    time = mla_linear_s(rows, arch.kv_lora_rank + arch.qk_pos_emb_head_dim, h, backward, hw)   # kv down
    time += mla_linear_s(tokens, a * (arch.qk_head_dim + arch.v_head_dim) / t, arch.kv_lora_rank, backward, hw)
    if arch.q_lora_rank > 0.0:
        time += mla_linear_s(rows, arch.q_lora_rank, h, backward, hw)                  # q down
        time += mla_linear_s(tokens, dq, arch.q_lora_rank, backward, hw)               # q up
    else:
        time += mla_linear_s(tokens, dq, h, backward, hw)                              # q, full rank
    return time


@jit
def mla_up_gemms_s(tokens, h, a, t, wgrad, hw, arch):
    """Seconds of MLA's column-parallel linears (the query's up or full-rank projection and the
    key/value up projection) alone: their forward GEMMs, or (``wgrad``) their weight-gradient
    GEMMs: what the tensor-parallel exchanges that QKV's GEMMs hide in standard attention can hide
    under (:func:`~vtrain_fast.model.overlap.tp_backward_hidden_s`)."""
    dq = a * (arch.qk_head_dim + arch.qk_pos_emb_head_dim) / t
    q_in = arch.q_lora_rank if arch.q_lora_rank > 0.0 else h
    kv_out = a * (arch.qk_head_dim + arch.v_head_dim) / t
    if wgrad:
        return linear_gemm_time_s(q_in, dq, tokens, hw) + linear_gemm_time_s(arch.kv_lora_rank, kv_out, tokens, hw)
    return linear_gemm_time_s(tokens, dq, q_in, hw) + linear_gemm_time_s(tokens, kv_out, arch.kv_lora_rank, hw)


@jit
def mla_linear_elements(tokens, h, a, t, sp, outputs, arch):
    """Elements of MLA's linears' inputs (or, ``outputs`` True, their outputs, whose gradients
    the backward quantizes) on one TP rank, one micro-batch, before the output projection: the
    down projections' ``tokens / sp`` rows of ``h`` (outputs ``q_lora_rank`` and ``kv_lora_rank +
    qk_pos_emb_head_dim``), the up projections' ``tokens`` rows of ``q_lora_rank`` and
    ``kv_lora_rank`` (outputs ``a dq / t``, ``a (qk_head_dim + v_head_dim) / t``); without
    ``q_lora_rank`` the query's ``tokens x h`` (output ``a dq / t``). For the FP8 casts
    (:func:`fp8_cast_forward`, :func:`fp8_cast_backward`), as the standard path counts QKV's."""
    rows = tokens / sp
    dq = a * (arch.qk_head_dim + arch.qk_pos_emb_head_dim) / t
    if outputs:
        n = rows * (arch.kv_lora_rank + arch.qk_pos_emb_head_dim) + tokens * a * (arch.qk_head_dim + arch.v_head_dim) / t
        if arch.q_lora_rank > 0.0:
            return n + rows * arch.q_lora_rank + tokens * dq
        return n + tokens * dq
    n = rows * h + tokens * arch.kv_lora_rank
    if arch.q_lora_rank > 0.0:
        return n + rows * h + tokens * arch.q_lora_rank
    return n + tokens * h


@jit
def mla_memory_costs(tokens, a, t, sp, backward, arch):
    """``(bytes, kernels)`` of MLA's memory-bound work, one micro-batch, one TP rank, one way: the
    q and kv norms over ``q_lora_rank`` and ``kv_lora_rank`` on the ``tokens / sp`` rows the down
    projections produced (read 2 + write 2 bytes per element forward, x and dy read, dx written
    backward: 6; one kernel each, the q norm only with ``q_lora_rank``; Megatron-core fuses them
    into the up projections' TE LayerNormColumnParallelLinear, the same bytes), and the assembly
    of the per-head query, key and value (:data:`MLA_COPY_KERNELS`: read and write ``a (2 dq +
    v_head_dim) / t`` per token, 2 + 2 bytes; the backward's split, head-sum of the shared rotary
    key's gradient and concatenation charged the same bytes, an approximation). MLA's rotary
    kernels are :func:`rope_costs`'."""
    norm = (6.0 if backward else 4.0) * tokens * mla_latent_width(arch) / sp
    dq = arch.qk_head_dim + arch.qk_pos_emb_head_dim
    copies = 4.0 * tokens * a * (2.0 * dq + arch.v_head_dim) / t
    return norm + copies, (2.0 if arch.q_lora_rank > 0.0 else 1.0) + MLA_COPY_KERNELS


@jit
def full_precision(hw):
    """Whether the machine vector trains without mixed precision (``precision`` fp32 or tf32):
    fp32 weights, activations, gradients and communication."""
    return hw[MACHINE.precision] == PRECISION_FP32 or hw[MACHINE.precision] == PRECISION_TF32


@jit
def element_bytes(hw):
    """Bytes of one element of the weights, activations, gradients and the tensors the
    collectives move: :data:`BYTES_PER_ELEMENT` (2: bf16, fp16, and fp8's bf16 tensors), or
    :data:`FP32_BYTES_PER_ELEMENT` (4) under ``precision`` fp32 or tf32 (:func:`full_precision`)."""
    return FP32_BYTES_PER_ELEMENT if full_precision(hw) else BYTES_PER_ELEMENT


@jit
def grad_bytes(hw):
    """Bytes of one gradient element as kept, accumulated and reduced over the data-parallel ranks:
    4 (:data:`FP32_BYTES_PER_ELEMENT`) under ``precision`` fp32 / tf32, and under bf16 and fp8, where
    Megatron-LM keeps fp32 main gradients by default (``accumulate_allreduce_grads_in_fp32``, set by
    ``--bf16`` unless ``--grad-reduce-in-bf16``: megatron/training/arguments.py; the grad buffer's dtype,
    megatron/core/distributed/param_and_grad_buffer.py), unless ``grad_reduce_in_bf16``; 2
    (:data:`BYTES_PER_ELEMENT`) under fp16, where Megatron-LM keeps fp16 gradients, and with
    ``grad_reduce_in_bf16``. The parameter all-gathers move :func:`element_bytes`."""
    if full_precision(hw):
        return FP32_BYTES_PER_ELEMENT
    if hw[MACHINE.precision] == PRECISION_FP16 or hw[MACHINE.grad_reduce_in_bf16] != 0.0:
        return BYTES_PER_ELEMENT
    return FP32_BYTES_PER_ELEMENT


@jit
def activation_scale(hw):
    """What the bytes of the memory-bound kernels of the layers, embeddings and head (written here
    for 2-byte elements) are multiplied by: :func:`element_bytes` / 2, so 2.0 under fp32 or tf32.
    Their 1-byte dropout masks and fp32 statistics are scaled with them (an overcount of at most
    1/7 of a kernel's bytes, under fp32 only)."""
    return element_bytes(hw) * (1.0 / BYTES_PER_ELEMENT)


@jit
def gemm_peak_flops(hw):
    """The dense peak FLOP/s of the GEMMs of ``precision``: ``peak_flops`` (fp16/bf16 tensor
    cores; also fp8's GEMMs that stay in bf16), ``peak_tf32_flops`` under tf32 and
    ``peak_fp32_flops`` (CUDA cores on NVIDIA, FP32 matrix cores on AMD) under fp32; a sweep
    refuses the precision on a GPU without that peak (``plan.spec``)."""
    if hw[MACHINE.precision] == PRECISION_FP32:
        return hw[MACHINE.peak_fp32_flops]
    if hw[MACHINE.precision] == PRECISION_TF32:
        return hw[MACHINE.peak_tf32_flops]
    return hw[MACHINE.peak_flops]


@jit
def flash_on(hw):
    """Whether the attention core runs as FlashAttention: ``use_flash_attn`` set and 16-bit
    tensors (FlashAttention-2 takes fp16 / bf16 only; under fp32 or tf32 Transformer Engine's
    DotProductAttention falls back to its unfused backend)."""
    return hw[MACHINE.use_flash_attn] != 0.0 and not full_precision(hw)


@jit
def phase_s(gpu_s, num_kernels, hw):
    """Seconds of a phase of ``num_kernels`` kernels whose GPU time is ``gpu_s``: eager
    PyTorch launches asynchronously, so the phase takes the larger of the GPU time and the host
    time ``num_kernels * host_launch_s`` (the host-bound regime of small models)."""
    return max(gpu_s, num_kernels * hw[MACHINE.host_launch_s])


@jit
def gemm_time_s(m, n, k, batch, hw):
    """Seconds for ``batch`` GEMMs of ``(m x k) @ (k x n)`` in the training precision.

    Parameters
    ----------
    m, n, k, batch : float
        GEMM dimensions and batch count (a plain GEMM has ``batch = 1``).
    hw : numpy.ndarray
        Machine vector, ``float64``, shape ``(NUM_HW_FIELDS,)``.

    Returns
    -------
    float
        Seconds: roofline of ``2*m*n*k*batch`` FLOPs at the precision's peak
        (:func:`gemm_peak_flops`: the fp16/bf16, TF32 or FP32 one) ``* gemm_efficiency`` times the
        SM utilisation ``min(1, tiles / num_sms)`` of ``ceil(m/128) * ceil(n/128) * batch`` output
        tiles, and ``e*(m*k + k*n + m*n)*batch`` bytes (``e`` :func:`element_bytes`) at ``hbm_Bps *
        hbm_efficiency``, plus one kernel overhead. The one ``gemm_efficiency`` (fitted on bf16
        GEMMs) is taken for every precision: an assumption for the TF32 and FP32 GEMMs.
    """
    flops = 2.0 * m * n * k * batch
    nbytes = element_bytes(hw) * (m * k + k * n + m * n) * batch
    tiles = math.ceil(m / GEMM_TILE) * math.ceil(n / GEMM_TILE) * batch
    # flops / (peak * efficiency * sm_util) with sm_util = min(1, tiles / num_sms); the
    # reciprocal rate is shared by every GEMM of a caller
    t_compute = flops * (1.0 / (gemm_peak_flops(hw) * hw[MACHINE.gemm_efficiency])) * max(hw[MACHINE.num_sms] / tiles, 1.0)
    t_memory = nbytes * (1.0 / (hw[MACHINE.hbm_Bps] * hw[MACHINE.hbm_efficiency]))
    return max(t_compute, t_memory) + hw[MACHINE.kernel_overhead_s]


@jit
def fp8_gemm_time_s(m, n, k, hw, groups=1.0):
    """Seconds for one GEMM ``(m x k) @ (k x n)`` with FP8 operands and a bf16 result, as
    Transformer Engine runs a linear layer's forward, data-gradient and weight-gradient GEMMs
    under ``precision = fp8`` (cuBLASLt FP8 GEMMs with per-tensor scales; Micikevicius et al. 2022,
    "FP8 Formats for Deep Learning", arXiv:2209.05433).

    Roofline as :func:`gemm_time_s`, with ``2*m*n*k`` FLOPs at ``peak_fp8_flops *
    fp8_gemm_efficiency`` times the same SM utilisation (``min(1, tiles / num_sms)``, 128 x 128
    output tiles), and ``(m*k + k*n) * 1 + m*n * 2`` bytes (FP8 A and B, bf16 C), plus one kernel
    overhead.

    With ``fp8_recipe`` = mxfp8 the GEMM is block scaled (cuBLASLt MXFP8, Blackwell
    ``tcgen05.mma kind::mxf8f6f4.block_scale``, the same tensor-core rate as unscaled FP8: CUTLASS
    docs, "Blackwell SM100 GEMMs", 2025): the same FLOP rate, and A and B each bring their E8M0
    scales, :data:`MXFP8_SCALE_BYTES_PER_ELEMENT` (1/32) byte per element more.

    ``groups`` equal GEMMs (a rank's local experts, Transformer Engine ``GroupedLinear``, which runs
    them concurrently on several CUDA streams, ``general_grouped_gemm`` / ``nvte_multi_stream_cublas_gemm``):
    ``groups`` times the FLOPs and bytes, the SM utilisation of all groups' tiles, one kernel overhead
    (the streams' launch gaps overlap), as the bf16 grouped GEMM (:func:`gemm_time_s` with ``batch``)."""
    flops = 2.0 * m * n * k * groups
    operand = FP8_BYTES_PER_ELEMENT + (MXFP8_SCALE_BYTES_PER_ELEMENT if hw[MACHINE.fp8_recipe] == FP8_MXFP8 else 0.0)
    nbytes = (operand * (m * k + k * n) + BYTES_PER_ELEMENT * m * n) * groups
    tiles = math.ceil(m / GEMM_TILE) * math.ceil(n / GEMM_TILE) * groups
    t_compute = flops * (1.0 / (hw[MACHINE.peak_fp8_flops] * hw[MACHINE.fp8_gemm_efficiency])) * max(hw[MACHINE.num_sms] / tiles, 1.0)
    t_memory = nbytes * (1.0 / (hw[MACHINE.hbm_Bps] * hw[MACHINE.hbm_efficiency]))
    return max(t_compute, t_memory) + hw[MACHINE.kernel_overhead_s]


@jit
def fp8_on(hw):
    """Whether the machine vector trains the linear layers in FP8 (``precision`` = fp8)."""
    return hw[MACHINE.precision] == PRECISION_FP8


@jit
def fp8_quantize_cost(hw):
    """``(bytes per element, kernels per tensor)`` of Transformer Engine quantizing one bf16 tensor
    to FP8 in both GEMM directions, by ``fp8_recipe``:

    - delayed (TE DelayedScaling): the fused cast-transpose, :data:`FP8_CAST_TRANSPOSE_BYTES` =
      4 (read 2, write the FP8 copy 1 and its transpose 1; the amax recorded in the same pass), one
      kernel.
    - tensorwise (TE Float8CurrentScaling): the same plus the amax pass right before the cast,
      :data:`FP8_AMAX_BYTES` = 2 more bytes and :data:`FP8_AMAX_KERNELS` = 2 more kernels
      (``nvte_compute_amax``, ``nvte_compute_scale_from_amax``): 6 bytes, 3 kernels.
    - mxfp8 (TE MXFP8BlockScaling): rowwise and columnwise FP8 copies, each with one E8M0 scale
      per 32 elements, in one kernel, no amax pass: 4 + 2/32 bytes, 1 kernel.

    Used for the linears' inputs (forward), output gradients (backward) and weights (once per
    iteration)."""
    if hw[MACHINE.fp8_recipe] == FP8_TENSORWISE:
        return FP8_CAST_TRANSPOSE_BYTES + FP8_AMAX_BYTES, 1.0 + FP8_AMAX_KERNELS
    if hw[MACHINE.fp8_recipe] == FP8_MXFP8:
        return FP8_CAST_TRANSPOSE_BYTES + 2.0 * MXFP8_SCALE_BYTES_PER_ELEMENT, 1.0
    return FP8_CAST_TRANSPOSE_BYTES, 1.0


@jit
def mxfp8_on(hw):
    """Whether the machine vector trains in FP8 with MXFP8 block scaling (``precision`` = fp8
    and ``fp8_recipe`` = mxfp8)."""
    return hw[MACHINE.precision] == PRECISION_FP8 and hw[MACHINE.fp8_recipe] == FP8_MXFP8


@jit
def linear_gemm_time_s(m, n, k, hw):
    """Seconds of one GEMM of a transformer layer's linear (QKV, projection, FC1, FC2: forward,
    data or weight gradient): :func:`fp8_gemm_time_s` with ``precision`` = fp8, else
    :func:`gemm_time_s` (bf16). Attention-core GEMMs, the LM head and the embeddings stay bf16
    (:func:`gemm_time_s`): Megatron-LM's output layer is not a Transformer Engine layer, and TE
    runs the attention core in bf16 unless FP8 attention is asked for (not modelled)."""
    if hw[MACHINE.precision] == PRECISION_FP8:
        return fp8_gemm_time_s(m, n, k, hw, 1.0)
    return gemm_time_s(m, n, k, 1.0, hw)


@jit
def fp8_cast_forward(b, s, h, f, t, hw, qw=0.0):
    """``(bytes, kernels)`` of one layer's FP8 quantization in forward, one micro-batch, one TP
    rank: Transformer Engine casts the input of each of the four linears to FP8 and writes its
    transpose for the weight-gradient GEMM in one fused cast-transpose kernel
    (:data:`FP8_CAST_TRANSPOSE_BYTES` = 4 bytes per element: read 2, write 1 + 1; delayed scaling
    records the amax in the same pass; per recipe :func:`fp8_quantize_cost`: current scaling adds
    an amax pass, MXFP8 the block scales). Inputs: QKV and FC1 ``b s h`` (the all-gathered input
    with sequence parallelism), projection ``b s qw/t`` (``qw`` the attention width,
    :func:`attention_width`; 0: ``h``), FC2 ``b s f/t``. ``(0, 0)`` in bf16 (multi-head latent
    attention: :func:`mla_fp8_casts`).

    The per-iteration amax-history and scale update of delayed scaling (one fused kernel per
    micro-batch per autocast region), its amax all-reduce over the data- and tensor-parallel group,
    and current scaling's amax all-reduce over the tensor-parallel group of the sequence-parallel
    inputs are not charged (one float per tensor: latency only)."""
    if hw[MACHINE.precision] != PRECISION_FP8:
        return 0.0, 0.0
    tokens = b * s
    q = qw if qw > 0.0 else h
    elems = tokens * (2.0 * h + q / t + f / t)
    per_element, kernels = fp8_quantize_cost(hw)
    return per_element * elems, FP8_LINEARS * kernels


@jit
def fp8_cast_backward(b, s, h, a, g, f, t, hw, gated=0.0, qw=0.0):
    """``(bytes, kernels)`` of one layer's FP8 quantization in backward, one micro-batch, one TP
    rank: each linear's output gradient is cast to FP8 (E5M2 in the hybrid format) with its
    transpose for the weight-gradient GEMM (TE's cast-transpose, fused with the bias gradient:
    4 bytes per element; per recipe :func:`fp8_quantize_cost`). Output gradients: QKV
    ``b s (qw + 2 qw g/a)/t`` (``qw`` the attention width, :func:`attention_width`; 0: ``h``),
    projection ``b s h``, FC1 ``b s (1 + gated) f/t``, FC2 ``b s h``. ``(0, 0)`` in bf16."""
    if hw[MACHINE.precision] != PRECISION_FP8:
        return 0.0, 0.0
    tokens = b * s
    q = qw if qw > 0.0 else h
    qkv_out = (q + 2.0 * q * g / a) / t
    elems = tokens * (qkv_out + h + (1.0 + gated) * f / t + h)
    per_element, kernels = fp8_quantize_cost(hw)
    return per_element * elems, FP8_LINEARS * kernels


@jit
def mla_fp8_casts(b, s, h, a, f, t, hw, backward, gated, arch):
    """``(bytes, kernels)`` of one MLA layer's FP8 quantization, one micro-batch, one TP rank, as
    :func:`fp8_cast_forward` (``backward`` False: the linears' inputs) and :func:`fp8_cast_backward`
    (their output gradients) count a standard layer's, with MLA's linears
    (:func:`mla_linear_elements`, one cast each) in place of QKV and the output projection's input
    the context, :func:`context_width`. ``(0, 0)`` in bf16."""
    if hw[MACHINE.precision] != PRECISION_FP8:
        return 0.0, 0.0
    tokens = b * s
    cw = context_width(h, a, arch)
    mla = mla_linear_elements(tokens, h, a, t, sequence_split(t, hw), backward, arch)
    if backward:        # projection h, FC1 (1 + gated) f / t, FC2 h
        elems = tokens * (h + (1.0 + gated) * f / t + h) + mla
    else:               # projection cw / t, FC1 h, FC2 f / t
        elems = tokens * (cw / t + h + f / t) + mla
    per_element, kernels = fp8_quantize_cost(hw)
    return per_element * elems, (FP8_LINEARS - 1.0 + mla_linears(arch)) * kernels


@jit
def memory_bound_time_s(nbytes, num_kernels, hw):
    """Seconds for memory-bound kernels (softmax, layer norm, GeLU, dropout, adds, Adam).

    Parameters
    ----------
    nbytes : float
        Bytes read plus written, all kernels together.
    num_kernels : float
        Kernel launches, each charged ``kernel_overhead_s``.
    hw : numpy.ndarray
        Machine vector.

    Returns
    -------
    float
        ``nbytes / (hbm_Bps * hbm_efficiency) + num_kernels * kernel_overhead_s``.
    """
    return nbytes * (1.0 / (hw[MACHINE.hbm_Bps] * hw[MACHINE.hbm_efficiency])) + num_kernels * hw[MACHINE.kernel_overhead_s]


@jit
def fused_softmax(b, s, a, t):
    """1.0 when Megatron's fused causal scale-mask-softmax kernel runs for ``b`` sequences of
    length ``s`` with ``a / t`` heads per TP rank, else 0.0.

    Megatron-LM ``FusedScaleMaskSoftmax.is_kernel_available``: ``16 < s <= 4096``, ``s % 4 == 0``
    and ``b * a / t`` a multiple of the kernel's batches per block (128 threads; 4 rows per
    block, 8 when ``s <= 128`` and a warp holds two rows; ``scaled_upper_triang_masked_softmax.h``).
    """
    # multiples of 4 and 8 tested by exact power-of-two scaling (no float modulo on the hot path)
    if s <= 16.0 or s > FUSED_SOFTMAX_MAX_SEQ or math.floor(s * 0.25) * 4.0 != s:
        return 0.0
    batches = b * a / t
    if s <= FUSED_SOFTMAX_SHORT_SEQ:
        return 1.0 if math.floor(batches * 0.125) * 8.0 == batches else 0.0
    return 1.0 if math.floor(batches * 0.25) * 4.0 == batches else 0.0


@jit
def softmax_costs(b, s, a, t):
    """``(forward bytes, backward bytes, extra kernels)`` of the scale-mask-softmax: HBM bytes per
    attention-score element each way and the kernels it launches beyond one, each way.

    Fused kernel (:func:`fused_softmax`): fp16 read and write forward (4), y and dy read and dx
    written backward (6), no extra kernel. Unfused fp32 path: cast (2 + 4), scale (4 + 4), masked
    fill (4 + 4), softmax (4 + 4), cast back (4 + 2) = 36 forward; their gradients
    6 + 12 + 8 + 8 + 6 = 40 backward; 5 kernels instead of 1 each way. PyTorch's softmax reads a
    row once and writes it once (in registers up to 1,024 elements, in shared memory beyond:
    ``cunn_SoftMaxForwardSmem``, rows up to about 12k fp32 values; older PyTorch re-read longer
    rows up to three times, not modelled)."""
    if fused_softmax(b, s, a, t) != 0.0:
        return 4.0, 6.0, 0.0
    return 36.0, 40.0, UNFUSED_SOFTMAX_EXTRA_KERNELS


@jit
def attention_scores_forward(b, s, h, a, t, hw):
    """The unfused attention core forward of one layer, one micro-batch, one TP rank, without its
    context permute copy: ``(GEMM seconds, memory-bound bytes, extra kernels)``.

    GEMMs: ``Q K^T`` and ``softmax(.) V``, batched over ``b * a/t`` heads (:func:`gemm_time_s`).
    Bytes over the ``b (a/t) s^2`` score elements: the scale-mask-softmax (:func:`softmax_costs`)
    and the attention dropout (read 2, write 2, 1-byte mask). Extra kernels: those of an unfused
    softmax. Shared by :func:`layer_forward_s` and :func:`attention_core_forward_s`. ``h`` is
    the attention width (:func:`attention_width`: heads of ``h / a`` channels).
    """
    heads = a / t
    score_elems = b * heads * s * s
    time = gemm_time_s(s, s, h / a, b * heads, hw)           # Q K^T
    time += gemm_time_s(s, h / a, s, b * heads, hw)          # softmax(.) V
    softmax_fwd, _, extra = softmax_costs(b, s, a, t)
    return time, (softmax_fwd + 5.0) * score_elems, extra


@jit
def sequence_split(t, hw):
    """How many ways the token-wise work outside attention and MLP (layer norms, dropouts,
    residual adds) is split: ``t`` with sequence parallelism (Korthikanti et al. 2022, Sec. 4.2.2),
    else 1 (every TP rank repeats it)."""
    return t if hw[MACHINE.sequence_parallel] != 0.0 else 1.0


# Rotary position embedding (Megatron-core with Transformer Engine's fused RoPE): one kernel on q
# and one on k each way, each reading and writing its 2-byte tensor.
ROPE_KERNELS = 2.0


@jit
def rope_costs(b, s, h, a, g, t, arch):
    """``(bytes, kernels)`` of the rotary embedding of one layer, one micro-batch, one TP rank, one
    way (forward on q and k, backward on their gradients): ``2 x 2 x b s (h + h g/a) / t`` bytes
    and :data:`ROPE_KERNELS` with ``arch.position_embedding_type`` rope, else ``(0, 0)``. ``h`` is
    the attention width (:func:`attention_width`). With multi-head latent attention the rotary
    channels only, always (Megatron-core's MLA applies its decoupled RoPE whatever the position
    embedding): the queries' ``a qk_pos_emb_head_dim / t`` and the shared key's
    ``qk_pos_emb_head_dim`` per token (the whole sequence's, gathered with sequence parallelism),
    ``2 x 2 x b s (a qk_pos_emb_head_dim / t + qk_pos_emb_head_dim)`` bytes (DeepSeek-V2 eqs. 15-16)."""
    if arch.multi_latent_attention != 0.0:
        r = arch.qk_pos_emb_head_dim
        return 4.0 * b * s * (a * r / t + r), ROPE_KERNELS
    if arch.position_embedding_type != ROPE:
        return 0.0, 0.0
    return 4.0 * b * s * (h + h * g / a) / t, ROPE_KERNELS


@jit
def layer_forward_s(b, s, h, a, g, f, t, hw, arch=DEFAULT_ARCH):
    """Forward compute seconds of one transformer layer for one micro-batch on one TP rank.

    Operators (Megatron-LM GPT layer, fused kernels as in Megatron-LM 2021): LN1, QKV GEMM,
    attention scores (batched GEMM), scale-mask-softmax (fused when Megatron's kernel accepts
    the shape, else five fp32 PyTorch kernels: :func:`fused_softmax`), attention dropout, context
    (batched GEMM), context permute copy, output projection GEMM, bias-dropout-add, LN2, FC1
    GEMM, bias-GeLU, FC2 GEMM, bias-dropout-add; with RoPE (``arch.position_embedding_type``) the
    rotary kernels on q and k (:func:`rope_costs`). RMSNorm moves the bytes of a LayerNorm, and a
    layer without biases (``arch.add_bias_linear`` 0) the same bytes (the bias adds are fused into
    the GeLU and dropout-add kernels). A gated MLP (``arch.gated_mlp`` 1: SwiGLU, Shazeer 2020,
    as Llama's and Megatron-LM's ``--swiglu``) has FC1 of width ``2f`` (gate and up, one fused
    GEMM) and its activation reads ``2f`` and writes ``f`` per token. With ``flash_attn`` set in ``hw`` the scores,
    softmax, dropout and context are one :func:`flash_attention_forward_s`. With ``precision`` =
    fp8 the four linears' GEMMs run in FP8 (:func:`linear_gemm_time_s`) and their inputs are
    quantized first (:func:`fp8_cast_forward`); the attention core stays bf16. Tensor-parallel
    communication is not included (see :mod:`vtrain_fast.model.comm`). Heads of
    ``arch.kv_channels`` channels (:func:`attention_width` ``qw = a d``): QKV ``h -> (qw + 2 qw
    g/a)/t``, the attention core over heads of ``d``, the projection ``qw/t -> h``.

    Multi-head latent attention (:func:`mla_on`, ``g = a``): MLA's linears (:func:`mla_gemms_s`:
    down projections replicated on ``b s / sp`` rows, up projections over ``t``) instead of QKV,
    their norms and the per-head query, key and value assembly (:func:`mla_memory_costs`), the
    rotary kernels on the rotary channels only (:func:`rope_costs`), their FP8 casts
    (:func:`mla_fp8_casts`), the core over heads of the mean of the query/key and value widths
    (:func:`attention_width`: the exact FLOPs), the projection ``a v_head_dim / t -> h``
    (:func:`context_width`).

    Returns
    -------
    float
        Seconds.
    """
    gated = arch.gated_mlp
    tokens = b * s
    qw = attention_width(h, a, arch)
    cw = context_width(h, a, arch)      # the projection's input (qw but with MLA)
    sp = sequence_split(t, hw)
    mla = arch.multi_latent_attention != 0.0
    if mla:
        time = mla_gemms_s(tokens, h, a, t, sp, False, hw, arch)        # MLA's linears instead of QKV
    else:
        qkv_out = (qw + 2.0 * qw * g / a) / t
        time = linear_gemm_time_s(tokens, qkv_out, h, hw)
    time += linear_gemm_time_s(tokens, h, cw / t, hw)          # output projection
    time += linear_gemm_time_s(tokens, (1.0 + gated) * f / t, h, hw)   # FC1 (gate and up when gated)
    time += linear_gemm_time_s(tokens, h, f / t, hw)           # FC2
    if mla:
        cast_bytes, cast_kernels = mla_fp8_casts(b, s, h, a, f, t, hw, False, gated, arch)   # (0, 0) in bf16
    else:
        cast_bytes, cast_kernels = fp8_cast_forward(b, s, h, f, t, hw, qw)   # (0, 0) in bf16
    rope_bytes, rope_kernels = rope_costs(b, s, qw, a, g, t, arch)   # (0, 0) without RoPE
    cast_bytes += rope_bytes            # (cast_*: the layer's extra memory-bound kernels: FP8 casts, RoPE)
    cast_kernels += rope_kernels
    gemm_kernels = 0.0                  # linears beyond QKV's one (MLA's)
    if mla:
        mla_bytes, mla_kernels = mla_memory_costs(tokens, a, t, sp, False, arch)
        cast_bytes += mla_bytes
        cast_kernels += mla_kernels
        gemm_kernels = mla_linears(arch) - 1.0
    nbytes = (
        2.0 * 4.0 * tokens * h / sp     # two layer norms: read 2 + write 2 bytes / element
        + 4.0 * tokens * cw / t         # context permute copy
        + 2.0 * 7.0 * tokens * h / sp   # two bias-dropout-adds: x, residual, out, mask
        + (4.0 + 2.0 * gated) * tokens * f / t   # bias-GeLU (SwiGLU: reads 2f, writes f)
    ) + cast_bytes
    nbytes *= activation_scale(hw)      # 4-byte elements under fp32 / tf32
    if flash_on(hw):
        time += flash_attention_forward_s(b, s, qw, a, g, t, hw)
        return phase_s(time + memory_bound_time_s(nbytes, FLASH_LAYER_FORWARD_MEMORY_KERNELS + cast_kernels, hw),
                       FLASH_LAYER_FORWARD_KERNELS + cast_kernels + gemm_kernels, hw)
    core_s, core_bytes, extra = attention_scores_forward(b, s, qw, a, t, hw)
    memory_s = memory_bound_time_s(nbytes + core_bytes * activation_scale(hw),
                                   LAYER_FORWARD_MEMORY_KERNELS + extra + cast_kernels, hw)
    return phase_s(time + core_s + memory_s, LAYER_FORWARD_KERNELS + extra + cast_kernels + gemm_kernels, hw)


@jit
def layer_backward_s(b, s, h, a, g, f, t, hw, arch=DEFAULT_ARCH):
    """Backward compute seconds of one transformer layer for one micro-batch on one TP rank.

    Each forward GEMM becomes a data-gradient and a weight-gradient GEMM of the same FLOPs;
    memory-bound kernels read the saved input and the incoming gradient and write the outgoing
    one (a gated MLP: FC1 of width ``2f``; its activation backward reads gate, up and ``dy`` and
    writes both gradients); with ``flash_attn`` the attention core is :func:`flash_attention_backward_s`;
    with ``precision`` = fp8 the eight linear GEMMs run in FP8 and the output gradients are
    quantized first (:func:`fp8_cast_backward`); with RoPE its kernels on the q and k gradients
    (:func:`rope_costs`). Recomputation is added by the caller. TP communication is not included.
    Heads of ``arch.kv_channels`` channels and multi-head latent attention as in :func:`layer_forward_s`.

    Returns
    -------
    float
        Seconds.
    """
    gated = arch.gated_mlp
    tokens = b * s
    heads = a / t
    qw = attention_width(h, a, arch)
    cw = context_width(h, a, arch)      # the projection's input (qw but with MLA)
    score_elems = b * heads * s * s
    sp = sequence_split(t, hw)
    mla = arch.multi_latent_attention != 0.0
    if mla:
        time = mla_gemms_s(tokens, h, a, t, sp, True, hw, arch)         # MLA's linears instead of QKV
    else:
        qkv_out = (qw + 2.0 * qw * g / a) / t
        time = linear_gemm_time_s(tokens, h, qkv_out, hw) + linear_gemm_time_s(h, qkv_out, tokens, hw)
    time += linear_gemm_time_s(tokens, cw / t, h, hw) + linear_gemm_time_s(cw / t, h, tokens, hw)
    fc1 = (1.0 + gated) * f / t                                # FC1 width (gate and up when gated)
    time += linear_gemm_time_s(tokens, h, fc1, hw) + linear_gemm_time_s(h, fc1, tokens, hw)
    time += linear_gemm_time_s(tokens, f / t, h, hw) + linear_gemm_time_s(f / t, h, tokens, hw)
    if mla:
        cast_bytes, cast_kernels = mla_fp8_casts(b, s, h, a, f, t, hw, True, gated, arch)   # (0, 0) in bf16
    else:
        cast_bytes, cast_kernels = fp8_cast_backward(b, s, h, a, g, f, t, hw, gated, qw)   # (0, 0) in bf16
    rope_bytes, rope_kernels = rope_costs(b, s, qw, a, g, t, arch)   # (0, 0) without RoPE
    cast_bytes += rope_bytes            # (cast_*: the layer's extra memory-bound kernels: FP8 casts, RoPE)
    cast_kernels += rope_kernels
    gemm_kernels = 0.0                  # linears' GEMMs beyond QKV's two (MLA's)
    if mla:
        mla_bytes, mla_kernels = mla_memory_costs(tokens, a, t, sp, True, arch)
        cast_bytes += mla_bytes
        cast_kernels += mla_kernels
        gemm_kernels = 2.0 * (mla_linears(arch) - 1.0)
    nbytes = (
        2.0 * 6.0 * tokens * h / sp     # two layer-norm backwards: x, dy -> dx
        + 4.0 * tokens * cw / t         # context permute copy
        + 2.0 * 5.0 * tokens * h / sp   # two bias-dropout-add backwards: dy, mask -> dx
        + 2.0 * 6.0 * tokens * h / sp   # two residual-gradient accumulations
        + (6.0 + 4.0 * gated) * tokens * f / t   # bias-GeLU backward: x, dy -> dx (SwiGLU: 2f, f -> 2f)
    ) + cast_bytes                      # (+ 2 bias-gradient reductions: launches, bytes negligible)
    if flash_on(hw):
        time += flash_attention_backward_s(b, s, qw, a, g, t, hw)
        return phase_s(time + memory_bound_time_s(nbytes, FLASH_LAYER_BACKWARD_MEMORY_KERNELS + cast_kernels, hw),
                       FLASH_LAYER_BACKWARD_KERNELS + cast_kernels + gemm_kernels, hw)
    time += gemm_time_s(s, qw / a, s, b * heads, hw) + gemm_time_s(qw / a, s, s, b * heads, hw)
    time += gemm_time_s(s, s, qw / a, b * heads, hw) + gemm_time_s(s, qw / a, s, b * heads, hw)
    _, softmax_bwd, extra = softmax_costs(b, s, a, t)
    nbytes += (softmax_bwd * score_elems  # softmax backward (fused: y, dy -> dx)
               + 5.0 * score_elems)       # dropout backward: dy, mask -> dx
    nbytes *= activation_scale(hw)      # 4-byte elements under fp32 / tf32
    return phase_s(time + memory_bound_time_s(nbytes, LAYER_BACKWARD_MEMORY_KERNELS + extra + cast_kernels, hw),
                   LAYER_BACKWARD_KERNELS + extra + cast_kernels + gemm_kernels, hw)


@jit
def attention_core_forward_s(b, s, h, a, g, t, hw):
    """Seconds of the attention core forward of one layer, one micro-batch, one TP rank, as a
    phase of its own: what selective recomputation runs again before the backward
    (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
    Sec. 5; Megatron-LM ``--recompute-granularity selective`` checkpoints ``core_attention``).

    Scores and context batched GEMMs, scale-mask-softmax (fused or not, :func:`fused_softmax`),
    attention dropout and the context permute copy, as in :func:`layer_forward_s`; with
    ``flash_attn`` the FlashAttention-2 forward (:func:`flash_attention_forward_s`). The
    host-launch floor applies to its kernels. ``h`` is the attention width
    (:func:`attention_width`), as in the FlashAttention and context-parallel formulas below.

    Returns
    -------
    float
        Seconds.
    """
    if flash_on(hw):
        return phase_s(flash_attention_forward_s(b, s, h, a, g, t, hw), FLASH_FORWARD_KERNELS, hw)
    time, nbytes, extra = attention_scores_forward(b, s, h, a, t, hw)
    nbytes += 4.0 * b * s * h / t                            # context permute copy
    nbytes *= activation_scale(hw)
    return phase_s(time + memory_bound_time_s(nbytes, ATTENTION_CORE_MEMORY_KERNELS + extra, hw),
                   2.0 + ATTENTION_CORE_MEMORY_KERNELS + extra, hw)


@jit
def flash_attention_blocks(b, s, a, t):
    """Thread blocks of a FlashAttention-2 launch: one per 128-row tile of the sequence, per head
    on this TP rank, per sequence of the micro-batch (``b * (a/t) * ceil(s/128)``)."""
    return b * (a / t) * math.ceil(s / GEMM_TILE)


@jit
def flash_attention_time_s(flops, nbytes, b, s, a, t, num_kernels, hw):
    """Seconds of FlashAttention kernels doing ``flops`` and moving ``nbytes``: roofline of
    ``flops`` at ``peak_flops * flash_attention_efficiency``, scaled by the SM occupancy
    ``min(1, blocks / num_sms)`` (:func:`flash_attention_blocks`), and ``nbytes`` at
    ``hbm_Bps * hbm_efficiency``, plus ``num_kernels`` kernel overheads."""
    occupancy = max(hw[MACHINE.num_sms] / flash_attention_blocks(b, s, a, t), 1.0)
    t_compute = flops / (hw[MACHINE.peak_flops] * hw[MACHINE.flash_attention_efficiency]) * occupancy
    t_memory = nbytes / (hw[MACHINE.hbm_Bps] * hw[MACHINE.hbm_efficiency])
    return max(t_compute, t_memory) + num_kernels * hw[MACHINE.kernel_overhead_s]


@jit
def flash_attention_forward_s(b, s, h, a, g, t, hw):
    """Seconds of the fused causal attention forward (FlashAttention-2) of one layer, one
    micro-batch, one TP rank.

    FLOPs: the two attention matmuls over the causal half of the ``s x s`` scores,
    ``4 * b * (a/t) * s^2 * (h/a) / 2`` (Dao 2023, "FlashAttention-2", arXiv:2307.08691, and its
    benchmark script's FLOP count), at ``peak_flops * flash_attention_efficiency``. Bytes: read
    Q, K, V (K and V with ``g`` query groups), write the output and the fp32 log-sum-exp per
    row; no ``s x s`` tensor reaches HBM. Roofline of the two, plus one kernel overhead. The
    published efficiency assumes every SM busy: with fewer thread blocks (one per 128 query
    rows of one head of one sequence, :func:`flash_attention_blocks`) than SMs, the FLOP rate is
    scaled by ``blocks / num_sms``, as for GEMMs.
    """
    q = BYTES_PER_ELEMENT * b * s * h / t
    kv = BYTES_PER_ELEMENT * b * s * h * g / a / t
    nbytes = q + 2.0 * kv + q + 4.0 * b * (a / t) * s
    return flash_attention_time_s(2.0 * b * s * s * h / t, nbytes, b, s, a, t, FLASH_FORWARD_KERNELS, hw)


@jit
def flash_attention_backward_s(b, s, h, a, g, t, hw):
    """Seconds of the fused causal attention backward (FlashAttention-2) of one layer, one
    micro-batch, one TP rank.

    FLOPs: 2.5 times the forward's (five matmuls, the scores recomputed from Q and K; Dao 2023).
    Bytes: read Q, K, V, the output, its gradient and the log-sum-exp, write dQ, dK, dV, and
    write and read the fp32 dQ accumulator. Roofline plus three kernel overheads
    (preprocessing, main kernel, dQ conversion); SM occupancy as in the forward (one block per
    128 key rows).
    """
    q = BYTES_PER_ELEMENT * b * s * h / t
    kv = BYTES_PER_ELEMENT * b * s * h * g / a / t
    nbytes = (3.0 * q + 2.0 * kv + 4.0 * b * (a / t) * s) + (q + 2.0 * kv) + 2.0 * 2.0 * q
    return flash_attention_time_s(2.5 * 2.0 * b * s * s * h / t, nbytes, b, s, a, t, FLASH_BACKWARD_KERNELS, hw)


@jit
def learned_positions(arch):
    """1.0 when the model has a learned position table (``arch.position_embedding_type``
    learned_absolute), else 0.0."""
    return 1.0 if arch.position_embedding_type == LEARNED_POSITIONS else 0.0


@jit
def embedding_forward_s(b, s, h, hw, arch=DEFAULT_ARCH):
    """Forward seconds of the word embedding lookup (read and write 2 bytes per element), the
    position lookup and add (2 + 2 more, with a learned position table: :func:`learned_positions`)
    and dropout (first stage)."""
    return memory_bound_time_s(b * s * h * (2.0 + 2.0 * learned_positions(arch) + 2.0 + 5.0) * activation_scale(hw),
                               3.0, hw)


@jit
def embedding_s(b, s, h, v, t, hw, arch=DEFAULT_ARCH):
    """Forward plus backward seconds of the embeddings (a host-bound floor applies)."""
    gpu = embedding_forward_s(b, s, h, hw, arch) + embedding_backward_s(b, s, h, v, t, hw, arch)
    return phase_s(gpu, EMBEDDING_KERNELS, hw)


@jit
def head_s(b, s, h, v, t, hw):
    """Forward plus backward seconds of the last stage's head (a host-bound floor applies)."""
    gpu = head_forward_s(b, s, h, v, t, hw) + head_backward_s(b, s, h, v, t, hw)
    return phase_s(gpu, HEAD_KERNELS, hw)


@jit
def embedding_backward_s(b, s, h, v, t, hw, arch=DEFAULT_ARCH):
    """Backward seconds of the embeddings: dropout backward and scatter-add of gradients into
    the (vocab-parallel) word embedding table and, when learned (:func:`learned_positions`), the
    position table, including zeroing the dense ``v/t x h`` gradient table."""
    return memory_bound_time_s((b * s * h * (5.0 + 6.0 + 6.0 * learned_positions(arch)) + 2.0 * v * h / t)
                               * activation_scale(hw), 4.0, hw)


@jit
def head_forward_s(b, s, h, v, t, hw):
    """Forward seconds on the last stage: final layer norm, LM-head GEMM onto ``v/t`` logits,
    and vocab-parallel cross-entropy (fp16 logits read, fp32 softmax written)."""
    tokens = b * s
    e = element_bytes(hw)               # the logits' bytes (the softmax is fp32 in any precision)
    time = memory_bound_time_s(2.0 * e * tokens * h, 1.0, hw)
    time += gemm_time_s(tokens, v / t, h, 1.0, hw)
    time += memory_bound_time_s(tokens * v / t * (e + 4.0 + 4.0), 4.0, hw)
    return time


@jit
def head_backward_s(b, s, h, v, t, hw):
    """Backward seconds on the last stage: cross-entropy gradient, LM-head data and weight
    gradients, final layer-norm backward."""
    tokens = b * s
    e = element_bytes(hw)
    time = memory_bound_time_s(tokens * v / t * (4.0 + e), 2.0, hw)
    time += gemm_time_s(tokens, h, v / t, 1.0, hw) + gemm_time_s(h, v / t, tokens, 1.0, hw)
    time += memory_bound_time_s(3.0 * e * tokens * h, 2.0, hw)
    return time


@jit
def state_dtype_bytes(code):
    """Bytes of one element of an optimizer-state dtype, by its code among the choices of
    ``exp_avg_dtype`` (:mod:`vtrain_fast.model.settings`): fp32 4, fp16 2, bf16 2, fp8 1 (uint8)."""
    if code == 0.0:
        return 4.0
    if code == 3.0:
        return 1.0
    return 2.0


@jit_inline
def adam_moment_bytes(hw):
    """Bytes per parameter of Adam's two moments: 8 (fp32), or under the precision-aware
    optimizer those of ``exp_avg_dtype`` and ``exp_avg_sq_dtype`` (:func:`state_dtype_bytes`)."""
    if hw[MACHINE.use_precision_aware_optimizer] == 0.0:
        return 8.0
    return state_dtype_bytes(hw[MACHINE.exp_avg_dtype]) + state_dtype_bytes(hw[MACHINE.exp_avg_sq_dtype])


@jit
def optimizer_s(params, hw):
    """Seconds of one Adam step over ``params`` parameters on one GPU.

    Bytes per parameter (Megatron-LM's mixed-precision optimizer, megatron/core/optimizer/
    optimizer.py): copy 16-bit grads to fp32 main grads (2 + 4), inf/nan check (4), gradient-norm
    for clipping (4), fused Adam (read param and grad, 8, read and write the two moments, 2 x
    :func:`adam_moment_bytes` = 16 in fp32, write param 4: 28 in fp32), copy fp32 params to 16-bit
    model params (4 + 2): 48 bytes with fp32 moments (the precision-aware optimizer's master weight
    as bf16 + 16-bit remainder moves the same 4 bytes each way). The inf/nan check is charged
    under bf16 too (Megatron-DeepSpeed's fp16 runs, on which the shipped calibration was fitted,
    do it; Megatron-LM's bf16 optimizer has no grad scaler and skips it). Under fp16 the dynamic
    loss scaler's unscale rewrites the main grads in place (``_amp_foreach_non_finite_check_and_
    unscale_``: 4 bytes more, :data:`FP16_UNSCALE_BYTES_PER_PARAM`). Under fp32 or tf32
    (Megatron-LM's FP32Optimizer: the parameters are the master weights) neither copy nor check:
    gradient norm 4 + Adam, 16 + 2 x the moments (32 with fp32 moments). Multi-tensor-apply
    launches are charged as 6 kernels.
    """
    if full_precision(hw):
        return memory_bound_time_s((FP32_ADAM_BYTES_PER_PARAM + 2.0 * adam_moment_bytes(hw)) * params, 6.0, hw)
    extra = FP16_UNSCALE_BYTES_PER_PARAM if hw[MACHINE.precision] == PRECISION_FP16 else 0.0
    return memory_bound_time_s((MIXED_ADAM_BYTES_PER_PARAM + extra + 2.0 * adam_moment_bytes(hw)) * params, 6.0, hw)


# Bytes per parameter of an Adam step beyond its moments' (optimizer_s): mixed precision's grad
# copy, inf/nan check, norm, Adam's param and grad reads and param write, and the cast back; fp32's
# norm and Adam's; what fp16's loss-scaler unscale adds (the in-place write of the main grads).
MIXED_ADAM_BYTES_PER_PARAM = 32.0
FP32_ADAM_BYTES_PER_PARAM = 16.0
FP16_UNSCALE_BYTES_PER_PARAM = 4.0


# The CPU optimizer of offloaded parameters (optimizer_cpu_offload; Megatron-core's
# HybridDeviceOptimizer with torch's CPU Adam): per parameter, its fp32 gradient to the host and its
# fp32 parameter back (4 bytes each way over the host link), and on the CPU an fp32 Adam step that
# streams the gradient (read 4), the master weight, momentum and variance (read and write, 24):
# 28 bytes of host memory traffic; the GPU then casts the fp32 parameter to bf16 (read 4, write 2).
OFFLOAD_COPY_BYTES_PER_PARAM = 4.0
CPU_ADAM_BYTES_PER_PARAM = 28.0
OFFLOAD_CAST_BYTES_PER_PARAM = 6.0


@jit_inline
def offloaded_fraction(hw):
    """The share of the parameters whose optimizer runs on the CPU: ``optimizer_offload_fraction``
    under ``optimizer_cpu_offload`` (with the precision-aware optimizer it needs), else 0."""
    on = hw[MACHINE.optimizer_cpu_offload] != 0.0 and hw[MACHINE.use_precision_aware_optimizer] != 0.0
    return hw[MACHINE.optimizer_offload_fraction] if on else 0.0


@jit_inline
def cpu_adam_s(params, hw):
    """Seconds of the CPU's fp32 Adam step over ``params`` offloaded parameters of one GPU: the
    slower of its host memory traffic (:data:`CPU_ADAM_BYTES_PER_PARAM` bytes per parameter at
    ``host_memory_Bps``) and its arithmetic on the GPU's share of the host's cores
    (``params / (cpu_adam_params_per_s_per_core x host_cores_per_gpu)``).

    The per-core rate is ZeRO-Offload's measured CPU-Adam (Ren et al., USENIX ATC 2021, Table 4:
    AVX512 + OpenMP, 1-10 billion parameters on a DGX-2's 2 x 24-core Xeon Platinum 8168) over
    that machine's cores (:data:`vtrain_fast.hardware.gpus.CPU_ADAM_PARAMS_PER_S_PER_CORE`).
    Megatron-core's HybridDeviceOptimizer steps the CPU share with ``torch.optim.AdamW(fused=True)``
    (megatron/core/optimizer/__init__.py), whose CPU kernel vectorises and threads the same loop
    (aten/src/ATen/native/cpu/FusedAdamKernel.cpp): the same rate is assumed for it.
    """
    memory = CPU_ADAM_BYTES_PER_PARAM * params / hw[MACHINE.host_memory_Bps]
    compute = params / (hw[MACHINE.cpu_adam_params_per_s_per_core] * hw[MACHINE.host_cores_per_gpu])
    return max(memory, compute)


# Parameter offloading (param_cpu_offload; PyTorch FSDP2 fully_shard with CPUOffloadPolicy): the
# sharded parameters live in host memory in their own dtype, fp32 under mixed precision
# (MixedPrecisionPolicy casts to param_dtype only after the copy: FSDPParam.all_gather_inputs copies
# the sharded fp32 data to the GPU, then casts it), and the sharded gradient goes back in fp32
# (torch/distributed/fsdp/_fully_shard/_fsdp_param.py, _fsdp_collectives.py foreach_reduce): 4 bytes
# per parameter of the shard each way. An fp32 shard whatever the training precision: not an
# element_bytes quantity.
PARAM_OFFLOAD_COPY_BYTES_PER_PARAM = 4.0


@jit_inline
def param_offload_on(hw, d):
    """Whether the parameters' shards live in host memory: ``param_cpu_offload`` with the ZeRO-3 it
    needs (FSDP2's CPUOffloadPolicy is an option of ``fully_shard``, DeepSpeed's ``offload_param``
    of stage 3) over ``d > 1`` shard ranks (at one data-parallel rank nothing is sharded: torchtitan
    applies FSDP only with dp_shard x cp > 1, and zero_stage has no effect there)."""
    return hw[MACHINE.param_cpu_offload] != 0.0 and hw[MACHINE.zero_stage] >= 3.0 and d > 1.0


@jit_inline
def param_offload_copy_s(params, d, hw):
    """Seconds of one copy of ``params`` parameters' fp32 shard over the GPU's host link, one
    direction (:data:`PARAM_OFFLOAD_COPY_BYTES_PER_PARAM` at ``host_link_Bps``); 0.0 without
    parameter offloading over ``d`` shard ranks (:func:`param_offload_on`)."""
    if not param_offload_on(hw, d):
        return 0.0
    return PARAM_OFFLOAD_COPY_BYTES_PER_PARAM * params / hw[MACHINE.host_link_Bps]


@jit_inline
def optimizer_step_s(params, hw, d=1.0):
    """Seconds of one optimizer step over ``params`` parameters on one GPU: :func:`optimizer_s`
    on the GPU's share, and for the offloaded share ``f`` (:func:`offloaded_fraction`;
    ZeRO-Offload, Ren et al. 2021, Sec. 4) the gradient copy to the host, the CPU Adam step
    (:func:`cpu_adam_s`: host memory or host cores, the slower) and the parameter copy back
    (:data:`OFFLOAD_COPY_BYTES_PER_PARAM`), their sum, or their slowest with
    ``overlap_cpu_optimizer_d2h_h2d`` (pipelined over parameter groups), then the GPU's cast.

    With parameter offloading (:func:`param_offload_on`, FSDP2's CPUOffloadPolicy: "the optimizer
    step runs on CPU with CPU optimizer states") every parameter of the shard steps on the CPU
    (:func:`cpu_adam_s`) with nothing to copy: the gradients reached the host during the backward
    (priced in :func:`vtrain_fast.model.pipeline.stage_costs`) and the updated fp32 shard stays there
    (``d``: the ranks the ZeRO-3 shard spans; 1, the default: not sharded, no parameter offloading)."""
    if param_offload_on(hw, d):
        return cpu_adam_s(params, hw)
    f = offloaded_fraction(hw)
    gpu = optimizer_s((1.0 - f) * params, hw)
    if f <= 0.0:
        return gpu
    n = f * params
    copy = OFFLOAD_COPY_BYTES_PER_PARAM * n / hw[MACHINE.host_link_Bps]
    cpu = cpu_adam_s(n, hw)
    host = max(copy, cpu) if hw[MACHINE.overlap_cpu_optimizer_d2h_h2d] != 0.0 else 2.0 * copy + cpu
    if full_precision(hw):          # fp32 weights: the parameter copied back is the weight, no cast
        return gpu + host
    return gpu + host + memory_bound_time_s(OFFLOAD_CAST_BYTES_PER_PARAM * n, 1.0, hw)


# Context parallelism (Megatron-LM --context-parallel-size, Transformer Engine's attention with
# context parallelism). Bytes per element of this rank's attention output that the ring's output
# correction moves per step (read the step's output, read and write the running output, bf16;
# TE flash_attn_fwd_out_correction), and that the backward's dQ and dK/dV accumulation moves per
# step after the first (read both, write the sum).
CP_OUT_CORRECTION_BYTES = 6.0
CP_GRAD_ACCUMULATE_BYTES = 6.0
# The all-gather variant runs its two query chunks as two flash kernels (on two CUDA streams).
CP_ALL_GATHER_KERNELS = 2.0


@jit
def cp_all_gather_on(hw):
    """Whether the machine vector asks for the all-gather variant of context parallelism
    (``cp_comm_type`` = all_gather) rather than ring attention (p2p)."""
    return hw[MACHINE.cp_comm_type] == CP_ALL_GATHER


@jit
def cp_kv_bytes(b, s, h, a, g, t):
    """Bytes of this rank's keys and values, one layer, one micro-batch, one TP rank: ``2 (K and
    V) x b x s x (h g / a) / t x 2`` bytes, ``s`` the rank's tokens (``seq_length / cp``): what one
    ring step passes on (Megatron-LM / TE ``AttnFuncWithCPAndKVP2P``)."""
    return 2.0 * BYTES_PER_ELEMENT * b * s * h * g / a / t


@jit
def cp_attention_forward_extra_s(b, s, h, a, g, t, cp, hw):
    """Seconds of the context-parallel attention forward of one layer, one micro-batch, one rank,
    beyond the one local FlashAttention call of :func:`layer_forward_s` (``s`` = seq_length / cp,
    the rank's tokens; 0.0 at ``cp = 1``).

    Causal load balance (TE): the sequence is cut into ``2 cp`` chunks and rank ``r`` holds chunks
    ``r`` and ``2 cp - 1 - r``, so every rank does ``1/cp`` of the causal attention FLOPs,
    ``cp`` times those of a causal block over its own ``s`` tokens.
    Ring (p2p): ``cp`` steps, each a FlashAttention kernel of those FLOPs (step 0 the local causal
    block, then half the queries against a whole received K/V block or all the queries against half
    of it; :func:`flash_attention_forward_s` of ``s`` rows, with its SM occupancy), and per step an
    output / log-sum-exp correction (:data:`CP_OUT_CORRECTION_BYTES` per output element, one kernel).
    All-gather: the two local query chunks against the gathered keys up to their end, two kernels
    doing ``cp`` times the local causal FLOPs together and reading the ``cp`` gathered K/V
    (:func:`flash_attention_time_s`), and the copy of the two outputs into one (4 bytes per element)."""
    if cp <= 1.0:
        return 0.0
    one = flash_attention_forward_s(b, s, h, a, g, t, hw)
    out_elems = b * s * h / t
    if cp_all_gather_on(hw):
        q = BYTES_PER_ELEMENT * out_elems
        nbytes = q + cp * cp_kv_bytes(b, s, h, a, g, t) + q + 4.0 * b * (a / t) * s
        gathered = flash_attention_time_s(cp * 2.0 * b * s * s * h / t, nbytes, b, s, a, t, CP_ALL_GATHER_KERNELS, hw)
        return gathered + memory_bound_time_s(4.0 * out_elems, 1.0, hw) - one
    return (cp - 1.0) * one + cp * memory_bound_time_s(CP_OUT_CORRECTION_BYTES * out_elems, 1.0, hw)


@jit
def cp_attention_backward_extra_s(b, s, h, a, g, t, cp, hw):
    """Seconds of the context-parallel attention backward of one layer, one micro-batch, one rank,
    beyond the one local FlashAttention backward of :func:`layer_backward_s` (``s`` the rank's
    tokens; 0.0 at ``cp = 1``): ring, ``cp`` FlashAttention backward steps (each
    :func:`flash_attention_backward_s` of ``s`` rows) and from the second on the accumulation of the
    step's dQ and dK/dV (:data:`CP_GRAD_ACCUMULATE_BYTES` per element, two kernels); all-gather,
    two backward kernels doing ``cp`` times the local FLOPs (2.5x the forward's), reading the
    gathered K/V and writing their full-length gradients."""
    if cp <= 1.0:
        return 0.0
    one = flash_attention_backward_s(b, s, h, a, g, t, hw)
    kv = cp_kv_bytes(b, s, h, a, g, t)
    if cp_all_gather_on(hw):
        q = BYTES_PER_ELEMENT * b * s * h / t
        nbytes = 3.0 * q + cp * kv + 4.0 * b * (a / t) * s + q + cp * kv + 2.0 * 2.0 * q
        return flash_attention_time_s(cp * 2.5 * 2.0 * b * s * s * h / t, nbytes, b, s, a, t,
                                      CP_ALL_GATHER_KERNELS * FLASH_BACKWARD_KERNELS, hw) - one
    accumulate = CP_GRAD_ACCUMULATE_BYTES / BYTES_PER_ELEMENT * (BYTES_PER_ELEMENT * b * s * h / t + kv)
    return (cp - 1.0) * (one + memory_bound_time_s(accumulate, 2.0, hw))
