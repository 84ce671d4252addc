"""tp_comm_overlap (Megatron-LM --tp-comm-overlap, Transformer Engine userbuffers): the
sequence-parallel all-gathers and reduce-scatters run pipelined with the GEMMs next to them;
it needs sequence parallelism and changes nothing at tp = 1."""
from __future__ import annotations

import dataclasses

import numpy as np
import polars as pl
import pytest

from vtrain_fast.io.errors import InputError
from vtrain_fast.analysis.evaluate import evaluate_frame
from vtrain_fast.hardware.gpus import PRESETS, machine_vector
from vtrain_fast.model import comm, ops
from vtrain_fast.model.records import hw_index, NUM_OUTPUTS, OUTPUT
from vtrain_fast.model.layout import Layout

from vtrain_fast.model.step import step

from conftest import SMALL_SWEEP

PLAN = dict(num_layers=32, hidden_size=8192, num_attention_heads=64, seq_length=4096, global_batch_size=64,
            micro_batch_size=4, pp=1, gpu="h100-sxm-80gb", recompute="none")


def rows(tp, **flags):
    df = pl.DataFrame([dict(PLAN, tp=tp, dp=8 // tp, **{k: str(v).lower() for k, v in f.items()})
                       for f in flags.get("each", [{}])])
    return evaluate_frame(df).rows(named=True)


def test_overlap_hides_the_six_exchanges_next_to_their_gemms():
    tp = 4
    off, on = rows(tp, each=[dict(sequence_parallel=True), dict(sequence_parallel=True, tp_comm_overlap=True)])
    hw = machine_vector(PRESETS["h100-sxm-80gb"])
    b, s, h, f = PLAN["micro_batch_size"], PLAN["seq_length"], PLAN["hidden_size"], 4 * PLAN["hidden_size"]
    half = comm.group_reduce_scatter_allgather_s(2.0 * b * s * h, tp, 1.0, hw) / 2.0
    gemms = [ops.gemm_time_s(b * s, n, k, 1.0, hw)
             for n, k in ((3 * h / tp, h), (h, h / tp), (f / tp, h), (h, f / tp), (h / tp, h), (f / tp, h))]
    m = PLAN["global_batch_size"] / ((8 // tp) * b)
    hidden = m * PLAN["num_layers"] * sum(min(half, x) for x in gemms)
    assert hidden > 0.0
    assert off["tp_comm_s"] - on["tp_comm_s"] == pytest.approx(hidden, rel=1e-9)
    assert off["iteration_time_s"] - on["iteration_time_s"] == pytest.approx(hidden, rel=1e-9)
    assert on["compute_s"] == off["compute_s"] and on["tp_comm_overlap"] is True
    assert on["memory_per_gpu_GiB"] == off["memory_per_gpu_GiB"]


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_never_slower_and_never_below_the_embedding_and_head_exchanges(tp):
    off, on = rows(tp, each=[dict(sequence_parallel=True), dict(sequence_parallel=True, tp_comm_overlap=True)])
    assert on["iteration_time_s"] < off["iteration_time_s"]
    assert 0.0 < on["tp_comm_s"] < off["tp_comm_s"]


def test_refused_at_tp_1_where_megatron_switches_sequence_parallelism_off():
    """Megatron-LM turns --sequence-parallel off at tp = 1 and then refuses --tp-comm-overlap."""
    with pytest.raises(InputError, match="switches sequence_parallel off at tp = 1") as e:
        rows(1, each=[dict(sequence_parallel=True, tp_comm_overlap=True)])
    assert "set tp_comm_overlap to false" in str(e.value)


def test_a_sweep_marks_its_tp_1_plans_refused_and_a_frontier_of_it_leaves_them_out(tmp_path, write_spec, cli):
    spec = write_spec(SMALL_SWEEP.format(training="sequence_parallel = true\ntp_comm_overlap = [false, true]"))
    out = tmp_path / "r"
    assert cli("sweep", spec, "-o", out).exit_code == 0
    from vtrain_fast.analysis.query import scan_results
    df = scan_results(out).collect()
    refused = df.filter(pl.col("status") == "refused")
    assert refused.height > 0 and (refused["tp"] == 1).all() and refused["tp_comm_overlap"].all()
    assert refused["iteration_time_s"].is_nan().all()
    assert not df.filter((pl.col("tp") == 1) & pl.col("tp_comm_overlap") & (pl.col("status") == "ok")).height
    from vtrain_fast.analysis.query import pareto
    front = pareto(out, ["cost_usd", "train_days"], where=["tp_comm_overlap==true"])
    assert front.height > 0 and (front["tp"] > 1).all()
    both = pareto(out, ["cost_usd", "train_days"], by=["tp_comm_overlap"])
    assert not both.filter(pl.col("tp_comm_overlap") & (pl.col("tp") == 1)).height


def test_the_kernel_gives_it_no_effect_without_sequence_parallelism():
    """Megatron-LM refuses the flag without --sequence-parallel (so does evaluate); the formula
    agrees with the registry's rule: without it the flag changes nothing."""
    base = PRESETS["h100-sxm-80gb"]
    outs = []
    for flag in (False, True):
        hw = machine_vector(dataclasses.replace(base, tp_comm_overlap=flag))
        assert hw[hw_index("tp_comm_overlap")] == float(flag)
        out = np.empty((NUM_OUTPUTS, 1))
        step(32, 8192, 64, 64, 32768, 51200, 4096, 64, 4, Layout(4, 1, 2, 1), 0, 1e12, hw, out, 0)
        outs.append(out[:, 0].copy())
    assert np.array_equal(outs[0], outs[1]) and outs[0][OUTPUT.tp_comm_s] > 0.0


def test_evaluate_refuses_it_without_sequence_parallelism():
    df = pl.DataFrame([dict(PLAN, tp=2, dp=4, tp_comm_overlap="true")])
    with pytest.raises(InputError, match="sequence_parallel = true") as e:
        evaluate_frame(df, "plans.csv")
    assert "plans.csv" in str(e.value) and "--tp-comm-overlap" in str(e.value)


def test_a_sweep_axis_leaves_out_the_machines_megatron_would_refuse():
    from conftest import ONE_POINT_SPEC
    from vtrain_fast.plan.spec import parse_spec
    spec = parse_spec(ONE_POINT_SPEC.format(training="sequence_parallel = [false, true]\n"
                                                     "tp_comm_overlap = [false, true]"), "s.toml")
    assert [(g.sequence_parallel, g.tp_comm_overlap) for g in spec.gpus] == [(False, False), (True, False), (True, True)]
    assert any("tp_comm_overlap = true needs sequence_parallel = true" in n for n in spec.notes), spec.notes


def test_a_switch_without_its_requirement_runs_off_and_is_labelled_off():
    """sequence_parallel = [false, true] with tp_comm_overlap = true: the sequence_parallel =
    false machines carry tp_comm_overlap = false (a row labelled true there would be a plan
    Megatron-LM refuses, and evaluate would refuse it on the way back)."""
    from conftest import ONE_POINT_SPEC
    from vtrain_fast.plan.spec import parse_spec
    spec = parse_spec(ONE_POINT_SPEC.format(training="sequence_parallel = [false, true]\ntp_comm_overlap = true"),
                      "s.toml")
    assert [(g.sequence_parallel, g.tp_comm_overlap) for g in spec.gpus] == [(False, False), (True, True)]
    assert any("the sequence_parallel = false machines run with tp_comm_overlap = false" in n for n in spec.notes)


@pytest.mark.parametrize("training", ["sequence_parallel = [false, true]\ntp_comm_overlap = true",
                                      "distributed_optimizer = [false, true]\noverlap_grad_reduce = true\n"
                                      "overlap_param_gather = true"])
def test_a_frontier_of_such_a_sweep_evaluates_back_to_the_same_numbers(training, tmp_path, write_spec, cli):
    spec = write_spec(SMALL_SWEEP.format(training=training))
    out, front, back = tmp_path / "r", tmp_path / "front.csv", tmp_path / "back.csv"
    assert cli("sweep", spec, "-o", out).exit_code == 0
    res = cli("pareto", out, "--by", "sequence_parallel", "--by", "distributed_optimizer", "-o", front)
    assert res.exit_code == 0, res.output
    res = cli("evaluate", front, "-o", back)
    assert res.exit_code == 0, res.output
    a, b = pl.read_csv(front), pl.read_csv(back)
    assert a["iteration_time_s"].to_list() == b["iteration_time_s"].to_list()
