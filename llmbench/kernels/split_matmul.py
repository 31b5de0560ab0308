"""``x @ weight.T (+ bias)`` for a decode batch (tens to hundreds of rows), its K dimension split over
programs.

At a decode batch a linear layer's product is a few microseconds of work over a few megabytes of weight,
and cuBLAS' tiles leave it short of programs: qwen3-0.6b's output and down projections (N = 1024) make
16-64 tiles, each walking all of K alone, and every product of a layer takes 5-8 µs whatever the batch
(BENCHMARKS.md, the decode step's linear layers). Here a tile's K range is cut into ``splits`` slices,
one program each, so that enough programs read the weight at once. Each program writes its slice's
float32 partial sums to a scratch buffer; the last of a tile's programs to finish (a counter per tile)
adds the partials up in slice order, so the result does not depend on which finished first, and resets
the counter for the next launch.

The scratch buffer and the counters live per device and grow on demand. A CUDA graph keeps the buffers it
was captured with, so growth must happen before capture: ``split_matmul`` refuses to grow inside one,
and the engine's graph runner warms every bucket up before it captures any.

The sum runs in another order than cuBLAS', so bf16 results may differ in the last bit; float32 ones
agree to rounding.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from llmbench.kernels._triton import cdiv, jit, num_sms, require_triton, tl

MAX_ROWS = 256  # the largest decode batch the tile table covers; above it cuBLAS' tiles fill the GPU


class SplitTiles(NamedTuple):
    block_m: int  # rows per tile
    block_n: int  # output features per tile
    block_k: int  # input features per loop step
    splits: int  # programs per tile, each over its own slice of K
    num_warps: int
    num_stages: int


def split_matmul_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    # x: (M, K), weight: (N, K), bias: (N,) -> (M, N)
    return F.linear(x, weight, bias)


@jit(do_not_specialize=("M",))
def _split_matmul_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, ws_ptr, count_ptr,
    M, N, K, stride_xm, stride_wn, stride_ym, splits, k_per_split,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    # Grid (tiles * splits,): a tile's programs are neighbours, slice fastest.
    pid = tl.program_id(0)
    tile = pid // splits
    s = pid % splits
    tiles_n = tl.cdiv(N, BLOCK_N)
    rm = (tile // tiles_n) * BLOCK_M + tl.arange(0, BLOCK_M)  # (BM,)
    rn = (tile % tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)  # (BN,)
    rk = tl.arange(0, BLOCK_K)[None, :]  # (1, BK)
    m_mask = rm[:, None] < M
    n_mask = rn[:, None] < N
    x_rows = x_ptr + rm.to(tl.int64)[:, None] * stride_xm  # (BM, 1)
    w_rows = w_ptr + rn.to(tl.int64)[:, None] * stride_wn  # (BN, 1)
    k_lo = s * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        k = k0 + rk
        a = tl.load(x_rows + k, mask=m_mask & (k < k_hi), other=0.0)  # (BM, BK)
        b = tl.load(w_rows + k, mask=n_mask & (k < k_hi), other=0.0)  # (BN, BK)
        acc = tl.dot(a, tl.trans(b), acc)
    y_tile = y_ptr + rm[:, None] * stride_ym + rn[None, :]
    y_mask = m_mask & (rn[None, :] < N)
    if splits == 1:
        if HAS_BIAS:
            acc += tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
        tl.store(y_tile, acc.to(y_ptr.dtype.element_ty), mask=y_mask)
    else:
        cell = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]  # (BM, BN)
        parts = ws_ptr + tile.to(tl.int64) * splits * BLOCK_M * BLOCK_N
        tl.store(parts + s * BLOCK_M * BLOCK_N + cell, acc)
        tl.debug_barrier()  # every thread's partials written before the count says so
        done = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel")
        if done == splits - 1:  # the tile's last program: the partials in slice order, from L2
            total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for j in range(splits):
                total += tl.load(parts + j * BLOCK_M * BLOCK_N + cell, cache_modifier=".cg")
            if HAS_BIAS:
                total += tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
            tl.store(y_tile, total.to(y_ptr.dtype.element_ty), mask=y_mask)
            tl.atomic_xchg(count_ptr + tile, 0)  # ready for the next launch


def tiles_for(rows: int, n: int, k: int, sms: int = 132) -> SplitTiles:
    """Tiles for an (rows x k) @ (k x n) product: enough programs to cover ``sms`` multiprocessors about
    once, each slice at least two loop steps long."""
    block_m = min(64, max(16, _pow2_at_least(rows)))
    block_n, block_k = 64, 128
    tiles = cdiv(rows, block_m) * cdiv(n, block_n)
    splits = 1
    while tiles * splits * 2 <= sms and k // (splits * 2) >= 2 * block_k:
        splits *= 2
    return SplitTiles(block_m, block_n, block_k, splits, 4, 3)


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


class _Scratch:
    """A device's partial sums (float32) and per-tile counters (int32, zero between launches)."""

    def __init__(self) -> None:
        self.parts: dict[torch.device, torch.Tensor] = {}
        self.counts: dict[torch.device, torch.Tensor] = {}

    def get(self, device: torch.device, parts: int, tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
        have_p, have_c = self.parts.get(device), self.counts.get(device)
        if have_p is None or have_p.numel() < parts or have_c is None or have_c.numel() < tiles:
            if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                raise RuntimeError(
                    "split_matmul's scratch must grow inside a CUDA graph capture: run the product once "
                    "at this shape before capturing it"
                )
            if have_p is None or have_p.numel() < parts:
                self.parts[device] = torch.empty(parts, dtype=torch.float32, device=device)
            if have_c is None or have_c.numel() < tiles:
                self.counts[device] = torch.zeros(tiles, dtype=torch.int32, device=device)
        return self.parts[device], self.counts[device]


_SCRATCH = _Scratch()


def split_matmul(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    tiles: SplitTiles | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``split_matmul_ref`` with K split over programs, into ``out`` if given (contiguous rows, of x's
    dtype)."""
    require_triton("split_matmul")
    M, K = x.shape
    N = weight.shape[0]
    if weight.shape[1] != K:
        raise ValueError(f"x has {K} input features, the weight {weight.shape[1]}")
    if out is None:
        out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    elif out.shape != (M, N) or out.dtype != x.dtype or out.stride(-1) != 1:
        raise ValueError(f"out must be ({M}, {N}) {x.dtype} with unit column stride, got "
                         f"{tuple(out.shape)} {out.dtype} strides {out.stride()}")  # fmt: skip
    if M == 0:
        return out
    x = x if x.stride(-1) == 1 else x.contiguous()
    weight = weight if weight.stride(-1) == 1 else weight.contiguous()
    t = tiles or tiles_for(M, N, K, num_sms(x.device))
    num_tiles = cdiv(M, t.block_m) * cdiv(N, t.block_n)
    # every slice a whole number of loop steps, and none empty
    k_per_split = cdiv(cdiv(K, t.block_k), t.splits) * t.block_k
    splits = cdiv(K, k_per_split)
    parts, counts = _SCRATCH.get(
        x.device, num_tiles * splits * t.block_m * t.block_n if splits > 1 else 1, num_tiles
    )
    _split_matmul_kernel[(num_tiles * splits,)](
        x, weight, bias if bias is not None else out, out, parts, counts,
        M, N, K, x.stride(0), weight.stride(0), out.stride(0), splits, k_per_split,
        HAS_BIAS=bias is not None,
        BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k,
        num_warps=t.num_warps, num_stages=t.num_stages,
    )  # fmt: skip
    return out
