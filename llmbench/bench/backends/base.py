"""What the runner needs from a backend, whoever serves the workload.

A backend is built cheaply from the scenario (its options resolved and checked: a bad option is an error
before any result folder exists), then ``start()`` pays the one-off costs (weights, compile, graphs,
connection checks) that are kept apart from the measurements, then ``run()`` serves one run point's
requests and returns a :class:`DriveResult` of :class:`RequestRecord` -- the same records, tables,
metrics and reports for every backend. What a backend cannot measure is named in ``unavailable`` with
the reason (the summary and report print "unavailable", never a 0).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from llmbench.bench.driver import DriveResult, Progress
from llmbench.bench.metrics import STEP_FIGURES
from llmbench.bench.scenario.backend_registry import BACKENDS
from llmbench.bench.workload.spec import Encoder, RequestSpec

OnProgress = Callable[[Progress], None]

# Metrics built on the engine's own bookkeeping: steps, KV blocks, prefix-cache hits, preemptions.
ENGINE_ONLY = (*STEP_FIGURES, "prefix_cache_hit_rate", "preemptions")


def engine_only_reasons(backend: str) -> dict[str, str]:
    why = (
        f"engine-only: the {backend} backend reports no engine steps, KV blocks, graph buckets, "
        "prefix-cache hits or preemptions"
    )
    return dict.fromkeys(ENGINE_ONLY, why)


def peer_unavailable(backend: str) -> dict[str, str]:
    """What a peer backend cannot give by what it is (its registry entry): the engine's own figures, and,
    when it is remote, what only the server's machine sees. The backend adds what is its alone."""
    reasons = engine_only_reasons(backend)
    if BACKENDS[backend].remote:
        reasons["gpu_telemetry"] = (
            f"the {backend} backend measures a remote server: its GPUs are not visible here"
        )
        reasons["peak_memory"] = "the server's memory is not visible to the client"
        reasons |= dict.fromkeys(
            ("load_time", "compile_time", "graph_capture_time"),
            "a remote server loads, compiles and captures before the benchmark starts, out of the client's "
            "sight (its start-up here is the server check, server_check_time)",
        )
    return reasons


def untaken_engine_options(scenario: Any, backend: str, taken: tuple[str, ...]) -> list[str]:
    """A warning naming the ``engine:`` options a peer backend does not apply (a scenario shared with the
    engine, or an ablation of backends, sets them for the engine); none when it takes all it was given."""
    left = sorted(set(scenario.engine) - set(taken))
    if not left:
        return []
    takes = f"it takes only {', '.join(taken)}" if taken else "it takes none"
    return [
        f"engine options the {backend} backend does not apply, so they do not shape this run: {', '.join(left)} "
        f"({takes}; its own options go under backend_options.{backend})"
    ]


class Backend(Protocol):
    name: str  # its key in the registry (bench/scenario/backend_registry.py)
    device: str  # where the model runs: "cpu", "cuda", "cuda:N", or "remote" (a remote backend's)
    cuda_indices: list[int] | None  # GPUs whose telemetry describes this run (None: none visible)
    tp: int
    tokenizer: Encoder
    vocab_size: int
    max_model_len: int | None  # None: not known here (a remote server decides)
    model_info: Any | None  # the engine's ModelInfo (weights, KV bytes per token), for derived figures
    startup: dict[str, Any]  # one-off costs in seconds: load_time, compile_time, graph_capture_time, ...
    unavailable: dict[str, str]  # metric (or metric family, e.g. "queue") -> why this backend cannot give it
    warnings: list[str]  # what the measurements should be read with (added to the run's warnings)

    def describe(self) -> dict[str, Any]:
        """The backend's options as resolved (written to meta.json)."""
        ...

    def start(self) -> None: ...

    def run(
        self,
        specs: list[RequestSpec],
        offsets: list[float] | None,
        *,
        concurrency: int | None,
        tag: str,
        max_duration: float | None,
        on_progress: OnProgress | None,
    ) -> DriveResult:
        """Serve one run point: open loop when ``offsets`` are given, else ``concurrency`` in flight."""
        ...

    def between_repeats(self) -> None:
        """Forget what could help the next repeat (the engine's prefix cache)."""
        ...

    def shutdown(self) -> None: ...


def check_drive_args(offsets: list[float] | None, concurrency: int | None) -> None:
    if offsets is None and concurrency is None:
        raise ValueError(
            "a backend runs arrival offsets (open loop, capped by a concurrency) or a concurrency"
        )
