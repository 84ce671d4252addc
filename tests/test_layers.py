"""The house's layers: a module imports only modules of its own or lower layers (imports inside
functions count too), there are no import circles, and the spec layer loads without Numba."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "vtrain_fast"

# Lowest first. A module of layer k may import modules of layers <= k (never a circle).
LAYERS = [
    ("analysis", "engine", "hardware", "io", "plan", "schedule"),                 # layer folders' __init__ (docstrings only)
    ("io.errors", "model._jit", "plan.models", "plan.loss", "io.inputs", "model.settings", "model.arch", "model.moe", "model.records", "model", "__init__"),  # leaves
    ("model.layout", "model.ops", "model.comm", "model.memory", "model.layer_split", "model.experts", "model.overlap",
     "model.offload", "model.rules", "model.costs", "model.totals", "model.pipeline", "model.step", "model.sweep"),  # cost model
    ("io.schema", "hardware.gpus"),                                               # columns; GPUs as data
    ("plan.spec", "plan.hf", "hardware.calfile", "io.outputs", "io.writer"),      # what to sweep; model files; the output rule; result folders
    ("plan.grid",),                                                               # spec -> kernel arrays
    ("engine.chunks",),                                                           # one chunk into its file
    ("engine.distributed",),                                                      # chunks on a Dask cluster
    ("engine.run",),                                                              # folders, resume, merge
    ("analysis.query", "analysis.report", "analysis.evaluate", "analysis.nccl", "analysis.export",
     "analysis.optimal", "analysis.plan", "analysis.show", "analysis.html_report", "analysis.advise"),                      # reading results, single plans, sizing, deadlines
    ("analysis.validate", "analysis.calibrate", "analysis.published"),            # measurements
    ("analysis.published_moe",),                                                  # MoE measurements (published's machinery)
    ("schedule.trace", "schedule.policies", "schedule.curves", "schedule.gantt"),  # traces, rules, job curves
    ("schedule.replay", "schedule.generate"),                                      # the event loop; synthetic traces
    ("schedule.run",),                                                             # the schedule command's library
    ("cli", "bench", "__main__"),                                                 # commands
]
LAYER = {m: k for k, mods in enumerate(LAYERS) for m in mods}


def _module(path: Path) -> str:
    rel = path.relative_to(PACKAGE).with_suffix("")
    return ".".join(rel.parts[:-1]) if rel.name == "__init__" and len(rel.parts) > 1 else ".".join(rel.parts)


def imports() -> dict[str, set[str]]:
    """Module -> the package modules it imports (absolute names without ``vtrain_fast.``)."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        mod = _module(path)
        pkg = mod.rsplit(".", 1)[0] if "." in mod and path.name != "__init__.py" else ("" if "." not in mod else mod)
        seen = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg.split(".") if pkg else []
                    base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
                    target = ".".join(base + ([node.module] if node.module else []))
                elif (node.module or "").startswith("vtrain_fast"):
                    target = node.module[len("vtrain_fast."):] if node.module != "vtrain_fast" else ""
                else:
                    continue
                names = [a.name for a in node.names]
                for n in names:        # "from . import comm" imports a module
                    full = f"{target}.{n}" if target else n
                    seen.add(full if full in LAYER else target)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("vtrain_fast."):
                        seen.add(a.name[len("vtrain_fast."):])
        out[mod or "__init__"] = {s or "__init__" for s in seen} - {mod}
    return out


def test_every_module_has_a_layer():
    missing = sorted(set(imports()) - set(LAYER))
    assert not missing, f"add these modules to LAYERS: {missing}"


def violations(graph: dict) -> list[tuple[str, str]]:
    """``(module, imported)`` pairs where a module imports a higher layer."""
    return sorted((m, t) for m, ts in graph.items() for t in ts if t in LAYER and LAYER[t] > LAYER.get(m, 99))


def test_no_module_imports_a_higher_layer():
    bad = violations(imports())
    assert not bad, "lower layers importing higher ones: " + ", ".join(f"{m} -> {t}" for m, t in bad)


def test_no_import_circles():
    graph = imports()
    state: dict[str, int] = {}

    def visit(m, path):
        state[m] = 1
        for t in sorted(graph.get(m, ())):
            if state.get(t) == 1:
                pytest.fail("import circle: " + " -> ".join(path[path.index(t):] + [t]))
            if t not in state:
                visit(t, path + [t])
        state[m] = 2
    for m in sorted(graph):
        if m not in state:
            visit(m, [m])


# The layer folders, lowest first: a module of one may import only modules of its own folder or a
# lower one (the top-level modules cli, bench and __main__ sit above them all).
FOLDERS = ["model", "io", "hardware", "plan", "engine", "analysis", "schedule"]


def folder_violations(graph: dict) -> list[tuple[str, str]]:
    """``(module, imported)`` pairs where a module of a layer folder imports a higher folder (or
    a top-level command module)."""
    rank = {f: k for k, f in enumerate(FOLDERS)}

    def folder_rank(m):
        top = m.split(".")[0]
        return rank.get(top, len(FOLDERS) if m in ("cli", "bench", "__main__") else -1)
    return sorted((m, t) for m, ts in graph.items() if m.split(".")[0] in rank
                  for t in ts if folder_rank(t) > folder_rank(m))


def test_every_folder_imports_only_its_own_or_lower_folders():
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert folders == set(FOLDERS), "add the folder to FOLDERS in its layer order"
    bad = folder_violations(imports())
    assert not bad, "folders importing higher ones: " + ", ".join(f"{m} -> {t}" for m, t in bad)
    graph = imports()
    graph["model.step"] = graph["model.step"] | {"io.errors"}          # a kernel raising InputError: refused
    assert folder_violations(graph) == [("model.step", "io.errors")]


def test_the_layer_check_can_fail():
    graph = imports()
    assert "model.records" in graph["io.schema"] and "engine.distributed" in graph["engine.run"]   # lazy imports seen
    graph["io.writer"] = graph["io.writer"] | {"analysis.query"}                  # writer reading query: refused
    assert violations(graph) == [("io.writer", "analysis.query")]


def test_the_spec_layer_loads_without_numba():
    code = "import sys, vtrain_fast.plan.spec, vtrain_fast.hardware.gpus, vtrain_fast.io.schema; print('numba' in sys.modules)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "False", res.stdout + res.stderr
