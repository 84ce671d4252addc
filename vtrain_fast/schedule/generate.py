"""Synthetic job traces from stated distributions (``vtrain-fast trace``).

Every number below is an assumption of this generator, chosen before any replay was run and not
tuned to a result; :data:`DEFAULTS` holds them in one place.

* **Arrivals**: a Poisson process, exponential inter-arrival times of mean
  ``mean_interarrival_hours``.
* **Models**: drawn from :data:`MODEL_MIX` (GPT-3 shapes from 1.3B to 13B and vTrain's 18.4B and
  39.1B, more small jobs than large: most jobs of shared deep-learning clusters are small, Jeon et
  al., "Analysis of Large-Scale Multi-Tenant GPU Clusters for DNN Training Workloads", USENIX
  ATC 2019, Sec. 3; Hu et al., "Characterization and Prediction of Deep Learning Workloads in
  Large-Scale GPU Datacenters", SC 2021, Sec. 3).
* **Request**: the model's :data:`BASE_REQUEST_GPUS` times 2^u, u uniform on {-1, 0, 1}, at most
  the cluster (``num_gpus`` of the trace: fifo's fixed request).
* **Size**: the job's duration on its request with its fastest plan (the cost model's), log-uniform
  in ``duration_hours``; the token count is what that duration trains (whole steps of
  ``global_batch_size`` sequences).
* **Deadline**: arrival + slack x that duration, slack uniform in ``deadline_slack``.
"""
from __future__ import annotations

import math

import numpy as np
import polars as pl

from ..io.errors import InputError

MODEL_MIX = {"gpt3-1.3b": 0.25, "gpt3-2.7b": 0.2, "gpt3-6.7b": 0.2, "gpt3-13b": 0.15, "vtrain-18.4b": 0.12,
             "vtrain-39.1b": 0.08}
BASE_REQUEST_GPUS = {"gpt3-1.3b": 16, "gpt3-2.7b": 32, "gpt3-6.7b": 64, "gpt3-13b": 128, "vtrain-18.4b": 128,
                     "vtrain-39.1b": 256}
DEFAULTS = dict(mean_interarrival_hours=0.5, duration_hours=(2.0, 24.0), deadline_slack=(1.2, 2.0),
                global_batch_size=512)


def generate_trace(num_jobs: int, gpu: str, num_gpus: int, seed: int = 0,
                   mean_interarrival_hours: float = DEFAULTS["mean_interarrival_hours"],
                   duration_hours=DEFAULTS["duration_hours"], deadline_slack=DEFAULTS["deadline_slack"],
                   global_batch_size: int = DEFAULTS["global_batch_size"], curves=None,
                   settings: dict | None = None, calibration: dict | None = None,
                   gpu_presets: dict | None = None) -> pl.DataFrame:
    """A synthetic trace of ``num_jobs`` jobs for a cluster of ``num_gpus`` ``gpu`` (module
    docstring: the distributions). Deterministic for a ``seed``.

    Returns
    -------
    polars.DataFrame
        The columns of :data:`vtrain_fast.schedule.trace.TRACE_COLUMNS` in their order and dtypes
        (``num_steps`` empty), as :func:`~vtrain_fast.schedule.trace.read_trace` returns a trace.

    Raises
    ------
    InputError
        A bad count, range or cluster.
    """
    from .curves import job_curves
    if not (isinstance(num_jobs, int) and 1 <= num_jobs <= 100_000):
        raise InputError("command line", "--jobs", num_jobs, "a whole number from 1 to 100,000", "e.g. --jobs 64")
    for key, (lo, hi), low in (("--duration-hours", duration_hours, 0.0), ("--deadline-slack", deadline_slack, 1.0)):
        if not (math.isfinite(lo) and math.isfinite(hi) and low <= lo <= hi and hi > 0):
            raise InputError("command line", key, [lo, hi], f"LO HI with {low:g} <= LO <= HI")
    if not (isinstance(seed, int) and 0 <= seed < 2 ** 63):
        raise InputError("command line", "--seed", seed, "a whole number from 0 to 2^63 - 1", "e.g. --seed 1")
    if not (math.isfinite(mean_interarrival_hours) and mean_interarrival_hours > 0):
        raise InputError("command line", "--mean-interarrival-hours", mean_interarrival_hours, "hours > 0")
    rng = np.random.default_rng(seed)
    models = list(MODEL_MIX)
    weights = np.array([MODEL_MIX[m] for m in models])
    if curves is None:
        curves = job_curves([(m, global_batch_size) for m in models], gpu, num_gpus, settings, calibration,
                            gpu_presets)
    gpn = curves.gpus_per_node
    from ..plan.models import MODEL_PRESETS
    arrival = np.cumsum(rng.exponential(mean_interarrival_hours, num_jobs))
    arrival -= arrival[0]                                    # the first job arrives at 0
    rows = []
    for i in range(num_jobs):
        m = models[int(rng.choice(len(models), p=weights / weights.sum()))]
        request = min(num_gpus, max(gpn, int(BASE_REQUEST_GPUS[m] * 2.0 ** int(rng.integers(-1, 2)))))
        nodes = -(-request // gpn)
        step_s, used, _ = curves.curve(curves.kind(m, global_batch_size))
        duration = math.exp(rng.uniform(math.log(duration_hours[0]), math.log(duration_hours[1])))
        slack = rng.uniform(*deadline_slack)
        if not math.isfinite(step_s[nodes]):
            raise InputError("command line", "--cluster", f"{gpu}:{num_gpus}",
                             f"a cluster on which {m} fits in {nodes * gpn} GPUs", "use a GPU with more memory")
        steps = max(1, round(duration * 3600.0 / step_s[nodes]))
        seq = MODEL_PRESETS[m].seq_length
        rows.append(dict(job_id=f"job-{i:04d}", arrival_hours=round(float(arrival[i]), 4), model=m,
                         num_tokens=float(steps * global_batch_size * seq),
                         deadline_hours=round(float(arrival[i] + slack * steps * step_s[nodes] / 3600.0), 4),
                         global_batch_size=global_batch_size, priority=0, num_gpus=int(used[nodes]) * gpn))
    from .trace import TRACE_COLUMNS
    return pl.DataFrame(rows).with_columns(pl.lit(None, pl.Int64).alias("num_steps")).select(
        [pl.col(c.name).cast(c.dtype) for c in TRACE_COLUMNS])
