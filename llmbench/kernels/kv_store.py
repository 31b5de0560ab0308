"""Write a step's new K/V rows into their cache slots; slot -1 (padding) is skipped.

``store_kv_ref`` is plain torch; ``store_kv`` the Triton version with the same signature. Both write
the caches in place and touch nothing but the slots named in ``slot_mapping``. Cache layout:
``(num_blocks, block_size, Hk, D)``, slot = block_id * block_size + offset (``layers/attention/metadata.py``);
V may be laid out by token in memory (``kv_layout.py``).
A float8 cache takes per-head scales ``k_scale``, ``v_scale`` ``(Hk,)`` and stores ``x / scale`` quantised
(``kv_quant.py``); both versions store the same bytes.
"""

from __future__ import annotations

import torch

from llmbench.kernels._triton import jit, next_power_of_2, programmatic, require_triton, tl, wait_for_inputs
from llmbench.kernels.kv_layout import by_token
from llmbench.kernels.kv_quant import check_scales, fp8_constants, quantize_fp8, quantize_ref


def store_kv_ref(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    # k, v: (T, Hk, D); caches: (num_blocks, block_size, Hk, D); slot_mapping: (T,) int64; scales: (Hk,)
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    k, v = k[keep], v[keep]
    if check_scales("store_kv_ref", k_cache, k_scale, v_scale):
        k = quantize_ref(k, k_scale, k_cache.dtype)
        v = quantize_ref(v, v_scale, v_cache.dtype)
    block_size = k_cache.shape[1]
    k_cache[slots // block_size, slots % block_size] = k
    v_cache[slots // block_size, slots % block_size] = v


@jit
def _store_kv_kernel(
    k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr, ks_ptr, vs_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch, stride_vcd,
    H, D, BLOCK_SIZE,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, QUANT: tl.constexpr,
    FP8_MAX: tl.constexpr, FP8_MANTISSA: tl.constexpr, FP8_MIN_NORMAL: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    wait_for_inputs(PDL)
    # One program per token: all of its heads, K and V.
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    mask = (h < H) & (d < D)  # (BLOCK_H, BLOCK_D)
    if slot >= 0:  # slot -1 (a padded token) writes nothing
        k = tl.load(k_ptr + t * stride_kt + h * stride_kh + d, mask=mask)
        v = tl.load(v_ptr + t * stride_vt + h * stride_vh + d, mask=mask)
        if QUANT:  # (BLOCK_H, 1) scales; float32 values on the float8 grid, converted exactly below
            k_scale = tl.load(ks_ptr + h, mask=h < H, other=1.0)
            v_scale = tl.load(vs_ptr + h, mask=h < H, other=1.0)
            k = quantize_fp8(k, k_scale, FP8_MAX, FP8_MANTISSA, FP8_MIN_NORMAL)
            v = quantize_fp8(v, v_scale, FP8_MAX, FP8_MANTISSA, FP8_MIN_NORMAL)
        k = k.to(kc_ptr.dtype.element_ty)
        v = v.to(vc_ptr.dtype.element_ty)
        tl.store(kc_ptr + block * stride_kcb + offset * stride_kcs + h * stride_kch + d, k, mask=mask)
        tl.store(
            vc_ptr + block * stride_vcb + offset * stride_vcs + h * stride_vch + d * stride_vcd, v, mask=mask
        )


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    require_triton("store_kv")
    quant = check_scales("store_kv", k_cache, k_scale, v_scale)
    # k, v: (T, Hk, D); caches: (num_blocks, block_size, Hk, D); slot_mapping: (T,) int32 or int64
    T, H, D = k.shape
    if v.shape != k.shape or k_cache.shape[2:] != (H, D) or v_cache.shape != k_cache.shape:
        raise ValueError(
            f"expected k, v (T, Hk, D) and caches (num_blocks, block_size, Hk, D); got "
            f"{tuple(k.shape)}, {tuple(v.shape)}, {tuple(k_cache.shape)}, {tuple(v_cache.shape)}"
        )
    if k_cache.stride(-1) != 1 or (v_cache.stride(-1) != 1 and not by_token(v_cache)):
        raise ValueError("caches must be contiguous in head_dim (V may instead be laid out by token)")
    k = k if k.stride(-1) == 1 else k.contiguous()
    v = v if v.stride(-1) == 1 else v.contiguous()
    if T > 0:
        _store_kv_kernel[(T,)](
            k, v, k_cache, v_cache, slot_mapping,
            k_scale if quant else k, v_scale if quant else v,  # placeholders when QUANT is False
            k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            *v_cache.stride(), H, D, k_cache.shape[1],
            BLOCK_H=next_power_of_2(H), BLOCK_D=next_power_of_2(D), QUANT=quant,
            **fp8_constants(k_cache.dtype), num_warps=4,
            **programmatic(k, T),
        )  # fmt: skip
