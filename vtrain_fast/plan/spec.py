"""Sweep specifications: TOML (``tomllib``) in, a validated, frozen :class:`SweepSpec` out.

Unknown keys, wrong types and out-of-range values raise :class:`~vtrain_fast.io.errors.InputError`
naming the file, the key, the value and what is allowed. Every axis accepts a value or a list.

Example (``sweeps/gpt3-175b-a100.toml``)::

    name = "gpt3-175b-a100"
    [model]
    presets = ["gpt3-175b"]
    [training]
    num_tokens = [300e9]
    global_batch_size = [1536]
    micro_batch_size = [1, 2, 4]
    recompute = ["none", "full"]
    overlap_grad_reduce = false     # true: DP all-reduce hidden behind the last backward
    distributed_optimizer = false   # true: Adam states sharded over data-parallel ranks (ZeRO-1)
    use_flash_attn = false          # true: fused FlashAttention-2 attention (no s x s activations)
    sequence_parallel = false       # true: layer norms, dropouts split over tp (Megatron --sequence-parallel)
    async_tensor_model_parallel_allreduce = false  # true: backward TP exchange behind weight-gradient GEMMs
    zero_stage = 0                  # 1: distributed optimizer; 2: + gradients; 3: + parameters (FSDP)
    [cluster]
    gpu = ["a100-sxm4-80gb"]
    num_gpus = [1024, 1536]
    [parallel]
    tp = [1, 2, 4, 8]
    pp = [1, 2, 4, 8, 16]
    vpp = 1                         # model chunks per device, interleaved 1F1B when > 1

A ``[gpus.<name>]`` table defines a GPU the spec can name in ``cluster.gpu`` (``base = "<preset>"``
and the fields that differ, or every field of ``hardware.gpus.GPU_FIELD_RANGES``), or changes the
fields of a preset of that name (:func:`spec_gpus`)::

    [gpus.h100-nvl-94gb]
    base = "h100-sxm-80gb"
    peak_bf16_tflops = 835.0
    hbm_GiB = 87.5
    hbm_GBps = 3900.0
    calibration = { gemm_efficiency = 0.78 }

A ``[models.<name>]`` table defines a model shape that ``model.presets`` can name (Megatron-LM's
argument names; quote a name with a dot: ``[models."my-1.5b"]``)::

    [models.my-7b]
    num_layers = 32
    hidden_size = 4096
    num_attention_heads = 32
    seq_length = 4096

Such tables may also live in model files the spec names, paths relative to its folder
(:func:`read_model_files`; ``vtrain-fast import-hf`` writes one from a Hugging Face config)::

    model_files = ["llama-3-8b.toml"]
    [model]
    presets = ["llama-3-8b"]

The training settings (the registry's, :mod:`vtrain_fast.model.settings`: ``vpp`` and the
pipeline-split settings in ``[parallel]``, ``zero_stage`` and the other switches of
:data:`TRAINING_FLAGS` in ``[training]``) ride on the GPU axis:
a list of values makes a setting an axis, and each GPU preset becomes one machine per combination
of their values (:func:`machine_variants`).
"""
from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass, fields, replace
from pathlib import Path

from ..io.errors import InputError, check_plain_name, did_you_mean
from ..io.schema import variant_label
from ..io.inputs import MAX_TEXT_BYTES, parse_toml, read_input_bytes, read_toml
from ..hardware.gpus import (CALIBRATION_RANGES, OVERRIDE_RANGES, PRESETS, Calibration, GPUPreset,
                       with_overrides)
from ..model.arch import ARCH_FLAGS, BY_NAME as ARCH_BY_NAME
from .models import check_priced, arch_flag_value, DEFAULT_VOCAB_SIZE, MODEL_INT_RANGES, MODEL_PRESETS, ModelShape, models_from_tables
from ..model.settings import (BY_NAME, CHOICES, LAYOUT_SIZES, SAME_PLAN, SETTINGS, SWITCHES, canonical_values,
                              unmet_requirements)

RECOMPUTE_VALUES = ("none", "full", "selective")   # codes 0, 1, 2 of model.records.RECOMPUTE_*
# Boolean training settings ([training] keys, evaluate CSV columns, GPUPreset fields) and what true means.
# The training switches a spec takes under [training] (key -> what true does): the registry's
# bool settings (vtrain_fast.model.settings), in the order of the machine axis.
TRAINING_FLAGS = {s.name: s.doc for s in SWITCHES}
# The choice settings a spec takes under [training] (key -> what each value does): the registry's
# str settings, one value or a list of them (then an axis).
TRAINING_CHOICES = {s.name: s.doc for s in CHOICES}
# Megatron-LM's default (no --recompute-activations / --recompute-granularity); shared with the
# evaluate CSVs, so a spec and a CSV row that leave recompute out describe the same run.
RECOMPUTE_DEFAULT = "none"
# Other tools' names for a switch with the opposite meaning (Megatron-Bridge's and Megatron-core's
# ddp.grad_reduce_in_fp32, Megatron-LM's internal accumulate_allreduce_grads_in_fp32): a near-miss
# suggestion would carry the value over and price the opposite plan, so the fix says to invert it.
INVERTED_NAMES = {
    name: "write grad_reduce_in_bf16 with the opposite value: " + name + " = true is grad_reduce_in_bf16 = "
          "false (the default, fp32 main gradients), " + name + " = false is grad_reduce_in_bf16 = true"
    for name in ("grad_reduce_in_fp32", "accumulate_allreduce_grads_in_fp32")}
MAX_INT = 2 ** 31 - 1

# key -> (low, high) for integer axes
INT_RANGES = {
    **MODEL_INT_RANGES, "global_batch_size": (1, 100_000_000),
    "micro_batch_size": (1, 1_000_000), "num_gpus": (1, 100_000_000),
    "num_nodes": (1, 10_000_000), "tp": (1, 1_000_000), "pp": (1, 1_000_000), "cp": (1, 1_000_000),
}
_TABLES = {
    "model": {"presets", "num_layers", "hidden_size", "num_attention_heads", "num_query_groups",
              "ffn_hidden_size", "seq_length", "vocab_size", *ARCH_BY_NAME},
    "training": {"num_tokens", "global_batch_size", "micro_batch_size", "recompute",
                 *(st.name for st in SETTINGS if st.table == "training")},
    "cluster": {"gpu", "num_gpus", "num_nodes", *OVERRIDE_RANGES},
    "parallel": {"tp", "pp", "cp", *(st.name for st in SETTINGS if st.table == "parallel")},
    "output": {"chunk_size"},
}
_TOP = {"name", "description", "gpus", "models", "model_files", *_TABLES}


@dataclass(frozen=True)
class SweepSpec:
    """A validated sweep: every axis as a tuple of values (SI units).

    Attributes
    ----------
    name : str
        Sweep name (results go to ``results/<name>/`` by default).
    models : tuple of ModelShape
    num_tokens : tuple of float
    gpus : tuple of GPUPreset
        One per GPU name and combination of training settings (:func:`machine_variants`), with
        cluster overrides and calibration applied: the values of the sweep's gpu axis.
    cluster_sizes : tuple of int
        GPUs per job, or nodes per job when ``sizes_in_nodes``.
    sizes_in_nodes : bool
    tp, pp, micro_batch_size, global_batch_size : tuple of int
    recompute : tuple of str
    chunk_size : int
        Points per kernel call and Parquet row group.
    source : str
        The spec file's text (kept in the manifest).
    path : str
    notes : tuple of str
        Things the sweep skipped, for the user (e.g. FlashAttention on a GPU without it).
    settings : tuple of (str, tuple)
        Each training setting (the registry's) with the values the sweep
        takes; more than one value makes it an axis (carried by the gpu axis).
    model_files : tuple of str
        The model files the spec reads (``model_files``, :func:`read_model_files`), as paths.
    cp : tuple of int
        Context-parallel sizes (``[parallel] cp``, Megatron-LM ``--context-parallel-size``; default 1).
    """

    name: str
    description: str
    models: tuple
    num_tokens: tuple
    gpus: tuple
    cluster_sizes: tuple
    sizes_in_nodes: bool
    tp: tuple
    pp: tuple
    micro_batch_size: tuple
    global_batch_size: tuple
    recompute: tuple
    chunk_size: int
    source: str
    path: str
    notes: tuple = ()
    settings: tuple = ()
    model_files: tuple = ()
    cp: tuple = (1,)

    @property
    def setting_axes(self) -> tuple:
        """Names of the training settings (in :attr:`settings` order) that take more than one
        value among the machines of the gpu axis (after :func:`machine_variants` left some out)."""
        return varying_settings(self.gpus, [k for k, _ in self.settings])

    @property
    def num_points(self) -> int:
        """Points in the grid (the product of the axis lengths), an exact Python int."""
        return math.prod(len(getattr(self, k)) for k in (
            "models", "num_tokens", "gpus", "cluster_sizes", "tp", "cp", "pp", "micro_batch_size",
            "global_batch_size", "recompute"))


# Values the model axis and the gpu axis may hold. Both are built value by value before a sweep
# (or its dry run) starts and held in memory while it runs, so their size is checked first, as the
# product of the lengths of the lists that make them (arithmetic: nothing is built). Measured on the
# 2-core development VM of the README's Speed section: a model shape takes about 15 us and 0.7 KB
# (10^6 shapes: 17 s, 0.7 GB), a machine 0.2 to 1 ms (16 plan kinds compared per machine; every
# training switch as an axis, 16,384 machines: 3.4 s; 90,000 distinct ones: 90 s). The limits keep
# either axis to seconds, and the gpu axis to every one of 15 switches as an axis (2^15 machines).
MAX_MODEL_SHAPES = 100_000
MAX_MACHINES = 1 << 15
_AXIS_LIMITS = {"model shapes": (MAX_MODEL_SHAPES, "about 2 s and 70 MB"),
                "machines": (MAX_MACHINES, "7 to 30 s")}


def check_axis_length(where: str, key: str, length: int, what: str) -> None:
    """Refuse a model axis of more than :data:`MAX_MODEL_SHAPES` shapes, or a gpu axis of more
    than :data:`MAX_MACHINES` machines, before building it.

    Parameters
    ----------
    where : str
        The spec file, for the message.
    key : str
        Which axis and the lists that make it, in words.
    length : int
        Its values: the product of the lengths of the lists it combines (exact).
    what : str
        ``"model shapes"`` or ``"machines"``.

    Raises
    ------
    InputError
        Naming the size, the limit and its cost, and how to narrow the lists.
    """
    limit, cost = _AXIS_LIMITS[what]
    if length > limit:
        raise InputError(where, key, f"{length:,} {what} ({length:.2g})",
                         f"at most {limit:,} {what} (each is built and held in memory before the sweep starts; "
                         f"{limit:,} take {cost} on the README's reference machine)",
                         "shorten the lists whose product makes the axis, or split them over several specs "
                         "(one sweep per slice of a list)")


def _as_list(where, key, value, allowed="values"):
    if isinstance(value, list):
        if not value:
            raise InputError(where, key, value, f"a non-empty list of {allowed}", f"give at least one value for {key}")
        return value
    return [value]


def _ints(where, key, value, table=""):
    lo, hi = INT_RANGES[key]
    name = f"{table}.{key}" if table else key
    out = []
    for v in _as_list(where, name, value):
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise InputError(where, name, v, f"integers from {lo} to {hi}",
                             f"write whole numbers from {lo} to {hi} without quotes or decimals, "
                             f"e.g. {key} = {lo} or {key} = [{lo}, {min(2 * lo, hi)}]")
        out.append(v)
    return tuple(dict.fromkeys(out))


def _floats(where, key, value, lo, hi):
    out = []
    for v in _as_list(where, key, value):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (lo <= v <= hi):
            raise InputError(where, key, v, f"numbers from {lo:g} to {hi:g}",
                             "write plain numbers without quotes or units, e.g. 1.5e13 for 15T")
        out.append(float(v))
    return tuple(dict.fromkeys(out))


def _strings(where, key, value, allowed):
    out = []
    for v in _as_list(where, key, value):
        if not isinstance(v, str) or v not in allowed:
            raise InputError(where, key, v, "one of " + ", ".join(allowed),
                             did_you_mean(str(v), allowed, "write one of the allowed names in quotes"))
        out.append(v)
    return tuple(dict.fromkeys(out))


def _overrides(where, table_name, table) -> dict:
    """Cluster overrides (keys of ``OVERRIDE_RANGES``) given in ``table``, checked and converted."""
    out = {}
    for k, (lo, hi) in OVERRIDE_RANGES.items():
        if k in table:
            v = table[k]
            if k == "gpus_per_node":
                if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                    raise InputError(where, f"{table_name}.{k}", v, f"one integer from {lo} to {hi}")
                out[k] = v
            else:
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
                    raise InputError(where, f"{table_name}.{k}", v, f"one number from {lo:g} to {hi:g}")
                out[k] = float(v)
    return out


def _flags(where, key, value, meaning, table="training"):
    """A switch of ``table``: ``true``, ``false`` or a list of them (then an axis)."""
    out = []
    for v in _as_list(where, f"{table}.{key}", value, "true / false"):
        if not isinstance(v, bool):
            raise InputError(where, f"{table}.{key}", v, f"true or false, or a list of them ({meaning})",
                             f"write {key} = true, {key} = false or {key} = [false, true], without quotes")
        out.append(v)
    return tuple(dict.fromkeys(out))


def _choices(where, st, value):
    """A ``str`` setting (:data:`TRAINING_CHOICES`) in its table: one of its choices, or a list of
    them (then an axis)."""
    key = f"{st.table}.{st.name}"
    allowed = ", ".join(f'"{c}"' for c in st.choices)
    out = []
    for v in _as_list(where, key, value, allowed):
        if not isinstance(v, str) or v.strip().lower() not in st.choices:
            fix = did_you_mean(str(v), st.choices, f"write {st.name} = \"{st.default}\" or a list, e.g. "
                               f"{st.name} = [" + ", ".join(f'"{c}"' for c in st.choices) + "]")
            raise InputError(where, key, v, f"one of {allowed}, or a list of them ({st.doc})", fix)
        out.append(v.strip().lower())
    return tuple(dict.fromkeys(out))


def _number_setting(where, st, value):
    """An integer setting (``vpp``, ``zero_stage``) or a number setting (the MoE capacity factor;
    its registry record ``st``, kind ``int`` or ``float``) in its table: one value of
    ``st.int_range`` or a list of them (then an axis); a ``float`` setting takes integers too."""
    lo, hi = st.int_range
    whole = st.kind is int
    allowed = f"integers from {lo} to {hi}" if whole else f"numbers from {lo:g} to {hi:g}"
    key = f"{st.table}.{st.name}"
    out = []
    for v in _as_list(where, key, value, allowed):
        if isinstance(v, bool) or not isinstance(v, int if whole else (int, float)) or not lo <= v <= hi:
            raise InputError(where, key, v, allowed, f"{st.doc}; e.g. {st.example}")
        out.append(v if whole else float(v))
    return tuple(dict.fromkeys(out))


def setting_values_of(where, tables: dict, st):
    """The values a spec gives setting ``st`` (registry record) in its table of ``tables`` (name ->
    dict), its default when left out, as a tuple."""
    value = tables.get(st.table, {}).get(st.name, st.default)
    if st.kind in (int, float):
        return _number_setting(where, st, value)
    if st.kind is str:
        return _choices(where, st, value)
    return _flags(where, st.name, value, st.doc, st.table)


def machine_variants(names, settings: dict, overrides: dict, calibration: dict, where: str,
                     per_gpu: dict | None = None, known: dict | None = None):
    """The gpu axis of a sweep: one preset per GPU name and combination of training settings.

    Parameters
    ----------
    names : sequence of str
        GPU preset names, in spec order (outermost).
    settings : dict
        Setting name (a registry setting) -> tuple of its values; their
        product, in this order with the last setting fastest, follows each name.
    overrides : dict
        Cluster overrides for every preset (``OVERRIDE_RANGES`` keys).
    calibration : dict
        GPU name -> :class:`~vtrain_fast.hardware.gpus.Calibration` from a calibration file.
    where : str
        File name for errors.
    per_gpu : dict, optional
        GPU name -> overrides for that GPU (``[cluster.<name>]``), used instead of ``overrides``.
    known : dict, optional
        GPU name -> :class:`~vtrain_fast.hardware.gpus.GPUPreset`: the presets and the spec's own
        ``[gpus.<name>]`` (default: the presets).

    Returns
    -------
    tuple
        ``(presets, notes)``: the presets (``GPUPreset``, a tuple) and what was skipped (a
        tuple of str): with ``use_flash_attn = [false, true]``, the ``true`` machines of a GPU
        without FlashAttention kernels are left out; a switch without a setting it requires
        (:func:`~vtrain_fast.model.settings.unmet_requirements`) runs switched off on those
        machines; machines that price every plan like an earlier one (:func:`repeat_cases` all bits,
        e.g. the asynchronous TP all-reduce with sequence parallelism) are left out; each is
        named in a note.

    Raises
    ------
    InputError
        ``use_flash_attn = true`` (only) for a GPU without FlashAttention kernels
        (:func:`check_flash_attention`); ``precision = "fp8"`` (only) for a GPU without FP8
        tensor cores (:func:`check_precision`; with another precision in the list, its fp8 machines are
        left out with a note); ``fp8_recipe = "mxfp8"`` (only, with ``precision = "fp8"`` only)
        for a GPU without MXFP8 tensor cores (:func:`check_mxfp8`; with another recipe or
        precision in the lists, its fp8 mxfp8 machines are left out with a note).
    """
    presets, skipped, skipped_fp8, skipped_mxfp8, unmet = [], [], [], [], {}
    check_axis_length(where, "the gpu axis (cluster.gpu x the training settings' lists)",
                      len(names) * math.prod(len(v) for v in settings.values()), "machines")
    seen = set()
    for name in names:
        for combo in itertools.product(*settings.values()):
            values = canonical_values(dict(zip(settings, combo)))
            # a setting without what Megatron-LM requires for it runs switched off (and says so):
            # no row may carry a combination Megatron-LM refuses
            for st, other, value in unmet_requirements(values):
                unmet.setdefault((st.name, other, value), None)
                values[st.name] = st.default
            g = with_overrides((known or PRESETS)[name], calibration.get(name), **(per_gpu or {}).get(name, overrides),
                               **values)
            if g.use_flash_attn and False in settings["use_flash_attn"] and not has_flash_attention(g):
                if name not in skipped:
                    skipped.append(name)
                continue
            check_flash_attention(g, where, "training.use_flash_attn")
            if len(settings["precision"]) > 1 and not has_precision(g):
                if (name, g.precision) not in skipped_fp8:
                    skipped_fp8.append((name, g.precision))
                continue
            check_precision(g, where, "training.precision")
            if (g.precision == "fp8" and g.fp8_recipe == "mxfp8" and not has_mxfp8(g)
                    and (len(settings["fp8_recipe"]) > 1 or len(settings["precision"]) > 1)):
                if name not in skipped_mxfp8:
                    skipped_mxfp8.append(name)
                continue
            check_mxfp8(g, where, "training.fp8_recipe")
            if g not in seen:               # a switched-off setting may repeat a machine exactly
                seen.add(g)
                presets.append(g)
    notes = tuple(f"{name} has no FlashAttention kernel (flash_attention_efficiency 0): its use_flash_attn = "
                  "true machines are left out" for name in skipped)
    notes += tuple(f"{name} has no {PRECISION_PEAKS[prec][1]} ({PRECISION_PEAKS[prec][0]} 0"
                   + (" or fp8_gemm_efficiency 0" if prec == "fp8" else "") + f"): its precision = {prec} "
                   "machines are left out" for name, prec in skipped_fp8)
    notes += tuple(f"{name} has no MXFP8 tensor cores (mxfp8_tensor_cores 0; MXFP8 needs a Blackwell GPU): its "
                   "precision = fp8, fp8_recipe = mxfp8 machines are left out" for name in skipped_mxfp8)
    notes += tuple(f"{st} = true needs {other} = {str(value).lower()} ({BY_NAME[st].owner()} "
                   f"refuses it otherwise): the {other} "
                   + (f"= {str(not value).lower()}" if BY_NAME[other].kind is bool else f"!= {value}")
                   + f" machines run with {st} = false"
                   for st, other, value in unmet)
    # a machine whose settings change no plan beyond an earlier machine's (e.g. the asynchronous
    # TP all-reduce with sequence parallelism, which always overlaps) would only repeat its rows
    masks = repeat_cases(presets)
    repeated = [g for g, m in zip(presets, masks) if m == ALL_CASES]
    if repeated:
        axes = varying_settings(presets, settings)
        notes += (f"{len(repeated)} setting combination(s) left out because they price every plan like an "
                  "earlier one (settings without effect there, see README): "
                  + "; ".join(variant_label(g, axes) for g in repeated[:4]) + ("; ..." if len(repeated) > 4 else ""),)
    return tuple(g for g, m in zip(presets, masks) if m != ALL_CASES), notes


def check_requirements(path, settings: dict) -> None:
    """Refuse a sweep whose setting values (name -> tuple of values) ask only for combinations
    Megatron-LM refuses: a setting switched on in every value whose requirement
    (:attr:`~vtrain_fast.model.settings.Setting.requires`) no value of the needed setting meets. (With
    a choice, :func:`machine_variants` leaves the impossible machines out.)

    Raises
    ------
    InputError
        Naming the setting, what it needs and how to fix the spec.
    """
    # what each setting can be once the settings that spell one plan twice are read as one
    possible = {k: set(v) for k, v in settings.items()}
    for combo in itertools.product(*(settings[k] for k in SAME_PLAN)):
        for k, v in canonical_values(dict(zip(SAME_PLAN, combo))).items():
            possible[k].add(v)
    for st in SETTINGS:
        if st.default in settings[st.name]:
            continue
        for other, value in st.requires:
            if value not in possible[other]:
                given = settings[st.name][0] if len(settings[st.name]) == 1 else list(settings[st.name])
                needs = (f"{other} = {_toml_value((value,))} with it ({st.megatron} cannot be combined with "
                         f"{BY_NAME[other].megatron})" if BY_NAME[other].kind is int else
                         f"{other} = {_toml_value((value,))} with it ({st.megatron} needs "
                         f"{BY_NAME[other].megatron}" + ("" if isinstance(value, bool) else f" {value}")
                         + "; Megatron-LM refuses it otherwise)")
                if st.framework:        # another framework's option: no Megatron-LM flags to name
                    needs = f"{other} = {_toml_value((value,))} with it ({st.owner()} needs it)"
                raise InputError(path, f"{st.table}.{st.name}", given, needs,
                                 f"set [{BY_NAME[other].table}] {other} = {_toml_value((value,))} or drop {st.name}")


def _toml_value(values: tuple) -> str:
    """``values`` (one or a list) as TOML writes them."""
    text = [str(v).lower() if isinstance(v, bool) else f'"{v}"' if isinstance(v, str) else str(v) for v in values]
    return text[0] if len(text) == 1 else "[" + ", ".join(text) + "]"


# Kinds of plan (model.rules.plan_case: one bit per size of LAYOUT_SIZES above 1) and the mask of all.
NUM_CASES = 1 << len(LAYOUT_SIZES)
ALL_CASES = (1 << NUM_CASES) - 1


def plan_kind(case: int) -> dict:
    """The kind of plan of bit ``case`` of the repeat and refused masks (``model.rules.plan_case``:
    bit 1 tp > 1, 2 pp > 1, 4 dp x cp > 1, 8 cp > 1) as :data:`~vtrain_fast.model.settings.LAYOUT_SIZES`
    -> whether that size is 1 ("dp": the data-parallel-with-context group, dp x cp)."""
    return {k: not case & (1 << i) for i, k in enumerate(LAYOUT_SIZES)}


def effective_settings(preset, sizes_are_1: dict):
    """``preset`` with each training setting that has no effect on plans whose sizes are 1 where
    ``sizes_are_1`` says so (:func:`plan_kind`; its registry rule,
    :meth:`~vtrain_fast.model.settings.Setting.has_no_effect`, on the settings as they act there)
    set to its default: two presets whose effective settings are equal price every such plan
    alike."""
    # first what the plan's sizes switch off, then the rules between settings on what is left
    acting = {st.name: st.default if any(sizes_are_1[k] for k in st.inert_at) else getattr(preset, st.name)
              for st in SETTINGS}
    return replace(preset, **{st.name: st.default for st in SETTINGS if st.has_no_effect(sizes_are_1, acting)})


def repeat_cases(presets, refused: list[int] | None = None) -> list[int]:
    """Per machine of a sweep's gpu axis, the bit mask ``model.rules.repeats`` reads: bit
    ``(tp > 1) + 2 (pp > 1) + 4 (dp x cp > 1) + 8 (cp > 1)`` set where an earlier machine prices every plan of that
    kind alike (:func:`effective_settings` equal), so its rows would repeat that machine's.

    Parameters
    ----------
    presets : sequence of GPUPreset
        The gpu axis (``SweepSpec.gpus``).
    refused : list of int, optional
        Their :func:`refused_cases` (computed when not given).

    Returns
    -------
    list of int
        One mask (0 to ALL_CASES) per preset; 0 for the first of each set of equal machines, ALL_CASES for a
        machine that repeats an earlier one everywhere.
    """
    masks = [0] * len(presets)
    refused = refused_cases(presets) if refused is None else refused
    for case in range(NUM_CASES):
        seen = set()                  # effective presets (frozen, hashable) met so far
        for i, g in enumerate(presets):
            if refused[i] >> case & 1:
                continue              # refused there: priced by no one, so it stands in for no one
            mine = effective_settings(g, plan_kind(case))
            if mine in seen:
                masks[i] |= 1 << case
            seen.add(mine)
    return masks


def refused_cases(presets) -> list[int]:
    """Per machine of a sweep's gpu axis, the bit mask ``model.rules.refused`` reads: bit
    ``(tp > 1) + 2 (pp > 1) + 4 (dp x cp > 1) + 8 (cp > 1)`` set where Megatron-LM refuses the machine's settings on
    plans of that kind (:func:`~vtrain_fast.model.settings.unmet_requirements` with the settings
    Megatron-LM switches off there: tp_comm_overlap at tp = 1, where it turns sequence parallelism
    off).

    Returns
    -------
    list of int
        One mask (0 to ALL_CASES) per preset.
    """
    masks = []
    for g in presets:
        values = {st.name: getattr(g, st.name) for st in SETTINGS}
        masks.append(sum(1 << case for case in range(NUM_CASES) if unmet_requirements(values, plan_kind(case))))
    return masks


def varying_settings(presets, names) -> tuple:
    """Of the settings ``names`` (in that order), those with more than one value among ``presets``."""
    return tuple(k for k in names if len({getattr(g, k) for g in presets}) > 1)


def has_flash_attention(preset) -> bool:
    """Whether ``preset`` has FlashAttention kernels (``flash_attention_efficiency > 0``)."""
    return preset.calibration.flash_attention_efficiency > 0.0


def check_flash_attention(preset, where: str, key: str) -> None:
    """Refuse ``use_flash_attn`` for a GPU preset without FlashAttention kernels
    (``flash_attention_efficiency`` 0, e.g. the V100: FlashAttention-2 needs Ampere or newer).

    Raises
    ------
    InputError
        Naming ``where``, ``key``, the GPU and the fix.
    """
    if preset.use_flash_attn and not has_flash_attention(preset):
        raise InputError(where, key, True, f"false for {preset.name}, whose flash_attention_efficiency is 0 "
                         "(no FlashAttention kernel: FlashAttention-2 needs an Ampere or newer GPU; or a "
                         "calibration file set it to 0)",
                         f"drop {preset.name} or set use_flash_attn = false, or give {preset.name} a "
                         "positive flash_attention_efficiency (a [gpus." + preset.name + "] table: calibration = "
                         "{ flash_attention_efficiency = 0.5 }, or a calibration file for a preset)")


# The GPU peak each precision's GEMMs need (the preset field, what it is): a GPU without it
# cannot train in that precision (model.ops.gemm_peak_flops reads the same fields).
PRECISION_PEAKS = {
    "bf16": ("peak_tflops", "bf16 tensor cores"),
    "fp16": ("peak_tflops", "fp16 tensor cores"),
    "fp8": ("peak_fp8_tflops", "FP8 tensor cores"),
    "tf32": ("peak_tf32_tflops", "TF32 tensor cores"),
    "fp32": ("peak_fp32_tflops", "FP32 GEMM peak"),
}


def has_precision(preset, precision: str | None = None) -> bool:
    """Whether ``preset`` can train in ``precision`` (default: its own ``precision``): a positive
    peak of that precision (:data:`PRECISION_PEAKS`); FP8 also needs an FP8 GEMM efficiency
    (``fp8_gemm_efficiency > 0``). The A100 and V100 have no FP8 (it arrived with Hopper and Ada),
    the V100 and AMD's CDNA 2 no TF32."""
    precision = precision or preset.precision
    if getattr(preset, PRECISION_PEAKS[precision][0]) <= 0.0:
        return False
    return precision != "fp8" or preset.calibration.fp8_gemm_efficiency > 0.0


def has_fp8(preset) -> bool:
    """Whether ``preset`` can train in FP8 (:func:`has_precision` of fp8)."""
    return has_precision(preset, "fp8")


def check_precision(preset, where: str, key: str) -> None:
    """Refuse a ``precision`` the GPU preset has no peak for (:func:`has_precision`): fp8 without FP8
    tensor cores, tf32 without TF32 tensor cores, fp32 without a stated FP32 peak.

    Raises
    ------
    InputError
        Naming ``where``, ``key``, the GPU and the fix.
    """
    prec = preset.precision
    if has_precision(preset):
        return
    field, what = PRECISION_PEAKS[prec]
    others = [p for p in PRECISION_PEAKS if p != prec and has_precision(preset, p)]
    if prec == "fp8":
        why = (f"which has no FP8 tensor cores (peak_fp8_tflops {preset.peak_fp8_tflops:g}, fp8_gemm_efficiency "
               f"{preset.calibration.fp8_gemm_efficiency:g}; Transformer Engine's FP8 needs a Hopper, Ada or newer GPU)")
        give = "peak_fp8_tflops and calibration fp8_gemm_efficiency"
    else:
        why = f"which has no {what} ({field} {getattr(preset, field):g})"
        give = field
    raise InputError(where, key, prec, f"{' or '.join(others)} for {preset.name}, {why}",
                     f"drop {preset.name} or set precision = \"bf16\", or give {preset.name} a positive "
                     f"{give} (a [gpus.{preset.name}] table)")


def has_mxfp8(preset) -> bool:
    """Whether ``preset`` can train with Transformer Engine's MXFP8 recipe: FP8 (:func:`has_fp8`)
    and block-scaled MXFP8 tensor cores (``mxfp8_tensor_cores`` 1: the Blackwell presets; TE's
    MXFP8BlockScaling needs SM 10.0 or newer)."""
    return has_fp8(preset) and preset.mxfp8_tensor_cores > 0


def check_mxfp8(preset, where: str, key: str) -> None:
    """Refuse ``fp8_recipe = mxfp8`` with ``precision = fp8`` for a GPU preset without MXFP8
    tensor cores (:func:`has_mxfp8`; Hopper, Ada and AMD presets). At ``precision = bf16`` the
    recipe has no effect and is not checked.

    Raises
    ------
    InputError
        Naming ``where``, ``key``, the GPU and the fix.
    """
    if preset.precision == "fp8" and preset.fp8_recipe == "mxfp8" and not has_mxfp8(preset):
        raise InputError(where, key, "mxfp8", f"delayed or tensorwise for {preset.name}, which has no MXFP8 "
                         f"tensor cores (mxfp8_tensor_cores {preset.mxfp8_tensor_cores}; Transformer Engine's "
                         "MXFP8 block scaling needs a Blackwell GPU: b200-hgx-180gb, b300-hgx-270gb, "
                         "gb200-nvl72-186gb, gb300-nvl72-279gb)",
                         f"drop {preset.name} or set fp8_recipe = \"delayed\" or \"tensorwise\", or give "
                         f"{preset.name} mxfp8_tensor_cores = 1 (a [gpus.{preset.name}] table, with a source)")


def _check_keys(where, table_name, table, allowed):
    if not isinstance(table, dict):
        raise InputError(where, table_name, table, "a TOML table", f"write [{table_name}] as a table")
    for k in table:
        if k not in allowed:
            home = [t for t, keys in _TABLES.items() if k in keys and t != table_name]
            fix = (f"move it to the [{home[0]}] table" if home else INVERTED_NAMES.get(k)
                   or did_you_mean(k, sorted(allowed), "remove or rename the key"))
            raise InputError(where, f"{table_name}.{k}" if table_name else k, table[k],
                             "keys " + ", ".join(sorted(allowed)), fix)


_NAME_PARTS = (("num_layers", "L"), ("hidden_size", "h"), ("num_attention_heads", "a"),
               ("seq_length", "s"), ("num_query_groups", "kv"), ("ffn_hidden_size", "ffn"),
               ("vocab_size", "vocab"))


def shape_name(shape: dict, given=None) -> str:
    """Name of a shape from ``[model]`` lists, e.g. ``custom-40L-5120h-40a-2048s``: numbers
    first, so that no part reads like a GPU (``L40``, ``H100``, ``A100``).

    Parameters
    ----------
    shape : dict
        ``num_layers``, ``hidden_size``, ``num_attention_heads``, ``seq_length`` and optionally
        ``num_query_groups`` (``kv``), ``ffn_hidden_size`` (``ffn``), ``vocab_size`` (``vocab``).
    given : iterable of str, optional
        Keys the spec gives; the optional ones are named only when given (so shapes that
        differ only in them get different names). Default: every key of ``shape``.
    """
    given = set(shape if given is None else given)
    flags = [(fl.suffix or str(shape[fl.name]).lower()) for fl in ARCH_FLAGS
             if fl.name in shape and shape[fl.name] != fl.default]
    return "-".join(["custom"] + [f"{shape[k]}{tag}" for k, tag in _NAME_PARTS if k in given] + flags)


def _arch_values(where, fl, value) -> tuple:
    """``model.<flag>``: one value of architecture flag ``fl`` or a list (then an axis)."""
    key = f"model.{fl.name}"
    return tuple(dict.fromkeys(arch_flag_value(where, key, fl, v)
                               for v in _as_list(where, key, value, fl.allowed())))


def _models(where, t: dict, known: dict | None = None) -> tuple:
    """The model axis: ``model.presets`` (names of ``known``: the presets and the spec's own
    ``[models.<name>]``) and the shapes given as lists in ``[model]``."""
    known = known or MODEL_PRESETS
    models: list[ModelShape] = []
    if "presets" in t:
        for name in _strings(where, "model.presets", t["presets"], tuple(known)):
            check_priced(where, "model.presets", known[name],
                         "leave it out of model.presets; vtrain-fast presets lists its total and active "
                         "parameters (the kernels take every k-th layer or dense first layers as MoE layers; "
                         "a capacity factor is the training setting moe_expert_capacity_factor)")
            models.append(known[name])
    shape_keys = [k for k in t if k != "presets"]
    if shape_keys:
        required = ("num_layers", "hidden_size", "num_attention_heads", "seq_length")
        for k in required:
            if k not in t:
                raise InputError(where, f"model.{k}", None, "required when giving model shapes",
                                 f"add model.{k} (or use model.presets only)")
        axes = {k: _arch_values(where, ARCH_BY_NAME[k], t[k]) if k in ARCH_BY_NAME
                else _ints(where, k, t[k], "model") for k in shape_keys}
        axes.setdefault("num_query_groups", (0,))
        axes.setdefault("ffn_hidden_size", (0,))
        axes.setdefault("vocab_size", (DEFAULT_VOCAB_SIZE,))
        keys = list(axes)
        check_axis_length(where, "the model axis (model.presets + the [model] shape lists)",
                          len(models) + math.prod(len(v) for v in axes.values()), "model shapes")
        for combo in itertools.product(*(axes[k] for k in keys)):
            kw = dict(zip(keys, combo))
            models.append(ModelShape(name=shape_name(kw, given=shape_keys), **kw).resolved())
    if not models:
        raise InputError(where, "model", t, "model.presets and/or model shape lists",
                         "add e.g. presets = [\"gpt3-175b\"]; presets: " + ", ".join(known))
    return tuple(models)


def _description(where, value) -> str:
    if not isinstance(value, str):
        raise InputError(where, "description", value, "a string")
    return value




def check_reserved(preset, reserved_GiB, where: str, key: str) -> None:
    """Refuse ``reserved_GiB`` (memory kept free per GPU; None: the preset's) at or above the
    memory of ``preset``'s GPU, which would leave the model nothing and mark every plan
    ``out_of_memory``. ``preset``: the GPU as it is without the value checked (the fix names its
    own reserved_GiB, or the presets' when that is the value refused).

    Raises
    ------
    InputError
        Naming ``key``, the value, the GPU's memory and the value the GPU keeps without it.
    """
    if reserved_GiB is not None and reserved_GiB >= preset.hbm_GiB:
        own = preset.reserved_GiB
        usual = (f"{preset.name} keeps {own:g} GiB when it is not given" if own < preset.hbm_GiB
                 else f"the GPU presets keep {GPUPreset.reserved_GiB:g} GiB")
        raise InputError(where, key, reserved_GiB, f"less than the {preset.hbm_GiB:g} GiB of memory of "
                         f"{preset.name} (hbm_GiB)", "reserved_GiB is the memory kept free per GPU (CUDA "
                         f"context, NCCL, allocator; {usual}): give a few GiB, e.g. 6.0")


def check_name(where: str, name) -> None:
    """Refuse a sweep ``name`` that cannot be the results folder ``results/<name>``
    (:func:`vtrain_fast.io.errors.check_plain_name`).

    Raises
    ------
    InputError
        Naming the key ``name``.
    """
    check_plain_name(where, "name", name, 'name = "gpt3-175b-plans" (it names the folder results/<name>)')


def load_gpus(path: str | Path | None) -> dict:
    """The GPUs a run may name: the presets, and the GPUs of the TOML file ``path`` (``--gpus``:
    ``[gpus.<name>]`` tables, as in a spec, or one GPU file as in ``vtrain_fast/data/gpus``).

    Raises
    ------
    InputError
        As :func:`vtrain_fast.hardware.gpus.load_gpu_files`.
    """
    from ..hardware.gpus import load_gpu_files
    known = dict(PRESETS)
    if path is not None:
        known.update(load_gpu_files([path], PRESETS, need_source=False))
    return known


def read_model_files(where: str, value) -> list[tuple[str, dict]]:
    """The ``[models.<name>]`` tables of a spec's ``model_files`` (a path or a list of paths of
    TOML files, relative to the spec's folder; ``vtrain-fast import-hf`` writes such files).

    Returns
    -------
    list
        ``(path, tables)`` per file, in the order given (a file given twice is read once).

    Raises
    ------
    InputError
        ``model_files`` not a non-empty list of paths; a file that cannot be read
        (:func:`~vtrain_fast.io.inputs.read_toml`), holds a key other than ``models`` or no
        ``[models.<name>]`` table.
    """
    files = value if isinstance(value, list) else [value]
    if not files or not all(isinstance(f, str) and f for f in files):
        raise InputError(where, "model_files", value, "a non-empty list of paths of model files (TOML), relative "
                         "to the spec", 'e.g. model_files = ["llama-3-8b.toml"], written by vtrain-fast import-hf')
    out = []
    for f in dict.fromkeys(files):
        path = Path(where).parent / f
        doc = read_toml(path, "model file")
        for k, v in doc.items():
            if k != "models":
                raise InputError(str(path), k, v, "[models.<name>] tables only (a model file)",
                                 "put other keys in the spec; a model file holds model shapes")
        if not doc.get("models"):
            raise InputError(str(path), "[models.<name>]", None, "one or more [models.<name>] tables",
                             "write a model file with vtrain-fast import-hf, or tables as in vtrain_fast/data/models.toml")
        out.append((str(path), doc["models"]))
    return out


def spec_models(where: str, table, files=()) -> dict:
    """The model shapes a spec can name in ``model.presets``: the presets, its own
    ``[models.<name>]`` tables and those of its model files
    (:func:`vtrain_fast.plan.models.models_from_tables`; a preset's name is refused, and so is a
    name defined twice, so a name always means one shape).

    Parameters
    ----------
    where : str
        The spec file.
    table : dict or None
        The spec's ``[models]`` tables.
    files : sequence of (str, dict)
        ``(path, tables)`` of its model files (:func:`read_model_files`).

    Raises
    ------
    InputError
        A bad table (see ``models_from_tables``), a name that is a preset or not a plain name,
        or one defined in two places (naming both).
    """
    sources = ([(where, table)] if table is not None else []) + list(files)
    if not sources:
        return MODEL_PRESETS
    own, origin = {}, {}
    for src, tables in sources:
        for name, shape in models_from_tables(tables, src).items():
            check_name(src, name)
            if name in MODEL_PRESETS:
                raise InputError(f"{src}: [models.{name}]", "name", name, "a name that is not a model preset",
                                 f"name your shape differently, e.g. my-{name}")
            if name in origin:
                raise InputError(f"{src}: [models.{name}]", "name", name, "a name defined once among the spec's "
                                 "[models] tables and its model_files", f"it is also defined in {origin[name]}; "
                                 "rename one of them (vtrain-fast import-hf --name)")
            origin[name], own[name] = src, shape
    return {**MODEL_PRESETS, **own}


def load_models(paths) -> dict:
    """The models an evaluate CSV's ``model`` column may name: the presets and the
    ``[models.<name>]`` tables of the model files ``paths`` (``--models``; paths as given, or
    relative to the working folder), read as a spec's ``model_files`` (:func:`read_model_files`,
    :func:`spec_models`).

    Raises
    ------
    InputError
        As :func:`read_model_files` and :func:`spec_models`.
    """
    return spec_models("command line", None, read_model_files("command line", [str(p) for p in paths]))


def spec_gpus(where: str, table, known: dict | None = None) -> dict:
    """The GPUs a spec can name: the presets, changed or joined by its ``[gpus.<name>]`` tables
    (:func:`vtrain_fast.hardware.gpus.gpu_from_table`: a preset's name changes its fields; a new name
    defines a GPU, from ``base = "<preset>"`` or with every field). Plain numbers are accepted
    there (their source is the spec).

    Raises
    ------
    InputError
        A ``[gpus]`` entry that is not a table, an unknown field, a value out of range, a
        missing field of a new GPU, or a ``base`` that is no preset.
    """
    from ..hardware.gpus import resolve_gpu_tables
    base = dict(known or PRESETS)
    if table is None:
        return base
    if not isinstance(table, dict) or not all(isinstance(v, dict) for v in table.values()):
        raise InputError(where, "gpus", table, "[gpus.<name>] tables, one per GPU",
                         'e.g. [gpus.my-gpu] with base = "h100-sxm-80gb" and the fields that differ')
    base.update(resolve_gpu_tables({n: (t, f"{where}: [gpus.{n}]") for n, t in table.items()}, dict(base),
                                   need_source=False))
    return base


def parse_spec(text: str, path: str = "<spec>", calibration: dict | None = None,
               gpus: dict | None = None) -> SweepSpec:
    """Parse and validate a sweep spec.

    Parameters
    ----------
    text : str
        TOML text.
    path : str
        File name used in error messages.
    calibration : dict, optional
        GPU preset name -> :class:`~vtrain_fast.hardware.gpus.Calibration` (from
        :func:`load_calibration`).
    gpus : dict, optional
        GPU name -> :class:`~vtrain_fast.hardware.gpus.GPUPreset`: the GPUs the spec may name
        (default: the presets; ``--gpus FILE``: :func:`load_gpus`), before its own ``[gpus]``.

    Raises
    ------
    InputError
        Malformed TOML, unknown key, wrong type, value out of range, unknown preset.
    """
    doc = parse_toml(text, path, "sweep spec")
    _check_keys(path, "", doc, _TOP)
    for req in ("model", "training", "cluster", "parallel"):
        if req not in doc:
            raise InputError(path, f"[{req}]", None, "a required table", f"add a [{req}] table")
    for tname, allowed in _TABLES.items():
        if tname in doc:
            table = doc[tname]
            if tname == "cluster" and isinstance(table, dict):   # [cluster.<gpu>] tables: checked below
                table = {k: v for k, v in table.items() if not isinstance(v, dict)}
            _check_keys(path, tname, table, allowed)
    tr, cl, pa_ = doc["training"], doc["cluster"], doc["parallel"]
    for tname, table, keys in (("training", tr, ("num_tokens", "global_batch_size", "micro_batch_size")),
                               ("cluster", cl, ("gpu",)), ("parallel", pa_, ("tp", "pp"))):
        for k in keys:
            if k not in table:
                raise InputError(path, f"{tname}.{k}", None, "a required key", f"add {tname}.{k}")
    if ("num_gpus" in cl) == ("num_nodes" in cl):
        raise InputError(path, "cluster.num_gpus / cluster.num_nodes",
                         "both given" if "num_gpus" in cl else "neither given",
                         "exactly one of the two", "give the job size as num_gpus or as num_nodes")
    known = spec_gpus(path, doc.get("gpus"), gpus)
    for g, table in (doc.get("gpus") or {}).items():
        if isinstance(table, dict) and "calibration" in table and g in (calibration or {}):
            raise InputError(path, f"gpus.{g}.calibration", table["calibration"],
                             "one source of calibration values per GPU",
                             f"the --calibration file also calibrates {g}; put the values in one of the two")
    overrides = _overrides(path, "cluster", cl)
    names = _strings(path, "cluster.gpu", cl["gpu"], tuple(known))
    per_gpu = {}
    for k, v in cl.items():
        if isinstance(v, dict):     # [cluster.<gpu>]: overrides for that GPU only
            if k not in names:
                fix = (f"add {k!r} to cluster.gpu or remove the table" if k in known
                       else did_you_mean(k, names, "remove the table, or name it after a GPU of cluster.gpu"))
                raise InputError(path, "cluster table", f"[cluster.{k}]", "a table named after a GPU of cluster.gpu: "
                                 + ", ".join(names), fix)
            settings_here = [key for key in v if key in BY_NAME]
            if settings_here:
                raise InputError(path, f"cluster.{k}.{settings_here[0]}", v[settings_here[0]],
                                 "cluster keys: " + ", ".join(sorted(OVERRIDE_RANGES)),
                                 "training settings apply to every GPU of the sweep: give them in [training] "
                                 "(vpp in [parallel]), as a list to compare values")
            _check_keys(path, f"cluster.{k}", v, set(OVERRIDE_RANGES))
            per_gpu[k] = {**overrides, **_overrides(path, f"cluster.{k}", v)}
    for g in names:     # memory kept free must leave some for the model, on every GPU
        own = isinstance(cl.get(g), dict) and "reserved_GiB" in cl[g]
        given = per_gpu.get(g, overrides).get("reserved_GiB")
        check_reserved(known[g], known[g].reserved_GiB if given is None else given, path,
                       (f"cluster.{g}.reserved_GiB" if own else "cluster.reserved_GiB") if given is not None
                       else f"gpus.{g}.reserved_GiB (or hbm_GiB)")
    # in registry order: the machine axis's order (the last setting fastest)
    settings = {st.name: setting_values_of(path, doc, st) for st in SETTINGS}
    check_requirements(path, settings)
    gpus, notes = machine_variants(names, settings, overrides, calibration or {}, path, per_gpu, known)
    size_key = "num_gpus" if "num_gpus" in cl else "num_nodes"
    chunk = doc.get("output", {}).get("chunk_size", 1 << 18)
    if isinstance(chunk, bool) or not isinstance(chunk, int) or not 1 <= chunk <= 1 << 24:
        raise InputError(path, "output.chunk_size", chunk, f"an integer from 1 to {1 << 24}")
    name = doc.get("name", Path(path).stem)
    check_name(path, name)
    files = read_model_files(path, doc["model_files"]) if "model_files" in doc else []
    return SweepSpec(
        name=name,
        description=_description(path, doc.get("description", "")),
        models=_models(path, doc["model"], spec_models(path, doc.get("models"), files)),
        num_tokens=_floats(path, "training.num_tokens", tr["num_tokens"], 1.0, 1e16),
        gpus=gpus,
        cluster_sizes=_ints(path, size_key, cl[size_key], "cluster"),
        sizes_in_nodes=size_key == "num_nodes",
        tp=_ints(path, "tp", pa_["tp"], "parallel"),
        pp=_ints(path, "pp", pa_["pp"], "parallel"),
        micro_batch_size=_ints(path, "micro_batch_size", tr["micro_batch_size"], "training"),
        global_batch_size=_ints(path, "global_batch_size", tr["global_batch_size"], "training"),
        recompute=_strings(path, "training.recompute", tr.get("recompute", RECOMPUTE_DEFAULT), RECOMPUTE_VALUES),
        chunk_size=chunk,
        source=text,
        path=path,
        notes=notes,
        settings=tuple(settings.items()),
        model_files=tuple(f for f, _ in files),
        cp=_ints(path, "cp", pa_.get("cp", 1), "parallel"),
    )


def load_spec(path: str | Path, calibration: dict | None = None, gpus: dict | None = None) -> SweepSpec:
    """Read and validate the spec file at ``path`` (see :func:`parse_spec`).

    Raises
    ------
    InputError
        The file is missing, unreadable, not a regular file or larger than 16 MiB
        (:data:`~vtrain_fast.io.inputs.MAX_TEXT_BYTES`), or the spec is invalid.
    """
    p = Path(path)
    data = read_input_bytes(p, "TOML file", MAX_TEXT_BYTES)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise InputError(str(p), "encoding", f"byte {e.start}", "a UTF-8 text file",
                         "save the spec as UTF-8 text") from None
    return parse_spec(text, str(p), calibration, gpus)


def load_calibration(path: str | Path) -> dict:
    """Read a calibration file: one TOML table per GPU preset with fields of
    :class:`~vtrain_fast.hardware.gpus.Calibration`; missing fields keep the preset's defaults.

    Returns
    -------
    dict
        GPU preset name -> Calibration.

    Raises
    ------
    InputError
        Unreadable file (or not a regular file, or over 16 MiB), unknown preset or field,
        value out of range.
    """
    p = Path(path)
    doc = read_toml(p, "TOML file")
    out = {}
    for gpu, table in doc.items():
        if gpu == "meta":
            continue
        if gpu not in PRESETS:
            raise InputError(str(p), f"[{gpu}]", gpu, "GPU presets " + ", ".join(PRESETS))
        _check_keys(str(p), gpu, table, set(CALIBRATION_RANGES))
        base = PRESETS[gpu].calibration
        kw = {f.name: getattr(base, f.name) for f in fields(Calibration)}
        for k, v in table.items():
            lo, hi = CALIBRATION_RANGES[k]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
                raise InputError(str(p), f"{gpu}.{k}", v, f"a number from {lo:g} to {hi:g}")
            kw[k] = float(v)
        out[gpu] = Calibration(**kw)
    return out


def unvalidated_settings(spec) -> list[str]:
    """The settings of ``spec`` that vTrain's measurements (the validation set) do not cover:
    every training setting that is not at its default on some machine (none is used by those runs;
    one without effect on dense models only where the spec has an MoE model), interleaving, selective
    recomputation, context parallelism and sequences longer than 2,048."""
    from ..model.moe import is_moe
    moe = any(is_moe(m) for m in spec.models)
    out = [st.label for st in SETTINGS
           if not st.validated and (moe or not st.inert_models)
           and any(getattr(g, st.name) != st.default for g in spec.gpus)]
    if "selective" in spec.recompute:
        out.append("selective recomputation")
    if any(cp > 1 for cp in spec.cp):
        out.append("context parallelism (cp > 1)")
    if any(m.seq_length > 2048 for m in spec.models):
        out.append("seq_length > 2048")
    return out


def spec_caveats(spec) -> list[str]:
    """What a result of ``spec`` should be read with (printed as notes by ``sweep`` and ``optimal``):
    each GPU without a calibration fitted to its own measurements, and the settings the validation
    set does not cover (:func:`unvalidated_settings`)."""
    from ..hardware.gpus import PRESETS
    out = []
    for g in {g.name: g for g in spec.gpus}.values():
        if not g.calibrated:
            shipped = g.name in PRESETS and g.calibration == PRESETS[g.name].calibration
            out.append(f"{g.name} has no calibration fitted to its own measurements ("
                       + ("published GEMM efficiency, " if shipped else "efficiencies from its [gpus] table or "
                          "its base preset, ")
                       + "A100 software-stack timings such as 60 us host time per kernel): small "
                       "micro-batches and large tp may come out host-bound and slow, large GEMM-bound plans "
                       "optimistic; see README 'What the model does not cover'")
    unvalidated = unvalidated_settings(spec)
    if unvalidated:
        out.append("not validated against measurements: " + ", ".join(unvalidated) + "; vTrain's A100 "
                   "runs (no FlashAttention, s <= 2048, full recomputation) come out ~10 % too fast already, "
                   "expect more optimism here; see README 'What the model does not cover'")
    return out


def manifest_spec_points(manifest: dict) -> int | None:
    """The points of the grid of the spec a results folder's manifest records (its ``spec`` text,
    the machines of its ``machine_vectors`` and the shapes of its ``model_files``), or None where
    that spec cannot be read back here (a GPU of a ``--gpus`` file, a preset this version lacks)."""
    text = manifest.get("spec")
    machines = manifest.get("machine_vectors")
    if not isinstance(text, str) or not isinstance(machines, dict) or not machines:
        return None
    files = manifest.get("model_files")
    shapes = files.get("models") if isinstance(files, dict) else None
    return _spec_points(text, str(manifest.get("spec_path") or "<spec>"), len(machines),
                        len(shapes) if isinstance(shapes, list) else None)


@functools.lru_cache(maxsize=16)
def _spec_points(text: str, path: str, machines: int, shapes: int | None) -> int | None:
    try:
        spec = parse_spec(text, path)
    except (InputError, OSError, RecursionError):
        return None
    models = len(spec.models) if shapes is None else shapes
    return spec.num_points // (len(spec.models) * len(spec.gpus)) * models * machines


def recorded_spec_problem(manifest: dict) -> tuple[str, object, str] | None:
    """Where the spec a finished whole sweep's manifest records disagrees with its plan
    (``plan.num_points`` not the grid of the recorded spec; the machines' agreement with each other
    is :func:`vtrain_fast.io.writer.cluster_problem`'s, part of every read of a manifest), as ``(field, value, what it must be)`` (the shape of
    :func:`vtrain_fast.io.writer.final_problem`'s answer), else None (also for a shard's or an
    unfinished manifest; the grid is not counted where the spec cannot be read back here)."""
    plan = manifest.get("plan")
    if not manifest.get("complete") or manifest.get("shard") or not isinstance(plan, dict):
        return None
    points = manifest_spec_points(manifest)
    if points is not None and points != plan.get("num_points"):
        return "plan.num_points", plan.get("num_points"), f"{points:,}, the points of the spec the manifest records"
    return None
