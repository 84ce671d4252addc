"""Issue 25, parts 4 and 5: commands that ran for minutes answer in seconds or refuse up front
with the size the work would take, and a results folder's manifest agrees with itself (chunks,
parts, files, counts, the grid's size) or every reader refuses it and a rerun rebuilds it.

The slow cases run the CLI in a subprocess with a timeout, so that a command that hangs fails
the test instead of hanging the suite (before these changes each ran past the timeout)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from conftest import TINY_SPEC, flat
from vtrain_fast.analysis.advise import data_parallel_size
from vtrain_fast.analysis.show import MAX_TIMELINE_OPS, _busy_by_column
from vtrain_fast.engine import run as engine
from vtrain_fast.plan.spec import MAX_MACHINES, MAX_MODEL_SHAPES, load_spec

# Generous: the machine running the suite may be loaded; the old code took minutes.
BOUND_S = 30
TIMEOUT_S = 60
CHUNKS = dict(chunk_points=256, batch_points=128)        # six chunks of the tiny grid


def _cli(*args, cwd=None) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.perf_counter()
    try:
        res = subprocess.run([sys.executable, "-m", "vtrain_fast", *map(str, args)], capture_output=True,
                             text=True, timeout=TIMEOUT_S, cwd=cwd, env={**os.environ, "COLUMNS": "200"})
    except subprocess.TimeoutExpired:
        pytest.fail(f"vtrain-fast {' '.join(map(str, args))} ran past {TIMEOUT_S} s")
    return res, time.perf_counter() - t0


# ------------------------------------------------------------------------------------------ hangs
def test_data_parallel_size_is_the_largest_divisor_up_to_the_bound():
    rng = np.random.default_rng(7)
    for _ in range(3000):
        plan = {"tp": int(rng.choice([1, 2, 3, 8])), "pp": int(rng.choice([1, 2, 5])),
                "micro_batch_size": int(rng.choice([1, 2, 3, 4, 7]))}
        gpus, gbs = int(rng.integers(1, 2000)), int(rng.integers(1, 5000))
        most = gpus // (plan["tp"] * plan["pp"])
        want = next((d for d in range(most, 0, -1) if gbs % (d * plan["micro_batch_size"]) == 0), None)
        assert data_parallel_size(plan, gpus, gbs) == want, (plan, gpus, gbs)


def test_advise_on_the_largest_gpu_count_answers_in_seconds():
    res, took = _cli("advise", "--model", "gpt3-175b", "--gpus", "a100-sxm4-80gb:10000000")
    assert res.returncode == 0, res.stderr
    assert took < BOUND_S, took
    assert "dp 2048 is the largest size" in flat(res.stdout)


def _values(start: int, n: int) -> str:
    return "[" + ", ".join(str(start + i) for i in range(n)) + "]"


def _spec(tmp_path: Path, model: str, training: str = "", parallel: str = "") -> Path:
    path = tmp_path / "big.toml"
    path.write_text(f"""name = "big"
[model]
{model}
[training]
num_tokens = [1e12]
global_batch_size = [512]
micro_batch_size = [1]
{training}
[cluster]
gpu = ["a100-sxm4-80gb"]
num_gpus = [256]
[parallel]
tp = [1]
pp = [1]
{parallel}
""")
    return path


def test_a_dry_run_of_1e12_model_shapes_is_refused_up_front_with_its_size(tmp_path):
    spec = _spec(tmp_path, f"num_layers = {_values(1, 1000)}\nhidden_size = {_values(64, 1000)}\n"
                 f"num_attention_heads = {_values(1, 1000)}\nseq_length = {_values(128, 1000)}")
    res, took = _cli("sweep", spec, "--dry-run", "-o", tmp_path / "out")
    out = flat(res.stderr + res.stdout)
    assert res.returncode == 2, out
    assert took < BOUND_S, took
    assert "1,000,000,000,000 model shapes" in out and f"at most {MAX_MODEL_SHAPES:,} model shapes" in out
    assert "Traceback" not in out and not (tmp_path / "out").exists()


def test_a_gpu_axis_of_too_many_machines_is_refused_up_front_with_its_size(tmp_path):
    spec = _spec(tmp_path, 'presets = ["gpt3-125m"]', f"dp_shard = {_values(0, 300)}",
                 f"ep = {_values(1, 300)}")                     # 90,000 setting combinations
    res, took = _cli("sweep", spec, "--dry-run", "-o", tmp_path / "out")
    out = flat(res.stderr + res.stdout)
    assert res.returncode == 2, out
    assert took < BOUND_S, took
    assert "90,000 machines" in out and f"at most {MAX_MACHINES:,} machines" in out


def _plan_csv(tmp_path: Path, pp: int, gbs: int) -> Path:
    path = tmp_path / f"plan-{pp}-{gbs}.csv"
    pl.DataFrame([dict(model="gpt3-175b", gpu="a100-sxm4-80gb", global_batch_size=gbs, micro_batch_size=1, tp=8,
                       pp=pp, dp=1, use_flash_attn="true", recompute="full")]).write_csv(path)
    return path


def test_the_timeline_of_a_plan_with_many_micro_batches_is_drawn_in_seconds(tmp_path):
    # pp 32 x 2,048 micro-batches: 262,144 events, more per stage than the figure has pixel columns
    png = tmp_path / "t.png"
    res, took = _cli("show", _plan_csv(tmp_path, 32, 2048), "--timeline", png)
    assert res.returncode == 0, res.stderr
    assert took < BOUND_S, took
    assert png.stat().st_size > 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_timeline_beyond_the_limit_is_refused_with_its_size(tmp_path):
    # pp 96 x 12,288 micro-batches: 2,359,296 operations
    ops = 2 * 96 * 12288
    assert ops > MAX_TIMELINE_OPS
    for option in ("--timeline", "--events"):
        out_file = tmp_path / ("t.png" if option == "--timeline" else "e.csv")
        res, took = _cli("show", _plan_csv(tmp_path, 96, 12288), option, out_file)
        out = flat(res.stderr + res.stdout)
        assert res.returncode == 2, out
        assert took < BOUND_S, took
        assert f"{ops:,} operations" in out and f"at most {MAX_TIMELINE_OPS:,}" in out and not out_file.exists()


def test_the_aggregated_timeline_adds_up_each_columns_busy_time():
    rng = np.random.default_rng(3)
    gaps, durs = rng.uniform(0, 1, 500), rng.uniform(0, 1, 500)
    starts = np.cumsum(gaps + np.concatenate(([0.0], durs[:-1])))
    ends = starts + durs
    edges = np.linspace(0.0, ends[-1] + 1.0, 97)
    got = _busy_by_column(starts, ends, edges)
    want = [np.clip(np.minimum(ends, b) - np.maximum(starts, a), 0, None).sum() for a, b in zip(edges[:-1], edges[1:])]
    assert np.allclose(got, want, atol=1e-9)
    assert got.sum() == pytest.approx(durs.sum())


# --------------------------------------------------------------------------------------- manifest
@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """The tiny grid swept keep all in six chunks, and its spec."""
    base = tmp_path_factory.mktemp("manifest")
    spec = base / "tiny.toml"
    spec.write_text(TINY_SPEC, encoding="utf-8")
    folder = base / "pristine"
    engine.run_sweep(load_spec(spec), folder, **CHUNKS)
    return spec, folder


def _copy(pristine, tmp_path) -> Path:
    folder = tmp_path / "edited"
    shutil.copytree(pristine[1], folder, ignore=shutil.ignore_patterns(".lock*"))
    return folder


def _edit(folder: Path, change) -> None:
    path = folder / "manifest.json"
    m = json.loads(path.read_text())
    change(m)
    path.write_text(json.dumps(m, indent=1))


def _drop_part(m: dict) -> None:
    """Remove a chunk's part from parts, files and num_rows while chunks still lists it."""
    name = m["parts"][2]
    m["parts"].remove(name)
    m["num_rows"] -= m["files"].pop(name)["rows"]


def _rows_moved(m: dict) -> None:
    """One part's recorded rows and num_rows edited alike: num_rows no longer the chunks' rows."""
    name = m["parts"][0]
    m["files"][name]["rows"] -= 5
    m["num_rows"] -= 5


def _counts(m: dict) -> None:
    m["status_counts"]["ok"] += 7


def _grid(m: dict) -> None:
    m["num_points"] *= 2


def _spec_grid(m: dict) -> None:
    """The recorded spec sweeps a third global batch size: its grid is 3/2 of the plan's points, while
    every other field agrees with the chunks (only the spec's parse sees it)."""
    assert "global_batch_size = [48, 96]" in m["spec"]
    m["spec"] = m["spec"].replace("global_batch_size = [48, 96]", "global_batch_size = [48, 96, 192]")


EDITS = {"a part dropped from parts, files and num_rows": (_drop_part, "parts"),
         "the recorded spec's grid unlike the plan's": (_spec_grid, "plan.num_points"),
         "num_rows and a file's rows unlike the chunks'": (_rows_moved, "files.part-000000.parquet"),
         "status counts unlike the chunks'": (_counts, "status_counts"),
         "the grid's size unlike the plan's": (_grid, "num_points")}


@pytest.mark.parametrize("what", sorted(EDITS))
def test_a_manifest_at_odds_with_its_chunks_is_refused_by_every_reader(pristine, tmp_path, cli, what):
    change, field = EDITS[what]
    folder = _copy(pristine, tmp_path)
    _edit(folder, change)
    for args in (["pareto", folder], ["report", folder, "-o", tmp_path / "rep"],
                 ["plan", folder, "--deadline-days", "30"], ["show", folder]):
        res = cli(*args)
        out = flat(res.output)
        assert res.exit_code == 2, (args, out)
        assert "manifest.json" in out and field in out and "Traceback" not in out, (args, out)


@pytest.mark.parametrize("what", sorted(EDITS))
def test_a_rerun_rebuilds_a_manifest_at_odds_with_its_chunks(pristine, tmp_path, what):
    spec, clean = pristine
    folder = _copy(pristine, tmp_path)
    _edit(folder, EDITS[what][0])
    notes = []
    engine.run_sweep(load_spec(spec), folder, on_note=notes.append, **CHUNKS)
    assert any("manifest.json" in n for n in notes), notes
    got, want = (json.loads((f / "manifest.json").read_text()) for f in (folder, clean))
    for key in ("parts", "files", "num_rows", "status_counts", "pruned_points", "num_points", "chunks", "complete"):
        assert got[key] == want[key], key
    from vtrain_fast.analysis.query import pareto
    assert pareto(folder, ["cost_usd", "train_days"]).equals(pareto(clean, ["cost_usd", "train_days"]))


def test_the_sweep_command_rebuilds_a_finished_folder_whose_manifest_disagrees(tmp_path, cli):
    spec = tmp_path / "tiny.toml"
    spec.write_text(TINY_SPEC, encoding="utf-8")
    folder = tmp_path / "out"
    assert cli("sweep", spec, "-o", folder).exit_code == 0
    want = json.loads((folder / "manifest.json").read_text())
    _edit(folder, _counts)
    res = cli("sweep", spec, "-o", folder)
    assert res.exit_code == 0, res.output
    assert "manifest.json is at odds with its chunks" in flat(res.output)
    got = json.loads((folder / "manifest.json").read_text())
    assert got["status_counts"] == want["status_counts"] and got["parts"] == want["parts"]
    assert cli("pareto", folder).exit_code == 0


def _duplicate_chunk(text: str) -> str:
    """The manifest text with chunk 1's entry listed a second time (the one JSON keeps)."""
    m = json.loads(text)
    first = json.dumps(m["chunks"]["1"])
    return text.replace('"chunks": {', '"chunks": {"1": ' + first + ", ", 1)


def _absent_part(folder: Path) -> None:
    m = json.loads((folder / "manifest.json").read_text())
    (folder / m["parts"][1]).unlink()


@pytest.mark.parametrize("what", ["chunk listed twice", "part file listed but absent"])
def test_other_disagreements_are_refused(pristine, tmp_path, cli, what):
    folder = _copy(pristine, tmp_path)
    path = folder / "manifest.json"
    if what == "chunk listed twice":
        text = json.dumps(json.loads(path.read_text()))
        path.write_text(_duplicate_chunk(text))
        assert json.loads(path.read_text()) == json.loads(text)     # json alone would read it as intact
        needle = "listed twice"
    else:
        _absent_part(folder)
        needle = "missing"
    for args in (["pareto", folder], ["plan", folder, "--deadline-days", "30"], ["show", folder]):
        res = cli(*args)
        out = flat(res.output)
        assert res.exit_code == 2 and needle in out and "Traceback" not in out, (args, out)
