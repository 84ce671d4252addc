"""Stack calibrations of the published set (issue 12, Calibration and validation): the split into
fitted and held-out rows is a stated rule (deterministic, disjoint, blind to the measurements),
a fit never sees its held-out rows, the shipped files are what a fresh fit writes, and
``validate --set published`` reports fitted and held-out rows apart."""
from __future__ import annotations

import math
import shutil
from dataclasses import fields

import polars as pl
import pytest

from vtrain_fast.analysis import published as P
from vtrain_fast.hardware.gpus import Calibration


from test_validate_published import rows, runs  # noqa: F401,E402 (the published set's fixtures, shared)


def stack_folder_with(folder, key, gemm_efficiency):
    """``folder`` holding a copy of every shipped stack calibration, stack ``key``'s
    gemm_efficiency set to ``gemm_efficiency``."""
    for k, stack in P.STACKS.items():
        if stack.fit:
            shutil.copy(P.stack_calibration_path(k), folder / stack.fit.file)
    path = folder / P.STACKS[key].fit.file
    text = path.read_text(encoding="utf-8")
    value = [ln for ln in text.splitlines() if ln.startswith("gemm_efficiency = ")][0]
    path.write_text(text.replace(value, f"gemm_efficiency = {gemm_efficiency}", 1), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def fitting(runs):
    """A fresh fit of every stack that has one (:func:`published.fit_stack`), computed once for
    the tests that read fits (a fit is deterministic): ``(fits, seen)``, ``fits`` stack key -> its
    groups, ``seen`` the row ids every call of :func:`calibrate.fit` was given (a spy)."""
    import vtrain_fast.analysis.calibrate as C
    seen = []
    real = C.fit

    def spy(df, *a, **k):
        seen.extend(df["id"].to_list())
        return real(df, *a, **k)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(C, "fit", spy)
        fits = {key: P.fit_stack(key, runs) for key, stack in P.STACKS.items() if stack.fit}
    return fits, seen


@pytest.fixture(scope="module")
def fits(fitting):
    return fitting[0]


def _expressible_fit_rows(runs):
    return [r for r in runs if P.fit_covers(r) and not P.unexpressible_reasons(r)]


# ------------------------------------------------------------------------------ the split
def test_split_is_deterministic_disjoint_and_alternates_in_csv_order(runs):
    roles = P.fit_roles(runs)
    assert roles == P.fit_roles(P.load_runs()) == P.fit_roles()
    assert set(roles) == {r["id"] for r in _expressible_fit_rows(runs)}
    assert set(roles.values()) == {P.FITTED, P.HELD_OUT}
    fitted = {i for i, v in roles.items() if v == P.FITTED}
    held = {i for i, v in roles.items() if v == P.HELD_OUT}
    assert fitted.isdisjoint(held) and fitted | held == set(roles)
    groups: dict = {}
    for r in _expressible_fit_rows(runs):           # CSV order
        groups.setdefault(P.fit_group(r), []).append(roles[r["id"]])
    for g, seq in groups.items():
        assert seq == [P.FITTED if i % 2 == 0 else P.HELD_OUT for i in range(len(seq))], g
    # the A100 40 GB rows are fitted as the 80 GB chip, in MosaicML's A100 group
    assert ("mosaic", "a100-sxm4-40gb") not in groups and ("mosaic", "a100-sxm4-80gb") in groups


def test_the_split_extends_to_the_assumed_rows_without_moving_a_stated_one(runs):
    """The assumed rows join their groups by the same rule (CSV order); every stated row keeps the
    role it has without them, and the narayanan21 fit leaves the DeepSpeed ZeRO-3 rows out."""
    with_assumed = P.fit_roles(runs)
    stated = P.fit_roles(P.load_runs(assume=False))
    assert stated and all(with_assumed[i] == role for i, role in stated.items())
    assert len(with_assumed) > len(stated)
    assert not any(i.startswith("narayanan21_t2_zero3") for i in with_assumed)
    assert any(i.startswith("narayanan21_t2_ptd") for i in with_assumed)
    assert {i.split("_")[0] for i in with_assumed} >= {"nemo2407", "shoeybi19"}


def test_split_reads_no_measurement(runs):
    """Changing every measured value (or dropping a row's metric) moves no row between the sets."""
    changed = [dict(r, measured_value=r["measured_value"] * 3.7) for r in runs]
    assert P.fit_roles(changed) == P.fit_roles(runs)


def test_every_stack_fit_holds_rows_out_and_has_more_fitted_rows_than_parameters(runs, fits):
    roles = P.fit_roles(runs)
    for key, stack in P.STACKS.items():
        if stack.fit is None:
            assert not any(r["source_key"] == key and not P.unexpressible_reasons(r) for r in runs)
            continue
        for g in fits[key]:
            assert g["held_out"], (key, g["gpu"])
            assert len(g["fitted"]) > len(stack.fit.params), (key, g["gpu"])
            assert {roles[i] for i in g["fitted"]} == {P.FITTED}
            assert {roles[i] for i in g["held_out"]} == {P.HELD_OUT}


# ------------------------------------------------------------------------------ the fit
def test_a_stack_fit_never_sees_its_held_out_rows(runs, fitting):
    roles = P.fit_roles(runs)
    fits, seen = fitting
    assert set(fits) == {key for key, stack in P.STACKS.items() if stack.fit}
    assert seen and {roles[i] for i in seen} == {P.FITTED}
    assert len(seen) == len(set(seen)) == sum(v == P.FITTED for v in roles.values())


def test_held_out_measurements_do_not_move_the_fit(runs, fits):
    """Doubling every held-out row's measured value leaves every fitted parameter unchanged."""
    roles = P.fit_roles(runs)
    doubled = [dict(r, measured_value=r["measured_value"] * 2.0) if roles.get(r["id"]) == P.HELD_OUT else r
               for r in runs]
    for key in ("bloom176b", "korthikanti22"):
        a = fits[key]
        b = P.fit_stack(key, doubled)
        for ga, gb in zip(a, b):
            for p in P.STACKS[key].fit.params:
                assert getattr(ga["calibration"], p) == getattr(gb["calibration"], p)


def test_fitted_values_stay_in_the_calibration_ranges(runs):
    from vtrain_fast.hardware.gpus import CALIBRATION_RANGES
    params = P.stack_parameters()
    assert params.height > 0
    for r in params.iter_rows(named=True):
        lo, hi = CALIBRATION_RANGES[r["param"]]
        assert lo <= r["value"] <= hi
    # what the report says about implausible values is computed, not written by hand
    notes = dict(((r["stack"], r["gpu"], r["param"]), r["note"]) for r in params.iter_rows(named=True))
    assert all(n is None or "bound" in n or "benchmark" in n for n in notes.values())


def _differences(folder, fits) -> list[str]:
    """Where the stack files in ``folder`` differ from the fresh fits ``fits`` (values and fitted rows)."""
    from vtrain_fast.io.inputs import read_toml
    out = []
    for key, stack in P.STACKS.items():
        if stack.fit is None:
            continue
        path = P.stack_calibration_path(key, folder)
        if not path.exists():
            out.append(f"{key}: no file {path}")
            continue
        shipped = P.load_stack_calibration(key, folder)
        meta = read_toml(path, "calibration").get("meta", {})
        for g in fits[key]:
            for preset in (g["gpu"], *g["share"]):
                if preset not in shipped:
                    out.append(f"{key}: no [{preset}]")
                    continue
                for f in fields(Calibration):
                    a, b = getattr(shipped[preset], f.name), getattr(g["calibration"], f.name)
                    if not math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12):
                        out.append(f"{key} {preset} {f.name}: file {a!r}, fresh fit {b!r}")
                if meta.get(preset, {}).get("fitted_rows") != ", ".join(g["fitted"]):
                    out.append(f"{key} {preset}: fitted_rows differ")
        extra = set(shipped) - {p for g in fits[key] for p in (g["gpu"], *g["share"])}
        out += [f"{key}: table [{p}] no fit writes" for p in sorted(extra)]
    return out


def test_the_shipped_stack_files_equal_a_fresh_fit(fits):
    """`make calibrate-published` regenerates them: run it after a model or data change."""
    assert _differences(None, fits) == []


def test_a_stale_stack_file_is_caught(fits, tmp_path):
    diff = _differences(stack_folder_with(tmp_path, "narayanan21", 0.5), fits)
    assert diff and all(d.startswith("narayanan21 a100-sxm4-80gb gemm_efficiency") for d in diff)


def test_calibrate_published_command_writes_a_calibration_file(tmp_path, cli, runs):
    """A tiny subset (BLOOM: 2 fitted rows, one parameter): the command writes the calibration
    format `calibrate -o` writes, with the fitted and held-out rows named, equal to the shipped file."""
    from vtrain_fast.hardware.calfile import read_calibration_output
    res = cli("calibrate-published", "--stack", "bloom176b", "-o", tmp_path)
    assert res.exit_code == 0, res.output
    path = tmp_path / P.STACKS["bloom176b"].fit.file
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
    doc = read_calibration_output(path)
    assert set(doc) == {"a100-sxm4-80gb", "meta"}
    text = path.read_text(encoding="utf-8")
    assert "fitted rows: bloom176b_gbs2048_iter85376, bloom176b_gbs192_mbs1" in text
    assert "held out (never seen by the fit): bloom176b_gbs16_rampup" in text
    assert "calibrate-published" in text and doc["meta"]["a100-sxm4-80gb"]["date"]
    shipped = P.load_stack_calibration("bloom176b")
    fresh = P.load_stack_calibration("bloom176b", tmp_path)
    assert fresh == shipped
    again = cli("calibrate-published", "--stack", "bloom176b", "-o", tmp_path)       # replaces, same values
    assert again.exit_code == 0 and P.load_stack_calibration("bloom176b", tmp_path) == shipped
    bad = cli("calibrate-published", "--stack", "megatronlm", "-o", tmp_path)
    assert bad.exit_code == 2 and "--stack" in bad.output


# ------------------------------------------------------------------------------ the validation
def test_parquet_has_the_stack_prediction_and_fit_role(rows):
    for c in ("stack", "stack_calibration", "fit_role", "stack_iteration_time_s", "stack_error_pct", "stack_ape_pct"):
        assert c in rows.columns
    roles = P.fit_roles()
    got = dict(zip(rows["id"].to_list(), rows["fit_role"].to_list()))
    assert {k: v for k, v in got.items() if v is not None} == roles
    priced = rows.filter(pl.col("stack_ape_pct").is_not_null())
    assert priced.height == rows.filter(pl.col("fit_role").is_not_null() & (pl.col("status") == "ok")).height
    for r in priced.iter_rows(named=True):
        assert r["stack_calibration"] == P.STACKS[r["stack"]].fit.file
        expect = (r["stack_iteration_time_s"] / r["measured_iteration_time_s"] - 1) * 100
        assert math.isclose(r["stack_error_pct"], expect, rel_tol=1e-9)
    unpriced = rows.filter(~pl.col("expressible"))
    assert unpriced["stack_iteration_time_s"].null_count() == unpriced.height


def test_the_stack_prediction_uses_the_stack_file(tmp_path):
    """A stack folder with a slower GEMM for one stack changes that stack's predictions only."""
    stack_folder_with(tmp_path, "korthikanti22", 0.4)
    a = P.validate_published()
    b = P.validate_published(stack_folder=tmp_path)
    j = a.select("id", "stack", x="stack_iteration_time_s").join(b.select("id", y="stack_iteration_time_s"), on="id")
    k = j.filter(pl.col("stack") == "korthikanti22")
    assert (k["y"] > 1.3 * k["x"]).all()
    other = j.filter((pl.col("stack") != "korthikanti22") & pl.col("x").is_not_null())
    assert other.height > 0 and (other["x"] == other["y"]).all()


def test_stack_summary_splits_fitted_and_held_out(rows):
    s = P.stack_summary(rows.filter(pl.col("expressible")), "stack")
    assert s.columns == ["stack", "shipped", "fit_n", "fitted", "held_n", "held", "ship_ho"]
    allrow = s.filter(pl.col("stack") == "all").row(0, named=True)
    ok = rows.filter(pl.col("status") == "ok")       # a covered row the model finds infeasible has no error
    assert allrow["fit_n"] == ok.filter(pl.col("fit_role") == P.FITTED).height
    assert allrow["held_n"] == ok.filter(pl.col("fit_role") == P.HELD_OUT).height
    held = rows.filter(pl.col("fit_role") == P.HELD_OUT)
    assert math.isclose(allrow["held"], held["stack_ape_pct"].mean(), rel_tol=1e-12)
    assert math.isclose(allrow["ship_ho"], held["ape_pct"].mean(), rel_tol=1e-12)
    g = P.stack_summary(rows.filter(pl.col("expressible")), "gpu_preset")
    assert g.filter(pl.col("gpu_preset") == "all").row(0) [1:] == s.filter(pl.col("stack") == "all").row(0)[1:]


def test_validate_prints_fitted_and_held_out_columns_at_80_columns(tmp_path, cli, monkeypatch):
    from rich.console import Console

    import vtrain_fast.cli as cli_module
    monkeypatch.setattr(cli_module, "console", Console(width=80, emoji=False, soft_wrap=True))
    out = tmp_path / "v.parquet"
    res = cli("validate", "--set", "published", "-o", out)
    assert res.exit_code == 0, res.output
    text = res.output
    assert "Stack calibration: MAPE by stack" in text and "Stack calibration: MAPE by GPU preset" in text
    for header in ("shipped", "fit_n", "fitted", "held_n", "held", "ship_ho"):
        assert header in text
    for line in text.splitlines():
        if line[:1] in "┏┃┡│└":                       # table lines fit the 80 columns
            assert len(line) <= 80, line
    stack_table = text.split("Stack calibration: MAPE by stack")[1].split("Stack calibration: MAPE by GPU")[0]
    for key, stack in P.STACKS.items():
        assert (key in stack_table) == (stack.fit is not None), key
    assert "fitted parameters" in text and "gemm_efficiency" in text
    df = pl.read_parquet(out)
    assert set(df["fit_role"].drop_nulls().unique()) == {"fitted", "held_out"}
