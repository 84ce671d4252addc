"""Model presets against the parameter counts their publishers report."""
from __future__ import annotations

import pytest

from vtrain_fast.model.memory import model_params
from vtrain_fast.plan.models import MODEL_PRESETS

# Parameters of the released checkpoints (model cards), billions. Ours differ by learned position
# embeddings, biases and LayerNorm (the presets keep the GPT layer but Llama's gated MLP with its
# published width), under 0.5%.
PUBLISHED_BILLIONS = {
    "llama2-7b": 6.738, "llama2-13b": 13.016, "llama2-70b": 68.977,
    "llama3-8b": 8.030, "llama3-70b": 70.554, "llama3-405b": 405.853,
    "gpt3-175b": 175.0,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_BILLIONS))
def test_preset_parameter_count_matches_the_published_one(name):
    m = MODEL_PRESETS[name]
    n = model_params(m.num_layers, m.hidden_size, m.num_attention_heads, m.num_query_groups,
                     m.ffn_hidden_size, m.vocab_size, m.seq_length, float(m.gated_mlp))
    assert n / 1e9 == pytest.approx(PUBLISHED_BILLIONS[name], rel=0.005)


def test_llama_presets_use_grouped_query_attention_where_published():
    assert MODEL_PRESETS["llama2-7b"].num_query_groups == 32       # multi-head attention
    for name in ("llama2-70b", "llama3-8b", "llama3-70b", "llama3-405b"):
        assert MODEL_PRESETS[name].num_query_groups == 8


def test_the_presets_listing_counts_the_gated_mlp(cli, wide_console):
    """`presets` counts a gated MLP's third matrix: llama2-7b is listed near 6.74 B, not the 5.3 B of
    a two-matrix MLP of the same width (the slip of an intermediate_size taken for a GeLU MLP's)."""
    res = cli("presets")
    assert res.exit_code == 0, res.output
    row = next(line for line in res.output.splitlines() if " llama2-7b " in line)
    billions = float(row.split()[-2].replace(",", ""))
    assert billions == pytest.approx(PUBLISHED_BILLIONS["llama2-7b"], rel=0.005), row
