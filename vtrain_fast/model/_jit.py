"""The one place that holds the Numba compilation policy.

Every kernel in :mod:`vtrain_fast.model` is compiled with :func:`jit` (scalar formulas,
inlined into their callers by LLVM where that pays), :func:`jit_inline` (the per-configuration
helpers that take arrays, always inlined by LLVM and compiled without reference counting, so that
no array is reference-counted per configuration), :func:`jit_inline_ir` (the one such helper that
updates its caller's lists, inlined by Numba) or :func:`pjit` (the few loops that run over many
configurations with ``prange``).

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

Compile time (the first run on a machine compiles every kernel it needs). A kernel that only
other kernels call needs no entry from Python: :func:`jit` and :func:`jit_inline` compile it
without the CPython wrapper (and no kernel gets the C-callable ``cfunc`` wrapper, which only a
kernel passed as a first-class function value would use). The wrappers are code Numba lowers,
optimises and emits for every compiled function (boxing and unboxing each argument, an 18-field
``Arch``, the 40-field ``SplitCosts`` it returns) and were a quarter of a cold sweep's compile;
the kernels' own code is the same with or without them. Python calls of such a kernel (tests,
:mod:`vtrain_fast.analysis.show`, the drivers' helpers) go to a twin of it compiled with the
wrapper on its first such call (:class:`KernelDispatcher`). A call with a literal argument does
not compile a version per literal (:meth:`KernelDispatcher.get_call_template`), and a cold
driver leaves the kernels it reaches last to a second process (the compile helper, below).
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import numba
from numba.core import errors, event, sigutils, types as nbtypes
from numba.core.caching import FunctionCache
from numba.core.registry import CPUDispatcher

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

# _nrt and forceinline given explicitly: Numba otherwise passes a caller's values on to the functions
# it compiles for it (jit_inline's would reach every kernel its helpers call)
JIT_OPTIONS = dict(nogil=True, cache=True, error_model="numpy", fastmath=False, no_cfunc_wrapper=True,
                   _nrt=True, forceinline=False)
PARALLEL_OPTIONS = dict(JIT_OPTIONS, parallel=True)
# JIT_OPTIONS as the target options numba.njit makes of them (cache is the dispatcher's)
_TARGET_OPTIONS = dict({k: v for k, v in JIT_OPTIONS.items() if k != "cache"}, nopython=True, boundscheck=None)


class KernelDispatcher(CPUDispatcher):
    """A Numba dispatcher whose compiled versions have no CPython wrapper, for kernels that
    other kernels call: typing a call from another kernel compiles (or loads from the cache) the
    version without the wrapper, as Numba compiles ``@overload`` implementations.

    Such a version must never be entered from Python (it has no entry point), so a call from
    Python goes to :attr:`python_twin`, an ordinary dispatcher of the same function built on the
    first Python call. The twin's function object is a copy named ``<name>__py``: Numba's cache
    names its files after the function's qualified name and does not tell versions with and
    without the wrapper apart, so the twin keeps cache files of its own."""

    def __call__(self, *args, **kwargs):
        return self.python_twin(*args, **kwargs)

    def compile(self, sig):
        if _pending:
            _wait_for_helper(self, sig)
        return super().compile(sig)

    def add_overload(self, cres):
        if not self.targetoptions.get("_nrt", True):
            _check_uncounted(self.py_func, cres)
        super().add_overload(cres)

    def get_call_template(self, args, kws):
        """Type a call from another kernel with its arguments' plain types first.

        Numba compiles a version for every literal value a caller passes (``p2p_s(x, True,
        hw)``, ``schedule(..., out, 0)``), each a full compile of the function and everything
        it calls, the same code after LLVM inlines the call. Only a function that does not
        type without the literal (one that picks a tuple field or a return type by it) gets
        the literal version."""
        plain = tuple(nbtypes.unliteral(a) for a in args)
        plain_kws = {k: nbtypes.unliteral(v) for k, v in kws.items()}
        if plain != tuple(args) or plain_kws != kws:
            try:
                return super().get_call_template(plain, plain_kws)
            except errors.TypingError:
                pass
        return super().get_call_template(args, kws)

    @property
    def python_twin(self):
        """The ordinary dispatcher (with the CPython wrapper) that Python calls of this kernel
        go to, built on the first one."""
        twin = self.__dict__.get("_python_twin")
        if twin is None:
            f = self.py_func
            g = types.FunctionType(f.__code__, f.__globals__, f.__name__, f.__defaults__, f.__closure__)
            g.__qualname__ = f.__qualname__ + "__py"
            g.__kwdefaults__ = f.__kwdefaults__
            g.__doc__ = f.__doc__
            g.__module__ = f.__module__
            twin = numba.njit(**JIT_OPTIONS)(g)
            self.__dict__["_python_twin"] = twin
        return twin


def _check_uncounted(func, cres):
    """Refuse a version of ``func`` compiled without reference counting that holds a counted
    value (an array, a list, ...) other than the arguments its caller holds for it: one it
    makes, gets from a call or returns would leak or be freed early."""
    dmm = cres.target_context.data_model_manager
    counted = lambda t: dmm[t].contains_nrt_meminfo()
    args = set(cres.fndesc.args)
    typemap = cres.fndesc.typemap or {}     # None for a version loaded from the cache (checked when compiled)
    bad = [name for name, t in typemap.items()
           if counted(t) and name.split(".")[0] not in args and not name.startswith("arg.")]
    if counted(cres.signature.return_type):
        bad.append("the return value")
    if bad:
        raise TypeError(f"{func.__module__}.{func.__qualname__} is compiled without reference counting "
                        f"(jit_inline) but holds counted values: {', '.join(sorted(bad)[:5])}; "
                        "make it @jit, or pass those values in from its caller")


def _kernel(func, **options):
    """A :class:`KernelDispatcher` of ``func`` with the project's options plus ``options``."""
    if numba.config.DISABLE_JIT:
        return func
    disp = KernelDispatcher(py_func=func, locals={},
                            targetoptions={**_TARGET_OPTIONS, "no_cpython_wrapper": True, **options})
    disp.enable_caching()
    return disp


def jit(func):
    """Compile a scalar formula with the project's njit options (without the CPython wrapper:
    :class:`KernelDispatcher`); LLVM inlines it into its callers where it finds that pays."""
    return _kernel(func)


def jit_inline(func):
    """Compile a per-configuration helper that takes arrays with the project's njit options,
    inlined into every caller by LLVM (``forceinline``: ``alwaysinline``) and compiled without
    Numba's reference counting (``_nrt=False``).

    A called Numba function reference-counts each array it takes (an atomic add on entry and
    an atomic subtract on every exit that the reference-count pruning pass leaves in place); on
    the per-point path of the sweep drivers those atomics, on arrays every thread shares, cost
    more than the cost model itself (scan kernel 172 ns per point single-thread, 85 ns with the
    helpers inlined; 2026-12-01). Inlined, the helpers' repeated calls (``stage_memory`` for the
    first, a middle and the last stage) also share their common terms. These helpers only read
    the arrays their caller holds, so they need no counting; :class:`KernelDispatcher` refuses
    one that makes or returns a counted value (an array, a list), which needs :func:`jit`.

    Until 2026-12 these helpers were inlined by Numba (``inline="always"``), which copies,
    types and lowers a helper's body once per call site and per driver: ``schedule`` with its
    three copies of ``stage_memory`` took 8.8 s of a cold sweep's compile, 2.1 s since. LLVM's
    inlining of one compiled version gives the same outputs bit for bit (``tests/test_golden.py``)
    and, without the counting, faster kernels (``make bench`` on a 2-core VM, full-model sweep:
    row kernel 10.9 -> 12.2 M configurations/s, scan kernel 17.0 -> 19.6 M/s)."""
    return _kernel(func, _nrt=False, forceinline=True)


def jit_inline_ir(func):
    """Compile a per-configuration helper that writes into its caller's lists (the sweep drivers'
    block caches, which Numba updates only with reference counting on) inlined into its callers
    by Numba (``inline="always"``), so that the arrays it takes are not reference-counted per
    call (:func:`jit_inline`): its body is copied, typed and lowered in every caller. Keep such
    helpers small; the kernels they call are compiled once each."""
    return numba.njit(inline="always", **JIT_OPTIONS)(func)


class DriverDispatcher(CPUDispatcher):
    """The dispatcher of a :func:`pjit` driver: compiling one (not loading it from the cache)
    starts the compile helper (:func:`compile_in_helper`)."""


def pjit(func):
    """Compile a ``prange`` driver loop with the project's njit options plus ``parallel=True``."""
    if numba.config.DISABLE_JIT:
        return func
    disp = DriverDispatcher(py_func=func, locals={}, targetoptions={**_TARGET_OPTIONS, "parallel": True})
    disp.enable_caching()
    return disp


# ------------------------------------------------------------------------------ compile helper
# A cold driver compiles its kernels one after another in one thread (Numba holds one compiler
# lock per process). The kernels its compile reaches last (split_costs, model_totals, schedule:
# model.sweep.helper_kernels) are compiled meanwhile by a second Python process, the compile helper,
# on another core, while the driver's compile does micro_batch_costs; it then waits for the helper
# if it is still at work and loads the helper's results from the cache. The helper compiles into a
# cache folder of its own and saves only those kernels into the shared cache, each once complete:
# Numba's cache files are not safe against two processes saving versions of one function at once,
# so no function is saved by both. A helper that fails, or is switched off
# (VTRAIN_FAST_COMPILE_HELPER=0), leaves the compile to the driver; the code is the same either way.
HELPER_ENV = "VTRAIN_FAST_COMPILE_HELPER"
_helper_lists: list = []         # functions returning ((kernel, example_args), ...)
_pending: dict = {}              # ("module:qualname", argument types) -> the helper process compiling it


def _kernel_name(kernel) -> str:
    return f"{kernel.py_func.__module__}:{kernel.py_func.__qualname__}"


def compile_in_helper(kernels) -> None:
    """Let the compile helper compile, when a :func:`pjit` driver compiles cold, the :func:`jit`
    kernels of ``kernels()``: ``((kernel, example_args), ...)``, each for the argument types of its
    example values (typed as the drivers pass them; ``tests/test_compile_helper.py`` checks that they
    do), in that order."""
    _helper_lists.append(kernels)


def _helper_work() -> list:
    """``[(name, kernel, signature), ...]`` of every registered kernel."""
    return [(_kernel_name(k), k, tuple(k.typeof_pyval(a) for a in args))
            for kernels in _helper_lists for k, args in kernels()]


def _in_cache(kernel, sig) -> bool:
    """Whether ``kernel``'s cache holds a version for ``sig`` (its index file names one)."""
    try:
        cache = kernel._cache
        return cache._index_key(sig, kernel.targetctx.codegen()) in cache._cache_file._load_index()
    except Exception:                                       # unknown: let the helper find out
        return False


def _start_helper() -> None:
    """Start the compile helper for the registered kernels that are neither compiled in this
    process nor in the cache."""
    if os.environ.get(HELPER_ENV, "1") == "0" or (os.cpu_count() or 1) < 2 or not numba.config.CACHE_DIR:
        return
    work = [(name, sig) for name, kernel, sig in _helper_work()
            if (name, sig) not in _pending and sig not in kernel.overloads and not _in_cache(kernel, sig)]
    if not work:
        return
    own = tempfile.mkdtemp(prefix="vtrain-fast-helper-")
    env = dict(os.environ, **{HELPER_ENV: "0", "NUMBA_CACHE_DIR": own, "VTRAIN_FAST_SHARED_CACHE_DIR": numba.config.CACHE_DIR})
    root = str(Path(__file__).resolve().parents[2])          # this copy of the package, whatever the cwd
    code = f"import sys; sys.path.insert(0, {root!r}); from vtrain_fast.model._jit import _helper_main; _helper_main()"
    try:
        proc = subprocess.Popen([sys.executable, "-c", code, *(name for name, _ in work)], env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except OSError:
        os.rmdir(own)
        return
    for key in work:
        _pending[key] = proc


def _wait_for_helper(kernel, sig) -> None:
    """If the helper compiles ``kernel`` for ``sig``, wait for it to finish (its result is then in
    the cache)."""
    args, _ = sigutils.normalize_signature(sig)
    proc = _pending.pop((_kernel_name(kernel), tuple(args)), None)
    if proc is not None:
        try:
            proc.wait(timeout=600)
        except subprocess.TimeoutExpired:
            proc.kill()


class _DriverCompileListener(event.Listener):
    def on_start(self, ev):
        if isinstance(ev.data.get("dispatcher"), DriverDispatcher):
            try:
                _start_helper()
            except Exception:       # the helper only saves time: the driver compiles everything without it
                pass

    def on_end(self, ev):
        pass


event.register("numba:compile", _DriverCompileListener())


def _helper_main() -> None:
    """The compile helper process: compile the kernels named on the command line (in this
    process's own cache folder) and save each into the shared cache once compiled."""
    import importlib
    import shutil
    importlib.import_module("vtrain_fast.model.sweep")      # registers the kernels
    shared = os.environ["VTRAIN_FAST_SHARED_CACHE_DIR"]
    own = numba.config.CACHE_DIR
    try:
        work = {name: (kernel, sig) for name, kernel, sig in _helper_work()}
        for name in sys.argv[1:]:
            kernel, sig = work[name]
            kernel.compile(sig)
            numba.config.CACHE_DIR = shared
            try:
                FunctionCache(kernel.py_func).save_overload(sig, kernel.overloads[sig])
            finally:
                numba.config.CACHE_DIR = own
    finally:
        shutil.rmtree(own, ignore_errors=True)
