"""The Gantt chart of a replay: one row per job, a bar per stretch on one allocation (coloured by
its GPUs, the restart at its start hatched), the arrival as a dot and the deadline as a tick."""
from __future__ import annotations

import math

import numpy as np


def gantt_figure(rep, num_gpus: int, title: str):
    """A matplotlib figure of :class:`~vtrain_fast.schedule.replay.Replay` ``rep`` on a cluster
    of ``num_gpus`` GPUs."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm

    jobs = rep.jobs.sort(["arrival_hours", "job_id"])
    ids = jobs["job_id"].to_list()
    row = {j: i for i, j in enumerate(ids)}
    height = max(3.0, 0.16 * len(ids) + 1.6)
    fig, ax = plt.subplots(figsize=(11, height))
    seg = rep.segments
    gpus = seg["num_gpus"].to_numpy() if seg.height else np.array([1])
    norm = LogNorm(vmin=max(1, int(gpus.min())), vmax=max(2, int(max(gpus.max(), num_gpus))))
    cmap = plt.get_cmap("viridis")
    for s in seg.iter_rows(named=True):
        y = row[s["job_id"]]
        c = cmap(norm(s["num_gpus"]))
        ax.barh(y, s["end_hours"] - s["start_hours"], left=s["start_hours"], height=0.8, color=c, linewidth=0)
        r = min(s["restart_until_hours"], s["end_hours"]) - s["start_hours"]
        if r > 0:
            ax.barh(y, r, left=s["start_hours"], height=0.8, color="white", alpha=0.6, hatch="////",
                    edgecolor="black", linewidth=0)
    for j in jobs.iter_rows(named=True):
        y = row[j["job_id"]]
        ax.plot(j["arrival_hours"], y, "o", color="black", markersize=2.5)
        if j["deadline_hours"] is not None:
            met = j["deadline_met"]
            ax.plot(j["deadline_hours"], y, "|", color="tab:green" if met else "tab:red", markersize=7, mew=1.5)
    sm = plt.cm.ScalarMappable(norm=norm, cmap=cmap)
    bar = fig.colorbar(sm, ax=ax, label="GPUs", pad=0.01)
    ticks = [2 ** k for k in range(0, 24) if norm.vmin <= 2 ** k <= norm.vmax]
    bar.set_ticks(ticks, labels=[f"{t:,}" for t in ticks])
    bar.minorticks_off()
    ax.set_yticks(range(len(ids)))
    ax.set_yticklabels(ids if len(ids) <= 64 else [i if k % 4 == 0 else "" for k, i in enumerate(ids)], fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("hours from the start of the trace")
    s = rep.summary
    parts = [f"{s['deadlines_met']}/{s['with_deadline']} deadlines met"] if s["with_deadline"] else []
    if math.isfinite(s["mean_jct_hours"]):
        parts += [f"mean JCT {s['mean_jct_hours']:.1f} h", f"makespan {s['makespan_hours']:.1f} h"]
    if s["infeasible"]:
        parts.append(f"{s['infeasible']} not run")
    ax.set_title(f"{title}: {rep.policy} ({', '.join(parts)})\ndot: arrival, tick: deadline (green met, red "
                 "missed; none: no deadline), hatched: restart (too short to see on long traces)", fontsize=9)
    right = max(float(jobs["finish_hours"].max() or 0.0) if jobs["finish_hours"].is_not_nan().any() else 0.0,
                float(jobs["deadline_hours"].max() or 0.0), float(jobs["arrival_hours"].max() or 0.0))
    ax.set_xlim(0, max(right, 1e-3) * 1.02)
    ax.grid(axis="x", alpha=0.3)
    return fig
