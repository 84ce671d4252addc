"""Bad input: every case exits with status 2 and one message naming the file, the key or
column, and the offending value. Also :func:`vtrain_fast.analysis.query.pareto_mask` against brute force."""
from __future__ import annotations

import re

import numpy as np
import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st

from vtrain_fast.io.errors import InputError
from vtrain_fast.analysis.query import pareto_mask
from vtrain_fast.plan.spec import parse_spec

GOOD = {
    "model": 'presets = ["gpt3-125m"]',
    "training": 'num_tokens = [1e9]\nglobal_batch_size = [64]\nmicro_batch_size = [1, 2]\nrecompute = ["none"]',
    "cluster": 'gpu = ["a100-sxm4-80gb"]\nnum_gpus = [8]',
    "parallel": "tp = [1, 2]\npp = [1]",
}


def spec_text(drop=(), **tables) -> str:
    """A valid spec with some tables replaced (``tables``) or removed (``drop``)."""
    body = {**GOOD, **tables}
    return 'name = "bad"\n' + "\n".join(f"[{k}]\n{v}" for k, v in body.items() if k not in drop) + "\n"


def squash(text: str) -> str:
    """Remove all whitespace: rich wraps long messages at the terminal width, anywhere."""
    return re.sub(r"\s+", "", text)


def assert_input_error(result, *needles):
    assert result.exit_code == 2, (result.exit_code, result.output)
    out = squash(result.output)
    assert "error:" in out and ("isnotallowed" in out or "ismissing;wanted" in out), result.output
    for n in needles:
        assert squash(str(n)) in out, f"{n!r} not in {result.output!r}"


SPEC_CASES = {
    "TP overlap without sequence parallelism": (
        spec_text(training=GOOD["training"] + "\ntp_comm_overlap = true"),
        ["training.tp_comm_overlap", "sequence_parallel = true", "--tp-comm-overlap needs --sequence-parallel"]),
    "unknown key": (spec_text(parallel="tp = [1]\npp = [1]\nsp = [2]"), ["parallel.sp", "2"]),
    "unknown top-level key": ('colour = "red"\n' + spec_text(), ["colour", "'red'"]),
    "wrong type": (spec_text(parallel='tp = ["two"]\npp = [1]'), ["tp", "'two'"]),
    "float for int": (spec_text(parallel="tp = [1.5]\npp = [1]"), ["tp", "1.5"]),
    "bool for int": (spec_text(parallel="tp = [true]\npp = [1]"), ["parallel.tp", "true"]),
    "misspelt key gets a suggestion": (spec_text(training=GOOD["training"] + '\nrecompte = ["full"]'),
                                       ["training.recompte", "did you mean 'recompute'"]),
    "zero micro-batch names the table and range": (spec_text(training=GOOD["training"].replace("[1, 2]", "[0]")),
                                                   ["training.micro_batch_size", "from 1 to"]),
    "flag as a string": (spec_text(training=GOOD["training"] + '\nuse_flash_attn = "true"'),
                         ["training.use_flash_attn", "without quotes"]),
    "recompute near miss": (spec_text(training=GOOD["training"].replace('["none"]', '["Selective"]')),
                            ["training.recompute", "did you mean 'selective'"]),
    "tokens with a suffix": (spec_text(training=GOOD["training"].replace("[1e9]", '"15T"')),
                             ["training.num_tokens", "1.5e13"]),
    "out of range": (spec_text(parallel="tp = [0]\npp = [1]"), ["tp", "= 0"]),
    "negative tokens": (spec_text(training="num_tokens = [-5]\nglobal_batch_size = [64]\nmicro_batch_size = [1]"),
                        ["training.num_tokens", "-5"]),
    "empty list": (spec_text(parallel="tp = []\npp = [1]"), ["tp", "[]"]),
    "unknown gpu preset": (spec_text(cluster='gpu = ["b300-imaginary"]\nnum_gpus = [8]'),
                           ["cluster.gpu", "'b300-imaginary'", "a100-sxm4-80gb"]),
    "unknown model preset": (spec_text(model='presets = ["gpt5-imaginary"]'),
                             ["model.presets", "'gpt5-imaginary'", "gpt3-175b"]),
    "malformed toml": ("name = \"bad\"\n[model\npresets = 1\n", ["TOML"]),
    "missing table": (spec_text(drop=("parallel",)), ["[parallel]"]),
    "missing key": (spec_text(training="num_tokens = [1e9]\nglobal_batch_size = [64]"),
                    ["training.micro_batch_size"]),
    "both num_gpus and num_nodes": (spec_text(cluster='gpu = ["a100-sxm4-80gb"]\nnum_gpus = [8]\nnum_nodes = [1]'),
                                    ["num_gpus", "num_nodes"]),
    "neither num_gpus nor num_nodes": (spec_text(cluster='gpu = ["a100-sxm4-80gb"]'),
                                       ["num_gpus", "num_nodes"]),
    "table is a value": (spec_text(drop=("model",)).replace('name = "bad"\n', 'name = "bad"\nmodel = 3\n'),
                         ["model", "3"]),
    "override out of range": (spec_text(cluster='gpu = ["a100-sxm4-80gb"]\nnum_gpus = [8]\npue = 0.5'),
                              ["cluster.pue", "0.5"]),
    "chunk size": (spec_text() + "[output]\nchunk_size = 0\n", ["output.chunk_size", "0"]),
    "bad name": (spec_text().replace('name = "bad"', 'name = "../x"'), ["name", "'../x'"]),
}


@pytest.mark.parametrize("case", sorted(SPEC_CASES))
def test_bad_spec_exits_2_naming_file_key_value(case, tmp_path, cli):
    text, needles = SPEC_CASES[case]
    path = tmp_path / "spec.toml"
    path.write_text(text)
    res = cli("sweep", path, "-o", tmp_path / "out")
    assert_input_error(res, str(path), *needles)
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_good_spec_text_is_valid():
    """The base of the bad-spec cases parses, so each case fails for its own reason."""
    assert parse_spec(spec_text()).num_points == 4


def test_missing_spec_file(tmp_path, cli):
    missing = tmp_path / "nope.toml"
    assert_input_error(cli("sweep", missing), str(missing))


# ------------------------------------------------------------------------------ CSV
HEADER = "num_layers,hidden_size,num_attention_heads,seq_length,global_batch_size,micro_batch_size,tp,pp,dp,gpu"
ROW = "12,768,12,2048,64,2,1,1,8,a100-sxm4-80gb"

CSV_CASES = {
    "missing column": (HEADER.replace(",dp", "") + "\n" + ROW.replace(",1,1,8,", ",1,1,") + "\n", ["columns", "dp"]),
    "non-integer value": (HEADER + "\n" + ROW + "\n" + ROW.replace("12,768", "12,76.5") + "\n",
                          ["column hidden_size, row 3", "76.5"]),
    "text for integer": (HEADER + "\n" + ROW.replace(",2,1,1,8,", ",two,1,1,8,") + "\n",
                         ["column micro_batch_size, row 2", "two"]),
    "zero": (HEADER + "\n" + ROW.replace(",1,1,8,", ",0,1,8,") + "\n", ["column tp, row 2", "0"]),
    "unknown gpu": (HEADER + "\n" + ROW + "\n" + ROW.replace("a100-sxm4-80gb", "tpu-v9") + "\n",
                    ["column gpu, row 3", "tpu-v9"]),
    "unknown recompute": (HEADER + ",recompute\n" + ROW + ",partial\n", ["column recompute, row 2", "partial"]),
    "bad override": (HEADER + ",inter_node_Gbps\n" + ROW + ",-3\n", ["column inter_node_Gbps, row 2", "-3"]),
    "bad tokens": (HEADER + ",num_tokens\n" + ROW + ",lots\n", ["column num_tokens, row 2", "lots"]),
    # near misses of input columns would silently take the defaults
    "misspelled recompute": (HEADER + ",recomputation\n" + ROW + ",full\n", ["'recomputation'", "recompute"]),
    "Hugging Face name for query groups": (HEADER + ",num_key_value_heads\n" + ROW + ",8\n",
                                           ["'num_key_value_heads'", "num_query_groups"]),
    "Megatron name for virtual stages": (HEADER + ",num_layers_per_virtual_pipeline_stage\n" + ROW + ",2\n",
                                         ["num_layers_per_virtual_pipeline_stage", "vpp = num_layers / (pp x"]),
    "misspelled num_tokens": (HEADER + ",num_token\n" + ROW + ",1e12\n", ["'num_token'", "num_tokens"]),
    # Megatron settings the model does not have would be priced as absent
    # Megatron's name of a modelled column: refused as a misspelling, naming the column to use
    "context parallelism": (HEADER + ",context_parallel_size\n" + ROW + ",2\n",
                            ["'context_parallel_size'", "rename the column", "'cp'"]),
    "expert parallelism": (HEADER + ",expert_model_parallel_size\n" + ROW + ",2\n",
                           ["'expert_model_parallel_size'", "rename the column", "'ep'"]),
    "expert tensor parallelism": (HEADER + ",expert_tensor_parallel_size\n" + ROW + ",1\n",
                                  ["'expert_tensor_parallel_size'", "rename the column", "'etp'"]),
    "Megatron bf16 flag": (HEADER + ",bf16\n" + ROW + ",true\n", ["'bf16'", "precision = bf16"]),
    "TP overlap without sequence parallelism": (HEADER + ",tp_comm_overlap\n" + ROW + ",true\n",
                                                ["column tp_comm_overlap", "sequence_parallel = true",
                                                 "--tp-comm-overlap needs --sequence-parallel"]),
    "capitalised column": (HEADER + ",Recompute\n" + ROW + ",full\n", ["'Recompute'", "recompute"]),
    "spaced column": (HEADER + ",Num Tokens\n" + ROW + ",1e12\n", ["'Num Tokens'", "num_tokens"]),
    "misspelled required column": (HEADER.replace("seq_length", "seq_len") + "\n" + ROW + "\n",
                                   ["'seq_len'", "seq_length"]),
    "misspelled gpu count": (HEADER + ",num_gpu\n" + ROW + ",8\n", ["'num_gpu'", "num_gpus"]),
    # num_gpus / num_nodes are checked against tp x pp x dp, not passed through unchecked
    "num_gpus not tp x pp x dp": (HEADER + ",num_gpus\n" + ROW + ",16\n", ["column num_gpus, row 2", "16", "8"]),
    "num_nodes not ceil(num_gpus / gpus_per_node)": (HEADER + ",gpus_per_node,num_nodes\n" + ROW + ",4,1\n",
                                                     ["column num_nodes, row 2", "1", "2"]),
    "more GPUs than a spec allows": (HEADER + "\n" + ROW.replace(",1,1,8,", ",1000,1000,1000,") + "\n",
                                     ["row 2", "1000000000", "100000000"]),
}


@pytest.mark.parametrize("case", sorted(CSV_CASES))
def test_bad_csv_exits_2_naming_file_column_value(case, tmp_path, cli):
    text, needles = CSV_CASES[case]
    csv = tmp_path / "configs.csv"
    csv.write_text(text)
    out = tmp_path / "out.parquet"
    res = cli("evaluate", csv, "-o", out)
    assert_input_error(res, str(csv), *needles)
    assert not out.exists()


def test_csv_base_row_is_valid(tmp_path, cli):
    csv = tmp_path / "configs.csv"
    csv.write_text(HEADER + "\n" + ROW + "\n")
    assert cli("evaluate", csv, "-o", tmp_path / "out.parquet").exit_code == 0


def test_csv_label_columns_pass_through(tmp_path, cli):
    """Columns that are not near an input column are labels: kept unchanged in the output, even
    one near an input column that the file also has (gpus next to gpu)."""
    labels = {"name": "run-a", "model": "mine", "notes": "x", "id": 7, "gpus": 8, "owner": "me",
              "params_billion": 0.1, "measured_iteration_time_s": 1.5, "set": "single", "num_params": 3}
    csv = tmp_path / "configs.csv"
    csv.write_text(HEADER + "," + ",".join(labels) + "\n" + ROW + "," + ",".join(map(str, labels.values())) + "\n")
    out = tmp_path / "out.parquet"
    res = cli("evaluate", csv, "-o", out)
    assert res.exit_code == 0, res.output
    df = pl.read_parquet(out)
    assert {k: df[k][0] for k in labels} == labels


def test_missing_csv(tmp_path, cli):
    missing = tmp_path / "nope.csv"
    assert_input_error(cli("evaluate", missing, "-o", tmp_path / "o.parquet"), str(missing))


# ------------------------------------------------------------------------------ folders
def test_pareto_on_interrupted_sweep(tmp_path, cli):
    folder = tmp_path / "interrupted"
    folder.mkdir()
    (folder / "part-000000.parquet.tmp").write_bytes(b"PAR1 partial")
    assert_input_error(cli("pareto", folder), str(folder), "manifest.json")


def test_pareto_on_incomplete_manifest(tmp_path, cli):
    folder = tmp_path / "running"
    folder.mkdir()
    (folder / "manifest.json").write_text('{"complete": false, "parts": []}')
    assert_input_error(cli("pareto", folder), "complete", "false")


def test_pareto_on_missing_folder(tmp_path, cli):
    missing = tmp_path / "never-written"
    assert_input_error(cli("pareto", missing), str(missing), "results folder")


def test_pareto_unknown_objective(tiny_sweep, cli):
    assert_input_error(cli("pareto", tiny_sweep, "--minimize", "happiness"), "--minimize", "happiness")


@pytest.mark.parametrize("top", ["0", "-3"])
def test_pareto_top_must_be_positive(tiny_sweep, cli, top):
    assert_input_error(cli("pareto", tiny_sweep, "--top", top), "--top", top)
    assert_input_error(cli("pareto", tiny_sweep, "--by", "gpu", "--top", top), "--top", top)


def test_sweep_into_non_empty_folder_without_overwrite(tiny_spec_path, tmp_path, cli):
    out = tmp_path / "occupied"
    out.mkdir()
    (out / "notes.txt").write_text("not a sweep")
    # a folder of other files is never made a results folder: --overwrite would not help, so it is not offered
    res = cli("sweep", tiny_spec_path, "-o", out)
    assert_input_error(res, str(out), "notes.txt, which `sweep` did not write")
    assert "--overwrite" not in res.output
    assert (out / "notes.txt").read_text() == "not a sweep"
    assert not (out / "manifest.json").exists()


def test_input_error_message_format():
    e = InputError("f.toml", "parallel.tp", 0, "integers from 1 to 9", "write tp >= 1")
    assert str(e) == ("f.toml: parallel.tp = 0 is not allowed; allowed: integers from 1 to 9. "
                      "Fix: write tp >= 1")


# ------------------------------------------------------------------------------ pareto_mask
def brute_force_mask(values: np.ndarray) -> np.ndarray:
    """Row i is kept iff it has no NaN, no other NaN-free row dominates it, and no earlier
    NaN-free row has identical objectives."""
    n = values.shape[0]
    ok = ~np.isnan(values).any(axis=1)
    keep = np.zeros(n, dtype=bool)
    for i in range(n):
        if not ok[i]:
            continue
        keep[i] = True
        for j in range(n):
            if j == i or not ok[j]:
                continue
            le = (values[j] <= values[i]).all()
            lt = (values[j] < values[i]).any()
            if (le and lt) or (le and not lt and j < i):
                keep[i] = False
                break
    return keep


@st.composite
def objective_matrix(draw, k):
    n = draw(st.integers(0, 40))
    # few distinct values -> many ties; NaN and infinities sprinkled in
    pool = draw(st.lists(st.floats(-5, 5, allow_nan=False), min_size=1, max_size=6))
    pool += [np.nan, np.inf, -np.inf][:draw(st.integers(0, 3))]
    cells = draw(st.lists(st.sampled_from(pool), min_size=n * k, max_size=n * k))
    return np.array(cells, dtype=np.float64).reshape(n, k)


@pytest.mark.parametrize("k", [1, 2, 3])
@given(data=st.data())
def test_pareto_mask_matches_brute_force(k, data):
    values = data.draw(objective_matrix(k))
    np.testing.assert_array_equal(pareto_mask(values), brute_force_mask(values))


@pytest.mark.parametrize("k", [2, 3])
def test_pareto_mask_random_continuous(k):
    rng = np.random.default_rng(k)
    values = rng.normal(size=(300, k))
    values[rng.random(300) < 0.05, rng.integers(k)] = np.nan
    values[::17] = values[::17].round(0)                     # some exact ties
    mask = pareto_mask(values)
    np.testing.assert_array_equal(mask, brute_force_mask(values))
    assert mask.sum() >= 2
