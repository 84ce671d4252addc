"""Mixture-of-experts in the kernels (issue 13, docs/moe.md): an MoE of one expert is the dense
model plus its router; ep = 1 sends nothing all-to-all; expert parallelism shards the experts'
memory and leaves the model FLOPs alone; dispatch bytes by hand; a status for every invalid expert
grid; the sweep drivers and the twin agree with ``step`` on MoE models."""
from __future__ import annotations

import math

import numpy as np
import pytest

import reference as ref
from conftest import sweep_all_rows
import test_kernels as tk
from vtrain_fast.hardware.gpus import PRESETS, machine_vector
from vtrain_fast.model import comm, costs, experts, layer_split, layout, moe, ops, records, pipeline, step, totals
from vtrain_fast.model import sweep as ks
from vtrain_fast.model.arch import DEFAULT_ARCH
from vtrain_fast.model.records import HW_FIELDS, MICRO_NAMES, arch_of_values
from vtrain_fast.plan import grid as grid_mod
from vtrain_fast.plan.models import MODEL_PRESETS
from vtrain_fast.plan.spec import parse_spec

H100 = machine_vector(PRESETS["h100-sxm-80gb"])
LLAMA = DEFAULT_ARCH._replace(gated_mlp=1.0, normalization=1.0, position_embedding_type=1.0, add_bias_linear=0.0,
                              untie_embeddings_and_output_weights=1.0)
L, H, A, G, F, V, S = 8, 4096, 32, 8, 14336, 32000, 4096


def _hw(**settings):
    hw = H100.copy()
    for k, v in settings.items():
        hw[HW_FIELDS.index(k)] = float(v)
    return hw


def _run(arch, hw, t=1, p=1, d=1, b=1, B=None, rc=0, cp=1, layers=L, seq=S):
    out = np.empty((records.NUM_OUTPUTS, 1))
    B = B if B is not None else b * d
    code = step.step(float(layers), float(H), float(A), float(G), float(F), float(V), float(seq), float(B), float(b),
                     layout.Layout(t, cp, d, p), rc, 1e12, hw, out, 0, arch)
    return code, dict(zip(records.OUTPUT_NAMES, out[:, 0]))


def _mixtral():
    row = MODEL_PRESETS["mixtral-8x7b"].as_row()
    return row[:7], arch_of_values(row)


def test_one_expert_top_one_is_the_dense_model_plus_its_router():
    one = LLAMA._replace(num_experts=1.0, moe_router_topk=1.0, moe_ffn_hidden_size=float(F))
    hw = _hw(use_flash_attn=1)
    mb_dense = costs.micro_batch_costs(1.0, float(S), float(H), float(A), float(G), float(F), float(V), 1.0, hw, LLAMA)
    mb_moe = costs.micro_batch_costs(1.0, float(S), float(H), float(A), float(G), float(F), float(V), 1.0, hw, one)
    router_fwd, router_bwd = experts.moe_router_s(1.0, float(S), float(H), 1.0, hw, one)
    # the expert's grouped GEMM of one group is the dense MLP's GEMM, its activation the same bytes
    # (up to rounding: the expert GEMMs are added and the dense MLP's taken off again)
    assert mb_moe.moe_layer_forward_extra_s == pytest.approx(router_fwd, rel=1e-12)
    assert mb_moe.moe_layer_backward_extra_s == pytest.approx(router_bwd, rel=1e-12)
    assert mb_moe[:MICRO_NAMES.index("moe_layer_forward_extra_s")] == mb_dense[:MICRO_NAMES.index("moe_layer_forward_extra_s")]
    assert mb_moe.ep_forward_s == mb_moe.ep_backward_s == 0.0           # ep = etp = 1
    # one micro-batch (no gradient accumulation), one GPU: compute differs by the router alone
    c_dense, dense = _run(LLAMA, hw)
    c_moe, moe_out = _run(one, hw)
    assert c_dense == c_moe == records.OK
    assert moe_out["compute_s"] == pytest.approx(dense["compute_s"] + L * (router_fwd + router_bwd), rel=1e-12)
    assert moe_out["ep_comm_s"] == 0.0 and moe_out["tp_comm_s"] == dense["tp_comm_s"]
    router_params = L * 1 * H                                             # TopKRouter.weight [E, h] per layer
    assert moe_out["num_parameters"] == dense["num_parameters"] + router_params
    assert moe_out["optimizer_s"] == pytest.approx(
        ops.optimizer_s(dense["num_parameters"] + router_params, hw), rel=1e-14)
    assert moe_out["model_states_GiB"] * pipeline.GiB == pytest.approx(
        dense["model_states_GiB"] * pipeline.GiB + 18.0 * router_params, rel=1e-14)   # fp32 main gradients
    # model FLOPs: the router's 2 E h per token and layer more
    flops = lambda o: o["model_tflops_per_gpu"] * 1e12 * o["iteration_time_s"]   # noqa: E731
    assert flops(moe_out) - flops(dense) == pytest.approx(3.0 * S * L * 2.0 * H, rel=1e-6)


def test_ep_1_has_no_all_to_all():
    arch = LLAMA._replace(num_experts=8.0, moe_router_topk=2.0)
    assert comm.all_to_all_s(1e9, 1.0, 1.0, H100) == 0.0
    assert experts.ep_exchange_s(1.0, float(S), float(H), 1.0, _hw(ep=1), arch) == (0.0, 0.0)
    code, out = _run(arch, _hw(ep=1, use_flash_attn=1), d=8)
    assert code in (records.OK, records.OUT_OF_MEMORY) and out["ep_comm_s"] == 0.0
    # etp = tp = 2 at ep = 1: no all-to-all, only the expert-TP all-gather and reduce-scatter
    hw = _hw(ep=1, sequence_parallel=1)
    nbytes = experts.dispatch_bytes(1.0, float(S), float(H), 2.0, arch)
    x = 2.0 * comm.group_allgather_s(2.0 * nbytes, 2.0, 1.0, hw)
    assert experts.ep_exchange_s(1.0, float(S), float(H), 2.0, hw, arch) == pytest.approx((x, x), rel=1e-15)
    code, out = _run(arch, _hw(ep=8, use_flash_attn=1), d=8)
    assert out["ep_comm_s"] > 0.0


def test_memory_falls_with_ep_while_model_flops_stay():
    (layers, h, a, g, f, v, s), arch = _mixtral()
    hw0 = _hw(use_flash_attn=1, sequence_parallel=1, distributed_optimizer=1)
    mems, flops, counts = [], [], []
    for ep in (1, 2, 4, 8):
        hw = hw0.copy()
        hw[HW_FIELDS.index("ep")] = ep
        out = np.empty((records.NUM_OUTPUTS, 1))
        code = step.step(float(layers), float(h), float(a), float(g), float(f), float(v), 4096.0, 256.0, 1.0,
                         layout.Layout(1, 1, 16, 4), 1, 1e12, hw, out, 0, arch)
        o = dict(zip(records.OUTPUT_NAMES, out[:, 0]))
        assert code in (records.OK, records.OUT_OF_MEMORY), ep
        mems.append(o["memory_per_gpu_GiB"])
        flops.append(o["model_tflops_per_gpu"] * o["iteration_time_s"])
        counts.append(o["num_parameters"])
    assert all(m1 > m2 for m1, m2 in zip(mems, mems[1:])), mems
    assert flops == pytest.approx([flops[0]] * len(flops), rel=1e-12)
    assert counts == [moe.param_counts(MODEL_PRESETS["mixtral-8x7b"].resolved()).total] * len(counts)


def test_dispatch_bytes_by_hand():
    arch = DEFAULT_ARCH._replace(num_experts=8.0, moe_router_topk=2.0)
    # b s / t tokens routed by a rank, k copies of h bf16 values each
    assert experts.dispatch_bytes(2.0, 4096.0, 4096.0, 2.0, arch) == 2 * 2 * 4096 * 4096 * 2 // 2
    hw = _hw(gpus_per_node=8)
    intra = hw[HW_FIELDS.index("intra_node_Bps")] * hw[HW_FIELDS.index("intra_node_efficiency")]
    inter = hw[HW_FIELDS.index("inter_node_Bps")] * hw[HW_FIELDS.index("inter_node_efficiency")]
    n = 64e6
    # inside a node: 7 of 8 eighths leave the rank, over NVLink
    assert comm.all_to_all_s(n, 8.0, 1.0, hw) == pytest.approx(
        hw[HW_FIELDS.index("intra_node_latency_s")] + n * 7 / 8 / intra, rel=1e-15)
    # ep 16 over two nodes: 7/16 to node peers (NVLink), 8/16 over the NIC, at the same time
    assert comm.all_to_all_s(n, 16.0, 1.0, hw) == pytest.approx(
        hw[HW_FIELDS.index("inter_node_latency_s")] + max(n * 7 / 16 / intra, n * 8 / 16 / inter), rel=1e-15)
    # etp 2 spreads ep 8 over 16 ranks: 4 members per node
    assert comm.all_to_all_s(n, 8.0, 2.0, hw) == pytest.approx(
        hw[HW_FIELDS.index("inter_node_latency_s")] + max(n * 3 / 8 / intra, n * 4 / 8 / inter), rel=1e-15)
    assert ref.all_to_all_s(n, 16.0, 1.0, hw) == pytest.approx(comm.all_to_all_s(n, 16.0, 1.0, hw), rel=1e-15)


@pytest.mark.parametrize("ep, etp, t, d, status", [
    (3, 0, 1, 3, records.BAD_HEADS),          # 8 experts do not split over 3 ranks
    (8, 0, 1, 4, records.BAD_NUM_GPUS),       # 4 ranks per stage cannot hold etp x ep = 8
    (4, 2, 2, 1, records.BAD_NUM_GPUS),       # tp 2 x dp 1 over etp 2 x ep 4
    (0, 0, 1, 1, records.BAD_INPUT),
    (4, 1, 2, 2, records.OK),                 # etp 1 x ep 4 tiles tp 2 x dp 2
    (8, 0, 2, 8, records.OK),              # etp = tp 2 x ep 8 tiles tp 2 x dp 8
    (8, 0, 2, 4, records.BAD_NUM_GPUS),
])
def test_every_invalid_expert_grid_has_its_status(ep, etp, t, d, status):
    arch = LLAMA._replace(num_experts=8.0, moe_router_topk=2.0)
    hw = _hw(ep=ep, etp=etp, use_flash_attn=1, sequence_parallel=1)
    code, out = _run(arch, hw, t=t, d=d, layers=2)
    assert (code if code != records.OUT_OF_MEMORY else records.OK) == status
    cfg = (2, H, A, G, F, V, S, d, 1, t, 1, d, 0, 1e12, hw, ref.ModelFlags(*arch))
    assert ref.step(*cfg)[0] == code
    # a dense model ignores ep and etp
    assert _run(LLAMA, hw, t=t, d=d, layers=2)[0] in (records.OK, records.OUT_OF_MEMORY)


def test_moe_sweep_rows_are_steps_rows_and_cover_the_statuses():
    spec = parse_spec("""
name = "moe"
[model]
presets = ["mixtral-8x7b", "gpt3-1.3b"]
[training]
num_tokens = 1e10
global_batch_size = [64, 128]
micro_batch_size = [1, 2]
recompute = ["none", "full"]
use_flash_attn = true
sequence_parallel = true
distributed_optimizer = true
[cluster]
gpu = "h100-sxm-80gb"
num_gpus = [16, 64]
[parallel]
tp = [1, 2, 4]
pp = [1, 2, 4]
ep = [1, 3, 8]
etp = [0, 1]
""", "<moe>")
    g = grid_mod.build_grid(spec)
    inputs, tokens, out, status = sweep_all_rows(g)
    assert {records.OK, records.BAD_HEADS, records.BAD_NUM_GPUS} <= set(status.tolist())
    cols = ks.rows_from_inputs(inputs)
    ref_out, ref_status = np.empty_like(out), np.empty_like(status)
    ks.evaluate_rows(cols, np.ascontiguousarray(tokens), np.ascontiguousarray(g.hw_table[inputs[ks.INPUT.gpu_index]]),
                     ref_out, ref_status)
    ok = status != records.BAD_NUM_GPUS
    assert (status[ok] == ref_status[ok]).all()
    assert np.array_equal(out[:, ok], ref_out[:, ok], equal_nan=True)
    moe_rows = inputs[ks.INPUT_NAMES.index("num_experts")] == 8
    feasible = np.isin(status, [records.OK, records.OUT_OF_MEMORY])
    assert (out[records.OUTPUT.ep_comm_s, feasible & moe_rows] >= 0.0).all() and (out[records.OUTPUT.ep_comm_s, feasible & ~moe_rows] == 0.0).all()


@pytest.mark.parametrize("seed", [5, 6])
def test_kernel_matches_twin_on_random_moe_configs(seed):
    def with_experts(c, rng):
        c[15] = tk.random_moe_flags(np.random.default_rng(int(rng.integers(2 ** 32))), c[15], c[1], c[10])
    status, out = tk.twin_check(np.random.default_rng(seed), 200, with_experts, invalid_fraction=0.2, min_feasible=40)
    feasible = np.isin(status, [ref.OK, ref.OUT_OF_MEMORY])
    assert (out[records.OUTPUT.ep_comm_s, feasible] > 0.0).sum() > 10
    assert {ref.BAD_HEADS, ref.BAD_NUM_GPUS} <= set(status.tolist())


def test_priced_presets_and_what_is_still_refused():
    assert moe.unpriced_reason(MODEL_PRESETS["mixtral-8x7b"]) is None
    assert moe.unpriced_reason(MODEL_PRESETS["mixtral-8x22b"]) is None
    assert moe.unpriced_reason(MODEL_PRESETS["deepseek-v3"]) is None          # MLA: priced (tests/test_mla.py)
    assert moe.unpriced_reason(MODEL_PRESETS["qwen3-235b-a22b"]) is None       # kv_channels heads: priced
    assert moe.layer_placement(61, moe.parse_layer_pattern("([0]*3+[1]*58)")) == (1, 3)
    assert moe.layer_placement(8, (1, 0, 1, 0, 1, 0, 1, 0)) == (2, 0)
    assert moe.layer_placement(4, (1, 1, 0, 1)) is None
    # the kernels' MoE layer count and parameters follow moe.param_counts on every placement
    for name in ("mixtral-8x7b", "mixtral-8x22b", "deepseek-v3", "qwen3-30b-a3b", "gpt-oss-20b"):
        shape = MODEL_PRESETS[name].resolved()
        row = shape.as_row()
        arch = arch_of_values(row)
        n_moe = sum(moe.moe_layer_pattern(shape.num_layers, shape.moe_layer_freq))
        assert layer_split.moe_layers_of(0.0, float(shape.num_layers), arch.moe_layer_step, arch.moe_first_dense_layers) == n_moe
        if moe.unpriced_reason(shape) is None:
            tot = totals.model_totals(*map(float, row[:7]), 1e12, arch)
            assert tot.num_parameters == moe.param_counts(shape).total, name
            assert math.isclose(tot.forward_flops_per_token * 1.0,
                                tot.forward_flops_per_token, rel_tol=0.0)


def test_expert_parallelism_with_tensor_parallelism_needs_sequence_parallelism():
    # Megatron-core TransformerConfig.__post_init__: "When using expert parallelism and tensor
    # parallelism, sequence parallelism must be used" (a ValueError): status refused
    moe_arch = LLAMA._replace(num_experts=8.0, moe_router_topk=2.0, moe_ffn_hidden_size=float(F))
    flash = dict(use_flash_attn=1)
    assert _run(moe_arch, _hw(ep=8, **flash), t=2, d=8, B=64)[0] == records.REFUSED
    priced = (records.OK, records.OUT_OF_MEMORY)
    assert _run(moe_arch, _hw(ep=8, sequence_parallel=1, **flash), t=2, d=8, B=64)[0] in priced
    assert _run(moe_arch, _hw(ep=8, **flash), t=1, d=8, B=64)[0] in priced       # no tensor parallelism
    assert _run(moe_arch, _hw(ep=1, **flash), t=2, d=8, B=64)[0] in priced       # no expert parallelism
    assert _run(LLAMA, _hw(ep=8, **flash), t=2, d=8, B=64)[0] in priced          # a dense model: ep has no effect
    # the twin refuses the same plan, and the sweep drivers give the same status
    hw = _hw(ep=8, **flash)
    code, _ = ref.step(L, H, A, G, F, V, S, 64, 1, 2, 1, 8, 0, 1e12, list(hw), moe_arch)
    assert code == ref.REFUSED


@pytest.mark.parametrize("t,rc", [(1, 0), (2, 1), (4, 2)])
def test_every_layer_in_bf16_prices_an_fp8_moe_model_as_bf16(t, rc):
    # the experts of a layer kept in bf16 run in bf16 too (review 2026-12-01: they stayed FP8)
    moe_arch = LLAMA._replace(num_experts=16.0, moe_router_topk=2.0, moe_ffn_hidden_size=1024.0)
    base = dict(use_flash_attn=1, sequence_parallel=1 if t > 1 else 0, ep=8,
                async_tensor_model_parallel_allreduce=1, tp_comm_overlap=1 if t > 1 else 0)
    bf16 = _run(moe_arch, _hw(**base), t=t, d=8, B=64, rc=rc, p=2)[1]
    prec = HW_FIELDS.index("precision")
    fp8_all16 = _hw(**base, num_layers_at_start_in_bf16=L)
    fp8_all16[prec] = 1.0
    all16 = _run(moe_arch, fp8_all16, t=t, d=8, B=64, rc=rc, p=2)[1]
    for name in ("iteration_time_s", "compute_s", "tp_comm_s", "memory_per_gpu_GiB"):
        assert all16[name] == pytest.approx(bf16[name], rel=1e-9), name
    # and the twin agrees with the kernel on a few of them kept in bf16
    fp8_some = _hw(**base, num_layers_at_start_in_bf16=3)
    fp8_some[prec] = 1.0
    code, out = _run(moe_arch, fp8_some, t=t, d=8, B=64, rc=rc, p=2)
    r_code, r_out = ref.step(L, H, A, G, F, V, S, 64, 1, t, 2, 8, rc, 1e12, list(fp8_some), moe_arch)
    assert code == r_code
    for name in ("iteration_time_s", "compute_s", "tp_comm_s", "memory_per_gpu_GiB"):
        assert out[name] == pytest.approx(r_out[name], rel=1e-12), name


@pytest.mark.parametrize("column,value,allowed", [
    ("moe_router_topk", 0, "from 1"), ("moe_router_topk", 9, "1 to num_experts"), ("moe_layer_step", 0, "from 1"),
    ("moe_first_dense_layers", 40, "fewer than num_layers"), ("kv_channels", 10_000_000, "to 100000"),
])
def test_evaluate_refuses_the_moe_columns_a_model_file_refuses(column, value, allowed):
    # review 2026-12-01: these were priced (one with NaN times under a priced status)
    import polars as pl
    from vtrain_fast.analysis.evaluate import evaluate_frame
    from vtrain_fast.io.errors import InputError
    row = dict(model=["mixtral-8x7b"], gpu=["h100-sxm-80gb"], tp=[1], pp=[4], dp=[16], micro_batch_size=[1],
               global_batch_size=[256], use_flash_attn=["true"], seq_length=[4096], **{column: [value]})
    with pytest.raises(InputError, match=allowed) as e:
        evaluate_frame(pl.DataFrame(row), "plans.csv")
    assert f"column {column}, row 2" in str(e.value) and "Fix:" in str(e.value)
