"""``vtrain-fast report DIR -o OUT/`` (issue 14): one self-contained HTML page of a results folder.

The page holds the Pareto frontier (cost against days, coloured by GPU, frontier plans labelled),
an MFU heatmap over tp x pp for the best micro-batch, the time breakdown of the top frontier
plans, optionally the compute-optimal curve of a study file (``--optimal STUDY.toml``), and the
key tables. Every image is a PNG written next to ``index.html`` and embedded in it as base64, so
the page needs no other file, no JavaScript and no network.
"""
from __future__ import annotations

import base64
import html
import math
from pathlib import Path

import numpy as np
import polars as pl

from ..io.errors import InputError
from ..io.outputs import FolderOutput
from .query import (BREAKDOWN_COLUMNS, DEFAULT_MEMORY_MARGIN, feasible_plans, feasible_sample, pareto, with_memory_headroom,
                    varying_job_columns)
from .report import _fmt, _plan_label, frontier_figure, save_figure

OBJECTIVES = ("cost_usd", "train_days")
# What `report` writes into its folder: the only entries --overwrite replaces (io.outputs).
REPORT_OUTPUT = FolderOutput("report", ("index.html", "frontier.png", "mfu.png", "breakdown.png", "optimal.png"))
TOP_PLANS = 8
# The colours of the time parts (tab10 order), the same in every report.
PART_COLOURS = {"compute_s": "#1f77b4", "tp_comm_s": "#ff7f0e", "cp_comm_s": "#8c564b", "ep_comm_s": "#e377c2",
                "pp_comm_s": "#2ca02c", "dp_comm_s": "#d62728", "bubble_s": "#9467bd", "optimizer_s": "#bcbd22",
                "overhead_s": "#7f7f7f", "offload_s": "#17becf"}
SECTIONS = ("frontier", "mfu", "breakdown", "optimal", "tables")

CSS = """
body { font-family: sans-serif; margin: 24px auto; max-width: 1100px; color: #222; background: #fff; }
h1 { border-bottom: 3px solid #1f77b4; padding-bottom: 6px; }
h2 { margin-top: 36px; border-bottom: 1px solid #ccc; padding-bottom: 4px; }
img { max-width: 100%; border: 1px solid #ddd; }
div.wide { overflow-x: auto; }
table { border-collapse: collapse; font-size: 12px; margin: 8px 0; }
th, td { border: 1px solid #ccc; padding: 3px 6px; text-align: right; white-space: nowrap; }
th { background: #eef3f8; }
td.text { text-align: left; }
tr.tight td { background: #fff4e0; }
p.note { color: #555; font-size: 13px; }
code { background: #f3f3f3; padding: 1px 4px; }
"""


def _esc(text) -> str:
    return html.escape(str(text), quote=True)


def _png_tag(path: Path, alt: str) -> str:
    """An ``<img>`` with the PNG at ``path`` inline as base64."""
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img src="data:image/png;base64,{data}" alt="{_esc(alt)}">'


def html_table(df: pl.DataFrame, percent: tuple = ("mfu",), row_class=None) -> str:
    """``df`` as an HTML table (text escaped; numbers formatted, ``percent`` columns as %; text
    columns left-aligned; ``row_class``: a list of a CSS class per row, or ``None``)."""
    head = "".join(f"<th>{_esc(c)}</th>" for c in df.columns)
    rows = []
    for i, r in enumerate(df.rows()):
        cells = []
        for c, v in zip(df.columns, r):
            text = (f"{v:.1%}" if c in percent and isinstance(v, (int, float)) and v is not None
                    else _fmt(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else ("" if v is None else v))
            cls = ' class="text"' if not isinstance(v, (int, float)) or isinstance(v, bool) else ""
            cells.append(f"<td{cls}>{_esc(text)}</td>")
        cls = f' class="{_esc(row_class[i])}"' if row_class and row_class[i] else ""
        rows.append(f"<tr{cls}>{''.join(cells)}</tr>")
    return f"<div class=\"wide\"><table><tr>{head}</tr>{''.join(rows)}</table></div>"


def mfu_grid(plans: pl.DataFrame) -> tuple[int, list[int], list[int], np.ndarray]:
    """The MFU heatmap's numbers: the micro-batch size of the plan of highest MFU, and for that
    micro-batch the best MFU of each (tp, pp) over the other axes (GPU, GPU count, recompute, ...).

    Parameters
    ----------
    plans : polars.DataFrame
        Feasible rows with ``tp``, ``pp``, ``micro_batch_size`` and ``mfu``.

    Returns
    -------
    tuple
        ``(micro_batch_size, tps, pps, grid)``: ``grid[i, j]`` the best MFU at ``pps[i]``,
        ``tps[j]`` (NaN where that micro-batch has no feasible plan).
    """
    best = plans.sort("mfu", descending=True).row(0, named=True)
    mbs = int(best["micro_batch_size"])
    sel = (plans.filter(pl.col("micro_batch_size") == mbs).group_by(["tp", "pp"]).agg(pl.col("mfu").max()))
    tps = sorted(plans["tp"].unique().to_list())
    pps = sorted(plans["pp"].unique().to_list())
    grid = np.full((len(pps), len(tps)), np.nan)
    for tp, pp, mfu in sel.rows():
        grid[pps.index(pp), tps.index(tp)] = mfu
    return mbs, tps, pps, grid


def mfu_figure(mbs: int, tps, pps, grid: np.ndarray, title_of: str):
    """A heatmap of :func:`mfu_grid`'s grid, each cell annotated with its MFU in %."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(1.2 * len(tps) + 3.0, 0.7 * len(pps) + 2.2))
    masked = np.ma.masked_invalid(grid * 100.0)
    cmap = plt.get_cmap("viridis").with_extremes(bad="#eeeeee")
    im = ax.imshow(masked, cmap=cmap, aspect="auto", origin="lower")
    ax.set_xticks(range(len(tps)), [str(t) for t in tps])
    ax.set_yticks(range(len(pps)), [str(p) for p in pps])
    ax.set(xlabel="tensor-parallel size tp", ylabel="pipeline-parallel size pp",
           title=f"{Path(title_of).name}: best MFU per tp x pp, micro-batch {mbs}")
    finite = grid[np.isfinite(grid)]
    mid = (finite.min() + finite.max()) / 2.0 * 100.0 if finite.size else 0.0
    for i in range(len(pps)):
        for j in range(len(tps)):
            v = grid[i, j]
            text = "-" if not math.isfinite(v) else f"{v:.1%}"
            colour = "black" if not math.isfinite(v) or v * 100.0 > mid else "white"
            ax.text(j, i, text, ha="center", va="center", fontsize=9, color=colour)
    fig.colorbar(im, ax=ax, label="MFU, %")
    return fig


def breakdown_figure(top: pl.DataFrame, title_of: str):
    """Stacked horizontal bars of where each plan's iteration time goes (:data:`BREAKDOWN_COLUMNS`
    that are non-zero somewhere), one bar per row of ``top``, labelled by its plan."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    parts = [c for c in BREAKDOWN_COLUMNS if c in top.columns and float(top[c].abs().sum()) > 0]
    fig, ax = plt.subplots(figsize=(9, 0.45 * top.height + 1.8))
    rows = top.rows(named=True)
    labels = [f"{_plan_label(r)} ${_fmt(float(r['cost_usd']))}" for r in rows]
    left = np.zeros(len(rows))
    for c in parts:
        v = np.array([float(r[c] or 0.0) for r in rows])
        ax.barh(range(len(rows)), v, left=left, color=PART_COLOURS.get(c, None), label=c.removesuffix("_s"))
        left += v
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set(xlabel="seconds per iteration", title=f"{Path(title_of).name}: time breakdown of the cheapest frontier plans")
    ax.legend(fontsize=7, ncol=min(len(parts), 5), loc="upper center", bbox_to_anchor=(0.5, -0.18 if top.height > 3 else -0.3))
    ax.grid(True, axis="x", alpha=0.3)
    return fig


def optimal_figure(res):
    """Loss against parameters of the realistic search (best plan per shape), the optimum
    and the naive answer at 100 % utilisation marked."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    curve = res.curve.sort("num_parameters")
    fig, ax = plt.subplots(figsize=(8, 5))
    ax.plot(curve["num_parameters"], curve["loss"], "o-", ms=3, color="#1f77b4",
            label="realistic (best plan per model size)")
    b, n = res.best, res.naive
    ax.plot([b["num_parameters"]], [b["loss"]], "*", ms=14, color="#d62728",
            label=f"realistic optimum: {_fmt(float(b['num_parameters']))} params, loss {b['loss']:.3f}")
    ax.plot([n["num_parameters"]], [n["loss"]], "D", ms=9, color="#ff7f0e",
            label=f"naive (100 % utilisation): {_fmt(float(n['num_parameters']))} params, loss {n['loss']:.3f}")
    ax.set_xscale("log")
    ax.set(xlabel="parameters N", ylabel="loss L(N, D), nats/token",
           title=f"compute-optimal model on {res.gpu} ({res.fit.name} fit): realistic against naive")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def _manifest_rows(folder: Path, manifest: dict) -> pl.DataFrame:
    counts = manifest.get("status_counts") or {}
    gpus = manifest.get("gpus") or {}
    rows = [("spec name", manifest.get("name", "")), ("folder", str(folder)),
            ("points", f"{manifest.get('num_points', 0):,}"), ("rows kept", f"{manifest.get('num_rows', 0):,}"
                                                                  f" ({manifest.get('keep', 'all')})"),
            ("feasible (status ok)", f"{counts.get('ok', 0):,}"),
            ("other statuses", ", ".join(f"{k} {v:,}" for k, v in counts.items() if k != "ok" and v) or "none"),
            ("GPUs", ", ".join(gpus) if isinstance(gpus, dict) else str(gpus)),
            ("written", f"{manifest.get('created', '')} by {manifest.get('package', '')} {manifest.get('version', '')}")]
    return pl.DataFrame({"": [r[0] for r in rows], "value": [str(r[1]) for r in rows]})


def _section(key: str, title: str, body: str) -> str:
    return f'<section id="{key}"><h2>{_esc(title)}</h2>\n{body}\n</section>'


def _build(folder: Path, out: Path, study, where=(), memory_margin=None) -> None:
    """Write the PNGs and ``index.html`` of :func:`write_report` into the folder ``out``."""
    from ..io.writer import read_manifest
    manifest = read_manifest(folder)
    # one frontier per training job and GPU; a folder reduced to one frontier has only that one
    by = [] if manifest.get("keep", "all").startswith("frontier") else varying_job_columns(folder) + ["gpu"]
    where = list(where)
    front = pareto(folder, list(OBJECTIVES), by, breakdown=True, where=where, memory_margin=memory_margin)
    margin = DEFAULT_MEMORY_MARGIN if memory_margin is None else memory_margin
    chosen = "; ".join(([f"only plans with {', '.join(where)}"] if where else [])
                       + ([f"plans with less than {memory_margin:.0%} of the HBM free left out"] if memory_margin else []))
    if front.height == 0 and (where or memory_margin):
        raise InputError(str(folder), "--where" if where else "--memory-margin", where or memory_margin,
                         "conditions that leave at least one feasible plan", "relax --where or lower --memory-margin")
    if front.height == 0:
        raise InputError(str(folder), "status", "ok", "a results folder with at least one feasible plan",
                         "see the status counts in its manifest.json: try larger tp/pp, recompute = full or more GPUs")
    name = manifest.get("name") or folder.name
    parts = []
    # (a) frontier
    cloud = feasible_sample(folder, list(dict.fromkeys(list(OBJECTIVES) + by)), where=where)
    save_figure(frontier_figure(front, cloud, "cost_usd", "train_days", tuple(by), title_of=str(folder)),
                out / "frontier.png")
    parts.append(_section("frontier", "Pareto frontier: cost against days",
                          f'<p class="note">Every feasible plan (dots, coloured by {_esc(", ".join(by) or "gpu")}) and the '
                          f"frontier {'of each group' if by else '(black: the folder was kept as one frontier)'} (lines: no plan "
                          f"on it is both cheaper and faster than another); a few frontier plans "
                          f"are labelled tp / pp / dp / micro-batch / GPU. {front.height:,} frontier plans.</p>"
                          + _png_tag(out / "frontier.png", "Pareto frontier")))
    # (b) MFU heatmap
    plans = feasible_plans(folder, where=where)
    if memory_margin:                     # the heatmap leaves out what the frontier leaves out
        plans = with_memory_headroom(plans, manifest, memory_margin).filter(~pl.col("memory_tight"))
    plans = plans.select(["tp", "pp", "micro_batch_size", "mfu"]).collect()
    mbs, tps, pps, grid = mfu_grid(plans)
    save_figure(mfu_figure(mbs, tps, pps, grid, str(folder)), out / "mfu.png")
    parts.append(_section("mfu", f"MFU over tp x pp (micro-batch {mbs})",
                          f'<p class="note">The best model FLOPs utilisation of each tp x pp over the other axes '
                          f"(GPU, GPU count, recompute, settings), for micro-batch size {mbs}: the micro-batch of "
                          f"the plan of highest MFU ({np.nanmax(grid):.1%}). Grey: no feasible plan.</p>"
                          + _png_tag(out / "mfu.png", "MFU heatmap")))
    # (c) breakdown
    top = front.sort("cost_usd").head(TOP_PLANS)
    save_figure(breakdown_figure(top, str(folder)), out / "breakdown.png")
    parts.append(_section("breakdown", f"Time breakdown of the {top.height} cheapest frontier plans",
                          '<p class="note">Where one iteration\'s time goes: compute, tensor-, pipeline- and '
                          "data-parallel communication, the pipeline bubble, the optimizer step and overheads "
                          "(they add up to iteration_time_s).</p>" + _png_tag(out / "breakdown.png", "time breakdown")))
    # (d) optimal
    if study is None:
        body = ('<p class="note">Not included. Add the compute-optimal curve (loss against model size, realistic '
                "against the naive answer at 100 % utilisation) with <code>vtrain-fast report DIR -o OUT "
                "--optimal STUDY.toml</code>, e.g. <code>--optimal sweeps/case-compute-optimal-3360xa100-30d.toml"
                "</code>.</p>")
    else:
        from .optimal import optimal, read_config
        res = optimal(**read_config(study))
        save_figure(optimal_figure(res), out / "optimal.png")
        b, n = res.best, res.naive
        keys = [("parameters", "num_parameters"), ("tokens", "num_tokens"), ("tokens per parameter", "tokens_per_parameter"),
                ("6 N D FLOPs", "flops"), ("GPUs", "num_gpus"), ("days", "train_days"), ("cost USD", "cost_usd"),
                ("MFU", "mfu"), ("loss (nats/token)", "loss")]
        def value(r, c, mfu_digits):
            v = r.get(c)
            return ("" if v is None else f"{float(v):.{mfu_digits}%}" if c == "mfu" else f"{int(v):,}" if c == "num_gpus"
                    else f"{float(v):.1f}" if c in ("train_days", "tokens_per_parameter") else f"{float(v):.4f}"
                    if c == "loss" else _fmt(float(v)))
        tab = pl.DataFrame({"": [k for k, _ in keys],
                            "realistic optimum": [value(b, c, 1) for _, c in keys],
                            "naive (100 % utilisation)": [value(n, c, 0) for _, c in keys]})
        body = (f'<p class="note">Study {_esc(Path(study).name)}: {res.shapes} shapes searched, {res.points:,} plans '
                f"({res.feasible:,} feasible); best plan tp {b['tp']} pp {b['pp']} dp {b['dp']} mbs "
                f"{b['micro_batch_size']} {_esc(b['recompute'])}.</p>" + _png_tag(out / "optimal.png", "compute-optimal curve")
                + html_table(tab) + "".join(f'<p class="note">warning: {_esc(w)}</p>' for w in res.warnings))
    parts.append(_section("optimal", "Compute-optimal model size", body))
    # (e) tables
    shown = [c for c in front.columns if c not in BREAKDOWN_COLUMNS and c != "memory_tight"]
    tight = front["memory_tight"].fill_null(False).to_list() if "memory_tight" in front.columns else [False] * front.height
    ft = front.select(shown)
    keep = set(by) | {"tp", "pp", "dp", "micro_batch_size", "cost_usd", "train_days", "mfu", "memory_per_gpu_GiB"}
    same = [c for c in ft.columns if c not in keep and ft.height > 1 and ft[c].n_unique() == 1]
    shared = ", ".join(f"{c} = {_fmt(ft[c][0])}" for c in same)
    ft = ft.drop(same).with_columns(pl.Series("memory_tight", ["tight" if t else "" for t in tight]))
    parts.append(_section("tables", "Key tables",
                          "<h3>Frontier plans</h3>"
                          f'<p class="note">Sorted by {_esc(", ".join(by + ["cost_usd"]))}. memory_tight: within '
                          f"{margin:.0%} of the GPU's HBM capacity (rows shaded)."
                          + (f" Every frontier plan has {_esc(shared)}." if shared else "") + "</p>"
                          + html_table(ft, row_class=["tight" if t else "" for t in tight])
                          + "<h3>Results folder</h3>" + html_table(_manifest_rows(folder, manifest))))
    page = ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{_esc(name)}: vtrain_fast report</title><style>{CSS}</style></head><body>\n"
            f"<h1>{_esc(name)}: vtrain_fast report</h1>\n"
            f'<p class="note">{_esc(folder)}: {manifest.get("num_points", 0):,} points, '
            f"{(manifest.get('status_counts') or {}).get('ok', 0):,} feasible"
            + (f"; {_esc(chosen)} (the dots of the frontier figure include plans within the memory margin)"
               if memory_margin else f"; {_esc(chosen)}" if chosen else "") + ".</p>\n"
            + "\n".join(parts) + "\n</body></html>\n")
    (out / "index.html").write_text(page, encoding="utf-8")


def write_report(folder, out_dir, optimal_study=None, overwrite: bool = False, where=(),
                 memory_margin: float | None = None) -> Path:
    """Write the HTML report of a results folder: ``out_dir/index.html`` with every image inline
    (base64 PNGs; the PNGs also next to it).

    The folder is built in a temporary folder beside ``out_dir`` and renamed into place, so an
    interrupted run leaves no half-written report.

    Parameters
    ----------
    folder : str or Path
        A finished results folder (``vtrain-fast sweep``).
    out_dir : str or Path
        The report's folder.
    optimal_study : str or Path, optional
        A study file with an ``[optimal]`` table (:func:`vtrain_fast.analysis.optimal.read_config`):
        adds the compute-optimal curve.
    overwrite : bool
        Replace an existing non-empty ``out_dir`` that an earlier report wrote (never an input,
        a results folder, a folder holding other files, nor the current folder:
        :func:`vtrain_fast.io.outputs.check_output`).
    where : sequence of str
        Only the plans meeting these ``COLUMN OP VALUE`` conditions, in every figure and table
        (:func:`~vtrain_fast.analysis.query.where_filter`).
    memory_margin : float, optional
        Leave out the plans whose memory headroom is below this fraction of the GPU's HBM (as
        ``pareto --memory-margin``); without it the tables mark them ``tight`` at
        :data:`~vtrain_fast.analysis.query.DEFAULT_MEMORY_MARGIN`.

    Returns
    -------
    Path
        ``out_dir/index.html``.

    Raises
    ------
    InputError
        ``out_dir`` a file, non-empty without ``overwrite``, or one the output rule keeps
        (:func:`vtrain_fast.io.outputs.check_output`); an unfinished folder or one without
        a feasible plan; a bad study file.
    """
    from ..io.outputs import check_output
    from ..io.writer import write_folder_atomic
    folder, out = Path(folder), Path(out_dir)
    check_output(out, inputs=(folder, optimal_study), overwrite=overwrite, folder=REPORT_OUTPUT)
    from .query import check_memory_margin, where_filter
    where_filter("command line", list(where))          # bad conditions fail before any work
    check_memory_margin("command line", memory_margin)
    if optimal_study is not None:
        from .optimal import read_config
        read_config(optimal_study)           # a bad study file fails before any work
    write_folder_atomic(out, lambda tmp: _build(folder, tmp, optimal_study, where, memory_margin), "report")
    return out / "index.html"
