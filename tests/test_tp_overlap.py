"""async_tensor_model_parallel_allreduce: the backward exchange of the QKV and FC1 layers runs
under their weight-gradient GEMMs (Megatron-LM LinearWithGradAccumulationAndAsyncCommunication)."""
from __future__ import annotations

import math

import polars as pl
import pytest

from vtrain_fast.analysis.evaluate import evaluate_frame
from vtrain_fast.hardware.gpus import PRESETS, machine_vector
from vtrain_fast.model import comm, ops

PLAN = dict(num_layers=32, hidden_size=8192, num_attention_heads=64, seq_length=4096, global_batch_size=64,
            micro_batch_size=4, pp=1, gpu="a100-sxm4-80gb")


def run(tp, flag, recompute="none"):
    df = pl.DataFrame([dict(PLAN, tp=tp, dp=8 // tp, recompute=recompute,
                            async_tensor_model_parallel_allreduce=str(flag).lower())])
    return evaluate_frame(df).row(0, named=True)


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_long_gemms_hide_both_backward_exchanges(recompute):
    tp = 2
    off, on = run(tp, False, recompute), run(tp, True, recompute)
    hw = machine_vector(PRESETS["a100-sxm4-80gb"])
    b, s, h = PLAN["micro_batch_size"], PLAN["seq_length"], PLAN["hidden_size"]
    ar = comm.group_allreduce_s(2.0 * b * s * h, tp, 1.0, hw)
    # both weight-gradient GEMMs (h x 3h/t x bs and h x 4h/t x bs) outlast the all-reduce here
    assert ops.gemm_time_s(h, 3 * h / tp, b * s, 1.0, hw) > ar and ops.gemm_time_s(h, 4 * h / tp, b * s, 1.0, hw) > ar
    m = PLAN["global_batch_size"] / ((8 // tp) * b)
    hidden = m * PLAN["num_layers"] * 2.0 * ar
    assert math.isclose(off["tp_comm_s"] - on["tp_comm_s"], hidden, rel_tol=1e-9)
    assert math.isclose(off["iteration_time_s"] - on["iteration_time_s"], hidden, rel_tol=1e-9)
    assert on["async_tensor_model_parallel_allreduce"] is True
    assert off["async_tensor_model_parallel_allreduce"] is False


def test_short_gemms_hide_only_their_length():
    hw = machine_vector(PRESETS["a100-sxm4-80gb"])
    b, s, h, t = 1.0, 128.0, 1024.0, 8.0
    ar = comm.group_allreduce_s(2.0 * b * s * h, t, 1.0, hw)
    wq = ops.gemm_time_s(h, 3 * h / t, b * s, 1.0, hw)
    wf = ops.gemm_time_s(h, 4 * h / t, b * s, 1.0, hw)
    assert wq < ar and wf < ar                      # tiny GEMMs: the exchange outlasts them
    from vtrain_fast.model.overlap import tp_backward_hidden_s
    assert tp_backward_hidden_s(b, s, h, 16.0, 16.0, 4 * h, t, ar, hw) == pytest.approx(wq + wf, rel=1e-12)
    assert tp_backward_hidden_s(b, s, h, 16.0, 16.0, 4 * h, 1.0, ar, hw) == 0.0


def test_no_tensor_parallelism_no_change():
    assert run(1, True)["iteration_time_s"] == run(1, False)["iteration_time_s"]


def test_sequence_parallel_hides_half_the_exchange_whatever_the_flag():
    """With sequence parallelism Megatron-LM overlaps the reduce-scatter (half of the
    reduce-scatter + all-gather exchange) with the weight-gradient GEMM, flag or not."""
    hw = machine_vector(PRESETS["a100-sxm4-80gb"])
    b, s, h, tp = PLAN["micro_batch_size"], PLAN["seq_length"], PLAN["hidden_size"], 2
    exchange = comm.group_reduce_scatter_allgather_s(2.0 * b * s * h, tp, 1.0, hw)
    df = pl.DataFrame([dict(PLAN, tp=tp, dp=4, recompute="none", sequence_parallel="true",
                            async_tensor_model_parallel_allreduce=f) for f in ("false", "true")])
    off, on = evaluate_frame(df).rows(named=True)
    assert off["tp_comm_s"] == on["tp_comm_s"]
    m = PLAN["global_batch_size"] / (4 * b)
    layers = PLAN["num_layers"]
    # per layer: 4 exchanges charged, two halves hidden (long GEMMs here), plus embedding/head
    expected_body = m * layers * (4.0 * exchange - 2.0 * exchange / 2.0)
    assert on["tp_comm_s"] == pytest.approx(expected_body + m * exchange * 2, rel=0.02)
