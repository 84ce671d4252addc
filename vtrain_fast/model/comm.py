"""Collective-communication cost formulas (alpha-beta model, ring and tree algorithms).

Semantics follow nccl-tests (NVIDIA, ``doc/PERFORMANCE.md``): for an all-reduce of ``S`` bytes
over ``n`` ranks, ``algbw = S / time`` and ``busbw = algbw * 2(n-1)/n``; a ring all-reduce moves
``2(n-1)/n * S`` bytes through each rank's link, so ``time = 2(n-1)/n * S / busbw``.
All-gather and reduce-scatter move ``(n-1)/n * S`` (``S`` the full, gathered size).
Link bandwidth is per GPU per direction; ``*_efficiency`` is the large-message
``busbw / link bandwidth`` measured by nccl-tests.

Latency: a fixed ``latency_s`` per collective plus ``step_latency_s`` per ring step (``2(n-1)``
steps for an all-reduce, ``n-1`` for an all-gather or reduce-scatter), fitted to nccl-tests
tables by :mod:`vtrain_fast.analysis.nccl`. Across nodes the all-reduce runs on NCCL's double binary tree
(:func:`tree_allreduce_s`): ``2 * floor(log2 n)`` steps instead of ``2(n-1)``; reduce-scatter and
all-gather stay rings (:func:`group_reduce_scatter_allgather_s`).

Rank layout (Megatron-LM): tensor-parallel ranks innermost, then data-parallel, then pipeline,
so a TP group has stride 1, a DP group stride ``tp`` and pipeline neighbours are ``tp*dp`` apart.
"""
from __future__ import annotations

import math

from ._jit import jit
from .params import (H_P2P_OVERHEAD_S, H_GPUS_PER_NODE, H_INTER_BPS, H_INTER_EFF, H_INTER_LAT_S, H_INTER_STEP_S,
                     H_INTRA_BPS, H_INTRA_EFF, H_INTRA_LAT_S, H_INTRA_STEP_S)


@jit
def ring_allreduce_s(nbytes, n, link_Bps, efficiency, latency_s, step_latency_s):
    """Seconds of a ring all-reduce of ``nbytes`` over ``n`` ranks.

    ``latency_s + 2(n-1) * step_latency_s + 2(n-1)/n * nbytes / (link_Bps * efficiency)``;
    0 when ``n <= 1``.
    """
    if n <= 1.0:
        return 0.0
    return (latency_s + 2.0 * (n - 1.0) * step_latency_s
            + 2.0 * (n - 1.0) / n * nbytes / (link_Bps * efficiency))


@jit
def ring_allgather_s(nbytes, n, link_Bps, efficiency, latency_s, step_latency_s):
    """Seconds of a ring all-gather (or reduce-scatter) whose full buffer is ``nbytes``.

    ``latency_s + (n-1) * step_latency_s + (n-1)/n * nbytes / (link_Bps * efficiency)``;
    0 when ``n <= 1``.
    """
    if n <= 1.0:
        return 0.0
    return (latency_s + (n - 1.0) * step_latency_s
            + (n - 1.0) / n * nbytes / (link_Bps * efficiency))


@jit
def tree_allreduce_s(nbytes, n, link_Bps, efficiency, latency_s, step_latency_s):
    """Seconds of a double-binary-tree all-reduce of ``nbytes`` over ``n`` ranks.

    ``latency_s + 2 * floor(log2 n) * step_latency_s + 2(n-1)/n * nbytes / (link_Bps * efficiency)``;
    0 when ``n <= 1``. Reduce up and broadcast down a tree of depth ``floor(log2 n)`` (NCCL's own
    tuning model charges ``2 * log2i(nNodes)`` inter-node latencies, src/graph/tuning.cc); the two
    complementary trees each carry half of the buffer, so every rank sends and receives about
    ``2 * nbytes`` like the ring and reaches the same bus bandwidth (Sanders, Speck, Traeff 2009,
    "Two-tree algorithms for full bandwidth broadcast, reduction and scan", Parallel Computing
    35(12); Jeaugey, "Massively Scale Your Deep Learning Training with NCCL 2.4", NVIDIA 2019).
    Only the latency term differs from :func:`ring_allreduce_s`; it is never slower than it.
    """
    if n <= 1.0:
        return 0.0
    return (latency_s + 2.0 * math.floor(math.log2(n)) * step_latency_s
            + 2.0 * (n - 1.0) / n * nbytes / (link_Bps * efficiency))


@jit
def members_per_node(stride, n, gpus_per_node):
    """How many of a group's ``n`` ranks, spaced ``stride`` apart, share one node (>= 1)."""
    if stride >= gpus_per_node:
        return 1.0
    return max(1.0, min(n, math.floor(gpus_per_node / stride)))


@jit
def group_allreduce_s(nbytes, n, stride, hw):
    """Seconds of an all-reduce of ``nbytes`` over a group of ``n`` ranks spaced ``stride``.

    Inside one node: ring on NVLink. Across nodes with ``g > 1`` members per node:
    hierarchical (intra-node reduce-scatter, inter-node tree all-reduce of ``nbytes / g`` on each
    member's NIC, intra-node all-gather), as NCCL does with its trees over nodes
    (Jeaugey, NCCL 2.4 "Massively Scale Your Deep Learning Training with NCCL 2.4", 2019).
    One member per node: tree over the NICs (:func:`tree_allreduce_s`).
    """
    if n <= 1.0:
        return 0.0
    g = members_per_node(stride, n, hw[H_GPUS_PER_NODE])
    nodes = math.ceil(n / g)
    if nodes <= 1.0:
        return intra_allreduce_s(nbytes, n, hw)
    inter = tree_allreduce_s(nbytes / g, nodes, hw[H_INTER_BPS], hw[H_INTER_EFF], hw[H_INTER_LAT_S],
                             hw[H_INTER_STEP_S])
    return inter + 2.0 * intra_allgather_s(nbytes, g, hw)


@jit
def group_reduce_scatter_allgather_s(nbytes, n, stride, hw):
    """Seconds of a reduce-scatter followed by an all-gather of ``nbytes`` over ``n`` ranks
    spaced ``stride`` (the distributed optimizer's gradient and parameter exchange).

    Rings, as NCCL runs both collectives: inside one node two NVLink rings; across nodes with
    ``g`` members per node, the intra-node reduce-scatter and all-gather around an inter-node
    ring reduce-scatter and all-gather of ``nbytes / g`` on each member's NIC. The bytes equal
    :func:`group_allreduce_s`'s; the latency is that of two ring collectives.
    """
    if n <= 1.0:
        return 0.0
    g = members_per_node(stride, n, hw[H_GPUS_PER_NODE])
    nodes = math.ceil(n / g)
    if nodes <= 1.0:
        return 2.0 * intra_allgather_s(nbytes, n, hw)
    inter = 2.0 * ring_allgather_s(nbytes / g, nodes, hw[H_INTER_BPS], hw[H_INTER_EFF], hw[H_INTER_LAT_S],
                                   hw[H_INTER_STEP_S])
    return inter + 2.0 * intra_allgather_s(nbytes, g, hw)


@jit
def group_allgather_s(nbytes, n, stride, hw):
    """Seconds of one all-gather (or one reduce-scatter) of ``nbytes`` (the gathered size) over
    ``n`` ranks spaced ``stride``: half of :func:`group_reduce_scatter_allgather_s`, whose two
    collectives cost the same (ZeRO-3 / FSDP's per-layer parameter gathers and gradient
    reduce-scatters)."""
    return 0.5 * group_reduce_scatter_allgather_s(nbytes, n, stride, hw)


@jit
def intra_allreduce_s(nbytes, n, hw):
    """Seconds of a ring all-reduce of ``nbytes`` over ``n`` ranks inside one node (NVLink)."""
    return ring_allreduce_s(nbytes, n, hw[H_INTRA_BPS], hw[H_INTRA_EFF], hw[H_INTRA_LAT_S],
                            hw[H_INTRA_STEP_S])


@jit
def intra_allgather_s(nbytes, n, hw):
    """Seconds of a ring all-gather (or reduce-scatter) of ``nbytes`` over ``n`` ranks inside
    one node (NVLink)."""
    return ring_allgather_s(nbytes, n, hw[H_INTRA_BPS], hw[H_INTRA_EFF], hw[H_INTRA_LAT_S],
                            hw[H_INTRA_STEP_S])


@jit
def p2p_s(nbytes, crosses_node, hw):
    """Seconds of one point-to-point send of ``nbytes`` (pipeline activation or gradient),
    on the NIC when ``crosses_node`` else on NVLink:
    ``p2p_overhead_s + latency + nbytes / (bw * efficiency)``."""
    if crosses_node:
        return hw[H_P2P_OVERHEAD_S] + hw[H_INTER_LAT_S] + nbytes / (hw[H_INTER_BPS] * hw[H_INTER_EFF])
    return hw[H_P2P_OVERHEAD_S] + hw[H_INTRA_LAT_S] + nbytes / (hw[H_INTRA_BPS] * hw[H_INTRA_EFF])
