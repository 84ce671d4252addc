"""`vtrain-fast show` (issue 14): one plan part by part. Memory per stage sums to the kernel's
memory_per_gpu_GiB, the parts follow the byte counts by hand, the event timeline runs Megatron's 1F1B
orders without overlaps and in dependency order, and its flush agrees with the kernel's pipeline time."""
from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from vtrain_fast.analysis.evaluate import evaluate_frame
from vtrain_fast.analysis.show import MEMORY_PARTS, TIME_PARTS, plot_timeline, show_plan, simulate_pipeline
from vtrain_fast.cli import app

GiB = 1024.0 ** 3
BASE = dict(micro_batch_size=1, use_flash_attn="true")
PLANS = {
    # dense GPT-3, pp 8 interleaved (vpp 2), full recomputation, the distributed optimizer
    "gpt3_vpp2_full": dict(model="gpt3-175b", gpu="a100-sxm4-80gb", global_batch_size=1536, tp=8, pp=8, dp=12,
                           vpp=2, recompute="full", use_flash_attn="false", distributed_optimizer="true"),
    # Llama-3-70B with ZeRO-1, and with ZeRO-3 (gathered layers) on an uneven first stage, FP8 with bf16 ends
    "llama_zero1": dict(model="llama3-70b", gpu="h100-sxm-80gb", global_batch_size=512, tp=4, pp=4, dp=8,
                        sequence_parallel="true", zero_stage=1, recompute="selective"),
    "llama_zero3_uneven": dict(model="llama3-70b", gpu="h100-sxm-80gb", global_batch_size=512, tp=4, pp=4, dp=8,
                               sequence_parallel="true", precision="fp8", fp8_recipe="tensorwise",
                               num_layers_at_start_in_bf16=1, num_layers_at_end_in_bf16=1, zero_stage=3,
                               first_pipeline_num_layers=23, recompute="selective"),
    # Mixtral 8x7B: expert parallelism 8, interleaved
    "mixtral_ep8": dict(model="mixtral-8x7b", seq_length=4096, gpu="h100-sxm-80gb", global_batch_size=256, tp=2,
                        pp=2, dp=16, vpp=2, ep=8, etp=1, sequence_parallel="true", recompute="selective"),
    # plain 1F1B on an uneven first stage, no recomputation
    "gpt3_uneven_1f1b": dict(model="gpt3-175b", gpu="a100-sxm4-80gb", global_batch_size=512, tp=8, pp=8, dp=4,
                             first_pipeline_num_layers=5, recompute="full", distributed_optimizer="true"),
}
_CACHE: dict = {}


def _row(name: str) -> dict:
    out = evaluate_frame(pl.DataFrame([{**BASE, **PLANS[name]}]), name)
    assert out["status"][0] in ("ok", "out_of_memory"), out["status"][0]
    return out.row(0, named=True)


def _detail(name: str):
    if name not in _CACHE:
        row = _row(name)
        _CACHE[name] = (row, show_plan(row))
    return _CACHE[name]


@pytest.mark.parametrize("name", sorted(PLANS))
def test_the_fullest_stage_sums_to_the_kernels_memory(name):
    row, d = _detail(name)
    mem = d.memory
    assert mem.height == row["pp"]
    parts = mem.select(MEMORY_PARTS).to_numpy()
    assert np.allclose(parts.sum(axis=1), mem["total_GiB"].to_numpy(), rtol=1e-12)
    assert (parts >= 0.0).all()
    assert mem["total_GiB"].max() == pytest.approx(row["memory_per_gpu_GiB"], rel=1e-9)
    states = mem.select("weights_GiB", "gradients_GiB", "optimizer_GiB", "fp8_weights_GiB", "gathered_GiB")
    fullest = int(mem["total_GiB"].arg_max())
    assert sum(states.row(fullest)) == \
        pytest.approx(row["model_states_GiB"], rel=1e-9)


def test_the_time_parts_sum_to_the_iteration():
    row, d = _detail("gpt3_vpp2_full")
    assert sum(d.time_s[k] for k in TIME_PARTS) == pytest.approx(row["iteration_time_s"], rel=1e-12)
    assert d.time_s["iteration_time_s"] == pytest.approx(row["iteration_time_s"], rel=1e-12)


def test_memory_by_hand_for_a_small_dense_plan():
    h, L, v, s = 256, 4, 1024, 128
    row = evaluate_frame(pl.DataFrame([dict(num_layers=L, hidden_size=h, num_attention_heads=4, seq_length=s,
                                            vocab_size=v, gpu="a100-sxm4-80gb", global_batch_size=8,
                                            micro_batch_size=1, tp=1, pp=2, dp=1, recompute="none")]), "small")
    d = show_plan(row.row(0, named=True))
    layer = 12 * h * h + 13 * h                        # GPT layer: QKV, projection, MLP (f = 4h), two norms
    first = 2 * layer + v * h + s * h                  # + word and learned position embeddings
    last = 2 * layer + v * h + 2 * h                   # + the tied head's copy and the final norm
    for stage, params in ((0, first), (1, last)):
        r = d.memory.row(stage, named=True)
        assert r["weights_GiB"] * GiB == pytest.approx(2.0 * params, rel=1e-12)
        assert r["gradients_GiB"] * GiB == pytest.approx(4.0 * params, rel=1e-12)    # fp32 main gradients
        assert r["optimizer_GiB"] * GiB == pytest.approx(12.0 * params, rel=1e-12)
        assert r["gathered_GiB"] == 0.0 and r["fp8_weights_GiB"] == 0.0
    # 1F1B: the first stage holds min(p, m) = 2 micro-batches of its layers, the last one
    assert d.stages["in_flight"].to_list() == [2.0, 1.0]
    a0, a1 = d.memory["activations_GiB"].to_list()
    assert a0 == pytest.approx(2.0 * a1, rel=1e-12)


@pytest.mark.parametrize("vpp", [1, 2, 4])
def test_equal_stages_simulate_to_the_analytic_pipeline_exactly(vpp):
    p, m = 4, 8
    fwd, bwd, rec, send = 1.0, 2.0, 0.5, 0.125
    ev = simulate_pipeline([fwd] * p, [bwd] * p, [send] * p, m, vpp, [rec] * p)
    per_stage = fwd + bwd + rec + 2.0 * vpp * send        # T: one micro-batch, all chunks, both directions
    flush = max(e[2] for e in ev)
    assert flush == pytest.approx(m * per_stage + (p - 1) * per_stage / vpp, rel=1e-12)
    assert len([e for e in ev if e[3] == "forward"]) == p * m * vpp


@pytest.mark.parametrize("name", sorted(PLANS))
def test_the_timeline_agrees_with_the_kernels_pipeline(name):
    row, d = _detail(name)
    # equal stages but for the embedding / head: within 0.5 %; uneven stages within 2 %
    tol = 0.02 if "uneven" in name else 0.005
    assert d.simulated_pipeline_s == pytest.approx(d.pipeline_s, rel=tol)
    assert d.makespan_s == pytest.approx(row["iteration_time_s"], rel=tol)


@pytest.mark.parametrize("name", ["gpt3_vpp2_full", "mixtral_ep8", "gpt3_uneven_1f1b"])
def test_events_never_overlap_and_follow_the_pipeline(name):
    row, d = _detail(name)
    ev = d.events
    p, vpp = row["pp"], max(1, row.get("vpp") or 1)
    m = row["global_batch_size"] // (row["dp"] * row["micro_batch_size"])
    for stage in range(p):
        e = ev.filter(pl.col("stage") == stage).sort("start_s")
        assert (e["end_s"] >= e["start_s"]).all()
        assert (e["start_s"][1:].to_numpy() >= e["end_s"][:-1].to_numpy() - 1e-12).all()
        assert e.filter(pl.col("kind") == "forward").height == m * vpp
        assert e.filter(pl.col("kind") == "backward").height == m * vpp
    fw = ev.filter(pl.col("kind") == "forward")
    sends = ev.filter(pl.col("kind") == "send")
    ends = {(r, j, c): t for r, t, j, c in fw.select("stage", "end_s", "micro_batch", "chunk").iter_rows()}
    starts = {(r, j, c): t for r, t, j, c in fw.select("stage", "start_s", "micro_batch", "chunk").iter_rows()}
    send_s = float((sends["end_s"] - sends["start_s"]).max())
    for (r, j, c), t in starts.items():
        prev = (r - 1, j, c) if r > 0 else ((p - 1, j, c - 1) if c > 0 else None)
        if prev is not None:
            assert t >= ends[prev] + send_s - 1e-9
    # warm-up: Megatron's first backward on stage r after p - r - 1 forwards (interleaved (p-r-1) 2 + (vpp-1) p)
    for stage in range(p):
        kinds = ev.filter((pl.col("stage") == stage) & pl.col("kind").is_in(["forward", "backward"])).sort("start_s")
        first_b = kinds["kind"].to_list().index("backward")
        warm = p - stage - 1 if vpp == 1 else (p - stage - 1) * 2 + (vpp - 1) * p
        assert first_b == min(warm, m * vpp) + 1


def test_the_timeline_png_is_written_and_drawn(tmp_path):
    _, d = _detail("mixtral_ep8")
    path = tmp_path / "t.png"
    plot_timeline(d, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 20_000
    import matplotlib.image as mpimg
    img = mpimg.imread(path)
    colours = np.unique((img[..., :3] * 255).astype(np.uint8).reshape(-1, 3), axis=0)
    assert len(colours) > 50


def test_cli_show_writes_tables_and_refuses_bad_input(tmp_path):
    csv = tmp_path / "plan.csv"
    pl.DataFrame([{**BASE, **PLANS["mixtral_ep8"]}]).write_csv(csv)
    runner = CliRunner()
    r = runner.invoke(app, ["show", str(csv), "-o", str(tmp_path / "mem.csv"), "--events", str(tmp_path / "ev.parquet"),
                            "--timeline", str(tmp_path / "t.png")], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "memory per GPU by pipeline stage" in r.output and "iteration_time_s" in r.output
    mem = pl.read_csv(tmp_path / "mem.csv")
    assert mem.height == 2 and set(MEMORY_PARTS) <= set(mem.columns)
    assert pl.read_parquet(tmp_path / "ev.parquet").height > 0 and (tmp_path / "t.png").stat().st_size > 0
    for args in (["show", str(csv), "--timeline", str(tmp_path / "t.jpg")],
                 ["show", str(tmp_path / "nope.txt")],
                 ["show", str(csv), "-o", str(tmp_path / "mem.xlsx")],
                 ["show", str(csv), "--row", "3"],
                 ["show", str(csv), "--where", "tp==2"]):
        r = runner.invoke(app, args)
        assert r.exit_code == 2, (args, r.output)
        assert "error:" in r.output and "Traceback" not in r.output
