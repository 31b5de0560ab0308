"""Rotary position embedding, neox style (rotate the two halves), as Hugging Face's Llama/Qwen do.

``cos_sin_cache``: (max_positions, head_dim) float32, cos in the first half, sin in the second.
``apply_rotary_ref`` is plain torch; ``apply_rotary`` the Triton version with the same signature, which
returns fresh outputs (q and k are not modified). Both rotate in float32 and round once to q's dtype.
"""

from __future__ import annotations

import torch

from llmbench.kernels._triton import jit, next_power_of_2, programmatic, require_triton, tl, wait_for_inputs


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


@jit
def _rotate_heads(
    x_ptr, o_ptr, stride_xh, stride_oh, H, HALF, cos, sin,
    BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
):  # fmt: skip
    h = tl.arange(0, BLOCK_H)
    j = tl.arange(0, BLOCK_HALF)
    mask = (h[:, None] < H) & (j[None, :] < HALF)
    x_offs = h[:, None] * stride_xh + j[None, :]  # (BLOCK_H, BLOCK_HALF)
    o_offs = h[:, None] * stride_oh + j[None, :]
    x1 = tl.load(x_ptr + x_offs, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + x_offs + HALF, mask=mask, other=0.0).to(tl.float32)
    tl.store(o_ptr + o_offs, (x1 * cos - x2 * sin).to(o_ptr.dtype.element_ty), mask=mask)
    tl.store(o_ptr + o_offs + HALF, (x2 * cos + x1 * sin).to(o_ptr.dtype.element_ty), mask=mask)


@jit
def _rotary_kernel(
    q_ptr, k_ptr, pos_ptr, cs_ptr, qo_ptr, ko_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_qot, stride_qoh, stride_kot, stride_koh, stride_cs,
    HQ, HK, HALF,
    BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_HALF: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    wait_for_inputs(PDL)
    # One program per token: its cos/sin row is read once and used for all q and k heads.
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    j = tl.arange(0, BLOCK_HALF)
    cs_row = cs_ptr + pos * stride_cs
    cos = tl.load(cs_row + j, mask=j < HALF, other=0.0).to(tl.float32)[None, :]  # (1, BLOCK_HALF)
    sin = tl.load(cs_row + HALF + j, mask=j < HALF, other=0.0).to(tl.float32)[None, :]
    q_in, q_out = q_ptr + t * stride_qt, qo_ptr + t * stride_qot
    k_in, k_out = k_ptr + t * stride_kt, ko_ptr + t * stride_kot
    _rotate_heads(q_in, q_out, stride_qh, stride_qoh, HQ, HALF, cos, sin, BLOCK_HQ, BLOCK_HALF)
    _rotate_heads(k_in, k_out, stride_kh, stride_koh, HK, HALF, cos, sin, BLOCK_HK, BLOCK_HALF)


def apply_rotary(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    require_triton("apply_rotary")
    # q: (T, Hq, D), k: (T, Hk, D), positions: (T,) -> fresh (T, Hq, D), (T, Hk, D)
    T, Hq, D = q.shape
    Hk = k.shape[1]
    if D % 2 or k.shape != (T, Hk, D) or cos_sin_cache.shape[-1] != D:
        raise ValueError(
            f"expected q (T, Hq, D), k (T, Hk, D), cos_sin_cache (P, D) with D even; got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(cos_sin_cache.shape)}"
        )
    q = q if q.stride(-1) == 1 else q.contiguous()  # views of a fused qkv keep their row strides
    k = k if k.stride(-1) == 1 else k.contiguous()
    cos_sin_cache = cos_sin_cache.contiguous()
    q_out = torch.empty((T, Hq, D), dtype=q.dtype, device=q.device)
    k_out = torch.empty((T, Hk, D), dtype=k.dtype, device=k.device)
    if T > 0:
        _rotary_kernel[(T,)](
            q, k, positions, cos_sin_cache, q_out, k_out,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1),
            q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1), cos_sin_cache.stride(0),
            Hq, Hk, D // 2,
            BLOCK_HQ=next_power_of_2(Hq), BLOCK_HK=next_power_of_2(Hk), BLOCK_HALF=next_power_of_2(D // 2),
            num_warps=4,
            **programmatic(q, T),
        )  # fmt: skip
    return q_out, k_out
