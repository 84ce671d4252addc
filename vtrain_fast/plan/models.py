"""Model presets: dense decoder-only transformers. A shape is its sizes and its architecture flags
(the registry :mod:`vtrain_fast.model.arch`: gated MLP, normalization, position embedding, linear
biases, tied or untied output layer; Megatron-LM's GPT layer by default, the Llama presets set
theirs). The shapes and their sources are data:
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
from ..model.params import MODEL_FIELDS, MODEL_SIZES
from ..model.settings import with_registry_fields

DEFAULT_VOCAB_SIZE = 50257


@with_registry_fields(ARCH_FLAGS, last=("source",))   # one field per architecture flag, source last
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
        """Return a copy with the defaults (0 = default) filled in."""
        from dataclasses import replace
        return replace(
            self,
            num_query_groups=self.num_query_groups or self.num_attention_heads,
            ffn_hidden_size=self.ffn_hidden_size or 4 * self.hidden_size,
        )

    def as_row(self) -> tuple[int, ...]:
        """Integers in the kernels' model order (:data:`~vtrain_fast.model.params.MODEL_FIELDS`:
        the sizes num_layers, hidden_size, num_attention_heads, num_query_groups, ffn_hidden_size,
        vocab_size, seq_length, then each architecture flag's code, ``ArchFlag.encode``)."""
        r = self.resolved()
        return (tuple(int(getattr(r, k)) for k in MODEL_SIZES)
                + tuple(fl.encode(getattr(r, fl.name)) for fl in ARCH_FLAGS))

    def arch_values(self) -> dict:
        """The architecture flags by name."""
        return {fl.name: getattr(self, fl.name) for fl in ARCH_FLAGS}


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
    allowed = set(MODEL_INT_RANGES) | set(ARCH_BY_NAME) | {"source", "source_note"}
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


def _load_presets() -> dict[str, ModelShape]:
    doc = read_toml(MODELS_FILE, "model presets file")
    return models_from_tables(doc.get("models", {}), str(MODELS_FILE), doc.get("sources", {}))


# The shipped shapes, by name, from vtrain_fast/data/models.toml (sources there).
MODEL_PRESETS: dict[str, ModelShape] = _load_presets()
