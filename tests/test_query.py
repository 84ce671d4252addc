"""Pareto queries per group, and refusals that protect a reduced folder from wrong answers."""
from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from conftest import vouch_for_files
from vtrain_fast.engine import run as engine
from vtrain_fast.io.errors import InputError
from vtrain_fast.analysis.query import pareto, pareto_mask
from vtrain_fast.plan.spec import load_spec


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
    from vtrain_fast.io.writer import part_name, remove_leftovers
    folder = tmp_path / "f"
    folder.mkdir()
    mine, theirs = folder / (part_name(0) + ".tmp"), folder / (part_name(5) + ".tmp")
    mine.write_text("x")
    theirs.write_text("y")
    remove_leftovers(folder, range(0, 3))
    assert not mine.exists() and theirs.exists()


# ------------------------------------------------------------------ --where and short names
def _frontier_by_hand(folder, keep_row, objectives):
    rows = pl.read_parquet(str(folder / "part-*.parquet")).filter(pl.col("status") == "ok")
    rows = rows.filter(keep_row)
    vals = rows.select(objectives).to_numpy().astype(np.float64)
    return rows.filter(pl.Series(pareto_mask(vals)))


def test_where_keeps_the_frontier_of_the_plans_that_meet_it(tiny_sweep):
    limit = float(pl.read_parquet(str(tiny_sweep / "part-*.parquet")).filter(pl.col("status") == "ok")
                  ["memory_per_gpu_GiB"].median())
    objectives = ["iteration_time_s", "cost_usd"]
    got = pareto(tiny_sweep, objectives, all_columns=True,
                 where=[f"mem_GiB <= {limit}", "gpu == h100-sxm-80gb", "recompute!=none"])
    want = _frontier_by_hand(tiny_sweep, (pl.col("memory_per_gpu_GiB") <= limit)
                             & (pl.col("gpu").cast(pl.String) == "h100-sxm-80gb")
                             & (pl.col("recompute").cast(pl.String) != "none"), objectives)
    key = ["model", "num_gpus", "tp", "pp", "micro_batch_size", "global_batch_size", "recompute"]
    assert got.height == want.height > 0
    assert sorted(got.select(key).cast(pl.String).rows()) == sorted(want.select(key).cast(pl.String).rows())
    assert (got["memory_per_gpu_GiB"] <= limit).all()
    unconditional = pareto(tiny_sweep, objectives)
    assert sorted(unconditional.select(key).cast(pl.String).rows()) != sorted(got.select(key).cast(pl.String).rows())


def test_an_older_folder_reads_the_settings_it_lacks_as_priced_and_refuses_other_missing_columns(tiny_sweep, tmp_path):
    """A folder written before a setting existed was priced without it: its rows read the setting's
    value_before (the default, or grad_reduce_in_bf16's true); an output column it lacks is an
    input error naming the older version."""
    import shutil
    from vtrain_fast.analysis.query import scan_results
    from vtrain_fast.model.settings import BY_NAME
    old = tmp_path / "old"
    shutil.copytree(tiny_sweep, old)
    for part in old.glob("part-*.parquet"):
        pl.read_parquet(part).drop("sequence_parallel", "vpp", "grad_reduce_in_bf16", "offload_s").write_parquet(part)
    vouch_for_files(old)                    # an intact folder of an older version's columns
    rows = scan_results(old).collect()
    for name in ("sequence_parallel", "vpp", "grad_reduce_in_bf16"):
        assert rows[name].unique().to_list() == [BY_NAME[name].value_before()], name
    assert pareto(old, ["cost_usd"], by=["vpp"]).height > 0
    with pytest.raises(InputError, match="older vtrain_fast"):
        pareto(old, ["offload_s"])


@pytest.mark.parametrize("cond, needle", [
    ("memory_per_gpu_GiB=<72", "--where 'memory_per_gpu_GiB<=72'"), ("gpu=~h100", "--where 'gpu==h100'"), ("memory_per_gpu_GiB 72", "COLUMN OP VALUE"), ("memory<=72", "did you mean 'memory_per_gpu_GiB'"),
    ("mfu>=high", "finite number"), ("tp==2.5", "whole number"), ("iter_s<=nan", "finite"), ("status==ok", "other than status"), ("gpu==h100", "did you mean"), ("gpu<3", "== or !="), ("sequence_parallel==yes", "true or false"),
    ("tp>=", "COLUMN OP VALUE"),
])
def test_a_bad_where_names_the_condition_and_a_fix(tiny_sweep, cond, needle):
    with pytest.raises(InputError, match="--where") as e:
        pareto(tiny_sweep, ["cost_usd"], where=[cond])
    assert needle in str(e.value)


def test_short_table_headers_name_columns_on_the_command_line(tiny_sweep, cli):
    full = pareto(tiny_sweep, ["iteration_time_s", "memory_per_gpu_GiB"], ["micro_batch_size"])
    short = pareto(tiny_sweep, ["iter_s", "mem_GiB"], ["mbs"])
    assert full.equals(short)
    with pytest.raises(InputError, match="did you mean 'iteration_time_s'"):
        pareto(tiny_sweep, ["iter"])
    res = cli("pareto", tiny_sweep, "--minimize", "iter_s", "--minimize", "-mfu", "--by", "recomp",
              "--where", "gpus<=16")
    assert res.exit_code == 0 and "gpus<=16" in res.output, res.output


def test_a_narrow_table_names_the_differing_columns_it_leaves_out():
    from vtrain_fast.analysis.report import fit_columns
    df = pl.DataFrame({"model": ["m"] * 3, "dp": [1, 2, 4], "micro_batch_size": [1, 1, 2],
                       "iteration_time_s": [1.0, 2.0, 3.0], "cost_usd": [3.0, 2.0, 1.0]})
    shown, notes = fit_columns(df, 30, keep=("iteration_time_s", "cost_usd"))
    assert "dp" not in shown.columns and any("not shown" in n and "dp" in n for n in notes)
    assert any(n == "model = m" for n in notes)      # a column with one value is named with it


def test_breakdown_shows_components_that_add_up_to_the_iteration_time(tiny_sweep, cli, wide_console):
    from vtrain_fast.analysis.query import BREAKDOWN_COLUMNS
    front = pareto(tiny_sweep, ["cost_usd", "train_days"], breakdown=True)
    parts = front.select(BREAKDOWN_COLUMNS).to_numpy().sum(axis=1)
    assert np.allclose(parts, front["iteration_time_s"].to_numpy(), rtol=1e-9, atol=0.0)
    assert not set(BREAKDOWN_COLUMNS) & set(pareto(tiny_sweep, ["cost_usd", "train_days"]).columns)
    res = cli("pareto", tiny_sweep, "--breakdown", "--top", "2")
    assert res.exit_code == 0 and "bubble_s" in res.output, res.output
