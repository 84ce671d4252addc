"""Optimizer CPU offload (issue 16; ZeRO-Offload, Megatron-LM --optimizer-cpu-offload): the GPU's
memory and the step's host traffic by hand, the overlap, the fraction, the refusal without the
precision-aware optimizer, and the export's flags."""
from __future__ import annotations

import polars as pl
import pytest

from vtrain_fast.analysis.evaluate import evaluate_frame
from vtrain_fast.analysis.export import megatron_args
from vtrain_fast.hardware.gpus import PRESETS, host_link_GBps, host_memory_GBps
from vtrain_fast.io.errors import InputError

GiB = 1024.0 ** 3
PLAN = dict(model="gpt3-13b", gpu="a100-sxm4-80gb", global_batch_size=16, micro_batch_size=1, tp=2, pp=1, dp=1,
            recompute="full", use_flash_attn=True, use_precision_aware_optimizer=True)
OFF = dict(optimizer_cpu_offload=True)


def _rows(*variants):
    return evaluate_frame(pl.DataFrame([{**PLAN, **v} for v in variants]), "x").rows(named=True)


def test_offload_frees_the_optimizer_states_and_adds_the_host_traffic_by_hand():
    on, off, lap, half = _rows({}, OFF, {**OFF, "overlap_cpu_optimizer_d2h_h2d": True},
                               {**OFF, "optimizer_offload_fraction": 0.5})
    n = on["model_states_GiB"] * GiB / (2 + 2 + 2 + 8)        # parameters on the GPU (tp shard)
    # the optimizer's 2 + 8 bytes per parameter leave the GPU (half of them at fraction 0.5)
    assert on["model_states_GiB"] - off["model_states_GiB"] == pytest.approx(10 * n / GiB, rel=1e-9)
    assert on["model_states_GiB"] - half["model_states_GiB"] == pytest.approx(5 * n / GiB, rel=1e-9)
    g = PRESETS["a100-sxm4-80gb"]
    link, mem = host_link_GBps(g) * 1e9, host_memory_GBps(g) * 1e9
    assert link == pytest.approx(1.969 * 16 * 0.78 * 1e9) and mem == pytest.approx(409.6e9 * 0.7 / 8)
    copy, cpu = 4 * n / link, 28 * n / mem                    # one way over PCIe; CPU Adam's host traffic
    # the GPU's own step is gone, the host's added (the cast back to bf16 is small: within 5 %)
    assert off["optimizer_s"] == pytest.approx(2 * copy + cpu, rel=0.05)
    assert lap["optimizer_s"] == pytest.approx(max(copy, cpu), rel=0.1)
    assert on["optimizer_s"] < lap["optimizer_s"] < off["optimizer_s"]
    assert half["optimizer_s"] == pytest.approx(0.5 * on["optimizer_s"] + 0.5 * (2 * copy + cpu), rel=0.05)
    for r in (off, lap, half):                                # the rest of the step is untouched
        assert r["iteration_time_s"] - r["optimizer_s"] == pytest.approx(on["iteration_time_s"] - on["optimizer_s"],
                                                                         rel=1e-9)


def test_offload_makes_a_plan_fit_that_does_not():
    plain, off = _rows({"use_precision_aware_optimizer": False}, OFF)
    assert plain["status"] == "out_of_memory" and off["status"] == "ok"


def test_offload_needs_the_precision_aware_optimizer_and_a_fraction_in_range():
    with pytest.raises(InputError, match="use_precision_aware_optimizer"):
        _rows({"use_precision_aware_optimizer": False, **OFF})
    with pytest.raises(InputError, match="optimizer_offload_fraction"):
        _rows({**OFF, "optimizer_offload_fraction": 1.5})


def test_a_gpu_file_gives_its_own_host_bandwidths(tmp_path):
    from vtrain_fast.hardware.gpus import load_gpu_files
    f = tmp_path / "g.toml"
    f.write_text('[gpus.box]\nbase = "rtx4090-pcie-24gb"\nhost_memory_GBps = 20.0\nhost_link_GBps = 12.0\n')
    box = load_gpu_files([f], PRESETS, need_source=False)["box"]
    assert host_memory_GBps(box) == 20.0 and host_link_GBps(box) == 12.0


def test_the_export_names_megatrons_flags():
    row = _rows({**OFF, "optimizer_offload_fraction": 0.5, "overlap_cpu_optimizer_d2h_h2d": True})[0]
    args = list(megatron_args(row, 8).args)
    assert "--optimizer-cpu-offload" in args and "--overlap-cpu-optimizer-d2h-h2d" in args
    assert args[args.index("--optimizer-offload-fraction") + 1] == "0.5"
