"""Summary statistics and percentile-bootstrap confidence intervals.

``distribution`` gives p50/p90/p95/p99/mean (linear-interpolated percentiles, NaN when empty).
``bootstrap_ci`` resamples with replacement and takes the (alpha/2, 1-alpha/2) quantiles of the
statistic; ``bootstrap_delta`` does the same for the difference stat(new) - stat(base) of two independent
samples, and for the relative difference against stat(base). Resampling is seeded, so reports are
reproducible; it is done in chunks so a large sample (pooled inter-token latencies) stays small in memory,
and a very large sample gets fewer resamples (at least 200) so an interval costs about the same at any size.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

PERCENTILES = (50, 90, 95, 99)
N_BOOT = 2000
MIN_BOOT = 200  # below this the 2.5% / 97.5% quantiles of the resamples get too coarse
_BOOT_ELEMENTS = 10_000_000  # resampled values per interval: large samples get fewer (tighter) resamples
_CHUNK_ELEMENTS = 4_000_000  # resampled values held at once

Stat = Callable[[np.ndarray, int], np.ndarray]  # (array, axis) -> statistic along that axis


def mean_stat(x: np.ndarray, axis: int) -> np.ndarray:
    return np.mean(x, axis=axis)


def percentile_stat(q: float) -> Stat:
    def stat(x: np.ndarray, axis: int) -> np.ndarray:
        return np.percentile(x, q, axis=axis)

    stat.__name__ = f"p{q:g}"
    return stat


def stat_for(name: str) -> Stat:
    """``"mean"`` or ``"p50"``/``"p99"``... as a statistic."""
    if name == "mean":
        return mean_stat
    if name.startswith("p"):
        return percentile_stat(float(name[1:]))
    raise ValueError(f"Unsupported statistic: {name!r}. Supported: mean, p50, p90, p95, p99")


def distribution(values: Sequence[float] | np.ndarray) -> dict[str, float]:
    """p50/p90/p95/p99/mean of finite values; NaN for each when there are none."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return {**{f"p{q}": math.nan for q in PERCENTILES}, "mean": math.nan}
    pct = np.percentile(x, PERCENTILES)
    return {**{f"p{q}": float(v) for q, v in zip(PERCENTILES, pct, strict=True)}, "mean": float(x.mean())}


class Interval(NamedTuple):
    value: float
    low: float
    high: float
    n: int


class Delta(NamedTuple):
    base: float
    new: float
    diff: Interval  # new - base
    rel: Interval  # (new - base) / base


def _finite(values: Sequence[float] | np.ndarray) -> np.ndarray:
    x = np.asarray(values, dtype=float)
    return x[np.isfinite(x)]


def _n_boot(n_boot: int, size: int) -> int:
    return min(n_boot, max(MIN_BOOT, _BOOT_ELEMENTS // max(1, size)))


def _resampled(x: np.ndarray, stat: Stat, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    out = np.empty(n_boot)
    chunk = max(1, _CHUNK_ELEMENTS // max(1, x.size))
    for start in range(0, n_boot, chunk):
        k = min(chunk, n_boot - start)
        idx = rng.integers(0, x.size, size=(k, x.size))
        out[start : start + k] = stat(x[idx], 1)
    return out


def bootstrap_ci(
    values: Sequence[float] | np.ndarray,
    stat: Stat = mean_stat,
    confidence: float = 0.95,
    n_boot: int = N_BOOT,
    seed: int = 0,
) -> Interval:
    """Point estimate and percentile-bootstrap interval; the interval is NaN with fewer than 2 values."""
    x = _finite(values)
    if x.size == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    value = float(stat(x, 0))
    if x.size < 2:
        return Interval(value, math.nan, math.nan, int(x.size))
    boots = _resampled(x, stat, _n_boot(n_boot, x.size), np.random.default_rng(seed))
    alpha = 1.0 - confidence
    low, high = np.quantile(boots, [alpha / 2, 1 - alpha / 2])
    return Interval(value, float(low), float(high), int(x.size))


def bootstrap_delta(
    base: Sequence[float] | np.ndarray,
    new: Sequence[float] | np.ndarray,
    stat: Stat = mean_stat,
    confidence: float = 0.95,
    n_boot: int = N_BOOT,
    seed: int = 0,
) -> Delta:
    """stat(new) - stat(base), absolute and relative, with intervals from resampling each side."""
    a, b = _finite(base), _finite(new)
    nan = Interval(math.nan, math.nan, math.nan, 0)
    if a.size == 0 or b.size == 0:
        return Delta(math.nan, math.nan, nan, nan)
    va, vb = float(stat(a, 0)), float(stat(b, 0))
    diff, rel = vb - va, (vb - va) / va if va else math.nan
    n = min(a.size, b.size)
    if a.size < 2 or b.size < 2:
        return Delta(va, vb, Interval(diff, math.nan, math.nan, n), Interval(rel, math.nan, math.nan, n))
    rng = np.random.default_rng(seed)
    n_boot = _n_boot(n_boot, max(a.size, b.size))
    ba, bb = _resampled(a, stat, n_boot, rng), _resampled(b, stat, n_boot, rng)
    alpha = 1.0 - confidence
    qs = [alpha / 2, 1 - alpha / 2]
    d_low, d_high = np.quantile(bb - ba, qs)
    with np.errstate(divide="ignore", invalid="ignore"):
        r_low, r_high = np.quantile((bb - ba) / ba, qs) if va else (math.nan, math.nan)
    return Delta(
        va, vb, Interval(diff, float(d_low), float(d_high), n), Interval(rel, float(r_low), float(r_high), n)
    )
