"""Sequence parallelism (training setting sequence_parallel, Megatron --sequence-parallel)."""
from __future__ import annotations

import polars as pl
import pytest

from vtrain_fast.analysis.evaluate import evaluate_frame
from vtrain_fast.model import memory

PLANS = pl.DataFrame({
    "num_layers": [126, 96, 40, 24], "hidden_size": [16384, 12288, 6144, 2048],
    "num_attention_heads": [128, 96, 48, 16], "num_query_groups": [8, 96, 48, 16],
    "seq_length": [8192, 2048, 4096, 1024],
    "global_batch_size": [2048, 1536, 1024, 64], "micro_batch_size": [1, 1, 2, 4],
    "tp": [8, 8, 4, 1], "pp": [14, 8, 2, 1], "dp": [64, 8, 32, 8],
    "gpu": ["h100-sxm-80gb"] + ["a100-sxm4-80gb"] * 3, "recompute": ["none", "full", "none", "full"],
    "grad_reduce_in_bf16": [True] * 4,       # 16-bit gradients: the 405B plan fits with sequence parallelism alone
    "use_flash_attn": ["true", "false", "true", "false"], "distributed_optimizer": ["true"] * 4,
})


@pytest.mark.parametrize("s,b,h,a,t", [(2048, 1, 12288, 96, 8), (4096, 2, 6144, 48, 4), (1024, 4, 2048, 16, 1)])
def test_layer_activations_follow_korthikanti_table_2(s, b, h, a, t):
    """Korthikanti et al. 2022, Table 2 (GPT layer, f = 4h, no FlashAttention):
    tensor parallel sbh(10 + 24/t + 5as/(ht)); tensor + sequence parallel sbh(34/t + 5as/(ht))."""
    tp_only = memory.layer_activation_bytes(b, s, h, a, a, 4 * h, t, 0.0, 0.0)
    tp_sp = memory.layer_activation_bytes(b, s, h, a, a, 4 * h, t, 0.0, 1.0)
    assert tp_only == pytest.approx(s * b * h * (10 + 24 / t + 5 * a * s / (h * t)), rel=1e-12)
    assert tp_sp == pytest.approx(s * b * h * (34 / t + 5 * a * s / (h * t)), rel=1e-12)


def test_sequence_parallel_splits_activations_and_token_work_only():
    off = evaluate_frame(PLANS)
    on = evaluate_frame(PLANS.with_columns(sequence_parallel=pl.lit("true")))
    tp1 = PLANS["tp"] == 1
    assert (on["activations_GiB"].filter(~tp1) < off["activations_GiB"].filter(~tp1)).all()
    assert (on["compute_s"].filter(~tp1) < off["compute_s"].filter(~tp1)).all()
    for col in ("activations_GiB", "compute_s", "iteration_time_s"):
        assert (on[col].filter(tp1) == off[col].filter(tp1)).all(), col      # t = 1: nothing to split
    for col in ("dp_comm_s", "optimizer_s", "model_states_GiB"):
        assert (on[col] == off[col]).all(), col
    # reduce-scatter + all-gather: the all-reduce's bytes plus one more collective latency each,
    # minus the backward reduce-scatters Megatron-LM overlaps with the weight-gradient GEMMs (at
    # most half of 2 of the 4 (6 with recomputation) exchanges per layer; exact in test_tp_overlap)
    extra = (on["tp_comm_s"] - off["tp_comm_s"]).filter(~tp1)
    assert (extra <= 0.02 * off["tp_comm_s"].filter(~tp1)).all()
    assert (on["tp_comm_s"].filter(~tp1) >= 0.74 * off["tp_comm_s"].filter(~tp1)).all()
    # pipeline sends of the split activation need no all-gather
    piped = (PLANS["pp"] > 1) & ~tp1
    assert (on["pp_comm_s"].filter(piped) < off["pp_comm_s"].filter(piped)).all()
    # Llama-3-405B-like plan on 8-GPU tensor-parallel groups: fits only with sequence parallelism
    assert off["status"][0] == "out_of_memory" and on["status"][0] == "ok"


def test_full_recomputation_keeps_a_1_over_t_slice_of_each_layer_input():
    """pp = 1, full recomputation: every layer keeps its input, split over the t ranks by
    sequence parallelism (2 s b h / t bytes), plus one layer rebuilt at a time and the
    embedding / final-norm tensors (3 s b h / t) and the logits (6 s b v / t)."""
    L, h, a, s, b, t, v = 24, 2048, 16, 1024, 4, 4, 50257
    plan = pl.DataFrame({"num_layers": [L], "hidden_size": [h], "num_attention_heads": [a], "seq_length": [s],
                         "global_batch_size": [64], "micro_batch_size": [b], "tp": [t], "pp": [1], "dp": [2],
                         "gpu": ["a100-sxm4-80gb"], "recompute": ["full"], "sequence_parallel": ["true"]})
    got = evaluate_frame(plan)["activations_GiB"][0] * 2.0 ** 30
    layer = memory.layer_activation_bytes(b, s, h, a, a, 4 * h, t, 0.0, 1.0)
    expected = L * 2.0 * s * b * h / t + layer + 3.0 * s * b * h / t + 6.0 * s * b * v / t
    assert got == pytest.approx(expected, rel=1e-12)
