"""Compute-optimal sizing: the model size, token count, plan and cluster that minimise the
predicted loss within a budget (``vtrain-fast optimal``), next to the naive answer at 100 %
utilisation.

The search
----------
**Shapes** (dense GPT-style decoders, :func:`shape_family`): ``num_sizes`` target sizes
log-spaced from ``min_params`` to ``max_params``. For a target ``N``: heads of width 128, the
hidden size ``h`` the multiple of 1,024 (so that every tensor-parallel size up to 8 divides the
``h / 128`` heads) nearest to ``(N R / 12)^(1/3)``, the width at aspect ratio ``h / L = R``
(``aspect_ratio``, default 128: GPT-3 175B's 12,288 / 96; Kaplan et al. 2020, Fig. 5, find the
loss within a few per cent for aspect ratios from about 20 to 200); then the number of layers
``L``, a multiple of 4 and at least 4, that brings ``12 L h^2 + (V + s) h`` nearest to ``N``
(so the aspect ratio moves around ``R`` with the rounding of ``h``). MLP ``4 h`` (GeLU),
LayerNorm, learned positions, biases, a tied head, GPT-2/3's vocabulary (50,257) and
``seq_length`` 2,048 unless given: the shapes of :data:`~vtrain_fast.plan.models.DEFAULT_VOCAB_SIZE`
and Megatron-LM's defaults. Shapes that round to the same ``(L, h)`` are searched once.

**Plans** of every shape: tp in 1, 2, 4, 8 (at most a node), pp among 1, 2, 3, 4, 6, 8, 12,
16, 24, 32, 48, 64 (at most ``max_pp``; it must divide the layers), micro-batch 1, 2, 4, 8,
recomputation none, selective or full, one global batch of ``batch_tokens / seq_length``
sequences (default 4 Mi tokens: 2,048 sequences of 2,048, Llama 2's 4M-token batch), and the
training settings :data:`DEFAULT_SETTINGS` (FlashAttention, sequence parallelism, the
distributed optimizer and an overlapped gradient reduce, as current Megatron-LM recipes run;
``settings`` changes or adds any ``[training]`` setting of a sweep spec). dp is what the
cluster leaves: the cluster sizes searched are the ``tp x pp x dp`` with dp a divisor of the
global batch, at most the GPUs allowed: with ``gpus`` the two largest such sizes per
``tp x pp`` up to ``gpus``, and ``gpus`` itself with the global batches within
:data:`BATCH_TOLERANCE` of the rule's that ``dp = gpus / (tp x pp)`` divides
(:func:`whole_cluster_batches`; a job may still leave GPUs idle, and the table says how many it
uses); with a money or GPU-hour budget every such size up to ``max_gpus``.

Budget arithmetic
-----------------
One sweep prices every point (iteration time ``t`` on ``n`` GPUs, status ``ok`` only: it fits
in memory and obeys Megatron-LM's rules); the time of a step does not depend on the token
count, so a plan's tokens follow from the budget:

* ``budget_usd`` (price ``p`` = the GPU preset's ``usd_per_gpu_hour``) or ``gpu_hours``:
  ``steps = floor(min(G_s / (n t), T_max / t))`` with ``G_s`` the budget in GPU-seconds
  (``3600 usd / p`` or ``3600 gpu_hours``) and ``T_max = 86400 max_days``: the budget, unless
  the plan cannot spend it within ``max_days``.
* ``gpus`` and ``days``: ``steps = floor(86400 days / t)`` on ``n <= gpus`` GPUs.

Tokens ``D = steps x global batch x seq_length`` (whole steps, so never over the budget), days
``steps t / 86400``, GPU-hours ``n steps t / 3600``, cost ``GPU-hours x p``, loss ``L(N, D)`` of
the chosen fit (:data:`~vtrain_fast.plan.loss.LOSS_FITS`). The best plan of a shape is the one
that buys the most tokens (ties: the fewest GPU-seconds); the optimum is the shape whose best
plan has the lowest loss.

Inference-aware sizing
----------------------
With ``inference_tokens`` ``D_inf`` (Sardana, Portes, Doubov, Frankle 2024, "Beyond
Chinchilla-Optimal", arXiv:2401.00448: the model that is cheapest over its lifetime is smaller
and trained longer than Chinchilla's), the budget also pays for serving: a shape of ``N``
parameters costs ``2 N D_inf`` FLOPs to serve, on the same GPU type at ``inference_mfu`` of its
bf16 peak (:data:`DEFAULT_INFERENCE_MFU`, an assumption), and trains on what is left,
``G_s - 2 N D_inf / (peak x inference_mfu)`` GPU-seconds. Only with a money or GPU-hour budget
(a cluster-days budget pays for training time only). The naive answer is the paper's compute
formulation: the lowest loss at ``6 N D + 2 N D_inf = C``, both at 100 % of the peak
(:meth:`~vtrain_fast.plan.loss.LossFit.optimal_with_inference`).

The naive answer spends the same budget at 100 % utilisation: FLOPs ``C`` = GPU-seconds x the
GPU's dense peak (bf16, or FP8 under ``precision = "fp8"``), ``C = 6 N D``, and the fit's
compute-optimal ``N, D`` at that ``C`` (Hoffmann et al. 2022, Eq. 4); its "days" assume the
whole budget's GPUs (``gpus``) or are not given (a money or GPU-hour budget names no cluster).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from ..io.errors import InputError, did_you_mean
from ..model.records import AXIS, INPUT, OUTPUT

# Training settings of every searched plan unless ``settings`` says otherwise ([training] keys
# of a sweep spec).
DEFAULT_SETTINGS = {"use_flash_attn": True, "sequence_parallel": True, "distributed_optimizer": True,
                    "overlap_grad_reduce": True}
# [training] keys optimal sets itself (its own options), refused in ``settings``.
OWN_TRAINING_KEYS = ("num_tokens", "global_batch_size", "micro_batch_size", "recompute")
TP_VALUES = (1, 2, 4, 8)
PP_VALUES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
MICRO_BATCH_VALUES = (1, 2, 4, 8)
RECOMPUTE_SEARCHED = ("none", "selective", "full")
HEAD_DIM = 128
WIDTH_STEP = 1024            # hidden sizes: multiples of 8 heads of 128
LAYER_STEP = 4
SECONDS_PER_DAY = 86400.0
# Tokens the sweep prices the points at (any value: the step time does not depend on it).
PRICED_TOKENS = 1e12
CHUNK_POINTS = 1 << 17
# Inference-aware sizing: the serving GPUs' utilisation of the bf16 dense peak unless
# ``inference_mfu`` says otherwise. An assumption, not a measurement: autoregressive decoding is
# memory-bound and runs far below a training step's utilisation, prefill close to it; state your own.
DEFAULT_INFERENCE_MFU = 0.3
# With ``gpus``: other global batches searched, at most this far from the rule's (a fraction).
BATCH_TOLERANCE = 0.25


@dataclass(frozen=True)
class OptimalResult:
    """What :func:`optimal` found.

    Attributes
    ----------
    fit : LossFit
        The loss fit used.
    gpu : str
        GPU preset.
    budget : dict
        ``kind`` (``usd`` | ``gpu_hours`` | ``cluster``), ``budget_usd``, ``gpu_hours`` (GPU-h,
        ``None`` for ``cluster``), ``gpus``, ``days``, ``max_gpus``, ``max_days``.
    best : dict
        The curve's row of the optimum (column meanings: :data:`CURVE_COLUMNS`).
    naive : dict
        The naive answer at 100 % utilisation: ``num_parameters``, ``num_tokens``,
        ``tokens_per_parameter``, ``flops``, ``num_gpus`` and ``train_days`` (``None`` without
        ``gpus``), ``gpu_hours``, ``cost_usd``, ``mfu`` (1.0), ``loss``.
    naive_size : dict or None
        The curve's row of the searched shape nearest (in log N) to the naive size, trained
        with its best plan on the same budget; ``None`` when the naive size lies outside the
        searched range.
    curve : polars.DataFrame
        One row per shape with a feasible plan: its best plan and what the budget buys;
        ``optimum`` marks the optimum.
    warnings : list of str
        The optimum on the edge of the searched range, and which option widens it.
    notes : list of str
    points, feasible : int
        Plans priced, and those of status ok.
    shapes : int
        Shapes searched.
    seconds : float
        Wall time of the search, s.
    """

    fit: object
    gpu: str
    budget: dict
    best: dict
    naive: dict
    naive_size: dict | None
    curve: pl.DataFrame
    warnings: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    points: int = 0
    feasible: int = 0
    shapes: int = 0
    seconds: float = 0.0


CURVE_COLUMNS = {
    "model": "shape name (custom-<L>L-<h>h-<a>a-<s>s)",
    "num_layers": "layers L", "hidden_size": "width h", "num_attention_heads": "heads (h / 128)",
    "ffn_hidden_size": "MLP width (4 h)", "seq_length": "tokens per sequence", "vocab_size": "vocabulary",
    "num_parameters": "parameters N (the cost model's count)",
    "gpu": "GPU preset", "num_gpus": "GPUs the plan uses", "num_nodes": "nodes",
    "tp": "tensor-parallel size", "pp": "pipeline-parallel size", "dp": "data-parallel size",
    "micro_batch_size": "sequences", "global_batch_size": "sequences", "recompute": "activation recomputation",
    "iteration_time_s": "s per optimizer step", "tokens_per_s": "tokens/s", "mfu": "model FLOPs utilisation",
    "memory_per_gpu_GiB": "GiB, fullest GPU",
    "memory_headroom_GiB": "GiB left of the GPU's HBM",
    "memory_tight": "headroom below the memory margin (--memory-margin, else 5 %)",
    "num_steps": "optimizer steps the budget buys", "num_tokens": "tokens D = steps x batch x seq_length",
    "tokens_per_parameter": "D / N", "flops": "6 N D, FLOPs", "train_days": "days",
    "gpu_hours": "GPU-h", "cost_usd": "USD (GPU-h x usd_per_gpu_hour)",
    "loss": "L(N, D) of the fit, nats/token", "fit": "loss fit", "limited_by": "budget | days (the time cap binds)",
    "inference_tokens": "tokens served (--inference-tokens)",
    "inference_gpu_hours": "GPU-h serving them: 2 N D_inf / (peak x --inference-mfu)",
    "total_cost_usd": "USD, training and serving",
    "optimum": "true on the optimum's row",
}


def _fit(name: str):
    from ..plan.loss import LOSS_FITS
    if name not in LOSS_FITS:
        raise InputError("command line", "--fit", name, "one of " + ", ".join(LOSS_FITS),
                         did_you_mean(name, LOSS_FITS, "--fit epoch (Besiroglu et al. 2024) or --fit hoffmann"))
    return LOSS_FITS[name]


def _positive(key: str, value, lo: float = 0.0, hi: float = 1e30, whole: bool = False) -> float:
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
          and lo < value <= hi and (not whole or float(value).is_integer()))
    if not ok:
        what = "a whole number" if whole else "a number"
        raise InputError("command line", key, value, f"{what} above {lo:g} and at most {hi:g}",
                         f"give {key} a value in that range (see vtrain-fast optimal --help)")
    return int(value) if whole else float(value)


def estimated_params(num_layers: int, hidden_size: int, seq_length: int, vocab_size: int) -> float:
    """``12 L h^2 + 13 L h + (V + s) h + 2 h``: a GPT layer's QKV, projection and 4h MLP weights
    and biases, two LayerNorms, the (tied) embedding, learned positions and the final norm
    (the family's rounding target; the tables show the cost model's own count)."""
    h = float(hidden_size)
    return 12.0 * num_layers * h * h + 13.0 * num_layers * h + (vocab_size + seq_length) * h + 2.0 * h


def shape_family(min_params: float, max_params: float, num_sizes: int, seq_length: int = 2048,
                 aspect_ratio: float = 128.0, vocab_size: int | None = None) -> list:
    """The searched shapes, smallest first (the rule: this module's docstring, "The search").

    Parameters
    ----------
    min_params, max_params : float
        Range of target sizes, parameters.
    num_sizes : int
        Log-spaced targets (shapes that round alike are kept once).
    seq_length : int
        Tokens per sequence.
    aspect_ratio : float
        Target ``h / L``.
    vocab_size : int, optional
        Default :data:`~vtrain_fast.plan.models.DEFAULT_VOCAB_SIZE` (GPT-2/3's 50,257).

    Returns
    -------
    list of ModelShape
    """
    from ..plan.models import DEFAULT_VOCAB_SIZE, ModelShape
    from ..plan.spec import shape_name
    v = vocab_size or DEFAULT_VOCAB_SIZE
    seen, shapes = set(), []
    for n in np.geomspace(min_params, max_params, num_sizes):
        h_ideal = (n * aspect_ratio / 12.0) ** (1.0 / 3.0)
        h = WIDTH_STEP * max(1, round(h_ideal / WIDTH_STEP))
        per_layer = estimated_params(1, h, 0, 0)
        layers = (n - (v + seq_length) * h) / per_layer
        L = max(LAYER_STEP, LAYER_STEP * round(layers / LAYER_STEP))
        if (L, h) in seen:
            continue
        seen.add((L, h))
        kw = dict(num_layers=L, hidden_size=h, num_attention_heads=h // HEAD_DIM, seq_length=seq_length)
        shapes.append(ModelShape(name=shape_name(kw), vocab_size=v, **kw).resolved())
    shapes.sort(key=lambda m: estimated_params(m.num_layers, m.hidden_size, m.seq_length, m.vocab_size))
    return shapes


def cluster_sizes(tps, pps, batch: int, max_gpus: int, top: int | None) -> list[int]:
    """Cluster sizes ``tp x pp x dp`` with dp a divisor of the global batch ``batch``
    (sequences), at most ``max_gpus``: the ``top`` largest per ``tp x pp`` (all when
    ``top`` is None), ascending."""
    dps = [d for d in range(1, batch + 1) if batch % d == 0]
    sizes = set()
    for m in sorted({t * p for t in tps for p in pps}):
        fit = [m * d for d in dps if m * d <= max_gpus]
        sizes.update(fit if top is None else fit[-top:])
    return sorted(sizes)


def whole_cluster_batches(tps, pps, batch: int, gpus: int) -> list[int]:
    """Global batch sizes (sequences) searched on ``gpus`` GPUs: ``batch``, and for every
    ``tp x pp`` dividing ``gpus`` the multiple of ``dp = gpus / (tp x pp)`` nearest to ``batch``
    when within :data:`BATCH_TOLERANCE` of it (so that a job can use every GPU), ascending."""
    out = {batch}
    for m in {t * p for t in tps for p in pps}:
        if gpus % m == 0:
            dp = gpus // m
            b = dp * max(1, round(batch / dp))
            if abs(b / batch - 1.0) <= BATCH_TOLERANCE:
                out.add(b)
    return sorted(out)


def _toml_value(where: str, key: str, value) -> str:
    import json
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)) and math.isfinite(value):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)) and value:
        return "[" + ", ".join(_toml_value(where, key, v) for v in value) + "]"
    raise InputError(where, key, str(value), "true, false, a number, a string or a list of them")


# The keys an ``optimal --config`` file's ``[optimal]`` table takes: :func:`optimal`'s keyword
# arguments (a study's budget, GPU, fit and search ranges; ``settings`` a table of [training] settings).
CONFIG_KEYS = ("budget_usd", "gpu_hours", "gpus", "days", "gpu", "fit", "min_params", "max_params", "num_sizes",
               "seq_length", "aspect_ratio", "batch_tokens", "max_gpus", "max_days", "max_pp", "inference_tokens",
               "inference_mfu", "memory_margin", "settings")


def read_config(path) -> dict:
    """The ``[optimal]`` table of a study file (``optimal --config``): :func:`optimal`'s keyword
    arguments by name (:data:`CONFIG_KEYS`), e.g. ``sweeps/case-compute-optimal-3360xa100-30d.toml``.
    The values are checked by :func:`optimal` as the command line's are.

    Raises
    ------
    InputError
        Not a TOML file, no ``[optimal]`` table, an unknown key, or ``settings`` not a table.
    """
    from ..io.inputs import read_toml
    from ..io.errors import did_you_mean
    doc = read_toml(path, "optimal study file")
    extra = [k for k in doc if k not in ("optimal", "name", "description")]
    if "optimal" not in doc or not isinstance(doc["optimal"], dict) or extra:
        raise InputError(str(path), extra[0] if extra else "[optimal]", doc.get(extra[0]) if extra else None,
                         "an [optimal] table (and name / description)",
                         "write the budget and search under [optimal], e.g. gpus = 3360 and days = 30")
    table = doc["optimal"]
    for k in table:
        if k not in CONFIG_KEYS:
            raise InputError(str(path), f"optimal.{k}", table[k], "one of " + ", ".join(CONFIG_KEYS),
                             did_you_mean(k, CONFIG_KEYS, "see `vtrain-fast optimal --help` (the same names with _)"))
    if "settings" in table and not isinstance(table["settings"], dict):
        raise InputError(str(path), "optimal.settings", table["settings"], "a table of [training] settings",
                         "e.g. [optimal.settings] then use_flash_attn = false")
    return dict(table)


def parse_setting(text: str) -> tuple[str, object]:
    """``KEY=VALUE`` (``--set``) as ``(key, value)``, the value read as TOML (``true``,
    ``2``, ``"fp8"``; a bare word is a string).

    Raises
    ------
    InputError
        Without ``=``, or a value TOML cannot read.
    """
    import tomllib
    key, eq, raw = text.partition("=")
    key, raw = key.strip(), raw.strip()
    if not eq or not key or not raw:
        raise InputError("command line", "--set", text, "KEY=VALUE, a [training] setting of a sweep spec",
                         "e.g. --set use_flash_attn=false or --set precision=fp8")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        if not raw.replace("_", "").replace("-", "").isalnum():
            raise InputError("command line", "--set", text, "KEY=VALUE with a TOML value (true, 2, \"fp8\")") from None
        value = raw
    return key, value


def plan_search_text(name: str, models, gpu: str, sizes, tps, pps, batches, settings: dict,
                     micro_batches=MICRO_BATCH_VALUES, recomputes=RECOMPUTE_SEARCHED) -> str:
    """A sweep spec (TOML) that prices every plan of ``models`` (preset or ``[models.*]`` names)
    on ``gpu``: cluster ``sizes`` x ``tps`` x ``pps`` x global ``batches`` x ``micro_batches``
    x ``recomputes``, the ``[training]`` ``settings`` on every machine, at
    :data:`PRICED_TOKENS` (the step time does not depend on the tokens). ``optimal``'s search
    and ``schedule``'s job curves (:mod:`vtrain_fast.schedule.curves`) are such sweeps."""
    where = f"{name} settings"
    lines = [f'name = "{name}"', "[model]", "presets = [" + ", ".join(f'"{m}"' for m in models) + "]",
             "[training]", f"num_tokens = {PRICED_TOKENS!r}", "global_batch_size = [" + ", ".join(map(str, batches)) + "]",
             "micro_batch_size = [" + ", ".join(map(str, micro_batches)) + "]",
             "recompute = [" + ", ".join(f'"{r}"' for r in recomputes) + "]"]
    lines += [f"{k} = {_toml_value(where, k, v)}" for k, v in settings.items()]
    lines += ["[cluster]", f"gpu = {_toml_value(where, 'gpu', gpu)}",
              "num_gpus = [" + ", ".join(map(str, sizes)) + "]",
              "[parallel]", "tp = [" + ", ".join(map(str, tps)) + "]", "pp = [" + ", ".join(map(str, pps)) + "]"]
    return "\n".join(lines) + "\n"


def sweep_text(shapes, gpu: str, sizes, tps, pps, batches, settings: dict) -> str:
    """The sweep spec (TOML) of the search (:func:`plan_search_text`): one ``[models.<name>]``
    table per shape."""
    lines = [plan_search_text("optimal", [m.name for m in shapes], gpu, sizes, tps, pps, batches, settings).rstrip("\n")]
    for m in shapes:
        lines += [f'[models."{m.name}"]', f"num_layers = {m.num_layers}", f"hidden_size = {m.hidden_size}",
                  f"num_attention_heads = {m.num_attention_heads}", f"seq_length = {m.seq_length}",
                  f"vocab_size = {m.vocab_size}"]
    return "\n".join(lines) + "\n"


def _best_per_model(models, tokens, gpu_s, index, num_models):
    """For each model, the position of its row with the most ``tokens``, then the fewest
    ``gpu_s``, then the lowest ``index`` (-1 for a model without rows)."""
    best = np.full(num_models, -1, dtype=np.int64)
    if models.size:
        order = np.lexsort((index, gpu_s, -tokens, models))
        first = np.ones(order.size, dtype=bool)
        first[1:] = models[order][1:] != models[order][:-1]
        best[models[order][first]] = order[first]
    return best


def optimal(*, budget_usd: float | None = None, gpu_hours: float | None = None, gpus: int | None = None,
            days: float | None = None, gpu: str = "a100-sxm4-80gb", fit: str = "epoch",
            min_params: float = 1e8, max_params: float = 1e12, num_sizes: int = 40, seq_length: int = 2048,
            aspect_ratio: float = 128.0, batch_tokens: int = 4 * 1024 * 1024, max_gpus: int = 16384,
            max_days: float = 90.0, max_pp: int = 64, settings: dict | None = None,
            inference_tokens: float | None = None, inference_mfu: float = DEFAULT_INFERENCE_MFU,
            memory_margin: float | None = None, calibration: dict | None = None, gpu_presets: dict | None = None) -> OptimalResult:
    """The model size, token count, plan and cluster of lowest predicted loss within a budget.

    Give exactly one budget: ``budget_usd``, ``gpu_hours``, or ``gpus`` and ``days`` together.
    The search, the budget arithmetic and the naive answer: this module's docstring.

    Parameters
    ----------
    budget_usd : float, optional
        Dollars, priced at the GPU preset's ``usd_per_gpu_hour``.
    gpu_hours : float, optional
        GPU-hours.
    gpus : int, optional
        GPUs available (a job uses at most this many), with ``days`` of wall-clock time.
    days : float, optional
        Days of training on ``gpus``.
    gpu : str
        GPU preset (``vtrain-fast presets``) or a GPU of ``gpu_presets``.
    fit : str
        Loss fit, a key of :data:`~vtrain_fast.plan.loss.LOSS_FITS`: ``epoch`` (Besiroglu et
        al. 2024, default) or ``hoffmann`` (Hoffmann et al. 2022).
    min_params, max_params : float
        Range of model sizes searched, parameters.
    num_sizes : int
        Target sizes, log-spaced.
    seq_length : int
        Tokens per sequence.
    aspect_ratio : float
        Target ``hidden_size / num_layers``.
    batch_tokens : int
        Tokens per global batch (the batch is ``round(batch_tokens / seq_length)`` sequences).
    max_gpus : int
        Largest cluster searched under a money or GPU-hour budget.
    max_days : float
        Longest run under a money or GPU-hour budget, days: a plan that cannot spend the budget
        within it trains for ``max_days``.
    max_pp : int
        Largest pipeline-parallel size searched.
    settings : dict, optional
        ``[training]`` settings of a sweep spec for every plan (on top of
        :data:`DEFAULT_SETTINGS`).
    inference_tokens : float, optional
        Inference-aware sizing (Sardana et al. 2024): tokens the model will serve in its
        lifetime, paid from the same money or GPU-hour budget at ``2 N`` FLOPs each (this
        module's docstring, "Inference-aware sizing"). Not with ``gpus`` and ``days``.
    inference_mfu : float
        Utilisation of the serving GPUs (same GPU type), a fraction of the bf16 dense peak:
        an assumption, default :data:`DEFAULT_INFERENCE_MFU`.
    memory_margin : float, optional
        Leave out plans whose memory headroom is below this fraction of the GPU's HBM (as
        ``pareto --memory-margin``). Without it every plan that fits is searched and the curve's
        ``memory_tight`` marks those within the tables' default margin
        (:data:`~vtrain_fast.analysis.query.DEFAULT_MEMORY_MARGIN`).
    calibration, gpu_presets : dict, optional
        As :func:`vtrain_fast.plan.spec.parse_spec`'s.

    Returns
    -------
    OptimalResult

    Raises
    ------
    InputError
        No budget, two budgets, a bad value, an unknown GPU or fit, or nothing feasible (naming
        what to change).
    """
    t0 = time.perf_counter()
    from ..hardware.gpus import PRESETS
    from ..engine.chunks import RowBuffers, evaluate_chunk
    from ..model.records import OK
    from .query import DEFAULT_MEMORY_MARGIN, check_memory_margin
    from ..model.sweep import sweep_chunk
    from ..plan.grid import build_grid
    from ..plan.spec import parse_spec
    lf = _fit(fit)
    given = [k for k, v in (("--budget-usd", budget_usd), ("--gpu-hours", gpu_hours)) if v is not None]
    if gpus is not None or days is not None:
        given.append("--gpus/--days")
    if len(given) != 1:
        raise InputError("command line", "budget", " and ".join(given) or None,
                         "exactly one of --budget-usd X, --gpu-hours X, or --gpus G with --days D",
                         "e.g. --gpus 3360 --days 30, or --budget-usd 1e6")
    if (gpus is None) != (days is None):
        raise InputError("command line", "--days" if days is None else "--gpus", None,
                         "--gpus and --days together", "e.g. --gpus 3360 --days 30")
    known = gpu_presets or PRESETS
    if gpu not in known:
        raise InputError("command line", "--gpu", gpu, "a GPU preset (vtrain-fast presets)",
                         did_you_mean(gpu, known, "e.g. --gpu a100-sxm4-80gb"))
    min_params = _positive("--min-params", min_params, 1e6, 1e15)
    max_params = _positive("--max-params", max_params, 1e6, 1e15)
    if max_params <= min_params:
        raise InputError("command line", "--max-params", max_params, f"above --min-params ({min_params:g})")
    num_sizes = _positive("--num-sizes", num_sizes, 1, 1000, whole=True)
    seq_length = _positive("--seq-length", seq_length, 0, 1 << 20, whole=True)
    aspect_ratio = _positive("--aspect-ratio", aspect_ratio, 0.0, 1e5)
    batch_tokens = _positive("--batch-tokens", batch_tokens, 0, 1 << 40, whole=True)
    max_pp = _positive("--max-pp", max_pp, 0, 1024, whole=True)
    batch = max(1, round(batch_tokens / seq_length))
    if batch > 1 << 20:
        raise InputError("command line", "--batch-tokens", batch_tokens,
                         f"at most {1 << 20:,} sequences of --seq-length per batch")
    preset = known[gpu]
    if gpus is not None:
        gpus = _positive("--gpus", gpus, 0, 10_000_000, whole=True)
        days = _positive("--days", days, 0.0, 36500.0)
        kind, limit_gpus, max_s = "cluster", gpus, days * SECONDS_PER_DAY
    else:
        kind = "usd" if budget_usd is not None else "gpu_hours"
        if budget_usd is not None:
            budget_usd = _positive("--budget-usd", budget_usd, 0.0, 1e15)
        else:
            gpu_hours = _positive("--gpu-hours", gpu_hours, 0.0, 1e13)
        limit_gpus = _positive("--max-gpus", max_gpus, 0, 10_000_000, whole=True)
        max_days = _positive("--max-days", max_days, 0.0, 36500.0)
        max_s = max_days * SECONDS_PER_DAY
    if inference_tokens is not None:
        if kind == "cluster":
            raise InputError("command line", "--inference-tokens", inference_tokens,
                             "--inference-tokens with --budget-usd or --gpu-hours (serving is paid from that budget)",
                             "give the budget in dollars or GPU-hours, e.g. --budget-usd 1e7 --inference-tokens 1e13")
        inference_tokens = _positive("--inference-tokens", inference_tokens, 0.0, 1e20)
        inference_mfu = _positive("--inference-mfu", inference_mfu, 0.0, 1.0)
    check_memory_margin("command line", memory_margin)
    merged = dict(DEFAULT_SETTINGS)
    for k, v in (settings or {}).items():
        if k in OWN_TRAINING_KEYS:
            raise InputError("command line", "--set", f"{k}={v}", "a training setting optimal does not set itself",
                             "optimal searches micro-batch and recompute and derives the tokens and the batch "
                             "(--batch-tokens)")
        merged[k] = v

    shapes = shape_family(min_params, max_params, num_sizes, seq_length, aspect_ratio)
    gpn = preset.gpus_per_node
    tps = [t for t in TP_VALUES if t <= min(gpn, limit_gpus)]
    pps = [p for p in PP_VALUES if p <= max_pp and any(m.num_layers % p == 0 for m in shapes)]
    sizes = cluster_sizes(tps, pps, batch, limit_gpus, 2 if kind == "cluster" else None)
    batches = [batch]
    if kind == "cluster":
        batches = whole_cluster_batches(tps, pps, batch, gpus)
        sizes = sorted(set(sizes) | ({gpus} if len(batches) > 1 else set()))
    text = sweep_text(shapes, gpu, sizes, tps, pps, batches, merged)
    spec = parse_spec(text, "optimal (the search's sweep spec; --set KEY=VALUE)", calibration, gpu_presets)
    grid = build_grid(spec)
    prices = np.array([g.usd_per_gpu_hour for g in spec.gpus], dtype=np.float64)
    if kind == "usd" and not (prices > 0).all():
        raise InputError("command line", "--budget-usd", budget_usd, f"a GPU with a price ({gpu} has "
                         "usd_per_gpu_hour = 0)", "use --gpu-hours, or a --gpus-file GPU with usd_per_gpu_hour")
    if kind == "usd":
        budget_gpu_s = 3600.0 * budget_usd / prices
    elif kind == "gpu_hours":
        budget_gpu_s = np.full(len(spec.gpus), 3600.0 * gpu_hours)
    else:
        budget_gpu_s = np.full(len(spec.gpus), np.inf)
    # serving: GPU-seconds per parameter (2 D_inf FLOPs per parameter at inference_mfu of the peak)
    peaks = np.array([g.peak_tflops * 1e12 for g in spec.gpus], dtype=np.float64)
    capacity_GiB = np.array([g.hbm_GiB for g in spec.gpus], dtype=np.float64)
    serve_s_per_param = (2.0 * inference_tokens / (peaks * inference_mfu) if inference_tokens
                         else np.zeros(len(spec.gpus)))

    # one pass over the grid: the best plan of each shape
    num_models = len(shapes)
    keep_tokens = np.zeros(0)    # sequences the best plan of each shape trains on
    keep_gpu_s = np.zeros(0)
    keep_index = np.zeros(0, dtype=np.int64)
    keep_model = np.zeros(0, dtype=np.int64)
    feasible = 0
    b = RowBuffers(min(CHUNK_POINTS, grid.num_points))
    for start in range(0, grid.num_points, b.capacity):
        n = min(b.capacity, grid.num_points - start)
        sweep_chunk(start, n, *grid.kernel_args(), b.inputs, b.tokens, b.out, b.status)
        ok = np.flatnonzero(b.status[:n] == OK)
        if memory_margin:          # leave out the plans within the margin of the HBM
            cap = capacity_GiB[b.inputs[INPUT.gpu_index, ok]]
            ok = ok[cap - b.out[OUTPUT.memory_per_gpu_GiB, ok] >= memory_margin * cap]
        feasible += ok.size
        it = b.out[OUTPUT.iteration_time_s, ok]
        ngpu = b.inputs[INPUT.num_gpus, ok].astype(np.float64)
        g_ok = b.inputs[INPUT.gpu_index, ok]
        left = np.maximum(budget_gpu_s[g_ok] - serve_s_per_param[g_ok] * b.out[OUTPUT.num_parameters, ok], 0.0)
        steps = np.floor(np.minimum(left / (ngpu * it), max_s / it))
        models = np.concatenate([keep_model, b.inputs[INPUT.model_index, ok]])
        tokens = np.concatenate([keep_tokens, steps * b.inputs[INPUT.global_batch_size, ok]])    # sequences
        gpu_s = np.concatenate([keep_gpu_s, steps * ngpu * it])
        index = np.concatenate([keep_index, start + ok])
        best = _best_per_model(models, tokens, gpu_s, index, num_models)
        best = best[best >= 0]
        keep_model, keep_tokens, keep_gpu_s, keep_index = models[best], tokens[best], gpu_s[best], index[best]
    good = keep_tokens >= 1
    if not good.any():
        raise InputError("command line", "--min-params/--max-params", f"{min_params:.3g} to {max_params:.3g}",
                         f"a range of model sizes with a plan that trains at least one step within {given[0]}",
                         f"no plan of the {num_models} shapes searched is feasible on {gpu}" + (f" with at most {limit_gpus:,} GPUs" if limit_gpus else "")
                         + (" (out of memory or too few GPUs): lower --min-params, raise "
                            + ("--gpus" if kind == "cluster" else "--max-gpus") + " or --max-pp"
                            + (f", or lower --memory-margin ({memory_margin:g} of the HBM left free)"
                               if memory_margin else "")
                            if not keep_tokens.size else ": raise the budget or lower --min-params"
                            + (" or --inference-tokens (serving is paid from the budget)" if inference_tokens else "")))
    rows = [pl.from_arrow(evaluate_chunk(grid, int(i), 1)) for i in keep_index[good]]
    curve = pl.concat(rows, how="vertical_relaxed")
    steps = keep_tokens[good] / curve["global_batch_size"].to_numpy()
    it = curve["iteration_time_s"].to_numpy()
    ngpu = curve["num_gpus"].to_numpy().astype(np.float64)
    gi = np.array([_gpu_axis(grid, int(i)) for i in keep_index[good]], dtype=np.int64)
    price = prices[gi]
    tokens = steps * curve["global_batch_size"].to_numpy() * seq_length
    n_params = curve["num_parameters"].to_numpy()
    gpu_h = ngpu * steps * it / 3600.0
    serve_gpu_h = serve_s_per_param[gi] * n_params / 3600.0
    headroom = capacity_GiB[gi] - curve["memory_per_gpu_GiB"].to_numpy()
    margin = DEFAULT_MEMORY_MARGIN if memory_margin is None else memory_margin
    budget_steps = np.floor(np.maximum(budget_gpu_s[gi] - 3600.0 * serve_gpu_h, 0.0) / (ngpu * it))
    curve = curve.with_columns(
        num_steps=pl.Series(steps.astype(np.int64)), num_tokens=pl.Series(tokens),
        tokens_per_parameter=pl.Series(tokens / n_params), flops=pl.Series(6.0 * n_params * tokens),
        train_days=pl.Series(steps * it / SECONDS_PER_DAY), gpu_hours=pl.Series(gpu_h),
        cost_usd=pl.Series(gpu_h * price), loss=pl.Series(lf.loss(n_params, tokens)),
        fit=pl.lit(lf.name), limited_by=pl.Series(np.where(steps < budget_steps, "days", "budget")),
        memory_headroom_GiB=pl.Series(headroom), memory_tight=pl.Series(headroom < margin * capacity_GiB[gi]),
        **({} if not inference_tokens else dict(
            inference_tokens=pl.lit(float(inference_tokens)), inference_gpu_hours=pl.Series(serve_gpu_h),
            total_cost_usd=pl.Series((gpu_h + serve_gpu_h) * price))),
    ).sort("num_parameters")
    opt = int(curve["loss"].arg_min())
    curve = curve.with_columns(optimum=pl.Series(np.arange(curve.height) == opt))
    from ..model.settings import SETTINGS
    # the settings searched as axes, and those priced at other than their default (DEFAULT_SETTINGS,
    # --set): the written curve evaluates to the same plans (`vtrain-fast evaluate`, show, export)
    extra = [c for c in spec.setting_axes if c in curve.columns]
    extra += [st.name for st in SETTINGS if st.name in curve.columns and st.name not in extra
              and any(v != st.default for v in curve[st.name].to_list())]
    curve = curve.select([c for c in CURVE_COLUMNS if c in curve.columns] + extra)
    best = curve.row(opt, named=True)

    # naive: the same budget at 100 % of the peak, C = 6 N D at the fit's compute-optimal N, D; the
    # bf16 peak, the one MFU is measured against (PaLM's convention), under FP8 too
    peak = preset.peak_tflops * 1e12
    naive_gpu_s = gpus * days * SECONDS_PER_DAY if kind == "cluster" else float(budget_gpu_s[0])
    flops = naive_gpu_s * peak
    # with serving: the lifetime FLOPs 6 N D + 2 N D_inf at the peak (Sardana et al.), serving at
    # 100 % too, so that the naive answer stays the paper's compute formulation
    n_opt, d_opt = lf.optimal_with_inference(flops, float(inference_tokens or 0.0))
    naive = dict(num_parameters=n_opt, num_tokens=d_opt, tokens_per_parameter=d_opt / n_opt,
                 flops=6.0 * n_opt * d_opt,
                 num_gpus=gpus if kind == "cluster" else None, train_days=days if kind == "cluster" else None,
                 gpu_hours=6.0 * n_opt * d_opt / peak / 3600.0, cost_usd=6.0 * n_opt * d_opt / peak / 3600.0 * float(prices[0]),
                 total_cost_usd=naive_gpu_s / 3600.0 * float(prices[0]), mfu=1.0,
                 loss=float(lf.loss(n_opt, d_opt)))
    params_col = curve["num_parameters"].to_numpy()
    naive_size = None
    if params_col.min() <= n_opt <= params_col.max():
        naive_size = curve.row(int(np.argmin(np.abs(np.log(params_col / n_opt)))), named=True)

    from ..plan.spec import spec_caveats
    warnings, notes = [], list(spec.notes) + spec_caveats(spec)   # the sweep's caveats (calibration, not validated)
    if not inference_tokens and inference_mfu != DEFAULT_INFERENCE_MFU:
        warnings.append("--inference-mfu has no effect without --inference-tokens (the tokens the model will serve)")
    if inference_tokens:
        notes.append(f"inference-aware (Sardana et al. 2024): serving {inference_tokens:.3g} tokens at 2 N FLOPs each "
                     f"on {gpu} at {inference_mfu:.0%} of its bf16 peak (--inference-mfu, an assumption) costs the "
                     f"optimum {best['inference_gpu_hours']:,.0f} GPU-h of the budget; the naive answer serves at 100 %")
    if merged.get("precision") == "fp8":
        notes.append("precision fp8: MFU and the naive answer use the bf16 peak (MFU's convention); FP8 GEMMs "
                     "run at up to twice that, so MFU above 50 % is possible")
    family = [estimated_params(m.num_layers, m.hidden_size, m.seq_length, m.vocab_size) for m in shapes]
    names = [m.name for m in shapes]
    k = names.index(best["model"])
    if k == 0:
        warnings.append(f"the optimum is the smallest model searched ({best['num_parameters']:.3g} parameters, "
                        f"--min-params {min_params:.3g}): the best size may be smaller; lower --min-params")
    elif k == len(shapes) - 1:
        warnings.append(f"the optimum is the largest model searched ({best['num_parameters']:.3g} parameters, "
                        f"--max-params {max_params:.3g}): the best size may be larger; raise --max-params")
    elif names[k + 1:] and best["model"] == curve["model"][-1]:
        serve_next = float(serve_s_per_param[0]) * family[k + 1]
        if inference_tokens and serve_next >= float(budget_gpu_s[0]) * 0.5:
            warnings.append(f"the optimum is the largest model with a feasible plan ({best['num_parameters']:.3g} "
                            f"parameters): serving {inference_tokens:.3g} tokens with the next shape searched "
                            f"({family[k + 1]:.3g} parameters) takes {serve_next / 3600:,.0f} of the budget's "
                            f"{float(budget_gpu_s[0]) / 3600:,.0f} GPU-h, leaving the larger shapes too little to "
                            "train: raise the budget or --inference-mfu, or lower --inference-tokens")
        else:
            warnings.append(f"the optimum is the largest model with a feasible plan ({best['num_parameters']:.3g} "
                            f"parameters; the {len(shapes) - 1 - k} larger shapes searched have none on "
                            f"{gpu}" + (f" within --memory-margin {memory_margin:g}" if memory_margin else "")
                            + "): raise " + ("--gpus" if kind == "cluster" else "--max-gpus") + " or --max-pp")
    if best["pp"] == max(pps) and len(pps) > 1:
        warnings.append(f"the optimum's pipeline size is the largest searched (pp = {best['pp']}): raise --max-pp")
    if kind != "cluster":
        if best["limited_by"] == "days":
            warnings.append(f"the optimum cannot spend the budget within --max-days {max_days:g} "
                            f"({best['gpu_hours']:,.0f} of {float(budget_gpu_s[0]) / 3600:,.0f} GPU-h spent): "
                            "raise --max-days or --max-gpus")
        if best["num_gpus"] == max(sizes):
            warnings.append(f"the optimum uses the largest cluster searched ({best['num_gpus']:,} GPUs): "
                            "raise --max-gpus")
    if kind == "cluster" and best["num_gpus"] < gpus:
        notes.append(f"the optimum's plan uses {best['num_gpus']:,} of the {gpus:,} GPUs (tp x pp x dp, dp "
                     f"dividing the global batch of {batch:,} sequences; the rest idle)")
    if family and not warnings:
        sizes_priced = curve["num_parameters"]
        notes.append(f"the optimum lies inside the searched range of sizes with a feasible plan "
                     f"({sizes_priced.min():.3g} to {sizes_priced.max():.3g} parameters)")
    return OptimalResult(fit=lf, gpu=gpu, budget=dict(kind=kind, budget_usd=budget_usd, inference_tokens=inference_tokens,
        inference_mfu=inference_mfu if inference_tokens else None, memory_margin=margin, gpu_hours=(
        None if kind == "cluster" else float(budget_gpu_s[0]) / 3600.0), gpus=gpus, days=days,
        max_gpus=None if kind == "cluster" else limit_gpus, max_days=None if kind == "cluster" else max_days,
        batch=batch), best=best, naive=naive, naive_size=naive_size, curve=curve, warnings=warnings, notes=notes,
        points=grid.num_points, feasible=feasible, shapes=len(shapes), seconds=time.perf_counter() - t0)


def _gpu_axis(grid, index: int) -> int:
    """The gpu-axis value of flat index ``index``."""
    
    from ..plan.grid import decode
    return decode(index, grid.radices)[AXIS.gpu]
