"""RMSNorm, optionally fused with the residual add that precedes it.

With ``residual``: ``h = x + residual``; returns ``(rmsnorm(h) * weight, h)``. Without: returns
``(rmsnorm(x) * weight, None)``. The statistics are computed in float32, as Hugging Face does, and the
normalised value is cast back to the input dtype before the weight multiply.
"""

from __future__ import annotations

import torch


def rms_norm_ref(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    # x, residual: (T, H); weight: (H,)
    # The add happens in the model dtype, as in Hugging Face's decoder layer.
    h = x if residual is None else x + residual
    hf = h.float()
    out = (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight
    return out, (None if residual is None else h)
