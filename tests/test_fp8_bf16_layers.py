"""Layers kept in bf16 under FP8 (training settings num_layers_at_start_in_bf16 /
num_layers_at_end_in_bf16, Megatron-core --first-last-layers-bf16 with
--num-layers-at-start-in-bf16 / --num-layers-at-end-in-bf16): the chosen layers by global index,
their bf16 GEMMs and saved inputs, no FP8 casts or weight copies there."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import reference as ref
from conftest import check_step_against_twin
from vtrain_fast.hardware.gpus import PRESETS, machine_vector
from vtrain_fast.model import layer_split, layout, records, step
from vtrain_fast.model.arch import DEFAULT_ARCH
from vtrain_fast.model.settings import NOT_FP8, BY_NAME, rules_markdown

H100 = replace(PRESETS["h100-sxm-80gb"], use_flash_attn=True)
LLAMA = DEFAULT_ARCH._replace(gated_mlp=1.0)
L = 32


def hw(**kw):
    return machine_vector(replace(H100, **kw))


def run(vec, p=4, t=4, d=2, b=1, rc=0, layers=L):
    """Llama-3-8B-like shape at 8k tokens; returns (status, outputs by name)."""
    out = np.empty((records.NUM_OUTPUTS, 1))
    code = step.step(float(layers), 4096.0, 32.0, 8.0, 14336.0, 128256.0, 8192.0, float(d * b * 8 * p), float(b),
                     layout.Layout(t, 1, d, p), rc, 1e12, vec, out, 0, LLAMA)
    return code, dict(zip(records.OUTPUT_NAMES, out[:, 0]))


def test_the_counts_are_registry_settings_with_megatron_names_and_no_effect_in_bf16():
    for name, flag in (("num_layers_at_start_in_bf16", "--num-layers-at-start-in-bf16"),
                       ("num_layers_at_end_in_bf16", "--num-layers-at-end-in-bf16")):
        st = BY_NAME[name]
        assert st.kind is int and st.default == 0 and st.megatron == flag
        assert st.inert_with == NOT_FP8
        assert f"`{name}` ({flag}): no effect with precision = bf16" in rules_markdown()
    # in bf16 the counts change nothing
    for p in (1, 4):
        assert run(hw(num_layers_at_start_in_bf16=3, num_layers_at_end_in_bf16=2), p=p)[1] == run(hw(), p=p)[1]


@pytest.mark.parametrize("p,vpp", [(1, 1), (4, 1), (4, 2)])
@pytest.mark.parametrize("rc", [0, 1, 2])
def test_every_layer_in_bf16_prices_fp8_exactly_as_bf16(p, vpp, rc):
    # the embedding, head and attention core are bf16 under FP8 anyway: with every transformer
    # layer kept in bf16 nothing of FP8 is left, time or memory
    bf16 = run(hw(vpp=vpp), p=p, rc=rc)[1]
    for start, end in ((L, 0), (0, L), (20, 20)):
        all16 = run(hw(vpp=vpp, precision="fp8", num_layers_at_start_in_bf16=start, num_layers_at_end_in_bf16=end),
                    p=p, rc=rc)[1]
        for name in ("iteration_time_s", "memory_per_gpu_GiB", "compute_s", "tp_comm_s", "bubble_s"):
            assert all16[name] == pytest.approx(bf16[name], rel=1e-12), (start, end, name)


def test_a_few_bf16_layers_cost_between_fp8_and_bf16_and_only_where_they_sit():
    fp8 = run(hw(precision="fp8"))[1]
    bf16 = run(hw())[1]
    start = run(hw(precision="fp8", num_layers_at_start_in_bf16=1))[1]
    end = run(hw(precision="fp8", num_layers_at_end_in_bf16=1))[1]
    both = run(hw(precision="fp8", num_layers_at_start_in_bf16=1, num_layers_at_end_in_bf16=1))[1]
    for case in (start, end, both):
        assert fp8["iteration_time_s"] < case["iteration_time_s"] < bf16["iteration_time_s"]
    # the last stage (with the LM head) is the slowest: a bf16 layer there is paid every
    # micro-batch, one on the first stage only in the warm-up and cool-down
    assert end["compute_s"] > fp8["compute_s"] and start["compute_s"] == fp8["compute_s"]
    assert start["bubble_s"] > fp8["bubble_s"]
    # the first stage holds the most micro-batches and is the fullest: its bf16 layer keeps bf16
    # inputs (more than its FP8 weight copy saves), the last stage's does not show
    assert start["memory_per_gpu_GiB"] > fp8["memory_per_gpu_GiB"]
    assert end["memory_per_gpu_GiB"] == fp8["memory_per_gpu_GiB"]
    # one bf16 layer at p = 1 costs the layer's bf16-minus-FP8 time once per micro-batch
    one = run(hw(precision="fp8"), p=1, d=8)[1]
    one16 = run(hw(precision="fp8", num_layers_at_end_in_bf16=1), p=1, d=8)[1]
    all16 = run(hw(precision="fp8", num_layers_at_end_in_bf16=L), p=1, d=8)[1]
    per_layer = (all16["compute_s"] - one["compute_s"]) / L
    assert one16["compute_s"] - one["compute_s"] == pytest.approx(per_layer, rel=1e-9)


@pytest.mark.parametrize("start,end,vpp,expected", [
    # 32 layers over 4 stages of 8: by global index
    (1, 1, 1, (1, 0, 1, 0, 0, 0)),
    (9, 0, 1, (8, 1, 0, 1, 1, 0)),       # past the first stage: the second's first layer
    (0, 17, 1, (0, 1, 8, 9, 8, 1)),
    (20, 20, 1, (8, 8, 8, 16, 8, 8)),    # overlapping ranges: every layer once
    # interleaved, 2 chunks of 4 per device: chunk 0 of device 0 is layers 0-3, of device 1 4-7, ...
    (5, 0, 2, (4, 1, 0, 1, 1, 0)),
    (0, 5, 2, (0, 0, 4, 1, 1, 0)),       # layers 27-31: device 3's chunk 1 and device 2's layer 27
])
def test_bf16_layers_are_counted_per_device_by_global_index(start, end, vpp, expected):
    vec = hw(precision="fp8", num_layers_at_start_in_bf16=start, num_layers_at_end_in_bf16=end, vpp=vpp)
    got = layer_split.bf16_layer_counts(float(L), 4.0, vec)
    assert got == tuple(float(x) for x in expected)
    per_device = ref.bf16_layers_per_stage(L, [8, 8, 8, 8], vpp, list(vec))
    assert (per_device[0], per_device[1], per_device[3], sum(per_device[1:3]), max(per_device[1:3]),
            min(per_device[1:3])) == expected


def test_bf16_layer_counts_follow_the_embedding_and_loss_slots():
    # BLOOM-style split: 30 layers + embedding + loss over 4 stages: 7, 8, 8, 7 layers
    vec = hw(precision="fp8", num_layers_at_start_in_bf16=8, num_layers_at_end_in_bf16=1,
             account_for_embedding_in_pipeline_split=True, account_for_loss_in_pipeline_split=True)
    assert layer_split.bf16_layer_counts(30.0, 4.0, vec) == (7.0, 1.0, 1.0, 1.0, 1.0, 0.0)
    assert ref.bf16_layers_per_stage(30, [7, 8, 8, 7], 1, list(vec)) == [7, 1, 0, 1]


def test_kernel_matches_twin_with_bf16_layers():
    rng = np.random.default_rng(12)
    for start, end in ((1, 1), (3, 0), (0, 9), (9, 4)):
        for extra in ({}, {"vpp": 2}, {"sequence_parallel": True, "tp_comm_overlap": True},
                      {"zero_stage": 3}, {"fp8_recipe": "tensorwise"}):
            vec = hw(precision="fp8", num_layers_at_start_in_bf16=start, num_layers_at_end_in_bf16=end, **extra)
            for _ in range(6):
                check_step_against_twin(rng, vec, f"{start} {end} {extra}")
