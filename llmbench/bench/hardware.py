"""The machine a run is on: library versions, GPU/driver, git commit and the CPU's load.

The peaks that utilisation figures divide by (datasheet or measured) are in bench/peaks.py.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


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


def source_digest(package: Path | None = None) -> str:
    """The first 12 hex digits of a SHA-256 over the package's Python files (paths and contents): the
    code that ran, whatever git says (a tree with local changes, a copy without its history)."""
    package = package or Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def git_commit(repo: Path | None = None) -> dict[str, Any]:
    """HEAD and whether the tree has local changes, read-only (no index refresh), None for both outside
    git; and the package's ``source_digest``."""
    repo = repo or Path(__file__).resolve().parents[2]
    return {**_head(repo), "source": source_digest()}


def _head(repo: Path) -> dict[str, Any]:
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


def oversubscribed_warning(threads: int | None, ranks: int = 1) -> str | None:
    """A warning when a run on the CPU asks for more threads than the machine has cores, else None:
    ``threads`` torch threads (None: torch's default, one a core) in each of ``ranks`` processes (the
    tensor-parallel ranks)."""
    cores = os.cpu_count() or 1
    if ranks > 1:
        total = ranks * (threads or cores)
        if total <= cores:
            return None
        each = f"cpu_threads={threads}" if threads else f"torch's default of {cores} threads"
        return (
            f"tp={ranks} runs {ranks} processes with {each} each, {total} threads on {cores} cores: they take "
            "turns on the cores and timings suffer"
        )
    if threads is None or threads <= cores:
        return None
    return f"cpu_threads={threads} on {cores} cores: the threads take turns on the cores and timings suffer"


BUSY_SAMPLE_S = 0.2  # how long the demand for the CPUs is sampled when a run starts
BUSY_SHARE = 0.75  # other runnable threads per core from which the machine is busy


def runnable_others(sample_s: float = BUSY_SAMPLE_S, samples: int = 11) -> float | None:
    """Threads of other processes ready to run, on average over ``sample_s`` (Linux: /proc/stat's
    procs_running, which counts this one too); None where it cannot be read.

    What is wanted now, not a load average: that still carries the work of the last minute (an ablation's
    previous variant, which is over). Threads, not CPU time: a container's CPU quota caps the time its
    processes get, not how many of them wait for it."""
    counts = []
    for i in range(samples):
        try:
            with open("/proc/stat") as f:
                line = next((ln for ln in f if ln.startswith("procs_running ")), None)
        except OSError:
            return None
        if line is None:
            return None
        counts.append(int(line.split()[1]) - 1)
        if i < samples - 1:
            time.sleep(sample_s / (samples - 1))
    return sum(counts) / len(counts)


def busy_warning(threads: int, sample_s: float = BUSY_SAMPLE_S, what: str = "the run") -> str | None:
    """A warning when other work keeps the CPUs busy as ``what`` starts (timings will be noisy), else None."""
    cores = os.cpu_count() or 1
    others = runnable_others(sample_s)
    if others is None:
        try:
            others = os.getloadavg()[0]
        except (OSError, AttributeError):
            return None
    if others <= BUSY_SHARE * cores:
        return None
    hint = ", and torch's threads may fight other processes for the cores (try --set cpu_threads=1)"
    return (
        f"the machine was busy when {what} started ({others:.1f} threads of other processes ready to run "
        f"on {cores} cores): timings will be noisy{hint if threads > 1 else ''}"
    )
