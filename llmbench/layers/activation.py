"""The gated MLP's SiLU-and-multiply; Triton or plain torch by ``use_triton``. ``prefetch`` is the down
projection's weight, which the kernel asks into L2 for inputs of up to ``prefetch_rows`` rows
(kernels/prefetch.py; the decode plan sets both, models/fused_decode.py)."""

from __future__ import annotations

import torch
from torch import nn

from llmbench.kernels import activation


class SiluAndMul(nn.Module):
    def __init__(self, use_triton: bool = False) -> None:
        super().__init__()
        self._impl = activation.silu_and_mul if use_triton else activation.silu_and_mul_ref
        self.prefetch: torch.Tensor | None = None
        self.prefetch_rows = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (T, 2 inter) -> (T, inter)
        return self._impl(x, self.prefetch if x.shape[0] <= self.prefetch_rows else None)
