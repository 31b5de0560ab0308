"""SiLU-and-multiply of the gated MLP: ``silu(x[..., :I]) * x[..., I:]``.

``silu_and_mul_ref`` is plain torch; ``silu_and_mul`` is the Triton version (same signature, fresh
output). The SiLU is computed in float32 and rounded to the model dtype before the multiply, as
torch's ``F.silu(gate) * up`` does. ``prefetch``: the down projection's weight, asked into L2 by extra
programs of the kernel (kernels/prefetch.py); a hint that changes no value (the reference ignores it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from llmbench.kernels._triton import cdiv, jit, programmatic, require_triton, tl, wait_for_inputs
from llmbench.kernels.prefetch import prefetch_l2, prefetch_launch


def silu_and_mul_ref(x: torch.Tensor, prefetch: torch.Tensor | None = None) -> torch.Tensor:
    # x: (T, 2I) -> (T, I)
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


@jit(do_not_specialize=("T",))
def _silu_and_mul_kernel(
    x_ptr, out_ptr, inter, stride_x, stride_o, T, pf_ptr, pf_bytes, BLOCK: tl.constexpr,
    PREFETCH: tl.constexpr = False, PF_CHUNK: tl.constexpr = 0, PF_LANES: tl.constexpr = 0,
    PDL: tl.constexpr = False,
):  # fmt: skip
    # Grid (T, cdiv(I, BLOCK)): a 2-D grid keeps every program's work equal for any T and I. With PREFETCH
    # the programs of the rows from T on ask the down projection's weight into L2 first, a chunk each.
    row = tl.program_id(0).to(tl.int64)
    if PREFETCH:
        if row >= T:
            chunk = (row - T) * tl.num_programs(1) + tl.program_id(1)
            prefetch_l2(pf_ptr, pf_bytes, chunk, PF_CHUNK, PF_LANES)
    wait_for_inputs(PDL)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    if PREFETCH:  # the prefetching programs' rows are past the end
        mask = mask & (row < T)
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)  # (BLOCK,)
    up = tl.load(x_ptr + row * stride_x + inter + cols, mask=mask, other=0.0).to(tl.float32)
    act = (gate / (1.0 + tl.exp(-gate))).to(x_ptr.dtype.element_ty)  # rounded like F.silu's output
    tl.store(
        out_ptr + row * stride_o + cols, (act.to(tl.float32) * up).to(out_ptr.dtype.element_ty), mask=mask
    )


def silu_and_mul(x: torch.Tensor, prefetch: torch.Tensor | None = None) -> torch.Tensor:
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
        num_warps = 4
        programs, pf = prefetch_launch(prefetch, out, num_warps)
        columns = cdiv(inter, BLOCK)
        _silu_and_mul_kernel[(T + cdiv(programs, columns), columns)](
            x2, out, inter, x2.stride(0), out.stride(0), T, BLOCK=BLOCK, num_warps=num_warps, **pf,
            **programmatic(x2, T),
        )  # fmt: skip
    return out.view(*x.shape[:-1], inter)
