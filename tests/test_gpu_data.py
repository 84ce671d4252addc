"""GPU presets as data files (vtrain_fast/data/gpus/*.toml) and a spec's own [gpus.<name>]."""
from __future__ import annotations

import dataclasses
import tomllib

import numpy as np
import pytest

from conftest import ONE_POINT_SPEC
from vtrain_fast.io.errors import InputError
from vtrain_fast.hardware.gpus import (GPU_DATA_DIR, GPU_FIELD_RANGES, GPU_FLAGS, OPTIONAL_GPU_FIELD_RANGES,
                                  PRESETS, load_gpu_files, machine_vector)
from vtrain_fast.plan.spec import parse_spec
from vtrain_fast.model.records import MACHINE

NUMBER_KEYS = set(GPU_FIELD_RANGES) | set(OPTIONAL_GPU_FIELD_RANGES) | set(GPU_FLAGS)


@pytest.mark.parametrize("path", sorted(GPU_DATA_DIR.glob("*.toml")), ids=lambda p: p.stem)
def test_every_shipped_gpu_number_has_a_source_and_a_date(path):
    doc = tomllib.loads(path.read_text())
    assert doc["name"] == path.stem and doc["name"] in PRESETS
    numbers = {k: v for k, v in doc.items() if k in NUMBER_KEYS}
    # a PCIe node derives intra_node_GBps from its link (pcie_gen, pcie_lanes, pcie_p2p)
    required = set(GPU_FIELD_RANGES) - ({"intra_node_GBps"} if doc.get("intra_node_link") == "pcie" else set())
    assert required <= set(numbers), required - set(numbers)
    for key, entry in numbers.items():
        assert isinstance(entry, dict) and entry["source"].strip() and entry["date"].strip(), key
    cal = doc.get("calibration", {})
    assert isinstance(cal.get("fitted"), bool) and cal.get("source", "").strip()
    assert PRESETS[doc["name"]].calibrated is cal["fitted"]


def test_a_gpu_file_number_without_its_source_is_refused(tmp_path):
    text = (GPU_DATA_DIR / "h100-sxm-80gb.toml").read_text().replace(
        'hbm_GBps = { value = 3350.0, source = "NVIDIA H100 Tensor Core GPU datasheet: 80 GB HBM3 at 3.35 TB/s", '
        'date = "2023" }', "hbm_GBps = 3350.0")
    assert "hbm_GBps = 3350.0" in text
    path = tmp_path / "h100.toml"
    path.write_text(text)
    with pytest.raises(InputError, match="hbm_GBps.*source and date"):
        load_gpu_files([path], PRESETS)


def _spec(gpus: str, gpu: str) -> str:
    return ONE_POINT_SPEC.format(training="").replace('gpu = "a100-sxm4-80gb"', f'gpu = ["{gpu}"]') + gpus


def test_a_spec_defines_a_gpu_from_a_preset_and_only_the_fields_it_gives_change():
    spec = parse_spec(_spec('[gpus.h100-nvl-94gb]\nbase = "h100-sxm-80gb"\npeak_bf16_tflops = 835.0\n'
                            'hbm_GiB = 87.5\ncalibration = { gemm_efficiency = 0.78 }\n', "h100-nvl-94gb"))
    (g,) = spec.gpus
    h100 = PRESETS["h100-sxm-80gb"]
    assert (g.name, g.peak_tflops, g.hbm_GiB, g.calibration.gemm_efficiency) == ("h100-nvl-94gb", 835.0, 87.5, 0.78)
    same = [f.name for f in dataclasses.fields(h100) if f.name not in ("name", "peak_tflops", "hbm_GiB",
                                                                         "calibration", "source")]
    assert all(getattr(g, k) == getattr(h100, k) for k in same)
    assert dataclasses.replace(g.calibration, gemm_efficiency=h100.calibration.gemm_efficiency) == h100.calibration
    assert "h100-nvl-94gb" not in PRESETS                      # the spec's own, not a preset


def test_a_copy_of_a_preset_prices_every_plan_as_the_preset():
    from vtrain_fast.plan.grid import build_grid
    a = parse_spec(_spec("", "h100-sxm-80gb"))
    b = parse_spec(_spec('[gpus.my-h100]\nbase = "h100-sxm-80gb"\n', "my-h100"))
    assert np.array_equal(build_grid(a).hw_table, build_grid(b).hw_table)
    assert np.array_equal(machine_vector(a.gpus[0]), machine_vector(PRESETS["h100-sxm-80gb"]))


def test_a_spec_table_named_after_a_preset_changes_it_for_that_spec_only():
    spec = parse_spec(_spec("[gpus.a100-sxm4-80gb]\nusd_per_gpu_hour = 1.1\n", "a100-sxm4-80gb"))
    assert spec.gpus[0].usd_per_gpu_hour == 1.1 and spec.gpus[0].calibrated     # a price keeps the fit
    spec = parse_spec(_spec("[gpus.a100-sxm4-80gb]\nhbm_GBps = 1935.0\n", "a100-sxm4-80gb"))
    assert spec.gpus[0].hbm_GBps == 1935.0 and not spec.gpus[0].calibrated      # another chip: not fitted
    assert PRESETS["a100-sxm4-80gb"].hbm_GBps == 2039.0 and PRESETS["a100-sxm4-80gb"].calibrated


def test_a_new_gpu_with_every_field_sweeps(tmp_path, write_spec, cli):
    fields = {"peak_bf16_tflops": 400.0, "hbm_GiB": 64.0, "hbm_GBps": 2000.0, "intra_node_GBps": 200.0,
              "gpus_per_node": 8, "inter_node_Gbps": 200.0, "num_sms": 100, "tdp_W": 500.0,
              "usd_per_gpu_hour": 1.5}
    table = "[gpus.labgpu]\n" + "".join(f"{k} = {v}\n" for k, v in fields.items())
    res = cli("sweep", write_spec(_spec(table, "labgpu")), "-o", tmp_path / "r")
    assert res.exit_code == 0, res.output
    assert "labgpu has no calibration fitted" in " ".join(res.output.split())


@pytest.mark.parametrize("table, needle", [
    ('[gpus.labgpu]\npeak_bf16_tflops = 400.0\n', "hbm_GiB is missing"),
    ('[gpus.labgpu]\nbase = "h100"\n', "base = 'h100'"),
    ('[gpus.labgpu]\nbase = "h100-sxm-80gb"\nhbm_gb = 80\n', "hbm_gb"),
    ('[gpus.labgpu]\nbase = "h100-sxm-80gb"\nhbm_GiB = -1\n', "hbm_GiB = -1"),
    ('[gpus.labgpu]\nbase = "h100-sxm-80gb"\ngpus_per_node = 8.5\n', "an integer"),
    ('[gpus.labgpu]\nbase = "h100-sxm-80gb"\ncalibration = { gemm_eff = 0.5 }\n', "calibration.gemm_eff"),
    ('[gpus.labgpu]\nbase = "labgpu"\n', "base"),
    ('gpus = 3\n', "[gpus.<name>] tables"),
    ('[gpus.labgpu]\nbase = "h100-sxm-80gb"\nnum_sms = ' + "1" + "0" * 400 + '\n', "num_sms"),
    ('[gpus.labgpu]\nbase = "h100-sxm-80gb"\ncalibration = { gemm_efficiency = ' + "1" + "0" * 400 + ' }\n',
     "calibration.gemm_efficiency"),
    ('[gpus.labgpu]\nbase = ["h100-sxm-80gb"]\n', "base"),
    ('[gpus.labgpu]\nbase = "h100-sxm-80gb"\ncalibration = { base = ["a"] }\n', "calibration.base"),
    ('[gpus.labgpu]\nbase = "h100-sxm-80gb"\nvendor = 7\n', "vendor"),
    # circles of bases name the key that closes them
    ('[gpus.labgpu]\nbase = "other"\n[gpus.other]\nbase = "labgpu"\n', "[gpus.labgpu]: base = 'other'"),
    ('[gpus.labgpu]\nbase = "h100-sxm-80gb"\ncalibration = { base = "other" }\n'
     '[gpus.other]\nbase = "h100-sxm-80gb"\ncalibration = { base = "labgpu" }\n', "calibration.base = 'other'"),
    ('[gpus.labgpu]\nbase = "h100-sxm-80gb"\nname = "zzz"\n', "name"),
    ('[gpus.labgpu]\nbase = "h100-sxm-80gb"\nreserved_GiB = 500\n', "reserved_GiB"),
    ('[gpus.labgpu]\nbase = "h100-sxm-80gb"\nhbm_GiB = 1.0\n', "hbm_GiB"),
])
def test_a_bad_gpu_table_names_the_key(table, needle):
    text = _spec(table, "labgpu")
    if table.startswith("gpus ="):
        text = "gpus = 3\n" + _spec("", "labgpu")
    with pytest.raises(InputError) as e:
        parse_spec(text, "s.toml")
    assert needle in str(e.value), str(e.value)


def test_presets_lists_the_gpus_of_a_gpus_file_too(cli, wide_console, tmp_path):
    f = tmp_path / "mine.toml"
    f.write_text('[gpus.lab-h100]\nbase = "h100-sxm-80gb"\nusd_per_gpu_hour = 1.9\n')
    res = cli("presets", "--gpus", str(f))
    assert res.exit_code == 0, res.output
    line = next(ln for ln in res.output.splitlines() if "lab-h100" in ln)
    assert "1.900" in line and "h100-sxm-80gb" in res.output
    bad = cli("presets", "--gpus", str(tmp_path / "none.toml"))
    assert bad.exit_code == 2 and "none.toml" in bad.output


def test_presets_lists_every_gpu_file(cli, wide_console):
    res = cli("presets")
    assert res.exit_code == 0, res.output
    for name in ("h200-sxm-141gb", "b200-hgx-180gb", "gb200-nvl72-186gb", "mi300x-oam-192gb"):
        assert name in PRESETS and name in res.output, name
    assert PRESETS["gb200-nvl72-186gb"].gpus_per_node == 72      # the NVL72 scale-up domain


@pytest.mark.parametrize("gpu", ["h200-sxm-141gb", "b200-hgx-180gb", "gb200-nvl72-186gb", "mi300x-oam-192gb"])
def test_a_new_preset_sweeps_and_says_it_is_not_calibrated(gpu, tmp_path, write_spec, cli):
    text = ONE_POINT_SPEC.format(training="use_flash_attn = true").replace('"a100-sxm4-80gb"', f'"{gpu}"')
    res = cli("sweep", write_spec(text), "-o", tmp_path / "r")
    assert res.exit_code == 0 and f"{gpu} has no calibration fitted" in " ".join(res.output.split()), res.output


def test_gpus_file_defines_gpus_for_sweep_and_evaluate(tmp_path, write_spec, cli):
    gpus = tmp_path / "my-gpus.toml"
    gpus.write_text('[gpus.h100-nvl-94gb]\nbase = "h100-sxm-80gb"\npeak_bf16_tflops = 835.0\nhbm_GiB = 87.5\n'
                    'hbm_GBps = 3900.0\n')
    spec = write_spec(_spec("", "h100-nvl-94gb"))
    res = cli("sweep", spec, "-o", tmp_path / "r")
    assert res.exit_code == 2 and "h100-nvl-94gb" in res.output                 # unknown without the file
    res = cli("sweep", spec, "-o", tmp_path / "r", "--gpus", gpus)
    assert res.exit_code == 0, res.output
    res = cli("pareto", tmp_path / "r", "-o", tmp_path / "f.csv")
    assert res.exit_code == 0 and "--gpus FILE" in " ".join(res.output.split()), res.output
    res = cli("evaluate", tmp_path / "f.csv", "-o", tmp_path / "e.csv", "--gpus", gpus)
    assert res.exit_code == 0, res.output
    import polars as pl
    front, again = pl.read_csv(tmp_path / "f.csv"), pl.read_csv(tmp_path / "e.csv")
    assert front["iteration_time_s"].to_list() == again["iteration_time_s"].to_list()
    bad = tmp_path / "bad.toml"
    bad.write_text('[gpus.x]\nbase = "h100-sxm-80gb"\nhbm_GiB = "lots"\n')
    res = cli("sweep", spec, "-o", tmp_path / "r2", "--gpus", bad)
    assert res.exit_code == 2 and "hbm_GiB" in res.output and "bad.toml" in " ".join(res.output.split())


@pytest.mark.parametrize("text", ["[gpus]\nx = 3\n", "gpus = 3\n", "gpus = [1]\n", '[gpus."a/b"]\nbase = "h100-sxm-80gb"\n'])
def test_a_bad_gpus_file_is_an_input_error(text, tmp_path):
    path = tmp_path / "g.toml"
    path.write_text(text)
    with pytest.raises(InputError):
        load_gpu_files([path], PRESETS, need_source=False)


def test_a_gpu_from_a_fitted_preset_with_other_hardware_is_not_called_calibrated():
    spec = parse_spec(_spec('[gpus.x]\nbase = "a100-sxm4-80gb"\npeak_bf16_tflops = 2250.0\n', "x"))
    assert not spec.gpus[0].calibrated
    spec = parse_spec(_spec('[gpus.x]\nbase = "a100-sxm4-80gb"\nusd_per_gpu_hour = 1.0\n', "x"))
    assert spec.gpus[0].calibrated                      # the same chip at another price


def test_a_spec_calibration_and_a_calibration_file_for_one_gpu_are_refused(tmp_path):
    from vtrain_fast.plan.spec import load_calibration
    cal = tmp_path / "c.toml"
    cal.write_text("[h100-sxm-80gb]\nhbm_efficiency = 0.7\n")
    text = _spec("[gpus.h100-sxm-80gb]\ncalibration = { gemm_efficiency = 0.9 }\n", "h100-sxm-80gb")
    with pytest.raises(InputError, match="one source of calibration"):
        parse_spec(text, "s.toml", load_calibration(cal))


# ---------------------------------------------------------------- per-precision GEMM peaks
# name -> (SMs or CUs, dense FP32 GEMM FLOP per clock per SM / CU without TF32, boost GHz): NVIDIA
# CUDA cores x 2 (an FMA) -- 64 FP32 lanes per SM on Volta and GA100, 128 on GH100, GA10x, Ada and
# Blackwell (the architecture whitepapers) -- and on AMD CDNA 2-4 the FP32 matrix (MFMA) rate, 256
# per CU (AMD datasheets: MI210 45.3, MI300X 163.4, MI355X 157.3 TFLOPS). Boost clocks as the
# presets' bf16 derivations use them. Blackwell data-center parts are left out: NVIDIA publishes no
# boost clock for them.
FP32_DERIVATION = {
    "a100-sxm4-40gb": (108, 128, 1.41), "a100-sxm4-80gb": (108, 128, 1.41), "v100-sxm2-32gb": (80, 128, 1.53),
    "h100-sxm-80gb": (132, 256, 1.98), "h200-sxm-141gb": (132, 256, 1.98), "h800-sxm-80gb": (132, 256, 1.98),
    "l4-pcie-24gb": (58, 256, 2.04), "l40s-pcie-48gb": (142, 256, 2.52), "a10g-pcie-24gb": (80, 256, 1.71),
    "rtx4090-pcie-24gb": (128, 256, 2.52), "rtx5090-pcie-32gb": (170, 256, 2.407),
    "rtx6000ada-pcie-48gb": (142, 256, 2.505), "rtxa6000-pcie-48gb": (84, 256, 1.80),
    "mi210-pcie-64gb": (104, 256, 1.70), "mi300x-oam-192gb": (304, 256, 2.1), "mi325x-oam-256gb": (304, 256, 2.1),
    "mi355x-oam-288gb": (256, 256, 2.4),
}
# Parts without TF32 tensor / matrix hardware: Volta, CDNA 2, CDNA 4 (gfx950 emulates it with BF16).
NO_TF32 = ("v100-sxm2-32gb", "mi210-pcie-64gb", "mi355x-oam-288gb")


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_gives_its_fp32_and_tf32_peaks_in_order(name):
    
    g = PRESETS[name]
    doc = tomllib.loads((GPU_DATA_DIR / f"{name}.toml").read_text())
    fp32, tf32, bf16 = g.peak_fp32_tflops, g.peak_tf32_tflops, g.peak_tflops
    assert "peak_fp32_tflops" in doc and "peak_tf32_tflops" in doc      # both given, a 0 with its reason
    assert 0.0 < fp32 <= 0.505 * bf16, (fp32, bf16)      # a CUDA-core / FP32-matrix rate, not a tensor one
    assert (tf32 == 0.0) == (name in NO_TF32), tf32
    if tf32 > 0.0:
        assert fp32 <= tf32 <= bf16, (fp32, tf32, bf16)      # fp32 = tf32 on GeForce and the A10G
    text = doc["peak_fp32_tflops"]["source"].lower()
    assert ("non-tensor" in text) if g.vendor == "nvidia" else ("matrix" in text and "mfma" in text), text
    if name in FP32_DERIVATION:                          # the datasheet figure is lanes x 2 x boost clock
        units, per_clock, ghz = FP32_DERIVATION[name]
        assert units == g.num_sms and fp32 == pytest.approx(units * per_clock * ghz / 1e3, rel=0.02)
    hw = machine_vector(g)
    assert (hw[MACHINE.peak_fp32_flops], hw[MACHINE.peak_tf32_flops]) == (fp32 * 1e12, tf32 * 1e12)
    assert hw[MACHINE.peak_flops] == bf16 * 1e12


def test_geforce_tf32_is_the_dense_fp32_accumulate_rate():
    for name in ("rtx4090-pcie-24gb", "rtx5090-pcie-32gb"):
        g = PRESETS[name]
        text = tomllib.loads((GPU_DATA_DIR / f"{name}.toml").read_text())["peak_tf32_tflops"]["source"]
        assert "dense" in text and "accumulates in FP32" in text, text
        assert g.peak_tf32_tflops == pytest.approx(g.peak_tflops / 2, rel=0.01)   # halved like BF16
    pro = PRESETS["rtx6000ada-pcie-48gb"]                # the same AD102 SM at the full rate
    assert pro.peak_tf32_tflops == pytest.approx(pro.peak_tflops / 2, rel=0.01)
    assert pro.peak_tf32_tflops > 2 * PRESETS["rtx4090-pcie-24gb"].peak_tf32_tflops


@pytest.mark.parametrize("value", ["-67.0", "6.7e7", "nan", '"fast"'])
def test_a_gpu_file_with_a_bad_fp32_peak_names_the_key(value, tmp_path):
    text = (GPU_DATA_DIR / "h100-sxm-80gb.toml").read_text()
    bad = text.replace("peak_fp32_tflops = { value = 67.0,", f"peak_fp32_tflops = {{ value = {value},")
    assert bad != text
    path = tmp_path / "h100.toml"
    path.write_text(bad)
    with pytest.raises(InputError) as e:
        load_gpu_files([path], PRESETS)
    message = str(e.value)
    assert "h100.toml" in message and "peak_fp32_tflops" in message and "from 0 to 1e+06" in message, message
    with pytest.raises(InputError, match="peak_fp32_tflops"):          # and in a spec's own GPU table
        parse_spec(_spec(f'[gpus.labgpu]\nbase = "h100-sxm-80gb"\npeak_fp32_tflops = {value}\n', "labgpu"))


# ---------------------------------------------------------------- model presets as data
def test_every_model_preset_comes_from_the_data_file_with_its_source():
    from vtrain_fast.plan.models import MODEL_PRESETS, MODELS_FILE
    doc = tomllib.loads(MODELS_FILE.read_text())
    assert list(doc["models"]) == list(MODEL_PRESETS)
    for name, t in doc["models"].items():
        assert t["source"] in doc["sources"], name
        assert MODEL_PRESETS[name].source.startswith(doc["sources"][t["source"]])


def test_a_spec_defines_a_named_model_shape(tmp_path, write_spec, cli):
    text = ONE_POINT_SPEC.format(training="").replace('presets = ["gpt3-125m"]', 'presets = ["my-1.5b"]') + (
        '[models."my-1.5b"]\nnum_layers = 24\nhidden_size = 2048\nnum_attention_heads = 16\nseq_length = 2048\n')
    spec = parse_spec(text, "s.toml")
    (m,) = spec.models
    assert (m.name, m.num_layers, m.ffn_hidden_size, m.num_query_groups) == ("my-1.5b", 24, 8192, 16)
    res = cli("sweep", write_spec(text), "-o", tmp_path / "r")
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("table, needle", [
    ("[models.m]\nnum_layers = 24\n", "hidden_size is missing"),
    ("[models.m]\nnum_layers = 24\nhidden_size = 2048\nnum_attention_heads = 16\nseq_length = 2048\nlayers = 3\n",
     "layers"),
    ("[models.m]\nnum_layers = 2.5\nhidden_size = 2048\nnum_attention_heads = 16\nseq_length = 2048\n", "num_layers"),
    ("[models.gpt3-125m]\nnum_layers = 2\nhidden_size = 2048\nnum_attention_heads = 16\nseq_length = 2048\n",
     "not a model preset"),
    ("[models.my-1.5b]\nnum_layers = 2\nhidden_size = 2048\nnum_attention_heads = 16\nseq_length = 2048\n",
     'quoted: [models."my-1.5b"]'),
    ("models = 3\n", "[models.<name>] tables"),
])
def test_a_bad_model_table_names_the_key(table, needle):
    text = ONE_POINT_SPEC.format(training="") + table
    if table.startswith("models ="):
        text = table + ONE_POINT_SPEC.format(training="")
    with pytest.raises(InputError) as e:
        parse_spec(text, "s.toml")
    assert needle in str(e.value), str(e.value)
