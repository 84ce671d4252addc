"""The one place that holds the Numba compilation policy.

Every kernel in :mod:`vtrain_fast.model` is compiled with :func:`jit` (scalar formulas,
inlined into their callers by LLVM), :func:`jit_inline` (the per-configuration helpers that
take arrays, inlined by Numba so that no array is reference-counted per configuration) or
:func:`pjit` (the few loops that run over many configurations with ``prange``).

``error_model="numpy"`` makes a division by zero produce ``inf``/``nan`` instead of raising,
so kernels never raise: an infeasible configuration gets a status code in its row.
``cache=True`` stores compiled machine code, so only the first run on a machine pays the
compile time. Numba keys its cache on the file of each function only, not on the modules it
calls, so an edited formula in ``ops.py`` could be served stale through ``costs.py``'s cache. To
rule that out the cache lives in a folder named after a hash of every kernel source
(``~/.cache/vtrain_fast/numba-<hash>``, or under ``$VTRAIN_FAST_CACHE_DIR``) unless the user set
``NUMBA_CACHE_DIR`` themselves.

``OMP_WAIT_POLICY`` defaults to ``PASSIVE`` (unless the user set it): the OpenMP threads of the
parallel kernels otherwise spin for a while after every kernel call, taking the cores the
Parquet writer threads need. OpenMP reads it when its runtime starts (the first parallel kernel
call), so it is set here, on import of the kernels.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numba

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _kernel_source_hash() -> str:
    here = Path(__file__).parent            # _jit.py and the kernels, one folder
    digest = hashlib.sha256()
    for path in sorted(here.glob("*.py")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


if not os.environ.get("NUMBA_CACHE_DIR"):
    _root = os.environ.get("VTRAIN_FAST_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "vtrain_fast")
    numba.config.CACHE_DIR = os.path.join(_root, f"numba-{_kernel_source_hash()}")

JIT_OPTIONS = dict(nogil=True, cache=True, error_model="numpy", fastmath=False)
PARALLEL_OPTIONS = dict(JIT_OPTIONS, parallel=True)


def jit(func):
    """Compile a scalar formula with the project's njit options."""
    return numba.njit(**JIT_OPTIONS)(func)


def jit_inline(func):
    """Compile a per-configuration helper that takes arrays with the project's njit options,
    inlined into its callers by Numba (``inline="always"``) rather than called.

    A called Numba function reference-counts each array it takes (an atomic add on entry and
    an atomic subtract on every exit that the reference-count pruning pass leaves in place); on
    the per-point path of the sweep drivers those atomics, on arrays every thread shares, cost
    more than the cost model itself (scan kernel 172 ns per point single-thread, 85 ns with the
    helpers inlined; 2026-12-01). Scalar formulas do not need it: LLVM inlines them."""
    return numba.njit(inline="always", **JIT_OPTIONS)(func)


def pjit(func):
    """Compile a ``prange`` driver loop with the project's njit options plus ``parallel=True``."""
    return numba.njit(**PARALLEL_OPTIONS)(func)
