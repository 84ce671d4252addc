"""Compiled kernels vs their plain-Python twins (tests/reference.py) on random points, the
flat-index encoding, and physical properties of the cost model."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import reference as ref
from vtrain_fast.plan import grid as grid_mod
from vtrain_fast.io import schema
from vtrain_fast.hardware.gpus import PRESETS, machine_vector
from vtrain_fast.model import comm, memory, ops, records, rules, totals
from vtrain_fast.model import sweep as ksweep
from vtrain_fast.model.layout import Layout
from vtrain_fast.model.records import HW_FIELDS
from vtrain_fast.plan.models import MODEL_PRESETS
from vtrain_fast.model.settings import SETTINGS, SWITCHES
from vtrain_fast.plan.spec import parse_spec

REL = 1e-12
GiB = 2.0 ** 30
INT64_MAX = 2 ** 63 - 1


def assert_close(kernel_value, twin_value, what="", rel=REL):
    k, r = float(kernel_value), float(twin_value)
    if math.isnan(r):
        assert math.isnan(k), f"{what}: kernel {k!r}, twin NaN"
        return
    # abs_tol: a term that is 0 up to rounding (an exchange fully hidden: kernel 0.0, twin -9e-20
    # after subtracting the hidden parts in another order) has no relative error to speak of
    assert math.isclose(k, r, rel_tol=rel, abs_tol=1e-15), f"{what}: kernel {k!r} != twin {r!r}"


# ------------------------------------------------------------------------------ strategies
HW_RANGES = {
    "peak_flops": (1e13, 2e15), "hbm_bytes": (8 * GiB, 192 * GiB), "hbm_Bps": (3e11, 8e12),
    "intra_node_Bps": (1e10, 1e12), "inter_node_Bps": (1e9, 1e11), "gpus_per_node": None,
    "num_sms": (20.0, 200.0), "tdp_W": (100.0, 1200.0), "usd_per_gpu_hour": (0.0, 10.0),
    "pue": (1.0, 2.0), "gemm_efficiency": (0.05, 1.0), "hbm_efficiency": (0.05, 1.0),
    "kernel_overhead_s": (0.0, 1e-4), "intra_node_efficiency": (0.05, 1.0),
    "inter_node_efficiency": (0.05, 1.0), "intra_node_latency_s": (0.0, 1e-4),
    "inter_node_latency_s": (0.0, 1e-4), "reserved_bytes": (0.0, 4 * GiB),
    "intra_node_step_latency_s": (0.0, 1e-5), "inter_node_step_latency_s": (0.0, 2e-5),
    "host_launch_s": (0.0, 5e-5), "iteration_overhead_s": (0.0, 1.0), "p2p_overhead_s": (0.0, 2e-3),
    "flash_attention_efficiency": (0.05, 1.0),
    "peak_fp8_flops": (1e13, 4e15), "fp8_gemm_efficiency": (0.05, 1.0),
    "host_link_Bps": (5e9, 1e11), "host_memory_Bps": (1e10, 3e11),
    "peak_tf32_flops": (1e13, 1e15), "peak_fp32_flops": (1e13, 2e14),
    "host_cores_per_gpu": (1.0, 64.0), "cpu_adam_params_per_s_per_core": (1e7, 5e8),
    # the training settings: switches 0/1 (overlap_grad_reduce also as a fraction), vpp and
    # zero_stage from a set
    **{s.name: None for s in SETTINGS},
    "overlap_grad_reduce": (0.0, 1.0),
    "repeat_cases": None, "refused_cases": None,
}
GPUS_PER_NODE = (1.0, 2.0, 4.0, 8.0, 16.0, 72.0)
SAMPLED = {"gpus_per_node": GPUS_PER_NODE, **{s.name: (0.0, 1.0) for s in SWITCHES},
           "vpp": (1.0, 1.0, 2.0, 3.0, 4.0), "zero_stage": (0.0, 0.0, 1.0, 2.0, 3.0),
           "precision": (0.0, 0.0, 1.0, 1.0, 2.0, 3.0, 4.0),     # bf16, fp8, fp16, fp32, tf32
           "cp_comm_type": (0.0, 1.0),  # p2p, all_gather
           "fp8_recipe": (0.0, 1.0, 2.0),   # delayed, tensorwise, mxfp8
           "first_pipeline_num_layers": (0.0, 0.0, 0.0, 1.0, 2.0, 3.0, 5.0), "dp_shard": (0.0, 0.0, 0.0, 2.0, 4.0, 8.0),
           "last_pipeline_num_layers": (0.0, 0.0, 0.0, 1.0, 2.0, 3.0, 5.0),
           "num_layers_at_start_in_bf16": (0.0, 0.0, 1.0, 2.0, 7.0), "num_layers_at_end_in_bf16": (0.0, 0.0, 1.0, 4.0),
           "ep": (1.0, 1.0, 2.0, 4.0, 8.0), "etp": (0.0, 0.0, 1.0, 2.0),    # MoE (no effect on dense models)
           "moe_token_dispatcher_type": (0.0, 0.0, 1.0),   # alltoall, allgather
           "moe_expert_capacity_factor": (0.0, 0.0, 0.5, 1.0, 1.25), "moe_load_imbalance": (1.0, 1.0, 1.3, 2.0),
           "exp_avg_dtype": (0.0, 1.0, 2.0, 3.0), "exp_avg_sq_dtype": (0.0, 1.0, 2.0, 3.0),   # fp32, fp16, bf16, fp8
           "optimizer_offload_fraction": (0.0, 0.5, 1.0, 1.0),
           "cpu_offloading_num_layers": (0.0, 0.0, 0.0, 1.0, 2.0, 5.0),   # refused at pp > 1 / with recomputation
           "repeat_cases": (0.0,), "refused_cases": (0.0,)}   # fields drawn from a set (repeat_cases: sweep bookkeeping, 0 outside sweeps)
PRESET_VECTORS = [machine_vector(p) for p in PRESETS.values()]


def _vec(d):
    return np.array([d[name] for name in HW_FIELDS], dtype=np.float64)


random_hw = st.fixed_dictionaries({
    name: (st.sampled_from(SAMPLED[name]) if rng is None else st.floats(*rng))
    for name, rng in HW_RANGES.items()
}).map(_vec)
hw_st = st.one_of(st.sampled_from(PRESET_VECTORS), random_hw)
# machine vectors whose GPU has FlashAttention kernels (use_flash_attn is refused for the others)
flash_hw_st = hw_st.filter(lambda v: v[HW_FIELDS.index("flash_attention_efficiency")] > 0.0)
dim = st.floats(1.0, 1e5)
big = st.floats(1.0, 1e12)
count = st.integers(1, 4096).map(float)
frac_count = st.floats(0.0, 4096.0)
bools = st.booleans()
rc_st = st.sampled_from([0.0, 1.0])
small_b = st.integers(1, 16).map(float)
seq_int = st.one_of(st.integers(1, 8200), st.sampled_from([16, 20, 128, 132, 1024, 1028, 2048, 4096, 4100])).map(float)
tp_int = st.sampled_from([1.0, 2.0, 4.0, 8.0, 16.0])
heads_int = tp_int.flatmap(lambda t: st.integers(1, 12).map(lambda k: float(k) * t)) | st.sampled_from([16.0, 96.0])

# kernel, twin, strategy for the argument tuple
SCALAR_CASES = {
    "gemm_time_s": (ops.gemm_time_s, ref.gemm_time_s, st.tuples(dim, dim, dim, dim, hw_st)),
    "memory_bound_time_s": (ops.memory_bound_time_s, ref.memory_bound_time_s,
                            st.tuples(big, st.floats(0.0, 100.0), hw_st)),
    "layer_forward_s": (ops.layer_forward_s, ref.layer_forward_s,
                        st.tuples(dim, dim, dim, dim, dim, dim, dim, hw_st)),
    # integer shapes, so that Megatron's fused-softmax rule (multiples of 4) both holds and fails
    "layer_forward_s[int]": (ops.layer_forward_s, ref.layer_forward_s,
                             st.tuples(small_b, seq_int, dim, heads_int, dim, dim, tp_int, hw_st)),
    "layer_backward_s[int]": (ops.layer_backward_s, ref.layer_backward_s,
                              st.tuples(small_b, seq_int, dim, heads_int, dim, dim, tp_int, hw_st)),
    "layer_activation_bytes[int]": (memory.layer_activation_bytes, ref.layer_activation_bytes,
                                    st.tuples(small_b, seq_int, dim, heads_int, dim, dim, tp_int, rc_st, rc_st)),
    "attention_core_forward_s": (ops.attention_core_forward_s, ref.attention_core_forward_s,
                                 st.tuples(small_b, seq_int, dim, heads_int, dim, tp_int, hw_st)),
    "attention_core_activation_bytes": (memory.attention_core_activation_bytes, ref.attention_core_bytes,
                                        st.tuples(small_b, seq_int, heads_int, tp_int, rc_st)),
    "fused_softmax": (ops.fused_softmax, lambda b, s, a, t: float(ref.softmax_fused(b, s, a, t)),
                      st.tuples(small_b, seq_int, heads_int, tp_int)),
    "layer_backward_s": (ops.layer_backward_s, ref.layer_backward_s,
                         st.tuples(dim, dim, dim, dim, dim, dim, dim, hw_st)),
    "sequence_split": (ops.sequence_split, ref._seq_split, st.tuples(dim, hw_st)),
    "flash_attention_time_s": (ops.flash_attention_time_s,
                               lambda fl, nb, b, s, a, t, k, hw: ref._flash_kernels_s(fl, nb, b, a / t, s, k, hw),
                               st.tuples(big, big, dim, dim, dim, dim, st.floats(0.0, 4.0), flash_hw_st)),
    "flash_attention_forward_s": (ops.flash_attention_forward_s, ref.flash_attention_forward_s,
                                  st.tuples(dim, dim, dim, dim, dim, dim, flash_hw_st)),
    "flash_attention_backward_s": (ops.flash_attention_backward_s, ref.flash_attention_backward_s,
                                   st.tuples(dim, dim, dim, dim, dim, dim, flash_hw_st)),
    "embedding_forward_s": (ops.embedding_forward_s, ref.embedding_forward_s,
                            st.tuples(dim, dim, dim, hw_st)),
    "embedding_backward_s": (ops.embedding_backward_s, ref.embedding_backward_s,
                             st.tuples(dim, dim, dim, dim, dim, hw_st)),
    "head_forward_s": (ops.head_forward_s, ref.head_forward_s, st.tuples(dim, dim, dim, dim, dim, hw_st)),
    "head_backward_s": (ops.head_backward_s, ref.head_backward_s, st.tuples(dim, dim, dim, dim, dim, hw_st)),
    "phase_s": (ops.phase_s, ref.phase_s, st.tuples(st.floats(0.0, 1.0), st.floats(0.0, 50.0), hw_st)),
    "embedding_s": (ops.embedding_s, ref.embedding_s, st.tuples(dim, dim, dim, dim, dim, hw_st)),
    "head_s": (ops.head_s, ref.head_s, st.tuples(dim, dim, dim, dim, dim, hw_st)),
    "intra_allreduce_s": (comm.intra_allreduce_s, ref.intra_allreduce_s, st.tuples(big, frac_count, hw_st)),
    "intra_allgather_s": (comm.intra_allgather_s, ref.intra_allgather_s, st.tuples(big, frac_count, hw_st)),
    "optimizer_s": (ops.optimizer_s, ref.optimizer_s, st.tuples(big, hw_st)),
    "ring_allreduce_s": (comm.ring_allreduce_s, ref.ring_allreduce_s,
                         st.tuples(big, frac_count, st.floats(1e8, 1e12), st.floats(0.01, 1.0),
                                   st.floats(0.0, 1e-3), st.floats(0.0, 1e-4))),
    "tree_allreduce_s": (comm.tree_allreduce_s, ref.tree_allreduce_s,
                         st.tuples(big, frac_count, st.floats(1e8, 1e12), st.floats(0.01, 1.0),
                                   st.floats(0.0, 1e-3), st.floats(0.0, 1e-4))),
    "ring_allgather_s": (comm.ring_allgather_s, ref.ring_allgather_s,
                         st.tuples(big, frac_count, st.floats(1e8, 1e12), st.floats(0.01, 1.0),
                                   st.floats(0.0, 1e-3), st.floats(0.0, 1e-4))),
    "members_per_node": (comm.members_per_node, ref.members_per_node,
                         st.tuples(count, count, st.sampled_from(GPUS_PER_NODE))),
    "group_allreduce_s": (comm.group_allreduce_s, ref.group_allreduce_s,
                          st.tuples(big, count, st.integers(1, 512).map(float), hw_st)),
    "group_reduce_scatter_allgather_s": (comm.group_reduce_scatter_allgather_s,
                                         ref.group_reduce_scatter_allgather_s,
                                         st.tuples(big, count, st.integers(1, 512).map(float), hw_st)),
    "p2p_s": (comm.p2p_s, ref.p2p_s, st.tuples(big, bools, hw_st)),
    "layer_params": (memory.layer_params, ref.layer_params, st.tuples(dim, dim, dim, dim)),
    "layer_params_per_rank": (memory.layer_params_per_rank, ref.layer_params_per_rank,
                              st.tuples(dim, dim, dim, dim, dim)),
    "model_params": (memory.model_params, ref.model_params,
                     st.tuples(dim, dim, dim, dim, dim, dim, dim)),
    "layer_activation_bytes": (memory.layer_activation_bytes, ref.layer_activation_bytes,
                               st.tuples(dim, dim, dim, dim, dim, dim, dim, rc_st, rc_st)),
    "chinchilla_loss": (totals.chinchilla_loss, ref.chinchilla_loss,
                        st.tuples(st.floats(1e3, 1e13), st.floats(1.0, 1e16))),
    "forward_flops_per_token": (totals.forward_flops_per_token, ref.forward_flops_per_token,
                                st.tuples(dim, dim, dim, dim, dim, dim, dim)),
}


def test_every_hw_field_has_a_test_range():
    assert set(HW_RANGES) == set(HW_FIELDS)


@pytest.mark.parametrize("name", sorted(SCALAR_CASES))
@given(data=st.data())
def test_scalar_kernel_matches_twin(name, data):
    kernel, twin, args_st = SCALAR_CASES[name]
    args = data.draw(args_st, label="args")
    assert_close(kernel(*args), twin(*args), name)


def test_phase_launch_counts_match_the_modelled_kernels():
    """ops.*_KERNELS must equal the launches the formulas charge (GEMMs + memory-bound)."""
    assert ops.LAYER_FORWARD_KERNELS == 6 + ref.LAYER_FWD_MEMORY_BOUND_LAUNCHES
    assert ops.LAYER_BACKWARD_KERNELS == 12 + ref.LAYER_BWD_MEMORY_BOUND_LAUNCHES
    # FlashAttention: 4 and 8 GEMMs, no softmax or dropout kernels, the fused kernels
    assert ops.FLASH_LAYER_FORWARD_KERNELS == 4 + (ref.LAYER_FWD_MEMORY_BOUND_LAUNCHES - 2) + ref.FLASH_FWD_LAUNCHES
    assert ops.FLASH_LAYER_BACKWARD_KERNELS == 8 + (ref.LAYER_BWD_MEMORY_BOUND_LAUNCHES - 2) + ref.FLASH_BWD_LAUNCHES
    assert ops.EMBEDDING_KERNELS == ref.EMBEDDING_LAUNCHES
    assert ops.HEAD_KERNELS == ref.HEAD_LAUNCHES


def test_fused_softmax_follows_megatrons_rule():
    """Megatron's fused kernel needs b * heads-per-rank a multiple of 4 (8 for s <= 128) and
    16 < s <= 4096 with s % 4 == 0; vTrain's single-node set (16 heads) misses it only at tp 8
    with micro-batch 1 (2 attention batches)."""
    assert ops.fused_softmax(1.0, 1024.0, 16.0, 8.0) == 0.0      # 1 x 2 heads
    assert ops.fused_softmax(2.0, 1024.0, 16.0, 8.0) == 1.0      # 2 x 2 heads
    assert ops.fused_softmax(1.0, 1024.0, 16.0, 4.0) == 1.0      # 1 x 4 heads
    assert ops.fused_softmax(2.0, 2048.0, 48.0, 16.0) == 0.0     # 18.4B at tp 16: 2 x 3 heads
    assert ops.fused_softmax(4.0, 2048.0, 48.0, 16.0) == 1.0
    assert ops.fused_softmax(4.0, 8192.0, 32.0, 1.0) == 0.0      # longer than the kernel's 4096
    assert ops.fused_softmax(4.0, 4096.0, 32.0, 1.0) == 1.0
    assert ops.fused_softmax(1.0, 128.0, 4.0, 1.0) == 0.0        # short rows: 8 per block
    assert ops.fused_softmax(2.0, 128.0, 4.0, 1.0) == 1.0
    assert ops.fused_softmax(4.0, 16.0, 4.0, 1.0) == 0.0         # s must exceed 16
    assert ops.fused_softmax(4.0, 1026.0, 4.0, 1.0) == 0.0       # s % 4 != 0


def test_unfused_softmax_costs_four_more_launches_and_the_fp32_traffic():
    hw = machine_vector(PRESETS["a100-sxm4-80gb"])
    slow_host = hw.copy()
    slow_host[HW_FIELDS.index("host_launch_s")] = 1.0           # host-bound: time = launches
    b, s, h, a, f = 1.0, 1024.0, 1024.0, 16.0, 4096.0
    assert ops.layer_forward_s(b, s, h, a, a, f, 8.0, slow_host) == ops.LAYER_FORWARD_KERNELS + 4.0
    assert ops.layer_backward_s(b, s, h, a, a, f, 8.0, slow_host) == ops.LAYER_BACKWARD_KERNELS + 4.0
    assert ops.layer_forward_s(2.0, s, h, a, a, f, 8.0, slow_host) == ops.LAYER_FORWARD_KERNELS
    # GPU-bound: the unfused fp32 path moves 36 instead of 4 bytes per score element forward
    # (40 instead of 6 backward)
    assert ops.softmax_costs(2.0, s, a, 8.0) == (4.0, 6.0, 0.0)
    assert ops.softmax_costs(1.0, s, a, 8.0) == (36.0, 40.0, 4.0)
    assert ops.softmax_costs(1.0, 2048.0, a, 8.0) == (36.0, 40.0, 4.0)
    # overhead-bound (no host floor, free FLOPs and bytes): each of the 4 extra kernels costs one
    # per-kernel gap, forward and backward
    gaps = hw.copy()
    gaps[HW_FIELDS.index("host_launch_s")] = 0.0
    gaps[HW_FIELDS.index("kernel_overhead_s")] = 1.0
    gaps[HW_FIELDS.index("peak_flops")] = 1e30
    gaps[HW_FIELDS.index("hbm_Bps")] = 1e30
    assert ops.layer_forward_s(1.0, s, h, a, a, f, 8.0, gaps) == pytest.approx(ops.LAYER_FORWARD_KERNELS + 4.0)
    assert ops.layer_backward_s(1.0, s, h, a, a, f, 8.0, gaps) == pytest.approx(ops.LAYER_BACKWARD_KERNELS + 4.0)
    assert ops.layer_forward_s(2.0, s, h, a, a, f, 8.0, gaps) == pytest.approx(ops.LAYER_FORWARD_KERNELS)
    assert ops.attention_core_forward_s(1.0, s, h, a, a, 8.0, gaps) == pytest.approx(2.0 + 3.0 + 4.0)
    gpu_bound = hw.copy()
    gpu_bound[HW_FIELDS.index("host_launch_s")] = 0.0
    gpu_bound[HW_FIELDS.index("kernel_overhead_s")] = 0.0
    assert math.isclose(ops.layer_forward_s(1.0, s, h, a, a, f, 8.0, gpu_bound),
                        ref.layer_forward_s(1.0, s, h, a, a, f, 8.0, gpu_bound), rel_tol=1e-12)
    assert math.isclose(ops.layer_backward_s(1.0, s, h, a, a, f, 8.0, gpu_bound),
                        ref.layer_backward_s(1.0, s, h, a, a, f, 8.0, gpu_bound), rel_tol=1e-12)


shape_int = st.integers(-3, 40)


def validate_shape(L, h, a, g, f, v, s, B, b, t, p, d):
    """The kernel's shape rules with the twin's arguments (sizes one by one), on a preset's machine
    (even pipeline stages)."""
    return rules.validate_shape(L, h, a, g, f, v, s, B, b, Layout(t, 1, d, p), PRESET_VECTORS[0])


@given(st.tuples(*[shape_int] * 12))
def test_validate_shape_matches_twin(args):
    assert validate_shape(*args) == ref.validate_shape(*args)


@given(L=st.integers(1, 8), h_per_a=st.integers(1, 4), a=st.integers(1, 8), g=st.integers(1, 8),
       t=st.integers(1, 8), p=st.integers(1, 8), d=st.integers(1, 8), b=st.integers(1, 4),
       B=st.integers(1, 64))
def test_validate_shape_divisibility(L, h_per_a, a, g, t, p, d, b, B):
    """Mostly-positive shapes so that every divisibility branch is reached."""
    args = (L, a * h_per_a + (L % 2), a, g, 1, 1, 1, B, b, t, p, d)
    assert validate_shape(*args) == ref.validate_shape(*args)


def test_layouts_and_status_codes_match_twin():
    assert ref.OUTPUT_NAMES == records.OUTPUT_NAMES == schema.OUTPUT_NAMES
    assert ref.INPUT_NAMES == records.INPUT_NAMES
    assert ref.AXES == records.AXES
    codes = (records.OK, records.BAD_INPUT, records.BAD_NUM_GPUS, records.BAD_HEADS, records.BAD_LAYERS,
             records.BAD_BATCH, records.OUT_OF_MEMORY)
    assert codes == (ref.OK, ref.BAD_INPUT, ref.BAD_NUM_GPUS, ref.BAD_HEADS, ref.BAD_LAYERS,
                     ref.BAD_BATCH, ref.OUT_OF_MEMORY)
    assert len(schema.STATUS_LABELS) == records.NUM_STATUS
    assert schema.STATUS_LABELS[records.OUT_OF_MEMORY] == "out_of_memory"
    assert schema.STATUS_LABELS[records.OK] == "ok"
    names = [f.name for f in schema.SCHEMA]
    assert len(names) == len(set(names))
    for n in records.INPUT_NAMES:
        assert n in names or n in ("model_index", "gpu_index")


# ------------------------------------------------------------------------------ full step
def _divisors(n):
    return [k for k in range(1, n + 1) if n % k == 0]


PRESET_SHAPES = [m.as_row() for m in MODEL_PRESETS.values()]


def random_config(rng, invalid_fraction=0.4):
    """One configuration ``(L, h, a, g, f, v, s, B, b, t, p, d, recompute, num_tokens, hw,
    flags)``, valid by construction, then (with probability ``invalid_fraction``) one size
    broken; ``flags``: the architecture flags' codes (``ref.ModelFlags``, floats)."""
    # gated MLP, RMSNorm, position embedding (learned, rope, none), biases, untied head
    flags = ref.ModelFlags(float(rng.random() < 0.3), float(rng.random() < 0.5), float(rng.integers(0, 3)),
                           float(rng.random() < 0.5), float(rng.random() < 0.5))
    if rng.random() < 0.3:
        row = PRESET_SHAPES[rng.integers(len(PRESET_SHAPES))]
        L0, h, a, g, f, v, s = row[:7]
        flags = ref.ModelFlags(*map(float, row[7:]))
    else:
        a = int(rng.choice([1, 2, 4, 8, 12, 16, 32, 48, 64, 96]))
        h = a * int(rng.choice([16, 32, 64, 128]))
        g = a if rng.random() < 0.5 else int(rng.choice(_divisors(a)))
        f = 4 * h if rng.random() < 0.5 else int(rng.integers(h, 5 * h))
        v = int(rng.choice([50257, 32000, 128256, int(rng.integers(100, 200_000))]))
        s = int(rng.choice([128, 512, 1024, 2048, 4096, 8192]))
    t = int(rng.choice(_divisors(math.gcd(a, g))[:6]))
    p = int(rng.choice([1, 1, 2, 3, 4, 8, 16]))
    L = p * int(rng.integers(1, 9))
    d = int(rng.choice([1, 2, 3, 4, 8, 16, 64, 256]))
    b = int(rng.choice([1, 2, 4, 8, 16]))
    B = d * b * int(rng.integers(1, 33))
    sizes = [L, h, a, g, f, v, s, B, b, t, p, d]
    # context parallelism on a third of the configurations (seq_length % 2 cp may fail: bad_seq_length)
    cp = int(rng.choice([1, 1, 2, 4, 8])) if rng.random() < 0.4 else 1
    if cp > 1 and rng.random() < 0.2:
        sizes[6] += 2                       # seq_length no longer a multiple of 2 cp
    if rng.random() < invalid_fraction:
        k = int(rng.integers(12))
        sizes[k] = int(rng.choice([0, -1, -7])) if rng.random() < 0.3 else sizes[k] + 1
    rc = int(rng.integers(0, 3))          # none, full, selective
    tokens = float(10.0 ** rng.uniform(6, 13))
    if rng.random() < 0.5:
        hw = PRESET_VECTORS[rng.integers(len(PRESET_VECTORS))].copy()
    else:
        vals = {n: (float(rng.choice(SAMPLED[n])) if r is None else float(rng.uniform(*r)))
                for n, r in HW_RANGES.items()}
        hw = _vec(vals)
    if cp > 1 and rng.random() < 0.85 and hw[HW_FIELDS.index("flash_attention_efficiency")] > 0.0:
        hw[HW_FIELDS.index("use_flash_attn")] = 1.0     # cp > 1 needs FlashAttention (else status refused)
    if rng.random() < 0.35:
        flags = random_moe_flags(np.random.default_rng(int(rng.integers(2 ** 32))), flags, h, p)
    elif flags.num_experts >= 1 and p > 2:
        # an MoE preset over a pipeline with middle stages: every layer an MoE layer (the kernel
        # bounds the middle stages by their largest MoE count, exact when they are equal)
        flags = flags._replace(moe_layer_step=1.0, moe_first_dense_layers=0.0)
    if rng.random() < 0.3:
        # heads of kv_channels d other than h / a (Megatron-LM --kv-channels): wider, narrower, or
        # on a hidden size that heads do not divide
        krng = np.random.default_rng(int(rng.integers(2 ** 32)))
        hd = max(int(h) // max(int(a), 1), 1)
        flags = flags._replace(kv_channels=float(krng.choice([64, 128, 256, hd, 2 * hd, max(hd // 2, 1)])))
        if krng.random() < 0.25 and sizes[1] == h:
            sizes[1] = int(h) + 8
    return (*sizes, rc, tokens, hw, flags, cp)


def random_moe_flags(rng, flags, h, p):
    """``flags`` as a mixture-of-experts model's: experts, top-k, expert and shared widths, and
    (without middle pipeline stages, p <= 2) a layer placement of every 2nd layer or dense first layers."""
    e = int(rng.choice([1, 2, 4, 8, 16, 64]))
    k = int(rng.choice([1, 2, min(e, 8)]))
    h = max(int(h), 1)
    fe = int(rng.choice([0, h, int(rng.integers(64, 4 * h + 64))]))
    fs = int(rng.choice([0, 0, h, 2 * h]))
    step_, first = 1, 0
    if p <= 2:
        step_, first = int(rng.choice([1, 1, 2])), int(rng.choice([0, 0, 1, 3]))
    return flags._replace(num_experts=float(e), moe_router_topk=float(k), moe_ffn_hidden_size=float(fe),
                          moe_shared_expert_intermediate_size=float(fs), moe_layer_step=float(step_),
                          moe_first_dense_layers=float(first))


def run_rows(configs):
    """Evaluate configurations with ``model.sweep.evaluate_rows``; returns (status, out)."""
    n = len(configs)
    # (model, B, b, t, p, d, recompute, ..., flags, cp) -> the kernel's row layout (ROW_FIELDS: the model
    # with its flags' codes, B, b, tp, cp (1 when not given), pp, dp, recompute)
    cols = np.ascontiguousarray(np.array([(*c[:7], *c[15], c[7], c[8], c[9], c[16] if len(c) > 16 else 1, c[10], c[11],
                                           c[12]) for c in configs], dtype=np.int64).T)
    tokens = np.array([c[13] for c in configs], dtype=np.float64)
    hw_rows = np.ascontiguousarray(np.stack([c[14] for c in configs]))
    out = np.empty((records.NUM_OUTPUTS, n), dtype=np.float64)
    status = np.empty(n, dtype=np.int8)
    ksweep.evaluate_rows(cols, tokens, hw_rows, out, status)
    return status, out


def twin_check(rng, n, change, invalid_fraction=0.1, min_feasible=30):
    """``n`` random configurations (:func:`random_config`), each changed in place by ``change(c, rng)``
    (a list, the config's fields), priced by the kernel and its twin and compared
    (:func:`compare_with_twin`); at least ``min_feasible`` of them ok or out of memory, with finite
    iteration times. Returns ``(status, out)``."""
    configs = []
    for _ in range(n):
        c = list(random_config(rng, invalid_fraction=invalid_fraction))
        change(c, rng)
        configs.append(tuple(c))
    status, out = run_rows(configs)
    compare_with_twin(configs, status, out)
    feasible = np.isin(status, [ref.OK, ref.OUT_OF_MEMORY])
    assert feasible.sum() > min_feasible
    assert np.isfinite(out[records.OUTPUT.iteration_time_s, feasible]).all()
    return status, out


def compare_with_twin(configs, status, out):
    for j, c in enumerate(configs):
        r_status, r_out = ref.step(*c)
        assert status[j] == r_status, f"config {c[:14]}: kernel status {status[j]}, twin {r_status}"
        for k, name in enumerate(records.OUTPUT_NAMES):
            assert_close(out[k, j], r_out[name], f"{name} of config {c[:14]}")


@pytest.mark.parametrize("seed", [0, 1])
def test_step_matches_twin_on_random_configs(seed):
    rng = np.random.default_rng(seed)
    configs = [random_config(rng) for _ in range(300)]
    status, out = run_rows(configs)
    compare_with_twin(configs, status, out)
    seen = set(status.tolist())
    # the sample must exercise every code step() can return, else the test proves little
    assert {ref.OK, ref.BAD_INPUT, ref.BAD_HEADS, ref.BAD_LAYERS, ref.BAD_BATCH,
            ref.OUT_OF_MEMORY, ref.BAD_SEQ_LENGTH, ref.REFUSED} <= seen, seen
    cps = np.array([c[16] for c in configs])
    assert (feasible_cp := np.isin(status, [ref.OK, ref.OUT_OF_MEMORY]) & (cps > 1)).sum() > 10, feasible_cp.sum()
    feasible = np.isin(status, [ref.OK, ref.OUT_OF_MEMORY])
    pp = np.array([c[10] for c in configs])
    assert (feasible & (pp > 1)).sum() > 20 and (feasible & (pp == 1)).sum() > 20
    shape_err = ~feasible
    assert np.isnan(out[:, shape_err]).all()
    assert not np.isnan(out[:, feasible]).any()


def test_step_rejects_nonpositive_sizes():
    base = [12, 768, 12, 12, 3072, 50257, 2048, 64, 2, 1, 1, 8]
    hw = PRESET_VECTORS[0]
    configs = []
    for k in range(12):
        for bad in (0, -1):
            sizes = list(base)
            sizes[k] = bad
            configs.append((*sizes, 1, 1e9, hw, ref.ModelFlags(0.0, 0.0, 0.0, 1.0, 0.0)))
    status, out = run_rows(configs)
    assert (status == records.BAD_INPUT).all()
    assert np.isnan(out).all()


# ------------------------------------------------------------------------------ sweep_chunk
GRID_SPECS = {
    "num_gpus": """
        [model]
        presets = ["gpt3-125m", "gpt3-2.7b", "gpt3-175b"]
        [training]
        num_tokens = [1e9, 3e11]
        global_batch_size = [64, 96, 100]
        micro_batch_size = [1, 2, 4]
        recompute = ["none", "full", "selective"]
        [cluster]
        gpu = ["a100-sxm4-40gb", "h100-sxm-80gb", "v100-sxm2-32gb"]
        num_gpus = [1, 8, 24, 64]
        [parallel]
        tp = [1, 2, 8, 16]
        pp = [1, 2, 3, 4]
    """,
    "num_nodes": """
        [model]
        num_layers = [6, 12]
        hidden_size = [512, 768]
        num_attention_heads = [8, 12]
        num_query_groups = [4]
        seq_length = [1024]
        [training]
        num_tokens = 5e9
        global_batch_size = [32, 60]
        micro_batch_size = [1, 2]
        recompute = "full"
        [cluster]
        gpu = ["a100-sxm4-80gb"]
        num_nodes = [1, 3]
        gpus_per_node = 4
        inter_node_Gbps = 400
        [parallel]
        tp = [1, 2, 4]
        pp = [1, 2, 3]
    """,
    "cp": """
        [model]
        num_layers = [8]
        hidden_size = [1024]
        num_attention_heads = [16]
        num_query_groups = [4, 16]
        seq_length = [4096, 1020]
        [training]
        num_tokens = 5e9
        global_batch_size = [16, 24]
        micro_batch_size = [1, 2]
        recompute = ["none", "full", "selective"]
        use_flash_attn = true
        [cluster]
        gpu = ["h100-sxm-80gb"]
        num_gpus = [8, 16, 32]
        [parallel]
        tp = [1, 2, 4]
        cp = [1, 2, 4]
        pp = [1, 2]
    """,
    "cp_all_gather": """
        [model]
        presets = ["llama3-8b"]
        [training]
        num_tokens = 5e9
        global_batch_size = [16, 32, 64]
        micro_batch_size = [1]
        recompute = ["none", "selective"]
        use_flash_attn = true
        zero_stage = 1
        [cluster]
        gpu = ["a100-sxm4-80gb"]
        num_gpus = [16, 64, 128]
        [parallel]
        tp = [2, 8]
        cp = [2, 8]
        pp = [1, 4]
        cp_comm_type = "all_gather"
    """,
}


def _grid(key):
    import textwrap
    return grid_mod.build_grid(parse_spec(textwrap.dedent(GRID_SPECS[key]), f"<{key}>"))


@pytest.mark.parametrize("key", sorted(GRID_SPECS))
def test_sweep_chunk_matches_decode_and_twin(key):
    g = _grid(key)
    rng = np.random.default_rng(7)
    axis_values = {"model": None, "num_tokens": g.tokens, "gpu": g.gpus, "cluster_size": g.sizes,
                   "tp": g.tps, "cp": g.cps, "pp": g.pps, "micro_batch_size": g.mbss,
                   "global_batch_size": g.gbss, "recompute": g.recomputes}
    statuses = set()
    for _ in range(4):
        n = int(rng.integers(1, 120))
        start = int(rng.integers(0, g.num_points - n + 1))
        inputs = np.empty((records.NUM_INPUTS, n), dtype=np.int64)
        tokens = np.empty(n, dtype=np.float64)
        out = np.empty((records.NUM_OUTPUTS, n), dtype=np.float64)
        status = np.empty(n, dtype=np.int8)
        ksweep.sweep_chunk(start, n, *g.kernel_args(), inputs, tokens, out, status)
        for j in range(n):
            index = start + j
            digits = grid_mod.decode(index, g.radices)
            assert digits == ref.decode(index, g.radices)
            assert grid_mod.encode(digits, g.radices) == index
            got = dict(zip(records.INPUT_NAMES, inputs[:, j].tolist()))
            d = dict(zip(records.AXES, digits))
            assert got["model_index"] == d["model"]
            assert got["gpu_index"] == g.gpus[d["gpu"]]
            assert tuple(inputs[ksweep.INPUT.num_layers:ksweep.INPUT.num_layers + len(g.models[d["model"]]), j]) == tuple(g.models[d["model"]])
            for axis, col in (("tp", "tp"), ("cp", "cp"), ("pp", "pp"), ("micro_batch_size", "micro_batch_size"),
                              ("global_batch_size", "global_batch_size"), ("recompute", "recompute")):
                assert got[col] == axis_values[axis][d[axis]], (axis, index)
            assert tokens[j] == g.tokens[d["num_tokens"]]
            r_inputs, r_tokens, r_status, r_out = ref.sweep_point(index, g)
            assert got == r_inputs
            assert status[j] == r_status
            statuses.add(r_status)
            for k, name in enumerate(records.OUTPUT_NAMES):
                assert_close(out[k, j], r_out[name], f"{name} at index {index}")
    assert ref.OK in statuses and len(statuses) >= 2


def test_sweep_chunk_cluster_size_in_nodes():
    g = _grid("num_nodes")
    gpn = 4
    n = g.num_points
    inputs = np.empty((records.NUM_INPUTS, n), dtype=np.int64)
    tokens = np.empty(n, dtype=np.float64)
    out = np.empty((records.NUM_OUTPUTS, n), dtype=np.float64)
    status = np.empty(n, dtype=np.int8)
    ksweep.sweep_chunk(0, n, *g.kernel_args(), inputs, tokens, out, status)
    num_gpus = inputs[ksweep.INPUT.num_gpus]
    assert set(num_gpus.tolist()) == {gpn, 3 * gpn}
    assert (inputs[ksweep.INPUT.num_nodes] * gpn == num_gpus).all()
    ok = status != records.BAD_NUM_GPUS
    tpd = inputs[ksweep.INPUT.tp] * inputs[ksweep.INPUT.pp] * inputs[ksweep.INPUT.dp]
    assert (tpd[ok] == num_gpus[ok]).all()
    assert (num_gpus[~ok] % (inputs[ksweep.INPUT.tp] * inputs[ksweep.INPUT.pp])[~ok] != 0).all()


# ------------------------------------------------------------------------------ encoding
# 2^63 - 1 = 7^2 * 73 * 127 * 337 * 92737 * 649657: radices whose product is exactly INT64_MAX
NEAR_INT64 = [
    (49, 73, 127, 337, 92737, 649657, 1, 1, 1, 1),
    (1, 1, 1, 1, 1, 1, 1, 1, 1, INT64_MAX),
    (2, 2 ** 30, 2 ** 31, 1, 1, 1, 1, 1, 1, 1),
    (3, 5, 7, 11, 13, 17, 19, 23, 1, 29 * 2 ** 26),
]


@st.composite
def radices_and_index(draw):
    radices = draw(st.lists(st.integers(1, 2 ** 40), min_size=records.NUM_AXES, max_size=records.NUM_AXES))
    total = math.prod(radices)
    if total > INT64_MAX:
        # shrink the largest radices until the product fits
        radices = [max(1, r >> 40) if r > 2 ** 20 else r for r in radices]
        total = math.prod(radices)
    if total > INT64_MAX:
        radices = [min(r, 2 ** 6) for r in radices]
        total = math.prod(radices)
    index = draw(st.one_of(st.integers(0, total - 1), st.integers(max(0, total - 1000), total - 1)))
    return radices, index


def _check_round_trip(radices, index):
    digits = grid_mod.decode(index, radices)
    assert all(0 <= x < r for x, r in zip(digits, radices))
    assert grid_mod.encode(digits, radices) == index
    assert ref.decode(index, radices) == digits
    kd = np.empty(len(radices), dtype=np.int64)
    ksweep.decode_index(index, np.array(radices, dtype=np.int64), kd)
    assert kd.tolist() == digits


@given(radices_and_index())
def test_decode_encode_round_trip(ri):
    _check_round_trip(*ri)


@pytest.mark.parametrize("radices", NEAR_INT64)
def test_decode_encode_near_int64(radices):
    total = grid_mod.count_points(radices)
    assert total <= INT64_MAX and total == math.prod(radices)
    for index in (0, 1, total // 2, total - 2, total - 1):
        if 0 <= index < total:
            _check_round_trip(list(radices), index)


def test_encode_is_row_major_last_axis_fastest():
    radices = [2, 3, 4]
    expected = [(i, j, k) for i in range(2) for j in range(3) for k in range(4)]
    assert [tuple(grid_mod.decode(n, radices)) for n in range(24)] == expected


# ------------------------------------------------------------------------------ properties
def valid_configs(rng, n):
    """Configurations the twin evaluates (status ``OK`` or ``OUT_OF_MEMORY``): shape rules and,
    with an interleaved schedule in the machine vector, its rules too."""
    out = []
    while len(out) < n:
        c = random_config(rng, invalid_fraction=0.0)
        if ref.step(*c)[0] in (ref.OK, ref.OUT_OF_MEMORY):
            out.append(c)
    return out


def _replace(c, **kw):
    names = ("L", "h", "a", "g", "f", "v", "s", "B", "b", "t", "p", "d", "rc", "tokens", "hw", "flags")
    c = list(c)
    for k, v in kw.items():
        c[names.index(k)] = v
    return tuple(c)


def test_utilisation_is_at_most_one():
    configs = valid_configs(np.random.default_rng(11), 300)
    status, out = run_rows(configs)
    mfu, hfu = out[records.OUTPUT.mfu], out[records.OUTPUT.hfu]
    # utilisation is against the bf16 peak; FP8 GEMMs may run up to the FP8 peak, TF32 and FP32
    # ones up to theirs (the sampled ones may exceed the bf16 peak)
    hw = np.array([c[14] for c in configs])
    prec = hw[:, HW_FIELDS.index("precision")]
    own_peak = {1.0: "peak_fp8_flops", 3.0: "peak_fp32_flops", 4.0: "peak_tf32_flops"}
    ceiling = np.ones(len(configs))
    for code, field in own_peak.items():
        ratio = np.maximum(1.0, hw[:, HW_FIELDS.index(field)] / hw[:, HW_FIELDS.index("peak_flops")])
        ceiling = np.where(prec == code, ratio, ceiling)
    assert (mfu > 0).all() and (mfu <= hfu).all() and (hfu <= ceiling).all()
    assert (prec == 0.0).sum() > 50 and (prec == 3.0).sum() >= 3
    rc = np.array([c[12] for c in configs])
    assert (hfu[rc == 1] > mfu[rc == 1]).all() and (hfu[rc == 0] == mfu[rc == 0]).all()


def _pairs(build, seed, n=200, prepare=lambda c: c):
    """``n`` evaluable configurations (each passed through ``prepare``) and their changed twins
    (``build``), both evaluable (a change may break the interleaved schedule's divisibility rules;
    those pairs are redrawn)."""
    rng = np.random.default_rng(seed)
    base, bigger = [], []
    while len(base) < n:
        c = prepare(valid_configs(rng, 1)[0])
        if ref.step(*c)[0] not in (ref.OK, ref.OUT_OF_MEMORY):
            continue
        c2 = build(c, rng)
        if ref.step(*c2)[0] in (ref.OK, ref.OUT_OF_MEMORY):
            base.append(c)
            bigger.append(c2)
    s0, o0 = run_rows(base)
    s1, o1 = run_rows(bigger)
    return base, bigger, o0, o1


@given(st.floats(1e3, 1e10), st.integers(1, 4096), st.floats(0.0, 1e-3), st.floats(0.0, 1e-4))
def test_tree_allreduce_never_slower_than_ring(nbytes, n, latency_s, step_latency_s):
    args = (nbytes, float(n), 25e9, 0.8, latency_s, step_latency_s)
    tree, ring = comm.tree_allreduce_s(*args), comm.ring_allreduce_s(*args)
    assert tree <= ring * (1 + 1e-12)
    if n <= 2:       # a tree of 2 ranks has as many steps as the ring
        assert tree == pytest.approx(ring, rel=1e-12)


def _no_activation_offload(hw):
    """``hw`` with cpu_offloading_num_layers 0: with a fixed count of offloaded layers, more layers
    give their copies more compute to hide under (k = L - 1 exposes every copy, k < L - 1 may
    expose none), so the iteration may get shorter with more layers."""
    hw = np.array(hw, dtype=np.float64)
    hw[HW_FIELDS.index("cpu_offloading_num_layers")] = 0.0
    return hw


def test_iteration_time_grows_with_num_layers():
    _, _, o0, o1 = _pairs(lambda c, rng: _replace(c, L=c[0] + c[10] * int(rng.integers(1, 4))), 21,
                          prepare=lambda c: _replace(c, hw=_no_activation_offload(c[14])))
    assert (o1[records.OUTPUT.iteration_time_s] > o0[records.OUTPUT.iteration_time_s]).all()


def test_iteration_time_grows_with_global_batch():
    _, _, o0, o1 = _pairs(lambda c, rng: _replace(c, B=c[7] + c[11] * c[8] * int(rng.integers(1, 4))), 22)
    assert (o1[records.OUTPUT.iteration_time_s] > o0[records.OUTPUT.iteration_time_s]).all()
    assert (o1[records.OUTPUT.num_micro_batches] > o0[records.OUTPUT.num_micro_batches]).all()


@pytest.mark.parametrize("field", ["inter_node_Bps", "intra_node_Bps"])
def test_more_bandwidth_never_slows_a_step(field):
    k = HW_FIELDS.index(field)

    def faster(c, rng):
        hw = c[14].copy()
        hw[k] *= float(rng.uniform(1.01, 10.0))
        return _replace(c, hw=hw)
    base, _, o0, o1 = _pairs(faster, 23)
    assert (o1[records.OUTPUT.iteration_time_s] <= o0[records.OUTPUT.iteration_time_s]).all()
    # the breakdown is the slowest stage's: where stages differ (uneven stages, layers kept in bf16
    # under FP8) a faster link can make another stage the slowest, with more TP time of its own
    same = [all(c[14][HW_FIELDS.index(n)] == 0.0 for n in (
        "first_pipeline_num_layers", "last_pipeline_num_layers", "account_for_embedding_in_pipeline_split",
        "account_for_loss_in_pipeline_split", "num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16"))
        for c in base]
    assert sum(same) > 50
    for row in (records.OUTPUT.tp_comm_s, records.OUTPUT.pp_comm_s, records.OUTPUT.dp_comm_s):
        assert (o1[row][same] <= o0[row][same]).all()
    # the faster link must actually matter somewhere, else the test proves nothing
    assert (o1[records.OUTPUT.iteration_time_s] < o0[records.OUTPUT.iteration_time_s]).any()


def test_memory_grows_with_micro_batch():
    rng = np.random.default_rng(24)
    # B doubled in both so that d * b and d * 2b both divide it
    base = [_replace(c, B=2 * c[7]) for c in valid_configs(rng, 200)]
    # not where doubling b turns Megatron's fused softmax on (b a / t a multiple of 4): its 2-byte
    # output replaces the fp32 one, and a micro-batch of 2b can then store less than two of b
    seq = [c[6] / (c[16] if len(c) > 16 else 1) for c in base]
    base = [c for c, sl in zip(base, seq) if ops.fused_softmax(float(c[8]), sl, float(c[2]), float(c[9]))
            == ops.fused_softmax(2.0 * c[8], sl, float(c[2]), float(c[9]))]
    bigger = [_replace(c, b=2 * c[8]) for c in base]
    _, o0 = run_rows(base)
    _, o1 = run_rows(bigger)
    mem0, mem1 = o0[records.OUTPUT.memory_per_gpu_GiB], o1[records.OUTPUT.memory_per_gpu_GiB]
    assert (mem1 >= mem0).all()
    # one stage holds one micro-batch: its activations scale with b
    pp1 = np.array([c[10] for c in base]) == 1
    assert pp1.sum() > 20 and (mem1[pp1] > mem0[pp1]).all()


@pytest.mark.parametrize("bf16_grads, state_bytes, acc_bytes", [(True, 16.0, 6.0), (False, 18.0, 6.0)])
def test_gradient_accumulation_adds_its_bytes_per_parameter_per_extra_micro_batch(bf16_grads, state_bytes, acc_bytes):
    """From the second micro-batch on, each weight gradient is added into the accumulated one (read
    both, write the sum): ``(m - 1) * 6 * params / (HBM x hbm_efficiency)`` per step, with bf16
    gradients (16 bytes of states per parameter) and with Megatron-LM's fp32 main gradients (18
    bytes of states), which the weight-gradient GEMM accumulates into itself."""
    import polars as pl
    from vtrain_fast.analysis.evaluate import evaluate_frame
    plan = dict(num_layers=12, hidden_size=2048, num_attention_heads=16, seq_length=1024, micro_batch_size=2,
                tp=2, pp=1, dp=2, gpu="a100-sxm4-80gb", grad_reduce_in_bf16=bf16_grads)
    rows = evaluate_frame(pl.DataFrame([dict(plan, global_batch_size=B) for B in (4, 8, 16)]))
    c1, c2, c4 = rows["compute_s"].to_list()                         # m = 1, 2, 4
    hw = machine_vector(PRESETS["a100-sxm4-80gb"])
    params = rows["model_states_GiB"][0] * GiB / state_bytes
    assert math.isclose(params, rows["num_parameters"][0] / 2, rel_tol=0.02)     # tp = 2: about half on a rank
    acc = acc_bytes * params / (hw[HW_FIELDS.index("hbm_Bps")] * hw[HW_FIELDS.index("hbm_efficiency")])
    assert math.isclose(c2 - 2.0 * c1, acc, rel_tol=1e-9)
    assert math.isclose(c4 - 4.0 * c1, 3.0 * acc, rel_tol=1e-9)
