"""Model files from Hugging Face ``config.json`` files (``vtrain-fast import-hf``).

:func:`shape_from_config` maps a parsed config of a supported ``model_type``
(:data:`ARCHITECTURES`) to one ``[models.<name>]`` table in Megatron-LM's argument names, as in
``vtrain_fast/data/models.toml``, plus notes on what the cost model prices differently;
:func:`model_file_text` writes that table as TOML, the notes as comments. A spec reads the file
with ``model_files = ["FILE.toml"]`` (:func:`vtrain_fast.plan.spec.spec_models`).

Mixture-of-experts families (:data:`MOE_TYPES`: Mixtral, Qwen3-MoE, DeepSeek-V3 with its
multi-head latent attention, gpt-oss) are imported with their experts in Megatron-LM's names
(:mod:`vtrain_fast.model.moe`; ``head_dim`` as ``kv_channels``); the kernels price them, DeepSeek's
multi-head latent attention included.
A dense family's ``head_dim`` (Gemma, Qwen3) other than ``hidden_size / num_attention_heads`` is
written as ``kv_channels`` too.

What the cost model cannot express is refused (:class:`~vtrain_fast.io.errors.InputError`
naming the file, the key, the value, what is allowed and a fix): expert keys in a dense family's
config (:data:`REFUSED_KEYS`), a ``head_dim`` that is not a whole number, heads that do not divide
``hidden_size`` without a ``head_dim``, sliding-window attention narrower than ``seq_length``, an unknown ``model_type``, missing or
non-integer shape keys. What the model does not represent but that barely changes the cost
(RoPE, RMSNorm, absent biases, tied embeddings, ...) is accepted and noted: one row of
:data:`FEATURES` per such property, named after its Megatron-LM argument.
"""
from __future__ import annotations

import json
import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..io.errors import InputError, check_plain_name, did_you_mean
from ..io.inputs import MAX_TEXT_BYTES, read_input_bytes
from .models import MODEL_INT_RANGES, MODEL_PRESETS

# Megatron-LM argument -> Hugging Face key of the Llama-style configs (llama, mistral, qwen2,
# qwen3, gemma, gemma2).
_LLAMA_KEYS = {"num_layers": "num_hidden_layers", "hidden_size": "hidden_size",
               "num_attention_heads": "num_attention_heads", "num_query_groups": "num_key_value_heads",
               "ffn_hidden_size": "intermediate_size", "vocab_size": "vocab_size",
               "seq_length": "max_position_embeddings"}


@dataclass(frozen=True)
class Architecture:
    """How the configs of one Hugging Face ``model_type`` map to a model shape.

    Attributes
    ----------
    label : str
        The family's name in notes (``"Llama"``).
    keys : dict
        Megatron-LM argument -> Hugging Face key. Without ``num_query_groups`` the model has
        multi-head attention; ``ffn_hidden_size``'s key may be absent or null only when
        ``ffn_default`` says so.
    gated_mlp : bool
        A gated MLP of three ``hidden_size x intermediate_size`` matrices (SwiGLU, GeGLU).
    normalization : str
        ``"LayerNorm"`` or ``"RMSNorm"`` (Megatron-LM ``--normalization``).
    position_embedding_type : str
        ``"rope"`` or ``"learned_absolute"`` (Megatron-LM ``--position-embedding-type``).
    bias_keys : tuple of str
        Hugging Face switches of the linear layers' biases (all must be on for
        ``add_bias_linear``); ``bias_default`` when the config leaves one out (or none exists).
    qkv_bias : bool
        Biases on the query, key and value projections only (Megatron-LM ``--add-qkv-bias``; Qwen2).
    tie_default : bool
        ``tie_word_embeddings`` when config.json leaves it out: the configuration class's
        default (``save_pretrained`` writes it only where it differs).
    activation_keys : tuple of str
        Keys naming the MLP's activation, first present wins; ``activation_default`` otherwise.
    ffn_default : int
        ``ffn_hidden_size`` in units of ``hidden_size`` when its key is absent or null (GPT-2's
        ``n_inner``: 4); 0: required.
    qk_layernorm : bool
        Norms over each head's queries and keys (Megatron-LM ``--qk-layernorm``; Qwen3).
    parallel_residual_default : bool
        ``use_parallel_residual`` when absent (GPT-NeoX: true; the others have none).
    extra_notes : tuple of str
        What else this family does that the model does not time.
    moe : callable, optional
        ``(config, where, shape, notes) -> dict``: the mixture-of-experts (and MLA) fields of a
        family with experts (:data:`vtrain_fast.model.moe.SHAPE_FIELDS`), notes appended; None for
        a dense family, whose configs' expert keys are refused (:data:`REFUSED_KEYS`).
    """

    label: str
    keys: dict
    gated_mlp: bool
    normalization: str
    position_embedding_type: str
    bias_keys: tuple = ()
    bias_default: bool = False
    qkv_bias: bool = False
    tie_default: bool = False
    activation_keys: tuple = ("hidden_act",)
    activation_default: str = "silu"
    ffn_default: int = 0
    qk_layernorm: bool = False
    parallel_residual_default: bool = False
    extra_notes: tuple = field(default=())
    moe: Callable | None = None


def _moe_int(where: str, cfg: dict, key: str, name: str, default=None) -> int:
    """The whole number ``cfg[key]`` in the range of MoE field ``name`` (``default`` when absent or
    null and a default is given)."""
    from ..model.moe import BY_NAME
    f = BY_NAME[name]
    v = cfg.get(key)
    if v is None and default is not None:
        return default
    if isinstance(v, bool) or not isinstance(v, int) or not max(f.lo, 1) <= v <= f.hi:
        raise InputError(where, key, v, f"a whole number from {max(f.lo, 1):,.0f} to {f.hi:,.0f} (Megatron-LM's "
                         f"{name}: {f.doc})", f"write {key} from the model's published config.json as a JSON integer")
    return v


def _layer_pattern(where: str, key: str, pattern: list[int], num_layers: int):
    """``moe_layer_freq`` of a per-layer 0/1 list: 1 when every layer has experts, else Megatron-LM's
    pattern text (``"([0]*3+[1]*58)"``, :func:`vtrain_fast.model.moe.parse_layer_pattern` reads it)."""
    if 1 not in pattern:
        raise InputError(where, key, pattern if len(pattern) < 10 else f"{len(pattern)} layers",
                         "at least one layer with experts", "import the config of a mixture-of-experts model")
    if all(pattern):
        return 1
    runs: list[list[int]] = []
    for x in pattern:
        if runs and runs[-1][0] == x:
            runs[-1][1] += 1
        else:
            runs.append([x, 1])
    return "(" + "+".join(f"[{x}]*{n}" for x, n in runs) + ")"      # Megatron-LM's --moe-layer-freq text


def _routed(cfg, where, shape, notes, experts_key, topk_keys, width_key):
    """The routed experts: count, top-k (first of ``topk_keys`` present) and width."""
    topk_key = next((k for k in topk_keys if cfg.get(k) is not None), topk_keys[0])
    out = {"num_experts": _moe_int(where, cfg, experts_key, "num_experts"),
           "moe_router_topk": _moe_int(where, cfg, topk_key, "moe_router_topk")}
    if out["moe_router_topk"] > out["num_experts"]:
        raise InputError(where, topk_key, out["moe_router_topk"], f"at most {experts_key} ({out['num_experts']})",
                         "check the value in the published config.json")
    out["moe_ffn_hidden_size"] = _moe_int(where, cfg, width_key, "moe_ffn_hidden_size")
    notes.append("assumed: dropless routing (Megatron-core's default); a run that drops tokens sets the training "
                 "setting moe_expert_capacity_factor ([training] in a spec, or an evaluate column)")
    return out


def _mixtral_moe(cfg, where, shape, notes):
    """Mixtral (transformers' configuration_mixtral.py): ``num_local_experts`` experts of
    ``intermediate_size`` in every layer, top ``num_experts_per_tok``."""
    return _routed(cfg, where, shape, notes, "num_local_experts", ("num_experts_per_tok",), "intermediate_size")


def _qwen3_moe(cfg, where, shape, notes):
    """Qwen3-MoE (configuration_qwen3_moe.py): ``num_experts`` of ``moe_intermediate_size``, top
    ``num_experts_per_tok``; layer ``i`` has experts unless in ``mlp_only_layers`` and when
    ``(i + 1) % decoder_sparse_step == 0`` (modeling_qwen3_moe.py), else a dense MLP of
    ``intermediate_size``."""
    out = _routed(cfg, where, shape, notes, "num_experts", ("num_experts_per_tok",), "moe_intermediate_size")
    step = _moe_int(where, cfg, "decoder_sparse_step", "moe_layer_freq", 1)
    only = cfg.get("mlp_only_layers") or []
    if not isinstance(only, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in only):
        raise InputError(where, "mlp_only_layers", only, "a list of layer indices (the dense layers)",
                         "as in the published config.json, e.g. []")
    n = shape["num_layers"]
    out["moe_layer_freq"] = _layer_pattern(where, "decoder_sparse_step", [
        0 if i in only or (i + 1) % step else 1 for i in range(n)], n)
    if cfg.get("shared_expert_intermediate_size"):
        out["moe_shared_expert_intermediate_size"] = _moe_int(where, cfg, "shared_expert_intermediate_size",
                                                              "moe_shared_expert_intermediate_size")
    return out


def _deepseek_moe(cfg, where, shape, notes):
    """DeepSeek-V3 (configuration_deepseek_v3.py): ``n_routed_experts`` of ``moe_intermediate_size``,
    top ``num_experts_per_tok``, ``n_shared_experts`` shared ones of the same width; layer ``i``
    has experts when ``i >= first_k_dense_replace`` and ``i % moe_layer_freq == 0``
    (modeling_deepseek.py); multi-head latent attention of ``q_lora_rank`` (null: none),
    ``kv_lora_rank``, ``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim``."""
    out = _routed(cfg, where, shape, notes, "n_routed_experts", ("num_experts_per_tok",), "moe_intermediate_size")
    shared = _moe_int(where, cfg, "n_shared_experts", "moe_shared_expert_intermediate_size", 0) if cfg.get(
        "n_shared_experts") else 0
    if shared:
        out["moe_shared_expert_intermediate_size"] = shared * out["moe_ffn_hidden_size"]
    first = cfg.get("first_k_dense_replace", 0)
    if isinstance(first, bool) or not isinstance(first, int) or not 0 <= first < shape["num_layers"]:
        raise InputError(where, "first_k_dense_replace", first, f"a whole number from 0 to num_hidden_layers - 1 "
                         f"({shape['num_layers'] - 1})", "the dense layers before the first MoE layer")
    freq = _moe_int(where, cfg, "moe_layer_freq", "moe_layer_freq", 1)
    n = shape["num_layers"]
    out["moe_layer_freq"] = _layer_pattern(where, "first_k_dense_replace", [
        1 if i >= first and i % freq == 0 else 0 for i in range(n)], n)
    out["multi_latent_attention"] = True
    q = cfg.get("q_lora_rank")
    out["q_lora_rank"] = 0 if q is None else _moe_int(where, cfg, "q_lora_rank", "q_lora_rank")
    for hf_key, name in (("kv_lora_rank", "kv_lora_rank"), ("qk_nope_head_dim", "qk_head_dim"),
                         ("qk_rope_head_dim", "qk_pos_emb_head_dim"), ("v_head_dim", "v_head_dim")):
        out[name] = _moe_int(where, cfg, hf_key, name)
    notes.append("not modelled: DeepSeek's sigmoid router scores with group-limited routing (n_group, topk_group) "
                 "and the per-expert balancing bias (e_score_correction_bias) are priced as a top-k softmax router")
    if cfg.get("num_nextn_predict_layers"):
        notes.append(f"not modelled: the {cfg['num_nextn_predict_layers']} multi-token-prediction module(s) "
                     "(num_nextn_predict_layers) are left out: the main model only")
    return out


def _gpt_oss_moe(cfg, where, shape, notes):
    """gpt-oss (configuration_gpt_oss.py): ``num_local_experts`` of ``intermediate_size`` with
    biases in every layer, top ``num_experts_per_tok`` (``experts_per_token`` in OpenAI's own
    config)."""
    out = _routed(cfg, where, shape, notes, "num_local_experts", ("num_experts_per_tok", "experts_per_token"),
                  "intermediate_size")
    notes.append("not modelled: gpt-oss's router bias and attention sinks (num_local_experts + num_attention_heads "
                 "numbers a layer) are not counted; its SwiGLU clamp (swiglu_limit) is timed as SwiGLU")
    return out


_GEMMA = dict(keys=_LLAMA_KEYS, gated_mlp=True, normalization="RMSNorm", position_embedding_type="rope",
              bias_keys=("attention_bias",), tie_default=True,
              activation_keys=("hidden_activation", "hidden_act"), activation_default="gelu_pytorch_tanh")

# model_type -> how its config maps (the families of transformers' configuration_<type>.py).
ARCHITECTURES: dict[str, Architecture] = {
    "llama": Architecture("Llama", _LLAMA_KEYS, True, "RMSNorm", "rope", bias_keys=("attention_bias", "mlp_bias")),
    "mistral": Architecture("Mistral", _LLAMA_KEYS, True, "RMSNorm", "rope"),
    "qwen2": Architecture("Qwen2", _LLAMA_KEYS, True, "RMSNorm", "rope", qkv_bias=True),
    "qwen3": Architecture("Qwen3", _LLAMA_KEYS, True, "RMSNorm", "rope", bias_keys=("attention_bias",),
                          qk_layernorm=True),
    "gemma": Architecture("Gemma", **_GEMMA),
    "gemma2": Architecture("Gemma 2", **_GEMMA, extra_notes=(
        "Gemma 2's soft-capped attention and output logits (attn_logit_softcapping, final_logit_softcapping) and "
        "its norms after attention and MLP (four per layer) are not timed",)),
    "gpt2": Architecture("GPT-2", {"num_layers": "n_layer", "hidden_size": "n_embd", "num_attention_heads": "n_head",
                                   "ffn_hidden_size": "n_inner", "vocab_size": "vocab_size",
                                   "seq_length": "n_positions"},
                         False, "LayerNorm", "learned_absolute", bias_default=True, tie_default=True,
                         activation_keys=("activation_function",), activation_default="gelu_new", ffn_default=4),
    "mixtral": Architecture("Mixtral", _LLAMA_KEYS, True, "RMSNorm", "rope", moe=_mixtral_moe),
    "qwen3_moe": Architecture("Qwen3-MoE", _LLAMA_KEYS, True, "RMSNorm", "rope", bias_keys=("attention_bias",),
                              qk_layernorm=True, moe=_qwen3_moe),
    "deepseek_v3": Architecture("DeepSeek-V3", _LLAMA_KEYS, True, "RMSNorm", "rope", bias_keys=("attention_bias",),
                                moe=_deepseek_moe),
    "gpt_oss": Architecture("gpt-oss", _LLAMA_KEYS, True, "RMSNorm", "rope", bias_keys=("attention_bias",),
                            moe=_gpt_oss_moe),
    "gpt_neox": Architecture("GPT-NeoX", {k: v for k, v in _LLAMA_KEYS.items() if k != "num_query_groups"},
                             False, "LayerNorm", "rope", bias_keys=("attention_bias",), bias_default=True,
                             activation_default="gelu", parallel_residual_default=True),
}


def _experts(v) -> bool:
    """An expert count that makes an MLP a mixture of experts."""
    return v not in (None, 0, 1, False)


_MOE = ("a dense model of this model_type (its family has no experts)",
        "a mixture-of-experts config names its own model_type: mixtral, qwen3_moe, deepseek_v3 or gpt_oss are "
        "imported with their experts")
MOE_TYPES = ("mixtral", "qwen3_moe", "deepseek_v3", "gpt_oss")
# Hugging Face keys the cost model cannot express: key -> (is it in use?, what is allowed, fix). Keys
# starting with "moe_" are refused too (MOE_PREFIX) when set.
REFUSED_KEYS: dict[str, tuple[Callable, str, str]] = {
    "num_local_experts": (_experts, "absent, null or 1 for " + _MOE[0], _MOE[1]),      # Mixtral
    "num_experts": (_experts, "absent, null or 1 for " + _MOE[0], _MOE[1]),            # Qwen2-MoE, Qwen3-MoE
    "n_routed_experts": (lambda v: v not in (None, 0, False), "absent, null or 0 for " + _MOE[0], _MOE[1]),  # DeepSeek
    "num_experts_per_tok": (lambda v: v not in (None, 0, False), "absent, null or 0 for " + _MOE[0], _MOE[1]),
    "is_encoder_decoder": (lambda v: v is True, "false: a decoder-only model (the cost model has no encoder)",
                           "import the config of a decoder-only language model"),
    "add_cross_attention": (lambda v: v is True, "false: no cross-attention (the cost model has none)",
                            "import the config of a decoder-only language model"),
}
MOE_PREFIX = "moe_"
# The expert keys a family with experts (Architecture.moe) reads instead of refusing.
_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "num_experts_per_tok")

SUPPORTED = tuple(ARCHITECTURES)


def _biases(cfg: dict, arch: Architecture) -> bool:
    return all(bool(cfg.get(k, arch.bias_default)) for k in arch.bias_keys) if arch.bias_keys else arch.bias_default


def _bias_note(value, cfg, arch, shape) -> str:
    given = ", ".join(f"{k} = {_json(cfg.get(k, arch.bias_default))}" for k in arch.bias_keys)
    which = "other than the query, key and value projections " if arch.qkv_bias else ""
    return (f"{arch.label}'s linear layers {which}have no biases{' (' + given + ')' if given else ''}; the model "
            "counts and adds biases on every linear layer (a few per mille of the parameters)")


def _position_value(cfg, arch) -> str:
    return arch.position_embedding_type


def _position_note(value, cfg, arch, shape) -> str:
    extra = [f"{k} {_json(cfg[k])}" for k in ("rope_theta", "rotary_pct", "rotary_emb_base") if cfg.get(k) is not None]
    if isinstance(cfg.get("rope_scaling"), dict):
        kind = cfg["rope_scaling"].get("rope_type", cfg["rope_scaling"].get("type"))
        extra.append(f"rope_scaling {kind}")
    n = shape["seq_length"] * shape["hidden_size"]
    return (f"rotary position embedding (RoPE{', ' + ', '.join(extra) if extra else ''}); the model counts a "
            f"learned position embedding, seq_length x hidden_size = {_count(n)} parameters, and times its add "
            "instead of the rotations")


def _norm_note(value, cfg, arch, shape) -> str:
    return (f"{value} (rms_norm_eps {_json(cfg['rms_norm_eps'])}); " if "rms_norm_eps" in cfg else f"{value}; ") + (
        "timed as LayerNorm (the same bytes), counted with a bias (hidden_size more parameters per norm)")


def _tie_value(cfg, arch) -> bool:
    return not bool(cfg.get("tie_word_embeddings", arch.tie_default))


def _tie_note(value, cfg, arch, shape) -> str:
    given = ("tie_word_embeddings = true" if "tie_word_embeddings" in cfg
             else f"tie_word_embeddings absent: {arch.label}'s default, true")
    n = shape["vocab_size"] * shape["hidden_size"]
    return (f"{given} (the output layer shares the input embedding); the model counts a separate output layer, "
            f"vocab_size x hidden_size = {_count(n)} more parameters with their gradients and optimizer states "
            "(the output GEMM is the same)")


def _activation_name(cfg, arch) -> str:
    return next((str(cfg[k]) for k in arch.activation_keys if cfg.get(k) is not None), arch.activation_default)


def _activation_value(cfg, arch) -> str:
    """The family of the MLP's activation: ``"silu"``, ``"gelu"`` or its own name."""
    n = _activation_name(cfg, arch).lower()
    return "silu" if n in ("silu", "swish") else "gelu" if n.startswith("gelu") else n


def _activation_note(value, cfg, arch, shape) -> str:
    model = "SwiGLU's SiLU" if shape["gated_mlp"] else "GeLU"
    return (f"MLP activation {_activation_name(cfg, arch)}{' (gated)' if shape['gated_mlp'] else ''}; timed as "
            f"{model} (the same bytes)")


@dataclass(frozen=True)
class Feature:
    """A property of the architecture that bears on cost, named after its Megatron-LM argument.

    Attributes
    ----------
    name : str
        The Megatron-LM argument (a model-file key once the cost model has the field).
    read : callable
        ``(config, architecture) -> value`` in Megatron-LM's terms.
    modelled : callable
        ``shape -> value`` the cost model prices today (the shape table, ``gated_mlp`` in it).
    explain : callable
        ``(value, config, architecture, shape) -> str``: what differs, for a note
        "not modelled: ..." when ``read`` differs from ``modelled``.
    written : bool
        True once :class:`~vtrain_fast.plan.models.ModelShape` has the field: the value is then
        written to the model table instead of noted.
    """

    name: str
    read: Callable
    modelled: Callable
    explain: Callable
    written: bool = False


# The properties the cost model does not represent yet, one row each. When the model gains a
# field (normalization, position_embedding_type, add_bias_linear, add_qkv_bias,
# untie_embeddings_and_output_weights, ...), set written=True in its row: the importer then
# writes the value into the model table instead of a note.
FEATURES: tuple[Feature, ...] = (
    Feature("position_embedding_type", _position_value, lambda s: "learned_absolute", _position_note, written=True),
    Feature("normalization", lambda c, a: a.normalization, lambda s: "LayerNorm", _norm_note, written=True),
    Feature("add_bias_linear", _biases, lambda s: True, _bias_note, written=True),
    Feature("add_qkv_bias", lambda c, a: a.qkv_bias, lambda s: False,
            lambda v, c, a, s: f"{a.label} has biases on the query, key and value projections only; the model "
                               "has biases on all four linears or none (add_bias_linear = false here: those "
                               "q, k, v biases are not counted)"),
    Feature("untie_embeddings_and_output_weights", _tie_value, lambda s: True, _tie_note, written=True),
    Feature("activation", _activation_value,
            lambda s: "silu" if s["gated_mlp"] else "gelu", _activation_note),
    Feature("qk_layernorm", lambda c, a: a.qk_layernorm, lambda s: False,
            lambda v, c, a, s: f"{a.label}'s RMSNorm over each head's queries and keys (q_norm, k_norm) is not timed"),
    Feature("use_parallel_residual", lambda c, a: bool(c.get("use_parallel_residual", a.parallel_residual_default)),
            lambda s: False,
            lambda v, c, a, s: "use_parallel_residual = true (attention and MLP read the same input); timed as the "
                               "sequential layer (the same operators)"),
)


def _json(v) -> str:
    return json.dumps(v)


def _count(n: float) -> str:
    """``n`` parameters in words: ``33.6 M``, ``1.05 B``."""
    return f"{n / 1e9:.3g} B" if n >= 1e9 else f"{n / 1e6:.3g} M"


def _int(where: str, cfg: dict, key: str, megatron: str):
    """The whole number ``cfg[key]`` within Megatron-LM ``megatron``'s range."""
    lo, hi = MODEL_INT_RANGES[megatron]
    v = cfg[key]
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise InputError(where, key, v, f"a whole number from {lo:,} to {hi:,} (Megatron-LM's {megatron})",
                         "write it as a JSON integer without quotes or decimals, as transformers does")
    return v


def check_seq_length(seq_length) -> None:
    """Refuse a ``--seq-length`` outside :data:`MODEL_INT_RANGES`.

    Raises
    ------
    InputError
        Naming ``--seq-length`` on the command line.
    """
    lo, hi = MODEL_INT_RANGES["seq_length"]
    if seq_length is not None and not lo <= seq_length <= hi:
        raise InputError("command line", "--seq-length", seq_length, f"a whole number from {lo:,} to {hi:,}",
                         "the context length of the training run, e.g. --seq-length 8192")


def shape_from_config(cfg, where: str, seq_length: int | None = None) -> tuple[dict, list[str]]:
    """The model shape of the parsed Hugging Face config ``cfg``.

    Parameters
    ----------
    cfg : dict
        ``config.json`` as parsed by :func:`json.loads`.
    where : str
        The file, for messages and the table's ``source``.
    seq_length : int, optional
        The training context (``--seq-length``); default ``max_position_embeddings`` (GPT-2:
        ``n_positions``), with a note.

    Returns
    -------
    tuple
        ``(table, notes)``: the ``[models.<name>]`` keys (``num_layers``, ``hidden_size``,
        ``num_attention_heads``, ``num_query_groups``, ``ffn_hidden_size``, ``gated_mlp``,
        ``vocab_size``, ``seq_length``, ``source``) and the notes, each starting
        ``"not modelled: "`` or ``"assumed: "``.

    Raises
    ------
    InputError
        Not a JSON object; a key of :data:`REFUSED_KEYS` or ``moe_*`` in use; an unknown or
        missing ``model_type``; a missing, non-integer or out-of-range shape key; heads that do
        not divide ``hidden_size`` (without a ``head_dim``) or are not a multiple of the key/value
        heads; a ``head_dim`` (or ``kv_channels``) that is not a whole number; a sliding window
        narrower than ``seq_length``.
    """
    if not isinstance(cfg, dict):
        raise InputError(where, "config", type(cfg).__name__, "a JSON object (a Hugging Face config.json)",
                         "give the model's config.json")
    mt = cfg.get("model_type")
    moe_family = isinstance(mt, str) and mt in ARCHITECTURES and ARCHITECTURES[mt].moe is not None
    for key, (in_use, allowed, fix) in REFUSED_KEYS.items():
        if key in cfg and in_use(cfg[key]) and not (moe_family and key in _EXPERT_KEYS):
            raise InputError(where, key, cfg[key], allowed, fix)
    for key, v in cfg.items():
        if key.startswith(MOE_PREFIX) and v not in (None, 0, False, "", [], {}) and not moe_family:
            raise InputError(where, key, v, "absent or null for " + _MOE[0], _MOE[1])
    if not isinstance(mt, str) or mt not in ARCHITECTURES:
        allowed = "one of " + ", ".join(SUPPORTED)
        if mt is None:
            raise InputError(where, "model_type", None, allowed, "a Hugging Face config.json names its model_type")
        raise InputError(where, "model_type", mt, allowed,
                         did_you_mean(str(mt), SUPPORTED, "the cost model prices dense decoder-only transformers "
                                      "of these families; a model whose layer is one of theirs can be imported "
                                      "from a copy of its config that names that model_type"))
    arch = ARCHITECTURES[mt]
    notes: list[str] = []
    shape: dict = {}
    for megatron, key in arch.keys.items():
        if megatron == "seq_length" and seq_length is not None:
            continue
        if cfg.get(key) is None:
            if megatron == "num_query_groups":
                continue
            if megatron == "ffn_hidden_size" and arch.ffn_default:
                continue
            lo, hi = MODEL_INT_RANGES[megatron]
            raise InputError(where, key, None, f"a whole number from {lo:,} to {hi:,} (Megatron-LM's {megatron}; "
                             f"required for model_type {mt})", f"add {key} from the model's published config.json")
        shape[megatron] = _int(where, cfg, key, megatron)
    h, a = shape["hidden_size"], shape["num_attention_heads"]
    if "num_query_groups" not in shape:
        shape["num_query_groups"] = a
        if "num_query_groups" in arch.keys:
            notes.append(f"assumed: num_query_groups = num_attention_heads = {a} ({arch.keys['num_query_groups']} "
                         "absent or null: multi-head attention, transformers' default)")
    if "ffn_hidden_size" not in shape:
        shape["ffn_hidden_size"] = arch.ffn_default * h
        notes.append(f"assumed: ffn_hidden_size = {arch.ffn_default} x {arch.keys['hidden_size']} = "
                     f"{shape['ffn_hidden_size']} ({arch.keys['ffn_hidden_size']} absent or null: transformers' default)")
    widths = {k: cfg[k] for k in ("head_dim", "kv_channels") if cfg.get(k) is not None and mt != "deepseek_v3"}
    if h % a and not widths:
        raise InputError(where, arch.keys["num_attention_heads"], a, f"a divisor of {arch.keys['hidden_size']} ({h})",
                         "the cost model's heads have hidden_size / num_attention_heads channels each")
    g = shape["num_query_groups"]
    if a % g:
        raise InputError(where, arch.keys["num_query_groups"], g, f"a divisor of {arch.keys['num_attention_heads']} "
                         f"({a})", "grouped-query attention shares each key/value head among a whole number of "
                         "query heads; check the value")
    # heads of head_dim (transformers) = kv_channels (Megatron-LM) channels; DeepSeek-V3's MLA has
    # its own head widths (qk_nope_head_dim, qk_rope_head_dim, v_head_dim)
    for key, v in widths.items():
        lo, hi = 1, 100_000
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise InputError(where, key, v, f"a whole number from {lo} to {hi:,} (Megatron-LM's kv_channels)",
                             "write it as a JSON integer, as transformers does")
        if h % a or v != h // a:
            if "kv_channels" in shape and shape["kv_channels"] != v:
                raise InputError(where, key, v, f"head_dim = {shape['kv_channels']}, as the config's other head width",
                                 "give one head width (head_dim)")
            shape["kv_channels"] = v
    if seq_length is not None:
        check_seq_length(seq_length)
        shape["seq_length"] = seq_length
    else:
        key = arch.keys["seq_length"]
        scaled = cfg.get("rope_scaling") if isinstance(cfg.get("rope_scaling"), dict) else {}
        original = scaled.get("original_max_position_embeddings")
        notes.append(f"assumed: seq_length = {shape['seq_length']} from {key}, the longest context the model accepts; "
                     "pre-training may have used a shorter one ("
                     + (f"rope_scaling's original_max_position_embeddings is {original}" if original else
                        "e.g. Llama 3.1 was pre-trained at 8192 and has a max_position_embeddings of 131072")
                     + "): pass --seq-length with the training run's context")
    window = cfg.get("sliding_window")
    kinds = cfg.get("layer_types")
    if (arch.moe is not None and window is not None and isinstance(kinds, list) and "full_attention" in kinds
            and all(k in ("full_attention", "sliding_attention") for k in kinds)):
        notes.append(f"not modelled: {kinds.count('sliding_attention')} of {len(kinds)} layers attend within a "
                     f"sliding window of {window} tokens (layer_types); they are counted and will be timed as "
                     "full attention (an over-estimate of their attention time)")
        window = None
    if window is not None and cfg.get("use_sliding_window", True) is not False and not (
            isinstance(window, int) and not isinstance(window, bool) and window >= shape["seq_length"]):
        raise InputError(where, "sliding_window", window, f"null, or at least seq_length ({shape['seq_length']}): "
                         "the cost model's attention spans the whole sequence",
                         f"import with --seq-length {window} or less to price training at a context the window "
                         "covers" if isinstance(window, int) and not isinstance(window, bool) and window > 0
                         else "leave this model out")
    shape["gated_mlp"] = arch.gated_mlp
    for feat in FEATURES:
        value = feat.read(cfg, arch)
        if feat.written:
            shape[feat.name] = value
        elif value != feat.modelled(shape):
            notes.append("not modelled: " + feat.explain(value, cfg, arch, shape))
    notes += ["not modelled: " + n for n in arch.extra_notes]
    if arch.moe is not None:
        shape.update(arch.moe(cfg, where, shape, notes))
    order = ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size", "gated_mlp",
             "vocab_size", "seq_length")
    table = {k: shape[k] for k in order} | {k: v for k, v in shape.items() if k not in order}
    named = cfg.get("architectures")
    named = f", {named[0]}" if isinstance(named, list) and named and isinstance(named[0], str) else ""
    table["source"] = f"Hugging Face config.json {_plain(Path(where).name)} (model_type {mt}{_plain(named)})"
    return table, notes


def read_config(path) -> dict:
    """The parsed ``config.json`` at ``path``, checked as an input file (a regular file of at most
    :data:`~vtrain_fast.io.inputs.MAX_TEXT_BYTES`).

    Raises
    ------
    InputError
        Missing, not a regular file, too large, not UTF-8 or not valid JSON.
    """
    data = read_input_bytes(path, "JSON file", MAX_TEXT_BYTES)
    try:
        return json.loads(data.decode("utf-8-sig"))
    except UnicodeDecodeError as e:
        raise InputError(str(path), "encoding", f"byte {e.start}", "a UTF-8 text file",
                         "give the model's config.json as downloaded") from None
    except json.JSONDecodeError as e:
        raise InputError(str(path), "JSON", f"{e.msg} at line {e.lineno} column {e.colno}",
                         "a valid JSON file (a Hugging Face config.json)", "give the model's config.json") from None
    except RecursionError:
        raise InputError(str(path), "JSON", "nested too deeply", "a Hugging Face config.json",
                         "give the model's config.json") from None


def model_name(cfg: dict, path, name: str | None = None) -> str:
    """The model's name in the file: ``name`` (``--name``), else the last part of the config's
    ``_name_or_path``, else the file's stem (its folder's name for ``config.json``), lower case,
    characters other than letters, digits, ``.``, ``_`` and ``-`` as ``-``.

    Raises
    ------
    InputError
        A name that is not a plain name (:func:`~vtrain_fast.io.errors.check_plain_name`) or is a
        model preset's (a spec could not tell them apart).
    """
    key = "--name"
    if name is None:
        p = Path(path)
        given = cfg.get("_name_or_path") if isinstance(cfg, dict) else None
        raw = (given.rstrip("/").rsplit("/", 1)[-1] if isinstance(given, str) and given.strip("/")
               else p.resolve().parent.name if p.stem == "config" else p.stem)
        name = re.sub(r"[^a-z0-9._-]+", "-", raw.lower()).strip("-.") or "hf-model"
        key = "model name (from _name_or_path or the file name)"
    check_plain_name("command line", key, name, "--name my-llama-8b")
    if name in MODEL_PRESETS:
        raise InputError("command line", key, name, "a name that is not a model preset",
                         f"pass --name my-{name}: a spec names presets and its own models alike")
    return name


def _plain(text: str) -> str:
    """``text`` with control characters as ``?`` and undecodable file-name bytes escaped, fit for a
    TOML comment or string."""
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return "".join("?" if ord(c) < 32 or ord(c) == 127 else c for c in text)


def _toml(v) -> str:
    """A TOML value: a boolean, an integer or a basic string."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    return json.dumps(_plain(str(v)), ensure_ascii=False)


def model_file_text(name: str, table: dict, notes, config_path) -> str:
    """A model file: one ``[models.<name>]`` table (keys as in ``vtrain_fast/data/models.toml``),
    preceded by comments naming the config and listing the notes."""
    key = name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else _toml(name)
    lines = [f"# Model file written by `vtrain-fast import-hf` from {_plain(str(config_path))}.",
             '# A spec uses it with model_files = ["<this file>"] and model.presets = ["' + _plain(name) + '"].']
    if notes:
        lines.append("# What the cost model prices differently from the Hugging Face model:")
        for n in notes:
            lines += textwrap.wrap(_plain(n), 100, initial_indent="# - ", subsequent_indent="#   ",
                                   break_long_words=False, break_on_hyphens=False)
    lines += ["", f"[models.{key}]"] + [f"{k} = {_toml(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"
