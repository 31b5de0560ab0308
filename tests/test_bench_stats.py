"""Bootstrap intervals: they cover the true value at about the nominal rate, and behave at the edges."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from llmbench.bench.stats import bootstrap_ci, bootstrap_delta, percentile_stat, stat_for


def coverage(trials: int, n: int, stat, truth: float, draw) -> float:
    rng = np.random.default_rng(0)
    hits = 0
    for t in range(trials):
        ci = bootstrap_ci(draw(rng, n), stat, n_boot=1000, seed=t)
        hits += ci.low <= truth <= ci.high
    return hits / trials


def test_interval_of_the_mean_covers_the_truth_about_95_percent_of_the_time():
    cov = coverage(400, 30, stat_for("mean"), 5.0, lambda rng, n: rng.normal(5.0, 2.0, n))
    # Percentile bootstrap under-covers a little at n=30; 400 trials give an SE of about 1.1 points.
    assert 0.89 <= cov <= 0.985, cov


def test_interval_of_the_median_of_skewed_data_covers_the_truth():
    truth = math.exp(0.0)  # the median of lognormal(0, 1)
    cov = coverage(300, 101, percentile_stat(50), truth, lambda rng, n: rng.lognormal(0.0, 1.0, n))
    assert 0.88 <= cov <= 0.99, cov


def test_interval_narrows_with_more_data():
    rng = np.random.default_rng(1)
    small = bootstrap_ci(rng.normal(0, 1, 20))
    large = bootstrap_ci(rng.normal(0, 1, 2000))
    assert (large.high - large.low) < (small.high - small.low) / 5


def test_delta_interval_covers_the_true_difference():
    rng = np.random.default_rng(2)
    hits = 0
    for t in range(200):
        d = bootstrap_delta(rng.normal(10, 1, 25), rng.normal(11, 1, 25), n_boot=800, seed=t)
        hits += d.diff.low <= 1.0 <= d.diff.high
        assert d.rel.value == (d.new - d.base) / d.base
    assert 0.88 <= hits / 200 <= 0.99


def test_edge_cases_are_nan_not_errors():
    assert math.isnan(bootstrap_ci([]).value)
    one = bootstrap_ci([3.0])
    assert one.value == 3.0 and math.isnan(one.low) and one.n == 1
    nan_ignored = bootstrap_ci([1.0, math.nan, 3.0])
    assert nan_ignored.value == 2.0 and nan_ignored.n == 2
    assert math.isnan(bootstrap_delta([], [1.0, 2.0]).diff.value)


def test_large_samples_are_resampled_in_chunks():
    x = np.random.default_rng(3).exponential(1.0, 50000)
    ci = bootstrap_ci(x, percentile_stat(99), n_boot=200)
    assert ci.low <= np.percentile(x, 99) <= ci.high


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=2, max_size=40), st.integers(0, 1000))
def test_interval_is_ordered_and_inside_the_data_range(values, seed):
    ci = bootstrap_ci(values, n_boot=200, seed=seed)
    tol = 1e-9 * max(1.0, max(abs(v) for v in values))
    assert min(values) - tol <= ci.low <= ci.high + tol
    assert ci.high <= max(values) + tol
