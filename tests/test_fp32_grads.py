"""fp32 main gradients (grad_reduce_in_bf16 = false, Megatron-LM's default under --bf16).

Megatron-LM sets accumulate_allreduce_grads_in_fp32 under --bf16 unless --grad-reduce-in-bf16
(megatron/training/arguments.py): the gradient buffer is fp32, full size on every rank even with the
distributed optimizer (megatron/core/distributed/param_and_grad_buffer.py), the weight gradients are
accumulated into it and it is reduced in fp32; the parameter all-gather stays 16-bit. Checked by
hand: the bytes per parameter of the states, the exchange's bytes, the accumulation's bytes, that
fp16 and fp32 precision ignore the setting, and the exports.
"""
from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from vtrain_fast.analysis.evaluate import evaluate_frame
from vtrain_fast.analysis.export import bridge_overrides, megatron_args, torchtitan_config
from vtrain_fast.hardware.gpus import PRESETS, machine_vector, with_overrides
from vtrain_fast.io.errors import InputError
from vtrain_fast.model import comm, costs, memory, ops
from vtrain_fast.model.arch import DEFAULT_ARCH
from vtrain_fast.model.layout import Layout
from vtrain_fast.model.records import MACHINE

GiB = 2.0 ** 30
SHAPE = dict(num_layers=16, hidden_size=4096, num_attention_heads=32, seq_length=4096, vocab_size=51200,
             global_batch_size=64, micro_batch_size=1, tp=2, pp=1, dp=4, gpu="h100-sxm-80gb")


def hw_of(**settings):
    return machine_vector(with_overrides(PRESETS["h100-sxm-80gb"], None, **settings))


def evaluate(**cols):
    out = evaluate_frame(pl.DataFrame([{**SHAPE, **cols}]), "test")
    assert out["status"][0] in ("ok", "out_of_memory")
    return out.row(0, named=True)


@pytest.mark.parametrize("precision, want", [("bf16", 4.0), ("fp8", 4.0), ("fp16", 2.0), ("fp32", 4.0), ("tf32", 4.0)])
def test_gradient_bytes_follow_megatron_defaults(precision, want):
    assert ops.grad_bytes(hw_of(precision=precision)) == want
    # grad_reduce_in_bf16 gives 16-bit gradients back under bf16 and fp8 only
    assert ops.grad_bytes(hw_of(precision=precision, grad_reduce_in_bf16=True)) == (
        2.0 if precision in ("bf16", "fp8", "fp16") else 4.0)


@pytest.mark.parametrize("stage, d", [(0, 8.0), (1, 8.0), (2, 8.0), (3, 8.0)])
def test_states_per_parameter_hold_a_four_byte_gradient(stage, d):
    fp32 = memory.state_bytes_per_param(d, float(stage), hw_of())
    bf16 = memory.state_bytes_per_param(d, float(stage), hw_of(grad_reduce_in_bf16=True))
    w = 2.0 / (d if stage >= 3 else 1.0)
    opt = 12.0 / (d if stage >= 1 else 1.0)
    assert fp32 == (w, 4.0 / (d if stage >= 2 else 1.0), opt)        # ZeRO Fig. 1 with a 4-byte gradient
    assert bf16 == (w, 2.0 / (d if stage >= 2 else 1.0), opt)


def test_a_plan_holds_two_bytes_more_per_parameter_and_its_exchange_carries_fp32_gradients():
    """DDP (zero_stage 0): 18 vs 16 bytes of states per local parameter; the exchange is an
    all-reduce of 4 vs 2 bytes per parameter (bucketed overlap off, so all of it is exposed)."""
    fp32, bf16 = evaluate(overlap_grad_reduce=False), evaluate(overlap_grad_reduce=False, grad_reduce_in_bf16=True)
    assert math.isclose(fp32["model_states_GiB"] / bf16["model_states_GiB"], 18.0 / 16.0, rel_tol=1e-12)
    params = bf16["model_states_GiB"] * GiB / 16.0
    hw = hw_of()
    assert math.isclose(fp32["dp_comm_s"], comm.group_allreduce_s(4.0 * params, 4.0, 2.0, hw), rel_tol=1e-9)
    assert math.isclose(bf16["dp_comm_s"], comm.group_allreduce_s(2.0 * params, 4.0, 2.0, hw), rel_tol=1e-9)
    assert fp32["iteration_time_s"] > bf16["iteration_time_s"]


def test_the_distributed_optimizer_reduce_scatters_fp32_and_gathers_bf16():
    lay = Layout(2, 1, 4, 1)
    args = (16.0, 4096.0, 32.0, 32.0, 16384.0, 51200.0, 4096.0, lay)
    fp32 = costs.split_costs(*args, hw_of(distributed_optimizer=True), DEFAULT_ARCH)
    bf16 = costs.split_costs(*args, hw_of(distributed_optimizer=True, grad_reduce_in_bf16=True), DEFAULT_ARCH)
    p = fp32.params_first
    hw = hw_of()
    assert fp32.dp_gather_s == bf16.dp_gather_s == comm.group_allgather_s(2.0 * p, 4.0, 2.0, hw)
    assert fp32.dp_comm_s - fp32.dp_gather_s == comm.group_allgather_s(4.0 * p, 4.0, 2.0, hw)
    assert bf16.dp_comm_s == 2.0 * bf16.dp_gather_s                 # 16-bit both ways: two equal halves
    # accumulation: the same pass (gradient_accumulation_fusion accumulates inside the wgrad GEMM)
    assert fp32.accumulate_first_s == bf16.accumulate_first_s > 0.0


def test_zero3_reduce_scatters_each_layer_in_fp32():
    lay = Layout(1, 1, 8, 1)
    args = (16.0, 4096.0, 32.0, 32.0, 16384.0, 51200.0, 4096.0, lay)
    fp32 = costs.split_costs(*args, hw_of(zero_stage=3), DEFAULT_ARCH)
    bf16 = costs.split_costs(*args, hw_of(zero_stage=3, grad_reduce_in_bf16=True), DEFAULT_ARCH)
    assert fp32.zero3_layer_gather_s == bf16.zero3_layer_gather_s == bf16.zero3_layer_reduce_s > 0.0
    p_layer = memory.layer_params_per_rank(4096.0, 32.0, 32.0, 16384.0, 1.0, DEFAULT_ARCH)
    assert fp32.zero3_layer_reduce_s == comm.group_allgather_s(4.0 * p_layer, 8.0, 1.0, hw_of())
    assert fp32.zero3_gathered_bytes == 2.0 * p_layer * (2.0 + 4.0)      # two layers: bf16 weight, fp32 gradient
    assert bf16.zero3_gathered_bytes == 2.0 * p_layer * (2.0 + 2.0)


@pytest.mark.parametrize("precision", ["fp16", "fp32"])
def test_precisions_with_their_own_gradient_dtype_ignore_the_setting(precision):
    a, b = evaluate(precision=precision), evaluate(precision=precision, grad_reduce_in_bf16=True)
    for k in ("iteration_time_s", "memory_per_gpu_GiB", "dp_comm_s", "compute_s"):
        assert a[k] == b[k], k


def _row(**cols):
    out = evaluate_frame(pl.DataFrame([{**SHAPE, "model": "llama3-8b", **cols}]), "test")
    return out.row(0, named=True)


def test_exports_say_the_gradient_dtype_they_were_priced_with():
    fp32, bf16 = _row(), _row(grad_reduce_in_bf16=True)
    assert "--grad-reduce-in-bf16" not in megatron_args(fp32, 8).args     # Megatron-LM's default: fp32
    assert "--grad-reduce-in-bf16" in megatron_args(bf16, 8).args
    assert "ddp.grad_reduce_in_fp32=false" in bridge_overrides(bf16, 8).args
    assert not any("grad_reduce_in_fp32" in a for a in bridge_overrides(fp32, 8).args)
    assert any("grad_reduce_in_fp32=False" in n for n in bridge_overrides(bf16, 8).notes)
    # Megatron-FSDP keeps bf16 main gradients unless told: the fp32 plan says so
    fsdp = megatron_args(_row(zero_stage=3), 8).args
    assert fsdp[fsdp.index("--megatron-fsdp-main-grads-dtype") + 1] == "fp32"
    assert "--megatron-fsdp-main-grads-dtype" not in megatron_args(_row(zero_stage=3, grad_reduce_in_bf16=True), 8).args
    # torchtitan reduces in float32 only
    torchtitan_config(fp32, 8)
    with pytest.raises(InputError, match="grad_reduce_in_bf16"):
        torchtitan_config(bf16, 8)
    # fp16 keeps fp16 gradients: nothing to say
    assert "--grad-reduce-in-bf16" not in megatron_args(_row(precision="fp16", grad_reduce_in_bf16=True), 8).args


def test_the_machine_vector_field_is_the_setting():
    assert hw_of(grad_reduce_in_bf16=True)[MACHINE.grad_reduce_in_bf16] == 1.0
    assert hw_of()[MACHINE.grad_reduce_in_bf16] == 0.0
    assert np.isfinite(hw_of()).all()


@pytest.mark.parametrize("name", ["grad_reduce_in_fp32", "accumulate_allreduce_grads_in_fp32"])
def test_the_opposite_switch_of_other_tools_is_refused_saying_to_invert_it(name):
    """Megatron-Bridge's ddp.grad_reduce_in_fp32 (Megatron-LM's accumulate_allreduce_grads_in_fp32)
    means the opposite of grad_reduce_in_bf16: a fix that only renames the key or column would
    carry `true` over and price 16-bit gradients for a run that keeps fp32 ones."""
    from vtrain_fast.analysis.evaluate import check_column_names
    from vtrain_fast.plan.spec import parse_spec
    from conftest import ONE_POINT_SPEC
    with pytest.raises(InputError, match="opposite value") as err:
        check_column_names([*SHAPE, name], "plans.csv")
    assert f"{name} = true is grad_reduce_in_bf16 = false" in str(err.value)
    with pytest.raises(InputError, match="opposite value") as err:
        parse_spec(ONE_POINT_SPEC.format(training=f"{name} = true"), "s.toml")
    assert f"training.{name}" in str(err.value) and "did you mean" not in str(err.value)


def test_a_results_folder_from_before_the_setting_is_read_as_priced():
    """Rows written before grad_reduce_in_bf16 existed were priced with 16-bit gradients: a results
    folder without the column is read with true (query.with_settings_priced_before, which every
    folder reader goes through), so show / export price and export them as they were priced."""
    from vtrain_fast.analysis.query import with_settings_priced_before
    from vtrain_fast.model.settings import BY_NAME
    assert BY_NAME["grad_reduce_in_bf16"].value_before() is True
    assert BY_NAME["overlap_grad_reduce"].value_before() == BY_NAME["overlap_grad_reduce"].default
    old = evaluate(grad_reduce_in_bf16=True)
    legacy = pl.DataFrame([{k: v for k, v in old.items() if k != "grad_reduce_in_bf16"}])
    read = with_settings_priced_before(legacy.lazy()).collect()
    assert read["grad_reduce_in_bf16"].to_list() == [True]
    again = evaluate(**{k: read[k][0] for k in ("grad_reduce_in_bf16",)})
    assert again["iteration_time_s"] == old["iteration_time_s"] != evaluate()["iteration_time_s"]
    # a folder that has the column keeps it
    kept = with_settings_priced_before(pl.DataFrame([evaluate()]).lazy()).collect()
    assert kept["grad_reduce_in_bf16"].to_list() == [False]
