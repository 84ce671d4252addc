"""CLI smoke tests on tiny inputs: sweep -> manifest + Parquet, pareto, evaluate, validate.
Every check compares against an independent computation (tests/reference.py, brute-force
dominance), never against numbers copied from a previous run."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest

import reference as ref
from conftest import ONE_POINT_SPEC, flat
from vtrain_fast.engine import run as engine
from vtrain_fast.analysis.evaluate import evaluate_frame
from vtrain_fast.plan.grid import build_grid
from vtrain_fast.hardware.gpus import PRESETS, machine_vector, with_overrides
from vtrain_fast.io.schema import SCHEMA, STATUS_LABELS
from vtrain_fast.plan.spec import RECOMPUTE_DEFAULT, load_spec, parse_spec


def _parts(folder: Path, manifest: dict) -> list[Path]:
    return [folder / p for p in manifest["parts"]]


def _read_results(folder: Path) -> tuple[dict, pl.DataFrame]:
    manifest = json.loads((folder / "manifest.json").read_text())
    df = pl.concat([pl.read_parquet(p) for p in _parts(folder, manifest)])
    return manifest, df


# ------------------------------------------------------------------------------ sweep
def test_sweep_writes_complete_manifest(tiny_sweep):
    spec = load_spec(tiny_sweep.parent / "tiny.toml")
    manifest = json.loads((tiny_sweep / "manifest.json").read_text())
    assert manifest["complete"] is True
    assert manifest["num_points"] == spec.num_points == math.prod(
        len(x) for x in (spec.models, spec.num_tokens, spec.gpus, spec.cluster_sizes, spec.tp,
                         spec.pp, spec.micro_batch_size, spec.global_batch_size, spec.recompute))
    assert manifest["num_rows"] == manifest["num_points"]
    parts = _parts(tiny_sweep, manifest)
    assert parts and all(p.is_file() for p in parts)
    assert not list(tiny_sweep.glob("*.tmp"))
    assert sum(pq.ParquetFile(p).metadata.num_rows for p in parts) == manifest["num_points"]
    counts = manifest["status_counts"]
    assert set(counts) <= set(STATUS_LABELS)
    assert sum(counts.values()) == manifest["num_points"]
    _, df = _read_results(tiny_sweep)
    observed = dict(df["status"].cast(pl.String).value_counts().rows())
    assert {k: v for k, v in counts.items() if v} == observed
    # the tiny grid is built to hit feasible, out-of-memory and infeasible rows
    assert observed.get("ok", 0) > 0 and observed.get("bad_num_gpus", 0) > 0
    assert observed.get("bad_batch", 0) > 0 and observed.get("out_of_memory", 0) > 0


def test_sweep_parquet_schema(tiny_sweep):
    manifest = json.loads((tiny_sweep / "manifest.json").read_text())
    schema = pq.read_schema(_parts(tiny_sweep, manifest)[0])
    assert schema.names == SCHEMA.names
    for f in SCHEMA:
        assert schema.field(f.name).type == f.type, f.name


def test_sweep_rows_cover_the_grid_and_match_twin(tiny_sweep):
    """Every grid point appears exactly once, and sampled rows equal the reference twin."""
    spec = load_spec(tiny_sweep.parent / "tiny.toml")
    grid = build_grid(spec)
    _, df = _read_results(tiny_sweep)
    key_cols = ["model", "gpu", "num_tokens", "num_gpus", "tp", "pp", "micro_batch_size",
                "global_batch_size", "recompute"]
    df = df.with_columns(pl.col(c).cast(pl.String) for c in ("model", "gpu", "recompute", "status"))
    assert df.select(key_cols).n_unique() == grid.num_points == df.height
    rows = {tuple(r[:len(key_cols)]): r for r in df.select(key_cols + [c for c in df.columns if c not in key_cols]).rows()}
    cols = key_cols + [c for c in df.columns if c not in key_cols]
    rng = np.random.default_rng(3)
    for index in rng.choice(grid.num_points, size=150, replace=False).tolist():
        inputs, tokens, status, out = ref.sweep_point(index, grid)
        key = (grid.model_names[inputs["model_index"]], grid.gpu_names[inputs["gpu_index"]], tokens,
               inputs["num_gpus"], inputs["tp"], inputs["pp"], inputs["micro_batch_size"],
               inputs["global_batch_size"], spec.recompute[
                   list(grid.recomputes).index(inputs["recompute"])])
        row = dict(zip(cols, rows[key]))
        assert row["status"] == STATUS_LABELS[status], (index, row["status"])
        for name in ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups",
                     "ffn_hidden_size", "vocab_size", "seq_length", "num_nodes", "dp"):
            assert row[name] == inputs[name], name
        for name, value in out.items():
            if math.isnan(value):
                assert row[name] is None or math.isnan(row[name]), name
            else:
                assert math.isclose(row[name], value, rel_tol=1e-12), (name, row[name], value)


def test_sweep_cli_prints_summary(tiny_spec_path, tmp_path, cli):
    res = cli("sweep", tiny_spec_path, "-o", tmp_path / "r", "--pareto")
    assert res.exit_code == 0, res.output
    assert "1,296 points" in res.output
    assert "Pareto frontier" in res.output


def test_sweep_overwrite_replaces_result(tiny_spec_path, tmp_path, cli):
    out = tmp_path / "r"
    assert cli("sweep", tiny_spec_path, "-o", out).exit_code == 0
    (out / "notes.txt").write_text("the user's own file")
    (out / "part-999999.parquet").write_text("a stale part of an older, larger sweep")
    res = cli("sweep", tiny_spec_path, "-o", out, "--overwrite")
    assert res.exit_code == 0, res.output
    assert (out / "notes.txt").read_text() == "the user's own file"     # not ours: kept
    assert not (out / "part-999999.parquet").exists()                   # ours: replaced
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] and manifest["num_rows"] == manifest["num_points"]


# ------------------------------------------------------------------------------ pareto
def _dominates(x, y):
    return all(a <= b for a, b in zip(x, y)) and any(a < b for a, b in zip(x, y))


def _check_frontier(front: list[tuple], feasible: list[tuple]):
    assert front, "empty frontier"
    fs = set(feasible)
    for f in front:
        assert f in fs, f"frontier row {f} is not a feasible row"
    for i, x in enumerate(front):
        for j, y in enumerate(front):
            if i != j:
                assert not _dominates(y, x), f"frontier row {x} is dominated by {y}"
                assert x != y, "duplicate frontier objectives"
    for r in feasible:
        assert any(f == r or _dominates(f, r) for f in front), f"feasible row {r} not covered"


@pytest.mark.parametrize("objectives", [
    ["cost_usd", "train_days"],
    ["-mfu", "memory_per_gpu_GiB"],
    ["cost_usd", "train_days", "memory_per_gpu_GiB"],
])
def test_pareto_frontier_is_brute_force_frontier(tiny_sweep, tmp_path, cli, objectives):
    out = tmp_path / "front.parquet"
    args = ["pareto", tiny_sweep, "-o", out]
    for o in objectives:
        args += ["--minimize", o]
    res = cli(*args)
    assert res.exit_code == 0, res.output
    assert "Pareto frontier" in res.output and "plans" in res.output
    for col in ("model", "tp", "pp", "dp", *[o.lstrip("-") for o in objectives]):
        assert col in res.output                                # the table's header
    front_df = pl.read_parquet(out)
    _, df = _read_results(tiny_sweep)
    feasible_df = df.filter(pl.col("status").cast(pl.String) == "ok")

    def objs(frame):
        cols = [pl.col(o.lstrip("-")) * (-1.0 if o.startswith("-") else 1.0) for o in objectives]
        return [tuple(r) for r in frame.select(cols).rows()]
    _check_frontier(objs(front_df), objs(feasible_df))
    assert f"({front_df.height} plans" in flat(res.output)


# ------------------------------------------------------------------------------ evaluate
EVAL_CSV = """\
name,num_layers,hidden_size,num_attention_heads,seq_length,global_batch_size,micro_batch_size,tp,pp,dp,gpu,recompute,num_tokens,gpus_per_node
small,12,768,12,2048,64,2,1,1,8,a100-sxm4-80gb,none,1e9,
small-pp,12,768,12,2048,64,2,2,2,4,h100-sxm-80gb,full,1e10,
gqa,8,1024,16,1024,32,1,2,2,2,a100-sxm4-40gb,,,4
bad-heads,12,768,12,2048,64,2,5,1,8,a100-sxm4-80gb,none,1e9,
bad-batch,12,768,12,2048,63,2,1,1,8,a100-sxm4-80gb,none,1e9,
huge,96,12288,96,2048,1536,1,1,1,8,a100-sxm4-80gb,none,3e11,
"""


def test_evaluate_csv(tmp_path, cli):
    csv = tmp_path / "configs.csv"
    csv.write_text(EVAL_CSV)
    out = tmp_path / "eval.parquet"
    res = cli("evaluate", csv, "-o", out)
    assert res.exit_code == 0, res.output
    df = pl.read_parquet(out)
    src = pl.read_csv(csv)
    assert df.height == src.height
    assert df["name"].to_list() == src["name"].to_list()      # extra columns pass through
    for row in df.iter_rows(named=True):
        gpn = row["gpus_per_node"]
        preset = with_overrides(PRESETS[row["gpu"]], None, gpus_per_node=int(gpn) if gpn else None)
        hw = machine_vector(preset).tolist()
        h, a = row["hidden_size"], row["num_attention_heads"]
        status, expected = ref.step(
            row["num_layers"], h, a, a, 4 * h, 50257, row["seq_length"],
            row["global_batch_size"], row["micro_batch_size"], row["tp"], row["pp"], row["dp"],
            1 if row["recompute"] == "full" else 0, row["num_tokens"], hw)
        assert row["status"] == STATUS_LABELS[status], row["name"]
        for name, value in expected.items():
            if math.isnan(value):
                assert row[name] is None or math.isnan(row[name]), (row["name"], name)
            else:
                assert math.isclose(row[name], value, rel_tol=1e-12), (row["name"], name)
        gpn = preset.gpus_per_node
        assert row["num_gpus"] == row["tp"] * row["pp"] * row["dp"], row["name"]
        assert row["num_nodes"] == -(-row["num_gpus"] // gpn), row["name"]
    # empty cells come back as the values used, not as nulls
    gqa = df.row(2, named=True)
    assert (gqa["recompute"], gqa["num_tokens"], gqa["ffn_hidden_size"]) == ("none", 300e9, 4 * 1024)
    by_name = dict(zip(df["name"], df["status"]))
    assert by_name["small"] == "ok" and by_name["bad-heads"] == "bad_heads"
    assert by_name["bad-batch"] == "bad_batch" and by_name["huge"] == "out_of_memory"
    assert "wrote 6 rows" in res.output


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-12)
    return a == b


def test_evaluate_rows_equal_sweep_rows(tiny_sweep):
    """A sweep row's inputs, evaluated as a CSV row, give the sweep row back: every column of
    the sweep schema but ``model`` (num_gpus and num_nodes included)."""
    _, df = _read_results(tiny_sweep)
    df = df.with_columns(pl.col(c).cast(pl.String) for c in ("model", "gpu", "recompute", "status"))
    rows = df.filter(pl.col("status") != "bad_num_gpus").sample(60, seed=5)
    inputs = rows.select("num_layers", "hidden_size", "num_attention_heads", "seq_length", "global_batch_size",
                         "micro_batch_size", "tp", "pp", "dp", "gpu", "recompute", "num_tokens")
    got = evaluate_frame(inputs)
    for name in SCHEMA.names:
        if name == "model":
            continue
        for a, b in zip(got[name].to_list(), rows[name].to_list()):
            assert _same(a, b), (name, a, b)


def test_sweep_and_evaluate_share_defaults(tmp_path):
    """A spec and a CSV row that leave out the same optional keys describe the same run."""
    spec = parse_spec(ONE_POINT_SPEC.format(training=""), "one.toml")
    engine.run_sweep(spec, tmp_path / "r")
    _, swept = _read_results(tmp_path / "r")
    swept = swept.with_columns(pl.col(c).cast(pl.String) for c in ("model", "gpu", "recompute", "status"))
    row = swept.select("num_layers", "hidden_size", "num_attention_heads", "seq_length", "global_batch_size",
                       "micro_batch_size", "tp", "pp", "dp", "gpu", "num_tokens")
    got = evaluate_frame(row)
    assert got["recompute"][0] == swept["recompute"][0] == RECOMPUTE_DEFAULT
    for name in SCHEMA.names:
        if name != "model":
            assert _same(got[name][0], swept[name][0]), name


def test_custom_shape_names_are_distinct_and_not_gpu_like():
    """Shapes from [model] lists get one name each; names never read like a GPU (L40, H100)."""
    spec = parse_spec(ONE_POINT_SPEC.format(training="").replace(
        'presets = ["gpt3-125m"]',
        "num_layers = [40, 100]\nhidden_size = 5120\nnum_attention_heads = 40\nseq_length = 2048\n"
        "ffn_hidden_size = [13824, 20480]\nnum_query_groups = [8, 40]"), "shapes.toml")
    names = [m.name for m in spec.models]
    assert len(names) == 8 == len(set(names))
    for name in names:
        assert name.startswith("custom-")
        assert not re.search(r"(^|-)[lhab]\d", name, re.IGNORECASE), name     # L40-, H100-, A100-
    m = spec.models[0]
    assert m.name == "custom-40L-5120h-40a-2048s-8kv-13824ffn"
    assert (m.num_layers, m.num_query_groups, m.ffn_hidden_size) == (40, 8, 13824)


# ------------------------------------------------------------------------------ validate
def test_validate_writes_parquet(tmp_path, cli):
    from vtrain_fast.analysis.validate import load_measurements
    out = tmp_path / "validation.parquet"
    res = cli("validate", "-o", out)
    assert res.exit_code == 0, res.output
    rows = pl.read_parquet(out)
    expected = sum(load_measurements(w).height for w in ("single", "multi"))
    assert rows.height == expected
    # every row priced, its error the written prediction's against the written measurement
    pred, measured = rows["iteration_time_s"].to_numpy(), rows["measured_iteration_time_s"].to_numpy()
    assert np.isfinite(pred).all() and (pred > 0).all()
    np.testing.assert_allclose(rows["ape_pct"].to_numpy(), np.abs(pred - measured) / measured * 100.0, rtol=1e-12)
    assert set(rows["set"].unique().to_list()) == {"single", "multi"}
    assert "MAPE" in res.output or "mape" in res.output


def test_readme_column_table_is_the_schema():
    """README's results-column table is generated from vtrain_fast.io.schema (regenerate it with
    schema.markdown_table() when a column changes)."""
    from vtrain_fast.io.schema import markdown_table
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    assert markdown_table() in readme
