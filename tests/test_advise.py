"""``vtrain-fast advise``: under either rule (best-plan, the default, and greedy) advise never
recommends a plan that does not fit, each step changes what its technique names and nothing else,
memory techniques a model needs are marked so, a hopeless case exits 2 with the fixes, the same
inputs give the same advice, and the CLI writes its files and refuses bad options; the best-plan
rule ends at the search's best plan and orders its techniques by the fit-then-speed rule. Every
check re-prices or recomputes independently of advise's own bookkeeping."""
from __future__ import annotations

import polars as pl
import pytest

from conftest import flat
from vtrain_fast.analysis.advise import (LADDER, START, Technique, advise, combinations, data_parallel_size,
                                         start_plan, usable_techniques, why_not)
from vtrain_fast.analysis.evaluate import evaluate_frame
from vtrain_fast.hardware.gpus import PRESETS
from vtrain_fast.io.errors import InputError
from vtrain_fast.io.schema import SETTING_COLUMNS
from vtrain_fast.model.settings import BY_NAME, SAME_PLAN, canonical_values

RTX = "rtx4090-pcie-24gb"
L40S = "l40s-pcie-48gb"
# The columns that make a plan (what evaluate reads back): the layout, the batch, the tokens and
# every training setting.
PLAN_INPUTS = ("model", "gpu", "tp", "pp", "dp", "micro_batch_size", "global_batch_size", "recompute", "num_tokens",
               *SETTING_COLUMNS)
BY_TECHNIQUE = {t.name: t for t in LADDER}


@pytest.fixture(scope="module")
def seven_b():
    """llama2-7b on two 4-GPU RTX 4090 workstations: out of memory at the start, several steps."""
    return advise("llama2-7b", RTX, 8)


@pytest.fixture(scope="module")
def needs_zero():
    """gpt3-1.3b on one 4 x RTX 4090 workstation, from bf16: 32 GiB at the start, fits only with a memory
    technique."""
    return advise("gpt3-1.3b", RTX, 4, settings={"precision": "bf16"})


@pytest.fixture(scope="module")
def seven_b_greedy():
    return advise("llama2-7b", RTX, 8, rule="greedy")


@pytest.fixture(scope="module")
def needs_zero_greedy():
    return advise("gpt3-1.3b", RTX, 4, rule="greedy", settings={"precision": "bf16"})


ALL_FOUR = ["seven_b", "needs_zero", "seven_b_greedy", "needs_zero_greedy"]


def _repriced(steps: pl.DataFrame) -> pl.DataFrame:
    """The steps' plans priced again, from their input columns only."""
    return evaluate_frame(steps.select(PLAN_INPUTS), "re-priced")


@pytest.mark.parametrize("which", ALL_FOUR)
def test_every_step_reprices_to_its_row_and_the_final_plan_fits(which, request):
    res = request.getfixturevalue(which)
    again = _repriced(res.steps)
    for col in ("status", "iteration_time_s", "memory_per_gpu_GiB", "tokens_per_s", "mfu", "train_days", "cost_usd"):
        assert again[col].to_list() == res.steps[col].to_list(), col
    assert res.final_source == ("ladder" if res.rule == "greedy" else "best-plan")
    assert res.final["status"] == "ok" and res.steps["status"][-1] == "ok"
    assert res.final["iteration_time_s"] == res.steps["iteration_time_s"][-1]
    # memory per GPU is what the GPU holds: a plan that fits is below the GPU's memory
    assert res.final["memory_per_gpu_GiB"] <= PRESETS[RTX].hbm_GiB
    # fits is status ok (no margin asked), and the phases follow it: fit steps until it fits, then speed
    assert res.steps["fits"].to_list() == [s == "ok" for s in again["status"].to_list()]
    phases = res.steps["phase"].to_list()
    first_fit = res.steps["fits"].to_list().index(True)
    assert phases[0] == "start"
    assert all(p == "fit" for p in phases[1:first_fit + 1]) and all(p == "speed" for p in phases[first_fit + 1:])


@pytest.mark.parametrize("which", ALL_FOUR)
def test_each_step_changes_only_what_its_technique_names(which, request):
    res = request.getfixturevalue(which)
    rows = res.steps.rows(named=True)
    knobs = ("tp", "pp", "micro_batch_size", "recompute", *SETTING_COLUMNS)
    for prev, cur in zip(rows, rows[1:]):
        tech = BY_TECHNIQUE[cur["technique"]]
        a = canonical_values({k: prev[k] for k in knobs})
        b = canonical_values({k: cur[k] for k in knobs})
        changed = {k for k in knobs if a[k] != b[k]}
        named = set(tech.values)
        if named & set(SAME_PLAN):          # zero_stage 1 spells the distributed optimizer too
            named |= set(SAME_PLAN) & changed
        assert changed == named, (cur["technique"], changed)
        assert all(cur[k] == v for k, v in tech.changes)
        # dp is not a technique: the largest size up to GPUs / (tp x pp) dividing the batch in micro-batches
        most = res.num_gpus // (cur["tp"] * cur["pp"])
        assert cur["dp"] == max(d for d in range(1, most + 1)
                                if cur["global_batch_size"] % (d * cur["micro_batch_size"]) == 0)
        if res.rule == "best-plan":     # a step after the first that fits fits
            assert cur["fits"] or not prev["fits"]
        elif cur["phase"] == "speed":   # a greedy speed step gains at least the threshold
            assert cur["iteration_time_s"] <= prev["iteration_time_s"] * (1 - res.threshold)
        else:                           # a greedy fit step lowers the memory
            assert cur["memory_per_gpu_GiB"] < prev["memory_per_gpu_GiB"]


def test_the_start_is_plain_data_parallelism(seven_b):
    s = seven_b.steps.row(0, named=True)
    assert (s["tp"], s["pp"], s["dp"], s["micro_batch_size"], s["recompute"]) == (1, 1, 8, 1, "none")
    # the start is fp32 (no mixed precision): every other setting at its default
    assert s["precision"] == "fp32" and s["global_batch_size"] == 4 * 1024 * 1024 // 4096
    assert all(s[st] == BY_NAME[st].default for st in SETTING_COLUMNS if st != "precision")
    # tokens: 20 per parameter, the parameters the cost model counts
    assert s["num_tokens"] == pytest.approx(20 * s["num_parameters"])
    assert any("the start is fp32" in n for n in seven_b.notes)


@pytest.mark.parametrize("fixture", ["seven_b", "seven_b_greedy"])
def test_mixed_precision_is_a_step_and_fp8_comes_after_it(fixture, request):
    res = request.getfixturevalue(fixture)
    prec = res.steps["precision"].to_list()
    names = res.steps["technique"].to_list()
    assert prec[0] == "fp32" and "mixed precision (bf16)" in names
    mp = names.index("mixed precision (bf16)")
    assert res.steps.row(mp, named=True)["change"] == "precision fp32 -> bf16"
    # the step that takes mixed precision is faster by about the GEMM peak ratio of the RTX 4090
    # (FP32 82.6, bf16 165.2 TFLOP/s, with FP32 accumulate) where GEMM-bound: at most 2x
    row, before = res.steps.row(mp, named=True), res.steps.row(mp - 1, named=True)
    assert 1.3 < before["iteration_time_s"] / row["iteration_time_s"] <= 2.05
    if "FP8" in names:
        assert names.index("FP8") > mp
        assert all(p != "fp8" for p in prec[:mp])


def test_fp8_waits_for_mixed_precision_and_flash_attention_for_16_bit():
    from vtrain_fast.analysis.advise import Context
    from vtrain_fast.plan.models import MODEL_PRESETS
    shape = MODEL_PRESETS["llama2-7b"].resolved()
    start = dict(START)
    assert start["precision"] == "fp32"
    new, why = why_not(BY_TECHNIQUE["FP8"], start, Context(PRESETS[RTX], 8, shape, 1024))
    assert new is None and "comes after mixed precision" in why
    new, why = why_not(BY_TECHNIQUE["FlashAttention"], {**start, "dp": 8}, Context(PRESETS[RTX], 8, shape, 1024))
    assert new is None and "no effect" in why
    new, why = why_not(BY_TECHNIQUE["mixed precision (bf16)"], start, Context(PRESETS[RTX], 8, shape, 1024))
    assert new == dict(start, precision="bf16") and why == ""


@pytest.mark.parametrize("which", ["needs_zero", "needs_zero_greedy"])
def test_a_model_that_fits_only_with_a_memory_technique_gets_it_marked_needed(which, request):
    needs_zero = request.getfixturevalue(which)
    t = needs_zero.steps
    assert t["status"][0] == "out_of_memory" and t["fits"][1]
    assert t["needed_to_fit"].to_list()[:2] == [False, True] and not any(t["needed_to_fit"].to_list()[2:])
    # the technique is a memory one; the greedy final plan still needs it (without it, out of
    # memory); the best plan may not (a later technique of it, ZeRO-2, covers 8-bit states), but
    # it needs some technique of its own: the first whose removal alone runs out of memory
    tech = BY_TECHNIQUE[t["technique"][1]]
    assert set(tech.values) & {"zero_stage", "recompute", "use_flash_attn", "use_precision_aware_optimizer", "tp",
                               "pp"}
    if needs_zero.rule == "best-plan":
        oom = needs_zero.without.filter((pl.col("status") == "out_of_memory")
                                        & pl.col("technique").is_in(list(BY_TECHNIQUE)))
        assert oom.height >= 1
        tech = BY_TECHNIQUE[oom["technique"][0]]
    row = needs_zero.without.filter(pl.col("technique") == tech.name).row(0, named=True)
    assert row["status"] == "out_of_memory" and not row["fits"]
    final = {k: needs_zero.final[k] for k in PLAN_INPUTS}
    back = {**final, **{k: (START[k] if k in START else BY_NAME[k].default) for k in tech.values}}
    if "zero_stage" in tech.values:     # its other spelling goes back too (evaluate reads either)
        back["distributed_optimizer"] = False
    back["dp"] = data_parallel_size(back, needs_zero.num_gpus, back["global_batch_size"])
    again = evaluate_frame(pl.DataFrame([back]), "without it")
    assert again["status"][0] == "out_of_memory"
    assert again["memory_per_gpu_GiB"][0] == pytest.approx(row["memory_per_gpu_GiB"])


def test_the_search_finds_nothing_slower_than_the_ladder(seven_b_greedy, needs_zero_greedy):
    for res in (seven_b_greedy, needs_zero_greedy):
        assert res.best is not None and res.best["status"] == "ok"
        assert res.best["iteration_time_s"] <= res.final["iteration_time_s"] * (1 + 1e-12)
        again = evaluate_frame(pl.DataFrame([{k: res.best[k] for k in PLAN_INPUTS}]), "best")
        assert again["iteration_time_s"][0] == res.best["iteration_time_s"] and again["status"][0] == "ok"


def test_the_ladder_plans_are_among_the_combinations():
    from vtrain_fast.analysis.advise import Context
    from vtrain_fast.plan.models import MODEL_PRESETS
    ctx = Context(PRESETS[RTX], 8, MODEL_PRESETS["llama2-7b"].resolved(), 1024)
    ladder, _ = usable_techniques(LADDER)
    start = start_plan(ladder)
    assert all(start[k] == v for k, v in START.items())
    assert all(start[k] == BY_NAME[k].default for t in ladder for k in t.values if k in BY_NAME and k not in START)
    found, note = combinations(ladder, start, ctx)
    assert note == ""
    plans = [p for p, _ in found]
    keys = {tuple(sorted(p.items())) for p in plans}
    assert len(keys) == len(plans)           # each plan once
    # every plan one step from the start is in the search, and tp never exceeds a 4-GPU node
    for tech in ladder:
        new, _ = why_not(tech, start, ctx)
        if new is not None:
            assert tuple(sorted(new.items())) in keys, tech.name
    assert max(p["tp"] for p in plans) == 4 and all(p["tp"] * p["pp"] <= 8 for p in plans)
    assert not any(p["sequence_parallel"] and p["tp"] == 1 for p in plans)


def test_a_hopeless_case_exits_2_with_the_fixes(cli):
    r = cli("advise", "--model", "gpt3-175b", "--gpus", f"{RTX}:2")
    text = flat(r.output)
    assert r.exit_code == 2, r.output
    assert "Traceback" not in text and "error:" in text
    for needle in ("none does", "techniques tried", "FlashAttention", "ZeRO-3", "more GPUs", "a bigger GPU",
                   "a smaller model", "GiB"):
        assert needle in text, needle
    with pytest.raises(InputError, match="none of the .* plans their values make fits"):
        advise("gpt3-175b", RTX, 2)


def test_the_search_gives_the_final_plan_when_the_ladder_is_stuck():
    """A ladder that can only reach a plan from which no step lowers the memory (tensor
    parallelism first, then recomputation refused at tp > 1 and ZeRO without effect at dp = 1),
    while recomputation and ZeRO-3 together fit: the final plan is the search's, and it fits."""
    def no_tp(plan, ctx):
        return "not with tensor parallelism (this test's rule)" if plan["tp"] > 1 else None
    ladder = (BY_TECHNIQUE["tensor parallelism 2"], Technique("full recomputation", (("recompute", "full"),), "test",
                                                              no_tp), BY_TECHNIQUE["ZeRO-3"])
    res = advise("llama2-7b", "a100-sxm4-80gb", 2, techniques=ladder, rule="greedy", settings={"precision": "bf16"})
    assert res.steps["technique"].to_list() == ["start (plain DP)", "tensor parallelism 2"]
    assert res.steps["status"].to_list() == ["out_of_memory", "out_of_memory"]
    assert res.final_source == "search" and res.final["status"] == "ok"
    assert (res.final["tp"], res.final["recompute"], res.final["zero_stage"]) == (1, "full", 3)
    again = evaluate_frame(pl.DataFrame([{k: res.final[k] for k in PLAN_INPUTS}]), "final")
    assert again["status"][0] == "ok"
    assert any("ladder ends out of memory" in n for n in res.notes)
    # the best-plan rule gets there step by step, each step a plan Megatron-LM runs
    best = advise("llama2-7b", "a100-sxm4-80gb", 2, techniques=ladder, settings={"precision": "bf16"})
    assert best.steps["technique"].to_list()[1:] in (["full recomputation", "ZeRO-3"], ["ZeRO-3", "full recomputation"])
    assert best.final["iteration_time_s"] == res.final["iteration_time_s"] and best.steps["fits"][-1]


def test_advice_is_deterministic(seven_b):
    again = advise("llama2-7b", RTX, 8)
    assert again.steps.equals(seven_b.steps) and again.notes == seven_b.notes
    assert again.without.equals(seven_b.without) and again.best == seven_b.best


def test_fp8_only_where_the_gpu_has_it():
    from vtrain_fast.analysis.advise import Context
    from vtrain_fast.plan.models import MODEL_PRESETS
    shape = MODEL_PRESETS["llama2-7b"].resolved()
    fp8 = BY_TECHNIQUE["FP8"]
    start = dict(START, precision="bf16")
    assert PRESETS["a100-sxm4-80gb"].peak_fp8_tflops == 0 and PRESETS[RTX].peak_fp8_tflops > 0
    new, why = why_not(fp8, start, Context(PRESETS["a100-sxm4-80gb"], 8, shape, 1024))
    assert new is None and "FP8" in why
    new, why = why_not(fp8, start, Context(PRESETS[RTX], 8, shape, 1024))
    assert new == dict(start, precision="fp8") and why == ""
    res = advise("gpt3-1.3b", "a100-sxm4-80gb", 8)
    assert "FP8" not in res.tried["technique"].to_list() and "fp8" not in res.steps["precision"].to_list()


def test_tensor_parallelism_stays_within_a_node(seven_b):
    assert PRESETS[RTX].gpus_per_node == 4
    assert seven_b.tried["tp"].max() <= 4
    wide = advise("llama2-7b", RTX, 8, settings={"gpus_per_node": 8}, rule="greedy")  # an 8-GPU box: tp 8 is tried
    assert wide.tried["tp"].max() == 8 and (wide.steps["num_nodes"] == 1).all()


def test_a_record_naming_a_setting_the_cost_model_lacks_is_left_out_with_a_note():
    fake = Technique("warp drive", (("warp_drive_enabled", True),), "none")
    kept, notes = usable_techniques(LADDER + (fake,))
    assert fake not in kept and any("warp drive" in n and "warp_drive_enabled" in n for n in notes)
    assert len(kept) == len(LADDER) - ("optimizer_cpu_offload" not in BY_NAME)
    res = advise("gpt3-1.3b", RTX, 4, techniques=LADDER + (fake,))
    assert any("warp drive" in n for n in res.notes)
    assert "warp drive" not in res.tried["technique"].to_list()
    # CPU optimizer offload is one record: left out while the cost model has no such setting
    assert any(t.name == "CPU optimizer offload" for t in LADDER)
    assert any("CPU optimizer offload" in n for n in notes) == ("optimizer_cpu_offload" not in BY_NAME)


def test_a_memory_margin_keeps_headroom():
    res = advise("gpt3-1.3b", RTX, 4, memory_margin=0.25)
    cap = PRESETS[RTX].hbm_GiB
    assert cap - res.final["memory_per_gpu_GiB"] >= 0.25 * cap
    assert all(cap - m >= 0.25 * cap for m, f in zip(res.steps["memory_per_gpu_GiB"], res.steps["fits"]) if f)
    assert cap - res.best["memory_per_gpu_GiB"] >= 0.25 * cap
    plain = advise("gpt3-1.3b", RTX, 4)
    assert cap - plain.final["memory_per_gpu_GiB"] < 0.25 * cap       # without it the ladder takes a plan with less
    assert plain.steps["technique"].to_list() != res.steps["technique"].to_list()


def test_days_and_budget_are_checked_against_the_final_plan(needs_zero):
    days = needs_zero.final["train_days"]
    ok = advise("gpt3-1.3b", RTX, 4, days=days * 1.01)
    late = advise("gpt3-1.3b", RTX, 4, days=days * 0.5)
    assert ok.target["meets"] and not late.target["meets"] and "does not meet --days" in late.target["message"]
    assert late.target["value"] == pytest.approx(days)
    cost = needs_zero.final["cost_usd"]
    assert advise("gpt3-1.3b", RTX, 4, budget_usd=cost * 1.01).target["meets"]
    assert not advise("gpt3-1.3b", RTX, 4, budget_usd=cost * 0.9).target["meets"]
    with pytest.raises(InputError, match="one of them"):
        advise("gpt3-1.3b", RTX, 4, days=10, budget_usd=1000)


def test_cli_writes_the_table_and_the_plot(cli, tmp_path):
    out, png = tmp_path / "steps.csv", tmp_path / "steps.png"
    r = cli("advise", "--model", "gpt3-1.3b", "--gpus", f"{RTX}:4", "--days", "30", "-o", out, "--plot", png)
    assert r.exit_code == 0, r.output
    text = flat(r.output)
    steps = pl.read_csv(out)
    expected = advise("gpt3-1.3b", RTX, 4, days=30).steps
    assert "final plan" in text and expected["technique"][1] in text and "--days 30" in text
    assert steps.height == expected.height and steps["technique"].to_list() == expected["technique"].to_list()
    from vtrain_fast.io.schema import OUTPUT_NAMES
    assert set(OUTPUT_NAMES) | {"status", "step", "phase", "needed_to_fit"} <= set(steps.columns)
    assert steps["iteration_time_s"].to_list() == pytest.approx(expected["iteration_time_s"].to_list())
    r = cli("advise", "--model", "gpt3-1.3b", "--gpus", f"{RTX}:4", "--rule", "greedy", "-o", out, "--overwrite")
    greedy = advise("gpt3-1.3b", RTX, 4, rule="greedy").steps
    # (the title names the rule, but a narrow console crops a wrapped table title: not checked here)
    assert r.exit_code == 0 and "final plan" in flat(r.output)
    assert pl.read_csv(out)["technique"].to_list() == greedy["technique"].to_list()
    assert png.read_bytes()[:4] == b"\x89PNG"
    r = cli("advise", "--model", "gpt3-1.3b", "--gpus", f"{RTX}:4", "-o", tmp_path / "steps.parquet")
    assert r.exit_code == 0 and pl.read_parquet(tmp_path / "steps.parquet").height == expected.height


@pytest.mark.parametrize("args,needle", [
    (["--gpus", "rtx4090-pcie-24gb"], "GPU:COUNT"),
    (["--gpus", "rtx4090:8"], "rtx4090-pcie-24gb"),
    (["--gpus", f"{RTX}:0"], "GPU:COUNT"),
    (["--gpus", f"{RTX}:4", "--days", "-1"], "--days"),
    (["--gpus", f"{RTX}:4", "--days", "3", "--budget-usd", "100"], "one of them"),
    (["--gpus", f"{RTX}:4", "--tokens", "0"], "--tokens"),
    (["--gpus", f"{RTX}:4", "--global-batch-size", "0"], "--global-batch-size"),
    (["--gpus", f"{RTX}:4", "--threshold", "1.5"], "--threshold"),
    (["--gpus", f"{RTX}:4", "--memory-margin", "1"], "--memory-margin"),
    (["--gpus", f"{RTX}:4", "--rule", "greedy-ish"], "best-plan or greedy"),
    (["--gpus", f"{RTX}:4", "--set", "tp=2"], "the ladder sets it"),
    (["--gpus", f"{RTX}:4", "--set", "use_flash_atn=true"], "use_flash_attn"),
    (["--gpus", f"{RTX}:4", "--set", "zero_stage=7"], "zero_stage"),
    (["--gpus", f"{RTX}:4", "--set", "precision=fp4"], "one of bf16"),
    (["--gpus", f"{RTX}:4", "-o", "steps.txt"], "-o"),
    (["--gpus", f"{RTX}:4", "--plot", "steps.jpg"], "--plot"),
])
def test_bad_options_exit_2_without_a_traceback(cli, args, needle, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = cli("advise", "--model", "gpt3-1.3b", *args)
    text = flat(r.output)
    assert r.exit_code == 2, r.output
    assert "Traceback" not in text and needle in text, text
    assert not list(tmp_path.iterdir())        # nothing written


def test_an_unknown_model_exits_2(cli):
    r = cli("advise", "--model", "llama2-7", "--gpus", f"{RTX}:8")
    assert r.exit_code == 2 and "llama2-7b" in flat(r.output) and "Traceback" not in r.output


@pytest.mark.parametrize("name,gpu,n,kw", [("llama2-7b-8x-rtx4090", RTX, 8, dict(budget_usd=10000)),
                                           ("llama2-7b-16x-l40s", L40S, 16, dict(days=30))])
def test_the_shipped_examples_are_current(name, gpu, n, kw):
    """README's advice (examples/advise, written by examples/advise/run.sh) is what advise gives
    now: rerun the script when the cost model moves these numbers."""
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    shipped = pl.read_csv(root / "examples" / "advise" / f"{name}.csv")
    res = advise("llama2-7b", gpu, n, **kw)
    assert shipped["technique"].to_list() == res.steps["technique"].to_list(), "rerun sh examples/advise/run.sh"
    assert shipped["iteration_time_s"].to_list() == pytest.approx(res.steps["iteration_time_s"].to_list(), rel=1e-9)
    text = (root / "examples" / "advise" / f"{name}.txt").read_text(encoding="utf-8")
    readme = (root / "README.md").read_text(encoding="utf-8")
    assert "\n".join(line.rstrip() for line in text.rstrip("\n").split("\n")) in readme
    assert f"{res.final['train_days']:.1f} days" in text and f"${res.best['cost_usd']:,.0f}" in text


def test_a_start_megatron_refuses_exits_2(cli):
    r = cli("advise", "--model", "mixtral-8x7b", "--gpus", f"{L40S}:16", "--set", "ep=3")
    text = flat(r.output)
    assert r.exit_code == 2 and "the start's status" in text and "bad_heads" in text and "Traceback" not in text


def test_the_best_plan_rule_ends_at_the_search_best_one_technique_a_row(seven_b, seven_b_greedy):
    """The default rule: the last row is the search's best plan (every plan of the search fits no
    faster), each row adds one record of it, every row after the first that fits fits, and it is
    at least as fast as the greedy ladder's end."""
    t = seven_b.steps
    assert seven_b.rule == "best-plan" and seven_b.greedy is not None
    assert t["iteration_time_s"][-1] == seven_b.best["iteration_time_s"] == seven_b.final["iteration_time_s"]
    assert all(t[k][-1] == seven_b.best[k] for k in PLAN_INPUTS if k in t.columns)
    fits = t["fits"].to_list()
    first = fits.index(True)
    assert all(fits[first:]) and not any(fits[:first])
    assert t["needed_to_fit"].to_list() == [0 < k <= first for k in range(t.height)]
    names = t["technique"].to_list()[1:]
    assert len(set(names)) == len(names) and all(n in BY_TECHNIQUE for n in names)
    # the records' changes together are the final plan's differences from the start, and no two
    # records set the same column
    knobs = ("tp", "pp", "micro_batch_size", "recompute", *SETTING_COLUMNS)
    start = canonical_values({k: t[k][0] for k in knobs})
    final = canonical_values({k: t[k][-1] for k in knobs})
    changed = {k for k in knobs if start[k] != final[k]}
    named = [k for n in names for k in BY_TECHNIQUE[n].values]
    # no two records set the same column, but FP8 after mixed precision (both set the precision)
    after = sum(1 for n in names if BY_TECHNIQUE[n].after in names)
    assert len(named) == len(set(named)) + after
    assert changed - set(SAME_PLAN) == set(named) - set(SAME_PLAN)
    assert t["iteration_time_s"][-1] <= seven_b_greedy.steps["iteration_time_s"][-1]
    assert seven_b_greedy.steps["iteration_time_s"][-1] / t["iteration_time_s"][-1] > 1.5   # PCIe: greedy commits to tp
    assert any("--rule greedy" in n for n in seven_b.notes)


def test_the_best_plan_order_follows_the_rule_on_a_small_ladder():
    """A hand-built ladder, every plan of it priced here and the rule replayed here: while the plan
    does not fit, add the record that fits (the fastest) or else leaves the least memory; then
    the one that, still fitting, is fastest."""
    import itertools
    names = ("FlashAttention", "full recomputation", "ZeRO-1", "ZeRO-2", "pipeline parallelism 2", "micro-batch 2",
             "8-bit optimizer states", "FP8", "overlapped gradient reduction")
    ladder = tuple(BY_TECHNIQUE[n] for n in names)
    res = advise("llama2-7b", RTX, 8, techniques=ladder, settings={"precision": "bf16"})
    groups = [[None, "FlashAttention"], [None, "full recomputation"], [None, "ZeRO-1", "ZeRO-2"],
              [None, "pipeline parallelism 2"], [None, "micro-batch 2"], [None, "8-bit optimizer states"],
              [None, "FP8"], [None, "overlapped gradient reduction"]]
    row0 = res.steps.row(0, named=True)
    base = {k: row0[k] for k in PLAN_INPUTS}

    def plan_of(records):
        p = dict(base)
        for n in records:
            p.update(BY_TECHNIQUE[n].values)
        p["dp"] = data_parallel_size(p, 8, p["global_batch_size"])
        return p

    def price(list_of_records):
        frame = evaluate_frame(pl.DataFrame([plan_of(r) for r in list_of_records]), "test")
        return frame.rows(named=True)

    combos = [[n for n in c if n] for c in itertools.product(*groups)]
    rows = price(combos)
    assert res.searched == len(combos) == 384
    good = [k for k, r in enumerate(rows) if r["status"] == "ok"]
    best = min(good, key=lambda k: (rows[k]["iteration_time_s"], rows[k]["memory_per_gpu_GiB"]))
    assert res.final["iteration_time_s"] == rows[best]["iteration_time_s"]
    rest = [n for n in names if n in combos[best]]      # ladder order breaks ties
    done, cur, order = [], row0, []
    while rest:
        cand = price([done + [n] for n in rest])
        fit = [k for k, r in enumerate(cand) if r["status"] == "ok"]
        if fit:
            k = min(fit, key=lambda j: (cand[j]["iteration_time_s"], cand[j]["memory_per_gpu_GiB"], j))
        else:
            assert cur["status"] != "ok"        # a fitting plan always has a next record that keeps it fitting here
            k = min(range(len(cand)), key=lambda j: (cand[j]["memory_per_gpu_GiB"], cand[j]["iteration_time_s"], j))
        order.append((rest[k], cand[k]["iteration_time_s"]))
        done.append(rest.pop(k))
        cur = cand[k]
    assert res.steps["technique"].to_list()[1:] == [n for n, _ in order]
    assert res.steps["iteration_time_s"].to_list()[1:] == [s for _, s in order]
    phases = res.steps["phase"].to_list()
    assert phases.count("fit") >= 2 and phases.count("speed") >= 2      # the case exercises both halves


def test_the_start_is_one_record(monkeypatch):
    """START is the one place the start is set: a start with FlashAttention on starts there and
    never offers it."""
    import vtrain_fast.analysis.advise as adv
    monkeypatch.setattr(adv, "START", dict(START, use_flash_attn=True))
    res = adv.advise("gpt3-1.3b", RTX, 4)
    assert res.steps["use_flash_attn"].all() and "FlashAttention" not in res.steps["technique"].to_list()
    assert res.steps["technique"][0] == "start (plain DP)"
