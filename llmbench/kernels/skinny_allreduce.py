"""A row-parallel layer's product, then the all-reduce and residual add after it, in the same kernel.

At tp > 1 and one-row decode steps (``tp_fuse_matmul``), o_proj and down_proj end with partial sums that
every rank needs added up. Here the skinny matmul's programs (kernels/skinny_matmul.py, ``REDUCE``) write
their partial sums straight into every rank's receive buffer and the kernel's last programs add them:
no all-reduce kernel after the product. The RMSNorm that follows is left to the next product, which
takes the sums of squares written here (``skinny_norm_matmul(..., squares=)``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from llmbench.kernels._triton import cdiv, require_triton
from llmbench.kernels.allreduce_norm import allreduce_norm_ref
from llmbench.kernels.skinny_matmul import (
    Reduce,
    Tiles,
    launch,
    skinny_matmul_ref,
    skinny_silu_matmul_ref,
)

# Columns per program in the sum after a product: at 1024 the kernel took 96 registers a thread (sm_90),
# at 512 or less 72 (the product alone: 64), a whole 4096-wide row in one program 255. On two H200s o_proj
# then gate_up took 34.1 / 35.0 / 35.4 µs at 256 / 512 / 1024 (devtools/allreduce_probe.py --matmul).
REDUCE_BLOCK = 256


def skinny_matmul_allreduce_ref(
    xs: Sequence[torch.Tensor],
    weights: Sequence[torch.Tensor],
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
    gated: bool = False,
    block: int = REDUCE_BLOCK,
) -> tuple[torch.Tensor, torch.Tensor]:
    # every rank's x (M, K or 2K) and weight (N, K), in rank order; bias (N,) counted once (rank 0's) ->
    # (sum of the products + residual (M, N), its squares summed over each block of columns (M, N/block))
    product = skinny_silu_matmul_ref if gated else skinny_matmul_ref
    parts = [
        product(x, w, bias if q == 0 else None) for q, (x, w) in enumerate(zip(xs, weights, strict=True))
    ]
    ones = torch.ones(parts[0].shape[1], dtype=parts[0].dtype, device=parts[0].device)
    _, h = allreduce_norm_ref(parts, residual, ones, 1e-6)
    squares = h.float() ** 2
    pad = -squares.shape[1] % block
    return h, F.pad(squares, (0, pad)).view(h.shape[0], -1, block).sum(-1)


def skinny_matmul_allreduce(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    recv_addrs: torch.Tensor,
    rank: int,
    residual: torch.Tensor | None,
    gated: bool = False,
    tiles: Tiles | None = None,
    block: int = REDUCE_BLOCK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A row-parallel layer, the all-reduce and the residual add after it, in one kernel per rank:
    ``(sum over the ranks of x @ weight.T (+ bias) + residual, its squares summed per block of columns)``,
    the sum bit for bit as ``allreduce_norm_ref`` adds, the squares (float32, (M, cdiv(N, block))) what
    ``skinny_norm_matmul(..., squares=)`` needs for the RMSNorm before the next product.

    Each program writes its partial sums into every rank's receive buffer (section ``rank``, over NVLink
    for the peers); the last ``cdiv(N, block)`` programs each wait until their columns of every section
    have arrived in this rank's buffer, add the sections in rank order, add the residual and mark those
    columns empty again. An element not yet written is told by its value: -0.0, which no partial sum is
    written as (a -0.0 goes out as +0.0, the same number). No flags, no fence: the data is the signal.

    recv_addrs: int64 (W,), the address of each rank's receive buffer, room for (W, M, N) values of
    ``x``'s dtype, all -0.0 before the call (``allreduce_norm.mark_empty``; so again on this rank after
    it). Every rank must make the same call, with the same shapes; a buffer is used again only after
    every rank has passed at least one other all-reduce since, or a fast rank could write into it
    before a slow one has emptied it (distributed/fused.py alternates two). ``gated``: x is the
    gated MLP's gate | up."""
    require_triton("skinny_matmul_allreduce")
    M, N = x.shape[0], weight.shape[0]
    world = recv_addrs.numel()
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} of {world} ranks")
    if residual is not None:
        if residual.shape != (M, N) or residual.dtype != x.dtype:
            raise ValueError(
                f"residual must be {(M, N)} {x.dtype}, got {tuple(residual.shape)} {residual.dtype}"
            )
        residual = residual if residual.stride(-1) == 1 else residual.contiguous()
    h = torch.empty((M, N), dtype=x.dtype, device=x.device)
    ss = torch.empty((M, cdiv(N, block)), dtype=torch.float32, device=x.device)
    launch(x, weight, bias, tiles, gated=gated, reduce=Reduce(recv_addrs, rank, residual, h, ss, block))
    return h, ss
