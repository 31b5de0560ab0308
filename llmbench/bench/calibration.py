"""Measuring this machine's peaks: device copy bandwidth and dense matmul throughput.

- copy bandwidth: a device-to-device copy of one buffer (1 GiB on a GPU, 256 MiB on a CPU), counted as
  the bytes read plus the bytes written (2 x its size) over its time;
- matmul throughput: an (n, n) @ (n, n) product, 2 n^3 FLOPs over its time: bf16 with n = 8192 on a GPU,
  float32 on a CPU with n chosen so that one product takes about a second.

Each figure is the median of ``repeats`` timings that follow ``warmup`` untimed runs; a GPU's are timed
by CUDA events (device time), a CPU's by the host clock. ``bench/peaks.py`` stores them and chooses
what runs divide by.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from llmbench.bench.peaks import CalibrationError, device_key

OnStep = Callable[[str, int, int], None]  # (what is measured, runs done, runs in all)

GPU_COPY_BYTES = 1 << 30
CPU_COPY_BYTES = 256 << 20
GPU_MATMUL_SIZE = 8192
CPU_MATMUL_SECONDS = 1.0
WARMUP = 3  # untimed runs first: clocks ramp up, cuBLAS picks its kernel, pages are touched


class Calibration(NamedTuple):
    key: dict[str, Any]  # what the figures are valid for (bench/peaks.py device_key)
    device: str
    mem_bandwidth: float  # bytes/s, read + written
    matmul_flops: float  # FLOP/s
    matmul_dtype: str
    matmul_size: int
    copy_bytes: int  # size of the copied buffer (each copy moves twice this)
    repeats: int
    measured_at: str
    copy_seconds: list[float]
    matmul_seconds: list[float]


def check_device(device: str) -> str:
    """``device`` normalised ("cuda" -> "cuda:0"); CalibrationError for one this machine does not have."""
    import torch

    if device == "cpu":
        return device
    kind, _, index = device.partition(":")
    if kind != "cuda" or (index and not index.isdigit()):
        raise CalibrationError(f"Unsupported device: {device!r}. Supported: cpu, cuda, cuda:N")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise CalibrationError(
            f"device {device!r}: torch sees no CUDA device on this machine (try --device cpu)"
        )
    n = int(index or 0)
    if n >= count:
        have = ", ".join(f"cuda:{i}" for i in range(count))
        raise CalibrationError(f"device {device!r} does not exist: this machine has {count} ({have})")
    return f"cuda:{n}"


def _timings(
    fn: Callable[[], Any], device: str, warmup: int, repeats: int, what: str, on_step: OnStep
) -> list[float]:
    import torch

    cuda = device.startswith("cuda")
    total = warmup + repeats
    for i in range(warmup):
        fn()
        on_step(what, i + 1, total)
    if cuda:
        torch.cuda.synchronize(device)
    out = []
    for i in range(repeats):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
        on_step(what, warmup + i + 1, total)
    return out


def _copy_timings(device: str, nbytes: int, warmup: int, repeats: int, on_step: OnStep) -> list[float]:
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(1)  # touched: no lazy pages timed
    dst = torch.empty_like(src)
    return _timings(lambda: dst.copy_(src), device, warmup, repeats, "device copy", on_step)


def _matmul_timings(
    device: str, n: int, dtype: Any, warmup: int, repeats: int, on_step: OnStep
) -> list[float]:
    import torch

    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    c = torch.empty(n, n, dtype=dtype, device=device)
    return _timings(lambda: torch.mm(a, b, out=c), device, warmup, repeats, "matmul", on_step)


def cpu_matmul_size(seconds: float = CPU_MATMUL_SECONDS) -> int:
    """The n whose float32 (n, n) product takes about ``seconds`` here, from a timed 512 one."""
    import torch

    a = torch.randn(512, 512)
    a @ a
    t0 = time.perf_counter()
    a @ a
    rate = 2 * 512**3 / max(time.perf_counter() - t0, 1e-6)
    n = int((rate * seconds / 2) ** (1 / 3)) // 64 * 64
    return max(256, min(n, GPU_MATMUL_SIZE))


def calibrate(
    device: str,
    *,
    copy_bytes: int | None = None,
    matmul_size: int | None = None,
    repeats: int | None = None,
    warmup: int = WARMUP,
    on_step: OnStep | None = None,
) -> Calibration:
    """Measure ``device`` (see the module docstring); sizes default by device kind."""
    import torch

    device = check_device(device)
    cuda = device.startswith("cuda")
    copy_bytes = copy_bytes or (GPU_COPY_BYTES if cuda else CPU_COPY_BYTES)
    repeats = repeats or (20 if cuda else 5)
    step = on_step or (lambda what, done, total: None)
    dtype = torch.bfloat16 if cuda else torch.float32
    if cuda:
        torch.cuda.set_device(device)
    try:
        copy_s = _copy_timings(device, copy_bytes, warmup, repeats, step)
        n = matmul_size or (GPU_MATMUL_SIZE if cuda else cpu_matmul_size())
        matmul_s = _matmul_timings(device, n, dtype, warmup, repeats, step)
    except torch.OutOfMemoryError:
        raise CalibrationError(
            f"not enough memory on {device} for the buffers (lower --copy-mib or --matmul-size)"
        ) from None
    return Calibration(
        key=device_key(device),
        device=device,
        mem_bandwidth=2 * copy_bytes / float(np.median(copy_s)),
        matmul_flops=2 * n**3 / float(np.median(matmul_s)),
        matmul_dtype=str(dtype).removeprefix("torch."),
        matmul_size=n,
        copy_bytes=copy_bytes,
        repeats=repeats,
        measured_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        copy_seconds=copy_s,
        matmul_seconds=matmul_s,
    )
