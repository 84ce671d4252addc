"""The output rule (vtrain_fast.io.outputs.check_output): no command replaces one of its inputs, a
results folder, a folder holding anything it did not write, a device or named pipe, or the current
folder; without --overwrite no command replaces an existing output; writes are all or nothing."""
from __future__ import annotations

import errno
import os
import shutil
import stat
from pathlib import Path

import polars as pl
import pytest

from conftest import flat

GPU = "a100-sxm4-80gb"


def _snapshot(folder: Path) -> dict:
    """Every file under ``folder`` and its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def results(tiny_sweep, tmp_path) -> Path:
    """A copy of the session's tiny results folder that a test may lose (on old code)."""
    return Path(shutil.copytree(tiny_sweep, tmp_path / "r"))


@pytest.fixture
def trace_csv(tmp_path) -> Path:
    path = tmp_path / "d" / "t.csv"
    path.parent.mkdir()
    pl.DataFrame([dict(job_id="a", arrival_hours=0.0, model="gpt3-125m", num_tokens=1e9)]).write_csv(path)
    return path


@pytest.fixture
def plans_csv(tmp_path) -> Path:
    p = tmp_path / "plans.csv"
    p.write_text("num_layers,hidden_size,num_attention_heads,seq_length,global_batch_size,micro_batch_size,tp,pp,dp,gpu\n"
                 f"12,768,12,2048,8,1,1,1,8,{GPU}\n")
    return p


# ------------------------------------------------------------------- (a) an input is never replaced
def test_report_into_its_own_results_folder_is_refused_and_the_folder_kept(results, cli):
    before = _snapshot(results)
    res = cli("report", results, "-o", results, "--overwrite")
    assert res.exit_code == 2 and "reads and never replaces" in flat(res.output), res.output
    assert _snapshot(results) == before


def test_schedule_into_the_folder_of_its_trace_is_refused_and_the_trace_kept(trace_csv, cli):
    text = trace_csv.read_bytes()
    res = cli("schedule", trace_csv, "--cluster", f"{GPU}:16", "-o", trace_csv.parent, "--overwrite")
    assert res.exit_code == 2 and "reads and never replaces" in flat(res.output), res.output
    assert str(trace_csv.name) in flat(res.output) and trace_csv.read_bytes() == text


# ------------------------------------------------------------ (b) a results folder is never replaced
def test_report_into_a_folder_holding_a_results_folder_is_refused(tiny_sweep, results, tmp_path, cli):
    parent = tmp_path / "parent"
    inner = Path(shutil.move(results, parent / "inner"))
    before = _snapshot(parent)
    res = cli("report", tiny_sweep, "-o", parent, "--overwrite")
    msg = flat(res.output)
    assert res.exit_code == 2 and "results folder" in msg and str(inner) in msg, res.output
    assert _snapshot(parent) == before


def test_schedule_into_a_results_folder_is_refused_and_the_folder_kept(trace_csv, results, cli):
    before = _snapshot(results)
    res = cli("schedule", trace_csv, "--cluster", f"{GPU}:16", "-o", results, "--overwrite")
    assert res.exit_code == 2 and "results folder" in flat(res.output), res.output
    assert _snapshot(results) == before


# -------------------------------------------------- (c) a folder of other files is never replaced
def test_report_over_a_folder_of_other_files_is_refused(tiny_sweep, tmp_path, cli):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "index.html").write_text("an earlier report")
    (out / "notes.txt").write_text("my notes")
    res = cli("report", tiny_sweep, "-o", out, "--overwrite")
    assert res.exit_code == 2 and "notes.txt" in flat(res.output), res.output
    assert (out / "notes.txt").read_text() == "my notes" and (out / "index.html").read_text() == "an earlier report"


def test_overwrite_replaces_a_folder_the_same_command_wrote(trace_csv, tmp_path, cli):
    out = tmp_path / "s"
    assert cli("schedule", trace_csv, "--cluster", f"{GPU}:16", "-o", out).exit_code == 0
    res = cli("schedule", trace_csv, "--cluster", f"{GPU}:16", "-o", out, "--overwrite")
    assert res.exit_code == 0, res.output
    assert (out / "jobs.parquet").is_file() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


# ---------------------------------------------- (d) a device, pipe or socket is never replaced
@pytest.mark.parametrize("how", ["fifo", "link to a fifo"])
def test_export_to_a_named_pipe_is_refused_and_the_pipe_kept(tiny_sweep, tmp_path, cli, how):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    target = fifo
    if how == "link to a fifo":
        target = tmp_path / "link"
        target.symlink_to(fifo)
    res = cli("export", tiny_sweep, "--row", "0", "-o", target, "--overwrite")
    assert res.exit_code == 2 and "named pipe" in flat(res.output), res.output
    assert stat.S_ISFIFO(os.stat(target).st_mode) and stat.S_ISFIFO(os.lstat(fifo).st_mode)


# --------------------------------------------------- (e) the current folder is never replaced
def test_report_into_the_current_folder_is_refused_and_leaves_nothing(tiny_sweep, tmp_path, cli, monkeypatch):
    here = tmp_path / "here"
    here.mkdir()
    (here / "index.html").write_text("an earlier report")
    monkeypatch.chdir(here)
    res = cli("report", tiny_sweep, "-o", ".", "--overwrite")
    msg = flat(res.output)
    assert res.exit_code == 2 and "current folder" in msg and "busy" not in msg, res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["here"]           # no ..old.* folder left
    assert sorted(p.name for p in here.iterdir()) == ["index.html"]


@pytest.mark.parametrize("overwrite", [False, True])
def test_sweep_into_the_current_folder_of_the_spec_and_other_files_is_refused(tiny_spec_path, tmp_path, cli,
                                                                             monkeypatch, overwrite):
    """`sweep -o .` (with or without --overwrite) wrote its manifest and parts among the user's files, in the
    folder of its own spec, and made it a results folder; the fix named --overwrite. Refused; nothing written."""
    (tmp_path / "notes.txt").write_text("mine")
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    res = cli("sweep", tiny_spec_path.name, "-o", ".", *(["--overwrite"] if overwrite else []))
    msg = flat(res.output)
    assert res.exit_code == 2 and "did not write" in msg and "pass --overwrite" not in msg, res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_sweep_overwrite_keeps_the_users_files_inside_its_own_results_folder(tiny_spec_path, tmp_path, cli):
    out = tmp_path / "r"
    assert cli("sweep", tiny_spec_path, "-o", out).exit_code == 0
    (out / "front.csv").write_text("the user's frontier")
    res = cli("sweep", tiny_spec_path, "-o", out, "--overwrite")
    assert res.exit_code == 0, res.output
    assert (out / "front.csv").read_text() == "the user's frontier" and (out / "manifest.json").is_file()


def test_a_refused_existing_file_names_the_option_that_named_it(tiny_sweep, tmp_path, cli):
    png = tmp_path / "t.png"
    png.write_bytes(b"a picture")
    res = cli("show", tiny_sweep, "--timeline", png)
    assert res.exit_code == 2 and "choose another --timeline" in flat(res.output), res.output
    assert png.read_bytes() == b"a picture"


# ------------------------------------------------------------------------- all or nothing
def test_plan_writes_nothing_when_a_job_has_no_plan(tiny_sweep, tmp_path, cli):
    from vtrain_fast.analysis.query import scan_results
    fastest = (scan_results(tiny_sweep).filter(pl.col("status") == "ok").group_by("model")
               .agg(pl.col("train_days").min()).collect().sort("train_days")["train_days"].to_list())
    assert len(fastest) == 2 and fastest[0] < fastest[1]
    deadline = (fastest[0] * fastest[1]) ** 0.5        # the fast job meets it, the slow one does not
    out = tmp_path / "p.parquet"
    res = cli("plan", tiny_sweep, "--deadline-days", deadline, "-o", out)
    assert res.exit_code == 2 and "not written" in flat(res.output), res.output
    assert not out.exists() and not list(tmp_path.glob("*.tmp"))


def test_schedule_on_a_full_disk_exits_2_naming_the_folder_and_leaves_nothing(trace_csv, tmp_path, cli, monkeypatch):
    def full(self, *args, **kwargs):       # what Polars raises when the disk is full
        raise pl.exceptions.ComputeError(f"failed to write: {os.strerror(errno.ENOSPC)} (os error {errno.ENOSPC})")
    monkeypatch.setattr(pl.DataFrame, "write_parquet", full)
    out = tmp_path / "s"
    res = cli("schedule", trace_csv, "--cluster", f"{GPU}:16", "-o", out)
    msg = flat(res.output)
    assert res.exit_code == 2 and "No space left on device" in msg and "free there" in msg, res.output
    assert str(out) in msg and "Traceback" not in res.output
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


# ------------------------------------------ every writing command: existing output, input
def _file_commands(tiny_sweep, plans_csv, out: Path) -> dict:
    hf = sorted((Path(__file__).parent / "data" / "hf").rglob("*.json"))[0]
    advise = ("advise", "--model", "gpt3-125m", "--gpus", f"{GPU}:8")
    return {
        "import-hf": ("import-hf", hf, "-o", out.with_suffix(".toml")),
        "pareto -o": ("pareto", tiny_sweep, "-o", out.with_suffix(".csv")),
        "pareto --plot": ("pareto", tiny_sweep, "--plot", out.with_suffix(".png")),
        "plan": ("plan", tiny_sweep, "--deadline-days", 1e9, "-o", out.with_suffix(".csv")),
        "evaluate": ("evaluate", plans_csv, "-o", out.with_suffix(".csv")),
        "export": ("export", tiny_sweep, "--row", 0, "-o", out.with_suffix(".sh")),
        "show -o": ("show", tiny_sweep, "--row", 0, "-o", out.with_suffix(".csv")),
        "show --events": ("show", tiny_sweep, "--row", 0, "--events", out.with_suffix(".csv")),
        "show --timeline": ("show", tiny_sweep, "--row", 0, "--timeline", out.with_suffix(".png")),
        "optimal": ("optimal", "--gpu-hours", 1e5, "-o", out.with_suffix(".csv")),
        "advise -o": (*advise, "-o", out.with_suffix(".csv")),
        "advise --plot": (*advise, "--plot", out.with_suffix(".png")),
        "trace": ("trace", "-o", out.with_suffix(".csv"), "--jobs", 2),
    }


FILE_COMMANDS = ["import-hf", "pareto -o", "pareto --plot", "plan", "evaluate", "export", "show -o", "show --events",
                 "show --timeline", "optimal", "advise -o", "advise --plot", "trace"]


@pytest.mark.parametrize("command", FILE_COMMANDS)
def test_an_existing_file_is_refused_without_overwrite(command, tiny_sweep, plans_csv, tmp_path, cli):
    args = _file_commands(tiny_sweep, plans_csv, tmp_path / "out")[command]
    out = Path(args[-1]) if args[-2] != "--jobs" else Path(args[2])
    out.write_text("mine")
    res = cli(*args)
    assert res.exit_code == 2 and "--overwrite" in flat(res.output), (command, res.output)
    assert out.read_text() == "mine"


@pytest.mark.parametrize("command,folder_entry", [("report", "index.html"), ("schedule", "jobs.parquet")])
def test_an_earlier_folder_is_refused_without_overwrite(command, folder_entry, tiny_sweep, trace_csv, tmp_path, cli):
    out = tmp_path / "out"
    out.mkdir()
    (out / folder_entry).write_text("mine")
    args = (("report", tiny_sweep) if command == "report" else ("schedule", trace_csv, "--cluster", f"{GPU}:16"))
    res = cli(*args, "-o", out)
    assert res.exit_code == 2 and "--overwrite" in flat(res.output), res.output
    assert (out / folder_entry).read_text() == "mine"


def _input_commands(tmp_path: Path, plans_csv: Path, sweep: Path) -> dict:
    """Each command with -o naming one of its own inputs (a table or text file it reads)."""
    hf = tmp_path / "config.json"
    shutil.copy(sorted((Path(__file__).parent / "data" / "hf").rglob("*.json"))[0], hf)
    side = tmp_path / "side.csv"
    side.write_text("x\n1\n")
    return {
        "import-hf": ("import-hf", hf, "-o", hf),
        "evaluate": ("evaluate", plans_csv, "-o", plans_csv),
        "export": ("export", plans_csv, "-o", plans_csv),
        "show": ("show", plans_csv, "-o", plans_csv),
        "optimal": ("optimal", "--gpu-hours", 1e5, "--config", side, "-o", side),
        "advise": ("advise", "--model", "gpt3-125m", "--gpus", f"{GPU}:8", "--models", side, "-o", side),
        "trace": ("trace", "--gpus-file", side, "-o", side),
        "report": ("report", sweep, "-o", sweep),
    }


@pytest.mark.parametrize("command", ["import-hf", "evaluate", "export", "show", "optimal", "advise", "trace",
                                     "report"])
def test_an_input_is_refused_even_with_overwrite(command, plans_csv, results, tmp_path, cli):
    args = _input_commands(tmp_path, plans_csv, results)[command]
    target = Path(args[-1])
    before = _snapshot(target) if target.is_dir() else target.read_bytes()
    res = cli(*args, "--overwrite")
    assert res.exit_code == 2 and "reads and never replaces" in flat(res.output), (command, res.output)
    assert (_snapshot(target) if target.is_dir() else target.read_bytes()) == before


def test_overwrite_replaces_an_earlier_file(tiny_sweep, tmp_path, cli):
    out = tmp_path / "f.csv"
    out.write_text("an earlier frontier")
    res = cli("pareto", tiny_sweep, "-o", out, "--overwrite")
    assert res.exit_code == 0, res.output
    assert pl.read_csv(out).height > 0


def test_validate_replaces_a_named_file_only_with_overwrite(tmp_path, cli):
    """validate -o onto an existing table of the user's is refused without --overwrite (it was replaced
    silently); its own default file stays regenerable (the Makefile reruns it)."""
    out = tmp_path / "mine.parquet"
    out.write_bytes(b"the user's own table")
    res = cli("validate", "--set", "moe", "-o", out)
    assert res.exit_code == 2, res.output
    assert "--overwrite" in res.output and out.read_bytes() == b"the user's own table"
    plot = tmp_path / "p.png"
    plot.write_bytes(b"a picture")
    res = cli("validate", "--set", "published", "-o", tmp_path / "v.parquet", "--plot", plot)
    assert res.exit_code == 2, res.output
    assert plot.read_bytes() == b"a picture" and not (tmp_path / "v.parquet").exists()
