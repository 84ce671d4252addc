"""Interleaved 1F1B (parallel.vpp, Megatron --num-layers-per-virtual-pipeline-stage)."""
from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from conftest import ONE_POINT_SPEC
from vtrain_fast.io.errors import InputError
from vtrain_fast.analysis.evaluate import evaluate_frame
from vtrain_fast.model import memory
from vtrain_fast.plan.spec import parse_spec

# 96 layers on 4 stages, 32 micro-batches, no recomputation: stage 0 holds the most activations
PLAN = pl.DataFrame({
    "num_layers": [96], "hidden_size": [12288], "num_attention_heads": [96], "seq_length": [2048],
    "global_batch_size": [256], "micro_batch_size": [1], "tp": [8], "pp": [4], "dp": [8],
    "gpu": ["h100-sxm-80gb"], "recompute": ["none"], "use_flash_attn": ["true"],
})


def _with_vpp(df, v):
    return evaluate_frame(df.with_columns(vpp=pl.lit(v)))


@pytest.mark.parametrize("v", [2, 3, 4])
def test_interleaving_shrinks_the_bubble_and_multiplies_the_sends(v):
    one, many = _with_vpp(PLAN, 1), _with_vpp(PLAN, v)
    p, m = 4, 256 / (8 * 1)
    # every chunk boundary is a send: v times the pipeline traffic per micro-batch
    assert many["pp_comm_s"][0] == pytest.approx(v * one["pp_comm_s"][0], rel=1e-12)
    # bubble: (p - 1) chunk times; each stage time grows by the extra sends
    extra_sends = (v - 1) * one["pp_comm_s"][0] / m
    assert v * many["bubble_s"][0] - one["bubble_s"][0] == pytest.approx((p - 1) * extra_sends, rel=1e-9)
    assert many["bubble_s"][0] < one["bubble_s"][0]
    for col in ("compute_s", "tp_comm_s", "dp_comm_s", "optimizer_s", "model_states_GiB"):
        assert many[col][0] == one[col][0], col


@pytest.mark.parametrize("v", [2, 4])
def test_interleaving_holds_more_activations_on_the_first_stage(v):
    """Korthikanti et al. 2022, Sec. 4.2.3: the interleaved schedule multiplies the first
    stage's activation memory by 1 + (p - 1) / (p * vpp)."""
    p = 4
    ratio = _with_vpp(PLAN, v)["activations_GiB"][0] / _with_vpp(PLAN, 1)["activations_GiB"][0]
    assert ratio == pytest.approx(1 + (p - 1) / (p * v), rel=1e-12)


def test_interleaving_rules_and_no_pipeline():
    assert _with_vpp(PLAN, 5)["status"][0] == "bad_layers"                 # 96 % (4 * 5) != 0
    assert _with_vpp(PLAN, 16)["status"][0] == "bad_layers"                # 96 % 16 == 0 but 96 % 64 != 0
    assert _with_vpp(PLAN.with_columns(global_batch_size=pl.lit(48)), 2)["status"][0] == "bad_batch"  # 6 % 4
    flat = PLAN.with_columns(pp=pl.lit(1), dp=pl.lit(32), recompute=pl.lit("full"))
    for v in (4, 5):                                                         # 96 % 5 != 0: not checked at p = 1
        assert _with_vpp(flat, v).drop("vpp").equals(_with_vpp(flat, 1).drop("vpp"))


def test_interleaving_over_two_stages_is_priced_as_megatron_core_allows_it():
    """megatron.core.parallel_state refused it ("pipeline-model-parallel size should be greater than
    2 with interleaved schedule") until Megatron-LM commit 3ee489d (2024-05-31, "Enable virtual
    pipelining and P2P communication overlap at PP=2"); Megatron-Bridge's Qwen3-30B-A3B runs use
    pp 2 with vpp 12 (vtrain_fast/data/published/moe_runs.csv). The bubble shrinks by about vpp
    (each stage's time grows by the chunks' extra sends)."""
    two = PLAN.with_columns(pp=pl.lit(2), dp=pl.lit(16))
    one, inter = _with_vpp(two, 1), _with_vpp(two, 2)
    assert inter["status"][0] == one["status"][0] and inter["status"][0] in ("ok", "out_of_memory")
    assert 0.45 * one["bubble_s"][0] < inter["bubble_s"][0] < 0.55 * one["bubble_s"][0]


def test_last_stage_holds_vpp_minus_1_times_p_plus_1_chunks():
    """A plan whose last stage is the fuller one (a large vocabulary's logits): its activations
    are ((vpp - 1) p + 1) chunks of L / (p vpp) layers plus the final-norm tensors and logits."""
    L, h, a, s, b, t, p, v, vocab = 16, 1024, 16, 2048, 1, 1, 4, 2, 600000
    plan = pl.DataFrame({"num_layers": [L], "hidden_size": [h], "num_attention_heads": [a], "seq_length": [s],
                         "vocab_size": [vocab], "global_batch_size": [32], "micro_batch_size": [b], "tp": [t],
                         "pp": [p], "dp": [4], "gpu": ["a100-sxm4-80gb"], "recompute": ["none"],
                         "vpp": [v]})
    got = evaluate_frame(plan)["activations_GiB"][0] * 2.0 ** 30
    layer = memory.layer_activation_bytes(b, s, h, a, a, 4 * h, t, 0.0, 0.0)
    last = ((v - 1) * p + 1) * (L / (p * v)) * layer + 2.0 * s * b * h + 6.0 * s * b * vocab / t
    first = (2 * (p - 1) + (v - 1) * p + 1) * (L / (p * v)) * layer + (2 * (p - 1) + (v - 1) * p + 1) / v * s * b * h
    assert last > first, "the plan must make the last stage the fuller one"
    assert got == pytest.approx(last, rel=1e-12)


def test_sweep_with_vpp_equals_evaluate(write_spec, tmp_path, cli):
    """The sweep path (grid_point) applies the interleaving rules and costs like evaluate."""
    text = """[model]
presets = ["gpt3-1.3b", "gpt3-2.7b"]
[training]
num_tokens = 1e9
global_batch_size = [48, 64]
micro_batch_size = [1, 2]
[cluster]
gpu = "a100-sxm4-80gb"
num_gpus = [16, 24]
[parallel]
tp = [1, 2]
pp = [1, 2, 3, 4, 8]
vpp = 2
"""
    out = tmp_path / "vpp"
    assert cli("sweep", write_spec(text, "vpp.toml"), "-o", out).exit_code == 0
    rows = pl.read_parquet(str(out / "part-*.parquet")).filter(pl.col("status") != "bad_num_gpus")
    statuses = set(rows["status"].cast(pl.String))
    assert {"ok", "bad_layers", "bad_batch"} <= statuses, statuses
    inputs = ["num_layers", "hidden_size", "num_attention_heads", "seq_length", "global_batch_size",
              "micro_batch_size", "tp", "pp", "dp", "gpu", "recompute", "num_tokens", "vpp"]
    again = evaluate_frame(rows.select(inputs).with_columns(pl.col("gpu").cast(pl.String),
                                                             pl.col("recompute").cast(pl.String)))
    assert again["status"].to_list() == rows["status"].cast(pl.String).to_list()
    for col in ("iteration_time_s", "bubble_s", "pp_comm_s", "activations_GiB"):
        a_, b_ = again[col].to_numpy(), rows[col].to_numpy()
        assert ((a_ == b_) | (np.isnan(a_) & np.isnan(b_))).all(), col


def test_vpp_is_an_integer_or_a_list_of_the_parallel_table():
    spec = parse_spec(ONE_POINT_SPEC.format(training="") + "vpp = 3\n", "s.toml")
    assert [g.vpp for g in spec.gpus] == [3]
    spec = parse_spec(ONE_POINT_SPEC.format(training="") + "vpp = [1, 2, 2, 4]\n", "s.toml")
    assert [g.vpp for g in spec.gpus] == [1, 2, 4]
    for bad in ("0", "65", "2.0", "[2, 0]", "[]", "true", "[1, true]", '"2"'):
        with pytest.raises(InputError, match="parallel.vpp"):
            parse_spec(ONE_POINT_SPEC.format(training="") + f"vpp = {bad}\n", "s.toml")


def test_sweep_rows_carry_the_training_settings(write_spec, tmp_path, cli):
    """Every row names its training settings, so results of several sweeps can be combined and
    told apart."""
    text = ONE_POINT_SPEC.format(training="use_flash_attn = true\nsequence_parallel = true") + "vpp = 2\n"
    out = tmp_path / "settings"
    res = cli("sweep", write_spec(text, "settings.toml"), "-o", out)
    assert res.exit_code == 0, res.output
    rows = pl.read_parquet(str(out / "part-*.parquet"))
    assert rows["vpp"].to_list() == [2] * rows.height
    assert rows["use_flash_attn"].all() and rows["sequence_parallel"].all()
    assert not rows["distributed_optimizer"].any() and not rows["overlap_grad_reduce"].any()
