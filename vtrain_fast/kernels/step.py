"""One configuration: compose operator, communication and memory formulas into an iteration.

Schedule: Megatron-LM's non-interleaved 1F1B (Narayanan et al. 2021, "Efficient Large-Scale
Language Model Training on GPU Clusters", Sec. 2.2). With ``m`` micro-batches and per-stage
times ``T_i`` (forward + backward of one micro-batch, including its TP and pipeline
communication), the pipeline flushes after ``(m - 1) * max_i T_i + sum_i T_i``; for equal stages
this is the paper's ``(m + p - 1) * T`` with bubble ``(p - 1) * T``. At ``pp = 1`` it reduces to
gradient accumulation, ``m * T``. The data-parallel gradient all-reduce and the Adam step follow
the flush (no overlap, as in Megatron-LM's local DDP). The first stage carries the embeddings,
the last the final layer norm, LM head and cross-entropy.
"""
from __future__ import annotations

import math

from .._jit import jit
from . import comm, memory, ops
from .params import H_ITER_OVERHEAD_S, H_GPUS_PER_NODE, H_HBM_BYTES, H_PEAK_FLOPS, H_PUE, H_RESERVED_BYTES, H_TDP_W, H_USD_PER_GPU_HOUR

# Output layout: row k of the float64 output matrix. vtrain_fast.schema describes each column.
OUTPUT_NAMES = (
    "iteration_time_s", "tokens_per_s", "model_tflops_per_gpu", "mfu", "hfu",
    "memory_per_gpu_GiB", "model_states_GiB", "activations_GiB",
    "compute_s", "tp_comm_s", "pp_comm_s", "dp_comm_s", "bubble_s", "optimizer_s", "overhead_s",
    "num_parameters", "num_micro_batches", "num_steps",
    "train_days", "gpu_hours", "cost_usd", "energy_kWh", "loss",
)
NUM_OUTPUTS = len(OUTPUT_NAMES)
(O_ITER, O_TOKENS_PER_S, O_TFLOPS, O_MFU, O_HFU, O_MEM, O_STATES, O_ACT, O_COMPUTE, O_TP, O_PP,
 O_DP, O_BUBBLE, O_OPT, O_OVERHEAD, O_PARAMS, O_MICRO, O_STEPS, O_DAYS, O_GPU_HOURS, O_COST, O_ENERGY,
 O_LOSS) = range(NUM_OUTPUTS)

# Status codes, one per row. vtrain_fast.schema.STATUS_LABELS names them.
OK = 0
BAD_INPUT = 1        # a size is zero or negative
BAD_NUM_GPUS = 2     # num_gpus not divisible by tp * pp
BAD_HEADS = 3        # heads or query groups not divisible by tp, or hidden by heads
BAD_LAYERS = 4       # num_layers not divisible by pp
BAD_BATCH = 5        # global_batch_size not divisible by dp * micro_batch_size
OUT_OF_MEMORY = 6    # the configuration does not fit in HBM (times are still computed)
NUM_STATUS = 7

GiB = 1024.0 ** 3
SECONDS_PER_DAY = 86400.0
# Chinchilla parametric loss L(N, D) = E + A / N^alpha + B / D^beta
# (Hoffmann et al. 2022, "Training Compute-Optimal Large Language Models", Eq. 10, Approach 3).
CHINCHILLA_E, CHINCHILLA_A, CHINCHILLA_B = 1.69, 406.4, 410.7
CHINCHILLA_ALPHA, CHINCHILLA_BETA = 0.34, 0.28


@jit
def chinchilla_loss(num_parameters, num_tokens):
    """Chinchilla's fitted loss ``E + A/N^alpha + B/D^beta`` (nats per token) for ``N``
    parameters trained on ``D`` tokens (Hoffmann et al. 2022, Eq. 10)."""
    return (CHINCHILLA_E + CHINCHILLA_A / num_parameters ** CHINCHILLA_ALPHA
            + CHINCHILLA_B / num_tokens ** CHINCHILLA_BETA)


@jit
def forward_flops_per_token(num_layers, h, a, g, f, v, s):
    """Model forward FLOPs per token: GEMMs of every layer (QKV, attention scores and context
    over the full ``s x s`` as Megatron-LM counts them, output projection, MLP) and the LM head.
    Training model FLOPs are 3x this (PaLM, Chowdhery et al. 2022, Appendix B)."""
    per_layer = 2.0 * h * (h + 2.0 * h * g / a) + 2.0 * h * h + 4.0 * h * f + 4.0 * s * h
    return num_layers * per_layer + 2.0 * h * v


@jit
def validate_shape(L, h, a, g, f, v, s, B, b, t, p, d):
    """Status code for the divisibility rules of Megatron-LM (``OK`` when all hold)."""
    if (L <= 0 or h <= 0 or a <= 0 or g <= 0 or f <= 0 or v <= 0 or s <= 0 or B <= 0 or b <= 0
            or t <= 0 or p <= 0 or d <= 0):
        return BAD_INPUT
    if a % t != 0 or g % t != 0 or h % a != 0 or a % g != 0:
        return BAD_HEADS
    if L % p != 0:
        return BAD_LAYERS
    if B % (d * b) != 0:
        return BAD_BATCH
    return OK


@jit
def fill_nan(out, i):
    """Set every output of row ``i`` to NaN (infeasible shape)."""
    for k in range(NUM_OUTPUTS):
        out[k, i] = math.nan


@jit
def step(L, h, a, g, f, v, s, B, b, t, p, d, recompute, num_tokens, hw, out, i):
    """Evaluate one configuration and write its outputs into column ``i`` of ``out``.

    Parameters
    ----------
    L, h, a, g, f, v, s : int
        num_layers, hidden_size, num_attention_heads, num_query_groups, ffn_hidden_size,
        vocab_size, seq_length.
    B, b : int
        global_batch_size, micro_batch_size (sequences).
    t, p, d : int
        Tensor-, pipeline- and data-parallel sizes; ``num_gpus = t * p * d``.
    recompute : int
        0 = no activation recomputation, 1 = full recomputation of every layer.
    num_tokens : float
        Tokens to train on.
    hw : numpy.ndarray
        Machine vector, ``float64``, shape ``(NUM_HW_FIELDS,)``.
    out : numpy.ndarray
        ``float64``, shape ``(NUM_OUTPUTS, n)``; column ``i`` is written, laid out as
        :data:`OUTPUT_NAMES`.
    i : int
        Column to write.

    Returns
    -------
    int
        Status code (``OK``, ``OUT_OF_MEMORY`` or a shape error). Never raises; rows with a
        shape error are NaN.
    """
    status = validate_shape(L, h, a, g, f, v, s, B, b, t, p, d)
    if status != OK:
        fill_nan(out, i)
        return status
    L = float(L); h = float(h); a = float(a); g = float(g); f = float(f); v = float(v)
    s = float(s); B = float(B); b = float(b); t = float(t); p = float(p); d = float(d)
    m = B / (d * b)
    Lp = L / p
    rc = 1.0 if recompute != 0 else 0.0
    num_gpus = t * p * d

    # ---- per micro-batch compute and TP communication, per stage type
    fwd = ops.layer_forward_s(b, s, h, a, g, f, t, hw)
    bwd = ops.layer_backward_s(b, s, h, a, g, f, t, hw)
    ar_act = comm.group_allreduce_s(2.0 * b * s * h, t, 1.0, hw)
    ar_ce = comm.group_allreduce_s(4.0 * b * s, t, 1.0, hw)
    body_compute = Lp * (fwd + bwd + rc * fwd)
    body_tp = Lp * (4.0 + 2.0 * rc) * ar_act
    emb_compute = ops.embedding_s(b, s, h, v, t, hw)
    emb_tp = ar_act
    head_compute = ops.head_s(b, s, h, v, t, hw)
    head_tp = ar_act + 3.0 * ar_ce

    # ---- pipeline point-to-point per micro-batch (activation forward, gradient backward);
    # scatter-gather: each TP rank sends 1/t, then an intra-node all-gather (Megatron-LM).
    pp_mb = 0.0
    if p > 1.0:
        crosses = t * d * p > hw[H_GPUS_PER_NODE]
        send = comm.p2p_s(2.0 * b * s * h / t, crosses, hw)
        gather = comm.intra_allgather_s(2.0 * b * s * h, t, hw)
        pp_mb = 2.0 * (send + gather)

    # ---- parameters per GPU, per stage type
    p_body = Lp * memory.layer_params_per_rank(h, a, g, f, t)
    p_first = p_body + v * h / t + s * h
    p_last = p_body + v * h / t + 2.0 * h
    if p == 1.0:
        p_first = p_body + 2.0 * v * h / t + s * h + 2.0 * h
        p_last = p_first

    # ---- schedule
    if p == 1.0:
        c_slow = body_compute + emb_compute + head_compute
        tp_slow = body_tp + emb_tp + head_tp
        pp_slow = 0.0
        bubble = 0.0
    else:
        t_first = body_compute + emb_compute + body_tp + emb_tp + pp_mb
        t_last = body_compute + head_compute + body_tp + head_tp + pp_mb
        t_mid = body_compute + body_tp + pp_mb
        total = t_first + t_last + (p - 2.0) * t_mid
        if t_last >= t_first:
            c_slow = body_compute + head_compute
            tp_slow = body_tp + head_tp
            t_slow = t_last
        else:
            c_slow = body_compute + emb_compute
            tp_slow = body_tp + emb_tp
            t_slow = t_first
        pp_slow = pp_mb
        bubble = total - t_slow
    compute_s = m * c_slow
    tp_comm_s = m * tp_slow
    pp_comm_s = m * pp_slow
    params_max = max(p_first, p_last)
    dp_comm_s = max(comm.group_allreduce_s(2.0 * p_first, d, t, hw),
                    comm.group_allreduce_s(2.0 * p_last, d, t, hw))
    optimizer_time_s = ops.optimizer_s(params_max, hw)
    overhead_s = hw[H_ITER_OVERHEAD_S]
    iteration = compute_s + tp_comm_s + pp_comm_s + bubble + dp_comm_s + optimizer_time_s + overhead_s

    # ---- memory per GPU (the fuller of first and last stage)
    if p == 1.0:
        act_first = (memory.stage_activation_bytes(L, 1.0, b, s, h, a, g, f, t, rc)
                     + s * b * h * 3.0 + s * b * v / t * 6.0)
        act_last = act_first
    else:
        act_first = (memory.stage_activation_bytes(Lp, min(p, m), b, s, h, a, g, f, t, rc)
                     + min(p, m) * s * b * h)
        act_last = (memory.stage_activation_bytes(Lp, 1.0, b, s, h, a, g, f, t, rc)
                    + 2.0 * s * b * h + s * b * v / t * 6.0)
    mem_first = memory.STATE_BYTES_PER_PARAM * p_first + act_first
    mem_last = memory.STATE_BYTES_PER_PARAM * p_last + act_last
    if mem_first >= mem_last:
        states, act = memory.STATE_BYTES_PER_PARAM * p_first, act_first
    else:
        states, act = memory.STATE_BYTES_PER_PARAM * p_last, act_last
    mem_total = states + act + hw[H_RESERVED_BYTES]
    if mem_total > hw[H_HBM_BYTES]:
        status = OUT_OF_MEMORY

    # ---- throughput, utilisation, totals
    n_params = memory.model_params(L, h, a, g, f, v, s)
    tokens_iter = B * s
    fwd_flops = forward_flops_per_token(L, h, a, g, f, v, s)
    model_flops = 3.0 * tokens_iter * fwd_flops
    hw_flops = model_flops + rc * tokens_iter * (fwd_flops - 2.0 * h * v)
    steps = math.ceil(num_tokens / tokens_iter)
    train_s = steps * iteration
    gpu_hours = num_gpus * train_s / 3600.0

    out[O_ITER, i] = iteration
    out[O_TOKENS_PER_S, i] = tokens_iter / iteration
    out[O_TFLOPS, i] = model_flops / iteration / num_gpus / 1e12
    out[O_MFU, i] = model_flops / iteration / (num_gpus * hw[H_PEAK_FLOPS])
    out[O_HFU, i] = hw_flops / iteration / (num_gpus * hw[H_PEAK_FLOPS])
    out[O_MEM, i] = mem_total / GiB
    out[O_STATES, i] = states / GiB
    out[O_ACT, i] = act / GiB
    out[O_COMPUTE, i] = compute_s
    out[O_TP, i] = tp_comm_s
    out[O_PP, i] = pp_comm_s
    out[O_DP, i] = dp_comm_s
    out[O_BUBBLE, i] = bubble
    out[O_OPT, i] = optimizer_time_s
    out[O_OVERHEAD, i] = overhead_s
    out[O_PARAMS, i] = n_params
    out[O_MICRO, i] = m
    out[O_STEPS, i] = steps
    out[O_DAYS, i] = train_s / SECONDS_PER_DAY
    out[O_GPU_HOURS, i] = gpu_hours
    out[O_COST, i] = gpu_hours * hw[H_USD_PER_GPU_HOUR]
    out[O_ENERGY, i] = gpu_hours * hw[H_TDP_W] / 1000.0 * hw[H_PUE]
    out[O_LOSS, i] = chinchilla_loss(n_params, num_tokens)
    return status
