"""How a metric's value is written for people: latencies in ms, fractions in %, bytes in GiB/MiB.

Missing values are written "unavailable" when the run says why (no NVML, no GPU peak), "–" otherwise;
never 0. ``display_value`` gives the number in display units, for CSV and plots.
"""

from __future__ import annotations

import math
from typing import Any

from llmbench.bench.metrics import METRICS, STATS

DASH = "–"
UNAVAILABLE = "unavailable"

# Rows of the summary table, in order (a subset of METRICS: the ones a performance engineer reads first).
SUMMARY_METRICS = (
    "ttft_p50", "ttft_p90", "ttft_p99", "tpot_p50", "tpot_p99", "itl_p50", "itl_p99", "e2e_p50", "e2e_p99",
    "queue_p50", "client_queue_p50", "client_queue_p99", "output_throughput", "total_throughput",
    "request_throughput", "goodput", "slo_attainment", "num_completed", "num_aborted", "num_failed",
    "num_output_mismatch",
    "duration", "arrival_lag_p99", "decode_step_mean", "decode_bw_util_mean", "decode_fixed", "decode_kv_rate",
    "decode_host_time", "device_wait_share",
    "prefill_flop_util_mean", "kv_usage_max", "kv_capacity_tokens", "kv_capacity_seqs", "limit_kv_share",
    "limit_seqs_share", "limit_tokens_share", "prefix_cache_hit_rate", "preemptions", "gpu_util_mean",
    "power_mean", "energy_per_token", "peak_memory", "cpu_util_mean",
)  # fmt: skip


def display_unit(metric: str) -> str:
    unit = METRICS[metric].unit if metric in METRICS else ""
    return {"s": "ms", "fraction": "%", "bytes": "GiB", "bytes/s": "GB/s", "count": ""}.get(unit, unit)


def display_value(metric: str, value: Any) -> float:
    """The value in display units (NaN when missing)."""
    if value is None:
        return math.nan
    v = float(value)
    unit = METRICS[metric].unit if metric in METRICS else ""
    if unit == "s":
        return v * 1e3
    if unit == "fraction":
        return v * 100
    if unit == "bytes":
        return v / 2**30
    if unit == "bytes/s":
        return v / 1e9
    return v


def _number(v: float) -> str:
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.1f}"
    if a >= 10:
        return f"{v:.2f}"
    if a >= 0.01 or a == 0:
        return f"{v:.3f}"
    return f"{v:.2e}"


def format_value(metric: str, value: Any, unavailable: bool = False) -> str:
    v = display_value(metric, value)
    if math.isnan(v):
        return UNAVAILABLE if unavailable else DASH
    unit = METRICS[metric].unit if metric in METRICS else ""
    if unit == "count":
        return f"{v:,.0f}"
    return _number(v)


def format_ci(metric: str, low: Any, high: Any) -> str:
    lo, hi = display_value(metric, low), display_value(metric, high)
    if math.isnan(lo) or math.isnan(hi) or (metric in METRICS and METRICS[metric].unit == "count"):
        return DASH
    return f"{_number(lo)} – {_number(hi)}"


PCT_CAP = 9.99  # +999%: a relative change beyond it reads as the ratio (x33.3), not as +3230.7%


def format_pct(value: Any, signed: bool = True) -> str:
    """``+3.4%``; a change that rounds to nothing ``0.0%`` (no ``-0.0%``); beyond +999% the ratio, ``×33.3``."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return DASH
    if signed and value > PCT_CAP:
        return f"×{1 + value:.3g}" if value < 999 else f"×{1 + value:,.0f}"
    if round(value * 100, 1) == 0:
        return "0.0%"
    return f"{value * 100:+.1f}%" if signed else f"{value * 100:.1f}%"


def format_pct_interval(low: Any, high: Any) -> str:
    """A relative change's interval, ``-2.1% … +3.4%`` (``format_pct``'s form for each end)."""
    return f"{format_pct(low)} … {format_pct(high)}"


def format_difference(metric: str, value: Any) -> str:
    """A difference new - base in the metric's display unit, ``+4``, ``-0.088 ms``, ``+2.5 pp`` (percentage
    points, for a share): what a change is shown as where a percentage has no base."""
    v = display_value(metric, value)
    if math.isnan(v):
        return DASH
    unit = {"%": "pp"}.get(display_unit(metric), display_unit(metric))
    text = f"{v:,.0f}" if unit == "" and v == round(v) else _number(v)
    return ("+" if v > 0 else "") + text + (f" {unit}" if unit else "")


def format_change(metric: str, value: Any, absolute: bool) -> str:
    """A change as a percentage (``format_pct``), or as a difference in the metric's unit if ``absolute``."""
    return format_difference(metric, value) if absolute else format_pct(value)


def format_change_interval(metric: str, low: Any, high: Any, absolute: bool) -> str:
    """A change's interval, ``-2.1% … +3.4%``, or ``+1.5 … +6.5`` for a difference in the metric's unit."""
    if not absolute:
        return format_pct_interval(low, high)
    return f"{format_difference(metric, low)} … {format_difference(metric, high)}"


def metric_label(metric: str) -> str:
    label = METRICS[metric].label if metric in METRICS else metric
    unit = display_unit(metric)
    return f"{label} ({unit})" if unit else label


def is_unavailable(metric: str, unavailable: dict[str, str]) -> bool:
    """Whether a missing value of ``metric`` is missing for a recorded reason (given for the metric, or for
    its family: ``queue`` covers ``queue_p50`` ... ``queue_mean``)."""
    family, _, stat = metric.rpartition("_")
    if metric in unavailable or (stat in STATS and family in unavailable):
        return True
    gpu = ("gpu_util_mean", "power_mean", "energy", "energy_per_token", "sm_clock_mean", "gpu_memory_max")
    return metric in gpu and "gpu_telemetry" in unavailable
