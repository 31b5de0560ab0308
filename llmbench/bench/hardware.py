"""The machine a run is on: peak figures by GPU name, library versions, GPU/driver and git commit.

Peaks are vendor datasheet numbers (dense, no sparsity): HBM bandwidth in bytes/s and bf16/fp16 tensor
FLOP/s. They are ceilings for utilisation ratios, not measurements. An unknown GPU or the CPU has none,
and the ratios built on them say "unavailable".
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple


class Peak(NamedTuple):
    name: str
    mem_bandwidth: float  # bytes/s
    bf16_flops: float  # FLOP/s, dense tensor-core bf16/fp16


# (substrings that must all appear in the device name, peak); the first match wins, so specific first.
_PEAKS: list[tuple[tuple[str, ...], Peak]] = [
    (("GH200",), Peak("GH200", 4.0e12, 989e12)),
    (("H200",), Peak("H200", 4.8e12, 989e12)),
    (("H100", "PCIE"), Peak("H100 PCIe", 2.0e12, 756e12)),
    (("H100", "NVL"), Peak("H100 NVL", 3.9e12, 835e12)),
    (("H100",), Peak("H100 SXM", 3.35e12, 989e12)),
    (("H20",), Peak("H20", 4.0e12, 148e12)),
    (("B200",), Peak("B200", 8.0e12, 2250e12)),
    (("A100", "80GB"), Peak("A100 80GB", 2.039e12, 312e12)),
    (("A100",), Peak("A100 40GB", 1.555e12, 312e12)),
    (("L40S",), Peak("L40S", 0.864e12, 362e12)),
    (("L4",), Peak("L4", 0.3e12, 121e12)),
    (("A10G",), Peak("A10G", 0.6e12, 70e12)),
    (("A10",), Peak("A10", 0.6e12, 125e12)),
    (("RTX 4090",), Peak("RTX 4090", 1.008e12, 165e12)),
    (("V100",), Peak("V100", 0.9e12, 125e12)),
    (("T4",), Peak("T4", 0.32e12, 65e12)),
]


def peak_for(device_name: str | None) -> Peak | None:
    if not device_name:
        return None
    upper = device_name.upper()
    for needles, peak in _PEAKS:
        if all(n in upper for n in needles):
            return peak
    return None


def cuda_device_name(device: str) -> str | None:
    """torch's name for the device an engine runs on; None on the CPU."""
    if not device.startswith("cuda"):
        return None
    import torch

    index = int(device.split(":")[1]) if ":" in device else 0
    return torch.cuda.get_device_name(index)


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
    }
    for dist in (
        "triton",
        "transformers",
        "llmbench",
        "numpy",
        "pandas",
        "pyarrow",
        "pydantic",
        "nvidia-ml-py",
    ):
        out[dist] = _version(dist)
    return out


def git_commit(repo: Path | None = None) -> dict[str, Any]:
    """HEAD and whether the tree has local changes, read-only (no index refresh); None outside git."""
    repo = repo or Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
        if head.returncode != 0:
            return {"commit": None, "dirty": None}
        status = subprocess.run(
            ["git", "--no-optional-locks", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        dirty = bool(status.stdout.strip()) if status.returncode == 0 else None
        return {"commit": head.stdout.strip(), "dirty": dirty}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def machine() -> dict[str, Any]:
    """Host, CPU and GPUs (through NVML) with the driver version."""
    from llmbench.bench.nvml import Nvml

    nvml = Nvml.open()
    info: dict[str, Any] = {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "gpus": nvml.describe() if nvml.available else [],
        "driver": nvml.driver_version() if nvml.available else None,
        "nvml": "available" if nvml.available else f"unavailable: {nvml.reason}",
    }
    nvml.close()
    return info


def command_line() -> list[str]:
    return [Path(sys.argv[0]).name, *sys.argv[1:]] if sys.argv else []


def set_torch_threads(threads: int | None) -> int:
    """Apply the scenario's cpu_threads (None: leave torch's default); returns the count in effect."""
    import torch

    if threads is not None:
        torch.set_num_threads(threads)
    return torch.get_num_threads()


def busy_warning(threads: int) -> str | None:
    """A warning when other processes already load the CPUs (timings will be noisy), else None."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return None
    cores = os.cpu_count() or 1
    if load <= 0.75 * cores:
        return None
    hint = ", and torch's threads may fight other processes for the cores (try --set cpu_threads=1)"
    return (
        f"the machine was busy when the run started (1-minute load {load:.1f} on {cores} cores): timings will be "
        f"noisy{hint if threads > 1 else ''}"
    )
