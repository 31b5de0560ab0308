"""Hardware telemetry sampled in a background thread while a run is measured.

Every ``period`` seconds (0.2 by default: NVML's utilisation and power are themselves averages over a
sixth of a second or more, and every sample holds up the engine a little): for each GPU in use (NVML) utilisation %, memory used, power,
the energy counter and SM clock and throttle reasons; torch's allocated/reserved bytes on the engine's device; this
process's CPU % and RSS (psutil); and how long taking the sample took (``sample_time``, seconds), so that
engine steps delayed by it can be told apart (slow_steps.py: "telemetry sample"). One row per sample and GPU (``gpu = -1`` on a machine without NVML,
where every GPU column is NaN and ``nvml_reason`` says why -- never a fake 0).

The energy counter is read at most once every ``ENERGY_PERIOD_S`` (NaN in the rows between): reading it
takes milliseconds where the other readings take microseconds, and a sampler that read it every 50 ms
held up the engine's steps. Energy over a window is the counter's difference between its first and last
readings inside the window, plus the mean power times the time the window runs beyond them at each end;
a window with fewer than two readings gets mean power times its length.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from llmbench.bench.nvml import Nvml

COLUMNS = (
    "time", "gpu", "gpu_util", "memory_used", "power", "energy", "sm_clock", "throttle_reasons",
    "torch_allocated", "torch_reserved", "cpu_percent", "rss", "sample_time",
)  # fmt: skip
GPU_COLUMNS = ("gpu_util", "memory_used", "power", "energy", "sm_clock", "throttle_reasons")
ENERGY_PERIOD_S = 1.0  # seconds between readings of the energy counter (module docstring)


class TelemetrySampler:
    def __init__(
        self,
        period_s: float = 0.2,
        cuda_indices: list[int] | None = None,
        torch_device: str | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        import psutil

        self.period_s = period_s
        self._clock = clock
        self._nvml = Nvml.open(cuda_indices) if cuda_indices else Nvml(None, [], [], "the run uses no GPU")
        self._torch_device = torch_device if torch_device and torch_device.startswith("cuda") else None
        self._proc = psutil.Process()
        self._rows: list[tuple[float, ...]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._energy_at = -math.inf  # when the energy counter was last read

    @property
    def nvml_available(self) -> bool:
        return self._nvml.available

    @property
    def nvml_reason(self) -> str:
        return self._nvml.reason

    def _torch_memory(self) -> tuple[float, float]:
        if self._torch_device is None:
            return math.nan, math.nan
        import torch

        try:
            return float(torch.cuda.memory_allocated(self._torch_device)), float(
                torch.cuda.memory_reserved(self._torch_device)
            )
        except Exception:
            return math.nan, math.nan

    def mark(self) -> None:
        """Take one sample now."""
        t = self._clock()
        cpu = float(self._proc.cpu_percent(None))
        rss = float(self._proc.memory_info().rss)
        alloc, reserved = self._torch_memory()
        host = (alloc, reserved, cpu, rss)
        if self._nvml.available:
            energy = t - self._energy_at >= ENERGY_PERIOD_S
            if energy:
                self._energy_at = t
            rows = [
                (t, float(idx), *self._nvml.sample(h, energy), *host)
                for idx, h in zip(self._nvml.indices, self._nvml.handles, strict=True)
            ]
        else:
            rows = [(t, -1.0, *([math.nan] * len(GPU_COLUMNS)), *host)]
        taken = self._clock() - t
        with self._lock:
            self._rows.extend((*row, taken) for row in rows)

    def sample_intervals(self) -> list[tuple[float, float]]:
        """(start, end) of every sample taken, in the clock's seconds."""
        with self._lock:
            return sorted({(r[0], r[0] + r[-1]) for r in self._rows})

    def _loop(self) -> None:
        # The first sample comes one period after start: psutil's CPU % needs an interval to mean anything.
        while not self._stop.wait(self.period_s):
            try:
                self.mark()
            except Exception:  # a failed reading must not end the run
                pass

    def start(self) -> None:
        self._proc.cpu_percent(None)
        self._thread = threading.Thread(target=self._loop, name="llmbench-telemetry", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._nvml.close()

    def rows(self) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(zip(COLUMNS, r, strict=True)) for r in self._rows]


def window_summary(rows: list[dict[str, Any]], start: float, end: float) -> dict[str, float]:
    """Telemetry figures over [start, end]: means, maxima and the energy counter's difference."""
    nan = math.nan
    out = dict.fromkeys(
        ("gpu_util_mean", "power_mean", "energy", "sm_clock_mean", "gpu_memory_max", "gpu_memory_device_max",
         "torch_reserved_max", "cpu_util_mean", "rss_max"),
        nan,
    )  # fmt: skip
    inside = [r for r in rows if start <= r["time"] <= end]
    if not inside:
        return out

    def col(name: str, rs: list[dict[str, Any]] = inside) -> np.ndarray:
        return np.array([r[name] for r in rs], dtype=float)

    def agg(x: np.ndarray, fn: Callable[[np.ndarray], Any]) -> float:
        x = x[np.isfinite(x)]
        return float(fn(x)) if x.size else nan

    out["gpu_util_mean"] = agg(col("gpu_util"), np.mean)
    out["sm_clock_mean"] = agg(col("sm_clock"), np.mean)
    out["torch_reserved_max"] = agg(col("torch_reserved"), np.max)
    out["cpu_util_mean"] = agg(col("cpu_percent"), np.mean)
    out["rss_max"] = agg(col("rss"), np.max)
    gpus = sorted({r["gpu"] for r in inside if r["gpu"] >= 0})
    if gpus:
        # Sums over GPUs at each sample time: power and memory of the whole tensor-parallel group.
        by_time: dict[float, list[dict[str, Any]]] = {}
        for r in inside:
            by_time.setdefault(r["time"], []).append(r)
        power = np.array([sum(r["power"] for r in rs) for rs in by_time.values()], dtype=float)
        memory = np.array([sum(r["memory_used"] for r in rs) for rs in by_time.values()], dtype=float)
        out["power_mean"] = agg(power, np.mean)
        out["gpu_memory_max"] = agg(memory, np.max)
        out["gpu_memory_device_max"] = agg(col("memory_used"), np.max)  # the fullest GPU at any sample
        out["energy"] = sum(_energy(inside, g, start, end) for g in gpus)
    return out


def _energy(inside: list[dict[str, Any]], gpu: float, start: float, end: float) -> float:
    """Joules GPU ``gpu`` used over [start, end]: the counter between its readings, mean power outside."""
    rows = [r for r in inside if r["gpu"] == gpu]
    power = np.array([r["power"] for r in rows], dtype=float)
    power = power[np.isfinite(power)]
    watts = float(power.mean()) if power.size else math.nan
    read = [(r["time"], r["energy"]) for r in rows if math.isfinite(r["energy"])]
    if len(read) < 2:
        return watts * (end - start)
    (first_t, first_e), (last_t, last_e) = read[0], read[-1]
    edges = (first_t - start) + (end - last_t)
    return (last_e - first_e) + watts * edges
