"""Rendering only: rich tables of frontiers and validation summaries. Computes nothing."""
from __future__ import annotations

import math

import polars as pl
from rich.console import Console
from rich.table import Table

from ..io.schema import SHORT_NAMES


def _fmt(v) -> str:
    """Numbers for people: thousands separators, no scientific notation below 10^9."""
    if v is None:
        return ""
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        a = abs(v)
        if a >= 1e9:
            return f"{v:.3g}"
        if a >= 1000:
            return f"{v:,.0f}"
        if a >= 10:
            return f"{v:.1f}"
        if a >= 0.01 or a == 0:
            return f"{v:.3f}"
        return f"{v:.2e}"
    if isinstance(v, int) and abs(v) >= 10000:
        return f"{v:,}"
    return str(v)


def frame_table(df: pl.DataFrame, title: str, max_rows: int | None = None, keep: tuple = ()) -> Table:
    """A rich table of ``df`` (first ``max_rows`` rows), with short headers; the columns in
    ``keep`` are never narrowed below their longest value (others are, when space runs out)."""
    table = Table(title=title, show_lines=False)
    rows = df.rows() if max_rows is None else df.head(max_rows).rows()
    for k, c in enumerate(df.columns):
        whole = max([len(SHORT_NAMES.get(c, c))] + [len(_fmt(r[k])) for r in rows]) if c in keep else None
        table.add_column(SHORT_NAMES.get(c, c), justify="right" if df[c].dtype.is_numeric()
                         or c == "memory_per_gpu_GiB" else "left",
                         min_width=whole)
    for r in rows:
        table.add_row(*(_fmt(v) for v in r))
    return table


# Dropped first when a table is wider than the terminal.
DROP_ORDER = ("memory_headroom_GiB", "num_tokens", "recompute", "memory_per_gpu_GiB", "iteration_time_s", "num_nodes", "dp",
              "micro_batch_size", "global_batch_size", "model")


def fit_columns(df: pl.DataFrame, width: int, keep: tuple = (),
                whole: pl.DataFrame | None = None) -> tuple[pl.DataFrame, list[str]]:
    """Drop columns until ``df`` fits ``width`` characters: first those with one value in every
    row of ``whole`` (the rows ``df`` was taken from; default ``df`` itself), returned as
    ``name = value`` notes for the title, so that a note holds for every row and not just the
    ones shown; then :data:`DROP_ORDER` (named in a note when they differ). Columns in ``keep``
    always stay."""
    whole = df if whole is None else whole

    def constant(c):             # one value in every row of whole, so in the rows shown too
        return whole[c].n_unique() == 1

    def need(frame):
        return sum(max(len(SHORT_NAMES.get(c, c)), max((len(_fmt(v)) for v in frame[c].to_list()), default=0)) + 3
                   for c in frame.columns) + 1
    notes = []
    if need(df) > width and df.height > 1:
        for c in df.columns:
            if c not in keep and constant(c):
                notes.append(f"{SHORT_NAMES.get(c, c)} = {_fmt(df[c][0])}")
                df = df.drop(c)
    hidden = []
    for c in DROP_ORDER:
        if need(df) <= width:
            break
        if c in df.columns and c not in keep:
            if not constant(c):
                hidden.append(SHORT_NAMES.get(c, c))
            else:
                notes.append(f"{SHORT_NAMES.get(c, c)} = {_fmt(df[c][0])}")
            df = df.drop(c)
    if hidden:
        notes.append(f"not shown for the terminal's width: {', '.join(hidden)} (widen the terminal)")
    return df, notes


TIGHT_MARK = "tight"


def mark_tight(df: pl.DataFrame, margin: float | None = None) -> tuple[pl.DataFrame, list[str]]:
    """``df`` with its ``memory_tight`` flag (:data:`~vtrain_fast.io.schema.DERIVED_COLUMNS`) shown
    in the memory column: ``memory_per_gpu_GiB`` as text, ``"73.8 tight"`` where the flag is set;
    the flag column dropped. Returns the frame and a note for the title (empty when no row is
    tight; ``margin``: the fraction the flag was computed with, for the note)."""
    if "memory_tight" not in df.columns:
        return df, []
    tight = df["memory_tight"].fill_null(False)
    df = df.drop("memory_tight")
    if not tight.any() or "memory_per_gpu_GiB" not in df.columns:
        return df, []
    mem = [_fmt(v) + (f" {TIGHT_MARK}" if t else "") for v, t in zip(df["memory_per_gpu_GiB"].to_list(), tight.to_list())]
    df = df.with_columns(pl.Series("memory_per_gpu_GiB", mem, dtype=pl.String))
    within = f"within {margin:.0%} of" if margin else "near"
    return df, [f"{TIGHT_MARK}: memory {within} the GPU's HBM capacity (--memory-margin leaves such plans out)"]


def print_frame(df: pl.DataFrame, title: str, max_rows: int | None = None, console: Console | None = None,
                keep: tuple = (), whole: pl.DataFrame | None = None,
                more_hint: str = "use --top or -o FILE.parquet", margin: float | None = None):
    """Print ``df`` (its first ``max_rows`` rows) as a rich table that fits the console (see
    :func:`fit_columns`; ``whole``: the rows ``df`` was taken from, for the notes of values every
    row shares; default ``df``). ``more_hint`` follows the count of rows not shown. Rows whose
    ``memory_tight`` flag is set are marked ``tight`` in the memory column (:func:`mark_tight`;
    ``margin``: the memory margin of the flag, for the title's note)."""
    console = console or Console()
    shown = df if max_rows is None else df.head(max_rows)
    shown, tight_notes = mark_tight(shown, margin)
    if tight_notes:
        keep = tuple(keep) + ("memory_per_gpu_GiB",)
    shown, notes = fit_columns(shown, console.width, keep, df if whole is None else whole)
    notes = tight_notes + notes
    if notes:
        title += "\n" + ", ".join(notes)
    console.print(frame_table(shown, title, keep=keep), soft_wrap=False)   # a table fits the width
    if max_rows is not None and df.height > max_rows:
        console.print(f"({df.height - max_rows:,} more rows not shown; {more_hint})")


PLOT_SUFFIXES = ("png", "svg", "pdf")


def check_plot_path(path, option: str = "--plot") -> None:
    """Refuse a plot file name whose suffix matplotlib is not asked to write here, before any work.

    Raises
    ------
    InputError
        Naming the option, the path and the allowed suffixes (:data:`PLOT_SUFFIXES`).
    """
    from pathlib import Path

    from ..io.errors import InputError
    if Path(path).suffix.lower().lstrip(".") not in PLOT_SUFFIXES:
        raise InputError("command line", option, str(path), "a file name ending in "
                         + ", ".join("." + x for x in PLOT_SUFFIXES), "e.g. --plot frontier.png")


def save_figure(fig, path) -> None:
    """Lay out a matplotlib figure, write it to ``path`` (format from its suffix) through a
    temporary name and an atomic rename, so that an interrupted run leaves no half-written
    image, and close it.

    Raises
    ------
    InputError
        If ``path`` is a folder or lies under a file.
    """
    from pathlib import Path

    import matplotlib.pyplot as plt

    from ..io.errors import write_atomically
    kind = Path(path).suffix.lstrip(".") or "png"
    try:
        fig.tight_layout()
        write_atomically(path, lambda tmp: fig.savefig(tmp, dpi=120, format=kind))
    finally:
        plt.close(fig)


def plot_predicted_vs_measured(groups, path, title: str, xlabel: str, ylabel: str, size: float,
                               legend_size=None) -> None:
    """Predicted against measured seconds per iteration on log axes with the ``y = x`` line.

    Parameters
    ----------
    groups : list of (str, polars.DataFrame)
        Label and rows (columns ``measured_iteration_time_s``, ``iteration_time_s``) of each
        scatter, and optionally a colour: ``(label, rows, color)``.
    path : str or Path
        Output image (see :func:`save_figure`).
    title, xlabel, ylabel : str
        Texts of the axes.
    size : float
        Marker size.
    legend_size : float, optional
        Legend font size (matplotlib's default when not given).
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 6))
    measured = []
    for label, r, *color in groups:
        ax.scatter(r["measured_iteration_time_s"], r["iteration_time_s"], s=size, label=label,
                   **({"alpha": 0.6, "c": color[0]} if color else {}))
        measured += r["measured_iteration_time_s"].to_list()
    if measured:
        lo, hi = min(measured) * 0.7, max(measured) * 1.4
        ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="y = x")
    ax.set(xscale="log", yscale="log", xlabel=xlabel, ylabel=ylabel, title=title)
    ax.legend(fontsize=legend_size)
    save_figure(fig, path)


def _number(v) -> str:
    """A number for a label: ``3e11``, ``1,024``, ``0.05`` (no ``300000000000.0``)."""
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e6:
        v = int(v)
    if isinstance(v, float):
        if abs(v) >= 1e6:               # .3g writes an exponent from 1e3 up: 3e+11 -> 3e11
            m, e = f"{v:.3g}".split("e")
            return f"{m}e{int(e)}"
        return f"{v:.3g}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return str(v)


# How a group column reads in a legend: a word before (tokens 3e11) or after (1,024 GPUs) the value.
_LABEL_WORDS = {"num_tokens": ("tokens ", ""), "num_gpus": ("", " GPUs"), "num_nodes": ("", " nodes"),
                "seq_length": ("seq ", ""), "micro_batch_size": ("mbs ", ""), "global_batch_size": ("gbs ", "")}


def group_label(columns, values) -> str:
    """A legend label of one group: ``gpt3-175b, tokens 3e11`` (model and GPU names bare, other
    columns named, numbers as :func:`_number` writes them)."""
    out = []
    for c, v in zip(columns, values):
        if c in ("model", "gpu"):
            out.append(str(v))
        elif c in _LABEL_WORDS:
            before, after = _LABEL_WORDS[c]
            out.append(f"{before}{_number(v)}{after}")
        else:
            out.append(f"{SHORT_NAMES.get(c, c)} {_number(v)}")
    return ", ".join(out)


def _short_gpu(name: str) -> str:
    """``h100-sxm-80gb`` -> ``h100-80gb``: the first and last parts of a GPU name."""
    parts = str(name).split("-")
    return f"{parts[0]}-{parts[-1]}" if len(parts) > 2 else str(name)


def _plan_label(r: dict) -> str:
    """A frontier plan in a few characters: ``tp2 pp32 dp8 b2 h100-80gb``."""
    return (f"tp{r.get('tp')} pp{r.get('pp')} dp{r.get('dp')} b{r.get('micro_batch_size')} "
            f"{_short_gpu(r.get('gpu', ''))}")


def _scale(ax, axis: str, values) -> None:
    """Log scale with a few labelled decades where ``values`` span more than 20x, linear otherwise
    (a loss spans a few percent: log ticks there overlap)."""
    import matplotlib.ticker as mt
    v = [x for x in values if x is not None and x > 0 and math.isfinite(x)]
    target = ax.xaxis if axis == "x" else ax.yaxis
    if v and max(v) / min(v) > 20:
        (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
        target.set_major_locator(mt.LogLocator(base=10, numticks=6))
        target.set_major_formatter(mt.LogFormatterSciNotation())
        target.set_minor_formatter(mt.NullFormatter())
    else:
        target.set_major_locator(mt.MaxNLocator(6))
        target.set_major_formatter(mt.FuncFormatter(lambda x, _: _number(float(x))))


def frontier_figure(front: pl.DataFrame, cloud: pl.DataFrame, x: str, y: str, by: tuple, title_of: str = "",
                    max_labels: int = 6):
    """The figure of :func:`plot_frontier` (returned open, for a caller or a test to inspect).

    Feasible plans are coloured by their ``by`` group (by ``gpu`` when not grouped and the
    cloud has it); each group's frontier is a line of the same colour (black when not grouped),
    and ``max_labels`` frontier plans in all (two per group at least: its ends), spread along
    each frontier, carry a short plan text
    (:func:`_plan_label`). An axis spanning more than 20x is logarithmic with few labels.

    Parameters
    ----------
    front, cloud : polars.DataFrame
        Frontier rows (with ``x``, ``y``, ``by`` and the plan columns tp, pp, dp,
        micro_batch_size, gpu) and a sample of feasible rows (``x``, ``y`` and ``by`` or ``gpu``).
    x, y : str
        Column names (objectives without a leading ``-``).
    by : tuple of str
        Group columns of the frontier (empty: one frontier).
    title_of : str
        What was plotted (a results folder), named in the title with the model(s) and objectives.
    max_labels : int
        Frontier plans labelled in all (at least the two ends of each group's frontier).

    Returns
    -------
    matplotlib.figure.Figure
    """
    import matplotlib
    matplotlib.use("Agg")
    from pathlib import Path

    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 5.5))
    colour_by = list(by) if by else (["gpu"] if "gpu" in cloud.columns else [])
    palette = plt.get_cmap("tab10").colors
    keys = []
    for frame in (front, cloud):
        if colour_by and all(c in frame.columns for c in colour_by):
            keys += [k for k in frame.select(colour_by).unique(maintain_order=True).rows() if k not in keys]
    colour = {k: palette[i % len(palette)] for i, k in enumerate(keys)}
    if cloud.height:
        if colour_by and all(c in cloud.columns for c in colour_by):
            for key, g in cloud.group_by(colour_by, maintain_order=True):
                ax.scatter(g[x], g[y], s=4, color=colour[tuple(key)], alpha=0.25, linewidths=0,
                           label=(f"{group_label(colour_by, key)} ({g.height:,} plans)" if not by else None))
        else:
            ax.scatter(cloud[x], cloud[y], s=4, c="0.75", alpha=0.4, linewidths=0,
                       label=f"feasible plans ({cloud.height:,} shown)")
    groups = front.partition_by(list(by), maintain_order=True) if by else [front]
    per_group = max(2, max_labels // max(len(groups), 1))     # the two ends of each frontier at least
    for g in groups:
        g = g.sort(x)
        if not g.height:
            continue
        key = tuple(g[c][0] for c in by)
        c = colour.get(key, "k") if by else "k"
        label = group_label(by, key) + f" ({g.height} on the frontier)" if by else "Pareto frontier"
        ax.plot(g[x], g[y], "o-", ms=4, lw=1.2, color=c, label=label, zorder=3)
        rows = g.rows(named=True)
        k = min(per_group, len(rows))
        picks = sorted({round(i * (len(rows) - 1) / max(k - 1, 1)) for i in range(k)})
        for i in picks:
            r = rows[i]
            ax.annotate(_plan_label(r), (r[x], r[y]), xytext=(7, -2), textcoords="offset points", fontsize=7,
                        color=c, zorder=4, bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none",
                                                 "alpha": 0.7})
    _scale(ax, "x", cloud[x].to_list() + front[x].to_list() if cloud.height else front[x].to_list())
    _scale(ax, "y", cloud[y].to_list() + front[y].to_list() if cloud.height else front[y].to_list())
    models = front["model"].cast(pl.String).unique(maintain_order=True).to_list() if "model" in front.columns else []
    what = Path(title_of).name if title_of else "results"
    model = f" ({', '.join(models)})" if 0 < len(models) <= 3 else ""
    ax.set(xlabel=x, ylabel=y, title=f"{what}{model}: Pareto frontier, minimise {x} and {y}"
                                     + (f", per {', '.join(SHORT_NAMES.get(b, b) for b in by)}" if by else ""))
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7, markerscale=2)
    return fig


def plot_frontier(front: pl.DataFrame, cloud: pl.DataFrame, x: str, y: str, by: tuple, path,
                  title_of: str = "") -> None:
    """Scatter the feasible plans (``cloud``, coloured by group) and the Pareto frontier
    (``front``, one colour and line per group of ``by``, a few plans labelled) of objectives
    ``x`` and ``y``, and write the image (:func:`frontier_figure`, :func:`save_figure`).

    Parameters
    ----------
    front, cloud, x, y, by, title_of
        As :func:`frontier_figure`.
    path : str or Path
        Output file (PNG, SVG or PDF by its suffix).
    """
    save_figure(frontier_figure(front, cloud, x, y, by, title_of), path)


def optimal_table(res) -> Table:
    """The realistic optimum of :func:`vtrain_fast.analysis.optimal.optimal` next to the naive
    answer at 100 % utilisation, the naive size trained with its best plan, and realistic over
    naive."""
    b, n, s = res.best, res.naive, res.naive_size
    kind = res.budget["kind"]
    budget = (f"{res.budget['gpus']:,} x {res.gpu} for {res.budget['days']:g} days" if kind == "cluster"
              else f"${res.budget['budget_usd']:,.0f} on {res.gpu}" if kind == "usd"
              else f"{res.budget['gpu_hours']:,.0f} GPU-h on {res.gpu}")
    if res.budget.get("inference_tokens"):
        budget += f", serving {res.budget['inference_tokens']:.3g} tokens"
    table = Table(title=f"compute-optimal model for {budget} ({res.fit.name} fit)", show_lines=False)
    for head, just in (("", "left"), ("realistic optimum", "right"), ("naive (100 % utilisation)", "right"),
                       ("naive size, real plan", "right"), ("realistic / naive", "right")):
        table.add_column(head, justify=just)

    def plan(r):
        return (f"tp {r['tp']} pp {r['pp']} dp {r['dp']} mbs {r['micro_batch_size']} B {r['global_batch_size']} "
                f"{r['recompute']}" if r else "")

    def shape(r):
        return f"{r['num_layers']} L x {r['hidden_size']} h x {r['num_attention_heads']} heads" if r else ""

    def ratio(x, y):
        return "" if x is None or y is None or not y else f"{x / y:.2f}x"

    g = lambda r, k: None if r is None else r.get(k)  # noqa: E731

    def _memory(r):
        if r is None:
            return ""
        return f"{r['memory_per_gpu_GiB']:.1f}" + (f" {TIGHT_MARK} (< {res.budget['memory_margin']:.0%} free)"
                                                   if r.get("memory_tight") else "")

    rows = [
        ("shape", shape(b), "", shape(s) or "outside the sizes searched", ""),
        ("parameters", _fmt(float(b["num_parameters"])), _fmt(n["num_parameters"]), _fmt(None if s is None else float(s["num_parameters"])),
         ratio(b["num_parameters"], n["num_parameters"])),
        ("tokens", _fmt(b["num_tokens"]), _fmt(n["num_tokens"]), _fmt(g(s, "num_tokens")),
         ratio(b["num_tokens"], n["num_tokens"])),
        ("tokens per parameter", f"{b['tokens_per_parameter']:.1f}", f"{n['tokens_per_parameter']:.1f}",
         "" if s is None else f"{s['tokens_per_parameter']:.1f}", ratio(b["tokens_per_parameter"],
                                                                       n["tokens_per_parameter"])),
        ("6 N D FLOPs", _fmt(b["flops"]), _fmt(n["flops"]), _fmt(g(s, "flops")), ratio(b["flops"], n["flops"])),
        ("plan", plan(b), "", plan(s), ""),
        ("GPUs", f"{b['num_gpus']:,}", "" if n["num_gpus"] is None else f"{n['num_gpus']:,}",
         "" if s is None else f"{s['num_gpus']:,}", ratio(b["num_gpus"], n["num_gpus"])),
        ("days", f"{b['train_days']:.1f}", "" if n["train_days"] is None else f"{n['train_days']:.1f}",
         "" if s is None else f"{s['train_days']:.1f}", ratio(b["train_days"], n["train_days"])),
        ("GPU-hours", _fmt(b["gpu_hours"]), _fmt(n["gpu_hours"]), _fmt(g(s, "gpu_hours")),
         ratio(b["gpu_hours"], n["gpu_hours"])),
        ("cost USD", _fmt(b["cost_usd"]), _fmt(n["cost_usd"]), _fmt(g(s, "cost_usd")), ratio(b["cost_usd"], n["cost_usd"])),
        ("memory per GPU (GiB)", _memory(b), "", _memory(s), ""),
        ("MFU", f"{b['mfu']:.1%}", f"{n['mfu']:.0%}", "" if s is None else f"{s['mfu']:.1%}", ratio(b["mfu"], n["mfu"])),
        ("loss (nats/token)", f"{b['loss']:.4f}", f"{n['loss']:.4f}", "" if s is None else f"{s['loss']:.4f}",
         f"{b['loss'] - n['loss']:+.4f}"),
    ]
    if res.budget.get("inference_tokens"):
        serve = lambda r: None if r is None else 2.0 * float(r["num_parameters"]) * res.budget["inference_tokens"]  # noqa: E731
        rows.insert(-2, ("serving FLOPs (2 N D_inf)", _fmt(serve(b)), _fmt(serve(n)), _fmt(serve(s)), ratio(serve(b), serve(n))))
        rows.insert(-2, ("serving GPU-hours", _fmt(b["inference_gpu_hours"]), "", _fmt(g(s, "inference_gpu_hours")), ""))
        rows.insert(-2, ("total cost USD", _fmt(b["total_cost_usd"]), _fmt(n["total_cost_usd"]), _fmt(g(s, "total_cost_usd")),
                         ratio(b["total_cost_usd"], n["total_cost_usd"])))
    for r in rows:
        table.add_row(*r)
    return table
