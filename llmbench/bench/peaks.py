"""The ceilings that derived utilisation figures divide by: measured on this machine, or the datasheet's.

Datasheet peaks are vendor figures (dense, no sparsity): HBM bandwidth in bytes/s and bf16/fp16 tensor
FLOP/s, by GPU name. They are not reachable in practice: a device-to-device copy on an H200 moves about
4.25 TB/s of its 4.8, a bf16 8192^3 matmul about 685 of its 989 TFLOP/s.

``llmbench calibrate`` (bench/calibration.py) measures both on the machine it runs on and stores them in a
calibration file: ``$LLMBENCH_CALIBRATION`` if set, else ``$XDG_CACHE_HOME/llmbench/calibration.json``
(``~/.cache/llmbench/calibration.json`` without XDG_CACHE_HOME). Each entry is keyed by what the figures
depend on, so a calibration of another machine is never used:

- a GPU: its name, the driver version, torch's version and torch's CUDA version;
- the CPU: its model name, the host name and torch's version.

A run uses, in order: the calibration of its device (``source: measured``), the datasheet
(``source: datasheet``), or none, and then its derived figures say "unavailable" with the reason (the
CPU has no datasheet figures: only a calibration makes its derived figures available).
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any, NamedTuple

from llmbench.bench.errors import BenchError
from llmbench.bench.store import os_reason

CALIBRATION_ENV = "LLMBENCH_CALIBRATION"
FILE_FORMAT = 1


class CalibrationError(BenchError):
    """A calibration that cannot be measured, read or written."""


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
    """The datasheet peak of a GPU by its name; None for an unknown GPU or None."""
    if not device_name:
        return None
    upper = device_name.upper()
    for needles, peak in _PEAKS:
        if all(n in upper for n in needles):
            return peak
    return None


class PeakUsed(NamedTuple):
    """What a run's derived figures divide by."""

    mem_bandwidth: float  # bytes/s (measured: bytes read + written by a device-to-device copy)
    matmul_flops: float  # FLOP/s of a dense matmul
    matmul_dtype: str  # "bfloat16" on a GPU; "float32" for a CPU's measured figure
    source: str  # "measured" | "datasheet"
    measured_at: str | None  # when the calibration was measured (source "measured")
    datasheet: Peak | None  # the vendor's figures, shown beside the measured ones
    calibration_file: str | None


class PeakChoice(NamedTuple):
    peak: PeakUsed | None
    why_none: str | None  # why there is no peak (the summary's "unavailable" reason)
    warning: str | None  # a calibration file that could not be read (the datasheet is used instead)


# -- the calibration file ---------------------------------------------------------------------------


def calibration_path(path: Path | str | None = None) -> Path:
    """The file given, else ``$LLMBENCH_CALIBRATION``, else the cache folder's (see the module docstring)."""
    if path is not None:
        return Path(path).expanduser()
    env = os.environ.get(CALIBRATION_ENV)
    if env:
        return Path(env).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME")
    root = Path(cache) if cache and Path(cache).is_absolute() else Path.home() / ".cache"
    return root / "llmbench" / "calibration.json"


def cpu_name() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what the platform module says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def device_key(device: str) -> dict[str, Any]:
    """What a calibration of ``device`` ("cpu", "cuda", "cuda:N") is valid for (see the module docstring)."""
    import torch

    if device.startswith("cuda"):
        from llmbench.bench.nvml import Nvml

        index = int(device.split(":")[1]) if ":" in device else 0
        nvml = Nvml.open()
        driver = nvml.driver_version() if nvml.available else None
        nvml.close()
        return {
            "device": torch.cuda.get_device_name(index),
            "driver": driver,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
        }
    return {"device": cpu_name(), "host": platform.node(), "torch": torch.__version__}


def read_calibrations(path: Path) -> list[dict[str, Any]]:
    """The file's entries ([] when it does not exist); CalibrationError when it is not a calibration file."""
    if not path.exists():
        return []
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CalibrationError(f"cannot read the calibration file {path}: {e}") from None
    entries = data.get("calibrations") if isinstance(data, dict) else None
    if not isinstance(entries, list) or data.get("format") != FILE_FORMAT:
        raise CalibrationError(
            f"{path} is not a calibration file of format {FILE_FORMAT} (written by `llmbench calibrate`)"
        )
    return [e for e in entries if isinstance(e, dict) and isinstance(e.get("key"), dict)]


def check_writable(path: Path) -> None:
    """Fail now, before anything is measured, when ``path`` cannot be written or holds something else."""
    read_calibrations(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        probe = path.with_name(f".{path.name}.{os.getpid()}.probe")
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise CalibrationError(f"cannot write the calibration file {path}: {os_reason(e, path)}") from None


def store_calibration(path: Path, entry: dict[str, Any]) -> None:
    """Add ``entry`` to the file, replacing one with the same key; written atomically."""
    entries = [e for e in read_calibrations(path) if e["key"] != entry["key"]] + [entry]
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"format": FILE_FORMAT, "calibrations": entries}, indent=2) + "\n")
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise CalibrationError(f"cannot write the calibration file {path}: {os_reason(e, path)}") from None


def find_calibration(entries: list[dict[str, Any]], key: dict[str, Any]) -> dict[str, Any] | None:
    return next((e for e in reversed(entries) if e["key"] == key), None)


# -- what a run uses --------------------------------------------------------------------------------


def choose_peak(device: str, path: Path | None = None) -> PeakChoice:
    """The peak a run on ``device`` divides by (see the module docstring); ``"remote"`` has none."""
    if device == "remote":
        return PeakChoice(None, "the server's GPU is not visible to the client", None)
    import torch

    file = calibration_path(path)
    name = torch.cuda.get_device_name(_index(device)) if device.startswith("cuda") else None
    datasheet = peak_for(name)
    warning = None
    try:
        entry = find_calibration(read_calibrations(file), device_key(device))
    except CalibrationError as e:
        entry, warning = None, f"{e}; derived figures use the datasheet instead"
    if entry is not None:
        used = PeakUsed(
            float(entry["mem_bandwidth"]),
            float(entry["matmul_flops"]),
            str(entry["matmul_dtype"]),
            "measured",
            entry.get("measured_at"),
            datasheet,
            str(file),
        )
        return PeakChoice(used, None, warning)
    if datasheet is not None:
        used = PeakUsed(
            datasheet.mem_bandwidth, datasheet.bf16_flops, "bfloat16", "datasheet", None, datasheet, None
        )
        return PeakChoice(used, None, warning)
    what = f"this GPU ({name})" if name else "the CPU"
    why = f"{what} has no datasheet peak and no calibration in {file} (measure one with `llmbench calibrate`)"
    return PeakChoice(None, why, warning)


def _index(device: str) -> int:
    return int(device.split(":")[1]) if ":" in device else 0


def peak_meta(choice: PeakChoice) -> dict[str, Any]:
    """meta.json's ``peak``: which peak the derived figures divide by, the datasheet's beside it."""
    p = choice.peak
    if p is None:
        return {"source": None, "reason": choice.why_none, "datasheet": None}
    return {
        "source": p.source,
        "measured_at": p.measured_at,
        "mem_bandwidth": p.mem_bandwidth,
        "matmul_flops": p.matmul_flops,
        "matmul_dtype": p.matmul_dtype,
        "calibration_file": p.calibration_file,
        "datasheet": p.datasheet._asdict() if p.datasheet else None,
    }


def format_rate(value: float, unit: str) -> str:
    """4.25e12, "B/s" -> "4.25 TB/s"; 6.85e14, "FLOP/s" -> "685 TFLOP/s"."""
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M")):
        if value >= scale:
            v = value / scale
            return f"{v:.3g} {prefix}{unit}" if v < 100 else f"{v:.0f} {prefix}{unit}"
    return f"{value:.3g} {unit}"


_DTYPE_SHORT = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def derived_labels(peak: PeakUsed | None) -> dict[str, str]:
    """The summary table's row labels for the derived figures, naming the peak they are a share of."""
    if peak is None:
        return {}
    dtype = _DTYPE_SHORT.get(peak.matmul_dtype, peak.matmul_dtype)
    return {
        "decode_bw_util_mean": (
            f"decode bandwidth util per GPU (% of {peak.source} {format_rate(peak.mem_bandwidth, 'B/s')})"
        ),
        "prefill_flop_util_mean": (
            f"prefill FLOP util per GPU (% of {peak.source} {format_rate(peak.matmul_flops, 'FLOP/s')} {dtype})"
        ),
    }
