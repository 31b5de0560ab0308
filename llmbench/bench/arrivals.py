"""Arrival processes: when each request of a run point is due, in seconds after the start.

offline: every request at 0. poisson: exponential gaps with mean 1/rate. gamma: gamma gaps with mean
1/rate and coefficient of variation cv (shape k = 1/cv^2, scale = cv^2/rate), so cv=1 is Poisson and a
larger cv is burstier. The first request is due at 0 in every process, so the measured window starts
with the first arrival. A rate at which the requests would arrive over more than ``MAX_ARRIVAL_SPAN_S``
(num_requests / rate) is refused. trace: the workload's own offsets. ``concurrency`` has no schedule: the
driver sends a request whenever one of its N slots frees up (``None`` here).

A ``sweep`` is made of such points: ``sync`` (concurrency 1), ``throughput`` (offline), then Poisson
points at fractions of the throughput point's requests/s, whose rate ``at_measured_rate`` sets from
what that point measured, so a sweep's load fits the machine it runs on.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from llmbench.bench.driver import DriveResult
from llmbench.bench.errors import ScenarioError
from llmbench.bench.metrics import window
from llmbench.bench.scenario.schema import rate_span_problem
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
    rate = float(point["rate"])
    # The schema checks this where num_requests is given; a file's record count is known only here.
    if problem := rate_span_problem(rate, n):
        raise ScenarioError(f"{point_label(point)}: {problem}")
    g = gaps(kind, n, rate, point.get("cv"), rng)
    g[0] = 0.0
    return np.cumsum(g).tolist()


def capacity(throughput: list[DriveResult]) -> float:
    """Requests/s finished by a sweep's throughput point (first arrival -> last token), mean over its
    repeats; NaN when none of them finished a request."""
    rates = []
    for drive in throughput:
        start, end = window(drive.requests)
        done = sum(r.finished for r in drive.requests)
        if done and end > start:
            rates.append(done / (end - start))
    return float(np.mean(rates)) if rates else math.nan


def at_measured_rate(point: dict[str, Any], throughput: list[DriveResult]) -> dict[str, Any]:
    """A sweep's fraction point with its rate: the fraction of the capacity the throughput point measured
    (recorded beside it as ``capacity``). Any other point is returned as it is."""
    if point.get("sweep") != "fraction":
        return point
    cap = capacity(throughput)
    if not cap > 0:
        raise ValueError("the sweep's throughput point finished no request, so it gives no capacity")
    return {**point, "rate": point["fraction"] * cap, "capacity": cap}


def in_flight_limit(point: dict[str, Any]) -> int | None:
    """The most requests a point keeps in flight: a closed loop's concurrency, or a schedule's cap
    (``max_concurrency``); None for a schedule without one."""
    return point.get("concurrency", point.get("max_concurrency"))


def point_label(point: dict[str, Any]) -> str:
    """Short, stable name of a sweep point: ``offline``, ``rate=4`` (Poisson), ``rate=4 cv=3`` (gamma: its
    cv tells it from the Poisson point at that rate), ``concurrency=8``, ``trace``, each followed by
    `` max_concurrency=N`` under a cap; a ``sweep``'s ``sync``, ``throughput`` and ``poisson@0.5x`` (its
    rate, measured, is not in the name, so repeats and variants of one sweep share their points' names).
    Stored results and reports key on these names: a Poisson point's stays as it has always been."""
    if point.get("sweep") == "fraction":
        return f"poisson@{point['fraction']:g}x"
    if point.get("sweep"):
        return point["sweep"]
    if point["kind"] == "poisson":
        name = f"rate={point['rate']:g}"
    elif point["kind"] == "gamma":
        name = f"rate={point['rate']:g} cv={point['cv']:g}"
    elif point["kind"] == "concurrency":
        name = f"concurrency={point['concurrency']}"
    else:
        name = point["kind"]
    return f"{name} max_concurrency={point['max_concurrency']}" if point.get("max_concurrency") else name
