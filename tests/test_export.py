"""`vtrain-fast export` (issue 14): one plan's Megatron-LM launch flags, every one a flag Megatron-LM's
parser accepts at the pinned commit (tests/data/megatron_lm_args.txt, written from its source by
tests/data/make_framework_args.py), with the plan's values read back from them."""
from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from vtrain_fast.analysis.evaluate import evaluate_frame
from vtrain_fast.analysis.export import (MEGATRON_BRIDGE_COMMIT, MEGATRON_LM_COMMIT, bridge_overrides, export,
                                        megatron_args, moe_layer_freq)
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
