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
    ("errors", "_jit", "models", "inputs", "settings", "kernels.params", "kernels", "__init__"),  # leaves
    ("kernels.layout", "kernels.ops", "kernels.comm", "kernels.memory", "kernels.step", "kernels.sweep"),  # cost model
    ("schema", "hardware"),                                    # columns; GPUs as data
    ("spec", "calfile", "writer"),                             # what to sweep; result folders
    ("grid",),                                                 # spec -> kernel arrays
    ("chunks",),                                               # one chunk into its file
    ("distributed",),                                          # chunks on a Dask cluster
    ("engine",),                                               # folders, resume, merge
    ("query", "report", "evaluate", "nccl"),                   # reading results, single plans
    ("validate", "calibrate"),                                 # measurements
    ("cli", "bench", "__main__"),                              # commands
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


def test_the_layer_check_can_fail():
    graph = imports()
    assert "kernels.params" in graph["schema"] and "distributed" in graph["engine"]   # lazy imports seen
    graph["writer"] = graph["writer"] | {"query"}                  # writer reading query: refused
    assert violations(graph) == [("writer", "query")]


def test_the_spec_layer_loads_without_numba():
    code = "import sys, vtrain_fast.spec, vtrain_fast.hardware, vtrain_fast.schema; print('numba' in sys.modules)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "False", res.stdout + res.stderr
