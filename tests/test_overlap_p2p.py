"""overlap_p2p_comm (Megatron-core's interleaved schedule: pipeline sends and receives under the
neighbouring chunk's forward or backward instead of blocking)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from conftest import check_step_against_twin
from vtrain_fast.hardware.gpus import PRESETS, machine_vector
from vtrain_fast.model import layout, records, step
from vtrain_fast.model.arch import DEFAULT_ARCH
from vtrain_fast.model.settings import BY_NAME, rules_markdown

H100 = replace(PRESETS["h100-sxm-80gb"], use_flash_attn=True)


def run(vec, p=4, t=4, d=4, b=1, s=4096.0):
    out = np.empty((records.NUM_OUTPUTS, 1))
    code = step.step(32.0, 4096.0, 32.0, 8.0, 14336.0, 128256.0, s, float(d * b * 8 * p), float(b),
                     layout.Layout(t, 1, d, p), 0, 1e12, vec, out, 0, DEFAULT_ARCH._replace(gated_mlp=1.0))
    assert code == records.OK
    return dict(zip(records.OUTPUT_NAMES, out[:, 0]))


def test_registry_record_names_megatron_and_its_no_effect_rules():
    st = BY_NAME["overlap_p2p_comm"]
    assert st.kind is bool and st.default is False and st.megatron == "--no-overlap-p2p-communication"
    assert "`overlap_p2p_comm` (--no-overlap-p2p-communication): no effect at pp = 1; no effect with vpp = 1" in rules_markdown()


def test_overlap_hides_the_interleaved_sends_up_to_a_chunk_and_nothing_else():
    blocking = run(machine_vector(replace(H100, vpp=2)))
    overlapped = run(machine_vector(replace(H100, vpp=2, overlap_p2p_comm=True)))
    assert blocking["pp_comm_s"] > 0.0
    # a chunk of 4 Llama-3-8B layers at 4k tokens takes far longer than a 32 MiB NVLink send
    assert overlapped["pp_comm_s"] == 0.0
    assert blocking["iteration_time_s"] - overlapped["iteration_time_s"] == pytest.approx(
        blocking["pp_comm_s"] + (blocking["bubble_s"] - overlapped["bubble_s"]), rel=1e-9)
    for name in ("compute_s", "tp_comm_s", "dp_comm_s", "memory_per_gpu_GiB"):
        assert overlapped[name] == blocking[name]
    # without interleaving Megatron-core's 1F1B sends block either way
    assert run(machine_vector(replace(H100, overlap_p2p_comm=True))) == run(machine_vector(H100))


def test_a_send_longer_than_a_chunk_shows_the_difference():
    # across nodes (dp 1, pp 16 over 2 nodes: the pipeline group leaves the node) on a slow NIC,
    # with one-layer chunks of 1k tokens
    slow = replace(H100, vpp=2, inter_node_Gbps=10.0)
    b = run(machine_vector(slow), p=16, t=1, d=1, s=1024.0)
    o = run(machine_vector(replace(slow, overlap_p2p_comm=True)), p=16, t=1, d=1, s=1024.0)
    assert 0.0 < o["pp_comm_s"] < b["pp_comm_s"]


def test_kernel_matches_twin_with_overlapped_sends():
    rng = np.random.default_rng(7)
    for vpp in (2, 4):
        for extra in ({}, {"sequence_parallel": True}, {"num_layers_at_start_in_bf16": 1, "precision": "fp8"}):
            vec = machine_vector(replace(H100, vpp=vpp, overlap_p2p_comm=True, **extra))
            for _ in range(10):
                check_step_against_twin(rng, vec, f"{vpp} {extra}")
