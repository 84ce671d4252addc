"""Planning to a deadline: the cheapest plan of a results folder that trains in time, and why the
other plan families lose.

Reads Parquet only (:func:`vtrain_fast.analysis.query.plans_where`); never evaluates the cost model.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from ..io.errors import InputError
from ..io.writer import read_manifest
from .query import (JOB_COLUMNS, check_memory_margin, memory_capacity_GiB, plans_where, with_cluster_columns,
                    with_memory_headroom)

# What tells plan families apart: the GPU and the model-parallel sizes (the data-parallel size,
# the cluster, the batches and recomputation vary within a family). Columns a folder lacks
# (older versions) are left out.
FAMILY_COLUMNS = ("gpu", "tp", "cp", "pp", "ep", "etp")
# Columns of the reasons table besides a plan's own.
REASON_COLUMNS = ("choice", "reason", "extra_cost_usd", "extra_cost_pct")
# Rows a plan is chosen among: the feasible ones and those out of memory (their times and costs
# are computed too; they lose for memory).
_STATUSES = ("ok", "out_of_memory")


@dataclass
class DeadlinePlan:
    """What :func:`plan_to_deadline` found.

    Attributes
    ----------
    table : polars.DataFrame
        Per job (:data:`~vtrain_fast.analysis.query.JOB_COLUMNS`) that has a plan meeting the
        deadline: the chosen plan (``choice`` 0, the cheapest) and the runners-up (``choice`` 1,
        2, ...: the best plan of each other family, :data:`FAMILY_COLUMNS`), every column of
        the folder's rows plus ``memory_headroom_GiB``, ``memory_tight``, the GPUs' cluster
        values and :data:`REASON_COLUMNS`: ``reason`` says why a runner-up loses,
        ``extra_cost_usd`` / ``extra_cost_pct`` its cost above the chosen plan's (US dollars,
        percent).
    unmet : list of dict
        One per job with no plan meeting the deadline: the job's values (``job``), the fastest
        plan that fits (``fastest``, a row as a dict, or None) and ``message`` (what would meet it).
    deadline_days, max_gpus, memory_margin
        The constraints asked for (``max_gpus`` None: any cluster searched; ``memory_margin``
        None: only plans out of memory are left out).
    """

    table: pl.DataFrame
    unmet: list = field(default_factory=list)
    deadline_days: float = math.inf
    max_gpus: int | None = None
    memory_margin: float | None = None


def plan_text(row: dict) -> str:
    """A plan in a few words: ``h100-sxm-80gb x 512, tp 2 pp 32 dp 8, mbs 2 gbs 6144, full``
    (cp, ep and etp where above 1)."""
    sizes = " ".join(f"{k} {row[k]}" for k in ("tp", "cp", "pp", "ep", "etp", "dp")
                     if k in row and row[k] is not None and (k in ("tp", "pp", "dp") or row[k] > 1))
    return (f"{row['gpu']} x {row['num_gpus']:,}, {sizes}, mbs {row['micro_batch_size']} "
            f"gbs {row['global_batch_size']}, recompute {row['recompute']}")


def _job_text(job: dict) -> str:
    return ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in job.items())


def _check_options(where: str, deadline_days: float, max_gpus, memory_margin) -> None:
    if not (isinstance(deadline_days, (int, float)) and math.isfinite(deadline_days) and deadline_days > 0):
        raise InputError(where, "--deadline-days", deadline_days, "a positive number of days",
                         "e.g. --deadline-days 30")
    if max_gpus is not None and not (isinstance(max_gpus, int) and max_gpus >= 1):
        raise InputError(where, "--max-gpus", max_gpus, "a whole number of GPUs, 1 or more", "e.g. --max-gpus 1024")
    check_memory_margin(where, memory_margin)


def plan_to_deadline(folder: str | Path, deadline_days: float, max_gpus: int | None = None,
                     memory_margin: float | None = None, runners_up: int = 6, where=()) -> DeadlinePlan:
    """The cheapest plan of each training job in a results folder that trains within a deadline.

    A plan meets the constraints when it fits in memory (status ``ok``; with ``memory_margin``
    also ``memory_tight`` false, :func:`~vtrain_fast.analysis.query.with_memory_headroom`),
    ``train_days <= deadline_days`` and ``num_gpus <= max_gpus``. Of those the one of lowest
    ``cost_usd`` is chosen (ties: fewer days, then fewer GPUs).

    Each other plan family (:data:`FAMILY_COLUMNS`: another GPU, tp, pp, ...) is represented by
    its best try, and ``runners_up`` of them are listed with why they lose, in the order of
    :data:`TIERS` (by cost within each), followed by the best try of each GPU not among them:

    * a family with plans meeting the constraints: its cheapest, *dearer by $X (Y %)*;
    * else one with plans that fit in memory within the GPUs: its fastest, *slower than the
      deadline*;
    * else one with plans within the GPUs that fit in memory: the one with most memory free,
      *within the memory margin*;
    * else one with plans within the GPUs: the one needing least memory, *out of memory*;
    * else its cheapest, *over --max-gpus*.

    Parameters
    ----------
    folder : str or Path
        Results folder of ``vtrain-fast sweep`` that kept every row or every feasible row (rows
        out of memory appear as runners-up only when kept).
    deadline_days : float
        Longest training time, days (``train_days``).
    max_gpus : int, optional
        Most GPUs a plan may use (``num_gpus``); default: any cluster size searched.
    memory_margin : float, optional
        Fraction of the GPU's HBM capacity a plan must leave free, ``[0, 1)``.
    runners_up : int
        Families listed after the chosen plan, per job (and one for each GPU they leave out).
    where : sequence of str
        Only the rows meeting these ``COLUMN OP VALUE`` conditions
        (:func:`~vtrain_fast.analysis.query.where_filter`; a setting with no effect on a plan
        matches every value, as in ``pareto --where``).

    Returns
    -------
    DeadlinePlan

    Raises
    ------
    InputError
        A bad option, an unfinished folder, or one that kept only a frontier or the top rows
        (the cheapest plan in time need not be among them).
    """
    conditions, where = list(where), str(folder)
    _check_options(where, deadline_days, max_gpus, memory_margin)
    manifest = read_manifest(folder)
    stored = manifest.get("keep", "all")
    if stored.startswith(("top", "frontier")):
        raise InputError(where, "keep", stored, "a folder with every row or every feasible row",
                         "this folder kept only some plans, and the cheapest one in time need not be among them; "
                         "rerun the sweep with --keep feasible (or all)")
    capacity = memory_capacity_GiB(manifest)
    lf = plans_where(folder, conditions, statuses=_STATUSES)
    names = lf.collect_schema().names()
    family = [c for c in FAMILY_COLUMNS if c in names]
    jobs = [c for c in JOB_COLUMNS if c in names]
    margin = memory_margin or 0.0
    row = pl.int_range(pl.len(), dtype=pl.Int64).alias("_row")
    need = list(dict.fromkeys(jobs + family + ["num_gpus", "dp", "micro_batch_size", "global_batch_size", "recompute",
                                              "train_days", "cost_usd", "memory_per_gpu_GiB", "status"]))
    rows = with_memory_headroom(lf.select([row] + need), manifest, margin).collect()
    if conditions and rows.height == 0:
        raise InputError(where, "--where", conditions, "conditions some plan of the folder meets (ok or out of memory)",
                         "relax --where: no row of the folder meets all of them")
    fits = (pl.col("status").cast(pl.String) == "ok") & (~pl.col("memory_tight").fill_null(True) if memory_margin
                                                        else pl.lit(True))
    within = pl.col("num_gpus") <= max_gpus if max_gpus is not None else pl.lit(True)
    in_time = pl.col("train_days") <= deadline_days
    rows = rows.with_columns(fits.alias("_fits"), within.alias("_within"), in_time.alias("_in_time"))
    rows = rows.with_columns((pl.col("_fits") & pl.col("_within") & pl.col("_in_time")).alias("_meets"))
    order = ["cost_usd", "train_days", "num_gpus", "_row"]
    picked, unmet = [], []
    for key, job_rows in (rows.group_by(jobs, maintain_order=True) if jobs else [((), rows)]):
        job = dict(zip(jobs, key if isinstance(key, tuple) else (key,)))
        meeting = job_rows.filter(pl.col("_meets")).sort(order)
        if meeting.height == 0:
            unmet.append(_unmet(job, job_rows, deadline_days, max_gpus, memory_margin))
            continue
        best = meeting.row(0, named=True)
        picked.append((best["_row"], 0, "chosen: the cheapest in time"))
        reps = []
        for _, fam in job_rows.group_by(family, maintain_order=True):
            if all(fam[c][0] == best[c] for c in family):
                continue
            reps.append(_family_try(fam, order, deadline_days, max_gpus, memory_margin, capacity, best))
        reps.sort(key=lambda r: (r[1], r[0]["cost_usd"], r[0]["_row"]))
        shown = reps[:runners_up]
        gpus = {str(best["gpu"])} | {str(r["gpu"]) for r, _, _ in shown}
        for rep in reps[runners_up:]:          # and the best try of each GPU not among them
            if str(rep[0]["gpu"]) not in gpus:
                shown.append(rep)
                gpus.add(str(rep[0]["gpu"]))
        for k, (r, _, reason) in enumerate(shown, start=1):
            picked.append((r["_row"], k, reason))
    table = _fetch(lf, manifest, picked, margin)
    return DeadlinePlan(table, unmet, deadline_days, max_gpus, memory_margin)


# The order of the runners-up: families with a plan meeting every constraint (dearer) first, then
# those only too slow, within the memory margin, out of memory, over --max-gpus; by cost within each.
TIERS = ("dearer", "slower", "tight", "out_of_memory", "over_max_gpus")


def _family_try(fam: pl.DataFrame, order, deadline_days, max_gpus, memory_margin, capacity, best) -> tuple:
    """A family's best try at the constraints, its tier (:data:`TIERS`) and why it loses to
    ``best`` (see :func:`plan_to_deadline`)."""
    meets = fam.filter(pl.col("_meets")).sort(order)
    if meets.height:
        r = meets.row(0, named=True)
        extra = r["cost_usd"] - best["cost_usd"]
        return r, 0, (f"dearer by ${extra:,.0f} ({extra / best['cost_usd']:+.1%})" if extra > 0
                      else "as cheap (a tie: more days or GPUs)")
    fit = fam.filter(pl.col("_fits") & pl.col("_within")).sort(["train_days", "cost_usd", "_row"])
    if fit.height:
        r = fit.row(0, named=True)
        return r, 1, f"slower than the deadline: {r['train_days']:.1f} days at best > {deadline_days:g}"
    ok = pl.col("status").cast(pl.String) == "ok"
    inside = fam.filter(pl.col("_within") & ok).sort(["memory_per_gpu_GiB", "cost_usd", "_row"])
    if inside.height:        # fits in memory, but within the margin at every size
        r = inside.row(0, named=True)
        cap = capacity.get(str(r["gpu"]), math.nan)
        return r, 2, (f"within the memory margin: {r['memory_headroom_GiB']:.1f} GiB free < "
                      f"{memory_margin:.0%} of {cap:.1f} GiB at best")
    inside = fam.filter(pl.col("_within")).sort(["memory_per_gpu_GiB", "cost_usd", "_row"])
    if inside.height:
        r = inside.row(0, named=True)
        cap = capacity.get(str(r["gpu"]), math.nan)
        return r, 3, f"out of memory: {r['memory_per_gpu_GiB']:.1f} GiB > {cap:.1f} GiB at best"
    r = fam.sort(order).row(0, named=True)
    return r, 4, f"over --max-gpus: {r['num_gpus']:,} GPUs > {max_gpus:,}"


def _unmet(job: dict, rows: pl.DataFrame, deadline_days, max_gpus, memory_margin) -> dict:
    """Why no plan of ``job`` meets the constraints, and what would (more GPUs, a later deadline)."""
    sizes = sorted(set(rows["num_gpus"].to_list()))
    fit = rows.filter(pl.col("_fits") & pl.col("_within")).sort(["train_days", "cost_usd", "_row"])
    head = f"no plan of {_job_text(job)} trains in {deadline_days:g} days or less"
    head += f" on {max_gpus:,} GPUs or fewer" if max_gpus is not None else ""
    head += f" with {memory_margin:.0%} of the GPU's memory free" if memory_margin else ""
    if fit.height == 0:
        fastest = None
        msg = head + ": none fits in memory" + (" within the GPUs" if max_gpus is not None else "")
    else:
        fastest = fit.row(0, named=True)
        msg = (f"{head}: the fastest that fits takes {fastest['train_days']:.1f} days "
               f"(${fastest['cost_usd']:,.0f}: {plan_text(fastest)})")
    more = rows.filter(pl.col("_fits") & pl.col("_in_time")).sort(["num_gpus", "cost_usd", "_row"])
    if max_gpus is not None and more.height:
        msg += (f"; with more GPUs it would: {more['num_gpus'][0]:,} GPUs meet it "
                f"(--max-gpus {more['num_gpus'][0]})")
    elif fastest is not None:
        top = rows.filter(pl.col("_fits")).sort(["train_days", "cost_usd", "_row"]).row(0, named=True)
        need = top["num_gpus"] * top["train_days"] / deadline_days
        msg += (f"; the sweep searched clusters of {sizes[0]:,} to {sizes[-1]:,} GPUs, where the fastest plan takes "
                f"{top['train_days']:.1f} days on {top['num_gpus']:,}: sweep larger clusters (at least "
                f"~{math.ceil(need):,} GPUs if time fell as 1/GPUs; more, as it falls slower), or allow "
                f"{math.ceil(fastest['train_days'] * 10) / 10:g} days")
    if memory_margin and rows.filter(pl.col("_within") & pl.col("_in_time")
                                     & (pl.col("status").cast(pl.String) == "ok")).height:
        msg += "; plans within the memory margin would meet it (a smaller --memory-margin)"
    return {"job": job, "fastest": fastest, "message": msg}


def _fetch(lf: pl.LazyFrame, manifest: dict, picked: list, margin: float) -> pl.DataFrame:
    """Every column of the ``picked`` rows ``(row, choice, reason)``, with the headroom, the cluster
    values and :data:`REASON_COLUMNS`, in the order picked."""
    row = pl.int_range(pl.len(), dtype=pl.Int64).alias("_row")
    keys = pl.DataFrame({"_row": [p[0] for p in picked], "choice": [p[1] for p in picked],
                         "reason": [p[2] for p in picked]}, schema={"_row": pl.Int64, "choice": pl.Int64,
                                                                    "reason": pl.String})
    full = (with_memory_headroom(lf.with_columns(row), manifest, margin)
            .filter(pl.col("_row").is_in(keys["_row"].to_list())).collect())
    out = keys.join(full, on="_row", how="left", maintain_order="left")
    # the chosen plan's cost, forward-filled over its runners-up (they follow it)
    base = pl.when(pl.col("choice") == 0).then(pl.col("cost_usd")).otherwise(None).forward_fill()
    out = out.with_columns((pl.col("cost_usd") - base).alias("extra_cost_usd"),
                           ((pl.col("cost_usd") / base - 1.0) * 100.0).alias("extra_cost_pct"))
    out = with_cluster_columns(out.drop("_row"), manifest)
    return out
