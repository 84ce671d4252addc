"""Every table a command writes is read by every command that reads tables of plans (issue 25,
part 6): pareto -o, plan -o, optimal -o, advise -o (CSV and Parquet) and schedule's jobs.parquet,
each given to evaluate, show and export. Each pair works (evaluate prices the same plans again:
the same iteration times), or, where a table holds no plans (schedule's per-job table), is refused
naming what the table is; never a did-you-mean to an unrelated column. Each writer runs once per
module, on the tiny specs of conftest."""
from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from conftest import flat
from vtrain_fast.cli import app

runner = CliRunner()
# writer -> (its command line, {out} the table written; the formats it writes)
WRITERS = {
    "pareto": (["pareto", "{sweep}", "-o", "{out}"], ("csv", "parquet")),
    "plan": (["plan", "{sweep}", "--deadline-days", "1000", "-o", "{out}"], ("csv", "parquet")),
    "optimal": (["optimal", "--budget-usd", "1e4", "--num-sizes", "2", "--max-params", "3e8", "--max-gpus", "64",
                 "--max-pp", "4", "-o", "{out}"], ("csv", "parquet")),
    "advise": (["advise", "--model", "gpt3-125m", "--gpus", "a100-sxm4-80gb:8", "-o", "{out}"], ("csv", "parquet")),
}
TABLES = [f"{w}.{fmt}" for w, (_, fmts) in WRITERS.items() for fmt in fmts] + ["schedule-jobs.parquet"]
# The tool's tables that hold no plan, and the words naming each in its refusal.
NOT_PLANS = {"schedule-segments.parquet": "allocations of `vtrain-fast schedule`",
             "schedule-summary.parquet": "per-policy summary of `vtrain-fast schedule`",
             "show-events.parquet": "event timeline of one plan", "show-events.csv": "event timeline of one plan",
             "show-memory.parquet": "per-stage memory table of one plan",
             "show-memory.csv": "per-stage memory table of one plan"}
READERS = ("evaluate", "show", "export")


def _run(*args):
    res = runner.invoke(app, [str(a) for a in args])
    assert "Traceback" not in res.output and (res.exception is None or isinstance(res.exception, SystemExit)), \
        (res.output, res.exception)
    return res


@pytest.fixture(scope="module")
def tables(tiny_sweep, tmp_path_factory) -> dict:
    """Each writer's table, written once: name -> path."""
    folder = tmp_path_factory.mktemp("chain")
    out = {}
    for name, (args, fmts) in WRITERS.items():
        for fmt in fmts:
            path = folder / f"{name}.{fmt}"
            res = _run(*[a.format(sweep=tiny_sweep, out=path) for a in args])
            assert res.exit_code == 0 and path.is_file(), res.output
            out[path.name] = path
    trace = folder / "trace.csv"
    pl.DataFrame({"job_id": ["a", "b"], "arrival_hours": [0.0, 1.0], "model": ["gpt3-125m", "gpt3-350m"],
                  "num_tokens": [1e9, 1e9]}).write_csv(trace)
    res = _run("schedule", trace, "--cluster", "a100-sxm4-80gb:16", "--policy", "fifo", "-o", folder / "sched")
    assert res.exit_code == 0, res.output
    out["schedule-jobs.parquet"] = folder / "sched" / "jobs.parquet"
    out["schedule-segments.parquet"] = folder / "sched" / "segments.parquet"
    out["schedule-summary.parquet"] = folder / "sched" / "summary.parquet"
    for fmt in ("csv", "parquet"):
        events, memory = folder / f"show-events.{fmt}", folder / f"show-memory.{fmt}"
        res = _run("show", out["plan.csv"], "--row", "0", "--events", events, "-o", memory)
        assert res.exit_code == 0 and events.is_file() and memory.is_file(), res.output
        out[events.name], out[memory.name] = events, memory
    return out


def _read(path) -> pl.DataFrame:
    return pl.read_parquet(path) if str(path).endswith(".parquet") else pl.read_csv(path)


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("table", TABLES)
def test_each_written_table_is_read_by_each_reader(tables, table, reader, tmp_path):
    path = tables[table]
    args = {"evaluate": ["evaluate", path, "-o", tmp_path / "again.parquet"],
            "show": ["show", path, "--row", "0"], "export": ["export", path, "--row", "0"]}[reader]
    res = _run(*args)
    text = flat(res.output)
    assert "did you mean" not in text and "rename the column" not in text, text
    if table.startswith("schedule"):
        # its rows are jobs, their plans text: refused, naming what the table is
        assert res.exit_code == 2, text
        assert "per-job table of `vtrain-fast schedule`" in text and "first_plan" in text, text
        assert "note:" not in text        # no note about earlier results before the refusal
        return
    assert res.exit_code == 0, text
    if reader == "evaluate":
        # the same plans, priced again from their plan columns: the same iteration times
        written, again = _read(path), pl.read_parquet(tmp_path / "again.parquet")
        assert again.height == written.height and (again["status"] == "ok").all()
        np.testing.assert_allclose(again["iteration_time_s"].to_numpy(), written["iteration_time_s"].to_numpy(),
                                   rtol=1e-12)
        assert "holds earlier results" in text
    elif reader == "show":
        assert "iteration time" in text and "memory per GPU" in text
    else:
        assert "pretrain_gpt.py" in text or "--tensor-model-parallel-size" in text, text


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("table", sorted(NOT_PLANS))
def test_a_table_of_the_tool_that_holds_no_plan_is_named_not_renamed(tables, table, reader, tmp_path):
    """show's events and memory tables and schedule's segments and summary were refused as 'missing
    columns' or with a rename to an unrelated column; each is named for what it is."""
    path = tables[table]
    args = {"evaluate": ["evaluate", path, "-o", tmp_path / "again.parquet"],
            "show": ["show", path, "--row", "0"], "export": ["export", path, "--row", "0"]}[reader]
    res = _run(*args)
    text = flat(res.output)
    assert res.exit_code == 2 and NOT_PLANS[table] in text, text
    assert "did you mean" not in text and "rename the column" not in text and "missing column" not in text, text
    assert not (tmp_path / "again.parquet").exists()


def test_a_schedule_folder_is_not_a_sweep(tables):
    """pareto, plan and show on a schedule's output folder say what it is (not an interrupted sweep)."""
    folder = tables["schedule-jobs.parquet"].parent
    for args in (["pareto", folder], ["plan", folder, "--deadline-days", "10"], ["show", folder]):
        res = _run(*args)
        text = flat(res.output)
        assert res.exit_code == 2 and "schedule output folder" in text and "not a sweep results folder" in text, text
        assert "interrupted" not in text
