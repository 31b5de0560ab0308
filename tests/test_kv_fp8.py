"""Float8 KV cache kernels against their torch references: the store and the attention prologue quantise
to the same bytes; paged decode and prefill dequantise on load like the references do; scales are set from
data with headroom. Under the CPU interpreter when there is no GPU (awkward sizes), compiled on a GPU."""

from __future__ import annotations

import os

import pytest
import torch

from llmbench.kernels.attention_prologue import attention_prologue, attention_prologue_ref
from llmbench.kernels.decode_config import default_decode_config, longest_first
from llmbench.kernels.kv_layout import by_token, v_by_token
from llmbench.kernels.kv_quant import HEADROOM, dequantize_ref, kv_scales_from, quantize_ref
from llmbench.kernels.kv_store import store_kv, store_kv_ref
from llmbench.kernels.paged_attention import (
    paged_attention_decode_ref,
    paged_attention_prefill,
    paged_attention_prefill_ref,
)
from llmbench.kernels.triton_decode import decode_attention

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRET else ("cuda" if torch.cuda.is_available() else None)
FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
needs_triton = pytest.mark.skipif(DEVICE is None, reason="Triton kernels need CUDA or TRITON_INTERPRET=1")
# The model dtypes the kernels run at: float32 on the CPU (fast under the interpreter), bf16 on a GPU.
MODEL_DTYPES = [torch.float32, torch.bfloat16] if DEVICE == "cuda" else [torch.float32]
# A float8 pool holds V by token (kernels/kv_layout.py); the kernels read V laid out as K as well.
V_LAYOUTS = pytest.mark.parametrize("v_as_k", [False, True], ids=["V by token", "V as K"])


def bytes_differ(a: torch.Tensor, b: torch.Tensor) -> int:
    return int((a.view(torch.uint8) != b.view(torch.uint8)).sum())


def random_scales(n: int, device: str | None) -> torch.Tensor:
    return torch.rand(n, device=device) * 0.05 + 0.01  # (Hk,): values x/scale spread over the format's range


# --- quantisation and scales (torch) ------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FP8, ids=["e4m3", "e5m2"])
def test_round_trip_error_is_at_most_half_a_step_and_past_the_range_is_clipped(dtype: torch.dtype) -> None:
    mantissa = {torch.float8_e4m3fn: 3, torch.float8_e5m2: 2}[dtype]
    limit = torch.finfo(dtype).max
    x = torch.randn(64, 3, 40) * 4
    x[0, 0, :4] = torch.tensor([1e6, -1e6, 0.0, -0.0])  # past the range (at scale 0.5) and zeros
    scale = torch.tensor([0.5, 0.02, 3.0])
    back = dequantize_ref(quantize_ref(x, scale, dtype), scale, torch.float32)
    normal = x.abs() / scale[:, None] >= torch.finfo(dtype).smallest_normal
    inside = x.abs() / scale[:, None] <= limit
    rel = ((back - x).abs() / x.abs())[normal & inside]
    print(f"{dtype}: largest relative round-trip error {rel.max():.3g} (bound {2.0 ** -(mantissa + 1):.3g})")
    assert rel.max() <= 2.0 ** -(mantissa + 1)
    assert back[0, 0, 0] == limit * 0.5 and back[0, 0, 1] == -limit * 0.5  # clipped to the largest value
    assert back[0, 0, 2] == 0 and torch.signbit(back[0, 0, 3])


def test_scales_from_data_put_the_largest_value_at_max_over_headroom() -> None:
    dtype = torch.float8_e4m3fn
    k = torch.randn(13, 3, 16)
    v = torch.randn(13, 3, 16) * torch.tensor([1.0, 100.0, 0.0])[:, None]  # head 2 is all zeros
    k_scale, v_scale = kv_scales_from(k, v, dtype)
    assert k_scale.shape == v_scale.shape == (3,) and k_scale.dtype == torch.float32
    limit = torch.finfo(dtype).max
    largest = quantize_ref(k, k_scale, dtype).float().abs().amax(dim=(0, 2))  # (Hk,) per head
    print(f"largest quantised |k| per head: {largest.tolist()} (max {limit} / headroom {HEADROOM})")
    assert torch.allclose(largest, torch.full((3,), limit / HEADROOM), rtol=2**-3)
    assert v_scale[2] == 1.0  # a head of zeros keeps scale 1
    assert torch.allclose(v_scale[1] / v_scale[0], v[:, 1].abs().max() / v[:, 0].abs().max())


def test_a_float8_cache_without_scales_is_an_error() -> None:
    cache = torch.zeros(2, 4, 1, 8, dtype=torch.float8_e4m3fn)
    k = torch.zeros(1, 1, 8)
    with pytest.raises(ValueError, match="needs k_scale and v_scale"):
        store_kv_ref(k, k, cache, cache, torch.zeros(1, dtype=torch.long))
    with pytest.raises(ValueError, match="takes no scales"):
        store_kv_ref(
            k, k, cache.float(), cache.float(), torch.zeros(1, dtype=torch.long), torch.ones(1), torch.ones(1)
        )


# --- the store and the prologue: the same bytes as the references --------------------------------------


@needs_triton
@pytest.mark.parametrize("dtype", FP8, ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("src", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@V_LAYOUTS
def test_fp8_store_writes_the_reference_bytes(dtype: torch.dtype, src: torch.dtype, v_as_k: bool) -> None:
    # odd heads, head_dim padded to 128; on a GPU, enough values that a last-bit difference shows
    num_blocks, block_size, Hk, D, T = (5, 8, 3, 80, 9) if DEVICE == "cpu" else (1200, 8, 3, 80, 8191)
    k_cache = torch.zeros(num_blocks, block_size, Hk, D, device=DEVICE).to(dtype)
    v_cache = k_cache.clone() if v_as_k else v_by_token(k_cache)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    kv = (torch.randn(T, 2, Hk, D, device=DEVICE) * 2).to(src)  # k and v as strided views
    kv[1, 0, 0, :3] = 1e5  # past the range: clipped
    k, v = kv[:, 0], kv[:, 1]
    k_scale, v_scale = random_scales(Hk, DEVICE), random_scales(Hk, DEVICE)
    slots = torch.randperm(num_blocks * block_size, device=DEVICE)[:T]
    slots[[0, T - 1]] = -1
    store_kv(k, v, k_cache, v_cache, slots, k_scale, v_scale)
    store_kv_ref(k, v, k_ref, v_ref, slots, k_scale, v_scale)
    differ = bytes_differ(k_cache, k_ref) + bytes_differ(v_cache, v_ref)
    print(f"store_kv {dtype} from {src}: {differ} bytes differ from the reference")
    assert differ == 0
    assert (k_cache.view(torch.uint8) != 0).sum() > 0.9 * (T - 2) * Hk * D  # the slots were written
    assert (v_cache.view(torch.uint8) != 0).sum() > 0.9 * (T - 2) * Hk * D


@needs_triton
@pytest.mark.parametrize("dtype", FP8, ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("qk_norm", [True, False])
@V_LAYOUTS
def test_fp8_prologue_writes_the_reference_bytes(dtype: torch.dtype, qk_norm: bool, v_as_k: bool) -> None:
    Hq, Hk, D, block_size, T, num_blocks = 6, 2, 80, 8, 7, 6
    model = MODEL_DTYPES[-1]
    kw = dict(device=DEVICE, dtype=model)
    qkv = torch.randn(T, (Hq + 2 * Hk) * D, **kw) * 2
    positions = torch.randint(0, 512, (T,), device=DEVICE)
    cos_sin_cache = torch.randn(512, D, device=DEVICE)
    q_w, k_w = (torch.randn(D, **kw), torch.randn(D, **kw)) if qk_norm else (None, None)
    k_cache = torch.zeros(num_blocks, block_size, Hk, D, device=DEVICE).to(dtype)
    v_cache = k_cache.clone() if v_as_k else v_by_token(k_cache)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    slots = torch.randperm(num_blocks * block_size, device=DEVICE)[:T]
    slots[T // 2] = -1
    scales = random_scales(Hk, DEVICE), random_scales(Hk, DEVICE)
    args = (positions, cos_sin_cache, q_w, k_w, 1e-6)
    q = attention_prologue(qkv, *args, k_cache, v_cache, slots, Hq, Hk, *scales)
    q_ref = attention_prologue_ref(qkv, *args, k_ref, v_ref, slots, Hq, Hk, *scales)
    differ = bytes_differ(k_cache, k_ref) + bytes_differ(v_cache, v_ref)
    print(f"prologue {dtype}: {differ} cache bytes differ; max |q - q_ref| {(q - q_ref).abs().max():.3g}")
    assert differ == 0 and (v_cache.view(torch.uint8) != 0).sum() > 0.9 * (T - 1) * Hk * D
    assert torch.allclose(q.float(), q_ref.float(), atol=2e-2 if model == torch.bfloat16 else 2e-5)


# --- paged attention over a float8 cache --------------------------------------------------------------


def fp8_paged_cache(
    seq_lens: list[int], block_size: int, Hk: int, D: int, dtype: torch.dtype, v_as_k: bool = False
) -> tuple[torch.Tensor, ...]:
    """Random float8 caches (every slot finite), V laid out by token as in the pool (``v_as_k``: as K),
    their scales, shuffled block tables, and the float32 caches they were quantised from."""
    max_blocks = max(-(-n // block_size) for n in seq_lens) + 2
    num_blocks = len(seq_lens) * max_blocks + 3
    real = torch.randn(2, num_blocks, block_size, Hk, D, device=DEVICE) * 3
    k_scale, v_scale = kv_scales_from(real[0].flatten(0, 1), real[1].flatten(0, 1), dtype)
    k_cache = quantize_ref(real[0].flatten(0, 1), k_scale, dtype).view(num_blocks, block_size, Hk, D)
    v_cache = quantize_ref(real[1].flatten(0, 1), v_scale, dtype).view(num_blocks, block_size, Hk, D)
    perm = torch.randperm(num_blocks, device=DEVICE)[: len(seq_lens) * max_blocks]
    tables = perm.view(len(seq_lens), max_blocks).to(torch.int32)
    v_cache = v_cache if v_as_k else v_by_token(v_cache)
    return k_cache, v_cache, k_scale, v_scale, tables, real[0], real[1]


def close(name: str, out: torch.Tensor, ref: torch.Tensor, model: torch.dtype) -> None:
    diff = (out.float() - ref.float()).abs().max().item()
    bound = (2e-5 if model == torch.float32 else 2e-2) * max(1.0, ref.float().abs().max().item())
    print(f"{name}: max |triton - ref| = {diff:.3g} (allowed {bound:.3g})")
    assert torch.isfinite(ref).all() and diff <= bound


# float16 too on the CPU: the interpreter computes no bfloat16, and a 16-bit q takes the fp16 conversion
@needs_triton
@pytest.mark.parametrize("model", MODEL_DTYPES + ([torch.float16] if DEVICE == "cpu" else []), ids=str)
@pytest.mark.parametrize("dtype", FP8, ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("fp8_to", ["q", "fp16"])
@pytest.mark.parametrize("Hq,Hk,D,block_size", [(4, 2, 64, 8), (6, 2, 80, 16), (8, 1, 128, 8)])
@V_LAYOUTS
def test_fp8_decode_matches_reference(
    model: torch.dtype,
    dtype: torch.dtype,
    num_splits: int,
    fp8_to: str,
    Hq: int,
    Hk: int,
    D: int,
    block_size: int,
    v_as_k: bool,
) -> None:
    # The tiles converted to q's dtype or to float16 (q too, when it is 16-bit) before the dots (D=80: a
    # tile wider than the head).
    seq_lens = [1, block_size - 1, block_size + 1, 3 * block_size + 5]
    k_cache, v_cache, k_scale, v_scale, tables, _, _ = fp8_paged_cache(
        seq_lens, block_size, Hk, D, dtype, v_as_k
    )
    q = torch.randn(len(seq_lens), Hq, D, device=DEVICE, dtype=model)
    sl = torch.tensor(seq_lens, device=DEVICE, dtype=torch.int32)
    scales = dict(k_scale=k_scale, v_scale=v_scale)
    config = default_decode_config(D, model, fp8=True, v_tokens=not v_as_k)._replace(fp8_to=fp8_to)
    out = decode_attention(
        q, k_cache, v_cache, tables, sl, D**-0.5, num_splits=num_splits, config=config, **scales
    )
    ref = paged_attention_decode_ref(q, k_cache, v_cache, tables, sl, D**-0.5, **scales)
    close(f"fp8 decode {dtype} splits={num_splits} to {fp8_to} {v_as_k=}", out, ref, model)


@needs_triton
@pytest.mark.parametrize("model", MODEL_DTYPES + ([torch.float16] if DEVICE == "cpu" else []), ids=str)
def test_fp8_decode_wide_batch_tiles_match_reference(model: torch.dtype) -> None:
    # A wide batch's tiles over a float8 cache by token (64 tokens, one warp: four pages a tile at page 16)
    # in the order the engine gives, longest first, on contexts from one token to several tiles.
    D, block_size = 64, 16
    config = default_decode_config(D, torch.bfloat16, fp8=True, v_tokens=True, wide=True)
    assert config != default_decode_config(D, torch.bfloat16, fp8=True, v_tokens=True)
    seq_lens = [1, 5 * block_size + 3, block_size, 2 * config.block_n + 1, config.block_n - 1]
    k_cache, v_cache, k_scale, v_scale, tables, _, _ = fp8_paged_cache(
        seq_lens, block_size, 2, D, FP8[0], v_as_k=False
    )
    q = torch.randn(len(seq_lens), 4, D, device=DEVICE, dtype=model)
    sl = torch.tensor(seq_lens, device=DEVICE, dtype=torch.int32)
    scales = dict(k_scale=k_scale, v_scale=v_scale)
    out = decode_attention(
        q,
        k_cache,
        v_cache,
        tables,
        sl,
        D**-0.5,
        num_splits=1,
        config=config,
        order=longest_first(sl),
        **scales,
    )
    ref = paged_attention_decode_ref(q, k_cache, v_cache, tables, sl, D**-0.5, **scales)
    close(f"fp8 decode, wide-batch tiles, {model}", out, ref, model)


@needs_triton
@pytest.mark.parametrize("model", MODEL_DTYPES + ([torch.float16] if DEVICE == "cpu" else []), ids=str)
def test_fp8_decode_tiles_for_contexts_of_one_length_match_reference(model: torch.dtype) -> None:
    # The default tiles of a batch marked uniform (a float8 cache by token, below a wide batch), in one
    # slice and several, longest first.
    D, block_size = 64, 16
    seq_lens = [150, 160, 140, 155]
    k_cache, v_cache, k_scale, v_scale, tables, _, _ = fp8_paged_cache(
        seq_lens, block_size, 2, D, FP8[0], False
    )
    q = torch.randn(len(seq_lens), 4, D, device=DEVICE, dtype=model)
    sl = torch.tensor(seq_lens, device=DEVICE, dtype=torch.int32)
    scales = dict(k_scale=k_scale, v_scale=v_scale)
    ref = paged_attention_decode_ref(q, k_cache, v_cache, tables, sl, D**-0.5, **scales)
    for num_splits in (None, 1, 3):
        out = decode_attention(
            q, k_cache, v_cache, tables, sl, D**-0.5, num_splits=num_splits, order=longest_first(sl), uniform=True,
            **scales,
        )  # fmt: skip
        close(f"fp8 decode, uniform tiles, {model}, splits={num_splits}", out, ref, model)


@needs_triton
@pytest.mark.parametrize("model", MODEL_DTYPES + ([torch.float16] if DEVICE == "cpu" else []), ids=str)
@pytest.mark.parametrize("num_splits", [1, 3])
@V_LAYOUTS
def test_fp8_decode_in_whole_tiles_then_a_tail_matches_reference(
    model: torch.dtype, num_splits: int, v_as_k: bool
) -> None:
    # Wide tiles of several pages unmasked, the rest in narrow tiles of whole pages and of part of one.
    D, block_size = 64, 8
    config = default_decode_config(D, model, fp8=True, v_tokens=not v_as_k)._replace(block_n=64, tail_n=16)
    seq_lens = [1, 15, 16, 64, 80, 150, 191]
    k_cache, v_cache, k_scale, v_scale, tables, _, _ = fp8_paged_cache(
        seq_lens, block_size, 2, D, FP8[0], v_as_k
    )
    q = torch.randn(len(seq_lens), 4, D, device=DEVICE, dtype=model)
    sl = torch.tensor(seq_lens, device=DEVICE, dtype=torch.int32)
    scales = dict(k_scale=k_scale, v_scale=v_scale)
    out = decode_attention(
        q, k_cache, v_cache, tables, sl, D**-0.5, num_splits=num_splits, config=config, **scales
    )
    ref = paged_attention_decode_ref(q, k_cache, v_cache, tables, sl, D**-0.5, **scales)
    close(f"fp8 decode n64 tail 16 splits={num_splits} {v_as_k=}", out, ref, model)


@needs_triton
@pytest.mark.parametrize("cache", [*FP8, None], ids=["e4m3", "e5m2", "model dtype"])
@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("Hq,Hk,D,block_size", [(4, 2, 64, 8), (6, 2, 80, 16)])
def test_decode_reads_a_v_cache_laid_out_by_token(
    cache: torch.dtype | None, num_splits: int, Hq: int, Hk: int, D: int, block_size: int
) -> None:
    # The same V values in the (blocks, Hk, D, page) layout: the same attention as the reference's over the
    # pool's own layout, whole pages and ragged last tiles alike.
    seq_lens = [1, block_size - 1, block_size + 1, 3 * block_size + 5]
    k_cache, v_cache, k_scale, v_scale, tables, real_k, real_v = fp8_paged_cache(
        seq_lens, block_size, Hk, D, cache or FP8[0], v_as_k=True
    )
    scales = dict(k_scale=k_scale, v_scale=v_scale)
    if cache is None:  # float32 caches: no scales
        k_cache, v_cache, scales = real_k, real_v, {}
    v_tokens = v_by_token(v_cache)
    assert torch.equal(v_tokens, v_cache) and v_tokens.stride(1) == 1  # same values, tokens contiguous
    assert by_token(v_tokens) and not by_token(v_cache)
    q = torch.randn(len(seq_lens), Hq, D, device=DEVICE)
    sl = torch.tensor(seq_lens, device=DEVICE, dtype=torch.int32)
    config = default_decode_config(D, q.dtype)._replace(block_n=16)  # several pages a tile at page 8
    out = decode_attention(
        q, k_cache, v_tokens, tables, sl, D**-0.5, num_splits=num_splits, config=config, **scales
    )
    ref = paged_attention_decode_ref(q, k_cache, v_cache, tables, sl, D**-0.5, **scales)
    close(f"decode, V by token, {cache} splits={num_splits}", out, ref, torch.float32)


@needs_triton
@pytest.mark.parametrize("model", MODEL_DTYPES + ([torch.float16] if DEVICE == "cpu" else []), ids=str)
@pytest.mark.parametrize("dtype", FP8, ids=["e4m3", "e5m2"])
@V_LAYOUTS
def test_fp8_prefill_matches_reference(model: torch.dtype, dtype: torch.dtype, v_as_k: bool) -> None:
    # Decodes beside a fresh prompt and a chunk after earlier context, pages of 8; a 16-bit q takes the
    # tiles converted to float16.
    Hq, Hk, D, block_size = 6, 2, 80, 8
    query_lens, context_lens = [1, 19, 9], [7, 0, 13]
    seq_lens = [a + b for a, b in zip(query_lens, context_lens, strict=True)]
    k_cache, v_cache, k_scale, v_scale, tables, _, _ = fp8_paged_cache(
        seq_lens, block_size, Hk, D, dtype, v_as_k
    )
    q = torch.randn(sum(query_lens), Hq, D, device=DEVICE, dtype=model)
    qsl = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], device=DEVICE, dtype=torch.int32)
    sl = torch.tensor(seq_lens, device=DEVICE, dtype=torch.int32)
    args = (q, k_cache, v_cache, tables, qsl, sl, max(query_lens), D**-0.5, k_scale, v_scale)
    close(
        f"fp8 prefill {dtype} {v_as_k=}",
        paged_attention_prefill(*args),
        paged_attention_prefill_ref(*args),
        model,
    )


@needs_triton
def test_fp8_decode_stays_near_the_unquantised_attention() -> None:
    # The scales are applied: attention over the float8 cache is within quantisation error of attention
    # over the float32 values it was quantised from (a dropped scale would be off by orders of magnitude).
    torch.manual_seed(0)
    seq_lens, block_size, Hk, D = [37, 5], 8, 2, 64
    k_cache, v_cache, k_scale, v_scale, tables, real_k, real_v = fp8_paged_cache(
        seq_lens, block_size, Hk, D, FP8[0]
    )
    q = torch.randn(2, 4, D, device=DEVICE)
    sl = torch.tensor(seq_lens, device=DEVICE, dtype=torch.int32)
    out = decode_attention(q, k_cache, v_cache, tables, sl, D**-0.5, k_scale=k_scale, v_scale=v_scale)
    exact = paged_attention_decode_ref(q, real_k, real_v, tables, sl, D**-0.5)
    err = (out - exact).abs().max().item() / exact.abs().max().item()
    print(f"fp8 decode against unquantised K/V: largest relative difference {err:.3g}")
    # e4m3 rounds each element by up to 1/16: over random data the largest difference, relative to the
    # largest output, reaches about 0.1 (0.103 at worst over 60 seeds)
    assert err < 0.25
