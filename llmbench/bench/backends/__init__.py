"""Backends: who serves a scenario's workload. ``engine`` is llmbench's own; the peers are the same model
in Hugging Face ``transformers`` and any ``openai``-compatible completions server.

Which backends exist, how each is built and whether it is remote is the registry,
``bench/scenario/backend_registry.py``. ``make_backend`` builds the one a scenario names from its entry:
options resolved and checked without loading anything (so a bad option is an error before a result
folder exists); the runner then starts it, runs every point through it and stores its records like any
other.
"""

from __future__ import annotations

import importlib

from llmbench.bench.backends.base import ENGINE_ONLY, Backend, engine_only_reasons
from llmbench.bench.errors import BenchError
from llmbench.bench.scenario.backend_registry import BACKENDS, unsupported
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
    entry = BACKENDS.get(names[0])
    if entry is None:
        raise BenchError(unsupported(names[0]))
    module, _, cls = entry.builder.partition(":")
    return getattr(importlib.import_module(module), cls)(scenario)


def backend_problem(scenario: Scenario) -> str | None:
    """Why this scenario's backend cannot run here, or None (an ablation checks every variant with it)."""
    try:
        make_backend(scenario)
    except (BenchError, ValueError) as exc:  # ValueError: the engine's ConfigError, ModelConfigError
        return str(exc)
    return None


__all__ = ["BACKENDS", "ENGINE_ONLY", "Backend", "backend_problem", "engine_only_reasons", "make_backend"]
