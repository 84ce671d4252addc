"""A discrete-event replay of a job trace on a cluster of nodes (``vtrain-fast schedule``).

Events are arrivals and completions. At each event the policy (:data:`~vtrain_fast.schedule.policies.POLICIES`)
gives every arrived, unfinished job its nodes until the next event. A job on ``k`` nodes runs on
``used[k]`` of them (its curve, :mod:`vtrain_fast.schedule.curves`) at that plan's step time;
steps are counted as a continuous amount (a job may stop between two steps at an event). When a
started job's nodes or plan change (a re-allocation, or a resumption after a preemption; a
preempted job holds nothing), it holds its new nodes for ``restart_s`` without progress
(checkpoint, relaunch, reload; an assumption, the same for every policy, :data:`DEFAULT_RESTART_S`)
and keeps the steps it had done (a checkpoint at every preemption). A job's first start costs
nothing.

Measured per job: start, finish, job completion time (finish - arrival), ``deadline_met``
(finish <= deadline; null without a deadline), GPU-hours held (restarts included) and their cost
at the GPU preset's ``usd_per_gpu_hour``, restarts. In total: jobs whose deadline is met, the mean
and p90 (nearest rank) job completion time, the makespan (last finish - first arrival), the GPU
utilisation (GPU-seconds held over GPUs x makespan) and the cost.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from ..io.errors import InputError
from .policies import POLICIES, fifo_request, next_faster

# Seconds a re-allocated job holds its nodes without progress (save a checkpoint, relaunch, load
# it): an assumption; a few minutes is what checkpoint-restart of a multi-billion-parameter job takes.
DEFAULT_RESTART_S = 300.0
HOUR = 3600.0


@dataclass
class JobState:
    """One job in the replay (the policy reads ``deadline_s``, ``priority``, ``arrival_s``,
    ``job_id``, ``remaining``, ``started``, ``nodes``, ``family``, ``request`` and the curve:
    ``step_s``, ``used``, ``family_of``, ``next_faster``, each indexed by the nodes given)."""

    job_id: str
    arrival_s: float
    deadline_s: float
    priority: int
    steps: float
    step_s: np.ndarray
    used: np.ndarray
    family_of: np.ndarray
    next_faster: np.ndarray
    request: int = 0
    remaining: float = 0.0
    started: bool = False
    nodes: int = 0
    family: int = -1
    paused_until: float = 0.0
    start_s: float = math.nan
    finish_s: float = math.nan
    restarts: int = 0
    gpu_s: float = 0.0
    plans: list = field(default_factory=list)


@dataclass(frozen=True)
class Replay:
    """What :func:`replay` measured for one policy.

    Attributes
    ----------
    policy : str
    jobs : polars.DataFrame
        One row per job (:data:`JOB_COLUMNS`).
    segments : polars.DataFrame
        One row per stretch of a job on one allocation: ``job_id``, ``start_hours``, ``end_hours``,
        ``num_gpus``, ``plan``, ``step_s`` (its seconds per step), ``restart_until_hours`` (no
        progress before).
    summary : dict
        The totals (:data:`SUMMARY_COLUMNS`).
    max_gpus_held : int
        The most GPUs held at once over the replay (never above the cluster's).
    """

    policy: str
    jobs: pl.DataFrame
    segments: pl.DataFrame
    summary: dict
    max_gpus_held: int


JOB_COLUMNS = {
    "policy": "allocation policy", "job_id": "job", "model": "model preset", "status": "done | infeasible",
    "arrival_hours": "h", "start_hours": "h (first start)", "finish_hours": "h", "jct_hours": "finish - arrival, h",
    "deadline_hours": "h", "deadline_met": "finish <= deadline (null: no deadline)",
    "num_steps": "optimizer steps", "gpu_hours": "GPU-h held", "cost_usd": "GPU-h x usd_per_gpu_hour",
    "restarts": "re-allocations paid", "mean_gpus": "GPU-h / (finish - start)", "first_plan": "plan at start",
    "last_plan": "plan at finish",
}
SUMMARY_COLUMNS = {
    "policy": "allocation policy", "jobs": "jobs in the trace",
    "infeasible": "jobs not run: no plan of the cluster fits them (the JCTs and makespan are over the others)",
    "with_deadline": "jobs with a deadline", "deadlines_met": "of them finished in time",
    "mean_jct_hours": "mean job completion time, h", "p90_jct_hours": "90th percentile (nearest rank), h",
    "makespan_hours": "last finish - first arrival, h", "gpu_utilisation": "GPU-s held / (GPUs x makespan)",
    "cost_usd": "sum of the jobs' cost", "restarts": "re-allocations in total",
}


def _plan_text(curves, fam: int, gpus: int) -> str:
    from .curves import family_text
    tp, pp = (int(v) for v in curves.families[fam][:2])
    return f"{family_text(curves, fam)} dp {gpus // (tp * pp)} ({gpus} GPUs)"


def check_policy(policy: str) -> None:
    """Refuse a policy that is not a key of :data:`~vtrain_fast.schedule.policies.POLICIES`.

    Raises
    ------
    InputError
        Naming the closest policy, or how to ask for several.
    """
    if policy not in POLICIES:
        from ..io.errors import did_you_mean
        raise InputError("command line", "--policy", policy, "one of " + ", ".join(POLICIES),
                         "repeat the option for several: --policy plan-aware --policy fifo" if "," in str(policy)
                         else did_you_mean(policy, POLICIES, "e.g. --policy plan-aware"))


def check_restart_s(restart_s) -> None:
    """Refuse a restart time that is not a finite number of seconds >= 0.

    Raises
    ------
    InputError
    """
    if not (isinstance(restart_s, (int, float)) and math.isfinite(restart_s) and restart_s >= 0):
        raise InputError("command line", "--restart-s", restart_s, "seconds >= 0", "e.g. --restart-s 300")


def replay(trace: pl.DataFrame, curves, policy: str, restart_s: float = DEFAULT_RESTART_S,
           usd_per_gpu_hour: float = 0.0) -> Replay:
    """Replay ``trace`` under ``policy``.

    Parameters
    ----------
    trace : polars.DataFrame
        Jobs as :func:`vtrain_fast.schedule.trace.read_trace` returns them.
    curves : JobCurves
        Every job kind's curve on the cluster (:func:`vtrain_fast.schedule.curves.job_curves`).
    policy : str
        A key of :data:`~vtrain_fast.schedule.policies.POLICIES`.
    restart_s : float
        Seconds a re-allocated job holds its nodes without progress.
    usd_per_gpu_hour : float
        Price of a GPU-hour.

    Returns
    -------
    Replay

    Raises
    ------
    InputError
        An unknown policy or a negative ``restart_s``.
    """
    check_policy(policy)
    check_restart_s(restart_s)
    allocate, curve_kind = POLICIES[policy]
    gpn, n_nodes = curves.gpus_per_node, curves.num_nodes
    jobs, infeasible, models = [], [], {}
    for r in trace.iter_rows(named=True):
        kind = curves.kind(r["model"], r["global_batch_size"])
        fam = None if curve_kind == "plan-aware" else curves.smallest_family(kind)
        if fam == -1:
            step_s = np.full(n_nodes + 1, np.inf)
            used, fam_of = np.zeros(n_nodes + 1, np.int64), np.full(n_nodes + 1, -1, np.int64)
        else:
            step_s, used, fam_of = curves.curve(kind, fam)
        steps = float(r["num_steps"]) if r["num_steps"] is not None else \
            math.ceil(r["num_tokens"] / (r["global_batch_size"] * _seq_length(r["model"])))
        deadline = r["deadline_hours"] * HOUR if r["deadline_hours"] is not None else math.inf
        j = JobState(job_id=r["job_id"], arrival_s=r["arrival_hours"] * HOUR, deadline_s=deadline,
                     priority=int(r["priority"]), steps=steps, step_s=step_s, used=used, family_of=fam_of,
                     next_faster=next_faster(step_s), remaining=steps)
        asked = None if r["num_gpus"] is None else -(-int(r["num_gpus"]) // gpn)
        j.request = fifo_request(step_s, used, steps, j.arrival_s, deadline, asked, n_nodes)
        models[j.job_id] = r["model"]
        (jobs if np.isfinite(step_s).any() and (policy != "fifo" or j.request > 0) else infeasible).append(j)
    pending = sorted(jobs, key=lambda j: (j.arrival_s, j.job_id))
    active: list[JobState] = []
    done: list[JobState] = []
    segments = []
    now, max_held = 0.0, 0
    open_seg: dict[str, dict] = {}

    def close(j, t):
        seg = open_seg.pop(j.job_id, None)
        if seg is not None and t > seg["start_hours"] * HOUR:
            seg["end_hours"] = t / HOUR
            segments.append(seg)
    while pending or active:
        running = [j for j in active if j.nodes > 0]
        t_arr = pending[0].arrival_s if pending else math.inf
        t_fin = min((max(now, j.paused_until) + j.remaining * j.step_s[j.nodes] for j in running), default=math.inf)
        t_next = min(t_arr, t_fin)
        if not math.isfinite(t_next):       # nothing runs and nothing arrives: cannot happen (guarded)
            raise RuntimeError("replay stalled: active jobs without nodes and no event ahead")
        finished = []
        for j in running:
            # the job ends at this event when its projected finish is not after it (compared as
            # times: a remainder of steps too small to move the clock also ends it)
            if max(now, j.paused_until) + j.remaining * j.step_s[j.nodes] <= t_next:
                finished.append(j)
            else:
                j.remaining -= max(0.0, t_next - max(now, j.paused_until)) / j.step_s[j.nodes]
            j.gpu_s += (t_next - now) * j.nodes * gpn
        now = t_next
        for j in finished:
            j.remaining, j.finish_s = 0.0, now
            close(j, now)
            j.nodes = 0
            active.remove(j)
            done.append(j)
        while pending and pending[0].arrival_s <= now:
            active.append(pending.pop(0))
        if not active:
            continue
        alloc = allocate(now, active, n_nodes, restart_s)
        held = 0
        for j in active:
            k = alloc.get(j.job_id, 0)
            nodes, fam = (int(j.used[k]), int(j.family_of[k])) if k else (0, -1)
            if (nodes, fam) != (j.nodes, j.family):
                close(j, now)
                if j.started and nodes > 0:
                    j.restarts += 1
                    j.paused_until = now + restart_s
                if nodes > 0 and not j.started:
                    j.started, j.start_s = True, now
                j.nodes, j.family = nodes, fam
                if nodes > 0:
                    plan = _plan_text(curves, fam, nodes * gpn)
                    j.plans.append(plan)
                    open_seg[j.job_id] = dict(job_id=j.job_id, start_hours=now / HOUR, end_hours=math.nan,
                                              num_gpus=nodes * gpn, plan=plan, step_s=float(j.step_s[nodes]),
                                              restart_until_hours=max(now, j.paused_until) / HOUR)
            held += j.nodes
        if held > n_nodes:
            raise RuntimeError(f"policy {policy} allocated {held} of {n_nodes} nodes")
        max_held = max(max_held, held * gpn)
        if not any(j.nodes for j in active) and not pending:
            # nobody can run now and nothing will arrive: the remaining jobs can never start
            for j in active:
                infeasible.append(j)
            active = []
    return _measure(policy, done, infeasible, models, segments, curves, usd_per_gpu_hour, max_held)


def _seq_length(model: str) -> int:
    from ..plan.models import MODEL_PRESETS
    return MODEL_PRESETS[model].seq_length


def _measure(policy, done, infeasible, models, segments, curves, price, max_held) -> Replay:
    gpn = curves.gpus_per_node
    rows = []
    for j in sorted(done + infeasible, key=lambda j: (j.arrival_s, j.job_id)):
        ok = j in done
        fin = j.finish_s if ok else math.nan
        rows.append(dict(
            policy=policy, job_id=j.job_id, model=models[j.job_id], status="done" if ok else "infeasible",
            arrival_hours=j.arrival_s / HOUR, start_hours=j.start_s / HOUR, finish_hours=fin / HOUR,
            jct_hours=(fin - j.arrival_s) / HOUR,
            deadline_hours=j.deadline_s / HOUR if math.isfinite(j.deadline_s) else None,
            deadline_met=(fin <= j.deadline_s * (1 + 1e-12) if ok else False) if math.isfinite(j.deadline_s) else None,
            num_steps=int(j.steps), gpu_hours=j.gpu_s / HOUR, cost_usd=j.gpu_s / HOUR * price, restarts=j.restarts,
            mean_gpus=(j.gpu_s / (fin - j.start_s)) if ok and fin > j.start_s else 0.0,
            first_plan=j.plans[0] if j.plans else None, last_plan=j.plans[-1] if j.plans else None))
    jobs = pl.DataFrame(rows, schema_overrides={"deadline_hours": pl.Float64, "deadline_met": pl.Boolean,
                                                "first_plan": pl.String, "last_plan": pl.String})
    seg = pl.DataFrame(segments, schema={"job_id": pl.String, "start_hours": pl.Float64, "end_hours": pl.Float64,
                                         "num_gpus": pl.Int64, "plan": pl.String, "step_s": pl.Float64,
                                         "restart_until_hours": pl.Float64})
    fin = jobs.filter(pl.col("status") == "done")
    jct = np.sort(fin["jct_hours"].to_numpy())
    makespan = (fin["finish_hours"].max() - jobs["arrival_hours"].min()) if fin.height else 0.0
    held = float(jobs["gpu_hours"].sum())
    summary = dict(
        policy=policy, jobs=jobs.height, infeasible=jobs.height - fin.height,
        with_deadline=int(jobs["deadline_hours"].is_not_null().sum()),
        deadlines_met=int(jobs["deadline_met"].fill_null(False).sum()),
        mean_jct_hours=float(jct.mean()) if jct.size else math.nan,
        p90_jct_hours=float(jct[max(0, math.ceil(0.9 * jct.size) - 1)]) if jct.size else math.nan,
        makespan_hours=float(makespan),
        gpu_utilisation=held / (curves.num_nodes * gpn * makespan) if makespan else math.nan,
        cost_usd=float(jobs["cost_usd"].sum()), restarts=int(jobs["restarts"].sum()))
    return Replay(policy=policy, jobs=jobs, segments=seg, summary=summary, max_gpus_held=max_held)
