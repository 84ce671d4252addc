"""Validation against the measured Megatron-DeepSpeed iteration times published with vTrain
(Bang et al., MICRO 2024; files in ``vtrain_fast/data/vtrain``, MIT licence).

Measurement setting (vTrain's README and configs): A100 SXM 80 GB, 8 GPUs per node on NVSwitch,
4 x 200 Gb/s HDR InfiniBand per node (100 Gb/s per GPU), fp16, GPT layer with vocabulary 50,257,
full activation recomputation, non-interleaved 1F1B.
"""
from __future__ import annotations

from importlib import resources
from pathlib import Path

import numpy as np
import polars as pl

from .evaluate import evaluate_frame

DATA = resources.files("vtrain_fast") / "data" / "vtrain"
VTRAIN_PUBLISHED_MAPE = {"single": 8.37, "multi": 14.73}
CLUSTER = dict(gpu="a100-sxm4-80gb", gpus_per_node=8, inter_node_Gbps=100.0, recompute="full",
               precision="fp16", vocab_size=50257)
_RENAME = {
    "# GPUs": "num_gpus", "global batch": "global_batch_size", "micro batch": "micro_batch_size",
    "hidden size": "hidden_size", "attention heads": "num_attention_heads", "# layers": "num_layers",
    "sequence length": "seq_length", "tensor parallelism": "tp", "data parallelism": "dp",
    "pipeline parallelism": "pp", "Parameters (billion)": "params_billion",
}


def load_measurements(which: str) -> pl.DataFrame:
    """The measured set ``which`` ("single" or "multi") in ``evaluate`` column names, with
    ``measured_iteration_time_s`` and the cluster columns of the measurement setting."""
    path = DATA / f"ground_truth_{which}.csv"
    df = pl.read_csv(path.read_bytes())
    df = df.rename({k: v for k, v in _RENAME.items() if k in df.columns})
    df = df.with_columns((pl.col("iteration time (ms)") / 1000.0).alias("measured_iteration_time_s"))
    df = df.drop("iteration time (ms)").with_row_index("row")
    return df.with_columns(**{k: pl.lit(v) for k, v in CLUSTER.items()})


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman rank correlation (average ranks for ties)."""
    if len(x) < 2:
        return float("nan")
    rx = pl.Series(x).rank("average").to_numpy()
    ry = pl.Series(y).rank("average").to_numpy()
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def group_spearman(rows: pl.DataFrame) -> pl.DataFrame:
    """Per measured set and model group (model size, hidden_size, num_layers, num_gpus, global batch):
    rows, MAPE and the Spearman correlation of predicted with measured iteration times."""
    out = []
    for (which, group), g in rows.group_by("set", "group", maintain_order=True):
        out.append(dict(set=which, group=group, rows=g.height, mape_pct=float(g["ape_pct"].mean()),
                        spearman=spearman(g["measured_iteration_time_s"].to_numpy(),
                                          g["iteration_time_s"].to_numpy())))
    return pl.DataFrame(out).sort("set", "group")


def validate(calibration: dict | None = None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Run both measured sets through the model.

    Returns
    -------
    rows : polars.DataFrame
        One row per measurement: inputs, ``set``, ``measured_iteration_time_s``,
        ``iteration_time_s`` (predicted), ``ape_pct`` (absolute percentage error) and the
        model's other outputs.
    summary : polars.DataFrame
        Per set: rows, MAPE, median, p90 and max absolute percentage error (percent),
        minimum Spearman correlation over model groups, and vTrain's published MAPE.
    """
    frames = []
    for which in ("single", "multi"):
        df = load_measurements(which)
        res = evaluate_frame(df, f"ground_truth_{which}.csv", calibration)
        res = res.with_columns(pl.lit(which).alias("set"))
        frames.append(res)
    rows = pl.concat(frames, how="diagonal_relaxed").with_columns(
        ((pl.col("iteration_time_s") - pl.col("measured_iteration_time_s")).abs()
         / pl.col("measured_iteration_time_s") * 100.0).alias("ape_pct"),
        pl.when(pl.col("params_billion").is_not_null())
        .then(pl.format("{}B (h{}, L{}, {} GPUs, batch {})", "params_billion", "hidden_size", "num_layers",
                        "num_gpus", "global_batch_size"))
        .otherwise(pl.format("h{}, L{}, {} GPUs, batch {}", "hidden_size", "num_layers", "num_gpus",
                             "global_batch_size")).alias("group"),
    )
    summary = []
    for which in ("single", "multi"):
        r = rows.filter(pl.col("set") == which)
        ape = r["ape_pct"].to_numpy()
        gs = group_spearman(r).filter(pl.col("rows") >= 3)
        rhos = [x for x in gs["spearman"].to_list() if not np.isnan(x)]
        summary.append(dict(
            set=which, rows=r.height, mape_pct=float(np.mean(ape)), median_ape_pct=float(np.median(ape)),
            p90_ape_pct=float(np.percentile(ape, 90)), max_ape_pct=float(np.max(ape)),
            min_spearman=float(min(rhos)) if rhos else float("nan"),
            median_spearman=float(np.median(rhos)) if rhos else float("nan"),
            vtrain_mape_pct=VTRAIN_PUBLISHED_MAPE[which],
        ))
    return rows, pl.DataFrame(summary)


def plot(rows: pl.DataFrame, path: str | Path) -> None:
    """Predicted vs measured iteration time on log axes with the y = x line (PNG)."""
    from .report import plot_predicted_vs_measured
    groups = []
    for which, color in (("single", "tab:blue"), ("multi", "tab:red")):
        r = rows.filter(pl.col("set") == which)
        groups.append((f"{which}-node ({r.height} rows)", r, color))
    plot_predicted_vs_measured(groups, path, "vtrain_fast vs vTrain measurements (A100)",
                               "measured iteration time (s)", "predicted iteration time (s)", size=6)
