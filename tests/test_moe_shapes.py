"""Mixture-of-experts model shapes (issue 13, the model description): the registry fields, the
parameter counts against the published ones, import-hf of the MoE families, and the refusal of
MoE models by sweeps and evaluate until the kernels price them."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import SMALL_SWEEP, flat
from vtrain_fast.cli import shape_params
from vtrain_fast.io.errors import InputError
from vtrain_fast.model.moe import (SHAPE_FIELDS, is_moe, moe_layer_pattern, param_counts, parse_layer_pattern,
                                   unpriced_reason)
from vtrain_fast.plan.hf import shape_from_config
from vtrain_fast.plan.models import MODEL_PRESETS, models_from_tables

HF = Path(__file__).parent / "data" / "hf"

# Published parameters, in billions: (total, active, whether the publisher's active count
# includes the word embedding).
PUBLISHED = {
    # Jiang et al. 2024, "Mixtral of Experts" (arXiv:2401.04088), Sec. 2: 46.7B total, 12.9B per token.
    "mixtral-8x7b": (46.7, 12.9, True),
    # Mistral AI, "Cheaper, Better, Faster, Stronger" (2024-04-17): 141B total, 39B active.
    "mixtral-8x22b": (141.0, 39.0, True),
    # DeepSeek-V3 Technical Report (arXiv:2412.19437), abstract: 671B total; the active count of
    # the main model, 36.6B "including 0.9B for the output Head" (README_WEIGHTS.md of
    # deepseek-ai/DeepSeek-V3: the embedding lookup not counted; the abstract rounds it to 37B).
    "deepseek-v3": (671.0, 36.6, False),
    # Model card of Qwen/Qwen3-235B-A22B: 235B in total, 22B activated.
    "qwen3-235b-a22b": (235.0, 22.0, True),
    # OpenAI, "gpt-oss-120b & gpt-oss-20b Model Card" (2025-08-05), Table 1: total 116.83B / 20.91B,
    # active 5.13B / 3.61B (the embedding not counted: its footnote's convention).
    "gpt-oss-120b": (116.83, 5.13, False),
    "gpt-oss-20b": (20.91, 3.61, False),
}
# Model card of Qwen/Qwen3-30B-A3B: "30.5B in total and 3.3B activated", "Non-Embedding: 29.9B".
# The card truncates to 0.1B (the shape gives 30.53B total and 29.91B without the embedding and
# output layer, both truncated there), so its 3.3B stands for [3.3, 3.4): tested as that interval,
# not within 1 % (the shape's 3.353B is 1.6 % above the truncated figure).
QWEN3_30B = {"total": 30.5, "non_embedding": 29.9, "active_at_least": 3.3, "step": 0.1}


def counts(name):
    return param_counts(MODEL_PRESETS[name])


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_moe_presets_have_the_published_total_and_active_parameters(name):
    total, active, with_embedding = PUBLISHED[name]
    c = counts(name)
    assert c.total / 1e9 == pytest.approx(total, rel=0.01)
    assert (c.active if with_embedding else c.active - c.embedding) / 1e9 == pytest.approx(active, rel=0.01)


def test_qwen3_30b_a3b_within_the_cards_truncation():
    c, m = counts("qwen3-30b-a3b"), MODEL_PRESETS["qwen3-30b-a3b"]
    step = QWEN3_30B["step"]
    assert QWEN3_30B["total"] <= c.total / 1e9 < QWEN3_30B["total"] + step
    assert QWEN3_30B["non_embedding"] <= (c.total - 2 * c.embedding) / 1e9 < QWEN3_30B["non_embedding"] + step
    assert m.untie_embeddings_and_output_weights
    assert QWEN3_30B["active_at_least"] <= c.active / 1e9 < QWEN3_30B["active_at_least"] + step


def test_mixtral_8x7b_is_the_checkpoints_count_exactly():
    """Its safetensors total, the model card's 46.7B: every parameter of the layout is counted."""
    assert counts("mixtral-8x7b").total == hf_params(config("mixtral-8x7b-v0.1"))


@pytest.mark.parametrize("name", [n for n, m in MODEL_PRESETS.items() if not is_moe(m)])
def test_a_dense_shape_counts_as_the_kernels_count_it(name):
    c = counts(name)
    assert c.total == c.active == shape_params(MODEL_PRESETS[name]) and c.routed_experts == 0
    assert unpriced_reason(MODEL_PRESETS[name]) is None


def test_one_expert_top_1_is_the_dense_model_plus_its_router():
    dense = MODEL_PRESETS["llama3-8b"]
    one = replace(dense, num_experts=1, moe_router_topk=1).resolved()
    c = param_counts(one)
    router = dense.num_layers * dense.hidden_size              # num_experts x h per MoE layer
    assert c.total == c.active == shape_params(dense) + router
    assert c.routed_experts == dense.num_layers * 3 * dense.hidden_size * dense.ffn_hidden_size


def test_active_parameters_count_topk_of_the_routed_experts():
    m = MODEL_PRESETS["mixtral-8x7b"]
    c = counts("mixtral-8x7b")
    per_expert = c.routed_experts // (m.num_layers * m.num_experts)
    assert per_expert == 3 * m.hidden_size * m.moe_ffn_hidden_size
    assert c.total - c.active == m.num_layers * (m.num_experts - m.moe_router_topk) * per_expert
    wider = param_counts(replace(m, moe_router_topk=4))
    assert wider.total == c.total and wider.active - c.active == m.num_layers * 2 * per_expert


def test_dense_layers_and_shared_experts_of_deepseek_v3():
    m = MODEL_PRESETS["deepseek-v3"]
    assert moe_layer_pattern(m.num_layers, m.moe_layer_freq) == (0,) * 3 + (1,) * 58
    c = counts("deepseek-v3")
    expert = 3 * m.hidden_size * m.moe_ffn_hidden_size
    assert c.routed_experts == 58 * 256 * expert
    no_shared = param_counts(replace(m, moe_shared_expert_intermediate_size=0))
    assert c.total - no_shared.total == c.active - no_shared.active == 58 * expert


def test_mla_counts_the_low_rank_projections():
    """DeepSeek-V2 (arXiv:2405.04434) Sec. 2.1: W^DQ, W^UQ (with the rotary part), W^DKV with the
    shared rotary key W^KR, W^UK and W^UV, W^O, and the two latent norms."""
    from vtrain_fast.model.moe import attention_params
    m = MODEL_PRESETS["deepseek-v3"]
    h, a = 7168, 128
    expected = (h * 1536 + 1536 + 1536 * a * (128 + 64) + h * (512 + 64) + 512 + 512 * a * (128 + 128)
                + a * 128 * h)
    assert attention_params(m) == expected
    assert attention_params(replace(m, q_lora_rank=0)) == expected - (h * 1536 + 1536 + 1536 * a * 192) + h * a * 192


def test_kv_channels_widen_the_projections():
    m = MODEL_PRESETS["qwen3-30b-a3b"]
    from vtrain_fast.model.moe import attention_params
    h, a, g, d = 2048, 32, 4, 128
    assert attention_params(m) == h * (a + 2 * g) * d + a * d * h


@pytest.mark.parametrize("text,pattern", [
    ("([0]*3+[1]*58)", (0,) * 3 + (1,) * 58), ("[1,0,1]", (1, 0, 1)), ("([1]*3+[0]*1)*3", (1, 1, 1, 0) * 3),
    ("[0]+[1]*23", (0,) + (1,) * 23), ("__import__('os')", None), ("[2]*3", None), ("", None), ("[1]*999999", None),
])
def test_megatron_pattern_text_is_read_without_eval(text, pattern):
    assert parse_layer_pattern(text) == pattern


def test_integer_moe_layer_freq_is_every_kth_layer_from_the_first():
    assert moe_layer_pattern(6, 2) == (1, 0, 1, 0, 1, 0) and moe_layer_pattern(3, 1) == (1, 1, 1)


BASE = dict(num_layers=4, hidden_size=64, num_attention_heads=4, seq_length=128)


@pytest.mark.parametrize("extra,key", [
    (dict(moe_router_topk=2), "moe_router_topk"),                                  # MoE key, dense model
    (dict(num_experts=4, moe_router_topk=8), "moe_router_topk"),                   # more than the experts
    (dict(num_experts=4, moe_layer_freq=[1, 0]), "moe_layer_freq"),                # not one per layer
    (dict(num_experts=4, moe_layer_freq=[0, 0, 0, 0]), "moe_layer_freq"),          # no MoE layer
    (dict(num_experts=4, moe_layer_freq="eval('1')"), "moe_layer_freq"),
    (dict(num_experts=4, moe_layer_freq=0), "moe_layer_freq"),
    (dict(num_experts=4, moe_expert_capacity_factor=0), "moe_expert_capacity_factor"),
    (dict(num_experts=4, moe_expert_capacity_factor=True), "moe_expert_capacity_factor"),
    (dict(num_experts=-1), "num_experts"), (dict(num_experts=2.0), "num_experts"),
    (dict(kv_lora_rank=64), "kv_lora_rank"),                                       # MLA key without MLA
    (dict(multi_latent_attention=True, add_bias_linear=False, kv_channels=16), "kv_channels"),
    (dict(multi_latent_attention=True), "add_bias_linear"),
    (dict(multi_latent_attention="yes"), "multi_latent_attention"),
    (dict(multi_latent_attention=True, add_bias_linear=False, num_query_groups=2), "num_query_groups"),   # no GQA
])
def test_bad_moe_keys_are_refused_naming_the_key(extra, key):
    with pytest.raises(InputError) as e:
        models_from_tables({"m": {**BASE, **extra}}, "m.toml")
    assert e.value.key == key and e.value.where == "m.toml: [models.m]" and e.value.fix, str(e.value)


def test_capacity_factor_and_pattern_are_read():
    m = models_from_tables({"m": {**BASE, "num_experts": 4, "moe_expert_capacity_factor": 1.25,
                                  "moe_layer_freq": "([0]*1+[1]*3)"}}, "m")["m"]
    assert (m.moe_expert_capacity_factor, m.moe_layer_freq, m.moe_ffn_hidden_size) == (1.25, (0, 1, 1, 1), 256)
    assert m.num_experts == 4 and m.moe_router_topk == 2            # Megatron-core's default top-k
    assert all(f.doc and f.megatron.startswith("--") for f in SHAPE_FIELDS)


# ------------------------------------------------------------------------------- refused for pricing
def test_a_sweep_naming_an_moe_or_an_mla_preset_is_priced(tmp_path, cli):
    spec = tmp_path / "spec.toml"
    for presets in ('["gpt3-1.3b", "mixtral-8x7b"]', '["gpt3-1.3b", "deepseek-v3"]'):
        spec.write_text(SMALL_SWEEP.format(training="").replace('presets = ["gpt3-1.3b"]', f"presets = {presets}"))
        res = cli("sweep", spec, "-o", tmp_path / "out", "--dry-run")
        assert res.exit_code == 0, res.output


def test_a_model_file_with_an_moe_model_is_priced_unless_it_sets_a_capacity_factor(tmp_path, cli):
    (tmp_path / "m.toml").write_text("[models.my-moe]\nnum_layers = 4\nhidden_size = 64\nnum_attention_heads = 4\n"
                                     "seq_length = 128\nnum_experts = 8\nmoe_router_topk = 2\n"
                                     "[models.my-capped-moe]\nnum_layers = 4\nhidden_size = 64\n"
                                     "num_attention_heads = 4\nseq_length = 128\nnum_experts = 8\n"
                                     "moe_expert_capacity_factor = 1.25\n")
    spec = tmp_path / "spec.toml"
    base = 'model_files = ["m.toml"]\n' + SMALL_SWEEP.format(training="")
    spec.write_text(base.replace('presets = ["gpt3-1.3b"]', 'presets = ["my-moe"]'))
    assert cli("sweep", spec, "--dry-run").exit_code == 0
    spec.write_text(base.replace('presets = ["gpt3-1.3b"]', 'presets = ["my-capped-moe"]'))
    res = cli("sweep", spec, "--dry-run")
    assert res.exit_code == 2 and "moe_expert_capacity_factor is a training setting" in flat(res.output), res.output
    assert "[training] moe_expert_capacity_factor = 1.25" in flat(res.output)


def test_evaluate_prices_mixtral_and_refuses_a_row_naming_an_unpriced_moe_model(tmp_path, cli):
    csv = tmp_path / "plans.csv"
    csv.write_text("model,global_batch_size,micro_batch_size,tp,pp,dp,ep,gpu,use_flash_attn\n"
                   "mixtral-8x7b,64,1,1,4,16,8,h100-sxm-80gb,true\n")
    res = cli("evaluate", csv, "-o", tmp_path / "out.csv")
    assert res.exit_code == 0, res.output
    import polars as pl
    df = pl.read_csv(tmp_path / "out.csv")
    assert df["num_experts"].to_list() == [8] and df["ep"].to_list() == [8] and df["ep_comm_s"][0] > 0
    (tmp_path / "m.toml").write_text("[models.capped]\nnum_layers = 4\nhidden_size = 64\nnum_attention_heads = 4\n"
                                     "seq_length = 128\nnum_experts = 8\nmoe_expert_capacity_factor = 1.25\n")
    csv.write_text("model,global_batch_size,micro_batch_size,tp,pp,dp,gpu\n"
                   "llama3-8b,64,1,4,2,1,h100-sxm-80gb\ncapped,64,1,4,2,1,h100-sxm-80gb\n")
    res = cli("evaluate", csv, "--models", tmp_path / "m.toml", "-o", tmp_path / "out2.csv")
    out = flat(res.output)
    assert res.exit_code == 2, res.output
    assert "column model, row 3" in out and "capacity_factor" in out, out
    assert not (tmp_path / "out2.csv").exists()
    # an MLA preset is priced: its MLA columns as the kernels' rows hold them
    csv.write_text("model,global_batch_size,micro_batch_size,tp,pp,dp,ep,gpu,use_flash_attn,sequence_parallel\n"
                   "deepseek-v3,64,1,2,1,32,32,h100-sxm-80gb,true,true\n")
    res = cli("evaluate", csv, "-o", tmp_path / "out3.csv")
    assert res.exit_code == 0, res.output
    df = pl.read_csv(tmp_path / "out3.csv")
    assert (df["multi_latent_attention"][0], df["q_lora_rank"][0], df["kv_lora_rank"][0]) == (1, 1536, 512)
    assert df["num_query_groups"][0] == 128 and df["num_parameters"][0] == 671_026_404_352


def test_kv_channels_and_mla_on_a_dense_shape_are_priced():
    dense = MODEL_PRESETS["llama3-8b"]
    assert unpriced_reason(replace(dense, kv_channels=256)) is None          # priced: the kv_channels column
    assert unpriced_reason(replace(dense, kv_channels=128)) is None          # hidden / heads: the default
    assert unpriced_reason(replace(dense, multi_latent_attention=True)) is None   # the MLA columns


def test_the_presets_listing_marks_moe_with_total_and_active(cli, wide_console):
    res = cli("presets")
    assert res.exit_code == 0, res.output
    row = next(line for line in res.output.splitlines() if " deepseek-v3 " in line)
    assert "MoE 256 top-8" in row         # (the cell wraps: +shared 3-dense MLA on the next line)
    active, total = (float(x.replace(",", "")) for x in row.split()[-4:-1:2])
    assert total == pytest.approx(671.0, rel=0.01) and active == pytest.approx(37.5, abs=0.1)
    assert "dense" in next(line for line in res.output.splitlines() if " llama3-8b " in line)


# ------------------------------------------------------------------------------------- import-hf
def config(name: str) -> dict:
    return json.loads((HF / f"{name}.json").read_text())


def hf_params(cfg: dict) -> int:
    """Parameters of the Hugging Face checkpoint of an MoE ``cfg``, from transformers' modeling
    files (no vtrain_fast code): attention (MLA for DeepSeek-V3), per-head q/k norms (Qwen3-MoE),
    biases and sinks (gpt-oss), routers (with gpt-oss's bias), routed and shared experts, dense
    layers, norms, embedding and untied head."""
    mt = cfg["model_type"]
    L, h, a, v = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"], cfg["vocab_size"]
    g = cfg["num_key_value_heads"]
    if mt == "deepseek_v3":
        qd = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
        q, r = cfg["q_lora_rank"], cfg["kv_lora_rank"]
        attn = (h * q + q + q * a * qd + h * (r + cfg["qk_rope_head_dim"]) + r
                + r * a * (cfg["qk_nope_head_dim"] + cfg["v_head_dim"]) + a * cfg["v_head_dim"] * h)
        e, f = cfg["n_routed_experts"], cfg["moe_intermediate_size"]
        moe = e * 3 * h * f + cfg["n_shared_experts"] * 3 * h * f + e * h + e      # + e_score_correction_bias
        k = cfg["first_k_dense_replace"]
        layers = k * (attn + 3 * h * cfg["intermediate_size"]) + (L - k) * (attn + moe) + L * 2 * h
    else:
        d = cfg.get("head_dim") or h // a
        bias = cfg.get("attention_bias", False)
        attn = h * (a + 2 * g) * d + a * d * h + ((a + 2 * g) * d + h if bias else 0)
        if mt == "qwen3_moe":
            attn += 2 * d
            e, f = cfg["num_experts"], cfg["moe_intermediate_size"]
            moe = e * 3 * h * f + e * h
        elif mt == "gpt_oss":
            attn += a                                                   # sinks
            e, f = cfg["num_local_experts"], cfg["intermediate_size"]
            moe = e * (h * 2 * f + 2 * f + f * h + h) + e * h + e
        else:
            e, f = cfg["num_local_experts"], cfg["intermediate_size"]
            moe = e * 3 * h * f + e * h
        layers = L * (attn + moe + 2 * h)
    return layers + v * h * (1 if cfg.get("tie_word_embeddings") else 2) + h


FIXTURES = {"mixtral-8x7b-v0.1": "mixtral-8x7b", "mixtral-8x22b-v0.1": "mixtral-8x22b", "deepseek-v3": "deepseek-v3",
            "qwen3-30b-a3b": "qwen3-30b-a3b", "qwen3-235b-a22b": "qwen3-235b-a22b", "gpt-oss-20b": "gpt-oss-20b",
            "gpt-oss-120b": "gpt-oss-120b"}


@pytest.mark.parametrize("fixture", sorted(FIXTURES))
def test_the_moe_fixtures_have_the_published_totals(fixture):
    """The fixtures transcribed right: transformers' layout of each gives the published total
    (the presets' sources; Qwen3-30B-A3B's card truncates to 30.5B)."""
    preset = FIXTURES[fixture]
    total = PUBLISHED[preset][0] if preset in PUBLISHED else QWEN3_30B["total"]
    assert hf_params(config(fixture)) / 1e9 == pytest.approx(total, rel=0.01)


@pytest.mark.parametrize("fixture", sorted(FIXTURES))
def test_import_hf_reads_the_moe_configs_as_the_presets(fixture):
    """The imported table is the preset's shape (but its name, source and context) and counts the
    checkpoint's parameters but what the notes name (router biases, sinks, q/k norms: < 0.01 %)."""
    table, notes = shape_from_config(config(fixture), str(HF / f"{fixture}.json"), 4096)
    shape = models_from_tables({"m": table}, "m")["m"]
    preset = MODEL_PRESETS[FIXTURES[fixture]]
    assert shape == replace(preset, name="m", source=shape.source, seq_length=4096)
    assert param_counts(shape).total == pytest.approx(hf_params(config(fixture)), rel=1e-4)
    assert any("dropless" in n for n in notes)


def test_import_hf_notes_what_the_moe_families_do_differently(tmp_path, cli):
    out = flat(cli("import-hf", HF / "gpt-oss-20b.json", "--name", "oss").output)
    assert "12 of 24 layers attend within a sliding window of 128 tokens" in out
    assert "20.915 B parameters, 4.187 B active per token" in out
    assert "num_experts = 32" in out and "kv_channels = 64" in out
    out = flat(cli("import-hf", HF / "deepseek-v3.json", "--name", "ds").output)
    assert 'moe_layer_freq = "([0]*3+[1]*58)"' in out and "multi_latent_attention = true" in out
    assert "multi-token-prediction" in out and "group-limited routing" in out


@pytest.mark.parametrize("changes,key", [
    ({"num_experts_per_tok": 16}, "num_experts_per_tok"), ({"num_local_experts": 0}, "num_local_experts"),
    ({"num_local_experts": "8"}, "num_local_experts"), ({"head_dim": 1.5}, "head_dim"),
])
def test_bad_moe_configs_are_refused_naming_the_key(changes, key, tmp_path, cli):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({**config("mixtral-8x7b-v0.1"), **changes}))
    res = cli("import-hf", path)
    assert res.exit_code == 2 and flat(res.output).startswith(f"error: {path}: {key}"), res.output


def test_qwen3_moe_dense_layers_become_a_pattern():
    cfg = {**config("qwen3-30b-a3b"), "mlp_only_layers": [0, 1]}
    table, _ = shape_from_config(cfg, "q.json", 4096)
    assert table["moe_layer_freq"] == "([0]*2+[1]*46)"
    assert shape_from_config({**config("qwen3-30b-a3b"), "decoder_sparse_step": 2}, "q.json", 4096)[0][
        "moe_layer_freq"] == "(" + "+".join(["[0]*1", "[1]*1"] * 24) + ")"
    with pytest.raises(InputError):
        shape_from_config({**cfg, "mlp_only_layers": list(range(48))}, "q.json", 4096)
