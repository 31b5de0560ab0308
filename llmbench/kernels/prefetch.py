"""A product's weights brought into L2 by the small kernel that runs before it.

qwen3-0.6b's decode-step products take 5-8 µs each on an H200 while reading their weights takes 1-3 µs
(BENCHMARKS.md, "The decode step's linear layers"): much of each is the wait for its first weights to
arrive from memory. Those weights depend on nothing the step computes, so the RMSNorm before q/k/v and
gate/up and the SiLU-and-multiply before the down projection, short kernels that leave memory idle, can
ask for them first: extra programs of their grid (``prefetch_launch``) each issue
``cp.async.bulk.prefetch.L2`` (Hopper's bulk prefetch: no registers, no wait, nothing returned) over
``CHUNK`` bytes of the weight, one span per thread, before the kernel waits on its inputs, and the product
then finds them in L2. A prefetch is a hint: it changes no value, and a line it missed is read from memory
as before. The output projection's weight is asked for by the decode attention kernel's last programs
(kernels/triton_decode.py), which the GPU starts as attention drains: asked for earlier, it would be
evicted by attention's reads of the KV cache. The skinny matmul (kernels/skinny_matmul.py), launched
before the kernel ahead of it has finished (programmatic dependent launch), asks for its own weight
rows the same way before it waits on its inputs.

Only where it can help and cannot hurt (``prefetchable``): a CUDA GPU of compute capability 9.0 or later,
not the interpreter; a contiguous, 16-byte aligned weight of at most half the L2 (``fits_l2``: a larger
one would evict its own first lines before the product reads them).
``prefetch_spans`` is the arithmetic of who fetches what, shared by the kernels and their test.
"""

from __future__ import annotations

from functools import cache

import torch

from llmbench.kernels._triton import cdiv, jit, runs_ptx, tl

CHUNK = 64 * 1024  # bytes a prefetching program asks for: 8 MB of q/k/v weights over 128 programs
ALIGN = 16  # the bulk prefetch's address and size granularity (bytes)


def fits_l2(nbytes: int, l2_bytes: int) -> bool:
    """Whether a weight of ``nbytes`` is prefetched into an L2 of ``l2_bytes``: at most half of it."""
    return 0 < nbytes <= l2_bytes // 2


@cache
def _bulk_prefetch_l2(device: torch.device) -> int:
    """The L2 of ``device`` where it has the bulk prefetch (compute capability 9.0, Hopper, or later), else 0."""
    props = torch.cuda.get_device_properties(device)
    return props.L2_cache_size if (props.major, props.minor) >= (9, 0) else 0


def prefetchable(weight: torch.Tensor) -> torch.Tensor | None:
    """``weight`` where a kernel may prefetch it into L2 (see the module's docstring), else None."""
    if not runs_ptx(weight):
        return None
    nbytes = weight.numel() * weight.element_size()
    aligned = weight.data_ptr() % ALIGN == 0 and nbytes % ALIGN == 0
    fits = fits_l2(nbytes, _bulk_prefetch_l2(weight.device))
    return weight if weight.is_contiguous() and aligned and fits else None


def prefetch_launch(weight: torch.Tensor | None, out: torch.Tensor, num_warps: int) -> tuple[int, dict]:
    """How a kernel writing ``out`` with ``num_warps`` warps a program prefetches ``weight`` (checked by
    ``prefetchable`` where it was chosen): (programs it adds to its grid, its arguments ``pf_ptr``,
    ``pf_bytes``, ``PREFETCH``, ``PF_CHUNK``, ``PF_LANES``). None, or a launch that cannot run the
    prefetch (the interpreter), adds nothing: a prefetch is a hint, and no value depends on it."""
    live = weight is not None and runs_ptx(out)
    nbytes = weight.numel() * weight.element_size() if live else 0
    args = {
        "pf_ptr": weight if live else out,  # a placeholder pointer without a prefetch
        "pf_bytes": nbytes,
        "PREFETCH": live,
        "PF_CHUNK": CHUNK,
        "PF_LANES": 32 * num_warps,
    }
    return cdiv(nbytes, CHUNK), args


@jit
def prefetch_spans(q, nbytes, chunk, LANES: tl.constexpr):
    # Chunk q (0-based) of the cdiv(nbytes, chunk) chunks of `chunk` bytes (a multiple of 16): each of LANES
    # threads takes the next cdiv(chunk, 16 LANES) x 16 bytes of [q chunk, min((q + 1) chunk, nbytes));
    # -> (byte offsets (LANES,) int64, sizes (LANES,) int32, 0 for a thread with nothing left). Offsets
    # and sizes stay multiples of 16 where nbytes is one.
    per = tl.cdiv(chunk, 16 * LANES) * 16
    first = q.to(tl.int64) * chunk
    start = first + tl.arange(0, LANES) * per
    end = tl.minimum(first + chunk, nbytes)
    size = tl.minimum(tl.maximum(end - start, 0), per).to(tl.int32)
    return start, size


@jit
def prefetch_l2(w_ptr, nbytes, q, chunk, LANES: tl.constexpr):
    # Chunk q of the weight at w_ptr (nbytes long) asked into L2; returns at once. LANES must be the
    # kernel's threads (32 x num_warps), so that each thread issues one span.
    start, size = prefetch_spans(q, nbytes, chunk, LANES)
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.gt.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r",
        [w_ptr.to(tl.pointer_type(tl.int8)) + start, size],
        dtype=tl.int32,
        is_pure=False,  # issued for its effect on the cache: kept although its result is unused
        pack=1,
    )
