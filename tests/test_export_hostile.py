"""`vtrain-fast export` and `show` with hostile plan labels, the launch geometry, and the memory marks
(issue 25).

A model label may hold anything a CSV cell holds (quotes, line breaks, ``$()``, backticks, NUL,
bidirectional overrides, rich markup), and a spec's model name anything but control characters,
slashes and backslashes. Every export target (the Megatron-LM script, the Megatron-Bridge override list,
the torchtitan recipe module) is written from such a plan, checked to parse (``bash -n`` / ``ast.parse``)
and run (the script with ``torchrun`` a stub that records its arguments; the module imported without
torchtitan, and executed against stand-ins of torchtitan's names): nothing but the launch runs, and
no file appears. The launch line starts exactly the priced world size; an ``advise -o`` table (whose
``memory_tight`` marks are labels) exports and shows, its memory marks recomputed."""
from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from conftest import flat
from test_export import _run_recipe, titan_problems
from vtrain_fast.analysis.export import export, printable
from vtrain_fast.analysis.query import DEFAULT_MEMORY_MARGIN
from vtrain_fast.cli import app
from vtrain_fast.hardware.gpus import PRESETS
from vtrain_fast.io.errors import InputError, check_plain_name

MARK = "PWNED"
HOSTILE = {
    "triple-quote": f'x"""; import os; os.system("touch {MARK}"); """',
    "triple-quote-lines": f'x"""\nimport os; os.system("touch {MARK}")\n"""',
    "single-quote": f"it's'; touch {MARK}; '",
    "double-quote": f'say "hi"; touch {MARK}',
    "newline": f"evil\ntouch {MARK}\n#",
    "carriage-return": f"evil\rimport os; os.system('touch {MARK}')\r#",
    "command-substitution": f"$(touch {MARK})",
    "backticks": f"`touch {MARK}`",
    "semicolon": f"a; touch {MARK}",
    "nul": f"nul\x00touch {MARK}",
    "unicode": "модель-7b",
    "rtl-override": "\u202etxt.exe\u202c",
    "line-separator": f"a\u2028import os; os.system('touch {MARK}')",
    "rich-markup": "[red]x[/red] [bold]",
    "backslash-end": "x\\",
    "mathtext": "$\\frac$ $x",
}
# A model torchtitan can run (Llama-shaped, tiny): the hostile label's plan and a dearer plain one.
SHAPE = dict(num_layers=2, hidden_size=256, num_attention_heads=4, num_query_groups=2, ffn_hidden_size=768,
             vocab_size=1024, seq_length=256, gated_mlp="true", normalization="RMSNorm", position_embedding_type="rope",
             add_bias_linear="false", untie_embeddings_and_output_weights="true")
PLAN = dict(gpu="h100-sxm-80gb", tp=1, pp=1, dp=8, global_batch_size=8, micro_batch_size=1, zero_stage=3)
TARGETS = ("megatron", "bridge", "torchtitan")
OVERRIDE = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*=[A-Za-z0-9_.,+\-\[\]]+")


def _spec_allows(name: str) -> bool:
    try:
        check_plain_name("spec", "name", name, "x")
    except InputError:
        return False
    return True


def _write_table(path: Path, label: str, **plan) -> Path:
    """A plan table of the hostile ``label``'s plan and a dearer plan labelled ``plain`` (two model
    values: the export notes how to pick among them, naming the label)."""
    rows = [{**SHAPE, **PLAN, **plan, "model": label}, {**SHAPE, **PLAN, **plan, "model": "plain", "num_layers": 4}]
    pl.DataFrame(rows).write_csv(path)
    return path


def _out_name(target: str) -> str:
    return {"megatron": "run.sh", "bridge": "overrides.txt", "torchtitan": "plan_x.py"}[target]


def check_runs_nothing(target: str, path: Path, label: str, tmp_path: Path) -> None:
    """The written file parses in its language, holds the label's printable form, and running it (in a
    folder of its own) starts the launch only and creates no file."""
    text = path.read_text(encoding="utf-8")
    assert "\x00" not in text and all(line.isprintable() for line in text.split("\n")), target
    if target != "torchtitan":              # one comment line each; the recipe's docstrings are read below
        assert printable(label) in text, target
    run = tmp_path / "run"
    run.mkdir()
    copy = run / path.name
    copy.write_text(text, encoding="utf-8")
    if target == "megatron":
        assert subprocess.run(["bash", "-n", str(copy)], capture_output=True).returncode == 0
        stub, argv_file = tmp_path / "stub", tmp_path / "argv"
        stub.mkdir()
        (stub / "torchrun").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {shlex.quote(str(argv_file))}\nexit 0\n')
        (stub / "torchrun").chmod(0o755)
        res = subprocess.run(["sh", copy.name], cwd=run, capture_output=True, text=True,
                             env={"PATH": f"{stub}{os.pathsep}{os.environ.get('PATH', '')}"})
        assert res.returncode == 0, res.stderr
        command = [ln for ln in text.splitlines() if not ln.startswith("#")]
        words = shlex.split(" ".join(ln.removesuffix(" \\") for ln in command))
        assert argv_file.read_text().splitlines() == words[1:]       # torchrun got the plan's words, no others
    elif target == "bridge":
        body = [ln for ln in text.splitlines() if not ln.startswith("#")]
        assert body and all(OVERRIDE.fullmatch(ln) for ln in body)
        assert shlex.split(text, comments=True) == body                # as shell words: the overrides only
        assert subprocess.run(["bash", "-n", str(copy)], capture_output=True).returncode == 0
    else:
        tree = ast.parse(text)
        assert " ".join(printable(label).split()) in " ".join(ast.get_docstring(tree).split())
        assert titan_problems(text) == []
        res = subprocess.run([sys.executable, "-c", f"import {copy.stem}"], cwd=run, capture_output=True, text=True)
        assert res.returncode == 0 or "No module named 'torchtitan" in res.stderr, res.stderr
    assert sorted(p.name for p in run.iterdir()) == [copy.name], "running the export wrote a file"


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("key", sorted(HOSTILE))
def test_a_hostile_table_label_is_written_as_text(key, target, tmp_path):
    label = HOSTILE[key]
    table = _write_table(tmp_path / "plans.csv", label)
    out = tmp_path / _out_name(target)
    res = CliRunner().invoke(app, ["export", str(table), "--row", "0", "--to", target, "-o", str(out)])
    assert res.exit_code == 0, res.output
    check_runs_nothing(target, out, label, tmp_path)


def test_a_hostile_recipe_runs_against_torchtitans_names_and_writes_nothing(tmp_path, monkeypatch):
    """The whole recipe module, its function called, against stand-ins of torchtitan's names: the
    labels reach no statement (only docstrings and comments), and no file appears."""
    monkeypatch.chdir(tmp_path)
    for key, label in HOSTILE.items():
        source = export(_write_table(tmp_path / f"{key}.csv", label), "torchtitan", row=0).text()
        before = set(os.listdir(tmp_path))
        config, namespace = _run_recipe(source, monkeypatch)
        assert set(os.listdir(tmp_path)) == before, key
        assert " ".join(namespace["__doc__"].split()).startswith(
            "vtrain-fast plan for " + " ".join(printable(label).split())), key
        assert config.parallelism._values["data_parallel_shard_degree"] == PLAN["dp"], key


@pytest.fixture(scope="module")
def hostile_results(tmp_path_factory):
    """A results folder of one plan per hostile model name a spec allows (a name a spec refuses is left
    out), each with a layer more than the one before (so --row K is name K, cheapest first)."""
    names = [n for n in HOSTILE.values() if _spec_allows(n)]
    folder = tmp_path_factory.mktemp("hostile_sweep")

    def toml(v):
        if isinstance(v, int) or v in ("true", "false"):
            return str(v)
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    tables = "".join(f"[models.{toml(n)}]\n" + "".join(f"{k} = {toml(v)}\n" for k, v in {**SHAPE, "num_layers": 2 + i}.items())
                     for i, n in enumerate(names))
    spec = folder / "spec.toml"
    spec.write_text(tables + f"[model]\npresets = [{', '.join(toml(n) for n in names)}]\n"
                    "[training]\nnum_tokens = 1e9\nglobal_batch_size = 8\nmicro_batch_size = 1\nzero_stage = 3\n"
                    '[cluster]\ngpu = "h100-sxm-80gb"\nnum_gpus = 8\n[parallel]\ntp = 1\npp = 1\n', encoding="utf-8")
    res = CliRunner().invoke(app, ["sweep", str(spec), "-o", str(folder / "r")])
    assert res.exit_code == 0, res.output
    return folder / "r", names


def test_the_spec_allows_the_shell_and_python_quotes(hostile_results):
    _, names = hostile_results
    assert HOSTILE["triple-quote"] in names and HOSTILE["command-substitution"] in names and len(names) >= 8


@pytest.mark.parametrize("target", TARGETS)
def test_a_hostile_spec_model_name_is_written_as_text(hostile_results, target, tmp_path):
    folder, names = hostile_results
    for k, name in enumerate(names):
        out = tmp_path / str(k) / _out_name(target)
        out.parent.mkdir()
        res = CliRunner().invoke(app, ["export", str(folder), "--row", str(k), "--to", target, "-o", str(out)])
        assert res.exit_code == 0, res.output
        check_runs_nothing(target, out, name, out.parent)


def test_show_prints_hostile_labels_as_text(tmp_path, wide_console):
    """`show` prints each label's printable form (rich markup as text, line breaks and control
    characters escaped) and draws the timeline of a label with TeX-like dollars."""
    runner = CliRunner()
    for key, label in HOSTILE.items():
        table = _write_table(tmp_path / f"{key}.csv", label)
        args = ["show", str(table), "--row", "0"]
        if key == "mathtext":
            args += ["--timeline", str(tmp_path / "t.png")]
        res = runner.invoke(app, args)
        assert res.exit_code == 0, (key, res.output)
        assert printable(label) in res.output, key
        assert all(c.isprintable() or c == "\n" for c in res.output), key
    assert (tmp_path / "t.png").stat().st_size > 0


# ---------------------------------------------------------------- the launch geometry
def _geometry(text: str) -> tuple[int, int]:
    m = re.search(r"torchrun --nnodes (\d+) --nproc-per-node (\d+)", text)
    return int(m.group(1)), int(m.group(2))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dp", [1, 12, 24])
def test_the_launch_starts_the_priced_world_size(dp, target, tmp_path):
    """1, 12 and 24 data-parallel ranks on 8-GPU nodes: torchrun starts nnodes x nproc-per-node = the
    world size, never more ranks on a node than it has GPUs; a world size not of whole nodes runs on
    the nodes it was priced on, and the export says so."""
    gpn = PRESETS[PLAN["gpu"]].gpus_per_node
    table = tmp_path / "plan.csv"
    pl.DataFrame([{**SHAPE, **PLAN, "model": "plain", "dp": dp, "global_batch_size": dp}]).write_csv(table)
    out = tmp_path / _out_name(target)
    res = CliRunner().invoke(app, ["export", str(table), "--to", target, "-o", str(out)])
    assert res.exit_code == 0, res.output
    text = out.read_text()
    nodes, per_node = _geometry(text)
    assert nodes * per_node == dp and per_node <= gpn
    assert nodes == -(-dp // gpn)                                     # the nodes it was priced on
    whole = dp % gpn == 0 or dp < gpn
    assert ("launch: " in text) == (not whole)
    if not whole:
        assert f"{nodes} nodes x {per_node}" in flat(text)


def test_a_world_size_that_cannot_start_as_priced_is_refused(tmp_path):
    """12 ranks of tp 4 on 8-GPU nodes: 2 nodes of 6 would split a tensor-parallel group priced inside a
    node; 20 ranks do not split over the 3 nodes priced. Refused (exit 2) with the reason and a world
    size of whole nodes, for every target."""
    runner = CliRunner()
    for name, plan, reason in (("tp4", dict(tp=4, dp=3, num_query_groups=4, global_batch_size=12), "tp = 4"),
                               ("dp20", dict(dp=20, global_batch_size=20), "do not split evenly")):
        table = tmp_path / f"{name}.csv"
        pl.DataFrame([{**SHAPE, **PLAN, "model": "plain", **plan}]).write_csv(table)
        for target in TARGETS:
            res = runner.invoke(app, ["export", str(table), "--to", target])
            out = flat(res.output)
            assert res.exit_code == 2 and "Traceback" not in out, (name, target, out)
            assert reason in out and "world size" in out and "multiple of the 8 GPUs per node" in out, out


# ---------------------------------------------------------------- memory marks of an advise -o table
@pytest.fixture(scope="module")
def advise_table(tmp_path_factory):
    path = tmp_path_factory.mktemp("advise") / "steps.csv"
    res = CliRunner().invoke(app, ["advise", "--model", "gpt3-1.3b", "--gpus", "rtx4090-pcie-24gb:4", "--days", "30",
                                   "-o", str(path)])
    assert res.exit_code == 0, res.output
    return pl.read_csv(path)


def _tight(row: dict) -> bool:
    cap = PRESETS[row["gpu"]].hbm_GiB
    return cap - row["memory_per_gpu_GiB"] < DEFAULT_MEMORY_MARGIN * cap


def test_an_advise_table_exports_and_shows_with_its_memory_marks_recomputed(advise_table, tmp_path):
    """Each fitting step of an `advise -o` table (memory_tight among its columns, no memory_headroom_GiB)
    exports and shows; the memory note follows the plan's own headroom, and a stale memory_tight label
    (flipped) changes nothing."""
    runner = CliRunner()
    ok = advise_table.filter(pl.col("status") == "ok")
    assert ok["memory_tight"].any() and "memory_headroom_GiB" not in advise_table.columns
    for k, row in enumerate(ok.iter_rows(named=True)):
        tight = _tight(row)
        for label in (row["memory_tight"], not row["memory_tight"]):
            path = tmp_path / f"step{k}-{label}.csv"
            ok[k].with_columns(pl.lit(label).alias("memory_tight")).write_csv(path)
            for command in ("export", "show"):
                res = runner.invoke(app, [command, str(path)])
                assert res.exit_code == 0, (k, command, res.output)
                assert ("memory: " in res.output) == tight, (k, command, label)


@pytest.mark.parametrize("target", TARGETS)
def test_a_label_the_escaping_missed_is_refused_by_the_read_back(target, tmp_path, monkeypatch):
    """With the escaping of labels switched off (printable as the identity), a NUL and line breaks in a
    label reach the text: the read-back refuses it (exit 2, a message, no file written)."""
    from vtrain_fast.analysis import export as export_module
    monkeypatch.setattr(export_module, "printable", str)
    table = _write_table(tmp_path / "plans.csv", f"evil\x00\ntouch {MARK}\n#")
    out = tmp_path / _out_name(target)
    res = CliRunner().invoke(app, ["export", str(table), "--row", "0", "--to", target, "-o", str(out)])
    assert res.exit_code == 2 and "Traceback" not in res.output and f"--to {target}" in flat(res.output), res.output
    assert not out.exists()
