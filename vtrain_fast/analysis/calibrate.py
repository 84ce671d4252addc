"""Fit a handful of global efficiencies of one GPU type to measured iteration times.

Least squares (``scipy.optimize.least_squares``, trust-region reflective with bounds) on the
log ratio of predicted to measured iteration time, so every row weighs by its relative error.
The fitted parameters are global numbers of the GPU type (:class:`~vtrain_fast.hardware.gpus.Calibration`);
there are no per-row or per-model constants.
"""
from __future__ import annotations

from dataclasses import fields, replace

import numpy as np
import polars as pl
from scipy.optimize import least_squares

from ..io.errors import InputError
from .evaluate import evaluate_frame
from ..hardware.gpus import CALIBRATION_RANGES, PRESETS, Calibration

# gemm_efficiency is not in the default set: iteration times of small models cannot separate it
# from the per-kernel terms (see README, Accuracy); pin it from a matmul benchmark, or name it.
DEFAULT_FIT = ("hbm_efficiency", "kernel_overhead_s", "host_launch_s", "iteration_overhead_s")
MEASURED = "measured_iteration_time_s"


def fit(df: pl.DataFrame, gpu: str, params=DEFAULT_FIT, base: Calibration | None = None,
        where: str = "<measurements>", share: tuple[str, ...] = ()) -> tuple[Calibration, dict]:
    """Fit ``params`` of GPU preset ``gpu`` to the rows of ``df``.

    Parameters
    ----------
    df : polars.DataFrame
        ``evaluate`` columns plus ``measured_iteration_time_s`` (seconds, > 0). Rows of other
        GPU presets are ignored.
    gpu : str
        GPU preset name.
    params : sequence of str
        Calibration fields to fit; the others keep ``base``'s values.
    base : Calibration, optional
        Starting point and fixed values (default: the preset's).
    share : tuple of str, optional
        Other GPU presets whose rows are fitted with the same calibration (the same chip and
        software in another memory size, e.g. ``a100-sxm4-40gb`` with ``a100-sxm4-80gb``); their
        rows are priced with the fitted values too.

    Returns
    -------
    calibration : Calibration
    report : dict
        ``rows``, ``mape_before_pct``, ``mape_after_pct``, the fitted values and the optimiser's
        status.

    Raises
    ------
    InputError
        Unknown GPU or parameter, missing ``measured_iteration_time_s``, no usable rows.
    """
    for g in (gpu, *share):
        if g not in PRESETS:
            raise InputError(where, "--gpu", g, ", ".join(PRESETS))
    gpus = (gpu, *share)
    for p in params:
        if p not in CALIBRATION_RANGES:
            raise InputError(where, "--param", p, ", ".join(CALIBRATION_RANGES))
    if MEASURED not in df.columns:
        raise InputError(where, "columns", MEASURED, "a column measured_iteration_time_s (seconds)")
    if "gpu" in df.columns:
        df = df.filter(pl.col("gpu").is_in(gpus))
    if df.height == 0:
        raise InputError(where, "rows", 0, f"rows with gpu = {' or '.join(gpus)}", "check the gpu column and --gpu")
    measured = df[MEASURED].cast(pl.Float64, strict=False).fill_null(np.nan).to_numpy().astype(np.float64)
    bad = ~(np.isfinite(measured) & (measured > 0))
    if bad.any():
        i = int(np.argmax(bad))
        raise InputError(where, f"column {MEASURED}, row {i + 2}", df[MEASURED][i], "positive seconds")
    if df.height <= len(params):
        raise InputError(where, "rows", df.height, f"more rows than fitted parameters ({len(params)})",
                         "give more measurements or fewer --param")
    base = base or PRESETS[gpu].calibration
    status = evaluate_frame(df, where, dict.fromkeys(gpus, base))["status"]
    unusable = (status != "ok") & (status != "out_of_memory")
    if unusable.any():
        i = int(unusable.arg_max())
        raise InputError(where, f"row {i + 2}", status[i],
                         "configurations the model can evaluate (status ok)", "fix or remove the row")
    # an efficiency is fitted above 0.01 even where a file may say 0 (0 disables FlashAttention)
    lo = np.array([max(CALIBRATION_RANGES[p][0], 0.01) if p.endswith("efficiency") else CALIBRATION_RANGES[p][0]
                   for p in params])
    hi = np.array([CALIBRATION_RANGES[p][1] for p in params])
    x0 = np.clip(np.array([getattr(base, p) for p in params]), lo, hi)

    def predict(x) -> np.ndarray:
        cal = replace(base, **dict(zip(params, map(float, x))))
        res = evaluate_frame(df, where, dict.fromkeys(gpus, cal))
        return res["iteration_time_s"].to_numpy()

    def residuals(x):
        pred = predict(x)
        r = np.log(pred / measured)
        return np.where(np.isfinite(r), r, 10.0)

    before = predict(x0)
    # Deterministic multi-start: the given point (zeros lifted off the bound, where a max() in
    # the model would give a zero gradient) and two points spread over each parameter's range.
    starts = [np.where(x0 > lo, x0, lo + 0.05 * (hi - lo))]
    for frac in (0.02, 0.2):
        starts.append(np.clip(np.where(hi <= 1.0, 0.5 + 0.4 * frac / 0.2, lo + frac * (hi - lo) * 0.05), lo, hi))
    sol = None
    for start in starts:
        trial = least_squares(residuals, start, bounds=(lo, hi), x_scale=np.maximum(np.abs(start), 1e-9),
                              diff_step=1e-3, max_nfev=400)
        if sol is None or trial.cost < sol.cost:
            sol = trial
    # A term the data do not need is written as its lower bound (0.0, not 2e-22 or a 1e-6 left
    # where the solver stopped): a parameter moves to its bound when that fits as well.
    x = sol.x.copy()
    cost = float(np.sum(residuals(x) ** 2))
    for i in range(len(x)):
        if x[i] > lo[i]:
            trial = x.copy()
            trial[i] = lo[i]
            trial_cost = float(np.sum(residuals(trial) ** 2))
            if trial_cost <= cost * (1.0 + 1e-6) + 1e-18:
                x, cost = trial, trial_cost
    cal = replace(base, **dict(zip(params, map(float, x))))
    after = predict(x)
    mape = lambda p: float(np.nanmean(np.abs(p - measured) / measured) * 100)  # noqa: E731
    report = dict(rows=int(df.height), mape_before_pct=mape(before), mape_after_pct=mape(after),
                  status=sol.message, **{p: float(v) for p, v in zip(params, x)})
    return cal, report


def calibration_values(cal: Calibration) -> dict:
    """All fields of ``cal`` as a dict (for writing a calibration file)."""
    return {f.name: getattr(cal, f.name) for f in fields(Calibration)}
