"""Training settings as axes: a list for vpp or a training switch multiplies the gpu axis into
one machine per combination, and each row equals the row of a sweep that fixes those values."""
from __future__ import annotations

import itertools
import json
import math

import polars as pl
import pytest

from vtrain_fast.engine.chunks import evaluate_chunk
from vtrain_fast.io.errors import InputError
from vtrain_fast.plan.grid import build_grid
from vtrain_fast.io.schema import SETTING_COLUMNS
from vtrain_fast.model.settings import BY_NAME, SWITCHES
from vtrain_fast.plan.spec import TRAINING_FLAGS, parse_spec

from conftest import ONE_POINT_SPEC, SMALL_SWEEP

# 2 GPUs x (2 sequence_parallel x 2 vpp) machines x 2 tp x 3 pp x 2 mbs x 2 recompute
AXES_SPEC = """\
[model]
presets = ["gpt3-1.3b"]
[training]
num_tokens = 1e11
global_batch_size = 256
micro_batch_size = [1, 2]
recompute = ["none", "selective"]
sequence_parallel = {sp}
[cluster]
gpu = ["a100-sxm4-80gb", "h100-sxm-80gb"]
num_gpus = 32
[parallel]
tp = [1, 2]
pp = [1, 2, 4]
vpp = {vpp}
"""
KEYS = ["gpu", "tp", "pp", "micro_batch_size", "recompute"]


def _rows(text: str) -> pl.DataFrame:
    grid = build_grid(parse_spec(text, "axes.toml"))
    return pl.from_arrow(evaluate_chunk(grid, 0, grid.num_points))


def test_each_flag_takes_a_list_and_every_combination_becomes_a_machine():
    for flag in TRAINING_FLAGS:
        lines = {"training": [], "parallel": []}
        lines[BY_NAME[flag].table].append(f"{flag} = [false, true, false]")
        for k, v in BY_NAME[flag].requires:         # what it needs, in that setting's table
            lines[BY_NAME[k].table].append(f'{k} = "{v}"' if isinstance(v, str) else f"{k} = {str(v).lower()}")
        for k, v in BY_NAME[flag].inert_with:       # no effect at another setting's default: leave it
            other = BY_NAME[k]
            if other.default == v and other.kind in (int, float):
                lines[other.table].append(f"{k} = {v + 1}")
            elif other.default == v and other.kind is bool:     # a switch it needs on (with what that needs)
                lines[other.table].append(f"{k} = {str(not v).lower()}")
                for k2, v2 in other.requires:
                    lines[BY_NAME[k2].table].append(f"{k2} = {str(v2).lower()}")
        text = ONE_POINT_SPEC.format(training="\n".join(lines["training"]))
        text = text.replace("pp = 1", "\n".join(["pp = 1", *lines["parallel"]]))
        spec = parse_spec(text, "s.toml")
        assert [getattr(g, flag) for g in spec.gpus] == [False, True], flag
    spec = parse_spec(AXES_SPEC.format(sp="[false, true]", vpp="[1, 2]"), "s.toml")
    combos = [(g.name, g.sequence_parallel, g.vpp) for g in spec.gpus]
    assert combos == [(n, sp, v) for n in ("a100-sxm4-80gb", "h100-sxm-80gb")
                      for sp in (False, True) for v in (1, 2)]
    assert spec.num_points == 2 * 4 * 2 * 3 * 2 * 2
    assert dict(spec.settings)["vpp"] == (1, 2)


@pytest.mark.parametrize("bad", ["[]", "[true, 1]", '["true"]', "[[true]]", "1"])
def test_a_bad_switch_value_names_the_key_and_the_list_form(bad):
    with pytest.raises(InputError, match=r"training\.sequence_parallel") as e:
        parse_spec(ONE_POINT_SPEC.format(training=f"sequence_parallel = {bad}"), "s.toml")
    assert "s.toml" in str(e.value)


def _same(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def test_rows_of_a_settings_axis_equal_the_sweeps_that_fix_them():
    both = _rows(AXES_SPEC.format(sp="[false, true]", vpp="[1, 2]"))
    assert both.height == 2 * 4 * 2 * 3 * 2 * 2
    for sp in (False, True):
        for vpp in (1, 2):
            one = _rows(AXES_SPEC.format(sp=str(sp).lower(), vpp=vpp)).sort(KEYS)
            part = both.filter((pl.col("sequence_parallel") == sp) & (pl.col("vpp") == vpp)).sort(KEYS)
            assert part.height == one.height
            fresh = (part["status"] != "repeat").to_list()
            # a repeat row is first evaluated under the first machine (sp false, vpp 1) ...
            assert any(fresh) and (all(fresh) if (sp, vpp) == (False, 1) else not all(fresh))
            for col in one.columns:
                a, b = part[col].to_list(), one[col].to_list()
                assert all(_same(x, y) for x, y, f in zip(a, b, fresh) if f), (sp, vpp, col)
            # ... at tp = 1 for sequence parallelism, at pp = 1 for vpp
            rep = part.filter(pl.col("status") == "repeat")
            assert (rep["tp"] == 1).all() if vpp == 1 else (rep["pp"] == 1).all() if not sp else \
                ((rep["tp"] == 1) | (rep["pp"] == 1)).all()
    # the axis changes the results: sequence parallelism moves activations at tp = 2
    tp2 = both.filter((pl.col("tp") == 2) & (pl.col("status") == "ok"))
    act = tp2.group_by("sequence_parallel").agg(pl.col("activations_GiB").mean()).sort("sequence_parallel")
    assert act["activations_GiB"][1] < act["activations_GiB"][0]


# Every setting of the registry as an axis: vpp = [1, 2], zero_stage = [0, 3] and training switches
# as [false, true], less the optimizer's storage switches (they change only the optimizer's memory
# and step; tests/test_optimizer_states.py and tests/test_offload.py cover them) and the parallel
# switches without effect on dense models (overlap_moe_expert_parallel_comm would only repeat this
# dense model's rows unmarked: the sweep's repeat status does not see models; test_moe_dispatch).
OPTIMIZER_STORAGE = ("use_precision_aware_optimizer", "optimizer_cpu_offload", "overlap_cpu_optimizer_d2h_h2d")
AXIS_SWITCHES = tuple(st.name for st in SWITCHES if (st.table == "training" and st.name not in OPTIMIZER_STORAGE)
                      or (st.table == "parallel" and not st.inert_models))
ALL_SETTINGS_SPEC = """\
[model]
presets = ["gpt3-1.3b"]
[training]
num_tokens = 1e11
global_batch_size = 64
micro_batch_size = 2
recompute = ["full", "selective"]
zero_stage = [0, 3]
{training}
[cluster]
gpu = "a100-sxm4-80gb"
num_gpus = [4, 8]
[parallel]
tp = [1, 2]
pp = [1, 2]
vpp = [1, 2]
{parallel}
"""
# The product of all of them (2^12 switch machines) is slow to build and to check: instead every
# switch alone, then a seeded sample of combinations of COMBO_SIZE switches that together put every
# pair of switches on one sweep's axes (random.Random(SEED); of CANDIDATES random draws the one that
# covers the most pairs not covered yet, until none is left). A switch brings in the switches it
# requires (overlap_param_gather: distributed_optimizer and overlap_grad_reduce).
COMBO_SIZE, CANDIDATES, SEED = 5, 20, 26


def _with_requirements(names) -> tuple[str, ...]:
    out = set(names)
    while True:
        more = {k for n in out for k, v in BY_NAME[n].requires if k in AXIS_SWITCHES and v is True} - out
        if not more:
            return tuple(n for n in AXIS_SWITCHES if n in out)
        out |= more


def _switch_samples() -> list[tuple[str, ...]]:
    """Every switch alone, then the seeded sample of combinations that covers every pair."""
    import random
    rng = random.Random(SEED)
    samples = [_with_requirements([n]) for n in AXIS_SWITCHES]
    left = set(itertools.combinations(AXIS_SWITCHES, 2))
    while left:
        draws = [_with_requirements(rng.sample(AXIS_SWITCHES, COMBO_SIZE)) for _ in range(CANDIDATES)]
        best = max(draws, key=lambda axes: len(left & set(itertools.combinations(axes, 2))))
        left -= set(itertools.combinations(best, 2))
        samples.append(best)
    return samples


def _switch_spec(axes) -> str:
    lines = {"training": [], "parallel": []}
    for n in axes:
        lines[BY_NAME[n].table].append(f"{n} = [false, true]")
    return ALL_SETTINGS_SPEC.format(training="\n".join(lines["training"]), parallel="\n".join(lines["parallel"]))


def test_the_switch_samples_cover_every_switch_and_every_pair():
    """The sample the repeat-row test sweeps: every switch alone, every pair of switches on one
    sweep's axes, the same every run."""
    samples = _switch_samples()
    assert "sequence_parallel" in AXIS_SWITCHES and "use_precision_aware_optimizer" not in AXIS_SWITCHES
    # each alone first, with the switches it requires
    assert all(n in s for n, s in zip(AXIS_SWITCHES, samples))
    assert ("sequence_parallel",) in samples and ("sequence_parallel", "tp_comm_overlap") in samples
    assert ("overlap_grad_reduce", "distributed_optimizer", "overlap_param_gather") in samples
    together = {frozenset(p) for s in samples for p in itertools.combinations(s, 2)}
    assert together == {frozenset(p) for p in itertools.combinations(AXIS_SWITCHES, 2)}
    assert samples == _switch_samples()          # seeded: the same sample every run


def _canonical(v):
    return "nan" if isinstance(v, float) and math.isnan(v) else v


@pytest.mark.parametrize("axes", _switch_samples(), ids=[f"alone-{n}" for n in AXIS_SWITCHES] + [
    f"combination-{k}" for k in range(len(_switch_samples()) - len(AXIS_SWITCHES))])
def test_every_repeat_row_is_a_plan_some_kept_row_already_prices_exactly(axes):
    """Evaluate each `repeat` row on its own (evaluate never marks repeats) and find a kept row of
    the same plan with bit-identical outputs; and no two kept rows are one plan priced alike."""
    from vtrain_fast.analysis.evaluate import evaluate_frame
    from vtrain_fast.model.records import OUTPUT_NAMES
    rows = _rows(_switch_spec(axes)).with_columns(pl.col("gpu").cast(pl.String), pl.col("recompute").cast(pl.String))
    rep = rows.filter(pl.col("status") == "repeat")
    kept = rows.filter(pl.col("status") != "repeat")
    assert rep.height > 0 and kept.height > 0
    plan = ["num_gpus", "tp", "pp", "dp", "micro_batch_size", "global_batch_size", "recompute"]
    inputs = ["num_layers", "hidden_size", "num_attention_heads", "seq_length", "gpu", "tp", "pp", "dp",
              "micro_batch_size", "global_batch_size", "num_tokens", "recompute", *SETTING_COLUMNS]
    again = evaluate_frame(rep.select(inputs), "rows")
    twin = plan + ["use_flash_attn"] + list(OUTPUT_NAMES)        # a set of the kept rows: one look-up a row
    priced = {tuple(map(_canonical, r)) for r in kept.select(twin).iter_rows()}
    for r in again.select(twin).iter_rows():
        assert tuple(map(_canonical, r)) in priced, dict(zip(twin, r))
    # no two kept rows are one plan priced alike under different settings; except that with both
    # pipeline-split flags, (L + 2) / 2 - 1 = L / 2: at pp = 2 they split as evenly as none (a
    # rule the registry's vocabulary of sizes equal to 1 cannot state, so those rows are priced)
    ok = kept.filter(pl.col("status").is_in(["ok", "out_of_memory"]),
                     ~((pl.col("pp") == 2) & pl.col("account_for_embedding_in_pipeline_split")
                       & pl.col("account_for_loss_in_pipeline_split")))
    assert ok.select(plan + list(OUTPUT_NAMES)).n_unique() == ok.height


def test_gpu_column_names_each_gpu_once():
    grid = build_grid(parse_spec(AXES_SPEC.format(sp="[false, true]", vpp="[1, 2]"), "axes.toml"))
    gpu = evaluate_chunk(grid, 0, grid.num_points).column("gpu")
    assert gpu.dictionary.to_pylist() == ["a100-sxm4-80gb", "h100-sxm-80gb"]
    half = grid.num_points // 2      # the gpu axis is outside tp, pp, mbs and recompute
    assert gpu.indices.to_pylist() == [0] * half + [1] * half


def test_flash_attention_list_skips_a_gpu_without_the_kernel_and_says_so():
    text = ONE_POINT_SPEC.format(training="use_flash_attn = [false, true]").replace(
        'gpu = "a100-sxm4-80gb"', 'gpu = ["a100-sxm4-80gb", "v100-sxm2-32gb"]')
    spec = parse_spec(text, "s.toml")
    assert [(g.name, g.use_flash_attn) for g in spec.gpus] == [
        ("a100-sxm4-80gb", False), ("a100-sxm4-80gb", True), ("v100-sxm2-32gb", False)]
    assert len(spec.notes) == 1 and "v100-sxm2-32gb" in spec.notes[0]
    assert spec.setting_axes == ("use_flash_attn",)
    v100 = parse_spec(text.replace('["a100-sxm4-80gb", "v100-sxm2-32gb"]', '"v100-sxm2-32gb"'), "s.toml")
    assert [g.use_flash_attn for g in v100.gpus] == [False] and v100.setting_axes == ()
    with pytest.raises(InputError, match="use_flash_attn"):
        parse_spec(text.replace("[false, true]", "true"), "s.toml")


def test_sweep_prints_the_settings_that_tell_plans_apart(write_spec, tmp_path, cli, wide_console):
    path = write_spec(AXES_SPEC.format(sp="[false, true]", vpp="1"), "axes.toml")
    out = tmp_path / "axes"
    res = cli("sweep", path, "-o", out, "--keep", "top:5:iteration_time_s")
    assert res.exit_code == 0, res.output
    assert "sequence_parallel" in res.output and "vpp" not in res.output
    full = tmp_path / "full"
    assert cli("sweep", path, "-o", full).exit_code == 0
    res = cli("pareto", full, "--minimize", "iteration_time_s", "--minimize", "memory_per_gpu_GiB",
              "-o", tmp_path / "front.csv")
    assert res.exit_code == 0, res.output
    assert "sequence_parallel" in res.output and "use_flash_attn" not in res.output
    # the file holds whole plans (every column) and evaluates to the same rows
    front = pl.read_csv(tmp_path / "front.csv")
    from vtrain_fast.analysis.evaluate import CLUSTER_COLUMNS
    from vtrain_fast.io.schema import DERIVED_NAMES     # memory headroom: written, passed through by evaluate
    assert front.columns == (pl.read_parquet(str(full / "part-*.parquet")).columns + list(DERIVED_NAMES)
                             + list(CLUSTER_COLUMNS))
    res = cli("evaluate", tmp_path / "front.csv", "-o", tmp_path / "again.parquet")
    assert res.exit_code == 0 and "recomputed" in res.output, res.output
    again = pl.read_parquet(tmp_path / "again.parquet")
    from vtrain_fast.model.records import OUTPUT_NAMES
    for col in list(OUTPUT_NAMES) + ["sequence_parallel", "vpp", "num_nodes"]:
        assert all(_same(a, b) for a, b in zip(again[col].to_list(), front[col].to_list())), col
    # the Parquet frontier reads back too
    assert cli("pareto", full, "--minimize", "iteration_time_s", "-o", tmp_path / "front.parquet").exit_code == 0
    res = cli("evaluate", tmp_path / "front.parquet", "-o", tmp_path / "again2.csv")
    assert res.exit_code == 0, res.output
    labels = list(json.loads((full / "manifest.json").read_text())["machine_vectors"])
    assert labels == ["a100-sxm4-80gb sequence_parallel=false", "a100-sxm4-80gb sequence_parallel=true",
                      "h100-sxm-80gb sequence_parallel=false", "h100-sxm-80gb sequence_parallel=true"]


def test_top_k_rows_show_a_setting_axis_even_where_they_agree(write_spec, tmp_path, cli):
    """Which settings to show comes from the spec's lists, not from the rows kept."""
    path = write_spec(AXES_SPEC.format(sp="[false, true]", vpp="1").replace(
        "sequence_parallel = [false, true]", "sequence_parallel = [false, true]\nuse_flash_attn = [false, true]"))
    res = cli("sweep", path, "-o", tmp_path / "top", "--keep", "top:2:iteration_time_s")
    assert res.exit_code == 0, res.output
    rows = pl.read_parquet(str(tmp_path / "top" / "part-*.parquet"))
    assert rows["use_flash_attn"].all()          # the fastest plans all use it ...
    assert "use_flash_attn" in res.output        # ... and the table says so


def test_redundant_async_machines_with_sequence_parallelism_are_left_out():
    spec = parse_spec(ONE_POINT_SPEC.format(training="sequence_parallel = [false, true]\n"
                                            "async_tensor_model_parallel_allreduce = [false, true]"), "s.toml")
    assert [(g.sequence_parallel, g.async_tensor_model_parallel_allreduce) for g in spec.gpus] == [
        (False, False), (False, True), (True, False)]
    assert any("sequence_parallel" in n for n in spec.notes)


def test_a_key_in_the_wrong_table_says_where_it_belongs():
    with pytest.raises(InputError, match=r"training\.vpp.*move it to the \[parallel\] table"):
        parse_spec(ONE_POINT_SPEC.format(training="vpp = 2"), "s.toml")


@pytest.mark.parametrize("name", ["rows.txt", "rows"])
def test_output_file_suffix_is_checked_before_any_work(tmp_path, cli, name):
    res = cli("validate", "-o", tmp_path / name)
    assert res.exit_code == 2 and ".csv" in res.output and not (tmp_path / name).exists()


def _key_rows(df, cols):
    return sorted(df.select(cols).cast(pl.String).rows())


def test_a_frontier_per_setting_value_counts_the_plans_the_setting_does_not_change(write_spec, tmp_path, cli):
    """`pareto --by S` and `--where S==v` on a list sweep give the frontier of the sweep that fixes
    S = v, although the list sweep priced plans where S has no effect only once (status repeat)."""
    from vtrain_fast.analysis.query import pareto
    text = AXES_SPEC.replace('gpu = ["a100-sxm4-80gb", "h100-sxm-80gb"]', 'gpu = "a100-sxm4-80gb"')
    both = tmp_path / "both"
    assert cli("sweep", write_spec(text.format(sp="[false, true]", vpp="[1, 2]"), "b.toml"), "-o", both).exit_code == 0
    key = ["tp", "pp", "dp", "micro_batch_size", "recompute", "iteration_time_s", "cost_usd"]
    objectives = ["iteration_time_s", "cost_usd"]
    for setting, values in (("sequence_parallel", ("false", "true")), ("vpp", ("1", "2"))):
        per = pareto(both, objectives, [setting])
        for v in values:
            fixed = tmp_path / f"{setting}{v}"
            one = text.format(sp=v if setting == "sequence_parallel" else "false",
                              vpp=v if setting == "vpp" else "1")
            assert cli("sweep", write_spec(one, f"{setting}{v}.toml"), "-o", fixed).exit_code == 0
            want = _key_rows(pareto(fixed, objectives), key)
            got = per.filter(pl.col(setting).cast(pl.String).str.to_lowercase() == v)
            assert _key_rows(got, key) == want, (setting, v)
            where = pareto(both, objectives, where=[f"{setting}=={v}"])
            assert _key_rows(where, key) == want, (setting, v)


def test_top_k_by_a_short_column_name(write_spec, tmp_path, cli):
    res = cli("sweep", write_spec(AXES_SPEC.format(sp="false", vpp="1")), "-o", tmp_path / "top",
              "--keep", "top:3:iter_s")
    assert res.exit_code == 0 and "iteration_time_s" in res.output, res.output


@pytest.mark.parametrize("extra, condition", [
    ("tp = 1", "sequence_parallel==true"),                       # every SP plan is a repeat
    ("pp = 1\nvpp = [1, 2]", "vpp==2"),
    ("sequence_parallel = true\nasync_tensor_model_parallel_allreduce = [false, true]",
     "async_tensor_model_parallel_allreduce==true"),            # those machines are left out
])
def test_a_value_without_plans_of_its_own_still_has_its_frontier(write_spec, tmp_path, cli, extra, condition):
    from vtrain_fast.analysis.query import pareto
    base = AXES_SPEC.format(sp="[false, true]", vpp="1").replace(
        'gpu = ["a100-sxm4-80gb", "h100-sxm-80gb"]', 'gpu = "a100-sxm4-80gb"')
    for line in extra.splitlines():
        key = line.split("=")[0].strip()
        base = "\n".join(l for l in base.splitlines() if not l.startswith(key + " "))
        section = "[parallel]" if key in ("tp", "pp") or (key in BY_NAME and BY_NAME[key].table == "parallel") \
            else "[training]"
        base = base.replace(section, section + "\n" + line)
    folder = tmp_path / "f"
    assert cli("sweep", write_spec(base, "f.toml"), "-o", folder).exit_code == 0
    got = pareto(folder, ["iteration_time_s", "cost_usd"], where=[condition])
    assert got.height > 0
    setting, value = condition.split("==")
    assert (got[setting].cast(pl.String).str.to_lowercase() == value).all()


PLAN_KEYS = ["num_gpus", "tp", "pp", "dp", "micro_batch_size", "sequence_parallel", "tp_comm_overlap",
             "distributed_optimizer", "overlap_grad_reduce", "overlap_param_gather"]


SETTING_KEYS = {"sp": "sequence_parallel", "tco": "tp_comm_overlap", "do": "distributed_optimizer",
                "ogr": "overlap_grad_reduce", "opg": "overlap_param_gather"}


def _spec_of(order, **fixed):
    """SMALL_SWEEP with the five related switches as lists in ``order`` (or fixed values)."""
    lists = {k: ("[true, false]" if order == "tf" else "[false, true]") for k in SETTING_KEYS}
    values = {**lists, **fixed}
    return SMALL_SWEEP.format(training="\n".join(f"{SETTING_KEYS[k]} = {v}" for k, v in values.items()))


def test_the_order_of_a_settings_list_changes_no_plan_and_no_frontier(tmp_path, write_spec, cli):
    """[true, false] and [false, true] price the same plans (a refused machine stands in for no
    other), and a frontier of one value (--where) equals the sweep that fixes the value."""
    from vtrain_fast.analysis.query import pareto
    keys = ["cost_usd", "train_days"]
    folders = {}
    for order in ("tf", "ft"):
        folders[order] = tmp_path / order
        assert cli("sweep", write_spec(_spec_of(order), f"{order}.toml"), "-o", folders[order]).exit_code == 0
    # the same priced plans (which machine's row stands for a repeat group may differ), and the
    # same frontier for every combination of the settings once pareto counts them for every value
    a, b = (_ok(folders[o]).select(PLAN_KEYS[:5] + ["iteration_time_s"]).unique().sort(PLAN_KEYS[:5] + ["iteration_time_s"])
            for o in ("tf", "ft"))
    assert a.height > 0 and a.equals(b)
    settings = PLAN_KEYS[5:]
    fa, fb = (pareto(folders[o], keys, by=settings).select(settings + PLAN_KEYS[:5] + keys).sort(settings + keys)
              for o in ("tf", "ft"))
    assert fa.height > 0 and fa.equals(fb)
    assert not fa.filter(pl.col("tp_comm_overlap") & (~pl.col("sequence_parallel") | (pl.col("tp") == 1))).height
    assert not fa.filter(pl.col("overlap_param_gather")
                         & ~(pl.col("distributed_optimizer") & pl.col("overlap_grad_reduce"))).height
    for key, short in (("tp_comm_overlap", "tco"), ("overlap_param_gather", "opg")):
        for value in ("true", "false"):
            fixed = tmp_path / f"{short}-{value}"
            spec = write_spec(_spec_of("ft", **{short: value}), f"{short}-{value}.toml")
            assert cli("sweep", spec, "-o", fixed).exit_code == 0
            want = pareto(fixed, keys, where=[f"{key}=={value}"]).select(keys).sort(keys)   # it relabels too
            for order in ("tf", "ft"):
                got = pareto(folders[order], keys, where=[f"{key}=={value}"]).select(keys).sort(keys)
                assert got.equals(want), (key, value, order)


def _ok(folder):
    from vtrain_fast.analysis.query import scan_results
    return scan_results(folder).filter(pl.col("status") == "ok").collect()
