"""Triton paged-attention decode: one new query token per sequence against its paged K/V context.

Same contract as ``paged_attention_decode_ref`` (layouts in ``layers/attention/metadata.py``).

Design (decode is memory bound: every K/V byte of the context is read once, everything else is small):

- Grid ``(Hk, num_splits, B)``. A program owns one sequence, one KV head and one slice of the context,
  and computes all ``Hq / Hk`` query heads of that KV head together (rows of one ``tl.dot``, padded to
  16, the smallest MMA height), so each K/V tile is read from memory once, not once per query head.
- The context is walked in tiles of ``BLOCK_N`` tokens; each token's page comes from the block table,
  so a tile may span several pages (page size < BLOCK_N) or lie inside one. Softmax is online, in
  float32 and base 2.
- Split-KV: when ``B * Hk`` programs cannot fill the GPU (``DecodeConfig.programs_per_sm``), the
  context is cut into ``num_splits`` equal slices (cut from the real ``seq_len`` inside the kernel);
  each writes a normalised partial output and its log-sum-exp to float32 scratch, and a second kernel
  merges them. ``num_splits`` depends on shapes only (batch, heads, block-table width), so launches
  are CUDA-graph safe: no host syncs, scratch sized from shapes. A slice holds at least one tile, so a
  context shorter than the block table allows leaves the last slices empty: they write nothing, and the
  merge reads only the filled ones.
- Longest first: with more programs than the GPU runs at once, a batch of mixed lengths ends with a
  few long programs running alone (the last wave). Given ``order`` (the sequences by context length,
  longest first: ``longest_first``), the programs of grid row i take sequence ``order[i]``. The GPU
  starts programs roughly in linear index order, the first grid axis fastest, so the sequence is the
  last axis: every program of the longest sequence starts first, the short ones fill in behind.
- A float8 cache (``kv_quant.py``) is read as float8, half the bytes, and converted in registers to
  ``DecodeConfig.fp8_to`` (q's dtype, or float16, whose conversion from float8 is one instruction per
  pair on recent GPUs; q then goes to float16 too). Its scales are per KV head, so one program has one
  K scale and one V scale: the first multiplies the scores' scale, the second the output, and the
  tiles' products are unchanged. The float8 pool holds V by token (``kv_layout.py``: the second
  product's operand contiguous along the tokens it sums, as 8-bit tensor-core operands need); the
  kernel reads either layout.
"""

from __future__ import annotations

import math

import torch

from llmbench.kernels._triton import (
    jit,
    next_power_of_2,
    out_like,
    programmatic,
    require_triton,
    tl,
    wait_for_inputs,
)
from llmbench.kernels.decode_config import (
    SLICE_TILE,
    DecodeConfig,
    choose_num_splits,
    default_decode_config,
    is_wide,
)
from llmbench.kernels.kv_layout import by_token, load_v_by_token
from llmbench.kernels.kv_quant import check_scales
from llmbench.kernels.online_softmax import fold_tile

LOG2E = math.log2(math.e)


@jit
def _tile_load(ptrs, rows_ok, d, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, MASKED: tl.constexpr):
    # A (BLOCK_N, BLOCK_D) K or V tile; rows not ``rows_ok`` (if MASKED) and columns past HEAD_DIM are 0.
    # Without a column mask nothing can stop 16-byte loads along D.
    if MASKED and BLOCK_D == HEAD_DIM:
        tile = tl.load(ptrs, mask=rows_ok[:, None], other=0.0)
    elif MASKED:
        tile = tl.load(ptrs, mask=rows_ok[:, None] & (d[None, :] < HEAD_DIM), other=0.0)
    elif BLOCK_D == HEAD_DIM:
        tile = tl.load(ptrs)
    else:
        tile = tl.load(ptrs, mask=d[None, :] < HEAD_DIM, other=0.0)
    return tile


@jit
def _decode_tiles(
    q, m, l_sum, acc, k_base, v_base, bt_row, start, stop, end, qk_scale,
    stride_kb, stride_ks, stride_vb, stride_vs, stride_vd,
    HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr, DEQUANT: tl.constexpr, V_BY_TOKEN: tl.constexpr,
):  # fmt: skip
    # The online softmax over key tiles of BLOCK_N tokens from ``start`` (a multiple of BLOCK_N) to
    # ``stop``; keys at or past ``end`` are masked (MASKED False: the caller knows there are none).
    d = tl.arange(0, BLOCK_D)
    for tile in range(start, stop, BLOCK_N):
        pos = tile + tl.arange(0, BLOCK_N)  # (BLOCK_N,) key positions
        live = pos < end
        if MASKED:
            page = tl.load(bt_row + pos // PAGE_SIZE, mask=live, other=0).to(tl.int64)
        else:
            page = tl.load(bt_row + pos // PAGE_SIZE).to(tl.int64)
        slot = pos % PAGE_SIZE
        k_rows = page * stride_kb + slot * stride_ks
        k = _tile_load(k_base + k_rows[:, None] + d[None, :], live, d, HEAD_DIM, BLOCK_D, MASKED)
        if V_BY_TOKEN:  # tokens contiguous: the dot's operand along its sum (module docstring)
            v = load_v_by_token(
                v_base, bt_row, tile, end, stride_vb, stride_vd, d, HEAD_DIM, PAGE_SIZE, BLOCK_N, BLOCK_D
            )
        else:
            v_rows = page * stride_vb + slot * stride_vs
            v = _tile_load(v_base + v_rows[:, None] + d[None, :], live, d, HEAD_DIM, BLOCK_D, MASKED)
        if DEQUANT:  # float8 -> q's dtype, exactly: every float8 value is a bf16, fp16 and fp32 value
            k = k.to(q.dtype)
            v = v.to(q.dtype)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # (BLOCK_G, BLOCK_N), log2 units
        if MASKED:
            s = tl.where(live[None, :], s, float("-inf"))
        m, l_sum, acc = fold_tile(m, l_sum, acc, s, v, DOT_PRECISION)  # every tile holds a real key
    return m, l_sum, acc


@jit
def _slice_len(seq_len, num_splits, split_tokens, block_n):
    # Tokens per slice, whole tiles, so only a slice's last tile is ragged. By default each sequence is
    # cut into num_splits equal slices; with split_tokens > 0 into slices of that length (a short
    # sequence then leaves its last slices empty), which evens out a batch of mixed lengths.
    if split_tokens > 0:
        n = split_tokens
    else:
        n = tl.cdiv(tl.cdiv(seq_len, num_splits), block_n) * block_n
    return n


@jit(do_not_specialize=("num_splits", "split_tokens", "stride_bt"))
def _decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, order_ptr,
    out_ptr, part_out_ptr, part_lse_ptr, k_scale_ptr, v_scale_ptr,
    qk_scale, num_splits, split_tokens,
    stride_qb, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_vd,
    stride_bt, stride_ob, stride_oh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    TAIL_N: tl.constexpr, SPLIT: tl.constexpr, DOT_PRECISION: tl.constexpr,
    DEQUANT: tl.constexpr, FP8_TO_F16: tl.constexpr, ORDERED: tl.constexpr,
    V_BY_TOKEN: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    wait_for_inputs(PDL)
    kv_head = tl.program_id(0)
    split = tl.program_id(1)
    if ORDERED:
        seq = tl.load(order_ptr + tl.program_id(2)).to(tl.int64)
    else:
        seq = tl.program_id(2).to(tl.int64)
    seq_len = tl.load(seq_lens_ptr + seq).to(tl.int32)  # int32 like split_tokens: both branches below agree
    split_len = _slice_len(seq_len, num_splits, split_tokens, BLOCK_N)
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    head = kv_head * GROUP + g  # (BLOCK_G,) query heads of this KV head
    g_mask = g < GROUP
    d_mask = d < HEAD_DIM
    q = tl.load(
        q_ptr + seq * stride_qb + head[:, None] * stride_qh + d[None, :],
        mask=g_mask[:, None] & d_mask[None, :], other=0.0,
    )  # (BLOCK_G, BLOCK_D)  # fmt: skip

    if DEQUANT:  # float8 K: its head's scale joins the scores' scale
        qk_scale = qk_scale * tl.load(k_scale_ptr + kv_head)
        if FP8_TO_F16:  # float16: a wider mantissa than bfloat16, a range to 65504
            q = q.to(tl.float16)

    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_sum = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    bt_row = block_tables_ptr + seq * stride_bt
    k_base = k_cache_ptr + kv_head * stride_kh
    v_base = v_cache_ptr + kv_head * stride_vh
    if TAIL_N < BLOCK_N:  # whole BLOCK_N tiles unmasked, then what is left in masked TAIL_N tiles
        whole_end = start + tl.maximum(end - start, 0) // BLOCK_N * BLOCK_N  # an empty slice stays empty
        m, l_sum, acc = _decode_tiles(
            q, m, l_sum, acc, k_base, v_base, bt_row, start, whole_end, end, qk_scale,
            stride_kb, stride_ks, stride_vb, stride_vs, stride_vd,
            HEAD_DIM, PAGE_SIZE, BLOCK_D, BLOCK_N, False, DOT_PRECISION, DEQUANT, V_BY_TOKEN,
        )  # fmt: skip
        start = whole_end
    m, l_sum, acc = _decode_tiles(
        q, m, l_sum, acc, k_base, v_base, bt_row, start, end, end, qk_scale,
        stride_kb, stride_ks, stride_vb, stride_vs, stride_vd,
        HEAD_DIM, PAGE_SIZE, BLOCK_D, TAIL_N, True, DOT_PRECISION, DEQUANT, V_BY_TOKEN,
    )  # fmt: skip

    # An empty slice has l_sum = 0: unsplit (seq_len 0, a padded graph row) it writes zeros; split, nothing.
    o = acc / tl.where(l_sum > 0, l_sum, 1.0)[:, None]  # (BLOCK_G, BLOCK_D)
    if DEQUANT:  # float8 V: its head's scale
        o = o * tl.load(v_scale_ptr + kv_head)
    o_mask = g_mask[:, None] & d_mask[None, :]
    if SPLIT:
        # (BLOCK_G,) rows of the (B, Hq, num_splits) scratch
        row = (seq * (GROUP * tl.num_programs(0)) + head) * num_splits + split
        lse = m + tl.log2(tl.where(l_sum > 0, l_sum, 1.0))
        rows_ok = g_mask & (g * 0 + split * split_len < seq_len)  # (BLOCK_G,): none in an empty slice
        tl.store(
            part_out_ptr + row[:, None] * HEAD_DIM + d[None, :], o, mask=rows_ok[:, None] & d_mask[None, :]
        )
        tl.store(part_lse_ptr + row, lse, mask=rows_ok)
    else:
        o_ptrs = out_ptr + seq * stride_ob + head[:, None] * stride_oh + d[None, :]
        tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=o_mask)


@jit(do_not_specialize=("num_splits", "split_tokens"))
def _decode_reduce_kernel(
    part_out_ptr, part_lse_ptr, out_ptr, seq_lens_ptr, num_splits, split_tokens, block_n, stride_ob, stride_oh,
    HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    wait_for_inputs(PDL)
    # Grid (B, Hq): merge the slices of one query head, weighting each by exp(lse - max lse). Only the
    # slices that hold tokens are read (the decode kernel cuts them the same way and writes no other):
    # a short context in a graph captured for the longest leaves most of its slices empty.
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + seq).to(tl.int32)
    split_len = tl.maximum(_slice_len(seq_len, num_splits, split_tokens, block_n), 1)
    filled = tl.cdiv(seq_len, split_len)  # 0 for an empty sequence: its output is 0
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    s_mask = s < tl.minimum(filled, num_splits)
    row = (seq * tl.num_programs(1) + head) * num_splits + s  # (BLOCK_S,)
    lse = tl.load(part_lse_ptr + row, mask=s_mask, other=float("-inf"))
    m = tl.max(lse, axis=0)
    w = tl.exp2(lse - tl.where(m == float("-inf"), 0.0, m))  # (BLOCK_S,)
    parts = tl.load(
        part_out_ptr + row[:, None] * HEAD_DIM + d[None, :],
        mask=s_mask[:, None] & (d[None, :] < HEAD_DIM),
        other=0.0,
    )  # (BLOCK_S, BLOCK_D)
    total = tl.sum(w, axis=0)
    o = tl.sum(w[:, None] * parts, axis=0) / tl.where(total > 0, total, 1.0)  # (BLOCK_D,)
    tl.store(
        out_ptr + seq * stride_ob + head * stride_oh + d, o.to(out_ptr.dtype.element_ty), mask=d < HEAD_DIM
    )


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    num_splits: int | None = None,
    config: DecodeConfig | None = None,
    split_tokens: int | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    order: torch.Tensor | None = None,
    uniform: bool = False,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``paged_attention_decode`` with the split count and tile config exposed (tests, tuning).

    ``split_tokens``: cut every context into slices of this many tokens (a multiple of the tile)
    instead of ``num_splits`` equal slices per sequence; the grid then has one slice per
    ``split_tokens`` of the longest context the block tables allow. ``k_scale``, ``v_scale`` (Hk,): the
    scales of a float8 cache. ``order`` (B,) integer: a permutation of the rows, the order in which
    programs take them (``longest_first``); the output is the same whatever it is. ``uniform``: the
    contexts are about one length (``is_uniform``), which the default tiles may take into account. ``out``:
    the (B, Hq, D) tensor to write into (default: a fresh one)."""
    require_triton("paged_attention_decode")
    dequant = check_scales("paged_attention_decode", k_cache, k_scale, v_scale)
    # q: (B, Hq, D); caches: (num_blocks, page_size, Hk, D); block_tables: (B, max_blocks); seq_lens: (B,)
    B, Hq, D = q.shape
    _, page_size, Hk, Dk = k_cache.shape
    if Dk != D or v_cache.shape != k_cache.shape or Hq % Hk:
        raise ValueError(
            f"expected q (B, Hq, D) and caches (num_blocks, page_size, Hk, D) with Hq % Hk == 0; got "
            f"{tuple(q.shape)}, {tuple(k_cache.shape)}, {tuple(v_cache.shape)}"
        )
    v_tokens = by_token(v_cache)
    if k_cache.stride(-1) != 1 or (v_cache.stride(-1) != 1 and not v_tokens):
        raise ValueError("caches must be contiguous in head_dim (V may instead be laid out by token)")
    q = q if q.stride(-1) == 1 else q.contiguous()
    if config is None:
        config = default_decode_config(D, q.dtype, dequant, v_tokens, is_wide(B, Hk, q.device), uniform)
        if split_tokens and split_tokens % config.block_n and split_tokens % SLICE_TILE == 0:
            config = config._replace(block_n=SLICE_TILE)  # tiles wider than the slices: take 64
    if config.tail_n and (config.tail_n > config.block_n or config.block_n % config.tail_n):
        raise ValueError(
            f"tail_n must divide block_n ({config.block_n}) and be at most it, got {config.tail_n}"
        )
    max_context = block_tables.shape[1] * page_size  # an upper bound known without a host sync
    if split_tokens is not None:
        if split_tokens < 1 or split_tokens % config.block_n:
            raise ValueError(
                f"split_tokens must be a positive multiple of {config.block_n}, got {split_tokens}"
            )
        num_splits = max(1, -(-max_context // split_tokens))
    elif num_splits is None:
        num_splits = choose_num_splits(B, Hk, max_context, config, q.device)
    out = out_like(q, out)  # (B, Hq, D)
    if B == 0:
        return out
    group = Hq // Hk
    block_d = next_power_of_2(D)
    split = num_splits > 1
    if split:  # scratch sized from shapes alone (CUDA-graph safe)
        part_out = torch.empty((B, Hq, num_splits, D), dtype=torch.float32, device=q.device)
        part_lse = torch.empty((B, Hq, num_splits), dtype=torch.float32, device=q.device)
    else:
        part_out = part_lse = out  # placeholders, never touched when SPLIT is False
    if order is not None and order.shape != (B,):
        raise ValueError(f"order must be a permutation of the {B} rows, got shape {tuple(order.shape)}")
    _decode_kernel[(Hk, num_splits, B)](
        q, k_cache, v_cache, block_tables, seq_lens,
        seq_lens if order is None else order,
        out, part_out, part_lse,
        k_scale if dequant else out, v_scale if dequant else out,  # placeholders when DEQUANT is False
        scale * LOG2E, num_splits, split_tokens or 0,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        *v_cache.stride(), block_tables.stride(0), out.stride(0), out.stride(1),
        GROUP=group, HEAD_DIM=D, PAGE_SIZE=page_size,
        BLOCK_G=max(16, next_power_of_2(group)), BLOCK_D=max(16, block_d), BLOCK_N=config.block_n,
        TAIL_N=config.tail_n or config.block_n, SPLIT=split, DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=config.num_warps, num_stages=config.num_stages,
        DEQUANT=dequant, FP8_TO_F16=dequant and config.fp8_to == "fp16" and q.dtype != torch.float32, ORDERED=order is not None,
        V_BY_TOKEN=v_tokens,
        **programmatic(q, B),
    )  # fmt: skip
    if split:
        _decode_reduce_kernel[(B, Hq)](
            part_out, part_lse, out, seq_lens, num_splits, split_tokens or 0, config.block_n, out.stride(0),
            out.stride(1),
            HEAD_DIM=D, BLOCK_S=next_power_of_2(num_splits), BLOCK_D=block_d, num_warps=4,
            **programmatic(out, B),
        )  # fmt: skip
    return out


def paged_attention_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    order: torch.Tensor | None = None,
    uniform: bool = False,
) -> torch.Tensor:
    """Triton version of ``paged_attention_decode_ref``: (B, Hq, D) -> fresh (B, Hq, D)."""
    return decode_attention(
        q, k_cache, v_cache, block_tables, seq_lens, scale, k_scale=k_scale, v_scale=v_scale, order=order,
        uniform=uniform,
    )  # fmt: skip
