"""Rendering only: rich tables of frontiers and validation summaries. Computes nothing."""
from __future__ import annotations

import math

import polars as pl
from rich.console import Console
from rich.table import Table


def _fmt(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        a = abs(v)
        if a != 0 and (a >= 1e6 or a < 1e-3):
            return f"{v:.3g}"
        return f"{v:,.3f}" if a < 100 else f"{v:,.0f}"
    return str(v)


def frame_table(df: pl.DataFrame, title: str, max_rows: int | None = None) -> Table:
    """A rich table of ``df`` (first ``max_rows`` rows)."""
    table = Table(title=title, show_lines=False)
    for c in df.columns:
        table.add_column(c, justify="right" if df[c].dtype.is_numeric() else "left")
    rows = df.rows() if max_rows is None else df.head(max_rows).rows()
    for r in rows:
        table.add_row(*(_fmt(v) for v in r))
    return table


def print_frame(df: pl.DataFrame, title: str, max_rows: int | None = None, console: Console | None = None):
    (console or Console()).print(frame_table(df, title, max_rows))
