"""Check, then time, every Triton kernel of llmbench.kernels at real sizes on a CUDA GPU.

For each case: run the Triton kernel and its torch reference on the same random bf16 inputs, print the
largest relative difference and stop (exit 1) if it is off; then time the kernel with
``triton.testing.do_bench`` (median, L2 flushed between runs) and report achieved bandwidth, counting
each input byte read once and each output byte written once, against the device's copy bandwidth (bytes
read plus written): the one ``llmbench calibrate`` measured on this machine, else the datasheet's. Attention rows also show TFLOP/s. Rows marked fp8_e4m3 read a
float8 KV cache (kv_cache_dtype): quantised from the bf16 one with per-head scales, and checked against the
reference reading the same float8 bytes; their bandwidth counts one byte per cached element. The first
rows are what a kernel that only reads can take from memory (``read_ceiling_case``): a read-only kernel
such as decode attention can pass 100% of the copy ceiling.

    python devtools/bench_kernels.py                  # check + time, print a table
    python devtools/bench_kernels.py --json out.json  # also write the rows
    python devtools/bench_kernels.py --tune           # sweep decode / prefill tile configs first
    python devtools/bench_kernels.py --tune decode-fp8 # the decode sweep over a float8 cache
    python devtools/bench_kernels.py --tune decode-fp8-mixed  # the same at 256 mixed lengths, longest first
    python devtools/bench_kernels.py --tune decode-fp8-tails  # float8 tilings with a narrow tail, mixed and uniform
    python devtools/bench_kernels.py --tune decode-balanced  # devtools/balanced_decode.py against the default
    python devtools/bench_kernels.py --tune decode-ceiling   # the pool read and only summed, the register decode
    python devtools/bench_kernels.py --tune decode-rows      # a program per sequence, all its heads
    python devtools/bench_kernels.py --tune decode-placement  # pages shuffled, in order or spread over a pool
    python devtools/bench_kernels.py --tune read-pattern  # a read by chunk size, order, work a program
    python devtools/bench_kernels.py --tune prefill-fp8  # the prefill sweep over a float8 cache
    python devtools/bench_kernels.py --tune decode-fp8 --tune-only --json FILE   # that sweep alone
    python devtools/bench_kernels.py --smoke          # tiny shapes on CPU (TRITON_INTERPRET=1): tests the script
    python devtools/bench_kernels.py --read-ceiling --json FILE  # what a read-only kernel can take from memory
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

if "--smoke" in sys.argv:  # must be decided before triton is imported
    os.environ["TRITON_INTERPRET"] = "1"

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from balanced_decode import (  # noqa: E402  (devtools/)
    BalancedConfig,
    balanced_decode_attention,
    balanced_programs,
)
from register_decode import (  # noqa: E402  (devtools/)
    paged_read,
    paged_read_ref,
    paged_read_rows,
    register_decode_attention,
    rows_decode_attention,
)

from llmbench.kernels._triton import jit, num_sms, tl  # noqa: E402
from llmbench.kernels.activation import silu_and_mul, silu_and_mul_ref  # noqa: E402
from llmbench.kernels.attention_prologue import attention_prologue, attention_prologue_ref  # noqa: E402
from llmbench.kernels.decode_config import (  # noqa: E402
    SLICE_TILE,
    DecodeConfig,
    choose_num_splits,
    default_decode_config,
    longest_first,
)
from llmbench.kernels.kv_layout import v_by_token  # noqa: E402
from llmbench.kernels.kv_quant import kv_scales_from, quantize_ref  # noqa: E402
from llmbench.kernels.kv_store import store_kv, store_kv_ref  # noqa: E402
from llmbench.kernels.paged_attention import paged_attention_decode_ref, paged_attention_prefill_ref  # noqa: E402
from llmbench.kernels.rmsnorm import rms_norm, rms_norm_ref  # noqa: E402
from llmbench.kernels.rotary import apply_rotary, apply_rotary_ref  # noqa: E402
from llmbench.kernels.triton_decode import decode_attention  # noqa: E402
from llmbench.kernels.triton_prefill import PrefillConfig, prefill_attention  # noqa: E402

FALLBACK_PEAK = (
    4.25e12  # bytes/s: an H200's device-to-device copy, read + write (when nothing better is known)
)


def copy_peak(device: str) -> tuple[float, str]:
    """This device's measured copy bandwidth (``llmbench calibrate``), else its datasheet's, else
    FALLBACK_PEAK; and where it came from (the kernel tables' "of the copy ceiling" divides by it)."""
    from llmbench.bench.peaks import choose_peak

    peak = choose_peak(device).peak if device.startswith("cuda") else None
    if peak is None:
        return FALLBACK_PEAK, "an H200's copy, no better figure known"
    if peak.source == "measured":
        return peak.mem_bandwidth, f"measured {peak.measured_at}, {peak.calibration_file}"
    return peak.mem_bandwidth, (
        "the datasheet's, not a copy's: run `llmbench calibrate` or set LLMBENCH_CALIBRATION for the measured "
        "ceiling the other kernel tables divide by"
    )


PEAK_BYTES_PER_S = FALLBACK_PEAK  # set from the device in main()
FP8 = torch.float8_e4m3fn


@dataclass
class Row:
    kernel: str
    shape: str
    time_us: float
    gb_per_s: float
    frac_peak: float
    tflops: float | None = None
    max_rel_diff: float | None = None
    timing: str = "graph"  # graph: replayed from a CUDA graph; eager: plain launches


@dataclass
class Env:
    device: str
    dtype: torch.dtype
    smoke: bool
    warmup_ms: int
    rep_ms: int

    @classmethod
    def pick(cls, smoke: bool, warmup_ms: int = 50, rep_ms: int = 200) -> Env:
        """bf16 on the GPU; with ``smoke``, float32 on the CPU (the interpreter's small cases)."""
        return cls(
            "cpu" if smoke else "cuda", torch.float32 if smoke else torch.bfloat16, smoke, warmup_ms, rep_ms
        )

    def t(self, *shape: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        return torch.randn(*shape, device=self.device, dtype=dtype or self.dtype)


ROTATE_BYTES = 256 << 20  # > the H200's 60 MB L2: small cases rotate over this much distinct data


def time_us(
    env: Env, fn: Callable[[], object], graph: bool = True, more: list[Callable[[], object]] | None = None
) -> float:
    """Median µs per call. With ``graph``, the calls (``fn`` and ``more``, each over its own inputs, so a
    small case still reads from memory, not L2) are replayed from one CUDA graph: no launch overhead,
    as in the engine's graph-captured decode. Without it, plain eager launches (host syncs allowed)."""
    fns = [fn, *(more or [])]
    if env.smoke:  # the interpreter: one timed round is enough to exercise the script
        for f in fns:
            f()
        start = time.perf_counter()
        for f in fns:
            f()
        return (time.perf_counter() - start) * 1e6 / len(fns)
    import triton.testing

    if not graph:
        return triton.testing.do_bench(fn, warmup=env.warmup_ms, rep=env.rep_ms, return_mode="median") * 1e3
    for f in fns:  # compile outside the capture
        f()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in fns:
            f()
    return (
        triton.testing.do_bench(g.replay, warmup=env.warmup_ms, rep=env.rep_ms, return_mode="median")
        * 1e3
        / len(fns)
    )


def rotations(set_bytes: int) -> int:
    return min(16, max(1, -(-ROTATE_BYTES // set_bytes)))


def check(name: str, out: torch.Tensor, ref: torch.Tensor, tol: float) -> float:
    diff = (out.float() - ref.float()).abs().max().item()
    rel = diff / max(ref.float().abs().max().item(), 1e-6)
    ok = bool(torch.isfinite(out).all()) and rel <= tol
    print(f"check {name:<34} max rel diff {rel:.2e} (tol {tol:.0e}) {'ok' if ok else 'FAILED'}", flush=True)
    if not ok:
        raise SystemExit(f"{name}: Triton output differs from the torch reference (max rel diff {rel:.3e})")
    return rel


def nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def row(
    kernel: str,
    shape: str,
    us: float,
    moved: int,
    rel: float | None,
    flops: float | None = None,
    timing: str = "graph",
) -> Row:
    gbps = moved / (us * 1e-6) / 1e9
    tflops = flops / (us * 1e-6) / 1e12 if flops else None
    return Row(kernel, shape, us, gbps, gbps * 1e9 / PEAK_BYTES_PER_S, tflops, rel, timing)


# --- cases -------------------------------------------------------------------------------------------


@jit
def _stream_read_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr, STEPS: tl.constexpr):
    # Each program sums STEPS contiguous blocks of BLOCK elements: a read and nothing else.
    start = tl.program_id(0).to(tl.int64) * BLOCK * STEPS
    acc = tl.zeros([BLOCK], tl.float32)
    for i in range(STEPS):
        acc += tl.load(x_ptr + start + i * BLOCK + tl.arange(0, BLOCK)).to(tl.float32)
    tl.store(out_ptr + tl.program_id(0), tl.sum(acc, axis=0))


def read_ceiling_case(env: Env, n: int, block: int = 2048, steps: int = 16) -> list[Row]:
    """What a kernel that only reads can take from memory: a decode step's attention reads the KV cache and
    writes next to nothing, so its ceiling is this, not the copy's (bytes read plus written). A Triton
    streaming read (2048 x 16 elements a program, 16 warps: the fastest of the tilings tried on an H200),
    torch's sum, and the copy (timed outside a CUDA graph, as ``llmbench calibrate`` times it: a graph
    replays a device-to-device copy as a copy node, which an H200 runs at about two thirds of the rate)."""
    x = env.t(n)
    y = torch.empty_like(x)
    out = torch.empty(n // (block * steps), device=env.device, dtype=torch.float32)

    def stream() -> None:
        _stream_read_kernel[(out.numel(),)](x, out, BLOCK=block, STEPS=steps, num_warps=16)

    stream()
    rel = check("stream read", out, x.view(out.numel(), -1).float().sum(dim=1), 1e-3)
    shape = f"{nbytes(x) / 2**20:g} MiB"
    return [
        row("stream read (Triton)", shape, time_us(env, stream), nbytes(x), rel),
        row("sum (torch)", shape, time_us(env, lambda: x.sum(dtype=torch.float32)), nbytes(x), None),
        row(
            "copy (torch)",
            shape,
            time_us(env, lambda: y.copy_(x), graph=False),
            2 * nbytes(x),
            None,
            timing="eager",
        ),
    ]


@jit
def _chunk_read_kernel(x_ptr, chunks_ptr, out_ptr, half, BLOCK: tl.constexpr, STEPS: tl.constexpr,
                       CHUNKS: tl.constexpr, PAIRED: tl.constexpr):  # fmt: skip
    # Each program sums CHUNKS chunks of STEPS x BLOCK contiguous elements, the chunks ``chunks_ptr`` names
    # (``PAIRED``: each chunk and its twin ``half`` elements further on, as a decode reads K and V).
    acc = tl.zeros([BLOCK], tl.float32)
    for c in range(CHUNKS):
        start = tl.load(chunks_ptr + tl.program_id(0) * CHUNKS + c).to(tl.int64) * BLOCK * STEPS
        for i in range(STEPS):
            acc += tl.load(x_ptr + start + i * BLOCK + tl.arange(0, BLOCK)).to(tl.float32)
            if PAIRED:
                acc += tl.load(x_ptr + half + start + i * BLOCK + tl.arange(0, BLOCK)).to(tl.float32)
    tl.store(out_ptr + tl.program_id(0), tl.sum(acc, axis=0))


def read_pattern_case(env: Env, n: int, chunk_kb: int, program_kb: int, shuffled: bool, paired: bool,
                      num_warps: int, check_it: bool = True) -> list[Row]:  # fmt: skip
    """A read of ``n`` elements in chunks of ``chunk_kb`` KiB, ``program_kb`` KiB a program (both halves of
    a chunk pair counted), chunks in address order or shuffled: which access patterns let a read-only
    kernel reach the stream's rate (a paged decode reads scattered chunks, a few hundred KiB a program)."""
    block = min(2048, chunk_kb * 1024 // env.t(1).element_size())
    steps = chunk_kb * 1024 // (block * env.t(1).element_size())
    per_program = max(1, program_kb // (chunk_kb * (2 if paired else 1)))
    num_chunks = (n // 2 if paired else n) // (block * steps)
    programs = num_chunks // per_program
    x = env.t(n)
    chunks = (
        torch.randperm(num_chunks, device=env.device)
        if shuffled
        else torch.arange(num_chunks, device=env.device)
    )
    chunks = chunks[: programs * per_program].to(torch.int32)
    out = torch.empty(programs, device=env.device, dtype=torch.float32)

    def run() -> None:
        _chunk_read_kernel[(programs,)](x, chunks, out, n // 2, BLOCK=block, STEPS=steps, CHUNKS=per_program,
                                        PAIRED=paired, num_warps=num_warps)  # fmt: skip

    name = f"chunk read {chunk_kb} KiB{' pairs' if paired else ''} {program_kb} KiB a program w{num_warps}"
    name += " shuffled" if shuffled else " in order"
    rel = None
    if check_it:
        run()
        halves = 2 if paired else 1
        parts = x.view(halves, -1)[:, : num_chunks * block * steps].float().view(halves, num_chunks, -1)
        ref = parts[:, chunks.long()].sum(dim=(0, 2)).view(programs, per_program).sum(dim=1)
        rel = check(name, out, ref, 1e-3)
    read = programs * per_program * block * steps * (2 if paired else 1) * x.element_size()
    return [row(name, f"{read / 2**20:g} MiB", time_us(env, run), read, rel)]


def small_kernels(env: Env, T: int, H: int, inter: int, Hq: int, Hk: int, D: int) -> list[Row]:
    rows = []
    x, res, w = env.t(T, H), env.t(T, H), env.t(H)
    rel = check("rms_norm+residual", rms_norm(x, w, 1e-6, res)[0], rms_norm_ref(x, w, 1e-6, res)[0], 2e-2)
    us = time_us(env, lambda: rms_norm(x, w, 1e-6, res))
    rows.append(row("rms_norm+residual", f"T={T} H={H}", us, nbytes(x, res, w) + 2 * nbytes(x), rel))
    rel = check("rms_norm", rms_norm(x, w, 1e-6)[0], rms_norm_ref(x, w, 1e-6)[0], 2e-2)
    rows.append(
        row("rms_norm", f"T={T} H={H}", time_us(env, lambda: rms_norm(x, w, 1e-6)), nbytes(x, w, x), rel)
    )

    gu = env.t(T, 2 * inter)
    rel = check("silu_and_mul", silu_and_mul(gu), silu_and_mul_ref(gu), 2e-2)
    rows.append(
        row(
            "silu_and_mul",
            f"T={T} I={inter}",
            time_us(env, lambda: silu_and_mul(gu)),
            nbytes(gu) * 3 // 2,
            rel,
        )
    )

    q, k = env.t(T, Hq, D), env.t(T, Hk, D)
    cos_sin = env.t(max(T, 4096), D, dtype=torch.float32)
    pos = torch.randint(0, cos_sin.shape[0], (T,), device=env.device)
    out, ref = apply_rotary(q, k, pos, cos_sin), apply_rotary_ref(q, k, pos, cos_sin)
    rel = max(check("rotary q", out[0], ref[0], 2e-2), check("rotary k", out[1], ref[1], 2e-2))
    moved = 2 * nbytes(q, k) + nbytes(pos) + T * D * 4
    rows.append(
        row(
            "apply_rotary",
            f"T={T} {Hq}/{Hk}x{D}",
            time_us(env, lambda: apply_rotary(q, k, pos, cos_sin)),
            moved,
            rel,
        )
    )

    block_size = 16
    num_blocks = 2 * T // block_size
    k_cache, v_cache = env.t(num_blocks, block_size, Hk, D), env.t(num_blocks, block_size, Hk, D)
    kn, vn = env.t(T, Hk, D), env.t(T, Hk, D)
    slots = torch.randperm(num_blocks * block_size, device=env.device)[:T]
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    store_kv(kn, vn, k_cache, v_cache, slots)
    store_kv_ref(kn, vn, k_ref, v_ref, slots)
    if not (torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)):
        raise SystemExit("store_kv: caches differ from the torch reference")
    print(f"check {'store_kv':<34} caches identical", flush=True)
    us = time_us(env, lambda: store_kv(kn, vn, k_cache, v_cache, slots))
    rows.append(
        row("store_kv", f"T={T} {Hk}x{D} page {block_size}", us, 2 * nbytes(kn, vn) + nbytes(slots), 0.0)
    )
    # Float8: the same bytes as the reference (kernels/kv_quant.py rounds to the grid before converting).
    k8, v8 = k_cache.to(FP8), v_cache.to(FP8)
    k8_ref, v8_ref = k8.clone(), v8.clone()
    scales = kv_scales_from(kn, vn, FP8)
    store_kv(kn, vn, k8, v8, slots, *scales)
    store_kv_ref(kn, vn, k8_ref, v8_ref, slots, *scales)
    same = torch.equal(k8.view(torch.uint8), k8_ref.view(torch.uint8))
    if not (same and torch.equal(v8.view(torch.uint8), v8_ref.view(torch.uint8))):
        raise SystemExit("store_kv fp8_e4m3: cache bytes differ from the torch reference")
    print(f"check {'store_kv fp8_e4m3':<34} cache bytes identical", flush=True)
    us = time_us(env, lambda: store_kv(kn, vn, k8, v8, slots, *scales))
    moved = nbytes(kn, vn, slots) + kn.numel() + vn.numel()
    rows.append(row("store_kv fp8_e4m3", f"T={T} {Hk}x{D} page {block_size}", us, moved, 0.0))
    return rows


def prologue_case(env: Env, T: int, Hq: int, Hk: int, D: int) -> list[Row]:
    """The fused attention prologue (Qwen3: q/k norm, RoPE, KV store) against the four unfused Triton
    kernels plus the two copies the engine used to make of strided q/k, both replayed from a graph."""
    block_size = 16
    qkv = env.t(T, (Hq + 2 * Hk) * D)
    w_q, w_k = env.t(D), env.t(D)
    cos_sin = env.t(4096, D, dtype=torch.float32)
    pos = torch.randint(0, 4096, (T,), device=env.device)
    num_blocks = max(4, 2 * T // block_size)
    k_cache, v_cache = env.t(num_blocks, block_size, Hk, D), env.t(num_blocks, block_size, Hk, D)
    slots = torch.randperm(num_blocks * block_size, device=env.device)[:T]
    args = (pos, cos_sin, w_q, w_k, 1e-6)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    q = attention_prologue(qkv, *args, k_cache, v_cache, slots, Hq, Hk)
    q_ref = attention_prologue_ref(qkv, *args, k_ref, v_ref, slots, Hq, Hk)
    rel = max(check("prologue q", q, q_ref, 2e-2), check("prologue k cache", k_cache, k_ref, 2e-2))

    def unfused() -> None:
        qs, ks, vs = qkv.split([Hq * D, Hk * D, Hk * D], dim=-1)
        qn = rms_norm(qs.reshape(T * Hq, D), w_q, 1e-6)[0].view(T, Hq, D)
        kn = rms_norm(ks.reshape(T * Hk, D), w_k, 1e-6)[0].view(T, Hk, D)
        qr, kr = apply_rotary(qn, kn, pos, cos_sin)
        store_kv(kr, vs.view(T, Hk, D), k_cache, v_cache, slots)

    moved = nbytes(qkv, pos) + T * D * 4 + nbytes(q) + 2 * T * Hk * D * qkv.element_size()
    shape = f"T={T} {Hq}/{Hk}x{D}"
    fused_us = time_us(env, lambda: attention_prologue(qkv, *args, k_cache, v_cache, slots, Hq, Hk))
    return [
        row("attention_prologue (fused)", shape, fused_us, moved, rel),
        row("  same, 6 unfused kernels", shape, time_us(env, unfused), moved, None),
    ]


def paged_cache(
    env: Env, B: int, context: int, block_size: int, Hk: int, D: int, kv_dtype=None, v_as_k: bool = False,
    heads_first: bool = False, placement: str = "shuffled",
):  # fmt: skip
    """Caches and block tables, and the scales: a float8 ``kv_dtype`` quantises random bf16
    caches with per-head scales from their own values, V laid out by token as in the engine's pool
    (``v_as_k``: laid out as K instead); None: bf16 caches, no scales. ``heads_first``: each bf16 page
    holds its heads one after another (a head's tokens contiguous), seen with the same indices.
    ``placement``: where a sequence's pages lie in the pool: "shuffled" (a random permutation of the
    batch's pages), "in order" (each sequence's pages one after another) or "spread N" (the batch's pages
    drawn at random from a pool N times their number)."""
    per_seq = -(-context // block_size)
    spread = int(placement.split()[1]) if placement.startswith("spread") else 1
    pages = B * per_seq * spread
    if heads_first:
        k_cache, v_cache = (env.t(pages, Hk, block_size, D).transpose(1, 2) for _ in range(2))
    else:
        k_cache, v_cache = env.t(pages, block_size, Hk, D), env.t(pages, block_size, Hk, D)
    if placement == "in order":
        taken = torch.arange(B * per_seq, device=env.device)
    else:
        taken = torch.randperm(pages, device=env.device)[: B * per_seq]
    block_tables = taken.view(B, per_seq).to(torch.int32)
    if kv_dtype is None:
        return k_cache, v_cache, block_tables, {}
    k_scale, v_scale = kv_scales_from(k_cache.flatten(0, 1), v_cache.flatten(0, 1), kv_dtype)
    k8 = quantize_ref(k_cache.flatten(0, 1), k_scale, kv_dtype).view(k_cache.shape)
    v8 = quantize_ref(v_cache.flatten(0, 1), v_scale, kv_dtype).view(v_cache.shape)
    return k8, v8 if v_as_k else v_by_token(v8), block_tables, {"k_scale": k_scale, "v_scale": v_scale}


def decode_case(
    env: Env, B: int, context: int, block_size: int, Hq: int, Hk: int, D: int,
    config: DecodeConfig | None = None, num_splits: int | None = None, with_ref_time: bool = False, check_it: bool = True,
    mixed: bool = False, split_tokens: int | None = None, kv_dtype: torch.dtype | None = None,
    ordered: bool = False, v_as_k: bool = False, shortest: float | None = None, uniform: bool = False,
    heads_first: bool = False, per_step_sm: int | None = None, balanced: BalancedConfig | None = None,
    placement: str = "shuffled",
) -> list[Row]:  # fmt: skip
    """``mixed``: context lengths uniform in [context/10, context] (a served batch) instead of all equal,
    ``shortest``: in [shortest x context, context]; bandwidth then counts the K/V actually read. ``kv_dtype``: a float8 cache (see ``paged_cache``).
    ``ordered``: programs take the sequences longest first (``longest_first``), as the engine does.
    ``v_as_k``: a float8 V laid out as K, not by token (``kv_layout.py``). ``uniform``: the default tiles
    for contexts of about one length (``decode_attention``'s ``uniform``)."""
    explicit = config is not None  # the tile config goes into the row's name
    fp8 = kv_dtype is not None
    config = config or default_decode_config(D, env.dtype, fp8, v_tokens=fp8 and not v_as_k, uniform=uniform)
    gen = torch.Generator().manual_seed(B)
    if mixed:
        shortest = 0.1
    lens = (
        torch.randint(max(1, int(shortest * context)), context + 1, (B,), generator=gen)
        if shortest is not None and shortest < 1
        else torch.full((B,), context)
    )
    max_context = -(-context // block_size) * block_size
    splits = num_splits or choose_num_splits(B, Hk, max_context, config, torch.device(env.device))
    if per_step_sm:  # slices of one length chosen from this batch's contexts: about this many programs an SM
        programs = per_step_sm * num_sms(torch.device(env.device))
        split_tokens = max(1, -(-int(lens.sum()) * Hk // (programs * SLICE_TILE))) * SLICE_TILE
    if split_tokens:
        splits = -(-max_context // split_tokens)

    def make() -> tuple[tuple, dict, Callable[[], torch.Tensor]]:
        k_cache, v_cache, block_tables, scales = paged_cache(
            env, B, context, block_size, Hk, D, kv_dtype, v_as_k, heads_first, placement
        )
        q = env.t(B, Hq, D)
        seq_lens = lens.to(device=env.device, dtype=torch.int32)
        args = (q, k_cache, v_cache, block_tables, seq_lens, D**-0.5)
        order = longest_first(seq_lens) if ordered else None
        if balanced is not None:  # the balanced kernel's arrival counts, kept from one launch to the next
            counts = torch.zeros(balanced_programs(balanced, q.device), dtype=torch.int32, device=q.device)
            return args, scales, lambda: balanced_decode_attention(*args, config=balanced, counts=counts)
        return (
            args,
            scales,
            lambda: decode_attention(
                *args, num_splits=splits, config=config, split_tokens=split_tokens, order=order, **scales
            ),
        )

    args, scales, run = make()
    q, k_cache, block_tables, seq_lens = args[0], args[1], args[3], args[4]
    kv_name = " fp8_e4m3" if kv_dtype is not None else ""
    rel = (
        check(f"decode{kv_name} B={B} ctx={context} page={block_size}", run(),
              paged_attention_decode_ref(*args, **scales), 2e-2)
        if check_it
        else None
    )  # fmt: skip
    kv_bytes = 2 * int(lens.sum()) * Hk * D * k_cache.element_size()
    moved = nbytes(q, q, block_tables, seq_lens) + kv_bytes
    more = [make()[2] for _ in range(rotations(kv_bytes) - 1)]
    flops = 4 * int(lens.sum()) * Hq * D
    ctx = (
        f"ctx {int(shortest * context)}-{context}"
        if shortest is not None and shortest < 1
        else f"ctx={context}"
    )
    cut = f"slices of {split_tokens}" if split_tokens else f"splits {splits}"
    cut = f"balanced, {balanced.programs_per_sm} programs an SM" if balanced else cut
    cut += f" ({per_step_sm} programs an SM)" if per_step_sm else ""
    shape = f"B={B} {ctx} {Hq}/{Hk}x{D} page {block_size} {cut}" + (" longest first" if ordered else "")
    shape += " V as K" if fp8 and v_as_k else ""
    shape += " uniform tiles" if uniform else ""
    shape += " heads first" if heads_first else ""
    shape += f" pages {placement}" if placement != "shuffled" else ""
    tail = f"t{config.tail_n}" if config.tail_n else ""
    cfg = f" n{config.block_n}{tail}w{config.num_warps}s{config.num_stages}"
    if balanced:
        explicit, cfg = True, f" balanced n{balanced.block_n}w{balanced.num_warps}s{balanced.num_stages}"
    if kv_dtype is not None:
        kv_name += " to fp16" if config.fp8_to == "fp16" else ""
    rows = [
        row(
            "paged_decode" + kv_name + (cfg if explicit else ""),
            shape,
            time_us(env, run, more=more),
            moved,
            rel,
            flops,
        )
    ]
    del more
    if with_ref_time:  # the reference syncs with the host (.tolist()): eager only
        us = time_us(env, lambda: paged_attention_decode_ref(*args), graph=False)
        rows.append(
            row("paged_decode_ref (torch)", shape.rsplit(" splits", 1)[0], us, moved, None, flops, "eager")
        )
        us = time_us(env, run, graph=False)
        rows.append(row("paged_decode", shape, us, moved, None, flops, "eager"))
    return rows


def ceiling_case(
    env: Env, B: int, context: int, kind: str, block_n: int, num_warps: int, num_stages: int,
    evict: bool = False, splits: int = 1, check_it: bool = True, placement: str = "shuffled",
) -> list[Row]:  # fmt: skip
    """The batches a run drains through (contexts in [context/10, context], longest first, 16/8 heads of
    128, pages of 16), through devtools/register_decode.py's ``kind``: "paged read", the pool read as the
    decode kernel reads it and only summed; "register decode"; "paged read by sequence", each program a
    sequence (in ``splits`` slices) with all its heads; "decode by sequence", the decode built on that."""
    gen = torch.Generator().manual_seed(B)
    lens = torch.randint(max(1, context // 10), context + 1, (B,), generator=gen)
    read = "read" in kind

    def make() -> tuple[tuple, Callable[[], torch.Tensor]]:
        k_cache, v_cache, block_tables, _ = paged_cache(env, B, context, 16, 8, 128, placement=placement)
        seq_lens = lens.to(device=env.device, dtype=torch.int32)
        order = longest_first(seq_lens)
        cache = (k_cache, v_cache, block_tables, seq_lens)
        args = cache if read else (env.t(B, 16, 128), *cache, 128**-0.5)
        tiles = (order, block_n, num_warps, num_stages)
        runs = {
            "paged read": lambda: paged_read(*args, *tiles, evict),
            "register decode": lambda: register_decode_attention(*args, *tiles),
            "paged read by sequence": lambda: paged_read_rows(*args, *tiles, splits),
            "decode by sequence": lambda: rows_decode_attention(*args, *tiles, splits),
        }
        return args, runs[kind]

    args, run = make()
    name = f"{kind} n{block_n}w{num_warps}s{num_stages}"
    name += " evict first" if evict else ""
    name += f" splits {splits}" if "sequence" in kind else ""
    rel = None
    if check_it:
        ref = paged_read_ref(*args) if read else paged_attention_decode_ref(*args)
        rel = check(f"{name} B={B}", run(), ref, 2e-2)
    kv_bytes = 2 * int(lens.sum()) * 8 * 128 * env.t(1).element_size()
    more = [make()[1] for _ in range(rotations(kv_bytes) - 1)]
    shape = f"B={B} ctx {context // 10}-{context} 16/8x128 page 16 longest first"
    shape += f" pages {placement}" if placement != "shuffled" else ""
    return [row(name, shape, time_us(env, run, more=more), kv_bytes, rel)]


def prefill_case(
    env: Env, T: int, context: int, block_size: int, Hq: int, Hk: int, D: int,
    config: PrefillConfig | None = None, check_it: bool = True, kv_dtype: torch.dtype | None = None,
    v_as_k: bool = False, prompts: tuple[int, int] | None = None,
) -> list[Row]:  # fmt: skip
    """One chunk of ``T`` query tokens after ``context`` cached ones; with ``prompts`` (shortest, longest),
    a step's worth of whole prompts instead, their lengths uniform in that range and summing to ``T`` (a
    served batch's prefill step; ``context`` ignored)."""
    lens = [T] if prompts is None else prompt_lengths(T, *prompts)
    context = 0 if prompts is not None else context
    k_cache, v_cache, block_tables, scales = paged_cache(
        env, len(lens), context + max(lens), block_size, Hk, D, kv_dtype, v_as_k
    )
    q = env.t(T, Hq, D)
    qsl = torch.tensor([0, *itertools.accumulate(lens)], device=env.device, dtype=torch.int32)
    seq_lens = torch.tensor([context + n for n in lens], device=env.device, dtype=torch.int32)
    args = (q, k_cache, v_cache, block_tables, qsl, seq_lens, max(lens), D**-0.5)
    run = lambda: prefill_attention(*args, config=config, **scales)
    kv_name = " fp8_e4m3" if kv_dtype is not None else ""
    rel = (
        check(
            f"prefill{kv_name} T={T} ctx={context}", run(), paged_attention_prefill_ref(*args, **scales), 2e-2
        )
        if check_it
        else None
    )
    moved = 2 * nbytes(q) + 2 * (context * len(lens) + T) * Hk * D * k_cache.element_size()
    flops = 4 * Hq * D * sum(n * context + n * (n + 1) / 2 for n in lens)  # QK^T and PV, causal pairs
    name = (
        "paged_prefill"
        + kv_name
        + (
            f" m{config.block_m}n{config.block_n}w{config.num_warps}s{config.num_stages}"
            if config and not check_it
            else ""
        )
    )
    held = f"{len(lens)} prompts of {prompts[0]}-{prompts[1]}" if prompts else f"ctx={context}"
    shape = f"T={T} {held} {Hq}/{Hk}x{D} page {block_size}" + (" V as K" if kv_dtype and v_as_k else "")
    return [row(name, shape, time_us(env, run), moved, rel, flops)]


def prompt_lengths(total: int, shortest: int, longest: int) -> list[int]:
    """Prompt lengths uniform in [shortest, longest] (seeded) until they sum to ``total``, the last one cut."""
    gen = torch.Generator().manual_seed(total)
    lens: list[int] = []
    left = total
    while left > 0:
        lens.append(min(int(torch.randint(shortest, longest + 1, (1,), generator=gen)), left))
        left -= lens[-1]
    return lens


def tune(env: Env, kinds: list[str]) -> list[Row]:
    """Sweep tile configs at the headline shapes; a config that does not compile is reported and skipped."""
    B, ctx, T = (2, 64, 40) if env.smoke else (64, 4096, 2048)
    # a served prefill step: whole prompts of these lengths summing to this many tokens (prefill_case)
    step_tokens, prompts = (48, (5, 20)) if env.smoke else (8192, (100, 1024))
    rows: list[Row] = []

    def attempt(label: str, case: Callable[..., list[Row]], *args: object, **kwargs: object) -> None:
        try:
            new = case(env, *args, **{"check_it": False, **kwargs})
            rows.extend(new)
            for r in new:  # as they come: a sweep cut short still says what it measured
                print(f"{r.kernel} | {r.shape} | {r.time_us:.1f} us | {r.frac_peak:.1%}", flush=True)
        except (Exception, SystemExit) as e:  # out of shared memory or registers, mostly; a failed check
            print(f"tune {label}: {type(e).__name__}: {str(e).splitlines()[0][:120]}", flush=True)

    if "decode" in kinds:
        for block_size in (16, 128):
            for block_n in (32, 64, 128):
                for num_warps in (2, 4, 8):
                    for num_stages in (2, 3, 4):
                        cfg = DecodeConfig(block_n, num_warps, num_stages)
                        attempt(f"decode {cfg}", decode_case, B, ctx, block_size, 16, 8, 128, config=cfg)
    if "decode-fp8" in kinds:  # page 16; tiles to float16; V by token (the pool's) and laid out as K
        for v_as_k in (False, True):
            for block_n in (32, 64, 128):
                for num_warps in (1, 2, 4):
                    for num_stages in (2, 3, 4):
                        cfg = DecodeConfig(block_n, num_warps, num_stages, "fp16")
                        attempt(f"decode-fp8 {cfg} {v_as_k=}", decode_case, B, ctx, 16, 16, 8, 128, config=cfg,
                                kv_dtype=FP8, v_as_k=v_as_k)  # fmt: skip
    if "decode-fp8-mixed" in kinds:  # the engine's large decode step: mixed lengths, longest first
        for block_n in (32, 64, 128):
            for num_warps in (1, 2, 4, 8):
                for num_stages in (2, 3, 4):
                    cfg = DecodeConfig(block_n, num_warps, num_stages, "fp16")
                    attempt(f"decode-fp8-mixed {cfg}", decode_case, 4 * B, ctx // 2, 16, 16, 8, 128, config=cfg,
                            kv_dtype=FP8, mixed=True, ordered=True)  # fmt: skip
    batches = (2, 4) if env.smoke else (16, 32, 64, 96, 128, 192, 256)
    if "decode-batches" in kinds:  # the engine's decode steps as a run's batch drains, mixed lengths
        for batch in batches:
            for kv_dtype, block_ns, warps in ((None, (32, 64), (2, 4, 8)), (FP8, (64, 128), (1, 2, 4))):
                for block_n, num_warps, splits in itertools.product(block_ns, warps, (1, 2, 4, 8)):
                    cfg = DecodeConfig(block_n, num_warps, 3, "fp16" if kv_dtype else "q")
                    attempt(f"decode-batches {cfg} splits {splits}", decode_case, batch, ctx // 2, 16, 16, 8,
                            128, config=cfg, num_splits=splits, kv_dtype=kv_dtype, mixed=True,
                            ordered=True)  # fmt: skip
    if "decode-slices" in kinds:  # the run's narrower batches: slices sized per step against the default cut
        for batch in (4, 6) if env.smoke else (16, 32, 48, 64, 96, 128):
            attempt("decode-slices", decode_case, batch, ctx // 2, 16, 16, 8, 128, mixed=True, ordered=True)
            for per_sm in (4, 8, 16):
                attempt(f"decode-slices {per_sm}", decode_case, batch, ctx // 2, 16, 16, 8, 128, mixed=True,
                        ordered=True, per_step_sm=per_sm, check_it=per_sm == 8)  # fmt: skip
    if "decode-balanced" in kinds:  # the balanced kernel against the default at the batches a run drains
        tilings = [(64, 4, 3, 3), (64, 4, 2, 3), (64, 4, 2, 4), (64, 4, 3, 2)]
        for batch in batches:
            attempt("decode-balanced default", decode_case, batch, ctx // 2, 16, 16, 8, 128, mixed=True,
                    ordered=True)  # fmt: skip
            for i, tiling in enumerate(tilings):
                attempt(f"decode-balanced {tiling}", decode_case, batch, ctx // 2, 16, 16, 8, 128, mixed=True,
                        balanced=BalancedConfig(*tiling), check_it=i == 0)  # fmt: skip
        for tiling in [None, *tilings]:  # uniform long contexts
            attempt(f"decode-balanced uniform {tiling}", decode_case, B, ctx, 16, 16, 8, 128,
                    balanced=tiling and BalancedConfig(*tiling), check_it=False)  # fmt: skip
    if "decode-ceiling" in kinds:  # the paged read's ceiling, the engine's tiles and the register decode
        for batch in (5, 9) if env.smoke else (64, 128, 192, 256):
            attempt("decode-ceiling default", decode_case, batch, ctx // 2, 16, 16, 8, 128, mixed=True,
                    ordered=True)  # fmt: skip
            for block_n, num_warps, num_stages in itertools.product((32, 64), (4, 8), (1, 2, 4)):
                cfg = DecodeConfig(block_n, num_warps, num_stages)
                attempt(f"decode-ceiling {cfg}", decode_case, batch, ctx // 2, 16, 16, 8, 128, config=cfg,
                        mixed=True, ordered=True)  # fmt: skip
            for (block_n, num_warps, num_stages), evict in itertools.product(
                ((64, 4, 1), (64, 8, 1), (128, 8, 1), (32, 4, 1), (64, 4, 3), (128, 16, 1)), (False, True)
            ):
                attempt("decode-ceiling read", ceiling_case, batch, ctx // 2, "paged read", block_n, num_warps,
                        num_stages, evict, check_it=not evict)  # fmt: skip
            for block_n, num_warps, num_stages in (
                (16, 4, 1),
                (32, 4, 1),
                (32, 8, 1),
                (64, 8, 1),
                (32, 4, 2),
            ):
                attempt("decode-ceiling register", ceiling_case, batch, ctx // 2, "register decode", block_n,
                        num_warps, num_stages)  # fmt: skip
    if "read-pattern" in kinds:  # chunk size, work a program, order, K/V pairs: what a read can take
        n = 1 << 14 if env.smoke else 1 << 29
        for chunk_kb, program_kb, shuffled, paired, num_warps in itertools.product(
            (4, 32, 256), (64, 1024), (False, True), (False, True), (4, 16)
        ):
            if chunk_kb * (2 if paired else 1) <= program_kb and not (env.smoke and program_kb > 64):
                attempt("read-pattern", read_pattern_case, n, chunk_kb, program_kb, shuffled, paired, num_warps,
                        check_it=num_warps == 4)  # fmt: skip
    if "decode-placement" in kinds:  # where a sequence's pages lie: shuffled, in order, spread over a pool
        for batch, placement in itertools.product(
            (5, 9) if env.smoke else (64, 128, 256),
            ("shuffled", "in order", "spread 4" if env.smoke else "spread 16"),
        ):
            attempt("decode-placement default", decode_case, batch, ctx // 2, 16, 16, 8, 128, mixed=True,
                    ordered=True, placement=placement, check_it=placement != "shuffled")  # fmt: skip
            attempt("decode-placement read", ceiling_case, batch, ctx // 2, "paged read", 64, 4, 3,
                    placement=placement)  # fmt: skip
        for placement in ("shuffled", "in order"):  # uniform long contexts
            attempt("decode-placement uniform", decode_case, 64, ctx, 16, 16, 8, 128, placement=placement)
    if "decode-rows" in kinds:  # a program per sequence (slice), all its heads: the read and the decode
        for batch in (5, 9) if env.smoke else (64, 128, 192, 256):
            attempt(
                "decode-rows default", decode_case, batch, ctx // 2, 16, 16, 8, 128, mixed=True, ordered=True
            )
            tilings = [(8, 4, 1), (8, 4, 3), (16, 4, 1), (16, 8, 1), (16, 8, 2), (8, 8, 3)]
            for (block_n, num_warps, num_stages), splits in itertools.product(tilings, (1, 2, 4)):
                attempt("decode-rows read", ceiling_case, batch, ctx // 2, "paged read by sequence", block_n,
                        num_warps, num_stages, splits=splits, check_it=splits == 2)  # fmt: skip
            tilings = [(8, 4, 2), (8, 4, 3), (8, 8, 3), (16, 4, 2), (16, 8, 2)]
            for (block_n, num_warps, num_stages), splits in itertools.product(tilings, (1, 2, 4, 8)):
                attempt("decode-rows decode", ceiling_case, batch, ctx // 2, "decode by sequence", block_n,
                        num_warps, num_stages, splits=splits, check_it=splits <= 2)  # fmt: skip
    if "decode-layout" in kinds:  # bf16 pages by token (the pool's) or by head, at the batches a run drains
        for batch, page, heads_first in itertools.product((64, 128, 192, 256), (16, 64), (False, True)):
            for cfg in (None, DecodeConfig(64, 2, 3), DecodeConfig(128, 4, 3), DecodeConfig(64, 4, 4)):
                attempt(f"decode-layout {cfg}", decode_case, batch, ctx // 2, page, 16, 8, 128, config=cfg,
                        mixed=True, ordered=True, heads_first=heads_first, check_it=heads_first)  # fmt: skip
        for page, heads_first in itertools.product((16, 64), (False, True)):  # uniform long contexts
            attempt(
                "decode-layout uniform",
                decode_case,
                64,
                ctx,
                page,
                16,
                8,
                128,
                heads_first=heads_first,
                check_it=heads_first,
            )
    if "decode-fp8-tails" in kinds:  # float8 by token: single tilings against wide tiles with a narrow tail,
        # on the batches a run drains through (mixed lengths, longest first) and on uniform long contexts
        tilings = [(64, 0, 1), (64, 0, 2), (128, 0, 2), (128, 64, 1), (128, 64, 2), (256, 64, 2)]
        for mixed, batch in [(True, b) for b in batches] + [(False, b) for b in batches[::2]]:
            for (block_n, tail_n, num_warps), splits in itertools.product(tilings, (1, 2, 4, 8)):
                cfg = DecodeConfig(block_n, num_warps, 3, "fp16", tail_n=tail_n)
                attempt(f"decode-fp8-tails {cfg} splits {splits}", decode_case, batch, ctx // 2 if mixed else ctx,
                        16, 16, 8, 128, config=cfg, num_splits=splits, kv_dtype=FP8, mixed=mixed,
                        ordered=True)  # fmt: skip
    if "decode-fp8-spread" in kinds:  # float8 by token at the engine's split counts, one length to many
        spreads = (1.0, 0.75, 0.5, 0.25)  # the shortest context's part of the longest
        for context, shortest, batch in itertools.product((ctx // 2, ctx), spreads, batches[:5:2]):
            for block_n, tail_n, num_warps in ((64, 0, 1), (64, 0, 2), (64, 32, 1), (64, 32, 2)):
                cfg = DecodeConfig(block_n, num_warps, 3, "fp16", programs_per_sm=12, tail_n=tail_n)
                attempt(f"decode-fp8-spread {cfg}", decode_case, batch, context, 16, 16, 8, 128, config=cfg,
                        kv_dtype=FP8, shortest=shortest, ordered=True)  # fmt: skip
    if "splits" in kinds:
        for batch, choices in (
            (B, (1, 2)),
            (1, (1, 4, 8, 16, 32, 64)),
            (4, (1, 2, 4, 8, 16)),
            (16, (1, 2, 4)),
        ):
            for splits in choices:
                attempt(f"decode splits {splits}", decode_case, batch, ctx, 16, 16, 8, 128, num_splits=splits)
    if "prefill-fp8" in kinds:  # a chunk after as much context, over a float8 cache by token
        for block_m in (64, 128):
            for block_n in (32, 64, 128):
                for num_warps in (4, 8):
                    for num_stages in (2, 3, 4):
                        pcfg = PrefillConfig(block_m, block_n, num_warps, num_stages)
                        attempt(f"prefill-fp8 {pcfg}", prefill_case, T, T, 16, 32, 8, 128, config=pcfg,
                                kv_dtype=FP8)  # fmt: skip
    if "prefill-lengths" in kinds:  # single prompts and served steps: the default tiles against small ones
        small = (PrefillConfig(64, 32, 4, 2), PrefillConfig(64, 64, 4, 3))
        for Hq, T in itertools.product((16, 32), (24, 40) if env.smoke else (256, 512, 1024, 2048, 4096)):
            for pcfg in (None, *small):
                attempt(f"prefill-lengths {pcfg}", prefill_case, T, 0, 16, Hq, 8, 128, config=pcfg)
        for Hq, pcfg in itertools.product((16, 32), (None, *small)):
            attempt(f"prefill-lengths {pcfg}", prefill_case, step_tokens, 0, 16, Hq, 8, 128, config=pcfg,
                    prompts=prompts)  # fmt: skip
    if "prefill-prompts" in kinds:  # every tiling on a served prefill step (qwen3-0.6b's heads)
        for tiling in itertools.product((64, 128), (32, 64, 128), (4, 8), (2, 3)):
            pcfg = PrefillConfig(*tiling)
            attempt(f"prefill-prompts {pcfg}", prefill_case, step_tokens, 0, 16, 16, 8, 128, config=pcfg,
                    prompts=prompts)  # fmt: skip
    if "prefill" in kinds:
        for block_m in (64, 128):
            for block_n in (32, 64, 128):
                for num_warps in (4, 8):
                    for num_stages in (2, 3, 4):
                        pcfg = PrefillConfig(block_m, block_n, num_warps, num_stages)
                        attempt(f"prefill {pcfg}", prefill_case, T, 0, 16, 32, 8, 128, config=pcfg)
    return rows


def print_table(rows: list[Row]) -> None:
    head = (
        "kernel",
        "shape",
        "timing",
        "time (µs)",
        "GB/s",
        f"of {PEAK_BYTES_PER_S / 1e12:.2f} TB/s",
        "TFLOP/s",
        "max rel diff",
    )
    cells = [
        (r.kernel, r.shape, r.timing, f"{r.time_us:,.1f}", f"{r.gb_per_s:,.0f}", f"{r.frac_peak:.1%}",
         "" if r.tflops is None else f"{r.tflops:.1f}", "" if r.max_rel_diff is None else f"{r.max_rel_diff:.1e}")
        for r in rows
    ]  # fmt: skip
    widths = [max([len(h), *(len(c[i]) for c in cells)]) for i, h in enumerate(head)]
    fmt = lambda c: "  ".join(
        v.ljust(w) if i < 3 else v.rjust(w) for i, (v, w) in enumerate(zip(c, widths, strict=True))
    )
    print(fmt(head))
    print("  ".join("-" * w for w in widths))
    for c in cells:
        print(fmt(c))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", type=Path, help="write the result rows to this JSON file")
    parser.add_argument(
        "--tune", action="append", default=[], choices=["decode", "decode-balanced", "decode-fp8", "decode-fp8-mixed", "decode-batches", "decode-layout", "decode-ceiling", "decode-placement", "read-pattern", "decode-rows", "decode-fp8-tails", "decode-fp8-spread", "splits", "prefill", "prefill-fp8", "prefill-prompts", "prefill-lengths", "decode-slices"],
        help="first sweep tile configs (decode; over a float8 cache, decode-fp8 at the headline shape and "
        "decode-fp8-mixed at 256 mixed lengths, decode-batches at 16-256 with split counts, decode-layout: pages by token or by head; decode-ceiling: the pool read and only summed, against the engine's tiles and devtools/register_decode.py; decode-placement: a sequence's pages shuffled, in order or spread over a larger pool; read-pattern: a read of chunks of several sizes, in order or shuffled, alone or in K/V pairs; decode-rows: a program per sequence with all its heads, the read and the decode; prefill, prefill-fp8, prefill-prompts: a step of whole 100-1024-token prompts; prefill-lengths: default against small tiles by prompt length; decode-slices: slices sized per batch; decode-balanced: devtools/balanced_decode.py against the default) or split-KV counts (splits); "
        "repeatable, a few minutes each",
    )  # fmt: skip
    parser.add_argument(
        "--tune-only", action="store_true", help="with --tune: the sweeps alone, no other rows"
    )
    parser.add_argument(
        "--read-ceiling",
        action="store_true",
        help="only the read-only ceiling's rows (a read, a sum, a copy)",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny shapes on the CPU under TRITON_INTERPRET=1, to test this script",
    )
    parser.add_argument("--warmup-ms", type=int, default=50, help="do_bench warm-up, in milliseconds")
    parser.add_argument("--rep-ms", type=int, default=200, help="do_bench measuring time, in milliseconds")
    args = parser.parse_args()
    if not args.smoke and not torch.cuda.is_available():
        print("error: needs a CUDA GPU (or --smoke to exercise the script on the CPU)", file=sys.stderr)
        raise SystemExit(2)
    env = Env.pick(args.smoke, args.warmup_ms, args.rep_ms)
    torch.manual_seed(0)
    global PEAK_BYTES_PER_S
    PEAK_BYTES_PER_S, source = copy_peak(env.device)
    if not args.smoke:
        print(
            f"{torch.cuda.get_device_name()}  torch {torch.__version__}  copy ceiling "
            f"{PEAK_BYTES_PER_S / 1e12:.2f} TB/s ({source})",
            flush=True,
        )

    rows: list[Row] = []
    if args.tune:
        tuned = tune(env, args.tune)
        print_table(tuned)
        rows += tuned
    if args.tune and args.tune_only:
        main_rows: list[Row] = []
    elif args.read_ceiling:
        main_rows = (
            read_ceiling_case(env, 4096, block=64, steps=4) if args.smoke else read_ceiling_case(env, 1 << 30)
        )
    elif args.smoke:  # same code paths, shapes the interpreter finishes in seconds
        main_rows = small_kernels(env, 8, 64, 32, 4, 2, 64) + prologue_case(env, 3, 4, 2, 64)
        main_rows += read_ceiling_case(env, 4096, block=64, steps=4)
        main_rows += decode_case(env, 4, 100, 16, 4, 2, 64, with_ref_time=True)
        main_rows += decode_case(env, 1, 100, 8, 4, 2, 64)
        main_rows += decode_case(env, 5, 100, 8, 4, 2, 64, num_splits=2, mixed=True)
        main_rows += decode_case(env, 5, 100, 8, 4, 2, 64, split_tokens=32, mixed=True)
        main_rows += decode_case(env, 4, 100, 16, 4, 2, 64, kv_dtype=FP8)
        main_rows += decode_case(env, 4, 100, 16, 4, 2, 64, kv_dtype=FP8, v_as_k=True)
        main_rows += decode_case(env, 4, 100, 16, 4, 2, 64, kv_dtype=FP8, uniform=True)
        main_rows += decode_case(
            env, 4, 100, 16, 4, 2, 64, kv_dtype=FP8, config=DecodeConfig(32, 4, 2, "fp16")
        )
        main_rows += decode_case(env, 5, 100, 8, 4, 2, 64, num_splits=2, mixed=True, kv_dtype=FP8)
        main_rows += decode_case(env, 5, 100, 8, 4, 2, 64, mixed=True, ordered=True)
        main_rows += decode_case(env, 5, 100, 8, 4, 2, 64, mixed=True, ordered=True, heads_first=True)
        main_rows += prefill_case(env, 40, 0, 16, 4, 2, 64) + prefill_case(env, 20, 30, 16, 4, 2, 64)
        main_rows += prefill_case(env, 20, 30, 16, 4, 2, 64, kv_dtype=FP8)
        main_rows += prefill_case(env, 20, 30, 16, 4, 2, 64, kv_dtype=FP8, v_as_k=True)
        main_rows += prefill_case(env, 48, 0, 16, 4, 2, 64, prompts=(5, 20))
    else:
        main_rows = read_ceiling_case(env, 1 << 30)  # 2 GiB of bf16
        main_rows += small_kernels(env, T=8192, H=4096, inter=12288, Hq=32, Hk=8, D=128)
        for T in (1, 256, 8192):  # batch-1 decode, a large decode batch, a prefill chunk (Qwen3-0.6B heads)
            main_rows += prologue_case(env, T, 16, 8, 128)
        main_rows += decode_case(env, 64, 4096, 16, 16, 8, 128, with_ref_time=True)
        main_rows += decode_case(env, 64, 4096, 16, 16, 8, 128, kv_dtype=FP8)  # the same over a float8 cache
        main_rows += decode_case(
            env, 64, 4096, 16, 16, 8, 128, kv_dtype=FP8, uniform=True
        )  # as the engine takes it
        main_rows += decode_case(env, 64, 4096, 16, 16, 8, 128, kv_dtype=FP8, v_as_k=True)  # V laid out as K
        # the float8 tiles converted to bf16, in 64-token tiles: the form before the fp8 tuning
        main_rows += decode_case(env, 64, 4096, 16, 16, 8, 128, kv_dtype=FP8, config=DecodeConfig(64, 4, 3))
        main_rows += decode_case(env, 64, 4096, 128, 16, 8, 128)
        main_rows += decode_case(env, 64, 4096, 128, 16, 8, 128, kv_dtype=FP8)
        main_rows += decode_case(env, 1, 4096, 16, 16, 8, 128)
        main_rows += decode_case(env, 1, 4096, 16, 16, 8, 128, num_splits=1)  # what split-KV saves
        # A served batch: mixed lengths leave some programs long after the rest; do slices even them out?
        for splits in (None, 2, 4, 8):
            main_rows += decode_case(env, 200, 2048, 16, 16, 8, 128, num_splits=splits, mixed=True)
        main_rows += decode_case(env, 200, 2048, 16, 16, 8, 128, mixed=True, kv_dtype=FP8)
        main_rows += decode_case(env, 1, 4096, 16, 16, 8, 128, kv_dtype=FP8)
        for tokens in (256, 512, 1024):  # slices of a fixed length: long sequences get more of them
            main_rows += decode_case(env, 200, 2048, 16, 16, 8, 128, split_tokens=tokens, mixed=True)
        # or the longest first, so that the short ones fill in behind them (the engine's default)
        for batch in (64, 128, 200, 256):
            for ordered in (False, True):
                main_rows += decode_case(env, batch, 2048, 16, 16, 8, 128, mixed=True, ordered=ordered)
        main_rows += decode_case(env, 200, 2048, 16, 16, 8, 128, mixed=True, ordered=True, kv_dtype=FP8)
        main_rows += prefill_case(env, 2048, 0, 16, 32, 8, 128)  # Qwen3-8B heads
        main_rows += prefill_case(env, 8192, 0, 16, 16, 8, 128, prompts=(100, 1024))  # a served prefill step
        main_rows += prefill_case(env, 2048, 2048, 16, 32, 8, 128)  # a second chunk after a prefix
        main_rows += prefill_case(env, 2048, 2048, 16, 32, 8, 128, kv_dtype=FP8)
        main_rows += prefill_case(env, 2048, 2048, 16, 32, 8, 128, kv_dtype=FP8, v_as_k=True)
    rows += main_rows
    if main_rows:
        print()
        print_table(main_rows)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
