"""Shared test set-up.

Without a GPU, Triton kernels run under its interpreter, so the Triton paths are tested on the CPU;
this must be decided before triton is first imported.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
