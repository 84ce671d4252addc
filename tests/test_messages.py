"""Messages that point the right way (issue 25, part 6): each names the file, key and value and
the real fix, exits 2 without a traceback; one test per message that used to mislead."""
from __future__ import annotations

import pytest
import polars as pl
from typer.testing import CliRunner

from conftest import ONE_POINT_SPEC, TINY_SPEC, flat
from vtrain_fast.cli import app

runner = CliRunner()


def refused(*args) -> str:
    """Run the CLI; assert exit 2, one error message and no traceback; return the text (one line)."""
    res = runner.invoke(app, [str(a) for a in args])
    text = flat(res.output)
    assert res.exit_code == 2, text
    assert "error:" in text and "Traceback" not in text, text
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    return text


PLAN_ROW = {"model": "gpt3-125m", "gpu": "a100-sxm4-80gb", "tp": 1, "pp": 1, "dp": 8, "micro_batch_size": 1,
            "global_batch_size": 8}


def test_a_toml_key_given_twice_names_the_key_and_both_lines(tmp_path):
    text = ONE_POINT_SPEC.format(training="micro_batch_size = 2")
    spec = tmp_path / "twice.toml"
    spec.write_text(text)
    lines = text.splitlines()
    first = lines.index("micro_batch_size = 1") + 1
    again = lines.index("micro_batch_size = 2") + 1
    msg = refused("sweep", spec, "-o", tmp_path / "out")
    assert f"twice.toml, line {again}" in msg and "key training.micro_batch_size" in msg, msg
    assert f"given twice (also on line {first})" in msg and "micro_batch_size = [1, 2]" in msg, msg
    assert "Cannot overwrite" not in msg


def test_merge_says_which_shards_are_missing_as_ranges(tmp_path):
    spec = tmp_path / "tiny.toml"
    spec.write_text(TINY_SPEC)
    n = 9999
    res = runner.invoke(app, ["sweep", str(spec), "-o", str(tmp_path / "out"), "--shard", f"1/{n}"])
    assert res.exit_code == 0, res.output
    msg = refused("merge", tmp_path / "out")
    assert f"{n - 1:,} of {n:,} missing" in msg and f"missing: 2-{n}" in msg, msg
    assert len(msg) < 1000, len(msg)


def test_optimal_config_value_is_blamed_on_the_study_file(tmp_path):
    study = tmp_path / "study.toml"
    study.write_text("[optimal]\nbudget_usd = -5\n")
    msg = refused("optimal", "--config", study)
    assert msg.startswith(f"error: {study}: optimal.budget_usd = -5") and "command line" not in msg.split("Fix")[0], msg
    assert "--budget-usd on the command line overrides" in msg
    # the same value typed on the command line is still the command line's
    assert "command line: --budget-usd" in refused("optimal", "--config", study, "--budget-usd", "-3")


def test_show_names_the_events_option(tmp_path):
    plans = tmp_path / "plans.csv"
    pl.DataFrame([PLAN_ROW]).write_csv(plans)
    msg = refused("show", plans, "--events", tmp_path / "x.txt")
    assert "--events" in msg and "x.txt" in msg and "-o =" not in msg and "e.g. -o" not in msg, msg


@pytest.mark.parametrize("command", ["show", "export"])
@pytest.mark.parametrize("name", ["nothere.csv", "nothere"])
def test_a_missing_plan_path_is_said_to_be_missing(tmp_path, command, name):
    path = tmp_path / name
    msg = refused(command, path)
    assert f"nothing exists at {path}" in msg and "check the path" in msg, msg


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be", "utf-32"])
def test_a_utf16_csv_is_an_encoding_error(tmp_path, encoding):
    path = tmp_path / "plans.csv"
    df = pl.DataFrame([PLAN_ROW])
    path.write_bytes(df.write_csv().encode(encoding))
    msg = refused("evaluate", path, "-o", tmp_path / "out.csv")
    assert f"{path}: encoding" in msg and "UTF-8" in msg and "UTF-" in msg.split("allowed")[0], msg
    assert "missing column" not in msg


def test_a_header_only_csv_has_no_rows(tmp_path):
    path = tmp_path / "header.csv"
    path.write_text(",".join(PLAN_ROW) + "\n")
    msg = refused("evaluate", path, "-o", tmp_path / "out.csv")
    assert "header.csv: rows = 0" in msg and "add rows" in msg and "missing column" not in msg, msg


def test_reserved_memory_fix_names_the_gpu_s_own_value(tmp_path):
    from vtrain_fast.hardware.gpus import PRESETS
    gpu = PRESETS[PLAN_ROW["gpu"]]
    bad = gpu.hbm_GiB + 10
    path = tmp_path / "plans.csv"
    pl.DataFrame([{**PLAN_ROW, "reserved_GiB": bad}]).write_csv(path)
    msg = refused("evaluate", path, "-o", tmp_path / "out.csv")
    assert "column reserved_GiB, row 2" in msg and f"{bad:g}" in msg, msg
    assert f"keeps {gpu.reserved_GiB:g} GiB" in msg and f"default {bad:g}" not in msg, msg


@pytest.fixture(scope="module")
def schedule_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sched")
    trace = folder / "trace.csv"
    pl.DataFrame({"job_id": ["a"], "arrival_hours": [0.0], "model": ["gpt3-125m"], "num_tokens": [1e9]}).write_csv(trace)
    res = runner.invoke(app, ["schedule", str(trace), "--cluster", "a100-sxm4-80gb:16", "--policy", "fifo", "-o",
                              str(folder / "out")])
    assert res.exit_code == 0, res.output
    return folder / "out"


@pytest.mark.parametrize("command", ["pareto", "report"])
def test_a_schedule_folder_is_not_called_an_interrupted_sweep(schedule_folder, tmp_path, command):
    args = [command, schedule_folder] + (["-o", tmp_path / "report"] if command == "report" else [])
    msg = refused(*args)
    assert "schedule output folder" in msg and "jobs.parquet" in msg and "not a sweep results folder" in msg, msg
    assert "interrupted" not in msg


def test_show_on_a_table_of_several_plans_suggests_row_not_where(tmp_path):
    path = tmp_path / "plans.csv"
    pl.DataFrame([{**PLAN_ROW, "global_batch_size": 16}, {**PLAN_ROW, "dp": 16, "global_batch_size": 16}]).write_csv(path)
    msg = refused("show", path)
    assert "plans = 2" in msg and "--row K" in msg and "narrow it with --where" not in msg, msg


def test_an_output_column_given_as_input_is_never_renamed(tmp_path):
    """A result column (num_steps, which the old rule took for num_experts) is set aside with a note:
    the plan is priced from its plan columns."""
    from vtrain_fast.analysis.evaluate import INPUT_NAMES
    from vtrain_fast.io.errors import did_you_mean
    assert did_you_mean("num_steps", INPUT_NAMES, "none") == "none"
    path = tmp_path / "plans.csv"
    pl.DataFrame([{**PLAN_ROW, "num_steps": 10, "cost_usd": 1.0}]).write_csv(path)
    res = runner.invoke(app, ["evaluate", str(path), "-o", str(tmp_path / "out.csv")])
    text = flat(res.output)
    assert res.exit_code == 0 and "holds earlier results" in text and "rename" not in text, text
    assert pl.read_csv(tmp_path / "out.csv")["num_steps"][0] != 10
