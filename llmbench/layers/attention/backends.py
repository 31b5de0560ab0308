"""Attention backends: store this step's K/V in the paged cache, then attend over it.

Every backend has the signature of ``AttentionBackend.forward`` and reads K/V only through block tables,
so the engine's KV layout (paged blocks, or one contiguous slab per sequence) is invisible here.
``graph_safe`` backends do no host synchronisation, so their decode step can be captured in a CUDA Graph.
Backends that read K/V from the cache alone (``attends_from_cache``: Triton, flash-attn) also offer
``forward_qkv``: the fused projection output in, with the q/k norm, RoPE and KV store done by one
kernel (``kernels/attention_prologue.py``) before ``attend``.

A float8 cache (``LayerKV.quantised``) is quantised by the store and read back dequantised: by the
Triton kernels on load, by the torch and sdpa backends as they gather the context (sdpa then reads a
fresh prompt's K/V back from the cache too, not from the projection). On the step that calibrates (``meta.kv_calibrate``) a backend sets the layer's scales from the
step's K/V before storing them; the fused prologue's backends take the unfused path for that one step.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from llmbench.kernels import kv_store, paged_attention
from llmbench.kernels.attention_prologue import attention_prologue, qkv_heads_ref
from llmbench.kernels.kv_quant import dequantize_ref
from llmbench.kernels.triton_decode import decode_attention
from llmbench.kernels.triton_prefill import prefill_attention
from llmbench.layers.attention.kv import LayerKV, calibrate
from llmbench.layers.attention.metadata import AttentionMetadata


class AttentionBackend:
    name = "torch"
    graph_safe = False
    attends_from_cache = False  # True: K/V are read from the cache only, so forward_qkv applies

    def forward(
        self,
        q: torch.Tensor,  # (T, Hq, D)
        k: torch.Tensor,  # (T, Hk, D)
        v: torch.Tensor,  # (T, Hk, D)
        kv: LayerKV,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:  # (T, Hq, D)
        store(k, v, kv, meta, kv_store.store_kv_ref)
        return paged_attention.paged_attention_prefill_ref(
            q,
            kv.k,
            kv.v,
            meta.block_tables,
            meta.query_start_loc,
            meta.seq_lens,
            meta.max_query_len,
            scale,
            kv.k_scale,
            kv.v_scale,
        )


def store(
    k: torch.Tensor, v: torch.Tensor, kv: LayerKV, meta: AttentionMetadata, store_kv: Callable[..., None]
) -> None:
    """Write the step's K/V with ``store_kv`` (a kernel or its reference), setting the scales first on
    the step that calibrates them."""
    if meta.kv_calibrate:
        calibrate(kv, k, v, meta.slot_mapping)
    store_kv(k, v, kv.k, kv.v, meta.slot_mapping, kv.k_scale, kv.v_scale)


class SDPABackend(AttentionBackend):
    """torch's scaled_dot_product_attention: one padded batched call for decode, one call per prefill."""

    name = "sdpa"

    def forward(self, q, k, v, kv, meta, scale):  # type: ignore[override]
        store(k, v, kv, meta, kv_store.store_kv_ref)
        if meta.is_decode_only:
            return self._decode(q, kv, meta, scale)
        out = torch.empty_like(q)
        start = 0
        for i, (q_len, seq_len) in enumerate(zip(meta.query_lens_cpu, meta.seq_lens_cpu, strict=True)):
            end = start + q_len
            # Nothing cached before: attend over this step's own K/V, unless the cache holds them
            # quantised (then they are read back like every other token's, as the Triton kernels do).
            if q_len == seq_len and not kv.quantised:
                kk, vv = k[start:end], v[start:end]
            else:
                kk, vv = paged_attention.gather_context(
                    kv.k, kv.v, meta.block_tables[i], seq_len, kv.k_scale, kv.v_scale, q.dtype
                )
            out[start:end] = _sdpa(q[start:end], kk, vv, scale, seq_len - q_len)
            start = end
        return out

    @staticmethod
    def _decode(q, kv: LayerKV, meta, scale):
        block_size = kv.k.shape[1]
        n_blocks = -(-meta.max_seq_len // block_size)
        tables = meta.block_tables[:, :n_blocks].long()  # (B, n)
        kk = kv.k[tables].flatten(1, 2)  # (B, S, Hk, D)
        vv = kv.v[tables].flatten(1, 2)
        if kv.quantised:
            kk = dequantize_ref(kk, kv.k_scale, q.dtype)
            vv = dequantize_ref(vv, kv.v_scale, q.dtype)
        S = kk.shape[1]
        mask = torch.arange(S, device=q.device)[None, :] < meta.seq_lens[:, None]  # (B, S)
        # Slots past a sequence's end hold whatever the pool had (uninitialised memory can be NaN, and
        # 0 * NaN poisons the sum): zero them, not just their scores.
        kk = kk.masked_fill(~mask[:, :, None, None], 0.0)
        vv = vv.masked_fill(~mask[:, :, None, None], 0.0)
        group = q.shape[1] // kk.shape[2]
        qb = q.unsqueeze(2)  # (B, Hq, 1, D)
        kb = kk.transpose(1, 2).repeat_interleave(group, dim=1)  # (B, Hq, S, D)
        vb = vv.transpose(1, 2).repeat_interleave(group, dim=1)
        out = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask[:, None, None, :], scale=scale)
        return out.squeeze(2)


def _sdpa(q, k, v, scale, offset):
    # q: (L, Hq, D), k/v: (S, Hk, D); query row i sits at key position offset + i.
    group = q.shape[1] // k.shape[1]
    qh, kh, vh = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
    kh = kh.repeat_interleave(group, dim=0)
    vh = vh.repeat_interleave(group, dim=0)
    if offset == 0:
        out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=scale)
    else:
        L, S = q.shape[0], k.shape[0]
        mask = torch.arange(S, device=q.device)[None, :] <= torch.arange(L, device=q.device)[:, None] + offset
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale)
    return out.transpose(0, 1)


class CacheAttentionBackend(AttentionBackend):
    """A backend whose attention reads the step's own K/V back from the cache, like every other token."""

    attends_from_cache = True

    def attend(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        k_scale: torch.Tensor | None = None,
        v_scale: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attention of q (T, Hq, D) over the cache: (T, Hq, D), written into ``out`` where given."""
        raise NotImplementedError

    def forward(self, q, k, v, kv, meta, scale):  # type: ignore[override]
        store(k, v, kv, meta, kv_store.store_kv)
        return self.attend(q, kv.k, kv.v, meta, scale, kv.k_scale, kv.v_scale)

    def forward_qkv(
        self,
        qkv: torch.Tensor,  # (T, (Hq + 2 Hk) D): the fused projection's output
        positions: torch.Tensor,
        cos_sin_cache: torch.Tensor,
        q_norm_weight: torch.Tensor | None,
        k_norm_weight: torch.Tensor | None,
        eps: float,
        num_heads: int,
        num_kv_heads: int,
        kv: LayerKV,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:  # (T, Hq, D)
        norms = (q_norm_weight, k_norm_weight, eps)
        if meta.kv_calibrate:  # the scales come from k and v, so they must exist apart from the cache
            q, k, v = qkv_heads_ref(qkv, positions, cos_sin_cache, *norms, num_heads, num_kv_heads)
            store(k, v, kv, meta, kv_store.store_kv)
        else:
            q = self.prologue(
                qkv, positions, cos_sin_cache, *norms, num_heads, num_kv_heads, kv, meta.slot_mapping
            )
        return self.attend(q, kv.k, kv.v, meta, scale, kv.k_scale, kv.v_scale)

    @staticmethod
    def prologue(
        qkv: torch.Tensor,
        positions: torch.Tensor,
        cos_sin_cache: torch.Tensor,
        q_norm_weight: torch.Tensor | None,
        k_norm_weight: torch.Tensor | None,
        eps: float,
        num_heads: int,
        num_kv_heads: int,
        kv: LayerKV,
        slot_mapping: torch.Tensor,  # (T,): -1 for a padded row, which stores nothing
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``forward_qkv``'s first half, one kernel: K/V into their slots, q (T, Hq, D) returned (into
        ``out`` where given). Never for the step that sets a float8 cache's scales."""
        return attention_prologue(
            qkv, positions, cos_sin_cache, q_norm_weight, k_norm_weight, eps, kv.k, kv.v, slot_mapping,
            num_heads, num_kv_heads, kv.k_scale, kv.v_scale, out=out,
        )  # fmt: skip


class TritonBackend(CacheAttentionBackend):
    name = "triton"
    graph_safe = True

    def __init__(self, decode_split_tokens: int | None = None, prefill_narrow_up_to: int = 0) -> None:
        self.decode_split_tokens = decode_split_tokens  # see Tuning.decode_split_tokens
        self.prefill_narrow_up_to = prefill_narrow_up_to  # see Tuning.prefill_narrow_tiles_up_to

    def attend(self, q, k_cache, v_cache, meta, scale, k_scale=None, v_scale=None, out=None):
        if meta.is_decode_only:  # split_tokens None: equal slices chosen from the batch shape
            return decode_attention(
                q, k_cache, v_cache, meta.block_tables, meta.seq_lens, scale,
                split_tokens=self.decode_split_tokens, k_scale=k_scale, v_scale=v_scale,
                order=meta.decode_order, uniform=meta.decode_uniform, out=out,
            )  # fmt: skip
        # A mixed step's leading decodes (Tuning.mixed_step_decodes) through the decode kernel: in the
        # prefill kernel each would fill a tile of up to 128 query rows with its few query heads.
        nd = meta.num_decodes
        if nd:
            out = torch.empty_like(q) if out is None else out
            decode_attention(
                q[:nd], k_cache, v_cache, meta.block_tables[:nd], meta.seq_lens[:nd], scale,
                split_tokens=self.decode_split_tokens, k_scale=k_scale, v_scale=v_scale,
                order=meta.decode_order, out=out[:nd],
            )  # fmt: skip
        return prefill_attention(
            q, k_cache, v_cache, meta.block_tables, meta.query_start_loc, meta.seq_lens, meta.max_query_len,
            scale, k_scale=k_scale, v_scale=v_scale, first_seq=nd, out=out,
            narrow_up_to=self.prefill_narrow_up_to,
        )  # fmt: skip


def make_backend(
    name: str, decode_split_tokens: int | None = None, prefill_narrow_up_to: int = 0
) -> AttentionBackend:
    if name == "torch":
        return AttentionBackend()
    if name == "sdpa":
        return SDPABackend()
    if name == "triton":
        return TritonBackend(decode_split_tokens, prefill_narrow_up_to)
    if name == "flash_attn":
        from llmbench.layers.attention.flash import FlashAttnBackend

        return FlashAttnBackend()
    raise ValueError(
        f"Unsupported attention backend: {name!r}. Supported: ['torch', 'sdpa', 'triton', 'flash_attn']"
    )
