"""RMSNorm with the residual add fused in; Triton or plain torch by ``use_triton``.

``norm(x, residual)`` returns ``(rmsnorm(x + residual) * weight, x + residual)``; without a residual,
``(rmsnorm(x) * weight, x)``: the second is the residual stream that the next layer adds to. With
``residual_out`` (which may be ``residual``) the sum is written there.
"""

from __future__ import annotations

import torch
from torch import nn

from llmbench.kernels import rmsnorm


class RMSNorm(nn.Module):
    def __init__(self, hidden: int, eps: float, use_triton: bool = False) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden), requires_grad=False)
        self._impl = rmsnorm.rms_norm if use_triton else rmsnorm.rms_norm_ref

    def forward(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None = None,
        residual_out: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # x, residual: (T, hidden) -> (normed, x + residual), both (T, hidden)
        out, h = self._impl(x, self.weight, self.eps, residual, residual_out)
        return out, (x if h is None else h)
