"""FlashAttention (training setting use_flash_attn): fused attention core, no s x s activations."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import polars as pl
import pytest

import reference as ref
from conftest import ONE_POINT_SPEC
from vtrain_fast.io.errors import InputError
from vtrain_fast.analysis.evaluate import evaluate_frame
from vtrain_fast.hardware.gpus import PRESETS, machine_vector
from vtrain_fast.model import layout, records, step
from vtrain_fast.plan.spec import parse_spec

PLANS = pl.DataFrame({
    "num_layers": [32, 96, 40, 24], "hidden_size": [4096, 12288, 6144, 2048],
    "num_attention_heads": [32, 96, 48, 16], "num_query_groups": [8, 96, 48, 16],
    "seq_length": [8192, 2048, 4096, 1024],
    "global_batch_size": [256, 1536, 1024, 64], "micro_batch_size": [1, 1, 2, 4],
    "tp": [4, 8, 4, 1], "pp": [2, 8, 2, 1], "dp": [16, 8, 32, 8], "gpu": ["h100-sxm-80gb"] + ["a100-sxm4-80gb"] * 3,
    "recompute": ["none", "full", "none", "full"],
})


def test_flash_drops_the_quadratic_activations_and_nothing_else():
    off = evaluate_frame(PLANS)
    on = evaluate_frame(PLANS.with_columns(use_flash_attn=pl.lit("true")))
    assert (on["activations_GiB"] < off["activations_GiB"]).all()
    # without recomputation every layer kept its 5 a s^2 b / t bytes of softmax/dropout tensors
    # (7 when the softmax runs unfused in fp32: here s = 8192 > 4096, Megatron's fused limit)
    norc = PLANS["recompute"] == "none"
    rows = PLANS.filter(norc)
    a, s, b, t, p = (rows[c].cast(pl.Float64).to_numpy() for c in
                     ("num_attention_heads", "seq_length", "micro_batch_size", "tp", "pp"))
    per_element = np.array([5.0 if ref.softmax_fused(*x) else 7.0 for x in zip(b, s, a, t)])
    assert list(per_element) == [7.0, 5.0]
    layers = rows["num_layers"].to_numpy() / p
    in_flight = np.minimum(p, rows["global_batch_size"].to_numpy() / (rows["dp"].to_numpy() * b))
    s2_bytes = layers * in_flight * (per_element * a * s * s * b / t - 4.0 * b * a / t * s)
    saved = (off["activations_GiB"] - on["activations_GiB"]).filter(norc).to_numpy() * 2.0 ** 30
    np.testing.assert_allclose(saved, s2_bytes, rtol=1e-9)
    for col in ("tp_comm_s", "dp_comm_s", "optimizer_s", "model_states_GiB", "num_parameters"):
        assert (on[col] == off[col]).all(), col


def test_flash_is_faster_at_long_sequences():
    """At s >= 4096 the unfused path moves 9-11 bytes per score element through HBM forward
    and backward; the fused kernel moves none, so the layer is faster despite its lower
    FLOP efficiency."""
    long = PLANS.filter(pl.col("seq_length") >= 4096)
    off = evaluate_frame(long)
    on = evaluate_frame(long.with_columns(use_flash_attn=pl.lit("true")))
    assert (on["compute_s"] < off["compute_s"]).all()


def test_step_with_flash_matches_twin():
    hw = machine_vector(replace(PRESETS["a100-sxm4-80gb"], use_flash_attn=True))
    rng = np.random.default_rng(7)
    for _ in range(40):
        b = int(rng.choice([1, 2, 4]))
        t = int(rng.choice([1, 2, 4, 8]))
        p = int(rng.choice([1, 2, 4]))
        d = int(rng.choice([1, 2, 8]))
        cfg = (8 * p, 4096, 32, 8, 14336, 128256, int(rng.choice([2048, 8192])), d * b * 8, b, t, p, d,
               int(rng.integers(0, 2)), 1e12, hw)
        out = np.empty((records.NUM_OUTPUTS, 1))
        code = step.step(*[float(x) for x in cfg[:9]], layout.Layout(cfg[9], 1, cfg[11], cfg[10]), cfg[12], cfg[13], cfg[14], out, 0)
        r_code, r_out = ref.step(*cfg)
        assert code == r_code
        for k, name in enumerate(records.OUTPUT_NAMES):
            assert out[k, 0] == pytest.approx(r_out[name], rel=1e-12, nan_ok=True), name


def test_use_flash_attn_is_refused_for_gpus_without_kernels():
    v100 = ONE_POINT_SPEC.format(training="use_flash_attn = true").replace("a100-sxm4-80gb", "v100-sxm2-32gb")
    with pytest.raises(InputError, match="v100-sxm2-32gb.*no FlashAttention kernel"):
        parse_spec(v100, "s.toml")
    with pytest.raises(InputError, match="row 2, column use_flash_attn"):
        evaluate_frame(PLANS.head(1).with_columns(gpu=pl.lit("v100-sxm2-32gb"), use_flash_attn=pl.lit("true")))


def test_flash_kernel_flop_conventions():
    """Compute-bound case with every SM busy: forward = causal 2 b s^2 h / t FLOPs at
    peak x flash_attention_efficiency (+ one launch), backward = 2.5x (+ three launches)."""
    from vtrain_fast.model import ops
    preset = PRESETS["a100-sxm4-80gb"]
    hw = machine_vector(replace(preset, use_flash_attn=True))
    b, s, h, a, g, t = 4, 8192, 8192, 64, 8, 2
    rate = preset.peak_tflops * 1e12 * preset.calibration.flash_attention_efficiency
    gap = preset.calibration.kernel_overhead_s
    fwd = ops.flash_attention_forward_s(b, s, h, a, g, t, hw)
    bwd = ops.flash_attention_backward_s(b, s, h, a, g, t, hw)
    assert fwd == pytest.approx(2.0 * b * s * s * h / t / rate + gap, rel=1e-12)
    assert bwd - 3 * gap == pytest.approx(2.5 * (fwd - gap), rel=1e-12)
    # few thread blocks (one sequence, 4 heads, 8 row tiles = 32 < 108 SMs): a quarter of the rate
    small = ops.flash_attention_forward_s(1, 1024, 4096, 32, 8, 8, hw) - gap
    assert small == pytest.approx(2.0 * 1024 * 1024 * 4096 / 8 / rate * 108 / 32, rel=1e-12)


def test_evaluate_keeps_flash_and_unfused_rows_apart():
    both = PLANS.head(2).with_columns(gpu=pl.lit("a100-sxm4-80gb"))
    mixed = evaluate_frame(pl.concat([both.head(1).with_columns(use_flash_attn=pl.lit("true")),
                                      both.head(1).with_columns(use_flash_attn=pl.lit("false"))]))
    alone_on = evaluate_frame(both.head(1).with_columns(use_flash_attn=pl.lit("true")))
    alone_off = evaluate_frame(both.head(1))
    assert mixed["iteration_time_s"][0] == alone_on["iteration_time_s"][0]
    assert mixed["iteration_time_s"][1] == alone_off["iteration_time_s"][0]
    assert mixed["iteration_time_s"][0] != mixed["iteration_time_s"][1]


def test_calibrate_fits_flash_attention_efficiency():
    """Flash rows made by the model with a known efficiency are fitted back (the fit's lower
    bound stays above 0, which would switch FlashAttention off)."""
    from vtrain_fast.analysis.calibrate import fit
    truth = replace(PRESETS["a100-sxm4-80gb"].calibration, flash_attention_efficiency=0.4)
    rows = pl.concat([PLANS.with_columns(gpu=pl.lit("a100-sxm4-80gb"), micro_batch_size=pl.lit(m))
                      for m in (1, 2)]).with_columns(use_flash_attn=pl.lit("true"))
    measured = evaluate_frame(rows, "synthetic", {"a100-sxm4-80gb": truth})
    rows = rows.with_columns(measured_iteration_time_s=measured["iteration_time_s"]).filter(
        measured["status"] != "bad_batch")
    cal, report = fit(rows, "a100-sxm4-80gb", ["flash_attention_efficiency"],
                      base=replace(truth, flash_attention_efficiency=0.7))
    assert cal.flash_attention_efficiency == pytest.approx(0.4, rel=1e-3)
