"""How often the comparison method is wrong: simulated A/A and A/B comparisons run through its own code.

Each simulated run is built like a measured one. A repeat's workload (its prompts and arrival times) is
the same for every configuration, so it is drawn once per repeat: request sizes with a skewed (lognormal)
spread of latencies and a number of output tokens. Each run then adds its own per-request jitter
(``jitter_sigma``), and its p50 and p99 TTFT and its output throughput are computed from its requests.
The run is scaled by a per-run factor (``sigma_run``: run-to-run drift) and by a per-repeat factor shared
by the configurations of that repeat (``sigma_repeat``: they run back to back), and, with ``mode_step``,
each run lands in a slower mode (latencies x (1 + mode_step)) with probability ``mode_share``: run-to-run
noise that comes in modes, as a CPU's frequency states or a GPU's clocks make it. Each trial compares two
configurations over ``n`` repeats with the functions the reports use (``stats.paired_log_changes`` /
``stats.welch_log_changes`` and the verdict rule ``stats.classify``) and counts:

- *false verdicts*: ``better`` or ``worse`` when the two configurations are the same (A/A), by the rule
  the reports apply (no verdict below ``stats.MIN_VERDICT_REPEATS`` repeats) and by the intervals alone;
- *equivalent*: how often an A/A comparison is called ``equivalent`` at the threshold;
- *coverage*: how often the 95% interval of an A/A change holds 0 (the nominal rate is 95%);
- *power*: how often a true 5% slowdown (latencies x1.05, throughput /1.05) is called ``worse``.

``python -m llmbench.bench.stats_calibration`` prints the table as Markdown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from llmbench.bench.stats import (
    BETTER,
    EQUIVALENT,
    MIN_VERDICT_REPEATS,
    WORSE,
    classify,
    paired_log_changes,
    welch_log_changes,
)

REPEAT_COUNTS = (2, 3, 5, 10)
METRICS = (("ttft_p50", "lower"), ("ttft_p99", "lower"), ("output_throughput", "higher"))
METHODS = ("paired", "unpaired")


@dataclass(frozen=True)
class NoiseModel:
    sigma_run: float = 0.02  # per-run multiplicative noise (lognormal sigma): 2%
    sigma_repeat: float = 0.01  # per-repeat factor shared by the configurations of that repeat
    requests: int = 200  # requests per run
    latency_sigma: float = 0.6  # spread of request latencies within a run (request sizes; lognormal sigma)
    jitter_sigma: float = 0.1  # per-request noise of one run on top of its size
    mode_step: float = 0.0  # a run in the slow mode is this much slower (0: one mode)
    mode_share: float = 0.5  # the chance that a run lands in the slow mode


# Quiet within a mode, 12% apart between two (seen on a 2-core CPU: a prefill step of 0.34 s or 0.39 s).
MODAL = NoiseModel(sigma_run=0.005, sigma_repeat=0.005, mode_step=0.12)


class Row(NamedTuple):
    method: str  # "paired" (variants of one ablation) | "unpaired" (separate runs)
    n: int  # repeats per configuration
    metric: str
    false_verdicts: float  # A/A comparisons called better or worse
    false_by_interval: float  # the same, judged by the intervals alone (no minimum of repeats)
    equivalent: float  # A/A comparisons called equivalent
    coverage: float  # A/A 95% intervals holding 0
    power: float  # a 5% slowdown called worse


class _Workload(NamedTuple):
    latency: np.ndarray  # (T, n, R) request latencies before a run's own noise
    tokens: np.ndarray  # (T, n, R) output tokens per request


def _workload(rng: np.random.Generator, trials: int, n: int, noise: NoiseModel) -> _Workload:
    shape = (trials, n, noise.requests)
    return _Workload(_lognormal(rng, noise.latency_sigma, shape), rng.integers(12, 129, size=shape))


def _lognormal(rng: np.random.Generator, sigma: float, shape: tuple[int, ...]) -> np.ndarray:
    return np.exp(sigma * rng.standard_normal(shape, dtype=np.float32), dtype=np.float64)


def _runs(rng: np.random.Generator, work: _Workload, noise: NoiseModel) -> dict[str, np.ndarray]:
    """Per-run metrics of one configuration over the workload, each (T, n); the shared per-repeat factor
    is applied by the caller."""
    run = _lognormal(rng, noise.sigma_run, work.latency.shape[:-1])  # (T, n)
    if noise.mode_step:
        run = run * np.where(rng.random(run.shape) < noise.mode_share, 1.0 + noise.mode_step, 1.0)
    latency = work.latency * _lognormal(rng, noise.jitter_sigma, work.latency.shape)
    # Output throughput: tokens over the time spent on them (per-token cost times the run's jitter).
    busy = (work.tokens * _lognormal(rng, noise.jitter_sigma, work.tokens.shape)).sum(axis=-1)
    p50, p99 = np.percentile(latency, [50, 99], axis=-1)
    return {
        "ttft_p50": p50 * run,
        "ttft_p99": p99 * run,
        "output_throughput": work.tokens.sum(axis=-1) / busy / run,
    }


def calibration_table(
    trials: int = 2000,
    threshold: float = 0.01,
    shift: float = 0.05,
    noise: NoiseModel | None = None,
    repeat_counts: tuple[int, ...] = REPEAT_COUNTS,
    seed: int = 0,
) -> list[Row]:
    """False-verdict rate, equivalence rate, coverage and power per method, repeat count and metric."""
    noise = noise or NoiseModel()
    rng = np.random.default_rng(seed)
    rows = []
    for n in repeat_counts:
        shared = _lognormal(rng, noise.sigma_repeat, (trials, n))  # one factor per repeat
        work = _workload(rng, trials, n, noise)
        a, b = _runs(rng, work, noise), _runs(rng, work, noise)
        for method in METHODS:
            fn = paired_log_changes if method == "paired" else welch_log_changes
            for metric, better in METRICS:
                # A latency grows with the shared factor, a throughput shrinks by it.
                f = shared if better == "lower" else 1.0 / shared
                base, same = a[metric] * f, b[metric] * f
                slow = same * (1.0 + shift) if better == "lower" else same / (1.0 + shift)
                aa = fn(base, same)
                codes = classify(aa.low, aa.high, better, threshold, n)
                alone = classify(aa.low, aa.high, better, threshold)
                ab = fn(base, slow)
                rows.append(
                    Row(
                        method,
                        n,
                        metric,
                        float(np.isin(codes, (BETTER, WORSE)).mean()),
                        float(np.isin(alone, (BETTER, WORSE)).mean()),
                        float((codes == EQUIVALENT).mean()),
                        float(((aa.low <= 0) & (aa.high >= 0)).mean()),
                        float((classify(ab.low, ab.high, better, threshold, n) == WORSE).mean()),
                    )
                )
    return rows


def format_table(rows: list[Row], trials: int, threshold: float, noise: NoiseModel | None = None) -> str:
    """The table as Markdown, with the simulation's settings above it."""
    noise = noise or NoiseModel()
    modes = (
        f", and each run {noise.mode_step * 100:g}% slower with probability {noise.mode_share:g} (two modes)"
        if noise.mode_step
        else ""
    )
    head = (
        f"Simulated comparisons: {trials} trials per row, threshold (--min-effect) {threshold * 100:g}%, "
        f"run-to-run noise {noise.sigma_run * 100:g}% per run and {noise.sigma_repeat * 100:g}% per repeat "
        f"(lognormal sigma){modes}, {noise.requests} requests per run, each run with "
        f"{noise.jitter_sigma * 100:g}% per-request jitter. False verdicts by the reports' rule (no verdict "
        f"below {MIN_VERDICT_REPEATS} repeats) and by the 95% intervals alone.\n\n"
        "| method | repeats | metric | false verdicts (A/A) | by the interval alone | equivalent (A/A) | "
        "95% CI coverage | power (5% slower) |\n|---|---:|---|---:|---:|---:|---:|---:|\n"
    )
    body = "".join(
        f"| {r.method} | {r.n} | {r.metric} | {r.false_verdicts:.1%} | {r.false_by_interval:.1%} | "
        f"{r.equivalent:.1%} | {r.coverage:.1%} | {r.power:.1%} |\n"
        for r in rows
    )
    return head + body


TRIALS, THRESHOLD = 2000, 0.01  # what the documents quote

if __name__ == "__main__":
    print(format_table(calibration_table(TRIALS, THRESHOLD), TRIALS, THRESHOLD))
    print(format_table(calibration_table(TRIALS, THRESHOLD, noise=MODAL), TRIALS, THRESHOLD, MODAL), end="")
