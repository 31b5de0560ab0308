"""Ablations: what was asked, checked whole (``request.py``), the planner of variants (``plan.py``) and the
process-per-variant executor (``execute.py``); the variants are engine options, or backends serving the
same scenario."""

from __future__ import annotations

from llmbench.bench.ablation.execute import AblationOutcome, VariantState, run_ablation
from llmbench.bench.ablation.plan import (
    BACKENDS_DESIGN,
    BASELINE,
    DESIGNS,
    BackendVariant,
    Toggle,
    Variant,
    parse_toggle,
    parse_toggles,
    plan,
    plan_backends,
)

__all__ = [
    "BACKENDS_DESIGN",
    "BASELINE",
    "DESIGNS",
    "BackendVariant",
    "AblationOutcome",
    "Toggle",
    "Variant",
    "VariantState",
    "parse_toggle",
    "parse_toggles",
    "plan",
    "plan_backends",
    "run_ablation",
]
