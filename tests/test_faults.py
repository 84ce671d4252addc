"""Faults and hostile inputs around results folders (issue 10): a folder never lies, a failed
write never looks finished, every bad path ends in one message and exit status 2.

Each test here failed (a wrong answer with exit status 0, or a traceback) before the folder's
files were recorded and checked."""
from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

from conftest import ONE_POINT_SPEC, TINY_SPEC, flat
from vtrain_fast.engine import run as engine
from vtrain_fast.io.errors import InputError
from vtrain_fast.analysis.query import pareto, scan_results
from vtrain_fast.plan.spec import load_spec
from vtrain_fast.io.writer import sha256_of

OBJECTIVES = ["cost_usd", "train_days"]
# Several chunks (part files) of the tiny grid, so that a test can damage one and check that
# only that one is rebuilt.
CHUNKS = dict(chunk_points=256, batch_points=128)


def _manifest(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())


def _rows(folder: Path) -> pl.DataFrame:
    """Every row of a folder as its parts hold them (not through the checked reader)."""
    return pl.concat([pl.read_parquet(folder / p) for p in _manifest(folder)["parts"]])


def _stamps(folder: Path) -> dict:
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in folder.glob("part-*.parquet")}


@pytest.fixture
def spec_path(write_spec) -> Path:
    return write_spec(TINY_SPEC, "tiny.toml")


@pytest.fixture
def chunked(spec_path, tmp_path) -> Path:
    """The tiny grid swept in six chunks (six part files), keep all."""
    folder = tmp_path / "chunked"
    engine.run_sweep(load_spec(spec_path), folder, **CHUNKS)
    assert len(_manifest(folder)["parts"]) == 6
    return folder


def _damage(path: Path, how: str, other: Path | None = None) -> None:
    if how == "delete":
        path.unlink()
    elif how == "truncate":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif how == "flip":                       # same size, one byte changed
        data = bytearray(path.read_bytes())
        data[len(data) // 3] ^= 0xFF
        path.write_bytes(bytes(data))
    elif how == "swap":                       # another valid part of the same sweep under its name
        shutil.copyfile(other, path)
    else:
        raise AssertionError(how)


# ------------------------------------------------------------------- 1. a folder never lies
def test_a_part_copied_in_from_another_sweep_is_never_read(tiny_sweep, tmp_path):
    folder = tmp_path / "copy"
    shutil.copytree(tiny_sweep, folder)
    before = pareto(folder, OBJECTIVES)
    # a foreign part whose one plan would dominate every other (free and instant)
    fake = (pl.read_parquet(folder / "part-000000.parquet").filter(pl.col("status") == "ok").head(1)
            .with_columns(pl.lit(0.0).alias("cost_usd"), pl.lit(0.0).alias("train_days")))
    fake.write_parquet(folder / "part-000999.parquet")
    assert pareto(folder, OBJECTIVES).equals(before)
    assert scan_results(folder).select(pl.len()).collect().item() == _manifest(folder)["num_rows"]


@pytest.mark.parametrize("how", ["delete", "truncate", "flip", "swap"])
def test_a_damaged_part_is_refused_and_the_same_command_rebuilds_only_it(chunked, spec_path, how):
    manifest = _manifest(chunked)
    victim = chunked / manifest["parts"][2]
    record = manifest["files"][victim.name]
    rows = _rows(chunked)
    front = pareto(chunked, OBJECTIVES)
    _damage(victim, how, other=chunked / manifest["parts"][3])
    with pytest.raises(InputError) as e:
        pareto(chunked, OBJECTIVES)
    msg = flat(e.value)
    assert victim.name in msg and "rerun the same sweep command" in msg, msg
    untouched = {k: v for k, v in _stamps(chunked).items() if k != victim.name}
    notes = []
    engine.run_sweep(load_spec(spec_path), chunked, on_note=notes.append, **CHUNKS)
    assert len(notes) == 1 and victim.name in notes[0], notes
    assert {k: v for k, v in _stamps(chunked).items() if k != victim.name} == untouched
    assert sha256_of(victim) == record["sha256"]          # rebuilt exactly
    assert _rows(chunked).equals(rows) and pareto(chunked, OBJECTIVES).equals(front)


def test_cli_pareto_names_a_missing_part_and_a_rerun_of_sweep_rebuilds_it(spec_path, tmp_path, cli):
    out = tmp_path / "out"
    assert cli("sweep", spec_path, "-o", out).exit_code == 0
    before = cli("pareto", out).output
    (out / "part-000000.parquet").unlink()
    res = cli("pareto", out)
    assert res.exit_code == 2 and "part-000000.parquet" in flat(res.output), res.output
    assert "missing" in flat(res.output) and "rerun the same sweep command" in flat(res.output)
    res = cli("sweep", spec_path, "-o", out)
    assert res.exit_code == 0 and "part-000000.parquet is missing" in flat(res.output), res.output
    assert cli("pareto", out).output == before
    res = cli("sweep", spec_path, "-o", out)                  # intact now: nothing to redo
    assert res.exit_code == 2 and "already holds the finished sweep" in flat(res.output), res.output


def test_resume_after_a_recorded_part_was_deleted_evaluates_its_chunk_again(chunked, spec_path):
    rows = _rows(chunked)
    manifest = _manifest(chunked)
    manifest["complete"] = False                   # as if killed after these chunks were recorded
    (chunked / "manifest.json").write_text(json.dumps(manifest))
    (chunked / manifest["parts"][4]).unlink()
    m = engine.run_sweep(load_spec(spec_path), chunked, **CHUNKS)
    assert m["complete"] and m["num_rows"] == rows.height
    assert scan_results(chunked).collect().equals(rows)


def test_a_frontier_folder_rebuilds_a_damaged_candidate_file_and_its_final_part(spec_path, tmp_path):
    folder = tmp_path / "front"
    spec = load_spec(spec_path)
    engine.run_sweep(spec, folder, keep="frontier", chunk_points=300, batch_points=100)
    front = pl.read_parquet(folder / "part-000000.parquet")
    (folder / "reduce" / "c-000001.parquet").unlink()
    _damage(folder / "part-000000.parquet", "truncate")
    with pytest.raises(InputError, match="part-000000.parquet"):
        pareto(folder, OBJECTIVES)
    notes = []
    engine.run_sweep(spec, folder, keep="frontier", chunk_points=300, batch_points=100, on_note=notes.append)
    assert any("c-000001.parquet is missing" in n for n in notes) and any("part-000000" in n for n in notes), notes
    assert pl.read_parquet(folder / "part-000000.parquet").equals(front)


def test_merge_refuses_a_shard_whose_part_is_damaged(spec_path, tmp_path, cli):
    out = tmp_path / "sharded"
    spec = load_spec(spec_path)
    for k in (1, 2):
        engine.run_sweep(spec, out, shard=(k, 2), **CHUNKS)
    shard2 = json.loads((out / "manifest-shard-2-of-2.json").read_text())
    victim = next(info["file"]["name"] for info in shard2["chunks"].values() if info["file"])
    _damage(out / victim, "flip")
    res = cli("merge", out)
    assert res.exit_code == 2 and victim in flat(res.output), res.output
    assert not (out / "manifest.json").exists()
    engine.run_sweep(spec, out, shard=(2, 2), **CHUNKS)     # the shard that wrote it rebuilds it
    assert cli("merge", out).exit_code == 0
    assert scan_results(out).select(pl.len()).collect().item() == 1296


def test_a_manifest_that_is_not_a_json_object_is_an_input_error(tiny_sweep, tmp_path, cli, spec_path):
    for text in ("[1, 2]", '"complete"', "{\"complete\": tru", ""):
        folder = tmp_path / f"m{len(text)}"
        shutil.copytree(tiny_sweep, folder)
        (folder / "manifest.json").write_text(text)
        for args in (("pareto", folder), ("sweep", spec_path, "-o", folder)):
            res = cli(*args)
            assert res.exit_code == 2 and "manifest" in flat(res.output), (args, res.output)
            assert "Traceback" not in res.output


def test_an_edited_manifest_that_lists_an_unrecorded_part_is_refused(tiny_sweep, tmp_path):
    folder = tmp_path / "edited"
    shutil.copytree(tiny_sweep, folder)
    m = _manifest(folder)
    m["parts"].append("part-000999.parquet")
    (folder / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(InputError, match="parts"):
        pareto(folder, OBJECTIVES)


def test_pareto_on_an_empty_or_unrelated_folder_says_so(tmp_path, cli):
    empty = tmp_path / "empty"
    empty.mkdir()
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("not results")
    for folder in (empty, other):
        res = cli("pareto", folder)
        assert res.exit_code == 2 and "holds no vtrain-fast results" in flat(res.output), res.output
        assert "interrupted" not in res.output
    res = cli("pareto", other / "notes.txt")
    assert res.exit_code == 2 and "it is a file" in flat(res.output), res.output


# ------------------------------------------------------------- failed writes never look done
def _failing_writes(monkeypatch, after: int, code: int = errno.ENOSPC):
    """Make the ``after``-th Parquet row-group write and every later one fail with ``code``."""
    original = pq.ParquetWriter.write_table
    calls = {"n": 0}

    def write_table(self, table, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] >= after:
            raise OSError(code, os.strerror(code))
        return original(self, table, *args, **kwargs)
    monkeypatch.setattr(pq.ParquetWriter, "write_table", write_table)


def test_a_part_whose_write_fails_is_never_renamed_and_a_rerun_completes(spec_path, tmp_path, monkeypatch,
                                                                           tiny_sweep):
    out = tmp_path / "full"
    _failing_writes(monkeypatch, after=5)
    with pytest.raises(InputError) as e:
        engine.run_sweep(load_spec(spec_path), out, writer_threads=1, **CHUNKS)
    msg = flat(e.value)
    assert "No space left on device" in msg and "free there" in msg and "part-0000" in msg, msg
    assert not list(out.glob("**/*.tmp"))
    state = _manifest(out)
    assert not state["complete"]
    recorded = {info["part"] for info in state["chunks"].values()}
    assert {p.name for p in out.glob("part-*.parquet")} <= recorded    # no unrecorded final name
    monkeypatch.undo()
    m = engine.run_sweep(load_spec(spec_path), out, writer_threads=1, **CHUNKS)
    assert m["complete"] and m["num_rows"] == 1296
    key = ["model", "gpu", "num_gpus", "tp", "pp", "micro_batch_size", "global_batch_size", "recompute"]
    assert scan_results(out).collect().sort(key).equals(scan_results(tiny_sweep).collect().sort(key))


def test_cli_sweep_on_a_full_disk_exits_2_with_the_path_and_free_space(spec_path, tmp_path, cli, monkeypatch):
    _failing_writes(monkeypatch, after=1)
    res = cli("sweep", spec_path, "-o", tmp_path / "o")
    msg = flat(res.output)
    assert res.exit_code == 2 and "No space left on device" in msg and "free there" in msg, res.output
    assert "part-000000.parquet" in msg and not list((tmp_path / "o").glob("part-*"))


def test_a_file_size_limit_ends_the_sweep_cleanly_and_a_rerun_completes(spec_path, tmp_path):
    """A real fault: the process's file-size limit (RLIMIT_FSIZE, ``ulimit -f``) below a part's size."""
    out = tmp_path / "limited"
    script = textwrap.dedent(f"""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.RLIM_INFINITY))
        from vtrain_fast.cli import main
        sys.argv = ["vtrain-fast", "sweep", {str(spec_path)!r}, "-o", {str(out)!r}]
        main()
    """)
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    msg = flat(res.stderr)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert "part-000000.parquet" in msg and ("File too large" in msg) and "ulimit -f" in msg, msg
    assert not list(out.glob("*.tmp")) and not (out / "part-000000.parquet").exists()
    res = subprocess.run([sys.executable, "-m", "vtrain_fast", "sweep", str(spec_path), "-o", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert _manifest(out)["complete"] and _manifest(out)["num_rows"] == 1296


# --------------------------------------------------------------- 2. output paths, no tracebacks
UNWRITABLE = Path("/sys/vtrain-fast-test")     # not even root may create files here


@pytest.fixture
def unwritable():
    if os.access("/sys", os.W_OK) and UNWRITABLE.parent.exists():
        try:
            UNWRITABLE.mkdir()
        except OSError:
            return UNWRITABLE
        UNWRITABLE.rmdir()
        pytest.fail("/sys accepts new folders on this machine: the test needs another unwritable place")
    return UNWRITABLE


def _commands(spec_path, tiny_sweep, plans_csv, out):
    return {
        "sweep": ("sweep", spec_path, "-o", out),
        "evaluate": ("evaluate", plans_csv, "-o", out / "e.parquet"),
        "pareto -o": ("pareto", tiny_sweep, "-o", out / "f.csv"),
        "pareto --plot": ("pareto", tiny_sweep, "--plot", out / "f.png"),
        "validate": ("validate", "-o", out / "v.parquet"),
        "calibrate": ("calibrate-nccl", *sorted(Path(engine.__file__).parent.parent.glob("data/vtrain/nccl_allreduce_a100/*2gpu.csv")),
                      "--gpu", "a100-sxm4-80gb", "-o", out / "c.toml"),
    }


@pytest.fixture
def plans_csv(tmp_path) -> Path:
    p = tmp_path / "plans.csv"
    p.write_text("num_layers,hidden_size,num_attention_heads,seq_length,global_batch_size,micro_batch_size,tp,pp,dp,gpu\n"
                 "12,768,12,2048,8,1,1,1,8,a100-sxm4-80gb\n")
    return p


@pytest.mark.parametrize("command", ["sweep", "evaluate", "pareto -o", "pareto --plot", "validate", "calibrate"])
def test_output_under_a_file_or_in_an_unwritable_place_exits_2(command, spec_path, tiny_sweep, plans_csv, tmp_path,
                                                                 cli, unwritable):
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    for out in (a_file / "sub", unwritable / "sub"):
        res = cli(*_commands(spec_path, tiny_sweep, plans_csv, out)[command])
        assert res.exit_code == 2, (command, out, res.output)
        assert str(out.parent) in flat(res.output) and "Traceback" not in res.output, res.output
    assert a_file.read_text() == "x"


def test_sweep_output_that_is_an_existing_file_is_refused(spec_path, tmp_path, cli):
    a_file = tmp_path / "results.txt"
    a_file.write_text("keep me")
    res = cli("sweep", spec_path, "-o", a_file)
    assert res.exit_code == 2 and "it is a file" in flat(res.output), res.output
    assert a_file.read_text() == "keep me"


@pytest.mark.parametrize("command", ["evaluate", "pareto -o", "pareto --plot", "validate", "calibrate"])
def test_a_full_disk_under_any_output_exits_2_and_leaves_nothing(command, spec_path, tiny_sweep, plans_csv, tmp_path,
                                                                   cli, monkeypatch):
    import vtrain_fast.io.errors as errors_module
    def failing(real):
        def full(src, dst):      # every atomic write fails at its last step, as on a full disk
            if str(dst).startswith(str(tmp_path / "o")):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real(src, dst)
        return full
    # the last step: a rename (replacing), or a hard link (a new file, never replacing one)
    monkeypatch.setattr(errors_module.os, "replace", failing(os.replace))
    monkeypatch.setattr(errors_module.os, "link", failing(os.link))
    out = tmp_path / "o"
    res = cli(*_commands(spec_path, tiny_sweep, plans_csv, out)[command])
    assert res.exit_code == 2 and "No space left on device" in flat(res.output), (command, res.output)
    assert "free there" in flat(res.output) and "Traceback" not in res.output
    assert not [p for p in out.rglob("*") if p.is_file()], list(out.rglob("*"))


# ------------------------------------------------------------------------ shards of two splits
def test_shards_of_two_splits_are_never_written_into_one_folder(spec_path, tmp_path, cli):
    out = tmp_path / "split"
    assert cli("sweep", spec_path, "-o", out, "--shard", "1/2").exit_code == 0
    res = cli("sweep", spec_path, "-o", out, "--shard", "1/3")
    assert res.exit_code == 2 and "K/2" in flat(res.output), res.output
    assert not list(out.glob("manifest-shard-*-of-3.json"))
    assert cli("sweep", spec_path, "-o", out, "--shard", "2/2").exit_code == 0
    assert cli("merge", out).exit_code == 0


def test_two_splits_started_at_once_never_collide(spec_path, tmp_path):
    """Shards of a 2-way and a 3-way split started together: one is refused with a message, the
    other finishes; no FileNotFoundError on a temporary file, no traceback."""
    out = tmp_path / "race"
    procs = [subprocess.Popen([sys.executable, "-m", "vtrain_fast", "sweep", str(spec_path), "-o", str(out),
                               "--shard", shard], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for shard in ("1/2", "1/3")]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    codes = sorted(rc for rc, _ in results)
    assert codes == [0, 2], results
    assert all("Traceback" not in err for _, err in results), results
    assert "the split of the shards already in this folder" in flat(next(e for rc, e in results if rc == 2))


# -------------------------------------------------------------------- messages, sizes, pickling
def test_input_errors_survive_pickling_whole():
    """A Dask worker's InputError reaches the client with its fields (pickled)."""
    import pickle
    e = InputError("a.toml", "tp", -1, "an integer >= 1", "e.g. tp = 2")
    back = pickle.loads(pickle.dumps(e))
    assert str(back) == str(e) and back.key == "tp"


@pytest.mark.parametrize("n, text", [(0, "0 B"), (999, "999 B"), (1536, "1.5 KiB"), (10**6, "977 KiB"),
                                     (2 * 10**6, "1.9 MiB"), (3 << 30, "3 GiB"), (16 << 20, "16 MiB"), (5 << 40, "5 TiB")])
def test_sizes_are_printed_in_a_readable_unit(n, text):
    from vtrain_fast.io.errors import format_bytes
    assert format_bytes(n) == text


def test_a_write_failure_names_the_reason_from_a_polars_error():
    from vtrain_fast.io.errors import write_failure
    e = write_failure("/x/out.csv", OSError("No space left on device (os error 28)"))
    assert "No space left on device" in str(e) and "ulimit -f" in str(e)


def test_one_point_spec_still_sweeps(write_spec, tmp_path, cli):
    """The fault checks cost nothing on a good run: a one-point sweep, then pareto."""
    out = tmp_path / "one"
    assert cli("sweep", write_spec(ONE_POINT_SPEC.format(training="")), "-o", out).exit_code == 0
    assert cli("pareto", out).exit_code == 0


def test_a_chunk_the_cluster_cannot_finish_is_one_message_and_a_rerun_resumes(spec_path, tmp_path, monkeypatch):
    """A task that fails on every attempt (as when its workers keep dying) ends the sweep with
    an InputError naming the chunk, not a Dask traceback; the finished chunks stay recorded."""
    from vtrain_fast.engine import distributed as dist
    real = dist.chunk_task

    def doomed(key, grid, keep, plan, folder, chunk, threads, prune):
        if chunk == 2:
            raise ConnectionError("worker lost")
        return real(key, grid, keep, plan, folder, chunk, threads, prune)
    monkeypatch.setattr(dist, "chunk_task", doomed)
    out = tmp_path / "cluster"
    spec = load_spec(spec_path)
    with pytest.raises(InputError) as e:
        engine.run_sweep(spec, out, scheduler="local:1", **CHUNKS)
    msg = flat(e.value)
    assert "chunk 2 did not finish" in msg and "resumes" in msg, msg
    assert "2" not in _manifest(out)["chunks"]
    monkeypatch.undo()
    m = engine.run_sweep(spec, out, scheduler="local:1", **CHUNKS)
    assert m["complete"] and m["num_rows"] == 1296


def test_parts_without_a_manifest_are_not_read_and_the_message_says_why(tiny_sweep, tmp_path, cli):
    folder = tmp_path / "orphan"
    shutil.copytree(tiny_sweep, folder)
    (folder / "manifest.json").unlink()
    res = cli("pareto", folder)
    msg = flat(res.output)
    assert res.exit_code == 2 and "nothing vouches for the 1 part file(s)" in msg and "--overwrite" in msg, msg
    assert "resume" not in msg


def test_a_narrow_table_notes_only_values_every_row_shares():
    """A note ``tp = 2`` under a table cut to its first rows must hold for the rows not shown."""
    from vtrain_fast.analysis.report import fit_columns
    whole = pl.DataFrame({"tp": [2, 2, 8], "pp": [4, 4, 4], "model": ["m-" + "x" * 40] * 3,
                          "cost_usd": [1.0, 2.0, 3.0]})
    _, notes = fit_columns(whole.head(2), 40, keep=("cost_usd",), whole=whole)
    assert "pp = 4" in ", ".join(notes) and "tp = 2" not in ", ".join(notes), notes
    _, notes = fit_columns(whole.head(2), 40, keep=("cost_usd",))
    assert "tp = 2" in ", ".join(notes)            # of the rows given, without the whole frame


def _small_disk(monkeypatch, folder: Path, capacity: int) -> None:
    """``shutil.disk_usage`` of a disk of ``capacity`` bytes that holds only ``folder``'s files."""
    from collections import namedtuple
    usage = namedtuple("usage", "total used free")

    def disk_usage(path):
        used = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.exists() else 0
        return usage(capacity, used, max(capacity - used, 0))
    monkeypatch.setattr(shutil, "disk_usage", disk_usage)


def test_a_resume_needs_room_only_for_the_chunks_still_to_do(spec_path, tmp_path, monkeypatch):
    out = tmp_path / "resume-room"
    spec = load_spec(spec_path)
    _failing_writes(monkeypatch, after=6)            # 3 of 6 chunks (2 row groups each) written
    with pytest.raises(InputError):
        engine.run_sweep(spec, out, writer_threads=1, **CHUNKS)
    monkeypatch.undo()
    done = len(_manifest(out)["chunks"])
    assert 0 < done < 6
    used = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    still = 1296 - sum(i["points"] for i in _manifest(out)["chunks"].values())
    # room for the missing rows (10 bytes each), not for all 1,296
    _small_disk(monkeypatch, out, used + still * engine.MIN_BYTES_PER_ROW + 2_000)
    assert 1296 * engine.MIN_BYTES_PER_ROW > still * engine.MIN_BYTES_PER_ROW + 2_000
    m = engine.run_sweep(spec, out, writer_threads=1, **CHUNKS)
    assert m["complete"] and m["num_rows"] == 1296


def test_overwrite_counts_the_room_its_old_files_free(spec_path, tmp_path, cli, monkeypatch):
    out = tmp_path / "ow"
    assert cli("sweep", spec_path, "-o", out).exit_code == 0
    used = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    _small_disk(monkeypatch, out, used + 5_000)        # less than 12,960 bytes free until the old rows go
    res = cli("sweep", spec_path, "-o", out, "--overwrite")
    assert res.exit_code == 0, res.output
    # a spec 30 times larger does not fit even in the room the old rows free: refused, naming the sizes
    bigger = spec_path.with_name("bigger.toml")
    bigger.write_text(TINY_SPEC.replace("num_tokens = [1e9]", "num_tokens = [" + ", ".join(
        f"{k}e9" for k in range(1, 31)) + "]"))
    before = _stamps(out)
    res = cli("sweep", bigger, "-o", out, "--overwrite")
    assert res.exit_code == 2 and "(at least 380 KiB needed, " in flat(res.output), res.output
    assert _stamps(out) == before and _manifest(out)["complete"]     # refused before deleting anything


@pytest.mark.parametrize("source", ["another sweep", "another chunk"])
def test_a_part_with_a_forged_record_is_still_refused(chunked, tiny_sweep, source):
    """A part copied in and its record in the manifest rewritten to match (size, checksum):
    the file's own metadata names the sweep and chunk that wrote it."""
    from vtrain_fast.io.writer import file_record
    victim = chunked / "part-000001.parquet"
    src = (tiny_sweep / "part-000000.parquet") if source == "another sweep" else (chunked / "part-000004.parquet")
    shutil.copyfile(src, victim)
    m = _manifest(chunked)
    rec = file_record(victim, pq.ParquetFile(victim).metadata.num_rows)
    m["files"][victim.name] = rec
    m["chunks"]["1"]["file"] = rec
    m["chunks"]["1"]["rows"] = rec["rows"]
    m["num_rows"] = sum(r["rows"] for r in m["files"].values())
    (chunked / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(InputError) as e:
        pareto(chunked, OBJECTIVES)
    assert "part-000001.parquet" in flat(e.value) and "another sweep or chunk" in flat(e.value), flat(e.value)


@pytest.mark.parametrize("edit, field", [
    (lambda m: m["files"]["part-000000.parquet"].update(name="../other/part-000000.parquet"), "files"),
    (lambda m: m["files"]["part-000000.parquet"].update(bytes="123"), "files"),
    (lambda m: m["files"]["part-000000.parquet"].pop("sha256"), "files"),
    (lambda m: m.update(parts=m["parts"] * 2), "parts"),
    (lambda m: m.update(format="2"), "format"),
    (lambda m: m.update(format=None), "format"),
    (lambda m: m.update(num_rows=999_999), "num_rows"),
    (lambda m: m["chunks"].update({"x": m["chunks"]["0"]}), "chunks"),
    (lambda m: m["chunks"].update({"7": m["chunks"]["0"]}), "chunks"),
    (lambda m: m["chunks"]["0"].update(status_counts="x"), "chunks.0"),
    (lambda m: m["chunks"]["0"].update(file=None), "chunks.0.file"),
])
def test_a_manifest_edited_by_hand_is_refused_by_readers_and_the_resume(chunked, spec_path, edit, field):
    m = _manifest(chunked)
    edit(m)
    (chunked / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(InputError) as e:
        pareto(chunked, OBJECTIVES)
    assert f"{field} " in flat(e.value) and "--overwrite" in flat(e.value), flat(e.value)
    m["complete"] = False                      # as an interrupted run's manifest
    (chunked / "manifest.json").write_text(json.dumps(m))
    if field not in ("files", "parts", "num_rows"):       # fields a finished manifest adds
        with pytest.raises(InputError, match="--overwrite"):
            engine.run_sweep(load_spec(spec_path), chunked, **CHUNKS)
