"""Launch arguments for one plan: ``vtrain-fast export`` (issue 14).

A plan is one row of a results folder or of an evaluate-style table (the columns of
:data:`vtrain_fast.io.schema.SCHEMA`). :func:`megatron_args` writes the Megatron-LM
``pretrain_gpt.py`` command line that runs it (the settings' flags from their registry record,
:mod:`vtrain_fast.model.settings`). The flags are checked in the tests against the flags
Megatron-LM's parser accepts at the commit named in ``tests/data/megatron_lm_args.txt``
(written from its source by ``tests/data/make_framework_args.py``), and :func:`bridge_overrides`
the same plan as Megatron-Bridge / NeMo 2 ``ConfigContainer`` overrides, checked against the keys
in ``tests/data/megatron_bridge_keys.txt``. torchtitan configurations are not written yet (issue 14).

What a plan holds that is not a framework argument (the assumed MoE load imbalance, the GPU
type, the cluster's price) is written as comments. Nothing here prices anything.
"""
from __future__ import annotations

import math
import shlex
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from ..io.errors import InputError
from ..model.settings import BY_NAME as SETTINGS

# The Megatron-LM commit whose argument names the exports use (tests/data/megatron_lm_args.txt),
# and the Megatron-Bridge (NeMo 2's training library) commit of the override keys
# (tests/data/megatron_bridge_keys.txt).
MEGATRON_LM_COMMIT = "d98e8a64ddf34856e74b24714e3bedb2f5a39553"
MEGATRON_BRIDGE_COMMIT = "067f987df03b8355b03192d88d70f1709fedf51a"
TARGETS = ("megatron", "bridge")
# Megatron-LM flags whose Megatron-Bridge ConfigContainer key is not ``model.<flag's field>``: the
# key, or None where the override list leaves it out (a tokenizer setting; implied by another key).
# Bridge's own names: megatron/bridge/training/config.py (train, ddp, optimizer),
# training/comm_overlap.py (comm_overlap), models/gpt_provider.py (model).
BRIDGE_KEYS = {
    "--micro-batch-size": "train.micro_batch_size", "--global-batch-size": "train.global_batch_size",
    "--train-iters": "train.train_iters",
    "--overlap-grad-reduce": "ddp.overlap_grad_reduce", "--overlap-param-gather": "ddp.overlap_param_gather",
    "--use-megatron-fsdp": "ddp.use_megatron_fsdp",
    "--data-parallel-sharding-strategy": "ddp.data_parallel_sharding_strategy",
    "--num-distributed-optimizer-instances": "ddp.num_distributed_optimizer_instances",
    "--tp-comm-overlap": "comm_overlap.tp_comm_overlap",
    "--overlap-moe-expert-parallel-comm": "comm_overlap.overlap_moe_expert_parallel_comm",
    "--num-experts": "model.num_moe_experts", "--swiglu": "model.gated_linear_unit",
    "--decoder-first-pipeline-num-layers": "model.num_layers_in_first_pipeline_stage",
    "--decoder-last-pipeline-num-layers": "model.num_layers_in_last_pipeline_stage",
    "--tokenizer-type": None, "--max-position-embeddings": None, "--group-query-attention": None,
    "--bf16": None, "--fp8-format": None, "--fp8-recipe": None,      # the mixed_precision recipe says them
}
# The Megatron-Bridge mixed-precision recipe (training/mixed_precision.py, registered by name) of a
# plan's precision and FP8 recipe.
BRIDGE_PRECISION = {("bf16", None): "bf16_mixed", ("fp8", "delayed"): "bf16_with_fp8_delayed_scaling_mixed",
                    ("fp8", "tensorwise"): "bf16_with_fp8_current_scaling_mixed",
                    ("fp8", "mxfp8"): "bf16_with_mxfp8_mixed"}


@dataclass(frozen=True)
class Export:
    """One plan's launch arguments.

    Attributes
    ----------
    target : str
        ``megatron`` (Megatron-LM flags) or ``bridge`` (Megatron-Bridge / NeMo 2 overrides).
    args : tuple of str
        The arguments, in order: flags and their values (``megatron``), ``key=value`` overrides
        (``bridge``).
    notes : tuple of str
        What the plan holds that no argument says (written as comments).
    launcher : str
        The ``torchrun`` line (nodes, GPUs per node) that starts it.
    """

    target: str
    args: tuple[str, ...]
    notes: tuple[str, ...]
    launcher: str

    def text(self) -> str:
        """The export as a shell script fragment (``megatron``: the notes as comments, then the launch
        line) or an override list, one ``key=value`` a line after the notes (``bridge``)."""
        if self.target == "bridge":
            return "\n".join([f"# {n}" for n in self.notes] + [f"# {self.launcher}"] + list(self.args)) + "\n"
        lines = ["#!/bin/sh"] + [f"# {n}" for n in self.notes]
        pairs, i = [], 0
        while i < len(self.args):
            if i + 1 < len(self.args) and not self.args[i + 1].startswith("--"):
                pairs.append(f"{self.args[i]} {shlex.quote(self.args[i + 1])}")
                i += 2
            else:
                pairs.append(self.args[i])
                i += 1
        lines.append(self.launcher + " pretrain_gpt.py \\")
        lines += [f"    {p} \\" for p in pairs[:-1]] + [f"    {pairs[-1]}"]
        return "\n".join(lines) + "\n"


def _get(row: dict, name: str):
    """``row[name]``, or the registry default of a setting the row's folder predates."""
    if name in row and row[name] is not None:
        return row[name]
    if name in SETTINGS:
        return SETTINGS[name].default
    return 0


def moe_layer_freq(num_layers: int, step: int, first_dense: int) -> str:
    """Megatron-LM's ``--moe-layer-freq`` for every ``step``-th layer from ``first_dense`` on: the int
    ``step`` when no layer is dense first, else the pattern text (``([0]*3+[1]*58)``)."""
    if first_dense == 0:
        return str(step)
    pattern = [1 if i >= first_dense and i % step == 0 else 0 for i in range(num_layers)]
    if step == 1:
        return f"([0]*{first_dense}+[1]*{num_layers - first_dense})"
    return "[" + ",".join(map(str, pattern)) + "]"


def _layers_per_virtual_stage(row: dict) -> int:
    """``--num-layers-per-virtual-pipeline-stage``: the layers (with the embedding and the loss where
    they count as layers) over pp x vpp chunks."""
    extra = int(bool(_get(row, "account_for_embedding_in_pipeline_split"))) + \
        int(bool(_get(row, "account_for_loss_in_pipeline_split")))
    return (int(row["num_layers"]) + extra) // (int(row["pp"]) * int(_get(row, "vpp")))


def megatron_args(row: dict, gpus_per_node: int, extra_notes=()) -> Export:
    """The Megatron-LM ``pretrain_gpt.py`` arguments of a plan.

    Parameters
    ----------
    row : dict
        One plan: column name -> value (a results folder's or evaluate's columns).
    gpus_per_node : int
        GPUs per node of its cluster (the ``torchrun --nproc-per-node``).
    extra_notes : sequence of str
        More comments (how the plan was picked: :func:`read_plan`).

    Returns
    -------
    Export
        Flags named as Megatron-LM names them at :data:`MEGATRON_LM_COMMIT`.
    """
    g = lambda k: _get(row, k)      # noqa: E731
    L, h, a, qg = int(row["num_layers"]), int(row["hidden_size"]), int(row["num_attention_heads"]), int(row["num_query_groups"])
    a_ = ["--num-layers", str(L), "--hidden-size", str(h), "--num-attention-heads", str(a),
          "--ffn-hidden-size", str(int(row["ffn_hidden_size"])), "--seq-length", str(int(row["seq_length"])),
          "--max-position-embeddings", str(int(row["seq_length"])),
          "--tokenizer-type", "NullTokenizer", "--vocab-size", str(int(row["vocab_size"]))]
    notes = [f"vtrain-fast export: the plan as Megatron-LM (NVIDIA/Megatron-LM {MEGATRON_LM_COMMIT[:8]}) runs it; "
             "add your data, tokenizer, optimizer and checkpoint arguments",
             f"priced on {row.get('gpu', '?')}: {row.get('iteration_time_s', float('nan')):.4g} s per iteration predicted"]
    notes += list(extra_notes)
    mla = bool(g("multi_latent_attention"))
    if qg != a and not mla:
        a_ += ["--group-query-attention", "--num-query-groups", str(qg)]
    kv = int(g("kv_channels"))
    if kv and not mla and (h % a or kv != h // a):
        a_ += ["--kv-channels", str(kv)]
    if bool(g("gated_mlp")):
        a_ += ["--swiglu"]
    if g("normalization") == "RMSNorm":
        a_ += ["--normalization", "RMSNorm"]
    if g("position_embedding_type") == "rope":
        a_ += ["--position-embedding-type", "rope"]
    if not bool(row.get("add_bias_linear", True)):
        a_ += ["--disable-bias-linear"]
    if bool(g("untie_embeddings_and_output_weights")):
        a_ += ["--untie-embeddings-and-output-weights"]
    experts = int(g("num_experts"))
    if experts:
        a_ += ["--num-experts", str(experts), "--moe-router-topk", str(int(g("moe_router_topk"))), "--moe-grouped-gemm",
               "--moe-layer-freq", moe_layer_freq(L, int(g("moe_layer_step")) or 1, int(g("moe_first_dense_layers")))]
        if int(g("moe_ffn_hidden_size")):
            a_ += ["--moe-ffn-hidden-size", str(int(g("moe_ffn_hidden_size")))]
        if int(g("moe_shared_expert_intermediate_size")):
            a_ += ["--moe-shared-expert-intermediate-size", str(int(g("moe_shared_expert_intermediate_size")))]
        a_ += ["--moe-token-dispatcher-type", str(g("moe_token_dispatcher_type"))]
        if bool(g("overlap_moe_expert_parallel_comm")):
            a_ += ["--overlap-moe-expert-parallel-comm"]
        if float(g("moe_expert_capacity_factor")) > 0.0:
            a_ += ["--moe-expert-capacity-factor", f"{float(g('moe_expert_capacity_factor')):g}"]
            if bool(g("moe_pad_expert_input_to_capacity")):
                a_ += ["--moe-pad-expert-input-to-capacity"]
        if float(g("moe_load_imbalance")) != 1.0:
            notes.append(f"priced with the busiest expert at {float(g('moe_load_imbalance')):g} x the mean "
                         "(moe_load_imbalance, an assumption: no framework argument)")
    if mla:
        a_ += ["--multi-latent-attention"]
        if int(g("q_lora_rank")):
            a_ += ["--q-lora-rank", str(int(g("q_lora_rank")))]
        a_ += ["--kv-lora-rank", str(int(g("kv_lora_rank"))), "--qk-head-dim", str(int(g("qk_head_dim"))),
               "--qk-pos-emb-head-dim", str(int(g("qk_pos_emb_head_dim"))), "--v-head-dim", str(int(g("v_head_dim")))]
    # the plan
    tp, pp, cp = int(row["tp"]), int(row["pp"]), int(row["cp"]) if row.get("cp") is not None else 1
    a_ += ["--tensor-model-parallel-size", str(tp), "--pipeline-model-parallel-size", str(pp),
           "--context-parallel-size", str(cp)]
    if experts:
        a_ += ["--expert-model-parallel-size", str(int(g("ep")))]
        if int(g("etp")):
            a_ += ["--expert-tensor-parallel-size", str(int(g("etp")))]
    if pp > 1 and int(g("vpp")) > 1:
        a_ += ["--num-layers-per-virtual-pipeline-stage", str(_layers_per_virtual_stage(row))]
        if not bool(g("overlap_p2p_comm")):
            a_ += [SETTINGS["overlap_p2p_comm"].megatron]        # Megatron-core overlaps them by default
    for name in ("first_pipeline_num_layers", "last_pipeline_num_layers"):
        if pp > 1 and int(g(name)):
            a_ += [SETTINGS[name].megatron, str(int(g(name)))]
    for name in ("account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split"):
        if pp > 1 and bool(g(name)):
            a_ += [SETTINGS[name].megatron]
    if cp > 1:
        a_ += [SETTINGS["cp_comm_type"].megatron, str(g("cp_comm_type"))]
    steps = row.get("num_steps")
    a_ += ["--micro-batch-size", str(int(row["micro_batch_size"])), "--global-batch-size", str(int(row["global_batch_size"]))]
    if steps is not None and not (isinstance(steps, float) and math.isnan(steps)):
        a_ += ["--train-iters", str(int(steps))]
    # precision
    a_ += ["--bf16"]
    if g("precision") == "fp8":
        a_ += [SETTINGS["precision"].megatron, "hybrid", SETTINGS["fp8_recipe"].megatron, str(g("fp8_recipe"))]
        start, end = int(g("num_layers_at_start_in_bf16")), int(g("num_layers_at_end_in_bf16"))
        if start or end:
            a_ += ["--first-last-layers-bf16", SETTINGS["num_layers_at_start_in_bf16"].megatron, str(start),
                   SETTINGS["num_layers_at_end_in_bf16"].megatron, str(end)]
    # attention kernel: TE's FlashAttention, or Megatron-core's own attention (the unfused path the
    # cost model times without use_flash_attn)
    a_ += ["--attention-backend", "flash" if bool(g("use_flash_attn")) else "local"]
    # recomputation
    rc = str(row.get("recompute", "none"))
    if rc == "full":
        a_ += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    elif rc == "selective":
        a_ += ["--recompute-granularity", "selective"]     # Megatron-core's default modules: core_attn
    # switches named by their registry record
    for name in ("sequence_parallel", "tp_comm_overlap", "overlap_grad_reduce", "overlap_param_gather"):
        if bool(g(name)) and not (name in ("sequence_parallel", "tp_comm_overlap") and tp == 1):
            a_ += [SETTINGS[name].megatron]
    zero = int(g("zero_stage"))
    if zero >= 2:
        a_ += ["--use-megatron-fsdp", SETTINGS["zero_stage"].megatron, ("optim_grads", "optim_grads_params")[zero - 2]]
    elif zero == 1 or bool(g("distributed_optimizer")):
        a_ += [SETTINGS["distributed_optimizer"].megatron]
    shard = int(g("dp_shard"))
    if shard and zero >= 1:
        a_ += [SETTINGS["dp_shard"].megatron, str(int(row["dp"]) * cp // shard)]
    if tp > 1 and not bool(g("sequence_parallel")):
        notes.append("async_tensor_model_parallel_allreduce: no flag in Megatron-core, whose TP linears always overlap "
                     "the backward all-reduce; " + ("priced so" if bool(g("async_tensor_model_parallel_allreduce")) else
                                                    "priced without it (exposed), so this run may be faster than priced"))
    nodes = int(row.get("num_nodes") or math.ceil(int(row["num_gpus"]) / gpus_per_node))
    launcher = f"torchrun --nnodes {nodes} --nproc-per-node {min(gpus_per_node, int(row['num_gpus']))}"
    return Export("megatron", tuple(a_), tuple(notes), launcher)


def _bridge_value(value: str) -> str:
    """A Megatron-LM flag value as a Hydra-style override value: Megatron-LM's ``--moe-layer-freq``
    pattern text as the list it evaluates to (``([0]*3+[1]*58)`` -> ``[0,0,0,1,...]``)."""
    from ..model.moe import parse_layer_pattern
    if value.startswith("(") or value.startswith("["):
        pattern = parse_layer_pattern(value)
        if pattern is not None:
            return "[" + ",".join(map(str, pattern)) + "]"
    return value


def bridge_overrides(row: dict, gpus_per_node: int, extra_notes=()) -> Export:
    """The plan as Megatron-Bridge (NeMo 2's training library) ``ConfigContainer`` overrides,
    ``section.field=value`` (Hydra style, as Megatron-Bridge's ``scripts/performance`` and recipes take
    them): each flag of :func:`megatron_args` under its Bridge key (:data:`BRIDGE_KEYS`, else
    ``model.<the flag's field>``, Megatron-core's ``TransformerConfig`` name), switches as ``=true``,
    ``--disable-bias-linear`` as ``model.add_bias_linear=false``, ``--untie-embeddings-and-output-weights``
    as ``model.share_embeddings_and_output_weights=false``, ``--no-overlap-p2p-communication`` as
    ``model.overlap_p2p_comm=false``, vpp as ``model.virtual_pipeline_model_parallel_size``, the distributed
    optimizer in ``ddp`` and ``optimizer``, and the precision as a ``mixed_precision`` recipe
    (:data:`BRIDGE_PRECISION`). Keys are Megatron-Bridge's at :data:`MEGATRON_BRIDGE_COMMIT`.

    Returns
    -------
    Export
        ``key=value`` strings; the notes say what an override cannot (the activation function of a
        SwiGLU model: start from a SwiGLU recipe; the tokenizer).
    """
    m = megatron_args(row, gpus_per_node, extra_notes)
    flags, i = [], 0
    while i < len(m.args):
        value = m.args[i + 1] if i + 1 < len(m.args) and not m.args[i + 1].startswith("--") else None
        flags.append((m.args[i], value))
        i += 2 if value is not None else 1
    out = []
    for flag, value in flags:
        if flag == "--disable-bias-linear":
            out.append("model.add_bias_linear=false")
        elif flag == "--untie-embeddings-and-output-weights":
            out.append("model.share_embeddings_and_output_weights=false")
        elif flag == "--no-overlap-p2p-communication":
            out.append("model.overlap_p2p_comm=false")
        elif flag == "--num-layers-per-virtual-pipeline-stage":
            out.append(f"model.virtual_pipeline_model_parallel_size={int(_get(row, 'vpp'))}")
        elif flag == "--use-distributed-optimizer":
            out += ["ddp.use_distributed_optimizer=true", "optimizer.use_distributed_optimizer=true"]
        else:
            key = BRIDGE_KEYS.get(flag, "model." + flag[2:].replace("-", "_"))
            if key is not None:
                out.append(f"{key}={'true' if value is None else _bridge_value(value)}")
    fp8 = _get(row, "precision") == "fp8"
    out.append("mixed_precision=" + BRIDGE_PRECISION[("fp8", str(_get(row, "fp8_recipe"))) if fp8 else ("bf16", None)])
    notes = [f"vtrain-fast export: the plan as Megatron-Bridge / NeMo 2 ConfigContainer overrides (NVIDIA-NeMo/"
             f"Megatron-Bridge {MEGATRON_BRIDGE_COMMIT[:8]}); start from your model's recipe and add these"]
    notes += [n for n in m.notes if not n.startswith("vtrain-fast export")]
    if ("--swiglu", None) in flags:
        notes.append("SwiGLU: model.gated_linear_unit=true needs model.activation_func = silu, which an override "
                     "cannot set: start from a SwiGLU recipe (Llama, Qwen, Mixtral, DeepSeek)")
    notes.append("tokenizer: the plan is priced with vocab_size above; set your tokenizer in the recipe")
    return Export("bridge", tuple(out), tuple(notes), m.launcher)


def read_plan(source: str | Path, where=(), row: int | None = None, models: dict | None = None) -> tuple[dict, int, tuple]:
    """One plan from ``source``: a results folder (its feasible rows, :func:`~vtrain_fast.analysis.query.feasible_plans`,
    with ``where`` conditions), or a ``.csv`` / ``.parquet`` table of plans (evaluated first, so that
    every column is filled and checked). With several rows, ``row`` picks one of them in order of
    ``cost_usd`` (0: the cheapest); without ``row`` a single row is needed.

    Returns
    -------
    (dict, int, tuple of str)
        The plan's columns, the GPUs per node of its cluster, and a note when it was picked among
        several jobs (models or token budgets).

    Raises
    ------
    InputError
        Not a results folder or a table; no feasible row; several rows and no ``row``; ``row`` out
        of range.
    """
    from ..hardware.gpus import PRESETS
    from ..io.writer import read_manifest
    from .evaluate import evaluate_frame, read_csv, without_earlier_results
    from .query import DEFAULT_MEMORY_MARGIN, feasible_plans, where_filter, with_cluster_columns, with_memory_headroom
    path = Path(source)
    if path.is_dir():
        where_filter("command line", where)
        df = feasible_plans(path, where=list(where)).collect()
        manifest = read_manifest(path)
        df = with_cluster_columns(df, manifest)
        df = with_memory_headroom(df.lazy(), manifest, DEFAULT_MEMORY_MARGIN).collect()
    elif path.suffix.lower() in (".csv", ".parquet", ".pq"):
        # a table of earlier results (pareto -o, evaluate -o, plan -o) is priced again from its inputs
        plans, _ = without_earlier_results(read_csv(path))
        priced = evaluate_frame(plans, str(path), models=models)
        df = priced.filter(pl.col("status") == "ok")
        if df.height == 0:
            counts = ", ".join(f"{k} {v}" for k, v in priced["status"].value_counts().sort("status").rows())
            raise InputError(str(path), "plans", priced.height, "at least one plan of status ok",
                             f"its plans are {counts} (`vtrain-fast evaluate` shows why): change the plan "
                             "(more GPUs, recomputation, ...)")
        if where:
            raise InputError(str(path), "--where", list(where), "--where with a results folder only",
                             "pick the row with --row K (0 = the cheapest ok row)")
    else:
        raise InputError(str(path), "PLAN", str(source), "a results folder, or a .csv / .parquet table of plans",
                         "run `vtrain-fast sweep` first, or write the plan's columns as for `vtrain-fast evaluate`")
    if df.height == 0:
        raise InputError(str(path), "plans", 0, "at least one feasible plan (status ok)",
                         "relax --where" if where else "the folder has no feasible plan: sweep other plans")
    if "memory_tight" not in df.columns and "gpu" in df.columns and "memory_per_gpu_GiB" in df.columns:
        df = with_memory_headroom(df.lazy(), {"gpus": {g: None for g in df["gpu"].unique().to_list()}},
                                  DEFAULT_MEMORY_MARGIN).collect()
    if "cost_usd" in df.columns:
        df = df.sort("cost_usd")
    if row is None and df.height > 1:
        raise InputError(str(path), "plans", df.height, "one plan",
                         "narrow it with --where (e.g. 'tp==8', 'num_gpus==1024'), or pick one with --row K "
                         "(0 = the cheapest of them)")
    k = row or 0
    if not 0 <= k < df.height:
        raise InputError(str(path), "--row", k, f"0 to {df.height - 1}", "pick a row that exists")
    plan = df.row(k, named=True)
    jobs = [c for c in ("model", "num_tokens") if c in df.columns and df[c].n_unique() > 1]
    notes = tuple(f"picked among plans of {' and '.join(f'{df[c].n_unique()} {c} values' for c in jobs)} "
                  f"(cheapest first); narrow with --where, e.g. '{jobs[0]}=={plan[jobs[0]]}'" for _ in jobs[:1])
    if plan.get("memory_tight"):
        notes += (f"memory: {plan['memory_per_gpu_GiB']:.1f} GiB per GPU, {plan['memory_headroom_GiB']:.1f} GiB left: "
                  f"within {DEFAULT_MEMORY_MARGIN:.0%} of the GPU's HBM (tight: allocator fragmentation or larger NCCL "
                  "buffers may not fit; pick a plan with more headroom, e.g. `vtrain-fast pareto --memory-margin`)",)
    gpu = plan.get("gpu")
    gpn = int(plan.get("gpus_per_node") or (PRESETS[gpu].gpus_per_node if gpu in PRESETS else 8))
    return plan, gpn, notes


def export(source: str | Path, to: str, where=(), row: int | None = None, models: dict | None = None) -> Export:
    """The launch arguments of one plan of ``source`` (:func:`read_plan`) for framework ``to``
    (:data:`TARGETS`).

    Raises
    ------
    InputError
        An unknown target, or as :func:`read_plan`.
    """
    if to not in TARGETS:
        raise InputError("command line", "--to", to, " or ".join(TARGETS),
                         "megatron: Megatron-LM pretrain_gpt.py flags; bridge: Megatron-Bridge / NeMo 2 "
                         "ConfigContainer overrides (torchtitan: not written yet)")
    plan, gpn, notes = read_plan(source, where, row, models)
    return (megatron_args if to == "megatron" else bridge_overrides)(plan, gpn, notes)
