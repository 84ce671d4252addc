"""MoE token dispatchers and the all-to-all overlap (issue 13): the allgather dispatcher's bytes by
hand, the overlap of Megatron-core's combined 1F1B hides the all-to-all behind the other micro-batch's
compute and never the unpaired ones', Megatron-core's refusals as statuses, and FP8 grouped GEMMs
priced as one grouped launch."""
from __future__ import annotations

import pytest

from test_moe_kernels import H100, LLAMA, _hw, _mixtral, _run
from vtrain_fast.io.errors import InputError
from vtrain_fast.model import comm, costs, experts, ops, records
from vtrain_fast.model.records import HW_FIELDS
from vtrain_fast.model.settings import BY_NAME
from vtrain_fast.plan.spec import check_requirements

ALLGATHER = BY_NAME["moe_token_dispatcher_type"].encode("allgather")


def _moe_run(hw, t=1, p=1, d=8, b=1, m=8, rc=0):
    """Mixtral 8x7B's shape on 8 layers, H100, ``d`` data-parallel ranks, ``m`` micro-batches: the
    status (out of memory read as OK: the times are priced the same) and the outputs."""
    (layers, h, a, g, f, v, s), arch = _mixtral()
    code, out = _run(arch, hw, t=t, p=p, d=d, b=b, B=b * d * m, rc=rc, layers=8, seq=s)
    return (records.OK if code == records.OUT_OF_MEMORY else code), out


def test_allgather_dispatcher_bytes_by_hand():
    """Forward: each of the n = etp x ep ranks' b s / t tokens gathered at 2 h + 4 E + E bytes, the fp32
    outputs (4 h) reduce-scattered; backward 4 h gathered and 2 h + 4 E reduce-scattered. One node: ring
    all-gathers over NVLink of the gathered size."""
    (_, h, _, _, _, _, s), arch = _mixtral()
    e = arch.num_experts
    hw = _hw(ep=4, etp=1, moe_token_dispatcher_type=ALLGATHER)
    n, tokens = 4.0, float(s)          # t = 1: every token of the sequence is routed by this rank

    def ring(nbytes):                  # one ring all-gather inside a node (comm.ring_allgather_s)
        return (hw[HW_FIELDS.index("intra_node_latency_s")] + (n - 1.0) * hw[HW_FIELDS.index("intra_node_step_latency_s")]
                + (n - 1.0) / n * nbytes / (hw[HW_FIELDS.index("intra_node_Bps")]
                                            * hw[HW_FIELDS.index("intra_node_efficiency")]))
    fwd, bwd = experts.ep_exchange_s(1.0, float(s), float(h), 1.0, hw, arch)
    assert fwd == pytest.approx(ring(n * tokens * (2.0 * h + 5.0 * e)) + ring(n * tokens * 4.0 * h), rel=1e-12)
    assert bwd == pytest.approx(ring(n * tokens * 4.0 * h) + ring(n * tokens * (2.0 * h + 4.0 * e)), rel=1e-12)
    # a group of one rank sends nothing
    assert experts.ep_exchange_s(1.0, float(s), float(h), 1.0, _hw(ep=1, etp=1, moe_token_dispatcher_type=ALLGATHER),
                              arch) == (0.0, 0.0)


def test_allgather_moves_more_than_alltoall_and_leaves_the_experts_rows_alone():
    """Every rank gathers all ep ranks' tokens (bf16 and fp32 outputs back) where all-to-all sends only the
    k copies: the exchange is slower; the experts take the same rows (same grouped GEMMs)."""
    a2a_code, a2a = _moe_run(_hw(ep=8, use_flash_attn=1))
    ag_code, ag = _moe_run(_hw(ep=8, use_flash_attn=1, moe_token_dispatcher_type=ALLGATHER))
    assert a2a_code == ag_code == records.OK
    assert ag["ep_comm_s"] > 1.5 * a2a["ep_comm_s"] > 0.0
    (_, h, _, _, _, _, s), arch = _mixtral()
    assert experts.moe_rows(1.0, float(s), 1.0, _hw(ep=8), arch) == experts.moe_rows(
        1.0, float(s), 1.0, _hw(ep=8, moe_token_dispatcher_type=ALLGATHER), arch)
    # the permutation reads all 8 ranks' tokens: the allgather router / permute phase costs more
    assert experts.moe_router_s(1.0, float(s), float(h), 1.0, _hw(ep=8, moe_token_dispatcher_type=ALLGATHER), arch)[0] > \
        experts.moe_router_s(1.0, float(s), float(h), 1.0, _hw(ep=8), arch)[0]


@pytest.mark.parametrize("p, vpp", [(1, 1), (2, 2), (4, 2)])
def test_overlap_hides_the_paired_micro_batches_all_to_all_only(p, vpp):
    base = dict(ep=8, use_flash_attn=1, vpp=vpp)
    m = 16
    code0, off = _moe_run(_hw(**base), p=p, m=m)
    code1, on = _moe_run(_hw(**base, overlap_moe_expert_parallel_comm=1), p=p, m=m)
    assert code0 == code1 == records.OK
    assert on["compute_s"] == off["compute_s"]
    assert 0.0 < on["ep_comm_s"] < off["ep_comm_s"]
    # the unpaired micro-batches keep their whole exchange: 1 of m at pp = 1, the first stage's
    # interleaved warm-up ((p - 1) 2 + (vpp - 1) p chunks, in micro-batches) at pp > 1
    alone = 1.0 if p == 1 else ((p - 1) * 2.0 + (vpp - 1) * p) / vpp
    assert on["ep_comm_s"] >= off["ep_comm_s"] * alone / m * (1 - 1e-12)
    saved = off["iteration_time_s"] - on["iteration_time_s"]
    if p == 1:      # nothing else moves
        assert saved == pytest.approx(off["ep_comm_s"] - on["ep_comm_s"], rel=1e-9)
    else:           # the slowest stage's exchange, and the bubble's share of the others'
        assert saved >= (off["ep_comm_s"] - on["ep_comm_s"]) * (1 - 1e-9)


def test_overlap_of_one_micro_batch_has_nothing_to_pair():
    code0, off = _moe_run(_hw(ep=8, use_flash_attn=1), m=1)
    code1, on = _moe_run(_hw(ep=8, use_flash_attn=1, overlap_moe_expert_parallel_comm=1), m=1)
    assert code0 == code1 == records.OK and on["ep_comm_s"] == off["ep_comm_s"]


def test_overlap_by_hand_at_pp_1():
    """m micro-batches at pp = 1: one exposes its exchange, m - 1 expose what the exchange of an MoE
    layer takes beyond that layer's forward and backward."""
    (_, h, a, g, f, v, s), arch = _mixtral()
    hw = _hw(ep=8, use_flash_attn=1, overlap_moe_expert_parallel_comm=1)
    m = 8
    code, on = _moe_run(hw, m=m)
    mb = costs.micro_batch_costs(1.0, float(s), float(h), float(a), float(g), float(f), float(v), 1.0, hw, arch)
    x = mb.ep_forward_s + mb.ep_backward_s
    layer = mb.layer_forward_s + mb.layer_backward_s + mb.moe_layer_forward_extra_s + mb.moe_layer_backward_extra_s
    per_layer = (x + (m - 1) * max(0.0, x - layer)) / m
    assert on["ep_comm_s"] == pytest.approx(m * 8 * per_layer, rel=1e-12)


@pytest.mark.parametrize("settings, p, rc", [
    (dict(ep=1), 1, 0),                    # Megatron-core: only with expert parallelism
    (dict(ep=8, vpp=1), 2, 0),             # at pp > 1 only with the interleaved schedule
    (dict(ep=8), 1, 1),                    # not with full recomputation
])
def test_megatron_refusals_of_the_overlap(settings, p, rc):
    code, out = _moe_run(_hw(use_flash_attn=1, overlap_moe_expert_parallel_comm=1, **settings), p=p, rc=rc)
    assert code == records.REFUSED and out["iteration_time_s"] != out["iteration_time_s"]   # NaN
    # the same plan without the overlap is priced
    code, _ = _moe_run(_hw(use_flash_attn=1, **settings), p=p, rc=rc)
    assert code == records.OK


def test_overlap_has_no_effect_on_a_dense_model_nor_with_the_allgather_dispatcher():
    dense = [_run(LLAMA, _hw(use_flash_attn=1, overlap_moe_expert_parallel_comm=x, ep=8), d=8, B=64, rc=1)
             for x in (0, 1)]
    assert dense[0][0] == dense[1][0] == records.OK and dense[0][1] == dense[1][1]
    ag = dict(ep=8, use_flash_attn=1, moe_token_dispatcher_type=ALLGATHER)
    assert _moe_run(_hw(**ag)) == _moe_run(_hw(**ag, overlap_moe_expert_parallel_comm=1))


def test_a_spec_asking_the_overlap_with_the_allgather_dispatcher_only_is_refused(tmp_path):
    settings = {st.name: (st.default,) for st in BY_NAME.values()}
    settings["overlap_moe_expert_parallel_comm"] = (True,)
    settings["moe_token_dispatcher_type"] = ("allgather",)
    with pytest.raises(InputError) as err:
        check_requirements(tmp_path / "s.toml", settings)
    assert "moe_token_dispatcher_type" in str(err.value) and "alltoall" in str(err.value)
    settings["moe_token_dispatcher_type"] = ("alltoall", "allgather")
    check_requirements(tmp_path / "s.toml", settings)       # a choice: the allgather machines run it off


def test_fp8_grouped_gemm_is_one_launch_over_all_groups_tiles():
    hw = _hw(precision=1)
    one = ops.fp8_gemm_time_s(4096.0, 4096.0, 4096.0, hw)
    eight = ops.fp8_gemm_time_s(4096.0, 4096.0, 4096.0, hw, 8.0)
    overhead = hw[HW_FIELDS.index("kernel_overhead_s")]
    # large GEMMs fill the SMs alone: 8 groups take 8 times the work and one overhead
    assert eight == pytest.approx(8.0 * (one - overhead) + overhead, rel=1e-12)
    # small GEMMs (few rows per expert): the groups' tiles share the SMs, far below 8 separate GEMMs
    small1 = ops.fp8_gemm_time_s(128.0, 1536.0, 4096.0, hw)
    small8 = ops.fp8_gemm_time_s(128.0, 1536.0, 4096.0, hw, 8.0)
    assert small8 < 0.5 * 8.0 * small1
    assert experts.grouped_gemm_time_s(128.0, 1536.0, 4096.0, 8.0, hw) == small8
    assert comm.all_to_all_s(0.0, 1.0, 1.0, H100) == 0.0


@pytest.mark.parametrize("settings, share", [
    (dict(), 1.0),                                                          # balanced, dropless
    (dict(moe_load_imbalance=1.5), 1.5),                                    # the busiest expert 1.5 x
    (dict(moe_load_imbalance=1.5, moe_expert_capacity_factor=1.25), 1.25),  # capped by the capacity
    (dict(moe_expert_capacity_factor=1.25, moe_pad_expert_input_to_capacity=1), 1.25),   # padded up to it
    (dict(moe_expert_capacity_factor=0.5), 0.5),                            # half the tokens dropped
    (dict(moe_pad_expert_input_to_capacity=1), 1.0),                        # no capacity: nothing to pad to
])
def test_the_busiest_experts_share(settings, share):
    hw = _hw(ep=8, **settings)
    assert experts.moe_busiest_share(8.0, hw) == share
    (_, h, _, _, _, _, s), arch = _mixtral()
    routed, rows, local = experts.moe_rows(1.0, float(s), 1.0, hw, arch)
    assert rows == pytest.approx(routed * arch.moe_router_topk / local * share, rel=1e-15)


def test_load_imbalance_slows_the_experts_and_the_exchange_and_not_the_model_flops():
    code0, even = _moe_run(_hw(ep=8, use_flash_attn=1))
    code1, skew = _moe_run(_hw(ep=8, use_flash_attn=1, moe_load_imbalance=1.5))
    assert code0 == code1 == records.OK
    assert skew["compute_s"] > even["compute_s"] and skew["ep_comm_s"] > even["ep_comm_s"]
    assert skew["activations_GiB"] > even["activations_GiB"]
    flops = lambda o: o["model_tflops_per_gpu"] * o["iteration_time_s"]    # noqa: E731
    assert flops(skew) == pytest.approx(flops(even), rel=1e-12) and skew["mfu"] < even["mfu"]
    # a dense model: no effect
    dense = [_run(LLAMA, _hw(use_flash_attn=1, moe_load_imbalance=x, moe_expert_capacity_factor=c), d=8, B=64)[1]
             for x, c in ((1.0, 0.0), (2.0, 0.5))]
    assert dense[0] == dense[1]


def test_capacity_and_imbalance_in_a_spec_and_in_evaluate(tmp_path):
    import polars as pl
    from test_setting_axes import ONE_POINT_SPEC
    from vtrain_fast.analysis.evaluate import evaluate_frame
    from vtrain_fast.plan.spec import parse_spec
    spec = parse_spec(ONE_POINT_SPEC.format(training="moe_load_imbalance = [1.0, 1.5]\nmoe_expert_capacity_factor = 1.25"),
                      "s.toml")
    assert [(g.moe_load_imbalance, g.moe_expert_capacity_factor) for g in spec.gpus] == [(1.0, 1.25), (1.5, 1.25)]
    for bad in ("moe_load_imbalance = 0.5", "moe_expert_capacity_factor = -1", "moe_load_imbalance = true"):
        with pytest.raises(InputError, match=r"training\.moe_") as e:
            parse_spec(ONE_POINT_SPEC.format(training=bad), "s.toml")
        assert "e.g." in str(e.value)
    row = dict(model="mixtral-8x7b", num_layers=32, hidden_size=4096, num_attention_heads=32, num_query_groups=8,
               ffn_hidden_size=14336, vocab_size=32000, seq_length=4096, num_experts=8, moe_router_topk=2,
               gated_mlp="true", global_batch_size=64, micro_batch_size=1, tp=1, pp=4, dp=16, ep=8,
               gpu="h100-sxm-80gb", use_flash_attn="true")
    df = pl.DataFrame([row, {**row, "moe_load_imbalance": 1.5}, {**row, "moe_expert_capacity_factor": 1.0,
                                                                   "moe_load_imbalance": 1.5}])
    out = evaluate_frame(df, "rows.csv")
    assert out["moe_load_imbalance"].to_list() == [1.0, 1.5, 1.5]
    t = out["iteration_time_s"].to_list()
    assert t[0] == t[2] < t[1]          # capacity 1.0 drops the busiest expert's excess: balanced again
    with pytest.raises(InputError, match="moe_load_imbalance"):
        evaluate_frame(pl.DataFrame([{**row, "moe_load_imbalance": 0.9}]), "rows.csv")


def test_imbalance_needs_expert_parallelism_and_stops_at_every_token():
    """At ep = 1 every rank holds every expert and computes all its tokens' k copies, however they
    spread; at ep > 1 one rank can get at most every token (share ep)."""
    assert experts.moe_busiest_share(1.0, _hw(ep=1, moe_load_imbalance=3.0)) == 1.0
    assert experts.moe_busiest_share(8.0, _hw(ep=8, moe_load_imbalance=20.0)) == 8.0
    assert experts.moe_busiest_share(1.0, _hw(ep=1, moe_load_imbalance=3.0, moe_expert_capacity_factor=0.5)) == 0.5
    one = [_moe_run(_hw(ep=1, use_flash_attn=1, moe_load_imbalance=x))[1] for x in (1.0, 3.0)]
    assert one[0] == one[1]


def test_evaluate_refuses_true_false_in_a_number_column():
    import polars as pl
    from vtrain_fast.analysis.evaluate import evaluate_frame
    row = dict(model="mixtral-8x7b", seq_length=4096, gpu="h100-sxm-80gb", tp=1, pp=1, dp=8, micro_batch_size=1,
               global_batch_size=64, ep=8)
    with pytest.raises(InputError, match="moe_expert_capacity_factor") as e:
        evaluate_frame(pl.DataFrame([{**row, "moe_expert_capacity_factor": True}]), "rows.csv")
    assert e.value.fix


def test_a_dense_sweep_over_the_moe_settings_is_not_told_they_are_unvalidated():
    from test_setting_axes import ONE_POINT_SPEC
    from vtrain_fast.plan.spec import parse_spec, unvalidated_settings
    dense = parse_spec(ONE_POINT_SPEC.format(training="moe_load_imbalance = [1.0, 1.5]"), "s.toml")
    assert not any("MoE" in u for u in unvalidated_settings(dense))
