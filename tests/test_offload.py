"""Optimizer CPU offload (issue 16; ZeRO-Offload, Megatron-LM --optimizer-cpu-offload): the GPU's
memory and the step's host traffic by hand, the overlap, the fraction, the refusal without the
precision-aware optimizer, and the export's flags."""
from __future__ import annotations

import polars as pl
import pytest

from vtrain_fast.analysis.evaluate import evaluate_frame
from vtrain_fast.analysis.export import megatron_args
from vtrain_fast.hardware.gpus import (PRESETS, cpu_adam_params_per_s_per_core, host_cores_per_gpu, host_link_GBps,
                                       host_memory_GBps, load_gpu_files)
from vtrain_fast.io.errors import InputError

GiB = 1024.0 ** 3
PLAN = dict(model="gpt3-13b", gpu="a100-sxm4-80gb", global_batch_size=16, micro_batch_size=1, tp=2, pp=1, dp=1,
            recompute="full", use_flash_attn=True, use_precision_aware_optimizer=True)
OFF = dict(optimizer_cpu_offload=True)


def _rows(*variants, gpus=None):
    return evaluate_frame(pl.DataFrame([{**PLAN, **v} for v in variants]), "x", gpus=gpus).rows(named=True)


def test_offload_frees_the_optimizer_states_and_adds_the_host_traffic_by_hand():
    on, off, lap, half = _rows({}, OFF, {**OFF, "overlap_cpu_optimizer_d2h_h2d": True},
                               {**OFF, "optimizer_offload_fraction": 0.5})
    n = on["model_states_GiB"] * GiB / (2 + 4 + 2 + 8)        # parameters on the GPU (tp shard; fp32 main gradient)
    # the optimizer's 2 + 8 bytes per parameter leave the GPU (half of them at fraction 0.5)
    assert on["model_states_GiB"] - off["model_states_GiB"] == pytest.approx(10 * n / GiB, rel=1e-9)
    assert on["model_states_GiB"] - half["model_states_GiB"] == pytest.approx(5 * n / GiB, rel=1e-9)
    g = PRESETS["a100-sxm4-80gb"]
    link, mem = host_link_GBps(g) * 1e9, host_memory_GBps(g) * 1e9
    assert link == pytest.approx(1.969 * 16 * 0.78 * 1e9) and mem == pytest.approx(409.6e9 * 0.7 / 8)
    # CPU Adam per core: ZeRO-Offload Table 4's least-squares slope (50.34 s per 185e9 parameters) over
    # 48 cores; the default host: 2 x 64 cores over the node's 8 GPUs
    rate, cores = cpu_adam_params_per_s_per_core(g), host_cores_per_gpu(g)
    assert rate == pytest.approx(185e18 / 50.34e9 / 48) and cores == 16
    assert n / (rate * cores) > 28 * n / mem                  # 16 cores step slower than memory streams
    copy, cpu = 4 * n / link, n / (rate * cores)              # one way over PCIe; CPU Adam on the cores
    # the GPU's own step is gone, the host's added (the cast back to bf16 is small: within 5 %)
    assert off["optimizer_s"] == pytest.approx(2 * copy + cpu, rel=0.05)
    assert lap["optimizer_s"] == pytest.approx(max(copy, cpu), rel=0.1)
    assert on["optimizer_s"] < lap["optimizer_s"] < off["optimizer_s"]
    assert half["optimizer_s"] == pytest.approx(0.5 * on["optimizer_s"] + 0.5 * (2 * copy + cpu), rel=0.05)
    for r in (off, lap, half):                                # the rest of the step is untouched
        assert r["iteration_time_s"] - r["optimizer_s"] == pytest.approx(on["iteration_time_s"] - on["optimizer_s"],
                                                                         rel=1e-9)


def _box(tmp_path, cores):
    """The A100 preset with a host of ``cores`` physical cores per GPU (its 35.84 GB/s of memory)."""
    f = tmp_path / "g.toml"
    f.write_text(f'[gpus.box]\nbase = "a100-sxm4-80gb"\nhost_cores_per_gpu = {cores}\n')
    return load_gpu_files([f], PRESETS, need_source=False)


@pytest.mark.parametrize("cores, bound", [(2.0, "cores"), (64.0, "memory")])
def test_the_cpu_step_is_the_slower_of_the_host_memory_and_the_host_cores(tmp_path, cores, bound):
    gpus = _box(tmp_path, cores)
    base, off = _rows({"gpu": "box"}, {"gpu": "box", **OFF}, gpus=gpus)
    n = base["model_states_GiB"] * GiB / (2 + 4 + 2 + 8)
    link, mem = 1.969 * 16 * 0.78 * 1e9, 409.6e9 * 0.7 / 8    # the A100's host link and memory
    rate = 185e18 / 50.34e9 / 48                              # CPU Adam, parameters/s per core
    by_cores, by_memory = n / (rate * cores), 28 * n / mem
    # 2 cores: 2.6 times the memory's time; 64 cores: a quarter of it, so memory bounds
    assert (by_cores > by_memory) == (bound == "cores")
    assert off["optimizer_s"] == pytest.approx(2 * 4 * n / link + max(by_cores, by_memory), rel=0.05)


def test_offload_makes_a_plan_fit_that_does_not():
    plain, off = _rows({"use_precision_aware_optimizer": False}, OFF)
    assert plain["status"] == "out_of_memory" and off["status"] == "ok"


def test_offload_needs_the_precision_aware_optimizer_and_a_fraction_in_range():
    with pytest.raises(InputError, match="use_precision_aware_optimizer"):
        _rows({"use_precision_aware_optimizer": False, **OFF})
    with pytest.raises(InputError, match="optimizer_offload_fraction"):
        _rows({**OFF, "optimizer_offload_fraction": 1.5})


def test_a_gpu_file_gives_its_own_host_side(tmp_path):
    f = tmp_path / "g.toml"
    f.write_text('[gpus.box]\nbase = "rtx4090-pcie-24gb"\nhost_memory_GBps = 20.0\nhost_link_GBps = 12.0\n'
                 'host_cores_per_gpu = 6\ncpu_adam_params_per_s_per_core = 1.5e8\n')
    box = load_gpu_files([f], PRESETS, need_source=False)["box"]
    assert host_memory_GBps(box) == 20.0 and host_link_GBps(box) == 12.0
    assert host_cores_per_gpu(box) == 6.0 and cpu_adam_params_per_s_per_core(box) == 1.5e8
    f.write_text('[gpus.box]\nbase = "rtx4090-pcie-24gb"\nhost_cores_per_gpu = -1\n')
    with pytest.raises(InputError, match="host_cores_per_gpu"):
        load_gpu_files([f], PRESETS, need_source=False)


def test_the_pcie_presets_give_their_hosts_own_side():
    """Each workstation / PCIe preset's file gives its host's memory and cores per GPU (a box of its
    class, with its source), in the range of a workstation's or a cloud server's share."""
    for name in ("rtx4090-pcie-24gb", "rtx5090-pcie-32gb", "rtx6000ada-pcie-48gb", "rtxa6000-pcie-48gb",
                 "l4-pcie-24gb", "l40s-pcie-48gb", "a10g-pcie-24gb", "mi210-pcie-64gb"):
        g = PRESETS[name]
        assert 10.0 <= g.host_memory_GBps <= 300.0 and 4.0 <= g.host_cores_per_gpu <= 64.0, name
        assert "host_cores_per_gpu: " in g.source and "host_memory_GBps: " in g.source, name


def test_the_export_names_megatrons_flags():
    row = _rows({**OFF, "optimizer_offload_fraction": 0.5, "overlap_cpu_optimizer_d2h_h2d": True})[0]
    args = list(megatron_args(row, 8).args)
    assert "--optimizer-cpu-offload" in args and "--overlap-cpu-optimizer-d2h-h2d" in args
    assert args[args.index("--optimizer-offload-fraction") + 1] == "0.5"
