"""Heads of ``kv_channels`` channels other than ``hidden_size / num_attention_heads`` (Megatron-LM
``--kv-channels``; Qwen3, gpt-oss, Gemma): ``kv_channels = h / a`` is bit for bit the default 0;
wider heads cost the QKV and projection GEMMs, the attention core and the activations they should
(by hand); parameter counts are :func:`vtrain_fast.model.moe.param_counts`'s; a Qwen3-30B-A3B sweep
runs; the twin agrees on random configurations with such heads."""
from __future__ import annotations


import numpy as np
import pytest

from vtrain_fast.model.records import HW_FIELDS, arch_of_values, MODEL_FIELDS, PRECISION_FP8

from conftest import sweep_all_rows
import test_kernels as tk
from vtrain_fast.hardware.gpus import PRESETS, machine_vector
from vtrain_fast.model import costs, layout, memory, moe, ops, records, step, totals
from vtrain_fast.model import sweep as ks
from vtrain_fast.model.arch import DEFAULT_ARCH
from vtrain_fast.plan import grid as grid_mod
from vtrain_fast.plan.models import MODEL_PRESETS, models_from_tables
from vtrain_fast.plan.spec import parse_spec

H100 = machine_vector(PRESETS["h100-sxm-80gb"])
# a Qwen3-like dense layer: h / a = 64, heads of 128 channels
L, H, A, G, F, V, S = 4, 2048, 32, 4, 6144, 151936, 4096
QWEN = DEFAULT_ARCH._replace(gated_mlp=1.0, normalization=1.0, position_embedding_type=1.0, add_bias_linear=0.0,
                             untie_embeddings_and_output_weights=1.0)


def _hw(**settings):
    hw = H100.copy()
    for k, v in settings.items():
        hw[HW_FIELDS.index(k)] = float(v)
    return hw


def _run(arch, hw, t=1, p=1, d=1, b=1, rc=0, cp=1, h=H):
    out = np.empty((records.NUM_OUTPUTS, 1))
    code = step.step(float(L * p), float(h), float(A), float(G), float(F), float(V), float(S), float(b * d), float(b),
                     layout.Layout(t, cp, d, p), rc, 1e12, hw, out, 0, arch)
    return code, out[:, 0].copy()


HWS = [_hw(), _hw(use_flash_attn=1), _hw(use_flash_attn=1, precision=PRECISION_FP8, sequence_parallel=1,
                                             async_tensor_model_parallel_allreduce=1, tp_comm_overlap=1),
       _hw(use_flash_attn=1, cp_comm_type=1)]


@pytest.mark.parametrize("k", range(len(HWS)))
@pytest.mark.parametrize("t,p,cp,rc", [(1, 1, 1, 0), (2, 2, 1, 2), (4, 1, 2, 1), (2, 1, 4, 0)])
def test_kv_channels_h_over_a_is_bit_identical_to_0(k, t, p, cp, rc):
    hw = HWS[k]
    for arch in (QWEN, DEFAULT_ARCH, QWEN._replace(num_experts=8.0, moe_router_topk=2.0, moe_ffn_hidden_size=768.0)):
        code0, out0 = _run(arch, hw, t=t, p=p, cp=cp, rc=rc, d=2)
        code1, out1 = _run(arch._replace(kv_channels=float(H // A)), hw, t=t, p=p, cp=cp, rc=rc, d=2)
        assert code0 == code1
        assert np.array_equal(out0, out1, equal_nan=True)
        if code0 in (records.OK, records.OUT_OF_MEMORY) and k == 0:
            assert out0[records.OUTPUT.iteration_time_s] > 0.0


def test_preset_rows_write_0_for_the_default_width():
    kv = MODEL_FIELDS.index("kv_channels")
    assert MODEL_PRESETS["llama3-8b"].as_row()[kv] == 0          # 4096 / 32 = 128: the default
    assert MODEL_PRESETS["qwen3-30b-a3b"].as_row()[kv] == 128     # 2048 / 32 = 64 < 128
    assert MODEL_PRESETS["gpt-oss-20b"].as_row()[kv] == 64        # 2880 / 64 = 45 < 64
    assert moe.unpriced_reason(MODEL_PRESETS["qwen3-30b-a3b"]) is None
    assert moe.unpriced_reason(MODEL_PRESETS["gpt-oss-120b"]) is None
    assert moe.unpriced_reason(MODEL_PRESETS["deepseek-v3"]) is None   # MLA: priced (tests/test_mla.py)


def test_wider_heads_cost_their_gemms_by_hand():
    """Unfused attention, bf16, no RoPE, t = 2: the layer forward with heads of 128 instead of 64
    costs the wider QKV (h -> (a d + 2 g d) / t) and projection (a d / t -> h) GEMMs, the scores and
    context GEMMs over heads of d, and the wider context permute copy, nothing else."""
    hw, t, b = _hw(), 2.0, 1.0
    narrow, wide = DEFAULT_ARCH._replace(gated_mlp=1.0), DEFAULT_ARCH._replace(gated_mlp=1.0, kv_channels=128.0)
    tokens = b * S
    qw0, qw1 = float(H), float(A * 128)

    def attention_gemms(qw):
        qkv = (qw + 2.0 * qw * G / A) / t
        return (ops.linear_gemm_time_s(tokens, qkv, float(H), hw) + ops.linear_gemm_time_s(tokens, float(H), qw / t, hw)
                + ops.gemm_time_s(float(S), float(S), qw / A, b * A / t, hw)
                + ops.gemm_time_s(float(S), qw / A, float(S), b * A / t, hw))
    by_hand = (attention_gemms(qw1) - attention_gemms(qw0)
               + ops.memory_bound_time_s(4.0 * tokens * (qw1 - qw0) / t, 0.0, hw))
    got = (ops.layer_forward_s(b, float(S), float(H), float(A), float(G), float(F), t, hw, wide)
           - ops.layer_forward_s(b, float(S), float(H), float(A), float(G), float(F), t, hw, narrow))
    assert got == pytest.approx(by_hand, rel=1e-9) and got > 0.0
    # FLOPs per token: QKV 2 h (qw + 2 qw g / a), projection 2 qw h, scores and context 4 s qw
    dq = qw1 - qw0
    by_hand = 2.0 * H * (dq + 2.0 * dq * G / A) + 2.0 * dq * H + 4.0 * S * dq
    assert (totals.forward_flops_per_token(1.0, H, A, G, F, V, S, 1.0, qw1)
            - totals.forward_flops_per_token(1.0, H, A, G, F, V, S, 1.0)) == pytest.approx(by_hand, rel=1e-12)


@pytest.mark.parametrize("sp,flash", [(0.0, 0.0), (1.0, 1.0)])
def test_wider_heads_store_their_activations_by_hand(sp, flash):
    """Korthikanti's Q, K, V and context terms at a d wide: ``2 s b (a d) (2 + 2 g / a) / t`` bytes
    more than at ``h``; the layer-norm, dropout and MLP terms and the scores keep theirs."""
    b, t = 2.0, 2.0
    qw = float(A * 128)
    extra = (memory.layer_activation_bytes(b, S, H, A, G, F, t, flash, sp, 1.0, qw)
             - memory.layer_activation_bytes(b, S, H, A, G, F, t, flash, sp, 1.0))
    by_hand = S * b * (qw - H) * (2.0 + 2.0 + 2.0 * G / A + 2.0 * G / A) / t     # Q, context, K, V
    assert extra == pytest.approx(by_hand, rel=1e-12) and extra > 0.0
    # the whole step: more attention time and memory, same MLP
    hw = _hw(use_flash_attn=flash, sequence_parallel=sp)
    _, narrow = _run(QWEN, hw, t=2)
    _, wide = _run(QWEN._replace(kv_channels=128.0), hw, t=2)
    for o in (records.OUTPUT.iteration_time_s, records.OUTPUT.compute_s, records.OUTPUT.activations_GiB, records.OUTPUT.model_states_GiB, records.OUTPUT.num_parameters):
        assert wide[o] > narrow[o], records.OUTPUT_NAMES[o]
    mb_n = costs.micro_batch_costs(1.0, S, H, A, G, F, V, 2.0, hw, QWEN)
    mb_w = costs.micro_batch_costs(1.0, S, H, A, G, F, V, 2.0, hw, QWEN._replace(kv_channels=128.0))
    assert mb_w.layer_activation_bytes - mb_n.layer_activation_bytes == pytest.approx(
        S * (qw - H) * (4.0 + 4.0 * G / A) / 2.0, rel=1e-12)
    assert mb_w.attention_core_forward_s > mb_n.attention_core_forward_s


def _totals(shape):
    row = shape.resolved().as_row()
    return totals.model_totals(*map(float, row[:7]), 1e12, arch_of_values(row))


@pytest.mark.parametrize("name", ["qwen3-30b-a3b", "qwen3-235b-a22b", "gpt-oss-20b", "gpt-oss-120b"])
def test_preset_parameters_are_param_counts(name):
    shape = MODEL_PRESETS[name]
    assert _totals(shape).num_parameters == moe.param_counts(shape.resolved()).total


def test_a_gemma_7b_like_shape_has_its_published_parameters():
    gemma = models_from_tables({"gemma-7b-like": dict(
        num_layers=28, hidden_size=3072, num_attention_heads=16, num_query_groups=16, ffn_hidden_size=24576,
        gated_mlp=True, vocab_size=256000, seq_length=8192, kv_channels=256, position_embedding_type="rope",
        normalization="RMSNorm", add_bias_linear=False, source="test")}, "<test>")["gemma-7b-like"]
    assert moe.unpriced_reason(gemma) is None
    n = _totals(gemma).num_parameters
    assert n == moe.param_counts(gemma.resolved()).total == 8_537_680_896     # Gemma 7B's checkpoint
    # per rank: the attention's weights over t, as the whole layer's
    row = gemma.resolved().as_row()
    arch = arch_of_values(row)
    per_rank = memory.layer_params_per_rank(3072.0, 16.0, 16.0, 24576.0, 2.0, arch)
    assert per_rank * 2.0 - 2.0 * memory.norm_params(3072.0, arch) == pytest.approx(
        memory.layer_params(3072.0, 16.0, 16.0, 24576.0, arch), rel=1e-12)


def test_a_hidden_size_heads_do_not_divide_is_priced_with_kv_channels():
    """gpt-oss's 2880 / 64 = 45 divides; a shape whose heads do not divide hidden_size is priced when
    kv_channels gives their width, refused (bad_heads) without."""
    hw = _hw(use_flash_attn=1)
    assert _run(QWEN, hw, h=H + 8)[0] == records.BAD_HEADS
    assert _run(QWEN._replace(kv_channels=64.0), hw, h=H + 8)[0] in (records.OK, records.OUT_OF_MEMORY)


def test_qwen3_30b_a3b_sweep_runs_and_is_finite():
    spec = parse_spec("""
name = "qwen3"
[model]
presets = ["qwen3-30b-a3b"]
[training]
num_tokens = 1e11
global_batch_size = [256]
micro_batch_size = [1]
recompute = ["none", "full"]
use_flash_attn = true
sequence_parallel = true
distributed_optimizer = true
[cluster]
gpu = "h100-sxm-80gb"
num_gpus = [16]
[parallel]
tp = [1, 2]
pp = [1, 2]
ep = [1, 8]
""", "<qwen3>")
    g = grid_mod.build_grid(spec)
    inputs, tokens, out, status = sweep_all_rows(g)
    assert (inputs[ks.INPUT_NAMES.index("kv_channels")] == 128).all()
    feasible = np.isin(status, [records.OK, records.OUT_OF_MEMORY])
    assert feasible.sum() >= 8, status
    assert np.isfinite(out[:, feasible]).all()
    assert (out[records.OUTPUT.iteration_time_s, feasible] > 0.0).all() and (out[records.OUTPUT.mfu, feasible] < 1.0).all()
    ep = g.hw_table[inputs[ks.INPUT.gpu_index], HW_FIELDS.index("ep")]
    assert (ep == 8).any() and (out[records.OUTPUT.ep_comm_s, feasible & (ep == 8)] > 0.0).all()
    # the sweep's rows are step's rows
    cols = ks.rows_from_inputs(inputs)
    ref_out, ref_status = np.empty_like(out), np.empty_like(status)
    ks.evaluate_rows(cols, np.ascontiguousarray(tokens), np.ascontiguousarray(g.hw_table[inputs[ks.INPUT.gpu_index]]),
                     ref_out, ref_status)
    assert (status == ref_status).all() and np.array_equal(out, ref_out, equal_nan=True)


@pytest.mark.parametrize("seed", [11, 12])
def test_kernel_matches_twin_with_kv_channels(seed):
    def with_kv_channels(c, rng):
        hd = max(int(c[1]) // max(int(c[2]), 1), 1)
        c[15] = c[15]._replace(kv_channels=float(rng.choice([64, 128, 256, 2 * hd, max(hd // 2, 1)])))
    tk.twin_check(np.random.default_rng(seed), 150, with_kv_channels)
