"""A balanced Triton decode: the batch's K/V tiles dealt out in equal shares to a grid the size of the GPU.

Measured against the engine's decode kernel (``llmbench/kernels/triton_decode.py``) and not taken: it is
slower at every batch (BENCHMARKS.md, "A balanced decode kernel"; ``python devtools/bench_kernels.py
--tune decode-balanced``). It is kept here, with the benchmark that measured it, so that the measurement
can be repeated. Same contract as ``paged_attention_decode_ref`` for a cache in q's dtype.

The engine's kernel runs one program per sequence and KV head. In a batch of mixed lengths those programs
are of unequal length, and where they do not outnumber the GPU's slots by far the last ones run alone;
this kernel asks whether programs that share the tiles evenly win that back.

Design:

- An *item* is one sequence and one KV head; it holds ``ceil(seq_len / BLOCK_N)`` tiles of ``BLOCK_N``
  tokens (at least one: a padded row of length 0 gets one empty tile, so its output is written, as 0).
  Items are numbered sequence by sequence, KV heads inside, and their tiles one after another: tile ``t``
  of the batch. Each program counts the tiles itself (a prefix sum over the batch's lengths, held in
  registers), so the grid is ``(programs,)`` whatever the batch, and launches are CUDA-graph safe.
- Program ``p`` of ``P`` walks tiles ``[T p / P, T (p + 1) / P)`` in one loop, whichever items they
  belong to: a fresh online softmax where an item begins, its output written where it ends. No program
  waits on another and every one does the same number of tiles, give or take one.
- An item cut by a program's bounds is *split*: each of its programs writes a normalised partial output
  and its log-sum-exp to float32 scratch (two slots a program: slot 0 for the item it began inside of, slot
  1 for the item it leaves unfinished), then adds one to the item's arrival count; the program that
  arrives last merges the parts and resets the count to 0 for the next launch. So a program merges only
  what it finds finished, there is no second kernel, and ``counts`` (one int32 a program, zero between
  launches) is the only state kept from one launch to the next.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from llmbench.kernels._triton import (
    jit,
    next_power_of_2,
    num_sms,
    out_like,
    programmatic,
    require_triton,
    tl,
    wait_for_inputs,
)

LOG2E = math.log2(math.e)
MAX_BATCH = 512  # the lengths of a batch are held in registers: at most this many rows


class BalancedConfig(NamedTuple):
    block_n: int = 64  # context tokens per tile
    num_warps: int = 4
    num_stages: int = 3
    programs_per_sm: int = 3  # the grid: this many programs a multiprocessor


def balanced_programs(config: BalancedConfig, device: torch.device) -> int:
    """The grid of a balanced decode launch on ``device``."""
    return config.programs_per_sm * num_sms(device)


@jit
def _at(ranks, values, r):
    # values[r] of a (BLOCK_B,) vector held in registers, for a scalar r (0 past its end)
    return tl.sum(tl.where(ranks == r, values, 0), axis=0)


@jit
def _first_tile(p, total, progs):
    # The first tile of program p (int64 arithmetic: total * progs overflows int32 on long batches).
    return (total.to(tl.int64) * p // progs).to(tl.int32)


@jit
def _owner(t, total, progs):
    # The program whose tiles hold tile t: the last p whose first tile is at most t.
    return (((t + 1).to(tl.int64) * progs + total - 1) // total - 1).to(tl.int32)


@jit
def _head_rows(GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr):
    # A KV head's query rows (padded to BLOCK_G) and head dimensions, and which of them are real.
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    g_mask = g < GROUP
    return g, d, g_mask, g_mask[:, None] & (d[None, :] < HEAD_DIM)


@jit
def _store_part(
    o, lse, slot, part_out_ptr, part_lse_ptr,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    # A split item's part (normalised output, log-sum-exp) into scratch ``slot``.
    g, d, g_mask, o_mask = _head_rows(GROUP, HEAD_DIM, BLOCK_G, BLOCK_D)
    tl.store(part_out_ptr + (slot * BLOCK_G + g[:, None]) * HEAD_DIM + d[None, :], o, mask=o_mask)
    tl.store(part_lse_ptr + slot * BLOCK_G + g, lse, mask=g_mask)


@jit
def _arrive(
    start, end, total, progs, row, kv_head,
    out_ptr, part_out_ptr, part_lse_ptr, counts_ptr, stride_ob, stride_oh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    # This program has stored its part of the split item [start, end); the last of the item's programs to
    # arrive merges every part into the output.
    g, d, g_mask, o_mask = _head_rows(GROUP, HEAD_DIM, BLOCK_G, BLOCK_D)
    first = _owner(start, total, progs)
    last = _owner(end - 1, total, progs)
    parts = 1
    for p in range(first + 1, last + 1):  # programs with no tile in between hold no part
        parts += (_first_tile(p, total, progs) < _first_tile(p + 1, total, progs)).to(tl.int32)
    arrived = tl.atomic_add(counts_ptr + first, 1, sem="acq_rel")  # after this program's stores
    if arrived == parts - 1:
        mm = tl.full([BLOCK_G], float("-inf"), tl.float32)
        ll = tl.zeros([BLOCK_G], tl.float32)
        merged = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
        for p in range(first, last + 1):
            if _first_tile(p, total, progs) < _first_tile(p + 1, total, progs):
                s = tl.where(p == first, 2 * p + 1, 2 * p)  # the first program left the item unfinished
                part_lse = tl.load(
                    part_lse_ptr + s * BLOCK_G + g, mask=g_mask, other=0.0, cache_modifier=".cg"
                )
                part = tl.load(
                    part_out_ptr + (s * BLOCK_G + g[:, None]) * HEAD_DIM + d[None, :], mask=o_mask, other=0.0,
                    cache_modifier=".cg",
                )  # fmt: skip
                m_new = tl.maximum(mm, part_lse)
                a = tl.exp2(mm - m_new)
                b = tl.exp2(part_lse - m_new)
                merged = merged * a[:, None] + part * b[:, None]
                ll = ll * a + b
                mm = m_new
        o = merged / ll[:, None]
        head = kv_head * GROUP + g
        tl.store(
            out_ptr + row * stride_ob + head[:, None] * stride_oh + d[None, :],
            o.to(out_ptr.dtype.element_ty),
            mask=o_mask,
        )
        tl.store(counts_ptr + first, 0)  # ready for the next launch


@jit(do_not_specialize=("batch",))
def _balanced_decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr,
    out_ptr, part_out_ptr, part_lse_ptr, counts_ptr,
    qk_scale, batch,
    stride_qb, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    stride_bt, stride_ob, stride_oh,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    wait_for_inputs(PDL)
    prog = tl.program_id(0)
    progs = tl.num_programs(0)
    ranks = tl.arange(0, BLOCK_B)
    lens = tl.load(seq_lens_ptr + ranks, mask=ranks < batch, other=0).to(tl.int32)
    tiles = tl.where(ranks < batch, tl.maximum(tl.cdiv(lens, BLOCK_N), 1), 0)  # an item's, per sequence
    ends = tl.cumsum(tiles, axis=0) * NUM_KV_HEADS  # the tile after each sequence's items
    total = tl.sum(tiles, axis=0) * NUM_KV_HEADS
    t0 = _first_tile(prog, total, progs)
    t1 = _first_tile(prog + 1, total, progs)

    # the sequence holding tile t0, and where its items begin and end
    row = tl.sum((ends <= t0).to(tl.int32), axis=0)
    n = _at(ranks, tiles, row)
    seq_len = _at(ranks, lens, row)
    seq_end = _at(ranks, ends, row)
    seq_start = seq_end - n * NUM_KV_HEADS
    first_row = row  # the item holding t0: its sequence, KV head and tiles
    first_head = (t0 - seq_start) // tl.maximum(n, 1)
    first_start = seq_start + first_head * n
    first_end = first_start + n

    g, d, _, o_mask = _head_rows(GROUP, HEAD_DIM, BLOCK_G, BLOCK_D)
    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_sum = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    kv_head = 0
    for t in range(t0, t1):
        if t >= seq_end:  # the next sequence (each has at least NUM_KV_HEADS tiles: one at a time)
            row += 1
            n = _at(ranks, tiles, row)
            seq_len = _at(ranks, lens, row)
            seq_start = seq_end
            seq_end = seq_start + n * NUM_KV_HEADS
        local = t - seq_start
        kv_head = local // n
        j = local - kv_head * n  # the tile's index in its item
        fresh = j == 0
        m = tl.where(fresh, float("-inf"), m)
        l_sum = tl.where(fresh, 0.0, l_sum)
        acc = tl.where(fresh, 0.0, acc)

        pos = j * BLOCK_N + tl.arange(0, BLOCK_N)
        live = pos < seq_len
        page = tl.load(block_tables_ptr + row * stride_bt + pos // PAGE_SIZE, mask=live, other=0).to(tl.int64)
        slot = pos % PAGE_SIZE
        k = tl.load(
            k_cache_ptr + kv_head * stride_kh + (page * stride_kb + slot * stride_ks)[:, None] + d[None, :],
            mask=live[:, None] & (d[None, :] < HEAD_DIM), other=0.0,
        )  # fmt: skip
        v = tl.load(
            v_cache_ptr + kv_head * stride_vh + (page * stride_vb + slot * stride_vs)[:, None] + d[None, :],
            mask=live[:, None] & (d[None, :] < HEAD_DIM), other=0.0,
        )  # fmt: skip
        head = kv_head * GROUP + g
        q = tl.load(q_ptr + row * stride_qb + head[:, None] * stride_qh + d[None, :], mask=o_mask, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # (BLOCK_G, BLOCK_N), log2 units
        s = tl.where(live[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # an empty tile (a padded row) adds nothing
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m - m_safe)
        l_sum = l_sum * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m = m_new

        if j == n - 1:  # the item's last tile: its output, or its part when it began before t0
            item_start = t - j
            o = acc / tl.where(l_sum > 0, l_sum, 1.0)[:, None]
            if item_start >= t0:
                tl.store(
                    out_ptr + row * stride_ob + head[:, None] * stride_oh + d[None, :],
                    o.to(out_ptr.dtype.element_ty), mask=o_mask,
                )  # fmt: skip
            else:
                lse = m + tl.log2(tl.where(l_sum > 0, l_sum, 1.0))
                _store_part(o, lse, 2 * prog, part_out_ptr, part_lse_ptr, GROUP, HEAD_DIM, BLOCK_G, BLOCK_D)

    if t0 < t1:
        last_start = seq_start + kv_head * n  # the item holding t1 - 1
        last_end = last_start + n
        if last_end > t1:  # goes on past t1: its part so far to slot 0 (begun before t0) or 1 (begun here)
            o = acc / l_sum[:, None]  # it holds real tokens: l_sum > 0
            lse = m + tl.log2(l_sum)
            slot = 2 * prog + (last_start >= t0).to(tl.int32)
            _store_part(o, lse, slot, part_out_ptr, part_lse_ptr, GROUP, HEAD_DIM, BLOCK_G, BLOCK_D)
        if first_start < t0:  # the item holding t0 began in an earlier program
            _arrive(
                first_start, first_end, total, progs, first_row, first_head,
                out_ptr, part_out_ptr, part_lse_ptr, counts_ptr, stride_ob, stride_oh,
                GROUP, HEAD_DIM, BLOCK_G, BLOCK_D,
            )  # fmt: skip
        if (last_start >= t0) & (last_end > t1):  # began here, goes on past t1
            _arrive(
                last_start, last_end, total, progs, row, kv_head,
                out_ptr, part_out_ptr, part_lse_ptr, counts_ptr, stride_ob, stride_oh,
                GROUP, HEAD_DIM, BLOCK_G, BLOCK_D,
            )  # fmt: skip


def balanced_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    config: BalancedConfig | None = None,
    counts: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``paged_attention_decode`` over a grid of ``config.programs_per_sm`` programs a multiprocessor that
    share the batch's tiles evenly. ``counts``: (programs,) int32, zero, kept from one launch to the next
    (each launch leaves it zero; default: a fresh one). ``out``: the (B, Hq, D) tensor to write into."""
    require_triton("balanced_decode_attention")
    B, Hq, D = q.shape
    _, page_size, Hk, Dk = k_cache.shape
    if Dk != D or v_cache.shape != k_cache.shape or Hq % Hk or k_cache.dtype != q.dtype:
        raise ValueError(
            f"expected q (B, Hq, D) and caches of q's dtype (num_blocks, page_size, Hk, D) with Hq % Hk == 0; "
            f"got {tuple(q.shape)} {q.dtype}, {tuple(k_cache.shape)} {k_cache.dtype}, {tuple(v_cache.shape)}"
        )
    if B > MAX_BATCH:
        raise ValueError(f"balanced decode takes at most {MAX_BATCH} rows, got {B}")
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("caches must be contiguous in head_dim")
    config = config or BalancedConfig()
    programs = balanced_programs(config, q.device)
    if counts is None:
        counts = torch.zeros(programs, dtype=torch.int32, device=q.device)
    elif counts.shape != (programs,) or counts.dtype != torch.int32:
        raise ValueError(f"counts must be ({programs},) int32, got {tuple(counts.shape)} {counts.dtype}")
    q = q if q.stride(-1) == 1 else q.contiguous()
    out = out_like(q, out)
    if B == 0:
        return out
    group = Hq // Hk
    block_g = max(16, next_power_of_2(group))
    part_out = torch.empty((2 * programs, block_g, D), dtype=torch.float32, device=q.device)
    part_lse = torch.empty((2 * programs, block_g), dtype=torch.float32, device=q.device)
    _balanced_decode_kernel[(programs,)](
        q, k_cache, v_cache, block_tables, seq_lens, out, part_out, part_lse, counts,
        scale * LOG2E, B,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), block_tables.stride(0), out.stride(0),
        out.stride(1),
        NUM_KV_HEADS=Hk, GROUP=group, HEAD_DIM=D, PAGE_SIZE=page_size, BLOCK_G=block_g,
        BLOCK_D=max(16, next_power_of_2(D)), BLOCK_N=config.block_n, BLOCK_B=max(16, next_power_of_2(B)),
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=config.num_warps, num_stages=config.num_stages,
        **programmatic(q, B),
    )  # fmt: skip
    return out
