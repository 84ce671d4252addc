"""Issue 25, a second round of hostile cases: a results folder's record of its machines (each GPU's
cluster values, the machine vectors, the spec text, the setting axes) agrees with itself or every
reader refuses it and a rerun writes it again; a GPU whose name holds a space gets its own HBM
capacity; `show` and `export` read plans on GPUs of your own (`--gpus`, a folder's spec tables, a
name in upper case); a torchtitan recipe is written only under a module name that imports as
itself; `--where` selects a value that ends in a quote."""
from __future__ import annotations

import json
import math
import re
import shutil

import polars as pl
import pytest
from typer.testing import CliRunner

from vtrain_fast.analysis.query import memory_capacity_GiB
from vtrain_fast.cli import app
from vtrain_fast.hardware.gpus import PRESETS, machine_vector
from vtrain_fast.model.records import HW_FIELDS

# A GPU of the spec's own: a space and quotes in its name, six GPUs a node, another GPU's memory.
BOX = "box 'six'"
BOX_BASE = "h200-sxm-141gb"
BOX_PER_NODE = 6
SPEC = f"""\
name = "rebreak"
[model]
presets = ["gpt3-125m"]
[training]
num_tokens = 1e9
global_batch_size = 48
micro_batch_size = [1, 2]
[cluster]
gpu = ["{BOX}", "h100-sxm-80gb"]
num_gpus = [8]
[parallel]
tp = [1, 2]
pp = [1]
[gpus."{BOX}"]
base = "{BOX_BASE}"
gpus_per_node = {BOX_PER_NODE}
"""


def _cli(*args):
    res = CliRunner().invoke(app, [str(a) for a in args])
    assert "Traceback" not in res.output, res.output
    return res


@pytest.fixture(scope="module")
def box_sweep(tmp_path_factory):
    folder = tmp_path_factory.mktemp("rebreak")
    (folder / "spec.toml").write_text(SPEC, encoding="utf-8")
    res = _cli("sweep", folder / "spec.toml", "-o", folder / "r")
    assert res.exit_code == 0, res.output
    return folder


def _geometry(text: str) -> tuple[int, int]:
    m = re.search(r"torchrun --nnodes (\d+) --nproc-per-node (\d+)", text)
    return int(m.group(1)), int(m.group(2))


# ---------------------------------------------------------------- a GPU name with a space
def test_a_gpu_name_with_a_space_has_its_own_memory_capacity():
    """The machine vectors' labels are the GPU's name and its setting-axis values: a name with a space
    is read from the label's end, so neither GPU takes the other's capacity."""
    big, small = "a100-sxm4-40gb big", "a100-sxm4-40gb"
    k = HW_FIELDS.index("hbm_bytes")
    for axes, suffix in (([], ""), (["vpp"], " vpp=1")):
        vectors = {big + suffix: machine_vector(PRESETS[BOX_BASE]).tolist(),
                   small + suffix: machine_vector(PRESETS[small]).tolist()}
        cap = memory_capacity_GiB({"setting_axes": axes, "machine_vectors": vectors, "gpus": {big: {}, small: {}}})
        assert cap[big] == pytest.approx(vectors[big + suffix][k] / 1024 ** 3)
        assert cap[small] == pytest.approx(PRESETS[small].hbm_GiB)


def test_pareto_marks_the_memory_of_a_gpu_named_with_a_space(box_sweep, tmp_path):
    out = tmp_path / "front.csv"
    res = _cli("pareto", box_sweep / "r", "--minimize", "cost_usd", "--minimize", "memory_per_gpu_GiB",
               "--by", "gpu", "-o", out)
    assert res.exit_code == 0, res.output
    df = pl.read_csv(out)
    assert set(df["gpu"]) == {BOX, "h100-sxm-80gb"}
    for r in df.iter_rows(named=True):
        hbm = PRESETS[BOX_BASE if r["gpu"] == BOX else r["gpu"]].hbm_GiB
        assert r["memory_headroom_GiB"] == pytest.approx(hbm - r["memory_per_gpu_GiB"], rel=1e-6), r["gpu"]


# ---------------------------------------------------------------- the manifest's machines
EDITS = {
    "no GPUs per node": lambda m: m["gpus"][BOX].update(gpus_per_node=0),
    "negative GPUs per node": lambda m: m["gpus"][BOX].update(gpus_per_node=-BOX_PER_NODE),
    "GPUs per node as text": lambda m: m["gpus"][BOX].update(gpus_per_node="6; touch X"),
    "infinite GPUs per node": lambda m: m["gpus"][BOX].update(gpus_per_node=math.inf),
    "GPUs per node not as priced": lambda m: m["gpus"][BOX].update(gpus_per_node=8),
    "a price not as priced": lambda m: m["gpus"][BOX].update(usd_per_gpu_hour=0.01),
    "a GPU's record gone": lambda m: m["gpus"].pop(BOX),
    "GPUs not a table": lambda m: m.update(gpus=[]),
    "machine vectors not a table": lambda m: m.update(machine_vectors=5),
    "a machine vector of text": lambda m: m["machine_vectors"].update({k: "x" for k in m["machine_vectors"]}),
    "spec not text": lambda m: m.update(spec=5),
    "setting axes not a list": lambda m: m.update(setting_axes="abc"),
}


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_a_manifest_at_odds_with_its_machines_is_refused_and_a_rerun_repairs_it(box_sweep, edit, tmp_path):
    folder = tmp_path / "r"
    shutil.copytree(box_sweep / "r", folder)
    path = folder / "manifest.json"
    manifest = json.loads(path.read_text())
    EDITS[edit](manifest)
    path.write_text(json.dumps(manifest))
    where = ["--where", f"gpu=={BOX}", "--where", "tp==1", "--where", "micro_batch_size==1"]
    for args in (["export", folder, *where], ["show", folder, *where],
                 ["pareto", folder, "--minimize", "cost_usd", "-o", tmp_path / "f.csv"],
                 ["plan", folder, "--deadline-days", "100"]):
        res = _cli(*args)
        assert res.exit_code == 2, (args[0], res.output)
        assert "manifest.json" in res.output and "rerun" in res.output, (args[0], res.output)
    assert not (tmp_path / "f.csv").exists()
    res = _cli("sweep", box_sweep / "spec.toml", "-o", folder)
    assert res.exit_code == 0, res.output
    res = _cli("export", folder, *where)
    assert res.exit_code == 0, res.output
    nodes, per = _geometry(res.output)
    assert nodes * per == 8 and per <= BOX_PER_NODE     # the 8 ranks priced, on nodes of six


# ---------------------------------------------------------------- GPUs of your own in show and export
def test_show_reads_a_folder_whose_gpu_its_spec_defines(box_sweep):
    res = _cli("show", box_sweep / "r", "--where", f"gpu=={BOX}", "--row", "0")
    assert res.exit_code == 0, res.output
    assert BOX in res.output


def test_show_and_export_read_a_table_on_a_gpu_of_a_gpus_file(tmp_path):
    """A GPU of a `--gpus` file, named in upper case as the file names it, in a plan table."""
    gpus = tmp_path / "gpus.toml"
    gpus.write_text('[gpus.MyBox]\nbase = "h100-sxm-80gb"\ngpus_per_node = 4\n', encoding="utf-8")
    table = tmp_path / "plan.csv"
    pl.DataFrame([dict(model="gpt3-125m", gpu="MyBox", tp=1, pp=1, dp=8, global_batch_size=8,
                       micro_batch_size=1)]).write_csv(table)
    res = _cli("evaluate", table, "-o", tmp_path / "out.csv", "--gpus", gpus)
    assert res.exit_code == 0, res.output
    assert pl.read_csv(tmp_path / "out.csv")["gpu"].to_list() == ["MyBox"]
    res = _cli("show", table, "--gpus", gpus)
    assert res.exit_code == 0, res.output
    res = _cli("export", table, "--gpus", gpus)
    assert res.exit_code == 0, res.output
    assert _geometry(res.output) == (2, 4)
    res = _cli("export", table)                 # without the file: refused, naming the option it has
    assert res.exit_code == 2 and "--gpus" in res.output


# ---------------------------------------------------------------- the torchtitan module name
LLAMA = dict(model="llama3-8b", gpu="h100-sxm-80gb", tp=2, pp=1, dp=4, global_batch_size=64, micro_batch_size=1,
             zero_stage=3, use_flash_attn="true", recompute="full")


@pytest.mark.parametrize("name", ["torchtitan.py", "torch.py", "json.py", "__init__.py", "\uff46oo.py"])
def test_a_recipe_module_name_that_does_not_import_as_itself_is_refused(name, tmp_path):
    table = tmp_path / "plan.csv"
    pl.DataFrame([LLAMA]).write_csv(table)
    res = _cli("export", table, "--to", "torchtitan", "-o", tmp_path / name)
    assert res.exit_code == 2, res.output
    assert not (tmp_path / name).exists()
    res = _cli("export", table, "--to", "torchtitan", "-o", tmp_path / "plan_ok.py")
    assert res.exit_code == 0, res.output


# ---------------------------------------------------------------- --where
def test_where_selects_a_value_that_ends_in_a_quote(box_sweep):
    for value in (BOX, f'"{BOX}"'):
        res = _cli("export", box_sweep / "r", "--where", f"gpu=={value}", "--where", "tp==1", "--row", "0")
        assert res.exit_code == 0, res.output
        assert f"priced on {BOX}:" in res.output


def test_show_prices_a_folders_plan_with_the_calibration_and_cluster_values_it_was_swept_with(tmp_path):
    """A sweep run with --calibration (and a [cluster] price) was shown re-priced with the shipped
    calibration and the preset's price: 0.039 s where the folder holds 0.054 s. show now takes the
    machines the manifest records."""
    from conftest import ONE_POINT_SPEC
    from vtrain_fast.analysis.export import plan_gpus, read_plan
    from vtrain_fast.analysis.show import show_plan
    spec = tmp_path / "one.toml"
    spec.write_text(ONE_POINT_SPEC.format(training="").replace('num_gpus = 8', 'num_gpus = 8\nusd_per_gpu_hour = 7.5'))
    cal = tmp_path / "cal.toml"
    cal.write_text("[a100-sxm4-80gb]\nhbm_efficiency = 0.4\nkernel_overhead_s = 2e-5\n")
    folder = tmp_path / "r"
    res = _cli("sweep", str(spec), "-o", str(folder), "--calibration", str(cal))
    assert res.exit_code == 0, res.output
    row = pl.read_parquet(folder / "part-000000.parquet").row(0, named=True)
    known = plan_gpus(folder)
    assert known["a100-sxm4-80gb"].usd_per_gpu_hour == 7.5
    assert known["a100-sxm4-80gb"].calibration.hbm_efficiency == 0.4
    chosen, _, _ = read_plan(folder, gpus=known)
    detail = show_plan(chosen, known, timeline=False)
    assert detail.time_s["iteration_time_s"] == pytest.approx(row["iteration_time_s"], rel=1e-12)
    shipped = show_plan(chosen, timeline=False).time_s["iteration_time_s"]
    assert not math.isclose(shipped, row["iteration_time_s"], rel_tol=1e-3)     # the test can tell them apart
    out = " ".join(_cli("show", str(folder)).output.split())
    assert f"iteration_time_s │ {row['iteration_time_s']:.4f}" in out, out


def test_torchtitan_refusal_names_the_distributed_optimizer_the_user_set(tmp_path):
    """A plan with distributed_optimizer = true (recorded as zero_stage 1) was refused as 'zero_stage = 1',
    a setting the user never wrote."""
    table = tmp_path / "p.csv"
    pl.DataFrame([{"model": "llama3-8b", "gpu": "h100-sxm-80gb", "global_batch_size": 64, "tp": 2, "pp": 1, "dp": 8,
                   "micro_batch_size": 1, "distributed_optimizer": True, "zero_stage": 1,
                   "recompute": "full"}]).write_csv(table)
    res = _cli("export", str(table), "--to", "torchtitan")
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and "distributed_optimizer = true is not allowed" in text, text
    assert "distributed_optimizer = false" in text
