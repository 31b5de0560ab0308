"""All-reduce, residual add and RMSNorm in one kernel: the seam between tensor-parallel layers at decode.

At tp > 1 every row-parallel layer (o_proj, down_proj) ends with partial sums that must be added over the
ranks, and an RMSNorm follows at once. Done one by one that is a copy into communication memory, an
all-reduce and a norm kernel, 72 times a step for qwen3-8b, each too small to be anything but latency.
Here each rank's layer writes its partial sums straight into memory every rank can address (PyTorch's
symmetric memory, distributed/fused.py), and one kernel per rank

1. meets the same program of every other rank: a counter per (program, rank) pair, which the sender
   increments in the receiver's memory with release semantics (a fire-and-forget ``red`` over NVLink, no
   round trip) and the receiver waits on with acquire loads and then decrements, so the counters are all
   zero again afterwards and a CUDA graph can replay the kernel. Arrivals come in call order, and a
   receiver has taken back all but the current one, so a count of one or more means "arrived";
2. reads the partial sums of every rank (its own locally, its peers' over NVLink) and adds them in
   float32 in rank order, so every rank gets the same bits, rounded to the model dtype once, as an
   all-reduce returns them;
3. finishes as ``kernels/rmsnorm.py`` does: adds the residual, normalises, writes both.

One program per row, at most ``MAX_PROGRAMS`` (each then takes every ``MAX_PROGRAMS``-th row): all of
them are resident at once on any GPU this runs on, so no program waits for a peer that cannot start.

``allreduce_norm_ref`` is the same arithmetic on partial sums held by one process. The kernel itself
takes addresses (``int64`` tensors), so on the CPU, under the interpreter, it runs over ordinary
tensors standing for the ranks' buffers, with a peer's arrival written into the flags beforehand.

The helpers after the kernel serve the skinny matmul's ``skinny_matmul_allreduce`` (one-row decode
steps, ``tp_fuse_matmul``), where the producers push their partial sums into every rank's receive buffer
instead: ``mark_empty`` fills a buffer with -0.0, the mark of an element not yet written (set and
compared through its bits: Triton folded the constant -0.0 into +0.0), ``no_negative_zero`` keeps a
written value from looking empty, and ``arrived_sum`` waits until a block of every section has arrived,
sums it in rank order and marks it empty again.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from llmbench.kernels._triton import jit, next_power_of_2, require_triton, tl
from llmbench.kernels.rmsnorm import rms_norm_ref

MAX_PROGRAMS = 64
# Where the fused kernel is used (distributed/fused.py): decode steps of up to this many rows. On two
# H200s it took 5.5 / 6.9 µs at 1 / 8 rows against 8.6 / 9.5 for the one-shot all-reduce and the norm,
# but 17.9 against 12.8 at 64 rows (devtools/allreduce_probe.py; one program per row reads its peers').
MAX_ROWS = 8


def mark_empty(t: torch.Tensor) -> torch.Tensor:
    """Fill a receive buffer with the mark of "not yet written", -0.0, set through its bits."""
    ints = {2: torch.int16, 4: torch.int32}[t.element_size()]
    t.view(ints).fill_(torch.iinfo(ints).min)
    return t


def allreduce_norm_ref(
    partials: Sequence[torch.Tensor],
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``rms_norm(sum(partials), weight, eps, residual)``: returns ``(normed, sum + residual)``.

    partials: one (T, H) tensor per rank, in rank order; the sum is taken in float32 and rounded once."""
    total = partials[0].float()
    for p in partials[1:]:
        total = total + p.float()
    x = total.to(partials[0].dtype)
    out, h = rms_norm_ref(x, weight, eps, residual)
    return out, (x if h is None else h)


@jit(do_not_specialize=("T",))
def _allreduce_norm_kernel(
    parts_ptr, flags_ptr, res_ptr, w_ptr, out_ptr, h_ptr,
    T, H, stride_r, stride_o, stride_h, eps,
    RANK: tl.constexpr, WORLD: tl.constexpr, HAS_RESIDUAL: tl.constexpr, BLOCK_H: tl.constexpr,
):  # fmt: skip
    # parts_ptr: WORLD addresses of (T, H) row-major partial sums; flags_ptr: WORLD addresses of each
    # rank's int32 counters [MAX_PROGRAMS, WORLD], flags[p, q] = arrivals of rank q's program p not yet
    # taken back. (Each atomic on a single address is done by one thread of the program.)
    pid = tl.program_id(0)
    slot = pid * WORLD
    for q in tl.static_range(WORLD):  # announce this program to every peer
        if q != RANK:
            theirs = tl.load(flags_ptr + q).to(tl.pointer_type(tl.int32))
            tl.atomic_add(theirs + slot + RANK, 1, sem="release", scope="sys")
    mine = tl.load(flags_ptr + RANK).to(tl.pointer_type(tl.int32))
    for q in tl.static_range(WORLD):  # then wait for every peer's announcement, and take it back
        if q != RANK:
            while tl.atomic_add(mine + slot + q, 0, sem="acquire", scope="sys") < 1:
                pass
            tl.atomic_add(mine + slot + q, -1, sem="relaxed", scope="sys")
    dtype = h_ptr.dtype.element_ty
    cols = tl.arange(0, BLOCK_H)
    mask = cols < H
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    for row in range(pid, T, tl.num_programs(0)):
        acc = tl.zeros([BLOCK_H], dtype=tl.float32)
        for q in tl.static_range(WORLD):  # rank order: the same sum on every rank
            part = tl.load(parts_ptr + q).to(tl.pointer_type(dtype))
            acc += tl.load(part + row * H + cols, mask=mask, other=0.0, volatile=True).to(tl.float32)
        x = acc.to(dtype)
        if HAS_RESIDUAL:
            r = tl.load(res_ptr + row * stride_r + cols, mask=mask, other=0.0)
            x = (x + r).to(dtype)  # rounded to the model dtype, as the reference adds
        tl.store(h_ptr + row * stride_h + cols, x, mask=mask)
        xf = x.to(tl.float32)
        inv_rms = tl.rsqrt(tl.sum(xf * xf, axis=0) / H + eps)
        normed = (xf * inv_rms).to(dtype)  # cast back before the weight, as Hugging Face does
        out = normed.to(tl.float32) * w
        tl.store(out_ptr + row * stride_o + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


@jit
def _is_empty(v):
    """Where ``v`` (16- or 32-bit floats) holds the empty mark, -0.0: its bits against the sign bit (a
    compiler may fold -0.0 itself into +0.0)."""
    if v.dtype.primitive_bitwidth == 16:
        return v.to(tl.int16, bitcast=True) == -32768
    else:
        return v.to(tl.int32, bitcast=True) == -2147483648


@jit
def _empty(BLOCK: tl.constexpr, dtype: tl.constexpr):
    """BLOCK empty marks (-0.0) of ``dtype``, made from their bits."""
    if dtype.primitive_bitwidth == 16:
        return tl.full([BLOCK], -32768, tl.int16).to(dtype, bitcast=True)
    else:
        return tl.full([BLOCK], -2147483648, tl.int32).to(dtype, bitcast=True)


@jit
def no_negative_zero(y):
    """``y`` with each -0.0 made +0.0 (the same number), so that no value written to a receive buffer
    looks like the empty mark."""
    return tl.where(y == 0, tl.zeros_like(y), y)


@jit
def arrived_sum(base, section, cols, mask, BLOCK_H: tl.constexpr, WORLD: tl.constexpr):
    """The float32 sum, in rank order, of one row of ``WORLD`` sections (``section`` elements apart) of a
    receive buffer, once every element of it has arrived (is no longer the empty mark); the row is then
    marked empty again for the buffer's next use."""
    dtype = base.dtype.element_ty
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    missing = 1
    while missing > 0:  # every section read at once, until one read finds them all written
        acc = tl.zeros([BLOCK_H], dtype=tl.float32)
        missing = 0
        for q in tl.static_range(WORLD):
            v = tl.load(base + q * section + cols, mask=mask, other=0.0, volatile=True)
            missing += tl.sum((_is_empty(v) & mask).to(tl.int32), axis=0)
            acc += v.to(tl.float32)
    for q in tl.static_range(WORLD):
        tl.store(base + q * section + cols, _empty(BLOCK_H, dtype), mask=mask)
    return acc


def allreduce_norm(
    part_addrs: torch.Tensor,
    flag_addrs: torch.Tensor,
    rank: int,
    shape: tuple[int, int],
    dtype: torch.dtype,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``allreduce_norm_ref`` over the ranks' buffers: ``(normed, sum + residual)``, fresh tensors.

    part_addrs: int64 (W,), the address of each rank's (T, H) partial sums, row-major, of ``dtype``, in
    rank order; flag_addrs: int64 (W,), the address of each rank's zeroed int32 flags, at least
    ``MAX_PROGRAMS * W`` of them; both on the device of ``weight``. Every rank must launch it with the
    same shape, or the barrier never completes."""
    require_triton("allreduce_norm")
    T, H = shape
    world = part_addrs.numel()
    if flag_addrs.numel() != world or not 0 <= rank < world:
        raise ValueError(f"rank {rank} of {world} ranks, with {flag_addrs.numel()} flag addresses")
    if weight.shape != (H,):
        raise ValueError(f"weight must be ({H},), got {tuple(weight.shape)}")
    if residual is not None and (residual.shape != (T, H) or residual.dtype != dtype):
        raise ValueError(f"residual must be {(T, H)} {dtype}, got {tuple(residual.shape)} {residual.dtype}")
    device = weight.device
    out = torch.empty((T, H), dtype=torch.promote_types(dtype, weight.dtype), device=device)
    h = torch.empty((T, H), dtype=dtype, device=device)
    if residual is not None and residual.stride(-1) != 1:
        residual = residual.contiguous()
    if T == 0:
        return out, h
    BLOCK_H = next_power_of_2(H)
    _allreduce_norm_kernel[(min(T, MAX_PROGRAMS),)](
        part_addrs, flag_addrs, residual if residual is not None else h, weight, out, h,
        T, H, residual.stride(0) if residual is not None else 0, out.stride(0), h.stride(0), eps,
        RANK=rank, WORLD=world, HAS_RESIDUAL=residual is not None, BLOCK_H=BLOCK_H,
        num_warps=min(16, max(1, BLOCK_H // 512)),
    )  # fmt: skip
    return out, h
