"""Rotary embedding: the cos/sin table (with Llama 3 frequency scaling) and its application."""

from __future__ import annotations

import math
from typing import Protocol

import torch
from torch import nn

from llmbench.kernels import rotary


class RopeParameters(Protocol):
    """The rotary parameters a model's config carries (models/config.py ``RopeConfig`` has them)."""

    theta: float
    kind: str  # "default" | "llama3"
    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


def inverse_frequencies(head_dim: int, rope: RopeParameters) -> torch.Tensor:
    # Same float32 arithmetic as Hugging Face's rope initialisers, so positions rotate identically.
    inv_freq = 1.0 / (rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if rope.kind == "default":
        return inv_freq
    # Llama 3: long wavelengths slowed by `factor`, short ones kept, a smooth blend between.
    old_len = rope.original_max_position_embeddings
    low_wavelen = old_len / rope.low_freq_factor
    high_wavelen = old_len / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_len / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    def __init__(
        self, head_dim: int, max_positions: int, rope: RopeParameters, use_triton: bool = False
    ) -> None:
        super().__init__()
        inv_freq = inverse_frequencies(head_dim, rope)
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)  # (P, D/2)
        self.register_buffer("cos_sin_cache", torch.cat((freqs.cos(), freqs.sin()), dim=-1), persistent=False)
        self._impl = rotary.apply_rotary if use_triton else rotary.apply_rotary_ref

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # q: (T, Hq, D), k: (T, Hk, D)
        return self._impl(q, k, positions, self.cos_sin_cache)
