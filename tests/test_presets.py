"""Model presets against the parameter counts their publishers report."""
from __future__ import annotations

import pytest

from vtrain_fast.model.arch import arch_of
from vtrain_fast.model.memory import model_params
from vtrain_fast.plan.models import MODEL_PRESETS

# Parameters of the released Llama checkpoints (the safetensors totals on their model cards): the
# presets' flags (SwiGLU at the published width, RMSNorm, RoPE, no biases, an untied head) give
# them exactly.
LLAMA_PARAMETERS = {
    "llama2-7b": 6_738_415_616, "llama2-13b": 13_015_864_320, "llama2-70b": 68_976_648_192,
    "llama3-8b": 8_030_261_248, "llama3-70b": 70_553_706_496, "llama3-405b": 405_853_388_800,
}
# GPT-3 (Brown et al. 2020, Table 2.1): nominal sizes; tied embeddings, learned positions, biases.
GPT3_BILLIONS = {"gpt3-125m": 0.125, "gpt3-350m": 0.350, "gpt3-1.3b": 1.3, "gpt3-13b": 13.0, "gpt3-175b": 175.0}
PUBLISHED_BILLIONS = {**{k: v / 1e9 for k, v in LLAMA_PARAMETERS.items()}, **GPT3_BILLIONS}


def count(name):
    m = MODEL_PRESETS[name]
    return model_params(m.num_layers, m.hidden_size, m.num_attention_heads, m.num_query_groups,
                        m.ffn_hidden_size, m.vocab_size, m.seq_length, arch_of(m.arch_values()))


@pytest.mark.parametrize("name", sorted(LLAMA_PARAMETERS))
def test_llama_presets_have_the_checkpoints_parameters_exactly(name):
    assert count(name) == LLAMA_PARAMETERS[name]


@pytest.mark.parametrize("name", sorted(GPT3_BILLIONS))
def test_gpt3_presets_are_within_a_percent_of_the_nominal_size(name):
    """The paper rounds its sizes (1.3B counts 1.32B, 13B 12.85B); an untied head would add v h, 38.6M
    at 125M (+31 %) and 51M at 350M (+15 %)."""
    assert count(name) / 1e9 == pytest.approx(GPT3_BILLIONS[name], rel=0.02)


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
