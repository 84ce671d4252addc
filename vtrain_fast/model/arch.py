"""The registry of model-architecture flags: one record per flag of a transformer shape beyond its
sizes (Megatron-LM's argument name, kind, default, choices, documentation, how it names a shape),
and :data:`Arch`, the record of their values the kernels take. No Numba here, so that the spec,
schema, model-file and import modules load without it.

Everything that reads a model flag reads this registry: ``ModelShape``'s fields and their parsing
(``plan.models``), the spec's ``[model]`` keys and lists (``plan.spec``), the kernels' model table
(``records.MODEL_FIELDS``: the sizes, then one column per flag, its :meth:`ArchFlag.encode` value),
the output columns (``io.schema``), evaluate's columns, ``vtrain-fast import-hf`` and the presets
listing.

Adding a flag: a record here (at the end of :data:`ARCH_FLAGS`), the field of the same name in
:data:`Arch`, the formula that reads it (``model``), and its tests.
"""
from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass

from .moe import KERNEL_DEFAULTS, KERNEL_NAMES


@dataclass(frozen=True)
class ArchFlag:
    """One architecture flag of a model shape.

    Attributes
    ----------
    name : str
        Model-file / spec key, column and :data:`Arch` field (Megatron-LM's argument name).
    kind : type
        ``bool`` or ``str`` (one of :attr:`choices`).
    default : bool or str
        Megatron-LM's default (a shape that leaves the flag out has it).
    doc : str
        What it means: the model file's, the spec's and the column table's text.
    megatron : str
        The Megatron-LM command-line flag.
    choices : tuple of str
        The values of a ``str`` flag (Megatron-LM's spelling); its code is the index.
    suffix : str
        Added to a shape's name (``custom-...-<suffix>``) when it differs from the default; a
        ``str`` flag adds its value, lower-cased.
    """

    name: str
    kind: type
    default: bool | str
    doc: str
    megatron: str
    choices: tuple[str, ...] = ()
    suffix: str = ""

    def encode(self, value) -> int:
        """The model table's integer of ``value``: 0/1 for a bool, the index of a choice."""
        if self.kind is str:
            return self.choices.index(value)
        return int(bool(value))

    def decode(self, code):
        """The flag's value of a model-table integer (the inverse of :meth:`encode`)."""
        if self.kind is str:
            return self.choices[int(code)]
        return bool(code)

    def decode_all(self, codes) -> list:
        """:meth:`decode` of each code (a list: bools, or the choices' text)."""
        return [self.decode(c) for c in codes]

    def check(self, value) -> bool:
        """Whether ``value`` is one this flag takes (a bool for a bool flag, a choice, any case, for a str)."""
        if self.kind is bool:
            return isinstance(value, bool)
        return isinstance(value, str) and value.lower() in {c.lower() for c in self.choices}

    def canonical(self, value):
        """``value`` in the registry's spelling (a choice matched without regard to case)."""
        if self.kind is str:
            return next(c for c in self.choices if c.lower() == value.lower())
        return value

    def allowed(self) -> str:
        """The allowed values, as an error message lists them."""
        return "true or false" if self.kind is bool else "one of " + ", ".join(f'"{c}"' for c in self.choices)


ARCH_FLAGS: tuple[ArchFlag, ...] = (
    ArchFlag("gated_mlp", bool, False,
             "gated (SwiGLU) MLP of three h x ffn_hidden_size matrices (ffn_hidden_size as published: Hugging "
             "Face intermediate_size)", "--swiglu", suffix="swiglu"),
    ArchFlag("normalization", str, "LayerNorm",
             "LayerNorm (weight and bias) or RMSNorm (weight only): the layer norms' parameters", "--normalization",
             choices=("LayerNorm", "RMSNorm")),
    ArchFlag("position_embedding_type", str, "learned_absolute",
             "learned_absolute (an s x h position table on the first stage), rope (rotary: no table, a fused "
             "rotary kernel on q and k each way) or none (e.g. ALiBi's biases, not priced)",
             "--position-embedding-type", choices=("learned_absolute", "rope", "none")),
    ArchFlag("add_bias_linear", bool, True,
             "biases in the linear layers (QKV, projection, FC1, FC2); false: none, as in Llama",
             "--disable-bias-linear (false)", suffix="nobias"),
    ArchFlag("untie_embeddings_and_output_weights", bool, False,
             "a separate output layer (false: the LM head shares the word embedding, Megatron-LM's default and "
             "GPT-3's; with pipeline parallelism the first and last stage then each hold it and all-reduce its "
             "gradient)", "--untie-embeddings-and-output-weights", suffix="untied"),
)
BY_NAME: dict[str, ArchFlag] = {f.name: f for f in ARCH_FLAGS}
ARCH_NAMES = tuple(f.name for f in ARCH_FLAGS)
NUM_FLAGS = len(ARCH_FLAGS)

# The kernels' record of a shape's flags: float codes (ArchFlag.encode), one field per flag, in
# registry order (a Numba named tuple, as model.layout.Layout), then the MoE columns
# (model.moe.KERNEL_NAMES: experts, top-k, widths, layer placement), a dense model's values by default.
Arch = namedtuple("Arch", ARCH_NAMES + KERNEL_NAMES, defaults=KERNEL_DEFAULTS)
Arch.__doc__ = """A model's architecture flags as ``float64`` codes (:data:`ARCH_FLAGS` order), then its MoE
columns (:data:`vtrain_fast.model.moe.KERNEL_NAMES`; a dense model's when left out)."""
# Megatron-LM's defaults: GPT's layer (GeLU MLP, LayerNorm, learned positions, biases, tied head), dense.
DEFAULT_ARCH = Arch(*(float(f.encode(f.default)) for f in ARCH_FLAGS), *KERNEL_DEFAULTS)
NUM_RECORD = len(Arch._fields)      # fields of the kernels' record (flags + MoE columns)
# Codes the kernels compare against.
RMSNORM = float(BY_NAME["normalization"].encode("RMSNorm"))
LEARNED_POSITIONS = float(BY_NAME["position_embedding_type"].encode("learned_absolute"))
ROPE = float(BY_NAME["position_embedding_type"].encode("rope"))


def arch_of(values: dict) -> Arch:
    """The :data:`Arch` of flag values by name (missing flags take their default; a dense model)."""
    return Arch(*(float(f.encode(values.get(f.name, f.default))) for f in ARCH_FLAGS), *KERNEL_DEFAULTS)
