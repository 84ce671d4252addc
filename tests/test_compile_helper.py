"""Compile time (model._jit): kernels that only kernels call are compiled without the CPython
wrapper and called from Python through a twin; calls with literal arguments do not compile a
version per literal; evaluate_rows compiles step once; jit_inline helpers are refused when they
would hold reference-counted values uncounted; and a cold driver leaves the kernels of
``sweep.helper_kernels`` to the compile helper process, whose results it loads, with the same rows."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from vtrain_fast.model import _jit, comm, ops
from vtrain_fast.model import sweep as ks
from vtrain_fast.hardware.gpus import PRESETS, machine_vector

from conftest import TINY_SPEC


def test_python_call_of_a_kernel_goes_to_its_twin():
    hw = machine_vector(PRESETS["a100-sxm4-80gb"])
    got = ops.gemm_time_s(4096.0, 4096.0, 4096.0, 1.0, hw)
    assert got == ops.gemm_time_s.py_func(4096.0, 4096.0, 4096.0, 1.0, hw)
    twin = ops.gemm_time_s.python_twin
    assert twin.py_func.__qualname__ == "gemm_time_s__py"     # cache files of its own
    # a kernel's own versions have no Python entry point: the twin's are what Python calls
    assert isinstance(ops.gemm_time_s, _jit.KernelDispatcher)
    assert ops.gemm_time_s.targetoptions["no_cpython_wrapper"]


def test_literal_arguments_are_typed_plain(probe):
    """``p2p_s(x, True, hw)`` from a kernel compiles p2p_s for a bool, not for the literal."""
    src = textwrap.dedent("""
        from vtrain_fast.model._jit import jit
        from vtrain_fast.model.comm import p2p_s

        @jit
        def both(x, hw):
            return p2p_s(x, True, hw) + p2p_s(x, False, hw)
    """)
    mod = probe(src, "literal_probe")
    hw = machine_vector(PRESETS["a100-sxm4-80gb"])
    assert mod.both(1e6, hw) == comm.p2p_s.py_func(1e6, True, hw) + comm.p2p_s.py_func(1e6, False, hw)
    assert all("Literal" not in str(sig) for sig in comm.p2p_s.signatures)


def test_jit_inline_refuses_a_helper_that_returns_an_array(probe):
    """Without reference counting a returned argument would be released once too often by the
    caller (Numba itself refuses new arrays there)."""
    src = textwrap.dedent("""
        import numpy as np
        from vtrain_fast.model._jit import jit, jit_inline

        @jit_inline
        def passes_on(a):
            return a

        @jit
        def caller(a):
            return passes_on(a).sum()
    """)
    mod = probe(src, "uncounted_probe")
    with pytest.raises(Exception, match="without reference counting"):
        mod.caller(np.ones(3))


@pytest.fixture
def probe(tmp_path, monkeypatch):
    """Import kernel source as a module file in ``tmp_path`` (Numba caches only functions that
    live in a file), its cache files in ``tmp_path`` too."""
    import importlib.util
    import numba
    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path / "cache"))

    def _import(src, name):
        path = tmp_path / f"{name}.py"
        path.write_text(src, encoding="utf-8")
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    return _import


# A cold process: the tiny sweep through sweep_chunk and its rows through evaluate_rows, the
# kernels this process compiled itself, and every kernel's compiled signatures.
_COLD = textwrap.dedent("""
    import json, sys
    import numpy as np
    from numba.core import event
    compiled = []
    class L(event.Listener):
        def on_start(self, ev):
            d = ev.data["dispatcher"]
            compiled.append(f"{d.py_func.__module__}:{d.py_func.__qualname__}")
        def on_end(self, ev):
            pass
    event.register("numba:compile", L())
    from vtrain_fast.model import _jit, records, sweep as ks
    from vtrain_fast.plan.grid import build_grid
    from vtrain_fast.plan.spec import parse_spec
    g = build_grid(parse_spec(sys.stdin.read(), "<tiny>"))
    n = g.num_points
    inputs, tokens = np.empty((ks.NUM_INPUTS, n), np.int64), np.empty(n)
    out, status = np.empty((records.NUM_OUTPUTS, n)), np.empty(n, np.int8)
    ks.sweep_chunk(0, n, *g.kernel_args(), inputs, tokens, out, status)
    cols = ks.rows_from_inputs(inputs)
    hw_rows = np.ascontiguousarray(g.hw_table[inputs[ks.INPUT.gpu_index]])
    out2, status2 = np.empty_like(out), np.empty_like(status)
    ks.evaluate_rows(cols, np.ascontiguousarray(tokens), hw_rows, out2, status2)
    np.savez(sys.argv[1], out=out, status=status, out2=out2, status2=status2)
    import vtrain_fast.model as M, pkgutil, importlib
    sigs = {}
    for m in pkgutil.iter_modules(M.__path__):
        mod = importlib.import_module("vtrain_fast.model." + m.name)
        for v in vars(mod).values():
            if isinstance(v, _jit.KernelDispatcher):
                sigs[_jit._kernel_name(v)] = [str(s) for s in v.signatures]
    print(json.dumps({"compiled": compiled, "signatures": sigs,
                      "helper": [name for name, _, _ in _jit._helper_work()]}))
""")


def test_cold_compile_leaves_the_helper_kernels_to_the_helper(tmp_path):
    env = dict(os.environ, VTRAIN_FAST_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("NUMBA_CACHE_DIR", None)
    env.pop(_jit.HELPER_ENV, None)
    res = subprocess.run([sys.executable, "-c", _COLD, str(tmp_path / "rows.npz")], input=TINY_SPEC, env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    info = json.loads(res.stdout.strip().splitlines()[-1])
    compiled, sigs = set(info["compiled"]), info["signatures"]
    assert "vtrain_fast.model.costs:micro_batch_costs" in compiled        # the cache was cold
    assert set(info["helper"]) == {"vtrain_fast.model.costs:split_costs", "vtrain_fast.model.totals:model_totals",
                                   "vtrain_fast.model.pipeline:schedule"}
    # the helper's kernels were loaded from the cache for the types the drivers pass, not compiled here
    for name in info["helper"]:
        assert name not in compiled, f"{name} was compiled by the driver: its helper_kernels example types drifted"
        assert len(sigs[name]) == 1, (name, sigs[name])
    # one version per kernel and argument types: no literal versions, one step (no uint64 column)
    assert not [(k, s) for k, v in sigs.items() for s in v if "Literal" in s]
    assert len(sigs["vtrain_fast.model.step:step"]) == 1, sigs["vtrain_fast.model.step:step"]
    # the same rows as this process's kernels (whatever compiled them), and evaluate_rows's as the sweep's
    rows = np.load(tmp_path / "rows.npz")
    from vtrain_fast.model import records
    from vtrain_fast.plan.grid import build_grid
    from vtrain_fast.plan.spec import parse_spec
    g = build_grid(parse_spec(TINY_SPEC, "<tiny>"))
    n = g.num_points
    inputs, tokens = np.empty((ks.NUM_INPUTS, n), np.int64), np.empty(n)
    out, status = np.empty((records.NUM_OUTPUTS, n)), np.empty(n, np.int8)
    ks.sweep_chunk(0, n, *g.kernel_args(), inputs, tokens, out, status)
    assert np.array_equal(rows["status"], status)
    assert np.array_equal(rows["out"].view(np.uint64), out.view(np.uint64))
    ok = status != records.BAD_NUM_GPUS
    assert np.array_equal(rows["out2"][:, ok].view(np.uint64), out[:, ok].view(np.uint64))
