"""Input limits and odd-but-valid inputs found by adversarial review (exit 2, one message)."""
from __future__ import annotations


import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from conftest import ONE_POINT_SPEC
from vtrain_fast.cli import app
from vtrain_fast.io.errors import InputError
from vtrain_fast.analysis.evaluate import evaluate_frame
from vtrain_fast.analysis.nccl import read_table

HEADER = "num_layers,hidden_size,num_attention_heads,seq_length,global_batch_size,micro_batch_size,tp,pp,dp,gpu"
GOOD = "24,2048,16,2048,512,1,2,2,4,a100-sxm4-80gb"


def run(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.mark.parametrize("row, column", [
    ("24,2048,16,2048,4294967296,4294967296,1,1,4294967296,a100-sxm4-80gb", "global_batch_size"),
    ("24,2048,16,2048,512,1,2,2,99999999999999999999,a100-sxm4-80gb", "dp"),
    ("24,2048,16,2048,512,1,2,2,1e300,a100-sxm4-80gb", "dp"),
    ("24,2048,16,2048,512,1,true,2,4,a100-sxm4-80gb", "tp"),
    ("24,2048,16,2048,512,1.5,2,2,4,a100-sxm4-80gb", "micro_batch_size"),
])
def test_evaluate_rejects_out_of_range_integers(tmp_path, row, column):
    csv = tmp_path / "in.csv"
    csv.write_text(HEADER + "\n" + row + "\n")
    r = run("evaluate", csv, "-o", tmp_path / "out.parquet")
    assert r.exit_code == 2, r.output
    assert column in r.output and "row 2" in r.output
    assert not (tmp_path / "out.parquet").exists()


def test_evaluate_rejects_header_only_and_duplicates_and_sets_output_names_aside(tmp_path):
    for text, needle in ((HEADER + "\n", "rows"), (HEADER + ",gpu\n" + GOOD + ",a100-sxm4-80gb\n", "duplicated")):
        csv = tmp_path / "in.csv"
        csv.write_text(text)
        r = run("evaluate", csv, "-o", tmp_path / "out.parquet")
        assert r.exit_code == 2 and needle in r.output, r.output
    # an output column (a result of vtrain-fast) is set aside with a note and recomputed, never read
    csv.write_text(HEADER + ",mfu\n" + GOOD + ",0.5\n")
    r = run("evaluate", csv, "-o", tmp_path / "out.parquet")
    assert r.exit_code == 0 and "holds earlier results" in " ".join(r.output.split()), r.output
    assert pl.read_parquet(tmp_path / "out.parquet")["mfu"][0] != 0.5


def test_evaluate_output_to_a_folder_is_a_clear_error(tmp_path):
    csv = tmp_path / "in.csv"
    csv.write_text(HEADER + "\n" + GOOD + "\n")
    r = run("evaluate", csv, "-o", tmp_path)
    assert r.exit_code == 2 and "folder" in r.output
    assert not list(tmp_path.glob("*.tmp"))


def test_evaluate_keeps_row_order_and_values_of_valid_rows():
    df = pl.DataFrame({"num_layers": [24, 12, 24], "hidden_size": [2048, 1024, 2048],
                       "num_attention_heads": [16, 16, 16], "seq_length": [2048] * 3,
                       "global_batch_size": [512, 64, 512], "micro_batch_size": [1, 2, 1],
                       "tp": [2, 1, 2], "pp": [2, 1, 2], "dp": [4, 8, 4], "gpu": ["a100-sxm4-80gb"] * 3})
    out = evaluate_frame(df)
    assert out["iteration_time_s"][0] == out["iteration_time_s"][2] != out["iteration_time_s"][1]
    assert out["num_layers"].to_list() == [24, 12, 24]


def test_spec_that_is_not_utf8_or_has_a_bom(tmp_path, ):
    spec = tmp_path / "s.toml"
    spec.write_bytes(b"\xff\xfe\x00garbage")
    r = run("sweep", spec, "-o", tmp_path / "o")
    assert r.exit_code == 2 and "UTF-8" in r.output
    spec.write_text("\ufeff" + ONE_POINT_SPEC.format(training=""), encoding="utf-8")
    r = run("sweep", spec, "-o", tmp_path / "o2")
    assert r.exit_code == 0, r.output


OLD_FORMAT = """# nThread 1 nGpus 8 minBytes 1048576 maxBytes 1073741824
#                                                     out-of-place                       in-place
#       size         count    type   redop     time   algbw   busbw  error     time   algbw   busbw  error
#        (B)    (elements)                     (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
{rows}
"""


def test_nccl_reader_uses_the_header_and_skips_bad_rows(tmp_path):
    rows = []
    for size in 2 ** np.arange(20, 31):
        t_us = 20.0 + size / 150e3
        rows.append(f"  {size:>10d} {size // 4:>12d}   float     sum  {t_us:8.1f}  {size / t_us / 1e3:6.2f}  1.00  0e+00  {t_us:8.1f}  1.0  1.0  0e+00")
    rows.append(f"  {2 ** 31:>10d} {2 ** 29:>12d}   float     sum  0.00  0.00  0.00  0e+00  0.0  0.0  0.0  0e+00")
    rows.append(f"  {2 ** 32:>10d} {2 ** 30:>12d}   float     sum  n/a  0.00  0.00  0e+00  0.0  0.0  0.0  0e+00")
    path = tmp_path / "all_reduce_perf_8gpu.txt"
    path.write_text(OLD_FORMAT.format(rows="\n".join(rows)))
    t = read_table(path)
    assert t.n == 8 and len(t.size_bytes) == len(t.time_s) == 11
    np.testing.assert_allclose(t.time_s * 1e6, 20.0 + t.size_bytes / 150e3, rtol=1e-3)


def test_calibrate_refuses_rows_the_model_cannot_evaluate(tmp_path):
    from vtrain_fast.analysis.calibrate import fit
    df = pl.DataFrame({"num_layers": [24] * 8, "hidden_size": [2048] * 8, "num_attention_heads": [3] * 8,
                       "seq_length": [1024] * 8, "global_batch_size": [8] * 8, "micro_batch_size": [1] * 8,
                       "tp": [1] * 8, "pp": [1] * 8, "dp": [1] * 8, "gpu": ["a100-sxm4-80gb"] * 8,
                       "measured_iteration_time_s": [0.5] * 8})
    with pytest.raises(InputError, match="bad_heads"):
        fit(df, "a100-sxm4-80gb", ("gemm_efficiency",))
