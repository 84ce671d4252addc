"""Model presets: decoder-only transformers. A shape is its sizes, its architecture flags
(the registry :mod:`vtrain_fast.model.arch`: gated MLP, normalization, position embedding, linear
biases, tied or untied output layer; Megatron-LM's GPT layer by default, the Llama presets set
theirs) and its mixture-of-experts and attention-shape fields (the registry
:mod:`vtrain_fast.model.moe`: experts, top-k, expert widths, MoE layer placement, capacity
factor, kv_channels, multi-head latent attention; dense by default). The kernels price dense
shapes, MoE shapes, heads of any ``kv_channels`` and multi-head latent attention: a sweep or
evaluate run naming one that needs what they do not price (a capacity factor, another layer
pattern) is refused (:func:`check_priced`). The shapes and their sources are data:
``vtrain_fast/data/models.toml``; a spec adds its own in ``[models.<name>]`` tables, in the spec
or in model files it names (``model_files``; ``vtrain-fast import-hf`` writes them from Hugging Face
configs, :mod:`vtrain_fast.plan.hf`).

Names follow Megatron-LM's arguments. ``ffn_hidden_size`` defaults to ``4 * hidden_size``,
``num_query_groups`` to ``num_attention_heads`` (multi-head attention) and ``vocab_size`` to
GPT-2's 50,257.
"""
from __future__ import annotations

from pathlib import Path

from ..io.errors import InputError, did_you_mean
from ..io.inputs import read_toml
from ..model.arch import ARCH_FLAGS, BY_NAME as ARCH_BY_NAME
from ..model.moe import KERNEL_NAMES, kernel_values
from ..model.moe import BY_NAME as SHAPE_BY_NAME, MLA_FIELDS, SHAPE_FIELDS, is_moe, parse_layer_pattern, unpriced_reason
from ..model.records import MODEL_SIZES
from ..model.settings import with_registry_fields

DEFAULT_VOCAB_SIZE = 50257


# one field per architecture flag, then per MoE / attention-shape field, source last
@with_registry_fields(ARCH_FLAGS + SHAPE_FIELDS, last=("source",))
class ModelShape:
    """One transformer shape.

    Attributes
    ----------
    name : str
    num_layers, hidden_size, num_attention_heads, num_query_groups, ffn_hidden_size,
    vocab_size, seq_length : int
        Megatron-LM's arguments of the same names.
    gated_mlp, normalization, position_embedding_type, add_bias_linear, untie_embeddings_and_output_weights
        The architecture flags (:data:`vtrain_fast.model.arch.ARCH_FLAGS`: their kinds, defaults
        and meanings), fields added from the registry.
    num_experts, moe_router_topk, moe_ffn_hidden_size, moe_shared_expert_intermediate_size,
    moe_layer_freq, moe_expert_capacity_factor, kv_channels, multi_latent_attention, q_lora_rank,
    kv_lora_rank, qk_head_dim, qk_pos_emb_head_dim, v_head_dim
        The mixture-of-experts and attention-shape fields
        (:data:`vtrain_fast.model.moe.SHAPE_FIELDS`), added from that registry; :meth:`as_row`
        gives the kernels their MoE columns (:data:`vtrain_fast.model.moe.KERNEL_NAMES`).
    source : str
        Paper and table the shape comes from.
    """

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    seq_length: int
    num_query_groups: int = 0   # 0 -> num_attention_heads
    ffn_hidden_size: int = 0    # 0 -> 4 * hidden_size
    vocab_size: int = DEFAULT_VOCAB_SIZE
    source: str = ""

    def resolved(self) -> "ModelShape":
        """Return a copy with the defaults (0 = default) filled in: ``kv_channels`` =
        ``hidden_size / num_attention_heads`` where that divides (not for MLA), an MoE's
        ``moe_ffn_hidden_size`` = ``ffn_hidden_size``, and with MLA ``num_query_groups`` =
        ``num_attention_heads`` (MLA's keys and values are per head)."""
        from dataclasses import replace
        ffn = self.ffn_hidden_size or 4 * self.hidden_size
        h, a = self.hidden_size, self.num_attention_heads
        return replace(
            self,
            # MLA: every head has its own keys and values (Megatron-core MLASelfAttention: no groups)
            num_query_groups=(self.num_attention_heads if self.multi_latent_attention
                              else self.num_query_groups or self.num_attention_heads),
            ffn_hidden_size=ffn,
            kv_channels=self.kv_channels or (h // a if a and h % a == 0 and not self.multi_latent_attention else 0),
            moe_ffn_hidden_size=self.moe_ffn_hidden_size or (ffn if is_moe(self) else 0),
        )

    def as_row(self) -> tuple[int, ...]:
        """Integers in the kernels' model order (:data:`~vtrain_fast.model.records.MODEL_FIELDS`:
        the sizes num_layers, hidden_size, num_attention_heads, num_query_groups, ffn_hidden_size,
        vocab_size, seq_length, then each architecture flag's code, ``ArchFlag.encode``, then the
        MoE columns, :func:`~vtrain_fast.model.moe.kernel_values`)."""
        r = self.resolved()
        return (tuple(int(getattr(r, k)) for k in MODEL_SIZES)
                + tuple(fl.encode(getattr(r, fl.name)) for fl in ARCH_FLAGS) + kernel_values(r))

    @property
    def moe_layer_step(self) -> int:
        """The kernels' MoE layer placement: every this many layers (:func:`~vtrain_fast.model.moe.layer_placement`)."""
        return kernel_values(self.resolved())[KERNEL_NAMES.index("moe_layer_step")]

    @property
    def moe_first_dense_layers(self) -> int:
        """The kernels' MoE layer placement: dense first layers (:func:`~vtrain_fast.model.moe.layer_placement`)."""
        return kernel_values(self.resolved())[KERNEL_NAMES.index("moe_first_dense_layers")]

    def arch_values(self) -> dict:
        """The architecture flags by name."""
        return {fl.name: getattr(self, fl.name) for fl in ARCH_FLAGS}

    def shape_values(self) -> dict:
        """The MoE and attention-shape fields (:data:`~vtrain_fast.model.moe.SHAPE_FIELDS`) by name."""
        return {f.name: getattr(self, f.name) for f in SHAPE_FIELDS}


# ranges of the shape arguments (the spec's and evaluate's checks use them too)
MODEL_INT_RANGES = {
    "num_layers": (1, 100_000), "hidden_size": (1, 1_000_000),
    "num_attention_heads": (1, 100_000), "num_query_groups": (1, 100_000),
    "ffn_hidden_size": (1, 10_000_000), "seq_length": (1, 100_000_000),
    "vocab_size": (1, 100_000_000),
}
MODEL_REQUIRED = ("num_layers", "hidden_size", "num_attention_heads", "seq_length")
MODELS_FILE = Path(__file__).resolve().parent.parent / "data" / "models.toml"


def models_from_tables(tables: dict, where: str, sources: dict | None = None) -> dict[str, ModelShape]:
    """Model shapes from ``[models.<name>]`` tables (Megatron-LM argument names; ``source``, a
    key of ``sources`` or a text; ``source_note`` and ``published_ffn_hidden_size`` are
    documentation), defaults filled in.

    Raises
    ------
    InputError
        A table that is not one, a missing or unknown key, a value that is not a whole number
        in :data:`MODEL_INT_RANGES`.
    """
    if not isinstance(tables, dict) or not all(isinstance(t, dict) for t in tables.values()):
        raise InputError(where, "models", tables, "[models.<name>] tables, one per model shape",
                         "e.g. [models.my-7b] with num_layers, hidden_size, num_attention_heads, seq_length")
    allowed = set(MODEL_INT_RANGES) | set(ARCH_BY_NAME) | set(SHAPE_BY_NAME) | {"source", "source_note"}
    out = {}
    for name, t in tables.items():
        here = f"{where}: [models.{name}]"
        for k in t:
            if k not in allowed:
                raise InputError(here, k, t[k], "model keys: " + ", ".join(sorted(allowed)),
                                 f'a name with a dot is quoted: [models."{name}.{k}"]' if isinstance(t[k], dict)
                                 else did_you_mean(k, sorted(allowed), "remove it"))
        for k in MODEL_REQUIRED:
            if k not in t:
                raise InputError(here, k, None, "a whole number (required)", f"add {k}")
        kw = {}
        for k, (lo, hi) in MODEL_INT_RANGES.items():
            if k in t:
                v = t[k]
                if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                    raise InputError(here, k, v, f"a whole number from {lo:,} to {hi:,}")
                kw[k] = v
        kw.update(arch_flags_from_table(here, t))
        kw.update(shape_fields_from_table(here, t, kw))
        src = t.get("source", "")
        if not isinstance(src, str) or not isinstance(t.get("source_note", ""), str):
            raise InputError(here, "source", src, "a string")
        text = (sources or {}).get(src, src or f"given in {where}")
        if t.get("source_note"):
            text += f" ({t['source_note']})"
        out[name] = ModelShape(name=name, source=text, **kw).resolved()
    return out


def arch_flag_value(where: str, key: str, fl, value):
    """``value`` of architecture flag ``fl`` checked (its registry kind and choices) and in the
    registry's spelling.

    Raises
    ------
    InputError
        Naming ``where`` and ``key``, the allowed values and an example.
    """
    if not fl.check(value):
        example = ("true" if not fl.default else "false") if fl.kind is bool else f'"{fl.choices[-1]}"'
        fix = (did_you_mean(value, fl.choices, f"e.g. {fl.name} = {example}") if isinstance(value, str) and fl.kind is str
               else f"e.g. {fl.name} = {example}, without quotes" if fl.kind is bool else f"e.g. {fl.name} = {example}")
        raise InputError(where, key, value, f"{fl.allowed()} ({fl.doc})", fix)
    return fl.canonical(value)


def arch_flags_from_table(where: str, table: dict) -> dict:
    """The architecture flags a model table gives (:func:`arch_flag_value` each), by name."""
    return {fl.name: arch_flag_value(where, fl.name, fl, table[fl.name]) for fl in ARCH_FLAGS if fl.name in table}


def shape_field_value(where: str, key: str, field, value):
    """``value`` of MoE / attention-shape field ``field`` (:data:`vtrain_fast.model.moe.SHAPE_FIELDS`)
    checked against its kind and range; ``moe_layer_freq`` as an int or a tuple of 0/1 (a list, or
    Megatron-LM's pattern text, :func:`~vtrain_fast.model.moe.parse_layer_pattern`).

    Raises
    ------
    InputError
        Naming ``where`` and ``key``, the allowed values and an example.
    """
    example = {"moe_layer_freq": 'moe_layer_freq = "([0]*3+[1]*58)" or 1', "moe_expert_capacity_factor":
               "moe_expert_capacity_factor = 1.25, or leave it out for dropless routing"}.get(
        field.name, f"e.g. {field.name} = true, without quotes" if field.kind is bool else
        f"e.g. {field.name} = {max(int(field.lo), 8)}")
    bad = InputError(where, key, value, f"{field.allowed()} ({field.doc})", example)
    if field.kind is bool:
        if not isinstance(value, bool):
            raise bad
        return value
    if field.kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not field.lo < value <= field.hi:
            raise bad
        return float(value)
    if field.kind is tuple:
        if isinstance(value, str):
            pattern = parse_layer_pattern(value)
            if pattern is None:
                raise bad
            return pattern
        if isinstance(value, list):
            if not value or len(value) > 100_000 or not all(v in (0, 1) and not isinstance(v, bool) for v in value):
                raise bad
            return tuple(value)
    if isinstance(value, bool) or not isinstance(value, int) or not field.lo <= value <= field.hi:
        raise bad
    return value


def shape_fields_from_table(where: str, table: dict, sizes: dict) -> dict:
    """The MoE and attention-shape fields a model table gives (:func:`shape_field_value` each),
    checked together with its ``sizes`` (the table's other values) as Megatron-core checks them
    (``megatron/core/transformer/transformer_config.py``, ``__post_init__``; ``gpt_layer_specs``
    for the pattern's length).

    Raises
    ------
    InputError
        An MoE key without ``num_experts``; ``moe_router_topk`` above ``num_experts``; a
        ``moe_layer_freq`` pattern that is not one entry per layer or has no MoE layer; an MLA
        key without ``multi_latent_attention``; MLA with ``kv_channels``, biases or
        ``num_query_groups`` other than ``num_attention_heads``.
    """
    out = {f.name: shape_field_value(where, f.name, f, table[f.name]) for f in SHAPE_FIELDS if f.name in table}
    experts = out.get("num_experts", 0)
    moe_keys = [k for k in out if k.startswith("moe_")]
    if experts == 0 and moe_keys:
        raise InputError(where, moe_keys[0], table[moe_keys[0]], "absent in a dense model (num_experts 0 or absent)",
                         "add num_experts (routed experts per MoE layer), or remove the moe_ keys")
    if experts and out.get("moe_router_topk", SHAPE_BY_NAME["moe_router_topk"].default) > experts:
        k = out.get("moe_router_topk", SHAPE_BY_NAME["moe_router_topk"].default)
        raise InputError(where, "moe_router_topk", k, f"a whole number from 1 to num_experts ({experts})",
                         "the experts each token is routed to; Megatron-core's default is 2")
    freq = out.get("moe_layer_freq", 1)
    layers = sizes.get("num_layers", 0)
    if isinstance(freq, tuple) and (len(freq) != layers or 1 not in freq):
        raise InputError(where, "moe_layer_freq", list(freq), f"one 0 or 1 per layer ({layers} layers: num_layers), "
                         "at least one 1 (an MoE layer)", f"e.g. \"([0]*3+[1]*{max(layers - 3, 1)})\" for three dense "
                         "layers first (Megatron-core asserts the pattern's length)")
    mla = out.get("multi_latent_attention", False)
    given = [k for k in MLA_FIELDS if k in out]
    if given and not mla:
        raise InputError(where, given[0], out[given[0]], "absent without multi_latent_attention",
                         "add multi_latent_attention = true, or remove the MLA keys")
    if mla and out.get("kv_channels"):
        raise InputError(where, "kv_channels", out["kv_channels"], "absent with multi_latent_attention (its head "
                         "widths are qk_head_dim, qk_pos_emb_head_dim and v_head_dim)", "remove kv_channels")
    groups, heads = sizes.get("num_query_groups"), sizes.get("num_attention_heads")
    if mla and groups and groups != heads:
        raise InputError(where, "num_query_groups", groups, f"num_attention_heads ({heads}) or absent with "
                         "multi_latent_attention (MLA has no grouped queries: every head its own key and value)",
                         "remove num_query_groups")
    if mla and table.get("add_bias_linear", ARCH_BY_NAME["add_bias_linear"].default):
        raise InputError(where, "add_bias_linear", table.get("add_bias_linear", True),
                         "false with multi_latent_attention (its linears have no biases, as DeepSeek's)",
                         "add add_bias_linear = false")
    return out


def check_priced(where: str, key: str, shape, fix: str) -> None:
    """Refuse a shape the kernels cannot price (:func:`vtrain_fast.model.moe.unpriced_reason`).

    Raises
    ------
    InputError
        Naming ``where``, ``key`` (the model column or ``model.presets``), the model and ``fix``.
    """
    reason = unpriced_reason(shape)
    if reason is not None:
        raise InputError(where, key, shape.name, "a model the cost model prices: " + reason, fix)


def _load_presets() -> dict[str, ModelShape]:
    doc = read_toml(MODELS_FILE, "model presets file")
    return models_from_tables(doc.get("models", {}), str(MODELS_FILE), doc.get("sources", {}))


# The shipped shapes, by name, from vtrain_fast/data/models.toml (sources there).
MODEL_PRESETS: dict[str, ModelShape] = _load_presets()
