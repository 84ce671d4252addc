"""One configuration: compose operator, communication and memory formulas into an iteration.

Schedule: Megatron-LM's 1F1B (Narayanan et al. 2021, "Efficient Large-Scale
Language Model Training on GPU Clusters", Sec. 2.2). With ``m`` micro-batches and per-stage
times ``T_i`` (forward + backward of one micro-batch, including its TP and pipeline
communication), the pipeline flushes after ``(m - 1) * max_i T_i + sum_i T_i``; for equal stages
this is the paper's ``(m + p - 1) * T`` with bubble ``(p - 1) * T``. At ``pp = 1`` it reduces to
gradient accumulation, ``m * T``. With ``vpp`` model chunks per device (the interleaved schedule,
Sec. 2.2.2) the bubble shrinks to ``(p - 1) * T / vpp`` while every chunk boundary adds a
pipeline send, and device 0 holds more micro-batch chunks in flight. The data-parallel gradient all-reduce and the Adam step follow
the flush (no overlap, as in Megatron-LM's local DDP); with ``overlap_grad_reduce`` (machine
vector field ``dp_overlap``) the all-reduce hides behind the backward of the last micro-batch
and only the longer part is exposed (Megatron-LM's distributed DDP, ``--overlap-grad-reduce``). The first stage carries the embeddings,
the last the final layer norm, LM head and cross-entropy. From the second micro-batch of a step
on, each stage also adds its new weight gradients into the accumulated ones (PyTorch autograd's
``AccumulateGrad`` into fp16 ``.grad``: 6 bytes per parameter at the achievable HBM rate).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ._jit import jit, jit_inline
from . import comm, memory, ops
from .layout import Layout, cp_stride, dp_cp_size, dp_cp_stride, dp_stride, pp_stride, spans_nodes, world_size  # noqa: F401
from .params import H_REFUSED_CASES, H_REPEAT_CASES, H_HBM_BPS, H_HBM_EFF, H_FLASH_ATTN, H_TP_OVERLAP, H_SEQ_PAR, H_VPP, H_DP_OVERLAP, H_ITER_OVERHEAD_S, H_GPUS_PER_NODE, H_HBM_BYTES, H_PEAK_FLOPS, H_PUE, H_RESERVED_BYTES, H_TDP_W, H_USD_PER_GPU_HOUR
from .params import H_PRECISION, PRECISION_BF16, PRECISION_FP16, hw_index
from .params import H_HOST_LINK_BPS, O_OFFLOAD
from .arch import DEFAULT_ARCH, Arch  # noqa: F401 (Arch: for callers)
from .settings import BY_NAME as SETTING_BY_NAME

H_TP_COMM_OVERLAP = hw_index("tp_comm_overlap")   # 1: TP exchanges overlapped with their GEMMs (TE userbuffers)
H_PARAM_GATHER = hw_index("overlap_param_gather")  # 1: parameter all-gather behind the next forward
H_FIRST_LAYERS = hw_index("first_pipeline_num_layers")   # layers on the first stage (0: even split)
H_LAST_LAYERS = hw_index("last_pipeline_num_layers")     # layers on the last stage (0: even split)
H_EMB_SPLIT = hw_index("account_for_embedding_in_pipeline_split")  # 1: embedding counted as a layer
H_LOSS_SPLIT = hw_index("account_for_loss_in_pipeline_split")      # 1: output layer + loss counted as a layer
H_BF16_START = hw_index("num_layers_at_start_in_bf16")   # FP8: first layers kept in bf16
H_BF16_END = hw_index("num_layers_at_end_in_bf16")       # FP8: last layers kept in bf16
H_P2P_OVERLAP = hw_index("overlap_p2p_comm")             # 1: interleaved 1F1B's sends behind the next chunk
H_EP = hw_index("ep")                                    # MoE: expert-parallel size
H_ETP = hw_index("etp")                                  # MoE: expert-tensor-parallel size (0: tp)
H_DISPATCHER = hw_index("moe_token_dispatcher_type")     # MoE: the token dispatcher (its index among the choices)
DISPATCHER_ALLGATHER = SETTING_BY_NAME["moe_token_dispatcher_type"].encode("allgather")
H_EP_OVERLAP = hw_index("overlap_moe_expert_parallel_comm")   # MoE: 1: all-to-all behind the other micro-batch
H_ACT_OFFLOAD = hw_index("cpu_offloading_num_layers")    # layers whose saved activations live in host memory
# MoE (issue 13, docs/moe.md): the busiest expert's tokens over the mean (the setting
# moe_load_imbalance, 1.0 by default), capped by the capacity factor: moe_busiest_share
H_CAPACITY = hw_index("moe_expert_capacity_factor")     # MoE: 0 dropless, else tokens per expert capped
H_PAD_CAPACITY = hw_index("moe_pad_expert_input_to_capacity")   # MoE: 1: every expert padded to capacity
H_IMBALANCE = hw_index("moe_load_imbalance")             # MoE: the busiest expert's tokens over the mean
# Router memory-bound work per routed token and expert: the fp32 logits read and the fp32
# probabilities written by the softmax and the top-k (4 + 4 bytes), two kernels each way.
MOE_ROUTER_BYTES_PER_LOGIT = 8.0
MOE_ROUTER_KERNELS = 2.0
# Permutation (token -> expert order) and unpermutation: read the tokens, write their k copies
# and back (bf16), one kernel each, each way.
MOE_PERMUTE_KERNELS = 2.0
# The output layout (OUTPUT_NAMES, O_*) and the status codes live in params (no Numba there, so
# that spec, schema and query load without it); re-exported here for the kernels.
from .params import BAD_SEQ_LENGTH, O_CP, O_EP  # noqa: F401 (context parallelism, expert parallelism)
from .params import (BAD_BATCH, BAD_HEADS, BAD_INPUT, BAD_LAYERS, BAD_NUM_GPUS, NUM_OUTPUTS,  # noqa: F401
                     NUM_STATUS, O_ACT, O_BUBBLE, O_COMPUTE, O_COST, O_DAYS, O_DP, O_ENERGY, O_GPU_HOURS,
                     O_HFU, O_ITER, O_LOSS, O_MEM, O_MFU, O_MICRO, O_OPT, O_OVERHEAD, O_PARAMS, O_PP,
                     O_STATES, O_STEPS, O_TFLOPS, O_TOKENS_PER_S, O_TP, OK, OUT_OF_MEMORY, OUTPUT_NAMES,
                     REFUSED, REPEAT)


GiB = 1024.0 ** 3
SECONDS_PER_DAY = 86400.0
# Chinchilla parametric loss L(N, D) = E + A / N^alpha + B / D^beta
# (Hoffmann et al. 2022, "Training Compute-Optimal Large Language Models", Eq. 10, Approach 3).
CHINCHILLA_E, CHINCHILLA_A, CHINCHILLA_B = 1.69, 406.4, 410.7
CHINCHILLA_ALPHA, CHINCHILLA_BETA = 0.34, 0.28


@dataclass(frozen=True)
class LossFit:
    """One fit of the parametric loss ``L(N, D) = E + A / N^alpha + B / D^beta`` (nats per token,
    ``N`` parameters, ``D`` training tokens).

    Attributes
    ----------
    name : str
        Key in :data:`LOSS_FITS` (``vtrain-fast optimal --fit``).
    E, A, B, alpha, beta : float
        The fitted constants.
    source : str
        Paper, equation or table.
    """

    name: str
    E: float
    A: float
    B: float
    alpha: float
    beta: float
    source: str

    def loss(self, num_parameters, num_tokens):
        """``E + A / N^alpha + B / D^beta``, nats per token (numbers or numpy arrays)."""
        return self.E + self.A / num_parameters ** self.alpha + self.B / num_tokens ** self.beta

    def compute_optimal(self, flops):
        """``(N, D)`` minimising :meth:`loss` at fixed training FLOPs ``C = 6 N D``: ``N = G (C/6)^a``,
        ``D = (C/6) / N``, ``G = (alpha A / (beta B))^(1/(alpha+beta))``, ``a = beta / (alpha+beta)``
        (Hoffmann et al. 2022, Eq. 4). ``flops`` in FLOPs (a number or a numpy array)."""
        g = (self.alpha * self.A / (self.beta * self.B)) ** (1.0 / (self.alpha + self.beta))
        n = g * (flops / 6.0) ** (self.beta / (self.alpha + self.beta))
        return n, flops / 6.0 / n

    def optimal_with_inference(self, flops: float, inference_tokens: float) -> tuple[float, float]:
        """``(N, D)`` minimising :meth:`loss` at fixed lifetime FLOPs ``C = 6 N D + 2 N D_inf``:
        training on ``D`` tokens plus serving ``D_inf = inference_tokens`` tokens at ``2 N`` FLOPs
        each (Sardana, Portes, Doubov, Frankle 2024, "Beyond Chinchilla-Optimal: Accounting for
        Inference in Language Model Scaling Laws", arXiv:2401.00448, Sec. 2, the compute
        formulation). No closed form (the paper solves it numerically): a golden-section search
        over ``log N`` on ``D = (C - 2 N D_inf) / (6 N) > 0``, along which the loss has a single
        minimum. ``inference_tokens = 0`` gives :meth:`compute_optimal`.

        Raises
        ------
        ValueError
            ``flops`` or ``inference_tokens`` negative or not finite (a caller's bug: the
            command checks its input first).
        """
        if not (math.isfinite(flops) and flops > 0 and math.isfinite(inference_tokens) and inference_tokens >= 0):
            raise ValueError(f"flops {flops!r} and inference_tokens {inference_tokens!r}: positive and finite")
        if inference_tokens == 0:
            n, d = self.compute_optimal(flops)
            return float(n), float(d)

        def loss_at(log_n):
            n = math.exp(log_n)
            d = (flops - 2.0 * n * inference_tokens) / (6.0 * n)
            return self.loss(n, d) if d > 0 else math.inf

        lo, hi = math.log(1.0), math.log(flops / (2.0 * inference_tokens)) - 1e-12   # D > 0 below hi
        r = (math.sqrt(5.0) - 1.0) / 2.0
        a, b = hi - r * (hi - lo), lo + r * (hi - lo)
        fa, fb = loss_at(a), loss_at(b)
        for _ in range(200):
            if fa <= fb:
                hi, b, fb = b, a, fa
                a = hi - r * (hi - lo)
                fa = loss_at(a)
            else:
                lo, a, fa = a, b, fb
                b = lo + r * (hi - lo)
                fb = loss_at(b)
        n = math.exp((lo + hi) / 2.0)
        return n, (flops - 2.0 * n * inference_tokens) / (6.0 * n)


# The loss fits a caller can choose (the kernels' ``loss`` column is always ``hoffmann``'s, from
# the constants above; other fits are computed in Python from num_parameters and num_tokens).
LOSS_FITS = {f.name: f for f in (
    LossFit("hoffmann", CHINCHILLA_E, CHINCHILLA_A, CHINCHILLA_B, CHINCHILLA_ALPHA, CHINCHILLA_BETA,
            "Hoffmann et al. 2022, 'Training Compute-Optimal Large Language Models', Eq. 10 (Approach 3, "
            "the rounded constants of the paper's body)"),
    LossFit("epoch", 1.8172, 482.01, 2085.43, 0.3478, 0.3658,
            "Besiroglu, Erdil, Barnett, You 2024 (Epoch AI), 'Chinchilla Scaling: A replication attempt', "
            "arXiv:2404.10102, Table 1 (their estimate of Approach 3 on the data reconstructed from "
            "Hoffmann et al.'s Figure 4)"),
)}


# Gradient accumulation: read the accumulated and the new fp16 gradient, write the sum.
GRAD_ACCUMULATE_BYTES_PER_PARAM = 6.0
# Activation recomputation codes (the index of the name in spec.RECOMPUTE_VALUES).
RECOMPUTE_NONE, RECOMPUTE_FULL, RECOMPUTE_SELECTIVE = 0, 1, 2
# Forward FLOPs of the attention scores and context per token per layer, over the full s x s
# as Megatron-LM counts them: 4 s h (see forward_flops_per_token).
ATTENTION_FLOPS_PER_TOKEN_PER_S_H = 4.0

# Per-micro-batch costs (:func:`micro_batch_costs`), fixed by (model, machine,
# micro_batch_size, tp): indices into the tuple.
MICRO_NAMES = (
    "layer_forward_s", "layer_backward_s", "tp_allreduce_activation_s", "tp_allreduce_ce_s",
    "embedding_s", "head_s", "pp_allgather_s", "pp_send_intra_s", "pp_send_inter_s",
    "layer_activation_bytes", "logits_bytes", "attention_core_forward_s", "attention_core_activation_bytes",
    "tp_backward_hidden_s", "fp8_weight_cast_s", "fp8_weight_bytes",
    "cp_forward_exposed_s", "cp_backward_exposed_s",
    "bf16_layer_forward_extra_s", "bf16_layer_backward_extra_s", "bf16_layer_tp_hidden_extra_s",
    "bf16_layer_activation_extra_bytes",
    "moe_layer_forward_extra_s", "moe_layer_backward_extra_s", "ep_forward_s", "ep_backward_s",
    "moe_layer_activation_extra_bytes", "moe_mlp_tp_hidden_s",
)
NUM_MICRO = len(MICRO_NAMES)
(M_FWD, M_BWD, M_AR_ACT, M_AR_CE, M_EMB, M_HEAD, M_GATHER, M_SEND_INTRA, M_SEND_INTER, M_ACT_LAYER,
 M_LOGITS, M_CORE_FWD, M_CORE_ACT, M_TP_HIDDEN, M_FP8_CAST, M_FP8_WEIGHTS, M_CP_FWD, M_CP_BWD,
 M_BF16_FWD, M_BF16_BWD, M_BF16_TP_HIDDEN, M_BF16_ACT, M_MOE_FWD, M_MOE_BWD, M_EP_FWD, M_EP_BWD,
 M_MOE_ACT, M_MOE_TP_HIDDEN) = range(NUM_MICRO)
# Per-split costs (:func:`split_costs`), fixed by (model, machine, tp, pp, dp).
SPLIT_NAMES = ("params_first", "params_last", "dp_comm_s", "optimizer_s", "crosses_node",
               "accumulate_layers_s", "accumulate_embedding_s", "accumulate_head_s",
               "zero3_layer_gather_s", "zero3_embedding_gather_s", "zero3_head_gather_s", "zero3_gathered_bytes",
               "layers_first", "layers_middle", "layers_last", "params_middle", "accumulate_first_s",
               "accumulate_last_s", "embedding_sync_s", "replica_allreduce_s",
               "bf16_layers_first", "bf16_layers_second", "bf16_layers_last", "bf16_layers_middle_sum",
               "bf16_layers_middle_max", "bf16_layers_middle_min",
               "expert_params_first", "expert_params_middle", "expert_params_last", "expert_shard_ranks",
               "moe_layers_first", "moe_layers_second", "moe_layers_last", "moe_layers_middle_sum",
               "moe_layers_middle_max", "offloaded_bf16_layers", "offloaded_moe_layers", "param_copy_layer_s",
               "param_copy_embedding_s", "param_copy_head_s")
NUM_SPLIT = len(SPLIT_NAMES)
(S_P_FIRST, S_P_LAST, S_DP, S_OPT, S_CROSSES, S_ACC_BODY, S_ACC_EMB, S_ACC_HEAD, S_AG_LAYER, S_AG_EMB, S_AG_HEAD,
 S_GATHERED, S_L_FIRST, S_L_MID, S_L_LAST, S_P_MID, S_ACC_FIRST, S_ACC_LAST, S_EMB_SYNC,
 S_REPLICA, S_BF16_FIRST, S_BF16_SECOND, S_BF16_LAST, S_BF16_MID_SUM, S_BF16_MID_MAX,
 S_BF16_MID_MIN, S_E_FIRST, S_E_MID, S_E_LAST, S_EDZ, S_MOE_FIRST, S_MOE_SECOND, S_MOE_LAST, S_MOE_MID_SUM,
 S_MOE_MID_MAX, S_OFF_BF16, S_OFF_MOE, S_PCOPY_LAYER, S_PCOPY_EMB, S_PCOPY_HEAD) = range(NUM_SPLIT)
# Per-stage per-micro-batch costs (:func:`stage_costs`), fixed by the configuration: indices into the tuple.
STAGE_COST_NAMES = ("first_compute_s", "middle_compute_s", "last_compute_s", "embedding_compute_s", "head_compute_s",
                    "first_tp_s", "middle_tp_s", "last_tp_s", "embedding_tp_s", "head_tp_s",
                    "first_dp_s", "middle_dp_s", "last_dp_s", "embedding_dp_s", "head_dp_s",
                    "first_cp_s", "middle_cp_s", "last_cp_s", "first_ep_s", "last_ep_s",
                    "bf16_layer_compute_s", "bf16_layer_tp_s", "moe_layer_compute_s", "moe_layer_ep_s",
                    "moe_layer_tp_s", "pp_s", "dp_window_s", "first_offload_s", "middle_offload_s",
                    "last_offload_s")
NUM_STAGE_COSTS = len(STAGE_COST_NAMES)
(C_FIRST_COMPUTE, C_MID_COMPUTE, C_LAST_COMPUTE, C_EMB_COMPUTE, C_HEAD_COMPUTE, C_FIRST_TP, C_MID_TP, C_LAST_TP,
 C_EMB_TP, C_HEAD_TP, C_FIRST_DP, C_MID_DP, C_LAST_DP, C_EMB_DP, C_HEAD_DP, C_FIRST_CP, C_MID_CP, C_LAST_CP,
 C_FIRST_EP, C_LAST_EP, C_BF16_COMPUTE, C_BF16_TP, C_MOE_COMPUTE, C_MOE_EP, C_MOE_TP, C_PP,
 C_DP_WINDOW, C_FIRST_OFFLOAD, C_MID_OFFLOAD, C_LAST_OFFLOAD) = range(NUM_STAGE_COSTS)
# Per-model totals (:func:`model_totals`), fixed by (model, num_tokens).
TOTAL_NAMES = ("num_parameters", "forward_flops_per_token", "loss")
NUM_TOTALS = len(TOTAL_NAMES)
(T_PARAMS, T_FWD_FLOPS, T_LOSS) = range(NUM_TOTALS)


@jit
def chinchilla_loss(num_parameters, num_tokens):
    """Chinchilla's fitted loss ``E + A/N^alpha + B/D^beta`` (nats per token) for ``N``
    parameters trained on ``D`` tokens (Hoffmann et al. 2022, Eq. 10)."""
    return (CHINCHILLA_E + CHINCHILLA_A / num_parameters ** CHINCHILLA_ALPHA
            + CHINCHILLA_B / num_tokens ** CHINCHILLA_BETA)


@jit
def forward_flops_per_token(num_layers, h, a, g, f, v, s, gated=0.0, qw=0.0, arch=DEFAULT_ARCH):
    """Model forward FLOPs per token: GEMMs of every layer (QKV, attention scores and context
    over the full ``s x s`` as Megatron-LM counts them, output projection, MLP) and the LM head.
    Training model FLOPs are 3x this (PaLM, Chowdhery et al. 2022, Appendix B). Heads of
    ``kv_channels`` channels (``qw = a d``, :func:`~vtrain_fast.model.ops.attention_width`; 0:
    ``h``): QKV ``2 h (qw + 2 qw g/a)``, projection ``2 qw h``, scores and context ``4 s qw``
    (Megatron-LM ``num_floating_point_operations``: its attention terms times
    ``query_projection_size / hidden_size``).

    Multi-head latent attention (``arch``; ``qw`` its
    :func:`~vtrain_fast.model.ops.attention_width`, ``a (dq + v_head_dim) / 2``): 2 FLOPs per weight
    of its linears (:func:`~vtrain_fast.model.ops.mla_weights`, replicated and split, and the
    projection ``a v_head_dim x h``) instead of QKV's and the projection's, and scores and
    context ``4 s qw = 2 s a (dq + v_head_dim)`` (``Q K^T`` over ``dq = qk_head_dim +
    qk_pos_emb_head_dim`` channels, ``P V`` over ``v_head_dim``, full ``s x s``: Megatron-LM's MLA
    count doubled, as its causal halving is not taken here; its norm terms, ``q_lora_rank +
    kv_lora_rank`` per token, are left out)."""
    q = qw if qw > 0.0 else h
    if arch.multi_latent_attention != 0.0:
        rep_w, split_w = ops.mla_weights(h, a, arch)
        per_layer = (2.0 * (rep_w + split_w) + 2.0 * ops.context_width(h, a, arch) * h
                     + (4.0 + 2.0 * gated) * h * f + ATTENTION_FLOPS_PER_TOKEN_PER_S_H * s * q)
        return num_layers * per_layer + 2.0 * h * v
    per_layer = (2.0 * h * (q + 2.0 * q * g / a) + 2.0 * q * h + (4.0 + 2.0 * gated) * h * f
                 + ATTENTION_FLOPS_PER_TOKEN_PER_S_H * s * q)
    return num_layers * per_layer + 2.0 * h * v


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
    first = hw[H_FIRST_LAYERS]
    last = hw[H_LAST_LAYERS]
    e = 1.0 if hw[H_EMB_SPLIT] != 0.0 else 0.0
    lo = 1.0 if hw[H_LOSS_SPLIT] != 0.0 else 0.0
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
    if hw[H_EMB_SPLIT] != 0.0 or hw[H_LOSS_SPLIT] != 0.0:
        first += 1.0 if hw[H_EMB_SPLIT] != 0.0 else 0.0
        last += 1.0 if hw[H_LOSS_SPLIT] != 0.0 else 0.0
    return first % vpp == 0.0 and (p <= 2.0 or mid % vpp == 0.0) and last % vpp == 0.0


@jit
def bf16_layers_of(lo, hi, L, hw):
    """How many of the global layers ``lo .. hi - 1`` are kept in bf16 under FP8: the first
    ``num_layers_at_start_in_bf16`` and the last ``num_layers_at_end_in_bf16`` of the ``L``
    (Megatron-core ``fp8_utils.is_first_last_bf16_layer``: ``layer_no < start or layer_no >= L -
    end``, a global index, so a count beyond a stage's layers goes on to the next stage)."""
    start = hw[H_BF16_START]
    end_from = max(start, L - hw[H_BF16_END])      # layers from here on: the end's (not counted twice)
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
    e = 1.0 if hw[H_EMB_SPLIT] != 0.0 else 0.0
    lo = 1.0 if hw[H_LOSS_SPLIT] != 0.0 else 0.0
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
    if not ops.fp8_on(hw) or (hw[H_BF16_START] <= 0.0 and hw[H_BF16_END] <= 0.0):
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
def expert_sizes(t, hw):
    """``(ep, etp)`` of a machine vector at tensor-parallel size ``t``: ``etp`` 0 stands for ``t``
    (Megatron-core: ``expert_tensor_parallel_size`` None is ``tensor_model_parallel_size``)."""
    etp = hw[H_ETP]
    return hw[H_EP], (etp if etp > 0.0 else t)


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
    ``arch.kv_channels`` sets the head width or the model has multi-head latent attention (``BAD_HEADS``), the layers split over ``pp`` stages (:func:`stage_layers`: evenly, or as the
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
def ep_overlap_on(hw):
    """Whether ``overlap_moe_expert_parallel_comm`` acts: on, with the alltoall dispatcher it needs
    (Megatron-core asserts alltoall or flex; with allgather the flag has no effect, and sweeps and
    evaluate refuse the combination)."""
    return hw[H_EP_OVERLAP] != 0.0 and hw[H_DISPATCHER] != DISPATCHER_ALLGATHER


@jit
def refused_experts(lay, hw, arch):
    """Whether Megatron-core refuses this MoE plan (``TransformerConfig.__post_init__``): expert
    parallelism together with tensor parallelism needs sequence parallelism ("When using expert
    parallelism and tensor parallelism, sequence parallelism must be used"), and
    ``overlap_moe_expert_parallel_comm`` needs ``ep > 1`` and, at ``pp > 1``, the interleaved
    schedule (``vpp > 1``) (its refusal with full recomputation: :func:`schedule`); never for a
    dense model."""
    if arch.num_experts < 1.0:
        return False
    if ep_overlap_on(hw) and (hw[H_EP] <= 1.0 or (lay.pp > 1 and hw[H_VPP] <= 1.0)):
        return True
    return hw[H_EP] > 1.0 and lay.tp > 1 and hw[H_SEQ_PAR] == 0.0


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


@jit
def virtual_stages(p, hw):
    """Model chunks per device of the interleaved 1F1B schedule: the machine vector's ``vpp``
    with pipeline parallelism, 1 without (``p == 1`` has nothing to interleave)."""
    return hw[H_VPP] if p > 1.0 else 1.0


@jit_inline
def validate_interleaving(L, B, b, p, d, hw):
    """Status code of Megatron-LM's rules for the interleaved schedule (``vpp > 1`` and
    ``p > 1``): each stage's layers (:func:`stage_layers`; evenly: ``L / p``) divisible by
    ``vpp`` (``BAD_LAYERS``) and micro-batches per pipeline, ``B / (d * b)``, divisible by ``p``
    (``BAD_BATCH``); ``OK`` otherwise. Call only on shapes :func:`validate_shape` accepted and
    interleaving needs pipeline parallelism (``p > 1``; from 2 stages on since Megatron-LM commit
    3ee489d, 2024-05-31, "Enable virtual pipelining and P2P communication overlap at PP=2")."""
    vpp = virtual_stages(p, hw)
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
    return (int(hw[H_REPEAT_CASES]) >> plan_case(lay)) & 1 == 1


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
    return (int(hw[H_REFUSED_CASES]) >> plan_case(lay)) & 1 == 1


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


@jit
def activation_offload_layers(hw):
    """Transformer layers whose saved activations are offloaded to the host
    (``cpu_offloading_num_layers``; 0.0 when off or negative)."""
    return max(0.0, hw[H_ACT_OFFLOAD])


@jit
def refused_activation_offload(L, p, recompute, hw):
    """Whether Megatron-core refuses activation offloading (``cpu_offloading_num_layers`` ``k > 0``)
    here (``TransformerConfig.__post_init__``): with pipeline parallelism ("Currently there is no
    support for Pipeline parallelism with CPU offloading", ``p > 1``), with activation recomputation
    ("CPU offloading does not work when activation recomputation is enabled", ``recompute`` full or
    selective) and at ``k >= num_layers`` ("CPU offloading can be done only for layers less than
    num_layers"; Transformer Engine: the last layer is never offloaded)."""
    k = activation_offload_layers(hw)
    return k > 0.0 and (p > 1.0 or recompute != RECOMPUTE_NONE or k >= L)


@jit
def activation_offload_exposed_s(k, n, copy_s, compute_s):
    """Exposed seconds of one direction of activation offloading in one micro-batch: ``k`` of a
    rank's ``n`` layers each copy ``copy_s`` seconds of saved activations over the host link
    (forward: to the host; backward: back), on one copy stream, while each layer computes
    ``compute_s`` (its forward, or its backward).

    Transformer Engine's schedule (>= 2.10, transformer_engine/pytorch/cpu_offload.py,
    ``OffloadSynchronizer._default_offload_sync_init``): in forward layer ``i < k``'s copy is queued
    after its forward (at the next layer's step; assumed here not to start earlier) and must end
    before the forward of layer ``n - k + i`` starts; in backward the copies back run in the mirror
    order, layer ``i``'s queued at the start of the backward of layer ``n - 1 - k + i`` and due
    before its own backward. In both directions copy ``j`` (in stream order) is released after
    ``j + 1`` layers' compute and due ``w = n - k - 1`` layers' compute later, and a wait delays
    the later releases too. The longest path through that graph (compute of ``f`` per layer, copies
    of ``c`` chained on the stream) gives, for layers of equal compute:

    - ``w >= 1``: ``max(0, k c - (n - 2) f)``, the ``k`` copies back to back within the compute of
      layers ``1 .. n - 2`` (a copy shorter than a layer's compute is always hidden);
    - ``w = 0`` (``k = n - 1``, the most Megatron-core allows): ``k c``, every copy waited for in full.

    ``0.0`` at ``k <= 0``. tests/reference.py simulates the two streams event by event."""
    if k <= 0.0 or copy_s <= 0.0:
        return 0.0
    if n - k - 1.0 <= 0.0:
        return k * copy_s
    return max(0.0, k * copy_s - (n - 2.0) * compute_s)


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
        (:func:`tp_backward_hidden_s`, 0 unless ``async_tensor_model_parallel_allreduce`` or
        sequence parallelism is set; plus :func:`tp_comm_overlap_hidden_s` with
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
        are the exposed K/V exchange of one layer's forward and backward (:func:`cp_exchange_s`);
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
    if hw[H_SEQ_PAR] != 0.0:
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
    act_saving = memory.fp8_activation_saving_bytes(b, s, h, f, t, flash, hw[H_SEQ_PAR], fp8, mxfp8, cw,
                                                    latent)
    # a layer kept in bf16 under FP8 (num_layers_at_start/end_in_bf16): what it costs beyond an FP8 one
    fwd16 = bwd16 = hidden16 = 0.0
    if fp8 != 0.0 and (hw[H_BF16_START] > 0.0 or hw[H_BF16_END] > 0.0):
        hw16 = hw.copy()
        hw16[H_PRECISION] = PRECISION_BF16
        fwd16 = ops.layer_forward_s(b, s, h, a, g, f, t, hw16, arch) - layer_fwd
        bwd16 = ops.layer_backward_s(b, s, h, a, g, f, t, hw16, arch) - layer_bwd
        hidden16 = tp_hidden_s(b, s, h, a, g, f, t, tp_exchange, hw16, gated, qw, arch) - tp_hidden
    moe_fwd = moe_bwd = ep_fwd = ep_bwd = moe_act = mlp_hidden = 0.0
    if arch.num_experts >= 1.0:
        moe_fwd, moe_bwd, moe_act = moe_layer_extra(b, s, h, f, t, hw, arch)
        ep_fwd, ep_bwd = ep_exchange_s(b, s, h, t, hw, arch)
        mlp_hidden = mlp_tp_hidden_s(b, s, h, f, t, tp_exchange, hw, gated)
        if (fp8 != 0.0 and (hw[H_BF16_START] > 0.0 or hw[H_BF16_END] > 0.0)
                and arch.moe_layer_step == 1.0 and arch.moe_first_dense_layers == 0.0):
            # where every layer is an MoE layer (Mixtral, Qwen3-MoE, gpt-oss) a bf16 layer runs its
            # experts in bf16 too, and the TP exchange it hides is the attention's (no dense MLP);
            # with dense layers among them the bf16 layers' experts stay FP8 (not told apart)
            moe16_fwd, moe16_bwd, _ = moe_layer_extra(b, s, h, f, t, hw16, arch)
            fwd16 += moe16_fwd - moe_fwd
            bwd16 += moe16_bwd - moe_bwd
            hidden16 -= mlp_tp_hidden_s(b, s, h, f, t, tp_exchange, hw16, gated) - mlp_hidden
    return (layer_fwd + cp_fwd,
            layer_bwd + cp_bwd,
            tp_exchange,
            comm.group_allreduce_s(4.0 * b * s, t, 1.0, hw),
            ops.embedding_s(b, s, h, v, t, hw, arch),
            ops.head_s(b, s, h, v, t, hw),
            gather,
            comm.p2p_s(sbh2 / t, False, hw),
            comm.p2p_s(sbh2 / t, True, hw),
            memory.layer_activation_bytes(b, s, h, a, g, f, t, flash, hw[H_SEQ_PAR], gated, qw, latent, eb)
            - act_saving,
            s * b * v / t * (eb + 4.0),
            ops.attention_core_forward_s(b, s, qw, a, g, t, hw) + cp_fwd,
            memory.attention_core_activation_bytes(b, s, a, t, flash, eb),
            tp_hidden,
            fp8_weight_cast_s(h, a, g, f, t, hw, gated, qw, arch),
            memory.fp8_weight_copy_bytes(h, a, g, f, t, fp8, gated, mxfp8, qw, arch),
            cp_fwd_exposed, cp_bwd_exposed,
            fwd16, bwd16, hidden16, act_saving,
            moe_fwd, moe_bwd, ep_fwd, ep_bwd, moe_act, mlp_hidden)


@jit
def mlp_tp_hidden_s(b, s, h, f, t, tp_exchange, hw, gated=0.0):
    """The part of :func:`tp_hidden_s` that the dense MLP's linears hide: the FC1 weight-gradient
    GEMM under the backward exchange (:func:`tp_backward_hidden_s`), and with ``tp_comm_overlap``
    FC1 after the all-gather, FC2 before the reduce-scatter and FC2's data gradient after the
    backward all-gather (:func:`tp_comm_overlap_hidden_s`). An MoE layer has no dense MLP: its
    tensor-parallel exchange is the attention's only (:func:`schedule` takes the MLP's exchange,
    less this, off the layer's), and its experts' tokens travel by :func:`ep_exchange_s`."""
    if t <= 1.0:
        return 0.0
    tokens = b * s
    hidden = 0.0
    if hw[H_TP_OVERLAP] != 0.0 or hw[H_SEQ_PAR] != 0.0:
        ex = tp_exchange * (0.5 if hw[H_SEQ_PAR] != 0.0 else 1.0)
        hidden = min(ex, ops.linear_gemm_time_s(h, (1.0 + gated) * f / t, tokens, hw))
    if hw[H_TP_COMM_OVERLAP] != 0.0 and hw[H_SEQ_PAR] != 0.0:
        half_s = 0.5 * tp_exchange
        hidden += (min(half_s, ops.linear_gemm_time_s(tokens, (1.0 + gated) * f / t, h, hw))
                   + min(half_s, ops.linear_gemm_time_s(tokens, h, f / t, hw))
                   + min(half_s, ops.linear_gemm_time_s(tokens, f / t, h, hw)))
    return hidden


@jit
def grouped_gemm_time_s(m, n, k, groups, hw):
    """Seconds of a grouped GEMM of ``groups`` equal GEMMs ``(m x k) @ (k x n)``, a rank's local
    experts (Megatron-core ``GroupedMLP`` / TE ``GroupedLinear``): in bf16 one kernel whose SM
    utilisation counts the tiles of all groups (:func:`~vtrain_fast.model.ops.gemm_time_s` with
    ``batch = groups``: few rows per expert keep few SMs busy, the small-GEMM tail); in FP8 the
    same over TE's concurrent streams (:func:`~vtrain_fast.model.ops.fp8_gemm_time_s` with ``groups``;
    was ``groups`` FP8 GEMMs one after another, which priced FP8 Qwen3-30B's experts alone above its
    measured iteration)."""
    if ops.fp8_on(hw):
        return ops.fp8_gemm_time_s(m, n, k, hw, groups)
    return ops.gemm_time_s(m, n, k, groups, hw)


@jit
def moe_busiest_share(ep, hw):
    """The busiest expert-parallel rank's routed tokens (its local experts' together) over the even
    share, which sets the slowest rank's expert GEMMs, their activations and the tokens it receives:
    under dropless routing ``moe_load_imbalance``, at most ``ep`` (one rank cannot get more than
    every token) and 1 at ``ep = 1`` (every rank holds every expert: its rows are all its tokens'
    ``k`` copies, however they spread); with ``moe_expert_capacity_factor`` ``c > 0`` at most ``c``
    (Megatron-core drops the tokens beyond each expert's capacity, ``c`` times the even share:
    ``moe_utils.get_capacity``), and exactly ``c`` with ``moe_pad_expert_input_to_capacity`` (every
    expert padded to it)."""
    imbalance = min(hw[H_IMBALANCE], ep) if ep > 1.0 else 1.0
    c = hw[H_CAPACITY]
    if c > 0.0:
        return c if hw[H_PAD_CAPACITY] != 0.0 else min(imbalance, c)
    return imbalance


@jit
def moe_rows(b, s, t, hw, arch):
    """``(routed, rows, local)`` of one MoE layer on one rank, one micro-batch (``s`` the rank's
    tokens of a sequence): the tokens this rank routes, ``b s / t`` (Megatron-core's MoE layer takes
    the sequence-parallel input: each TP rank routes its share), the rows each local expert's GEMMs
    take, ``routed k etp / (E / ep)`` (uniform routing: the all-to-all over ``ep`` brings as many
    token copies as the rank sent, the all-gather over ``etp`` multiplies them by ``etp``) times
    :func:`moe_busiest_share` for the busiest rank, and the local experts ``E / ep``."""
    ep, etp = expert_sizes(t, hw)
    routed = b * s / t
    local = arch.num_experts / ep
    return routed, routed * arch.moe_router_topk * etp / local * moe_busiest_share(ep, hw), local


@jit
def moe_expert_width(f, arch):
    """One routed expert's width: ``moe_ffn_hidden_size``, or ``ffn_hidden_size`` when 0."""
    return arch.moe_ffn_hidden_size if arch.moe_ffn_hidden_size > 0.0 else f


@jit
def moe_router_s(b, s, h, t, hw, arch):
    """``(forward, backward)`` seconds of an MoE layer's router and token permutation, one
    micro-batch, one rank: the router GEMM ``routed x h x E`` (Megatron-core ``TopKRouter``, bf16;
    backward its data and weight gradients), softmax and top-k over the fp32 logits
    (:data:`MOE_ROUTER_BYTES_PER_LOGIT`) and the permutation into expert order and back
    (``2 (1 + k) routed h`` bytes read and written each, bf16), memory-bound, the same each way.
    With the allgather dispatcher (``moe_token_dispatcher_type``) the permutation picks the local
    experts' rows out of all ``n = etp ep`` ranks' gathered tokens and the unpermutation writes them
    all back into an fp32 buffer (``MoEAllGatherTokenDispatcher``): ``(2 + 4) (n - 1) routed h``
    bytes more."""
    routed, _, _ = moe_rows(b, s, t, hw, arch)
    e, k = arch.num_experts, arch.moe_router_topk
    permute = 4.0 * routed * h * (1.0 + k)
    if hw[H_DISPATCHER] == DISPATCHER_ALLGATHER:
        ep, etp = expert_sizes(t, hw)
        permute += 6.0 * (ep * etp - 1.0) * routed * h
    permute *= ops.activation_scale(hw)     # 4-byte rows under fp32 / tf32
    mem = ops.memory_bound_time_s(MOE_ROUTER_BYTES_PER_LOGIT * routed * e + permute,
                                  MOE_ROUTER_KERNELS + MOE_PERMUTE_KERNELS, hw)
    fwd = ops.gemm_time_s(routed, e, h, 1.0, hw) + mem
    bwd = ops.gemm_time_s(routed, h, e, 1.0, hw) + ops.gemm_time_s(h, e, routed, 1.0, hw) + mem
    return fwd, bwd


@jit
def moe_layer_extra(b, s, h, f, t, hw, arch):
    """``(forward s, backward s, activation bytes)`` an MoE layer costs beyond a dense layer of
    ``ffn_hidden_size`` ``f``, one micro-batch, one rank: its MLP is the router
    (:func:`moe_router_s`), the local experts' grouped GEMMs (:func:`grouped_gemm_time_s`, rows
    :func:`moe_rows`, width ``moe_ffn_hidden_size / etp``, gated as the dense MLP) and their
    activation, and the shared experts as a dense MLP of ``moe_shared_expert_intermediate_size``
    over ``t``, instead of the dense MLP's FC1, FC2 and activation (the same GEMMs and bytes as
    :func:`~vtrain_fast.model.ops.layer_forward_s` / ``layer_backward_s`` count; the difference is
    added outside their host-launch floor). Stored: the experts' FC1 input and output and the
    activation output per row (``2 h + (4 + 2 gated) f_e / etp`` bytes), the experts' outputs brought
    back by the combine, which the weighted unpermutation keeps for its probabilities' gradient
    (``2 k h`` per routed token; the dispatch side keeps nothing: the permutation's and the
    all-to-all's backward need only indices and split sizes), the fp32 logits (``4 E``) and the
    shared experts' ``(4 + 2 gated) f_s / t`` per token, instead of the dense MLP's
    ``(4 + 2 gated) f / t`` (Korthikanti et al. 2022's MLP terms at the expert width)."""
    gated = arch.gated_mlp
    ep, etp = expert_sizes(t, hw)
    routed, rows, local = moe_rows(b, s, t, hw, arch)
    fe = moe_expert_width(f, arch) / etp
    fs = arch.moe_shared_expert_intermediate_size / t
    tokens = b * s
    k = arch.moe_router_topk
    router_fwd, router_bwd = moe_router_s(b, s, h, t, hw, arch)
    fwd = (router_fwd + grouped_gemm_time_s(rows, (1.0 + gated) * fe, h, local, hw)
           + grouped_gemm_time_s(rows, h, fe, local, hw)
           - ops.linear_gemm_time_s(tokens, (1.0 + gated) * f / t, h, hw) - ops.linear_gemm_time_s(tokens, h, f / t, hw))
    bwd = (router_bwd + grouped_gemm_time_s(rows, h, (1.0 + gated) * fe, local, hw)
           + grouped_gemm_time_s(h, (1.0 + gated) * fe, rows, local, hw)
           + grouped_gemm_time_s(rows, fe, h, local, hw) + grouped_gemm_time_s(fe, h, rows, local, hw)
           - ops.linear_gemm_time_s(tokens, h, (1.0 + gated) * f / t, hw)
           - ops.linear_gemm_time_s(h, (1.0 + gated) * f / t, tokens, hw)
           - ops.linear_gemm_time_s(tokens, f / t, h, hw) - ops.linear_gemm_time_s(f / t, h, tokens, hw))
    act_fwd = (4.0 + 2.0 * gated) * (local * rows * fe - tokens * f / t)     # the activation kernel's bytes
    act_bwd = (6.0 + 4.0 * gated) * (local * rows * fe - tokens * f / t)
    kernels = 0.0
    stored = (local * rows * (2.0 * h + (4.0 + 2.0 * gated) * fe) + 2.0 * k * routed * h + 4.0 * routed * arch.num_experts
              - (4.0 + 2.0 * gated) * tokens * f / t)
    if fs > 0.0:
        fwd += (ops.linear_gemm_time_s(tokens, (1.0 + gated) * fs, h, hw) + ops.linear_gemm_time_s(tokens, h, fs, hw))
        bwd += (ops.linear_gemm_time_s(tokens, h, (1.0 + gated) * fs, hw)
                + ops.linear_gemm_time_s(h, (1.0 + gated) * fs, tokens, hw)
                + ops.linear_gemm_time_s(tokens, fs, h, hw) + ops.linear_gemm_time_s(fs, h, tokens, hw))
        act_fwd += (4.0 + 2.0 * gated) * tokens * fs
        act_bwd += (6.0 + 4.0 * gated) * tokens * fs
        kernels = 1.0
        stored += (4.0 + 2.0 * gated) * tokens * fs
    sc = ops.activation_scale(hw)       # fp32 / tf32: 4-byte elements (the fp32 logits scaled too: an overcount)
    fwd += ops.memory_bound_time_s(act_fwd * sc, kernels, hw)
    bwd += ops.memory_bound_time_s(act_bwd * sc, kernels, hw)
    return fwd, bwd, stored * sc


@jit
def dispatch_bytes(b, s, h, t, arch):
    """Bytes one rank sends in one MoE all-to-all (dispatch, or combine), one micro-batch: its
    routed tokens' ``k`` copies of ``h`` bf16 activations, ``2 k h b s / t`` (Megatron-core
    ``MoEAlltoAllTokenDispatcher``; the fp32 routing probabilities sent along are not counted)."""
    return 2.0 * arch.moe_router_topk * h * b * s / t


@jit
def ep_exchange_s(b, s, h, t, hw, arch):
    """``(forward, backward)`` seconds of one MoE layer's token exchange, one micro-batch, by
    ``moe_token_dispatcher_type``:

    - alltoall: the dispatch and the combine all-to-all over the ``ep`` ranks of the expert
      group, spaced ``etp`` (Megatron-core's expert rank order etp-ep-edp-pp;
      :func:`~vtrain_fast.model.comm.all_to_all_s` of :func:`dispatch_bytes` times
      :func:`moe_busiest_share`: the busiest rank receives that much more, or with a capacity
      factor what its experts keep, padded or not), and with ``etp > 1``
      the all-gather of the received tokens over the ``etp`` ranks (stride 1) before the experts and
      the reduce-scatter after them (``gather_from_sequence_parallel_region``,
      ``reduce_scatter_to_sequence_parallel_region``); the same each way.
    - allgather (``MoEAllGatherTokenDispatcher``): over the ``n = etp ep`` ranks of the expert
      tensor-and-model-parallel group (stride 1), forward the all-gather of every rank's
      ``routed = b s / t`` tokens, ``2 h`` bytes each (bf16) with their routing probabilities
      (``4 E``, fp32) and routing map (``E``, bool), and the reduce-scatter of the expert outputs in
      fp32 (``4 h``); backward the all-gather of those outputs' gradients (``4 h``) and the
      reduce-scatter of the tokens' and probabilities' gradients (``2 h + 4 E``)
      (:func:`~vtrain_fast.model.comm.group_allgather_s` of the gathered size ``n routed x bytes``).

    Exposed in full; ``overlap_moe_expert_parallel_comm`` hides them in :func:`schedule`."""
    ep, etp = expert_sizes(t, hw)
    if hw[H_DISPATCHER] == DISPATCHER_ALLGATHER:
        n = ep * etp
        if n <= 1.0:
            return 0.0, 0.0
        gathered = n * b * s / t * ops.activation_scale(hw)     # (fp32 / tf32: every part scaled, an overcount)
        e = arch.num_experts
        fwd = (comm.group_allgather_s(gathered * (2.0 * h + 5.0 * e), n, 1.0, hw)
               + comm.group_allgather_s(gathered * 4.0 * h, n, 1.0, hw))
        bwd = (comm.group_allgather_s(gathered * 4.0 * h, n, 1.0, hw)
               + comm.group_allgather_s(gathered * (2.0 * h + 4.0 * e), n, 1.0, hw))
        return fwd, bwd
    nbytes = dispatch_bytes(b, s, h, t, arch) * moe_busiest_share(ep, hw) * ops.activation_scale(hw)
    x = 2.0 * comm.all_to_all_s(nbytes, ep, etp, hw)
    if etp > 1.0:
        x += 2.0 * comm.group_allgather_s(nbytes * etp, etp, 1.0, hw)
    return x, x


@jit
def tp_hidden_s(b, s, h, a, g, f, t, tp_exchange, hw, gated=0.0, qw=0.0, arch=DEFAULT_ARCH):
    """Seconds of one layer's tensor-parallel exchanges (``tp_exchange``: one activation's) that
    overlap hides, one micro-batch: :func:`tp_backward_hidden_s` with the asynchronous all-reduce
    or sequence parallelism (half the exchange, the reduce-scatter, with sequence parallelism),
    plus :func:`tp_comm_overlap_hidden_s` with ``tp_comm_overlap`` and sequence parallelism
    (``qw`` the attention width, :func:`~vtrain_fast.model.ops.attention_width`; 0: ``h``; ``arch``
    for multi-head latent attention's linears)."""
    hidden = 0.0
    if hw[H_TP_OVERLAP] != 0.0 or hw[H_SEQ_PAR] != 0.0:
        hidden = tp_backward_hidden_s(b, s, h, a, g, f, t, tp_exchange * (0.5 if hw[H_SEQ_PAR] != 0.0 else 1.0),
                                      hw, gated, qw, arch)
    if hw[H_TP_COMM_OVERLAP] != 0.0 and hw[H_SEQ_PAR] != 0.0:
        hidden += tp_comm_overlap_hidden_s(b, s, h, a, g, f, t, 0.5 * tp_exchange, hw, gated, qw, arch)
    return hidden


@jit
def cp_exchange_s(b, s, h, a, g, t, cp, hw):
    """``(forward, backward)`` exposed seconds of one layer's context-parallel K/V exchange, one
    micro-batch (``s`` the rank's tokens, ``seq_length / cp``; ``(0, 0)`` at ``cp = 1``).

    The cp group has ``cp`` ranks spaced ``tp`` (:func:`~vtrain_fast.model.layout.cp_stride`);
    it leaves its node when ``tp * cp > gpus_per_node``. Ring (``cp_comm_type`` = p2p): each
    step's transfer of this rank's K/V (:func:`~vtrain_fast.model.ops.cp_kv_bytes`) hides behind
    one attention block (the FlashAttention forward or backward over ``s`` rows):
    :func:`~vtrain_fast.model.comm.cp_ring_forward_exposed_s`,
    :func:`~vtrain_fast.model.comm.cp_ring_backward_exposed_s`. All-gather: forward one exposed
    all-gather of K/V, backward that all-gather again and the reduce-scatter of dK/dV
    (:func:`~vtrain_fast.model.comm.cp_all_gather_s`). ``h`` is the attention width
    (:func:`~vtrain_fast.model.ops.attention_width`)."""
    if cp <= 1.0:
        return 0.0, 0.0
    kv = ops.cp_kv_bytes(b, s, h, a, g, t)
    if ops.cp_all_gather_on(hw):
        gather = comm.cp_all_gather_s(kv, cp, t, hw)
        return gather, 2.0 * gather
    crosses = spans_nodes(cp, t, hw[H_GPUS_PER_NODE])
    return (comm.cp_ring_forward_exposed_s(kv, cp, ops.flash_attention_forward_s(b, s, h, a, g, t, hw), crosses, hw),
            comm.cp_ring_backward_exposed_s(kv, cp, ops.flash_attention_backward_s(b, s, h, a, g, t, hw), crosses, hw))


@jit
def tp_backward_hidden_s(b, s, h, a, g, f, t, exchange_s, hw, gated=0.0, qw=0.0, arch=DEFAULT_ARCH):
    """Seconds of one layer's backward tensor-parallel exchanges that asynchronous communication
    hides, one micro-batch.

    Megatron-LM's column-parallel linears (QKV and FC1) start the all-reduce of their input
    gradient (with sequence parallelism, its reduce-scatter) and compute the weight gradient
    while it runs (``LinearWithGradAccumulationAndAsyncCommunication``,
    ``async_tensor_model_parallel_allreduce``), so each of the two exchanges (``exchange_s``
    seconds: the all-reduce, or with sequence parallelism the reduce-scatter, half of the
    exchange) is hidden up to the length of its weight-gradient GEMM:
    ``min(exchange_s, wgrad_qkv) + min(exchange_s, wgrad_fc1)``; 0 at ``t = 1`` (no exchange).
    :func:`micro_batch_costs` charges it when the machine-vector field ``tp_overlap`` is set, and
    always with sequence parallelism (Megatron-LM overlaps its reduce-scatter whatever the flag)."""
    if t <= 1.0:
        return 0.0
    tokens = b * s
    if ops.mla_on(arch):                # MLA: its column-parallel up projections' weight gradients
        return (min(exchange_s, ops.mla_up_gemms_s(tokens, h, a, t, True, hw, arch))
                + min(exchange_s, ops.linear_gemm_time_s(h, (1.0 + gated) * f / t, tokens, hw)))
    q = qw if qw > 0.0 else h           # the attention width (0: h)
    qkv_out = (q + 2.0 * q * g / a) / t
    return (min(exchange_s, ops.linear_gemm_time_s(h, qkv_out, tokens, hw))
            + min(exchange_s, ops.linear_gemm_time_s(h, (1.0 + gated) * f / t, tokens, hw)))


@jit
def tp_comm_overlap_hidden_s(b, s, h, a, g, f, t, half_s, hw, gated=0.0, qw=0.0, arch=DEFAULT_ARCH):
    """Seconds of one layer's sequence-parallel exchanges that Transformer Engine's userbuffers
    overlap hides beyond :func:`tp_backward_hidden_s`, one micro-batch (Megatron-LM
    ``--tp-comm-overlap``, which needs sequence parallelism).

    The GEMM of each tensor-parallel linear is split into chunks pipelined with the exchange it
    consumes or produces (Wang et al. 2022, "Overlap Communication with Dependent Computation via
    Decomposition in Large Deep Learning Models", ASPLOS '23; TE ``UserbufferOverlap``): in
    forward the all-gather before QKV and FC1 and the reduce-scatter after the output projection
    and FC2, in backward the all-gather of the output gradient before the data-gradient GEMMs of
    the output projection and FC2. Each exchange (``half_s``: half of the reduce-scatter +
    all-gather pair of one activation) is hidden up to the length of its GEMM:
    ``sum min(half_s, gemm)`` over those six. An optimistic bound: the first or last chunk that
    cannot overlap and the SMs the communication kernels take from the GEMMs are not charged (no
    measurements here to fit them to); a recomputed forward's exchanges stay exposed. 0 at
    ``t = 1``."""
    if t <= 1.0:
        return 0.0
    tokens = b * s
    if ops.mla_on(arch):                # MLA: the gather feeds its up projections; the context a v_head_dim
        cw = ops.context_width(h, a, arch)
        return (min(half_s, ops.mla_up_gemms_s(tokens, h, a, t, False, hw, arch))   # AG -> up projections
                + min(half_s, ops.linear_gemm_time_s(tokens, h, cw / t, hw))
                + min(half_s, ops.linear_gemm_time_s(tokens, (1.0 + gated) * f / t, h, hw))
                + min(half_s, ops.linear_gemm_time_s(tokens, h, f / t, hw))
                + min(half_s, ops.linear_gemm_time_s(tokens, cw / t, h, hw))
                + min(half_s, ops.linear_gemm_time_s(tokens, f / t, h, hw)))
    q = qw if qw > 0.0 else h           # the attention width (0: h)
    qkv_out = (q + 2.0 * q * g / a) / t
    return (min(half_s, ops.linear_gemm_time_s(tokens, qkv_out, h, hw))        # AG -> QKV
            + min(half_s, ops.linear_gemm_time_s(tokens, h, q / t, hw))      # projection -> RS
            + min(half_s, ops.linear_gemm_time_s(tokens, (1.0 + gated) * f / t, h, hw))   # AG -> FC1
            + min(half_s, ops.linear_gemm_time_s(tokens, h, f / t, hw))      # FC2 -> RS
            + min(half_s, ops.linear_gemm_time_s(tokens, q / t, h, hw))      # AG -> projection dgrad
            + min(half_s, ops.linear_gemm_time_s(tokens, f / t, h, hw)))     # AG -> FC2 dgrad


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
    (Megatron-LM passes ``is_first_microbatch``), so :func:`schedule` spreads it over the ``m``
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
def split_costs(L, h, a, g, f, v, s, lay, hw, arch=DEFAULT_ARCH):
    """Costs that depend on the model, the machine and the parallel layout but not on the
    batch sizes or recomputation.

    Parameters
    ----------
    L, h, a, g, f, v, s : float
        Model shape (as :func:`step`).
    lay : Layout
        Parallel layout (:mod:`vtrain_fast.model.layout`).
    hw : numpy.ndarray
        Machine vector.
    arch : Arch
        The model's architecture flags (:mod:`vtrain_fast.model.arch`).

    Returns
    -------
    tuple of float
        ``NUM_SPLIT`` values laid out as :data:`SPLIT_NAMES`: parameters per GPU on the first
        and the last stage (the first carries the word and the learned position embeddings, the
        last the LM head and final norm, its own copy of the word embedding when they are tied;
        one stage carries all, the shared table once when tied), the data-parallel gradient
        all-reduce seconds (reduce-scatter + all-gather with a sharded optimizer; the slower
        of the two stages), the Adam seconds of the larger
        stage, 1.0 when the pipeline group (``pp`` ranks :func:`~vtrain_fast.model.layout.pp_stride`
        apart) leaves its node (:func:`~vtrain_fast.model.layout.spans_nodes`) else 0.0, and the seconds of one gradient accumulation
        (6 bytes per parameter at ``hbm_Bps * hbm_efficiency``, over ``d`` with sharded gradients,
        ZeRO-2/3) of a stage's layers, of the embeddings and of the head; with ZeRO-3
        (:func:`~vtrain_fast.model.memory.sharding_stage`) the seconds of one all-gather of a
        layer's, the embeddings' and the head's fp16 parameters over the data-parallel group and
        the bytes held gathered (:func:`~vtrain_fast.model.memory.zero3_gathered_bytes`), else 0.
        With ZeRO 1-3 the exchange is a reduce-scatter plus an all-gather. Last, the seconds of
        the all-reduce of the tied word embedding's gradient between the first and the last
        stage (Megatron-LM's embedding group, ``2 v h / t`` bytes, after the backward; 0 at
        ``pp = 1`` or when untied).
    """
    t, p = float(lay.tp), float(lay.pp)
    eb = ops.element_bytes(hw)             # bytes of a weight or gradient element moved: 2, 4 under fp32 / tf32
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
        p_body += nm_first * (p_moe - p_layer)
        p_body_last += nm_last * (p_moe - p_layer)
        p_mid += nm_mid_max * (p_moe - p_layer)
        e_first, e_mid, e_last = nm_first * p_exp, nm_mid_max * p_exp, nm_last * p_exp
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
        emb_sync_s = comm.group_allreduce_s(eb * v * h / t, 2.0, (p - 1.0) * float(pp_stride(lay)), hw)
    if zero >= 1.0:
        # ZeRO: gradient reduce-scatter + parameter all-gather (per iteration at stage 1, the
        # reduce-scatter per micro-batch at stage 2, per layer at stage 3: see schedule)
        dp_comm_s = max(comm.group_reduce_scatter_allgather_s(eb * p_first, d, dp_apart, hw),
                        comm.group_reduce_scatter_allgather_s(eb * p_last, d, dp_apart, hw))
        if p_mid > p_first and p_mid > p_last:      # uneven stages: a middle stage may hold more
            dp_comm_s = max(dp_comm_s, comm.group_reduce_scatter_allgather_s(eb * p_mid, d, dp_apart, hw))
    else:
        dp_comm_s = max(comm.group_allreduce_s(eb * p_first, d, dp_apart, hw),
                        comm.group_allreduce_s(eb * p_last, d, dp_apart, hw))
        if p_mid > p_first and p_mid > p_last:
            dp_comm_s = max(dp_comm_s, comm.group_allreduce_s(eb * p_mid, d, dp_apart, hw))
    if moe and edz > 1.0:
        # the experts' gradients: reduced (reduce-scatter + all-gather with ZeRO) over their own
        # expert-data-parallel group, after the dense ones
        e_max = max(e_first, e_mid, e_last)
        if zero >= 1.0:
            dp_comm_s += comm.group_reduce_scatter_allgather_s(eb * e_max, edz, etp * ep, hw)
        else:
            dp_comm_s += comm.group_allreduce_s(eb * e_max, edz, etp * ep, hw)
    # hybrid sharding: the replicas of a shard group all-reduce their 1/d gradient shards
    replica_s = 0.0
    if d < d_all:
        replica_s = comm.group_allreduce_s(eb * max(p_first, p_last, p_mid) / d, d_all / d, dp_apart * d, hw)
    # a sharded optimizer updates only its 1/d of the parameters
    optimizer_time_s = ops.optimizer_step_s(max(p_first, p_last, p_mid) / memory.optimizer_shards(d, zero), hw, d)
    if moe:     # + the expert parameters' shard (over the expert-data-parallel ranks)
        optimizer_time_s = ops.optimizer_step_s(max(p_first, p_last, p_mid) / memory.optimizer_shards(d, zero)
                                           + max(e_first, e_mid, e_last) / memory.optimizer_shards(edz, zero), hw, d)
    crosses = 1.0 if spans_nodes(p, float(pp_stride(lay)), hw[H_GPUS_PER_NODE]) else 0.0
    # one gradient accumulation (into .grad) of a stage's layers, embeddings and head; with
    # sharded gradients (ZeRO-2/3) into this rank's 1/d shard only
    per_param = GRAD_ACCUMULATE_BYTES_PER_PARAM * ops.activation_scale(hw) / (hw[H_HBM_BPS] * hw[H_HBM_EFF])
    if zero >= 2.0:
        per_param = per_param / d
    ag_layer = ag_emb = ag_head = 0.0
    if zero >= 3.0:
        # ZeRO-3 / FSDP: one all-gather of a layer's (embedding's, head's) fp16 parameters
        ag_layer = comm.group_allgather_s(eb * p_layer, d, dp_apart, hw)
        ag_emb = comm.group_allgather_s(eb * p_emb, d, dp_apart, hw)
        ag_head = comm.group_allgather_s(eb * p_head, d, dp_apart, hw)
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
    return (p_first, p_last, dp_comm_s, optimizer_time_s, crosses, per_param * (p_mid + e_mid),
            per_param * p_emb, per_param * acc_head, ag_layer, ag_emb, ag_head,
            memory.zero3_gathered_bytes(p_layer, d, zero, eb), l_first, l_mid, l_last, p_mid,
            per_param * (p_body + e_first), per_param * (p_body_last + e_last), emb_sync_s, replica_s,
            n16_first, n16_second, n16_last, n16_mid_sum, n16_mid_max, n16_mid_min,
            e_first, e_mid, e_last, edz, nm_first, nm_second, nm_last, nm_mid_sum, nm_mid_max,
            off16, off_moe, ops.param_offload_copy_s(p_layer / d, d, hw),
            ops.param_offload_copy_s(p_emb / d, d, hw), ops.param_offload_copy_s(p_head / d, d, hw))


@jit
def model_totals(L, h, a, g, f, v, s, num_tokens, arch=DEFAULT_ARCH):
    """``(num_parameters, forward_flops_per_token, loss)`` of a model (architecture flags ``arch``)
    trained on ``num_tokens`` tokens (:func:`~vtrain_fast.model.memory.model_params`,
    :func:`forward_flops_per_token`, :func:`chinchilla_loss`); layout :data:`TOTAL_NAMES`."""
    n_params = memory.model_params(L, h, a, g, f, v, s, arch)
    fwd_flops = forward_flops_per_token(L, h, a, g, f, v, s, arch.gated_mlp, ops.attention_width(h, a, arch), arch)
    if arch.num_experts >= 1.0:
        # MoE layers: all experts' parameters; FLOPs of the active ones (top-k routed experts, the
        # router and the shared experts) instead of the dense MLP's
        n_moe = moe_layers_of(0.0, L, arch.moe_layer_step, arch.moe_first_dense_layers)
        p_moe, p_exp = memory.moe_layer_params_per_rank(h, a, g, f, 1.0, 1.0, 1.0, arch)
        n_params += n_moe * (p_moe + p_exp - memory.layer_params(h, a, g, f, arch))
        fwd_flops += n_moe * moe_mlp_extra_flops_per_token(h, f, arch)
    return (n_params, fwd_flops, chinchilla_loss(n_params, num_tokens))


@jit
def moe_mlp_extra_flops_per_token(h, f, arch):
    """Forward FLOPs per token of an MoE layer's MLP beyond a dense layer's (``(4 + 2 gated) h f``):
    the router ``2 E h``, ``k`` routed experts and the shared experts, ``(4 + 2 gated) h`` per
    unit of width (2 FLOPs per active weight: the MFU convention of 6 x active parameters per token
    for training, plus attention)."""
    per_width = (4.0 + 2.0 * arch.gated_mlp) * h
    return (2.0 * arch.num_experts * h + per_width * (arch.moe_router_topk * moe_expert_width(f, arch)
                                                     + arch.moe_shared_expert_intermediate_size)
            - per_width * f)


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
    l_first, l_mid, l_last = split[S_L_FIRST], split[S_L_MID], split[S_L_LAST]
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
        :func:`micro_batch_costs` and :func:`split_costs` of this configuration.

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
    core = sel * mb[M_CORE_FWD]        # selective: the attention core runs again before backward
    fwd = mb[M_FWD]
    ar_act = mb[M_AR_ACT]

    # ---- per micro-batch compute and TP communication, per stage type (first, middle, last)
    layer_compute = fwd + mb[M_BWD] + rc * fwd + core
    layer_tp = (4.0 + 2.0 * rc) * ar_act - mb[M_TP_HIDDEN]   # minus what async TP hides
    first_compute = l_first * layer_compute
    mid_compute = l_mid * layer_compute
    last_compute = l_last * layer_compute
    first_tp = l_first * layer_tp
    mid_tp = l_mid * layer_tp
    last_tp = l_last * layer_tp
    # context parallelism's exposed K/V exchange (0 at cp = 1): every forward (recomputed ones too,
    # and the attention core rerun by selective recomputation) and every backward of a layer
    layer_cp = (1.0 + rc + sel) * mb[M_CP_FWD] + mb[M_CP_BWD]
    first_cp = l_first * layer_cp
    mid_cp = l_mid * layer_cp
    last_cp = l_last * layer_cp
    emb_compute = mb[M_EMB]
    emb_tp = ar_act
    head_compute = mb[M_HEAD]
    head_tp = ar_act + 3.0 * mb[M_AR_CE]
    # gradient accumulation into .grad from the second micro-batch on (6 bytes per parameter),
    # spread over the m micro-batches
    acc = (m - 1.0) / m
    # + the FP8 weight cast (0 in bf16): once per iteration, spread over the micro-batches; with
    # ZeRO-3 the weights are gathered per use, so each layer is cast at its forward and backward gather
    regather = zero >= 3.0 and dz > 1.0
    cast = 2.0 * mb[M_FP8_CAST] if regather else mb[M_FP8_CAST] / m
    first_compute += acc * split[S_ACC_FIRST] + l_first * cast
    mid_compute += acc * split[S_ACC_BODY] + l_mid * cast
    last_compute += acc * split[S_ACC_LAST] + l_last * cast
    # layers kept in bf16 under FP8 (0 otherwise): each adds its bf16 GEMMs' extra time (forward,
    # recomputed forward, backward) and the TP exchange they hide beyond the FP8 ones', and has no
    # FP8 weight cast; a middle stage's time is that of a stage without them, plus theirs
    n16_first, n16_last = split[S_BF16_FIRST], split[S_BF16_LAST]
    x16_compute = (1.0 + rc) * mb[M_BF16_FWD] + mb[M_BF16_BWD] - cast
    x16_tp = -mb[M_BF16_TP_HIDDEN]
    first_compute += n16_first * x16_compute
    last_compute += n16_last * x16_compute
    first_tp += n16_first * x16_tp
    last_tp += n16_last * x16_tp
    emb_compute += acc * split[S_ACC_EMB]
    head_compute += acc * split[S_ACC_HEAD]
    # MoE layers (0 for a dense model): each adds what its MLP costs beyond a dense one (forward,
    # recomputed forward, backward) and its exposed token dispatch and combine (expert parallelism,
    # forward and recomputed forward, backward); a middle stage's time is that of a stage without
    # them, plus theirs
    nm_first, nm_last = split[S_MOE_FIRST], split[S_MOE_LAST]
    xm_compute = (1.0 + rc) * mb[M_MOE_FWD] + mb[M_MOE_BWD]
    xm_ep = (1.0 + rc) * mb[M_EP_FWD] + mb[M_EP_BWD]
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
    xm_tp = mb[M_MOE_TP_HIDDEN] - (2.0 + rc) * ar_act
    first_tp += nm_first * xm_tp
    last_tp += nm_last * xm_tp

    # ---- pipeline point-to-point per micro-batch (activation forward, gradient backward);
    # scatter-gather: each TP rank sends 1/t, then an intra-node all-gather (Megatron-LM).
    pp_mb = 0.0
    if p > 1.0:
        send = mb[M_SEND_INTER] if split[S_CROSSES] != 0.0 else mb[M_SEND_INTRA]
        exchange = send + mb[M_GATHER]
        pp_mb = 2.0 * vs * exchange   # each of the vs chunks sends and receives
        if vs > 1.0 and hw[H_P2P_OVERLAP] != 0.0:
            # overlap_p2p_comm (Megatron-core's interleaved schedule, schedules.py): each chunk's send
            # and receive run asynchronously under the next chunk's forward (activation) or backward
            # (gradient), so only what is longer than a chunk of the shortest stage shows
            chunk_layers = l_min / vs
            pp_mb = vs * (max(0.0, exchange - chunk_layers * fwd)
                          + max(0.0, exchange - chunk_layers * (mb[M_BWD] + rc * fwd + core)))

    # ---- sharded data parallelism per micro-batch (ZeRO-2/3), exposed part per stage
    # a stage's backward of one micro-batch (+ recompute); with uneven stages the shortest's
    window = l_min * (mb[M_BWD] + rc * fwd + core)
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
        # behind; the head's hide behind the head.
        ag = split[S_AG_LAYER]
        layer_dp = max(0.0, ag - fwd) + max(0.0, 2.0 * ag - (mb[M_BWD] + rc * fwd + core))
        first_dp = l_first * layer_dp + 3.0 * ag
        mid_dp = l_mid * layer_dp + 3.0 * ag
        last_dp = l_last * layer_dp + 3.0 * ag
        emb_dp = 3.0 * split[S_AG_EMB]
        head_dp = max(0.0, 3.0 * split[S_AG_HEAD] - mb[M_HEAD])
    elif zero >= 2.0:
        # ZeRO-2: the gradients are reduce-scattered into their shards after every micro-batch
        # (the larger stage's, half of the exchange), under that backward with overlap_grad_reduce
        rs = 0.5 * split[S_DP]
        first_dp = rs - hw[H_DP_OVERLAP] * min(rs, window)
        mid_dp = first_dp
        last_dp = first_dp

    # ---- offloading: the exposed GPU<->host copies (0 with both settings off)
    first_off = 0.0
    mid_off = 0.0
    last_off = 0.0
    c = split[S_PCOPY_LAYER]
    if zero >= 3.0 and c > 0.0:
        # parameter offloading (FSDP2 CPUOffloadPolicy): each layer's fp32 shard is copied to the GPU
        # before its all-gather, in forward and again in backward, and its gradient shard copied back
        # after the reduce-scatter, in the same prefetched chain as ZeRO-3's exchanges (above): a
        # layer exposes what its copies and exchanges take beyond its compute, less what the
        # exchanges alone expose (in dp_comm_s); the first copy of the forward and of the backward and
        # the last copy back wait in full; the embedding's copies have no compute to hide behind, the
        # head's hide behind the head
        ag = split[S_AG_LAYER]
        back = mb[M_BWD] + rc * fwd + core
        layer_off = (max(0.0, ag + c - fwd) + max(0.0, 2.0 * (ag + c) - back)
                     - max(0.0, ag - fwd) - max(0.0, 2.0 * ag - back))
        emb_off = 3.0 * split[S_PCOPY_EMB]
        ag_head, c_head = split[S_AG_HEAD], split[S_PCOPY_HEAD]
        head_off = max(0.0, 3.0 * (ag_head + c_head) - mb[M_HEAD]) - max(0.0, 3.0 * ag_head - mb[M_HEAD])
        first_off = l_first * layer_off + 3.0 * c + emb_off + (head_off if p == 1.0 else 0.0)
        mid_off = l_mid * layer_off + 3.0 * c
        last_off = l_last * layer_off + 3.0 * c + head_off
    k_off = activation_offload_layers(hw)
    if k_off > 0.0 and p == 1.0:
        # activation offloading (cpu_offloading_num_layers): the first k layers' saved activations to
        # the host in forward and back in backward, each direction at host_link_Bps, exposed beyond
        # the other layers' compute (activation_offload_exposed_s)
        n16_off = split[S_OFF_BF16]
        nm_off = split[S_OFF_MOE]
        nbytes = memory.offloaded_activation_bytes(k_off, mb[M_ACT_LAYER], n16_off, mb[M_BF16_ACT], nm_off, mb[M_MOE_ACT])
        copy = nbytes / k_off / hw[H_HOST_LINK_BPS]
        first_off += (activation_offload_exposed_s(k_off, l_first, copy, fwd)
                      + activation_offload_exposed_s(k_off, l_first, copy, mb[M_BWD]))

    return (first_compute, mid_compute, last_compute, emb_compute, head_compute,
            first_tp, mid_tp, last_tp, emb_tp, head_tp,
            first_dp, mid_dp, last_dp, emb_dp, head_dp,
            first_cp, mid_cp, last_cp, first_ep, last_ep,
            x16_compute, x16_tp, xm_compute, xm_ep, xm_tp, pp_mb, window, first_off, mid_off, last_off)


@jit
def stage_micro_batch_s(sc, kind, n16, nm):
    """Seconds one pipeline stage spends on one micro-batch (all its chunks, forward, recomputation
    and backward, with their exposed TP, CP, EP, pipeline and sharded-DP exchanges), from
    :func:`stage_costs` ``sc``: ``kind`` 0 the first stage (with the embedding), 2 the last (with the
    head, final norm and loss), 1 a middle one, which adds ``n16`` layers kept in bf16 under FP8 and
    ``nm`` MoE layers to a stage of dense FP8 (or bf16) layers (the first and the last carry theirs
    already). The ``T_i`` of :func:`schedule`'s ``(m - 1) max_i T_i + sum_i T_i``."""
    if kind == 0:
        return (sc[C_FIRST_COMPUTE] + sc[C_EMB_COMPUTE] + sc[C_FIRST_TP] + sc[C_EMB_TP] + sc[C_PP] + sc[C_FIRST_DP]
                + sc[C_EMB_DP] + sc[C_FIRST_CP] + sc[C_FIRST_EP] + sc[C_FIRST_OFFLOAD])
    if kind == 2:
        return (sc[C_LAST_COMPUTE] + sc[C_HEAD_COMPUTE] + sc[C_LAST_TP] + sc[C_HEAD_TP] + sc[C_PP] + sc[C_LAST_DP]
                + sc[C_HEAD_DP] + sc[C_LAST_CP] + sc[C_LAST_EP] + sc[C_LAST_OFFLOAD])
    return (sc[C_MID_COMPUTE] + sc[C_MID_TP] + sc[C_PP] + sc[C_MID_DP] + sc[C_MID_CP] + sc[C_MID_OFFLOAD]
            + n16 * (sc[C_BF16_COMPUTE] + sc[C_BF16_TP]) + nm * (sc[C_MOE_COMPUTE] + sc[C_MOE_EP] + sc[C_MOE_TP]))


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
        :func:`micro_batch_costs`, :func:`split_costs` and :func:`model_totals` of this
        configuration.
    out : numpy.ndarray
        ``float64``, shape ``(NUM_OUTPUTS, n)``, output (layout :data:`OUTPUT_NAMES`).
    i : int
        Column to write.
    """
    status = OK
    t = float(lay.tp)
    p, d, dz, zero, m, l_first, l_mid, l_last, l_min, vs, rc, sel = schedule_sizes(B, b, lay, recompute, hw, split)
    sl = s / float(lay.cp)             # tokens of a sequence on one rank (context parallelism)
    if rc != 0.0 and ep_overlap_on(hw) and split[S_MOE_FIRST] + split[S_MOE_LAST] + split[S_MOE_MID_SUM] > 0.0:
        fill_nan(out, i)                # Megatron-core: "disable full recomputation when enabling
        return REFUSED                  # overlap_moe_expert_parallel_comm"
    if refused_activation_offload(L, p, recompute, hw):
        fill_nan(out, i)                # Megatron-core: no CPU offloading with pipeline parallelism,
        return REFUSED                  # recomputation, or of every layer
    num_gpus = float(world_size(lay))
    fwd = mb[M_FWD]
    sc = stage_costs(L, s, B, b, lay, recompute, hw, mb, split)
    (first_compute, mid_compute, last_compute, emb_compute, head_compute,
     first_tp, mid_tp, last_tp, emb_tp, head_tp,
     first_dp, mid_dp, last_dp, emb_dp, head_dp,
     first_cp, mid_cp, last_cp, first_ep, last_ep,
     x16_compute, x16_tp, xm_compute, xm_ep, xm_tp, pp_mb, window, first_off, mid_off, last_off) = sc
    regather = zero >= 3.0 and dz > 1.0
    n16_first, n16_last = split[S_BF16_FIRST], split[S_BF16_LAST]
    nm_first, nm_last = split[S_MOE_FIRST], split[S_MOE_LAST]

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
        total = t_first + t_last + (p - 2.0) * t_mid + split[S_BF16_MID_SUM] * x16 + split[S_MOE_MID_SUM] * xm
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
        n16_mid = split[S_BF16_MID_MAX] if x16 >= 0.0 else split[S_BF16_MID_MIN]
        nm_mid = split[S_MOE_MID_MAX]
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
        # distributed optimizer: only the gradient reduce-scatter (half the exchange) can run
        # under the backward (ZeRO-2: it ran after every micro-batch, above); the parameter
        # all-gather waits for the step and runs after it, or with --overlap-param-gather (which
        # needs --overlap-grad-reduce) bucket by bucket under the first forward of the next
        # iteration (Megatron-LM DistributedOptimizer)
        half = 0.5 * split[S_DP]
        gather_window = l_min * fwd if hw[H_DP_OVERLAP] != 0.0 else 0.0
        if zero >= 2.0:
            dp_comm_s = m * dp_slow + half - hw[H_PARAM_GATHER] * min(half, gather_window)
        else:
            dp_comm_s = (half - hw[H_DP_OVERLAP] * min(half, window)
                         + half - hw[H_PARAM_GATHER] * min(half, gather_window))
    else:
        dp_comm_s = split[S_DP] - hw[H_DP_OVERLAP] * min(split[S_DP], window)
    dp_comm_s += split[S_EMB_SYNC]          # the tied embedding's gradient (pp > 1), after the backward
    if split[S_REPLICA] > 0.0:
        # hybrid sharding: the shard replicas' all-reduce, under the last backward where gradient
        # reduction overlaps (overlap_grad_reduce; FSDP always)
        hides = 1.0 if (zero >= 3.0 or hw[H_DP_OVERLAP] != 0.0) else 0.0
        dp_comm_s += split[S_REPLICA] - hides * min(split[S_REPLICA], window)
    optimizer_time_s = split[S_OPT]
    overhead_s = hw[H_ITER_OVERHEAD_S]
    iteration = compute_s + tp_comm_s + pp_comm_s + bubble + dp_comm_s + optimizer_time_s + overhead_s + cp_comm_s
    iteration += ep_comm_s
    iteration += offload_s

    # ---- memory per GPU (the fullest of the first, the second and the last stage)
    full = mb[M_ACT_LAYER] - sel * mb[M_CORE_ACT]   # selective keeps all but the attention core's
    rebuilt = sel * mb[M_CORE_ACT]      # ... and rebuilds one layer's core at a time in backward
    hs = h / ops.sequence_split(t, hw)  # hidden size a rank keeps per token outside TP regions
    eb = ops.element_bytes(hw)          # bytes of an activation element: 2, 4 under fp32 / tf32
    ce = eb * 0.5                       # the stage's extra terms below are written for 2-byte elements
    x16_act = mb[M_BF16_ACT]            # a bf16 layer under FP8 saves its linears' inputs in bf16
    n16_second = split[S_BF16_SECOND]
    # the second stage may be the fullest with more layers than the first (uneven stages), or
    # when the first keeps bf16 layers (their activations against the second's FP8 weight copies)
    # (or with more MoE layers than the first: dense first layers)
    xm_act = mb[M_MOE_ACT]              # an MoE layer's stored bytes beyond a dense layer's
    nm_mid = split[S_MOE_MID_MAX]
    check_mid = p > 2.0 and (l_mid > l_first or n16_first > 0.0 or nm_mid > nm_first)
    act_mid = 0.0
    if p == 1.0:
        act_first = (memory.stage_activation_bytes_from_layer(L, 1.0, b, sl, hs, full, rc, eb)
                     + ce * sl * b * hs * 3.0 + mb[M_LOGITS] + rebuilt
                     + memory.bf16_layers_extra_bytes(n16_first, 1.0, x16_act, rc)
                     + memory.bf16_layers_extra_bytes(nm_first, 1.0, xm_act, rc))
        # activation offloading (cpu_offloading_num_layers, refused above but at pp = 1 without
        # recomputation): the first k layers' saved activations live in host memory
        act_first -= memory.offloaded_activation_bytes(activation_offload_layers(hw), full, split[S_OFF_BF16], x16_act,
                                                       split[S_OFF_MOE], xm_act)
        act_last = act_first
    elif vs <= 1.0:
        in_flight = min(p, m)
        act_first = (memory.stage_activation_bytes_from_layer(l_first, in_flight, b, sl, hs, full, rc, eb)
                     + ce * in_flight * sl * b * hs + rebuilt
                     + memory.bf16_layers_extra_bytes(n16_first, in_flight, x16_act, rc)
                     + memory.bf16_layers_extra_bytes(nm_first, in_flight, xm_act, rc))
        act_last = (memory.stage_activation_bytes_from_layer(l_last, 1.0, b, sl, hs, full, rc, eb)
                    + ce * 2.0 * sl * b * hs + mb[M_LOGITS] + rebuilt
                    + memory.bf16_layers_extra_bytes(n16_last, 1.0, x16_act, rc)
                    + memory.bf16_layers_extra_bytes(nm_last, 1.0, xm_act, rc))
        # the second stage holds min(p - 1, m) micro-batches of l_mid layers: fuller than the first
        # only with more layers than it (uneven stages) or bf16 layers on the first, never when even
        if check_mid:
            act_mid = (memory.stage_activation_bytes_from_layer(l_mid, min(p - 1.0, m), b, sl, hs, full, rc, eb) + rebuilt
                       + memory.bf16_layers_extra_bytes(n16_second, min(p - 1.0, m), x16_act, rc)
                       + memory.bf16_layers_extra_bytes(nm_mid, min(p - 1.0, m), xm_act, rc))
    else:
        # interleaved: device 0 runs 2(p-1) + (vs-1)p warm-up chunk forwards before its first
        # backward, device i 2(p-1-i) + (vs-1)p, the last device (vs-1)p (Megatron-LM's
        # interleaved schedule); each chunk holds a stage's layers / vs of one micro-batch
        chunks_first = min(m * vs, 2.0 * (p - 1.0) + (vs - 1.0) * p + 1.0)
        chunks_last = min(m * vs, (vs - 1.0) * p + 1.0)
        # (a device's bf16 layers sit in one chunk: counted at chunks / vs micro-batches in flight)
        act_first = (memory.stage_activation_bytes_from_layer(l_first / vs, chunks_first, b, sl, hs, full, rc, eb)
                     + ce * chunks_first / vs * sl * b * hs + rebuilt
                     + memory.bf16_layers_extra_bytes(n16_first, chunks_first / vs, x16_act, rc)
                     + memory.bf16_layers_extra_bytes(nm_first, chunks_first / vs, xm_act, rc))
        act_last = (memory.stage_activation_bytes_from_layer(l_last / vs, chunks_last, b, sl, hs, full, rc, eb)
                    + ce * 2.0 * sl * b * hs + mb[M_LOGITS] + rebuilt
                    + memory.bf16_layers_extra_bytes(n16_last, chunks_last / vs, x16_act, rc)
                    + memory.bf16_layers_extra_bytes(nm_last, chunks_last / vs, xm_act, rc))
        if check_mid:
            chunks_mid = min(m * vs, 2.0 * (p - 2.0) + (vs - 1.0) * p + 1.0)
            act_mid = (memory.stage_activation_bytes_from_layer(l_mid / vs, chunks_mid, b, sl, hs, full, rc, eb) + rebuilt
                       + memory.bf16_layers_extra_bytes(n16_second, chunks_mid / vs, x16_act, rc)
                       + memory.bf16_layers_extra_bytes(nm_mid, chunks_mid / vs, xm_act, rc))
    p_first = split[S_P_FIRST]
    p_last = split[S_P_LAST]
    # FP8 weight copies of a stage's FP8 layers (0 in bf16); with ZeRO-3 of the layers held gathered
    fp8_first = (memory.ZERO3_GATHERED_LAYERS if regather else l_first - n16_first) * mb[M_FP8_WEIGHTS]
    fp8_mid = (memory.ZERO3_GATHERED_LAYERS if regather else l_mid - n16_second) * mb[M_FP8_WEIGHTS]
    fp8_last = (memory.ZERO3_GATHERED_LAYERS if regather else l_last - n16_last) * mb[M_FP8_WEIGHTS]
    state_first = memory.model_state_bytes(p_first, dz, zero, hw) + split[S_GATHERED] + fp8_first
    state_last = memory.model_state_bytes(p_last, dz, zero, hw) + split[S_GATHERED] + fp8_last
    edz = split[S_EDZ]                  # MoE: the experts' states over the expert-data-parallel ranks
    state_first += memory.model_state_bytes(split[S_E_FIRST], edz, zero, hw)
    state_last += memory.model_state_bytes(split[S_E_LAST], edz, zero, hw)
    mem_first = state_first + act_first
    mem_last = state_last + act_last
    if mem_first >= mem_last:
        states, act = state_first, act_first
    else:
        states, act = state_last, act_last
    if act_mid > 0.0:
        state_mid = (memory.model_state_bytes(split[S_P_MID], dz, zero, hw) + split[S_GATHERED] + fp8_mid
                     + memory.model_state_bytes(split[S_E_MID], edz, zero, hw))
        if state_mid + act_mid > states + act:     # uneven stages: the second may be the fullest
            states, act = state_mid, act_mid
    mem_total = states + act + hw[H_RESERVED_BYTES]
    if mem_total > hw[H_HBM_BYTES]:
        status = OUT_OF_MEMORY

    # ---- throughput, utilisation, totals
    tokens_iter = B * s
    fwd_flops = totals[T_FWD_FLOPS]
    model_flops = 3.0 * tokens_iter * fwd_flops
    hw_flops = (model_flops + rc * tokens_iter * (fwd_flops - 2.0 * h * v)
                + sel * tokens_iter * L * ATTENTION_FLOPS_PER_TOKEN_PER_S_H * s * h)
    steps = math.ceil(num_tokens / tokens_iter) + loss_scale_skipped_steps(num_tokens / tokens_iter, hw)
    train_s = steps * iteration
    gpu_hours = num_gpus * train_s * (1.0 / 3600.0)
    # rates multiply by reciprocals instead of dividing (a few ulp from tests/reference.py)
    per_iteration = 1.0 / iteration
    per_peak = 1.0 / (num_gpus * hw[H_PEAK_FLOPS])

    out[O_ITER, i] = iteration
    out[O_TOKENS_PER_S, i] = tokens_iter * per_iteration
    out[O_TFLOPS, i] = model_flops * per_iteration * (1.0 / (num_gpus * 1e12))
    out[O_MFU, i] = model_flops * per_iteration * per_peak
    out[O_HFU, i] = hw_flops * per_iteration * per_peak
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
    out[O_PARAMS, i] = totals[T_PARAMS]
    out[O_MICRO, i] = m
    out[O_STEPS, i] = steps
    out[O_DAYS, i] = train_s * (1.0 / SECONDS_PER_DAY)
    out[O_GPU_HOURS, i] = gpu_hours
    out[O_COST, i] = gpu_hours * hw[H_USD_PER_GPU_HOUR]
    out[O_ENERGY, i] = gpu_hours * hw[H_TDP_W] * 1e-3 * hw[H_PUE]
    out[O_LOSS, i] = totals[T_LOSS]
    out[O_CP, i] = cp_comm_s
    out[O_EP, i] = ep_comm_s
    out[O_OFFLOAD, i] = offload_s
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
    if hw[H_PRECISION] != PRECISION_FP16:
        return 0.0
    return FP16_INITIAL_SKIPPED_STEPS + math.ceil(FP16_SKIPPED_PER_WINDOW * updates / FP16_LOSS_SCALE_WINDOW)


@jit
def step(L, h, a, g, f, v, s, B, b, lay, recompute, num_tokens, hw, out, i, arch=DEFAULT_ARCH):
    """Evaluate one configuration and write its outputs into column ``i`` of ``out``.

    Composition: :func:`validate_shape`, then :func:`micro_batch_costs`, :func:`split_costs`
    and :func:`model_totals`, then :func:`schedule`. The sweep drivers call the same parts but
    reuse the first three across the points that share them.

    Parameters
    ----------
    L, h, a, g, f, v, s : int
        num_layers, hidden_size, num_attention_heads, num_query_groups, ffn_hidden_size,
        vocab_size, seq_length.
    B, b : int
        global_batch_size, micro_batch_size (sequences).
    lay : Layout
        Parallel layout (:mod:`vtrain_fast.model.layout`); ``num_gpus`` is its world size.
    recompute : int
        ``RECOMPUTE_NONE`` (0), ``RECOMPUTE_FULL`` (1) or ``RECOMPUTE_SELECTIVE`` (2); see
        :func:`schedule`.
    num_tokens : float
        Tokens to train on.
    hw : numpy.ndarray
        Machine vector, ``float64``, shape ``(NUM_HW_FIELDS,)``.
    out : numpy.ndarray
        ``float64``, shape ``(NUM_OUTPUTS, n)``; column ``i`` is written, laid out as
        :data:`OUTPUT_NAMES`.
    i : int
        Column to write.
    arch : Arch
        The model's architecture flags (:mod:`vtrain_fast.model.arch`; default: Megatron-LM's GPT
        layer, a GeLU MLP, LayerNorm, learned positions, biases and a tied head).

    Returns
    -------
    int
        Status code (``OK``, ``OUT_OF_MEMORY`` or a shape error). Never raises; rows with a
        shape error are NaN.
    """
    status = validate_split(L, h, a, g, f, v, s, lay, hw, arch)
    if status == OK and (refused_context_parallel(lay, hw) or refused_experts(lay, hw, arch)):
        status = REFUSED                # a settings rule, before the batch rule (as sweeps check it)
    status = validate_batch(status, B, b, lay.dp)
    if status == OK:
        status = validate_interleaving(L, B, b, lay.pp, lay.dp, hw)
    if status != OK:
        fill_nan(out, i)
        return status
    L = float(L); h = float(h); a = float(a); g = float(g); f = float(f); v = float(v)
    s = float(s); B = float(B); b = float(b)
    return schedule(L, h, s, v, B, b, lay, recompute, num_tokens, hw,
                    micro_batch_costs(b, s, h, a, g, f, v, float(lay.tp), hw, arch, float(lay.cp)),
                    split_costs(L, h, a, g, f, v, s, lay, hw, arch),
                    model_totals(L, h, a, g, f, v, s, num_tokens, arch), out, i)
