"""Shared fixtures: tiny sweep specs, machine vectors of the GPU presets, a CLI runner, and a
hypothesis profile with a bounded number of examples (the suite must stay well under 3 min)."""
from __future__ import annotations

import inspect
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from vtrain_fast.hardware.gpus import PRESETS, machine_vector

settings.register_profile("vtrain", max_examples=200, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("vtrain")

# A small grid (2 models x 2 GPUs x 3 sizes x 3 tp x 3 pp x 3 mbs x 2 gbs x 2 recompute
# = 1,296 points) that hits ok, out_of_memory, bad_num_gpus and bad_batch rows; chunk_size
# 100 so that the engine writes several row groups.
TINY_SPEC = """\
name = "tiny"
description = "test grid"

[model]
presets = ["gpt3-125m", "gpt3-13b"]

[training]
num_tokens = [1e9]
global_batch_size = [48, 96]
micro_batch_size = [1, 2, 3]
recompute = ["none", "full"]

[cluster]
gpu = ["a100-sxm4-40gb", "h100-sxm-80gb"]
num_gpus = [8, 16, 24]

[parallel]
tp = [1, 2, 4]
pp = [1, 2, 4]

[output]
chunk_size = 100
"""


# One valid point; tests add keys under [training] with ONE_POINT_SPEC.format(training="...").
ONE_POINT_SPEC = """\
[model]
presets = ["gpt3-125m"]
[training]
num_tokens = 1e9
global_batch_size = 8
micro_batch_size = 1
{training}
[cluster]
gpu = "a100-sxm4-80gb"
num_gpus = 8
[parallel]
tp = 1
pp = 1
"""


# A small sweep of 1.3B on 8 and 16 H100 over tp and pp (dp = 1 at tp 4, pp 2); tests put settings under [training].
SMALL_SWEEP = """\
[model]
presets = ["gpt3-1.3b"]
[training]
num_tokens = 1e10
global_batch_size = 64
micro_batch_size = [1, 2]
{training}
[cluster]
gpu = "h100-sxm-80gb"
num_gpus = [8, 16]
[parallel]
tp = [1, 2, 4]
pp = [1, 2]
"""


def check_step_against_twin(rng, hw, label="") -> None:
    """Draw a Llama-3-8B-like plan (tp, pp, dp, micro-batch, sequence, recompute and a gated MLP at
    random) on machine vector ``hw``, evaluate it with ``model.step.step`` and with the plain-Python
    twin (``tests/reference.py``), and assert the same status and every output within 1e-12."""
    import numpy as np

    import reference as ref
    from vtrain_fast.model import layout, records, step
    from vtrain_fast.model.arch import DEFAULT_ARCH
    b, t = int(rng.choice([1, 2, 4])), int(rng.choice([1, 2, 4, 8]))
    p, d = int(rng.choice([1, 3, 4])), int(rng.choice([1, 2, 8]))
    cfg = (8 * p, 4096, 32, 8, 14336, 128256, int(rng.choice([2048, 4096])), d * b * 8 * p, b, t, p, d,
           int(rng.integers(0, 3)), 1e12, hw, DEFAULT_ARCH._replace(gated_mlp=float(rng.integers(0, 2))))
    out = np.empty((records.NUM_OUTPUTS, 1))
    code = step.step(*[float(x) for x in cfg[:9]], layout.Layout(cfg[9], 1, cfg[11], cfg[10]), cfg[12], cfg[13],
                     cfg[14], out, 0, cfg[15])
    r_code, r_out = ref.step(*cfg)
    assert code == r_code, label
    for k, name in enumerate(records.OUTPUT_NAMES):
        assert out[k, 0] == pytest.approx(r_out[name], rel=1e-12, nan_ok=True), (label, name)


def flat(text: str) -> str:
    """``text`` with every run of whitespace (line breaks a console may insert) as one space:
    message checks must not depend on the terminal width or the length of a temp path."""
    return " ".join(str(text).split())


def vouch_for_files(folder: Path) -> None:
    """Record the part files of ``folder`` as they are now in its manifest (sizes, checksums):
    for tests that rewrite a folder's rows on purpose (e.g. to look like an older version's)
    and need the folder to stay trusted."""
    import json

    import pyarrow.parquet as pq

    from vtrain_fast.io.writer import FINAL, ORIGIN_KEY, file_record
    path = Path(folder) / "manifest.json"
    manifest = json.loads(path.read_text())
    for n in manifest["parts"]:       # the writer's stamp (sweep, chunk), as PartWriter writes it
        table = pq.read_table(Path(folder) / n)
        chunk = FINAL if manifest["keep"] != "all" else int(n[5:11])
        stamp = json.dumps({"sweep_key": manifest["sweep_key"], "chunk": chunk}).encode()
        pq.write_table(table.replace_schema_metadata({**(table.schema.metadata or {}), ORIGIN_KEY: stamp}),
                       Path(folder) / n)
    manifest["files"] = {n: file_record(Path(folder) / n, pq.ParquetFile(Path(folder) / n).metadata.num_rows)
                         for n in manifest["parts"]}
    for info in manifest["chunks"].values():      # a chunk's record of its own part: the same record
        if info.get("part") in manifest["files"]:
            info["file"] = manifest["files"][info["part"]]
    path.write_text(json.dumps(manifest))


@pytest.fixture
def write_spec(tmp_path):
    """Factory: write TOML text (dedented) to ``tmp_path/<name>`` and return the path."""
    def _write(text: str, name: str = "spec.toml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text), encoding="utf-8")
        return path
    return _write


@pytest.fixture
def tiny_spec_path(write_spec) -> Path:
    return write_spec(TINY_SPEC, "tiny.toml")


@pytest.fixture(scope="session")
def preset_vectors() -> dict:
    """GPU preset name -> machine vector (float64, shape (NUM_HW_FIELDS,))."""
    return {name: machine_vector(p) for name, p in PRESETS.items()}


@pytest.fixture(scope="session")
def tiny_sweep(tmp_path_factory):
    """Run the tiny spec once per session through the CLI; return the results folder."""
    from typer.testing import CliRunner

    from vtrain_fast.cli import app
    folder = tmp_path_factory.mktemp("tiny_sweep")
    spec = folder / "tiny.toml"
    spec.write_text(TINY_SPEC, encoding="utf-8")
    out = folder / "results"
    result = CliRunner().invoke(app, ["sweep", str(spec), "-o", str(out)])
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture
def wide_console(monkeypatch):
    """Tables printed by the CLI 200 columns wide, whatever the terminal or $COLUMNS: for tests
    of which columns a table shows (narrow terminals leave columns out, and say so)."""
    from rich.console import Console

    import vtrain_fast.cli as cli_module
    monkeypatch.setattr(cli_module, "console", Console(width=200, emoji=False, soft_wrap=True))


@pytest.fixture
def cli():
    """Invoke the typer app in-process: ``cli("sweep", "spec.toml", "-o", "out")``."""
    from typer.testing import CliRunner

    from vtrain_fast.cli import app
    runner = CliRunner()

    def _invoke(*args):
        return runner.invoke(app, [str(a) for a in args])
    return _invoke


def sweep_all_rows(grid):
    """Every point of ``grid`` (``plan.grid.Grid``) through the row kernel in one call:
    ``(inputs, tokens, out, status)`` as ``model.sweep.sweep_chunk`` fills them."""
    import numpy as np

    from vtrain_fast.model import layout, records, step
    from vtrain_fast.model import sweep as ks
    n = grid.num_points
    inputs, tokens = np.empty((ks.NUM_INPUTS, n), np.int64), np.empty(n, np.float64)
    out, status = np.empty((records.NUM_OUTPUTS, n), np.float64), np.empty(n, np.int8)
    ks.sweep_chunk(0, n, *grid.kernel_args(), inputs, tokens, out, status)
    return inputs, tokens, out, status


# ------------------------------------------------------------------------------ the cli_output mark
# Tests that read what a vtrain-fast command prints are marked ``cli_output`` here, at collection:
# CI runs the whole suite once and these again in an 80-column terminal (COLUMNS=80, .ci/run), so
# that no check depends on the terminal's width. A test reads CLI output when it uses a fixture of
# CLI_FIXTURES, or when its code, a test helper it calls or a fixture of its test module runs a
# command: it names the typer app, a command's function, the CLI's consoles, the typer test runner
# or the CLI module itself (to patch its console), or runs ``python -m vtrain_fast`` or the
# vtrain-fast script. ``@pytest.mark.width_independent`` leaves a test out (one that sets the
# width itself and reads nothing else).
CLI_FIXTURES = frozenset({"cli", "wide_console"})


def _cli_entry_points() -> tuple[dict, frozenset]:
    """The objects that run or print a command (by identity) and their names in vtrain_fast.cli."""
    from typer.testing import CliRunner

    import vtrain_fast.cli as cli_module
    objects = {"app": cli_module.app, "console": cli_module.console, "err": cli_module.err,
               **{c.callback.__name__: c.callback for c in cli_module.app.registered_commands}}
    return {id(o): o for o in (*objects.values(), cli_module, CliRunner)}, frozenset(objects)


def _runs_a_command(code, namespace: dict, seen: set) -> bool:
    """Whether ``code`` (with its nested functions and the test helpers it calls) runs a command."""
    from typer.testing import CliRunner
    entries, entry_names = _cli_entry_points()
    if code in seen:
        return False
    seen.add(code)
    names = set(code.co_names)
    if "vtrain_fast.cli" in names and names & entry_names:         # imported in the function
        return True
    for name in names:
        obj = namespace.get(name)
        if obj is None:
            continue
        if id(obj) in entries or isinstance(obj, CliRunner):
            return True
        if inspect.isfunction(obj) and _is_test_code(obj) and _runs_a_command(obj.__code__, obj.__globals__, seen):
            return True
    consts = set(c for c in code.co_consts if isinstance(c, str))
    if "vtrain-fast" in consts or {"-m", "vtrain_fast"} <= consts:
        return True
    return any(inspect.iscode(c) and _runs_a_command(c, namespace, seen) for c in code.co_consts)


def _is_test_code(func) -> bool:
    """A function defined in a file of this folder (a test helper, not the package's own code)."""
    return Path(func.__code__.co_filename).resolve().parent == Path(__file__).resolve().parent


def _reads_cli_output(item) -> bool:
    if CLI_FIXTURES & set(item.fixturenames):
        return True
    seen: set = set()
    func = getattr(item, "function", None)
    if func is not None and _runs_a_command(func.__code__, func.__globals__, seen):
        return True
    for name in item.fixturenames:          # fixtures of test modules (conftest's run commands only to set up)
        for fixturedef in item._fixtureinfo.name2fixturedefs.get(name, ()):
            f = inspect.unwrap(fixturedef.func)
            if (inspect.isfunction(f) and _is_test_code(f) and Path(f.__code__.co_filename).name != "conftest.py"
                    and _runs_a_command(f.__code__, f.__globals__, seen)):
                return True
    return False


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("width_independent") is None and _reads_cli_output(item):
            item.add_marker(pytest.mark.cli_output)
