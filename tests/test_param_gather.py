"""overlap_param_gather (Megatron-LM --overlap-param-gather): with the distributed optimizer the
gradient reduce-scatter can hide under the backward (--overlap-grad-reduce), the parameter
all-gather only after the step, or with this flag under the next iteration's first forward.
Megatron-LM refuses the flag without --use-distributed-optimizer and --overlap-grad-reduce."""
from __future__ import annotations

import dataclasses

import numpy as np
import polars as pl
import pytest

from vtrain_fast.io.errors import InputError
from vtrain_fast.analysis.evaluate import evaluate_frame
from vtrain_fast.hardware.gpus import PRESETS, machine_vector
from vtrain_fast.model.records import NUM_OUTPUTS, OUTPUT
from vtrain_fast.model.layout import Layout
from vtrain_fast.model.costs import micro_batch_costs, split_costs

from vtrain_fast.model.step import step

# 2 layers per stage on 64 data-parallel ranks across nodes: a long exchange, a short forward
PLAN = dict(num_layers=16, hidden_size=4096, num_attention_heads=32, seq_length=2048, global_batch_size=512,
            micro_batch_size=1, tp=8, pp=8, dp=16, gpu="h100-sxm-80gb", recompute="none")
ON = dict(distributed_optimizer="true", overlap_grad_reduce="true")


def rows(*variants, **plan):
    return evaluate_frame(pl.DataFrame([dict(PLAN, **plan, **v) for v in variants])).rows(named=True)


def parts(tp=8, pp=8, dp=16):
    """The exchange (S_DP) and the forward window (layers per stage x one layer's forward)."""
    hw = machine_vector(dataclasses.replace(PRESETS["h100-sxm-80gb"], distributed_optimizer=True))
    L, h, a, s, f, v = 16.0, 4096.0, 32.0, 2048.0, 4 * 4096.0, 51200.0
    split = split_costs(L, h, a, a, f, v, s, Layout(tp, 1, dp, pp), hw)
    mb = micro_batch_costs(1.0, s, h, a, a, f, v, float(tp), hw)
    return split.dp_comm_s, L / pp * mb[0]


def test_the_all_gather_hides_under_the_first_forward_up_to_its_length():
    exchange, forward = parts()
    off, on = rows(ON, dict(ON, overlap_param_gather="true"))
    half = exchange / 2.0
    assert 0.0 < forward < half          # this plan's forward is shorter than the all-gather
    assert off["dp_comm_s"] - on["dp_comm_s"] == pytest.approx(forward, rel=1e-12)
    assert off["iteration_time_s"] - on["iteration_time_s"] == pytest.approx(forward, rel=1e-9)
    assert on["dp_comm_s"] >= half - forward - 1e-15
    assert on["overlap_param_gather"] is True and on["memory_per_gpu_GiB"] == off["memory_per_gpu_GiB"]


def test_without_it_the_all_gather_after_the_step_is_exposed():
    """Overlapped gradient reduction hides only the reduce-scatter half: the parameter all-gather
    cannot start before the step that produces the parameters."""
    exchange, _ = parts()
    (r,) = rows(ON)
    assert r["dp_comm_s"] >= exchange / 2.0 * (1 - 1e-12)


def test_never_slower_over_many_plans():
    plans = [dict(tp=t, pp=p, dp=d, micro_batch_size=b, global_batch_size=64 * d)
             for t in (1, 2, 8) for p in (1, 2, 4) for d in (2, 8, 32) for b in (1, 2)]
    df = pl.DataFrame([dict(PLAN, **pl_, **ON, overlap_param_gather=f) for pl_ in plans for f in ("false", "true")])
    out = evaluate_frame(df)
    off, on = out[::2], out[1::2]
    ok = (off["status"] == "ok").to_numpy()
    assert ok.sum() > 10
    assert (on["iteration_time_s"].to_numpy()[ok] <= off["iteration_time_s"].to_numpy()[ok]).all()
    assert (on["dp_comm_s"].to_numpy()[ok] < off["dp_comm_s"].to_numpy()[ok]).all()


def test_no_effect_at_dp_1():
    off, on = rows(ON, dict(ON, overlap_param_gather="true"), dp=1, global_batch_size=32)
    # (dp_comm_s keeps the tied embedding's all-reduce between the first and last stage at pp > 1)
    assert on["iteration_time_s"] == off["iteration_time_s"] and on["dp_comm_s"] == off["dp_comm_s"]


def test_the_kernel_gives_it_no_effect_without_what_it_needs():
    base = PRESETS["h100-sxm-80gb"]
    for needs in (dict(distributed_optimizer=False, overlap_grad_reduce=True),
                  dict(distributed_optimizer=True, overlap_grad_reduce=False)):
        outs = []
        for flag in (False, True):
            hw = machine_vector(dataclasses.replace(base, overlap_param_gather=flag, **needs))
            out = np.empty((NUM_OUTPUTS, 1))
            step(16, 4096, 32, 32, 16384, 51200, 2048, 512, 1, Layout(8, 1, 16, 8), 0, 1e12, hw, out, 0)
            outs.append(out[:, 0].copy())
        assert np.array_equal(outs[0], outs[1]) and outs[0][OUTPUT.dp_comm_s] > 0.0, needs


@pytest.mark.parametrize("missing", ["distributed_optimizer", "overlap_grad_reduce"])
def test_evaluate_and_spec_refuse_it_without_what_it_needs(missing):
    df = pl.DataFrame([dict(PLAN, **dict(ON, **{missing: "false"}), overlap_param_gather="true")])
    with pytest.raises(InputError, match=f"{missing} = true") as e:
        evaluate_frame(df, "plans.csv")
    assert "--overlap-param-gather" in str(e.value)
    from conftest import ONE_POINT_SPEC
    from vtrain_fast.plan.spec import parse_spec
    other = "overlap_grad_reduce" if missing == "distributed_optimizer" else "distributed_optimizer"
    with pytest.raises(InputError, match=f"training.overlap_param_gather.*{missing} = true"):
        parse_spec(ONE_POINT_SPEC.format(training=f"overlap_param_gather = true\n{other} = true"), "s.toml")


def test_a_sweep_axis_keeps_only_the_machines_megatron_accepts():
    from conftest import ONE_POINT_SPEC
    from vtrain_fast.plan.spec import parse_spec
    spec = parse_spec(ONE_POINT_SPEC.format(training="distributed_optimizer = [false, true]\n"
                                                     "overlap_grad_reduce = [false, true]\n"
                                                     "overlap_param_gather = [false, true]"), "s.toml")
    kept = [(g.overlap_grad_reduce, g.distributed_optimizer, g.overlap_param_gather) for g in spec.gpus]
    assert kept == [(False, False, False), (False, True, False), (True, False, False), (True, True, False),
                    (True, True, True)]
