"""flash-attn backend: flash-attn 4 (``flash_attn.cute``) or flash-attn 2 (``flash_attn``), whichever imports.

Both read the paged cache directly (flash-attn 4: ``page_table``; flash-attn 2: ``block_table``), prefill
and decode alike, causal with the mask aligned to the end of each sequence's context. K/V are stored by
our own store kernel (or the fused prologue) first. Not used unless asked for: ``attention_backend='flash_attn'``.
"""

from __future__ import annotations

import torch

from llmbench.layers.attention.backends import CacheAttentionBackend
from llmbench.layers.attention.metadata import AttentionMetadata


def _import_flash():
    try:
        from flash_attn.cute import flash_attn_varlen_func

        return "fa4", flash_attn_varlen_func
    except ImportError:
        pass
    from flash_attn import flash_attn_varlen_func

    return "fa2", flash_attn_varlen_func


class FlashAttnBackend(CacheAttentionBackend):
    name = "flash_attn"
    graph_safe = True

    def __init__(self) -> None:
        self.version, self._fn = _import_flash()

    def attend(
        self, q, k_cache, v_cache, meta: AttentionMetadata, scale, k_scale=None, v_scale=None, out=None
    ):
        if k_scale is not None or v_scale is not None:  # EngineConfig refuses this pairing first
            raise ValueError("the flash_attn backend cannot read a float8 KV cache")
        if self.version == "fa4":
            res = self._fn(
                q,
                k_cache,
                v_cache,
                cu_seqlens_q=meta.query_start_loc,
                seqused_k=meta.seq_lens,
                max_seqlen_q=meta.max_query_len,
                page_table=meta.block_tables,
                softmax_scale=scale,
                causal=True,
            )
        else:
            cu_k = torch.zeros_like(meta.query_start_loc)
            torch.cumsum(meta.seq_lens, 0, out=cu_k[1:])
            res = self._fn(
                q,
                k_cache,
                v_cache,
                cu_seqlens_q=meta.query_start_loc,
                cu_seqlens_k=cu_k,
                max_seqlen_q=meta.max_query_len,
                max_seqlen_k=meta.max_seq_len,
                softmax_scale=scale,
                causal=True,
                block_table=meta.block_tables,
            )
        o = res[0] if isinstance(res, tuple) else res
        return o if out is None else out.copy_(o)
