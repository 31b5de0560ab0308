"""Ablations: the planner (``plan.py``) and the process-per-variant executor (``execute.py``)."""

from __future__ import annotations

from llmbench.bench.ablation.execute import AblationOutcome, VariantState, run_ablation
from llmbench.bench.ablation.plan import BASELINE, DESIGNS, Toggle, Variant, parse_toggle, plan

__all__ = [
    "BASELINE",
    "DESIGNS",
    "AblationOutcome",
    "Toggle",
    "Variant",
    "VariantState",
    "parse_toggle",
    "plan",
    "run_ablation",
]
