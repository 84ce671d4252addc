"""Selective activation recomputation (Korthikanti et al. 2022, Sec. 5; Megatron-LM
``--recompute-granularity selective``): memory from the paper's Table 2, time between no and
full recomputation, hardware FLOPs counting the rerun attention core."""
from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from vtrain_fast.evaluate import evaluate_frame
from vtrain_fast.kernels import step
from vtrain_fast.spec import RECOMPUTE_VALUES

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
    assert RECOMPUTE_VALUES[step.RECOMPUTE_NONE] == "none"
    assert RECOMPUTE_VALUES[step.RECOMPUTE_FULL] == "full"
    assert RECOMPUTE_VALUES[step.RECOMPUTE_SELECTIVE] == "selective"


def test_selective_memory_is_korthikanti_table_2():
    none, sel = run("none"), run("selective")
    L, h, s, b, t = (PLANS[c].cast(pl.Float64).to_numpy() for c in
                     ("num_layers", "hidden_size", "seq_length", "micro_batch_size", "tp"))
    a = PLANS["num_attention_heads"].cast(pl.Float64).to_numpy()
    per_layer = s * b * h * (10.0 + 24.0 / t)              # Table 2, selective, no SP
    saved = (none["activations_GiB"] - sel["activations_GiB"]).to_numpy() * GiB
    # the dropped attention core: softmax out 2 (fused) + mask 1 + dropout out 2 bytes
    np.testing.assert_allclose(saved, L * 5.0 * a * s * s * b / t, rtol=1e-9)
    # the rest of the layer's activations are the table's; the logits and embedding terms are
    # the same in both runs
    kept_layers = (sel["activations_GiB"].to_numpy() * GiB
                   - (none["activations_GiB"].to_numpy() * GiB - L * (per_layer + 5.0 * a * s * s * b / t)))
    np.testing.assert_allclose(kept_layers, L * per_layer, rtol=1e-9)
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
    np.testing.assert_allclose(saved, L * 4.0 * b * a / t * s, rtol=1e-9)
    assert (sel["iteration_time_s"] > none["iteration_time_s"]).all()


SPEC = """
[model]
presets = ["gpt3-1.3b"]
[training]
num_tokens = 1e9
global_batch_size = 64
micro_batch_size = 1
recompute = [{values}]
[cluster]
gpu = "a100-sxm4-80gb"
num_gpus = 8
[parallel]
tp = 1
pp = 1
"""


def test_spec_and_evaluate_accept_selective_and_name_it_when_refusing():
    from vtrain_fast.errors import InputError
    from vtrain_fast.spec import parse_spec
    spec = parse_spec(SPEC.format(values='"none", "selective", "full"'), "spec.toml")
    assert spec.recompute == ("none", "selective", "full")
    assert run("selective")["recompute"].to_list() == ["selective"] * 3
    with pytest.raises(InputError, match="selective"):
        parse_spec(SPEC.format(values='"partial"'), "spec.toml")
    with pytest.raises(InputError, match="selective"):
        run("partial")
