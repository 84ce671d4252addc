"""One configuration: the rules, then the parts, then the schedule.

:func:`step` checks the configuration (:mod:`vtrain_fast.model.rules`), prices its parts
(:func:`~vtrain_fast.model.costs.micro_batch_costs`, :func:`~vtrain_fast.model.costs.split_costs`,
:func:`~vtrain_fast.model.totals.model_totals`) and composes them into an iteration
(:func:`~vtrain_fast.model.pipeline.schedule`, Megatron-LM's 1F1B; its sources there). The sweep
drivers (:mod:`vtrain_fast.model.sweep`) call the same parts but reuse them across the points that
share them; their rows are bit for bit those of :func:`step`.
"""
from __future__ import annotations

from ._jit import jit
from .arch import DEFAULT_ARCH
from .costs import micro_batch_costs, split_costs
from .records import OK, REFUSED
from .pipeline import schedule
from .rules import (fill_nan, refused_context_parallel, refused_experts, validate_batch, validate_interleaving,
                    validate_split)
from .totals import model_totals


@jit
def step(L, h, a, g, f, v, s, B, b, lay, recompute, num_tokens, hw, out, i, arch=DEFAULT_ARCH):
    """Evaluate one configuration and write its outputs into column ``i`` of ``out``.

    Composition: :func:`~vtrain_fast.model.rules.validate_shape`, then
    :func:`~vtrain_fast.model.costs.micro_batch_costs`, :func:`~vtrain_fast.model.costs.split_costs`
    and :func:`~vtrain_fast.model.totals.model_totals`, then :func:`~vtrain_fast.model.pipeline.schedule`.
    The sweep drivers call the same parts but reuse the first three across the points that share them.

    Parameters
    ----------
    L, h, a, g, f, v, s : int
        num_layers, hidden_size, num_attention_heads, num_query_groups, ffn_hidden_size,
        vocab_size, seq_length.
    B, b : int
        global_batch_size, micro_batch_size (sequences).
    lay : Layout
        Parallel layout (:mod:`vtrain_fast.model.layout`); ``num_gpus`` is its world size.
    recompute : int
        ``RECOMPUTE_NONE`` (0), ``RECOMPUTE_FULL`` (1) or ``RECOMPUTE_SELECTIVE`` (2); see
        :func:`~vtrain_fast.model.pipeline.schedule`.
    num_tokens : float
        Tokens to train on.
    hw : numpy.ndarray
        Machine vector, ``float64``, shape ``(NUM_HW_FIELDS,)``.
    out : numpy.ndarray
        ``float64``, shape ``(NUM_OUTPUTS, n)``; column ``i`` is written, laid out as
        :data:`~vtrain_fast.model.records.OUTPUT_NAMES`.
    i : int
        Column to write.
    arch : Arch
        The model's architecture flags (:mod:`vtrain_fast.model.arch`; default: Megatron-LM's GPT
        layer, a GeLU MLP, LayerNorm, learned positions, biases and a tied head).

    Returns
    -------
    int
        Status code (``OK``, ``OUT_OF_MEMORY`` or a shape error). Never raises; rows with a
        shape error are NaN.
    """
    status = validate_split(L, h, a, g, f, v, s, lay, hw, arch)
    if status == OK and (refused_context_parallel(lay, hw) or refused_experts(lay, hw, arch)):
        status = REFUSED                # a settings rule, before the batch rule (as sweeps check it)
    status = validate_batch(status, B, b, lay.dp)
    if status == OK:
        status = validate_interleaving(L, B, b, lay.pp, lay.dp, hw)
    if status != OK:
        fill_nan(out, i)
        return status
    L = float(L); h = float(h); a = float(a); g = float(g); f = float(f); v = float(v)
    s = float(s); B = float(B); b = float(b)
    return schedule(L, h, s, v, B, b, lay, recompute, num_tokens, hw,
                    micro_batch_costs(b, s, h, a, g, f, v, float(lay.tp), hw, arch, float(lay.cp)),
                    split_costs(L, h, a, g, f, v, s, lay, hw, arch),
                    model_totals(L, h, a, g, f, v, s, num_tokens, arch), out, i)
