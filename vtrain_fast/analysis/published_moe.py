"""Validation against published mixture-of-experts training runs
(``vtrain_fast/data/published/moe_runs.csv``: 203 measured MoE pretraining configurations of 5
public sources; ``MOE_README.md`` there gives the columns, sources, conversions and caveats).

Held out entirely: nothing is fitted to these rows (no stack calibration, no MoE constant tuned to
them); every row is priced with the shipped calibration. The machinery is
:mod:`.published`'s (CSV reading, GPU maps, :class:`~.published.Stack` records, the metric
conversions, :func:`~.published.with_errors`, :func:`~.published.summary`,
:func:`~.published.reason_counts`); what differs is the MoE table's columns and sources.

Per row, one reason at most (:func:`not_priced_reason`, the first that applies):

* the model has no preset (Nemotron 3, Kimi K2, DeepSeek-V4 Flash, DeepSeek-V2);
* the kernels refuse the preset: the refusal is theirs, read from
  :func:`vtrain_fast.plan.models.check_priced` (``model/moe.py`` ``unpriced_reason``) at run
  time, never from a list here, so a model the kernels learn (kv_channels heads, MLA) is priced
  by the next run without a change here;
* no GPU preset, a precision the model does not have (NVFP4), a token-dropping run whose
  capacity factor is not stated (the kernels price dropless routing), a plan value the source
  does not state (ep, micro-batch, GPU count), the metric not convertible;
* the evaluation refuses the plan (``evaluate``'s own message), or prices it infeasible (its
  status).

The plan of a priced row: the preset named in the CSV, the row's stated sizes and batch, and
for what the table does not state the defaults of the row's software stack (:data:`STACKS`,
``basis`` says where each comes from; ``assumptions`` per row lists them).
"""
from __future__ import annotations

import polars as pl

from ..io.errors import InputError
from ..model.settings import SETTINGS, unmet_requirements
from ..plan.models import MODEL_PRESETS, check_priced
from . import published as P
from .evaluate import evaluate_frame

CSV_NAME = "moe_runs.csv"
INT_COLUMNS = ("seq_len", "global_batch_size", "micro_batch_size", "grad_accum", "tp", "pp", "dp", "cp",
               "virtual_pp", "ep", "etp", "edp", "fsdp", "num_gpus", "num_experts", "moe_router_topk")
FLOAT_COLUMNS = ("params_b_total", "params_b_active", "measured_value", "reported_model_tflops_per_gpu",
                 "iteration_time_s_derived")
HELD_OUT_NOTE = ("held out: no MoE fitting or calibration; every row priced with the shipped calibration "
                 "(the GPU presets' published values)")


def load_runs() -> list[dict]:
    """The rows of ``moe_runs.csv`` as dicts (:func:`.published._read_csv_rows`: whole-number
    and float columns parsed, empty cells ``None``, ``source_key`` the id's prefix)."""
    return P._read_csv_rows(CSV_NAME, INT_COLUMNS, FLOAT_COLUMNS)


# ------------------------------------------------------------------------------ stacks
# Megatron-Bridge's resolved performance-recipe configuration (ConfigContainer dump), e.g.
# scripts/performance/dryrun_configs/qwen/qwen3_235b_a22b_pretrain_gb200_nvfp4_v2.yaml at
# NVIDIA-NeMo/Megatron-Bridge commit a9497c6b: ddp.use_distributed_optimizer, overlap_grad_reduce,
# overlap_param_gather true; model.expert_tensor_parallel_size 1; recompute_granularity null;
# overlap_p2p_comm false (batch_p2p_comm true); account_for_embedding_in_pipeline_split and
# account_for_loss_in_pipeline_split true; transformer_impl transformer_engine (fused attention);
# comm_overlap.tp_comm_overlap true; moe_router_force_load_balancing true.
_MBRIDGE = dict(distributed_optimizer=True, overlap_grad_reduce=True, overlap_param_gather=True, use_flash_attn=True,
                async_tensor_model_parallel_allreduce=True, tp_comm_overlap=True, overlap_p2p_comm=False,
                etp=1, grad_reduce_in_bf16=True)
# counted where the layers alone do not split evenly (Qwen3-235B's 94 + 2 = 96 over pp 8 x vpp 4); the
# recipes of models whose layers split evenly (gpt-oss-120b: 36 over pp 4) leave them off
_SPLIT = dict(account_for_embedding_in_pipeline_split=True, account_for_loss_in_pipeline_split=True)
# DeepSeek-V3's Megatron-Bridge pipeline layouts without interleaving (NVIDIA-NeMo/Megatron-Bridge commit
# 067f987d, src/megatron/bridge/recipes/deepseek/h100/deepseek_v3.py _get_deepseek_v3_pipeline_layout, which
# every DeepSeek-V3 recipe calls): the 61 layers even over the stages but the last, which holds
# the rest with the MTP module and the loss: pp -> the last stage's decoder layers. The layouts with
# vpp > 1 are per model chunk (only the last chunk short), which the kernels' per-stage split cannot state.
_DSV3_LAST_STAGE_LAYERS = {4: 13, 8: 5, 16: 1}
_NEMO2 = dict(distributed_optimizer=True, overlap_grad_reduce=True, overlap_param_gather=True, use_flash_attn=True,
              async_tensor_model_parallel_allreduce=True, tp_comm_overlap=True, overlap_p2p_comm=True)

STACKS: dict[str, P.Stack] = {
    "mbridge": P.Stack(
        "Megatron-Bridge perf summary", "Megatron-Bridge performance recipes (Megatron-core), NeMo 25.09-26.08",
        _MBRIDGE,
        "the resolved performance-recipe config at NVIDIA-NeMo/Megatron-Bridge a9497c6b "
        "(scripts/performance/dryrun_configs/qwen/qwen3_235b_a22b_pretrain_gb200_nvfp4_v2.yaml): distributed "
        "optimizer with overlapped grad reduce and param gather, etp = 1, no recompute, overlap_p2p_comm false, "
        "embedding and loss counted in the pipeline split where the layers alone do not split evenly over pp x vpp "
        "(the Qwen3-235B recipe: 94 + 2 = 96 over 8 x 4; gpt-oss-120b's 36 over pp 4 split evenly), TE fused attention, tp_comm_overlap; sequence "
        "parallelism with tp > 1 (MOE_README: Qwen3-235B H100 recipe 'SP on'); fsdp > 0 rows are Megatron-FSDP "
        "(zero_stage 3); gradients reduced in bf16 (grad_reduce_in_bf16: the performance configs' "
        "set_<family>_common_configs set mixed_precision and ddp grad_reduce_in_fp32 = False, "
        "scripts/performance/configs/{qwen,deepseek,gpt_oss}/*_llm_pretrain.py at a9497c6b). The recipe of the "
        "current release only: older releases' recipes are not recorded (MOE_README)"),
    "automodel": P.Stack(
        "NeMo AutoModel perf summary", "NeMo AutoModel (PyTorch FSDP2 + EP, TE, DeepEP)",
        dict(use_flash_attn=True, zero_stage=3, etp=1),
        "FSDP2 full sharding = zero_stage 3 (the page's FSDP column is the sharding degree = dp); TE attention; "
        "no tensor parallelism on any row (tp = 1, so etp = 1); no Megatron TP / pipeline overlap setting applies; "
        "recompute none (not stated)"),
    "nemo2502": P.Stack(
        "NeMo 25.02 perf summary", "NeMo 2.0 (Megatron-core), 25.02", dict(_NEMO2),
        "NeMo 2.0 performance recipes (Megatron-core): distributed optimizer with overlapped grad and param "
        "sync, TE fused attention, overlap_p2p_comm with vpp; etp unset = tp (Megatron-core's default); "
        "FP8 recipe not stated: Transformer Engine's default (delayed scaling); recompute none (not stated)"),
    "nemo2504": P.Stack(
        "NeMo 25.04 perf summary", "NeMo 2.0 (Megatron-core), 25.04", dict(_NEMO2),
        "as NeMo 25.02; the 25.04 page states FP8 'per-tensor current scaling' (fp8_recipe tensorwise)"),
    "deepseekv3": P.Stack(
        "DeepSeek-V3 report", "DeepSeek HAI-LLM (DualPipe), priced as the closest Megatron-core plan",
        dict(distributed_optimizer=True, use_flash_attn=True, etp=1),
        "an assumption, not DeepSeek's stack: their own framework with DualPipe (computation-communication "
        "overlap of forward and backward chunks) and their own all-to-all kernels is not modelled; priced as "
        "Megatron-core's 1F1B with the stated tp 1, pp 16, ep 64, dp 128 and ZeRO-1 (distributed optimizer), "
        "TE fused attention; what the report does not state is filled: micro-batch 1, the 61 layers as 3 on the "
        "first stage, 2 on the last and 4 on each other (Megatron-core's uneven first/last stages; DualPipe's "
        "split is not stated), FP8 as TE's per-tensor current scaling (DeepSeek's 1x128 / 128x128 block scaling "
        "has no recipe here), recompute none (theirs recomputes only RMSNorm and the MLA up projections), "
        "the multi-token-prediction module not priced"),
    "deepseekv2": P.Stack("DeepSeek-V2 report", "DeepSeek HAI-LLM", {}, "not priced (no preset, no GPU count)"),
}

GPU_PRESETS: tuple[P.GPUMap, ...] = (
    P.GPUMap(("gb300",), "gb300-nvl72-279gb", {}, "GB300 NVL72 (72 GPUs per NVLink domain)"),
    P.GPUMap(("gb200",), "gb200-nvl72-186gb", {}, "GB200 NVL72 (72 GPUs per NVLink domain)"),
    P.GPUMap(("b300",), "b300-hgx-270gb", {}, "DGX B300 (8 GPUs per node)"),
    P.GPUMap(("b200",), "b200-hgx-180gb", {}, "DGX B200 (8 GPUs per node)"),
    P.GPUMap(("h100",), "h100-sxm-80gb", {}, "DGX H100 (H100 SXM5 80 GB, 8 per node)"),
    P.GPUMap(("h800",), "h800-sxm-80gb", {}, "H800 SXM5 80 GB, 8 per node (DeepSeek's cluster)"),
)
# Plan values a stack fills where its source does not state them (an assumption each, listed in the
# row's assumptions; DeepSeek-V3: see its Stack's basis).
STACK_FILLS: dict[str, dict] = {
    "deepseekv3": dict(micro_batch_size=1, first_pipeline_num_layers=3, last_pipeline_num_layers=2),
}


def gpu_preset(name: str | None) -> P.GPUMap | None:
    """The :data:`GPU_PRESETS` entry of a CSV GPU name (GB300 before B300: the names nest)."""
    return P.gpu_preset(name, GPU_PRESETS)


def precision(row: dict) -> tuple[str, str] | None:
    """``(precision, fp8_recipe)`` of the row's precision cell, or ``None`` (not modelled):
    mxfp8 / fp8-mx -> fp8 with mxfp8; fp8-cs -> fp8 tensorwise (current scaling); fp8 -> fp8
    with the stack's recipe (tensorwise on the pages that say per-tensor current scaling:
    Megatron-Bridge and NeMo 25.04; delayed for NeMo 25.02); bf16 -> bf16."""
    v = (row.get("precision") or "").lower().split(" (")[0].strip()
    if v in ("mxfp8", "fp8-mx"):
        return "fp8", "mxfp8"
    if v == "fp8-cs":
        return "fp8", "tensorwise"
    if v == "fp8":
        return "fp8", "delayed" if row["source_key"] == "nemo2502" else "tensorwise"
    if v == "bf16":
        return "bf16", "delayed"
    return None


def measured_iteration_time(row: dict) -> tuple[float, str]:
    """Seconds per iteration from the headline (MOE_README, 'Converting'): tokens/s/GPU ->
    ``GBS seq / (tokens/s/GPU x GPUs)``; iteration_time_s as measured.

    Raises
    ------
    published.NotConvertible
        A metric without a conversion, or an input the source does not state.
    """
    fn = P.CONVERSIONS.get(("*", row["measured_metric"]))
    if fn is None:
        raise P.NotConvertible(f"no conversion of {row['measured_metric']}")
    return fn(row)


# ------------------------------------------------------------------------------ reasons
def model_refusal(preset: str) -> str | None:
    """The kernels' refusal of a preset (:func:`~vtrain_fast.plan.models.check_priced`, the check
    ``evaluate`` runs), one line, or ``None`` when they price it."""
    try:
        check_priced(CSV_NAME, "model", MODEL_PRESETS[preset], "")
    except InputError as e:
        return e.allowed.removeprefix("a model the cost model prices: ").replace("; ", ", ")
    return None


def _r_preset(row):
    if row.get("preset") is None:
        return f"no model preset for {row['model']} (architecture not in models.toml)"
    if row["preset"] not in MODEL_PRESETS:
        return f"preset {row['preset']!r} not in models.toml"


def _r_refused(row):
    return model_refusal(row["preset"])


def _r_gpu(row):
    if gpu_preset(row.get("gpu")) is None:
        return f"GPU {row.get('gpu')!r}: no preset"


def _r_precision(row):
    if precision(row) is None:
        return f"precision {row.get('precision')!r} not modelled"


def _r_token_drop(row):
    routing = (row.get("routing") or "").lower()
    if "drop" in routing and "dropless" not in routing:
        return "token-dropping routing with its capacity factor not stated (the kernels price dropless routing)"


def _r_unstated(row):
    fills = STACK_FILLS.get(row["source_key"], {})
    missing = [c for c in ("num_gpus", "tp", "pp", "dp", "ep", "micro_batch_size", "global_batch_size", "seq_len")
               if row.get(c) is None and c not in fills]
    if missing:
        return ", ".join(missing) + " not stated"


def _r_metric(row):
    try:
        measured_iteration_time(row)
    except P.NotConvertible as e:
        return str(e)


# In order: what the model lacks, then what the source does not state, then the metric.
RULES = (_r_preset, _r_refused, _r_gpu, _r_precision, _r_token_drop, _r_unstated, _r_metric)


def unexpressible_reason(row: dict) -> str | None:
    """The first :data:`RULES` reason why ``row`` cannot be priced (one line), or ``None``."""
    for rule in RULES:
        r = rule(row)
        if r:
            return r
    return None


# ------------------------------------------------------------------------------ plans
def plan_row(row: dict) -> tuple[dict, str]:
    """The ``evaluate`` plan of an expressible row and its assumptions (what the stack fills)."""
    stack = STACKS[row["source_key"]]
    prec, recipe = precision(row)
    settings = dict(stack.settings)
    tp = row["tp"]
    settings["sequence_parallel"] = tp > 1
    if row["source_key"] == "mbridge":
        if (row.get("fsdp") or 0) > 0:
            settings["zero_stage"] = 3
        chunks = row["pp"] * (row.get("virtual_pp") or 1)
        if row["preset"] == "deepseek-v3" and (row.get("virtual_pp") or 1) == 1 and row["pp"] in _DSV3_LAST_STAGE_LAYERS:
            settings["last_pipeline_num_layers"] = _DSV3_LAST_STAGE_LAYERS[row["pp"]]
        elif row["pp"] > 1 and MODEL_PRESETS[row["preset"]].num_layers % chunks:
            settings |= _SPLIT
    values = {s.name: s.default for s in SETTINGS} | settings
    for st, _, _ in unmet_requirements(values):
        settings[st.name] = st.default
    etp = settings.pop("etp", 0)
    assumed = [f"stack defaults: {stack.label}", f"etp = {etp or 'tp'}", "recompute none",
               f"sequence_parallel {str(tp > 1).lower()}", "alltoall dispatch, not overlapped (no DeepEP / "
               "a2a overlap)", "imbalance factor 1"]
    if settings.get("zero_stage") == 3:
        assumed.append("zero_stage 3 (FSDP)")
    if "last_pipeline_num_layers" in settings and row["preset"] == "deepseek-v3" and row["source_key"] == "mbridge":
        assumed.append(f"the recipe's pipeline layout: last stage {settings['last_pipeline_num_layers']} layers "
                       "(its MTP module not priced)")
    if prec == "fp8":
        assumed.append(f"fp8_recipe {recipe}")
    fills = {k: v for k, v in STACK_FILLS.get(row["source_key"], {}).items() if row.get(k) is None}
    assumed += [f"{k} {v}" for k, v in fills.items()]
    settings |= {k: v for k, v in fills.items() if k != "micro_batch_size"}
    plan = dict(id=row["id"], model=row["preset"], seq_length=row["seq_len"],
                global_batch_size=row["global_batch_size"],
                micro_batch_size=row["micro_batch_size"] or fills.get("micro_batch_size"),
                tp=tp, cp=row.get("cp") or 1, pp=row["pp"], dp=row["dp"], vpp=row.get("virtual_pp") or 1,
                ep=row["ep"], etp=etp, num_gpus=row["num_gpus"], gpu=gpu_preset(row["gpu"]).preset,
                recompute="none", precision=prec, fp8_recipe=recipe,
                **{k: str(v).lower() if isinstance(v, bool) else v for k, v in settings.items()})
    return plan, "; ".join(assumed)


def plan_frame(rows: list[dict]) -> pl.DataFrame:
    """``evaluate`` plans of expressible rows (``id`` and ``model``, the preset, as labels)."""
    return pl.DataFrame([plan_row(r)[0] for r in rows], infer_schema_length=None)


def _evaluate(rows: list[dict], calibration: dict | None) -> tuple[pl.DataFrame | None, dict]:
    """Priced rows (one frame) and, per row ``evaluate`` refuses, its message. The whole frame
    first; when ``evaluate`` refuses it, row by row to find the refused ones."""
    if not rows:
        return None, {}
    try:
        return evaluate_frame(plan_frame(rows), CSV_NAME, calibration), {}
    except InputError:
        pass
    ok, refused = [], {}
    for r in rows:
        try:
            evaluate_frame(plan_frame([r]), CSV_NAME, calibration)
            ok.append(r)
        except InputError as e:
            refused[r["id"]] = "evaluate refuses the plan: " + str(e).replace("\n", " ").replace("; ", ", ")
    return (evaluate_frame(plan_frame(ok), CSV_NAME, calibration) if ok else None), refused


# ------------------------------------------------------------------------------ the validation
def validate_moe(calibration: dict | None = None) -> pl.DataFrame:
    """Every MoE row with its measured seconds per iteration (where convertible), whether the
    model can price it and why not, and for priced rows the prediction and its breakdown.

    Returns
    -------
    polars.DataFrame
        One row per CSV row: ``id, source, release, stack, model_name, preset, gpu_published,
        gpu_preset, measured_metric, measured_value, measured_iteration_time_s, conversion,
        expressible, reason`` (one line, null when expressible), ``assumptions``, then the plan
        and the model's outputs (``status``, ``iteration_time_s`` null unless ok, the breakdown
        columns), ``error_pct``, ``ape_pct`` (:func:`.published.with_errors`) and
        ``not_priced_reason`` (``reason``, or the model's status when it finds the plan infeasible;
        null for priced rows).
    """
    runs = load_runs()
    reasons = {r["id"]: unexpressible_reason(r) for r in runs}
    ok_rows = [r for r in runs if reasons[r["id"]] is None]
    priced, refused = _evaluate(ok_rows, calibration)
    reasons.update(refused)
    base = []
    for r in runs:
        try:
            measured, conversion = measured_iteration_time(r)
        except P.NotConvertible:
            measured, conversion = None, None
        gm = gpu_preset(r.get("gpu"))
        key = r["source_key"]
        base.append(dict(
            id=r["id"], source=STACKS[key].name, release=r["id"].split("_")[1] if key == "mbridge" else key,
            stack=key, model_name=r["model"], preset=r.get("preset"), gpu_published=r.get("gpu"),
            gpu_preset=gm.preset if gm else None, measured_metric=r["measured_metric"],
            measured_value=r["measured_value"], measured_iteration_time_s=measured, conversion=conversion,
            expressible=reasons[r["id"]] is None, reason=reasons[r["id"]],
            assumptions=plan_row(r)[1] if reasons[r["id"]] is None else None))
    frame = pl.DataFrame(base, infer_schema_length=None)
    if priced is not None:
        priced = priced.filter(~pl.col("id").is_in(list(refused)))
        frame = frame.join(priced.drop("gpu", "model"), on="id", how="left")
    else:
        frame = frame.with_columns(pl.lit(None, pl.String).alias("status"),
                                   pl.lit(None, pl.Float64).alias("iteration_time_s"))
    frame = P.with_errors(frame)
    return frame.with_columns(
        pl.when(pl.col("reason").is_not_null()).then(pl.col("reason"))
        .when(pl.col("status") != "ok").then(pl.format("the model finds the plan {}", pl.col("status")))
        .otherwise(None).alias("not_priced_reason"))


def not_priced_counts(rows: pl.DataFrame) -> pl.DataFrame:
    """:func:`.published.reason_counts` of ``not_priced_reason`` (one reason a row), each counted
    by its part before ': ' and ' (' (the row-specific rest is in the column)."""
    kinds = rows.select(pl.col("not_priced_reason").str.split(": ").list.first().alias("reason"))
    return P.reason_counts(kinds)


BREAKDOWN = ("compute_s", "ep_comm_s", "tp_comm_s", "pp_comm_s", "bubble_s", "dp_comm_s", "memory_per_gpu_GiB")
