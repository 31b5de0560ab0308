"""Rotary position embedding, neox style (rotate the two halves), as Hugging Face's Llama/Qwen do.

``cos_sin_cache``: (max_positions, head_dim) float32, cos in the first half, sin in the second.
"""

from __future__ import annotations

import torch


def apply_rotary_ref(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    # q: (T, Hq, D), k: (T, Hk, D), positions: (T,) int64
    cos, sin = cos_sin_cache[positions].chunk(2, dim=-1)  # (T, D/2) each
    cos = cos.unsqueeze(1)
    sin = sin.unsqueeze(1)

    def rotate(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)

    return rotate(q), rotate(k)
