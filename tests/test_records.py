"""The kernels' records (vtrain_fast.model.records): every layout named once, read by field name.

The index records give each name its position; the value records are built by keyword and read by
field; no positional slot constant (``H_*``, ``M_*``, ``S_*``, ``C_*``, ``I_*``, ``O_*``, ...)
survives anywhere in the package, and the kernel that builds an ``Arch`` from integer columns
reads every field by name.
"""
from __future__ import annotations

import pathlib
import re

import numpy as np
import pytest

from vtrain_fast.model import records, sweep
from vtrain_fast.model.arch import Arch

PACKAGE = pathlib.Path(records.__file__).resolve().parents[1]
LAYOUTS = [(records.MACHINE, records.HW_FIELDS), (records.MODEL, records.MODEL_FIELDS),
           (records.ROW, records.ROW_FIELDS), (records.OUTPUT, records.OUTPUT_NAMES),
           (records.INPUT, records.INPUT_NAMES), (records.AXIS, records.AXES)]


@pytest.mark.parametrize("record, names", LAYOUTS)
def test_an_index_record_gives_each_name_its_position(record, names):
    assert record._fields == names
    assert [getattr(record, n) for n in names] == list(range(len(names)))


@pytest.mark.parametrize("cls, names", [(records.MicroCosts, records.MICRO_NAMES),
                                        (records.SplitCosts, records.SPLIT_NAMES),
                                        (records.StageCosts, records.STAGE_COST_NAMES),
                                        (records.Totals, records.TOTAL_NAMES)])
def test_a_value_record_has_its_layout_as_fields(cls, names):
    assert cls._fields == names and len(set(names)) == len(names)


def test_no_positional_slot_constant_outside_the_records():
    slot = re.compile(r"\b(?:H|M|S|C|I|O|T|A|R|MD)_[A-Z][A-Z0-9_]*\b")
    found = []
    for path in PACKAGE.rglob("*.py"):
        for k, line in enumerate(path.read_text().splitlines(), 1):
            for name in slot.findall(line):
                if not name.startswith(("O_RDWR", "O_CREAT", "O_EXCL", "O_WRONLY", "O_RDONLY", "S_IS", "S_IR", "S_IW", "S_IX")):
                    found.append(f"{path.relative_to(PACKAGE)}:{k}: {name}")
    assert found == []


@pytest.mark.parametrize("at", [records.MODEL, records.ROW])
def test_the_kernel_builds_arch_by_field_name(at):
    # distinct values in every column: a field read from a wrong column, or left to its default, differs
    values = np.arange(100, 100 + len(at), dtype=np.int64)
    got = sweep.arch_of(values, at)
    want = records.arch_of_values(values, at)
    assert tuple(got) == tuple(want)
    assert got == Arch(*(float(100 + getattr(at, n)) for n in Arch._fields))
