"""The tokens of a decode step's rows, some of them the last step's samples still on the device.

Under asynchronous scheduling a row's input token may not be on the host yet: the row names where it is
among the last step's sampled ids (``fill[r] >= 0``) and takes it from there; a row with ``fill[r] < 0``
keeps the id the host sent. Inside a decode CUDA Graph this is one small kernel instead of the four that
torch's ``where`` over a gather would launch.

``fill_tokens_ref`` is plain torch; ``fill_tokens`` is the Triton version with the same signature.
"""

from __future__ import annotations

import torch

from llmbench.kernels._triton import cdiv, jit, require_triton, tl

_BLOCK = 1024  # rows a program takes: a decode batch is at most a few hundred


def fill_tokens_ref(
    input_ids: torch.Tensor,  # (B,) int64: the ids the host sent
    fill: torch.Tensor,  # (B,) int64: a row's place among ``last``, or -1 to keep its own id
    last: torch.Tensor,  # (M,) int64: the last step's sampled ids
) -> torch.Tensor:
    """(B,) int64 token ids."""
    return torch.where(fill >= 0, last[fill.clamp(min=0)], input_ids)


@jit
def _token_fill_kernel(ids_ptr, fill_ptr, last_ptr, out_ptr, B, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    rows = offs < B
    src = tl.load(fill_ptr + offs, mask=rows, other=-1)
    own = tl.load(ids_ptr + offs, mask=rows, other=0)
    taken = tl.load(last_ptr + tl.maximum(src, 0), mask=rows & (src >= 0), other=0)
    tl.store(out_ptr + offs, tl.where(src >= 0, taken, own), mask=rows)


def fill_tokens(input_ids: torch.Tensor, fill: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
    """Triton version of ``fill_tokens_ref``."""
    require_triton("fill_tokens")
    B = input_ids.shape[0]
    out = torch.empty_like(input_ids)
    if B:
        block = min(_BLOCK, max(16, 1 << (B - 1).bit_length()))
        _token_fill_kernel[(cdiv(B, block),)](input_ids, fill, last, out, B, BLOCK=block)
    return out
