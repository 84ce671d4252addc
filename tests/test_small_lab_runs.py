"""small_lab_runs.csv (docs/small-lab-measurements.md): public measurements on mid-range / PCIe GPUs.

The file parses, every row cites a source with a URL and its caveats, its measured seconds per
iteration follow from the stated metric, and `evaluate` prices every row (a finite, positive
iteration time). Nothing here checks a prediction against the measurement: the rows are held out,
and their errors are reported in the doc, not asserted."""
from __future__ import annotations

import math
from pathlib import Path

import polars as pl
import pytest

from vtrain_fast.analysis.evaluate import evaluate_frame, read_csv

CSV = Path(__file__).resolve().parents[1] / "vtrain_fast" / "data" / "published" / "small_lab_runs.csv"
CITATION = ("id", "source", "url", "date", "table_or_figure", "framework", "measured_metric", "measured_value",
            "measured_unit", "measured_iteration_time_s", "mapping", "caveats")


@pytest.fixture(scope="module")
def runs():
    return read_csv(CSV)


@pytest.fixture(scope="module")
def priced(runs):
    return evaluate_frame(runs, str(CSV))


def test_the_file_parses_with_unique_ids_and_citation_columns(runs):
    assert runs.height >= 10
    assert runs["id"].n_unique() == runs.height
    for col in CITATION:
        assert col in runs.columns, col
        assert runs[col].null_count() == 0, col


def test_every_row_names_a_source_url_and_a_date(runs):
    for r in runs.iter_rows(named=True):
        assert "https://" in r["url"], r["id"]
        assert len(str(r["date"])) >= 7 and str(r["date"])[:2] == "20", r["id"]
        assert r["mapping"] in ("direct", "approximate"), r["id"]
        if r["mapping"] == "approximate":       # an approximate row says what was approximated
            assert "R5" in r["caveats"] or "R7" in r["caveats"], r["id"]


def test_measured_seconds_per_iteration_follow_the_stated_metric(runs):
    for r in runs.iter_rows(named=True):
        tokens = r["global_batch_size"] * r["seq_length"]
        it, v = r["measured_iteration_time_s"], r["measured_value"]
        if r["measured_metric"] == "iteration_time":
            assert r["measured_unit"] == "s" and it == pytest.approx(v), r["id"]
        elif r["measured_metric"] == "tokens_per_s":
            assert r["measured_unit"] == "tokens/s" and it == pytest.approx(tokens / v, rel=1e-3), r["id"]
        else:                                   # nanoGPT's MFU against the A100 peak (its estimate_mfu)
            assert r["measured_metric"] == "mfu_a100_peak", r["id"]
            assert 0 < v < 1 and 0 < it < 10, r["id"]


def test_evaluate_prices_every_row(runs, priced):
    assert priced.height == runs.height
    assert priced["id"].to_list() == runs["id"].to_list()
    for r in priced.iter_rows(named=True):
        assert r["status"] in ("ok", "out_of_memory"), (r["id"], r["status"])
        assert math.isfinite(r["iteration_time_s"]) and r["iteration_time_s"] > 0, r["id"]
    assert set(priced["gpu"].unique()) <= {"rtx4090-pcie-24gb", "l40s-pcie-48gb", "rtx5090-pcie-32gb",
                                           "h100-sxm-80gb"}


def test_the_plan_columns_are_those_the_rows_state(runs, priced):
    """evaluate keeps each row's plan: dp x tp x pp GPUs, the stated micro-batch and precision."""
    joined = runs.select("id", "num_gpus", "micro_batch_size", "precision").join(
        priced.select("id", pl.col("num_gpus").alias("n_priced"), pl.col("micro_batch_size").alias("mbs_priced"),
                      pl.col("precision").alias("precision_priced")), on="id")
    assert (joined["num_gpus"] == joined["n_priced"]).all()
    assert (joined["micro_batch_size"] == joined["mbs_priced"]).all()
    assert (joined["precision"] == joined["precision_priced"]).all()


def test_every_row_states_its_gradient_dtype_and_where_it_comes_from(runs, priced):
    """R8: each stack's gradient dtype is a column of its own (left out, bf16 / fp8 plans would be
    priced with Megatron-LM's fp32 main gradients), and the caveats say where it was read."""
    assert "grad_reduce_in_bf16" in runs.columns
    assert runs["grad_reduce_in_bf16"].dtype == pl.Boolean and runs["grad_reduce_in_bf16"].null_count() == 0
    for r in runs.iter_rows(named=True):
        stated = "true" if r["grad_reduce_in_bf16"] else "false"
        assert f"(grad_reduce_in_bf16 {stated}, R8)" in r["caveats"], r["id"]
    assert priced["grad_reduce_in_bf16"].to_list() == runs["grad_reduce_in_bf16"].to_list()
