"""Exchanges that overlap hides: tensor parallelism's behind its GEMMs, context parallelism's K/V
behind the attention.

:func:`tp_hidden_s` (one layer's TP exchange seconds hidden, one micro-batch) is
:func:`tp_backward_hidden_s` (the asynchronous all-reduce or sequence parallelism's reduce-scatter
behind the weight-gradient GEMMs) plus :func:`tp_comm_overlap_hidden_s` (Transformer Engine's
userbuffers, ``tp_comm_overlap``); :func:`mlp_tp_hidden_s` is the dense MLP's part of it (what an MoE
layer, without a dense MLP, does not hide); :func:`cp_exchange_s` is the exposed part of context
parallelism's ring or all-gather K/V exchange.

Sources: Megatron-LM ``LinearWithGradAccumulationAndAsyncCommunication``
(``async_tensor_model_parallel_allreduce``), Korthikanti et al. 2022 (sequence parallelism), Wang et
al. 2022, "Overlap Communication with Dependent Computation via Decomposition in Large Deep Learning
Models", ASPLOS '23 (TE ``UserbufferOverlap``, ``--tp-comm-overlap``), Megatron-core's context
parallelism (``cp_comm_type`` p2p ring, all-gather).
"""
from __future__ import annotations

from ._jit import jit
from . import comm, ops
from .arch import DEFAULT_ARCH
from .layout import spans_nodes

from .records import MACHINE




@jit
def mlp_tp_hidden_s(b, s, h, f, t, tp_exchange, hw, gated=0.0):
    """The part of :func:`tp_hidden_s` that the dense MLP's linears hide: the FC1 weight-gradient
    GEMM under the backward exchange (:func:`tp_backward_hidden_s`), and with ``tp_comm_overlap``
    FC1 after the all-gather, FC2 before the reduce-scatter and FC2's data gradient after the
    backward all-gather (:func:`tp_comm_overlap_hidden_s`). An MoE layer has no dense MLP: its
    tensor-parallel exchange is the attention's only (:func:`~vtrain_fast.model.pipeline.schedule` takes the MLP's
    exchange,
    less this, off the layer's), and its experts' tokens travel by :func:`~vtrain_fast.model.experts.ep_exchange_s`."""
    if t <= 1.0:
        return 0.0
    tokens = b * s
    hidden = 0.0
    if hw[MACHINE.async_tensor_model_parallel_allreduce] != 0.0 or hw[MACHINE.sequence_parallel] != 0.0:
        ex = tp_exchange * (0.5 if hw[MACHINE.sequence_parallel] != 0.0 else 1.0)
        hidden = min(ex, ops.linear_gemm_time_s(h, (1.0 + gated) * f / t, tokens, hw))
    if hw[MACHINE.tp_comm_overlap] != 0.0 and hw[MACHINE.sequence_parallel] != 0.0:
        half_s = 0.5 * tp_exchange
        hidden += (min(half_s, ops.linear_gemm_time_s(tokens, (1.0 + gated) * f / t, h, hw))
                   + min(half_s, ops.linear_gemm_time_s(tokens, h, f / t, hw))
                   + min(half_s, ops.linear_gemm_time_s(tokens, f / t, h, hw)))
    return hidden


@jit
def tp_hidden_s(b, s, h, a, g, f, t, tp_exchange, hw, gated=0.0, qw=0.0, arch=DEFAULT_ARCH):
    """Seconds of one layer's tensor-parallel exchanges (``tp_exchange``: one activation's) that
    overlap hides, one micro-batch: :func:`tp_backward_hidden_s` with the asynchronous all-reduce
    or sequence parallelism (half the exchange, the reduce-scatter, with sequence parallelism),
    plus :func:`tp_comm_overlap_hidden_s` with ``tp_comm_overlap`` and sequence parallelism
    (``qw`` the attention width, :func:`~vtrain_fast.model.ops.attention_width`; 0: ``h``; ``arch``
    for multi-head latent attention's linears)."""
    hidden = 0.0
    if hw[MACHINE.async_tensor_model_parallel_allreduce] != 0.0 or hw[MACHINE.sequence_parallel] != 0.0:
        hidden = tp_backward_hidden_s(b, s, h, a, g, f, t, tp_exchange * (0.5 if hw[MACHINE.sequence_parallel] != 0.0 else 1.0),
                                      hw, gated, qw, arch)
    if hw[MACHINE.tp_comm_overlap] != 0.0 and hw[MACHINE.sequence_parallel] != 0.0:
        hidden += tp_comm_overlap_hidden_s(b, s, h, a, g, f, t, 0.5 * tp_exchange, hw, gated, qw, arch)
    return hidden


@jit
def cp_exchange_s(b, s, h, a, g, t, cp, hw):
    """``(forward, backward)`` exposed seconds of one layer's context-parallel K/V exchange, one
    micro-batch (``s`` the rank's tokens, ``seq_length / cp``; ``(0, 0)`` at ``cp = 1``).

    The cp group has ``cp`` ranks spaced ``tp`` (:func:`~vtrain_fast.model.layout.cp_stride`);
    it leaves its node when ``tp * cp > gpus_per_node``. Ring (``cp_comm_type`` = p2p): each
    step's transfer of this rank's K/V (:func:`~vtrain_fast.model.ops.cp_kv_bytes`) hides behind
    one attention block (the FlashAttention forward or backward over ``s`` rows):
    :func:`~vtrain_fast.model.comm.cp_ring_forward_exposed_s`,
    :func:`~vtrain_fast.model.comm.cp_ring_backward_exposed_s`. All-gather: forward one exposed
    all-gather of K/V, backward that all-gather again and the reduce-scatter of dK/dV
    (:func:`~vtrain_fast.model.comm.cp_all_gather_s`). ``h`` is the attention width
    (:func:`~vtrain_fast.model.ops.attention_width`)."""
    if cp <= 1.0:
        return 0.0, 0.0
    kv = ops.cp_kv_bytes(b, s, h, a, g, t)
    if ops.cp_all_gather_on(hw):
        gather = comm.cp_all_gather_s(kv, cp, t, hw)
        return gather, 2.0 * gather
    crosses = spans_nodes(cp, t, hw[MACHINE.gpus_per_node])
    return (comm.cp_ring_forward_exposed_s(kv, cp, ops.flash_attention_forward_s(b, s, h, a, g, t, hw), crosses, hw),
            comm.cp_ring_backward_exposed_s(kv, cp, ops.flash_attention_backward_s(b, s, h, a, g, t, hw), crosses, hw))


@jit
def tp_backward_hidden_s(b, s, h, a, g, f, t, exchange_s, hw, gated=0.0, qw=0.0, arch=DEFAULT_ARCH):
    """Seconds of one layer's backward tensor-parallel exchanges that asynchronous communication
    hides, one micro-batch.

    Megatron-LM's column-parallel linears (QKV and FC1) start the all-reduce of their input
    gradient (with sequence parallelism, its reduce-scatter) and compute the weight gradient
    while it runs (``LinearWithGradAccumulationAndAsyncCommunication``,
    ``async_tensor_model_parallel_allreduce``), so each of the two exchanges (``exchange_s``
    seconds: the all-reduce, or with sequence parallelism the reduce-scatter, half of the
    exchange) is hidden up to the length of its weight-gradient GEMM:
    ``min(exchange_s, wgrad_qkv) + min(exchange_s, wgrad_fc1)``; 0 at ``t = 1`` (no exchange).
    :func:`~vtrain_fast.model.costs.micro_batch_costs` charges it when the machine-vector field ``tp_overlap`` is
    set, and
    always with sequence parallelism (Megatron-LM overlaps its reduce-scatter whatever the flag)."""
    if t <= 1.0:
        return 0.0
    tokens = b * s
    if ops.mla_on(arch):                # MLA: its column-parallel up projections' weight gradients
        return (min(exchange_s, ops.mla_up_gemms_s(tokens, h, a, t, True, hw, arch))
                + min(exchange_s, ops.linear_gemm_time_s(h, (1.0 + gated) * f / t, tokens, hw)))
    q = qw if qw > 0.0 else h           # the attention width (0: h)
    qkv_out = (q + 2.0 * q * g / a) / t
    return (min(exchange_s, ops.linear_gemm_time_s(h, qkv_out, tokens, hw))
            + min(exchange_s, ops.linear_gemm_time_s(h, (1.0 + gated) * f / t, tokens, hw)))


@jit
def tp_comm_overlap_hidden_s(b, s, h, a, g, f, t, half_s, hw, gated=0.0, qw=0.0, arch=DEFAULT_ARCH):
    """Seconds of one layer's sequence-parallel exchanges that Transformer Engine's userbuffers
    overlap hides beyond :func:`tp_backward_hidden_s`, one micro-batch (Megatron-LM
    ``--tp-comm-overlap``, which needs sequence parallelism).

    The GEMM of each tensor-parallel linear is split into chunks pipelined with the exchange it
    consumes or produces (Wang et al. 2022, "Overlap Communication with Dependent Computation via
    Decomposition in Large Deep Learning Models", ASPLOS '23; TE ``UserbufferOverlap``): in
    forward the all-gather before QKV and FC1 and the reduce-scatter after the output projection
    and FC2, in backward the all-gather of the output gradient before the data-gradient GEMMs of
    the output projection and FC2. Each exchange (``half_s``: half of the reduce-scatter +
    all-gather pair of one activation) is hidden up to the length of its GEMM:
    ``sum min(half_s, gemm)`` over those six. An optimistic bound: the first or last chunk that
    cannot overlap and the SMs the communication kernels take from the GEMMs are not charged (no
    measurements here to fit them to); a recomputed forward's exchanges stay exposed. 0 at
    ``t = 1``."""
    if t <= 1.0:
        return 0.0
    tokens = b * s
    if ops.mla_on(arch):                # MLA: the gather feeds its up projections; the context a v_head_dim
        cw = ops.context_width(h, a, arch)
        return (min(half_s, ops.mla_up_gemms_s(tokens, h, a, t, False, hw, arch))   # AG -> up projections
                + min(half_s, ops.linear_gemm_time_s(tokens, h, cw / t, hw))
                + min(half_s, ops.linear_gemm_time_s(tokens, (1.0 + gated) * f / t, h, hw))
                + min(half_s, ops.linear_gemm_time_s(tokens, h, f / t, hw))
                + min(half_s, ops.linear_gemm_time_s(tokens, cw / t, h, hw))
                + min(half_s, ops.linear_gemm_time_s(tokens, f / t, h, hw)))
    q = qw if qw > 0.0 else h           # the attention width (0: h)
    qkv_out = (q + 2.0 * q * g / a) / t
    return (min(half_s, ops.linear_gemm_time_s(tokens, qkv_out, h, hw))        # AG -> QKV
            + min(half_s, ops.linear_gemm_time_s(tokens, h, q / t, hw))      # projection -> RS
            + min(half_s, ops.linear_gemm_time_s(tokens, (1.0 + gated) * f / t, h, hw))   # AG -> FC1
            + min(half_s, ops.linear_gemm_time_s(tokens, h, f / t, hw))      # FC2 -> RS
            + min(half_s, ops.linear_gemm_time_s(tokens, q / t, h, hw))      # AG -> projection dgrad
            + min(half_s, ops.linear_gemm_time_s(tokens, f / t, h, hw)))     # AG -> FC2 dgrad
