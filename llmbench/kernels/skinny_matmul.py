"""``x @ weight.T (+ bias)`` for a few rows: a decode step's linear layers at one sequence.

At one sequence a decode step is one matrix-vector product per linear layer, and its time is the time
to read the weight once. cuBLAS picks tile shapes made for matrices: on an H200 it reads qwen3-8b's
4096x4096 output projection at 2.6 TB/s, with a split-K reduction kernel after it, and qwen3-0.6b's
1024x2048 one at 0.3 TB/s (measured on an H200 with devtools/bench_gemv.py). Here each program owns ``BLOCK_N`` output
features, walks the whole K dimension with wide contiguous loads, keeps the products in float32 and sums
them once at the end: no split-K, no second kernel, the weight read once at full width.

Two fused forms do the layer before the product on the input's loads:
``skinny_silu_matmul`` (the gated MLP's SiLU-and-multiply, then the down projection) and
``skinny_norm_matmul`` (residual add and RMSNorm, then the q/k/v or gate/up projection; every program
sums the row's squares itself). Each has a ``_ref`` of the same signature built from the unfused
references, and rounds to the model dtype where the unfused layers do.

``skinny_norm_matmul`` can also take the row's sum of squares from the kernel before (``squares``), and
the kernel can end a row-parallel product at tp > 1 with the all-reduce and residual add after it
(``REDUCE``; kernels/skinny_allreduce.py says how, ``tp_fuse_matmul``).

From two rows on (``Tiles.dot``) the products run on the tensor cores: each program multiplies its
``BLOCK_N`` weight rows by all the input rows at once (``tl.dot``, the input's rows padded to 16). On an
H200 the broadcast form above took twice cuBLAS's time at 8 rows; the tensor-core form takes 5-15% less
than cuBLAS at 8 and 16 rows, but only unfused: the engine fuses at one row only (``models/fused_decode.py``).
Launched with programmatic dependent launch it shortens qwen3-0.6b's decode steps up to 64 rows and
lengthens qwen3-8b's (engine/resolve_tuning.py, ``SKINNY_MATMUL_ROWS``).

Above 64 rows a program takes a block of the rows (``Tiles.block_m``), the grid one column of programs
per block, up to ``MAX_ROWS``: a decode step of that many sequences can then be a chain of Triton kernels
under programmatic dependent launch. On an H200 that measured no faster than cuBLAS's products on
qwen3-0.6b (BENCHMARKS.md, "Past 64 rows"), so the engine takes it past 64 rows only when asked.
``skinny_matmul`` hands larger inputs to ``F.linear`` (prefill, larger batches). The sum runs in another
order than cuBLAS', so bf16 results may differ in the last bit; float32 ones agree to rounding.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from llmbench.kernels._triton import (
    cdiv,
    jit,
    next_power_of_2,
    programmatic,
    require_triton,
    tl,
    wait_for_inputs,
)
from llmbench.kernels.activation import silu_and_mul_ref
from llmbench.kernels.allreduce_norm import arrived_sum, no_negative_zero
from llmbench.kernels.rmsnorm import rms_norm_ref
from llmbench.kernels.skinny_tiles import Tiles, block_m, tiles_for

MAX_ROWS = 256  # above this the input goes to F.linear


def skinny_matmul_ref(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    # x: (M, K), weight: (N, K), bias: (N,) -> (M, N)
    return F.linear(x, weight, bias)


@jit
def _input_chunk(
    x_ptr, r_ptr, nw_ptr, h_ptr, rows, k, mask, K, stride_xm, stride_rm, stride_hm, rstd, store_h,
    GATED: tl.constexpr, NORM: tl.constexpr, HAS_RES: tl.constexpr,
):  # fmt: skip
    # rows (BM, 1), k (1, BK), mask (BM, BK) -> the input chunk (BM, BK) in float32, rounded to the model
    # dtype at each step as the unfused layers round their outputs
    dt = x_ptr.dtype.element_ty
    if GATED:  # x is (M, 2K): silu(gate) * up
        g = tl.load(x_ptr + rows * stride_xm + k, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(x_ptr + rows * stride_xm + K + k, mask=mask, other=0.0).to(tl.float32)
        act = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
        return (act * u).to(dt).to(tl.float32)
    x = tl.load(x_ptr + rows * stride_xm + k, mask=mask, other=0.0)
    if HAS_RES:  # h = x + residual, in the model dtype; one program writes it out
        x = (
            x.to(tl.float32) + tl.load(r_ptr + rows * stride_rm + k, mask=mask, other=0.0).to(tl.float32)
        ).to(dt)
        if store_h:
            tl.store(h_ptr + rows * stride_hm + k, x, mask=mask)
    xf = x.to(tl.float32)
    if NORM:  # rmsnorm(h) * weight: normalised value rounded, then the weight multiply rounded
        nw = tl.load(nw_ptr + k, mask=k < K, other=0.0).to(tl.float32)
        xf = ((xf * rstd).to(dt).to(tl.float32) * nw).to(dt).to(tl.float32)
    return xf


@jit(do_not_specialize=("M",))
def _skinny_matmul_kernel(
    x_ptr, r_ptr, nw_ptr, h_ptr, w_ptr, b_ptr, y_ptr,
    M, N, K, stride_xm, stride_rm, stride_hm, stride_wn, stride_ym, eps,
    recv_ptr, red_r_ptr, red_h_ptr, ss_ptr, stride_red_r, stride_red_h, SS_PARTS,
    HAS_BIAS: tl.constexpr,
    EVEN: tl.constexpr,  # N % BLOCK_N == 0 and K % BLOCK_K == 0: no masks on the weight
    GATED: tl.constexpr,  # the input is gate | up, multiplied after a SiLU on the gate
    NORM: tl.constexpr,  # the input is RMS-normalised (after the residual add with HAS_RES)
    HAS_RES: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SS_BLOCK: tl.constexpr,  # NORM with the row's squares summed already: SS_PARTS sums at ss_ptr (pow2 >=)
    REDUCE: tl.constexpr,  # then the sum over the ranks and the residual add (kernels/skinny_allreduce.py)
    RANK: tl.constexpr, WORLD: tl.constexpr, RED_RES: tl.constexpr, BLOCK_H: tl.constexpr,
    DOT: tl.constexpr = False,  # w (BN, BK) @ x.T (BK, BM) on the tensor cores, BLOCK_M >= 16
    DOT_PRECISION: tl.constexpr = "ieee",
    PDL: tl.constexpr = False,
):  # fmt: skip
    wait_for_inputs(PDL)
    # Grid (cdiv(N, BLOCK_N), cdiv(M, BLOCK_M)): one program per BLOCK_N output features and BLOCK_M rows,
    # all of K.
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)  # (BN,)
    offs_k = tl.arange(0, BLOCK_K)[None, :]  # (1, BK)
    n_mask = offs_n < N
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn  # (BN, 1)
    if BLOCK_M == 1:
        rows = tl.zeros((1, 1), dtype=tl.int32)  # (BM, 1)
    else:
        rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]
    m_mask = rows < M
    rstd = 1.0
    if NORM and SS_BLOCK > 0:  # the row's squares summed by the kernel before, in SS_PARTS parts
        p = tl.arange(0, SS_BLOCK)[None, :]
        parts = tl.load(ss_ptr + rows * SS_PARTS + p, mask=m_mask & (p < SS_PARTS), other=0.0)  # (BM, SSB)
        rstd = 1.0 / tl.sqrt(tl.sum(parts, axis=1)[:, None] / K + eps)
    elif NORM:  # every program sums the squares of the whole row (a few KB, from L2) for itself
        ss = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + offs_k
            h = _input_chunk(
                x_ptr, r_ptr, nw_ptr, h_ptr, rows, k, m_mask & (k < K), K, stride_xm, stride_rm, stride_hm,
                1.0, False, GATED=False, NORM=False, HAS_RES=HAS_RES,
            )  # fmt: skip
            ss += h * h
        rstd = 1.0 / tl.sqrt(tl.sum(ss, axis=1)[:, None] / K + eps)  # (BM, 1)
    if DOT:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    elif BLOCK_M == 1:
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)  # summed across lanes once, after the loop
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + offs_k  # (1, BK)
        if EVEN:
            w = tl.load(w_rows + k)  # (BN, BK)
        else:
            w = tl.load(w_rows + k, mask=n_mask[:, None] & (k < K), other=0.0)
        x = _input_chunk(
            x_ptr, r_ptr, nw_ptr, h_ptr, rows, k, m_mask & (k < K), K, stride_xm, stride_rm, stride_hm,
            rstd, pid == 0, GATED=GATED, NORM=NORM, HAS_RES=HAS_RES,
        )  # fmt: skip  # (BM, BK)
        if DOT:  # x holds values of the model dtype already: the cast back is exact
            acc = tl.dot(w, tl.trans(x.to(w.dtype)), acc, input_precision=DOT_PRECISION)  # (BN, BM)
        elif BLOCK_M == 1:
            acc += w.to(tl.float32) * x
        else:
            acc += x[:, None, :] * w.to(tl.float32)[None, :, :]  # (BM, BN, BK)
    if DOT:
        y = tl.trans(acc)  # (BM, BN)
    elif BLOCK_M == 1:
        y = tl.sum(acc, axis=1)[None, :]  # (1, BN)
    else:
        y = tl.sum(acc, axis=2)  # (BM, BN)
    if HAS_BIAS:
        y += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    if not REDUCE:
        tl.store(
            y_ptr + rows * stride_ym + offs_n[None, :],
            y.to(y_ptr.dtype.element_ty),
            mask=m_mask & n_mask[None, :],
        )
    else:
        # recv_ptr: WORLD addresses of each rank's receive buffer, (WORLD, M, N) sections: this program's
        # partial sums go into section RANK of every rank's. Then the last SS_PARTS programs take BLOCK_H
        # columns each: wait for them in every section of this rank's, sum, add the residual, write the
        # sum and its sum of squares (the next kernel's RMSNorm needs only these). Program ids increase
        # with columns, and programs start in id order (under the interpreter one after the other), so
        # the columns a program waits for come from programs that start before it.
        part = no_negative_zero(y.to(y_ptr.dtype.element_ty))
        for q in tl.static_range(WORLD):
            theirs = tl.load(recv_ptr + q).to(tl.pointer_type(y_ptr.dtype.element_ty))
            tl.store(theirs + RANK * M * N + rows * N + offs_n[None, :], part, mask=m_mask & n_mask[None, :])
        j = pid - (tl.num_programs(0) - SS_PARTS)
        if j >= 0:
            mine = tl.load(recv_ptr + RANK).to(tl.pointer_type(y_ptr.dtype.element_ty))
            cols = j * BLOCK_H + tl.arange(0, BLOCK_H)
            mask = cols < N
            for row in range(M):
                total = arrived_sum(mine + row * N, M * N, cols, mask, BLOCK_H, WORLD)
                h = total.to(red_h_ptr.dtype.element_ty)  # rounded once, as an all-reduce returns it
                if RED_RES:
                    r = tl.load(red_r_ptr + row * stride_red_r + cols, mask=mask, other=0.0)
                    h = (h + r).to(red_h_ptr.dtype.element_ty)
                tl.store(red_h_ptr + row * stride_red_h + cols, h, mask=mask)
                hf = h.to(tl.float32)
                tl.store(ss_ptr + row * SS_PARTS + j, tl.sum(hf * hf, axis=0))


def skinny_matmul(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    tiles: Tiles | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    require_triton("skinny_matmul")
    # x: (M, K), weight: (N, K), bias: (N,) -> (M, N), into ``out`` if given (contiguous, of x's dtype);
    # more than MAX_ROWS rows go to torch
    if x.shape[0] > MAX_ROWS:
        _check(x, weight, x.shape[-1])
        return linear_into(x, weight, bias, out)
    return launch(x, weight, bias, tiles, out=out)


def linear_into(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None
) -> torch.Tensor:
    """``F.linear`` (cuBLAS), written into ``out`` when given."""
    if out is None:
        return F.linear(x, weight, bias)
    torch.matmul(x, weight.t(), out=out)
    return out if bias is None else out.add_(bias)


def skinny_silu_matmul_ref(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    # x: (M, 2K) gate | up, weight: (N, K) -> (M, N): the gated MLP's down projection
    return F.linear(silu_and_mul_ref(x), weight, bias)


def skinny_silu_matmul(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    tiles: Tiles | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``skinny_silu_matmul_ref`` in one kernel: the SiLU-and-multiply done on the input's loads."""
    require_triton("skinny_silu_matmul")
    return launch(x, weight, bias, tiles, gated=True, out=out)


def skinny_norm_matmul_ref(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    # x, residual: (M, K) -> (rmsnorm(x + residual) @ weight.T + bias (M, N), x + residual (M, K))
    out, h = rms_norm_ref(x, norm_weight, eps, residual)
    return F.linear(out, weight, bias), (x if h is None else h)


def skinny_norm_matmul(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    tiles: Tiles | None = None,
    squares: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``skinny_norm_matmul_ref`` in one kernel: the residual add and the RMSNorm done on the input's loads
    (each program sums the row's squares itself; the first one writes ``x + residual``). ``squares``: the
    row's squares already summed, in parts, float32 (M, P) (``skinny_matmul_allreduce``), with no
    residual: the programs then only add up these."""
    require_triton("skinny_norm_matmul")
    if squares is not None:
        if residual is not None or squares.shape[0] != x.shape[0] or squares.dtype != torch.float32:
            raise ValueError(
                f"squares must be float32 ({x.shape[0]}, P), with no residual; got {tuple(squares.shape)} "
                f"{squares.dtype}{' and a residual' if residual is not None else ''}"
            )
        return launch(x, weight, bias, tiles, norm=(norm_weight, eps), squares=squares.contiguous()), x
    if residual is None:
        return launch(x, weight, bias, tiles, norm=(norm_weight, eps)), x
    h = torch.empty_like(x)
    return launch(x, weight, bias, tiles, norm=(norm_weight, eps), residual=residual, h=h), h


class Reduce(NamedTuple):
    """What ``launch`` does after the product instead of storing it: the sum over the ranks and the
    residual add (kernels/skinny_allreduce.py)."""

    recv_addrs: torch.Tensor  # int64 (W,): every rank's receive buffer
    rank: int
    residual: torch.Tensor | None
    h: torch.Tensor  # out: the sum + residual (M, N)
    ss: torch.Tensor  # out: its squares summed per block of columns, float32 (M, cdiv(N, block))
    block: int  # columns per summing program


def _check(x: torch.Tensor, weight: torch.Tensor, k: int) -> None:
    if weight.shape[1] != k:
        raise ValueError(f"x has {k} input features, the weight {weight.shape[1]}")


def launch(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    tiles: Tiles | None,
    gated: bool = False,
    norm: tuple[torch.Tensor, float] | None = None,
    residual: torch.Tensor | None = None,
    h: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    reduce: Reduce | None = None,
    squares: torch.Tensor | None = None,
) -> torch.Tensor:
    """The skinny kernel in any of its forms, checked and launched; returns the product (unwritten with
    ``reduce``, whose outputs are the point)."""
    M = x.shape[0]
    K = x.shape[1] // 2 if gated else x.shape[1]
    N = weight.shape[0]
    _check(x, weight, K)
    if M > MAX_ROWS:
        raise ValueError(f"the skinny kernels take up to {MAX_ROWS} rows, got {M}")
    x = x if x.stride(-1) == 1 else x.contiguous()
    weight = weight if weight.stride(-1) == 1 else weight.contiguous()
    t = tiles or tiles_for(M, N, K, dot=reduce is None, itemsize=x.element_size())
    if t.dot and reduce is not None:
        raise ValueError("the summing form (reduce) takes the broadcast tiles, not tensor-core ones")
    if out is None:
        y = torch.empty((M, N), dtype=x.dtype, device=x.device)  # (M, N)
    elif out.shape != (M, N) or out.dtype != x.dtype or out.stride(-1) != 1:
        raise ValueError(f"out must be ({M}, {N}) {x.dtype} with unit column stride, got "
                         f"{tuple(out.shape)} {out.dtype} strides {out.stride()}")  # fmt: skip
    else:
        y = out
    if M == 0:
        return y
    rows_tile = t.block_m or block_m(M, t.dot)
    grid = cdiv(N, t.block_n)
    if reduce is not None and M > rows_tile:
        raise ValueError(
            f"the summing form (reduce) takes all {M} rows in one program's tile, not {rows_tile}"
        )
    if reduce is not None and reduce.ss.shape[1] > grid:
        raise ValueError(
            f"{N} columns in blocks of {reduce.block} need more programs than the product's {grid}"
        )
    red = reduce or Reduce(y, 0, None, y, squares if squares is not None else y, 1)
    _skinny_matmul_kernel[(grid, cdiv(M, rows_tile))](
        x,
        residual if residual is not None else x,
        norm[0] if norm is not None else x,
        h if h is not None else x,
        weight,
        bias if bias is not None else y,
        y,
        M,
        N,
        K,
        x.stride(0),
        residual.stride(0) if residual is not None else 0,
        h.stride(0) if h is not None else 0,
        weight.stride(0),
        y.stride(0),
        norm[1] if norm is not None else 0.0,
        red.recv_addrs,
        red.residual if red.residual is not None else red.h,
        red.h,
        red.ss,
        red.residual.stride(0) if red.residual is not None else 0,
        red.h.stride(0),
        red.ss.shape[1] if reduce is not None or squares is not None else 0,
        HAS_BIAS=bias is not None,
        EVEN=N % t.block_n == 0 and K % t.block_k == 0,
        GATED=gated,
        NORM=norm is not None,
        HAS_RES=residual is not None,
        BLOCK_M=rows_tile,
        BLOCK_N=t.block_n,
        BLOCK_K=t.block_k,
        SS_BLOCK=next_power_of_2(squares.shape[1]) if squares is not None else 0,
        REDUCE=reduce is not None,
        RANK=red.rank,
        WORLD=red.recv_addrs.numel() if reduce is not None else 1,
        RED_RES=red.residual is not None,
        BLOCK_H=min(red.block, next_power_of_2(N)),
        DOT=t.dot,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        num_warps=t.num_warps,
        num_stages=t.num_stages,
        # not the summing form (it spins on the other GPUs): no rows for the launch
        **programmatic(x, M if reduce is None else 0),
    )
    return y
