"""Backends: who serves a scenario's workload. ``engine`` is llmbench's own; the peers are the same model
in Hugging Face ``transformers`` and any ``openai``-compatible completions server.

``make_backend`` resolves and checks a scenario's backend options without loading anything (so a bad
option is an error before a result folder exists); the runner then starts it, runs every point through
it and stores its records like any other.
"""

from __future__ import annotations

from llmbench.bench.backends.base import ENGINE_ONLY, Backend, engine_only_reasons
from llmbench.bench.errors import BenchError
from llmbench.bench.scenario.backend_options import BACKENDS
from llmbench.bench.scenario.schema import Scenario


def make_backend(scenario: Scenario) -> Backend:
    """The scenario's one backend, options resolved (ConfigError / BenchError when they cannot apply)."""
    names = scenario.backends
    if len(names) != 1:
        raise BenchError(
            f"backend: this scenario lists {len(names)} backends ({', '.join(names)}); `run` measures one. "
            f"Compare them with `llmbench ablate SCENARIO` (each in its own process), or pick one with "
            f"--set backend={names[0]}"
        )
    name = names[0]
    if name == "engine":
        from llmbench.bench.backends.engine import EngineBackend

        return EngineBackend(scenario)
    if name == "transformers":
        from llmbench.bench.backends.transformers import TransformersBackend

        return TransformersBackend(scenario)
    if name == "openai":
        from llmbench.bench.backends.openai import OpenAIBackend

        return OpenAIBackend(scenario)
    raise BenchError(f"Unsupported backend: {name!r}. Supported: {', '.join(BACKENDS)}")


def backend_problem(scenario: Scenario) -> str | None:
    """Why this scenario's backend cannot run here, or None (an ablation checks every variant with it)."""
    try:
        make_backend(scenario)
    except (BenchError, ValueError) as exc:  # ValueError: the engine's ConfigError, ModelConfigError
        return str(exc)
    return None


__all__ = ["BACKENDS", "ENGINE_ONLY", "Backend", "backend_problem", "engine_only_reasons", "make_backend"]
