"""RMSNorm, optionally fused with the residual add that precedes it.

With ``residual``: ``h = x + residual``; returns ``(rmsnorm(h) * weight, h)``. Without: returns
``(rmsnorm(x) * weight, None)``. The statistics are computed in float32, as Hugging Face does, and the
normalised value is cast back to the input dtype before the weight multiply.

``rms_norm_ref`` is plain torch; ``rms_norm`` is the Triton version with the same signature (one
program per row, fresh outputs; inputs are not modified). ``h_out`` gives h a tensor to be written into
instead, which may be ``residual`` itself: the residual stream updated in place.
"""

from __future__ import annotations

import torch

from llmbench.kernels._triton import jit, next_power_of_2, programmatic, require_triton, tl, wait_for_inputs


def rms_norm_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    h_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    # x, residual: (T, H); weight: (H,)
    # The add happens in the model dtype, as in Hugging Face's decoder layer.
    h = x if residual is None else x + residual
    hf = h.float()
    out = (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight
    if residual is None:
        return out, None
    return out, (h if h_out is None else h_out.copy_(h))


@jit
def _rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, h_ptr,
    H, stride_x, stride_r, stride_o, stride_h, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK_H: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    wait_for_inputs(PDL)
    # One program per row: a whole hidden vector fits in registers (H <= 16K).
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_H)
    mask = cols < H
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)  # (BLOCK_H,)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_r + cols, mask=mask, other=0.0)
        x = (x + r).to(x_ptr.dtype.element_ty)  # rounded to the model dtype, as the reference adds
        tl.store(h_ptr + row * stride_h + cols, x, mask=mask)
    xf = x.to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(xf * xf, axis=0) / H + eps)
    normed = (xf * inv_rms).to(x_ptr.dtype.element_ty)  # cast back before the weight, as Hugging Face does
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    out = normed.to(tl.float32) * w.to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    h_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Triton version of ``rms_norm_ref``: one read of x (and residual), one write of out (and h)."""
    require_triton("rms_norm")
    H = x.shape[-1]
    if weight.shape != (H,):
        raise ValueError(f"weight must be ({H},), got {tuple(weight.shape)}")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(
            f"residual must match x {tuple(x.shape)} {x.dtype}, got {tuple(residual.shape)} {residual.dtype}"
        )
    x2 = x.reshape(-1, H)  # (T, H); a copy only if rows are not evenly strided
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    T = x2.shape[0]
    out = torch.empty((T, H), dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    if residual is not None:
        r2 = residual.reshape(-1, H)
        r2 = r2 if r2.stride(-1) == 1 else r2.contiguous()
        if h_out is None:
            h = torch.empty((T, H), dtype=x.dtype, device=x.device)
        elif h_out.shape != x.shape or h_out.dtype != x.dtype or h_out.stride(-1) != 1 or h_out.dim() != 2:
            raise ValueError(
                f"h_out must be a (T, H) tensor like x {tuple(x.shape)} {x.dtype}, contiguous in its rows; "
                f"got {tuple(h_out.shape)} {h_out.dtype}"
            )
        else:
            h = h_out  # may be the residual itself: each program reads its row before writing it
    else:
        r2, h = x2, out  # placeholders, never touched when HAS_RESIDUAL is False
    BLOCK_H = next_power_of_2(H)
    # 16 bf16 elements (two 16-byte loads) per thread at H=4096; more warps would only add reductions.
    num_warps = min(16, max(1, BLOCK_H // 512))
    if T > 0:
        _rms_norm_kernel[(T,)](
            x2, r2, weight.contiguous(), out, h,
            H, x2.stride(0), r2.stride(0), out.stride(0), h.stride(0), eps,
            HAS_RESIDUAL=residual is not None, BLOCK_H=BLOCK_H, num_warps=num_warps,
            **programmatic(x2, T),
        )  # fmt: skip
    out = out.view(x.shape)
    return out, (None if residual is None else h.view(x.shape))
