"""Numbers must not change under a refactor: SHA-256 digests of every kernel output (inputs,
tokens, outputs, status; float64 bit patterns, NaNs included) of the shipped sweeps and the test
grid, and of every output column of ``evaluate`` on the Megatron Table 1 plans.

The digests in ``tests/data/golden.json`` were taken from the code before the issue-11 reshaping
(commit 4ed4098, 2026-12-01); the sweeps/llama3-70b.toml digest was regenerated once, when the
distributed optimizer's parameter all-gather stopped hiding under the backward (the
overlap_param_gather commit: only its 9,480 rows with distributed_optimizer and
overlap_grad_reduce at dp > 1 changed, of 51,840), and again when the Llama presets took their
gated (SwiGLU) MLP at the published width instead of a GeLU MLP 1.5x as wide (iteration times
+0.03 to +0.12 %, no status changed). All four were regenerated when the model flags landed
(issue 12: GPT presets and custom shapes tie their LM head to the word embedding, Megatron-LM's
default, with the tied gradient all-reduced between the first and last stage; the Llama presets
take RMSNorm, RoPE, no biases and an untied head) together with the A100 refit that followed
(single-node MAPE 6.37 %; on docs/megatron-table1.csv iteration times moved -0.48 to +0.21 %,
pp_comm_s -20 to -31 % from the refitted p2p overhead). All four were regenerated again when bf16 and
fp8 plans took Megatron-LM's fp32 main gradients by default (grad_reduce_in_bf16 = false: 4-byte
gradients kept and reduced); with grad_reduce_in_bf16 = true every output column of
docs/megatron-table1.csv and every row of the shipped sweeps is bit for bit the earlier one, and fp16,
fp32 and tf32 plans are unchanged. A change that is meant to move numbers (a new formula, a refit)
regenerates them, and says so in its commit message:

    .venv/bin/python tests/test_golden.py --write
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from vtrain_fast.model.records import INPUT_NAMES

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "data" / "golden.json"
SWEEPS = ("sweeps/gpt3-175b-a100.toml", "sweeps/llama3-70b.toml")
EVALUATE = ("docs/megatron-table1.csv",)
CHUNK = 1 << 18
# Input columns added after the digests were taken, with their default (a model shape's flag):
# where every row holds the default they are left out, so that they change no digest.
ADDED_COLUMNS = {"gated_mlp": False, "normalization": "LayerNorm", "position_embedding_type": "learned_absolute",
                 "add_bias_linear": True, "untie_embeddings_and_output_weights": False, "cp": 1,
                 # the MoE columns (issue 13): a dense model's values
                 "num_experts": 0, "moe_router_topk": 2, "moe_ffn_hidden_size": 0,
                 "moe_shared_expert_intermediate_size": 0, "moe_layer_step": 1, "moe_first_dense_layers": 0,
                 # heads of kv_channels channels: 0, hidden_size / num_attention_heads
                 "kv_channels": 0,
                 # multi-head latent attention: off, its widths 0
                 "multi_latent_attention": 0, "q_lora_rank": 0, "kv_lora_rank": 0, "qk_head_dim": 0,
                 "qk_pos_emb_head_dim": 0, "v_head_dim": 0}
# Output columns added after the digests were taken, with the value they hold where the feature
# is off (context parallelism's exposed exchange at cp = 1): left out where every row holds it.
ADDED_OUTPUTS = {"cp_comm_s": 0.0, "ep_comm_s": 0.0, "offload_s": 0.0}


def sweep_digest(spec) -> str:
    """SHA-256 over every point of ``spec``: the kernel's inputs, tokens, outputs and status."""
    from vtrain_fast.engine.chunks import RowBuffers
    from vtrain_fast.plan.grid import build_grid
    from vtrain_fast.model.sweep import sweep_chunk
    
    from vtrain_fast.model.arch import BY_NAME as ARCH_BY_NAME
    from vtrain_fast.model.records import OUTPUT_NAMES
    grid = build_grid(spec)
    h = hashlib.sha256()
    b = RowBuffers(CHUNK)
    for start in range(0, grid.num_points, CHUNK):
        n = min(CHUNK, grid.num_points - start)
        sweep_chunk(start, n, *grid.kernel_args(), b.inputs, b.tokens, b.out, b.status)
        inputs = b.inputs[:, :n]
        # an input row added later that holds its default everywhere changes no number; nor does an
        # output row added later that holds its off value (NaN rows: shape errors) everywhere
        added = [k for k, name in enumerate(INPUT_NAMES) if name in ADDED_COLUMNS
                 and (inputs[k] == (ARCH_BY_NAME[name].encode(ADDED_COLUMNS[name]) if name in ARCH_BY_NAME
                                    else int(ADDED_COLUMNS[name]))).all()]
        out = b.out[:, :n]
        new_out = [k for k, name in enumerate(OUTPUT_NAMES) if name in ADDED_OUTPUTS
                   and ((out[k] == ADDED_OUTPUTS[name]) | np.isnan(out[k])).all()]
        for a in (np.delete(inputs, added, axis=0), b.tokens[:n], np.delete(out, new_out, axis=0), b.status[:n]):
            h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def evaluate_digest(path: Path) -> str:
    """SHA-256 over every column of ``evaluate`` on the plans in ``path`` (by column name), less
    the training-setting columns that hold only their default (a setting added later adds such
    a column and changes no number)."""
    from vtrain_fast.analysis.evaluate import evaluate_frame, read_csv
    from vtrain_fast.model.settings import SETTINGS
    df = evaluate_frame(read_csv(path), str(path))
    defaults = {**{st.name: st.default for st in SETTINGS}, **ADDED_COLUMNS, **ADDED_OUTPUTS}
    at_default = {c for c, d in defaults.items() if c in df.columns and (df[c] == d).all()}
    h = hashlib.sha256()
    for name in sorted(set(df.columns) - at_default):
        col = df[name]
        h.update(name.encode())
        h.update(col.cast(str).str.join("|").item().encode() if not col.dtype.is_numeric()
                 else col.to_numpy().astype(np.float64).tobytes())
    return h.hexdigest()


def digests() -> dict:
    from conftest import TINY_SPEC
    from vtrain_fast.plan.spec import load_spec, parse_spec
    out = {f"sweep:{s}": sweep_digest(load_spec(ROOT / s)) for s in SWEEPS}
    out["sweep:tests TINY_SPEC"] = sweep_digest(parse_spec(TINY_SPEC, "tiny.toml"))
    out.update({f"evaluate:{e}": evaluate_digest(ROOT / e) for e in EVALUATE})
    return out


@pytest.mark.parametrize("name", sorted(json.loads(GOLDEN.read_text())) if GOLDEN.exists() else ["missing"])
def test_outputs_are_bit_for_bit_the_recorded_ones(name):
    assert GOLDEN.exists(), f"{GOLDEN} is missing: regenerate it (see the module docstring)"
    want = json.loads(GOLDEN.read_text())[name]
    kind, what = name.split(":", 1)
    if kind == "sweep":
        from conftest import TINY_SPEC
        from vtrain_fast.plan.spec import load_spec, parse_spec
        spec = parse_spec(TINY_SPEC, "tiny.toml") if what == "tests TINY_SPEC" else load_spec(ROOT / what)
        got = sweep_digest(spec)
    else:
        got = evaluate_digest(ROOT / what)
    assert got == want, (f"{name}: the outputs changed. If that is meant (a new formula, a refit), regenerate "
                         "with `.venv/bin/python tests/test_golden.py --write` and say so in the commit")


def test_the_digest_sees_a_one_ulp_change(monkeypatch):
    """The guard can fail: nudging one output of one point by one ulp changes the digest."""
    from vtrain_fast.plan.spec import load_spec
    import vtrain_fast.model.sweep as ks
    spec = load_spec(ROOT / SWEEPS[1])
    base = sweep_digest(spec)
    real = ks.sweep_chunk

    def nudged(start, n, *args):
        real(start, n, *args)
        out = args[-2]
        k = int(np.flatnonzero(np.isfinite(out[0, :n]))[0])    # a priced point
        out[0, k] = np.nextafter(out[0, k], np.inf)
    monkeypatch.setattr(ks, "sweep_chunk", nudged)
    assert sweep_digest(spec) != base


if __name__ == "__main__":
    if "--write" in sys.argv:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(digests(), indent=1) + "\n")
        print(f"wrote {GOLDEN}")
