"""A decode CUDA Graph's inputs sent in one copy (engine/graph_inputs.py): after any sequence of steps, the
graph reads each step's own values in its rows and the padding values in the rest, whichever pinned mirror
the step went through and whether its block tables went inline or by themselves."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from llmbench.engine import graph_inputs
from llmbench.engine.graph_inputs import NO_FILL, GraphInputs
from llmbench.engine.step_inputs import StepArrays

BS, MAX_BLOCKS = 8, 12


@st.composite
def decode_steps(draw) -> tuple[StepArrays, np.ndarray | None, bool]:
    n = draw(st.integers(1, BS))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    width = draw(st.integers(1, MAX_BLOCKS))
    samples = n if draw(st.booleans()) else draw(st.integers(0, n))  # rows that sample
    step = StepArrays(
        input_ids=rng.integers(0, 1000, n),
        positions=rng.integers(0, 5000, n),
        slot_mapping=rng.integers(0, 90_000, n),
        query_start_loc=np.arange(n + 1, dtype=np.int32),
        seq_lens=rng.integers(1, 5000, n),
        block_tables=rng.integers(0, 700, (n, width)).astype(np.int32),
        logits_indices=np.sort(rng.choice(n, samples, replace=False)),
        query_lens=[1] * n,
    )
    if draw(st.booleans()):  # asynchronous scheduling: some rows take the last step's samples
        rows = np.sort(rng.choice(n, draw(st.integers(1, n)), replace=False))
        step.fill_rows, step.fill_src = rows, rng.integers(0, 300, len(rows))
    if draw(st.booleans()):
        step.sample_params = rng.random((4, samples), dtype=np.float32)
        step.sample_keys = rng.integers(0, 2**40, (2, samples))
    order = rng.permutation(n) if draw(st.booleans()) else None
    return step, order, draw(st.booleans())


def _check(inputs: GraphInputs, step: StepArrays, order: np.ndarray | None, draw: bool) -> None:
    t = inputs.t
    n = len(step.query_lens)
    got = {name: getattr(t, name).numpy() for name in vars(t)}
    assert np.array_equal(got["input_ids"][:n], step.input_ids)
    assert np.array_equal(got["positions"][:n], step.positions)
    assert np.array_equal(got["slot_mapping"][:n], step.slot_mapping)
    assert np.array_equal(got["seq_lens"][:n], step.seq_lens)
    width = step.block_tables.shape[1]
    assert np.array_equal(got["block_tables"][:n, :width], step.block_tables)
    assert np.array_equal(got["order"][:n], order if order is not None else np.arange(n))
    fill = np.full(n, NO_FILL)
    if step.fill_rows is not None:
        fill[step.fill_rows] = step.fill_src
    assert np.array_equal(got["fill"][:n], fill)
    k = len(step.logits_indices)
    if k != n:
        assert np.array_equal(got["logits_rows"][:k], step.logits_indices)
    if step.sample_params is not None:
        assert np.array_equal(got["sample_params"][:, :k], step.sample_params)
        assert np.array_equal(got["sample_keys"][:, :k], step.sample_keys)
        assert np.array_equal(got["draw_scale"][:k], step.sample_params[0] if draw else np.zeros(k))
    else:
        assert not got["sample_params"][:, :n].any() and not got["draw_scale"][:n].any()
    # padded rows: no K/V written, one token of context, their own place in the order, no fill, argmax
    assert (got["slot_mapping"][n:] == -1).all() and (got["seq_lens"][n:] == 1).all()
    assert np.array_equal(got["order"][n:], np.arange(n, BS))
    assert (got["fill"][n:] == NO_FILL).all() and not got["draw_scale"][n:].any()


@pytest.mark.parametrize("inline_bytes", [graph_inputs.INLINE_TABLE_BYTES, 3 * 4 * MAX_BLOCKS])
@settings(max_examples=40, deadline=None)
@given(st.lists(decode_steps(), min_size=1, max_size=8))
def test_each_step_reads_back_exactly_with_its_padding(inline_bytes, steps):
    old = graph_inputs.INLINE_TABLE_BYTES
    graph_inputs.INLINE_TABLE_BYTES = inline_bytes  # small: steps past 3 rows send their tables apart
    try:
        inputs = GraphInputs(BS, MAX_BLOCKS, torch.device("cpu"))
        for step, order, draw in steps:  # mirrors alternate; a smaller step follows a larger one
            inputs.load(step, order, draw)
            _check(inputs, step, order, draw)
    finally:
        graph_inputs.INLINE_TABLE_BYTES = old


def test_fields_are_aligned_views_of_one_buffer():
    inputs = GraphInputs(BS, MAX_BLOCKS, torch.device("cpu"))
    base = inputs.buffer.data_ptr()
    for name in vars(inputs.t):
        view = getattr(inputs.t, name)
        assert view.untyped_storage().data_ptr() == base, name
        assert (view.data_ptr() - base) % 16 == 0, name
