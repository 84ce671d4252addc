"""The precision-aware optimizer (issue 16: 8-bit optimizer states): Megatron-LM's
--use-precision-aware-optimizer with --exp-avg-dtype / --exp-avg-sq-dtype. Memory and the Adam
step by hand, the refusal without the switch, and the export's flags."""
from __future__ import annotations

import polars as pl
import pytest

from vtrain_fast.analysis.evaluate import evaluate_frame
from vtrain_fast.analysis.export import bridge_overrides, megatron_args
from vtrain_fast.hardware.gpus import PRESETS
from vtrain_fast.io.errors import InputError

GiB = 1024.0 ** 3
# GPT-3 13B on 8 A100 without data-parallel sharding, so the states are the whole model's
PLAN = dict(model="gpt3-13b", gpu="a100-sxm4-80gb", global_batch_size=64, micro_batch_size=1, tp=8, pp=1, dp=1,
            recompute="full", use_flash_attn=True)
MOMENT_BYTES = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "fp8": 1.0}


def _rows(*variants):
    return evaluate_frame(pl.DataFrame([{**PLAN, **v} for v in variants]), "x").rows(named=True)


@pytest.mark.parametrize("m, v", [("fp32", "fp32"), ("bf16", "bf16"), ("fp8", "fp8"), ("fp16", "fp8")])
def test_state_bytes_and_adam_step_by_hand(m, v):
    base, aware = _rows({}, {"use_precision_aware_optimizer": True, "exp_avg_dtype": m, "exp_avg_sq_dtype": v})
    assert base["status"] == aware["status"] == "ok"
    # 2 + 4 + 12 bytes per parameter on the GPU without (bf16 weight, fp32 main gradient; the tp
    # shard, norms replicated: the base's states over 18 count them); 2 + 4 + (2 remainder + m + v) with
    n = base["model_states_GiB"] * GiB / 18.0
    assert n == pytest.approx(base["num_parameters"] / 8, rel=0.01)
    want = n * (MOMENT_BYTES[m] + MOMENT_BYTES[v] + 2.0 - 12.0)
    got = (aware["model_states_GiB"] - base["model_states_GiB"]) * GiB
    assert got == pytest.approx(want, rel=1e-6, abs=n * 1e-6)
    # the Adam step reads and writes each moment once: 2 (m + v) bytes of the 48 change
    hw_bytes = (32.0 + 2.0 * (MOMENT_BYTES[m] + MOMENT_BYTES[v])) / 48.0
    assert aware["optimizer_s"] == pytest.approx(base["optimizer_s"] * hw_bytes, rel=0.05)
    assert aware["optimizer_s"] <= base["optimizer_s"] * (1 + 1e-12)


def test_eight_bit_states_fit_a_model_that_fp32_states_do_not():
    plan = dict(model="gpt3-13b", tp=2, dp=1, global_batch_size=16)
    base, aware = _rows(plan, {**plan, "use_precision_aware_optimizer": True, "exp_avg_dtype": "fp8",
                               "exp_avg_sq_dtype": "fp8"})
    cap = PRESETS["a100-sxm4-80gb"].hbm_GiB
    assert base["memory_per_gpu_GiB"] > cap >= aware["memory_per_gpu_GiB"]
    assert base["status"] == "out_of_memory" and aware["status"] == "ok"


def test_state_dtypes_need_the_precision_aware_optimizer():
    with pytest.raises(InputError, match="use_precision_aware_optimizer"):
        _rows({"exp_avg_dtype": "fp8"})
    with pytest.raises(InputError, match="exp_avg_dtype"):
        _rows({"use_precision_aware_optimizer": True, "exp_avg_dtype": "int4"})


def test_the_export_names_megatrons_flags():
    row = _rows({"use_precision_aware_optimizer": True, "exp_avg_dtype": "fp8", "exp_avg_sq_dtype": "bf16"})[0]
    args = list(megatron_args(row, 8).args)
    assert "--use-precision-aware-optimizer" in args
    assert args[args.index("--exp-avg-dtype") + 1] == "fp8" and args[args.index("--exp-avg-sq-dtype") + 1] == "bf16"
    over = bridge_overrides(row, 8).args
    assert "optimizer.use_precision_aware_optimizer=true" in over and "optimizer.exp_avg_dtype=fp8" in over
    plain = list(megatron_args(_rows({})[0], 8).args)
    assert "--use-precision-aware-optimizer" not in plain and "--exp-avg-dtype" not in plain
