"""``vtrain-fast schedule``: read a trace, price every job's curve in one sweep, replay it under
each policy, and write the results folder (:func:`write_schedule`)."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from ..io.outputs import FolderOutput, check_output
from ..io.writer import SCHEDULE_KIND

from .policies import POLICIES
from .replay import DEFAULT_RESTART_S, SUMMARY_COLUMNS, Replay, check_policy, check_restart_s, replay

POLICY_ORDER = tuple(POLICIES)
# What `schedule` writes into its folder (its manifest of kind SCHEDULE_KIND): the only entries --overwrite replaces.
SCHEDULE_OUTPUT = FolderOutput("schedule", ("jobs.parquet", "segments.parquet", "summary.parquet", "manifest.json",
                                            *(f"gantt-{p}.png" for p in POLICY_ORDER)), manifest_kind=SCHEDULE_KIND)


def parse_cluster(text: str, gpu_presets: dict | None = None) -> tuple[str, int]:
    """``GPU:COUNT`` (``a100-sxm4-80gb:1024``) as ``(gpu, count)``
    (:func:`vtrain_fast.hardware.gpus.parse_gpu_count` with ``--cluster`` in its messages).

    Raises
    ------
    InputError
        Not ``GPU:COUNT``, an unknown GPU, a count that is not a positive whole number.
    """
    from ..hardware.gpus import parse_gpu_count
    # whole nodes, at most curves.MAX_NODES: job_curves checks
    return parse_gpu_count(text, gpu_presets, "--cluster")


@dataclass(frozen=True)
class ScheduleResult:
    """The replays of one trace.

    Attributes
    ----------
    trace : polars.DataFrame
    gpu : str
    num_gpus : int
    restart_s : float
    replays : dict
        Policy -> :class:`~vtrain_fast.schedule.replay.Replay`, in the order asked.
    curves : JobCurves
    curve_seconds, replay_seconds : float
        Wall time of the sweep and of the replays, s.
    """

    trace: pl.DataFrame
    gpu: str
    num_gpus: int
    restart_s: float
    replays: dict
    curves: object
    curve_seconds: float
    replay_seconds: float

    def summary(self) -> pl.DataFrame:
        """One row per policy (:data:`~vtrain_fast.schedule.replay.SUMMARY_COLUMNS`)."""
        return pl.DataFrame([r.summary for r in self.replays.values()])

    def jobs(self) -> pl.DataFrame:
        """Every policy's per-job rows."""
        return pl.concat([r.jobs for r in self.replays.values()], how="vertical_relaxed")

    def segments(self) -> pl.DataFrame:
        return pl.concat([r.segments.with_columns(pl.lit(p).alias("policy")) for p, r in self.replays.items()],
                         how="vertical_relaxed").select(["policy"] + list(next(iter(self.replays.values())).segments.columns))


def schedule(trace_path, cluster: str, policies=POLICY_ORDER, restart_s: float = DEFAULT_RESTART_S,
             settings: dict | None = None, calibration: dict | None = None,
             gpu_presets: dict | None = None, memory_margin: float | None = None) -> ScheduleResult:
    """Replay the trace at ``trace_path`` on ``cluster`` (``GPU:COUNT``) under each policy.

    Raises
    ------
    InputError
        A bad trace, cluster, policy, restart time or setting; a job whose model does not fit on
        the cluster under any plan is not an error (its row says ``infeasible``).
    """
    from ..hardware.gpus import PRESETS
    from .curves import job_curves
    from .trace import read_trace
    gpu, n = parse_cluster(cluster, gpu_presets)
    policies = list(dict.fromkeys(policies))
    for p in policies:           # before the sweep: bad options lose no work
        check_policy(p)
    check_restart_s(restart_s)
    trace = read_trace(trace_path)
    t0 = time.perf_counter()
    kinds = sorted(set(zip(trace["model"].to_list(), trace["global_batch_size"].to_list())))
    curves = job_curves(kinds, gpu, n, settings, calibration, gpu_presets, memory_margin)
    t1 = time.perf_counter()
    price = (gpu_presets or PRESETS)[gpu].usd_per_gpu_hour
    replays = {p: replay(trace, curves, p, restart_s, price) for p in policies}
    return ScheduleResult(trace=trace, gpu=gpu, num_gpus=n, restart_s=float(restart_s), replays=replays, curves=curves,
                          curve_seconds=t1 - t0, replay_seconds=time.perf_counter() - t1)


def comparison(res: ScheduleResult, base: str = "dp-only", policy: str = "plan-aware") -> dict | None:
    """``policy`` against ``base``: the ratio of deadlines met and the change of mean JCT and
    makespan (fractions; negative: shorter), as vTrain's paper reports them; None unless both
    were replayed."""
    if base not in res.replays or policy not in res.replays:
        return None
    a, b = res.replays[policy].summary, res.replays[base].summary

    def change(k):
        ok = b[k] and math.isfinite(b[k]) and math.isfinite(a[k])
        return a[k] / b[k] - 1.0 if ok else None
    return dict(policy=policy, base=base, with_deadline=b["with_deadline"],
                deadlines_met_ratio=a["deadlines_met"] / b["deadlines_met"] if b["deadlines_met"] else None,
                mean_jct_change=change("mean_jct_hours"), makespan_change=change("makespan_hours"))


def comparison_text(cmp: dict) -> str:
    """The comparison as one line (``n/a`` where the base has nothing to compare with)."""
    if cmp.get("with_deadline") == 0:
        met = "no job has a deadline"
    elif cmp["deadlines_met_ratio"] is None:
        met = f"deadlines met n/a ({cmp['base']} met none)"
    else:
        met = f"{cmp['deadlines_met_ratio']:.2f}x the deadlines met"
    pct = lambda v: "n/a" if v is None else f"{v:+.1%}"  # noqa: E731
    return (f"{cmp['policy']} against {cmp['base']}: {met}, mean JCT {pct(cmp['mean_jct_change'])}, "
            f"makespan {pct(cmp['makespan_change'])}")


def write_schedule(res: ScheduleResult, out: Path, overwrite: bool = False, gantt: bool = True,
                   inputs=()) -> list[str]:
    """Write ``out/`` atomically (:func:`vtrain_fast.io.writer.write_folder_atomic`):
    ``jobs.parquet`` (every policy's per-job rows), ``segments.parquet`` (the allocations over
    time), ``summary.parquet``, ``gantt-<policy>.png`` and ``manifest.json`` (the inputs, and the
    size and SHA-256 of every file, written last). Returns the file names. ``inputs``: the files
    the run read (the trace, calibration, GPU files), which ``out`` may not replace.

    Raises
    ------
    InputError
        ``out`` a file, a non-empty folder without ``overwrite``, or one the output rule keeps
        (:func:`vtrain_fast.io.outputs.check_output`: an input, a results folder, a folder
        holding other files); a failed write (disk full: the path and the free space).
    """
    from .. import __version__
    from ..analysis.report import save_figure
    from ..io.writer import file_record, write_folder_atomic, write_json_atomic
    from .gantt import gantt_figure
    out = Path(out)
    check_output(out, inputs=inputs, overwrite=overwrite, folder=SCHEDULE_OUTPUT)
    names = []

    def build(tmp: Path):
        tables = {"jobs.parquet": res.jobs(), "segments.parquet": res.segments(), "summary.parquet": res.summary()}
        records = {}
        for name, df in tables.items():
            df.write_parquet(tmp / name)
            records[name] = file_record(tmp / name, df.height)
        if gantt:
            for p, r in res.replays.items():
                name = f"gantt-{p}.png"
                save_figure(gantt_figure(r, res.num_gpus, f"{res.num_gpus:,} x {res.gpu}"), tmp / name)
                records[name] = file_record(tmp / name, 0)
        write_json_atomic(tmp / "manifest.json", dict(
            kind=SCHEDULE_KIND, version=__version__, gpu=res.gpu, num_gpus=res.num_gpus,
            restart_s=res.restart_s, policies=list(res.replays), jobs=res.trace.height, files=records,
            summary=[{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.summary.items()}
                     for r in res.replays.values()],
            summary_columns=SUMMARY_COLUMNS))
        names.extend(list(records) + ["manifest.json"])
    write_folder_atomic(out, build, "schedule results")
    return names


__all__ = ["POLICY_ORDER", "Replay", "ScheduleResult", "comparison", "parse_cluster", "schedule", "write_schedule"]
