"""A thin, failure-tolerant view of NVML (through nvidia-ml-py's ``pynvml``).

``Nvml.open()`` never raises: when the library, the driver or a GPU is missing it returns an object whose
``available`` is False and whose ``reason`` says why, and every reading is then NaN. A single query that
a GPU does not support (energy on old cards, say) is NaN too; callers record "unavailable", never 0.
"""

from __future__ import annotations

import math
import os
from typing import Any, NamedTuple


class GpuSample(NamedTuple):
    util: float  # %
    memory_used: float  # bytes
    power: float  # W
    energy: float  # J, the driver's running counter (deltas are meaningful)
    sm_clock: float  # MHz
    throttle_reasons: float  # bitmask as a number; NaN when unknown


class Nvml:
    def __init__(self, lib: Any | None, handles: list[Any], indices: list[int], reason: str) -> None:
        self._lib = lib
        self.handles = handles
        self.indices = indices  # NVML indices of the GPUs watched
        self.reason = reason
        # Fixed at open: whether this run had GPU telemetry does not change when sampling ends.
        self.available = lib is not None and bool(handles)

    @classmethod
    def open(cls, cuda_indices: list[int] | None = None) -> Nvml:
        """Watch the GPUs that CUDA calls ``cuda_indices`` (default: all); map them through
        CUDA_VISIBLE_DEVICES when it lists plain indices."""
        try:
            import pynvml
        except ImportError:
            return cls(None, [], [], "nvidia-ml-py is not installed")
        try:
            pynvml.nvmlInit()
        except Exception as exc:  # NVMLError_LibraryNotFound, driver not loaded, ...
            return cls(None, [], [], f"NVML could not start: {exc}")
        try:
            count = pynvml.nvmlDeviceGetCount()
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            physical = list(range(count))
            if visible is not None and all(p.strip().isdigit() for p in visible.split(",") if p.strip()):
                physical = [int(p) for p in visible.split(",") if p.strip()]
            wanted = (
                physical if cuda_indices is None else [physical[i] for i in cuda_indices if i < len(physical)]
            )
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in wanted]
        except Exception as exc:
            return cls(None, [], [], f"NVML could not list GPUs: {exc}")
        if not handles:
            return cls(None, [], [], "NVML sees no GPU")
        return cls(pynvml, handles, wanted, "")

    def _read(self, fn: str, *args: Any) -> Any:
        try:
            return getattr(self._lib, fn)(*args)
        except Exception:
            return None

    def sample(self, handle: Any, energy: bool = True) -> GpuSample:
        """One reading of ``handle``'s GPU; the energy counter (NaN) left out unless ``energy``: that
        query alone takes milliseconds (3 ms median, 17 ms at worst on an H200), the others microseconds."""
        lib = self._lib
        util = self._read("nvmlDeviceGetUtilizationRates", handle)
        mem = self._read("nvmlDeviceGetMemoryInfo", handle)
        power = self._read("nvmlDeviceGetPowerUsage", handle)  # mW
        energy = self._read("nvmlDeviceGetTotalEnergyConsumption", handle) if energy else None  # mJ
        clock = self._read("nvmlDeviceGetClockInfo", handle, lib.NVML_CLOCK_SM) if lib else None
        throttle = self._read("nvmlDeviceGetCurrentClocksEventReasons", handle)
        if throttle is None:
            throttle = self._read("nvmlDeviceGetCurrentClocksThrottleReasons", handle)
        nan = math.nan
        return GpuSample(
            float(util.gpu) if util is not None else nan,
            float(mem.used) if mem is not None else nan,
            power / 1e3 if power is not None else nan,
            energy / 1e3 if energy is not None else nan,
            float(clock) if clock is not None else nan,
            float(throttle) if throttle is not None else nan,
        )

    def describe(self) -> list[dict[str, Any]]:
        """Name, memory and UUID of each watched GPU."""
        out = []
        for idx, h in zip(self.indices, self.handles, strict=True):
            name = self._read("nvmlDeviceGetName", h)
            mem = self._read("nvmlDeviceGetMemoryInfo", h)
            out.append(
                {
                    "nvml_index": idx,
                    "name": name.decode() if isinstance(name, bytes) else name,
                    "memory_total": int(mem.total) if mem is not None else None,
                    "uuid": _str(self._read("nvmlDeviceGetUUID", h)),
                }
            )
        return out

    def driver_version(self) -> str | None:
        return _str(self._read("nvmlSystemGetDriverVersion")) if self._lib else None

    def close(self) -> None:
        if self._lib is not None:
            self._read("nvmlShutdown")
            self._lib = None


def _str(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)
