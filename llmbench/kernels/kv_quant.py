"""Float8 K/V: how values are quantised on store, dequantised on load, and how their scales are set.

A float8 cache element holds ``fp8(clamp(x / scale, -max, max))`` (round to nearest, ties to even), with one
float32 scale per KV head for K and one for V, per layer: ``(Hk,)`` tensors. Reading multiplies by the
scale. Kernels read the scales from memory, never as Python numbers, so CUDA Graphs captured before the
scales were set read the values set later.

``kv_scales_from`` sets scales from data: per KV head, the largest ``|x|`` seen times ``HEADROOM`` maps to
the format's largest finite value. Later tokens may be larger than the ones calibrated on; a value past
the largest is clipped, an error without bound, while a smaller scale costs almost nothing: a float
format's relative precision is the same everywhere in its normal range, and only values below
``HEADROOM * smallest normal / max`` of the calibrated maximum (1/7168 of it for e4m3) fall into the
coarser subnormals.

``round_to_fp8`` (Triton) rounds float32 to the float8 grid in float32 arithmetic, so the conversion that
follows is exact. Triton's CPU interpreter converts float32 to float8 without carrying a rounded-up
mantissa into the exponent (7.8 becomes 4.0); on the GPU the native conversion of an exact value changes
nothing. The kernels and the torch references therefore store the same bytes on both.
"""

from __future__ import annotations

import torch

from llmbench.kernels._triton import jit, tl

FP8_DTYPES = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
HEADROOM = 4.0  # calibrated maximum -> max / HEADROOM: room for later, larger K/V (see above)


def kv_dtype(name: str, model_dtype: torch.dtype) -> torch.dtype:
    """The cache's element type for a resolved ``kv_cache_dtype``: a float8 format, or the model's dtype
    (its name, or "auto")."""
    if name == "auto" or getattr(torch, name, None) is model_dtype:
        return model_dtype
    if name not in FP8_DTYPES:
        raise ValueError(
            f"Unsupported kv_cache_dtype: {name!r}. Supported: {['auto', str(model_dtype).split('.')[-1], *FP8_DTYPES]}"
        )
    return FP8_DTYPES[name]


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype in FP8_DTYPES.values()


def check_scales(
    name: str, cache: torch.Tensor, k_scale: torch.Tensor | None, v_scale: torch.Tensor | None
) -> bool:
    """Whether the cache is quantised; a float8 cache without scales (or scales for a plain cache) is an error."""
    quantised = is_fp8(cache.dtype)
    if quantised != (k_scale is not None and v_scale is not None):
        raise ValueError(
            f"{name}: a {cache.dtype} cache "
            + ("needs k_scale and v_scale" if quantised else "takes no scales (only float8 caches do)")
        )
    return quantised


def fp8_constants(dtype: torch.dtype) -> dict[str, float | int]:
    """The constexprs of ``quantize_fp8`` for a float8 dtype (placeholders for any other)."""
    if not is_fp8(dtype):
        return {"FP8_MAX": 1.0, "FP8_MANTISSA": 0, "FP8_MIN_NORMAL": 1.0}
    info = torch.finfo(dtype)
    mantissa = {torch.float8_e4m3fn: 3, torch.float8_e5m2: 2}[dtype]
    return {
        "FP8_MAX": float(info.max),
        "FP8_MANTISSA": mantissa,
        "FP8_MIN_NORMAL": float(info.smallest_normal),
    }


def quantize_ref(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # x: (T, Hk, D) in any float dtype; scale: (Hk,) float32 -> (T, Hk, D) in the float8 ``dtype``
    limit = torch.finfo(dtype).max
    return (x.float() / scale[:, None]).clamp(-limit, limit).to(dtype)


def dequantize_ref(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # x: (..., Hk, D) float8; scale: (Hk,) float32 -> (..., Hk, D) in ``dtype``
    return (x.float() * scale[:, None]).to(dtype)


def kv_scales_from(
    k: torch.Tensor, v: torch.Tensor, dtype: torch.dtype, headroom: float = HEADROOM
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-head scales for K and V from a step's new rows (see the module docstring): (Hk,) float32 each."""
    # k, v: (T, Hk, D); T > 0
    limit = torch.finfo(dtype).max

    def scale(x: torch.Tensor) -> torch.Tensor:
        amax = x.float().abs().amax(dim=(0, 2))  # (Hk,)
        # A head that is zero everywhere keeps scale 1: any scale stores its zeros exactly.
        return torch.where(amax > 0, amax * headroom / limit, torch.ones_like(amax))

    return scale(k), scale(v)


@jit
def round_to_fp8(x, FP8_MANTISSA: tl.constexpr, FP8_MIN_NORMAL: tl.constexpr):
    """Float32 ``x`` (within the format's range) rounded to the float8 grid, ties to even, in float32."""
    # The grid's spacing near x is 2^floor(log2|x|) * 2^-mantissa (subnormals: that of the smallest normal).
    # Adding c = 1.5 * 2^23 * spacing puts the sum in a binade whose float32 spacing is exactly that, so the
    # float32 add rounds x to the grid; subtracting c again is exact.
    power = (x.to(tl.int32, bitcast=True) & 0x7F800000).to(tl.float32, bitcast=True)  # 2^floor(log2|x|)
    power = tl.maximum(power, FP8_MIN_NORMAL)
    c = power * (1.5 * (1 << (23 - FP8_MANTISSA)))
    r = (x + c) - c
    return tl.where(r == 0.0, x * 0.0, r)  # a negative value rounded to zero keeps its sign: -0.0


@jit
def quantize_fp8(x, scale, FP8_MAX: tl.constexpr, FP8_MANTISSA: tl.constexpr, FP8_MIN_NORMAL: tl.constexpr):
    """``quantize_ref`` for one tile: float32 values (on the float8 grid) ready for an exact conversion."""
    # IEEE division as torch's: Triton's `/` on float32 is the approximate one on NVIDIA GPUs, and a last-bit
    # difference moves a value across a rounding boundary of the float8 grid now and then
    y = tl.minimum(tl.maximum(tl.math.div_rn(x.to(tl.float32), scale), -FP8_MAX), FP8_MAX)
    return round_to_fp8(y, FP8_MANTISSA, FP8_MIN_NORMAL)
