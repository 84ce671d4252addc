"""Model presets: dense decoder-only transformers (GPT-2/3 style layer: LayerNorm, GeLU MLP,
learned position embedding, untied output layer); Llama 2/3 shapes with their SwiGLU MLP as an
equivalent 1.5x-wide GeLU MLP (see the note above the Llama sources).

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
_LLAMA2 = ("Touvron et al. 2023, 'Llama 2', Table 1 (context, GQA) and the released config.json "
           "(dims, vocab 32,000)")
_LLAMA3 = ("Dubey et al. 2024, 'The Llama 3 Herd of Models', Table 3 (layers, dims, heads, KV heads) "
           "and the released config.json (vocab 128,256); pre-training context 8,192")
# Llama's SwiGLU MLP has three h x f matrices; the layer here has two (GeLU). A two-matrix MLP of
# width 1.5 f has the same FLOPs (6 h f per token), the same weights (3 h f) and the same
# activation bytes (FC1 output 2 x 1.5f + activation output 1.5f = gate/up 2f + SwiGLU output f,
# and the elementwise op moves 4 x 1.5f = 6f bytes like SwiGLU's read 2f, write f), so these
# presets give ffn_hidden_size = 1.5 x Llama's. Not modelled: RoPE instead of learned positions
# (s x h extra parameters here, < 0.1%), RMSNorm, no biases.

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
        ModelShape("llama2-7b", 32, 4096, 32, 4096, ffn_hidden_size=11008 * 3 // 2, vocab_size=32000,
                   source=_LLAMA2),
        ModelShape("llama2-13b", 40, 5120, 40, 4096, ffn_hidden_size=13824 * 3 // 2, vocab_size=32000,
                   source=_LLAMA2),
        ModelShape("llama2-70b", 80, 8192, 64, 4096, num_query_groups=8, ffn_hidden_size=28672 * 3 // 2,
                   vocab_size=32000, source=_LLAMA2),
        ModelShape("llama3-8b", 32, 4096, 32, 8192, num_query_groups=8, ffn_hidden_size=14336 * 3 // 2,
                   vocab_size=128256, source=_LLAMA3),
        ModelShape("llama3-70b", 80, 8192, 64, 8192, num_query_groups=8, ffn_hidden_size=28672 * 3 // 2,
                   vocab_size=128256, source=_LLAMA3),
        ModelShape("llama3-405b", 126, 16384, 128, 8192, num_query_groups=8, ffn_hidden_size=53248 * 3 // 2,
                   vocab_size=128256, source=_LLAMA3),
    )
}
