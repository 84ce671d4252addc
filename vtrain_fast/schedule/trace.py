"""Job traces: the CSV format ``vtrain-fast schedule`` reads (:data:`TRACE_COLUMNS`, one record
per column) and :func:`read_trace`, which checks every cell and names the file, row, column,
value, what is allowed and a fix.

One row per training job. Times are hours from the start of the trace. A job trains
``num_tokens`` tokens (or ``num_steps`` optimizer steps) of a model preset
(``vtrain-fast presets``) at ``global_batch_size`` sequences of the preset's ``seq_length``;
``deadline_hours`` is absolute (hours from the start of the trace, not from the arrival).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from ..io.errors import InputError, did_you_mean

# The global batch of a job whose row gives none, sequences (a power of two, so that most
# data-parallel sizes divide it; GPT-3's 1.3B-13B models used 0.5M-1M-token batches, Brown et
# al. 2020, Table 2.1: 256-512 sequences of 2,048).
DEFAULT_GLOBAL_BATCH_SIZE = 512


@dataclass(frozen=True)
class TraceColumn:
    """One column of a job trace.

    Attributes
    ----------
    name : str
    dtype : polars data type
        As stored after reading.
    required : bool
        The column must be present (``num_tokens`` / ``num_steps``: one of the two).
    unit : str
    doc : str
    """

    name: str
    dtype: object
    required: bool
    unit: str
    doc: str


TRACE_COLUMNS = (
    TraceColumn("job_id", pl.String, True, "", "unique name of the job"),
    TraceColumn("arrival_hours", pl.Float64, True, "h", "submission time, hours from the start of the trace (>= 0)"),
    TraceColumn("model", pl.String, True, "", "model preset (vtrain-fast presets)"),
    TraceColumn("num_tokens", pl.Float64, False, "tokens", "tokens to train on (or num_steps)"),
    TraceColumn("num_steps", pl.Int64, False, "steps", "optimizer steps to train (or num_tokens)"),
    TraceColumn("deadline_hours", pl.Float64, False, "h",
                "latest finish, hours from the start of the trace (after arrival_hours); empty: none"),
    TraceColumn("global_batch_size", pl.Int64, False, "sequences",
                f"sequences per step [{DEFAULT_GLOBAL_BATCH_SIZE}]"),
    TraceColumn("priority", pl.Int64, False, "", "higher first among equal deadlines / arrivals [0]"),
    TraceColumn("num_gpus", pl.Int64, False, "GPUs",
                "GPUs the job asks for (fifo's fixed request; rounded up to whole nodes, at most the cluster, "
                "and up to the fewest nodes a plan fits on); empty: the fewest that meet its deadline alone"),
)
BY_NAME = {c.name: c for c in TRACE_COLUMNS}


def markdown_table() -> str:
    """The trace format as a Markdown table (README, Scheduling)."""
    lines = ["| column | unit | required | meaning |", "|---|---|---|---|"]
    for c in TRACE_COLUMNS:
        req = "yes" if c.required else ("one of the two" if c.name in ("num_tokens", "num_steps") else "no")
        lines.append(f"| `{c.name}` | {c.unit} | {req} | {c.doc} |")
    return "\n".join(lines)


def read_trace(path: str | Path, models: dict | None = None) -> pl.DataFrame:
    """Read and check a job trace (CSV or Parquet).

    Parameters
    ----------
    path : str or Path
    models : dict, optional
        Model name -> shape, default the presets (:data:`vtrain_fast.plan.models.MODEL_PRESETS`).

    Returns
    -------
    polars.DataFrame
        One row per job, every column of :data:`TRACE_COLUMNS` in their dtypes, defaults filled
        (``deadline_hours`` null where none; ``num_steps`` null where ``num_tokens`` is given and
        the other way round), in the file's order.

    Raises
    ------
    InputError
        Unreadable file; a missing or unknown column; a cell of the wrong type or out of range
        (naming the row, 1 = the first job); a duplicate ``job_id``; an unknown model.
    """
    from ..analysis.evaluate import read_csv
    from ..plan.models import MODEL_PRESETS
    models = models if models is not None else MODEL_PRESETS
    where = str(path)
    raw = read_csv(path, as_text=True)      # every cell as written: job ids such as 007 stay text
    if raw.height == 0:
        raise InputError(where, "rows", 0, "at least one job", "write one row per job under the header")
    for c in raw.columns:
        if c not in BY_NAME:
            raise InputError(where, f"column {c}", c, "one of " + ", ".join(BY_NAME),
                             did_you_mean(c, BY_NAME, "see README, Scheduling: the trace format"))
    for c in TRACE_COLUMNS:
        if c.required and c.name not in raw.columns:
            raise InputError(where, f"column {c.name}", None, c.doc, f"add a {c.name} column")
    if "num_tokens" not in raw.columns and "num_steps" not in raw.columns:
        raise InputError(where, "column num_tokens", None, "num_tokens or num_steps per job",
                         "add a num_tokens column (tokens to train on)")
    cols = {}
    for c in TRACE_COLUMNS:
        if c.name not in raw.columns:
            cols[c.name] = pl.Series(c.name, [None] * raw.height, dtype=c.dtype)
            continue
        values = raw[c.name].to_list()
        cols[c.name] = pl.Series(c.name, [_cell(where, k + 1, c, v) for k, v in enumerate(values)], dtype=c.dtype)
    df = pl.DataFrame(cols)
    for i, r in enumerate(df.iter_rows(named=True)):
        _check_row(where, i + 1, r, models)
    dup = df.filter(pl.col("job_id").is_duplicated())
    if dup.height:
        raise InputError(where, "column job_id", dup["job_id"][0], "a unique name per job", "rename one of them")
    return df.with_columns(pl.col("global_batch_size").fill_null(DEFAULT_GLOBAL_BATCH_SIZE),
                           pl.col("priority").fill_null(0))


# Largest values a trace may hold (beyond them the replay's clock and counts lose precision): a
# century of hours, 10^18 tokens, 10^12 steps, 10^7 GPUs.
LIMITS = {"arrival_hours": 1e6, "deadline_hours": 1e6, "num_tokens": 1e18, "num_steps": 1e12,
          "global_batch_size": 1e8, "num_gpus": 1e7, "priority": 1e9}


def _cell(where: str, k: int, c: TraceColumn, v):
    """One cell of column ``c`` (row ``k``) as its dtype: text stripped; numbers from text or
    numbers (``1e3`` and ``8.0`` are whole numbers), empty as null."""
    if c.dtype == pl.String:
        return None if v is None else str(v).strip()
    if v is None or (isinstance(v, str) and v.strip() == ""):
        return None
    whole = c.dtype == pl.Int64
    try:
        x = float(v) if not isinstance(v, bool) else math.nan
    except (TypeError, ValueError):
        x = math.nan
    if not math.isfinite(x) or (whole and not x.is_integer()):
        raise InputError(where, f"row {k} column {c.name}", v, "a whole number" if whole else "a number",
                         f"write {c.name} as {'e.g. 512' if whole else 'e.g. 1.5'}")
    if abs(x) > LIMITS[c.name]:
        raise InputError(where, f"row {k} column {c.name}", v, f"at most {LIMITS[c.name]:g} ({c.unit})")
    return int(x) if whole else x


def _check_row(where: str, k: int, r: dict, models: dict) -> None:
    def bad(col, allowed, fix=""):
        raise InputError(where, f"row {k} column {col}", r[col], allowed, fix)
    if not r["job_id"]:
        bad("job_id", "a name", "name every job")
    if r["model"] not in models:
        bad("model", "a model preset (vtrain-fast presets)", did_you_mean(r["model"] or "", models, "e.g. gpt3-13b"))
    a = r["arrival_hours"]
    if a is None or not math.isfinite(a) or a < 0:
        bad("arrival_hours", "hours >= 0 from the start of the trace")
    tokens, steps = r["num_tokens"], r["num_steps"]
    if (tokens is None) == (steps is None):
        raise InputError(where, f"row {k} columns num_tokens / num_steps", [tokens, steps],
                         "exactly one of the two per job", "leave the other cell empty")
    if tokens is not None and not (math.isfinite(tokens) and tokens > 0):
        bad("num_tokens", "a positive number of tokens")
    if steps is not None and steps <= 0:
        bad("num_steps", "a positive number of steps")
    d = r["deadline_hours"]
    if d is not None and not (math.isfinite(d) and d > a):
        bad("deadline_hours", f"hours after arrival_hours ({a:g}), from the start of the trace",
            "deadline_hours is absolute: arrival plus the time allowed")
    if r["global_batch_size"] is not None and r["global_batch_size"] <= 0:
        bad("global_batch_size", "a positive number of sequences")
    if r["num_gpus"] is not None and r["num_gpus"] <= 0:
        bad("num_gpus", "a positive number of GPUs")
    if r["priority"] is not None and r["priority"] < -LIMITS["priority"]:
        bad("priority", f"a whole number from {-LIMITS['priority']:g} to {LIMITS['priority']:g}")
