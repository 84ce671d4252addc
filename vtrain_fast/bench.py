"""``make bench``: how fast the sweep engine is on this machine.

Measures, in one run and after a warm-up (Numba compilation is excluded, except in 6):

1. the row kernel (``sweep_chunk``) over the default sweep's index space: configurations per
   second; the row and scan kernels over a sweep whose every point reaches the whole cost model
   (:data:`_FULL_MODEL_TEXT`); and the cost model one configuration at a time, with nothing
   reused between points (``evaluate_rows`` on the default sweep's points that reach it);
2. the scan kernel of ``--keep frontier`` (with pruning) over the same space;
3. the plain-Python reference model (``tests/reference.py``) on sampled points, and the
   kernel on the same points: the speed ratio;
4. end to end, ``--keep all`` writing every row to Parquet: rows per second;
5. a ``--keep frontier`` sweep of about 10^9 points in a child process: time and peak RSS;
6. the first run on a machine: the default sweep in a child process with an empty kernel cache
   (compiling every kernel it needs), and the same command again with the kernels cached.

Run ``python -m vtrain_fast.bench --help`` for sizes. Numbers depend on the machine and on
what else runs on it; the load average is printed with them.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_SPEC = REPO / "sweeps" / "gpt3-175b-a100.toml"

# The default sweep's axes with a longer token axis (for end-to-end runs of several seconds).
_DEFAULT_TEXT = """\
name = "bench-{name}"
[model]
presets = ["gpt3-175b"]
[training]
num_tokens = [{tokens}]
global_batch_size = [512, 768, 1024, 1536, 2048, 3072, 4096, 6144]
micro_batch_size = [1, 2, 4, 8, 16, 32]
recompute = ["none", "full"]
[cluster]
gpu = ["a100-sxm4-40gb", "a100-sxm4-80gb", "h100-sxm-80gb"]
num_gpus = [{sizes}]
[parallel]
tp = [1, 2, 4, 8, 16]
pp = [1, 2, 4, 8, 12, 16, 24, 32, 48, 96]
"""

# The model presets of the first bench (2026-11-30), fixed so that runs stay comparable as
# presets are added.
FRONTIER_MODELS = ("gpt3-125m", "gpt3-350m", "gpt3-760m", "gpt3-1.3b", "gpt3-2.7b", "gpt3-6.7b",
                   "gpt3-13b", "gpt3-175b", "vtrain-3.6b", "vtrain-18.4b", "vtrain-39.1b", "megatron-1t")
# About 10^9 points: 12 model presets x 10 token budgets x 4 GPU types x num_gpus_values
# cluster sizes x 6 tp x 11 pp x 8 micro-batch x 16 global-batch x 2 recompute
# (128 sizes: 1,038,090,240 points).
_FRONTIER_TEXT = """\
name = "bench-frontier"
[model]
presets = [{models}]
[training]
num_tokens = [1e11, 2e11, 3e11, 5e11, 7e11, 1e12, 1.4e12, 2e12, 3e12, 4e12]
global_batch_size = [256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288,
                     16384, 24576, 32768, 49152]
micro_batch_size = [1, 2, 4, 8, 16, 32, 64, 128]
recompute = ["none", "full"]
[cluster]
gpu = ["a100-sxm4-40gb", "a100-sxm4-80gb", "h100-sxm-80gb", "v100-sxm2-32gb"]
num_gpus = [{sizes}]
[parallel]
tp = [1, 2, 4, 8, 16, 32]
pp = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48]
"""


# Every point of this sweep passes the shape rules (tp * pp divides every num_gpus, pp every
# num_layers, dp * micro_batch_size every global_batch_size), so each one is evaluated by the
# whole cost model: 64 token budgets x 3 GPU types x 3 sizes x 4 tp x 5 pp x 4 micro-batch x
# 8 global-batch x 2 recompute = 737,280 points. The global batches are large because they must
# be multiples of dp * micro_batch_size for every split (dp up to 512).
_FULL_MODEL_TEXT = """\
name = "bench-full-model"
[model]
presets = ["gpt3-175b"]
[training]
num_tokens = [{tokens}]
global_batch_size = [4096, 8192, 12288, 16384, 20480, 24576, 28672, 32768]
micro_batch_size = [1, 2, 4, 8]
recompute = ["none", "full"]
[cluster]
gpu = ["a100-sxm4-40gb", "a100-sxm4-80gb", "h100-sxm-80gb"]
num_gpus = [128, 256, 512]
[parallel]
tp = [1, 2, 4, 8]
pp = [1, 2, 4, 8, 16]
"""


# A sweep over today's dense-stack axes (issue 12): Llama 3 70B on H100 with context parallelism,
# ZeRO stages, FP8 and an uneven first stage as axes (the Megatron-core-style stack on); most
# points reach the whole cost model (the rest: repeats at pp = 1, batch rules, no memory).
_STACK_AXES_TEXT = """\
name = "bench-stack-axes"
[model]
presets = ["llama3-70b"]
[training]
num_tokens = [{tokens}]
global_batch_size = [1024, 2048, 4096, 8192]
micro_batch_size = [1, 2, 4, 8]
recompute = ["none", "selective", "full"]
use_flash_attn = true
sequence_parallel = true
overlap_grad_reduce = true
zero_stage = [1, 2, 3]
precision = ["bf16", "fp8"]
[cluster]
gpu = "h100-sxm-80gb"
num_gpus = [256, 512, 1024]
[parallel]
tp = [1, 2, 4, 8]
cp = [1, 2]
pp = [1, 2, 4]
first_pipeline_num_layers = [0, 8]
"""


def stack_axes_spec_text(num_tokens: int = 16) -> str:
    """Spec text of the sweep that varies the dense-stack axes (cp, zero_stage, precision, an uneven first stage)."""
    return _STACK_AXES_TEXT.format(tokens=_token_budgets(num_tokens))


# The same sweep with the context-parallel axes varied: cp = [1, 2] and both exchanges (FlashAttention
# on, which cp > 1 needs): 32 token budgets x 2 x 2 = 1,474,560 points; the all_gather machine's
# cp = 1 rows repeat the p2p machine's (status repeat), and tp 8 x cp 2 x pp 16 does not divide 128
# GPUs (bad_num_gpus).
_FULL_MODEL_CP_EXTRA = """use_flash_attn = true
[parallel]
cp = [1, 2]
cp_comm_type = ["p2p", "all_gather"]
"""


def full_model_cp_spec_text(num_tokens: int = 32) -> str:
    """Spec text of the full-model sweep with ``cp`` and ``cp_comm_type`` as axes."""
    text = full_model_spec_text(num_tokens).replace('name = "bench-full-model"', 'name = "bench-full-model-cp"')
    head, parallel = text.split("[parallel]\n")
    extra_training, extra_parallel = _FULL_MODEL_CP_EXTRA.split("[parallel]\n")
    return head.replace("[cluster]\n", extra_training + "[cluster]\n") + "[parallel]\n" + parallel + extra_parallel


def full_model_moe_spec_text(num_tokens: int = 64) -> str:
    """Spec text of the full-model sweep on a mixture-of-experts model (issue 13): Mixtral 8x7B
    with ep = [1, 8] and pp up to 8 (its 32 layers), 1,179,648 points, with sequence parallelism
    (Megatron-core refuses ep > 1 at tp > 1 without it), most reaching the whole model (the rest:
    bad_num_gpus, tp x dp not a multiple of etp x ep with etp = tp)."""
    text = full_model_spec_text(num_tokens).replace('name = "bench-full-model"', 'name = "bench-full-model-moe"')
    return (text.replace('presets = ["gpt3-175b"]', 'presets = ["mixtral-8x7b"]')
            .replace("[cluster]\n", "sequence_parallel = true\n[cluster]\n")
            .replace("pp = [1, 2, 4, 8, 16]", "pp = [1, 2, 4, 8]\nep = [1, 8]"))


def full_model_spec_text(num_tokens: int = 64) -> str:
    """Spec text of the sweep whose every point reaches the whole cost model."""
    return _FULL_MODEL_TEXT.format(tokens=_token_budgets(num_tokens))


def frontier_spec_text(num_sizes: int = 128) -> str:
    """Spec text of the large frontier sweep; ``num_sizes`` cluster sizes 64, 128, ...
    (128 sizes: 1,038,090,240 points)."""
    models = ", ".join(f'"{m}"' for m in FRONTIER_MODELS)
    sizes = ", ".join(str(64 * (i + 1)) for i in range(num_sizes))
    return _FRONTIER_TEXT.format(models=models, sizes=sizes)


def default_spec_text(name: str, num_tokens: int, num_sizes: int = 32) -> str:
    """The default sweep's axes with ``num_tokens`` token budgets and ``num_sizes`` cluster
    sizes (multiples of 256 GPUs), as spec text; used to size the end-to-end benchmark."""
    sizes = ", ".join(str(256 * (i + 1)) for i in range(num_sizes))
    return _DEFAULT_TEXT.format(name=name, tokens=_token_budgets(num_tokens), sizes=sizes)


def _token_budgets(num_tokens: int) -> str:
    """A spec's num_tokens list of ``num_tokens`` budgets, 1e11, 2e11, ... (a long fast axis)."""
    return ", ".join(f"{1e11 * (i + 1):g}" for i in range(num_tokens))


# The sweeps whose kernel rates `make bench` reports beside the default sweep's: (result key prefix,
# spec text, what the printout calls it).
SWEEP_BENCHES = (
    ("full", full_model_spec_text, "full cost model on every point (gpt3-175b)"),
    ("stack", stack_axes_spec_text, "dense-stack axes varied (llama3-70b: cp x zero_stage x precision x first stage)"),
    ("cp", full_model_cp_spec_text, "full cost model with cp = [1, 2] and cp_comm_type = [p2p, all_gather]"),
    ("moe", full_model_moe_spec_text, "full cost model on a mixture of experts (mixtral-8x7b, ep = [1, 8])"),
)


def _peak_rss_MiB() -> float:
    """This process's peak resident set (``VmHWM``; ``ru_maxrss`` would include the parent's
    memory at fork time in a child)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _best(fn, repeat: int) -> float:
    best = math.inf
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def _import_reference():
    """``tests/reference.py`` (the plain-Python twin), or None when the tests are not here."""
    tests = REPO / "tests"
    if not (tests / "reference.py").exists():
        return None
    sys.path.insert(0, str(tests))
    try:
        import reference
    except Exception:                                      # a broken twin must not stop the bench
        return None
    return reference


def bench_kernels(grid, threads: int, repeat: int) -> dict:
    """Row kernel, full-model-only and scan kernel rates over ``grid``."""
    import numpy as np

    from .engine.chunks import RowBuffers
    from .model import sweep as ks
    from .model.records import OK, OUT_OF_MEMORY

    n = grid.num_points
    batch = 1 << 18
    b = RowBuffers(batch)
    args = grid.kernel_args()
    statuses = np.zeros(8, dtype=np.int64)

    def rows():
        for s in range(0, n, batch):
            m = min(batch, n - s)
            ks.sweep_chunk(s, m, *args, b.inputs, b.tokens, b.out, b.status)

    rows()
    t_rows = _best(rows, repeat)
    # which points reach the whole cost model (status ok or out_of_memory)?
    full_idx = []
    for s in range(0, n, batch):
        m = min(batch, n - s)
        ks.sweep_chunk(s, m, *args, b.inputs, b.tokens, b.out, b.status)
        statuses[:7] += np.bincount(b.status[:m], minlength=7)
        st = b.status[:m]
        full_idx.append(s + np.flatnonzero((st == OK) | (st == OUT_OF_MEMORY)))
    full_idx = np.concatenate(full_idx).astype(np.int64)
    # the full cost model alone: evaluate_rows on those points as explicit configurations
    fb = RowBuffers(full_idx.size)
    ks.sweep_points(full_idx, *args, fb.inputs, fb.tokens, fb.out, fb.status)
    cols = ks.rows_from_inputs(fb.inputs[:, :full_idx.size])
    hw_rows = np.ascontiguousarray(grid.hw_table[fb.inputs[ks.INPUT.gpu_index, :full_idx.size]])
    tokens = np.ascontiguousarray(fb.tokens[:full_idx.size])
    out = np.empty_like(fb.out[:, :full_idx.size])
    st = np.empty(full_idx.size, dtype=np.int8)

    def full_only():
        ks.evaluate_rows(cols, tokens, hw_rows, out, st)

    full_only()
    t_full = _best(full_only, repeat)

    t_scan = _best_scan(grid, repeat)

    sweeps = {key: bench_sweep(spec_text(), f"bench-{key}.toml", threads, repeat, b, batch)
              for key, spec_text, _ in SWEEP_BENCHES}
    return {
        "points": n, "threads": threads,
        "rows_per_s": n / t_rows,
        "ns_per_point_core": t_rows * threads / n * 1e9,
        "full_model_points": int(full_idx.size),
        "full_model_per_s": full_idx.size / t_full,
        "full_model_ns_core": t_full * threads / full_idx.size * 1e9,
        "scan_per_s": n / t_scan,
        "status_fractions": (statuses[:7] / n).round(4).tolist(),
        **{f"{key}_sweep_{k}": v for key, res in sweeps.items() for k, v in res.items()},
    }


def bench_sweep(text: str, name: str, threads: int, repeat: int, b, batch: int) -> dict:
    """Row and scan kernel rates over the sweep of spec ``text`` (``b``: row buffers of ``batch``)."""
    import numpy as np

    from .model import sweep as ks
    from .model.records import OK, OUT_OF_MEMORY
    from .plan.grid import build_grid
    from .plan.spec import parse_spec
    grid = build_grid(parse_spec(text, name))
    n = grid.num_points
    args = grid.kernel_args()
    stat = np.zeros(16, dtype=np.int64)

    def rows(count=False):
        for s in range(0, n, batch):
            m = min(batch, n - s)
            ks.sweep_chunk(s, m, *args, b.inputs, b.tokens, b.out, b.status)
            if count:
                stat[:] += np.bincount(b.status[:m], minlength=16)[:16]

    rows(count=True)
    reached = int(stat[OK] + stat[OUT_OF_MEMORY])
    t_rows = _best(rows, repeat)
    t_scan = _best_scan(grid, repeat)
    return {"points": n, "reached": reached / n, "rows_per_s": n / t_rows, "reached_per_s": reached / t_rows,
            "rows_ns_core": t_rows * threads / n * 1e9, "scan_per_s": n / t_scan,
            "scan_ns_core": t_scan * threads / n * 1e9}


def _best_scan(grid, repeat: int) -> float:
    """Best time of the ``--keep frontier`` scan kernel (cost_usd, train_days) over ``grid``."""
    import numpy as np

    from .engine.chunks import ChunkEvaluator, parse_keep, plan_sweep
    n = grid.num_points
    keep = parse_keep("frontier", ["cost_usd", "train_days"])
    plan = plan_sweep(n, keep)
    ev = ChunkEvaluator(grid, keep, plan)
    empty_v, empty_i = np.empty((0, 2)), np.empty(0, np.int64)

    def scan():
        for s in range(0, n, plan.batch_points):
            ev.scan(s, min(plan.batch_points, n - s), empty_v, empty_i)

    scan()
    return _best(scan, repeat)


def bench_reference(grid, samples: int) -> dict | None:
    """Plain-Python twin vs kernel on the same ``samples`` random points of ``grid``."""
    import numpy as np

    from .engine.chunks import RowBuffers
    from .model import sweep as ks
    ref = _import_reference()
    if ref is None:
        return None
    rng = np.random.default_rng(0)
    idx = np.sort(rng.choice(grid.num_points, size=min(samples, grid.num_points), replace=False)).astype(np.int64)
    t = time.perf_counter()
    for i in idx.tolist():
        ref.sweep_point(i, grid)
    t_ref = (time.perf_counter() - t) / idx.size
    b = RowBuffers(idx.size)
    args = grid.kernel_args()
    ks.sweep_points(idx, *args, b.inputs, b.tokens, b.out, b.status)
    reps = 50
    t_k = _best(lambda: [ks.sweep_points(idx, *args, b.inputs, b.tokens, b.out, b.status)
                         for _ in range(reps)], 3) / (reps * idx.size)
    return {"samples": int(idx.size), "reference_us_per_point": t_ref * 1e6,
            "kernel_ns_per_point": t_k * 1e9, "ratio": t_ref / t_k}


def bench_end_to_end(spec_text: str, folder: Path, writer_threads: int | None) -> dict:
    """Run ``spec_text`` with ``--keep all`` into ``folder``; return rows, seconds, rows/s,
    bytes per row on disk and the number of part files."""
    from .engine.run import run_sweep
    from .plan.spec import parse_spec
    spec = parse_spec(spec_text, "bench-e2e.toml")
    warm = parse_spec(default_spec_text("warm", 1, 4), "bench-warm.toml")
    run_sweep(warm, folder / "warm", overwrite=True, writer_threads=writer_threads)
    t = time.perf_counter()
    cpu = time.process_time()
    m = run_sweep(spec, folder / "all", overwrite=True, writer_threads=writer_threads)
    dt = time.perf_counter() - t
    size = sum(p.stat().st_size for p in (folder / "all").glob("part-*.parquet"))
    return {"rows": m["num_rows"], "seconds": dt, "rows_per_s": m["num_rows"] / dt,
            "cpu_s": time.process_time() - cpu, "bytes_per_row": size / m["num_rows"],
            "parts": len(m["parts"])}


def bench_cold_compile(folder: Path, timeout: float) -> dict:
    """``vtrain-fast sweep`` of the default spec in a child process with an empty kernel cache
    (the first run on a machine, compiling every kernel it needs), then again with the cache it
    filled: wall seconds of both; their difference is the compile."""
    env = dict(os.environ, VTRAIN_FAST_CACHE_DIR=str(folder / "kernel-cache"))
    env.pop("NUMBA_CACHE_DIR", None)
    cmd = [sys.executable, "-m", "vtrain_fast", "sweep", str(DEFAULT_SPEC), "-o", str(folder / "cold"), "--overwrite"]
    times = []
    for _ in range(2):
        t = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        times.append(time.perf_counter() - t)
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr[-2000:])
    return {"cold_s": times[0], "warm_s": times[1], "compile_s": times[0] - times[1]}


def bench_frontier(num_sizes: int, folder: Path, timeout: float) -> dict:
    """Run the large frontier sweep in a child process (its own peak RSS)."""
    cmd = [sys.executable, "-m", "vtrain_fast.bench", "--frontier-child", str(num_sizes),
           "--dir", str(folder)]
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    dt = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-2000:])
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["wall_s_with_startup"] = dt
    return out


def _frontier_child(num_sizes: int, folder: Path) -> None:
    from .engine.run import run_sweep
    from .plan.spec import parse_spec
    spec = parse_spec(frontier_spec_text(num_sizes), "bench-frontier.toml")
    t = time.perf_counter()
    m = run_sweep(spec, folder / "frontier", overwrite=True, keep="frontier",
                  minimize=["cost_usd", "train_days"])
    dt = time.perf_counter() - t
    print(json.dumps({"points": spec.num_points, "seconds": dt, "points_per_s": spec.num_points / dt,
                      "frontier_rows": m["num_rows"], "pruned_points": m["pruned_points"],
                      "ok_points": m["status_counts"]["ok"],
                      "peak_rss_MiB": _peak_rss_MiB()}))


def main(argv=None) -> int:
    """Command line of ``make bench``; returns the exit status."""
    ap = argparse.ArgumentParser(prog="python -m vtrain_fast.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes: a smoke run of the bench")
    ap.add_argument("--frontier-sizes", type=int, default=128,
                    help="cluster sizes in the frontier sweep (128: ~1.04e9 points; 0: skip)")
    ap.add_argument("--e2e-tokens", type=int, default=24,
                    help="token budgets in the end-to-end sweep (x 460,800 points each)")
    ap.add_argument("--writer-threads", type=int, default=None)
    ap.add_argument("--no-cold", action="store_true",
                    help="skip the cold first run (the default sweep with an empty kernel cache)")
    ap.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    ap.add_argument("--dir", type=Path, default=None, help="scratch folder (default: a temp dir)")
    ap.add_argument("--frontier-child", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.frontier_child is not None:
        _frontier_child(args.frontier_child, args.dir)
        return 0

    import numba

    from .plan.grid import build_grid
    from .plan.spec import load_spec
    if args.quick:
        args.frontier_sizes = min(args.frontier_sizes, 2)
        args.e2e_tokens = min(args.e2e_tokens, 2)
        args.no_cold = True
    threads = numba.get_num_threads()
    load = os.getloadavg()
    print(f"vtrain_fast bench: {os.cpu_count()} cores, {threads} Numba threads, "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}", flush=True)
    results: dict = {"cores": os.cpu_count(), "numba_threads": threads, "load_before": load}

    grid = build_grid(load_spec(DEFAULT_SPEC))
    print(f"[1/5] kernels on {DEFAULT_SPEC.name} ({grid.num_points:,} points) ...", flush=True)
    k = bench_kernels(grid, threads, repeat=2 if args.quick else 5)
    results["kernel"] = k
    print(f"      row kernel (every point, full rows):  {k['rows_per_s'] / 1e6:8.2f} M configurations/s"
          f"  ({k['ns_per_point_core']:.0f} core-ns/point)")
    print(f"      scan kernel (--keep frontier, pruned):  {k['scan_per_s'] / 1e6:8.2f} M configurations/s")
    for key, _, title in SWEEP_BENCHES:
        s = {name[len(key) + 7:]: v for name, v in k.items() if name.startswith(f"{key}_sweep_")}
        print(f"      {title}, {s['points']:,} points ({s['reached']:.0%} reach the whole model):")
        print(f"        row kernel (full rows):               {s['rows_per_s'] / 1e6:8.2f} M configurations/s"
              f"  ({s['rows_ns_core']:.0f} core-ns/point; {s['reached_per_s'] / 1e6:.2f} M/s of those that reach it)")
        print(f"        scan kernel (--keep frontier):        {s['scan_per_s'] / 1e6:8.2f} M configurations/s"
              f"  ({s['scan_ns_core']:.0f} core-ns/point)")
    print(f"      full cost model one configuration at a time (evaluate_rows on the "
          f"{k['full_model_points']:,} default-sweep points that reach it, nothing reused): "
          f"{k['full_model_per_s'] / 1e6:.2f} M/s ({k['full_model_ns_core']:.0f} core-ns/point)")
    print("[2/5] plain-Python reference on the same points ...", flush=True)
    r = bench_reference(grid, 500 if args.quick else 3000)
    results["reference"] = r
    if r is None:
        print("      tests/reference.py not found: ratio not measured")
    else:
        print(f"      reference {r['reference_us_per_point']:.1f} us/point, kernel "
              f"{r['kernel_ns_per_point']:.1f} ns/point on the same {r['samples']:,} random points "
              f"(sweep_points): {r['ratio']:,.0f}x; vs the row kernel's average over the whole "
              f"sweep: {r['reference_us_per_point'] * 1e-6 * k['rows_per_s']:,.0f}x")
        r["ratio_vs_row_kernel"] = r["reference_us_per_point"] * 1e-6 * k["rows_per_s"]
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        tmp = Path(tmp)
        text = default_spec_text("e2e", args.e2e_tokens)
        print("[3/5] end to end, --keep all to Parquet ...", flush=True)
        e = bench_end_to_end(text, tmp, args.writer_threads)
        results["end_to_end"] = e
        results["peak_rss_MiB"] = _peak_rss_MiB()
        print(f"      {e['rows']:,} rows in {e['seconds']:.2f} s: {e['rows_per_s'] / 1e6:.2f} M rows/s "
              f"({e['bytes_per_row']:.1f} bytes/row on disk, {e['parts']} part files); "
              f"peak RSS {results['peak_rss_MiB']:.0f} MiB")
        if args.frontier_sizes:
            print(f"[4/5] --keep frontier sweep ({args.frontier_sizes} cluster sizes) in a child "
                  "process ...", flush=True)
            f = bench_frontier(args.frontier_sizes, tmp, timeout=3600)
            results["frontier"] = f
            print(f"      {f['points']:,} points in {f['seconds']:.1f} s: "
                  f"{f['points_per_s'] / 1e6:.2f} M points/s; frontier {f['frontier_rows']} rows; "
                  f"pruned {f['pruned_points'] / f['points']:.0%}; peak RSS {f['peak_rss_MiB']:.0f} MiB")
        if not args.no_cold:
            print(f"[5/5] cold first run: {DEFAULT_SPEC.name} with an empty kernel cache, in a child "
                  "process ...", flush=True)
            c = bench_cold_compile(tmp, timeout=1200)
            results["cold"] = c
            print(f"      {c['cold_s']:.1f} s (the same command with the kernels cached: {c['warm_s']:.1f} s; "
                  f"compiling: {c['compile_s']:.1f} s)")
    load = os.getloadavg()
    results["load_after"] = load
    print(f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
