"""Which speed-up technique first (``vtrain-fast advise``): from plain data parallelism to the
best plan the techniques make, one technique at a time, with what each buys in speed, memory and
cost on the given GPUs.

The start
---------
Plain data parallelism without the techniques: ``tp = pp = 1``, ``dp`` the largest size up to
the GPUs that divides the global batch, micro-batch 1, fp32 (no mixed precision; bf16 on a GPU
without a stated FP32 peak), no FlashAttention,
no recomputation, no ZeRO (DDP), no precision-aware optimizer, no overlap; every other training
setting at its registry default (:data:`vtrain_fast.model.settings.SETTINGS`), unless
``settings`` says otherwise. The start is one record, :data:`START` (its plan columns and any
registry setting it does not keep at the default), read by :func:`start_plan`. Mixed precision
(bf16) is then a technique of the ladder, and FP8 comes after it (:attr:`Technique.after`:
Transformer Engine's FP8 runs inside bf16 mixed precision). The global batch is :data:`BATCH_TOKENS`
tokens (4 Mi, Llama 2's 4M-token batch and ``optimal``'s ``--batch-tokens`` default) in
sequences of the model's ``seq_length``, rounded (``global_batch_size`` overrides it); the
tokens are 20 per parameter (Chinchilla, Hoffmann et al. 2022) unless ``num_tokens`` says how
many.

The ladder
----------
:data:`LADDER`, one :class:`Technique` per record: a name, the plan columns it sets (training
settings of the registry, or ``tp``, ``pp``, ``micro_batch_size``, ``recompute``), where it comes
from (its Megatron-LM flags are the registry's), and when it applies. A record is one change to
the current plan; records of one setting replace each other, the start's value among them (``full``
recomputation then ``selective``, or ``none`` once a later step made room, is a step; ZeRO-3 then
ZeRO-1 or none too), so a step may take back an earlier one; switches (FlashAttention, sequence
parallelism, the overlaps, ...) are only turned on. ``dp`` is not
a technique: it follows, the largest size up to ``GPUs / (tp x pp)`` that divides the global
batch in micro-batches. A record is not a candidate where the plan already has its values, where
its own rule says no (:attr:`Technique.when`: tensor parallelism beyond a node, FP8 on a GPU
without FP8 tensor cores, FlashAttention without the kernel), where every registry setting it
sets has no effect on the new plan (:meth:`~vtrain_fast.model.settings.Setting.has_no_effect`:
sequence parallelism at ``tp = 1``, an overlapped reduction at ``dp = 1``) or where the new plan
leaves a requirement unmet (:func:`~vtrain_fast.model.settings.unmet_requirements`). A record
naming a setting the cost model does not have (not in ``BY_NAME``) is left out with a note.

The rules
---------
Two rules order the techniques (``rule``, ``--rule``; :data:`RULES`): ``best-plan`` (the
default) walks to the search's best plan, ``greedy`` takes the best next step each time.

The greedy rule (``--rule greedy``): each step prices every candidate of the current plan in
one :func:`evaluate_frame` call, then:

1. while the plan does not fit in memory (status ``out_of_memory``, or with ``memory_margin``
   less free memory than that), apply among the candidates that obey Megatron-LM's rules
   (status ``ok`` or ``out_of_memory``) and lower the memory per GPU: the fastest that fits
   (ties: less memory, then ladder order), or, when none fits, the one with the least memory
   (ties: faster, then ladder order);
2. once it fits, apply the candidate that fits with the lowest iteration time (ties: less
   memory, then ladder order), if it is at least ``threshold`` (:data:`DEFAULT_THRESHOLD`, 1 %)
   faster;
3. stop when no candidate qualifies (at most :data:`MAX_STEPS` steps; memory falls at each step
   of (1) and time by the threshold at each step of (2), so the rule ends).

Under either rule the steps taken while the plan did not fit are the ones *needed to fit*; the
final plan is also priced without each of its techniques (set back to the start's value, with
the techniques that need it), which says which ones it still needs.

The search
----------
A one-step greedy rule can miss a plan that only a combination of techniques reaches (on a
PCIe node the one technique that fits alone may be wide tensor parallelism, slow there, while
pipeline parallelism, ZeRO and 8-bit states together fit and run faster). So every plan the
ladder's values make (:func:`combinations`: one record of each group of records that set the
same columns, or none; a few thousand plans, priced in one frame) is priced as well; the
fastest that fits (ties: less memory, then the search's order, which lists a plan before the
same plan with one more record) is *the best plan*.

The best-plan rule (the default, :func:`order_techniques`): the best plan's records (its
differences from the start, one record of the ladder each) are added to the start one at a
time: while the plan does not fit, the record whose addition fits (the fastest, if several do)
or else leaves the least memory; then the record that, still fitting, gives the lowest iteration
time (its speed-up may be below 1 where it makes room for a later record: ZeRO-2 before a larger
micro-batch), each step re-priced on the plan so far. Every plan on the way is a plan of the
search, so the steps cost no pricing of their own; a record that would make a plan Megatron-LM
refuses (sequence parallelism before tensor parallelism, an overlapped all-gather before ZeRO)
waits. The last step is the best plan, so the list ends there and every step after the first
that fits fits. The greedy ladder is still run and its end is named in a note.

Under the greedy rule, the search's best is reported next to the ladder's final plan with the
gap between them. When the ladder ends out of memory but a plan of the search fits, that plan
is the final plan (a note says so); when none fits either, :func:`advise` raises an
:class:`~vtrain_fast.io.errors.InputError` naming the techniques tried, the least memory
reached and the fixes (more GPUs, a bigger GPU, a smaller model). So a plan that does not fit
is never recommended (under either rule).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Callable

import polars as pl

from ..io.errors import InputError, did_you_mean

# Tokens per global batch unless given: 4 Mi (Llama 2's 4M-token batch; optimal's --batch-tokens).
BATCH_TOKENS = 4 * 1024 * 1024
# Tokens per parameter unless given (Chinchilla, Hoffmann et al. 2022).
TOKENS_PER_PARAMETER = 20.0
# The least gain in iteration time a speed step must bring (a fraction).
DEFAULT_THRESHOLD = 0.01
# Steps at most (the rule ends well before: memory falls or time falls by the threshold each step).
MAX_STEPS = 64
# Plan columns a technique may set besides the registry's training settings.
PLAN_COLUMNS = ("tp", "pp", "micro_batch_size", "recompute")
# The start, one record: its values of the plan columns, and of any registry setting it does not
# keep at the registry default (e.g. "precision": "fp32" for a start before mixed precision; a
# record of the ladder then sets the default back). Every other setting the ladder's records set
# starts at its registry default (start_plan), and --set overrides the start.
START = {"tp": 1, "pp": 1, "micro_batch_size": 1, "recompute": "none", "precision": "fp32"}
# The rules that order the techniques (advise's rule=; --rule), the default first.
RULES = ("best-plan", "greedy")
# The columns advise sets itself: refused in ``settings``, with the option that sets them.
OWN_COLUMNS = {"tp": "the ladder sets it (tensor parallelism)", "pp": "the ladder sets it (pipeline parallelism)",
               "dp": "it follows from the GPUs, tp and pp", "cp": "context parallelism is not in the ladder",
               "micro_batch_size": "the ladder sets it (larger micro-batches)",
               "recompute": "the ladder sets it (recomputation)", "global_batch_size": "use --global-batch-size",
               "num_tokens": "use --tokens", "gpu": "use --gpus GPU:N", "num_gpus": "use --gpus GPU:N",
               "num_nodes": "it follows from --gpus and gpus_per_node", "model": "use --model"}


@dataclass(frozen=True)
class Context:
    """What a technique's rule may look at besides the plan: the GPU (with its calibration and
    the cluster values of ``settings``), the GPUs and the model's shape."""

    preset: object
    num_gpus: int
    shape: object
    global_batch_size: int


@dataclass(frozen=True)
class Technique:
    """One record of the ladder.

    Attributes
    ----------
    name : str
        What the tables call it.
    changes : tuple of (str, value)
        The plan columns it sets and their values: training settings of the registry
        (:data:`~vtrain_fast.model.settings.BY_NAME`) or :data:`PLAN_COLUMNS`.
    source : str
        Where it comes from (paper, framework); the flags of registry settings are the
        registry's (:attr:`~vtrain_fast.model.settings.Setting.megatron`).
    when : callable, optional
        ``when(plan, ctx) -> str | None``: why the technique does not apply to the new plan
        ``plan`` (a dict of plan columns, with it applied) on :class:`Context` ``ctx``, or None
        when it does.
    after : str, optional
        The name of a ladder technique whose values the plan must already have when this one is
        added (FP8 after mixed precision): a step never jumps over it, and the best-plan rule adds
        it to a best plan that has this one (:func:`prerequisite_unmet`).
    """

    name: str
    changes: tuple
    source: str
    when: Callable | None = None
    after: str = ""

    @property
    def values(self) -> dict:
        return dict(self.changes)


def _within_node(plan, ctx):
    if plan["tp"] > ctx.preset.gpus_per_node:
        return f"tp {plan['tp']} spans more than a node ({ctx.preset.gpus_per_node} GPUs per node)"
    return _enough_gpus(plan, ctx)


def _enough_gpus(plan, ctx):
    if plan["tp"] * plan["pp"] > ctx.num_gpus:
        return f"tp x pp = {plan['tp'] * plan['pp']} is more than the {ctx.num_gpus} GPUs"
    return None


def _fp8(plan, ctx):
    from ..plan.spec import has_fp8
    if not has_fp8(ctx.preset):
        return (f"{ctx.preset.name} has no FP8 tensor cores (peak_fp8_tflops {ctx.preset.peak_fp8_tflops:g}, "
                f"fp8_gemm_efficiency {ctx.preset.calibration.fp8_gemm_efficiency:g})")
    return None


def _mixed_precision(plan, ctx):
    from ..plan.spec import has_precision
    return None if has_precision(ctx.preset, "bf16") else f"{ctx.preset.name} has no bf16 tensor cores"


def _flash(plan, ctx):
    from ..plan.spec import has_flash_attention
    return None if has_flash_attention(ctx.preset) else f"{ctx.preset.name} has no FlashAttention kernel"


_RECOMPUTE = "Korthikanti et al. 2022 (selective: the attention core; full: every layer's input kept, the layer rerun)"
_ZERO = "Rajbhandari et al. 2020 (ZeRO); Megatron-core distributed optimizer and FSDP"

# The ladder, in the order ties are broken in. A technique added later is one record here.
LADDER: tuple[Technique, ...] = (
    Technique("mixed precision (bf16)", (("precision", "bf16"),),
              "Micikevicius et al. 2018 (mixed precision training), Kalamkar et al. 2019 (bf16); Megatron-LM --bf16: "
              "16-bit weights, activations and GEMMs on the tensor cores, fp32 master weights", _mixed_precision),
    Technique("FlashAttention", (("use_flash_attn", True),), "Dao 2023 (FlashAttention-2)", _flash),
    Technique("selective recomputation", (("recompute", "selective"),),
              _RECOMPUTE + "; Megatron-LM --recompute-granularity selective"),
    Technique("full recomputation", (("recompute", "full"),),
              _RECOMPUTE + "; Megatron-LM --recompute-granularity full --recompute-method uniform "
              "--recompute-num-layers 1"),
    Technique("no recomputation", (("recompute", "none"),), "the start's: every activation kept"),
    Technique("ZeRO-1", (("zero_stage", 1),), _ZERO + ": the Adam states sharded"),
    Technique("ZeRO-2", (("zero_stage", 2),), _ZERO + ": also the gradients"),
    Technique("ZeRO-3", (("zero_stage", 3),), _ZERO + ": also the parameters (FSDP full sharding)"),
    Technique("no ZeRO (DDP)", (("zero_stage", 0),), "the start's: every rank holds every state (PyTorch DDP)"),
    Technique("8-bit optimizer states", (("use_precision_aware_optimizer", True), ("exp_avg_dtype", "fp8"),
                                         ("exp_avg_sq_dtype", "fp8")),
              "Dettmers et al. 2022 (8-bit optimizers); Transformer Engine FusedAdam with 8-bit moments"),
    Technique("CPU optimizer offload", (("optimizer_cpu_offload", True), ("overlap_cpu_optimizer_d2h_h2d", True)),
              "Ren et al. 2021 (ZeRO-Offload); Megatron-core --optimizer-cpu-offload (overlapped copies; it needs "
              "the precision-aware optimizer, so it follows the 8-bit states)"),
    Technique("FP8", (("precision", "fp8"),), "Micikevicius et al. 2022 (FP8 formats); Transformer Engine", _fp8,
              after="mixed precision (bf16)"),
    Technique("overlapped gradient reduction", (("overlap_grad_reduce", True),), "Megatron-LM; PyTorch DDP buckets"),
    Technique("overlapped parameter all-gather", (("overlap_param_gather", True),),
              "Megatron-core distributed optimizer"),
    Technique("sequence parallelism", (("sequence_parallel", True),), "Korthikanti et al. 2022"),
    *(Technique(f"tensor parallelism {t}" if t > 1 else "no tensor parallelism", (("tp", t),),
                "Shoeybi et al. 2019 (Megatron-LM); --tensor-model-parallel-size", _within_node) for t in (2, 4, 8, 1)),
    *(Technique(f"pipeline parallelism {p}" if p > 1 else "no pipeline parallelism", (("pp", p),),
                "Narayanan et al. 2021 (1F1B); --pipeline-model-parallel-size", _enough_gpus) for p in (2, 4, 8, 1)),
    *(Technique(f"micro-batch {b}", (("micro_batch_size", b),), "--micro-batch-size") for b in (2, 4, 8, 1)),
)


@dataclass(frozen=True)
class AdviseResult:
    """What :func:`advise` found.

    Attributes
    ----------
    steps : polars.DataFrame
        One row per step (0: the start): ``step``, ``technique`` (``A + B`` where the best-plan
        rule had to add two records at once), ``change`` (what it changed, ``name old -> new``),
        ``phase`` (``start``, ``fit``: taken while the plan did not fit, ``speed``),
        ``needed_to_fit`` (phase ``fit``), ``fits`` (status ``ok``), ``speedup``
        (the previous step's iteration time over this one's), ``memory_saved_GiB`` (the previous
        step's memory per GPU less this one's), then every column :func:`evaluate_frame` gives.
    final : dict
        The recommended plan (status ``ok``), an evaluate row: the last step's (under
        ``best-plan`` the search's best), or under ``greedy`` the search's best when the ladder
        ends out of memory (``final_source``).
    without : polars.DataFrame
        The final plan without each technique in it (its columns set back to the start's
        values): ``step`` (None for the search's plan), ``technique``, ``status``, ``fits``,
        ``memory_per_gpu_GiB``, ``iteration_time_s``.
    tried : polars.DataFrame
        Every candidate priced: ``step`` (the step it was a candidate for), ``technique`` and
        the evaluate columns.
    target : dict or None
        With ``days`` or ``budget_usd``: ``kind`` (``days`` | ``budget_usd``), ``limit``,
        ``value`` (the final plan's days or cost), ``meets``, ``first_step`` (the first step
        that fits and meets it, or None) and ``message`` (which says whether the search's best
        plan meets it when the final plan does not).
    model, gpu : str
    num_gpus, global_batch_size : int
    num_tokens, threshold : float
    capacity_GiB : float
        The GPU's memory (``hbm_GiB``), GiB.
    notes : list of str
    final_source : str
        ``best-plan`` (the best-plan rule: the last step's, the search's best), ``ladder`` (greedy:
        the last step's) or ``search`` (greedy: the ladder ended out of memory and the final plan
        is the search's best).
    best : dict or None
        The search's best: the fastest plan that fits of every combination of the ladder's values
        (:func:`combinations`), an evaluate row; None when none fits.
    searched : int
        Plans the search priced.
    memory_margin : float or None
    rule : str
        ``best-plan`` (the steps add the search's best plan's techniques, :func:`order_techniques`)
        or ``greedy`` (the greedy ladder).
    greedy : polars.DataFrame or None
        Under ``best-plan``: the greedy ladder's steps (as ``steps``), what the rule is compared
        with; None under ``greedy``.
    """

    steps: pl.DataFrame
    final: dict
    without: pl.DataFrame
    tried: pl.DataFrame
    target: dict | None
    model: str
    gpu: str
    num_gpus: int
    global_batch_size: int
    num_tokens: float
    threshold: float
    capacity_GiB: float
    notes: list = field(default_factory=list)
    final_source: str = "ladder"
    best: dict | None = None
    searched: int = 0
    memory_margin: float | None = None
    rule: str = "best-plan"
    greedy: pl.DataFrame | None = None


def usable_techniques(techniques) -> tuple[list[Technique], list[str]]:
    """The records of ``techniques`` whose columns the cost model has, and a note for each one
    left out (a setting not in the registry, a value not among its choices)."""
    from ..model.settings import BY_NAME
    from ..plan.spec import RECOMPUTE_VALUES
    keep, notes = [], []
    for tech in techniques:
        why = None
        for k, v in tech.changes:
            st = BY_NAME.get(k)
            if k == "recompute" and v not in RECOMPUTE_VALUES:
                why = f"recompute = {v!r} is not one of {', '.join(RECOMPUTE_VALUES)}"
            elif k in PLAN_COLUMNS:
                continue
            elif st is None:
                why = f"{k} is not a setting of the cost model yet (vtrain_fast.model.settings)"
            elif st.kind is str and v not in st.choices:
                why = f"{k} = {v!r} is not one of {', '.join(st.choices)}"
            if why:
                break
        if why:
            notes.append(f"technique {tech.name!r} left out: {why}")
        else:
            keep.append(tech)
    return keep, notes


def _check_settings(settings: dict) -> dict:
    """``settings`` checked: registry settings of the right kind, cluster values in range, or
    ``seq_length``; the columns advise sets itself refused (:data:`OWN_COLUMNS`)."""
    from ..hardware.gpus import OVERRIDE_RANGES
    from ..io.schema import CLUSTER_COLUMNS
    from ..model.settings import BY_NAME
    out = {}
    allowed = [*BY_NAME, *CLUSTER_COLUMNS, "seq_length"]
    for k, v in settings.items():
        key = f"--set {k}"
        if k in OWN_COLUMNS:
            raise InputError("command line", "--set", f"{k}={v}", "a training setting or cluster value of the start",
                             OWN_COLUMNS[k])
        if k not in allowed:
            raise InputError("command line", "--set", f"{k}={v}", "a training setting (vtrain_fast.model.settings), "
                             "a cluster value (" + ", ".join(CLUSTER_COLUMNS) + ") or seq_length",
                             did_you_mean(k, allowed, "e.g. --set use_flash_attn=true or --set gpus_per_node=4"))
        st = BY_NAME.get(k)
        number = isinstance(v, (int, float)) and not isinstance(v, bool)
        if st is not None and st.kind is bool:
            ok, what = isinstance(v, bool), "true or false"
        elif st is not None and st.kind is str:
            ok, what = v in st.choices, "one of " + ", ".join(st.choices) + (
                " (the start's precision: fp32 by default)" if k == "precision" else "")
        elif st is not None:
            lo, hi = st.int_range
            whole = st.kind is int
            ok = number and math.isfinite(v) and lo <= v <= hi and (not whole or float(v).is_integer())
            what = f"{'a whole number' if whole else 'a number'} from {lo:g} to {hi:g}"
            v = int(v) if ok and whole else float(v) if ok else v
        elif k == "seq_length":
            ok = number and float(v).is_integer() and 1 <= v <= 1 << 20
            what = "a whole number of tokens from 1 to 1,048,576"
            v = int(v) if ok else v
        else:
            lo, hi = OVERRIDE_RANGES[k]
            ok = number and math.isfinite(v) and lo <= v <= hi and (k != "gpus_per_node" or float(v).is_integer())
            what = f"a number from {lo:g} to {hi:g}"
            v = (int(v) if k == "gpus_per_node" else float(v)) if ok else v
        if not ok:
            raise InputError("command line", key, v, what)
        out[k] = v
    return out


def _positive(option: str, value, hi: float, whole: bool = False):
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
          and 0 < value <= hi and (not whole or float(value).is_integer()))
    if not ok:
        raise InputError("command line", option, value, f"{'a whole number' if whole else 'a number'} above 0 "
                         f"and at most {hi:g}", "see vtrain-fast advise --help")
    return int(value) if whole else float(value)


def data_parallel_size(plan: dict, num_gpus: int, global_batch_size: int) -> int | None:
    """The largest ``dp`` up to ``num_gpus / (tp x pp)`` that divides the global batch in
    micro-batches (``global_batch_size % (dp x micro_batch_size) == 0``), or None.

    ``dp x micro_batch_size`` divides the global batch exactly when the micro-batch size does and
    ``dp`` divides the micro-batches, so ``dp`` is the largest divisor of
    ``global_batch_size / micro_batch_size`` up to the bound (:func:`largest_divisor_at_most`):
    a walk over the divisors, not over every size up to the GPUs."""
    most = num_gpus // (plan["tp"] * plan["pp"])
    b = plan["micro_batch_size"]
    if most < 1 or global_batch_size % b:
        return None
    return largest_divisor_at_most(global_batch_size // b, most)


@functools.lru_cache(maxsize=1 << 12)
def largest_divisor_at_most(n: int, most: int) -> int:
    """The largest divisor of ``n >= 1`` that is at most ``most >= 1`` (trial division up to
    ``sqrt(n)``, at most 10^4 steps for the largest global batch a spec takes)."""
    if n <= most:
        return n
    best, i = 1, 1
    while i * i <= n:
        if n % i == 0:
            if i <= most:
                best = max(best, i)
            if n // i <= most:
                best = max(best, n // i)
        i += 1
    return best


def prerequisite(tech: Technique, ladder=None) -> Technique | None:
    """The technique ``tech`` comes after (:attr:`Technique.after`), looked up by name in
    ``ladder`` (default :data:`LADDER`); None when it has none or the ladder lacks it."""
    if not tech.after:
        return None
    return next((t for t in (LADDER if ladder is None else ladder) if t.name == tech.after), None)


def prerequisite_unmet(tech: Technique, plan: dict, ladder=None) -> str:
    """Why ``tech`` cannot be added to ``plan`` yet (empty when it can): the plan lacks the
    values of the technique it comes after (:func:`prerequisite`)."""
    pre = prerequisite(tech, ladder)
    if pre is None or all(plan.get(k) == v for k, v in pre.values.items()):
        return ""
    return f"{tech.name} comes after {pre.name}"


def why_not(tech: Technique, plan: dict, ctx: Context, ladder=None) -> tuple[dict | None, str]:
    """``(new plan, "")`` with ``tech`` applied to ``plan``, or ``(None, why it is no candidate)``
    (the rules: this module's docstring, "The ladder")."""
    new = {**plan, **tech.values}
    if new == plan:
        return None, "in the plan already"
    after = prerequisite_unmet(tech, plan, ladder)
    if after:
        return None, after
    why = rule_breach(new, (tech,), ctx)
    return (None, why) if why else (new, "")


def rule_breach(plan: dict, techs, ctx: Context) -> str:
    """Why ``plan``, with the techniques ``techs`` in it, is not one to price (empty when it is):
    a technique's own rule (:attr:`Technique.when`), no data-parallel size, a technique whose
    registry settings all have no effect on the plan, or a requirement unmet."""
    from ..model.settings import BY_NAME, canonical_values, unmet_requirements
    for tech in techs:
        why = tech.when(plan, ctx) if tech.when is not None else None
        if why:
            return why
    dp = data_parallel_size(plan, ctx.num_gpus, ctx.global_batch_size)
    if dp is None:
        return (f"no data-parallel size divides the global batch of {ctx.global_batch_size} in micro-batches "
                f"of {plan['micro_batch_size']}")
    values = canonical_values({**_defaults(), **{k: v for k, v in plan.items() if k in BY_NAME}})
    # the kernels' plan kind: "dp" is dp x cp (cp is 1 here)
    sizes_are_1 = {"tp": plan["tp"] == 1, "pp": plan["pp"] == 1, "dp": dp == 1, "cp": True}
    for tech in techs:
        named = [k for k in tech.values if k in BY_NAME]
        if named and all(BY_NAME[k].has_no_effect(sizes_are_1, values) for k in named):
            return f"{tech.name}: no effect on this plan"
    unmet = unmet_requirements(values, sizes_are_1)
    if unmet:
        st, other, v = unmet[0]
        return f"{st.name} needs {other} = {str(v).lower()}"
    return ""


def combinations(ladder, start: dict, ctx: Context) -> tuple[list[tuple[dict, list]], str]:
    """Every plan the ladder's values make (the search :func:`advise` checks its ladder
    against): the records grouped by the columns they set, one record of each group or none (the
    start's values), less the plans :func:`rule_breach` refuses. Returns ``(plan, the records in
    it)`` pairs and a note (empty, or why there is no search: two groups that set a column both)."""
    import itertools
    groups: dict[tuple, list] = {}
    for tech in ladder:
        groups.setdefault(tuple(sorted(tech.values)), []).append(tech)
    keys = [k for g in groups for k in g]
    if len(keys) != len(set(keys)):
        return [], "no exhaustive search: two records set some columns together and others apart"
    options = []
    for g, techs in groups.items():
        back = {k: start[k] for k in g}
        options.append([None] + [t for t in techs if t.values != back])
    plans = []
    for combo in itertools.product(*options):
        applied = [t for t in combo if t is not None]
        plan = dict(start)
        for t in applied:
            plan.update(t.values)
        if not rule_breach(plan, applied, ctx):
            plans.append((plan, applied))
    return plans, ""


def _defaults() -> dict:
    from ..model.settings import SETTINGS
    return {s.name: s.default for s in SETTINGS}


def _row(plan: dict, base: dict, ctx: Context) -> dict:
    """The evaluate row of ``plan`` (``dp`` derived) on top of ``base`` (model, gpu, batch,
    tokens, the user's cluster values)."""
    dp = data_parallel_size(plan, ctx.num_gpus, ctx.global_batch_size)
    return {**base, **plan, "dp": dp}


def _price(rows: list[dict], where: str, calibration, gpu_presets, models) -> tuple[pl.DataFrame, list[int], list[str]]:
    """Price ``rows`` in one :func:`evaluate_frame` call (one per row when the frame is refused:
    the refused rows are dropped with a note). Returns the priced frame, the positions of
    ``rows`` it holds and the notes."""
    from .evaluate import evaluate_frame
    if not rows:
        return pl.DataFrame(), [], []
    try:
        return evaluate_frame(pl.DataFrame(rows), where, calibration, gpu_presets, models), list(range(len(rows))), []
    except InputError:
        if len(rows) == 1:
            raise
    frames, kept, notes = [], [], []
    for i, r in enumerate(rows):
        try:
            frames.append(evaluate_frame(pl.DataFrame([r]), where, calibration, gpu_presets, models))
            kept.append(i)
        except InputError as e:
            notes.append(str(e))
    return (pl.concat(frames, how="vertical_relaxed") if frames else pl.DataFrame()), kept, notes


def _change_text(tech: Technique, plan: dict) -> str:
    def val(v):
        return str(v).lower() if isinstance(v, bool) else str(v)
    return ", ".join(f"{k} {val(plan[k])} -> {val(v)}" for k, v in tech.changes)


def advise(model: str, gpu: str, num_gpus: int, days: float | None = None, budget_usd: float | None = None,
           num_tokens: float | None = None, settings: dict | None = None, gpu_presets: dict | None = None,
           calibration: dict | None = None, *, global_batch_size: int | None = None,
           threshold: float = DEFAULT_THRESHOLD, memory_margin: float | None = None, models: dict | None = None,
           techniques: tuple | None = None, rule: str = "best-plan") -> AdviseResult:
    """Which technique to turn on first: from plain data parallelism on ``num_gpus`` x ``gpu``
    to the best plan, one technique a step (the start, the ladder and the rules: this module's
    docstring).

    Parameters
    ----------
    model : str
        A model preset (``vtrain-fast presets``) or a model of ``models``.
    gpu : str
        A GPU preset or a GPU of ``gpu_presets``.
    num_gpus : int
        GPUs (nodes of the GPU's ``gpus_per_node``).
    days : float, optional
        A deadline: says whether the final plan trains the tokens in time.
    budget_usd : float, optional
        A budget (the GPU's ``usd_per_gpu_hour``): says whether the final plan costs less.
        Not with ``days``.
    num_tokens : float, optional
        Tokens to train (default :data:`TOKENS_PER_PARAMETER` per parameter, Chinchilla).
    settings : dict, optional
        The start's training settings (registry names, e.g. ``use_flash_attn = True`` when it is
        a given), cluster values (``gpus_per_node``, ``inter_node_Gbps``, ``reserved_GiB``, ...)
        and ``seq_length``; a technique whose values the start has is no candidate.
    gpu_presets, calibration, models : dict, optional
        As :func:`~vtrain_fast.analysis.evaluate.evaluate_frame`'s ``gpus``, ``calibration`` and
        ``models``.
    global_batch_size : int, optional
        Sequences per global batch (default: :data:`BATCH_TOKENS` tokens of ``seq_length``).
    threshold : float
        The least gain in iteration time of a greedy speed step, a fraction (default 1 %); also
        what the near-miss notes count as faster.
    memory_margin : float, optional
        A plan fits when its status is ``ok`` and, with this, when it leaves this fraction of the
        GPU's memory free (as ``plan --memory-margin``); without it the tables mark plans within
        5 % of the memory ``tight``.
    techniques : tuple of Technique, optional
        The ladder (default :data:`LADDER`).
    rule : str
        ``best-plan`` (default): the steps are the search's best plan's techniques in the
        fit-then-speed order (:func:`order_techniques`); ``greedy``: the greedy ladder, one
        technique per step (this module's docstring). See :data:`RULES`.

    Returns
    -------
    AdviseResult

    Raises
    ------
    InputError
        A bad option, an unknown model or GPU, or no plan the ladder reaches fits in memory
        (naming the techniques tried, the smallest memory reached and the fixes).
    """
    from ..hardware.gpus import PRESETS, with_overrides
    from ..io.schema import CLUSTER_COLUMNS
    from ..plan.models import MODEL_PRESETS
    known = gpu_presets or PRESETS
    models_known = models or MODEL_PRESETS
    if model not in models_known:
        raise InputError("command line", "--model", model, "a model preset (vtrain-fast presets) or a model of "
                         "--models", did_you_mean(model, models_known, "e.g. --model llama2-7b"))
    if gpu not in known:
        raise InputError("command line", "--gpus", gpu, "a GPU preset (vtrain-fast presets)",
                         did_you_mean(gpu, known, "e.g. --gpus rtx4090-pcie-24gb:8"))
    num_gpus = _positive("--gpus", num_gpus, 10_000_000, whole=True)
    if days is not None and budget_usd is not None:
        raise InputError("command line", "--days and --budget-usd", f"{days} and {budget_usd}", "one of them",
                         "give the deadline (--days D) or the budget (--budget-usd X)")
    days = None if days is None else _positive("--days", days, 36500.0)
    budget_usd = None if budget_usd is None else _positive("--budget-usd", budget_usd, 1e15)
    num_tokens = None if num_tokens is None else _positive("--tokens", num_tokens, 1e16)
    if not (isinstance(threshold, (int, float)) and not isinstance(threshold, bool) and 0.0 <= threshold < 1.0):
        raise InputError("command line", "--threshold", threshold, "a fraction from 0 to below 1",
                         "e.g. --threshold 0.01 (a speed step must gain 1 %)")
    if rule not in RULES:
        raise InputError("command line", "--rule", rule, " or ".join(RULES),
                         did_you_mean(str(rule), RULES, "e.g. --rule best-plan"))
    from .query import DEFAULT_MEMORY_MARGIN, check_memory_margin
    check_memory_margin("command line", memory_margin)
    settings = _check_settings(dict(settings or {}))
    shape = models_known[model].resolved()
    seq = settings.get("seq_length", shape.seq_length)
    if global_batch_size is None:
        global_batch_size = max(1, round(BATCH_TOKENS / seq))
        batch_note = (f"global batch {global_batch_size:,} sequences of {seq:,} tokens: the default "
                      f"{BATCH_TOKENS / 2 ** 20:g} Mi tokens per batch (Llama 2's 4M-token batch), rounded "
                      "(--global-batch-size changes it)")
    else:
        global_batch_size = _positive("--global-batch-size", global_batch_size, 1 << 24, whole=True)
        batch_note = f"global batch {global_batch_size:,} sequences of {seq:,} tokens (--global-batch-size)"
    cluster = {k: v for k, v in settings.items() if k in CLUSTER_COLUMNS}
    preset = with_overrides(known[gpu], (calibration or {}).get(gpu), **cluster)
    ctx = Context(preset, num_gpus, shape, global_batch_size)
    ladder, notes = usable_techniques(LADDER if techniques is None else techniques)
    notes = [batch_note] + notes

    knobs = start_plan(ladder, settings)
    from ..plan.spec import has_precision
    if "precision" not in settings and not has_precision(preset, knobs["precision"]):
        notes.append(f"the start is bf16, not {knobs['precision']}: {gpu} states no {knobs['precision']} peak "
                     "(its GPU file's peak_fp32_tflops / peak_tf32_tflops)")
        knobs["precision"] = "bf16"
    base = {"model": model, "gpu": gpu, "global_batch_size": global_batch_size, **cluster,
            **({"seq_length": seq} if "seq_length" in settings else {})}
    where = f"advise ({model} on {num_gpus} x {gpu})"
    start_dp = data_parallel_size(knobs, num_gpus, global_batch_size)
    if start_dp < num_gpus:
        notes.append(f"the start uses {start_dp} of the {num_gpus} GPUs: dp {start_dp} is the largest size that "
                     f"divides the global batch of {global_batch_size:,} (--global-batch-size)")

    # the tokens: priced once to read the parameters
    first, _, _ = _price([{**_row(knobs, base, ctx), "num_tokens": 1e9}], where, calibration, gpu_presets, models)
    start_row = first.row(0, named=True)
    if start_row["status"] not in ("ok", "out_of_memory"):
        from ..io.schema import STATUS_COLUMN
        raise InputError(where, "the start's status", start_row["status"], "ok or out_of_memory (a plan Megatron-LM "
                         f"runs: tp 1, pp 1, dp {start_row['dp']}, micro-batch 1; statuses: {STATUS_COLUMN.doc})",
                         "check the --set values (an MoE model's ep must divide its experts and dp) and "
                         "--global-batch-size")
    n_params = float(start_row["num_parameters"])
    if num_tokens is None:
        num_tokens = TOKENS_PER_PARAMETER * n_params
        notes.append(f"tokens: {num_tokens:.3g}, {TOKENS_PER_PARAMETER:g} per parameter (Chinchilla, Hoffmann et al. "
                     f"2022; {n_params:.3g} parameters; --tokens changes it)")
    base["num_tokens"] = float(num_tokens)

    capacity = preset.hbm_GiB

    def fits(r) -> bool:
        return r["status"] == "ok" and (not memory_margin
                                        or capacity - r["memory_per_gpu_GiB"] >= memory_margin * capacity)

    def price(rows):
        return _price(rows, where, calibration, gpu_presets, models)

    # the greedy ladder (the rule's steps under --rule greedy; under best-plan what it is compared with)
    g_steps, g_tried, g_notes, g_misses, plan, cur = _greedy(ladder, knobs, base, ctx, price, fits, threshold,
                                                             memory_margin)
    notes += g_notes

    # the search: every plan the ladder's values make, the best that fits
    found, search_note = combinations(ladder, knobs, ctx)
    if search_note:
        notes.append(search_note)
    space, kept, _ = price([_row(q, base, ctx) for q, _ in found])
    found = [found[i] for i in kept]
    srows = space.rows(named=True) if found else []
    best, best_plan, best_techs = None, None, []
    good = [k for k, r in enumerate(srows) if fits(r)]
    if good:
        k = min(good, key=lambda j: (srows[j]["iteration_time_s"], srows[j]["memory_per_gpu_GiB"], j))
        best, (best_plan, best_techs) = srows[k], found[k]
    if best is None:
        if fits(cur):       # the search lost the ladder's plan (a search note says why): the ladder's it is
            best, best_plan, best_techs = cur, plan, [s["tech"] for s in g_steps[1:]]
        else:
            least = float(space.filter(pl.col("status").is_in(["ok", "out_of_memory"]))["memory_per_gpu_GiB"].min()
                          ) if space.height else math.inf
            raise _hopeless(model, gpu, num_gpus, g_steps, g_tried, capacity, known, memory_margin, least,
                            len(found))

    margin = DEFAULT_MEMORY_MARGIN if memory_margin is None else memory_margin
    g_table = _steps_table(g_steps, [fits(s["row"]) for s in g_steps], capacity, margin)
    greedy_table = None
    if rule == "greedy":
        steps, tried, table = g_steps, g_tried, g_table
        notes += g_misses
        if fits(cur):
            source = "ladder"
            final = table.row(table.height - 1, named=True)
            in_plan = [(s["step"], s["tech"]) for s in steps[1:] if all(plan[k] == v for k, v in s["tech"].changes)]
            final_plan = plan
        else:
            source = "search"
            final = dict(best)
            in_plan = [(None, t) for t in best_techs]
            final_plan = best_plan
            notes.append(f"the ladder ends out of memory ({cur['memory_per_gpu_GiB']:.1f} GiB after step "
                         f"{len(steps) - 1}): its one-step rule found no way in, so the final plan is the search's "
                         f"best (the fastest of the {len(found):,} plans the ladder's values make that fits)")
            notes += _plan_misses(ladder, best_plan, best, _index(found, srows), fits, capacity, memory_margin,
                                  threshold)
    else:
        index = _index(found, srows)
        # a technique of the best plan that comes after another (FP8 after mixed precision) brings it
        for t in list(best_techs):
            pre = prerequisite(t, ladder)
            if pre is not None and pre not in best_techs and prerequisite_unmet(t, knobs, ladder):
                best_techs = [pre, *best_techs]
        steps, tried_rows = order_techniques(best_techs, g_steps[0], index, fits, ladder)
        tried = (pl.DataFrame(tried_rows, infer_schema_length=None) if tried_rows else pl.DataFrame())
        table = _steps_table(steps, [fits(s["row"]) for s in steps], capacity, margin)
        source = "best-plan"
        final = table.row(table.height - 1, named=True)
        in_plan = [(s["step"], t) for s in steps[1:] for t in s["techs"]]
        final_plan = best_plan
        greedy_table = g_table
        g_last = g_steps[-1]["row"]
        if fits(cur):
            notes.append(f"the greedy rule (--rule greedy: one technique per step, the one that fits else the largest "
                         f"memory cut, then the fastest) ends at {g_last['iteration_time_s']:.1f} s per iteration "
                         f"after {len(g_steps) - 1} steps, "
                         f"{g_last['iteration_time_s'] / final['iteration_time_s']:.2f}x this plan's time")
        else:
            notes.append(f"the greedy rule (--rule greedy) ends out of memory ({g_last['memory_per_gpu_GiB']:.1f} GiB "
                         f"after {len(g_steps) - 1} steps)")
        notes += _plan_misses(ladder, best_plan, best, index, fits, capacity, memory_margin, threshold)
    without = _without(in_plan, final_plan, knobs, base, ctx, where, calibration, gpu_presets, models, fits)
    gap = final["iteration_time_s"] / best["iteration_time_s"]
    if source == "ladder" and gap > 1.0 / (1.0 - threshold):
        diff = _plan_difference(final_plan, best_plan)
        notes.append(f"the search's best plan is {gap:.2f}x faster than the ladder's final plan ({diff}): the ladder "
                     "takes one technique at a time, so it cannot see that several cheaper ones together fit where no "
                     "single one does, nor undo an early step that one of them would replace (--rule best-plan, the "
                     "default, orders the best plan's techniques instead)")
    target = _target(table, final, best, days, budget_usd, num_gpus)
    notes += _caveats(preset, calibration, gpu, getattr(shape, "num_experts", 0) > 0)
    if final.get("precision") == "fp8" or best.get("precision") == "fp8":
        notes.append("precision fp8: MFU counts the bf16 peak (MFU's convention) under FP8 too, and FP8 GEMMs run at "
                     f"up to {preset.peak_fp8_tflops / preset.peak_tflops:.1f}x it on {gpu}, so MFU above 50 % is "
                     "possible")
    return AdviseResult(steps=table, final=final, without=without, tried=tried, target=target, model=model, gpu=gpu,
                        num_gpus=num_gpus, global_batch_size=global_batch_size, num_tokens=float(num_tokens),
                        threshold=float(threshold), capacity_GiB=capacity, notes=notes, final_source=source,
                        best=best, searched=len(found), memory_margin=memory_margin, rule=rule,
                        greedy=greedy_table)


def start_plan(ladder, settings: dict | None = None) -> dict:
    """The start's plan columns: :data:`START`, then every registry setting the ladder's records
    set at its registry default unless :data:`START` names it, then the user's ``settings``
    (registry settings only; cluster values and ``seq_length`` go to the evaluate row)."""
    from ..model.settings import BY_NAME
    plan = {}
    for tech in ladder:
        for k, _ in tech.changes:
            if k in BY_NAME:
                plan.setdefault(k, BY_NAME[k].default)
    plan.update(START)
    plan.update({k: v for k, v in (settings or {}).items() if k in BY_NAME})
    return plan


def _greedy(ladder, knobs: dict, base: dict, ctx: Context, price, fits, threshold, memory_margin):
    """The greedy rule (this module's docstring): ``(steps, tried, notes, near-miss notes, last
    plan, last row)``;
    ``steps`` dicts of ``step``, ``technique``, ``change``, ``phase``, ``row``, ``plan``, ``tech``
    (and ``techs``, the one technique as a list)."""
    cur_frame, _, _ = price([_row(knobs, base, ctx)])
    cur = cur_frame.row(0, named=True)
    plan = dict(knobs)
    steps = [dict(step=0, technique="start (plain DP)", change="", phase="start", row=cur, plan=dict(plan),
                  techs=[])]
    tried_frames, notes, misses = [], [], []
    seen_notes = set()
    while len(steps) <= MAX_STEPS:
        cands = []
        for tech in ladder:
            new, _ = why_not(tech, plan, ctx, ladder)
            if new is not None:
                cands.append((tech, new))
        priced, kept, refused = price([_row(new, base, ctx) for _, new in cands])
        for msg in refused:
            if msg not in seen_notes:
                seen_notes.add(msg)
                notes.append(f"a candidate was refused by the cost model: {msg}")
        cands = [cands[i] for i in kept]
        if not cands:
            break
        step = len(steps)
        tried_frames.append(priced.with_columns(pl.lit(step).alias("step"),
                                                pl.Series("technique", [t.name for t, _ in cands])))
        rows = priced.rows(named=True)
        fits_now = fits(cur)
        pick = None
        if not fits_now:
            lower = [(k, r) for k, r in enumerate(rows) if r["status"] in ("ok", "out_of_memory")
                     and r["memory_per_gpu_GiB"] < cur["memory_per_gpu_GiB"]]
            fit = [(k, r) for k, r in lower if fits(r)]
            if fit:
                pick = min(fit, key=lambda kr: (kr[1]["iteration_time_s"], kr[1]["memory_per_gpu_GiB"], kr[0]))
            elif lower:
                pick = min(lower, key=lambda kr: (kr[1]["memory_per_gpu_GiB"], kr[1]["iteration_time_s"], kr[0]))
        else:
            limit = cur["iteration_time_s"] * (1.0 - threshold)
            faster = [(k, r) for k, r in enumerate(rows) if fits(r) and r["iteration_time_s"] <= limit
                      and r["iteration_time_s"] < cur["iteration_time_s"]]
            if faster:
                pick = min(faster, key=lambda kr: (kr[1]["iteration_time_s"], kr[1]["memory_per_gpu_GiB"], kr[0]))
        if pick is None:
            if fits_now:
                misses = _near_misses([t.name for t, _ in cands], rows, cur, threshold, fits, ctx.preset.hbm_GiB,
                                      memory_margin)
            break
        k, row = pick
        tech, new = cands[k]
        steps.append(dict(step=step, technique=tech.name, change=_change_text(tech, plan),
                          phase="speed" if fits_now else "fit", row=row, plan=dict(new), tech=tech, techs=[tech]))
        plan, cur = new, row
    tried = pl.concat(tried_frames, how="vertical_relaxed") if tried_frames else pl.DataFrame()
    return steps, tried, notes, misses, plan, cur


def _key(plan: dict) -> tuple:
    return tuple(sorted(plan.items()))


def _index(found, srows) -> dict:
    """The search's priced plans by their columns: ``{key: row}``."""
    return {_key(q): r for (q, _), r in zip(found, srows)}


def order_techniques(techs, start: dict, index: dict, fits, ladder) -> tuple[list[dict], list[dict]]:
    """The best-plan rule: the techniques ``techs`` of the search's best plan, added to the start
    one at a time in the fit-then-speed order.

    While the plan does not fit, add the technique whose addition fits (the fastest, if several
    do; ties: less memory, then ladder order) or else the one that leaves the least memory (ties:
    faster, then ladder order); once it fits, add the one that, still fitting, gives the lowest
    iteration time (the largest speed-up; it may be below 1 where a memory technique makes room
    for a later one), each re-priced on the plan so far. Every plan on the way is a plan of the
    search (a subset of the best plan's techniques, one record of each group or none), so its
    price is read from ``index`` (:func:`_index`); a plan the search refused
    (:func:`rule_breach`: sequence parallelism before tensor parallelism, an overlapped
    all-gather before ZeRO) is no candidate. Where no single technique qualifies (none is a plan
    of the search, or none keeps a fitting plan fitting) the smallest group of them that does is
    one step; the whole rest is the best plan itself, so the order ends there.

    Parameters
    ----------
    techs : list of Technique
        The best plan's records (:func:`combinations`' second item).
    start : dict
        The start step (``row``, ``plan``), :func:`_greedy`'s first.
    index : dict
        The search's priced plans.
    fits : callable
        ``fits(row) -> bool``.
    ladder : sequence of Technique
        For the ties (ladder order).

    Returns
    -------
    (steps, tried)
        Step dicts as :func:`_greedy`'s (``techs``: the records a step adds; ``phase`` ``fit``
        while the plan before it did not fit, else ``speed``) and the rows of every candidate
        (with ``step`` and ``technique``).
    """
    import itertools
    order = {id(t): i for i, t in enumerate(ladder)}
    plan, cur = dict(start["plan"]), start["row"]
    steps, tried = [dict(start)], []
    rest = sorted(techs, key=lambda t: order.get(id(t), len(order)))
    while rest:
        fits_now = fits(cur)
        chosen = None
        for size in range(1, len(rest) + 1):
            cands = []
            for combo in itertools.combinations(rest, size):
                new, ok = dict(plan), True
                for t in combo:                 # in ladder order; each after its prerequisite
                    if prerequisite_unmet(t, new, ladder):
                        ok = False
                        break
                    new.update(t.values)
                if not ok:
                    continue
                row = index.get(_key(new))
                if row is not None and row["status"] in ("ok", "out_of_memory"):
                    cands.append((combo, new, row))
            tried += [{**row, "step": len(steps), "technique": " + ".join(t.name for t in combo)}
                      for combo, _, row in cands]
            pos = [tuple(order.get(id(t), len(order)) for t in c) for c, _, _ in cands]
            fitting = [k for k, (_, _, r) in enumerate(cands) if fits(r)]
            if fitting:
                k = min(fitting, key=lambda j: (cands[j][2]["iteration_time_s"], cands[j][2]["memory_per_gpu_GiB"],
                                                pos[j]))
            elif cands and not fits_now:
                k = min(range(len(cands)), key=lambda j: (cands[j][2]["memory_per_gpu_GiB"],
                                                          cands[j][2]["iteration_time_s"], pos[j]))
            else:
                continue
            chosen = cands[k]
            break
        if chosen is None:
            break               # not reached: the whole rest is the best plan, which fits
        combo, new, row = chosen
        change = "; ".join(_change_text(t, plan) for t in combo)
        steps.append(dict(step=len(steps), technique=" + ".join(t.name for t in combo), change=change,
                          phase="speed" if fits_now else "fit", row=row, plan=dict(new), tech=combo[0],
                          techs=list(combo)))
        plan, cur = new, row
        rest = [t for t in rest if all(t is not c for c in combo)]
    return steps, tried


def _plan_misses(ladder, plan, row, index, fits, capacity, memory_margin, threshold) -> list[str]:
    """The near-misses of the best plan: the ladder's records that, added to it, make a plan of
    the search faster by the threshold that does not fit."""
    cands, rows = [], []
    for tech in ladder:
        new = {**plan, **tech.values}
        r = index.get(_key(new))
        if new != plan and r is not None:
            cands.append(tech.name)
            rows.append(r)
    return _near_misses(cands, rows, row, threshold, fits, capacity, memory_margin)


def _plan_difference(a: dict, b: dict) -> str:
    """``b``'s values where they differ from ``a``'s, in words: ``tp 1, pp 4, zero_stage 2``."""
    def val(v):
        return str(v).lower() if isinstance(v, bool) else str(v)
    return ", ".join(f"{k} {val(b[k])}" for k in a if a[k] != b[k]) or "the same plan"


def _near_misses(cands, rows, cur, threshold, fits, capacity, memory_margin) -> list[str]:
    """A note naming the candidates (``cands``: names; ``rows``: their evaluate rows) of the last
    plan ``cur`` that would be faster by the threshold but do not fit (what more memory would buy
    next)."""
    limit = cur["iteration_time_s"] * (1.0 - threshold)
    near = sorted((r["iteration_time_s"], k) for k, r in enumerate(rows)
                  if r["status"] == "out_of_memory" or (r["status"] == "ok" and not fits(r)))
    near = [(t, k) for t, k in near if t <= limit][:4]
    if not near:
        return []
    room = f"{capacity:.1f} GiB" + (f" less the --memory-margin {memory_margin:g}" if memory_margin else "")
    parts = [f"{cands[k]} ({cur['iteration_time_s'] / t:.2f}x, {rows[k]['memory_per_gpu_GiB']:.1f} GiB)"
             for t, k in near]
    return [f"faster next steps that do not fit in the {room}: " + ", ".join(parts)]


def _steps_table(steps: list[dict], fits: list[bool], capacity: float, margin: float) -> pl.DataFrame:
    rows = [s["row"] for s in steps]
    frame = pl.DataFrame(rows, infer_schema_length=None)
    it = frame["iteration_time_s"].to_list()
    mem = frame["memory_per_gpu_GiB"].to_list()
    speedup = [1.0] + [it[i - 1] / it[i] for i in range(1, len(it))]
    saved = [0.0] + [mem[i - 1] - mem[i] for i in range(1, len(mem))]
    head = pl.DataFrame({
        "step": [s["step"] for s in steps], "technique": [s["technique"] for s in steps],
        "change": [s["change"] for s in steps], "phase": [s["phase"] for s in steps],
        "needed_to_fit": [s["phase"] == "fit" for s in steps],
        "fits": fits, "memory_tight": [capacity - r["memory_per_gpu_GiB"] < margin * capacity for r in rows],
        "speedup": speedup, "memory_saved_GiB": saved},
        schema={"step": pl.Int64, "technique": pl.String, "change": pl.String, "phase": pl.String,
                "needed_to_fit": pl.Boolean, "fits": pl.Boolean, "memory_tight": pl.Boolean, "speedup": pl.Float64,
                "memory_saved_GiB": pl.Float64})
    return pl.concat([head, frame], how="horizontal")


def _without(in_plan, plan, start, base, ctx, where, calibration, gpu_presets, models, fits) -> pl.DataFrame:
    """The final plan ``plan`` without each technique of ``in_plan`` (``(step, technique)``), its
    columns set back to ``start``'s, or to its prerequisite's (:func:`prerequisite`) when the plan
    has that (see :class:`AdviseResult`). Where the plan without it is one
    Megatron-LM refuses (:func:`rule_breach`: an overlapped all-gather without ZeRO, CPU offload
    without the precision-aware optimizer), the techniques that need it go too (the fewest that
    make it a plan; the label names them in brackets); where none do, the technique has no row."""
    import itertools
    rows, labels = [], []
    techs = [t for _, t in in_plan]
    for step, tech in in_plan:
        # back to the start's values, or to those of the technique it comes after when the plan has
        # it (FP8 without FP8 is the plan in bf16, not in fp32)
        pre = prerequisite(tech, techs)         # (looked up among the plan's own techniques)
        to = pre.values if pre is not None else {k: start[k] for k in tech.values}
        back = {**plan, **{k: to.get(k, start[k]) for k in tech.values}}
        if back == plan:
            continue            # a record of the start's values (no recomputation): nothing to take away
        others = [t for t in techs if t is not tech and any(plan[k] != start[k] for k in t.values)]
        label, found = tech.name, None
        for size in range(0, min(2, len(others)) + 1):
            for extra in itertools.combinations(others, size):
                q = dict(back)
                for t in extra:
                    q.update({k: start[k] for k in t.values})
                if not rule_breach(q, [t for t in others if t not in extra], ctx):
                    found = q
                    if extra:
                        label = f"{tech.name} (and {', '.join(t.name for t in extra)})"
                    break
            if found is not None:
                break
        if found is None:
            continue
        # the techniques that come after it (FP8 after mixed precision) go with it
        after = [t.name for t in techs if prerequisite(t, techs) is tech and any(found[k] != plan[k] for k in t.values)]
        if after:
            label = (label[:-1] + ", " if label.endswith(")") else label + " (and ") + ", ".join(after) + ")"
        rows.append(_row(found, base, ctx))
        labels.append((step, label))
    schema = {"step": pl.Int64, "technique": pl.String, "status": pl.String, "fits": pl.Boolean,
              "memory_per_gpu_GiB": pl.Float64, "iteration_time_s": pl.Float64}
    if not rows:
        return pl.DataFrame(schema=schema)
    priced, kept, _ = _price(rows, where, calibration, gpu_presets, models)
    out = [dict(step=labels[i][0], technique=labels[i][1], status=r["status"], fits=fits(r),
                memory_per_gpu_GiB=r["memory_per_gpu_GiB"], iteration_time_s=r["iteration_time_s"])
           for i, r in zip(kept, priced.rows(named=True))]
    return pl.DataFrame(out, schema=schema)


def _target(table: pl.DataFrame, final: dict, best: dict | None, days, budget_usd, num_gpus) -> dict | None:
    if days is None and budget_usd is None:
        return None
    kind, limit, col = ("days", days, "train_days") if days is not None else ("budget_usd", budget_usd, "cost_usd")
    value = float(final[col])
    ok_rows = table.filter(pl.col("fits") & (pl.col(col) <= limit))
    first = int(ok_rows["step"][0]) if ok_rows.height else None
    meets = value <= limit
    tokens = final["num_tokens"]
    if kind == "days":
        if meets:
            msg = f"meets --days {limit:g}: {value:.1f} days for {tokens:.3g} tokens"
        else:
            msg = (f"does not meet --days {limit:g}: {value:.1f} days for {tokens:.3g} tokens; in {limit:g} days it "
                   f"trains {tokens * limit / value:.3g} tokens (--tokens), or it needs about "
                   f"{math.ceil(num_gpus * value / limit):,} GPUs if time fell as 1 / GPUs (more, as it falls slower)")
    else:
        if meets:
            msg = f"meets --budget-usd {limit:,.0f}: ${value:,.0f} for {tokens:.3g} tokens"
        else:
            msg = (f"does not meet --budget-usd {limit:,.0f}: ${value:,.0f} for {tokens:.3g} tokens; the budget "
                   f"trains {tokens * limit / value:.3g} tokens with this plan (--tokens)")
    if first is not None and first < table.height - 1:
        msg += f" (the steps meet it from step {first} on)"
    if not meets and best is not None and best[col] <= limit:
        msg += (f"; the search's best plan meets it: {best['train_days']:.1f} days for ${best['cost_usd']:,.0f}")
    return dict(kind=kind, limit=float(limit), value=value, meets=meets, first_step=first, message=msg)


def _hopeless(model, gpu, num_gpus, steps, tried, capacity, known, memory_margin, least, searched) -> InputError:
    """The error of a ladder that ends out of memory where no plan of the search fits either: what
    was tried, the least memory reached, and the fixes."""
    reached = min([s["row"]["memory_per_gpu_GiB"] for s in steps] + [least])
    if tried.height:
        ok = tried.filter(pl.col("status").is_in(["ok", "out_of_memory"]))
        if ok.height:
            reached = min(reached, float(ok["memory_per_gpu_GiB"].min()))
    names = list(dict.fromkeys(tried["technique"].to_list())) if tried.height else []
    applied = [s["technique"] for s in steps[1:]]
    states = steps[-1]["row"].get("model_states_GiB")
    bigger = sorted((g for g in known.values() if g.hbm_GiB > reached),
                    key=lambda g: (g.hbm_GiB, g.name))
    last = steps[-1]["row"]["memory_per_gpu_GiB"]
    room = capacity * (1.0 - (memory_margin or 0.0)) - (last - states) if states is not None else 0.0
    need = f"at least ~{math.ceil(num_gpus * states / room):,}, " if room > 0 else ""
    fix = [f"more GPUs than {num_gpus} ({need}if the last plan's model states, {states:.1f} GiB per GPU, shrank "
           "as 1 / GPUs, with ZeRO-3 or pipeline parallelism, and the rest stayed)" if states is not None
           else "more GPUs",
           "a bigger GPU" + (f" (at least {reached:.0f} GiB: e.g. {', '.join(g.name for g in bigger[:2])}, at the "
                             "same count)" if bigger else ""),
           "or a smaller model"]
    return InputError(f"advise ({model} on {num_gpus} x {gpu})", "memory per GPU", f"{reached:.1f} GiB",
                      f"a plan that fits in the {capacity:.1f} GiB of a {gpu}"
                      + (f" with {memory_margin:.0%} of it free (--memory-margin)" if memory_margin else "")
                      + ": none does. From plain data "
                      f"parallelism ({steps[0]['row']['memory_per_gpu_GiB']:.1f} GiB per GPU) the greedy ladder "
                      "applied "
                      + (", ".join(applied) if applied else "nothing") + f" and reached "
                      f"{steps[-1]['row']['memory_per_gpu_GiB']:.1f} GiB; techniques tried: "
                      + (", ".join(names) if names else "none applied to this plan")
                      + f"; none of the {searched:,} plans their values make fits either (the least memory: "
                      f"{reached:.1f} GiB)",
                      "; ".join(fix))


def _caveats(preset, calibration, gpu, moe: bool) -> list[str]:
    notes = [f"precision: the start is {'fp32' if START.get('precision') == 'fp32' and preset.peak_fp32_tflops > 0 else 'bf16'}"
             " (GEMMs at the FP32 peak, 4-byte activations; --set precision=... changes it); TF32 and fp16 with loss "
             "scaling are priced too but not in the ladder, and the FP32 / TF32 GEMMs take the bf16-fitted GEMM "
             "efficiency (an assumption)"]
    if not preset.calibrated and not (calibration or {}).get(gpu):
        notes.append(f"{gpu} is not calibrated: its efficiencies are published or assumed (its GPU file says "
                     "which) and no iteration time of it was measured here; fit them with vtrain-fast calibrate "
                     "before trusting absolute numbers")
    notes.append("not in the ladder: activation offloading (cpu_offloading_num_layers) and parameter offloading "
                 "(param_cpu_offload, FSDP2 with ZeRO-3), which the cost model prices (--set them to start from one), "
                 "interleaved 1F1B (vpp), context parallelism, TP communication overlap"
                 + (", expert parallelism (--set ep=N starts from it)" if moe else ""))
    return notes


# The columns of the steps table printed (the -o file has every column).
SHOWN = ("step", "technique", "change", "iteration_time_s", "tokens_per_s", "memory_per_gpu_GiB", "mfu",
         "train_days", "cost_usd", "speedup", "memory_saved_GiB", "needed_to_fit")


def steps_display(res: AdviseResult) -> pl.DataFrame:
    """The steps table as printed: :data:`SHOWN` (short headers), the memory marked ``fits``,
    ``tight`` (within 5 % of the GPU's memory, or of ``memory_margin``), ``margin`` (inside the
    margin asked for) or ``OOM``."""
    t = res.steps
    mem = [f"{m:.1f} " + ("OOM" if st == "out_of_memory" else "margin" if not f else "tight" if tight else "fits")
           for m, f, tight, st in zip(t["memory_per_gpu_GiB"].to_list(), t["fits"].to_list(),
                                      t["memory_tight"].to_list(), t["status"].to_list())]
    return (t.select(SHOWN)
            .with_columns(pl.Series("memory_per_gpu_GiB", mem, dtype=pl.String),
                          pl.col("speedup").map_elements(lambda v: f"{v:.2f}x", return_dtype=pl.String),
                          pl.col("needed_to_fit").map_elements(lambda v: "yes" if v else "", return_dtype=pl.String))
            .rename({"tokens_per_s": "tokens/s", "train_days": "days", "memory_saved_GiB": "saved_GiB",
                     "needed_to_fit": "to_fit"}))


def final_plan_lines(res: AdviseResult) -> list[str]:
    """The final plan in words: its layout, and every setting that differs from the registry's
    default, with its Megatron-LM flag."""
    from ..model.settings import SETTINGS
    f = res.final
    lines = [f"{f['gpu']} x {f['num_gpus']} ({f['num_nodes']} node{'s' if f['num_nodes'] != 1 else ''}): "
             f"tp {f['tp']}, pp {f['pp']}, dp {f['dp']}, micro-batch {f['micro_batch_size']}, global batch "
             f"{f['global_batch_size']}, recompute {f['recompute']}"]
    for st in SETTINGS:
        v = f.get(st.name)
        if v is not None and v != st.default:
            lines.append(f"{st.name} = {str(v).lower() if isinstance(v, bool) else v} ({st.megatron})")
    lines.append("every other training setting at its default (vtrain_fast/model/settings.py)")
    lines.append(f"{f['iteration_time_s']:.2f} s per iteration, {f['tokens_per_s']:,.0f} tokens/s, "
                 f"{f['memory_per_gpu_GiB']:.1f} of {res.capacity_GiB:.1f} GiB per GPU, MFU {f['mfu']:.1%}; "
                 f"{f['num_tokens']:.3g} tokens in {f['train_days']:.1f} days for ${f['cost_usd']:,.0f}")
    return lines


def best_plan_lines(res: AdviseResult) -> list[str]:
    """The search's best plan in words (empty when the final plan is it, or there is none)."""
    from ..model.settings import SETTINGS
    b = res.best
    if b is None or res.final_source != "ladder":
        return []
    gap = res.final["iteration_time_s"] / b["iteration_time_s"]
    changed = [f"{st.name} = {str(b[st.name]).lower() if isinstance(b[st.name], bool) else b[st.name]}"
               for st in SETTINGS if st.name in b and b[st.name] != st.default]
    return [f"best of the {res.searched:,} plans the ladder's values make ({gap:.2f}x the final plan's speed): "
            f"tp {b['tp']}, pp {b['pp']}, dp {b['dp']}, micro-batch {b['micro_batch_size']}, recompute {b['recompute']}"
            + (", " + ", ".join(changed) if changed else ""),
            f"{b['iteration_time_s']:.2f} s per iteration, {b['memory_per_gpu_GiB']:.1f} GiB per GPU, MFU "
            f"{b['mfu']:.1%}; {b['train_days']:.1f} days for ${b['cost_usd']:,.0f}"]


def plot_advice(res: AdviseResult, path) -> None:
    """A bar chart of the steps: days for the tokens (left; the deadline dashed with ``days``)
    and memory per GPU against the GPU's memory (right); steps that do not fit hatched red and
    marked ``OOM``, and as a last, grey bar the search's best plan when the greedy ladder's final
    plan is not it, or under the best-plan rule the greedy ladder's final plan (what the rule
    beats). Written through :func:`~vtrain_fast.analysis.report.save_figure`."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .report import save_figure
    t = res.steps
    labels = [f"{s}. {n}" if s else "start" for s, n in zip(t["step"].to_list(), t["technique"].to_list())]
    fits = t["fits"].to_list()
    days = t["train_days"].to_list()
    mem = t["memory_per_gpu_GiB"].to_list()
    colors = ["tab:blue" if f else "tab:red" for f in fits]
    if res.best is not None and res.final_source == "ladder":
        labels.append("search's best")
        fits.append(True)
        days.append(res.best["train_days"])
        mem.append(res.best["memory_per_gpu_GiB"])
        colors.append("tab:gray")
    elif res.greedy is not None and res.greedy["fits"][-1]:
        labels.append("greedy rule's end")
        fits.append(True)
        days.append(res.greedy["train_days"][-1])
        mem.append(res.greedy["memory_per_gpu_GiB"][-1])
        colors.append("tab:gray")
    x = list(range(len(labels)))
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(max(8.0, 1.1 * len(labels) + 4), 4.8))
    for ax, values, title in ((a1, days, f"days for {res.num_tokens:.3g} tokens"), (a2, mem, "memory per GPU, GiB")):
        bars = ax.bar(x, values, color=colors)
        for b, f in zip(bars, fits):
            if not f:
                b.set_hatch("//")
                ax.annotate("OOM", (b.get_x() + b.get_width() / 2, b.get_height()), ha="center", va="bottom",
                            fontsize=8, color="tab:red")
        ax.set_xticks(x)
        ax.set_xticklabels(labels, rotation=40, ha="right", fontsize=8)
        ax.set_title(title, fontsize=10)
    if max(days) / max(min(days), 1e-9) > 20:
        a1.set_yscale("log")
    if res.target and res.target["kind"] == "days":
        a1.axhline(res.target["limit"], color="k", ls="--", lw=1, label=f"--days {res.target['limit']:g}")
        a1.legend(fontsize=8)
    a2.axhline(res.capacity_GiB, color="k", ls="--", lw=1, label=f"{res.gpu}: {res.capacity_GiB:.1f} GiB")
    a2.legend(fontsize=8)
    fig.suptitle(f"advise: {res.model} on {res.num_gpus} x {res.gpu}", fontsize=11)
    save_figure(fig, path)


__all__ = ["AdviseResult", "BATCH_TOKENS", "DEFAULT_THRESHOLD", "LADDER", "RULES", "START", "Technique", "advise",
           "best_plan_lines", "combinations", "data_parallel_size", "final_plan_lines", "order_techniques",
           "plot_advice", "rule_breach", "start_plan", "steps_display",
           "usable_techniques", "why_not"]
