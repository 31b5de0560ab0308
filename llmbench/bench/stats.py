"""Summary statistics, Student-t intervals, and the relative change of a metric between two configurations.

``distribution`` gives p50/p90/p95/p99/mean of one run's values (linear-interpolated percentiles, NaN when
empty). Everything else works on *per-repeat* values: one figure per run, so the spread is run-to-run
variance (a single run's requests say nothing about how the next run will come out).

- ``mean_interval``: the mean of n >= 2 repeats with a Student-t 95% interval; one repeat has no interval.
- ``relative_change``: how much ``new`` differs from ``base``, as a fraction of ``base``, with a 95%
  interval. Paired repeats (the variants of one ablation, run back to back on the same prompts and arrival
  times) give a t-interval on the per-repeat log ratios log(new_r / base_r); unpaired sets of repeats give
  a Welch t-interval on the difference of the mean logs. Either is reported as exp(.) - 1, so the change is
  the ratio of geometric means minus one, and the result carries those geometric means (what a table
  shows beside the change agrees with it). A metric with a value <= 0 among its repeats (a zero goodput)
  has no logarithm: it falls back to the difference of the means (paired differences, or Welch), divided
  by the baseline's mean; that divisor's own uncertainty is not carried, so treat such intervals as
  slightly narrow, and their low end is cut at -100% (such a metric is never below 0). Where there is no
  baseline to divide by (its mean is 0: no failed request, no arrival lag) or the metric can be below 0
  (``signed``: a fit's intercept, a lag), the change is that difference itself, new - base in the metric's
  unit (``RelChange.absolute``), with no cut.
- ``excess_loss_p``: whether NEW lost (failed, cut short) a larger share of its requests than BASE by more
  than chance: a one-sided exact conditional binomial test.
- ``classify``: the verdict rule. With a practical threshold h (``--min-effect``), a change is *better* or
  *worse* only when its whole 95% interval lies beyond h on that side, *equivalent* when the whole interval
  lies within [-h, +h], and *inconclusive* otherwise (including when there is no interval), and always
  with fewer than ``MIN_VERDICT_REPEATS`` repeats. Two repeats give the interval one degree of freedom:
  right for noise that is normal, but run-to-run noise often comes in modes (a CPU's frequency states or
  thread placement, a GPU's clocks), and then two pairs that land in the same modes agree to the last digit
  by chance, the interval shrinks to nothing and a difference that is not there gets a verdict; the
  calibration (``stats_calibration``) shows it. The interval is still shown.

The t quantile is computed here (scipy is not a dependency): the t CDF through the regularised incomplete
beta function, evaluated by its continued fraction, and inverted by bisection. The interval code is
vectorised over a leading axis so that the calibration simulation (``stats_calibration``) runs the very
functions the reports use.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

PERCENTILES = (50, 90, 95, 99)
CONFIDENCE = 0.95

# Verdict codes (``classify``); the report turns them into words.
WORSE, EQUIVALENT, BETTER, INCONCLUSIVE = -1, 0, 1, 2
MIN_VERDICT_REPEATS = 3  # fewer repeats (pairs, or the smaller side) are always inconclusive

_CF_EPS = 1e-15  # relative change of the continued fraction at which it has converged
_CF_MAX_ITER = 20_000  # enough for df in the millions (the fraction needs ~sqrt(df) terms there)
_TINY = 1e-300  # keeps Lentz's method away from division by zero
_BISECT_ITER = 60  # bracketing steps; stops once the bracket is ~1e-14 relative


def distribution(values: Sequence[float] | np.ndarray) -> dict[str, float]:
    """p50/p90/p95/p99/mean of finite values; NaN for each when there are none."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return {**{f"p{q}": math.nan for q in PERCENTILES}, "mean": math.nan}
    pct = np.percentile(x, PERCENTILES)
    return {**{f"p{q}": float(v) for q, v in zip(PERCENTILES, pct, strict=True)}, "mean": float(x.mean())}


# ----------------------------------------------------------------------------------------------------
# The t distribution


# Stirling's series for log Gamma(z): (z - 1/2) log z - z + log(2 pi) / 2 + sum c_k / z^(2k - 1).
_STIRLING = (1 / 12, -1 / 360, 1 / 1260, -1 / 1680, 1 / 1188, -691 / 360360, 1 / 156)
_STIRLING_FROM = 10.0  # above this the series' first omitted term is below 1e-16


def lgamma(x: float | np.ndarray) -> np.ndarray:
    """log Gamma(x) for x > 0, vectorised (``math.lgamma`` one element at a time is the slow part of a
    quantile over many degrees of freedom). Small x are raised above ``_STIRLING_FROM`` by the recurrence
    Gamma(x + 1) = x Gamma(x), then Stirling's series is summed."""
    z = np.array(x, dtype=float)
    shift = np.zeros_like(z)
    for _ in range(int(_STIRLING_FROM)):
        small = z < _STIRLING_FROM
        if not small.any():
            break
        shift = shift + np.where(small, np.log(np.where(small, z, 1.0)), 0.0)
        z = np.where(small, z + 1.0, z)
    inv, inv2 = 1.0 / z, 1.0 / (z * z)
    series = np.zeros_like(z)
    for c in reversed(_STIRLING):
        series = series * inv2 + c
    return (z - 0.5) * np.log(z) - z + 0.5 * math.log(2 * math.pi) + series * inv - shift


def _beta_fraction(a: np.ndarray, b: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The continued fraction of I_x(a, b) (modified Lentz), for x < (a + 1) / (a + b + 2), where it
    converges fast; all arrays of one shape."""
    c = np.ones_like(x)
    d = 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / np.where(np.abs(d) < _TINY, _TINY, d)
    h = d.copy()
    active = np.ones(x.shape, dtype=bool)
    for m in range(1, _CF_MAX_ITER + 1):
        for coef in (
            m * (b - m) * x / ((a + 2 * m - 1.0) * (a + 2 * m)),  # even term d_{2m}
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1.0)),  # odd term d_{2m+1}
        ):
            d = 1.0 + coef * d
            d = 1.0 / np.where(np.abs(d) < _TINY, _TINY, d)
            c = 1.0 + coef / c
            c = np.where(np.abs(c) < _TINY, _TINY, c)
            step = np.where(active, c * d, 1.0)
            h = h * step
        active &= np.abs(step - 1.0) > _CF_EPS
        if not active.any():
            break
    return h


def log_beta(a: float | np.ndarray, b: float | np.ndarray) -> np.ndarray:
    """log B(a, b) = log Gamma(a) + log Gamma(b) - log Gamma(a + b)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return lgamma(a) + lgamma(b) - lgamma(a + b)


def betainc(
    a: float | np.ndarray,
    b: float | np.ndarray,
    x: float | np.ndarray,
    log_b: np.ndarray | None = None,
) -> np.ndarray:
    """The regularised incomplete beta function I_x(a, b) for a, b > 0 and 0 <= x <= 1 (vectorised).
    ``log_b``: log B(a, b) when the caller already has it (it does not depend on x)."""
    a, b, x = (np.asarray(v, dtype=float) for v in np.broadcast_arrays(a, b, x))
    lb = log_beta(a, b) if log_b is None else np.broadcast_to(log_b, x.shape)  # symmetric in a, b
    # Where the fraction converges slowly, use the symmetry I_x(a, b) = 1 - I_{1-x}(b, a).
    swap = x > (a + 1.0) / (a + b + 2.0)
    aa, bb, xx = np.where(swap, b, a), np.where(swap, a, b), np.where(swap, 1.0 - x, x)
    inner = (xx > 0.0) & (xx < 1.0)
    xs = np.where(inner, xx, 0.5)  # placeholders keep the logarithms finite; the edges are set below
    value = np.exp(aa * np.log(xs) + bb * np.log1p(-xs) - lb) * _beta_fraction(aa, bb, xs) / aa
    value = np.where(inner, value, np.where(xx >= 1.0, 1.0, 0.0))
    return np.where(swap, 1.0 - value, value)


def t_cdf(t: float | np.ndarray, df: float | np.ndarray, log_b: np.ndarray | None = None) -> np.ndarray:
    """P(T <= t) for Student's t with ``df`` degrees of freedom (any positive real df).
    ``log_b``: log B(df/2, 1/2), when the caller evaluates many t for the same df."""
    t, df = (np.asarray(v, dtype=float) for v in np.broadcast_arrays(t, df))
    with np.errstate(over="ignore"):
        x = df / (df + t * t)  # t = +-inf gives x = 0: the tail is empty
    tail = 0.5 * betainc(df / 2.0, 0.5, x, log_b)  # P(T > |t|)
    return np.where(t > 0, 1.0 - tail, tail)


def t_quantile(p: float | np.ndarray, df: float | np.ndarray) -> np.ndarray:
    """The t value with P(T <= t) = p (vectorised), found by bisection of ``t_cdf``.

    For a few values each step splits the bracket into 64 parts at once rather than two (one vectorised
    CDF call instead of six sequential ones), which keeps a single quantile at a few milliseconds; for
    many values the work per step, not the number of steps, is what counts, so it splits in four."""
    p, df = (np.asarray(v, dtype=float) for v in np.broadcast_arrays(p, df))
    upper = np.where(p >= 0.5, p, 1.0 - p)  # solve on the upper half; the t distribution is symmetric
    lb = log_beta(df / 2.0, 0.5)
    lo, hi = np.zeros_like(upper), np.ones_like(upper)
    for _ in range(64):  # widen the bracket until it holds the quantile (df = 1, p = 1 - 1e-15: ~3e14)
        short = t_cdf(hi, df, lb) < upper
        if not short.any():
            break
        lo, hi = np.where(short, hi, lo), np.where(short, hi * 2.0, hi)
    sections = 64 if upper.size <= 4 else 4
    inner = np.arange(1, sections) / sections  # (K-1,) interior cut points of the bracket
    for _ in range(_BISECT_ITER):
        width = hi - lo
        cdf = t_cdf(lo[..., None] + width[..., None] * inner, df[..., None], lb[..., None])  # (..., K-1)
        below = (cdf < upper[..., None]).sum(axis=-1)  # the CDF is monotone: the cuts below come first
        lo, hi = lo + below * (width / sections), lo + (below + 1) * (width / sections)
        if np.all(hi - lo <= 1e-14 * hi):
            break
    t = 0.5 * (lo + hi)
    return np.where(p >= 0.5, t, -t)


@functools.lru_cache(maxsize=4096)
def _t_critical(df: float, confidence: float) -> float:
    return float(t_quantile(0.5 + confidence / 2.0, df))


def t_critical(df: np.ndarray | float, confidence: float = CONFIDENCE) -> np.ndarray:
    """Two-sided critical value: the interval mean +- this * standard error holds ``confidence``
    (NaN where df <= 0). A few distinct df (repeat counts) are cached; many (Welch's) are solved at once."""
    df = np.asarray(df, dtype=float)
    values, index = np.unique(df, return_inverse=True)
    if values.size <= 8:
        solved = np.array([_t_critical(float(v), confidence) if v > 0 else math.nan for v in values])
    else:
        solved = np.where(values > 0, t_quantile(0.5 + confidence / 2.0, np.maximum(values, 1e-3)), math.nan)
    return solved[index].reshape(df.shape)


# ----------------------------------------------------------------------------------------------------
# Intervals


class Interval(NamedTuple):
    value: float
    low: float
    high: float
    n: int


def _finite(values: Sequence[float] | np.ndarray) -> np.ndarray:
    x = np.asarray(values, dtype=float)
    return x[np.isfinite(x)]


def mean_interval(
    values: Sequence[float] | np.ndarray, confidence: float = CONFIDENCE, floor: float | None = None
) -> Interval:
    """Mean of the finite values with a Student-t interval; no interval (NaN) with fewer than two.

    ``floor``: the least value the quantity can take (0 for a time, a rate, a share): an interval reaching
    below it is cut there, which costs it no coverage, since the true mean cannot lie below it either."""
    x = _finite(values)
    if x.size == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    mean = float(x.mean())
    if x.size < 2:
        return Interval(mean, math.nan, math.nan, int(x.size))
    half = float(t_critical(x.size - 1, confidence)) * float(x.std(ddof=1)) / math.sqrt(x.size)
    low = mean - half if floor is None else max(mean - half, floor)
    return Interval(mean, low, mean + half, int(x.size))


class RelChanges(NamedTuple):
    """Relative changes new/base - 1 with their intervals, one per row of the inputs."""

    value: np.ndarray
    low: np.ndarray
    high: np.ndarray


def paired_log_changes(base: np.ndarray, new: np.ndarray, confidence: float = CONFIDENCE) -> RelChanges:
    """Rows of paired positive repeats, shapes (T, n) with n >= 2: t-interval on the mean log ratio."""
    d = np.log(new) - np.log(base)  # (T, n)
    n = d.shape[-1]
    mean = d.mean(axis=-1)
    half = float(t_critical(n - 1, confidence)) * d.std(axis=-1, ddof=1) / math.sqrt(n)
    return RelChanges(np.expm1(mean), np.expm1(mean - half), np.expm1(mean + half))


def _welch(a: np.ndarray, b: np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """Mean of b minus mean of a per row, and the half-width of its Welch t-interval; (T, na), (T, nb)."""
    na, nb = a.shape[-1], b.shape[-1]
    va, vb = a.var(axis=-1, ddof=1) / na, b.var(axis=-1, ddof=1) / nb  # squared standard errors
    se2 = va + vb
    with np.errstate(divide="ignore", invalid="ignore"):
        df = se2 * se2 / (va * va / (na - 1) + vb * vb / (nb - 1))
    df = np.where(se2 > 0, df, na + nb - 2)  # no spread on either side: any df gives a zero half-width
    return b.mean(axis=-1) - a.mean(axis=-1), t_critical(df, confidence) * np.sqrt(se2)


def welch_log_changes(base: np.ndarray, new: np.ndarray, confidence: float = CONFIDENCE) -> RelChanges:
    """Rows of unpaired positive repeats, (T, na) and (T, nb), each >= 2: Welch t-interval on the logs."""
    diff, half = _welch(np.log(base), np.log(new), confidence)
    return RelChanges(np.expm1(diff), np.expm1(diff - half), np.expm1(diff + half))


class RelChange(NamedTuple):
    base: float  # the baseline's repeats compared: their geometric mean (arithmetic when one is <= 0)
    new: float  # the same of the new configuration's: new / base - 1 is ``value`` on either method
    value: float  # relative change (see the module docstring)
    low: float  # 95% interval; NaN when the data cannot give one
    high: float
    n: int  # pairs compared (paired), or the smaller side's repeats
    # "paired" | "unpaired" | None (no interval); + " (difference)" off the logs, " (absolute difference)"
    method: str | None
    absolute: bool = False  # value, low, high are new - base in the metric's unit, not a fraction of base


def central(values: Sequence[float] | np.ndarray) -> float:
    """What ``relative_change`` takes the ratio of: the geometric mean of the finite values when all are
    above 0, else their arithmetic mean; NaN when there are none."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return math.nan
    return float(np.exp(np.log(x).mean())) if (x > 0).all() else float(x.mean())


def relative_change(
    base: Sequence[float] | np.ndarray,
    new: Sequence[float] | np.ndarray,
    paired: bool,
    confidence: float = CONFIDENCE,
    signed: bool = False,
) -> RelChange:
    """(new - base) / base of one metric from per-repeat values (see the module docstring).

    ``paired``: ``base[i]`` and ``new[i]`` are the same repeat (same arrivals and prompts, run back to
    back); pairs with a missing value on either side are dropped. Otherwise the two sets are independent.
    ``signed``: the metric can be below 0; off the logs its change is the plain difference new - base.
    """
    a, b = np.asarray(base, dtype=float), np.asarray(new, dtype=float)
    if paired:
        keep = np.isfinite(a) & np.isfinite(b)
        a, b = a[keep], b[keep]
    else:
        a, b = a[np.isfinite(a)], b[np.isfinite(b)]
    nan = math.nan
    if a.size == 0 or b.size == 0:
        return RelChange(
            float(a.mean()) if a.size else nan, float(b.mean()) if b.size else nan, nan, nan, nan, 0, None
        )
    ma, mb = float(a.mean()), float(b.mean())
    n = int(min(a.size, b.size))
    logs = bool((a > 0).all() and (b > 0).all())
    if n < 2:
        if logs:
            value = float(np.expm1(np.log(b).mean() - np.log(a).mean()))
            return RelChange(central(a), central(b), value, nan, nan, n, None)
        if (signed or ma <= 0) and not ma == mb == 0:  # no baseline to take a fraction of
            return RelChange(ma, mb, mb - ma, nan, nan, n, None, absolute=True)
        return RelChange(ma, mb, (mb - ma) / ma if ma else 0.0, nan, nan, n, None)
    if logs:
        fn = paired_log_changes if paired else welch_log_changes
        r = fn(a[None, :], b[None, :], confidence)
        method = "paired" if paired else "unpaired"
        return RelChange(
            central(a), central(b), float(r.value[0]), float(r.low[0]), float(r.high[0]), n, method
        )
    # A zero or negative value: no logarithm; the difference of the means (over the baseline's, if it can).
    if paired:
        d = b - a
        diff = float(d.mean())
        half = float(t_critical(n - 1, confidence)) * float(d.std(ddof=1)) / math.sqrt(n)
    else:
        diff_a, half_a = _welch(a[None, :], b[None, :], confidence)
        diff, half = float(diff_a[0]), float(half_a[0])
    method = "paired" if paired else "unpaired"
    if ma == 0 and diff == 0 and half == 0:  # identical on both sides (zero goodput throughout): no change
        return RelChange(ma, mb, 0.0, 0.0, 0.0, n, method + " (difference)")
    if signed or ma <= 0:  # a fraction of a baseline of 0, or of one near or below 0, means nothing
        return RelChange(ma, mb, diff, diff - half, diff + half, n, method + " (absolute difference)", True)
    # A metric not in ``kept.SIGNED`` is never below 0: a fall of more than the whole baseline cannot happen.
    low = max((diff - half) / ma, -1.0)
    return RelChange(ma, mb, diff / ma, low, (diff + half) / ma, n, method + " (difference)")


def excess_loss_p(lost_base: int, n_base: int, lost_new: int, n_new: int) -> float:
    """The p-value of NEW losing ``lost_new`` of its ``n_new`` requests against BASE's ``lost_base`` of
    ``n_base``, if both lost requests at one rate: a one-sided exact conditional binomial test. Given the
    k = lost_base + lost_new requests lost in all, each is NEW's with probability q = n_new / (n_base + n_new)
    under that rate; the p-value is P(X >= lost_new) for X ~ Binomial(k, q), which is I_q(lost_new, k -
    lost_new + 1). 1 when NEW lost none, or BASE recorded no request (nothing to hold NEW against)."""
    if lost_new <= 0 or n_new <= 0 or n_base <= 0:
        return 1.0
    k = lost_base + lost_new
    return float(betainc(lost_new, k - lost_new + 1, n_new / (n_base + n_new)))


# ----------------------------------------------------------------------------------------------------
# Verdicts


def classify(
    low: float | np.ndarray, high: float | np.ndarray, better: str, threshold: float, n: int | None = None
) -> np.ndarray:
    """Verdict codes (WORSE, EQUIVALENT, BETTER, INCONCLUSIVE) of relative-change intervals.

    ``better`` is the metric's good direction ("lower" or "higher"); ``threshold`` the practical effect
    size as a fraction (0.01 = 1%); ``n`` the repeats behind the intervals (the pairs, or the smaller
    side): fewer than ``MIN_VERDICT_REPEATS`` is INCONCLUSIVE, as is a missing interval (NaN). ``None``
    judges the intervals alone (the calibration's view of what the rule guards against).
    """
    if better not in ("lower", "higher"):
        raise ValueError(f"Unsupported direction: {better!r}. Supported: lower, higher")
    low, high = np.asarray(low, dtype=float), np.asarray(high, dtype=float)
    sign = -1.0 if better == "lower" else 1.0
    gain_low, gain_high = np.minimum(sign * low, sign * high), np.maximum(sign * low, sign * high)
    known = np.isfinite(gain_low) & np.isfinite(gain_high)
    out = np.full(low.shape, INCONCLUSIVE, dtype=int)
    out[known & (gain_low > threshold)] = BETTER
    out[known & (gain_high < -threshold)] = WORSE
    out[known & (gain_low >= -threshold) & (gain_high <= threshold)] = EQUIVALENT
    if n is not None and n < MIN_VERDICT_REPEATS:
        out[...] = INCONCLUSIVE
    return out
