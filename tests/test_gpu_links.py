"""PCIe and workstation GPU presets (issue 16) and the intra-node link of a GPU file: nvlink,
pcie (intra_node_GBps derived from generation, lanes and peer-to-peer) or infinity_fabric."""
from __future__ import annotations

import math
import tomllib

import polars as pl
import pytest

from conftest import ONE_POINT_SPEC
from vtrain_fast.analysis.evaluate import evaluate_frame
from vtrain_fast.hardware.gpus import (GPU_DATA_DIR, PCIE_HOST_BOUNCE_FACTOR, PCIE_LANE_GBps, PCIE_P2P_FRACTION,
                                       PRESETS, intra_node_link_label, load_gpu_files, machine_vector,
                                       pcie_intra_node_GBps)
from vtrain_fast.io.errors import InputError
from vtrain_fast.plan.spec import parse_spec

# name -> (SMs or CUs, dense FP16/BF16 tensor FLOP per clock per SM at FP32 accumulate, boost GHz):
# the architecture whitepapers' per-SM rates (Ada and GA102 SM: 1,024 on data-center and
# professional cards, 512 on GeForce and the A10G; CDNA 2 CU: 1,024) and boost clocks. The
# preset's bf16 peak must be their product: a dense FP32-accumulate figure, not a sparse or an
# FP16-accumulate one.
NEW = {
    "l4-pcie-24gb": (58, 1024, 2.040),
    "l40s-pcie-48gb": (142, 1024, 2.520),
    "a10g-pcie-24gb": (80, 512, 1.710),
    "rtx4090-pcie-24gb": (128, 512, 2.520),
    "rtx5090-pcie-32gb": (170, 512, 2.407),
    "rtx6000ada-pcie-48gb": (142, 1024, 2.505),
    "rtxa6000-pcie-48gb": (84, 1024, 1.800),
    "mi210-pcie-64gb": (104, 1024, 1.700),
}
GEFORCE = ("rtx4090-pcie-24gb", "rtx5090-pcie-32gb")


@pytest.mark.parametrize("name", sorted(NEW))
def test_a_new_preset_loads_with_sourced_numbers_in_range(name):
    doc = tomllib.loads((GPU_DATA_DIR / f"{name}.toml").read_text())
    g = PRESETS[name]
    for key, entry in doc.items():
        if isinstance(entry, dict) and key != "calibration":
            assert entry["source"].strip() and entry["date"].strip(), key
            assert len(entry["source"]) > 20, key               # says where the number comes from
    sms, per_clock, ghz = NEW[name]
    assert g.num_sms == sms
    assert g.peak_tflops == pytest.approx(sms * per_clock * ghz / 1e3, rel=0.02)   # dense, FP32 accumulate
    assert 50.0 <= g.peak_tflops <= 400.0 and 20.0 <= g.hbm_GiB <= 65.0 and 250.0 <= g.hbm_GBps <= 1800.0
    assert 70.0 <= g.tdp_W <= 600.0 and g.gpus_per_node in (4, 8) and 0.1 <= g.usd_per_gpu_hour <= 5.0
    assert 1.0 <= g.inter_node_Gbps <= 100.0
    assert g.peak_fp16_tflops == g.peak_tflops
    assert g.peak_fp8_tflops == 0.0 or g.peak_fp8_tflops == pytest.approx(2 * g.peak_tflops, rel=0.02)
    assert not g.calibrated and doc["calibration"]["fitted"] is False
    if g.intra_node_link == "pcie":
        assert g.intra_node_GBps == pcie_intra_node_GBps(g.pcie_gen, g.pcie_lanes, g.pcie_p2p)
        assert g.intra_node_GBps < PCIE_LANE_GBps[g.pcie_gen] * g.pcie_lanes        # below the line rate
        assert g.calibration.intra_node_efficiency == 1.0     # the derived figure is the achievable one
        assert "intra_node_GBps" not in doc and "derived" in g.source
    else:
        assert (name, g.intra_node_link, g.intra_node_GBps) == ("mi210-pcie-64gb", "infinity_fabric", 150.0)


def test_geforce_presets_charge_the_fp32_accumulate_rate_and_have_no_p2p():
    for name in GEFORCE:
        g = PRESETS[name]
        doc = tomllib.loads((GPU_DATA_DIR / f"{name}.toml").read_text())
        text = doc["peak_bf16_tflops"]["source"]
        assert "FP32 accumulate" in text and "FP16 accumulate" in text, text   # which rate, and the other
        assert not g.pcie_p2p and intra_node_link_label(g).endswith("-host")
    for name in ("l40s-pcie-48gb", "rtx6000ada-pcie-48gb", "rtxa6000-pcie-48gb"):
        assert PRESETS[name].pcie_p2p                      # data-center and professional cards
    assert not PRESETS["a10g-pcie-24gb"].pcie_p2p and not PRESETS["l4-pcie-24gb"].pcie_p2p   # AWS g5 / g6


def test_the_pcie_derivation_by_hand():
    assert PCIE_LANE_GBps == {3: 0.985, 4: 1.969, 5: 3.938}
    assert (PCIE_P2P_FRACTION, PCIE_HOST_BOUNCE_FACTOR) == (0.78, 0.5)
    assert pcie_intra_node_GBps(4) == pytest.approx(1.969 * 16 * 0.78) == pytest.approx(24.57312)
    assert pcie_intra_node_GBps(4, 16, p2p=False) == pytest.approx(12.28656)
    assert pcie_intra_node_GBps(3, 16) == pytest.approx(0.985 * 16 * 0.78)
    assert pcie_intra_node_GBps(5, 8, p2p=False) == pytest.approx(3.938 * 8 * 0.78 / 2)
    assert pcie_intra_node_GBps(5, 16) == pytest.approx(2 * pcie_intra_node_GBps(4, 16), rel=1e-3)
    for bad in ((2, 16), (6, 16), (4, 12)):
        with pytest.raises(ValueError):
            pcie_intra_node_GBps(*bad)


def _spec(gpus: str, gpu: str) -> str:
    return ONE_POINT_SPEC.format(training="").replace('gpu = "a100-sxm4-80gb"', f'gpu = ["{gpu}"]') + gpus


def test_a_table_derives_the_bandwidth_of_its_pcie_link():
    spec = parse_spec(_spec('[gpus.h100-pcie-box]\nbase = "h100-sxm-80gb"\nintra_node_link = "pcie"\npcie_gen = 5\n',
                            "h100-pcie-box"))
    (g,) = spec.gpus
    assert (g.intra_node_link, g.pcie_gen, g.pcie_lanes, g.pcie_p2p) == ("pcie", 5, 16, True)
    assert g.intra_node_GBps == pytest.approx(3.938 * 16 * 0.78) and not g.calibrated
    assert machine_vector(g)[0] == machine_vector(PRESETS["h100-sxm-80gb"])[0]        # only the link moved
    # a PCIe base: the table's keys change its link, the others are inherited
    spec = parse_spec(_spec('[gpus.l40s-host]\nbase = "l40s-pcie-48gb"\npcie_p2p = false\n', "l40s-host"))
    assert spec.gpus[0].intra_node_GBps == pytest.approx(PRESETS["l40s-pcie-48gb"].intra_node_GBps / 2)
    spec = parse_spec(_spec('[gpus.l40s-x8]\nbase = "l40s-pcie-48gb"\npcie_lanes = 8\n', "l40s-x8"))
    assert spec.gpus[0].intra_node_GBps == pytest.approx(1.969 * 8 * 0.78)
    # leaving PCIe for NVLink: a measured figure of one's own, and the PCIe description goes
    spec = parse_spec(_spec('[gpus.l40s-nv]\nbase = "l40s-pcie-48gb"\nintra_node_link = "nvlink"\n'
                            'intra_node_GBps = 450.0\n', "l40s-nv"))
    assert (spec.gpus[0].intra_node_GBps, spec.gpus[0].pcie_gen, intra_node_link_label(spec.gpus[0])) == \
        (450.0, 0, "nvlink")
    assert PRESETS["l40s-pcie-48gb"].intra_node_GBps == pytest.approx(24.57312)         # the preset untouched


@pytest.mark.parametrize("table, needle", [
    # two sources for one figure: refused, whether the link is the table's or its base's
    ('base = "l40s-pcie-48gb"\nintra_node_GBps = 30.0\n', "intra_node_GBps = 30.0 is not allowed"),
    ('base = "h100-sxm-80gb"\nintra_node_link = "pcie"\npcie_gen = 4\nintra_node_GBps = 30.0\n', "derived from pcie_gen"),
    ('base = "h100-sxm-80gb"\nintra_node_link = "pcie"\n', "pcie_gen is missing"),
    ('base = "h100-sxm-80gb"\npcie_gen = 4\n', 'only with intra_node_link = "pcie"'),
    ('base = "h100-sxm-80gb"\nintra_node_link = "pcie"\npcie_gen = 6\n', "pcie_gen = 6"),
    ('base = "h100-sxm-80gb"\nintra_node_link = "pcie"\npcie_gen = 4\npcie_lanes = 12\n', "pcie_lanes = 12"),
    ('base = "h100-sxm-80gb"\nintra_node_link = "pcie"\npcie_gen = 4\npcie_p2p = 1\n', "pcie_p2p = 1"),
    ('base = "h100-sxm-80gb"\nintra_node_link = "nvswitch"\n', "intra_node_link = 'nvswitch'"),
    ('base = "l40s-pcie-48gb"\nintra_node_link = "nvlink"\n', "intra_node_GBps is missing"),
])
def test_a_bad_link_table_names_the_key(table, needle):
    with pytest.raises(InputError) as e:
        parse_spec(_spec("[gpus.labgpu]\n" + table, "labgpu"), "s.toml")
    assert needle in str(e.value), str(e.value)


def test_a_pcie_gpu_file_with_an_explicit_intra_node_GBps_is_refused(tmp_path):
    text = (GPU_DATA_DIR / "l40s-pcie-48gb.toml").read_text().replace('name = "l40s-pcie-48gb"', 'name = "my-l40s"')
    path = tmp_path / "my-l40s.toml"
    path.write_text(text)
    assert load_gpu_files([path], PRESETS)["my-l40s"].intra_node_GBps == PRESETS["l40s-pcie-48gb"].intra_node_GBps
    path.write_text(text.replace('intra_node_link = "pcie"\n', 'intra_node_link = "pcie"\nintra_node_GBps = '
                                 '{ value = 31.5, source = "PCIe 4.0 x16", date = "2024" }\n'))
    with pytest.raises(InputError, match="intra_node_GBps = 31.5 is not allowed.*derived"):
        load_gpu_files([path], PRESETS)
    # a new PCIe GPU needs no intra_node_GBps of its own
    fields = {"peak_bf16_tflops": 100.0, "hbm_GiB": 24.0, "hbm_GBps": 900.0, "gpus_per_node": 8,
              "inter_node_Gbps": 25.0, "num_sms": 60, "tdp_W": 300.0, "usd_per_gpu_hour": 1.0}
    path.write_text("[gpus.labcard]\n" + "".join(f"{k} = {v}\n" for k, v in fields.items())
                    + 'intra_node_link = "pcie"\npcie_gen = 3\npcie_p2p = false\n')
    g = load_gpu_files([path], PRESETS, need_source=False)["labcard"]
    assert g.intra_node_GBps == pytest.approx(0.985 * 16 * 0.78 / 2) and intra_node_link_label(g) == "pcie3x16-host"


PLAN = {"num_layers": 24, "hidden_size": 2048, "num_attention_heads": 16, "seq_length": 2048,
        "global_batch_size": 64, "micro_batch_size": 1, "pp": 1, "recompute": "none"}
# 128 MiB tensor-parallel all-reduces: the bandwidth term, not the per-collective latency, dominates
BIG = dict(PLAN, num_layers=4, hidden_size=8192, num_attention_heads=64, seq_length=8192, global_batch_size=8)


def test_a_pcie_node_makes_tensor_parallelism_slower_than_nvlink(tmp_path):
    gpus_file = tmp_path / "g.toml"
    gpus_file.write_text('[gpus.l40s-nvlink]\nbase = "l40s-pcie-48gb"\nintra_node_link = "nvlink"\n'
                         'intra_node_GBps = 450.0\n')
    gpus = {**PRESETS, **load_gpu_files([gpus_file], PRESETS, need_source=False)}
    pcie, nvlink = gpus["l40s-pcie-48gb"], gpus["l40s-nvlink"]
    assert nvlink.calibration == pcie.calibration          # the same GPU but for its link
    rows = [dict(plan, tp=tp, dp=dp, gpu=g) for plan, tp, dp in ((BIG, 8, 1), (PLAN, 1, 8), (PLAN, 1, 1))
            for g in ("l40s-pcie-48gb", "l40s-nvlink")]
    out = evaluate_frame(pl.DataFrame(rows), gpus=gpus)
    assert (out["status"] == "ok").all(), out["status"].to_list()
    (tp8_pcie, tp8_nv), (dp8_pcie, dp8_nv), (one_pcie, one_nv) = (out.slice(i, 2).to_dicts() for i in (0, 2, 4))
    ratio = nvlink.intra_node_GBps / pcie.intra_node_GBps                              # 18.3
    assert tp8_pcie["tp_comm_s"] > tp8_nv["tp_comm_s"] > 0
    # per-collective latencies (the same on both) keep the ratio a little below the bandwidths' (16.1)
    assert 0.8 * ratio < tp8_pcie["tp_comm_s"] / tp8_nv["tp_comm_s"] <= ratio
    assert tp8_pcie["iteration_time_s"] > tp8_nv["iteration_time_s"]
    assert tp8_pcie["compute_s"] == tp8_nv["compute_s"]
    # tp = 1: no tensor-parallel exchange on either; the compute is the same; the data-parallel
    # gradient all-reduce inside the node does see the slower link
    for a, b in ((dp8_pcie, dp8_nv), (one_pcie, one_nv)):
        assert a["tp_comm_s"] == b["tp_comm_s"] == 0.0 and a["compute_s"] == b["compute_s"]
    assert dp8_pcie["dp_comm_s"] > dp8_nv["dp_comm_s"]
    assert one_pcie["iteration_time_s"] == one_nv["iteration_time_s"]                  # one GPU: no link at all


def test_presets_show_the_link_of_every_gpu(cli, wide_console):
    res = cli("presets")
    assert res.exit_code == 0, res.output
    assert "link" in res.output
    rows = {ln.split()[1]: ln for ln in res.output.splitlines() if ln.startswith("│ ")}
    for name in NEW:
        assert name in rows, name
        assert intra_node_link_label(PRESETS[name]) in rows[name], rows[name]
    assert "pcie4x16-host" in rows["rtx4090-pcie-24gb"] and "nvlink" in rows["h100-sxm-80gb"]
    assert "infinity_fabric" in rows["mi300x-oam-192gb"]
    assert max(len(ln) for ln in res.output.splitlines()) <= 200                        # the table fits


@pytest.mark.parametrize("gpu", ["l40s-pcie-48gb", "rtx4090-pcie-24gb", "mi210-pcie-64gb"])
def test_a_new_preset_sweeps_and_says_it_is_not_calibrated(gpu, tmp_path, write_spec, cli):
    text = ONE_POINT_SPEC.format(training="use_flash_attn = true").replace('"a100-sxm4-80gb"', f'"{gpu}"')
    res = cli("sweep", write_spec(text), "-o", tmp_path / "r")
    assert res.exit_code == 0 and f"{gpu} has no calibration fitted" in " ".join(res.output.split()), res.output


def test_existing_presets_keep_their_numbers():
    # the links were added to the file format; no number of a preset that existed moved
    assert {n: PRESETS[n].intra_node_GBps for n in ("h100-sxm-80gb", "mi300x-oam-192gb", "a100-sxm4-80gb")} == \
        {"h100-sxm-80gb": 450.0, "mi300x-oam-192gb": 448.0, "a100-sxm4-80gb": 300.0}
    assert all(PRESETS[n].intra_node_link == "infinity_fabric" for n in PRESETS if n.startswith("mi"))
    assert all(PRESETS[n].intra_node_link == "nvlink" for n in PRESETS if PRESETS[n].vendor == "nvidia"
               and n not in NEW)
    assert not math.isnan(machine_vector(PRESETS["rtx5090-pcie-32gb"]).sum())
