"""From what was measured to ``summary.json``: per-repeat metrics and per-point estimates with intervals.

A point's estimate of a metric is the mean over its repeats. Its 95% interval is a Student-t interval of
that mean over the repeats (``ci: "repeats"``) when there are at least two. A single repeat gets no
interval (``ci: null``): one run's requests say nothing about run-to-run variance, which is what decides
whether the next run comes out the same. The same function serves the report, which may pool repeats
recorded in different folders (an ablation).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

from llmbench.bench.derived import StepUtilisation, decode_batches, step_summary
from llmbench.bench.driver import DriveResult
from llmbench.bench.metrics import METRICS, request_summary, window
from llmbench.bench.peaks import PeakChoice
from llmbench.bench.scenario.schema import SLO, Scenario
from llmbench.bench.stats import mean_interval
from llmbench.bench.telemetry import TelemetrySampler, window_summary


class Measured(NamedTuple):
    point_index: int
    point_label: str
    point: dict[str, Any]
    repeat: int
    drive: DriveResult
    traced: bool = False  # the profiler ran during it (``llmbench profile``): its times are no run's


def repeat_metrics(
    m: Measured, slo: SLO, telemetry_rows: list[dict[str, Any]], util: StepUtilisation
) -> dict[str, float]:
    """Every metric of METRICS for one repeat of one point."""
    out = request_summary(m.drive.requests, slo)
    out.update(step_summary(m.drive.steps, util))
    start, end = window(m.drive.requests)
    if math.isnan(start):
        start, end = m.drive.start, m.drive.end
    out.update(window_summary(telemetry_rows, start, end))
    tokens = out["output_tokens"]
    out["energy_per_token"] = out["energy"] / tokens if tokens and not math.isnan(out["energy"]) else math.nan
    # Peak memory: what one device held at most, comparable at any tp: the fullest GPU when NVML sees them
    # (its view includes the KV pool), else rank 0's torch reservation, else the host process's (rank 0's).
    gpu = [v for v in (out["gpu_memory_device_max"], out["torch_reserved_max"]) if not math.isnan(v)]
    out["peak_memory"] = max(gpu) if gpu else out["rss_max"]
    return out


def interval(repeat_values: list[float | None]) -> dict[str, Any]:
    """Estimate and 95% interval of one metric for one point (see the module docstring)."""
    # every metric is a time, a rate, a count, a share or an amount: none is below 0
    ci = mean_interval([math.nan if v is None else v for v in repeat_values], floor=0.0)
    if ci.n == 0:
        return {"value": None, "ci_low": None, "ci_high": None, "ci": None, "n": 0}
    if ci.n == 1:
        return {"value": ci.value, "ci_low": None, "ci_high": None, "ci": None, "n": 1}
    return {"value": ci.value, "ci_low": ci.low, "ci_high": ci.high, "ci": "repeats", "n": ci.n}


T = TypeVar("T")
STOPPED = ("interrupted", "failed")  # a repeat cut by an interrupt or a failure: a part of a measurement


def whole_repeats(repeats: list[T], status: Callable[[T], Any] = lambda e: e.get("status")) -> list[T]:
    """A point's repeat entries (summary.json's, each with its ``status``) less those an interrupt or a
    failure stopped part-way, when any repeat of the point ran to its end: a stopped repeat's rates and
    counts are those of a fraction of its workload, no measurement to average with whole ones. (A time
    limit, ``max_duration_s``, is the scenario's own bound: its repeats stay.) When none ran to its end,
    the stopped ones are all the point has; the run is marked incomplete. ``status`` reads an entry's
    status (the run's own measurements are told apart the same way, by their drive's)."""
    whole = [e for e in repeats if status(e) not in STOPPED]
    return whole or repeats


def point_summary(per_repeat: list[dict[str, float]]) -> dict[str, Any]:
    """Aggregate of one point's repeats."""
    return {name: interval([r.get(name, math.nan) for r in per_repeat]) for name in METRICS}


def build_summary(
    measured: list[Measured],
    per_repeat: list[dict[str, float]],
    origin: float,
) -> list[dict[str, Any]]:
    """The ``points`` list of summary.json, in sweep order."""
    points: dict[int, dict[str, Any]] = {}
    groups: dict[int, list[int]] = {}
    for i, m in enumerate(measured):
        groups.setdefault(m.point_index, []).append(i)
        entry = points.setdefault(
            m.point_index, {"label": m.point_label, "arrival": m.point, "repeats": [], "metrics": {}}
        )
        start, end = window(m.drive.requests)
        entry["repeats"].append(
            {
                "repeat": m.repeat,
                "status": m.drive.status,
                "window": [start - origin, end - origin],
                "not_submitted": m.drive.not_submitted,
                "metrics": per_repeat[i],
                "decode_batches": decode_batches(m.drive.steps),
                **({"traced": True} if m.traced else {}),
            }
        )
    for idx, members in groups.items():
        untraced = [i for i in members if not measured[i].traced]
        whole = whole_repeats(untraced, lambda i: measured[i].drive.status)
        points[idx]["metrics"] = point_summary([per_repeat[i] for i in whole])
    return [points[k] for k in sorted(points)]


def unavailable_reasons(
    telemetry: TelemetrySampler | None, scenario: Scenario, peak: PeakChoice, device: str
) -> dict[str, str]:
    """Figures that are NaN by necessity, with the reason (a report says "unavailable", not 0)."""
    out: dict[str, str] = {}
    if telemetry is None:
        reason = "telemetry is turned off in the scenario"
        out.update({k: reason for k in ("gpu_telemetry", "cpu_util_mean", "rss_max")})
    elif not telemetry.nvml_available:
        out["gpu_telemetry"] = f"GPU utilisation, memory, power, energy and clocks: {telemetry.nvml_reason}"
    if peak.peak is None:
        why = peak.why_none or f"no peak known for {device}"
        out["decode_bw_util_mean"] = why
        out["prefill_flop_util_mean"] = why
    if not scenario.slo.defined:
        out["goodput"] = "the scenario sets no SLO"
    return out
