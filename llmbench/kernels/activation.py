"""SiLU-and-multiply of the gated MLP: ``silu(x[..., :I]) * x[..., I:]``."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    # x: (T, 2I) -> (T, I)
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up
