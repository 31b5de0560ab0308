"""Quality beside speed: a variant's next-token distributions and greedy outputs against the baseline's
(``measure.py`` runs one side in its own process, ``compare.py`` turns the two into figures)."""

from __future__ import annotations

from llmbench.bench.quality.compare import RANDOM_WEIGHTS_NOTE, first_divergence, position_kl, summarise
from llmbench.bench.quality.measure import QualitySettings, run_side

__all__ = [
    "RANDOM_WEIGHTS_NOTE",
    "QualitySettings",
    "first_divergence",
    "position_kl",
    "run_side",
    "summarise",
]
