"""Selective activation recomputation (Korthikanti et al. 2022, Sec. 5; Megatron-LM
``--recompute-granularity selective``): memory from the paper's Table 2, time between no and
full recomputation, hardware FLOPs counting the rerun attention core."""
from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from conftest import ONE_POINT_SPEC
from vtrain_fast.analysis.evaluate import evaluate_frame
from vtrain_fast.model import records
from vtrain_fast.plan.spec import RECOMPUTE_VALUES

GiB = 2.0 ** 30

# GPT layers (g = a, f = 4h) so that Table 2's sbh(10 + 24/t) applies; pp = 1 keeps one
# micro-batch of activations in flight; every plan uses the fused softmax (b x heads per rank % 4 == 0)
PLANS = pl.DataFrame({
    "num_layers": [24, 40, 8], "hidden_size": [2048, 6144, 4096], "num_attention_heads": [16, 48, 32],
    "seq_length": [2048, 2048, 4096], "global_batch_size": [64, 256, 32], "micro_batch_size": [2, 2, 1],
    "tp": [2, 8, 4], "pp": [1, 1, 1], "dp": [8, 4, 2], "gpu": ["a100-sxm4-80gb", "h100-sxm-80gb", "a100-sxm4-80gb"],
})


def run(recompute, **extra):
    return evaluate_frame(PLANS.with_columns(recompute=pl.lit(recompute), **{k: pl.lit(v) for k, v in extra.items()}))


def test_codes_match_the_spec_names():
    assert RECOMPUTE_VALUES[records.RECOMPUTE_NONE] == "none"
    assert RECOMPUTE_VALUES[records.RECOMPUTE_FULL] == "full"
    assert RECOMPUTE_VALUES[records.RECOMPUTE_SELECTIVE] == "selective"


def test_selective_memory_is_korthikanti_table_2():
    none, sel = run("none"), run("selective")
    L, h, s, b, t = (PLANS[c].cast(pl.Float64).to_numpy() for c in
                     ("num_layers", "hidden_size", "seq_length", "micro_batch_size", "tp"))
    a = PLANS["num_attention_heads"].cast(pl.Float64).to_numpy()
    core = 5.0 * a * s * s * b / t                          # softmax out 2 (fused) + mask 1 + dropout out 2
    saved = (none["activations_GiB"] - sel["activations_GiB"]).to_numpy() * GiB
    # every layer drops its attention core; backward rebuilds one layer's core at a time
    np.testing.assert_allclose(saved, (L - 1.0) * core, rtol=1e-9)
    # what one layer keeps under selective recomputation is Table 2's sbh(10 + 24/t)
    from vtrain_fast.model import memory
    for bi, si, hi, ai, ti in zip(b, s, h, a, t):
        kept = (memory.layer_activation_bytes(bi, si, hi, ai, ai, 4.0 * hi, ti, 0.0, 0.0)
                - memory.attention_core_activation_bytes(bi, si, ai, ti, 0.0))
        assert kept == pytest.approx(si * bi * hi * (10.0 + 24.0 / ti), rel=1e-12)
        kept_sp = (memory.layer_activation_bytes(bi, si, hi, ai, ai, 4.0 * hi, ti, 0.0, 1.0)
                   - memory.attention_core_activation_bytes(bi, si, ai, ti, 0.0))
        assert kept_sp == pytest.approx(si * bi * hi * 34.0 / ti, rel=1e-12)       # with SP
    assert (sel["model_states_GiB"] == none["model_states_GiB"]).all()


def test_selective_time_lies_between_none_and_full_and_adds_no_communication():
    none, sel, full = run("none"), run("selective"), run("full")
    assert (none["iteration_time_s"] < sel["iteration_time_s"]).all()
    assert (sel["iteration_time_s"] < full["iteration_time_s"]).all()
    for col in ("tp_comm_s", "pp_comm_s", "dp_comm_s", "optimizer_s"):
        assert (sel[col] == none[col]).all(), col
    assert (full["tp_comm_s"] > none["tp_comm_s"]).all()     # full reruns the TP all-reduces


def test_selective_hardware_flops_count_the_rerun_attention():
    none, sel = run("none"), run("selective")
    L, h, s, B = (PLANS[c].cast(pl.Float64).to_numpy() for c in
                  ("num_layers", "hidden_size", "seq_length", "global_batch_size"))
    n = (PLANS["tp"] * PLANS["pp"] * PLANS["dp"]).cast(pl.Float64).to_numpy()
    peak = np.array([312e12, 989.4e12, 312e12])
    extra = (sel["hfu"] - sel["mfu"]).to_numpy() * sel["iteration_time_s"].to_numpy() * n * peak
    np.testing.assert_allclose(extra, B * s * L * 4.0 * s * h, rtol=1e-9)
    assert (none["hfu"] == none["mfu"]).all()


def test_selective_with_flash_attention_reruns_the_fused_kernel_only():
    sel = run("selective", use_flash_attn="true")
    none = run("none", use_flash_attn="true")
    # FlashAttention keeps no s^2 tensors: selective saves only the log-sum-exp rows
    L, s, b, t = (PLANS[c].cast(pl.Float64).to_numpy() for c in ("num_layers", "seq_length", "micro_batch_size", "tp"))
    a = PLANS["num_attention_heads"].cast(pl.Float64).to_numpy()
    saved = (none["activations_GiB"] - sel["activations_GiB"]).to_numpy() * GiB
    np.testing.assert_allclose(saved, (L - 1.0) * 4.0 * b * a / t * s, rtol=1e-9)
    assert (sel["iteration_time_s"] > none["iteration_time_s"]).all()




def test_spec_and_evaluate_accept_selective_and_name_it_when_refusing():
    from vtrain_fast.io.errors import InputError
    from vtrain_fast.plan.spec import parse_spec
    spec = parse_spec(ONE_POINT_SPEC.format(training='recompute = ["none", "selective", "full"]'), "spec.toml")
    assert spec.recompute == ("none", "selective", "full")
    assert run("selective")["recompute"].to_list() == ["selective"] * 3
    with pytest.raises(InputError, match="selective"):
        parse_spec(ONE_POINT_SPEC.format(training='recompute = ["partial"]'), "spec.toml")
    with pytest.raises(InputError, match="selective"):
        run("partial")


def test_selective_with_overlapped_gradient_reduction_widens_the_window_by_the_rerun_core():
    """The DP all-reduce hides behind the last micro-batch's backward, which with selective
    recomputation includes the rerun attention cores: the exposed part shrinks by exactly
    layers x core time while the all-reduce is longer than the window."""
    from vtrain_fast.hardware.gpus import PRESETS, machine_vector
    from vtrain_fast.model import ops
    plan = pl.DataFrame([dict(num_layers=4, hidden_size=8192, num_attention_heads=64, seq_length=1024,
                              global_batch_size=64, micro_batch_size=1, tp=1, pp=1, dp=64,
                              gpu="a100-sxm4-80gb", overlap_grad_reduce="true", recompute=r)
                         for r in ("none", "selective")])
    none, sel = evaluate_frame(plan).rows(named=True)
    hw = machine_vector(PRESETS["a100-sxm4-80gb"])
    core = ops.attention_core_forward_s(1.0, 1024.0, 8192.0, 64.0, 64.0, 1.0, hw)
    assert none["dp_comm_s"] > 4 * core                 # the all-reduce outlasts the window
    assert none["dp_comm_s"] - sel["dp_comm_s"] == pytest.approx(4 * core, rel=1e-9)


def test_attention_core_forward_moves_the_core_bytes():
    """Memory-bound machine (free FLOPs, no gaps, no host floor): the rerun attention core is
    its two batched GEMMs' bytes plus softmax (4), dropout (5) per score element and the
    context permute copy (4 per token and hidden unit per rank)."""
    from vtrain_fast.hardware.gpus import PRESETS, machine_vector
    from vtrain_fast.model import ops
    from vtrain_fast.model.records import HW_FIELDS
    hw = machine_vector(PRESETS["a100-sxm4-80gb"])
    for name, value in (("peak_flops", 1e30), ("kernel_overhead_s", 0.0), ("host_launch_s", 0.0)):
        hw[HW_FIELDS.index(name)] = value
    rate = hw[HW_FIELDS.index("hbm_Bps")] * hw[HW_FIELDS.index("hbm_efficiency")]
    b, s, h, a, t = 2.0, 2048.0, 4096.0, 32.0, 4.0
    heads, d = a / t, h / a
    gemm_bytes = 2.0 * (2.0 * (s * d + d * s + s * s) * b * heads)      # Q K^T and P V, fp16
    elems = b * heads * s * s
    expected = (gemm_bytes + (4.0 + 5.0) * elems + 4.0 * b * s * h / t) / rate
    assert ops.attention_core_forward_s(b, s, h, a, a, t, hw) == pytest.approx(expected, rel=1e-12)
