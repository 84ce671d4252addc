"""Layouts every kernel reads: the machine vector, the output rows, the status codes and the
constants of the loss column's fit (no Numba here, so that the spec, schema and query modules,
and the loss fits of :mod:`vtrain_fast.plan.loss`, load without it).

A machine vector is a ``float64`` array of shape ``(NUM_HW_FIELDS,)`` holding one GPU type's
hardware numbers (SI units) and its calibrated efficiencies. Kernels index it with the
integer constants below, which Numba folds into the compiled code.
Field meanings, units and sources live in :mod:`vtrain_fast.hardware.gpus`.
"""
from __future__ import annotations

from .arch import ARCH_NAMES
from .moe import KERNEL_NAMES as MOE_NAMES
from .settings import BY_NAME, SETTINGS

# Hardware, price and calibration fields, then one field per training setting (its registry name,
# vtrain_fast.model.settings, in registry order: 1.0/0.0 for a switch, the value of vpp, the index
# of the value among its choices for a str setting: Setting.encode), then the
# sweep's bookkeeping.
HARDWARE_FIELDS = (
    "peak_flops",             # dense fp16/bf16 tensor-core FLOP/s
    "hbm_bytes",              # HBM capacity, bytes
    "hbm_Bps",                # HBM bandwidth, bytes/s
    "intra_node_Bps",         # GPU-to-GPU bandwidth per GPU per direction in a node (NVLink, IF, PCIe), bytes/s
    "inter_node_Bps",         # NIC bandwidth per GPU per direction, bytes/s
    "gpus_per_node",          # GPUs sharing one node (NVLink/NVSwitch, Infinity Fabric or PCIe domain)
    "num_sms",                # streaming multiprocessors (GEMM SM occupancy)
    "tdp_W",                  # board power, watts
    "usd_per_gpu_hour",       # price, US dollars per GPU-hour
    "pue",                    # data-centre power usage effectiveness (energy multiplier)
    "gemm_efficiency",        # achievable fraction of peak_flops for large GEMMs
    "hbm_efficiency",         # achievable fraction of hbm_Bps for streaming kernels
    "kernel_overhead_s",      # launch + idle gap per kernel, seconds
    "intra_node_efficiency",  # nccl busbw / intra_node_Bps for large messages
    "inter_node_efficiency",  # nccl busbw / inter_node_Bps for large messages
    "intra_node_latency_s",   # fixed latency of an intra-node collective or send, seconds
    "inter_node_latency_s",   # fixed latency of an inter-node collective or send, seconds
    "reserved_bytes",         # memory taken by CUDA context, NCCL and allocator, bytes
    "intra_node_step_latency_s",  # extra latency per ring step inside a node, seconds
    "inter_node_step_latency_s",  # extra latency per ring step across nodes, seconds
    "host_launch_s",          # host (CPU) time per launched kernel, seconds
    "iteration_overhead_s",   # fixed host time per iteration (loss scaling, clipping, logging), s
    "p2p_overhead_s",         # host/synchronisation time of one pipeline send or receive, s
    "flash_attention_efficiency",  # achievable fraction of peak_flops of the FlashAttention kernels
    "peak_fp8_flops",         # dense fp8 tensor-core FLOP/s (0: no FP8 tensor cores)
    "fp8_gemm_efficiency",    # achievable fraction of peak_fp8_flops for large FP8 GEMMs (0: none)
    "host_link_Bps",          # GPU-to-host (CPU memory) bandwidth per GPU per direction, bytes/s (PCIe)
    "host_memory_Bps",        # host memory bandwidth one GPU's CPU optimizer step gets, bytes/s
    "peak_tf32_flops",        # dense TF32 tensor-core FLOP/s (0: no TF32 tensor cores)
    "peak_fp32_flops",        # dense FP32 GEMM FLOP/s without TF32 (NVIDIA CUDA cores, AMD FP32 matrix; 0: not given)
    "host_cores_per_gpu",     # physical CPU cores one GPU's CPU optimizer step gets
    "cpu_adam_params_per_s_per_core",  # parameters one CPU core steps through CPU Adam per second
)
HW_FIELDS = (
    *HARDWARE_FIELDS,
    *(st.name for st in SETTINGS),
    "repeat_cases",           # sweep bookkeeping: bit (tp>1) + 2 (pp>1) + 4 (dp*cp>1) + 8 (cp>1) set where this machine
                              # repeats an earlier one of the sweep (model.rules.repeats); 0 outside sweeps
    "refused_cases",          # sweep bookkeeping: the same bits, set where Megatron-LM refuses this machine's
                              # settings on such plans (model.rules.refused); 0 outside sweeps
)
NUM_HW_FIELDS = len(HW_FIELDS)


def hw_index(name: str) -> int:
    """Row of field ``name`` in a machine vector (a compile-time constant for the kernels).

    Raises
    ------
    ValueError
        ``name`` is not a field of :data:`HW_FIELDS`.
    """
    return HW_FIELDS.index(name)


(H_PEAK_FLOPS, H_HBM_BYTES, H_HBM_BPS, H_INTRA_BPS, H_INTER_BPS, H_GPUS_PER_NODE, H_NUM_SMS,
 H_TDP_W, H_USD_PER_GPU_HOUR, H_PUE, H_GEMM_EFF, H_HBM_EFF, H_KERNEL_OVERHEAD_S, H_INTRA_EFF,
 H_INTER_EFF, H_INTRA_LAT_S, H_INTER_LAT_S, H_RESERVED_BYTES, H_INTRA_STEP_S, H_INTER_STEP_S,
 H_HOST_LAUNCH_S, H_ITER_OVERHEAD_S, H_P2P_OVERHEAD_S, H_FLASH_EFF, H_PEAK_FP8_FLOPS,
 H_FP8_GEMM_EFF, H_HOST_LINK_BPS, H_HOST_MEM_BPS, H_PEAK_TF32_FLOPS, H_PEAK_FP32_FLOPS, H_HOST_CORES,
 H_CPU_ADAM_RATE) = range(len(HARDWARE_FIELDS))
# The settings the cost formulas read (a new setting's formula takes its own hw_index)
H_DP_OVERLAP = hw_index("overlap_grad_reduce")        # 1: DP all-reduce hidden behind backward
H_OPT_SHARD = hw_index("distributed_optimizer")       # 1: Adam states sharded over DP (ZeRO-1)
H_FLASH_ATTN = hw_index("use_flash_attn")             # 1: fused FlashAttention-2 attention core
H_SEQ_PAR = hw_index("sequence_parallel")             # 1: Megatron sequence parallelism
H_TP_OVERLAP = hw_index("async_tensor_model_parallel_allreduce")  # 1: backward TP exchange overlapped
H_VPP = hw_index("vpp")                               # virtual pipeline stages per device
H_ZERO_STAGE = hw_index("zero_stage")                 # 0-3: what is sharded over DP (ZeRO stage)
H_DP_SHARD = hw_index("dp_shard")                     # ranks of one shard group (0: all of dp x cp)
H_PRECISION_AWARE = hw_index("use_precision_aware_optimizer")  # 1: TE FusedAdam, low-precision states
H_EXP_AVG = hw_index("exp_avg_dtype")                  # code of Adam's first moment's dtype
H_EXP_AVG_SQ = hw_index("exp_avg_sq_dtype")            # code of its second moment's dtype
H_CPU_OFFLOAD = hw_index("optimizer_cpu_offload")      # 1: (part of) the optimizer on the CPU
H_OFFLOAD_FRACTION = hw_index("optimizer_offload_fraction")  # its share of the parameters, 0-1
H_OFFLOAD_OVERLAP = hw_index("overlap_cpu_optimizer_d2h_h2d")  # 1: copies overlap the CPU step

H_PRECISION = hw_index("precision")                   # index of the precision among its choices
PRECISION_FP8 = BY_NAME["precision"].encode("fp8")    # H_PRECISION's value for fp8 (Transformer Engine)
PRECISION_BF16 = BY_NAME["precision"].encode("bf16")  # H_PRECISION's value for bf16
PRECISION_FP16 = BY_NAME["precision"].encode("fp16")  # fp16 with dynamic loss scaling
PRECISION_FP32 = BY_NAME["precision"].encode("fp32")  # fp32, GEMMs without TF32
PRECISION_TF32 = BY_NAME["precision"].encode("tf32")  # fp32 with TF32 tensor-core GEMMs
H_FP8_RECIPE = hw_index("fp8_recipe")                # index of the FP8 scaling recipe among its choices
FP8_TENSORWISE = BY_NAME["fp8_recipe"].encode("tensorwise")   # H_FP8_RECIPE's value for current scaling
FP8_MXFP8 = BY_NAME["fp8_recipe"].encode("mxfp8")     # H_FP8_RECIPE's value for MXFP8 block scaling
H_CP_COMM = hw_index("cp_comm_type")                  # index of the context-parallel exchange among its choices
CP_ALL_GATHER = BY_NAME["cp_comm_type"].encode("all_gather")   # H_CP_COMM's value for the all-gather variant
H_REPEAT_CASES = hw_index("repeat_cases")
H_REFUSED_CASES = hw_index("refused_cases")

# Fields a calibration may change (a handful of global numbers per GPU type).
CALIBRATION_FIELDS = (
    "gemm_efficiency", "hbm_efficiency", "kernel_overhead_s", "intra_node_efficiency",
    "inter_node_efficiency", "intra_node_latency_s", "inter_node_latency_s",
    "intra_node_step_latency_s", "inter_node_step_latency_s", "host_launch_s",
    "iteration_overhead_s", "p2p_overhead_s", "flash_attention_efficiency", "fp8_gemm_efficiency",
)


# Model layout: column k of the int64 model table the sweep kernels read (one row per model): the
# sizes, then one column per architecture flag (vtrain_fast.model.arch, its ArchFlag.encode code:
# gated_mlp 1 for a SwiGLU MLP, normalization 1 for RMSNorm, ...), in registry order, then the
# MoE columns (vtrain_fast.model.moe.KERNEL_NAMES; a dense model: num_experts 0).
MODEL_SIZES = ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups",
               "ffn_hidden_size", "vocab_size", "seq_length")
MODEL_FIELDS = MODEL_SIZES + ARCH_NAMES + MOE_NAMES
NUM_MODEL_FIELDS = len(MODEL_FIELDS)
(MD_LAYERS, MD_HIDDEN, MD_HEADS, MD_GROUPS, MD_FFN, MD_VOCAB, MD_SEQ) = range(len(MODEL_SIZES))
MD_ARCH = len(MODEL_SIZES)       # first architecture column (Arch(*row[MD_ARCH:]))
NUM_ARCH = len(ARCH_NAMES)
MD_MOE = MD_ARCH + NUM_ARCH      # first MoE column (the kernels' Arch record: row[MD_ARCH:MD_ARCH + NUM_RECORD])
NUM_MOE = len(MOE_NAMES)
NUM_RECORD = NUM_ARCH + NUM_MOE
# Row layout of the explicit configurations evaluate_rows walks (int64 matrix, one column each).
ROW_FIELDS = MODEL_FIELDS + ("global_batch_size", "micro_batch_size", "tp", "cp", "pp", "dp", "recompute")
(R_LAYERS, R_HIDDEN, R_HEADS, R_GROUPS, R_FFN, R_VOCAB, R_SEQ) = range(len(MODEL_SIZES))
R_ARCH = MD_ARCH
(R_GBS, R_MBS, R_TP, R_CP, R_PP, R_DP, R_RECOMPUTE) = range(NUM_MODEL_FIELDS, len(ROW_FIELDS))


# Output layout: row k of the float64 output matrix. vtrain_fast.io.schema describes each column.
OUTPUT_NAMES = (
    "iteration_time_s", "tokens_per_s", "model_tflops_per_gpu", "mfu", "hfu",
    "memory_per_gpu_GiB", "model_states_GiB", "activations_GiB",
    "compute_s", "tp_comm_s", "pp_comm_s", "dp_comm_s", "bubble_s", "optimizer_s", "overhead_s",
    "num_parameters", "num_micro_batches", "num_steps",
    "train_days", "gpu_hours", "cost_usd", "energy_kWh", "loss",
    "cp_comm_s",              # added with context parallelism: last, so that the rows before it keep their index
    "ep_comm_s",              # added with expert parallelism (MoE token dispatch and combine)
    "offload_s",              # added with activation and parameter offloading (exposed GPU<->host copies)
)
NUM_OUTPUTS = len(OUTPUT_NAMES)
# Outputs added after results folders were first written: an older file lacks exactly these.
LATE_OUTPUTS = ("cp_comm_s", "ep_comm_s", "offload_s")
(O_ITER, O_TOKENS_PER_S, O_TFLOPS, O_MFU, O_HFU, O_MEM, O_STATES, O_ACT, O_COMPUTE, O_TP, O_PP,
 O_DP, O_BUBBLE, O_OPT, O_OVERHEAD, O_PARAMS, O_MICRO, O_STEPS, O_DAYS, O_GPU_HOURS, O_COST, O_ENERGY,
 O_LOSS, O_CP, O_EP, O_OFFLOAD) = range(NUM_OUTPUTS)

# Status codes, one per row. vtrain_fast.io.schema.STATUS_LABELS names them.
OK = 0
BAD_INPUT = 1        # a size is zero or negative
BAD_NUM_GPUS = 2     # num_gpus not divisible by tp * cp * pp (model.layout.split_world), or with sharding
                     # dp * cp not divisible by dp_shard, or (MoE) tp * cp * dp not divisible by etp * ep
BAD_HEADS = 3        # heads or query groups not divisible by tp, or hidden by heads, or (MoE) num_experts
                     # not divisible by ep
BAD_LAYERS = 4       # the layers do not split over pp stages (model.layer_split.stage_layers; into vpp chunks each
                     # when interleaved)
BAD_BATCH = 5        # global_batch_size not divisible by dp * micro_batch_size (interleaved:
                     # micro-batches per pipeline not divisible by pp)
OUT_OF_MEMORY = 6    # the configuration does not fit in HBM (times are still computed)
REPEAT = 7           # the same plan as a row of an earlier machine of the sweep: a training
                     # setting that differs has no effect at this tp, pp, dp (see repeats)
REFUSED = 8          # Megatron-LM refuses the settings on this plan (cp > 1 without FlashAttention; ep > 1
                     # at tp > 1 without sequence parallelism), or a setting needs one it switches off here (tp_comm_overlap at tp = 1; see refused)
BAD_SEQ_LENGTH = 9   # seq_length not divisible by 2 * cp (context parallelism's load-balanced chunks)
NUM_STATUS = 10

# Activation recomputation codes (the index of the name in plan.spec.RECOMPUTE_VALUES).
RECOMPUTE_NONE, RECOMPUTE_FULL, RECOMPUTE_SELECTIVE = 0, 1, 2

# The loss column: Chinchilla's parametric loss L(N, D) = E + A / N^alpha + B / D^beta
# (Hoffmann et al. 2022, "Training Compute-Optimal Large Language Models", Eq. 10, Approach 3).
CHINCHILLA_E, CHINCHILLA_A, CHINCHILLA_B = 1.69, 406.4, 410.7
CHINCHILLA_ALPHA, CHINCHILLA_BETA = 0.34, 0.28
