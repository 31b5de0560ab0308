"""What a paged decode can take from memory, and a decode kernel that keeps its tiles in registers.

The engine's decode kernel (``llmbench/kernels/triton_decode.py``) reads K/V tiles through the tensor
cores' operand path. Two questions, asked by ``python devtools/bench_kernels.py --tune decode-ceiling``:

- ``paged_read``: how fast can a kernel read the pool as the decode kernel does (a program per sequence and
  KV head, its pages through the block table, longest first) when it does nothing with the tiles but sum
  them? That is the ceiling any decode kernel of this shape can reach on this layout.
- ``register_decode_attention``: a decode without the tensor cores. Each tile's ``BLOCK_N`` key slots keep
  an online softmax of their own (slot ``n`` sees tokens ``n``, ``n + BLOCK_N``, ...), so a tile needs no
  reduction across the program's threads but the dot product along the head's features; the slots are
  merged once, at the end. Same contract as ``paged_attention_decode_ref`` for a bf16 cache, one slice per
  sequence.
"""

from __future__ import annotations

import torch

from llmbench.kernels._triton import jit, out_like, require_triton, tl
from llmbench.kernels.triton_decode import LOG2E, _decode_reduce_kernel, _slice_len


@jit
def _taken(order_ptr, lens_ptr):
    # The sequence grid row program_id(1) takes (``order``: longest first) and its context length.
    seq = tl.load(order_ptr + tl.program_id(1)).to(tl.int64)
    return seq, tl.load(lens_ptr + seq)


@jit
def _head_rows(
    k_ptr, v_ptr, bt_row, tile, seq_len, d, stride_kb, stride_ks, base,
    BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr, POLICY: tl.constexpr,
):  # fmt: skip
    # One KV head's K and V rows of the tile from ``tile`` (``base``: the head's offset in a token's
    # row), and which hold a token before ``seq_len``.
    pos = tile + tl.arange(0, BLOCK_N)
    live = pos < seq_len
    page = tl.load(bt_row + pos // PAGE_SIZE, mask=live, other=0).to(tl.int64)
    rows = page * stride_kb + (pos % PAGE_SIZE) * stride_ks + base
    k = tl.load(k_ptr + rows[:, None] + d[None, :], mask=live[:, None], other=0.0, eviction_policy=POLICY)
    v = tl.load(v_ptr + rows[:, None] + d[None, :], mask=live[:, None], other=0.0, eviction_policy=POLICY)
    return k, v, live


@jit
def _paged_read_kernel(
    k_ptr, v_ptr, bt_ptr, lens_ptr, order_ptr, out_ptr, stride_kb, stride_ks, stride_kh, stride_bt,
    HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, POLICY: tl.constexpr,
):  # fmt: skip
    kv_head = tl.program_id(0)
    seq, seq_len = _taken(order_ptr, lens_ptr)
    d = tl.arange(0, HEAD_DIM)
    acc = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    bt_row = bt_ptr + seq * stride_bt
    for tile in range(0, seq_len, BLOCK_N):
        k, v, _ = _head_rows(
            k_ptr, v_ptr, bt_row, tile, seq_len, d, stride_kb, stride_ks, kv_head * stride_kh, BLOCK_N, PAGE_SIZE,
            POLICY,
        )  # fmt: skip
        acc += k.to(tl.float32) + v.to(tl.float32)
    tl.store(out_ptr + (seq * tl.num_programs(0) + kv_head) * HEAD_DIM + d, tl.sum(acc, axis=0))


def paged_read(
    k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
    order: torch.Tensor, block_n: int = 64, num_warps: int = 4, num_stages: int = 1, evict: bool = False,
) -> torch.Tensor:  # fmt: skip
    """(B, Hk, D) float32: each sequence's K plus V summed over its context, per KV head."""
    require_triton("paged_read")
    _, page_size, hk, d = k_cache.shape
    b = seq_lens.shape[0]
    out = torch.empty((b, hk, d), dtype=torch.float32, device=k_cache.device)
    _paged_read_kernel[(hk, b)](
        k_cache, v_cache, block_tables, seq_lens, order, out, k_cache.stride(0), k_cache.stride(1),
        k_cache.stride(2), block_tables.stride(0),
        HEAD_DIM=d, PAGE_SIZE=page_size, BLOCK_N=block_n, POLICY="evict_first" if evict else "", num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    return out


def paged_read_ref(k_cache, v_cache, block_tables, seq_lens) -> torch.Tensor:
    page = k_cache.shape[1]
    rows = []
    for b, n in enumerate(seq_lens.tolist()):
        pages = block_tables[b, : -(-n // page)].long()
        k = k_cache[pages].flatten(0, 1)[:n].float()
        v = v_cache[pages].flatten(0, 1)[:n].float()
        rows.append((k + v).sum(dim=0))
    return torch.stack(rows)


@jit
def _register_decode_kernel(
    q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, order_ptr, out_ptr, qk_scale,
    stride_qb, stride_qh, stride_kb, stride_ks, stride_kh, stride_bt, stride_ob, stride_oh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    kv_head = tl.program_id(0)
    seq, seq_len = _taken(order_ptr, lens_ptr)
    d = tl.arange(0, HEAD_DIM)
    bt_row = bt_ptr + seq * stride_bt
    base = kv_head * stride_kh
    q0 = tl.load(q_ptr + seq * stride_qb + (kv_head * GROUP) * stride_qh + d).to(tl.float32) * qk_scale
    m0 = tl.full([BLOCK_N], float("-inf"), tl.float32)
    l0 = tl.zeros([BLOCK_N], tl.float32)
    a0 = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    if GROUP == 2:
        q1 = (
            tl.load(q_ptr + seq * stride_qb + (kv_head * GROUP + 1) * stride_qh + d).to(tl.float32) * qk_scale
        )
        m1 = tl.full([BLOCK_N], float("-inf"), tl.float32)
        l1 = tl.zeros([BLOCK_N], tl.float32)
        a1 = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    for tile in range(0, seq_len, BLOCK_N):
        k, v, live = _head_rows(
            k_ptr, v_ptr, bt_row, tile, seq_len, d, stride_kb, stride_ks, base, BLOCK_N, PAGE_SIZE, ""
        )  # fmt: skip
        k, v = k.to(tl.float32), v.to(tl.float32)
        m0, l0, a0 = _fold_slots(m0, l0, a0, k, v, q0, live)
        if GROUP == 2:
            m1, l1, a1 = _fold_slots(m1, l1, a1, k, v, q1, live)
    o_base = out_ptr + seq * stride_ob + (kv_head * GROUP) * stride_oh
    _merge_slots(m0, l0, a0, o_base + d)
    if GROUP == 2:
        _merge_slots(m1, l1, a1, o_base + stride_oh + d)


@jit
def _fold_slots(m, l_sum, acc, k, v, q, live):
    # One query head's tile: each key slot folds its own token into its own running max, sum and output,
    # so nothing is reduced across the tile's rows but the dot product along the head's features.
    s = tl.where(live, tl.sum(k * q[None, :], axis=1), float("-inf"))
    m_new = tl.maximum(m, s)
    safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m - safe)
    p = tl.exp2(s - safe)
    return m_new, l_sum * alpha + p, acc * alpha[:, None] + p[:, None] * v


@jit
def _merge_slots(m, l_sum, acc, ptrs):
    top = tl.max(m, axis=0)
    w = tl.where(m == float("-inf"), 0.0, tl.exp2(m - tl.where(top == float("-inf"), 0.0, top)))
    total = tl.sum(l_sum * w, axis=0)
    o = tl.sum(acc * w[:, None], axis=0) / tl.where(total > 0, total, 1.0)
    tl.store(ptrs, o.to(ptrs.dtype.element_ty))


def register_decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    seq_lens: torch.Tensor, scale: float, order: torch.Tensor, block_n: int = 32, num_warps: int = 4,
    num_stages: int = 1,
) -> torch.Tensor:  # fmt: skip
    """(B, Hq, D): ``paged_attention_decode_ref`` for one or two query heads a KV head."""
    require_triton("register_decode_attention")
    b, hq, d = q.shape
    _, page_size, hk, _ = k_cache.shape
    if hq // hk not in (1, 2):
        raise ValueError(f"one or two query heads a KV head, got {hq} over {hk}")
    out = out_like(q, None)
    _register_decode_kernel[(hk, b)](
        q, k_cache, v_cache, block_tables, seq_lens, order, out, scale * LOG2E,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        out.stride(0), out.stride(1),
        GROUP=hq // hk, HEAD_DIM=d, PAGE_SIZE=page_size, BLOCK_N=block_n, num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    return out


# --- a program per sequence: every KV head of a page at once ------------------------------------------
#
# In the pool a page holds its tokens one after another, each token's KV heads side by side, so one page of
# one sequence is a contiguous block (page_size x Hk x D). A program that takes a sequence whole (or a slice
# of it) reads those blocks, not 256-byte rows of one head. ``paged_read_rows`` measures what that read can
# reach; ``rows_decode_attention`` is a decode built on it: a tile's rows are (token, KV head) pairs, every
# query head is scored against all of them on the tensor cores, and a score whose KV head is not the query
# head's is masked, so the products do Hk times the work the scores need (the tensor cores are otherwise
# idle in a decode) in exchange for contiguous reads.


@jit
def _slice(seq_len, num_splits, split, BLOCK_N: tl.constexpr):
    # [start, end) of a sequence's slice ``split`` of ``num_splits``, cut as the engine's decode cuts it
    slice_len = _slice_len(seq_len, num_splits, 0, BLOCK_N)
    start = split * slice_len
    return start, tl.minimum(start + slice_len, seq_len)


@jit
def _page_rows(
    k_ptr, v_ptr, bt_row, tile, end, r, d, stride_kb,
    HK: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr,
):  # fmt: skip
    # The K and V rows (token, KV head) of the tile from ``tile``, and which hold a token before ``end``.
    pos = tile + r // HK
    live = pos < end
    page = tl.load(bt_row + pos // PAGE_SIZE, mask=live, other=0).to(tl.int64)
    rows = page * stride_kb + ((pos % PAGE_SIZE) * HK + r % HK) * HEAD_DIM
    k = tl.load(k_ptr + rows[:, None] + d[None, :], mask=live[:, None], other=0.0)
    v = tl.load(v_ptr + rows[:, None] + d[None, :], mask=live[:, None], other=0.0)
    return k, v, live


@jit
def _paged_read_rows_kernel(
    k_ptr, v_ptr, bt_ptr, lens_ptr, order_ptr, out_ptr, num_splits, stride_kb, stride_bt,
    HK: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    split = tl.program_id(0)
    seq, seq_len = _taken(order_ptr, lens_ptr)
    start, end = _slice(seq_len, num_splits, split, BLOCK_N)
    r = tl.arange(0, BLOCK_N * HK)  # (token, head) rows of a tile
    d = tl.arange(0, HEAD_DIM)
    acc = tl.zeros([BLOCK_N * HK, HEAD_DIM], tl.float32)
    bt_row = bt_ptr + seq * stride_bt
    for tile in range(start, end, BLOCK_N):
        k, v, live = _page_rows(k_ptr, v_ptr, bt_row, tile, end, r, d, stride_kb, HK, HEAD_DIM, PAGE_SIZE)
        acc += k.to(tl.float32) + v.to(tl.float32)
    heads = tl.sum(tl.reshape(acc, [BLOCK_N, HK, HEAD_DIM]), axis=0)  # (HK, D)
    h = tl.arange(0, HK)
    tl.store(out_ptr + ((seq * num_splits + split) * HK + h[:, None]) * HEAD_DIM + d[None, :], heads)


def paged_read_rows(
    k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
    order: torch.Tensor, block_n: int = 16, num_warps: int = 4, num_stages: int = 1, num_splits: int = 1,
) -> torch.Tensor:  # fmt: skip
    """(B, Hk, D) float32, as ``paged_read``, each program a slice of a sequence with all its KV heads."""
    require_triton("paged_read_rows")
    _, page_size, hk, d = k_cache.shape
    if not k_cache.is_contiguous() or page_size % block_n:
        raise ValueError("a contiguous pool whose pages hold whole tiles")
    b = seq_lens.shape[0]
    out = torch.zeros((b, num_splits, hk, d), dtype=torch.float32, device=k_cache.device)
    _paged_read_rows_kernel[(num_splits, b)](
        k_cache, v_cache, block_tables, seq_lens, order, out, num_splits, k_cache.stride(0), block_tables.stride(0),
        HK=hk, HEAD_DIM=d, PAGE_SIZE=page_size, BLOCK_N=block_n, num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    return out.sum(dim=1)


@jit
def _rows_decode_kernel(
    q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, order_ptr, out_ptr, part_out_ptr, part_lse_ptr, qk_scale,
    num_splits, stride_qb, stride_kb, stride_bt, stride_ob,
    HQ: tl.constexpr, HK: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
):  # fmt: skip
    split = tl.program_id(0)
    seq, seq_len = _taken(order_ptr, lens_ptr)
    start, end = _slice(seq_len, num_splits, split, BLOCK_N)
    g = tl.arange(0, BLOCK_H)  # query heads
    r = tl.arange(0, BLOCK_N * HK)  # (token, KV head) rows of a tile
    d = tl.arange(0, HEAD_DIM)
    q = tl.load(
        q_ptr + seq * stride_qb + g[:, None] * HEAD_DIM + d[None, :], mask=(g < HQ)[:, None], other=0.0
    )
    mine = (g[:, None] // (HQ // HK)) == (r % HK)[None, :]  # (BLOCK_H, rows): a query head's own KV head
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_sum = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, HEAD_DIM], tl.float32)
    bt_row = bt_ptr + seq * stride_bt
    for tile in range(start, end, BLOCK_N):
        k, v, live = _page_rows(k_ptr, v_ptr, bt_row, tile, end, r, d, stride_kb, HK, HEAD_DIM, PAGE_SIZE)
        s = tl.dot(q, tl.trans(k)) * qk_scale  # (BLOCK_H, rows)
        s = tl.where(mine & live[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - safe[:, None])
        alpha = tl.exp2(m - safe)
        l_sum = l_sum * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new
    o = acc / tl.where(l_sum > 0, l_sum, 1.0)[:, None]
    if SPLIT:  # the engine's merge kernel's layout: (B, Hq, num_splits, D) and (B, Hq, num_splits)
        row = (seq * HQ + g) * num_splits + split
        ok = (g < HQ) & (g * 0 + start < seq_len)  # none from an empty slice
        tl.store(part_out_ptr + row[:, None] * HEAD_DIM + d[None, :], o, mask=ok[:, None])
        tl.store(part_lse_ptr + row, m + tl.log2(tl.where(l_sum > 0, l_sum, 1.0)), mask=ok)
    else:
        tl.store(out_ptr + seq * stride_ob + g[:, None] * HEAD_DIM + d[None, :], o.to(out_ptr.dtype.element_ty),
                 mask=(g < HQ)[:, None])  # fmt: skip


def rows_decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    seq_lens: torch.Tensor, scale: float, order: torch.Tensor, block_n: int = 8, num_warps: int = 4,
    num_stages: int = 2, num_splits: int = 1,
) -> torch.Tensor:  # fmt: skip
    """(B, Hq, D): ``paged_attention_decode_ref``, each program a slice of a sequence with all its heads;
    slices merged by the engine's merge kernel."""
    require_triton("rows_decode_attention")
    b, hq, d = q.shape
    _, page_size, hk, _ = k_cache.shape
    if not (k_cache.is_contiguous() and v_cache.is_contiguous() and q.is_contiguous()) or page_size % block_n:
        raise ValueError("contiguous q and pool, pages of whole tiles")
    if block_n * hk < 16:
        raise ValueError(
            f"a tile's {block_n} tokens x {hk} KV heads must make the tensor cores' 16 rows at least"
        )
    out = torch.empty_like(q)
    split = num_splits > 1
    part_out = torch.empty((b, hq, num_splits, d), dtype=torch.float32, device=q.device) if split else out
    part_lse = torch.empty((b, hq, num_splits), dtype=torch.float32, device=q.device) if split else out
    _rows_decode_kernel[(num_splits, b)](
        q, k_cache, v_cache, block_tables, seq_lens, order, out, part_out, part_lse, scale * LOG2E, num_splits,
        q.stride(0), k_cache.stride(0), block_tables.stride(0), out.stride(0),
        HQ=hq, HK=hk, HEAD_DIM=d, PAGE_SIZE=page_size, BLOCK_H=max(16, 1 << (hq - 1).bit_length()),
        BLOCK_N=block_n, SPLIT=split, num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    if split:
        _decode_reduce_kernel[(b, hq)](
            part_out, part_lse, out, seq_lens, num_splits, 0, block_n, out.stride(0), out.stride(1),
            HEAD_DIM=d, BLOCK_S=1 << (num_splits - 1).bit_length(), BLOCK_D=d, num_warps=4,
        )  # fmt: skip
    return out
