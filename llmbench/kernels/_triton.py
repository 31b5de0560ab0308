"""Optional Triton import shared by the kernel modules.

Every kernel module must import without Triton (the torch references are always usable). Kernels are
decorated with ``jit``, which is ``triton.jit`` when Triton is installed and a no-op otherwise; each
Triton wrapper calls ``require_triton`` first, so a missing Triton is a clear error at call time and
never an ImportError at import time.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

import torch

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # the references still work; the Triton versions raise in require_triton
    triton = None
    tl = None
    HAS_TRITON = False


def jit(fn: Callable[..., Any] | None = None, *, do_not_specialize: tuple[str, ...] = ()) -> Any:
    """``triton.jit`` when Triton is installed, else the plain function.

    ``do_not_specialize`` names integer arguments that change from step to step (batch size, block-table
    width): Triton would otherwise compile a new variant the first time one of them is 1 or a multiple of
    16, and that compile (about a second) would land inside a measured step."""

    def wrap(f: Callable[..., Any]) -> Any:
        if not HAS_TRITON:
            return f
        return (
            triton.jit(f, do_not_specialize=list(do_not_specialize)) if do_not_specialize else triton.jit(f)
        )

    return wrap(fn) if fn is not None else wrap


# Programmatic dependent launch (EngineConfig.pdl; Hopper and later): the decode step's Triton kernels are
# launched so that each may start while the kernel before it runs. Every such kernel waits (``pdl_enter``)
# for the one before to finish before it touches memory; the latency-bound ones (norms, attention, its
# prologue, the fused all-reduce) let the next kernel launch at once, and the skinny matmul uses the wait
# to prefetch its weights into L2. Process-wide, set by the engine before it warms up.
_pdl = False


def set_pdl(on: bool) -> None:
    global _pdl
    _pdl = bool(on)


def pdl() -> bool:
    """Whether kernels launch with programmatic dependent launch (their ``PDL`` constexpr)."""
    return _pdl


def pdl_launch() -> dict[str, bool]:
    """The launch option that goes with ``PDL=pdl()``."""
    return {"launch_pdl": True} if _pdl else {}


def pdl_supported() -> str | None:
    """None when this Triton can launch with programmatic dependent launch, else why not."""
    if not HAS_TRITON:
        return "Triton is not installed"
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:
        return "this Triton has no CUDA backend"
    if "launch_pdl" not in getattr(CUDAOptions, "__dataclass_fields__", {}) or gdc_wait is None:
        return f"Triton {triton.__version__} has no programmatic dependent launch (launch_pdl, gdc_wait)"
    return None


if HAS_TRITON:
    try:
        from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
    except ImportError:  # an older Triton: pdl_supported() says so, and PDL stays False
        gdc_launch_dependents = gdc_wait = None

    @triton.jit
    def pdl_enter(PDL: tl.constexpr, LAUNCH_NEXT: tl.constexpr):
        """A kernel's first step under programmatic dependent launch: let the next kernel launch now
        (``LAUNCH_NEXT``), then wait until the kernel before has finished and its writes are visible."""
        if PDL:
            if LAUNCH_NEXT:
                gdc_launch_dependents()
            gdc_wait()

    @triton.jit
    def prefetch_l2(ptrs):
        """Ask for the 128-byte lines at ``ptrs`` to be brought into L2 (a hint: nothing waits for it)."""
        tl.inline_asm_elementwise(
            "prefetch.global.L2::evict_last [$1];\n mov.u32 $0, 0;",
            "=r,l",
            [ptrs],
            dtype=tl.int32,
            is_pure=False,
            pack=1,
        )
else:
    pdl_enter = prefetch_l2 = None


def require_triton(name: str) -> None:
    if not HAS_TRITON:
        raise RuntimeError(
            f"{name} needs Triton, which is not installed; install it (pip install 'llmbench[triton]') "
            f"or use the torch reference {name}_ref"
        )


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


@cache
def num_sms(device: torch.device) -> int:
    """Multiprocessors of a CUDA device; the CPU interpreter pretends to be an H200 (132)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132
