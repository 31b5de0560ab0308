"""One run: a resolved scenario against one backend (the engine, or a peer), measured and stored.

Order: check the backend's options -> open the result folder -> start telemetry -> start the backend
(its startup costs recorded apart) -> warm-up requests (discarded) -> for each sweep point, each repeat:
build the requests, serve them -> write the store. A ``sweep`` arrival's fraction points get their rate
from what its throughput point measured, just before they run. Ctrl-C or a backend error stops the
measuring; what was measured is written with status "incomplete" and the reason, then the error goes up
to the caller.
Every backend's records go through the same metrics, tables and store. Nothing here prints: progress
and messages go through a :class:`RunEvents` the caller supplies.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import time
import traceback
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import numpy as np

from llmbench.bench.arrivals import arrival_offsets, at_measured_rate, point_label
from llmbench.bench.backends import Backend, make_backend
from llmbench.bench.backends.engine import engine_config, sampling_params
from llmbench.bench.derived import step_utilisation
from llmbench.bench.driver import DriveResult, Progress
from llmbench.bench.errors import RunFailed
from llmbench.bench.hardware import (
    busy_warning,
    command_line,
    git_commit,
    machine,
    oversubscribed_warning,
    set_torch_threads,
    versions,
)
from llmbench.bench.memory import memory_summary
from llmbench.bench.peaks import choose_peak, derived_labels, peak_meta
from llmbench.bench.repeat_warnings import repeat_warnings
from llmbench.bench.scenario.loader import ResolvedScenario, scenario_dict
from llmbench.bench.slow_steps import SLOW_FACTOR, find_slow_steps, slow_step_warning
from llmbench.bench.store import RunWriter
from llmbench.bench.summary import Measured, build_summary, repeat_metrics, unavailable_reasons
from llmbench.bench.tables import (
    REQUEST_COLUMNS,
    STEP_COLUMNS,
    frame,
    request_rows,
    step_rows,
    telemetry_frame,
)
from llmbench.bench.telemetry import TelemetrySampler
from llmbench.bench.workload import RequestSpec, build_requests, check_prompt_file, context_check

SALT_PER_POINT = 10_000  # prompt salt = point index * this + repeat index


class RunEvents(Protocol):
    def message(self, level: str, text: str) -> None: ...  # level: "info" | "warning"

    def phase(self, text: str) -> None: ...

    def progress(self, label: str, repeat: int, progress: Progress) -> None: ...


class QuietEvents:
    def message(self, level: str, text: str) -> None:
        pass

    def phase(self, text: str) -> None:
        pass

    def progress(self, label: str, repeat: int, progress: Progress) -> None:
        pass


class RunRequest(NamedTuple):
    resolved: ResolvedScenario
    out_root: Path = Path("results")
    variant: str = "default"
    run_dir: Path | None = (
        None  # exact destination (ablation children); default: <out_root>/<scenario>/<ts>-<variant>
    )
    ablation: str | None = None  # groups runs that belong together (an ablation)
    repeat_index: int | None = None  # run only this repeat (ablation children interleave repeats)
    slow_factor: float = SLOW_FACTOR  # a step this many times the median of its kind is slow
    step_observer: Any = None  # sees every measured engine step (``llmbench profile``'s window)


class RunOutcome(NamedTuple):
    run_dir: Path
    status: str  # "complete" | "incomplete"
    stop_reason: str | None  # "interrupted" | "failed" | "timeout" | None
    meta: dict[str, Any]
    summary: dict[str, Any]


def _warmup_specs(specs: list[RequestSpec], n: int, vocab: int, seed: int) -> list[RequestSpec]:
    """``n`` requests shaped like the workload's, with fresh token ids (no prefix-cache help later)."""
    rng = np.random.default_rng([seed, 0x5EED])
    shapes = itertools.islice(itertools.cycle(specs), n)
    return [
        RequestSpec(f"warmup-{i}", rng.integers(0, vocab, size=s.input_len).tolist(), s.max_tokens)
        for i, s in enumerate(shapes)
    ]


class _Measuring:
    """State of one run while it is measured; kept so an interruption can still write it out."""

    def __init__(self) -> None:
        self.measured: list[Measured] = []
        self.warnings: list[str] = []
        self.stop_reason: str | None = None
        self.error: str | None = None


def _measure(req: RunRequest, backend: Backend, events: RunEvents, state: _Measuring) -> None:
    scenario = req.resolved.scenario
    specs_by_salt: dict[int, list[RequestSpec]] = {}

    def specs_for(salt: int) -> list[RequestSpec]:
        if salt not in specs_by_salt:
            fits = context_check(backend.max_model_len, backend.name)
            specs_by_salt[salt] = build_requests(
                scenario.workload, backend.tokenizer, backend.vocab_size, scenario.seed, salt, fits
            )
        return specs_by_salt[salt]

    repeats = [req.repeat_index] if req.repeat_index is not None else list(range(scenario.repeats))
    first = specs_for(repeats[0])  # also checks that the workload fits before anything runs
    points = scenario.arrival.points
    if scenario.warmup:
        # Warm up under the first point's arrival process, so the kinds of step it runs (prefill, decode,
        # mixed) and their shapes have all been through the backend once before the clock counts.
        events.phase(f"warm-up: {scenario.warmup} requests")
        warm = _warmup_specs(first, scenario.warmup, backend.vocab_size, scenario.seed)
        warm_point = scenario.arrival.warmup_point
        offsets = arrival_offsets(warm_point, warm, np.random.default_rng([scenario.seed, 0x5EED]))
        result = backend.run(
            warm,
            offsets,
            concurrency=warm_point.get("concurrency"),
            tag="w-",
            max_duration=None,
            on_progress=None,
        )
        if result.status != "complete":
            state.stop_reason, state.error = result.status, result.error
            return
    if req.step_observer is not None:  # after the warm-up: it sees measured steps only
        backend.step_observer = req.step_observer
    for pi, point in enumerate(points):
        point = at_measured_rate(
            point, [m.drive for m in state.measured if m.point.get("sweep") == "throughput"]
        )
        label = point_label(point)
        if "capacity" in point:
            events.message(
                "info",
                f"{label}: {point['rate']:.3g} req/s, {point['fraction']:g} x the {point['capacity']:.3g} "
                "req/s the throughput point reached",
            )
        for r in repeats:
            # Fresh random prompt tokens and arrival times per (point, repeat), the same in every variant
            # of an ablation: repeats sample the workload, variants of one repeat are paired on it.
            specs = specs_for(pi * SALT_PER_POINT + r)
            offsets = arrival_offsets(point, specs, np.random.default_rng([scenario.seed, pi, r]))
            if state.measured:  # a repeat must not hit prefixes an earlier one cached
                backend.between_repeats()
            events.phase(f"{label}, repeat {r + 1}/{max(repeats) + 1}" if len(repeats) > 1 else label)
            if req.step_observer is not None:
                req.step_observer.begin_repeat(pi, r, r == repeats[-1])
            result: DriveResult = backend.run(
                specs,
                offsets,
                concurrency=point.get("concurrency"),
                tag=f"p{pi}r{r}-",
                max_duration=scenario.max_duration_s,
                on_progress=lambda p, label=label, r=r: events.progress(label, r, p),
            )
            state.measured.append(Measured(pi, label, point, r, result))
            state.warnings += repeat_warnings(f"{label} repeat {r}", result, point, offsets is not None)
            if result.status == "timeout":
                state.warnings.append(
                    f"{label} repeat {r}: stopped after max_duration_s={scenario.max_duration_s}"
                )
            elif result.status != "complete":
                state.stop_reason, state.error = result.status, result.error
                return


def execute_run(req: RunRequest, events: RunEvents | None = None) -> RunOutcome:
    """Measure and store one run (see the module docstring); torch's thread count is restored after."""
    import torch

    backend = make_backend(req.resolved.scenario)  # option errors go up before anything is written
    if getattr(backend, "launched_follower", False):
        backend.start()  # torchrun's rank > 0: serves rank 0's steps and exits, writing nothing
    check_prompt_file(req.resolved.scenario.workload, backend.vocab_size)  # token ids, before any cost
    threads_before = torch.get_num_threads()
    try:
        return _execute(req, backend, events or QuietEvents())
    finally:
        torch.set_num_threads(threads_before)


def _execute(req: RunRequest, backend: Backend, events: RunEvents) -> RunOutcome:
    scenario = req.resolved.scenario
    writer = RunWriter(req.out_root, scenario.name, req.variant, req.run_dir)
    state = _Measuring()
    threads = set_torch_threads(scenario.cpu_threads)
    for warning in (busy_warning(threads), oversubscribed_warning(scenario.cpu_threads)):
        if warning:
            state.warnings.append(warning)
    started = time.time()
    origin = time.perf_counter()
    telemetry = None
    started_backend = False
    if scenario.telemetry.enabled:
        torch_device = backend.device if backend.device != "remote" else None
        telemetry = TelemetrySampler(scenario.telemetry.period_ms / 1e3, backend.cuda_indices, torch_device)
        telemetry.start()
    try:
        where = "a server" if backend.device == "remote" else backend.device
        events.phase(f"starting the {backend.name} backend ({scenario.model} on {where})")
        t0 = time.perf_counter()
        started_backend = True
        backend.start()
        init_time = time.perf_counter() - t0
        try:
            _measure(req, backend, events, state)
        except KeyboardInterrupt:
            state.stop_reason = "interrupted"
        except Exception:
            if not state.measured:
                raise
            state.stop_reason, state.error = "failed", traceback.format_exc()
    except BaseException:
        _stop(telemetry, backend if started_backend else None)
        writer.discard()  # nothing was measured
        raise
    _stop(telemetry, backend)
    state.warnings += backend.warnings
    if not state.measured and state.stop_reason is not None:
        writer.discard()
        if state.stop_reason == "interrupted":
            raise KeyboardInterrupt
        raise RunFailed(f"the run failed before anything was measured:\n{_last_line(state.error)}")

    rows = telemetry.rows() if telemetry is not None else []
    samples = telemetry.sample_intervals() if telemetry is not None else []
    peak = choose_peak(backend.device)  # measured on this machine, else the datasheet's, else none
    if peak.warning:
        state.warnings.append(peak.warning)
    per_repeat, req_rows, step_rows_, slow = [], [], [], []
    engine_options = backend.describe() if backend.name == "engine" else None
    for m in state.measured:
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
        req_rows += request_rows(m.point_label, m.repeat, m.drive.requests, scenario.slo, origin)
        step_rows_ += step_rows(m.point_label, m.repeat, m.drive.steps, util, origin, slow_here)
    if line := slow_step_warning(slow, req.slow_factor):
        state.warnings.append(f"{line} (steps.parquet: slow, slow_causes)")

    status = "complete" if state.stop_reason is None else "incomplete"
    unavailable = {
        **unavailable_reasons(telemetry, scenario, peak, backend.device),
        **backend.unavailable,
    }
    meta = {
        **_meta(req, backend, state, status),
        "startup": {**backend.startup, "engine_init_time": init_time},
        "peak": peak_meta(peak),
        "cpu_threads": threads,
        "telemetry": {
            "enabled": scenario.telemetry.enabled,
            "period_ms": scenario.telemetry.period_ms,
            "nvml": bool(telemetry and telemetry.nvml_available),
        },
        "unavailable": unavailable,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    summary = {
        "status": status,
        "stop_reason": state.stop_reason,
        "scenario": scenario.name,
        "variant": req.variant,
        "backend": backend.name,
        "model": scenario.model,
        "points": build_summary(state.measured, per_repeat, origin),
        "warnings": state.warnings,
        "unavailable": unavailable,
        "labels": derived_labels(peak.peak),  # the derived figures' rows name the peak they divide by
    }
    tables = {
        "requests": frame(req_rows, REQUEST_COLUMNS),
        "steps": frame(step_rows_, STEP_COLUMNS),
        "telemetry": telemetry_frame(rows, origin),
    }
    run_dir = writer.finish(meta, summary, tables)
    if state.stop_reason == "failed":
        raise RunFailed(
            f"the run failed; what was measured is kept in {run_dir}:\n{_last_line(state.error)}",
            str(run_dir),
        )
    return RunOutcome(run_dir, status, state.stop_reason, meta, summary)


def _meta(req: RunRequest, backend: Backend, state: _Measuring, status: str) -> dict[str, Any]:
    """What the run was: scenario as resolved, backend as resolved, versions, machine, commit, command."""
    scenario = req.resolved.scenario
    described = backend.describe()
    info = backend.model_info
    return {
        "llmbench_version": versions().get("llmbench"),
        "status": status,
        "stop_reason": state.stop_reason,
        "error": state.error,
        "scenario_name": scenario.name,
        "scenario_path": str(req.resolved.path),
        "scenario": scenario_dict(scenario),
        "overrides": list(req.resolved.overrides),
        "profile": req.resolved.profile._asdict(),
        "points": list({m.point_label: m.point for m in state.measured}.values()),  # with sweep rates
        "variant": req.variant,
        "ablation": req.ablation,
        "repeat_index": req.repeat_index,
        "seed": scenario.seed,
        "backend": backend.name,
        "backend_config": described,
        "engine_options": scenario.engine,
        "engine_config": described if backend.name == "engine" else None,
        "model_info": dataclasses.asdict(info) if dataclasses.is_dataclass(info) else info,
        "versions": versions(),
        "machine": machine(),
        "git": git_commit(),
        "command_line": command_line(),
        "pid": os.getpid(),
    }


def _stop(telemetry: TelemetrySampler | None, backend: Backend | None) -> None:
    if telemetry is not None:
        telemetry.stop()
    if backend is not None:
        backend.shutdown()


def _last_line(text: str | None) -> str:
    lines = [ln for ln in (text or "").strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "(no message)"


__all__ = [
    "QuietEvents",
    "RunEvents",
    "RunOutcome",
    "RunRequest",
    "engine_config",
    "execute_run",
    "sampling_params",
]
