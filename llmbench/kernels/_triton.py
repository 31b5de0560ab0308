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


def jit(fn: Callable[..., Any]) -> Any:
    return triton.jit(fn) if HAS_TRITON else fn


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
