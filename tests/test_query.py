"""Pareto queries per group, and refusals that protect a reduced folder from wrong answers."""
from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from vtrain_fast import engine
from vtrain_fast.errors import InputError
from vtrain_fast.query import pareto, pareto_mask
from vtrain_fast.spec import load_spec


def _brute_front(df: pl.DataFrame, objectives) -> set:
    vals = df.select(objectives).to_numpy()
    keep = set()
    for i, row in enumerate(vals):
        dominated = any(np.all(o <= row) and np.any(o < row) for o in vals)
        if not dominated:
            keep.add(tuple(row))
    return keep


def test_pareto_by_group_is_the_frontier_of_each_group(tiny_sweep):
    folder = tiny_sweep if not isinstance(tiny_sweep, tuple) else tiny_sweep[0]
    full = pl.read_parquet(str(folder / "part-*.parquet")).filter(pl.col("status") == "ok")
    front = pareto(folder, ["cost_usd", "train_days"], by=["gpu"])
    assert set(front["gpu"].unique()) == set(full["gpu"].unique())
    for gpu in full["gpu"].unique():
        got = {tuple(r) for r in front.filter(pl.col("gpu") == gpu).select("cost_usd", "train_days").rows()}
        assert got == _brute_front(full.filter(pl.col("gpu") == gpu), ["cost_usd", "train_days"])
    # the global frontier is a subset of the union of the group frontiers
    glob = {tuple(r) for r in pareto(folder, ["cost_usd", "train_days"]).select("cost_usd", "train_days").rows()}
    assert glob <= {tuple(r) for r in front.select("cost_usd", "train_days").rows()}


def test_pareto_by_unknown_column_is_refused(tiny_sweep):
    folder = tiny_sweep if not isinstance(tiny_sweep, tuple) else tiny_sweep[0]
    with pytest.raises(InputError, match="--by"):
        pareto(folder, ["cost_usd"], by=["mfu"])


def test_frontier_folder_refuses_other_objectives(tiny_spec_path, tmp_path):
    spec = load_spec(tiny_spec_path)
    folder = tmp_path / "front"
    engine.run_sweep(spec, folder, keep="frontier", minimize=["cost_usd", "train_days"])
    assert pareto(folder, ["train_days", "cost_usd"]).height > 0      # same set, any order
    with pytest.raises(InputError, match="reduced with"):
        pareto(folder, ["cost_usd", "-mfu"])


def test_pareto_mask_keeps_first_of_ties():
    v = np.array([[1.0, 2.0], [1.0, 2.0], [0.5, 3.0]])
    assert pareto_mask(v).tolist() == [True, False, True]


def test_reduced_folders_refuse_queries_they_cannot_answer(tiny_spec_path, tmp_path):
    spec = load_spec(tiny_spec_path)
    front, top = tmp_path / "front", tmp_path / "top"
    engine.run_sweep(spec, front, keep="frontier", minimize=["cost_usd", "train_days"])
    engine.run_sweep(spec, top, keep="top:5:cost_usd")
    with pytest.raises(InputError, match="--by"):
        pareto(front, ["cost_usd", "train_days"], by=["gpu"])
    with pytest.raises(InputError, match="top"):
        pareto(top, ["cost_usd", "train_days"])


def test_shard_resume_leaves_other_shards_temporary_files_alone(tiny_spec_path, tmp_path):
    from vtrain_fast.writer import part_name, remove_leftovers
    folder = tmp_path / "f"
    folder.mkdir()
    mine, theirs = folder / (part_name(0) + ".tmp"), folder / (part_name(5) + ".tmp")
    mine.write_text("x")
    theirs.write_text("y")
    remove_leftovers(folder, range(0, 3))
    assert not mine.exists() and theirs.exists()
