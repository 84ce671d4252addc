"""Allocation policies of :func:`vtrain_fast.schedule.replay.replay` (registry :data:`POLICIES`).

Every policy is called at each event (an arrival or a completion) with the jobs that have arrived
and not finished, and returns the nodes each job holds until the next event. A job given ``k``
nodes runs on ``used[k] <= k`` of them with plan family ``family[k]`` of its curve
(:meth:`vtrain_fast.schedule.curves.JobCurves.curve`); the replay charges ``restart_s`` whenever a
running or preempted job's nodes or plan change.

``plan-aware`` and ``dp-only`` are the same elastic rule on different curves; ``fifo`` is the
static baseline.

plan-aware
    Earliest deadline first with minimum satisfactory shares, then marginal returns, as
    ElasticFlow allocates (Gu et al., "ElasticFlow: An Elastic Serverless Training Platform for
    Distributed Deep Learning", ASPLOS 2023, Sec. 4: admission by minimum satisfactory share,
    leftover GPUs by marginal throughput), on each job's plan-aware curve: on every node count
    the fastest plan the cost model finds (tp, pp, micro-batch, recompute chosen with the
    allocation), as vTrain's case study pairs the simulator with the scheduler (Bang et al.,
    MICRO 2024, Sec. VI-C). The rule (:func:`elastic`):

    1. Jobs in order of deadline (none: last), then higher priority, running before waiting,
       arrival, id.
    2. A job's minimum satisfactory share is the fewest nodes ``k`` with
       ``now + restart(k) + remaining_steps x step_s(k) <= deadline`` (``restart(k)``:
       ``restart_s`` when ``k`` changes a started job's nodes or plan). In order, each job whose
       share fits in the nodes left gets it; the others (no share meets the deadline, or none
       fits) get nothing yet.
    3. The nodes left go, one step at a time, to the job whose next larger allocation with a
       faster step (or, for a running job below its nodes, its own allocation) buys the most
       job-completion rate per node, ``(1/R(k') - 1/R(k)) / (k' - k)`` with
       ``R(k) = restart(k) + remaining_steps x step_s(k)`` (``1/R(0) = 0``; ``restart(k)``
       counts what is left of a restart under way on the job's own allocation); ties in the
       order of 1, running jobs before waiting ones at equal deadline and priority.
dp-only
    The same rule on a curve with the job's plan fixed (ElasticFlow's elastic data parallelism:
    a job keeps the model-parallel plan it was submitted with and scales only dp): the tp, pp
    and recompute of the family :meth:`~vtrain_fast.schedule.curves.JobCurves.smallest_family`
    picks (the fastest on the fewest nodes it fits on), the micro-batch free (the global batch
    stays, so the per-GPU batch shrinks as dp grows).
fifo
    First come first served with a fixed request, no preemption, no backfilling: jobs start in
    order of arrival (then priority, id) when their request fits in the free nodes, the first
    one that does not fit blocks those behind it. The request is the trace's ``num_gpus`` (in
    nodes, rounded up, at most the cluster, and raised to the fewest nodes a plan fits on: a
    user resubmits a job that does not fit), else the fewest nodes whose plan-aware step meets
    the deadline alone from the arrival, else (no deadline, or none meets it) the nodes of the
    fastest step. The plan is the fastest on that request.
"""
from __future__ import annotations

import math

import numpy as np


def _order(job) -> tuple:
    return (job.deadline_s, -job.priority, not job.nodes, job.arrival_s, job.job_id)


def _restart(job, k: int, now: float, restart_s: float) -> float:
    """Seconds without progress a job has ahead on allocation ``k`` of its curve: what is left
    of a restart under way where ``k`` keeps its nodes and plan, else ``restart_s`` (none for
    a job's first start)."""
    if not job.started:
        return 0.0
    if job.used[k] == job.nodes and job.family_of[k] == job.family:
        return max(0.0, job.paused_until - now)
    return restart_s


def _remaining_s(job, k: int, now: float, restart_s: float) -> float:
    t = job.step_s[k]
    return math.inf if not math.isfinite(t) else _restart(job, k, now, restart_s) + job.remaining * t


def elastic(now: float, jobs: list, num_nodes: int, restart_s: float) -> dict:
    """Nodes per job (:data:`POLICIES` ``plan-aware`` and ``dp-only``; the rule: this module's
    docstring)."""
    alloc = {j.job_id: 0 for j in jobs}
    free = num_nodes
    order = sorted(jobs, key=_order)
    for j in order:
        if not math.isfinite(j.deadline_s):
            continue
        for k in range(1, free + 1):
            if now + _remaining_s(j, k, now, restart_s) <= j.deadline_s:
                alloc[j.job_id] = k
                free -= k
                break
    while free > 0:
        best = None
        for j in order:                      # ties: the earlier in the order keeps it (strict >)
            a = alloc[j.job_id]
            base = 0.0 if a == 0 else 1.0 / _remaining_s(j, a, now, restart_s)
            # the next allocation with a faster step, and a running job's own (no restart)
            for k in {int(j.next_faster[a])} | ({j.nodes} if j.started and a < j.nodes else set()):
                if k - a > free or k > num_nodes:
                    continue
                gain = (1.0 / _remaining_s(j, k, now, restart_s) - base) / (k - a)
                if best is None or gain > best[0]:
                    best = (gain, j, k)
        if best is None or best[0] <= 0.0:
            break
        _, j, k = best
        free -= k - alloc[j.job_id]
        alloc[j.job_id] = k
    return alloc


def next_faster(step_s: np.ndarray) -> np.ndarray:
    """``out[k]``: the fewest nodes ``k' > k`` whose step is faster than on ``k`` (a monotone
    curve's next change; ``len(step_s)`` where none), shape ``(len(step_s),)`` int64."""
    n = len(step_s)
    out = np.full(n, n, dtype=np.int64)
    nxt = n
    for k in range(n - 1, -1, -1):
        out[k] = nxt
        if k > 0 and (k == 1 or step_s[k] < step_s[k - 1]) and np.isfinite(step_s[k]):
            nxt = k
    return out


def fifo(now: float, jobs: list, num_nodes: int, restart_s: float) -> dict:
    """Nodes per job (:data:`POLICIES` ``fifo``; the rule: this module's docstring)."""
    alloc = {j.job_id: j.nodes for j in jobs if j.started}      # running jobs keep theirs
    free = num_nodes - sum(alloc.values())
    for j in sorted((j for j in jobs if not j.started), key=lambda j: (j.arrival_s, -j.priority, j.job_id)):
        if j.request > free:
            break
        alloc[j.job_id] = j.request
        free -= j.request
    return alloc


def fifo_request(step_s: np.ndarray, used: np.ndarray, steps: float, arrival_s: float, deadline_s: float,
                 asked_nodes: int | None, num_nodes: int) -> int:
    """The nodes a job asks for under ``fifo`` (this module's docstring); 0 when no plan fits."""
    if not np.isfinite(step_s).any():
        return 0
    if asked_nodes is not None:
        k = max(min(asked_nodes, num_nodes), int(np.flatnonzero(np.isfinite(step_s))[0]))
        return int(used[k])
    if math.isfinite(deadline_s):
        for k in range(1, num_nodes + 1):
            if arrival_s + steps * step_s[k] <= deadline_s:
                return int(used[k])
    return int(used[int(np.argmin(step_s))])


# name -> (allocate function, curve kind: "plan-aware" | "fixed-family")
POLICIES = {
    "plan-aware": (elastic, "plan-aware"),
    "dp-only": (elastic, "fixed-family"),
    "fifo": (fifo, "plan-aware"),
}
