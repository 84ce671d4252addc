"""Model presets: dense decoder-only transformers (GPT-2/3 style layer: LayerNorm, GeLU MLP,
learned position embedding, untied output layer); Llama 2/3 shapes with their SwiGLU MLP as an
equivalent 1.5x-wide GeLU MLP. The shapes and their sources are data:
``vtrain_fast/data/models.toml``; a spec adds its own in ``[models.<name>]`` tables, in the spec
or in model files it names (``model_files``; ``vtrain-fast import-hf`` writes them from Hugging Face
configs, :mod:`vtrain_fast.plan.hf`).

Names follow Megatron-LM's arguments. ``ffn_hidden_size`` defaults to ``4 * hidden_size``,
``num_query_groups`` to ``num_attention_heads`` (multi-head attention) and ``vocab_size`` to
GPT-2's 50,257.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..io.errors import InputError, did_you_mean
from ..io.inputs import read_toml
from ..model.params import MODEL_FIELDS

DEFAULT_VOCAB_SIZE = 50257


@dataclass(frozen=True)
class ModelShape:
    """One transformer shape.

    Attributes
    ----------
    name : str
    num_layers, hidden_size, num_attention_heads, num_query_groups, ffn_hidden_size,
    vocab_size, seq_length : int
        Megatron-LM's arguments of the same names.
    gated_mlp : bool
        A gated (SwiGLU) MLP of three ``hidden_size x ffn_hidden_size`` matrices (Megatron-LM
        ``--swiglu``; Llama), ``ffn_hidden_size`` as published (Hugging Face ``intermediate_size``).
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
    gated_mlp: bool = False
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
        num_layers, hidden_size, num_attention_heads, num_query_groups, ffn_hidden_size,
        vocab_size, seq_length)."""
        r = self.resolved()
        return tuple(int(getattr(r, k)) for k in MODEL_FIELDS)


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
    allowed = set(MODEL_INT_RANGES) | {"gated_mlp", "source", "source_note"}
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
        if "gated_mlp" in t:
            if not isinstance(t["gated_mlp"], bool):
                raise InputError(here, "gated_mlp", t["gated_mlp"], "true or false",
                                 "gated_mlp = true for a SwiGLU MLP (three h x f matrices, ffn_hidden_size as published)")
            kw["gated_mlp"] = t["gated_mlp"]
        src = t.get("source", "")
        if not isinstance(src, str) or not isinstance(t.get("source_note", ""), str):
            raise InputError(here, "source", src, "a string")
        text = (sources or {}).get(src, src or f"given in {where}")
        if t.get("source_note"):
            text += f" ({t['source_note']})"
        out[name] = ModelShape(name=name, source=text, **kw).resolved()
    return out


def _load_presets() -> dict[str, ModelShape]:
    doc = read_toml(MODELS_FILE, "model presets file")
    return models_from_tables(doc.get("models", {}), str(MODELS_FILE), doc.get("sources", {}))


# The shipped shapes, by name, from vtrain_fast/data/models.toml (sources there).
MODEL_PRESETS: dict[str, ModelShape] = _load_presets()
