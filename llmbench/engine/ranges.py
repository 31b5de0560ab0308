"""Named ranges over the engine's phases, for torch.profiler and Nsight Systems.

``with phase("schedule"):`` marks one phase of a step as ``llmbench.schedule``; ``step_range()`` marks a
whole ``LLMEngine.step()`` (or a tensor-parallel rank's share of it) as ``llmbench.step``. The phases are
those of ``PHASES``: schedule, build_inputs, copy_to_device, tp_send, forward or graph_replay, sample,
copy_to_host, bookkeeping.

The ranges are always in the code and cost almost nothing when nobody records: a torch.profiler range
(``record_function``, about 8 us a range on a CPU even with no profiler running) is opened only while
a torch.profiler recording is active in this process (torch's own flag, one attribute read), and an NVTX
range only on CUDA when an NVTX tool is attached (Nsight Systems and Nsight Compute set
``NVTX_INJECTION64_PATH`` in the process they start). Otherwise ``phase`` hands back one shared object
whose enter and exit do nothing.

While a torch.profiler recording records, ``tag_layers`` also marks the layers whose kernels cannot be told
apart by name (a norm done with plain torch ops launches the same elementwise kernels as an activation):
``llmbench.layer.norm``, ``.rotary``, ``.activation``, ``.embedding``, ``.attention``. It hooks the
modules from outside, only while it records, and never under torch.compile (hooks would be traced into
the compiled graphs and force recompiles).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
import torch.autograd.profiler as _autograd_profiler
from torch import nn

PREFIX = "llmbench."
STEP = PREFIX + "step"
PHASES = (
    "schedule",
    "build_inputs",
    "copy_to_device",
    "tp_send",
    "forward",
    "graph_replay",
    "sample",
    "copy_to_host",
    "bookkeeping",
)
LAYER_PREFIX = PREFIX + "layer."

_nvtx = False  # set by enable_nvtx: an NVTX tool is attached and the engine runs on CUDA


def enable_nvtx(device: torch.device) -> None:
    """Emit NVTX ranges from now on if ``device`` is CUDA and an NVTX tool is attached. Some CUDA images
    point the variable at CUPTI itself, which is no viewer: a range would make CUPTI the NVTX handler and
    leave torch.profiler without its CUDA activity, so that case counts as no tool."""
    global _nvtx
    tool = os.environ.get("NVTX_INJECTION64_PATH", "")
    _nvtx = device.type == "cuda" and bool(tool) and "libcupti" not in os.path.basename(tool)


class _Range:
    __slots__ = ("name", "_record")

    def __init__(self, name: str) -> None:
        self.name = name
        self._record: _autograd_profiler.record_function | None = None

    def __enter__(self) -> None:
        if _autograd_profiler._is_profiler_enabled:
            self._record = _autograd_profiler.record_function(self.name)
            self._record.__enter__()
        if _nvtx:
            torch.cuda.nvtx.range_push(self.name)

    def __exit__(self, *exc: object) -> None:
        if _nvtx:
            torch.cuda.nvtx.range_pop()
        if self._record is not None:
            self._record.__exit__(None, None, None)
            self._record = None


class _Off:
    """The range when nothing records: nothing to open or close."""

    __slots__ = ()

    def __enter__(self) -> None:
        pass

    def __exit__(self, *exc: object) -> None:
        pass


OFF = _Off()


def recording() -> bool:
    """Whether a range opened now would be seen (a torch.profiler recording, or an NVTX tool)."""
    return _autograd_profiler._is_profiler_enabled or _nvtx


def phase(name: str) -> _Range | _Off:
    """The range of one phase of a step (``name`` from PHASES)."""
    if _autograd_profiler._is_profiler_enabled or _nvtx:
        return _Range(PREFIX + name)
    return OFF


def step_range() -> _Range | _Off:
    if _autograd_profiler._is_profiler_enabled or _nvtx:
        return _Range(STEP)
    return OFF


def tag_layers(model: nn.Module) -> Callable[[], None]:
    """Mark the layers named in the module docstring with ranges; returns the function that unmarks them."""
    from llmbench.layers.activation import SiluAndMul
    from llmbench.layers.attention.layer import Attention
    from llmbench.layers.embedding import VocabParallelEmbedding
    from llmbench.layers.norm import RMSNorm
    from llmbench.layers.rotary import RotaryEmbedding

    tags: list[tuple[type, str]] = [
        (RMSNorm, "norm"),
        (RotaryEmbedding, "rotary"),
        (SiluAndMul, "activation"),
        (VocabParallelEmbedding, "embedding"),
    ]
    open_ranges: list[_autograd_profiler.record_function] = []

    def entering(name: str):
        def pre(module: nn.Module, args: object) -> None:
            record = _autograd_profiler.record_function(name)
            record.__enter__()
            open_ranges.append(record)

        return pre

    def leaving(module: nn.Module, args: object, output: object) -> None:
        if open_ranges:
            open_ranges.pop().__exit__(None, None, None)

    handles = []
    backends = {}
    for module in model.modules():
        for cls, tag in tags:
            if isinstance(module, cls):
                handles.append(module.register_forward_pre_hook(entering(LAYER_PREFIX + tag)))
                handles.append(module.register_forward_hook(leaving))
                break
        if isinstance(module, Attention):
            backends[id(module.backend)] = module.backend
    # The attention backend is a plain object shared by every layer (the projections around it are
    # GEMMs of their own): its entry points are wrapped on the instance and put back afterwards.
    wrapped: list[tuple[object, str]] = []
    for backend in backends.values():
        for attr in ("forward", "forward_qkv"):
            if hasattr(backend, attr) and attr not in vars(backend):
                setattr(backend, attr, _in_range(LAYER_PREFIX + "attention", getattr(backend, attr)))
                wrapped.append((backend, attr))

    def untag() -> None:
        for handle in handles:
            handle.remove()
        for backend, attr in wrapped:
            delattr(backend, attr)
        while open_ranges:  # a forward that raised left its range open
            open_ranges.pop().__exit__(None, None, None)

    return untag


def _in_range(name: str, fn: Callable) -> Callable:
    def inner(*args, **kwargs):
        with _autograd_profiler.record_function(name):
            return fn(*args, **kwargs)

    return inner
