"""Reference twin of the cost kernels, in plain Python (no Numba, no NumPy).

Every formula in ``vtrain_fast/model/*.py`` is re-stated here from
its docstring and the papers it cites, as readable Python, so that ``tests/test_kernels.py`` can
compare the compiled kernels with an independent statement on random points.

**This module must change whenever a kernel formula changes.** A kernel change that is not
mirrored here makes the twin tests fail; that is the point.

Conventions
-----------
* Machine vectors (``hw``) are any indexable sequence laid out as
  :data:`vtrain_fast.model.records.HW_FIELDS`; fields are read by *name* through :func:`hw_get`,
  never by a hard-coded position.
* Symbols are Megatron-LM's: ``b`` micro_batch_size, ``s`` seq_length, ``h`` hidden_size,
  ``a`` num_attention_heads, ``g`` num_query_groups, ``f`` ffn_hidden_size, ``v`` vocab_size,
  ``t``/``p``/``d`` tensor/pipeline/data-parallel size, ``L`` num_layers, ``B`` global_batch_size.
* Where the kernel's structure is a special case of a more general statement (e.g. the 1F1B
  schedule only needs the first and the last stage), the twin states the general form (every
  stage) so that a reviewer sees the model, not a copy of the code.
"""
from __future__ import annotations

import math
from collections import namedtuple

from vtrain_fast.model.records import HW_FIELDS
from vtrain_fast.model.settings import BY_NAME as SETTINGS_BY_NAME

_FIELD_INDEX = {name: k for k, name in enumerate(HW_FIELDS)}


def hw_get(hw, name: str) -> float:
    """Field ``name`` of machine vector ``hw`` (see ``model.records.HW_FIELDS``)."""
    return float(hw[_FIELD_INDEX[name]])


# Model flags (restated: codes of vtrain_fast.model.arch). A model's flags are either a float, its
# gated_mlp on Megatron-LM's GPT layer, or a record with these fields.
RMSNORM, LEARNED, ROPE = 1.0, 0.0, 1.0      # normalization 1: RMSNorm; position 0: learned, 1: rope, 2: none


# ... then the MoE columns (restated: vtrain_fast.model.moe.KERNEL_COLUMNS), a dense model's by default,
# kv_channels (the head width d; 0: h / a) and multi-head latent attention (a switch and its widths)
MOE_FIELDS = ("num_experts", "moe_router_topk", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size",
              "moe_layer_step", "moe_first_dense_layers", "kv_channels",
              "multi_latent_attention", "q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim",
              "v_head_dim")
DENSE = (0.0, 2.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
ModelFlags = namedtuple("ModelFlags", ("gated_mlp", "normalization", "position_embedding_type", "add_bias_linear",
                                       "untie_embeddings_and_output_weights") + MOE_FIELDS, defaults=DENSE)


def flags(arch) -> dict:
    """The architecture flags of ``arch`` by name (a float: ``gated_mlp`` with Megatron-LM's defaults)."""
    if isinstance(arch, (int, float)):
        return dict(gated_mlp=float(arch), normalization=0.0, position_embedding_type=LEARNED, add_bias_linear=1.0,
                    untie_embeddings_and_output_weights=0.0, **dict(zip(MOE_FIELDS, DENSE)))
    return {**dict(zip(MOE_FIELDS, DENSE)), **{k: float(v) for k, v in arch._asdict().items()}}


def _rope(arch) -> bool:
    return flags(arch)["position_embedding_type"] == ROPE


def _mla(arch) -> bool:
    return flags(arch)["multi_latent_attention"] != 0.0


def _qw(h, a, arch) -> float:
    """Megatron-core's query_projection_size: heads x kv_channels, or h when kv_channels is 0.
    With multi-head latent attention the core's one head width of the same FLOPs: queries and keys
    of qk_head_dim + qk_pos_emb_head_dim channels, values of v_head_dim, so a x their mean."""
    fl = flags(arch)
    if _mla(arch):
        return a * ((fl["qk_head_dim"] + fl["qk_pos_emb_head_dim"]) + fl["v_head_dim"]) / 2.0
    d = fl["kv_channels"]
    return a * d if d > 0 else h


def _cw(h, a, arch) -> float:
    """The context's width (the output projection's input): a x v_head_dim with MLA."""
    return a * flags(arch)["v_head_dim"] if _mla(arch) else _qw(h, a, arch)


def mla_linears(tokens, h, a, t, sp, arch):
    """Multi-head latent attention's linears before the output projection (DeepSeek-V2 Sec.
    2.1.2-2.1.3; Megatron-core MLASelfAttention), one TP rank: ``(rows, outputs, inputs, split)``
    each. The down projections are duplicated on every rank (the whole weight) and run on the
    rank's own tokens (tokens / t with sequence parallelism); the up projections are column
    parallel (1/t of the outputs) on all the tokens."""
    fl = flags(arch)
    dq = fl["qk_head_dim"] + fl["qk_pos_emb_head_dim"]
    own = tokens / sp
    out = []
    if fl["q_lora_rank"] > 0:
        out.append((own, fl["q_lora_rank"], h, False))                       # W^DQ
        out.append((tokens, a * dq / t, fl["q_lora_rank"], True))            # W^UQ with W^QR
    else:
        out.append((tokens, a * dq / t, h, True))                            # queries at full rank
    out.append((own, fl["kv_lora_rank"] + fl["qk_pos_emb_head_dim"], h, False))   # W^DKV with W^KR
    out.append((tokens, a * (fl["qk_head_dim"] + fl["v_head_dim"]) / t, fl["kv_lora_rank"], True))   # W^UK, W^UV
    return out


def mla_weights_on_rank(h, a, t, arch):
    """Weights of MLA's linears on one TP rank: the duplicated ones whole, the rest's 1/t, the
    output projection's 1/t; plus the q and kv norms (replicated)."""
    lin = mla_linears(1.0, h, a, t, 1.0, arch)
    fl = flags(arch)
    return (sum(n * k for _, n, k, _ in lin) + _cw(h, a, arch) * h / t
            + _norm(fl["q_lora_rank"] + fl["kv_lora_rank"], arch))


# ---------------------------------------------------------------------------------------------
# Status codes and output layout (restated; tests check them against model.records)
# ---------------------------------------------------------------------------------------------
OK, BAD_INPUT, BAD_NUM_GPUS, BAD_HEADS, BAD_LAYERS, BAD_BATCH, OUT_OF_MEMORY, REPEAT, REFUSED, BAD_SEQ_LENGTH = range(10)

OUTPUT_NAMES = (
    "iteration_time_s", "tokens_per_s", "model_tflops_per_gpu", "mfu", "hfu",
    "memory_per_gpu_GiB", "model_states_GiB", "activations_GiB",
    "compute_s", "tp_comm_s", "pp_comm_s", "dp_comm_s", "bubble_s", "optimizer_s", "overhead_s",
    "num_parameters", "num_micro_batches", "num_steps",
    "train_days", "gpu_hours", "cost_usd", "energy_kWh", "loss", "cp_comm_s", "ep_comm_s", "offload_s",
)
INPUT_NAMES = (
    "model_index", "gpu_index", "num_layers", "hidden_size", "num_attention_heads",
    "num_query_groups", "ffn_hidden_size", "vocab_size", "seq_length", "gated_mlp", "normalization",
    "position_embedding_type", "add_bias_linear", "untie_embeddings_and_output_weights", *MOE_FIELDS,
    "num_gpus", "num_nodes",
    "tp", "cp", "pp", "dp", "micro_batch_size", "global_batch_size", "recompute",
)
AXES = ("model", "num_tokens", "gpu", "cluster_size", "tp", "cp", "pp", "micro_batch_size",
        "global_batch_size", "recompute")

GiB = 2.0 ** 30
SECONDS_PER_DAY = 24.0 * 3600.0
BYTES_FP16 = 2.0                      # activations and weights are fp16/bf16
ADAM_STATE_BYTES_PER_PARAM = 16.0     # ZeRO paper Sec. 3.1: 2 + 2 + 4 + 4 + 4


# ---------------------------------------------------------------------------------------------
# ops.py: roofline time of one GPU's kernels
# ---------------------------------------------------------------------------------------------
GEMM_TILE = 128.0   # output tile edge (128 x 128 tensor-core tiles)


def _precision(hw) -> str:
    """``precision`` by name (its registry choices, in order: bf16, fp8, fp16, fp32, tf32)."""
    return ("bf16", "fp8", "fp16", "fp32", "tf32")[int(hw_get(hw, "precision"))]


def _fp32(hw) -> bool:
    """No mixed precision: fp32 or tf32 (4-byte weights, activations, gradients)."""
    return _precision(hw) in ("fp32", "tf32")


def elem_bytes(hw) -> float:
    """Bytes of a weight / activation / gradient element: 4 under fp32 / tf32, else 2."""
    return 4.0 if _fp32(hw) else BYTES_FP16


def grad_elem_bytes(hw) -> float:
    """Bytes of a gradient element as kept and reduced: 4 under fp32 / tf32 and, Megatron-LM's
    default under --bf16 (accumulate_allreduce_grads_in_fp32), under bf16 and fp8 unless
    grad_reduce_in_bf16; 2 under fp16 and with grad_reduce_in_bf16."""
    if _fp32(hw):
        return 4.0
    if _precision(hw) == "fp16" or hw_get(hw, "grad_reduce_in_bf16"):
        return BYTES_FP16
    return 4.0


def act_scale(hw) -> float:
    """What the 2-byte memory-bound traffic is multiplied by: 2 under fp32 / tf32."""
    return elem_bytes(hw) / BYTES_FP16


def gemm_peak(hw) -> float:
    """The GEMM peak of the precision: FP32 (no TF32), TF32, else the fp16/bf16 one."""
    return {"fp32": hw_get(hw, "peak_fp32_flops"), "tf32": hw_get(hw, "peak_tf32_flops")}.get(
        _precision(hw), hw_get(hw, "peak_flops"))


def gemm_time_s(m, n, k, batch, hw):
    """``batch`` GEMMs (m x k) @ (k x n): max(compute, HBM traffic) + one launch.

    SM occupancy: with fewer ``ceil(m/128) * ceil(n/128) * batch`` output tiles than SMs, only
    ``tiles`` SMs work, so the achievable FLOP rate is scaled by ``tiles / num_sms``; from one full
    wave up the rate is the full one."""
    flops = 2.0 * m * n * k * batch
    nbytes = elem_bytes(hw) * (m * k + k * n + m * n) * batch        # read A, read B, write C
    sms = hw_get(hw, "num_sms")
    tiles = math.ceil(m / GEMM_TILE) * math.ceil(n / GEMM_TILE) * batch
    busy_fraction = min(1.0, tiles / sms)
    compute_s = flops / (gemm_peak(hw) * hw_get(hw, "gemm_efficiency") * busy_fraction)
    memory_s = nbytes / (hw_get(hw, "hbm_Bps") * hw_get(hw, "hbm_efficiency"))
    return max(compute_s, memory_s) + hw_get(hw, "kernel_overhead_s")


def _fp8(hw):
    """``precision`` = fp8."""
    return _precision(hw) == "fp8"


def _recipe(hw):
    """``fp8_recipe`` by name (its registry choices, in order: delayed, tensorwise, mxfp8)."""
    return ("delayed", "tensorwise", "mxfp8")[int(hw_get(hw, "fp8_recipe"))]


def _mxfp8(hw):
    """FP8 with MXFP8 block scaling (E8M0 scales, one byte per 32 elements)."""
    return _fp8(hw) and _recipe(hw) == "mxfp8"


def quantize_bytes_and_kernels(hw):
    """TE quantizing one bf16 tensor both ways (FP8 copy and transpose / columnwise copy): bytes
    per element and kernels per tensor. Delayed: read 2, write 1 + 1, one kernel. Tensorwise
    (current scaling): a separate amax read (2) plus the amax and scale kernels. MXFP8: a 1-byte
    scale per 32 elements in each of the two directions, one kernel."""
    recipe = _recipe(hw)
    if recipe == "tensorwise":
        return 2.0 + 1.0 + 1.0 + 2.0, 3.0
    if recipe == "mxfp8":
        return 2.0 + (1.0 + 1.0 / 32.0) * 2.0, 1.0
    return 2.0 + 1.0 + 1.0, 1.0


def fp8_gemm_time_s(m, n, k, hw, groups=1.0):
    """One FP8 GEMM (Transformer Engine linear), or ``groups`` equal ones run together: FLOPs at
    the FP8 peak times the FP8 GEMM efficiency (same SM-occupancy rule over all groups' tiles), FP8
    (1-byte) A and B, a bf16 C; MXFP8 A and B also bring one 1-byte scale per 32 elements (same
    peak on Blackwell)."""
    flops = 2.0 * m * n * k * groups
    per_operand_element = 1.0 + (1.0 / 32.0 if _recipe(hw) == "mxfp8" else 0.0)
    nbytes = (per_operand_element * (m * k + k * n) + BYTES_FP16 * m * n) * groups
    tiles = math.ceil(m / GEMM_TILE) * math.ceil(n / GEMM_TILE) * groups
    busy_fraction = min(1.0, tiles / hw_get(hw, "num_sms"))
    compute_s = flops / (hw_get(hw, "peak_fp8_flops") * hw_get(hw, "fp8_gemm_efficiency") * busy_fraction)
    memory_s = nbytes / (hw_get(hw, "hbm_Bps") * hw_get(hw, "hbm_efficiency"))
    return max(compute_s, memory_s) + hw_get(hw, "kernel_overhead_s")


def linear_gemm_s(m, n, k, hw):
    """A linear layer's GEMM: FP8 under precision = fp8, else bf16."""
    return fp8_gemm_time_s(m, n, k, hw) if _fp8(hw) else gemm_time_s(m, n, k, 1.0, hw)


def memory_bound_time_s(nbytes, num_kernels, hw):
    """Streaming kernels: bytes at achievable HBM bandwidth plus one overhead per launch."""
    return (nbytes / (hw_get(hw, "hbm_Bps") * hw_get(hw, "hbm_efficiency"))
            + num_kernels * hw_get(hw, "kernel_overhead_s"))


def phase_s(gpu_s, num_kernels, hw):
    """A phase of ``num_kernels`` launches: eager PyTorch issues kernels asynchronously, so it
    lasts the longer of the GPU time and the host's launch time."""
    return max(gpu_s, num_kernels * hw_get(hw, "host_launch_s"))


def _layer_dims(b, s, h, a, g, t):
    """(tokens, head_dim, heads on this rank, QKV output columns on this rank, score elements)."""
    tokens = b * s
    heads_per_rank = a / t
    head_dim = h / a
    qkv_cols_per_rank = (h + 2.0 * h * g / a) / t      # Q (h) plus K and V (g groups of h/a)
    score_elems = b * heads_per_rank * s * s
    return tokens, head_dim, heads_per_rank, qkv_cols_per_rank, score_elems


# Kernel launches of the memory-bound operators of one layer: forward LN1, softmax, dropout,
# permute, BDA, LN2, bias-GeLU, BDA = 8; backward 2 LN, softmax, dropout, permute, 2 BDA,
# 2 residual adds, bias-GeLU, 2 bias-gradient reductions = 12.
LAYER_FWD_MEMORY_BOUND_LAUNCHES = 8.0
LAYER_BWD_MEMORY_BOUND_LAUNCHES = 12.0


# FlashAttention replaces scores GEMM, softmax, dropout and context GEMM by fused kernels:
# 1 forward launch, 3 backward launches (dO.O preprocessing, main kernel, dQ conversion).
FLASH_FWD_LAUNCHES = 1.0
FLASH_BWD_LAUNCHES = 3.0


def softmax_fused(b, s, a, t):
    """Megatron-LM FusedScaleMaskSoftmax.is_kernel_available for the causal mask: fp16 input,
    16 < sk <= 4096, sq and sk multiples of 4, attention batches (b x heads per rank) a multiple
    of 4 and of the kernel's batches per block (scaled_upper_triang_masked_softmax.h: 128
    threads, warp = min(32, next power of two of sk), 2 rows per warp when that is <= 128)."""
    attn_batches = b * a / t
    if not (16 < s <= 4096 and s % 4 == 0 and attn_batches % 4 == 0):
        return False
    next_pow2 = 2 ** math.ceil(math.log2(s))
    warp = min(next_pow2, 32)
    rows_per_warp = 2 if next_pow2 <= 128 else 1
    batches_per_block = (128 // warp) * rows_per_warp
    return attn_batches % batches_per_block == 0


def _softmax_kernels(b, s, a, t):
    """(forward, backward) lists of (bytes read, bytes written) per score element of the
    scale-mask-softmax kernels: the fused fp16 kernel, or PyTorch's fp32 path (cast, scale,
    in-place masked fill, softmax, cast back; one read and one write of each row)."""
    if softmax_fused(b, s, a, t):
        return [(2.0, 2.0)], [(4.0, 2.0)]
    fwd = [(2.0, 4.0), (4.0, 4.0), (4.0, 4.0), (4.0, 4.0), (4.0, 2.0)]
    bwd = [(2.0, 4.0), (8.0, 4.0), (4.0, 4.0), (4.0, 4.0), (4.0, 2.0)]
    return fwd, bwd


def _flash_on(hw):
    return hw_get(hw, "use_flash_attn") != 0.0 and not _fp32(hw)     # FlashAttention: 16-bit only


def _seq_split(t, hw):
    """Sequence parallelism splits the token-wise work and tensors outside the TP regions
    (layer norms, dropouts, residuals) over the t ranks; without it every rank repeats it."""
    return t if hw_get(hw, "sequence_parallel") != 0.0 else 1.0


def _flash_kernels_s(flops, nbytes, b, heads, s, launches, hw):
    """Roofline of FlashAttention kernels: FLOPs at the fused kernels' efficiency, only
    ``blocks / num_sms`` of it when a launch has fewer thread blocks (one per 128 rows per head)
    than SMs; bytes at the HBM rate; ``launches`` kernel overheads."""
    blocks = b * heads * math.ceil(s / 128.0)
    busy = min(1.0, blocks / hw_get(hw, "num_sms"))
    compute_s = flops / (hw_get(hw, "peak_flops") * hw_get(hw, "flash_attention_efficiency") * busy)
    memory_s = nbytes / (hw_get(hw, "hbm_Bps") * hw_get(hw, "hbm_efficiency"))
    return max(compute_s, memory_s) + launches * hw_get(hw, "kernel_overhead_s")


def _flash_sizes(b, s, h, a, g, t):
    """(causal forward FLOPs 4 b heads s^2 d / 2, Q bytes, K+V bytes, LSE bytes, heads)."""
    tokens, head_dim, heads, qkv_cols, _ = _layer_dims(b, s, h, a, g, t)
    flops = 4.0 * b * heads * s * s * head_dim / 2.0
    q_bytes = BYTES_FP16 * tokens * heads * head_dim
    kv_bytes = BYTES_FP16 * tokens * (qkv_cols - heads * head_dim)      # K and V together
    return flops, q_bytes, kv_bytes, 4.0 * b * heads * s, heads


def flash_attention_forward_s(b, s, h, a, g, t, hw):
    """Causal FlashAttention-2 forward: 4 b heads s^2 d FLOPs halved by the causal mask, at the
    fused kernels' efficiency; bytes = Q, K, V in, O out, fp32 log-sum-exp per row; 1 launch."""
    flops, q_bytes, kv_bytes, lse_bytes, heads = _flash_sizes(b, s, h, a, g, t)
    nbytes = q_bytes + kv_bytes + q_bytes + lse_bytes
    return _flash_kernels_s(flops, nbytes, b, heads, s, FLASH_FWD_LAUNCHES, hw)


def flash_attention_backward_s(b, s, h, a, g, t, hw):
    """Backward: 2.5x the forward FLOPs; reads Q, K, V, O, dO, LSE, writes dQ, dK, dV, and an
    fp32 dQ accumulator is written and read back; 3 launches."""
    flops, q_bytes, kv_bytes, lse_bytes, heads = _flash_sizes(b, s, h, a, g, t)
    reads = q_bytes + kv_bytes + q_bytes + q_bytes + lse_bytes
    writes = q_bytes + kv_bytes
    accumulator = 2.0 * (4.0 / BYTES_FP16) * q_bytes
    return _flash_kernels_s(2.5 * flops, reads + writes + accumulator, b, heads, s, FLASH_BWD_LAUNCHES, hw)


def _layer_phase_s(gemms, streaming_bytes, memory_launches, flash_s, flash_launches, hw):
    """A layer phase: its GEMMs, the fused attention kernels (``flash_s``, 0 when unfused) and
    its memory-bound kernels, with the host-launch floor over all of their launches. The first
    GEMMs of the list with ``batch`` None are the linears' (FP8 under precision = fp8)."""
    time_s = sum(linear_gemm_s(m, n, k, hw) if batch is None else gemm_time_s(m, n, k, batch, hw)
                 for m, n, k, batch in gemms) + flash_s
    gpu_s = time_s + memory_bound_time_s(sum(streaming_bytes) * act_scale(hw), memory_launches, hw)   # 4-byte under fp32
    return phase_s(gpu_s, len(gemms) + memory_launches + flash_launches, hw)


def layer_forward_s(b, s, h, a, g, f, t, hw, arch=0.0):
    """Forward of one transformer layer, one micro-batch, one TP rank (no TP communication)."""
    gated = flags(arch)["gated_mlp"]
    qw = _qw(h, a, arch)                        # attention width: a heads x kv_channels
    tokens, head_dim, heads, qkv_cols, score_elems = _layer_dims(b, s, qw, a, g, t)
    attn_batch = b * heads
    flash = _flash_on(hw)
    gemms = [                                   # (m, n, k, batch); None: a linear (FP8 or bf16)
        (tokens, qkv_cols, h, None),            # QKV projection (column parallel)
        (tokens, h, qw / t, None),              # output projection (row parallel)
        (tokens, (1.0 + gated) * f / t, h, None),  # FC1 (column parallel; gate and up when gated)
        (tokens, h, f / t, None),               # FC2 (row parallel)
    ]
    sp = _seq_split(t, hw)
    streaming_bytes = [
        2.0 * (2.0 + 2.0) * tokens * h / sp,    # LN1, LN2: read x, write y
        (2.0 + 2.0) * tokens * qw / t,          # context permute copy
        2.0 * (2.0 + 2.0 + 2.0 + 1.0) * tokens * h / sp,  # 2 bias-dropout-adds: x, residual, out, mask
        (2.0 * (1.0 + gated) + 2.0) * tokens * f / t,   # bias-GeLU (SwiGLU: read gate and up, write f)
    ]
    launches = LAYER_FWD_MEMORY_BOUND_LAUNCHES
    linear_inputs = [tokens * h, tokens * qw / t, tokens * h, tokens * f / t]   # QKV, proj, FC1, FC2
    if _mla(arch):
        # MLA's linears replace QKV; the context is a x v_head_dim
        fl = flags(arch)
        cw = _cw(h, a, arch)
        mla = mla_linears(tokens, h, a, t, sp, arch)
        gemms = [(m, n, k, None) for m, n, k, _ in mla] + [(tokens, h, cw / t, None)] + gemms[2:]
        streaming_bytes[1] = (2.0 + 2.0) * tokens * cw / t            # context permute copy
        linear_inputs = [m * k for m, _, k, _ in mla] + [tokens * cw / t, tokens * h, tokens * f / t]
        latent = fl["q_lora_rank"] + fl["kv_lora_rank"]
        dq = fl["qk_head_dim"] + fl["qk_pos_emb_head_dim"]
        streaming_bytes += [(2.0 + 2.0) * tokens * latent / sp,       # q and kv norms: read, write
                            (2.0 + 2.0) * tokens * a / t * (dq + dq + fl["v_head_dim"])]   # q, k, v assembly
        launches += (2.0 if fl["q_lora_rank"] > 0 else 1.0) + 3.0
    if _fp8(hw):
        # TE cast-transpose of each linear's input (read 2, write FP8 1 + FP8 transpose 1; per recipe)
        per_element, kernels = quantize_bytes_and_kernels(hw)
        streaming_bytes += [per_element * x for x in linear_inputs]
        launches += kernels * len(linear_inputs)
    if _mla(arch):
        # decoupled RoPE: the queries' rotary channels of this rank's heads, the one shared rotary key
        r = flags(arch)["qk_pos_emb_head_dim"]
        streaming_bytes += [(2.0 + 2.0) * tokens * a / t * r, (2.0 + 2.0) * tokens * r]
        launches += 2.0
    elif _rope(arch):
        # fused rotary embedding on q and on k (the k columns of qkv_cols include v's half): read, write
        streaming_bytes += [(2.0 + 2.0) * tokens * heads * head_dim, (2.0 + 2.0) * tokens * (qkv_cols - heads * head_dim) / 2.0]
        launches += 2.0
    if not flash:
        gemms += [(s, s, head_dim, attn_batch),         # scores Q K^T
                  (s, head_dim, s, attn_batch)]         # context softmax(QK^T) V
        softmax_fwd, _ = _softmax_kernels(b, s, a, t)
        streaming_bytes += [(r + w) * score_elems for r, w in softmax_fwd]   # scale-mask-softmax
        streaming_bytes += [(2.0 + 2.0 + 1.0) * score_elems]  # attention dropout + 1-byte mask
        launches += len(softmax_fwd) - 1
    else:
        launches -= 2.0                         # no softmax, no dropout kernel
    if flash:
        return _layer_phase_s(gemms, streaming_bytes, launches, flash_attention_forward_s(b, s, qw, a, g, t, hw),
                              FLASH_FWD_LAUNCHES, hw)
    return _layer_phase_s(gemms, streaming_bytes, launches, 0.0, 0.0, hw)


def layer_backward_s(b, s, h, a, g, f, t, hw, arch=0.0):
    """Backward of one layer: every forward GEMM becomes a data- and a weight-gradient GEMM."""
    gated = flags(arch)["gated_mlp"]
    qw = _qw(h, a, arch)                        # attention width: a heads x kv_channels
    tokens, head_dim, heads, qkv_cols, score_elems = _layer_dims(b, s, qw, a, g, t)
    attn_batch = b * heads
    flash = _flash_on(hw)
    gemms = [                                                         # None: a linear's GEMM
        (tokens, h, qkv_cols, None), (h, qkv_cols, tokens, None),    # QKV: dX, dW
        (tokens, qw / t, h, None), (qw / t, h, tokens, None),        # output projection
        (tokens, h, (1.0 + gated) * f / t, None), (h, (1.0 + gated) * f / t, tokens, None),   # FC1
        (tokens, f / t, h, None), (f / t, h, tokens, None),          # FC2
    ]
    sp = _seq_split(t, hw)
    streaming_bytes = [
        2.0 * (2.0 + 2.0 + 2.0) * tokens * h / sp,   # 2 LN backwards: x, dy -> dx
        (2.0 + 2.0) * tokens * qw / t,          # context permute copy
        2.0 * (2.0 + 1.0 + 2.0) * tokens * h / sp,   # 2 bias-dropout-add backwards: dy, mask -> dx
        2.0 * (2.0 + 2.0 + 2.0) * tokens * h / sp,   # 2 residual-gradient accumulations
        (2.0 * (1.0 + gated) + 2.0 + 2.0 * (1.0 + gated)) * tokens * f / t,   # act backward: x, dy -> dx
    ]
    launches = LAYER_BWD_MEMORY_BOUND_LAUNCHES
    output_grads = [tokens * qkv_cols, tokens * h, tokens * (1.0 + gated) * f / t, tokens * h]
    if _mla(arch):
        fl = flags(arch)
        cw = _cw(h, a, arch)
        mla = mla_linears(tokens, h, a, t, sp, arch)
        grads = []
        for m, n, k, _ in mla:
            grads += [(m, k, n, None), (k, n, m, None)]                     # dX, dW
        gemms = grads + [(tokens, cw / t, h, None), (cw / t, h, tokens, None)] + gemms[4:]
        streaming_bytes[1] = (2.0 + 2.0) * tokens * cw / t            # context permute copy
        output_grads = [m * n for m, n, _, _ in mla] + output_grads[1:]
        latent = fl["q_lora_rank"] + fl["kv_lora_rank"]
        dq = fl["qk_head_dim"] + fl["qk_pos_emb_head_dim"]
        streaming_bytes += [(2.0 + 2.0 + 2.0) * tokens * latent / sp,   # norm backwards: x, dy -> dx
                            (2.0 + 2.0) * tokens * a / t * (dq + dq + fl["v_head_dim"])]   # q, k, v gradients' copies
        launches += (2.0 if fl["q_lora_rank"] > 0 else 1.0) + 3.0
    if _fp8(hw):
        # TE cast-transpose (+ bias gradient) of each linear's output gradient
        per_element, kernels = quantize_bytes_and_kernels(hw)
        streaming_bytes += [per_element * x for x in output_grads]
        launches += kernels * len(output_grads)
    if _mla(arch):
        r = flags(arch)["qk_pos_emb_head_dim"]
        streaming_bytes += [(2.0 + 2.0) * tokens * a / t * r, (2.0 + 2.0) * tokens * r]
        launches += 2.0
    elif _rope(arch):                           # the rotary embedding's backward on dq and dk
        streaming_bytes += [(2.0 + 2.0) * tokens * heads * head_dim, (2.0 + 2.0) * tokens * (qkv_cols - heads * head_dim) / 2.0]
        launches += 2.0
    if not flash:
        gemms += [(s, head_dim, s, attn_batch), (head_dim, s, s, attn_batch),  # scores: dQ, dK
                  (s, s, head_dim, attn_batch), (s, head_dim, s, attn_batch)]  # context: dP, dV
        _, softmax_bwd = _softmax_kernels(b, s, a, t)
        streaming_bytes += [(r + w) * score_elems for r, w in softmax_bwd]   # softmax backward
        streaming_bytes += [(2.0 + 1.0 + 2.0) * score_elems]   # dropout backward: dy, mask -> dx
        launches += len(softmax_bwd) - 1
    else:
        launches -= 2.0
    if flash:
        return _layer_phase_s(gemms, streaming_bytes, launches, flash_attention_backward_s(b, s, qw, a, g, t, hw),
                              FLASH_BWD_LAUNCHES, hw)
    return _layer_phase_s(gemms, streaming_bytes, launches, 0.0, 0.0, hw)


def attention_core_forward_s(b, s, h, a, g, t, hw):
    """The attention core forward alone (what selective recomputation reruns): scores and
    context batched GEMMs, the softmax kernels, attention dropout, the context permute copy;
    or the FlashAttention forward. Its own host-launch floor."""
    if _flash_on(hw):
        return phase_s(flash_attention_forward_s(b, s, h, a, g, t, hw), FLASH_FWD_LAUNCHES, hw)
    tokens, head_dim, heads, _, score_elems = _layer_dims(b, s, h, a, g, t)
    gemms = [(s, s, head_dim, b * heads), (s, head_dim, s, b * heads)]
    softmax_fwd, _ = _softmax_kernels(b, s, a, t)
    streaming = [(r + w) * score_elems for r, w in softmax_fwd]
    streaming += [(2.0 + 2.0 + 1.0) * score_elems,            # dropout
                  (2.0 + 2.0) * tokens * h / t]               # context permute copy
    return _layer_phase_s(gemms, streaming, len(softmax_fwd) + 2.0, 0.0, 0.0, hw)


def embedding_forward_s(b, s, h, hw, arch=0.0):
    """Word lookup (2 bytes read), a learned position lookup (2 more), sum written (2), dropout
    (5); 3 launches."""
    learned = flags(arch)["position_embedding_type"] == LEARNED
    return memory_bound_time_s(b * s * h * (2.0 + (2.0 if learned else 0.0) + 2.0 + 5.0) * act_scale(hw), 3.0, hw)


def embedding_backward_s(b, s, h, v, t, hw, arch=0.0):
    """Dropout backward (5), the scatter-adds into the word and a learned position table (6 + 6)
    per token element, and zeroing the ``v/t x h`` fp16 word-embedding gradient; 4 launches."""
    learned = flags(arch)["position_embedding_type"] == LEARNED
    return memory_bound_time_s((b * s * h * (5.0 + 6.0 + (6.0 if learned else 0.0)) + BYTES_FP16 * v * h / t)
                               * act_scale(hw), 4.0, hw)


def head_forward_s(b, s, h, v, t, hw):
    """Final LN (1 launch), LM head GEMM onto v/t logits, vocab-parallel cross-entropy
    (2 + 4 + 4 bytes per logit, 4 launches)."""
    tokens = b * s
    e = elem_bytes(hw)
    return (memory_bound_time_s((e + e) * tokens * h, 1.0, hw)
            + gemm_time_s(tokens, v / t, h, 1.0, hw)
            + memory_bound_time_s(tokens * v / t * (e + 4.0 + 4.0), 4.0, hw))


def head_backward_s(b, s, h, v, t, hw):
    """Cross-entropy gradient (4 + 2 bytes per logit, 2 launches), LM head dX and dW GEMMs,
    final LN backward (6 bytes per element, 2 launches)."""
    tokens = b * s
    e = elem_bytes(hw)
    return (memory_bound_time_s(tokens * v / t * (4.0 + e), 2.0, hw)
            + gemm_time_s(tokens, h, v / t, 1.0, hw) + gemm_time_s(h, v / t, tokens, 1.0, hw)
            + memory_bound_time_s((e + e + e) * tokens * h, 2.0, hw))


EMBEDDING_LAUNCHES = 3.0 + 4.0          # forward + backward memory-bound kernels
# Launches of the head: forward LN 1 + GEMM 1 + cross-entropy 4, backward
# cross-entropy 2 + GEMMs 2 + LN 2 = 12.
HEAD_LAUNCHES = (1.0 + 1.0 + 4.0) + (2.0 + 2.0 + 2.0)


def embedding_s(b, s, h, v, t, hw, arch=0.0):
    """Embedding forward + backward, with the host-launch floor."""
    gpu_s = embedding_forward_s(b, s, h, hw, arch) + embedding_backward_s(b, s, h, v, t, hw, arch)
    return phase_s(gpu_s, EMBEDDING_LAUNCHES, hw)


def head_s(b, s, h, v, t, hw):
    """Head forward + backward, with the host-launch floor."""
    gpu_s = head_forward_s(b, s, h, v, t, hw) + head_backward_s(b, s, h, v, t, hw)
    return phase_s(gpu_s, HEAD_LAUNCHES, hw)


# Bytes per element of the optimizer-state dtypes, by their order among exp_avg_dtype's choices
# (restated: fp32, fp16, bf16, fp8 as uint8).
STATE_DTYPE_BYTES = (4.0, 2.0, 2.0, 1.0)


def moment_bytes(hw):
    """Adam's m and v, bytes per parameter: fp32 unless the precision-aware optimizer says."""
    if not hw_get(hw, "use_precision_aware_optimizer"):
        return 8.0
    return STATE_DTYPE_BYTES[int(hw_get(hw, "exp_avg_dtype"))] + STATE_DTYPE_BYTES[int(hw_get(hw, "exp_avg_sq_dtype"))]


def offload_share(hw):
    """Parameters whose optimizer is on the CPU: the fraction, with offload and the precision-aware
    optimizer it needs both on."""
    on = hw_get(hw, "optimizer_cpu_offload") and hw_get(hw, "use_precision_aware_optimizer")
    return hw_get(hw, "optimizer_offload_fraction") if on else 0.0


def param_offload(hw, shard):
    """FSDP2's CPUOffloadPolicy: param_cpu_offload, acting only with zero_stage 3 over more than one
    shard rank."""
    return hw_get(hw, "param_cpu_offload") != 0.0 and hw_get(hw, "zero_stage") >= 3 and shard > 1


def offload_stall_forward(k, n, copy_s, compute_s):
    """Event simulation of Transformer Engine's activation offload in forward (cpu_offload.py,
    OffloadSynchronizer): layer i < k's copy to the host is queued on one copy stream after its
    forward and must end before the forward of layer n - k + i starts; returns the compute
    stream's total wait."""
    t, free, done = 0.0, 0.0, {}
    for j in range(int(n)):
        for i in range(int(k)):
            if int(n) - int(k) + i == j:
                t = max(t, done[i])
        t += compute_s
        if j < k:
            done[j] = max(t, free) + copy_s
            free = done[j]
    return t - n * compute_s


def offload_stall_backward(k, n, copy_s, compute_s):
    """The backward's twin: layers n - 1 .. 0; at the start of layer j's backward the copy back of
    layer i = j - (n - 1 - k) (if i < k) is queued, and layer j < k's backward waits for its own."""
    t, free, done = 0.0, 0.0, {}
    for j in reversed(range(int(n))):
        i = j - (int(n) - 1 - int(k))
        if 0 <= i < k:
            done[i] = max(t, free) + copy_s
            free = done[i]
        if j < k:
            t = max(t, done[j])
        t += compute_s
    return t - n * compute_s


def adam_state_bytes(hw):
    """Master weight + m + v per parameter on the GPU: 4 + 8, or the 2-byte remainder + the
    moments, of the parameters not offloaded; fp32 / tf32 keep no master copy (m + v only)."""
    if _fp32(hw):
        return moment_bytes(hw) * (1.0 - offload_share(hw))
    if not hw_get(hw, "use_precision_aware_optimizer"):
        return 12.0
    return (2.0 + moment_bytes(hw)) * (1.0 - offload_share(hw))


def optimizer_s(params, hw):
    """Megatron fp16 optimizer + fused Adam: 48 bytes per parameter with fp32 moments (read and
    write of m and v: 16 of them), 6 launches; fp16 also rewrites the unscaled main grads (4);
    fp32 / tf32 (FP32Optimizer): grad norm (4) + Adam only."""
    if _fp32(hw):
        bytes_per_param = 4.0 + (12.0 + 2.0 * moment_bytes(hw))
    else:
        unscale = 4.0 if _precision(hw) == "fp16" else 0.0
        bytes_per_param = (2.0 + 4.0) + 4.0 + unscale + 4.0 + (12.0 + 2.0 * moment_bytes(hw)) + (4.0 + 2.0)
    return memory_bound_time_s(bytes_per_param * params, 6.0, hw)


def optimizer_step_s(params, hw, shard=1.0):
    """The GPU's share through optimizer_s; the offloaded share: fp32 gradient down and fp32
    parameter up (4 bytes each over the host link), CPU Adam streaming 28 bytes of host memory or
    stepping at the per-core rate on the GPU's host cores (the slower), summed or (overlapped) the
    slowest, then the GPU's cast to bf16 (6 bytes, one launch). With the parameters offloaded
    (param_cpu_offload at ZeRO-3, FSDP2's CPUOffloadPolicy) every parameter steps on the CPU, nothing
    copied."""
    if param_offload(hw, shard):
        return max(28.0 * params / hw_get(hw, "host_memory_Bps"),
                   params / (hw_get(hw, "cpu_adam_params_per_s_per_core") * hw_get(hw, "host_cores_per_gpu")))
    f = offload_share(hw)
    t = optimizer_s((1.0 - f) * params, hw)
    if f > 0.0:
        down = up = 4.0 * f * params / hw_get(hw, "host_link_Bps")
        cpu = max(28.0 * f * params / hw_get(hw, "host_memory_Bps"),      # host memory traffic, or
                  f * params / (hw_get(hw, "cpu_adam_params_per_s_per_core")  # the host's cores
                                * hw_get(hw, "host_cores_per_gpu")))
        t += max(down, cpu, up) if hw_get(hw, "overlap_cpu_optimizer_d2h_h2d") else down + cpu + up
        if not _fp32(hw):       # the cast of the fp32 parameter to the 16-bit weight
            t += memory_bound_time_s(6.0 * f * params, 1.0, hw)
    return t


# ---------------------------------------------------------------------------------------------
# comm.py: alpha-beta ring collectives (nccl-tests semantics)
# ---------------------------------------------------------------------------------------------
def ring_allreduce_s(nbytes, n, link_Bps, efficiency, latency_s, step_latency_s):
    """One fixed latency, 2(n-1) ring steps, and 2(n-1)/n of the buffer through each link;
    free for n <= 1."""
    if n <= 1:
        return 0.0
    steps = 2.0 * (n - 1.0)
    return latency_s + steps * step_latency_s + steps / n * nbytes / (link_Bps * efficiency)


def ring_allgather_s(nbytes, n, link_Bps, efficiency, latency_s, step_latency_s):
    """One fixed latency, n-1 ring steps, and (n-1)/n of the full buffer through each link;
    free for n <= 1."""
    if n <= 1:
        return 0.0
    steps = n - 1.0
    return latency_s + steps * step_latency_s + steps / n * nbytes / (link_Bps * efficiency)


def tree_allreduce_s(nbytes, n, link_Bps, efficiency, latency_s, step_latency_s):
    """Double binary tree: up and down a tree of depth floor(log2 n) (NCCL's tuning model), so
    2*floor(log2 n) latency steps; the same 2(n-1)/n of the buffer through each link as the
    ring; free for n <= 1."""
    if n <= 1:
        return 0.0
    depth = int(math.log2(n))
    return latency_s + 2.0 * depth * step_latency_s + 2.0 * (n - 1.0) / n * nbytes / (link_Bps * efficiency)


def members_per_node(stride, n, gpus_per_node):
    """Ranks of an n-rank group with spacing ``stride`` that land on one node (at least 1)."""
    if stride >= gpus_per_node:
        return 1.0
    return float(max(1, min(n, math.floor(gpus_per_node / stride))))


def _link(hw, side):
    """(link_Bps, efficiency, latency_s, step_latency_s) of ``side`` = "intra" or "inter"."""
    return (hw_get(hw, f"{side}_node_Bps"), hw_get(hw, f"{side}_node_efficiency"),
            hw_get(hw, f"{side}_node_latency_s"), hw_get(hw, f"{side}_node_step_latency_s"))


def intra_allreduce_s(nbytes, n, hw):
    return ring_allreduce_s(nbytes, n, *_link(hw, "intra"))


def intra_allgather_s(nbytes, n, hw):
    return ring_allgather_s(nbytes, n, *_link(hw, "intra"))


def group_allreduce_s(nbytes, n, stride, hw):
    """All-reduce over n ranks spaced ``stride``: NVLink ring inside one node; otherwise
    hierarchical (intra reduce-scatter + inter tree all-reduce of the 1/g shard per NIC +
    intra all-gather)."""
    if n <= 1:
        return 0.0
    per_node = members_per_node(stride, n, hw_get(hw, "gpus_per_node"))
    nodes = math.ceil(n / per_node)
    if nodes <= 1:
        return intra_allreduce_s(nbytes, n, hw)
    inter_s = tree_allreduce_s(nbytes / per_node, nodes, *_link(hw, "inter"))
    reduce_scatter_s = intra_allgather_s(nbytes, per_node, hw)
    allgather_s = intra_allgather_s(nbytes, per_node, hw)
    return inter_s + (reduce_scatter_s + allgather_s)


def group_reduce_scatter_allgather_s(nbytes, n, stride, hw):
    """Reduce-scatter then all-gather (distributed optimizer): rings everywhere; hierarchical
    across nodes like the all-reduce, with a ring reduce-scatter + all-gather between nodes."""
    if n <= 1:
        return 0.0
    per_node = members_per_node(stride, n, hw_get(hw, "gpus_per_node"))
    nodes = math.ceil(n / per_node)
    if nodes <= 1:
        return intra_allgather_s(nbytes, n, hw) + intra_allgather_s(nbytes, n, hw)
    inter_s = 2.0 * ring_allgather_s(nbytes / per_node, nodes, *_link(hw, "inter"))
    return inter_s + 2.0 * intra_allgather_s(nbytes, per_node, hw)


def p2p_s(nbytes, crosses_node, hw):
    """One send: framework overhead + fixed latency + bytes at the NIC's (or NVLink's)
    achievable bandwidth (no ring steps)."""
    link_Bps, efficiency, latency_s, _ = _link(hw, "inter" if crosses_node else "intra")
    return hw_get(hw, "p2p_overhead_s") + latency_s + nbytes / (link_Bps * efficiency)


# ---------------------------------------------------------------------------------------------
# memory.py: parameters and bytes
# ---------------------------------------------------------------------------------------------
def _qkv_cols(h, a, g):
    return h + 2.0 * h * g / a


def _norm(h, arch):
    """A LayerNorm's weight and bias, or an RMSNorm's weight."""
    return h if flags(arch)["normalization"] == RMSNORM else 2.0 * h


def layer_params(h, a, g, f, arch=0.0):
    """QKV weight+bias, projection weight+bias, FC1 weight+bias (gate and up when gated), FC2
    weight+bias (no biases without add_bias_linear), 2 norms."""
    fl = flags(arch)
    gated, bias = fl["gated_mlp"], fl["add_bias_linear"]
    qw = _qw(h, a, arch)
    q = _qkv_cols(qw, a, g)
    if _mla(arch):          # MLA's linears and norms (no biases), the projection's bias if any
        return (mla_weights_on_rank(h, a, 1.0, arch) + bias * h + (h * f + bias * f) * (1.0 + gated)
                + (f * h + bias * h) + 2.0 * _norm(h, arch))
    return (h * q + bias * q) + (qw * h + bias * h) + (h * f + bias * f) * (1.0 + gated) + (f * h + bias * h) + 2.0 * _norm(h, arch)


def layer_params_per_rank(h, a, g, f, t, arch=0.0):
    """Split by t: QKV weight+bias, projection weight, FC1 weight+bias, FC2 weight.
    Replicated: the row-parallel biases (projection, FC2) and the two norms."""
    fl = flags(arch)
    gated, bias = fl["gated_mlp"], fl["add_bias_linear"]
    qw = _qw(h, a, arch)
    q = _qkv_cols(qw, a, g)
    if _mla(arch):          # MLA: down projections and their norms whole on every rank
        return (mla_weights_on_rank(h, a, t, arch) + ((h * f + bias * f) * (1.0 + gated) + f * h) / t
                + bias * (h + h) + 2.0 * _norm(h, arch))
    split = h * q + bias * q + qw * h + (h * f + bias * f) * (1.0 + gated) + f * h
    return split / t + bias * (h + h) + 2.0 * _norm(h, arch)


def position_params(s, h, arch=0.0):
    """A learned s x h position table; none with RoPE or no position embedding."""
    return s * h if flags(arch)["position_embedding_type"] == LEARNED else 0.0


def model_params(num_layers, h, a, g, f, v, s, arch=0.0):
    """Layers + word embedding + position embedding + final norm + the LM head when untied."""
    head = v * h if flags(arch)["untie_embeddings_and_output_weights"] else 0.0
    return num_layers * layer_params(h, a, g, f, arch) + v * h + position_params(s, h, arch) + _norm(h, arch) + head


def layer_activation_bytes(b, s, h, a, g, f, t, flash, sp, gated=0.0, qw=None, latent=0.0, e=2.0):
    """Korthikanti et al. 2022 Sec. 4.1, generalised to GQA and any FFN width:
    sbh(10 + (4 + 4g/a + 4f/h)/t) + 5 a s^2 b / t; with sequence parallelism (Sec. 4.2.2) the
    10 sbh outside the TP regions is divided by t as well; with FlashAttention the s^2 term
    (softmax out, dropout mask and out) becomes an fp32 log-sum-exp per query row. Heads of
    kv_channels d (``qw = a d``): Q and the context 2 s b qw bytes each, K and V 2 s b qw g / a each.
    ``e`` bytes per element (4 under fp32 / tf32); the dropout masks stay 1 byte."""
    qw = h if qw is None else qw
    qkv_and_context = 2.0 * e * qw + 2.0 * e * qw * g / a   # Q + context, K + V (bytes per token)
    tp_split = qkv_and_context / h + (e * (1.0 + gated) + e) * f / h   # FC1 out (gate, up) + act out
    # LN1 and LN2 inputs, QKV's and FC1's inputs (the LN outputs), two 1-byte dropout masks
    kept = 4.0 * e + 2.0
    outside = kept / t if sp else kept
    attention_core = attention_core_bytes(b, s, a, t, flash, e)
    # MLA (latent = q_lora_rank + kv_lora_rank): the q and kv norms' inputs and outputs, e bytes
    # each, on the rows the down projections ran on
    mla_norms = (e + e) * s * b * latent / (t if sp else 1.0)
    return s * b * h * (outside + tp_split / t) + attention_core + mla_norms


def fp8_saved_bytes_fewer(b, s, h, f, t, flash, sp, mxfp8=False, qw=None, latent=0.0):
    """TE saves the FP8 (1-byte) copy of a linear's input for its weight gradient: 1 byte fewer
    per element of the QKV and FC1 inputs (1/t with sequence parallelism), FC2's input (f/t) and,
    unless FlashAttention keeps it as its output, the projection's (h/t). MXFP8's saved copy
    keeps its scales: 1/32 byte per element back."""
    qw = h if qw is None else qw      # the projection's input: the context, a heads x kv_channels
    elements = (2.0 * s * b * h / (t if sp else 1.0) + s * b * f / t + (0.0 if flash else s * b * qw / t)
                + s * b * latent / (t if sp else 1.0))          # MLA: the up projections' inputs
    return (2.0 - 1.0 - (1.0 / 32.0 if mxfp8 else 0.0)) * elements


def linear_weights(h, a, g, f, t, gated=0.0, qw=None, arch=0.0):
    """Weights of one layer's four linears on one TP rank (no biases); MLA's linears instead of QKV."""
    if _mla(arch):
        fl = flags(arch)
        return (mla_weights_on_rank(h, a, t, arch) - _norm(fl["q_lora_rank"] + fl["kv_lora_rank"], arch)
                + (2.0 + gated) * h * f / t)
    qw = h if qw is None else qw
    return (h * _qkv_cols(qw, a, g) + qw * h + (2.0 + gated) * h * f) / t


def attention_core_bytes(b, s, a, t, flash, e=2.0):
    """What only the attention core keeps: softmax output (fp16, fp32 when unfused or under fp32),
    dropout mask (1 byte) and dropout output (e) per score element; with FlashAttention the fp32
    log-sum-exp per row."""
    if flash:
        return 4.0 * b * (a / t) * s
    softmax_out = e if softmax_fused(b, s, a, t) else 4.0
    return (softmax_out + 1.0 + e) * a * s * s * b / t


def stage_activation_bytes(layers_on_stage, in_flight, b, s, h, a, g, f, t, recompute, flash, sp, gated=0.0,
                           fp8=False, mxfp8=False, qw=None, cw=None, latent=0.0, e=2.0):
    """A stage holding ``in_flight`` micro-batches; full recompute (code 1) keeps each layer's
    fp16 input (its 1/t slice with sequence parallelism) plus one layer rebuilt at a time;
    selective recompute (code 2) keeps everything but the attention core's tensors; FP8 layers
    keep their linears' inputs in FP8 (:func:`fp8_saved_bytes_fewer`)."""
    per_layer = layer_activation_bytes(b, s, h, a, g, f, t, flash, sp, gated, qw, latent, e)
    if fp8:
        per_layer -= fp8_saved_bytes_fewer(b, s, h, f, t, flash, sp, mxfp8, qw if cw is None else cw, latent)
    if recompute == 2:
        core = attention_core_bytes(b, s, a, t, flash, e)   # rebuilt for one layer at a time in backward
        return in_flight * layers_on_stage * (per_layer - core) + core
    if recompute == 1:
        kept_input = e * s * b * h / (t if sp else 1.0)
        return in_flight * layers_on_stage * kept_input + per_layer
    return in_flight * layers_on_stage * per_layer


# ---------------------------------------------------------------------------------------------
# totals.py, costs.py, pipeline.py, step.py: one configuration
# ---------------------------------------------------------------------------------------------
def chinchilla_loss(num_parameters, num_tokens):
    """Hoffmann et al. 2022 Eq. 10 (Approach 3): E + A/N^0.34 + B/D^0.28."""
    E, A, B, alpha, beta = 1.69, 406.4, 410.7, 0.34, 0.28
    return E + A / num_parameters ** alpha + B / num_tokens ** beta


def forward_flops_per_token(num_layers, h, a, g, f, v, s, gated=0.0, qw=None, arch=0.0):
    """2 FLOPs per weight per token for QKV, projection and MLP, 4sh for attention scores and
    context over the full s x s, and 2hv for the LM head; with heads of kv_channels d the
    attention's h is qw = a d where it is the query width (Megatron-LM's query_projection_size)."""
    qw = h if qw is None else qw
    per_layer = 2.0 * h * _qkv_cols(qw, a, g) + 2.0 * qw * h + 2.0 * (2.0 + gated) * h * f + 2.0 * 2.0 * s * qw
    if _mla(arch):
        # 2 FLOPs per weight of MLA's linears and its projection; scores over the query/key width,
        # context over the value width, full s x s
        fl = flags(arch)
        weights = sum(n * k for _, n, k, _ in mla_linears(1.0, h, a, 1.0, 1.0, arch)) + a * fl["v_head_dim"] * h
        per_layer = (2.0 * weights + 2.0 * (2.0 + gated) * h * f
                     + 2.0 * s * a * (fl["qk_head_dim"] + fl["qk_pos_emb_head_dim"]) + 2.0 * s * a * fl["v_head_dim"])
    return num_layers * per_layer + 2.0 * h * v


def stage_layer_counts(L, p, hw=None):
    """Transformer layers of each of the ``p`` pipeline stages, first to last, or ``None`` when
    Megatron-core cannot split ``L`` layers so: evenly by default; a set (non-zero)
    first_pipeline_num_layers / last_pipeline_num_layers fixes that stage and the others share
    the rest evenly; account_for_embedding / loss_in_pipeline_split count the embedding / the
    loss as one more layer of the first / last stage. Every stage needs a layer."""
    setting = (lambda name: int(hw_get(hw, name))) if hw is not None else (lambda name: 0)
    if p == 1:
        return [L]
    extra_first = setting("account_for_embedding_in_pipeline_split")
    extra_last = setting("account_for_loss_in_pipeline_split")
    if extra_first or extra_last:
        total = L + extra_first + extra_last
        if total % p:
            return None
        counts = [total // p] * p
        counts[0] -= extra_first
        counts[-1] -= extra_last
    else:
        fixed = {}
        if setting("first_pipeline_num_layers"):
            fixed[0] = setting("first_pipeline_num_layers")
        if setting("last_pipeline_num_layers"):
            fixed[p - 1] = setting("last_pipeline_num_layers")
        rest = L - sum(fixed.values())
        free = [i for i in range(p) if i not in fixed]
        if free and rest % len(free):
            return None
        if not free and rest != 0:
            return None
        counts = [fixed.get(i, rest // len(free) if free else 0) for i in range(p)]
    return counts if min(counts) >= 1 else None


def layers_per_device(L, counts, chunks, hw, is_kind):
    """How many of each pipeline device's layers ``is_kind(j)`` holds for (j the global layer
    index). The layers are dealt out in virtual-stage order: chunk c of device i is virtual stage
    c p + i, 1 / chunks of the device's layers (the embedding / loss slots counted as layers take
    one from the first / last chunk)."""
    p = len(counts)
    e = int(hw_get(hw, "account_for_embedding_in_pipeline_split")) if p > 1 else 0
    lo = int(hw_get(hw, "account_for_loss_in_pipeline_split")) if p > 1 else 0
    slots = [c + (e if i == 0 else 0) + (lo if i == p - 1 else 0) for i, c in enumerate(counts)]
    per_device, layer = [0] * p, 0
    for c in range(chunks):
        for i in range(p):
            size = slots[i] // chunks - (e if (i == 0 and c == 0) else 0) - (lo if (i == p - 1 and c == chunks - 1) else 0)
            per_device[i] += sum(1 for j in range(layer, layer + size) if is_kind(j))
            layer += size
    assert layer == L
    return per_device


def bf16_layers_per_stage(L, counts, chunks, hw):
    """Under FP8, how many of each pipeline device's layers run in bf16: Megatron-core keeps the
    global layers ``j < num_layers_at_start_in_bf16`` and ``j >= L - num_layers_at_end_in_bf16``
    in bf16 (fp8_utils.is_first_last_bf16_layer)."""
    if not _fp8(hw):
        return [0] * len(counts)
    start, end = int(hw_get(hw, "num_layers_at_start_in_bf16")), int(hw_get(hw, "num_layers_at_end_in_bf16"))
    return layers_per_device(L, counts, chunks, hw, lambda j: j < start or j >= L - end)


def validate_shape(L, h, a, g, f, v, s, B, b, t, p, d, hw=None, cp=1, arch=0.0):
    """First failing Megatron-LM rule as a status code, ``OK`` if none fails; context parallelism
    cuts each sequence into 2 cp equal chunks, so seq_length must divide by 2 cp."""
    if any(x <= 0 for x in (L, h, a, g, f, v, s, B, b, t, p, d, cp)):
        return BAD_INPUT
    if a % t or g % t or (h % a and not flags(arch)["kv_channels"] and not _mla(arch)) or a % g:
        return BAD_HEADS
    if stage_layer_counts(L, p, hw) is None:
        return BAD_LAYERS
    if hw is not None:                   # hybrid sharding: dp_shard divides dp x cp (with ZeRO)
        k = int(hw_get(hw, "dp_shard"))
        sharded = max(hw_get(hw, "zero_stage"), hw_get(hw, "distributed_optimizer")) >= 1
        if k > 0 and sharded and (k > d * cp or (d * cp) % k):
            return BAD_NUM_GPUS
        fl = flags(arch)
        if fl["num_experts"] >= 1:      # MoE: experts split over ep, the expert grid tiles a stage's ranks
            ep, etp = expert_sizes(t, hw)
            if ep < 1:
                return BAD_INPUT
            if fl["num_experts"] % ep:
                return BAD_HEADS
            if (t * cp * d) % (etp * ep):
                return BAD_NUM_GPUS
    if cp > 1 and s % (2 * cp):
        return BAD_SEQ_LENGTH
    if B % (d * b):
        return BAD_BATCH
    return OK


def nan_outputs() -> dict:
    return {name: math.nan for name in OUTPUT_NAMES}


def context_parallel_attention(b, sl, h, a, g, t, cp, hw):
    """Context parallelism's attention on one rank holding ``sl = s / cp`` tokens of each sequence
    (2 of the 2 cp chunks: the causal load balance), one layer, one micro-batch:
    ``(extra forward compute, extra backward compute, exposed forward exchange, exposed backward
    exchange)``, the compute beyond one local FlashAttention call of ``sl`` rows.

    The rank's queries against all earlier keys are ``cp`` times the local causal block's FLOPs.
    Ring (p2p): ``cp`` flash steps forward, each followed by an output correction (read the step's
    output, read and write the running one: 6 bytes per element, one launch), and ``cp`` backward
    steps, all but the first followed by the dQ and dK/dV accumulation (6 bytes per element, two
    launches); K/V blocks (K and V of ``sl`` tokens, the rank's KV heads) travel to the next
    rank: ``cp - 1`` transfers forward, ``cp`` backward (K/V, then K/V with the dK/dV so far, then
    dK/dV alone), each hidden behind the block computed meanwhile; latency + bytes / link rate,
    the NIC when the cp group (stride t) leaves the node. All-gather: the two local query chunks
    as two kernels doing the same FLOPs over the gathered K/V, an output copy (4 bytes per
    element), the all-gather of every rank's K/V before the forward and again before the backward,
    and the reduce-scatter of dK/dV after it, all exposed."""
    if cp <= 1:
        return 0.0, 0.0, 0.0, 0.0
    fwd_block = flash_attention_forward_s(b, sl, h, a, g, t, hw)
    bwd_block = flash_attention_backward_s(b, sl, h, a, g, t, hw)
    flops, q_bytes, kv_bytes, lse_bytes, heads = _flash_sizes(b, sl, h, a, g, t)
    if hw_get(hw, "cp_comm_type") == 1.0:                # all_gather
        fwd = _flash_kernels_s(cp * flops, q_bytes + cp * kv_bytes + q_bytes + lse_bytes, b, heads, sl, 2.0, hw)
        fwd += memory_bound_time_s(4.0 * q_bytes / BYTES_FP16, 1.0, hw) - fwd_block
        reads = q_bytes + cp * kv_bytes + q_bytes + q_bytes + lse_bytes
        writes = q_bytes + cp * kv_bytes
        bwd = _flash_kernels_s(2.5 * cp * flops, reads + writes + 2.0 * 2.0 * q_bytes, b, heads, sl,
                               2.0 * FLASH_BWD_LAUNCHES, hw) - bwd_block
        gathered = cp * kv_bytes
        gather = group_reduce_scatter_allgather_s(gathered, cp, t, hw) / 2.0
        return fwd, bwd, gather, 2.0 * gather
    correction = memory_bound_time_s(6.0 * q_bytes / BYTES_FP16, 1.0, hw)
    accumulate = memory_bound_time_s(6.0 / BYTES_FP16 * (q_bytes + kv_bytes), 2.0, hw)
    fwd = (cp - 1) * fwd_block + cp * correction
    bwd = (cp - 1) * (bwd_block + accumulate)
    side = "inter" if t * cp > hw_get(hw, "gpus_per_node") else "intra"
    bw, eff = hw_get(hw, f"{side}_node_Bps"), hw_get(hw, f"{side}_node_efficiency")

    def transfer(nbytes):
        return hw_get(hw, f"{side}_node_latency_s") + nbytes / (bw * eff)
    fwd_exposed = (cp - 1) * max(0.0, transfer(kv_bytes) - fwd_block)
    bwd_exposed = (2 * max(0.0, transfer(kv_bytes) - bwd_block)
                   + (cp - 2) * max(0.0, transfer(2.0 * kv_bytes) - bwd_block))
    return fwd, bwd, fwd_exposed, bwd_exposed


# ---------------------------------------------------------------------------------------------
# Mixture of experts (issue 13, docs/moe.md)
# ---------------------------------------------------------------------------------------------
def expert_sizes(t, hw):
    """(ep, etp); etp 0 is Megatron-core's unset expert TP size: the same as tp."""
    etp = hw_get(hw, "etp")
    return hw_get(hw, "ep"), (etp if etp > 0 else float(t))


def is_moe_layer(j, fl):
    """Layer j (global) is an MoE layer: from moe_first_dense_layers on, every moe_layer_step-th."""
    return j >= fl["moe_first_dense_layers"] and j % fl["moe_layer_step"] == 0


def moe_layers_per_stage(L, counts, chunks, hw, fl):
    """MoE layers of each pipeline device (:func:`layers_per_device`)."""
    if fl["num_experts"] < 1:
        return [0] * len(counts)
    return layers_per_device(L, counts, chunks, hw, lambda j: is_moe_layer(j, fl))


def grouped_gemm_s(m, n, k, groups, hw):
    """A rank's local experts as one grouped GEMM: all groups' FLOPs, bytes and tiles, one kernel
    overhead (bf16 one kernel; FP8 TE's concurrent streams)."""
    if _fp8(hw):
        return fp8_gemm_time_s(m, n, k, hw, groups)
    return gemm_time_s(m, n, k, groups, hw)


def moe_layer(b, s, h, f, t, hw, fl):
    """An MoE layer beyond a dense one, one micro-batch, one rank (s: the rank's tokens of a
    sequence): ``(forward s, backward s, stored bytes)``. Each TP rank routes b s / t tokens; each
    of its E / ep local experts takes routed k etp / (E / ep) rows (uniform routing, balanced: the
    load-imbalance factor 1.0); widths moe_ffn_hidden_size / etp; the router GEMM (E outputs) and
    its softmax / top-k (8 bytes per logit, 2 kernels) and the permutation and unpermutation (read
    the tokens, write k copies and back: 4 (1 + k) h bytes per token, 2 kernels), the same each way;
    the shared experts a dense MLP over t; instead of the dense MLP."""
    gated = fl["gated_mlp"]
    e, k = fl["num_experts"], fl["moe_router_topk"]
    ep, etp = expert_sizes(t, hw)
    tokens = b * s
    routed = tokens / t
    local = e / ep
    rows = routed * k * etp / local * busiest_share(ep, hw)
    fe = (fl["moe_ffn_hidden_size"] or f) / etp
    fs = fl["moe_shared_expert_intermediate_size"] / t
    permute = 4.0 * (1.0 + k) * routed * h
    if _allgather_dispatcher(hw):       # the permutation reads all gathered tokens, the unpermutation
        permute += (2.0 + 4.0) * (ep * etp - 1.0) * routed * h      # writes them all back in fp32
    permute *= act_scale(hw)            # 4-byte rows under fp32 / tf32
    router_mem = memory_bound_time_s(8.0 * routed * e + permute, 4.0, hw)
    fwd = gemm_time_s(routed, e, h, 1.0, hw) + router_mem
    bwd = gemm_time_s(routed, h, e, 1.0, hw) + gemm_time_s(h, e, routed, 1.0, hw) + router_mem
    fc1 = (1.0 + gated) * fe
    fwd += grouped_gemm_s(rows, fc1, h, local, hw) + grouped_gemm_s(rows, h, fe, local, hw)
    bwd += (grouped_gemm_s(rows, h, fc1, local, hw) + grouped_gemm_s(h, fc1, rows, local, hw)
            + grouped_gemm_s(rows, fe, h, local, hw) + grouped_gemm_s(fe, h, rows, local, hw))
    dense_fc1 = (1.0 + gated) * f / t
    fwd -= linear_gemm_s(tokens, dense_fc1, h, hw) + linear_gemm_s(tokens, h, f / t, hw)
    bwd -= (linear_gemm_s(tokens, h, dense_fc1, hw) + linear_gemm_s(h, dense_fc1, tokens, hw)
            + linear_gemm_s(tokens, f / t, h, hw) + linear_gemm_s(f / t, h, tokens, hw))
    fwd_bytes = (4.0 + 2.0 * gated) * (local * rows * fe - tokens * f / t)
    bwd_bytes = (6.0 + 4.0 * gated) * (local * rows * fe - tokens * f / t)
    # kept: expert inputs, FC1 outputs, activation outputs per row; the combined expert outputs (k
    # copies of h per routed token, for the probabilities' gradient); the fp32 logits
    stored = (local * rows * (2.0 * h + (4.0 + 2.0 * gated) * fe) + 2.0 * k * routed * h + 4.0 * routed * e
              - (4.0 + 2.0 * gated) * tokens * f / t)
    launches = 0.0
    if fs > 0:
        sfc1 = (1.0 + gated) * fs
        fwd += linear_gemm_s(tokens, sfc1, h, hw) + linear_gemm_s(tokens, h, fs, hw)
        bwd += (linear_gemm_s(tokens, h, sfc1, hw) + linear_gemm_s(h, sfc1, tokens, hw)
                + linear_gemm_s(tokens, fs, h, hw) + linear_gemm_s(fs, h, tokens, hw))
        fwd_bytes += (4.0 + 2.0 * gated) * tokens * fs
        bwd_bytes += (6.0 + 4.0 * gated) * tokens * fs
        stored += (4.0 + 2.0 * gated) * tokens * fs
        launches = 1.0
    sc = act_scale(hw)                  # under fp32 / tf32 every part doubles (the fp32 logits too)
    return (fwd + memory_bound_time_s(sc * fwd_bytes, launches, hw), bwd + memory_bound_time_s(sc * bwd_bytes, launches, hw),
            sc * stored)


def all_to_all_s(nbytes, n, stride, hw):
    """Each of n ranks (stride apart) sends nbytes / n to every rank; the node's peers over NVLink,
    the others over the NIC at the same time."""
    if n <= 1:
        return 0.0
    per_node = members_per_node(stride, n, hw_get(hw, "gpus_per_node"))
    intra = hw_get(hw, "intra_node_Bps") * hw_get(hw, "intra_node_efficiency")
    if per_node >= n:
        return hw_get(hw, "intra_node_latency_s") + nbytes * (n - 1) / n / intra
    inter = hw_get(hw, "inter_node_Bps") * hw_get(hw, "inter_node_efficiency")
    return hw_get(hw, "inter_node_latency_s") + max(nbytes * (per_node - 1) / n / intra, nbytes * (n - per_node) / n / inter)


def busiest_share(ep, hw):
    """The busiest expert-parallel rank's tokens over the even share: the assumed load imbalance
    (none at ep = 1, where every rank holds every expert; at most ep), capped by a capacity factor
    (the tokens beyond are dropped), or the capacity itself when padded to it."""
    imbalance = min(hw_get(hw, "moe_load_imbalance"), ep) if ep > 1 else 1.0
    c = hw_get(hw, "moe_expert_capacity_factor")
    if c > 0:
        return c if hw_get(hw, "moe_pad_expert_input_to_capacity") != 0.0 else min(c, imbalance)
    return imbalance


def _allgather_dispatcher(hw):
    return SETTINGS_BY_NAME["moe_token_dispatcher_type"].decode(hw_get(hw, "moe_token_dispatcher_type")) == "allgather"


def _ep_overlap(hw):
    """overlap_moe_expert_parallel_comm on, with the alltoall dispatcher it needs (else no effect)."""
    return hw_get(hw, "overlap_moe_expert_parallel_comm") != 0.0 and not _allgather_dispatcher(hw)


def ep_exchange(b, s, h, t, hw, fl):
    """One MoE layer's token exchange, ``(forward, backward)`` seconds. alltoall: the dispatch and
    combine all-to-all (k h bf16 values per routed token, over the ep ranks, etp apart), and over
    etp > 1 the all-gather and reduce-scatter of the received tokens; the same each way. allgather:
    over the etp x ep ranks, each rank's b s / t tokens all-gathered (bf16 2 h, fp32 probabilities 4 E,
    bool routing map E bytes) and the fp32 outputs (4 h) reduce-scattered; backward the outputs'
    gradients all-gathered (4 h) and the tokens' and probabilities' reduce-scattered (2 h + 4 E)."""
    ep, etp = expert_sizes(t, hw)
    if _allgather_dispatcher(hw):
        n = ep * etp
        if n <= 1:
            return 0.0, 0.0
        per_rank = b * s / t * act_scale(hw)
        e = fl["num_experts"]

        def one(nbytes_per_token):     # one all-gather or reduce-scatter of the gathered buffer
            return group_reduce_scatter_allgather_s(n * per_rank * nbytes_per_token, n, 1.0, hw) / 2.0
        return one(2.0 * h + 5.0 * e) + one(4.0 * h), one(4.0 * h) + one(2.0 * h + 4.0 * e)
    nbytes = 2.0 * fl["moe_router_topk"] * h * b * s / t * busiest_share(ep, hw) * act_scale(hw)   # the busiest rank's receive
    x = 2.0 * all_to_all_s(nbytes, ep, etp, hw)
    if etp > 1:
        x += 2.0 * group_reduce_scatter_allgather_s(nbytes * etp, etp, 1.0, hw) / 2.0
    return x, x


def moe_layer_params(h, a, g, f, t, ep, etp, arch):
    """(dense part, local experts) of one MoE layer's parameters on one rank: attention and norms
    as a dense layer's, the router E h replicated, the shared experts over t (FC2 bias replicated),
    E / ep experts over etp (FC2 biases replicated)."""
    fl = flags(arch)
    gated, bias = fl["gated_mlp"], fl["add_bias_linear"]
    qw = _qw(h, a, arch)
    q = _qkv_cols(qw, a, g)
    dense = (h * q + bias * q + qw * h) / t + bias * h + 2.0 * _norm(h, arch) + fl["num_experts"] * h
    if _mla(arch):
        dense = mla_weights_on_rank(h, a, t, arch) + bias * h + 2.0 * _norm(h, arch) + fl["num_experts"] * h
    fs = fl["moe_shared_expert_intermediate_size"]
    if fs:
        dense += ((h * fs + bias * fs) * (1.0 + gated) + fs * h) / t + bias * h
    fe = fl["moe_ffn_hidden_size"] or f
    experts = fl["num_experts"] / ep * (((h * fe + bias * fe) * (1.0 + gated) + fe * h) / etp + bias * h)
    return dense, experts


def step(L, h, a, g, f, v, s, B, b, t, p, d, recompute, num_tokens, hw, arch=0.0, cp=1):
    """One configuration. Returns ``(status, outputs)``, outputs keyed by :data:`OUTPUT_NAMES`
    (all NaN for a shape error).

    Model: 1F1B over ``p`` stages with per-micro-batch stage times ``T_i``:
    ``iteration = (m - 1) max_i T_i + sum_i T_i + dp all-reduce + Adam + fixed overhead``;
    interleaved over ``vpp`` chunks per device, the warm-up/cool-down part ``sum_i T_i - max_i T_i``
    is divided by ``vpp``.
    """
    status = validate_shape(L, h, a, g, f, v, s, B, b, t, p, d, hw, cp, arch)
    # interleaved 1F1B (vpp model chunks per device, only with a pipeline): Megatron-core refuses
    # it over 2 stages (a settings rule: before the batch rule, after the shape rules), and needs
    # the layers to split into p * vpp chunks and the micro-batch count to be a multiple of p
    chunks = int(hw_get(hw, "vpp")) if p > 1 else 1
    # context parallelism runs only in Transformer Engine's fused (flash) attention
    if status in (OK, BAD_BATCH) and cp > 1 and not _flash_on(hw) and B > 0 and b > 0:
        status = REFUSED
    # Megatron-core: expert parallelism with tensor parallelism needs sequence parallelism
    if (status in (OK, BAD_BATCH) and flags(arch)["num_experts"] >= 1 and hw_get(hw, "ep") > 1 and t > 1
            and hw_get(hw, "sequence_parallel") == 0.0 and B > 0 and b > 0):
        status = REFUSED
    # ... and its all-to-all overlap needs ep > 1, vpp > 1 at pp > 1, and no full recomputation
    if (status in (OK, BAD_BATCH) and flags(arch)["num_experts"] >= 1 and B > 0 and b > 0
            and _ep_overlap(hw)
            and (hw_get(hw, "ep") <= 1 or (p > 1 and chunks <= 1))):
        status = REFUSED
    if status == OK and chunks > 1:
        counts = stage_layer_counts(L, p, hw)
        # with the embedding / loss counted as layers, Megatron-core splits (L + e + l) / (p vpp)
        # per chunk and takes one from the first / last chunk
        counts[0] += int(hw_get(hw, "account_for_embedding_in_pipeline_split"))
        counts[-1] += int(hw_get(hw, "account_for_loss_in_pipeline_split"))
        if any(n % chunks for n in counts):
            status = BAD_LAYERS
        elif (B // (d * b)) % p:
            status = BAD_BATCH
    if status != OK:
        return status, nan_outputs()
    if (flags(arch)["num_experts"] >= 1 and any(is_moe_layer(j, flags(arch)) for j in range(L)) and recompute == 1
            and _ep_overlap(hw)):
        return REFUSED, nan_outputs()       # Megatron-core: no full recomputation with the a2a overlap
    k_off = int(max(0.0, hw_get(hw, "cpu_offloading_num_layers")))
    if k_off > 0 and (p > 1 or recompute != 0 or k_off >= L):
        return REFUSED, nan_outputs()       # Megatron-core: CPU offloading without pp, recomputation, all layers
    stage_layers = [float(n) for n in stage_layer_counts(L, p, hw)]
    bf16_layers = [float(n) for n in bf16_layers_per_stage(L, stage_layer_counts(L, p, hw), chunks, hw)]
    fl0 = flags(arch)
    moe_layers = [float(n) for n in moe_layers_per_stage(L, stage_layer_counts(L, p, hw), chunks, hw, fl0)]
    n_moe_total = float(sum(1 for j in range(L) if is_moe_layer(j, fl0))) if fl0["num_experts"] >= 1 else 0.0
    L, h, a, g, f, v, s, B, b, t, p, d, cp = map(float, (L, h, a, g, f, v, s, B, b, t, p, d, cp))
    s_full = s
    s = s_full / cp               # every rank works on s / cp tokens of each sequence
    dg = d * cp                   # gradients are reduced (and sharded) over the dp x cp ranks
    p_stages = int(p)
    m = B / (d * b)                        # micro-batches per pipeline
    fewest = min(stage_layers)                     # layers of the stage with the fewest
    rc = 1.0 if recompute == 1 else 0.0            # full: every layer's forward again
    selective = recompute == 2                     # selective: the attention core again
    num_gpus = t * cp * p * d
    sbh = s * b * h

    # --- one micro-batch on one layer / embedding / head
    fl = flags(arch)
    gated = fl["gated_mlp"]
    qw = _qw(h, a, arch)          # the attention width (queries, context): a heads x kv_channels
    cw = _cw(h, a, arch)          # the context's width (the projection's input; a x v_head_dim with MLA)
    latent = fl["q_lora_rank"] + fl["kv_lora_rank"] if _mla(arch) else 0.0
    sp_ways = _seq_split(t, hw)

    def column_parallel(wgrad, linears_hw):
        """The GEMMs of the attention's column-parallel linears (QKV; MLA's up projections) that
        an input all-gather feeds (forward) or whose input-gradient exchange runs beside (wgrad)."""
        if _mla(arch):
            lin = [(m, n, k) for m, n, k, split in mla_linears(b * s, h, a, t, sp_ways, arch) if split]
        else:
            lin = [(b * s, _layer_dims(b, s, qw, a, g, t)[3], h)]
        return sum(linear_gemm_s(k, n, m, linears_hw) if wgrad else linear_gemm_s(m, n, k, linears_hw)
                   for m, n, k in lin)
    cp_fwd, cp_bwd, cp_fwd_exposed, cp_bwd_exposed = context_parallel_attention(b, s, qw, a, g, t, cp, hw)
    fwd = layer_forward_s(b, s, h, a, g, f, t, hw, arch) + cp_fwd
    bwd = layer_backward_s(b, s, h, a, g, f, t, hw, arch) + cp_bwd
    eb = elem_bytes(hw)           # 2, or 4 under fp32 / tf32: activations, weights, gradients
    allreduce_act = group_allreduce_s(eb * b * s * h, t, 1.0, hw)   # TP group, stride 1
    if hw_get(hw, "sequence_parallel") != 0.0:       # reduce-scatter + all-gather instead
        allreduce_act = group_reduce_scatter_allgather_s(eb * b * s * h, t, 1.0, hw)
    allreduce_ce = group_allreduce_s(4.0 * b * s, t, 1.0, hw)              # fp32 per token
    core_again = attention_core_forward_s(b, s, qw, a, g, t, hw) + cp_fwd if selective else 0.0
    # the ring's (or all-gather's) exposed exchange of every forward of a layer (recomputed too,
    # and the attention core rerun by selective recomputation) and of its backward
    layer_cp = (1.0 + rc + (1.0 if selective else 0.0)) * cp_fwd_exposed + cp_bwd_exposed
    layer_compute = fwd + bwd + rc * fwd + core_again       # one layer; a stage: times its layers
    # Megatron TP: 2 all-reduces forward + 2 backward per layer, 2 more when recomputing
    seq_par_on = hw_get(hw, "sequence_parallel") != 0.0

    def exposed_layer_tp(linears_hw):
        """One layer's exposed TP exchange, its linears' GEMMs timed on ``linears_hw``."""
        layer_tp = (4.0 + 2.0 * rc) * allreduce_act
        if (hw_get(hw, "async_tensor_model_parallel_allreduce") != 0.0 or seq_par_on) and t > 1.0:
            # async TP: the input-gradient all-reduce of QKV and of FC1 (with sequence parallelism
            # its reduce-scatter, half of the exchange, overlapped by Megatron-LM in any case) runs
            # under their weight-gradient GEMMs (dW = X^T dY: h x cols x tokens), hidden up to the
            # GEMM's length
            hideable = allreduce_act / 2.0 if seq_par_on else allreduce_act
            layer_tp -= min(hideable, column_parallel(True, linears_hw))
            layer_tp -= min(hideable, linear_gemm_s(h, (1.0 + gated) * f / t, b * s, linears_hw))
        if hw_get(hw, "tp_comm_overlap") != 0.0 and seq_par_on and t > 1.0:
            # TE userbuffers (--tp-comm-overlap): each all-gather / reduce-scatter (half the exchange)
            # pipelined with the GEMM that consumes or produces it, hidden up to that GEMM's length:
            # forward AG->QKV, proj->RS, AG->FC1, FC2->RS; backward AG->dgrad of proj and of FC2
            tokens = b * s
            layer_tp -= min(allreduce_act / 2.0, column_parallel(False, linears_hw))
            for n_out, k_in in ((h, cw / t), ((1.0 + gated) * f / t, h), (h, f / t), (cw / t, h), (f / t, h)):
                layer_tp -= min(allreduce_act / 2.0, linear_gemm_s(tokens, n_out, k_in, linears_hw))
        return layer_tp

    layer_tp = exposed_layer_tp(hw)
    # a layer kept in bf16 under FP8 (num_layers_at_start/end_in_bf16): its linears in bf16
    hw16 = list(hw)
    hw16[HW_FIELDS.index("precision")] = 0.0
    layer16_compute = (layer_forward_s(b, s, h, a, g, f, t, hw16, arch) + cp_fwd) * (1.0 + rc) \
        + layer_backward_s(b, s, h, a, g, f, t, hw16, arch) + cp_bwd + core_again
    layer16_tp = exposed_layer_tp(hw16)
    # an MoE layer (issue 13): its MLP beyond a dense one's, its token exchange, and the attention's
    # TP exchange only (no dense MLP: its exchange and what its linears hid are not there)
    moe_on = fl["num_experts"] >= 1
    moe_compute = moe_tp = moe_ep = moe_stored = 0.0
    if moe_on:
        moe_fwd, moe_bwd, moe_stored = moe_layer(b, s, h, f, t, hw, fl)
        moe_compute = (1.0 + rc) * moe_fwd + moe_bwd
        ep_f, ep_b = ep_exchange(b, s, h, t, hw, fl)
        moe_ep = (1.0 + rc) * ep_f + ep_b
        if _ep_overlap(hw):
            # combined 1F1B: paired micro-batches hide each MoE layer's exchanges behind the other's
            # forward + backward of that layer; unpaired: one micro-batch at p = 1, the first stage's
            # interleaved warm-up ((p - 1) 2 + (vpp - 1) p chunks) at p > 1
            unpaired = 1.0 if p == 1 else ((p - 1.0) * 2.0 + (chunks - 1.0) * p) / chunks
            share = min(1.0, unpaired / m)
            moe_ep = share * moe_ep + (1.0 - share) * max(0.0, moe_ep - (layer_compute + moe_compute))

        def attention_tp(linears_hw):
            """An MoE layer's exposed TP exchange: the attention's only, its GEMMs on linears_hw."""
            x = (2.0 + rc) * allreduce_act
            if (hw_get(hw, "async_tensor_model_parallel_allreduce") != 0.0 or seq_par_on) and t > 1.0:
                hideable = allreduce_act / 2.0 if seq_par_on else allreduce_act
                x -= min(hideable, column_parallel(True, linears_hw))
            if hw_get(hw, "tp_comm_overlap") != 0.0 and seq_par_on and t > 1.0:
                x -= min(allreduce_act / 2.0, column_parallel(False, linears_hw))
                for n_out, k_in in ((h, cw / t), (cw / t, h)):
                    x -= min(allreduce_act / 2.0, linear_gemm_s(b * s, n_out, k_in, linears_hw))
            return x

        attn_tp = attention_tp(hw)
        moe_tp = attn_tp - layer_tp
        # where every layer is an MoE layer, a bf16 layer (under FP8) runs its experts and the
        # attention's hidden exchange in bf16 as well
        if fl["moe_layer_step"] == 1 and fl["moe_first_dense_layers"] == 0:
            moe16_fwd, moe16_bwd, _ = moe_layer(b, s, h, f, t, hw16, fl)
            layer16_compute += (1.0 + rc) * moe16_fwd + moe16_bwd - moe_compute
            layer16_tp = layer_tp + attention_tp(hw16) - attn_tp
        ep_size, etp_size = expert_sizes(t, hw)
        moe_dense_params, moe_expert_params = moe_layer_params(h, a, g, f, t, ep_size, etp_size, arch)
        edg = t * cp * d / (etp_size * ep_size)      # expert data parallelism: a stage's ranks over etp x ep
    emb_compute = embedding_s(b, s, h, v, t, hw, arch)
    emb_tp = allreduce_act                                  # vocab-parallel embedding output
    head_compute = head_s(b, s, h, v, t, hw)
    head_tp = allreduce_act + 3.0 * allreduce_ce            # LM head dX + CE max / sum / target

    # --- pipeline send/recv per micro-batch: activation forward + gradient backward; each
    # TP rank sends 1/t of the activation, then an NVLink all-gather rebuilds it.
    pp_per_mb = 0.0
    if p_stages > 1:
        crosses_node = t * cp * d * p > hw_get(hw, "gpus_per_node")
        send = p2p_s(eb * sbh / t, crosses_node, hw)
        gather = intra_allgather_s(eb * sbh, t, hw)
        if hw_get(hw, "sequence_parallel") != 0.0:
            gather = 0.0                           # the activation stays split over the TP ranks
        pp_per_mb = chunks * 2.0 * (send + gather)  # every model chunk sends and receives
        if chunks > 1 and hw_get(hw, "overlap_p2p_comm") != 0.0:
            # interleaved schedule with overlap_p2p_comm: each send / receive under the next chunk's
            # forward (activations) or backward (gradients), a chunk of the shortest stage
            chunk_fwd = fewest / chunks * fwd
            chunk_bwd = fewest / chunks * (bwd + rc * fwd + core_again)
            pp_per_mb = chunks * (max(0.0, send + gather - chunk_fwd) + max(0.0, send + gather - chunk_bwd))

    # --- ZeRO stage: 1 shards the Adam states (the distributed optimizer is stage 1), 2 also the
    # gradients, 3 also the weights (ZeRO paper, Figure 1)
    zero = max(hw_get(hw, "zero_stage"), hw_get(hw, "distributed_optimizer"))
    # ZeRO shards within groups of dp_shard ranks (hybrid sharding), else over all dg
    shard = float(int(hw_get(hw, "dp_shard")) or dg) if zero >= 1 else float(dg)
    layer_on_rank = layer_params_per_rank(h, a, g, f, t, arch)
    tied = not fl["untie_embeddings_and_output_weights"]
    embedding_params = v * h / t + position_params(s_full, h, arch)     # the position table spans the sequence
    head_params = v * h / t + _norm(h, arch)
    backward_window = fewest * (bwd + rc * fwd + core_again)   # the shortest stage's backward

    def stage_params(i):
        first, last = i == 0, i == p_stages - 1
        params = stage_layers[i] * layer_on_rank
        if moe_on:
            params += moe_layers[i] * (moe_dense_params - layer_on_rank)
        if first:
            params += embedding_params             # word embedding shard + learned positions
        if last:
            params += head_params                  # LM head shard (own copy when tied) + final norm
        if first and last and tied:
            params -= v * h / t                    # one stage: the head is the word embedding
        return params

    gb = grad_elem_bytes(hw)       # gradients kept and reduced in gb bytes, weights gathered in eb

    def all_gather(n_params, nbytes=None, ranks=None, stride=None):
        """One all-gather (or one reduce-scatter: the same ring) of n_params elements."""
        return group_reduce_scatter_allgather_s((eb if nbytes is None else nbytes) * n_params,
                                                shard if ranks is None else ranks,
                                                t if stride is None else stride, hw) / 2.0

    # the largest stage's exchange (one stage holds everything at p = 1): an all-reduce of the
    # gradients, or (ZeRO) a reduce-scatter of the gradients and an all-gather of the weights
    biggest = max(stage_params(i) for i in range(p_stages))
    if zero >= 1:
        stage_gather = all_gather(biggest)
        stage_exchange = all_gather(biggest, gb) + stage_gather
    else:
        stage_gather = 0.0
        stage_exchange = group_allreduce_s(gb * biggest, shard, t, hw)
    expert_params = [moe_layers[i] * moe_expert_params if moe_on else 0.0 for i in range(p_stages)]
    if moe_on and edg > 1:
        # the experts' gradients: over the expert-data-parallel ranks (etp ep apart), after the dense ones
        most = max(expert_params)
        if zero >= 1:
            e_gather = all_gather(most, eb, edg, etp_size * ep_size)
            stage_exchange += all_gather(most, gb, edg, etp_size * ep_size) + e_gather
            stage_gather += e_gather
        else:
            stage_exchange += group_allreduce_s(gb * most, edg, etp_size * ep_size, hw)

    # --- every stage: time per micro-batch, parameters, activations
    stages = []
    for i in range(p_stages):
        first, last = i == 0, i == p_stages - 1
        n16 = bf16_layers[i]            # of the stage's layers, those in bf16 (FP8 only)
        nm = moe_layers[i]              # of the stage's layers, the MoE ones
        compute = (stage_layers[i] * layer_compute + n16 * (layer16_compute - layer_compute)
                   + (emb_compute if first else 0.0) + (head_compute if last else 0.0)) + nm * moe_compute
        tp = (stage_layers[i] * layer_tp + n16 * (layer16_tp - layer_tp) + (emb_tp if first else 0.0)
              + (head_tp if last else 0.0)) + nm * moe_tp
        pp = pp_per_mb
        params = stage_params(i)
        n = stage_layers[i]
        # ZeRO-2: every micro-batch reduce-scatters the (larger stage's) gradients, under its
        # backward with overlap_grad_reduce; ZeRO-3: every layer gathers its weights before the
        # forward and the backward and reduce-scatters its gradients; the next layer's exchange is
        # prefetched under this layer's compute; the first gather of a pass waits; the embedding
        # hides nothing, the head hides behind its own compute
        dp = 0.0
        if zero >= 3:
            gather, scatter = all_gather(layer_on_rank), all_gather(layer_on_rank, gb)
            # (first gathers of forward and backward, last reduce-scatter: three exchanges wait)
            dp = 2.0 * gather + scatter + n * (max(0.0, gather - fwd)
                                               + max(0.0, gather + scatter - (bwd + rc * fwd + core_again)))
            if first:
                dp += 2.0 * all_gather(embedding_params) + all_gather(embedding_params, gb)
            if last:
                dp += max(0.0, 2.0 * all_gather(head_params) + all_gather(head_params, gb) - head_compute)
        off = 0.0
        if zero >= 3 and param_offload(hw, shard):
            # FSDP2 CPU offload: the fp32 shard (4 bytes) up before each gather (forward, backward),
            # the gradient shard down after the reduce-scatter, chained with the exchanges; the
            # exposure beyond what the exchanges alone expose
            link = hw_get(hw, "host_link_Bps")
            up = 4.0 * layer_on_rank / shard / link
            gather, scatter = all_gather(layer_on_rank), all_gather(layer_on_rank, gb)
            back = bwd + rc * fwd + core_again
            with_copies = (2.0 * gather + scatter + 3.0 * up
                           + n * (max(0.0, gather + up - fwd) + max(0.0, gather + scatter + 2.0 * up - back)))
            off = with_copies - (2.0 * gather + scatter + n * (max(0.0, gather - fwd) + max(0.0, gather + scatter - back)))
            if first:
                off += 3.0 * 4.0 * embedding_params / shard / link
            if last:
                head_gather, head_up = all_gather(head_params), 4.0 * head_params / shard / link
                head_scatter = all_gather(head_params, gb)
                off += (max(0.0, 2.0 * head_gather + head_scatter + 3.0 * head_up - head_compute)
                        - max(0.0, 2.0 * head_gather + head_scatter - head_compute))
        if 2 <= zero < 3:
            reduce_scatter = stage_exchange - stage_gather
            dp = reduce_scatter - hw_get(hw, "overlap_grad_reduce") * min(reduce_scatter, backward_window)
        seq_par = hw_get(hw, "sequence_parallel") != 0.0
        flash = _flash_on(hw)
        if chunks == 1:
            in_flight = min(p - i, m)              # 1F1B: stage i holds min(p - i, m) micro-batches
            act = stage_activation_bytes(n, in_flight, b, s, h, a, g, f, t, recompute, flash,
                                         seq_par, gated, _fp8(hw), _mxfp8(hw), qw, cw, latent, eb)
            chunks_in_flight = in_flight
        else:
            # interleaved: device i runs 2(p - i - 1) + (vpp - 1) p warm-up chunk forwards, then
            # holds one more; a chunk is the stage's layers / vpp of one micro-batch
            held = min(m * chunks, 2.0 * (p - i - 1) + (chunks - 1) * p + 1.0)
            in_flight = held / chunks              # in micro-batches' worth of the whole stage
            act = stage_activation_bytes(n / chunks, held, b, s, h, a, g, f, t, recompute,
                                         flash, seq_par, gated, _fp8(hw), _mxfp8(hw), qw, cw, latent, eb)
            chunks_in_flight = in_flight       # a device's bf16 layers: in one chunk, counted so
        if n16 > 0:
            # bf16 layers save their linears' inputs in bf16 (the FP8 saving they lack); with full
            # recomputation only the one rebuilt layer holds them
            lacks = fp8_saved_bytes_fewer(b, s, h, f, t, flash, seq_par, _mxfp8(hw), cw, latent)
            act += lacks if recompute == 1 else chunks_in_flight * n16 * lacks
        if nm > 0:
            # MoE layers store their routed rows' tensors instead of a dense MLP's; with full
            # recomputation one rebuilt layer holds them
            act += moe_stored if recompute == 1 else chunks_in_flight * nm * moe_stored
        sbh_rank = sbh / _seq_split(t, hw)         # outside the TP regions
        ce = eb / 2.0                              # (these terms written for 2-byte elements)
        if first:
            act += ce * in_flight * sbh_rank       # embedding output per in-flight micro-batch
        if last:
            act += ce * 2.0 * sbh_rank + (eb + 4.0) * s * b * v / t  # final LN in/out + logits + fp32 softmax
        # fp16 weight 2, gradient 2 (4: fp32 main gradients), fp32 master + Adam m, v 12 bytes per
        # parameter, over d ranks from stage 3, 2 and 1 on; ZeRO-3 also holds two layers gathered
        # (weight + gradient)
        weight = eb / (shard if zero >= 3 else 1.0)
        grad = gb / (shard if zero >= 2 else 1.0)
        adam = adam_state_bytes(hw) / (shard if zero >= 1 else 1.0)
        states = params * (weight + grad + adam)
        offloaded = zero >= 3 and param_offload(hw, shard)     # the states live in host memory
        if offloaded:
            states = 0.0
        if moe_on and not offloaded:
            # the local experts' states, sharded (ZeRO) over the expert-data-parallel ranks
            eshard = edg
            states += expert_params[i] * (eb / (eshard if zero >= 3 else 1.0) + gb / (eshard if zero >= 2 else 1.0)
                                          + adam_state_bytes(hw) / (eshard if zero >= 1 else 1.0))
        if zero >= 3 and shard > 1:
            states += 2.0 * layer_on_rank * (eb + gb)
        if _fp8(hw):
            # TE's cached FP8 weight and FP8 transpose: 2 bytes per linear weight of the stage's layers;
            # cast once per iteration (read 2, write 1 + 1; one kernel per linear), spread over m.
            # ZeRO-3 gathers the weights per use: FP8 copies of the two gathered layers only, and a
            # cast at every gather (forward and backward) of every layer
            # (per recipe: tensorwise adds the weight's amax pass; MXFP8 both copies' 1/32-byte scales)
            per_element, kernels = quantize_bytes_and_kernels(hw)
            n_linears = 3.0 + (len(mla_linears(1.0, h, a, t, 1.0, arch)) if _mla(arch) else 1.0)
            cast = memory_bound_time_s(per_element * linear_weights(h, a, g, f, t, gated, qw, arch),
                                       n_linears * kernels, hw)
            regather = zero >= 3 and shard > 1
            copies = 2.0 + (2.0 / 32.0 if _mxfp8(hw) else 0.0)
            states += copies * (2.0 if regather else n - n16) * linear_weights(h, a, g, f, t, gated, qw, arch)
            compute += (n - n16) * (2.0 * cast if regather else cast / m)
        # from the second micro-batch on, autograd adds each weight gradient into .grad (into
        # this rank's 1/d shard when the gradients are sharded): read both, write one fp16 value
        # per parameter of the stage (averaged per micro-batch); the same bytes with fp32 main
        # gradients (accumulated inside the weight-gradient GEMM, gradient_accumulation_fusion)
        compute += ((m - 1.0) / m * 3.0 * eb * (params + expert_params[i])
                    / (hw_get(hw, "hbm_Bps") * hw_get(hw, "hbm_efficiency")) / (shard if zero >= 2 else 1.0))
        cpx = n * layer_cp
        epx = nm * moe_ep
        if k_off > 0:
            # activation offloading (pp = 1, no recomputation): layers 0 .. k - 1 keep their saved
            # activations in host memory; the copies each way at host_link_Bps, simulated
            start, end = hw_get(hw, "num_layers_at_start_in_bf16"), hw_get(hw, "num_layers_at_end_in_bf16")
            one = stage_activation_bytes(1.0, 1.0, b, s, h, a, g, f, t, 0, flash, seq_par, gated, _fp8(hw),
                                         _mxfp8(hw), qw, cw, latent, eb)
            moved = k_off * one
            for j in range(k_off):
                if _fp8(hw) and (j < start or j >= L - end):
                    moved += fp8_saved_bytes_fewer(b, s, h, f, t, flash, seq_par, _mxfp8(hw), cw, latent)
                if moe_on and is_moe_layer(j, fl):
                    moved += moe_stored
            act -= moved
            copy = moved / k_off / hw_get(hw, "host_link_Bps")
            off += offload_stall_forward(k_off, n, copy, fwd) + offload_stall_backward(k_off, n, copy, bwd)
        stages.append(dict(compute=compute, tp=tp, pp=pp, dp=dp, cp=cpx, ep=epx, off=off,
                           time=compute + tp + pp + dp + cpx + epx + off,
                           params=params, states=states, act=act, mem=states + act))

    # slowest stage (ties: the later stage); fullest stage (ties: the earlier stage)
    slow = max(range(p_stages), key=lambda i: (stages[i]["time"], i))
    full = max(range(p_stages), key=lambda i: (stages[i]["mem"], -i))
    t_slow = stages[slow]["time"]
    # warm-up + cool-down: (p - 1) stage times, or (p - 1) chunk times when interleaved
    bubble = (sum(st["time"] for st in stages) - t_slow) / chunks
    compute_s = m * stages[slow]["compute"]
    tp_comm_s = m * stages[slow]["tp"]
    pp_comm_s = m * stages[slow]["pp"]
    dp_comm_s = stage_exchange
    per_micro_batch_dp = m * stages[slow]["dp"]
    # optional bucketed overlap with the last micro-batch's backward (+ recompute) of a stage
    if zero >= 3:
        dp_comm_s = per_micro_batch_dp             # every exchange happened per layer
    elif zero >= 2:
        # the reduce-scatters ran per micro-batch; the parameter all-gather follows the step
        all_gather_half = stage_gather
        if hw_get(hw, "overlap_grad_reduce") != 0.0:
            all_gather_half -= hw_get(hw, "overlap_param_gather") * min(all_gather_half, fewest * fwd)
        dp_comm_s = per_micro_batch_dp + all_gather_half
    elif zero >= 1:
        # distributed optimizer: the reduce-scatter half under the backward, the parameter
        # all-gather half after the step, or under the next first forward with
        # overlap_param_gather (which Megatron-LM allows only with overlap_grad_reduce)
        all_gather = stage_gather
        reduce_scatter = dp_comm_s - stage_gather
        reduce_scatter -= hw_get(hw, "overlap_grad_reduce") * min(reduce_scatter, backward_window)
        if hw_get(hw, "overlap_grad_reduce") != 0.0:
            all_gather -= hw_get(hw, "overlap_param_gather") * min(all_gather, fewest * fwd)
        dp_comm_s = reduce_scatter + all_gather
    else:
        dp_comm_s -= hw_get(hw, "overlap_grad_reduce") * min(dp_comm_s, backward_window)
    if tied and p_stages > 1:
        # the first and the last stage each hold the shared word embedding and all-reduce its
        # gradient after the backward (2 ranks, (p - 1) pipeline strides apart), exposed
        dp_comm_s += group_allreduce_s(gb * v * h / t, 2, (p - 1) * t * cp * d, hw)
    if shard < dg:
        # hybrid sharding: the dg / shard replicas of each shard group all-reduce its gradient shard
        # (the largest stage's), under the last backward with overlapped reduction (FSDP always)
        replica = group_allreduce_s(gb * max(st["params"] for st in stages) / shard, dg / shard,
                                    t * shard, hw)
        hides = zero >= 3 or hw_get(hw, "overlap_grad_reduce") != 0.0
        dp_comm_s += replica - (1.0 if hides else 0.0) * min(replica, backward_window)
    adam_s = optimizer_step_s(max(st["params"] for st in stages) / (shard if zero >= 1 else 1.0)
                         + (max(expert_params) / (edg if zero >= 1 else 1.0) if moe_on else 0.0), hw, shard)
    overhead_s = hw_get(hw, "iteration_overhead_s")      # fixed host time per iteration
    cp_comm_s = m * stages[slow]["cp"]
    ep_comm_s = m * stages[slow]["ep"]
    offload_s = m * stages[slow]["off"]
    iteration = (compute_s + tp_comm_s + pp_comm_s + bubble + dp_comm_s + adam_s + overhead_s + cp_comm_s + ep_comm_s
                 + offload_s)

    states, act = stages[full]["states"], stages[full]["act"]
    mem_total = states + act + hw_get(hw, "reserved_bytes")
    if mem_total > hw_get(hw, "hbm_bytes"):
        status = OUT_OF_MEMORY

    s = s_full                    # model FLOPs, parameters and tokens: whole sequences
    n_params = model_params(L, h, a, g, f, v, s, arch)
    tokens_per_iter = B * s
    fwd_flops = forward_flops_per_token(L, h, a, g, f, v, s, gated, qw, arch)
    if moe_on:
        # every expert's parameters; FLOPs of the active ones (2 per weight: top-k experts, router, shared)
        dense_part, experts = moe_layer_params(h, a, g, f, 1.0, 1.0, 1.0, arch)
        n_params += n_moe_total * (dense_part + experts - layer_params(h, a, g, f, arch))
        fe, fs = fl["moe_ffn_hidden_size"] or f, fl["moe_shared_expert_intermediate_size"]
        fwd_flops += n_moe_total * (2.0 * fl["num_experts"] * h
                                    + 2.0 * (2.0 + gated) * h * (fl["moe_router_topk"] * fe + fs - f))
    model_flops = 3.0 * tokens_per_iter * fwd_flops
    # recomputation repeats every layer's forward, not the LM head
    hardware_flops = model_flops + rc * tokens_per_iter * (fwd_flops - 2.0 * h * v)
    if selective:                                 # scores and context forward again: 4 s h per token per layer
        hardware_flops += tokens_per_iter * L * 4.0 * s * h
    peak = hw_get(hw, "peak_flops")
    steps = math.ceil(num_tokens / tokens_per_iter)
    if _precision(hw) == "fp16":
        # dynamic loss scaling skips the overflowing steps: 17 at the start (2^32 down to 2^16 with
        # hysteresis 2), then 2 per 1,000 clean steps (assumptions restated from model.pipeline)
        steps += 17 + math.ceil(2.0 * (num_tokens / tokens_per_iter) / 1000.0)
    train_s = steps * iteration
    gpu_hours = num_gpus * train_s / 3600.0
    out = {
        "iteration_time_s": iteration,
        "tokens_per_s": tokens_per_iter / iteration,
        "model_tflops_per_gpu": model_flops / iteration / num_gpus / 1e12,
        "mfu": model_flops / iteration / (num_gpus * peak),
        "hfu": hardware_flops / iteration / (num_gpus * peak),
        "memory_per_gpu_GiB": mem_total / GiB,
        "model_states_GiB": states / GiB,
        "activations_GiB": act / GiB,
        "compute_s": compute_s,
        "tp_comm_s": tp_comm_s,
        "pp_comm_s": pp_comm_s,
        "dp_comm_s": dp_comm_s,
        "bubble_s": bubble,
        "optimizer_s": adam_s,
        "overhead_s": overhead_s,
        "num_parameters": n_params,
        "num_micro_batches": m,
        "num_steps": float(steps),
        "train_days": train_s / SECONDS_PER_DAY,
        "gpu_hours": gpu_hours,
        "cost_usd": gpu_hours * hw_get(hw, "usd_per_gpu_hour"),
        "energy_kWh": gpu_hours * hw_get(hw, "tdp_W") / 1000.0 * hw_get(hw, "pue"),
        "loss": chinchilla_loss(n_params, num_tokens),
        "cp_comm_s": cp_comm_s,
        "ep_comm_s": ep_comm_s,
        "offload_s": offload_s,
    }
    return status, out


# ---------------------------------------------------------------------------------------------
# sweep.py: flat index -> grid point
# ---------------------------------------------------------------------------------------------
def decode(index: int, radices) -> list:
    """Mixed-radix digits of ``index``, last axis fastest."""
    digits = []
    for r in reversed([int(x) for x in radices]):
        digits.append(index % r)
        index //= r
    return digits[::-1]


def sweep_point(index: int, grid):
    """Grid point ``index`` of a :class:`vtrain_fast.plan.grid.Grid`, evaluated.

    Returns
    -------
    inputs : dict
        Keyed by :data:`INPUT_NAMES`.
    num_tokens : float
    status : int
    outputs : dict
        Keyed by :data:`OUTPUT_NAMES`.
    """
    digit = dict(zip(AXES, decode(index, grid.radices)))
    model = [int(x) for x in grid.models[digit["model"]]]
    gpu_row = int(grid.gpus[digit["gpu"]])
    hw = [float(x) for x in grid.hw_table[gpu_row]]
    gpus_per_node = int(hw_get(hw, "gpus_per_node"))
    size = int(grid.sizes[digit["cluster_size"]])
    num_gpus = size * gpus_per_node if grid.sizes_in_nodes else size
    t, p = int(grid.tps[digit["tp"]]), int(grid.pps[digit["pp"]])
    cp = int(grid.cps[digit["cp"]])
    d = num_gpus // (t * cp * p)
    inputs = dict(zip(INPUT_NAMES, [digit["model"], gpu_row, *model, num_gpus,
                                    math.ceil(num_gpus / gpus_per_node), t, cp, p, d,
                                    int(grid.mbss[digit["micro_batch_size"]]),
                                    int(grid.gbss[digit["global_batch_size"]]),
                                    int(grid.recomputes[digit["recompute"]])]))
    num_tokens = float(grid.tokens[digit["num_tokens"]])
    if num_gpus % (t * cp * p) != 0 or d <= 0:
        return inputs, num_tokens, BAD_NUM_GPUS, nan_outputs()
    L, h, a, g, f, v, s = model[:7]
    status, out = step(L, h, a, g, f, v, s, inputs["global_batch_size"], inputs["micro_batch_size"],
                       t, p, d, inputs["recompute"], num_tokens, hw, ModelFlags(*map(float, model[7:])), cp)
    return inputs, num_tokens, status, out
