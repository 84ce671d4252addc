"""One plan part by part: ``vtrain-fast show`` (issue 14).

For one plan (a row of a results folder or an evaluate-style table, :func:`~vtrain_fast.analysis.export.read_plan`)
:func:`show_plan` returns

* the iteration time broken down (the kernel's output columns, :data:`TIME_PARTS`, which sum to
  ``iteration_time_s``) and each pipeline stage's seconds per micro-batch
  (:func:`vtrain_fast.model.pipeline.stage_costs`, :func:`~vtrain_fast.model.pipeline.stage_micro_batch_s`);
* memory per pipeline stage, every stage ``0 .. pp - 1`` from its own layer counts (dense, bf16 under
  FP8, MoE: :func:`~vtrain_fast.model.layer_split.device_layer_count`) and its own micro-batches in flight,
  by part (:data:`MEMORY_PARTS`), from the kernel's own per-stage memory
  (:func:`vtrain_fast.model.pipeline.stage_memory`); the fullest stage's sum is the kernel's ``memory_per_gpu_GiB``
  (the kernel evaluates the first, the second and the last stage; tests/test_show.py checks they agree);
* a timeline of one iteration (:func:`simulate_pipeline`): per stage, the events of Megatron-core's
  1F1B (``vpp`` 1) or interleaved 1F1B schedule (``get_pp_rank_microbatches``: warm-up
  ``p - rank - 1`` forwards, or ``(p - rank - 1) 2 + (vpp - 1) p`` chunk forwards interleaved; then one
  forward one backward; then the cool-down's backwards), each forward chunk and backward chunk followed
  by its pipeline send, then after the flush the exposed data-parallel gradient reduction, the
  optimizer step and the per-iteration host overhead, as vTrain draws its simulated timeline
  (Bang et al. 2024, "vTrain", Fig. 7).

What is exact and what approximate. The stage seconds per micro-batch are the kernel's. The kernel
prices the pipeline as ``m max_i T_i + (sum_i T_i - max_i T_i) / vpp`` (Narayanan et al. 2021,
Sec. 2.2); the event simulation reproduces it exactly for equal stages (``(m + p - 1) T``, and
``(m vpp + p - 1) T / vpp`` interleaved) and differs where stages differ (the first carries the
embedding, the last the LM head and loss, uneven splits): there the forward and backward waves wait
on different stages than the formula's slowest one; tests/test_show.py bounds the difference. A
stage's seconds are split into forward, recomputation and backward in the proportion of one layer's
forward, recomputed forward (full: the forward; selective: the attention core) and backward; its TP,
CP, EP, sharded-DP exchanges, gradient accumulation and FP8 casts are spread in the same proportion
(the kernel adds them per micro-batch, not per direction). Every chunk's forward and backward is
followed by one pipeline exchange of ``pp_s / (2 vpp)`` that blocks the stage (the kernel charges
every stage one exchange per chunk and direction, ``overlap_p2p_comm`` already netted out), and the
next stage's chunk waits for its end. The exposed data-parallel reduction (less what ZeRO-2/3 already
put into the micro-batches) starts when the last stage finishes, on every stage.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import polars as pl

from ..io.errors import InputError
from ..model import costs, experts, layer_split, memory, ops, pipeline, records, step
from ..model.layout import Layout
from ..model.records import MACHINE, NUM_OUTPUTS, OUTPUT_NAMES, ROW, arch_of_values

GiB = 1024.0 ** 3
# The output columns that sum to iteration_time_s (model.pipeline.schedule).
TIME_PARTS = ("compute_s", "tp_comm_s", "pp_comm_s", "dp_comm_s", "cp_comm_s", "ep_comm_s", "bubble_s",
              "optimizer_s", "overhead_s", "offload_s")
# Memory per stage, bytes reported in GiB: fp16 weights, fp16 gradients, fp32 optimizer states (master
# weight, Adam moments; over the shard ranks from ZeRO-1 on), TE's FP8 weight copies, the parameters
# ZeRO-3 holds gathered, the layers' stored activations (micro-batches in flight x layers x bytes), the
# extras (the embedding output on the first stage, the last stage's logits and loss inputs, the layer a
# selective recomputation rebuilds, bf16 / MoE layers beyond a dense FP8 one), the reserved memory.
MEMORY_PARTS = ("weights_GiB", "gradients_GiB", "optimizer_GiB", "fp8_weights_GiB", "gathered_GiB",
                "activations_GiB", "activation_extras_GiB", "reserved_GiB")
# What a stage keeps in host memory instead (not in total_GiB): the saved activations of the layers
# cpu_offloading_num_layers offloads (the activations_GiB and activation_extras_GiB they no longer
# take), and under param_cpu_offload the shard's fp32 parameters, fp32 gradients and Adam moments
# (FSDP2 CPUOffloadPolicy: :data:`HOST_STATE_BYTES_PER_PARAM` per parameter of the shard).
HOST_PARTS = ("host_activations_GiB", "host_states_GiB")
HOST_STATE_BYTES_PER_PARAM = 16.0
EVENT_KINDS = ("forward", "recompute", "backward", "send", "dp_reduce", "optimizer", "overhead")
# Forward and backward operations (2 pp m vpp) the event timeline simulates at most: the simulation
# takes about 5 us per operation on the README's reference machine (a pp 96 plan of 6,144
# micro-batches, 1.2 M operations and 2.9 M events: 6 s), so 2 M take about 10 s. A plan beyond it
# is shown without its timeline (``--timeline`` and ``--events`` are refused with its size).
MAX_TIMELINE_OPS = 2_000_000


@dataclass
class PlanDetail:
    """One plan part by part (:func:`show_plan`).

    Attributes
    ----------
    plan : dict
        The plan's columns.
    time_s : dict
        :data:`TIME_PARTS` -> seconds per iteration, and ``iteration_time_s`` (the kernel's).
    stages : polars.DataFrame
        One row per pipeline stage: ``stage``, ``layers``, ``bf16_layers``, ``moe_layers``,
        ``micro_batch_s`` (the kernel's ``T_i``), ``forward_s``, ``recompute_s``, ``backward_s``,
        ``send_s`` (per micro-batch, all chunks), ``in_flight`` (micro-batches, or chunks / vpp, whose
        activations it holds).
    memory : polars.DataFrame
        One row per pipeline stage: ``stage``, :data:`MEMORY_PARTS`, ``total_GiB`` (their sum), then
        :data:`HOST_PARTS` (host memory, not in the total).
    events : polars.DataFrame
        ``stage``, ``start_s``, ``end_s``, ``kind`` (:data:`EVENT_KINDS`), ``micro_batch``, ``chunk``
        (-1 where none) of one iteration; no rows when the timeline was not simulated
        (:attr:`timeline_ops` over :data:`MAX_TIMELINE_OPS`).
    pipeline_s : float
        The kernel's pipeline part, ``m max T_i + (sum T_i - max T_i) / vpp`` (seconds).
    simulated_pipeline_s : float
        The event simulation's flush time (seconds); NaN when it was not simulated.
    kernel : dict
        Every output column as the kernel computes it from the plan's inputs.
    """

    plan: dict
    time_s: dict
    stages: pl.DataFrame
    memory: pl.DataFrame
    events: pl.DataFrame
    pipeline_s: float
    simulated_pipeline_s: float
    kernel: dict = field(default_factory=dict)
    timeline_ops: int = 0

    @property
    def makespan_s(self) -> float:
        """End of the simulated iteration (seconds; NaN without a simulated timeline)."""
        return float(self.events["end_s"].max()) if self.events.height else float("nan")

    def title(self) -> str:
        """The plan in one line: model, GPU, tp/pp/dp/vpp, micro-batch size, recomputation (the labels
        :func:`~vtrain_fast.analysis.export.printable`: a line break or a control character in a name
        shown as its escape)."""
        from .export import printable
        p = self.plan
        parts = [str(p.get("model") or f"{p.get('num_layers')}L h{p.get('hidden_size')}"), str(p.get("gpu", ""))]
        sizes = [f"tp {p.get('tp')}", f"pp {p.get('pp')}", f"dp {p.get('dp')}"]
        for name in ("cp", "ep", "vpp"):
            if (p.get(name) or 1) > 1:
                sizes.append(f"{name} {p.get(name)}")
        parts.append(" ".join(sizes))
        parts.append(f"mbs {p.get('micro_batch_size')} gbs {p.get('global_batch_size')}")
        parts.append(f"recompute {p.get('recompute', 'none')}")
        return printable(", ".join(parts))


def kernel_inputs(plan: dict, gpus: dict | None = None):
    """The kernel inputs of one plan (its input columns, checked as ``evaluate`` checks them):
    ``(sizes, lay, recompute, tokens, hw, arch)`` with ``sizes`` the floats ``L, h, a, g, f, v, s, B, b``."""
    from ..io.schema import CLUSTER_COLUMNS, INPUT_COLUMNS
    from .evaluate import evaluate_frame
    names = [c.name for c in INPUT_COLUMNS if c.name != "model"] + list(CLUSTER_COLUMNS)
    row = {n: plan[n] for n in names if n in plan and plan[n] is not None}
    cols, tokens, hw_rows = evaluate_frame(pl.DataFrame([row]), "plan", gpus=gpus, kernel_inputs=True)
    c = cols[:, 0]
    sizes = tuple(float(c[r]) for r in (ROW.num_layers, ROW.hidden_size, ROW.num_attention_heads, ROW.num_query_groups, ROW.ffn_hidden_size, ROW.vocab_size, ROW.seq_length, ROW.global_batch_size, ROW.micro_batch_size))
    lay = Layout(int(c[ROW.tp]), int(c[ROW.cp]), int(c[ROW.dp]), int(c[ROW.pp]))
    arch = arch_of_values(c, ROW)
    return sizes, lay, int(c[ROW.recompute]), float(tokens[0]), hw_rows[0].copy(), arch


def simulate_pipeline(forward_s, backward_s, send_s, m: int, vpp: int = 1, recompute_s=None):
    """Event simulation of one flush of Megatron-core's 1F1B (``vpp`` 1) or interleaved 1F1B schedule.

    Parameters
    ----------
    forward_s, backward_s : sequence of float
        Seconds of one micro-batch's forward and backward on each of the ``p`` stages (all its chunks).
    send_s : sequence of float
        Seconds of one pipeline exchange (one chunk, one direction) on each stage; it follows the
        chunk's compute on that stage and blocks it.
    m : int
        Micro-batches (divisible by ``p`` when ``vpp > 1``, as Megatron-core requires).
    vpp : int
        Model chunks per stage.
    recompute_s : sequence of float, optional
        Seconds of one micro-batch's recomputed forward on each stage, run before its backward.

    Returns
    -------
    list of tuple
        ``(stage, start_s, end_s, kind, micro_batch, chunk)``, in order of start per stage.

    Notes
    -----
    Rank ``r`` runs its operations in Megatron-core's order (``schedules.py``,
    ``forward_backward_pipelining_without_interleaving`` / ``..._with_interleaving``): ``w`` warm-up
    forwards (``p - r - 1``; interleaved ``(p - r - 1) 2 + (vpp - 1) p``, at most ``m vpp``), then a
    forward and a backward in turn, then the remaining backwards. Interleaved, forward ``k`` of a rank is
    chunk ``(k // p) % vpp`` of micro-batch ``(k // (p vpp)) p + k % p``, backward ``k`` the same with the
    chunks in reverse order. An operation starts when its rank is free and its input is there: the
    forward of virtual stage ``c p + r`` after the forward (and send) of virtual stage ``c p + r - 1``, a
    backward after the backward (and send) of the next virtual stage, the last virtual stage's after its
    own forward.
    """
    p = len(forward_s)
    vs = int(vpp)
    rec = recompute_s if recompute_s is not None else [0.0] * p
    total = m * vs

    def fwd_id(kk):
        if vs == 1:
            return kk, 0
        return (kk // (p * vs)) * p + kk % p, (kk // p) % vs

    def bwd_id(kk):
        if vs == 1:
            return kk, 0
        return (kk // (p * vs)) * p + kk % p, vs - 1 - (kk // p) % vs

    orders = []
    for r in range(p):
        w = min(p - r - 1 if vs == 1 else (p - r - 1) * 2 + (vs - 1) * p, total)
        ops_r = [("F", *fwd_id(kk)) for kk in range(w)]
        for kk in range(total - w):
            ops_r.append(("F", *fwd_id(w + kk)))
            ops_r.append(("B", *bwd_id(kk)))
        ops_r += [("B", *bwd_id(kk)) for kk in range(total - w, total)]
        orders.append(ops_r)
    done: dict = {}                      # (direction, virtual stage, micro-batch) -> end (after its send)
    free = [0.0] * p
    ptr = [0] * p
    events = []
    last_v = p * vs - 1
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for r in range(p):
            while ptr[r] < len(orders[r]):
                kind, j, c = orders[r][ptr[r]]
                v = c * p + r
                if kind == "F":
                    dep = ("F", v - 1, j) if v > 0 else None
                else:
                    dep = ("B", v + 1, j) if v < last_v else ("F", v, j)
                if dep is not None and dep not in done:
                    break
                t0 = max(free[r], done[dep] if dep is not None else 0.0)
                if kind == "F":
                    t1 = t0 + forward_s[r] / vs
                    events.append((r, t0, t1, "forward", j, c))
                else:
                    t1 = t0
                    if rec[r] > 0.0:
                        t1 = t0 + rec[r] / vs
                        events.append((r, t0, t1, "recompute", j, c))
                    t0, t1 = t1, t1 + backward_s[r] / vs
                    events.append((r, t0, t1, "backward", j, c))
                if send_s[r] > 0.0:
                    events.append((r, t1, t1 + send_s[r], "send", j, c))
                    t1 += send_s[r]
                done[(kind, v, j)] = t1
                free[r] = t1
                ptr[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("pipeline schedule deadlocked")   # not reached for Megatron's orders
    events.sort(key=lambda e: (e[0], e[1]))
    return events


def check_timeline_size(ops: int) -> None:
    """Refuse the timeline (``show --timeline`` or ``--events``) of a plan with more than
    :data:`MAX_TIMELINE_OPS` operations.

    Raises
    ------
    InputError
        Naming the operations, the limit and its cost.
    """
    if ops > MAX_TIMELINE_OPS:
        raise InputError("plan", "--timeline / --events", f"a timeline of {ops:,} operations (2 x pp x micro-batches x vpp)",
                         f"at most {MAX_TIMELINE_OPS:,} operations (the event simulation takes about 5 us each, "
                         "10 s for the limit, on the README's reference machine)",
                         "leave both options out to see the plan's time and memory, or show a plan with fewer "
                         "micro-batches or stages (--where, --row)")


def show_plan(plan: dict, gpus: dict | None = None, timeline: bool | None = None) -> PlanDetail:
    """One plan part by part: time breakdown, memory per stage, timeline (see the module docstring).

    Parameters
    ----------
    plan : dict
        The plan's columns (a row of :func:`~vtrain_fast.analysis.export.read_plan`, or of
        :func:`~vtrain_fast.analysis.evaluate.evaluate_frame`'s output).
    gpus : dict, optional
        GPU name -> GPUPreset (default: the presets).
    timeline : bool, optional
        Simulate the event timeline: None (default) when it has at most :data:`MAX_TIMELINE_OPS`
        operations, True always (refused beyond the limit), False never.

    Returns
    -------
    PlanDetail

    Raises
    ------
    InputError
        A plan the kernel does not price (a shape error, a refused setting); ``timeline`` True for
        a timeline over :data:`MAX_TIMELINE_OPS` operations (:func:`check_timeline_size`).
    """
    (L, h, a, g, f, v, s, B, b), lay, recompute, tokens, hw, arch = kernel_inputs(plan, gpus)
    out = np.full((NUM_OUTPUTS, 1), np.nan)
    status = step.step(int(L), int(h), int(a), int(g), int(f), int(v), int(s), int(B), int(b), lay, recompute,
                    tokens, hw, out, 0, arch)
    if status not in (records.OK, records.OUT_OF_MEMORY):
        raise InputError("plan", "status", int(status), "a plan the model prices (status ok or out_of_memory)",
                         "see `vtrain-fast evaluate` for the plan's status and fix it")
    kernel = {name: float(out[j, 0]) for j, name in enumerate(OUTPUT_NAMES)}
    t = float(lay.tp)
    mb = costs.micro_batch_costs(b, s, h, a, g, f, v, t, hw, arch, float(lay.cp))
    split = costs.split_costs(L, h, a, g, f, v, s, lay, hw, arch)
    sc = pipeline.stage_costs(L, s, B, b, lay, recompute, hw, mb, split)
    _, _, _, _, m_, l_first, l_mid, l_last, _, vs_, rc, sel = pipeline.schedule_sizes(B, b, lay, recompute, hw, split)
    p, vs, m = int(lay.pp), int(vs_), int(round(m_))
    moe = arch.num_experts >= 1.0
    fp8_split = ops.fp8_on(hw)
    n16 = [layer_split.device_layer_count(i, L, float(p), hw, False, 1.0, 0.0) if fp8_split else 0.0 for i in range(p)]
    nm = [layer_split.device_layer_count(i, L, float(p), hw, True, arch.moe_layer_step, arch.moe_first_dense_layers)
          if moe else 0.0 for i in range(p)]
    layers = [l_first if i == 0 else (l_last if i == p - 1 else l_mid) for i in range(p)]
    # per-stage seconds per micro-batch (the kernel's T_i; kind 3: the only stage)
    micro = [float(pipeline.stage_micro_batch_s(sc, 3 if p == 1 else (0 if i == 0 else (2 if i == p - 1 else 1)),
                                                n16[i], nm[i])) for i in range(p)]
    pp_s = float(sc.pp_s)
    t_max = max(micro)
    pipeline_s = m * t_max + (sum(micro) - t_max) / vs
    fwd, rec, bwd = mb.layer_forward_s, rc * mb.layer_forward_s + sel * mb.attention_core_forward_s, mb.layer_backward_s
    share = np.array([fwd, rec, bwd]) / (fwd + rec + bwd)
    work = [x - pp_s for x in micro]
    stage_fwd = [w * share[0] for w in work]
    stage_rec = [w * share[1] for w in work]
    stage_bwd = [w * share[2] for w in work]
    send = pp_s / (2.0 * vs) if p > 1 else 0.0
    n_ops = 2 * p * m * vs
    if timeline:
        check_timeline_size(n_ops)
    simulate = timeline is not False and n_ops <= MAX_TIMELINE_OPS
    events = simulate_pipeline(stage_fwd, stage_bwd, [send] * p, m, vs, stage_rec) if simulate else []
    flush = max(e[2] for e in events) if events else float("nan")
    # after the flush: the exposed DP reduction outside the micro-batches, the optimizer, the host overhead
    tail_dp = max(0.0, kernel["iteration_time_s"] - pipeline_s - kernel["optimizer_s"] - kernel["overhead_s"])
    for r in range(p if events else 0):
        t0 = flush
        for kind, dur in (("dp_reduce", tail_dp), ("optimizer", kernel["optimizer_s"]),
                          ("overhead", kernel["overhead_s"])):
            if dur > 0.0:
                events.append((r, t0, t0 + dur, kind, -1, -1))
                t0 += dur
    ev = pl.DataFrame(events, schema={"stage": pl.Int64, "start_s": pl.Float64, "end_s": pl.Float64,
                                      "kind": pl.String, "micro_batch": pl.Int64, "chunk": pl.Int64}, orient="row")
    mem, in_flight = stage_memory(h, a, g, f, s, B, b, lay, recompute, hw, arch, mb, split, layers, n16, nm)
    stages = pl.DataFrame({"stage": list(range(p)), "layers": [int(x) for x in layers],
                           "bf16_layers": [int(x) for x in n16], "moe_layers": [int(x) for x in nm],
                           "micro_batch_s": micro, "forward_s": stage_fwd, "recompute_s": stage_rec,
                           "backward_s": stage_bwd, "send_s": [2.0 * vs * send] * p, "in_flight": in_flight})
    time_s = {name: kernel[name] for name in TIME_PARTS}
    time_s["iteration_time_s"] = kernel["iteration_time_s"]
    return PlanDetail(dict(plan), time_s, stages, mem, ev, pipeline_s, flush, kernel, n_ops)


def stage_memory(h, a, g, f, s, B, b, lay, recompute, hw, arch, mb, split, layers, n16, nm):
    """Memory of every pipeline stage by part (:data:`MEMORY_PARTS`) and its micro-batches in flight.

    The kernel's memory of each stage, ``0 .. pp - 1`` from its own layer counts
    (:func:`vtrain_fast.model.pipeline.stage_memory`, which the kernel evaluates for the first, the
    second and the last); the dense and expert parameters of a middle stage from its own MoE layers
    (:func:`~vtrain_fast.model.costs.stage_params`), the model states by part from
    :func:`~vtrain_fast.model.memory.state_bytes_per_param`.

    Returns
    -------
    (polars.DataFrame, list of float)
    """
    p = int(lay.pp)
    t = float(lay.tp)
    _, _, dz, zero, m, _, _, _, _, vs, rc, sel = pipeline.schedule_sizes(B, b, lay, recompute, hw, split)
    edz = split.expert_shard_ranks
    w_d, g_d, o_d = memory.state_bytes_per_param(dz, zero, hw)
    w_e, g_e, o_e = memory.state_bytes_per_param(edz, zero, hw)
    p_layer = memory.layer_params_per_rank(h, a, g, f, t, arch)
    p_moe = p_exp = 0.0
    if arch.num_experts >= 1.0:
        ep, etp = experts.expert_sizes(t, hw)
        p_moe, p_exp = memory.moe_layer_params_per_rank(h, a, g, f, t, ep, etp, arch)
    rows, in_flight = [], []
    for i in range(p):
        if i == 0:
            dense, expert = split.params_first, split.expert_params_first
        elif i == p - 1:
            dense, expert = split.params_last, split.expert_params_last
        else:
            dense, expert = costs.stage_params(layers[i], nm[i], p_layer, p_moe, p_exp)
        states, act, layer_act, host_act, n_in, fp8 = pipeline.stage_memory(
            float(i), float(p), m, vs, layers[i], n16[i], nm[i], dense, expert, b, s / float(lay.cp), h, t, dz,
            zero, rc, sel, hw, mb, split)
        weights, grads, optim = (dense * w_d + expert * w_e, dense * g_d + expert * g_e, dense * o_d + expert * o_e)
        gathered = split.zero3_gathered_bytes
        parts = (weights, grads, optim, fp8, gathered, layer_act,
                 act - layer_act, hw[MACHINE.reserved_bytes])
        host_states = (HOST_STATE_BYTES_PER_PARAM * (dense / dz + expert / edz)
                       if ops.param_offload_on(hw, dz) else 0.0)
        rows.append([i] + [x / GiB for x in parts] + [(states + act + hw[MACHINE.reserved_bytes]) / GiB, host_act / GiB,
                                                       host_states / GiB])
        in_flight.append(n_in)
    df = pl.DataFrame(rows, schema=["stage", *MEMORY_PARTS, "total_GiB", *HOST_PARTS], orient="row")
    return df.with_columns(pl.col("stage").cast(pl.Int64)), in_flight


COLOURS = {"forward": "#4C72B0", "recompute": "#8172B3", "backward": "#55A868", "send": "#DD8452",
           "dp_reduce": "#C44E52", "optimizer": "#937860", "overhead": "#8C8C8C"}


# The timeline figure: 14 in at 130 dpi, about this many pixel columns for the time axis.
TIMELINE_WIDTH_IN, TIMELINE_DPI = 14.0, 130
TIMELINE_COLUMNS = int(TIMELINE_WIDTH_IN * TIMELINE_DPI * 0.9)
# Stage rows drawn at full height (0.55 in each); more stages share that height.
TIMELINE_ROWS = 40


def _busy_by_column(starts, ends, edges) -> np.ndarray:
    """Seconds of the intervals ``[starts, ends)`` (disjoint, sorted by start) inside each column
    between consecutive ``edges``: the busy time up to each edge, differenced."""
    if starts.size == 0:
        return np.zeros(edges.size - 1)
    dur = ends - starts
    before = np.concatenate(([0.0], np.cumsum(dur)))           # busy time before interval k
    k = np.searchsorted(starts, edges, side="right") - 1        # the interval that starts last before the edge
    inside = np.where(k >= 0, np.clip(edges - starts[np.maximum(k, 0)], 0.0, dur[np.maximum(k, 0)]), 0.0)
    upto = before[np.maximum(k, 0)] * (k >= 0) + inside
    return np.diff(upto)


# Pixel rows of one stage in the aggregated timeline (a share of a column to 1 / this).
TIMELINE_SUBROWS = 10


def _column_image(ev: pl.DataFrame, p: int, span: float, kinds) -> np.ndarray:
    """RGB image of the timeline, :data:`TIMELINE_SUBROWS` rows per stage (stage 0 on top) and
    :data:`TIMELINE_COLUMNS` columns over ``[0, span]``: in each column a stage's rows are filled
    bottom-up with each kind's colour in proportion to the time it takes in that column, idle
    (white) last, and the stage's top row left white to separate the stages."""
    from matplotlib.colors import to_rgb
    edges = np.linspace(0.0, span, TIMELINE_COLUMNS + 1)
    busy = np.zeros((len(kinds), p, TIMELINE_COLUMNS))
    for j, kind in enumerate(kinds):
        sub = ev.filter(pl.col("kind") == kind).sort("stage", "start_s")
        for (stage,), part in sub.group_by(["stage"], maintain_order=True):
            busy[j, int(stage)] = _busy_by_column(part["start_s"].to_numpy(), part["end_s"].to_numpy(), edges)
    upto = np.cumsum(busy, axis=0) / np.diff(edges)[None, None, :]        # share up to each kind
    rows = TIMELINE_SUBROWS - 1
    centre = (np.arange(rows)[::-1] + 0.5) / rows                       # top row first
    which = (upto[:, :, None, :] < centre[None, None, :, None]).sum(axis=0)  # (stage, row, column): kind, len = idle
    palette = np.array([to_rgb(COLOURS[kd]) for kd in kinds] + [to_rgb("white")])
    img = np.ones((p, TIMELINE_SUBROWS, TIMELINE_COLUMNS, 3))
    img[:, 1:] = palette[which]
    return img.reshape(p * TIMELINE_SUBROWS, TIMELINE_COLUMNS, 3)


def plot_timeline(detail: PlanDetail, path) -> None:
    """Write the timeline of one iteration as a PNG: one row per pipeline stage (stage 0 on top),
    coloured boxes by kind, micro-batch numbers where they fit, idle time white.

    Each kind is one collection of boxes (not an artist per event). When a stage has more events
    than the figure has pixel columns (:data:`TIMELINE_COLUMNS`) the boxes could not be told apart:
    the timeline is drawn as an image instead, each column of a stage coloured by the kind that
    takes most of that column's time, and the figure says so.

    Raises
    ------
    InputError
        The plan has no simulated timeline (over :data:`MAX_TIMELINE_OPS`, :func:`check_timeline_size`).
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.collections import PolyCollection
    from matplotlib.patches import Patch
    check_timeline_size(detail.timeline_ops)
    ev = detail.events
    p = int(ev["stage"].max()) + 1
    span = detail.makespan_s
    kinds = [kd for kd in EVENT_KINDS if (ev["kind"] == kd).any()]
    per_stage = int(ev.group_by("stage").len()["len"].max())
    fig, ax = plt.subplots(figsize=(TIMELINE_WIDTH_IN, 1.0 + 0.55 * min(p, TIMELINE_ROWS)))
    note = ""
    if per_stage > TIMELINE_COLUMNS:
        ax.imshow(_column_image(ev, p, span, kinds), extent=(0.0, span, -0.5, p - 0.5), aspect="auto",
                  interpolation="nearest")
        note = (f"{ev.height:,} events, up to {per_stage:,} per stage, more than the figure's {TIMELINE_COLUMNS:,} "
                f"pixel columns: each column ({span / TIMELINE_COLUMNS * 1e3:.3g} ms) of a stage is filled bottom-up "
                "with each kind's share of its time")
    else:
        for kind in kinds:
            sub = ev.filter(pl.col("kind") == kind)
            x0, x1 = sub["start_s"].to_numpy(), sub["end_s"].to_numpy()
            y = (p - 1 - sub["stage"].to_numpy()).astype(float)
            verts = np.stack([np.column_stack([x0, y - 0.4]), np.column_stack([x0, y + 0.4]),
                              np.column_stack([x1, y + 0.4]), np.column_stack([x1, y - 0.4])], axis=1)
            wide = (x1 - x0) > span / 300
            ax.add_collection(PolyCollection(verts, facecolors=COLOURS[kind],
                                             edgecolors=np.where(wide, "white", "none").tolist(), linewidths=0.4))
            if kind in ("forward", "backward"):
                mb = sub["micro_batch"].to_numpy()
                for i in np.flatnonzero(((x1 - x0) > span / 120) & (mb >= 0)):
                    ax.text((x0[i] + x1[i]) / 2, y[i], str(mb[i]), ha="center", va="center", fontsize=6,
                            color="white")
    step = -(-p // TIMELINE_ROWS)
    ticks = list(range(0, p, step))
    ax.set_yticks([p - 1 - s for s in ticks])
    ax.set_yticklabels([f"stage {s}" for s in ticks])
    ax.set_xlim(0, span * 1.01)
    ax.set_ylim(-0.6, p - 0.4)
    ax.set_xlabel("time in the iteration (s)" + (f"\n{note}" if note else ""), fontsize=9 if note else None)
    fig.legend(handles=[Patch(color=COLOURS[kd], label=kd.replace("_", " ")) for kd in kinds]
               + [Patch(facecolor="white", edgecolor="grey", label="idle (bubble)")],
               loc="lower center", ncol=len(kinds) + 1, fontsize=8, frameon=False)
    ax.set_title(f"{detail.title()}\niteration {detail.time_s['iteration_time_s']:.3f} s (model), "
                 f"{detail.makespan_s:.3f} s (simulated timeline)", fontsize=9, parse_math=False)
    height = 1.0 + 0.55 * min(p, TIMELINE_ROWS)
    fig.tight_layout(rect=(0, min(0.15, (0.6 if note else 0.35) / height) if p > 2 else 0.15, 1, 1))
    fig.savefig(path, dpi=TIMELINE_DPI, format="png")
    plt.close(fig)
