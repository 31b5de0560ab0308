"""The built-in engine as a backend: ``LLMEngine`` in this process, fed step by step by ``driver.drive``."""

from __future__ import annotations

import dataclasses
import os
import zlib
from typing import Any

from llmbench.bench.backends.base import OnProgress, check_drive_args
from llmbench.bench.driver import DriveResult, drive
from llmbench.bench.scenario.schema import Scenario
from llmbench.bench.workload.spec import RequestSpec


def engine_options(scenario: Scenario) -> Any:
    """The scenario's engine options as an ``EngineConfig`` (ConfigError for a malformed one)."""
    from llmbench.engine.config import EngineConfig

    return EngineConfig.from_options(scenario.model, **scenario.engine)


def engine_config(scenario: Scenario) -> Any:
    """The options as an engine built now in this process would run them (``ResolvedConfig``); raises
    the engine's ConfigError for options that cannot apply here."""
    from llmbench.engine.resolve import resolve_here

    return resolve_here(engine_options(scenario))


def request_seed(scenario: Scenario, spec: RequestSpec) -> int | None:
    """Per-request sampling seed, the same in every backend that takes one: from ``sampling.seed`` (or
    the scenario's seed) and the request id. None when greedy, or when ``sampling.seed`` is ``engine``
    (the backend's own)."""
    s = scenario.sampling
    if s.temperature == 0 or s.seed == "engine":
        return None
    base = scenario.seed if s.seed is None else s.seed
    return (base * 1_000_003 + zlib.crc32(spec.request_id.encode())) % 2**31


def sampling_params(scenario: Scenario, spec: RequestSpec) -> Any:
    from llmbench.engine.sampling_params import SamplingParams

    s = scenario.sampling
    return SamplingParams(
        temperature=s.temperature,
        top_k=s.top_k,
        top_p=s.top_p,
        min_p=s.min_p,
        max_tokens=spec.max_tokens,
        ignore_eos=s.ignore_eos,
        seed=request_seed(scenario, spec),
    )


class EngineBackend:
    name = "engine"

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.options = engine_options(scenario)
        self.config = engine_config(scenario)  # ConfigError before anything is written
        from llmbench.models.registry import resolve_model

        # config.json only (a broken folder is a ModelError here, before anything is written); the
        # vocabulary lets the runner check a prompt file's token ids before the engine starts.
        self.vocab_size: int = resolve_model(self.config.model)[0].vocab_size
        self.device = self.config.device
        self.tp = self.config.tp
        self.cuda_indices: list[int] | None = None
        from llmbench.engine.tp import launched_rank

        launched = launched_rank() if self.config.tp > 1 else None
        # A rank > 0 that torchrun started serves rank 0's steps inside start() and exits there.
        self.launched_follower = launched is not None and launched.rank > 0
        if self.config.is_cuda:
            base = int(self.device.split(":")[1]) if ":" in self.device else 0
            if launched is not None:  # under torchrun: this host's ranks only (telemetry is per host)
                local = int(os.environ.get("LOCAL_WORLD_SIZE", launched.world_size))
                self.cuda_indices = list(range(min(local, launched.world_size)))
            else:
                self.cuda_indices = list(range(base, base + self.config.tp))
        self.engine: Any = None
        self.step_observer: Any = None  # set by the runner for the measured steps (bench/profile/window.py)
        self.unavailable: dict[str, str] = {}
        self.startup: dict[str, Any] = {}
        self.warnings: list[str] = []

    def describe(self) -> dict[str, Any]:
        """The resolved options: what runs (once started, what the engine itself resolved)."""
        return self.config.to_dict() if self.engine is None else self.engine.config.to_dict()

    def start(self) -> None:
        from llmbench.engine.llm_engine import LLMEngine

        self.engine = LLMEngine(self.options)
        self.startup = dataclasses.asdict(self.engine.startup)
        info = self.engine.model_info
        self.model_info, self.tokenizer = info, self.engine.tokenizer
        self.vocab_size, self.max_model_len = info.vocab_size, info.max_model_len

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
        check_drive_args(offsets, concurrency)
        observer = self.step_observer
        result = drive(
            self.engine if observer is None else observer.observe(self.engine),
            specs,
            offsets,
            lambda s: sampling_params(self.scenario, s),
            concurrency=concurrency,
            tag=tag,
            max_duration=max_duration,
            on_progress=on_progress,
        )
        if observer is not None:  # interrupted or not: what it recorded is closed now
            observer.end_of_run(self.engine)
        return result

    def between_repeats(self) -> None:
        self.engine.reset_prefix_cache()

    def shutdown(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
