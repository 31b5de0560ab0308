"""``x @ weight.T (+ bias)`` for a decode batch: tiles and a split of K sized so that every SM has work.

A decode step of a few hundred sequences multiplies a (M, K) input by each layer's weight, with M of
16 to 512. cuBLAS tiles such a product as it tiles a large one: qwen3-0.6b's output and down
projections (N = 1024) at M = 256 come out as 16 tiles of 128 x 128 on an H200's 132 SMs, each SM then
walking all of K alone. Here the tiles can be smaller and K can be split over ``split_k`` programs per
tile; each program writes its float32 partial sums to a workspace and counts itself in at the tile's
counter, and the last to arrive adds the partials in split order (so the sum does not depend on which
program came last), rounds once to the output dtype and sets the counter back to 0 for the next call.
One launch, no reduction kernel, deterministic; safe inside CUDA graphs (the counters are left as found).

The counters are one zeroed int32 buffer per device shared by every call: calls on one stream run one
after another, and each leaves its counters at 0. ``split_matmul_ref`` is ``F.linear``; the sum runs in
another order than cuBLAS', so bf16 results may differ from it in the last bit.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from llmbench.kernels._triton import (
    cdiv,
    jit,
    let_next_kernel_launch,
    num_sms,
    pdl_options,
    require_triton,
    tl,
    wait_for_kernel_before,
)

COUNTERS = 1 << 14  # tiles per call at most: M = 512, N = 24576 in tiles of 64 x 64 is 3072


class SplitTiles(NamedTuple):
    block_m: int
    block_n: int
    block_k: int
    split_k: int  # programs per output tile, each over its own stretch of K
    num_warps: int
    num_stages: int


def split_matmul_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    # x: (M, K), weight: (N, K), bias: (N,) -> (M, N)
    return F.linear(x, weight, bias)


@jit
def _split_matmul_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, part_ptr, count_ptr,
    M, N, K, stride_xm, stride_wn, stride_ym, K_STEPS,
    HAS_BIAS: tl.constexpr,
    EVEN_K: tl.constexpr,  # K == SPLIT_K * K_STEPS * BLOCK_K: no masks along K
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    LINES: tl.constexpr,  # 128-byte lines in a row of a weight tile
    PDL: tl.constexpr,  # launched early (programmatic dependent launch): the weight into L2 meanwhile
):  # fmt: skip
    # Grid (tiles, SPLIT_K): program (t, s) sums K_STEPS * BLOCK_K columns of K, from s * K_STEPS * BLOCK_K,
    # for output tile t (row-major over (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N))).
    tile = tl.program_id(0)
    split = tl.program_id(1)
    tiles_n = tl.cdiv(N, BLOCK_N)
    offs_m = (tile // tiles_n) * BLOCK_M + tl.arange(0, BLOCK_M)  # (BM,)
    offs_n = (tile % tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)  # (BN,)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    n_mask = offs_n < N
    k_start = split * K_STEPS * BLOCK_K
    x_tile = x_ptr + offs_m[:, None] * stride_xm + k_start + offs_k[None, :]  # (BM, BK)
    w_tile = w_ptr + offs_n.to(tl.int64)[None, :] * stride_wn + k_start + offs_k[:, None]  # (BK, BN)
    if PDL:  # the weight is no kernel's output: read it into L2 before waiting for the kernel before
        # one pointer per 128-byte line of the program's weight tiles
        line = 128 // w_ptr.dtype.element_ty.primitive_bitwidth * 8
        lines = (
            w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn + k_start + tl.arange(0, LINES)[None, :] * line
        )
        for i in range(K_STEPS):
            _prefetch_l2(lines + i * BLOCK_K)
    wait_for_kernel_before(PDL)  # x is the kernel before's output
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for i in range(K_STEPS):
        if EVEN_K:
            x = tl.load(x_tile, mask=m_mask[:, None], other=0.0)
            w = tl.load(w_tile, mask=n_mask[None, :], other=0.0)
        else:
            k = k_start + i * BLOCK_K + offs_k
            x = tl.load(x_tile, mask=m_mask[:, None] & (k[None, :] < K), other=0.0)
            w = tl.load(w_tile, mask=n_mask[None, :] & (k[:, None] < K), other=0.0)
        acc = tl.dot(x, w, acc)
        x_tile += BLOCK_K
        w_tile += BLOCK_K
    let_next_kernel_launch(PDL)
    out = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
    out_mask = m_mask[:, None] & n_mask[None, :]
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=out_mask)
    else:
        cell = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]  # (BM, BN)
        parts = part_ptr + tile.to(tl.int64) * (SPLIT_K * BLOCK_M * BLOCK_N)
        tl.store(parts + split * (BLOCK_M * BLOCK_N) + cell, acc)
        tl.debug_barrier()  # every thread's partials written before the count says they are
        arrived = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_K - 1:  # the last of the tile's programs: the others' partials are visible
            total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for s in tl.static_range(SPLIT_K):  # in split order, whichever program came last
                total += tl.load(parts + s * (BLOCK_M * BLOCK_N) + cell, cache_modifier=".cg")
            if HAS_BIAS:
                total += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
            tl.store(out, total.to(y_ptr.dtype.element_ty), mask=out_mask)
            tl.atomic_xchg(count_ptr + tile, 0)  # ready for the next call


@jit
def _prefetch_l2(ptrs):
    tl.inline_asm_elementwise(
        "prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1
    )


def split_tiles_for(rows: int, n: int, k: int, sms: int) -> SplitTiles:
    """Tile sizes and split for an (rows x k) @ (k x n) product, from the sweep on an H200
    (``devtools/bench_split_matmul.py --sweep``, qwen3-0.6b's layers at 16 to 512 rows): a wide product
    (n > k: q/k/v, gate/up) has tiles enough without splitting K; a narrow one (o, down) splits K so
    that one or two programs per SM run, each walking at least two steps of it."""
    if n > k:
        for top, tiles in ((16, (16, 32)), (32, (32, 32)), (128, (64, 64)), (256, (64, 128))):
            if rows <= top:
                return SplitTiles(*tiles, 128, 1, 4, 3)
        return SplitTiles(128, 128, 64, 1, 8, 3)
    block_m, block_n = (16, 32) if rows <= 32 else (32, 32) if rows <= 64 else (64, 64)
    tiles = cdiv(rows, block_m) * cdiv(n, block_n)
    programs = 2 * sms if rows <= 64 else sms
    split = 1
    while tiles * split * 2 <= programs and cdiv(k, 128) // (split * 2) >= 2:
        split *= 2
    return SplitTiles(block_m, block_n, 128, split, 4, 3)


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


_counters: dict[torch.device, torch.Tensor] = {}


def _counters_for(device: torch.device) -> torch.Tensor:
    if device not in _counters:
        _counters[device] = torch.zeros(COUNTERS, dtype=torch.int32, device=device)
    return _counters[device]


def split_matmul(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    tiles: SplitTiles | None = None,
    out: torch.Tensor | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    """``split_matmul_ref`` as one Triton kernel; into ``out`` when given (contiguous rows, x's dtype)."""
    require_triton("split_matmul")
    M, K = x.shape
    N = weight.shape[0]
    if weight.shape[1] != K:
        raise ValueError(f"x has {K} input features, the weight {weight.shape[1]}")
    x = x if x.stride(-1) == 1 else x.contiguous()
    weight = weight if weight.stride(-1) == 1 else weight.contiguous()
    if out is None:
        y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    elif out.shape != (M, N) or out.dtype != x.dtype or out.stride(-1) != 1:
        raise ValueError(f"out must be ({M}, {N}) {x.dtype} with unit column stride, got "
                         f"{tuple(out.shape)} {out.dtype} strides {out.stride()}")  # fmt: skip
    else:
        y = out
    if M == 0:
        return y
    t = tiles or split_tiles_for(M, N, K, num_sms(x.device))
    n_tiles = cdiv(M, t.block_m) * cdiv(N, t.block_n)
    if n_tiles > COUNTERS:
        raise ValueError(f"split_matmul counts up to {COUNTERS} tiles a call; ({M}, {N}) in {t} is {n_tiles}")
    steps = cdiv(cdiv(K, t.block_k), t.split_k)  # per program
    if t.split_k > 1:
        parts = torch.empty(n_tiles * t.split_k * t.block_m * t.block_n, dtype=torch.float32, device=x.device)
    else:
        parts = y
    _split_matmul_kernel[(n_tiles, t.split_k)](
        x,
        weight,
        bias if bias is not None else y,
        y,
        parts,
        _counters_for(x.device),
        M,
        N,
        K,
        x.stride(0),
        weight.stride(0),
        y.stride(0),
        steps,
        HAS_BIAS=bias is not None,
        EVEN_K=K == t.split_k * steps * t.block_k,
        BLOCK_M=t.block_m,
        BLOCK_N=t.block_n,
        BLOCK_K=t.block_k,
        SPLIT_K=t.split_k,
        LINES=max(1, t.block_k * weight.element_size() // 128),
        PDL=pdl,
        **pdl_options(pdl),
        num_warps=t.num_warps,
        num_stages=t.num_stages,
    )
    return y
