"""How a paged V cache may lie in memory, and the tile load that reads the float8 pool's layout.

Every cache is seen with the same indices, ``(num_blocks, block_size, Hk, D)``. In the pool layout (K
always, and V of a pool in the model's dtype) a token's values of one head are contiguous. A float8 pool
holds its V **by token**: each page's values ``(Hk, D, block_size)`` in memory, a page's tokens contiguous
for each head and dimension (``v_by_token`` makes a copy so laid out; ``kv_cache.allocate`` makes the
pool so).

Why: the attention kernels' second product sums V over tokens. A float8 V tile whose tokens are
contiguous in shared memory reaches the tensor cores through ``ldmatrix``; in the pool layout Triton reads
such an 8-bit operand one byte at a time (sm_90 has no 8-bit transposing ``ldmatrix``), and the decode
kernel, issue-bound, moved its bytes at 66% of copy bandwidth against 85% by token (H200, B=64 x 4096,
``devtools/bench_kernels.py``). For a bfloat16 V the pool layout costs nothing (``ldmatrix.trans``).

``load_v_by_token`` reads a tile in chunks of whole pages (or of a tile within a page): a chunk's tokens
are contiguous, it starts on a multiple of its length and its mask is one value for all of it, so the
loads are 16-byte vectors. Tokens past the end inside a live chunk are loaded unmasked: the pool is
zeroed when made and only ever written with finite values, and those tokens' attention weights are 0.
"""

from __future__ import annotations

import torch

from llmbench.kernels._triton import jit, tl


def by_token(v_cache: torch.Tensor) -> bool:
    """Whether a ``(num_blocks, block_size, Hk, D)`` V cache is laid out by token."""
    return v_cache.dim() == 4 and v_cache.stride(1) == 1 and v_cache.stride(-1) != 1


def v_by_token(v_cache: torch.Tensor) -> torch.Tensor:
    """A copy of a ``(num_blocks, block_size, Hk, D)`` V cache laid out by token, same indices."""
    return v_cache.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)


def by_token_view(pages: torch.Tensor, block_size: int, kv_heads: int, head_dim: int) -> torch.Tensor:
    """Contiguous ``(num_blocks, block_size * Hk * D)`` pages seen as a V cache laid out by token."""
    return pages.view(pages.shape[0], kv_heads, head_dim, block_size).permute(0, 3, 1, 2)


@jit
def load_v_by_token(
    v_base, bt_row, tile, end, stride_vb, stride_vd, d,
    HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """The ``(BLOCK_N, BLOCK_D)`` V tile of key positions ``tile`` (a multiple of BLOCK_N) onwards, of one
    head (``v_base`` points at it), from a cache laid out by token; chunks at or past ``end``, and
    dimensions past ``HEAD_DIM``, are zeros."""
    CHUNK: tl.constexpr = PAGE_SIZE if PAGE_SIZE < BLOCK_N else BLOCK_N
    NUM_CHUNKS: tl.constexpr = BLOCK_N // CHUNK
    first = tile + tl.arange(0, NUM_CHUNKS) * CHUNK  # (NUM_CHUNKS,) each chunk's first key position
    live = first < end
    page = tl.load(bt_row + first // PAGE_SIZE, mask=live, other=0).to(tl.int64)
    start = tl.multiple_of(page * stride_vb + first % PAGE_SIZE, CHUNK)
    offsets = start[None, :, None] + (d * stride_vd)[:, None, None] + tl.arange(0, CHUNK)[None, None, :]
    if BLOCK_D == HEAD_DIM:
        mask = live[None, :, None]
    else:
        mask = live[None, :, None] & (d < HEAD_DIM)[:, None, None]
    chunks = tl.load(v_base + offsets, mask=mask, other=0.0)  # (BLOCK_D, NUM_CHUNKS, CHUNK)
    return tl.trans(tl.reshape(chunks, [BLOCK_D, BLOCK_N]))
