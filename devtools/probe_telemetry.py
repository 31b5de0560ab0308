"""What each telemetry reading costs, and which of them holds up the GPU work running beside it.

First each reading alone: the median and largest time of every NVML query the telemetry sampler makes,
and of torch's memory counters and psutil's. Then a stand-in for a decode loop: a CUDA graph of small
kernels (about ``--step-us`` of GPU work) replayed and synchronised back to back for ``--seconds``, once
with nothing beside it, then once per reading with a thread taking that reading every ``--period-ms``
(as the sampler does), and once with all of them. A reading that holds up the loop shows in the loop's
step-time percentiles.

    python devtools/probe_telemetry.py                 # CUDA GPU 0
    python devtools/probe_telemetry.py --period-ms 200
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing


def readings(handle, pynvml, device: torch.device) -> dict[str, Callable[[], object]]:
    import psutil

    proc = psutil.Process()
    return {
        "utilization": lambda: pynvml.nvmlDeviceGetUtilizationRates(handle),
        "memory info": lambda: pynvml.nvmlDeviceGetMemoryInfo(handle),
        "power": lambda: pynvml.nvmlDeviceGetPowerUsage(handle),
        "energy": lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(handle),
        "SM clock": lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
        "clock event reasons": lambda: pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle),
        "torch memory": lambda: (torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device)),
        "psutil": lambda: (proc.cpu_percent(None), proc.memory_info().rss),
    }


def alone(fn: Callable[[], object], n: int = 200) -> tuple[float, float]:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times)) * 1e6, max(times) * 1e6


def step_graph(device: torch.device, step_us: float) -> torch.cuda.CUDAGraph:
    """A graph of small kernels taking about ``step_us`` of GPU time."""
    x = torch.randn(1024, 1024, device=device)
    for _ in range(3):
        x.mul_(1.0001)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(200):
        x.mul_(1.0001)
    torch.cuda.synchronize()
    per = (time.perf_counter() - t) / 200 * 1e6
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(max(1, round(step_us / per))):
            x.mul_(1.0001)
    return graph


def loop(graph: torch.cuda.CUDAGraph, seconds: float, beside: Callable[[], object] | None, period: float):
    stop = threading.Event()

    def sampler() -> None:
        while not stop.wait(period):
            beside()

    thread = threading.Thread(target=sampler, daemon=True) if beside else None
    if thread:
        thread.start()
    steps = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t = time.perf_counter()
        graph.replay()
        torch.cuda.synchronize()
        steps.append(time.perf_counter() - t)
    stop.set()
    if thread:
        thread.join()
    s = np.array(steps) * 1e3
    return np.percentile(s, 50), np.percentile(s, 99), s.max()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--period-ms", type=float, default=50.0, help="the sampler's period (default 50)")
    ap.add_argument("--seconds", type=float, default=3.0, help="each loop's length")
    ap.add_argument("--step-us", type=float, default=1000.0, help="GPU work per replayed step")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("error: needs a CUDA GPU", file=sys.stderr)
        return 2
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    device = torch.device("cuda", 0)
    reads = readings(handle, pynvml, device)
    print(f"{'reading':<22}{'median µs':>12}{'max µs':>12}")
    for name, fn in reads.items():
        med, top = alone(fn)
        print(f"{name:<22}{med:>12.1f}{top:>12.1f}")
    graph = step_graph(device, args.step_us)
    for _ in range(50):
        graph.replay()
    torch.cuda.synchronize()
    print(f"\nreplay + sync, {args.seconds:g} s each, readings every {args.period_ms:g} ms: ms per step")
    print(f"{'beside the loop':<22}{'p50':>10}{'p99':>10}{'max':>10}")
    every = lambda: [fn() for fn in reads.values()]  # noqa: E731
    for name, fn in [("nothing", None), *reads.items(), ("all of them", every)]:
        p50, p99, top = loop(graph, args.seconds, fn, args.period_ms / 1e3)
        print(f"{name:<22}{p50:>10.3f}{p99:>10.3f}{top:>10.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
