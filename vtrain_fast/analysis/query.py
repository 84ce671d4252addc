"""Queries over results folders with Polars lazy scans: Pareto frontiers and filters.

Query functions read Parquet only; they never evaluate the cost model.
"""
from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa

from ..io.errors import InputError
from ..model.sweep import pareto_positions
from ..io.errors import did_you_mean
from ..model.settings import BY_NAME, SETTINGS, Setting
from ..io.schema import (CLUSTER_COLUMNS, DERIVED_NAMES, NUMERIC_COLUMNS, SCHEMA, SETTING_COLUMNS, resolve_column,
                     resolve_objectives)
from ..io.writer import read_manifest, rebuild_fix, result_paths
from ..plan.spec import recorded_spec_problem

GROUP_COLUMNS = ("model", "gpu", "num_tokens", "num_gpus", "num_nodes", "tp", "cp", "pp", "dp",
                 "micro_batch_size", "global_batch_size", "recompute", "num_layers", "hidden_size",
                 "seq_length") + tuple(SETTING_COLUMNS)     # + vpp and the training switches
CONFIG_COLUMNS = ("model", "gpu", "num_gpus", "tp", "pp", "dp", "micro_batch_size",
                  "global_batch_size", "recompute", "num_tokens")
# The outputs every printed table of plans shows.
HEADLINE_COLUMNS = ("iteration_time_s", "mfu", "memory_per_gpu_GiB", "train_days", "cost_usd")
# Where an iteration's time goes (they add up to iteration_time_s): `--breakdown` shows them.
BREAKDOWN_COLUMNS = ("compute_s", "tp_comm_s", "cp_comm_s", "ep_comm_s", "pp_comm_s", "dp_comm_s", "bubble_s",
                     "optimizer_s", "overhead_s", "offload_s")


def pareto_mask(values: np.ndarray) -> np.ndarray:
    """Rows of ``values`` that no other row dominates (all objectives minimised).

    Parameters
    ----------
    values : numpy.ndarray
        ``float64``, shape ``(n, k)``, ``k >= 1``; NaN rows are never on the frontier.

    Returns
    -------
    numpy.ndarray
        ``bool``, shape ``(n,)``. Of rows with identical objectives only the first is kept.

    Notes
    -----
    Rows are sorted lexicographically (ties by row number); for ``k = 2`` a row is on the
    frontier iff its second objective is below the running minimum of all rows before it
    (Kung, Luccio, Preparata 1975). For ``k > 2`` each row is compared with the frontier found
    so far. The sweep engine's ``--keep frontier`` uses the same function
    (:func:`vtrain_fast.model.sweep.pareto_sorted`), so both agree exactly.
    """
    values = np.asarray(values, dtype=np.float64)
    n, k = values.shape
    mask = np.zeros(n, dtype=bool)
    ok = ~np.isnan(values).any(axis=1)
    idx = np.flatnonzero(ok).astype(np.int64)
    if idx.size == 0:
        return mask
    mask[idx[pareto_positions(np.ascontiguousarray(values[idx]), idx)]] = True
    return mask


def resolve_groups(where: str, by) -> list[str]:
    """``--by`` values with full column names (short names accepted).

    Raises
    ------
    InputError
        A value that is not a group column, with the closest name as the fix.
    """
    out = []
    for b in by or ():
        name = resolve_column(b)
        if name not in GROUP_COLUMNS:
            raise InputError(where, "--by", b, "input columns: " + ", ".join(GROUP_COLUMNS),
                             did_you_mean(name, GROUP_COLUMNS, "group by an input column"))
        out.append(name)
    return out


_CONDITION = re.compile(r"^\s*([A-Za-z_][\w/]*)\s*(<=|>=|==|!=|<|>|=)\s*(.*?)\s*$")
_OPS = {"<=": "le", ">=": "ge", "==": "eq", "=": "eq", "!=": "ne", "<": "lt", ">": "gt"}


def where_filter(where: str, conditions) -> tuple:
    """One Polars filter from ``--where`` conditions ``COLUMN OP VALUE`` (all must hold): OP is
    one of ``<= < >= > == !=`` for numeric columns (a finite number; a whole one for integer
    columns), ``==``/``!=`` for the others (``gpu == h100-sxm-80gb``, ``sequence_parallel ==
    true``); short column names are accepted.

    Returns
    -------
    tuple
        ``(expr, values)``: the ``polars.Expr`` (None when there are no conditions) and, per
        column named, the values it was compared with (``{column: [value, ...]}``), for checks
        against a folder (:func:`pareto`).

    Raises
    ------
    InputError
        A malformed condition, an unknown column (with the closest name), a value of the wrong
        kind, or an order comparison on a non-numeric column.
    """
    names = SCHEMA.names
    exprs, values = [], {}
    for cond in conditions or ():
        m = _CONDITION.match(cond)
        if not m or not m.group(3):
            raise InputError(where, "--where", cond, "COLUMN OP VALUE with OP one of <=, <, >=, >, ==, !=",
                             "e.g. --where 'memory_per_gpu_GiB<=72' --where 'gpu==h100-sxm-80gb' (quote it "
                             "in the shell)")
        col, op, raw = resolve_column(m.group(1)), m.group(2), m.group(3)
        if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\"":      # one pair of quotes around the value
            raw = raw[1:-1]
        if raw[:1] in "<>=!~":          # 'mem_GiB=<72', 'gpu=~h200': an operator that is not one
            raise InputError(where, "--where", cond, "COLUMN OP VALUE with OP one of <=, <, >=, >, ==, != "
                             "(= alone means ==)", f"write the operator as one of those, e.g. --where "
                             f"'{m.group(1)}{'<=' if col in NUMERIC_COLUMNS else '=='}{raw.lstrip('<>=!~') or 72}'")
        if col not in names:
            raise InputError(where, "--where", cond, "a column of the results: " + ", ".join(names),
                             did_you_mean(col, names, "name a column of the results"))
        kind = SCHEMA.field(col).type
        if col == "status":
            raise InputError(where, "--where", cond, "a column other than status (only ok plans are ranked)",
                             "drop this condition")
        if col in NUMERIC_COLUMNS:
            try:
                value = float(raw)
            except ValueError:
                value = math.nan
            whole = kind == pa.int64()
            if not math.isfinite(value) or (whole and value != int(value)):
                raise InputError(where, "--where", cond, f"a finite {'whole ' if whole else ''}number after {op} "
                                 f"for the column {col}", f"e.g. --where '{col}{op}{4 if whole else 72}'")
            expr = getattr(pl.col(col), _OPS[op])(value)
        else:
            if op not in ("==", "=", "!="):
                raise InputError(where, "--where", cond, f"== or != for the column {col} (not a number)",
                                 f"e.g. --where '{col}=={raw}'")
            if kind == pa.bool_():
                if raw.lower() not in ("true", "false"):
                    raise InputError(where, "--where", cond, f"true or false for the column {col}",
                                     f"e.g. --where '{col}==true'")
                expr = pl.col(col) == (raw.lower() == "true")
            else:
                expr = pl.col(col).cast(pl.String) == raw
                values.setdefault(col, []).append(raw)
            if op == "!=":
                expr = ~expr
        values.setdefault(col, [])
        exprs.append(expr)
    if not exprs:
        return None, values
    out = exprs[0]
    for e in exprs[1:]:
        out = out & e
    return out, values


def _size(name: str, has_cp: bool) -> pl.Expr:
    """A plan's size ``name`` of :data:`~vtrain_fast.model.settings.LAYOUT_SIZES` as the rules read
    it: ``dp`` is the data-parallel-with-context group, ``dp x cp`` (results written before context
    parallelism have no ``cp`` column: 1)."""
    if name == "dp" and has_cp:
        return pl.col("dp") * pl.col("cp")
    if name == "cp" and not has_cp:
        return pl.lit(1)
    return pl.col(name)


def _no_effect(st: Setting, has_cp: bool = True) -> pl.Expr:
    """Rows that stand for every value of setting ``st``: plans where it changes no cost
    (:attr:`~vtrain_fast.model.settings.Setting.inert_at`, ``inert_with``)."""
    expr = pl.lit(False)
    for size in st.inert_at:
        expr = expr | (_size(size, has_cp) == 1)
    for other, value in st.inert_with:
        expr = expr | (pl.col(other) == value)
    return expr


def _megatron_accepts(names) -> pl.Expr:
    """Rows whose settings among ``names`` Megatron-LM accepts: each switched-on setting has
    what it needs (:attr:`~vtrain_fast.model.settings.Setting.requires`), and a needed setting
    counts as on only where Megatron-LM leaves it on (``off_at``: sequence parallelism at tp = 1)."""
    expr = pl.lit(True)
    for st in SETTINGS:
        if st.name not in names or not st.requires:
            continue
        met = pl.lit(True)
        for other, value in st.requires:
            ok = pl.col(other) == value
            if value != BY_NAME[other].default:
                for size in BY_NAME[other].off_at:
                    ok = ok & (pl.col(size) != 1)
            met = met & ok
        expr = expr & ((pl.col(st.name) == st.default) | met)
    return expr


def with_every_value_where_inert(lf: pl.LazyFrame, settings: dict) -> pl.LazyFrame:
    """``lf`` with each row whose setting has no effect repeated once per value of that setting
    (``settings``: name -> the values the sweep took; expanded in registry order, so a setting's
    requirements are expanded before it): a sweep prices such a plan once (status ``repeat`` for
    the others, or the machine left out), but it is a plan of every value, so a frontier per value
    (``--by``) or of one value (``--where``) must count it."""
    expanded = False
    has_cp = "cp" in lf.collect_schema()
    for st in SETTINGS:
        if st.name not in settings or not (st.inert_at or st.inert_with):
            continue
        vals = sorted(set(settings[st.name]))
        if len(vals) > 1:
            lf = lf.with_columns(pl.when(_no_effect(st, has_cp)).then(pl.lit(vals, dtype=pl.List(lf.collect_schema()[st.name])))
                                 .otherwise(pl.concat_list(st.name)).alias(st.name)).explode(st.name)
            expanded = True
    # an expanded row may pair a switch with a setting it needs switched the other way: no such
    # plan exists (Megatron-LM refuses it), so it counts for no value
    return lf.filter(_megatron_accepts(set(settings))) if expanded else lf


def _with_requirements(names: list[str]) -> list[str]:
    """``names`` and the settings they need (:attr:`~vtrain_fast.model.settings.Setting.requires`),
    transitively, in registry order."""
    need = set(names)
    for st in reversed(SETTINGS):
        if st.name in need:
            need.update(k for k, _ in st.requires)
    return [st.name for st in SETTINGS if st.name in need]


def pareto(folder: str | Path, minimize: list[str], by: list[str] | None = None,
           all_columns: bool = False, where: list[str] | None = None, breakdown: bool = False,
           memory_margin: float | None = None) -> pl.DataFrame:
    """The Pareto frontier of the feasible rows (``status == "ok"``) of a results folder.

    Parameters
    ----------
    folder : str or Path
        Results folder written by ``vtrain-fast sweep``.
    minimize : list of str
        Numeric output columns to minimise (at least one). Prefix a column with ``-`` to
        maximise it (e.g. ``-mfu``).
    by : list of str, optional
        Input columns (e.g. ``model``, ``num_tokens``, ``gpu``): one frontier per group.
    all_columns : bool
        Every column of the rows (each plan complete, e.g. to write to a file and evaluate
        again) instead of :func:`frontier_columns`.
    where : list of str, optional
        Conditions the plans must meet (:func:`where_filter`), applied before the frontier.
    breakdown : bool
        Add the time components (:data:`BREAKDOWN_COLUMNS`) to the columns returned.
    memory_margin : float, optional
        Fraction of the GPU's HBM capacity (e.g. 0.05): plans with less memory headroom than
        that (``memory_tight``, :func:`with_memory_headroom`) are left out before the frontier
        is taken. Without it nothing is left out and ``memory_tight`` marks the plans within
        :data:`DEFAULT_MEMORY_MARGIN`.

    Returns
    -------
    polars.DataFrame
        Frontier rows, sorted by the groups and then the first objective; with the columns
        ``memory_headroom_GiB`` and ``memory_tight`` (:data:`~vtrain_fast.io.schema.DERIVED_COLUMNS`).

    Raises
    ------
    InputError
        Unfinished folder, unknown or non-numeric column, or a folder that kept only the
        frontier of other objectives (``--keep frontier``): its rows cannot give this frontier.
    """
    if not minimize:
        raise InputError(str(folder), "--minimize", minimize, "one or more numeric columns",
                         "e.g. --minimize cost_usd --minimize train_days")
    minimize = resolve_objectives(str(folder), minimize)
    objectives = [(m.lstrip("-"), m.startswith("-")) for m in minimize]
    by = resolve_groups(str(folder), by)
    manifest = read_manifest(folder)
    stored = manifest.get("keep", "all")
    if stored.startswith("top"):
        raise InputError(str(folder), "keep", stored, "a folder with every row or every feasible row",
                         "this folder kept only the top rows of one column, so it cannot give a Pareto "
                         "frontier; read those rows with vtrain_fast.analysis.query.scan_results('" + str(folder)
                         + "') or rerun the sweep with --keep all or --keep feasible")
    if stored.startswith("frontier") and by:
        raise InputError(str(folder), "--by", " ".join(by), "no --by on a folder reduced to one frontier",
                         "a global frontier does not hold the frontier of each group; rerun the sweep "
                         "with --keep all or --keep feasible")
    if stored.startswith("frontier") and where:
        raise InputError(str(folder), "--where", " ".join(where), "no --where on a folder reduced to one frontier",
                         "the frontier under conditions is not part of the unconditional one; rerun the "
                         "sweep with --keep all or --keep feasible")
    if stored.startswith("frontier") and set(manifest.get("objectives") or []) != set(minimize):
        raise InputError(str(folder), "--minimize", " ".join(minimize),
                         "the objectives this folder was reduced with: " + " ".join(manifest.get("objectives") or []),
                         "it kept only that frontier; rerun the sweep with --keep all, --keep feasible or "
                         "--keep frontier with these objectives")
    check_memory_margin(str(folder), memory_margin)
    lf = feasible_plans(folder, where, by, [n for n, _ in objectives])
    lf = with_memory_headroom(lf, manifest, DEFAULT_MEMORY_MARGIN if memory_margin is None else memory_margin)
    if memory_margin:
        lf = lf.filter(~pl.col("memory_tight"))
    names = [n for n, _ in objectives]
    cols = ([c for c in lf.collect_schema().names()] if all_columns
            else frontier_columns(folder, by, names, where, breakdown))
    # reduce with the objectives (and group keys) only, then fetch the frontier rows' columns
    row = pl.int_range(pl.len(), dtype=pl.Int64).alias("_row")
    group = (pl.struct(by).rank("dense") if by else pl.lit(0)).alias("_group")
    obj = lf.select([row, group] + names).collect()
    if obj.height == 0:
        return lf.select(cols).collect()
    vals = np.column_stack([obj[n].to_numpy().astype(np.float64) * (-1.0 if neg else 1.0)
                            for n, neg in objectives])
    groups = obj["_group"].to_numpy()
    mask = np.zeros(obj.height, dtype=bool)
    for gid in np.unique(groups):
        sel = np.flatnonzero(groups == gid)
        mask[sel[pareto_mask(vals[sel])]] = True
    keep = obj["_row"].to_numpy()[mask]
    frontier = (lf.select([row] + cols).filter(pl.col("_row").is_in(keep.tolist())).collect().drop("_row"))
    if all_columns:
        frontier = with_cluster_columns(frontier, manifest)
    return frontier.sort(by + [names[0]], descending=[False] * len(by) + [objectives[0][1]])


def with_cluster_columns(rows: pl.DataFrame, manifest: dict) -> pl.DataFrame:
    """``rows`` with each GPU's cluster values of the sweep (``gpus_per_node``,
    ``intra_node_GBps``, ``inter_node_Gbps``, ``usd_per_gpu_hour``, ``pue``, ``reserved_GiB``:
    presets with the spec's ``[cluster]`` overrides, from the manifest) as columns, so that
    ``evaluate`` prices a written plan as the sweep did (the calibration file aside)."""
    gpus = manifest.get("gpus") or {}
    gpu = rows["gpu"].cast(pl.String)
    extra = []
    for key in CLUSTER_COLUMNS:
        if gpus and all(key in v for v in gpus.values()) and key not in rows.columns:
            extra.append(gpu.replace_strict({n: v[key] for n, v in gpus.items()}, default=None).alias(key))
    return rows.with_columns(extra) if extra else rows


JOB_COLUMNS = ("model", "num_tokens")

# The memory margin the printed tables mark plans within ('tight') when none is given: 5 % of the
# GPU's HBM capacity (a plan predicted that close to the limit may not fit in practice: allocator
# fragmentation, NCCL buffers beyond reserved_GiB).
DEFAULT_MEMORY_MARGIN = 0.05


def check_memory_margin(where: str, margin: float | None, option: str = "--memory-margin") -> None:
    """Refuse a memory margin that is not a fraction in ``[0, 1)`` (``None``: none given).

    Raises
    ------
    InputError
        Naming the option, the value and what is allowed.
    """
    if margin is None:
        return
    if not (isinstance(margin, (int, float)) and math.isfinite(margin) and 0.0 <= margin < 1.0):
        raise InputError(where, option, margin, "a fraction of the GPU's memory from 0 to below 1",
                         "e.g. --memory-margin 0.05 (leave out plans within 5 % of the GPU's HBM capacity)")


def memory_capacity_GiB(manifest: dict) -> dict[str, float]:
    """Each GPU's HBM capacity in a sweep, GiB, from its results manifest.

    Parameters
    ----------
    manifest : dict
        A results folder's manifest (:func:`vtrain_fast.io.writer.read_manifest`).

    Returns
    -------
    dict
        GPU name -> capacity, GiB: the ``hbm_bytes`` field of the GPU's machine vectors as the
        sweep priced it (``machine_vectors``, laid out as
        :data:`vtrain_fast.model.records.HW_FIELDS`; the preset's ``hbm_GiB`` with the spec's
        ``[gpus]`` tables applied), else the shipped preset's ``hbm_GiB``
        (:data:`vtrain_fast.hardware.gpus.PRESETS`) for GPUs the manifest has no vector of.
        The kernels call a plan out of memory where ``memory_per_gpu_GiB`` exceeds it.
    """
    from ..hardware.gpus import PRESETS
    from ..model.records import HW_FIELDS
    from ..io.schema import gpu_of_label
    k = HW_FIELDS.index("hbm_bytes")
    out: dict[str, float] = {}
    axes = manifest.get("setting_axes") or ()
    for label, vec in (manifest.get("machine_vectors") or {}).items():
        out.setdefault(gpu_of_label(label, axes), float(vec[k]) / 1024.0 ** 3)
    for name in manifest.get("gpus") or {}:
        if name not in out and name in PRESETS:
            out[name] = PRESETS[name].hbm_GiB
    return out


def with_memory_headroom(lf: pl.LazyFrame, manifest: dict, margin: float) -> pl.LazyFrame:
    """``lf`` with the columns ``memory_headroom_GiB`` (the GPU's capacity,
    :func:`memory_capacity_GiB`, minus ``memory_per_gpu_GiB``) and ``memory_tight`` (headroom
    below ``margin`` x capacity; a plan out of memory is tight at any margin), as
    :data:`~vtrain_fast.io.schema.DERIVED_COLUMNS` defines them.

    Parameters
    ----------
    lf : polars.LazyFrame
        Rows with ``gpu`` and ``memory_per_gpu_GiB``.
    manifest : dict
        The folder's manifest (the GPUs' capacities).
    margin : float
        Fraction of the capacity, ``[0, 1)``.
    """
    cap = memory_capacity_GiB(manifest)
    capacity = pl.col("gpu").cast(pl.String).replace_strict(cap, default=None, return_dtype=pl.Float64)
    headroom = capacity - pl.col("memory_per_gpu_GiB")
    return lf.with_columns(headroom.alias("memory_headroom_GiB"),
                           ((headroom < margin * capacity) | (headroom < 0.0)).alias("memory_tight"))


def scan_results(folder: str | Path) -> pl.LazyFrame:
    """Every row of a finished results folder, lazily: the part files its manifest lists, each
    checked against its record first (:func:`vtrain_fast.io.writer.result_paths`); no other file
    in the folder is read.

    Raises
    ------
    InputError
        Unfinished folder, a listed file missing, truncated or damaged, or a manifest whose
        fields disagree (:func:`vtrain_fast.io.writer.final_problem`, and its spec and machines:
        :func:`vtrain_fast.plan.spec.recorded_spec_problem`).
    """
    manifest = read_manifest(folder)
    problem = recorded_spec_problem(manifest)
    if problem:
        raise InputError(str(Path(folder) / "manifest.json"), *problem, "the manifest was edited or damaged: "
                         + rebuild_fix(manifest, folder) + ", or rerun it with --overwrite")
    lf = pl.scan_parquet([str(p) for p in result_paths(folder, manifest)])
    return with_settings_priced_before(lf)


def with_settings_priced_before(lf: pl.LazyFrame) -> pl.LazyFrame:
    """``lf`` with a column for every training setting a results folder written before the
    setting existed lacks, holding the value its rows were priced with
    (:meth:`vtrain_fast.model.settings.Setting.value_before`: 16-bit gradients,
    ``grad_reduce_in_bf16 = true``, for a folder from before fp32 main gradients), so that every
    reader (``pareto``, ``plan``, ``show``, ``export``) prices and exports its rows as they were
    priced."""
    from ..model.settings import SETTINGS
    have = set(lf.collect_schema().names())
    missing = [st for st in SETTINGS if st.name not in have]
    if not missing:
        return lf
    return lf.with_columns(*(pl.lit(st.value_before()).alias(st.name) for st in missing))


def feasible_plans(folder: str | Path, where=None, by=(), needed=()) -> pl.LazyFrame:
    """The feasible rows (``status == "ok"``) of ``folder`` as a lazy frame, with the plans a
    setting in ``by`` or ``where`` does not affect counted for each of its values
    (:func:`with_every_value_where_inert`), then the ``where`` conditions (:func:`where_filter`).

    Raises
    ------
    InputError
        A ``by``, ``where`` or ``needed`` column the folder's rows lack (an older version), or a
        ``where`` value no row has (:func:`check_where_values`).
    """
    return plans_where(folder, where, by, needed, ("ok",))


def plans_where(folder: str | Path, where=None, by=(), needed=(), statuses=("ok",)) -> pl.LazyFrame:
    """As :func:`feasible_plans`, for the rows of any of ``statuses`` (e.g. ``("ok",
    "out_of_memory")`` for ``plan``'s runners-up)."""
    condition, where_values = where_filter(str(folder), where)
    lf = scan_results(folder).filter(pl.col("status").cast(pl.String).is_in(list(statuses)))
    have = set(lf.collect_schema().names())
    for option, named in (("--by", by), ("--where", list(where_values)), ("--minimize", needed)):
        for b in named:
            if b not in have:
                raise InputError(str(folder), option, b, "columns of this folder's rows",
                                 "the folder was written by an older vtrain_fast without this column; "
                                 "rerun the sweep with --overwrite")
    check_where_values(folder, lf, where_values)
    named = _with_requirements([c for c in SETTING_COLUMNS if c in by or c in where_values])
    if named:
        swept = read_manifest(folder).get("setting_values") or {}
        every = scan_results(folder)     # older folders: values of any row
        lf = with_every_value_where_inert(lf, {c: swept[c] if c in swept else
                                               every.select(pl.col(c).unique()).collect()[c].to_list()
                                               for c in named})
    return lf if condition is None else lf.filter(condition)


def check_where_values(folder, lf: pl.LazyFrame, where_values: dict) -> None:
    """Refuse a ``--where`` value of a text column (model, gpu, recompute) that no row of the
    folder has: a misspelt name would otherwise match nothing without a word.

    Raises
    ------
    InputError
        Naming the value, the values the folder has and the closest one.
    """
    for col, wanted in where_values.items():
        if not wanted:
            continue
        have = [str(v) for v in lf.select(pl.col(col).cast(pl.String).unique().sort()).collect()[col].to_list()]
        for w in wanted:
            if w not in have:
                raise InputError(str(folder), "--where", f"{col}=={w}", f"a {col} of this folder: " + ", ".join(have),
                                 did_you_mean(w, have, f"name one of the {col} values above"))


def frontier_columns(folder: str | Path, by: list[str], objectives: list[str], where=None,
                     breakdown: bool = False) -> list[str]:
    """Columns a frontier table shows: the groups, the plan (:data:`CONFIG_COLUMNS` and the
    settings that were axes, :func:`varying_setting_columns`), the objectives, the headline
    outputs, the columns the ``where`` conditions name and, with ``breakdown``, where the
    iteration time goes (:data:`BREAKDOWN_COLUMNS`)."""
    named = list(where_filter(str(folder), where)[1])
    return list(dict.fromkeys(list(by) + list(CONFIG_COLUMNS) + list(objectives) + list(HEADLINE_COLUMNS)
                              + list(DERIVED_NAMES) + (list(BREAKDOWN_COLUMNS) if breakdown else [])
                              + varying_setting_columns(folder) + named))


def varying_setting_columns(folder: str | Path) -> list[str]:
    """The training-setting columns (:data:`~vtrain_fast.io.schema.SETTING_COLUMNS`) that were axes
    of the sweep (a list in its spec, recorded as ``setting_axes`` in the manifest): they tell its
    plans apart, also where the rows shown happen to share one value. Folders without that record
    (older versions) give the settings with more than one value in their rows.

    The context-parallel size ``cp`` comes first when the sweep used context parallelism (a
    ``cp`` above 1 in its rows): it is a parallel size, shown with tp, pp and dp only then.

    Returns
    -------
    list of str
        Column names: ``cp`` where it applies, then in :data:`~vtrain_fast.io.schema.SETTING_COLUMNS` order.
    """
    lf = scan_results(folder)
    names = lf.collect_schema().names()
    cp = ["cp"] if "cp" in names and (lf.select(pl.col("cp").max()).collect().item() or 1) > 1 else []
    cols = [c for c in SETTING_COLUMNS if c in names]
    axes = read_manifest(folder).get("setting_axes")
    if axes is not None:
        return cp + [c for c in cols if c in axes]
    if not cols:
        return cp
    counts = lf.select([pl.col(c).n_unique() for c in cols]).collect().row(0)
    return cp + [c for c, n in zip(cols, counts) if n > 1]


def varying_job_columns(folder: str | Path, where=None) -> list[str]:
    """Of the columns that define the training job (``model``, ``num_tokens``), those with more
    than one value among the feasible rows of ``folder``: a frontier across them compares plans
    for different jobs (a shorter run is always cheaper), so ``pareto --by`` them is usually meant.

    Returns
    -------
    list of str
        Column names, in :data:`JOB_COLUMNS` order (empty when every row trains the same job).
    """
    lf = feasible_plans(folder, where)
    counts = lf.select([pl.col(c).n_unique() for c in JOB_COLUMNS]).collect().row(0)
    return [c for c, n in zip(JOB_COLUMNS, counts) if n > 1]


def feasible_sample(folder: str | Path, columns: list[str], n: int = 100_000, where=None) -> pl.DataFrame:
    """About ``n`` feasible rows (:func:`feasible_plans` with the ``where`` conditions) of
    ``folder``, ``columns`` only: every k-th one when there are more (for plots), read lazily.

    Returns
    -------
    polars.DataFrame
    """
    lf = feasible_plans(folder, where).select(columns)
    count = lf.select(pl.len()).collect().item()
    if count > n:
        lf = lf.gather_every(-(-count // n))     # every k-th feasible row, without loading the rest
    return lf.collect()
