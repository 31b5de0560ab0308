"""The attention prologue inside the decode kernel: a decode step's q/k norms, RoPE and K/V store done by
the decode attention's own programs, so that a layer's decode step launches one kernel fewer.

A decode step has one new token per sequence, and the decode kernel's programs already own one (sequence,
KV head) each. With a ``DecodePrologue`` each program reads its query heads straight from the fused q/k/v
projection's output and normalises and rotates them itself; the program whose slice of the context holds
the new token also normalises and rotates that token's key and stores it and the value in their cache
slot, and a barrier then orders those stores before the block's own reads of its tiles (a block's writes
are visible to its threads after a barrier). Taking the new token's K/V from registers instead, a select
on the last tile's loads, kept those tiles out of the pipelined asynchronous copies: on an H200 that
doubled the kernel's shared memory and halved its read rate.

The roundings are those of ``attention_prologue``: the normalised value rounded to the model dtype, then
again after the norm's weight, the rotation in float32 rounded once. Only the sum of squares under the
norms runs in another order (over a head's whole width at once, not half by half), which can move the
last bit of a float32 scale. A float8 cache keeps the separate prologue (its quantising store and the
scales' calibration step).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from llmbench.kernels._triton import jit, tl


class DecodePrologue(NamedTuple):
    """What the decode kernel needs to do the prologue itself (``attention_prologue``'s arguments)."""

    qkv: torch.Tensor  # (B, (Hq + 2 Hk) D): the projection's output, one row per sequence
    positions: torch.Tensor  # (B,): the new token's position (its sequence's length - 1)
    cos_sin_cache: torch.Tensor  # (max_position, D): cos in the first half, sin in the second
    q_norm_weight: torch.Tensor | None  # (D,) Qwen3's per-head norms; None for none
    k_norm_weight: torch.Tensor | None
    eps: float
    slot_mapping: torch.Tensor  # (B,): the new token's cache slot; -1 (a padded row) stores nothing

    def q_view(self, num_heads: int, head_dim: int) -> torch.Tensor:
        """The projection's query part as (B, Hq, D), a view of ``qkv``."""
        return self.qkv[:, : num_heads * head_dim].unflatten(1, (num_heads, head_dim))

    def check(self, num_heads: int, num_kv_heads: int, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
        B, width = self.qkv.shape
        D = k_cache.shape[-1]
        if width != (num_heads + 2 * num_kv_heads) * D or self.qkv.stride(-1) != 1:
            raise ValueError(
                f"the prologue's qkv must be (B, {(num_heads + 2 * num_kv_heads) * D}) and contiguous in its "
                f"last dim; got {tuple(self.qkv.shape)}"
            )
        if self.positions.shape != (B,) or self.slot_mapping.shape != (B,):
            raise ValueError(f"positions and slot_mapping must be ({B},), one per sequence")
        if self.cos_sin_cache.shape[-1] != D or D % 2:
            raise ValueError(f"cos_sin_cache must be (P, {D}) with an even head size")
        if k_cache.dtype != self.qkv.dtype or v_cache.stride() != k_cache.stride():
            raise ValueError(
                "the decode kernel's prologue stores into a cache of the model's dtype, V laid out as K "
                f"(a float8 cache takes the separate prologue); got {k_cache.dtype} for {self.qkv.dtype}"
            )

    def launch_args(self, q: torch.Tensor) -> tuple:
        """The kernel's prologue arguments; placeholders (never read) without one: ``(q,) * 5 + (0.0, 0)``."""
        has_norm = self.q_norm_weight is not None and self.k_norm_weight is not None
        qw = self.q_norm_weight.contiguous() if has_norm else q
        kw = self.k_norm_weight.contiguous() if has_norm else q
        cs = self.cos_sin_cache.contiguous()
        return (self.positions, cs, qw, kw, self.slot_mapping, self.eps, cs.stride(0))

    @property
    def has_norm(self) -> bool:
        return self.q_norm_weight is not None and self.k_norm_weight is not None


def no_prologue_args(q: torch.Tensor) -> tuple:
    return (q, q, q, q, q, 0.0, 0)


@jit
def rotated_heads(
    row_ptr, w_ptr, h, h_mask, d, eps, cos, sin,
    HEAD_DIM: tl.constexpr, HALF: tl.constexpr, HAS_NORM: tl.constexpr,
):  # fmt: skip
    # Heads ``h`` (BLOCK_H,) of one token at row_ptr + h * HEAD_DIM, (BLOCK_H, BLOCK_D) in the row's dtype:
    # normalised (HAS_NORM) and rotated. Each element's rotation partner (the other half's element) is
    # loaded beside it; ``sin`` comes signed (-sin for the first half), so both halves are one expression.
    d_ok = d < HEAD_DIM
    mask = h_mask[:, None] & d_ok[None, :]
    partner = (d + HALF) % (2 * HALF)
    base = row_ptr + h[:, None] * HEAD_DIM
    dtype = row_ptr.dtype.element_ty
    x = tl.load(base + d[None, :], mask=mask, other=0.0).to(tl.float32)
    p = tl.load(base + partner[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_NORM:
        inv_rms = tl.rsqrt(tl.sum(x * x, axis=1) / HEAD_DIM + eps)[:, None]
        wx = tl.load(w_ptr + d, mask=d_ok, other=0.0).to(tl.float32)[None, :]
        wp = tl.load(w_ptr + partner, mask=d_ok, other=0.0).to(tl.float32)[None, :]
        x = ((x * inv_rms).to(dtype).to(tl.float32) * wx).to(dtype).to(tl.float32)
        p = ((p * inv_rms).to(dtype).to(tl.float32) * wp).to(dtype).to(tl.float32)
    return (x * cos + p * sin).to(dtype)


@jit
def cos_sin_at(cs_ptr, pos_ptr, seq, stride_cs, d, HEAD_DIM: tl.constexpr, HALF: tl.constexpr):
    # (1, BLOCK_D) cos and signed sin of sequence ``seq``'s position, each half's angle repeated.
    pos = tl.load(pos_ptr + seq).to(tl.int64)
    j = d % HALF
    ok = d < HEAD_DIM
    cos = tl.load(cs_ptr + pos * stride_cs + j, mask=ok, other=0.0).to(tl.float32)
    sin = tl.load(cs_ptr + pos * stride_cs + HALF + j, mask=ok, other=0.0).to(tl.float32)
    return cos[None, :], tl.where(d < HALF, -sin, sin)[None, :]
