"""The skinny matmul's tiles (kernels/skinny_matmul.py): how many output features, input features,
warps and pipeline stages a program takes, and whether it multiplies on the tensor cores."""

from __future__ import annotations

from typing import NamedTuple

SHARED_BUDGET = 160 * 1024  # bytes of pipelined weight and input tiles a program may stage
# What the staged tiles may take at most, whatever the element size: under the 227 KiB of shared memory a
# Hopper multiprocessor gives one program, with room for the rest of the kernel's. The choices below, made
# for 2-byte inputs, fit it; 4-byte (float32) inputs take fewer stages, or shorter input steps.
SHARED_LIMIT = 200 * 1024
WHOLE_ROWS = 64  # up to this many rows a program takes all of them; above, blocks of ``Tiles.block_m``


class Tiles(NamedTuple):
    block_n: int  # output features per program
    block_k: int  # input features per loop step
    num_warps: int
    num_stages: int
    dot: bool = False  # the product on the tensor cores (block_n >= 16), else broadcast and summed
    block_m: int = 0  # input rows per program; 0: all of them, padded to a power of two (``block_m``)


def tiles_for(rows: int, n: int, k: int, dot: bool = True, itemsize: int = 2) -> Tiles:
    """The tiles of ``_tiled`` (below), cut to fit the shared memory at ``itemsize`` bytes an element."""
    t = _tiled(rows, n, k, dot)
    if not t.dot:
        return t
    bm = t.block_m or block_m(rows, True)
    stages, bk = t.num_stages, t.block_k
    while stages > 2 and stages * (t.block_n + bm) * bk * itemsize > SHARED_LIMIT:
        stages -= 1
    while bk > 16 and stages * (t.block_n + bm) * bk * itemsize > SHARED_LIMIT:
        bk //= 2
    return t._replace(num_stages=stages, block_k=bk)


def _tiled(rows: int, n: int, k: int, dot: bool) -> Tiles:
    """Tile sizes for an (rows x k) @ (k x n) product, from sweeps on an H200 (BENCHMARKS.md,
    ``devtools/bench_gemv.py --sweep``): at one row 4 x 1024 is within 5% of the best of 96 tilings on
    every qwen3-8b (tp=1, tp=2) and qwen3-0.6b layer. From two rows on, the tensor cores (``dot=False``:
    the broadcast form at any rows), with tiles from the sweep over qwen3-0.6b's four products: up to 32
    rows, 32 output features a program, steps of 256 input features, four stages deep (above 4,096
    outputs, more than 128 such programs: 64 features, steps of 128); at 64 rows 16 features a program on
    the narrow products, 64 on the wide ones. Each tiling is within 2.5% of the best of 30; a layer's four
    products take 22 µs at 8 rows against cuBLAS's 24, and at 64 rows 27.5 against 25.4. Above 64 rows a
    program takes a block of 64 or 128 of them.
    """
    if dot and rows > WHOLE_ROWS:  # blocks of rows: the best of the sweep at 128 and 256 rows (``--pdl``)
        if n <= 2048 or (n <= 4096 and rows <= 128):
            return Tiles(64, 128, 8, 4, dot=True, block_m=64)
        return Tiles(128 if n > 4096 and rows > 128 else 64, 64, 8, 4, dot=True, block_m=128)
    if dot and rows > 1:
        bm = block_m(rows, True)
        if bm <= 32:
            bn, bk = (32, 256) if n <= 4096 else (64, 128)
        else:
            bn, bk = (16, 256) if n <= 2048 else (64, 128)
        bn, bk = min(bn, max(16, _pow2_at_least(n))), min(bk, max(16, _pow2_at_least(k)))
        stages = 4 if 4 * (bn + bm) * bk * 2 <= SHARED_BUDGET else 3
        return Tiles(bn, bk, 4, stages, dot=True)
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
