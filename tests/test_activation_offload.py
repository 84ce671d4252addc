"""Activation offloading (Megatron-LM --cpu-offloading-num-layers, Transformer Engine's CPU offload) and
parameter offloading (param_cpu_offload: PyTorch FSDP2's CPUOffloadPolicy under ZeRO-3), issue 16:
the memory each moves to the host by hand, the host-link traffic and what of it the compute hides,
the closed form against an event simulation of TE's two streams, Megatron-core's refusals, the
CPU optimizer step, ``show``'s parts and the exports."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import polars as pl
import pytest

import reference as ref
from vtrain_fast.analysis.evaluate import evaluate_frame
from vtrain_fast.analysis.export import bridge_overrides, megatron_args, torchtitan_config
from vtrain_fast.analysis.show import HOST_PARTS, MEMORY_PARTS, show_plan
from vtrain_fast.hardware.gpus import PRESETS, machine_vector
from vtrain_fast.io.errors import InputError
from vtrain_fast.model import costs, offload, ops, records, step
from vtrain_fast.model.layout import Layout
from vtrain_fast.model.records import HW_FIELDS
from pathlib import Path

GiB = 1024.0 ** 3
ARGS_FILE = Path(__file__).parent / "data" / "megatron_lm_args.txt"
MEGATRON_FLAGS = {ln.strip() for ln in ARGS_FILE.read_text().splitlines() if ln.startswith("--")}
# GPT-3 1.3B's shape: 24 layers, h 2048, 16 heads (MHA), f = 4h, s 2048, v 51200 (the kernel's inputs)
L, H, A, F, V, S = 24, 2048, 16, 8192, 51200, 2048
PLAN = dict(model="gpt3-1.3b", gpu="a100-sxm4-80gb", global_batch_size=64, micro_batch_size=2, tp=1, pp=1, dp=8,
            use_flash_attn=True, recompute="none")


def _kernel(B=64, b=2, t=1, p=1, d=8, recompute=0, layers=L, gpu="a100-sxm4-80gb", **settings):
    """The kernel's outputs (name -> value) and status of the 1.3B shape on ``gpu`` with ``settings``
    (GPUPreset fields: training settings, host_link_GBps, ...)."""
    g = dataclasses.replace(PRESETS[gpu], use_flash_attn=True, **settings)
    hw = machine_vector(g)
    out = np.full((records.NUM_OUTPUTS, 1), np.nan)
    code = step.step(layers, H, A, A, F, V, S, B, b, Layout(t, 1, d, p), recompute, 1e11, hw, out, 0)
    return {n: float(out[k, 0]) for k, n in enumerate(records.OUTPUT_NAMES)}, int(code), hw


def _layer_bytes(b=2, t=1):
    """One GPT layer's saved activations with FlashAttention, no sequence parallelism, by hand
    (Korthikanti et al. 2022, Sec. 4.1, the flash variant): s b h (10 + 24 / t) + 4 b a s / t."""
    return S * b * H * (10.0 + 24.0 / t) + 4.0 * b * A * S / t


# ---- activation offloading: memory

@pytest.mark.parametrize("k", [1, 4, 12, 23])
def test_offloading_k_layers_frees_exactly_k_layers_of_activations(k):
    base, code0, _ = _kernel()
    off, code1, _ = _kernel(cpu_offloading_num_layers=k)
    assert code0 == code1 == records.OK
    # TE >= 2.10: activation memory of (num_layers - k) layers, the copy in flight included
    assert (base["activations_GiB"] - off["activations_GiB"]) * GiB == pytest.approx(k * _layer_bytes(), rel=1e-12)
    assert base["model_states_GiB"] == off["model_states_GiB"]
    assert off["memory_per_gpu_GiB"] < base["memory_per_gpu_GiB"]


def test_offloaded_bf16_and_moe_layers_move_their_own_bytes():
    """Under FP8 the first layer kept in bf16 stores its linears' inputs in bf16: offloading it moves
    those bytes too (the twin counts them layer by layer)."""
    g = dict(gpu="h100-sxm-80gb", precision="fp8", num_layers_at_start_in_bf16=1)
    base, _, hw = _kernel(**g)
    off1, _, _ = _kernel(cpu_offloading_num_layers=1, **g)
    off2, _, _ = _kernel(cpu_offloading_num_layers=2, **g)
    first = (base["activations_GiB"] - off1["activations_GiB"]) * GiB
    second = (off1["activations_GiB"] - off2["activations_GiB"]) * GiB
    mb = costs.micro_batch_costs(2.0, S, H, A, A, F, V, 1.0, hw)
    assert second == pytest.approx(mb.layer_activation_bytes, rel=1e-12)            # an FP8 layer
    assert first == pytest.approx(mb.layer_activation_bytes + mb.bf16_layer_activation_extra_bytes, rel=1e-12)
    assert first > second


# ---- activation offloading: time

def test_exposed_time_is_zero_when_the_compute_hides_the_copies():
    base, _, _ = _kernel()
    off, _, _ = _kernel(cpu_offloading_num_layers=4)
    assert off["offload_s"] == 0.0 and off["iteration_time_s"] == base["iteration_time_s"]


def test_every_layer_but_the_last_offloaded_waits_for_both_directions_in_full():
    """k = num_layers - 1: each copy is due before the next layer starts (TE's schedule), so each
    micro-batch waits 2 x k x bytes / host_link."""
    link = 5.0                          # GB/s per direction: a slow host link
    off, code, _ = _kernel(cpu_offloading_num_layers=L - 1, host_link_GBps=link)
    base, _, _ = _kernel(host_link_GBps=link)
    m = 64 / (8 * 2)
    assert code in (records.OK, records.OUT_OF_MEMORY)
    assert off["offload_s"] == pytest.approx(m * 2.0 * (L - 1) * _layer_bytes() / (link * 1e9), rel=1e-12)
    assert off["iteration_time_s"] == pytest.approx(base["iteration_time_s"] + off["offload_s"], rel=1e-12)


def test_a_slow_link_exposes_what_the_copies_take_beyond_the_other_layers_compute():
    link = 2.0
    off, _, hw = _kernel(cpu_offloading_num_layers=12, host_link_GBps=link)
    mb = costs.micro_batch_costs(2.0, S, H, A, A, F, V, 1.0, hw)
    copy = _layer_bytes() / (link * 1e9)
    assert copy > mb.layer_backward_s > mb.layer_forward_s       # the link is the bottleneck both ways
    per_mb = (12 * copy - (L - 2) * mb.layer_forward_s) + (12 * copy - (L - 2) * mb.layer_backward_s)
    assert off["offload_s"] == pytest.approx(4.0 * per_mb, rel=1e-12) and off["offload_s"] > 0.0
    faster, _, _ = _kernel(cpu_offloading_num_layers=12, host_link_GBps=4 * link)
    assert faster["offload_s"] < off["offload_s"]


@pytest.mark.parametrize("n", [2, 3, 5, 24])
def test_the_closed_form_is_the_event_simulation_of_tes_two_streams(n):
    rng = np.random.default_rng(n)
    for k in range(0, n):
        for _ in range(20):
            c, f = float(rng.uniform(0.0, 3.0)), float(rng.uniform(0.01, 1.0))
            want_f = ref.offload_stall_forward(k, n, c, f)
            want_b = ref.offload_stall_backward(k, n, c, f)
            assert offload.activation_offload_exposed_s(float(k), float(n), c, f) == pytest.approx(want_f, abs=1e-12)
            assert want_b == pytest.approx(want_f, abs=1e-12)       # the backward mirrors the forward


def test_the_kernel_matches_its_twin_with_offloading():
    for settings in (dict(cpu_offloading_num_layers=5, host_link_GBps=3.0),
                     dict(cpu_offloading_num_layers=23), dict(zero_stage=3, param_cpu_offload=True, host_link_GBps=2.0),
                     dict(zero_stage=3, param_cpu_offload=True, cpu_offloading_num_layers=3, dp_shard=4)):
        out, code, hw = _kernel(**settings)
        r_code, r_out = ref.step(L, H, A, A, F, V, S, 64, 2, 1, 1, 8, 0, 1e11, hw)
        assert code == r_code
        for name in records.OUTPUT_NAMES:
            assert out[name] == pytest.approx(r_out[name], rel=1e-12, abs=1e-15), (settings, name)


# ---- activation offloading: Megatron-core's refusals, odd inputs

@pytest.mark.parametrize("case", [dict(p=2, d=4), dict(recompute=1), dict(recompute=2),
                                  dict(cpu_offloading_num_layers=L), dict(cpu_offloading_num_layers=10_000)])
def test_megatron_refuses_offloading_with_pipelines_recomputation_or_every_layer(case):
    kw = {"cpu_offloading_num_layers": 4, **case}
    out, code, _ = _kernel(**kw)
    assert code == records.REFUSED and math.isnan(out["iteration_time_s"])


def test_odd_machine_vectors_never_raise():
    g = dataclasses.replace(PRESETS["a100-sxm4-80gb"], use_flash_attn=True)
    out = np.full((records.NUM_OUTPUTS, 1), np.nan)
    for k in (-3.0, 0.5, 1e9, math.nan):
        hw = machine_vector(g)
        hw[HW_FIELDS.index("cpu_offloading_num_layers")] = k
        code = step.step(L, H, A, A, F, V, S, 64, 2, Layout(1, 1, 8, 1), 0, 1e11, hw, out, 0)
        assert code in (records.OK, records.OUT_OF_MEMORY, records.REFUSED)
    assert offload.activation_offload_exposed_s(0.0, 24.0, 1.0, 1.0) == 0.0
    assert offload.activation_offload_exposed_s(3.0, 24.0, 0.0, 1.0) == 0.0


def test_evaluate_refuses_a_bad_count_clearly():
    out = evaluate_frame(pl.DataFrame([{**PLAN, "cpu_offloading_num_layers": 4, "pp": 2, "dp": 4}]), "x")
    assert out["status"][0] == "refused"
    with pytest.raises(InputError, match="cpu_offloading_num_layers"):
        evaluate_frame(pl.DataFrame([{**PLAN, "cpu_offloading_num_layers": -1}]), "x")


# ---- parameter offloading (FSDP2 CPUOffloadPolicy)

def test_parameter_offloading_keeps_only_the_gathered_layers_and_steps_on_the_cpu():
    z3, _, hw = _kernel(zero_stage=3)
    off, _, _ = _kernel(zero_stage=3, param_cpu_offload=True)
    p_layer = 12 * H * H + 13 * H                   # GPT layer: 4 linears' weights + biases + 2 LayerNorms
    # ZeRO-3's two gathered layers (a bf16 weight, an fp32 main gradient) are all that stays on the GPU
    assert off["model_states_GiB"] * GiB == pytest.approx(2 * p_layer * (2 + 4), rel=1e-12)
    assert z3["model_states_GiB"] > off["model_states_GiB"]
    assert off["activations_GiB"] == z3["activations_GiB"]
    # Adam on the CPU over this rank's 1/8 shard of all the parameters, nothing to copy after it
    params = L * p_layer + V * H + S * H + 2 * H    # layers, tied embedding, positions, final LayerNorm
    assert off["optimizer_s"] == pytest.approx(ops.cpu_adam_s(params / 8, hw), rel=1e-12)


def test_parameter_offloading_adds_the_shard_copies_beyond_the_prefetch():
    link = 1.0                               # GB/s: copies longer than any layer's compute
    off, _, hw = _kernel(zero_stage=3, param_cpu_offload=True, host_link_GBps=link)
    z3, _, _ = _kernel(zero_stage=3, host_link_GBps=link)
    assert off["dp_comm_s"] == z3["dp_comm_s"] and off["compute_s"] == z3["compute_s"]
    mb = costs.micro_batch_costs(2.0, S, H, A, A, F, V, 1.0, hw)
    split = costs.split_costs(L, H, A, A, F, V, S, Layout(1, 1, 8, 1), hw)
    ag, ag_head = split.zero3_layer_gather_s, split.zero3_head_gather_s
    # the fp32 gradients' reduce-scatter takes longer than the bf16 weights' gather
    extra, extra_head = split.zero3_layer_reduce_s - ag, split.zero3_head_reduce_s - ag_head
    assert extra > 0.0 and extra_head > 0.0
    fwd, back, head = mb.layer_forward_s, mb.layer_backward_s, mb.head_s
    p_layer = 12 * H * H + 13 * H
    c = 4.0 * p_layer / 8 / (link * 1e9)                    # one fp32 shard copy of a layer, each way
    c_emb, c_head = 4.0 * (V * H + S * H) / 8 / 1e9, 4.0 * (V * H + 2 * H) / 8 / 1e9
    assert c > back > fwd
    # per layer: the forward chain copy + all-gather, the backward's copy + all-gather + reduce-scatter +
    # copy back, beyond the layer's compute, less what the exchanges alone expose; three copies wait
    # in full; the embedding's copies hide behind nothing, the head's behind the head
    layer = (ag + c - fwd) + (2 * (ag + c) + extra - back) - max(0.0, ag - fwd) - max(0.0, 2 * ag + extra - back)
    per_mb = (L * layer + 3 * c + 3 * c_emb
              + max(0.0, 3 * (ag_head + c_head) + extra_head - head) - max(0.0, 3 * ag_head + extra_head - head))
    assert off["offload_s"] == pytest.approx(4 * per_mb, rel=1e-12)
    # a fast link hides the layers' copies behind the compute: the ones that always wait are left
    fast, _, _ = _kernel(zero_stage=3, param_cpu_offload=True, host_link_GBps=1e4)
    assert 0.0 < fast["offload_s"] < off["offload_s"]


def test_parameter_offloading_has_no_effect_where_nothing_is_sharded():
    one, code, _ = _kernel(B=16, d=1, zero_stage=3, param_cpu_offload=True)
    plain, _, _ = _kernel(B=16, d=1)
    assert code in (records.OK, records.OUT_OF_MEMORY)
    assert {k: v for k, v in one.items()} == pytest.approx(plain, rel=0, abs=0)


def test_parameter_offloading_needs_zero_3():
    with pytest.raises(InputError, match="param_cpu_offload"):
        evaluate_frame(pl.DataFrame([{**PLAN, "param_cpu_offload": True}]), "x")


# ---- show: the parts

@pytest.mark.parametrize("extra", [dict(cpu_offloading_num_layers=6),
                                   dict(zero_stage=3, param_cpu_offload=True)])
def test_show_parts_sum_to_the_kernel_and_name_the_host_memory(extra):
    row = evaluate_frame(pl.DataFrame([{**PLAN, **extra}]), "x").row(0, named=True)
    base = evaluate_frame(pl.DataFrame([PLAN]), "x").row(0, named=True)
    d = show_plan(row)
    mem = d.memory
    parts = mem.select(MEMORY_PARTS).to_numpy()
    assert (parts >= 0.0).all()
    assert mem["total_GiB"][0] == pytest.approx(row["memory_per_gpu_GiB"], rel=1e-9)
    assert parts.sum() == pytest.approx(mem["total_GiB"][0], rel=1e-12)
    assert sum(d.time_s[k] for k in d.time_s if k != "iteration_time_s") == pytest.approx(
        row["iteration_time_s"], rel=1e-9)
    if "cpu_offloading_num_layers" in extra:
        assert mem["host_activations_GiB"][0] == pytest.approx(base["activations_GiB"] - row["activations_GiB"],
                                                               rel=1e-9)
        assert mem["host_states_GiB"][0] == 0.0
    else:
        assert mem["weights_GiB"][0] == mem["gradients_GiB"][0] == mem["optimizer_GiB"][0] == 0.0
        assert mem["host_states_GiB"][0] == pytest.approx(16.0 * row["num_parameters"] / 8 / GiB, rel=1e-9)
    assert set(HOST_PARTS) <= set(mem.columns)


# ---- export

def test_megatron_gets_the_activation_flag_and_refuses_parameter_offloading():
    row = evaluate_frame(pl.DataFrame([{**PLAN, "cpu_offloading_num_layers": 6}]), "x").row(0, named=True)
    e = megatron_args(row, 8)
    i = e.args.index("--cpu-offloading-num-layers")
    assert e.args[i + 1] == "6" and "--cpu-offloading-num-layers" in MEGATRON_FLAGS
    assert any("Transformer Engine >= 2.10" in n for n in e.notes)
    assert "model.cpu_offloading_num_layers=6" in bridge_overrides(row, 8).args
    z3 = evaluate_frame(pl.DataFrame([{**PLAN, "zero_stage": 3, "param_cpu_offload": True}]), "x").row(0, named=True)
    for export in (megatron_args, bridge_overrides):
        with pytest.raises(InputError, match="Megatron-LM has no parameter offloading"):
            export(z3, 8)


def test_torchtitan_gets_fsdp2s_cpu_offload_and_refuses_layer_offloading():
    llama = dict(model="llama3-8b", gpu="h100-sxm-80gb", global_batch_size=64, micro_batch_size=1, tp=1, pp=1, dp=8,
                 use_flash_attn=True, recompute="none", zero_stage=3)
    row = evaluate_frame(pl.DataFrame([{**llama, "param_cpu_offload": True}]), "x").row(0, named=True)
    assert "config.training.enable_cpu_offload = True" in torchtitan_config(row, 8).source
    plain = evaluate_frame(pl.DataFrame([llama]), "x").row(0, named=True)
    assert "enable_cpu_offload" not in torchtitan_config(plain, 8).source
    act = evaluate_frame(pl.DataFrame([{**llama, "cpu_offloading_num_layers": 2}]), "x").row(0, named=True)
    with pytest.raises(InputError, match="cpu_offloading_num_layers"):
        torchtitan_config(act, 8)
