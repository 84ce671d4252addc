"""Model presets: dense decoder-only transformers (GPT-2/3 style layer: LayerNorm, GeLU MLP,
learned position embedding, untied output layer).

Names follow Megatron-LM's arguments. ``ffn_hidden_size`` defaults to ``4 * hidden_size``,
``num_query_groups`` to ``num_attention_heads`` (multi-head attention) and ``vocab_size`` to
GPT-2's 50,257.
"""
from __future__ import annotations

from dataclasses import dataclass

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
        """Integers in kernel order: ``(num_layers, hidden_size, num_attention_heads,
        num_query_groups, ffn_hidden_size, vocab_size, seq_length)``."""
        r = self.resolved()
        return (r.num_layers, r.hidden_size, r.num_attention_heads, r.num_query_groups,
                r.ffn_hidden_size, r.vocab_size, r.seq_length)


_GPT3 = "Brown et al. 2020, 'Language Models are Few-Shot Learners', Table 2.1"
_VTRAIN = "Bang et al. 2024, vTrain (MICRO 2024), multi-node validation models"
_MEGATRON = "Narayanan et al. 2021, 'Efficient Large-Scale Language Model Training on GPU Clusters', Table 1"

MODEL_PRESETS: dict[str, ModelShape] = {
    m.name: m.resolved()
    for m in (
        ModelShape("gpt3-125m", 12, 768, 12, 2048, source=_GPT3),
        ModelShape("gpt3-350m", 24, 1024, 16, 2048, source=_GPT3),
        ModelShape("gpt3-760m", 24, 1536, 16, 2048, source=_GPT3),
        # GPT-3 lists 24 heads of 128 for 1.3B, which does not divide 2048; Megatron uses 16.
        ModelShape("gpt3-1.3b", 24, 2048, 16, 2048, source=_GPT3 + " (16 heads as in Megatron-LM)"),
        ModelShape("gpt3-2.7b", 32, 2560, 32, 2048, source=_GPT3),
        ModelShape("gpt3-6.7b", 32, 4096, 32, 2048, source=_GPT3),
        ModelShape("gpt3-13b", 40, 5120, 40, 2048, source=_GPT3),
        ModelShape("gpt3-175b", 96, 12288, 96, 2048, source=_GPT3),
        ModelShape("vtrain-3.6b", 30, 3072, 32, 2048, source=_VTRAIN),
        ModelShape("vtrain-18.4b", 40, 6144, 48, 2048, source=_VTRAIN),
        ModelShape("vtrain-39.1b", 48, 8192, 64, 2048, source=_VTRAIN),
        ModelShape("megatron-1t", 128, 25600, 160, 2048, source=_MEGATRON),
    )
}
