"""GPU presets: hardware numbers with their sources, plus default calibration values.

Every number carries its source and the date of that source. Units are in the names and
all values are converted to SI units (bytes, bytes/s, FLOP/s, seconds, watts) exactly once,
in :func:`machine_vector`.

Preset names are lower case: ``<gpu>-<form factor>-<memory>``.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from .kernels.params import CALIBRATION_FIELDS, HW_FIELDS, NUM_HW_FIELDS

GiB = 1024.0 ** 3


@dataclass(frozen=True)
class Calibration:
    """Global efficiencies of one GPU type (fitted by ``vtrain-fast calibrate``).

    Attributes
    ----------
    gemm_efficiency : float
        Achievable fraction of the dense tensor-core peak for large fp16/bf16 GEMMs, (0, 1].
    hbm_efficiency : float
        Achievable fraction of HBM bandwidth for streaming (memory-bound) kernels, (0, 1].
    kernel_overhead_s : float
        Launch plus idle time charged per kernel, seconds.
    intra_node_efficiency, inter_node_efficiency : float
        Large-message nccl-tests bus bandwidth divided by the link bandwidth, (0, 1].
    intra_node_latency_s, inter_node_latency_s : float
        Fixed latency of one collective or point-to-point send inside a node / across nodes,
        seconds.
    intra_node_step_latency_s, inter_node_step_latency_s : float
        Extra latency per ring step (an all-reduce over n ranks has 2(n-1) steps), seconds.
    host_launch_s : float
        Host (CPU) time per modelled kernel launch, including the framework's Python and
        autograd work around it; a layer phase takes the larger of its GPU time and its host
        time (eager PyTorch runs ahead of the GPU only while the GPU is the bottleneck).
    iteration_overhead_s : float
        Fixed host time per iteration (loss scaling, gradient clipping, logging), seconds.
    p2p_overhead_s : float
        Host and synchronisation time of one pipeline send or receive (the framework waits for
        each blocking point-to-point call), seconds.
    flash_attention_efficiency : float
        Achievable fraction of the dense tensor-core peak of the fused FlashAttention kernels,
        forward and backward together, [0, 1]; 0 means the GPU has no such kernel, and
        ``use_flash_attn`` is refused for it.
    """

    gemm_efficiency: float = 0.70
    hbm_efficiency: float = 0.80
    kernel_overhead_s: float = 5e-6
    intra_node_efficiency: float = 0.75
    inter_node_efficiency: float = 0.80
    intra_node_latency_s: float = 30e-6
    inter_node_latency_s: float = 30e-6
    intra_node_step_latency_s: float = 3e-6
    inter_node_step_latency_s: float = 5e-6
    host_launch_s: float = 0.0
    iteration_overhead_s: float = 0.0
    p2p_overhead_s: float = 0.0
    flash_attention_efficiency: float = 0.0


@dataclass(frozen=True)
class GPUPreset:
    """One GPU type as deployed in a typical node.

    Attributes
    ----------
    name : str
        Preset name, lower case.
    peak_tflops : float
        Dense fp16/bf16 tensor-core peak, 10^12 FLOP/s.
    hbm_GiB : float
        HBM capacity, GiB.
    hbm_GBps : float
        HBM bandwidth, 10^9 bytes/s.
    intra_node_GBps : float
        NVLink bandwidth per GPU per direction, 10^9 bytes/s.
    inter_node_Gbps : float
        Network (NIC) bandwidth per GPU, 10^9 bits/s.
    gpus_per_node : int
        GPUs in one NVLink/NVSwitch domain.
    num_sms : int
        Streaming multiprocessors.
    tdp_W : float
        Board power, watts.
    usd_per_gpu_hour : float
        Default rental price, US dollars per GPU-hour.
    source : str
        Where the numbers come from, with dates.
    pue : float
        Data-centre power usage effectiveness (energy multiplier), default 1.0.
    reserved_GiB : float
        Memory per GPU not available to the model (CUDA context, NCCL buffers, allocator
        slack), GiB; default 1.5. A sweep's ``[cluster] reserved_GiB`` raises it for headroom.
    calibration : Calibration
        Default efficiencies (see :class:`Calibration`).
    """

    name: str
    peak_tflops: float
    hbm_GiB: float
    hbm_GBps: float
    intra_node_GBps: float
    inter_node_Gbps: float
    gpus_per_node: int
    num_sms: int
    tdp_W: float
    usd_per_gpu_hour: float
    source: str
    pue: float = 1.0
    reserved_GiB: float = 1.5
    calibration: Calibration = field(default_factory=Calibration)
    calibrated: bool = False    # True when ``calibration`` was fitted to this GPU's measurements
    overlap_grad_reduce: bool = False   # software setting: DP all-reduce overlapped with backward
    distributed_optimizer: bool = False  # software setting: Adam states sharded over DP (ZeRO-1)
    use_flash_attn: bool = False        # software setting: fused FlashAttention-2 attention core
    sequence_parallel: bool = False     # software setting: Megatron sequence parallelism
    vpp: int = 1                        # software setting: virtual pipeline stages (interleaved 1F1B)
    async_tensor_model_parallel_allreduce: bool = False  # software setting: backward TP exchange
    #                                     overlapped with the weight-gradient GEMMs (Megatron-LM)


# Achievable large-GEMM fraction of the dense bf16 peak, measured by a matmul shape search
# (Maximum Achievable Matmul FLOPS): A100 SXM 267.9 of 312 TFLOPS = 85.9% (CUDA 12.1), H100 SXM
# 792.1 of 989 TFLOPS = 80.1% (CUDA 12.1). Source: S. Bekman, "Machine Learning Engineering",
# compute/accelerator/README.md, "Maximum Achievable Matmul FLOPS comparison table"
# (github.com/stas00/ml-engineering, table as of 2024). Pinned, not fitted: vTrain's single-node
# set (h <= 2048, s = 1024) cannot separate GEMM efficiency from per-kernel overheads; fitting it
# there gave 0.94 (former wave-sawtooth GEMM model) or 0.878 (current), values the data do not pin.
A100_GEMM_EFFICIENCY = 0.859
H100_GEMM_EFFICIENCY = 0.801

# FlashAttention-2 kernels, forward + backward, as a fraction of the dense bf16 peak. Source: T. Dao,
# "FlashAttention-2: Faster Attention with Better Parallelism and Work Partitioning", arXiv:2307.08691
# (2023-07): 50-73% of the A100's peak (abstract); we take 0.55, near the low end, because the
# backward pass carries 2.5 of every 3.5 FLOPs and is the slower one. H100: the same kernels reach up
# to 335 TFLOPS forward + backward (Sec. 4.1), 0.34 of 989; newer kernels (FlashAttention-3, cuDNN)
# are faster: set flash_attention_efficiency in a calibration file. Not fitted: vTrain's
# measurements do not use FlashAttention. V100: no FlashAttention-2 kernel (Ampere or newer), 0.
A100_FLASH_ATTENTION_EFFICIENCY = 0.55
H100_FLASH_ATTENTION_EFFICIENCY = 0.34

# A100 efficiencies: `make calibrate` on 2026-11-30 — NCCL all-reduce tables of vTrain's A100 node
# (calibrate-nccl: busbw efficiency 0.726 of 300 GB/s NVLink, fit MAPE 4.2%) and a least-squares
# fit of seven parameters (gemm_efficiency pinned above) to vTrain's 1,440 single-node
# Megatron-DeepSpeed iteration times only (MAPE 6.23% after the fit; 6.52% before the
# fused-softmax rule, ops.fused_softmax, and the gradient-accumulation traffic, step.schedule).
# The multi-node set was not used: its error is a held-out result. Values are the fit's, unrounded,
# so `--calibration results/calibration-a100.toml` after `make calibrate` gives identical rows.
A100_CALIBRATION = Calibration(
    gemm_efficiency=A100_GEMM_EFFICIENCY, hbm_efficiency=0.8497001873507571,
    kernel_overhead_s=2.7522124224977285e-05,
    intra_node_efficiency=0.7263400082650625, inter_node_efficiency=0.80,
    intra_node_latency_s=0.0, inter_node_latency_s=30e-6,
    intra_node_step_latency_s=5.302994886789728e-06, inter_node_step_latency_s=5e-6,
    host_launch_s=5.957375899802553e-05, iteration_overhead_s=0.0,
    p2p_overhead_s=0.0009468835578292786, flash_attention_efficiency=A100_FLASH_ATTENTION_EFFICIENCY,
)
# Other GPUs: no measurements here. Software-stack terms (host launch, per-kernel gap,
# per-iteration overhead, pipeline send/receive overhead, NCCL latencies) come from the A100 fit;
# the efficiencies are typical published fractions (assumptions, not fits; the H100's GEMM
# efficiency is its published matmul benchmark above) until `vtrain-fast calibrate` is run on the
# GPU's own measurements.
_UNCALIBRATED = Calibration(
    kernel_overhead_s=A100_CALIBRATION.kernel_overhead_s, host_launch_s=A100_CALIBRATION.host_launch_s,
    iteration_overhead_s=A100_CALIBRATION.iteration_overhead_s,
    p2p_overhead_s=A100_CALIBRATION.p2p_overhead_s,
    intra_node_latency_s=A100_CALIBRATION.intra_node_latency_s,
    intra_node_step_latency_s=A100_CALIBRATION.intra_node_step_latency_s,
)

_A100_SRC = (
    "NVIDIA A100 Tensor Core GPU datasheet (2021-06): 312 TFLOPS dense FP16/BF16 tensor core, "
    "40 GB HBM2 at 1,555 GB/s or 80 GB HBM2e at 2,039 GB/s, NVLink 600 GB/s (300 GB/s per "
    "direction), 400 W SXM; NVIDIA A100 whitepaper (2020): 108 SMs; NVIDIA DGX A100 user guide "
    "(2020): 8 GPUs per node, one 200 Gb/s HDR InfiniBand adapter per GPU; price: typical cloud "
    "on-demand list price 2025 (approximate; override per sweep)."
)
# The "80 GB" H100 reports 81,559 MiB to CUDA (nvidia-smi "81559MiB" on H100 80GB HBM3 SXM5); the
# A100 80 GB reports 81,920 MiB = 80 GiB and the 40 GB model 40,960 MiB = 40 GiB.
H100_USABLE_GiB = 81559.0 / 1024.0
_H100_SRC = (
    "NVIDIA H100 Tensor Core GPU datasheet (2023): 989.4 TFLOPS dense FP16/BF16 tensor core "
    "(1,979 with sparsity), 80 GB HBM3 at 3.35 TB/s, NVLink 900 GB/s (450 GB/s per direction), "
    "up to 700 W; NVIDIA H100 whitepaper (2022): 132 SMs (SXM5); NVIDIA DGX H100 user guide "
    "(2023): 8 GPUs per node, one 400 Gb/s ConnectX-7 adapter per GPU; price: typical cloud "
    "on-demand list price 2025 (approximate; override per sweep)."
)
_V100_SRC = (
    "NVIDIA Tesla V100 datasheet (2018): 125 TFLOPS FP16 tensor core, 32 GB HBM2 at 900 GB/s, "
    "NVLink 300 GB/s (150 GB/s per direction), 300 W SXM2; Volta whitepaper (2017): 80 SMs; "
    "NVIDIA DGX-1 (2018): 8 GPUs per node, 4 x 100 Gb/s EDR InfiniBand per node (25 Gb/s per GPU); "
    "price: typical cloud on-demand list price 2025 (approximate; override per sweep)."
)

PRESETS: dict[str, GPUPreset] = {
    p.name: p
    for p in (
        GPUPreset("a100-sxm4-40gb", 312.0, 40.0, 1555.0, 300.0, 200.0, 8, 108, 400.0, 1.29,
                  _A100_SRC, calibration=A100_CALIBRATION, calibrated=True),
        GPUPreset("a100-sxm4-80gb", 312.0, 80.0, 2039.0, 300.0, 200.0, 8, 108, 400.0, 1.79,
                  _A100_SRC, calibration=A100_CALIBRATION, calibrated=True),
        GPUPreset("h100-sxm-80gb", 989.4, H100_USABLE_GiB, 3350.0, 450.0, 400.0, 8, 132, 700.0, 2.99,
                  _H100_SRC, calibration=replace(_UNCALIBRATED, gemm_efficiency=H100_GEMM_EFFICIENCY,
                                                      flash_attention_efficiency=H100_FLASH_ATTENTION_EFFICIENCY)),
        GPUPreset("v100-sxm2-32gb", 125.0, 32.0, 900.0, 150.0, 25.0, 8, 80, 300.0, 0.80,
                  _V100_SRC, calibration=_UNCALIBRATED),
    )
}

# Keys a sweep spec, a CSV row or a calibration file may override, with their allowed range.
OVERRIDE_RANGES: dict[str, tuple[float, float]] = {
    "gpus_per_node": (1, 1024),
    "intra_node_GBps": (0.1, 1e5),
    "inter_node_Gbps": (0.1, 1e6),
    "usd_per_gpu_hour": (0.0, 1e4),
    "pue": (1.0, 5.0),
    "reserved_GiB": (0.0, 1024.0),
}
CALIBRATION_RANGES: dict[str, tuple[float, float]] = {
    "gemm_efficiency": (0.01, 1.0),
    "hbm_efficiency": (0.01, 1.0),
    "kernel_overhead_s": (0.0, 1e-3),
    "intra_node_efficiency": (0.01, 1.0),
    "inter_node_efficiency": (0.01, 1.0),
    "intra_node_latency_s": (0.0, 1e-2),
    "inter_node_latency_s": (0.0, 1e-2),
    "intra_node_step_latency_s": (0.0, 1e-3),
    "inter_node_step_latency_s": (0.0, 1e-3),
    "host_launch_s": (0.0, 1e-3),
    "iteration_overhead_s": (0.0, 10.0),
    "p2p_overhead_s": (0.0, 0.1),
    "flash_attention_efficiency": (0.0, 1.0),
}


def get_preset(name: str) -> GPUPreset:
    """Return the preset called ``name``.

    Raises
    ------
    KeyError
        If ``name`` is not a preset; the message lists the known names.
    """
    try:
        return PRESETS[name]
    except KeyError:
        raise KeyError(f"unknown GPU preset {name!r}; known presets: {', '.join(PRESETS)}") from None


def with_overrides(preset: GPUPreset, calibration: Calibration | None = None, **overrides) -> GPUPreset:
    """Return a copy of ``preset`` with cluster overrides (keys of ``OVERRIDE_RANGES``) and an
    optional calibration applied. ``None`` values are ignored."""
    clean = {k: v for k, v in overrides.items() if v is not None}
    if calibration is not None:
        clean["calibration"] = calibration
        clean["calibrated"] = True
    return replace(preset, **clean) if clean else preset


def machine_vector(preset: GPUPreset) -> np.ndarray:
    """Convert a preset to the kernel's machine vector.

    Returns
    -------
    numpy.ndarray
        ``float64``, shape ``(NUM_HW_FIELDS,)``, SI units, laid out as
        :data:`vtrain_fast.kernels.params.HW_FIELDS`.
    """
    c = preset.calibration
    values = {
        "peak_flops": preset.peak_tflops * 1e12,
        "hbm_bytes": preset.hbm_GiB * GiB,
        "hbm_Bps": preset.hbm_GBps * 1e9,
        "intra_node_Bps": preset.intra_node_GBps * 1e9,
        "inter_node_Bps": preset.inter_node_Gbps * 1e9 / 8.0,
        "gpus_per_node": float(preset.gpus_per_node),
        "num_sms": float(preset.num_sms),
        "tdp_W": preset.tdp_W,
        "usd_per_gpu_hour": preset.usd_per_gpu_hour,
        "pue": preset.pue,
        "reserved_bytes": preset.reserved_GiB * GiB,
        "dp_overlap": 1.0 if preset.overlap_grad_reduce else 0.0,
        "optimizer_sharding": 1.0 if preset.distributed_optimizer else 0.0,
        "flash_attn": 1.0 if preset.use_flash_attn else 0.0,
        "sequence_parallel": 1.0 if preset.sequence_parallel else 0.0,
        "vpp": float(preset.vpp),
        "tp_overlap": 1.0 if preset.async_tensor_model_parallel_allreduce else 0.0,
        "repeat_cases": 0.0,    # set by grid.build_grid for the machines of a sweep
    }
    for name in CALIBRATION_FIELDS:
        values[name] = float(getattr(c, name))
    vec = np.empty(NUM_HW_FIELDS, dtype=np.float64)
    for i, name in enumerate(HW_FIELDS):
        vec[i] = values[name]
    return vec
