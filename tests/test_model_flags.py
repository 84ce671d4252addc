"""Architecture flags of a model shape (vtrain_fast.model.arch): normalization, position embedding,
linear biases and a tied or untied LM head, besides gated_mlp. Each changes the numbers it should
and no other."""
from __future__ import annotations

import polars as pl
import pytest

from conftest import ONE_POINT_SPEC
from vtrain_fast.analysis.evaluate import evaluate_frame
from vtrain_fast.hardware.gpus import PRESETS, machine_vector
from vtrain_fast.io.errors import InputError
from vtrain_fast.model import memory, ops
from vtrain_fast.model.arch import ARCH_FLAGS, DEFAULT_ARCH, arch_of
from vtrain_fast.plan.models import MODEL_PRESETS, models_from_tables
from vtrain_fast.plan.spec import parse_spec

H, A, G, F, V, S = 4096.0, 32.0, 8.0, 14336.0, 128256.0, 4096.0
PLAN = dict(num_layers=32, hidden_size=4096, num_attention_heads=32, num_query_groups=8, ffn_hidden_size=14336,
            vocab_size=128256, seq_length=4096, gated_mlp="true", global_batch_size=64, micro_batch_size=1,
            tp=2, pp=1, dp=4, gpu="h100-sxm-80gb", recompute="selective", use_flash_attn="true")


def rows(*variants, **common):
    return evaluate_frame(pl.DataFrame([{**PLAN, **common, **v} for v in variants])).rows(named=True)


def test_parameter_counts_of_each_flag():
    base = memory.model_params(32.0, H, A, G, F, V, S, DEFAULT_ARCH)
    def without(**kw):
        return base - memory.model_params(32.0, H, A, G, F, V, S, DEFAULT_ARCH._replace(**kw))
    qkv_out = H + 2 * H * G / A
    assert without(normalization=1.0) == 2 * 32 * H + H                 # RMSNorm: no bias, 2 per layer + final
    assert without(position_embedding_type=1.0) == S * H                # RoPE: no table
    assert without(position_embedding_type=2.0) == S * H
    assert without(add_bias_linear=0.0) == 32 * (qkv_out + H + F + H)  # QKV, projection, FC1, FC2 biases
    assert without(untie_embeddings_and_output_weights=1.0) == -V * H   # a separate head: v h more


def test_a_tied_head_at_pp_1_holds_and_steps_the_table_once():
    tied, untied = rows({"untie_embeddings_and_output_weights": "false"}, {"untie_embeddings_and_output_weights": "true"})
    table_per_rank = V * H / 2
    assert untied["num_parameters"] - tied["num_parameters"] == V * H
    # 2 + 4 + 12 bytes per parameter (bf16 weight, fp32 main gradient, master and Adam states)
    assert (untied["model_states_GiB"] - tied["model_states_GiB"]) * 2 ** 30 == pytest.approx(18 * table_per_rank)
    assert untied["optimizer_s"] > tied["optimizer_s"] and untied["dp_comm_s"] > tied["dp_comm_s"]
    assert untied["activations_GiB"] == tied["activations_GiB"] and untied["tp_comm_s"] == tied["tp_comm_s"]


def test_a_tied_head_over_a_pipeline_all_reduces_the_shared_gradient():
    """Megatron-LM keeps the tied table on the first and the last stage and all-reduces its gradient
    between them after the backward: dp_comm_s at dp = 1 is that exchange alone."""
    tied, untied = rows({"untie_embeddings_and_output_weights": "false"}, {"untie_embeddings_and_output_weights": "true"},
                        pp=4, dp=1, global_batch_size=16)
    assert untied["dp_comm_s"] == 0.0 and tied["dp_comm_s"] > 0.0
    assert tied["memory_per_gpu_GiB"] == untied["memory_per_gpu_GiB"]    # each end holds its copy either way
    assert tied["iteration_time_s"] - untied["iteration_time_s"] == pytest.approx(tied["dp_comm_s"], rel=1e-9)


def test_rope_adds_its_kernels_to_the_layer_and_drops_the_position_table():
    hw = machine_vector(PRESETS["h100-sxm-80gb"])
    rope = DEFAULT_ARCH._replace(position_embedding_type=1.0)
    b, s, t = 1.0, 4096.0, 2.0
    nbytes, kernels = ops.rope_costs(b, s, H, A, G, t, rope)
    assert nbytes == 4.0 * b * s * (H + H * G / A) / t and kernels == 2.0
    assert ops.rope_costs(b, s, H, A, G, t, DEFAULT_ARCH) == (0.0, 0.0)
    assert ops.layer_forward_s(b, s, H, A, G, F, t, hw, rope) > ops.layer_forward_s(b, s, H, A, G, F, t, hw)
    assert ops.layer_backward_s(b, s, H, A, G, F, t, hw, rope) > ops.layer_backward_s(b, s, H, A, G, F, t, hw)
    assert ops.embedding_s(b, s, H, V, t, hw, rope) < ops.embedding_s(b, s, H, V, t, hw)


def test_rmsnorm_and_biases_change_parameters_not_kernel_time():
    """An RMSNorm moves a LayerNorm's bytes and the bias adds are fused: the layer kernels are
    unchanged; only the parameters (and so gradient accumulation and Adam) shrink."""
    hw = machine_vector(PRESETS["h100-sxm-80gb"])
    for arch in (DEFAULT_ARCH._replace(normalization=1.0), DEFAULT_ARCH._replace(add_bias_linear=0.0)):
        assert ops.layer_forward_s(1.0, S, H, A, G, F, 2.0, hw, arch) == ops.layer_forward_s(1.0, S, H, A, G, F, 2.0, hw)
        assert ops.layer_backward_s(1.0, S, H, A, G, F, 2.0, hw, arch) == ops.layer_backward_s(1.0, S, H, A, G, F, 2.0, hw)
    base, rms, nobias = rows({}, {"normalization": "RMSNorm"}, {"add_bias_linear": "false"})
    for other in (rms, nobias):
        assert other["num_parameters"] < base["num_parameters"]
        assert other["compute_s"] < base["compute_s"] and other["compute_s"] == pytest.approx(base["compute_s"], rel=1e-4)
        assert other["optimizer_s"] < base["optimizer_s"]


def test_the_llama_presets_carry_llamas_layer():
    m = MODEL_PRESETS["llama3-70b"]
    assert (m.gated_mlp, m.normalization, m.position_embedding_type, m.add_bias_linear,
            m.untie_embeddings_and_output_weights) == (True, "RMSNorm", "rope", False, True)
    g = MODEL_PRESETS["gpt3-175b"]
    assert arch_of(g.arch_values()) == DEFAULT_ARCH


def test_spec_lists_name_the_shapes_and_bad_values_are_refused():
    text = ONE_POINT_SPEC.format(training="").replace('presets = ["gpt3-125m"]', (
        "num_layers = 12\nhidden_size = 768\nnum_attention_heads = 12\nseq_length = 2048\n"
        'normalization = ["LayerNorm", "RMSNorm"]\nposition_embedding_type = "rope"'))
    spec = parse_spec(text, "s.toml")
    assert [m.name for m in spec.models] == ["custom-12L-768h-12a-2048s-rope", "custom-12L-768h-12a-2048s-rmsnorm-rope"]
    for key, bad in (("normalization", '"BatchNorm"'), ("position_embedding_type", '"alibi"'),
                     ("add_bias_linear", '"false"'), ("untie_embeddings_and_output_weights", "1")):
        with pytest.raises(InputError, match=f"model.{key}") as e:
            parse_spec(ONE_POINT_SPEC.format(training="").replace(
                'presets = ["gpt3-125m"]', f"num_layers = 12\nhidden_size = 768\nnum_attention_heads = 12\n"
                                           f"seq_length = 2048\n{key} = {bad}"), "s.toml")
        assert "e.g." in str(e.value)


def test_model_files_and_evaluate_columns_take_the_flags():
    shapes = models_from_tables({"mine": dict(num_layers=4, hidden_size=256, num_attention_heads=4, seq_length=512,
                                              normalization="rmsnorm", add_bias_linear=False)}, "m.toml")
    assert shapes["mine"].normalization == "RMSNorm" and shapes["mine"].add_bias_linear is False
    with pytest.raises(InputError, match="normalization"):
        models_from_tables({"x": dict(num_layers=4, hidden_size=256, num_attention_heads=4, seq_length=512,
                                      normalization=1)}, "m.toml")
    out = rows({"normalization": "rmsnorm", "position_embedding_type": "ROPE"})[0]
    assert out["normalization"] == "RMSNorm" and out["position_embedding_type"] == "rope"
    with pytest.raises(InputError, match="column normalization"):
        rows({"normalization": "batchnorm"})


def test_every_flag_is_a_column_of_sweeps_and_evaluate(tmp_path):
    from conftest import SMALL_SWEEP
    from vtrain_fast.analysis.query import scan_results
    from vtrain_fast.engine.run import run_sweep
    spec = parse_spec(SMALL_SWEEP.format(training="").replace('presets = ["gpt3-1.3b"]', 'presets = ["gpt3-1.3b", "llama2-7b"]'),
                      "s.toml")
    run_sweep(spec, tmp_path / "f")
    df = scan_results(tmp_path / "f").collect()
    for fl in ARCH_FLAGS:
        assert fl.name in df.columns
    llama = df.filter(pl.col("model") == "llama2-7b")
    assert (llama["normalization"] == "RMSNorm").all() and (~llama["add_bias_linear"]).all()
    gpt = df.filter(pl.col("model") == "gpt3-1.3b")
    assert (gpt["position_embedding_type"] == "learned_absolute").all() and (~gpt["untie_embeddings_and_output_weights"]).all()
