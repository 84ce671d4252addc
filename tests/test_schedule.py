"""`vtrain-fast schedule` and `trace` (issue 15): the curves against the cost model priced point by
point, the policies' rules by hand, the replay's invariants (GPUs conserved at every instant, work
conserved, never faster than the curve), one job alone, deadlines met alone are met, determinism,
bad input."""
from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from conftest import flat
from vtrain_fast.analysis.evaluate import evaluate_frame
from vtrain_fast.analysis.optimal import DEFAULT_SETTINGS
from vtrain_fast.cli import app
from vtrain_fast.io.errors import InputError
from vtrain_fast.plan.spec import RECOMPUTE_VALUES
from vtrain_fast.schedule.curves import job_curves
from vtrain_fast.schedule.generate import generate_trace
from vtrain_fast.schedule.policies import elastic, fifo, next_faster
from vtrain_fast.schedule.replay import JobState, replay
from vtrain_fast.schedule.trace import read_trace

GPU, NODES = "a100-sxm4-80gb", 16          # a 128-GPU cluster keeps the sweeps small
KINDS = [("gpt3-1.3b", 512), ("gpt3-6.7b", 512), ("gpt3-13b", 512)]
runner = CliRunner()


@pytest.fixture(scope="module")
def curves():
    return job_curves(KINDS, GPU, NODES * 8)


def _trace(tmp_path, rows, name="t.csv") -> pl.DataFrame:
    path = tmp_path / name
    pl.DataFrame(rows).write_csv(path)
    return read_trace(path)


def test_curves_are_the_cost_model_point_by_point(curves):
    rng = np.random.default_rng(0)
    ok = np.argwhere(np.isfinite(curves.step_s))
    pick = ok[rng.choice(len(ok), 12, replace=False)]
    rows = []
    for k, f, n in pick:
        tp, pp, mbs, rc = (int(v) for v in curves.families[f])
        m, gbs = curves.kinds[k]
        rows.append(dict(model=m, gpu=GPU, global_batch_size=gbs, micro_batch_size=mbs, tp=tp, pp=pp,
                         dp=n * 8 // (tp * pp), recompute=RECOMPUTE_VALUES[rc], **DEFAULT_SETTINGS))
    again = evaluate_frame(pl.DataFrame(rows), "replay")
    assert (again["status"] == "ok").all()
    want = [curves.step_s[k, f, n] for k, f, n in pick]
    np.testing.assert_allclose(again["iteration_time_s"].to_numpy(), want, rtol=1e-12)
    # the stored index gives the same row
    k, f, n = pick[0]
    assert curves.row(int(k), int(f), int(n))["iteration_time_s"] == pytest.approx(want[0], rel=1e-12)


def test_a_curve_is_the_best_plan_per_size_made_monotone(curves):
    for kind in range(len(KINDS)):
        t, used, fam = curves.curve(kind)
        raw = curves.step_s[kind].min(axis=0)
        assert np.all(np.diff(t[1:]) <= 0)                       # more nodes never slower
        for k in range(1, NODES + 1):
            assert t[k] == raw[: k + 1].min() and used[k] <= k
            if np.isfinite(t[k]):
                assert curves.step_s[kind, fam[k], used[k]] == t[k]
        f = curves.smallest_family(kind)
        first = int(np.flatnonzero(np.isfinite(raw))[0])
        assert curves.step_s[kind, f, first] == raw[first]      # fastest on the fewest nodes that fit
        td, _, famd = curves.curve(kind, f)
        assert np.isin(famd[np.isfinite(td)], curves.same_plan(f)).all() and np.all(td >= t)


def test_next_faster_by_hand():
    inf = math.inf
    t = np.array([inf, inf, 5.0, 5.0, 3.0, 3.0, 3.0, 2.0])
    assert next_faster(t).tolist() == [2, 2, 4, 4, 7, 7, 7, 8]


def _job(job_id, step_s, remaining, deadline_s=math.inf, arrival_s=0.0, **kw):
    step_s = np.asarray(step_s, dtype=float)
    used = np.array([0] + [int(np.argmin(step_s[: k + 1])) for k in range(1, len(step_s))])
    fam = np.where(used > 0, 0, -1)
    return JobState(job_id=job_id, arrival_s=arrival_s, deadline_s=deadline_s, priority=0, steps=remaining,
                    step_s=step_s, used=used, family_of=fam, next_faster=next_faster(step_s), remaining=remaining, **kw)


def test_elastic_rule_by_hand():
    inf = math.inf
    # a: 100 steps, 4 s/step on 1 node, 2 on 2, 1 on 4; b: the same curve, 50 steps
    t = [inf, 4.0, 2.0, 2.0, 1.0]
    a = _job("a", t, 100, deadline_s=250.0)     # needs 2 nodes (200 s) to meet 250 s
    b = _job("b", t, 50, deadline_s=300.0)      # 1 node (200 s) meets 300 s
    alloc = elastic(0.0, [a, b], 4, 0.0)
    # shares a 2, b 1; the last node: b 1 -> 2 buys 1/100 - 1/200 = 0.005 per node; a 2 -> 4 needs 2
    assert alloc == {"a": 2, "b": 2}
    # one node only: no share of a meets its deadline within it; b gets its 1
    alloc = elastic(0.0, [a, b], 1, 0.0)
    assert alloc == {"a": 0, "b": 1}
    # no deadlines: marginal returns alone; the shorter job first
    c, d = _job("c", t, 10), _job("d", t, 1000)
    # c: 0 -> 1 -> 2 nodes buy 0.025 / node each, 2 -> 4 0.025 / node; d's first node 0.00025
    assert elastic(0.0, [c, d], 4, 0.0) == {"c": 4, "d": 0}
    # a restart makes a change dearer: b started on 1 node keeps it when the gain is smaller than
    # the restart costs (restart 1e4 s: 1/(1e4 + 100) - 1/200 < 0)
    b.started, b.nodes, b.family = True, 1, 0
    assert elastic(0.0, [b], 4, 1e4) == {"b": 1}


def test_fifo_rule_by_hand():
    inf = math.inf
    t = [inf, 4.0, 2.0, 2.0, 1.0]
    a, b, c = _job("a", t, 10, arrival_s=0.0), _job("b", t, 10, arrival_s=1.0), _job("c", t, 10, arrival_s=2.0)
    a.request, b.request, c.request = 2, 3, 1
    assert fifo(0.0, [a, b, c], 4, 0.0) == {"a": 2}        # b does not fit and blocks c
    a.started, a.nodes = True, 2
    assert fifo(5.0, [a, b, c], 5, 0.0) == {"a": 2, "b": 3}


def _check_invariants(rep, curves, trace):
    seg = rep.segments
    # GPUs conserved at every instant: the sum over segments covering each boundary
    edges = np.unique(np.concatenate([seg["start_hours"].to_numpy(), seg["end_hours"].to_numpy()]))
    for t in edges:
        live = seg.filter((pl.col("start_hours") <= t) & (pl.col("end_hours") > t))
        assert live["num_gpus"].sum() <= curves.num_nodes * curves.gpus_per_node
    assert rep.max_gpus_held <= curves.num_nodes * curves.gpus_per_node
    # every job does exactly its steps, each stretch at a step time its curve has for that plan
    steps = dict(zip(rep.jobs["job_id"], rep.jobs["num_steps"]))
    kinds = {r["job_id"]: curves.kind(r["model"], r["global_batch_size"]) for r in trace.iter_rows(named=True)}
    done = {}
    for s in seg.iter_rows(named=True):
        run_h = s["end_hours"] - max(s["start_hours"], s["restart_until_hours"])
        done[s["job_id"]] = done.get(s["job_id"], 0.0) + max(0.0, run_h) * 3600 / s["step_s"]
        best = np.nanmin(curves.step_s[kinds[s["job_id"]]])
        assert s["step_s"] >= best * (1 - 1e-12)                # never faster than its fastest plan
        nodes = s["num_gpus"] // curves.gpus_per_node
        kind = kinds[s["job_id"]]
        allowed = (np.arange(len(curves.families)) if rep.policy != "dp-only"
                   else curves.same_plan(curves.smallest_family(kind)))
        assert s["step_s"] in curves.step_s[kind, allowed, nodes]
    for r in rep.jobs.filter(pl.col("status") == "done").iter_rows(named=True):
        assert done[r["job_id"]] == pytest.approx(steps[r["job_id"]], rel=1e-6)
        assert r["finish_hours"] >= r["start_hours"] >= r["arrival_hours"]


@pytest.mark.parametrize("policy", ["plan-aware", "dp-only", "fifo"])
def test_replay_invariants_on_a_generated_trace(curves, policy):
    trace = generate_trace(24, GPU, NODES * 8, seed=3, mean_interarrival_hours=0.3, curves=_mix(curves))
    trace = trace.filter(pl.col("model").is_in([m for m, _ in KINDS]))
    rep = replay(trace, curves, policy, restart_s=120.0, usd_per_gpu_hour=2.0)
    assert rep.jobs.height == trace.height and (rep.jobs["status"] == "done").all()
    _check_invariants(rep, curves, trace)
    s = rep.summary
    jct = np.sort(rep.jobs["jct_hours"].to_numpy())
    assert s["mean_jct_hours"] == pytest.approx(jct.mean()) and s["p90_jct_hours"] == jct[math.ceil(0.9 * jct.size) - 1]
    assert s["makespan_hours"] == pytest.approx(rep.jobs["finish_hours"].max() - rep.jobs["arrival_hours"].min())
    assert 0 < s["gpu_utilisation"] <= 1 + 1e-9
    assert s["cost_usd"] == pytest.approx(rep.jobs["gpu_hours"].sum() * 2.0)
    met = (rep.jobs["finish_hours"] <= rep.jobs["deadline_hours"] * (1 + 1e-12))
    assert (rep.jobs["deadline_met"] == met).all() and s["deadlines_met"] == int(met.sum())
    if policy == "fifo":
        assert s["restarts"] == 0 and (rep.jobs["first_plan"] == rep.jobs["last_plan"]).all()


def _mix(curves):
    """Curves for the generator's model mix (it needs every model of MODEL_MIX)."""
    from vtrain_fast.schedule.generate import MODEL_MIX
    return job_curves([(m, 512) for m in MODEL_MIX], GPU, NODES * 8)


@pytest.mark.parametrize("policy", ["plan-aware", "dp-only"])
def test_one_job_alone_gets_its_fastest_plan(tmp_path, curves, policy):
    trace = _trace(tmp_path, [dict(job_id="only", arrival_hours=1.0, model="gpt3-6.7b", num_tokens=5e9)])
    rep = replay(trace, curves, policy)
    kind = curves.kind("gpt3-6.7b", 512)
    fam = None if policy == "plan-aware" else curves.smallest_family(kind)
    t, used, _ = curves.curve(kind, fam)
    seg = rep.segments
    assert seg.height == 1 and seg["step_s"][0] == t[NODES] == np.nanmin(t)
    assert seg["num_gpus"][0] == used[NODES] * 8
    steps = math.ceil(5e9 / (512 * 2048))
    assert rep.jobs["finish_hours"][0] == pytest.approx(1.0 + steps * t[NODES] / 3600, rel=1e-12)
    assert rep.jobs["restarts"][0] == 0


def test_a_deadline_met_alone_is_met_under_plan_aware(tmp_path, curves):
    kind = curves.kind("gpt3-13b", 512)
    best = np.nanmin(curves.step_s[kind])
    steps = math.ceil(2e10 / (512 * 2048))
    alone_h = steps * best / 3600
    rows = [dict(job_id=f"j{i}", arrival_hours=i * 2 * alone_h, model="gpt3-13b", num_tokens=2e10,
                 deadline_hours=i * 2 * alone_h + 1.01 * alone_h) for i in range(3)]
    rep = replay(_trace(tmp_path, rows), curves, "plan-aware")
    assert rep.jobs["deadline_met"].all()
    # and a job just too short of time misses (the check can fail)
    rows = [dict(job_id="late", arrival_hours=0.0, model="gpt3-13b", num_tokens=2e10, deadline_hours=0.99 * alone_h)]
    assert not replay(_trace(tmp_path, rows, "late.csv"), curves, "plan-aware").jobs["deadline_met"][0]


def test_deterministic_for_a_seed(curves):
    mix = _mix(curves)
    a = generate_trace(16, GPU, NODES * 8, seed=7, curves=mix)
    b = generate_trace(16, GPU, NODES * 8, seed=7, curves=mix)
    c = generate_trace(16, GPU, NODES * 8, seed=8, curves=mix)
    assert a.equals(b) and not a.equals(c)
    ra = replay(a, mix, "plan-aware")
    rb = replay(b, mix, "plan-aware")
    assert ra.jobs.equals(rb.jobs) and ra.segments.equals(rb.segments)


def test_the_generator_states_its_sizes(curves):
    mix = _mix(curves)
    tr = generate_trace(40, GPU, NODES * 8, seed=1, curves=mix)
    assert tr["arrival_hours"][0] == 0 and (tr["arrival_hours"].diff().drop_nulls() >= 0).all()
    for r in tr.iter_rows(named=True):
        t, used, _ = mix.curve(mix.kind(r["model"], 512))
        nodes = r["num_gpus"] // 8
        hours = r["num_tokens"] / (512 * 2048) * t[nodes] / 3600
        assert 2.0 * 0.99 <= hours <= 24.0 * 1.01
        assert 1.2 * hours * 0.999 <= r["deadline_hours"] - r["arrival_hours"] <= 2.0 * hours * 1.001


def test_trace_refuses_a_negative_seed(tmp_path):
    r = runner.invoke(app, ["trace", "-o", str(tmp_path / "t.csv"), "--seed", "-1", "--cluster", f"{GPU}:128"])
    assert r.exit_code == 2 and "--seed" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "t.csv").exists()


def test_cli_writes_a_folder_with_its_manifest(tmp_path):
    trace = tmp_path / "t.csv"
    r = runner.invoke(app, ["trace", "-o", str(trace), "--jobs", "12", "--cluster", f"{GPU}:128", "--seed", "2"])
    assert r.exit_code == 0, r.output
    out = tmp_path / "out"
    r = runner.invoke(app, ["schedule", str(trace), "--cluster", f"{GPU}:128", "-o", str(out)])
    assert r.exit_code == 0, r.output
    text = flat(r.output)
    assert "plan-aware against dp-only" in text and "deadlines_met" in text
    import json
    man = json.loads((out / "manifest.json").read_text())
    assert set(man["files"]) == {"jobs.parquet", "segments.parquet", "summary.parquet", "gantt-plan-aware.png",
                                 "gantt-dp-only.png", "gantt-fifo.png"}
    jobs = pl.read_parquet(out / "jobs.parquet")
    assert jobs.height == 36 and set(jobs["policy"]) == {"plan-aware", "dp-only", "fifo"}
    assert (out / "gantt-fifo.png").read_bytes()[:4] == b"\x89PNG"
    r = runner.invoke(app, ["schedule", str(trace), "--cluster", f"{GPU}:128", "-o", str(out)])
    assert r.exit_code == 2 and "--overwrite" in r.output


@pytest.mark.parametrize("rows,needles", [
    ([dict(job_id="a", arrival_hours=0, model="gpt3-13", num_tokens=1e9)], ["row 1 column model", "gpt3-13b"]),
    ([dict(job_id="a", arrival_hours=5, model="gpt3-13b", num_tokens=1e9, deadline_hours=4)],
     ["row 1 column deadline_hours", "absolute"]),
    ([dict(job_id="a", arrival_hours=0, model="gpt3-13b")], ["num_tokens"]),
    ([dict(job_id="a", arrival_hours=0, model="gpt3-13b", num_tokens=1e9),
      dict(job_id="a", arrival_hours=1, model="gpt3-13b", num_tokens=1e9)], ["job_id", "unique"]),
    ([dict(job_id="a", arrival_hours="soon", model="gpt3-13b", num_tokens=1e9)], ["row 1 column arrival_hours"]),
    ([dict(job_id="a", arrival_hours=0, model="gpt3-13b", num_tokens=1e9, deadline=3)], ["column deadline",
                                                                                          "deadline_hours"]),
    ([dict(job_id="a", arrival_hours=0, model="gpt3-13b", num_tokens=1e300)], ["row 1 column num_tokens", "at most"]),
    ([dict(job_id="a", arrival_hours=1e306, model="gpt3-13b", num_tokens=1e9)], ["row 1 column arrival_hours"]),
    ([dict(job_id="a", arrival_hours=0, model="gpt3-13b", num_steps=2.5)], ["row 1 column num_steps", "whole"]),
])
def test_bad_traces_exit_2(tmp_path, rows, needles):
    path = tmp_path / "bad.csv"
    pl.DataFrame(rows).write_csv(path)
    r = runner.invoke(app, ["schedule", str(path), "--cluster", f"{GPU}:128"])
    assert r.exit_code == 2, r.output
    text = flat(r.output)
    assert "Traceback" not in text and str(path) in text
    for n in needles:
        assert n in text, (n, text)


@pytest.mark.parametrize("args,needle", [
    (["--cluster", "a100:128"], "did you mean"), (["--cluster", f"{GPU}:100"], "whole number of nodes"),
    (["--cluster", "1024"], "GPU:COUNT"), (["--cluster", f"{GPU}:128", "--policy", "sjf"], "--policy"),
    (["--cluster", f"{GPU}:128", "--restart-s", "-1"], "--restart-s"),
    (["--cluster", f"{GPU}:{8 * 5000}"], "at most 4,096 nodes"),
])
def test_bad_options_exit_2(tmp_path, args, needle):
    path = tmp_path / "t.csv"
    pl.DataFrame([dict(job_id="a", arrival_hours=0, model="gpt3-1.3b", num_tokens=1e9)]).write_csv(path)
    r = runner.invoke(app, ["schedule", str(path), *args])
    assert r.exit_code == 2 and needle in flat(r.output) and "Traceback" not in r.output, r.output


def test_a_model_that_fits_nowhere_is_infeasible_not_an_error(tmp_path):
    small = job_curves([("gpt3-175b", 512), ("gpt3-1.3b", 512)], GPU, 8)
    trace = _trace(tmp_path, [dict(job_id="big", arrival_hours=0, model="gpt3-175b", num_tokens=1e9),
                              dict(job_id="ok", arrival_hours=0, model="gpt3-1.3b", num_tokens=1e9)])
    rep = replay(trace, small, "plan-aware")
    assert dict(zip(rep.jobs["job_id"], rep.jobs["status"])) == {"big": "infeasible", "ok": "done"}
    assert rep.summary["infeasible"] == 1
    with pytest.raises(InputError):
        replay(trace, small, "nope")


def test_restarts_favour_the_status_quo_and_a_restart_under_way_counts():
    inf = math.inf
    t = [inf, 4.0, 2.0, 2.0, 1.0]
    for rs in (0.0, 300.0, 1e6):          # b runs on 4 nodes; an identical c arrives: b keeps them
        b, c = _job("b", t, 1000), _job("c", t, 1000)
        b.started, b.nodes, b.family = True, 4, 0
        assert elastic(0.0, [b, c], 4, rs)["b"] == 4, rs
    # a job in the middle of a 1,000 s restart cannot meet a 250 s deadline on its own nodes
    a = _job("a", t, 100, deadline_s=250.0)
    a.started, a.nodes, a.family, a.paused_until = True, 2, 0, 1000.0
    from vtrain_fast.schedule.policies import _remaining_s
    assert _remaining_s(a, 2, 0.0, 1000.0) == 1000.0 + 200.0
    assert _remaining_s(a, 2, 600.0, 1000.0) == 400.0 + 200.0


def test_edf_gives_the_earlier_deadline_its_share_first(tmp_path, curves):
    """A long job runs on the whole cluster when one due soon arrives: plan-aware gives the one due
    first the nodes its deadline needs (the long one is preempted and still meets its own); fifo
    lets it wait behind the long job, and it misses."""
    kind = curves.kind("gpt3-13b", 512)
    t, _, _ = curves.curve(kind)
    full_h = math.ceil(2e10 / (512 * 2048)) * t[NODES] / 3600      # alone on the whole cluster
    rows = [dict(job_id="long", arrival_hours=0.0, model="gpt3-13b", num_tokens=2e10, deadline_hours=100 * full_h,
                 num_gpus=NODES * 8),
            dict(job_id="due-soon", arrival_hours=0.1 * full_h, model="gpt3-13b", num_tokens=2e10,
                 deadline_hours=0.1 * full_h + 1.2 * full_h, num_gpus=NODES * 8)]
    tr = _trace(tmp_path, rows)
    rep = replay(tr, curves, "plan-aware", restart_s=60.0)
    assert dict(zip(rep.jobs["job_id"], rep.jobs["deadline_met"])) == {"long": True, "due-soon": True}
    assert rep.jobs.filter(pl.col("job_id") == "long")["restarts"][0] >= 1          # it was preempted
    fifo_rep = replay(tr, curves, "fifo", restart_s=60.0)
    assert dict(zip(fifo_rep.jobs["job_id"], fifo_rep.jobs["deadline_met"])) == {"long": True, "due-soon": False}


def test_dp_only_keeps_the_plan_but_not_the_micro_batch(curves):
    kind = curves.kind("gpt3-1.3b", 512)
    f = curves.smallest_family(kind)
    t, _, fam = curves.curve(kind, f)
    fams = curves.families[fam[np.isfinite(t)]]
    assert (fams[:, [0, 1, 3]] == curves.families[f, [0, 1, 3]]).all()
    assert len(set(fams[:, 2])) > 1 or curves.families[f, 2] == 1   # the micro-batch follows dp
    assert np.isfinite(t[NODES])                                     # it scales to the whole cluster


def test_a_request_too_small_for_the_model_is_raised_to_the_fewest_nodes_that_fit(tmp_path):
    small = job_curves([("gpt3-13b", 512)], GPU, 32)
    rows = [dict(job_id="a", arrival_hours=0, model="gpt3-13b", num_tokens=1e9, num_gpus=1)]
    rep = replay(_trace(tmp_path, rows), small, "fifo")
    first = int(np.flatnonzero(np.isfinite(small.curve(0)[0]))[0])
    assert rep.jobs["status"][0] == "done" and rep.segments["num_gpus"][0] == small.curve(0)[1][first] * 8


def test_a_late_arrival_and_a_tiny_job_still_finish(tmp_path, curves):
    for arrival in (1e4, 1e5, 9.9e5):
        rows = [dict(job_id="a", arrival_hours=arrival, model="gpt3-1.3b", num_steps=2)]
        rep = replay(_trace(tmp_path, rows), curves, "plan-aware")
        assert rep.jobs["status"][0] == "done" and rep.jobs["finish_hours"][0] > arrival


def test_cells_are_read_as_written(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("job_id,arrival_hours,model,num_steps,num_gpus,priority\n007,0,gpt3-1.3b,1e3,8.0,1\n"
                    "7,0.5,gpt3-1.3b,2000,16,0\n")
    tr = read_trace(path)
    assert tr["job_id"].to_list() == ["007", "7"] and tr["num_steps"].to_list() == [1000, 2000]
    assert tr["num_gpus"].to_list() == [8, 16]
    pq = tmp_path / "t.parquet"
    pl.DataFrame({"job_id": [1, 2], "arrival_hours": [0.0, 1.0], "model": ["gpt3-1.3b"] * 2,
                  "num_steps": [10.0, None], "num_tokens": [None, 1e9]}).write_parquet(pq)
    tr = read_trace(pq)
    assert tr["job_id"].to_list() == ["1", "2"] and tr["num_steps"].to_list() == [10, None]


def test_nothing_runnable_is_reported_not_a_traceback(tmp_path):
    path = tmp_path / "t.csv"
    pl.DataFrame([dict(job_id="big", arrival_hours=0, model="gpt3-175b", num_tokens=1e9)]).write_csv(path)
    r = runner.invoke(app, ["schedule", str(path), "--cluster", f"{GPU}:8", "-o", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    text = flat(r.output)
    assert "n/a" in text and "1 of 1 jobs not run" in text and (tmp_path / "out" / "manifest.json").exists()


def test_memory_margin_leaves_out_the_tight_plans():
    cap = 80.0
    loose = job_curves([("gpt3-13b", 512)], GPU, 32)
    tight = job_curves([("gpt3-13b", 512)], GPU, 32, memory_margin=0.4)
    assert tight.feasible < loose.feasible
    ok = np.isfinite(tight.step_s)
    assert (tight.step_s[ok] == loose.step_s[ok]).all() and ok.sum() < np.isfinite(loose.step_s).sum()
    for k, f, n in np.argwhere(ok)[:5]:
        assert tight.row(int(k), int(f), int(n))["memory_per_gpu_GiB"] <= 0.6 * cap + 1e-9


def test_a_comma_list_of_policies_says_to_repeat_the_option(tmp_path):
    path = tmp_path / "t.csv"
    pl.DataFrame([dict(job_id="a", arrival_hours=0, model="gpt3-1.3b", num_tokens=1e9)]).write_csv(path)
    r = runner.invoke(app, ["schedule", str(path), "--cluster", f"{GPU}:16", "--policy", "plan-aware,fifo"])
    assert r.exit_code == 2 and "repeat the option" in flat(r.output)
