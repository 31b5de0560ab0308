"""RMSNorm, optionally fused with the residual add that precedes it.

With ``residual``: ``h = x + residual``; returns ``(rmsnorm(h) * weight, h)``. Without: returns
``(rmsnorm(x) * weight, None)``. The statistics are computed in float32, as Hugging Face does, and the
normalised value is cast back to the input dtype before the weight multiply.

``rms_norm_ref`` is plain torch; ``rms_norm`` is the Triton version with the same signature (one
program per row, fresh outputs; inputs are not modified). ``h_out`` gives h a tensor to be written into
instead, which may be ``residual`` itself: the residual stream updated in place.

``x`` may instead be the float32 partial sums (S, T, H) of a product cut along its input features
(kernels/split_k.py): they are added up first and rounded to the residual's dtype, as the product's own
output would have been, then added to ``residual``, which they need.

``prefetch``: the weight of the product after the norm, asked into L2 by extra programs of the kernel
(kernels/prefetch.py); a hint that changes no value (the reference ignores it).
"""

from __future__ import annotations

import torch

from llmbench.kernels._triton import jit, next_power_of_2, programmatic, require_triton, tl, wait_for_inputs
from llmbench.kernels.prefetch import prefetch_l2, prefetch_launch


def rms_norm_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    h_out: torch.Tensor | None = None,
    prefetch: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    # x, residual: (T, H) (or x: (S, T, H) partial sums); weight: (H,)
    # The add happens in the model dtype, as in Hugging Face's decoder layer.
    x = _summed(x, residual)
    h = x if residual is None else x + residual
    hf = h.float()
    out = (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight
    if residual is None:
        return out, None
    return out, (h if h_out is None else h_out.copy_(h))


def _is_cut(x: torch.Tensor, residual: torch.Tensor | None) -> bool:
    """Whether x is the partial sums (S, T, H) of a product cut along its inputs: float32, one dimension
    more than the residual stream it is added to, which is in a 16-bit model dtype."""
    return (
        residual is not None
        and x.dtype == torch.float32
        and residual.dtype != torch.float32
        and x.dim() == residual.dim() + 1
    )


def _check_parts(parts: torch.Tensor, residual: torch.Tensor) -> None:
    if residual.shape != parts.shape[1:]:
        raise ValueError(
            f"partial sums {tuple(parts.shape)} need a residual of shape {tuple(parts.shape[1:])} to be added to"
        )


def _summed(x: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
    """x, or the partial sums x (S, T, H) added up and rounded to the residual's dtype."""
    if not _is_cut(x, residual):
        return x
    _check_parts(x, residual)
    return x.sum(dim=0).to(residual.dtype)


@jit(do_not_specialize=("T",))
def _rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, h_ptr,
    H, stride_x, stride_r, stride_o, stride_h, eps, stride_part, T, pf_ptr, pf_bytes,
    HAS_RESIDUAL: tl.constexpr, BLOCK_H: tl.constexpr, PARTS: tl.constexpr = 0,
    PREFETCH: tl.constexpr = False, PF_CHUNK: tl.constexpr = 0, PF_LANES: tl.constexpr = 0,
    PDL: tl.constexpr = False,
):  # fmt: skip
    # One program per row: a whole hidden vector fits in registers (H <= 16K); with PREFETCH, programs
    # from T on ask the next product's weight into L2 first, and their rows are masked out.
    row = tl.program_id(0).to(tl.int64)
    if PREFETCH:
        if row >= T:
            prefetch_l2(pf_ptr, pf_bytes, row - T, PF_CHUNK, PF_LANES)
    wait_for_inputs(PDL)
    cols = tl.arange(0, BLOCK_H)
    mask = cols < H
    if PREFETCH:  # the prefetching programs' rows are past the end
        mask = mask & (row < T)
    if PARTS > 0:  # float32 partial sums, stride_part apart: added up, rounded as the product's output
        acc = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
        for part in tl.static_range(1, PARTS):
            acc += tl.load(x_ptr + part * stride_part + row * stride_x + cols, mask=mask, other=0.0)
        x = acc.to(res_ptr.dtype.element_ty)
    else:
        x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)  # (BLOCK_H,)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_r + cols, mask=mask, other=0.0)
        x = (x + r).to(r.dtype)  # rounded to the model dtype, as the reference adds
        tl.store(h_ptr + row * stride_h + cols, x, mask=mask)
    xf = x.to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(xf * xf, axis=0) / H + eps)
    normed = (xf * inv_rms).to(x.dtype)  # cast back before the weight, as Hugging Face does
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    out = normed.to(tl.float32) * w.to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    h_out: torch.Tensor | None = None,
    prefetch: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Triton version of ``rms_norm_ref``: one read of x (and residual), one write of out (and h)."""
    require_triton("rms_norm")
    parts = x if _is_cut(x, residual) else None
    if parts is not None:
        _check_parts(parts, residual)
        x = residual  # the model's shape and dtype: the values come from the parts
    H = x.shape[-1]
    if weight.shape != (H,):
        raise ValueError(f"weight must be ({H},), got {tuple(weight.shape)}")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(
            f"residual must match x {tuple(x.shape)} {x.dtype}, got {tuple(residual.shape)} {residual.dtype}"
        )
    if parts is None:
        x2 = x.reshape(-1, H)  # (T, H); a copy only if rows are not evenly strided
        x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
    else:
        x2 = parts.contiguous()  # (S, T, H)
    T = x2.shape[-2]
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
        programs, pf = prefetch_launch(prefetch, out, num_warps)
        _rms_norm_kernel[(T + programs,)](
            x2, r2, weight.contiguous(), out, h,
            H, x2.stride(-2), r2.stride(0), out.stride(0), h.stride(0), eps, x2.stride(0), T,
            HAS_RESIDUAL=residual is not None, BLOCK_H=BLOCK_H, PARTS=0 if parts is None else parts.shape[0],
            num_warps=num_warps, **pf, **programmatic(out, T),
        )  # fmt: skip
    out = out.view(x.shape)
    return out, (None if residual is None else h.view(x.shape))
