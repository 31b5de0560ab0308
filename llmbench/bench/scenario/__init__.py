"""Scenario files: schema (``schema.py``; its workload section in ``workload_schema.py``, what every
section shares in ``fields.py``), readable errors (``errors.py``), loading (``loader.py``)."""

from __future__ import annotations

from llmbench.bench.scenario.loader import (
    AUTO,
    NONE,
    ProfileChoice,
    ResolvedScenario,
    load_scenario,
    scenario_dict,
)
from llmbench.bench.scenario.schema import SLO, Arrival, Sampling, Scenario
from llmbench.bench.scenario.workload_schema import LengthDist, Workload

__all__ = [
    "AUTO",
    "NONE",
    "SLO",
    "Arrival",
    "LengthDist",
    "ProfileChoice",
    "ResolvedScenario",
    "Sampling",
    "Scenario",
    "Workload",
    "load_scenario",
    "scenario_dict",
]
