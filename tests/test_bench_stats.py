"""Student-t machinery and the relative change of a metric: table values, constructed data, edge cases."""

from __future__ import annotations

import math

import numpy as np
import pytest

from llmbench.bench.stats import (
    BETTER,
    EQUIVALENT,
    INCONCLUSIVE,
    WORSE,
    betainc,
    classify,
    excess_loss_p,
    lgamma,
    mean_interval,
    paired_log_changes,
    relative_change,
    t_cdf,
    t_quantile,
    welch_log_changes,
)

# Two-sided 95% critical values t(0.975, df) from printed t tables; the last is the normal's 1.959964.
T_975 = {1: 12.7062, 2: 4.3027, 3: 3.1824, 4: 2.7764, 10: 2.2281, 30: 2.0423, 1_000_000: 1.9600}


@pytest.mark.parametrize(("df", "expected"), sorted(T_975.items()))
def test_t_quantile_matches_table_values(df, expected):
    assert float(t_quantile(0.975, df)) == pytest.approx(expected, abs=6e-5)
    assert float(t_quantile(0.025, df)) == pytest.approx(-expected, abs=6e-5)  # symmetric


def test_one_sided_quantiles_match_table_values():
    assert float(t_quantile(0.95, 1)) == pytest.approx(6.3138, abs=6e-5)
    assert float(t_quantile(0.95, 10)) == pytest.approx(1.8125, abs=6e-5)
    assert float(t_quantile(0.995, 4)) == pytest.approx(4.6041, abs=6e-5)
    assert float(t_quantile(0.5, 7)) == pytest.approx(0.0, abs=1e-12)


def test_t_cdf_matches_the_closed_forms_at_one_and_two_degrees_of_freedom():
    t = np.linspace(-40, 40, 161)
    assert np.max(np.abs(t_cdf(t, 1) - (0.5 + np.arctan(t) / np.pi))) < 1e-12
    assert np.max(np.abs(t_cdf(t, 2) - (0.5 + t / (2 * np.sqrt(2 + t * t))))) < 1e-12
    assert float(t_cdf(np.inf, 3)) == 1.0 and float(t_cdf(-np.inf, 3)) == 0.0


def test_t_quantile_inverts_t_cdf_for_fractional_df():
    df = np.array([1.3, 2.7, 5.5, 17.25])
    p = np.array([0.6, 0.9, 0.975, 0.999])
    assert np.max(np.abs(t_cdf(t_quantile(p, df), df) - p)) < 1e-12


def test_incomplete_beta_and_log_gamma_against_closed_forms():
    x = np.linspace(0, 1, 101)
    assert np.max(np.abs(betainc(1.0, 1.0, x) - x)) < 1e-13
    assert np.max(np.abs(betainc(3.0, 1.0, x) - x**3)) < 1e-13
    assert np.max(np.abs(betainc(1.0, 2.5, x) - (1 - (1 - x) ** 2.5))) < 1e-13
    z = np.concatenate([np.linspace(0.01, 40, 500), [1e3, 5e5]])
    expected = np.array([math.lgamma(v) for v in z])
    assert np.max(np.abs(lgamma(z) - expected) / np.maximum(1.0, np.abs(expected))) < 1e-13


def test_mean_interval_is_the_t_interval_and_none_for_one_repeat():
    ci = mean_interval([1.0, 2.0, 3.0])  # mean 2, sd 1, n 3
    half = 4.302653 / math.sqrt(3)
    assert (ci.value, ci.n) == (2.0, 3)
    assert ci.low == pytest.approx(2 - half, abs=1e-5) and ci.high == pytest.approx(2 + half, abs=1e-5)
    one = mean_interval([5.0, math.nan])
    assert one.value == 5.0 and one.n == 1 and math.isnan(one.low) and math.isnan(one.high)
    assert mean_interval([]).n == 0


def test_an_interval_is_cut_at_the_least_value_the_quantity_can_take():
    values = [0.5, 30.0, 2.0]  # a skewed positive figure: the t-interval reaches below 0
    plain, cut = mean_interval(values), mean_interval(values, floor=0.0)
    assert plain.low < 0 and cut.low == 0.0
    assert (cut.value, cut.high, cut.n) == (plain.value, plain.high, plain.n)
    inside = mean_interval([10.0, 11.0, 12.0], floor=0.0)
    assert inside == mean_interval([10.0, 11.0, 12.0])  # no cut when it stays above the floor


def test_paired_repeats_see_a_consistent_change_that_unpaired_ones_cannot():
    # Repeats differ a lot from each other (other prompts, other load), but each pair by exactly +1%.
    base = np.array([100.0, 120.0, 140.0])
    new = base * 1.01
    paired = relative_change(base, new, paired=True)
    assert paired.method == "paired" and paired.n == 3
    assert paired.value == pytest.approx(0.01) and paired.low == pytest.approx(0.01)
    assert paired.high == pytest.approx(0.01)
    unpaired = relative_change(base, new, paired=False)
    assert unpaired.method == "unpaired"
    assert unpaired.low < -0.2 and unpaired.high > 0.2  # the spread between repeats swamps 1%


def test_welch_interval_on_logs_equals_the_hand_computation():
    # Logs 0, .1, .2 against .05, .15, .25: difference .05, each variance .01, n 3 -> df 4 (equal variances).
    a, b = np.exp([0.0, 0.1, 0.2]), np.exp([0.05, 0.15, 0.25])
    half = 2.776445 * math.sqrt(0.01 / 3 + 0.01 / 3)
    rc = relative_change(a, b, paired=False)
    assert rc.value == pytest.approx(math.expm1(0.05))
    assert rc.low == pytest.approx(math.expm1(0.05 - half), abs=1e-6)
    assert rc.high == pytest.approx(math.expm1(0.05 + half), abs=1e-6)


def test_paired_interval_on_log_ratios_equals_the_hand_computation():
    d = np.array([0.02, 0.04, 0.03, 0.05])  # log ratios: mean .035, sd .0129099
    base = np.array([10.0, 20.0, 30.0, 40.0])
    rc = relative_change(base, base * np.exp(d), paired=True)
    half = 3.182446 * d.std(ddof=1) / 2
    assert rc.low == pytest.approx(math.expm1(0.035 - half), abs=1e-6)
    assert rc.high == pytest.approx(math.expm1(0.035 + half), abs=1e-6)


def test_the_change_is_the_ratio_of_the_values_it_carries():
    # Wide spread: the arithmetic means (1,000 and 1,200 -> +20%) disagree with the change on logs.
    base, new = [10.0, 1000.0, 1990.0], [1.0, 2000.0, 1599.0]
    for paired in (True, False):
        rc = relative_change(base, new, paired=paired)
        assert rc.base == pytest.approx(math.exp(np.log(base).mean()))
        assert rc.new == pytest.approx(math.exp(np.log(new).mean()))
        assert rc.new / rc.base - 1 == pytest.approx(rc.value)
    assert relative_change([5.0], [4.0], paired=True)[:3] == pytest.approx((5.0, 4.0, -0.2))


def test_pairs_with_a_missing_side_are_dropped():
    rc = relative_change([1.0, 2.0, math.nan, 4.0], [1.1, math.nan, 3.0, 4.4], paired=True)
    assert rc.n == 2 and rc.value == pytest.approx(0.1)


def test_one_repeat_has_a_change_but_no_interval():
    rc = relative_change([100.0], [90.0], paired=True)
    assert rc.value == pytest.approx(-0.1) and rc.n == 1 and rc.method is None
    assert math.isnan(rc.low) and math.isnan(rc.high)


def test_zero_values_fall_back_to_the_difference_of_means():
    rc = relative_change([0.0, 0.0, 0.0], [0.0, 0.0, 0.0], paired=True)  # zero goodput throughout
    assert (rc.value, rc.low, rc.high) == (0.0, 0.0, 0.0) and rc.method == "paired (difference)"
    rc = relative_change([2.0, 4.0], [0.0, 3.0], paired=True)  # differences -2, -1: mean -1.5 of base 3
    half = 12.706205 * (1 / math.sqrt(2)) / math.sqrt(2) / 3  # t(1) * sd / sqrt(n) / base mean
    assert rc.value == pytest.approx(-0.5) and rc.high == pytest.approx(-0.5 + half, abs=1e-5)
    assert -0.5 - half < -1 and rc.low == -1.0  # no metric falls below 0: no change below -100%
    rc = relative_change([2.0, 4.0, 3.0], [0.0, 3.0, 2.0], paired=True)
    assert (rc.base, rc.new) == pytest.approx((3.0, 5 / 3))  # arithmetic means, whose difference it takes
    assert rc.value == pytest.approx(rc.new / rc.base - 1)


def test_a_change_from_a_baseline_of_zero_is_the_difference_itself():
    # No failed request in the baseline, 3, 5, 4 in the variant: no percentage of 0, but a difference of +4.
    rc = relative_change([0.0, 0.0, 0.0], [3.0, 5.0, 4.0], paired=True)
    half = 4.302653 * 1.0 / math.sqrt(3)  # t(2) * sd of the differences / sqrt(n)
    assert rc.absolute and rc.method == "paired (absolute difference)"
    assert (rc.value, rc.low, rc.high) == pytest.approx((4.0, 4.0 - half, 4.0 + half), abs=1e-5)
    rc = relative_change([0.0, 0.0], [1.0, 2.0], paired=False)  # Welch on the difference of the means
    assert rc.absolute and rc.value == pytest.approx(1.5) and rc.method == "unpaired (absolute difference)"
    one = relative_change([0.0], [4.0], paired=True)  # one repeat: the difference, no interval
    assert one.absolute and one.value == 4.0 and math.isnan(one.low) and one.method is None


def test_a_signed_metric_off_the_logs_is_a_difference_with_its_estimate_inside_its_interval():
    # A fit's intercept that crosses 0: as a fraction of the baseline, -265% with its low end cut at -100%.
    base, new = [0.0010, 0.0011, -0.0001], [-0.0010, -0.0011, -0.0012]
    rc = relative_change(base, new, paired=True, signed=True)
    assert rc.absolute and rc.value == pytest.approx(np.mean(new) - np.mean(base))
    assert rc.low < rc.value < rc.high and rc.low < -0.001
    positive = relative_change([1.0, 1.1, 1.2], [1.1, 1.2, 1.3], paired=True, signed=True)
    assert not positive.absolute and positive.method == "paired"  # all above 0: the ratio, as for any metric


def test_the_lost_requests_test_is_the_exact_binomial_tail():
    def tail(lost_base, n_base, lost_new, n_new):  # P(X >= lost_new), X ~ Binomial(k, q), summed term by term
        k, q = lost_base + lost_new, n_new / (n_base + n_new)
        return sum(math.comb(k, i) * q**i * (1 - q) ** (k - i) for i in range(lost_new, k + 1))

    for counts in (
        (0, 900, 1, 900),
        (0, 100, 25, 100),
        (10, 1000, 30, 1000),
        (5, 300, 2, 100),
        (3, 12, 3, 40),
    ):
        assert excess_loss_p(*counts) == pytest.approx(tail(*counts), rel=1e-9)
    assert excess_loss_p(0, 900, 1, 900) == pytest.approx(0.5)  # one failure in 1,800: a coin toss whose
    assert excess_loss_p(0, 100, 25, 100) < 1e-7  # ... 25 of 25 on one side is not
    assert excess_loss_p(4, 100, 0, 100) == 1.0 and excess_loss_p(0, 0, 3, 100) == 1.0


def test_vectorised_changes_equal_the_scalar_ones():
    rng = np.random.default_rng(5)
    base, new = rng.lognormal(0, 0.05, (6, 4)), rng.lognormal(0.02, 0.05, (6, 4))
    for fn, paired in ((paired_log_changes, True), (welch_log_changes, False)):
        rows = fn(base, new)
        for i in range(6):
            rc = relative_change(base[i], new[i], paired=paired)
            assert (rc.value, rc.low, rc.high) == pytest.approx((rows.value[i], rows.low[i], rows.high[i]))


def test_classify_gives_each_outcome_by_where_the_interval_lies():
    h = 0.01
    # lower is better: a negative change is an improvement
    assert int(classify(-0.05, -0.02, "lower", h)) == BETTER
    assert int(classify(0.02, 0.05, "lower", h)) == WORSE
    assert int(classify(-0.005, 0.008, "lower", h)) == EQUIVALENT
    assert int(classify(-0.03, 0.004, "lower", h)) == INCONCLUSIVE  # could be better, could be nothing
    assert int(classify(0.005, 0.03, "lower", h)) == INCONCLUSIVE  # beyond zero but not beyond 1%
    assert int(classify(math.nan, math.nan, "lower", h)) == INCONCLUSIVE
    assert int(classify(-0.05, -0.02, "lower", h, n=3)) == BETTER
    assert int(classify(-0.05, -0.02, "lower", h, n=2)) == INCONCLUSIVE  # two repeats: never a verdict
    assert int(classify(-0.005, 0.008, "lower", h, n=2)) == INCONCLUSIVE
    # higher is better: the same intervals, the other way round
    assert int(classify(-0.05, -0.02, "higher", h)) == WORSE
    assert int(classify(0.02, 0.05, "higher", h)) == BETTER
    with pytest.raises(ValueError, match="Unsupported direction"):
        classify(0.0, 0.1, "", h)


def test_changes_read_as_percentages_and_very_large_ones_as_ratios():
    from llmbench.bench.report.format import format_pct, format_pct_interval

    assert [format_pct(v) for v in (0.034, -0.021, -0.0004, 0.0)] == ["+3.4%", "-2.1%", "0.0%", "0.0%"]
    assert format_pct(32.307) == "×33.3" and format_pct(9.0) == "+900.0%"
    assert format_pct_interval(30.597, 34.1) == "×31.6 … ×35.1"  # both ends in one form: no ">+999%"
    assert format_pct_interval(-0.5, 2e6) == "-50.0% … ×2,000,001"
