"""Faults in the input (issue 10): each case exits with status 2 and one message naming the file
or option, the key or column and what is allowed, and writes or changes nothing."""
from __future__ import annotations

import os
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

import vtrain_fast
from conftest import ONE_POINT_SPEC
from vtrain_fast.cli import app
from vtrain_fast.io.errors import InputError
from vtrain_fast.analysis.nccl import fit_tables, read_table
from vtrain_fast.io.schema import resolve_objectives
from vtrain_fast.plan.spec import parse_spec

NCCL_TABLES = sorted((Path(vtrain_fast.__file__).parent / "data" / "vtrain" / "nccl_allreduce_a100").glob("*.csv"))
HEADER = "num_layers,hidden_size,num_attention_heads,seq_length,global_batch_size,micro_batch_size,tp,pp,dp,gpu"
ROWS = [f"24,2048,16,2048,{8 * i},1,1,1,8,a100-sxm4-80gb" for i in range(1, 7)]
SPEC = ONE_POINT_SPEC.format(training="")


def run(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def flat(result) -> str:
    """The output with whitespace normalised (rich wraps at the terminal width)."""
    return " ".join(result.output.split())


def refused(result, *needles) -> str:
    text = flat(result)
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert "error:" in text and "Traceback" not in text, result.output
    for n in needles:
        assert n in text, f"{n!r} not in {text!r}"
    return text


def measurements(tmp_path) -> Path:
    path = tmp_path / "meas.csv"
    path.write_text(HEADER + ",measured_iteration_time_s\n"
                    + "".join(f"{r},0.{i + 1}\n" for i, r in enumerate(ROWS)))
    return path


# --- 1. calibrate-nccl options: 0 is a value, bandwidths finite and > 0, a fit on its bounds ---

@pytest.mark.parametrize("value", [0, -8])
def test_calibrate_nccl_refuses_gpus_per_node_below_one(tmp_path, value):
    out = tmp_path / "cal.toml"
    r = run("calibrate-nccl", *NCCL_TABLES, "--gpu", "a100-sxm4-80gb", "--inter-node",
            "--gpus-per-node", value, "-o", out)
    refused(r, "--gpus-per-node", f"= {value} ", "from 1 to 1024")
    assert not out.exists()


def test_fit_tables_does_not_take_zero_gpus_per_node_for_not_given():
    tables = [read_table(f) for f in NCCL_TABLES]
    with pytest.raises(InputError) as e:
        fit_tables(tables, 25.0, gpus_per_node=0)
    assert e.value.key == "gpus_per_node"


@pytest.mark.parametrize("option, value", [("--inter-node-Gbps", "nan"), ("--inter-node-Gbps", "inf"),
                                           ("--inter-node-Gbps", "0"), ("--inter-node-Gbps", "-1"),
                                           ("--ranks", "1"), ("--ranks", "-3"), ("--ranks", "1000000000")])
def test_calibrate_nccl_refuses_bad_bandwidth_and_ranks(tmp_path, option, value):
    out = tmp_path / "cal.toml"
    r = run("calibrate-nccl", *NCCL_TABLES, "--gpu", "a100-sxm4-80gb", "--inter-node", option, value, "-o", out)
    refused(r, "command line", option)
    assert not out.exists()


def test_calibrate_nccl_refuses_a_fit_on_its_bounds_with_a_large_error(tmp_path):
    # A100 tables fitted with the V100's 150 GB/s NVLink: the busbw exceeds the link, the
    # efficiency is clipped at 1 and the fit is off by ~43 %
    out = tmp_path / "cal.toml"
    r = run("calibrate-nccl", *NCCL_TABLES, "--gpu", "v100-sxm2-32gb", "-o", out)
    refused(r, "MAPE", "efficiency at the allowed bound", "no calibration was written")
    assert not out.exists()


def test_calibrate_nccl_on_the_shipped_tables_still_fits(tmp_path):
    out = tmp_path / "cal.toml"
    r = run("calibrate-nccl", *NCCL_TABLES, "--gpu", "a100-sxm4-80gb", "-o", out)
    assert r.exit_code == 0, r.output
    from vtrain_fast.plan.spec import load_calibration
    assert load_calibration(out)["a100-sxm4-80gb"].intra_node_efficiency == pytest.approx(0.726, abs=0.01)


# --- 2. spec name: it becomes the folder results/<name> ---

@pytest.mark.parametrize("toml_name", ['"a\\u0000b"', '"a\\\\b"', '"' + "x" * 256 + '"', '"' + "\u00e9" * 128 + '"',
                                       '"tab\\there"'])
def test_spec_name_that_cannot_be_a_folder_name_is_refused(tmp_path, monkeypatch, toml_name):
    text = f"name = {toml_name}\n" + SPEC
    with pytest.raises(InputError) as e:
        parse_spec(text, "s.toml")
    assert e.value.key == "name"
    spec = tmp_path / "s.toml"
    spec.write_text(text, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    refused(run("sweep", spec, "--dry-run"), "name =", "255 bytes")
    assert not (tmp_path / "results").exists()


def test_spec_name_of_255_bytes_is_fine():
    assert parse_spec('name = "' + "x" * 255 + '"\n' + SPEC, "s.toml").name == "x" * 255


# --- 3. the same objective twice ---

@pytest.mark.parametrize("objectives", [("cost_usd", "cost_usd"), ("iter_s", "iteration_time_s"),
                                        ("cost_usd", "-cost_usd")])
def test_pareto_refuses_the_same_objective_twice(tiny_sweep, objectives):
    args = [a for o in objectives for a in ("--minimize", o)]
    text = refused(run("pareto", tiny_sweep, *args), "--minimize", "each column once")
    assert "Traceback" not in text
    with pytest.raises(InputError):
        resolve_objectives("command line", list(objectives))


# --- 4. -o that is not a calibration file ---

NOT_CALIBRATION = {
    "sweep spec": SPEC,
    "tables that are not GPU presets": '[model]\npresets = ["gpt3-125m"]\n',
    "keys that are not calibration parameters": "[a100-sxm4-80gb]\nnum_gpus = 8\n",
    "a top-level key": 'name = "x"\n',
}


@pytest.mark.parametrize("case", NOT_CALIBRATION)
def test_calibrate_o_refuses_a_toml_that_is_not_a_calibration_file(tmp_path, case):
    out = tmp_path / "spec.toml"
    out.write_text(NOT_CALIBRATION[case], encoding="utf-8")
    before = out.read_bytes()
    refused(run("calibrate", measurements(tmp_path), "--gpu", "a100-sxm4-80gb", "-o", out),
            "not a calibration file", "left unchanged")
    assert out.read_bytes() == before
    refused(run("calibrate-nccl", *NCCL_TABLES, "--gpu", "a100-sxm4-80gb", "-o", out), "not a calibration file")
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["meas.csv", "spec.toml"]


def test_calibrate_nccl_updates_an_existing_calibration_file(tmp_path):
    out = tmp_path / "cal.toml"
    out.write_text('[h100-sxm-80gb]\nhbm_efficiency = 0.9\n\n[meta."h100-sxm-80gb"]\nrows = 3\n')
    r = run("calibrate-nccl", *NCCL_TABLES, "--gpu", "a100-sxm4-80gb", "-o", out)
    assert r.exit_code == 0, r.output
    from vtrain_fast.plan.spec import load_calibration
    cal = load_calibration(out)
    assert cal["h100-sxm-80gb"].hbm_efficiency == 0.9 and "a100-sxm4-80gb" in cal


# --- 5. nested Parquet columns ---

@pytest.mark.parametrize("column", ["tags", "tp", "info"])
def test_evaluate_refuses_list_and_struct_parquet_columns(tmp_path, column):
    df = pl.read_csv((HEADER + "\n" + "\n".join(ROWS) + "\n").encode())
    if column == "tags":
        df = df.with_columns(pl.lit([1, 2]).alias("tags"))
    elif column == "tp":
        df = df.with_columns(pl.col("tp").map_elements(lambda v: [v], return_dtype=pl.List(pl.Int64)))
    else:
        df = df.with_columns(pl.struct(a=pl.lit(1)).alias("info"))
    src, out = tmp_path / "in.parquet", tmp_path / "out.parquet"
    df.write_parquet(src)
    refused(run("evaluate", src, "-o", out), f"column {column}", f"drop the column '{column}'")
    assert not out.exists()


# --- 6. input paths that are not regular files, or too large ---

def _fifo(tmp_path) -> Path:
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs here")
    path = tmp_path / "fifo.toml"
    os.mkfifo(path)
    return path


def test_spec_and_calibration_paths_must_be_regular_files(tmp_path):
    spec = tmp_path / "s.toml"
    spec.write_text(SPEC)
    folder = tmp_path / "folder.toml"
    folder.mkdir()
    fifo = _fifo(tmp_path)
    refused(run("sweep", folder, "--dry-run"), "(this is a folder)")
    refused(run("sweep", fifo, "--dry-run"), "(this is a FIFO (named pipe))")
    refused(run("sweep", spec, "--dry-run", "--calibration", fifo), "(this is a FIFO (named pipe))")
    if os.path.exists("/dev/zero"):
        refused(run("sweep", "/dev/zero", "--dry-run"), "(this is a device)")
        refused(run("sweep", spec, "--dry-run", "--calibration", "/dev/zero"), "(this is a device)")
        with pytest.raises(InputError, match="device"):
            read_table("/dev/zero", "all_reduce", 8)


def test_evaluate_and_calibrate_inputs_must_be_regular_files(tmp_path):
    fifo = _fifo(tmp_path)
    refused(run("evaluate", fifo, "-o", tmp_path / "o.parquet"), "(this is a FIFO (named pipe))")
    refused(run("calibrate", fifo, "--gpu", "a100-sxm4-80gb", "-o", tmp_path / "c.toml"), "FIFO")
    refused(run("calibrate-nccl", fifo, "--gpu", "a100-sxm4-80gb", "-o", tmp_path / "c.toml"), "FIFO")
    refused(run("calibrate-nccl", *NCCL_TABLES, "--gpu", "a100-sxm4-80gb", "-o", fifo), "FIFO")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo.toml"]


def test_oversized_inputs_are_refused_before_reading(tmp_path, monkeypatch):
    spec = tmp_path / "huge.toml"
    with open(spec, "wb") as f:                 # sparse: 17 MiB of nothing, no disk used
        f.truncate(17 * 2 ** 20)
    refused(run("sweep", spec, "--dry-run"), "file size", "16 MiB")
    import vtrain_fast.analysis.evaluate as ev
    monkeypatch.setattr(ev, "MAX_TABLE_BYTES", 100)
    csv = tmp_path / "in.csv"
    csv.write_text(HEADER + "\n" + "\n".join(ROWS) + "\n")
    refused(run("evaluate", csv, "-o", tmp_path / "o.parquet"), "file size", "at most 100 bytes")
    assert not (tmp_path / "o.parquet").exists()


# --- 7. the dry run checks the index space ---

def test_dry_run_refuses_a_grid_beyond_the_int64_index(tmp_path):
    many = lambda n: "[" + ", ".join(str(i) for i in range(1, n + 1)) + "]"  # noqa: E731
    spec = tmp_path / "huge.toml"
    spec.write_text(f"""
[model]
num_layers = [24]
hidden_size = [1024, 2048, 4096, 8192]
num_attention_heads = [16]
seq_length = [2048]
[training]
num_tokens = [{", ".join(f"{i}e9" for i in range(1, 1001))}]
global_batch_size = {many(1000)}
micro_batch_size = {many(1000)}
recompute = ["none", "full", "selective"]
[cluster]
gpu = "a100-sxm4-80gb"
num_gpus = {many(1000)}
[parallel]
tp = {many(1000)}
pp = {many(1000)}
""")        # 4 x 1000^6 x 3 = 1.2e19 points > 2^63 - 1
    for keep in ("all", "frontier"):
        refused(run("sweep", spec, "--dry-run", "--keep", keep, "-o", tmp_path / "out"),
                "number of points", "2^63 - 1")
    assert not (tmp_path / "out").exists()


# --- 8. reserved_GiB at or above the GPU's memory ---

@pytest.mark.parametrize("cluster, key", [
    ("reserved_GiB = 80.0", "cluster.reserved_GiB"),
    ("reserved_GiB = 6.0\n[cluster.a100-sxm4-80gb]\nreserved_GiB = 100.0", "cluster.a100-sxm4-80gb.reserved_GiB"),
])
def test_spec_reserved_memory_at_or_above_the_gpu_memory_is_refused(cluster, key):
    text = SPEC.replace("num_gpus = 8", "num_gpus = 8\n" + cluster)
    with pytest.raises(InputError) as e:
        parse_spec(text, "s.toml")
    assert e.value.key == key and "80 GiB of memory of a100-sxm4-80gb" in str(e.value)


def test_spec_reserved_memory_of_one_gpu_of_several():
    text = SPEC.replace('gpu = "a100-sxm4-80gb"', 'gpu = ["a100-sxm4-80gb", "a100-sxm4-40gb"]').replace(
        "num_gpus = 8", "num_gpus = 8\nreserved_GiB = 40.0\n[cluster.a100-sxm4-80gb]\nreserved_GiB = 40.0")
    with pytest.raises(InputError) as e:       # 40 is fine on the 80 GB GPU, not on the 40 GB one
        parse_spec(text, "s.toml")
    assert e.value.key == "cluster.reserved_GiB" and "a100-sxm4-40gb" in str(e.value)


def test_evaluate_reserved_memory_at_or_above_the_gpu_memory_is_refused(tmp_path):
    csv, out = tmp_path / "in.csv", tmp_path / "out.parquet"
    csv.write_text(HEADER + ",reserved_GiB\n" + ROWS[0] + ",\n" + ROWS[1].replace("80gb", "40gb") + ",40\n")
    refused(run("evaluate", csv, "-o", out), "column reserved_GiB, row 3", "40 GiB of memory of a100-sxm4-40gb")
    assert not out.exists()


# --- 9. semicolon and tab separators ---

@pytest.mark.parametrize("sep", [";", "\t"])
def test_evaluate_reads_semicolon_and_tab_separated_files(tmp_path, sep):
    comma, other = tmp_path / "comma.csv", tmp_path / "other.csv"
    comma.write_text(HEADER + "\n" + "\n".join(ROWS) + "\n")
    other.write_text((HEADER + "\n" + "\n".join(ROWS) + "\n").replace(",", sep))
    for src in (comma, other):
        r = run("evaluate", src, "-o", src.with_suffix(".parquet"))
        assert r.exit_code == 0, r.output
    a, b = (pl.read_parquet(p.with_suffix(".parquet")) for p in (comma, other))
    assert a.equals(b)


# --- 10. no message about a multiple of a negative number ---

def test_negative_gpus_per_node_is_refused_by_its_own_key(tmp_path):
    r = run("calibrate-nccl", *NCCL_TABLES, "--gpu", "a100-sxm4-80gb", "--inter-node",
            "--gpus-per-node", -8, "-o", tmp_path / "cal.toml")
    text = refused(r, "--gpus-per-node = -8")
    assert "multiple of -" not in text
    tables = [read_table(f) for f in NCCL_TABLES]
    with pytest.raises(InputError) as e:
        fit_tables(tables, 25.0, gpus_per_node=-8)
    assert e.value.key == "gpus_per_node" and "multiple of -" not in str(e.value)


@pytest.mark.parametrize("key, table, line", [
    ("num_attention_heads", "model", "num_attention_heads = -8"),
    ("num_query_groups", "model", "num_query_groups = -2"),
    ("tp", "parallel", "tp = -8"),
])
def test_negative_spec_values_are_refused_by_their_own_key(key, table, line):
    body = SPEC.replace('presets = ["gpt3-125m"]',
                        "num_layers = 24\nhidden_size = 2048\nnum_attention_heads = 16\nseq_length = 2048")
    if key == "num_query_groups":
        body = body.replace("seq_length = 2048", "seq_length = 2048\n" + line)
    elif key == "num_attention_heads":
        body = body.replace("num_attention_heads = 16", line)
    else:
        body = body.replace("tp = 1", line)
    with pytest.raises(InputError) as e:
        parse_spec(body, "s.toml")
    assert e.value.key == f"{table}.{key}" and "multiple of" not in str(e.value)


@pytest.mark.parametrize("column, value", [("num_attention_heads", -8), ("tp", -8), ("num_query_groups", -2)])
def test_negative_csv_values_are_refused_by_their_own_column(tmp_path, column, value):
    header = HEADER + ",num_query_groups"
    row = dict(zip(header.split(","), (ROWS[0] + ",").split(",")))
    row[column] = str(value)
    csv = tmp_path / "in.csv"
    csv.write_text(header + "\n" + ",".join(row.values()) + "\n")
    text = refused(run("evaluate", csv, "-o", tmp_path / "o.parquet"), f"column {column}, row 2")
    assert "multiple of" not in text
