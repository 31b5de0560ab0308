"""The one-copy staging of a step's arrays: same values, dtypes and shapes back, whatever their sizes."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from llmbench.engine.staging import Staging

DTYPES = [np.int64, np.int32, np.float32, np.bool_]


@st.composite
def step_arrays(draw) -> list[np.ndarray]:
    arrays = []
    for _ in range(draw(st.integers(1, 8))):
        dtype = draw(st.sampled_from(DTYPES))
        shape = tuple(draw(st.lists(st.integers(0, 37), min_size=1, max_size=2)))
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        arrays.append((rng.integers(-(2**30), 2**30, size=shape)).astype(dtype))
    return arrays


@settings(max_examples=60, deadline=None)
@given(st.lists(step_arrays(), min_size=1, max_size=4), st.booleans())
def test_uploads_give_back_every_array_exactly(steps, separate):
    staging = Staging(torch.device("cpu"), separate=separate)
    for arrays in steps:  # successive steps: buffers alternate, grow, and are reused
        out = staging.upload(arrays)
        for a, t in zip(arrays, out, strict=True):
            assert tuple(t.shape) == a.shape and t.dtype == torch.from_numpy(a).dtype
            assert np.array_equal(t.numpy(), a)


def test_one_shared_buffer_unless_separate():
    arrays = [np.arange(5, dtype=np.int64), np.arange(6, dtype=np.int32).reshape(2, 3)]
    shared = Staging(torch.device("cpu")).upload(arrays)
    assert shared[0].untyped_storage().data_ptr() == shared[1].untyped_storage().data_ptr()
    apart = Staging(torch.device("cpu"), separate=True).upload(arrays)
    assert apart[0].untyped_storage().data_ptr() != apart[1].untyped_storage().data_ptr()
    assert all(t.data_ptr() % 16 == 0 for t in shared)  # 16-byte aligned views


@st.composite
def table_histories(draw):
    """Per step: for some sequences, grow the table, replace it (preemption) or finish."""
    return draw(
        st.lists(
            st.lists(
                st.tuples(st.integers(0, 9), st.sampled_from(["grow", "replace", "finish"])), max_size=12
            ),
            min_size=1,
            max_size=15,
        )
    )


@settings(max_examples=80, deadline=None)
@given(table_histories(), st.integers(0, 2**32 - 1))
def test_block_table_rows_equal_the_tables_they_mirror(history, seed):
    from llmbench.engine.sampling_params import SamplingParams
    from llmbench.engine.sequence import Sequence
    from llmbench.engine.step_inputs import BlockTables

    rng = np.random.default_rng(seed)
    mirror = BlockTables(max_blocks_per_seq=40)
    seqs = {i: Sequence(f"r{i}", [1], SamplingParams(), 0.0) for i in range(10)}
    for step in history:
        for i, action in step:
            seq = seqs[i]
            if action == "grow" and len(seq.block_table) < 40:
                seq.block_table.extend(
                    rng.integers(0, 10_000, rng.integers(1, 3)).tolist()[: 40 - len(seq.block_table)]
                )
            elif action == "replace":  # a preempted and readmitted sequence gets a new list
                seq.block_table = rng.integers(0, 10_000, rng.integers(0, 20)).tolist()
            elif action == "finish":
                mirror.forget(seq.request_id)
                seq.block_table = []
        batch = [s for s in seqs.values() if s.block_table]
        if not batch:
            continue
        got = mirror.gather(batch)
        width = max(len(s.block_table) for s in batch)
        want = np.zeros((len(batch), width), dtype=np.int32)
        for r, s in enumerate(batch):
            want[r, : len(s.block_table)] = s.block_table
        assert np.array_equal(got, want)
