"""What a run writes (meta.json, summary.json, its tables), assembled from what it has measured so far.

The runner assembles them at the end, and, while more is still to be measured, after each repeat as a
checkpoint in the run's working folder (``RunWriter.checkpoint``), marked incomplete with the stop reason
"died": a process killed, out of memory or crashed leaves the repeats it finished where readers find them
(``store.find_runs``); a run that ends overwrites its checkpoint with its own record.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import TYPE_CHECKING, Any, NamedTuple

from llmbench.bench.derived import step_utilisation
from llmbench.bench.hardware import command_line, git_commit, machine, versions
from llmbench.bench.memory import memory_summary
from llmbench.bench.peaks import choose_peak, derived_labels, peak_meta
from llmbench.bench.scenario.loader import scenario_dict
from llmbench.bench.slow_steps import SLOW_COLUMNS, find_slow_steps, slow_step_warning
from llmbench.bench.store import RESULT_FORMAT
from llmbench.bench.summary import Measured, build_summary, repeat_metrics, unavailable_reasons
from llmbench.bench.tables import (
    REQUEST_COLUMNS,
    STEP_COLUMNS,
    frame,
    request_rows,
    step_rows,
    telemetry_frame,
)

if TYPE_CHECKING:
    from llmbench.bench.backends import Backend
    from llmbench.bench.runner import RunRequest
    from llmbench.bench.telemetry import TelemetrySampler

DIED = "died"  # a checkpoint's stop reason: what a reader sees when the process never wrote its record
DIED_ERROR = (
    "the process ended before the run did (killed, out of memory or crashed); these are the repeats it "
    "finished before"
)


class RunContext(NamedTuple):
    """What stays fixed while one run is measured."""

    req: RunRequest
    backend: Backend
    telemetry: TelemetrySampler | None
    origin: float  # perf_counter at the run's start: the tables' times count from it
    started: float  # wall-clock time at the run's start
    init_time: float  # seconds the backend took to start
    base_meta: dict[str, Any]  # run_meta(), and the torch threads the run took (cpu_threads)


def run_meta(req: RunRequest, backend: Backend) -> dict[str, Any]:
    """What the run is and where it ran: scenario as resolved, versions, machine, commit, command (taken
    once: the machine's and the commit's cost a process or a driver call)."""
    scenario = req.resolved.scenario
    return {
        "format": RESULT_FORMAT,
        "llmbench_version": versions().get("llmbench"),
        "scenario_name": scenario.name,
        "scenario_path": str(req.resolved.path),
        "scenario": scenario_dict(scenario),
        "overrides": list(req.resolved.overrides),
        "profile": req.resolved.profile._asdict(),
        "variant": req.variant,
        "ablation": req.ablation,
        "repeat_index": req.repeat_index,
        "seed": scenario.seed,
        "backend": backend.name,
        "engine_options": scenario.engine,
        "versions": versions(),
        "machine": machine(),
        "git": git_commit(),
        "command_line": command_line(),
        "pid": os.getpid(),
    }


def assemble(
    ctx: RunContext, measured: list[Measured], warnings: list[str], stop_reason: str | None, error: str | None
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """meta.json, summary.json and the tables of the repeats ``measured``; complete when nothing stopped
    the run (``stop_reason`` None)."""
    req, backend, telemetry = ctx.req, ctx.backend, ctx.telemetry
    scenario = req.resolved.scenario
    warnings = [*warnings, *backend.warnings]
    rows = telemetry.rows() if telemetry is not None else []
    samples = telemetry.sample_intervals() if telemetry is not None else []
    peak = choose_peak(backend.device)  # measured on this machine, else the datasheet's, else none
    if peak.warning:
        warnings.append(peak.warning)
    per_repeat, req_rows, step_rows_, slow = [], [], [], []
    described = backend.describe()  # as it ran, with what it learnt while running (the attention used...)
    engine_options = described if backend.name == "engine" else None
    for m in measured:
        slow_here = find_slow_steps(m.drive.steps, req.slow_factor, samples)
        slow += slow_here
        util = step_utilisation(m.drive.steps, backend.model_info, peak.peak)
        metrics = repeat_metrics(m, scenario.slo, rows, util)
        metrics.update(
            memory_summary(
                m.drive.steps, m.drive.requests, backend.startup, engine_options, backend.max_model_len
            )
        )
        for name in metrics:  # what this backend cannot know is NaN, not the 0 a sum of nothing gives
            if name in backend.unavailable:
                metrics[name] = math.nan
        per_repeat.append(metrics)
        req_rows += request_rows(m.point_label, m.repeat, m.drive.requests, scenario.slo, ctx.origin)
        step_rows_ += step_rows(m.point_label, m.repeat, m.drive.steps, util, ctx.origin, slow_here)
    if line := slow_step_warning(slow, req.slow_factor):
        warnings.append(f"{line} ({SLOW_COLUMNS})")

    status = "complete" if stop_reason is None else "incomplete"
    unavailable = {
        **unavailable_reasons(telemetry, scenario, peak, backend.device),
        **backend.unavailable,
    }
    info = backend.model_info
    meta = {
        **ctx.base_meta,
        "backend_config": described,
        "engine_config": described if backend.name == "engine" else None,
        "model_info": dataclasses.asdict(info) if dataclasses.is_dataclass(info) else info,
        "status": status,
        "stop_reason": stop_reason,
        "error": error,
        "points": list({m.point_label: m.point for m in measured}.values()),  # with sweep rates
        "startup": {**backend.startup, "engine_init_time": ctx.init_time},
        "peak": peak_meta(peak),
        "telemetry": {
            "enabled": scenario.telemetry.enabled,
            "period_ms": scenario.telemetry.period_ms,
            "nvml": bool(telemetry and telemetry.nvml_available),
        },
        "unavailable": unavailable,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(ctx.started)),
        "started_unix": ctx.started,  # to the microsecond: a run's repeats measured apart are put on one clock
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    summary = {
        "format": RESULT_FORMAT,
        "status": status,
        "stop_reason": stop_reason,
        "scenario": scenario.name,
        "variant": req.variant,
        "backend": backend.name,
        "model": scenario.model,
        "points": build_summary(measured, per_repeat, ctx.origin),
        "warnings": warnings,
        "unavailable": unavailable,
        "labels": derived_labels(peak.peak),  # the derived figures' rows name the peak they divide by
    }
    tables = {
        "requests": frame(req_rows, REQUEST_COLUMNS),
        "steps": frame(step_rows_, STEP_COLUMNS),
        "telemetry": telemetry_frame(rows, ctx.origin),
    }
    return meta, summary, tables
