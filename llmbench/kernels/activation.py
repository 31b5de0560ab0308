"""SiLU-and-multiply of the gated MLP: ``silu(x[..., :I]) * x[..., I:]``.

``silu_and_mul_ref`` is plain torch; ``silu_and_mul`` is the Triton version (same signature, fresh
output). The SiLU is computed in float32 and rounded to the model dtype before the multiply, as
torch's ``F.silu(gate) * up`` does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from llmbench.kernels._triton import cdiv, jit, programmatic, require_triton, tl, wait_for_inputs


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    # x: (T, 2I) -> (T, I)
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


@jit
def _silu_and_mul_kernel(
    x_ptr, out_ptr, inter, stride_x, stride_o, BLOCK: tl.constexpr, PDL: tl.constexpr = False
):
    wait_for_inputs(PDL)
    # Grid (T, cdiv(I, BLOCK)): a 2-D grid keeps every program's work equal for any T and I.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)  # (BLOCK,)
    up = tl.load(x_ptr + row * stride_x + inter + cols, mask=mask, other=0.0).to(tl.float32)
    act = (gate / (1.0 + tl.exp(-gate))).to(x_ptr.dtype.element_ty)  # rounded like F.silu's output
    tl.store(
        out_ptr + row * stride_o + cols, (act.to(tl.float32) * up).to(out_ptr.dtype.element_ty), mask=mask
    )


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    require_triton("silu_and_mul")
    # x: (..., 2I) -> (..., I)
    if x.shape[-1] % 2:
        raise ValueError(f"last dimension must be even (gate and up halves), got {x.shape[-1]}")
    inter = x.shape[-1] // 2
    x2 = x.reshape(-1, 2 * inter)  # (T, 2I)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    T = x2.shape[0]
    out = torch.empty((T, inter), dtype=x.dtype, device=x.device)  # (T, I)
    BLOCK = 1024  # 4 warps x 32 threads x 8 bf16 = one 16-byte load per thread per half
    if T > 0 and inter > 0:
        _silu_and_mul_kernel[(T, cdiv(inter, BLOCK))](
            x2, out, inter, x2.stride(0), out.stride(0), BLOCK=BLOCK, num_warps=4, **programmatic(x2, T)
        )
    return out.view(*x.shape[:-1], inter)
