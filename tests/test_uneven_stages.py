"""Uneven pipeline stages: first_pipeline_num_layers / last_pipeline_num_layers (Megatron-LM
--decoder-first/last-pipeline-num-layers) and the embedding / loss counted as layers
(--account-for-embedding/loss-in-pipeline-split, Megatron-DeepSpeed's partition of BLOOM)."""
from __future__ import annotations

import itertools

import numpy as np
import polars as pl
import pytest

import reference as ref
from conftest import ONE_POINT_SPEC
from vtrain_fast.analysis.evaluate import evaluate_frame
from vtrain_fast.hardware.gpus import PRESETS, machine_vector
from vtrain_fast.io.errors import InputError
from vtrain_fast.model.records import hw_index
from vtrain_fast.model.layer_split import stage_layers
from vtrain_fast.plan.spec import parse_spec

SETTINGS = ("first_pipeline_num_layers", "last_pipeline_num_layers", "account_for_embedding_in_pipeline_split",
            "account_for_loss_in_pipeline_split")


def machine(**values):
    hw = machine_vector(PRESETS["a100-sxm4-80gb"])
    for k, v in values.items():
        hw[hw_index(k)] = float(v)
    return hw


def test_the_kernel_split_is_the_twins_on_every_small_case():
    for L, p, first, last, emb, loss in itertools.product(range(1, 25), range(1, 7), (0, 1, 3, 5), (0, 2, 5),
                                                          (0, 1), (0, 1)):
        hw = machine(first_pipeline_num_layers=first, last_pipeline_num_layers=last,
                     account_for_embedding_in_pipeline_split=emb, account_for_loss_in_pipeline_split=loss)
        if (emb or loss) and (first or last):
            continue                       # Megatron-LM refuses the combination (a settings rule)
        f, m, la, ok = stage_layers.py_func(float(L), float(p), hw)
        counts = ref.stage_layer_counts(L, p, hw)
        assert ok == (counts is not None), (L, p, first, last, emb, loss)
        if ok:
            assert (f, la) == (counts[0], counts[-1])
            if p > 2:
                assert m == counts[1] and set(counts[1:-1]) == {m}


def test_bloom_70_layers_over_12_stages_counting_embedding_and_loss():
    """BigScience tr11: 70 layers + 2 embedding 'layers' over 12 stages: 5, 10 x 6, 5."""
    hw = machine(account_for_embedding_in_pipeline_split=1, account_for_loss_in_pipeline_split=1)
    assert stage_layers.py_func(70.0, 12.0, hw) == (5.0, 6.0, 5.0, True)
    assert ref.stage_layer_counts(70, 12, hw) == [5] + [6] * 10 + [5]
    assert not stage_layers.py_func(70.0, 12.0, machine())[3]


PLAN = dict(num_layers=70, hidden_size=14336, num_attention_heads=112, seq_length=2048, vocab_size=250680,
            global_batch_size=2048, micro_batch_size=2, tp=4, pp=12, dp=8, gpu="a100-sxm4-80gb", recompute="full")


def rows(*variants, **common):
    return evaluate_frame(pl.DataFrame([{**PLAN, **common, **v} for v in variants])).rows(named=True)


def test_bloom_plan_runs_and_both_spellings_agree():
    even, flags, explicit = rows({}, {"account_for_embedding_in_pipeline_split": "true",
                                      "account_for_loss_in_pipeline_split": "true"},
                                 {"first_pipeline_num_layers": 5, "last_pipeline_num_layers": 5})
    assert even["status"] == "bad_layers"
    assert flags["status"] == "ok"
    for k in ("iteration_time_s", "memory_per_gpu_GiB", "dp_comm_s", "bubble_s"):
        assert flags[k] == explicit[k], k


def test_llama3_405b_plan_126_layers_over_16_stages():
    """Llama 3 405B's published plan: pp = 16 with the embedding and the loss counted as layers."""
    plan = dict(model="llama3-405b", tp=8, pp=16, dp=128, global_batch_size=1024, micro_batch_size=1,
                gpu="h100-sxm-80gb", recompute="none", sequence_parallel="true", distributed_optimizer="true",
                use_flash_attn="true", vpp=1)
    out = evaluate_frame(pl.DataFrame([plan, dict(plan, account_for_embedding_in_pipeline_split="true",
                                                  account_for_loss_in_pipeline_split="true")]))
    assert list(out["status"]) == ["bad_layers", "ok"]


def test_the_schedule_waits_on_the_slowest_stage_and_memory_on_the_fullest():
    plan = dict(PLAN, num_layers=36, pp=4, dp=8, tp=4, global_batch_size=256, vocab_size=51200)
    even, skewed, heavy_first = evaluate_frame(pl.DataFrame([
        plan, dict(plan, first_pipeline_num_layers=3), dict(plan, first_pipeline_num_layers=15)])).rows(named=True)
    # 3 / 11 / 11 / 11 layers: the middle stages set the pace
    assert skewed["iteration_time_s"] > even["iteration_time_s"]
    assert skewed["compute_s"] == pytest.approx(even["compute_s"] * 11 / 9, rel=0.02)
    # 15 / 7 / 7 / 7 layers: the first stage holds more
    assert heavy_first["memory_per_gpu_GiB"] > even["memory_per_gpu_GiB"]
    assert heavy_first["iteration_time_s"] > even["iteration_time_s"]
    # 3 / 11 / 11 / 11: a middle stage (more layers, 3 of 4 micro-batches in flight) is the fullest
    assert skewed["memory_per_gpu_GiB"] > even["memory_per_gpu_GiB"]


def test_interleaving_needs_every_stage_to_split_into_chunks():
    ok, odd = rows({"first_pipeline_num_layers": 6}, {"first_pipeline_num_layers": 3}, num_layers=36, pp=4,
                   global_batch_size=256, hidden_size=4096, num_attention_heads=32, vocab_size=51200, vpp=2)
    assert ok["status"] == "ok"          # 6 / 10 / 10 / 10, each in 2 chunks
    assert odd["status"] == "bad_layers"  # 3 / 11 / 11 / 11


def test_no_effect_without_a_pipeline():
    out = rows({}, {"first_pipeline_num_layers": 7}, pp=1, dp=96, num_layers=8, global_batch_size=192,
               hidden_size=2048, num_attention_heads=16, vocab_size=51200)
    assert out[0]["iteration_time_s"] == out[1]["iteration_time_s"]


def test_spec_keys_live_in_parallel_and_the_flags_refuse_set_counts():
    spec = parse_spec(ONE_POINT_SPEC.format(training="").replace("pp = 1", "pp = 1\nfirst_pipeline_num_layers = [0, 4]"),
                      "s.toml")
    assert sorted(g.first_pipeline_num_layers for g in spec.gpus) == [0, 4]
    with pytest.raises(InputError, match="parallel.last_pipeline_num_layers"):
        parse_spec(ONE_POINT_SPEC.format(training="").replace("pp = 1", "pp = 1\nlast_pipeline_num_layers = -2"),
                   "s.toml")
    with pytest.raises(InputError, match="first_pipeline_num_layers = 0"):
        parse_spec(ONE_POINT_SPEC.format(training="").replace(
            "pp = 1", "pp = 1\nfirst_pipeline_num_layers = 4\naccount_for_embedding_in_pipeline_split = true"), "s.toml")
    with pytest.raises(InputError, match="first_pipeline_num_layers"):
        parse_spec(ONE_POINT_SPEC.format(training="first_pipeline_num_layers = 4"), "s.toml")


def test_random_uneven_points_match_the_twin():
    rng = np.random.default_rng(7)
    base = machine_vector(PRESETS["h100-sxm-80gb"])
    checked = 0
    for _ in range(300):
        hw = base.copy()
        first, last = (int(x) for x in rng.choice([0, 0, 1, 2, 4, 6], 2))
        hw[hw_index("first_pipeline_num_layers")] = first
        hw[hw_index("last_pipeline_num_layers")] = last
        hw[hw_index("zero_stage")] = float(rng.choice([0, 1, 2, 3]))
        hw[hw_index("vpp")] = float(rng.choice([1, 1, 2]))
        L, p = int(rng.integers(4, 40)), int(rng.choice([2, 3, 4, 5, 8]))
        t, d, b = int(rng.choice([1, 2])), int(rng.choice([1, 2, 4])), int(rng.choice([1, 2]))
        B = d * b * int(rng.choice([4, 8, 16]))
        rc = int(rng.integers(0, 3))
        from vtrain_fast.model.layout import Layout
        from vtrain_fast.model.records import NUM_OUTPUTS, OUTPUT_NAMES
        from vtrain_fast.model import step
        out = np.empty((NUM_OUTPUTS, 1))
        status = step.step(L, 1024, 16, 16, 4096, 32000, 1024, B, b, Layout(t, 1, d, p), rc, 1e9, hw, out, 0)
        rs, ro = ref.step(L, 1024, 16, 16, 4096, 32000, 1024, B, b, t, p, d, rc, 1e9, hw)
        assert status == rs, (L, p, first, last)
        if status in (0, 6):
            checked += 1
            for k, name in enumerate(OUTPUT_NAMES):
                assert out[k, 0] == pytest.approx(ro[name], rel=1e-9, abs=1e-12), (name, L, p, first, last)
    assert checked > 30
