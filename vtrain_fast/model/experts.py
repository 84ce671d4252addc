"""Mixture-of-experts formulas: what an MoE layer costs beyond a dense one, per micro-batch and rank.

The expert-parallel sizes (:func:`expert_sizes`), the busiest rank's share of the routed tokens
(:func:`moe_busiest_share`: load imbalance, capacity factor, padding), the rows each local expert's
GEMMs take (:func:`moe_rows`), the router and permutation (:func:`moe_router_s`), the experts'
grouped GEMMs (:func:`grouped_gemm_time_s`) and stored activations (:func:`moe_layer_extra`), the
token exchange of the alltoall and allgather dispatchers (:func:`ep_exchange_s`,
:func:`dispatch_bytes`), whether ``overlap_moe_expert_parallel_comm`` acts (:func:`ep_overlap_on`)
and the active FLOPs per token (:func:`moe_mlp_extra_flops_per_token`). Design: ``docs/moe.md``.

Sources: Megatron-core's MoE layer (``TopKRouter``, ``GroupedMLP`` / TE ``GroupedLinear``,
``MoEAlltoAllTokenDispatcher``, ``MoEAllGatherTokenDispatcher``, ``moe_utils.get_capacity``,
``parallel_state.initialize_model_parallel``'s expert rank order etp-ep-edp-pp); the shapes' fields
are :mod:`vtrain_fast.model.moe`'s.
"""
from __future__ import annotations

from ._jit import jit
from . import comm, ops

from .settings import BY_NAME as SETTING_BY_NAME
from .records import MACHINE








DISPATCHER_ALLGATHER = SETTING_BY_NAME["moe_token_dispatcher_type"].encode("allgather")




# MoE (issue 13, docs/moe.md): the busiest expert's tokens over the mean (the setting
# moe_load_imbalance, 1.0 by default), capped by the capacity factor: moe_busiest_share






# Router memory-bound work per routed token and expert: the fp32 logits read and the fp32
# probabilities written by the softmax and the top-k (4 + 4 bytes), two kernels each way.
MOE_ROUTER_BYTES_PER_LOGIT = 8.0


MOE_ROUTER_KERNELS = 2.0


# Permutation (token -> expert order) and unpermutation: read the tokens, write their k copies
# and back (bf16), one kernel each, each way.
MOE_PERMUTE_KERNELS = 2.0


@jit
def expert_sizes(t, hw):
    """``(ep, etp)`` of a machine vector at tensor-parallel size ``t``: ``etp`` 0 stands for ``t``
    (Megatron-core: ``expert_tensor_parallel_size`` None is ``tensor_model_parallel_size``)."""
    etp = hw[MACHINE.etp]
    return hw[MACHINE.ep], (etp if etp > 0.0 else t)


@jit
def ep_overlap_on(hw):
    """Whether ``overlap_moe_expert_parallel_comm`` acts: on, with the alltoall dispatcher it needs
    (Megatron-core asserts alltoall or flex; with allgather the flag has no effect, and sweeps and
    evaluate refuse the combination)."""
    return hw[MACHINE.overlap_moe_expert_parallel_comm] != 0.0 and hw[MACHINE.moe_token_dispatcher_type] != DISPATCHER_ALLGATHER


@jit
def grouped_gemm_time_s(m, n, k, groups, hw):
    """Seconds of a grouped GEMM of ``groups`` equal GEMMs ``(m x k) @ (k x n)``, a rank's local
    experts (Megatron-core ``GroupedMLP`` / TE ``GroupedLinear``): in bf16 one kernel whose SM
    utilisation counts the tiles of all groups (:func:`~vtrain_fast.model.ops.gemm_time_s` with
    ``batch = groups``: few rows per expert keep few SMs busy, the small-GEMM tail); in FP8 the
    same over TE's concurrent streams (:func:`~vtrain_fast.model.ops.fp8_gemm_time_s` with ``groups``;
    was ``groups`` FP8 GEMMs one after another, which priced FP8 Qwen3-30B's experts alone above its
    measured iteration)."""
    if ops.fp8_on(hw):
        return ops.fp8_gemm_time_s(m, n, k, hw, groups)
    return ops.gemm_time_s(m, n, k, groups, hw)


@jit
def moe_busiest_share(ep, hw):
    """The busiest expert-parallel rank's routed tokens (its local experts' together) over the even
    share, which sets the slowest rank's expert GEMMs, their activations and the tokens it receives:
    under dropless routing ``moe_load_imbalance``, at most ``ep`` (one rank cannot get more than
    every token) and 1 at ``ep = 1`` (every rank holds every expert: its rows are all its tokens'
    ``k`` copies, however they spread); with ``moe_expert_capacity_factor`` ``c > 0`` at most ``c``
    (Megatron-core drops the tokens beyond each expert's capacity, ``c`` times the even share:
    ``moe_utils.get_capacity``), and exactly ``c`` with ``moe_pad_expert_input_to_capacity`` (every
    expert padded to it)."""
    imbalance = min(hw[MACHINE.moe_load_imbalance], ep) if ep > 1.0 else 1.0
    c = hw[MACHINE.moe_expert_capacity_factor]
    if c > 0.0:
        return c if hw[MACHINE.moe_pad_expert_input_to_capacity] != 0.0 else min(imbalance, c)
    return imbalance


@jit
def moe_rows(b, s, t, hw, arch):
    """``(routed, rows, local)`` of one MoE layer on one rank, one micro-batch (``s`` the rank's
    tokens of a sequence): the tokens this rank routes, ``b s / t`` (Megatron-core's MoE layer takes
    the sequence-parallel input: each TP rank routes its share), the rows each local expert's GEMMs
    take, ``routed k etp / (E / ep)`` (uniform routing: the all-to-all over ``ep`` brings as many
    token copies as the rank sent, the all-gather over ``etp`` multiplies them by ``etp``) times
    :func:`moe_busiest_share` for the busiest rank, and the local experts ``E / ep``."""
    ep, etp = expert_sizes(t, hw)
    routed = b * s / t
    local = arch.num_experts / ep
    return routed, routed * arch.moe_router_topk * etp / local * moe_busiest_share(ep, hw), local


@jit
def moe_expert_width(f, arch):
    """One routed expert's width: ``moe_ffn_hidden_size``, or ``ffn_hidden_size`` when 0."""
    return arch.moe_ffn_hidden_size if arch.moe_ffn_hidden_size > 0.0 else f


@jit
def moe_router_s(b, s, h, t, hw, arch):
    """``(forward, backward)`` seconds of an MoE layer's router and token permutation, one
    micro-batch, one rank: the router GEMM ``routed x h x E`` (Megatron-core ``TopKRouter``, bf16;
    backward its data and weight gradients), softmax and top-k over the fp32 logits
    (:data:`MOE_ROUTER_BYTES_PER_LOGIT`) and the permutation into expert order and back
    (``2 (1 + k) routed h`` bytes read and written each, bf16), memory-bound, the same each way.
    With the allgather dispatcher (``moe_token_dispatcher_type``) the permutation picks the local
    experts' rows out of all ``n = etp ep`` ranks' gathered tokens and the unpermutation writes them
    all back into an fp32 buffer (``MoEAllGatherTokenDispatcher``): ``(2 + 4) (n - 1) routed h``
    bytes more."""
    routed, _, _ = moe_rows(b, s, t, hw, arch)
    e, k = arch.num_experts, arch.moe_router_topk
    permute = 4.0 * routed * h * (1.0 + k)
    if hw[MACHINE.moe_token_dispatcher_type] == DISPATCHER_ALLGATHER:
        ep, etp = expert_sizes(t, hw)
        permute += 6.0 * (ep * etp - 1.0) * routed * h
    permute *= ops.activation_scale(hw)     # 4-byte rows under fp32 / tf32
    mem = ops.memory_bound_time_s(MOE_ROUTER_BYTES_PER_LOGIT * routed * e + permute,
                                  MOE_ROUTER_KERNELS + MOE_PERMUTE_KERNELS, hw)
    fwd = ops.gemm_time_s(routed, e, h, 1.0, hw) + mem
    bwd = ops.gemm_time_s(routed, h, e, 1.0, hw) + ops.gemm_time_s(h, e, routed, 1.0, hw) + mem
    return fwd, bwd


@jit
def moe_layer_extra(b, s, h, f, t, hw, arch):
    """``(forward s, backward s, activation bytes)`` an MoE layer costs beyond a dense layer of
    ``ffn_hidden_size`` ``f``, one micro-batch, one rank: its MLP is the router
    (:func:`moe_router_s`), the local experts' grouped GEMMs (:func:`grouped_gemm_time_s`, rows
    :func:`moe_rows`, width ``moe_ffn_hidden_size / etp``, gated as the dense MLP) and their
    activation, and the shared experts as a dense MLP of ``moe_shared_expert_intermediate_size``
    over ``t``, instead of the dense MLP's FC1, FC2 and activation (the same GEMMs and bytes as
    :func:`~vtrain_fast.model.ops.layer_forward_s` / ``layer_backward_s`` count; the difference is
    added outside their host-launch floor). Stored: the experts' FC1 input and output and the
    activation output per row (``2 h + (4 + 2 gated) f_e / etp`` bytes), the experts' outputs brought
    back by the combine, which the weighted unpermutation keeps for its probabilities' gradient
    (``2 k h`` per routed token; the dispatch side keeps nothing: the permutation's and the
    all-to-all's backward need only indices and split sizes), the fp32 logits (``4 E``) and the
    shared experts' ``(4 + 2 gated) f_s / t`` per token, instead of the dense MLP's
    ``(4 + 2 gated) f / t`` (Korthikanti et al. 2022's MLP terms at the expert width)."""
    gated = arch.gated_mlp
    ep, etp = expert_sizes(t, hw)
    routed, rows, local = moe_rows(b, s, t, hw, arch)
    fe = moe_expert_width(f, arch) / etp
    fs = arch.moe_shared_expert_intermediate_size / t
    tokens = b * s
    k = arch.moe_router_topk
    router_fwd, router_bwd = moe_router_s(b, s, h, t, hw, arch)
    fwd = (router_fwd + grouped_gemm_time_s(rows, (1.0 + gated) * fe, h, local, hw)
           + grouped_gemm_time_s(rows, h, fe, local, hw)
           - ops.linear_gemm_time_s(tokens, (1.0 + gated) * f / t, h, hw) - ops.linear_gemm_time_s(tokens, h, f / t, hw))
    bwd = (router_bwd + grouped_gemm_time_s(rows, h, (1.0 + gated) * fe, local, hw)
           + grouped_gemm_time_s(h, (1.0 + gated) * fe, rows, local, hw)
           + grouped_gemm_time_s(rows, fe, h, local, hw) + grouped_gemm_time_s(fe, h, rows, local, hw)
           - ops.linear_gemm_time_s(tokens, h, (1.0 + gated) * f / t, hw)
           - ops.linear_gemm_time_s(h, (1.0 + gated) * f / t, tokens, hw)
           - ops.linear_gemm_time_s(tokens, f / t, h, hw) - ops.linear_gemm_time_s(f / t, h, tokens, hw))
    act_fwd = (4.0 + 2.0 * gated) * (local * rows * fe - tokens * f / t)     # the activation kernel's bytes
    act_bwd = (6.0 + 4.0 * gated) * (local * rows * fe - tokens * f / t)
    kernels = 0.0
    stored = (local * rows * (2.0 * h + (4.0 + 2.0 * gated) * fe) + 2.0 * k * routed * h + 4.0 * routed * arch.num_experts
              - (4.0 + 2.0 * gated) * tokens * f / t)
    if fs > 0.0:
        fwd += (ops.linear_gemm_time_s(tokens, (1.0 + gated) * fs, h, hw) + ops.linear_gemm_time_s(tokens, h, fs, hw))
        bwd += (ops.linear_gemm_time_s(tokens, h, (1.0 + gated) * fs, hw)
                + ops.linear_gemm_time_s(h, (1.0 + gated) * fs, tokens, hw)
                + ops.linear_gemm_time_s(tokens, fs, h, hw) + ops.linear_gemm_time_s(fs, h, tokens, hw))
        act_fwd += (4.0 + 2.0 * gated) * tokens * fs
        act_bwd += (6.0 + 4.0 * gated) * tokens * fs
        kernels = 1.0
        stored += (4.0 + 2.0 * gated) * tokens * fs
    sc = ops.activation_scale(hw)       # fp32 / tf32: 4-byte elements (the fp32 logits scaled too: an overcount)
    fwd += ops.memory_bound_time_s(act_fwd * sc, kernels, hw)
    bwd += ops.memory_bound_time_s(act_bwd * sc, kernels, hw)
    return fwd, bwd, stored * sc


@jit
def dispatch_bytes(b, s, h, t, arch):
    """Bytes one rank sends in one MoE all-to-all (dispatch, or combine), one micro-batch: its
    routed tokens' ``k`` copies of ``h`` bf16 activations, ``2 k h b s / t`` (Megatron-core
    ``MoEAlltoAllTokenDispatcher``; the fp32 routing probabilities sent along are not counted)."""
    return 2.0 * arch.moe_router_topk * h * b * s / t


@jit
def ep_exchange_s(b, s, h, t, hw, arch):
    """``(forward, backward)`` seconds of one MoE layer's token exchange, one micro-batch, by
    ``moe_token_dispatcher_type``:

    - alltoall: the dispatch and the combine all-to-all over the ``ep`` ranks of the expert
      group, spaced ``etp`` (Megatron-core's expert rank order etp-ep-edp-pp;
      :func:`~vtrain_fast.model.comm.all_to_all_s` of :func:`dispatch_bytes` times
      :func:`moe_busiest_share`: the busiest rank receives that much more, or with a capacity
      factor what its experts keep, padded or not), and with ``etp > 1``
      the all-gather of the received tokens over the ``etp`` ranks (stride 1) before the experts and
      the reduce-scatter after them (``gather_from_sequence_parallel_region``,
      ``reduce_scatter_to_sequence_parallel_region``); the same each way.
    - allgather (``MoEAllGatherTokenDispatcher``): over the ``n = etp ep`` ranks of the expert
      tensor-and-model-parallel group (stride 1), forward the all-gather of every rank's
      ``routed = b s / t`` tokens, ``2 h`` bytes each (bf16) with their routing probabilities
      (``4 E``, fp32) and routing map (``E``, bool), and the reduce-scatter of the expert outputs in
      fp32 (``4 h``); backward the all-gather of those outputs' gradients (``4 h``) and the
      reduce-scatter of the tokens' and probabilities' gradients (``2 h + 4 E``)
      (:func:`~vtrain_fast.model.comm.group_allgather_s` of the gathered size ``n routed x bytes``).

    Exposed in full; ``overlap_moe_expert_parallel_comm`` hides them in :func:`~vtrain_fast.model.pipeline.schedule`."""
    ep, etp = expert_sizes(t, hw)
    if hw[MACHINE.moe_token_dispatcher_type] == DISPATCHER_ALLGATHER:
        n = ep * etp
        if n <= 1.0:
            return 0.0, 0.0
        gathered = n * b * s / t * ops.activation_scale(hw)     # (fp32 / tf32: every part scaled, an overcount)
        e = arch.num_experts
        fwd = (comm.group_allgather_s(gathered * (2.0 * h + 5.0 * e), n, 1.0, hw)
               + comm.group_allgather_s(gathered * 4.0 * h, n, 1.0, hw))
        bwd = (comm.group_allgather_s(gathered * 4.0 * h, n, 1.0, hw)
               + comm.group_allgather_s(gathered * (2.0 * h + 4.0 * e), n, 1.0, hw))
        return fwd, bwd
    nbytes = dispatch_bytes(b, s, h, t, arch) * moe_busiest_share(ep, hw) * ops.activation_scale(hw)
    x = 2.0 * comm.all_to_all_s(nbytes, ep, etp, hw)
    if etp > 1.0:
        x += 2.0 * comm.group_allgather_s(nbytes * etp, etp, 1.0, hw)
    return x, x


@jit
def moe_mlp_extra_flops_per_token(h, f, arch):
    """Forward FLOPs per token of an MoE layer's MLP beyond a dense layer's (``(4 + 2 gated) h f``):
    the router ``2 E h``, ``k`` routed experts and the shared experts, ``(4 + 2 gated) h`` per
    unit of width (2 FLOPs per active weight: the MFU convention of 6 x active parameters per token
    for training, plus attention)."""
    per_width = (4.0 + 2.0 * arch.gated_mlp) * h
    return (2.0 * arch.num_experts * h + per_width * (arch.moe_router_topk * moe_expert_width(f, arch)
                                                     + arch.moe_shared_expert_intermediate_size)
            - per_width * f)
