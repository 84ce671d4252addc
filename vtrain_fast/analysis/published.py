"""Validation against published training runs (``vtrain_fast/data/published/published_runs.csv``:
79 measured configurations from 7 public sources; see the README there).

A held-out check of today's calibration (nothing of the shipped calibration is fitted to these
rows, and no constant of the cost model may be tuned to them), and the stack calibrations: a
few global parameters per software stack and GPU (:class:`StackFit` in :data:`STACKS`) fitted to
a stated half of that stack's rows (:func:`fit_roles`) and reported on the other half.

Three steps per row, each in one place, after :func:`apply_assumptions` has filled the empty
cells that another documented source states (:data:`ASSUMPTIONS`, ``assumptions.toml``: every
record with its citation; a row taking any is priced as ``assumed``, never as ``stated``):

* :func:`unexpressible_reasons`: the rules (:data:`RULES`, one function per reason) that say why
  the cost model cannot price a row today. A row is priced only when no rule fires; when the
  model learns a feature (FP8, ZeRO-3, context parallelism, ...), delete its rule.
* :data:`CONVERSIONS`: the measured headline metric converted to seconds per iteration with the
  formula of the row's source (one function per metric and FLOP convention).
* :func:`plan_frame`: the ``evaluate`` plan of an expressible row: the GPU preset
  (:data:`GPU_PRESETS`) and, for the settings the CSV has no column for, the defaults of the
  row's software stack (:data:`STACKS`).
"""
from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Callable

import numpy as np
import polars as pl

from ..model.arch import ARCH_FLAGS
from ..model.records import NUM_HW_FIELDS, hw_index
from ..model.settings import SETTINGS, unmet_requirements
from ..model.layer_split import stage_layers
from .evaluate import evaluate_frame

DATA = resources.files("vtrain_fast") / "data" / "published"
CSV_NAME = "published_runs.csv"

INT_COLUMNS = ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "ffn_hidden_size", "vocab_size",
               "seq_len", "global_batch_size", "micro_batch_size", "tp", "pp", "dp", "cp", "virtual_pp",
               "num_gpus")
FLOAT_COLUMNS = ("params_b", "measured_value")


def load_runs(assume: bool = True) -> list[dict]:
    """The rows of ``published_runs.csv`` as dicts: integer and float columns parsed, empty
    cells ``None`` (unknown: the source does not state the value), ``sequence_parallel`` a bool
    or ``None``, other cells stripped text or ``None``; with ``assume`` (default) the empty cells
    :data:`ASSUMPTIONS` fills filled (:func:`apply_assumptions`; ``assumed`` lists them per row,
    ``assumed_settings`` the stack settings they change; both empty without ``assume``)."""
    rows = _read_csv_rows()
    return apply_assumptions(rows) if assume else [dict(r, assumed={}, assumed_settings={}) for r in rows]


def _read_csv_rows(name: str = CSV_NAME, int_columns: tuple = INT_COLUMNS,
                   float_columns: tuple = FLOAT_COLUMNS) -> list[dict]:
    """The rows of the CSV ``name`` in :data:`DATA` (``published_runs.csv``; ``moe_runs.csv`` for
    :mod:`.published_moe`), parsed as :func:`load_runs` says, ``source_key`` the id's prefix."""
    text = (DATA / name).read_text(encoding="utf-8")
    rows = []
    for raw in csv.DictReader(io.StringIO(text)):
        r = {}
        for k, v in raw.items():
            v = v.strip()
            if v == "":
                r[k] = None
            elif k in int_columns:
                f = float(v)
                if f != int(f):
                    raise ValueError(f"{name}: {raw['id']}: {k} = {v} is not a whole number")
                r[k] = int(f)
            elif k in float_columns:
                r[k] = float(v)
            elif k == "sequence_parallel":
                r[k] = {"true": True, "false": False}[v.lower()]
            else:
                r[k] = v
        r["source_key"] = r["id"].split("_")[0]
        rows.append(r)
    return rows


# ------------------------------------------------------------------------------ assumptions
ASSUMPTIONS_NAME = "assumptions.toml"
STATED, ASSUMED = "stated", "assumed"


@dataclass(frozen=True)
class Assumption:
    """Values a row's source does not state, filled from another documented source (one record
    of ``vtrain_fast/data/published/assumptions.toml``): the rows (ids), the CSV columns filled
    (``values``: empty cells only), the stack settings changed for those rows (``settings``) and
    ``source``, the citation every value comes from. A row that takes any of them is priced as
    :data:`ASSUMED`, never as :data:`STATED`."""

    name: str
    rows: tuple[str, ...]
    values: dict
    settings: dict
    source: str


def load_assumptions(path=None) -> tuple[Assumption, ...]:
    """The records of ``assumptions.toml`` (or ``path``), checked: every record has a name, rows
    and a non-empty ``source``; fills CSV columns or stack settings (:data:`SETTINGS`) only.

    Raises
    ------
    ValueError
        A record without a source, rows or values, or naming an unknown column or setting.
    """
    import tomllib
    text = (DATA / ASSUMPTIONS_NAME).read_text(encoding="utf-8") if path is None else Path(path).read_text("utf-8")
    columns = set(INT_COLUMNS + FLOAT_COLUMNS + ("recompute", "sequence_parallel", "precision"))
    names = {s.name for s in SETTINGS}
    out = []
    for i, rec in enumerate(tomllib.loads(text).get("assumption", [])):
        a = Assumption(str(rec.get("name", "")).strip(), tuple(rec.get("rows", ())), dict(rec.get("values", {})),
                       dict(rec.get("settings", {})), " ".join(str(rec.get("source", "")).split()))
        where = f"{ASSUMPTIONS_NAME}: record {i + 1} ({a.name or 'no name'})"
        if not a.name or not a.rows:
            raise ValueError(f"{where}: needs a name and rows")
        if len(a.source) < 20:
            raise ValueError(f"{where}: needs its source (a citation of where every value comes from)")
        if not a.values and not a.settings:
            raise ValueError(f"{where}: fills nothing")
        if set(a.values) - columns:
            raise ValueError(f"{where}: not a CSV column it may fill: {sorted(set(a.values) - columns)}")
        if set(a.settings) - names:
            raise ValueError(f"{where}: not a stack setting: {sorted(set(a.settings) - names)}")
        out.append(a)
    return tuple(out)


ASSUMPTIONS: tuple[Assumption, ...] = load_assumptions()


def apply_assumptions(rows: list[dict], assumptions: tuple[Assumption, ...] | None = None) -> list[dict]:
    """Copies of ``rows`` with the empty cells the assumptions fill filled. Each row gets
    ``assumed`` (column -> the record's name) and ``assumed_settings`` (setting -> value).

    Raises
    ------
    ValueError
        A record naming a row that does not exist, filling a cell its source states (an
        assumption never overrides a stated value), or a cell two records fill.
    """
    assumptions = ASSUMPTIONS if assumptions is None else assumptions
    out = {r["id"]: dict(r, assumed={}, assumed_settings={}) for r in rows}
    for a in assumptions:
        for rid in a.rows:
            if rid not in out:
                raise ValueError(f"{ASSUMPTIONS_NAME}: {a.name}: no row {rid!r} in {CSV_NAME}")
            r = out[rid]
            for col, v in a.values.items():
                if col in r["assumed"]:
                    raise ValueError(f"{ASSUMPTIONS_NAME}: {a.name}: {rid}: {col} is filled by {r['assumed'][col]!r} too")
                if r.get(col) is not None:
                    raise ValueError(f"{ASSUMPTIONS_NAME}: {a.name}: {rid}: {col} is stated ({r[col]!r}): "
                                     "an assumption fills empty cells only")
                r[col] = v
                r["assumed"][col] = a.name
            for k, v in a.settings.items():
                r["assumed_settings"][k] = v
                r["assumed"][f"setting {k}"] = a.name
    return list(out.values())


def row_basis(row: dict) -> str:
    """:data:`ASSUMED` when any value the row is priced with comes from :data:`ASSUMPTIONS`,
    else :data:`STATED` (every value from its source, as the CSV records it)."""
    return ASSUMED if row.get("assumed") else STATED


def assumption_sources(row: dict) -> str | None:
    """The assumed values of a row with each record's source, '; '-joined (None: stated)."""
    by_name = {a.name: a for a in ASSUMPTIONS}
    parts = []
    for name in dict.fromkeys(row.get("assumed", {}).values()):
        a = by_name[name]
        cols = [c for c, n in row["assumed"].items() if n == name]
        vals = ", ".join(f"{c.removeprefix('setting ')} = {row['assumed_settings'][c.removeprefix('setting ')]}"
                         if c.startswith("setting ") else f"{c} = {row[c]}" for c in cols)
        parts.append(f"{vals} [{name}: {a.source}]")
    return "; ".join(parts) or None


# ------------------------------------------------------------------------------ sources and stacks
@dataclass(frozen=True)
class StackFit:
    """A calibration fitted to a stack's own rows (:func:`fit_stack`): the file it ships as
    (under ``vtrain_fast/data/calibration/``, written by ``vtrain-fast calibrate-published``),
    the global parameters fitted per GPU group and why those. The other parameters keep the
    shipped preset's values. Which rows are fitted: :func:`fit_roles`."""

    file: str
    params: tuple[str, ...]
    basis: str
    covers: Callable[[dict], bool] | None = None    # the rows of the stack the fit covers (None: all)
    covers_basis: str = ""                          # why only those


# Two terms, fixed before any fit: one proportional to the compute (GEMM efficiency: the stack's
# kernels and the cluster's sustained clocks) and one per iteration (what the model has no term
# for: optimizer and logging synchronisations, data loading, the stack's Python overhead).
TWO_TERMS = ("gemm_efficiency", "iteration_overhead_s")


@dataclass(frozen=True)
class Stack:
    """A source's software stack and what it runs by default for the settings the CSV has no
    column for (the values the plan assumes; ``basis`` says where each comes from), and its
    stack calibration (``fit``; ``None``: too few priced rows to fit and hold any out)."""

    name: str
    label: str
    settings: dict
    basis: str
    fit: StackFit | None = None


_OFF = dict(overlap_grad_reduce=False, distributed_optimizer=False, use_flash_attn=False,
            async_tensor_model_parallel_allreduce=False, tp_comm_overlap=False, overlap_param_gather=False)
_MCORE_2024 = dict(overlap_grad_reduce=True, distributed_optimizer=True, use_flash_attn=True,
                   async_tensor_model_parallel_allreduce=True, tp_comm_overlap=True, overlap_param_gather=True,
                   overlap_p2p_comm=True)

STACKS: dict[str, Stack] = {
    "narayanan21": Stack(
        "Narayanan et al. 2021", "Megatron-LM, Aug 2021 (examples/sc21, commit 6985e58)", dict(_OFF),
        "the asynchronous TP all-reduce entered Megatron-LM on 2021-09-02 (commit 3f65246), after the "
        "paper and its script; gradient all-reduce by the local DDP after backward (--overlap-grad-reduce: "
        "2023-08, commit 2d5220a); no distributed optimizer (2022), no FlashAttention",
        StackFit("stack-narayanan21.toml", TWO_TERMS, "the two terms (TWO_TERMS)",
                 covers=lambda r: _zero_stage(r) != 3,
                 covers_basis="the Megatron-LM PTD-P rows only: the six ZeRO-3 rows of Table 2 ran DeepSpeed's "
                 "ZeRO-3 ('We integrated ZeRO into our codebase using the DeepSpeed Python library', Sec. 5.2), "
                 "another stack; decided after the first fit over all 21 priced rows (2026-12-01), which put "
                 "gemm_efficiency at 0.50 and the Megatron-LM rows at +15 to +42 %; they keep the shipped "
                 "calibration's prediction")),
    "korthikanti22": Stack(
        "Korthikanti et al. 2022", "Megatron-LM, 2022",
        dict(_OFF, async_tensor_model_parallel_allreduce=True),
        "the asynchronous TP all-reduce is Megatron-LM's default from 2021-09-02 (commit 3f65246, "
        "--no-async-tensor-model-parallel-allreduce turns it off); the paper states no overlap of the "
        "gradient all-reduce with backprop (row notes, Sec. 6.3); no distributed optimizer (not in "
        "megatron/arguments.py at 2022-05-26, commit 55ba1f7; it changes nothing at dp = 1 anyway); no FlashAttention",
        StackFit("stack-korthikanti22.toml", TWO_TERMS, "the two terms (TWO_TERMS)")),
    "megatronlm": Stack(
        "Megatron-LM README 2024", "Megatron-Core r0.8.0", dict(_MCORE_2024),
        "the README names --overlap-grad-reduce --overlap-param-gather --tp-comm-overlap (which need "
        "the distributed optimizer and sequence parallelism); asynchronous TP all-reduce on by default; "
        "overlap_p2p_comm on by default (--no-overlap-p2p-communication turns it off); "
        "Transformer Engine's fused attention assumed for use_flash_attn"),
    "nemo2407": Stack(
        "NeMo 24.07", "NeMo 24.07 (Megatron-Core)", dict(_MCORE_2024),
        "NeMo-Framework-Launcher tag 24.07, launcher_scripts/conf/training/*/*.yaml (not restated on the "
        "performance page): optim distributed_fused_adam with overlap_grad_sync and overlap_param_sync true "
        "(distributed optimizer, overlapped reduce and gather), mcore_gpt and transformer_engine true, "
        "use_flash_attention (TE fused attention); overlap_p2p_comm true, batch_p2p_comm false "
        "(llama/llama2_70b.yaml, commit 0446d2c); FP8 by Transformer Engine's delayed scaling (fp8_amax_history_len, "
        "fp8_amax_compute_algo); tp_comm_overlap (ub_tp_comm_overlap) per model config: assumptions.toml",
        StackFit("stack-nemo2407.toml", ("fp8_gemm_efficiency", "iteration_overhead_s"),
                 "the two terms (TWO_TERMS) with FP8's GEMM efficiency as the compute term: every NeMo row runs "
                 "its linear layers in FP8 (Transformer Engine), the bf16 gemm_efficiency prices only the "
                 "attention core, embeddings and head")),
    "shoeybi19": Stack(
        "Shoeybi et al. 2019", "Megatron-LM v1, 2019", dict(_OFF),
        "none of these settings existed in 2019 Megatron-LM",
        StackFit("stack-shoeybi19.toml", ("gemm_efficiency",),
                 "3 priced rows (2 fitted, 1 held out) leave room for one parameter; the compute term, as the "
                 "V100 preset's GEMM efficiency is assumed (0.70, no V100 measurement) and the rows differ by "
                 "model size at one batch")),
    "bloom176b": Stack(
        "BLOOM-176B", "Megatron-DeepSpeed (BigScience tr11)",
        dict(_OFF, distributed_optimizer=True, account_for_embedding_in_pipeline_split=True,
             account_for_loss_in_pipeline_split=True),
        "BF16Optimizer with ZeRO-1-equivalent sharding (row notes) = distributed optimizer; "
        "--pp-partition-method 'type:transformer|embedding' counts the two (tied) embedding layers as "
        "pipeline layers: 70 + 2 over 12 stages, 5 + 10 x 6 + 5 (account_for_embedding / loss_in_pipeline_split); "
        "Megatron-DeepSpeed's ColumnParallelLinear has no asynchronous TP all-reduce; no overlap, "
        "no FlashAttention, DeepSpeed PP non-interleaved",
        StackFit("stack-bloom176b.toml", ("iteration_overhead_s",),
                 "3 priced rows, one model at three batch sizes: 2 fitted and 1 held out leave room for one "
                 "parameter; the per-iteration term, as the rows differ by batch size only")),
    "mosaic": Stack(
        "MosaicML llm-foundry", "PyTorch FSDP (llm-foundry)", dict(_OFF, use_flash_attn=True, zero_stage=3),
        "FSDP FULL_SHARD = zero_stage 3 (forward and backward prefetch, llm-foundry's FSDP defaults); "
        "FlashAttention (row notes); no tensor or pipeline parallelism, so no Megatron TP setting applies",
        StackFit("stack-mosaic.toml", TWO_TERMS,
                 "the two terms (TWO_TERMS), per GPU; the A100 80 and 40 GB rows are fitted as one chip "
                 "(GPUMap.fit_with: the 40 GB part's 2 rows are too few to fit alone)")),
}


def source_label(row: dict) -> str:
    """The display name of a published row's source (its :data:`STACKS` entry, keyed by the id's prefix)."""
    return STACKS[row["source_key"]].name


# ------------------------------------------------------------------------------ GPUs
@dataclass(frozen=True)
class GPUMap:
    """How a GPU name of the CSV maps to a preset: ``match`` (all substrings, case-insensitive),
    the preset, cluster overrides (``evaluate`` cluster columns) and a note."""

    match: tuple[str, ...]
    preset: str
    overrides: dict
    note: str
    fit_with: str | None = None     # a stack fit fits this preset's rows with this preset's (one chip)


GPU_PRESETS: tuple[GPUMap, ...] = (
    GPUMap(("a100", "40gb"), "a100-sxm4-40gb", {},
           "A100 40 GB preset (hbm_GiB 40; the 80 GB part's calibration)", fit_with="a100-sxm4-80gb"),
    GPUMap(("a100",), "a100-sxm4-80gb", {},
           "the calibrated A100 80 GB preset (8 GPUs per node, 200 Gb/s per GPU: Selene's 8 x 200 Gb/s "
           "HDR per node; Jean Zay's network not stated, preset kept)"),
    GPUMap(("h100",), "h100-sxm-80gb", {},
           "H100 SXM preset: not calibrated (A100 software-stack terms, published GEMM efficiency)"),
    GPUMap(("v100", "dgx-2h"), "v100-sxm2-32gb", {"gpus_per_node": 16, "inter_node_Gbps": 50.0},
           "V100 SXM2 32 GB preset with the DGX-2H's 16 GPUs per NVSwitch node and 8 x 100 Gb/s IB per node "
           "(50 Gb/s per GPU, Shoeybi et al. Sec. 5); the preset's 125 TFLOP/s fp16 peak (the DGX-2H's SXM3 "
           "parts run ~130); not calibrated (assumed GEMM efficiency 0.70)"),
)


def gpu_preset(name: str | None, presets: tuple[GPUMap, ...] | None = None) -> GPUMap | None:
    """The first entry of ``presets`` (default :data:`GPU_PRESETS`) matching a CSV GPU name, or ``None``."""
    low = (name or "").lower().replace(" ", "")
    for m in GPU_PRESETS if presets is None else presets:
        if all(s in low for s in m.match):
            return m
    return None


# ------------------------------------------------------------------------------ metric conversions
class NotConvertible(Exception):
    """The measured metric of a row cannot be turned into seconds per iteration (the message
    says why)."""


def hardware_flops_eq3(B, s, l, h, V) -> float:
    """FLOPs of one iteration with full recomputation, Narayanan et al. 2021, eq. (3):
    ``F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h))`` (3 x forward for the passes plus the
    recompute forward; attention counted unmasked). Also BLOOM's logged TFLOPs: Megatron-DeepSpeed's
    ``24 k B s l h^2 (1 + s/(6h) + V/(16 l h))`` with ``k = 4`` under --checkpoint-activations
    (its README's '4*2' coefficient)."""
    return 96.0 * B * s * l * h * h * (1.0 + s / (6.0 * h) + V / (16.0 * l * h))


def model_flops_korthikanti(B, s, l, h, V) -> float:
    """Model FLOPs of one iteration (no recomputation), Korthikanti et al. 2022 (MFU, Sec. 6):
    ``72 B s l h^2 (1 + s/(6h) + V/(12 l h))``, GPT layer with ffn = 4h. (Table 5's 41.5 %
    for 22B at 1.42 / 1.1 s and 51.4 % for 175B at 13.75 s follow from it at 312 TFLOP/s.)"""
    return 72.0 * B * s * l * h * h * (1.0 + s / (6.0 * h) + V / (12.0 * l * h))


def model_flops_megatron_core(B, s, l, h, a, g, f, V) -> float:
    """Model FLOPs of one iteration, Megatron-Core r0.8.0 ``num_floating_point_operations``
    (megatron/training/training.py; no SwiGLU, no MoE, kv_channels = h/a):
    ``12 B s l h^2 (1 + g/a + s/h + f/h + V/(2 l h))``."""
    return 12.0 * B * s * l * h * h * (1.0 + g / a + s / h + f / h + V / (2.0 * l * h))


def seconds_from_tflops(flops_per_iteration: float, tflops_per_gpu: float, num_gpus: int) -> float:
    """``T = F / (TFLOP/s per GPU x 10^12 x GPUs)``, the inverse of how the sources compute it."""
    return flops_per_iteration / (tflops_per_gpu * 1e12 * num_gpus)


def seconds_from_mfu(flops_per_iteration: float, mfu_pct: float, peak_tflops: float, num_gpus: int) -> float:
    """``T = F_model / (MFU x peak x GPUs)``."""
    return flops_per_iteration / (mfu_pct / 100.0 * peak_tflops * 1e12 * num_gpus)


def seconds_from_tokens_per_gpu(B: int, s: int, tokens_per_s_per_gpu: float, num_gpus: int) -> float:
    """``T = B s / (tokens/s per GPU x GPUs)``: one iteration consumes B sequences of s tokens."""
    return B * s / (tokens_per_s_per_gpu * num_gpus)


# Shoeybi et al. 2019, Sec. 5.2: one epoch = 68,507 iterations at batch 512, sequence 1024.
SHOEYBI_ITERATIONS_PER_EPOCH = 68_507


def seconds_from_epoch_days(days: float, iterations: int = SHOEYBI_ITERATIONS_PER_EPOCH) -> float:
    """Mean wall-clock seconds per iteration of a real training run, ``days x 86,400 / iterations``
    (includes evaluation, checkpointing and any other overhead of the run)."""
    return days * 86400.0 / iterations


def _need(row: dict, *cols: str) -> list:
    missing = [c for c in cols if row.get(c) is None]
    if missing:
        raise NotConvertible(f"conversion needs {', '.join(missing)} (not stated)")
    return [row[c] for c in cols]


def _narayanan_tflops(row):
    B, s, l, h, V, n = _need(row, "global_batch_size", "seq_len", "num_layers", "hidden_size", "vocab_size", "num_gpus")
    return seconds_from_tflops(hardware_flops_eq3(B, s, l, h, V), row["measured_value"], n), "eq. (3) hardware FLOPs"


def _bloom_tflops(row):
    if row.get("recompute") != "full":
        raise NotConvertible("BLOOM's TFLOPs formula uses k = 4 only with activation checkpointing")
    B, s, l, h, V, n = _need(row, "global_batch_size", "seq_len", "num_layers", "hidden_size", "vocab_size", "num_gpus")
    return seconds_from_tflops(hardware_flops_eq3(B, s, l, h, V), row["measured_value"], n), "Megatron-DeepSpeed 24*4 hardware FLOPs"


KORTHIKANTI_PEAK_TFLOPS = 312.0   # A100 fp16/bf16 dense, the paper's MFU denominator


def _korthikanti_mfu(row):
    B, s, l, h, V, n = _need(row, "global_batch_size", "seq_len", "num_layers", "hidden_size", "vocab_size", "num_gpus")
    return (seconds_from_mfu(model_flops_korthikanti(B, s, l, h, V), row["measured_value"], KORTHIKANTI_PEAK_TFLOPS, n),
            "Korthikanti model FLOPs, MFU of 312")


# The Megatron-LM 2024 README's MFU / TFLOP/s ratio implies ~989 TFLOP/s, the H100 SXM dense BF16
# peak (the shared README's inference; the README does not state it).
MEGATRON24_PEAK_TFLOPS = 989.0


def _megatron24_flops(row):
    B, s, l, h, a, g, f, V = _need(row, "global_batch_size", "seq_len", "num_layers", "hidden_size", "num_heads",
                                   "num_kv_heads", "ffn_hidden_size", "vocab_size")
    return model_flops_megatron_core(B, s, l, h, a, g, f, V)


def _megatron24_tflops(row):
    return seconds_from_tflops(_megatron24_flops(row), row["measured_value"], _need(row, "num_gpus")[0]), "Megatron-Core model FLOPs"


def _megatron24_mfu(row):
    return (seconds_from_mfu(_megatron24_flops(row), row["measured_value"], MEGATRON24_PEAK_TFLOPS, _need(row, "num_gpus")[0]),
            "Megatron-Core model FLOPs, MFU of 989")


def _tokens_per_gpu(row):
    B, s, n = _need(row, "global_batch_size", "seq_len", "num_gpus")
    return seconds_from_tokens_per_gpu(B, s, row["measured_value"], n), "B s / (tokens/s/GPU x GPUs)"


def _iteration_time(row):
    return row["measured_value"], "measured directly"


def _epoch_days(row):
    return seconds_from_epoch_days(row["measured_value"]), "days x 86400 / 68507 (mean, incl. overheads)"


def _flop_count_unstated(row):
    raise NotConvertible("TFLOP/s with a FLOP count the source does not state")


def _weak_scaling(row):
    raise NotConvertible("weak_scaling_efficiency is not a per-iteration throughput (% of linear scaling vs a "
                         "39 TFLOP/s 1-GPU baseline whose FLOP count is not stated)")


# (source key or "*", metric) -> function(row) -> (seconds per iteration, formula label).
CONVERSIONS: dict[tuple[str, str], Callable] = {
    ("narayanan21", "tflops_per_gpu"): _narayanan_tflops,
    ("bloom176b", "tflops_per_gpu"): _bloom_tflops,
    ("korthikanti22", "mfu"): _korthikanti_mfu,
    ("megatronlm", "tflops_per_gpu"): _megatron24_tflops,
    ("megatronlm", "mfu"): _megatron24_mfu,
    ("shoeybi19", "tflops_per_gpu"): _flop_count_unstated,
    ("shoeybi19", "weak_scaling_efficiency"): _weak_scaling,
    ("shoeybi19", "time_per_epoch_days"): _epoch_days,
    ("*", "iteration_time_s"): _iteration_time,
    ("*", "tokens_per_s_per_gpu"): _tokens_per_gpu,
}


def measured_iteration_time(row: dict) -> tuple[float, str]:
    """Seconds per iteration from the row's headline metric, and the formula used.

    Raises
    ------
    NotConvertible
        When the metric has no conversion for the row's source or misses an input.
    """
    metric = row["measured_metric"]
    fn = CONVERSIONS.get((row["source_key"], metric)) or CONVERSIONS.get(("*", metric))
    if fn is None:
        raise NotConvertible(f"no conversion of {metric} for {source_label(row)}")
    return fn(row)


# ------------------------------------------------------------------------------ expressibility rules
RECOMPUTE_KINDS = ("none", "full", "selective")


def _recompute(row):
    """The recompute kind (first word of the cell: 'full (FSDP activation checkpointing)' is full)."""
    v = row.get("recompute")
    return None if v is None else v.split()[0].lower()


def _precision(row):
    """fp16 or bf16 for a 16-bit mixed-precision cell ('16-bit mixed' is either; the model runs
    both at the same tensor-core peak), else the cell lower-cased (or None)."""
    v = (row.get("precision") or "").lower()
    if not v:
        return None
    if "fp8" in v:
        return "fp8"
    if "bf16" in v:
        return "bf16"
    if "fp16" in v or "16-bit" in v:
        return "fp16"
    return v


def _arch(row) -> dict:
    """The architecture flags of a row's model (:mod:`vtrain_fast.model.arch`; the CSV has no
    column for them), every flag, by family: Llama's layer (SwiGLU at the CSV's gated width, RMSNorm,
    RoPE, no biases, untied head);
    MPT's (llm-foundry's mpt yamls: no_bias, ALiBi, tied); BLOOM's (ALiBi, tied); Nemotron's
    (NeMo-Framework-Launcher 24.07 conf/training/nemotron/*.yaml: squared-ReLU, not gated, at the
    CSV's width; layernorm1p, a LayerNorm; RoPE, no biases, untied head); GPT's otherwise
    (Megatron-LM's defaults: GPT-3 and the Megatron papers' models tie the head)."""
    model = (row.get("model") or "").lower()
    family = {}
    if "nemotron" in model:
        family = dict(position_embedding_type="rope", add_bias_linear=False, untie_embeddings_and_output_weights=True)
    elif "llama" in model:
        family = dict(gated_mlp=True, normalization="RMSNorm", position_embedding_type="rope", add_bias_linear=False,
                      untie_embeddings_and_output_weights=True)
    elif "mpt" in model:
        family = dict(position_embedding_type="none", add_bias_linear=False)
    elif "bloom" in model:
        family = dict(position_embedding_type="none")
    return {fl.name: fl.default for fl in ARCH_FLAGS} | family


def _r_gpu(row):
    if gpu_preset(row.get("gpu")) is None:
        return f"GPU {row.get('gpu')!r}: no preset"


def _r_precision_other(row):
    p = _precision(row)
    if p is not None and p not in ("fp16", "bf16", "fp8"):
        return f"precision {row['precision']!r} not modelled"


def _r_precision_unstated(row):
    if _precision(row) is None:
        return "precision not stated"


def _zero_stage(row):
    """3 for a ZeRO-3 (DeepSpeed) or FSDP FULL_SHARD row (its notes say so), else the stack's."""
    notes = row.get("notes") or ""
    if "ZeRO-3" in notes or "FULL_SHARD" in notes:
        return 3
    return STACKS[row["source_key"]].settings.get("zero_stage", 0)


def _r_layout_unstated(row):
    missing = [c for c in ("tp", "pp", "dp", "cp") if row.get(c) is None]
    if missing:
        return "/".join(missing) + " not stated"


def _r_world_size(row):
    sizes = [row.get(c) for c in ("tp", "pp", "dp", "cp")]
    if None not in sizes and row.get("num_gpus") is not None and int(np.prod(sizes)) != row["num_gpus"]:
        return f"tp x pp x dp x cp = {int(np.prod(sizes))} != num_gpus {row['num_gpus']}"


def _r_batch_unstated(row):
    missing = [c for c in ("global_batch_size", "micro_batch_size") if row.get(c) is None]
    if missing:
        return " and ".join(missing) + " not stated"


def _r_shape_unstated(row):
    missing = [c for c in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "ffn_hidden_size",
                           "vocab_size", "seq_len") if row.get(c) is None]
    if missing:
        return "model shape not stated (" + ", ".join(missing) + ")"


def _r_recompute_unstated(row):
    if _recompute(row) is None:
        return "recompute not stated"


def _r_recompute_kind(row):
    r = _recompute(row)
    if r is not None and r not in RECOMPUTE_KINDS:
        return f"recompute {row['recompute']!r} not modelled"


def _r_sp_unstated(row):
    if row.get("sequence_parallel") is None and (row.get("tp") or 1) > 1:
        return "sequence_parallel not stated (tp > 1)"


def _r_vpp_unstated(row):
    if row.get("virtual_pp") is None and (row.get("pp") or 1) > 1:
        return "virtual_pp not stated (pp > 1)"


def _r_uneven_stages(row):
    """The layers must split over the stages as the source's stack splits them (evenly, or with
    the stack's partition settings: BLOOM's counts the embeddings as layers) into vpp chunks each."""
    L, p, v = row.get("num_layers"), row.get("pp"), row.get("virtual_pp") or 1
    if L is None or p is None:
        return None
    hw = np.zeros(NUM_HW_FIELDS)
    for k, value in STACKS[row["source_key"]].settings.items():
        hw[hw_index(k)] = float(value)
    first, mid, last, ok = stage_layers.py_func(float(L), float(p), hw)
    if not ok or (v > 1 and (first % v or mid % v or last % v)):
        chunks = "" if v == 1 else f", {v} chunks each"
        return f"the stack's pipeline split does not fit: {L} layers over {p} stages{chunks}"


def _r_metric(row):
    try:
        measured_iteration_time(row)
    except NotConvertible as e:
        return str(e)


# One rule per reason: a rule returns its one-line reason (no '; ' inside: reasons are joined with
# it) when it fires, else None. Features the
# model lacks first, then what the source does not state, then the metric. Delete a rule when the
# model learns its feature.
RULES: tuple[Callable[[dict], str | None], ...] = (
    _r_gpu, _r_precision_other, _r_recompute_kind, _r_uneven_stages,
    _r_world_size,
    _r_layout_unstated, _r_batch_unstated, _r_shape_unstated, _r_precision_unstated, _r_recompute_unstated,
    _r_sp_unstated, _r_vpp_unstated,
    _r_metric,
)


def unexpressible_reasons(row: dict) -> list[str]:
    """Every reason (one line each, :data:`RULES` order) why the cost model cannot price ``row``
    today; empty when it can."""
    return [r for r in (rule(row) for rule in RULES) if r]


# ------------------------------------------------------------------------------ plans
def plan_row(row: dict) -> tuple[dict, str]:
    """The ``evaluate`` plan of an expressible row (call only when :func:`unexpressible_reasons`
    is empty), and its assumptions: what was mapped or taken from the stack rather than read."""
    gm = gpu_preset(row["gpu"])
    stack = STACKS[row["source_key"]]
    assumptions = []
    ffn = row["ffn_hidden_size"]
    settings = dict(stack.settings) | row.get("assumed_settings", {})
    settings["sequence_parallel"] = bool(row.get("sequence_parallel"))
    settings["zero_stage"] = _zero_stage(row)
    # a stack default without what it needs (tp_comm_overlap without sequence parallelism) is
    # off on this row, as a sweep runs it (the registry's rule, model.settings.unmet_requirements)
    values = {s.name: s.default for s in SETTINGS} | settings
    for st, _, _ in unmet_requirements(values):
        settings[st.name] = st.default
    assumptions.append(f"stack defaults: {stack.label}")
    if row.get("assumed"):
        assumptions.append("assumed (not stated; assumptions.toml): " + ", ".join(
            f"{c.removeprefix('setting ')} = {row['assumed_settings'][c.removeprefix('setting ')]}"
            if c.startswith("setting ") else f"{c} = {row[c]}" for c in row["assumed"]))
    if row["precision"] and "16-bit" in row["precision"]:
        assumptions.append("16-bit mixed as fp16 (same peak as bf16)")
    plan = dict(
        id=row["id"], num_layers=row["num_layers"], hidden_size=row["hidden_size"],
        num_attention_heads=row["num_heads"], num_query_groups=row["num_kv_heads"], ffn_hidden_size=ffn,
        vocab_size=row["vocab_size"], seq_length=row["seq_len"],
        **{k: str(v).lower() if isinstance(v, bool) else v for k, v in _arch(row).items()},
        global_batch_size=row["global_batch_size"],
        micro_batch_size=row["micro_batch_size"], tp=row["tp"], cp=row.get("cp") or 1, pp=row["pp"], dp=row["dp"],
        num_gpus=row["num_gpus"], gpu=gm.preset, recompute=_recompute(row), precision=_precision(row),
        vpp=row.get("virtual_pp") or 1,
        **{k: str(v).lower() if isinstance(v, bool) else v for k, v in settings.items()},
        gpus_per_node=gm.overrides.get("gpus_per_node"), inter_node_Gbps=gm.overrides.get("inter_node_Gbps"),
    )
    return plan, "; ".join(assumptions)


PLAN_SCHEMA = {"gpus_per_node": pl.Int64, "inter_node_Gbps": pl.Float64}


def plan_frame(rows: list[dict]) -> pl.DataFrame:
    """``evaluate`` plans of expressible rows (one per row, ``id`` as a label)."""
    plans = [plan_row(r)[0] for r in rows]
    return pl.DataFrame(plans, schema_overrides=PLAN_SCHEMA, infer_schema_length=None)


# ------------------------------------------------------------------------------ stack calibrations
CALIBRATION_DIR = resources.files("vtrain_fast") / "data" / "calibration"
FITTED, HELD_OUT = "fitted", "held_out"


def fit_group(row: dict) -> tuple[str, str]:
    """The stack fit a row belongs to: ``(source key, GPU preset)``, the preset being the one
    its calibration is fitted as (:attr:`GPUMap.fit_with`: the A100 40 GB with the 80 GB)."""
    gm = gpu_preset(row["gpu"])
    return row["source_key"], gm.fit_with or gm.preset


def fit_covers(row: dict) -> bool:
    """Whether a stack fit covers ``row``: its stack has a :class:`StackFit` and the row is one of
    those the fit covers (:attr:`StackFit.covers`)."""
    fit = STACKS[row["source_key"]].fit
    return fit is not None and (fit.covers is None or fit.covers(row))


def fit_roles(runs: list[dict] | None = None) -> dict[str, str]:
    """Which rows each stack calibration is fitted to, and which it holds out: row id ->
    ``"fitted"`` | ``"held_out"``, for the expressible rows a :class:`StackFit` covers
    (:func:`fit_covers`).

    The rule, stated before any fit and the same for every stack: within a fit group
    (:func:`fit_group`: one stack on one GPU), the expressible rows in the order of
    ``published_runs.csv`` (each source's own table order, by model size) alternate, the first,
    third, fifth, ... fitted and the others held out, so both sets span the group's sizes. It
    reads no measured value and no prediction.
    """
    runs = load_runs() if runs is None else runs
    seen: dict[tuple, int] = {}
    roles = {}
    for r in runs:
        if not fit_covers(r) or unexpressible_reasons(r):
            continue
        g = fit_group(r)
        i = seen.get(g, 0)
        seen[g] = i + 1
        roles[r["id"]] = FITTED if i % 2 == 0 else HELD_OUT
    return roles


def stack_calibration_path(key: str, folder=None):
    """The calibration file of stack ``key`` (in ``folder``, default the shipped
    ``vtrain_fast/data/calibration/``), or ``None`` when the stack has no fit."""
    from pathlib import Path
    fit = STACKS[key].fit
    if fit is None:
        return None
    return Path(str(folder if folder is not None else CALIBRATION_DIR)) / fit.file


def measured_frame(runs: list[dict]) -> pl.DataFrame:
    """:func:`plan_frame` of ``runs`` with ``measured_iteration_time_s`` (the ``calibrate``
    input)."""
    meas = {r["id"]: measured_iteration_time(r)[0] for r in runs}
    return plan_frame(runs).with_columns(
        pl.col("id").replace_strict(meas, return_dtype=pl.Float64).alias("measured_iteration_time_s"))


def fit_stack(key: str, runs: list[dict] | None = None) -> list[dict]:
    """Fit stack ``key``'s :class:`StackFit` parameters (:func:`~vtrain_fast.analysis.calibrate.fit`,
    least squares on the log error, the calibration ranges as bounds, starting from the shipped
    preset's calibration) to its fitted rows only (:func:`fit_roles`), one fit per GPU group.

    Returns
    -------
    list of dict
        Per group, in CSV order: ``gpu`` (the preset fitted), ``share`` (presets fitted with
        it), ``calibration``, ``report`` (:func:`fit`'s), ``fitted`` and ``held_out`` (row ids).
    """
    from ..hardware.gpus import PRESETS
    from .calibrate import fit
    runs = load_runs() if runs is None else runs
    stack_fit = STACKS[key].fit
    roles = fit_roles(runs)
    groups: dict[str, list[dict]] = {}
    for r in runs:
        if r["source_key"] == key and r["id"] in roles:
            groups.setdefault(fit_group(r)[1], []).append(r)
    out = []
    for gpu, rows in groups.items():
        fitted = [r for r in rows if roles[r["id"]] == FITTED]
        share = tuple(sorted({gpu_preset(r["gpu"]).preset for r in rows} - {gpu}))
        cal, report = fit(measured_frame(fitted), gpu, stack_fit.params, PRESETS[gpu].calibration,
                          f"{CSV_NAME} ({key}, {gpu}, fitted rows)", share=share)
        out.append(dict(gpu=gpu, share=share, calibration=cal, report=report,
                        fitted=[r["id"] for r in fitted],
                        held_out=[r["id"] for r in rows if roles[r["id"]] == HELD_OUT]))
    return out


def write_stack_calibration(key: str, folder=None, runs: list[dict] | None = None) -> tuple:
    """Fit stack ``key`` (:func:`fit_stack`) and write its calibration file (the format
    ``calibrate -o`` writes: one table per preset, ``[meta]``; the fitted group's values also
    under each shared preset) into ``folder`` (default the shipped folder), replacing it.
    Returns ``(path, groups)``."""
    from datetime import date

    from ..hardware.calfile import update_calibration_file
    from .calibrate import calibration_values
    path = stack_calibration_path(key, folder)
    groups = fit_stack(key, runs)
    stack = STACKS[key]
    comment = [f"Stack calibration of {stack.name} ({stack.label}), fitted to its own published rows",
               f"(vtrain_fast/data/published/{CSV_NAME}; analysis/published.py: STACKS, fit_roles) on "
               f"{date.today().isoformat()} by",
               "`vtrain-fast calibrate-published` (make calibrate-published). Fitted: "
               + ", ".join(stack.fit.params) + "; the other values are the shipped preset's.",
               f"Why these: {stack.fit.basis}."]
    if stack.fit.covers_basis:
        comment.append(f"Rows covered: {stack.fit.covers_basis}.")
    for g in groups:
        comment += [f"[{g['gpu']}{''.join(' + ' + s for s in g['share'])}] fitted rows: " + ", ".join(g["fitted"]),
                    "  held out (never seen by the fit): " + (", ".join(g["held_out"]) or "none")]
    if path.exists():
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    for g in groups:
        rep = g["report"]
        meta = {"fitted_on": f"{CSV_NAME}: {key}, {len(g['fitted'])} fitted rows", "rows": rep["rows"],
                "fitted_rows": ", ".join(g["fitted"]), "held_out_rows": ", ".join(g["held_out"]),
                "params": ", ".join(stack.fit.params),
                "mape_before_pct": round(rep["mape_before_pct"], 3), "mape_after_pct": round(rep["mape_after_pct"], 3)}
        for preset in (g["gpu"], *g["share"]):
            update_calibration_file(path, preset, calibration_values(g["calibration"]),
                                    meta=meta if preset == g["gpu"] else {**meta, "fitted_as": g["gpu"]},
                                    comment=tuple(comment))
    return path, groups


def load_stack_calibration(key: str, folder=None) -> dict | None:
    """GPU preset -> Calibration of stack ``key``'s file, or ``None`` (no fit, or no file)."""
    from ..plan.spec import load_calibration
    path = stack_calibration_path(key, folder)
    return load_calibration(path) if path is not None and path.exists() else None


# ------------------------------------------------------------------------------ the validation
def validate_published(calibration: dict | None = None, stack_folder=None, assume: bool = True) -> pl.DataFrame:
    """Every published row with its measured seconds per iteration (where convertible), whether
    the model can express it (and why not), and for expressible rows the prediction. With
    ``assume`` (default) the rows carry the values :data:`ASSUMPTIONS` fills; without, the rows
    as the CSV states them (the stated rows only are then expressible; the fit roles stay those of
    the shipped split, :func:`fit_roles` of the assumed rows).

    Returns
    -------
    polars.DataFrame
        One row per CSV row: ``id, source, gpu (as published), gpu_preset, measured_metric,
        measured_value, measured_iteration_time_s, conversion, expressible, reason`` (every
        reason, '; '-joined; null when expressible), ``basis`` (:func:`row_basis`: ``stated`` |
        ``assumed``), ``assumed_values`` (the filled columns and settings, ', '-joined),
        ``assumption_sources`` (:func:`assumption_sources`), ``assumptions``, ``status`` (the model's,
        null when not expressible), ``iteration_time_s`` (predicted; null unless expressible and
        ``ok``), ``error_pct`` (signed, predicted vs measured) and ``ape_pct``, then the plan
        columns of the expressible rows and the model's other outputs; last the stack
        calibration's: ``stack_calibration`` (its file name), ``fit_role`` (``fitted`` |
        ``held_out`` by :func:`fit_roles`, null for rows no stack fit covers),
        ``stack_iteration_time_s``, ``stack_error_pct`` and ``stack_ape_pct`` (null where the
        stack has no calibration file: in ``stack_folder``, default the shipped one).
    """
    runs = load_runs(assume)
    base = []
    for r in runs:
        reasons = unexpressible_reasons(r)
        try:
            measured, conversion = measured_iteration_time(r)
        except NotConvertible:
            measured, conversion = None, None
        gm = gpu_preset(r.get("gpu"))
        base.append(dict(id=r["id"], source=source_label(r), stack=r["source_key"], gpu_published=r.get("gpu"),
                         gpu_preset=gm.preset if gm else None, model_name=r.get("model"),
                         measured_metric=r["measured_metric"], measured_value=r["measured_value"],
                         measured_iteration_time_s=measured, conversion=conversion,
                         expressible=not reasons, reason="; ".join(reasons) or None,
                         basis=row_basis(r), assumed_values=", ".join(r["assumed"]) or None,
                         assumption_sources=assumption_sources(r),
                         assumptions=plan_row(r)[1] if not reasons else None))
    frame = pl.DataFrame(base, infer_schema_length=None)
    ok_rows = [r for r, b in zip(runs, base) if b["expressible"]]
    if ok_rows:
        priced = evaluate_frame(plan_frame(ok_rows), CSV_NAME, calibration)
        frame = frame.join(priced.drop("gpu"), on="id", how="left")
    else:
        frame = frame.with_columns(pl.lit(None, pl.String).alias("status"),
                                   pl.lit(None, pl.Float64).alias("iteration_time_s"))
    frame = with_errors(frame)
    roles = fit_roles(runs) if assume else fit_roles()
    return frame.join(_stack_predictions(runs, ok_rows, stack_folder, roles), on="id", how="left")


def with_errors(frame: pl.DataFrame) -> pl.DataFrame:
    """``frame`` (rows with ``status``, ``iteration_time_s`` predicted and
    ``measured_iteration_time_s``) with ``iteration_time_memory_aside_s`` (the prediction where
    the status is ok or out_of_memory), ``iteration_time_s`` nulled unless ok, ``error_pct``,
    ``ape_pct`` and ``ape_memory_aside_pct``."""
    # the runs ran: where the model finds one out of memory its iteration time is still what the
    # time model says (kept apart, memory_aside, so that the memory model's miss stays visible)
    frame = frame.with_columns(
        pl.when(pl.col("status").is_in(["ok", "out_of_memory"])).then(pl.col("iteration_time_s")).otherwise(None)
        .alias("iteration_time_memory_aside_s"))
    frame = frame.with_columns(
        pl.when(pl.col("status") == "ok").then(pl.col("iteration_time_s")).otherwise(None).alias("iteration_time_s"))
    err = (pl.col("iteration_time_s") - pl.col("measured_iteration_time_s")) / pl.col("measured_iteration_time_s") * 100.0
    aside = ((pl.col("iteration_time_memory_aside_s") - pl.col("measured_iteration_time_s"))
             / pl.col("measured_iteration_time_s") * 100.0)
    return frame.with_columns(err.alias("error_pct"), err.abs().alias("ape_pct"),
                              aside.abs().alias("ape_memory_aside_pct"))


def _stack_predictions(runs: list[dict], ok_rows: list[dict], folder, roles: dict) -> pl.DataFrame:
    """Per row id: the stack calibration's file, fit role and prediction (columns of
    :func:`validate_published`)."""
    parts = []
    for key in STACKS:
        rows = [r for r in ok_rows if r["source_key"] == key and fit_covers(r)]
        cal = load_stack_calibration(key, folder) if rows else None
        if cal is None:
            continue
        priced = evaluate_frame(plan_frame(rows), CSV_NAME, cal)
        t = pl.when(priced["status"] == "ok").then(priced["iteration_time_s"]).otherwise(None)
        t_any = pl.when(priced["status"].is_in(["ok", "out_of_memory"])).then(priced["iteration_time_s"]).otherwise(None)
        parts.append(priced.select("id", t.alias("stack_iteration_time_s"), t_any.alias("stack_memory_aside_s"))
                     .with_columns(pl.lit(STACKS[key].fit.file).alias("stack_calibration")))
    schema = {"id": pl.String, "stack_iteration_time_s": pl.Float64, "stack_memory_aside_s": pl.Float64,
              "stack_calibration": pl.String}
    pred = pl.concat(parts) if parts else pl.DataFrame(schema=schema)
    out = pl.DataFrame({"id": [r["id"] for r in runs], "fit_role": [roles.get(r["id"]) for r in runs]},
                       schema={"id": pl.String, "fit_role": pl.String}).join(pred, on="id", how="left")
    meas = {r["id"]: measured_iteration_time(r)[0] for r in ok_rows}
    m = pl.col("id").replace_strict(meas, default=None, return_dtype=pl.Float64)
    err = (pl.col("stack_iteration_time_s") - m) / m * 100.0
    aside = ((pl.col("stack_memory_aside_s") - m) / m * 100.0).abs()
    return out.select("id", "stack_calibration", "fit_role", "stack_iteration_time_s",
                      err.alias("stack_error_pct"), err.abs().alias("stack_ape_pct"),
                      aside.alias("stack_ape_memory_aside_pct"))


def memory_aside(rows: pl.DataFrame) -> dict:
    """The iteration-time MAPE over the expressible rows whose plan the model prices, counting the
    ones it finds out of memory (the runs ran: the memory model misses them, the time model still
    prices them): ``rows`` (those rows), ``out_of_memory``, ``shipped_mape_pct`` (shipped
    calibration) and ``stack_mape_pct`` (the stack calibration where one covers the row, else the
    shipped prediction)."""
    timed = rows.filter(pl.col("ape_memory_aside_pct").is_not_null())
    best = pl.coalesce("stack_ape_memory_aside_pct", "ape_memory_aside_pct")
    return {"rows": timed.height, "out_of_memory": int((timed["status"] == "out_of_memory").sum()),
            "shipped_mape_pct": float(timed["ape_memory_aside_pct"].mean()) if timed.height else None,
            "stack_mape_pct": float(timed.select(best).to_series().mean()) if timed.height else None}


def summary(rows: pl.DataFrame, by: str) -> pl.DataFrame:
    """Per ``by`` value: rows, expressible, priced (model status ok), MAPE, median and max
    absolute percentage error of the priced rows, and the mean signed error; a last row 'all'."""
    def one(name, g):
        ape = g["ape_pct"].drop_nulls().to_numpy()
        signed = g["error_pct"].drop_nulls().to_numpy()
        return {by: name, "rows": g.height, "expressible": int(g["expressible"].sum()), "priced": len(ape),
                "mape_pct": float(np.mean(ape)) if len(ape) else None,
                "median_ape_pct": float(np.median(ape)) if len(ape) else None,
                "max_ape_pct": float(np.max(ape)) if len(ape) else None,
                "mean_error_pct": float(np.mean(signed)) if len(signed) else None}
    out = [one(k[0], g) for k, g in rows.group_by(by, maintain_order=True)]
    out.append(one("all", rows))
    return pl.DataFrame(out, schema_overrides={"mape_pct": pl.Float64, "median_ape_pct": pl.Float64,
                                               "max_ape_pct": pl.Float64, "mean_error_pct": pl.Float64})


def basis_summary(rows: pl.DataFrame, by: str) -> pl.DataFrame:
    """Per ``by`` value (and a last row 'all'): the priced rows and their MAPE with the shipped
    calibration, then the same for the rows priced with stated values only (``stated``,
    ``stated_mape``) and for those relying on an assumption (``assumed``, ``assumed_mape``):
    :func:`row_basis`, column ``basis``."""
    def mape(g):
        a = g["ape_pct"].drop_nulls().to_numpy()
        return len(a), (float(np.mean(a)) if len(a) else None)

    def one(name, g):
        n, m = mape(g)
        ns, ms = mape(g.filter(pl.col("basis") == STATED))
        na, ma = mape(g.filter(pl.col("basis") == ASSUMED))
        return {by: name, "priced": n, "mape": m, "stated": ns, "stated_mape": ms, "assumed": na, "assumed_mape": ma}
    out = [one(k[0], g) for k, g in rows.group_by(by, maintain_order=True)]
    out.append(one("all", rows))
    return pl.DataFrame(out, schema_overrides={c: pl.Float64 for c in ("mape", "stated_mape", "assumed_mape")})


def stack_summary(rows: pl.DataFrame, by: str) -> pl.DataFrame:
    """Per ``by`` value (and a last row 'all'): the MAPE of the priced rows with the shipped
    calibration (``shipped``, every row held out), then with the stack calibrations the fitted
    rows (``fit_n``, ``fitted`` MAPE) and the held-out rows (``held_n``, ``held`` MAPE) apart,
    and the shipped calibration's MAPE on those held-out rows (``ship_ho``: the same rows
    before and after the stack fit)."""
    def mape(g):
        a = g.drop_nulls().to_numpy()
        return float(np.mean(a)) if len(a) else None

    def one(name, g):
        f = g.filter(pl.col("fit_role") == FITTED)
        h = g.filter(pl.col("fit_role") == HELD_OUT)
        return {by: name, "shipped": mape(g["ape_pct"]),
                "fit_n": int(f["stack_ape_pct"].is_not_null().sum()), "fitted": mape(f["stack_ape_pct"]),
                "held_n": int(h["stack_ape_pct"].is_not_null().sum()), "held": mape(h["stack_ape_pct"]),
                "ship_ho": mape(h.filter(pl.col("stack_ape_pct").is_not_null())["ape_pct"])}
    out = [one(k[0], g) for k, g in rows.group_by(by, maintain_order=True)]
    out.append(one("all", rows))
    return pl.DataFrame(out, schema_overrides={c: pl.Float64 for c in ("shipped", "fitted", "held", "ship_ho")})


def stack_parameters(folder=None) -> pl.DataFrame:
    """The fitted parameters of every stack calibration file: ``stack, gpu, param, value,
    shipped`` (the preset's value) and ``note`` (at a bound of its range; a GEMM efficiency
    below 80 % of the preset's published one, i.e. below matmul benchmarks). A preset fitted
    with another (:attr:`GPUMap.fit_with`) is not listed: its values are that one's."""
    from ..hardware.gpus import CALIBRATION_RANGES, PRESETS
    out = []
    for key, stack in STACKS.items():
        cal = load_stack_calibration(key, folder) if stack.fit else None
        shared = {m.preset for m in GPU_PRESETS if m.fit_with}
        for gpu, c in (cal or {}).items():
            if gpu in shared:         # the values of the preset it is fitted with
                continue
            for p in stack.fit.params:
                v, ref = getattr(c, p), getattr(PRESETS[gpu].calibration, p)
                lo, hi = CALIBRATION_RANGES[p]
                tol = 1e-6 * (hi - lo)
                note = ("at its range's upper bound" if v >= hi - tol else "at its range's lower bound" if v <= lo + tol
                        else "below 80 % of the preset's published (matmul benchmark) value"
                        if p in ("gemm_efficiency", "fp8_gemm_efficiency") and v < 0.8 * ref else None)
                out.append(dict(stack=key, gpu=gpu, param=p, value=v, shipped=ref, note=note))
    return pl.DataFrame(out, schema={"stack": pl.String, "gpu": pl.String, "param": pl.String, "value": pl.Float64,
                                     "shipped": pl.Float64, "note": pl.String})


def reason_counts(rows: pl.DataFrame) -> pl.DataFrame:
    """How many rows each reason keeps out (a row may have several), most frequent first;
    ``only`` counts the rows it alone keeps out (deleting its rule would price them)."""
    counts: dict[str, list[int]] = {}
    for text in rows["reason"].drop_nulls().to_list():
        parts = text.split("; ")
        for p in parts:
            c = counts.setdefault(_reason_kind(p), [0, 0])
            c[0] += 1
            c[1] += len(parts) == 1
    return pl.DataFrame([{"reason": k, "rows": v[0], "only": v[1]} for k, v in counts.items()],
                        schema={"reason": pl.String, "rows": pl.Int64, "only": pl.Int64}
                        ).sort(["rows", "reason"], descending=[True, False])


def _reason_kind(text: str) -> str:
    """A reason without its row-specific part in parentheses, for counting."""
    return text.split(" (")[0]


def plot(rows: pl.DataFrame, path) -> None:
    """Predicted vs measured seconds per iteration of the priced rows, one colour per source,
    log axes, y = x line (PNG)."""
    from .report import plot_predicted_vs_measured
    priced = rows.filter(pl.col("ape_pct").is_not_null())
    groups = [(f"{name} ({g.height})", g) for (name,), g in priced.group_by("source", maintain_order=True)]
    plot_predicted_vs_measured(groups, path, "vtrain_fast vs published runs (held out)",
                               "measured seconds per iteration", "predicted seconds per iteration", size=18,
                               legend_size=8)
