"""Sampling token lengths from a scenario's :class:`LengthDist`.

Lengths are integers >= 1. normal and lognormal are parameterised by the mean and standard deviation of
the lengths themselves; lognormal's mu/sigma follow from them (sigma^2 = ln(1 + std^2/mean^2),
mu = ln(mean) - sigma^2/2), then values are rounded and clipped to [min (default 1), max].
"""

from __future__ import annotations

import numpy as np

from llmbench.bench.scenario.workload_schema import LengthDist, lognormal_params


def sample_lengths(dist: LengthDist, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` lengths, int64, each within the distribution's bounds."""
    if dist.dist == "fixed":
        return np.full(n, dist.value, dtype=np.int64)
    if dist.dist == "uniform":
        return rng.integers(dist.min, dist.max + 1, size=n, dtype=np.int64)  # both ends included
    if dist.dist == "normal":
        raw = rng.normal(dist.mean, dist.std, size=n)
    else:
        mu, sigma = lognormal_params(dist.mean, dist.std)
        raw = rng.lognormal(mu, sigma, size=n)
    lo = dist.min if dist.min is not None else 1
    hi = dist.max if dist.max is not None else np.iinfo(np.int64).max
    return np.clip(np.rint(raw), lo, hi).astype(np.int64)
