"""A gated (SwiGLU) MLP (model shape flag ``gated_mlp``, Megatron-LM ``--swiglu``, Llama): three
h x f matrices, FC1 of width 2f (gate and up), an activation that reads 2f and writes f."""
from __future__ import annotations

import polars as pl
import pytest

from vtrain_fast.analysis.evaluate import evaluate_frame
from vtrain_fast.model import memory, totals
from vtrain_fast.model.arch import DEFAULT_ARCH
from vtrain_fast.plan.models import MODEL_PRESETS
from vtrain_fast.plan.spec import parse_spec

from conftest import ONE_POINT_SPEC

H, A, F = 4096.0, 32.0, 14336.0
PLAN = dict(num_layers=32, hidden_size=4096, num_attention_heads=32, num_query_groups=8, seq_length=4096,
            vocab_size=128256, global_batch_size=512, micro_batch_size=1, tp=4, pp=2, dp=4,
            gpu="h100-sxm-80gb", recompute="selective", use_flash_attn="true")


def test_three_matrices_and_their_flops():
    two = memory.layer_params(H, A, 8.0, F)
    three = memory.layer_params(H, A, 8.0, F, DEFAULT_ARCH._replace(gated_mlp=1.0))
    assert three - two == pytest.approx(H * F + F)                 # the gate's weight and bias
    fl2 = totals.forward_flops_per_token(1.0, H, A, 8.0, F, 1.0, 1.0)
    fl3 = totals.forward_flops_per_token(1.0, H, A, 8.0, F, 1.0, 1.0, 1.0)
    assert fl3 - fl2 == pytest.approx(2.0 * H * F)


def test_it_matches_a_one_and_a_half_times_wider_two_matrix_mlp_in_weights_flops_and_memory():
    """The equivalence the presets used before the flag: same weights, FLOPs and stored bytes;
    the time differs (other GEMM shapes and a heavier activation backward)."""
    gated = evaluate_frame(pl.DataFrame([dict(PLAN, ffn_hidden_size=14336, gated_mlp="true")])).row(0, named=True)
    wide = evaluate_frame(pl.DataFrame([dict(PLAN, ffn_hidden_size=21504)])).row(0, named=True)
    # the same weights; the biases differ (2f for gate and up against 1.5f)
    assert gated["num_parameters"] - wide["num_parameters"] == 32 * (2 * 14336 - 21504)
    assert gated["model_tflops_per_gpu"] * gated["iteration_time_s"] == pytest.approx(
        wide["model_tflops_per_gpu"] * wide["iteration_time_s"], rel=1e-12)   # the same model FLOPs
    assert gated["activations_GiB"] == pytest.approx(wide["activations_GiB"], rel=1e-12)
    assert gated["iteration_time_s"] != wide["iteration_time_s"]
    assert gated["iteration_time_s"] == pytest.approx(wide["iteration_time_s"], rel=0.05)
    assert gated["gated_mlp"] is True and wide["gated_mlp"] is False


def test_gated_costs_more_than_the_two_matrix_mlp_of_the_same_width():
    two, three = evaluate_frame(pl.DataFrame([dict(PLAN, ffn_hidden_size=14336, gated_mlp=g)
                                              for g in ("false", "true")])).rows(named=True)
    for col in ("iteration_time_s", "num_parameters", "memory_per_gpu_GiB", "compute_s"):
        assert three[col] > two[col], col


def test_the_llama_presets_are_gated_with_their_published_widths():
    for name, ffn in (("llama2-7b", 11008), ("llama3-8b", 14336), ("llama3-70b", 28672), ("llama3-405b", 53248)):
        m = MODEL_PRESETS[name]
        assert m.gated_mlp and m.ffn_hidden_size == ffn, name
    assert not MODEL_PRESETS["gpt3-175b"].gated_mlp


def test_a_spec_gives_it_as_a_shape_key_or_a_list():
    spec = parse_spec(ONE_POINT_SPEC.format(training="").replace(
        'presets = ["gpt3-125m"]', "num_layers = 12\nhidden_size = 768\nnum_attention_heads = 12\n"
        "seq_length = 2048\nffn_hidden_size = 2048\ngated_mlp = [false, true]"), "s.toml")
    assert [m.gated_mlp for m in spec.models] == [False, True]
    assert spec.models[1].name.endswith("-swiglu") and spec.models[0].name != spec.models[1].name
    with pytest.raises(Exception, match="model.gated_mlp"):
        parse_spec(ONE_POINT_SPEC.format(training="").replace(
            'presets = ["gpt3-125m"]', "num_layers = 12\nhidden_size = 768\nnum_attention_heads = 12\n"
            "seq_length = 2048\ngated_mlp = 1"), "s.toml")
