"""FP8 recipes (training setting fp8_recipe, Megatron-LM --fp8-recipe): delayed scaling (the default,
priced as before), tensorwise current scaling (an amax pass before each cast) and MXFP8 block
scaling (E8M0 scales, Blackwell only); no effect at precision = bf16."""
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
from vtrain_fast.model.arch import DEFAULT_ARCH
from vtrain_fast.model.records import FP8_MXFP8, FP8_TENSORWISE, HW_FIELDS
from vtrain_fast.model.settings import NOT_FP8, BY_NAME, rules_markdown
from vtrain_fast.plan.spec import has_mxfp8, parse_spec

H100 = PRESETS["h100-sxm-80gb"]
B200 = PRESETS["b200-hgx-180gb"]
BLACKWELL = ("b200-hgx-180gb", "b300-hgx-270gb", "gb200-nvl72-186gb", "gb300-nvl72-279gb")
# GPT-3 175B-like layer, one micro-batch of 2048 tokens, tp 4
B, S, H, A, G, F, T = 1.0, 2048.0, 12288.0, 96.0, 96.0, 49152.0, 4.0


def _hw(preset, recipe, **kw):
    return machine_vector(replace(preset, precision="fp8", fp8_recipe=recipe, **kw))


def test_fp8_recipe_is_a_registry_choice_inert_at_bf16():
    st = BY_NAME["fp8_recipe"]
    assert st.kind is str and st.default == "delayed" and st.choices == ("delayed", "tensorwise", "mxfp8")
    assert st.megatron == "--fp8-recipe" and st.inert_with == NOT_FP8
    assert st.encode("tensorwise") == FP8_TENSORWISE == 1.0 and st.encode("mxfp8") == FP8_MXFP8 == 2.0
    assert _hw(H100, "tensorwise")[HW_FIELDS.index("fp8_recipe")] == 1.0
    assert "`fp8_recipe` [delayed | tensorwise | mxfp8] (--fp8-recipe): no effect with precision = bf16" in rules_markdown()
    sizes = {k: False for k in ("tp", "pp", "dp", "cp")}
    assert st.has_no_effect(sizes, {"precision": "bf16"}) and not st.has_no_effect(sizes, {"precision": "fp8"})


def test_default_recipe_prices_as_before():
    # delayed is the default: the same machine vector, the same cast costs as the delayed formulas
    assert np.array_equal(machine_vector(replace(H100, precision="fp8")), _hw(H100, "delayed"))
    fp8 = _hw(H100, "delayed")
    assert ops.fp8_quantize_cost(fp8) == (ops.FP8_CAST_TRANSPOSE_BYTES, 1.0) == (4.0, 1.0)
    elems = B * S * (2 * H + H / T + F / T)
    assert ops.fp8_cast_forward(B, S, H, F, T, fp8) == (4.0 * elems, 4.0)


def test_tensorwise_is_slower_than_delayed_by_exactly_the_amax_pass():
    delayed, tensorwise = _hw(H100, "delayed"), _hw(H100, "tensorwise")
    # quantization: 2 more bytes per element (the amax read) and 2 more kernels per cast
    fwd_elems = B * S * (2 * H + H / T + F / T)
    bwd_elems = B * S * ((H + 2 * H * G / A) / T + H + F / T + H)
    assert ops.fp8_cast_forward(B, S, H, F, T, tensorwise) == (6.0 * fwd_elems, 12.0)
    assert ops.fp8_cast_backward(B, S, H, A, G, F, T, tensorwise) == (6.0 * bwd_elems, 12.0)
    # a layer's forward: the extra time is the amax pass's bytes at achievable HBM bandwidth plus
    # its 8 kernels' overhead (GPU-bound here: host launches do not bind)
    no_host = replace(H100, calibration=replace(H100.calibration, host_launch_s=0.0))
    d, tw = _hw(no_host, "delayed"), _hw(no_host, "tensorwise")
    amax_s = ops.memory_bound_time_s(2.0 * fwd_elems, 8.0, d)
    extra = ops.layer_forward_s(B, S, H, A, G, F, T, tw) - ops.layer_forward_s(B, S, H, A, G, F, T, d)
    assert extra == pytest.approx(amax_s, rel=1e-9)
    extra_bwd = ops.layer_backward_s(B, S, H, A, G, F, T, tw) - ops.layer_backward_s(B, S, H, A, G, F, T, d)
    assert extra_bwd == pytest.approx(ops.memory_bound_time_s(2.0 * bwd_elems, 8.0, d), rel=1e-9)
    # the weights' cast once per iteration: 6 bytes per weight and 12 kernels instead of 4 and 4
    w = memory.linear_weights_per_rank(H, A, G, F, T)
    assert costs.fp8_weight_cast_s(H, A, G, F, T, tw) == ops.memory_bound_time_s(6.0 * w, 12.0, tw)
    assert costs.fp8_weight_cast_s(H, A, G, F, T, d) == ops.memory_bound_time_s(4.0 * w, 4.0, d)
    # GEMMs and memory are the delayed ones
    assert ops.linear_gemm_time_s(4096.0, 4096.0, 4096.0, tw) == ops.linear_gemm_time_s(4096.0, 4096.0, 4096.0, d)
    assert memory.fp8_weight_copy_bytes(H, A, G, F, T, 1.0) == 2.0 * w
    assert ops.layer_forward_s(B, S, H, A, G, F, T, tensorwise) > ops.layer_forward_s(B, S, H, A, G, F, T, delayed)


def test_mxfp8_scales_cost_their_sourced_bytes():
    delayed, mx = _hw(B200, "delayed"), _hw(B200, "mxfp8")
    # casts: rowwise + columnwise FP8 copies, each with one E8M0 byte per 32 elements; no amax pass
    assert ops.fp8_quantize_cost(mx) == (4.0 + 2.0 / 32.0, 1.0)
    # GEMMs: the same FP8 peak and efficiency (compute bound: same time); operands carry their scales
    big = 8192.0
    assert ops.linear_gemm_time_s(big, big, big, mx) == ops.linear_gemm_time_s(big, big, big, delayed)
    no_peak = mx.copy()
    no_peak[HW_FIELDS.index("peak_fp8_flops")] *= 1e6          # memory bound: the bytes show
    no_peak_d = delayed.copy()
    no_peak_d[HW_FIELDS.index("peak_fp8_flops")] *= 1e6
    m, n, k = 4096.0, 4096.0, 4096.0
    bw = B200.hbm_GBps * 1e9 * B200.calibration.hbm_efficiency
    extra = ops.fp8_gemm_time_s(m, n, k, no_peak) - ops.fp8_gemm_time_s(m, n, k, no_peak_d)
    assert extra == pytest.approx((m * k + k * n) / 32.0 / bw, rel=1e-9)
    # memory: weight copies 2 + 2/32 bytes per linear weight; saved FP8 inputs keep 1/32 byte scales
    w = memory.linear_weights_per_rank(H, A, G, F, T)
    assert memory.fp8_weight_copy_bytes(H, A, G, F, T, 1.0, 0.0, 1.0) == pytest.approx((2.0 + 2.0 / 32.0) * w)
    saved_d = memory.fp8_activation_saving_bytes(B, S, H, F, T, 1.0, 1.0, 1.0)
    saved_mx = memory.fp8_activation_saving_bytes(B, S, H, F, T, 1.0, 1.0, 1.0, 1.0)
    assert saved_d - saved_mx == pytest.approx(saved_d / 32.0)
    # micro_batch_costs carries them (one layer's FP8 weight bytes, activation bytes)
    args = (B, S, H, A, G, F, 51200.0, T)
    cd = costs.micro_batch_costs(*args, delayed, DEFAULT_ARCH)
    cm = costs.micro_batch_costs(*args, mx, DEFAULT_ARCH)
    assert cm.fp8_weight_bytes - cd.fp8_weight_bytes == pytest.approx(2.0 / 32.0 * w)
    assert cm.fp8_weight_cast_s > cd.fp8_weight_cast_s


def test_mxfp8_memory_vs_delayed_in_evaluate():
    plan = pl.DataFrame({"model": ["gpt3-13b"], "gpu": ["b200-hgx-180gb"], "tp": [2], "pp": [1], "dp": [8],
                         "micro_batch_size": [2], "global_batch_size": [256], "recompute": ["none"],
                         "use_flash_attn": ["true"], "sequence_parallel": ["true"], "precision": ["fp8"]})
    d = evaluate_frame(plan.with_columns(fp8_recipe=pl.lit("delayed")))
    mx = evaluate_frame(plan.with_columns(fp8_recipe=pl.lit("mxfp8")))
    tw = evaluate_frame(plan.with_columns(fp8_recipe=pl.lit("tensorwise")))
    assert mx["fp8_recipe"].to_list() == ["mxfp8"]
    # gpt3-13b: 40 layers of h 5120, ffn 20480, tp 2: 2/32 byte more per linear weight of each layer
    w = memory.linear_weights_per_rank(5120.0, 40.0, 40.0, 20480.0, 2.0)
    extra_states = (mx["model_states_GiB"][0] - d["model_states_GiB"][0]) * 2 ** 30
    assert extra_states == pytest.approx(40 * w * 2.0 / 32.0, rel=1e-9)
    assert mx["activations_GiB"][0] > d["activations_GiB"][0]
    assert tw["model_states_GiB"][0] == d["model_states_GiB"][0]
    assert tw["iteration_time_s"][0] > d["iteration_time_s"][0]


@pytest.mark.parametrize("seed", [5, 17])
def test_step_with_each_recipe_matches_twin(seed):
    rng = np.random.default_rng(seed)
    for _ in range(24):
        flash, sp = bool(rng.integers(0, 2)), bool(rng.integers(0, 2))
        recipe = str(rng.choice(["delayed", "tensorwise", "mxfp8"]))
        hw = machine_vector(replace(B200, precision=str(rng.choice(["fp8", "fp8", "bf16"])), fp8_recipe=recipe,
                                    use_flash_attn=flash, sequence_parallel=sp, vpp=int(rng.choice([1, 2])),
                                    zero_stage=int(rng.choice([0, 1, 3]))))
        check_step_against_twin(rng, hw, recipe)


def test_mxfp8_needs_a_blackwell_gpu():
    assert all(has_mxfp8(PRESETS[g]) for g in BLACKWELL)
    assert not any(has_mxfp8(PRESETS[g]) for g in ("h100-sxm-80gb", "h200-sxm-141gb", "mi300x-oam-192gb",
                                                    "a100-sxm4-80gb"))
    h100 = ONE_POINT_SPEC.replace("a100-sxm4-80gb", "h100-sxm-80gb")
    with pytest.raises(InputError, match="training.fp8_recipe.*h100-sxm-80gb.*no MXFP8 tensor cores"):
        parse_spec(h100.format(training='precision = "fp8"\nfp8_recipe = "mxfp8"'), "s.toml")
    # at bf16 the recipe has no effect: accepted
    assert parse_spec(h100.format(training='fp8_recipe = "mxfp8"'), "s.toml").gpus[0].precision == "bf16"
    # with another recipe in the list, the H100's mxfp8 machines are left out with a note
    both = parse_spec(h100.format(training='precision = "fp8"\nfp8_recipe = ["delayed", "mxfp8"]'), "s.toml")
    assert [g.fp8_recipe for g in both.gpus] == ["delayed"]
    assert any("h100-sxm-80gb has no MXFP8 tensor cores" in n for n in both.notes)
    # on a B200 both recipes run
    b200 = ONE_POINT_SPEC.replace("a100-sxm4-80gb", "b200-hgx-180gb")
    ok = parse_spec(b200.format(training='precision = "fp8"\nfp8_recipe = ["delayed", "mxfp8"]'), "s.toml")
    assert [g.fp8_recipe for g in ok.gpus] == ["delayed", "mxfp8"]
    row = pl.DataFrame({"model": ["gpt3-1.3b"], "gpu": ["h100-sxm-80gb"], "tp": [1], "pp": [1], "dp": [8],
                        "micro_batch_size": [1], "global_batch_size": [64], "recompute": ["none"],
                        "precision": ["fp8"], "fp8_recipe": ["mxfp8"]})
    with pytest.raises(InputError, match="row 2, column fp8_recipe.*h100-sxm-80gb"):
        evaluate_frame(row)
    assert evaluate_frame(row.with_columns(gpu=pl.lit("b200-hgx-180gb")))["status"][0] == "ok"
    with pytest.raises(InputError, match='"delayed", "tensorwise", "mxfp8"'):
        parse_spec(b200.format(training='precision = "fp8"\nfp8_recipe = "blockwise"'), "s.toml")


def test_sweep_over_recipes_repeats_at_bf16(tmp_path):
    from vtrain_fast.engine.run import run_sweep
    text = SMALL_SWEEP.replace("h100-sxm-80gb", "b200-hgx-180gb")
    spec = parse_spec(text.format(training='precision = ["bf16", "fp8"]\nfp8_recipe = ["delayed", "tensorwise", "mxfp8"]'),
                      str(tmp_path / "r.toml"))
    # the bf16 machines with the other two recipes price every plan like bf16 + delayed: left out
    assert [(g.precision, g.fp8_recipe) for g in spec.gpus] == [
        ("bf16", "delayed"), ("fp8", "delayed"), ("fp8", "tensorwise"), ("fp8", "mxfp8")]
    assert any("left out because they price every plan like an earlier one" in n for n in spec.notes)
    run_sweep(spec, tmp_path / "out")
    df = pl.read_parquet(tmp_path / "out" / "*.parquet")
    ok = df.filter(pl.col("status") == "ok")
    key = ["tp", "pp", "dp", "micro_batch_size", "global_batch_size", "recompute", "num_gpus"]
    by = {r: ok.filter((pl.col("precision") == "fp8") & (pl.col("fp8_recipe") == r)).sort(key)
          for r in ("delayed", "tensorwise", "mxfp8")}
    assert by["delayed"].height > 0 and by["delayed"][key].equals(by["tensorwise"][key])
    assert (by["tensorwise"]["iteration_time_s"] > by["delayed"]["iteration_time_s"]).all()
    assert (by["mxfp8"]["model_states_GiB"] > by["delayed"]["model_states_GiB"]).all()
