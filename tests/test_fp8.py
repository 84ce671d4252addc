"""FP8 training (training setting precision = fp8, Transformer Engine): FP8 linear GEMMs, their
quantization kernels, the FP8 weight copies and FP8-saved inputs; bf16 attention core, embeddings
and head; refused on GPUs without FP8 tensor cores."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

import polars as pl
import pytest

from conftest import ONE_POINT_SPEC, SMALL_SWEEP, check_step_against_twin
from vtrain_fast.analysis.evaluate import evaluate_frame
from vtrain_fast.hardware.gpus import PRESETS, machine_vector
from vtrain_fast.io.errors import InputError
from vtrain_fast.model import costs, memory, ops
from vtrain_fast.model.records import HW_FIELDS, PRECISION_FP8
from vtrain_fast.model.settings import BY_NAME, rules_markdown
from vtrain_fast.plan.spec import has_fp8, parse_spec

H100 = PRESETS["h100-sxm-80gb"]
BF16 = machine_vector(H100)
FP8 = machine_vector(replace(H100, precision="fp8"))
# GPT-3 175B-like layer, one micro-batch of 2048 tokens, tp 4
B, S, H, A, G, F, T = 1.0, 2048.0, 12288.0, 96.0, 96.0, 49152.0, 4.0

PLANS = pl.DataFrame({
    "model": ["gpt3-175b", "gpt3-13b", "gpt3-1.3b"],
    "gpu": ["h100-sxm-80gb"] * 3, "tp": [8, 2, 1], "pp": [8, 1, 1], "dp": [2, 8, 8],
    "micro_batch_size": [1, 2, 4], "global_batch_size": [256, 256, 256],
    "recompute": ["selective", "full", "none"], "use_flash_attn": ["true", "false", "true"],
    "sequence_parallel": ["true", "true", "false"], "vpp": [3, 1, 1],
})


def test_precision_is_one_registry_setting_of_kind_str():
    st = BY_NAME["precision"]
    assert st.kind is str and st.default == "bf16" and st.choices[:2] == ("bf16", "fp8")
    assert st.encode("fp8") == PRECISION_FP8 == 1.0 and st.decode(0.0) == "bf16"
    assert FP8[HW_FIELDS.index("precision")] == 1.0 and BF16[HW_FIELDS.index("precision")] == 0.0
    assert "`precision` [bf16 | fp8 | fp16 | fp32 | tf32]" in rules_markdown()


def test_linear_gemms_run_at_the_fp8_rate_and_attention_stays_bf16():
    # a large GEMM is compute bound: the ratio of times is the ratio of achievable FP8 / bf16 rates
    m, n, k = 8192.0, 8192.0, 8192.0
    bf16_s = ops.linear_gemm_time_s(m, n, k, BF16) - H100.calibration.kernel_overhead_s
    fp8_s = ops.linear_gemm_time_s(m, n, k, FP8) - H100.calibration.kernel_overhead_s
    rate = (H100.peak_fp8_tflops * H100.calibration.fp8_gemm_efficiency) / (H100.peak_tflops * H100.calibration.gemm_efficiency)
    assert bf16_s / fp8_s == pytest.approx(rate, rel=1e-12)
    assert rate == pytest.approx(1978.9 * 0.762 / (989.4 * 0.801), rel=1e-12)   # H100 preset sources
    assert ops.linear_gemm_time_s(m, n, k, BF16) == ops.gemm_time_s(m, n, k, 1.0, BF16)   # bf16: unchanged
    # the attention core, the embeddings and the head stay bf16: same seconds either way
    for flash in (False, True):
        bf, f8 = (machine_vector(replace(H100, use_flash_attn=flash, precision=p)) for p in ("bf16", "fp8"))
        assert ops.attention_core_forward_s(B, S, H, A, G, T, bf) == ops.attention_core_forward_s(B, S, H, A, G, T, f8)
    assert ops.head_s(B, S, H, 51200.0, T, BF16) == ops.head_s(B, S, H, 51200.0, T, FP8)
    assert ops.embedding_s(B, S, H, 51200.0, T, BF16) == ops.embedding_s(B, S, H, 51200.0, T, FP8)


def test_fp8_layer_is_faster_on_a_gemm_heavy_shape_and_pays_for_its_casts():
    for fn in (ops.layer_forward_s, ops.layer_backward_s):
        assert fn(B, S, H, A, G, F, T, FP8) < fn(B, S, H, A, G, F, T, BF16)
    # the cast-transpose bytes: 4 per element of each linear input (forward) / output gradient
    fwd_bytes, fwd_kernels = ops.fp8_cast_forward(B, S, H, F, T, FP8)
    assert fwd_bytes == 4.0 * B * S * (2 * H + H / T + F / T) and fwd_kernels == 4.0
    bwd_bytes, _ = ops.fp8_cast_backward(B, S, H, A, G, F, T, FP8)
    assert bwd_bytes == 4.0 * B * S * (3 * H / T + H + F / T + H)
    assert ops.fp8_cast_forward(B, S, H, F, T, BF16) == (0.0, 0.0)
    # a tiny, memory-bound layer: the casts cost more than the FP8 GEMMs save
    tiny = (1.0, 128.0, 256.0, 4.0, 4.0, 1024.0, 1.0)
    no_host = replace(H100, calibration=replace(H100.calibration, host_launch_s=0.0))
    bf, f8 = (machine_vector(replace(no_host, precision=p)) for p in ("bf16", "fp8"))
    assert ops.layer_forward_s(*tiny, f8) > ops.layer_forward_s(*tiny, bf)


def test_memory_fp8_weight_copies_and_fp8_saved_inputs():
    # 2 bytes per linear weight on the rank: the FP8 weight and its transpose
    weights = (H * 3 * H + H * H + 2 * H * F) / T
    assert memory.fp8_weight_copy_bytes(H, A, G, F, T, 1.0) == 2.0 * weights
    assert memory.fp8_weight_copy_bytes(H, A, G, F, T, 0.0) == 0.0
    # saved inputs: QKV and FC1 (split with sequence parallelism), FC2, projection (unless flash)
    assert memory.fp8_activation_saving_bytes(B, S, H, F, T, 0.0, 0.0, 1.0) == S * B * (2 * H + F / T + H / T)
    assert memory.fp8_activation_saving_bytes(B, S, H, F, T, 1.0, 1.0, 1.0) == S * B * (2 * H / T + F / T)
    off, on = evaluate_frame(PLANS), evaluate_frame(PLANS.with_columns(precision=pl.lit("fp8")))
    assert (on["model_states_GiB"] > off["model_states_GiB"]).all()
    assert (on["activations_GiB"] < off["activations_GiB"]).all()
    assert (on["iteration_time_s"] < off["iteration_time_s"]).all()
    assert (on["compute_s"] < off["compute_s"]).all()
    # what FP8 does not touch: communication sizes, optimizer, parameters, bubble structure
    for col in ("pp_comm_s", "dp_comm_s", "optimizer_s", "overhead_s", "num_parameters", "num_micro_batches",
                "loss", "num_steps"):
        assert on[col].to_list() == off[col].to_list(), col
    # the MFU is counted against the bf16 peak, as Megatron-LM / NeMo report it
    assert (on["mfu"] / off["mfu"]).to_numpy() == pytest.approx((off["iteration_time_s"] / on["iteration_time_s"]).to_numpy())


def test_fp8_weight_cast_is_once_per_iteration():
    cast = costs.fp8_weight_cast_s(H, A, G, F, T, FP8)
    weights = memory.linear_weights_per_rank(H, A, G, F, T)
    assert cast == pytest.approx(4.0 * weights / (H100.hbm_GBps * 1e9 * H100.calibration.hbm_efficiency)
                                 + 4.0 * H100.calibration.kernel_overhead_s, rel=1e-12)
    assert costs.fp8_weight_cast_s(H, A, G, F, T, BF16) == 0.0
    # compute_s(m) = m c + (m - 1) acc + once-per-iteration terms: doubling the micro-batches
    # leaves the weight cast (12 layers per stage of gpt3-175b at pp 8, tp 8) counted once
    def compute(precision, gbs):
        rows = PLANS[:1].with_columns(precision=pl.lit(precision), global_batch_size=pl.lit(gbs))
        return evaluate_frame(rows)["compute_s"][0]
    once = {p: 2.0 * compute(p, 256) - compute(p, 512) for p in ("bf16", "fp8")}
    cast_175b = costs.fp8_weight_cast_s(12288.0, 96.0, 96.0, 49152.0, 8.0, FP8)
    assert once["fp8"] - once["bf16"] == pytest.approx(12 * cast_175b, rel=1e-6)


@pytest.mark.parametrize("seed", [3, 11])
def test_step_with_fp8_matches_twin(seed):
    rng = np.random.default_rng(seed)
    for _ in range(30):
        flash, sp = bool(rng.integers(0, 2)), bool(rng.integers(0, 2))
        hw = machine_vector(replace(H100, precision="fp8", use_flash_attn=flash, sequence_parallel=sp,
                                    async_tensor_model_parallel_allreduce=bool(rng.integers(0, 2)),
                                    tp_comm_overlap=sp and bool(rng.integers(0, 2)),
                                    vpp=int(rng.choice([1, 2]))))
        check_step_against_twin(rng, hw)


def test_fp8_is_refused_on_gpus_without_fp8_tensor_cores():
    assert not has_fp8(PRESETS["a100-sxm4-80gb"]) and not has_fp8(PRESETS["v100-sxm2-32gb"])
    assert all(has_fp8(PRESETS[g]) for g in ("h100-sxm-80gb", "h200-sxm-141gb", "b200-hgx-180gb", "mi300x-oam-192gb"))
    spec = ONE_POINT_SPEC.format(training='precision = "fp8"')
    with pytest.raises(InputError, match="a100-sxm4-80gb.*no FP8 tensor cores"):
        parse_spec(spec, "s.toml")
    with pytest.raises(InputError, match="v100-sxm2-32gb.*no FP8 tensor cores"):
        parse_spec(spec.replace("a100-sxm4-80gb", "v100-sxm2-32gb"), "s.toml")
    # with bf16 in the list, the A100's fp8 machines are left out and named in a note
    both = parse_spec(ONE_POINT_SPEC.format(training='precision = ["bf16", "fp8"]'), "s.toml")
    assert [g.precision for g in both.gpus] == ["bf16"]
    assert any("a100-sxm4-80gb has no FP8 tensor cores" in n for n in both.notes)
    with pytest.raises(InputError, match="row 2, column precision.*a100-sxm4-80gb"):
        evaluate_frame(PLANS[:1].with_columns(gpu=pl.lit("a100-sxm4-80gb"), precision=pl.lit("fp8")))


def test_spec_parsing_lists_the_allowed_values():
    with pytest.raises(InputError, match='"bf16", "fp8"'):
        parse_spec(ONE_POINT_SPEC.format(training='precision = "fp4"').replace("a100-sxm4-80gb", "h100-sxm-80gb"), "s.toml")
    assert parse_spec(ONE_POINT_SPEC.format(training='precision = "fp16"'), "s.toml").gpus[0].precision == "fp16"
    with pytest.raises(InputError, match="precision"):
        parse_spec(ONE_POINT_SPEC.format(training="precision = true"), "s.toml")


def test_sweep_axis_column_and_query(tmp_path):
    from vtrain_fast.analysis.query import pareto
    from vtrain_fast.engine.run import run_sweep
    spec = parse_spec(SMALL_SWEEP.format(training='precision = ["bf16", "fp8"]'), str(tmp_path / "fp8.toml"))
    assert spec.setting_axes == ("precision",)
    run_sweep(spec, tmp_path / "out")
    df = pl.read_parquet(tmp_path / "out" / "*.parquet")
    assert df.schema["precision"] in (pl.Categorical, pl.String, pl.Enum)
    assert set(df["precision"].cast(pl.String)) == {"bf16", "fp8"}
    ok = df.filter(pl.col("status") == "ok")
    key = ["tp", "pp", "dp", "micro_batch_size", "global_batch_size", "recompute", "num_gpus"]
    bf = ok.filter(pl.col("precision") == "bf16").sort(key)
    f8 = ok.filter(pl.col("precision") == "fp8").sort(key)
    joined = bf.join(f8, on=key, suffix="_fp8")
    assert joined.height > 0 and (joined["model_states_GiB_fp8"] > joined["model_states_GiB"]).all()
    front = pareto(tmp_path / "out", ["iteration_time_s"], where=["precision==fp8"])
    assert front.height > 0 and set(front["precision"].cast(pl.String)) == {"fp8"}


def test_evaluate_round_trip_keeps_the_precision_as_given():
    rows = PLANS[:1].with_columns(pl.Series("precision", ["fp16"]))
    rows = pl.concat([rows, PLANS[:1].with_columns(precision=pl.lit("bf16")),
                      PLANS[:1].with_columns(precision=pl.lit("fp8"))])
    # 16-bit gradients in all three (fp16's own; bf16 and fp8 without fp32 main gradients)
    rows = rows.with_columns(grad_reduce_in_bf16=pl.lit(True))
    out = evaluate_frame(rows)
    assert out["precision"].to_list() == ["fp16", "bf16", "fp8"]
    # fp16 costs bf16's iteration and its loss scaler's unscale (4 bytes per parameter more in the
    # optimizer step), and the skipped steps
    assert out["iteration_time_s"][1] < out["iteration_time_s"][0] < 1.01 * out["iteration_time_s"][1]
    assert out["iteration_time_s"][2] != out["iteration_time_s"][1]
    assert out["num_steps"][0] > out["num_steps"][1]
    again = evaluate_frame(out.select([c for c in rows.columns]))
    assert again["iteration_time_s"].to_list() == out["iteration_time_s"].to_list()
