"""Arrival processes have the requested rate and distribution (fixed seeds, tolerances of several SEs)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from llmbench.bench.arrivals import arrival_offsets, gaps, point_label
from llmbench.bench.workload.spec import RequestSpec


def specs(n: int, arrivals: list[float] | None = None) -> list[RequestSpec]:
    return [RequestSpec(str(i), [1], 1, arrivals[i] if arrivals else None) for i in range(n)]


def ks_exponential(x: np.ndarray, rate: float) -> float:
    """Kolmogorov-Smirnov distance between the sample and Exp(rate)."""
    x = np.sort(x)
    cdf = 1 - np.exp(-rate * x)
    n = x.size
    return float(max((np.arange(1, n + 1) / n - cdf).max(), (cdf - np.arange(n) / n).max()))


@pytest.mark.parametrize("rate", [0.5, 4.0, 50.0])
def test_poisson_gaps_have_the_rate_and_are_exponential(rate):
    n = 20000
    g = gaps("poisson", n, rate, None, np.random.default_rng(0))
    assert abs(g.mean() * rate - 1) < 4 / math.sqrt(n)  # the mean of Exp has relative SE 1/sqrt(n)
    assert ks_exponential(g, rate) < 1.63 / math.sqrt(n)  # the KS critical value at the 1% level


@pytest.mark.parametrize("cv", [0.5, 1.0, 3.0])
def test_gamma_gaps_have_the_rate_and_coefficient_of_variation(cv):
    rate, n = 10.0, 40000
    g = gaps("gamma", n, rate, cv, np.random.default_rng(1))
    assert abs(g.mean() * rate - 1) < 5 * cv / math.sqrt(n)
    assert abs(g.std() / g.mean() - cv) < 0.05 * cv


def test_gamma_with_cv_one_is_not_distinguishable_from_poisson():
    g = gaps("gamma", 20000, 3.0, 1.0, np.random.default_rng(2))
    assert ks_exponential(g, 3.0) < 1.63 / math.sqrt(g.size)


def test_burstier_gamma_is_detected_as_not_exponential():
    g = gaps("gamma", 20000, 3.0, 3.0, np.random.default_rng(3))
    assert ks_exponential(g, 3.0) > 1.63 / math.sqrt(g.size)  # the test above has power


def test_offsets_start_at_zero_and_increase_at_the_rate():
    offs = arrival_offsets({"kind": "poisson", "rate": 8.0}, specs(4001), np.random.default_rng(4))
    assert offs[0] == 0.0 and all(b >= a for a, b in zip(offs, offs[1:], strict=False))
    assert abs(4000 / offs[-1] - 8.0) < 8.0 * 4 / math.sqrt(4000)


def test_offline_trace_and_concurrency():
    rng = np.random.default_rng(0)
    assert arrival_offsets({"kind": "offline"}, specs(3), rng) == [0.0, 0.0, 0.0]
    assert arrival_offsets({"kind": "trace"}, specs(3, [0.0, 0.25, 2.0]), rng) == [0.0, 0.25, 2.0]
    assert arrival_offsets({"kind": "concurrency", "concurrency": 4}, specs(3), rng) is None


def test_point_labels():
    assert point_label({"kind": "poisson", "rate": 4.0}) == "rate=4"  # as stored results name it
    assert point_label({"kind": "gamma", "rate": 0.5, "cv": 2}) == "rate=0.5 cv=2"
    assert point_label({"kind": "gamma", "rate": 4.0, "cv": 0.25}) != point_label(
        {"kind": "poisson", "rate": 4.0}
    )
    assert point_label({"kind": "concurrency", "concurrency": 8}) == "concurrency=8"
    assert point_label({"kind": "offline"}) == "offline"
    assert point_label({"kind": "poisson", "rate": 4.0, "max_concurrency": 8}) == "rate=4 max_concurrency=8"
    assert point_label({"kind": "offline", "max_concurrency": 2}) == "offline max_concurrency=2"


def test_a_cap_applies_to_schedules_and_goes_into_every_point():
    from llmbench.bench.arrivals import in_flight_limit
    from llmbench.bench.scenario.schema import Arrival

    arrival = Arrival(kind="poisson", rate=[2, 4], max_concurrency=3)
    assert [in_flight_limit(p) for p in arrival.points] == [3, 3]
    assert in_flight_limit(arrival.warmup_point) == 3
    assert in_flight_limit(Arrival(kind="poisson", rate=[2]).points[0]) is None
    assert in_flight_limit(Arrival(kind="concurrency", concurrency=[5]).points[0]) == 5
    with pytest.raises(ValueError, match="max_concurrency"):  # a closed loop's concurrency is its own cap
        Arrival(kind="concurrency", concurrency=[5], max_concurrency=3)
    with pytest.raises(ValueError, match="max_concurrency"):
        Arrival(kind="poisson", rate=[2], max_concurrency=0)


def test_unknown_gap_kind_is_an_error():
    with pytest.raises(ValueError, match="Supported"):
        gaps("uniform", 3, 1.0, None, np.random.default_rng(0))
