"""What happens between the q/k/v projection and attention, in one pass: split the fused projection into
heads, RMSNorm q and k per head (Qwen3), rotate them (RoPE), write k and v into their cache slots.

Unfused this is up to six kernels a layer (two copies of strided q/k views, two norms, RoPE, the KV
store); at batch 1 each is a few microseconds of launch and tail for almost no work, which is what
bounds small-batch decode. ``attention_prologue_ref`` composes the torch references of those steps;
``attention_prologue`` is the Triton version with the same signature and the same roundings (the
normalised value is rounded to the model dtype before the weight multiply, and again before the
rotation, exactly as the unfused kernels round between steps).

Both return q as (T, Hq, D); K/V are written in place (slot -1, a padded row, writes nothing), so they
suit the attention backends that read K/V from the cache only (Triton, flash-attn). A float8 cache takes
per-head scales ``k_scale``, ``v_scale`` ``(Hk,)``; k is rounded to the model dtype (as the unfused RoPE
returns it) before it is quantised, so both versions store the same bytes (``kv_quant.py``).
"""

from __future__ import annotations

import torch

from llmbench.kernels._triton import jit, next_power_of_2, programmatic, require_triton, tl, wait_for_inputs
from llmbench.kernels.kv_layout import by_token
from llmbench.kernels.kv_quant import check_scales, fp8_constants, quantize_fp8
from llmbench.kernels.kv_store import store_kv_ref
from llmbench.kernels.rmsnorm import rms_norm_ref
from llmbench.kernels.rotary import apply_rotary_ref


def attention_prologue_ref(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    q_norm_weight: torch.Tensor | None,
    k_norm_weight: torch.Tensor | None,
    eps: float,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    # qkv: (T, (Hq + 2 Hk) D); caches (num_blocks, block_size, Hk, D); returns q (T, Hq, D)
    q, k, v = qkv_heads_ref(
        qkv, positions, cos_sin_cache, q_norm_weight, k_norm_weight, eps, num_heads, num_kv_heads
    )
    store_kv_ref(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    return q


def qkv_heads_ref(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    q_norm_weight: torch.Tensor | None,
    k_norm_weight: torch.Tensor | None,
    eps: float,
    num_heads: int,
    num_kv_heads: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The prologue without the store: q (T, Hq, D), k and v (T, Hk, D), normalised and rotated."""
    T = qkv.shape[0]
    D = cos_sin_cache.shape[-1]
    q, k, v = qkv.split([num_heads * D, num_kv_heads * D, num_kv_heads * D], dim=-1)
    q = q.reshape(T, num_heads, D)
    k = k.reshape(T, num_kv_heads, D)
    v = v.reshape(T, num_kv_heads, D)
    if q_norm_weight is not None and k_norm_weight is not None:
        q = rms_norm_ref(q.reshape(-1, D), q_norm_weight, eps)[0].view(T, num_heads, D)
        k = rms_norm_ref(k.reshape(-1, D), k_norm_weight, eps)[0].view(T, num_kv_heads, D)
    q, k = apply_rotary_ref(q, k, positions, cos_sin_cache)
    return q, k, v


@jit
def _norm_rotate(
    x_ptr, w_ptr, H, HALF, eps, cos, sin,
    HAS_NORM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
):  # fmt: skip
    # Heads of one token at x_ptr + h * 2 HALF: their two halves, normalised and rotated, in float32.
    h = tl.arange(0, BLOCK_H)[:, None]
    j = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (h < H) & (j < HALF)
    offs = h * (2 * HALF) + j
    dtype = x_ptr.dtype.element_ty
    x1 = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + offs + HALF, mask=mask, other=0.0).to(tl.float32)
    if HAS_NORM:
        inv_rms = tl.rsqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * HALF) + eps)[:, None]
        w1 = tl.load(w_ptr + j, mask=j < HALF, other=0.0).to(tl.float32)
        w2 = tl.load(w_ptr + HALF + j, mask=j < HALF, other=0.0).to(tl.float32)
        # Round where the unfused kernels round: after normalising, and after the weight (their output).
        x1 = ((x1 * inv_rms).to(dtype).to(tl.float32) * w1).to(dtype).to(tl.float32)
        x2 = ((x2 * inv_rms).to(dtype).to(tl.float32) * w2).to(dtype).to(tl.float32)
    return x1 * cos - x2 * sin, x2 * cos + x1 * sin, offs, mask


@jit
def _prologue_kernel(
    qkv_ptr, pos_ptr, cs_ptr, qw_ptr, kw_ptr, q_ptr, kc_ptr, vc_ptr, slot_ptr, ks_ptr, vs_ptr,
    stride_t, stride_cs, stride_qt, stride_kcb, stride_kcs, stride_vcb, stride_vcs, stride_vch, stride_vcd,
    HQ, HK, HALF, BLOCK_SIZE, eps,
    HAS_NORM: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_HALF: tl.constexpr,
    QUANT: tl.constexpr, FP8_MAX: tl.constexpr, FP8_MANTISSA: tl.constexpr, FP8_MIN_NORMAL: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    wait_for_inputs(PDL)
    # One program per token: its cos/sin row once, then all q heads, all k heads and all v heads.
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    j = tl.arange(0, BLOCK_HALF)[None, :]
    cos = tl.load(cs_ptr + pos * stride_cs + j, mask=j < HALF, other=0.0).to(tl.float32)
    sin = tl.load(cs_ptr + pos * stride_cs + HALF + j, mask=j < HALF, other=0.0).to(tl.float32)
    D = 2 * HALF
    row = qkv_ptr + t * stride_t
    dtype = q_ptr.dtype.element_ty

    o1, o2, offs, mask = _norm_rotate(row, qw_ptr, HQ, HALF, eps, cos, sin, HAS_NORM, BLOCK_HQ, BLOCK_HALF)
    tl.store(q_ptr + t * stride_qt + offs, o1.to(dtype), mask=mask)
    tl.store(q_ptr + t * stride_qt + offs + HALF, o2.to(dtype), mask=mask)

    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot >= 0:  # slot -1 (a padded token) writes nothing
        kc = kc_ptr + (slot // BLOCK_SIZE) * stride_kcb + (slot % BLOCK_SIZE) * stride_kcs
        vc = vc_ptr + (slot // BLOCK_SIZE) * stride_vcb + (slot % BLOCK_SIZE) * stride_vcs
        k_row = row + HQ * D
        # New names: Triton refuses a variable that an `if` block redefines with another shape (the
        # interpreter does not check this; devtools/compile_kernels.py does).
        k1, k2, k_offs, k_mask = _norm_rotate(
            k_row, kw_ptr, HK, HALF, eps, cos, sin, HAS_NORM, BLOCK_HK, BLOCK_HALF
        )
        v_row = k_row + HK * D
        v1 = tl.load(v_row + k_offs, mask=k_mask)
        v2 = tl.load(v_row + k_offs + HALF, mask=k_mask)
        # V's place in its page: (heads, dims) strides of either layout (kv_layout.py)
        v_offs = tl.arange(0, BLOCK_HK)[:, None] * stride_vch + tl.arange(0, BLOCK_HALF)[None, :] * stride_vcd
        v_half = HALF * stride_vcd
        if QUANT:  # k in the model dtype first, like the unfused RoPE's output; (BLOCK_HK, 1) scales
            kh = tl.arange(0, BLOCK_HK)[:, None]
            k_scale = tl.load(ks_ptr + kh, mask=kh < HK, other=1.0)
            v_scale = tl.load(vs_ptr + kh, mask=kh < HK, other=1.0)
            cache_dtype = kc_ptr.dtype.element_ty
            k1q = quantize_fp8(k1.to(dtype), k_scale, FP8_MAX, FP8_MANTISSA, FP8_MIN_NORMAL).to(cache_dtype)
            k2q = quantize_fp8(k2.to(dtype), k_scale, FP8_MAX, FP8_MANTISSA, FP8_MIN_NORMAL).to(cache_dtype)
            tl.store(kc + k_offs, k1q, mask=k_mask)
            tl.store(kc + k_offs + HALF, k2q, mask=k_mask)
            v1q = quantize_fp8(v1, v_scale, FP8_MAX, FP8_MANTISSA, FP8_MIN_NORMAL).to(cache_dtype)
            v2q = quantize_fp8(v2, v_scale, FP8_MAX, FP8_MANTISSA, FP8_MIN_NORMAL).to(cache_dtype)
            tl.store(vc + v_offs, v1q, mask=k_mask)
            tl.store(vc + v_offs + v_half, v2q, mask=k_mask)
        else:
            tl.store(kc + k_offs, k1.to(dtype), mask=k_mask)
            tl.store(kc + k_offs + HALF, k2.to(dtype), mask=k_mask)
            tl.store(vc + v_offs, v1, mask=k_mask)
            tl.store(vc + v_offs + v_half, v2, mask=k_mask)


def attention_prologue(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    q_norm_weight: torch.Tensor | None,
    k_norm_weight: torch.Tensor | None,
    eps: float,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Triton version of ``attention_prologue_ref``: one program per token, one kernel per layer; q into
    ``out`` (T, Hq, D) where given."""
    require_triton("attention_prologue")
    quant = check_scales("attention_prologue", k_cache, k_scale, v_scale)
    T = qkv.shape[0]
    D = k_cache.shape[-1]
    width = (num_heads + 2 * num_kv_heads) * D
    if qkv.shape != (T, width) or qkv.stride(-1) != 1:
        raise ValueError(f"qkv must be (T, {width}) and contiguous in its last dim; got {tuple(qkv.shape)}")
    if (
        D % 2
        or v_cache.shape != k_cache.shape
        or k_cache.shape[2] != num_kv_heads
        or cos_sin_cache.shape[-1] != D
    ):
        raise ValueError(
            f"expected caches (num_blocks, block_size, {num_kv_heads}, D) with D even and cos_sin_cache (P, D); "
            f"got {tuple(k_cache.shape)}, {tuple(v_cache.shape)}, {tuple(cos_sin_cache.shape)}"
        )
    if k_cache.stride(2) != D or k_cache.stride(3) != 1:
        raise ValueError("the K cache must be contiguous in (kv_heads, head_dim)")
    if v_cache.stride() != k_cache.stride() and not by_token(v_cache):
        raise ValueError("the V cache must be laid out as the K cache or by token (kv_layout.py)")
    has_norm = q_norm_weight is not None and k_norm_weight is not None
    shape = (T, num_heads, D)
    if out is None:
        q = torch.empty(shape, dtype=qkv.dtype, device=qkv.device)
    elif out.shape != shape or out.dtype != qkv.dtype or not out.is_contiguous():
        raise ValueError(
            f"out must be a contiguous {shape} tensor of {qkv.dtype}; got {tuple(out.shape)} {out.dtype}"
        )
    else:
        q = out
    if T > 0:
        qw = q_norm_weight.contiguous() if has_norm else qkv  # placeholders when HAS_NORM is False
        kw = k_norm_weight.contiguous() if has_norm else qkv
        _prologue_kernel[(T,)](
            qkv, positions, cos_sin_cache.contiguous(), qw, kw, q, k_cache, v_cache, slot_mapping,
            k_scale if quant else qkv, v_scale if quant else qkv,  # placeholders when QUANT is False
            qkv.stride(0), cos_sin_cache.stride(0), q.stride(0),
            k_cache.stride(0), k_cache.stride(1), *v_cache.stride(),
            num_heads, num_kv_heads, D // 2, k_cache.shape[1], eps,
            HAS_NORM=has_norm, BLOCK_HQ=next_power_of_2(num_heads), BLOCK_HK=next_power_of_2(num_kv_heads),
            BLOCK_HALF=next_power_of_2(D // 2), num_warps=4,
            QUANT=quant, **fp8_constants(k_cache.dtype),
            **programmatic(qkv, T),
        )  # fmt: skip
    return q
