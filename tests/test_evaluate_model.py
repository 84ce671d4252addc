"""evaluate: a ``model`` column naming a model preset fills the row's shape; cells the row gives
override the preset's; other model values stay labels."""
from __future__ import annotations

import polars as pl
import pytest

from vtrain_fast.analysis.evaluate import evaluate_frame
from vtrain_fast.io.errors import InputError
from vtrain_fast.plan.models import MODEL_PRESETS

PLAN = dict(global_batch_size=512, micro_batch_size=1, tp=2, pp=2, dp=2, gpu="h100-sxm-80gb")
SHAPE = ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size",
         "vocab_size", "seq_length", "gated_mlp", "normalization", "position_embedding_type", "add_bias_linear",
         "untie_embeddings_and_output_weights")


def test_a_preset_name_gives_the_preset_shape():
    m = MODEL_PRESETS["llama3-8b"].resolved()
    by_name = evaluate_frame(pl.DataFrame([dict(PLAN, model="llama3-8b")]))
    spelled = evaluate_frame(pl.DataFrame([dict(PLAN, model="mine", **{k: getattr(m, k) for k in SHAPE})]))
    assert by_name.drop("model").row(0) == spelled.drop("model").row(0)
    assert by_name["num_query_groups"][0] == 8 and by_name["model"][0] == "llama3-8b"


def test_a_cell_the_row_gives_overrides_the_preset():
    df = pl.DataFrame([dict(PLAN, model="llama3-8b", num_layers=None), dict(PLAN, model="llama3-8b", num_layers=16)])
    out = evaluate_frame(df)
    assert out["num_layers"].to_list() == [32, 16]
    assert out["num_parameters"][1] < out["num_parameters"][0]


def test_a_model_label_is_no_shape():
    with pytest.raises(InputError, match="num_layers"):
        evaluate_frame(pl.DataFrame([dict(PLAN, model="my-own-7b")]), "plans.csv")


def test_a_cluster_column_shows_the_value_used_in_an_empty_cell():
    df = pl.DataFrame([dict(PLAN, model="llama3-8b", usd_per_gpu_hour=None),
                       dict(PLAN, model="llama3-8b", usd_per_gpu_hour=1.5)])
    out = evaluate_frame(df)
    from vtrain_fast.hardware.gpus import PRESETS
    assert out["usd_per_gpu_hour"].to_list() == [PRESETS["h100-sxm-80gb"].usd_per_gpu_hour, 1.5]
    assert out["cost_usd"][1] / out["cost_usd"][0] == pytest.approx(1.5 / PRESETS["h100-sxm-80gb"].usd_per_gpu_hour)
