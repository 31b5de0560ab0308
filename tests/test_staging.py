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
