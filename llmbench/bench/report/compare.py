"""Differences between two groups (a variant against its baseline), with bootstrap intervals.

With at least two repeats on each side the difference is of repeat means, resampling repeats; otherwise a
latency statistic is compared over requests (resampling each side's requests), and any other metric has
no interval. ``verdict`` says whether a change is a regression: worse than the threshold *and* its 95%
interval lies wholly on the worse side of zero (without an interval, the threshold alone decides and the
verdict says "worse (no CI)").
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from llmbench.bench.metrics import METRICS, REQUEST_LEVEL
from llmbench.bench.report.frame import Group
from llmbench.bench.stats import bootstrap_delta, stat_for

# What an ablation and the regression gate look at first.
DELTA_METRICS = (
    "ttft_p50",
    "ttft_p99",
    "tpot_p50",
    "itl_p50",
    "e2e_p50",
    "output_throughput",
    "decode_step_mean",  # the per-step cost of what a variant changes (a sampling setting, a kernel)
    "peak_memory",
    "energy_per_token",
)
GATE_METRICS = (
    "ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "itl_p50", "e2e_p50", "e2e_p99", "output_throughput",
    "total_throughput", "request_throughput", "goodput",
)  # fmt: skip


class Change(NamedTuple):
    metric: str
    base: float
    new: float
    rel: float  # (new - base) / base
    rel_low: float
    rel_high: float
    ci: str | None  # "repeats" | "requests" | None


def change(base: Group, new: Group, point: str, metric: str, seed: int = 0) -> Change:
    a = np.asarray(base.repeat_values(point, metric), dtype=float)
    b = np.asarray(new.repeat_values(point, metric), dtype=float)
    a, b = a[np.isfinite(a)], b[np.isfinite(b)]
    nan = math.nan
    if a.size == 0 or b.size == 0:
        return Change(
            metric,
            float(a.mean()) if a.size else nan,
            float(b.mean()) if b.size else nan,
            nan,
            nan,
            nan,
            None,
        )
    va, vb = float(a.mean()), float(b.mean())
    rel = (vb - va) / va if va else nan
    if a.size >= 2 and b.size >= 2:
        d = bootstrap_delta(a, b, seed=seed)
        return Change(metric, va, vb, rel, d.rel.low, d.rel.high, "repeats")
    if metric in REQUEST_LEVEL:
        stat = stat_for(REQUEST_LEVEL[metric][1])
        d = bootstrap_delta(
            base.request_samples(point, metric), new.request_samples(point, metric), stat, seed=seed
        )
        if math.isfinite(d.rel.low):
            # Intervals over requests, but the point estimate stays the one of the summaries.
            return Change(metric, va, vb, rel, d.rel.low, d.rel.high, "requests")
    return Change(metric, va, vb, rel, nan, nan, None)


def worse_by(metric: str, rel: float) -> float:
    """How much worse (positive) or better (negative) a relative change is for this metric."""
    better = METRICS[metric].better
    if better == "lower":
        return rel
    if better == "higher":
        return -rel
    return 0.0


def verdict(c: Change, threshold: float) -> str:
    """'worse', 'worse (no CI)', 'better', 'noise' (inside the threshold or the interval) or 'n/a'."""
    if math.isnan(c.rel) or not METRICS[c.metric].better:
        return "n/a"
    worse = worse_by(c.metric, c.rel)
    has_ci = math.isfinite(c.rel_low) and math.isfinite(c.rel_high)
    ci_worse = has_ci and min(worse_by(c.metric, c.rel_low), worse_by(c.metric, c.rel_high)) > 0
    ci_better = has_ci and max(worse_by(c.metric, c.rel_low), worse_by(c.metric, c.rel_high)) < 0
    if worse > threshold:
        if ci_worse:
            return "worse"
        return "worse (no CI)" if not has_ci else "noise"
    if worse < -threshold and (ci_better or not has_ci):
        return "better"
    return "noise"


def outputs_identical(base: Group, new: Group, point: str) -> str:
    """For greedy runs: whether every request produced the same token ids as in the baseline."""
    for side in (base, new):  # a variant may change the sampling itself
        if float(side.meta.get("scenario", {}).get("sampling", {}).get("temperature", 1.0)) != 0.0:
            return "n/a (sampling)"
    a, b = base.requests(), new.requests()
    if a.empty or b.empty:
        return "n/a"
    for side in (a, b):  # a server that streams text only leaves the ids empty: nothing to compare
        if "output_len" in side and any(
            len(t) == 0 and n > 0 for t, n in zip(side["token_ids"], side["output_len"], strict=True)
        ):
            return "n/a (token ids not returned)"
    keys = ["repeat", "request_id"]
    a = a[a["point"] == point].set_index(keys)["token_ids"]
    b = b[b["point"] == point].set_index(keys)["token_ids"]
    common = a.index.intersection(b.index)
    if len(common) == 0:
        return "n/a (no common requests)"
    differ = sum(not np.array_equal(np.asarray(a[k]), np.asarray(b[k])) for k in common)
    return "yes" if differ == 0 else f"no ({differ}/{len(common)} differ)"


def delta_frame(
    baseline: Group, others: list[Group], metrics: tuple[str, ...] = DELTA_METRICS
) -> pd.DataFrame:
    """One row per (variant, point, metric) against ``baseline``."""
    rows: list[dict[str, Any]] = []
    for g in others:
        for point in baseline.points:
            if point not in g.points:
                continue
            for metric in metrics:
                c = change(baseline, g, point, metric)
                rows.append({"variant": g.label, "point": point, **c._asdict()})
    return pd.DataFrame(rows, columns=["variant", "point", *Change._fields])
