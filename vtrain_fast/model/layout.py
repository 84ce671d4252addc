"""The parallel layout: one description of the process grid that every kernel, ``evaluate`` and
the pruning table read.

A :data:`Layout` holds the size of each parallel dimension of :data:`DIMS`: tensor (``tp``),
context (``cp``: each sequence split over ``cp`` ranks, ring or all-gather attention), data (``dp``) and pipeline (``pp``)
parallelism. Ranks are numbered in Megatron-core's default order, ``tp`` innermost, then
``cp``, ``dp`` and ``pp`` outermost (``megatron.core.parallel_state``, ``order="tp-cp-ep-dp-pp"``),
so a group of one dimension is ``size`` ranks spaced by the product of the sizes inside it
(:func:`dp_stride`, :func:`pp_stride`), and consecutive ranks fill a node. The world size, the
strides and whether a group leaves its node are computed here only.

Layouts are Numba-compatible named tuples of ``int64``: kernels take one argument and read
fields by name; ``make bench`` measured no cost against passing the sizes one by one.
"""
from __future__ import annotations

from collections import namedtuple

from ._jit import jit

# Parallel dimensions, innermost (fastest-varying over ranks) first.
DIMS = ("tp", "cp", "dp", "pp")
Layout = namedtuple("Layout", DIMS)
Layout.__doc__ = """Sizes of the parallel dimensions (``int64`` each), in rank order (:data:`DIMS`)."""


@jit
def world_size(lay):
    """GPUs of a layout: the product of its sizes."""
    return lay.tp * lay.cp * lay.dp * lay.pp


@jit
def split_world(num_gpus, tp, cp, pp):
    """The layout of a ``num_gpus``-GPU job with the given ``tp``, ``cp`` and ``pp``: ``dp`` takes
    the rest. Returns ``(layout, ok)``; ``ok`` is False when ``tp * cp * pp`` does not divide
    ``num_gpus`` (then ``dp`` is the floor, possibly 0)."""
    model_parallel = tp * cp * pp
    dp = num_gpus // model_parallel
    return Layout(tp, cp, dp, pp), dp > 0 and num_gpus % model_parallel == 0


@jit
def dp_stride(lay):
    """Ranks between neighbours of a data-parallel group (``tp * cp``)."""
    return lay.tp * lay.cp


@jit
def dp_cp_size(lay):
    """Ranks of the data-parallel-with-context group (``dp * cp``): the group that reduces the
    gradients and shards the optimizer (Megatron-core ``get_data_parallel_group(with_context_parallel=True)``:
    the ``cp`` ranks of a sequence hold the same weights and each computes gradients from its own
    tokens)."""
    return lay.dp * lay.cp


@jit
def dp_cp_stride(lay):
    """Ranks between neighbours of the data-parallel-with-context group (``tp``: its ``dp * cp``
    members are the ranks of one tensor-parallel and one pipeline position, consecutive in the
    tp-cp-dp-pp order apart from the ``tp`` ranks inside)."""
    return lay.tp


@jit
def cp_stride(lay):
    """Ranks between neighbours of a context-parallel group (``tp``)."""
    return lay.tp


@jit
def pp_stride(lay):
    """Ranks between neighbouring pipeline stages (``tp * cp * dp``)."""
    return lay.tp * lay.cp * lay.dp


@jit
def spans_nodes(size, stride, gpus_per_node):
    """Whether a group of ``size`` ranks spaced ``stride`` apart leaves one node of
    ``gpus_per_node`` consecutive ranks: it spans ``size * stride`` ranks."""
    return size * stride > gpus_per_node
