"""Activation offloading (``cpu_offloading_num_layers``): the layers offloaded, when Megatron-core
refuses it, and the exposed seconds of the copies to the host and back.

Sources: Megatron-core ``TransformerConfig.__post_init__`` (the refusals: pipeline parallelism,
recomputation, every layer) and Transformer Engine >= 2.10 ``transformer_engine/pytorch/cpu_offload.py``
(``OffloadSynchronizer._default_offload_sync_init``: when each copy is queued and waited for);
tests/reference.py simulates its two streams event by event. Parameter offloading
(``param_cpu_offload``) is priced in :mod:`vtrain_fast.model.ops` and :mod:`vtrain_fast.model.pipeline`.
"""
from __future__ import annotations

from ._jit import jit
from .records import MACHINE, RECOMPUTE_NONE




@jit
def activation_offload_layers(hw):
    """Transformer layers whose saved activations are offloaded to the host
    (``cpu_offloading_num_layers``; 0.0 when off or negative)."""
    return max(0.0, hw[MACHINE.cpu_offloading_num_layers])


@jit
def refused_activation_offload(L, p, recompute, hw):
    """Whether Megatron-core refuses activation offloading (``cpu_offloading_num_layers`` ``k > 0``)
    here (``TransformerConfig.__post_init__``): with pipeline parallelism ("Currently there is no
    support for Pipeline parallelism with CPU offloading", ``p > 1``), with activation recomputation
    ("CPU offloading does not work when activation recomputation is enabled", ``recompute`` full or
    selective) and at ``k >= num_layers`` ("CPU offloading can be done only for layers less than
    num_layers"; Transformer Engine: the last layer is never offloaded)."""
    k = activation_offload_layers(hw)
    return k > 0.0 and (p > 1.0 or recompute != RECOMPUTE_NONE or k >= L)


@jit
def activation_offload_exposed_s(k, n, copy_s, compute_s):
    """Exposed seconds of one direction of activation offloading in one micro-batch: ``k`` of a
    rank's ``n`` layers each copy ``copy_s`` seconds of saved activations over the host link
    (forward: to the host; backward: back), on one copy stream, while each layer computes
    ``compute_s`` (its forward, or its backward).

    Transformer Engine's schedule (>= 2.10, transformer_engine/pytorch/cpu_offload.py,
    ``OffloadSynchronizer._default_offload_sync_init``): in forward layer ``i < k``'s copy is queued
    after its forward (at the next layer's step; assumed here not to start earlier) and must end
    before the forward of layer ``n - k + i`` starts; in backward the copies back run in the mirror
    order, layer ``i``'s queued at the start of the backward of layer ``n - 1 - k + i`` and due
    before its own backward. In both directions copy ``j`` (in stream order) is released after
    ``j + 1`` layers' compute and due ``w = n - k - 1`` layers' compute later, and a wait delays
    the later releases too. The longest path through that graph (compute of ``f`` per layer, copies
    of ``c`` chained on the stream) gives, for layers of equal compute:

    - ``w >= 1``: ``max(0, k c - (n - 2) f)``, the ``k`` copies back to back within the compute of
      layers ``1 .. n - 2`` (a copy shorter than a layer's compute is always hidden);
    - ``w = 0`` (``k = n - 1``, the most Megatron-core allows): ``k c``, every copy waited for in full.

    ``0.0`` at ``k <= 0``. tests/reference.py simulates the two streams event by event."""
    if k <= 0.0 or copy_s <= 0.0:
        return 0.0
    if n - k - 1.0 <= 0.0:
        return k * copy_s
    return max(0.0, k * copy_s - (n - 2.0) * compute_s)
