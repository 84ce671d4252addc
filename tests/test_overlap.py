"""Optional bucketed overlap of the data-parallel all-reduce with backward, the distributed
optimizer, and the boolean training settings of a sweep spec."""
from __future__ import annotations

import polars as pl
import pytest

from conftest import ONE_POINT_SPEC
from vtrain_fast.io.errors import InputError
from vtrain_fast.analysis.evaluate import evaluate_frame
from vtrain_fast.plan.spec import parse_spec

PLANS = pl.DataFrame({
    "num_layers": [30, 96, 40, 24], "hidden_size": [3072, 12288, 6144, 2048],
    "num_attention_heads": [32, 96, 48, 16], "seq_length": [2048, 2048, 2048, 1024],
    "global_batch_size": [512, 1536, 1024, 64], "micro_batch_size": [8, 1, 2, 4],
    "tp": [1, 8, 4, 1], "pp": [1, 8, 2, 1], "dp": [64, 8, 32, 8], "gpu": ["a100-sxm4-80gb"] * 4,
    "recompute": ["full", "full", "none", "none"],
})


def test_overlap_hides_part_of_the_dp_allreduce_and_nothing_else():
    off = evaluate_frame(PLANS)
    on = evaluate_frame(PLANS.with_columns(overlap_grad_reduce=pl.lit("true")))
    assert (on["dp_comm_s"] <= off["dp_comm_s"]).all()
    assert (on["dp_comm_s"] < off["dp_comm_s"]).any()
    assert (on["dp_comm_s"] >= 0).all()
    saved = off["iteration_time_s"] - on["iteration_time_s"]
    assert (saved - (off["dp_comm_s"] - on["dp_comm_s"])).abs().max() < 1e-9
    for col in ("compute_s", "tp_comm_s", "pp_comm_s", "bubble_s", "optimizer_s", "memory_per_gpu_GiB"):
        assert (on[col] == off[col]).all(), col


@pytest.mark.parametrize("key", ["overlap_grad_reduce", "distributed_optimizer", "use_flash_attn",
                                 "sequence_parallel"])
def test_training_settings_are_boolean_spec_keys_off_by_default(key):
    spec = parse_spec(ONE_POINT_SPEC.format(training=f"{key} = true"), "s.toml")
    assert all(getattr(g, key) for g in spec.gpus)
    assert not any(getattr(g, key) for g in parse_spec(ONE_POINT_SPEC.format(training=""), "s.toml").gpus)
    for bad in ('"yes"', "1"):
        with pytest.raises(InputError, match=key):
            parse_spec(ONE_POINT_SPEC.format(training=f"{key} = {bad}"), "s.toml")


def test_distributed_optimizer_shards_adam_states_and_step():
    # 16-bit gradients (the all-reduce and the reduce-scatter + all-gather then move the same bytes;
    # fp32 main gradients: tests/test_fp32_grads.py)
    bf16 = PLANS.with_columns(grad_reduce_in_bf16=pl.lit(True))
    off = evaluate_frame(bf16)
    on = evaluate_frame(bf16.with_columns(distributed_optimizer=pl.lit("true")))
    dp = PLANS["dp"].cast(pl.Float64)
    params_per_gpu = off["model_states_GiB"] / 16.0
    expected = params_per_gpu * (4.0 + 12.0 / dp)          # ZeRO-1: 2 + 2 + 12/dp bytes/param
    assert ((on["model_states_GiB"] - expected).abs() / expected).max() < 1e-12
    assert (on["optimizer_s"] < off["optimizer_s"]).all()
    # reduce-scatter + all-gather: the all-reduce's bytes in rings, plus the latencies of two
    # collectives (and ring rather than tree latency between nodes)
    extra = on["dp_comm_s"] - off["dp_comm_s"]
    assert (extra >= 0).all() and (extra < 2e-3).all()
    for col in ("compute_s", "tp_comm_s", "pp_comm_s", "bubble_s", "activations_GiB"):
        assert ((on[col] - off[col]).abs() <= 1e-12 * off[col].abs().max()).all(), col


def test_distributed_optimizer_lets_a_data_parallel_plan_fit():
    plan = pl.DataFrame({"num_layers": [32], "hidden_size": [4096], "num_attention_heads": [32],
                         "seq_length": [2048], "global_batch_size": [256], "micro_batch_size": [1],
                         "tp": [1], "pp": [1], "dp": [256], "gpu": ["h100-sxm-80gb"], "recompute": ["full"]})
    assert evaluate_frame(plan)["status"][0] == "out_of_memory"
    assert evaluate_frame(plan.with_columns(distributed_optimizer=pl.lit("true")))["status"][0] == "ok"
