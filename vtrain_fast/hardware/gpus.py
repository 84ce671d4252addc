"""GPU presets: hardware numbers with their sources, plus default calibration values, read from
one TOML file per GPU in ``vtrain_fast/data/gpus/`` (a spec may add or change GPUs in
``[gpus.<name>]`` tables).

Every number carries its source and the date of that source. Units are in the names and
all values are converted to SI units (bytes, bytes/s, FLOP/s, seconds, watts) exactly once,
in :func:`machine_vector`.

Preset names are lower case: ``<gpu>-<form factor>-<memory>``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from ..io.errors import InputError, check_plain_name, did_you_mean
from ..io.inputs import read_toml
from ..model.records import CALIBRATION_FIELDS, HW_FIELDS, NUM_HW_FIELDS
from ..model.settings import SETTINGS, with_registry_fields

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
    fp8_gemm_efficiency : float
        Achievable fraction of the dense FP8 tensor-core peak (``peak_fp8_tflops``) for large FP8
        GEMMs (Transformer Engine's per-tensor-scaled cuBLASLt GEMMs), [0, 1]; 0 means no FP8
        GEMMs, and ``precision = fp8`` is refused for the GPU.
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
    fp8_gemm_efficiency: float = 0.0


@with_registry_fields(SETTINGS)         # one field per training setting (the registry's)
class GPUPreset:
    """One GPU type as deployed in a typical node, with the training settings it runs.

    Attributes
    ----------
    name : str
        Preset name, lower case.
    peak_tflops : float
        Dense bf16 tensor-core peak (``peak_bf16_tflops`` in a GPU file), 10^12 FLOP/s: the peak
        the cost model charges GEMMs at.
    hbm_GiB : float
        HBM capacity, GiB.
    hbm_GBps : float
        HBM bandwidth, 10^9 bytes/s.
    intra_node_GBps : float
        Effective GPU-to-GPU bandwidth per GPU per direction inside a node, 10^9 bytes/s, the one
        figure the collectives and sends are charged at: NVLink's rate per direction
        (``intra_node_link = "nvlink"``), the sum over the links to the peers (``"infinity_fabric"``),
        or, on a PCIe node, derived from its link by :func:`pcie_intra_node_GBps`.
    intra_node_link : str
        What joins the GPUs of a node: ``"nvlink"`` (default), ``"pcie"`` or ``"infinity_fabric"``.
    pcie_gen, pcie_lanes : int
        The PCIe generation (3, 4, 5) and lanes per GPU of a PCIe node; 0 on other links.
    pcie_p2p : bool
        A PCIe node's GPUs reach each other peer to peer through a PCIe switch or the root complex
        (True), or every transfer bounces through host memory (False; GeForce cards).
    inter_node_Gbps : float
        Network (NIC) bandwidth per GPU, 10^9 bits/s.
    gpus_per_node : int
        GPUs in one scale-up (NVLink / NVSwitch / Infinity Fabric) domain: 8 for an HGX board,
        72 for a GB200 NVL72 rack.
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
    calibrated : bool
        True when ``calibration`` was fitted to this GPU's measurements.
    overlap_grad_reduce, distributed_optimizer, ..., vpp : bool or int
        The training settings, one field each, named, typed and defaulted by the registry
        (:data:`vtrain_fast.model.settings.SETTINGS`); a sweep's machines differ in them.
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
    peak_tf32_tflops: float = 0.0    # dense peaks of the other precisions, 10^12 FLOP/s (0: none)
    peak_fp16_tflops: float = 0.0
    peak_fp32_tflops: float = 0.0    # dense FP32 GEMM peak without TF32 (NVIDIA: CUDA cores; AMD: FP32 matrix)
    peak_fp8_tflops: float = 0.0
    peak_fp4_tflops: float = 0.0
    mxfp8_tensor_cores: int = 0      # 1: block-scaled MXFP8 GEMMs (Blackwell), at the FP8 rate
    vendor: str = ""
    intra_node_link: str = "nvlink"   # what joins the GPUs of a node (INTRA_NODE_LINKS)
    pcie_gen: int = 0                # a PCIe node's generation and lanes per GPU (0: another link)
    pcie_lanes: int = 0
    pcie_p2p: bool = True            # False: GPU-to-GPU copies bounce through host memory
    host_link_GBps: float = 0.0      # GPU-to-host bandwidth per GPU per direction (0: host_link_GBps())
    host_memory_GBps: float = 0.0    # host memory bandwidth per GPU for a CPU optimizer (0: host_memory_GBps())
    host_cores_per_gpu: float = 0.0  # physical CPU cores per GPU for a CPU optimizer (0: host_cores_per_gpu())
    cpu_adam_params_per_s_per_core: float = 0.0  # CPU Adam rate per core (0: cpu_adam_params_per_s_per_core())
    pue: float = 1.0
    reserved_GiB: float = 1.5
    calibration: Calibration = field(default_factory=Calibration)
    calibrated: bool = False    # True when ``calibration`` was fitted to this GPU's measurements
    # the training settings follow, one field each (_with_settings)


# ------------------------------------------------------------------------ presets as data files
# One TOML file per GPU in vtrain_fast/data/gpus/ (the format: a100-sxm4-80gb.toml). Every number
# is a table ``{ value, source, date }``; the ``[calibration]`` table holds the efficiencies (its
# ``base`` names a preset whose calibration fills the keys it does not give).
GPU_DATA_DIR = Path(__file__).resolve().parent.parent / "data" / "gpus"

# Keys a sweep spec, a CSV row or a calibration file may override, with their allowed range.
OVERRIDE_RANGES: dict[str, tuple[float, float]] = {
    "gpus_per_node": (1, 1024),
    "intra_node_GBps": (0.1, 1e5),
    "inter_node_Gbps": (0.1, 1e6),
    "usd_per_gpu_hour": (0.0, 1e4),
    "pue": (1.0, 5.0),
    "reserved_GiB": (0.0, 1024.0),
}
# Preset fields a GPU file gives (all required), and optional ones, with their allowed range.
GPU_FIELD_RANGES: dict[str, tuple[float, float]] = {
    "peak_bf16_tflops": (1.0, 1e6),
    "hbm_GiB": (1.0, 1e5),
    "hbm_GBps": (1.0, 1e6),
    "num_sms": (1, 10_000),
    "tdp_W": (1.0, 1e5),
    **{k: OVERRIDE_RANGES[k] for k in ("intra_node_GBps", "gpus_per_node", "inter_node_Gbps", "usd_per_gpu_hour")},
}
OPTIONAL_GPU_FIELD_RANGES: dict[str, tuple[float, float]] = {
    "peak_tf32_tflops": (0.0, 1e6),
    "peak_fp16_tflops": (0.0, 1e6),
    "peak_fp32_tflops": (0.0, 1e6),
    "peak_fp8_tflops": (0.0, 1e6),
    "peak_fp4_tflops": (0.0, 1e6),
    "mxfp8_tensor_cores": (0, 1),
    **{k: OVERRIDE_RANGES[k] for k in ("pue", "reserved_GiB")},
    "host_link_GBps": (0.0, 1e4),          # 0: host_link_GBps() derives it
    "host_memory_GBps": (0.0, 1e5),        # 0: host_memory_GBps() derives it
    "host_cores_per_gpu": (0.0, 1e4),      # 0: host_cores_per_gpu() derives it
    "cpu_adam_params_per_s_per_core": (0.0, 1e11),  # 0: cpu_adam_params_per_s_per_core() derives it
    # the intra-node link of a PCIe node (intra_node_link = "pcie"): intra_node_GBps is derived
    "pcie_gen": (3, 5),
    "pcie_lanes": (1, 16),
}
# Switches of a GPU file ({ value = true, source, date }), and their default.
GPU_FLAGS: dict[str, bool] = {"pcie_p2p": True}
_INTEGER_FIELDS = ("gpus_per_node", "num_sms", "mxfp8_tensor_cores", "pcie_gen", "pcie_lanes")
# Fields a calibration's fit depends on: a GPU that changes one of them is not the fitted one.
_PERFORMANCE_FIELDS = ("peak_bf16_tflops", "hbm_GBps", "intra_node_GBps", "gpus_per_node", "inter_node_Gbps",
                       "num_sms", "intra_node_link", "pcie_gen", "pcie_lanes", "pcie_p2p")
_TEXT_KEYS = ("name", "vendor", "base", "description", "intra_node_link")

# ------------------------------------------------------------------------ the intra-node link
# What joins the GPUs of a node. "nvlink" and "infinity_fabric" nodes give intra_node_GBps (the
# link's rate per GPU per direction); a "pcie" node derives it from pcie_gen, pcie_lanes, pcie_p2p.
INTRA_NODE_LINKS = ("nvlink", "pcie", "infinity_fabric")
_PCIE_KEYS = ("pcie_gen", "pcie_lanes", "pcie_p2p")
PCIE_LANES = (1, 2, 4, 8, 16)
# PCIe data rate per lane per direction after line encoding, 10^9 bytes/s: 8, 16 and 32 GT/s with
# 128b/130b encoding (PCI-SIG, PCI Express Base Specification 3.0 / 4.0 / 5.0).
PCIE_LANE_GBps: dict[int, float] = {3: 0.985, 4: 1.969, 5: 3.938}
# Achievable fraction of that rate for GPU-to-GPU copies (TLP headers, flow control, DMA):
# cudaMemcpyPeer between two RTX 4090 on PCIe 4.0 x16 with P2P on, 24.44 of 31.5 GB/s = 0.776
# (tinygrad/open-gpu-kernel-modules README, 2024-04, whose NCCL all_reduce_perf over 6 such GPUs
# reaches the same 24.5 GB/s bus bandwidth); RTX PRO 6000 Blackwell on PCIe 5.0 x16: 54-56 of
# 63.0 GB/s under one CPU, 39-51 GB/s across two (p2pBandwidthLatencyTest, voipmonitor/rtx6kpro
# hardware/pcie-bandwidth.md, 2026). One fraction for every generation, the PCIe 4.0 one.
PCIE_P2P_FRACTION = 0.78
# Without P2P every copy goes device -> host memory -> device: collectives send and receive at
# once, and bidirectional copies between two RTX 4090 on PCIe 4.0 x16 reach 25.8 GB/s with P2P off
# against 50.1-51.2 GB/s with it on (tinygrad/open-gpu-kernel-modules issue #6 and README,
# p2pBandwidthLatencyTest, 2024): half.
PCIE_HOST_BOUNCE_FACTOR = 0.5


def pcie_intra_node_GBps(gen: int, lanes: int = 16, p2p: bool = True) -> float:
    """Effective GPU-to-GPU bandwidth per GPU per direction of a PCIe node, 10^9 bytes/s: the
    only place ``intra_node_GBps`` of an ``intra_node_link = "pcie"`` GPU comes from.

    ``PCIE_LANE_GBps[gen] x lanes x PCIE_P2P_FRACTION``, halved (``PCIE_HOST_BOUNCE_FACTOR``)
    without peer-to-peer; e.g. PCIe 4.0 x16 with P2P: 1.969 x 16 x 0.78 = 24.57 GB/s, without:
    12.29 GB/s. The figure is already the achievable copy rate, which NCCL's ring collectives
    reach on such nodes: the PCIe presets' calibration keeps ``intra_node_efficiency = 1``.
    """
    if gen not in PCIE_LANE_GBps:
        raise ValueError(f"PCIe generation {gen!r}: one of {sorted(PCIE_LANE_GBps)}")
    if lanes not in PCIE_LANES:
        raise ValueError(f"PCIe lanes {lanes!r}: one of {PCIE_LANES}")
    rate = PCIE_LANE_GBps[gen] * lanes * PCIE_P2P_FRACTION
    return rate if p2p else rate * PCIE_HOST_BOUNCE_FACTOR


# The host side of a GPU, for an optimizer on the CPU (optimizer_cpu_offload), when its file gives
# none: a PCIe 4.0 x16 link to the host at the measured P2P fraction (pcie_intra_node_GBps: PCIe
# copies between GPU and pinned host memory reach the same ~78 % of the lane rate), and a
# two-socket server's DRAM, 16 channels of DDR4-3200 (JEDEC JESD79-4: 3,200 MT/s x 8 bytes = 25.6
# GB/s a channel, 409.6 GB/s a node) at HOST_MEMORY_FRACTION, shared by the node's GPUs.
HOST_LINK_PCIE_GEN = 4
HOST_NODE_MEMORY_GBps = 16 * 25.6
HOST_MEMORY_FRACTION = 0.7       # an assumption: a streaming kernel's share of DRAM peak (STREAM-like)


def host_link_GBps(g: GPUPreset) -> float:
    """GPU-to-host bandwidth per GPU per direction, 10^9 bytes/s: the file's ``host_link_GBps``,
    else PCIe 4.0 x16 (:data:`HOST_LINK_PCIE_GEN`) or the GPU's own PCIe generation,
    :func:`pcie_intra_node_GBps` with peer-to-peer (a copy to pinned host memory, not bounced)."""
    if g.host_link_GBps > 0.0:
        return g.host_link_GBps
    return pcie_intra_node_GBps(g.pcie_gen if g.intra_node_link == "pcie" else HOST_LINK_PCIE_GEN,
                                g.pcie_lanes or 16, True)


def host_memory_GBps(g: GPUPreset) -> float:
    """Host memory bandwidth one GPU's CPU optimizer step gets, 10^9 bytes/s: the file's
    ``host_memory_GBps``, else :data:`HOST_NODE_MEMORY_GBps` x :data:`HOST_MEMORY_FRACTION`
    over the node's GPUs (an assumption: give the machine's own in its GPU table)."""
    if g.host_memory_GBps > 0.0:
        return g.host_memory_GBps
    return HOST_NODE_MEMORY_GBps * HOST_MEMORY_FRACTION / max(1, g.gpus_per_node)


# The host's cores, for the same CPU optimizer, when the GPU's file gives none: the two-socket
# server of HOST_NODE_MEMORY_GBps, 2 x 64-core AMD EPYC 7742 (8 channels of DDR4-3200 each: the
# DGX A100's host, 128 cores; "2xDGX-A100-SXM4-40GB, 2xAMD EPYC 7742 64-Core Processor",
# deepspeedai/DeepSpeed blogs/zenflow-corebinding/README.md, 2025), shared by the node's GPUs.
HOST_NODE_CORES = 128
# CPU Adam's measured step time, seconds, over (parameters) on one DGX-2 (ZeRO-Offload, Ren et al.,
# USENIX ATC 2021, arXiv:2101.06840, Table 4, column CPU-Adam: DeepSpeed's AVX512 + OpenMP Adam,
# fp32 master weight, gradient and moments in host memory), and that machine's physical cores (Table
# 2: 2 Intel Xeon Platinum 8168, 1.5 TB DDR4-2666; 24 cores each, Azure HC-series docs: "2 * 24-core
# Intel Xeon Platinum 8168 ... 48 physical cores", six DRAM channels a socket).
CPU_ADAM_MEASURED_S = ((1e9, 0.22), (2e9, 0.51), (4e9, 1.03), (8e9, 2.41), (10e9, 2.57))
CPU_ADAM_MEASURED_CORES = 48     # an assumption: the step ran on all 48 physical cores (the paper does not say)


def cpu_adam_params_per_s_per_core(g: GPUPreset | None = None) -> float:
    """Parameters one CPU core steps through Adam per second: the file's
    ``cpu_adam_params_per_s_per_core``, else ZeRO-Offload's measured CPU-Adam
    (:data:`CPU_ADAM_MEASURED_S`) over its machine's cores (:data:`CPU_ADAM_MEASURED_CORES`).

    The rate is the least-squares slope through the origin of Table 4's five rows,
    ``sum(n^2) / sum(n t)`` = 185e18 / 50.34e9 = 3.675e9 parameters/s, over 48 cores:
    7.66e7 parameters/s per core. It is an effective rate of the whole step as measured, on one
    2017 Skylake-SP CPU: at it the DGX-2 moved 28 x 3.675e9 = 103 GB/s, 40 % of its 256 GB/s of
    DDR4-2666, so memory did not bound it. An assumption on another CPU (a newer core, AVX2
    instead of AVX-512, torch's fused CPU AdamW rather than DeepSpeed's): give the machine's own.
    """
    if g is not None and g.cpu_adam_params_per_s_per_core > 0.0:
        return g.cpu_adam_params_per_s_per_core
    seconds_per_param = (sum(n * t for n, t in CPU_ADAM_MEASURED_S)
                         / sum(n * n for n, _ in CPU_ADAM_MEASURED_S))
    return 1.0 / (seconds_per_param * CPU_ADAM_MEASURED_CORES)


def host_cores_per_gpu(g: GPUPreset) -> float:
    """Physical CPU cores one GPU's CPU optimizer step gets: the file's ``host_cores_per_gpu``,
    else :data:`HOST_NODE_CORES` over the node's GPUs (an assumption: give the machine's own in
    its GPU table)."""
    if g.host_cores_per_gpu > 0.0:
        return g.host_cores_per_gpu
    return HOST_NODE_CORES / max(1, g.gpus_per_node)


def intra_node_link_label(g: GPUPreset) -> str:
    """The intra-node link of ``g`` in a few characters: ``nvlink``, ``infinity_fabric``,
    ``pcie4x16`` or ``pcie4x16-host`` (no peer-to-peer: copies bounce through host memory)."""
    if g.intra_node_link != "pcie":
        return g.intra_node_link
    return f"pcie{g.pcie_gen}x{g.pcie_lanes}" + ("" if g.pcie_p2p else "-host")


def _link_fields(where: str, doc: dict, base: GPUPreset | None, need_source: bool):
    """``(fields, sources)`` of the intra-node link of a GPU table: ``intra_node_link`` and, for
    ``"pcie"``, ``pcie_gen``, ``pcie_lanes``, ``pcie_p2p`` and the ``intra_node_GBps`` derived
    from them (:func:`pcie_intra_node_GBps`); the base's where the table gives none.

    Raises
    ------
    InputError
        An unknown link; a ``pcie`` GPU that also gives ``intra_node_GBps`` (two sources for one
        figure) or no ``pcie_gen``; ``pcie_*`` keys on another link; a GPU that leaves a PCIe base
        for another link without giving ``intra_node_GBps``.
    """
    base_link = base.intra_node_link if base is not None else "nvlink"
    link = doc.get("intra_node_link", base_link)
    if link not in INTRA_NODE_LINKS:
        raise InputError(where, "intra_node_link", link, ", ".join(f'"{k}"' for k in INTRA_NODE_LINKS))
    if link != "pcie":
        for key in _PCIE_KEYS:
            if key in doc:
                raise InputError(where, key, doc[key], f'only with intra_node_link = "pcie" (this GPU\'s link is '
                                 f'"{link}")', f'set intra_node_link = "pcie", or leave {key} out')
        if base_link == "pcie" and "intra_node_GBps" not in doc:
            raise InputError(where, "intra_node_GBps", None, f'a number: the {link} link\'s bandwidth per GPU per '
                             f'direction (the base {base.name!r} derives its figure from PCIe)')
        fields = {"intra_node_link": link}
        if base_link == "pcie":                 # the base's PCIe description no longer applies
            fields.update(pcie_gen=0, pcie_lanes=0, pcie_p2p=True)
        return fields, []
    if "intra_node_GBps" in doc:
        value = doc["intra_node_GBps"]
        value = value.get("value") if isinstance(value, dict) else value
        raise InputError(where, "intra_node_GBps", value, 'no number with intra_node_link = "pcie": a PCIe node\'s '
                         "bandwidth is derived from pcie_gen, pcie_lanes and pcie_p2p",
                         'leave intra_node_GBps out, or set intra_node_link = "nvlink" to give a measured figure '
                         "of your own; a spec's [cluster] intra_node_GBps overrides the derived figure for one sweep")
    inherit = base is not None and base_link == "pcie"
    values, sources = {}, []
    for key in ("pcie_gen", "pcie_lanes"):
        if key in doc:
            lo, hi = OPTIONAL_GPU_FIELD_RANGES[key]
            values[key], text = _number(where, key, doc[key], lo, hi, need_source)
            sources.append(text)
        elif inherit:
            values[key] = getattr(base, key)
        elif key == "pcie_gen":
            raise InputError(where, "pcie_gen", None, "3, 4 or 5: the PCIe generation the GPUs run at",
                             'a PCIe node (intra_node_link = "pcie") derives intra_node_GBps from it')
        else:
            values[key] = 16
    if values["pcie_lanes"] not in PCIE_LANES:
        raise InputError(where, "pcie_lanes", values["pcie_lanes"], ", ".join(map(str, PCIE_LANES)))
    if "pcie_p2p" in doc:
        values["pcie_p2p"], text = _flag(where, "pcie_p2p", doc["pcie_p2p"], need_source)
        sources.append(text)
    else:
        values["pcie_p2p"] = base.pcie_p2p if inherit else GPU_FLAGS["pcie_p2p"]
    gbps = pcie_intra_node_GBps(values["pcie_gen"], values["pcie_lanes"], values["pcie_p2p"])
    sources.append(f"intra_node_GBps: {gbps:.2f}, derived: PCIe {values['pcie_gen']}.0 "
                   f"{PCIE_LANE_GBps[values['pcie_gen']]} GB/s per lane per direction x {values['pcie_lanes']} lanes x "
                   f"{PCIE_P2P_FRACTION} achievable"
                   + ("" if values["pcie_p2p"] else f" x {PCIE_HOST_BOUNCE_FACTOR} (no P2P: copies bounce through "
                                                    "host memory)")
                   + " (hardware.gpus.pcie_intra_node_GBps)")
    if inherit and not any(k in doc for k in (*_PCIE_KEYS, "intra_node_link")):
        sources = []                            # the base's link, and the base's source says so
    return {"intra_node_link": "pcie", **values, "intra_node_GBps": gbps}, sources


def _finite(v) -> bool:
    """True for a finite number (an integer too large for a float is not)."""
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


def _entry(where: str, key: str, entry, need_source: bool):
    """``(value, source text)`` of one GPU file entry: ``{ value, source, date }`` (a plain value
    only where ``need_source`` is false, e.g. a spec's own GPU)."""
    if isinstance(entry, dict):
        extra = set(entry) - {"value", "source", "date"}
        if extra:
            raise InputError(where, f"{key}.{sorted(extra)[0]}", entry[sorted(extra)[0]], "value, source and date")
        value, source, date = entry.get("value"), entry.get("source"), entry.get("date")
        if need_source and (not isinstance(source, str) or not source.strip() or not isinstance(date, str)):
            raise InputError(where, key, entry, "{ value = N, source = \"...\", date = \"YYYY-MM\" }",
                             "every hardware number carries its source and date")
    elif need_source:
        raise InputError(where, key, entry, "{ value = N, source = \"...\", date = \"YYYY-MM\" }",
                         "every hardware number carries its source and date")
    else:
        value, source, date = entry, "given in " + where, None
    return value, f"{key}: {source}" + (f" ({date})" if date else "")


def _number(where: str, key: str, entry, lo: float, hi: float, need_source: bool):
    """``(value, source text)`` of one GPU number: ``{ value, source, date }`` (a plain number
    only where ``need_source`` is false, e.g. a spec's own GPU)."""
    value, text = _entry(where, key, entry, need_source)
    whole = key in _INTEGER_FIELDS
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (whole and not isinstance(value, int)) \
            or not _finite(value) or not lo <= value <= hi:
        raise InputError(where, key, value, f"{'an integer' if whole else 'a number'} from {lo:g} to {hi:g}")
    return (int(value) if whole else float(value)), text


def _flag(where: str, key: str, entry, need_source: bool):
    """``(value, source text)`` of one GPU switch: ``{ value = true, source, date }`` (a plain
    ``true`` / ``false`` only where ``need_source`` is false)."""
    value, text = _entry(where, key, entry, need_source)
    if not isinstance(value, bool):
        raise InputError(where, key, value, "true or false")
    return value, text


def gpu_from_table(name: str, doc: dict, where: str, known: dict, need_source: bool = True) -> GPUPreset:
    """Build the :class:`GPUPreset` ``name`` from a GPU table (a file of ``GPU_DATA_DIR`` or a
    spec's ``[gpus.<name>]``). With ``base = "<preset>"`` (or when ``name`` is a preset in
    ``known``) the table overrides that preset's fields; otherwise every field of
    :data:`GPU_FIELD_RANGES` is required (``intra_node_GBps`` excepted on a PCIe node, which
    derives it: :func:`pcie_intra_node_GBps`).

    Raises
    ------
    InputError
        Naming ``where``, the key, the value and what is allowed.
    """
    check_plain_name(where, "GPU name", name, "[gpus.h100-nvl-94gb]")
    for key in _TEXT_KEYS:
        if key in doc and not isinstance(doc[key], str):
            raise InputError(where, key, doc[key], "a string")
    if doc.get("name", name) != name:
        raise InputError(where, "name", doc["name"], f"{name!r}, the name of its table (or leave name out)")
    base_name = doc.get("base", name if name in known else None)
    if base_name is not None and (not isinstance(base_name, str) or base_name not in known):
        raise InputError(where, "base", base_name, "a GPU preset: " + ", ".join(known))
    base = known.get(base_name)
    allowed = (set(GPU_FIELD_RANGES) | set(OPTIONAL_GPU_FIELD_RANGES) | set(GPU_FLAGS) | set(_TEXT_KEYS)
               | {"calibration"})
    for key in doc:
        if key not in allowed:
            raise InputError(where, key, doc[key], "GPU fields: " + ", ".join(sorted(allowed)))
    link, link_sources = _link_fields(where, doc, base, need_source)
    values, sources = {}, []
    for key, (lo, hi) in {**GPU_FIELD_RANGES, **OPTIONAL_GPU_FIELD_RANGES}.items():
        if key in _PCIE_KEYS or (key == "intra_node_GBps" and link["intra_node_link"] == "pcie"):
            continue                            # the link's, above
        if key in doc:
            values[key], text = _number(where, key, doc[key], lo, hi, need_source)
            sources.append(text)
        elif base is None and key in GPU_FIELD_RANGES:
            raise InputError(where, key, None, "a number (every GPU field, or base = \"<preset>\" to start from one)")
    values.update(link)
    sources += link_sources
    cal_doc = doc.get("calibration", {})
    if not isinstance(cal_doc, dict):
        raise InputError(where, "calibration", cal_doc, "a table of calibration values")
    changed = any(k in doc for k in _PERFORMANCE_FIELDS) or bool(set(cal_doc) - {"base", "source", "fitted"})
    calibration, fitted = _calibration_from_table(cal_doc, where, known, base, changed)
    if "peak_bf16_tflops" in values:            # the preset field the kernels charge GEMMs at
        values["peak_tflops"] = values.pop("peak_bf16_tflops")
    if "vendor" in doc:
        values["vendor"] = doc["vendor"]
    if base is None:
        return GPUPreset(name=name, source="; ".join(sources), calibration=calibration, calibrated=fitted, **values)
    source = "; ".join(sources + [f"other numbers: {base.source}"]) if sources else base.source
    return replace(base, name=name, source=source, calibration=calibration, calibrated=fitted, **values)


def _calibration_from_table(doc: dict, where: str, known: dict, base: GPUPreset | None, changed: bool = False):
    """``(Calibration, fitted)`` from a ``[calibration]`` table (its ``base`` preset, else the
    GPU's base, fills the keys it does not give). ``fitted`` is the base's unless the table
    says otherwise, or the GPU changes a number the fit depends on (``changed``): a fit of one
    chip is not a fit of another."""
    name = doc.get("base")
    if name is not None and (not isinstance(name, str) or name not in known):
        raise InputError(where, "calibration.base", name, "a GPU preset: " + ", ".join(known))
    start = known[name] if name is not None else base
    cal = start.calibration if start is not None else Calibration()
    values = {}
    for key, v in doc.items():
        if key in ("base", "source", "fitted"):
            continue
        if key not in CALIBRATION_RANGES:
            raise InputError(where, f"calibration.{key}", v, "calibration fields: " + ", ".join(CALIBRATION_RANGES))
        lo, hi = CALIBRATION_RANGES[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not _finite(v) or not lo <= v <= hi:
            raise InputError(where, f"calibration.{key}", v, f"a number from {lo:g} to {hi:g}")
        values[key] = float(v)
    fitted = doc.get("fitted", start.calibrated if start is not None and not changed else False)
    if not isinstance(fitted, bool):
        raise InputError(where, "calibration.fitted", fitted, "true or false")
    return (replace(cal, **values) if values else cal), fitted


def load_gpu_files(paths, known: dict | None = None, need_source: bool = True) -> dict[str, GPUPreset]:
    """GPU presets from TOML files (one GPU per file, or ``[gpus.<name>]`` tables), resolving
    ``base`` references among them and ``known``.

    Raises
    ------
    InputError
        A file that cannot be read or parsed, a bad key or value, a ``base`` that names no
        preset (or a circle of them).
    """
    tables = {}
    for path in paths:
        doc = read_toml(path, "TOML file of GPU tables")
        if "gpus" in doc:          # [gpus.<name>] tables (a sweep spec's too; its other tables are not read)
            if not isinstance(doc["gpus"], dict) or not all(isinstance(t, dict) for t in doc["gpus"].values()):
                raise InputError(str(path), "gpus", doc["gpus"], "[gpus.<name>] tables, one per GPU",
                                 'e.g. [gpus.my-gpu] with base = "h100-sxm-80gb" and the fields that differ')
            for name, table in doc["gpus"].items():
                tables[name] = (table, f"{path}: [gpus.{name}]")
        else:
            name = doc.get("name")
            if not isinstance(name, str) or not name:
                raise InputError(str(path), "name", name, "the GPU's preset name, e.g. name = \"h200-sxm-141gb\"")
            tables[name] = (doc, str(path))
    return resolve_gpu_tables(tables, dict(known or {}), need_source)


def resolve_gpu_tables(tables: dict, known: dict, need_source: bool = True) -> dict[str, GPUPreset]:
    """Build every GPU of ``tables`` (name -> ``(table, where)``), bases first."""
    out: dict[str, GPUPreset] = {}
    pending = dict(tables)
    while pending:
        ready = [n for n, (t, _) in pending.items()
                 if all(not isinstance(b, str) or b in known or b not in pending or b == n
                        for b in (t.get("base"), (t.get("calibration") or {}).get("base")
                                  if isinstance(t.get("calibration"), dict) else None))]
        if not ready:           # a circle of bases: name the key of the first GPU that closes it
            name, (table, where) = next(iter(pending.items()))
            cal = table.get("calibration") if isinstance(table.get("calibration"), dict) else {}
            key, value = (("base", table["base"]) if table.get("base") in pending and table.get("base") != name
                          else ("calibration.base", cal.get("base")))
            raise InputError(where, key, value, "a preset, or a GPU whose bases do not lead back to " + repr(name),
                             f"start {name!r} from a shipped preset (vtrain-fast presets lists them)")
        for n in ready:
            table, where = pending.pop(n)
            known[n] = out[n] = gpu_from_table(n, table, where, known, need_source)
    return out


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
    "fp8_gemm_efficiency": (0.0, 1.0),
}


# The shipped presets, by name (sorted): one file each in GPU_DATA_DIR.
PRESETS: dict[str, GPUPreset] = dict(sorted(load_gpu_files(sorted(GPU_DATA_DIR.glob("*.toml"))).items()))


def parse_gpu_count(text: str, gpu_presets: dict | None = None, option: str = "--cluster",
                    example: str = "a100-sxm4-80gb:1024") -> tuple[str, int]:
    """``GPU:COUNT`` (``a100-sxm4-80gb:1024``) as ``(gpu, count)``: ``schedule --cluster``,
    ``trace --cluster`` and ``advise --gpus`` read it.

    Parameters
    ----------
    text : str
        The option's value.
    gpu_presets : dict, optional
        GPU name -> GPUPreset the name may give (default: the presets, :data:`PRESETS`).
    option, example : str
        The option's name and an example value, for messages.

    Raises
    ------
    InputError
        Not ``GPU:COUNT``, an unknown GPU, a count that is not a positive whole number.
    """
    gpu, sep, count = str(text).rpartition(":")
    if not sep or not gpu or not count.strip().isdigit() or int(count) <= 0:
        raise InputError("command line", option, text, "GPU:COUNT, a GPU preset and a number of GPUs",
                         f"e.g. {option} {example}")
    known = gpu_presets or PRESETS
    if gpu not in known:
        raise InputError("command line", option, text, "GPU:COUNT with a GPU preset (vtrain-fast presets)",
                         did_you_mean(gpu, known, f"e.g. {option} {example}"))
    return gpu, int(count)


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
        :data:`vtrain_fast.model.records.HW_FIELDS`.
    """
    c = preset.calibration
    values = {
        "peak_flops": preset.peak_tflops * 1e12,
        "peak_fp8_flops": preset.peak_fp8_tflops * 1e12,
        "peak_tf32_flops": preset.peak_tf32_tflops * 1e12,
        "peak_fp32_flops": preset.peak_fp32_tflops * 1e12,
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
        "host_link_Bps": host_link_GBps(preset) * 1e9,
        "host_memory_Bps": host_memory_GBps(preset) * 1e9,
        "host_cores_per_gpu": host_cores_per_gpu(preset),
        "cpu_adam_params_per_s_per_core": cpu_adam_params_per_s_per_core(preset),
        "repeat_cases": 0.0,    # set by grid.build_grid for the machines of a sweep
        "refused_cases": 0.0,   # likewise
    }
    for st in SETTINGS:         # the training settings, each in its field (vtrain_fast.model.settings)
        values[st.name] = st.encode(getattr(preset, st.name))
    for name in CALIBRATION_FIELDS:
        values[name] = float(getattr(c, name))
    vec = np.empty(NUM_HW_FIELDS, dtype=np.float64)
    for i, name in enumerate(HW_FIELDS):
        vec[i] = values[name]
    return vec
