"""The kernels' records, each named once: the machine vector, the model table, explicit rows, the
per-micro-batch, per-split and per-stage costs, the model totals, the sweep's axes, input and output
rows, the status codes and the constants of the loss column's fit. No Numba here, so that the spec,
schema and query modules, and the loss fits of :mod:`vtrain_fast.plan.loss`, load without it.

A machine vector is a ``float64`` array of shape ``(NUM_HW_FIELDS,)`` holding one GPU type's
hardware numbers (SI units), its calibrated efficiencies and one value per training setting;
kernels read it by field name through the index record :data:`MACHINE`
(``hw[MACHINE.peak_flops]``), which Numba folds into the compiled code. The kernels pass their
parts to one another as value records (:class:`MicroCosts`, :class:`SplitCosts`,
:class:`StageCosts`, :class:`Totals`) built by keyword and read by field. Field meanings, units
and sources of the hardware live in :mod:`vtrain_fast.hardware.gpus`; of the settings in
:mod:`vtrain_fast.model.settings`.
"""
from __future__ import annotations

from collections import namedtuple

from .arch import ARCH_NAMES, Arch
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
    """Row of field ``name`` in a machine vector (Python code; a kernel reads ``MACHINE.<name>``).

    Raises
    ------
    ValueError
        ``name`` is not a field of :data:`HW_FIELDS`.
    """
    return HW_FIELDS.index(name)


# Codes of the str settings' values the cost formulas compare against (Setting.encode); a
# formula reads a setting itself as hw[MACHINE.<setting name>].
PRECISION_FP8 = BY_NAME["precision"].encode("fp8")    # MACHINE.precision's value for fp8 (Transformer Engine)
PRECISION_BF16 = BY_NAME["precision"].encode("bf16")  # MACHINE.precision's value for bf16
PRECISION_FP16 = BY_NAME["precision"].encode("fp16")  # fp16 with dynamic loss scaling
PRECISION_FP32 = BY_NAME["precision"].encode("fp32")  # fp32, GEMMs without TF32
PRECISION_TF32 = BY_NAME["precision"].encode("tf32")  # fp32 with TF32 tensor-core GEMMs
FP8_TENSORWISE = BY_NAME["fp8_recipe"].encode("tensorwise")   # MACHINE.fp8_recipe's value for current scaling
FP8_MXFP8 = BY_NAME["fp8_recipe"].encode("mxfp8")     # MACHINE.fp8_recipe's value for MXFP8 block scaling
CP_ALL_GATHER = BY_NAME["cp_comm_type"].encode("all_gather")   # MACHINE.cp_comm_type's value for the all-gather variant

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
# Row layout of the explicit configurations evaluate_rows walks (int64 matrix, one column each).
ROW_FIELDS = MODEL_FIELDS + ("global_batch_size", "micro_batch_size", "tp", "cp", "pp", "dp", "recompute")


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

# Per-micro-batch costs (:func:`~vtrain_fast.model.costs.micro_batch_costs`), fixed by (model, machine,
# micro_batch_size, tp): the fields of :class:`MicroCosts`.
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

# Per-split costs (:func:`~vtrain_fast.model.costs.split_costs`), fixed by (model, machine, tp, pp, dp): the
# fields of :class:`SplitCosts`.
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
               "param_copy_embedding_s", "param_copy_head_s",
               "dp_gather_s", "zero3_layer_reduce_s", "zero3_embedding_reduce_s", "zero3_head_reduce_s")


NUM_SPLIT = len(SPLIT_NAMES)

# Per-stage per-micro-batch costs (:func:`~vtrain_fast.model.pipeline.stage_costs`), fixed by the configuration: the
# fields of :class:`StageCosts`.
STAGE_COST_NAMES = ("first_compute_s", "middle_compute_s", "last_compute_s", "embedding_compute_s", "head_compute_s",
                    "first_tp_s", "middle_tp_s", "last_tp_s", "embedding_tp_s", "head_tp_s",
                    "first_dp_s", "middle_dp_s", "last_dp_s", "embedding_dp_s", "head_dp_s",
                    "first_cp_s", "middle_cp_s", "last_cp_s", "first_ep_s", "last_ep_s",
                    "bf16_layer_compute_s", "bf16_layer_tp_s", "moe_layer_compute_s", "moe_layer_ep_s",
                    "moe_layer_tp_s", "pp_s", "dp_window_s", "first_offload_s", "middle_offload_s",
                    "last_offload_s")


NUM_STAGE_COSTS = len(STAGE_COST_NAMES)

# Per-model totals (:func:`~vtrain_fast.model.totals.model_totals`), fixed by (model, num_tokens): the fields of
# :class:`Totals`.
TOTAL_NAMES = ("num_parameters", "forward_flops_per_token", "loss")


NUM_TOTALS = len(TOTAL_NAMES)

# Axis order of a sweep (first = slowest varying, last = fastest).
AXES = ("model", "num_tokens", "gpu", "cluster_size", "tp", "cp", "pp", "micro_batch_size",
        "global_batch_size", "recompute")
NUM_AXES = len(AXES)

# Integer input columns written by the sweep kernels (vtrain_fast.model.sweep): rows of the int64 input matrix.
INPUT_NAMES = (
    "model_index", "gpu_index", *MODEL_FIELDS, "num_gpus", "num_nodes",
    "tp", "cp", "pp", "dp", "micro_batch_size", "global_batch_size", "recompute",
)
NUM_INPUTS = len(INPUT_NAMES)


# ---------------------------------------------------------------------------------------------
# The kernels' records. A layout above is a tuple of names; the record built from it is what the
# kernels read. Two kinds:
#
# * an index record, for rows and columns of the arrays the kernels share with Python (the machine
#   vector, the model table, explicit rows, the output and input matrices, the sweep axes): a
#   namedtuple whose field ``name`` holds that name's position, so a kernel reads
#   ``hw[MACHINE.peak_flops]`` or writes ``out[OUTPUT.mfu, i]``. Numba freezes the global record
#   and folds the position into the compiled code, as it did the integer constants before.
# * a value record, for the parts the kernels pass to one another (per-micro-batch, per-split and
#   per-stage costs, model totals): a namedtuple class; kernels build it by keyword and read it by
#   field (``mb.layer_forward_s``). It compiles to the same tuple as positional code.
#
# A new field goes into its layout tuple above; nothing else indexes it.
# ---------------------------------------------------------------------------------------------
def index_record(type_name: str, names: tuple[str, ...]):
    """The index record of layout ``names``: a namedtuple instance whose field ``names[k]`` is ``k``.

    Parameters
    ----------
    type_name : str
        Name of the namedtuple type (shown in Numba's typing errors).
    names : tuple of str
        The layout, one valid Python identifier per row, in row order.

    Returns
    -------
    tuple
        A namedtuple instance, ``len(names)`` integers ``0 .. len(names) - 1``.
    """
    return namedtuple(type_name, names)(*range(len(names)))


MACHINE = index_record("MachineField", HW_FIELDS)      # rows of a machine vector (hw[MACHINE.peak_flops])
MODEL = index_record("ModelField", MODEL_FIELDS)       # columns of the model table (models[i, MODEL.num_layers])
ROW = index_record("RowField", ROW_FIELDS)             # columns of an explicit configuration (rows[i, ROW.tp])
OUTPUT = index_record("OutputField", OUTPUT_NAMES)     # rows of the output matrix (out[OUTPUT.mfu, i])
INPUT = index_record("InputField", INPUT_NAMES)        # rows of the sweep's int64 input matrix (inputs[INPUT.tp, j])
AXIS = index_record("Axis", AXES)                      # sweep axes (radices[AXIS.tp], digits[AXIS.pp])



def arch_of_values(values, at=None) -> Arch:
    """The kernels' :data:`~vtrain_fast.model.arch.Arch` of one model's integer columns, by field name
    (the plain-Python form of :func:`vtrain_fast.model.sweep.arch_of`).

    Parameters
    ----------
    values : sequence of int
        A row of the model table (``len(MODEL_FIELDS)`` values or more), or one explicit
        configuration laid out as :data:`ROW_FIELDS`.
    at : tuple, optional
        The index record of that layout, :data:`MODEL` (default) or :data:`ROW`.
    """
    at = MODEL if at is None else at
    return Arch(*(float(values[getattr(at, name)]) for name in Arch._fields))


MicroCosts = namedtuple("MicroCosts", MICRO_NAMES)         # costs.micro_batch_costs
SplitCosts = namedtuple("SplitCosts", SPLIT_NAMES)         # costs.split_costs
StageCosts = namedtuple("StageCosts", STAGE_COST_NAMES)    # pipeline.stage_costs
Totals = namedtuple("Totals", TOTAL_NAMES)                 # totals.model_totals

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
