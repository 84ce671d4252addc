"""`plan` (cheapest plan within a deadline, runners-up and why they lose), the memory headroom
and --memory-margin, and the pareto plot; each checked against brute force over a tiny folder."""
from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest

from conftest import flat
from vtrain_fast.analysis.plan import FAMILY_COLUMNS, plan_to_deadline
from vtrain_fast.analysis.query import pareto, pareto_mask, scan_results
from vtrain_fast.hardware.gpus import PRESETS


def _rows(folder) -> pl.DataFrame:
    """Every ok / out-of-memory row, with the headroom by hand (the presets' HBM capacity)."""
    df = scan_results(folder).filter(pl.col("status").cast(pl.String).is_in(["ok", "out_of_memory"])).collect()
    cap = pl.Series([PRESETS[g].hbm_GiB for g in df["gpu"].cast(pl.String).to_list()])
    return df.with_columns(cap.alias("cap"), (cap - pl.col("memory_per_gpu_GiB")).alias("free"),
                           pl.col("status").cast(pl.String), pl.col("gpu").cast(pl.String),
                           pl.col("model").cast(pl.String))


def _meets(df, days, gpus, margin):
    ok = (pl.col("status") == "ok") & (pl.col("train_days") <= days)
    if gpus is not None:
        ok &= pl.col("num_gpus") <= gpus
    if margin:
        ok &= pl.col("free") >= margin * pl.col("cap")
    return df.with_columns(ok.alias("meets"))


def _cases(df):
    """(deadline, max GPUs, margin) from the folder's own values: quantiles of the days, the GPU sizes."""
    ok = df.filter(pl.col("status") == "ok")
    q = [float(ok["train_days"].quantile(f)) for f in (0.1, 0.5, 0.9)]
    sizes = sorted(set(ok["num_gpus"].to_list()))
    return [(q[1], None, None), (q[0], sizes[-1], 0.1), (q[2], sizes[0], None), (q[1], sizes[1], 0.3)]


def test_plan_is_the_cheapest_meeting_every_constraint(tiny_sweep):
    df = _rows(tiny_sweep)
    for days, gpus, margin in _cases(df):
        res = plan_to_deadline(tiny_sweep, days, gpus, margin, runners_up=3)
        brute = _meets(df, days, gpus, margin).filter("meets")
        want = brute.group_by("model").agg(pl.col("cost_usd").min())
        chosen = res.table.filter(pl.col("choice") == 0)
        assert chosen.height == want.height == 2 - len(res.unmet), (days, gpus, margin)
        for r in chosen.iter_rows(named=True):
            assert r["status"] == "ok" and r["train_days"] <= days
            assert gpus is None or r["num_gpus"] <= gpus
            cap = PRESETS[r["gpu"]].hbm_GiB
            assert r["memory_headroom_GiB"] == pytest.approx(cap - r["memory_per_gpu_GiB"])
            assert not margin or r["memory_headroom_GiB"] >= margin * cap
            assert r["cost_usd"] == want.filter(pl.col("model") == r["model"])["cost_usd"][0]


def _tier(fam: pl.DataFrame, gpus) -> str:
    """Why a family loses, by brute force (the reason's first words)."""
    within = fam if gpus is None else fam.filter(pl.col("num_gpus") <= gpus)
    if fam["meets"].any():
        return "dearer"
    if within.filter(pl.col("fits")).height:
        return "slower"
    if within.filter(pl.col("status") == "ok").height:
        return "within the memory margin"
    if within.height:
        return "out of memory"
    return "over --max-gpus"


def test_runners_up_reasons(tiny_sweep):
    df = _rows(tiny_sweep)
    seen = set()
    for days, gpus, margin in _cases(df):
        res = plan_to_deadline(tiny_sweep, days, gpus, margin, runners_up=1000)   # every family
        brute = _meets(df, days, gpus, margin).with_columns(
            ((pl.col("status") == "ok") & (pl.col("free") >= (margin or 0) * pl.col("cap"))).alias("fits"))
        for model, rows in res.table.group_by("model"):
            best = rows.filter(pl.col("choice") == 0).row(0, named=True)
            mine = brute.filter(pl.col("model") == model[0])
            families = mine.select(FAMILY_COLUMNS).unique()
            ups = rows.filter(pl.col("choice") > 0)
            assert ups.height == families.height - 1        # every other family once
            assert ups.select(FAMILY_COLUMNS).unique().height == ups.height
            for r in ups.iter_rows(named=True):
                assert any(r[c] != best[c] for c in FAMILY_COLUMNS)
                fam = mine.filter(pl.all_horizontal([pl.col(c) == r[c] for c in FAMILY_COLUMNS]))
                tier = _tier(fam, gpus)
                seen.add(tier)
                assert r["reason"].startswith(tier), (r["reason"], tier)
                if tier == "dearer":
                    assert r["cost_usd"] == fam.filter("meets")["cost_usd"].min() >= best["cost_usd"]
                    assert r["extra_cost_usd"] == pytest.approx(r["cost_usd"] - best["cost_usd"])
                    assert f"${r['cost_usd'] - best['cost_usd']:,.0f}" in r["reason"]
                elif tier == "slower":
                    assert r["train_days"] > days
                elif tier == "out of memory":
                    assert r["status"] == "out_of_memory"
                elif tier == "within the memory margin":
                    assert r["status"] == "ok" and r["memory_headroom_GiB"] < margin * PRESETS[r["gpu"]].hbm_GiB
    assert {"dearer", "slower", "out of memory"} <= seen


def test_nothing_meets_the_deadline_exits_2(tiny_sweep, cli):
    df = _rows(tiny_sweep).filter(pl.col("status") == "ok")
    fastest = df.sort("train_days").row(0, named=True)
    res = cli("plan", tiny_sweep, "--deadline-days", fastest["train_days"] / 2)
    assert res.exit_code == 2
    out = flat(res.output)
    assert "no plan of model" in out and f"{fastest['train_days']:.1f} days" in out
    assert f"{fastest['gpu']} x {fastest['num_gpus']:,}" in out


def test_nothing_meets_within_max_gpus_names_the_cluster_that_would(tiny_sweep, cli):
    df = _rows(tiny_sweep).filter((pl.col("status") == "ok") & (pl.col("model") == "gpt3-125m"))
    small = df["num_gpus"].min()
    deadline = float(df.filter(pl.col("num_gpus") == small)["train_days"].min()) * 0.99
    need = df.filter(pl.col("train_days") <= deadline)["num_gpus"].min()
    assert need is not None and need > small
    res = plan_to_deadline(tiny_sweep, deadline, small)
    gpt = [u for u in res.unmet if u["job"]["model"] == "gpt3-125m"]
    assert gpt and f"--max-gpus {need}" in gpt[0]["message"]
    assert cli("plan", tiny_sweep, "--deadline-days", deadline, "--max-gpus", small).exit_code == 2


def test_plan_cli_table_and_output(tiny_sweep, cli, tmp_path, wide_console):
    df = _rows(tiny_sweep)
    days = float(df.filter(pl.col("status") == "ok")["train_days"].quantile(0.9))
    out = tmp_path / "plan.csv"
    res = cli("plan", tiny_sweep, "--deadline-days", days, "-o", out)
    assert res.exit_code == 0, res.output
    written = pl.read_csv(out)
    assert {"choice", "reason", "extra_cost_usd", "memory_headroom_GiB", "tp", "cost_usd"} <= set(written.columns)
    assert (written.filter(pl.col("choice") == 0)["train_days"] <= days).all()
    assert "chosen" in res.output and "dearer by $" in res.output


@pytest.mark.parametrize("bad", [["--memory-margin", "1.5"], ["--memory-margin", "-0.1"], ["--deadline-days", "0"]])
def test_plan_bad_options_exit_2(tiny_sweep, cli, bad):
    args = ["plan", tiny_sweep, "--deadline-days", "10"] + bad
    res = cli(*args)
    assert res.exit_code == 2 and "error:" in res.output


def test_memory_margin_excludes_exactly_the_tight_plans(tiny_sweep):
    df = _rows(tiny_sweep).filter(pl.col("status") == "ok")
    plain = pareto(tiny_sweep, ["cost_usd", "train_days"], ["model"])
    # a margin just above one frontier plan's headroom, so that the margin must change the frontier
    r = plain.sort("memory_headroom_GiB").row(0, named=True)
    margin = r["memory_headroom_GiB"] / PRESETS[r["gpu"]].hbm_GiB + 1e-6
    assert 0 < margin < 1
    got = pareto(tiny_sweep, ["cost_usd", "train_days"], ["model"], memory_margin=margin)
    kept = df.filter(pl.col("free") >= margin * pl.col("cap"))
    want = []
    for _, g in kept.group_by("model"):
        m = pareto_mask(np.column_stack([g["cost_usd"].to_numpy(), g["train_days"].to_numpy()]))
        want += sorted(zip(g.filter(pl.Series(m))["cost_usd"].to_list(), g.filter(pl.Series(m))["train_days"].to_list()))
    assert sorted(zip(got["cost_usd"], got["train_days"])) == sorted(want)
    assert not got["memory_tight"].any()
    assert (got["memory_headroom_GiB"] >= margin * pl.Series([PRESETS[g].hbm_GiB for g in got["gpu"].cast(pl.String)])).all()
    # without a margin the tables mark the plans within the default 5 %
    caps = pl.Series([PRESETS[g].hbm_GiB for g in plain["gpu"].cast(pl.String)])
    assert plain["memory_tight"].to_list() == (plain["memory_headroom_GiB"] < 0.05 * caps).to_list()


def test_tables_mark_tight_plans():
    from rich.console import Console

    from vtrain_fast.analysis.report import print_frame
    df = pl.DataFrame({"tp": [1, 2], "memory_per_gpu_GiB": [79.0, 40.0], "memory_tight": [True, False]})
    console = Console(width=120, record=True)
    print_frame(df, "t", console=console, margin=0.05)
    text = console.export_text()
    assert "79.0 tight" in text and "40.0 tight" not in text and "within 5% of" in text
    assert "memory_tight" not in text


def test_pareto_plot(tiny_sweep, cli, tmp_path):
    from vtrain_fast.analysis.query import feasible_sample
    from vtrain_fast.analysis.report import frontier_figure
    import matplotlib.colors as mc
    front = pareto(tiny_sweep, ["cost_usd", "train_days"], ["model"])
    cloud = feasible_sample(tiny_sweep, ["cost_usd", "train_days", "model", "gpu"])
    fig = frontier_figure(front, cloud, "cost_usd", "train_days", ("model",), title_of=str(tiny_sweep))
    ax = fig.axes[0]
    assert tiny_sweep.name in ax.get_title() and "cost_usd" in ax.get_title()
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels and not any(".0" in t and "e" not in t.split("=")[-1] for t in labels)
    colours = {mc.to_hex(c) for coll in ax.collections for c in coll.get_facecolors()}
    assert len(colours) > 1
    assert any(t.get_text() for t in ax.texts)       # frontier plans labelled
    import matplotlib.pyplot as plt
    plt.close(fig)
    png = tmp_path / "f.png"
    res = cli("pareto", tiny_sweep, "--by", "model", "--plot", png)
    assert res.exit_code == 0 and png.stat().st_size > 1000


def test_plot_labels_numbers_readably():
    from vtrain_fast.analysis.report import group_label
    assert group_label(("num_tokens",), (300000000000.0,)) == "tokens 3e11"
    assert group_label(("model", "num_gpus"), ("gpt3-175b", 1024)) == "gpt3-175b, 1,024 GPUs"
    assert "300000000000" not in json.dumps(group_label(("num_tokens",), (3e11,)))


def test_where_narrows_the_plans_as_brute_force_does(tiny_sweep, cli):
    df = _rows(tiny_sweep)
    days = float(df.filter(pl.col("status") == "ok")["train_days"].quantile(0.9))
    gpu = sorted(set(df["gpu"].to_list()))[-1]
    res = plan_to_deadline(tiny_sweep, days, where=[f"gpu=={gpu}", "tp<=2"])
    brute = _meets(df.filter((pl.col("gpu") == gpu) & (pl.col("tp") <= 2)), days, None, None).filter("meets")
    chosen = res.table.filter(pl.col("choice") == 0)
    assert chosen.height == brute["model"].n_unique() >= 1
    assert (res.table["gpu"].cast(pl.String) == gpu).all() and (res.table["tp"] <= 2).all()
    for r in chosen.iter_rows(named=True):
        assert r["cost_usd"] == brute.filter(pl.col("model") == r["model"])["cost_usd"].min()
    out = cli("plan", tiny_sweep, "--deadline-days", days, "--where", f"gpu=={gpu}")
    assert out.exit_code == 0 and f"gpu=={gpu}" in flat(out.output)
    bad = cli("plan", tiny_sweep, "--deadline-days", days, "--where", "tpp==2")
    assert bad.exit_code == 2 and "tpp" in bad.output and "Traceback" not in bad.output


def test_where_that_matches_nothing_exits_2(tiny_sweep, cli):
    out = cli("plan", tiny_sweep, "--deadline-days", 30, "--where", "tp==3")
    assert out.exit_code == 2 and "--where" in out.output and "relax" in flat(out.output)
