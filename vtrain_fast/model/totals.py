"""Per-model totals: parameters, forward FLOPs per token and the loss column.

:func:`model_totals` (layout :data:`TOTAL_NAMES`) counts a model's parameters
(:func:`~vtrain_fast.model.memory.model_params`, all experts of MoE layers), its forward FLOPs per
token (:func:`forward_flops_per_token`, the active experts of MoE layers) and Chinchilla's loss at
the tokens trained on (:func:`chinchilla_loss`; the other loss fits are Python's,
:mod:`vtrain_fast.plan.loss`).

Sources: Megatron-LM ``num_floating_point_operations`` (its attention terms over the full ``s x s``),
PaLM (Chowdhery et al. 2022, Appendix B: training FLOPs 3x forward), Hoffmann et al. 2022,
"Training Compute-Optimal Large Language Models", Eq. 10 (the loss).
"""
from __future__ import annotations

from ._jit import jit
from . import memory, ops
from .arch import DEFAULT_ARCH
from .experts import moe_mlp_extra_flops_per_token
from .layer_split import moe_layers_of
from .records import CHINCHILLA_A, CHINCHILLA_ALPHA, CHINCHILLA_B, CHINCHILLA_BETA, CHINCHILLA_E, Totals


# Forward FLOPs of the attention scores and context per token per layer, over the full s x s
# as Megatron-LM counts them: 4 s h (see forward_flops_per_token).
ATTENTION_FLOPS_PER_TOKEN_PER_S_H = 4.0


@jit
def chinchilla_loss(num_parameters, num_tokens):
    """Chinchilla's fitted loss ``E + A/N^alpha + B/D^beta`` (nats per token) for ``N``
    parameters trained on ``D`` tokens (Hoffmann et al. 2022, Eq. 10)."""
    return (CHINCHILLA_E + CHINCHILLA_A / num_parameters ** CHINCHILLA_ALPHA
            + CHINCHILLA_B / num_tokens ** CHINCHILLA_BETA)


@jit
def forward_flops_per_token(num_layers, h, a, g, f, v, s, gated=0.0, qw=0.0, arch=DEFAULT_ARCH):
    """Model forward FLOPs per token: GEMMs of every layer (QKV, attention scores and context
    over the full ``s x s`` as Megatron-LM counts them, output projection, MLP) and the LM head.
    Training model FLOPs are 3x this (PaLM, Chowdhery et al. 2022, Appendix B). Heads of
    ``kv_channels`` channels (``qw = a d``, :func:`~vtrain_fast.model.ops.attention_width`; 0:
    ``h``): QKV ``2 h (qw + 2 qw g/a)``, projection ``2 qw h``, scores and context ``4 s qw``
    (Megatron-LM ``num_floating_point_operations``: its attention terms times
    ``query_projection_size / hidden_size``).

    Multi-head latent attention (``arch``; ``qw`` its
    :func:`~vtrain_fast.model.ops.attention_width`, ``a (dq + v_head_dim) / 2``): 2 FLOPs per weight
    of its linears (:func:`~vtrain_fast.model.ops.mla_weights`, replicated and split, and the
    projection ``a v_head_dim x h``) instead of QKV's and the projection's, and scores and
    context ``4 s qw = 2 s a (dq + v_head_dim)`` (``Q K^T`` over ``dq = qk_head_dim +
    qk_pos_emb_head_dim`` channels, ``P V`` over ``v_head_dim``, full ``s x s``: Megatron-LM's MLA
    count doubled, as its causal halving is not taken here; its norm terms, ``q_lora_rank +
    kv_lora_rank`` per token, are left out)."""
    q = qw if qw > 0.0 else h
    if arch.multi_latent_attention != 0.0:
        rep_w, split_w = ops.mla_weights(h, a, arch)
        per_layer = (2.0 * (rep_w + split_w) + 2.0 * ops.context_width(h, a, arch) * h
                     + (4.0 + 2.0 * gated) * h * f + ATTENTION_FLOPS_PER_TOKEN_PER_S_H * s * q)
        return num_layers * per_layer + 2.0 * h * v
    per_layer = (2.0 * h * (q + 2.0 * q * g / a) + 2.0 * q * h + (4.0 + 2.0 * gated) * h * f
                 + ATTENTION_FLOPS_PER_TOKEN_PER_S_H * s * q)
    return num_layers * per_layer + 2.0 * h * v


@jit
def model_totals(L, h, a, g, f, v, s, num_tokens, arch=DEFAULT_ARCH):
    """``(num_parameters, forward_flops_per_token, loss)`` of a model (architecture flags ``arch``)
    trained on ``num_tokens`` tokens (:func:`~vtrain_fast.model.memory.model_params`,
    :func:`forward_flops_per_token`, :func:`chinchilla_loss`); layout :data:`TOTAL_NAMES`."""
    n_params = memory.model_params(L, h, a, g, f, v, s, arch)
    fwd_flops = forward_flops_per_token(L, h, a, g, f, v, s, arch.gated_mlp, ops.attention_width(h, a, arch), arch)
    if arch.num_experts >= 1.0:
        # MoE layers: all experts' parameters; FLOPs of the active ones (top-k routed experts, the
        # router and the shared experts) instead of the dense MLP's
        n_moe = moe_layers_of(0.0, L, arch.moe_layer_step, arch.moe_first_dense_layers)
        p_moe, p_exp = memory.moe_layer_params_per_rank(h, a, g, f, 1.0, 1.0, 1.0, arch)
        n_params += n_moe * (p_moe + p_exp - memory.layer_params(h, a, g, f, arch))
        fwd_flops += n_moe * moe_mlp_extra_flops_per_token(h, f, arch)
    return Totals(num_parameters=n_params, forward_flops_per_token=fwd_flops,
                  loss=chinchilla_loss(n_params, num_tokens))
