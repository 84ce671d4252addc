"""Evaluate explicit configurations (one per CSV row) with the same kernel as sweeps."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from ..engine.chunks import output_arrays
from ..io.errors import InputError, check_output_file, did_you_mean, similar_names, write_atomically
from ..io.inputs import MAX_TABLE_BYTES, check_input_file
from ..hardware.gpus import OVERRIDE_RANGES, PRESETS, machine_vector, with_overrides
from ..model.layout import Layout, world_size
from ..model.records import HW_FIELDS, MACHINE, MODEL_FIELDS, NUM_HW_FIELDS, NUM_OUTPUTS, ROW_FIELDS
from ..model.sweep import evaluate_rows
from ..model.arch import ARCH_FLAGS, ARCH_NAMES, BY_NAME as ARCH_BY_NAME
from ..model.moe import KERNEL_COLUMNS as MOE_COLUMNS, KERNEL_NAMES as MOE_NAMES
from ..model.moe import MLA_FIELDS, kernel_values
from ..plan.models import DEFAULT_VOCAB_SIZE, MODEL_PRESETS, check_priced
from ..model.settings import BY_NAME, CHOICES, FLOAT_SETTINGS, INT_SETTINGS, LAYOUT_SIZES, SETTINGS, canonical_values, unmet_requirements
from ..io.schema import CLUSTER_COLUMNS, INPUT_COLUMNS, RESULT_COLUMNS, SETTING_COLUMNS, setting_values
from ..plan.spec import INT_RANGES as SPEC_INT_RANGES
from ..plan.spec import (INVERTED_NAMES, RECOMPUTE_DEFAULT, RECOMPUTE_VALUES, TRAINING_FLAGS,
                         check_flash_attention, check_precision, check_mxfp8, check_reserved)

REQUIRED = ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "global_batch_size",
            "micro_batch_size", "tp", "pp", "dp", "gpu")
# Cluster values a row may override (keys of hardware.OVERRIDE_RANGES, as in a spec's [cluster]).
OPTIONAL = ("ffn_hidden_size", "num_query_groups", "vocab_size", *ARCH_NAMES, *MOE_NAMES, "recompute", "precision",
            *CLUSTER_COLUMNS, "num_tokens", *TRAINING_FLAGS, *(st.name for st in INT_SETTINGS),
            *(st.name for st in FLOAT_SETTINGS), "cp",
            *(st.name for st in CHOICES if st.name != "precision"))
# Optional, and checked: num_gpus must be tp x cp x pp x dp, num_nodes ceil(num_gpus / gpus_per_node).
CHECKED = ("num_gpus", "num_nodes")
INPUT_NAMES = REQUIRED + OPTIONAL + CHECKED
# A column this close to an input column (difflib ratio, after lower-casing) is taken for a
# misspelling of it rather than for a label: "recomputation" (0.73), "num_token", "seq_len".
# Labels such as name, model, notes, id stay below it.
NEAR_MISS_CUTOFF = 0.7
# Label names that come close to an input column's but mean something else.
LABELS = {"num_params", "params", "params_billion", "model_params", "num_experiments"}
# Other tools' names for input columns (Hugging Face configs, Megatron-LM arguments, nanoGPT):
# a column so named would otherwise pass through as a label while its input takes the default.
ALIASES = {
    "num_hidden_layers": "num_layers", "n_layer": "num_layers", "n_layers": "num_layers",
    "d_model": "hidden_size", "n_embd": "hidden_size", "hidden_dim": "hidden_size", "dim": "hidden_size",
    "n_head": "num_attention_heads", "n_heads": "num_attention_heads", "num_heads": "num_attention_heads",
    "num_key_value_heads": "num_query_groups", "num_kv_heads": "num_query_groups",
    "n_kv_heads": "num_query_groups", "kv_heads": "num_query_groups",
    "intermediate_size": "ffn_hidden_size", "ffn_dim": "ffn_hidden_size", "n_inner": "ffn_hidden_size",
    "max_position_embeddings": "seq_length", "n_positions": "seq_length", "context_length": "seq_length",
    "tensor_model_parallel_size": "tp", "pipeline_model_parallel_size": "pp", "data_parallel_size": "dp",
    "context_parallel_size": "cp",
    "expert_model_parallel_size": "ep", "expert_tensor_parallel_size": "etp",
    "virtual_pipeline_model_parallel_size": "vpp", "num_layers_per_virtual_pipeline_stage": "vpp",
    "mbs": "micro_batch_size", "gbs": "global_batch_size", "train_tokens": "num_tokens",
    "recompute_granularity": "recompute", "recompute_activations": "recompute",
    "use_distributed_optimizer": "distributed_optimizer",
    "zero_optimization_stage": "zero_stage",
    "num_layers_in_first_pipeline_stage": "first_pipeline_num_layers",
    "num_layers_in_last_pipeline_stage": "last_pipeline_num_layers",
    "decoder_first_pipeline_num_layers": "first_pipeline_num_layers",
    "decoder_last_pipeline_num_layers": "last_pipeline_num_layers",
    "swiglu": "gated_mlp",
}
# Settings of Megatron-LM (argument names, dashes as underscores) and neighbouring tools that the
# cost model does not have: a column with one of these names would pass through as a label and
# the plan would be priced without it, so it is refused with what to do instead.
UNMODELLED = {
    "recompute_num_layers": "partial (block) recomputation is not modelled; recompute is none, selective or full",
    "recompute_method": "partial (block or uniform) recomputation is not modelled; "
                        "recompute is none, selective or full",
    "fp8": "use the column precision = fp8",
    "fp8_format": "use the column precision = fp8 (Transformer Engine's hybrid E4M3/E5M2 format is what is "
                  "modelled; the column fp8_recipe picks delayed, tensorwise or mxfp8 scaling)",
    "data_parallel_sharding_strategy": "use the column zero_stage: no_shard 0, optim 1, optim_grads 2, "
                                       "optim_grads_params 3",
    "sharding_strategy": "use the column zero_stage: PyTorch FSDP FULL_SHARD is 3, SHARD_GRAD_OP 2, NO_SHARD 0 "
                         "(HYBRID_SHARD is not modelled)",
    "bf16": "use the column precision = bf16", "fp16": "use the column precision = fp16",
    "sp": "use the column sequence_parallel (true or false)",
    "world_size": "use the column num_gpus (or leave it out: tp x cp x pp x dp)",
}

# Allowed ranges of the integer columns: the spec's, plus dp and gpus_per_node.
CSV_INT_RANGES = {**SPEC_INT_RANGES, "dp": (1, 100_000_000), "gpus_per_node": OVERRIDE_RANGES["gpus_per_node"],
                  **{st.name: st.int_range for st in INT_SETTINGS},
                  **{name: (0, 100_000) for name in MOE_NAMES},
                  "moe_router_topk": (1, 100_000), "moe_layer_step": (1, 100_000),
                  "multi_latent_attention": (0, 1), **{name: (0, 1_000_000) for name in MLA_FIELDS}}
# The precision column: the registry's choices (bf16, fp8, fp16, fp32, tf32).
PRECISIONS = BY_NAME["precision"].choices
DEFAULT_NUM_TOKENS = 300e9


def _int_column(df: pl.DataFrame, name: str, where: str, default=None) -> np.ndarray:
    """Whole numbers within :data:`CSV_INT_RANGES`; empty cells (or a missing column) take
    ``default`` (0 means "derive from the model"); with ``default=None`` a value is required."""
    if name not in df.columns:
        return np.full(df.height, default, dtype=np.int64)
    lo, hi = CSV_INT_RANGES[name]
    col = df[name]
    empty = col.is_null().to_numpy()
    if col.dtype == pl.Boolean:
        vals = np.full(df.height, np.nan)
    else:
        vals = col.cast(pl.Float64, strict=False).fill_null(np.nan).to_numpy().astype(np.float64)
    with np.errstate(invalid="ignore"):
        bad = np.isnan(vals) | (vals != np.round(vals)) | (vals < lo) | (vals > hi)
    if default is not None:
        bad &= ~empty
    if bad.any():
        i = int(np.argmax(bad))
        raise InputError(where, f"column {name}, row {i + 2}", col[i], f"whole numbers from {lo} to {hi}",
                         "write a whole number in that range" + (", or leave the cell empty for the default"
                                                                 if default is not None else ""))
    return np.where(empty, 0 if default is None else default, np.nan_to_num(vals)).astype(np.int64)


def _check_moe_rows(moe_cols: dict, num_layers: np.ndarray, where: str, heads=None, groups=None,
                    kv_channels=None) -> None:
    """The MoE columns of each row checked together, as a model file's are
    (:func:`vtrain_fast.plan.models.shape_fields_from_table`, Megatron-core's
    ``TransformerConfig.__post_init__``): an MoE row (``num_experts`` >= 1) routes each token to
    1 .. num_experts experts and keeps at least one MoE layer after its dense first layers. A
    multi-head latent attention row (``multi_latent_attention`` 1) has a ``kv_lora_rank``,
    ``qk_head_dim`` and ``v_head_dim`` of at least 1, ``num_query_groups`` = ``num_attention_heads``
    and no ``kv_channels`` (Megatron-core's MLA); a row without MLA leaves the MLA columns 0.

    Raises
    ------
    InputError
        Naming the column, the row and the allowed values.
    """
    experts, topk = moe_cols["num_experts"], moe_cols["moe_router_topk"]
    moe = experts >= 1
    for bad, name, allowed in (
            (moe & (topk > experts), "moe_router_topk", "a whole number from 1 to num_experts"),
            (moe & (moe_cols["moe_first_dense_layers"] >= num_layers), "moe_first_dense_layers",
             "fewer than num_layers (at least one MoE layer)")):
        if bad.any():
            i = int(np.argmax(bad))
            raise InputError(where, f"column {name}, row {i + 2}", int(moe_cols[name][i]), allowed,
                             f"this row has num_experts = {int(experts[i])} and num_layers = {int(num_layers[i])}")
    mla = moe_cols["multi_latent_attention"] == 1
    checks = [(~mla & (moe_cols[n] != 0), n, "0 without multi_latent_attention",
               "set multi_latent_attention to 1, or leave the MLA columns empty") for n in MLA_FIELDS]
    checks += [(mla & (moe_cols[n] < 1), n, "a whole number of at least 1 with multi_latent_attention",
                "give the MLA widths (DeepSeek-V3: kv_lora_rank 512, qk_head_dim 128, v_head_dim 128)")
               for n in ("kv_lora_rank", "qk_head_dim", "v_head_dim")]
    if kv_channels is not None:
        checks.append((mla & (kv_channels != 0), "kv_channels", "0 with multi_latent_attention (its head widths are "
                       "qk_head_dim, qk_pos_emb_head_dim and v_head_dim)", "leave kv_channels empty"))
    if heads is not None and groups is not None:
        checks.append((mla & (groups != heads), "num_query_groups", "num_attention_heads with multi_latent_attention "
                       "(its keys and values are per head)", "leave num_query_groups empty"))
    for bad, name, allowed, fix in checks:
        if bad.any():
            i = int(np.argmax(bad))
            value = (kv_channels if name == "kv_channels" else groups if name == "num_query_groups" else moe_cols[name])[i]
            raise InputError(where, f"column {name}, row {i + 2}", int(value), allowed, fix)


def _float_column(df, name, where, default, lo, hi) -> np.ndarray:
    """Numbers from ``lo`` to ``hi``; empty cells (or a missing column) take ``default``
    (NaN when ``default`` is None, meaning "use the preset")."""
    fill = np.nan if default is None else float(default)
    if name not in df.columns:
        return np.full(df.height, fill, dtype=np.float64)
    col = df[name]
    empty = col.is_null().to_numpy()
    if col.dtype == pl.Boolean:         # true / false are not numbers (a cast would read them as 1 / 0)
        vals = np.full(df.height, np.nan)
    else:
        vals = col.cast(pl.Float64, strict=False).fill_null(np.nan).to_numpy().astype(np.float64)
    bad = ~empty & (np.isnan(vals) | (vals < lo) | (vals > hi))
    if bad.any():
        i = int(np.argmax(bad))
        raise InputError(where, f"column {name}, row {i + 2}", col[i], f"numbers from {lo:g} to {hi:g}",
                         "write a number in that range" + (", or leave the cell empty for the default"
                                                           if default is not None else ", or leave the cell empty"))
    return np.where(empty, fill, vals)


def _str_column(df, name, where, allowed, default) -> list[str]:
    if name not in df.columns:
        return [default] * df.height
    out = []
    for i, v in enumerate(df[name].cast(pl.String).to_list()):
        if v is None or v == "":
            v = default
        elif v not in allowed:          # a name as written (a GPU of your own: any case), else any case, padded
            v = v.strip().lower()
        if v not in allowed:
            raise InputError(where, f"column {name}, row {i + 2}", v, "one of " + ", ".join(allowed),
                             did_you_mean(v, allowed, "a GPU of your own: pass --gpus FILE with its [gpus.<name>] "
                                                      "table" if name == "gpu" else f"write one of {', '.join(allowed)}"))
        out.append(v)
    return out


def arch_column(df, fl, where) -> np.ndarray:
    """The codes (``ArchFlag.encode``, ``int64``) of architecture flag ``fl``'s column: ``true`` /
    ``false`` (or 1 / 0) for a bool flag, a choice (any case) for a str one; empty cells and a
    missing column take the default."""
    if fl.kind is bool:
        vals = _str_column(df, fl.name, where, ("true", "false", "1", "0"), str(fl.default).lower())
        return np.array([v in ("true", "1") for v in vals], dtype=np.int64)
    low = tuple(c.lower() for c in fl.choices)
    vals = _str_column(df, fl.name, where, low, fl.default.lower())
    return np.array([low.index(v) for v in vals], dtype=np.int64)


def _normalised(name: str) -> str:
    return name.strip().lower().replace("-", "_").replace(" ", "_")


def check_column_names(columns, where: str) -> None:
    """Refuse a column that looks like a misspelt input column, which would otherwise pass
    through as a label while its input silently takes the default.

    A column is refused when, lower-cased with spaces and hyphens as underscores, it equals an
    input column (``Recompute``, ``Num Tokens``), or when :func:`~vtrain_fast.io.errors.similar_names`
    finds an input column the file lacks at ratio >= :data:`NEAR_MISS_CUTOFF` both ways
    (``recomputation``, ``num_token``). vtrain-fast's own result columns
    (:data:`~vtrain_fast.io.schema.RESULT_COLUMNS`: ``num_steps``, ``cost_usd``, ...) are never
    taken for misspelt inputs (:func:`evaluate_frame` names them as results). Other columns pass
    through unchanged.

    Parameters
    ----------
    columns : sequence of str
        The file's column names.
    where : str
        File name for error messages.

    Raises
    ------
    InputError
        Naming the file, the column and the input column it is close to.
    """
    known = {_normalised(k): k for k in INPUT_NAMES}
    present = set(columns)
    for col in columns:
        if col in INPUT_NAMES or col in RESULT_COLUMNS or _normalised(col) in LABELS:
            continue
        norm = _normalised(col)
        if norm in INVERTED_NAMES:
            raise InputError(where, "column", col, "the input column grad_reduce_in_bf16 (the opposite switch)",
                             INVERTED_NAMES[norm])
        if norm in UNMODELLED:
            raise InputError(where, "column", col, "a column vtrain_fast models",
                             f"{UNMODELLED[norm]}: drop the column to price the plan without it")
        target = known.get(norm) or ALIASES.get(norm)
        if target is None:
            close = similar_names(norm, [k for k in known if known[k] not in present], NEAR_MISS_CUTOFF)
            target = known[close[0]] if close else None
        if target is not None:
            fix = f"rename the column {col!r} to {target!r}"
            if norm == "num_layers_per_virtual_pipeline_stage":
                fix = "give vpp = num_layers / (pp x num_layers_per_virtual_pipeline_stage) instead"
            raise InputError(where, "column", col,
                             f"the input column {target}, or a label not close to an input column name "
                             "(labels pass through unchanged)", fix)


def evaluate_frame(df: pl.DataFrame, where: str = "<frame>", calibration: dict | None = None,
                   gpus: dict | None = None, models: dict | None = None, kernel_inputs: bool = False):
    """Evaluate every row of ``df`` (columns as in the ``evaluate`` command).

    Parameters
    ----------
    df : polars.DataFrame
        One configuration per row; required columns :data:`REQUIRED`, optional :data:`OPTIONAL`
        and :data:`CHECKED`. Other columns (labels such as ``name``) are passed through, unless
        their name is close to an input column's (:func:`check_column_names`).
    where : str
        File name for error messages.
    calibration : dict, optional
        GPU preset name -> Calibration.
    gpus : dict, optional
        GPU name -> GPUPreset the ``gpu`` column may name (default: the presets; ``--gpus``).
    models : dict, optional
        Model name -> ModelShape the ``model`` column may name (default: the presets;
        ``--models``: :func:`vtrain_fast.plan.spec.load_models`).
    kernel_inputs : bool
        Return the checked kernel inputs instead of evaluating them: ``(cols, tokens, hw_rows)``,
        as :func:`~vtrain_fast.model.sweep.evaluate_rows` takes them (:mod:`vtrain_fast.analysis.show`
        prices one plan part by part from them).

    Returns
    -------
    polars.DataFrame
        The label columns of ``df``, then the sweep schema's input columns (all but ``model``,
        which passes through if given) with the values used (defaults filled in, ``num_gpus``
        and ``num_nodes`` added), ``status`` and every output column.

    Raises
    ------
    InputError
        Missing or misspelt column, bad value, unknown GPU preset, num_gpus / num_nodes that
        disagree with tp x pp x dp, more than 100,000,000 GPUs.
    """
    dup = [c for c in df.columns if "_duplicated_" in c]
    if dup:
        raise InputError(where, "duplicated column", dup[0].split("_duplicated_")[0],
                         "each column once", "remove the repeated column from the header")
    check_not_a_plan_table(df.columns, where)
    check_column_names(df.columns, where)
    if df.height == 0:          # a header alone: say so before any missing column
        raise InputError(where, "rows", 0, "at least one configuration row under the header",
                         "add rows under the header (one plan a row)")
    models = models or MODEL_PRESETS
    if "model" in df.columns:
        names = df["model"].cast(pl.String).to_list()
        for name, i in {n: i for i, n in reversed(list(enumerate(names)))}.items():   # each model's first row
            if name in models:
                check_priced(where, f"column model, row {i + 2}", models[name],
                             "leave its rows out; vtrain-fast presets lists its total and active parameters (the "
                             "kernels take every k-th layer or dense first layers as MoE layers; a capacity factor "
                             "is the column moe_expert_capacity_factor)")
    df = with_model_shapes(df, models)
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        fix = "add the missing column(s) to the header"
        if "model" in df.columns and set(missing) & set(MODEL_FIELDS):
            unknown = sorted({str(m) for m in df["model"].to_list() if m not in models})
            fix = (f"add them, or name a model preset in the model column ({unknown[0]!r} is none: "
                   + did_you_mean(unknown[0], models, "vtrain-fast presets lists them; --models FILE adds a model "
                                  "file's") + ")") if unknown else fix
        raise InputError(where, "missing column(s)", ", ".join(missing),
                         "a header with the required columns " + ", ".join(REQUIRED) + " (the shape columns, or a "
                         "model column naming a model preset)", fix)
    clash = [c for c in df.columns if c in RESULT_COLUMNS]
    if clash:
        raise InputError(where, "column", clash[0], "input columns; the names of vtrain-fast's result columns "
                         "are reserved: " + ", ".join(RESULT_COLUMNS),
                         f"{clash[0]!r} is a result that vtrain-fast computes (evaluate, pareto -o, plan -o, optimal "
                         "-o and advise -o write it), not an input: drop the column (`vtrain-fast evaluate`, show and export "
                         "set such columns aside themselves and recompute them)")
    n = df.height
    ints = {c: _int_column(df, c, where, None) for c in REQUIRED if c != "gpu"}
    h, a = ints["hidden_size"], ints["num_attention_heads"]
    ffn = _int_column(df, "ffn_hidden_size", where, 0)
    ffn = np.where(ffn == 0, 4 * h, ffn)
    groups = _int_column(df, "num_query_groups", where, 0)
    groups = np.where(groups == 0, a, groups)
    vocab = _int_column(df, "vocab_size", where, DEFAULT_VOCAB_SIZE)
    arch_codes = {fl.name: arch_column(df, fl, where) for fl in ARCH_FLAGS}
    moe_cols = {name: _int_column(df, name, where, default) for name, default in MOE_COLUMNS}
    _check_moe_rows(moe_cols, ints["num_layers"], where, a, groups, moe_cols["kv_channels"])
    recompute = _str_column(df, "recompute", where, RECOMPUTE_VALUES, RECOMPUTE_DEFAULT)
    precision = _str_column(df, "precision", where, PRECISIONS, BY_NAME["precision"].default)
    known = gpus or PRESETS
    gpu = _str_column(df, "gpu", where, tuple(known), "")
    gpn = _int_column(df, "gpus_per_node", where, 0)
    cluster = {k: _float_column(df, k, where, None, *OVERRIDE_RANGES[k]) for k in CLUSTER_COLUMNS[1:]}
    tokens = _float_column(df, "num_tokens", where, DEFAULT_NUM_TOKENS, 1.0, 1e16)
    flags = {name: [v in ("true", "1") for v in
                    _str_column(df, name, where, ("true", "false", "1", "0"), "false")]
             for name in TRAINING_FLAGS}
    int_settings = {st.name: _int_column(df, st.name, where, st.default) for st in INT_SETTINGS}
    float_settings = {st.name: _float_column(df, st.name, where, st.default, *st.int_range) for st in FLOAT_SETTINGS}
    # the str settings other than precision (cp_comm_type): one of their choices, default theirs
    choice_settings = {st.name: _str_column(df, st.name, where, st.choices, st.default)
                       for st in CHOICES if st.name != "precision"}
    cp = _int_column(df, "cp", where, 1)
    calibration = calibration or {}
    cache: dict = {}
    hw_rows = np.empty((n, NUM_HW_FIELDS), dtype=np.float64)
    row_presets = []            # the machine of each row (its cluster values fill empty cells)
    checked: set = set()
    for i in range(n):
        row_flags = {name: flags[name][i] for name in TRAINING_FLAGS}
        values = {k: None if np.isnan(v[i]) else float(v[i]) for k, v in cluster.items()}
        # the settings in one spelling (zero_stage 1 is the distributed optimizer)
        row_settings = canonical_values({**{k: int(v[i]) for k, v in int_settings.items()},
                                         **{k: float(v[i]) for k, v in float_settings.items()}, **row_flags})
        row_choices = {k: v[i] for k, v in choice_settings.items()}
        key = (gpu[i], int(gpn[i]), *values.values(), *row_settings.values(), precision[i], *row_choices.values())
        if key not in cache:
            ov = dict(gpus_per_node=int(gpn[i]) or None, **values, **row_settings, precision=precision[i],
                      **row_choices)
            preset = with_overrides(known[gpu[i]], calibration.get(gpu[i]), **ov)
            check_flash_attention(preset, where, f"row {i + 2}, column use_flash_attn")
            check_precision(preset, where, f"row {i + 2}, column precision")
            check_mxfp8(preset, where, f"row {i + 2}, column fp8_recipe")
            # the GPU without the row's value: the fix names the value it keeps otherwise
            check_reserved(known[gpu[i]], values["reserved_GiB"], where, f"column reserved_GiB, row {i + 2}")
            cache[key] = (machine_vector(preset), preset)
        # "dp": the data-parallel-with-context group (dp x cp), as model.rules.plan_case reads it
        row_sizes = {"tp": int(ints["tp"][i]), "pp": int(ints["pp"][i]), "dp": int(ints["dp"][i]) * int(cp[i]),
                     "cp": int(cp[i])}
        sizes_are_1 = {k: row_sizes[k] == 1 for k in LAYOUT_SIZES}
        kind = (key, *sizes_are_1.values())       # one check per machine and kind of plan
        if kind not in checked:
            check_row_requirements(cache[key][1], sizes_are_1, where, i + 2)
            checked.add(kind)
        hw_rows[i] = cache[key][0]
        row_presets.append(cache[key][1])
    # the world size as floats first: each size may be up to 10^8, their int64 product would wrap
    hi = CSV_INT_RANGES["num_gpus"][1]
    sizes = dict(tp=ints["tp"], cp=cp, dp=ints["dp"], pp=ints["pp"])
    too_many = world_size.py_func(Layout(**{k: v.astype(np.float64) for k, v in sizes.items()})) > hi
    if too_many.any():
        i = int(np.argmax(too_many))
        raise InputError(where, f"columns tp x cp x pp x dp, row {i + 2}",
                         int(world_size.py_func(Layout(**{k: int(v[i]) for k, v in sizes.items()}))),
                         f"at most {hi} GPUs", "check tp, cp, pp and dp")
    num_gpus = world_size.py_func(Layout(**sizes))
    gpn_used = hw_rows[:, MACHINE.gpus_per_node].astype(np.int64)
    num_nodes = -(-num_gpus // gpn_used)
    for name, value, rule in (("num_gpus", num_gpus, "tp x cp x pp x dp"),
                              ("num_nodes", num_nodes, "ceil(num_gpus / gpus_per_node)")):
        given = _int_column(df, name, where, 0)
        bad = (given != 0) & (given != value)
        if bad.any():
            i = int(np.argmax(bad))
            raise InputError(where, f"column {name}, row {i + 2}", int(given[i]),
                             f"{rule} = {int(value[i])}, or an empty cell",
                             f"fix {name} or tp, cp, pp, dp" + (", gpus_per_node" if name == "num_nodes" else ""))
    row = dict(num_layers=ints["num_layers"], hidden_size=h, num_attention_heads=a, num_query_groups=groups,
               ffn_hidden_size=ffn, vocab_size=vocab, seq_length=ints["seq_length"], **arch_codes, **moe_cols,
               global_batch_size=ints["global_batch_size"], micro_batch_size=ints["micro_batch_size"], **sizes,
               recompute=np.array([RECOMPUTE_VALUES.index(r) for r in recompute], dtype=np.int64))
    cols = np.stack([row[k] for k in ROW_FIELDS])
    cols = np.ascontiguousarray(cols, dtype=np.int64)
    if kernel_inputs:
        return cols, np.ascontiguousarray(tokens), hw_rows
    out = np.empty((NUM_OUTPUTS, n), dtype=np.float64)
    status = np.empty(n, dtype=np.int8)
    evaluate_rows(cols, np.ascontiguousarray(tokens), hw_rows, out, status)
    result = pl.from_arrow(pa.table(output_arrays(out, status)))
    result = result.with_columns(pl.col("status").cast(pl.String))
    used = dict(num_layers=ints["num_layers"], hidden_size=h, num_attention_heads=a, num_query_groups=groups,
                ffn_hidden_size=ffn, vocab_size=vocab, seq_length=ints["seq_length"],
                **{k: ARCH_BY_NAME[k].decode_all(c) for k, c in arch_codes.items()}, **moe_cols,
                num_tokens=tokens,
                gpu=gpu, num_gpus=num_gpus, num_nodes=num_nodes, tp=ints["tp"], cp=cp, pp=ints["pp"], dp=ints["dp"],
                micro_batch_size=ints["micro_batch_size"], global_batch_size=ints["global_batch_size"],
                recompute=recompute)
    for col in SETTING_COLUMNS:
        used[col] = setting_values(col, hw_rows[:, HW_FIELDS.index(col)])
    used["precision"] = precision
    # a cluster column the file gives shows the value used in every row (an empty cell: the preset's)
    given = {c: pl.Series(c, [getattr(p, c) for p in row_presets], dtype=pl.Float64 if c != "gpus_per_node" else pl.Int64)
             for c in CLUSTER_COLUMNS if c in df.columns}
    df = df.with_columns(*given.values()) if given else df
    names = [c.name for c in INPUT_COLUMNS if c.name in used]
    used_df = pl.DataFrame({k: used[k] for k in names},
                           schema={k: pl.String if k in ("gpu", "recompute") or BY_NAME.get(k, BY_NAME["vpp"]).kind is str
                                   else pl.Float64 if k == "num_tokens" or BY_NAME.get(k, BY_NAME["vpp"]).kind is float
                                   else pl.Boolean if k in TRAINING_FLAGS or (k in ARCH_BY_NAME and ARCH_BY_NAME[k].kind is bool)
                                   else pl.String if k in ARCH_BY_NAME
                                   else pl.Int64
                                   for k in names})
    labels = df.drop([c for c in df.columns if c in used or c in result.columns])
    return pl.concat([labels, used_df, result], how="horizontal")


def check_row_requirements(preset, sizes_are_1: dict, where: str, row: int) -> None:
    """Refuse a row whose settings Megatron-LM refuses: a switch on without the setting it needs
    (:attr:`~vtrain_fast.model.settings.Setting.requires`), also where Megatron-LM switches that
    setting off on the row's plan (sequence parallelism at tp = 1).

    Raises
    ------
    InputError
        Naming the row, the column, what it needs and the fix.
    """
    values = {s.name: getattr(preset, s.name) for s in SETTINGS}
    for st, other, value in unmet_requirements(values, sizes_are_1):
        switched_off = values[other] == value       # given, but Megatron-LM turns it off on this plan
        sizes = " or ".join(f"{k} = 1" for k in BY_NAME[other].off_at)
        needs = (f"({st.owner()} needs it" if st.framework else
                 f"({st.megatron} needs {BY_NAME[other].megatron}; Megatron-LM refuses it otherwise")
        raise InputError(where, f"row {row}, column {st.name}", str(values[st.name]).lower(),
                         f"{other} = {str(value).lower()} in the same row {needs}"
                         + (f", and switches {other} off at {sizes})" if switched_off else ")"),
                         f"set {st.name} to {str(st.default).lower()} in row {row}" if switched_off else
                         f"set {other} to {str(value).lower()} or {st.name} to {str(st.default).lower()} in row {row}")


def with_model_shapes(df: pl.DataFrame, models: dict | None = None) -> pl.DataFrame:
    """``df`` with the shape of each row whose ``model`` cell names a model of ``models`` (default:
    the presets, :data:`~vtrain_fast.plan.models.MODEL_PRESETS`, ``vtrain-fast presets``) filled
    into its empty or missing shape cells (num_layers, hidden_size, num_attention_heads,
    num_query_groups, ffn_hidden_size, vocab_size, seq_length, the architecture flags and the MoE and
    kv_channels columns); a cell the row gives
    overrides the model's. Other ``model`` values stay labels."""
    if "model" not in df.columns:
        return df
    models = models or MODEL_PRESETS
    names = df["model"].cast(pl.String).to_list()
    shapes = {n: models[n].resolved() for n in set(names) if n in models}
    if not shapes:
        return df
    # the MoE, kv_channels and MLA columns as the kernels' rows hold them (kv_channels 0 for h / a,
    # the MLA widths 0 without MLA: moe.kernel_values)
    kernel = {n: dict(zip(MOE_NAMES, kernel_values(shape))) for n, shape in shapes.items()}
    for col in MODEL_FIELDS:
        fl = ARCH_BY_NAME.get(col)
        values = [(kernel[n][col] if col in kernel[n] else getattr(shapes[n], col))
                  if n in shapes else None for n in names]
        if fl is None:
            preset = pl.Series(col, [None if v is None else int(v) for v in values], dtype=pl.Int64)
        elif fl.kind is bool and col in df.columns and df.schema[col] == pl.Boolean:
            preset = pl.Series(col, values, dtype=pl.Boolean)
        else:       # text, as the column is read (true / false, a choice)
            preset = pl.Series(col, [None if v is None else str(v).lower() if fl.kind is bool else v for v in values],
                               dtype=pl.String)
        if col not in df.columns:
            df = df.with_columns(preset)
        else:
            kind = df.schema[col]
            fill = preset.cast(kind) if kind.is_numeric() or kind in (pl.String, pl.Boolean) else preset
            df = df.with_columns(pl.when(pl.col(col).is_null()).then(fill).otherwise(pl.col(col)).alias(col))
    return df


def without_earlier_results(plans: pl.DataFrame) -> tuple[pl.DataFrame, list[str]]:
    """``plans`` without the result columns of earlier results
    (:data:`~vtrain_fast.io.schema.RESULT_COLUMNS`: ``status``, the output columns, the memory
    headroom), and the columns dropped: a table written by ``evaluate -o``, ``pareto -o``, ``plan
    -o``, ``optimal -o`` or ``advise -o`` (all or some of them) is priced again from its plan
    columns; its results are recomputed, never read as inputs. The caller says so (a note)."""
    old = [c for c in plans.columns if c in RESULT_COLUMNS]
    return (plans.drop(old), old) if old else (plans, [])


# Tables vtrain-fast writes that are not tables of plans: (columns that mark one, what it is, where
# its plans are). A table holding every marking column and no ``tp`` column is refused by name.
OTHER_TABLES = (
    (("policy", "job_id", "jct_hours", "first_plan", "last_plan"),
     "the per-job table of `vtrain-fast schedule` (jobs.parquet)",
     "its rows are jobs of a trace, with their plans only as text (first_plan, last_plan); to price or export a "
     "job's plan, write its columns as for `vtrain-fast evaluate` (README, Evaluate), or run "
     "`vtrain-fast advise --model MODEL --gpus GPU:N` for it"),
    (("stage", "start_s", "end_s", "kind", "micro_batch", "chunk"),
     "the event timeline of one plan (`vtrain-fast show --events`)",
     "its rows are the forward / backward operations of the plan `show` was given: export or evaluate that "
     "plan's own table or results folder instead"),
    (("stage", "weights_GiB", "gradients_GiB", "optimizer_GiB", "total_GiB"),
     "the per-stage memory table of one plan (`vtrain-fast show -o`)",
     "its rows are the pipeline stages of the plan `show` was given: export or evaluate that plan's own "
     "table or results folder instead"),
    (("policy", "start_hours", "end_hours", "job_id"),
     "the allocations of `vtrain-fast schedule` (segments.parquet)",
     "its rows are a job's nodes over time; the plans are not in it (see jobs.parquet, README Scheduling)"),
    (("policy", "mean_jct_hours"),
     "the per-policy summary of `vtrain-fast schedule` (summary.parquet)",
     "its rows are the scheduling policies; no plan is in it (README Scheduling)"),
)


def check_not_a_plan_table(columns, where: str) -> None:
    """Refuse a table vtrain-fast wrote that is not a table of plans (:data:`OTHER_TABLES`: the
    schedule's jobs, segments and summary, show's events and memory tables) by name, instead of
    reporting its missing plan columns.

    Raises
    ------
    InputError
        Naming the file, what it is, and where the plans are.
    """
    have = set(columns)
    for marks, what, fix in OTHER_TABLES:
        if set(marks) <= have and "tp" not in have:
            raise InputError(where, "table", what,
                             "a table of plans, one plan a row (the plan columns gpu, tp, pp, dp, micro_batch_size, "
                             "global_batch_size, ...: evaluate -o, pareto -o, plan -o, optimal -o or advise -o "
                             "write them)", fix)


def read_csv(path: str | Path, as_text: bool = False) -> pl.DataFrame:
    """Read a configurations file: CSV, or Parquet (``.parquet``, ``.pq``, e.g. written by
    ``pareto -o``; categorical columns come back as text).

    A CSV's separator is read from its header line (:func:`csv_separator`: comma, semicolon
    or tab). ``as_text``: every CSV cell as the text written (no type guessing: ``007`` stays
    ``007``), for a caller that converts each column itself (a Parquet file keeps its types).

    Raises
    ------
    InputError
        Missing or unreadable file; not a regular file (a folder, a device, a FIFO) or larger
        than :data:`~vtrain_fast.io.inputs.MAX_TABLE_BYTES` (1 GiB); malformed file; a Parquet
        column of lists or structs.
    """
    p = Path(path)
    check_input_file(p, "CSV or Parquet file", MAX_TABLE_BYTES)
    if p.suffix.lower() in (".parquet", ".pq"):
        try:
            df = pl.read_parquet(p)
        except Exception as e:  # noqa: BLE001 - pyarrow/polars raise several types for bad files
            raise InputError(str(p), "Parquet", str(e).splitlines()[0], "a Parquet file") from None
        nested = [c for c, t in df.schema.items() if t.is_nested() or t == pl.Object]
        if nested:
            raise InputError(str(p), f"column {nested[0]}", str(df.schema[nested[0]]),
                             "columns of numbers, text or true/false, one value per cell",
                             f"drop the column {nested[0]!r} or flatten it into plain columns")
        return df.with_columns(pl.col(pl.Categorical, pl.Enum).cast(pl.String))
    try:
        separator = csv_separator(p)
    except OSError as e:
        raise InputError(str(p), "file", str(p), "an existing, readable CSV or Parquet file",
                         e.strerror or str(e)) from None
    try:
        return (pl.read_csv(p, infer_schema=False, separator=separator) if as_text
                else pl.read_csv(p, infer_schema_length=None, separator=separator))
    except Exception as e:  # polars raises several error types for malformed CSV
        if "utf-8" in str(e).lower() or "utf8" in str(e).lower():     # a cell below the header
            raise InputError(str(p), "encoding", str(e).splitlines()[0], "UTF-8 text (ASCII is UTF-8)",
                             not_utf8_fix(p, "LATIN1")) from None
        raise InputError(str(p), "CSV", str(e).splitlines()[0],
                         f"a {SEPARATOR_NAMES[separator]}-separated file with a header row") from None


# Column separators a CSV header is recognised by (the first line), and their names for messages.
SEPARATOR_NAMES = {",": "comma", ";": "semicolon", "\t": "tab"}


# Byte-order marks of the text encodings a CSV is refused in (UTF-32 first: its little-endian
# mark begins with UTF-16's).
WIDE_BOMS = ((b"\xff\xfe\x00\x00", "UTF-32 LE"), (b"\x00\x00\xfe\xff", "UTF-32 BE"),
             (b"\xff\xfe", "UTF-16 LE"), (b"\xfe\xff", "UTF-16 BE"))


def not_utf8_fix(path, encoding: str) -> str:
    """How to turn the CSV ``path`` written in ``encoding`` into UTF-8."""
    return (f"save it as UTF-8 text (a spreadsheet's \"CSV UTF-8\"; or iconv -f {encoding} -t UTF-8 {path} > "
            f"{Path(path).with_name(Path(path).stem + '-utf8.csv')}) and read that file")


def csv_separator(path) -> str:
    """The column separator of the CSV file ``path``, from its header line: ``,`` unless the
    header has no comma and a semicolon or a tab (spreadsheets in many locales write ``;``).

    Raises
    ------
    InputError
        A header in UTF-16 or UTF-32 (a byte-order mark, or NUL bytes: spreadsheets' "Unicode
        text"), or not UTF-8 text: its column names could not be read.
    """
    with open(path, "rb") as f:
        raw = f.readline(1 << 16)
    wide = next((enc for bom, enc in WIDE_BOMS if raw.startswith(bom)), None)
    if wide or b"\x00" in raw:
        raise InputError(str(path), "encoding", wide or "UTF-16 or UTF-32 (NUL bytes in the header)",
                         "UTF-8 text (ASCII is UTF-8)", not_utf8_fix(path, (wide or "UTF-16").split()[0]))
    try:
        header = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(str(path), "encoding", f"byte {e.start} of the header, {raw[e.start:e.start + 1]!r}",
                         "UTF-8 text (ASCII is UTF-8)", not_utf8_fix(path, "LATIN1")) from None
    if "," in header:
        return ","
    counts = {sep: header.count(sep) for sep in (";", "\t")}
    best = max(counts, key=counts.get)
    return best if counts[best] else ","


TABLE_SUFFIXES = (".parquet", ".pq", ".csv")


def check_table_path(path: str | Path, option: str = "-o") -> None:
    """Refuse an output file name whose suffix is not a table format we write
    (:data:`TABLE_SUFFIXES`): call before any work.

    Raises
    ------
    InputError
        Naming the option, the path and the allowed suffixes.
    """
    check_output_file(path)
    if Path(path).is_dir():
        raise InputError("command line", option, str(path), "a file name, not a folder",
                         f"e.g. {option} {Path(path) / 'results.parquet'}")
    if Path(path).suffix.lower() not in TABLE_SUFFIXES:
        stem = Path(path).with_suffix("")
        raise InputError("command line", option, str(path), "a file name ending in " + ", ".join(TABLE_SUFFIXES),
                         f"e.g. {option} {stem}.parquet (Parquet) or {option} {stem}.csv (CSV)")


def write_table_atomic(df: pl.DataFrame, path: str | Path, replace: bool = True) -> None:
    """Write ``df`` to ``path`` as CSV (suffix ``.csv``) or Parquet (``.parquet``, ``.pq``),
    through a temporary name and an atomic rename; with ``replace`` false an existing ``path``
    is never replaced (:func:`~vtrain_fast.io.errors.write_atomically`).

    Raises
    ------
    InputError
        If the suffix is not one of :data:`TABLE_SUFFIXES`, ``path`` is a folder or lies under a
        file, or exists and ``replace`` is false.
    """
    check_table_path(path)
    if Path(path).suffix.lower() == ".csv":
        write_atomically(path, lambda tmp: df.write_csv(tmp), replace=replace)
    else:
        write_parquet_atomic(df, path, replace)


def write_parquet_atomic(df: pl.DataFrame, path: str | Path, replace: bool = True) -> None:
    """Write ``df`` to ``path`` through a temporary name and an atomic rename (``replace``:
    as :func:`write_table_atomic`).

    Raises
    ------
    InputError
        If ``path`` is a folder or lies under a file, or exists and ``replace`` is false.
    """
    write_atomically(path, lambda tmp: pq.write_table(df.to_arrow(), tmp, compression="zstd"), replace=replace)
