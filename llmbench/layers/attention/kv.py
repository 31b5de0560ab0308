"""One layer's share of the KV pool, as its attention layer receives it, and setting float8 scales.

``k``, ``v``: ``(num_blocks, block_size, Hk, D)`` views of the pool (``layers/attention/metadata.py``
describes slots and block tables); a float8 pool's ``v`` is laid out by token in memory
(``kernels/kv_layout.py``), so code that writes or reads it indexes it, never ``view``s it flat. A float8 pool (``EngineConfig.kv_cache_dtype``) comes with per-head
scales ``k_scale``, ``v_scale`` ``(Hk,)`` float32: views of one small tensor of the engine's, written in
place (kernels read them from memory, so CUDA Graphs see the values set after their capture). A pool in
the model dtype has None for both.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from llmbench.kernels.kv_quant import kv_scales_from


class LayerKV(NamedTuple):
    k: torch.Tensor  # (num_blocks, block_size, Hk, D)
    v: torch.Tensor
    k_scale: torch.Tensor | None = None  # (Hk,) float32: stored value = value / scale
    v_scale: torch.Tensor | None = None

    @property
    def quantised(self) -> bool:
        return self.k_scale is not None


def calibrate(kv: LayerKV, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Set the layer's float8 scales from this step's new K/V rows (padded rows, slot -1, left out)."""
    # k, v: (T, Hk, D); slot_mapping: (T,)
    if kv.k_scale is None or kv.v_scale is None:
        raise ValueError("calibrate: this layer's KV cache is not float8: it has no scales to set")
    keep = slot_mapping >= 0
    if not bool(keep.any()):
        return
    k_scale, v_scale = kv_scales_from(k[keep], v[keep], kv.k.dtype)
    kv.k_scale.copy_(k_scale)
    kv.v_scale.copy_(v_scale)
