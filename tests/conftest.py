"""Shared test set-up.

Without a GPU, Triton kernels run under its interpreter, so the Triton paths are tested on the CPU;
this must be decided before triton is first imported. Tests marked ``gpu`` are skipped without one.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# Tables are printed unwrapped at 200 columns when not on a terminal; pytest-xdist's workers set COLUMNS=80,
# so the width is fixed here for every test (before llmbench's console is created).
os.environ["COLUMNS"] = "200"
# Two threads per process, shared out among pytest-xdist's workers when several run at once.
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, min(2, (os.cpu_count() or 1) // _workers)))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (marked gpu)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seeded() -> None:
    """Every test starts from the same random state, whatever ran before it in its process (pytest-xdist
    deals tests out differently from run to run): a test on random data passes or fails the same way."""
    torch.manual_seed(0)
