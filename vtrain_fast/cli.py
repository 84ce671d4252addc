"""Command line: thin typer commands over the library. Bad input exits with status 2 and one
message naming the file, key or column, the value and what is allowed."""
from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from .io.errors import InputError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Predict LLM training time, memory, cost and energy for millions of plans.")
# Messages (errors, notes, summaries) are never wrapped by rich (soft_wrap): a terminal wraps
# them itself, and a log or a test reads each message as one line whatever the width.
err = Console(stderr=True, emoji=False, soft_wrap=True)
# Tables fit the terminal; when the output is not a terminal (a pipe, a file, CI) they get 160
# columns, or $COLUMNS when set.
console = (Console(emoji=False, soft_wrap=True) if Console().is_terminal or os.environ.get("COLUMNS")
           else Console(width=160, emoji=False, soft_wrap=True))


def _status_line(counts: dict) -> str:
    """``ok 47,628 · out_of_memory 179,604 · ...`` (zero counts left out)."""
    return " · ".join(f"{k} {v:,}" for k, v in counts.items() if v) or "no points"


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}" + ("" if n == 1 else "s")


def _user_errors(func):
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except InputError as e:
            # escape: messages name TOML tables such as "[parallel]", which rich would
            # otherwise swallow as markup tags
            err.print(f"[bold red]error:[/] {escape(str(e))}", markup=True, highlight=False)
            raise typer.Exit(2)
        except Exception as e:
            # the last line of defence: a file operation no check foresaw (each write path
            # converts its own failures) still ends in one message and status 2, not a traceback
            # (an OSError, or Polars' ComputeError "... (os error 28)" on a full disk)
            from .io.errors import is_write_failure, write_failure
            if not is_write_failure(e):
                raise
            where = getattr(e, "filename", None) or "a file"
            err.print(f"[bold red]error:[/] {escape(str(write_failure(where, e, 'file')))}", markup=True,
                      highlight=False)
            raise typer.Exit(2)
    return wrapper


def _calibration(path: Optional[Path]):
    from .plan.spec import load_calibration
    return load_calibration(path) if path else None


CalibrationOpt = typer.Option(None, "--calibration", help="calibration TOML written by `calibrate`")
GpusOpt = typer.Option(None, "--gpus", help="TOML of your own GPUs (\\[gpus.<name>] tables, as in a spec)")


OverwriteOpt = typer.Option(False, "--overwrite", help="replace an existing output file (never an input, "
                            "nor a device or a folder)")


MemoryMarginOpt = typer.Option(None, "--memory-margin", help="leave out plans whose memory headroom is below this "
                               "fraction of the GPU's HBM capacity, e.g. 0.05 (tables mark plans within 5 % "
                               "'tight' when not given)")


def _gpus(path: Optional[Path]):
    from .plan.spec import load_gpus
    return load_gpus(path) if path else None


@app.command()
@_user_errors
def sweep(spec: Path = typer.Argument(..., help="sweep spec (TOML)"),
          output: Optional[Path] = typer.Option(None, "-o", "--output", help="results folder [results/<name>]"),
          overwrite: bool = typer.Option(False, "--overwrite", help="replace an existing result"),
          calibration: Optional[Path] = CalibrationOpt,
          gpus: Optional[Path] = GpusOpt,
          show_pareto: bool = typer.Option(False, "--pareto", help="print the cost/time frontier afterwards"),
          keep: str = typer.Option("all", "--keep",
                                   help="rows to keep: all | feasible | frontier | top:K:COL ('-COL': largest)"),
          minimize: Optional[List[str]] = typer.Option(None, "--minimize",
                                                       help="frontier objective (repeat; '-col' maximises); "
                                                            "default cost_usd and train_days"),
          shard: Optional[str] = typer.Option(None, "--shard",
                                              help="K/N: evaluate only the K-th of N slices (then `merge`)"),
          scheduler: Optional[str] = typer.Option(None, "--scheduler",
                                                  help="Dask scheduler address, or local:N workers"),
          threads: Optional[int] = typer.Option(None, "--threads", min=1, help="kernel threads (default: all cores)"),
          dry_run: bool = typer.Option(False, "--dry-run", help="check the spec, print the points and notes; "
                                                                "evaluate and write nothing")):
    """Evaluate every point of SPEC and write results/<name>/part-*.parquet + manifest.json.

    Rerunning the same command after an interruption resumes it."""
    from .engine.chunks import parse_keep
    from .engine.run import _parse_shard, run_sweep
    from .plan.spec import load_spec
    s = load_spec(spec, _calibration(calibration), _gpus(gpus))
    kept = parse_keep(keep, minimize)   # bad options fail before the progress bar starts
    shard_kn = _parse_shard(shard)
    from .plan.grid import check_index_space
    check_index_space(s.num_points, str(spec))    # the dry run too, not only build_grid
    folder = output or Path("results") / s.name
    from .io.outputs import check_output
    from .io.writer import SWEEP_OUTPUT
    check_output(folder, inputs=(spec, calibration, gpus), overwrite=overwrite, folder=SWEEP_OUTPUT)
    if not overwrite and not dry_run and shard is None and (folder / "manifest.json").is_file():
        from .io.writer import check_manifest, folder_problems, read_json
        try:
            done = read_json(folder / "manifest.json")
            if done.get("complete"):
                check_manifest(done, folder / "manifest.json", final=False)    # result fields: folder_problems
        except (OSError, ValueError):      # the run refuses it with the reason
            done = {}
        from .plan.spec import recorded_spec_problem
        # a finished folder whose files fail their check, or whose manifest disagrees with itself,
        # goes on: the run rebuilds them
        if done.get("complete") and not folder_problems(folder, done) and not recorded_spec_problem(done):
            raise InputError(str(folder), "output folder", str(folder), "a new folder or an unfinished sweep",
                             f"it already holds the finished sweep {done.get('name')!r}: read it with "
                             f"`vtrain-fast pareto {folder}`, pass --overwrite to recompute it, or choose "
                             "another -o")
    n = s.num_points
    where = f" (shard {shard})" if shard else ""
    console.print(f"sweep [bold]{s.name}[/]{where}: {n:,} points, keep {keep} -> {folder}")
    for note in s.notes:
        console.print(f"note: {note}", style="yellow", markup=False)
    jobs = [k for k, n in (("model", len(s.models)), ("num_tokens", len(s.num_tokens))) if n > 1]
    if keep.startswith(("frontier", "top")) and jobs and "loss" not in kept.objectives:
        console.print(f"note: the spec trains several jobs ({', '.join(jobs)} vary) and --keep {keep} keeps one "
                      "set of rows across them, so one job's plans can crowd out the others'; for each job's plans use "
                      "--keep feasible (or all) and `vtrain-fast pareto --by " + " --by ".join(jobs) + "`, or "
                      "one spec per job", style="yellow", markup=False)
    from .plan.spec import spec_caveats
    for note in spec_caveats(s):
        console.print(f"note: {note}", style="yellow", markup=False)
    if kept.mode == "all" and (dry_run or not folder.exists()):
        # a new sweep is refused before any work (a shard writes its slice of the rows); a resumed or
        # overwritten one is checked by the run for the chunks still to do, once old files are gone
        from .engine.run import check_room_for_rows
        check_room_for_rows(folder, -(-n // shard_kn[1]) if shard_kn else n)
    if dry_run:
        console.print(f"dry run: {n:,} points over {_plural(len(s.gpus), 'machine')} "
                      f"({', '.join(s.setting_axes) or 'no setting'} as axes); nothing evaluated or written")
        return
    if scheduler is not None:          # a bad --scheduler fails before the progress bar
        from .engine.distributed import check_scheduler
        check_scheduler(scheduler)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                  console=console, transient=False) as progress:
        task = progress.add_task("points", total=n, rate="")

        def advance(k):
            progress.advance(task, k)
            t = progress.tasks[0]
            if t.elapsed:
                progress.update(task, rate=f"{t.completed / t.elapsed:,.0f} points/s")

        try:
            manifest = run_sweep(s, folder, overwrite=overwrite, on_progress=advance, keep=keep,
                                 minimize=minimize, shard=shard, scheduler=scheduler, threads=threads,
                                 on_note=lambda text: console.print(f"note: {text}", style="yellow", markup=False))
        except KeyboardInterrupt:
            progress.stop()
            err.print(f"interrupted: {folder} is incomplete; rerun the same command to resume "
                      "(finished chunks are kept), or add --overwrite to start over", markup=False)
            raise typer.Exit(130)
    points = sum(c["points"] for c in manifest["chunks"].values())
    console.print(f"kept {manifest['num_rows']:,} rows ({manifest['keep']}) of {points:,} points in "
                  f"{manifest['elapsed_s']:.1f} s ({points / max(manifest['elapsed_s'], 1e-9):,.0f} points/s"
                  f"{', first run includes compiling the kernels' if manifest['elapsed_s'] > 5 else ''}); "
                  f"status: {_status_line(manifest['status_counts'])}"
                  + (f"; pruned without evaluation: {manifest['pruned_points']:,}" if manifest.get('pruned_points') else ""))
    if shard:
        console.print(f"shard {shard} finished; when every shard has, run `vtrain-fast merge {folder}`")
    elif keep.startswith("top"):
        from .analysis.report import print_frame
        from .analysis.query import (CONFIG_COLUMNS, DEFAULT_MEMORY_MARGIN, HEADLINE_COLUMNS, scan_results,
                                     varying_setting_columns, with_memory_headroom)
        from .io.writer import read_manifest
        column = kept.objectives[0]       # the full column name (a short one is resolved)
        metric = column.lstrip("-")
        cols = list(dict.fromkeys(CONFIG_COLUMNS + tuple(varying_setting_columns(folder)) + (metric,)
                                  + HEADLINE_COLUMNS + ("memory_tight",)))
        rows = (with_memory_headroom(scan_results(folder), read_manifest(folder), DEFAULT_MEMORY_MARGIN)
                .select(cols).collect().sort(metric, descending=column.startswith("-"), nulls_last=True))
        print_frame(rows, f"{folder}: the {rows.height} rows kept ({keep})", 20, console, keep=(metric,),
                    margin=DEFAULT_MEMORY_MARGIN)
        if not column.startswith("-") and metric in HIGHER_IS_BETTER:
            console.print(f"note: top:K:{metric} keeps the {metric} values that are smallest; "
                          f"write top:K:-{metric} for the largest")
    elif show_pareto:
        by = []
        if not keep.startswith("frontier"):
            from .analysis.query import varying_job_columns
            by = varying_job_columns(folder)   # one frontier per training job (model, tokens)
        pareto(folder, list(minimize or ["cost_usd", "train_days"]), by, 20, None, None, [], False, None)


# Output columns where a planner usually wants the largest values (``--keep top:K:-COL``).
HIGHER_IS_BETTER = ("mfu", "hfu", "tokens_per_s", "model_tflops_per_gpu")


def shape_params(m) -> float:
    """Parameters of the model shape ``m`` (a :class:`~vtrain_fast.plan.models.ModelShape`) as the
    cost model counts them (:func:`vtrain_fast.model.memory.model_params`, with its architecture flags
    and its heads' ``kv_channels``)."""
    from .model.arch import arch_of
    from .model.memory import model_params
    from .model.moe import kernel_kv_channels
    arch = arch_of(m.arch_values())._replace(kv_channels=float(kernel_kv_channels(m.resolved())))
    return model_params(m.num_layers, m.hidden_size, m.num_attention_heads, m.num_query_groups, m.ffn_hidden_size,
                        m.vocab_size, m.seq_length, arch)


def shape_flags(m) -> str:
    """The architecture flags of shape ``m`` that differ from Megatron-LM's defaults, as a shape
    name spells them (``swiglu rmsnorm rope nobias untied``); ``gpt`` when none do."""
    from .model.arch import ARCH_FLAGS
    words = [fl.suffix or str(getattr(m, fl.name)).lower() for fl in ARCH_FLAGS if getattr(m, fl.name) != fl.default]
    return " ".join(words) or "gpt"


def shape_experts(m) -> str:
    """The experts of shape ``m``: ``"MoE 256 top-8 +shared, 3 dense"`` (routed experts, top-k, shared
    experts, dense layers), ``"MLA"`` appended for multi-head latent attention; ``"dense"``."""
    from .model.moe import is_moe, moe_layer_pattern
    if not is_moe(m):
        return "dense" + (" MLA" if m.multi_latent_attention else "")
    dense = m.num_layers - sum(moe_layer_pattern(m.num_layers, m.moe_layer_freq))
    return " ".join(["MoE", f"{m.num_experts}", f"top-{m.moe_router_topk}"]
                    + (["+shared"] if m.moe_shared_expert_intermediate_size else [])
                    + ([f"{dense}-dense"] if dense else []) + (["MLA"] if m.multi_latent_attention else []))


@app.command()
@_user_errors
def presets(gpus_file: Optional[Path] = GpusOpt):
    """List the model and GPU presets a spec or CSV can name, with their numbers (and the GPUs
    of a --gpus file, marked by where they come from)."""
    import polars as pl

    from .hardware.gpus import PRESETS, intra_node_link_label
    from .plan.models import MODEL_PRESETS
    from .analysis.report import print_frame
    from .model.moe import param_counts
    counts = {m.name: param_counts(m) for m in MODEL_PRESETS.values()}
    models = pl.DataFrame([dict(model=m.name, num_layers=m.num_layers, hidden_size=m.hidden_size,
                                num_attention_heads=m.num_attention_heads, num_query_groups=m.num_query_groups,
                                ffn_hidden_size=m.ffn_hidden_size, seq_length=m.seq_length,
                                vocab_size=m.vocab_size,
                                arch=shape_flags(m), experts=shape_experts(m),
                                active_billion=round(counts[m.name].active / 1e9, 2),
                                params_billion=round(counts[m.name].total / 1e9, 2))
                           for m in MODEL_PRESETS.values()])
    print_frame(models, "Model presets (spec: \\[model] presets = ...; sources in vtrain_fast/data/models.toml; "
                "experts: the MoE layout (priced, multi-head latent attention included: README, Mixture of "
                "experts); active_billion: parameters per token, the word embedding included)", console=console, keep=("model",))
    gpus = pl.DataFrame([dict(gpu=g.name, bf16_TFLOPs=g.peak_tflops, fp8_TFLOPs=g.peak_fp8_tflops or None,
                              hbm_GiB=g.hbm_GiB, hbm_GBps=g.hbm_GBps,
                              link=intra_node_link_label(g), intra_node_GBps=g.intra_node_GBps,
                              inter_node_Gbps=g.inter_node_Gbps,
                              gpus_per_node=g.gpus_per_node, tdp_W=g.tdp_W, usd_per_gpu_hour=g.usd_per_gpu_hour,
                              pue=g.pue, reserved_GiB=g.reserved_GiB, calibrated=g.calibrated,
                              **({"from": "preset" if PRESETS.get(g.name) is g else str(gpus_file)} if gpus_file else {}))
                         for g in (_gpus(gpus_file) or PRESETS).values()])
    print_frame(gpus, "GPU presets (spec: \\[cluster] gpu = ...; one file each, with the source and date of every "
                "number, in vtrain_fast/data/gpus/; \\[cluster] keys or a \\[gpus.<name>] table change them; "
                "link: what joins a node's GPUs, host: PCIe without peer-to-peer)",
                console=console, keep=("gpu",))


def _emit_text(text: str, output: Optional[Path], what: str, overwrite: bool, executable: bool = False) -> bool:
    """Print ``text`` (no ``output``: False) or write it to ``output`` atomically, replacing an
    existing file only with ``overwrite`` (True); ``executable``: a script (execute bits where read is)."""
    from .io.errors import write_atomically
    if output is None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return False

    def write(tmp):
        Path(tmp).write_text(text, encoding="utf-8")
        if executable:          # as chmod +x: execute where read is allowed
            mode = os.stat(tmp).st_mode
            os.chmod(tmp, mode | (mode & 0o444) >> 2)
    write_atomically(output, write, what, replace=overwrite)
    return True


@app.command("import-hf")
@_user_errors
def import_hf(config: Path = typer.Argument(..., help="Hugging Face config.json"),
              output: Optional[Path] = typer.Option(None, "-o", "--output",
                                                    help="model file to write (TOML); default: print it"),
              name: Optional[str] = typer.Option(None, "--name",
                                                 help="model name; default: from _name_or_path or the file name"),
              seq_length: Optional[int] = typer.Option(None, "--seq-length",
                                                       help="training context length; default: max_position_embeddings"),
              overwrite: bool = typer.Option(False, "--overwrite", help="replace an existing -o file")):
    """Write a model file (one \\[models.<name>] table) from a Hugging Face config.json: Llama, Mistral,
    Qwen2/3, Gemma, GPT-2, GPT-NeoX; mixture of experts: Mixtral, Qwen3-MoE, gpt-oss and DeepSeek-V3
    (with its multi-head latent attention). What the cost model cannot express is refused; what it prices
    differently is noted (stderr, and comments in the file). A spec reads the file with
    model_files = ["FILE.toml"]."""
    from .io.outputs import check_output
    from .plan.hf import check_seq_length, model_file_text, model_name, read_config, shape_from_config
    from .plan.models import models_from_tables
    check_seq_length(seq_length)
    if output is not None:            # before any work, as every command with -o
        check_output(output, inputs=(config,), overwrite=overwrite)
    cfg = read_config(config)
    table, notes = shape_from_config(cfg, str(config), seq_length)
    name = model_name(cfg, config, name)
    shape = models_from_tables({name: table}, str(config))[name]     # as a spec will read it
    text = model_file_text(name, table, notes, config)
    for note in notes:
        err.print(f"note: {note}", style="yellow", markup=False, highlight=False)
    from .model.moe import is_moe, param_counts
    counts = param_counts(shape)
    active = f", {counts.active / 1e9:.3f} B active per token" if is_moe(shape) else ""
    err.print(f"{name}: {counts.total / 1e9:.3f} B parameters{active} as the cost model counts them ("
              + ", ".join(f"{k} = {str(v).lower() if isinstance(v, bool) else v}" for k, v in table.items()
                          if k != "source") + ")",
              markup=False, highlight=False)
    if not _emit_text(text, output, "model file", overwrite):
        return
    err.print(f"wrote {output}: use it in a spec with model_files = [\"{output}\"] (relative to the spec) and "
              f"model.presets = [\"{name}\"]", markup=False, highlight=False)


@app.command()
@_user_errors
def merge(folder: Path = typer.Argument(..., help="results folder of a sweep run with --shard K/N")):
    """Check that every shard of a sharded sweep finished and combine them into one result."""
    from .engine.run import merge_shards
    manifest = merge_shards(folder)
    console.print(f"merged {manifest['shards']} shards of [bold]{manifest['name']}[/]: "
                  f"{manifest['num_rows']:,} rows ({manifest['keep']}) in {len(manifest['parts'])} part files; "
                  f"status: {_status_line(manifest['status_counts'])}")


@app.command()
@_user_errors
def pareto(folder: Path = typer.Argument(..., help="results folder"),
           minimize: List[str] = typer.Option(["cost_usd", "train_days"], "--minimize",
                                              help="objective column (repeat; '-col' maximises)"),
           by: List[str] = typer.Option([], "--by", help="one frontier per value of this input column (repeat), e.g. model"),
           top: int = typer.Option(20, "--top", help="rows to print (per group with --by)"),
           output: Optional[Path] = typer.Option(None, "-o", "--output",
                                                 help="write the frontier plans, every column, to .parquet or .csv"),
           plot: Optional[Path] = typer.Option(None, "--plot",
                                               help="PNG of the first two objectives: feasible plans and frontier"),
           where: List[str] = typer.Option([], "--where",
                                           help="only plans meeting COLUMN OP VALUE (repeat), e.g. "
                                                "'memory_per_gpu_GiB<=72', 'train_days<=90', 'gpu==h100-sxm-80gb'"),
           breakdown: bool = typer.Option(False, "--breakdown",
                                          help="also show where each plan's iteration time goes (compute, TP, "
                                               "pipeline, data-parallel communication, bubble, optimizer)"),
           memory_margin: Optional[float] = MemoryMarginOpt,
           overwrite: bool = OverwriteOpt):
    """Print the Pareto frontier of the feasible rows of a results folder."""
    from .analysis.evaluate import check_table_path, write_table_atomic
    from .analysis.query import frontier_columns, pareto as pareto_frontier, resolve_groups, where_filter
    from .io.schema import resolve_objectives
    from .analysis.report import check_plot_path, print_frame
    minimize = resolve_objectives("command line", minimize)
    by = resolve_groups("command line", by)
    where_filter("command line", where)     # malformed conditions fail before any work
    from .analysis.query import DEFAULT_MEMORY_MARGIN, check_memory_margin
    check_memory_margin("command line", memory_margin)
    if not 1 <= top <= 10**9:
        raise InputError("command line", "--top", top, "a whole number from 1 to 1,000,000,000",
                         "rows to print (per group with --by), e.g. --top 20; write every row with -o FILE.parquet")
    from .io.outputs import check_output
    if output:
        check_table_path(output)
        check_output(output, inputs=(folder,), overwrite=overwrite)
    if plot:
        if len(minimize) < 2:
            raise InputError("command line", "--plot", str(plot), "two or more --minimize objectives",
                             "the plot puts the first on x and the second on y")
        check_plot_path(plot)
        check_output(plot, "--plot", inputs=(folder,), overwrite=overwrite)
    front = pareto_frontier(folder, list(minimize), list(by), all_columns=output is not None, where=list(where),
                            breakdown=breakdown, memory_margin=memory_margin)
    if output and front.height:
        write_table_atomic(front, output, replace=overwrite)
        front = front.select(frontier_columns(folder, list(by), [m.lstrip("-") for m in minimize], list(where),
                                              breakdown))
    title = (f"Pareto frontier of {folder} ({_plural(front.height, 'plan')}; minimise {', '.join(minimize)}"
             + (f"; per {', '.join(by)}" if by else "") + (f"; where {' and '.join(where)}" if where else "")
             + (f"; memory headroom >= {memory_margin:.0%} of the GPU's" if memory_margin else "") + ")")
    if front.height == 0:
        console.print(f"{folder}: no feasible plan (status ok{', meeting --where' if where else ''}) to rank; see "
                      "the status counts in its manifest.json: try larger tp/pp, recompute = full or more GPUs"
                      + (", or loosen --where" if where else "") + (", or a smaller --memory-margin" if memory_margin else "")
                      + (f"; {output} not written" if output else ""))
        return
    from .io.writer import read_manifest
    if not read_manifest(folder).get("keep", "all").startswith("frontier"):
        from .analysis.query import varying_job_columns
        mixed = [c for c in varying_job_columns(folder, list(where)) if c not in by]
        if mixed:
            console.print(f"note: the rows train different jobs ({', '.join(mixed)} vary), so shorter or smaller "
                          f"runs dominate this frontier; add {' '.join('--by ' + c for c in mixed)} for one "
                          "frontier per job", style="yellow", markup=False)
    shown = front
    if by:
        # --top rows of each group (the frontier is sorted by the groups, then the objective)
        shown = front.group_by(by, maintain_order=True).head(top)
        if shown.height < front.height:
            title += f"; first {top} of each group"
        top = shown.height
    from .analysis.query import BREAKDOWN_COLUMNS
    print_frame(shown, title, top, console, whole=front, keep=tuple(by) + tuple(m.lstrip("-") for m in minimize)
                + (BREAKDOWN_COLUMNS if breakdown else ()),
                margin=DEFAULT_MEMORY_MARGIN if memory_margin is None else memory_margin)
    if shown.height < front.height:
        console.print(f"({front.height - shown.height:,} more frontier rows not shown; raise --top or "
                      "write them all with -o FILE.parquet)")
    if output:
        console.print(f"wrote {output} (every column of the {_plural(front.height, 'frontier plan')})")
        own = _own_gpus(folder)
        if own:
            console.print(f"note: this sweep defined or changed GPUs ({', '.join(own)}: [gpus] tables or --gpus); "
                          f"`vtrain-fast evaluate {output}` prices them as this sweep did only with --gpus FILE "
                          "holding those tables, otherwise with the presets", style="yellow", markup=False)
    if plot:
        from .analysis.query import feasible_sample
        from .analysis.report import plot_frontier
        x, y = (m.lstrip("-") for m in minimize[:2])
        colour = list(by) or ["gpu"]
        plot_frontier(front, feasible_sample(folder, list(dict.fromkeys([x, y] + colour)), where=list(where)), x, y,
                      tuple(by), plot, title_of=str(folder))
        console.print(f"plot: {plot}")


@app.command()
@_user_errors
def report(folder: Path = typer.Argument(..., help="results folder"),
           output: Path = typer.Option(..., "-o", "--output-dir", help="folder of the report (index.html and its PNGs)"),
           optimal_study: Optional[Path] = typer.Option(None, "--optimal", help="study file with an \\[optimal] table "
                                                        "(as `optimal --config`): adds the compute-optimal curve"),
           where: List[str] = typer.Option([], "--where", help="only plans meeting COLUMN OP VALUE (repeat), e.g. "
                                                                 "'gpu==h100-sxm-80gb'"),
           memory_margin: Optional[float] = typer.Option(None, "--memory-margin", help="leave out plans whose memory "
                                                         "headroom is below this fraction of the GPU's HBM"),
           overwrite: bool = typer.Option(False, "--overwrite", help="replace an -o folder an earlier report wrote "
                                          "(never an input, a results folder or a folder of other files)")):
    """Write one self-contained HTML page of a results folder: the Pareto frontier, an MFU heatmap
    over tp x pp, the time breakdown of the top frontier plans, the compute-optimal curve
    (--optimal) and the key tables (see README, Reports)."""
    from .analysis.html_report import write_report
    page = write_report(folder, output, optimal_study, overwrite=overwrite, where=where, memory_margin=memory_margin)
    console.print(f"wrote {page} (images inline; the PNGs next to it)", markup=False, highlight=False)


@app.command()
@_user_errors
def plan(folder: Path = typer.Argument(..., help="results folder (every row or every feasible row kept)"),
         deadline_days: float = typer.Option(..., "--deadline-days", help="longest training time, days"),
         max_gpus: Optional[int] = typer.Option(None, "--max-gpus", help="most GPUs a plan may use [any searched]"),
         memory_margin: Optional[float] = typer.Option(None, "--memory-margin", help="leave out plans whose memory "
                                                       "headroom is below this fraction of the GPU's HBM, e.g. 0.05"),
         runners_up: int = typer.Option(6, "--runners-up", min=0, help="other plan families listed per job"),
         where: List[str] = typer.Option([], "--where", help="only plans meeting COLUMN OP VALUE (repeat), e.g. "
                                                               "'gpu==h100-sxm-80gb', 'tp<=4'"),
         output: Optional[Path] = typer.Option(None, "-o", "--output", help="write the chosen plans and runners-up, "
                                               "every column, to .parquet or .csv (only when every job has a plan)"),
         overwrite: bool = OverwriteOpt):
    """The cheapest plan of each training job (model, token budget) that trains within the deadline,
    and why the best plans of other families (GPU, tp, pp) lose. Exits 2 when no plan meets it."""
    from .analysis.evaluate import check_table_path, write_table_atomic
    from .analysis.plan import REASON_COLUMNS, plan_text, plan_to_deadline
    from .analysis.query import CONFIG_COLUMNS, DEFAULT_MEMORY_MARGIN, varying_setting_columns
    from .analysis.report import print_frame
    from .io.outputs import check_output
    if output:
        check_table_path(output)
        check_output(output, inputs=(folder,), overwrite=overwrite)
    res = plan_to_deadline(folder, deadline_days, max_gpus, memory_margin, runners_up, where)
    # all or nothing: the table is written only when every job has a plan (else the command fails)
    written = bool(output) and res.table.height > 0 and not res.unmet
    if written:
        write_table_atomic(res.table, output, replace=overwrite)
    if res.table.height:
        jobs = [c for c in ("model", "num_tokens") if c in res.table.columns]
        cols = list(dict.fromkeys(["choice", "reason"] + [c for c in CONFIG_COLUMNS if c not in jobs]
                                  + varying_setting_columns(folder)
                                  + ["train_days", "cost_usd", "mfu", "memory_per_gpu_GiB",
                                     "memory_headroom_GiB", "memory_tight"]))
        limits = (f"<= {deadline_days:g} days" + (f", <= {max_gpus:,} GPUs" if max_gpus is not None else "")
                  + "".join(f", {w}" for w in where)
                  + (f", >= {memory_margin:.0%} of HBM free" if memory_margin else ""))
        for _, rows in res.table.group_by(jobs, maintain_order=True):
            best = rows.row(0, named=True)
            job = ", ".join(f"{c} {best[c]:.3g}" if isinstance(best[c], float) else f"{c} {best[c]}" for c in jobs)
            console.print(f"[bold]{escape(job)}[/]: {escape(plan_text(best))}: {best['train_days']:.1f} days, "
                          f"${best['cost_usd']:,.0f}, MFU {best['mfu']:.1%}", highlight=False)
            print_frame(rows.select([c for c in cols if c in rows.columns]),
                        f"{folder}: cheapest plan ({limits}) and the runners-up", None, console,
                        keep=("cost_usd", "train_days"),
                        margin=DEFAULT_MEMORY_MARGIN if memory_margin is None else memory_margin)
        if written:
            console.print(f"wrote {output} ({_plural(res.table.height, 'plan')}, every column and "
                          f"{', '.join(REASON_COLUMNS)})")
    if output and not written:
        console.print(f"{output} not written (no plan meets the constraints"
                      + (" for every job" if res.table.height else "") + ")")
    if res.unmet:
        raise InputError(str(folder), "--deadline-days", deadline_days,
                         "a deadline that a plan of every job meets"
                         + (f" within --max-gpus {max_gpus}" if max_gpus is not None else "")
                         + (f" and --memory-margin {memory_margin:g}" if memory_margin else ""),
                         " | ".join(u["message"] for u in res.unmet))


def _own_gpus(folder: Path) -> list[str]:
    """GPUs of a finished sweep that are not the shipped presets as they are: the spec's
    ``[gpus]`` tables and names no preset has (``--gpus``)."""
    import tomllib

    from .hardware.gpus import PRESETS
    from .io.writer import read_manifest
    manifest = read_manifest(folder)
    try:
        tables = tomllib.loads(manifest.get("spec") or "").get("gpus") or {}
    except tomllib.TOMLDecodeError:
        tables = {}
    names = list(tables) if isinstance(tables, dict) else []
    return sorted(set(names) | {g for g in manifest.get("gpus") or {} if g not in PRESETS})


@app.command()
@_user_errors
def evaluate(csv: Path = typer.Argument(..., help="configurations, one per row"),
             output: Path = typer.Option(..., "-o", "--output", help="output file, .parquet or .csv"),
             calibration: Optional[Path] = CalibrationOpt,
             gpus: Optional[Path] = GpusOpt,
             breakdown: bool = typer.Option(False, "--breakdown",
                                            help="also show where each plan's iteration time goes"),
             models: Optional[List[Path]] = typer.Option(None, "--models",
                                                         help="model file (repeat): \\[models.<name>] tables the "
                                                              "model column may name, e.g. written by import-hf"),
             overwrite: bool = OverwriteOpt):
    """Evaluate explicit configurations from a CSV or Parquet file."""
    from .analysis.evaluate import (check_table_path, evaluate_frame, read_csv, without_earlier_results,
                                    write_table_atomic)
    from .analysis.report import print_frame
    from .io.schema import OUTPUT_NAMES
    from .plan.spec import load_models
    from .io.outputs import check_output
    check_table_path(output)
    check_output(output, inputs=(csv, calibration, gpus, *(models or ())), overwrite=overwrite)
    own_models = load_models(models) if models else None      # a bad model file fails before the CSV is read
    # a file of earlier results (every output column, e.g. `pareto -o plans.csv`): its outputs are recomputed
    plans, old_outputs = without_earlier_results(read_csv(csv))
    df = evaluate_frame(plans, str(csv), _calibration(calibration), _gpus(gpus), own_models)
    if old_outputs:         # (a table refused says why, without this note)
        console.print(f"note: {csv} holds earlier results ({_plural(len(old_outputs), 'result column')}, e.g. "
                      f"{old_outputs[0]}); they are recomputed, not read, with its cluster columns (pareto -o writes "
                      "the sweep's) and the calibration given here (--calibration: a sweep's calibration file is not "
                      "in the file)", style="yellow", markup=False)
    write_table_atomic(df, output, replace=overwrite)
    counts = dict(df["status"].value_counts().sort("status").rows())
    from .analysis.query import BREAKDOWN_COLUMNS, HEADLINE_COLUMNS
    from .io.schema import COLUMNS, SETTING_COLUMNS
    known = {c.name for c in COLUMNS} | set(OUTPUT_NAMES)
    labels = [c for c in df.columns if c not in known]           # the CSV's own columns, e.g. a name
    settings = [c for c in SETTING_COLUMNS if c in df.columns and df[c].n_unique() > 1]
    layout = ("tp", "cp", "pp", "dp") if "cp" in df.columns and (df["cp"] > 1).any() else ("tp", "pp", "dp")
    shown = labels + [c for c in ("model", "gpu", "num_layers", "hidden_size", *layout, "micro_batch_size",
                                  "global_batch_size", "recompute") if c in df.columns] + settings + [
        c for c in ("status",) + HEADLINE_COLUMNS + (BREAKDOWN_COLUMNS if breakdown else ()) if c in df.columns]
    print_frame(df.select(shown), f"{csv} ({_plural(df.height, 'configuration')})", 20, console,
                keep=("iteration_time_s",) + (BREAKDOWN_COLUMNS if breakdown else ()),
                more_hint=f"every row is in {output}")
    console.print(f"wrote {_plural(df.height, 'row')} to {output}; status: {_status_line(counts)}")


@app.command()
@_user_errors
def export(plan: Path = typer.Argument(..., help="results folder, or a .csv / .parquet table of plans "
                                                  "(evaluate's columns)"),
           to: str = typer.Option("megatron", "--to", help="megatron: Megatron-LM pretrain_gpt.py flags; bridge: "
                                                            "Megatron-Bridge / NeMo 2 ConfigContainer overrides; "
                                                            "torchtitan: a torchtitan recipe module (-o NAME.py, run "
                                                            "with torchrun -m torchtitan.train --module NAME)"),
           where: List[str] = typer.Option([], "--where", help="only plans meeting COLUMN OP VALUE (repeat; a results "
                                                                 "folder), e.g. 'num_gpus==1024', 'tp==8'"),
           row: Optional[int] = typer.Option(None, "--row", help="which of several plans, in order of cost_usd "
                                                                 "(0: the cheapest)"),
           output: Optional[Path] = typer.Option(None, "-o", "--output", help="write the launch script (torchtitan: "
                                                                               "the recipe module, NAME.py) here "
                                                                               "(default: print it)"),
           models: Optional[List[Path]] = typer.Option(None, "--models", help="model file (repeat) a table's "
                                                                                "model column may name"),
           gpus: Optional[Path] = GpusOpt,
           overwrite: bool = typer.Option(False, "--overwrite", help="replace an existing -o file")):
    """Write the launch arguments that run one plan: Megatron-LM's pretrain_gpt.py flags, named as
    Megatron-LM names them (checked against its parser's flags at the commit the script names),
    Megatron-Bridge / NeMo 2 ConfigContainer overrides (--to bridge), or a torchtitan recipe module
    whose function returns the plan's Trainer.Config (--to torchtitan; plans torchtitan cannot run as
    priced are refused, naming the setting to change)."""
    from .analysis.export import TORCHTITAN_FUNCTION, TORCHTITAN_MODULE
    from .analysis.export import export as export_plan
    from .io.outputs import check_output
    from .plan.spec import load_models
    module = TORCHTITAN_MODULE
    if output is not None:            # before any work, as every command with -o
        check_output(output, inputs=(plan, gpus, *(models or ())), overwrite=overwrite)
        if to == "torchtitan":        # torchtitan imports the file by its name (--module)
            from .analysis.export import recipe_module_problem
            problem = recipe_module_problem(output.name)
            if problem:
                stem = ''.join(c if c.isascii() and c.isalnum() else '_' for c in output.stem)
                raise InputError(str(output), "output file", str(output), "NAME.py, NAME a Python module name "
                                 "(letters, digits, _) that imports as itself: torchtitan imports the recipe with "
                                 f"--module NAME", f"{problem}; e.g. -o {output.with_name('plan_' + stem + '.py')}")
            module = output.stem
    own_models = load_models(models) if models else None
    result = export_plan(plan, to, where, row, own_models, module=module, gpus=_gpus(gpus))
    text = result.text()
    if not _emit_text(text, output, "launch script" if to != "torchtitan" else "recipe module", overwrite,
                      executable=to == "megatron"):
        return
    if to == "torchtitan":
        recipe = result.args[0].split("= ", 1)[1].split("(", 1)[0]         # config = llama3_70b()
        err.print(f"wrote {output}: torchtitan recipe {module}.{TORCHTITAN_FUNCTION}() from {recipe}(), "
                  f"{sum(1 for a in result.args if a.startswith('config.'))} settings; run: {result.launcher}",
                  markup=False, highlight=False)
        return
    what = (f"{len([a for a in result.args if a.startswith('--')])} Megatron-LM flags" if to == "megatron"
            else f"{len(result.args)} Megatron-Bridge overrides")
    err.print(f"wrote {output}: {what}; add your data, tokenizer, optimizer and checkpoint settings",
              markup=False, highlight=False)


@app.command()
@_user_errors
def show(plan: Path = typer.Argument(..., help="results folder, or a .csv / .parquet table of plans "
                                                "(evaluate's columns)"),
         where: List[str] = typer.Option([], "--where", help="only plans meeting COLUMN OP VALUE (repeat; a results "
                                                               "folder), e.g. 'num_gpus==1024', 'tp==8'"),
         row: Optional[int] = typer.Option(None, "--row", help="which of several plans, in order of cost_usd "
                                                               "(0: the cheapest)"),
         models: Optional[List[Path]] = typer.Option(None, "--models", help="model file (repeat) a table's "
                                                                              "model column may name"),
         gpus: Optional[Path] = GpusOpt,
         timeline: Optional[Path] = typer.Option(None, "--timeline", help="write the timeline of one iteration "
                                                                          "per pipeline stage here (.png)"),
         output: Optional[Path] = typer.Option(None, "-o", "--output", help="write the memory table (stages x "
                                                                             "parts, GiB) here, .parquet or .csv"),
         events: Optional[Path] = typer.Option(None, "--events", help="write the timeline's events here, "
                                                                       ".parquet or .csv"),
         overwrite: bool = OverwriteOpt):
    """One plan part by part: the iteration time broken down, each pipeline stage's seconds per
    micro-batch, memory per stage broken down, and (--timeline) one iteration's schedule per stage."""
    from rich.table import Table
    from .analysis.evaluate import check_table_path, write_table_atomic
    from .analysis.export import plan_gpus, printable, read_plan
    from .analysis.show import HOST_PARTS, MEMORY_PARTS, TIME_PARTS, plot_timeline, show_plan
    from .io.errors import InputError, write_atomically
    from .io.outputs import check_output
    from .plan.spec import load_models
    for path, option in ((output, "-o"), (events, "--events")):
        if path is not None:
            check_table_path(path, option)
            check_output(path, option, inputs=(plan, gpus, *(models or ())), overwrite=overwrite)
    if timeline is not None:
        if timeline.suffix.lower() != ".png":
            raise InputError(str(timeline), "--timeline", timeline.name, "a .png file name",
                             "name the timeline file with .png")
        check_output(timeline, "--timeline", inputs=(plan, gpus, *(models or ())), overwrite=overwrite)
    own_models = load_models(models) if models else None
    known = plan_gpus(plan, _gpus(gpus))
    chosen, _, notes = read_plan(plan, where, row, own_models, known)
    for note in notes:
        console.print(f"note: {printable(note)}", style="yellow", markup=False)
    detail = show_plan(chosen, known, timeline=True if timeline is not None or events is not None else None)
    console.print(f"[bold]{escape(detail.title())}[/]")
    tt = Table(title="iteration time (s)")
    tt.add_column("part")
    tt.add_column("seconds", justify="right")
    tt.add_column("share", justify="right")
    it = detail.time_s["iteration_time_s"]
    for name in TIME_PARTS:
        if detail.time_s[name] != 0.0:
            tt.add_row(name, f"{detail.time_s[name]:.4f}", f"{detail.time_s[name] / it:.1%}")
    tt.add_row("[bold]iteration_time_s[/]", f"[bold]{it:.4f}[/]", "100%")
    console.print(tt)
    st = Table(title="per micro-batch and stage (s; forward, recompute, backward split in one layer's proportion)")
    for c in ("stage", "layers", "micro_batch_s", "forward_s", "recompute_s", "backward_s", "send_s", "in_flight"):
        st.add_column(c, justify="right")
    for r in detail.stages.iter_rows(named=True):
        st.add_row(str(r["stage"]), str(r["layers"]), *(f"{r[c]:.4f}" for c in ("micro_batch_s", "forward_s",
                   "recompute_s", "backward_s", "send_s")), f"{r['in_flight']:g}")
    console.print(st)
    mt = Table(title="memory per GPU by pipeline stage (GiB)")
    mt.add_column("stage", justify="right")
    shown = [c for c in MEMORY_PARTS if detail.memory[c].abs().max() > 0.0]
    for c in shown + ["total_GiB"]:
        mt.add_column(c.removesuffix("_GiB"), justify="right")
    fullest = int(detail.memory["total_GiB"].arg_max())
    for r in detail.memory.iter_rows(named=True):
        cells = [f"{r[c]:.2f}" for c in shown + ["total_GiB"]]
        if r["stage"] == fullest:
            cells[-1] = f"[bold]{cells[-1]}[/]"
        mt.add_row(str(r["stage"]), *cells)
    console.print(mt)
    for c in HOST_PARTS:        # offloading: what lives in host memory instead (not in the total)
        if detail.memory[c].max() > 0.0:
            console.print(f"in host memory, {c.removesuffix('_GiB')}: "
                          + ", ".join(f"stage {r['stage']} {r[c]:.2f} GiB" for r in detail.memory.iter_rows(named=True)),
                          highlight=False, markup=False)
    from .analysis.show import MAX_TIMELINE_OPS
    simulated = (f"{detail.simulated_pipeline_s:.4f} s in the event timeline" if detail.events.height else
                 f"no event timeline ({detail.timeline_ops:,} operations, over the {MAX_TIMELINE_OPS:,} simulated)")
    console.print(f"pipeline: {detail.pipeline_s:.4f} s in the model ((m - 1) x slowest + sum of stages, fill "
                  f"and drain / vpp), {simulated}; memory_per_gpu_GiB "
                  f"{detail.kernel['memory_per_gpu_GiB']:.2f} (stage {fullest})", highlight=False)
    if output is not None:
        write_table_atomic(detail.memory, output, replace=overwrite)
        err.print(f"wrote {output}: the memory table, {detail.memory.height} stages x {len(MEMORY_PARTS)} parts (GiB)",
                  markup=False, highlight=False)
    if events is not None:
        write_table_atomic(detail.events, events, replace=overwrite)
        err.print(f"wrote {events}: {detail.events.height:,} timeline events", markup=False,
                  highlight=False)
    if timeline is not None:
        write_atomically(timeline, lambda tmp: plot_timeline(detail, tmp), "timeline", replace=overwrite)
        err.print(f"wrote {timeline}: the timeline of one iteration", markup=False, highlight=False)


@app.command()
@_user_errors
def optimal(ctx: typer.Context,
            budget_usd: Optional[float] = typer.Option(None, "--budget-usd", help="budget in US dollars "
                                                       "(priced at the GPU preset's usd_per_gpu_hour)"),
            gpu_hours: Optional[float] = typer.Option(None, "--gpu-hours", help="budget in GPU-hours"),
            gpus: Optional[int] = typer.Option(None, "--gpus", help="GPUs available (with --days); a plan uses "
                                                                   "at most this many"),
            days: Optional[float] = typer.Option(None, "--days", help="days of training on --gpus"),
            gpu: str = typer.Option("a100-sxm4-80gb", "--gpu", help="GPU preset (vtrain-fast presets)"),
            fit: str = typer.Option("epoch", "--fit", help="loss fit: epoch (Besiroglu et al. 2024) or "
                                                          "hoffmann (Hoffmann et al. 2022)"),
            min_params: float = typer.Option(1e8, "--min-params", help="smallest model searched, parameters"),
            max_params: float = typer.Option(1e12, "--max-params", help="largest model searched, parameters"),
            num_sizes: int = typer.Option(40, "--num-sizes", help="model sizes searched (log-spaced)"),
            seq_length: int = typer.Option(2048, "--seq-length", help="tokens per sequence"),
            aspect_ratio: float = typer.Option(128.0, "--aspect-ratio", help="target hidden_size / num_layers"),
            batch_tokens: int = typer.Option(4 * 1024 * 1024, "--batch-tokens", help="tokens per global batch"),
            max_gpus: int = typer.Option(16384, "--max-gpus", help="largest cluster searched (--budget-usd, "
                                                                  "--gpu-hours)"),
            max_days: float = typer.Option(90.0, "--max-days", help="longest run (--budget-usd, --gpu-hours)"),
            max_pp: int = typer.Option(64, "--max-pp", help="largest pipeline-parallel size searched"),
            settings: Optional[List[str]] = typer.Option(None, "--set", help="KEY=VALUE: a [training] setting "
                                                         "of a sweep spec for every plan (repeat), e.g. "
                                                         "use_flash_attn=false"),
            inference_tokens: Optional[float] = typer.Option(None, "--inference-tokens", help="inference-aware "
                                                             "sizing (Sardana et al. 2024): tokens the model will "
                                                             "serve, paid from --budget-usd / --gpu-hours"),
            inference_mfu: Optional[float] = typer.Option(None, "--inference-mfu", help="serving GPUs' "
                                                          "utilisation of the bf16 peak (an assumption) [0.3]"),
            memory_margin: Optional[float] = typer.Option(None, "--memory-margin", help="leave out plans whose "
                                                          "memory headroom is below this fraction of the GPU's HBM"),
            output: Optional[Path] = typer.Option(None, "-o", "--output", help="per-shape curve, .parquet or .csv"),
            calibration: Optional[Path] = CalibrationOpt,
            gpus_file: Optional[Path] = typer.Option(None, "--gpus-file", help="TOML of your own GPUs "
                                                     "(\\[gpus.<name>] tables, as `--gpus` of sweep)"),
            config: Optional[Path] = typer.Option(None, "--config", help="a study file: its \\[optimal] table "
                                                  "gives these options by name (budget_usd, gpus, days, gpu, "
                                                  "fit, ..., settings); options given here override it"),
            overwrite: bool = OverwriteOpt):
    """The model size, tokens, plan and cluster of lowest predicted loss within a budget, next to
    the naive answer at 100 % utilisation (dense GPT shapes; see README, Compute-optimal sizing)."""
    from .analysis.evaluate import check_table_path, write_table_atomic
    from .analysis.optimal import optimal as find, parse_setting, read_config
    from .analysis.report import optimal_table
    if output is not None:
        from .io.outputs import check_output
        check_table_path(output)
        check_output(output, inputs=(calibration, gpus_file, config), overwrite=overwrite)
    given = dict(budget_usd=budget_usd, gpu_hours=gpu_hours, gpus=gpus, days=days, gpu=gpu, fit=fit,
                 min_params=min_params, max_params=max_params, num_sizes=num_sizes, seq_length=seq_length,
                 aspect_ratio=aspect_ratio, batch_tokens=batch_tokens, max_gpus=max_gpus, max_days=max_days,
                 max_pp=max_pp, inference_tokens=inference_tokens, memory_margin=memory_margin)
    if inference_mfu is not None:
        given["inference_mfu"] = inference_mfu
    args = dict(given, settings=dict(parse_setting(t) for t in settings or ()))
    from_file: dict = {}         # option -> the study file's key it came from
    if config is not None:       # the file's values, less those the command line gives
        def typed(k):            # (typer's own click: compare the source by name)
            src = ctx.get_parameter_source(k)
            return src is not None and src.name == "COMMANDLINE"
        study = read_config(config)
        budget_keys = ("budget_usd", "gpu_hours", "gpus", "days")
        budget_typed = any(typed(k) for k in budget_keys)        # a budget typed replaces the file's
        args.update({k: v for k, v in study.items() if k != "settings" and not typed(k)
                     and not (budget_typed and k in budget_keys)})
        from_file = {"--" + k.replace("_", "-"): f"optimal.{k}" for k in study if k != "settings" and not typed(k)
                     and not (budget_typed and k in budget_keys)}
        from_file.update({f"--set {k}": f"optimal.settings.{k}" for k in study.get("settings", {})
                          if k not in args["settings"]})
        args["settings"] = {**study.get("settings", {}), **args["settings"]}
    try:
        res = find(**args, calibration=_calibration(calibration), gpu_presets=_gpus(gpus_file))
    except InputError as e:      # a value of the study file is blamed on the file, not the command line
        raise _from_study_file(e, config, from_file) from None
    console.print(optimal_table(res))
    console.print(f"searched {res.shapes} shapes ({res.curve['num_parameters'].min():.3g} to "
                  f"{res.curve['num_parameters'].max():.3g} parameters with a feasible plan), "
                  f"{res.points:,} plans ({res.feasible:,} feasible) in {res.seconds:.2f} s; "
                  f"loss fit: {res.fit.source}", markup=False, highlight=False)
    for w in res.warnings:
        console.print(f"warning: {w}", style="bold yellow", markup=False)
    for note in res.notes:
        console.print(f"note: {note}", style="yellow", markup=False)
    if output is not None:
        write_table_atomic(res.curve, output, replace=overwrite)
        console.print(f"wrote {_plural(res.curve.height, 'shape')} (best plan each; optimum marked) to {output}")


def _from_study_file(e: InputError, config: Optional[Path], from_file: dict) -> InputError:
    """``e`` (an error of :func:`~vtrain_fast.analysis.optimal.optimal`, which names command-line
    options) naming the study file ``config`` and its key where the value came from the file
    (``from_file``: option -> key, e.g. ``--budget-usd`` -> ``optimal.budget_usd``); else ``e``."""
    option = e.key
    if e.where == "command line" and option == "budget" and e.value:     # two budgets
        given = [o for part in str(e.value).split(" and ") for o in part.split("/")]
        if all(o in from_file for o in given):
            return InputError(str(config), "[optimal] budget", ", ".join(from_file[o] for o in given),
                              "exactly one of budget_usd, gpu_hours, or gpus with days",
                              "keep one budget in the file's [optimal] table (a budget option on the command line "
                              "replaces the file's)")
        return e
    if e.where == "command line" and option == "--set":
        option = "--set " + str(e.value).split("=", 1)[0]
    if e.where != "command line" or option not in from_file:
        return e
    key = from_file[option]
    fix = e.fix.replace(f"give {e.key} ", f"give {key} ").replace(e.key, key) if e.key != "--set" else e.fix
    return InputError(str(config), key, e.value, e.allowed,
                      (fix + "; " if fix else "") + f"{option.split()[0]} on the command line overrides the file's value")


@app.command()
@_user_errors
def advise(model: str = typer.Option(..., "--model", help="model preset (vtrain-fast presets) or a model of --models"),
           gpus: str = typer.Option(..., "--gpus", help="GPU:N, e.g. rtx4090-pcie-24gb:8"),
           days: Optional[float] = typer.Option(None, "--days", help="a deadline: does the final plan train the "
                                                "tokens in time?"),
           budget_usd: Optional[float] = typer.Option(None, "--budget-usd", help="a budget in US dollars (the GPU's "
                                                      "usd_per_gpu_hour): does the final plan cost less?"),
           tokens: Optional[float] = typer.Option(None, "--tokens", help="tokens to train [20 per parameter]"),
           global_batch_size: Optional[int] = typer.Option(None, "--global-batch-size", help="sequences per global "
                                                           "batch [4 Mi tokens of the model's seq_length]"),
           threshold: float = typer.Option(0.01, "--threshold", help="the least gain in iteration time of a speed "
                                           "step, a fraction (--rule greedy)"),
           rule: str = typer.Option("best-plan", "--rule", help="best-plan: the search's best plan, its techniques "
                                    "one a row, those needed to fit first, then the largest speed-up; greedy: one "
                                    "technique per step, the one that fits (else the largest memory cut), then the "
                                    "fastest"),
           memory_margin: Optional[float] = MemoryMarginOpt,
           settings: Optional[List[str]] = typer.Option(None, "--set", help="KEY=VALUE: a training setting or "
                                                        "cluster value of the start (repeat), e.g. gpus_per_node=4"),
           plot: Optional[Path] = typer.Option(None, "--plot", help="bar chart of the steps, .png / .svg / .pdf"),
           output: Optional[Path] = typer.Option(None, "-o", "--output", help="the steps with every evaluate "
                                                 "column, .parquet or .csv"),
           calibration: Optional[Path] = CalibrationOpt,
           gpus_file: Optional[Path] = typer.Option(None, "--gpus-file", help="TOML of your own GPUs "
                                                    "(\\[gpus.<name>] tables, as `--gpus` of sweep)"),
           models: Optional[List[Path]] = typer.Option(None, "--models", help="model file (repeat): "
                                                       "\\[models.<name>] tables, e.g. written by import-hf"),
           overwrite: bool = OverwriteOpt):
    """Which technique first: from plain data parallelism to the best plan of the techniques
    (FlashAttention, recomputation, ZeRO, 8-bit optimizer states, FP8, overlap, sequence / tensor /
    pipeline parallelism, micro-batches), one technique a row, what each buys in speed, memory and
    cost, which are needed to fit, and the final plan (see README, Which technique first)."""
    import polars as pl

    from .analysis.advise import advise as run, best_plan_lines, final_plan_lines, plot_advice, steps_display
    from .analysis.evaluate import check_table_path, write_table_atomic
    from .analysis.optimal import parse_setting
    from .analysis.report import check_plot_path, print_frame
    from .hardware.gpus import parse_gpu_count
    from .plan.spec import load_models
    from .io.outputs import check_output
    read = (calibration, gpus_file, *(models or ()))
    if output is not None:
        check_table_path(output)
        check_output(output, inputs=read, overwrite=overwrite)
    if plot is not None:
        check_plot_path(plot)
        check_output(plot, "--plot", inputs=read, overwrite=overwrite)
    own_gpus = _gpus(gpus_file)
    gpu, n = parse_gpu_count(gpus, own_gpus, "--gpus", "rtx4090-pcie-24gb:8")
    res = run(model, gpu, n, days=days, budget_usd=budget_usd, num_tokens=tokens,
              settings=dict(parse_setting(t) for t in settings or ()), gpu_presets=own_gpus,
              calibration=_calibration(calibration), global_batch_size=global_batch_size, threshold=threshold,
              memory_margin=memory_margin, models=load_models(models) if models else None, rule=rule)
    how = (f"greedy rule: a speed step gains >= {res.threshold:.0%}" if res.rule == "greedy" else
           "the best plan's techniques: to fit first, then the largest speed-up")
    print_frame(steps_display(res), f"advise: {model} on {n:,} x {gpu}, {res.num_tokens:.3g} tokens, global batch "
                f"{res.global_batch_size:,} ({how})", None, console, keep=("iteration_time_s", "memory_per_gpu_GiB"))
    head = {"search": "final plan (the search's best: the ladder ends out of memory): ",
            "best-plan": f"final plan (the best of the {res.searched:,} plans the ladder's values make): "}
    console.print(head.get(res.final_source, "final plan: ") + "\n  ".join(final_plan_lines(res)), markup=False,
                  highlight=False)
    best = best_plan_lines(res)
    if best:
        console.print("\n  ".join(best), markup=False, highlight=False)
    if res.without.height:
        shown = res.without.with_columns(pl.when(pl.col("fits")).then(pl.lit("fits")).otherwise(
            pl.col("status")).alias("status")).drop("fits")
        print_frame(shown.rename({"technique": "without"}), "the final plan without each of its techniques "
                    "(set back to the start's value; in brackets: those that need it, gone too)", None, console)
    if res.target is not None:
        console.print(res.target["message"], style="bold green" if res.target["meets"] else "bold yellow",
                      markup=False, highlight=False)
    for note in res.notes:
        console.print(f"note: {note}", style="yellow", markup=False, highlight=False)
    if output is not None:
        write_table_atomic(res.steps, output, replace=overwrite)
        console.print(f"wrote {_plural(res.steps.height, 'step')} (every evaluate column) to {output}",
                      markup=False, highlight=False)
    if plot is not None:
        plot_advice(res, plot)
        console.print(f"wrote {plot}", markup=False, highlight=False)


VALIDATION_SETS = ("vtrain", "published", "moe")


@app.command()
@_user_errors
def validate(output: Optional[Path] = typer.Option(None, "-o", "--output",
                                                   help="per-row errors, .parquet or .csv [results/validation.parquet; "
                                                        "--set published: results/validation_published.parquet; --set moe: "
                                                        "results/validation_moe.parquet]"),
             plot: Optional[Path] = typer.Option(None, "--plot", help="predicted-vs-measured PNG"),
             calibration: Optional[Path] = CalibrationOpt,
             write_measurements: Optional[Path] = typer.Option(
                 None, "--write-measurements", help="also write the measured sets as evaluate/calibrate CSVs into this folder"),
             which: str = typer.Option("vtrain", "--set", help="vtrain: vTrain's 1,549 A100 iteration times; published: "
                                       "the 79 published runs of vtrain_fast/data/published (held out); moe: the 203 "
                                       "published mixture-of-experts runs (moe_runs.csv, held out)"),
             overwrite: bool = OverwriteOpt):
    """Compare predictions with vTrain's 1,549 measured A100 iteration times (--set published:
    with 79 published training runs of 7 sources; --set moe: with 203 published MoE runs)."""
    import polars as pl

    from .analysis.evaluate import check_table_path, write_table_atomic
    from .analysis.report import check_plot_path, print_frame
    if which not in VALIDATION_SETS:
        raise InputError("command line", "--set", which, "one of " + ", ".join(VALIDATION_SETS))
    from .io.outputs import check_output
    default = {"moe": "results/validation_moe.parquet", "published": "results/validation_published.parquet"}
    explicit = output is not None
    output = output or Path(default.get(which, "results/validation.parquet"))
    # its own default file (under results/) is regenerated on every run; a file named with -o or --plot
    # is replaced only with --overwrite, as every command's; never an input, nor a device
    check_output(output, inputs=(calibration,), overwrite=overwrite or not explicit)
    if plot:
        check_plot_path(plot)
        check_output(plot, "--plot", inputs=(calibration,), overwrite=overwrite)
    if which == "moe" and plot:
        raise InputError("command line", "--plot", str(plot), "--plot with --set vtrain or --set published",
                         "leave --plot out: --set moe writes its per-row results (-o) but draws no plot yet")
    if which == "moe":
        _validate_moe(output or Path("results/validation_moe.parquet"), calibration)
        return
    if which == "published":
        _validate_published(output or Path("results/validation_published.parquet"), plot, calibration,
                            write_measurements)
        return
    output = output or Path("results/validation.parquet")
    from .analysis.validate import group_spearman, load_measurements
    from .analysis.validate import plot as plot_rows
    from .analysis.validate import validate as run
    check_table_path(output)
    rows, summary = run(_calibration(calibration))
    print_frame(summary, "Iteration-time error vs measurements (percent)", console=console)
    groups = group_spearman(rows)
    print_frame(groups.filter(pl.col("set") == "multi"),
                "Multi-node: ranking of plans within each model (Spearman)", console=console)
    if write_measurements:
        for which in ("single", "multi"):
            write_table_atomic(load_measurements(which), write_measurements / f"vtrain_{which}.csv")
        console.print(f"measurements: {write_measurements}/vtrain_single.csv, vtrain_multi.csv")
    groups_path = output.with_name(output.stem + "_groups" + output.suffix)
    write_table_atomic(rows, output)
    write_table_atomic(groups, groups_path)
    console.print(f"per-row errors: {output}; per-group: {groups_path}")
    if plot:
        plot_rows(rows, plot)
        console.print(f"plot: {plot}")


def _validate_published(output: Path, plot: Optional[Path], calibration: Optional[Path],
                        write_measurements: Optional[Path]) -> None:
    """validate --set published: per-source and per-GPU error tables, the largest errors, why
    the other rows are not priced; per-row results to ``output``."""
    import polars as pl

    from .analysis.evaluate import check_table_path, write_table_atomic
    from .analysis.published import (basis_summary, measured_frame, memory_aside, reason_counts, stack_parameters,
                                     stack_summary, summary, validate_published)
    from .analysis.report import print_frame
    check_table_path(output)
    rows = validate_published(_calibration(calibration))
    n, k = rows.height, int(rows["expressible"].sum())
    console.print(f"Published runs: {n} rows of {rows['source'].n_unique()} sources, {k} expressible by the model today. "
                  "Held-out baseline first: nothing is fitted to these rows; calibration: "
                  f"{calibration or 'the shipped presets (today)'}. Error = predicted vs measured seconds per iteration "
                  "(each source's metric converted with its own formula).", markup=False)
    print_frame(summary(rows, "source"), "Iteration-time error by source (percent; priced = expressible and "
                "feasible in the model)", console=console, keep=("source",))
    print_frame(summary(rows, "gpu_preset"), "Iteration-time error by GPU preset (percent)", console=console,
                keep=("gpu_preset",))
    aside = memory_aside(rows)
    if aside["out_of_memory"]:
        console.print(f"Memory aside: {aside['out_of_memory']} of the runs ran but the model finds them out of memory "
                      f"(status out_of_memory; the memory model misses them). Their iteration times counted too: "
                      f"{aside['rows']} rows, MAPE {aside['shipped_mape_pct']:.1f} % with the shipped calibration, "
                      f"{aside['stack_mape_pct']:.1f} % with the stack calibrations where one covers the row "
                      "(columns iteration_time_memory_aside_s, ape_memory_aside_pct).", markup=False)
    n_assumed = int(rows.filter(pl.col("expressible") & (pl.col("basis") == "assumed")).height)
    console.print(f"{n_assumed} of the {k} expressible rows rely on values their source does not state, filled from "
                  "other documented sources (vtrain_fast/data/published/assumptions.toml; columns basis, "
                  "assumed_values, assumption_sources): MAPE of the stated and the assumed rows apart.", markup=False)
    for by, title in (("source", "Shipped calibration: MAPE of stated and assumed rows, by source"),
                      ("gpu_preset", "Shipped calibration: MAPE of stated and assumed rows, by GPU preset")):
        print_frame(basis_summary(rows, by), title, console=console, keep=(by,))
    priced = rows.filter(pl.col("ape_pct").is_not_null()).sort("ape_pct", descending=True)
    cols = [c for c in ("id", "basis", "gpu_preset", "tp", "pp", "dp", "vpp", "micro_batch_size", "global_batch_size",
                        "recompute", "sequence_parallel", "measured_iteration_time_s", "iteration_time_s",
                        "error_pct") if c in priced.columns]
    if priced.height:
        print_frame(priced.select(cols), "Largest errors (error = predicted / measured - 1, percent)", 10,
                    console=console, keep=("id", "error_pct"), more_hint=f"every row is in {output}")
    console.print("Stack calibrations (vtrain_fast/data/calibration/, `make calibrate-published`): a few global "
                  "parameters per software stack and GPU, fitted to every other expressible row of the stack "
                  "(CSV order; column fit_role); the rest held out. MAPE in percent: shipped = the shipped "
                  "calibration (all rows held out); fitted, held = the stack calibration on its fit_n fitted "
                  "and held_n held-out rows; ship_ho = the shipped calibration on those held-out rows.",
                  markup=False)
    for by, title in (("stack", "Stack calibration: MAPE by stack (source key)"),
                      ("gpu_preset", "Stack calibration: MAPE by GPU preset"),
                      ("basis", "Stack calibration: MAPE by basis (stated / assumed values)")):
        print_frame(stack_summary(rows.filter(pl.col("expressible")), by), title, console=console, keep=(by,))
    params = stack_parameters()
    if params.height:
        print_frame(params.drop("note"), "Stack calibration: fitted parameters (shipped = the preset's)",
                    console=console, keep=("stack", "param", "value"))
        for r in params.filter(pl.col("note").is_not_null()).iter_rows(named=True):
            console.print(f"note: {r['stack']} {r['gpu']}: {r['param']} = {r['value']:.4g} is {r['note']} "
                          f"(shipped preset: {r['shipped']:.4g})", style="yellow", markup=False)
    refused = rows.filter(pl.col("expressible") & pl.col("status").ne("ok"))
    if refused.height:
        print_frame(refused.select("id", "status"), "Expressible rows the model finds infeasible (not priced)",
                    console=console, keep=("id",))
    print_frame(reason_counts(rows), f"Why {n - k} rows are not priced (a row may have several reasons; only = "
                "the rows it alone keeps out)", console=console, keep=("reason",))
    if write_measurements:
        ok = rows.filter(pl.col("expressible")).select("id", "fit_role")
        from .analysis.published import load_runs
        runs = [r for r in load_runs() if r["id"] in set(ok["id"].to_list())]
        meas = measured_frame(runs).join(ok, on="id")
        write_table_atomic(meas, write_measurements / "published.csv")
        console.print(f"measurements: {write_measurements}/published.csv (expressible rows only)")
    write_table_atomic(rows, output)
    console.print(f"per-row results: {output}")
    if plot:
        from .analysis.published import plot as plot_rows
        plot_rows(rows, plot)
        console.print(f"plot: {plot}")


def _validate_moe(output: Path, calibration: Optional[Path]) -> None:
    """validate --set moe: MAPE per source, release, model and GPU, the largest errors with their
    breakdown, and one reason per row not priced; per-row results to ``output``."""
    import polars as pl

    from .analysis.evaluate import check_table_path, write_table_atomic
    from .analysis.published import summary
    from .analysis.published_moe import BREAKDOWN, HELD_OUT_NOTE, not_priced_counts, validate_moe
    from .analysis.report import print_frame
    check_table_path(output)
    rows = validate_moe(_calibration(calibration))
    n, k = rows.height, int(rows["ape_pct"].is_not_null().sum())
    console.print(f"Published MoE runs (vtrain_fast/data/published/moe_runs.csv): {n} rows of "
                  f"{rows['source'].n_unique()} sources, {k} priced. All {HELD_OUT_NOTE}"
                  + (f" ({calibration})" if calibration else "") + ". Error = predicted vs measured seconds per "
                  "iteration (tokens/s/GPU converted as GBS x seq / (tokens/s/GPU x GPUs); step times as measured). "
                  "Not stated by any source and assumed per stack (column assumptions): etp, recompute, dispatcher "
                  "and its overlap, sequence parallelism.", markup=False)
    for by, title in (("source", "MoE iteration-time error by source (percent; priced = status ok)"),
                      ("release", "MoE iteration-time error by release (Megatron-Bridge) or source"),
                      ("preset", "MoE iteration-time error by model preset"),
                      ("gpu_preset", "MoE iteration-time error by GPU preset")):
        print_frame(summary(rows, by), title, console=console, keep=(by,))
    priced = rows.filter(pl.col("ape_pct").is_not_null()).sort("ape_pct", descending=True)
    if priced.height:
        cols = ["id", "gpu_preset", "tp", "pp", "vpp", "ep", "dp", "micro_batch_size", "global_batch_size",
                "measured_iteration_time_s", "iteration_time_s", "error_pct", *BREAKDOWN]
        print_frame(priced.select([c for c in cols if c in priced.columns]),
                    "Largest errors (error = predicted / measured - 1, percent; breakdown in seconds)", 10,
                    console=console, keep=("id", "error_pct"), more_hint=f"every row is in {output}")
    print_frame(not_priced_counts(rows), f"Why {n - k} rows are not priced (one reason a row: column "
                "not_priced_reason)", console=console, keep=("reason",))
    write_table_atomic(rows, output)
    console.print(f"per-row results: {output}")


@app.command()
@_user_errors
def calibrate(measurements: Path = typer.Argument(..., help="CSV: evaluate columns + measured_iteration_time_s"),
              gpu: str = typer.Option(..., "--gpu", help="GPU preset to calibrate"),
              output: Path = typer.Option(..., "-o", "--output", help="calibration TOML (created or updated)"),
              param: List[str] = typer.Option(None, "--param", help="parameter to fit (repeat); default: hbm_efficiency, kernel_overhead_s, "
                                                      "host_launch_s, iteration_overhead_s; the others keep "
                                                      "--calibration's (or the preset's) values"),
              calibration: Optional[Path] = CalibrationOpt):
    """Least-squares fit of a few global efficiencies of one GPU type to measured iteration times."""
    from .hardware.calfile import read_calibration_output, update_calibration_file
    from .analysis.calibrate import DEFAULT_FIT, calibration_values, fit
    from .analysis.evaluate import read_csv
    from .io.outputs import check_output
    # updated in place (it may be --calibration itself), but never the measurements, nor a device
    check_output(output, inputs=(measurements,), overwrite=True)
    read_calibration_output(output)     # a sweep spec or another TOML is refused before the fit
    start = (_calibration(calibration) or {}).get(gpu)
    cal, report = fit(read_csv(measurements), gpu, tuple(param) if param else DEFAULT_FIT, start, str(measurements))
    update_calibration_file(output, gpu, calibration_values(cal), meta={
        "fitted_on": str(measurements), "rows": report["rows"],
        "mape_before_pct": round(report["mape_before_pct"], 3), "mape_after_pct": round(report["mape_after_pct"], 3)})
    console.print(f"{gpu}: {report['rows']} rows, MAPE {report['mape_before_pct']:.2f}% -> "
                  f"{report['mape_after_pct']:.2f}%; wrote {output}")
    if report["mape_after_pct"] > report["mape_before_pct"]:
        console.print("note: the fit minimises the squared log error (large misses weigh more), not the MAPE, "
                      "so the MAPE can rise a little while the worst rows improve; with few rows, fit fewer "
                      "parameters (--param)", style="yellow", markup=False)
    for k in (param or DEFAULT_FIT):
        console.print(f"  {k} = {getattr(cal, k):.6g}")


@app.command("calibrate-published")
@_user_errors
def calibrate_published(output: Path = typer.Option(None, "-o", "--output-dir",
                                                    help="folder of the stack calibration files [vtrain_fast/data/calibration]"),
                        stack: List[str] = typer.Option(None, "--stack", help="stack key of the published set to fit "
                                                        "(repeat); default: every stack with a fit")):
    """Fit each software stack's calibration (analysis/published.py: STACKS) to its fitted rows of
    the published set (every other expressible row per GPU, CSV order) and write one file per stack."""
    from .analysis.published import STACKS, write_stack_calibration
    keys = list(stack) if stack else [k for k, s in STACKS.items() if s.fit]
    for k in keys:
        if k not in STACKS or STACKS[k].fit is None:
            raise InputError("command line", "--stack", k,
                             "a stack with a fit: " + ", ".join(k for k, s in STACKS.items() if s.fit))
    for k in keys:
        path, groups = write_stack_calibration(k, output)
        for g in groups:
            rep = g["report"]
            values = ", ".join(f"{p} = {rep[p]:.6g}" for p in STACKS[k].fit.params)
            console.print(f"{k} {g['gpu']}{''.join(' + ' + s for s in g['share'])}: {len(g['fitted'])} fitted rows, "
                          f"{len(g['held_out'])} held out; fitted MAPE {rep['mape_before_pct']:.2f}% -> "
                          f"{rep['mape_after_pct']:.2f}%; {values}", markup=False)
        console.print(f"wrote {path}", markup=False)


@app.command("calibrate-nccl")
@_user_errors
def calibrate_nccl(files: List[Path] = typer.Argument(..., help="nccl-tests output files (any collective)"),
                   gpu: str = typer.Option(..., "--gpu", help="GPU preset the tables were measured on"),
                   output: Path = typer.Option(..., "-o", "--output", help="calibration TOML (created or updated)"),
                   inter_node: bool = typer.Option(False, "--inter-node", help="tables span nodes (fit NIC parameters)"),
                   collective: Optional[str] = typer.Option(None, "--collective", help="override the collective of every file"),
                   ranks: Optional[int] = typer.Option(None, "--ranks", help="override the rank count of every file"),
                   gpus_per_node: Optional[int] = typer.Option(None, "--gpus-per-node", help="GPUs per node of the measured cluster (--inter-node) [preset]"),
                   inter_node_gbps: Optional[float] = typer.Option(None, "--inter-node-Gbps", help="NIC bandwidth per GPU of the measured cluster [preset]"),
                   calibration: Optional[Path] = CalibrationOpt):
    """Fit latency, per-step latency and bus-bandwidth efficiency to nccl-tests measurements."""
    from .hardware.calfile import read_calibration_output, update_calibration_file
    from .hardware.gpus import OVERRIDE_RANGES, PRESETS, machine_vector, with_overrides
    from .analysis.nccl import MAX_RANKS, check_fit, fit_tables, read_table
    if gpu not in PRESETS:
        raise InputError("command line", "--gpu", gpu, "GPU presets " + ", ".join(PRESETS))
    # 0 is a value, not "not given": --gpus-per-node 0 used to fit the intra-node model
    for opt, key, value in (("--gpus-per-node", "gpus_per_node", gpus_per_node),
                            ("--inter-node-Gbps", "inter_node_Gbps", inter_node_gbps)):
        lo, hi = OVERRIDE_RANGES[key]
        if value is not None and not lo <= value <= hi:      # NaN and inf too
            raise InputError("command line", opt, value, f"{'a whole number' if key == 'gpus_per_node' else 'a number'}"
                             f" from {lo:g} to {hi:g}", f"{opt} of the measured cluster, or leave it out for the "
                             f"preset's ({getattr(PRESETS[gpu], key):g})")
    if ranks is not None and not 2 <= ranks <= MAX_RANKS:
        raise InputError("command line", "--ranks", ranks, f"a whole number from 2 to {MAX_RANKS:,}",
                         "the GPUs every table was measured on, or leave it out to read it from the files")
    from .io.outputs import check_output
    check_output(output, inputs=files, overwrite=True)     # updated in place; never a table read, nor a device
    read_calibration_output(output)     # a sweep spec or another TOML is refused before the fit
    preset = with_overrides(PRESETS[gpu], (_calibration(calibration) or {}).get(gpu),
                            gpus_per_node=gpus_per_node, inter_node_Gbps=inter_node_gbps)
    tables = [read_table(f, collective, ranks) for f in files]
    if inter_node:
        res = fit_tables(tables, preset.inter_node_Gbps / 8.0, preset.gpus_per_node, machine_vector(preset))
        link = preset.inter_node_Gbps / 8.0
    else:
        link = preset.intra_node_GBps
        res = fit_tables(tables, link, hw=machine_vector(preset))
    check_fit(res, ", ".join(str(f) for f in files[:3]) + (", ..." if len(files) > 3 else ""), link)
    if res["mape_pct"] > 10.0:
        model = "hierarchical tree model" if inter_node else "ring model"
        err.print(f"warning: the fit's MAPE is {res['mape_pct']:.1f}%: the {model} does not describe these "
                  "tables well (another topology, or mixed collectives?)", markup=False)
    if res.get("step_latency_kept"):
        err.print(f"note: every table has the same number of {'tree' if inter_node else 'ring'} steps, so the "
                  "per-step latency cannot be told from the fixed one; the per-step latency keeps its current "
                  f"value ({res['step_latency_s'] * 1e6:.2f} us) and only latency and efficiency were fitted; "
                  "add tables over other rank or node counts to fit it", markup=False)
    if res["clipped"]:
        err.print(f"warning: {', '.join(res['clipped'])} hit the allowed bound; check --gpu, --ranks, "
                  f"--gpus-per-node and the link bandwidth ({link:g} GB/s per GPU)", markup=False)
    side = "inter_node" if inter_node else "intra_node"
    update_calibration_file(output, gpu, {f"{side}_latency_s": res["latency_s"],
                                          f"{side}_step_latency_s": res["step_latency_s"],
                                          f"{side}_efficiency": res["efficiency"]},
                            meta={f"nccl_{side}_files": len(files), f"nccl_{side}_rows": res["rows"],
                                  f"nccl_{side}_mape_pct": round(res["mape_pct"], 3)})
    console.print(f"{gpu} {side}: latency {res['latency_s'] * 1e6:.2f} us, step {res['step_latency_s'] * 1e6:.2f} us, "
                  f"busbw efficiency {res['efficiency']:.3f} of {link:g} GB/s; fit MAPE {res['mape_pct']:.2f}% "
                  f"over {res['rows']} rows; wrote {output}")


@app.command()
@_user_errors
def trace(output: Path = typer.Option(..., "-o", "--output", help="the trace, .csv or .parquet"),
          jobs: int = typer.Option(64, "--jobs", help="jobs in the trace"),
          cluster: str = typer.Option("a100-sxm4-80gb:1024", "--cluster", help="GPU:COUNT the jobs are sized for"),
          seed: int = typer.Option(0, "--seed", help="random seed (the same seed, the same trace)"),
          mean_interarrival_hours: float = typer.Option(0.5, "--mean-interarrival-hours",
                                                        help="mean time between arrivals (Poisson), h"),
          overwrite: bool = typer.Option(False, "--overwrite", help="replace an existing -o file"),
          gpus_file: Optional[Path] = typer.Option(None, "--gpus-file", help="TOML of your own GPUs "
                                                   "(\\[gpus.<name>] tables, as `--gpus` of sweep)")):
    """Write a synthetic job trace for `schedule` (Poisson arrivals, a model mix, durations and
    deadline slack from stated distributions; see README, Scheduling)."""
    from .analysis.evaluate import check_table_path, write_table_atomic
    from .io.outputs import check_output
    from .schedule.generate import generate_trace
    from .schedule.run import parse_cluster
    check_table_path(output)
    check_output(output, inputs=(gpus_file,), overwrite=overwrite)
    gpu, n = parse_cluster(cluster, _gpus(gpus_file))
    df = generate_trace(jobs, gpu, n, seed, mean_interarrival_hours, gpu_presets=_gpus(gpus_file))
    write_table_atomic(df, output, replace=overwrite)
    console.print(f"wrote {output}: {_plural(df.height, 'job')} over {df['arrival_hours'].max():.1f} h for "
                  f"{n:,} x {gpu} (seed {seed})", markup=False, highlight=False)


@app.command()
@_user_errors
def schedule(trace_file: Path = typer.Argument(..., help="job trace, .csv or .parquet (README, Scheduling)"),
             cluster: str = typer.Option(..., "--cluster", help="GPU:COUNT, e.g. a100-sxm4-80gb:1024"),
             policy: List[str] = typer.Option([], "--policy", help="plan-aware, dp-only or fifo (repeat) [all three]"),
             restart_s: float = typer.Option(300.0, "--restart-s", help="seconds a re-allocated job holds its nodes "
                                             "without progress (an assumption)"),
             settings: Optional[List[str]] = typer.Option(None, "--set", help="KEY=VALUE: a [training] setting "
                                                          "for every job's plans (repeat)"),
             output: Optional[Path] = typer.Option(None, "-o", "--output-dir", help="results folder: jobs.parquet, "
                                                   "segments.parquet, summary.parquet, gantt-<policy>.png"),
             overwrite: bool = typer.Option(False, "--overwrite", help="replace an -o folder an earlier schedule "
                                            "wrote (never an input, a results folder or a folder of other files)"),
             memory_margin: Optional[float] = typer.Option(None, "--memory-margin", help="leave out plans whose "
                                                           "memory headroom is below this fraction of the GPU's HBM"),
             calibration: Optional[Path] = CalibrationOpt,
             gpus_file: Optional[Path] = typer.Option(None, "--gpus-file", help="TOML of your own GPUs "
                                                      "(\\[gpus.<name>] tables, as `--gpus` of sweep)")):
    """Replay a job trace on a shared cluster: each job's time-versus-GPUs curve from one sweep,
    whole nodes allocated by each policy, re-planned at arrivals and completions; deadlines met,
    job completion times, makespan, utilisation and cost per job and in total."""
    from .analysis.optimal import parse_setting
    from .analysis.report import print_frame
    from .io.outputs import check_output
    from .schedule.run import POLICY_ORDER, SCHEDULE_OUTPUT, comparison, comparison_text, schedule as run, write_schedule
    read = (trace_file, calibration, gpus_file)
    if output is not None:
        check_output(output, "-o", inputs=read, overwrite=overwrite, folder=SCHEDULE_OUTPUT)
    res = run(trace_file, cluster, policy or POLICY_ORDER, restart_s,
              dict(parse_setting(t) for t in settings or ()), _calibration(calibration), _gpus(gpus_file),
              memory_margin)
    print_frame(res.summary(), f"{trace_file}: {res.trace.height} jobs on {res.num_gpus:,} x {res.gpu} "
                f"(restart {res.restart_s:g} s)", None, console, keep=("policy", "deadlines_met", "mean_jct_hours"))
    cmp = comparison(res)
    if cmp:
        console.print(comparison_text(cmp) + " (vTrain's paper, 1,024 A100: 1.09x / 1.23x for 64 / 128 jobs, JCT "
                      "-15 %, makespan -23 %; README, Scheduling)", markup=False, highlight=False)
    for p, r in res.replays.items():
        if r.summary["infeasible"]:
            console.print(f"note: {p}: {r.summary['infeasible']} of {r.summary['jobs']} jobs not run (no plan of "
                          f"{res.num_gpus:,} x {res.gpu} fits them); their JCTs are not in the means",
                          style="yellow", markup=False)
    console.print(f"priced {res.curves.points:,} plans ({res.curves.feasible:,} feasible) for "
                  f"{len(res.curves.kinds)} job kinds in {res.curve_seconds:.2f} s; replays {res.replay_seconds:.2f} s",
                  markup=False, highlight=False)
    if output is not None:
        names = write_schedule(res, output, overwrite, inputs=read)
        console.print(f"wrote {output}: {', '.join(names)}", markup=False, highlight=False)


def main():
    """Console-script entry point (``vtrain-fast``)."""
    app()


if __name__ == "__main__":
    sys.exit(main())
