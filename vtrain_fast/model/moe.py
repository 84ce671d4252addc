"""Mixture-of-experts and attention-shape fields of a model, and the parameter counts of such a
model (total and active per token). Pure Python, no Numba: the kernels read the integer columns of
:data:`KERNEL_COLUMNS` (the MoE layout, ``kv_channels`` and multi-head latent attention); a model
that needs what they do not price (another layer pattern; a capacity factor given as a model key, which is
a training setting) is refused (:func:`unpriced_reason`, raised by :func:`vtrain_fast.plan.models.check_priced`), never
priced as another model.

The fields are one registry, :data:`SHAPE_FIELDS`, as :mod:`vtrain_fast.model.arch` is for the
architecture flags: ``ModelShape`` takes one field per record (``plan.models``), model files and
``[models.<name>]`` tables take them as keys (checked by :meth:`ShapeField.check`), ``vtrain-fast
import-hf`` writes them and ``vtrain-fast presets`` shows them. Names are Megatron-LM's arguments
(``--num-experts`` is Megatron-core's ``TransformerConfig.num_moe_experts``; the others have the
same name in both: ``megatron/core/transformer/transformer_config.py``); where Megatron-core's
default is ``None`` the field's 0 stands for it (TOML has no null).

How the kernels read them (``docs/moe.md``): the model table ``records.MODEL_FIELDS`` holds the
columns of :data:`KERNEL_COLUMNS` after the architecture flags, with
``moe_layer_freq`` as a step and a count of dense first layers (:func:`layer_placement`), from which
the kernels count each pipeline device's MoE layers; the counts here (:func:`param_counts`) are the
reference the kernels' parameter counts are tested against.

Adding a field: a record at the end of :data:`SHAPE_FIELDS`, its formula here, its tests.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple


@dataclass(frozen=True)
class ShapeField:
    """One integer, float or switch field of a model shape beyond the sizes of ``records.MODEL_SIZES``.

    Attributes
    ----------
    name : str
        Model-file key and ``ModelShape`` field (Megatron-LM's argument name).
    kind : type
        ``int``, ``float`` (may be absent: ``None``), ``bool``, or ``tuple`` (``moe_layer_freq``:
        an int or a 0/1 pattern).
    default
        The value of a shape that leaves it out (Megatron-core's default; 0 for its ``None``).
    doc : str
        What it means, with the default spelled out.
    megatron : str
        The Megatron-LM command-line flag.
    lo, hi : float
        The range of a number (``lo`` <= value <= ``hi``).
    """

    name: str
    kind: type
    default: object
    doc: str
    megatron: str
    lo: float = 0
    hi: float = 10_000_000

    def allowed(self) -> str:
        """The allowed values, as an error message lists them."""
        if self.kind is bool:
            return "true or false"
        if self.kind is float:
            return f"a number from {self.lo:g} to {self.hi:g} (leave it out for {self.doc.split(';')[0]})"
        if self.kind is tuple:
            return ("a whole number k >= 1 (every k-th layer is an MoE layer, from the first), a list of 0/1 per "
                    "layer, or Megatron-LM's pattern text such as \"([0]*3+[1]*58)\"")
        return f"a whole number from {self.lo:,.0f} to {self.hi:,.0f}"


_NONE = "0: none"
SHAPE_FIELDS: tuple[ShapeField, ...] = (
    ShapeField("num_experts", int, 0,
               "routed experts per MoE layer; 0: a dense model (Megatron-core num_moe_experts None)", "--num-experts",
               0, 100_000),
    ShapeField("moe_router_topk", int, 2,
               "experts each token is routed to (Megatron-core's default 2); at most num_experts",
               "--moe-router-topk", 1, 100_000),
    ShapeField("moe_ffn_hidden_size", int, 0,
               "width of one routed expert's MLP (gated as the dense MLP: gated_mlp); 0: ffn_hidden_size "
               "(Megatron-core's default); dense layers keep ffn_hidden_size", "--moe-ffn-hidden-size", 0, 10_000_000),
    ShapeField("moe_shared_expert_intermediate_size", int, 0,
               "total width of the shared experts every token passes through (number of shared experts x "
               "their width, Megatron-core's definition); 0: none", "--moe-shared-expert-intermediate-size",
               0, 10_000_000),
    ShapeField("moe_layer_freq", tuple, 1,
               "which layers are MoE layers: k (an MoE layer every k-th layer, layer 0 first: Megatron-core "
               "gpt_layer_specs) or a 0/1 pattern, one per layer (DeepSeek-V3: \"([0]*3+[1]*58)\"); default 1, "
               "every layer", "--moe-layer-freq", 1, 100_000),
    ShapeField("moe_expert_capacity_factor", float, None,
               "dropless routing (Megatron-core's default None); else each expert takes at most this factor "
               "x its even share of the tokens, the rest are dropped", "--moe-expert-capacity-factor", 0.0, 1000.0),
    ShapeField("kv_channels", int, 0,
               "channels per attention head (projection width num_attention_heads x kv_channels); 0: "
               "hidden_size / num_attention_heads (Megatron-LM's default)", "--kv-channels", 0, 100_000),
    ShapeField("multi_latent_attention", bool, False,
               "multi-head latent attention (DeepSeek-V2/V3): low-rank query and key/value projections "
               "(q_lora_rank, kv_lora_rank) and decoupled rotary key channels", "--multi-latent-attention"),
    ShapeField("q_lora_rank", int, 0,
               "MLA: rank of the query's down-projection; 0: none, queries projected at full rank "
               "(Megatron-core None, DeepSeek-V2-Lite)", "--q-lora-rank", 0, 1_000_000),
    ShapeField("kv_lora_rank", int, 512, "MLA: rank of the joint key/value down-projection (Megatron-core's "
               "default 512)", "--kv-lora-rank", 1, 1_000_000),
    ShapeField("qk_head_dim", int, 128, "MLA: query/key channels per head without position (Megatron-core's "
               "default 128)", "--qk-head-dim", 1, 100_000),
    ShapeField("qk_pos_emb_head_dim", int, 64, "MLA: rotary query/key channels per head, the key's shared by "
               "all heads (Megatron-core's default 64)", "--qk-pos-emb-head-dim", 0, 100_000),
    ShapeField("v_head_dim", int, 128, "MLA: value channels per head (Megatron-core's default 128)",
               "--v-head-dim", 1, 100_000),
)
BY_NAME: dict[str, ShapeField] = {f.name: f for f in SHAPE_FIELDS}
SHAPE_FIELD_NAMES = tuple(f.name for f in SHAPE_FIELDS)
MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")
# The shape fields the kernels' model table was planned to gain (docs/moe.md); all are in
# KERNEL_COLUMNS (below: kv_channels and the MLA columns with the MoE columns).
KERNEL_FIELDS = ("num_experts", "moe_router_topk", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size",
                 "kv_channels", "multi_latent_attention", *MLA_FIELDS)

# The MoE columns of the kernels' model table (``records.MODEL_FIELDS``, after the architecture
# flags) and of the kernels' record ``arch.Arch``, with the value of a dense model: the routed
# experts, top-k, one expert's width (0: ffn_hidden_size), the shared experts' total width, and
# the layer placement as two integers (:func:`layer_placement`): every ``moe_layer_step``-th layer
# from layer ``moe_first_dense_layers`` on is an MoE layer.
KERNEL_COLUMNS = (("num_experts", 0), ("moe_router_topk", 2), ("moe_ffn_hidden_size", 0),
                  ("moe_shared_expert_intermediate_size", 0), ("moe_layer_step", 1), ("moe_first_dense_layers", 0),
                  ("kv_channels", 0),
                  # multi-head latent attention (0 / 1, then its widths; all 0 without MLA)
                  ("multi_latent_attention", 0), ("q_lora_rank", 0), ("kv_lora_rank", 0), ("qk_head_dim", 0),
                  ("qk_pos_emb_head_dim", 0), ("v_head_dim", 0))
# the MLA columns of KERNEL_COLUMNS (the switch, then MLA_FIELDS)
KERNEL_MLA_NAMES = ("multi_latent_attention", *MLA_FIELDS)
KERNEL_NAMES = tuple(n for n, _ in KERNEL_COLUMNS)
KERNEL_DEFAULTS = tuple(float(d) for _, d in KERNEL_COLUMNS)
KERNEL_DOCS = {
    "num_experts": "routed experts per MoE layer (0: a dense model; Megatron-LM --num-experts)",
    "moe_router_topk": "experts each token is routed to (Megatron-LM --moe-router-topk)",
    "moe_ffn_hidden_size": "one routed expert's MLP width (0: ffn_hidden_size; Megatron-LM --moe-ffn-hidden-size)",
    "moe_shared_expert_intermediate_size": "total width of the shared experts (0: none; Megatron-LM "
                                           "--moe-shared-expert-intermediate-size)",
    "moe_layer_step": "MoE layer placement: every moe_layer_step-th layer is an MoE layer (Megatron-LM "
                      "--moe-layer-freq k; 1: every layer)",
    "moe_first_dense_layers": "MoE layer placement: the first this many layers are dense (DeepSeek-V3's "
                              "--moe-layer-freq \"([0]*3+[1]*58)\": 3)",
    "kv_channels": "channels per attention head, d (0: hidden_size / num_attention_heads; queries and the "
                   "projection a x d wide, keys and values g x d each; Megatron-LM --kv-channels)",
    "multi_latent_attention": "1: multi-head latent attention (DeepSeek-V2/V3; Megatron-LM --multi-latent-attention), "
                              "priced with the five MLA columns after it; 0: standard attention (they are 0)",
    "q_lora_rank": "MLA: rank of the query down-projection (0: none, queries projected from h at full rank)",
    "kv_lora_rank": "MLA: rank of the joint key/value down-projection (0 without MLA)",
    "qk_head_dim": "MLA: query/key channels per head without position (0 without MLA)",
    "qk_pos_emb_head_dim": "MLA: rotary query/key channels per head, the key's shared by all heads (0 without MLA)",
    "v_head_dim": "MLA: value channels per head (0 without MLA)",
}


def layer_placement(num_layers: int, moe_layer_freq) -> tuple[int, int] | None:
    """``(moe_layer_step, moe_first_dense_layers)`` of a layer placement the kernels price: layer
    ``i`` is an MoE layer when ``i >= first_dense`` and ``i % step == 0`` (an int ``k``: ``(k, 0)``;
    a pattern of ``n`` zeros then ones: ``(1, n)``; a pattern equal to an int's), or None for a
    pattern of another form."""
    if isinstance(moe_layer_freq, int):
        return moe_layer_freq, 0
    pat = tuple(moe_layer_freq)
    for k in range(1, max(len(pat), 1) + 1):
        if pat == moe_layer_pattern(num_layers, k):
            return k, 0
    n0 = pat.index(1) if 1 in pat else len(pat)
    if all(x == 0 for x in pat[:n0]) and all(x == 1 for x in pat[n0:]) and n0 < len(pat):
        return 1, n0
    return None


def kernel_kv_channels(shape) -> int:
    """The kernels' ``kv_channels`` column of a model shape: 0 where its heads are ``hidden_size /
    num_attention_heads`` wide (the default, so that such a model's row is a plain dense one's),
    else ``kv_channels``."""
    d = getattr(shape, "kv_channels", 0) or 0
    h, a = shape.hidden_size, shape.num_attention_heads
    if not d or (a and h % a == 0 and d == h // a):
        return 0
    return int(d)


def kernel_values(shape) -> tuple[int, ...]:
    """The :data:`KERNEL_NAMES` values of a (resolved) model shape; a dense model's defaults (and
    its ``kv_channels``, :func:`kernel_kv_channels`), then the MLA columns (1 and the
    :data:`MLA_FIELDS` with multi-head latent attention, else 0s)."""
    kv = kernel_kv_channels(shape)
    mla = ((1, *(int(getattr(shape, n)) for n in MLA_FIELDS)) if getattr(shape, "multi_latent_attention", False)
           else (0,) * len(KERNEL_MLA_NAMES))
    if not is_moe(shape):
        return tuple(int(d) for _, d in KERNEL_COLUMNS[:6]) + (kv,) + mla
    step_, first = layer_placement(shape.num_layers, shape.moe_layer_freq) or (1, 0)
    return (shape.num_experts, shape.moe_router_topk, shape.moe_ffn_hidden_size or shape.ffn_hidden_size,
            shape.moe_shared_expert_intermediate_size, step_, first, kv) + mla


_PATTERN_PART = re.compile(r"\[\s*([01])\s*\]\s*\*\s*(\d+)|\[\s*([01](?:\s*,\s*[01])*)\s*\]")


def parse_layer_pattern(text: str) -> tuple[int, ...] | None:
    """Megatron-LM's ``--moe-layer-freq`` pattern text (``"([0]*3+[1]*58)"``, ``"[1,0,1]"``,
    ``"([1]*3+[0]*1)*3"``) as a tuple of 0/1, or None if it is not one. Megatron-LM evaluates the
    text as Python (``megatron/training/arguments.py``, ``moe_freq_type``); this reads the same
    small grammar without evaluating anything: terms ``[d]*n`` or ``[d, d, ...]`` joined by ``+``,
    optionally in parentheses and repeated ``*n``."""
    s = text.strip()
    m = re.fullmatch(r"\((.*)\)\s*\*\s*(\d+)", s, re.S)
    outer = 1
    if m:
        s, outer = m.group(1), int(m.group(2))
    elif s.startswith("(") and s.endswith(")"):
        s = s[1:-1]
    out: list[int] = []
    for term in s.split("+"):
        t = _PATTERN_PART.fullmatch(term.strip())
        if t is None:
            return None
        if t.group(1) is not None:
            if int(t.group(2)) > 100_000:
                return None
            out += [int(t.group(1))] * int(t.group(2))
        else:
            out += [int(x) for x in t.group(3).split(",")]
    if not out or outer > 100_000 or len(out) * outer > 100_000:
        return None
    return tuple(out * outer)


def moe_layer_pattern(num_layers: int, moe_layer_freq) -> tuple[int, ...]:
    """1 for each MoE layer, 0 for each dense one: every ``k``-th layer from layer 0 for an int
    ``k`` (``1 if i % k == 0``), the pattern itself for a tuple (Megatron-core,
    ``megatron/core/models/gpt/gpt_layer_specs.py``, ``get_gpt_decoder_block_spec``)."""
    if isinstance(moe_layer_freq, int):
        return tuple(1 if i % moe_layer_freq == 0 else 0 for i in range(num_layers))
    return tuple(moe_layer_freq)


def is_moe(shape) -> bool:
    """Whether ``shape`` has routed experts (``num_experts`` >= 1; Megatron-core builds MoE layers
    for any ``num_moe_experts`` that is not None)."""
    return getattr(shape, "num_experts", 0) >= 1


class ParamCounts(NamedTuple):
    """Parameters of a model (:func:`param_counts`).

    Attributes
    ----------
    total : int
        Every parameter, each counted once (a tied output layer once).
    active : int
        Those one token uses in its forward pass: all but the routed experts it is not sent to
        (``moe_router_topk`` of ``num_experts`` per MoE layer), the word embedding included (the
        convention of Mistral's and Qwen's model cards).
    embedding : int
        The word embedding, ``vocab_size x hidden_size`` (publishers that count active
        parameters without the embedding lookup, as OpenAI's gpt-oss card, compare with
        ``active - embedding``; the MFU convention, 6 x parameters per token, also leaves it out).
    routed_experts : int
        All routed experts' weights (what expert parallelism shards, with their biases).
    """

    total: int
    active: int
    embedding: int
    routed_experts: int


def attention_params(shape) -> int:
    """Parameters of one attention block (its linears and MLA's norms; the layer's input norm is
    counted with the layer).

    Standard (grouped-query) attention with ``d = kv_channels`` (default ``h / a``): queries
    ``h x a d``, keys and values ``h x g d`` each, projection ``a d x h``; with biases
    (``add_bias_linear``) ``(a + 2 g) d + h`` more (Megatron-core ``SelfAttention``'s
    ``linear_qkv`` and ``linear_proj``).

    Multi-head latent attention (DeepSeek-V2, arXiv:2405.04434, Sec. 2.1.2-2.1.3, eqs. 9-14;
    Megatron-core ``MLASelfAttention``): queries ``h x q_lora_rank`` down, a norm over
    ``q_lora_rank``, ``q_lora_rank x a (qk_head_dim + qk_pos_emb_head_dim)`` up (without
    ``q_lora_rank``: ``h x a (qk_head_dim + qk_pos_emb_head_dim)``); keys and values ``h x
    (kv_lora_rank + qk_pos_emb_head_dim)`` down (the rotary key shared by the heads), a norm over
    ``kv_lora_rank``, ``kv_lora_rank x a (qk_head_dim + v_head_dim)`` up; projection ``a v_head_dim x h``.
    """
    h, a, g = shape.hidden_size, shape.num_attention_heads, shape.num_query_groups or shape.num_attention_heads
    rms = shape.normalization == "RMSNorm"
    if shape.multi_latent_attention:
        qd, r, dv = shape.qk_head_dim + shape.qk_pos_emb_head_dim, shape.kv_lora_rank, shape.v_head_dim
        norm = 1 if rms else 2
        q = (h * shape.q_lora_rank + norm * shape.q_lora_rank + shape.q_lora_rank * a * qd if shape.q_lora_rank
             else h * a * qd)
        kv = h * (r + shape.qk_pos_emb_head_dim) + norm * r + r * a * (shape.qk_head_dim + dv)
        return q + kv + a * dv * h          # no biases: models_from_tables refuses MLA with add_bias_linear
    d = shape.kv_channels or h // a
    return h * (a + 2 * g) * d + a * d * h + ((a + 2 * g) * d + h if shape.add_bias_linear else 0)


def mlp_params(h: int, f: int, gated: bool, bias: bool) -> int:
    """Parameters of one MLP of width ``f``: two ``h x f`` matrices, three when gated (SwiGLU),
    and with biases ``f`` (``2 f`` gated) + ``h``."""
    return (3 if gated else 2) * h * f + (((2 if gated else 1) * f + h) if bias else 0)


def param_counts(shape) -> ParamCounts:
    """Total and active parameters of a model shape (a ``ModelShape`` with its defaults filled in,
    dense or mixture of experts).

    Per layer: the attention (:func:`attention_params`), two norms over ``h`` (LayerNorm weight and
    bias, RMSNorm weight) and the MLP: a dense layer's of ``ffn_hidden_size``; an MoE layer's
    (:func:`moe_layer_pattern`) the router (``num_experts x h``, Megatron-core ``TopKRouter``'s
    weight), ``num_experts`` routed experts of ``moe_ffn_hidden_size`` and the shared experts of
    ``moe_shared_expert_intermediate_size`` (each :func:`mlp_params`, gated as ``gated_mlp``, with
    biases when ``add_bias_linear``). Then the word embedding ``v h``, the output layer's ``v h``
    unless tied, a learned position table ``s h`` (``position_embedding_type``) and the final norm.
    A dense shape gives :func:`vtrain_fast.model.memory.model_params` exactly.

    Active parameters count ``moe_router_topk`` routed experts per MoE layer instead of all
    (DeepSeek-V3's 37B of 671B: arXiv:2412.19437, abstract; Mixtral's 12.9B of 46.7B:
    arXiv:2401.04088, Sec. 2); with a capacity factor dropped tokens use fewer, not counted.
    """
    h, v = shape.hidden_size, shape.vocab_size
    gated, bias = bool(shape.gated_mlp), bool(shape.add_bias_linear)
    norm = h if shape.normalization == "RMSNorm" else 2 * h
    attn = attention_params(shape)
    dense_layer = attn + 2 * norm + mlp_params(h, shape.ffn_hidden_size, gated, bias)
    total = active = routed = 0
    if is_moe(shape):
        e, k = shape.num_experts, shape.moe_router_topk
        expert = mlp_params(h, shape.moe_ffn_hidden_size or shape.ffn_hidden_size, gated, bias)
        shared = (mlp_params(h, shape.moe_shared_expert_intermediate_size, gated, bias)
                  if shape.moe_shared_expert_intermediate_size else 0)
        fixed = attn + 2 * norm + e * h + shared
        n_moe = sum(moe_layer_pattern(shape.num_layers, shape.moe_layer_freq))
        routed = n_moe * e * expert
        total += n_moe * (fixed + e * expert)
        active += n_moe * (fixed + k * expert)
        n_dense = shape.num_layers - n_moe
    else:
        n_dense = shape.num_layers
    total += n_dense * dense_layer
    active += n_dense * dense_layer
    rest = v * h * (2 if shape.untie_embeddings_and_output_weights else 1) + norm
    if shape.position_embedding_type == "learned_absolute":
        rest += shape.seq_length * h
    return ParamCounts(total + rest, active + rest, v * h, routed)


def unpriced_reason(shape) -> str | None:
    """Why the kernels cannot price ``shape`` yet, or None: an MoE layer placement that is neither
    every k-th layer nor dense first layers then MoE ones (:func:`layer_placement`), or a capacity
    factor given in the model (the training setting ``moe_expert_capacity_factor`` prices it). Routed experts themselves are priced (issue 13,
    docs/moe.md), and so are heads of ``kv_channels`` other than ``hidden_size /
    num_attention_heads`` (the kernels' ``kv_channels`` column) and multi-head latent attention (the
    MLA columns). The kernels read the sizes, flags and MoE columns of ``records.MODEL_FIELDS``
    only; such a shape priced by them would silently be another."""
    if is_moe(shape):
        if layer_placement(shape.num_layers, shape.moe_layer_freq) is None:
            return (f"{shape.name}'s moe_layer_freq pattern is not priced yet (issue 13): the kernels take every "
                    "k-th layer, or dense first layers then MoE layers")
        if shape.moe_expert_capacity_factor is not None:
            return (f"moe_expert_capacity_factor is a training setting, not a model's: {shape.name} sets "
                    f"{shape.moe_expert_capacity_factor}; remove it from the model and set [training] "
                    f"moe_expert_capacity_factor = {shape.moe_expert_capacity_factor} (or an evaluate column), "
                    "so that one model can be priced dropless and with token dropping")
    return None
