"""The precision axis (issue 16): bf16 | fp8 | fp16 | fp32 | tf32 as one setting. fp32 GEMMs at the
FP32 peak and tf32 ones at the TF32 peak (the time ratio of a GEMM-bound plan is the peak ratio),
4-byte weights, activations, gradients and communication under fp32 / tf32, no master copy, fp16's
loss-scaling cost (the unscale and the skipped steps), FlashAttention and context parallelism need
16-bit tensors, and a GPU without the precision's peak is refused."""
from __future__ import annotations

from dataclasses import replace

import polars as pl
import pytest

from vtrain_fast.analysis.evaluate import evaluate_frame
from vtrain_fast.hardware.gpus import PRESETS, machine_vector
from vtrain_fast.io.errors import InputError
from vtrain_fast.model import ops, pipeline
from vtrain_fast.model.settings import BY_NAME
from vtrain_fast.plan.spec import parse_spec

from conftest import ONE_POINT_SPEC, SMALL_SWEEP

GiB = 1024.0 ** 3
# an A100 with stated FP32 and TF32 peaks (NVIDIA A100 datasheet: 19.5 FP32, 156 TF32, 312 bf16),
# so that the tests do not depend on a preset file's numbers
A100 = replace(PRESETS["a100-sxm4-80gb"], name="a100-test", peak_fp32_tflops=19.5, peak_tf32_tflops=156.0)
GPUS = {"a100-test": A100}
PLAN = dict(model="gpt3-2.7b", gpu="a100-test", global_batch_size=64, micro_batch_size=4, tp=1, pp=1, dp=8,
            recompute="full", num_tokens=1e9)


def _rows(*variants, base=PLAN):
    return evaluate_frame(pl.DataFrame([{**base, **v} for v in variants]), "x", gpus=GPUS).rows(named=True)


def _hw(**settings):
    return machine_vector(replace(A100, **settings))


def test_precision_is_one_choice_setting_with_the_megatron_flags():
    st = BY_NAME["precision"]
    assert st.choices == ("bf16", "fp8", "fp16", "fp32", "tf32") and st.default == "bf16"
    assert st.megatron == "--fp8-format" and "--bf16" in st.doc and "--fp16" in st.doc
    # FlashAttention has no effect without 16-bit tensors; the FP8 settings none outside fp8
    assert BY_NAME["use_flash_attn"].has_no_effect({"tp": False, "pp": False, "dp": False, "cp": False},
                                                   {"precision": "fp32"})
    for p in ("bf16", "fp16", "fp32", "tf32"):
        assert BY_NAME["fp8_recipe"].has_no_effect({k: False for k in ("tp", "pp", "dp", "cp")}, {"precision": p})


def test_a_gemm_bound_gemm_runs_at_the_precision_peak():
    m = n = k = 8192.0
    over = A100.calibration.kernel_overhead_s
    bf16, fp32, tf32 = (ops.gemm_time_s(m, n, k, 1.0, _hw(precision=p)) - over for p in ("bf16", "fp32", "tf32"))
    assert fp32 / bf16 == pytest.approx(312.0 / 19.5, rel=1e-12)
    assert tf32 / bf16 == pytest.approx(312.0 / 156.0, rel=1e-12)
    assert ops.gemm_peak_flops(_hw(precision="fp16")) == ops.gemm_peak_flops(_hw(precision="bf16")) == 312e12
    # and the bytes of a memory-bound GEMM double (4-byte operands)
    small = (ops.gemm_time_s(64.0, 64.0, 8192.0, 1.0, _hw(precision="tf32")) - over,
             ops.gemm_time_s(64.0, 64.0, 8192.0, 1.0, _hw(precision="bf16")) - over)
    assert small[0] == pytest.approx(2.0 * small[1], rel=1e-12)


def test_fp32_is_slower_than_bf16_by_the_peak_ratio_where_gemm_bound():
    # a GEMM-bound plan (hidden 8192, 512-token sequences, 16 per micro-batch: the layer norms,
    # softmax and other memory-bound kernels, which only double, are a few % of the time): fp32's
    # compute approaches the 16x peak ratio, tf32's the 2x
    wide = dict(num_layers=2, hidden_size=8192, num_attention_heads=64, ffn_hidden_size=32768, vocab_size=51200,
                seq_length=512, gpu="a100-test", global_batch_size=64, micro_batch_size=16, tp=1, pp=1, dp=1,
                recompute="none", num_tokens=1e9)
    bf16, fp32, tf32 = _rows({}, {"precision": "fp32"}, {"precision": "tf32"}, base=wide)
    assert bf16["status"] == fp32["status"] == "ok"
    r32 = fp32["compute_s"] / bf16["compute_s"]
    rtf = tf32["compute_s"] / bf16["compute_s"]
    assert 0.9 * 16.0 < r32 <= 16.0
    assert 0.95 * 2.0 < rtf <= 2.0
    assert fp32["iteration_time_s"] > tf32["iteration_time_s"] > bf16["iteration_time_s"]
    # MFU is against the bf16 peak whatever the precision: fp32 shows the mixed-precision gain
    assert fp32["mfu"] == pytest.approx(bf16["mfu"] * bf16["iteration_time_s"] / fp32["iteration_time_s"], rel=1e-9)
    # a plan with long sequences and no FlashAttention is far from GEMM-bound: less than the ratio
    b27, f27 = _rows({}, {"precision": "fp32"})
    assert 2.0 < f27["compute_s"] / b27["compute_s"] < 0.8 * 16.0


def test_fp32_memory_is_four_byte_weights_gradients_and_activations_without_a_master_copy():
    base = {**PLAN, "dp": 1, "global_batch_size": 4, "recompute": "none"}
    bf16, fp32 = _rows({}, {"precision": "fp32"}, base=base)
    n = bf16["num_parameters"]
    # bf16: 2 + 4 + 12 (fp32 main gradient); fp32: 4 + 4 + 8 (no master weight: the weights are fp32)
    assert bf16["model_states_GiB"] == pytest.approx(18.0 * n / GiB, rel=1e-3)
    assert fp32["model_states_GiB"] == pytest.approx(16.0 / 18.0 * bf16["model_states_GiB"], rel=1e-12)
    # sharded over 8 ranks (ZeRO-1): 6 + 12 / 8 against 8 + 8 / 8
    z1 = {**PLAN, "dp": 8, "global_batch_size": 32, "zero_stage": 1}
    b1, f1 = _rows({}, {"precision": "fp32"}, base=z1)
    assert b1["model_states_GiB"] == pytest.approx(n * (6.0 + 12.0 / 8) / GiB, rel=1e-3)
    assert f1["model_states_GiB"] == pytest.approx(n * (8.0 + 8.0 / 8) / GiB, rel=1e-3)
    # activations: every element doubles but the 1-byte dropout masks: (4 e + 2) sbh + ... with e = 4
    assert 1.8 < fp32["activations_GiB"] / bf16["activations_GiB"] < 2.0


def test_the_activation_formula_by_hand():
    from vtrain_fast.model.memory import layer_activation_bytes
    b, s, h, a = 1.0, 2048.0, 4096.0, 32.0
    sixteen = layer_activation_bytes(b, s, h, a, a, 4 * h, 1.0, 0.0, 0.0)
    thirty_two = layer_activation_bytes(b, s, h, a, a, 4 * h, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 4.0)
    # Korthikanti Sec. 4.1: sbh (34 + 5 a s / h) at 2 bytes; at 4 bytes (34 - 2 masks) x 2 + 2 = 66,
    # and the scores' 5 (softmax 2, mask 1, dropout 2) become 4 + 1 + 4 = 9
    assert sixteen == pytest.approx(s * b * h * (34.0 + 5.0 * a * s / h))
    assert thirty_two == pytest.approx(s * b * h * (66.0 + 9.0 * a * s / h))


def test_communication_moves_four_byte_elements_under_fp32():
    # DDP over 8 ranks: the gradient all-reduce carries fp32 gradients, twice the bytes of 16-bit ones
    bf16, fp32, main = _rows({"grad_reduce_in_bf16": True}, {"precision": "fp32", "grad_reduce_in_bf16": False},
                             {"grad_reduce_in_bf16": False})
    # (the fixed latencies of the collectives stay: at most twice, at least nearly so for big buffers)
    assert 1.9 * bf16["dp_comm_s"] < fp32["dp_comm_s"] <= 2.0 * bf16["dp_comm_s"]
    # bf16 with its fp32 main gradients (Megatron-LM's default) reduces the same fp32 bytes
    assert main["dp_comm_s"] == fp32["dp_comm_s"]
    tp = {**PLAN, "tp": 8, "dp": 1, "global_batch_size": 8}
    b8, f8 = _rows({}, {"precision": "fp32"}, base=tp)
    assert 1.6 * b8["tp_comm_s"] < f8["tp_comm_s"] <= 2.0 * b8["tp_comm_s"]


def test_fp16_pays_the_unscale_and_the_skipped_steps():
    bf16, fp16 = _rows({"grad_reduce_in_bf16": True}, {"precision": "fp16", "grad_reduce_in_bf16": True})  # 16-bit gradients
    updates = bf16["num_steps"]
    skipped = pipeline.FP16_INITIAL_SKIPPED_STEPS + -(-pipeline.FP16_SKIPPED_PER_WINDOW * updates // pipeline.FP16_LOSS_SCALE_WINDOW)
    assert fp16["num_steps"] == updates + skipped
    assert fp16["train_days"] == pytest.approx(fp16["iteration_time_s"] * fp16["num_steps"] / 86400.0, rel=1e-9)
    # the step rewrites the unscaled main grads: 4 bytes more per parameter than bf16's 48
    n_rank = bf16["num_parameters"]
    hbm = A100.hbm_GBps * 1e9 * A100.calibration.hbm_efficiency
    assert fp16["optimizer_s"] - bf16["optimizer_s"] == pytest.approx(4.0 * n_rank / hbm, rel=1e-3)
    assert fp16["memory_per_gpu_GiB"] == bf16["memory_per_gpu_GiB"]
    # the other precisions skip nothing
    assert bf16["num_steps"] == -(-1e9 // (64 * 2048))


def test_flash_attention_has_no_effect_and_context_parallelism_is_refused_under_fp32():
    base = {**PLAN, "recompute": "none", "global_batch_size": 8, "micro_batch_size": 1}
    plain, flash = _rows({"precision": "fp32"}, {"precision": "fp32", "use_flash_attn": True}, base=base)
    assert plain["iteration_time_s"] == flash["iteration_time_s"]
    assert plain["memory_per_gpu_GiB"] == flash["memory_per_gpu_GiB"]
    b16, f16 = _rows({}, {"use_flash_attn": True}, base=base)
    assert f16["memory_per_gpu_GiB"] < b16["memory_per_gpu_GiB"]
    cp = {**base, "cp": 2, "dp": 4, "use_flash_attn": True}
    ok, refused = _rows({}, {"precision": "fp32"}, base=cp)
    assert ok["status"] == "ok" and refused["status"] == "refused"


def test_a_gpu_without_the_precision_peak_is_refused_or_left_out_of_a_sweep():
    with pytest.raises(InputError, match="tf32.*v100-sxm2-32gb.*no TF32"):
        evaluate_frame(pl.DataFrame([{**PLAN, "gpu": "v100-sxm2-32gb", "precision": "tf32"}]), "x")
    no_fp32 = replace(A100, name="nofp32", peak_fp32_tflops=0.0)
    with pytest.raises(InputError, match="peak_fp32_tflops"):
        evaluate_frame(pl.DataFrame([{**PLAN, "gpu": "nofp32", "precision": "fp32"}]), "x", gpus={"nofp32": no_fp32})
    spec = ONE_POINT_SPEC.format(training='precision = ["fp16", "tf32"]').replace("a100-sxm4-80gb", "v100-sxm2-32gb")
    parsed = parse_spec(spec, "s.toml")
    assert [g.precision for g in parsed.gpus] == ["fp16"]
    assert any("v100-sxm2-32gb has no TF32 tensor cores" in n for n in parsed.notes)


def test_a_precision_sweep_reads_off_the_gain_of_mixed_precision(tmp_path):
    from vtrain_fast.engine.run import run_sweep
    spec = tmp_path / "s.toml"
    spec.write_text(SMALL_SWEEP.format(training='precision = ["fp32", "tf32", "bf16"]'))
    run_sweep(parse_spec(spec.read_text(), str(spec)), tmp_path / "out")
    from vtrain_fast.analysis.query import scan_results
    df = scan_results(tmp_path / "out").filter(pl.col("status") == "ok").collect()
    best = df.group_by("precision").agg(pl.col("iteration_time_s").min()).sort("iteration_time_s")
    assert best["precision"].cast(pl.String).to_list() == ["bf16", "tf32", "fp32"]
