"""The skinny matmul's tiles (kernels/skinny_matmul.py): how many output features, input features,
warps and pipeline stages a program takes, and whether it multiplies on the tensor cores."""

from __future__ import annotations

from typing import NamedTuple


class Tiles(NamedTuple):
    block_n: int  # output features per program
    block_k: int  # input features per loop step
    num_warps: int
    num_stages: int
    dot: bool = False  # the product on the tensor cores (block_n >= 16), else broadcast and summed


def tiles_for(rows: int, n: int, k: int, dot: bool = True) -> Tiles:
    """Tile sizes for an (rows x k) @ (k x n) product, from the sweep on an H200 (BENCHMARKS.md,
    ``devtools/bench_gemv.py --sweep``): at one row 4 x 1024 is within 5% of the best of 96 tilings on
    every qwen3-8b (tp=1, tp=2) and qwen3-0.6b layer. From two rows on, the tensor cores: 64 output
    features a program, the input's rows in one tile, its loop steps short enough that the input chunk
    (float32 while it is normalised) stays in registers; ``dot=False``: the broadcast form at any rows."""
    if dot and rows > 1:
        return Tiles(64, 128 if block_m(rows, True) <= 32 else 64, 4, 3, dot=True)
    rows_tile = block_m(rows)
    block_k = min(1024 // rows_tile, _pow2_at_least(k))
    block_n = 2 if n <= 1024 or rows_tile > 2 else 4
    return Tiles(block_n, max(block_k, 16), 4, 2)


def block_m(rows: int, dot: bool = False) -> int:
    """The rows of a program's tile: all the input's, padded to a power of two."""
    if dot:  # the tensor cores' smallest tile
        return max(16, _pow2_at_least(rows))
    return 1 if rows <= 1 else _pow2_at_least(rows)


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()
