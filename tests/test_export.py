"""`vtrain-fast export` (issue 14): one plan's Megatron-LM launch flags, every one a flag Megatron-LM's
parser accepts at the pinned commit (tests/data/megatron_lm_args.txt, written from its source by
tests/data/make_framework_args.py), with the plan's values read back from them; the same plan as
Megatron-Bridge overrides (tests/data/megatron_bridge_keys.txt) and as a torchtitan recipe module, whose
imports, attribute paths, calls and keywords are checked against tests/data/torchtitan_names.txt and
whose function is run against stand-ins of those names to read the plan back."""
from __future__ import annotations

import ast
import math
import os
import shlex
import subprocess
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from vtrain_fast.analysis.evaluate import evaluate_frame
from vtrain_fast.analysis.export import (MEGATRON_BRIDGE_COMMIT, MEGATRON_LM_COMMIT, TORCHTITAN_COMMIT,
                                        TORCHTITAN_FLAVORS, TORCHTITAN_RECIPES, bridge_overrides, export,
                                        megatron_args, moe_layer_freq, pipeline_chunk_layers, torchtitan_config,
                                        torchtitan_ffn_hidden_dim, torchtitan_flavor, torchtitan_pipeline_split,
                                        torchtitan_recipe)
from vtrain_fast.cli import app
from vtrain_fast.io.errors import InputError
from vtrain_fast.model.moe import parse_layer_pattern

ARGS_FILE = Path(__file__).parent / "data" / "megatron_lm_args.txt"
MEGATRON_FLAGS = {ln.strip() for ln in ARGS_FILE.read_text().splitlines() if ln.startswith("--")}
KEYS_FILE = Path(__file__).parent / "data" / "megatron_bridge_keys.txt"
BRIDGE_KEYS = {ln.strip() for ln in KEYS_FILE.read_text().splitlines() if ln and not ln.startswith("#")}

BASE = dict(micro_batch_size=1, use_flash_attn="true", distributed_optimizer="true", overlap_grad_reduce="true")
PLANS = {
    # GPT-3 175B on A100, the vTrain-style stack: Megatron's own attention, full recomputation,
    # interleaved over pp 8 with its sends not overlapped
    "gpt3": dict(model="gpt3-175b", gpu="a100-sxm4-80gb", global_batch_size=1536, tp=8, pp=8, dp=12, vpp=2,
                 recompute="full", use_flash_attn="false", overlap_p2p_comm="false", micro_batch_size=1),
    # Llama-3-70B: GQA, RoPE, SwiGLU, RMSNorm, untied; FP8 current scaling with bf16 first and last
    # layers, context parallelism (all-gather), Megatron-FSDP with hybrid sharding, an uneven first stage
    "llama": dict(model="llama3-70b", gpu="h100-sxm-80gb", global_batch_size=512, tp=4, pp=4, dp=8, cp=2,
                  sequence_parallel="true", precision="fp8", fp8_recipe="tensorwise", num_layers_at_start_in_bf16=1,
                  num_layers_at_end_in_bf16=1, cp_comm_type="all_gather", zero_stage=3, dp_shard=8,
                  first_pipeline_num_layers=23, recompute="selective", tp_comm_overlap="true"),
    # Mixtral 8x7B: expert parallelism, the all-to-all overlap (interleaved), a capacity factor padded
    "mixtral": dict(model="mixtral-8x7b", seq_length=4096, gpu="h100-sxm-80gb", global_batch_size=256, tp=2, pp=2,
                    dp=16, vpp=2,
                    ep=8, etp=1, sequence_parallel="true", overlap_moe_expert_parallel_comm="true",
                    moe_expert_capacity_factor=1.25, moe_pad_expert_input_to_capacity="true",
                    moe_load_imbalance=1.2, recompute="selective"),
    # DeepSeek-V3: multi-head latent attention, 3 dense layers first, shared experts, the recipe's last stage
    "deepseek": dict(model="deepseek-v3", gpu="b200-hgx-180gb", global_batch_size=4096, tp=1, pp=16, dp=16, ep=8,
                     last_pipeline_num_layers=1, recompute="full", moe_token_dispatcher_type="allgather"),
}


def _plan(name: str) -> dict:
    out = evaluate_frame(pl.DataFrame([{**BASE, **PLANS[name]}]), name)
    assert out["status"][0] in ("ok", "out_of_memory"), out["status"][0]
    return out.row(0, named=True)


def _flags(args) -> dict:
    """flag -> value (True for a switch)."""
    out, i = {}, 0
    while i < len(args):
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            out[args[i]] = args[i + 1]
            i += 2
        else:
            out[args[i]] = True
            i += 1
    return out


def test_the_flag_list_names_its_megatron_commit_and_holds_the_core_flags():
    first = ARGS_FILE.read_text().splitlines()[0]
    assert MEGATRON_LM_COMMIT in first and "make_framework_args.py" in first
    assert {"--tensor-model-parallel-size", "--num-layers", "--use-distributed-optimizer", "--recompute-granularity",
            "--expert-model-parallel-size", "--fp8-format"} <= MEGATRON_FLAGS
    assert "--async-tensor-model-parallel-allreduce" not in MEGATRON_FLAGS      # gone from Megatron-core


@pytest.mark.parametrize("name", sorted(PLANS))
def test_every_flag_is_a_megatron_lm_flag_and_the_plan_reads_back(name):
    row = _plan(name)
    e = megatron_args(row, 8)
    flags = _flags(e.args)
    assert set(flags) <= MEGATRON_FLAGS, set(flags) - MEGATRON_FLAGS
    assert len(e.args) == len(set(a for a in e.args if a.startswith("--"))) + sum(
        1 for v in flags.values() if v is not True)                               # no flag twice
    for flag, col in (("--num-layers", "num_layers"), ("--hidden-size", "hidden_size"),
                      ("--num-attention-heads", "num_attention_heads"), ("--ffn-hidden-size", "ffn_hidden_size"),
                      ("--seq-length", "seq_length"), ("--tensor-model-parallel-size", "tp"),
                      ("--pipeline-model-parallel-size", "pp"), ("--context-parallel-size", "cp"),
                      ("--micro-batch-size", "micro_batch_size"), ("--global-batch-size", "global_batch_size"),
                      ("--train-iters", "num_steps"), ("--vocab-size", "vocab_size")):
        assert int(flags[flag]) == int(row[col]), flag
    # the world: tp x cp x pp x dp = nodes x GPUs per node
    launch = shlex.split(e.launcher)
    nodes, per_node = int(launch[launch.index("--nnodes") + 1]), int(launch[launch.index("--nproc-per-node") + 1])
    assert nodes * per_node == row["num_gpus"] == row["tp"] * row["cp"] * row["pp"] * row["dp"]
    if row["vpp"] > 1:
        extra = int(row["account_for_embedding_in_pipeline_split"]) + int(row["account_for_loss_in_pipeline_split"])
        assert int(flags["--num-layers-per-virtual-pipeline-stage"]) * row["pp"] * row["vpp"] == row["num_layers"] + extra
    else:
        assert "--num-layers-per-virtual-pipeline-stage" not in flags
    assert ("--num-query-groups" in flags) == (row["num_query_groups"] != row["num_attention_heads"]
                                                and not row["multi_latent_attention"])
    assert flags["--attention-backend"] == ("flash" if row["use_flash_attn"] else "local")
    if row["num_experts"]:
        assert int(flags["--num-experts"]) == row["num_experts"] and int(flags["--expert-model-parallel-size"]) == row["ep"]
        text = flags["--moe-layer-freq"]
        placement = parse_layer_pattern(text) if not text.isdigit() else tuple(
            int(i % int(text) == 0) for i in range(row["num_layers"]))
        moe_layers = sum(1 for i in range(row["num_layers"]) if i >= row["moe_first_dense_layers"]
                         and i % row["moe_layer_step"] == 0)
        assert sum(placement) == moe_layers
        assert flags["--moe-token-dispatcher-type"] == row["moe_token_dispatcher_type"]
    else:
        assert not any(f.startswith("--moe") or f.startswith("--expert") for f in flags)


def test_each_setting_reaches_its_flag():
    gpt3, llama, mixtral, deepseek = (megatron_args(_plan(n), 8) for n in ("gpt3", "llama", "mixtral", "deepseek"))
    g, ll, mx, ds = (_flags(e.args) for e in (gpt3, llama, mixtral, deepseek))
    assert g["--recompute-granularity"] == "full" and g["--recompute-method"] == "uniform"
    assert "--no-overlap-p2p-communication" in g and "--swiglu" not in g and "--normalization" not in g
    assert ll["--fp8-format"] == "hybrid" and ll["--fp8-recipe"] == "tensorwise" and "--first-last-layers-bf16" in ll
    assert (ll["--num-layers-at-start-in-bf16"], ll["--num-layers-at-end-in-bf16"]) == ("1", "1")
    assert ll["--cp-comm-type"] == "all_gather" and ll["--decoder-first-pipeline-num-layers"] == "23"
    assert "--use-megatron-fsdp" in ll and ll["--data-parallel-sharding-strategy"] == "optim_grads_params"
    assert ll["--num-distributed-optimizer-instances"] == str(8 * 2 // 8)      # dp x cp / dp_shard
    assert {"--swiglu", "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--sequence-parallel",
            "--tp-comm-overlap"} <= set(ll) and ll["--position-embedding-type"] == "rope"
    assert ll["--recompute-granularity"] == "selective" and "--use-distributed-optimizer" not in ll
    assert "--overlap-moe-expert-parallel-comm" in mx and mx["--moe-expert-capacity-factor"] == "1.25"
    assert "--moe-pad-expert-input-to-capacity" in mx and mx["--expert-tensor-parallel-size"] == "1"
    assert any("1.2 x the mean" in n for n in mixtral.notes)       # an assumption, no flag
    assert "--multi-latent-attention" in ds and ds["--q-lora-rank"] == "1536" and ds["--kv-lora-rank"] == "512"
    assert ds["--moe-layer-freq"] == "([0]*3+[1]*58)" and ds["--decoder-last-pipeline-num-layers"] == "1"
    assert ds["--moe-shared-expert-intermediate-size"] == "2048" and ds["--moe-token-dispatcher-type"] == "allgather"


def test_moe_layer_freq_by_hand():
    assert moe_layer_freq(8, 1, 0) == "1" and moe_layer_freq(8, 2, 0) == "2"
    assert moe_layer_freq(61, 1, 3) == "([0]*3+[1]*58)"
    assert parse_layer_pattern(moe_layer_freq(8, 2, 3)) == (0, 0, 0, 0, 1, 0, 1, 0)


def test_a_table_of_plans_and_the_row_that_picks_one(tmp_path):
    rows = [{**BASE, **PLANS["mixtral"]}, {**BASE, **PLANS["mixtral"], "ep": 4}]
    path = tmp_path / "plans.csv"
    pl.DataFrame(rows).write_csv(path)
    with pytest.raises(InputError, match="one plan"):
        export(path, "megatron")
    costs = evaluate_frame(pl.DataFrame(rows), "x")["cost_usd"].to_list()
    cheapest = _flags(export(path, "megatron", row=0).args)
    assert cheapest["--expert-model-parallel-size"] == ("8" if costs[0] <= costs[1] else "4")
    with pytest.raises(InputError, match="--row"):
        export(path, "megatron", row=2)
    with pytest.raises(InputError, match="--to"):
        export(path, "nemo", row=0)
    assert export(path, "bridge", row=0).args[0].startswith("model.")
    with pytest.raises(InputError, match="PLAN"):
        export(tmp_path / "plan.txt", "megatron")


def test_cli_writes_a_script_sh_reads(tmp_path):
    spec = tmp_path / "s.toml"
    spec.write_text('[model]\npresets = ["gpt3-1.3b"]\n[training]\nnum_tokens = 1e10\nglobal_batch_size = 64\n'
                    'micro_batch_size = [1, 2]\n[cluster]\ngpu = "a100-sxm4-80gb"\nnum_gpus = [8, 16]\n'
                    '[parallel]\ntp = [1, 2]\npp = 1\n')
    runner = CliRunner()
    res = runner.invoke(app, ["sweep", str(spec), "-o", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["export", str(tmp_path / "r")])
    assert res.exit_code == 2 and "one plan" in res.output and "Traceback" not in res.output
    script = tmp_path / "run.sh"
    res = runner.invoke(app, ["export", str(tmp_path / "r"), "--where", "num_gpus==16", "--where", "tp==2",
                              "--where", "micro_batch_size==2", "-o", str(script)])
    assert res.exit_code == 0, res.output
    text = script.read_text()
    assert "--nnodes 2 --nproc-per-node 8" in text and "--tensor-model-parallel-size 2" in text
    assert subprocess.run(["sh", "-n", str(script)]).returncode == 0
    res = runner.invoke(app, ["export", str(tmp_path / "r"), "--where", "tp==3"])
    assert res.exit_code == 2 and "Traceback" not in res.output


@pytest.mark.parametrize("name", sorted(PLANS))
def test_every_bridge_override_is_a_megatron_bridge_key_and_the_plan_reads_back(name):
    """Megatron-Bridge / NeMo 2: each override's key is a field of its ConfigContainer section at the
    pinned commit (tests/data/megatron_bridge_keys.txt), the precision a registered recipe."""
    assert MEGATRON_BRIDGE_COMMIT in KEYS_FILE.read_text().splitlines()[0]
    row = _plan(name)
    e = bridge_overrides(row, 8)
    pairs = dict(a.split("=", 1) for a in e.args)
    assert len(pairs) == len(e.args)                                    # no key twice
    for key, value in pairs.items():
        assert (key in BRIDGE_KEYS) if key != "mixed_precision" else (f"mixed_precision={value}" in BRIDGE_KEYS), key
    for key, col in (("model.num_layers", "num_layers"), ("model.tensor_model_parallel_size", "tp"),
                     ("model.pipeline_model_parallel_size", "pp"), ("model.context_parallel_size", "cp"),
                     ("train.micro_batch_size", "micro_batch_size"), ("train.global_batch_size", "global_batch_size"),
                     ("train.train_iters", "num_steps")):
        assert int(pairs[key]) == int(row[col]), key
    if row["vpp"] > 1:
        assert int(pairs["model.virtual_pipeline_model_parallel_size"]) == row["vpp"]
    assert pairs["mixed_precision"] == ("bf16_mixed" if row["precision"] == "bf16" else
                                        {"delayed": "bf16_with_fp8_delayed_scaling_mixed",
                                         "tensorwise": "bf16_with_fp8_current_scaling_mixed"}[row["fp8_recipe"]])
    if row["num_experts"]:
        assert int(pairs["model.num_moe_experts"]) == row["num_experts"]
        if row["moe_first_dense_layers"]:
            assert pairs["model.moe_layer_freq"].startswith("[0,0,0,1")      # the list the pattern text is
    if row["gated_mlp"]:
        assert any("activation_func" in n for n in e.notes)


def test_export_reads_the_tables_the_tool_writes_and_keeps_existing_files(tmp_path):
    """A `pareto -o` / `evaluate -o` table (every output column) is priced again from its inputs; an
    existing -o file is kept without --overwrite; a table without an ok plan says its statuses."""
    runner = CliRunner()
    plans = tmp_path / "plans.csv"
    pl.DataFrame([{**BASE, **PLANS["mixtral"]}]).write_csv(plans)
    priced = tmp_path / "priced.csv"
    assert runner.invoke(app, ["evaluate", str(plans), "-o", str(priced)]).exit_code == 0
    assert "status" in pl.read_csv(priced).columns
    script = tmp_path / "run.sh"
    res = runner.invoke(app, ["export", str(priced), "-o", str(script)])
    assert res.exit_code == 0, res.output
    assert "--expert-model-parallel-size 8" in script.read_text()
    assert os.access(script, os.X_OK), "the launch script is executable (a shell script, ./run.sh)"
    res = runner.invoke(app, ["export", str(priced), "-o", str(script)])
    assert res.exit_code == 2 and "--overwrite" in res.output and "Traceback" not in res.output
    assert runner.invoke(app, ["export", str(priced), "-o", str(script), "--overwrite"]).exit_code == 0
    oom = tmp_path / "oom.csv"
    pl.DataFrame([{**BASE, **PLANS["mixtral"], "seq_length": 32768}]).write_csv(oom)
    res = runner.invoke(app, ["export", str(oom)])
    assert res.exit_code == 2 and "out_of_memory 1" in " ".join(res.output.split())


def test_a_plan_picked_among_several_jobs_says_so(tmp_path):
    rows = [{**BASE, **PLANS["mixtral"], "num_tokens": n} for n in (1e11, 2e11)]
    path = tmp_path / "two-jobs.csv"
    pl.DataFrame(rows).write_csv(path)
    e = export(path, "megatron", row=0)
    assert any("2 num_tokens values" in n for n in e.notes)


def test_a_plan_near_the_memory_limit_says_so(tmp_path, monkeypatch):
    """The 'tight' mark (memory headroom below the tables' margin) reaches the export's notes; the
    margin raised to 15 % so that a GPT-3 plan on few data-parallel ranks is within it."""
    from vtrain_fast.analysis import query
    from vtrain_fast.hardware.gpus import PRESETS
    monkeypatch.setattr(query, "DEFAULT_MEMORY_MARGIN", 0.15)
    cap = PRESETS["a100-sxm4-80gb"].hbm_GiB
    for dp in (2, 12):
        path = tmp_path / f"dp{dp}.csv"
        pl.DataFrame([{**BASE, **PLANS["gpt3"], "recompute": "selective", "dp": dp}]).write_csv(path)
        mem = evaluate_frame(pl.read_csv(path), "x")["memory_per_gpu_GiB"][0]
        notes = [n for n in export(path, "megatron").notes if n.startswith("memory:")]
        if cap - mem < 0.15 * cap:
            assert dp == 2 and len(notes) == 1 and f"{mem:.1f} GiB per GPU, {cap - mem:.1f} GiB left" in notes[0]
            assert "within 15%" in notes[0]
        else:
            assert dp == 12 and notes == []


# ---------------------------------------------------------------- torchtitan (--to torchtitan)
TITAN_FILE = Path(__file__).parent / "data" / "torchtitan_names.txt"


def _titan_names() -> dict:
    """tests/data/torchtitan_names.txt by kind: attr, import, call, schedule (sets); kwarg (callee -> names);
    literal (key -> values); flavor (name -> numbers); recipe (name -> flavor)."""
    out = {k: set() for k in ("attr", "import", "call", "schedule")}
    out.update(kwarg={}, literal={}, flavor={}, recipe={})
    for ln in TITAN_FILE.read_text().splitlines()[1:]:
        kind, rest = ln.split(" ", 1)
        if kind in ("kwarg", "literal"):
            key, value = rest.rsplit(" ", 1)
            out[kind].setdefault(key, set()).add(value)
        elif kind == "flavor":
            name, *pairs = rest.split(" ")
            out[kind][name] = {k: v for k, v in (p.split("=") for p in pairs)}
        elif kind == "recipe":
            name, flavor = rest.split(" ")
            out[kind][name] = flavor
        else:
            out[kind].add(rest)
    return out


TITAN = _titan_names()
TITAN_BASE = dict(gpu="h100-sxm-80gb", micro_batch_size=1, use_flash_attn="true", overlap_grad_reduce="true")
TITAN_PLANS = {
    # name: (plan, the layers of each pipeline model chunk, by hand)
    # Llama-3-8B, FSDP2 over 16 ranks: the shipped 8B flavor and recipe
    "8b-fsdp": (dict(model="llama3-8b", global_batch_size=256, tp=1, pp=1, dp=16, micro_batch_size=2, zero_stage=3,
                     recompute="full"), [32]),
    # Llama-3-70B: tp 4 (sequence parallel, TP overlap), cp 2 (all-gather), interleaved pp 4 x 2, HSDP (shards of 8
    # over dp x cp = 16), FP8 current scaling with the first and last layers in bf16, selective recomputation
    "70b-hsdp-fp8": (dict(model="llama3-70b", global_batch_size=512, tp=4, pp=4, vpp=2, dp=8, cp=2,
                          cp_comm_type="all_gather", sequence_parallel="true", tp_comm_overlap="true", zero_stage=3,
                          dp_shard=8, precision="fp8", fp8_recipe="tensorwise", num_layers_at_start_in_bf16=1,
                          num_layers_at_end_in_bf16=1, recompute="selective"), [10] * 8),
    # uneven first and last stages interleaved: no layers_per_stage says it, the module names do
    "70b-uneven-vpp": (dict(model="llama3-70b", global_batch_size=512, tp=8, pp=4, vpp=2, dp=4, sequence_parallel="true",
                            first_pipeline_num_layers=16, last_pipeline_num_layers=16, zero_stage=3, recompute="full"),
                       [8, 12, 12, 8, 8, 12, 12, 8]),
    # an uneven first stage: layers_per_stage 21, the first stage 4 fewer
    "70b-first-stage": (dict(model="llama3-70b", global_batch_size=256, tp=8, pp=4, dp=4, sequence_parallel="true",
                             first_pipeline_num_layers=17, zero_stage=3, recompute="full"), [17, 21, 21, 21]),
    # Llama-3-405B as its paper splits it: embedding and loss counted as layers, 126 + 2 over 8 stages
    "405b-pp8": (dict(model="llama3-405b", global_batch_size=1024, tp=8, pp=8, dp=16, sequence_parallel="true",
                      account_for_embedding_in_pipeline_split="true", account_for_loss_in_pipeline_split="true",
                      zero_stage=3, recompute="full"), [15] + [16] * 6 + [15]),
    # Llama-2-7B (no shipped flavor: a model of its own shape, vocabulary 32,000), DDP (zero_stage 0) with tp 2
    "llama2-ddp": (dict(model="llama2-7b", gpu="a100-sxm4-80gb", global_batch_size=256, tp=2, pp=1, dp=8,
                        micro_batch_size=2, zero_stage=0, recompute="full"), [32]),
    # the 1B flavor's shape (tied embeddings), started from the 8B recipe
    "1b-shape": (dict(model="llama3-8b", num_layers=16, hidden_size=2048, ffn_hidden_size=8192,
                      untie_embeddings_and_output_weights="false", global_batch_size=128, tp=1, pp=1, dp=8,
                      micro_batch_size=4, zero_stage=3, recompute="selective"), [16]),
    # MXFP8 on B200 with the first layer in bf16, tp 2 x pp 2, no recomputation
    "8b-mxfp8": (dict(model="llama3-8b", gpu="b200-hgx-180gb", global_batch_size=256, tp=2, pp=2, dp=4,
                      sequence_parallel="true", precision="fp8", fp8_recipe="mxfp8", num_layers_at_start_in_bf16=1,
                      zero_stage=3, recompute="none"), [16, 16]),
}


def _titan_plan(name: str) -> dict:
    out = evaluate_frame(pl.DataFrame([{**TITAN_BASE, **TITAN_PLANS[name][0]}]), name)
    assert out["status"][0] == "ok", out["status"][0]
    return out.row(0, named=True)


def titan_problems(source: str) -> list[str]:
    """What in a recipe module torchtitan does not name (tests/data/torchtitan_names.txt): imports,
    attribute paths under ``config``, callables and their keywords, the values of Literal-typed fields
    and keywords, pipeline schedules, flavors, and names used but never bound."""
    import builtins
    tree = ast.parse(source)
    problems, imported, bound, flavors = [], {}, set(dir(builtins)), set(TITAN["flavor"])
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            problems.append(f"plain import {ast.unparse(node)}")
        elif isinstance(node, ast.ImportFrom):
            for a in node.names:
                key = f"{node.module}:{a.name}"
                if key not in TITAN["import"]:
                    problems.append(f"import {key}")
                imported[a.asname or a.name] = key
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            bound.add(node.name)
            bound |= {a.arg for a in node.args.args + node.args.kwonlyargs + node.args.posonlyargs}
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)
        elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Subscript):
            target = node.targets[0]          # llama3_configs["vtrain_fast"] = ...: a flavor added
            if imported.get(getattr(target.value, "id", "")) != "torchtitan.models.llama3:llama3_configs":
                problems.append(f"item assignment {ast.unparse(target)}")
            flavors.add(ast.literal_eval(target.slice))
    bound |= set(imported)

    def chain(node):
        """'config.a.b' of an attribute chain rooted at a name, else None."""
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        return ".".join([node.id] + parts[::-1]) if isinstance(node, ast.Name) else None

    def literal_ok(key, value_node, where):
        if isinstance(value_node, ast.Constant) and isinstance(value_node.value, str) and key in TITAN["literal"] \
                and value_node.value not in TITAN["literal"][key]:
            problems.append(f"{where} = {value_node.value!r}")

    outermost = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in outermost:
            for sub in ast.walk(node.value):
                outermost.add(id(sub))
            path = chain(node)
            if path is None:
                continue
            root, _, rest = path.partition(".")
            if root == "config":
                if rest not in TITAN["attr"]:
                    problems.append(f"attribute config.{rest}")
            elif root in imported:
                if f"{imported[root]}.{rest}" not in TITAN["call"]:
                    problems.append(f"name {imported[root]}.{rest}")
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in bound:
            problems.append(f"unbound name {node.id}")
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Attribute):
            path = chain(node.targets[0])
            if path and path.startswith("config."):
                literal_ok(path[7:], node.value, path)
                if path == "config.parallelism.pipeline_parallel_schedule" and \
                        ast.literal_eval(node.value) not in TITAN["schedule"]:
                    problems.append(f"schedule {ast.literal_eval(node.value)!r}")
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id not in imported:
                continue                        # a function of the module, or a builtin
            path = chain(func)
            root, _, rest = (path or "?").partition(".")
            callee = imported.get(root, "?" + root) + (f".{rest}" if rest else "")
            if callee not in TITAN["call"]:
                problems.append(f"call {callee}")
                continue
            for kw in node.keywords:
                if kw.arg not in TITAN["kwarg"].get(callee, set()):
                    problems.append(f"keyword {callee}({kw.arg}=)")
                literal_ok(f"{callee}.{kw.arg}", kw.value, f"{callee}({kw.arg}=)")
            if callee == "torchtitan.models.llama3:model_registry":
                flavor = node.args[0] if node.args else next(k.value for k in node.keywords if k.arg == "flavor")
                if ast.literal_eval(flavor) not in flavors:
                    problems.append(f"flavor {ast.literal_eval(flavor)!r}")
    return problems


def _run_recipe(source: str, monkeypatch) -> tuple[object, dict]:
    """Execute the recipe module against stand-ins of the torchtitan names it imports (every callable
    checks its keywords, every config section its attributes, against torchtitan_names.txt) and call its
    function: the config it returns (settings read back as plain values) and the module's namespace."""
    import sys
    import types

    class Section:
        def __init__(self, prefix):
            object.__setattr__(self, "_prefix", prefix)
            object.__setattr__(self, "_values", {})

        def __setattr__(self, name, value):
            assert f"{self._prefix}{name}" in TITAN["attr"], f"{self._prefix}{name}"
            self._values[name] = value

        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            assert f"{self._prefix}{name}" in TITAN["attr"], f"{self._prefix}{name}"
            return self._values.setdefault(name, Section(f"{self._prefix}{name}."))

    def stub(callee):
        def call(*args, **kwargs):
            assert set(kwargs) <= TITAN["kwarg"].get(callee, set()), (callee, kwargs)
            if callee.split(":")[0].endswith("config_registry"):
                return Section("")
            return types.SimpleNamespace(_callee=callee, _args=args, **kwargs)
        return call

    modules = {}
    for key in sorted(TITAN["import"]):
        module, name = key.split(":")
        for i in range(1, module.count(".") + 2):
            modules.setdefault(".".join(module.split(".")[:i]), types.ModuleType(".".join(module.split(".")[:i])))
        m = modules[module]
        if key in TITAN["call"]:
            setattr(m, name, stub(key))
        elif f"{key}.Config" in TITAN["call"]:
            setattr(m, name, types.SimpleNamespace(Config=stub(f"{key}.Config")))
        else:
            setattr(m, name, object())
    llama3 = modules["torchtitan.models.llama3"]

    def shipped(flavor):                    # a flavor function of torchtitan's llama3_configs
        return lambda **kw: types.SimpleNamespace(vocab_size=int(TITAN["flavor"][flavor]["vocab_size"]), _flavor=flavor)
    llama3.llama3_configs = {name: shipped(name) for name in TITAN["flavor"]}

    def model_registry(flavor, **kwargs):
        assert set(kwargs) <= TITAN["kwarg"]["torchtitan.models.llama3:model_registry"], kwargs
        model = llama3.llama3_configs[flavor](attn_backend="flex", tp_gemm_backend="default")
        return types.SimpleNamespace(flavor=flavor, model=model, converters=kwargs.get("converters"))
    llama3.model_registry = model_registry
    modules["torchtitan.models.common.config_utils"].decoder_vocab_size = lambda spec: spec.model.vocab_size
    for name, m in modules.items():
        monkeypatch.setitem(sys.modules, name, m)
    namespace = {"__name__": "recipe"}
    exec(compile(source, "recipe.py", "exec"), namespace)
    return namespace["vtrain_fast_plan"](), namespace


def _values(section) -> dict:
    return section._values


def test_the_torchtitan_names_name_their_commit_and_the_core_names():
    first = TITAN_FILE.read_text().splitlines()[0]
    assert TORCHTITAN_COMMIT in first and "make_framework_args.py" in first
    assert {"parallelism.tensor_parallel_degree", "parallelism.data_parallel_shard_degree", "training.steps",
            "parallelism.pipeline_parallel_layers_per_stage", "compile.enable_async_tensor_parallel",
            "activation_checkpoint", "model_spec"} <= TITAN["attr"]
    assert {"torchtitan.models.llama3:model_registry", "torchtitan.models.llama3.config_registry:llama3_70b",
            "torchtitan.distributed.activation_checkpoint:FullAC", "torchtitan.trainer:Trainer"} <= TITAN["import"]
    assert {"1F1B", "Interleaved1F1B"} <= TITAN["schedule"]
    assert "converters" in TITAN["kwarg"]["torchtitan.models.llama3:model_registry"]
    assert TITAN["literal"]["torchtitan.components.quantization:Float8LinearConverter.Config.recipe_name"] == {
        "rowwise", "rowwise_with_gw_hp"}          # no tensorwise at this commit: the export says so
    assert "parallelism.num_microbatches" not in TITAN["attr"]     # a name torchtitan does not have


def test_the_flavor_table_is_torchtitans():
    """TORCHTITAN_FLAVORS and TORCHTITAN_RECIPES hold what torchtitan's source builds, and the FFN rule gives
    Llama 3's published sizes (and the presets')."""
    assert set(TORCHTITAN_FLAVORS) == set(TITAN["flavor"])
    for name, f in TORCHTITAN_FLAVORS.items():
        src = TITAN["flavor"][name]
        assert {k: str(v) for k, v in f.items()} == {k: src[k] for k in f}, name
    assert all(TITAN["recipe"][r] == f for r, f in TORCHTITAN_RECIPES.items())
    assert [torchtitan_ffn_hidden_dim(d, m, x) for d, m, x in ((4096, 1024, 1.3), (8192, 4096, 1.3),
                                                               (16384, 4096, 1.2), (2048, 1024, 1.5))] == [
        14336, 28672, 53248, 8192]
    assert torchtitan_pipeline_split(126, 8, 1, 1) == [15] + [16] * 6 + [15]
    assert torchtitan_pipeline_split(10, 4, 0, 0) == [3, 3, 2, 2]          # the first stages one more


@pytest.mark.parametrize("name", sorted(TITAN_PLANS))
def test_every_torchtitan_name_exists_and_the_plan_reads_back(name, monkeypatch):
    row = _titan_plan(name)
    e = torchtitan_config(row, 8, module="plan_x")
    assert e.target == "torchtitan" and e.text() == e.source
    assert titan_problems(e.source) == []
    config, namespace = _run_recipe(e.source, monkeypatch)
    par, tr, cmp_ = (_values(getattr(config, s)) for s in ("parallelism", "training", "compile"))
    top = _values(config)
    # degrees: tp x cp x pp x dp = the world, dp as FSDP2 shards (x cp) and replicas
    assert (par["tensor_parallel_degree"], par["context_parallel_degree"], par["pipeline_parallel_degree"]) == (
        row["tp"], row["cp"], row["pp"])
    assert par["data_parallel_shard_degree"] * par["data_parallel_replicate_degree"] == row["dp"]
    if row["zero_stage"] == 3:
        group = row["dp_shard"] or row["dp"] * row["cp"]
        assert par["data_parallel_shard_degree"] * row["cp"] == group and par["fsdp_reshard_after_forward"] == "always"
    else:
        assert par["data_parallel_shard_degree"] == 1 and par["data_parallel_replicate_degree"] == row["dp"]
    if row["tp"] > 1:
        assert par["enable_sequence_parallel"] == row["sequence_parallel"]
    # the batch
    assert tr["num_tokens_per_microbatch_per_dp_rank"] == row["micro_batch_size"] * row["seq_length"]
    assert tr["num_tokens_per_train_step"] == row["global_batch_size"] * row["seq_length"]
    assert tr["max_context_length"] == row["seq_length"] and tr["steps"] == row["num_steps"]
    assert tr["mixed_precision_param"] == "bfloat16"
    # the pipeline: schedule, micro-batches, the layers of each chunk
    expected = TITAN_PLANS[name][1]
    assert pipeline_chunk_layers(row) == expected
    if row["pp"] > 1:
        assert par["pipeline_parallel_schedule"] == ("Interleaved1F1B" if row["vpp"] > 1 else "1F1B")
        assert par["num_pp_microbatches"] == row["global_batch_size"] // (row["micro_batch_size"] * row["dp"])
        assert tr["disable_cuda_graphs"] is True
        if "module_fqns_per_model_part" in par:
            parts = par["module_fqns_per_model_part"]
            assert [sum(n.startswith("layers.") for n in p) for p in parts] == expected
            assert [n for p in parts for n in p if n.startswith("layers.")] == [f"layers.{i}" for i in range(row["num_layers"])]
            decoder = TITAN["kwarg"]["torchtitan.models.llama3:Llama3Model.Config"]
            assert {n for p in parts for n in p if not n.startswith("layers.")} <= decoder
            assert parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "lm_head"]
        else:
            split = torchtitan_pipeline_split(row["num_layers"], len(expected),
                                              par["pipeline_parallel_first_stage_less_layers"],
                                              par["pipeline_parallel_last_stage_less_layers"])
            assert split == expected
            eff = row["num_layers"] + par["pipeline_parallel_first_stage_less_layers"] + \
                par["pipeline_parallel_last_stage_less_layers"]
            assert math.ceil(eff / par["pipeline_parallel_layers_per_stage"]) == len(expected)  # torchtitan's stage count
    else:
        assert not any(k.startswith("pipeline_parallel_") and k != "pipeline_parallel_degree" for k in par)
        assert "num_pp_microbatches" not in par and "module_fqns_per_model_part" not in par
    # recomputation, precision, compile
    ac = top["activation_checkpoint"]
    assert (ac._callee.rsplit(":", 1)[1] if ac is not None else None) == {
        "full": "FullAC.Config", "selective": "SelectiveAC.Config", "none": None}[row["recompute"]]
    converters = top["model_spec"].converters or []
    if row["precision"] == "fp8":
        (conv,) = converters
        assert conv.model_compile_enabled is True and cmp_["enable"] is True
        bf16 = {f"layers.{i}." for i in range(row["num_layers"]) if i < row["num_layers_at_start_in_bf16"]
                or i >= row["num_layers"] - row["num_layers_at_end_in_bf16"]}
        if row["fp8_recipe"] == "tensorwise":
            assert conv._callee.endswith("Float8LinearConverter.Config") and conv.recipe_name == "rowwise"
            assert set(conv.filter_fqns) == {"lm_head"} | bf16
        else:
            assert conv._callee.endswith("MXFP8LinearConverter.Config")
            assert (set(conv.fqns) == {"layers."}) if not bf16 else (
                set(conv.fqns) == {f"layers.{i}." for i in range(row["num_layers"])} - bf16)
    else:
        assert converters == []
    assert cmp_["enable_async_tensor_parallel"] == (row["tp"] > 1 and row["tp_comm_overlap"])
    assert cmp_["enable"] == (row["precision"] == "fp8" or cmp_["enable_async_tensor_parallel"])
    # the model: a shipped flavor of the plan's shape, else one of its own
    flavor = torchtitan_flavor(row)
    spec = top["model_spec"]
    if flavor is not None:
        assert spec.flavor == flavor and spec.model._flavor == flavor
    else:
        model = spec.model
        assert spec.flavor not in TITAN["flavor"] and model._callee.endswith("Llama3Model.Config")
        assert (model.dim, model.vocab_size, model.enable_weight_tying) == (
            row["hidden_size"], row["vocab_size"], not row["untie_embeddings_and_output_weights"])
        layers = model.layers
        assert (layers.n_layers, layers.n_heads, layers.n_kv_heads, layers.hidden_dim, layers.dim) == (
            row["num_layers"], row["num_attention_heads"], row["num_query_groups"], row["ffn_hidden_size"],
            row["hidden_size"])
        assert model.tok_embeddings.num_embeddings == model.lm_head.out_features == row["vocab_size"]
    if row["vocab_size"] != 128256:
        assert top["loss"].loss_fn.global_vocab_size == row["vocab_size"]
    # the recipe it starts from, and the launch line
    assert e.args[0] == f"config = {torchtitan_recipe(row)}()" and torchtitan_recipe(row) in TITAN["recipe"]
    launch = shlex.split(e.launcher)
    nodes, per_node = int(launch[launch.index("--nnodes") + 1]), int(launch[launch.index("--nproc-per-node") + 1])
    assert nodes * per_node == row["num_gpus"] == row["tp"] * row["cp"] * row["pp"] * row["dp"]
    assert launch[launch.index("-m") + 1] == "torchtitan.train" and launch[launch.index("--module") + 1] == "plan_x"
    assert launch[launch.index("--config") + 1] in namespace
    assert f"# run: {e.launcher}" in e.source


def test_the_recipe_picked_and_the_notes():
    e70 = torchtitan_config(_titan_plan("70b-hsdp-fp8"), 8)
    assert e70.args[0] == "config = llama3_70b()"
    assert any("rowwise" in n for n in e70.notes) and any("SelectiveAC is op-level" in n for n in e70.notes)
    assert any("async TP" in n for n in e70.notes)
    e405 = torchtitan_config(_titan_plan("405b-pp8"), 8)
    assert e405.args[0] == "config = llama3_405b()" and "converters" not in e405.source    # the recipe's FP8 dropped
    llama2 = torchtitan_config(_titan_plan("llama2-ddp"), 8)
    assert llama2.args[0] == "config = llama3_8b()" and torchtitan_flavor(_titan_plan("llama2-ddp")) is None
    assert "_build_llama3_layers" in llama2.source and "b5bcd76c" in llama2.source    # the private helper, dated
    assert any("replicas" in n for n in llama2.notes) and any("tokenizer" in n for n in llama2.notes)
    assert torchtitan_flavor(_titan_plan("1b-shape")) == "1B"
    assert 'model_registry("1B")' in torchtitan_config(_titan_plan("1b-shape"), 8).source


@pytest.mark.parametrize("old,new", [
    ("config.parallelism.tensor_parallel_degree", "config.parallelism.tensor_parallel_degre"),
    ("config.training.num_tokens_per_train_step", "config.training.num_tokens_per_step"),
    ("from torchtitan.models.llama3.config_registry import llama3_70b", "from torchtitan.models.llama3.config_registry import llama3_70"),
    ("recipe_name=", "recipe="),
    ('"Interleaved1F1B"', '"Interleaved1F1b"'),
    ('"always"', '"allways"'),
    ('"rowwise"', '"tensorwise"'),
    ('model_registry("70B"', 'model_registry("70b"'),
    ("SelectiveAC.Config()", "SelectiveAC.Configs()"),
    ("config.activation_checkpoint = SelectiveAC.Config()", "config.activation_checkpoint = SelectiveAc.Config()"),
])
def test_a_misspelled_torchtitan_name_is_caught(old, new):
    """The name checks can fail: each misspelling of a name the 70B plan's recipe uses is a problem."""
    source = torchtitan_config(_titan_plan("70b-hsdp-fp8"), 8).source
    assert old in source
    assert titan_problems(source.replace(old, new)) != []


def test_a_misspelled_own_model_keyword_is_caught():
    source = torchtitan_config(_titan_plan("llama2-ddp"), 8).source
    for old, new in (("hidden_dim=", "ffn_dim="), ("num_embeddings=", "vocab="), ("_NORM_INIT", "_NORM_INITS")):
        assert old in source and titan_problems(source.replace(old, new)) != [], old


TITAN_REFUSED = {
    # name: (plan, the setting the message names, a word of the fix)
    "gpt3-layernorm": (dict(model="gpt3-1.3b", global_batch_size=64, tp=1, pp=1, dp=8, zero_stage=3), "normalization",
                       "--to megatron"),
    "mixtral-moe": (dict(model="mixtral-8x7b", seq_length=4096, global_batch_size=256, tp=2, pp=1, dp=16, ep=8,
                         sequence_parallel="true", zero_stage=3, recompute="full"), "num_experts", "not mapped"),
    "deepseek-mla": (dict(model="deepseek-v3", gpu="b200-hgx-180gb", global_batch_size=4096, tp=1, pp=16, dp=16, ep=8,
                          last_pipeline_num_layers=1, recompute="full", zero_stage=3), "multi_latent_attention", "MLA"),
    "zero1": (dict(model="llama3-8b", global_batch_size=256, tp=1, pp=1, dp=16, zero_stage=1, recompute="full"),
              "zero_stage", "zero_stage = 3"),
    "distributed-optimizer": (dict(model="llama3-8b", global_batch_size=256, tp=1, pp=1, dp=16, zero_stage=0,
                                   distributed_optimizer="true", recompute="full"), "zero_stage", "FSDP2"),
    "ddp-with-cp": (dict(model="llama3-8b", num_layers=8, global_batch_size=256, tp=1, pp=1, dp=8, cp=2,
                         cp_comm_type="all_gather", zero_stage=0, recompute="full"), "zero_stage", "dp_shard = 2"),
    "fp8-delayed": (dict(model="llama3-8b", global_batch_size=256, tp=1, pp=1, dp=16, zero_stage=3, precision="fp8",
                         fp8_recipe="delayed", recompute="full"), "fp8_recipe", "tensorwise"),
    "ring-cp": (dict(model="llama3-8b", global_batch_size=256, tp=1, pp=1, dp=8, cp=2, zero_stage=3, recompute="full"),
                "cp_comm_type", "all_gather"),
    "dp-shard-not-cp": (dict(model="llama3-8b", num_layers=8, global_batch_size=256, tp=1, pp=1, dp=4, cp=2,
                             cp_comm_type="all_gather", zero_stage=3, dp_shard=1, recompute="full"), "dp_shard",
                        "multiple of 2"),
    "tied-with-pp": (dict(model="llama3-8b", num_layers=16, hidden_size=2048, ffn_hidden_size=8192,
                          untie_embeddings_and_output_weights="false", global_batch_size=128, tp=1, pp=2, dp=4,
                          zero_stage=3, recompute="full"), "untie_embeddings_and_output_weights", "pp = 1"),
    "head-size": (dict(model="llama3-8b", kv_channels=64, global_batch_size=256, tp=1, pp=1, dp=16, zero_stage=3,
                       recompute="full"), "kv_channels", "head size"),
}


@pytest.mark.parametrize("name", sorted(TITAN_REFUSED))
def test_a_plan_torchtitan_cannot_run_as_priced_is_refused(name, tmp_path):
    plan, key, fix = TITAN_REFUSED[name]
    path = tmp_path / "plan.csv"
    pl.DataFrame([{**TITAN_BASE, **plan}]).write_csv(path)
    res = CliRunner().invoke(app, ["export", str(path), "--to", "torchtitan"])
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert f"{key} = " in text and "--to torchtitan" in text and fix in text, text


def test_the_architecture_refusals_name_their_setting():
    row = _titan_plan("8b-fsdp")
    for key, value in (("gated_mlp", False), ("position_embedding_type", "learned_absolute"), ("add_bias_linear", True),
                       ("normalization", "LayerNorm")):
        with pytest.raises(InputError, match=f"{key} = ") as info:
            torchtitan_config({**row, key: value}, 8)
        assert "RMSNorm, SwiGLU, RoPE" in str(info.value)
    with pytest.raises(InputError, match="distributed_optimizer = true"):     # a row that says ZeRO-1 that way
        torchtitan_config({**row, "zero_stage": 0, "distributed_optimizer": True}, 8)
    with pytest.raises(InputError, match="module"):
        torchtitan_config(row, 8, module="my-plan")


def test_cli_writes_a_torchtitan_recipe(tmp_path):
    path = tmp_path / "plan.csv"
    pl.DataFrame([{**TITAN_BASE, **TITAN_PLANS["70b-first-stage"][0]}]).write_csv(path)
    runner = CliRunner()
    recipe = tmp_path / "plan_70b.py"
    res = runner.invoke(app, ["export", str(path), "--to", "torchtitan", "-o", str(recipe)])
    assert res.exit_code == 0, res.output
    assert "torchtitan recipe plan_70b.vtrain_fast_plan() from llama3_70b()" in res.output
    assert "-m torchtitan.train --module plan_70b --config vtrain_fast_plan" in res.output
    source = recipe.read_text()
    assert titan_problems(source) == [] and "--module plan_70b" in source
    assert "pipeline_parallel_first_stage_less_layers = 4" in source
    for bad in ("run.sh", "my-plan.py", "class.py"):
        res = runner.invoke(app, ["export", str(path), "--to", "torchtitan", "-o", str(tmp_path / bad)])
        assert res.exit_code == 2 and "NAME.py" in res.output and "Traceback" not in res.output, bad
    res = runner.invoke(app, ["export", str(path), "--to", "torchtitan"])        # printed: the default module name
    assert res.exit_code == 0 and "--module vtrain_fast_recipe" in res.output
    assert "torchtitan" in runner.invoke(app, ["export", "--help"]).output


def test_readme_shows_the_recipe_the_export_writes(tmp_path):
    """README's torchtitan example (Exporting a plan) is this export's output for the plan it names."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    header = "model,gpu,global_batch_size,tp,pp,dp,micro_batch_size,zero_stage,recompute,sequence_parallel,tp_comm_overlap,use_flash_attn"
    values = "llama3-70b,h100-sxm-80gb,512,8,4,8,1,3,full,true,true,true"
    assert f"`{header}`\n/ `{values}`" in readme
    path = tmp_path / "plan.csv"
    path.write_text(f"{header}\n{values}\n")
    source = export(path, "torchtitan", module="plan_70b").source
    function = source[source.index("def vtrain_fast_plan"):]
    assert function in readme
    assert source.splitlines()[0] in readme and f"# run: {export(path, 'torchtitan', module='plan_70b').launcher}" in readme
