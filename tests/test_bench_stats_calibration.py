"""The comparison method is calibrated: simulated A/A comparisons rarely get a verdict, a real 5% change
is found. ``pytest -s`` prints the table."""

from __future__ import annotations

import time

import numpy as np

from llmbench.bench.report.compare import Change, verdict
from llmbench.bench.stats import MIN_VERDICT_REPEATS, relative_change
from llmbench.bench.stats_calibration import (
    METRICS,
    MODAL,
    REPEAT_COUNTS,
    NoiseModel,
    _runs,
    _workload,
    calibration_table,
    format_table,
)

TRIALS = 2000
THRESHOLD = 0.01  # the default --min-effect


def test_false_verdicts_stay_at_or_below_5_percent_and_a_5_percent_shift_is_found():
    start = time.process_time()
    rows = calibration_table(TRIALS, THRESHOLD)
    took = time.process_time() - start
    print("\n" + format_table(rows, TRIALS, THRESHOLD) + f"({took:.1f} s of CPU)")
    assert len(rows) == len(REPEAT_COUNTS) * 2 * len(METRICS)
    for r in rows:
        assert r.false_verdicts <= 0.05, r
        if r.n < MIN_VERDICT_REPEATS:  # shown with an interval, never judged
            assert r.false_verdicts == r.power == r.equivalent == 0.0, r
        # Nominal 95%; 2000 trials give a standard error of 0.5 points. Unpaired runs cover more (the
        # repeats share prompts and arrivals, which a Welch interval does not use).
        assert r.coverage >= 0.93, r
    by = {(r.method, r.n, r.metric): r for r in rows}
    for method in ("paired", "unpaired"):
        # Power grows with the repeats, and at n=5 a 5% slowdown of throughput is found more often than not.
        assert by[(method, 5, "output_throughput")].power > 0.5
        powers = [by[(method, n, "output_throughput")].power for n in REPEAT_COUNTS]
        assert powers == sorted(powers)
    # Pairing is what finds a latency change: the unpaired method loses the shared per-repeat workload.
    assert by[("paired", 5, "ttft_p50")].power > 2 * by[("unpaired", 5, "ttft_p50")].power


def test_a_quieter_machine_finds_a_5_percent_shift_at_five_repeats():
    quiet = NoiseModel(sigma_run=0.01, sigma_repeat=0.005)
    rows = calibration_table(1000, THRESHOLD, noise=quiet, repeat_counts=(5,))
    print("\n" + format_table(rows, 1000, THRESHOLD, quiet))
    by = {(r.method, r.metric): r for r in rows}
    assert by[("paired", "output_throughput")].power > 0.8
    # A median over 200 requests keeps their per-request jitter: found about half the time, still far
    # more often than the 2%-noise machine finds it.
    assert by[("paired", "ttft_p50")].power > 0.4
    assert all(r.false_verdicts <= 0.05 for r in rows)


def test_noise_in_two_modes_fools_the_interval_of_two_repeats_and_not_the_rule():
    rows = calibration_table(TRIALS, THRESHOLD, noise=MODAL)
    print("\n" + format_table(rows, TRIALS, THRESHOLD, MODAL))
    two = [r for r in rows if r.n == 2]
    # two pairs in the same modes agree by chance: the interval alone calls a difference that is not there
    assert max(r.false_by_interval for r in two) > 0.05, two
    assert all(r.false_verdicts <= 0.05 for r in rows), rows
    assert all(r.false_verdicts == r.false_by_interval for r in rows if r.n >= MIN_VERDICT_REPEATS)


def test_the_simulation_judges_exactly_as_the_reports_do():
    """The simulation's vectorised verdicts equal the report's own ``change``/``verdict`` path, trial by trial."""
    from llmbench.bench.stats import classify, paired_log_changes

    rng = np.random.default_rng(7)
    noise = NoiseModel()
    work = _workload(rng, 200, 3, noise)
    a, b = _runs(rng, work, noise), _runs(rng, work, noise)
    rows = paired_log_changes(a["ttft_p50"], b["ttft_p50"])
    codes = classify(rows.low, rows.high, "lower", THRESHOLD, 3)
    words = {1: "better", -1: "worse", 0: "equivalent", 2: "inconclusive (n=3)"}
    for i in range(200):
        rc = relative_change(a["ttft_p50"][i], b["ttft_p50"][i], paired=True)
        c = Change("ttft_p50", rc.base, rc.new, rc.value, rc.low, rc.high, rc.n, rc.method)
        assert verdict(c, THRESHOLD) == words[int(codes[i])]
    assert {int(c) for c in codes} >= {2} and len({int(c) for c in codes}) > 1  # verdicts of several kinds
    # Two repeats of the same trials: an interval each, and no verdict
    for i in range(200):
        rc = relative_change(a["ttft_p50"][i, :2], b["ttft_p50"][i, :2], paired=True)
        c = Change("ttft_p50", rc.base, rc.new, rc.value, rc.low, rc.high, rc.n, rc.method)
        assert rc.low < rc.high and verdict(c, THRESHOLD) == "inconclusive (n=2)"
