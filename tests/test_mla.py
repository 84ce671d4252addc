"""Multi-head latent attention in the kernels (DeepSeek-V2 arXiv:2405.04434 Sec. 2.1.2-2.1.3,
DeepSeek-V3 arXiv:2412.19437 Sec. 2.1.1; Megatron-core MLASelfAttention): the twin agrees on random
MLA configurations; a layer's forward FLOPs and its weights per rank by hand; DeepSeek-V3's priced
parameters and model FLOPs; tensor parallelism shrinks MLA's split linears, not its duplicated down
projections."""
from __future__ import annotations


import numpy as np
import pytest

import test_kernels as tk
from vtrain_fast.hardware.gpus import PRESETS, machine_vector
from vtrain_fast.model import memory, moe, ops, totals
from vtrain_fast.model.records import HW_FIELDS, arch_of_values
from vtrain_fast.plan.models import MODEL_PRESETS

H100 = machine_vector(PRESETS["h100-sxm-80gb"])
# DeepSeek-V3's attention (arXiv:2412.19437 Sec. 4.2) on a dense gated MLP of its dense width
H, A, F, V = 7168, 128, 18432, 129280
QL, KVL, QK, R, DV = 1536, 512, 128, 64, 128
DQ = QK + R


def _arch(q_lora=QL, **kw):
    base = arch_of_values(MODEL_PRESETS["deepseek-v3"].as_row())
    dense = base._replace(num_experts=0.0, moe_router_topk=2.0, moe_ffn_hidden_size=0.0,
                          moe_shared_expert_intermediate_size=0.0, moe_layer_step=1.0, moe_first_dense_layers=0.0)
    return dense._replace(q_lora_rank=float(q_lora), **kw)


def _hw(base=H100, **settings):
    hw = base.copy()
    for k, v in settings.items():
        hw[HW_FIELDS.index(k)] = float(v)
    return hw


def _flop_counter(**settings):
    """A machine on which a phase's seconds are its FLOPs / 1e15: GEMMs and FlashAttention at 1e15
    FLOP/s, every SM busy (one SM), free memory traffic, no kernel overheads, bf16."""
    return _hw(peak_flops=1e15, gemm_efficiency=1.0, flash_attention_efficiency=1.0, num_sms=1.0, hbm_Bps=1e30,
               kernel_overhead_s=0.0, host_launch_s=0.0, precision=0.0, use_flash_attn=1.0, **settings)


def random_mla_flags(rng, flags, h, a):
    """``flags`` with multi-head latent attention of random widths (with or without q_lora_rank)."""
    h = max(h, 1)                       # (an invalid config's hidden size may be 0 or negative)
    return flags._replace(kv_channels=0.0, multi_latent_attention=1.0,
                          q_lora_rank=float(rng.choice([0, 0, 64, int(rng.integers(16, 2 * h + 16))])),
                          kv_lora_rank=float(rng.choice([32, 128, 512, int(rng.integers(8, h + 8))])),
                          qk_head_dim=float(rng.choice([16, 64, 128, int(rng.integers(1, 200))])),
                          qk_pos_emb_head_dim=float(rng.choice([0, 32, 64])),
                          v_head_dim=float(rng.choice([16, 64, 128, int(rng.integers(1, 200))])))


@pytest.mark.parametrize("seed", [21, 22])
def test_kernel_matches_twin_with_mla(seed):
    def with_mla(c, rng):
        c[3] = c[2]                         # MLA: no query groups
        if rng.random() < 0.4:
            c[15] = tk.random_moe_flags(np.random.default_rng(int(rng.integers(2 ** 32))), c[15], c[1], c[10])
        c[15] = random_mla_flags(rng, c[15], int(c[1]), int(c[2]))
        if int(c[9]) > 0 and c[2] % int(c[9]):    # heads over tp (the config's tp divided gcd(a, g)); tp 0: an invalid row
            c[9] = 1
    tk.twin_check(np.random.default_rng(seed), 150, with_mla)


@pytest.mark.parametrize("q_lora", [QL, 0])
def test_forward_flops_of_an_mla_layer_by_hand(q_lora):
    b, s, t = 1.0, 4096.0, 1.0
    arch = _arch(q_lora)
    hw = _flop_counter()
    tokens = b * s
    # the projections' weights: q down + q up (or q at full rank), kv down (with the rotary key),
    # kv up (keys and values), output projection; the gated MLP's three h x f
    q = H * QL + QL * A * DQ if q_lora else H * A * DQ
    weights = q + H * (KVL + R) + KVL * A * (QK + DV) + A * DV * H + 3 * H * F
    # the causal core: Q K^T over dq channels and P V over v_head_dim, half the s x s
    core = 4.0 * b * s * s * A * (DQ + DV) / 2.0 / 2.0
    flops = ops.layer_forward_s(b, s, float(H), float(A), float(A), float(F), t, hw, arch) * 1e15
    assert flops == pytest.approx(2.0 * tokens * weights + core, rel=1e-12)
    # backward: twice the linears' FLOPs, 2.5 x the core's
    flops_b = ops.layer_backward_s(b, s, float(H), float(A), float(A), float(F), t, hw, arch) * 1e15
    assert flops_b == pytest.approx(4.0 * tokens * weights + 2.5 * core, rel=1e-12)
    # the model-FLOPs count per token: 2 per weight, scores and context over the full s x s
    per_token = totals.forward_flops_per_token(1.0, float(H), float(A), float(A), float(F), 1.0, s, 1.0,
                                             ops.attention_width(H, A, arch), arch)
    assert per_token == pytest.approx(2.0 * weights + 2.0 * s * A * (DQ + DV) + 2.0 * H, rel=1e-12)


def test_mla_weights_per_rank_by_hand():
    arch = _arch()
    norm = H                                            # RMSNorm: its weight
    replicated = H * QL + H * (KVL + R) + (QL + KVL)    # down projections and the q / kv norms
    split = QL * A * DQ + KVL * A * (QK + DV) + A * DV * H + 3 * H * F
    for t in (1.0, 8.0):
        got = memory.layer_params_per_rank(float(H), float(A), float(A), float(F), t, arch)
        assert got == pytest.approx(replicated + split / t + 2 * norm, rel=1e-14), t
    assert memory.layer_params(float(H), float(A), float(A), float(F), arch) == pytest.approx(
        replicated + split + 2 * norm, rel=1e-14)
    # the attention block is moe.attention_params's count
    shape = MODEL_PRESETS["deepseek-v3"].resolved()
    assert memory.mla_attention_params_per_rank(float(H), float(A), 1.0, arch) == moe.attention_params(shape)


def test_deepseek_v3_priced_parameters_and_model_flops():
    shape = MODEL_PRESETS["deepseek-v3"]
    assert moe.unpriced_reason(shape) is None
    row = shape.as_row()
    arch = arch_of_values(row)
    L, h, a, g, f, v, s = map(float, row[:7])
    assert g == a                                       # MLA: keys and values per head
    n_params, fwd_flops, _ = totals.model_totals(L, h, a, g, f, v, s, 1e12, arch)
    assert n_params == moe.param_counts(shape.resolved()).total
    assert abs(n_params / 671e9 - 1.0) < 0.01           # arXiv:2412.19437: 671B total
    counts = moe.param_counts(shape.resolved())
    assert abs(counts.active / 37e9 - 1.0) < 0.02       # 37B activated
    # MFU's FLOPs: 2 per active weight (the embedding lookup and the norms aside) plus attention
    attention = L * 2.0 * s * a * (DQ + DV)
    assert (fwd_flops - attention) == pytest.approx(2.0 * (counts.active - counts.embedding), rel=2e-3)


def test_tensor_parallelism_shrinks_the_split_linears_not_the_down_projections():
    arch = _arch()
    b, s = 1.0, 4096.0
    tokens = b * s
    sp_off, sp_on = _flop_counter(sequence_parallel=0.0), _flop_counter(sequence_parallel=1.0)
    one = ops.layer_forward_s(b, s, float(H), float(A), float(A), float(F), 1.0, sp_on, arch)
    eight = ops.layer_forward_s(b, s, float(H), float(A), float(A), float(F), 8.0, sp_on, arch)
    assert eight < one
    down = 2.0 * tokens * (H * QL + H * (KVL + R)) / 1e15       # the duplicated down projections' seconds
    up = 2.0 * tokens * (QL * A * DQ + KVL * A * (QK + DV)) / 1e15
    # without sequence parallelism each rank runs the down projections on all the tokens: they do not shrink
    no_sp = ops.mla_gemms_s(tokens, float(H), float(A), 8.0, 1.0, False, sp_off, arch)
    assert no_sp == pytest.approx(down + up / 8.0, rel=1e-12)
    # with it, each rank runs them on its own tokens: the same total work, whole weights on every rank
    with_sp = ops.mla_gemms_s(tokens, float(H), float(A), 8.0, 8.0, False, sp_on, arch)
    assert with_sp == pytest.approx(down / 8.0 + up / 8.0, rel=1e-12)
    w1 = memory.layer_params_per_rank(float(H), float(A), float(A), float(F), 1.0, arch)
    w8 = memory.layer_params_per_rank(float(H), float(A), float(A), float(F), 8.0, arch)
    replicated = H * QL + H * (KVL + R) + (QL + KVL) + 2 * H     # down projections and norms: on every rank
    assert w8 - replicated == pytest.approx((w1 - replicated) / 8.0, rel=1e-14)


def test_mla_activations_count_the_latent_norms():
    arch = _arch()
    b, s, t = 1.0, 4096.0, 8.0
    qw = ops.attention_width(H, A, arch)
    base = memory.layer_activation_bytes(b, s, float(H), float(A), float(A), float(F), t, 1.0, 1.0, 1.0, qw)
    with_latent = memory.layer_activation_bytes(b, s, float(H), float(A), float(A), float(F), t, 1.0, 1.0, 1.0, qw,
                                                float(QL + KVL))
    assert with_latent - base == pytest.approx(4.0 * b * s * (QL + KVL) / t, rel=1e-12)
    # Q, K, V and the context at their own widths: the (4 + 4 g/a) qw / h term
    korthikanti = memory.layer_activation_bytes(b, s, float(H), float(A), float(A), float(F), t, 1.0, 1.0, 1.0, H)
    assert base - korthikanti == pytest.approx(2.0 * b * s * A * (DQ + DQ + DV + DV) / t - 8.0 * b * s * H / t,
                                               rel=1e-9)
