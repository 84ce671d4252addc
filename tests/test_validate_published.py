"""validate --set published: every published row is priced or has a reason, the metric
conversions follow their sources' formulas, and a row the model cannot express is never priced."""
from __future__ import annotations

import math

import polars as pl
import pytest

from vtrain_fast.analysis import published as P


@pytest.fixture(scope="module")
def runs():
    return P.load_runs()


@pytest.fixture(scope="module")
def rows():
    return P.validate_published()


def _run(runs, id_):
    return next(r for r in runs if r["id"] == id_)


def test_the_package_copy_has_79_rows_of_7_sources(runs):
    assert len(runs) == 79
    assert len({r["id"] for r in runs}) == 79
    assert {r["source_key"] for r in runs} == set(P.STACKS)


def test_every_row_is_mapped_or_has_a_one_line_reason(runs, rows):
    assert rows.height == len(runs)
    for r in rows.iter_rows(named=True):
        if r["expressible"]:
            assert r["reason"] is None
            assert r["measured_iteration_time_s"] is not None and r["measured_iteration_time_s"] > 0
            assert r["status"] is not None
        else:
            assert r["reason"] and "\n" not in r["reason"], r["id"]
    # each reason is one rule's: a rule never fires on an expressible row
    for run in runs:
        expressible = bool(rows.filter(pl.col("id") == run["id"])["expressible"][0])
        assert expressible == (not P.unexpressible_reasons(run))


def test_reasons_name_what_the_model_lacks(runs):
    """As the CSV states them (no assumption), the rows name what their sources leave out; the
    assumptions fill exactly that, and the rows no source fills keep their reasons."""
    stated = {r["id"]: P.unexpressible_reasons(r) for r in P.load_runs(assume=False)}
    assert stated["narayanan21_t2_zero3_175B_384gpu"] == ["recompute not stated"]
    assert stated["mosaic_mpt7b_a100_40gb_128gpu"] == []
    assert not any("fp8" in x for x in stated["nemo2407_GPT3-175B_128gpu"])    # precision = fp8 is modelled
    # context parallelism is modelled: the cp = 2 rows are kept out only by what they do not state
    assert not any("context parallelism" in x for x in stated["nemo2407_LLAMA3-8B_8gpu"])
    assert stated["nemo2407_LLAMA3-8B_8gpu"] == ["recompute not stated"]
    assert stated["bloom176b_gbs2048_iter85376"] == []      # BLOOM's partition: 5 + 10 x 6 + 5 layers
    assert "tp/pp not stated" in stated["narayanan21_t2_ptd_175B_384gpu"]
    assert stated["korthikanti22_1T_fullrecompute"] == ["virtual_pp not stated (pp > 1)"]
    assert any("weak_scaling_efficiency" in x for x in stated["shoeybi19_2.5B_mp2"])
    assumed = {r["id"]: P.unexpressible_reasons(r) for r in runs}
    for id_ in ("narayanan21_t2_zero3_175B_384gpu", "narayanan21_t2_ptd_175B_384gpu", "nemo2407_LLAMA3-8B_8gpu",
                "korthikanti22_1T_fullrecompute", "shoeybi19_gpt2train_355M", "nemo2407_Nemotron-8B_64gpu"):
        assert assumed[id_] == [], (id_, assumed[id_])
    assert any("weak_scaling_efficiency" in x for x in assumed["shoeybi19_2.5B_mp2"])     # no source converts it
    readme = [i for i in assumed if i.startswith("megatronlm_")]
    assert len(readme) == 11 and all("micro_batch_size not stated" in " ".join(assumed[i]) for i in readme)


# ------------------------------------------------------------------------------ assumptions
def test_every_assumption_has_its_source_and_fills_only_empty_cells(runs):
    """Each record of assumptions.toml cites where its values come from, names rows that exist,
    and fills cells the CSV leaves empty: a stated value is never replaced."""
    stated = {r["id"]: r for r in P.load_runs(assume=False)}
    assert P.ASSUMPTIONS
    for a in P.ASSUMPTIONS:
        assert a.name and len(a.source) >= 20 and a.rows, a
        for rid in a.rows:
            assert rid in stated, (a.name, rid)
            for col in a.values:
                assert stated[rid][col] is None, (a.name, rid, col)
    got = {r["id"]: r for r in runs}
    for rid, r in got.items():
        for col, name in r["assumed"].items():
            if not col.startswith("setting "):
                assert stated[rid][col] is None and r[col] is not None, (rid, col)
        # every other cell is the CSV's
        for col, v in stated[rid].items():
            if col not in r["assumed"] and col not in ("assumed", "assumed_settings"):
                assert r[col] == v, (rid, col)


def test_an_assumption_without_a_source_or_over_a_stated_cell_is_refused(tmp_path, runs):
    path = tmp_path / "a.toml"
    path.write_text('[[assumption]]\nname = "x"\nrows = ["narayanan21_t1_1.7B"]\nvalues = { recompute = "full" }\n'
                    'source = ""\n', encoding="utf-8")
    with pytest.raises(ValueError, match="source"):
        P.load_assumptions(path)
    path.write_text('[[assumption]]\nname = "x"\nrows = ["narayanan21_t1_1.7B"]\nvalues = { recompute = "none" }\n'
                    'source = "a citation that is long enough"\n', encoding="utf-8")
    with pytest.raises(ValueError, match="stated"):
        P.apply_assumptions(P.load_runs(assume=False), P.load_assumptions(path))
    path.write_text('[[assumption]]\nname = "x"\nrows = ["no_such_row"]\nvalues = { recompute = "none" }\n'
                    'source = "a citation that is long enough"\n', encoding="utf-8")
    with pytest.raises(ValueError, match="no row"):
        P.apply_assumptions(P.load_runs(assume=False), P.load_assumptions(path))
    path.write_text('[[assumption]]\nname = "x"\nrows = ["narayanan21_t1_1.7B"]\nsettings = { no_setting = 1 }\n'
                    'source = "a citation that is long enough"\n', encoding="utf-8")
    with pytest.raises(ValueError, match="setting"):
        P.load_assumptions(path)


def test_a_row_relying_on_an_assumption_is_never_counted_as_stated(rows, runs):
    """basis = stated only for rows that take no value from assumptions.toml; exactly those are
    priced without the assumptions, with the same prediction; the stated MAPE is theirs."""
    by_id = {r["id"]: r for r in runs}
    for r in rows.iter_rows(named=True):
        run = by_id[r["id"]]
        assert r["basis"] == (P.ASSUMED if run["assumed"] else P.STATED)
        if r["basis"] == P.ASSUMED:
            assert r["assumed_values"] and r["assumption_sources"]
            for a in P.ASSUMPTIONS:                   # every record it takes cites its source in the row
                if r["id"] in a.rows:
                    assert a.source in r["assumption_sources"]
        else:
            assert r["assumed_values"] is None and r["assumption_sources"] is None
    bare = P.validate_published(assume=False)
    stated_priced = rows.filter(pl.col("expressible") & (pl.col("basis") == P.STATED))
    assert set(bare.filter(pl.col("expressible"))["id"]) == set(stated_priced["id"])
    j = stated_priced.select("id", "iteration_time_s").join(bare.select("id", b="iteration_time_s"), on="id")
    assert (j["iteration_time_s"] == j["b"]).all()
    s = P.basis_summary(rows, "source").filter(pl.col("source") == "all").row(0, named=True)
    assert s["stated"] == stated_priced["ape_pct"].drop_nulls().len()
    assert math.isclose(s["stated_mape"], stated_priced["ape_pct"].mean(), rel_tol=1e-12)
    assert s["stated"] + s["assumed"] == s["priced"] == rows["ape_pct"].drop_nulls().len()
    assert s["assumed"] >= 25                # the rows this file prices


def test_assumed_settings_reach_the_plan(runs):
    plan, text = P.plan_row(_run(runs, "nemo2407_GPT3-175B_128gpu"))
    assert plan["tp_comm_overlap"] == "false" and plan["sequence_parallel"] == "true"   # gpt3/175b.yaml
    assert plan["ffn_hidden_size"] == 49152 and plan["vocab_size"] == 50688 and plan["precision"] == "fp8"
    assert "assumed (not stated" in text and "tp_comm_overlap" in text
    plan, _ = P.plan_row(_run(runs, "nemo2407_Nemotron-8B_64gpu"))
    assert plan["untie_embeddings_and_output_weights"] == "true" and plan["position_embedding_type"] == "rope"
    assert plan["gated_mlp"] == "false" and plan["add_bias_linear"] == "false"
    plan, text = P.plan_row(_run(runs, "narayanan21_t1_1.7B"))
    assert "assumed" not in text


def test_deleting_a_rule_is_how_a_feature_lands(runs, monkeypatch):
    """The rules are data: a BLOOM row with 71 layers does not split over its 12 stages (even
    counting the embeddings as layers), and without the rule it would be mapped. The FSDP rows,
    whose rule went when zero_stage landed, map to zero_stage 3 on their preset."""
    row = dict(_run(runs, "bloom176b_gbs2048_iter85376"), num_layers=71)
    assert P.unexpressible_reasons(row) == ["the stack's pipeline split does not fit: 71 layers over 12 stages"]
    monkeypatch.setattr(P, "RULES", tuple(r for r in P.RULES if r is not P._r_uneven_stages))
    assert P.unexpressible_reasons(row) == []
    plan, _ = P.plan_row(_run(runs, "mosaic_mpt7b_a100_40gb_128gpu"))
    assert plan["gpu"] == "a100-sxm4-40gb" and plan["recompute"] == "full" and plan["precision"] == "bf16"
    assert plan["zero_stage"] == 3 and plan["use_flash_attn"] == "true"
    assert P.plan_row(_run(runs, "narayanan21_t2_zero3_175B_384gpu"))[0]["zero_stage"] == 3
    assert P.plan_row(_run(runs, "narayanan21_t1_1.7B"))[0]["zero_stage"] == 0


def test_gpu_names_map_to_presets():
    assert P.gpu_preset("A100-SXM4-80GB (Selene DGX A100)").preset == "a100-sxm4-80gb"
    assert P.gpu_preset("A100-80GB (Jean Zay, 48 nodes x 8)").preset == "a100-sxm4-80gb"
    assert P.gpu_preset("A100-40GB").preset == "a100-sxm4-40gb"
    assert P.gpu_preset("H100-SXM5-80GB (DGX H100)").preset == "h100-sxm-80gb"
    v100 = P.gpu_preset("V100-SXM3-32GB (DGX-2H)")
    assert v100.preset == "v100-sxm2-32gb" and v100.overrides == {"gpus_per_node": 16, "inter_node_Gbps": 50.0}
    assert P.gpu_preset("TPU v4") is None


# ------------------------------------------------------------------------------ conversions
def test_narayanan_eq3_by_hand(runs):
    """Table 1, 1.7B: B 512, s 2048, l 24, h 2304, V 51200, 32 GPUs at 137 TFLOP/s.
    F = 96 B s l h^2 (1 + s/6h + V/16lh)."""
    F = 96 * 512 * 2048 * 24 * 2304 ** 2 * (1 + 2048 / (6 * 2304) + 51200 / (16 * 24 * 2304))
    assert P.hardware_flops_eq3(512, 2048, 24, 2304, 51200) == pytest.approx(F, rel=1e-12)
    assert F == pytest.approx(1.54668e16, rel=1e-5)        # 1.28248e16 x 1.20602
    t, _ = P.measured_iteration_time(_run(runs, "narayanan21_t1_1.7B"))
    assert t == pytest.approx(F / (137e12 * 32), rel=1e-12)
    assert t == pytest.approx(3.528, abs=1e-3)


def test_bloom_logged_tflops_match_its_iteration_time(runs):
    """BLOOM's log line: 104.70 s per iteration and 149.77 TFLOPs (24 x 4 coefficient): the
    formula turns one into the other."""
    F = P.hardware_flops_eq3(2048, 2048, 70, 14336, 250680)
    assert F / (104.70 * 384) / 1e12 == pytest.approx(149.77, abs=0.02)
    t, _ = P.measured_iteration_time(_run(runs, "bloom176b_gbs192_mbs1"))
    assert t == pytest.approx(P.hardware_flops_eq3(192, 2048, 70, 14336, 250680) / (73e12 * 384), rel=1e-12)


def test_korthikanti_mfu_reproduces_table5():
    """Model FLOPs 72 B s l h^2 (1 + s/6h + V/12lh) at 312 TFLOP/s: Table 5's MFU of 22B
    (1.10 s, 8 GPUs, 41.5 %) and 175B (13.75 s, 64 GPUs, 51.4 %)."""
    f22 = P.model_flops_korthikanti(4, 2048, 48, 6144, 51200)
    assert f22 / (1.10 * 8 * 312e12) * 100 == pytest.approx(41.5, abs=0.3)
    f175 = P.model_flops_korthikanti(64, 2048, 96, 12288, 51200)
    assert f175 / (13.75 * 64 * 312e12) * 100 == pytest.approx(51.4, abs=0.1)
    assert P.seconds_from_mfu(f175, 51.4, 312.0, 64) == pytest.approx(13.75, rel=2e-3)


def test_megatron_core_flops_by_hand():
    """12 B s l h^2 (1 + g/a + s/h + f/h + V/(2lh)); with g = a and f = 4h it equals
    Korthikanti's 72 B s l h^2 (1 + s/6h + V/12lh)."""
    assert P.model_flops_megatron_core(2, 4096, 24, 2048, 16, 16, 8192, 131072) == pytest.approx(
        P.model_flops_korthikanti(2, 4096, 24, 2048, 131072), rel=1e-12)
    assert P.model_flops_megatron_core(1, 8, 2, 4, 2, 1, 16, 32) == 12 * 8 * 2 * 16 * (1 + 0.5 + 2 + 4 + 2)


def test_tokens_and_epoch_conversions(runs):
    # MosaicML MPT-7B on 8 A100-80GB: 96 x 2048 tokens at 4,641 tokens/s/GPU
    t, _ = P.measured_iteration_time(_run(runs, "mosaic_mpt7b_a100_80gb_8gpu"))
    assert t == pytest.approx(96 * 2048 / (4641 * 8), rel=1e-12)
    # Shoeybi Table 2: 0.86 days per epoch of 68,507 iterations = 1.085 s (the row's notes)
    t, _ = P.measured_iteration_time(_run(runs, "shoeybi19_gpt2train_355M"))
    assert t == pytest.approx(1.085, abs=1e-3)
    t, how = P.measured_iteration_time(_run(runs, "korthikanti22_22B_fullrecompute"))
    assert t == 1.42 and how == "measured directly"


def test_metrics_that_are_not_throughput_are_not_converted(runs):
    for id_ in ("shoeybi19_2.5B_mp2", "shoeybi19_1.2B_1gpu_baseline"):
        with pytest.raises(P.NotConvertible):
            P.measured_iteration_time(_run(runs, id_))
    bare = {r["id"]: r for r in P.load_runs(assume=False)}      # its batch is an assumption
    with pytest.raises(P.NotConvertible):
        P.measured_iteration_time(bare["korthikanti22_530B_dp8_fullrecompute"])


# ------------------------------------------------------------------------------ pricing
def test_unexpressible_rows_are_never_priced(runs, rows, monkeypatch):
    bad = rows.filter(~pl.col("expressible"))
    assert bad.height > 0
    assert bad["iteration_time_s"].null_count() == bad.height
    assert bad["ape_pct"].null_count() == bad.height
    assert bad["status"].null_count() == bad.height
    seen = []
    real = P.evaluate_frame

    def spy(df, *a, **k):
        seen.extend(df["id"].to_list())
        return real(df, *a, **k)
    monkeypatch.setattr(P, "evaluate_frame", spy)
    P.validate_published()
    assert set(seen) == set(rows.filter(pl.col("expressible"))["id"].to_list())


def test_expressible_plans_use_the_stack_defaults(rows):
    n21 = rows.filter(pl.col("id") == "narayanan21_t1_76B").row(0, named=True)
    assert (n21["tp"], n21["pp"], n21["dp"], n21["vpp"], n21["micro_batch_size"]) == (8, 4, 32, 3, 2)
    assert n21["recompute"] == "full" and not n21["async_tensor_model_parallel_allreduce"]
    k22 = rows.filter(pl.col("id") == "korthikanti22_175B_selective_sp").row(0, named=True)
    assert k22["recompute"] == "selective" and k22["sequence_parallel"] and k22["async_tensor_model_parallel_allreduce"]
    assert not k22["overlap_grad_reduce"] and not k22["use_flash_attn"]


def test_errors_are_consistent(rows):
    priced = rows.filter(pl.col("ape_pct").is_not_null())
    assert priced.height >= 10
    for r in priced.iter_rows(named=True):
        assert r["status"] == "ok"
        expect = (r["iteration_time_s"] / r["measured_iteration_time_s"] - 1) * 100
        assert math.isclose(r["error_pct"], expect, rel_tol=1e-9) and r["ape_pct"] == abs(r["error_pct"])
    s = P.summary(rows, "source")
    assert s["rows"].sum() == 2 * rows.height            # the sources, then 'all'
    assert s.filter(pl.col("source") == "all")["priced"][0] == priced.height


# ------------------------------------------------------------------------------ command
def test_command_prints_per_source_mape_and_writes_parquet(tmp_path, cli):
    out = tmp_path / "validation_published.parquet"
    res = cli("validate", "--set", "published", "-o", out)
    assert res.exit_code == 0, res.output
    assert "by source" in res.output and "mape" in res.output.lower()
    assert "Narayanan et al. 2021" in res.output and "Korthikanti et al. 2022" in res.output
    assert "Held-out" in res.output and "Largest errors" in res.output
    df = pl.read_parquet(out)
    assert df.height == 79
    assert "stated and assumed rows" in res.output and "stated_mape" in res.output
    for col in ("id", "source", "measured_iteration_time_s", "iteration_time_s", "ape_pct", "expressible", "reason",
                "basis", "assumed_values", "assumption_sources"):
        assert col in df.columns


def test_command_refuses_an_unknown_set(cli, tmp_path):
    res = cli("validate", "--set", "nope", "-o", tmp_path / "x.parquet")
    assert res.exit_code == 2
    assert "--set" in res.output


def test_a_plan_the_model_finds_infeasible_is_not_priced(monkeypatch):
    """An expressible row whose plan the model refuses (out_of_memory, bad_batch, ...) keeps its
    status and gets no prediction or error, and the command lists it."""
    real = P.evaluate_frame

    def refuse_one(df, *a, **k):
        out = real(df, *a, **k)
        return out.with_columns(pl.when(pl.col("id") == "narayanan21_t1_1T").then(pl.lit("out_of_memory"))
                                .otherwise(pl.col("status")).alias("status"))
    monkeypatch.setattr(P, "evaluate_frame", refuse_one)
    rows = P.validate_published()
    r = rows.filter(pl.col("id") == "narayanan21_t1_1T").row(0, named=True)
    assert r["expressible"] and r["status"] == "out_of_memory"
    assert r["iteration_time_s"] is None and r["ape_pct"] is None
    s = P.summary(rows, "source").filter(pl.col("source") == "Narayanan et al. 2021").row(0, named=True)
    assert (s["expressible"], s["priced"]) == (22, 20)      # 21 priced (the 530B ZeRO-3 row at 640 GPUs: out of memory)
    # memory aside, its time still counts (kept apart from the priced MAPE)
    assert r["iteration_time_memory_aside_s"] > 0 and r["ape_memory_aside_pct"] is not None
    aside = P.memory_aside(rows)
    assert aside["out_of_memory"] == rows.filter(pl.col("status") == "out_of_memory").height >= 1
    assert aside["rows"] == rows.filter(pl.col("status").is_in(["ok", "out_of_memory"])).height


def test_memory_aside_counts_the_runs_the_model_finds_out_of_memory(rows):
    oom = rows.filter(pl.col("status") == "out_of_memory")
    ok = rows.filter(pl.col("status") == "ok")
    aside = P.memory_aside(rows)
    assert aside["out_of_memory"] == oom.height and aside["rows"] == ok.height + oom.height
    assert oom["ape_pct"].null_count() == oom.height          # never in the priced MAPE
    # where the model finds the plan feasible the two errors are the same number
    assert (ok["ape_memory_aside_pct"] - ok["ape_pct"]).abs().max() == 0.0
    expect = pl.concat([ok["ape_pct"], oom["ape_memory_aside_pct"]]).mean()
    assert aside["shipped_mape_pct"] == pytest.approx(expect, rel=1e-12)


@pytest.mark.parametrize("which", ["vtrain", "published"])
def test_a_plot_name_matplotlib_cannot_write_is_refused_before_any_work(which, tmp_path, cli):
    out = tmp_path / "rows.parquet"
    res = cli("validate", "--set", which, "-o", out, "--plot", tmp_path / "p.txt")
    assert res.exit_code == 2 and "p.txt" in res.output and ".png" in res.output, res.output
    assert not out.exists()
