"""validate --set moe: every published MoE row is priced or has one reason, the metric
conversions follow MOE_README.md, the model's own refusal is the reason of the rows it refuses
(so they are priced once it stops refusing them), and the command reports and writes Parquet."""
from __future__ import annotations

import math

import polars as pl
import pytest
from typer.testing import CliRunner

from vtrain_fast.analysis import published_moe as M
from vtrain_fast.cli import app
from vtrain_fast.plan.models import MODEL_PRESETS
from vtrain_fast.model.moe import unpriced_reason


@pytest.fixture(scope="module")
def runs():
    return M.load_runs()


@pytest.fixture(scope="module")
def rows():
    return M.validate_moe()


def _run(runs, id_):
    return next(r for r in runs if r["id"] == id_)


def test_203_rows_each_priced_or_with_one_line_reason(runs, rows):
    assert len(runs) == 203 and rows.height == 203
    assert rows["id"].n_unique() == 203
    for r in rows.iter_rows(named=True):
        if r["ape_pct"] is not None:
            assert r["not_priced_reason"] is None and r["status"] == "ok"
            assert r["measured_iteration_time_s"] > 0 and r["iteration_time_s"] > 0
            assert r["assumptions"] and "etp" in r["assumptions"]
        else:
            reason = r["not_priced_reason"]
            assert reason and "\n" not in reason and "; " not in reason, r["id"]
    assert rows["ape_pct"].is_not_null().sum() >= 4           # Mixtral on B200 / GB200 at least


def test_tokens_per_s_conversion_by_hand(runs):
    r = _run(runs, "mbridge_2608_deepseekv3_gb300_256gpu_mxfp8")
    t, how = M.measured_iteration_time(r)
    # GBS 4096 x seq 4096 / (6288 tokens/s/GPU x 256 GPUs)
    assert t == pytest.approx(4096 * 4096 / (6288 * 256))
    assert t == pytest.approx(r["iteration_time_s_derived"], rel=1e-3) and "tokens/s/GPU" in how


def test_step_time_taken_as_measured(runs):
    r = _run(runs, "automodel_qwen3moe30b_h100_8gpu")
    assert r["measured_metric"] == "iteration_time_s"
    t, how = M.measured_iteration_time(r)
    assert t == r["measured_value"] and how == "measured directly"
    # the page's tokens/s/GPU (12040, notes) agrees: GBS 512 x seq / (t x 8 GPUs)
    assert 512 * r["seq_len"] / (t * 8) == pytest.approx(12040, rel=2e-3)


def test_unconvertible_row_says_what_is_missing(runs, rows):
    r = rows.filter(pl.col("id").str.starts_with("deepseekv2_")).row(0, named=True)
    assert r["measured_iteration_time_s"] is None and r["not_priced_reason"]


def test_refused_model_carries_the_models_own_message(runs, rows):
    """The reason is the kernels' refusal (plan/models.py check_priced -> model/moe.py
    unpriced_reason), read at run time: no list of refused models here."""
    for preset in ("deepseek-v3", "qwen3-235b-a22b"):
        msg = unpriced_reason(MODEL_PRESETS[preset])
        sub = rows.filter(pl.col("preset") == preset)
        if msg is None:         # the kernels price it now: no row says it is refused
            assert not sub["not_priced_reason"].drop_nulls().str.contains("not priced yet").any()
            continue
        first = sub.filter(pl.col("not_priced_reason").is_not_null())["not_priced_reason"].to_list()
        assert msg.replace("; ", ", ") in first, preset


def test_rows_are_priced_once_the_model_stops_refusing(monkeypatch):
    """A model the kernels learn is priced without a change here: with the refusal lifted
    (kv_channels heads, as the other helper's change does), Qwen3-MoE and gpt-oss rows are priced."""
    import vtrain_fast.plan.models as PM
    orig = PM.unpriced_reason
    monkeypatch.setattr(PM, "unpriced_reason",
                        lambda s: None if s.kv_channels and not s.multi_latent_attention else orig(s))
    out = M.validate_moe()
    priced = out.filter(pl.col("ape_pct").is_not_null())
    assert priced.filter(pl.col("preset").str.starts_with("qwen3")).height > 0
    assert priced.filter(pl.col("preset").str.starts_with("gpt-oss")).height > 0
    assert not out["not_priced_reason"].drop_nulls().str.contains("kv_channels").any()
    # DeepSeek-V3's MLA is priced too: no row of it carries a kernel refusal
    assert not out.filter(pl.col("preset") == "deepseek-v3")["not_priced_reason"].drop_nulls().str.contains(
        "not priced yet").any()


def test_plan_mapping(runs):
    r = _run(runs, "nemo2504_mixtral8x22b_gb200_256gpu")
    plan, assumed = M.plan_row(r)
    assert plan["model"] == "mixtral-8x22b" and plan["gpu"] == "gb200-nvl72-186gb"
    assert (plan["tp"], plan["pp"], plan["cp"], plan["vpp"], plan["ep"], plan["dp"]) == (2, 4, 8, 14, 8, 4)
    assert plan["precision"] == "fp8" and plan["fp8_recipe"] == "tensorwise"
    assert plan["sequence_parallel"] == "true" and "recompute none" in assumed
    mx = _run(runs, "mbridge_2608_deepseekv3_gb300_256gpu_mxfp8")
    assert M.precision(mx) == ("fp8", "mxfp8")
    assert M.gpu_preset("GB200 (DGX GB200 NVL72)").preset == "gb200-nvl72-186gb"
    assert M.gpu_preset("B200 (DGX B200)").preset == "b200-hgx-180gb"
    assert M.gpu_preset("H800 (8 per node)").preset == "h800-sxm-80gb"


def test_cli_prints_mape_per_source_and_writes_parquet(tmp_path):
    out = tmp_path / "moe.parquet"
    res = CliRunner().invoke(app, ["validate", "--set", "moe", "-o", str(out)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "by source" in res.output and "Megatron-Bridge perf summary" in res.output
    assert "held out" in res.output and "no MoE fitting" in res.output
    assert "Why" in res.output and "not priced" in res.output
    df = pl.read_parquet(out)
    assert df.height == 203 and {"ape_pct", "not_priced_reason", "ep_comm_s"} <= set(df.columns)
    assert not math.isnan(df["ape_pct"].drop_nulls().mean())


def test_unknown_set_is_refused():
    res = CliRunner().invoke(app, ["validate", "--set", "moee"])
    assert res.exit_code == 2
    assert "moe" in res.output


def test_the_deepseek_v3_report_row_is_planned_as_the_closest_megatron_plan(runs):
    """DeepSeek's own stack (DualPipe) is not modelled: the row is priced as Megatron-core's 1F1B with
    the stated sizes on the H800 preset, and what the report does not state is filled and listed."""
    r = next(x for x in runs if x["id"].startswith("deepseekv3_report"))
    assert M.unexpressible_reason(r) is None
    plan, assumed = M.plan_row(r)
    assert (plan["gpu"], plan["tp"], plan["pp"], plan["ep"], plan["dp"], plan["micro_batch_size"]) == (
        "h800-sxm-80gb", 1, 16, 64, 128, 1)
    assert (plan["first_pipeline_num_layers"], plan["last_pipeline_num_layers"]) == (3, 2)    # 3 + 14 x 4 + 2 = 61
    assert "DualPipe" in assumed and "micro_batch_size 1" in assumed


@pytest.mark.parametrize("id_, last", [("mbridge_2604_deepseekv3_b200_256gpu_mxfp8", 1),     # pp 16
                                       ("mbridge_2606_deepseekv3_b300_256gpu_mxfp8", 5)])    # pp 8
def test_deepseek_v3_megatron_bridge_rows_take_the_recipes_pipeline_layout(runs, rows, id_, last):
    """Megatron-Bridge's DeepSeek-V3 layout without interleaving: the 61 layers even over the stages
    but the last (16 x 4 ... + 1; 7 x 8 + 5), which the kernels' uneven last stage states exactly."""
    plan, assumed = M.plan_row(_run(runs, id_))
    assert plan["last_pipeline_num_layers"] == last and (61 - last) % (plan["pp"] - 1) == 0
    assert str(plan.get("account_for_embedding_in_pipeline_split", False)).lower() == "false"
    assert "the recipe's pipeline layout: last stage" in str(assumed)
    row = rows.filter(pl.col("id") == id_)
    assert row["status"][0] in ("ok", "out_of_memory")          # priced, no longer bad_layers
    # the interleaved ones keep their per-chunk layout, which the kernels cannot state
    inter = rows.filter(pl.col("id") == "mbridge_2608_deepseekv3_gb200_256gpu_mxfp8")
    assert inter["status"][0] == "bad_layers"


def test_plot_is_refused_for_the_moe_set(tmp_path):
    res = CliRunner().invoke(app, ["validate", "--set", "moe", "--plot", str(tmp_path / "p.png")])
    assert res.exit_code == 2 and "--plot" in res.output and not (tmp_path / "p.png").exists()
