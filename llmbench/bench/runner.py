"""One run: a resolved scenario against one backend (the engine, or a peer), measured and stored.

Order: check the backend's options -> open the result folder -> start telemetry -> start the backend
(its startup costs recorded apart) -> warm-up requests (discarded) -> for each sweep point, each repeat:
build the requests, serve them -> write the store. A ``sweep`` arrival's fraction points get their rate
from what its throughput point measured, just before they run. Ctrl-C or a backend error stops the
measuring; what was measured is written with status "incomplete" and the reason, then the error goes up
to the caller. After each repeat but the last, what is measured so far is written as a checkpoint
(``run_record.py``): a process killed outright keeps the repeats it finished.
Every backend's records go through the same metrics, tables and store. Nothing here prints: progress
and messages go through a :class:`RunEvents` the caller supplies.
"""

from __future__ import annotations

import itertools
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import numpy as np

from llmbench.bench.arrivals import arrival_offsets, at_measured_rate, in_flight_limit, point_label
from llmbench.bench.backends import Backend, make_backend
from llmbench.bench.driver import DriveResult, Progress
from llmbench.bench.errors import RunFailed, ScenarioError, StoreError
from llmbench.bench.hardware import busy_warning, oversubscribed_warning, set_torch_threads
from llmbench.bench.idle_settings import idle_settings
from llmbench.bench.repeat_warnings import repeat_warnings
from llmbench.bench.run_record import DIED, DIED_ERROR, RunContext, assemble, run_meta
from llmbench.bench.scenario.backend_registry import BACKENDS
from llmbench.bench.scenario.loader import ResolvedScenario
from llmbench.bench.slow_steps import SLOW_FACTOR
from llmbench.bench.store import RunWriter
from llmbench.bench.summary import Measured
from llmbench.bench.telemetry import TelemetrySampler
from llmbench.bench.workload import RequestSpec, build_workload, check_prompt_file, context_check, token_range
from llmbench.bench.workload_fits import fit_problem, longest_request
from llmbench.interrupts import held_interrupts
from llmbench.models.registry import check_model_files

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


class StepObserver(Protocol):
    """What sees a run's measured engine steps (``llmbench profile``'s window, bench/profile/window.py)."""

    repeat_traced: bool  # whether the profiler ran during the repeat under way (the runner records it)

    def observe(self, engine: Any) -> Any: ...  # the engine, as the driver is to step it

    def begin_repeat(self, point: int, repeat: int, last: bool) -> None: ...

    def end_of_run(self, engine: Any) -> None: ...  # a sweep point is over (or was interrupted)


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
    step_observer: StepObserver | None = None  # sees every measured engine step


class RunOutcome(NamedTuple):
    run_dir: Path
    status: str  # "complete" | "incomplete"
    stop_reason: str | None  # "interrupted" | "failed" | "timeout" | None
    meta: dict[str, Any]
    summary: dict[str, Any]
    told: frozenset[str] = frozenset()  # the summary's warnings already said through the run's events


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

    def __init__(self, events: RunEvents) -> None:
        self.events = events
        self.measured: list[Measured] = []
        self.warnings: list[str] = []  # the run's own; the backend's are added when it is written
        self.told: set[str] = set()
        self.stop_reason: str | None = None
        self.error: str | None = None
        self.checkpoint: Callable[[], None] | None = None  # writes what is measured so far

    def warn(self, *texts: str) -> None:
        """Warnings of the run, recorded and said as soon as they are known."""
        self.warnings += texts
        self.tell(texts)

    def tell(self, texts: Iterable[str]) -> None:
        """Say the warnings not said yet (the backend's, as it adds them): a user can stop a run that a
        warning makes pointless before it is measured, not only read why after it."""
        for text in texts:
            if text not in self.told:
                self.told.add(text)
                self.events.message("warning", text)

    def repeat_done(self, last: bool) -> None:
        """After each repeat but the run's last: a checkpoint, so that a process that dies keeps what it
        finished (run_record.py); one that cannot be written is a warning, and the run goes on."""
        if last or self.checkpoint is None:
            return
        try:
            self.checkpoint()
        except (OSError, StoreError) as exc:
            self.warn(f"no checkpoint of the repeats measured so far could be written: {exc}")
            self.checkpoint = None


def _measure(req: RunRequest, backend: Backend, events: RunEvents, state: _Measuring) -> None:
    scenario = req.resolved.scenario
    specs_by_salt: dict[int, list[RequestSpec]] = {}

    def specs_for(salt: int) -> list[RequestSpec]:
        if salt not in specs_by_salt:
            fits = context_check(backend.max_model_len, backend.name)
            built = build_workload(
                scenario.workload, backend.tokenizer, backend.vocab_size, scenario.seed, salt, fits
            )
            if not specs_by_salt:  # what a build leaves out is the same for every salt: said once
                state.warn(*built.warnings)
            specs_by_salt[salt] = built.requests
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
            concurrency=in_flight_limit(warm_point),
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
                concurrency=in_flight_limit(point),
                tag=f"p{pi}r{r}-",
                max_duration=scenario.max_duration_s,
                on_progress=lambda p, label=label, r=r: events.progress(label, r, p),
            )
            traced = req.step_observer is not None and req.step_observer.repeat_traced
            state.measured.append(Measured(pi, label, point, r, result, traced))
            state.warn(*repeat_warnings(f"{label} repeat {r}", result, point, offsets is not None))
            state.tell(backend.warnings)
            if result.status == "timeout":
                done = sum(x.finished for x in result.requests)
                state.warn(
                    f"{label} repeat {r}: stopped after max_duration_s={scenario.max_duration_s}; "
                    f"{done} of {len(result.requests) + result.not_submitted} requests completed"
                    + ("" if done else ": no latency was measured (raise max_duration_s)")
                )
            elif result.status != "complete":
                state.stop_reason, state.error = result.status, result.error
                return
            state.repeat_done(last=pi == len(points) - 1 and r == repeats[-1])


def preflight(resolved: ResolvedScenario, backend: Backend) -> None:
    """What is checked of a scenario against its backend before any cost (``run``, and ``run --dry-run``,
    which stops here): the model's checkpoint opens (a backend that loads it here: its files' headers), the
    workload fits the engine (its first request would be refused), its file reads as its reader will read
    it, its prompt ids lie in the model's vocabulary."""
    scenario = resolved.scenario
    if not BACKENDS[backend.name].remote:
        check_model_files(scenario.model)
    if (config := getattr(backend, "config", None)) is not None and (longest := longest_request(resolved)):
        if problem := fit_problem(config, longest):
            raise ScenarioError(problem)
    check_prompt_file(scenario.workload, backend.vocab_size, scenario.model)
    token_range(scenario.workload, backend.vocab_size)


def execute_run(req: RunRequest, events: RunEvents | None = None) -> RunOutcome:
    """Measure and store one run (see the module docstring); torch's thread count is restored after."""
    import torch

    backend = make_backend(req.resolved.scenario)  # option errors go up before anything is written
    if getattr(backend, "launched_follower", False):
        backend.start()  # torchrun's rank > 0: serves rank 0's steps and exits, writing nothing
    preflight(req.resolved, backend)
    threads_before = torch.get_num_threads()
    try:
        return _execute(req, backend, events or QuietEvents())
    finally:
        torch.set_num_threads(threads_before)


def _execute(req: RunRequest, backend: Backend, events: RunEvents) -> RunOutcome:
    scenario = req.resolved.scenario
    state = _Measuring(events)
    threads = set_torch_threads(scenario.cpu_threads)
    cpu_ranks = backend.tp if backend.device == "cpu" else 1
    idle = idle_settings(req.resolved, getattr(backend, "config", None), req.ablation is not None)
    for warning in (busy_warning(threads), oversubscribed_warning(scenario.cpu_threads, cpu_ranks), *idle):
        if warning:
            state.warn(warning)
    started = time.time()
    origin = time.perf_counter()
    telemetry = None
    started_backend = False
    # the run's working folder from here on: whatever stops the run before it measured (an interrupt
    # during start-up too) takes it away again, so no reader mistakes it for a run that died
    writer = RunWriter(req.out_root, scenario.name, req.variant, req.run_dir)
    try:
        if scenario.telemetry.enabled:
            torch_device = backend.device if backend.device != "remote" else None
            telemetry = TelemetrySampler(
                scenario.telemetry.period_ms / 1e3, backend.cuda_indices, torch_device
            )
            telemetry.start()
        state.tell(backend.warnings)  # what the backend knows of its options, before its start-up's cost
        where = "a server" if backend.device == "remote" else backend.device
        events.phase(f"starting the {backend.name} backend ({scenario.model} on {where})")
        t0 = time.perf_counter()
        started_backend = True
        backend.start()
        state.tell(backend.warnings)
        init_time = time.perf_counter() - t0
        base = {**run_meta(req, backend), "cpu_threads": threads}
        ctx = RunContext(req, backend, telemetry, origin, started, init_time, base)
        state.checkpoint = lambda: writer.checkpoint(
            *assemble(ctx, state.measured, state.warnings, DIED, DIED_ERROR)
        )
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
    # What was measured is written whole: a second Ctrl-C (or the SIGTERM of a parent that waits for this
    # process) while the backend shuts down or the run is written is held until it is written.
    with held_interrupts():
        _stop(telemetry, backend)
        if state.measured:
            meta, summary, tables = assemble(
                ctx, state.measured, state.warnings, state.stop_reason, state.error
            )
            run_dir = writer.finish(meta, summary, tables)
    if not state.measured:
        writer.discard()
        if state.stop_reason == "interrupted":
            raise KeyboardInterrupt
        raise RunFailed(f"the run failed before anything was measured:\n{_last_line(state.error)}")
    if state.stop_reason == "failed":
        raise RunFailed(
            f"the run failed; what was measured is kept in {run_dir}:\n{_last_line(state.error)}",
            str(run_dir),
        )
    return RunOutcome(run_dir, meta["status"], state.stop_reason, meta, summary, frozenset(state.told))


def _stop(telemetry: TelemetrySampler | None, backend: Backend | None) -> None:
    if telemetry is not None:
        telemetry.stop()
    if backend is not None:
        backend.shutdown()


def _last_line(text: str | None) -> str:
    """A traceback's last line, the error itself: a message of llmbench's own without its class's dotted path
    (``llmbench.engine.llm_engine.RequestError: request ...`` reads ``request ...``)."""
    lines = [ln for ln in (text or "").strip().splitlines() if ln.strip()]
    if not lines:
        return "(no message)"
    kind, sep, message = lines[-1].partition(": ")
    return message if sep and kind.startswith("llmbench.") and message else lines[-1]


__all__ = [
    "QuietEvents",
    "RunEvents",
    "RunOutcome",
    "RunRequest",
    "StepObserver",
    "execute_run",
]
