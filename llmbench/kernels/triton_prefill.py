"""Triton paged-attention prefill: flash attention of a flat batch of query chunks over the paged cache.

Same contract as ``paged_attention_prefill_ref`` (layouts in ``layers/attention/metadata.py``): query
rows of sequence s are ``q[query_start_loc[s]:query_start_loc[s+1]]``, sitting at key positions
``seq_len - query_len + i`` (causal); the context before them (prefix-cache hits, earlier chunks) is
already in the cache, and so are the new tokens' K/V. Sequences with query_len 1 (decodes mixed into the
batch) are ordinary short chunks.

Design (prefill is compute bound):

- A program owns a tile of ``BLOCK_M`` rows = ``BLOCK_Q`` query tokens x the ``Hq / Hk`` query heads of
  one KV head (padded to a power of two), so each K/V tile feeds every query head that shares it.
- Grid ``(T // BLOCK_Q + B, Hk)``: an upper bound on the query tiles of all sequences, known from
  shapes alone. Sequence s's tiles start at ``query_start_loc[s] // BLOCK_Q + s``; a program finds its
  sequence by binary search over ``query_start_loc`` and exits if its tile is past the sequence's end.
  Tiles are numbered from the end, so the longest (causally last) ones are scheduled first.
- Keys are walked in tiles of ``BLOCK_N`` with an online softmax in float32 (base 2): first the tiles
  every row of the query tile may see (no mask), then the diagonal tiles with the causal mask.
- A float8 cache (``kv_quant.py``) is converted on load to float16, and a 16-bit q with it, as the decode
  kernel does (``triton_decode.py``: one conversion instruction a pair, against three to bfloat16); a
  float32 q keeps float32. A program's KV head has one K and one V scale, applied to the scores' scale
  and to the output. The float8 pool holds V by token (``kv_layout.py``); the kernel reads either layout.
"""

from __future__ import annotations

import math
from typing import NamedTuple

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
from llmbench.kernels.kv_layout import by_token, load_v_by_token
from llmbench.kernels.kv_quant import check_scales
from llmbench.kernels.online_softmax import fold_tile

LOG2E = math.log2(math.e)


class PrefillConfig(NamedTuple):
    block_m: int  # query rows (tokens x heads of one KV group) per program
    block_n: int  # keys per tile
    num_warps: int
    num_stages: int


def default_prefill_config(
    max_query_len: int,
    group_pad: int,
    head_dim: int,
    dtype: torch.dtype,
    fp8: bool = False,
    narrow_up_to: int = 0,
) -> PrefillConfig:
    """For q's ``dtype``, over a float8 cache if ``fp8``. ``narrow_up_to``: a step whose longest query is at
    most this many tokens takes 64-row tiles over a cache of q's dtype even where its queries would fill
    wider ones (``Tuning.prefill_narrow_tiles_up_to``)."""
    # Short queries (decodes, small chunks) get short tiles: rows past the query would be wasted MMA work.
    block_m = min(128, max(16, next_power_of_2(max_query_len * group_pad), group_pad))
    if dtype == torch.float32 or head_dim > 128:  # twice the bytes per tile: smaller tiles fit shared memory
        return PrefillConfig(block_m=min(block_m, 64), block_n=32, num_warps=4, num_stages=2)
    # H200, bf16, 2048-token prompt, 32/8 heads x 128: 141 µs (m128 n128 w8), 144 (m64 n64 w4), 160 (m128 n64 w8).
    # Over float8 by token (devtools/bench_kernels.py --tune prefill-fp8: a 2,048-token chunk after as much
    # context): 437 µs (m128 n64 w4 s2), 458 (m128 n128 w8 s2), 485 (m128 n128 w8 s3), 822 (m128 n128 w4 s3).
    if block_m >= 128 and fp8:
        return PrefillConfig(block_m=block_m, block_n=64, num_warps=4, num_stages=2)
    # H200, bf16, 16/8 and 32/8 heads x 128 (devtools/bench_kernels.py --tune prefill-lengths): 64-row tiles
    # are as fast or faster wherever the longest query is at most 1,024 tokens (about a tenth on steps of
    # twenty prompts of 100-1,024 tokens), slower from 4,096.
    if block_m >= 128 and max_query_len > narrow_up_to:
        return PrefillConfig(block_m=block_m, block_n=128, num_warps=8, num_stages=3)
    return PrefillConfig(block_m=min(block_m, 64), block_n=64, num_warps=4, num_stages=3)


@jit
def _find_seq(query_start_loc_ptr, first_seq, num_seqs, pid, BLOCK_Q: tl.constexpr):
    # Last sequence s >= first_seq whose first tile index query_start_loc[s] // BLOCK_Q + s - first_seq is
    # <= pid; first_seq - 1 if none is (a tile before the first sequence's rows).
    lo = first_seq
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        first_tile = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid - first_seq
        if first_tile <= pid:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@jit
def _attend_tiles(
    q, m, l_sum, acc, k_base, v_base, bt_row, q_pos, start, end, kv_end, qk_scale,
    stride_kb, stride_ks, stride_vb, stride_vs, stride_vd,
    HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr, DEQUANT: tl.constexpr, V_BY_TOKEN: tl.constexpr,
):  # fmt: skip
    d = tl.arange(0, BLOCK_D)
    for tile in range(start, end, BLOCK_N):  # start: 0, or a multiple of BLOCK_N
        pos = tile + tl.arange(0, BLOCK_N)  # (BLOCK_N,) key positions
        p_mask = pos < kv_end
        page = tl.load(bt_row + pos // PAGE_SIZE, mask=p_mask, other=0).to(tl.int64)
        slot = pos % PAGE_SIZE
        if BLOCK_D == HEAD_DIM:
            kv_mask = p_mask[:, None]
        else:
            kv_mask = p_mask[:, None] & (d[None, :] < HEAD_DIM)
        k = tl.load(
            k_base + (page * stride_kb + slot * stride_ks)[:, None] + d[None, :], mask=kv_mask, other=0.0
        )
        if V_BY_TOKEN:
            v = load_v_by_token(
                v_base, bt_row, tile, kv_end, stride_vb, stride_vd, d, HEAD_DIM, PAGE_SIZE, BLOCK_N, BLOCK_D
            )
        else:
            v = tl.load(
                v_base + (page * stride_vb + slot * stride_vs)[:, None] + d[None, :], mask=kv_mask, other=0.0
            )
        if DEQUANT:  # float8 -> q's dtype (float16 or float32), exactly; the scales are applied by the caller
            k = k.to(q.dtype)
            v = v.to(q.dtype)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # (BLOCK_M, BLOCK_N), log2 units
        if CAUSAL:
            s = tl.where((pos[None, :] <= q_pos[:, None]) & p_mask[None, :], s, float("-inf"))
        m, l_sum, acc = fold_tile(m, l_sum, acc, s, v, DOT_PRECISION)  # key 0 is visible to every row
    return m, l_sum, acc


@jit(do_not_specialize=("first_seq", "num_seqs", "stride_bt"))
def _prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, query_start_loc_ptr, seq_lens_ptr, out_ptr,
    k_scale_ptr, v_scale_ptr, qk_scale, first_seq, num_seqs,
    stride_qt, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_vd,
    stride_bt, stride_ot, stride_oh,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DEQUANT: tl.constexpr, FP8_TO_F16: tl.constexpr, V_BY_TOKEN: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    wait_for_inputs(PDL)
    # BLOCK_M rows = BLOCK_Q tokens x GROUP_PAD heads, token-major.
    # Reversed, so the causally heaviest tiles (a sequence's last) start first and the last wave is light.
    pid = tl.num_programs(0) - 1 - tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = _find_seq(query_start_loc_ptr, first_seq, num_seqs, pid, BLOCK_Q)
    if seq < first_seq:  # a spare tile of the upper-bound grid, before the first sequence's rows
        return
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    q_block = pid - (q_start // BLOCK_Q + seq - first_seq)
    if q_block * BLOCK_Q >= q_len:  # a spare tile of the upper-bound grid
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    context = seq_len - q_len  # keys before this step's first query

    r = tl.arange(0, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    tok = q_block * BLOCK_Q + r // GROUP_PAD  # (BLOCK_M,) query index within the sequence
    head = kv_head * GROUP + r % GROUP_PAD  # (BLOCK_M,) query head
    row_mask = (tok < q_len) & (r % GROUP_PAD < GROUP)
    io_mask = row_mask[:, None] & (d[None, :] < HEAD_DIM)
    q_rows = (q_start + tok).to(tl.int64)
    q = tl.load(
        q_ptr + q_rows[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :], mask=io_mask, other=0.0
    )
    q_pos = context + tok  # (BLOCK_M,) key position of each query row
    if DEQUANT:  # float8 K: its head's scale joins the scores' scale
        qk_scale = qk_scale * tl.load(k_scale_ptr + kv_head)
        if FP8_TO_F16:  # the tiles become float16, one instruction a pair (bfloat16 takes three)
            q = q.to(tl.float16)

    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    k_base = k_cache_ptr + kv_head * stride_kh
    v_base = v_cache_ptr + kv_head * stride_vh
    first_q_pos = context + q_block * BLOCK_Q
    kv_end = tl.minimum(seq_len, first_q_pos + BLOCK_Q)  # one past the tile's last visible key
    full_end = (first_q_pos + 1) // BLOCK_N * BLOCK_N  # tiles before this are visible to every row
    m, l_sum, acc = _attend_tiles(
        q, m, l_sum, acc, k_base, v_base, bt_row, q_pos, 0, full_end, kv_end, qk_scale,
        stride_kb, stride_ks, stride_vb, stride_vs, stride_vd,
        HEAD_DIM, PAGE_SIZE, BLOCK_D, BLOCK_N, False, DOT_PRECISION, DEQUANT, V_BY_TOKEN,
    )  # fmt: skip
    m, l_sum, acc = _attend_tiles(
        q, m, l_sum, acc, k_base, v_base, bt_row, q_pos, full_end, kv_end, kv_end, qk_scale,
        stride_kb, stride_ks, stride_vb, stride_vs, stride_vd,
        HEAD_DIM, PAGE_SIZE, BLOCK_D, BLOCK_N, True, DOT_PRECISION, DEQUANT, V_BY_TOKEN,
    )  # fmt: skip
    o = acc / l_sum[:, None]  # l_sum >= 1 for real rows: the row maximum contributes exp2(0)
    if DEQUANT:  # float8 V: its head's scale
        o = o * tl.load(v_scale_ptr + kv_head)
    tl.store(
        out_ptr + q_rows[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :],
        o.to(out_ptr.dtype.element_ty),
        mask=io_mask,
    )


def prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    max_query_len: int,
    scale: float,
    config: PrefillConfig | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    first_seq: int = 0,
    out: torch.Tensor | None = None,
    narrow_up_to: int = 0,
) -> torch.Tensor:
    """``paged_attention_prefill`` with the tile config exposed (tests, tuning); ``k_scale``, ``v_scale``
    (Hk,): the scales of a float8 cache. ``first_seq``: attend the sequences from this one on and leave the
    rows of those before it unwritten (a mixed step's decodes, which the decode kernel takes); ``out``: the
    (T, Hq, D) tensor to write into (default: a fresh one); ``narrow_up_to``: ``default_prefill_config``'s,
    where ``config`` is not given."""
    require_triton("paged_attention_prefill")
    dequant = check_scales("paged_attention_prefill", k_cache, k_scale, v_scale)
    # q: (T, Hq, D); caches: (num_blocks, page_size, Hk, D); query_start_loc: (B+1,); seq_lens: (B,)
    T, Hq, D = q.shape
    _, page_size, Hk, Dk = k_cache.shape
    B = seq_lens.shape[0]
    if Dk != D or v_cache.shape != k_cache.shape or Hq % Hk or query_start_loc.shape != (B + 1,):
        raise ValueError(
            f"expected q (T, Hq, D), caches (num_blocks, page_size, Hk, D) with Hq % Hk == 0 and "
            f"query_start_loc (B+1,); got {tuple(q.shape)}, {tuple(k_cache.shape)}, {tuple(v_cache.shape)}, "
            f"{tuple(query_start_loc.shape)} for B={B}"
        )
    v_tokens = by_token(v_cache)
    if k_cache.stride(-1) != 1 or (v_cache.stride(-1) != 1 and not v_tokens):
        raise ValueError("caches must be contiguous in head_dim (V may instead be laid out by token)")
    q = q if q.stride(-1) == 1 else q.contiguous()
    group = Hq // Hk
    group_pad = next_power_of_2(group)
    config = config or default_prefill_config(max_query_len, group_pad, D, q.dtype, dequant, narrow_up_to)
    if config.block_m < group_pad:
        raise ValueError(f"block_m {config.block_m} must hold a whole KV group of {group_pad} heads")
    if not 0 <= first_seq <= B:
        raise ValueError(f"first_seq must lie in [0, {B}], got {first_seq}")
    out = out_like(q, out)  # (T, Hq, D)
    if T == 0 or B == first_seq:
        return out
    block_q = config.block_m // group_pad
    # An upper bound on the query tiles of the sequences from first_seq on, numbered from the tile that
    # holds first_seq's first row (the tiles before it exit at once).
    _prefill_kernel[(T // block_q + B - first_seq, Hk)](
        q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, out,
        k_scale if dequant else out, v_scale if dequant else out,  # placeholders when DEQUANT is False
        scale * LOG2E, first_seq, B,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        *v_cache.stride(), block_tables.stride(0), out.stride(0), out.stride(1),
        GROUP=group, GROUP_PAD=group_pad, HEAD_DIM=D, PAGE_SIZE=page_size,
        BLOCK_M=config.block_m, BLOCK_Q=block_q, BLOCK_D=max(16, next_power_of_2(D)), BLOCK_N=config.block_n,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32", DEQUANT=dequant,
        FP8_TO_F16=dequant and q.dtype != torch.float32, V_BY_TOKEN=v_tokens,
        num_warps=config.num_warps, num_stages=config.num_stages,
        **programmatic(q, T),
    )  # fmt: skip
    return out


def paged_attention_prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    max_query_len: int,
    scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Triton version of ``paged_attention_prefill_ref``: (T, Hq, D) -> fresh (T, Hq, D)."""
    return prefill_attention(
        q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, max_query_len, scale,
        k_scale=k_scale, v_scale=v_scale,
    )  # fmt: skip
