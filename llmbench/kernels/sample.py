"""The sampling draw: one token id per row, by the Gumbel-max (exponential race) over a row's logits.

Row r with ``scale[r] > 0`` samples from softmax(logits / T) over the tokens whose logit is at least
``threshold[r]`` (the top-k / top-p / min-p cut, ``engine/sampler.py``), where ``scale = log2(e) / T``:

    id = argmax_v  logits_v * scale - log2(-log2(U_v))      over v with logits_v >= threshold

which is argmax_v (logits_v / T - log E_v) with E_v = -ln U_v ~ Exp(1), rescaled by log2(e) (a positive
factor and a constant shift change no argmax). A row with ``scale[r] == 0`` is greedy: the argmax of its
raw logits, cut ignored. Ties go to the lowest index, as ``torch.argmax``.

U_v comes from a counter-based generator, a hash of (the request's seed key, the position of the token
in the request, v): the same request draws the same token whatever else is in the batch, whichever
step or process computes it. The hash works on uint32 lanes (``mix32``: the "lowbias32" integer
finaliser, two multiplies and three xor-shifts), written three times below (Triton, torch on int64,
Python ints) with identical results: the kernel and its reference see bit-identical uniforms, and the
host can fold a Python seed the same way.

``sample_ref`` is plain torch; ``sample`` is the Triton version with the same signature (programs over
(row, slice of the vocabulary), each keeping an online max/argmax; a second small kernel picks each
row's winner among its slices, which is exact whatever the number of slices).

The draw is arithmetic-bound, not memory-bound: per logit two hashes and two log2, against 2 bytes read.
``SampleConfig.fast_log2`` computes the logs with the GPU's one-instruction ``lg2.approx`` (absolute error
about 2^-22) instead of libdevice's accurate log2 (a dozen fused multiply-adds). The inner log, -log2(u),
must be accurate relative to itself where it is tiny (u near 1: the largest noises, the likely winners),
where ``lg2.approx`` is not: there (1 - u < 2^-6) it is the series of -log2(1 - w) in w = 1 - u, exact in
float32, to w^4 (relative error below 2^-26). The outer log only needs an absolute error small against
the scores'. Draws then differ from the reference's only where two scores tie to within rounding.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from llmbench.kernels._triton import (
    cdiv,
    jit,
    num_sms,
    programmatic,
    require_triton,
    runs_ptx,
    tl,
    wait_for_inputs,
)

MASK32 = 0xFFFFFFFF
GOLDEN = 0x9E3779B9  # 2^32 / golden ratio: offsets the inputs so that 0 does not hash to 0
_M1, _M2 = 0x7FEB352D, 0x846CA68B  # lowbias32's multipliers
_TWO_POW_M24 = 2.0**-24
# The reference works on this many logits at a time (about 150 MB of temporaries, as much as the model
# runner's peak-memory profile allows for the float copy of a step's logits).
REF_CHUNK_ELEMENTS = 1 << 22
# The draw's per-row arguments: rows of the (4, N) settings and (2, N) keys a step uploads, at offsets that
# follow N (engine/sampler.py), so never specialised on alignment.
ROW_POINTERS = ("scale_ptr", "thr_ptr", "key_ptr", "pos_ptr")


def mix32_int(x: int) -> int:
    """``mix32`` on a Python int (host side)."""
    x &= MASK32
    x ^= x >> 16
    x = (x * _M1) & MASK32
    x ^= x >> 15
    x = (x * _M2) & MASK32
    return x ^ (x >> 16)


def seed_key(seed: int) -> int:
    """A request seed (any Python int) folded to the 32-bit key the draw uses."""
    s = seed % 2**64
    return mix32_int((s & MASK32) ^ mix32_int((s >> 32) + GOLDEN))


def _mix32_torch(x: torch.Tensor) -> torch.Tensor:
    # x: int64 holding uint32 values. Products overflow int64 and wrap, but their low 32 bits, which
    # are all that is kept, are exact.
    x = x ^ (x >> 16)
    x = (x * _M1) & MASK32
    x = x ^ (x >> 15)
    x = (x * _M2) & MASK32
    return x ^ (x >> 16)


def uniforms_ref(seed_keys: torch.Tensor, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """(N, vocab) float32 uniforms in (0, 1) for rows keyed by (seed key, position)."""
    ka = _mix32_torch((seed_keys & MASK32) ^ _mix32_torch((positions + GOLDEN) & MASK32))  # (N,)
    kb = _mix32_torch((ka + GOLDEN) & MASK32)
    v = torch.arange(vocab, device=seed_keys.device, dtype=torch.int64)
    h = _mix32_torch((_mix32_torch(v[None, :] ^ ka[:, None]) + kb[:, None]) & MASK32)  # (N, V)
    # 23 random bits as the odd numerator (2j + 1) / 2^24: exact in float32, never 0 or 1.
    return ((h >> 9) * 2 + 1).to(torch.float32) * _TWO_POW_M24


def sample_ref(
    logits: torch.Tensor,  # (N, V), any float dtype
    scale: torch.Tensor,  # (N,) float32: log2(e) / temperature; 0 = greedy
    threshold: torch.Tensor | None,  # (N,) float32: keep logits >= threshold; None = no cut
    seed_keys: torch.Tensor,  # (N,) int64 holding uint32 keys
    positions: torch.Tensor,  # (N,) int64: position of the sampled token in its request
    out: torch.Tensor | None = None,  # (N,) int64 to write the ids into (a graph's fixed buffer)
) -> torch.Tensor:
    """(N,) int64 token ids."""
    if out is not None:
        return out.copy_(sample_ref(logits, scale, threshold, seed_keys, positions))
    rows = max(1, REF_CHUNK_ELEMENTS // max(1, logits.shape[-1]))
    if logits.shape[0] > rows:  # a few rows at a time: its (rows, V) temporaries stay small
        return torch.cat([
            sample_ref(logits[i : i + rows], scale[i : i + rows],
                       None if threshold is None else threshold[i : i + rows],
                       seed_keys[i : i + rows], positions[i : i + rows])
            for i in range(0, logits.shape[0], rows)
        ])  # fmt: skip
    x = logits.float()  # (N, V): exact upcast
    u = uniforms_ref(seed_keys, positions, x.shape[-1])
    noisy = x * scale[:, None] - torch.log2(-torch.log2(u))
    if threshold is not None:
        noisy = noisy.masked_fill(x < threshold[:, None], float("-inf"))
    greedy = (scale == 0)[:, None]
    return torch.where(greedy, x, noisy).argmax(dim=-1)


@jit
def mix32(x):
    """lowbias32 on uint32 lanes."""
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x846CA68B
    return x ^ (x >> 16)


@jit
def _lg2(x, APPROX: tl.constexpr):
    """log2 of float32 lanes: the GPU's approximate instruction where ``APPROX``, else ``tl.log2``."""
    if APPROX:
        return tl.inline_asm_elementwise(
            "lg2.approx.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        return tl.log2(x)


@jit
def _neg_log2_uniform(u, SERIES: tl.constexpr, APPROX: tl.constexpr):
    """-log2(u) for u in (0, 1); with ``SERIES``, near 1 from a series that an approximate log2 cannot
    spoil (``tl.log2`` is accurate there by itself)."""
    if SERIES:
        w = 1.0 - u  # exact: u is an odd multiple of 2^-24
        # -log2(1 - w) = (w + w^2/2 + w^3/3 + w^4/4 + ...) / ln 2
        series = w * (1.0 + w * (0.5 + w * (0.3333333432674408 + w * 0.25))) * 1.4426950408889634
        return tl.where(w < 0.015625, series, -_lg2(u, APPROX))
    else:
        return -_lg2(u, APPROX)


@jit(do_not_specialize=("V", "stride", "blocks_per_prog"), unaligned=ROW_POINTERS)
def _sample_kernel(
    logits_ptr, scale_ptr, thr_ptr, key_ptr, pos_ptr, best_ptr, idx_ptr,
    V, stride, blocks_per_prog,
    HAS_CUT: tl.constexpr, SPLIT: tl.constexpr, BLOCK: tl.constexpr,
    FAST_LOG2: tl.constexpr, LG2_ASM: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    wait_for_inputs(PDL)
    # Grid (N, S): program (r, s) covers blocks [s * blocks_per_prog, (s + 1) * blocks_per_prog) of row r.
    row = tl.program_id(0).to(tl.int64)
    part = tl.program_id(1)
    scale = tl.load(scale_ptr + row)
    thr = tl.full((), float("-inf"), tl.float32)
    if HAS_CUT:
        thr = tl.load(thr_ptr + row)
    key = tl.load(key_ptr + row).to(tl.uint32)
    pos = tl.load(pos_ptr + row).to(tl.uint32)
    ka = mix32(key ^ mix32(pos + 0x9E3779B9))
    kb = mix32(ka + 0x9E3779B9)
    # Each lane keeps its own best across the blocks (no reduction inside the loop, so the loads of one
    # block overlap the arithmetic of the last); the lanes are reduced once at the end.
    first = part * blocks_per_prog * BLOCK
    lanes = first + tl.arange(0, BLOCK)  # (BLOCK,)
    best_lane = tl.full((BLOCK,), float("-inf"), tl.float32)
    best_col = lanes
    for b in range(0, blocks_per_prog):
        cols = lanes + b * BLOCK
        inside = cols < V
        x = tl.load(logits_ptr + row * stride + cols, mask=inside, other=float("-inf")).to(tl.float32)
        if scale != 0:
            h = mix32(mix32(cols.to(tl.uint32) ^ ka) + kb)
            u = ((h >> 9) * 2 + 1).to(tl.float32) * 5.9604644775390625e-08  # 2^-24
            s = x * scale - _lg2(_neg_log2_uniform(u, FAST_LOG2, LG2_ASM), LG2_ASM)
            s = tl.where(inside & (x >= thr), s, float("-inf"))
        else:
            s = x
        better = s > best_lane  # strictly: a lane keeps its earliest column of a tie
        best_col = tl.where(better, cols, best_col)
        best_lane = tl.where(better, s, best_lane)
    best = tl.max(best_lane, axis=0)
    # the lowest column holding the maximum: the first of a tie, as one pass over the row would find it
    best_idx = tl.min(tl.where(best_lane == best, best_col, V), axis=0).to(tl.int64)
    if SPLIT:
        n_parts = tl.num_programs(1)
        tl.store(best_ptr + row * n_parts + part, best)
        tl.store(idx_ptr + row * n_parts + part, best_idx)
    else:
        tl.store(idx_ptr + row, best_idx)


@jit(do_not_specialize=("n_parts",))
def _pick_kernel(best_ptr, idx_ptr, out_ptr, n_parts, BLOCK_S: tl.constexpr, PDL: tl.constexpr = False):
    wait_for_inputs(PDL)
    # One program per row: the first slice holding the row's maximum has the lowest index of it.
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_S)
    b = tl.load(best_ptr + row * n_parts + offs, mask=offs < n_parts, other=float("-inf"))
    j = tl.argmax(b, axis=0, tie_break_left=True)
    tl.store(out_ptr + row, tl.load(idx_ptr + row * n_parts + j))


MAX_PARTS = 128  # programs per row at most (one compiled variant of the pick kernel)


class SampleConfig(NamedTuple):
    """Launch config of the draw; the defaults were tuned on an H200 with devtools/bench_sampler.py --tune
    (256 rows x 151,936 bf16 logits at temperature 0.6: 100 µs against 185 µs for 4 warps, 2 programs a
    multiprocessor and the accurate log2; one row 9.7 µs)."""

    block: int = 1024  # logits per program per loop step
    num_warps: int = 8
    programs_per_sm: int = 16  # a row is cut into slices until the programs number this per multiprocessor
    # the GPU's approximate log2 (module docstring); under the interpreter tl.log2 with the same series
    fast_log2: bool = True


DEFAULT_CONFIG = SampleConfig()


def sample(
    logits: torch.Tensor,
    scale: torch.Tensor,
    threshold: torch.Tensor | None,
    seed_keys: torch.Tensor,
    positions: torch.Tensor,
    config: SampleConfig = DEFAULT_CONFIG,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Triton version of ``sample_ref``: one read of the logits, nothing of size (N, V) written."""
    require_triton("sample")
    N, V = logits.shape
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    if out is None:
        out = torch.empty(N, dtype=torch.int64, device=logits.device)
    if N == 0:
        return out
    blocks = cdiv(V, config.block)
    # Enough programs to fill the device when rows are few (one row alone still reads V elements).
    wanted = cdiv(config.programs_per_sm * num_sms(logits.device), N)
    parts = max(1, min(blocks, wanted, MAX_PARTS))
    per_prog = cdiv(blocks, parts)
    parts = cdiv(blocks, per_prog)
    split = parts > 1
    best = torch.empty((N, parts), dtype=torch.float32, device=logits.device) if split else out
    idx = torch.empty((N, parts), dtype=torch.int64, device=logits.device) if split else out
    scale, seed_keys, positions = scale.contiguous(), seed_keys.contiguous(), positions.contiguous()
    thr = threshold.contiguous() if threshold is not None else scale  # never read without HAS_CUT
    _sample_kernel[(N, parts)](
        logits, scale, thr, seed_keys, positions, best, idx,
        V, logits.stride(0), per_prog,
        HAS_CUT=threshold is not None, SPLIT=split, BLOCK=config.block, num_warps=config.num_warps,
        FAST_LOG2=config.fast_log2, LG2_ASM=config.fast_log2 and runs_ptx(logits),
        enable_fp_fusion=False,  # x * scale rounded before the subtraction, as the reference does
        **programmatic(logits, N),
    )  # fmt: skip
    if split:
        _pick_kernel[(N,)](best, idx, out, parts, BLOCK_S=MAX_PARTS, **programmatic(best, N))
    return out
