"""The settings registry (vtrain_fast.model.settings) is the one place each training setting lives:
every other table is derived from it, and every record is complete."""
from __future__ import annotations

import dataclasses

import pytest

from vtrain_fast.hardware.gpus import GPUPreset, PRESETS, machine_vector
from vtrain_fast.model.params import HW_FIELDS
from vtrain_fast.io.schema import SCHEMA, SETTING_COLUMNS
from vtrain_fast.model.settings import NO_FLAG, NO_MEGATRON_FLAG, BY_NAME, LAYOUT_SIZES, SETTINGS
from vtrain_fast.plan.spec import TRAINING_FLAGS


@pytest.mark.parametrize("st", SETTINGS, ids=lambda s: s.name)
def test_every_setting_is_complete_and_reaches_every_table(st):
    defaults = {f.name: f.default for f in dataclasses.fields(GPUPreset)}
    assert defaults[st.name] == st.default and type(st.default) is st.kind
    assert st.name in HW_FIELDS and st.name in SETTING_COLUMNS
    assert set(st.inert_at) <= set(LAYOUT_SIZES)
    assert all(k in BY_NAME and BY_NAME[k].kind is type(v) for k, v in st.inert_with + st.requires)
    assert st.name in SCHEMA.names and st.label and st.doc and (st.megatron.startswith("--") or st.megatron in (NO_FLAG, NO_MEGATRON_FLAG))
    assert (st.name in TRAINING_FLAGS) == (st.kind is bool)
    # the machine vector carries the setting's value in its field
    value = 2 if st.kind is int else 1.25 if st.kind is float else st.choices[-1] if st.kind is str else True
    p = dataclasses.replace(PRESETS["h100-sxm-80gb"], **{st.name: value})
    # (a str setting: the index of its last choice, 2.0 for the three recipes of fp8_recipe)
    expected = 2.0 if st.kind is int else 1.25 if st.kind is float else float(len(st.choices) - 1) if st.kind is str else 1.0
    assert machine_vector(p)[HW_FIELDS.index(st.name)] == expected
    assert st.decode(st.encode(value)) == value
    assert (st.kind is str) == bool(st.choices) and (st.kind is not str or st.default in st.choices)


def test_the_registry_order_is_the_sweep_axis_order():
    """The machine axis follows the registry (the last setting varies fastest): row order."""
    assert list(TRAINING_FLAGS) == [s.name for s in SETTINGS if s.kind is bool]
    assert list(SETTING_COLUMNS) == [s.name for s in SETTINGS] and len(BY_NAME) == len(SETTINGS)


def test_the_readme_lists_every_settings_rule():
    from pathlib import Path
    from vtrain_fast.model.settings import rules_markdown
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    assert rules_markdown() in readme, "regenerate README's settings rules with model.settings.rules_markdown()"
