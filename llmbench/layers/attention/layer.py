"""The attention layer of a decoder: q/k/v projection, optional q/k norm, RoPE, backend, output projection.

``attend`` is what lies between the two projections, for the fused decode (models/fused_decode.py), which
runs the projections itself. A layer with the fused prologue also splits ``attend`` in two, for a forward
cut at attention (models/piecewise.py): ``store_qkv`` (from the projection's output to q, K/V stored) and
``attend_stored`` (attention over the cache).
"""

from __future__ import annotations

import torch
from torch import nn

from llmbench.layers.attention.backends import AttentionBackend, CacheAttentionBackend
from llmbench.layers.attention.kv import LayerKV
from llmbench.layers.attention.metadata import AttentionMetadata
from llmbench.layers.linear import QKVParallelLinear, RowParallelLinear
from llmbench.layers.norm import RMSNorm
from llmbench.layers.parallel import TPGroup
from llmbench.layers.rotary import RotaryEmbedding


class Attention(nn.Module):
    def __init__(
        self,
        hidden: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        qkv_bias: bool,
        qk_norm: bool,
        rms_norm_eps: float,
        rotary: RotaryEmbedding,
        backend: AttentionBackend,
        tp: TPGroup,
        use_triton: bool,
    ) -> None:
        super().__init__()
        self.qkv_proj = QKVParallelLinear(hidden, head_dim, num_heads, num_kv_heads, qkv_bias, tp)
        self.num_heads = self.qkv_proj.num_heads
        self.num_kv_heads = self.qkv_proj.num_kv_heads
        self.head_dim = head_dim
        self.o_proj = RowParallelLinear(num_heads * head_dim, hidden, bias=False, tp=tp)
        self.q_norm = RMSNorm(head_dim, rms_norm_eps, use_triton) if qk_norm else None
        self.k_norm = RMSNorm(head_dim, rms_norm_eps, use_triton) if qk_norm else None
        self.rotary = rotary
        self.backend = backend
        self.scale = head_dim**-0.5
        self.eps = rms_norm_eps
        # With Triton kernels and a backend that reads K/V from the cache: one kernel from the projection
        # to attention (q/k norm, RoPE, KV store) instead of up to six.
        self.fused_prologue = use_triton and backend.attends_from_cache

    def forward(
        self,
        positions: torch.Tensor,  # (T,)
        x: torch.Tensor,  # (T, hidden)
        meta: AttentionMetadata,
        kv_cache: LayerKV,
    ) -> torch.Tensor:
        # -> (T, hidden), summed over the tensor-parallel ranks
        return self.o_proj(self.attend(positions, self.qkv_proj(x), meta, kv_cache))

    def attend(
        self,
        positions: torch.Tensor,  # (T,)
        qkv: torch.Tensor,  # (T, (Hq + 2 Hk) D): the q/k/v projection's output
        meta: AttentionMetadata,
        kv_cache: LayerKV,
    ) -> torch.Tensor:
        # -> (T, Hq D): attention's output, the input of the output projection
        T = qkv.shape[0]
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        if self.fused_prologue:
            o = self.backend.forward_qkv(  # type: ignore[attr-defined]
                qkv,
                positions,
                self.rotary.cos_sin_cache,
                *self._qk_norm_weights,
                self.eps,
                self.num_heads,
                self.num_kv_heads,
                kv_cache,
                meta,
                self.scale,
            )
            return o.reshape(T, q_size)
        q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
        q = q.reshape(T, self.num_heads, self.head_dim)
        k = k.reshape(T, self.num_kv_heads, self.head_dim)
        v = v.reshape(T, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q = self.q_norm(q.reshape(-1, self.head_dim))[0].view(T, self.num_heads, self.head_dim)
            k = self.k_norm(k.reshape(-1, self.head_dim))[0].view(T, self.num_kv_heads, self.head_dim)
        q, k = self.rotary(positions, q, k)
        o = self.backend.forward(q, k, v, kv_cache, meta, self.scale)  # (T, Hq, D)
        return o.reshape(T, q_size)

    @property
    def _qk_norm_weights(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        return (
            None if self.q_norm is None else self.q_norm.weight,
            None if self.k_norm is None else self.k_norm.weight,
        )

    def store_qkv(
        self,
        positions: torch.Tensor,  # (T,)
        qkv: torch.Tensor,  # (T, (Hq + 2 Hk) D)
        slot_mapping: torch.Tensor,  # (T,): -1 for a padded row, which stores nothing
        kv_cache: LayerKV,
        q_out: torch.Tensor,  # (T, Hq, D)
    ) -> None:
        """The fused prologue alone: q and k normalised and rotated, K/V into their slots, q into ``q_out``.
        Never the step that sets a float8 cache's scales (``forward_qkv`` takes that one)."""
        backend = self.backend
        assert self.fused_prologue and isinstance(backend, CacheAttentionBackend)
        backend.prologue(
            qkv, positions, self.rotary.cos_sin_cache, *self._qk_norm_weights, self.eps, self.num_heads,
            self.num_kv_heads, kv_cache, slot_mapping, out=q_out,
        )  # fmt: skip

    def attend_stored(
        self, q: torch.Tensor, meta: AttentionMetadata, kv_cache: LayerKV, out: torch.Tensor
    ) -> None:
        """Attention of q (T, Hq, D) over the cache that ``store_qkv`` wrote, into ``out`` (T, Hq, D)."""
        backend = self.backend
        assert isinstance(backend, CacheAttentionBackend)
        backend.attend(
            q, kv_cache.k, kv_cache.v, meta, self.scale, kv_cache.k_scale, kv_cache.v_scale, out=out
        )
