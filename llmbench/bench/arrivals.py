"""Arrival processes: when each request of a run point is due, in seconds after the start.

offline: every request at 0. poisson: exponential gaps with mean 1/rate. gamma: gamma gaps with mean
1/rate and coefficient of variation cv (shape k = 1/cv^2, scale = cv^2/rate), so cv=1 is Poisson and a
larger cv is burstier. The first request is due at 0 in every process, so the measured window starts
with the first arrival. trace: the workload's own offsets. ``concurrency`` has no schedule: the driver
sends a request whenever one of its N slots frees up (``None`` here).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from llmbench.bench.workload.spec import RequestSpec


def gaps(kind: str, n: int, rate: float, cv: float | None, rng: np.random.Generator) -> np.ndarray:
    """``n`` inter-arrival gaps of a renewal process with mean 1/rate."""
    if kind == "poisson":
        return rng.exponential(1.0 / rate, size=n)
    if kind == "gamma":
        shape = 1.0 / (cv * cv)
        return rng.gamma(shape, 1.0 / (rate * shape), size=n)
    raise ValueError(f"Unsupported arrival kind for gaps: {kind!r}. Supported: ['poisson', 'gamma']")


def arrival_offsets(
    point: dict[str, Any], requests: list[RequestSpec], rng: np.random.Generator
) -> list[float] | None:
    """Due times for ``requests`` under one sweep point; None for closed-loop concurrency."""
    kind = point["kind"]
    n = len(requests)
    if kind == "offline":
        return [0.0] * n
    if kind == "concurrency":
        return None
    if kind == "trace":
        return [float(r.arrival or 0.0) for r in requests]
    g = gaps(kind, n, float(point["rate"]), point.get("cv"), rng)
    g[0] = 0.0
    return np.cumsum(g).tolist()


def point_label(point: dict[str, Any]) -> str:
    """Short, stable name of a sweep point: ``offline``, ``rate=4``, ``concurrency=8``, ``trace``."""
    if point["kind"] in ("poisson", "gamma"):
        return f"rate={point['rate']:g}"
    if point["kind"] == "concurrency":
        return f"concurrency={point['concurrency']}"
    return point["kind"]
