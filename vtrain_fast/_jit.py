"""The one place that holds the Numba compilation policy.

Every kernel in :mod:`vtrain_fast.kernels` is compiled with :func:`jit` (scalar formulas,
inlined into their callers by LLVM) or :func:`pjit` (the few loops that run over many
configurations with ``prange``).

``error_model="numpy"`` makes a division by zero produce ``inf``/``nan`` instead of raising,
so kernels never raise: an infeasible configuration gets a status code in its row.
``cache=True`` stores compiled machine code next to the sources (``__pycache__``), so only
the first run on a machine pays the compile time.
"""
from __future__ import annotations

import numba

JIT_OPTIONS = dict(nogil=True, cache=True, error_model="numpy", fastmath=False)
PARALLEL_OPTIONS = dict(JIT_OPTIONS, parallel=True)


def jit(func):
    """Compile a scalar formula with the project's njit options."""
    return numba.njit(**JIT_OPTIONS)(func)


def pjit(func):
    """Compile a ``prange`` driver loop with the project's njit options plus ``parallel=True``."""
    return numba.njit(**PARALLEL_OPTIONS)(func)
