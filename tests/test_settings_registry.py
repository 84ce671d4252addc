"""The settings registry (vtrain_fast.model.settings) is the one place each training setting lives:
every other table is derived from it, and every record is complete."""
from __future__ import annotations

import dataclasses

import pytest

from conftest import ONE_POINT_SPEC
from vtrain_fast.engine.chunks import evaluate_chunk
from vtrain_fast.hardware.gpus import GPUPreset, PRESETS, machine_vector
from vtrain_fast.model.records import HW_FIELDS
from vtrain_fast.model.settings import NO_FLAG, NO_MEGATRON_FLAG, BY_NAME, LAYOUT_SIZES, SETTINGS
from vtrain_fast.plan.grid import build_grid
from vtrain_fast.plan.spec import parse_spec


def _toml(value) -> str:
    return f'"{value}"' if isinstance(value, str) else str(value).lower()


def _spec_with(st, values: str) -> str:
    """ONE_POINT_SPEC with ``st.name = values`` in the setting's own table."""
    line = f"{st.name} = {values}"
    if st.table == "training":
        return ONE_POINT_SPEC.format(training=line)
    return ONE_POINT_SPEC.format(training="").replace("pp = 1", f"pp = 1\n{line}")


@pytest.mark.parametrize("st", SETTINGS, ids=lambda s: s.name)
def test_every_setting_is_complete_and_reaches_every_table(st):
    defaults = {f.name: f.default for f in dataclasses.fields(GPUPreset)}
    assert defaults[st.name] == st.default and type(st.default) is st.kind
    assert set(st.inert_at) <= set(LAYOUT_SIZES)
    assert all(k in BY_NAME and BY_NAME[k].kind is type(v) for k, v in st.inert_with + st.requires)
    assert st.label and st.doc and (st.megatron.startswith("--") or st.megatron in (NO_FLAG, NO_MEGATRON_FLAG))
    # a spec takes it in its table, as a list of its default and another allowed value
    other = (not st.default if st.kind is bool else st.choices[-1] if st.kind is str
             else st.kind(st.int_range[1] if st.default != st.int_range[1] else st.int_range[0]))
    spec = parse_spec(_spec_with(st, f"[{_toml(st.default)}, {_toml(other)}]"), "s.toml")
    assert dict(spec.settings)[st.name] == (st.default, other)
    # the machine vector carries the setting's value in its field
    value = 2 if st.kind is int else 1.25 if st.kind is float else st.choices[-1] if st.kind is str else True
    p = dataclasses.replace(PRESETS["h100-sxm-80gb"], **{st.name: value})
    # (a str setting: the index of its last choice, 2.0 for the three recipes of fp8_recipe)
    expected = 2.0 if st.kind is int else 1.25 if st.kind is float else float(len(st.choices) - 1) if st.kind is str else 1.0
    assert machine_vector(p)[HW_FIELDS.index(st.name)] == expected
    assert st.decode(st.encode(value)) == value
    assert (st.kind is str) == bool(st.choices) and (st.kind is not str or st.default in st.choices)


def test_the_registry_order_is_the_sweep_axis_order():
    """The machine axis follows the registry (the last setting varies fastest), whatever the order
    of the spec's keys: row order. Setting names are unique."""
    assert len(BY_NAME) == len(SETTINGS)
    names = [st.name for st in SETTINGS]
    assert names.index("use_flash_attn") < names.index("sequence_parallel") < names.index("precision")
    text = ONE_POINT_SPEC.format(training='precision = ["bf16", "fp16"]\nsequence_parallel = [false, true]\n'
                                          "use_flash_attn = [false, true]").replace("tp = 1", "tp = 2")
    spec = parse_spec(text, "s.toml")
    assert spec.setting_axes == ("use_flash_attn", "sequence_parallel", "precision")
    order = [(f, sp, p) for f in (False, True) for sp in (False, True) for p in ("bf16", "fp16")]
    assert [(g.use_flash_attn, g.sequence_parallel, g.precision) for g in spec.gpus] == order
    grid = build_grid(spec)
    rows = evaluate_chunk(grid, 0, grid.num_points).to_pydict()
    assert list(zip(rows["use_flash_attn"], rows["sequence_parallel"], rows["precision"])) == order


def test_the_readme_lists_every_settings_rule():
    from pathlib import Path
    from vtrain_fast.model.settings import rules_markdown
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    assert rules_markdown() in readme, "regenerate README's settings rules with model.settings.rules_markdown()"
