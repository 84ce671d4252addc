"""The grid drivers reuse per-micro-batch, per-split and per-model costs across points (block
caches in model.sweep); their rows must be bit-for-bit those of ``step`` on the same
configuration, whatever the start, length and order of the points they are given."""
from __future__ import annotations

import numpy as np
import pytest

from vtrain_fast.plan import grid as grid_mod
from vtrain_fast.model import records
from vtrain_fast.model import sweep as ks
from vtrain_fast.plan.spec import parse_spec

# every status, pp = 1 and pp > 1, pipeline neighbours inside and across nodes, both recompute
# settings, several models, GPUs, token budgets and micro-batch sizes
SPEC = """
name = "cache"
[model]
presets = ["gpt3-125m", "gpt3-2.7b", "gpt3-13b"]
[training]
num_tokens = [1e9, 3e11]
global_batch_size = [48, 64, 96, 100]
micro_batch_size = [1, 2, 3, 4]
recompute = ["none", "full"]
[cluster]
gpu = ["a100-sxm4-40gb", "h100-sxm-80gb", "v100-sxm2-32gb"]
num_gpus = [1, 8, 16, 48]
[parallel]
tp = [1, 2, 4, 8]
pp = [1, 2, 3, 4]
"""


@pytest.fixture(scope="module")
def grid():
    return grid_mod.build_grid(parse_spec(SPEC, "<cache>"))


def _buffers(n):
    return (np.empty((ks.NUM_INPUTS, n), np.int64), np.empty(n, np.float64),
            np.empty((records.NUM_OUTPUTS, n), np.float64), np.empty(n, np.int8))


def _step_rows(g, inputs, tokens):
    """``step`` (through evaluate_rows) on the configurations in ``inputs``."""
    n = inputs.shape[1]
    cols = ks.rows_from_inputs(inputs)
    hw_rows = np.ascontiguousarray(g.hw_table[inputs[ks.INPUT.gpu_index]])
    out = np.empty((records.NUM_OUTPUTS, n), np.float64)
    status = np.empty(n, np.int8)
    ks.evaluate_rows(cols, np.ascontiguousarray(tokens), hw_rows, out, status)
    return out, status


def _assert_same_as_step(g, inputs, tokens, out, status):
    ref_out, ref_status = _step_rows(g, inputs, tokens)
    ok = status != records.BAD_NUM_GPUS          # evaluate_rows cannot express a bad split
    assert (status[ok] == ref_status[ok]).all()
    assert np.array_equal(out[:, ok], ref_out[:, ok], equal_nan=True)
    assert np.isnan(out[:, ~ok]).all()


def test_sweep_chunk_rows_are_steps_rows(grid):
    n = grid.num_points
    inputs, tokens, out, status = _buffers(n)
    ks.sweep_chunk(0, n, *grid.kernel_args(), inputs, tokens, out, status)
    assert {records.OK, records.OUT_OF_MEMORY, records.BAD_NUM_GPUS, records.BAD_BATCH} <= set(status.tolist())
    _assert_same_as_step(grid, inputs, tokens, out, status)
    # any window (caches start cold at its first point) gives the same rows
    rng = np.random.default_rng(3)
    for _ in range(5):
        m = int(rng.integers(1, 3000))
        s = int(rng.integers(0, n - m))
        bufs = _buffers(m)
        ks.sweep_chunk(s, m, *grid.kernel_args(), *bufs)
        assert np.array_equal(bufs[0], inputs[:, s:s + m])
        assert np.array_equal(bufs[2], out[:, s:s + m], equal_nan=True)
        assert np.array_equal(bufs[3], status[s:s + m])


def test_sweep_points_rows_are_steps_rows(grid):
    n = grid.num_points
    rng = np.random.default_rng(4)
    for idx in (np.sort(rng.choice(n, 2000, replace=False)), rng.choice(n, 2000, replace=False),
                np.arange(100, 900)):
        idx = idx.astype(np.int64)
        inputs, tokens, out, status = _buffers(idx.size)
        ks.sweep_points(idx, *grid.kernel_args(), inputs, tokens, out, status)
        _assert_same_as_step(grid, inputs, tokens, out, status)


def test_scan_chunk_keeps_steps_values(grid):
    n = grid.num_points
    nb = -(-n // ks.BLOCK)
    obj_col = np.array([records.OUTPUT.cost_usd, records.OUTPUT.iteration_time_s], np.int64)
    cand_idx, cand_vals = np.empty(n, np.int64), np.empty((2, n), np.float64)
    fill, bstat, pruned = np.empty(nb, np.int64), np.empty((nb, records.NUM_STATUS), np.int64), np.empty(nb, np.int64)
    ks.scan_chunk(0, n, *grid.kernel_args(), np.empty(0, np.uint8), ks.KEEP_FEASIBLE,
                  np.zeros(2, np.int64), obj_col, np.ones(2), np.empty((0, 2)), np.empty(0, np.int64),
                  cand_idx, cand_vals, fill, bstat, pruned)
    m = int(fill.sum())
    idx, vals = np.empty(m, np.int64), np.empty((m, 2))
    ks.compact_candidates(cand_idx, cand_vals, fill, idx, vals, 0)
    inputs, tokens, out, status = _buffers(n)
    ks.sweep_chunk(0, n, *grid.kernel_args(), inputs, tokens, out, status)
    assert np.array_equal(idx, np.flatnonzero(status == records.OK))
    assert np.array_equal(vals, out[obj_col][:, idx].T)
