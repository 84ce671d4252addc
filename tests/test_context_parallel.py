"""Context parallelism (parallel size cp, Megatron-LM --context-parallel-size; cp_comm_type = p2p |
all_gather, --cp-comm-type): each number it should change moves in the right direction and by the
right size, and nothing else moves."""
from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

import reference as ref
from vtrain_fast.analysis.evaluate import evaluate_frame
from vtrain_fast.hardware.gpus import PRESETS, machine_vector, with_overrides
from vtrain_fast.io.errors import InputError
from vtrain_fast.model import comm, ops
from vtrain_fast.model import costs, overlap, records, rules, step
from vtrain_fast.model.layout import Layout, dp_cp_size, dp_cp_stride
from vtrain_fast.model.records import HW_FIELDS
from vtrain_fast.plan.spec import parse_spec
from vtrain_fast.model.arch import DEFAULT_ARCH

GiB = 2.0 ** 30
# Llama 3 70B-like shape at s = 8192 (GQA 8 groups, SwiGLU), and GPT-3 175B-like without GQA
LLAMA = dict(num_layers=80, hidden_size=8192, num_attention_heads=64, num_query_groups=8, ffn_hidden_size=28672,
             vocab_size=128256, seq_length=8192, gated_mlp="true")


def hw_of(gpu="h100-sxm-80gb", **settings):
    return machine_vector(with_overrides(PRESETS[gpu], None, **{"use_flash_attn": True, **settings}))


def run(L, h, a, g, f, v, s, B, b, lay, rc=0, hw=None, gated=1.0, tokens=1e12):
    out = np.empty((records.NUM_OUTPUTS, 1))
    st = step.step(L, h, a, g, f, v, s, B, b, lay, rc, tokens, hw_of() if hw is None else hw, out, 0,
                    DEFAULT_ARCH._replace(gated_mlp=float(gated)))
    return st, dict(zip(records.OUTPUT_NAMES, out[:, 0]))


def plans(**cols):
    n = max(len(v) if isinstance(v, list) else 1 for v in cols.values())
    base = {k: [v] * n for k, v in LLAMA.items()}
    base.update(global_batch_size=[64] * n, micro_batch_size=[1] * n, tp=[8] * n, pp=[4] * n, dp=[2] * n,
                gpu=["h100-sxm-80gb"] * n, use_flash_attn=["true"] * n, recompute=["selective"] * n)
    base.update({k: v if isinstance(v, list) else [v] * n for k, v in cols.items()})
    return pl.DataFrame(base)


# ------------------------------------------------------------------------------ formulas by hand
def test_ring_traffic_per_layer_is_kv_blocks_passed_cp_minus_one_times():
    """One K/V block is K and V of the rank's s/cp tokens, its KV heads: 2 x b x (s/cp) x (h g/a)/t x 2
    bytes. Forward: cp - 1 transfers of one block; backward: 2 (cp - 1) blocks (K/V, K/V + dK/dV,
    dK/dV). With nothing to hide behind, the exposed time is those bytes over the link."""
    b, s, h, a, g, t, cp = 1.0, 8192.0, 8192.0, 64.0, 8.0, 8.0, 4.0
    kv = ops.cp_kv_bytes(b, s / cp, h, a, g, t)
    assert kv == 2 * b * (s / cp) * (h * g / a) / t * 2 == 1_048_576.0        # 1 MiB per step
    hw = hw_of()
    hw[HW_FIELDS.index("intra_node_latency_s")] = 0.0
    rate = hw[HW_FIELDS.index("intra_node_Bps")] * hw[HW_FIELDS.index("intra_node_efficiency")]
    fwd = comm.cp_ring_forward_exposed_s(kv, cp, 0.0, False, hw)
    bwd = comm.cp_ring_backward_exposed_s(kv, cp, 0.0, False, hw)
    assert fwd == pytest.approx((cp - 1) * kv / rate, rel=1e-12)
    assert bwd == pytest.approx(2 * (cp - 1) * kv / rate, rel=1e-12)      # twice the forward's bytes
    # each step hides behind its attention block: a block longer than the transfer hides it all
    assert comm.cp_ring_forward_exposed_s(kv, cp, 1.0, False, hw) == 0.0
    assert comm.cp_ring_backward_exposed_s(kv, cp, 1.0, False, hw) == 0.0
    # no ring at cp = 1
    assert comm.cp_ring_forward_exposed_s(kv, 1.0, 0.0, False, hw) == 0.0


def test_all_gather_moves_every_ranks_kv_and_is_exposed():
    b, s, h, a, g, t, cp = 1.0, 8192.0, 8192.0, 64.0, 8.0, 8.0, 2.0
    hw = hw_of(cp_comm_type="all_gather")
    kv = ops.cp_kv_bytes(b, s / cp, h, a, g, t)
    fwd, bwd = overlap.cp_exchange_s(b, s / cp, h, a, g, t, cp, hw)
    assert fwd == comm.group_allgather_s(cp * kv, cp, t, hw) > 0.0         # gathered size cp x kv
    assert bwd == 2.0 * fwd                                                # all-gather + reduce-scatter
    p2p = overlap.cp_exchange_s(b, s / cp, h, a, g, t, cp, hw_of())
    assert p2p[0] < fwd and p2p[1] < bwd                                   # the ring hides behind compute


def test_each_rank_does_one_cp_th_of_the_causal_attention_flops():
    """2 cp chunks, rank r holding r and 2cp-1-r: per rank 1/cp of the causal FLOPs, i.e. cp
    causal blocks over its own s/cp rows; the extra beyond one local call is (cp - 1) blocks + the
    per-step output corrections, and the all-gather variant does the same FLOPs in two kernels."""
    b, s, h, a, g, t, cp = 1.0, 8192.0, 8192.0, 64.0, 8.0, 8.0, 4.0
    sl = s / cp
    # total causal FLOPs 2 b s^2 h / t over cp ranks = cp x (local causal 2 b sl^2 h / t)
    assert (2 * b * s * s * h / t) / cp == pytest.approx(cp * 2 * b * sl * sl * h / t)
    hw = hw_of()
    one = ops.flash_attention_forward_s(b, sl, h, a, g, t, hw)
    corr = ops.memory_bound_time_s(6.0 * b * sl * h / t, 1.0, hw)
    assert ops.cp_attention_forward_extra_s(b, sl, h, a, g, t, cp, hw) == pytest.approx((cp - 1) * one + cp * corr)
    assert ops.cp_attention_forward_extra_s(b, sl, h, a, g, t, 1.0, hw) == 0.0
    ag = ops.cp_attention_forward_extra_s(b, sl, h, a, g, t, cp, hw_of(cp_comm_type="all_gather"))
    assert ag > 0.0 and ag + one == pytest.approx(cp * one, rel=0.2)      # same FLOPs, fewer launches


def test_activations_follow_korthikanti_with_s_over_cp():
    """Korthikanti et al. 2022 (Table 2, tensor parallelism, GPT layer f = 4h, FlashAttention: no
    5as/(ht) term, a 4-byte log-sum-exp per query row): sbh(10 + 24/t) with s -> s / cp."""
    b, s, h, a, t = 1.0, 8192.0, 12288.0, 96.0, 8.0
    hw = hw_of()
    for cp in (1.0, 2.0, 4.0):
        mb = costs.micro_batch_costs(b, s, h, a, a, 4 * h, 51200.0, t, hw, DEFAULT_ARCH, cp)
        sl = s / cp
        assert mb.layer_activation_bytes == pytest.approx(sl * b * h * (10 + 24 / t) + 4 * b * a / t * sl, rel=1e-12)
    st1, one = run(96, 12288, 96, 96, 4 * 12288, 51200, 8192, 32, 1, Layout(8, 1, 4, 8), hw=hw, gated=0.0)
    st2, two = run(96, 12288, 96, 96, 4 * 12288, 51200, 8192, 32, 1, Layout(8, 2, 4, 8), hw=hw, gated=0.0)
    assert st1 in (records.OK, records.OUT_OF_MEMORY) and st2 in (records.OK, records.OUT_OF_MEMORY)
    assert two["activations_GiB"] == pytest.approx(one["activations_GiB"] / 2, rel=1e-12)   # halves exactly
    assert two["model_states_GiB"] == one["model_states_GiB"]          # no ZeRO: states are not sharded


def test_gradients_are_reduced_and_sharded_over_dp_times_cp():
    """Megatron's data-parallel group with context parallelism: dp x cp ranks, stride tp. The
    gradient exchange and the ZeRO shards of (tp, cp = 2, dp = 4) are those of (tp, cp = 1, dp = 8)."""
    lay2, lay1 = Layout(4, 2, 4, 2), Layout(4, 1, 8, 2)
    assert dp_cp_size(lay2) == 8 and dp_cp_stride(lay2) == 4
    for zero in (0, 1, 3):
        hw = hw_of(zero_stage=zero)
        s2 = costs.split_costs(32.0, 4096.0, 32.0, 8.0, 14336.0, 128256.0, 8192.0, lay2, hw, DEFAULT_ARCH._replace(gated_mlp=1.0))
        s1 = costs.split_costs(32.0, 4096.0, 32.0, 8.0, 14336.0, 128256.0, 8192.0, lay1, hw, DEFAULT_ARCH._replace(gated_mlp=1.0))
        assert s2.dp_comm_s == s1.dp_comm_s > 0.0
        assert s2.optimizer_s == s1.optimizer_s
        p = s2.params_first
        biggest = max(p, s2.params_last)
        # fp32 main gradients (bf16): a 4-byte all-reduce, or a 4-byte reduce-scatter + a 2-byte all-gather
        assert s2.dp_comm_s == (comm.group_allgather_s(4.0 * biggest, 8.0, 4.0, hw)
                                + comm.group_allgather_s(2.0 * biggest, 8.0, 4.0, hw) if zero else
                                comm.group_allreduce_s(4.0 * biggest, 8.0, 4.0, hw))
        _, r2 = run(32, 4096, 32, 8, 14336, 128256, 8192, 64, 1, lay2, hw=hw)
        _, r1 = run(32, 4096, 32, 8, 14336, 128256, 8192, 64, 1, Layout(4, 1, 4, 2), hw=hw)
        # ZeRO-1: 2 + 4 + 12 / (dp x cp) bytes per parameter (fp32 main gradient), not 6 + 12 / dp
        if zero == 1:
            assert r2["model_states_GiB"] < r1["model_states_GiB"]
            assert r2["model_states_GiB"] == pytest.approx(p * (6 + 12 / 8) / GiB, rel=1e-12)


def test_data_parallel_settings_act_at_dp_1_with_cp():
    """overlap_grad_reduce and the ZeRO stages change a dp = 1 plan when cp > 1 (the gradient group
    is dp x cp): the plan kind's data-parallel bit is set, so sweeps price such rows (no repeat)."""
    assert rules.plan_case(Layout(8, 2, 1, 1)) == 4 + 8 + 1
    assert rules.plan_case(Layout(8, 1, 1, 1)) == 1
    base = run(32, 4096, 32, 8, 14336, 128256, 8192, 16, 1, Layout(4, 2, 1, 1))[1]
    over = run(32, 4096, 32, 8, 14336, 128256, 8192, 16, 1, Layout(4, 2, 1, 1), hw=hw_of(overlap_grad_reduce=True))[1]
    assert over["dp_comm_s"] < base["dp_comm_s"]


# ------------------------------------------------------------------------------ directions (evaluate)
def test_cp_halves_activations_cuts_compute_and_adds_its_exchange():
    """At fixed tp, pp, dp and batch, cp = 2 doubles the GPUs: activations per GPU halve exactly,
    per-GPU compute falls, the ring adds an exchange (exposed on a slow link), the DP exchange and
    Adam stay, MFU counts every GPU."""
    df = evaluate_frame(plans(cp=[1, 2, 4]))
    # 70B at s = 8192 on 64 H100s does not fit without context parallelism; cp = 2 makes it fit
    assert df["status"].to_list() == ["out_of_memory", "ok", "ok"]
    assert df["num_gpus"].to_list() == [64, 128, 256]
    act = df["activations_GiB"].to_list()
    assert act[1] == pytest.approx(act[0] / 2, rel=1e-9) and act[2] == pytest.approx(act[0] / 4, rel=1e-9)
    comp = df["compute_s"].to_list()
    assert comp[0] > comp[1] > comp[2]
    assert comp[1] > comp[0] / 2                 # more launches, smaller blocks: not a perfect split
    assert df["cp_comm_s"][0] == 0.0 and (df["cp_comm_s"] >= 0.0).all()
    for col in ("model_states_GiB", "num_parameters"):
        assert df[col].n_unique() == 1, col
    tok = df["tokens_per_s"].to_numpy()
    mfu = df["mfu"].to_numpy()
    # MFU = tokens/s x FLOPs per token / (num_gpus x peak): per-GPU utilisation, every cp rank counted
    assert np.allclose(mfu / (tok / df["num_gpus"].to_numpy()), mfu[0] / (tok[0] / 64), rtol=1e-12)
    # breakdown still adds up to the iteration
    parts = sum(df[c] for c in ("compute_s", "tp_comm_s", "cp_comm_s", "pp_comm_s", "dp_comm_s", "bubble_s",
                                "optimizer_s", "overhead_s"))
    assert np.allclose(parts.to_numpy(), df["iteration_time_s"].to_numpy(), rtol=1e-12)


def test_ring_exchange_is_exposed_across_nodes_and_all_gather_exposes_more():
    """tp = 8 fills a node: cp = 2 puts the ring on the NICs; a slow NIC exposes it; all-gather is
    exposed whatever the link and never beats the ring here."""
    slow = dict(inter_node_Gbps=[25.0] * 2)
    ring = evaluate_frame(plans(cp=[2, 2], micro_batch_size=[1, 1], **slow))
    ag = evaluate_frame(plans(cp=[2, 2], cp_comm_type=["all_gather"] * 2, **slow))
    assert (ring["cp_comm_s"] > 0).all()
    assert (ag["cp_comm_s"] > ring["cp_comm_s"]).all()
    assert ag["cp_comm_type"].to_list() == ["all_gather"] * 2
    fast = evaluate_frame(plans(cp=[2], tp=[2], dp=[2], pp=[1], num_layers=[8]))     # tp x cp = 4: NVLink
    assert fast["cp_comm_s"][0] < ring["cp_comm_s"][0]


def test_cp_comm_type_has_no_effect_at_cp_1():
    a = evaluate_frame(plans(cp=[1]))
    b = evaluate_frame(plans(cp=[1], cp_comm_type=["all_gather"]))
    for col in records.OUTPUT_NAMES:
        assert a[col][0] == b[col][0], col


# ------------------------------------------------------------------------------ statuses
def test_seq_length_not_divisible_by_2cp_is_a_status():
    st, out = run(32, 4096, 32, 8, 14336, 128256, 8190, 16, 1, Layout(4, 2, 2, 1))
    assert st == records.BAD_SEQ_LENGTH and math.isnan(out["iteration_time_s"])
    assert run(32, 4096, 32, 8, 14336, 128256, 8190, 16, 1, Layout(4, 1, 2, 1))[0] == records.OK
    assert run(32, 4096, 32, 8, 14336, 128256, 8196, 16, 1, Layout(4, 2, 2, 1))[0] == records.OK   # 8196 % 4 == 0
    df = evaluate_frame(plans(cp=[4, 2], seq_length=[8196, 8196]))
    assert df["status"].to_list() == ["bad_seq_length", "ok"]


def test_cp_without_flash_attention_is_refused():
    st, out = run(32, 4096, 32, 8, 14336, 128256, 8192, 16, 1, Layout(4, 2, 2, 1), hw=hw_of(use_flash_attn=False))
    assert st == records.REFUSED and math.isnan(out["mfu"])
    assert run(32, 4096, 32, 8, 14336, 128256, 8192, 16, 1, Layout(4, 1, 2, 1),
               hw=hw_of(use_flash_attn=False))[0] in (records.OK, records.OUT_OF_MEMORY)


def test_evaluate_checks_num_gpus_against_tp_cp_pp_dp():
    with pytest.raises(InputError, match="tp x cp x pp x dp"):
        evaluate_frame(plans(cp=[2], num_gpus=[64]))
    assert evaluate_frame(plans(cp=[2], num_gpus=[128]))["status"][0] == "ok"


# ------------------------------------------------------------------------------ sweeps
SPEC = """
name = "cp-small"
[model]
presets = ["llama3-8b"]
[training]
num_tokens = 1e11
global_batch_size = [32, 64]
micro_batch_size = [1, 2]
recompute = ["none", "selective"]
use_flash_attn = true
overlap_grad_reduce = [false, true]
[cluster]
gpu = ["h100-sxm-80gb"]
num_gpus = [16, 32]
[parallel]
tp = [2, 4]
cp = [1, 2]
pp = [1, 2]
cp_comm_type = ["p2p", "all_gather"]
"""


def test_small_sweep_with_cp_matches_evaluate_and_the_twin(write_spec, tmp_path, cli):
    spec = parse_spec(SPEC, "cp.toml")
    assert spec.cp == (1, 2) and spec.num_points == 1 * 1 * 4 * 2 * 2 * 2 * 2 * 2 * 2 * 2
    res = cli("sweep", write_spec(SPEC, "cp.toml"), "-o", tmp_path / "out")
    assert res.exit_code == 0, res.output
    from vtrain_fast.analysis.query import scan_results
    df = scan_results(tmp_path / "out").collect()
    assert set(df["cp"].to_list()) == {1, 2}
    priced = df.filter(pl.col("status").cast(pl.String).is_in(["ok", "out_of_memory"]))
    assert (priced["num_gpus"] == priced["tp"] * priced["cp"] * priced["pp"] * priced["dp"]).all()
    # cp_comm_type changes nothing at cp = 1: its all_gather rows repeat the p2p rows there
    at1 = df.filter((pl.col("cp") == 1) & (pl.col("cp_comm_type").cast(pl.String) == "all_gather"))
    assert (at1["status"].cast(pl.String) == "repeat").all() and at1.height > 0
    # at dp = 1 with cp = 2 the overlapped gradient reduction acts (gradient group dp x cp = 2): priced
    dp1 = df.filter((pl.col("cp") == 2) & (pl.col("dp") == 1) & pl.col("overlap_grad_reduce"))
    assert dp1.height > 0 and not (dp1["status"].cast(pl.String) == "repeat").any()
    at2 = df.filter((pl.col("cp") == 2) & (pl.col("status").cast(pl.String) == "ok"))
    assert at2.height > 0 and (at2["cp_comm_s"] >= 0).all()
    # evaluate reads the rows back and prices them alike
    rows = priced.head(40)
    again = evaluate_frame(rows.select([c for c in rows.columns if c not in records.OUTPUT_NAMES and c != "status"])
                           .with_columns(pl.col(pl.Categorical).cast(pl.String)))
    for col in ("iteration_time_s", "memory_per_gpu_GiB", "cp_comm_s", "mfu"):
        assert np.array_equal(again[col].to_numpy(), rows[col].to_numpy()), col
    # the twin prices a cp = 2 row alike
    r = at2.row(0, named=True)
    hw = machine_vector(with_overrides(PRESETS["h100-sxm-80gb"], None, use_flash_attn=True,
                                       overlap_grad_reduce=bool(r["overlap_grad_reduce"]),
                                       cp_comm_type=str(r["cp_comm_type"])))
    rc = {"none": 0, "full": 1, "selective": 2}[str(r["recompute"])]
    status, out = ref.step(r["num_layers"], r["hidden_size"], r["num_attention_heads"], r["num_query_groups"],
                           r["ffn_hidden_size"], r["vocab_size"], r["seq_length"], r["global_batch_size"],
                           r["micro_batch_size"], r["tp"], r["pp"], r["dp"], rc, r["num_tokens"], list(hw),
                           ref.ModelFlags(float(r["gated_mlp"]), float(r["normalization"] == "RMSNorm"),
                                          float(("learned_absolute", "rope", "none").index(r["position_embedding_type"])),
                                          float(r["add_bias_linear"]), float(r["untie_embeddings_and_output_weights"])), 2)
    assert status == ref.OK
    for col in ("iteration_time_s", "cp_comm_s", "activations_GiB", "model_states_GiB"):
        assert out[col] == pytest.approx(r[col], rel=1e-12), col


def test_pruning_table_knows_the_seq_length_rule():
    from vtrain_fast.plan.grid import build_grid, pruning_table
    spec = parse_spec(SPEC.replace('presets = ["llama3-8b"]', 'num_layers = [8]\nhidden_size = [1024]\n'
                                   'num_attention_heads = [16]\nseq_length = [4098]'), "cp.toml")
    # model, gpu axis (4 machines: overlap_grad_reduce x cp_comm_type), size, tp, cp, pp
    table = pruning_table(build_grid(spec)).reshape(1, 4, 2, 2, 2, 2)
    assert table[..., 0, :].all()                # cp = 1: 4098 tokens are fine
    assert not table[..., 1, :].any()            # cp = 2: 4098 % (2 cp) = 2, no point of it can run
