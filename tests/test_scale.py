"""Sweeps at scale: the range / index / scan kernels against the plain-Python twin, keep modes
(feasible, frontier, top-K) against the full result, and results that do not depend on chunk
size, thread count, shard split, Dask, or an interruption and resume.

Speed is measured by ``make bench``, never here."""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
from polars.testing import assert_frame_equal

import reference as ref
from vtrain_fast.engine import chunks, run as engine
from vtrain_fast.io.errors import InputError
from vtrain_fast.plan.grid import build_grid, pruning_table
from vtrain_fast.model import records
from vtrain_fast.model import sweep as ks
from vtrain_fast.analysis.query import pareto, pareto_mask
from vtrain_fast.io.schema import SCHEMA
from vtrain_fast.plan.spec import parse_spec
from vtrain_fast.io.writer import ROW_GROUP_ROWS, FolderLock, read_manifest

# 2 models x 2 token budgets x 2 GPUs x 4 sizes x 3 tp x 4 pp x 3 mbs x 3 gbs x 2 recompute
# = 6,912 points: ok, out_of_memory, bad_num_gpus, bad_heads, bad_layers and bad_batch rows.
SPEC = """\
name = "scale"
[model]
presets = ["gpt3-350m", "gpt3-13b"]
[training]
num_tokens = [1e9, 2e10]
global_batch_size = [48, 96, 100]
micro_batch_size = [1, 2, 3]
recompute = ["none", "full"]
[cluster]
gpu = ["a100-sxm4-40gb", "h100-sxm-80gb"]
num_gpus = [8, 16, 24, 40]
[parallel]
tp = [1, 2, 3]
pp = [1, 2, 3, 4]
[output]
chunk_size = 500
"""
KEY = ["model", "gpu", "num_tokens", "num_gpus", "tp", "pp", "micro_batch_size",
       "global_batch_size", "recompute"]


@pytest.fixture(scope="module")
def spec():
    return parse_spec(SPEC, "scale.toml")


@pytest.fixture(scope="module")
def grid(spec):
    return build_grid(spec)


def read_rows(folder: Path) -> pl.DataFrame:
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["complete"] is True
    frames = [pl.read_parquet(folder / p) for p in manifest["parts"]]
    return pl.concat(frames).with_columns(
        pl.col(c).cast(pl.String) for c in ("model", "gpu", "recompute", "status"))


@pytest.fixture(scope="module")
def full(spec, tmp_path_factory):
    """The reference run: every row, default plan."""
    folder = tmp_path_factory.mktemp("full") / "r"
    engine.run_sweep(spec, folder)
    return folder


@pytest.fixture(scope="module")
def full_rows(full):
    return read_rows(full)


def signed(frame: pl.DataFrame, objectives) -> np.ndarray:
    return np.column_stack([frame[o.lstrip("-")].cast(pl.Float64).to_numpy()
                            * (-1.0 if o.startswith("-") else 1.0) for o in objectives])


# ------------------------------------------------------------------------------ kernels vs twin
def test_sweep_points_match_twin(grid):
    rng = np.random.default_rng(11)
    idx = rng.choice(grid.num_points, size=300, replace=False).astype(np.int64)
    b = chunks.RowBuffers(idx.size)
    ks.sweep_points(idx, *grid.kernel_args(), b.inputs, b.tokens, b.out, b.status)
    statuses = set()
    for j, index in enumerate(idx.tolist()):
        r_in, r_tok, r_status, r_out = ref.sweep_point(index, grid)
        assert dict(zip(ks.INPUT_NAMES, b.inputs[:, j].tolist())) == r_in
        assert b.tokens[j] == r_tok and b.status[j] == r_status
        statuses.add(r_status)
        for k, name in enumerate(records.OUTPUT_NAMES):
            want, got = r_out[name], b.out[k, j]
            assert (math.isnan(want) and math.isnan(got)) or math.isclose(got, want, rel_tol=1e-12), name
    assert {ref.OK, ref.BAD_NUM_GPUS, ref.BAD_BATCH} <= statuses


def test_scan_keeps_exactly_the_feasible_points_and_prunes_only_infeasible(grid):
    _check_scan_against_rows(grid)


def test_scan_and_pruning_with_an_interleaved_schedule():
    grid = build_grid(parse_spec(SPEC.replace("[parallel]", "[parallel]\nvpp = 2"), "scale-vpp.toml"))
    _check_scan_against_rows(grid)


def _check_scan_against_rows(grid):
    """The scan kernel keeps exactly the OK points the row kernel finds, counts the rest, and
    the pruning table removes only prefixes without any feasible point."""
    n = grid.num_points
    b = chunks.RowBuffers(n)
    ks.sweep_chunk(0, n, *grid.kernel_args(), b.inputs, b.tokens, b.out, b.status)
    table = pruning_table(grid)
    assert table.size and 0 < table.mean() < 1          # the grid has prunable prefixes
    for prefix in (table, np.zeros(0, np.uint8)):
        for start, m in ((0, n), (777, 3001), (n - 5, 5)):
            nb = -(-m // ks.BLOCK)
            cand = np.empty(m, np.int64)
            fill, pruned = np.empty(nb, np.int64), np.empty(nb, np.int64)
            counts = np.empty((nb, records.NUM_STATUS), np.int64)
            ks.scan_chunk(start, m, *grid.kernel_args(), prefix, ks.KEEP_FEASIBLE,
                          np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0),
                          np.zeros((0, 0)), np.zeros(0, np.int64), cand, np.zeros((0, m)),
                          fill, counts, pruned)
            idx, vals = np.empty(fill.sum(), np.int64), np.empty((fill.sum(), 0))
            ks.compact_candidates(cand, np.zeros((0, m)), fill, idx, vals, 0)
            status = b.status[start:start + m]
            assert idx.tolist() == (start + np.flatnonzero(status == records.OK)).tolist()
            assert counts.sum() + pruned.sum() == m
            full_counts = np.bincount(status, minlength=records.NUM_STATUS)
            assert counts.sum(0)[records.OK] == full_counts[records.OK]
            assert counts.sum(0)[records.OUT_OF_MEMORY] == full_counts[records.OUT_OF_MEMORY]
            if prefix.size == 0:
                assert pruned.sum() == 0 and (counts.sum(0) == full_counts).all()


def test_pareto_mask_matches_brute_force():
    rng = np.random.default_rng(5)
    for k in (1, 2, 3):
        vals = rng.integers(0, 6, size=(300, k)).astype(float)     # many exact ties
        vals[rng.random(300) < 0.05, 0] = np.nan
        mask = pareto_mask(vals)
        for i in range(300):
            if np.isnan(vals[i]).any():
                assert not mask[i]
                continue
            dominated = any((vals[j] <= vals[i]).all() and ((vals[j] < vals[i]).any() or j < i)
                            for j in range(300) if j != i and not np.isnan(vals[j]).any())
            assert mask[i] == (not dominated), (k, i)


# ------------------------------------------------------------------------------ keep modes
@pytest.mark.parametrize("objectives", [
    ["cost_usd", "train_days"],
    ["-mfu", "memory_per_gpu_GiB", "num_gpus"],
    ["num_gpus", "pp"],                    # integer objectives: exact ties everywhere
])
def test_frontier_equals_frontier_of_full_sweep(spec, full, tmp_path, objectives):
    want = pareto(full, objectives).with_columns(pl.col(c).cast(pl.String) for c in ("model", "gpu", "recompute"))
    folder = tmp_path / "front"
    m = engine.run_sweep(spec, folder, keep="frontier", minimize=objectives, chunk_points=1000,
                         batch_points=300)
    assert m["plan"]["num_chunks"] == 7 and m["num_rows"] == want.height > 0
    got = read_rows(folder)
    cols = KEY + [o.lstrip("-") for o in objectives if o.lstrip("-") not in KEY]
    assert_frame_equal(got.select(cols), want.select(cols))
    assert (got["status"] == "ok").all()
    # the frontier mode's own result is its own frontier
    assert pareto(folder, objectives).height == got.height


@pytest.mark.parametrize("col", ["cost_usd", "-mfu", "num_gpus"])
def test_top_k_equals_sorted_full_sweep(spec, full_rows, tmp_path, col):
    k = 9
    folder = tmp_path / "top"
    engine.run_sweep(spec, folder, keep=f"top:{k}:{col}", chunk_points=2000, batch_points=700)
    got = read_rows(folder)
    ok = full_rows.with_row_index("i").filter(pl.col("status") == "ok")
    name = col.lstrip("-")
    want = ok.with_columns(_v=pl.col(name).cast(pl.Float64) * (-1.0 if col.startswith("-") else 1.0)
                           ).sort(["_v", "i"]).head(k)
    cols = KEY + ([name] if name not in KEY else [])
    assert_frame_equal(got.select(cols), want.select(cols))


def test_feasible_equals_filtered_full_sweep(spec, full_rows, tmp_path):
    folder = tmp_path / "feasible"
    m = engine.run_sweep(spec, folder, keep="feasible", chunk_points=1500, batch_points=400)
    got = read_rows(folder)
    want = full_rows.filter(pl.col("status") == "ok")
    assert_frame_equal(got, want)
    assert m["status_counts"]["ok"] == want.height and m["pruned_points"] > 0
    assert sum(m["status_counts"].values()) + m["pruned_points"] == spec.num_points


# ------------------------------------------------------------------------------ independence
@pytest.mark.parametrize("kw", [
    dict(chunk_points=1000, batch_points=250, threads=1, writer_threads=1),
    dict(chunk_points=4096, batch_points=4096, threads=2, writer_threads=3),
    dict(chunk_points=7, batch_points=3, threads=2, writer_threads=2),
])
def test_all_rows_independent_of_chunks_and_threads(spec, full_rows, tmp_path, kw):
    if kw["chunk_points"] == 7:                         # tiny chunks: use a slice of the grid
        sub = parse_spec(SPEC.replace('num_gpus = [8, 16, 24, 40]', 'num_gpus = [8]')
                         .replace('presets = ["gpt3-350m", "gpt3-13b"]', 'presets = ["gpt3-350m"]')
                         .replace('num_tokens = [1e9, 2e10]', 'num_tokens = [1e9]'), "sub.toml")
        base = tmp_path / "base"
        engine.run_sweep(sub, base)
        want, spec = read_rows(base), sub
    else:
        want = full_rows
    folder = tmp_path / "r"
    m = engine.run_sweep(spec, folder, **kw)
    assert_frame_equal(read_rows(folder), want)
    assert m["num_rows"] == spec.num_points == sum(m["status_counts"].values())


def test_parquet_layout(full, spec):
    manifest = json.loads((full / "manifest.json").read_text())
    assert manifest["keep"] == "all" and manifest["plan"]["batch_points"] == spec.chunk_size
    f = pq.ParquetFile(full / manifest["parts"][0])
    assert f.schema_arrow.names == SCHEMA.names
    assert all(f.schema_arrow.field(x.name).type == x.type for x in SCHEMA)
    md = f.metadata
    assert md.num_row_groups > 1
    for g in range(md.num_row_groups):
        rg = md.row_group(g)
        assert rg.num_rows <= min(spec.chunk_size, ROW_GROUP_ROWS)
        for c in range(rg.num_columns):
            col = rg.column(c)
            assert col.compression == "ZSTD" and col.is_stats_set
    assert not list(full.glob("**/*.tmp"))


# ------------------------------------------------------------------------------ shards
@pytest.mark.parametrize("keep", ["all", "frontier"])
def test_shards_merge_to_the_single_run(spec, full_rows, tmp_path, keep):
    folder = tmp_path / "sharded"
    plan = dict(chunk_points=700, batch_points=300)
    for k in (2, 3, 1):
        m = engine.run_sweep(spec, folder, keep=keep, shard=f"{k}/3", **plan)
        assert m["complete"] and m["shard"] == [k, 3]
        with pytest.raises(InputError, match="merge"):          # not readable before merge
            read_manifest(folder)
    merged = engine.merge_shards(folder)
    assert merged["shards"] == 3 and merged["complete"]
    single = tmp_path / "single"
    engine.run_sweep(spec, single, keep=keep, **plan)
    assert_frame_equal(read_rows(folder), read_rows(single))
    if keep == "all":
        assert_frame_equal(read_rows(folder), full_rows)


def test_merge_refuses_missing_shard(spec, tmp_path):
    folder = tmp_path / "sharded"
    engine.run_sweep(spec, folder, shard="1/3", chunk_points=700)
    engine.run_sweep(spec, folder, shard="3/3", chunk_points=700)
    with pytest.raises(InputError, match=r"1 of 3 missing.*missing: 2; unfinished: none"):
        engine.merge_shards(folder)


# ------------------------------------------------------------------------------ Dask
@pytest.fixture(scope="module")
def dask_client():
    distributed = pytest.importorskip("distributed")
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                       dashboard_address=":0")
    client = distributed.Client(cluster)
    yield client
    client.close()
    cluster.close()


@pytest.mark.parametrize("keep", ["all", "frontier", "top:5:cost_usd"])
def test_dask_equals_local(spec, tmp_path, dask_client, keep):
    plan = dict(chunk_points=900, batch_points=300)
    local, remote = tmp_path / "local", tmp_path / "dask"
    engine.run_sweep(spec, local, keep=keep, **plan)
    m = engine.run_sweep(spec, remote, keep=keep, scheduler=dask_client, **plan)
    assert m["plan"]["num_chunks"] == 8
    assert_frame_equal(read_rows(remote), read_rows(local))


def test_dask_retries_a_failed_chunk(spec, full_rows, tmp_path, dask_client, monkeypatch):
    """A task that dies half way (partial file left behind) is retried; the result is exact."""
    from vtrain_fast.engine import distributed as dist
    real = dist.chunk_task
    marker = tmp_path / "failed-once"       # tasks are pickled: remember the failure on disk

    def flaky(key, grid, keep, plan, folder, chunk, threads, prune):
        if chunk == 3 and not marker.exists():
            marker.write_text("3")
            (Path(folder) / "part-000003.parquet.tmp").write_bytes(b"PAR1 half written")
            raise ConnectionError("worker lost")
        return real(key, grid, keep, plan, folder, chunk, threads, prune)

    monkeypatch.setattr(dist, "chunk_task", flaky)
    folder = tmp_path / "r"
    engine.run_sweep(spec, folder, scheduler=dask_client, chunk_points=1000, batch_points=500)
    assert marker.read_text() == "3"
    assert_frame_equal(read_rows(folder), full_rows)
    assert not list(folder.glob("*.tmp"))


def test_cli_scheduler_local(tmp_path, cli, full_rows):
    path = tmp_path / "scale.toml"
    path.write_text(SPEC)
    res = cli("sweep", path, "-o", tmp_path / "r", "--scheduler", "local:2")
    assert res.exit_code == 0, res.output
    assert_frame_equal(read_rows(tmp_path / "r"), full_rows)


# ------------------------------------------------------------------------------ resume
class Crash(Exception):
    pass


@pytest.mark.parametrize("keep", ["all", "frontier"])
def test_resume_after_crash_equals_uninterrupted_run(spec, tmp_path, keep):
    plan = dict(chunk_points=1000, batch_points=250, writer_threads=2)
    folder = tmp_path / "r"
    seen = []

    def crash_mid_sweep(n):
        seen.append(n)
        if sum(seen) >= 3600:              # in the middle of chunk 3
            raise Crash

    with pytest.raises(Crash):
        engine.run_sweep(spec, folder, keep=keep, on_progress=crash_mid_sweep, **plan)
    state = json.loads((folder / "manifest.json").read_text())
    assert state["complete"] is False and 0 < len(state["chunks"]) < state["plan"]["num_chunks"]
    (folder / "part-000005.parquet.tmp").write_bytes(b"PAR1 torn")       # as a kill leaves it
    with pytest.raises(InputError, match="interrupted"):
        read_manifest(folder)
    progress = []
    m = engine.run_sweep(spec, folder, keep=keep, on_progress=progress.append, **plan)
    assert progress[0] == 1000 * len(state["chunks"])     # the finished chunks, reported at once
    assert sum(progress) == spec.num_points and m["resumed"] == 1
    fresh = tmp_path / "fresh"
    engine.run_sweep(spec, fresh, keep=keep, **plan)
    assert_frame_equal(read_rows(folder), read_rows(fresh))
    assert not list(folder.glob("**/*.tmp"))


def test_resume_after_sigkill(spec, tmp_path):
    """Kill -9 a sweep process mid-run; rerunning the same call yields exactly the full rows."""
    folder = tmp_path / "r"
    (tmp_path / "scale.toml").write_text(SPEC)
    script = textwrap.dedent(f"""
        import time
        from vtrain_fast.engine.run import run_sweep
        from vtrain_fast.plan.spec import load_spec
        run_sweep(load_spec({str(tmp_path / 'scale.toml')!r}), {str(folder)!r},
                  chunk_points=600, batch_points=200, on_progress=lambda n: time.sleep(0.05))
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], env=dict(os.environ))
    manifest = folder / "manifest.json"
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            if len(json.loads(manifest.read_text())["chunks"]) >= 2:
                break
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    state = json.loads(manifest.read_text())
    assert not state["complete"] and len(state["chunks"]) < state["plan"]["num_chunks"]
    engine.run_sweep(parse_spec(SPEC, "scale.toml"), folder, chunk_points=600, batch_points=200)
    rows = read_rows(folder)
    fresh = tmp_path / "fresh"
    engine.run_sweep(spec, fresh, chunk_points=600, batch_points=200)
    assert_frame_equal(rows, read_rows(fresh))
    assert rows.select(KEY).n_unique() == rows.height == spec.num_points


def test_overwrite_and_finished_folder(spec, tmp_path):
    folder = tmp_path / "r"
    engine.run_sweep(spec, folder, keep="top:3:cost_usd")
    with pytest.raises(InputError, match="--overwrite"):
        engine.run_sweep(spec, folder, keep="top:3:cost_usd")
    with pytest.raises(InputError, match="different sweep"):
        json_path = folder / "manifest.json"
        state = json.loads(json_path.read_text())
        state["complete"] = False
        json_path.write_text(json.dumps(state))
        engine.run_sweep(spec, folder, keep="top:4:cost_usd")
    m = engine.run_sweep(spec, folder, keep="all", overwrite=True)
    assert m["num_rows"] == spec.num_points
    assert sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) == \
        ["manifest.json"] + m["parts"]


def test_second_writer_is_refused(spec, tmp_path):
    folder = tmp_path / "r"
    with FolderLock(folder):
        with pytest.raises(InputError, match="another process"):
            engine.run_sweep(spec, folder)
    with FolderLock(folder, (1, 2)):
        with pytest.raises(InputError, match="another process"):
            engine.run_sweep(spec, folder, shard="1/2")
        with pytest.raises(InputError, match="another process"):
            engine.run_sweep(spec, folder)                       # whole-folder writer
        engine.run_sweep(spec, folder, shard="2/2")              # the other shard may run


# ------------------------------------------------------------------------------ input errors
def test_index_space_overflow_is_a_clear_error(tmp_path):
    many = ", ".join(str(i) for i in range(1, 501))
    text = textwrap.dedent(f"""
        [model]
        num_layers = [{many}]
        hidden_size = 768
        num_attention_heads = 12
        seq_length = 2048
        [training]
        num_tokens = [{", ".join(f"{i}e9" for i in range(1, 501))}]
        global_batch_size = [{many}]
        micro_batch_size = [{many}]
        recompute = ["none", "full"]
        [cluster]
        gpu = ["a100-sxm4-40gb", "h100-sxm-80gb"]
        num_gpus = [{many}]
        [parallel]
        tp = [{many}]
        pp = [{many}]
    """)
    big = parse_spec(text, "huge.toml")
    assert big.num_points > 2 ** 63 - 1
    with pytest.raises(InputError, match="int64"):
        engine.run_sweep(big, tmp_path / "r", keep="frontier")
    assert not (tmp_path / "r").exists()
    with pytest.raises(InputError, match="int64"):
        chunks.plan_sweep(2 ** 63, chunks.parse_keep("all"))


@pytest.mark.parametrize("keep, minimize, needle", [
    ("some", None, "--keep"),
    ("top:0:cost_usd", None, "top:K:COL"),
    ("top:5", None, "top:K:COL"),
    ("top:5:happiness", None, "happiness"),
    ("frontier", ["cost_usd", "-cost_usd"], "each column once"),
    ("all", ["cost_usd"], "--keep frontier"),
    ("frontier", ["model"], "numeric"),
])
def test_bad_keep(keep, minimize, needle):
    with pytest.raises(InputError, match=needle):
        chunks.parse_keep(keep, minimize)


def test_cli_keep_shard_merge(tmp_path, cli, full):
    path = tmp_path / "scale.toml"
    path.write_text(SPEC)
    out = tmp_path / "r"
    for k in (1, 2):
        res = cli("sweep", path, "-o", out, "--keep", "frontier", "--minimize", "cost_usd",
                  "--minimize", "train_days", "--shard", f"{k}/2")
        assert res.exit_code == 0, res.output
    assert "merge" in res.output
    res = cli("merge", out)
    assert res.exit_code == 0, res.output
    assert "merged 2 shards" in res.output
    want = pareto(full, ["cost_usd", "train_days"])
    assert read_rows(out).height == want.height
    for bad in (["--keep", "top:x:cost_usd"], ["--shard", "3/2"], ["--scheduler", "local:0"]):
        res = cli("sweep", path, "-o", tmp_path / "bad", *bad)
        assert res.exit_code == 2 and "error:" in res.output, res.output
    assert not (tmp_path / "bad").exists()
    res = cli("merge", tmp_path / "bad")
    assert res.exit_code == 2 and "error:" in res.output
