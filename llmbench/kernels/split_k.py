"""A product cut along its input features: float32 partial sums, added up by the kernel that reads them.

cuBLAS spreads a product of a few hundred rows over the GPU by its output tiles, and a narrow product
(few output features: qwen3-0.6b's attention output and down projection, 1,024) has few of them, so its
decode-step products take two to three times what reading their weights takes. Cut into ``split`` parts
along the input features, each program takes a tile of rows and outputs and one part, and writes its
float32 partial sums (split, T, N); the RMSNorm that reads the product next (kernels/rmsnorm.py) adds them
up, rounds them to the model's dtype as the product's own output would be, and goes on, so the cut costs
no launch of its own. On an H200 (``python devtools/splitk_matmul.py``, BENCHMARKS.md "The narrow products
cut along their inputs") this takes a third to two fifths off cuBLAS at 64 and 128 rows and a tenth at
256, on the narrow products only: ``split_tiles`` says where it applies.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from llmbench.kernels._triton import jit, require_triton, tl

NARROW = 1024  # products of at most this many outputs are cut: qwen3-0.6b's, where it was measured
MAX_ROWS = 256  # measured up to here


class SplitTiles(NamedTuple):
    split: int  # parts of the input features
    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 4


def split_tiles(rows: int, n: int, k: int, dtype: torch.dtype) -> SplitTiles | None:
    """The tiles of an (rows x k) @ (k x n) product cut along k, or None where the cut is not measured to
    pay (wide products, more than ``MAX_ROWS`` rows, float32) or the shape does not divide into them. The
    best of 96 tilings on qwen3-0.6b's narrow products: 64 x 64 tiles, 128-feature steps, 4 parts up to 128
    rows and 2 above (the o projection at 256 rows; the down projection is within 1% either way)."""
    if n > NARROW or rows > MAX_ROWS or dtype not in (torch.bfloat16, torch.float16):
        return None
    tiles = SplitTiles(4 if rows <= 128 else 2, 64, 64, 128)
    if n % tiles.block_n or k % (tiles.split * tiles.block_k):
        return None
    return tiles


@jit(do_not_specialize=("M",))
def _split_k_kernel(
    x_ptr, w_ptr, part_ptr, M, N, K, k_part, stride_xm, stride_wn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    # Grid (N / BLOCK_N, cdiv(M, BLOCK_M), split): part[s] = x[:, s k_part:(s + 1) k_part] @ w[:, ...].T
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    s = tl.program_id(2)
    ks = tl.arange(0, BLOCK_K)
    row_ok = rows < M
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in range(s * k_part, (s + 1) * k_part, BLOCK_K):
        x = tl.load(x_ptr + rows[:, None] * stride_xm + (k0 + ks)[None, :], mask=row_ok[:, None], other=0.0)
        w = tl.load(w_ptr + cols.to(tl.int64)[:, None] * stride_wn + (k0 + ks)[None, :])
        acc = tl.dot(x, tl.trans(w), acc)
    tl.store(part_ptr + (s * M + rows[:, None]) * N + cols[None, :], acc, mask=row_ok[:, None])


def split_k_matmul_ref(x: torch.Tensor, weight: torch.Tensor, split: int) -> torch.Tensor:
    """(split, T, N) float32: part s is x's s-th slice of input features times the weight's."""
    k = x.shape[-1]
    xs = x.float().view(x.shape[0], split, k // split).transpose(0, 1)  # (split, T, k / split)
    ws = weight.float().view(weight.shape[0], split, k // split).transpose(0, 1)  # (split, N, k / split)
    return torch.bmm(xs, ws.transpose(1, 2))


def split_k_matmul(x: torch.Tensor, weight: torch.Tensor, tiles: SplitTiles) -> torch.Tensor:
    """Triton version of ``split_k_matmul_ref`` (x: (T, K), weight: (N, K)), tiled by ``tiles``."""
    require_triton("split_k_matmul")
    m, k = x.shape
    n = weight.shape[0]
    if n % tiles.block_n or k % (tiles.split * tiles.block_k) or weight.shape[1] != k:
        raise ValueError(
            f"a ({m}, {k}) x ({n}, {weight.shape[1]}) product does not divide into {tiles}: N must be a "
            f"multiple of {tiles.block_n} and K of {tiles.split * tiles.block_k}"
        )
    x = x if x.stride(-1) == 1 else x.contiguous()
    out = torch.empty((tiles.split, m, n), dtype=torch.float32, device=x.device)
    if m:
        _split_k_kernel[(n // tiles.block_n, -(-m // tiles.block_m), tiles.split)](
            x, weight, out, m, n, k, k // tiles.split, x.stride(0), weight.stride(0),
            BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k,
            num_warps=tiles.num_warps, num_stages=tiles.num_stages,
        )  # fmt: skip
    return out
