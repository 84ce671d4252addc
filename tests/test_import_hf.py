"""`vtrain-fast import-hf`: Hugging Face config.json -> a model file a spec reads (model_files).

The fixtures in tests/data/hf/ are the published configs (README there names each repository).
Parameter counts are checked twice: the checkpoint's own count, recomputed here from the config
with the Hugging Face architecture (an independent formula, no vtrain_fast code), must be the
published one, and the imported shape as the cost model counts it must lie within 1 % of it."""
from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from conftest import SMALL_SWEEP, flat
from vtrain_fast.cli import shape_params
from vtrain_fast.io.errors import InputError
from vtrain_fast.plan.hf import ARCHITECTURES, FEATURES, model_file_text, shape_from_config
from vtrain_fast.plan.models import MODEL_PRESETS, models_from_tables
from vtrain_fast.plan.spec import parse_spec

HF = Path(__file__).parent / "data" / "hf"


def config(name: str, **changes) -> dict:
    """The fixture ``name`` parsed, with keys changed (``None`` removes a key)."""
    cfg = json.loads((HF / f"{name}.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    return cfg


def write_config(tmp_path: Path, cfg: dict, name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(cfg))
    return path


def hf_params(cfg: dict) -> int:
    """Parameters of the Hugging Face checkpoint of ``cfg``, from its architecture: Llama-style
    (RMSNorm weights, no biases but Qwen2's q/k/v ones, Qwen3's per-head q/k norms), GPT-2 and
    GPT-NeoX (LayerNorm weight and bias, biases everywhere); tied embeddings counted once."""
    mt = cfg["model_type"]
    if mt == "gpt2":
        L, h, v, s = cfg["n_layer"], cfg["n_embd"], cfg["vocab_size"], cfg["n_positions"]
        f = cfg.get("n_inner") or 4 * h
        layer = 2 * h + (3 * h * h + 3 * h) + (h * h + h) + 2 * h + (h * f + f) + (f * h + h)
        return v * h + s * h + L * layer + 2 * h            # wte (tied head), wpe, layers, ln_f
    L, h, a, v = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"], cfg["vocab_size"]
    f = cfg["intermediate_size"]
    tied = cfg.get("tie_word_embeddings", mt in ("gemma", "gemma2"))
    if mt == "gpt_neox":
        layer = 4 * h + (3 * h * h + 3 * h) + (h * h + h) + (h * f + f) + (f * h + h)
        return v * h * (1 if tied else 2) + L * layer + 2 * h
    g = cfg.get("num_key_value_heads") or a
    d = cfg.get("head_dim") or h // a
    attn = h * a * d + 2 * h * g * d + a * d * h + ((a + 2 * g) * d if mt == "qwen2" else 0)
    layer = attn + 3 * h * f + 2 * h + (2 * d if mt == "qwen3" else 0)
    return v * h * (1 if tied else 2) + L * layer + h


# fixture -> (the published parameter count, --seq-length for the import or None). The counts are
# those of the checkpoints (the safetensors index's total / the model cards' 8.03B, 6.74B, ...).
PUBLISHED = {
    "llama-3-8b": (8_030_261_248, None),
    "llama-2-7b": (6_738_415_616, None),
    "mistral-7b-v0.1": (7_241_732_096, 4096),     # its sliding window (4096) must cover the context
    "qwen2-7b": (7_615_616_512, 4096),            # max_position_embeddings 131072: see the next test
    "gpt2": (124_439_808, None),
    "gpt-neox-20b": (20_554_567_680, None),
    "gemma-2b": (2_506_172_416, None),
    "gemma-7b": (8_537_680_896, None),            # head_dim 256, not 3072 / 16: kv_channels = 256
}


def imported(name: str, seq_length=None, **changes):
    table, notes = shape_from_config(config(name, **changes), str(HF / f"{name}.json"), seq_length)
    return models_from_tables({name: table}, name)[name], table, notes


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_the_fixtures_are_the_published_checkpoints(name):
    """The fixtures are transcribed right: the architecture's count of each is the published one."""
    assert hf_params(config(name)) == PUBLISHED[name][0]


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_the_imported_shape_has_the_published_parameters(name):
    """The imported flags (normalization, position embedding, biases, tied or untied head) give the
    checkpoints' counts: exactly for most; Qwen2's q/k/v-only biases are not counted (0.01 %)."""
    published, seq = PUBLISHED[name]
    shape, _, notes = imported(name, seq)
    assert shape_params(shape) == pytest.approx(published, rel=2e-4)
    if name != "qwen2-7b":
        assert shape_params(shape) == published
    assert not any("separate output layer" in n for n in notes)


def test_gpt2_is_the_gpt_layer_of_the_model_exactly():
    """GPT-2 is Megatron-LM's GPT layer (learned positions, LayerNorm, biases, a tied output layer):
    every flag at its default, and the count is exact."""
    shape, table, _ = imported("gpt2")
    assert shape_params(shape) == 124_439_808
    assert (table["position_embedding_type"], table["normalization"], table["add_bias_linear"],
            table["untie_embeddings_and_output_weights"]) == ("learned_absolute", "LayerNorm", True, False)
    assert (table["ffn_hidden_size"], table["gated_mlp"], table["seq_length"]) == (3072, False, 1024)
    for n_inner, ffn in ((None, 3072), (1000, 1000)):          # null as written by transformers; a width
        table = shape_from_config({**config("gpt2"), "n_inner": n_inner}, "gpt2.json")[0]
        assert table["ffn_hidden_size"] == ffn


def test_gated_mlps_keep_intermediate_size_and_say_gated():
    """The slip the importer prevents: a Hugging Face intermediate_size typed into ffn_hidden_size
    without gated_mlp gives Llama 2 7B 5.3 B parameters (two h x f matrices instead of three)."""
    shape, table, _ = imported("llama-2-7b")
    assert table["ffn_hidden_size"] == 11008 and table["gated_mlp"] is True
    assert shape == MODEL_PRESETS["llama2-7b"].__class__(**{**vars(MODEL_PRESETS["llama2-7b"]),
                                                            "name": shape.name, "source": shape.source})
    ungated = models_from_tables({"x": {**table, "gated_mlp": False}}, "x")["x"]
    assert shape_params(ungated) / 1e9 == pytest.approx(5.30, abs=0.01)
    for name in ("llama-3-8b", "mistral-7b-v0.1", "qwen2-7b", "gemma-2b"):
        assert imported(name, 4096)[1]["gated_mlp"] is True, name
    for name in ("gpt2", "gpt-neox-20b"):
        assert imported(name)[1]["gated_mlp"] is False, name


def test_llama_3_8b_maps_every_key():
    _, table, notes = imported("llama-3-8b")
    assert {k: v for k, v in table.items() if k != "source"} == dict(
        num_layers=32, hidden_size=4096, num_attention_heads=32, num_query_groups=8, ffn_hidden_size=14336,
        gated_mlp=True, vocab_size=128256, seq_length=8192, normalization="RMSNorm", position_embedding_type="rope",
        add_bias_linear=False, untie_embeddings_and_output_weights=True)
    assert "llama-3-8b.json" in table["source"] and "model_type llama" in table["source"]
    text = " ".join(notes)
    for needle in ("max_position_embeddings", "--seq-length"):
        assert needle in text, needle
    for gone in ("RoPE", "RMSNorm", "no biases"):        # written as flags, no longer noted
        assert gone not in text, gone
    assert "separate output layer" not in text        # tie_word_embeddings = false: as the model has it


def test_seq_length_comes_from_the_option_else_max_position_embeddings_with_a_note():
    _, table, notes = imported("qwen2-7b")
    assert table["seq_length"] == 131072
    seq_note = next(n for n in notes if "seq_length = 131072" in n)
    assert "--seq-length" in seq_note and "pre-trained at 8192" in seq_note
    _, table, notes = imported("qwen2-7b", 4096)
    assert table["seq_length"] == 4096 and not any("seq_length = " in n for n in notes)
    llama31 = config("llama-3-8b", max_position_embeddings=131072, rope_scaling={
        "factor": 8.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"})
    notes = shape_from_config(llama31, "llama31.json")[1]
    assert any("original_max_position_embeddings is 8192" in n for n in notes)


def test_what_each_family_differs_in_is_noted():
    def notes(name, seq=None, **changes):
        return " | ".join(imported(name, seq, **changes)[2])
    assert "biases on the query, key and value projections only" in notes("qwen2-7b", 4096)
    assert "use_parallel_residual = true" in notes("gpt-neox-20b")
    assert "use_parallel_residual" not in notes("gpt-neox-20b", use_parallel_residual=False)
    gemma = notes("gemma-2b")
    assert "activation gelu (gated)" in gemma and "SwiGLU" in gemma
    assert imported("gemma-2b")[1]["untie_embeddings_and_output_weights"] is False   # Gemma's default: tied
    assert "activation" not in notes("llama-3-8b") and "activation" not in notes("gpt2")   # SiLU / GeLU as modelled
    gpt2 = notes("gpt2")
    assert "ffn_hidden_size = 4 x n_embd = 3072" in gpt2
    assert "RoPE" not in gpt2 and "RMSNorm" not in gpt2 and "biases" not in gpt2
    assert "num_query_groups = num_attention_heads = 32" in notes("llama-2-7b", num_key_value_heads=None)
    qwen3 = dict(config("llama-3-8b"), model_type="qwen3", head_dim=128)
    assert any("q_norm, k_norm" in n for n in shape_from_config(qwen3, "qwen3.json")[1])
    # Qwen3 dense: heads of head_dim channels, not hidden_size / heads (Qwen3-4B: 2560 / 32 = 80, head_dim 128)
    qwen3_4b = dict(config("llama-3-8b"), model_type="qwen3", hidden_size=2560, num_attention_heads=32,
                    num_key_value_heads=8, head_dim=128)
    assert shape_from_config(qwen3_4b, "qwen3.json")[0]["kv_channels"] == 128
    assert "kv_channels" not in shape_from_config(qwen3, "qwen3.json")[0]      # 4096 / 32 = 128: the default


def test_every_feature_is_one_row_that_can_be_written_instead_of_noted(monkeypatch):
    """A field the model gains is a one-line change: its row's written=True puts the value in the
    table and drops the note."""
    import dataclasses

    import vtrain_fast.plan.hf as hf
    names = [f.name for f in FEATURES]
    assert len(names) == len(set(names))
    rows = tuple(dataclasses.replace(f, written=True) if f.name == "normalization" else f for f in FEATURES)
    monkeypatch.setattr(hf, "FEATURES", rows)
    table, notes = hf.shape_from_config(config("llama-3-8b"), "llama.json")
    assert table["normalization"] == "RMSNorm" and not any("RMSNorm" in n for n in notes)


@pytest.mark.parametrize("name,changes,key,value", [
    ("gemma-7b", {"head_dim": 256.5}, "head_dim", "256.5"),        # a head width is a whole number
    ("llama-3-8b", {"kv_channels": True}, "kv_channels", "true"),
    ("llama-3-8b", {"num_local_experts": 8}, "num_local_experts", "8"),     # experts in a dense family
    ("llama-3-8b", {"num_experts": 64}, "num_experts", "64"),
    ("llama-3-8b", {"n_routed_experts": 64}, "n_routed_experts", "64"),
    ("llama-3-8b", {"moe_intermediate_size": 1408}, "moe_intermediate_size", "1408"),
    ("mistral-7b-v0.1", {}, "sliding_window", "4096"),
    ("qwen2-7b", {"use_sliding_window": True, "sliding_window": 4096}, "sliding_window", "4096"),
    ("llama-3-8b", {"model_type": "falcon"}, "model_type", "'falcon'"),
    ("llama-3-8b", {"model_type": None}, "model_type", None),
    ("llama-3-8b", {"intermediate_size": None}, "intermediate_size", None),
    ("gpt2", {"n_layer": None}, "n_layer", None),
    ("llama-3-8b", {"hidden_size": 4096.0}, "hidden_size", "4096.0"),
    ("llama-3-8b", {"num_hidden_layers": "32"}, "num_hidden_layers", "'32'"),
    ("llama-3-8b", {"vocab_size": True}, "vocab_size", "true"),
    ("llama-3-8b", {"num_attention_heads": 30}, "num_attention_heads", "30"),
    ("llama-3-8b", {"num_key_value_heads": 7}, "num_key_value_heads", "7"),
    ("gpt2", {"add_cross_attention": True}, "add_cross_attention", "true"),
])
def test_what_the_model_cannot_express_is_refused_naming_the_key(name, changes, key, value, tmp_path, cli):
    path = write_config(tmp_path, config(name, **changes), f"{name}.json")
    res = cli("import-hf", path)
    out = flat(res.output)
    assert res.exit_code == 2, res.output
    assert out.startswith(f"error: {path}: {key}"), out
    assert (f"{key} is missing" if value is None else f"{key} = {value} is not allowed") in out, out
    assert "allowed:" in out or "wanted:" in out
    assert "Fix:" in out and "Traceback" not in out and "[models." not in out


def test_refusals_say_what_is_allowed_and_how_to_go_on(tmp_path, cli):
    out = flat(cli("import-hf", write_config(tmp_path, config("llama-3-8b", num_local_experts=8))).output)
    assert "its family has no experts" in out and "mixtral, qwen3_moe, deepseek_v3 or gpt_oss" in out
    out = flat(cli("import-hf", write_config(tmp_path, config("gemma-7b", head_dim=0.5))).output)
    assert "head_dim = 0.5" in out and "kv_channels" in out
    out = flat(cli("import-hf", HF / "mistral-7b-v0.1.json").output)
    assert "at least seq_length (32768)" in out and "--seq-length 4096" in out
    out = flat(cli("import-hf", write_config(tmp_path, config("llama-3-8b", model_type="lama"))).output)
    assert all(t in out for t in ARCHITECTURES) and "did you mean 'llama'?" in out
    res = cli("import-hf", HF / "mistral-7b-v0.1.json", "--seq-length", 4096)     # the window covers it
    assert res.exit_code == 0 and "seq_length = 4096" in res.output


def test_bad_files_are_refused_as_input_files(tmp_path, cli):
    for path, needle in ((tmp_path / "none.json", "cannot be opened"), (tmp_path, "this is a folder"),
                         (Path("/dev/zero"), "this is a device")):
        res = cli("import-hf", path)
        assert res.exit_code == 2 and needle in flat(res.output), res.output
    bad = tmp_path / "bad.json"
    bad.write_text('{"model_type": "llama",')
    res = cli("import-hf", bad)
    assert res.exit_code == 2 and f"{bad}: JSON" in flat(res.output)
    bad.write_text("[" * 100_000 + "]" * 100_000)
    res = cli("import-hf", bad)
    assert res.exit_code == 2 and "nested too deeply" in flat(res.output), res.output
    bad.write_text("[1, 2]")
    assert "a JSON object" in flat(cli("import-hf", bad).output)
    res = cli("import-hf", HF / "gpt2.json", "--seq-length", 0)
    assert res.exit_code == 2 and "--seq-length = 0" in flat(res.output)


def test_the_console_script_refuses_without_a_traceback():
    res = subprocess.run([sys.executable, "-m", "vtrain_fast", "import-hf", str(HF / "mistral-7b-v0.1.json")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    assert "sliding_window" in res.stderr and "Traceback" not in res.stderr and res.stdout == ""


def test_stdout_is_the_model_file_and_notes_go_to_stderr(tmp_path):
    res = subprocess.run([sys.executable, "-m", "vtrain_fast", "import-hf", str(HF / "gpt2.json")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    doc = tomllib.loads(res.stdout)
    assert list(doc) == ["models"] and list(doc["models"]) == ["gpt2"]
    assert "note: assumed: ffn_hidden_size = 4 x n_embd" in flat(res.stderr) and "0.124 B parameters" in res.stderr
    assert "normalization = LayerNorm" in flat(res.stderr)
    assert "# - assumed: ffn_hidden_size = 4 x n_embd" in res.stdout      # the notes are the file's comments too


def test_o_writes_the_file_and_never_replaces_one_without_overwrite(tmp_path, cli):
    out = tmp_path / "models" / "llama.toml"
    res = cli("import-hf", HF / "llama-3-8b.json", "-o", out, "--name", "my-llama")
    assert res.exit_code == 0, res.output
    first = out.read_text()
    assert "[models.my-llama]" in first and "model_files" in flat(res.output)
    assert models_from_tables(tomllib.loads(first)["models"], str(out))["my-llama"].num_query_groups == 8
    res = cli("import-hf", HF / "llama-2-7b.json", "-o", out, "--name", "my-llama")
    assert res.exit_code == 2 and "--overwrite" in flat(res.output) and str(out) in flat(res.output)
    assert out.read_text() == first
    res = cli("import-hf", HF / "llama-2-7b.json", "-o", out, "--name", "my-llama", "--overwrite")
    assert res.exit_code == 0 and out.read_text() != first and "num_query_groups = 32" in out.read_text()
    assert sorted(p.name for p in out.parent.iterdir()) == ["llama.toml"]       # no temporary file left
    # a refused config writes nothing
    res = cli("import-hf", HF / "mistral-7b-v0.1.json", "-o", tmp_path / "mistral.toml")
    assert res.exit_code == 2 and not (tmp_path / "mistral.toml").exists()
    res = cli("import-hf", HF / "gpt2.json", "-o", tmp_path)
    assert res.exit_code == 2 and "not a folder" in flat(res.output)


def test_the_no_replace_write_refuses_a_file_that_appears_meanwhile(tmp_path):
    from vtrain_fast.io.errors import write_atomically
    out = tmp_path / "m.toml"

    def write(tmp):
        Path(tmp).write_text("new")
        out.write_text("someone else's")           # appears between the check and the rename
    with pytest.raises(InputError, match="--overwrite"):
        write_atomically(out, write, replace=False)
    assert out.read_text() == "someone else's" and not (tmp_path / "m.toml.tmp").exists()


def test_names_come_from_the_config_or_the_file_and_presets_are_refused(tmp_path, cli):
    res = cli("import-hf", HF / "llama-2-7b.json")           # _name_or_path meta-llama/Llama-2-7b-hf
    assert "[models.llama-2-7b-hf]" in res.output
    folder = tmp_path / "Qwen2-7B"
    folder.mkdir()
    res = cli("import-hf", write_config(folder, config("qwen2-7b")), "--seq-length", 4096)
    assert "[models.qwen2-7b]" in res.output                 # config.json: its folder's name
    res = cli("import-hf", HF / "llama-3-8b.json", "--name", "llama3-8b")
    assert res.exit_code == 2 and "model preset" in flat(res.output) and "my-llama3-8b" in flat(res.output)
    res = cli("import-hf", HF / "llama-3-8b.json", "--name", "../x")
    assert res.exit_code == 2 and "--name" in res.output
    res = cli("import-hf", HF / "llama-3-8b.json", "--name", "llama-3.1-8b")
    assert '[models."llama-3.1-8b"]' in res.output
    assert "llama-3.1-8b" in tomllib.loads(res.output[res.output.index("# Model file"):])["models"]


def test_the_text_is_valid_toml_whatever_the_path(tmp_path):
    table, notes = shape_from_config(config("gpt2"), 'odd "name"\n.json')
    text = model_file_text("gpt2", table, notes + ['a note with "quotes" and a\nnew line'], 'odd "name"\n.json')
    doc = tomllib.loads(text)
    assert doc["models"]["gpt2"]["source"].startswith("Hugging Face config.json odd \"name\"?.json")


# ---------------------------------------------------------------------------------- model_files
def test_a_spec_sweeps_an_imported_model_file(tmp_path, cli):
    res = cli("import-hf", HF / "llama-2-7b.json", "-o", tmp_path / "shapes" / "llama.toml", "--name", "l2")
    assert res.exit_code == 0, res.output
    spec = tmp_path / "spec.toml"
    spec.write_text('model_files = ["shapes/llama.toml"]\n' + SMALL_SWEEP.format(training="").replace(
        'presets = ["gpt3-1.3b"]', 'presets = ["l2", "gpt3-1.3b"]'))
    parsed = parse_spec(spec.read_text(), str(spec))
    assert [m.name for m in parsed.models] == ["l2", "gpt3-1.3b"] and parsed.model_files == (
        str(tmp_path / "shapes" / "llama.toml"),)
    l2 = parsed.models[0]
    assert (l2.num_layers, l2.ffn_hidden_size, l2.gated_mlp, l2.vocab_size) == (32, 11008, True, 32000)
    out = tmp_path / "out"
    res = cli("sweep", spec, "-o", out)
    assert res.exit_code == 0, res.output
    import polars as pl

    from vtrain_fast.analysis.query import scan_results
    rows = scan_results(out).filter(pl.col("model") == "l2").collect()
    assert rows.height == parsed.num_points // 2 and rows["gated_mlp"].all()
    assert rows["num_parameters"].unique().to_list() == [pytest.approx(shape_params(l2))]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["model_files"]["files"] == list(parsed.model_files)


def test_a_changed_model_file_is_another_sweep(tmp_path):
    """The sweep key covers the shapes read from model files (the spec text alone does not
    change), so a resumed run never mixes rows of two shapes."""
    from vtrain_fast.engine.chunks import parse_keep, plan_sweep
    from vtrain_fast.engine.run import sweep_key
    from vtrain_fast.plan.grid import build_grid
    spec = tmp_path / "spec.toml"
    spec.write_text('model_files = ["m.toml"]\n' + SMALL_SWEEP.format(training="").replace("gpt3-1.3b", "m"))
    keys = []
    for layers in (24, 12):
        (tmp_path / "m.toml").write_text(f"[models.m]\nnum_layers = {layers}\nhidden_size = 2048\n"
                                         "num_attention_heads = 16\nseq_length = 2048\n")
        s = parse_spec(spec.read_text(), str(spec))
        keep = parse_keep("all")
        keys.append(sweep_key(s, build_grid(s), keep, plan_sweep(s.num_points, keep)))
    assert keys[0] != keys[1]


@pytest.mark.parametrize("files,content,needles", [
    ('"missing.toml"', None, ["missing.toml", "cannot be opened"]),
    ("[]", None, ["model_files", "non-empty list"]),
    ("[3]", None, ["model_files", "[3]"]),
    ('["m.toml"]', '[gpus.x]\nbase = "h100-sxm-80gb"\n', ["m.toml", "gpus", "[models.<name>] tables only"]),
    ('["m.toml"]', "", ["m.toml", "[models.<name>] is missing"]),
    ('["m.toml"]', "[models.m]\nnum_layers = 2\n", ["m.toml: [models.m]", "hidden_size is missing"]),
    ('["m.toml"]', "[models.\"gpt3-1.3b\"]\nnum_layers = 2\nhidden_size = 64\nnum_attention_heads = 2\n"
                   "seq_length = 64\n", ["[models.gpt3-1.3b]", "not a model preset"]),
])
def test_bad_model_files_are_refused(files, content, needles, tmp_path, cli):
    if content is not None:
        (tmp_path / "m.toml").write_text(content)
    spec = tmp_path / "spec.toml"
    spec.write_text(f"model_files = {files}\n" + SMALL_SWEEP.format(training=""))
    res = cli("sweep", spec, "-o", tmp_path / "out", "--dry-run")
    out = flat(res.output)
    assert res.exit_code == 2, res.output
    for n in needles:
        assert n in out, (n, out)


def test_a_name_defined_twice_is_refused_naming_both_files(tmp_path, cli):
    shape = "num_layers = 2\nhidden_size = 64\nnum_attention_heads = 2\nseq_length = 64\n"
    (tmp_path / "a.toml").write_text("[models.m]\n" + shape)
    (tmp_path / "b.toml").write_text("[models.m]\n" + shape)
    spec = tmp_path / "spec.toml"
    base = SMALL_SWEEP.format(training="").replace("gpt3-1.3b", "m")
    for head, first, second in (('model_files = ["a.toml", "b.toml"]\n', "a.toml", "b.toml"),
                                ('model_files = ["a.toml"]\n', "spec.toml", "a.toml")):
        text = head + base + ("" if first == "a.toml" else "[models.m]\n" + shape)
        spec.write_text(text)
        out = flat(cli("sweep", spec, "--dry-run").output)
        assert f"{tmp_path / second}: [models.m]" in out and f"also defined in {tmp_path / first}" in out, out
    spec.write_text('model_files = ["a.toml", "a.toml"]\n' + base)          # the same file twice: read once
    assert [m.name for m in parse_spec(spec.read_text(), str(spec)).models] == ["m"]


def test_the_command_is_documented(cli):
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    assert "| `vtrain-fast import-hf config.json [-o FILE.toml]" in readme
    assert "## Importing a Hugging Face model" in readme and "`model_files`" in readme
    res = cli("import-hf", "--help")
    assert res.exit_code == 0 and "[models.<name>]" in res.output and "--seq-length" in res.output


def _json_values():
    from hypothesis import strategies as st
    leaves = st.none() | st.booleans() | st.integers(-2, 10 ** 6) | st.floats(allow_nan=False) | st.text(max_size=8)
    return st.recursive(leaves, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                                             max_size=3), max_leaves=6)


def test_any_value_of_any_key_is_imported_or_refused_as_input():
    """Whatever a config holds, the importer returns a shape or raises InputError (never another
    exception, which would end in a traceback)."""
    from hypothesis import given, settings
    from hypothesis import strategies as st
    keys = sorted({k for n in ("llama-3-8b", "gpt2", "gpt-neox-20b", "qwen2-7b") for k in config(n)}
                  | set(ARCHITECTURES["gemma"].activation_keys) | {"head_dim", "kv_channels", "rope_scaling",
                                                                    "moe_layer_freq", "num_experts", "attention_bias",
                                                                    "mlp_bias", "use_sliding_window"})

    @settings(max_examples=300, deadline=None)
    @given(st.sampled_from(("llama-3-8b", "gpt2", "gpt-neox-20b", "qwen2-7b")), st.sampled_from(keys),
           _json_values(), st.sampled_from((None, 1, 4096)))
    def check(name, key, value, seq):
        cfg = {**config(name), key: value}
        try:
            table, notes = shape_from_config(cfg, "config.json", seq)
        except InputError:
            return
        models_from_tables({"m": table}, "m")          # what it returns, a spec reads
        tomllib.loads(model_file_text("m", table, notes, "config.json"))
    check()


def test_evaluate_reads_imported_models_with_models(tmp_path, cli):
    res = cli("import-hf", HF / "qwen2-7b.json", "-o", tmp_path / "qwen.toml", "--seq-length", 4096)
    assert res.exit_code == 0, res.output
    csv = tmp_path / "plans.csv"
    csv.write_text("model,global_batch_size,micro_batch_size,tp,pp,dp,gpu\nqwen2-7b,64,1,4,2,1,h100-sxm-80gb\n")
    res = cli("evaluate", csv, "-o", tmp_path / "out.csv")
    assert res.exit_code == 2 and "--models FILE" in flat(res.output)          # not a preset
    res = cli("evaluate", csv, "-o", tmp_path / "out.csv", "--models", tmp_path / "qwen.toml")
    assert res.exit_code == 0, res.output
    import polars as pl
    row = pl.read_csv(tmp_path / "out.csv").row(0, named=True)
    shape = models_from_tables(tomllib.loads((tmp_path / "qwen.toml").read_text())["models"], "q")["qwen2-7b"]
    assert (row["num_layers"], row["ffn_hidden_size"], row["gated_mlp"], row["num_query_groups"]) == (28, 18944, True, 4)
    assert row["num_parameters"] == pytest.approx(shape_params(shape))
    res = cli("evaluate", csv, "-o", tmp_path / "out2.csv", "--models", tmp_path / "none.toml")
    assert res.exit_code == 2 and "none.toml" in res.output and not (tmp_path / "out2.csv").exists()
