"""Write a step's new K/V rows into their cache slots; slot -1 (padding) is skipped."""

from __future__ import annotations

import torch


def store_kv_ref(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    # k, v: (T, Hk, D); caches: (num_blocks, block_size, Hk, D); slot_mapping: (T,) int64
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    k_cache.view(-1, *k_cache.shape[2:])[slots] = k[keep]
    v_cache.view(-1, *v_cache.shape[2:])[slots] = v[keep]
