"""``llmbench compare``'s lost-request rule: NEW is held to have lost more of its requests than BASE (failed,
or outputs not the length asked for) only when an exact binomial test says chance does not explain it, at
the gate's per-comparison level, and the line names both counts and the p-value."""

from __future__ import annotations

from llmbench.cli.compare import _lost, _lost_kinds

ALPHA = 0.05 / 6  # the default gate at one sweep point: four metrics and two kinds of lost request


class Counts:
    """What ``_lost`` reads of a group: its scenario, and per-repeat totals of a sweep point."""

    scenario = "chat"

    def __init__(self, **per_repeat: list[float]) -> None:
        self.per_repeat = per_repeat

    def repeat_values(self, point: str, metric: str) -> list[float]:
        return self.per_repeat.get(metric, [])


def test_one_failure_in_nine_hundred_against_none_is_chance_not_a_regression():
    base = Counts(num_requests=[300, 300, 300], num_failed=[0, 0, 0], num_output_mismatch=[0, 0, 0])
    new = Counts(num_requests=[300, 300, 300], num_failed=[1, 0, 0], num_output_mismatch=[0, 0, 0])
    (test,) = _lost(base, new, "c=4", ALPHA)
    assert not test.regression
    assert test.text.startswith("chat c=4: NEW failed 1 of 900 requests (BASE 0 of 900; p = 0.5, not below")


def test_a_quarter_of_the_requests_lost_against_none_is_a_regression_named_with_both_counts():
    base = Counts(num_requests=[100], num_failed=[0], num_output_mismatch=[0])
    new = Counts(num_requests=[100], num_failed=[25], num_output_mismatch=[0])
    (test,) = _lost(base, new, "c=4", ALPHA)
    assert test.regression
    assert test.text == (
        "chat c=4: NEW failed 25 of 100 requests (BASE 0 of 100; p = 3e-08 < 0.0083, one-sided exact "
        "binomial test)"
    )
    assert _lost(new, base, "c=4", ALPHA) == []  # the other way round: NEW lost fewer, nothing to test


def test_only_kinds_that_either_side_lost_a_request_to_count_as_comparisons():
    clean = Counts(num_requests=[100], num_failed=[0], num_output_mismatch=[0])
    assert _lost_kinds(clean, clean, "c=4") == 0  # nothing lost: no test can fail, no share of the budget
    short = Counts(num_requests=[100], num_failed=[0], num_output_mismatch=[2])
    assert _lost_kinds(clean, short, "c=4") == 1 and _lost_kinds(short, clean, "c=4") == 1
