"""The gated MLP's SiLU-and-multiply; Triton or plain torch by ``use_triton``."""

from __future__ import annotations

import torch
from torch import nn

from llmbench.kernels import activation


class SiluAndMul(nn.Module):
    def __init__(self, use_triton: bool = False) -> None:
        super().__init__()
        self._impl = activation.silu_and_mul if use_triton else activation.silu_and_mul_ref

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._impl(x)
