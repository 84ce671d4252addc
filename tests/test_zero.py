"""zero_stage (ZeRO 0-3): what is sharded over the data-parallel ranks, its bytes per parameter
(the ZeRO paper's Figure 1), the exchanges each stage adds, and the spec / evaluate / sweep plumbing."""
from __future__ import annotations

import dataclasses

import numpy as np
import polars as pl
import pytest

from conftest import ONE_POINT_SPEC, SMALL_SWEEP
from vtrain_fast.analysis.evaluate import evaluate_frame
from vtrain_fast.hardware.gpus import PRESETS, machine_vector, with_overrides
from vtrain_fast.io.errors import InputError
from vtrain_fast.model import comm, memory
from vtrain_fast.model.records import hw_index
from vtrain_fast.plan.spec import parse_spec

# GPT-3 13B on 64 A100s, data parallel only, 8 micro-batches per step; 16-bit gradients, as the ZeRO
# paper counts them (its mixed precision: 2 + 2 + K bytes per parameter; fp32 main gradients are
# tests/test_fp32_grads.py's)
PLAN = dict(num_layers=40, hidden_size=5120, num_attention_heads=40, seq_length=2048, global_batch_size=512,
            micro_batch_size=1, tp=1, pp=1, dp=64, gpu="a100-sxm4-80gb", recompute="full", grad_reduce_in_bf16=True)
A100 = with_overrides(PRESETS["a100-sxm4-80gb"], None, grad_reduce_in_bf16=True)


def rows(*variants, **common):
    df = pl.DataFrame([{**PLAN, **common, **v} for v in variants])
    return evaluate_frame(df).rows(named=True)


@pytest.mark.parametrize("stage, gigabytes", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.88)])
def test_model_state_bytes_match_the_zero_papers_figure_1(stage, gigabytes):
    """Rajbhandari et al. 2020, Figure 1: 7.5B parameters, K = 12, N_d = 64."""
    got = memory.model_state_bytes.py_func(7.5e9, 64.0, float(stage), machine_vector(A100)) / 1e9
    assert got == pytest.approx(gigabytes, abs=0.05)


def test_each_stage_shards_more_and_frees_memory():
    r = rows(*({"zero_stage": z} for z in range(4)))
    states = [x["model_states_GiB"] for x in r]
    assert states[0] > states[1] > states[2] > states[3]
    n = r[0]["num_parameters"]
    gib = 1024.0 ** 3
    assert states[0] == pytest.approx(16.0 * n / gib, rel=1e-3)          # one stage holds every parameter
    assert states[1] == pytest.approx((4.0 + 12.0 / 64) * n / gib, rel=1e-3)
    assert states[2] == pytest.approx((2.0 + 14.0 / 64) * n / gib, rel=1e-3)
    # ZeRO-3: 16/64 bytes per parameter plus two gathered layers (fp16 weight and gradient)
    layer = memory.layer_params_per_rank.py_func(5120.0, 40.0, 40.0, 4 * 5120.0, 1.0)
    assert states[3] * gib == pytest.approx(16.0 / 64 * n + 2 * 4.0 * layer, rel=1e-3)
    assert len({x["activations_GiB"] for x in r}) == 1
    assert len({x["compute_s"] for x in r[:2]}) == 1


def test_stage_1_is_the_distributed_optimizer():
    by_stage, by_flag = rows({"zero_stage": 1}, {"distributed_optimizer": "true"})
    for k in ("iteration_time_s", "memory_per_gpu_GiB", "dp_comm_s", "optimizer_s"):
        assert by_stage[k] == by_flag[k], k


def test_stage_2_reduce_scatters_every_micro_batch():
    """ZeRO-2 pays one gradient reduce-scatter per micro-batch instead of one per step."""
    one, two = rows({"zero_stage": 1}, {"zero_stage": 2})
    hw = machine_vector(A100)
    p = one["num_parameters"]
    half = comm.group_reduce_scatter_allgather_s.py_func(2.0 * p, 64.0, 1.0, hw) / 2.0
    m = one["num_micro_batches"]
    assert m == 8
    assert two["dp_comm_s"] - one["dp_comm_s"] == pytest.approx((m - 1) * half, rel=1e-6)
    overlapped = rows({"zero_stage": 2, "overlap_grad_reduce": "true"})[0]
    assert overlapped["dp_comm_s"] < two["dp_comm_s"]


def test_stage_3_moves_one_and_a_half_times_the_bytes_of_ddp():
    """ZeRO paper Sec. 7.2.2: stage 3 moves 3 Psi per step against DDP's 2 Psi. With no compute to
    hide behind (one token per micro-batch, no latency terms) the per-layer exchanges add up to
    1.5 times the all-reduce, per micro-batch."""
    hw = machine_vector(dataclasses.replace(PRESETS["a100-sxm4-80gb"], **{}))
    for name in ("intra_node_latency_s", "intra_node_step_latency_s"):
        hw[hw_index(name)] = 0.0
    n = 1e9
    allreduce = comm.group_allreduce_s.py_func(2.0 * n, 8.0, 1.0, hw)
    gathers = 3.0 * comm.group_allgather_s.py_func(2.0 * n, 8.0, 1.0, hw)
    assert gathers == pytest.approx(1.5 * allreduce, rel=1e-12)


def test_stage_3_exchanges_grow_with_the_micro_batches_and_hide_behind_compute():
    few, many = rows({"zero_stage": 3, "global_batch_size": 64}, {"zero_stage": 3, "global_batch_size": 512})
    assert many["num_micro_batches"] == 8 * few["num_micro_batches"]
    assert many["dp_comm_s"] > few["dp_comm_s"]
    # a long sequence gives each layer far more compute than its gathers: only the first gather
    # of each pass and the embedding's exchanges stay exposed, a small part of the step
    long = rows({"zero_stage": 3, "seq_length": 8192, "global_batch_size": 64, "use_flash_attn": "true"})[0]
    assert 0.0 < long["dp_comm_s"] < 0.05 * long["iteration_time_s"]
    # ... and with a short one the gathers outrun the compute and are exposed
    short = rows({"zero_stage": 3, "seq_length": 128, "global_batch_size": 64},
                 {"zero_stage": 0, "seq_length": 128, "global_batch_size": 64})
    assert short[0]["dp_comm_s"] > short[1]["dp_comm_s"]


def test_zero_stages_change_nothing_at_dp_1():
    r = rows(*({"zero_stage": z} for z in range(4)), dp=1, global_batch_size=8)
    for k in ("iteration_time_s", "memory_per_gpu_GiB", "dp_comm_s"):
        assert len({x[k] for x in r}) == 1, k


def test_spec_takes_a_stage_or_a_list_and_refuses_others():
    spec = parse_spec(ONE_POINT_SPEC.format(training="zero_stage = [0, 3]"), "s.toml")
    assert sorted(g.zero_stage for g in spec.gpus) == [0, 3]
    for bad in ("4", "-1", '"3"', "true", "1.0"):
        with pytest.raises(InputError, match="training.zero_stage") as e:
            parse_spec(ONE_POINT_SPEC.format(training=f"zero_stage = {bad}"), "s.toml")
        assert "integers from 0 to 3" in str(e.value)


def test_evaluate_refuses_a_stage_out_of_range():
    with pytest.raises(InputError, match="zero_stage"):
        rows({"zero_stage": 4})


def test_a_sweep_over_stages_prices_dp_1_plans_once(tmp_path):
    from vtrain_fast.engine.run import run_sweep
    from vtrain_fast.analysis.query import scan_results
    spec = parse_spec(SMALL_SWEEP.format(training="zero_stage = [0, 2, 3]"), "s.toml")
    out = tmp_path / "z"
    run_sweep(spec, out)
    df = scan_results(out).collect()
    assert set(df["zero_stage"].unique()) == {0, 2, 3}
    dp1 = df.filter(pl.col("dp") == 1)
    assert (dp1.filter(pl.col("zero_stage") != 0)["status"] == "repeat").all()
    ok = df.filter((pl.col("dp") > 1) & (pl.col("status") == "ok"))
    mem = ok.group_by("zero_stage").agg(pl.col("model_states_GiB").mean()).sort("zero_stage")["model_states_GiB"]
    assert list(mem) == sorted(mem, reverse=True)
    assert np.isfinite(ok["iteration_time_s"].to_numpy()).all()


# ---------------------------------------------------------------------------------------------
# hybrid sharding (dp_shard): shards within groups, the groups replicas of each other
def test_hybrid_sharding_shards_within_a_group_and_all_reduces_across_replicas():
    full, hybrid = rows({"zero_stage": 3}, {"zero_stage": 3, "dp_shard": 8})
    n = full["num_parameters"]
    gib = 1024.0 ** 3
    layer = memory.layer_params_per_rank.py_func(5120.0, 40.0, 40.0, 4 * 5120.0, 1.0)
    assert hybrid["model_states_GiB"] * gib == pytest.approx(16.0 / 8 * n + 2 * 4.0 * layer, rel=1e-3)
    assert full["model_states_GiB"] < hybrid["model_states_GiB"]
    # the replicas' all-reduce of the 1/8 shards, over 64 / 8 = 8 groups (hidden under the last
    # backward as far as it goes, so dp_comm_s is at least its exposed part)
    hw = machine_vector(A100)
    replica = comm.group_allreduce_s.py_func(2.0 * n / 8, 8.0, 8.0, hw)
    assert replica > 0.0 and hybrid["dp_comm_s"] > 0.0


def test_sharding_inside_a_node_makes_the_gathers_cheaper_when_they_are_exposed():
    """Short sequences leave ZeRO-3's per-layer gathers exposed: gathering over the 8 GPUs of a
    node (NVLink) instead of all 64 (across nodes) is faster, at the cost of memory."""
    full, node = rows({"zero_stage": 3}, {"zero_stage": 3, "dp_shard": 8}, seq_length=256, global_batch_size=64)
    assert node["dp_comm_s"] < full["dp_comm_s"] and node["iteration_time_s"] < full["iteration_time_s"]
    assert node["memory_per_gpu_GiB"] > full["memory_per_gpu_GiB"]


def test_dp_shard_must_divide_the_data_parallel_ranks_and_needs_zero():
    bad, ddp_a, ddp_b = rows({"zero_stage": 1, "dp_shard": 24}, {"dp_shard": 24}, {})
    assert bad["status"] == "bad_num_gpus"
    # without ZeRO there is nothing to shard: no effect at all
    for k in ("iteration_time_s", "memory_per_gpu_GiB", "dp_comm_s"):
        assert ddp_a[k] == ddp_b[k], k
    default, whole = rows({"zero_stage": 2}, {"zero_stage": 2, "dp_shard": 64})
    for k in ("iteration_time_s", "memory_per_gpu_GiB", "dp_comm_s"):
        assert default[k] == whole[k], k       # a group of all 64 ranks is plain sharding


def test_dp_shard_is_a_training_setting_of_the_spec():
    spec = parse_spec(ONE_POINT_SPEC.format(training="zero_stage = 3\ndp_shard = [0, 4]"), "s.toml")
    assert sorted(g.dp_shard for g in spec.gpus) == [0, 4]
    with pytest.raises(InputError, match="training.dp_shard"):
        parse_spec(ONE_POINT_SPEC.format(training="zero_stage = 3\ndp_shard = -8"), "s.toml")
