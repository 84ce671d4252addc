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
from .records import MACHINE



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
    g = members_per_node(stride, n, hw[MACHINE.gpus_per_node])
    nodes = math.ceil(n / g)
    if nodes <= 1.0:
        return intra_allreduce_s(nbytes, n, hw)
    inter = tree_allreduce_s(nbytes / g, nodes, hw[MACHINE.inter_node_Bps], hw[MACHINE.inter_node_efficiency], hw[MACHINE.inter_node_latency_s],
                             hw[MACHINE.inter_node_step_latency_s])
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
    g = members_per_node(stride, n, hw[MACHINE.gpus_per_node])
    nodes = float(math.ceil(n / g))      # a float, as every other caller passes it (one compiled version)
    if nodes <= 1.0:
        return 2.0 * intra_allgather_s(nbytes, n, hw)
    inter = 2.0 * ring_allgather_s(nbytes / g, nodes, hw[MACHINE.inter_node_Bps], hw[MACHINE.inter_node_efficiency], hw[MACHINE.inter_node_latency_s],
                                   hw[MACHINE.inter_node_step_latency_s])
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
    return ring_allreduce_s(nbytes, n, hw[MACHINE.intra_node_Bps], hw[MACHINE.intra_node_efficiency], hw[MACHINE.intra_node_latency_s],
                            hw[MACHINE.intra_node_step_latency_s])


@jit
def intra_allgather_s(nbytes, n, hw):
    """Seconds of a ring all-gather (or reduce-scatter) of ``nbytes`` over ``n`` ranks inside
    one node (NVLink)."""
    return ring_allgather_s(nbytes, n, hw[MACHINE.intra_node_Bps], hw[MACHINE.intra_node_efficiency], hw[MACHINE.intra_node_latency_s],
                            hw[MACHINE.intra_node_step_latency_s])


@jit
def p2p_s(nbytes, crosses_node, hw):
    """Seconds of one point-to-point send of ``nbytes`` (pipeline activation or gradient),
    on the NIC when ``crosses_node`` else on NVLink:
    ``p2p_overhead_s + latency + nbytes / (bw * efficiency)``."""
    if crosses_node:
        return hw[MACHINE.p2p_overhead_s] + hw[MACHINE.inter_node_latency_s] + nbytes / (hw[MACHINE.inter_node_Bps] * hw[MACHINE.inter_node_efficiency])
    return hw[MACHINE.p2p_overhead_s] + hw[MACHINE.intra_node_latency_s] + nbytes / (hw[MACHINE.intra_node_Bps] * hw[MACHINE.intra_node_efficiency])


@jit
def cp_ring_step_s(nbytes, crosses_node, hw):
    """Seconds of one ring-attention step's transfer of ``nbytes`` to the next rank of the cp group
    (and the same from the previous one, each on its own direction of the link): on the NIC when
    ``crosses_node`` else on NVLink, ``latency + nbytes / (bw * efficiency)``. Unlike :func:`p2p_s`
    no ``p2p_overhead_s``: that is the fitted host and synchronisation time of a pipeline engine's
    blocking send (vTrain's Megatron-DeepSpeed runs), while TE launches the ring's sends and receives
    asynchronously (``batch_isend_irecv``) on the attention's stream."""
    if crosses_node:
        return hw[MACHINE.inter_node_latency_s] + nbytes / (hw[MACHINE.inter_node_Bps] * hw[MACHINE.inter_node_efficiency])
    return hw[MACHINE.intra_node_latency_s] + nbytes / (hw[MACHINE.intra_node_Bps] * hw[MACHINE.intra_node_efficiency])


@jit
def cp_ring_forward_exposed_s(kv_bytes, cp, block_s, crosses_node, hw):
    """Exposed seconds of ring attention's forward K/V exchange, one layer, one micro-batch
    (Megatron-LM ``--cp-comm-type p2p``, TE ``AttnFuncWithCPAndKVP2P``): ``cp - 1`` steps, each
    sending this rank's current K/V block (``kv_bytes``) to the next rank of the cp group and
    receiving the previous rank's (:func:`cp_ring_step_s`, on the NIC when the group leaves its node) while
    the attention block of the step runs (``block_s``): ``(cp - 1) * max(0, p2p - block_s)``."""
    if cp <= 1.0:
        return 0.0
    return (cp - 1.0) * max(0.0, cp_ring_step_s(kv_bytes, crosses_node, hw) - block_s)


@jit
def cp_ring_backward_exposed_s(kv_bytes, cp, block_s, crosses_node, hw):
    """Exposed seconds of ring attention's backward exchange, one layer, one micro-batch: ``cp``
    steps, each overlapped with one backward attention block (``block_s``); the first passes the
    K/V block on (``kv_bytes``), the middle ``cp - 2`` pass K/V and the dK/dV accumulated so far
    (twice the bytes), the last only dK/dV, back to their owner (TE ``AttnFuncWithCPAndKVP2P``
    backward): ``2 (cp - 1) kv_bytes`` in all, twice the forward's."""
    if cp <= 1.0:
        return 0.0
    one = max(0.0, cp_ring_step_s(kv_bytes, crosses_node, hw) - block_s)
    two = max(0.0, cp_ring_step_s(2.0 * kv_bytes, crosses_node, hw) - block_s)
    return 2.0 * one + (cp - 2.0) * two


@jit
def cp_all_gather_s(kv_bytes, cp, stride, hw):
    """Seconds of one all-gather (or reduce-scatter) over the ``cp`` ranks of a context-parallel
    group spaced ``stride`` of every rank's K/V (``kv_bytes`` each, ``cp * kv_bytes`` gathered;
    :func:`group_allgather_s`). TE's all-gather variant runs it before the attention, exposed
    (``AttnFuncWithCPAndKVAllGather``: "KV all-gather between CP ranks is exposed"); its backward
    gathers K/V again and reduce-scatters dK/dV after the attention."""
    if cp <= 1.0:
        return 0.0
    return group_allgather_s(cp * kv_bytes, cp, stride, hw)


@jit
def all_to_all_s(nbytes, n, stride, hw):
    """Seconds of an all-to-all in which each of ``n`` ranks spaced ``stride`` apart sends
    ``nbytes`` in all, ``nbytes / n`` to each rank (itself included: ``(n - 1) / n`` leaves it).
    Inside one node (``n * stride <= gpus_per_node``): latency + the bytes over NVLink. Across
    nodes, with ``g`` members per node (:func:`members_per_node`), the
    ``(g - 1) / n`` to its node's peers go over NVLink and the ``(n - g) / n`` to other nodes over
    the NIC at the same time: the inter-node latency + the longer of the two. 0 at ``n = 1``."""
    if n <= 1.0:
        return 0.0
    gpn = hw[MACHINE.gpus_per_node]
    g = members_per_node(stride, n, gpn)
    intra = hw[MACHINE.intra_node_Bps] * hw[MACHINE.intra_node_efficiency]
    if g >= n:
        return hw[MACHINE.intra_node_latency_s] + nbytes * (n - 1.0) / n / intra
    return hw[MACHINE.inter_node_latency_s] + max(nbytes * (g - 1.0) / n / intra,
                                   nbytes * (n - g) / n / (hw[MACHINE.inter_node_Bps] * hw[MACHINE.inter_node_efficiency]))
