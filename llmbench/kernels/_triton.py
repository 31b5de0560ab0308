"""Optional Triton import shared by the kernel modules.

Every kernel module must import without Triton (the torch references are always usable). Kernels are
decorated with ``jit``, which is ``triton.jit`` when Triton is installed and a no-op otherwise; each
Triton wrapper calls ``require_triton`` first, so a missing Triton is a clear error at call time and
never an ImportError at import time.

Programmatic dependent launch (``set_programmatic_launch``): on Hopper and later a kernel may be launched
before the one ahead of it in the stream has finished, so that its programs are placed on the
multiprocessors while that one drains, and wait inside (``wait_for_inputs``, the first thing every
kernel that takes it does) until its inputs are written. A kernel launched this way must call
``wait_for_inputs`` before it reads or writes anything, in every program; the kernels here that take it do
so on their first line.
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
    try:
        from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

        HAS_GDC = True
    except ImportError:  # an older Triton: kernels are launched the ordinary way
        gdc_launch_dependents = gdc_wait = None
        HAS_GDC = False
except ImportError:  # the references still work; the Triton versions raise in require_triton
    triton = None
    tl = None
    HAS_TRITON = False
    HAS_GDC = False


def jit(
    fn: Callable[..., Any] | None = None,
    *,
    do_not_specialize: tuple[str, ...] = (),
    unaligned: tuple[str, ...] = (),
) -> Any:
    """``triton.jit`` when Triton is installed, else the plain function.

    ``do_not_specialize`` names integer arguments that change from step to step (batch size, block-table
    width): Triton would otherwise compile a new variant the first time one of them is 1 or a multiple of
    16, and that compile (about a second) would land inside a measured step. ``unaligned`` names pointer
    arguments that may point into the middle of a buffer (the rows of a step's upload, whose offsets
    follow the number of rows): Triton would compile a variant for each alignment to 16 bytes they come
    with. (A Triton without ``do_not_specialize_on_alignment`` still specialises them.)"""

    def wrap(f: Callable[..., Any]) -> Any:
        if not HAS_TRITON:
            return f
        options: dict[str, Any] = {}
        if do_not_specialize:
            options["do_not_specialize"] = list(do_not_specialize)
        if unaligned and aligns_on_request():
            options["do_not_specialize_on_alignment"] = list(unaligned)
        return triton.jit(f, **options)

    return wrap(fn) if fn is not None else wrap


@cache
def aligns_on_request() -> bool:
    """Whether this Triton can leave a pointer's alignment out of a kernel's specialisation."""
    import inspect

    return "do_not_specialize_on_alignment" in inspect.signature(triton.jit).parameters


_programmatic_rows = 0  # set_programmatic_launch: this process's CUDA launches from now on


def set_programmatic_launch(max_rows: int) -> None:
    """Launch the kernels that take it (``programmatic``) over up to ``max_rows`` rows (tokens,
    sequences) with programmatic dependent launch from now on; 0: none. The engine sets it before each
    step and before capturing its CUDA Graphs, which keep what their launches were."""
    global _programmatic_rows
    _programmatic_rows = int(max_rows) if HAS_GDC else 0


def programmatic(t: torch.Tensor, rows: int) -> dict[str, bool]:
    """A launch's extra arguments: programmatic dependent launch for a kernel over ``rows`` rows where it
    is on for that many and the launch is on an NVIDIA GPU, nothing otherwise (the interpreter cannot run
    it). ``PDL`` is always given: torch.compile's inductor launches a user kernel with the arguments it
    was called with, and a constexpr left at its default has it build a launcher with one too few."""
    return (
        {"PDL": True, "launch_pdl": True}
        if 0 < rows <= _programmatic_rows and runs_ptx(t)
        else {"PDL": False}
    )


@jit
def wait_for_inputs(PDL: tl.constexpr):
    # Under programmatic dependent launch: wait until the kernel before has finished and its writes are
    # visible, then let the kernel after be launched (it waits in turn). Nothing without it.
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


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


def runs_ptx(t: torch.Tensor) -> bool:
    """Whether a kernel launched on ``t`` can run inline PTX: an NVIDIA GPU, not the CPU interpreter
    (or ROCm)."""
    return t.device.type == "cuda" and torch.version.hip is None


def out_like(q: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """A kernel's output: ``out`` where the caller gives one (checked to be like ``q``), else a fresh one."""
    if out is None:
        return torch.empty_like(q, memory_format=torch.contiguous_format)
    if out.shape != q.shape or out.dtype != q.dtype or out.device != q.device or out.stride(-1) != 1:
        raise ValueError(
            f"out must have q's shape {tuple(q.shape)} and dtype {q.dtype}, contiguous in its last dimension; "
            f"got {tuple(out.shape)} {out.dtype} with strides {out.stride()}"
        )
    return out
