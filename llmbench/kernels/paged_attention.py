"""Attention over a paged KV cache: references for decode and for (chunked) prefill.

Layouts are those of ``layers/attention/metadata.py``: caches ``(num_blocks, block_size, Hk, D)``,
block tables ``(B, max_blocks) int32``, ``seq_lens (B,) int32`` counting this step's tokens, whose K/V
are already in the cache. Query heads are grouped over KV heads (``Hq % Hk == 0``). A float8 cache comes
with per-head scales ``k_scale``, ``v_scale`` ``(Hk,)`` and is dequantised as it is gathered
(``kv_quant.py``).

The Triton versions, same signatures, live in ``triton_decode.py`` and ``triton_prefill.py`` and are
re-exported here: ``paged_attention_decode`` and ``paged_attention_prefill``.
"""

from __future__ import annotations

import torch

from llmbench.kernels.kv_quant import check_scales, dequantize_ref
from llmbench.kernels.triton_decode import paged_attention_decode
from llmbench.kernels.triton_prefill import paged_attention_prefill

__all__ = [
    "paged_attention_decode",
    "paged_attention_decode_ref",
    "paged_attention_prefill",
    "paged_attention_prefill_ref",
]


def gather_context(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_len: int,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's K/V, (S, Hk, D) each: as stored, or dequantised to ``dtype`` from a float8 cache."""
    block_size = k_cache.shape[1]
    n_blocks = (seq_len + block_size - 1) // block_size
    blocks = block_table[:n_blocks].long()
    k = k_cache[blocks].flatten(0, 1)[:seq_len]  # (S, Hk, D)
    v = v_cache[blocks].flatten(0, 1)[:seq_len]
    if check_scales("gather_context", k_cache, k_scale, v_scale):
        return dequantize_ref(k, k_scale, dtype), dequantize_ref(v, v_scale, dtype)
    return k, v


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal_offset: int
) -> torch.Tensor:
    # q: (L, Hq, D); k, v: (S, Hk, D); query row i sits at key position causal_offset + i.
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("lhd,shd->hls", q.float(), k.float()) * scale  # (Hq, L, S)
    L, S = q.shape[0], k.shape[0]
    q_pos = torch.arange(L, device=q.device)[:, None] + causal_offset
    k_pos = torch.arange(S, device=q.device)[None, :]
    scores = scores.masked_fill(k_pos > q_pos, float("-inf"))
    probs = scores.softmax(dim=-1)
    return torch.einsum("hls,shd->lhd", probs, v.float()).to(q.dtype)


def paged_attention_decode_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    # q: (B, Hq, D), one new token per sequence -> (B, Hq, D)
    out = torch.empty_like(q)
    for i, seq_len in enumerate(seq_lens.tolist()):
        k, v = gather_context(k_cache, v_cache, block_tables[i], seq_len, k_scale, v_scale)
        out[i : i + 1] = _attend(q[i : i + 1], k, v, scale, seq_len - 1)
    return out


def paged_attention_prefill_ref(
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
    # q: (T, Hq, D), sequences of any query length (decodes included) -> (T, Hq, D)
    out = torch.empty_like(q)
    starts = query_start_loc.tolist()
    for i, seq_len in enumerate(seq_lens.tolist()):
        a, b = starts[i], starts[i + 1]
        k, v = gather_context(k_cache, v_cache, block_tables[i], seq_len, k_scale, v_scale)
        out[a:b] = _attend(q[a:b], k, v, scale, seq_len - (b - a))
    return out
