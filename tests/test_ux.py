"""What a new user sees: per-job frontiers, --top per group, top:K folders, reruns of a finished
sweep, and calibration values that sit on a bound. Each check compares with an independent
computation (pareto itself, a brute-force sort) or with the absence/presence of a message."""
from __future__ import annotations

from dataclasses import replace

import polars as pl
import pytest

from conftest import ONE_POINT_SPEC, TINY_SPEC, flat
from vtrain_fast.analysis.calibrate import fit
from vtrain_fast.io.errors import InputError
from vtrain_fast.hardware.gpus import PRESETS
from vtrain_fast.analysis.query import pareto, varying_job_columns
from vtrain_fast.analysis.validate import load_measurements


def _flat(text: str) -> str:
    """Console output with rich's line wrapping undone (words joined by single spaces)."""
    return " ".join(text.split())


def test_varying_job_columns(tiny_sweep):
    # the tiny spec has two model presets and one token budget
    assert varying_job_columns(tiny_sweep) == ["model"]


def test_sweep_pareto_gives_one_frontier_per_job(write_spec, tmp_path, cli):
    spec = write_spec(TINY_SPEC.replace("num_tokens = [1e9]", "num_tokens = [1e9, 2e9]"), "jobs.toml")
    out = tmp_path / "jobs"
    res = cli("sweep", spec, "-o", out, "--pareto")
    assert res.exit_code == 0, res.output
    assert "per model, num_tokens" in _flat(res.output)
    per_job = pareto(out, ["cost_usd", "train_days"], ["model", "num_tokens"])
    assert per_job["num_tokens"].n_unique() == 2 and per_job["model"].n_unique() == 2
    # the plain pareto command warns instead of grouping silently
    res = cli("pareto", out)
    assert res.exit_code == 0 and "--by model --by num_tokens" in _flat(res.output)
    assert "train different jobs" not in _flat(cli("pareto", out, "--by", "model", "--by", "num_tokens").output)


def test_pareto_top_is_per_group(tiny_sweep, cli):
    front = pareto(tiny_sweep, ["cost_usd", "train_days"], ["model"])
    sizes = front.group_by("model").len()["len"].to_list()
    assert min(sizes) >= 2, "the tiny sweep must have two frontier rows per model for this test"
    res = cli("pareto", tiny_sweep, "--by", "model", "--top", "1", "-o", tiny_sweep.parent / "f.parquet")
    assert res.exit_code == 0, res.output
    assert "first 1 of each group" in _flat(res.output)
    assert f"({front.height - 2:,} more frontier rows not shown" in _flat(res.output)
    # -o still writes the whole frontier
    assert pl.read_parquet(tiny_sweep.parent / "f.parquet").height == front.height


def test_top_k_sweep_prints_its_rows(tiny_spec_path, tmp_path, cli, tiny_sweep):
    out = tmp_path / "top"
    res = cli("sweep", tiny_spec_path, "-o", out, "--keep", "top:3:-mfu")
    assert res.exit_code == 0, res.output
    assert "the 3 rows kept (top:3:-mfu)" in _flat(res.output)
    best = (pl.scan_parquet(str(tiny_sweep / "part-*.parquet")).filter(pl.col("status") == "ok")
            .select(pl.col("mfu").max()).collect().item())
    assert f"{best:.3f}" in res.output
    res = cli("pareto", out)
    assert res.exit_code == 2 and "scan_results" in _flat(res.output)


def test_rerun_of_finished_sweep_fails_before_any_output(tiny_spec_path, tmp_path, cli):
    out = tmp_path / "again"
    assert cli("sweep", tiny_spec_path, "-o", out).exit_code == 0
    res = cli("sweep", tiny_spec_path, "-o", out)
    assert res.exit_code == 2
    assert "already holds the finished sweep 'tiny'" in _flat(res.output)
    assert "points" not in res.output.split("error")[0]          # no header, no progress bar
    assert cli("sweep", tiny_spec_path, "-o", out, "--overwrite").exit_code == 0


def test_calibration_writes_exact_zero_for_a_term_the_data_do_not_need():
    """Times made by the model with no per-iteration overhead: the fitted overhead lands on its
    lower bound and is reported as exactly 0.0, not as round-off."""
    from vtrain_fast.analysis.evaluate import evaluate_frame
    truth = replace(PRESETS["a100-sxm4-80gb"].calibration, iteration_overhead_s=0.0)
    df = load_measurements("single").sample(60, seed=3)
    measured = evaluate_frame(df, "synthetic", {"a100-sxm4-80gb": truth})["iteration_time_s"]
    df = df.with_columns(measured_iteration_time_s=measured)
    start = replace(truth, iteration_overhead_s=0.05)
    cal, report = fit(df, "a100-sxm4-80gb", ["iteration_overhead_s"], base=start)
    assert cal.iteration_overhead_s == 0.0
    assert report["mape_after_pct"] == pytest.approx(0.0, abs=1e-6)


def test_calibrate_without_param_keeps_gemm_efficiency_pinned(tmp_path, cli):
    from vtrain_fast.plan.spec import load_calibration
    df = load_measurements("single").sample(40, seed=5)
    csv = tmp_path / "meas.csv"
    df.write_csv(csv)
    out = tmp_path / "cal.toml"
    res = cli("calibrate", csv, "--gpu", "a100-sxm4-80gb", "-o", out)
    assert res.exit_code == 0, res.output
    fitted = load_calibration(out)["a100-sxm4-80gb"]
    assert fitted.gemm_efficiency == PRESETS["a100-sxm4-80gb"].calibration.gemm_efficiency
    assert "gemm_efficiency" not in res.output


def test_reserved_memory_is_a_cluster_override(write_spec, tmp_path, cli):
    from conftest import ONE_POINT_SPEC
    base = ONE_POINT_SPEC.format(training="")
    outs = []
    for k, extra in enumerate(("", "reserved_GiB = 20.0\n")):
        text = base.replace("num_gpus = 8\n", "num_gpus = 8\n" + extra)
        out = tmp_path / f"r{k}"
        assert cli("sweep", write_spec(text, f"r{k}.toml"), "-o", out).exit_code == 0
        outs.append(pl.read_parquet(str(out / "part-*.parquet"))["memory_per_gpu_GiB"][0])
    assert outs[1] - outs[0] == pytest.approx(20.0 - 1.5, rel=1e-12)


def test_pareto_plot_writes_a_png_and_needs_two_objectives(tiny_sweep, tmp_path, cli):
    png = tmp_path / "front.png"
    res = cli("pareto", tiny_sweep, "--by", "model", "--plot", png)
    assert res.exit_code == 0, res.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob("*.tmp"))
    res = cli("pareto", tiny_sweep, "--minimize", "cost_usd", "--plot", tmp_path / "one.png")
    assert res.exit_code == 2 and "two or more --minimize" in _flat(res.output)


def test_pareto_plot_is_checked_before_any_work(tiny_sweep, tmp_path, cli):
    out = tmp_path / "f.parquet"
    res = cli("pareto", tiny_sweep, "--minimize", "cost_usd", "--plot", tmp_path / "one.png", "-o", out)
    assert res.exit_code == 2 and not out.exists()
    res = cli("pareto", tiny_sweep, "--plot", tmp_path / "front.xyz")
    assert res.exit_code == 2 and ".png" in _flat(res.output)


def test_sweep_notes_settings_the_measurements_do_not_cover(write_spec, tmp_path, cli):
    modern = write_spec('name = "modern"\n' + ONE_POINT_SPEC.format(
        training='recompute = ["selective"]\nuse_flash_attn = true'), "modern.toml")
    out = _flat(cli("sweep", modern, "-o", tmp_path / "r").output)
    assert "not validated against measurements: FlashAttention, selective recomputation" in out
    plain = write_spec('name = "plain"\n' + ONE_POINT_SPEC.format(training='recompute = ["full"]'), "plain.toml")
    assert "not validated" not in _flat(cli("sweep", plain, "-o", tmp_path / "p").output)


def test_top_k_of_a_higher_is_better_column_says_how_to_get_the_largest(tiny_spec_path, tmp_path, cli):
    out = _flat(cli("sweep", tiny_spec_path, "-o", tmp_path / "t", "--keep", "top:3:mfu").output)
    assert "write top:K:-mfu for the largest" in out
    out = _flat(cli("sweep", tiny_spec_path, "-o", tmp_path / "u", "--keep", "top:3:-mfu").output)
    assert "write top:K:-mfu" not in out


def test_presets_keep_their_names_in_a_narrow_terminal(monkeypatch):
    from rich.console import Console

    from vtrain_fast import cli as cli_module
    from vtrain_fast.hardware.gpus import PRESETS
    from vtrain_fast.plan.models import MODEL_PRESETS
    narrow = Console(width=90, record=True)
    monkeypatch.setattr(cli_module, "console", narrow)
    cli_module.presets(None)
    text = narrow.export_text()
    assert all(name in text for name in list(MODEL_PRESETS) + list(PRESETS))


def test_presets_lists_every_model_and_gpu_preset(cli):
    from vtrain_fast.hardware.gpus import PRESETS
    from vtrain_fast.plan.models import MODEL_PRESETS
    res = cli("presets")
    assert res.exit_code == 0, res.output
    for name in list(MODEL_PRESETS) + list(PRESETS):
        assert name in res.output, name
    assert "[model]" in res.output and "[cluster]" in res.output


def test_dry_run_checks_the_spec_and_writes_nothing(tiny_spec_path, tmp_path, cli):
    out = tmp_path / "dry"
    res = cli("sweep", tiny_spec_path, "-o", out, "--dry-run")
    assert res.exit_code == 0 and "1,296 points" in res.output and "nothing evaluated" in res.output, res.output
    assert not out.exists()
    bad = tmp_path / "bad.toml"
    bad.write_text(tiny_spec_path.read_text().replace("tp = [1, 2, 4]", "tp = [0]"))
    assert cli("sweep", bad, "--dry-run").exit_code == 2


PER_GPU_SPEC = """\
[model]
presets = ["gpt3-1.3b"]
[training]
num_tokens = 1e11
global_batch_size = 256
micro_batch_size = 1
[cluster]
gpu = ["a100-sxm4-80gb", "h100-sxm-80gb"]
num_gpus = 32
usd_per_gpu_hour = 2.0
[cluster.h100-sxm-80gb]
{h100}
[parallel]
tp = 1
pp = 1
"""


def test_a_gpu_table_under_cluster_overrides_that_gpu_only():
    from vtrain_fast.plan.spec import parse_spec
    spec = parse_spec(PER_GPU_SPEC.format(h100="usd_per_gpu_hour = 3.5\npue = 1.3"), "s.toml")
    a100, h100 = spec.gpus
    assert (a100.usd_per_gpu_hour, a100.pue) == (2.0, 1.0)
    assert (h100.usd_per_gpu_hour, h100.pue) == (3.5, 1.3)
    for text, needle in ((PER_GPU_SPEC.replace("[cluster.h100-sxm-80gb]", "[cluster.h100-sxm-8gb]").format(h100=""),
                          "did you mean 'h100-sxm-80gb'"),
                         (PER_GPU_SPEC.format(h100="pue = 9"), "cluster.h100-sxm-80gb.pue"),
                         (PER_GPU_SPEC.format(h100="gpu = 'a100-sxm4-80gb'"), "cluster.h100-sxm-80gb.gpu")):
        with pytest.raises(InputError, match=needle.replace(".", r"\.")):
            parse_spec(text, "s.toml")


def test_a_written_frontier_evaluates_to_the_same_rows_under_cluster_overrides(write_spec, tmp_path, cli):
    """pareto -o carries each GPU's cluster values (spec overrides and [cluster.<gpu>] tables), so
    evaluate prices the plans exactly as the sweep did."""
    from vtrain_fast.model.records import OUTPUT_NAMES
    spec = PER_GPU_SPEC.format(h100="usd_per_gpu_hour = 3.5\npue = 1.2").replace(
        "num_gpus = 32", "num_nodes = [4, 8]\ngpus_per_node = 4\nreserved_GiB = 20").replace(
        "tp = 1\npp = 1", "tp = [1, 2]\npp = [1, 2]")
    folder = tmp_path / "f"
    assert cli("sweep", write_spec(spec), "-o", folder).exit_code == 0
    res = cli("pareto", folder, "--minimize", "cost_usd", "--minimize", "iteration_time_s", "-o", tmp_path / "f.csv")
    assert res.exit_code == 0, res.output
    res = cli("evaluate", tmp_path / "f.csv", "-o", tmp_path / "e.parquet")
    assert res.exit_code == 0, res.output
    front, again = pl.read_csv(tmp_path / "f.csv"), pl.read_parquet(tmp_path / "e.parquet")
    assert set(front["usd_per_gpu_hour"].to_list()) <= {2.0, 3.5} and (front["gpus_per_node"] == 4).all()
    for col in list(OUTPUT_NAMES) + ["num_nodes"]:
        assert front[col].to_list() == again[col].to_list(), col


def test_keep_all_that_cannot_fit_on_disk_is_refused_before_work(write_spec, tmp_path, cli, monkeypatch):
    import shutil
    from collections import namedtuple
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 0, 10**6))   # 1 MB free
    tokens = ", ".join(str(1e9 + k) for k in range(1_000))
    text = ONE_POINT_SPEC.format(training="").replace("num_tokens = 1e9", f"num_tokens = [{tokens}]")
    out = tmp_path / "big"
    res = cli("sweep", write_spec(text), "-o", out, "--dry-run")     # 1,000 points: >= 10 kB, fine
    assert res.exit_code == 0, res.output
    text = text.replace("micro_batch_size = 1", "micro_batch_size = [" + ", ".join(map(str, range(1, 201))) + "]")
    res = cli("sweep", write_spec(text, "b.toml"), "-o", out, "--dry-run")   # 200,000 points: >= 2 MB
    msg = flat(res.output)
    assert res.exit_code == 2 and "--keep all" in msg and "--keep frontier" in msg, res.output
    assert "(at least 1.9 MiB needed, 977 KiB free)" in msg, res.output
    assert not out.exists()
    assert cli("sweep", write_spec(text, "f.toml"), "-o", out, "--dry-run", "--keep", "frontier").exit_code == 0
    # a shard writes its slice: 200,000 / 4 points, >= 0.5 MB, fits
    assert cli("sweep", write_spec(text, "s.toml"), "-o", out, "--dry-run", "--shard", "2/4").exit_code == 0
