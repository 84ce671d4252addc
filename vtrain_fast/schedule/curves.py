"""Each job's step time against the nodes it is given, from one sweep over every job's model and
every cluster size (:func:`job_curves`).

The sweep
---------
One sweep spec (:func:`curve_spec_text`) over the trace's models and global batches, every
cluster size of whole nodes ``k x gpus_per_node`` for ``k = 1 .. num_nodes``, tp 1, 2, 4, 8 (at
most a node), pp among :data:`PP_VALUES` (at most the model's layers), micro-batch 1, 2, 4, 8 and
recomputation none, full, selective, with the training settings of
:data:`vtrain_fast.analysis.optimal.DEFAULT_SETTINGS` (current Megatron-LM recipes:
FlashAttention, sequence parallelism, the distributed optimizer, an overlapped gradient reduce;
``settings`` changes any ``[training]`` setting). Only points of status ``ok`` count (they fit in
memory and obey Megatron-LM's rules: dp divides the global batch over the micro-batch, ...).

A *plan family* is one ``(tp, pp, micro_batch_size, recompute)``: a job of that family on ``k``
nodes runs ``dp = k gpus_per_node / (tp pp)``. :attr:`JobCurves.step_s` holds the step time of
every (job kind, family, nodes); :meth:`JobCurves.curve` turns it into the curve a policy reads:

* plan-aware (``family=None``): on ``k`` nodes the fastest family;
* a plan fixed (the DP-only baseline, ``family`` given): the fastest of the families with that
  family's tp, pp and recompute (the micro-batch is free: the global batch stays, the per-GPU
  batch follows dp, as ElasticFlow keeps a job's global batch when it scales);

then made monotone: a job given ``k`` nodes runs on the ``j <= k`` of the fastest step time (it
can leave nodes idle, it never runs slower with more), and ``used[k] = j`` says which.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..io.errors import InputError

TP_VALUES = (1, 2, 4, 8)
PP_VALUES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
MICRO_BATCH_VALUES = (1, 2, 4, 8)
CHUNK_POINTS = 1 << 17
# Most nodes of a cluster (the sweep grows with them: 4,096 nodes and six job kinds are ~10^7
# plans, a few seconds).
MAX_NODES = 4096


@dataclass(frozen=True)
class JobCurves:
    """Step times of every job kind on every number of nodes.

    Attributes
    ----------
    kinds : list of tuple
        ``(model, global_batch_size)`` of each job kind, the first axis of :attr:`step_s`.
    gpu : str
        GPU preset of the cluster.
    gpus_per_node : int
    num_nodes : int
        Nodes of the cluster: the last axis of :attr:`step_s` runs ``0 .. num_nodes``.
    families : numpy.ndarray
        ``int64``, shape ``(F, 4)``: tp, pp, micro_batch_size and the recompute code
        (:data:`vtrain_fast.plan.spec.RECOMPUTE_VALUES`) of each plan family.
    step_s : numpy.ndarray
        ``float64``, shape ``(K, F, num_nodes + 1)``: seconds per optimizer step; ``inf`` where the
        family has no feasible plan on that many nodes (and at 0 nodes).
    index : numpy.ndarray
        ``int64``, same shape: the flat grid index of that point (``-1`` where none), for its full
        row (:meth:`row`).
    grid : Grid
        The sweep's grid (:func:`vtrain_fast.plan.grid.build_grid`).
    points, feasible : int
        Points priced, and those of status ok.
    """

    kinds: list
    gpu: str
    gpus_per_node: int
    num_nodes: int
    families: np.ndarray
    step_s: np.ndarray
    index: np.ndarray
    grid: object
    points: int
    feasible: int

    def kind(self, model: str, global_batch_size: int) -> int:
        """The position of ``(model, global_batch_size)`` in :attr:`kinds`."""
        return self.kinds.index((model, int(global_batch_size)))

    def curve(self, kind: int, family: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The monotone step-time curve of job kind ``kind`` (module docstring): over every
        family, or (``family`` given) over the families of its tp, pp and recompute.

        Returns
        -------
        (step_s, used, family) : numpy.ndarray
            Each of shape ``(num_nodes + 1,)``: on ``k`` nodes given, the step time (``inf``: no
            feasible plan on ``k`` nodes or fewer), the nodes the job runs on (``0`` where none)
            and its plan family (``-1`` where none).
        """
        allowed = np.arange(len(self.families)) if family is None else self.same_plan(family)
        sub = self.step_s[kind][allowed]
        fam = allowed[np.argmin(sub, axis=0)]
        t = self.step_s[kind][fam, np.arange(self.num_nodes + 1)]
        best_t = np.full(self.num_nodes + 1, np.inf)
        used = np.zeros(self.num_nodes + 1, dtype=np.int64)
        best_f = np.full(self.num_nodes + 1, -1, dtype=np.int64)
        for k in range(1, self.num_nodes + 1):
            if t[k] < best_t[k - 1]:
                best_t[k], used[k], best_f[k] = t[k], k, fam[k]
            else:
                best_t[k], used[k], best_f[k] = best_t[k - 1], used[k - 1], best_f[k - 1]
        return best_t, used, best_f

    def same_plan(self, family: int) -> np.ndarray:
        """The families of ``family``'s tp, pp and recompute (any micro-batch), int64 indices."""
        f = self.families
        return np.flatnonzero((f[:, 0] == f[family, 0]) & (f[:, 1] == f[family, 1]) & (f[:, 3] == f[family, 3]))

    def smallest_family(self, kind: int) -> int:
        """The DP-only baseline's plan of job kind ``kind``: the fastest family on the fewest
        nodes any family fits on (a job submitted with the plan that fits it, as ElasticFlow
        takes a job's model-parallel setup as given and scales only its data parallelism; its
        tp, pp and recompute stay, :meth:`curve`). ``-1`` when no family fits on the cluster."""
        ok = np.isfinite(self.step_s[kind])
        if not ok.any():
            return -1
        k = int(np.flatnonzero(ok.any(axis=0))[0])
        return int(np.argmin(self.step_s[kind, :, k]))

    def row(self, kind: int, family: int, nodes: int) -> dict:
        """The full row (every output column of the cost model) of one point."""
        import polars as pl

        from ..engine.chunks import evaluate_chunk
        i = int(self.index[kind, family, nodes])
        if i < 0:
            raise ValueError(f"no feasible point for kind {kind}, family {family}, {nodes} nodes")
        return pl.from_arrow(evaluate_chunk(self.grid, i, 1)).row(0, named=True)


def curve_spec_text(models, batches, gpu: str, gpus_per_node: int, num_nodes: int, settings: dict,
                    max_layers: int) -> str:
    """The sweep spec (TOML) of the curves
    (:func:`vtrain_fast.analysis.optimal.plan_search_text` over whole nodes)."""
    from ..analysis.optimal import plan_search_text
    from ..plan.spec import RECOMPUTE_VALUES
    return plan_search_text("schedule-curves", models, gpu, [k * gpus_per_node for k in range(1, num_nodes + 1)],
                            [t for t in TP_VALUES if t <= gpus_per_node], [p for p in PP_VALUES if p <= max_layers],
                            batches, settings, MICRO_BATCH_VALUES, RECOMPUTE_VALUES)


def job_curves(kinds, gpu: str, num_gpus: int, settings: dict | None = None, calibration: dict | None = None,
               gpu_presets: dict | None = None, memory_margin: float | None = None) -> JobCurves:
    """Price every job kind on every number of whole nodes of the cluster, in one sweep.

    Parameters
    ----------
    kinds : sequence of (str, int)
        ``(model preset, global_batch_size)`` of the jobs.
    gpu : str
        GPU preset of the cluster (or of ``gpu_presets``).
    num_gpus : int
        GPUs of the cluster, a multiple of the preset's ``gpus_per_node``.
    settings : dict, optional
        ``[training]`` settings on top of :data:`~vtrain_fast.analysis.optimal.DEFAULT_SETTINGS`.
    calibration, gpu_presets : dict, optional
        As :func:`vtrain_fast.plan.spec.parse_spec`'s.
    memory_margin : float, optional
        Leave out plans whose memory headroom is below this fraction of the GPU's HBM (as
        ``pareto --memory-margin``).

    Returns
    -------
    JobCurves

    Raises
    ------
    InputError
        An unknown GPU, a cluster that is not whole nodes, a bad setting.
    """
    from ..analysis.optimal import DEFAULT_SETTINGS, OWN_TRAINING_KEYS
    from ..engine.chunks import RowBuffers
    from ..hardware.gpus import PRESETS
    from ..analysis.query import check_memory_margin
    from ..model.records import OK
    from ..plan.grid import build_grid
    from ..plan.models import MODEL_PRESETS
    from ..plan.spec import RECOMPUTE_VALUES, parse_spec
    known = gpu_presets or PRESETS
    if gpu not in known:
        from ..io.errors import did_you_mean
        raise InputError("command line", "--cluster", gpu, "GPU:COUNT with a GPU preset (vtrain-fast presets)",
                         did_you_mean(gpu, known, "e.g. --cluster a100-sxm4-80gb:1024"))
    gpn = known[gpu].gpus_per_node
    if num_gpus % gpn or num_gpus <= 0 or num_gpus // gpn > MAX_NODES:
        raise InputError("command line", "--cluster", f"{gpu}:{num_gpus}", f"a whole number of nodes of {gpn} GPUs, "
                         f"at most {MAX_NODES:,} nodes",
                         f"e.g. {gpu}:{max(gpn, min(num_gpus, MAX_NODES * gpn) // gpn * gpn)}")
    check_memory_margin("command line", memory_margin)
    merged = dict(DEFAULT_SETTINGS)
    for k, v in (settings or {}).items():
        if k in OWN_TRAINING_KEYS:
            raise InputError("command line", "--set", f"{k}={v}", "a training setting schedule does not set itself",
                             "schedule searches micro-batch and recompute; the trace gives the batch and tokens")
        merged[k] = v
    kinds = [(str(m), int(b)) for m, b in kinds]
    models = sorted({m for m, _ in kinds})
    batches = sorted({b for _, b in kinds})
    max_layers = max(MODEL_PRESETS[m].num_layers for m in models)
    text = curve_spec_text(models, batches, gpu, gpn, num_gpus // gpn, merged, max_layers)
    spec = parse_spec(text, "schedule (the curves' sweep spec; --set KEY=VALUE)", calibration, gpu_presets)
    grid = build_grid(spec)
    tps = [t for t in TP_VALUES if t <= gpn]
    pps = [p for p in PP_VALUES if p <= max_layers]
    fams = np.array([(t, p, b, r) for t in tps for p in pps for b in MICRO_BATCH_VALUES
                     for r in range(len(RECOMPUTE_VALUES))], dtype=np.int64)
    n_nodes = num_gpus // gpn
    model_pos = {m: i for i, m in enumerate(grid.model_names)}
    kind_of = np.full((len(grid.model_names), len(batches)), -1, dtype=np.int64)
    for k, (m, b) in enumerate(kinds):
        kind_of[model_pos[m], batches.index(b)] = k
    step_s = np.full((len(kinds), len(fams), n_nodes + 1), np.inf)
    index = np.full(step_s.shape, -1, dtype=np.int64)
    tp_pos = np.zeros(max(tps) + 1, dtype=np.int64)
    tp_pos[tps] = np.arange(len(tps))
    pp_pos = np.zeros(max(pps) + 1, dtype=np.int64)
    pp_pos[pps] = np.arange(len(pps))
    mbs_pos = np.zeros(max(MICRO_BATCH_VALUES) + 1, dtype=np.int64)
    mbs_pos[list(MICRO_BATCH_VALUES)] = np.arange(len(MICRO_BATCH_VALUES))
    gbs_pos = {b: i for i, b in enumerate(batches)}
    feasible = 0
    flat_t, flat_i = step_s.reshape(-1), index.reshape(-1)
    b = RowBuffers(min(CHUNK_POINTS, grid.num_points))
    for start in range(0, grid.num_points, b.capacity):
        n = min(b.capacity, grid.num_points - start)
        b.evaluate(grid, start, n)
        ok = np.flatnonzero(b.status[:n] == OK)
        if memory_margin:
            cap = spec.gpus[0].hbm_GiB
            ok = ok[cap - b.output("memory_per_gpu_GiB", ok) >= memory_margin * cap]
        gb = np.array([gbs_pos[int(v)] for v in b.input("global_batch_size", ok)], dtype=np.int64)
        kind = kind_of[b.input("model_index", ok), gb] if ok.size else np.zeros(0, np.int64)
        ok, kind = ok[kind >= 0], kind[kind >= 0]
        feasible += ok.size
        fam = ((tp_pos[b.input("tp", ok)] * len(pps) + pp_pos[b.input("pp", ok)]) * len(MICRO_BATCH_VALUES)
               + mbs_pos[b.input("micro_batch_size", ok)]) * len(RECOMPUTE_VALUES) + b.input("recompute", ok)
        key = (kind * len(fams) + fam) * (n_nodes + 1) + b.input("num_gpus", ok) // gpn
        t = b.output("iteration_time_s", ok)
        np.minimum.at(flat_t, key, t)
        hit = t == flat_t[key]
        flat_i[key[hit]] = start + ok[hit]
    return JobCurves(kinds=kinds, gpu=gpu, gpus_per_node=gpn, num_nodes=n_nodes, families=fams, step_s=step_s,
                     index=index, grid=grid, points=grid.num_points, feasible=feasible)


def family_text(curves: JobCurves, family: int) -> str:
    """``tp 8 pp 2 mbs 1 full``."""
    from ..plan.spec import RECOMPUTE_VALUES
    tp, pp, mbs, rc = (int(v) for v in curves.families[family])
    return f"tp {tp} pp {pp} mbs {mbs} {RECOMPUTE_VALUES[rc]}"
