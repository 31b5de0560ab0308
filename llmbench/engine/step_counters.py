"""Counters read at the start and end of every step, so that a slow step can say what happened in it.

- Triton compilations (a kernel variant compiled, or loaded from Triton's cache, on first use): counted
  by Triton's JIT post-compile hook, installed once per process and chained to any hook already there.
  Kernels that run under ``TRITON_INTERPRET=1`` are never compiled, so the count stays 0 there.
- CUDA Graph captures (``note_graph_capture``, called by the graph runner).
- garbage collection: seconds spent in Python's collector (``gc.callbacks``), all generations.
- allocator growth: on CUDA the device memory in use (``cudaMemGetInfo``, a driver call that does not
  synchronise; the caching allocator's own statistics are built as a Python dict on every read, far too
  slow for every step); on a CPU the process's resident set (``/proc/self/statm``, or psutil elsewhere).

The memory is read once a step (a few microseconds: ``devtools/bench_ranges.py`` prints it); the other
counters are plain numbers kept in this module. torch.compile recompiles are counted by the model runner
(Dynamo's own counter).
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable
from typing import NamedTuple

import torch

from llmbench.engine.outputs import StepStats


class Snapshot(NamedTuple):
    triton_compiles: int
    graph_captures: int
    recompiles: int
    gc_time: float
    memory: int  # bytes: device memory in use (CUDA) or resident set (CPU)


class _Totals:
    triton_compiles = 0
    graph_captures = 0
    gc_time = 0.0
    gc_started = 0.0


_totals = _Totals()
_installed = False


def _on_gc(phase: str, info: dict) -> None:
    if phase == "start":
        _totals.gc_started = time.perf_counter()
    elif _totals.gc_started:
        _totals.gc_time += time.perf_counter() - _totals.gc_started
        _totals.gc_started = 0.0


def note_graph_capture() -> None:
    _totals.graph_captures += 1


def note_triton_compile() -> None:
    """One Triton kernel variant compiled (what the JIT hook calls; tests call it to fake one)."""
    _totals.triton_compiles += 1


def install() -> None:
    """Hook Triton's JIT and the garbage collector (once per process)."""
    global _installed
    if _installed:
        return
    _installed = True
    gc.callbacks.append(_on_gc)
    try:
        from triton import knobs
    except ImportError:  # no Triton (or one without knobs): nothing of ours is compiled by it
        return
    previous = knobs.runtime.jit_post_compile_hook

    def on_compile(*args, **kwargs):
        note_triton_compile()
        return previous(*args, **kwargs) if previous is not None else None

    knobs.runtime.jit_post_compile_hook = on_compile


class MemoryReader:
    """The number allocator growth is read from, for one device."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.device = device
        self._statm: int | None = None
        self._page = 4096
        if not self.cuda:
            try:
                self._statm = os.open("/proc/self/statm", os.O_RDONLY)
                self._page = os.sysconf("SC_PAGE_SIZE")
            except (OSError, ValueError, AttributeError):
                self._statm = None

    def __call__(self) -> int:
        if self.cuda:
            free, total = torch.cuda.mem_get_info(self.device)
            return total - free
        if self._statm is not None:
            fields = os.pread(self._statm, 128, 0).split()
            return int(fields[1]) * self._page
        import psutil

        return psutil.Process().memory_info().rss


class StepCounters:
    """Reads the counters where a step's time starts (``read``) and writes the differences into its stats
    where it ends (``fill``, which returns the counters then: under asynchronous scheduling one step's end
    is where the next one's time starts). Memory is read once a step, at its end (it is the one read that
    costs microseconds): a step's growth is counted from the end of the step before."""

    def __init__(self, device: torch.device, recompiles: Callable[[], int]) -> None:
        install()
        self.memory = MemoryReader(device)
        self.recompiles = recompiles
        self._memory = self.memory()

    def read(self) -> Snapshot:
        t = _totals
        return Snapshot(t.triton_compiles, t.graph_captures, self.recompiles(), t.gc_time, self._memory)

    def fill(self, stats: StepStats, before: Snapshot) -> Snapshot:
        """Write what changed since ``before`` into ``stats``; return the counters now."""
        self._memory = self.memory()
        now = self.read()
        stats.triton_compiles = now.triton_compiles - before.triton_compiles
        stats.graph_captures = now.graph_captures - before.graph_captures
        stats.recompiles = now.recompiles - before.recompiles
        stats.memory_growth = now.memory - before.memory
        stats.gc_time = now.gc_time - before.gc_time
        return now
